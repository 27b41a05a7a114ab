//! One emulated node: its switch plus the node-local services that sit behind the
//! switch's local port. For now those are the fabric diagnostics (probe responder, a
//! synthetic load generator and sink); the NI protocols (packetizer, mailbox, RDMA) attach
//! here too.
//!
//! Driving it: feed link events in (`receive`, `credit`, `link_up`, `peer_grant`,
//! `link_down`), then drain `poll_transmit`, `poll_credit` and `poll_event` until each
//! returns `None`. Nothing here reads a clock or does I/O.

use std::collections::{BTreeMap, VecDeque};

use bytes::{Bytes, BytesMut};
use thiserror::Error;

use crate::cell::{Cell, CellType, MAX_PAYLOAD};
use crate::gvas::{Gvas, Pdid};
use crate::model::ModelTime;
use crate::ni::{Memory, Ni, NiConfig, NiEvent, VecMemory};
use crate::probe::ProbeBody;
use crate::routing::{Vc, NVCS};
use crate::shape::{NameError, NodeId, Shape};
use crate::switch::{Switch, SwitchConfig, SwitchError, Transmit};
use crate::time::Instant;
use crate::topology::Port;

/// Most node-originated cells (probes, probe replies) waiting for injection room; beyond
/// this new probes are refused rather than queued without bound.
pub const OUTBOX_LIMIT: usize = 4096;
/// Load payloads start with the sender's sequence number, so they are at least this long.
pub const LOAD_MIN_PAYLOAD: usize = 8;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NodeError {
    #[error(transparent)]
    Switch(#[from] SwitchError),
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("a load needs at least one destination")]
    NoDestination,
    #[error("{OUTBOX_LIMIT} probes are already waiting to be sent")]
    OutboxFull,
    #[error("load payload of {0} B is outside {LOAD_MIN_PAYLOAD}..={MAX_PAYLOAD}")]
    LoadPayload(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    /// A probe this node sent came back.
    ProbeReply {
        id: u32,
        /// Nodes from this node to the destination, both included.
        forward: Vec<NodeId>,
        /// Nodes from the destination back to this node, both included.
        back: Vec<NodeId>,
        truncated: bool,
    },
    /// A load cell arrived (only with [`Node::set_trace_load`]).
    LoadDelivered { src: NodeId, seq: u64 },
    /// The load generator has injected its last cell.
    LoadSent,
    /// Something the network interface reports (completions, mailbox arrivals, ...).
    Ni(NiEvent),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub injected_cells: u64,
    pub delivered_cells: u64,
    pub delivered_bytes: u64,
    pub load_rx_cells: u64,
    pub load_rx_bytes: u64,
    pub load_tx_cells: u64,
    pub probes_answered: u64,
    /// Errors by kind (see the `kind()` of each error type).
    pub errors: BTreeMap<&'static str, u64>,
}

struct LoadGen {
    /// Destinations, served round-robin: cell `seq` goes to `dsts[seq % len]`.
    dsts: Vec<Gvas>,
    remaining: u64,
    payload_len: usize,
    seq: u64,
    arena: BytesMut,
}

/// Bytes of load payload allocated at once.
const LOAD_ARENA: usize = 64 * 1024;

pub struct Node {
    switch: Switch,
    ni: Ni,
    mem: Box<dyn Memory + Send>,
    /// The time of the latest call that passed one, for work done on the way.
    now: Instant,
    outbox: VecDeque<Cell>,
    load: Option<LoadGen>,
    sink_paused: bool,
    sink_backlog: VecDeque<Cell>,
    trace_load: bool,
    events: VecDeque<NodeEvent>,
    stats: NodeStats,
}

impl Node {
    pub fn new(shape: Shape, id: NodeId, cfg: SwitchConfig) -> Result<Node, NodeError> {
        Ok(Node {
            switch: Switch::new(shape, id, cfg)?,
            ni: Ni::new(
                id,
                shape.nodes(),
                NiConfig {
                    model: cfg.model,
                    ..NiConfig::default()
                },
            ),
            mem: Box::new(VecMemory::new()),
            now: Instant::ZERO,
            outbox: VecDeque::new(),
            load: None,
            sink_paused: false,
            sink_backlog: VecDeque::new(),
            trace_load: false,
            events: VecDeque::new(),
            stats: NodeStats::default(),
        })
    }

    pub fn id(&self) -> NodeId {
        self.switch.node()
    }

    pub fn switch(&self) -> &Switch {
        &self.switch
    }

    pub fn ni(&self) -> &Ni {
        &self.ni
    }

    /// The NI and the node's memory, to post operations on behalf of a rank.
    pub fn ni_mut(&mut self) -> (&mut Ni, &mut (dyn Memory + Send)) {
        (&mut self.ni, self.mem.as_mut())
    }

    /// Replaces the NI's configuration (timers, windows). The NI models the same hardware
    /// as the switch: the node's model is the switch configuration's, whatever `cfg` says.
    pub fn set_ni_config(&mut self, cfg: NiConfig) {
        let cfg = NiConfig {
            model: self.switch.config().model,
            ..cfg
        };
        self.ni = Ni::new(self.id(), self.switch.shape().nodes(), cfg);
    }

    /// Replaces the memory the NI reads and writes.
    pub fn set_memory(&mut self, mem: Box<dyn Memory + Send>) {
        self.mem = mem;
    }

    pub fn memory(&self) -> &(dyn Memory + Send) {
        self.mem.as_ref()
    }

    /// When the NI next needs [`Node::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ni.poll_timeout()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        // Only the NI's timers ask what can still reach it (its held copies): worked out
        // here, not at every fill.
        if self.switch.config().modeled_order {
            self.ni
                .set_arrival_bound(Some(self.switch.arrival_bound_to_ni()));
        }
        self.ni.handle_timeout(now, self.mem.as_ref());
    }

    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    /// Counts an error of the given kind (also used by the I/O shell for errors it sees
    /// before a cell reaches the core, e.g. undecodable frames).
    pub fn count_error(&mut self, kind: &'static str) {
        *self.stats.errors.entry(kind).or_default() += 1;
    }

    fn counted<T>(&mut self, r: Result<T, SwitchError>) -> Result<T, SwitchError> {
        if let Err(e) = &r {
            self.count_error(e.kind());
        }
        r
    }

    pub fn link_up(&mut self, port: Port) -> Result<[u32; NVCS], SwitchError> {
        let r = self.switch.link_up(port);
        self.counted(r)
    }

    pub fn peer_grant(
        &mut self,
        port: Port,
        grant: [u32; NVCS],
        now: Instant,
    ) -> Result<(), SwitchError> {
        let r = self.switch.peer_grant(port, grant, now);
        self.counted(r)
    }

    pub fn link_down(&mut self, port: Port, now: Instant) -> Result<(), SwitchError> {
        let r = self.switch.link_down(port, now);
        self.counted(r)
    }

    /// A cell from the neighbour on `port`. Errors are counted; the cell is dropped.
    pub fn receive(
        &mut self,
        port: Port,
        vc: Vc,
        cell: Cell,
        now: Instant,
    ) -> Result<(), SwitchError> {
        if cell.is_corrupt() {
            // Counted where it is first seen; it travels on to be refused end to end.
            self.count_error("payload_crc");
        }
        let r = self.switch.receive(port, vc, cell, now);
        self.counted(r)
    }

    /// Takes `bytes` of link credit on (`port`, `vc`) for a copy of a cell the link's
    /// faults duplicate (see [`Switch::spend_credit`]).
    pub fn spend_credit(&mut self, port: Port, vc: Vc, bytes: u32) -> bool {
        self.switch.spend_credit(port, vc, bytes)
    }

    /// Returns credit for bytes that arrived on `(port, vc)` but could not be decoded.
    pub fn refund(&mut self, port: Port, vc: Vc, bytes: u32) -> Result<(), SwitchError> {
        let r = self.switch.refund(port, vc, bytes);
        self.counted(r)
    }

    /// No cell with an earlier head than `t` will come in on `port` any more (see
    /// [`crate::order`]).
    pub fn set_horizon(&mut self, port: Port, t: ModelTime) {
        self.switch.set_horizon(port, t);
    }

    /// Whether the node has cells to forward or its NI work under way (not what its
    /// programs may still post): what keeps cuts of the rack going.
    pub fn busy(&self) -> bool {
        self.switch.has_cells() || self.ni.has_work()
    }

    /// See [`Switch::set_feeds`].
    pub fn set_feeds(&mut self, feeds: crate::routing::Feeds) {
        self.switch.set_feeds(feeds);
    }

    /// Tells the switch what the NI may still inject by itself (see [`crate::order`]):
    /// after anything the node's owner gave the NI from outside.
    pub fn refresh_ni_horizon(&mut self) {
        let (shape, here) = (*self.switch.shape(), self.id());
        let port_of = |dst: NodeId| {
            crate::routing::route(&shape, here, dst, Port::Local, crate::routing::Vc::ZERO)
                .ok()
                .map(|h| h.port)
        };
        let (data, answers) = self.ni.horizon(&port_of);
        let relays = self.ni.relays();
        self.switch.set_ni_horizon(data, answers, relays);
    }

    /// Credit from the neighbour on `port`, for space freed at `freed` in modeled time.
    pub fn credit(
        &mut self,
        port: Port,
        vc: Vc,
        bytes: u32,
        freed: ModelTime,
        now: Instant,
    ) -> Result<(), SwitchError> {
        let r = self.switch.credit(port, vc, bytes, freed, now);
        self.counted(r)
    }

    /// Hands a cell straight to the NI, bypassing the switch (the simulator's duplicate
    /// fault: a copy that no link carried).
    pub fn deliver_to_ni(&mut self, cell: Cell, now: Instant) {
        self.now = now;
        self.ni.on_cell(cell, now, self.mem.as_mut());
    }

    /// Sends a probe to `dst`; the answer comes back as [`NodeEvent::ProbeReply`].
    pub fn send_probe(&mut self, dst: NodeId, id: u32) -> Result<(), NodeError> {
        self.switch.shape().coord(dst)?;
        if self.outbox.len() >= OUTBOX_LIMIT {
            return Err(NodeError::OutboxFull);
        }
        let cell = self.diag_cell(dst, CellType::Probe, ProbeBody::new(id).encode())?;
        self.outbox.push_back(cell);
        Ok(())
    }

    fn diag_cell(&self, dst: NodeId, kind: CellType, payload: Bytes) -> Result<Cell, NodeError> {
        let g = Gvas::new(Pdid(0), dst, 0, 0).map_err(|_| NameError::BadId {
            id: dst.0,
            shape: *self.switch.shape(),
            nodes: self.switch.shape().nodes(),
        })?;
        Cell::new(g, kind, self.id(), payload).map_err(|_| NodeError::LoadPayload(0))
    }

    /// Starts (or replaces) a synthetic load of `cells` cells of `payload_len` bytes,
    /// spread round-robin over `dsts`, injected as fast as the fabric takes them.
    pub fn start_load(
        &mut self,
        dsts: &[NodeId],
        cells: u64,
        payload_len: usize,
    ) -> Result<(), NodeError> {
        if !(LOAD_MIN_PAYLOAD..=MAX_PAYLOAD).contains(&payload_len) {
            return Err(NodeError::LoadPayload(payload_len));
        }
        let mut gs = Vec::with_capacity(dsts.len());
        for d in dsts {
            self.switch.shape().coord(*d)?;
            gs.push(Gvas::new(Pdid(0), *d, 0, 0).expect("node checked against the shape"));
        }
        if gs.is_empty() {
            return Err(NodeError::NoDestination);
        }
        self.load = Some(LoadGen {
            dsts: gs,
            remaining: cells,
            payload_len,
            seq: 0,
            arena: BytesMut::new(),
        });
        Ok(())
    }

    /// Cells the load generator has yet to inject.
    pub fn load_remaining(&self) -> u64 {
        self.load.as_ref().map_or(0, |l| l.remaining)
    }

    /// A paused sink stops consuming delivered cells, so the fabric backs up behind it.
    pub fn set_sink_paused(&mut self, paused: bool) {
        self.sink_paused = paused;
        if !paused {
            while let Some(c) = self.sink_backlog.pop_front() {
                self.consume(c);
            }
        }
    }

    pub fn set_trace_load(&mut self, on: bool) {
        self.trace_load = on;
    }

    /// Feeds the switch's injection queue from the outbox and the load generator.
    fn fill(&mut self, now: Instant) {
        self.inject(now);
        if self.switch.config().modeled_order {
            self.refresh_ni_horizon();
        }
    }

    fn inject(&mut self, now: Instant) {
        let ordered = self.switch.config().modeled_order;
        self.ni
            .set_inject_bound(ordered.then(|| self.switch.link_bound_to_ni()));
        self.ni.refill(now, self.mem.as_ref());
        for answers in [true, false] {
            while let Some(c) = self.ni.poll_cell_of(answers) {
                if !self.switch.can_inject(c.kind, c.wire_len()) {
                    self.ni.unpoll_cell(c);
                    break;
                }
                self.ni.injected(&c, now);
                match self.switch.inject(c, now) {
                    Ok(()) => self.stats.injected_cells += 1,
                    Err(e) => self.count_error(e.kind()),
                }
            }
        }
        while let Some(c) = self.outbox.front() {
            if !self.switch.can_inject(c.kind, c.wire_len()) {
                return;
            }
            let c = self.outbox.pop_front().expect("front exists");
            match self.switch.inject(c, now) {
                Ok(()) => self.stats.injected_cells += 1,
                Err(e) => self.count_error(e.kind()),
            }
        }
        let Some(load) = self.load.as_mut() else {
            return;
        };
        let wire = crate::cell::OVERHEAD + load.payload_len;
        while load.remaining > 0 && self.switch.can_inject(CellType::Load, wire) {
            // Payloads are carved from a shared arena: one allocation per many cells.
            if load.arena.capacity() < load.payload_len {
                load.arena = BytesMut::zeroed(LOAD_ARENA);
                load.arena.clear();
            }
            load.arena.extend_from_slice(&load.seq.to_be_bytes());
            load.arena.resize(load.payload_len, 0);
            let p = load.arena.split().freeze();
            let dst = load.dsts[(load.seq % load.dsts.len() as u64) as usize];
            let cell = Cell::new(dst, CellType::Load, self.switch.node(), p)
                .expect("load payload length checked in start_load");
            if let Err(e) = self.switch.inject(cell, now) {
                *self.stats.errors.entry(e.kind()).or_default() += 1;
                self.load = None;
                return;
            }
            load.seq += 1;
            load.remaining -= 1;
            self.stats.injected_cells += 1;
            self.stats.load_tx_cells += 1;
        }
        if load.remaining == 0 {
            self.load = None;
            self.events.push_back(NodeEvent::LoadSent);
        }
    }

    /// The next cell for a link. Deliveries to this node are handled on the way.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        self.now = now;
        loop {
            self.fill(now);
            let Some(t) = self.switch.poll_transmit(now) else {
                // Deliveries may have produced cells (answers): inject those before
                // reporting that nothing is left to send.
                let before = self.stats.injected_cells;
                self.fill(now);
                if self.stats.injected_cells == before {
                    return None;
                }
                continue;
            };
            if t.from == Port::Local && self.switch.config().modeled_order {
                self.ni.departed(&t.cell);
            }
            if t.port != Port::Local {
                return Some(t);
            }
            self.stats.delivered_cells += 1;
            self.stats.delivered_bytes += t.cell.wire_len() as u64;
            if self.sink_paused {
                self.sink_backlog.push_back(t.cell);
            } else {
                self.consume(t.cell);
            }
        }
    }

    fn consume(&mut self, cell: Cell) {
        let len = cell.wire_len() as u32;
        if cell.is_corrupt() && !cell.kind.is_ni() {
            // Diagnostic cells have nobody to NACK to: drop (counted on arrival).
            self.switch.local_credit(len);
            return;
        }
        match cell.kind {
            CellType::Probe => self.answer_probe(cell),
            CellType::ProbeReply => match ProbeBody::decode(&cell.payload) {
                Some(b) => {
                    let f = (b.forward_hops as usize).min(b.path.len());
                    let forward = b.path[..f].to_vec();
                    let mut back = b.path[f.saturating_sub(1)..].to_vec();
                    if back.last() != Some(&self.id()) {
                        back.push(self.id());
                    }
                    self.events.push_back(NodeEvent::ProbeReply {
                        id: b.id,
                        forward,
                        back,
                        truncated: b.truncated,
                    });
                }
                None => self.count_error("bad_probe"),
            },
            CellType::Load => {
                self.stats.load_rx_cells += 1;
                self.stats.load_rx_bytes += cell.payload.len() as u64;
                if self.trace_load && cell.payload.len() >= 8 {
                    let mut s = [0u8; 8];
                    s.copy_from_slice(&cell.payload[..8]);
                    self.events.push_back(NodeEvent::LoadDelivered {
                        src: cell.src,
                        seq: u64::from_be_bytes(s),
                    });
                }
            }
            _ => {
                let now = self.now;
                self.ni.on_cell(cell, now, self.mem.as_mut());
            }
        }
        self.switch.local_credit(len);
    }

    fn answer_probe(&mut self, cell: Cell) {
        let Some(mut b) = ProbeBody::decode(&cell.payload) else {
            self.count_error("bad_probe");
            return;
        };
        if self.outbox.len() >= OUTBOX_LIMIT {
            self.count_error("probe_overflow");
            return;
        }
        if b.path.last() != Some(&self.id()) {
            b.path.push(self.id());
        }
        b.forward_hops = b.path.len().min(u8::MAX as usize) as u8;
        match self.diag_cell(cell.src, CellType::ProbeReply, b.encode()) {
            Ok(reply) => {
                self.outbox.push_back(reply);
                self.stats.probes_answered += 1;
            }
            // The probe named a source outside the rack: nobody to answer.
            Err(_) => self.count_error("bad_probe"),
        }
    }

    pub fn poll_credit(&mut self) -> Option<(Port, Vc, u32, ModelTime)> {
        self.switch.poll_credit()
    }

    pub fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events
            .pop_front()
            .or_else(|| self.ni.poll_event().map(NodeEvent::Ni))
    }

    /// True when nothing is queued or waiting to be injected.
    pub fn is_idle(&self) -> bool {
        self.switch.is_idle()
            && self.outbox.is_empty()
            && self.load.is_none()
            && !self.ni.has_output()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelParams;

    /// The NI models the hardware the switch does, from the start and after its
    /// configuration is replaced.
    #[test]
    fn the_ni_takes_the_switch_configurations_model() {
        let shape: Shape = "1x1x1".parse().unwrap();
        let model = ModelParams {
            cpu_ni_ns: 999.0,
            ..ModelParams::default()
        }
        .model()
        .unwrap();
        let cfg = SwitchConfig {
            model,
            ..SwitchConfig::default()
        };
        let mut n = Node::new(shape, NodeId(0), cfg).unwrap();
        assert_eq!(n.ni().config().model, model);
        n.set_ni_config(NiConfig {
            window_blocks: 3,
            ..NiConfig::default()
        });
        assert_eq!(n.ni().config().model, model);
        assert_eq!(n.ni().config().window_blocks, 3);
    }
}
