//! Fault injection and shaping for one direction of a link, after smoltcp's
//! `FaultInjector`: a wrapper the link's sender passes every frame through. It loses and
//! corrupts cells with seeded draws and holds frames back for delay, jitter and a rate
//! limit. With no fault set it is idle and the sender skips it entirely, so a rack without
//! faults pays one branch per cell.
//!
//! What each fault means on the emulated link:
//! - **loss** drops a cell on the wire. Link-level credit is bookkeeping between the two
//!   switches, not traffic, so the sender takes the lost cell's credit back at once (as
//!   if the receiver had discarded it and returned the credit); recovering the data is
//!   the NI's end-to-end job (ACK timeout, retransmission).
//! - **corrupt** flips one bit of the cell as it travels. Where it lands decides who
//!   catches it: a header bit fails the header CRC at the next switch (the cell is dropped
//!   there and its credit refunded); a payload bit fails the end-to-end payload CRC at the
//!   destination NI, which NACKs it; a footer bit fails the footer CRC at the next switch.
//!   Nothing corrupt is ever accepted as data.
//! - **delay**, **jitter** and **rate** shape time: each frame leaves no earlier than the
//!   link's serialisation at `rate` allows, plus `delay`, plus a uniform draw in
//!   `0..=jitter`. ExaNet links never reorder, so neither does this: a frame never leaves
//!   before the one queued ahead of it (jitter therefore bunches frames rather than
//!   swapping them). Delay and rate apply to every frame, credits included, since both
//!   travel on the same wire; loss and corruption apply to cells only, because the
//!   emulated link-level flow control is reliable.
//! - **duplicate** sends a cell twice. The copy is a real cell on the wire: it takes
//!   link-level credit as the cell does (the neighbour's buffer holds it), so a cell is
//!   copied only when its output has that credit; the NI at its destination must see
//!   it as a duplicate and deliver the data once.
//! - **reorder** holds a share of cells back by up to `reorder-window`, letting later
//!   frames overtake them: the one fault that breaks the links' FIFO order, for testing
//!   what end-to-end protocols make of it (ExaNet links never reorder).
//! - **down** is carried out by the link's owner (it ends the link session and refuses
//!   new ones); the injector only records it.
//!
//! Loss, corruption, duplication and reordering are independent draws, in that order; a
//! lost cell is not also counted corrupt.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::rng::SplitMix64;
use crate::time::Instant;

/// Longest delay or jitter a link can be given: longer would outlast every NI timeout and
/// QUIC's idle timer, which is a dead link, not a slow one (use `down` for that).
pub const MAX_DELAY_NS: u64 = 10_000_000_000;
/// Slowest rate a link can be given, bits per second. Slower, one 272-byte cell takes
/// over two seconds to leave.
pub const MIN_RATE_BPS: u64 = 1_000;

/// The faults set on one direction of a link. The default is a clear link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkFaults {
    /// Added to every frame's departure, nanoseconds.
    pub delay_ns: u64,
    /// Upper bound of a uniform extra delay per frame, nanoseconds.
    pub jitter_ns: u64,
    /// Serialisation rate in bits per second; 0 leaves the link unshaped.
    pub rate_bps: u64,
    /// Probability (0..=1) that a cell is lost.
    pub loss: f64,
    /// Probability (0..=1) that a cell has one bit flipped.
    pub corrupt: f64,
    /// Probability (0..=1) that a cell is sent twice.
    pub duplicate: f64,
    /// Probability (0..=1) that a cell is held back for later frames to overtake.
    pub reorder: f64,
    /// Up to how long a reordered cell is held back, nanoseconds.
    pub reorder_ns: u64,
    /// The link is cut.
    pub down: bool,
}

/// A fault setting the injector cannot carry out.
#[derive(Debug, Error, PartialEq)]
pub enum FaultError {
    #[error("{what} probability {value} is outside 0..=1 (0% to 100%)")]
    Probability { what: &'static str, value: f64 },
    #[error("{what} of {ns} ns is over the {max} ns limit", max = MAX_DELAY_NS)]
    TooLong { what: &'static str, ns: u64 },
    #[error("rate {bps} bit/s is below the {min} bit/s minimum", min = MIN_RATE_BPS)]
    RateTooLow { bps: u64 },
    #[error("reorder {}% needs a reorder-window above 0 (how far back a reordered cell falls)", .0 * 100.0)]
    ReorderWindow(f64),
}

impl LinkFaults {
    /// Checks a setting the injector will carry out: every value in range, and settings
    /// that need each other together (a reorder needs its window).
    pub fn validate(&self) -> Result<(), FaultError> {
        self.validate_values()?;
        if self.reorder > 0.0 && self.reorder_ns == 0 {
            return Err(FaultError::ReorderWindow(self.reorder));
        }
        Ok(())
    }

    /// Checks each value against its own range only: what is wrong in a change whatever
    /// it is merged with.
    pub fn validate_values(&self) -> Result<(), FaultError> {
        // Probabilities first, then times, then the rate: the order errors were always
        // reported in when several settings are wrong at once.
        for unit in [FaultUnit::Probability, FaultUnit::Duration, FaultUnit::Rate] {
            for kind in FaultKind::ALL.iter().filter(|k| k.unit() == unit) {
                let what = kind.name();
                match kind.get(self) {
                    // NaN fails `contains` too.
                    FaultValue::Probability(value) if !(0.0..=1.0).contains(&value) => {
                        return Err(FaultError::Probability { what, value });
                    }
                    FaultValue::Duration(ns) if ns > MAX_DELAY_NS => {
                        return Err(FaultError::TooLong { what, ns });
                    }
                    FaultValue::Rate(bps) if bps != 0 && bps < MIN_RATE_BPS => {
                        return Err(FaultError::RateTooLow { bps });
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// No fault at all: the link behaves as if the injector were not there.
    pub fn is_clear(&self) -> bool {
        *self == LinkFaults::default()
    }

    /// Frames are held back (delay, jitter, rate or reordering).
    pub fn shapes(&self) -> bool {
        self.reorder > 0.0
            || FaultKind::ALL
                .iter()
                .any(|k| k.unit().shapes() && !k.get(self).is_clear())
    }
}

/// How the value of a fault kind is stored, written and exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultUnit {
    /// Nanoseconds (`u64`); written `200us`, `1.5ms`; exported in seconds.
    Duration,
    /// Bits per second (`u64`, 0 leaves the link unshaped); written `100Mbit` or
    /// `12.5MB/s`; exported in bytes per second.
    Rate,
    /// A probability 0..=1 (`f64`); written as a percentage, `0.1%`; exported as a ratio.
    Probability,
    /// On or off (`bool`): the kind's flag sets it, its off flag clears it.
    Switch,
}

impl FaultUnit {
    /// A fault of this unit holds frames back, so the injector cannot pass them at once.
    pub fn shapes(self) -> bool {
        matches!(self, FaultUnit::Duration | FaultUnit::Rate)
    }
}

/// The value of one fault kind, in its unit (values of one unit order as numbers).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub enum FaultValue {
    Duration(u64),
    Rate(u64),
    Probability(f64),
    Switch(bool),
}

impl FaultValue {
    pub fn unit(self) -> FaultUnit {
        match self {
            FaultValue::Duration(_) => FaultUnit::Duration,
            FaultValue::Rate(_) => FaultUnit::Rate,
            FaultValue::Probability(_) => FaultUnit::Probability,
            FaultValue::Switch(_) => FaultUnit::Switch,
        }
    }

    /// The value of a clear link.
    pub fn is_clear(self) -> bool {
        match self {
            FaultValue::Duration(v) | FaultValue::Rate(v) => v == 0,
            FaultValue::Probability(p) => p == 0.0,
            FaultValue::Switch(on) => !on,
        }
    }

    /// The value in the unit a metric carries: seconds, bytes per second, a ratio, 0 or 1.
    pub fn metric_value(self) -> f64 {
        match self {
            FaultValue::Duration(ns) => ns as f64 / 1e9,
            FaultValue::Rate(bps) => bps as f64 / 8.0,
            FaultValue::Probability(p) => p,
            FaultValue::Switch(on) => f64::from(u8::from(on)),
        }
    }
}

/// A value given to a fault kind of another unit (a `loss` of 5 ms).
#[derive(Debug, Error, PartialEq)]
#[error("{kind} takes a {want:?} value, not {got:?}", kind = kind.name())]
pub struct FaultUnitMismatch {
    pub kind: FaultKind,
    pub want: FaultUnit,
    pub got: FaultValue,
}

/// Declares every fault kind once: the enum, its table and the accessors of its
/// [`LinkFaults`] field. Each entry gives
/// - `name`: the word for it everywhere an operator sees it: `exactl link set --NAME`, the
///   key of a fault plan's `set = { NAME = ... }`, the word `exactl link show` prints;
/// - `field` of [`LinkFaults`] and its `unit` (which decides parser, display, range check
///   and metric conversion);
/// - `help`: the one-line help of the command-line flag;
/// - `off`: an extra flag (and its help) that clears the fault, where a zero value could
///   not be typed or would read wrongly (`--no-rate`, `--up`);
/// - `metric`: the `setting` label of the `exanet_link_fault_setting` gauge, if exported;
/// - `counter`: for kinds that act on cells one by one, the word for the cells it acted
///   on (the `fault` label of `exanet_link_faults_injected_total`, a key of
///   [`FaultStats`] and of `exactl top --json`) and the header of its column in `exactl
///   link show`.
macro_rules! fault_kinds {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident {
            name: $name:literal,
            field: $field:ident,
            unit: $unit:ident,
            help: $help:literal,
            off: $off:expr,
            metric: $metric:expr,
            counter: $counter:expr $(,)?
        }
    )*) => {
        /// One kind of fault a link direction can be given. [`FaultKind::ALL`] is the
        /// table every tool walks (exactl's `link set` flags, fault plans and `link show`,
        /// exanetd's metrics), so a new kind is declared here once and appears in all of
        /// them; only what the kind does to cells is written by hand (in the injector).
        ///
        /// ```
        /// use exanet_proto::fault::{FaultKind, FaultValue, LinkFaults};
        /// let mut f = LinkFaults::default();
        /// FaultKind::Loss.set(&mut f, FaultValue::Probability(0.01)).unwrap();
        /// for k in FaultKind::ALL {
        ///     if let Some(setting) = k.metric() {
        ///         let _gauge = (setting, k.get(&f).metric_value());
        ///     }
        /// }
        /// assert_eq!(FaultKind::Loss.name(), "loss");
        /// ```
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum FaultKind {
            $( $(#[doc = $doc])* $kind, )*
        }

        impl FaultKind {
            /// Every kind, in the order they are listed to operators.
            pub const ALL: &'static [FaultKind] = &[$(FaultKind::$kind),*];
            /// How many kinds there are (the size of a per-kind array).
            pub const COUNT: usize = Self::ALL.len();

            /// Its place in [`FaultKind::ALL`] (for per-kind arrays).
            pub fn index(self) -> usize {
                self as usize
            }

            /// The operator's word for it: command-line flag, plan key, display word.
            pub fn name(self) -> &'static str {
                match self { $(FaultKind::$kind => $name,)* }
            }

            pub fn unit(self) -> FaultUnit {
                match self { $(FaultKind::$kind => FaultUnit::$unit,)* }
            }

            /// The help line of its command-line flag.
            pub fn help(self) -> &'static str {
                match self { $(FaultKind::$kind => $help,)* }
            }

            /// The flag that clears it and that flag's help, if it has one.
            pub fn off_flag(self) -> Option<(&'static str, &'static str)> {
                match self { $(FaultKind::$kind => $off,)* }
            }

            /// The `setting` label of its gauge in exanetd's metrics, if exported.
            pub fn metric(self) -> Option<&'static str> {
                match self { $(FaultKind::$kind => $metric,)* }
            }

            /// The word for the cells it acted on, if it counts them (see
            /// [`FaultStats::cells`]).
            pub fn counter(self) -> Option<&'static str> {
                let c: Option<(&'static str, &'static str)> = match self { $(FaultKind::$kind => $counter,)* };
                c.map(|(word, _)| word)
            }

            /// The header of its counter's column in tables.
            pub fn counter_header(self) -> Option<&'static str> {
                let c: Option<(&'static str, &'static str)> = match self { $(FaultKind::$kind => $counter,)* };
                c.map(|(_, header)| header)
            }

            /// Its value in `faults`.
            pub fn get(self, faults: &LinkFaults) -> FaultValue {
                match self { $(FaultKind::$kind => FaultValue::$unit(faults.$field),)* }
            }

            /// Sets its value in `faults`; a value of another unit changes nothing.
            pub fn set(
                self,
                faults: &mut LinkFaults,
                value: FaultValue,
            ) -> Result<(), FaultUnitMismatch> {
                match (self, value) {
                    $((FaultKind::$kind, FaultValue::$unit(v)) => {
                        faults.$field = v;
                        Ok(())
                    })*
                    _ => Err(FaultUnitMismatch { kind: self, want: self.unit(), got: value }),
                }
            }

            /// The kind an operator's word names (any case).
            pub fn from_name(name: &str) -> Option<FaultKind> {
                Self::ALL.iter().copied().find(|k| k.name().eq_ignore_ascii_case(name))
            }
        }
    };
}

fault_kinds! {
    /// Added to every frame's departure.
    Delay {
        name: "delay",
        field: delay_ns,
        unit: Duration,
        help: "Added to every frame, e.g. 200us, 1.5ms (0 removes it)",
        off: None,
        metric: Some("delay_seconds"),
        counter: None,
    }
    /// A uniform extra delay per frame, up to the value (frames stay in order).
    Jitter {
        name: "jitter",
        field: jitter_ns,
        unit: Duration,
        help: "Uniform extra delay up to this much per frame (links stay FIFO)",
        off: None,
        metric: Some("jitter_seconds"),
        counter: None,
    }
    /// The serialisation rate of the link.
    Rate {
        name: "rate",
        field: rate_bps,
        unit: Rate,
        help: "Link rate in bits (100Mbit, 1Gbit, 100Mbps) or bytes per second (12.5MB/s, 1GiB/s)",
        off: Some(("no-rate", "Remove a rate limit")),
        metric: Some("rate_bytes_per_second"),
        counter: None,
    }
    /// Cells lost on the wire.
    Loss {
        name: "loss",
        field: loss,
        unit: Probability,
        help: "Share of cells lost, e.g. 0.1%, 30%",
        off: None,
        metric: Some("loss_ratio"),
        counter: Some(("drop", "DROPPED")),
    }
    /// Cells with one bit flipped.
    Corrupt {
        name: "corrupt",
        field: corrupt,
        unit: Probability,
        help: "Share of cells with a flipped bit, e.g. 1%",
        off: None,
        metric: Some("corrupt_ratio"),
        counter: Some(("corrupt", "CORRUPTED")),
    }
    /// Cells sent twice.
    Duplicate {
        name: "duplicate",
        field: duplicate,
        unit: Probability,
        help: "Share of cells sent twice, e.g. 1% (the copy takes link credit as the cell does)",
        off: None,
        metric: Some("duplicate_ratio"),
        counter: Some(("duplicate", "DUPLICATED")),
    }
    /// Cells held back for later frames to overtake (the only fault that reorders).
    Reorder {
        name: "reorder",
        field: reorder,
        unit: Probability,
        help: "Share of cells held back by up to --reorder-window, overtaken by later frames",
        off: None,
        metric: Some("reorder_ratio"),
        counter: Some(("reorder", "REORDERED")),
    }
    /// How far back a reordered cell falls.
    ReorderWindow {
        name: "reorder-window",
        field: reorder_ns,
        unit: Duration,
        help: "Up to how long a reordered cell is held back, e.g. 50us",
        off: None,
        metric: Some("reorder_window_seconds"),
        counter: None,
    }
    /// The link is cut: its session ends and neither end reconnects.
    Down {
        name: "down",
        field: down,
        unit: Switch,
        help: "Cut the link: its session ends and neither end reconnects until --up",
        off: Some(("up", "Restore a cut link")),
        metric: None,
        counter: None,
    }
}

/// What happens to one cell on the wire (its duplication and reordering are drawn
/// apart: see [`FaultInjector::duplicates`] and [`FaultInjector::reorder_ns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellFate {
    Pass,
    /// Lost: the sender takes its credit back.
    Drop,
    /// Bit `bit` (0 = the most significant bit of the first byte) of the encoded cell flips.
    Corrupt {
        bit: usize,
    },
}

/// What the injector has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultStats {
    /// Cells each kind with a counter acted on, by [`FaultKind::index`]; written as a
    /// map from the kinds' counter words (`{"drop": 3, "corrupt": 1}`).
    #[serde(with = "cells_by_counter")]
    cells: [u64; FaultKind::COUNT],
    /// Frames held back by delay, jitter, rate or reordering.
    pub delayed_frames: u64,
    /// Total time frames were held back, nanoseconds.
    pub delay_ns: u64,
}

impl FaultStats {
    /// Cells `kind` acted on (0 for kinds without a counter).
    pub fn cells(&self, kind: FaultKind) -> u64 {
        self.cells[kind.index()]
    }

    /// Counts a cell `kind` acted on.
    pub fn count(&mut self, kind: FaultKind) {
        self.cells[kind.index()] += 1;
    }

    /// Every kind with a counter, its counter word and its count, in table order.
    pub fn counted(&self) -> impl Iterator<Item = (FaultKind, &'static str, u64)> + '_ {
        FaultKind::ALL
            .iter()
            .filter_map(|&k| Some((k, k.counter()?, self.cells(k))))
    }
}

/// [`FaultStats::cells`] on the wire: a map from counter words, so that reports stay
/// readable and a kind added later does not shift the others.
mod cells_by_counter {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::FaultKind;

    pub fn serialize<S: Serializer>(
        cells: &[u64; FaultKind::COUNT],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let map: BTreeMap<&str, u64> = FaultKind::ALL
            .iter()
            .filter_map(|&k| Some((k.counter()?, cells[k.index()])))
            .collect();
        map.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<[u64; FaultKind::COUNT], D::Error> {
        let map = BTreeMap::<String, u64>::deserialize(d)?;
        let mut cells = [0; FaultKind::COUNT];
        for (word, n) in map {
            // A word this build does not know comes from a newer peer: not an error.
            if let Some(k) = FaultKind::ALL.iter().find(|k| k.counter() == Some(&word)) {
                cells[k.index()] = n;
            }
        }
        Ok(cells)
    }
}

/// The injector of one link direction.
#[derive(Debug)]
pub struct FaultInjector {
    faults: LinkFaults,
    rng: SplitMix64,
    /// When the emulated wire finishes serialising the last frame given to it.
    busy_until: Instant,
    /// Release time of the newest frame held back: nothing leaves before it (FIFO).
    last_release: Instant,
    stats: FaultStats,
}

impl FaultInjector {
    pub fn new(seed: u64) -> FaultInjector {
        FaultInjector {
            faults: LinkFaults::default(),
            rng: SplitMix64::new(seed),
            busy_until: Instant::ZERO,
            last_release: Instant::ZERO,
            stats: FaultStats::default(),
        }
    }

    /// Replaces the faults from `now` on. If the new setting no longer shapes, frames
    /// leave at once again (the link's sender, `LinkSender::set_faults`, releases those it
    /// holds).
    pub fn set(&mut self, faults: LinkFaults, now: Instant) -> Result<(), FaultError> {
        faults.validate()?;
        self.faults = faults;
        if !faults.shapes() {
            self.last_release = now;
        }
        if faults.rate_bps == 0 {
            self.busy_until = now;
        }
        Ok(())
    }

    /// Restarts the draws from `seed` (a fault plan run twice draws the same fates).
    pub fn reseed(&mut self, seed: u64) {
        self.rng = SplitMix64::new(seed);
    }

    pub fn faults(&self) -> &LinkFaults {
        &self.faults
    }

    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Draws the fate of a cell of `len` encoded bytes.
    pub fn cell_fate(&mut self, len: usize) -> CellFate {
        if self.rng.chance(self.faults.loss) {
            self.stats.count(FaultKind::Loss);
            return CellFate::Drop;
        }
        if len > 0 && self.rng.chance(self.faults.corrupt) {
            self.stats.count(FaultKind::Corrupt);
            let bit = self.rng.below(len as u64 * 8) as usize;
            return CellFate::Corrupt { bit };
        }
        CellFate::Pass
    }

    /// Draws whether a cell is sent twice; `credit` takes the copy's link credit and says
    /// whether it was there (without it the cell goes once, uncounted).
    pub fn duplicates(&mut self, credit: impl FnOnce() -> bool) -> bool {
        let copy = self.rng.chance(self.faults.duplicate) && credit();
        if copy {
            self.stats.count(FaultKind::Duplicate);
        }
        copy
    }

    /// Draws how long a cell is held back for later frames to overtake it (0: not).
    pub fn reorder_ns(&mut self) -> u64 {
        if self.rng.chance(self.faults.reorder) {
            self.stats.count(FaultKind::Reorder);
            1 + self.rng.below(self.faults.reorder_ns)
        } else {
            0
        }
    }

    /// When a frame of `len` bytes handed to the wire at `now` leaves: after the rate's
    /// serialisation behind earlier frames, the delay and a draw of the jitter, and never
    /// before an earlier frame (the link stays FIFO). The link's sender (`LinkSender`)
    /// holds it until then.
    pub fn release_at(&mut self, now: Instant, len: usize) -> Instant {
        let mut at = now;
        if self.faults.rate_bps != 0 {
            let bits = len as u128 * 8;
            let ns = (bits * 1_000_000_000).div_ceil(u128::from(self.faults.rate_bps));
            let start = self.busy_until.max(now);
            self.busy_until = start + u64::try_from(ns).unwrap_or(u64::MAX);
            at = self.busy_until;
        }
        at = at + self.faults.delay_ns;
        if self.faults.jitter_ns != 0 {
            at = at + self.rng.below(self.faults.jitter_ns + 1);
        }
        let at = at.max(self.last_release);
        self.last_release = at;
        if at > now {
            self.stats.delayed_frames += 1;
            self.stats.delay_ns += at - now;
        }
        at
    }
}

/// Flips bit `bit` of `bytes` (0 = most significant bit of byte 0); out of range is a no-op.
pub fn flip_bit(bytes: &mut [u8], bit: usize) {
    if let Some(b) = bytes.get_mut(bit / 8) {
        *b ^= 0x80 >> (bit % 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clear_injector_passes_everything_at_once() {
        let mut fi = FaultInjector::new(1);
        assert_eq!(fi.cell_fate(272), CellFate::Pass);
        assert_eq!(fi.release_at(Instant(5), 10), Instant(5));
        assert_eq!(fi.stats(), FaultStats::default());
    }

    #[test]
    fn delay_and_jitter_hold_frames_and_keep_them_in_order() {
        let mut fi = FaultInjector::new(3);
        let f = LinkFaults {
            delay_ns: 1_000_000,
            jitter_ns: 500_000,
            ..Default::default()
        };
        fi.set(f, Instant::ZERO).unwrap();
        let mut last = Instant::ZERO;
        for i in 0..100u64 {
            let now = Instant(i * 1_000);
            let at = fi.release_at(now, 1);
            assert!(at >= now + 1_000_000, "nothing before the delay");
            assert!(at >= last, "FIFO despite jitter");
            assert!(at <= now + 1_500_000 || at == last);
            last = at;
        }
        let st = fi.stats();
        assert_eq!(st.delayed_frames, 100);
        assert!(st.delay_ns >= 100 * 1_000_000);
    }

    #[test]
    fn rate_spaces_frames_by_their_serialisation_time() {
        let mut fi = FaultInjector::new(3);
        // 100 Mbit/s: a 1250-byte frame takes 100 µs.
        let f = LinkFaults {
            rate_bps: 100_000_000,
            ..Default::default()
        };
        fi.set(f, Instant::ZERO).unwrap();
        let at: Vec<u64> = (0..10)
            .map(|_| fi.release_at(Instant::ZERO, 1250).0)
            .collect();
        assert_eq!(at, (1..=10).map(|i| i * 100_000).collect::<Vec<_>>());
        // An idle wire does not bank credit: a frame sent late still takes its time.
        assert_eq!(fi.release_at(Instant(5_000_000), 1250), Instant(5_100_000));
    }

    #[test]
    fn clearing_lets_frames_leave_at_once_again() {
        let mut fi = FaultInjector::new(3);
        let f = LinkFaults {
            delay_ns: 5_000_000_000,
            ..Default::default()
        };
        fi.set(f, Instant::ZERO).unwrap();
        assert_eq!(fi.release_at(Instant::ZERO, 1), Instant(5_000_000_000));
        fi.set(LinkFaults::default(), Instant(10)).unwrap();
        assert_eq!(fi.release_at(Instant(11), 1), Instant(11));
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let mut fi = FaultInjector::new(1);
        for (f, want) in [
            (
                LinkFaults {
                    loss: 1.5,
                    ..Default::default()
                },
                "loss",
            ),
            (
                LinkFaults {
                    corrupt: f64::NAN,
                    ..Default::default()
                },
                "corrupt",
            ),
            (
                LinkFaults {
                    delay_ns: MAX_DELAY_NS + 1,
                    ..Default::default()
                },
                "delay",
            ),
            (
                LinkFaults {
                    rate_bps: 10,
                    ..Default::default()
                },
                "rate",
            ),
        ] {
            let e = fi.set(f, Instant::ZERO).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
            assert!(fi.faults().is_clear(), "a refused setting changes nothing");
        }
    }

    #[test]
    fn a_reorder_needs_its_window_only_once_merged() {
        let change = LinkFaults {
            reorder: 0.03,
            ..Default::default()
        };
        // Alone it is a range-checked value; as the whole setting it lacks its window.
        assert_eq!(change.validate_values(), Ok(()));
        assert_eq!(change.validate(), Err(FaultError::ReorderWindow(0.03)));
        let merged = LinkFaults {
            reorder_ns: 50_000,
            ..change
        };
        assert_eq!(merged.validate(), Ok(()));
    }

    #[test]
    fn loss_and_corruption_follow_their_probabilities_reproducibly() {
        let run = |seed| {
            let mut fi = FaultInjector::new(seed);
            fi.set(
                LinkFaults {
                    loss: 0.1,
                    corrupt: 0.05,
                    ..Default::default()
                },
                Instant::ZERO,
            )
            .unwrap();
            let fates: Vec<CellFate> = (0..20_000).map(|_| fi.cell_fate(272)).collect();
            (fates, fi.stats())
        };
        let (a, sa) = run(42);
        let (b, sb) = run(42);
        assert_eq!(a, b, "same seed, same fates");
        assert_eq!(sa, sb);
        assert!(
            (1_700..2_300).contains(&sa.cells(FaultKind::Loss)),
            "{sa:?}"
        );
        // Corruption is drawn among the 90% that survive loss.
        assert!(
            (700..1_100).contains(&sa.cells(FaultKind::Corrupt)),
            "{sa:?}"
        );
        for f in &a {
            if let CellFate::Corrupt { bit } = f {
                assert!(*bit < 272 * 8);
            }
        }
        let (c, _) = run(43);
        assert_ne!(a, c, "another seed, other fates");
    }

    #[test]
    fn every_kind_reads_and_writes_its_own_field() {
        let mut f = LinkFaults::default();
        for (i, k) in FaultKind::ALL.iter().enumerate() {
            let v = match k.unit() {
                FaultUnit::Duration => FaultValue::Duration(1_000 + i as u64),
                FaultUnit::Rate => FaultValue::Rate(1_000 + i as u64),
                FaultUnit::Probability => FaultValue::Probability(i as f64 / 100.0),
                FaultUnit::Switch => FaultValue::Switch(true),
            };
            k.set(&mut f, v).unwrap();
            assert_eq!(k.get(&f), v, "{k:?}");
            assert_eq!(FaultKind::from_name(&k.name().to_uppercase()), Some(*k));
        }
        // Each kind wrote a field of its own: none was overwritten by a later one.
        assert!(FaultKind::ALL.iter().all(|k| !k.get(&f).is_clear()));
        let e = FaultKind::Loss
            .set(&mut f, FaultValue::Duration(5))
            .unwrap_err();
        assert!(e.to_string().contains("loss"), "{e}");
        assert_eq!(FaultKind::COUNT, FaultKind::ALL.len());
    }

    #[test]
    fn flip_bit_flips_exactly_one_bit() {
        let mut b = [0u8; 4];
        flip_bit(&mut b, 0);
        flip_bit(&mut b, 31);
        assert_eq!(b, [0x80, 0, 0, 0x01]);
        flip_bit(&mut b, 32);
        assert_eq!(b, [0x80, 0, 0, 0x01]);
    }
}
