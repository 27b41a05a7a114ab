//! A rack of real exanetd processes on loopback for tests and benchmarks. The daemon
//! binary is passed in, so that integration tests and benches of this package share it.
#![allow(dead_code)]

pub mod raw;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exanet_control::control::{request, LinkState, NodeStatus, Request, Response};
use exanet_control::rack::{write_rack_file, Job, Layout, Rack, RackFile};
use exanet_proto::Shape;

pub struct TestRack {
    pub dir: PathBuf,
    pub shape: Shape,
    pub daemon: PathBuf,
    pub log_level: String,
    children: BTreeMap<String, Child>,
}

impl TestRack {
    pub fn new(tag: &str, shape: &str, daemon: &str) -> TestRack {
        let dir = std::env::temp_dir().join(format!("exanetd-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let shape: Shape = shape.parse().unwrap();
        // Below the ephemeral range: a port let go after a bind to port 0 is the next one
        // the kernel gives any socket of the tests running beside this one.
        let mut ports = exanet_control::ports::pick_free(shape.nodes() as usize)
            .expect("free ports")
            .into_iter();
        let mut file = RackFile::loopback(&format!("test-{tag}"), shape, |_| {
            ports.next().expect("one pair per node")
        });
        file.window = 256 * 1024;
        file.local_window = 64 * 1024;
        let names: Vec<String> = file.nodes.keys().cloned().collect();
        write_rack_file(&dir, &file).unwrap();
        exanet_control::tls::ensure_rack_pki(&Layout::new(&dir), &names).unwrap();
        TestRack {
            dir,
            shape,
            daemon: PathBuf::from(daemon),
            log_level: "debug".into(),
            children: BTreeMap::new(),
        }
    }

    pub fn rack(&self) -> Rack {
        Rack::load(&self.dir).unwrap()
    }

    pub fn start(&mut self, name: &str) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(&self.daemon)
            .args(["--rack", self.dir.to_str().unwrap(), "--node", name])
            .env("RUST_LOG", &self.log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.insert(name.to_string(), child);
    }

    pub fn start_all(&mut self) {
        for id in self.shape.node_ids() {
            let n = self.shape.display(id);
            self.start(&n);
        }
    }

    pub fn sock(&self, name: &str) -> PathBuf {
        Layout::new(&self.dir).control_socket(&name)
    }

    pub fn status(&self, name: &str) -> Option<NodeStatus> {
        match request(&self.sock(name), &Request::Status, Duration::from_secs(2)) {
            Ok(Response::Status(s)) => Some(*s),
            _ => None,
        }
    }

    pub fn wait_links_up(&self, names: &[&str], timeout: Duration) {
        let t0 = Instant::now();
        loop {
            let all = names.iter().all(|n| {
                self.status(n)
                    .is_some_and(|s| s.links.iter().all(|l| l.state == LinkState::Up))
            });
            if all {
                return;
            }
            assert!(
                t0.elapsed() < timeout,
                "links not up after {timeout:?} (rack in {})",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn metrics(&self, name: &str) -> String {
        let rack = self.rack();
        let id = self.shape.parse_node(name).unwrap();
        let mut s = TcpStream::connect(&rack.entry(id).metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Kills `name`'s daemon with SIGKILL (a crash: no goodbye to its peers) and reaps it.
    pub fn kill(&mut self, name: &str) {
        let mut c = self.children.remove(name).unwrap();
        let _ = c.kill();
        let _ = c.wait();
    }

    pub fn stop(&mut self, name: &str) -> std::process::ExitStatus {
        self.stop_within(name, Duration::from_secs(5)).0
    }

    /// Sends SIGTERM to `name`'s daemon and waits up to `within` for it to exit: how it
    /// exited and how long it took. Panics (after a SIGKILL) if it did not exit in time.
    pub fn stop_within(
        &mut self,
        name: &str,
        within: Duration,
    ) -> (std::process::ExitStatus, Duration) {
        let mut c = self.children.remove(name).unwrap();
        signal(c.id(), libc::SIGTERM);
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return (st, t0.elapsed());
            }
            if t0.elapsed() > within {
                let _ = c.kill();
                let _ = c.wait();
                panic!("{name} did not exit within {within:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of `name`'s daemon, if this rack started it.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.get(name).map(Child::id)
    }
}

/// A running 1x1x1 rack, every link up, with a second job `alice` (PDID 42, admitted by
/// `alice_key`) beside the default one: a node's workloads of two jobs side by side.
pub fn two_job_rack(tag: &str, daemon: &str, alice_key: &str, log_level: &str) -> TestRack {
    let mut r = TestRack::new(tag, "1x1x1", daemon);
    r.log_level = log_level.into();
    let mut f = r.rack().file.clone();
    f.jobs.insert(
        "alice".into(),
        Job {
            key: Some(alice_key.into()),
            pdid: 42,
            ..Job::default()
        },
    );
    write_rack_file(&r.dir, &f).unwrap();
    r.start_all();
    r.wait_links_up(
        &["M1QAF1", "M1QAF2", "M1QAF3", "M1QAF4"],
        Duration::from_secs(20),
    );
    r
}

pub fn signal(pid: u32, sig: i32) {
    Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap();
}

impl Drop for TestRack {
    fn drop(&mut self) {
        for (_, c) in self.children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            // A failed test leaves nothing behind unless asked to: the logs' last lines go
            // to stderr instead.
            if std::env::var_os("EXANET_KEEP_TEST_DIR").is_some() {
                eprintln!("test rack kept in {}", self.dir.display());
                return;
            }
            let logs = std::fs::read_dir(&self.dir).into_iter().flatten().flatten();
            for log in logs.filter(|e| e.path().extension().is_some_and(|x| x == "log")) {
                let text = std::fs::read_to_string(log.path()).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "--- last lines of {} (EXANET_KEEP_TEST_DIR=1 keeps the rack) ---",
                    log.path().display()
                );
                for l in &lines[lines.len().saturating_sub(15)..] {
                    eprintln!("{l}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
