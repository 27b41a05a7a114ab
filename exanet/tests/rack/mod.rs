//! End-to-end helpers: a scratch rack run by the `exactl` and `exanetd` binaries of this
//! build (found next to the test executable, as tests/src/lib.rs of exanet-tests does),
//! always taken down when the guard drops. Shared with exanet-perf's tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Environment variable naming the directory that holds `exactl` and `exanetd`.
pub const BIN_DIR_ENV: &str = "EXANET_BIN_DIR";

/// `$EXANET_BIN_DIR`, else `target/<profile>/` (the test runs from `target/<profile>/deps/`).
pub fn bin_dir() -> PathBuf {
    if let Some(v) = std::env::var_os(BIN_DIR_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe
        .parent()
        .expect("test executable has a directory")
        .to_path_buf();
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().unwrap().to_path_buf()
    } else {
        deps
    }
}

/// The binary `name` of this build, or a panic saying how to build it.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} not found: build it first with the same profile (`cargo build -p exactl -p exanetd`, \
         add --release for release tests) or set {BIN_DIR_ENV}",
        p.display()
    );
    p
}

/// This build's `libexanet.a`: `cargo test` builds it into deps/, `cargo build` also
/// copies it up; the newer of the two.
pub fn exanet_lib() -> PathBuf {
    let dir = bin_dir();
    let candidates = [
        dir.join("deps").join("libexanet.a"),
        dir.join("libexanet.a"),
    ];
    candidates
        .iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .cloned()
        .unwrap_or_else(|| panic!("libexanet.a not found in {} or its deps/", dir.display()))
}

/// A scratch directory, removed when dropped (when the test ends, failed or not).
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles the C program `src` against `include/exanet.h` and this build's static
/// library into `exe`, with `flags` (standard, warnings...) before the sources; (success,
/// compiler output).
pub fn compile_c(src: &Path, exe: &Path, flags: &[&str]) -> (bool, String) {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "gcc".into()));
    cc.args(flags)
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(src)
        .arg(exanet_lib())
        // What the Rust standard library in libexanet.a needs from the system.
        .args([
            "-lpthread",
            "-ldl",
            "-lm",
            "-lrt",
            "-lutil",
            "-lgcc_s",
            "-o",
        ])
        .arg(exe);
    let (ok, out, err) = run(cc, Duration::from_secs(120));
    (ok, format!("{out}{err}"))
}

/// Runs `cmd` to completion with a time limit; (success, stdout, stderr).
pub fn run(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{shown} did not finish within {limit:?}\n--- stdout:\n{}\n--- stderr:\n{}",
                out.join().unwrap(),
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.success(), out.join().unwrap(), err.join().unwrap())
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut s);
        }
        s
    })
}

/// A rack in a scratch directory; `exactl rack down` and removal on drop.
pub struct Rack {
    pub dir: PathBuf,
    exactl: PathBuf,
    exanetd: PathBuf,
}

impl Rack {
    /// Starts a rack of `shape` (e.g. "2x1x1").
    pub fn up(tag: &str, shape: &str) -> Rack {
        static N: AtomicU32 = AtomicU32::new(0);
        // Short: Unix socket paths under it must stay below 108 bytes.
        let dir = std::env::temp_dir().join(format!(
            "xn-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let rack = Rack {
            dir,
            exactl: bin("exactl"),
            exanetd: bin("exanetd"),
        };
        let (ok, out, err) = run(
            rack.exactl(&["rack", "up", "--shape", shape, "--timeout", "90"]),
            Duration::from_secs(120),
        );
        assert!(ok, "exactl rack up --shape {shape} failed:\n{out}\n{err}");
        rack
    }

    /// Stops the rack, appends `toml` to its rack file and starts it again.
    pub fn restart_with(&self, toml: &str) {
        let (ok, out, err) = run(
            self.exactl(&["rack", "down", "--timeout", "10"]),
            Duration::from_secs(60),
        );
        assert!(ok, "exactl rack down failed:\n{out}\n{err}");
        let path = self.dir.join("rack.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(toml);
        std::fs::write(&path, text).unwrap();
        let (ok, out, err) = run(
            self.exactl(&["rack", "up", "--timeout", "90"]),
            Duration::from_secs(120),
        );
        assert!(ok, "exactl rack up (again) failed:\n{out}\n{err}");
    }

    /// `exactl link set A B ARGS...` on this rack (faults on the link between two nodes,
    /// both directions), which must succeed.
    pub fn link_set(&self, a: &str, b: &str, args: &[&str]) {
        let mut all = vec!["link", "set", a, b];
        all.extend_from_slice(args);
        let (ok, out, err) = run(self.exactl(&all), Duration::from_secs(30));
        assert!(ok, "exactl link set {a} {b} {args:?} failed:\n{out}\n{err}");
    }

    pub fn exactl(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.exactl);
        c.arg("--rack")
            .arg(&self.dir)
            .args(args)
            .env("EXANET_DAEMON", &self.exanetd)
            // These tests are about the NI API, not IP over ExaNet.
            .env("EXANET_RACK_IP", "off")
            .env_remove("EXANET_RACK");
        c
    }

    /// A command attached to `node` of this rack through the environment.
    pub fn workload(&self, program: &Path, node: &str) -> Command {
        let mut c = Command::new(program);
        c.env("EXANET_RACK", &self.dir)
            .env("EXANET_NODE", node)
            .env_remove("EXANET_JOB_KEY");
        c
    }

    /// The last lines of every daemon log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let Ok(rd) = std::fs::read_dir(self.dir.join("logs")) else {
            return out;
        };
        for e in rd.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {}\n", e.path().display()));
            for l in &lines[lines.len().saturating_sub(20)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Rack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("rack {} at failure:\n{}", self.dir.display(), self.logs());
        }
        let _ = run(
            self.exactl(&["rack", "down", "--timeout", "10"]),
            Duration::from_secs(60),
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub stdout: Option<BufReader<ChildStdout>>,
    pub stderr: Option<std::thread::JoinHandle<String>>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
        let stdout = child.stdout.take().map(BufReader::new);
        let stderr = Some(drain(child.stderr.take()));
        Proc {
            child,
            stdout,
            stderr,
        }
    }

    /// Reads stdout lines until one contains `prefix`; returns the line from `prefix` on
    /// (panics at EOF or after `limit`).
    pub fn wait_line(&mut self, prefix: &str, limit: Duration) -> String {
        let mut out = self.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let prefix_owned = prefix.to_string();
        std::thread::spawn(move || {
            let mut line = String::new();
            loop {
                line.clear();
                match out.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(None);
                        return;
                    }
                    Ok(_) if line.contains(&prefix_owned) => {
                        let at = line.find(&prefix_owned).unwrap_or(0);
                        let _ = tx.send(Some((line[at..].trim_end().to_string(), out)));
                        return;
                    }
                    Ok(_) => {}
                }
            }
        });
        match rx.recv_timeout(limit) {
            Ok(Some((line, out))) => {
                self.stdout = Some(out);
                line
            }
            Ok(None) => panic!(
                "the process ended without printing {prefix:?}; stderr:\n{}",
                self.finish_stderr()
            ),
            Err(_) => panic!("no {prefix:?} line within {limit:?}"),
        }
    }

    /// Waits for the process to exit (killing it after `limit`); (success, stdout rest, stderr).
    pub fn finish(mut self, limit: Duration) -> (bool, String, String) {
        let out = drain(self.stdout.take());
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break Some(st);
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = self.finish_stderr();
        let out = out.join().unwrap();
        match status {
            Some(st) => (st.success(), out, err),
            None => panic!("process did not finish within {limit:?}\n{out}\n{err}"),
        }
    }

    fn finish_stderr(&mut self) -> String {
        self.stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
