//! Workloads attach here (protocol: `exanet_proto::attach`). Each attached workload is a
//! session on one rank: a control connection (the attach socket, blocking, on its own
//! thread; its closing detaches the rank) and a command-ring thread that waits on the
//! workload's doorbell, spinning briefly after activity, and feeds commands into the core.
//! Completions are pushed into the session's completion ring from the core's pump.
//!
//! Nothing read from a workload is trusted: JSON requests are size-limited and typed,
//! ring slots are decoded and checked, memory accesses go through the bounds-checked
//! `exanet_shm::Region`, and every refusal is answered (an error reply or an error
//! completion) and counted.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use exanet_proto::attach::{self, status, Command, Completion, Reply, Request, Resource};
use exanet_proto::ni::{ChannelState, MemFault, Memory, NiError, NiEvent, TransferId, RANKS};
use exanet_proto::Pdid;
use exanet_shm::{Consumer, Doorbell, Producer, Region, Ring, Waiter};
use tracing::{debug, info, warn};

use crate::metrics::Op;
use crate::node::NodeHandle;
use exanet_proto::Instant;

/// Ring slot size: a 128-byte message plus the ring's length prefix, rounded up.
const RING_SLOT: u32 = 256;
pub const COMMAND_SLOTS: u32 = 256;
pub const COMPLETION_SLOTS: u32 = 1024;
/// Longest control request line.
const MAX_REQUEST: usize = 4096;
/// Registered memory starts here in each rank's VA space, each region 2 MiB aligned.
const VA_BASE: u64 = 1 << 30;
const VA_ALIGN: u64 = 2 << 20;
/// Completions queued for a workload whose ring is full, beyond which its commands wait.
const MAX_BACKLOG: usize = 1024;
/// Queued completions past which peers' notifications are no longer relayed to a workload
/// that does not read its ring (the notification is in its memory all the same).
const MAX_NOTIFY_BACKLOG: usize = 4096;
/// Most memory regions one rank may register.
const MAX_REGIONS: usize = 64;

/// Memory registered by the ranks of this node: what the NI reads and writes.
#[derive(Clone, Default)]
pub struct ShmMemory {
    ranks: Arc<RwLock<Vec<Vec<Registered>>>>,
}

#[derive(Clone)]
struct Registered {
    id: u32,
    va: u64,
    region: Arc<Region>,
}

impl ShmMemory {
    pub fn new() -> ShmMemory {
        ShmMemory {
            ranks: Arc::new(RwLock::new(vec![Vec::new(); RANKS])),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Vec<Vec<Registered>>) -> T) -> T {
        let mut g = self.ranks.write().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    fn register(&self, rank: u8, region: Region) -> Result<(u32, u64), String> {
        self.with(|ranks| {
            let list = &mut ranks[rank as usize];
            if list.len() >= MAX_REGIONS {
                return Err(format!("rank {rank} already has {MAX_REGIONS} regions"));
            }
            let va = list
                .iter()
                .map(|r| r.va + r.region.len() as u64)
                .max()
                .unwrap_or(VA_BASE)
                .div_ceil(VA_ALIGN)
                * VA_ALIGN;
            if va + region.len() as u64 > exanet_proto::ni::MAILBOX_WINDOW {
                return Err("no VA space left below the mailbox window".into());
            }
            let id = list.iter().map(|r| r.id + 1).max().unwrap_or(1);
            list.push(Registered {
                id,
                va,
                region: Arc::new(region),
            });
            Ok((id, va))
        })
    }

    fn unregister(&self, rank: u8, id: u32) -> bool {
        self.with(|ranks| {
            let list = &mut ranks[rank as usize];
            let before = list.len();
            list.retain(|r| r.id != id);
            list.len() != before
        })
    }

    fn clear(&self, rank: u8) {
        self.with(|ranks| ranks[rank as usize].clear());
    }

    fn find(&self, rank: u8, va: u64, len: usize) -> Option<(Arc<Region>, usize)> {
        let g = self.ranks.read().unwrap_or_else(|p| p.into_inner());
        let list = g.get(rank as usize)?;
        list.iter().find_map(|r| {
            let off = va.checked_sub(r.va)? as usize;
            (off.checked_add(len)? <= r.region.len()).then(|| (r.region.clone(), off))
        })
    }
}

impl Memory for ShmMemory {
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|len| self.find(rank, va, len).is_some())
    }

    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: buf.len(),
        };
        let (r, off) = self.find(rank, va, buf.len()).ok_or(fault)?;
        r.read(off, buf).map_err(|_| fault)
    }

    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault> {
        let fault = MemFault::Unmapped {
            rank,
            va,
            len: data.len(),
        };
        let (r, off) = self.find(rank, va, data.len()).ok_or(fault)?;
        r.write(off, data).map_err(|_| fault)
    }
}

/// The daemon's half of an attached workload, kept in the core.
pub struct Session {
    completions: Producer,
    to_workload: Doorbell,
    backlog: VecDeque<[u8; attach::SLOT]>,
    mailboxes: Vec<u8>,
    /// Posted sends and transfers: the workload's tag and when the NI took the command.
    send_tags: HashMap<(u8, u8), (u32, Instant)>,
    rdma_tags: HashMap<TransferId, (u32, Instant)>,
}

impl Session {
    /// Queues a completion for the workload (in order, behind any backlog).
    fn push(&mut self, c: &Completion) {
        self.backlog.push_back(c.encode());
        self.flush();
    }

    /// Moves backlog into the ring while it has room and rings the workload if asleep.
    fn flush(&mut self) {
        while let Some(slot) = self.backlog.front() {
            if self.completions.push(slot).is_err() {
                break;
            }
            self.backlog.pop_front();
        }
        let _ = self.completions.wake_consumer(&self.to_workload);
    }

    fn has_room(&mut self) -> bool {
        self.backlog.is_empty() && self.completions.free().is_ok_and(|n| n > 0)
    }
}

/// Relays an NI event to the session of its rank (called from the core's pump).
pub fn deliver(core: &mut crate::node::Core, ev: NiEvent, now: Instant) {
    let rank = match &ev {
        NiEvent::Packetizer { rank, .. }
        | NiEvent::Mailbox { rank, .. }
        | NiEvent::Rdma { rank, .. }
        | NiEvent::Notified { rank, .. } => *rank,
    };
    let Some(Some(s)) = core.sessions.get_mut(rank as usize) else {
        return;
    };
    match ev {
        NiEvent::Packetizer { vi, ch, state, .. } => {
            let (tag, posted) = s.send_tags.remove(&(vi, ch)).unwrap_or((0, now));
            let ok = matches!(state, ChannelState::Acked);
            core.latency.observe(Op::Send, ok, now.since(posted));
            let Some((st, reason)) = status::of_send(state) else {
                return;
            };
            s.push(&Completion::Sent {
                tag,
                vi,
                ch,
                status: st,
                reason,
            });
        }
        NiEvent::Rdma { id, result, .. } => {
            let (tag, posted) = s.rdma_tags.remove(&id).unwrap_or((0, now));
            let op = if id.read { Op::Read } else { Op::Write };
            core.latency.observe(op, result.is_ok(), now.since(posted));
            let (st, reason) = status::of_transfer(result);
            s.push(&Completion::Rdma {
                tag,
                page: id.page,
                ch: id.ch,
                read: id.read,
                status: st,
                reason,
            });
        }
        NiEvent::Notified { va, src, len, .. } => {
            // Everything else a workload is told about is bounded by what it posted;
            // notifications are posted by its peers. The notification itself is already
            // in its memory, so past a bound the ring copy is dropped, and counted.
            if s.backlog.len() >= MAX_NOTIFY_BACKLOG {
                core.node.count_error("notification_not_relayed");
                return;
            }
            s.push(&Completion::Notified {
                va,
                src_node: src.0,
                len,
            })
        }
        NiEvent::Mailbox { .. } => drain_mailboxes(core, rank),
    }
}

/// Moves queued mailbox messages of `rank` into its completion ring while there is room.
/// Messages stay in the NI's queue (which NACKs when full) until the ring takes them.
pub fn drain_mailboxes(core: &mut crate::node::Core, rank: u8) {
    let Some(Some(s)) = core.sessions.get_mut(rank as usize) else {
        return;
    };
    s.flush();
    let vis = s.mailboxes.clone();
    for vi in vis {
        loop {
            let Some(Some(s)) = core.sessions.get_mut(rank as usize) else {
                return;
            };
            if !s.has_room() {
                return;
            }
            let (ni, _) = core.node.ni_mut();
            let Ok(Some(m)) = ni.mailboxes.pop(rank, vi) else {
                break;
            };
            let Some(Some(s)) = core.sessions.get_mut(rank as usize) else {
                return;
            };
            s.push(&Completion::Message {
                vi,
                src_node: m.src.0,
                src_rank: m.src_rank,
                payload: m.payload.to_vec(),
            });
        }
    }
}

/// Listens for workloads on `path` until the process exits.
pub fn start(node: Arc<NodeHandle>, mem: ShmMemory, path: &Path) -> std::io::Result<()> {
    let listener = crate::control_server::bind_owner_only(path)?;
    std::thread::Builder::new()
        .name("ni-attach".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (node, mem) = (node.clone(), mem.clone());
                let _ = std::thread::Builder::new()
                    .name("ni-session".into())
                    .spawn(move || serve_session(node, mem, conn));
            }
        })?;
    Ok(())
}

/// Reads one request line and any fds that came with it.
fn read_request(conn: &UnixStream) -> Result<Option<(Request, Vec<OwnedFd>)>, String> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let (n, mut got) = exanet_shm::recv_fds(conn, &mut buf, 4).map_err(|e| e.to_string())?;
        fds.append(&mut got);
        if n == 0 {
            return Ok(None);
        }
        line.extend_from_slice(&buf[..n]);
        if line.len() > MAX_REQUEST {
            return Err(format!("request longer than {MAX_REQUEST} bytes"));
        }
        if line.ends_with(b"\n") {
            break;
        }
    }
    let req = serde_json::from_slice(&line).map_err(|e| format!("bad request: {e}"))?;
    Ok(Some((req, fds)))
}

fn reply(conn: &UnixStream, r: &Reply, fds: &[i32]) -> bool {
    let mut line = serde_json::to_vec(r)
        .unwrap_or_else(|_| b"{\"result\":\"error\",\"message\":\"encoding\"}".to_vec());
    line.push(b'\n');
    exanet_shm::send_fds(conn, &line, fds).is_ok()
}

fn error(conn: &UnixStream, node: &NodeHandle, kind: &'static str, message: String) -> bool {
    node.count_error(kind);
    debug!(%message, "workload request refused");
    reply(conn, &Reply::Error { message }, &[])
}

fn serve_session(node: Arc<NodeHandle>, mem: ShmMemory, conn: UnixStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    // The first request must be an attach.
    let (job_key, version) = match read_request(&conn) {
        Ok(Some((Request::Attach { version, job_key }, _))) => (job_key, version),
        Ok(Some(_)) => {
            error(&conn, &node, "workload_protocol", "attach first".into());
            return;
        }
        Ok(None) => return,
        Err(e) => {
            error(&conn, &node, "workload_protocol", e);
            return;
        }
    };
    if version != attach::PROTOCOL_VERSION {
        error(
            &conn,
            &node,
            "workload_protocol",
            format!(
                "protocol version {version} not supported (this daemon speaks {})",
                attach::PROTOCOL_VERSION
            ),
        );
        return;
    }
    let Some(pdid) = node.rack.pdid_for(job_key.as_deref()) else {
        error(&conn, &node, "workload_refused", "unknown job key".into());
        return;
    };
    let attached = match attach_rank(&node, Pdid(pdid)) {
        Ok(a) => a,
        Err(e) => {
            error(&conn, &node, "workload_refused", e);
            return;
        }
    };
    let Attached {
        rank,
        region,
        command,
        from_workload,
        to_workload_fd,
        reply: attached_reply,
    } = attached;
    let stop = Arc::new(AtomicBool::new(false));
    // The fds must stay open until the reply is sent.
    let ok = match (region.try_clone_fd(), from_workload.try_clone_fd()) {
        (Ok(r), Ok(f)) => reply(
            &conn,
            &attached_reply,
            &[r.as_raw_fd(), to_workload_fd.as_raw_fd(), f.as_raw_fd()],
        ),
        _ => {
            error(
                &conn,
                &node,
                "workload_refused",
                "cannot share the rings".into(),
            );
            false
        }
    };
    info!(rank, pdid, "workload attached");
    let from_workload = Arc::new(from_workload);
    let ring_thread = if ok {
        let (node, stop, bell) = (node.clone(), stop.clone(), from_workload.clone());
        std::thread::Builder::new()
            .name("ni-ring".into())
            .spawn(move || serve_ring(node, rank, command, bell, stop))
            .ok()
    } else {
        None
    };
    let _ = conn.set_read_timeout(None);
    if ok {
        loop {
            let (req, fds) = match read_request(&conn) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => {
                    if !error(&conn, &node, "workload_protocol", e) {
                        break;
                    }
                    continue;
                }
            };
            let r = handle_request(&node, &mem, rank, req, fds);
            let sent = match r {
                Ok(r) => reply(&conn, &r, &[]),
                Err(e) => error(&conn, &node, "workload_request", e),
            };
            if !sent {
                break;
            }
        }
    }
    // The workload is gone (or broke the protocol): free everything it held.
    stop.store(true, Ordering::Release);
    let _ = from_workload.ring();
    if let Some(t) = ring_thread {
        let _ = t.join();
    }
    {
        let now = node.now();
        let mut core = node.lock();
        core.sessions[rank as usize] = None;
        let (ni, _) = core.node.ni_mut();
        let _ = ni.detach(rank, now);
        core.pump(now);
        // Under the core lock, so that a workload attaching to this rank right after
        // cannot have its fresh registrations erased.
        mem.clear(rank);
    }
    drop(region);
    info!(rank, "workload detached");
}

struct Attached {
    rank: u8,
    region: Arc<Region>,
    command: Consumer,
    from_workload: Doorbell,
    to_workload_fd: OwnedFd,
    reply: Reply,
}

fn attach_rank(node: &NodeHandle, pdid: Pdid) -> Result<Attached, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let cmd_ring = Ring::new(0, COMMAND_SLOTS, RING_SLOT).map_err(|x| e(&x))?;
    let cpl_offset = cmd_ring.end().div_ceil(Ring::ALIGN) * Ring::ALIGN;
    let cpl_ring = Ring::new(cpl_offset, COMPLETION_SLOTS, RING_SLOT).map_err(|x| e(&x))?;
    let region = Arc::new(Region::create("exanet-rings", cpl_ring.end()).map_err(|x| e(&x))?);
    cmd_ring.init(&region).map_err(|x| e(&x))?;
    cpl_ring.init(&region).map_err(|x| e(&x))?;
    let command = cmd_ring.consumer(region.clone()).map_err(|x| e(&x))?;
    let completions = cpl_ring.producer(region.clone()).map_err(|x| e(&x))?;
    let to_workload = Doorbell::new().map_err(|x| e(&x))?;
    let to_workload_fd = to_workload.try_clone_fd().map_err(|x| e(&x))?;
    let from_workload = Doorbell::new().map_err(|x| e(&x))?;
    let mut core = node.lock();
    let rank = (0..RANKS as u8)
        .find(|r| core.sessions[*r as usize].is_none())
        .ok_or_else(|| format!("all {RANKS} ranks of {} are taken", node.name))?;
    let (ni, _) = core.node.ni_mut();
    ni.attach(rank, pdid).map_err(|x| e(&x))?;
    core.sessions[rank as usize] = Some(Session {
        completions,
        to_workload,
        backlog: VecDeque::new(),
        mailboxes: Vec::new(),
        send_tags: HashMap::new(),
        rdma_tags: HashMap::new(),
    });
    let nodes = node.rack.shape().nodes();
    Ok(Attached {
        rank,
        reply: Reply::Attached {
            node: node.name.clone(),
            node_id: node.id.0,
            rank,
            pdid: pdid.0,
            command_slots: COMMAND_SLOTS,
            completion_slots: COMPLETION_SLOTS,
            command_offset: 0,
            completion_offset: cpl_offset as u64,
            region_len: region.len() as u64,
            nodes,
        },
        region,
        command,
        from_workload,
        to_workload_fd,
    })
}

fn handle_request(
    node: &NodeHandle,
    mem: &ShmMemory,
    rank: u8,
    req: Request,
    mut fds: Vec<OwnedFd>,
) -> Result<Reply, String> {
    match req {
        Request::Attach { .. } => Err("already attached".into()),
        Request::Register { len } => {
            if fds.len() != 1 {
                return Err(format!(
                    "register needs exactly one memfd, got {}",
                    fds.len()
                ));
            }
            let fd = fds.pop().expect("one fd");
            let region = Region::from_fd(fd).map_err(|e| e.to_string())?;
            if region.len() as u64 != len {
                return Err(format!(
                    "region is {} B, not the {len} B announced",
                    region.len()
                ));
            }
            let (region, va) = mem.register(rank, region)?;
            Ok(Reply::Registered { region, va })
        }
        Request::Unregister { region } => {
            if mem.unregister(rank, region) {
                Ok(Reply::Ok)
            } else {
                Err(format!("rank {rank} has no region {region}"))
            }
        }
        Request::Alloc { kind, capacity } => {
            let mut core = node.lock();
            let (ni, _) = core.node.ni_mut();
            let index = match kind {
                Resource::Packetizer => ni.packetizer.alloc(rank),
                Resource::Mailbox => {
                    let cap = capacity.unwrap_or(64).clamp(1, 65_536) as usize;
                    ni.mailboxes.alloc(rank, cap)
                }
                Resource::RdmaPage => ni.rdma.alloc_page(rank),
            }
            .map_err(|e| e.to_string())?;
            if kind == Resource::Mailbox {
                if let Some(Some(s)) = core.sessions.get_mut(rank as usize) {
                    s.mailboxes.push(index);
                }
            }
            Ok(Reply::Allocated { index })
        }
        Request::Free { kind, index } => {
            let mut core = node.lock();
            let (ni, _) = core.node.ni_mut();
            match kind {
                Resource::Packetizer => ni.packetizer.free(rank, index),
                Resource::Mailbox => ni.mailboxes.free(rank, index),
                Resource::RdmaPage => ni.rdma.free_page(rank, index),
            }
            .map_err(|e| e.to_string())?;
            if kind == Resource::Mailbox {
                if let Some(Some(s)) = core.sessions.get_mut(rank as usize) {
                    s.mailboxes.retain(|v| *v != index);
                }
            }
            Ok(Reply::Ok)
        }
    }
}

/// Serves the command ring of one session until `stop`.
fn serve_ring(
    node: Arc<NodeHandle>,
    rank: u8,
    mut ring: Consumer,
    bell: Arc<Doorbell>,
    stop: Arc<AtomicBool>,
) {
    let waiter = Waiter::new(node.spin);
    let mut buf = vec![0u8; ring.max_message_len()];
    let mut batch: Vec<Result<Command, (u32, attach::SlotError)>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        // A workload that does not read its completions is not served further commands
        // until it does: its command ring fills and it is held back, instead of the
        // daemon queueing completions for it without bound.
        let held_back = {
            let mut core = node.lock();
            match core.sessions.get_mut(rank as usize) {
                Some(Some(s)) => {
                    s.flush();
                    s.backlog.len() >= MAX_BACKLOG
                }
                _ => false,
            }
        };
        if held_back {
            let _ = bell.wait(Some(Duration::from_millis(5)));
            continue;
        }
        // Take what is there without waiting, then process it under one lock.
        loop {
            match ring.pop(&mut buf) {
                Ok(Some(n)) => batch.push(Command::decode(&buf[..n])),
                Ok(None) => break,
                Err(e) => {
                    warn!(rank, error = %e, "workload corrupted its command ring");
                    node.count_error("workload_ring");
                    // The ring cannot be trusted any more; the session ends when the
                    // workload's connection does. Stop reading it.
                    return;
                }
            }
            if batch.len() >= 64 {
                break;
            }
        }
        if !batch.is_empty() {
            let now = node.now();
            let mut core = node.lock();
            for c in batch.drain(..) {
                execute(&mut core, rank, c, now);
            }
            drain_mailboxes(&mut core, rank);
            core.pump(now);
            continue;
        }
        if let Err(e) = ring.check_header() {
            // Geometry rewritten under us: nothing in this ring can be trusted.
            warn!(rank, error = %e, "workload corrupted its command ring");
            node.count_error("workload_ring");
            return;
        }
        {
            // Room may have appeared in the completion ring.
            let mut core = node.lock();
            drain_mailboxes(&mut core, rank);
        }
        let timeout = Some(Duration::from_millis(20));
        match ring.wait_readable(&waiter, &bell, timeout) {
            Ok(_) => {}
            Err(e) => {
                warn!(rank, error = %e, "command ring wait failed");
                node.count_error("workload_ring");
                return;
            }
        }
    }
}

/// A command the NI took: its tag, and what its completion will be keyed by.
type Posted = (u32, Option<TransferId>, Option<(u8, u8)>);

fn execute(
    core: &mut crate::node::Core,
    rank: u8,
    c: Result<Command, (u32, attach::SlotError)>,
    now: exanet_proto::Instant,
) {
    let refuse = |core: &mut crate::node::Core, tag: u32, st: u8, code: u8| {
        if let Some(Some(s)) = core.sessions.get_mut(rank as usize) {
            s.push(&Completion::Refused {
                tag,
                status: st,
                code,
            });
        }
    };
    let cmd = match c {
        Ok(c) => c,
        Err((tag, e)) => {
            debug!(rank, error = %e, "malformed command");
            core.node.count_error("workload_malformed");
            refuse(core, tag, status::MALFORMED, 0);
            return;
        }
    };
    let (ni, mem) = core.node.ni_mut();
    let res: Result<Posted, (u32, NiError)> = match cmd {
        Command::Send {
            tag,
            vi,
            ch,
            dst,
            payload,
        } => ni
            .send_message(rank, vi, ch, dst, &payload, now)
            .map(|()| (tag, None, Some((vi, ch))))
            .map_err(|e| (tag, e)),
        Command::Write {
            tag,
            page,
            ch,
            src_va,
            dst,
            len,
            notify,
        } => ni
            .rdma_write(rank, page, ch, src_va, dst, len, notify, now, mem)
            .map(|id| (tag, Some(id), None))
            .map_err(|e| (tag, e)),
        Command::Read {
            tag,
            page,
            ch,
            src,
            dst_va,
            len,
        } => ni
            .rdma_read(rank, page, ch, src, dst_va, len, now)
            .map(|id| (tag, Some(id), None))
            .map_err(|e| (tag, e)),
    };
    match res {
        Ok((tag, id, send)) => {
            if let Some(Some(s)) = core.sessions.get_mut(rank as usize) {
                if let Some(id) = id {
                    s.rdma_tags.insert(id, (tag, now));
                }
                if let Some(k) = send {
                    s.send_tags.insert(k, (tag, now));
                }
            }
        }
        Err((tag, e)) => {
            debug!(rank, error = %e, "command refused");
            core.node.count_error("workload_refused_command");
            refuse(core, tag, status::REFUSED, attach::refusal::of(&e));
        }
    }
}

/// Keeps the NI's timers: sleeps until the next deadline (or until the core says a
/// sooner one appeared) and lets the NI retransmit and expire.
pub async fn timer_loop(node: Arc<NodeHandle>) {
    loop {
        let deadline = {
            let mut core = node.lock();
            let d = core.node.poll_timeout();
            core.timer_armed = d;
            d
        };
        let wake = node.timer_wake.clone();
        match deadline {
            Some(d) => {
                let now = node.now();
                let wait = Duration::from_nanos(d.since(now));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {
                        let now = node.now();
                        let mut core = node.lock();
                        core.node.handle_timeout(now);
                        core.pump(now);
                    }
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}
