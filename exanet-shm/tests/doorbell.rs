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
fn wakes_another_thread_through_a_second_descriptor() {
    let bell = Doorbell::new().unwrap();
    let other = Doorbell::from_fd(bell.try_clone_fd().unwrap()).unwrap();
    assert_ne!(bell.as_raw_fd(), other.as_raw_fd());
    let waiter = thread::spawn(move || other.wait(Some(Duration::from_secs(20))).unwrap());
    thread::sleep(Duration::from_millis(10));
    bell.ring().unwrap();
    assert!(waiter.join().unwrap());
}

#[test]
fn from_fd_refuses_other_descriptors() {
    let region = Region::create("not-an-eventfd", 4096).unwrap();
    let err = Doorbell::from_fd(region.try_clone_fd().unwrap()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(Doorbell::from_fd(a.as_fd().try_clone_to_owned().unwrap()).is_err());
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
