//! An `FI_EP_RDM` endpoint: a mailbox (its address), a packetizer interface and an RDMA
//! page of the process's attachment, driving the message protocol ([`crate::msg`]) with
//! the client library. Safe Rust: what touches the application's memory is a
//! [`RecvBuf`], which the C entry points implement over the memory the application
//! promised them.
//!
//! Progress happens in the application's calls (posting an operation, reading a bound
//! completion queue): completed packetizer messages and reads are collected, the mailbox
//! is drained (while the unexpected queue has room), what the protocol asks is posted on
//! free channels (or waits for one), and what ended becomes completions.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use exanet::{Error, NackReason, NodeId, OpError, Tag};

use crate::abi::*;
use crate::av::Av;
use crate::cntr::Cntr;
use crate::cq::{lock, Charge, Completion, Cq, Failed};
use crate::msg::matching::Accepts;
use crate::msg::{
    Action, Arrived, Complete, Config, Data, Delivery, Engine, Event, Failure, Outgoing, Peer,
    RmaData, RmaRefusal, RmaTarget,
};
use crate::staging::{Slot, Staging};

/// Unread messages the endpoint's mailbox holds before the NI refuses more.
const MAILBOX_CAPACITY: u32 = 1024;

/// Where a receive puts its message: the application's memory, behind the C entry
/// points (which took the application's promise that it stays valid until the receive
/// completes), or nothing.
pub trait RecvBuf: Send + std::fmt::Debug {
    /// Bytes it holds.
    fn len(&self) -> usize;
    /// Its address, as the completion reports it.
    fn addr(&self) -> usize;
    /// Copies what fits of `data` from `offset` on; returns how much.
    fn write_at(&self, offset: usize, data: &[u8]) -> usize;
    /// Copies what fits of `data`; returns how much.
    fn write(&self, data: &[u8]) -> usize {
        self.write_at(0, data)
    }
    /// It takes a message into nothing on purpose (`FI_DISCARD`): whatever its length,
    /// that is no truncation.
    fn discards(&self) -> bool {
        false
    }
}

/// A multi-receive buffer (`FI_MULTI_RECV`), shared by the receives that fill it.
type Whole = Arc<Mutex<Box<dyn RecvBuf>>>;

/// What is left of a multi-receive buffer from `offset` on: the receive that takes its
/// next message.
#[derive(Debug)]
struct Part {
    whole: Whole,
    offset: usize,
}

impl RecvBuf for Part {
    fn len(&self) -> usize {
        lock(&self.whole).len().saturating_sub(self.offset)
    }
    fn addr(&self) -> usize {
        lock(&self.whole).addr() + self.offset
    }
    fn write_at(&self, offset: usize, data: &[u8]) -> usize {
        lock(&self.whole).write_at(self.offset + offset, data)
    }
}

/// A multi-receive buffer being filled: messages land one after another in the order
/// they are matched (each at an 8-byte boundary of memory, so that what a library reads
/// there is aligned; a message read by rendezvous has its room from the moment it is
/// matched), each completing on its own, until less than the endpoint's
/// `FI_OPT_MIN_MULTI_RECV` is left. The last completion of the buffer carries
/// `FI_MULTI_RECV`: the buffer is the application's again. A message longer than what
/// is left is not cut: the buffer ends there (given back with its last message's
/// completion, or by a completion with `FI_MULTI_RECV` alone) and the message goes to the
/// next receive. What is left keeps the buffer's place among the posted receives.
#[derive(Debug)]
struct Multi {
    whole: Whole,
    used: usize,
    accepts: Accepts,
    context: usize,
    completes: Completes,
    /// Its place among the posted receives, which each part keeps (none before the first).
    order: Option<u64>,
    /// Messages it took whose data is not in yet (rendezvous reads).
    pending: usize,
    /// The receive op of its part posted now, waiting for a message.
    posted: Option<u64>,
    /// No part of it is posted any more: it is given back once `pending` is 0.
    ended: bool,
}

/// No memory: a receive that takes a message into nothing (a discarded probe's).
#[derive(Debug)]
pub struct NoBuf;

impl RecvBuf for NoBuf {
    fn len(&self) -> usize {
        0
    }
    fn addr(&self) -> usize {
        0
    }
    fn write_at(&self, _: usize, _: &[u8]) -> usize {
        0
    }
    fn discards(&self) -> bool {
        true
    }
}

/// The memory regions the application registered (`fi_mr_reg`), behind the C entry
/// points: what a one-sided operation served here reads or writes, checked against the
/// region's key, bounds and access.
pub trait Regions: Send + Sync {
    /// Writes `data` at `addr` of region `key`.
    fn store(&self, key: u64, addr: u64, data: &[u8]) -> Result<(), RmaRefusal>;
    /// Reads `out.len()` bytes at `addr` of region `key`.
    fn load(&self, key: u64, addr: u64, out: &mut [u8]) -> Result<(), RmaRefusal>;
    /// Whether region `key` allows a remote write (`write`) or read of `len` bytes at
    /// `addr`: asked before memory is set aside for one.
    fn check(&self, key: u64, addr: u64, len: usize, write: bool) -> Result<(), RmaRefusal>;
}

/// Where an endpoint's request ids start: from the clock, so that two endpoints opened
/// one after the other on the same mailbox do not share ids.
fn first_id() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| {
            d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(20)
        })
}

/// How long closing an endpoint goes on delivering what it owes ([`Endpoint::linger`]):
/// long past a round trip between daemons and a mailbox's drain, short enough that a
/// program whose peer never reads does not hang in its close.
pub const LINGER: Duration = Duration::from_secs(5);

/// Why an operation was not taken (a positive libfabric error number).
pub type Errno = i32;

/// Whether an operation asks for a completion (under `FI_SELECTIVE_COMPLETION` only
/// those flagged `FI_COMPLETION` get one; failures always do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completes {
    /// A call without flags: as the endpoint's operation flags say.
    ByDefault,
    /// A `*msg` call: as its flags say (`FI_COMPLETION`, `FI_DELIVERY_COMPLETE`).
    Flagged(u64),
    /// `fi_inject`: never.
    Never,
}

/// What a probe (`FI_PEEK`) does with the message it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Leaves it.
    Peek,
    /// Sets it aside for a receive with `FI_CLAIM`.
    Claim,
    /// Throws it away.
    Discard,
}

#[derive(Debug)]
struct SendOp {
    context: usize,
    flags: u64,
    len: usize,
    /// No completion when it succeeds (`fi_inject`, or `FI_SELECTIVE_COMPLETION`).
    silent: bool,
    /// `fi_inject`: no completion at all, not even a failure's (its context is the
    /// application's null: Open MPI takes an error entry's context for its request and
    /// crashed on one, at address 0x50).
    inject: bool,
    /// Its destination, named when it cannot be reached.
    to: Peer,
}

impl SendOp {
    /// Its completion entry.
    fn entry(&self) -> Completion {
        Completion {
            context: self.context,
            flags: self.flags,
            len: self.len,
            ..Completion::default()
        }
    }
}

#[derive(Debug)]
struct RecvOp {
    context: usize,
    flags: u64,
    buf: Box<dyn RecvBuf>,
    silent: bool,
    /// The multi-receive buffer it is a part of.
    multi: Option<u64>,
}

impl RecvOp {
    /// Its completion entry, before anything is known of a message.
    fn entry(&self) -> Completion {
        Completion {
            context: self.context,
            flags: self.flags,
            buf: self.buf.addr(),
            ..Completion::default()
        }
    }
}

/// A one-sided operation this endpoint started.
#[derive(Debug)]
struct RmaOp {
    context: usize,
    flags: u64,
    len: usize,
    silent: bool,
    /// `fi_inject_write`: no completion at all (see [`SendOp::inject`]).
    inject: bool,
    /// A write's staged data, or where a read's bytes land.
    slot: Option<Slot>,
    /// A read's destination.
    buf: Option<Box<dyn RecvBuf>>,
    /// Its completion went out; it waits only for its memory to be released.
    done: bool,
}

struct Inner {
    ep: Arc<exanet::Endpoint>,
    regions: Arc<dyn Regions>,
    rmas: HashMap<u64, RmaOp>,
    /// RDMA writes of served reads: (tag, reply, the staging they write from).
    pushes: Vec<(Tag, u64, Slot)>,
    /// A served read's bytes, loaded, until its write is posted.
    push_slots: HashMap<u64, Slot>,
    mailbox: exanet::Mailbox,
    tx: exanet::Packetizer,
    rdma: exanet::RdmaPage,
    engine: Engine,
    av: Option<Arc<Av>>,
    txcq: Option<Arc<Cq>>,
    rxcq: Option<Arc<Cq>>,
    /// Counters and the kinds of operation each counts (`FI_SEND`, `FI_RECV`, `FI_READ`,
    /// `FI_WRITE`, `FI_REMOTE_READ`, `FI_REMOTE_WRITE`).
    cntrs: Vec<(u64, Arc<Cntr>)>,
    enabled: bool,
    /// Bound with `FI_SELECTIVE_COMPLETION`: (transmit, receive).
    selective: (bool, bool),
    /// `FI_COMPLETION` in the operation flags the endpoint was opened with.
    default_completion: (bool, bool),
    /// Rendezvous sends complete on delivery: the provider's default
    /// (`FI_EXANET_SEND_COMPLETION`), or `FI_DELIVERY_COMPLETE` in the transmit context's
    /// operation flags.
    delivery_complete: bool,
    /// Actions waiting for a free channel, in order.
    waiting: VecDeque<Action>,
    packets: Vec<(Tag, u64)>,
    fetches: Vec<(Tag, u64)>,
    staging: Staging,
    /// Where each fetch reads into, until its data is copied out.
    fetch_slots: HashMap<u64, Slot>,
    /// A rendezvous send's staged data, until the receiver has read it.
    staged: HashMap<u64, Slot>,
    sends: HashMap<u64, SendOp>,
    recvs: HashMap<u64, RecvOp>,
    next_op: u64,
    /// Multi-receive buffers being filled; their parts' receive ops name them.
    multis: HashMap<u64, Multi>,
    next_multi: u64,
    /// `FI_OPT_MIN_MULTI_RECV`: a multi-receive buffer is released once less is left.
    min_multi_recv: usize,
    /// Messages from peers that did not decode or broke the protocol.
    protocol_errors: u64,
    /// The attachment is gone (its daemon died or went away): every operation failed
    /// with `FI_EIO`, and new ones are refused with it.
    broken: bool,
    /// The engine's clock starts here (its patience with absent peers, its probes).
    opened: std::time::Instant,
    /// Destinations an injected send to failed, said once each ([`Inner::say_lost`]).
    lost_to: std::collections::HashSet<Peer>,
}

pub struct Endpoint {
    inner: Mutex<Inner>,
    me: Peer,
    directed: bool,
    /// The attachment, outside the lock: every call holds it (`exanet::Endpoint::hold`),
    /// so that the provider's own time counts as the library's, not as the program's
    /// compute.
    attachment: Arc<exanet::Endpoint>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("me", &self.me).finish()
    }
}

/// Refused for good by the destination: another job's endpoint (its PDID), or an
/// address that names no memory there.
fn is_denied(e: &Error) -> bool {
    matches!(
        e,
        Error::Op {
            error: OpError::Nacked {
                reason: Some(NackReason::PdidMismatch | NackReason::BadAddress),
                ..
            },
            ..
        }
    )
}

/// The destination's mailbox is full: its endpoint is there, busy.
fn is_full(e: &Error) -> bool {
    matches!(
        e,
        Error::Op {
            error: OpError::Nacked {
                reason: Some(NackReason::QueueFull),
                ..
            },
            ..
        }
    )
}

/// No endpoint at the destination: not yet open, or gone.
fn is_absent(e: &Error) -> bool {
    matches!(
        e,
        Error::Op {
            error: OpError::Nacked {
                reason: Some(NackReason::NoContext),
                ..
            },
            ..
        }
    )
}

impl Endpoint {
    /// Opens an endpoint of the attachment `ep`.
    /// `directed`: receives honour their source address (`FI_DIRECTED_RECV`); without
    /// it libfabric says the source of a receive is ignored.
    /// `eager_limit`: the longest message sent eager (the rack's `[ni] mpi_eager_limit`).
    /// `vi`: the mailbox its address names (a service's), else any free one.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        ep: Arc<exanet::Endpoint>,
        vi: Option<u8>,
        directed: bool,
        default_completion: (bool, bool),
        delivery_complete: bool,
        eager_limit: usize,
        regions: Arc<dyn Regions>,
    ) -> Result<Arc<Endpoint>, Error> {
        let mailbox = match vi {
            Some(vi) => ep.mailbox_at(vi, MAILBOX_CAPACITY)?,
            None => ep.mailbox(MAILBOX_CAPACITY)?,
        };
        let tx = ep.packetizer()?;
        let rdma = ep.rdma_page()?;
        let me = Peer {
            node: ep.node_id().0,
            rank: ep.rank(),
            vi: mailbox.vi(),
        };
        Ok(Arc::new(Endpoint {
            me,
            directed,
            attachment: Arc::clone(&ep),
            inner: Mutex::new(Inner {
                engine: Engine::new(
                    me,
                    Config {
                        eager_limit,
                        first_id: first_id(),
                        ..Config::default()
                    },
                ),
                ep,
                regions,
                rmas: HashMap::new(),
                cntrs: Vec::new(),
                pushes: Vec::new(),
                push_slots: HashMap::new(),
                mailbox,
                tx,
                rdma,
                av: None,
                txcq: None,
                rxcq: None,
                enabled: false,
                selective: (false, false),
                default_completion,
                delivery_complete,
                waiting: VecDeque::new(),
                packets: Vec::new(),
                fetches: Vec::new(),
                staging: Staging::default(),
                fetch_slots: HashMap::new(),
                staged: HashMap::new(),
                sends: HashMap::new(),
                recvs: HashMap::new(),
                next_op: 0,
                multis: HashMap::new(),
                next_multi: 0,
                min_multi_recv: 0,
                protocol_errors: 0,
                broken: false,
                lost_to: Default::default(),
                opened: std::time::Instant::now(),
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The endpoint, locked, when it takes operations ([`Inner::usable`]).
    fn ready(&self) -> Result<MutexGuard<'_, Inner>, Errno> {
        let i = self.lock();
        i.usable()?;
        Ok(i)
    }

    /// This endpoint's address.
    pub fn name(&self) -> Peer {
        self.me
    }

    pub fn bind_av(&self, av: Arc<Av>) {
        self.lock().av = Some(av);
    }

    /// Completions of sends (`tx`) and of receives (`rx`) go to `cq`; `selective`: only
    /// those of operations that ask for one.
    pub fn bind_cq(self: &Arc<Self>, cq: Arc<Cq>, tx: bool, rx: bool, selective: bool) {
        let me: Arc<dyn crate::cq::Progress> = self.clone();
        cq.bind(Arc::downgrade(&me));
        let mut i = self.lock();
        if tx {
            i.txcq = Some(Arc::clone(&cq));
            i.selective.0 = selective;
        }
        if rx {
            i.rxcq = Some(cq);
            i.selective.1 = selective;
        }
    }

    /// Operations of the kinds `flags` names count on `cntr`.
    pub fn bind_cntr(self: &Arc<Self>, cntr: Arc<Cntr>, flags: u64) -> Result<(), Errno> {
        const KINDS: u64 =
            FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
        if flags == 0 || flags & !KINDS != 0 {
            return Err(FI_EINVAL);
        }
        let me: Arc<dyn crate::cq::Progress> = self.clone();
        cntr.bind(Arc::downgrade(&me));
        self.lock().cntrs.push((flags, cntr));
        Ok(())
    }

    /// `fi_enable`: an address vector and both completion queues must be bound.
    pub fn enable(&self) -> Result<(), Errno> {
        let mut i = self.lock();
        if i.txcq.is_none() || i.rxcq.is_none() {
            return Err(FI_ENOCQ);
        }
        if i.av.is_none() {
            return Err(FI_ENOAV);
        }
        i.enabled = true;
        Ok(())
    }

    /// Sends `data` to `dest`.
    pub fn send(
        &self,
        dest: u64,
        data: &[u8],
        tag: Option<u64>,
        cq_data: Option<u64>,
        context: usize,
        completes: Completes,
    ) -> Result<(), Errno> {
        let _held = self.attachment.hold();
        let mut i = self.lock();
        let silent = !i.completes(completes, true);
        let to = i.ready_to(dest)?;
        let op = i.next_op;
        let out = if data.len() <= i.engine.eager_limit() {
            Outgoing::Inline(data.to_vec())
        } else {
            let slot = i.stage(data)?;
            let out = Outgoing::Staged {
                va: i.staging.va(&slot),
                len: data.len() as u64,
                complete: i.send_completes(completes),
            };
            i.staged.insert(op, slot);
            out
        };
        if let Err(e) = i.engine.send(to, tag, cq_data, out, op) {
            if let Some(slot) = i.staged.remove(&op) {
                i.staging.free(slot);
            }
            tracing::debug!("exanet-fi: send refused: {e}");
            return Err(FI_EINVAL);
        }
        i.next_op += 1;
        let flags = FI_SEND | if tag.is_some() { FI_TAGGED } else { FI_MSG };
        i.sends.insert(
            op,
            SendOp {
                context,
                flags,
                len: data.len(),
                silent,
                inject: completes == Completes::Never,
                to,
            },
        );
        i.progress();
        Ok(())
    }

    /// Writes `data` to `target` of `dest` (`fi_write`). Completes when the target has
    /// stored it.
    pub fn rma_write(
        &self,
        dest: u64,
        data: &[u8],
        target: RmaTarget,
        context: usize,
        completes: Completes,
    ) -> Result<(), Errno> {
        let _held = self.attachment.hold();
        let mut i = self.lock();
        let silent = !i.completes(completes, true);
        let to = i.ready_to(dest)?;
        let (out, slot) = if data.len() <= crate::msg::wire::EAGER_MAX {
            (RmaData::Inline(data.to_vec()), None)
        } else {
            let slot = i.stage(data)?;
            let va = i.staging.va(&slot);
            (
                RmaData::Staged {
                    len: data.len() as u64,
                    va,
                },
                Some(slot),
            )
        };
        let op = i.add_rma(RmaOp {
            context,
            flags: FI_RMA | FI_WRITE,
            len: data.len(),
            silent,
            inject: completes == Completes::Never,
            slot,
            buf: None,
            done: false,
        });
        i.engine.rma_write(to, target, out, op);
        i.progress();
        Ok(())
    }

    /// Reads `buf.len()` bytes at `target` of `src` into `buf` (`fi_read`).
    pub fn rma_read(
        &self,
        src: u64,
        buf: Box<dyn RecvBuf>,
        target: RmaTarget,
        context: usize,
        completes: Completes,
    ) -> Result<(), Errno> {
        let _held = self.attachment.hold();
        let mut i = self.lock();
        let silent = !i.completes(completes, true);
        let to = i.ready_to(src)?;
        let len = buf.len() as u64;
        let ep = Arc::clone(&i.ep);
        let slot = i.staging.alloc(&ep, len).map_err(|_| FI_ENOMEM)?;
        let va = i.staging.va(&slot);
        let op = i.add_rma(RmaOp {
            context,
            flags: FI_RMA | FI_READ,
            len: len as usize,
            silent,
            inject: false,
            slot: Some(slot),
            buf: Some(buf),
            done: false,
        });
        i.engine.rma_read(to, target, len, va, op);
        i.progress();
        Ok(())
    }

    /// Posts a receive into `buf` from `src` (`FI_ADDR_UNSPEC`: anyone); `tag` is
    /// (tag, ignore) for a tagged receive.
    pub fn recv(
        &self,
        src: u64,
        buf: Box<dyn RecvBuf>,
        tag: Option<(u64, u64)>,
        context: usize,
        completes: Completes,
    ) -> Result<(), Errno> {
        let _held = self.attachment.hold();
        let mut i = self.ready()?;
        let accepts = self.accepts(&i, src, tag)?;
        let capacity = buf.len() as u64;
        let op = i.add_recv(buf, tag.is_some(), context, completes);
        i.engine.post_recv(accepts, capacity, op);
        i.progress();
        Ok(())
    }

    /// Posts a multi-receive buffer (`FI_MULTI_RECV`, untagged): it takes messages from
    /// `src` one after another until less than `FI_OPT_MIN_MULTI_RECV` of it is left.
    pub fn recv_multi(
        &self,
        src: u64,
        buf: Box<dyn RecvBuf>,
        context: usize,
        completes: Completes,
    ) -> Result<(), Errno> {
        let _held = self.attachment.hold();
        let mut i = self.ready()?;
        let accepts = self.accepts(&i, src, None)?;
        let multi = Multi {
            whole: Arc::new(Mutex::new(buf)),
            used: 0,
            accepts,
            context,
            completes,
            order: None,
            pending: 0,
            posted: None,
            ended: false,
        };
        let id = i.next_multi;
        i.next_multi += 1;
        i.multis.insert(id, multi);
        i.post_part(id);
        i.progress();
        Ok(())
    }

    /// `FI_OPT_MIN_MULTI_RECV`.
    pub fn min_multi_recv(&self) -> usize {
        self.lock().min_multi_recv
    }

    /// Sets `FI_OPT_MIN_MULTI_RECV` for multi-receive buffers posted from now on, and for
    /// the parts of those being filled.
    pub fn set_min_multi_recv(&self, min: usize) {
        self.lock().min_multi_recv = min;
    }

    /// What a receive from `src` with `tag` (tag, ignore) accepts.
    fn accepts(&self, i: &Inner, src: u64, tag: Option<(u64, u64)>) -> Result<Accepts, Errno> {
        let from = if src == FI_ADDR_UNSPEC || !self.directed {
            None
        } else {
            Some(
                i.av.as_ref()
                    .and_then(|av| av.lookup(src))
                    .ok_or(FI_EINVAL)?,
            )
        };
        Ok(Accepts {
            from,
            tagged: tag.is_some(),
            tag: tag.map_or(0, |t| t.0),
            ignore: tag.map_or(0, |t| t.1),
        })
    }

    /// A probe (`FI_PEEK`) for a message from `src` with `tag`: completes at once on the
    /// receive queue, with the message's length, tag and data, or fails with
    /// `FI_ENOMSG`. A claim's identifier comes back for the receive that takes it.
    pub fn probe(
        &self,
        src: u64,
        tag: Option<(u64, u64)>,
        context: usize,
        probe: Probe,
    ) -> Result<Option<u64>, Errno> {
        let _held = self.attachment.hold();
        let mut i = self.ready()?;
        i.progress();
        let accepts = self.accepts(&i, src, tag)?;
        let flags = FI_RECV | if tag.is_some() { FI_TAGGED } else { FI_MSG };
        let found = match probe {
            Probe::Peek => i.engine.peek(&accepts).map(|p| (None, p)),
            Probe::Claim | Probe::Discard => i.engine.claim(&accepts).map(|(c, p)| (Some(c), p)),
        };
        let Some(cq) = i.rxcq.clone() else {
            return Err(FI_ENOCQ);
        };
        let Some((claim, p)) = found else {
            cq.failed(Failed {
                entry: Completion {
                    context,
                    flags,
                    ..Completion::default()
                },
                olen: 0,
                err: FI_ENOMSG,
            });
            return Ok(None);
        };
        // The program learns of the message: it came by now. Its receive adds the cost
        // of taking it.
        i.ep.advance_clock(exanet::ModelTime(p.at));
        let src =
            i.av.as_ref()
                .map_or(FI_ADDR_UNSPEC, |av| av.reverse(p.from));
        cq.done(Completion {
            context,
            flags: flags
                | if p.cq_data.is_some() {
                    FI_REMOTE_CQ_DATA
                } else {
                    0
                },
            len: p.len as usize,
            buf: 0,
            data: p.cq_data.unwrap_or(0),
            tag: p.tag.unwrap_or(0),
            src,
        });
        if let (Probe::Discard, Some(c)) = (probe, claim) {
            // Taken into nothing; its completion is not wanted.
            let op = i.add_recv(Box::new(NoBuf), tag.is_some(), context, Completes::Never);
            i.engine.recv_claimed(c, 0, op);
            i.progress();
            return Ok(None);
        }
        Ok(claim)
    }

    /// Receives the message a probe claimed (`FI_CLAIM`) into `buf` (empty: discards it).
    pub fn recv_claimed(
        &self,
        claim: u64,
        buf: Box<dyn RecvBuf>,
        tagged: bool,
        context: usize,
        completes: Completes,
    ) -> Result<(), Errno> {
        let _held = self.attachment.hold();
        let mut i = self.lock();
        if i.broken {
            return Err(FI_EIO);
        }
        let capacity = buf.len() as u64;
        let op = i.add_recv(buf, tagged, context, completes);
        if !i.engine.recv_claimed(claim, capacity, op) {
            i.recvs.remove(&op);
            return Err(FI_EINVAL);
        }
        i.progress();
        Ok(())
    }

    /// `fi_cancel`: cancels the posted receive with `context`, if it is still waiting.
    pub fn cancel(&self, context: usize) -> bool {
        let _held = self.attachment.hold();
        let mut i = self.lock();
        let ops: Vec<u64> = i
            .recvs
            .iter()
            .filter(|(_, r)| r.context == context)
            .map(|(op, _)| *op)
            .collect();
        let cancelled = ops.into_iter().any(|op| i.engine.cancel_recv(op));
        i.progress();
        cancelled
    }

    pub fn progress(&self) {
        let _held = self.attachment.hold();
        self.lock().progress();
    }

    /// `fi_close`: before the endpoint goes, what it owes its peers goes on being
    /// delivered for up to [`LINGER`]: messages not yet taken by their destination's NI
    /// (an injected send completes at once; one refused by a full mailbox waits to be
    /// sent again), rendezvous data not yet read, reads under way and one-sided operations
    /// being served. Closed at once, an MPI rank that sent its last message and finalized
    /// took it with it, and its peer waited for ever (MPICH's final reduce, about one run
    /// in four). What is left after that is lost, and the close says so in the log.
    pub fn linger(&self) {
        let start = std::time::Instant::now();
        loop {
            let seen = self.attachment.events();
            self.progress();
            {
                let i = self.lock();
                if i.broken || i.owes_nothing() {
                    return;
                }
            }
            if start.elapsed() >= LINGER {
                return;
            }
            // A failure here (the daemon gone) is found by the next progress.
            let _ = self
                .attachment
                .wait_events(seen, Some(Duration::from_millis(1)));
        }
    }

    /// The application found nothing to do and polls again: its time until then is
    /// waiting, not compute (`exanet::Endpoint::idle`).
    pub fn idle(&self) {
        self.attachment.idle();
    }

    /// A poll found completions: the application computes again after the call it is in,
    /// whatever earlier polls of it said (`exanet::Endpoint::busy`).
    pub fn busy(&self) {
        self.attachment.busy();
    }
}

impl crate::cq::Progress for Endpoint {
    fn hold(&self) -> exanet::Held<'_> {
        self.attachment.hold()
    }
    fn progress(&self) {
        Endpoint::progress(self)
    }
    fn idle(&self) {
        Endpoint::idle(self)
    }
    fn busy(&self) {
        Endpoint::busy(self)
    }
    fn events(&self) -> u64 {
        self.attachment.events()
    }
    fn expecting(&self) -> bool {
        let i = self.lock();
        !i.fetches.is_empty() || !i.staged.is_empty()
    }
    fn wait(&self, seen: u64, timeout: std::time::Duration) -> bool {
        // A failure here (the daemon gone) is found and reported by the next progress.
        self.attachment
            .wait_events(seen, Some(timeout))
            .unwrap_or(true)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let s = self.engine.stats();
        let (packets, rendezvous, fetches, served) = self.engine.unfinished();
        if packets + rendezvous + fetches + served + self.waiting.len() > 0 {
            tracing::warn!(
                "exanet-fi: endpoint {:?} closed with {packets} messages not yet taken by \
                 their destination, {rendezvous} rendezvous sends not yet read, {fetches} \
                 reads under way, {served} one-sided operations being served and {} \
                 operations waiting for a channel",
                self.engine.me(),
                self.waiting.len()
            );
        }
        // What the unexpected queue and the protocol's repairs did, for whoever tunes an
        // MPI run (FI_LOG_LEVEL=info).
        tracing::info!(
            "exanet-fi: endpoint {:?} closed: sent {} eager and {} by rendezvous, received \
             {} ({} unexpected), {} duplicates dropped, {} resent, {} FINs lost, {} malformed, \
             {} rendezvous sends refused after they completed; one-sided: {} started, {} \
             served ({} refused), {} answers lost; {} requests' memory kept for a late answer; \
             {} probes of peers owing an answer, {} operations failed with their peer gone",
            self.engine.me(),
            s.eager_sent,
            s.rendezvous_sent,
            s.received,
            s.unexpected,
            s.duplicates,
            s.resent,
            s.fins_lost,
            s.malformed,
            s.refused_after_completion,
            s.rma_started,
            s.rma_served,
            s.rma_refused,
            s.rma_answers_lost,
            s.memory_kept,
            s.probes,
            s.lost_to_gone_peers
        );
        if self.protocol_errors > 0 {
            tracing::warn!(
                "exanet-fi: endpoint {:?} closed after {} malformed or out-of-protocol messages",
                self.engine.me(),
                self.protocol_errors
            );
        }
    }
}

impl Inner {
    /// Nothing is owed to peers or being done for them ([`Endpoint::linger`]).
    fn owes_nothing(&self) -> bool {
        self.engine.unfinished() == (0, 0, 0, 0) && self.waiting.is_empty()
    }

    /// Whether an operation gets a completion when it succeeds.
    fn completes(&self, c: Completes, tx: bool) -> bool {
        let (selective, default) = if tx {
            (self.selective.0, self.default_completion.0)
        } else {
            (self.selective.1, self.default_completion.1)
        };
        match c {
            Completes::Never => false,
            Completes::ByDefault => !selective || default,
            Completes::Flagged(f) => !selective || f & FI_COMPLETION != 0,
        }
    }

    /// When a rendezvous send completes: once the receiver has read it (delivery
    /// completion, the default), or with `FI_EXANET_SEND_COMPLETION=transmit` when the
    /// receiver has the request, its data staged, unless the application asked for
    /// delivery completion in the endpoint's flags or the operation's.
    fn send_completes(&self, c: Completes) -> Complete {
        let delivery = match c {
            Completes::Flagged(f) => f & FI_DELIVERY_COMPLETE != 0 || self.delivery_complete,
            Completes::ByDefault => self.delivery_complete,
            Completes::Never => false,
        };
        if delivery {
            Complete::Delivery
        } else {
            Complete::Transmit
        }
    }

    /// Whether the endpoint takes operations: enabled (`FI_EOPBADSTATE` before) and its
    /// attachment alive (`FI_EIO` after it broke).
    fn usable(&self) -> Result<(), Errno> {
        if !self.enabled {
            return Err(FI_EOPBADSTATE);
        }
        if self.broken {
            return Err(FI_EIO);
        }
        Ok(())
    }

    /// The peer at `dest`, when the endpoint can start an operation.
    fn ready_to(&self, dest: u64) -> Result<Peer, Errno> {
        self.usable()?;
        self.av
            .as_ref()
            .and_then(|av| av.lookup(dest))
            .ok_or(FI_EINVAL)
    }

    /// `M1QBF2 rank 0 mailbox 3`: a peer as the rack names it (its node id where the
    /// rack file could not be read).
    fn name_peer(&self, p: Peer) -> String {
        let node = self
            .ep
            .node_name(NodeId(p.node))
            .unwrap_or_else(|_| format!("node {}", p.node));
        format!("{node} rank {} mailbox {}", p.rank, p.vi)
    }

    /// Says that `what` to `to` failed because `to` could not be reached, naming its
    /// node (a completion carries only an error code, and an injected send none), once
    /// per destination: after a node dies every message to it fails.
    fn say_lost(&mut self, to: Peer, what: &str, f: &Failure) {
        if self.lost_to.insert(to) {
            tracing::warn!(
                "exanet-fi: {}: {what} to {} failed: {f} (said once per destination)",
                self.name_peer(self.engine.me()),
                self.name_peer(to)
            );
        }
    }

    /// `data` in a piece of staging memory.
    fn stage(&mut self, data: &[u8]) -> Result<Slot, Errno> {
        let ep = Arc::clone(&self.ep);
        let slot = self
            .staging
            .alloc(&ep, data.len() as u64)
            .map_err(|_| FI_ENOMEM)?;
        if self.staging.write(&slot, data).is_err() {
            self.staging.free(slot);
            return Err(FI_EIO);
        }
        Ok(slot)
    }

    fn add_rma(&mut self, op: RmaOp) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        self.rmas.insert(id, op);
        id
    }

    fn add_recv(
        &mut self,
        buf: Box<dyn RecvBuf>,
        tagged: bool,
        context: usize,
        c: Completes,
    ) -> u64 {
        let op = self.next_op;
        self.next_op += 1;
        let silent = !self.completes(c, false);
        let flags = FI_RECV | if tagged { FI_TAGGED } else { FI_MSG };
        self.recvs.insert(
            op,
            RecvOp {
                context,
                flags,
                buf,
                silent,
                multi: None,
            },
        );
        op
    }

    /// Posts the rest of multi-receive buffer `id` as the receive of its next message.
    fn post_part(&mut self, id: u64) {
        let Some(m) = self.multis.get(&id) else {
            return;
        };
        let part = Part {
            whole: Arc::clone(&m.whole),
            offset: m.used,
        };
        let capacity = part.len() as u64;
        let (accepts, context, completes, order) = (m.accepts, m.context, m.completes, m.order);
        let op = self.add_recv(Box::new(part), false, context, completes);
        if let Some(r) = self.recvs.get_mut(&op) {
            r.multi = Some(id);
            // Whatever the completion flags: the application learns where each message
            // landed, and when the buffer is its own again, only from completions.
            r.silent = false;
        }
        if let Some(m) = self.multis.get_mut(&id) {
            m.posted = Some(op);
        }
        let order = self.engine.post_recv_whole(accepts, capacity, op, order);
        if let Some(m) = self.multis.get_mut(&id) {
            m.order = Some(order);
        }
    }

    /// A part of multi-receive buffer `id` took a message of `len` bytes: the rest takes
    /// the next one, or the buffer ends.
    fn part_taken(&mut self, id: u64, len: u64) {
        let min = self.min_multi_recv;
        let Some(m) = self.multis.get_mut(&id) else {
            return;
        };
        m.pending += 1;
        m.posted = None;
        let (size, addr) = {
            let w = lock(&m.whole);
            (w.len(), w.addr())
        };
        // The next message at the next 8-byte boundary of memory, not of the buffer.
        let end = (addr + m.used).saturating_add(len as usize);
        m.used = (end.next_multiple_of(8) - addr).min(size);
        let left = size - m.used;
        if left == 0 || left < min {
            m.ended = true;
        } else {
            self.post_part(id);
        }
    }

    /// A message of multi-receive buffer `id` is in (or failed): whether that gives the
    /// buffer back (its completion carries `FI_MULTI_RECV`).
    fn part_done(&mut self, id: u64) -> bool {
        let Some(m) = self.multis.get_mut(&id) else {
            return false;
        };
        m.pending = m.pending.saturating_sub(1);
        let back = m.ended && m.pending == 0;
        if back {
            self.multis.remove(&id);
        }
        back
    }

    /// The posted part of multi-receive buffer `id` ended without a message (it could
    /// not hold the next one, was cancelled or its endpoint broke): whether that gives
    /// the buffer back now (else the last message it is waiting for will).
    fn part_ended(&mut self, id: u64) -> bool {
        let Some(m) = self.multis.get_mut(&id) else {
            return false;
        };
        m.ended = true;
        m.posted = None;
        let back = m.pending == 0;
        if back {
            self.multis.remove(&id);
        }
        back
    }

    /// An operation of `kind` ended, well or not: the counters bound to that kind count it.
    fn count(&self, kind: u64, ok: bool) {
        self.count_charged(kind, ok, None);
    }

    /// Counts an operation on the counters bound for its kind, which pay `charge` when a
    /// read of theirs returns the count; whether any counted it.
    fn count_charged(&self, kind: u64, ok: bool, charge: Option<&Charge>) -> bool {
        let mut counted = false;
        for (flags, c) in &self.cntrs {
            if flags & kind != 0 {
                c.count(ok, charge.cloned());
                counted = true;
            }
        }
        counted
    }

    fn progress(&mut self) {
        if self.broken {
            return;
        }
        if let Err(e) = self.ep.poll() {
            tracing::debug!("exanet-fi: poll: {e}");
            if matches!(e, Error::Disconnected | Error::Broken(_)) {
                self.break_down();
                return;
            }
        }
        self.engine
            .handle_timeout(self.opened.elapsed().as_nanos() as u64);
        self.collect_packets();
        self.collect_fetches();
        self.collect_pushes();
        while self.engine.has_room() {
            // Taken without moving the rank's clock: a message for a receive is the
            // program's only when a receive or a probe hands it over (MPI's barrier
            // message from its peer, taken before or after the rank posted its own as
            // the host happened to run them, moved a ping-pong's modeled one-way by
            // 46 ns). What the provider acts on at once is its now.
            match self.mailbox.try_recv_unclocked() {
                Ok(Some(m)) => {
                    match self
                        .engine
                        .on_packet(m.src_node.0, m.src_rank, &m.payload, m.at.ps())
                    {
                        Ok(Arrived::Kept) => {}
                        Ok(Arrived::Acted) => {
                            self.ep.took(m.at);
                        }
                        Err(e) => {
                            self.ep.took(m.at);
                            self.protocol_errors += 1;
                            tracing::warn!("exanet-fi: {e}");
                        }
                    }
                    // What the message completed, before the next one is matched: a
                    // multi-receive buffer that took it posts its rest, which takes the
                    // next message in order.
                    while let Some(ev) = self.engine.poll_event() {
                        self.complete(ev);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("exanet-fi: mailbox: {e}");
                    if matches!(e, Error::Disconnected | Error::Broken(_)) {
                        self.break_down();
                        return;
                    }
                    break;
                }
            }
        }
        // What waits for a free channel goes first; serving a one-sided operation (a
        // store) makes an answer to send at once, and a completion can post a receive
        // that takes a waiting message at once (the rest of a multi-receive buffer: its
        // read or FIN), so post until nothing new comes.
        loop {
            loop {
                while let Some(a) = self.engine.poll_action() {
                    self.waiting.push_back(a);
                }
                self.post_waiting();
                if !self.engine.has_actions() {
                    break;
                }
            }
            while let Some(ev) = self.engine.poll_event() {
                self.complete(ev);
            }
            if !self.engine.has_actions() {
                break;
            }
        }
    }

    /// The attachment is gone: every operation in progress fails with `FI_EIO` on its
    /// queue (a receive waiting for a message that can no longer come must not wait for
    /// ever), and the endpoint takes no more.
    fn break_down(&mut self) {
        self.broken = true;
        tracing::warn!("exanet-fi: endpoint {:?}: the NI is gone", self.engine.me());
        let failed = |entry| Failed {
            entry,
            olen: 0,
            err: FI_EIO,
        };
        let (sends, recvs) = (self.sends.len(), self.recvs.len());
        for _ in 0..sends {
            self.count(FI_SEND, false);
        }
        for _ in 0..recvs {
            self.count(FI_RECV, false);
        }
        for op in self.rmas.values().filter(|op| !op.done) {
            self.count(op.flags & (FI_READ | FI_WRITE), false);
        }
        for (_, op) in self.sends.drain() {
            if let Some(cq) = &self.txcq {
                cq.failed(failed(op.entry()));
            }
        }
        let recvs: Vec<RecvOp> = self.recvs.drain().map(|(_, op)| op).collect();
        for op in recvs {
            let mut entry = op.entry();
            // Every buffer is given back, once (the first of its parts to fail says so).
            if op.multi.is_some_and(|m| self.multis.remove(&m).is_some()) {
                entry.flags |= FI_MULTI_RECV;
            }
            if let Some(cq) = &self.rxcq {
                cq.failed(failed(entry));
            }
        }
        for (_, op) in self.rmas.drain().filter(|(_, op)| !op.done) {
            if let Some(cq) = &self.txcq {
                cq.failed(failed(Completion {
                    context: op.context,
                    flags: op.flags,
                    ..Completion::default()
                }));
            }
        }
        self.pushes.clear();
        self.push_slots.clear();
        self.waiting.clear();
        self.packets.clear();
        self.fetches.clear();
    }

    fn collect_packets(&mut self) {
        let mut k = 0;
        while k < self.packets.len() {
            let (tag, token) = self.packets[k];
            // A delivery is taken without moving the rank's clock: most are of messages
            // nobody waits for (MPI's injects; the provider keeps a copy only to send it
            // again), and taking them as the host delivered them would carry the clock to
            // the ACK's time before the program's next post, or not, with the host's
            // timing (an 8 B ping-pong's modeled one-way varied by 0.8% under load). The
            // time comes back on the send's completion, if the program is told of one.
            let taken = match self.ep.try_result(tag) {
                Ok(None) => {
                    k += 1;
                    continue;
                }
                Ok(Some((Ok(()), at))) => Ok(at),
                Ok(Some((Err(error), at))) => {
                    // The provider acts on a failure at once (a resend, a failed
                    // operation): after it, in modeled time too.
                    self.ep.advance_clock(at);
                    Err(Error::Op {
                        tag: tag.raw(),
                        error,
                    })
                }
                Err(e) => Err(e),
            };
            let how = match taken {
                Ok(at) => Delivery::Delivered { at: at.ps() },
                Err(e) if is_full(&e) => Delivery::Refused,
                Err(e) if is_absent(&e) => Delivery::Absent,
                Err(e) if is_denied(&e) => Delivery::Denied(e.to_string()),
                Err(e) => Delivery::Failed(e.to_string()),
            };
            self.packets.swap_remove(k);
            if let Err(e) = self.engine.packet_done(token, how) {
                tracing::warn!("exanet-fi: {e}");
            }
        }
    }

    fn collect_fetches(&mut self) {
        let mut k = 0;
        while k < self.fetches.len() {
            let (tag, id) = self.fetches[k];
            let result = match self.ep.wait(tag, Some(Duration::ZERO)) {
                Err(Error::Timeout) => {
                    k += 1;
                    continue;
                }
                Ok(()) => Ok(()),
                Err(e) => {
                    if let Some(slot) = self.fetch_slots.remove(&id) {
                        self.staging.free(slot);
                    }
                    Err(e.to_string())
                }
            };
            self.fetches.swap_remove(k);
            if let Err(e) = self.engine.fetch_done(id, result) {
                tracing::warn!("exanet-fi: {e}");
            }
        }
    }

    fn collect_pushes(&mut self) {
        let mut k = 0;
        while k < self.pushes.len() {
            let (tag, reply, slot) = self.pushes[k];
            let result = match self.ep.wait(tag, Some(Duration::ZERO)) {
                Err(Error::Timeout) => {
                    k += 1;
                    continue;
                }
                Ok(()) => Ok(()),
                Err(e) => {
                    tracing::debug!("exanet-fi: writing a served read: {e}");
                    Err(RmaRefusal::Failed)
                }
            };
            self.pushes.swap_remove(k);
            self.staging.free(slot);
            self.count(FI_REMOTE_READ, result.is_ok());
            self.engine.rma_served(reply, result);
        }
    }

    /// Stores what an RMA write brought, into the application's region.
    fn store(&mut self, st: &crate::msg::Store) {
        let result = match &st.data {
            Data::Inline(b) => self.regions.store(st.key, st.addr, b),
            Data::Fetched { fetch, len } => match self.fetch_slots.remove(fetch) {
                Some(slot) => {
                    let mut b = vec![0u8; *len as usize];
                    let r = match self.staging.read(&slot, &mut b) {
                        Ok(()) => self.regions.store(st.key, st.addr, &b),
                        Err(_) => Err(RmaRefusal::Failed),
                    };
                    self.staging.free(slot);
                    r
                }
                None => Err(RmaRefusal::Failed),
            },
        };
        self.count(FI_REMOTE_WRITE, result.is_ok());
        self.engine.rma_served(st.reply, result);
    }

    /// Loads what an RMA read asks from the application's region into staging and
    /// writes it to the reader. Loaded once: a push that waits for a free channel keeps
    /// its staging (`push_slots`), as a fetch does.
    fn push(&mut self, p: &crate::msg::Push) -> Result<(), Error> {
        let slot = match self.push_slots.get(&p.reply) {
            Some(&slot) => slot,
            None => match self.load(p)? {
                Some(slot) => {
                    self.push_slots.insert(p.reply, slot);
                    slot
                }
                None => return Ok(()),
            },
        };
        let dst = self.ep.addr(NodeId(p.node), p.rank, p.va)?;
        let region = self.staging.region(&slot);
        let tag = self
            .rdma
            .try_write_any(region, slot.offset, dst, p.len, None)?;
        self.push_slots.remove(&p.reply);
        self.pushes.push((tag, p.reply, slot));
        Ok(())
    }

    /// A served read's bytes in staging, or `None` when it was answered already (its
    /// region refused it, or there was nothing to write: the NI moves at least a byte).
    fn load(&mut self, p: &crate::msg::Push) -> Result<Option<Slot>, Error> {
        // Checked before the buffer is made: the length is the reader's word.
        let allowed = self
            .regions
            .check(p.key, p.addr, p.len as usize, false)
            .and_then(|()| {
                let mut b = vec![0u8; p.len as usize];
                self.regions.load(p.key, p.addr, &mut b).map(|()| b)
            });
        let b = match allowed {
            Ok(b) if !b.is_empty() => b,
            r => {
                let r = r.map(|_| ());
                self.count(FI_REMOTE_READ, r.is_ok());
                self.engine.rma_served(p.reply, r);
                return Ok(None);
            }
        };
        let slot = self.staging.alloc(&self.ep, p.len)?;
        if let Err(e) = self.staging.write(&slot, &b) {
            self.staging.free(slot);
            return Err(e);
        }
        Ok(Some(slot))
    }

    /// Posts what waits, in order, while channels are free.
    fn post_waiting(&mut self) {
        while let Some(a) = self.waiting.pop_front() {
            match self.post(&a) {
                Ok(()) => {}
                Err(Error::ChannelBusy { .. }) => {
                    self.waiting.push_front(a);
                    return;
                }
                Err(e) => self.post_failed(a, e),
            }
        }
    }

    fn post(&mut self, a: &Action) -> Result<(), Error> {
        match a {
            Action::Transmit(t) => {
                let dst = self
                    .ep
                    .mailbox_addr(NodeId(t.to.node), t.to.rank, t.to.vi)?;
                let tag = self.tx.try_send_any(dst, &t.bytes)?;
                self.packets.push((tag, t.token));
            }
            Action::Fetch(f) => {
                if let Some(t) = f.into {
                    // An RMA write's data: read only what its region would take.
                    if self
                        .regions
                        .check(t.key, t.addr, f.len as usize, true)
                        .is_err()
                    {
                        self.engine.fetch_denied(f.id);
                        return Ok(());
                    }
                }
                let src = self.ep.addr(NodeId(f.node), f.rank, f.va)?;
                if !self.fetch_slots.contains_key(&f.id) {
                    let slot = self.staging.alloc(&self.ep, f.len)?;
                    self.fetch_slots.insert(f.id, slot);
                    // The read answers a request the engine kept for a receive: the
                    // program takes the request now (once, not on a retry of the post),
                    // and the read starts after it came and was handled.
                    if f.after > 0 {
                        self.ep.took(exanet::ModelTime(f.after));
                    }
                }
                let slot = self.fetch_slots[&f.id];
                let region = self.staging.region(&slot);
                let tag = self.rdma.try_read_any(src, region, slot.offset, f.len)?;
                self.fetches.push((tag, f.id));
            }
            Action::Store(st) => self.store(st),
            Action::Push(p) => self.push(p)?,
        }
        Ok(())
    }

    /// An action the NI refused outright ends its operation.
    fn post_failed(&mut self, a: Action, e: Error) {
        tracing::debug!("exanet-fi: {a:?}: {e}");
        let r = match a {
            Action::Transmit(t) => self
                .engine
                .packet_done(t.token, Delivery::NotSent(e.to_string())),
            Action::Fetch(f) => {
                if let Some(slot) = self.fetch_slots.remove(&f.id) {
                    self.staging.free(slot);
                }
                self.engine.fetch_done(f.id, Err(e.to_string()))
            }
            Action::Store(_) => Ok(()),
            Action::Push(p) => {
                if let Some(slot) = self.push_slots.remove(&p.reply) {
                    self.staging.free(slot);
                }
                self.count(FI_REMOTE_READ, false);
                self.engine.rma_served(p.reply, Err(RmaRefusal::Failed));
                Ok(())
            }
        };
        if let Err(e) = r {
            tracing::warn!("exanet-fi: {e}");
        }
    }

    fn complete(&mut self, ev: Event) {
        match ev {
            Event::Released { ctx } => {
                if let Some(slot) = self.staged.remove(&ctx) {
                    self.staging.free(slot);
                }
            }
            Event::Sent {
                ctx,
                result,
                delivered,
            } => {
                let Some(op) = self.sends.remove(&ctx) else {
                    return;
                };
                // The program learns of the delivery when it reads the completion or a
                // counter of sends. Without either nothing tells it the time (an inject
                // above all, whose ACK nobody waits for).
                let charge = delivered.map(|at| {
                    let ep = self.ep.clone();
                    Charge::new(move || {
                        ep.advance_clock(exanet::ModelTime(at));
                    })
                });
                if result.is_err() {
                    // A failure (a refusing FIN) is read apart, by `fi_cq_readerr`: its
                    // time is paid as it comes, as a failed receive's is.
                    charge.iter().for_each(Charge::pay);
                }
                self.count_charged(FI_SEND, result.is_ok(), charge.as_ref());
                if let Err(f @ Failure::Unreachable(_)) = &result {
                    // The application's error code does not say where; the log does.
                    let what = if op.inject {
                        "an injected send"
                    } else {
                        "a send"
                    };
                    self.say_lost(op.to, what, f);
                }
                if result.is_err() && op.inject {
                    // Counted above and said; no completion for it, not even a failure.
                    return;
                }
                let Some(cq) = self.txcq.clone() else { return };
                let entry = op.entry();
                match result {
                    Ok(()) if op.silent => {}
                    Ok(()) => cq.done_charged(entry, charge),
                    Err(f) => cq.failed(Failed {
                        entry,
                        olen: 0,
                        err: errno_of(&f),
                    }),
                }
            }
            Event::Received {
                ctx,
                from,
                tag,
                cq_data,
                len,
                data,
                at,
            } => {
                let Some(op) = self.recvs.remove(&ctx) else {
                    return;
                };
                // The program takes the message when it reads the completion or a
                // counter of receives; where it learns of it otherwise (a failure), or
                // by neither, now.
                let charge = at.map(|at| {
                    let ep = self.ep.clone();
                    Charge::new(move || {
                        ep.took(exanet::ModelTime(at));
                    })
                });
                let written = match data {
                    Data::Inline(b) => op.buf.write(&b),
                    Data::Fetched { fetch, len } => {
                        let slot = self.fetch_slots.remove(&fetch);
                        let mut b = vec![0u8; len as usize];
                        let n = match slot.map(|s| self.staging.read(&s, &mut b)) {
                            Some(Ok(())) => op.buf.write(&b),
                            _ => 0,
                        };
                        if let Some(s) = slot {
                            self.staging.free(s);
                        }
                        n
                    }
                };
                let truncated = (written as u64) < len && !op.buf.discards();
                // A part of a multi-receive buffer: the rest takes the next message, or
                // the buffer goes back to the application with this completion.
                let released = op.multi.is_some_and(|m| self.part_done(m));
                let counted = self.count_charged(FI_RECV, !truncated, charge.as_ref());
                let Some(cq) = self.rxcq.clone() else {
                    if !counted {
                        charge.iter().for_each(Charge::pay);
                    }
                    return;
                };
                let src = self
                    .av
                    .as_ref()
                    .map_or(FI_ADDR_UNSPEC, |av| av.reverse(from));
                let entry = Completion {
                    context: op.context,
                    flags: op.flags
                        | if cq_data.is_some() {
                            FI_REMOTE_CQ_DATA
                        } else {
                            0
                        }
                        | if released { FI_MULTI_RECV } else { 0 },
                    len: written,
                    buf: op.buf.addr(),
                    data: cq_data.unwrap_or(0),
                    tag: tag.unwrap_or(0),
                    src,
                };
                if truncated || (op.silent && !counted) {
                    // Read apart (`fi_cq_readerr`) or not at all: paid now.
                    charge.iter().for_each(Charge::pay);
                }
                if truncated || op.silent {
                    if truncated {
                        cq.failed(Failed {
                            entry,
                            olen: (len - written as u64) as usize,
                            err: FI_ETRUNC,
                        });
                    }
                } else {
                    cq.done_charged(entry, charge);
                }
            }
            Event::RmaReleased { ctx } => {
                if let Some(slot) = self.rmas.remove(&ctx).and_then(|op| op.slot) {
                    self.staging.free(slot);
                }
            }
            Event::RmaDone { ctx, result, at } => {
                let Some(op) = self.rmas.get_mut(&ctx) else {
                    return;
                };
                op.done = true;
                let mut result = result.map_err(|f| errno_of(&f));
                if let (Some(slot), Some(buf)) = (op.slot, op.buf.take()) {
                    if result.is_ok() {
                        let mut b = vec![0u8; op.len];
                        result = self.staging.read(&slot, &mut b).map_err(|_| FI_EIO);
                        if result.is_ok() {
                            buf.write(&b);
                        }
                    }
                }
                let (context, flags, silent, inject) = (op.context, op.flags, op.silent, op.inject);
                // The answer is the program's when it reads the completion or a counter
                // of one-sided operations (MPICH's way); a failure, or an operation
                // reported by neither, now.
                let charge = at.map(|at| {
                    let ep = self.ep.clone();
                    Charge::new(move || {
                        ep.took(exanet::ModelTime(at));
                    })
                });
                if result.is_err() {
                    charge.iter().for_each(Charge::pay);
                }
                let counted = self.count_charged(
                    flags & (FI_READ | FI_WRITE),
                    result.is_ok(),
                    charge.as_ref(),
                );
                let reported = self.txcq.is_some() && !silent;
                if !counted && !reported {
                    charge.iter().for_each(Charge::pay);
                }
                if inject && result.is_err() {
                    // Counted above; what waits on the target fails on its own, and a
                    // target gone is said when a probe finds it (Event::PeerGone).
                    tracing::debug!("exanet-fi: an injected write failed: errno {result:?}");
                    return;
                }
                let Some(cq) = self.txcq.clone() else { return };
                let entry = Completion {
                    context,
                    flags,
                    ..Completion::default()
                };
                match result {
                    Ok(()) if silent => {}
                    Ok(()) => cq.done_charged(entry, charge),
                    Err(err) => cq.failed(Failed {
                        entry,
                        olen: 0,
                        err,
                    }),
                }
            }
            Event::PeerGone { peer, why, failed } => {
                tracing::warn!(
                    "exanet-fi: {}: {} is gone ({why}): {failed} operation(s) waiting on it \
                     failed (FI_EHOSTUNREACH)",
                    self.name_peer(self.engine.me()),
                    self.name_peer(peer)
                );
            }
            Event::Taken { ctx, len } => {
                if let Some(m) = self.recvs.get(&ctx).and_then(|op| op.multi) {
                    self.part_taken(m, len);
                }
            }
            Event::Unfit { ctx } => {
                // The rest of a multi-receive buffer could not hold the next message:
                // the buffer ends, and is the application's again once what it took is
                // in (then with that message's completion).
                let Some(op) = self.recvs.remove(&ctx) else {
                    return;
                };
                if !op.multi.is_some_and(|m| self.part_ended(m)) {
                    return;
                }
                if let Some(cq) = self.rxcq.clone() {
                    cq.done(Completion {
                        context: op.context,
                        flags: FI_MULTI_RECV,
                        buf: op.buf.addr(),
                        ..Completion::default()
                    });
                }
            }
            Event::RecvFailed { ctx, error } => {
                let Some(op) = self.recvs.remove(&ctx) else {
                    return;
                };
                self.count(FI_RECV, false);
                let mut entry = op.entry();
                // A multi-receive buffer whose waiting part was cancelled ends there; one
                // of the messages it took failed (its read): the application has the
                // buffer back, now or with the last message it took.
                if let Some(m) = op.multi {
                    let waiting = self.multis.get(&m).is_some_and(|b| b.posted == Some(ctx));
                    let back = if waiting {
                        self.part_ended(m)
                    } else {
                        self.part_done(m)
                    };
                    if back {
                        entry.flags |= FI_MULTI_RECV;
                    }
                }
                if let Some(cq) = self.rxcq.clone() {
                    cq.failed(Failed {
                        entry,
                        olen: 0,
                        err: errno_of(&error),
                    });
                }
            }
        }
    }
}

fn errno_of(f: &Failure) -> i32 {
    match f {
        Failure::Cancelled => FI_ECANCELED,
        Failure::Unreachable(_) => FI_EHOSTUNREACH,
        Failure::Denied(_) => FI_EACCES,
        Failure::Refused => FI_ECONNREFUSED,
        Failure::ReadFailed(_) | Failure::RmaFailed => FI_EIO,
        Failure::RmaDenied => FI_EACCES,
    }
}
