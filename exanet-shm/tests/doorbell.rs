//! `Doorbell` and `Waiter` on their own.

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use exanet_shm::doorbell::wake_sleeper;
use exanet_shm::{doorbell, Doorbell, Region, Ringer, Waiter};

#[test]
fn ring_then_wait() {
    let (ringer, bell) = doorbell().unwrap();
    assert!(!bell.wait(Some(Duration::ZERO)).unwrap());
    ringer.ring().unwrap();
    ringer.ring().unwrap();
    // Rings coalesce: one wait consumes them all.
    assert!(bell.wait(Some(Duration::ZERO)).unwrap());
    assert!(!bell.drain().unwrap());
    let t = Instant::now();
    assert!(!bell.wait(Some(Duration::from_millis(20))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(20));
}

#[test]
fn ends_survive_being_handed_over_and_wake_across_threads() {
    let (ringer, bell) = doorbell().unwrap();
    let bell = Doorbell::from_fd(bell.into_fd()).unwrap();
    let ringer = Ringer::from_fd(ringer.into_fd()).unwrap();
    let waiter = thread::spawn(move || bell.wait(Some(Duration::from_secs(20))).unwrap());
    thread::sleep(Duration::from_millis(10));
    ringer.ring().unwrap();
    assert!(waiter.join().unwrap());
}

#[test]
fn from_fd_refuses_other_descriptors_and_the_wrong_end() {
    let region = Region::create("not-a-doorbell", 4096).unwrap();
    let err = Doorbell::from_fd(region.try_clone_fd().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let err = Ringer::from_fd(region.try_clone_fd().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    // A socket pair (what doorbells once were) is refused: it could carry descriptors.
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let err = Doorbell::from_fd(a.as_fd().try_clone_to_owned().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    assert!(Doorbell::from_fd(udp.as_fd().try_clone_to_owned().unwrap()).is_err());
    // Each end is only accepted as what it is.
    let (ringer, bell) = doorbell().unwrap();
    let err = Doorbell::from_fd(ringer.into_fd()).unwrap_err();
    assert!(err.to_string().contains("other direction"), "{err}");
    assert!(Ringer::from_fd(bell.into_fd()).is_err());
}

/// A peer that makes its end blocking and never reads cannot make a ring block.
#[test]
fn a_peer_that_never_reads_and_clears_o_nonblock_cannot_block_a_ring() {
    let (ringer, theirs) = doorbell().unwrap();
    let theirs = theirs.into_fd();
    // The peer clears O_NONBLOCK on its end: that is its own open file description, ours
    // stays non-blocking.
    let flags = OFlag::from_bits_retain(fcntl(&theirs, FcntlArg::F_GETFL).unwrap());
    fcntl(&theirs, FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK)).unwrap();
    let start = Instant::now();
    // Far more rings than any pipe holds.
    for _ in 0..2_000_000 {
        ringer.ring().unwrap();
    }
    assert!(start.elapsed() < Duration::from_secs(60));
    drop(theirs);
    let err = ringer.ring().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
}

/// A waiter learns that every ringer is gone, instead of waking for ever on a hung-up pipe.
#[test]
fn closing_every_ringer_ends_a_wait() {
    let (ringer, bell) = doorbell().unwrap();
    let second = ringer.try_clone().unwrap();
    drop(ringer);
    // One ringer is left: a wait times out.
    assert!(!bell.wait(Some(Duration::from_millis(10))).unwrap());
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let r = bell.wait(Some(Duration::from_secs(30)));
        (r.map_err(|e| e.kind()), t.elapsed())
    });
    thread::sleep(Duration::from_millis(20));
    drop(second);
    let (r, took) = waiter.join().unwrap();
    assert_eq!(r, Err(std::io::ErrorKind::BrokenPipe));
    assert!(took < Duration::from_secs(30));
}

/// Ringing a doorbell whose waiter is gone fails with `BrokenPipe` and does not kill the
/// process, even where SIGPIPE has its default action (a C program using the library): run
/// in a child process of this test binary where SIGPIPE kills the process.
#[test]
fn ringing_a_closed_doorbell_raises_no_sigpipe() {
    if std::env::var_os("EXANET_SIGPIPE_CHILD").is_some() {
        // Rust programs start with SIGPIPE ignored; a C program has its default action,
        // which signal-hook carries out (the process dies) should one come.
        let always = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        signal_hook::flag::register_conditional_default(signal_hook::consts::SIGPIPE, always)
            .unwrap();
        for _ in 0..3 {
            let (ringer, bell) = doorbell().unwrap();
            drop(bell);
            let err = ringer.ring().unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
        }
        println!("survived");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ringing_a_closed_doorbell_raises_no_sigpipe",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("EXANET_SIGPIPE_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("survived"),
        "the child died: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn waiter_spins_then_sleeps_and_is_woken() {
    let region = Arc::new(Region::create("waiter", 4096).unwrap());
    let (ringer, bell) = doorbell().unwrap();
    let bell = Arc::new(bell);
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
    assert!(wake_sleeper(flag, &ringer).unwrap());
    // The sleeper clears its flag when it wakes.
    assert_eq!(sleeper.join().unwrap(), (true, 0));
    assert!(!wake_sleeper(flag, &ringer).unwrap());
}

#[test]
fn waiter_propagates_condition_errors_and_clears_the_flag() {
    let region = Region::create("waiter-err", 128).unwrap();
    let (_ringer, bell) = doorbell().unwrap();
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
