//! A node's switch: input queues per (port, VC), routing at the input, round-robin
//! arbitration between inputs, and credit-based, lossless link-level flow control.
//!
//! # Flow control
//! Each input queue of a link port has a capacity (the rack's per-link window, per VC).
//! The upstream switch may only send a cell when it holds credit for the cell's wire
//! length; credit comes from the `Hello` of a new link session (the free space at that
//! moment) and from `Credit` frames returned as cells leave the queue. A cell is therefore
//! never dropped for lack of buffer: a full queue stops the upstream output, whose own
//! input queues then fill, and so on back to the injecting NI ("hop-by-hop backpressure").
//!
//! Two buffer sizes are kept apart on purpose. The hardware's input buffer is 4 KB per
//! link ([`HW_INPUT_BUFFER`]); the modeled-time mode accounts occupancy against that. The
//! emulator's own window must cover the bandwidth-delay product of a QUIC link between
//! two daemons (~5 Gb/s x ~110 us = ~70 KB) or no link gets near its throughput target,
//! so it is a per-rack setting ([`SwitchConfig::window`]).
//!
//! # Link sessions
//! When a link comes up, the grant sent in our `Hello` is `capacity - occupancy` of each
//! input queue, and credit we owed the previous session is forgotten: cells of the old
//! session still queued here return their credit to the new session as they leave, which
//! is exactly the space they free. Cells the old session had in flight on the wire are lost
//! with the connection; cells still queued at the upstream switch wait there for the link.

use std::collections::VecDeque;

use thiserror::Error;

use crate::cell::{Cell, CellType};
use crate::horizon::Outlook;
use crate::model::{Buffer, Model, ModelTime, Stamp, Timeline};
use crate::order::Order;
use crate::probe;
use crate::routing::{route, Feeds, Hop, RouteError, Vc, NVCS};
use crate::shape::{NodeId, Shape};
use crate::time::Instant;
use crate::topology::{neighbour, Port, NPORTS};

/// The hardware's input buffer per link (report §4.2).
pub const HW_INPUT_BUFFER: u32 = 4096;
/// Default emulator window per link and VC: several times a loopback QUIC link's
/// bandwidth-delay product, so that credit return latency never limits throughput.
pub const DEFAULT_WINDOW: u32 = 256 * 1024;
/// Default space for cells the node's own NI injects and receives.
pub const DEFAULT_LOCAL_WINDOW: u32 = 64 * 1024;
/// How many times its window an input queue holds in modeled order: the NI's queue, a
/// rank's RDMA window (256 blocks of 16 KB, 4 MiB) over the default 64 KB local window.
const MODELED_WINDOWS: u32 = 64;
/// The smallest window that can hold a full cell.
pub const MIN_WINDOW: u32 = crate::cell::MAX_CELL as u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchConfig {
    /// Bytes of input buffer per link port and VC, granted to the upstream neighbour.
    pub window: u32,
    /// Bytes of input buffer for the NI's injections, and of delivery buffer towards it.
    pub local_window: u32,
    /// The modeled hardware: rates, latencies, traversals and the modeled input buffer.
    pub model: Model,
    /// Forward cells in modeled-time order, within horizons its driver sets on each link
    /// port (only the simulator does, [`crate::sim`]; see [`crate::order`]); off, cells
    /// are forwarded in the order the host delivers them.
    pub modeled_order: bool,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            window: DEFAULT_WINDOW,
            local_window: DEFAULT_LOCAL_WINDOW,
            model: Model::default(),
            modeled_order: false,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SwitchError {
    #[error("window of {0} bytes cannot hold one {MIN_WINDOW}-byte cell")]
    WindowTooSmall(u32),
    #[error("node {0} has no port {1}")]
    NoSuchPort(NodeId, Port),
    #[error("virtual channel {0} does not exist")]
    NoSuchVc(u8),
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error("cell of {len} B overruns the input queue of port {port} {vc:?} ({queued} of {cap} B used): the peer sent without credit")]
    CreditOverrun {
        port: Port,
        vc: Vc,
        len: u32,
        queued: u32,
        cap: u32,
    },
    #[error("local injection queue is full")]
    Full,
    #[error("cell arrived on port {0} on a dateline VC, which only torus ports use")]
    WrongVc(Port),
    #[error("probe cell arrived with a corrupt payload")]
    CorruptProbe,
}

impl SwitchError {
    pub fn kind(&self) -> &'static str {
        match self {
            SwitchError::WindowTooSmall(_) => "config",
            SwitchError::NoSuchPort(..) => "no_such_port",
            SwitchError::NoSuchVc(_) => "no_such_vc",
            SwitchError::Route(RouteError::NoSuchNode { .. }) => "bad_destination",
            SwitchError::Route(RouteError::NotHere { .. }) => "config",
            SwitchError::CreditOverrun { .. } => "credit_overrun",
            SwitchError::Full => "full",
            SwitchError::WrongVc(_) => "wrong_vc",
            SwitchError::CorruptProbe => "payload_crc",
        }
    }
}

/// A cell leaving the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub port: Port,
    pub vc: Vc,
    /// The port the cell came in on (`Port::Local` for the node's own cells).
    pub from: Port,
    pub cell: Cell,
}

/// Counters of one port, both directions. `tx` is out of this node, `rx` into it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    pub tx_cells: u64,
    pub tx_bytes: u64,
    pub rx_cells: u64,
    pub rx_bytes: u64,
    /// Time the output had a cell to send but no credit for it.
    pub stall_ns: u64,
    /// Highest occupancy the input queues of this port reached (bytes, sum over VCs).
    pub peak_queue_bytes: u32,
    /// Modeled time the output spent sending (picoseconds): with the node's modeled
    /// clock, the link's modeled utilization.
    pub modeled_busy_ps: u64,
}

struct Queued {
    hop: Hop,
    cell: Cell,
    /// Credit the cell holds in this queue: its wire length on arrival.
    charged: u32,
}

struct Input {
    q: VecDeque<Queued>,
    bytes: u32,
    cap: u32,
    /// Credit freed here and not yet returned upstream.
    owed: u32,
    /// When the latest of the owed bytes was freed, in modeled time.
    owed_freed: ModelTime,
    /// The modeled input buffer, as the cells that left it.
    modeled: Buffer,
    /// In modeled order, when the last cell forwarded from here entered the modeled
    /// buffer, if it had to wait for room (else zero): the buffer is a FIFO, so the next
    /// may not enter before it (see `Switch::admission`).
    backlog: ModelTime,
    /// Cells queued here for each output port.
    toward: [u32; NPORTS],
}

struct Output {
    credits: u32,
    /// Bytes sent in this session whose credit has not come back.
    outstanding: u32,
    up: bool,
    stalled_since: Option<Instant>,
    /// The downstream input buffer as this end knows it (see [`Buffer`]).
    modeled: Buffer,
}

pub struct Switch {
    shape: Shape,
    node: NodeId,
    cfg: SwitchConfig,
    present: [bool; NPORTS],
    /// Indexed by `port.index() * NVCS + vc`.
    inputs: Vec<Input>,
    outputs: Vec<Output>,
    stats: [PortStats; NPORTS],
    /// When each output is modeled-busy.
    busy: Vec<Timeline>,
    /// When the NI's datapath is modeled-busy: it serialises every cell the NI injects,
    /// in the order the switch takes them (modeled order when ordering is on).
    datapath: Timeline,
    order: Order,
    /// What the NI may still inject by itself, (data, answers) by output, before its
    /// datapath, and whether it relays.
    ni_own: ([ModelTime; NPORTS], [ModelTime; NPORTS], bool),
    next_input: usize,
    /// Bit `i` set when input queue `i` holds cells: arbitration visits only those.
    occupied: u64,
    forwarded: u64,
}

fn slot(port: Port, vc: Vc) -> usize {
    port.index() * NVCS + vc.0 as usize
}

/// The input queues of the answer class, as bits of [`Switch::occupied`].
const ANSWER_INPUTS: u64 = {
    let mut m = 0u64;
    let mut i = 0;
    while i < NPORTS * NVCS {
        if Vc((i % NVCS) as u8).is_answer() {
            m |= 1 << i;
        }
        i += 1;
    }
    m
};
const _: () = assert!(NPORTS * NVCS <= 64, "occupied is a u64 bitmap");

impl Switch {
    pub fn new(shape: Shape, node: NodeId, cfg: SwitchConfig) -> Result<Switch, SwitchError> {
        if cfg.window < MIN_WINDOW {
            return Err(SwitchError::WindowTooSmall(cfg.window));
        }
        if cfg.local_window < MIN_WINDOW {
            return Err(SwitchError::WindowTooSmall(cfg.local_window));
        }
        shape
            .coord(node)
            .map_err(|_| RouteError::NotHere { here: node, shape })?;
        let mut present = [false; NPORTS];
        for p in Port::all() {
            present[p.index()] = p == Port::Local || neighbour(&shape, node, p).is_some();
        }
        let mut inputs = Vec::with_capacity(NPORTS * NVCS);
        let mut outputs = Vec::with_capacity(NPORTS * NVCS);
        for i in 0..NPORTS * NVCS {
            let local = i / NVCS == Port::Local.index();
            // In modeled order cells wait in the switch until it is their turn, so its
            // queues hold what the rest of the rack would otherwise hold in real time:
            // the NI's cells, and a link's cells waiting for another link's (see
            // `crate::order`). A full queue would hold back the cells that let its own
            // move.
            let (window, local_window) = if cfg.modeled_order {
                (
                    cfg.window.saturating_mul(MODELED_WINDOWS),
                    cfg.local_window.saturating_mul(MODELED_WINDOWS),
                )
            } else {
                (cfg.window, cfg.local_window)
            };
            inputs.push(Input {
                q: VecDeque::new(),
                bytes: 0,
                cap: if local { local_window } else { window },
                owed: 0,
                owed_freed: ModelTime::ZERO,
                modeled: Buffer::default(),
                backlog: ModelTime::ZERO,
                toward: [0; NPORTS],
            });
            outputs.push(Output {
                credits: if local { cfg.local_window } else { 0 },
                outstanding: 0,
                up: local,
                stalled_since: None,
                modeled: Buffer::default(),
            });
        }
        let mut order = Order::new();
        for p in Port::all().filter(|p| !present[p.index()]) {
            // Nothing ever comes in on a port with no link.
            order.set_horizon(p, ModelTime::NEVER);
        }
        Ok(Switch {
            shape,
            node,
            cfg,
            present,
            inputs,
            outputs,
            stats: [PortStats::default(); NPORTS],
            busy: vec![Timeline::default(); NPORTS],
            datapath: Timeline::default(),
            order,
            ni_own: ([ModelTime::NEVER; NPORTS], [ModelTime::NEVER; NPORTS], true),
            next_input: 0,
            occupied: 0,
            forwarded: 0,
        })
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn config(&self) -> SwitchConfig {
        self.cfg
    }

    /// The link ports this node has.
    pub fn link_ports(&self) -> impl Iterator<Item = Port> + '_ {
        Port::all().filter(|p| *p != Port::Local && self.present[p.index()])
    }

    fn check_link_port(&self, port: Port) -> Result<(), SwitchError> {
        if port == Port::Local || !self.present[port.index()] {
            return Err(SwitchError::NoSuchPort(self.node, port));
        }
        Ok(())
    }

    /// A new session on `port` starts: returns the credit to grant the peer per VC.
    pub fn link_up(&mut self, port: Port) -> Result<[u32; NVCS], SwitchError> {
        self.check_link_port(port)?;
        let mut grant = [0; NVCS];
        for (v, g) in grant.iter_mut().enumerate() {
            let i = &mut self.inputs[slot(port, Vc(v as u8))];
            i.owed = 0;
            *g = i.cap - i.bytes;
        }
        Ok(grant)
    }

    /// The peer's `Hello` arrived: it lets us fill `grant` bytes per VC.
    pub fn peer_grant(
        &mut self,
        port: Port,
        grant: [u32; NVCS],
        now: Instant,
    ) -> Result<(), SwitchError> {
        self.check_link_port(port)?;
        for (v, g) in grant.iter().enumerate() {
            let o = &mut self.outputs[slot(port, Vc(v as u8))];
            o.credits = *g;
            o.outstanding = 0;
            o.up = true;
            Self::end_stall(&mut self.stats[port.index()], o, now);
        }
        Ok(())
    }

    /// The link session on `port` ended. Queued cells wait for the next session.
    pub fn link_down(&mut self, port: Port, now: Instant) -> Result<(), SwitchError> {
        self.check_link_port(port)?;
        for v in 0..NVCS {
            let o = &mut self.outputs[slot(port, Vc(v as u8))];
            o.credits = 0;
            o.outstanding = 0;
            o.up = false;
            Self::end_stall(&mut self.stats[port.index()], o, now);
        }
        Ok(())
    }

    pub fn is_up(&self, port: Port) -> bool {
        self.outputs[slot(port, Vc::ZERO)].up
    }

    fn end_stall(stats: &mut PortStats, o: &mut Output, now: Instant) {
        if let Some(t) = o.stalled_since.take() {
            stats.stall_ns += now.since(t);
        }
    }

    /// A cell arrived from the neighbour on `port`. A refused cell is dropped; unless it
    /// overran the queue (sent without credit), the credit it used goes back upstream,
    /// so a peer's bad cells never shrink its window for good.
    pub fn receive(
        &mut self,
        port: Port,
        vc: Vc,
        cell: Cell,
        _now: Instant,
    ) -> Result<(), SwitchError> {
        self.check_link_port(port)?;
        if vc.0 as usize >= NVCS {
            return Err(SwitchError::NoSuchVc(vc.0));
        }
        let len = cell.wire_len() as u32;
        if cell.is_corrupt() && matches!(cell.kind, CellType::Probe | CellType::ProbeReply) {
            // Probes are rewritten on the way (path recording); a corrupt one is dropped.
            self.refund(port, vc, len)?;
            return Err(SwitchError::CorruptProbe);
        }
        if vc.past_dateline() && !matches!(port, Port::Torus(..)) {
            self.refund(port, vc, len)?;
            return Err(SwitchError::WrongVc(port));
        }
        let s = slot(port, vc);
        let input = &self.inputs[s];
        if input.bytes + len > input.cap {
            return Err(SwitchError::CreditOverrun {
                port,
                vc,
                len,
                queued: input.bytes,
                cap: input.cap,
            });
        }
        let hop = match route(&self.shape, self.node, cell.dst.node(), port, vc) {
            Ok(h) => h,
            Err(e) => {
                self.refund(port, vc, len)?;
                return Err(e.into());
            }
        };
        let st = &mut self.stats[port.index()];
        st.rx_cells += 1;
        st.rx_bytes += u64::from(len);
        self.enqueue(s, hop, cell, len);
        Ok(())
    }

    /// Returns the credit of `bytes` that arrived on `(port, vc)` but were dropped before
    /// queueing (refused or undecodable cells whose frame length was sound).
    pub fn refund(&mut self, port: Port, vc: Vc, bytes: u32) -> Result<(), SwitchError> {
        self.check_link_port(port)?;
        if vc.0 as usize >= NVCS {
            return Err(SwitchError::NoSuchVc(vc.0));
        }
        let i = &mut self.inputs[slot(port, vc)];
        i.owed = i.owed.saturating_add(bytes);
        Ok(())
    }

    fn enqueue(&mut self, s: usize, hop: Hop, cell: Cell, len: u32) {
        let input = &mut self.inputs[s];
        input.bytes += len;
        input.toward[hop.port.index()] += 1;
        self.occupied |= 1u64 << s;
        // In modeled order, a queue is kept in head order (see `crate::order`); cells
        // mostly come in order, so the place is found near the back.
        let at = if self.cfg.modeled_order {
            let head = cell.stamp.head;
            input.q.partition_point(|q| q.cell.stamp.head <= head)
        } else {
            input.q.len()
        };
        input.q.insert(
            at,
            Queued {
                hop,
                cell,
                charged: len,
            },
        );
        let port = s / NVCS;
        let total: u32 = (0..NVCS).map(|v| self.inputs[port * NVCS + v].bytes).sum();
        let st = &mut self.stats[port];
        st.peak_queue_bytes = st.peak_queue_bytes.max(total);
    }

    /// Room for a cell of `kind` and `wire_len` bytes in the NI's injection queue of its
    /// class?
    pub fn can_inject(&self, kind: CellType, wire_len: usize) -> bool {
        let i = &self.inputs[slot(Port::Local, Vc::injection(kind))];
        i.bytes as usize + wire_len <= i.cap as usize
    }

    /// The node's NI injects a cell.
    pub fn inject(&mut self, cell: Cell, _now: Instant) -> Result<(), SwitchError> {
        let len = cell.wire_len() as u32;
        if !self.can_inject(cell.kind, len as usize) {
            return Err(SwitchError::Full);
        }
        let vc = Vc::injection(cell.kind);
        let hop = route(&self.shape, self.node, cell.dst.node(), Port::Local, vc)?;
        self.enqueue(slot(Port::Local, vc), hop, cell, len);
        Ok(())
    }

    /// Credit returned by the neighbour on `port`, for space freed at `freed` in modeled
    /// time (zero: credit of cells that never arrived, which held no modeled space).
    pub fn credit(
        &mut self,
        port: Port,
        vc: Vc,
        bytes: u32,
        freed: ModelTime,
        now: Instant,
    ) -> Result<(), SwitchError> {
        self.check_link_port(port)?;
        if vc.0 as usize >= NVCS {
            return Err(SwitchError::NoSuchVc(vc.0));
        }
        let o = &mut self.outputs[slot(port, vc)];
        o.modeled.learn(bytes, freed);
        // A hostile peer can lie about credit; saturating keeps the arithmetic sound and
        // the damage confined to that peer's own queue.
        o.credits = o.credits.saturating_add(bytes);
        o.outstanding = o.outstanding.saturating_sub(bytes);
        Self::end_stall(&mut self.stats[port.index()], o, now);
        Ok(())
    }

    /// Takes `bytes` of credit on (`port`, `vc`) for a copy of a cell that link faults
    /// send twice: the copy occupies the neighbour's buffer as the cell does, and its
    /// credit comes back as the cell's does. False (nothing taken) when the output does
    /// not have it.
    pub fn spend_credit(&mut self, port: Port, vc: Vc, bytes: u32) -> bool {
        if self.check_link_port(port).is_err() || vc.0 as usize >= NVCS {
            return false;
        }
        let o = &mut self.outputs[slot(port, vc)];
        if !o.up || o.credits < bytes {
            return false;
        }
        o.credits -= bytes;
        o.outstanding += bytes;
        true
    }

    /// The NI consumed `bytes` of cells delivered to it.
    pub fn local_credit(&mut self, bytes: u32) {
        let o = &mut self.outputs[slot(Port::Local, Vc::ZERO)];
        o.credits = (o.credits + bytes).min(self.cfg.local_window);
    }

    /// The next cell to send: answers first, then round-robin among inputs whose head
    /// cell's output has credit. Cells for `Port::Local` are deliveries to the node's NI.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let n = self.inputs.len();
        let below = (1u64 << self.next_input) - 1;
        // Occupied inputs from next_input upwards, then those below it: round-robin,
        // within answers and then within the rest.
        let (answers, rest) = (
            self.occupied & ANSWER_INPUTS,
            self.occupied & !ANSWER_INPUTS,
        );
        let order = [
            answers & !below,
            answers & below,
            rest & !below,
            rest & below,
        ];
        for mut bits in order {
            while bits != 0 {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(t) = self.try_input(i, n, now) {
                    return Some(t);
                }
            }
        }
        None
    }

    /// Sends the head cell of input `i` if its output has credit (and, with ordering on,
    /// if no cell that goes before it can still come).
    fn try_input(&mut self, i: usize, n: usize, now: Instant) -> Option<Transmit> {
        let key = if self.cfg.modeled_order {
            self.may_forward(i)?
        } else {
            ModelTime::ZERO
        };
        let head = self.inputs[i].q.front()?;
        let hop = head.hop;
        let records = hop.port != Port::Local
            && matches!(head.cell.kind, CellType::Probe | CellType::ProbeReply);
        let need = head.cell.wire_len() as u32
            + if records {
                probe::growth(&head.cell.payload, self.node)
            } else {
                0
            };
        let os = slot(hop.port, hop.vc);
        let o = &mut self.outputs[os];
        if !o.up || o.credits < need {
            if o.up && o.stalled_since.is_none() {
                o.stalled_since = Some(now);
            }
            return None;
        }
        o.credits -= need;
        o.outstanding += need;
        let q = self.inputs[i].q.pop_front().expect("head exists");
        self.inputs[i].toward[hop.port.index()] -= 1;
        if self.cfg.modeled_order {
            self.order.forwarded(i, key, hop.port);
        }
        let from = Port::from_index(i / NVCS).expect("valid input index");
        let mut cell = q.cell;
        if records {
            probe::record_hop(&mut cell, self.node);
        }
        let busy = self.model_departure(i, from, hop, &mut cell, q.charged);
        if from == Port::Local && self.cfg.modeled_order {
            self.refresh_ni_horizon();
        }
        let input = &mut self.inputs[i];
        input.bytes -= q.charged;
        input.owed += q.charged;
        if input.q.is_empty() {
            self.occupied &= !(1u64 << i);
        }
        self.next_input = (i + 1) % n;
        let st = &mut self.stats[hop.port.index()];
        st.tx_cells += 1;
        st.tx_bytes += u64::from(need);
        st.modeled_busy_ps += busy;
        if from != Port::Local && hop.port != Port::Local {
            self.forwarded += 1;
        }
        Some(Transmit {
            port: hop.port,
            vc: hop.vc,
            from,
            cell,
        })
    }

    /// The head cell of input `i`'s order key when it is safe to forward in modeled
    /// order (see [`crate::order`]). A queue that is full is served anyway: its upstream
    /// may be waiting for room to send what this switch waits for.
    fn may_forward(&self, i: usize) -> Option<ModelTime> {
        let key = self.admitted(i)?;
        let input = &self.inputs[i];
        if input.bytes + MIN_WINDOW > input.cap {
            return Some(key);
        }
        let heads = |s: usize| self.admitted(s);
        let front = input.q.front()?;
        let to = front.hop.port;
        let arrived = (i / NVCS != Port::Local.index()).then_some(front.cell.stamp.head);
        self.order
            .is_safe(i, key, arrived, to, &heads, &self.cfg.model)
            .then_some(key)
    }

    /// When the head cell of input `i` would compete for its output, in modeled time: its
    /// head once through the NI's datapath (for the NI's own cells) and once it has room
    /// in the input's modeled buffer, as `model_departure` will find it. What orders cells: an NI that cuts a whole window of
    /// blocks at once stamps them all alike, but they enter the switch one buffer's room
    /// at a time, between the cells of the other inputs.
    fn admitted(&self, i: usize) -> Option<ModelTime> {
        let q = self.inputs[i].q.front()?;
        let m = &self.cfg.model;
        let from = Port::from_index(i / NVCS)?;
        let mut head = q.cell.stamp.head;
        if from == Port::Local {
            head = self
                .datapath
                .first_gap(head, m.ni_rate.ps(q.cell.wire_len()));
        }
        Some(self.admission(i, from, head, q.charged))
    }

    /// When a cell of input `i` (from `from`) whose head reaches the switch at `head`
    /// enters the input's modeled buffer: once the buffer has room for its `charged`
    /// bytes, the room's credit having gone back over the link and the cell come over
    /// it. In modeled order, also not before the cell ahead of it entered, when that one
    /// had to wait: the buffer's account is a timeline with gaps (cells of other jobs,
    /// far ahead or behind in modeled time, leave room in between), but within a backlog
    /// a cell found room in the gap before the entries of the cells ahead of it, entered
    /// in the past, and took its output ahead of cells that had waited. Keys then meant
    /// little, and two flows into one output got 31% and 69% of it. Host order keeps the
    /// gaps: its cells come in real-time order, and a floor there would let one job's
    /// backlog hold another's cells.
    fn admission(&self, i: usize, from: Port, head: ModelTime, charged: u32) -> ModelTime {
        let m = &self.cfg.model;
        let input = &self.inputs[i];
        let at = head.max(input.backlog);
        match input.modeled.room_at(charged, m.input_buffer, at) {
            None => at,
            Some(room) => at.max(room + 2 * m.latency(from)),
        }
    }

    /// No cell with an earlier head than `t` will come in on `port` any more (see
    /// [`crate::order`]).
    pub fn set_horizon(&mut self, port: Port, t: ModelTime) {
        self.order.set_horizon(port, t);
    }

    /// The horizon of link input `port` (see [`crate::order`]).
    #[cfg(test)]
    pub(crate) fn horizon(&self, port: Port) -> ModelTime {
        self.order.horizon(port)
    }

    /// Tells the ordering which inputs can send cells to which outputs (see
    /// [`crate::routing::feeds`]); without it, a cell waits for every input.
    pub fn set_feeds(&mut self, feeds: Feeds) {
        self.order.set_feeds(feeds);
    }

    pub fn feeds(&self) -> &Feeds {
        self.order.feeds()
    }

    /// The earliest head the node's NI may still inject a cell with by itself, by the
    /// output it takes: data cells, and answers (each class on its own injection queue);
    /// and whether the NI relays (see [`crate::order`]).
    pub fn set_ni_horizon(
        &mut self,
        data: [ModelTime; NPORTS],
        answers: [ModelTime; NPORTS],
        relays: bool,
    ) {
        self.ni_own = (data, answers, relays);
        self.refresh_ni_horizon();
    }

    /// What the NI has still to inject crosses its datapath after what the switch took,
    /// and enters its input buffer once there is room (as [`Switch::admitted`] has it):
    /// a bound any looser holds back cells that the NI's own, unable to enter a full
    /// queue, are taken to precede.
    fn refresh_ni_horizon(&mut self) {
        let m = &self.cfg.model;
        let shortest = crate::cell::OVERHEAD;
        let mut by_vc = [[ModelTime::NEVER; NPORTS]; NVCS];
        for (kind, raw) in [
            (CellType::Write, &self.ni_own.0),
            (CellType::Ack, &self.ni_own.1),
        ] {
            let vc = usize::from(Vc::injection(kind).0);
            let room_from = |head: ModelTime| {
                self.inputs[slot(Port::Local, Vc(vc as u8))]
                    .modeled
                    .room_at(shortest as u32, m.input_buffer, head)
                    .map_or(head, |r| head.max(r))
            };
            for (p, &t) in raw.iter().enumerate() {
                if t < ModelTime::NEVER {
                    let head = self.datapath.first_gap(t, m.ni_rate.ps(shortest));
                    by_vc[vc][p] = room_from(head);
                }
            }
        }
        self.order.set_ni_own(by_vc, self.ni_own.2);
    }

    /// The earliest order key of a cell queued here for `port`: a bound on what this
    /// switch forwards to that port from what it holds (see [`crate::order`]).
    pub fn earliest_toward(&self, port: Port) -> ModelTime {
        (0..self.inputs.len())
            .filter(|&s| self.inputs[s].toward[port.index()] > 0)
            .filter_map(|s| self.admitted(s))
            .min()
            .unwrap_or(ModelTime::NEVER)
    }

    /// The earliest order key of a cell queued here that came in on `port` and goes to
    /// the NI, which may answer it (see [`crate::horizon`]). Only the front of each queue
    /// counts: in modeled order the cells behind it have later keys.
    pub fn earliest_to_ni(&self, port: Port) -> ModelTime {
        (0..NVCS)
            .map(|vc| slot(port, Vc(vc as u8)))
            .filter(|&s| self.inputs[s].toward[Port::Local.index()] > 0)
            .filter_map(|s| self.admitted(s))
            .min()
            .unwrap_or(ModelTime::NEVER)
    }

    /// In modeled order, the earliest order key of a cell that can still reach the NI:
    /// queued here for it, or still to come in on an input that delivers to it.
    pub fn arrival_bound_to_ni(&self) -> ModelTime {
        let heads = |s: usize| self.admitted(s);
        self.order.to_ni_arrivals(&heads)
    }

    /// See `Order::to_ni_from_links`.
    pub fn link_bound_to_ni(&self) -> ModelTime {
        let heads = |s: usize| self.admitted(s);
        self.order.to_ni_from_links(&heads)
    }

    /// What the NI may still inject by itself, as last set, through its datapath and
    /// into its injection queues.
    pub fn ni_earliest(&self) -> ModelTime {
        self.order.ni_own()
    }

    /// What the NI may still inject by itself onto `port`, as last set.
    pub fn ni_toward(&self, port: Port) -> ModelTime {
        self.order.ni_toward(port)
    }

    /// Whether the NI may send anywhere in reaction to what reaches it, as last set.
    pub fn ni_relays(&self) -> bool {
        self.order.relays()
    }

    /// The earliest a cell whose head is at this switch at `ready` (or later) can reach
    /// the far end of `port`: after a traversal (from `from`, the port it came in on,
    /// when known; else the shortest), in the first gap of the output's timeline
    /// (everything already booked on it goes first), and the link's latency.
    pub fn earliest_arrival(&self, port: Port, from: Option<Port>, ready: ModelTime) -> ModelTime {
        let m = &self.cfg.model;
        crate::horizon::arrival(
            &self.busy[port.index()],
            ready,
            m.traversal(from.unwrap_or(Port::Local), port),
            m.rate(port).ps(crate::cell::OVERHEAD),
            m.latency(port),
        )
    }

    /// What [`earliest_arrival`](Self::earliest_arrival) on `port` needs, for cells ready
    /// at `from` or later, with at most `limit` of the output's busy intervals (see
    /// [`crate::horizon`]).
    pub fn outlook(&self, port: Port, from: ModelTime, limit: usize) -> Outlook {
        let m = &self.cfg.model;
        Outlook {
            traversal_ps: m.traversal(Port::Local, port),
            from_torus_ps: m.router,
            shortest_ps: m.rate(port).ps(crate::cell::OVERHEAD),
            latency_ps: m.latency(port),
            busy: self.busy[port.index()].since(from, limit),
        }
    }

    /// The earliest key anything this switch holds or its NI may inject has, and the
    /// horizon of every link input: what it forwards from now on has no earlier key
    /// (the floor of what a cut needs of its outputs' timelines).
    pub fn earliest_key(&self) -> ModelTime {
        let held = (0..self.inputs.len())
            .filter_map(|s| self.admitted(s))
            .min()
            .unwrap_or(ModelTime::NEVER);
        held.min(self.order.floor())
    }

    /// Whether the switch holds a cell.
    pub fn has_cells(&self) -> bool {
        self.occupied != 0
    }

    /// Cells forwarded out of modeled order with ordering on (see [`crate::order`]).
    pub fn late_cells(&self) -> u64 {
        self.order.late()
    }

    /// Modeled time for the cell leaving input `i` (which came in on `from`) by `hop`:
    /// it leaves once it is in this input's modeled buffer (the upstream could not have
    /// sent it before the cells ahead freed room), has crossed the switch, the output is
    /// free and the downstream buffer has room as far as this end knows; it then occupies
    /// the output for its wire size at the output's rate. Restamps the cell with its
    /// arrival at the far end and returns the modeled time the output was busy with it.
    fn model_departure(
        &mut self,
        i: usize,
        from: Port,
        hop: Hop,
        cell: &mut Cell,
        charged: u32,
    ) -> u64 {
        let m = &self.cfg.model;
        let cap = m.input_buffer;
        let len = cell.wire_len();
        if from == Port::Local {
            // The NI's datapath serialises what it injects: the cell's first and last
            // byte enter the switch at its rate.
            let ser = m.ni_rate.ps(len);
            let head = self.datapath.reserve(cell.stamp.head, ser);
            cell.stamp = Stamp {
                head,
                tail: head + ser,
            };
        }
        let admit = self.admission(i, from, cell.stamp.head, charged);
        let input = &mut self.inputs[i];
        if self.cfg.modeled_order {
            input.backlog = if admit > cell.stamp.head {
                admit
            } else {
                ModelTime::ZERO
            };
        }
        let shift = admit.since(cell.stamp.head);
        let (head, tail) = (cell.stamp.head + shift, cell.stamp.tail + shift);
        let to = hop.port;
        let t = m.traversal(from, to);
        let lat = m.latency(to);
        // What this end knows of the downstream buffer comes with credits, in real time:
        // in modeled order that would make the result depend on the host again, and the
        // downstream's own account (rule 1 there) delays the cell all the same.
        let credit = if to == Port::Local || self.cfg.modeled_order {
            ModelTime::ZERO
        } else {
            let o = &self.outputs[slot(to, hop.vc)];
            match o.modeled.room_at(len as u32, cap, head + t + lat) {
                None => ModelTime::ZERO,
                // The credit for that room comes back over the link.
                Some(r) => r + lat,
            }
        };
        let ser = m.rate(to).ps(len);
        // The link carries the cell and then what travels with it (its trailer); the
        // cell's last byte is in at `end` all the same.
        let held = ser + m.trailer_ps(to);
        let start = self.busy[to.index()].reserve((head + t).max(credit), held);
        let end = (start + ser).max(tail + t);
        input.modeled.record(head, end, charged, true);
        input.owed_freed = input.owed_freed.max(end);
        cell.stamp = Stamp {
            head: start + lat,
            tail: end + lat,
        };
        if to != Port::Local {
            // Until its credit says otherwise, the cell is taken to pass straight through.
            let o = &mut self.outputs[slot(to, hop.vc)];
            o.modeled
                .record(cell.stamp.head, cell.stamp.tail, len as u32, false);
        }
        // What the link was busy with: the cell's wire time and its trailer (a cut-through
        // cell whose tail comes in slower takes longer to finish, but the link was idle
        // meanwhile, and its timeline reserved only this).
        held
    }

    /// Credit to return to an upstream neighbour, all that is owed on one (port, VC),
    /// with the modeled time the latest of it was freed. Call after a batch of work so
    /// that returns coalesce.
    pub fn poll_credit(&mut self) -> Option<(Port, Vc, u32, ModelTime)> {
        for (i, input) in self.inputs.iter_mut().enumerate() {
            if input.owed == 0 || i / NVCS == Port::Local.index() {
                input.owed = 0;
                continue;
            }
            let n = std::mem::take(&mut input.owed);
            let port = Port::from_index(i / NVCS).expect("valid input index");
            // The latest departure of these bytes only: a running maximum would lend one
            // workload's far-ahead clock to every later credit of the input.
            let freed = std::mem::take(&mut input.owed_freed);
            return Some((port, Vc((i % NVCS) as u8), n, freed));
        }
        None
    }

    /// The latest modeled time this switch has seen a cell leave at: the node's modeled
    /// clock, against which [`PortStats::modeled_busy_ps`] is a utilization.
    pub fn modeled_now(&self) -> ModelTime {
        self.busy
            .iter()
            .map(Timeline::busy_until)
            .max()
            .unwrap_or_default()
    }

    pub fn port_stats(&self, port: Port) -> PortStats {
        self.stats[port.index()]
    }

    /// Cells forwarded from one link to another.
    pub fn forwarded(&self) -> u64 {
        self.forwarded
    }

    /// Bytes queued at the inputs of `port`, over all VCs.
    pub fn queue_bytes(&self, port: Port) -> u32 {
        (0..NVCS)
            .map(|v| self.inputs[slot(port, Vc(v as u8))].bytes)
            .sum()
    }

    /// Cells queued at the inputs of `port`, over all VCs.
    pub fn queue_cells(&self, port: Port) -> usize {
        (0..NVCS)
            .map(|v| self.inputs[slot(port, Vc(v as u8))].q.len())
            .sum()
    }

    /// Bytes sent on `port` in this session that the neighbour has not yet returned
    /// credit for (for the local port: delivered cells the NI has not consumed).
    pub fn in_flight(&self, port: Port) -> u32 {
        if port == Port::Local {
            return self.cfg.local_window - self.outputs[slot(port, Vc::ZERO)].credits;
        }
        (0..NVCS)
            .map(|v| self.outputs[slot(port, Vc(v as u8))].outstanding)
            .sum()
    }

    /// Time stalled on `port` so far, including a stall still going on at `now`.
    pub fn stall_ns(&self, port: Port, now: Instant) -> u64 {
        let mut t = self.stats[port.index()].stall_ns;
        for v in 0..NVCS {
            if let Some(s) = self.outputs[slot(port, Vc(v as u8))].stalled_since {
                t += now.since(s);
            }
        }
        t
    }

    /// True when no cell is queued anywhere in this switch.
    pub fn is_idle(&self) -> bool {
        self.inputs.iter().all(|i| i.q.is_empty())
    }

    /// The capacity of each input queue of `port` (per VC).
    pub fn input_capacity(&self, port: Port) -> u32 {
        self.inputs[slot(port, Vc::ZERO)].cap
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::gvas::Gvas;
    use crate::model::ModelParams;

    fn cell(kind: CellType, dst: NodeId, len: usize) -> Cell {
        let g = Gvas::new(crate::gvas::Pdid(1), dst, 0, 0).unwrap();
        Cell::new(g, kind, NodeId(1), Bytes::from(vec![7u8; len])).unwrap()
    }

    /// M1QAF1's switch in a 2x1x1 rack with its link from M1QAF2 (granted) and its torus
    /// link up: the switch, that input, the torus port, and the node beyond it.
    fn f1_of_2x1x1(cfg: SwitchConfig) -> (Switch, Port, Port, NodeId) {
        let shape: Shape = "2x1x1".parse().unwrap();
        let here = shape.parse_node("M1QAF1").unwrap();
        let far = shape.parse_node("M1QBF1").unwrap();
        let mut sw = Switch::new(shape, here, cfg).unwrap();
        let torus = sw
            .link_ports()
            .find(|p| matches!(p, Port::Torus(..)))
            .unwrap();
        let from = Port::Qfdb(2);
        for p in [from, torus] {
            sw.link_up(p).unwrap();
        }
        sw.peer_grant(from, [DEFAULT_WINDOW; NVCS], Instant::ZERO)
            .unwrap();
        (sw, from, torus, far)
    }

    /// An ACK that comes in behind data on the same link, bound for the same output,
    /// leaves first, and leaves even while the data has no credit to go on.
    #[test]
    fn answers_pass_data_queued_ahead_of_them() {
        let (mut sw, from, torus, far) = f1_of_2x1x1(SwitchConfig::default());
        let now = Instant::ZERO;
        // The far end has room for answers only: the data stalls.
        sw.peer_grant(torus, [0, 0, DEFAULT_WINDOW, DEFAULT_WINDOW], now)
            .unwrap();
        for _ in 0..100 {
            sw.receive(from, Vc::ZERO, cell(CellType::Write, far, 256), now)
                .unwrap();
        }
        let ack = cell(CellType::Ack, far, 8);
        sw.receive(from, Vc::injection(CellType::Ack), ack.clone(), now)
            .unwrap();
        let t = sw.poll_transmit(now).expect("the answer goes");
        assert_eq!((t.port, t.cell.kind), (torus, CellType::Ack));
        assert!(t.vc.is_answer());
        assert_eq!(sw.poll_transmit(now), None, "data without credit stays");
        // With credit, the data follows in order, round-robin as before.
        sw.credit(torus, Vc::ZERO, DEFAULT_WINDOW, ModelTime::ZERO, now)
            .unwrap();
        let t = sw.poll_transmit(now).unwrap();
        assert_eq!((t.cell.kind, t.vc), (CellType::Write, Vc::ZERO));
    }

    /// Each credit carries the departure of the bytes it returns, not the latest departure
    /// the input ever saw: a cell far ahead in modeled time does not age later credits.
    #[test]
    fn a_credit_carries_its_own_bytes_departure() {
        let shape: Shape = "2x1x1".parse().unwrap();
        let here = shape.parse_node("M1QAF1").unwrap();
        let mut sw = Switch::new(shape, here, SwitchConfig::default()).unwrap();
        let now = Instant::ZERO;
        let from = Port::Qfdb(2);
        sw.link_up(from).unwrap();
        sw.peer_grant(from, [DEFAULT_WINDOW; NVCS], now).unwrap();
        let send = |sw: &mut Switch, at: ModelTime| {
            let mut c = cell(CellType::Write, here, 64);
            c.stamp = Stamp::at(at);
            sw.receive(from, Vc::ZERO, c, now).unwrap();
            assert!(sw.poll_transmit(now).is_some());
            sw.poll_credit().expect("the cell's credit").3
        };
        let far = send(&mut sw, ModelTime::from_ns(1_000_000_000));
        assert!(far > ModelTime::from_ns(1_000_000_000));
        let near = send(&mut sw, ModelTime::from_ns(10));
        assert!(near < ModelTime::from_ns(1_000), "{near}");
    }

    /// On a torus link the routing logic's control data follows each cell: a lone cell
    /// arrives as fast as without it, the next one on the link starts only after it.
    #[test]
    fn torus_control_data_holds_the_link_after_each_cell_without_delaying_it() {
        let stamps = |control: u32| {
            let model = ModelParams {
                torus_control_bytes: control,
                ..ModelParams::default()
            }
            .model()
            .unwrap();
            let (mut sw, from, torus, far) = f1_of_2x1x1(SwitchConfig {
                model,
                ..SwitchConfig::default()
            });
            let now = Instant::ZERO;
            sw.peer_grant(torus, [DEFAULT_WINDOW; NVCS], now).unwrap();
            let mut out = Vec::new();
            for _ in 0..2 {
                let mut c = cell(CellType::Write, far, 256);
                c.stamp = Stamp::at(ModelTime::ZERO);
                sw.receive(from, Vc::ZERO, c, now).unwrap();
                let t = sw.poll_transmit(now).expect("the cell goes");
                assert_eq!(t.port, torus);
                out.push(t.cell.stamp);
            }
            (out, sw.port_stats(torus).modeled_busy_ps)
        };
        let (bare, bare_busy) = stamps(0);
        let (with, with_busy) = stamps(80);
        let wire = with[0].tail.since(with[0].head);
        assert_eq!(with[0], bare[0], "a lone cell is not delayed");
        // 80 B at 10 Gb/s: 64 ns more between the two cells, and on the link's account.
        assert_eq!(with[1].head.since(bare[1].head), 64_000);
        assert_eq!(with[1].tail.since(with[1].head), wire);
        assert_eq!(with_busy - bare_busy, 2 * 64_000);
    }

    /// A cell on a dateline VC of the answer class from a port that has no dateline is
    /// refused like one on VC1, and its credit comes back.
    #[test]
    fn dateline_vcs_of_either_class_only_on_torus_ports() {
        let shape: Shape = "2x1x1".parse().unwrap();
        let here = shape.parse_node("M1QAF1").unwrap();
        let mut sw = Switch::new(shape, here, SwitchConfig::default()).unwrap();
        let now = Instant::ZERO;
        sw.link_up(Port::Qfdb(2)).unwrap();
        for vc in [Vc(1), Vc(3)] {
            let c = cell(CellType::Ack, NodeId(2), 8);
            let len = c.wire_len() as u32;
            assert_eq!(
                sw.receive(Port::Qfdb(2), vc, c, now),
                Err(SwitchError::WrongVc(Port::Qfdb(2)))
            );
            assert_eq!(
                sw.poll_credit(),
                Some((Port::Qfdb(2), vc, len, ModelTime::ZERO))
            );
        }
    }
}
