//! Explicit time. The core never reads a clock: the daemon passes real time, the
//! simulator passes simulated time. Beside it, the modeled time of the emulated hardware
//! ([`ModelTime`], and the [`Stamp`] every cell carries), which `crate::model` computes:
//! here so that cells, which carry stamps, need nothing of the model.

use std::fmt;
use std::ops::{Add, Sub};

use serde::{Deserialize, Serialize};

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
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ModelTime(pub u64);

impl ModelTime {
    pub const ZERO: ModelTime = ModelTime(0);
    /// Later than any time: what a link with nothing to come promises.
    pub const NEVER: ModelTime = ModelTime(u64::MAX);

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

    /// Where a process attaching at wall-clock time `since_unix_epoch` starts its modeled
    /// clock: that time, within a cycle of [`START_CYCLE_DAYS`] days.
    ///
    /// Why the wall clock: what a rack's resources remember (links' and the NI's busy
    /// intervals, buffer accounts) is in modeled time, and a process that started at zero
    /// met the busy past of every program before it on the same nodes: the same rdma-bw
    /// modeled 9.06 Gb/s through a link on a fresh rack and 2.37, then 1.83, run after run.
    /// Modeled time runs slower than the host's for whatever the rack emulates (a modeled
    /// microsecond takes tens of host microseconds, and compute counts at most the CPU time
    /// it took at `compute_scale` 1), so a program that starts at the wall clock starts
    /// after everything the programs before it did, on every node, with no exchange
    /// between daemons. That holds while programs' clocks do not outrun the wall clock:
    /// a `compute_scale` above 1, clocks moved ahead (`Endpoint::advance_clock`, stamps
    /// ahead, up to `ni::MAX_LEAD` a command) and hosts whose clocks differ (a millisecond
    /// is 1e9 ps, more than a 1 MiB transfer) can leave busy time where the next program
    /// starts. The cycle keeps over 100 days of modeled time below `u64` picoseconds'
    /// 213; at its wrap, clocks (and the nodes' modeled time metric) start low again.
    pub fn from_wall(since_unix_epoch: std::time::Duration) -> ModelTime {
        const CYCLE_NS: u128 = START_CYCLE_DAYS as u128 * 86_400 * 1_000_000_000;
        let ns = since_unix_epoch.as_nanos() % CYCLE_NS;
        ModelTime(ns as u64 * 1000)
    }
}

/// The cycle of [`ModelTime::from_wall`]: where processes start their modeled clocks
/// repeats every this many days of wall-clock time.
pub const START_CYCLE_DAYS: u64 = 100;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_starts_at_the_wall_clock_within_its_cycle() {
        use std::time::Duration;
        let day = Duration::from_secs(86_400);
        assert_eq!(ModelTime::from_wall(Duration::ZERO), ModelTime::ZERO);
        let t = day * 3 + Duration::from_nanos(7);
        assert_eq!(ModelTime::from_wall(t).ps(), t.as_nanos() as u64 * 1000);
        // One cycle later, the same start; the latest start leaves over 100 days below
        // the end of u64 picoseconds.
        let cycle = day * START_CYCLE_DAYS as u32;
        assert_eq!(
            ModelTime::from_wall(t + cycle * 20_000),
            ModelTime::from_wall(t)
        );
        let last = ModelTime::from_wall(cycle - Duration::from_nanos(1));
        assert!(u64::MAX - last.ps() > 100 * 86_400 * 1_000_000_000_000);
    }
}
