//! Explicit time. The core never reads a clock: the daemon passes real time, the
//! simulator passes simulated time, the future modeled-time mode passes modeled time.

use std::ops::{Add, Sub};

/// Nanoseconds since an origin chosen by whoever drives the core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);

    pub fn from_micros(us: u64) -> Instant {
        Instant(us.saturating_mul(1_000))
    }

    pub fn nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<u64> for Instant {
    type Output = Instant;
    fn add(self, ns: u64) -> Instant {
        Instant(self.0.saturating_add(ns))
    }
}

impl Sub<Instant> for Instant {
    type Output = u64;
    fn sub(self, other: Instant) -> u64 {
        self.since(other)
    }
}
