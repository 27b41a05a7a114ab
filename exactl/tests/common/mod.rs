//! Helpers shared by exactl's integration tests: a scratch rack directory that runs
//! exactl on itself, rack files of racks that are not running, and the check of a usage
//! error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const EXACTL: &str = env!("CARGO_BIN_EXE_exactl");

/// A scratch rack directory (not created: exactl or `with_rack_file` makes it), removed
/// on drop (after a `rack down` when daemons may run).
pub struct Scratch {
    pub dir: PathBuf,
    pub daemons: bool,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "exactl-{}-{tag}-{}-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch {
            dir,
            daemons: false,
        }
    }

    /// Writes a rack file for a rack that is not running.
    pub fn with_rack_file(self, text: &str) -> Scratch {
        std::fs::create_dir_all(&self.dir).unwrap();
        std::fs::write(self.dir.join("rack.toml"), text).unwrap();
        self
    }

    /// exactl on this rack, starting the daemon binary the tests found (if any).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(EXACTL);
        c.arg("--rack")
            .arg(&self.dir)
            .args(args)
            // IP over ExaNet has tests of its own (tests/tests/ip_over_exanet.rs).
            .env("EXANET_RACK_IP", "off")
            .env_remove("EXANET_RACK");
        if let Some(d) = daemon_binary() {
            c.env("EXANET_DAEMON", d);
        }
        c
    }

    pub fn exactl(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run exactl")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.daemons {
            let out = self.exactl(&["rack", "down"]);
            if !out.status.success() {
                eprintln!("cleanup: rack down failed: {}", text(&out.stderr));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Setting it to `1` lets the tests that run real daemons skip when there is no daemon
/// binary (instead of failing).
pub const ALLOW_SKIP_ENV: &str = "EXANET_ALLOW_SKIP";

/// The daemon binary for a test that runs real daemons. Without one the test fails (a
/// test that returns early would pass without testing anything), unless
/// `EXANET_ALLOW_SKIP=1`: then it returns `None` after saying on the test process's stderr,
/// which the test runner shows even for a passing test, that `test` was skipped.
#[track_caller]
pub fn daemon_or_skip(test: &str) -> Option<PathBuf> {
    if let Some(d) = daemon_binary() {
        return Some(d);
    }
    let why = format!(
        "no exanetd next to {EXACTL}: build it first (`cargo build -p exanetd`, or `cargo \
         build --workspace`) or set EXANET_DAEMON to one"
    );
    if std::env::var(ALLOW_SKIP_ENV).is_ok_and(|v| v == "1") {
        use std::io::Write as _;
        // Straight to the process's stderr: the harness captures eprintln! of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: {why} ({ALLOW_SKIP_ENV}=1)"
        );
        return None;
    }
    panic!("{why}; or set {ALLOW_SKIP_ENV}=1 to skip the tests that need it");
}

/// A part of a test that needs a binary the build did not make: fails, unless
/// `EXANET_ALLOW_SKIP=1`, then says on stderr that it was skipped (as [`daemon_or_skip`]).
#[allow(dead_code)] // used by some of the test files that include this module
#[track_caller]
pub fn skipped_or_fail(what: &str, why: &str) {
    if std::env::var(ALLOW_SKIP_ENV).is_ok_and(|v| v == "1") {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {what}: {why} ({ALLOW_SKIP_ENV}=1)"
        );
        return;
    }
    panic!("{what}: {why}; build the workspace, or set {ALLOW_SKIP_ENV}=1 to skip it");
}

/// The daemon binary: `$EXANET_DAEMON`, else `exanetd` next to exactl.
pub fn daemon_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("EXANET_DAEMON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(EXACTL).parent()?.join("exanetd");
    p.exists().then_some(p)
}

/// A rack file of `shape` with every node on 127.0.0.1 (ports never bound: nothing runs).
pub fn rack_toml(shape: &str) -> String {
    let dims: Vec<u32> = shape.split('x').map(|d| d.parse().unwrap()).collect();
    let (x, y, z) = (dims[0], dims[1], dims[2]);
    let mut s = format!("name = \"t\"\nshape = \"{shape}\"\n");
    let mut id = 0;
    for zz in 0..z {
        for yy in 0..y {
            for xx in 0..x {
                for f in 1..=4 {
                    let blade = zz * y + yy + 1;
                    let slot = char::from(b'A' + xx as u8);
                    s.push_str(&format!(
                        "[nodes.M{blade}Q{slot}F{f}]\nlink = \"127.0.0.1:{}\"\nmetrics = \"127.0.0.1:{}\"\n",
                        40000 + id,
                        41000 + id
                    ));
                    id += 1;
                }
            }
        }
    }
    s
}

/// A rack file of `shape` on 127.0.0.1 with ports that were free a moment ago (UDP for
/// the links, TCP for the metrics), for a rack that is not running: a fixed port could be
/// held by another test's daemon, and exactl would then ask it.
#[allow(dead_code)] // used by some of the test files that include this module
pub fn rack_toml_free_ports(shape: &str) -> String {
    let text = rack_toml(shape);
    let mut held = Vec::new();
    let mut out = String::new();
    for line in text.lines() {
        let mut port = |udp: bool| -> u16 {
            let addr = if udp {
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                let a = s.local_addr().unwrap();
                held.push(Box::new(s) as Box<dyn std::any::Any>);
                a
            } else {
                let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let a = s.local_addr().unwrap();
                held.push(Box::new(s) as Box<dyn std::any::Any>);
                a
            };
            addr.port()
        };
        if line.starts_with("link = ") {
            out.push_str(&format!("link = \"127.0.0.1:{}\"\n", port(true)));
        } else if line.starts_with("metrics = ") {
            out.push_str(&format!("metrics = \"127.0.0.1:{}\"\n", port(false)));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Exit code 2, nothing on stdout, and exactly one line on stderr that contains every
/// one of `needles`.
#[track_caller]
pub fn assert_usage_error(out: &Output, needles: &[&str]) {
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit code; stderr: {err}; stdout: {}",
        text(&out.stdout)
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line on stderr: {err:?}"
    );
    for n in needles {
        assert!(err.contains(n), "stderr should mention {n:?}: {err}");
    }
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
}
