//! `Ring`: layout, single-threaded behaviour, and two threads on separate mappings.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use exanet_shm::{doorbell, Region, Ring, RingError, WaitError, Waiter};

use common::{message, pair, region_with_ring};

#[test]
fn layout_size_and_validation() {
    assert_eq!(Ring::HEADER_SIZE, 640);
    assert_eq!(Ring::layout_size(1, 16).unwrap(), 640 + 128);
    assert_eq!(Ring::layout_size(16, 64).unwrap(), 640 + 1024);
    assert_eq!(Ring::layout_size(256, 64).unwrap(), 640 + 16384);
    for (slots, size) in [
        (0, 64),
        (3, 64),
        (16, 0),
        (16, 8),
        (16, 48),
        (16, 1 << 25),
        ((1 << 31) + 1, 64),
    ] {
        assert!(
            matches!(
                Ring::layout_size(slots, size),
                Err(RingError::InvalidLayout(_))
            ),
            "{slots} x {size}"
        );
    }
    assert!(matches!(
        Ring::new(64, 16, 64),
        Err(RingError::InvalidLayout(_))
    ));
    assert!(matches!(
        Ring::new(usize::MAX - 127, 16, 64),
        Err(RingError::InvalidLayout(_))
    ));
    let a = Ring::new(0, 16, 64).unwrap();
    let b = Ring::new(a.end(), 4, 16).unwrap();
    assert_eq!(b.offset(), 640 + 1024);
    assert_eq!(b.size(), 768);
    assert_eq!(a.max_message_len(), 56);

    // A ring must fit in its region.
    let region = Region::create("small", a.end() - 1).unwrap();
    assert!(matches!(a.init(&region), Err(RingError::InvalidLayout(_))));
    assert!(matches!(
        a.producer(Arc::new(region)),
        Err(RingError::InvalidLayout(_))
    ));
}

#[test]
fn attach_requires_an_initialised_matching_header() {
    let ring = Ring::new(0, 16, 64).unwrap();
    // Room for the larger geometry tried below.
    let region = Arc::new(Region::create("attach", Ring::new(0, 16, 128).unwrap().end()).unwrap());
    match ring.consumer(Arc::clone(&region)) {
        Err(RingError::HeaderMismatch {
            field: "magic",
            found: 0,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    ring.init(&region).unwrap();
    let other_geometry = Ring::new(0, 8, 64).unwrap();
    match other_geometry.producer(Arc::clone(&region)) {
        Err(RingError::HeaderMismatch {
            field: "capacity",
            expected: 8,
            found: 16,
        }) => {}
        other => panic!("{other:?}"),
    }
    let other_geometry = Ring::new(0, 16, 128).unwrap();
    match other_geometry.consumer(Arc::clone(&region)) {
        Err(RingError::HeaderMismatch {
            field: "slot_size",
            expected: 128,
            found: 64,
        }) => {}
        other => panic!("{other:?}"),
    }
    ring.producer(Arc::clone(&region)).unwrap();
    ring.consumer(region).unwrap();
}

#[test]
fn push_pop_full_empty_wraparound() {
    let (mut tx, mut rx) = pair(4, 16);
    let mut buf = [0u8; 8];
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
    for round in 0u8..10 {
        for i in 0..4u8 {
            tx.push(&[round, i, 0xEE]).unwrap();
        }
        assert!(matches!(tx.push(b"x"), Err(RingError::Full)));
        assert_eq!(tx.free().unwrap(), 0);
        assert_eq!(rx.available().unwrap(), 4);
        for i in 0..4u8 {
            assert_eq!(rx.pop(&mut buf).unwrap(), Some(3));
            assert_eq!(&buf[..3], &[round, i, 0xEE]);
        }
        assert_eq!(rx.pop(&mut buf).unwrap(), None);
        assert_eq!(tx.free().unwrap(), 4);
    }
}

#[test]
fn lengths_are_checked() {
    let (mut tx, mut rx) = pair(4, 32);
    assert_eq!(tx.max_message_len(), 24);
    match tx.push(&[0u8; 25]) {
        Err(RingError::TooLong { len: 25, max: 24 }) => {}
        other => panic!("{other:?}"),
    }
    tx.push(&[]).unwrap();
    tx.push(&[9u8; 24]).unwrap();
    let mut buf = [0u8; 24];
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(0));
    // Too small a buffer leaves the message in place.
    let mut small = [0u8; 23];
    match rx.pop(&mut small) {
        Err(RingError::BufferTooSmall {
            needed: 24,
            available: 23,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(24));
    assert_eq!(buf, [9u8; 24]);
}

#[test]
fn rings_back_to_back_do_not_interfere() {
    let a = Ring::new(0, 4, 16).unwrap();
    let b = Ring::new(a.end(), 8, 32).unwrap();
    let region = Arc::new(Region::create("two", b.end()).unwrap());
    a.init(&region).unwrap();
    b.init(&region).unwrap();
    let (mut atx, mut arx) = (
        a.producer(Arc::clone(&region)).unwrap(),
        a.consumer(Arc::clone(&region)).unwrap(),
    );
    let (mut btx, mut brx) = (
        b.producer(Arc::clone(&region)).unwrap(),
        b.consumer(region).unwrap(),
    );
    for i in 0..100u64 {
        let ma = message(i, 8);
        let mb = message(i, 24);
        atx.push(&ma).unwrap();
        btx.push(&mb).unwrap();
        let mut buf = [0u8; 24];
        let n = arx.pop(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..n], &ma[..]);
        let n = brx.pop(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..n], &mb[..]);
    }
}

/// Indices are free-running `u32`s: a ring whose indices are about to wrap keeps working.
#[test]
fn indices_wrap_around_u32() {
    for slots in [1, 8] {
        let ring = Ring::new(0, slots, 32).unwrap();
        let region = Arc::new(Region::create("wrap", ring.end()).unwrap());
        ring.init_at(&region, u32::MAX - 5).unwrap();
        let mut tx = ring.producer(Arc::clone(&region)).unwrap();
        let mut rx = ring.consumer(region).unwrap();
        let mut buf = [0u8; 24];
        let batch = slots.min(3) as u64;
        for i in 0..100u64 {
            assert_eq!(rx.pop(&mut buf).unwrap(), None, "round {i}");
            for j in 0..batch {
                tx.push(&message(i * batch + j, 24)).unwrap();
            }
            for j in 0..batch {
                let n = rx.pop(&mut buf).unwrap().unwrap();
                assert_eq!(&buf[..n], &message(i * batch + j, 24)[..]);
            }
        }
        assert_eq!(rx.pop(&mut buf).unwrap(), None);
    }
}

/// A producer and a consumer thread, each with its own mapping of the memfd, busy-polling.
#[test]
fn two_threads_separate_mappings_spinning() {
    const COUNT: u64 = 200_000;
    let (mut tx, mut rx) = pair(64, 64);
    let max = tx.max_message_len();
    let producer = thread::spawn(move || {
        for i in 0..COUNT {
            let msg = message(i, max);
            loop {
                match tx.push(&msg) {
                    Ok(()) => break,
                    Err(RingError::Full) => std::hint::spin_loop(),
                    Err(e) => panic!("{e}"),
                }
            }
        }
    });
    let mut buf = vec![0u8; max];
    for i in 0..COUNT {
        let n = loop {
            match rx.pop(&mut buf).unwrap() {
                Some(n) => break n,
                None => std::hint::spin_loop(),
            }
        };
        assert_eq!(&buf[..n], &message(i, max)[..], "message {i}");
    }
    producer.join().unwrap();
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
}

/// Same, but both sides block with doorbells: the consumer when empty, the producer when full.
/// A spin budget of zero forces the sleeping path on every wait.
#[test]
fn two_threads_blocking_with_doorbells() {
    const COUNT: u64 = 20_000;
    let (mut tx, mut rx) = pair(8, 32);
    let (data_ringer, data_bell) = doorbell().unwrap();
    let (space_ringer, space_bell) = doorbell().unwrap();
    let max = tx.max_message_len();
    let timeout = Some(Duration::from_secs(20));
    let (db, sb) = (data_ringer, space_bell);
    let producer = thread::spawn(move || {
        let waiter = Waiter::new(Duration::ZERO);
        for i in 0..COUNT {
            assert!(
                tx.push_wait(&message(i, max), &waiter, &sb, timeout)
                    .unwrap(),
                "timed out pushing {i}"
            );
            tx.wake_consumer(&db).unwrap();
        }
    });
    let waiter = Waiter::new(if cfg!(debug_assertions) {
        Duration::ZERO
    } else {
        Duration::from_micros(5)
    });
    let mut buf = vec![0u8; max];
    for i in 0..COUNT {
        let n = rx
            .pop_wait(&mut buf, &waiter, &data_bell, timeout)
            .unwrap()
            .expect("timed out popping");
        rx.wake_producer(&space_ringer).unwrap();
        assert_eq!(&buf[..n], &message(i, max)[..], "message {i}");
    }
    producer.join().unwrap();
}

#[test]
fn waits_time_out() {
    let (mut tx, mut rx) = pair(2, 16);
    let (_ringer, bell) = doorbell().unwrap();
    let mut buf = [0u8; 8];
    for waiter in [
        Waiter::new(Duration::ZERO),
        Waiter::new(Duration::from_millis(5)),
        Waiter::default(),
    ] {
        let t = Instant::now();
        assert_eq!(
            rx.pop_wait(&mut buf, &waiter, &bell, Some(Duration::from_millis(30)))
                .unwrap(),
            None
        );
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(30) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }
    tx.push(b"a").unwrap();
    tx.push(b"b").unwrap();
    let t = Instant::now();
    assert!(!tx
        .push_wait(
            b"c",
            &Waiter::new(Duration::ZERO),
            &bell,
            Some(Duration::from_millis(20))
        )
        .unwrap());
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert!(!tx
        .wait_writable(&Waiter::default(), &bell, Some(Duration::ZERO))
        .unwrap());
    assert!(rx
        .wait_readable(&Waiter::default(), &bell, Some(Duration::ZERO))
        .unwrap());
}

/// A consumer in `wait_readable` says it waits for the whole wait, spin included, and
/// withdraws it when the wait ends; `consumer_sleeping` is only the sleep's.
#[test]
fn a_consumer_says_it_waits_while_it_spins_not_only_when_asleep() {
    let (mut tx, mut rx) = pair(4, 16);
    let (ringer, bell) = doorbell().unwrap();
    assert!(!tx.consumer_waiting().unwrap());
    let consumer = thread::spawn(move || {
        let mut buf = [0u8; 8];
        // A spin far longer than the test: what the producer sees is the spin's.
        let spinning = Waiter::new(Duration::from_secs(60));
        let n = rx
            .pop_wait(&mut buf, &spinning, &bell, Some(Duration::from_secs(20)))
            .unwrap();
        (rx, n)
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !tx.consumer_waiting().unwrap() {
        assert!(
            Instant::now() < deadline,
            "the consumer never said it waits"
        );
        thread::sleep(Duration::from_millis(1));
    }
    assert!(!tx.consumer_sleeping().unwrap(), "spinning, not asleep");
    tx.push(b"1").unwrap();
    tx.wake_consumer(&ringer).unwrap();
    let (rx, n) = consumer.join().unwrap();
    assert_eq!(n, Some(1));
    assert!(
        !tx.consumer_waiting().unwrap(),
        "withdrawn when the wait ends"
    );
    drop(rx);
}

/// The producer only makes the doorbell system call when the consumer said it sleeps.
#[test]
fn wake_only_when_sleeping() {
    let (mut tx, mut rx) = pair(4, 16);
    let (ringer, bell) = doorbell().unwrap();
    let bell = Arc::new(bell);
    tx.push(b"1").unwrap();
    assert!(
        !tx.wake_consumer(&ringer).unwrap(),
        "nobody sleeps, no ring"
    );
    assert!(!bell.drain().unwrap());

    let b2 = Arc::clone(&bell);
    let consumer = thread::spawn(move || {
        let mut buf = [0u8; 8];
        assert_eq!(rx.pop(&mut buf).unwrap(), Some(1));
        // Sleeps right away.
        let n = rx
            .pop_wait(
                &mut buf,
                &Waiter::new(Duration::ZERO),
                &b2,
                Some(Duration::from_secs(20)),
            )
            .unwrap();
        (n, buf[0])
    });
    // Wait for the consumer to announce itself, then push and wake it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sleeping = tx.region().atomic_u32(0x180).unwrap();
    while sleeping.load(std::sync::atomic::Ordering::Acquire) == 0 {
        assert!(Instant::now() < deadline, "consumer never went to sleep");
        thread::sleep(Duration::from_millis(1));
    }
    tx.push(b"2").unwrap();
    assert!(
        tx.wake_consumer(&ringer).unwrap(),
        "consumer sleeps, must ring"
    );
    assert_eq!(consumer.join().unwrap(), (Some(1), b'2'));
    assert!(!tx.wake_consumer(&ringer).unwrap());
}

#[test]
fn wait_error_wraps_corruption() {
    let (region, ring) = region_with_ring(4, 16);
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    region
        .atomic_u32(0x100)
        .unwrap()
        .store(1000, std::sync::atomic::Ordering::Release);
    let (_ringer, bell) = doorbell().unwrap();
    let mut buf = [0u8; 8];
    match rx.pop_wait(
        &mut buf,
        &Waiter::default(),
        &bell,
        Some(Duration::from_secs(1)),
    ) {
        Err(WaitError::Ring(RingError::Corrupt(_))) => {}
        other => panic!("{other:?}"),
    }
}

/// The building blocks for event loops: announce, re-check, sleep on the doorbell's fd.
#[test]
fn prepare_and_finish_sleep() {
    let (mut tx, mut rx) = pair(2, 16);
    let (ringer, bell) = doorbell().unwrap();
    assert!(!rx.prepare_sleep().unwrap(), "empty: may sleep");
    tx.push(b"x").unwrap();
    assert!(tx.wake_consumer(&ringer).unwrap(), "announced: must ring");
    assert!(bell.wait(Some(Duration::ZERO)).unwrap());
    rx.finish_sleep().unwrap();
    assert!(!tx.wake_consumer(&ringer).unwrap());
    assert!(
        rx.prepare_sleep().unwrap(),
        "a message is there: don't sleep"
    );
    assert!(
        !tx.wake_consumer(&ringer).unwrap(),
        "announcement withdrawn"
    );

    tx.push(b"y").unwrap();
    assert!(!tx.prepare_sleep().unwrap(), "full: may sleep");
    let mut buf = [0u8; 8];
    rx.pop(&mut buf).unwrap().unwrap();
    assert!(rx.wake_producer(&ringer).unwrap());
    tx.finish_sleep().unwrap();
    assert!(tx.prepare_sleep().unwrap(), "a slot is free: don't sleep");
    assert!(!rx.wake_producer(&ringer).unwrap());
}

/// Waiting once: a ring with no message ends the wait (so that the waiter can look at what
/// else its side rang for), a message ends it with `true`, and without either it sleeps
/// until the timeout.
#[test]
fn wait_readable_once_returns_on_any_ring() {
    let (mut tx, rx) = pair(4, 16);
    let (ringer, bell) = doorbell().unwrap();
    let rx = Arc::new(rx);
    let waiter = Waiter::new(Duration::ZERO);
    let t = Instant::now();
    assert!(!rx
        .wait_readable_once(&waiter, &bell, Some(Duration::from_millis(30)))
        .unwrap());
    assert!(t.elapsed() >= Duration::from_millis(30));
    // Rung for nothing: the wait ends, with no message.
    let r2 = Arc::clone(&rx);
    let b = thread::spawn(move || {
        let t = Instant::now();
        let got = r2.wait_readable_once(&waiter, &bell, None).unwrap();
        (got, t.elapsed(), bell)
    });
    thread::sleep(Duration::from_millis(50));
    ringer.ring().unwrap();
    let (got, took, bell) = b.join().unwrap();
    assert!(!got);
    assert!(took < Duration::from_secs(10), "{took:?}");
    // A spin budget longer than the timeout does not outlast it.
    let t = Instant::now();
    assert!(!rx
        .wait_readable_once(
            &Waiter::new(Duration::from_secs(30)),
            &bell,
            Some(Duration::from_millis(30))
        )
        .unwrap());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // A message that comes while it sleeps ends the wait with true.
    let r3 = Arc::clone(&rx);
    let sleeper = thread::spawn(move || {
        let got = r3
            .wait_readable_once(&Waiter::new(Duration::ZERO), &bell, None)
            .unwrap();
        (got, bell)
    });
    let flag = tx.region().atomic_u32(0x180).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while flag.load(std::sync::atomic::Ordering::Acquire) == 0 {
        assert!(
            Instant::now() < deadline,
            "the consumer never went to sleep"
        );
        thread::sleep(Duration::from_millis(1));
    }
    tx.push(b"s").unwrap();
    assert!(tx.wake_consumer(&ringer).unwrap());
    let (got, bell) = sleeper.join().unwrap();
    assert!(got);
    // A message: true, at once.
    tx.push(b"m").unwrap();
    assert!(rx
        .wait_readable_once(&waiter, &bell, Some(Duration::from_secs(10)))
        .unwrap());
}

/// A third party sees whether published messages wait to be taken, the thread the
/// consumer last named and whether it asks something, through the shared words alone.
#[test]
fn pending_messages_and_the_consumers_thread_are_seen_from_outside() {
    let (region, ring) = region_with_ring(16, 64);
    let mut p = ring.producer(region.clone()).unwrap();
    let mut c = ring.consumer(region.clone()).unwrap();
    assert!(!ring.pending(&region).unwrap());
    p.push(&message(1, 8)).unwrap();
    assert!(ring.pending(&region).unwrap());
    let mut buf = [0u8; 64];
    assert!(c.pop(&mut buf).unwrap().is_some());
    assert!(!ring.pending(&region).unwrap());
    assert_eq!(p.consumer_thread().unwrap(), 0, "not said yet");
    let mark = c.thread_mark().unwrap();
    mark.set(4242);
    assert_eq!(p.consumer_thread().unwrap(), 4242);
    assert!(!p.consumer_asking().unwrap());
    mark.asking(true);
    assert!(p.consumer_asking().unwrap());
    assert_eq!(p.consumer_thread().unwrap(), 4242, "words apart");
    mark.asking(false);
    assert!(!p.consumer_asking().unwrap());
}
