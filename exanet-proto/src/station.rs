//! One node as both drivers run it: its [`Node`] (switch and NI), the service to the
//! workloads attached to it, and the sending end of each of its links with the session
//! over it: the hello each end sends and checks, a newer session replacing an older one,
//! the operator's faults and cut, the frames those faults hold back and the credit of the
//! cells they lost.
//!
//! The daemon (`exanetd`) carries a station's output over QUIC and feeds it what arrives,
//! with clock times; the simulator ([`crate::sim`]) carries it through its event queue in
//! simulated time. Neither decides anything about a link session: that is here, so a
//! cut, a hello refused or a replaced session does the same thing in both.
//!
//! Like the node it holds, a station acts on what it is given only when pumped: a driver
//! calls [`Station::pump`] after each batch of inputs (frames, a hello, a timeout, a
//! workload's commands), once, however many inputs the batch had.

use std::collections::VecDeque;

use bytes::BytesMut;

use crate::cell::CellError;
use crate::cut::{self, Cut};
use crate::fault::{FaultError, FaultStats, LinkFaults};
use crate::frame::{self, Frame, FrameError, Hello};
use crate::horizon::NodeCut;
/// A frame leaving on a link, as a station hands it to its [`Wire`].
pub use crate::link::Departure;
use crate::link::LinkSender;
use crate::metric::LinkStats;
use crate::model::ModelTime;
use crate::ni::{Memory, Ni};
use crate::node::{Node, NodeEvent};
use crate::routing::Vc;
use crate::shape::{NodeId, Shape};
use crate::switch::SwitchError;
use crate::time::Instant;
use crate::topology::{neighbour, node_links, LinkKind, Port, NPORTS};
use crate::workload::{Finished, Relayed, WorkloadService};

/// Names one session of one link end; never reused by a station.
pub type SessionId = u64;

/// Switch errors kept for the driver to look at (beyond these they are only counted).
const ERRORS_KEPT: usize = 256;

/// Why a peer's hello was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("peer speaks link version {0}, this node {ver}", ver = frame::VERSION)]
    Version(u8),
    #[error("peer belongs to another rack (digest {0:#x})")]
    OtherRack(u64),
    #[error("peer runs a {x}x{y}x{z} rack, this one is {mine}", x = .0 .0, y = .0 .1, z = .0 .2, mine = .1)]
    Shape((u16, u16, u16), Shape),
    #[error("peer claims to be node {claimed} port {claimed_port} on our port {port}, which is not our neighbour there")]
    NotNeighbour {
        claimed: NodeId,
        claimed_port: Port,
        port: Port,
    },
}

impl HelloError {
    /// The error counter it moves.
    pub fn kind(&self) -> &'static str {
        match self {
            HelloError::Version(_) => "hello_version",
            HelloError::OtherRack(_) => "hello_rack",
            HelloError::Shape(..) => "hello_shape",
            HelloError::NotNeighbour { .. } => "hello_neighbour",
        }
    }
}

/// Why a link session could not start.
#[derive(Debug, thiserror::Error)]
pub enum SessionRefused {
    #[error("this node has no link on port {0}")]
    NoLink(Port),
    #[error("the link is set down by the operator")]
    AdminDown,
    #[error(transparent)]
    Switch(#[from] SwitchError),
}

/// Why a session ended, as the end that closes it tells the other (the QUIC close code on
/// a daemon's link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The connection failed or the daemon is stopping.
    Shutdown,
    /// The peer broke the link protocol: no hello, a refused hello, a stream out of sync.
    Protocol,
    /// A newer session on the same link took over.
    Replaced,
    /// The operator set the link down.
    AdminDown,
}

impl SessionEnd {
    pub fn code(self) -> u32 {
        match self {
            SessionEnd::Shutdown => 0,
            SessionEnd::Protocol => 1,
            SessionEnd::Replaced => 2,
            SessionEnd::AdminDown => 3,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SessionEnd::Shutdown => "shutdown",
            SessionEnd::Protocol => "protocol",
            SessionEnd::Replaced => "replaced",
            SessionEnd::AdminDown => "link set down",
        }
    }
}

/// The frame of a session that is no longer the current one on its port: the driver
/// should stop serving that session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("session {sid} on port {port} is not the current one")]
pub struct NotCurrent {
    pub port: Port,
    pub sid: SessionId,
}

/// What setting faults did to the link's session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultsSet {
    /// The session the operator's cut ended: the driver closes its connection
    /// ([`SessionEnd::AdminDown`]).
    pub ended: Option<SessionId>,
    /// The link was set up again: its dialer may connect.
    pub up_again: bool,
}

/// Where a station's output goes: a daemon encodes it into a link's byte stream, the
/// simulator puts it on its event queue.
pub trait Wire {
    fn hello(&mut self, hello: &Hello);
    fn frame(&mut self, d: Departure) -> Result<(), CellError>;
}

impl Wire for BytesMut {
    fn hello(&mut self, hello: &Hello) {
        frame::encode_hello(hello, self);
    }

    fn frame(&mut self, d: Departure) -> Result<(), CellError> {
        d.encode(self)
    }
}

/// What a station reports to its driver.
#[derive(Debug)]
pub enum StationEvent {
    /// A node event the workload service did not take: probe replies, load reports, NI
    /// events of ranks nobody attached.
    Node(NodeEvent),
    /// An operation of an attached workload ended.
    Finished(Finished),
}

/// One port's link: who is at the other end, the session over it, and what this end
/// sends through.
#[derive(Debug)]
pub struct LinkEnd {
    pub peer: NodeId,
    pub peer_port: Port,
    pub kind: LinkKind,
    session: Option<SessionId>,
    sessions: u64,
    /// Our hello for the current session, until the driver takes it.
    hello: Option<Hello>,
    sender: LinkSender,
    admin_down: bool,
    stats: LinkStats,
}

impl LinkEnd {
    pub fn session(&self) -> Option<SessionId> {
        self.session
    }

    /// Sessions started on this link so far.
    pub fn sessions(&self) -> u64 {
        self.sessions
    }

    /// Cut by the operator: no session starts until it is set up again.
    pub fn is_admin_down(&self) -> bool {
        self.admin_down
    }

    /// What this end counted (see [`LinkStats`]).
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    pub fn faults(&self) -> &LinkFaults {
        self.sender.faults()
    }

    pub fn fault_stats(&self) -> FaultStats {
        self.sender.stats()
    }

    /// Bytes the faults hold back right now.
    pub fn held_bytes(&self) -> usize {
        self.sender.held_bytes()
    }

    /// Credit of lost cells waits for [`Station::settle_owed`].
    pub fn owes(&self) -> bool {
        self.sender.owes()
    }
}

pub struct Station {
    node: Node,
    workloads: WorkloadService,
    ends: Vec<Option<LinkEnd>>,
    /// Identifies the rack in hellos, so that nodes of different racks never link.
    rack: u64,
    next_session: SessionId,
    /// Ports with output (or a session change) the driver has not looked at.
    ready: [bool; NPORTS],
    events: VecDeque<StationEvent>,
    errors: Vec<SwitchError>,
    /// This node's part in the latest cut of the rack (see [`crate::cut`]).
    cut: Cut,
    /// The last horizons said nothing was pending anywhere (or none came yet): work
    /// that appears here must wake the rack's cut coordinator, which takes no cut of an
    /// idle rack.
    rack_idle: bool,
    /// Its part of the latest cut it began said it was quiet: the coordinator leaves it
    /// out of the next cuts, so it sends no cell until it begins one again (what it sent
    /// would be in no cut's view).
    quiet: bool,
    /// Quiet, it has woken the coordinator (once per quiet spell).
    quiet_woke: bool,
    /// A cell came in since it began its latest cut.
    got_cell: bool,
    /// Ports it sent cells on since it began its latest cut (bit per port index).
    sent: u16,
    /// Ports its parts said it sent cells on, of cuts whose horizons have not come: a cut
    /// given up (a node reconnected) drops its parts, and the next one must say them
    /// again, or a quiet neighbour holding such a cell is left out of it.
    sent_unsettled: u16,
    /// The ranks attached when it began its latest cut: a process that attaches while it
    /// is quiet wakes the coordinator (its program's first posts must be in a cut).
    attached_at_begin: usize,
}

impl Station {
    /// A station for `node` with every link down. Each link direction draws its faults
    /// from its own generator, started from `seed`, the node and the port (a fault plan
    /// reseeds them).
    pub fn new(node: Node, workloads: WorkloadService, rack: u64, seed: u64) -> Station {
        let id = node.id();
        let shape = *node.switch().shape();
        let mut ends: Vec<Option<LinkEnd>> = (0..NPORTS).map(|_| None).collect();
        for l in node_links(&shape, id) {
            let (Some(port), Some((peer, peer_port))) = (l.port_of(id), l.other(id)) else {
                continue;
            };
            ends[port.index()] = Some(LinkEnd {
                peer,
                peer_port,
                kind: l.kind,
                session: None,
                sessions: 0,
                hello: None,
                sender: LinkSender::new(seed ^ (u64::from(id.0) << 8 | port.index() as u64)),
                admin_down: false,
                stats: LinkStats::default(),
            });
        }
        Station {
            node,
            workloads,
            ends,
            rack,
            next_session: 1,
            ready: [false; NPORTS],
            events: VecDeque::new(),
            errors: Vec::new(),
            cut: Cut::default(),
            rack_idle: true,
            quiet: false,
            quiet_woke: false,
            got_cell: false,
            sent: 0,
            sent_unsettled: 0,
            attached_at_begin: 0,
        }
    }

    pub fn id(&self) -> NodeId {
        self.node.id()
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The node, to give it work; call [`pump`](Self::pump) after.
    pub fn node_mut(&mut self) -> &mut Node {
        &mut self.node
    }

    /// The workload service with the NI and memory it serves the workloads with; call
    /// [`pump`](Self::pump) after giving it work.
    pub fn workloads(&mut self) -> (&mut WorkloadService, &mut Ni, &mut (dyn Memory + Send)) {
        let (ni, mem) = self.node.ni_mut();
        (&mut self.workloads, ni, mem)
    }

    pub fn workload_service(&self) -> &WorkloadService {
        &self.workloads
    }

    /// Moves what `rank`'s completion ring has room for into it (call it when the
    /// workload may have made room).
    pub fn drain(&mut self, rank: u8) {
        let (svc, ni, _) = self.workloads();
        svc.drain(ni, rank);
    }

    pub fn end(&self, port: Port) -> Option<&LinkEnd> {
        self.ends.get(port.index())?.as_ref()
    }

    fn end_mut(&mut self, port: Port) -> Option<&mut LinkEnd> {
        self.ends.get_mut(port.index())?.as_mut()
    }

    /// This node's links, by port.
    pub fn ends(&self) -> impl Iterator<Item = (Port, &LinkEnd)> {
        Port::all().filter_map(|p| Some((p, self.end(p)?)))
    }

    /// The port whose link leads to `peer`.
    pub fn port_to(&self, peer: NodeId) -> Option<Port> {
        self.ends().find(|(_, e)| e.peer == peer).map(|(p, _)| p)
    }

    /// The port a hello comes in on, from who it says it is (an acceptor does not know
    /// before reading it); `None` when the sender is no neighbour of ours.
    pub fn port_of_hello(&self, h: &Hello) -> Option<Port> {
        self.ends()
            .find(|(_, e)| e.peer == h.node && e.peer_port == h.port)
            .map(|(p, _)| p)
    }

    pub fn is_admin_down(&self, port: Port) -> bool {
        self.end(port).is_some_and(|e| e.admin_down)
    }

    pub fn count_error(&mut self, kind: &'static str) {
        self.node.count_error(kind);
    }

    /// Starts a session on `port`, replacing any older one (a peer that restarted
    /// reconnects before the old session is seen to die), and queues our hello.
    pub fn begin_session(&mut self, port: Port, now: Instant) -> Result<SessionId, SessionRefused> {
        let me = self.node.id();
        let shape = *self.node.switch().shape();
        let end = self.end(port).ok_or(SessionRefused::NoLink(port))?;
        if end.admin_down {
            self.node.count_error("link_admin_down");
            return Err(SessionRefused::AdminDown);
        }
        if end.session.is_some() {
            self.node.link_down(port, now)?;
        }
        let grant = self.node.link_up(port)?;
        let sid = self.next_session;
        self.next_session += 1;
        let rack = self.rack;
        let marker = self.cut.session_up(port);
        let end = self.end_mut(port).ok_or(SessionRefused::NoLink(port))?;
        end.session = Some(sid);
        end.sessions += 1;
        // What the old session held back or owed died with its connection, and the new one
        // starts from its peer's grant: handing old credit back on top would overrun it.
        end.sender.reset();
        end.hello = Some(Hello::new(me, port, &shape, rack, grant));
        if let Some(epoch) = marker {
            end.sender.send_marker(now, epoch);
        }
        self.ready[port.index()] = true;
        Ok(sid)
    }

    /// Checks a peer's hello against what this port's neighbour must say.
    pub fn check_hello(&self, port: Port, h: &Hello) -> Result<(), HelloError> {
        let shape = *self.node.switch().shape();
        if h.version != frame::VERSION {
            return Err(HelloError::Version(h.version));
        }
        if h.rack != self.rack {
            return Err(HelloError::OtherRack(h.rack));
        }
        if h.shape != (shape.x() as u16, shape.y() as u16, shape.z() as u16) {
            return Err(HelloError::Shape(h.shape, shape));
        }
        match neighbour(&shape, self.node.id(), port) {
            Some((n, p)) if n == h.node && p == h.port => Ok(()),
            _ => Err(HelloError::NotNeighbour {
                claimed: h.node,
                claimed_port: h.port,
                port,
            }),
        }
    }

    /// The peer's hello on session `sid`: checked (a refusal is counted, and the driver
    /// ends the session with [`SessionEnd::Protocol`]), then the link may carry cells.
    pub fn on_hello(
        &mut self,
        port: Port,
        sid: SessionId,
        h: &Hello,
        now: Instant,
    ) -> Result<(), HelloError> {
        if let Err(e) = self.check_hello(port, h) {
            self.node.count_error(e.kind());
            return Err(e);
        }
        if self.end(port).and_then(|e| e.session) == Some(sid) {
            let _ = self.node.peer_grant(port, h.grant, now);
        }
        Ok(())
    }

    /// Frames that arrived on session `sid` of `port`, after its hello.
    pub fn on_frames(
        &mut self,
        port: Port,
        sid: SessionId,
        frames: impl IntoIterator<Item = Frame>,
        now: Instant,
    ) -> Result<(), NotCurrent> {
        if self.end(port).and_then(|e| e.session) != Some(sid) {
            return Err(NotCurrent { port, sid });
        }
        for f in frames {
            let r = match f {
                Frame::Cell(vc, cell) => {
                    self.got_cell = true;
                    self.cut.cell(port, cell.stamp.head);
                    self.node.receive(port, vc, cell, now)
                }
                Frame::Credit(vc, n, freed) => self.node.credit(port, vc, n, freed, now),
                Frame::Marker(epoch) => {
                    // A node begins a cut only when the coordinator tells it which of its
                    // neighbours are in it; what came in before the marker is then in its
                    // part.
                    self.cut.marker(port, epoch);
                    Ok(())
                }
                Frame::Hello(_) => {
                    self.node.count_error("hello_repeated");
                    Ok(())
                }
            };
            if let Err(e) = r {
                self.keep_error(e);
            }
        }
        Ok(())
    }

    /// A frame from the peer on `port` that could not be decoded (counted). A cell whose
    /// frame length was sound cost the sender credit, which is refunded. Returns whether
    /// the stream is out of sync, so that the session must end.
    pub fn on_bad_frame(&mut self, port: Port, e: &FrameError) -> bool {
        self.node.count_error(e.kind());
        if let FrameError::Cell { vc, len, .. } = *e {
            if let Some(end) = self.end_mut(port) {
                end.stats.rx_corrupt_cells += 1;
            }
            if let Err(e) = self.node.refund(port, vc, len) {
                self.keep_error(e);
            }
        }
        e.is_fatal()
    }

    /// Ends session `sid` on `port` if it is still the current one: what was on the wire
    /// is lost with it; cells queued for the link wait in the switch.
    pub fn end_session(&mut self, port: Port, sid: SessionId, now: Instant) -> bool {
        let Some(end) = self.end_mut(port).filter(|e| e.session == Some(sid)) else {
            return false;
        };
        end.session = None;
        end.hello = None;
        end.sender.reset();
        self.ready[port.index()] = true;
        self.cut.link_down(port);
        if let Err(e) = self.node.link_down(port, now) {
            self.keep_error(e);
        }
        true
    }

    /// Hands the credit of cells the faults lost on `port` back to this end's output;
    /// false when none was owed. Drivers call it when they next serve the link, not from
    /// inside the pump that lost them (a loss owes its credit rather than returning it in
    /// the same pump, which a link losing every cell would never leave).
    pub fn settle_owed(&mut self, port: Port, now: Instant) -> bool {
        let Some(owed) = self.end_mut(port).and_then(|e| e.sender.take_owed()) else {
            return false;
        };
        for (vc, &n) in owed.iter().enumerate().filter(|(_, n)| **n > 0) {
            // Lost on the wire: they never held modeled buffer space.
            if let Err(e) = self
                .node
                .credit(port, Vc(vc as u8), n, ModelTime::ZERO, now)
            {
                self.keep_error(e);
            }
        }
        true
    }

    /// Puts what session `sid` of `port` sends now on `wire`: our hello first, then the
    /// frames that left the sender and those the faults held back that fell due. Returns
    /// when the next held frame falls due.
    pub fn take_output(
        &mut self,
        port: Port,
        sid: SessionId,
        now: Instant,
        wire: &mut impl Wire,
    ) -> Result<Option<Instant>, NotCurrent> {
        let end = self
            .ends
            .get_mut(port.index())
            .and_then(|e| e.as_mut())
            .filter(|e| e.session == Some(sid))
            .ok_or(NotCurrent { port, sid })?;
        if let Some(h) = end.hello.take() {
            wire.hello(&h);
        }
        let mut unencodable = 0;
        while let Some(d) = end.sender.poll(now) {
            unencodable += usize::from(wire.frame(d).is_err());
        }
        let due = end.sender.poll_at();
        for _ in 0..unencodable {
            // Cells in the core were validated on the way in; a bug.
            self.node.count_error("encode");
        }
        Ok(due)
    }

    /// Begins this node's part of cut `epoch` (see [`crate::cut`]), unless it has begun it
    /// or a later one: records what it holds and sends a marker on every link that is up
    /// to a neighbour in the cut (`waits`, bit per port index, whose markers it waits for
    /// in turn) or that it sent cells on since its previous part (that neighbour must join
    /// the cut and waits for it).
    pub fn begin_cut(&mut self, epoch: u64, waits: u16, now: Instant) {
        if epoch <= self.cut.epoch() {
            return;
        }
        // What its programs are doing, and the work the NI was given since it last ran.
        let (ni, _) = self.node.ni_mut();
        self.workloads.refresh_programs(ni, now);
        self.node.refresh_ni_horizon();
        let ports: Vec<Port> = self.ends().map(|(p, _)| p).collect();
        let up: Vec<Port> = self
            .ends()
            .filter(|(_, e)| e.session.is_some())
            .map(|(p, _)| p)
            .collect();
        if self.quiet {
            // Left out of the cuts since it was quiet, it kept the horizons of the last cut
            // it was in: bounds while every promise held, but a process that attached or
            // posted behind them since (they are taken, and counted late) makes them too
            // high. It forwards nothing in modeled order until this cut's come.
            for &p in &ports {
                self.node.set_horizon(p, ModelTime::ZERO);
            }
        }
        let sent = std::mem::take(&mut self.sent) | self.sent_unsettled;
        self.sent_unsettled = sent;
        self.attached_at_begin = self.workloads.attached();
        let held = cut::holdings(&self.node, &ports, sent);
        // Quiet at its cut point, it stops sending there: a cell it forwarded after it
        // would be in no later cut it is left out of.
        self.quiet = held.quiet;
        self.quiet_woke = false;
        self.got_cell = false;
        self.cut.begin(epoch, held, &up, waits);
        let markers = waits | sent;
        for p in up {
            if markers & (1 << p.index()) == 0 {
                continue;
            }
            if let Some(end) = self.ends[p.index()].as_mut() {
                end.sender.send_marker(now, epoch);
                self.ready[p.index()] = true;
            }
        }
    }

    /// This node's part of the latest cut, once complete (see [`crate::cut`]).
    pub fn take_cut(&mut self) -> Option<NodeCut> {
        self.cut.take()
    }

    /// Applies a coordinator's horizons to this node's link inputs (see
    /// [`crate::horizon`]), in place of the last cut's: the coordinator sends them in cut
    /// order, and a later cut knows more. Keeping the later of the two let a horizon
    /// outlive a promise broken since (a program taken for gone that comes back and posts
    /// behind what its NI promised for it, up to the wall clock): every later cell on that
    /// link came in below it and was served out of modeled order for the rest of the run
    /// (on 128 ranks, a few cells of every collective). `pending`:
    /// whether anything was pending in the cut they come from (if not, the rack is idle
    /// and takes no cut until some node wakes it).
    pub fn set_horizons(&mut self, horizons: &[(Port, ModelTime)], pending: bool) {
        // The cut its last part was of is complete (the coordinator starts the next only
        // then, and sends in order): what that part said it sent is settled.
        self.sent_unsettled = 0;
        for &(port, h) in horizons {
            self.node.set_horizon(port, h);
        }
        self.rack_idle = !pending;
    }

    /// Whether this node must wake the cut coordinator now: the rack was idle and this
    /// node has work. True once per idle spell; the driver then asks the coordinator
    /// for a cut ([`crate::horizon::Coordinator::wake`]).
    ///
    /// A quiet node (left out of the cuts) wakes it once when it has work or a cell came in
    /// (delivered to its NI, it may make a program post): the next cut has it.
    pub fn take_wake(&mut self) -> bool {
        let quiet_asleep = self.quiet && !self.quiet_woke;
        // Called after every pump: whether the node is busy (its NI's work, scanned) is
        // asked only when the answer can wake anyone.
        if !quiet_asleep && !self.rack_idle {
            return false;
        }
        let busy = self.node.busy();
        let quiet = quiet_asleep
            && (busy || self.got_cell || self.workloads.attached() != self.attached_at_begin);
        let wake = quiet || (self.rack_idle && busy);
        if wake {
            self.rack_idle = false;
            self.quiet_woke |= self.quiet;
        }
        wake
    }

    /// The coordinator is (re)connected and knows nothing of this node: work here, even
    /// work from before, wakes it.
    pub fn assume_rack_idle(&mut self) {
        self.rack_idle = true;
    }

    /// Ports with output or a session change since the last call.
    pub fn take_ready(&mut self) -> impl Iterator<Item = Port> {
        let ready = std::mem::take(&mut self.ready);
        Port::all().filter(move |p| ready[p.index()])
    }

    /// Sets the faults on what this node sends on `port`. Setting the link down ends its
    /// session at once and refuses new ones until it is set up again.
    pub fn set_faults(
        &mut self,
        port: Port,
        faults: LinkFaults,
        seed: Option<u64>,
        now: Instant,
    ) -> Result<FaultsSet, FaultError> {
        let Some(end) = self.end_mut(port) else {
            return Ok(FaultsSet::default());
        };
        if let Some(seed) = seed {
            end.sender.reseed(seed);
        }
        end.sender.set_faults(faults, now)?;
        let was_down = std::mem::replace(&mut end.admin_down, faults.down);
        let mut set = FaultsSet::default();
        if faults.down && !was_down {
            if let Some(sid) = end.session {
                self.end_session(port, sid, now);
                set.ended = Some(sid);
            }
        } else if !faults.down && was_down {
            set.up_again = true;
        }
        // Held frames may have just fallen due.
        self.ready[port.index()] = true;
        Ok(set)
    }

    /// Moves what the node wants sent onto its links' senders and its events to the
    /// driver.
    pub fn pump(&mut self, now: Instant) {
        // Quiet, it sends no cell until it begins a cut (see `begin_cut`): the switch
        // keeps them.
        while let Some(t) = (!self.quiet)
            .then(|| self.node.poll_transmit(now))
            .flatten()
        {
            let i = t.port.index();
            self.sent |= 1 << i;
            match self.ends[i].as_mut().filter(|e| e.session.is_some()) {
                Some(end) => {
                    self.ready[i] = true;
                    let (node, port, vc) = (&mut self.node, t.port, t.vc);
                    end.sender
                        .send_cell(now, vc, t.cell, |len| node.spend_credit(port, vc, len));
                }
                // The switch only transmits on ports whose session granted credit.
                None => self.node.count_error("no_session"),
            }
        }
        while let Some((port, vc, bytes, freed)) = self.node.poll_credit() {
            let i = port.index();
            if let Some(end) = self.ends[i].as_mut().filter(|e| e.session.is_some()) {
                self.ready[i] = true;
                end.sender.send_credit(now, vc, bytes, freed);
            }
        }
        while let Some(ev) = self.node.poll_event() {
            let ev = match ev {
                NodeEvent::Ni(ev) => {
                    let (ni, _) = self.node.ni_mut();
                    match self.workloads.on_event(ni, ev, now) {
                        Relayed::Queued(Some(f)) => StationEvent::Finished(f),
                        Relayed::Queued(None) => continue,
                        Relayed::NotAttached(ev) => StationEvent::Node(NodeEvent::Ni(ev)),
                        Relayed::NotRelayed => {
                            self.node.count_error("notification_not_relayed");
                            continue;
                        }
                    }
                }
                ev => StationEvent::Node(ev),
            };
            self.events.push_back(ev);
        }
    }

    pub fn poll_event(&mut self) -> Option<StationEvent> {
        self.events.pop_front()
    }

    /// When the node's NI next wants [`handle_timeout`](Self::handle_timeout).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.node.poll_timeout()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.node.poll_timeout().is_some_and(|t| t <= now) {
            self.node.handle_timeout(now);
        }
    }

    /// Switch errors since the last call (they are counted in the node's errors too).
    pub fn take_errors(&mut self) -> Vec<SwitchError> {
        std::mem::take(&mut self.errors)
    }

    fn keep_error(&mut self, e: SwitchError) {
        if self.errors.len() < ERRORS_KEPT {
            self.errors.push(e);
        }
    }

    /// True when the node is idle and nothing waits for the driver.
    pub fn is_idle(&self) -> bool {
        self.node.is_idle()
            && self.events.is_empty()
            && self
                .ends
                .iter()
                .flatten()
                .all(|e| e.hello.is_none() && e.sender.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::SwitchConfig;

    fn pair() -> (Station, Station, Port, Port) {
        let shape: Shape = "1x1x1".parse().unwrap();
        let mk = |id| {
            let node = Node::new(shape, NodeId(id), SwitchConfig::default()).unwrap();
            Station::new(node, WorkloadService::new(1), 7, 0)
        };
        let (a, b) = (mk(0), mk(1));
        let pa = a.port_to(NodeId(1)).unwrap();
        let pb = b.port_to(NodeId(0)).unwrap();
        (a, b, pa, pb)
    }

    fn hello_of(s: &mut Station, port: Port, sid: SessionId) -> Hello {
        let mut wire = BytesMut::new();
        s.take_output(port, sid, Instant::ZERO, &mut wire).unwrap();
        let mut dec = crate::frame::FrameDecoder::new();
        dec.push_bytes(wire.freeze());
        match dec.next_frame() {
            Some(Ok(Frame::Hello(h))) => h,
            f => panic!("expected a hello, got {f:?}"),
        }
    }

    #[test]
    fn a_hello_from_the_wrong_neighbour_or_rack_is_refused_and_counted() {
        let (mut a, mut b, pa, pb) = pair();
        let sa = a.begin_session(pa, Instant::ZERO).unwrap();
        let sb = b.begin_session(pb, Instant::ZERO).unwrap();
        let mut h = hello_of(&mut b, pb, sb);
        h.rack ^= 1;
        assert!(matches!(
            a.on_hello(pa, sa, &h, Instant::ZERO),
            Err(HelloError::OtherRack(_))
        ));
        h.rack ^= 1;
        h.node = NodeId(2);
        assert!(matches!(
            a.on_hello(pa, sa, &h, Instant::ZERO),
            Err(HelloError::NotNeighbour { .. })
        ));
        let errors = &a.node().stats().errors;
        assert_eq!(
            (errors.get("hello_rack"), errors.get("hello_neighbour")),
            (Some(&1), Some(&1))
        );
    }

    /// A cut's horizons replace the last cut's, lower ones too: a horizon kept because
    /// it was later outlived the promise it came from once that was broken (a program
    /// taken for gone posting behind it), and held every later cell on the link below
    /// it, out of modeled order.
    #[test]
    fn a_cuts_horizons_replace_the_last_cuts() {
        let (mut a, _, pa, _) = pair();
        let wall = ModelTime(1_000_000_000_000);
        let modeled = ModelTime(5_000_000);
        a.set_horizons(&[(pa, wall)], true);
        assert_eq!(a.node().switch().horizon(pa), wall);
        a.set_horizons(&[(pa, modeled)], true);
        assert_eq!(a.node().switch().horizon(pa), modeled, "the later cut's");
    }

    /// A part says which ports the node sent cells on until a cut it was of completes:
    /// a cut given up (a node reconnected) drops its parts, and the cut taken again must
    /// say them again, or a quiet neighbour holding such a cell is left out of it and the
    /// horizons past that cell are too high (found in review).
    #[test]
    fn what_a_part_said_it_sent_is_said_again_until_its_cut_completes() {
        let (mut a, _, pa, _) = pair();
        let bit = 1 << pa.index();
        // As `pump` records a cell sent on `pa`.
        a.sent = bit;
        a.begin_cut(1, 0, Instant::ZERO);
        assert_eq!(a.take_cut().map(|p| p.sent), Some(bit));
        // Cut 1 given up: cut 2 begins with no horizons in between.
        a.begin_cut(2, 0, Instant::ZERO);
        assert_eq!(a.take_cut().map(|p| p.sent), Some(bit), "said again");
        a.set_horizons(&[], false);
        a.begin_cut(3, 0, Instant::ZERO);
        assert_eq!(a.take_cut().map(|p| p.sent), Some(0), "settled");
    }

    #[test]
    fn a_newer_session_replaces_the_older_and_an_admin_cut_refuses_new_ones() {
        let (mut a, _, pa, _) = pair();
        let s1 = a.begin_session(pa, Instant::ZERO).unwrap();
        let s2 = a.begin_session(pa, Instant::ZERO).unwrap();
        assert_ne!(s1, s2);
        let mut wire = BytesMut::new();
        assert_eq!(
            a.take_output(pa, s1, Instant::ZERO, &mut wire),
            Err(NotCurrent { port: pa, sid: s1 })
        );
        assert!(!a.end_session(pa, s1, Instant::ZERO), "s1 is not current");
        assert_eq!(a.end(pa).unwrap().sessions(), 2);
        let cut = LinkFaults {
            down: true,
            ..Default::default()
        };
        let set = a.set_faults(pa, cut, None, Instant::ZERO).unwrap();
        assert_eq!(set.ended, Some(s2));
        assert!(a.end(pa).unwrap().session().is_none());
        assert!(matches!(
            a.begin_session(pa, Instant::ZERO),
            Err(SessionRefused::AdminDown)
        ));
        let set = a
            .set_faults(pa, LinkFaults::default(), None, Instant::ZERO)
            .unwrap();
        assert!(set.up_again && set.ended.is_none());
        assert!(a.begin_session(pa, Instant::ZERO).is_ok());
    }
}
