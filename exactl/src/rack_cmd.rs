//! `exactl rack up` and `exactl rack down`: the embedded local rack, one detached
//! `exanetd` process per node on 127.0.0.1.

use std::collections::{BTreeSet, HashSet};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use exanet_control::control::{Request, Response};
use exanet_control::control_client::ControlClient;
use exanet_control::ports;
use exanet_control::rack::{self, Layout, Rack, RackError, RackFile, RACK_FILE};
use exanet_proto::{NodeId, Shape};
use exanet_proto::{DEFAULT_WINDOW, MIN_WINDOW};

use crate::error::{CliError, Result};
use crate::fabric::{self, Health};
use crate::interrupt;
use crate::live::RackLiveness;
use crate::needs::{self, Host, Needs};
use crate::process::{self, PidFile};

/// Most daemons `rack up` starts on one machine: far beyond the 128-node prototype, far
/// below what would starve the machine (or run out of ports: each node takes two).
const MAX_LOCAL_NODES: u32 = 1024;
/// Largest window the rack file accepts (see `Rack::new`).
const MAX_WINDOW: u32 = 1 << 30;
/// How long one status query may take while waiting for the rack to come up.
const UP_QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two rounds of status queries while waiting.
const UP_POLL: Duration = Duration::from_millis(200);
/// Links and daemons listed by name in a failure report; the rest are counted.
const REPORT_LIMIT: usize = 20;
/// Log lines shown for a daemon that exited.
const LOG_TAIL_LINES: usize = 12;

/// The options of `rack up` that define a new rack.
#[derive(Clone, Debug, Default)]
pub struct UpOptions {
    pub shape: Option<Shape>,
    pub name: Option<String>,
    pub window: Option<u32>,
    /// Seconds (the rack file's `link_timeout_s`).
    pub link_timeout: Option<u32>,
    pub base_port: Option<u16>,
    pub ip: IpMode,
    /// Whether the supervisor restarts daemons that die on their own.
    pub restart: RestartPolicy,
    pub timeout: Duration,
}

/// What becomes of a local rack's daemon that dies on its own (a crash, a `kill -9` from
/// outside exactl); one that `exactl node kill`, `node restart` or `rack down` stops is
/// never restarted behind the operator's back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartPolicy {
    /// It stays down, shown by `exactl status`, until `exactl node restart`: on a local
    /// rack a dead daemon is usually a fault someone injected and wants to see.
    #[default]
    No,
    /// The rack's supervisor starts it again (its IP service with it) and counts it, as
    /// compose's `restart: unless-stopped` and systemd's `Restart=on-failure` do.
    UnlessStopped,
}

/// Whether `rack up` runs IP over ExaNet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IpMode {
    #[default]
    Auto,
    On,
    Off,
}

/// `exactl rack up`. It either brings the whole rack up (daemons, links and, with IP,
/// every node's service) or, when anything fails on the way, stops everything it started
/// before it returns the error: a rack that is half up looks like a rack that works to
/// every command but the one that meets the missing half.
pub fn up(dir: &Path, opts: &UpOptions) -> Result<()> {
    let start = Instant::now();
    // From picking the ports (a new rack) until the daemons and services bound them.
    let port_lock = crate::port_lock::PortLock::acquire();
    let (rack, new_file) = prepare_rack(dir, opts)?;
    let layout = rack.layout();
    let shape = rack.shape();
    let running = running_daemons(&layout, Some(&rack));
    if !running.is_empty() {
        return Err(CliError::AlreadyRunning {
            dir: dir.to_path_buf(),
            running: running.len(),
            total: shape.nodes() as usize,
        });
    }
    let binary = process::daemon_binary()?;
    let ip_off = match opts.ip {
        IpMode::Off => Some("--ip off".to_string()),
        IpMode::Auto => crate::ip_service::unavailable(),
        IpMode::On => match crate::ip_service::unavailable() {
            Some(why) => return Err(CliError::Failed(format!("--ip on: {why}"))),
            None => None,
        },
    };
    if ip_off.is_none() {
        crate::ip_service::check_namespaces_free(&rack)?;
    }
    // A supervisor left by a run whose daemons all died knows that run's rack, not this one.
    crate::supervisor::stop(&layout, Duration::from_secs(5))?;
    let needs = Needs::of(shape, ip_off.is_none().then(|| rack.ip_mtu()));
    let host = Host::read();
    let short = needs::shortfalls(&needs, &host);
    if !short.is_empty() {
        let without_ip = Needs::of(shape, None);
        return Err(CliError::HostTooSmall {
            needs: needs.to_string(),
            shortfalls: short,
            without_ip: (needs.ip_mtu.is_some()
                && needs::shortfalls(&without_ip, &host).is_empty())
            .then(|| without_ip.to_string()),
        });
    }
    eprintln!("exactl: {needs}");

    // Everything checked: from here on the rack directory is written.
    for (what, d) in [
        ("create the rack directory", layout.dir.clone()),
        ("create the run directory", layout.run_dir()),
        ("create the log directory", layout.log_dir()),
    ] {
        std::fs::create_dir_all(&d).map_err(|e| CliError::io(what, d, e))?;
    }
    write_memory_budget(&rack, &layout, needs::registered_budget(&needs, &host))?;
    if let Some(file) = &new_file {
        rack::write_rack_file(dir, file).map_err(CliError::WriteRack)?;
        eprintln!(
            "exactl: created {} (rack {:?}, shape {shape}, {} nodes)",
            layout.rack_file().display(),
            rack.file.name,
            shape.nodes()
        );
    }
    let names: Vec<String> = shape.node_ids().map(|id| shape.display(id)).collect();
    let mut rack = rack;
    // The IP service's key goes into the rack file before the daemons read it.
    if ip_off.is_none() {
        rack.ensure_ip_key()
            .map_err(|e| CliError::io("make the IP service's key", layout.ip_key(), e))?;
    }
    let issued = exanet_control::tls::ensure_rack_pki(&layout, &names)?;
    if issued > 0 {
        eprintln!("exactl: issued {issued} TLS certificates (nodes and the operator's)");
    }
    // The daemons and services run in `/`: they are handed this one.
    let abs_dir = dir
        .canonicalize()
        .map_err(|e| CliError::io("resolve the rack directory", dir, e))?;
    for n in &names {
        // A count left by an earlier run of the rack is not this one's.
        let restarts = crate::supervisor::daemon_restarts_file(&layout, n);
        for p in [layout.pid_file(n), layout.control_socket(n), restarts] {
            process::remove_if_present(&p).map_err(|e| CliError::io("remove stale", p, e))?;
        }
    }

    interrupt::catch();
    let mut children: Vec<(String, Child)> = Vec::with_capacity(names.len());
    let started = start_rack(
        &rack,
        &abs_dir,
        &binary,
        ip_off.as_deref(),
        opts.timeout,
        start,
        &mut children,
    );
    drop(port_lock);
    // A second Ctrl-C while stopping what was started ends exactl at once.
    interrupt::restore();
    // With IP, the supervisor restarts the services that die on their own from now on,
    // and the daemons too when asked.
    let restart = opts.restart == RestartPolicy::UnlessStopped;
    let started = started
        .and_then(|()| crate::supervisor::set_daemon_policy(&layout, restart))
        .and_then(|()| match ip_off {
            None => Ok(()),
            Some(_) => crate::ip_service::forget_enabled(&layout),
        })
        .and_then(|()| {
            if ip_off.is_none() || restart {
                crate::supervisor::start(&abs_dir).map(|_| ())
            } else {
                Ok(())
            }
        });
    if let Err(e) = started {
        let _ = crate::supervisor::stop(&layout, Duration::from_secs(5));
        return Err(roll_back(&rack, children, ip_off.is_none(), e));
    }
    if ip_off.is_none() {
        // Launchers (mpirun, Hydra) reach the nodes through it; the rack is up either way.
        match crate::mpirun::write_agent(&rack, &abs_dir, false) {
            Ok(agent) => eprintln!(
                "exactl: remote-shell agent for MPI launchers: {}",
                agent.display()
            ),
            Err(e) => eprintln!("exactl: no remote-shell agent for MPI launchers: {e}"),
        }
        eprintln!(
            "exactl: IP over ExaNet up: {} in namespaces exanet-{}-NODE (`exactl hosts` lists the addresses)",
            rack.ip_subnet(),
            rack.file.name
        );
    }
    crate::stdout::outln!(
        "rack {:?} is up: shape {shape}, {} nodes, {} links up, {:.1} s ({})",
        rack.file.name,
        shape.nodes(),
        exanet_proto::topology::links(&shape).len(),
        start.elapsed().as_secs_f64(),
        abs_dir.display()
    );
    Ok(())
}

/// Leaves the host's registered-memory budget for the daemons about to start, and no
/// ledger: every daemon of the rack is down, so what an earlier run's ledger says is held
/// is held by no one (and its shape may not be this rack's). Without a budget (the host's
/// memory unknown) an earlier one is removed too: the daemons then budget each node alone.
fn write_memory_budget(
    rack: &Rack,
    layout: &Layout,
    budget: Option<rack::MemoryBudget>,
) -> Result<()> {
    let ledger = layout.memory_ledger();
    process::remove_if_present(&ledger).map_err(|e| CliError::io("remove stale", ledger, e))?;
    let path = layout.memory_budget();
    let Some(b) = budget else {
        process::remove_if_present(&path).map_err(|e| CliError::io("remove stale", path, e))?;
        eprintln!(
            "exactl: this host's memory is unknown: each daemon limits registered memory \
             on its own node only"
        );
        return Ok(());
    };
    b.write(&path)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let ip = if b.ip_bytes > 0 {
        format!(" and {} for IP over ExaNet", needs::bytes(b.ip_bytes))
    } else {
        String::new()
    };
    eprintln!(
        "exactl: registered memory on this host: {} for the rack's jobs{ip}, {} per job",
        needs::bytes(b.total_bytes - b.ip_bytes),
        needs::bytes(b.per_job(rack.file.job_host_memory_percent()))
    );
    Ok(())
}

/// Starts a daemon per node, waits for every link, then starts the IP services (unless
/// `ip_off` says why not). What it started is in `children`, whatever it returns.
fn start_rack(
    rack: &Rack,
    abs_dir: &Path,
    binary: &Path,
    ip_off: Option<&str>,
    timeout: Duration,
    start: Instant,
    children: &mut Vec<(String, Child)>,
) -> Result<()> {
    let layout = Layout::new(abs_dir);
    let shape = rack.shape();
    let names: Vec<String> = shape.node_ids().map(|id| shape.display(id)).collect();
    eprintln!(
        "exactl: starting {} daemons of rack {:?} ({}) from {}",
        names.len(),
        rack.file.name,
        rack.shape(),
        binary.display()
    );
    for n in &names {
        if interrupt::raised() {
            return Err(CliError::Failed(
                "interrupted while starting the daemons".into(),
            ));
        }
        children.push((
            n.clone(),
            process::spawn_daemon(binary, &layout, abs_dir, n, 0)?,
        ));
    }
    wait_up(rack, children, start, timeout)?;
    match ip_off {
        None => crate::ip_service::start(rack, abs_dir, timeout),
        Some(why) => {
            eprintln!("exactl: IP over ExaNet off: {why}; the rack runs without it");
            Ok(())
        }
    }
}

/// How long stopping a rack that failed to come up may wait for its daemons after SIGTERM.
const ROLL_BACK_GRACE: Duration = Duration::from_secs(10);

/// Stops everything a failed `rack up` started (the IP services and their namespaces,
/// then the daemons, which are this process's children, so their pids cannot have been
/// reused) and says so after `cause`. The rack directory stays, logs and all.
fn roll_back(
    rack: &Rack,
    mut children: Vec<(String, Child)>,
    ip: bool,
    cause: CliError,
) -> CliError {
    let layout = rack.layout();
    // Only when this rack was to have IP: the namespaces are found by the rack's name,
    // and another rack of that name may be using them. Stopping twice is harmless (a
    // failed start stops its services itself).
    if ip {
        crate::ip_service::stop(&layout, Some(rack), Duration::from_secs(5));
    }
    let mut running: Vec<&mut (String, Child)> = children
        .iter_mut()
        .filter_map(|e| matches!(e.1.try_wait(), Ok(None)).then_some(e))
        .collect();
    for (_, c) in running.iter_mut() {
        let _ = process::signal(c.id() as i32, libc::SIGTERM);
    }
    let still = |running: &mut Vec<&mut (String, Child)>| {
        running
            .iter_mut()
            .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
    };
    let t0 = Instant::now();
    while t0.elapsed() < ROLL_BACK_GRACE && still(&mut running) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (_, c) in running.iter_mut() {
        if let Ok(None) = c.try_wait() {
            let _ = c.kill();
        }
    }
    // SIGKILL cannot be ignored; processes stuck in the kernel are waited for a while (all
    // together, not each in turn) and then reported rather than waited for forever.
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(3) && still(&mut running) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut left = Vec::new();
    for (name, c) in children.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            left.push(format!("{name} (pid {})", c.id()));
        } else {
            for p in [layout.pid_file(name), layout.control_socket(name)] {
                let _ = process::remove_if_present(&p);
            }
        }
    }
    let logs = layout.log_dir();
    if left.is_empty() {
        CliError::UpFailed {
            cause: Box::new(cause),
            stopped: children.len(),
            logs,
        }
    } else {
        CliError::UpLeftRunning {
            cause: Box::new(cause),
            left,
            logs,
        }
    }
}

/// Loads the rack file, checking that the options agree with it, or builds a new one from
/// the options (returned, to be written once everything else is checked).
fn prepare_rack(dir: &Path, opts: &UpOptions) -> Result<(Rack, Option<RackFile>)> {
    if let Some(w) = opts.window {
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&w) {
            return Err(CliError::BadValue {
                what: "--window",
                value: w.to_string(),
                message: format!(
                    "a link window is between {MIN_WINDOW} (one full cell) and {MAX_WINDOW} bytes"
                ),
            });
        }
    }
    if let Some(t) = opts.link_timeout {
        let range = exanet_control::tls::LINK_TIMEOUT_S;
        if !range.contains(&t) {
            return Err(CliError::BadValue {
                what: "--link-timeout",
                value: t.to_string(),
                message: format!(
                    "a link timeout is {} to {} seconds",
                    range.start(),
                    range.end()
                ),
            });
        }
    }
    if let Some(name) = &opts.name {
        check_rack_name(name)?;
    }
    if dir.exists() && !dir.is_dir() {
        return Err(CliError::BadValue {
            what: "rack directory",
            value: dir.display().to_string(),
            message: "exists and is not a directory".into(),
        });
    }
    let path = dir.join(RACK_FILE);
    if path.exists() {
        let rack = Rack::load(dir)?;
        check_agrees(dir, &rack, opts)?;
        return Ok((rack, None));
    }
    let shape = opts.shape.unwrap_or(Shape::PROTOTYPE);
    let n = shape.nodes();
    if n > MAX_LOCAL_NODES {
        return Err(CliError::BadValue {
            what: "--shape",
            value: shape.to_string(),
            message: format!(
                "a local rack runs one process per node on this machine and is limited to \
                 {MAX_LOCAL_NODES} nodes; this shape has {n}"
            ),
        });
    }
    let ports: Vec<(u16, u16)> = match opts.base_port {
        Some(base) => {
            let last = u32::from(base) + 2 * n - 1;
            if base == 0 || last > u32::from(u16::MAX) {
                return Err(CliError::BadValue {
                    what: "--base-port",
                    value: base.to_string(),
                    message: format!(
                        "a {shape} rack needs {} consecutive ports from it (link ports, then metrics ports), so it must be between 1 and {}",
                        2 * n,
                        (u32::from(u16::MAX) + 1).saturating_sub(2 * n)
                    ),
                });
            }
            (0..n)
                .map(|i| {
                    (
                        (u32::from(base) + i) as u16,
                        (u32::from(base) + n + i) as u16,
                    )
                })
                .collect()
        }
        None => {
            let avail = ports::pool().len() as u32;
            // Leave the host most of the pool.
            if 2 * n > avail / 2 {
                return Err(CliError::BadValue {
                    what: "--shape",
                    value: shape.to_string(),
                    message: format!(
                        "a local rack of {n} nodes needs {} ports, too many to pick from the \
                         {avail} ports below the ephemeral range; give --base-port",
                        2 * n
                    ),
                });
            }
            ports::pick_free(n as usize).map_err(CliError::Ports)?
        }
    };
    let name = opts.name.clone().unwrap_or_else(|| default_rack_name(dir));
    let mut file = RackFile::loopback(&name, shape, |id| ports[id.0 as usize]);
    file.window = opts.window.unwrap_or(DEFAULT_WINDOW);
    file.link_timeout_s = opts.link_timeout;
    let rack = Rack::new(dir, file.clone())
        .map_err(|message| CliError::RackFile(RackError::Invalid { path, message }))?;
    Ok((rack, Some(file)))
}

fn check_rack_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(CliError::BadValue {
            what: "--name",
            value: format!("{name:?}"),
            message: "a rack name is 1 to 64 letters, digits, '-', '_' or '.'".into(),
        })
    }
}

/// The rack's name when `--name` is not given: the rack directory's name.
fn default_rack_name(dir: &Path) -> String {
    std::path::absolute(dir)
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .filter(|n| check_rack_name(n).is_ok())
        .unwrap_or_else(|| rack::DEFAULT_RACK_DIR.to_string())
}

/// Refuses options that contradict an existing rack file.
fn check_agrees(dir: &Path, rack: &Rack, opts: &UpOptions) -> Result<()> {
    let mismatch = |setting, existing: String, requested: String| CliError::SettingMismatch {
        dir: dir.to_path_buf(),
        setting,
        existing,
        requested,
    };
    let f = &rack.file;
    if let Some(s) = opts.shape {
        if s != f.shape {
            return Err(mismatch("shape", f.shape.to_string(), s.to_string()));
        }
    }
    if let Some(n) = &opts.name {
        if *n != f.name {
            return Err(mismatch("name", format!("{:?}", f.name), format!("{n:?}")));
        }
    }
    if let Some(w) = opts.window {
        if w != f.window {
            return Err(mismatch("window", f.window.to_string(), w.to_string()));
        }
    }
    if let Some(t) = opts.link_timeout {
        let have = f.link_timeout().as_secs();
        if u64::from(t) != have {
            return Err(mismatch(
                "link timeout",
                format!("{have} s"),
                format!("{t} s"),
            ));
        }
    }
    if let Some(base) = opts.base_port {
        let shape = rack.shape();
        let n = shape.nodes();
        let fits = shape.node_ids().all(|id| {
            let e = rack.entry(id);
            port_of(&e.link) == Some(u32::from(base) + id.0)
                && port_of(&e.metrics) == Some(u32::from(base) + n + id.0)
        });
        if !fits {
            let first = rack.entry(NodeId(0));
            return Err(mismatch(
                "ports",
                format!("link {} / metrics {} for node 0", first.link, first.metrics),
                format!("--base-port {base}"),
            ));
        }
    }
    Ok(())
}

fn port_of(addr: &str) -> Option<u32> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// The daemons of the rack that are running: confirmed through their pid files, or (for
/// daemons started some other way) answering on their control socket. Stale pid files are
/// removed on the way.
fn running_daemons(layout: &Layout, rack: Option<&Rack>) -> BTreeSet<String> {
    let mut running = BTreeSet::new();
    for node in process::pid_file_nodes(layout) {
        let path = layout.pid_file(&node);
        match process::read_pid_file(&path, &node, &layout.dir) {
            PidFile::Running(d) => {
                running.insert(d.node);
            }
            PidFile::Stale | PidFile::Garbage => {
                let _ = process::remove_if_present(&path);
            }
        }
    }
    // A rack without operator credentials yet has never been started by exactl; any
    // daemon of it would have to be someone else's.
    if let Some(client) = rack.and_then(|r| ControlClient::new(r).ok()) {
        let shape = client.rack().shape();
        let answers = fabric::query_all(&client, Duration::from_millis(500));
        for (id, a) in shape.node_ids().zip(&answers) {
            if a.is_ok() {
                running.insert(shape.display(id));
            }
        }
    }
    running
}

/// Waits until every link of the rack is up at both ends, a daemon exits, or `timeout`
/// (counted from `start`) passes.
fn wait_up(
    rack: &Rack,
    children: &mut [(String, Child)],
    start: Instant,
    timeout: Duration,
) -> Result<()> {
    let shape = rack.shape();
    let nodes = shape.nodes() as usize;
    let client = crate::control::client(rack)?;
    let mut progress = Progress::new();
    loop {
        let mut exited = reap(children);
        if !exited.is_empty() {
            // Give the others a moment: one failure often takes its neighbours along, and
            // the report should name them all.
            std::thread::sleep(Duration::from_millis(500));
            exited = reap(children);
        }
        // Never let a round of queries run far past the deadline.
        let left = timeout.saturating_sub(start.elapsed());
        let per_query = UP_QUERY_TIMEOUT.min(left.max(Duration::from_millis(200)));
        let answers = fabric::query_all(&client, per_query);
        let views = fabric::link_views(&shape, &answers);
        let up = views.iter().filter(|v| v.health() == Health::Up).count();
        let answering = answers.iter().filter(|a| a.is_ok()).count();
        progress.show(&format!(
            "exactl: daemons answering {answering}/{nodes}, links up {up}/{} ({:.1} s)",
            views.len(),
            start.elapsed().as_secs_f64()
        ));
        if exited.is_empty() && up == views.len() && answering == nodes {
            progress.done();
            return Ok(());
        }
        let timed_out = start.elapsed() >= timeout;
        if timed_out || !exited.is_empty() {
            progress.done();
            let headline = if exited.is_empty() {
                format!(
                    "the rack did not come up within {} s: {up} of {} links up",
                    timeout.as_secs_f64(),
                    views.len()
                )
            } else {
                format!(
                    "the rack did not come up: {} daemon(s) exited; {up} of {} links up",
                    exited.len(),
                    views.len()
                )
            };
            let report = failure_report(rack, &answers, &views, &exited);
            return Err(CliError::Failed(
                format!("{headline}\n{report}").trim_end().to_string(),
            ));
        }
        if interrupt::raised() {
            progress.done();
            return Err(CliError::Failed(format!(
                "interrupted while waiting for the links: {up} of {} up",
                views.len()
            )));
        }
        std::thread::sleep(UP_POLL.min(timeout.saturating_sub(start.elapsed())));
    }
}

/// The children that have exited so far (reaping them), in start order.
fn reap(children: &mut [(String, Child)]) -> Vec<(String, ExitStatus)> {
    children
        .iter_mut()
        .filter_map(|(name, child)| match child.try_wait() {
            Ok(Some(st)) => Some((name.clone(), st)),
            _ => None,
        })
        .collect()
}

fn failure_report(
    rack: &Rack,
    answers: &[fabric::Answer],
    views: &[fabric::LinkView<'_>],
    exited: &[(String, ExitStatus)],
) -> String {
    use std::fmt::Write as _;
    let shape = rack.shape();
    let layout = rack.layout();
    let mut s = String::new();
    let down: Vec<_> = views.iter().filter(|v| v.health() != Health::Up).collect();
    if !down.is_empty() {
        let _ = writeln!(s, "  links not up ({}):", down.len());
        for v in down.iter().take(REPORT_LIMIT) {
            let end = |e: Option<&exanet_control::control::LinkStatus>, node: NodeId| match e {
                Some(l) => format!("{} says {:?}", shape.display(node), l.state).to_lowercase(),
                None => format!("{} does not answer", shape.display(node)),
            };
            let _ = writeln!(
                s,
                "    {}: {} ({}, {})",
                v.describe(&shape),
                v.health().label(),
                end(v.a_end, v.link.a),
                end(v.b_end, v.link.b)
            );
        }
        if down.len() > REPORT_LIMIT {
            let _ = writeln!(s, "    ... and {} more", down.len() - REPORT_LIMIT);
        }
    }
    let exited_names: HashSet<&str> = exited.iter().map(|(n, _)| n.as_str()).collect();
    let silent: Vec<String> = shape
        .node_ids()
        .zip(answers)
        .filter_map(|(id, a)| a.as_ref().err().map(|e| (shape.display(id), e)))
        .filter(|(n, _)| !exited_names.contains(n.as_str()))
        .map(|(n, e)| format!("{n} ({e})"))
        .collect();
    if !silent.is_empty() {
        let _ = writeln!(s, "  daemons not answering ({}):", silent.len());
        for line in silent.iter().take(REPORT_LIMIT) {
            let _ = writeln!(s, "    {line}");
        }
        if silent.len() > REPORT_LIMIT {
            let _ = writeln!(s, "    ... and {} more", silent.len() - REPORT_LIMIT);
        }
    }
    if !exited.is_empty() {
        let _ = writeln!(s, "  daemons that exited ({}):", exited.len());
        for (name, st) in exited.iter().take(5) {
            let _ = writeln!(
                s,
                "    {name}: {st}; end of {}:",
                layout.log_file(name).display()
            );
            for line in process::log_tail(&layout, name, LOG_TAIL_LINES).lines() {
                let _ = writeln!(s, "      | {line}");
            }
        }
        if exited.len() > 5 {
            let _ = writeln!(
                s,
                "    ... and {} more: {}",
                exited.len() - 5,
                exited[5..]
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    s
}

/// Progress on stderr: rewritten in place on a terminal, otherwise a line when it changed
/// and a second has passed.
struct Progress {
    tty: bool,
    last: String,
    printed: Option<Instant>,
    pending: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            last: String::new(),
            printed: None,
            pending: false,
        }
    }

    fn show(&mut self, line: &str) {
        // Compare without the clock so that only real changes count.
        let key = line.rsplit_once(" (").map_or(line, |(k, _)| k);
        let changed = key
            != self
                .last
                .rsplit_once(" (")
                .map_or(self.last.as_str(), |(k, _)| k);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{line}");
            let _ = err.flush();
            self.printed = Some(Instant::now());
        } else if changed || self.pending {
            let due = match self.printed {
                None => true,
                Some(t) => t.elapsed() >= Duration::from_secs(1),
            };
            if due {
                let _ = writeln!(err, "{line}");
                self.printed = Some(Instant::now());
                self.pending = false;
            } else {
                self.pending = true;
            }
        }
        self.last = line.to_string();
    }

    /// Ends the progress display, making sure the last state was shown.
    fn done(&mut self) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            if self.printed.is_some() {
                let _ = writeln!(err);
            }
        } else if self.pending {
            let _ = writeln!(err, "{}", self.last);
        }
        self.pending = false;
    }
}

/// `exactl rack down`.
pub fn down(dir: &Path, timeout: Duration) -> Result<()> {
    let layout = Layout::new(dir);
    let (rack, rack_problem) = match Rack::load(dir) {
        Ok(r) => (Some(r), None),
        Err(RackError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            (None, None)
        }
        Err(e) => (None, Some(CliError::from(e))),
    };

    // The supervisor before anything else, even before the daemons to stop are looked
    // for: it would start again the IP services stopped below, and a daemon it revived
    // meanwhile would be missed.
    match crate::supervisor::stop(&layout, timeout) {
        Ok(Some(pid)) => eprintln!("exactl: stopped the rack's supervisor (pid {pid})"),
        Ok(None) => {}
        Err(e) => eprintln!("exactl: warning: {e}"),
    }
    // The daemons to stop: those with a pid file, and any other of the rack's nodes that
    // answers on its control socket.
    let mut targets: Vec<process::Daemon> = Vec::new();
    let mut known: BTreeSet<String> = process::pid_file_nodes(&layout).into_iter().collect();
    for node in &known {
        if let PidFile::Running(d) = process::read_pid_file(&layout.pid_file(node), node, dir) {
            targets.push(d);
        }
    }
    let mut asked = 0usize;
    let client = rack.as_ref().and_then(|r| ControlClient::new(r).ok());
    if let Some(client) = &client {
        let shape = client.rack().shape();
        // A node whose process is known to be gone is not asked: each would wait out the
        // timeout, and a second `rack down` of a 128-node rack took 128 s doing that.
        let live = RackLiveness::of(client.rack());
        for id in shape.node_ids() {
            let node = shape.display(id);
            let covered = targets.iter().any(|d| d.node == node);
            known.insert(node.clone());
            if covered || live.gone(id).is_some() {
                continue;
            }
            match fabric::query_one(client, id, Duration::from_secs(1)) {
                Ok(st) if process::is_our_daemon(st.pid as i32, &node, dir) => {
                    targets.push(process::Daemon {
                        node,
                        pid: st.pid as i32,
                    });
                }
                Ok(_) => {
                    // A daemon we cannot see as a process (another pid namespace): ask it.
                    let req = Request::Shutdown;
                    if let Ok(Response::Ok) = client.request(id, &req, Duration::from_secs(2)) {
                        asked += 1;
                    }
                }
                Err(_) => {}
            }
        }
    }
    // The rack's Prometheus (`exactl rack prometheus`) and the IP services first: one
    // scrapes the daemons, the others are their workloads.
    match crate::rack_prometheus::stop(dir, timeout) {
        Ok(Some(pid)) => crate::stdout::outln!("stopped the rack's prometheus (pid {pid})"),
        Ok(None) => {}
        Err(e) => eprintln!("exactl: warning: {e}"),
    }
    crate::ip_service::stop(&layout, rack.as_ref(), timeout);
    if targets.is_empty() && asked == 0 {
        if let Some(e) = rack_problem {
            return Err(e);
        }
    } else if let Some(e) = &rack_problem {
        eprintln!(
            "exactl: warning: {e}; stopping the daemons recorded in {}",
            layout.run_dir().display()
        );
    }

    for d in &targets {
        if let Err(e) = process::signal(d.pid, libc::SIGTERM) {
            eprintln!("exactl: cannot signal {} (pid {}): {e}", d.node, d.pid);
        }
    }
    let t0 = Instant::now();
    let alive = |ts: &[process::Daemon]| -> Vec<process::Daemon> {
        ts.iter()
            .filter(|d| process::is_alive(d.pid))
            .cloned()
            .collect()
    };
    let mut left = alive(&targets);
    if !left.is_empty() {
        eprintln!("exactl: stopping {} daemons...", targets.len());
    }
    while !left.is_empty() && t0.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(50));
        left = alive(&left);
    }
    let mut killed = 0;
    if !left.is_empty() {
        for d in &left {
            // Re-check: the pid may have been recycled after the daemon exited.
            if process::is_our_daemon(d.pid, &d.node, dir) {
                let _ = process::signal(d.pid, libc::SIGKILL);
                killed += 1;
            }
        }
        let t1 = Instant::now();
        while !left.is_empty() && t1.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(50));
            left = alive(&left);
        }
    }
    let survivors: HashSet<&str> = left.iter().map(|d| d.node.as_str()).collect();
    for node in &known {
        if survivors.contains(node.as_str()) {
            continue;
        }
        for p in [layout.pid_file(node), layout.control_socket(node)] {
            if let Err(e) = process::remove_if_present(&p) {
                eprintln!("exactl: cannot remove {}: {e}", p.display());
            }
        }
    }
    // The host's memory budget and its ledger belong to the rack's daemons: gone with the
    // last of them (the next `rack up` measures the host again).
    if left.is_empty() {
        for p in [layout.memory_budget(), layout.memory_ledger()] {
            if let Err(e) = process::remove_if_present(&p) {
                eprintln!("exactl: cannot remove {}: {e}", p.display());
            }
        }
    }
    let place = rack
        .as_ref()
        .map(|r| format!("rack {:?} ({})", r.file.name, dir.display()))
        .unwrap_or_else(|| format!("rack {}", dir.display()));
    if !left.is_empty() {
        return Err(CliError::Failed(format!(
            "{} daemon(s) of {place} did not stop even after SIGKILL: {}",
            left.len(),
            left.iter()
                .map(|d| format!("{} (pid {})", d.node, d.pid))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let stopped = targets.len() + asked;
    if stopped == 0 {
        crate::stdout::outln!("nothing was running in {place}");
    } else {
        let forced = if killed > 0 {
            format!(
                " ({killed} did not stop within {} s and were killed)",
                timeout.as_secs_f64()
            )
        } else {
            String::new()
        };
        crate::stdout::outln!(
            "stopped {stopped} daemon(s) of {place} in {:.1} s{forced}",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("exactl-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn new_rack_with_base_port_numbers_links_then_metrics() {
        let d = tmp("base");
        let opts = UpOptions {
            shape: Some("1x1x1".parse().unwrap()),
            base_port: Some(30000),
            ..UpOptions::default()
        };
        let (rack, file) = prepare_rack(&d, &opts).unwrap();
        assert!(file.is_some());
        let e = rack.entry(NodeId(3));
        assert_eq!(e.link, "127.0.0.1:30003");
        assert_eq!(e.metrics, "127.0.0.1:30007");
        assert!(!d.exists(), "prepare_rack writes nothing");
    }

    #[test]
    fn bad_options_are_usage_errors() {
        let d = tmp("bad");
        let shape = Some("4x4x2".parse().unwrap());
        for opts in [
            UpOptions {
                shape,
                base_port: Some(65500),
                ..UpOptions::default()
            },
            UpOptions {
                window: Some(10),
                ..UpOptions::default()
            },
            UpOptions {
                link_timeout: Some(2),
                ..UpOptions::default()
            },
            UpOptions {
                link_timeout: Some(601),
                ..UpOptions::default()
            },
            UpOptions {
                name: Some("a b".into()),
                ..UpOptions::default()
            },
            UpOptions {
                name: Some(String::new()),
                ..UpOptions::default()
            },
            UpOptions {
                shape: Some("26x26x6".parse().unwrap()),
                ..UpOptions::default()
            },
            UpOptions {
                shape: Some("26x26x6".parse().unwrap()),
                base_port: Some(1000),
                ..UpOptions::default()
            },
        ] {
            let e = prepare_rack(&d, &opts).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        assert!(!d.exists());
    }

    #[test]
    fn existing_rack_refuses_contradicting_options() {
        let d = tmp("exist");
        std::fs::create_dir_all(&d).unwrap();
        let opts = UpOptions {
            shape: Some("1x1x1".parse().unwrap()),
            base_port: Some(31000),
            ..UpOptions::default()
        };
        let (_, file) = prepare_rack(&d, &opts).unwrap();
        rack::write_rack_file(&d, &file.unwrap()).unwrap();
        // Same options, or none: accepted.
        assert!(prepare_rack(&d, &opts).unwrap().1.is_none());
        assert!(prepare_rack(&d, &UpOptions::default()).unwrap().1.is_none());
        for (opts, what) in [
            (
                UpOptions {
                    shape: Some("2x2x1".parse().unwrap()),
                    ..UpOptions::default()
                },
                "shape 1x1x1, not 2x2x1",
            ),
            (
                UpOptions {
                    base_port: Some(32000),
                    ..UpOptions::default()
                },
                "--base-port 32000",
            ),
            (
                UpOptions {
                    window: Some(100_000),
                    ..UpOptions::default()
                },
                "window",
            ),
            (
                UpOptions {
                    name: Some("other".into()),
                    ..UpOptions::default()
                },
                "name",
            ),
            (
                UpOptions {
                    link_timeout: Some(30),
                    ..UpOptions::default()
                },
                "link timeout",
            ),
        ] {
            let e = prepare_rack(&d, &opts).unwrap_err().to_string();
            assert!(e.contains(what) && e.contains("rack down"), "{e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn default_name_is_the_directory_name() {
        assert_eq!(default_rack_name(Path::new("/x/my-rack")), "my-rack");
        assert_eq!(default_rack_name(Path::new("/")), "exanet-rack");
        assert_eq!(default_rack_name(Path::new("/x/has space")), "exanet-rack");
    }
}
