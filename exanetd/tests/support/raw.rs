//! The daemon's workload interface spoken by hand (no client library), for tests that
//! attach well-behaved and hostile workloads to real daemons. Only what the protocol in
//! `exanet_proto::attach` says: JSON lines on `run/<NODE>.ni`, descriptors with replies,
//! two rings in shared memory and two socket-pair doorbells.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use exanet_control::rack::Layout;
use exanet_proto::attach::{Command, Completion, Reply, Request, Resource, SLOT};
use exanet_shm::{Consumer, Producer, Region, Ring, Ringer};

use super::TestRack;

pub struct Workload {
    pub conn: UnixStream,
    pub rank: u8,
    pub pdid: u16,
    /// The region holding both rings.
    pub region: Arc<Region>,
    pub commands: Producer,
    pub completions: Consumer,
    pub to_daemon: Ringer,
    /// The workload's end of the daemon -> workload doorbell (the tests never wait on it).
    pub from_daemon: OwnedFd,
    /// Offsets of the command and completion rings in `region`, and of the counters of
    /// messages taken from each mailbox.
    pub command_offset: usize,
    pub completion_offset: usize,
    pub consumed_offset: usize,
    pub got: Vec<Completion>,
}

/// Sends one request line (with `fds`) and reads the reply line and its descriptors.
pub fn try_request(
    conn: &UnixStream,
    req: &Request,
    fds: &[i32],
) -> Result<(Reply, Vec<OwnedFd>), String> {
    let mut line = serde_json::to_vec(req).unwrap();
    line.push(b'\n');
    // A daemon that refuses a connection at once answers and closes before the request
    // is sent: its answer is still there to read.
    let sent = exanet_shm::send_fds(conn, &line, fds).map_err(|e| format!("send: {e}"));
    let mut buf = [0u8; 4096];
    let mut all = Vec::new();
    let mut fds = Vec::new();
    while !all.ends_with(b"\n") {
        let (n, mut f) = match exanet_shm::recv_fds(conn, &mut buf, 4) {
            Ok(x) => x,
            Err(e) => return Err(sent.err().unwrap_or_else(|| format!("recv: {e}"))),
        };
        if n == 0 {
            sent?;
            return Err(format!(
                "daemon closed the attach socket after {:?}",
                String::from_utf8_lossy(&all)
            ));
        }
        fds.append(&mut f);
        all.extend_from_slice(&buf[..n]);
    }
    let reply = serde_json::from_slice(&all).map_err(|e| format!("bad reply: {e}"))?;
    Ok((reply, fds))
}

pub fn request(conn: &UnixStream, req: &Request, fds: &[i32]) -> (Reply, Vec<OwnedFd>) {
    try_request(conn, req, fds).unwrap()
}

/// Attaches to the node whose attach socket is `path`; the daemon's refusal as an error.
pub fn attach_at(path: &Path, key: Option<&str>) -> Result<Workload, String> {
    attach_rank_at(path, key, None)
}

/// Attaches asking for rank `rank` (`None`: any).
pub fn attach_rank_at(
    path: &Path,
    key: Option<&str>,
    rank: Option<u8>,
) -> Result<Workload, String> {
    let conn = UnixStream::connect(path).map_err(|e| e.to_string())?;
    // Never wait for ever on a daemon that does not answer.
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (reply, mut fds) = try_request(
        &conn,
        &Request::Attach {
            version: exanet_proto::attach::PROTOCOL_VERSION,
            job_key: key.map(String::from),
            rank,
        },
        &[],
    )?;
    let Reply::Attached {
        rank,
        pdid,
        command_slots,
        completion_slots,
        command_offset,
        completion_offset,
        consumed_offset,
        ..
    } = reply
    else {
        return Err(format!("{reply:?}"));
    };
    assert_eq!(fds.len(), 3);
    let to_daemon = Ringer::from_fd(fds.pop().unwrap()).unwrap();
    let from_daemon = fds.pop().unwrap();
    let region = Arc::new(Region::from_fd(fds.pop().unwrap()).unwrap());
    let commands = Ring::new(command_offset as usize, command_slots, 256)
        .unwrap()
        .producer(region.clone())
        .unwrap();
    let completions = Ring::new(completion_offset as usize, completion_slots, 256)
        .unwrap()
        .consumer(region.clone())
        .unwrap();
    Ok(Workload {
        conn,
        rank,
        pdid,
        region,
        commands,
        completions,
        to_daemon,
        from_daemon,
        command_offset: command_offset as usize,
        completion_offset: completion_offset as usize,
        consumed_offset: consumed_offset as usize,
        got: Vec::new(),
    })
}

pub fn attach(r: &TestRack, node: &str, key: Option<&str>) -> Result<Workload, String> {
    attach_at(&Layout::new(&r.dir).attach_socket(&node), key)
}

/// Attaches, retrying for up to `within` while the daemon refuses (a rank or a connection
/// of a workload that just left may not be given back yet).
pub fn attach_within(
    r: &TestRack,
    node: &str,
    key: Option<&str>,
    within: Duration,
) -> Result<Workload, String> {
    let t0 = Instant::now();
    loop {
        match attach(r, node, key) {
            Ok(w) => return Ok(w),
            Err(e) if t0.elapsed() >= within => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

impl Workload {
    pub fn alloc(&self, kind: Resource) -> u8 {
        match request(
            &self.conn,
            &Request::Alloc {
                kind,
                capacity: Some(16),
                index: None,
            },
            &[],
        )
        .0
        {
            Reply::Allocated { index, .. } => index,
            other => panic!("{other:?}"),
        }
    }

    /// Registers `len` bytes: the daemon's memory, mapped here, and its VA on this rank.
    pub fn register(&self, len: usize) -> (Region, u64) {
        let (mem, va, _) = self.register_region(len);
        (mem, va)
    }

    /// [`Workload::register`], with the region's id (to unregister it).
    pub fn register_region(&self, len: usize) -> (Region, u64, u32) {
        let (reply, mut fds) = request(&self.conn, &Request::Register { len: len as u64 }, &[]);
        match reply {
            Reply::Registered { va, region } => {
                assert_eq!(fds.len(), 1, "registered memory comes with its memfd");
                let mem = Region::from_fd_with_len(fds.pop().unwrap(), len).unwrap();
                (mem, va, region)
            }
            other => panic!("{other:?}"),
        }
    }

    pub fn post(&mut self, c: &Command) {
        self.post_slot(&c.encode());
    }

    /// Posts any 128 bytes as a command slot, waiting while the ring is full.
    pub fn post_slot(&mut self, slot: &[u8; SLOT]) {
        let t0 = Instant::now();
        while self.commands.push(slot).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "command ring stayed full"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        self.commands.wake_consumer(&self.to_daemon).unwrap();
    }

    /// Says that the workload took a message of mailbox `vi` (so that it no longer counts
    /// against the mailbox's capacity); [`Workload::wait`] does when it returns one.
    pub fn took(&self, vi: u8) {
        self.region
            .atomic_u64(self.consumed_offset + usize::from(vi) * 8)
            .unwrap()
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// Moves what the completion ring holds into `got`.
    pub fn poll(&mut self) {
        let mut buf = [0u8; 256];
        while let Some(n) = self.completions.pop(&mut buf).unwrap() {
            assert_eq!(n, SLOT);
            self.got.push(Completion::decode(&buf[..n]).unwrap());
        }
    }

    /// Waits (polling) up to `within` for a completion matching `f`.
    pub fn wait_within(
        &mut self,
        within: Duration,
        f: impl Fn(&Completion) -> bool,
    ) -> Option<Completion> {
        let t0 = Instant::now();
        loop {
            if let Some(i) = self.got.iter().position(&f) {
                let c = self.got.remove(i);
                if let Completion::Message { vi, .. } = c {
                    self.took(vi);
                }
                return Some(c);
            }
            let before = self.got.len();
            self.poll();
            if self.got.len() == before {
                if t0.elapsed() >= within {
                    return None;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Waits (polling) for a completion matching `f`; panics after 15 s.
    pub fn wait(&mut self, what: &str, f: impl Fn(&Completion) -> bool) -> Completion {
        match self.wait_within(Duration::from_secs(15), f) {
            Some(c) => c,
            None => panic!("no {what}; got {:?}", self.got),
        }
    }
}

/// Makes a descriptor blocking, as a hostile workload would on the descriptors it was given.
pub fn make_blocking(fd: &impl std::os::fd::AsFd) {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL).unwrap());
    assert_eq!(
        fcntl(fd, FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK)),
        Ok(0)
    );
}

/// The daemon's open descriptors.
pub fn daemon_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The daemon's threads.
pub fn daemon_threads(pid: u32) -> usize {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}
