//! Modeled time: what the ExaNeSt hardware would have taken, independent of the host.
//!
//! Every cell carries a [`Stamp`]: the modeled times at which its first and last byte
//! reach the input it is travelling to. The stamp rides in the link framing
//! ([`crate::frame`]), never in the cell's own 32 bytes of header and footer, which model
//! the hardware's. Each switch output keeps when it is modeled-busy until; a cell leaves at
//! the latest of its arrival plus the switch's traversal, the output's busy-until and the
//! time the downstream input buffer has room for it ([`Buffer`]), occupies the link for its
//! wire size at the link's rate and arrives after the link's latency. The NI adds its own
//! costs ([`Model::cpu_ni`], the datapath rate, block ACK generation).
//!
//! Modeled time is kept in picoseconds (a 32 B cell at 10 Gb/s is 25.6 ns) as integers, so
//! that a run is exactly reproducible and two hosts compute the same figures.
//!
//! The defaults are the report's figures (§4.2, §4.4, §6.1.1): 16 Gb/s links inside a
//! QFDB, 10 Gb/s between QFDBs, ~120 ns per link, ~145 ns per traversal of a QFDB's
//! network router (the F1 switch when a torus port is involved), 2 cycles at 150 MHz in
//! every other switch, a 128-bit x 150 MHz NI datapath and 4 KB input buffers.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::routing::RouteError;
use crate::shape::{NodeId, Shape};
use crate::topology::Port;

pub use crate::time::{ModelTime, Stamp};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    #[error("[model] {field} = {value}: {why}")]
    Bad {
        field: &'static str,
        value: f64,
        why: &'static str,
    },
}

/// The parameters of the modeled hardware as an operator writes them (`[model]` in
/// rack.toml): rates in Gb/s, times in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelParams {
    /// Links between the FPGAs of one QFDB.
    pub qfdb_link_gbps: f64,
    /// Torus links between QFDBs.
    pub torus_link_gbps: f64,
    /// Latency of a link inside a QFDB (report: ~120 ns).
    pub qfdb_link_ns: f64,
    /// Latency of a torus link (report: ~120 ns for intra- and inter-mezzanine links).
    pub torus_link_ns: f64,
    /// A traversal of a QFDB's network router: the F1's switch when the cell enters or
    /// leaves by a torus port (report: L_ER ~145 ns).
    pub router_ns: f64,
    /// A traversal of an FPGA's own switch otherwise (2 cycles at 150 MHz).
    pub switch_ns: f64,
    /// Control data the routing logic between QFDBs sends along with each cell on a torus
    /// link, "mostly for implementing flow control" (report §6.1.2), in bytes at the
    /// torus rate. It follows the cell, so it holds the link without delaying the cell:
    /// a lone message's latency is unchanged and a stream's rate drops. The report gives
    /// no size; 80 B (five 128-bit datapath words) is fitted on the disparity it
    /// explains, 64.3% of a torus link against 81.9% of a QFDB link for the same
    /// 4 MB `osu_bw` (288 / (288 + 80) = 0.783, the report's ratio 0.785).
    pub torus_control_bytes: u32,
    /// The NI's datapath: 128 bit x 150 MHz.
    pub ni_gbps: f64,
    /// Bytes of input buffer per link input and virtual channel (report: 4 KB).
    pub input_buffer: u32,
    /// A request between a CPU and the NI (PS <-> PL; report: 100-150 ns round trip): what
    /// a packetizer injection, an RDMA descriptor write or the reader seeing a mailbox
    /// entry costs.
    pub cpu_ni_ns: f64,
    /// The NI writing what arrived (a mailbox entry, an RDMA cell) to memory.
    pub mem_write_ns: f64,
    /// Generating a block ACK/NACK once a block's last cell is in.
    pub ack_ns: f64,
    /// The NI's retransmission timer, in modeled time.
    pub retransmit_ns: f64,
    /// Software cost of each library call that sends or receives (an MPI library's
    /// processing; 0 for user-level figures). The client library adds it to its clock.
    pub software_ns: f64,
    /// Programming the allreduce accelerator for one operation (each module's operation,
    /// type, size and two pointers) and its completion notice: what separates the
    /// accelerator's mechanism from the report's figures, calibrated on its 16-rank
    /// 256-byte row (6.79 us) and then predicting the 128-rank, 512 B and 1024 B rows.
    pub accel_setup_ns: f64,
    /// How much of the time a program spends outside library calls counts as modeled
    /// compute (1.0: as measured on the host; 0: pure network benchmarks).
    pub compute_scale: f64,
}

impl Default for ModelParams {
    fn default() -> Self {
        ModelParams {
            qfdb_link_gbps: 16.0,
            torus_link_gbps: 10.0,
            qfdb_link_ns: 120.0,
            torus_link_ns: 120.0,
            router_ns: 145.0,
            switch_ns: 2.0 / 0.15,
            torus_control_bytes: 80,
            ni_gbps: 19.2,
            input_buffer: 4096,
            cpu_ni_ns: 125.0,
            mem_write_ns: 50.0,
            ack_ns: 2.0 / 0.15,
            retransmit_ns: 100_000.0,
            software_ns: 0.0,
            accel_setup_ns: 3000.0,
            compute_scale: 1.0,
        }
    }
}

impl ModelParams {
    /// The parameters in the integer form the core computes with, or what is wrong.
    pub fn model(&self) -> Result<Model, ModelError> {
        let rate = |field, v: f64| {
            if v.is_finite() && (0.001..=100_000.0).contains(&v) {
                Ok(Rate::from_gbps(v))
            } else {
                Err(ModelError::Bad {
                    field,
                    value: v,
                    why: "a rate must be between 0.001 and 100000 Gb/s",
                })
            }
        };
        let time = |field, v: f64| {
            if v.is_finite() && (0.0..=1e9).contains(&v) {
                Ok((v * 1000.0).round() as u64)
            } else {
                Err(ModelError::Bad {
                    field,
                    value: v,
                    why: "a time must be between 0 and 1e9 ns",
                })
            }
        };
        if self.input_buffer < crate::cell::MAX_CELL as u32 {
            return Err(ModelError::Bad {
                field: "input_buffer",
                value: f64::from(self.input_buffer),
                why: "an input buffer must hold one 288-byte cell",
            });
        }
        if self.torus_control_bytes > 4096 {
            return Err(ModelError::Bad {
                field: "torus_control_bytes",
                value: f64::from(self.torus_control_bytes),
                why: "control data per cell must be at most 4096 bytes",
            });
        }
        if !(self.compute_scale.is_finite() && (0.0..=1e6).contains(&self.compute_scale)) {
            return Err(ModelError::Bad {
                field: "compute_scale",
                value: self.compute_scale,
                why: "a scale must be between 0 and 1e6",
            });
        }
        Ok(Model {
            qfdb_rate: rate("qfdb_link_gbps", self.qfdb_link_gbps)?,
            torus_rate: rate("torus_link_gbps", self.torus_link_gbps)?,
            ni_rate: rate("ni_gbps", self.ni_gbps)?,
            qfdb_link: time("qfdb_link_ns", self.qfdb_link_ns)?,
            torus_link: time("torus_link_ns", self.torus_link_ns)?,
            router: time("router_ns", self.router_ns)?,
            switch: time("switch_ns", self.switch_ns)?,
            torus_control: self.torus_control_bytes,
            input_buffer: self.input_buffer,
            cpu_ni: time("cpu_ni_ns", self.cpu_ni_ns)?,
            mem_write: time("mem_write_ns", self.mem_write_ns)?,
            ack: time("ack_ns", self.ack_ns)?,
            retransmit: time("retransmit_ns", self.retransmit_ns)?.max(1),
            software: time("software_ns", self.software_ns)?,
            accel_setup: time("accel_setup_ns", self.accel_setup_ns)?,
            compute_scale_ppm: (self.compute_scale * 1e6).round() as u64,
        })
    }
}

/// A rate as picoseconds per byte, scaled by 2^16 so that 19.2 Gb/s (416.67 ps/B) keeps
/// its fraction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate(u64);

impl Rate {
    const SCALE: u64 = 1 << 16;

    pub fn from_gbps(gbps: f64) -> Rate {
        Rate((8000.0 / gbps * Self::SCALE as f64).round() as u64)
    }

    /// Picoseconds `bytes` occupy at this rate.
    pub fn ps(self, bytes: usize) -> u64 {
        ((u128::from(self.0) * bytes as u128) / u128::from(Self::SCALE)) as u64
    }

    pub fn gbps(self) -> f64 {
        8000.0 * Self::SCALE as f64 / self.0 as f64
    }
}

/// The modeled hardware in the units the core computes with (picoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    pub qfdb_rate: Rate,
    pub torus_rate: Rate,
    pub ni_rate: Rate,
    pub qfdb_link: u64,
    pub torus_link: u64,
    pub router: u64,
    pub switch: u64,
    /// [`ModelParams::torus_control_bytes`].
    pub torus_control: u32,
    pub input_buffer: u32,
    pub cpu_ni: u64,
    pub mem_write: u64,
    pub ack: u64,
    pub retransmit: u64,
    pub software: u64,
    pub accel_setup: u64,
    /// [`ModelParams::compute_scale`] in millionths.
    pub compute_scale_ppm: u64,
}

impl Default for Model {
    fn default() -> Self {
        ModelParams::default()
            .model()
            .expect("the default parameters are valid")
    }
}

impl Model {
    /// The rate of what `port` carries: its link, or the NI's datapath for the local port.
    pub fn rate(&self, port: Port) -> Rate {
        match port {
            Port::Local => self.ni_rate,
            Port::Qfdb(_) => self.qfdb_rate,
            Port::Torus(..) => self.torus_rate,
        }
    }

    /// How long the link on `port` stays busy after a cell's last byte, with what travels
    /// with the cell but is not part of it (the torus routing logic's control data).
    pub fn trailer_ps(&self, port: Port) -> u64 {
        match port {
            Port::Torus(..) => self.torus_rate.ps(self.torus_control as usize),
            Port::Local | Port::Qfdb(_) => 0,
        }
    }

    /// The latency of the link on `port` (none between the switch and its NI).
    pub fn latency(&self, port: Port) -> u64 {
        match port {
            Port::Local => 0,
            Port::Qfdb(_) => self.qfdb_link,
            Port::Torus(..) => self.torus_link,
        }
    }

    /// A traversal of the switch from `from` to `to`: the router's when either is a torus
    /// port (only F1s have them), the FPGA switch's otherwise.
    pub fn traversal(&self, from: Port, to: Port) -> u64 {
        if matches!(from, Port::Torus(..)) || matches!(to, Port::Torus(..)) {
            self.router
        } else {
            self.switch
        }
    }

    /// The modeled one-way latency, with no queueing, of a cell of `bytes` from `src`'s
    /// NI to `dst`'s along the dimension-order path: from the NI handing its first byte
    /// to the switch to the last byte reaching the destination NI. What `exactl ping`
    /// shows beside the measured round trip.
    pub fn path_latency(
        &self,
        shape: &Shape,
        src: NodeId,
        dst: NodeId,
        bytes: usize,
    ) -> Result<u64, RouteError> {
        let path = crate::routing::path(shape, src, dst)?;
        let (mut head, mut tail) = (0u64, self.ni_rate.ps(bytes));
        let mut from = Port::Local;
        for (here, hop) in path {
            let to = hop.port;
            let t = self.traversal(from, to);
            let start = head + t;
            let end = (start + self.rate(to).ps(bytes)).max(tail + t);
            head = start + self.latency(to);
            tail = end + self.latency(to);
            if let Some((_, arrive)) = crate::topology::neighbour(shape, here, to) {
                from = arrive;
            }
        }
        Ok(tail)
    }

    /// Scales `host_ns` of compute measured on the host into modeled picoseconds.
    pub fn compute_ps(&self, host_ns: u64) -> u64 {
        ((u128::from(host_ns) * 1000 * u128::from(self.compute_scale_ppm)) / 1_000_000) as u64
    }
}

/// When a resource (one direction of a link, the NI's datapath) is modeled-busy: merged
/// busy intervals. A cell takes the earliest gap long enough for it at or after its ready
/// time, not the end of the latest reservation: workloads' clocks differ (one computed
/// for a modeled second, another did not), so cells reach a resource out of modeled
/// order, and one far ahead must not push back those that would have gone first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// (start, end), picoseconds, in order, disjoint and not touching. A deque rather than
    /// a search tree: reservations come nearly in order, so the work is at the back and a
    /// binary search over contiguous memory; a B-tree's three lookups, insert and eviction
    /// per cell were a quarter of a receiving daemon's time under rdma-bw.
    busy: VecDeque<(u64, u64)>,
}

impl Timeline {
    /// Intervals kept; the oldest are forgotten beyond this (a stream is one interval,
    /// so only many interleaved clocks get near it).
    const LIMIT: usize = 4096;

    /// Reserves `dur` picoseconds starting at or after `ready`; returns the start.
    pub fn reserve(&mut self, ready: ModelTime, dur: u64) -> ModelTime {
        let Gap {
            start: t,
            at: j,
            touching_next,
        } = self.gap(ready, dur);
        if dur == 0 {
            return ModelTime(t);
        }
        // The new interval joins the one it touches in place.
        let mut end = t.saturating_add(dur);
        if touching_next {
            end = self.busy.remove(j).expect("the walk stopped at it").1;
        }
        match j.checked_sub(1).map(|i| &mut self.busy[i]) {
            // The interval the walk ended at (or one reaching `t`): it grows.
            Some((_, e)) if *e >= t => *e = end.max(*e),
            _ => {
                self.busy.insert(j, (t, end));
                // Forget the oldest beyond the limit, but never the interval just made: a
                // reservation earlier than all those remembered was forgotten at once, so a
                // stream of them (a program whose clock starts behind a busy past) crossed
                // the resource as if it took no time.
                if self.busy.len() > Self::LIMIT {
                    self.busy.remove(usize::from(j == 0));
                }
            }
        }
        ModelTime(t)
    }

    /// Where [`reserve`](Self::reserve) would start `dur` picoseconds ready at `ready`,
    /// without reserving them: a lower bound on the start of anything of at least `dur`
    /// reserved from `ready` on, now or later (reservations only fill gaps).
    pub fn first_gap(&self, ready: ModelTime, dur: u64) -> ModelTime {
        ModelTime(self.gap(ready, dur).start)
    }

    /// The first gap of `dur` from `ready` on: one walk over the intervals from `ready`
    /// (a link in saturation walks past the cells queued ahead).
    fn gap(&self, ready: ModelTime, dur: u64) -> Gap {
        let mut t = ready.0;
        // The first interval starting after `ready`; the one before it may cover `ready`.
        // Mostly none: a stream reserves at or after the start of the latest interval.
        let mut j = match self.busy.back() {
            Some(&(s, _)) if s <= t => self.busy.len(),
            _ => self.busy.partition_point(|&(s, _)| s <= t),
        };
        if j > 0 {
            t = t.max(self.busy[j - 1].1);
        }
        let mut touching_next = false;
        while let Some(&(s, e)) = self.busy.get(j) {
            if s >= t.saturating_add(dur) {
                touching_next = s == t.saturating_add(dur);
                break;
            }
            t = t.max(e);
            j += 1;
        }
        Gap {
            start: t,
            at: j,
            touching_next,
        }
    }

    /// What of this timeline matters to reservations ready at `from` or later: the
    /// intervals that end after it, at most `limit` of them. A timeline cut short is a
    /// lower bound of the whole: [`first_gap`](Self::first_gap) on it finds a gap no later.
    pub fn since(&self, from: ModelTime, limit: usize) -> Timeline {
        let first = self.busy.partition_point(|&(_, e)| e <= from.0);
        Timeline {
            busy: self.busy.range(first..).take(limit).copied().collect(),
        }
    }

    /// The end of the latest reservation.
    pub fn busy_until(&self) -> ModelTime {
        ModelTime(self.busy.back().map_or(0, |&(_, e)| e))
    }
}

/// Where [`Timeline::gap`] found room: its start, the index of the first interval after
/// it, and whether that interval begins exactly where the room ends.
struct Gap {
    start: u64,
    at: usize,
    touching_next: bool,
}

/// The modeled occupancy of one input buffer (a link input and virtual channel): when a
/// cell of `bytes` arriving at a modeled time finds room in it. Each cell counts from when
/// it entered to when it left, in modeled time, so that cells handled out of modeled order
/// (workloads' clocks differ; the emulator handles cells in real-time order) are counted
/// where they were in modeled time, not where they were handled.
///
/// The receiving switch keeps one per input and knows every departure by the time it
/// looks (the cells ahead have left). The sending switch keeps one per output to push back
/// in modeled time before it sends: there a departure is known once the credit that
/// carries it has come back, and until then it is estimated as the cell's arrival (it
/// passes straight through), so the receiver's own account corrects what the sender could
/// not know.
#[derive(Clone, Debug, Default)]
pub struct Buffer {
    /// The latest cells, in the order they were handled.
    cells: VecDeque<Held>,
    bytes: u64,
    /// The latest departure among them.
    last_leave: ModelTime,
    /// Neighbouring cells (in handled order) whose entries or departures are out of
    /// modeled order. None in a stream from one clock, the common case, where the cells
    /// themselves are the sorted lists `room_at` sweeps.
    disorder: usize,
}

#[derive(Clone, Copy, Debug)]
struct Held {
    enter: ModelTime,
    leave: ModelTime,
    bytes: u32,
    known: bool,
}

impl Held {
    /// `b`, handled after `a`, also entered and leaves no earlier.
    fn in_order(a: &Held, b: &Held) -> bool {
        a.enter <= b.enter && a.leave <= b.leave
    }
}

impl Buffer {
    /// Cells remembered: enough to fill a 4 KB buffer with full cells (14) twice over,
    /// and few enough that looking at each of them for every cell stays cheap; a buffer
    /// of smaller cells is accounted from its latest 32.
    const KEEP: usize = 32;

    /// A cell of `bytes` was in the buffer from `enter` to `leave` (with `known ==
    /// false`: is estimated to leave then).
    pub fn record(&mut self, enter: ModelTime, leave: ModelTime, bytes: u32, known: bool) {
        let cell = Held {
            enter,
            leave,
            bytes,
            known,
        };
        if let Some(back) = self.cells.back() {
            self.disorder += usize::from(!Held::in_order(back, &cell));
        }
        self.cells.push_back(cell);
        self.bytes += u64::from(bytes);
        self.last_leave = self.last_leave.max(leave);
        if self.cells.len() > Self::KEEP {
            let old = self.cells.pop_front().expect("non-empty");
            self.bytes -= u64::from(old.bytes);
            let front = self.cells.front().expect("more than KEEP were held");
            self.disorder -= usize::from(!Held::in_order(&old, front));
        }
    }

    /// Counts the neighbours out of modeled order afresh (after departures changed).
    fn count_disorder(&mut self) {
        self.disorder = self
            .cells
            .iter()
            .zip(self.cells.iter().skip(1))
            .filter(|(a, b)| !Held::in_order(a, b))
            .count();
    }

    /// Credit for `bytes` came back saying the space was freed at `t`: the oldest
    /// estimated departures become known ones.
    ///
    /// A credit returns the space of several cells at once with the latest of their
    /// departures, which in modeled time need not be the oldest cell's (cells are handled
    /// out of modeled order), so only the last cell it covers takes that time; the others
    /// keep their estimates, bounded by it.
    pub fn learn(&mut self, mut bytes: u32, t: ModelTime) {
        let mut last = None;
        for (i, e) in self.cells.iter_mut().enumerate().filter(|(_, e)| !e.known) {
            if bytes == 0 {
                break;
            }
            e.known = true;
            e.leave = e.leave.min(t);
            bytes = bytes.saturating_sub(e.bytes);
            last = Some(i);
        }
        if let Some(i) = last {
            let e = &mut self.cells[i];
            e.leave = e.leave.max(t);
            self.last_leave = self.last_leave.max(e.leave);
            self.count_disorder();
        }
    }

    /// Bytes in the buffer at `t`.
    fn held_at(&self, t: ModelTime) -> u64 {
        self.cells
            .iter()
            .filter(|c| c.enter <= t && t < c.leave)
            .map(|c| u64::from(c.bytes))
            .sum()
    }

    /// `None` when a cell of `bytes` arriving at `at` finds room in a buffer of `cap`
    /// bytes; else the earliest departure after which it does.
    ///
    /// A full buffer (every cell of a saturating stream) takes the slow path, so it is one
    /// sweep over the cells' entries and departures in modeled order, on the stack, not a
    /// count of the whole buffer at each departure after a heap allocation (that was a
    /// fifth of a sending daemon's time under rdma-bw).
    pub fn room_at(&self, bytes: u32, cap: u32, at: ModelTime) -> Option<ModelTime> {
        let room = u64::from(cap.saturating_sub(bytes));
        // The common cases, without looking at each cell: everything left by then, or
        // everything together fits anyway.
        if at >= self.last_leave || self.bytes <= room {
            return None;
        }
        let mut held = self.held_at(at);
        if held <= room {
            return None;
        }
        // From `at` on, held bytes change only by what enters and leaves after it (a cell
        // is held from its entry, inclusive, to its departure, exclusive; one that leaves
        // before it enters is never held, but its departure is still a moment to look
        // at). Departures after `at` are the candidates, earliest first.
        if self.disorder == 0 {
            // The cells are in modeled order already: sweep them as they are.
            let c = &self.cells;
            let mut ie = c.partition_point(|c| c.enter <= at);
            let mut il = c.partition_point(|c| c.leave <= at);
            while il < c.len() {
                let t = c[il].leave;
                // Entries up to the same time first, so the count never goes below zero.
                while ie < c.len() && c[ie].enter <= t {
                    if c[ie].enter < c[ie].leave {
                        held += u64::from(c[ie].bytes);
                    }
                    ie += 1;
                }
                while il < c.len() && c[il].leave == t {
                    if c[il].enter < c[il].leave {
                        held -= u64::from(c[il].bytes);
                    }
                    il += 1;
                }
                if held <= room {
                    return Some(t);
                }
            }
            return Some(self.last_leave);
        }
        // Otherwise only events after `at` are sorted (in a saturating stream, the dozen
        // cells ahead), and cells come in handled order, so each list is nearly in order.
        let mut enters = [(0u64, 0u32); Self::KEEP];
        let mut leaves = [(0u64, 0u32); Self::KEEP];
        let (mut ne, mut nl) = (0, 0);
        for c in &self.cells {
            let held_ever = c.enter < c.leave;
            if held_ever && c.enter > at {
                enters[ne] = (c.enter.0, c.bytes);
                ne += 1;
            }
            if c.leave > at {
                leaves[nl] = (c.leave.0, if held_ever { c.bytes } else { 0 });
                nl += 1;
            }
        }
        let (enters, leaves) = (&mut enters[..ne], &mut leaves[..nl]);
        sort_nearly_sorted(enters);
        sort_nearly_sorted(leaves);
        let (mut ie, mut il) = (0, 0);
        while il < leaves.len() {
            let t = leaves[il].0;
            // Entries up to the same time first, so the count never goes below zero.
            while ie < enters.len() && enters[ie].0 <= t {
                held += u64::from(enters[ie].1);
                ie += 1;
            }
            while il < leaves.len() && leaves[il].0 == t {
                held -= u64::from(leaves[il].1);
                il += 1;
            }
            if held <= room {
                return Some(ModelTime(t));
            }
        }
        Some(self.last_leave)
    }
}

/// Sorts by time a slice that is nearly in order already, in about one pass: an insertion
/// sort, which on 32 nearly-sorted entries does a few dozen comparisons where the
/// standard library's general small sort (built for any order) was a tenth of a sending
/// daemon's time under rdma-bw. Equal times keep their order.
fn sort_nearly_sorted(v: &mut [(u64, u32)]) {
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && v[j - 1].0 > x.0 {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_give_the_report_figures() {
        let m = Model::default();
        // 256 B payload + 32 B overhead = 288 B.
        assert_eq!(m.qfdb_rate.ps(288), 144_000);
        assert_eq!(m.torus_rate.ps(288), 230_400);
        // 19.2 Gb/s: 416.67 ps per byte.
        assert_eq!(m.ni_rate.ps(288), 120_000);
        assert_eq!(m.switch, 13_333);
        assert!((m.ni_rate.gbps() - 19.2).abs() < 1e-3);
    }

    #[test]
    fn a_full_buffer_admits_a_cell_when_the_cells_ahead_have_left() {
        let cap = 4096;
        let ns = ModelTime::from_ns;
        let mut b = Buffer::default();
        assert_eq!(b.room_at(288, cap, ns(0)), None);
        // 14 full cells (4032 B) all in from 0 ns, leaving at 1, 2, ..., 14 ns.
        for i in 1..=14u64 {
            b.record(ns(0), ns(i), 288, true);
        }
        // A 288 B cell at 0 ns needs 224 B freed: the first departure.
        assert_eq!(b.room_at(288, cap, ns(0)), Some(ns(1)));
        // A 64 B cell fits beside all 14 (4032 + 64 <= 4096).
        assert_eq!(b.room_at(64, cap, ns(0)), None);
        // At 5 ns, four have left.
        assert_eq!(b.room_at(288, cap, ns(5)), None);
        b.record(ns(0), ns(15), 288, true);
        assert_eq!(b.room_at(288, cap, ns(0)), Some(ns(2)));
    }

    /// Cells handled out of modeled order are counted where they were in modeled time:
    /// one far in the future does not fill the buffer for a cell arriving now.
    #[test]
    fn a_cell_far_ahead_in_modeled_time_does_not_block_one_arriving_now() {
        let cap = 1000;
        let ns = ModelTime::from_ns;
        let mut b = Buffer::default();
        for i in 0..3u64 {
            b.record(ns(1_000_000 + i), ns(1_000_010 + i), 288, true);
        }
        assert_eq!(b.room_at(288, cap, ns(10)), None);
        assert_eq!(b.room_at(288, cap, ns(1_000_005)), Some(ns(1_000_010)));
    }

    #[test]
    fn a_timeline_fills_gaps_before_the_latest_reservation() {
        let mut t = Timeline::default();
        let ns = ModelTime::from_ns;
        assert_eq!(t.reserve(ns(1000), 100_000), ns(1000));
        // Far behind the first: it goes in the idle time before it.
        assert_eq!(t.reserve(ns(0), 100_000), ns(0));
        // Overlapping the first: after it.
        assert_eq!(t.reserve(ns(1050), 100_000), ns(1100));
        // A gap too short (100..1000 is free but 950 ns long is needed from 100).
        assert_eq!(t.reserve(ns(50), 950_000), ns(1200));
        assert_eq!(t.reserve(ns(100), 900_000), ns(100));
        // 0..1200 and 1200..2150 are now one busy stretch.
        assert_eq!(t.busy.len(), 1);
        assert_eq!(t.busy_until(), ns(2150));
        assert_eq!(t.reserve(ModelTime(u64::MAX), 5), ModelTime(u64::MAX));
    }

    /// The sweep gives what counting the buffer at every departure gives (the way it was
    /// first written), on buffers of random cells, in and out of modeled order.
    #[test]
    fn room_at_agrees_with_counting_at_every_departure() {
        fn counted(b: &Buffer, bytes: u32, cap: u32, at: ModelTime) -> Option<ModelTime> {
            let room = u64::from(cap.saturating_sub(bytes));
            if at >= b.last_leave || b.bytes <= room || b.held_at(at) <= room {
                return None;
            }
            let mut leaves: Vec<ModelTime> = b
                .cells
                .iter()
                .map(|c| c.leave)
                .filter(|&l| l > at)
                .collect();
            leaves.sort_unstable();
            leaves.dedup();
            leaves
                .into_iter()
                .find(|&l| b.held_at(l) <= room)
                .or(Some(b.last_leave))
        }
        let mut rng = crate::rng::SplitMix64::new(7);
        let (mut slow_paths, mut ordered_slow_paths) = (0, 0);
        for _ in 0..2000 {
            let mut b = Buffer::default();
            let cells = rng.below(48) as usize;
            // Half the buffers hold one stream, entries and departures in modeled order.
            let stream = rng.below(2) == 0;
            let (mut enter, mut leave) = (0, 0);
            for _ in 0..cells {
                if stream {
                    enter += rng.below(60);
                    leave = (leave + rng.below(80)).max(enter + rng.below(2));
                } else {
                    enter = rng.below(2000);
                    // Now and then a departure before the entry (never held).
                    leave = if rng.below(20) == 0 {
                        enter.saturating_sub(rng.below(50))
                    } else {
                        enter + rng.below(400)
                    };
                }
                let bytes = 32 + rng.below(257) as u32;
                b.record(ModelTime(enter), ModelTime(leave), bytes, rng.below(2) == 0);
            }
            if rng.below(4) == 0 {
                b.learn(rng.below(1000) as u32, ModelTime(rng.below(2500)));
            }
            // The running count of cells out of order is what counting afresh gives.
            let kept = b.disorder;
            b.count_disorder();
            assert_eq!(kept, b.disorder);
            for _ in 0..20 {
                let at = ModelTime(rng.below(2500));
                let bytes = 32 + rng.below(257) as u32;
                let cap = 256 + rng.below(4096) as u32;
                let want = counted(&b, bytes, cap, at);
                slow_paths += usize::from(want.is_some());
                ordered_slow_paths += usize::from(want.is_some() && b.disorder == 0);
                assert_eq!(
                    b.room_at(bytes, cap, at),
                    want,
                    "{b:?} {bytes} {cap} {at:?}"
                );
            }
        }
        assert!(
            slow_paths > 1000 && ordered_slow_paths > 500,
            "only {slow_paths} cases found the buffer full, {ordered_slow_paths} in order"
        );
    }

    /// The one-walk reservation gives what the first one did (a fresh map lookup per
    /// interval passed, remove and insert per cell), on random reservations.
    #[test]
    fn reserve_agrees_with_the_lookup_per_interval_version() {
        fn reserve_then(
            busy: &mut std::collections::BTreeMap<u64, u64>,
            ready: u64,
            dur: u64,
        ) -> u64 {
            let mut t = ready;
            if let Some((_, &e)) = busy.range(..=t).next_back() {
                t = t.max(e);
            }
            while let Some((&s, &e)) = busy.range(t..).next() {
                if s >= t.saturating_add(dur) {
                    break;
                }
                t = e;
            }
            if dur == 0 {
                return t;
            }
            let (mut start, mut end) = (t, t.saturating_add(dur));
            if let Some((&s, &e)) = busy.range(..=t).next_back() {
                if e >= t {
                    start = s;
                    end = end.max(e);
                    busy.remove(&s);
                }
            }
            if let Some(e) = busy.remove(&end) {
                end = e;
            }
            busy.insert(start, end);
            t
        }
        let mut rng = crate::rng::SplitMix64::new(11);
        for _ in 0..300 {
            let mut new = Timeline::default();
            let mut old = std::collections::BTreeMap::new();
            for _ in 0..200 {
                let ready = rng.below(20_000);
                let dur = [0, 1, 10, 100, 1000][rng.below(5) as usize] + rng.below(3);
                let got = new.reserve(ModelTime(ready), dur);
                assert_eq!(got, ModelTime(reserve_then(&mut old, ready, dur)));
                let kept: std::collections::BTreeMap<u64, u64> = new.busy.iter().copied().collect();
                assert_eq!(kept, old, "after {ready} + {dur}");
            }
        }
    }

    #[test]
    fn a_timeline_forgets_its_oldest_intervals_beyond_its_limit() {
        let mut t = Timeline::default();
        let n = Timeline::LIMIT as u64 + 100;
        // Disjoint reservations, each its own interval.
        for i in 0..n {
            assert_eq!(t.reserve(ModelTime(i * 10), 5), ModelTime(i * 10));
        }
        assert_eq!(t.busy.len(), Timeline::LIMIT);
        assert_eq!(t.busy.front(), Some(&(1000, 1005)));
        // A forgotten interval's time is free again; the new one is kept (the oldest of
        // the others makes room for it), and so is one still remembered.
        assert_eq!(t.reserve(ModelTime(0), 5), ModelTime(0));
        assert_eq!(t.reserve(ModelTime(0), 5), ModelTime(5));
        assert_eq!(t.reserve(ModelTime(1010), 5), ModelTime(1015));
        assert_eq!(t.busy_until(), ModelTime((n - 1) * 10 + 5));
    }

    /// A timeline full of a past program's reservations still serialises a stream whose
    /// clock starts before all of them (it was forgotten cell by cell, and took no time).
    #[test]
    fn a_stream_before_everything_remembered_is_still_serialised() {
        let mut t = Timeline::default();
        for i in 0..Timeline::LIMIT as u64 {
            t.reserve(ModelTime(1_000_000 + i * 10), 5);
        }
        assert_eq!(t.busy.len(), Timeline::LIMIT);
        let starts: Vec<u64> = (0..100).map(|_| t.reserve(ModelTime(0), 7).0).collect();
        assert_eq!(starts, (0..100).map(|i| i * 7).collect::<Vec<_>>());
        assert_eq!(t.busy.front(), Some(&(0, 700)));
        assert_eq!(t.busy.len(), Timeline::LIMIT);
        // What was forgotten to make room is the oldest of the past program's.
        assert_eq!(t.busy.get(1), Some(&(1_000_010, 1_000_015)));
    }

    /// `first_gap` is where `reserve` would start, and no later reservation of at least
    /// as long from as late a time can start before it (what modeled order's horizons
    /// rest on).
    #[test]
    fn the_first_gap_is_where_a_reservation_would_start() {
        let mut rng = crate::rng::SplitMix64::new(3);
        let mut t = Timeline::default();
        for _ in 0..2000 {
            let ready = ModelTime(rng.below(100_000));
            let dur = 1 + rng.below(300);
            let gap = t.first_gap(ready, dur);
            let shorter = t.first_gap(ready, dur / 2 + 1);
            assert!(shorter <= gap, "a shorter one fits no later");
            assert_eq!(t.reserve(ready, dur), gap);
            assert!(
                t.first_gap(ready, dur) >= gap,
                "reservations only fill gaps"
            );
        }
    }

    #[test]
    fn credits_turn_estimates_into_known_departures() {
        let cap = 1000;
        let ns = ModelTime::from_ns;
        let mut b = Buffer::default();
        for i in 1..=4u64 {
            b.record(ns(0), ns(i), 288, false);
        }
        assert_eq!(b.room_at(288, cap, ns(0)), Some(ns(2)));
        // The downstream returned the first two cells' space, the latest of them leaving
        // at 50 ns: the second is taken to leave then, the first keeps its estimate.
        b.learn(576, ns(50));
        assert_eq!(b.room_at(288, cap, ns(0)), Some(ns(3)));
        assert_eq!(b.room_at(288 * 2, cap, ns(0)), Some(ns(4)));
        assert_eq!(b.room_at(900, cap, ns(0)), Some(ns(50)));
    }

    /// The report's latency model (§6.1.1): a link costs ~120 ns and a QFDB router ~145 ns
    /// per traversal, so one torus hop between F1s adds ~409 ns to the intra-FPGA path.
    #[test]
    fn path_latency_follows_links_and_routers() {
        let m = Model::default();
        let shape: Shape = "2x1x1".parse().unwrap();
        let n = |s: &str| shape.parse_node(s).unwrap();
        let lat = |a, b| m.path_latency(&shape, n(a), n(b), 32).unwrap();
        let local = lat("M1QAF1", "M1QAF1");
        let intra = lat("M1QAF1", "M1QAF2");
        let torus = lat("M1QAF1", "M1QBF1");
        // The intra-FPGA path is one switch (13.3 ns) and the NI's serialisation of 32 B
        // (13.3 ns). Cut-through: a path's serialisation is its slowest element's, once:
        // 16 ns at 16 Gb/s, 25.6 ns at 10 Gb/s.
        let (sw, ni_ser) = (13_333, 13_333);
        assert_eq!(intra - local, 2 * sw + 120_000 + 16_000 - (sw + ni_ser));
        assert_eq!(
            torus - local,
            2 * 145_000 + 120_000 + 25_600 - (sw + ni_ser)
        );
        // F2 -> F1 -> F1 -> F3: three links, two routers, two FPGA switches.
        let far = lat("M1QAF2", "M1QBF3");
        assert_eq!(
            far - local,
            2 * sw + 2 * 145_000 + 3 * 120_000 + 25_600 - (sw + ni_ser)
        );
    }

    #[test]
    fn bad_parameters_are_named() {
        let p = ModelParams {
            torus_link_gbps: 0.0,
            ..ModelParams::default()
        };
        let e = p.model().unwrap_err().to_string();
        assert!(e.contains("torus_link_gbps"), "{e}");
        let p = ModelParams {
            input_buffer: 100,
            ..ModelParams::default()
        };
        assert!(p.model().unwrap_err().to_string().contains("input_buffer"));
    }
}
