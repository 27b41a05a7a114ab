//! `exactl rack prometheus`: Debian's prometheus against a local rack, with its consoles.
//!
//! ```text
//! <rack>/prometheus/prometheus.yml       scrape configuration: every node's metrics address
//! <rack>/prometheus/consoles/            the rack view, link and node pages (exanet-deploy)
//! <rack>/prometheus/console_libraries/
//! <rack>/prometheus/data/                Prometheus' storage
//! <rack>/prometheus/prometheus.pid       pid, listen address and binary of the running one
//! <rack>/logs/prometheus.log             its output
//! ```
//!
//! Prometheus runs in a process group of its own (so a Ctrl-C at the terminal that started
//! it does not stop it) until `--stop` or `exactl rack down`. It is recognised by its
//! command line naming this rack's data directory, so a recycled pid is never signalled.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use exanet_control::rack::{Layout, Rack};
use exanet_deploy::{compose, consoles};

use crate::error::{CliError, Result};
use crate::process;

/// Environment variable naming the prometheus binary.
pub const PROMETHEUS_ENV: &str = "EXANET_PROMETHEUS";
const PROMETHEUS_NAME: &str = "prometheus";
/// Shortest and longest scrape interval accepted: below 100 ms Prometheus' own work
/// dominates a 128-node rack; above 10 min `rate()` over the pages' windows has no data.
const MIN_INTERVAL_NS: u64 = 100_000_000;
const MAX_INTERVAL_NS: u64 = 600_000_000_000;
/// How often to ask a starting Prometheus whether it is ready.
const READY_POLL: Duration = Duration::from_millis(100);
/// Log lines shown when Prometheus does not come up.
const LOG_TAIL_LINES: usize = 12;

#[derive(Debug, Args)]
pub struct PrometheusArgs {
    /// How often Prometheus scrapes every daemon (e.g. 1s, 500ms, 1m)
    #[arg(long, value_name = "DURATION", default_value = "5s")]
    scrape_interval: String,
    /// Address Prometheus serves its pages on [default: a free port on 127.0.0.1]
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// The prometheus binary [default: $EXANET_PROMETHEUS, else prometheus on PATH]
    #[arg(long, value_name = "PATH")]
    prometheus: Option<PathBuf>,
    /// How long to wait for Prometheus to be ready, seconds
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
    /// Stop the rack's Prometheus instead of starting it
    #[arg(long, conflicts_with_all = ["listen", "prometheus"])]
    stop: bool,
}

/// Where the rack's Prometheus keeps its files.
struct Paths {
    dir: PathBuf,
    config: PathBuf,
    data: PathBuf,
    pid: PathBuf,
    log: PathBuf,
}

impl Paths {
    /// Absolute, since they end up on Prometheus' command line and identify it there.
    fn new(rack_dir: &Path) -> Result<Paths> {
        let rack_dir =
            std::path::absolute(rack_dir).map_err(|e| CliError::io("resolve", rack_dir, e))?;
        let dir = rack_dir.join("prometheus");
        Ok(Paths {
            config: dir.join("prometheus.yml"),
            data: dir.join("data"),
            pid: dir.join("prometheus.pid"),
            log: Layout::new(&rack_dir).log_file(&PROMETHEUS_NAME),
            dir,
        })
    }

    /// The `--storage.tsdb.path` argument, which tells this rack's Prometheus from others.
    fn data_flag(&self) -> String {
        format!("--storage.tsdb.path={}", self.data.display())
    }
}

/// What the pid file says of a running Prometheus.
#[derive(Debug, Clone)]
struct Running {
    pid: i32,
    listen: String,
}

pub fn run(dir: &Path, a: PrometheusArgs) -> Result<()> {
    let paths = Paths::new(dir)?;
    if a.stop {
        match stop(dir, Duration::from_secs(a.timeout.max(1)))? {
            Some(pid) => crate::stdout::outln!("stopped the rack's prometheus (pid {pid})"),
            None => {
                crate::stdout::outln!("no prometheus of the rack at {} is running", dir.display())
            }
        }
        return Ok(());
    }
    let interval = scrape_interval(&a.scrape_interval)?;
    let listen = match &a.listen {
        Some(l) => l.parse::<SocketAddr>().map_err(|_| CliError::BadValue {
            what: "--listen",
            value: l.clone(),
            message: "is not an address such as 127.0.0.1:9090".into(),
        })?,
        None => free_loopback_port()?,
    };
    let rack = Rack::load(dir)?;
    if let Some(r) = running(&paths) {
        crate::stdout::outln!(
            "the rack's prometheus is already running (pid {}): {}\n\
             (`exactl rack prometheus --stop` stops it, to start it with other settings)",
            r.pid,
            rack_url(&r.listen)
        );
        return Ok(());
    }
    let binary = prometheus_binary(a.prometheus.as_deref())?;

    // Files first: a Prometheus that cannot start leaves them for a look.
    let shape = rack.shape();
    let targets: Vec<String> = shape
        .node_ids()
        .map(|id| rack.entry(id).metrics.clone())
        .collect();
    let name = rack.file.name.clone();
    let mut files = vec![exanet_deploy::GenFile::new(
        "prometheus.yml",
        compose::prometheus_config(&name, &targets, &interval, "exactl rack prometheus"),
    )];
    files.extend(consoles::files(shape, &name));
    exanet_deploy::write_files(&paths.dir, &files)?;
    for d in [&paths.data, &Layout::new(dir).log_dir()] {
        std::fs::create_dir_all(d).map_err(|e| CliError::io("create the directory", d, e))?;
    }

    let mut child = spawn(&binary, &paths, listen)?;
    let pid = child.id() as i32;
    std::fs::write(
        &paths.pid,
        format!("{pid}\n{listen}\n{}\n", binary.display()),
    )
    .map_err(|e| CliError::io("write the pid file", &paths.pid, e))?;

    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let addr = listen.to_string();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let _ = process::remove_if_present(&paths.pid);
            return Err(CliError::Failed(format!(
                "{} exited ({status}) before it was ready; the end of {}:\n{}",
                binary.display(),
                paths.log.display(),
                process::tail_of(&paths.log, LOG_TAIL_LINES)
            )));
        }
        if http_status(&addr, "/-/ready", READY_POLL * 5) == Some(200) {
            break;
        }
        if Instant::now() >= deadline {
            let _ = process::signal(pid, libc::SIGKILL);
            let _ = child.wait();
            let _ = process::remove_if_present(&paths.pid);
            return Err(CliError::Failed(format!(
                "{} did not answer {addr}/-/ready within {} s and was stopped; the end of {}:\n{}",
                binary.display(),
                a.timeout,
                paths.log.display(),
                process::tail_of(&paths.log, LOG_TAIL_LINES)
            )));
        }
        std::thread::sleep(READY_POLL);
    }
    crate::stdout::outln!(
        "prometheus (pid {pid}) scrapes the {} daemons of rack {name:?} every {interval}; log {}\n\
         rack view: {}",
        targets.len(),
        paths.log.display(),
        rack_url(&addr)
    );
    Ok(())
}

/// Stops the rack's Prometheus, if it runs: SIGTERM, then SIGKILL after `timeout`. Its
/// pid, or `None` when none was running. `exactl rack down` calls it too.
pub fn stop(dir: &Path, timeout: Duration) -> Result<Option<i32>> {
    let paths = Paths::new(dir)?;
    let Some(r) = running(&paths) else {
        // A pid file of a Prometheus that is gone says nothing any more.
        let _ = process::remove_if_present(&paths.pid);
        return Ok(None);
    };
    process::signal(r.pid, libc::SIGTERM)
        .map_err(|e| CliError::Failed(format!("cannot stop prometheus (pid {}): {e}", r.pid)))?;
    let deadline = Instant::now() + timeout;
    while is_ours(r.pid, &paths) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if is_ours(r.pid, &paths) {
        let _ = process::signal(r.pid, libc::SIGKILL);
        let until = Instant::now() + Duration::from_secs(3);
        while is_ours(r.pid, &paths) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        if is_ours(r.pid, &paths) {
            return Err(CliError::Failed(format!(
                "prometheus (pid {}) of the rack at {} did not stop even after SIGKILL",
                r.pid,
                dir.display()
            )));
        }
    }
    process::remove_if_present(&paths.pid)
        .map_err(|e| CliError::io("remove the pid file", &paths.pid, e))?;
    Ok(Some(r.pid))
}

/// The rack view's address on a Prometheus serving at `addr`.
fn rack_url(addr: &str) -> String {
    format!("http://{addr}/consoles/{}", consoles::RACK_PAGE)
}

/// The running Prometheus of the rack, from its pid file, if the process behind it is it.
fn running(paths: &Paths) -> Option<Running> {
    let text = std::fs::read_to_string(&paths.pid).ok()?;
    let mut lines = text.lines();
    let pid: i32 = lines.next()?.trim().parse().ok()?;
    let listen = lines.next().unwrap_or("").trim().to_string();
    (pid > 1 && is_ours(pid, paths)).then_some(Running { pid, listen })
}

/// True when `pid` is alive and its command line names this rack's data directory.
fn is_ours(pid: i32, paths: &Paths) -> bool {
    if !process::is_alive(pid) {
        return false;
    }
    let flag = paths.data_flag();
    process::cmdline(pid).is_some_and(|args| args.iter().any(|a| *a == *flag))
}

/// The scrape interval as Prometheus writes durations (`1s`, `500ms`).
fn scrape_interval(text: &str) -> Result<String> {
    let bad = |message: String| CliError::BadValue {
        what: "--scrape-interval",
        value: text.to_string(),
        message,
    };
    let ns = crate::units::parse_duration(text).map_err(bad)?;
    if !(MIN_INTERVAL_NS..=MAX_INTERVAL_NS).contains(&ns) {
        return Err(bad("must be 100ms to 10m".into()));
    }
    if ns % 1_000_000 != 0 {
        return Err(bad("must be whole milliseconds".into()));
    }
    Ok(if ns % 1_000_000_000 == 0 {
        format!("{}s", ns / 1_000_000_000)
    } else {
        format!("{}ms", ns / 1_000_000)
    })
}

/// A port on 127.0.0.1 nobody listens on now. Prometheus takes no port 0, so this is
/// asked of the kernel first; the port could be taken in between, which Prometheus then
/// reports and this command shows.
fn free_loopback_port() -> Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(CliError::Ports)
}

/// `--prometheus`, else `$EXANET_PROMETHEUS`, else `prometheus` on PATH.
fn prometheus_binary(flag: Option<&Path>) -> Result<PathBuf> {
    let install = "install it with `apt-get install prometheus`";
    if let Some(p) = flag {
        return executable(p).ok_or_else(|| {
            CliError::DaemonNotFound(format!(
                "prometheus: --prometheus {} is not an executable file ({install})",
                p.display()
            ))
        });
    }
    if let Some(v) = std::env::var_os(PROMETHEUS_ENV).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        return executable(&p).ok_or_else(|| {
            CliError::DaemonNotFound(format!(
                "prometheus: {PROMETHEUS_ENV}={} is not an executable file ({install})",
                p.display()
            ))
        });
    }
    process::on_path(PROMETHEUS_NAME)
        .and_then(|p| std::path::absolute(p).ok())
        .ok_or_else(|| {
            CliError::DaemonNotFound(format!(
                "prometheus: none on PATH; {install}, or name the binary with --prometheus \
                 PATH or {PROMETHEUS_ENV}"
            ))
        })
}

/// `p`, made absolute, when it is an executable file.
fn executable(p: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(p).ok()?;
    (m.is_file() && m.permissions().mode() & 0o111 != 0)
        .then(|| std::path::absolute(p).ok())
        .flatten()
}

/// Starts Prometheus in the background, its output appended to its log.
fn spawn(binary: &Path, paths: &Paths, listen: SocketAddr) -> Result<std::process::Child> {
    let (log, log2) =
        crate::process::open_log(&paths.log, &format!("{} on {listen}", binary.display()))?;
    let mut cmd = Command::new(binary);
    cmd.arg(format!("--config.file={}", paths.config.display()))
        .arg(paths.data_flag())
        .arg(format!("--web.listen-address={listen}"))
        .arg(format!(
            "--web.console.templates={}",
            paths.dir.join(consoles::CONSOLE_DIR).display()
        ))
        .arg(format!(
            "--web.console.libraries={}",
            paths.dir.join(consoles::LIBRARY_DIR).display()
        ))
        .current_dir(&paths.dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: the terminal's Ctrl-C is for the command, not for the
        // Prometheus it leaves running.
        .process_group(0);
    cmd.spawn().map_err(|source| CliError::Spawn {
        node: "the rack view".into(),
        binary: binary.to_path_buf(),
        source,
    })
}

/// The status code of `GET path` on `addr`, or `None` when it does not answer in time.
fn http_status(addr: &str, path: &str, timeout: Duration) -> Option<u16> {
    let sa: SocketAddr = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sa, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    // HTTP/1.0: the server closes after its answer.
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrape_intervals_are_prometheus_durations() {
        assert_eq!(scrape_interval("1s").unwrap(), "1s");
        assert_eq!(scrape_interval("500ms").unwrap(), "500ms");
        assert_eq!(scrape_interval("1.5s").unwrap(), "1500ms");
        assert_eq!(scrape_interval("2m").unwrap(), "120s");
        for bad in ["1", "10ms", "11m", "1.5ms", "soon"] {
            let e = scrape_interval(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::EXIT_USAGE, "{bad}: {e}");
            assert!(e.to_string().starts_with("--scrape-interval"), "{e}");
        }
    }

    #[test]
    fn a_missing_binary_says_how_to_install_it() {
        let e = prometheus_binary(Some(Path::new("/nonexistent/prometheus"))).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("apt-get install prometheus"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }

    #[test]
    fn only_this_racks_prometheus_is_recognised() {
        let dir = std::env::temp_dir().join(format!("exactl-prom-{}", std::process::id()));
        let paths = Paths::new(&dir).unwrap();
        assert!(paths.data.is_absolute());
        // This process is alive but is no Prometheus of the rack.
        assert!(!is_ours(std::process::id() as i32, &paths));
        std::fs::create_dir_all(&paths.dir).unwrap();
        std::fs::write(&paths.pid, format!("{}\n127.0.0.1:1\n", std::process::id())).unwrap();
        assert!(running(&paths).is_none());
        // Nothing of ours runs: stop says so and drops the stale pid file.
        assert_eq!(stop(&dir, Duration::from_secs(1)).unwrap(), None);
        assert!(!paths.pid.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
