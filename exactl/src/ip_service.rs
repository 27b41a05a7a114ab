//! IP over ExaNet on a local rack: every node gets a network namespace of its own
//! (`exanet-RACK-NODE`, made by `rack up`, removed by `rack down`) holding its TUN device,
//! served by an `exanet-ip` process per node. The namespaces have loopback and the
//! rack's subnet and no other route: nothing in them can reach outside the rack.
//!
//! It needs root (namespaces, TUN devices), `/dev/net/tun`, iproute2's `ip` and the
//! `exanet-ip` binary; without one of them `rack up` says so in one line and the rack runs
//! without IP.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exanet_control::rack::{Layout, Rack};

use crate::error::{CliError, Result};
use crate::process;

const SERVICE_NAME: &str = "exanet-ip";
const SERVICE_ENV: &str = "EXANET_IP";

fn pid_file(layout: &Layout, node: &str) -> PathBuf {
    layout.ip_run_dir().join(format!("{node}.pid"))
}

fn ready_file(layout: &Layout, node: &str) -> PathBuf {
    layout.ip_run_dir().join(format!("{node}.ready"))
}

fn log_file(layout: &Layout, node: &str) -> PathBuf {
    layout.log_dir().join(format!("{node}.ip.log"))
}

/// The node's network namespace: named after the rack and the node.
pub fn netns_name(rack: &Rack, node: &str) -> String {
    format!("exanet-{}-{node}", rack.file.name)
}

/// Where `ip netns` keeps it.
pub fn netns_path(rack: &Rack, node: &str) -> PathBuf {
    Path::new("/run/netns").join(netns_name(rack, node))
}

/// The node's own temporary directory (`TMPDIR` of what `exactl exec` runs there): nodes
/// are separate hosts, and programs that keep per-host state under the temporary
/// directory, keyed by the host name that every namespace shares, must not meet another
/// node's (Open MPI's session directory and PMIx's shared-memory store did, and a job hung
/// when one node's daemon found another's files). Named like the namespace, beside it in
/// the system's temporary directory, so that it stays short enough for the Unix sockets
/// programs put in it.
pub fn node_tmp_dir(rack: &Rack, node: &str) -> PathBuf {
    let mut base = std::env::temp_dir();
    // Run on a node (mpirun's agent is `exactl exec` started on the first node), TMPDIR
    // is that node's directory; the others are beside it, not inside it.
    let ours = format!("exanet-{}-", rack.file.name);
    if base
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(&ours))
    {
        base.pop();
    }
    base.join(netns_name(rack, node))
}

/// Makes the node's temporary directory if it is not there, world-writable and sticky as
/// `/tmp` is.
pub fn ensure_node_tmp_dir(rack: &Rack, node: &str) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = node_tmp_dir(rack, node);
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).map_err(|e| CliError::io("create", &dir, e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| CliError::io("set the mode of", &dir, e))?;
    }
    Ok(dir)
}

/// Why IP over ExaNet cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root (network namespaces and TUN devices need it)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun".into());
    }
    if Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        return Some("no `ip` (iproute2)".into());
    }
    if let Err(e) = process::helper_binary(SERVICE_ENV, SERVICE_NAME) {
        return Some(e.to_string());
    }
    None
}

/// Refuses to take namespaces that something still runs in: `start` replaces a node's
/// namespace, and one of that name in use belongs to another rack of the same name (every
/// rack in a directory called `exanet-rack` is named so) or holds what a rack that was not
/// taken down left running. Replacing it would cut those processes off from every network.
pub fn check_namespaces_free(rack: &Rack) -> Result<()> {
    let shape = rack.shape();
    let busy: Vec<String> = shape
        .node_ids()
        .map(|id| shape.display(id))
        .filter(|n| netns_path(rack, n).exists())
        .filter_map(|n| {
            let pids = pids_in_netns(&netns_name(rack, &n));
            (!pids.is_empty()).then(|| {
                let shown: Vec<String> = pids.iter().take(3).map(|p| describe_pid(*p)).collect();
                format!("{} ({})", netns_name(rack, &n), shown.join(", "))
            })
        })
        .collect();
    if busy.is_empty() {
        return Ok(());
    }
    Err(CliError::Failed(format!(
        "the network namespaces of rack {:?} are in use by processes of another rack of that \
         name, or left running by one that was not taken down: {}{}; take that rack down, or \
         start this one with another --name (or in a directory of another name)",
        rack.file.name,
        busy.iter().take(3).cloned().collect::<Vec<_>>().join("; "),
        if busy.len() > 3 {
            format!(" and {} more", busy.len() - 3)
        } else {
            String::new()
        }
    )))
}

/// "pid 123 exanet-ip --rack /x ..." for a message.
fn describe_pid(pid: i32) -> String {
    let cmd = process::cmdline(pid)
        .unwrap_or_default()
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    format!("pid {pid} {cmd}").trim_end().to_string()
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| CliError::Failed(format!("cannot run ip: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Starts a service per node in a fresh namespace and waits until each has its device up.
/// The daemons must be up and must have read the rack file with the service's key.
pub fn start(rack: &Rack, abs_dir: &Path, timeout: Duration) -> Result<()> {
    let mut children = Vec::new();
    let r = start_all(rack, abs_dir, timeout, &mut children);
    if r.is_err() {
        // Nothing half-started stays behind: the services started, their namespaces.
        for (_, c) in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
        stop(&rack.layout(), Some(rack), Duration::from_secs(5));
    }
    r
}

fn start_all(
    rack: &Rack,
    abs_dir: &Path,
    timeout: Duration,
    children: &mut Vec<(String, Child)>,
) -> Result<()> {
    // The service runs in `/`: every path handed to it comes from the absolute directory.
    let layout = Layout::new(abs_dir);
    let shape = rack.shape();
    let binary = process::helper_binary(SERVICE_ENV, SERVICE_NAME)?;
    let dir = layout.ip_run_dir();
    std::fs::create_dir_all(&dir).map_err(|e| CliError::io("create", &dir, e))?;
    crate::node_host::write_hosts_file(rack)?;
    for id in shape.node_ids() {
        if crate::interrupt::raised() {
            return Err(CliError::Failed(
                "interrupted while starting the IP services".into(),
            ));
        }
        let node = shape.display(id);
        let ns = netns_name(rack, &node);
        // A namespace left by a rack that was not taken down would hold a stale device.
        let _ = ip(&["netns", "del", &ns]);
        ip(&["netns", "add", &ns])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let _ = std::fs::remove_dir_all(node_tmp_dir(rack, &node));
        ensure_node_tmp_dir(rack, &node)?;
        let ready = ready_file(&layout, &node);
        process::remove_if_present(&ready).map_err(|e| CliError::io("remove", &ready, e))?;
        let log = log_file(&layout, &node);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| CliError::io("open", &log, e))?;
        let err = out.try_clone().map_err(|e| CliError::io("open", &log, e))?;
        let child = Command::new(&binary)
            .arg("--rack")
            .arg(abs_dir)
            .arg("--node")
            .arg(&node)
            .arg("--netns")
            .arg(netns_path(rack, &node))
            .arg("--dev")
            .arg(crate::node_host::DEVICE)
            // A port the kernel picks (ephemeral): never one of a rack's, which are drawn
            // below the ephemeral range and bound only when their daemon starts.
            .arg("--metrics")
            .arg("127.0.0.1:0")
            .arg("--ready-file")
            .arg(&ready)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|source| CliError::Spawn {
                node: format!("{node} (IP service)"),
                binary: binary.clone(),
                source,
            })?;
        let pid = pid_file(&layout, &node);
        // The binary too: `stop` signals only a process still running it.
        std::fs::write(&pid, format!("{}\n{}\n", child.id(), binary.display()))
            .map_err(|e| CliError::io("write the pid file", &pid, e))?;
        children.push((node, child));
    }
    let deadline = Instant::now() + timeout;
    for (node, child) in children.iter_mut() {
        loop {
            if ready_file(&layout, node).exists() {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                return Err(CliError::Failed(format!(
                    "the IP service of {node} exited ({st}); its log:\n{}",
                    process::tail_of(&log_file(&layout, node), 10)
                )));
            }
            if crate::interrupt::raised() {
                return Err(CliError::Failed(format!(
                    "interrupted while waiting for the IP service of {node}"
                )));
            }
            if Instant::now() > deadline {
                return Err(CliError::Failed(format!(
                    "the IP service of {node} is not up after {timeout:?}; its log:\n{}",
                    process::tail_of(&log_file(&layout, node), 10)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Stops the services and removes the namespaces (those of `rack`'s nodes, if known).
pub fn stop(layout: &Layout, rack: Option<&Rack>, timeout: Duration) {
    let dir = layout.ip_run_dir();
    let mut pids = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pid") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let mut lines = text.lines();
                let pid = lines.next().and_then(|t| t.trim().parse::<i32>().ok());
                let binary = lines.next().map(Path::new);
                if let Some(pid) = pid.filter(|&pid| is_service(pid, binary)) {
                    let _ = process::signal(pid, libc::SIGTERM);
                    pids.push((pid, p));
                }
            }
        }
    }
    let deadline = Instant::now() + timeout;
    while pids.iter().any(|(p, _)| process::is_alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (p, _) in &pids {
        if process::is_alive(*p) {
            let _ = process::signal(*p, libc::SIGKILL);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    // A pid file goes only with its process, so that a later `rack down` still finds it.
    let mut left = 0;
    for (p, file) in &pids {
        if process::is_alive(*p) {
            left += 1;
        } else {
            let _ = std::fs::remove_file(file);
        }
    }
    if left > 0 {
        eprintln!(
            "exactl: {left} IP service(s) did not stop; their pid files stay in {}",
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Some(rack) = rack {
        let shape = rack.shape();
        let nodes: Vec<String> = shape.node_ids().map(|id| shape.display(id)).collect();
        // The node goes away with what still runs on it (a command `exactl exec` started,
        // an MPI job's daemons): deleting the namespace alone would leave them running,
        // cut off from every network.
        let stragglers: Vec<i32> = nodes
            .iter()
            .filter(|n| netns_path(rack, n).exists())
            .flat_map(|n| pids_in_netns(&netns_name(rack, n)))
            .collect();
        if !stragglers.is_empty() {
            eprintln!(
                "exactl: stopping {} process(es) still running on the rack's nodes",
                stragglers.len()
            );
            for &p in &stragglers {
                let _ = process::signal(p, libc::SIGKILL);
            }
        }
        for node in &nodes {
            let ns = netns_name(rack, node);
            if Path::new("/run/netns").join(&ns).exists() {
                if let Err(e) = ip(&["netns", "del", &ns]) {
                    eprintln!("exactl: {e}");
                }
            }
            let _ = std::fs::remove_dir_all(node_tmp_dir(rack, node));
        }
    }
}

/// The processes in a namespace (`ip netns pids`), never this process.
fn pids_in_netns(ns: &str) -> Vec<i32> {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|t| t.parse::<i32>().ok())
        .filter(|&p| p != me)
        .collect()
}

/// Whether `pid` runs the IP service: the binary its pid file names (a recycled pid must
/// not be signalled), or, for a pid file without one, a program named `exanet-ip`.
fn is_service(pid: i32, binary: Option<&Path>) -> bool {
    if pid <= 1 || !process::is_alive(pid) {
        return false;
    }
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    match binary {
        Some(b) => exe == b || std::fs::canonicalize(b).is_ok_and(|b| b == exe),
        None => exe.file_name().is_some_and(|n| n == SERVICE_NAME),
    }
}
