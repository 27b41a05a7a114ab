//! Local daemon processes: finding the `exanetd` binary, starting a daemon detached from
//! the terminal, its pid file, and making sure a pid still belongs to the daemon we think
//! it does before signalling it.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use exanet_control::rack::Layout;

use crate::error::{CliError, Result};

/// Environment variable naming the daemon binary to run.
pub const DAEMON_ENV: &str = "EXANET_DAEMON";
const DAEMON_NAME: &str = "exanetd";

/// The daemon binary: `$EXANET_DAEMON`, else `exanetd` next to this executable, else on
/// `PATH`. The path is made absolute, since daemons run in `/`.
pub fn daemon_binary() -> Result<PathBuf> {
    helper_binary(DAEMON_ENV, DAEMON_NAME)
}

/// A program exactl starts (the daemon, the IP service): `$env`, else `name` next to this
/// executable, else on `PATH`; made absolute, since they run in `/`.
pub fn helper_binary(env: &str, name: &str) -> Result<PathBuf> {
    let p = find_binary(env, name)?;
    std::path::absolute(&p).map_err(|e| CliError::io("resolve", p, e))
}

fn find_binary(env: &str, name: &str) -> Result<PathBuf> {
    if let Some(v) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(CliError::DaemonNotFound(format!(
                "{name}: {env}={} is not an executable file",
                p.display()
            )))
        };
    }
    let exe = std::env::current_exe().ok();
    if let Some(dir) = exe.as_deref().and_then(Path::parent) {
        let p = dir.join(name);
        if is_executable(&p) {
            return Ok(p);
        }
    }
    if let Some(p) = on_path(name) {
        return Ok(p);
    }
    let beside = exe
        .as_deref()
        .and_then(Path::parent)
        .map(|d| format!(", no {name} in {}", d.display()))
        .unwrap_or_default();
    Err(CliError::DaemonNotFound(format!(
        "{name}: {env} is not set{beside}, and none on PATH"
    )))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Starts the daemon of `node`: in a session of its own (so that the terminal's signals and
/// hang-ups do not reach it), stdin from /dev/null, stdout and stderr appended to its log.
/// `rack_dir` must be absolute: the daemon runs in `/`.
/// Opens a background program's log for appending and marks where this start begins;
/// returns it twice, for the program's stdout and stderr.
pub fn open_log(path: &Path, what: &str) -> Result<(std::fs::File, std::fs::File)> {
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| CliError::io("open the log", path, e))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    writeln!(log, "--- exactl: starting {what} (unix time {stamp})")
        .map_err(|e| CliError::io("write the log", path, e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| CliError::io("open the log", path, e))?;
    Ok((log, log2))
}

/// `restarts`: how many times the node's daemon was restarted before (its
/// `exanet_node_restarts_total`).
pub fn spawn_daemon(
    binary: &Path,
    layout: &Layout,
    rack_dir: &Path,
    node: &str,
    restarts: u64,
) -> Result<Child> {
    let log_path = layout.log_file(&node);
    let (log, log2) = open_log(
        &log_path,
        &format!(
            "{} --rack {} --node {node}",
            binary.display(),
            rack_dir.display()
        ),
    )?;
    let mut cmd = Command::new(binary);
    cmd.arg("--rack")
        .arg(rack_dir)
        .arg("--node")
        .arg(node)
        // A session of its own: the terminal's ^C and hang-up do not reach a daemon.
        .arg("--new-session")
        .arg("--restarts")
        .arg(restarts.to_string())
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    let child = cmd.spawn().map_err(|source| CliError::Spawn {
        node: node.to_string(),
        binary: binary.to_path_buf(),
        source,
    })?;
    let pid_path = layout.pid_file(&node);
    if let Err(e) = std::fs::write(&pid_path, format!("{}\n", child.id())) {
        // A daemon without its pid file is one no later command would find to stop.
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        return Err(CliError::io("write the pid file", &pid_path, e));
    }
    Ok(child)
}

/// The last `lines` lines of a daemon's log (at most the last 8 KB of it).
pub fn log_tail(layout: &Layout, node: &str, lines: usize) -> String {
    tail_of(&layout.log_file(&node), lines)
}

/// The last `lines` non-empty lines of the file at `path`.
pub fn tail_of(path: &Path, lines: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(8192)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A daemon found through its pid file, confirmed to be ours.
#[derive(Clone, Debug)]
pub struct Daemon {
    pub node: String,
    pub pid: i32,
}

/// What a pid file says.
#[derive(Debug)]
pub enum PidFile {
    /// The process is alive and is the exanetd of this node and rack.
    Running(Daemon),
    /// No such process, a dead one, or a pid now used by something else.
    Stale,
    /// The file does not hold a pid.
    Garbage,
}

/// Reads `run/<node>.pid` and checks the process behind it.
pub fn read_pid_file(path: &Path, node: &str, rack_dir: &Path) -> PidFile {
    let Ok(text) = std::fs::read_to_string(path) else {
        return PidFile::Stale;
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return PidFile::Garbage;
    };
    // Never signal process groups (<= 0) or init.
    if pid <= 1 {
        return PidFile::Garbage;
    }
    if is_our_daemon(pid, node, rack_dir) {
        PidFile::Running(Daemon {
            node: node.to_string(),
            pid,
        })
    } else {
        PidFile::Stale
    }
}

/// The names of the nodes that have a pid file in the rack's run directory.
pub fn pid_file_nodes(layout: &Layout) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(layout.run_dir()) else {
        return Vec::new();
    };
    let mut out: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".pid").map(str::to_string)
        })
        .filter(|n| !n.is_empty())
        .collect();
    out.sort();
    out
}

/// The arguments `pid` was started with (`/proc/PID/cmdline`), if it can be read.
pub fn cmdline(pid: i32) -> Option<Vec<OsString>> {
    use std::os::unix::ffi::OsStrExt;
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| std::ffi::OsStr::from_bytes(a).to_os_string())
            .collect(),
    )
}

/// The executable file `name` in a directory of PATH, the first found.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

/// True when `pid` is alive (not a zombie) and runs exanetd for `node` of the rack in
/// `rack_dir`: its command line names an exanetd binary (or script) and `--node <node>`, and its
/// `--rack`, if given, is the same directory. A recycled pid fails this test.
pub fn is_our_daemon(pid: i32, node: &str, rack_dir: &Path) -> bool {
    if !is_alive(pid) {
        return false;
    }
    let Some(args) = cmdline(pid) else {
        return false;
    };
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    cmdline_matches(&args, node, rack_dir, cwd.as_deref())
}

/// The command-line test of [`is_our_daemon`], separated for testing.
pub fn cmdline_matches(args: &[OsString], node: &str, rack_dir: &Path, cwd: Option<&Path>) -> bool {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // The binary is argv[0], or argv[1] when an interpreter runs it.
    let is_exanetd = args.iter().take(2).any(|a| {
        Path::new(a)
            .file_name()
            .is_some_and(|f| f.to_string_lossy().contains(DAEMON_NAME))
    });
    if !is_exanetd {
        return false;
    }
    let value = |flag: &str| -> Option<String> {
        let eq = format!("{flag}=");
        args.iter().enumerate().find_map(|(i, a)| {
            if a == flag {
                args.get(i + 1).cloned()
            } else {
                a.strip_prefix(&eq).map(str::to_string)
            }
        })
    };
    if !value("--node").is_some_and(|n| n.eq_ignore_ascii_case(node)) {
        return false;
    }
    match value("--rack") {
        None => true,
        Some(r) => {
            let r = PathBuf::from(r);
            let r = match (r.is_relative(), cwd) {
                (true, Some(cwd)) => cwd.join(r),
                _ => r,
            };
            same_dir(&r, rack_dir)
        }
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The state letter of `pid` in `/proc/PID/stat` (`R`, `S`, `T`, `Z`...), if it exists.
fn proc_state(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses and may contain anything.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .map(str::to_string)
}

/// True when `pid` exists and is not a zombie.
pub fn is_alive(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| !matches!(s.as_str(), "Z" | "X" | "x"))
}

/// True when `pid` is stopped by a signal (`exactl node pause`'s SIGSTOP), not traced.
pub fn is_stopped(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| s == "T")
}

/// Sends `sig` to `pid`. A process that is already gone is not an error.
pub fn signal(pid: i32, sig: libc::c_int) -> std::io::Result<()> {
    if pid <= 1 {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    let sig = nix::sys::signal::Signal::try_from(sig)?;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Opens (making it, with its directory, if need be) a lock file of this user's alone:
/// mode 0600, never through a link, refused when someone else owns it (root could open
/// it). `flock` needs only an open descriptor, so a lock others could open is a lock
/// others could hold.
pub fn open_private_lock(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| CliError::io("create", dir, e))?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| CliError::io("open", path, e))?;
    let uid = file
        .metadata()
        .map_err(|e| CliError::io("inspect", path, e))?
        .uid();
    if uid != nix::unistd::geteuid().as_raw() {
        return Err(CliError::Failed(format!(
            "{} is not a lock of this user's: it belongs to {}",
            path.display(),
            owner(uid)
        )));
    }
    Ok(file)
}

/// Who `uid` is, for messages: "uid 0 (root)".
pub fn owner(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("uid {uid} ({})", u.name),
        _ => format!("uid {uid}"),
    }
}

/// Removes a file that may not exist.
pub fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn cmdline_must_name_exanetd_the_node_and_the_rack() {
        let tmp = std::env::temp_dir();
        let rack = tmp.to_string_lossy().into_owned();
        let ok = args(&[
            "/x/target/debug/exanetd",
            "--rack",
            &rack,
            "--node",
            "M1QAF2",
        ]);
        assert!(cmdline_matches(&ok, "M1QAF2", &tmp, None));
        assert!(cmdline_matches(&ok, "m1qaf2", &tmp, None));
        assert!(!cmdline_matches(&ok, "M1QAF3", &tmp, None));
        let other_rack = args(&["exanetd", "--rack", "/nonexistent/r", "--node", "M1QAF2"]);
        assert!(!cmdline_matches(&other_rack, "M1QAF2", &tmp, None));
        let not_daemon = args(&["/bin/sleep", "--node", "M1QAF2"]);
        assert!(!cmdline_matches(&not_daemon, "M1QAF2", &tmp, None));
        // A name that merely contains the node's name is not it.
        let longer = args(&["exanetd", "--node", "M1QAF21"]);
        assert!(!cmdline_matches(&longer, "M1QAF2", &tmp, None));
        let eq_form = args(&["exanetd", "--node=M1QAF2"]);
        assert!(cmdline_matches(&eq_form, "M1QAF2", &tmp, None));
        assert!(!cmdline_matches(&[], "M1QAF2", &tmp, None));
    }

    #[test]
    fn relative_rack_is_resolved_against_the_daemon_cwd() {
        let tmp = std::env::temp_dir();
        let parent = tmp.parent().unwrap_or(Path::new("/"));
        let leaf = tmp.file_name().unwrap().to_string_lossy().into_owned();
        let a = args(&["exanetd", "--rack", &leaf, "--node", "M1QAF1"]);
        assert!(cmdline_matches(&a, "M1QAF1", &tmp, Some(parent)));
    }

    #[test]
    fn own_process_is_alive_and_not_a_daemon() {
        let me = std::process::id() as i32;
        assert!(is_alive(me));
        assert!(!is_our_daemon(me, "M1QAF1", Path::new("/")));
        assert!(!is_alive(i32::MAX));
    }

    #[test]
    fn pid_files_with_garbage_or_dangerous_pids_are_refused() {
        let dir = std::env::temp_dir().join(format!("exactl-pidtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("M1QAF1.pid");
        for (text, garbage) in [
            ("abc", true),
            ("-1", true),
            ("1", true),
            ("0", true),
            ("999999999", false),
        ] {
            std::fs::write(&f, text).unwrap();
            let r = read_pid_file(&f, "M1QAF1", &dir);
            match r {
                PidFile::Garbage => assert!(garbage, "{text}"),
                PidFile::Stale => assert!(!garbage, "{text}"),
                PidFile::Running(_) => panic!("{text} cannot be running"),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn signalling_refuses_groups_and_init() {
        assert!(signal(0, 0).is_err());
        assert!(signal(-5, 0).is_err());
        assert!(signal(1, 0).is_err());
    }
}
