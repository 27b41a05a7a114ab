//! A fake node daemon for tests that need no rack: the I/O shell of a daemon (the attach
//! socket, the ring region and doorbells passed as descriptors, a command-ring thread per
//! workload) around the real core. It is node M1QAF2 of a 2x1x1 rack simulated in process
//! (`exanet_proto::sim`): its workload service (`exanet_proto::workload`) and NI decide
//! what a daemon's decide (ranks, where registered memory goes, NI resources, what a
//! command does and which completion it ends in), and the rest of the rack answers as a
//! rack does. Registered memory is shared memory the fake makes, mapped where the service
//! places it. After each batch of commands the rack runs
//! forward in simulated time, past the NI's whole retry schedule, so what a batch started
//! has ended (completed, NACKed or timed out) before the fake looks at its ring again.
//!
//! On request it misbehaves instead of serving commands (see [`Behavior`]).

#![allow(dead_code)]

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use exanet_proto::attach::{self, Command, Reply, Request, SlotError, CONSUMED_LEN, SLOT};
use exanet_proto::fault::LinkFaults;
use exanet_proto::ni::mailbox::ConsumedCount;
use exanet_proto::ni::{Backing, BackingFault, MemFault, Memory, Regions};
use exanet_proto::sim::{Sim, SimConfig};
use exanet_proto::workload::{CompletionRing, Control, Joining};
use exanet_proto::{NodeId, Pdid, Shape};
use exanet_shm::{
    doorbell, recv_fds, send_fds, Consumer, Doorbell, Producer, Region, Ring, Ringer, Waiter,
};

/// What the fake does with commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Serves them through the simulated rack, as a daemon does.
    Serve,
    /// Never completes anything.
    Silent,
    /// On a command, writes a completion slot of the wrong size.
    ShortSlot,
    /// On a command, writes a completion of an unknown kind.
    UnknownKind,
    /// On a command, moves the completion ring's tail far ahead.
    RunawayTail,
    /// On a command, closes the connection and stops.
    Die,
}

pub const PDID: u16 = 7;
pub const GOOD_KEY: &str = "good-key";
pub const NODE: &str = "M1QAF2";
pub const NODE_ID: u32 = 1;
/// The rank the first workload attached gets: the service gives the lowest free one.
pub const RANK: u8 = 0;
/// The modeled software cost per call the fake daemon announces: 400 ns, the order of the
/// report's MPI calls, so that tests see the client library add it.
pub const FAKE_SOFTWARE_PS: u64 = 400_000;
const ME: NodeId = NodeId(NODE_ID);
/// Simulated time run after each batch of commands: longer than the NI's whole retry
/// schedule (8 attempts, backing off from 20 ms, ~3.8 s) and its memory of finished
/// messages (2 s). Only events are simulated, so an idle stretch costs nothing.
const HORIZON_NS: u64 = 10_000_000_000;
const RING_SLOT: u32 = 256;
const COMMAND_SLOTS: u32 = 256;
const COMPLETION_SLOTS: u32 = 1024;

pub struct Fake {
    pub dir: PathBuf,
    stop: Arc<AtomicBool>,
    pub attaches: Arc<AtomicU32>,
    core: Arc<Mutex<Core>>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Unblock the accept loop.
        let _ = UnixStream::connect(self.dir.join("run").join(format!("{NODE}.ni")));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The simulated rack and the memory node M1QAF2's ranks registered.
struct Core {
    sim: Sim,
    mem: Registered,
}

impl Core {
    /// Lets the node act on what it was given, and the rack run until it is quiet or
    /// [`HORIZON_NS`] has passed.
    fn run(&mut self) {
        self.sim.kick(ME);
        let until = self.sim.now() + HORIZON_NS;
        self.sim.run_until(until);
        // Nobody reads these here; keep them from piling up.
        let _ = (self.sim.take_events(), self.sim.take_finished());
    }

    /// Carries out a batch of `rank`'s command slots.
    fn execute(&mut self, rank: u8, batch: &mut Vec<Result<Command, (u32, SlotError)>>) {
        let now = self.sim.now();
        let (svc, ni, mem) = self.sim.workloads(ME);
        for c in batch.drain(..) {
            // A refusal is a completion already; the daemon only counts it.
            let _ = svc.execute(ni, mem, rank, c, now);
        }
        svc.drain(ni, rank);
        self.run();
    }
}

/// Memory registered by the node's ranks: shared memory regions at the VAs the service
/// placed them, looked up by the core's `Regions` (as the daemon's `ShmMemory`).
#[derive(Clone, Default)]
struct Registered(Arc<Mutex<Regions<Shm>>>);

/// A shared memory region as the NI's backing store.
struct Shm(Region);

impl Backing for Shm {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), BackingFault> {
        self.0.read(off, buf).map_err(|_| BackingFault)
    }
    fn write_at(&mut self, off: usize, data: &[u8]) -> Result<(), BackingFault> {
        self.0.write(off, data).map_err(|_| BackingFault)
    }
}

impl Memory for Registered {
    fn contains(&self, rank: u8, va: u64, len: u64) -> bool {
        self.0.lock().unwrap().contains(rank, va, len)
    }
    fn read(&self, rank: u8, va: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        self.0.lock().unwrap().read(rank, va, buf)
    }
    fn write(&mut self, rank: u8, va: u64, data: &[u8]) -> Result<(), MemFault> {
        self.0.lock().unwrap().write(rank, va, data)
    }
}

/// A workload's completion ring in shared memory, with the doorbell that wakes it and its
/// consumed counters (as the daemon's `ShmRing`); shared between the service and the
/// misbehaviours of the command-ring thread.
#[derive(Clone)]
struct Completions(Arc<Mutex<Out>>);

struct Out {
    p: Producer,
    bell: Ringer,
    rings: Arc<Region>,
    consumed_offset: usize,
}

impl Completions {
    fn lock(&self) -> MutexGuard<'_, Out> {
        self.0.lock().unwrap()
    }
}

impl CompletionRing for Completions {
    fn push(&mut self, slot: &[u8; SLOT]) -> bool {
        self.lock().p.push(slot).is_ok()
    }

    fn has_room(&mut self) -> bool {
        self.lock().p.free().is_ok_and(|n| n > 0)
    }

    fn wake(&mut self) {
        let o = self.lock();
        let _ = o.p.wake_consumer(&o.bell);
    }

    fn consumed(&self, vi: u8) -> Box<dyn ConsumedCount> {
        let o = self.lock();
        let (rings, offset) = (o.rings.clone(), o.consumed_offset + usize::from(vi) * 8);
        Box::new(move || {
            rings
                .atomic_u64(offset)
                .map_or(0, |c| c.load(Ordering::Acquire))
        })
    }
}

impl Fake {
    /// Starts a fake daemon for node M1QAF2 of a 2x1x1 rack in a fresh directory.
    pub fn start(tag: &str, behavior: Behavior) -> Fake {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "exanet-fake-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        std::fs::write(
            dir.join("rack.toml"),
            "name = \"fake\"\nshape = \"2x1x1\"\n",
        )
        .unwrap();
        let shape: Shape = "2x1x1".parse().unwrap();
        assert_eq!(shape.parse_node(NODE).unwrap(), ME);
        let mut sim = Sim::new(shape, SimConfig::default()).unwrap();
        let mem = Registered::default();
        sim.node_mut(ME).set_memory(Box::new(mem.clone()));
        let core = Arc::new(Mutex::new(Core { sim, mem }));
        let listener = UnixListener::bind(dir.join("run").join(format!("{NODE}.ni"))).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let attaches = Arc::new(AtomicU32::new(0));
        {
            let (stop, attaches, core) = (stop.clone(), attaches.clone(), core.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let (stop, attaches, core) = (stop.clone(), attaches.clone(), core.clone());
                    std::thread::spawn(move || session(conn, behavior, core, stop, attaches));
                }
            });
        }
        Fake {
            dir,
            stop,
            attaches,
            core,
        }
    }

    /// The collectives workloads reported, summed by kind and path: (started, completed,
    /// failed).
    pub fn collective_counts(
        &self,
    ) -> std::collections::BTreeMap<(&'static str, &'static str), (u64, u64, u64)> {
        let mut out = std::collections::BTreeMap::new();
        let core = self.core.lock().unwrap();
        for (_, r) in core.sim.station(ME).workload_service().collective_counts() {
            let e: &mut (u64, u64, u64) = out.entry((r.kind.label(), r.path.label())).or_default();
            e.0 += r.started;
            e.1 += r.completed;
            e.2 += r.failed;
        }
        out
    }

    /// How many workloads the node's service has attached.
    pub fn attached(&self) -> usize {
        self.core.lock().unwrap().sim.workloads(ME).0.attached()
    }

    /// Cuts node `id` off the rack: every link to and from it loses every cell (a cut
    /// link is the daemon's to carry out, not the simulator's).
    pub fn isolate(&self, id: u32) {
        let id = NodeId(id);
        let mut core = self.core.lock().unwrap();
        let shape = *core.sim.shape();
        let all = LinkFaults {
            loss: 1.0,
            ..LinkFaults::default()
        };
        for l in exanet_proto::topology::links(&shape) {
            if l.a == id || l.b == id {
                core.sim.set_link_faults(l.a, l.b, all, 1).unwrap();
                core.sim.set_link_faults(l.b, l.a, all, 2).unwrap();
            }
        }
    }
}

fn read_request(conn: &UnixStream) -> Option<Request> {
    let mut line = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        // No request carries descriptors; any that come are closed.
        let (n, _fds) = recv_fds(conn, &mut buf, 4).ok()?;
        if n == 0 {
            return None;
        }
        line.extend_from_slice(&buf[..n]);
        if line.ends_with(b"\n") {
            break;
        }
    }
    serde_json::from_slice(&line).ok()
}

fn reply(conn: &UnixStream, r: &Reply, fds: &[i32]) {
    let mut line = serde_json::to_vec(r).unwrap();
    line.push(b'\n');
    if fds.is_empty() {
        let _ = (&*conn).write_all(&line);
    } else {
        let _ = send_fds(conn, &line, fds);
    }
}

fn refuse(conn: &UnixStream, message: String) {
    reply(conn, &Reply::Error { message }, &[]);
}

/// A workload attached: its rank and rings, and the doorbells' ends to hand it.
struct Attached {
    rank: u8,
    region: Arc<Region>,
    commands: Consumer,
    completions: Completions,
    completion_offset: usize,
    consumed_offset: usize,
    from_workload: Doorbell,
    /// A ringer of `from_workload` of the fake daemon's own, to wake its ring thread.
    wake_ring: Ringer,
    workload_ends: [OwnedFd; 2],
}

/// Makes a workload's rings and doorbells and attaches it to a free rank.
fn attach(core: &Mutex<Core>) -> Result<Attached, String> {
    let cmd_ring = Ring::new(0, COMMAND_SLOTS, RING_SLOT).unwrap();
    let completion_offset = cmd_ring.end().div_ceil(Ring::ALIGN) * Ring::ALIGN;
    let cpl_ring = Ring::new(completion_offset, COMPLETION_SLOTS, RING_SLOT).unwrap();
    let consumed_offset = cpl_ring.end().div_ceil(Ring::ALIGN) * Ring::ALIGN;
    let region = Arc::new(Region::create("fake-rings", consumed_offset + CONSUMED_LEN).unwrap());
    cmd_ring.init(&region).unwrap();
    cpl_ring.init(&region).unwrap();
    let commands = cmd_ring.consumer(region.clone()).unwrap();
    let (to_workload, to_workload_peer) = doorbell().unwrap();
    let (from_workload_peer, from_workload) = doorbell().unwrap();
    let wake_ring = from_workload_peer.try_clone().unwrap();
    let completions = Completions(Arc::new(Mutex::new(Out {
        p: cpl_ring.producer(region.clone()).unwrap(),
        bell: to_workload,
        rings: region.clone(),
        consumed_offset,
    })));
    let mut core = core.lock().unwrap();
    let (svc, ni, _) = core.sim.workloads(ME);
    let rank = svc
        .attach(
            ni,
            Joining::new("default", Pdid(PDID)),
            Box::new(completions.clone()),
        )
        .map_err(|x| format!("{x} on {NODE}"))?;
    Ok(Attached {
        rank,
        region,
        commands,
        completions,
        completion_offset,
        consumed_offset,
        from_workload,
        wake_ring,
        workload_ends: [to_workload_peer.into_fd(), from_workload_peer.into_fd()],
    })
}

fn session(
    conn: UnixStream,
    behavior: Behavior,
    core: Arc<Mutex<Core>>,
    stop: Arc<AtomicBool>,
    attaches: Arc<AtomicU32>,
) {
    let Some(Request::Attach { job_key, .. }) = read_request(&conn) else {
        return;
    };
    if job_key.as_deref().is_some_and(|k| k != GOOD_KEY) {
        refuse(&conn, "unknown job key".into());
        return;
    }
    let a = match attach(&core) {
        Ok(a) => a,
        Err(message) => return refuse(&conn, message),
    };
    attaches.fetch_add(1, Ordering::Relaxed);
    let rank = a.rank;
    let nodes = core.lock().unwrap().sim.shape().nodes();
    reply(
        &conn,
        &Reply::Attached {
            node: NODE.into(),
            node_id: NODE_ID,
            rank,
            pdid: PDID,
            command_slots: COMMAND_SLOTS,
            completion_slots: COMPLETION_SLOTS,
            command_offset: 0,
            completion_offset: a.completion_offset as u64,
            consumed_offset: a.consumed_offset as u64,
            region_len: a.region.len() as u64,
            nodes,
            software_ps: FAKE_SOFTWARE_PS,
            compute_scale_ppm: 0,
            clock_ps: 0,
        },
        &[
            a.region.as_raw_fd(),
            a.workload_ends[0].as_raw_fd(),
            a.workload_ends[1].as_raw_fd(),
        ],
    );
    // The workload's ends are its own now: keeping them would hide its exit.
    drop(a.workload_ends);
    let conn = Arc::new(conn);
    let done = Arc::new(AtomicBool::new(false));
    let bell = Arc::new(a.from_workload);
    let wake_ring = a.wake_ring;
    let ring_thread = {
        let ring = RingThread {
            core: core.clone(),
            rank,
            commands: a.commands,
            bell: bell.clone(),
            completions: a.completions,
            tail: (a.region.clone(), a.completion_offset + 0x100),
            behavior,
            conn: conn.clone(),
        };
        let (done, stop) = (done.clone(), stop.clone());
        std::thread::spawn(move || ring.serve(&done, &stop))
    };
    // Control requests until the workload goes.
    while let Some(req) = read_request(&conn) {
        let (r, fd) = control(&core, rank, req);
        let raw: Vec<i32> = fd.iter().map(|f| f.as_raw_fd()).collect();
        reply(&conn, &r, &raw);
    }
    // The workload is gone: free everything it held.
    done.store(true, Ordering::Release);
    let _ = wake_ring.ring();
    let _ = ring_thread.join();
    let mut core = core.lock().unwrap();
    let now = core.sim.now();
    let (svc, ni, _) = core.sim.workloads(ME);
    svc.detach(ni, rank, now);
    core.run();
    core.mem.0.lock().unwrap().clear(rank);
}

/// Answers a control request of `rank` (with the descriptor of a registered region): the
/// service decides, as in the daemon; here its memory is made and forgotten.
fn control(core: &Mutex<Core>, rank: u8, req: Request) -> (Reply, Option<OwnedFd>) {
    let error = |message: String| (Reply::Error { message }, None);
    let mut core = core.lock().unwrap();
    let core = &mut *core;
    let (svc, ni, _) = core.sim.workloads(ME);
    match svc.control(ni, rank, req) {
        Err(e) => error(e.to_string()),
        Ok(Control::Answer(r)) => (r, None),
        Ok(Control::ForgetRegion(placed)) => {
            core.mem.0.lock().unwrap().remove(rank, placed.va);
            (Reply::Ok, None)
        }
        Ok(Control::MakeRegion(pending)) => {
            let made = Region::create("fake-mem", pending.bytes() as usize)
                .map_err(|e| e.to_string())
                .and_then(|r| {
                    let fd = r.try_clone_fd().map_err(|e| e.to_string())?;
                    Ok((r, fd))
                });
            let (region, fd) = match made {
                Ok(x) => x,
                Err(e) => {
                    svc.abandon_region(pending);
                    return error(e);
                }
            };
            match svc.place_region(pending) {
                Ok(placed) => {
                    let mut mem = core.mem.0.lock().unwrap();
                    mem.insert(rank, placed.va, Shm(region));
                    let r = Reply::Registered {
                        region: placed.id,
                        va: placed.va,
                    };
                    (r, Some(fd))
                }
                Err(e) => error(e.to_string()),
            }
        }
    }
}

/// The thread that takes a workload's commands from its command ring.
struct RingThread {
    core: Arc<Mutex<Core>>,
    rank: u8,
    commands: Consumer,
    /// The workload -> daemon doorbell.
    bell: Arc<Doorbell>,
    completions: Completions,
    /// The ring region and where the completion ring's tail is in it.
    tail: (Arc<Region>, usize),
    behavior: Behavior,
    conn: Arc<UnixStream>,
}

impl RingThread {
    fn serve(mut self, done: &AtomicBool, stop: &AtomicBool) {
        let waiter = Waiter::new(Duration::from_micros(50));
        let mut buf = vec![0u8; self.commands.max_message_len()];
        let mut batch = Vec::new();
        while !done.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
            // A workload that does not read its completions waits until it does.
            if self.lock().sim.workloads(ME).0.held_back(self.rank) {
                let _ = self.bell.wait(Some(Duration::from_millis(5)));
                continue;
            }
            loop {
                match self.commands.pop(&mut buf) {
                    Ok(Some(n)) => batch.push(Command::decode(&buf[..n])),
                    Ok(None) => break,
                    // A corrupt command ring: stop reading it.
                    Err(_) => return,
                }
                if batch.len() >= 64 {
                    break;
                }
            }
            if !batch.is_empty() {
                if !self.on_batch(&mut batch) {
                    return;
                }
                continue;
            }
            {
                // Room may have appeared in the completion ring.
                let mut core = self.lock();
                let (svc, ni, _) = core.sim.workloads(ME);
                svc.drain(ni, self.rank);
            }
            let timeout = Some(Duration::from_millis(20));
            if self
                .commands
                .wait_readable(&waiter, &self.bell, timeout)
                .is_err()
            {
                return;
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap()
    }

    /// Serves (or misbehaves on) a batch of commands; false when the thread should stop.
    fn on_batch(&mut self, batch: &mut Vec<Result<Command, (u32, SlotError)>>) -> bool {
        if self.behavior == Behavior::Serve {
            self.lock().execute(self.rank, batch);
            return true;
        }
        batch.clear();
        let mut o = self.completions.lock();
        match self.behavior {
            Behavior::Serve | Behavior::Silent => {}
            Behavior::ShortSlot => {
                let _ = o.p.push(&[0x81; 12]);
                let _ = o.p.wake_consumer(&o.bell);
            }
            Behavior::UnknownKind => {
                let mut slot = [0u8; attach::SLOT];
                slot[0] = 0x99;
                let _ = o.p.push(&slot);
                let _ = o.p.wake_consumer(&o.bell);
            }
            Behavior::RunawayTail => {
                let (region, at) = &self.tail;
                region
                    .atomic_u32(*at)
                    .unwrap()
                    .store(1 << 20, Ordering::Release);
                let _ = o.bell.ring();
            }
            Behavior::Die => {
                let _ = self.conn.shutdown(std::net::Shutdown::Both);
                return false;
            }
        }
        true
    }
}
