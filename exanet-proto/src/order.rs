//! Serving cells in modeled-time order, whatever order the host delivers them in.
//!
//! A switch computes each cell's modeled departure when it forwards it, against the
//! timelines of its outputs and the accounts of its input buffers, so the order in which
//! it forwards decides who waits for whom. Without help that order is the host's: a cell
//! the host happened to deliver first reserves an output first, and an NI that injects a
//! whole RDMA window at once books a link hundreds of microseconds ahead of cells that
//! come a moment later in real time but earlier in modeled time. With ordering on
//! ([`SwitchConfig::modeled_order`](crate::SwitchConfig)), a switch forwards a cell only
//! once no cell that goes before it can still come in:
//!
//! - a cell's **order key** is when it competes for its output: its head once through
//!   the NI's datapath (for the NI's own cells) and once its input's modeled buffer has
//!   room for it (`Switch::admitted`), then the input it came in on; queues are kept in
//!   head order, so the front of each queue is what it offers next;
//! - every input port has a **horizon**: no cell with an earlier key will come in on it
//!   any more. A link port's is set by the driver (below). The NI's is computed here:
//!   what the NI may still inject by itself (`Ni::horizon`: the cells it holds, the
//!   blocks its RDMA engine has still to cut), each traffic class apart, and what it may
//!   answer to what can still reach it (nothing earlier than the earliest cell that can
//!   still come in on a link, plus a traversal);
//! - the front cell of a queue is **safe** when its key comes before every other input's
//!   front key and horizon: the order is total, so the same cells are forwarded in the
//!   same order on every run, whatever the host did.
//!
//! A link port's horizon is a lower bound on timestamps in the manner of conservative
//! parallel simulation, made tight enough to keep things moving: the cells already on the
//! link, and what the upstream forwards to it from now on, which leaves behind everything
//! already booked on that output and starts from the earliest key the upstream holds for
//! that link, may inject, or may still receive. What may still reach a node is a shortest
//! path over the rack from what every node holds (each hop adds at least a traversal and
//! a link's latency, so the search ends). The simulator computes it after every event
//! ([`crate::sim`]). A single rack-wide bound would be simpler and much looser: cells
//! queued behind a busy output, or bound elsewhere, would hold back switches they can
//! never reach, and deadlock them once real buffers fill.
//!
//! Why it does not deadlock: take the earliest key anywhere. Every horizon of its switch
//! is derived from keys no earlier than it plus at least one hop of lookahead, and every
//! other queue there offers a later key, so it is safe; it leaves as soon as its output
//! has credit. With ordering on, queues hold many times their window (the switch holds
//! what real time would otherwise have held upstream), so credit runs out only far past
//! anything the tests or benchmarks do; a queue that is nevertheless full is served
//! anyway, rather than wait on an upstream that waits for its room, and what that puts
//! out of order is counted.
//!
//! What it does not order: a retransmission after a timeout (an NI cannot promise it: the
//! promise would hold the horizons below the departures of the block's own queued cells).
//! It does keep needless ones out: a copy waits until no cell earlier than its modeled
//! time can still reach its NI (`Ni::set_arrival_bound`), so a block whose answer is
//! merely late in real time (waiting for a cut) is not sent again; only one whose answer
//! cannot come before the copy's modeled time is, as the hardware's timer would. Also not
//! ordered: cells held back by injected delay or reordering, a cell behind the front of its queue
//! whose key is earlier than the front's (a short cell that fits a gap on the NI's
//! datapath the front did not). Such a cell goes when its turn comes, its departure placed
//! by the timelines as before, and counts as late ([`Order::late`]) when a later key of
//! another input went first.

use crate::model::{Model, ModelTime};
use crate::routing::{Feeds, FEEDS_ALL, NVCS};
use crate::topology::{Port, NPORTS};

/// The order key of a cell or a horizon: its head, then the input slot it comes in on.
pub(crate) type Key = (ModelTime, usize);

/// The order key of each input slot's front cell, by slot (see `Switch::admitted`).
pub(crate) type Heads<'a> = dyn Fn(usize) -> Option<ModelTime> + 'a;

fn earliest(heads: &Heads, slot: usize) -> ModelTime {
    heads(slot).unwrap_or(ModelTime::NEVER)
}

/// The ordering state of one switch.
#[derive(Debug)]
pub(crate) struct Order {
    /// Per link port: no cell with an earlier head will come in on it (zero until the
    /// driver says: nothing is known yet, so nothing waits on another port's cells).
    horizon: [ModelTime; NPORTS],
    /// What the NI may still inject by itself (its held cells, the blocks it has still to
    /// cut), by the virtual channel it injects on and the output those cells take: each
    /// class has its own queue, and a class must not wait for the other's (a full queue
    /// of one would hold back the cells that would let the other move).
    ni_own: [[ModelTime; NPORTS]; NVCS],
    /// Whether the NI may send anywhere in reaction to what reaches it (an accelerated
    /// collective under way forwards what it combines), not only back to the source.
    relays: bool,
    /// Which inputs can send cells to which outputs: a cell waits only for those that
    /// can send to its own.
    feeds: Feeds,
    /// The latest key forwarded to each output.
    last: [Key; NPORTS],
    late: u64,
}

impl Order {
    pub(crate) fn new() -> Order {
        Order {
            horizon: [ModelTime::ZERO; NPORTS],
            ni_own: [[ModelTime::NEVER; NPORTS]; NVCS],
            relays: true,
            feeds: FEEDS_ALL,
            last: [(ModelTime::ZERO, 0); NPORTS],
            late: 0,
        }
    }

    /// No cell with an earlier head than `t` will come in on `port` any more.
    pub(crate) fn set_horizon(&mut self, port: Port, t: ModelTime) {
        if port != Port::Local {
            self.horizon[port.index()] = t;
        }
    }

    #[cfg(test)]
    pub(crate) fn horizon(&self, port: Port) -> ModelTime {
        self.horizon[port.index()]
    }

    /// What the NI may still inject without anything new reaching it, by VC and output,
    /// and whether it relays.
    pub(crate) fn set_ni_own(&mut self, by_vc: [[ModelTime; NPORTS]; NVCS], relays: bool) {
        self.ni_own = by_vc;
        self.relays = relays;
    }

    pub(crate) fn ni_own(&self) -> ModelTime {
        self.ni_own
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(ModelTime::NEVER)
    }

    /// What the NI may still inject by itself onto `port`.
    pub(crate) fn ni_toward(&self, port: Port) -> ModelTime {
        self.ni_own
            .iter()
            .map(|v| v[port.index()])
            .min()
            .unwrap_or(ModelTime::NEVER)
    }

    pub(crate) fn relays(&self) -> bool {
        self.relays
    }

    /// The earliest of the link horizons and what the NI may inject by itself.
    pub(crate) fn floor(&self) -> ModelTime {
        self.horizon
            .iter()
            .copied()
            .min()
            .unwrap_or(ModelTime::NEVER)
            .min(self.ni_own())
    }

    pub(crate) fn set_feeds(&mut self, feeds: Feeds) {
        self.feeds = feeds;
    }

    pub(crate) fn feeds(&self) -> &Feeds {
        &self.feeds
    }

    /// A cell of `slot` is forwarded to `to` with order key `head`. It is late when a cell
    /// of another input with a later key went to the same output before it (within one
    /// input, keys need not rise: a short cell can find a gap on the NI's datapath that a
    /// long one before it could not, and neither waited for the other).
    pub(crate) fn forwarded(&mut self, slot: usize, head: ModelTime, to: Port) {
        let last = &mut self.last[to.index()];
        if head < last.0 && slot != last.1 {
            self.late += 1;
        }
        if head >= last.0 {
            *last = (head, slot);
        }
    }

    /// Cells forwarded out of modeled order.
    pub(crate) fn late(&self) -> u64 {
        self.late
    }

    /// What may still reach the NI that it would react to on `to`: the earliest cell
    /// waiting at or still to come in on a link input whose cells it replies to by `to`
    /// (or on any input it takes cells from, when it relays), plus a traversal. Never
    /// less than one picosecond of lookahead, so that a switch whose traversal is
    /// configured to zero still cannot wait on itself.
    fn to_ni(&self, to: Port, heads: &Heads, model: &Model) -> ModelTime {
        let bit = 1 << to.index();
        let local = 1 << Port::Local.index();
        let reacts = |p: usize| {
            self.feeds.replies[p] & bit != 0
                || (self.relays
                    && self.feeds.through[p] & local != 0
                    && self.feeds.through[Port::Local.index()] & bit != 0)
        };
        let links = (NVCS..NPORTS * NVCS)
            .filter(|&s| reacts(s / NVCS))
            .map(|s| self.horizon[s / NVCS].min(earliest(heads, s)))
            .min()
            .unwrap_or(ModelTime::NEVER);
        links + model.traversal(Port::Qfdb(1), Port::Local).max(1)
    }

    /// No cell with an earlier key than this can still come to the NI: the earliest cell
    /// waiting at or still to come in on any input that delivers to it (the NI's own
    /// input: what it may send itself). What the NI's gated copies wait for
    /// (`Ni::set_arrival_bound`).
    pub(crate) fn to_ni_arrivals(&self, heads: &Heads) -> ModelTime {
        let local = Port::Local.index();
        // What the NI sends itself, when its cells can come back to it.
        let own = if self.feeds.through[local] & (1 << local) != 0 {
            (0..NVCS)
                .map(|vc| self.ni_own[vc][local].min(earliest(heads, local * NVCS + vc)))
                .min()
                .unwrap_or(ModelTime::NEVER)
        } else {
            ModelTime::NEVER
        };
        self.to_ni_from_links(heads).min(own)
    }

    /// No cell with an earlier key than this can still come in on a link and reach the
    /// NI: [`Order::to_ni_arrivals`] without what the NI sends itself. What the NI's own
    /// cells wait for (`Ni::set_inject_bound`), which must not include themselves.
    pub(crate) fn to_ni_from_links(&self, heads: &Heads) -> ModelTime {
        let local = Port::Local.index();
        (0..NPORTS * NVCS)
            .filter(|&s| s / NVCS != local && self.feeds.through[s / NVCS] & (1 << local) != 0)
            .map(|s| self.horizon[s / NVCS].min(earliest(heads, s)))
            .min()
            .unwrap_or(ModelTime::NEVER)
    }

    /// Whether the head cell of `slot`, with `head`, bound for `to`, may be forwarded
    /// now: the earliest (head, slot) of every other input that can send to `to`,
    /// waiting at the head of its queue or still to come, is after it. Outputs are
    /// independent: what a cell finds on its way is its output's timeline and the
    /// downstream buffer, and cells of one input keep their order.
    ///
    /// `arrived` is the cell's head as it came in on a link, when its key is that head
    /// (it did not wait for buffer room): then no cell still to come on the same link, on
    /// any of its VCs, can share its key. Cells on one link direction take disjoint spans
    /// of the upstream output's timeline, so their heads differ; what is still to come
    /// has a head at or after the link's horizon, and so after this one's when this one's
    /// is at or before it. Without this, a cell whose own arrival had set its link's
    /// horizon (the cut saw it upstream) waited on its link's lower VCs for the next
    /// cut: answers, on the higher VCs, crossed one hop per cut.
    pub(crate) fn is_safe(
        &self,
        slot: usize,
        head: ModelTime,
        arrived: Option<ModelTime>,
        to: Port,
        heads: &Heads,
        model: &Model,
    ) -> bool {
        let key = (head, slot);
        let port = slot / NVCS;
        let own_link = port != Port::Local.index() && arrived == Some(head);
        // The NI's horizon: what it may inject by itself, and what it may answer to what
        // still reaches it.
        let to_ni = self.to_ni(to, heads, model);
        let feeding = |s: usize| self.feeds.through[s / NVCS] & (1 << to.index()) != 0;
        (0..NPORTS * NVCS)
            .filter(|&s| s != slot && feeding(s))
            .all(|s| {
                if own_link && s / NVCS == port {
                    return key < (earliest(heads, s), s) && head <= self.horizon[port];
                }
                let horizon = if s / NVCS == Port::Local.index() {
                    self.ni_own[s % NVCS][to.index()].min(to_ni)
                } else {
                    self.horizon[s / NVCS]
                };
                key < (horizon.min(earliest(heads, s)), s)
            })
    }
}
