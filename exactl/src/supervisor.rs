//! The local rack's supervisor: a detached `exactl rack supervise` that `rack up` starts
//! with the IP services and `rack down` stops first. It does for a local rack what the
//! restart policies do for a compose rack (`restart: unless-stopped` on each `NODE-ip`
//! service): an IP service that dies while its daemon runs is started again.
//!
//! Every [`TICK`] it looks at each node: daemon alive and not paused (its pid file), IP
//! service gone (its pid file), nobody else starting or stopping it ([`ip_service::lock_node`],
//! which `exactl node` holds for as long as it works on the node). Then it starts the
//! service again in the node's namespace (made again if it is gone), holding the lock until
//! the service is ready, and counts the restart in `run/ip/NODE.restarts` (which `exactl
//! status` shows and the new service exports as `exanet_ip_restarts_total`). A start that
//! fails is tried again after 0.4 s, doubling to at most [`BACKOFF_MAX`].
//!
//! Daemons it restarts only on a rack brought up with `--restart unless-stopped` (the
//! policy of the compose racks' node containers and, as `Restart=on-failure`, of the
//! Ansible units): a daemon whose process is gone while its pid file stays died on its own
//! (exactl removes the file when it stops or kills one, as `docker kill` marks a container
//! stopped), and is started again, its IP service with it, counted in
//! `run/NODE.daemon-restarts` (the daemon exports `exanet_node_restarts_total`, status
//! shows it). By default (`--restart no`) a dead daemon is a fault someone injected (or
//! wants to see): `exactl status` shows it down until `exactl node restart`. Nor does it
//! restart a service whose daemon is down or paused: the service cannot attach to it, and
//! comes back with it.
//!
//! One per rack: it holds `run/supervisor/lock` (flock) while it runs, so a second exits at
//! once, and whether one runs is whether the lock is held. It leaves by itself when the
//! rack file or the rack's IP services are gone (a rack directory removed without `rack
//! down`).

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exanet_control::rack::{Layout, Rack};
use nix::fcntl::{Flock, FlockArg};

use crate::error::{CliError, Result};
use crate::ip_service::{self, Start};
use crate::process::{self, PidFile};

/// How often the supervisor looks at the nodes: with a service's start (tens of
/// milliseconds), what bounds how soon a dead service is back.
pub const TICK: Duration = Duration::from_millis(200);
/// Longest wait before starting a service that failed to start again.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a start under way is looked at.
const START_POLL: Duration = Duration::from_millis(10);
/// How long a service may take from its start to its ready file.
const START_TIMEOUT: Duration = Duration::from_secs(20);

fn dir(layout: &Layout) -> PathBuf {
    layout.run_dir().join("supervisor")
}

fn lock_path(layout: &Layout) -> PathBuf {
    dir(layout).join("lock")
}

fn pid_path(layout: &Layout) -> PathBuf {
    dir(layout).join("pid")
}

/// Present on a rack whose daemons are restarted when they die on their own.
fn restart_marker(layout: &Layout) -> PathBuf {
    layout.run_dir().join("restart-daemons")
}

/// Whether the rack's daemons are restarted when they die on their own
/// (`exactl rack up --restart unless-stopped`).
pub fn restarts_daemons(layout: &Layout) -> bool {
    restart_marker(layout).exists()
}

/// Records the rack's restart policy for its daemons (at `rack up`).
pub fn set_daemon_policy(layout: &Layout, restart: bool) -> Result<()> {
    let m = restart_marker(layout);
    if restart {
        std::fs::write(&m, "unless-stopped\n").map_err(|e| CliError::io("write", &m, e))
    } else {
        process::remove_if_present(&m).map_err(|e| CliError::io("remove", &m, e))
    }
}

/// `run/NODE.daemon-restarts`: the supervisor's restarts of a node's daemon, as
/// [`ip_service::restarts_at`] reads them.
pub fn daemon_restarts_file(layout: &Layout, node: &str) -> PathBuf {
    layout.run_dir().join(format!("{node}.daemon-restarts"))
}

fn log_path(layout: &Layout) -> PathBuf {
    layout.log_dir().join("supervisor.log")
}

fn open_lock(layout: &Layout) -> Result<std::fs::File> {
    crate::process::open_private_lock(&lock_path(layout))
}

/// The pid of the rack's running supervisor, if one runs (its lock is held).
pub fn running(layout: &Layout) -> Option<i32> {
    // Looked at without creating anything: a rack without one has no directory for it.
    let file = OpenOptions::new().read(true).open(lock_path(layout)).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        // Nobody holds it: none runs. (Released when dropped.)
        Ok(_) => None,
        Err(_) => Some(
            std::fs::read_to_string(pid_path(layout))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0),
        ),
    }
}

/// Starts the supervisor of the rack in `abs_dir` (absolute: it runs in `/`) and waits
/// until it holds its lock; its pid. One that runs already is left as it is.
pub fn start(abs_dir: &Path) -> Result<i32> {
    let layout = Layout::new(abs_dir);
    if let Some(pid) = running(&layout) {
        return Ok(pid);
    }
    let exe = std::env::current_exe().map_err(|e| CliError::io("find", "exactl itself", e))?;
    let log = log_path(&layout);
    let (out, err) = process::open_log(&log, "the rack's supervisor")?;
    let mut child = Command::new(&exe)
        .arg("--rack")
        .arg(abs_dir)
        .args(["rack", "supervise"])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Out of the terminal's foreground group: ^C at the shell that ran `rack up` (or
        // `node restart`) must not reach it.
        .process_group(0)
        .spawn()
        .map_err(|source| CliError::Spawn {
            node: "the rack's supervisor".into(),
            binary: exe.clone(),
            source,
        })?;
    let t0 = Instant::now();
    loop {
        // Its pid once written: it holds its lock a moment before (`running` says 0).
        if let Some(pid) = running(&layout).filter(|&p| p > 1) {
            return Ok(pid);
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(CliError::Failed(format!(
                "the rack's supervisor exited ({st}); end of {}:\n{}",
                log.display(),
                process::tail_of(&log, 10)
            )));
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(CliError::Failed(format!(
                "the rack's supervisor did not start within 10 s; end of {}:\n{}",
                log.display(),
                process::tail_of(&log, 10)
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts the supervisor of a local rack with IP services if none runs (one that died, or
/// a rack brought up by an exactl without one); says so on stderr when it had to.
pub fn ensure_running(rack: &Rack) -> Result<()> {
    let dir = rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone());
    let layout = Layout::new(&dir);
    if !(ip_service::enabled(&layout) || restarts_daemons(&layout)) || running(&layout).is_some() {
        return Ok(());
    }
    let pid = start(&dir)?;
    eprintln!("exactl: the rack's supervisor was not running; started it (pid {pid})");
    Ok(())
}

/// Whether `pid` is the supervisor of the rack in `rack_dir` (a recycled pid must not be
/// signalled): exactl, `rack supervise`, `--rack` that directory.
fn is_supervisor(pid: i32, rack_dir: &Path) -> bool {
    let Some(args) = process::cmdline(pid) else {
        return false;
    };
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let windows = |a: &str, b: &str| args.windows(2).any(|w| w[0] == a && w[1] == b);
    let dir = rack_dir.to_string_lossy();
    windows("rack", "supervise") && windows("--rack", &dir)
}

/// Stops the rack's supervisor, if one runs (SIGTERM, SIGKILL after `timeout`), before
/// anything else of the rack is stopped: it would start the IP services `rack down` is
/// stopping. Its pid, if one ran.
pub fn stop(layout: &Layout, timeout: Duration) -> Result<Option<i32>> {
    // A supervisor that holds its lock but has not written its pid yet is starting: its
    // pid comes within moments.
    let t0 = Instant::now();
    let mut found = running(layout);
    while found == Some(0) && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
        found = running(layout);
    }
    let Some(pid) = found else {
        let _ = std::fs::remove_dir_all(dir(layout));
        return Ok(None);
    };
    let rack_dir = layout
        .dir
        .canonicalize()
        .unwrap_or_else(|_| layout.dir.clone());
    if pid <= 1 || !is_supervisor(pid, &rack_dir) {
        return Err(CliError::Failed(format!(
            "the rack's supervisor holds {} but {} does not name it (pid {pid}); stop it \
             yourself (`fuser {}`), then run this again",
            lock_path(layout).display(),
            pid_path(layout).display(),
            lock_path(layout).display()
        )));
    }
    let _ = process::signal(pid, libc::SIGTERM);
    let t0 = Instant::now();
    while running(layout).is_some() && t0.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(10));
    }
    if running(layout).is_some() {
        let _ = process::signal(pid, libc::SIGKILL);
        let t1 = Instant::now();
        while running(layout).is_some() && t1.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if running(layout).is_some() {
            return Err(CliError::Failed(format!(
                "the rack's supervisor (pid {pid}) did not stop even after SIGKILL"
            )));
        }
    }
    let _ = std::fs::remove_dir_all(dir(layout));
    Ok(Some(pid))
}

/// What the supervisor knows of one node's service.
#[derive(Default)]
struct Slot {
    /// A start under way.
    starting: Option<Starting>,
    /// Starts that failed in a row (reset by one that succeeds, or when the daemon goes).
    failures: u32,
    not_before: Option<Instant>,
    /// Services it started, reaped once they exit.
    started: Vec<Child>,
    /// The service as last seen running: its pid, when its pid file and binary were
    /// last checked, and when its state was (see [`look_after`]).
    seen: Option<Seen>,
    /// The daemon as last seen running, on a rack whose daemons are restarted.
    daemon_seen: Option<Seen>,
    /// When the daemon was last restarted, and how many restarts came within
    /// [`QUICK_DEATH`] of the one before: a daemon that cannot stay up is backed off.
    daemon_restarted: Option<Instant>,
    daemon_failures: u32,
    daemon_not_before: Option<Instant>,
}

#[derive(Clone, Copy)]
struct Seen {
    pid: i32,
    checked: Instant,
    state_checked: Instant,
}

struct Starting {
    child: Child,
    since: Instant,
    count: u64,
    /// Held until the service is ready or gone.
    _lock: Flock<std::fs::File>,
}

/// How long a service seen running is taken to be the same process while its pid is
/// there: a pid reused within it would hide a dead service that long.
const RECHECK: Duration = Duration::from_secs(5);
/// How often a service seen running is looked at for a zombie (a dead process its
/// parent has not reaped yet).
const STATE_RECHECK: Duration = Duration::from_secs(1);

/// A daemon that dies this soon after its restart counts as a failed restart.
const QUICK_DEATH: Duration = Duration::from_secs(10);

fn backoff(failures: u32) -> Duration {
    (Duration::from_millis(200) * 2u32.saturating_pow(failures.min(8))).min(BACKOFF_MAX)
}

fn say(text: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    eprintln!("{now:.3} {text}");
}

/// `exactl rack supervise`: runs until stopped, or until the rack is gone.
pub fn run(dir: &Path) -> Result<()> {
    let rack = Rack::load(dir)?;
    let layout = Layout::new(dir);
    let supervised = |l: &Layout| ip_service::enabled(l) || restarts_daemons(l);
    if !supervised(&layout) {
        return Err(CliError::Failed(format!(
            "rack {:?} at {} runs no IP services (`exactl rack up` as root starts them, and \
             their supervisor) and does not restart its daemons (`--restart \
             unless-stopped`): nothing to supervise",
            rack.file.name,
            dir.display()
        )));
    }
    let mut lock = open_lock(&layout)?;
    // Whoever asks whether one runs ([`running`]) holds the lock shared for an instant:
    // only a lock held for a while is another supervisor's.
    let t0 = Instant::now();
    let _held = loop {
        match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
            Ok(held) => break held,
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if t0.elapsed() < Duration::from_secs(1) => {
                lock = f;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                say("another supervisor runs for this rack; leaving");
                return Ok(());
            }
            Err((_, e)) => return Err(CliError::io("lock", lock_path(&layout), e.into())),
        }
    };
    let pid = pid_path(&layout);
    std::fs::write(&pid, format!("{}\n", std::process::id()))
        .map_err(|e| CliError::io("write", &pid, e))?;
    let binary = process::helper_binary(
        crate::ip_service::SERVICE_ENV,
        crate::ip_service::SERVICE_NAME,
    );
    let daemon_binary = process::daemon_binary();
    let shape = rack.shape();
    let nodes: Vec<String> = shape.node_ids().map(|id| shape.display(id)).collect();
    let mut slots: Vec<Slot> = nodes.iter().map(|_| Slot::default()).collect();
    let (ip, daemons) = (ip_service::enabled(&layout), restarts_daemons(&layout));
    say(&format!(
        "supervising {} of rack {:?} ({} nodes), every {} ms",
        match (ip, daemons) {
            (true, true) => "the daemons and IP services",
            (true, false) => "the IP services",
            _ => "the daemons",
        },
        rack.file.name,
        nodes.len(),
        TICK.as_millis()
    ));
    // What it needs only for what it supervises: a rack without IP has no service binary.
    let binary = if ip { Some(binary?) } else { None };
    let daemon_binary = if daemons { Some(daemon_binary?) } else { None };
    loop {
        if !layout.rack_file().exists() || !supervised(&layout) {
            say("the rack's IP services are gone; leaving");
            return Ok(());
        }
        for (node, slot) in nodes.iter().zip(slots.iter_mut()) {
            if let Some(d) = &daemon_binary {
                match revive_daemon(&layout, d, ip, node, slot) {
                    // The service follows at the next look, once the daemon is there.
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => say(&format!("{node}: {e}")),
                }
            }
            let Some(binary) = &binary else { continue };
            if let Err(e) = look_after(&rack, &layout, binary, node, slot) {
                slot.failures += 1;
                slot.not_before = Some(Instant::now() + backoff(slot.failures));
                say(&format!("{node}: {e}"));
            }
        }
        // A start under way is looked at more often: the lock it holds keeps `exactl
        // node` waiting, and its readiness is what the restart time is measured to.
        let starting = slots.iter().any(|s| s.starting.is_some());
        std::thread::sleep(if starting { START_POLL } else { TICK });
    }
}

/// Whether process `seen.pid` is still there, cheaply: a signal 0 between full checks
/// (one system call), its state once in [`STATE_RECHECK`] for a zombie (the daemons and
/// services rack up started are orphans, reaped by init whenever it gets round to it),
/// and none after [`RECHECK`] (a reused pid). Updates `seen`; false when a full check
/// is due.
fn still_there(seen: &mut Option<Seen>) -> bool {
    let Some(s) = *seen else {
        return false;
    };
    let there = !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.pid), None),
        Err(nix::errno::Errno::ESRCH)
    );
    if there && s.checked.elapsed() < RECHECK {
        if s.state_checked.elapsed() < STATE_RECHECK {
            return true;
        }
        if process::is_alive(s.pid) {
            *seen = Some(Seen {
                state_checked: Instant::now(),
                ..s
            });
            return true;
        }
    }
    *seen = None;
    false
}

/// One look at `node`'s daemon, on a rack whose daemons are restarted: a daemon whose
/// process is gone while its pid file stays died on its own (exactl removes the file
/// when it stops or kills one), and is started again, counted, its IP service (`ip`)
/// stopped so that the next look starts one attached to the new daemon. True when it
/// restarted it.
fn revive_daemon(
    layout: &Layout,
    binary: &Path,
    ip: bool,
    node: &str,
    slot: &mut Slot,
) -> Result<bool> {
    slot.started
        .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    if still_there(&mut slot.daemon_seen)
        || slot.daemon_not_before.is_some_and(|t| Instant::now() < t)
    {
        return Ok(false);
    }
    let pid_file = layout.pid_file(&node);
    let gone = |seen: &mut Option<Seen>| match process::read_pid_file(&pid_file, node, &layout.dir)
    {
        PidFile::Running(d) => {
            let now = Instant::now();
            *seen = Some(Seen {
                pid: d.pid,
                checked: now,
                state_checked: now,
            });
            false
        }
        _ => pid_file.exists(),
    };
    if !gone(&mut slot.daemon_seen) {
        return Ok(false);
    }
    // The node lock, as for a service: `exactl node` restarting it must not race this.
    let locks = layout.ip_run_dir();
    std::fs::create_dir_all(&locks).map_err(|e| CliError::io("create", &locks, e))?;
    let Some(_lock) = ip_service::lock_node(layout, node, None)? else {
        return Ok(false);
    };
    if !gone(&mut slot.daemon_seen) {
        return Ok(false);
    }
    let quick = slot
        .daemon_restarted
        .is_some_and(|t| t.elapsed() < QUICK_DEATH);
    slot.daemon_failures = if quick { slot.daemon_failures + 1 } else { 0 };
    if ip {
        ip_service::stop_node(layout, node, Duration::from_secs(5));
    }
    let path = daemon_restarts_file(layout, node);
    let count = ip_service::restarts_at(&path).count + 1;
    let child = process::spawn_daemon(binary, layout, &layout.dir, node, count)?;
    ip_service::count_restart_at(&path, count)?;
    say(&format!(
        "{node}: the daemon died on its own; started it again (pid {}, restart {count}){}",
        child.id(),
        if quick {
            format!(
                ", {} s after the last: the next waits {} ms",
                slot.daemon_restarted.map_or(0, |t| t.elapsed().as_secs()),
                backoff(slot.daemon_failures).as_millis()
            )
        } else {
            String::new()
        }
    ));
    let now = Instant::now();
    slot.daemon_restarted = Some(now);
    slot.daemon_not_before = quick.then(|| now + backoff(slot.daemon_failures));
    slot.daemon_seen = Some(Seen {
        pid: child.id() as i32,
        checked: now,
        state_checked: now,
    });
    slot.started.push(child);
    Ok(true)
}

/// One look at `node`: finish a start under way, or start its service if it needs one.
fn look_after(
    rack: &Rack,
    layout: &Layout,
    binary: &Path,
    node: &str,
    slot: &mut Slot,
) -> Result<()> {
    slot.started
        .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    if let Some(mut st) = slot.starting.take() {
        match ip_service::poll_start(layout, node, &mut st.child) {
            Start::Ready => {
                ip_service::count_restart(layout, node, st.count)?;
                say(&format!(
                    "{node}: IP service restarted (pid {}, restart {} of this rack), ready \
                     {} ms after its start",
                    st.child.id(),
                    st.count,
                    st.since.elapsed().as_millis()
                ));
                slot.failures = 0;
                slot.started.push(st.child);
            }
            Start::Exited(e) => {
                slot.failures += 1;
                slot.not_before = Some(Instant::now() + backoff(slot.failures));
                say(&format!(
                    "{node}: {e}\n(trying again in {} ms)",
                    backoff(slot.failures).as_millis()
                ));
            }
            Start::Pending if st.since.elapsed() > START_TIMEOUT => {
                let _ = st.child.kill();
                let _ = st.child.wait();
                slot.failures += 1;
                slot.not_before = Some(Instant::now() + backoff(slot.failures));
                say(&format!(
                    "{node}: the IP service was not ready {} s after its start; killed it",
                    START_TIMEOUT.as_secs()
                ));
            }
            Start::Pending => slot.starting = Some(st),
        }
        return Ok(());
    }
    if slot.not_before.is_some_and(|t| Instant::now() < t) {
        return Ok(());
    }
    // Reading every node's pid file and resolving its binary at every tick took 5% of
    // a core for 128 nodes, reading /proc/PID/stat 1%: between full checks, a signal 0
    // (one system call) says whether the pid is there. A zombie passes it, and the
    // services rack up started are orphans, reaped by init whenever it gets round to it
    // (over a second in some containers): their state is read once a second.
    if still_there(&mut slot.seen) {
        return Ok(());
    }
    if let Some(pid) = ip_service::service_pid(layout, node) {
        let now = Instant::now();
        slot.seen = Some(Seen {
            pid,
            checked: now,
            state_checked: now,
        });
        return Ok(());
    }
    // Only a node whose daemon runs (and is not paused) can have its service.
    let daemon = match process::read_pid_file(&layout.pid_file(&node), node, &layout.dir) {
        PidFile::Running(d) => d,
        _ => {
            slot.failures = 0;
            return Ok(());
        }
    };
    if process::is_stopped(daemon.pid) {
        return Ok(());
    }
    let Some(lock) = ip_service::lock_node(layout, node, None)? else {
        // `exactl node` is at work on it.
        return Ok(());
    };
    // Looked at again under the lock: whoever held it may have started one.
    if ip_service::service_pid(layout, node).is_some()
        || !process::is_our_daemon(daemon.pid, node, &layout.dir)
    {
        return Ok(());
    }
    let count = ip_service::restarts(layout, node).count + 1;
    ip_service::ensure_netns(rack, node, false)?;
    let child = ip_service::spawn_node(rack, layout, binary, node, count)?;
    say(&format!(
        "{node}: the IP service is gone while its daemon (pid {}) runs; started it again \
         (pid {})",
        daemon.pid,
        child.id()
    ));
    slot.starting = Some(Starting {
        child,
        since: Instant::now(),
        count,
        _lock: lock,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_ceiling() {
        assert_eq!(backoff(1), Duration::from_millis(400));
        assert_eq!(backoff(2), Duration::from_millis(800));
        assert_eq!(backoff(5), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn a_rack_without_a_supervisor_has_none_running() {
        let d = std::env::temp_dir().join(format!("exactl-sup-{}", std::process::id()));
        let layout = Layout::new(&d);
        assert_eq!(running(&layout), None);
        // Its lock held: one runs, whatever its pid file says.
        let held = Flock::lock(open_lock(&layout).unwrap(), FlockArg::LockExclusive).unwrap();
        assert_eq!(running(&layout), Some(0));
        std::fs::write(pid_path(&layout), "4242\n").unwrap();
        assert_eq!(running(&layout), Some(4242));
        drop(held);
        assert_eq!(running(&layout), None);
        // Not a supervisor of this rack: refused rather than signalled.
        assert!(!is_supervisor(std::process::id() as i32, &d));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
