//! Cross-crate and end-to-end tests live in tests/; this library holds what the end-to-end
//! tests share: finding the `exactl` and `exanetd` binaries, running `exactl` against a
//! scratch rack directory with a time limit, a guard that always takes the rack down, a
//! plain HTTP GET, and a scan of /proc for processes that belong to a rack; and
//! ([`require`]) how a test that needs root or a tool skips, or fails when its
//! `EXANET_REQUIRE_*` variable says it must run.

#![forbid(unsafe_code)]

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub mod require;
pub use require::{
    ip_missing, is_root, mpich_ofi_or_skip, on_path, required, runs, skip_unless_required,
    skip_without_ip, SystemUser,
};

/// Environment variable naming the directory that holds `exactl` and `exanetd`.
pub const BIN_DIR_ENV: &str = "EXANET_BIN_DIR";

/// The binaries an end-to-end test drives.
#[derive(Clone, Debug)]
pub struct Bins {
    pub exactl: PathBuf,
    pub exanetd: PathBuf,
}

/// The directory the binaries are taken from: `$EXANET_BIN_DIR`, else the cargo target
/// directory of the current profile (`target/<profile>/`: the test binary itself runs from
/// `target/<profile>/deps/`).
pub fn bin_dir() -> Result<PathBuf, String> {
    if let Some(v) = std::env::var_os(BIN_DIR_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(v));
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the test executable to locate the binaries: {e}"))?;
    let deps = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    // target/<profile>/deps/<test> -> target/<profile>; a test run from elsewhere (copied
    // out of the target directory) looks next to itself.
    let dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().unwrap_or(deps)
    } else {
        deps
    };
    Ok(dir.to_path_buf())
}

/// Writes the C source `src` to `dir/name.c` and compiles it with `cc` and `flags` into
/// `dir/name`; a failed compile fails the test with the compiler's message. The flags
/// follow the source, so that libraries (`-lfabric`) come after what uses them.
pub fn compile_c(cc: &str, dir: &Path, name: &str, src: &str, flags: &[&str]) -> PathBuf {
    let file = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&file, src).unwrap();
    let out = Command::new(cc)
        .arg("-o")
        .arg(&exe)
        .arg(&file)
        .args(flags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The libfabric provider of this build, as `exactl mpirun` picks it: beside the binaries
/// (`cargo build`) or in `deps/` (`cargo test` builds it there and does not copy it up);
/// the newer when both exist. `None` when neither is built.
pub fn provider_lib() -> Option<PathBuf> {
    let dir = bin_dir().ok()?;
    [
        dir.join("libexanet_fi.so"),
        dir.join("deps").join("libexanet_fi.so"),
    ]
    .into_iter()
    .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
    .max_by_key(|(modified, _)| *modified)
    .map(|(_, p)| p)
}

/// `EXANET_REQUIRE_*` of the tests that load the provider into libfabric.
pub const REQUIRE_LIBFABRIC: &str = "EXANET_REQUIRE_LIBFABRIC";

/// A directory under `tmp` holding this build's provider under the name libfabric loads
/// from `FI_PROVIDER_PATH` (`lib<name>-fi.so`), or `None` (`test` skipped, unless
/// [`REQUIRE_LIBFABRIC`] is set) without libfabric's `fi_info` and headers.
pub fn provider_dir(tmp: &Path, test: &str) -> Option<PathBuf> {
    if !runs("fi_info", "--version") || !Path::new("/usr/include/rdma/fabric.h").exists() {
        skip_unless_required(
            REQUIRE_LIBFABRIC,
            test,
            "no fi_info or libfabric headers (Debian: apt-get install libfabric-bin libfabric-dev)",
        );
        return None;
    }
    let lib = provider_lib().unwrap_or_else(|| {
        panic!(
            "libexanet_fi.so is not built in {} (nor in its deps/): run `cargo test --workspace`",
            bin_dir().unwrap().display()
        )
    });
    let dir = tmp.join("fi");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&lib, dir.join("libexanet-fi.so")).unwrap();
    Some(dir)
}

/// [`compile_c`] for a libfabric program (`$CC`, else gcc; warnings are errors), with
/// `libs` after libfabric.
pub fn compile_fabric_c(dir: &Path, name: &str, src: &str, libs: &[&str]) -> PathBuf {
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let mut flags = vec!["-std=gnu11", "-O1", "-Wall", "-Werror", "-lfabric"];
    flags.extend_from_slice(libs);
    compile_c(&cc, dir, name, src, &flags)
}

/// Finds `exactl` and `exanetd`, or says how to build them.
pub fn find_bins() -> Result<Bins, String> {
    let dir = bin_dir()?;
    let find = |name: &str| -> Result<PathBuf, String> {
        let p = dir.join(name);
        if is_executable(&p) {
            return Ok(p);
        }
        let from = if std::env::var_os(BIN_DIR_ENV).is_some_and(|v| !v.is_empty()) {
            format!("{BIN_DIR_ENV}={}", dir.display())
        } else {
            format!("the cargo target directory of this test, {}", dir.display())
        };
        Err(format!(
            "{name} not found at {} ({from}): run `cargo build --workspace` (or `cargo build \
             -p exactl -p exanetd`) with the same profile first, or set {BIN_DIR_ENV} to the \
             directory holding exactl and exanetd",
            p.display()
        ))
    };
    Ok(Bins {
        exactl: find("exactl")?,
        exanetd: find("exanetd")?,
    })
}

/// [`find_bins`], panicking with its message.
#[track_caller]
pub fn bins() -> Bins {
    find_bins().unwrap_or_else(|e| panic!("{e}"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The command, its exit status, and both of its outputs, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "{} after {:.1} s\n--- stdout:\n{}\n--- stderr:\n{}",
            self.status,
            self.elapsed.as_secs_f64(),
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }

    /// stdout parsed as one JSON value.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.describe()))
    }
}

/// How long after the process exits its pipes may stay open (nothing should hold them:
/// a daemon that inherited one would keep a test harness waiting forever).
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// Runs `cmd` with stdin from /dev/null and stdout/stderr captured, killing it after
/// `timeout`. Errors: it could not start, it ran out of time (it is killed; what it printed
/// is in the message), or its output pipes stayed open after it exited.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Result<Run, String> {
    let shown = format!("{cmd:?}");
    let start = Instant::now();
    use std::os::unix::process::CommandExt;
    // A group of its own, so that a command that does not finish is killed with what it
    // started (mpirun and its daemons under `exactl mpirun`, say), not only itself.
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    let (tx, rx) = mpsc::channel::<()>();
    let collect = |pipe: Option<Box<dyn Read + Send>>| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut pipe) = pipe {
            let (buf, tx) = (buf.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                loop {
                    match pipe.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.lock().unwrap().extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tx.send(());
            });
        } else {
            let _ = tx.send(());
        }
        buf
    };
    let out = collect(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = collect(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    drop(tx);
    let text = |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().unwrap()).into_owned();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() >= timeout => {
                // The group is the child's own.
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{shown} did not finish within {:.0} s and was killed\n--- stdout:\n{}\n--- stderr:\n{}",
                    timeout.as_secs_f64(),
                    text(&out).trim_end(),
                    text(&err).trim_end()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("cannot wait for {shown}: {e}")),
        }
    };
    let elapsed = start.elapsed();
    let pipes_closed = Instant::now() + PIPE_GRACE;
    for _ in 0..2 {
        let left = pipes_closed.saturating_duration_since(Instant::now());
        if rx.recv_timeout(left).is_err() {
            return Err(format!(
                "{shown} exited ({status}) but its stdout/stderr stayed open for {} s: \
                 a process it started inherited them\n--- stdout:\n{}\n--- stderr:\n{}",
                PIPE_GRACE.as_secs(),
                text(&out).trim_end(),
                text(&err).trim_end()
            ));
        }
    }
    Ok(Run {
        status,
        stdout: text(&out),
        stderr: text(&err),
        elapsed,
    })
}

/// A child process killed (and reaped) when the test is done with it, also by a panic: a
/// server the test started.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch rack directory under the system temp directory, unique to this process and
/// call. Dropping it runs `exactl rack down` (whatever state the rack is in) and removes
/// the directory; when the test is failing, the tail of every daemon log is printed first
/// (set `EXANET_E2E_KEEP=1` to keep the directory as well).
pub struct TestRack {
    pub dir: PathBuf,
    pub bins: Bins,
}

/// Time any one `exactl` command other than `rack up`/`rack down` may take.
pub const EXACTL_TIMEOUT: Duration = Duration::from_secs(60);

impl TestRack {
    /// A fresh, not yet existing directory `exanet-e2e-<tag>-<pid>-<n>` (short enough for
    /// the Unix socket paths under it).
    pub fn new(tag: &str) -> TestRack {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("exanet-e2e-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TestRack { dir, bins: bins() }
    }

    /// The `exactl --rack DIR ARGS...` command, with the daemon binary pinned to the
    /// `exanetd` beside it and no `EXANET_RACK` from the environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bins.exactl);
        c.arg("--rack")
            .arg(&self.dir)
            .args(args)
            .env("EXANET_DAEMON", &self.bins.exanetd)
            .env("EXANET_IP", self.bins.exanetd.with_file_name("exanet-ip"))
            // Test racks run without IP over ExaNet unless a test asks for it: the
            // services and namespaces are what the IP tests are about, not the others.
            .env("EXANET_RACK_IP", "off")
            .env_remove("EXANET_RACK");
        c
    }

    /// Runs `exactl --rack DIR ARGS...` with a time limit, panicking if it cannot run or
    /// does not finish (its exit status is the caller's to check).
    #[track_caller]
    pub fn exactl_timeout(&self, args: &[&str], timeout: Duration) -> Run {
        run_with_timeout(self.command(args), timeout).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A workload attached to `node` of this rack for a network measurement: its own host
    /// time between calls is not modeled (`compute_scale` 0).
    #[track_caller]
    pub fn attach_unscaled(&self, node: &str) -> exanet::Endpoint {
        exanet::Endpoint::attach_with(&exanet::Config {
            rack_dir: Some(self.dir.clone()),
            node: Some(node.into()),
            compute_scale_ppm: Some(0),
            ..exanet::Config::default()
        })
        .unwrap_or_else(|e| panic!("attach to {node}: {e}"))
    }

    /// [`TestRack::exactl_timeout`] with [`EXACTL_TIMEOUT`].
    #[track_caller]
    pub fn exactl(&self, args: &[&str]) -> Run {
        self.exactl_timeout(args, EXACTL_TIMEOUT)
    }

    /// `exactl rack up --shape SHAPE --timeout SECS`, asserting exit 0.
    #[track_caller]
    pub fn up(&self, shape: &str, timeout_secs: u64) -> Run {
        let secs = timeout_secs.to_string();
        let r = self.exactl_timeout(
            &["rack", "up", "--shape", shape, "--timeout", &secs],
            Duration::from_secs(timeout_secs + 30),
        );
        assert!(
            r.success(),
            "exactl rack up --shape {shape} failed: {}",
            r.describe()
        );
        r
    }

    /// `exactl rack down`, with a time limit.
    pub fn down(&self) -> Result<Run, String> {
        run_with_timeout(
            self.command(&["rack", "down", "--timeout", "10"]),
            Duration::from_secs(40),
        )
    }

    /// The sum over the rack's nodes (`exactl status --json`) of the count `pick` finds
    /// in each node's status (0 where there is none).
    pub fn nodes_sum(&self, pick: impl Fn(&serde_json::Value) -> &serde_json::Value) -> u64 {
        let st = self.exactl(&["status", "--json"]);
        assert!(st.success(), "{}", st.describe());
        let v: serde_json::Value = serde_json::from_str(&st.stdout).unwrap();
        v["nodes"]
            .as_array()
            .expect("nodes in the status")
            .iter()
            .map(|n| pick(n).as_u64().unwrap_or(0))
            .sum()
    }

    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// The `metrics = "host:port"` of `[nodes.NODE]` in the rack file.
    #[track_caller]
    pub fn metrics_addr(&self, node: &str) -> String {
        let path = self.dir.join("rack.toml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let v: toml::Value = text
            .parse()
            .unwrap_or_else(|e| panic!("{} is not TOML: {e}", path.display()));
        v.get("nodes")
            .and_then(|n| n.get(node))
            .and_then(|n| n.get("metrics"))
            .and_then(toml::Value::as_str)
            .unwrap_or_else(|| {
                panic!(
                    "{} has no [nodes.{node}] metrics = \"host:port\":\n{text}",
                    path.display()
                )
            })
            .to_string()
    }

    /// Processes of this rack still running: see [`processes_mentioning`].
    pub fn processes(&self) -> Vec<Proc> {
        let mut needles = vec![self.dir.to_string_lossy().into_owned()];
        if let Ok(c) = self.dir.canonicalize() {
            needles.push(c.to_string_lossy().into_owned());
        }
        processes_mentioning(&needles)
    }

    /// The last lines of every daemon log, for a failing test's output.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        let Ok(rd) = std::fs::read_dir(self.dir.join("logs")) else {
            return format!("(no logs in {})\n", self.dir.join("logs").display());
        };
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {}:\n", p.display()));
            for l in &all[all.len().saturating_sub(lines)..] {
                out.push_str(&format!("    {l}\n"));
            }
        }
        out
    }
}

impl Drop for TestRack {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        if failing && self.dir.exists() {
            eprintln!(
                "rack {} at failure:\n{}",
                self.dir.display(),
                self.log_tails(15)
            );
        }
        if self.dir.exists() {
            match self.down() {
                Ok(r) if r.success() => {}
                Ok(r) => eprintln!("cleanup: exactl rack down failed: {}", r.describe()),
                Err(e) => eprintln!("cleanup: exactl rack down: {e}"),
            }
            // Last resort, so that a broken `rack down` leaks no daemons: kill what still
            // runs exanetd for this (unique) rack directory.
            for p in self.processes() {
                if p.cmdline.contains("exanetd") && p.pid > 1 {
                    eprintln!("cleanup: killing leftover pid {}: {}", p.pid, p.cmdline);
                    // pid > 1 names one process, found by its command line naming this
                    // test's rack.
                    let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
                }
            }
        }
        if failing && std::env::var_os("EXANET_E2E_KEEP").is_some() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A process found in /proc.
#[derive(Clone, Debug)]
pub struct Proc {
    pub pid: i32,
    /// The command line, arguments separated by spaces.
    pub cmdline: String,
}

/// Live processes (zombies excluded: a daemon's parent may not be there to reap it) other
/// than this one whose command line contains one of `needles`.
pub fn processes_mentioning(needles: &[String]) -> Vec<Proc> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw)
            .trim_end_matches('\0')
            .replace('\0', " ");
        if !needles.iter().any(|n| mentions(&cmdline, n)) {
            continue;
        }
        let state = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
            });
        match state.as_deref() {
            // Gone, or a zombie: not running.
            None | Some("Z") | Some("X") | Some("x") => continue,
            _ => out.push(Proc { pid, cmdline }),
        }
    }
    out
}

/// True when `path` occurs in `cmdline` as a whole path or a directory of one: followed by
/// the end, a space (argument separator) or `/`, so that `/tmp/r-1` does not match `/tmp/r-10`.
fn mentions(cmdline: &str, path: &str) -> bool {
    !path.is_empty()
        && cmdline.match_indices(path).any(|(i, _)| {
            matches!(
                cmdline[i + path.len()..].chars().next(),
                None | Some(' ' | '/')
            )
        })
}

/// An HTTP response: status code and body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// A plain HTTP/1.0 `GET path` to `addr` (`host:port`), reading until the server closes:
/// HTTP/1.0 so that no server chunks the answer (Go's chunk HTTP/1.1 answers of unknown
/// length, such as Prometheus's console pages).
pub fn http_get(addr: &str, path: &str, timeout: Duration) -> Result<HttpResponse, String> {
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| format!("bad address {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&sa, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes())
        .map_err(|e| format!("cannot send GET {path} to {addr}: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("GET {path} from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {path} from {addr}: no end of headers in {text:?}"))?;
    let status_line = head.lines().next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("GET {path} from {addr}: bad status line {status_line:?}"))?;
    Ok(HttpResponse {
        status,
        body: body.to_string(),
    })
}

/// One sample of the Prometheus text format: `name{k="v",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of the Prometheus text exposition format (comments and lines that do not
/// parse are skipped; label values with escaped quotes are not needed here).
pub fn parse_prometheus(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let Some(close) = line[open..].find('}').map(|c| open + c) else {
                    continue;
                };
                let labels = line[open + 1..close]
                    .split(',')
                    .filter(|kv| !kv.is_empty())
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
                    })
                    .collect();
                (&line[..open], labels, &line[close + 1..])
            }
            None => match line.split_once(' ') {
                Some((n, r)) => (n, Vec::new(), r),
                None => continue,
            },
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

// --- Helpers of tests/tests/real_fabric.rs: one request to a daemon's control socket,
// a node's metrics, the RSS of a process.

impl TestRack {
    /// One JSON request on `run/<NODE>.sock` (the daemon's local control socket; requests
    /// and answers are documented in `exanet-control/src/control.rs`) and its one-line answer.
    /// A daemon that does not answer within `timeout` (e.g. one that is paused) is an error.
    pub fn control(
        &self,
        node: &str,
        request: &serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        use std::io::BufRead;
        let path = self.run_dir().join(format!("{node}.sock"));
        let mut s = std::os::unix::net::UnixStream::connect(&path)
            .map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
        s.set_read_timeout(Some(timeout))
            .and_then(|()| s.set_write_timeout(Some(timeout)))
            .map_err(|e| e.to_string())?;
        let mut line = request.to_string();
        line.push('\n');
        s.write_all(line.as_bytes())
            .map_err(|e| format!("cannot send {request} to {node}: {e}"))?;
        let mut answer = String::new();
        std::io::BufReader::new(s)
            .read_line(&mut answer)
            .map_err(|e| format!("no answer from {node} to {request}: {e}"))?;
        serde_json::from_str(&answer)
            .map_err(|e| format!("answer of {node} to {request} is not JSON ({e}): {answer:?}"))
    }

    /// `{"op":"status"}` of one node (its `NodeStatus`, with `"result":"status"`).
    pub fn node_status(&self, node: &str, timeout: Duration) -> Result<serde_json::Value, String> {
        let v = self.control(node, &serde_json::json!({"op": "status"}), timeout)?;
        if v["result"] != "status" {
            return Err(format!("{node} answered status with {v}"));
        }
        Ok(v)
    }

    /// The samples `node` exports at `/metrics` whose `node` label is `node`.
    pub fn node_metrics(&self, node: &str, timeout: Duration) -> Result<Vec<Sample>, String> {
        let r = http_get(&self.metrics_addr(node), "/metrics", timeout)?;
        if r.status != 200 {
            return Err(format!("GET /metrics of {node}: HTTP {}", r.status));
        }
        Ok(parse_prometheus(&r.body)
            .into_iter()
            .filter(|s| s.label("node") == Some(node))
            .collect())
    }

    /// The pid in `run/<NODE>.pid` (the local daemon of `node`), if there is one.
    pub fn daemon_pid(&self, node: &str) -> Option<i32> {
        let text = std::fs::read_to_string(self.run_dir().join(format!("{node}.pid"))).ok()?;
        text.split_whitespace().next()?.parse().ok()
    }
}

/// Sum of the values of `name` over the samples whose labels include all of `labels`.
pub fn metric_sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

/// Resident set size of process `pid` in KiB (`VmRSS` of /proc/PID/status).
pub fn rss_kib(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `len` bytes that differ with `seed` and along their length: data a test writes and
/// compares, where a shift, a stale copy or another transfer's bytes would show.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = i.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            (x ^ (x >> 8) ^ (x >> 19) ^ (x >> 31)) as u8
        })
        .collect()
}

/// The messages one test sends to one mailbox, each carrying its sequence number in its
/// first 8 bytes: what checks that every ACKed message is delivered, none twice, none
/// corrupt.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Messages sent, by sequence number: what any copy received must equal.
    pub sent: std::collections::HashMap<u64, Vec<u8>>,
    /// Messages whose send was ACKed: each must be delivered.
    pub acked: std::collections::HashSet<u64>,
    /// Messages delivered: each at most once.
    pub delivered: std::collections::HashSet<u64>,
}

/// What a run of operations came to: how many completed, how many failed and why, and how
/// many messages were received.
#[derive(Debug, Default)]
pub struct Tally {
    pub ok: u32,
    pub failed: std::collections::HashMap<String, u32>,
    pub received: u32,
}

impl Tally {
    pub fn failures(&self) -> u32 {
        self.failed.values().sum()
    }

    /// Counts a failed operation by its reason, which must be the network's verdict (a
    /// timeout or a NACK): any other error is a bug of the test or the library.
    #[track_caller]
    pub fn fail(&mut self, e: exanet::Error) {
        let why = match e {
            exanet::Error::Op {
                error: error @ (exanet::OpError::TimedOut | exanet::OpError::Nacked { .. }),
                ..
            } => error.to_string(),
            other => panic!("an operation failed for a reason other than the network's: {other}"),
        };
        *self.failed.entry(why).or_default() += 1;
    }
}

impl Ledger {
    /// Sends message `seq` (bytes drawn from `seed`) from `tx` to `to` and waits up to
    /// `wait` for its ACK, counting the outcome in `t`; an ACKed message must be delivered.
    pub fn send(
        &mut self,
        t: &mut Tally,
        ep: &exanet::Endpoint,
        tx: &exanet::Packetizer,
        to: exanet::Gvas,
        (seq, seed): (u64, u64),
        wait: Option<Duration>,
    ) {
        let p = self.message(seq, seed);
        let tag = tx
            .send(0, to, &p)
            .expect("a 64-byte message to a mailbox is valid");
        match ep.wait(tag, wait) {
            Ok(()) => {
                t.ok += 1;
                self.acked.insert(seq);
            }
            Err(e) => t.fail(e),
        }
    }

    /// A 64-byte message numbered `seq` (its bytes drawn from `seed`), recorded as sent.
    pub fn message(&mut self, seq: u64, seed: u64) -> Vec<u8> {
        let mut p = pattern(seed, 64);
        p[..8].copy_from_slice(&seq.to_le_bytes());
        self.sent.insert(seq, p.clone());
        p
    }

    /// Takes every message waiting in `inbox`, checking each against what was sent under
    /// its number; how many there were.
    #[track_caller]
    pub fn drain(&mut self, inbox: &exanet::Mailbox) -> u32 {
        let mut n = 0;
        while let Some(m) = inbox.try_recv().unwrap() {
            assert_eq!(m.payload.len(), 64, "a message arrived cut");
            let seq = u64::from_le_bytes(m.payload[..8].try_into().unwrap());
            let want = self
                .sent
                .get(&seq)
                .unwrap_or_else(|| panic!("a message arrived with a corrupt sequence number"));
            assert_eq!(&m.payload, want, "message {seq} arrived corrupt");
            assert!(
                self.delivered.insert(seq),
                "message {seq} was delivered twice"
            );
            n += 1;
        }
        n
    }

    /// Drains `inbox` until every message ACKed so far has been delivered, for at most
    /// `limit`: the destination queues a message before it answers, but its workload learns
    /// of it through its own daemon, so that takes a moment. How many were taken.
    #[track_caller]
    pub fn assert_acked_delivered(&mut self, inbox: &exanet::Mailbox, limit: Duration) -> u32 {
        let deadline = Instant::now() + limit;
        let mut n = 0;
        loop {
            n += self.drain(inbox);
            let missing: Vec<_> = self.acked.difference(&self.delivered).collect();
            if missing.is_empty() {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "messages ACKed but never delivered: {missing:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_non_empty_value_requires() {
        use std::ffi::OsStr;
        assert!(!require::requires(None));
        assert!(!require::requires(Some(OsStr::new(""))));
        for v in ["1", "yes", "0", "true"] {
            assert!(require::requires(Some(OsStr::new(v))), "{v:?}");
        }
    }

    // The only test that sets the variable, whose name nothing else reads.
    #[test]
    fn a_required_test_that_cannot_run_fails_and_an_unrequired_one_skips() {
        let var = "EXANET_REQUIRE_LIB_SELFTEST";
        std::env::remove_var(var);
        // Unset: the SKIPPED line, and the caller goes on to return.
        skip_unless_required(var, "selftest", "nothing is missing");
        std::env::set_var(var, "1");
        let e = std::panic::catch_unwind(|| skip_unless_required(var, "selftest", "no frob"))
            .expect_err("a required test that cannot run fails");
        std::env::remove_var(var);
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains(var) && msg.contains("selftest") && msg.contains("no frob"),
            "the failure names the variable, the test and the reason: {msg}"
        );
    }

    #[test]
    fn tools_and_root_are_probed() {
        assert!(runs("true", "--version"));
        // GNU false fails even for --version: a tool that is there but fails is not usable.
        assert!(!runs("false", "--version"));
        assert!(!runs("/nonexistent/exanet-no-such-tool", "--version"));
        assert_eq!(is_root(), nix::unistd::geteuid().is_root());
    }

    #[test]
    fn prometheus_samples_parse() {
        let text = "# HELP x y\n# TYPE exanet_link_cells_total counter\n\
                    exanet_link_cells_total{direction=\"tx\",kind=\"qfdb\",node=\"M1QAF1\",peer=\"M1QAF2\",port=\"f2\"} 12\n\
                    exanet_node_uptime_seconds{node=\"M1QAF1\"} 3.5\n\
                    plain 7\n";
        let s = parse_prometheus(text);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "exanet_link_cells_total");
        assert_eq!(s[0].label("peer"), Some("M1QAF2"));
        assert_eq!(s[0].label("direction"), Some("tx"));
        assert_eq!(s[0].value, 12.0);
        assert_eq!(s[1].value, 3.5);
        assert_eq!((s[2].name.as_str(), s[2].value), ("plain", 7.0));
    }

    #[test]
    fn commands_that_outlive_their_time_are_killed() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let e = run_with_timeout(c, Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("was killed"), "{e}");
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let r = run_with_timeout(c, Duration::from_secs(30)).unwrap();
        assert_eq!(
            (r.code(), r.stdout.as_str(), r.stderr.as_str()),
            (Some(3), "out\n", "err\n")
        );
    }

    #[test]
    fn a_path_is_mentioned_only_whole() {
        let c = "/t/exanetd --rack /tmp/r-1 --node M1QAF1";
        assert!(mentions(c, "/tmp/r-1"));
        assert!(mentions("/bin/x /tmp/r-1/rack.toml", "/tmp/r-1"));
        assert!(!mentions(
            "/t/exanetd --rack /tmp/r-10 --node M1QAF1",
            "/tmp/r-1"
        ));
        assert!(!mentions(c, ""));
    }

    #[test]
    fn this_process_is_never_listed() {
        let me = std::fs::read(format!("/proc/{}/cmdline", std::process::id())).unwrap();
        let first = String::from_utf8_lossy(me.split(|&b| b == 0).next().unwrap()).into_owned();
        // A child that mentions this test binary too: it is listed, this process is not
        // (with nobody else mentioning it, "never listed" would hold of an empty list).
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30; :", &first])
            .spawn()
            .unwrap();
        // The child shows once its exec is visible in /proc, which a loaded machine may
        // take a moment to get to; this process must be absent from every listing.
        let deadline = Instant::now() + Duration::from_secs(5);
        let listed = loop {
            let listed = processes_mentioning(std::slice::from_ref(&first));
            let pids: Vec<i32> = listed.iter().map(|p| p.pid).collect();
            assert!(!pids.contains(&(std::process::id() as i32)), "{listed:?}");
            if pids.contains(&(child.id() as i32)) || Instant::now() > deadline {
                break listed;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        let pids: Vec<i32> = listed.iter().map(|p| p.pid).collect();
        assert!(pids.contains(&(child.id() as i32)), "{listed:?}");
    }
}
