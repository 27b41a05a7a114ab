//! Explicit time. The core never reads a clock: the daemon passes real time, the
//! simulator passes simulated time. Beside it, the modeled time of the emulated hardware
//! ([`ModelTime`], and the [`Stamp`] every cell carries), which `crate::model` computes:
//! here so that cells, which carry stamps, need nothing of the model.

use std::fmt;
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

/// Modeled time in picoseconds since the rack's modeled origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelTime(pub u64);

impl ModelTime {
    pub const ZERO: ModelTime = ModelTime(0);

    pub fn from_ns(ns: u64) -> ModelTime {
        ModelTime(ns.saturating_mul(1000))
    }

    pub fn ps(self) -> u64 {
        self.0
    }

    /// Whole nanoseconds (rounded down).
    pub fn ns(self) -> u64 {
        self.0 / 1000
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 * 1e-12
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: ModelTime) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<u64> for ModelTime {
    type Output = ModelTime;
    /// Adds picoseconds.
    fn add(self, ps: u64) -> ModelTime {
        ModelTime(self.0.saturating_add(ps))
    }
}

impl Sub<ModelTime> for ModelTime {
    type Output = u64;
    fn sub(self, other: ModelTime) -> u64 {
        self.since(other)
    }
}

impl fmt::Display for ModelTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} us", self.0 as f64 / 1e6)
    }
}

/// When a cell's first byte (`head`) and last byte (`tail`) reach the input it travels to.
/// Switches cut through: a cell may leave on its head, but never finishes before its tail
/// has come in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub head: ModelTime,
    pub tail: ModelTime,
}

impl Stamp {
    /// A cell whose bytes are all there at `t` (made by the NI at `t`).
    pub fn at(t: ModelTime) -> Stamp {
        Stamp { head: t, tail: t }
    }
}
