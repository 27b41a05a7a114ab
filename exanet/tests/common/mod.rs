//! A fake node daemon speaking the attach protocol, for tests that need no rack: it attaches
//! one workload at a time, keeps its registered memory and mailboxes (each holding its
//! capacity of unread messages, as the workload's consumed counters say), and answers
//! commands as a one-node NI would (or misbehaves, on request).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exanet_proto::attach::{
    status, Command, Completion, Reply, Request, Resource, CONSUMED_LEN, SLOT,
};
use exanet_proto::ni::{NackReason, RdmaRead, RdmaWrite, SendMessage, MAILBOX_WINDOW};
use exanet_shm::{recv_fds, send_fds, Doorbell, Producer, Region, Ring, Waiter};

/// What the fake does with commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// A one-node NI: messages and RDMA to this node and rank work, other nodes NACK
    /// (`no_context`), node ids >= 4 time out.
    Loopback,
    /// Never completes anything.
    Silent,
    /// On the first command, writes a completion slot of the wrong size.
    ShortSlot,
    /// On the first command, writes a completion of an unknown kind.
    UnknownKind,
    /// On the first command, moves the completion ring's tail far ahead.
    RunawayTail,
    /// On the first command, closes the connection and stops.
    Die,
}

pub const PDID: u16 = 7;
pub const GOOD_KEY: &str = "good-key";
pub const NODE: &str = "M1QAF2";
pub const NODE_ID: u32 = 1;
pub const RANK: u8 = 3;
const VA_BASE: u64 = 1 << 30;

pub struct Fake {
    pub dir: PathBuf,
    stop: Arc<AtomicBool>,
    pub attaches: Arc<AtomicU32>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Unblock the accept loop.
        let _ = UnixStream::connect(self.dir.join("run").join(format!("{NODE}.ni")));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A mailbox: its generation, capacity, the messages handed to the workload, and its
/// consumed counter when it was allocated.
struct FakeBox {
    generation: u32,
    capacity: u64,
    handed: u64,
    base: u64,
}

struct Mem {
    regions: Vec<(u32, u64, Region)>,
    mailboxes: HashMap<u8, FakeBox>,
    /// The ring region and where its consumed counters are.
    rings: Arc<Region>,
    consumed_offset: usize,
    next_generation: u32,
    next_va: u64,
    next_vi: u8,
    next_pkt: u8,
    next_page: u8,
}

impl Mem {
    fn consumed(&self, vi: u8) -> u64 {
        self.rings
            .atomic_u64(self.consumed_offset + usize::from(vi) * 8)
            .unwrap()
            .load(Ordering::Acquire)
    }

    fn find(&self, va: u64, len: u64) -> Option<(&Region, usize)> {
        self.regions.iter().find_map(|(_, base, r)| {
            let off = va.checked_sub(*base)?;
            (off + len <= r.len() as u64).then_some((r, off as usize))
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
        let listener = UnixListener::bind(dir.join("run").join(format!("{NODE}.ni"))).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let attaches = Arc::new(AtomicU32::new(0));
        {
            let (stop, attaches) = (stop.clone(), attaches.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let stop = stop.clone();
                    let attaches = attaches.clone();
                    std::thread::spawn(move || session(conn, behavior, stop, attaches));
                }
            });
        }
        Fake {
            dir,
            stop,
            attaches,
        }
    }
}

fn read_request(conn: &UnixStream) -> Option<(Request, Vec<std::os::fd::OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let (n, got) = recv_fds(conn, &mut buf, 4).ok()?;
        fds.extend(got);
        if n == 0 {
            return None;
        }
        line.extend_from_slice(&buf[..n]);
        if line.ends_with(b"\n") {
            break;
        }
    }
    Some((serde_json::from_slice(&line).ok()?, fds))
}

fn reply(conn: &UnixStream, r: &Reply, fds: &[i32]) {
    let mut line = serde_json::to_vec(r).unwrap();
    line.push(b'\n');
    if fds.is_empty() {
        let _ = (&*conn).write_all(&line);
    } else {
        send_fds(conn, &line, fds).unwrap();
    }
}

fn session(conn: UnixStream, behavior: Behavior, stop: Arc<AtomicBool>, attaches: Arc<AtomicU32>) {
    let Some((Request::Attach { job_key, .. }, _)) = read_request(&conn) else {
        return;
    };
    if job_key.as_deref().is_some_and(|k| k != GOOD_KEY) {
        reply(
            &conn,
            &Reply::Error {
                message: "unknown job key".into(),
            },
            &[],
        );
        return;
    }
    attaches.fetch_add(1, Ordering::Relaxed);
    let cmd_ring = Ring::new(0, 256, 256).unwrap();
    let cpl_ring = Ring::new(cmd_ring.end(), 1024, 256).unwrap();
    let consumed_offset = cpl_ring.end().div_ceil(64) * 64;
    let region = Arc::new(Region::create("fake-rings", consumed_offset + CONSUMED_LEN).unwrap());
    cmd_ring.init(&region).unwrap();
    cpl_ring.init(&region).unwrap();
    let mut commands = cmd_ring.consumer(region.clone()).unwrap();
    let completions = cpl_ring.producer(region.clone()).unwrap();
    let (to_workload, to_workload_peer) = Doorbell::pair().unwrap();
    let (from_workload, from_workload_peer) = Doorbell::pair().unwrap();
    let from_workload = Arc::new(from_workload);
    reply(
        &conn,
        &Reply::Attached {
            node: NODE.into(),
            node_id: NODE_ID,
            rank: RANK,
            pdid: PDID,
            command_slots: 256,
            completion_slots: 1024,
            command_offset: 0,
            completion_offset: cmd_ring.end() as u64,
            consumed_offset: consumed_offset as u64,
            region_len: region.len() as u64,
            nodes: 8,
        },
        &[
            region.as_raw_fd(),
            to_workload_peer.as_raw_fd(),
            from_workload_peer.as_raw_fd(),
        ],
    );
    drop((to_workload_peer, from_workload_peer));
    let mem = Arc::new(Mutex::new(Mem {
        regions: Vec::new(),
        mailboxes: HashMap::new(),
        rings: region.clone(),
        consumed_offset,
        next_generation: 0,
        next_va: VA_BASE,
        next_vi: 0,
        next_pkt: 0,
        next_page: 0,
    }));
    let done = Arc::new(AtomicBool::new(false));
    let conn = Arc::new(conn);
    {
        let (mem, done, stop, region, conn, bell) = (
            mem.clone(),
            done.clone(),
            stop.clone(),
            region.clone(),
            conn.clone(),
            from_workload.clone(),
        );
        let cpl_off = cmd_ring.end();
        std::thread::spawn(move || {
            let mut out = Out {
                p: completions,
                bell: to_workload,
            };
            let waiter = Waiter::new(Duration::from_micros(50));
            let mut buf = [0u8; 248];
            while !done.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
                match commands.pop(&mut buf) {
                    Ok(Some(n)) => {
                        let Ok(cmd) = Command::decode(&buf[..n]) else {
                            out.push(&Completion::Refused {
                                tag: 0,
                                status: status::MALFORMED,
                                code: 0,
                            });
                            continue;
                        };
                        match behavior {
                            Behavior::Loopback => {
                                let cs = loopback(&mem, cmd);
                                for c in cs {
                                    out.push(&c);
                                }
                            }
                            Behavior::Silent => {}
                            Behavior::ShortSlot => {
                                let _ = out.p.push(&[0x81; 12]);
                                let _ = out.p.wake_consumer(&out.bell);
                            }
                            Behavior::UnknownKind => {
                                let mut slot = [0u8; SLOT];
                                slot[0] = 0x99;
                                let _ = out.p.push(&slot);
                                let _ = out.p.wake_consumer(&out.bell);
                            }
                            Behavior::RunawayTail => {
                                region
                                    .atomic_u32(cpl_off + 0x100)
                                    .unwrap()
                                    .store(1 << 20, Ordering::Release);
                                let _ = out.bell.ring();
                            }
                            Behavior::Die => {
                                let _ = conn.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                        }
                    }
                    Ok(None) => {
                        let _ =
                            commands.wait_readable(&waiter, &bell, Some(Duration::from_millis(20)));
                    }
                    Err(_) => return,
                }
            }
        });
    }
    // Control requests until the workload goes.
    while let Some((req, _fds)) = read_request(&conn) {
        let mut m = mem.lock().unwrap();
        let mut reply_fds = Vec::new();
        let r = match req {
            Request::Attach { .. } => Reply::Error {
                message: "already attached".into(),
            },
            Request::Register { len } => match Region::create("fake-mem", len as usize) {
                Ok(region) => {
                    let va = m.next_va;
                    m.next_va = (va + len).div_ceil(2 << 20) * (2 << 20);
                    let id = m.regions.len() as u32 + 1;
                    reply_fds.push(region.try_clone_fd().unwrap());
                    m.regions.push((id, va, region));
                    Reply::Registered { region: id, va }
                }
                Err(e) => Reply::Error {
                    message: e.to_string(),
                },
            },
            Request::Unregister { region } => {
                m.regions.retain(|(id, _, _)| *id != region);
                Reply::Ok
            }
            Request::Alloc { kind, capacity } => {
                let mut generation = 0;
                let index = match kind {
                    Resource::Mailbox => {
                        let vi = m.next_vi;
                        m.next_vi += 1;
                        m.next_generation += 1;
                        generation = m.next_generation;
                        let base = m.consumed(vi);
                        m.mailboxes.insert(
                            vi,
                            FakeBox {
                                generation,
                                capacity: u64::from(capacity.unwrap_or(64).max(1)),
                                handed: 0,
                                base,
                            },
                        );
                        vi
                    }
                    Resource::Packetizer => {
                        m.next_pkt += 1;
                        m.next_pkt - 1
                    }
                    Resource::RdmaPage => {
                        m.next_page += 1;
                        m.next_page - 1
                    }
                };
                Reply::Allocated { index, generation }
            }
            Request::Free { kind, index } => {
                if kind == Resource::Mailbox {
                    m.mailboxes.remove(&index);
                }
                Reply::Ok
            }
        };
        drop(m);
        let raw: Vec<i32> = reply_fds.iter().map(|f| f.as_raw_fd()).collect();
        reply(&conn, &r, &raw);
    }
    done.store(true, Ordering::Release);
}

struct Out {
    p: Producer,
    bell: Doorbell,
}

impl Out {
    fn push(&mut self, c: &Completion) {
        while let Err(exanet_shm::RingError::Full) = self.p.push(&c.encode()) {
            let _ = self.p.wake_consumer(&self.bell);
            std::thread::sleep(Duration::from_micros(100));
        }
        let _ = self.p.wake_consumer(&self.bell);
    }
}

fn loopback(mem: &Mutex<Mem>, cmd: Command) -> Vec<Completion> {
    let mut m = mem.lock().unwrap();
    match cmd {
        Command::Send {
            tag,
            op:
                SendMessage {
                    vi,
                    ch,
                    dst,
                    payload,
                },
        } => {
            if ch >= 4 {
                return vec![Completion::Refused {
                    tag,
                    status: status::REFUSED,
                    code: 5,
                }];
            }
            let sent = |st: u8, reason: u8| Completion::Sent {
                tag,
                vi,
                ch,
                status: st,
                reason,
            };
            if dst.node().0 >= 4 {
                return vec![sent(status::TIMED_OUT, 0)];
            }
            if dst.node().0 != NODE_ID || dst.rank() != RANK {
                return vec![sent(status::NACKED, NackReason::NoContext as u8)];
            }
            let va = dst.va();
            if va & MAILBOX_WINDOW == MAILBOX_WINDOW {
                let mvi = (va & 0xFF) as u8;
                let consumed = m.consumed(mvi);
                let Some(b) = m.mailboxes.get_mut(&mvi) else {
                    return vec![sent(status::NACKED, NackReason::NoContext as u8)];
                };
                let taken = consumed.wrapping_sub(b.base).min(b.handed);
                if b.handed - taken >= b.capacity {
                    return vec![sent(status::NACKED, NackReason::QueueFull as u8)];
                }
                b.handed += 1;
                vec![
                    Completion::Message {
                        vi: mvi,
                        generation: b.generation,
                        src_node: NODE_ID,
                        src_rank: RANK,
                        payload,
                    },
                    sent(status::OK, 0),
                ]
            } else {
                vec![sent(status::NACKED, NackReason::BadAddress as u8)]
            }
        }
        Command::Write {
            tag,
            op:
                RdmaWrite {
                    page,
                    ch,
                    src_va,
                    dst,
                    len,
                    notify,
                },
        } => {
            let rdma = |st: u8, reason: u8| Completion::Rdma {
                tag,
                page,
                ch,
                read: false,
                status: st,
                reason,
            };
            let Some((src, so)) = m.find(src_va, len) else {
                return vec![rdma(status::LOCAL_FAULT, 0)];
            };
            if dst.node().0 != NODE_ID || dst.rank() != RANK {
                return vec![rdma(status::NACKED, NackReason::NoContext as u8)];
            }
            let Some((d, doff)) = m.find(dst.va(), len) else {
                return vec![rdma(status::NACKED, NackReason::PageFault as u8)];
            };
            let mut data = vec![0u8; len as usize];
            src.read(so, &mut data).unwrap();
            d.write(doff, &data).unwrap();
            let mut out = Vec::new();
            if let Some(va) = notify {
                out.push(Completion::Notified {
                    va,
                    src_node: NODE_ID,
                    len,
                });
            }
            out.push(rdma(status::OK, 0));
            out
        }
        Command::Read {
            tag,
            op:
                RdmaRead {
                    page,
                    ch,
                    src,
                    dst_va,
                    len,
                },
        } => {
            let rdma = |st: u8, reason: u8| Completion::Rdma {
                tag,
                page,
                ch,
                read: true,
                status: st,
                reason,
            };
            let (Some((s, so)), Some((d, doff))) = (m.find(src.va(), len), m.find(dst_va, len))
            else {
                return vec![rdma(status::NACKED, NackReason::PageFault as u8)];
            };
            let mut data = vec![0u8; len as usize];
            s.read(so, &mut data).unwrap();
            d.write(doff, &data).unwrap();
            vec![rdma(status::OK, 0)]
        }
    }
}
