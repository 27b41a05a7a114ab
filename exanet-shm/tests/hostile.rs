//! A hostile (or buggy) peer writes garbage into the ring: every case must end in a typed
//! error or harmless garbage data, never a panic or an access outside the region.
//!
//! Header offsets used below (see the layout in the `ring` module docs): magic 0x00,
//! capacity 0x08, slot_size 0x0c, head 0x80, tail 0x100, consumer_sleeping 0x180,
//! producer_sleeping 0x200, slots from 0x280; in a slot: stamp +0, length +4, payload +8.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use exanet_shm::{doorbell, Corruption, Region, RingError};

use common::region_with_ring;

const HEAD: usize = 0x80;
const TAIL: usize = 0x100;
const SLOTS: usize = 0x280;

/// The peer's mapping of the same memfd, through which it misbehaves.
fn peer(region: &Region) -> Region {
    Region::from_fd(region.try_clone_fd().unwrap()).unwrap()
}

#[test]
fn tail_far_ahead() {
    let (region, ring) = region_with_ring(8, 32);
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    let evil = peer(&region);
    evil.atomic_u32(TAIL)
        .unwrap()
        .store(1_000_000, Ordering::Release);
    let mut buf = [0u8; 24];
    match rx.pop(&mut buf) {
        Err(RingError::Corrupt(Corruption::Indices {
            head: 0,
            tail: 1_000_000,
            capacity: 8,
        })) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        rx.available(),
        Err(RingError::Corrupt(Corruption::Indices { .. }))
    ));
    // Attaching to such a ring is refused too.
    assert!(matches!(
        ring.consumer(Arc::clone(&region)),
        Err(RingError::Corrupt(_))
    ));
    assert!(matches!(
        ring.producer(Arc::clone(&region)),
        Err(RingError::Corrupt(_))
    ));
    // Capacity + 1 is the smallest bad distance.
    evil.atomic_u32(TAIL).unwrap().store(9, Ordering::Release);
    assert!(matches!(rx.pop(&mut buf), Err(RingError::Corrupt(_))));
    // The peer repents: the ring works again (errors are not sticky).
    evil.atomic_u32(TAIL).unwrap().store(0, Ordering::Release);
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
}

#[test]
fn tail_moved_behind_head() {
    let (region, ring) = region_with_ring(8, 32);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    let mut buf = [0u8; 24];
    for _ in 0..5 {
        tx.push(b"m").unwrap();
        rx.pop(&mut buf).unwrap().unwrap();
    }
    // head = 5; a tail of 3 would mean -2 messages.
    peer(&region)
        .atomic_u32(TAIL)
        .unwrap()
        .store(3, Ordering::Release);
    match rx.pop(&mut buf) {
        Err(RingError::Corrupt(Corruption::Indices {
            head: 5,
            tail: 3,
            capacity: 8,
        })) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn head_ahead_of_tail() {
    let (region, ring) = region_with_ring(4, 16);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let evil = peer(&region);
    tx.push(b"a").unwrap();
    evil.atomic_u32(HEAD).unwrap().store(7, Ordering::Release);
    // `free` always re-reads head.
    match tx.free() {
        Err(RingError::Corrupt(Corruption::Indices {
            head: 7,
            tail: 1,
            capacity: 4,
        })) => {}
        other => panic!("{other:?}"),
    }
    // `push` re-reads it once its cached view says full; nothing is written past that.
    let results: Vec<_> = (0..6).map(|_| tx.push(b"b")).collect();
    assert!(results[..3].iter().all(Result::is_ok), "{results:?}");
    assert!(
        results[3..]
            .iter()
            .all(|r| matches!(r, Err(RingError::Corrupt(Corruption::Indices { .. })))),
        "{results:?}"
    );
    // Head far behind: more than capacity in flight.
    evil.atomic_u32(HEAD)
        .unwrap()
        .store(u32::MAX - 100, Ordering::Release);
    assert!(matches!(tx.free(), Err(RingError::Corrupt(_))));
}

#[test]
fn header_rewritten() {
    let (region, ring) = region_with_ring(8, 32);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    let evil = peer(&region);

    // Capacity changed: attaching refuses it...
    evil.atomic_u32(0x08)
        .unwrap()
        .store(1 << 30, Ordering::Release);
    match ring.consumer(Arc::clone(&region)) {
        Err(RingError::HeaderMismatch {
            field: "capacity",
            expected: 8,
            found,
        }) => assert_eq!(found, 1 << 30),
        other => panic!("{other:?}"),
    }
    // ...attached sides keep using the agreed geometry (never re-read) and can detect it.
    match tx.check_header() {
        Err(RingError::Corrupt(Corruption::Header {
            field: "capacity",
            expected: 8,
            ..
        })) => {}
        other => panic!("{other:?}"),
    }
    let mut buf = [0u8; 24];
    for i in 0..20u8 {
        tx.push(&[i; 24]).unwrap();
        assert_eq!(rx.pop(&mut buf).unwrap(), Some(24));
        assert_eq!(buf, [i; 24]);
    }

    evil.atomic_u32(0x08).unwrap().store(8, Ordering::Release);
    evil.atomic_u32(0x0c)
        .unwrap()
        .store(4096, Ordering::Release);
    assert!(matches!(
        rx.check_header(),
        Err(RingError::Corrupt(Corruption::Header {
            field: "slot_size",
            ..
        }))
    ));
    assert!(matches!(
        ring.producer(Arc::clone(&region)),
        Err(RingError::HeaderMismatch {
            field: "slot_size",
            ..
        })
    ));
    evil.atomic_u32(0x0c).unwrap().store(32, Ordering::Release);
    evil.atomic_u32(0x00)
        .unwrap()
        .store(0xdead_beef, Ordering::Release);
    assert!(matches!(
        rx.check_header(),
        Err(RingError::Corrupt(Corruption::Header {
            field: "magic",
            ..
        }))
    ));
    assert!(matches!(
        ring.producer(region),
        Err(RingError::HeaderMismatch { field: "magic", .. })
    ));
}

#[test]
fn slot_length_garbage() {
    let (region, ring) = region_with_ring(4, 16);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    let evil = peer(&region);
    tx.push(b"hi").unwrap();
    let mut buf = [0u8; 64];
    for bad in [9u32, 16, 1 << 20, u32::MAX] {
        evil.write(SLOTS + 4, &bad.to_le_bytes()).unwrap();
        match rx.pop(&mut buf) {
            Err(RingError::Corrupt(Corruption::SlotLength {
                index: 0,
                len,
                max: 8,
            })) => assert_eq!(len, bad),
            other => panic!("{other:?}"),
        }
    }
    // The largest legal length reads whatever bytes the slot holds, within the slot.
    evil.write(SLOTS + 4, &8u32.to_le_bytes()).unwrap();
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(8));
    assert_eq!(&buf[..2], b"hi");
}

#[test]
fn published_slot_without_its_stamp() {
    let (region, ring) = region_with_ring(4, 16);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    let evil = peer(&region);
    tx.push(b"ok").unwrap();
    // Message 0 is published (tail = 1) but its stamp is overwritten.
    evil.atomic_u32(SLOTS).unwrap().store(77, Ordering::Release);
    let mut buf = [0u8; 8];
    match rx.pop(&mut buf) {
        Err(RingError::Corrupt(Corruption::Stamp {
            index: 0,
            expected: 1,
            found: 77,
        })) => {}
        other => panic!("{other:?}"),
    }
    // A tail that was never advanced while a stamp is there: the stamp wins (the message is
    // the producer's to garble).
    evil.atomic_u32(SLOTS).unwrap().store(1, Ordering::Release);
    evil.atomic_u32(TAIL).unwrap().store(0, Ordering::Release);
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(2));
    assert_eq!(&buf[..2], b"ok");
}

#[test]
fn sleeping_flags_garbage_only_causes_spurious_rings() {
    let (region, ring) = region_with_ring(4, 16);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let rx = ring.consumer(Arc::clone(&region)).unwrap();
    let evil = peer(&region);
    let (ringer, bell) = doorbell().unwrap();
    evil.atomic_u32(0x180)
        .unwrap()
        .store(0xffff_ffff, Ordering::Release);
    evil.atomic_u32(0x200)
        .unwrap()
        .store(0x1234, Ordering::Release);
    tx.push(b"x").unwrap();
    assert!(tx.wake_consumer(&ringer).unwrap());
    assert!(rx.wake_producer(&ringer).unwrap());
    assert!(bell.drain().unwrap());
}

/// xorshift64*: a tiny deterministic generator, enough to produce garbage.
struct Garbage(u64);

impl Garbage {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A peer thread scribbles random values over the whole ring (header, indices, slots) while
/// a producer and a consumer run: every outcome must be `Ok` or a typed error.
#[test]
fn random_scribbling_never_panics() {
    let (region, ring) = region_with_ring(8, 64);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    let evil = peer(&region);
    let len = evil.len();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let scribbler = thread::spawn(move || {
        let mut g = Garbage(0x9e37_79b9_7f4a_7c15);
        let mut writes = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            let r = g.next();
            // Aim at the interesting words half of the time.
            let offset = match r % 8 {
                0 => HEAD,
                1 => TAIL,
                2 => 0x08,
                3 => SLOTS + (g.next() as usize % 8) * 64,
                _ => (g.next() as usize % len) & !3,
            };
            let value = match g.next() % 4 {
                0 => g.next() as u32 % 16,
                1 => u32::MAX - (g.next() as u32 % 16),
                _ => g.next() as u32,
            };
            let _ = evil
                .atomic_u32(offset)
                .map(|a| a.store(value, Ordering::Relaxed));
            writes += 1;
        }
        writes
    });
    let mut buf = [0u8; 60];
    let (mut pushed, mut popped, mut refused, mut corrupt) = (0u64, 0u64, 0u64, 0u64);
    for i in 0..300_000u32 {
        if i % 2 == 0 {
            match tx.push(&i.to_le_bytes()) {
                Ok(_) => pushed += 1,
                Err(RingError::Full) => refused += 1,
                Err(RingError::Corrupt(_)) => corrupt += 1,
                Err(e) => panic!("unexpected error {e:?}"),
            }
        } else {
            match rx.pop(&mut buf) {
                Ok(Some(n)) => {
                    assert!(n <= buf.len(), "popped {n} B into a {} B buffer", buf.len());
                    popped += 1;
                }
                Ok(None) => refused += 1,
                Err(RingError::Corrupt(_)) => corrupt += 1,
                Err(e) => panic!("unexpected error {e:?}"),
            }
        }
        let _ = tx.check_header();
    }
    stop.store(true, Ordering::Relaxed);
    let writes = scribbler.join().unwrap();
    eprintln!(
        "{writes} scribbles: {pushed} pushed, {popped} popped, {refused} full or empty, \
         {corrupt} corrupt"
    );
    assert!(writes > 0);
    // The scribbles were seen as corruption, not taken for messages only, and between
    // them the ring kept working both ways.
    assert!(corrupt > 0, "no scribble was noticed");
    assert!(
        pushed > 0 && popped > 0,
        "the ring never worked under scribbling"
    );
}

/// `head == tail + 1` is a state a correct pair can be seen in (the consumer took a stamped
/// message before the tail store became visible): empty, not corrupt.
#[test]
fn consumer_one_ahead_of_tail_is_empty() {
    let (region, ring) = region_with_ring(4, 16);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    tx.push(b"a").unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(1));
    // Pretend the tail store of message 0 is not visible yet.
    peer(&region)
        .atomic_u32(TAIL)
        .unwrap()
        .store(0, Ordering::Release);
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
    assert_eq!(rx.available().unwrap(), 0);
    ring.consumer(Arc::clone(&region)).unwrap();
    // Two ahead is not possible.
    peer(&region)
        .atomic_u32(TAIL)
        .unwrap()
        .store(u32::MAX, Ordering::Release);
    assert!(matches!(
        rx.pop(&mut buf),
        Err(RingError::Corrupt(Corruption::Indices { .. }))
    ));
}

/// A producer that died between stamping a message and publishing the tail: the next
/// producer goes on after that message instead of overwriting it.
#[test]
fn new_producer_skips_a_stamped_but_unpublished_message() {
    let (region, ring) = region_with_ring(4, 16);
    let mut dead = ring.producer(Arc::clone(&region)).unwrap();
    dead.push(b"last words").unwrap_err();
    dead.push(b"last").unwrap();
    drop(dead);
    peer(&region)
        .atomic_u32(TAIL)
        .unwrap()
        .store(0, Ordering::Release);
    let mut tx = ring.producer(Arc::clone(&region)).unwrap();
    tx.push(b"next").unwrap();
    let mut rx = ring.consumer(Arc::clone(&region)).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(4));
    assert_eq!(&buf[..4], b"last");
    assert_eq!(rx.pop(&mut buf).unwrap(), Some(4));
    assert_eq!(&buf[..4], b"next");
    assert_eq!(rx.pop(&mut buf).unwrap(), None);
}
