//! The daemon's workload interface spoken by hand (no client library): attach, memory
//! registration, messages and RDMA between nodes, and hostile or dying workloads.

mod support;

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use exanet_control::rack::Layout;
use exanet_proto::attach::{refusal, status, Command, Completion, Reply, Request, Resource, SLOT};
use exanet_proto::ni::{mailbox_gvas, RdmaRead, RdmaWrite, SendMessage};
use exanet_proto::{Gvas, NodeId, Pdid};
use support::raw::{attach, daemon_fds, make_blocking, request};
use support::TestRack;

fn rack(tag: &str) -> TestRack {
    support::two_job_rack(tag, env!("CARGO_BIN_EXE_exanetd"), "alice-key", "debug")
}

#[test]
fn messages_and_rdma_between_attached_workloads() {
    let r = rack("ni-basic");
    let mut a = attach(&r, "M1QAF1", None).unwrap();
    let mut b = attach(&r, "M1QAF3", None).unwrap();
    assert_eq!(
        (a.pdid, b.pdid),
        (1, 1),
        "keyless workloads join the default job"
    );
    let mb = b.alloc(Resource::Mailbox);
    let pk = a.alloc(Resource::Packetizer);
    let dst = mailbox_gvas(Pdid(0), NodeId(2), b.rank, mb).unwrap();
    a.post(&Command::Send {
        tag: 11,
        op: SendMessage {
            vi: pk,
            ch: 0,
            dst,
            payload: b"hello F3".to_vec(),
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = a.wait("sent", |c| matches!(c, Completion::Sent { tag: 11, .. }));
    assert!(
        matches!(
            c,
            Completion::Sent {
                status: status::OK,
                ..
            }
        ),
        "{c:?}"
    );
    let m = b.wait("message", |c| matches!(c, Completion::Message { .. }));
    // Sent at modeled time 0: the message arrives a modeled path later.
    assert!(m.at().ps() > 0, "{m:?}");
    assert_eq!(
        m,
        Completion::Message {
            vi: mb,
            generation: 1,
            src_node: 0,
            src_rank: a.rank,
            payload: b"hello F3".to_vec(),
            at: m.at(),
        }
    );

    // RDMA write of 300 KB + 5 B with a notification, then read it back.
    let len = 300 * 1024 + 5;
    let (src, src_va) = a.register(1 << 20);
    let (dst_mem, dst_va) = b.register(1 << 20);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    src.write(0, &data).unwrap();
    let page = a.alloc(Resource::RdmaPage);
    a.post(&Command::Write {
        tag: 21,
        op: RdmaWrite {
            page,
            ch: 3,
            src_va,
            dst: Gvas::new(Pdid(0), NodeId(2), b.rank, dst_va + 1).unwrap(),
            len: len as u64,
            notify: Some(dst_va + (900 << 10)),
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = a.wait("rdma", |c| matches!(c, Completion::Rdma { tag: 21, .. }));
    assert!(
        matches!(
            c,
            Completion::Rdma {
                status: status::OK,
                read: false,
                ..
            }
        ),
        "{c:?}"
    );
    let n = b.wait("notified", |c| matches!(c, Completion::Notified { .. }));
    assert_eq!(
        n,
        Completion::Notified {
            va: dst_va + (900 << 10),
            src_node: 0,
            len: len as u64,
            at: n.at(),
        }
    );
    let mut got = vec![0u8; len];
    dst_mem.read(1, &mut got).unwrap();
    assert!(got == data, "RDMA write delivered wrong bytes");

    a.post(&Command::Read {
        tag: 31,
        op: RdmaRead {
            page,
            ch: 0,
            src: Gvas::new(Pdid(0), NodeId(2), b.rank, dst_va + 1).unwrap(),
            dst_va: src_va + (512 << 10),
            len: len as u64,
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = a.wait("read", |c| matches!(c, Completion::Rdma { tag: 31, .. }));
    assert!(
        matches!(
            c,
            Completion::Rdma {
                status: status::OK,
                read: true,
                ..
            }
        ),
        "{c:?}"
    );
    let mut back = vec![0u8; len];
    src.read(512 << 10, &mut back).unwrap();
    assert!(back == data, "RDMA read returned wrong bytes");
}

#[test]
fn pdid_is_the_jobs_not_the_workloads() {
    let r = rack("ni-pdid");
    assert!(
        attach(&r, "M1QAF2", Some("no-such-key")).is_err(),
        "unknown key refused"
    );
    let mut alice = attach(&r, "M1QAF2", Some("alice-key")).unwrap();
    assert_eq!(alice.pdid, 42);
    let mut other = attach(&r, "M1QAF4", None).unwrap();
    let mb = other.alloc(Resource::Mailbox);
    let pk = alice.alloc(Resource::Packetizer);
    // Alice writes the default job's PDID into the GVAS: the NI stamps hers anyway.
    alice.post(&Command::Send {
        tag: 1,
        op: SendMessage {
            vi: pk,
            ch: 1,
            dst: mailbox_gvas(Pdid(1), NodeId(3), other.rank, mb).unwrap(),
            payload: b"intrusion".to_vec(),
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = alice.wait("sent", |c| matches!(c, Completion::Sent { tag: 1, .. }));
    assert!(
        matches!(
            c,
            Completion::Sent {
                status: status::NACKED,
                reason: 5,
                ..
            }
        ),
        "expected a PDID-mismatch NACK, got {c:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = [0u8; 256];
    while let Some(n) = other.completions.pop(&mut buf).unwrap() {
        let c = Completion::decode(&buf[..n]).unwrap();
        assert!(
            !matches!(c, Completion::Message { .. }),
            "a PDID violation was delivered: {c:?}"
        );
    }
    let s = r.status("M1QAF4").unwrap();
    assert!(s.ni.counters.pdid_violations >= 1, "{s:?}");
}

#[test]
fn hostile_and_dying_workloads_do_not_disturb_others() {
    let r = rack("ni-hostile");
    let mut good = attach(&r, "M1QAF1", None).unwrap();
    let mut peer = attach(&r, "M1QAF2", None).unwrap();
    let mb = peer.alloc(Resource::Mailbox);
    let pk = good.alloc(Resource::Packetizer);
    let dst = mailbox_gvas(Pdid(0), NodeId(1), peer.rank, mb).unwrap();

    // Garbage commands get error completions.
    let mut evil = attach(&r, "M1QAF1", None).unwrap();
    let mut junk = [0xEEu8; SLOT];
    junk[4..8].copy_from_slice(&77u32.to_be_bytes());
    evil.commands.push(&junk).unwrap();
    evil.commands.wake_consumer(&evil.to_daemon).unwrap();
    let c = evil.wait("refusal", |c| {
        matches!(c, Completion::Refused { tag: 77, .. })
    });
    assert!(matches!(
        c,
        Completion::Refused {
            status: status::MALFORMED,
            ..
        }
    ));
    // Out-of-range indices and lengths are refused, not obeyed.
    for (tag, cmd) in [
        (
            78,
            Command::Send {
                tag: 78,
                op: SendMessage {
                    vi: 63,
                    ch: 9,
                    dst,
                    payload: vec![],
                },
                at: exanet_proto::model::ModelTime::ZERO,
            },
        ),
        (
            79,
            Command::Write {
                tag: 79,
                op: RdmaWrite {
                    page: 200,
                    ch: 0,
                    src_va: 0,
                    dst,
                    len: 1,
                    notify: None,
                },
                at: exanet_proto::model::ModelTime::ZERO,
            },
        ),
        (
            80,
            Command::Read {
                tag: 80,
                op: RdmaRead {
                    page: 0,
                    ch: 0,
                    src: dst,
                    dst_va: u64::MAX,
                    len: u64::MAX,
                },
                at: exanet_proto::model::ModelTime::ZERO,
            },
        ),
    ] {
        evil.post(&cmd);
        let c = evil.wait(
            "refusal",
            |c| matches!(c, Completion::Refused { tag: t, .. } if *t == tag),
        );
        let want = if tag == 78 {
            refusal::NOT_OWNER
        } else {
            refusal::NO_SUCH
        };
        assert_eq!(
            c,
            Completion::Refused {
                tag,
                status: status::REFUSED,
                code: want,
                at: c.at(),
            },
            "expected {}",
            refusal::label(want)
        );
    }
    // Then it scribbles over its ring header: the daemon stops reading that ring.
    evil.region.write(0, &[0xFF; 64]).unwrap();
    evil.to_daemon.ring().unwrap();
    // A workload that dies mid-transfer: register, post a big write, vanish.
    {
        let mut dying = attach(&r, "M1QAF1", None).unwrap();
        let (_m, va) = dying.register(4 << 20);
        let page = dying.alloc(Resource::RdmaPage);
        dying.post(&Command::Write {
            tag: 5,
            op: RdmaWrite {
                page,
                ch: 0,
                src_va: va,
                dst: Gvas::new(Pdid(0), NodeId(1), peer.rank, 0x7777_0000).unwrap(),
                len: 4 << 20,
                notify: None,
            },
            at: exanet_proto::model::ModelTime::ZERO,
        });
    }
    // Everyone else carries on.
    for i in 0..20u32 {
        good.post(&Command::Send {
            tag: 100 + i,
            op: SendMessage {
                vi: pk,
                ch: (i % 4) as u8,
                dst,
                payload: i.to_be_bytes().to_vec(),
            },
            at: exanet_proto::model::ModelTime::ZERO,
        });
        let c = good.wait(
            "sent",
            |c| matches!(c, Completion::Sent { tag, .. } if *tag == 100 + i),
        );
        assert!(
            matches!(
                c,
                Completion::Sent {
                    status: status::OK,
                    ..
                }
            ),
            "{c:?}"
        );
        // The peer takes each message: its mailbox holds 16 unread.
        let m = peer.wait("message", |c| matches!(c, Completion::Message { .. }));
        assert!(
            matches!(&m, Completion::Message { payload, .. } if *payload == i.to_be_bytes()),
            "{m:?}"
        );
    }
    // The scribbled header is noticed by the evil session's ring task on its own
    // schedule (when it next finds its ring empty), which a loaded machine may delay.
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        let s = r.status("M1QAF1").unwrap();
        if s.errors.get("workload_ring").copied().unwrap_or(0) >= 1 || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        s.errors.get("workload_malformed").copied().unwrap_or(0) >= 1,
        "{:?}",
        s.errors
    );
    assert!(
        s.errors.get("workload_ring").copied().unwrap_or(0) >= 1,
        "the corrupted ring was not noticed within 10 s: {:?}",
        s.errors
    );
    // The dead workloads' ranks are free again. This rack has two jobs, so the default job
    // may hold 6 of the 8 ranks (good's and 5 more), and alice the rest.
    drop(evil);
    let t0 = Instant::now();
    let mut extra = Vec::new();
    while extra.len() < 5 {
        match attach(&r, "M1QAF1", None) {
            Ok(w) => extra.push(w),
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "ranks not freed: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let e = attach(&r, "M1QAF1", None)
        .err()
        .expect("the job's quota is spent");
    assert!(e.contains("job default holds 6 of its 6 ranks"), "{e}");
    // Rank 7 is the IP service's: one more rank for alice, then none.
    extra.push(attach(&r, "M1QAF1", Some("alice-key")).unwrap());
    let e = attach(&r, "M1QAF1", Some("alice-key"))
        .err()
        .expect("an eighth rank must be refused");
    assert!(
        e.contains("every rank this job may hold is taken (8 ranks, 1 of them kept"),
        "{e}"
    );
    let s = r.status("M1QAF1").unwrap();
    assert!(s.errors.get("quota_refused").copied().unwrap_or(0) >= 1);
    let jobs: Vec<&str> = s.ni.workloads.iter().map(|w| w.job.as_str()).collect();
    assert_eq!(
        jobs.iter().filter(|j| **j == "default").count(),
        6,
        "{jobs:?}"
    );
    assert_eq!(
        jobs.iter().filter(|j| **j == "alice").count(),
        1,
        "{jobs:?}"
    );
}

#[test]
fn a_workload_that_never_reads_completions_is_held_back() {
    let r = rack("ni-flood");
    let mut flood = attach(&r, "M1QAF1", None).unwrap();
    let junk = [0xEEu8; SLOT];
    // Garbage commands each earn a completion nobody reads. The daemon queues a bounded
    // number, then stops taking commands: the ring fills and stays full.
    let t0 = Instant::now();
    let mut pushed = 0u32;
    loop {
        match flood.commands.push(&junk) {
            Ok(()) => {
                pushed += 1;
                let _ = flood.commands.wake_consumer(&flood.to_daemon);
            }
            Err(_) => {
                // Full: give the daemon time to drain, if it still would.
                std::thread::sleep(Duration::from_millis(50));
                if flood.commands.free().unwrap() == 0 {
                    break;
                }
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the daemon kept draining ({pushed} pushed)"
        );
    }
    // What the daemon may take before it holds back: a completion ring's worth, its
    // backlog of 1024 (ni_service's MAX_BACKLOG) overshot by at most one batch (a command
    // ring's worth, taken while the backlog was short), and then the command ring stays
    // full.
    let (ring, commands) = (
        exanetd::ni_service::COMPLETION_SLOTS,
        exanetd::ni_service::COMMAND_SLOTS,
    );
    eprintln!("held back after {pushed} commands");
    assert!(
        (ring + commands..=ring + 1024 + 2 * commands).contains(&pushed),
        "held back after {pushed} commands"
    );
    // Others are served meanwhile.
    let mut good = attach(&r, "M1QAF1", None).unwrap();
    let mb = good.alloc(Resource::Mailbox);
    let pk = good.alloc(Resource::Packetizer);
    good.post(&Command::Send {
        tag: 1,
        op: SendMessage {
            vi: pk,
            ch: 0,
            dst: mailbox_gvas(Pdid(0), NodeId(0), good.rank, mb).unwrap(),
            payload: b"still here".to_vec(),
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = good.wait("sent", |c| matches!(c, Completion::Sent { tag: 1, .. }));
    assert!(
        matches!(
            c,
            Completion::Sent {
                status: status::OK,
                ..
            }
        ),
        "{c:?}"
    );
}

#[test]
fn notifications_to_a_workload_that_never_reads_are_bounded() {
    let r = rack("ni-notify-flood");
    let mut a = attach(&r, "M1QAF1", None).unwrap();
    let b = attach(&r, "M1QAF2", None).unwrap();
    let (src, src_va) = a.register(4096);
    src.write(0, &[7u8; 8]).unwrap();
    let (_dst, dst_va) = b.register(1 << 16);
    let page = a.alloc(Resource::RdmaPage);
    let dst = Gvas::new(Pdid(0), NodeId(1), b.rank, dst_va).unwrap();
    // B never reads its ring: 1024 ring slots, then the daemon's bounded backlog.
    let total = 1024 + 4096 + 500;
    let mut free: Vec<u8> = (0..32).collect();
    let mut tag = 0u32;
    let mut done = 0;
    while done < total {
        while let Some(ch) = free.pop().filter(|_| tag < total) {
            a.post(&Command::Write {
                tag,
                op: RdmaWrite {
                    page,
                    ch,
                    src_va,
                    dst,
                    len: 8,
                    notify: Some(dst_va + 4096),
                },
                at: exanet_proto::model::ModelTime::ZERO,
            });
            tag += 1;
        }
        let c = a.wait("rdma", |c| matches!(c, Completion::Rdma { .. }));
        match c {
            Completion::Rdma {
                status: status::OK,
                ch,
                ..
            } => free.push(ch),
            other => panic!("{other:?}"),
        }
        done += 1;
    }
    let s = r.status("M1QAF2").unwrap();
    let dropped = s
        .errors
        .get("notification_not_relayed")
        .copied()
        .unwrap_or(0);
    // Exactly what did not fit: the ring's slots and the backlog of 4096 (ni_service's
    // MAX_NOTIFY_BACKLOG) hold the rest.
    assert_eq!(dropped, 500, "notifications not relayed: {:?}", s.errors);
}

/// The attack that hung a daemon for good with the shared-eventfd doorbells (security
/// issue, defect 1): the workload makes its doorbell descriptors blocking, never reads the
/// daemon's wake-ups, keeps announcing that it sleeps so that the daemon rings on every
/// completion, and keeps posting. The daemon must go on serving another job on the same
/// node and answering status, and the attacker's rank must be freed when it leaves.
#[test]
fn a_workload_that_never_reads_its_doorbell_cannot_stop_the_daemon() {
    let r = rack("doorbell-attack");
    let mut evil = attach(&r, "M1QAF1", None).unwrap();
    make_blocking(&evil.from_daemon);
    make_blocking(&evil.to_daemon);
    let mut good = attach(&r, "M1QAF1", Some("alice-key")).unwrap();
    let mut peer = attach(&r, "M1QAF2", Some("alice-key")).unwrap();
    let victim = attach(&r, "M1QAF2", None).unwrap();
    let mb_evil = victim.alloc(Resource::Mailbox);
    let mb_good = peer.alloc(Resource::Mailbox);
    let pk_evil = evil.alloc(Resource::Packetizer);
    let pk_good = good.alloc(Resource::Packetizer);
    let dst_evil = mailbox_gvas(Pdid(0), NodeId(1), victim.rank, mb_evil).unwrap();
    let dst_good = mailbox_gvas(Pdid(0), NodeId(1), peer.rank, mb_good).unwrap();
    let status_before = r.status("M1QAF1").unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            let mut posted = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Announce sleep so that the daemon rings on the next completion; never
                // read the doorbell; drain the ring so that completions keep coming.
                let _ = evil.completions.prepare_sleep();
                while let Ok(Some(_)) = evil.completions.pop(&mut buf) {}
                let c = Command::Send {
                    tag: posted as u32,
                    op: SendMessage {
                        vi: pk_evil,
                        ch: (posted % 4) as u8,
                        dst: dst_evil,
                        payload: vec![0xAB; 8],
                    },
                    at: exanet_proto::model::ModelTime::ZERO,
                };
                if evil.commands.push(&c.encode()).is_ok() {
                    posted += 1;
                }
                let _ = evil.to_daemon.ring();
            }
            (evil, posted)
        })
    };
    // Meanwhile another job on the same node is served, and the node answers status.
    let mut worst = Duration::ZERO;
    for i in 0..50u32 {
        good.post(&Command::Send {
            tag: 1000 + i,
            op: SendMessage {
                vi: pk_good,
                ch: (i % 4) as u8,
                dst: dst_good,
                payload: i.to_be_bytes().to_vec(),
            },
            at: exanet_proto::model::ModelTime::ZERO,
        });
        let c = good.wait(
            "sent",
            |c| matches!(c, Completion::Sent { tag, .. } if *tag == 1000 + i),
        );
        assert!(
            matches!(
                c,
                Completion::Sent {
                    status: status::OK,
                    ..
                }
            ),
            "{c:?}"
        );
        // The peer takes each message: its mailbox holds 16 unread.
        let m = peer.wait("message", |c| matches!(c, Completion::Message { .. }));
        assert!(
            matches!(&m, Completion::Message { payload, .. } if *payload == i.to_be_bytes()),
            "{m:?}"
        );
        let t = Instant::now();
        assert!(
            r.status("M1QAF1").is_some(),
            "status unanswered under attack"
        );
        worst = worst.max(t.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (evil, posted) = attacker.join().unwrap();
    eprintln!("attacker posted {posted} commands; slowest status under attack: {worst:?}");
    assert!(posted > 50, "the attack did not run ({posted} commands)");
    assert!(worst < Duration::from_secs(5), "status took {worst:?}");
    let s = r.status("M1QAF1").unwrap();
    assert!(s.ni.counters.messages_sent > status_before.ni.counters.messages_sent + 50);
    // The attacker leaves: its rank is freed.
    let evil_rank = evil.rank;
    drop(evil);
    let t0 = Instant::now();
    loop {
        let s = r.status("M1QAF1").unwrap();
        if !s.ni.workloads.iter().any(|w| w.rank == evil_rank) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "rank {evil_rank} not freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Teardown frees the rank whatever the workload did to its rings and doorbells (defect
/// 2): nine workloads in a row, each leaving with its ring scribbled and its doorbells
/// made blocking and unread, on a node where the default job may hold 6 ranks: a leaked
/// rank would refuse one of them.
#[test]
fn teardown_frees_the_rank_whatever_the_workload_did() {
    let r = rack("teardown-attack");
    for round in 0..9 {
        let t0 = Instant::now();
        let w = loop {
            match attach(&r, "M1QAF3", None) {
                Ok(w) => break w,
                Err(e) => {
                    assert!(
                        t0.elapsed() < Duration::from_secs(10),
                        "round {round}: rank not freed: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        make_blocking(&w.from_daemon);
        let _ = w.completions.prepare_sleep();
        // A garbage tail and header stop the daemon's ring task.
        w.region.write(0, &[0xFF; 64]).unwrap();
        w.to_daemon.ring().unwrap();
        drop(w);
    }
}

/// Descriptors cannot be sent with requests (the attach socket refuses them: the workload's
/// send fails with EPERM); on a kernel that cannot refuse them (< 6.16) they are closed, not
/// hoarded. And a connection that never attaches is cut (defect 4).
#[test]
fn descriptors_with_requests_are_closed_and_silent_connections_cut() {
    use std::io::Read;
    let r = rack("fd-attack");
    let pid = r.status("M1QAF4").unwrap().pid;
    let w = attach(&r, "M1QAF4", None).unwrap();
    let before = daemon_fds(pid);
    let files: Vec<std::fs::File> = (0..4)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let raw: Vec<i32> = files.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let alloc = Request::Alloc {
        kind: Resource::Mailbox,
        capacity: Some(1),
        index: None,
    };
    let mut line = serde_json::to_vec(&alloc).unwrap();
    line.push(b'\n');
    let refused_at_source = match exanet_shm::send_fds(&w.conn, &line, &raw) {
        Err(exanet_shm::FdPassError::Io(e)) if e.raw_os_error() == Some(libc::EPERM) => true,
        Ok(_) => false,
        Err(e) => panic!("send: {e}"),
    };
    if refused_at_source {
        eprintln!("the attach socket refuses descriptors (SO_PASSRIGHTS)");
        // Nothing was sent; the connection still serves plain requests.
        let (reply, _) = request(&w.conn, &alloc, &[]);
        assert!(matches!(reply, Reply::Allocated { .. }), "{reply:?}");
    } else {
        eprintln!("this kernel cannot refuse descriptors: the daemon closes them");
        let mut buf = [0u8; 4096];
        let (n, _) = exanet_shm::recv_fds(&w.conn, &mut buf, 4).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("no descriptors"));
        for _ in 0..300 {
            let (reply, fds) = request(&w.conn, &alloc, &raw);
            assert!(fds.is_empty());
            match reply {
                Reply::Error { message } => {
                    assert!(message.contains("no descriptors"), "{message}")
                }
                other => panic!("a request with descriptors was obeyed: {other:?}"),
            }
        }
    }
    let after = daemon_fds(pid);
    eprintln!("daemon descriptors: {before} before, {after} after 1200 sent with requests");
    assert!(after <= before + 8, "{before} -> {after}");
    // A connection that sends nothing is closed at the attach deadline.
    let path = Layout::new(&r.dir).attach_socket(&"M1QAF4");
    let mut silent = UnixStream::connect(path).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let _ = silent.read_to_end(&mut buf);
    let took = t0.elapsed();
    eprintln!("silent connection cut after {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(
        String::from_utf8_lossy(&buf).contains("within"),
        "{:?}",
        String::from_utf8_lossy(&buf)
    );
}

/// A workload that dies (its connection closed without a word: no detach) gives its rank
/// back before the next attach is answered (issue 10, defect 4): a server restarted at once
/// gets the rank its clients address. Twenty times in a row, each holding interfaces and
/// memory that its teardown must free.
#[test]
fn a_dead_workloads_rank_goes_to_the_next_attach_at_once() {
    let r = rack("rank-reuse");
    for round in 0..20 {
        let w = attach(&r, "M1QAF2", None)
            .unwrap_or_else(|e| panic!("round {round}: attach refused: {e}"));
        assert_eq!(
            w.rank, 0,
            "round {round}: the previous workload's rank 0 was not given back first"
        );
        w.alloc(Resource::Mailbox);
        w.alloc(Resource::Packetizer);
        let _mem = w.register(1 << 16);
        // Abruptly: everything the workload held is closed at once, as when it is killed.
        drop(w);
    }
}

/// A workload that lies in its consumed counters (claims to have taken every message of a
/// capacity-1 mailbox, and reads nothing) only hurts itself: the daemon hands it no more
/// than its completion ring holds plus the mailbox's capacity, NACKs the rest
/// `queue_full`, and goes on serving others (issue 10, defect 1).
#[test]
fn a_workload_lying_about_what_it_took_only_hurts_itself() {
    let r = rack("consumed-lie");
    let mut sender = attach(&r, "M1QAF1", None).unwrap();
    let liar = attach(&r, "M1QAF2", None).unwrap();
    let mb = match request(
        &liar.conn,
        &Request::Alloc {
            kind: Resource::Mailbox,
            capacity: Some(1),
            index: None,
        },
        &[],
    )
    .0
    {
        Reply::Allocated { index, .. } => index,
        other => panic!("{other:?}"),
    };
    let counter = liar
        .region
        .atomic_u64(liar.consumed_offset + usize::from(mb) * 8)
        .unwrap();
    let pk = sender.alloc(Resource::Packetizer);
    let dst = mailbox_gvas(Pdid(0), NodeId(1), liar.rank, mb).unwrap();
    let ring = exanetd::ni_service::COMPLETION_SLOTS as usize;
    let (mut acked, mut full) = (0usize, 0usize);
    for i in 0..(ring + 1000) as u32 {
        // A new lie every time: far ahead, backwards, anything.
        counter.store(
            u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            std::sync::atomic::Ordering::Release,
        );
        sender.post(&Command::Send {
            tag: i,
            op: SendMessage {
                vi: pk,
                ch: (i % 4) as u8,
                dst,
                payload: i.to_be_bytes().to_vec(),
            },
            at: exanet_proto::model::ModelTime::ZERO,
        });
        let c = sender.wait(
            "sent",
            |c| matches!(c, Completion::Sent { tag, .. } if *tag == i),
        );
        match c {
            Completion::Sent {
                status: status::OK, ..
            } => acked += 1,
            Completion::Sent {
                status: status::NACKED,
                reason: 6,
                ..
            } => full += 1,
            other => panic!("message {i}: {other:?}"),
        }
    }
    eprintln!("{acked} ACKed, {full} NACKed queue_full");
    assert!(
        acked <= ring + 1,
        "{acked} ACKed: the daemon held more than its bound"
    );
    assert!(full >= 999, "{full}");
    // Others on the liar's node are served.
    let mut other = attach(&r, "M1QAF2", None).unwrap();
    let mb2 = other.alloc(Resource::Mailbox);
    sender.post(&Command::Send {
        tag: 1 << 20,
        op: SendMessage {
            vi: pk,
            ch: 0,
            dst: mailbox_gvas(Pdid(0), NodeId(1), other.rank, mb2).unwrap(),
            payload: b"served".to_vec(),
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = sender.wait(
        "sent",
        |c| matches!(c, Completion::Sent { tag, .. } if *tag == 1 << 20),
    );
    assert!(
        matches!(
            c,
            Completion::Sent {
                status: status::OK,
                ..
            }
        ),
        "{c:?}"
    );
    let m = other.wait("message", |c| matches!(c, Completion::Message { .. }));
    assert!(
        matches!(&m, Completion::Message { payload, .. } if payload.as_slice() == b"served"),
        "{m:?}"
    );
    drop(liar);
}

/// What a workload put in its command ring and then left (it exited right after posting,
/// before the daemon looked) is carried out at detach, not dropped: every message of it
/// arrives (issue 48: a collective's abort had to wait 500 ms before detaching for this).
#[test]
fn commands_left_in_the_ring_at_exit_are_carried_out() {
    let r = rack("ni-drain");
    let mut a = attach(&r, "M1QAF1", None).unwrap();
    let mut b = attach(&r, "M1QAF3", None).unwrap();
    let mb = b.alloc(Resource::Mailbox);
    let pk = a.alloc(Resource::Packetizer);
    let dst = mailbox_gvas(Pdid(0), NodeId(2), b.rank, mb).unwrap();
    // The daemon idles asleep on the doorbell by now; the posts below do not ring it.
    std::thread::sleep(Duration::from_millis(200));
    let n = 4u32;
    for i in 0..n {
        let c = Command::Send {
            tag: 100 + i,
            op: SendMessage {
                vi: pk,
                ch: i as u8,
                dst,
                payload: format!("last words {i}").into_bytes(),
            },
            at: exanet_proto::model::ModelTime::ZERO,
        };
        a.commands.push(&c.encode()).unwrap();
    }
    drop(a);
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < n as usize && t0.elapsed() < Duration::from_secs(10) {
        if let Some(Completion::Message { vi, payload, .. }) = b
            .wait_within(Duration::from_millis(100), |c| {
                matches!(c, Completion::Message { .. })
            })
        {
            // wait_within said it was taken.
            let _ = vi;
            got.push(String::from_utf8_lossy(&payload).into_owned());
        }
    }
    got.sort();
    let want: Vec<String> = (0..n).map(|i| format!("last words {i}")).collect();
    assert_eq!(got, want, "messages left in the ring at exit");
}
