//! `Doorbell` and `Waiter` on their own.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use exanet_shm::doorbell::wake_sleeper;
use exanet_shm::{Doorbell, Region, Waiter};

#[test]
fn ring_then_wait() {
    let bell = Doorbell::new().unwrap();
    assert!(!bell.wait(Some(Duration::ZERO)).unwrap());
    bell.ring().unwrap();
    bell.ring().unwrap();
    // Rings coalesce: one wait consumes them all.
    assert!(bell.wait(Some(Duration::ZERO)).unwrap());
    assert!(!bell.drain().unwrap());
    let t = Instant::now();
    assert!(!bell.wait(Some(Duration::from_millis(20))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(20));
}

#[test]
fn wakes_the_other_end_of_a_pair_in_both_directions() {
    let (a, b) = Doorbell::pair().unwrap();
    let b = Doorbell::from_fd(b.into_fd()).unwrap();
    assert_ne!(a.as_raw_fd(), b.as_raw_fd());
    let waiter = thread::spawn(move || {
        let rung = b.wait(Some(Duration::from_secs(20))).unwrap();
        b.ring().unwrap();
        (rung, b)
    });
    thread::sleep(Duration::from_millis(10));
    a.ring().unwrap();
    let (rung, _b) = waiter.join().unwrap();
    assert!(rung);
    assert!(a.wait(Some(Duration::from_secs(20))).unwrap());
    // Ringing one end does not wake a wait on the same end.
    a.ring().unwrap();
    assert!(!a.wait(Some(Duration::ZERO)).unwrap());
}

#[test]
fn from_fd_refuses_other_descriptors() {
    let region = Region::create("not-a-doorbell", 4096).unwrap();
    let err = Doorbell::from_fd(region.try_clone_fd().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
    let err = Doorbell::from_fd(a.as_fd().try_clone_to_owned().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    assert!(Doorbell::from_fd(udp.as_fd().try_clone_to_owned().unwrap()).is_err());
}

/// The attack of the security issue, defect 1, on the new doorbell: the peer makes its end
/// blocking and never reads. Ringing must still never block.
#[test]
fn a_peer_that_never_reads_and_clears_o_nonblock_cannot_block_a_ring() {
    let (mine, theirs) = Doorbell::pair().unwrap();
    let theirs = theirs.into_fd();
    // Both ends of the pair are blocking descriptors (as blocking as a peer could make
    // its own): only MSG_DONTWAIT keeps the rings below from blocking once the peer's
    // receive buffer is full.
    let start = Instant::now();
    // Far more rings than any socket buffer holds.
    for _ in 0..2_000_000 {
        mine.ring().unwrap();
    }
    assert!(start.elapsed() < Duration::from_secs(60));
    drop(theirs);
    let err = mine.ring().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    assert_eq!(
        mine.wait(Some(Duration::from_secs(5))).unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe
    );
}

#[test]
fn shutdown_wakes_a_waiter_at_once() {
    let (mine, _theirs) = Doorbell::pair().unwrap();
    let mine = Arc::new(mine);
    let m2 = Arc::clone(&mine);
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let r = m2.wait(Some(Duration::from_secs(30)));
        (r.map_err(|e| e.kind()), t.elapsed())
    });
    thread::sleep(Duration::from_millis(20));
    mine.shutdown().unwrap();
    let (r, took) = waiter.join().unwrap();
    assert_eq!(r, Err(std::io::ErrorKind::BrokenPipe));
    assert!(took < Duration::from_secs(30));
}

#[test]
fn waiter_spins_then_sleeps_and_is_woken() {
    let region = Arc::new(Region::create("waiter", 4096).unwrap());
    let bell = Arc::new(Doorbell::new().unwrap());
    // Word 0: the condition ("data"), word 64: the sleeping flag.
    let (r2, b2) = (Arc::clone(&region), Arc::clone(&bell));
    let sleeper = thread::spawn(move || {
        let flag = r2.atomic_u32(64).unwrap();
        let data = r2.atomic_u32(0).unwrap();
        let ready = Waiter::new(Duration::from_micros(50))
            .wait(flag, &b2, Some(Duration::from_secs(20)), || {
                Ok::<_, std::io::Error>(data.load(Ordering::Acquire) != 0)
            })
            .unwrap();
        (ready, flag.load(Ordering::Relaxed))
    });
    // Wait until it sleeps, then publish and wake.
    let flag = region.atomic_u32(64).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while flag.load(Ordering::Acquire) == 0 {
        assert!(Instant::now() < deadline);
        thread::sleep(Duration::from_millis(1));
    }
    region.atomic_u32(0).unwrap().store(1, Ordering::Release);
    assert!(wake_sleeper(flag, &bell).unwrap());
    // The sleeper clears its flag when it wakes.
    assert_eq!(sleeper.join().unwrap(), (true, 0));
    assert!(!wake_sleeper(flag, &bell).unwrap());
}

#[test]
fn waiter_propagates_condition_errors_and_clears_the_flag() {
    let region = Region::create("waiter-err", 128).unwrap();
    let bell = Doorbell::new().unwrap();
    let flag = region.atomic_u32(0).unwrap();
    let calls = AtomicU32::new(0);
    let got = Waiter::new(Duration::ZERO).wait(flag, &bell, None, || {
        // Fail on the re-check after announcing sleep.
        if calls.fetch_add(1, Ordering::Relaxed) == 1 {
            Err(std::io::Error::other("boom"))
        } else {
            Ok(false)
        }
    });
    assert_eq!(got.unwrap_err().to_string(), "boom");
    assert_eq!(flag.load(Ordering::Relaxed), 0);
}

#[test]
fn waiter_defaults() {
    assert_eq!(Waiter::default().spin(), Duration::from_micros(20));
    assert_eq!(Waiter::new(Duration::ZERO).spin(), Duration::ZERO);
}
