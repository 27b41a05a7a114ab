//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use exanet_shm::{Consumer, Producer, Region, Ring};

/// The deterministic message number `i` for a ring whose messages carry at most `max` bytes:
/// its length varies with `i` (0 included) and its bytes depend on `i` and the position.
pub fn message(i: u64, max: usize) -> Vec<u8> {
    let len = (i.wrapping_mul(7919) % (max as u64 + 1)) as usize;
    (0..len)
        .map(|k| (i as usize).wrapping_mul(31).wrapping_add(k * 7) as u8)
        .collect()
}

/// A fresh region holding one initialised ring at offset 0.
pub fn region_with_ring(slots: u32, slot_size: u32) -> (Arc<Region>, Ring) {
    let ring = Ring::new(0, slots, slot_size).unwrap();
    let region = Arc::new(Region::create("exanet-shm-test", ring.end()).unwrap());
    ring.init(&region).unwrap();
    (region, ring)
}

/// A producer and a consumer on one fresh ring, each on its own mapping of the memfd (as if
/// in two processes).
pub fn pair(slots: u32, slot_size: u32) -> (Producer, Consumer) {
    let (region, ring) = region_with_ring(slots, slot_size);
    let other =
        Arc::new(Region::from_fd_with_len(region.try_clone_fd().unwrap(), ring.end()).unwrap());
    (
        ring.producer(region).unwrap(),
        ring.consumer(other).unwrap(),
    )
}
