//! End-to-end: the client library against real daemons of a local rack (`exactl rack up`).
//! Needs `exactl` and `exanetd` built with the same profile (`cargo build -p exactl -p
//! exanetd`), and gcc for the C example.

mod rack;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use exanet::{Endpoint, Error, NackReason, NodeId, OpError, Pdid};
use rack::{Proc, Rack};

const T: Option<Duration> = Some(Duration::from_secs(20));

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = i.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            (x ^ (x >> 8) ^ (x >> 19) ^ (x >> 31)) as u8
        })
        .collect()
}

#[test]
fn rust_pingpong_between_qfdbs() {
    let rack = Rack::up("pp", "2x1x1");
    let a = Endpoint::attach_to(&rack.dir, "M1QAF2", None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, "M1QBF3", None).unwrap();
    assert_eq!(a.node_id(), NodeId(1));
    assert_eq!(b.node_id(), NodeId(6));
    assert_eq!(a.node_by_name("M1QBF3").unwrap(), b.node_id());
    // Both in the rack's default job.
    assert_eq!(a.pdid(), b.pdid());
    assert_eq!(a.pdid(), Pdid(1));
    // Largest first: the server learns where to echo from the first byte of a message,
    // and echoes empty ones to the mailbox it learned last.
    let sizes: Vec<usize> = (0..=64).rev().collect();
    let rounds = sizes.len() * 3;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let inbox = b.mailbox(64).unwrap();
        let tx = b.packetizer().unwrap();
        ready_tx.send((b.node_id(), b.rank(), inbox.vi())).unwrap();
        let mut back_vi = 0;
        for _ in 0..rounds {
            let m = inbox.recv(T).unwrap();
            if let Some(&vi) = m.payload.first() {
                back_vi = vi;
            }
            let back = b.mailbox_addr(m.src_node, m.src_rank, back_vi).unwrap();
            let t = tx.send_any(back, &m.payload).unwrap();
            b.wait(t, T).unwrap();
        }
        b
    });
    let (bnode, brank, bvi) = ready_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let inbox = a.mailbox(64).unwrap();
    let tx = a.packetizer().unwrap();
    let dst = a.mailbox_addr(bnode, brank, bvi).unwrap();
    let start = Instant::now();
    let mut first = true;
    for round in 0..3 {
        for &n in &sizes {
            let mut p: Vec<u8> = (0..n).map(|k| (k * 7 + round) as u8).collect();
            if let Some(f) = p.first_mut() {
                *f = inbox.vi();
            }
            loop {
                let t = tx.send(0, dst, &p).unwrap();
                match a.wait(t, T) {
                    // The server thread may not have opened its mailbox yet.
                    Err(Error::Op {
                        error:
                            OpError::Nacked {
                                reason: Some(NackReason::NoContext),
                                ..
                            },
                        ..
                    }) if first => std::thread::sleep(Duration::from_millis(20)),
                    r => break r.unwrap(),
                }
            }
            first = false;
            let m = inbox.recv(T).unwrap();
            assert_eq!(m.payload, p, "size {n}");
            assert_eq!((m.src_node, m.vi), (NodeId(6), inbox.vi()));
        }
    }
    eprintln!(
        "{} round trips M1QAF2 <-> M1QBF3 in {:?}",
        rounds,
        start.elapsed()
    );
    let b = server.join().unwrap();
    assert_eq!(b.stats().forgotten_failures, 0);
}

#[test]
fn rdma_write_and_read_byte_for_byte() {
    let rack = Rack::up("rdma", "2x1x1");
    let a = Endpoint::attach_to(&rack.dir, "M1QAF2", None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, "M1QBF3", None).unwrap();
    let len = 3 << 20;
    let src = a.register(len).unwrap();
    let back = a.register(len).unwrap();
    let dst = b.register(len + 4096).unwrap();
    let page = a.rdma_page().unwrap();
    for (i, (n, soff, doff)) in [
        (1u64, 0u64, 0u64),
        (4097, 13, 4095),
        ((1 << 20) + 3, 5, 16383),
        (3 << 20, 0, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(i as u64 + 1, n as usize);
        src.write(soff, &data).unwrap();
        let notify = dst.va() + len;
        let to = dst.gvas(doff).unwrap();
        let t = page
            .write(i as u8, &src, soff, to, n, Some(notify))
            .unwrap();
        a.wait(t, T)
            .unwrap_or_else(|e| panic!("write of {n} B: {e}"));
        assert!(
            dst.to_vec(doff, n).unwrap() == data,
            "write of {n} B: bytes differ"
        );
        let note = b.wait_notification(T).unwrap();
        assert_eq!((note.va, note.len, note.src_node), (notify, n, a.node_id()));
        // And back, by RDMA read, into another region.
        let t = page.read(i as u8, to, &back, soff, n).unwrap();
        a.wait(t, T)
            .unwrap_or_else(|e| panic!("read of {n} B: {e}"));
        assert!(
            back.to_vec(soff, n).unwrap() == data,
            "read of {n} B: bytes differ"
        );
    }
}

#[test]
fn rdma_to_unregistered_memory_fails() {
    let rack = Rack::up("hole", "2x1x1");
    let a = Endpoint::attach_to(&rack.dir, "M1QAF2", None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, "M1QBF3", None).unwrap();
    let src = a.register(4096).unwrap();
    let page = a.rdma_page().unwrap();
    // Memory that is not registered at the destination: the destination NACKs every
    // attempt with page_fault (the SMMU's fault), the NI retries, then the write fails with
    // that reason (not a timeout: the destination answered every time).
    let hole = a.addr(b.node_id(), b.rank(), 1 << 36).unwrap();
    let t = page.write(31, &src, 0, hole, 100, None).unwrap();
    let e = a
        .wait(t, Some(Duration::from_secs(30)))
        .expect_err("a write to unregistered memory must fail");
    assert_eq!(e.op_error(), Some(page_fault()), "{e:?}");
    assert_eq!(e.code(), exanet::error::codes::NACKED);
    // Registered memory with its last byte beyond the region: the same.
    let dst = b.register(4096).unwrap();
    let past_end = dst.gvas(4000).unwrap();
    let t = page.write(30, &src, 0, past_end, 100, None).unwrap();
    let e = a
        .wait(t, Some(Duration::from_secs(30)))
        .expect_err("a write past the end of a region must fail");
    assert_eq!(e.op_error(), Some(page_fault()), "{e:?}");
    // And a write that fits succeeds on the same page.
    let t = page
        .write(30, &src, 0, dst.gvas(3996).unwrap(), 100, None)
        .unwrap();
    a.wait(t, T).unwrap();
}

/// How an operation ends that the destination NACKed with page_fault.
fn page_fault() -> OpError {
    OpError::Nacked {
        reason: Some(NackReason::PageFault),
        code: NackReason::PageFault as u8,
    }
}

#[test]
fn rdma_read_of_unregistered_memory_fails() {
    let rack = Rack::up("rhole", "2x1x1");
    let a = Endpoint::attach_to(&rack.dir, "M1QAF2", None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, "M1QBF3", None).unwrap();
    let dst = a.register(4096).unwrap();
    let page = a.rdma_page().unwrap();
    let hole = a.addr(b.node_id(), b.rank(), 1 << 36).unwrap();
    let t = page.read(0, hole, &dst, 0, 100).unwrap();
    let e = a
        .wait(t, Some(Duration::from_secs(30)))
        .expect_err("a read of unregistered memory must fail");
    // The serving NI refuses the request (page_fault) when it arrives.
    assert_eq!(e.op_error(), Some(page_fault()), "{e:?}");
    // The channel is free again.
    let t = page.read(0, hole, &dst, 0, 100).unwrap();
    a.forget(t).unwrap();
}

#[test]
fn job_keys_and_pdid_protection() {
    let rack = Rack::up("key", "1x1x1");
    rack.restart_with("\n[jobs.alice]\nkey = \"alice-secret\"\npdid = 42\n");
    let e = Endpoint::attach_to(&rack.dir, "M1QAF2", Some("no-such-job-key")).unwrap_err();
    assert!(matches!(e, Error::AttachRefused(_)), "{e:?}");
    assert_eq!(e.code(), exanet::error::codes::ATTACH_REFUSED);
    // The default job, and alice's: the PDID comes from the key, never from the workload.
    let d = Endpoint::attach_to(&rack.dir, "M1QAF2", None).unwrap();
    let d2 = Endpoint::attach_to(&rack.dir, "M1QAF3", None).unwrap();
    let alice = Endpoint::attach_to(&rack.dir, "M1QAF3", Some("alice-secret")).unwrap();
    assert_eq!(d.pdid(), Pdid(1));
    assert_eq!(alice.pdid(), Pdid(42));
    let inbox = d.mailbox(4).unwrap();
    // Same job, another node of the QFDB: delivered.
    let tx = d2.packetizer().unwrap();
    let to_d = d2.mailbox_addr(d.node_id(), d.rank(), inbox.vi()).unwrap();
    let t = tx.send(0, to_d, b"same job").unwrap();
    d2.wait(t, T).unwrap();
    assert_eq!(inbox.recv(T).unwrap().payload, b"same job");
    // Another job: the NI stamps PDID 42 and the destination NACKs the mismatch.
    let tx = alice.packetizer().unwrap();
    let to_d = alice
        .mailbox_addr(d.node_id(), d.rank(), inbox.vi())
        .unwrap();
    assert_eq!(to_d.pdid(), Pdid(42));
    let t = tx.send(0, to_d, b"intruder").unwrap();
    let e = alice.wait(t, T).unwrap_err();
    assert_eq!(
        e.op_error(),
        Some(OpError::Nacked {
            reason: Some(NackReason::PdidMismatch),
            code: 5
        }),
        "{e:?}"
    );
    // Forging the default job's PDID in the address is refused before it is sent.
    let forged = exanet::Gvas::new(Pdid(1), d.node_id(), d.rank(), to_d.va()).unwrap();
    assert!(matches!(
        tx.send(1, forged, b"forged"),
        Err(Error::ForeignPdid { pdid: 1, own: 42 })
    ));
    assert!(inbox.try_recv().unwrap().is_none());
}

/// Compiles examples/`name`.c against the static library.
fn build_c_example(name: &str) -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("exanet-{name}-c-{}", std::process::id()));
    let (ok, stdout, stderr) = rack::run(
        {
            let mut c = Command::new(std::env::var("CC").unwrap_or_else(|_| "gcc".into()));
            c.arg("-std=c11")
                .arg("-D_POSIX_C_SOURCE=200809L")
                .arg("-Wall")
                .arg("-Wextra")
                .arg("-Werror")
                .arg("-I")
                .arg(manifest.join("include"))
                .arg(manifest.join(format!("examples/{name}.c")))
                .arg(rack::exanet_lib())
                .args(["-lpthread", "-ldl", "-lm", "-lrt", "-lutil", "-lgcc_s"])
                .arg("-o")
                .arg(&out);
            c
        },
        Duration::from_secs(120),
    );
    assert!(ok, "building {name}.c failed:\n{stdout}\n{stderr}");
    out
}

/// Builds examples/`name`.rs with cargo, same profile and target directory as this test.
fn build_rust_example(name: &str) -> PathBuf {
    let bin = rack::bin_dir();
    let profile = bin
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_string();
    let target = bin.parent().expect("target directory").to_path_buf();
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(["build", "-p", "exanet", "--example", name])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile != "debug" {
        c.args(["--profile", &profile]);
    }
    let (ok, out, err) = rack::run(c, Duration::from_secs(600));
    assert!(ok, "building the Rust example failed:\n{out}\n{err}");
    bin.join("examples").join(name)
}

/// Runs `server serve 200` on M1QBF3 and `client run` on M1QAF2 against it.
fn pingpong_pair(rack: &Rack, server: &std::path::Path, client: &std::path::Path) {
    let mut srv = Proc::spawn({
        let mut c = rack.workload(server, "M1QBF3");
        c.args(["serve", "200"]);
        c
    });
    let ready = srv.wait_line("ready ", Duration::from_secs(30));
    let field = |k: &str| {
        ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {ready:?}"))
            .to_string()
    };
    let (rank, vi) = (field("rank="), field("mailbox="));
    let (ok, out, err) = rack::run(
        {
            let mut c = rack.workload(client, "M1QAF2");
            c.args(["run", &format!("M1QBF3:{rank}"), &vi, "200"]);
            c
        },
        Duration::from_secs(120),
    );
    assert!(ok, "{} client failed:\n{out}\n{err}", client.display());
    assert!(out.contains("200 messages to M1QBF3"), "{out}");
    eprint!("{} -> {}: {out}", client.display(), server.display());
    let (ok, out, err) = srv.finish(Duration::from_secs(30));
    assert!(ok, "{} server failed:\n{out}\n{err}", server.display());
    assert!(out.contains("served 200 messages"), "{out}");
}

#[test]
fn c_and_rust_pingpong_examples_against_the_rack() {
    let c_exe = build_c_example("pingpong");
    let rust_exe = build_rust_example("pingpong");
    let rack = Rack::up("c", "2x1x1");
    pingpong_pair(&rack, &c_exe, &c_exe);
    pingpong_pair(&rack, &rust_exe, &rust_exe);
    // The two speak the same protocol.
    pingpong_pair(&rack, &c_exe, &rust_exe);
    pingpong_pair(&rack, &rust_exe, &c_exe);
    let _ = std::fs::remove_file(c_exe);
}

/// examples/allreduce.c and allreduce.rs: eight members of two QFDBs, on the accelerator
/// and in software, each checking the sums.
#[test]
fn c_and_rust_allreduce_examples_against_the_rack() {
    let exe = build_c_example("allreduce");
    let rust = build_rust_example("allreduce");
    let rack = Rack::up("callr", "2x1x1");
    let nodes = [
        "M1QAF1", "M1QAF2", "M1QAF3", "M1QAF4", "M1QBF1", "M1QBF2", "M1QBF3", "M1QBF4",
    ];
    for path in ["accel", "software"] {
        let (ok, out, err) = rack::run(
            {
                let mut c = rack.workload(&rust, "M1QAF1");
                c.arg(path).args(nodes);
                c
            },
            Duration::from_secs(120),
        );
        assert!(ok, "allreduce.rs {path} failed:\n{out}\n{err}");
        assert!(out.contains("8 members agree"), "{out}");
        let (ok, out, err) = rack::run(
            {
                let mut c = rack.workload(&exe, "M1QAF1");
                c.arg(path).args(nodes);
                c
            },
            Duration::from_secs(120),
        );
        assert!(ok, "allreduce.c {path} failed:\n{out}\n{err}");
        assert!(out.contains(&format!("{path}: 8 members agree")), "{out}");
    }
    let _ = std::fs::remove_file(exe);
}

/// Not a test on its own: the child process of `a_workload_killed_mid_transfer_frees_its_rank`,
/// which runs it explicitly (`--ignored --exact`) with EXANET_E2E_CHILD and EXANET_E2E_DST
/// set. Attaches, posts big RDMA writes to the GVAS in EXANET_E2E_DST, says "posted" and
/// waits to be killed. Run any other way it fails, rather than pass having done nothing.
#[test]
#[ignore = "the child process of a_workload_killed_mid_transfer_frees_its_rank, run by it"]
fn helper_child_posting_big_writes() {
    let (Ok(dst), Some(_)) = (
        std::env::var("EXANET_E2E_DST"),
        std::env::var_os("EXANET_E2E_CHILD"),
    ) else {
        panic!(
            "helper_child_posting_big_writes is the child of \
             a_workload_killed_mid_transfer_frees_its_rank, which runs it with \
             EXANET_E2E_CHILD and EXANET_E2E_DST set; it is not a test on its own"
        );
    };
    let ep = Endpoint::attach().unwrap();
    let dst: exanet::Gvas = dst.parse().unwrap();
    let len = 64 << 20;
    let mem = ep.register(len).unwrap();
    mem.write(0, &pattern(9, 1 << 20)).unwrap();
    let page = ep.rdma_page().unwrap();
    for ch in 0..4u8 {
        page.write(ch, &mem, 0, dst, len, None).unwrap();
    }
    let mut out = std::io::stdout();
    writeln!(out, "posted rank={}", ep.rank()).unwrap();
    out.flush().unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_workload_killed_mid_transfer_frees_its_rank() {
    let rack = Rack::up("kill", "1x1x1");
    let b = Endpoint::attach_to(&rack.dir, "M1QAF3", None).unwrap();
    let target = b.register(64 << 20).unwrap();
    let dst = target.gvas(0).unwrap();
    let mut child = Proc::spawn({
        let mut c = rack.workload(&std::env::current_exe().unwrap(), "M1QAF2");
        c.args([
            "helper_child_posting_big_writes",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("EXANET_E2E_CHILD", "1")
        .env("EXANET_E2E_DST", dst.to_string());
        c
    });
    let line = child.wait_line("posted", Duration::from_secs(60));
    eprintln!("child: {line}");
    // Let the transfers get going, then kill the workload mid-transfer.
    std::thread::sleep(Duration::from_millis(100));
    child.child.kill().unwrap();
    let status = child.child.wait().unwrap();
    assert!(!status.success());
    drop(child);
    // Another workload can attach to the node and use it, as soon as the daemon noticed.
    let deadline = Instant::now() + Duration::from_secs(30);
    let a = loop {
        match Endpoint::attach_to(&rack.dir, "M1QAF2", None) {
            Ok(a) => break a,
            Err(e) if Instant::now() < deadline => {
                eprintln!("attach after the kill: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("cannot attach after the kill: {e}"),
        }
    };
    let src = a.register(1 << 20).unwrap();
    let data = pattern(77, 1 << 20);
    src.write(0, &data).unwrap();
    let page = a.rdma_page().unwrap();
    // Channel 0 was the dead workload's too: it must be free again.
    let t = page.write(0, &src, 0, dst, 1 << 20, None).unwrap();
    a.wait(t, T).unwrap();
    assert!(target.to_vec(0, 1 << 20).unwrap() == data);
    // And messages flow both ways.
    let inbox = b.mailbox(8).unwrap();
    let tx = a.packetizer().unwrap();
    let t = tx.send(0, inbox.addr(), b"alive").unwrap();
    a.wait(t, T).unwrap();
    let m = inbox.recv(T).unwrap();
    assert_eq!(
        (m.payload.as_slice(), m.src_node),
        (&b"alive"[..], a.node_id())
    );
    // Every rank a job may hold is usable: 6 more attach (7 in all) while `a` holds one;
    // rank 7 is kept for the IP service.
    let more: Vec<Endpoint> = (0..6)
        .map(|_| Endpoint::attach_to(&rack.dir, "M1QAF2", None).unwrap())
        .collect();
    let mut ranks: Vec<u8> = more.iter().map(Endpoint::rank).chain([a.rank()]).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..7).collect::<Vec<u8>>());
    let e = Endpoint::attach_to(&rack.dir, "M1QAF2", None).unwrap_err();
    assert!(matches!(e, Error::AttachRefused(_)), "{e:?}");
}

/// Sends message number `i` (its 8 bytes) to `to` and returns how it ended: `Ok` when ACKed,
/// the NACK reason otherwise.
fn send_numbered(
    ep: &Endpoint,
    tx: &exanet::Packetizer,
    to: exanet::Gvas,
    i: u64,
) -> Result<(), NackReason> {
    let t = tx.send(0, to, &i.to_be_bytes()).unwrap();
    match ep.wait(t, T) {
        Ok(()) => Ok(()),
        Err(e) => match e.op_error() {
            Some(OpError::Nacked {
                reason: Some(r), ..
            }) => Err(r),
            _ => panic!("message {i}: {e:?}"),
        },
    }
}

/// A mailbox of capacity N holds N unread messages, end to end (issue 10, defect 1): a
/// message counts against it from its arrival until the workload takes it, wherever it
/// waits meanwhile (the NI's queue, the completion ring, the library's queue). Of 6000
/// messages to a receiver that only polls, exactly N are ACKed and the rest NACKed
/// `queue_full`; the library holds at most N; each one taken lets exactly one more in;
/// nothing is lost or delivered twice.
#[test]
fn mailbox_capacity_holds_until_the_receiver_takes_messages() {
    let rack = Rack::up("cap", "1x1x1");
    let a = Endpoint::attach_to(&rack.dir, "M1QAF1", None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, "M1QAF3", None).unwrap();
    let tx = a.packetizer().unwrap();
    let mut next = 0u64;
    for cap in [1u32, 4] {
        let inbox = b.mailbox(cap).unwrap();
        let to = a.mailbox_addr(b.node_id(), b.rank(), inbox.vi()).unwrap();
        let mut acked = Vec::new();
        let mut full = 0;
        let sends = if cap == 1 { 6000 } else { 600 };
        for k in 0..sends {
            match send_numbered(&a, &tx, to, next) {
                Ok(()) => acked.push(next),
                Err(NackReason::QueueFull) => full += 1,
                Err(r) => panic!("capacity {cap}: message {next} NACKed {r:?}"),
            }
            next += 1;
            // The receiver only polls: its completions are processed, nothing is taken.
            if k % 50 == 0 {
                b.poll().unwrap();
                assert!(
                    inbox.queued() <= cap as usize,
                    "capacity {cap}: the library holds {} messages",
                    inbox.queued()
                );
            }
        }
        assert_eq!(
            (acked.len(), full),
            (cap as usize, sends - cap as usize),
            "capacity {cap}: ACKed {:?}...",
            &acked[..acked.len().min(8)]
        );
        // Each message taken makes room for exactly one more.
        let mut got = Vec::new();
        for round in 0..3 {
            let m = inbox.recv(T).unwrap();
            got.push(u64::from_be_bytes(m.payload.try_into().unwrap()));
            assert_eq!(
                send_numbered(&a, &tx, to, next),
                Ok(()),
                "capacity {cap}, round {round}: refused after the receiver took one"
            );
            acked.push(next);
            next += 1;
            assert_eq!(
                send_numbered(&a, &tx, to, next),
                Err(NackReason::QueueFull),
                "capacity {cap}, round {round}: accepted past the capacity"
            );
            next += 1;
        }
        // What is left: exactly the rest of the ACKed messages, in order, once.
        while got.len() < acked.len() {
            let m = inbox.recv(T).unwrap();
            got.push(u64::from_be_bytes(m.payload.try_into().unwrap()));
        }
        assert_eq!(got, acked, "capacity {cap}");
        b.poll().unwrap();
        assert!(inbox.try_recv().unwrap().is_none(), "capacity {cap}");
    }
    // A mailbox freed with messages unread (in the NI or the completion ring): a new
    // mailbox given the same index starts empty, and holds its own capacity.
    let old = b.mailbox(2).unwrap();
    let to = a.mailbox_addr(b.node_id(), b.rank(), old.vi()).unwrap();
    for _ in 0..2 {
        assert_eq!(send_numbered(&a, &tx, to, next), Ok(()));
        next += 1;
    }
    let vi = old.vi();
    drop(old);
    let new = b.mailbox(2).unwrap();
    assert_eq!(new.vi(), vi, "the freed index is the first free one");
    for k in 0..3 {
        let r = send_numbered(&a, &tx, to, next + k);
        assert_eq!(
            r,
            if k < 2 {
                Ok(())
            } else {
                Err(NackReason::QueueFull)
            }
        );
    }
    for k in 0..2 {
        let m = new.recv(T).unwrap();
        assert_eq!(
            m.payload,
            (next + k).to_be_bytes(),
            "a freed mailbox's message"
        );
    }
    b.poll().unwrap();
    assert!(new.try_recv().unwrap().is_none());
}
