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

pub const SERVICE_NAME: &str = "exanet-ip";
pub const SERVICE_ENV: &str = "EXANET_IP";

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
/// when one node's daemon found another's files). It lies in the system's temporary
/// directory, so that it stays short enough for the Unix sockets programs put in it,
/// and is world-writable and sticky as `/tmp` is, since jobs of other users run there.
///
/// Root's commands write wherever it is, so it must never be anything another user
/// controls. A fixed name there could be taken first (a directory of theirs, or a link):
/// each `rack up` makes it afresh under a name no one can predict (`mkdtemp`,
/// `exanet-RACK-NODE.XXXXXX`), records the name in the rack's run directory, and every
/// use checks it again ([`node_tmp_dir`]).
fn tmp_record(layout: &Layout, node: &str) -> PathBuf {
    layout.ip_run_dir().join(format!("{node}.{TMP_RECORD}"))
}

const TMP_RECORD: &str = "tmpdir";

/// Where the nodes' temporary directories go: the temporary directory, or, run on a node
/// (mpirun's agent is `exactl exec` started on the first node, whose TMPDIR is that
/// node's directory), beside it rather than inside it.
fn tmp_base(rack: &Rack) -> PathBuf {
    let mut base = std::env::temp_dir();
    let ours = format!("exanet-{}-", rack.file.name);
    if base
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(&ours))
    {
        base.pop();
    }
    base
}

/// Refuses a base directory in which another user could move the node's directory away
/// and put something of theirs at its name after it was checked (a TMPDIR handed out is a
/// path, used long after): every directory on the way must be root's or this user's, and
/// writable by no one else unless sticky, as `/tmp` is.
fn check_base(base: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let canon = base
        .canonicalize()
        .map_err(|e| CliError::io("find", base, e))?;
    let me = nix::unistd::geteuid().as_raw();
    for dir in canon.ancestors() {
        let m = std::fs::symlink_metadata(dir).map_err(|e| CliError::io("inspect", dir, e))?;
        let shared = m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0;
        if (m.uid() != 0 && m.uid() != me) || shared {
            return Err(CliError::Failed(format!(
                "{} cannot hold the nodes' temporary directories: {} (owned by {}, mode {:o}) \
                 lets others than root and {} replace what is made in it; set TMPDIR to a \
                 directory only root or you can write to, or a sticky one such as /tmp",
                base.display(),
                dir.display(),
                crate::process::owner(m.uid()),
                m.mode() & 0o7777,
                crate::process::owner(me)
            )));
        }
    }
    Ok(canon)
}

/// What is at a node directory's path, looked at through a descriptor opened without
/// following a link, so what is judged is what is there.
enum Found {
    Gone,
    /// A directory of this user's, mode 1777, as exactl made it.
    Ours,
    /// Anything else, said for a message.
    Not(String),
}

fn inspect(path: &Path) -> Result<Found> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path);
    let dir = match opened {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Gone),
        // ELOOP: a link (O_NOFOLLOW); ENOTDIR: something else.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            let what = match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_symlink() => {
                    format!(
                        "a symbolic link owned by {}",
                        crate::process::owner(m.uid())
                    )
                }
                Ok(m) => format!(
                    "not a directory (owned by {})",
                    crate::process::owner(m.uid())
                ),
                Err(_) => "not a directory".to_string(),
            };
            return Ok(Found::Not(what));
        }
        Err(e) => return Err(CliError::io("open", path, e)),
    };
    let m = dir
        .metadata()
        .map_err(|e| CliError::io("inspect", path, e))?;
    let me = nix::unistd::geteuid().as_raw();
    Ok(if m.uid() != me {
        Found::Not(format!(
            "owned by {}, not by {}",
            crate::process::owner(m.uid()),
            crate::process::owner(me)
        ))
    } else if m.mode() & 0o7777 != 0o1777 {
        Found::Not(format!(
            "of mode {:o}, not the 1777 exactl made it with (owned by {})",
            m.mode() & 0o7777,
            crate::process::owner(m.uid())
        ))
    } else {
        Found::Ours
    })
}

/// The path a record names, if it is one of exactl's node directories
/// (`/…/exanet-RACK-NODE.XXXXXX`): a record never sends a removal or a command anywhere
/// else.
fn read_record(record: &Path, node: &str) -> Result<Option<PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = match std::fs::read(record) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CliError::io("read", record, e)),
    };
    let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(text));
    let named = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        n.starts_with("exanet-")
            && n.rsplit_once('.')
                .is_some_and(|(head, tail)| head.ends_with(&format!("-{node}")) && tail.len() == 6)
    });
    if !path.is_absolute() || !named {
        return Err(CliError::Failed(format!(
            "{} does not name a temporary directory of node {node} ({}); remove it",
            record.display(),
            path.display()
        )));
    }
    Ok(Some(path))
}

/// Writes a record whole or not at all.
fn write_record(record: &Path, dir: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let tmp = record.with_extension(format!("{TMP_RECORD}.{}", std::process::id()));
    let mut text = dir.as_os_str().as_bytes().to_vec();
    text.push(b'\n');
    std::fs::write(&tmp, text).map_err(|e| CliError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, record).map_err(|e| CliError::io("rename into place", record, e))
}

/// Held while the records are read and changed: `exactl exec` on a node may make its
/// directory again while another does, or while `rack down` removes them.
fn lock_records(layout: &Layout) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = layout.ip_run_dir().join("tmpdirs.lock");
    let file = process::open_private_lock(&path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| CliError::io("lock", &path, e.into()))
}

/// Makes a new directory for `node` in `base` (checked by [`check_base`]) and records it.
fn create_node_tmp_dir(layout: &Layout, rack: &Rack, node: &str, base: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let template = base.join(format!("{}.XXXXXX", netns_name(rack, node)));
    // 0700 and a fresh name, refused if anything is there: nothing of anyone else's.
    let dir =
        nix::unistd::mkdtemp(&template).map_err(|e| CliError::io("create", &template, e.into()))?;
    // Opened without following a link, so the mode is set on what was made.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&dir)
        .map_err(|e| CliError::io("open", &dir, e))?;
    let m = f.metadata().map_err(|e| CliError::io("inspect", &dir, e))?;
    if m.uid() != nix::unistd::geteuid().as_raw() {
        return Err(CliError::Failed(format!(
            "{} was replaced as it was made (now owned by {})",
            dir.display(),
            crate::process::owner(m.uid())
        )));
    }
    f.set_permissions(std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| CliError::io("set the mode of", &dir, e))?;
    write_record(&tmp_record(layout, node), &dir)?;
    Ok(dir)
}

/// The node's temporary directory for a command of this user's: the one `rack up` made,
/// after checking that it is still a directory (not a link) of this user's, mode 1777, in
/// a base no one else can replace it in; made again if it is gone (a temporary-file
/// cleaner's age limit). Anything else is refused, naming the path and its owner.
pub fn node_tmp_dir(rack: &Rack, node: &str) -> Result<PathBuf> {
    let layout = rack.layout();
    let _held = lock_records(&layout)?;
    let record = tmp_record(&layout, node);
    let Some(dir) = read_record(&record, node)? else {
        // A rack brought up by an exactl that kept no record.
        let base = check_base(&tmp_base(rack))?;
        return create_node_tmp_dir(&layout, rack, node, &base);
    };
    let base = check_base(dir.parent().unwrap_or(Path::new("/")))?;
    match inspect(&dir)? {
        Found::Ours => Ok(dir),
        Found::Gone => create_node_tmp_dir(&layout, rack, node, &base),
        Found::Not(what) => Err(CliError::Failed(format!(
            "{}, the temporary directory of {node}, is {what}: it is not handed to commands \
             as TMPDIR; `exactl rack down` and `rack up` make a new one",
            dir.display()
        ))),
    }
}

/// Removes the node directories the rack's records name (a rack that was not taken down
/// left them, or this one's at `rack down`). Whatever cannot be removed, or is no longer a
/// directory of this user's, is left and reported (on standard error), naming the path and
/// its owner: it is never used again (a node's directory is made afresh under a name no
/// one can take first), and never silently. A directory of ours that cannot be emptied
/// is reported and left; it does not keep the rack from coming up or going down: anyone may write into a node's directory (mode 1777),
/// and a chain too deep to remove would otherwise have kept root's racks down for good.
/// Only what keeps the records themselves from being read or removed is an error.
fn remove_node_tmp_dirs(layout: &Layout) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let run = layout.ip_run_dir();
    let Ok(entries) = std::fs::read_dir(&run) else {
        return Ok(());
    };
    let _held = lock_records(layout)?;
    let mut problems = Vec::new();
    for e in entries.flatten() {
        let record = e.path();
        if record.extension().is_none_or(|x| x != TMP_RECORD) {
            continue;
        }
        let Some(node) = record
            .file_stem()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let dir = match read_record(&record, &node) {
            Ok(Some(dir)) => dir,
            Ok(None) => continue,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        let removed = match inspect(&dir) {
            Ok(Found::Gone) => Ok(()),
            Ok(Found::Ours) => std::fs::remove_dir_all(&dir).map_err(|e| {
                let whose = std::fs::symlink_metadata(&dir)
                    .map(|m| format!(", owned by {}", crate::process::owner(m.uid())))
                    .unwrap_or_default();
                format!(
                    "cannot remove {} (the former temporary directory of {node}{whose}): \
                     {e}; left as it is and never used again (each rack up makes a new \
                     one): remove it yourself",
                    dir.display()
                )
            }),
            Ok(Found::Not(what)) => {
                // Not ours any more: nothing to remove, and the record is done with.
                eprintln!(
                    "exactl: warning: {}, recorded as the former temporary directory of \
                     {node}, is {what}: left as it is, never used again",
                    dir.display()
                );
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        };
        match removed {
            Ok(()) => {
                if let Err(e) = process::remove_if_present(&record) {
                    problems.push(CliError::io("remove", &record, e).to_string());
                }
            }
            Err(w) => eprintln!("exactl: warning: {w}"),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(problems.join("; ")))
    }
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
    // What a rack that was not taken down left goes first (what cannot go is reported
    // and left, never used again).
    remove_node_tmp_dirs(&layout)?;
    let tmp_base = check_base(&tmp_base(rack))?;
    crate::node_host::write_hosts_file(rack)?;
    std::fs::write(on_marker(&layout), b"")
        .map_err(|e| CliError::io("write", on_marker(&layout), e))?;
    for id in shape.node_ids() {
        if crate::interrupt::raised() {
            return Err(CliError::Failed(
                "interrupted while starting the IP services".into(),
            ));
        }
        let node = shape.display(id);
        // A namespace left by a rack that was not taken down would hold a stale device.
        ensure_netns(rack, &node, true)?;
        create_node_tmp_dir(&layout, rack, &node, &tmp_base)?;
        // A count left by an earlier run of the rack is not this one's.
        let count = restarts_file(&layout, &node);
        process::remove_if_present(&count).map_err(|e| CliError::io("remove", &count, e))?;
        let child = spawn_node(rack, &layout, &binary, &node, 0)?;
        children.push((node, child));
    }
    let deadline = Instant::now() + timeout;
    for (node, child) in children.iter_mut() {
        wait_ready(&layout, node, child, deadline, timeout)?;
    }
    Ok(())
}

/// Waits until the service `child` of `node` has written its ready file; fails when it
/// exits, on Ctrl-C, or at `deadline` (`timeout` after the start, for the message).
fn wait_ready(
    layout: &Layout,
    node: &str,
    child: &mut Child,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    loop {
        match poll_start(layout, node, child) {
            Start::Ready => return Ok(()),
            Start::Exited(e) => return Err(e),
            Start::Pending => {}
        }
        if crate::interrupt::raised() {
            return Err(CliError::Failed(format!(
                "interrupted while waiting for the IP service of {node}"
            )));
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "the IP service of {node} is not up after {timeout:?}; its log:\n{}",
                process::tail_of(&log_file(layout, node), 10)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where a service being started is.
pub enum Start {
    /// Its device is up: it wrote its ready file.
    Ready,
    /// It exited before that; the error says how, with the end of its log.
    Exited(CliError),
    Pending,
}

/// Whether the service `child` of `node`, just spawned, is ready, gone, or neither yet.
pub fn poll_start(layout: &Layout, node: &str, child: &mut Child) -> Start {
    if ready_file(layout, node).exists() {
        return Start::Ready;
    }
    match child.try_wait() {
        Ok(Some(st)) => Start::Exited(CliError::Failed(format!(
            "the IP service of {node} exited ({st}); its log:\n{}",
            process::tail_of(&log_file(layout, node), 10)
        ))),
        _ => Start::Pending,
    }
}

/// `run/ip/on`: this rack runs IP services (written by `rack up` before it starts them,
/// gone with the rest of `run/ip` at `rack down`). Status and the supervisor go by it.
fn on_marker(layout: &Layout) -> PathBuf {
    layout.ip_run_dir().join("on")
}

/// Whether the local rack in `layout` runs IP services.
pub fn enabled(layout: &Layout) -> bool {
    on_marker(layout).exists()
}

/// Forgets that the rack ran IP services (a `rack up` without them, after a `rack down`
/// that could not remove everything of the last run's).
pub fn forget_enabled(layout: &Layout) -> Result<()> {
    let m = on_marker(layout);
    process::remove_if_present(&m).map_err(|e| CliError::io("remove", &m, e))
}

/// `run/ip/NODE.restarts`: how many times the supervisor started the node's service again
/// after it died on its own, and when it last did (unix seconds): `2 1796615655`.
fn restarts_file(layout: &Layout, node: &str) -> PathBuf {
    layout.ip_run_dir().join(format!("{node}.restarts"))
}

/// The supervisor's restarts of a node's service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restarts {
    pub count: u64,
    /// Unix seconds of the last one.
    pub last: Option<u64>,
}

/// What `run/ip/NODE.restarts` says (nothing: no restart). A damaged file reads as none:
/// it is a count for people, and nothing depends on it.
pub fn restarts(layout: &Layout, node: &str) -> Restarts {
    restarts_at(&restarts_file(layout, node))
}

/// A count of restarts kept in `path` (`COUNT UNIX_SECONDS`), or none.
pub fn restarts_at(path: &Path) -> Restarts {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut words = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    Restarts {
        count: words.next().flatten().unwrap_or(0),
        last: words.next().flatten(),
    }
}

/// Records one more restart of `node`'s service, whole or not at all.
pub fn count_restart(layout: &Layout, node: &str, count: u64) -> Result<()> {
    count_restart_at(&restarts_file(layout, node), count)
}

/// Records `count` restarts in `path`, whole or not at all.
pub fn count_restart_at(path: &Path, count: u64) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let tmp = path.with_extension(format!("restarts.{}", std::process::id()));
    std::fs::write(&tmp, format!("{count} {now}\n")).map_err(|e| CliError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| CliError::io("rename into place", path, e))
}

/// The lock whoever starts or stops a node's service holds meanwhile (`run/ip/NODE.lock`):
/// the supervisor and `exactl node` would otherwise both start one, and the second would
/// find the node's rank and device taken. `wait`: how long to wait for it; `None`: not
/// at all (`Ok(None)` when someone holds it).
pub fn lock_node(
    layout: &Layout,
    node: &str,
    wait: Option<Duration>,
) -> Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    use nix::fcntl::{Flock, FlockArg};
    let path = layout.ip_run_dir().join(format!("{node}.lock"));
    let mut file = process::open_private_lock(&path)?;
    let t0 = Instant::now();
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(Some(held)),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                let Some(wait) = wait else { return Ok(None) };
                if t0.elapsed() >= wait {
                    return Err(CliError::Failed(format!(
                        "{} is still held after {wait:?}: another exactl (or the rack's \
                         supervisor) is starting or stopping the IP service of {node}",
                        path.display()
                    )));
                }
                file = f;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err((_, e)) => return Err(CliError::io("lock", &path, e.into())),
        }
    }
}

/// What the pid file of `node`'s service says: its pid and binary (the binary absent in
/// files of older exactls).
fn read_service_pid_file(layout: &Layout, node: &str) -> Option<(i32, Option<PathBuf>)> {
    let text = std::fs::read_to_string(pid_file(layout, node)).ok()?;
    let mut lines = text.lines();
    let pid = lines.next()?.trim().parse::<i32>().ok()?;
    Some((pid, lines.next().map(PathBuf::from)))
}

/// The service of `node` as its pid file shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceProcess {
    Running {
        pid: i32,
        stopped: bool,
    },
    /// Not running; why (`pid 1234 exited`, `no pid file`).
    Gone(String),
}

/// Whether `node`'s service runs (and is stopped by SIGSTOP), from its pid file.
pub fn service_process(layout: &Layout, node: &str) -> ServiceProcess {
    match read_service_pid_file(layout, node) {
        None => ServiceProcess::Gone(format!("no pid file {}", pid_file(layout, node).display())),
        Some((pid, binary)) if is_service(pid, binary.as_deref()) => ServiceProcess::Running {
            pid,
            stopped: process::is_stopped(pid),
        },
        Some((pid, _)) => ServiceProcess::Gone(format!("pid {pid} exited")),
    }
}

/// The pid of `node`'s running service, if it runs.
pub fn service_pid(layout: &Layout, node: &str) -> Option<i32> {
    match service_process(layout, node) {
        ServiceProcess::Running { pid, .. } => Some(pid),
        ServiceProcess::Gone(_) => None,
    }
}

/// Makes `node`'s namespace with its loopback up; `fresh`: anew even if it exists (at
/// `rack up`), otherwise only when missing, so that what runs on the node keeps it.
pub fn ensure_netns(rack: &Rack, node: &str, fresh: bool) -> Result<()> {
    let ns = netns_name(rack, node);
    if fresh {
        let _ = ip(&["netns", "del", &ns]);
    } else if netns_path(rack, node).exists() {
        return Ok(());
    }
    ip(&["netns", "add", &ns])?;
    ip(&["-n", &ns, "link", "set", "lo", "up"])
}

/// Starts `node`'s service detached (its own process group, in `/`, its log appended to)
/// and writes its pid file; `restarts`: how many times it was restarted before, for its
/// metrics. The caller waits for its ready file ([`poll_start`]).
pub fn spawn_node(
    rack: &Rack,
    layout: &Layout,
    binary: &Path,
    node: &str,
    restarts: u64,
) -> Result<Child> {
    let ready = ready_file(layout, node);
    process::remove_if_present(&ready).map_err(|e| CliError::io("remove", &ready, e))?;
    let log = log_file(layout, node);
    let (out, err) = process::open_log(&log, &format!("the IP service of {node}"))?;
    let child = Command::new(binary)
        .arg("--rack")
        .arg(&layout.dir)
        .arg("--node")
        .arg(node)
        .arg("--netns")
        .arg(netns_path(rack, node))
        .arg("--dev")
        .arg(crate::node_host::DEVICE)
        // A port the kernel picks (ephemeral): never one of a rack's, which are drawn
        // below the ephemeral range and bound only when their daemon starts.
        .arg("--metrics")
        .arg("127.0.0.1:0")
        .arg("--ready-file")
        .arg(&ready)
        .arg("--restarts")
        .arg(restarts.to_string())
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|source| CliError::Spawn {
            node: format!("{node} (IP service)"),
            binary: binary.to_path_buf(),
            source,
        })?;
    let pid = pid_file(layout, node);
    // The binary too: `stop` signals only a process still running it.
    if let Err(e) = std::fs::write(&pid, format!("{}\n{}\n", child.id(), binary.display())) {
        // A service without its pid file is one no later command would find to stop.
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        return Err(CliError::io("write the pid file", &pid, e));
    }
    Ok(child)
}

/// How long `exactl node restart` waits for the node's service.
const NODE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a service that exits at once is started again while its new daemon starts.
const NODE_START_ATTEMPTS: u32 = 5;

/// Starts `node`'s service again (its namespace made if missing), once its daemon has
/// just been started: the daemon may not accept workloads yet, so a service that exits
/// at once is started again, a few times. The caller holds [`lock_node`]. Returns the
/// service's pid.
pub fn start_node(rack: &Rack, node: &str) -> Result<u32> {
    let layout = Layout::new(&rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone()));
    let binary = process::helper_binary(SERVICE_ENV, SERVICE_NAME)?;
    ensure_netns(rack, node, false)?;
    let deadline = Instant::now() + NODE_START_TIMEOUT;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut child = spawn_node(rack, &layout, &binary, node, restarts(&layout, node).count)?;
        match wait_ready(&layout, node, &mut child, deadline, NODE_START_TIMEOUT) {
            Ok(()) => return Ok(child.id()),
            Err(e) if attempt >= NODE_START_ATTEMPTS || Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
            Err(_) => {
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100 << attempt.min(4)));
            }
        }
    }
}

/// Stops `node`'s service if it runs (SIGTERM; SIGKILL after `timeout`); its pid, if it
/// ran. The caller holds [`lock_node`].
pub fn stop_node(layout: &Layout, node: &str, timeout: Duration) -> Option<i32> {
    let pid = service_pid(layout, node)?;
    // A stopped process cannot act on SIGTERM.
    let _ = process::signal(pid, libc::SIGCONT);
    let _ = process::signal(pid, libc::SIGTERM);
    let t0 = Instant::now();
    while process::is_alive(pid) && t0.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(20));
    }
    if process::is_alive(pid) {
        let _ = process::signal(pid, libc::SIGKILL);
        let t1 = Instant::now();
        while process::is_alive(pid) && t1.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Some(pid)
}

/// Sends `sig` to `node`'s service if it runs; its pid, if it does.
pub fn signal_node(layout: &Layout, node: &str, sig: libc::c_int) -> Result<Option<i32>> {
    let Some(pid) = service_pid(layout, node) else {
        return Ok(None);
    };
    process::signal(pid, sig).map_err(|e| {
        CliError::Failed(format!(
            "cannot signal the IP service of {node} (pid {pid}): {e}"
        ))
    })?;
    Ok(Some(pid))
}

/// Stops the services and removes the namespaces (those of `rack`'s nodes, if known).
pub fn stop(layout: &Layout, rack: Option<&Rack>, timeout: Duration) {
    let dir = layout.ip_run_dir();
    let mut pids = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let p = e.path();
            let node = p.file_stem().and_then(|n| n.to_str());
            if let (true, Some(node)) = (p.extension().is_some_and(|x| x == "pid"), node) {
                let found = read_service_pid_file(layout, node);
                if let Some((pid, _)) = found.filter(|(pid, bin)| is_service(*pid, bin.as_deref()))
                {
                    // A paused node's service cannot act on SIGTERM until it runs again.
                    let _ = process::signal(pid, libc::SIGCONT);
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
        }
    }
    // Once nothing runs on the nodes, which may have been writing there. What cannot be
    // removed is reported here, once, and left: it is never used again.
    let tmp = remove_node_tmp_dirs(layout);
    if let Err(e) = &tmp {
        eprintln!("exactl: {e}");
    }
    if left == 0 && tmp.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory of this test's, removed when dropped.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("exactl-ipsvc-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn only_a_real_sticky_directory_of_ours_is_handed_out() {
        let s = Scratch::new("inspect");
        let dir = s.0.join("exanet-r-M1QAF1.abcdef");
        assert!(matches!(inspect(&dir).unwrap(), Found::Gone));
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o1777);
        assert!(matches!(inspect(&dir).unwrap(), Found::Ours));
        // Not sticky: anyone could swap what a job made there for a link.
        chmod(&dir, 0o777);
        let Found::Not(why) = inspect(&dir).unwrap() else {
            panic!("a 0777 directory was taken")
        };
        assert!(why.contains("mode 777"), "{why}");
        let link = s.0.join("exanet-r-M1QAF2.abcdef");
        chmod(&dir, 0o1777);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let Found::Not(why) = inspect(&link).unwrap() else {
            panic!("a link was followed")
        };
        assert!(why.contains("symbolic link owned by uid"), "{why}");
        let file = s.0.join("exanet-r-M1QAF3.abcdef");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(inspect(&file).unwrap(), Found::Not(_)));
    }

    #[test]
    fn a_base_others_may_write_to_is_refused() {
        let s = Scratch::new("base");
        chmod(&s.0, 0o777);
        let e = check_base(&s.0).unwrap_err().to_string();
        assert!(
            e.contains(&s.0.display().to_string()) && e.contains("mode 777"),
            "{e}"
        );
        chmod(&s.0, 0o1777);
        assert_eq!(check_base(&s.0).unwrap(), s.0.canonicalize().unwrap());
    }

    #[test]
    fn a_record_names_a_node_directory_or_nothing() {
        let s = Scratch::new("record");
        let record = s.0.join("M1QAF1.tmpdir");
        assert!(read_record(&record, "M1QAF1").unwrap().is_none());
        let dir = s.0.join("exanet-r-M1QAF1.Ab3dEf");
        write_record(&record, &dir).unwrap();
        assert_eq!(read_record(&record, "M1QAF1").unwrap(), Some(dir));
        // Never a removal or a TMPDIR elsewhere, whatever the record says.
        for elsewhere in [
            "/etc",
            "/tmp",
            "relative/exanet-r-M1QAF1.Ab3dEf",
            "/tmp/exanet-r-M1QAF2.Ab3dEf",
        ] {
            write_record(&record, Path::new(elsewhere)).unwrap();
            let e = read_record(&record, "M1QAF1").unwrap_err().to_string();
            assert!(e.contains(elsewhere), "{e}");
        }
    }
}
