//! Jobs of different users, with real users (needs root: it creates three system users and
//! removes them at the end, even when it fails). Workloads run as those users: this test
//! binary re-executes itself under their uids, running the `#[ignore]`d `helper_workload`
//! in a role chosen by an environment variable.
//!
//! - a workload of user A attaches as job A, and is refused job B's key and the default
//!   job;
//! - a process of a user that no job names is refused; so is root for a job naming users;
//! - A cannot open `/proc/<B>/mem` nor B's memory descriptors under `/proc/<B>/fd`;
//! - on the wire, A's message to B's mailbox and A's RDMA write into and read from B's rank
//!   are NACKed with `pdid_mismatch`, and B's memory and mailbox are unchanged.
//!
//! The daemons run with umask 077, as an operator's might: the run directory they make
//! must still let other users reach the attach socket.
//!
//! Without root or useradd it prints a SKIPPED line and passes, unless
//! `EXANET_REQUIRE_ROOT` is set (to anything): then it fails. CI sets it.

// The helper every test of the workspace that needs root or a tool shares (std only).
#[allow(dead_code)]
#[path = "../../tests/src/require.rs"]
mod require;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use exanet_control::rack::{write_rack_file, Job, Layout};
use exanet_proto::attach::{status, Command as Cmd, Completion, Resource};
use exanet_proto::ni::{mailbox_gvas, NackReason, RdmaRead, RdmaWrite, SendMessage};
use exanet_proto::{Gvas, NodeId, Pdid};
use nix::sys::stat::{umask, Mode};
use support::raw::attach_at;
use support::TestRack;

const USERS: [&str; 3] = ["exanet-test-a", "exanet-test-b", "exanet-test-c"];
const A_KEY: &str = "key-of-job-a";
const B_KEY: &str = "key-of-job-b";
const A_PDID: u16 = 100;
const B_PDID: u16 = 200;
/// A's node and B's node.
const A_NODE: &str = "M1QAF1";
const B_NODE: &str = "M1QAF2";
const B_NODE_ID: NodeId = NodeId(1);
const MEM: usize = 1 << 20;

/// A child process killed (and reaped) when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether every directory above `path` lets others through and `path` lets them read and
/// execute it.
fn others_can_run(path: &Path) -> bool {
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    mode(path) & 0o005 == 0o005 && path.ancestors().skip(1).all(|d| mode(d) & 0o001 != 0)
}

/// This test binary, somewhere the workloads' users can run it.
fn exe_for_others(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    if others_can_run(&exe) {
        return exe;
    }
    let copy = dir.join("cross_user_helper");
    std::fs::copy(&exe, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

fn spawn_as(
    exe: &Path,
    user: &require::SystemUser,
    role: &str,
    rack: &Path,
    env: &[(&str, String)],
) -> Kid {
    let mut c = Command::new(exe);
    c.args([
        "helper_workload",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .uid(user.id("-u"))
    .gid(user.id("-g"))
    .current_dir("/")
    .env("EXANET_XU_ROLE", role)
    .env("EXANET_XU_RACK", rack)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    Kid(c.spawn().unwrap())
}

/// Reads a child's stdout lines on a thread; they come out of the receiver.
fn lines_of(kid: &mut Kid) -> mpsc::Receiver<String> {
    let out = kid.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to `within` for the child to exit; its stdout lines so far and its stderr.
fn finish(
    mut kid: Kid,
    lines: &mpsc::Receiver<String>,
    within: Duration,
    who: &str,
) -> Vec<String> {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = kid.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < within,
            "{who} did not finish within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(50));
    let out: Vec<String> = lines.try_iter().collect();
    let mut err = String::new();
    if let Some(mut e) = kid.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    for l in &out {
        eprintln!("  {who}| {l}");
    }
    assert!(status.success(), "{who} failed ({status}):\n{err}");
    out
}

#[test]
fn jobs_of_different_users_are_isolated() {
    let root = exanet_shm::effective_uid() == 0;
    // useradd --help exits 0 where useradd is installed.
    let has_useradd = require::runs("useradd", "--help");
    if !root || !has_useradd {
        require::skip_unless_required(
            "EXANET_REQUIRE_ROOT",
            "cross_user::jobs_of_different_users_are_isolated",
            &format!(
                "it creates users and runs workloads under them: needs root and useradd \
                 (root: {root}, useradd: {has_useradd})"
            ),
        );
        return;
    }
    let users: Vec<require::SystemUser> = USERS
        .iter()
        .map(|u| require::SystemUser::create(u).unwrap())
        .collect();
    let (uid_a, uid_b) = (users[0].id("-u"), users[1].id("-u"));

    // The daemons run with an operator's strict umask: only the attach socket (0666) and
    // the way to it may be opened to other users.
    // umask sets the mask of the whole process; this test binary runs only this test (the
    // helper is run in child processes).
    let old_umask = umask(Mode::from_bits_truncate(0o077));
    let mut r = TestRack::new("cross-user", "1x1x1", env!("CARGO_BIN_EXE_exanetd"));
    let mut f = r.rack().file.clone();
    f.jobs.insert(
        "a".into(),
        Job {
            key: Some(A_KEY.into()),
            pdid: A_PDID,
            uid: vec![uid_a],
            ..Job::default()
        },
    );
    f.jobs.insert(
        "b".into(),
        Job {
            key: Some(B_KEY.into()),
            pdid: B_PDID,
            uid: vec![uid_b],
            ..Job::default()
        },
    );
    write_rack_file(&r.dir, &f).unwrap();
    r.start_all();
    umask(old_umask);
    r.wait_links_up(
        &["M1QAF1", "M1QAF2", "M1QAF3", "M1QAF4"],
        Duration::from_secs(20),
    );
    // The rack directory is the operator's to open (the test made it with umask 077); the
    // run directory inside it is the daemon's.
    std::fs::set_permissions(&r.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut p = r.dir.clone();
    while let Some(parent) = p.parent() {
        assert!(
            others_can_run(&p) || p == r.dir,
            "{} is closed to others",
            p.display()
        );
        p = parent.to_path_buf();
    }
    let exe = exe_for_others(&r.dir);

    // Root may not join a job that names its users.
    let e = attach_at(&Layout::new(&r.dir).attach_socket(&A_NODE), Some(A_KEY))
        .err()
        .expect("root joined job a");
    assert!(e.contains("may not join job a"), "{e}");

    // B attaches on its node and reports what A will aim at.
    let mut b = spawn_as(&exe, &users[1], "b", &r.dir, &[]);
    let b_lines = lines_of(&mut b);
    let ready = loop {
        match b_lines.recv_timeout(Duration::from_secs(60)) {
            // libtest may print "test helper_workload ... " before it on the same line.
            Ok(l) => match l.split_once("B-READY ") {
                Some((_, rest)) => break rest.to_string(),
                None => eprintln!("  B| {l}"),
            },
            Err(e) => {
                let _ = b.0.kill();
                let mut err = String::new();
                if let Some(mut s) = b.0.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut s, &mut err);
                }
                panic!("B never said it was ready ({e}):\n{err}");
            }
        }
    };
    eprintln!("B: {ready}");
    let s = r.status(B_NODE).unwrap();
    assert!(
        s.ni.workloads
            .iter()
            .any(|w| w.job == "b" && w.uid == uid_b),
        "status does not show B: {:?}",
        s.ni.workloads
    );
    let nacks_before =
        s.ni.counters.nacks_sent[exanet_proto::ni::NackReason::PdidMismatch as usize];

    let a = spawn_as(&exe, &users[0], "a", &r.dir, &[("EXANET_XU_B", ready)]);
    let mut a = a;
    let a_lines = lines_of(&mut a);
    let out = finish(a, &a_lines, Duration::from_secs(120), "A");
    for want in [
        "A-REFUSED-JOB-B",
        "A-REFUSED-DEFAULT",
        "A-ATTACHED",
        "A-PROC-DENIED mem",
        "A-PROC-DENIED memfd",
        "A-PROC-DENIED ringfd",
        "A-PROC-DENIED fd-dir",
        "A-SEND-NACKED",
        "A-WRITE-NACKED",
        "A-READ-NACKED",
    ] {
        assert!(
            out.iter().any(|l| l.contains(want)),
            "A did not report {want}"
        );
    }

    let mut c = spawn_as(&exe, &users[2], "c", &r.dir, &[]);
    let c_lines = lines_of(&mut c);
    let out = finish(c, &c_lines, Duration::from_secs(60), "C");
    assert!(
        out.iter().any(|l| l.contains("C-REFUSED")),
        "C did not report"
    );

    // B checks its memory and mailbox, then leaves.
    writeln!(b.0.stdin.as_mut().unwrap(), "check").unwrap();
    let out = finish(b, &b_lines, Duration::from_secs(60), "B");
    assert!(
        out.iter().any(|l| l.contains("B-UNCHANGED")),
        "B did not report"
    );

    let s = r.status(B_NODE).unwrap();
    let nacks = s.ni.counters.nacks_sent[exanet_proto::ni::NackReason::PdidMismatch as usize];
    eprintln!("{B_NODE}: pdid_mismatch NACKs sent {nacks_before} -> {nacks}");
    assert!(nacks >= nacks_before + 2, "{:?}", s.ni.counters.nacks_sent);
    let s = r.status(A_NODE).unwrap();
    assert!(
        s.errors.get("workload_user_refused").copied().unwrap_or(0) >= 3,
        "{:?}",
        s.errors
    );
    for n in ["M1QAF1", "M1QAF2", "M1QAF3", "M1QAF4"] {
        let (st, _) = r.stop_within(n, Duration::from_secs(15));
        assert!(st.success(), "{n} exited with {st} on SIGTERM");
    }
    drop(r);
    drop(users);
}

/// Run by `jobs_of_different_users_are_isolated` as another user; does nothing otherwise.
#[test]
#[ignore = "a workload run by jobs_of_different_users_are_isolated under another uid"]
fn helper_workload() {
    let Ok(role) = std::env::var("EXANET_XU_ROLE") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("EXANET_XU_RACK").unwrap());
    let layout = Layout::new(&dir);
    match role.as_str() {
        "a" => role_a(&layout),
        "b" => role_b(&layout),
        "c" => role_c(&layout),
        other => panic!("no role {other}"),
    }
}

/// B: attaches as job b, fills 1 MiB of registered memory with 0x5A, takes a mailbox, says
/// where they are, and after "check" on stdin verifies that neither changed.
fn role_b(layout: &Layout) {
    let mut b =
        attach_at(&layout.attach_socket(&B_NODE), Some(B_KEY)).expect("B attaches as job b");
    assert_eq!(b.pdid, B_PDID);
    let (mem, va) = b.register(MEM);
    mem.write(0, &vec![0x5A; MEM]).unwrap();
    let mb = b.alloc(Resource::Mailbox);
    println!(
        "B-READY {} {} {} {} {} {}",
        b.rank,
        va,
        mb,
        std::process::id(),
        mem.as_raw_fd(),
        b.region.as_raw_fd()
    );
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let mut got = vec![0u8; MEM];
    mem.read(0, &mut got).unwrap();
    if let Some(i) = got.iter().position(|x| *x != 0x5A) {
        panic!("B's memory changed at byte {i}: {:#x}", got[i]);
    }
    b.poll();
    assert!(
        !b.got
            .iter()
            .any(|c| matches!(c, Completion::Message { .. } | Completion::Notified { .. })),
        "something reached B: {:?}",
        b.got
    );
    println!("B-UNCHANGED");
}

fn role_c(layout: &Layout) {
    for key in [Some(A_KEY), Some(B_KEY), None] {
        let e = attach_at(&layout.attach_socket(&A_NODE), key)
            .err()
            .expect("a user no job names attached");
        assert!(e.contains("may not attach to any job"), "{e}");
        println!("C-REFUSED {key:?}: {e}");
    }
}

fn role_a(layout: &Layout) {
    let b: Vec<u64> = std::env::var("EXANET_XU_B")
        .unwrap()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let [b_rank, b_va, b_mb, b_pid, b_memfd, b_ringfd] = b[..] else {
        panic!("{b:?}")
    };
    let sock = layout.attach_socket(&A_NODE);

    // Job b's key and the default job are refused to A.
    let e = attach_at(&sock, Some(B_KEY)).err().expect("A joined job b");
    assert!(e.contains("may not join job b"), "{e}");
    println!("A-REFUSED-JOB-B {e}");
    let e = attach_at(&sock, None)
        .err()
        .expect("A joined the default job");
    assert!(e.contains("may not join job default"), "{e}");
    println!("A-REFUSED-DEFAULT {e}");
    let mut a = attach_at(&sock, Some(A_KEY)).expect("A attaches as job a");
    assert_eq!(a.pdid, A_PDID);
    println!("A-ATTACHED rank {} pdid {}", a.rank, a.pdid);

    // The OS keeps A out of B's memory. (A can open its own, so the check means something.)
    std::fs::File::open("/proc/self/mem").expect("A opens its own /proc/self/mem");
    for (what, path) in [
        ("mem", format!("/proc/{b_pid}/mem")),
        ("memfd", format!("/proc/{b_pid}/fd/{b_memfd}")),
        ("ringfd", format!("/proc/{b_pid}/fd/{b_ringfd}")),
    ] {
        for write in [false, true] {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(&path)
            {
                Ok(_) => panic!("A opened {path} (write: {write})"),
                Err(e) => assert_eq!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied,
                    "{path}: {e}"
                ),
            }
        }
        println!("A-PROC-DENIED {what} {path}");
    }
    let e = std::fs::read_dir(format!("/proc/{b_pid}/fd")).expect_err("A listed B's descriptors");
    println!("A-PROC-DENIED fd-dir {e}");

    // On the wire: A writes job b's PDID into every GVAS; the NI stamps A's, and B's node
    // NACKs each with pdid_mismatch.
    let pdid_nack = |c: &Completion| {
        matches!(c,
            Completion::Sent { status: status::NACKED, reason, .. }
            | Completion::Rdma { status: status::NACKED, reason, .. }
            if *reason == NackReason::PdidMismatch as u8)
    };
    let pk = a.alloc(Resource::Packetizer);
    a.post(&Cmd::Send {
        tag: 1,
        op: SendMessage {
            vi: pk,
            ch: 0,
            dst: mailbox_gvas(Pdid(B_PDID), B_NODE_ID, b_rank as u8, b_mb as u8).unwrap(),
            payload: b"from A".to_vec(),
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = a.wait("send", |c| matches!(c, Completion::Sent { tag: 1, .. }));
    assert!(pdid_nack(&c), "A's message to B: {c:?}");
    println!("A-SEND-NACKED {c:?}");

    let (src, src_va) = a.register(MEM);
    src.write(0, &vec![0xEE; MEM]).unwrap();
    let page = a.alloc(Resource::RdmaPage);
    let target = Gvas::new(Pdid(B_PDID), B_NODE_ID, b_rank as u8, b_va).unwrap();
    a.post(&Cmd::Write {
        tag: 2,
        op: RdmaWrite {
            page,
            ch: 0,
            src_va,
            dst: target,
            len: 64 << 10,
            notify: Some(b_va + (512 << 10)),
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = a.wait("write", |c| matches!(c, Completion::Rdma { tag: 2, .. }));
    assert!(pdid_nack(&c), "A's RDMA write into B: {c:?}");
    println!("A-WRITE-NACKED {c:?}");
    a.post(&Cmd::Read {
        tag: 3,
        op: RdmaRead {
            page,
            ch: 0,
            src: target,
            dst_va: src_va,
            len: 64 << 10,
        },
        at: exanet_proto::model::ModelTime::ZERO,
    });
    let c = a.wait("read", |c| matches!(c, Completion::Rdma { tag: 3, .. }));
    let mut back = vec![0u8; MEM];
    src.read(0, &mut back).unwrap();
    assert!(back.iter().all(|x| *x == 0xEE), "B's bytes reached A");
    assert!(pdid_nack(&c), "A's RDMA read of B: {c:?}");
    println!("A-READ-NACKED {c:?}");
}
