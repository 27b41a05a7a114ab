//! Workloads attach here (protocol: `exanet_proto::attach`). This is the I/O shell around
//! the core's workload service (`exanet_proto::workload`), which decides what a command
//! does, which completion an NI event becomes and where memory goes: here are the socket,
//! the shared memory, the threads, quotas and credentials. Each attached workload is a
//! session on one rank: a control connection (the attach socket, blocking, on its own
//! thread; its closing detaches the rank) and a command-ring task on the daemon's runtime
//! that waits on the workload's doorbell, looking again briefly after activity, and feeds
//! commands into the core.
//! Completions are pushed into the session's completion ring from the core's pump.
//!
//! Nothing read from a workload is trusted: JSON requests are size-limited and typed,
//! ring slots are decoded and checked, memory accesses go through the bounds-checked
//! `exanet_shm::Region`, and every refusal is answered (an error reply or an error
//! completion) and counted.
//!
//! Nor can a workload make the daemon wait on it: the doorbells are socket pairs whose
//! daemon ends only the daemon holds, with locks of their own (every call non-blocking, and
//! nothing a workload does on its end, `splice` included, holds what ours take; see
//! `exanet_shm::doorbell`), the ring task is stopped through the runtime, never through a
//! descriptor the workload shares, replies have a send timeout, the attach
//! request a deadline, and the memory the NI touches is memory the daemon made (sealed,
//! allocated up front: it cannot fault under the daemon). No channel from a workload carries
//! descriptors: the doorbells and the attach socket refuse `SCM_RIGHTS` (Linux >= 6.16;
//! on older kernels whatever arrives is closed by `crate::closer`, as is the connection
//! itself, so that a close a workload made blocking never holds a lock or a session's
//! thread). What one connection may hold is bounded here, what one process or job may hold
//! by the workload service (`exanet_proto::quota`), and a session's teardown frees all of
//! it whatever the workload did.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exanet_proto::attach::{self, Command, Reply, Request};
use exanet_proto::workload::{Control, Joining, ServiceError};
use exanet_proto::{ModelTime, Pdid};
use exanet_shm::{Consumer, Doorbell, PeerCredentials, Region, Ring};
use tokio::io::Interest;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::closer::{close_later, CloseLater};
use crate::node::NodeHandle;
use crate::session::{Ended, EndedGuard, Session, ShmRing};
use crate::shm_memory::ShmMemory;
use exanet_control::quota::Limits;

/// Ring slot size: a 128-byte message plus the ring's length prefix, rounded up.
const RING_SLOT: u32 = 256;
pub const COMMAND_SLOTS: u32 = 256;
pub const COMPLETION_SLOTS: u32 = 1024;
/// Longest control request line.
const MAX_REQUEST: usize = 4096;
/// Time a new connection has to send its whole attach request (a client that dribbles it
/// byte by byte would otherwise hold a thread and a descriptor for hours).
const ATTACH_DEADLINE: Duration = Duration::from_secs(5);
/// Time a reply may wait for a workload that does not read its socket.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections (each a thread) at once, attached or not, and per user.
pub const MAX_CONNECTIONS: usize = 64;
pub const MAX_CONNECTIONS_PER_USER: usize = 16;
/// Longest pause of the accept loop after a failed accept (e.g. out of descriptors).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait of an attach for the teardown of sessions whose workload is gone (a
/// teardown waits on nothing the workload does, so this is only a safety net).
const REAP_WAIT: Duration = Duration::from_secs(5);

/// Waits until the sessions whose workload is gone (their connection hung up: the process
/// exited or was killed) have been torn down, so that their ranks and holdings are free
/// before a new attach picks a rank: a workload restarted at once gets the rank it had.
fn reap_dead(node: &NodeHandle) {
    let dead: Vec<Arc<Ended>> = {
        let core = node.lock();
        core.sessions
            .iter()
            .flatten()
            .filter(|s| exanet_shm::peer_hung_up(&*s.conn))
            .map(|s| Arc::clone(&s.ended))
            .collect()
    };
    let deadline = std::time::Instant::now() + REAP_WAIT;
    for e in dead {
        if !e.wait_until(deadline) {
            warn!("a dead workload's session is not torn down yet");
        }
    }
}

/// Connections open at once, in total and per user.
#[derive(Default)]
struct Connections {
    total: usize,
    per_user: HashMap<u32, usize>,
}

/// A connection's place in [`Connections`], given back when its thread ends.
struct ConnectionSlot {
    conns: Arc<Mutex<Connections>>,
    uid: u32,
}

impl ConnectionSlot {
    fn admit(conns: &Arc<Mutex<Connections>>, uid: u32) -> Result<ConnectionSlot, String> {
        let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
        if c.total >= MAX_CONNECTIONS {
            return Err(format!(
                "{MAX_CONNECTIONS} workload connections already open"
            ));
        }
        let mine = c.per_user.entry(uid).or_default();
        if *mine >= MAX_CONNECTIONS_PER_USER {
            return Err(format!(
                "user {uid} already has {MAX_CONNECTIONS_PER_USER} workload connections open"
            ));
        }
        *mine += 1;
        c.total += 1;
        Ok(ConnectionSlot {
            conns: Arc::clone(conns),
            uid,
        })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut c = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_user.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.per_user.remove(&self.uid);
            }
        }
    }
}

/// Whether a user may connect at all: the daemon's own user, root, or a user or group that
/// some job names.
fn may_connect(node: &NodeHandle, peer: &PeerCredentials, daemon_uid: u32) -> bool {
    let jobs = &node.rack.file.jobs;
    peer.uid == daemon_uid
        || peer.uid == 0
        || jobs
            .values()
            .any(|j| j.uid.contains(&peer.uid) || j.gid.contains(&peer.gid))
}

/// Listens for workloads on `path` until the process exits.
///
/// The socket is open to every user when some job names users or groups (each attach is
/// then authorised by the connecting process's credentials), owner-only otherwise.
pub fn start(
    node: Arc<NodeHandle>,
    mem: ShmMemory,
    path: &Path,
    runtime: Handle,
) -> std::io::Result<()> {
    let listener = crate::control_server::bind_owner_only(path)?;
    // Inherited by every accepted connection from its connect on: a workload's sendmsg with
    // descriptors fails in the workload.
    match exanet_shm::refuse_descriptors(&listener) {
        Ok(true) => {}
        Ok(false) => warn!(
            "this kernel cannot refuse descriptors on the attach socket (SO_PASSRIGHTS, \
             Linux 6.16): any a workload sends are closed on a closer thread"
        ),
        Err(e) => warn!(error = %e, "cannot make the attach socket refuse descriptors"),
    }
    if node
        .rack
        .file
        .jobs
        .values()
        .any(|j| !j.uid.is_empty() || !j.gid.is_empty())
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        // The run directory is made with the daemon's umask (0700 under umask 077), which
        // would keep those users from the socket: let them through it (not list it).
        if let Some(dir) = path.parent() {
            let mode = std::fs::metadata(dir)?.permissions().mode();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o111))?;
        }
    }
    crate::closer::start();
    let daemon_uid = exanet_shm::effective_uid();
    let conns = Arc::new(Mutex::new(Connections::default()));
    std::thread::Builder::new()
        .name("ni-attach".into())
        .spawn(move || {
            let mut backoff = Duration::ZERO;
            for conn in listener.incoming() {
                let conn = match conn {
                    Ok(c) => {
                        backoff = Duration::ZERO;
                        // Dropped wherever the connection ends, closed on a closer thread.
                        CloseLater::new(c)
                    }
                    Err(e) => {
                        // Out of descriptors (EMFILE), say: retrying at once would spin a
                        // core and starve everyone; back off until accepts work again.
                        backoff = (backoff * 2)
                            .max(Duration::from_millis(5))
                            .min(MAX_ACCEPT_BACKOFF);
                        node.count_error("workload_accept");
                        warn!(error = %e, ?backoff, "cannot accept a workload connection");
                        std::thread::sleep(backoff);
                        continue;
                    }
                };
                let peer = match exanet_shm::peer_credentials(&conn) {
                    Ok(p) => p,
                    Err(e) => {
                        node.count_error("workload_refused");
                        debug!(error = %e, "no credentials for a workload connection");
                        continue;
                    }
                };
                if !may_connect(&node, &peer, daemon_uid) {
                    node.count_error("workload_user_refused");
                    info!(
                        uid = peer.uid,
                        pid = peer.pid,
                        "user may not attach to any job"
                    );
                    let _ = conn.set_write_timeout(Some(REPLY_TIMEOUT));
                    let message = format!("user {} may not attach to any job", peer.uid);
                    reply(&conn, &Reply::Error { message }, &[]);
                    continue;
                }
                let slot = match ConnectionSlot::admit(&conns, peer.uid) {
                    Ok(s) => s,
                    Err(message) => {
                        node.count_error("workload_connections");
                        debug!(%message, "workload connection refused");
                        let _ = conn.set_write_timeout(Some(REPLY_TIMEOUT));
                        reply(&conn, &Reply::Error { message }, &[]);
                        continue;
                    }
                };
                let (node, mem, runtime) = (node.clone(), mem.clone(), runtime.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("ni-session".into())
                        .spawn(move || {
                            serve_session(node, mem, runtime, &conn, peer, daemon_uid, slot)
                        });
                if spawned.is_err() {
                    // The slot and the connection went with the closure.
                    warn!("cannot start a thread for a workload connection");
                }
            }
        })?;
    Ok(())
}

/// Why a request could not be read.
enum ReadError {
    /// The connection failed or timed out: the session ends.
    Io(String),
    /// The workload sent something wrong: answered, and the session goes on.
    Protocol(String),
}

/// Reads one request line. No request carries descriptors (the socket refuses them where
/// the kernel can): any that arrive anyway are closed on a closer thread, never here, and
/// the request is refused. Every receive makes room for as many as one message can carry,
/// because the kernel closes those it has no room for in the receiving thread. With a
/// `deadline` the whole line must arrive before it.
fn read_request(
    conn: &UnixStream,
    deadline: Option<std::time::Instant>,
) -> Result<Option<Request>, ReadError> {
    let mut line = Vec::new();
    let mut carried_fds = false;
    let mut buf = [0u8; 1024];
    loop {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(ReadError::Io(format!(
                    "request not complete within {} s",
                    ATTACH_DEADLINE.as_secs()
                )));
            }
            let _ = conn.set_read_timeout(Some(left));
        }
        let (n, got) = match exanet_shm::recv_fds(conn, &mut buf, exanet_shm::fdpass::MAX_FDS) {
            Ok(x) => x,
            Err(exanet_shm::FdPassError::Truncated { .. }) => {
                // More descriptors than one message can carry: only when ours is full.
                return Err(ReadError::Io(
                    "requests carry no descriptors (they were closed)".into(),
                ));
            }
            Err(e) => {
                // SO_RCVTIMEO may fire a tick before the deadline; a timeout that close is the deadline.
                let late = deadline
                    .is_some_and(|d| std::time::Instant::now() + Duration::from_millis(100) >= d);
                return Err(ReadError::Io(if late {
                    format!(
                        "request not complete within {} s",
                        ATTACH_DEADLINE.as_secs()
                    )
                } else {
                    e.to_string()
                }));
            }
        };
        carried_fds |= !got.is_empty();
        got.into_iter().for_each(close_later);
        if n == 0 {
            return Ok(None);
        }
        line.extend_from_slice(&buf[..n]);
        if line.len() > MAX_REQUEST {
            return Err(ReadError::Io(format!(
                "request longer than {MAX_REQUEST} bytes"
            )));
        }
        if line.ends_with(b"\n") {
            break;
        }
    }
    if carried_fds {
        return Err(ReadError::Protocol(
            "requests carry no descriptors (they were closed)".into(),
        ));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| ReadError::Protocol(format!("bad request: {e}")))
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

fn serve_session(
    node: Arc<NodeHandle>,
    mem: ShmMemory,
    runtime: Handle,
    conn: &UnixStream,
    peer: PeerCredentials,
    daemon_uid: u32,
    _slot: ConnectionSlot,
) {
    // A workload that never reads its socket must not hold this thread (and its rank) in a
    // blocking send.
    let _ = conn.set_write_timeout(Some(REPLY_TIMEOUT));
    // The first request must be an attach, complete within the deadline.
    let deadline = std::time::Instant::now() + ATTACH_DEADLINE;
    let (job_key, version, want_rank) = match read_request(conn, Some(deadline)) {
        Ok(Some(Request::Attach {
            version,
            job_key,
            rank,
        })) => (job_key, version, rank),
        Ok(Some(_)) => {
            error(conn, &node, "workload_protocol", "attach first".into());
            return;
        }
        Ok(None) => return,
        Err(ReadError::Io(e) | ReadError::Protocol(e)) => {
            error(conn, &node, "workload_protocol", e);
            return;
        }
    };
    if version != attach::PROTOCOL_VERSION {
        error(
            conn,
            &node,
            "workload_protocol",
            format!(
                "protocol version {version} not supported (this daemon speaks {})",
                attach::PROTOCOL_VERSION
            ),
        );
        return;
    }
    let Some((job_name, job)) = node.rack.job_for(job_key.as_deref()) else {
        error(conn, &node, "workload_refused", "unknown job key".into());
        return;
    };
    if !job.may_join(peer.uid, peer.gid, daemon_uid) {
        error(
            conn,
            &node,
            "workload_user_refused",
            format!(
                "user {} (group {}) may not join job {job_name}",
                peer.uid, peer.gid
            ),
        );
        return;
    }
    let who = Joining {
        job: job_name.to_string(),
        pdid: Pdid(job.pdid),
        limits: Limits::for_rank(
            &node
                .rack
                .file
                .ni
                .as_ref()
                .map(|ni| ni.rank_quota())
                .unwrap_or_default(),
        ),
        // The default job is there even when the rack file does not name it.
        job_limits: Limits::for_job(&job.quota, {
            let jobs = &node.rack.file.jobs;
            jobs.len() + usize::from(!jobs.contains_key("default"))
        }),
        // After whatever earlier programs did on the rack, in modeled time.
        start: attach_clock(),
    };
    let conn_copy = match conn.try_clone() {
        Ok(c) => CloseLater::new(OwnedFd::from(c)),
        Err(e) => {
            error(conn, &node, "workload_refused", e.to_string());
            return;
        }
    };
    let ended = Arc::new(Ended::default());
    let _ended = EndedGuard(Arc::clone(&ended));
    reap_dead(&node);
    let attached = match attach_rank(&node, who, peer, want_rank, conn_copy, ended) {
        Ok(a) => a,
        Err(e) => {
            error(conn, &node, "workload_refused", e);
            return;
        }
    };
    let Attached {
        rank,
        pdid,
        region,
        command,
        from_workload,
        workload_ends,
        reply: attached_reply,
    } = attached;
    let stop = Arc::new(Stop::default());
    // The ring's task holds `served` until it ends, so that the teardown can wait for it
    // from this thread (`recv` fails once it is dropped, however the task ended).
    let (served, ring_done) = std::sync::mpsc::sync_channel::<()>(0);
    // From here on the rank is torn down however this thread ends, a panic included.
    let _teardown = Teardown {
        node: Arc::clone(&node),
        mem: mem.clone(),
        rank,
        stop: Arc::clone(&stop),
        ring_done,
    };
    let ok = reply(
        conn,
        &attached_reply,
        &[
            region.as_raw_fd(),
            workload_ends[0].as_raw_fd(),
            workload_ends[1].as_raw_fd(),
        ],
    );
    // The workload's ends are its own now: the daemon keeping a copy would hide the
    // workload's exit from the doorbell it waits on. Closed by a closer all the same: they
    // are ends the workload may already be using.
    workload_ends.into_iter().for_each(close_later);
    if ok {
        info!(
            rank,
            pdid,
            pid = peer.pid,
            uid = peer.uid,
            "workload attached"
        );
    }
    if ok {
        let (node, stop) = (node.clone(), stop.clone());
        runtime.spawn(async move {
            let _served = served;
            serve_ring(node, rank, command, from_workload, stop).await
        });
    } else {
        // No ring task to wait for: the reply failed (the workload hung up or stopped
        // reading during the exchange), and the teardown below frees the rank at once.
        drop(served);
        close_later(from_workload);
    }
    let _ = conn.set_read_timeout(None);
    if ok {
        loop {
            let req = match read_request(conn, None) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(ReadError::Io(e)) => {
                    debug!(rank, error = %e, "workload connection failed");
                    break;
                }
                Err(ReadError::Protocol(e)) => {
                    if !error(conn, &node, "workload_protocol", e) {
                        break;
                    }
                    continue;
                }
            };
            let sent = match handle_request(&node, &mem, rank, job_name, req) {
                Ok((r, fd)) => {
                    let fds: Vec<i32> = fd.iter().map(|f| f.as_raw_fd()).collect();
                    reply(conn, &r, &fds)
                }
                Err((kind, e)) => error(conn, &node, kind, e),
            };
            if !sent {
                break;
            }
        }
    }
    // The workload is gone (or broke the protocol, or stopped reading): `_teardown` frees
    // everything it held.
}

/// A session's teardown, when its thread ends however it ends. Nothing here waits on the
/// workload: the ring's task is stopped through the runtime (never through a descriptor
/// the workload shares, which it could hold) and none of its calls can block on the
/// workload, so the wait for it is bounded; the connection and the doorbells are closed
/// by closers, the memory given back on them.
struct Teardown {
    node: Arc<NodeHandle>,
    mem: ShmMemory,
    rank: u8,
    stop: Arc<Stop>,
    ring_done: std::sync::mpsc::Receiver<()>,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        let (node, rank) = (&self.node, self.rank);
        self.stop.set();
        let _ = self.ring_done.recv();
        let given_back = {
            let now = node.now();
            let mut core = node.lock();
            core.sessions[rank as usize] = None;
            let (svc, ni, _) = core.workloads();
            svc.detach(ni, rank, now);
            core.pump(now);
            // Under the core lock, so that a workload attaching to this rank right after
            // cannot have its fresh registrations erased.
            self.mem.clear(rank)
        };
        let deadline = std::time::Instant::now() + crate::shm_memory::SETTLE;
        if !given_back.iter().all(|g| g.wait_until(deadline)) {
            warn!(
                rank,
                "a detached workload's memory is not given back yet (held by it?)"
            );
        }
        info!(rank, "workload detached");
    }
}

struct Attached {
    rank: u8,
    pdid: u16,
    region: Arc<Region>,
    command: Consumer,
    /// The daemon's end of the workload -> daemon doorbell.
    from_workload: Doorbell,
    /// The workload's ends of both doorbells, to send it.
    workload_ends: [OwnedFd; 2],
    reply: Reply,
}

/// Where the modeled clock of a process attaching now starts: the wall clock, so after
/// whatever earlier programs did on the rack. The cut coordinator's attach floor is the
/// same clock (`crate::cuts`): no process attaching after a cut starts before it.
pub(crate) fn attach_clock() -> ModelTime {
    ModelTime::from_wall(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// Takes a free rank for `who`, within its job's quota, and makes its rings and doorbells.
fn attach_rank(
    node: &NodeHandle,
    who: Joining,
    peer: PeerCredentials,
    want_rank: Option<u8>,
    conn: CloseLater<OwnedFd>,
    ended: Arc<Ended>,
) -> Result<Attached, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let cmd_ring = Ring::new(0, COMMAND_SLOTS, RING_SLOT).map_err(|x| e(&x))?;
    let cpl_offset = cmd_ring.end().div_ceil(Ring::ALIGN) * Ring::ALIGN;
    let cpl_ring = Ring::new(cpl_offset, COMPLETION_SLOTS, RING_SLOT).map_err(|x| e(&x))?;
    let consumed_offset = cpl_ring.end().div_ceil(Ring::ALIGN) * Ring::ALIGN;
    let region = Arc::new(
        Region::create("exanet-rings", consumed_offset + attach::CONSUMED_LEN)
            .map_err(|x| e(&x))?,
    );
    cmd_ring.init(&region).map_err(|x| e(&x))?;
    cpl_ring.init(&region).map_err(|x| e(&x))?;
    let command = cmd_ring.consumer(region.clone()).map_err(|x| e(&x))?;
    let completions = cpl_ring.producer(region.clone()).map_err(|x| e(&x))?;
    let (to_workload, to_workload_peer) = exanet_shm::doorbell().map_err(|x| e(&x))?;
    let (from_workload_peer, from_workload) = exanet_shm::doorbell().map_err(|x| e(&x))?;
    let mut core = node.lock();
    let (pdid, start) = (who.pdid.0, who.start);
    let ring = ShmRing {
        completions,
        to_workload: Arc::new(CloseLater::new(to_workload)),
        slow_rings: None,
        rings: Arc::clone(&region),
        consumed_offset,
        pid: peer.pid,
        commands: cmd_ring,
    };
    let (svc, ni, _) = core.workloads();
    let rank = match want_rank {
        Some(r) => svc.attach_at(ni, r, who, Box::new(ring)),
        None => svc.attach(ni, who, Box::new(ring)),
    };
    let rank = match rank {
        Ok(r) => r,
        Err(x) => {
            // Through the guard: `node.count_error` would take the core lock a second time.
            if matches!(x, ServiceError::Quota(_)) {
                core.station.count_error(x.kind());
            }
            return Err(format!("{x} on {}", node.name));
        }
    };
    core.sessions[rank as usize] = Some(Session { peer, conn, ended });
    let nodes = node.rack.shape().nodes();
    Ok(Attached {
        rank,
        pdid,
        reply: Reply::Attached {
            node: node.name.clone(),
            node_id: node.id.0,
            rank,
            pdid,
            command_slots: COMMAND_SLOTS,
            completion_slots: COMPLETION_SLOTS,
            command_offset: 0,
            completion_offset: cpl_offset as u64,
            consumed_offset: consumed_offset as u64,
            region_len: region.len() as u64,
            nodes,
            software_ps: node.rack.model().software,
            compute_scale_ppm: node.rack.model().compute_scale_ppm,
            clock_ps: start.ps(),
        },
        region,
        command,
        from_workload,
        workload_ends: [to_workload_peer.into_fd(), from_workload_peer.into_fd()],
    })
}

/// Answers a control request of `rank`: the service decides, and here its memory is
/// made and forgotten. An error names what to count it under.
fn handle_request(
    node: &NodeHandle,
    mem: &ShmMemory,
    rank: u8,
    job: &str,
    req: Request,
) -> Result<(Reply, Option<OwnedFd>), (&'static str, String)> {
    let refused = |e: ServiceError| (e.kind(), e.to_string());
    let (control, given_back) = {
        let mut core = node.lock();
        let (svc, ni, _) = core.workloads();
        let control = svc.control(ni, rank, req).map_err(refused)?;
        // Under the same lock: the NI never sees a region the service has forgotten.
        let mut given_back = None;
        if let Control::ForgetRegion(placed) = &control {
            given_back = mem.remove(rank, placed.va).map(|(_, g)| g);
        }
        (control, given_back)
    };
    match control {
        Control::Answer(r) => Ok((r, None)),
        Control::ForgetRegion(_) => {
            // Answered once the region's share is back in the host's budget (or after a
            // bounded wait, if the workload holds its memory): a registration right after,
            // on any node of the host, finds it there.
            let deadline = std::time::Instant::now() + crate::shm_memory::SETTLE;
            if given_back.is_some_and(|g| !g.wait_until(deadline)) {
                debug!(rank, "an unregistered region is not given back yet");
            }
            Ok((Reply::Ok, None))
        }
        Control::MakeRegion(pending) => {
            // Made and allocated outside the core lock: it may take a while for a large
            // region, and every other rank's traffic needs that lock.
            let made = usize::try_from(pending.bytes())
                .ok()
                .filter(|s| *s <= isize::MAX as usize)
                .ok_or_else(|| {
                    let e = format!("cannot register {} bytes", pending.bytes());
                    ("workload_request", e)
                })
                .and_then(|size| {
                    let name = format!("exanet-{}-r{rank}", node.name);
                    mem.create_region(&name, size, rank, job)
                        .map_err(|e| (e.kind(), e.to_string()))
                });
            // Placed and mapped under one lock: the NI sees the region where the service
            // says it is, or not at all.
            let mut core = node.lock();
            let (svc, _, _) = core.workloads();
            let (region, fd) = match made {
                Ok(x) => x,
                Err(e) => {
                    svc.abandon_region(pending);
                    return Err(e);
                }
            };
            let placed = svc.place_region(pending).map_err(refused)?;
            mem.insert(rank, placed.va, region);
            Ok((
                Reply::Registered {
                    region: placed.id,
                    va: placed.va,
                },
                Some(fd),
            ))
        }
    }
}

/// The end of a ring task, asked by the session's teardown: a flag the task looks at
/// between batches and a wake-up for the task asleep on its doorbell. Through the runtime
/// alone: the stop once rang a dup of the workload's own ringer, which the workload could
/// hold (a pipe's mutex, behind a `splice`), so that the teardown hung in the ring.
#[derive(Default)]
struct Stop {
    set: AtomicBool,
    wake: Notify,
}

impl Stop {
    fn set(&self) {
        self.set.store(true, Ordering::Release);
        // A stored permit: a task not asleep yet finds it at its next wait.
        self.wake.notify_one();
    }

    fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }
}

/// Serves the command ring of one session on the daemon's runtime until `stop`.
///
/// On the runtime, not on a thread of its own: a command then reaches the links with one
/// wake-up (the workload's ring, which the runtime's poller hears), where a ring thread
/// took two (the workload woke the thread, the thread woke the runtime to write the
/// frames), and on a host with fewer cores than busy threads every wake-up is a wait for
/// a core. Nothing here blocks: ring slots are taken without waiting, at most a batch
/// under one lock, and the task yields between batches so that links and other sessions
/// are served while a workload floods its ring.
async fn serve_ring(
    node: Arc<NodeHandle>,
    rank: u8,
    mut ring: Consumer,
    bell: Doorbell,
    stop: Arc<Stop>,
) {
    // The runtime watches a second descriptor of the doorbell's socket (tokio's stream
    // registers it safely); the rings are consumed through the doorbell itself.
    let ready = bell
        .as_fd()
        .try_clone_to_owned()
        .and_then(|fd| tokio::net::UnixStream::from_std(UnixStream::from(fd)));
    match ready {
        Ok(ready) => {
            if serve_ring_on(&node, rank, &mut ring, (&bell, &ready), &stop).await
                == RingEnd::Readable
            {
                drain_at_end(&node, rank, &mut ring);
            }
            // Deregistered and closed first: the doorbell's own close is the socket's last,
            // on a closer (descriptors a workload sent to it where the kernel cannot refuse
            // them would be closed with it).
            drop(ready);
        }
        Err(e) => {
            warn!(rank, error = %e, "cannot watch the command doorbell");
            node.count_error("workload_ring");
        }
    }
    close_later(bell);
}

/// A doorbell and the runtime's watch on it.
type Watched<'a> = (&'a Doorbell, &'a tokio::net::UnixStream);

/// How a ring's service ended: with the ring still to be trusted (the session's end, or
/// the workload's ringers closed: it exited), or corrupted (nothing more is read from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RingEnd {
    Readable,
    Corrupt,
}

/// Carries out what the workload left in its command ring when its service ended (it
/// exited right after posting, say): these commands were dropped, and a member that
/// aborted a collective had to wait for its aborts to go out before detaching. At most
/// one ring's worth: a process of the workload still writing the ring cannot keep the
/// teardown going.
fn drain_at_end(node: &NodeHandle, rank: u8, ring: &mut Consumer) {
    let mut buf = vec![0u8; ring.max_message_len()];
    let mut batch = Vec::new();
    if let Err(e) = take_commands(ring, &mut buf, &mut batch, COMMAND_SLOTS as usize) {
        // What came before the corruption is carried out.
        warn!(rank, error = %e, "workload corrupted its command ring at detach");
        node.count_error("workload_ring");
    }
    if batch.is_empty() {
        return;
    }
    let commands = batch.len();
    let refused = execute_batch(node, rank, &mut batch);
    info!(
        rank,
        commands, refused, "carried out what the workload left in its command ring"
    );
}

/// A command as the ring gave it: decoded, or the slot's error to answer.
type Taken = Result<Command, (u32, attach::SlotError)>;

/// Takes commands off `ring` into `batch` until it is empty or `batch` holds `max`.
fn take_commands(
    ring: &mut Consumer,
    buf: &mut [u8],
    batch: &mut Vec<Taken>,
    max: usize,
) -> Result<(), exanet_shm::RingError> {
    while batch.len() < max {
        match ring.pop(buf)? {
            Some(n) => batch.push(Command::decode(&buf[..n])),
            None => break,
        }
    }
    Ok(())
}

/// Executes `batch` (emptying it) under one core lock, counting refusals; returns how many
/// were refused.
fn execute_batch(node: &NodeHandle, rank: u8, batch: &mut Vec<Taken>) -> usize {
    let now = node.now();
    let mut refused = 0;
    let mut core = node.lock();
    for c in batch.drain(..) {
        let (svc, ni, mem) = core.workloads();
        if let Err(e) = svc.execute(ni, mem, rank, c, now) {
            debug!(rank, error = %e, "command refused");
            refused += 1;
            core.station.count_error(match e {
                ServiceError::Malformed(_) => "workload_malformed",
                _ => "workload_refused_command",
            });
        }
    }
    core.drain(rank);
    core.pump(now);
    refused
}

async fn serve_ring_on(
    node: &NodeHandle,
    rank: u8,
    ring: &mut Consumer,
    bell: Watched<'_>,
    stop: &Stop,
) -> RingEnd {
    let mut buf = vec![0u8; ring.max_message_len()];
    let mut batch: Vec<Taken> = Vec::new();
    // Commands tend to come in runs: for `node.spin` after the last one the ring is looked
    // at again between other tasks' turns, which spares the workload a ring and the
    // runtime a wake-up for each command of a run.
    let mut last_command = std::time::Instant::now();
    while !stop.is_set() {
        // A workload that does not read its completions is not served further commands
        // until it does: its command ring fills and it is held back, instead of the
        // daemon queueing completions for it without bound.
        let held_back = node.lock().workloads().0.held_back(rank);
        if held_back {
            if let Err(e) = rung(node, bell, stop, Some(Duration::from_millis(5))).await {
                ring_closed(node, rank, &e);
                return RingEnd::Readable;
            }
            continue;
        }
        if let Err(e) = take_commands(ring, &mut buf, &mut batch, 64) {
            warn!(rank, error = %e, "workload corrupted its command ring");
            node.count_error("workload_ring");
            // The ring cannot be trusted any more; the session ends when the workload's
            // connection does. Stop reading it.
            return RingEnd::Corrupt;
        }
        if !batch.is_empty() {
            execute_batch(node, rank, &mut batch);
            last_command = std::time::Instant::now();
            tokio::task::yield_now().await;
            continue;
        }
        if let Err(e) = ring.check_header() {
            // Geometry rewritten under us: nothing in this ring can be trusted.
            warn!(rank, error = %e, "workload corrupted its command ring");
            node.count_error("workload_ring");
            return RingEnd::Corrupt;
        }
        if last_command.elapsed() < node.spin {
            tokio::task::yield_now().await;
            continue;
        }
        // Room may have appeared in the completion ring. Look again in 20 ms only if
        // something waits for it: an idle session sleeps until the workload rings, or the
        // session's end rings our own ringer.
        let waiting = {
            let mut core = node.lock();
            core.drain(rank);
            let (svc, ni, _) = core.workloads();
            svc.waiting_for_room(ni, rank)
        };
        let timeout = waiting.then_some(Duration::from_millis(20));
        // Announce the sleep and look once more, so that a command pushed meanwhile is
        // not left waiting for a ring the workload did not send (see exanet_shm::doorbell).
        match ring.prepare_sleep() {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => {
                warn!(rank, error = %e, "workload corrupted its command ring");
                node.count_error("workload_ring");
                return RingEnd::Corrupt;
            }
        }
        // Every wake-up goes round the loop: the session's end wakes us after setting
        // `stop`, and a ring from the workload with nothing new in its ring gets its header
        // looked at.
        let woke = rung(node, bell, stop, timeout).await;
        let _ = ring.finish_sleep();
        if let Err(e) = woke {
            ring_closed(node, rank, &e);
            return RingEnd::Readable;
        }
    }
    RingEnd::Readable
}

/// Waits until `bell` is rung (consuming the rings), `stop` is set or `timeout` passes:
/// `Ok(false)` on timeout or stop; `BrokenPipe` once every ringer is closed. Descriptors a
/// workload sent with its rings (kernels without `SO_PASSRIGHTS`) are closed by a closer.
async fn rung(
    node: &NodeHandle,
    (bell, ready): Watched<'_>,
    stop: &Stop,
    timeout: Option<Duration>,
) -> std::io::Result<bool> {
    let wait = async {
        loop {
            ready.readable().await?;
            let mut strays = 0usize;
            // Readiness without a ring (spurious, or drained already): `WouldBlock` makes
            // the runtime forget it and wait for the next.
            let drained = ready.try_io(Interest::READABLE, || {
                let rang = bell.drain_with(&mut |fd| {
                    strays += 1;
                    close_later(fd);
                })?;
                match rang {
                    true => Ok(()),
                    false => Err(std::io::ErrorKind::WouldBlock.into()),
                }
            });
            if strays > 0 {
                node.count_error("workload_descriptors");
            }
            match drained {
                Ok(()) => return Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    };
    let stopped = stop.wake.notified();
    let wait_or_stop = async {
        tokio::select! {
            r = wait => r,
            _ = stopped => Ok(false),
        }
    };
    match timeout {
        Some(t) => tokio::time::timeout(t, wait_or_stop)
            .await
            .unwrap_or(Ok(false)),
        None => wait_or_stop.await,
    }
}

/// Ends a ring's service on a failed doorbell.
fn ring_closed(node: &NodeHandle, rank: u8, e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // Every ringer is closed (the workload exited, and the session is ending): the
        // session ends when the control connection does.
        debug!(rank, "command doorbell closed");
    } else {
        warn!(rank, error = %e, "command ring wait failed");
        node.count_error("workload_ring");
    }
}

/// Keeps the NI's timers: sleeps until the next deadline (or until the core says a
/// sooner one appeared) and lets the NI retransmit and expire.
pub async fn timer_loop(node: Arc<NodeHandle>) {
    loop {
        let deadline = {
            let mut core = node.lock();
            let d = core.station.poll_timeout();
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
                        core.station.handle_timeout(now);
                        core.pump(now);
                    }
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}
