//! The README's quick start, run the way its reader runs it: from a fresh directory, with
//! no `--rack` and no `EXANET_RACK`, `exactl` found on PATH, the lines verbatim:
//!
//! ```text
//! exactl rack up
//! exactl status
//! exactl ping M1QAF2 M7QBF3
//! exactl rack down
//! ```
//!
//! as root, which brings IP over ExaNet with it (and then `exactl exec M1QAF2 -- ping`
//! reaches another node's address), and as a normal user, without IP. The shape is the
//! README's default, 4x4x2, since that is what the line starts: 128 daemons, 5 to 20 s
//! to come up from a debug build on a 2-core host; the whole file took 22 s there.
//!
//! And a `rack up` that fails: when a daemon or an IP service dies, or Ctrl-C comes,
//! it stops everything it started and says so; a rack this host cannot hold is refused
//! before anything is written or started.
//!
//! The root tests skip with a SKIPPED line where root, /dev/net/tun, `ip`, `ping` or
//! `useradd` is missing, and fail instead when `EXANET_REQUIRE_IP` (with IP) or
//! `EXANET_REQUIRE_ROOT` (the normal user's) is set, as CI sets them.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use exanet_tests::{bins, is_root, processes_mentioning, run_with_timeout, runs, Run, SystemUser};

/// The README's `exactl rack up` waits 60 s for the links by default; this is how long the
/// test lets it run before calling it stuck.
const UP_LIMIT: Duration = Duration::from_secs(240);
const COMMAND_LIMIT: Duration = Duration::from_secs(60);
/// The rack directory every command finds by default, in the directory it is run in.
const DEFAULT_RACK: &str = "exanet-rack";
/// The user the normal-user run is made under (created and removed by the test).
const USER: &str = "exanet-qs-user";

/// One rack at a time: these racks are large, and two `rack up` at once draw their ports
/// independently.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn turn() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// True when the test must skip (and says so); panics instead when IP is required.
fn skip_without_ip(test: &str) -> bool {
    exanet_tests::skip_without_ip(test, &["ip", "ping"])
}

/// The directory holding exactl, exanetd and exanet-ip, as `cargo build` leaves them.
fn bin_dir() -> PathBuf {
    let b = bins();
    let dir = b.exactl.parent().unwrap().to_path_buf();
    let ip = dir.join("exanet-ip");
    assert!(
        ip.is_file(),
        "{} is missing: `cargo build --workspace` builds it beside exactl",
        ip.display()
    );
    dir
}

/// A fresh directory to run the README in, as `user` (`None`: this process's), with the
/// binaries' directory first on PATH and nothing of exanet's in the environment. Dropping
/// it takes down whatever rack is still up in it and removes it.
struct Scratch {
    dir: PathBuf,
    bin: PathBuf,
    user: Option<(u32, u32)>,
}

impl Scratch {
    fn new(tag: &str, bin: PathBuf, user: Option<(u32, u32)>) -> Scratch {
        let dir = std::env::temp_dir().join(format!("exanet-qs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        Scratch { dir, bin, user }
    }

    /// The rack directory `exactl` picks here by default.
    fn rack(&self) -> PathBuf {
        self.dir.join(DEFAULT_RACK)
    }

    fn command(&self, args: &[&str]) -> Command {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
        );
        let mut c = Command::new("exactl");
        c.args(args)
            .current_dir(&self.dir)
            .env("PATH", path)
            .env("HOME", &self.dir);
        for v in [
            "EXANET_RACK",
            "EXANET_RACK_IP",
            "EXANET_DAEMON",
            "EXANET_IP",
            "EXANET_NODE",
        ] {
            c.env_remove(v);
        }
        if let Some((uid, gid)) = self.user {
            // std drops root's supplementary groups when it sets the uid.
            c.uid(uid).gid(gid);
        }
        c
    }

    #[track_caller]
    fn exactl(&self, args: &[&str], limit: Duration) -> Run {
        run_with_timeout(self.command(args), limit).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Processes still running for the rack in this directory.
    fn leftovers(&self) -> Vec<String> {
        processes_mentioning(&[self.rack().to_string_lossy().into_owned()])
            .into_iter()
            .map(|p| format!("pid {}: {}", p.pid, p.cmdline))
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.rack().join("rack.toml").exists() {
            match run_with_timeout(self.command(&["rack", "down"]), COMMAND_LIMIT) {
                Ok(r) if r.success() => {}
                Ok(r) => eprintln!("cleanup: exactl rack down: {}", r.describe()),
                Err(e) => eprintln!("cleanup: exactl rack down: {e}"),
            }
            for p in processes_mentioning(&[self.rack().to_string_lossy().into_owned()]) {
                if p.pid > 1 {
                    eprintln!("cleanup: killing leftover pid {}: {}", p.pid, p.cmdline);
                    // pid > 1 names one process, found by its command line naming this
                    // test's directory.
                    let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
                }
            }
        }
        if std::thread::panicking() && std::env::var_os("EXANET_E2E_KEEP").is_some() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The network namespaces of the rack named `name` (`exanet-NAME-NODE`).
fn namespaces_of(name: &str) -> Vec<String> {
    let prefix = format!("exanet-{name}-");
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The four README lines after `rack up` has been checked by the caller: status, ping,
/// then (with `ip`) a ping between two nodes' addresses, then rack down; and nothing of
/// the rack is left.
fn status_ping_down(s: &Scratch, ip: bool) {
    let st = s.exactl(&["status"], COMMAND_LIMIT);
    assert!(
        st.success()
            && st
                .stdout
                .contains("128/128 nodes answering, 272/272 links up"),
        "exactl status: {}",
        st.describe()
    );
    let ping = s.exactl(&["ping", "M1QAF2", "M7QBF3"], COMMAND_LIMIT);
    assert!(
        ping.success()
            && ping.stdout.contains("From M1QAF2 to M7QBF3: 6 hops")
            && ping.stdout.contains("3 probes sent, 3 received"),
        "exactl ping M1QAF2 M7QBF3: {}",
        ping.describe()
    );
    if ip {
        let hosts = s.exactl(&["hosts"], COMMAND_LIMIT);
        let addr = hosts
            .stdout
            .lines()
            .find_map(|l| l.strip_suffix("\tM7QBF3"))
            .unwrap_or_else(|| panic!("no M7QBF3 in exactl hosts: {}", hosts.describe()))
            .to_string();
        let p = s.exactl(
            &["exec", "M1QAF2", "--", "ping", "-c", "3", "-W", "5", &addr],
            COMMAND_LIMIT,
        );
        assert!(
            p.success() && p.stdout.contains("3 received"),
            "exactl exec M1QAF2 -- ping -c 3 {addr}: {}",
            p.describe()
        );
    }
    let down = s.exactl(&["rack", "down"], COMMAND_LIMIT);
    assert!(
        down.success() && down.stdout.contains("stopped 128 daemon(s)"),
        "exactl rack down: {}",
        down.describe()
    );
    let left = s.leftovers();
    assert!(left.is_empty(), "still running after rack down: {left:#?}");
    // Again, as a user unsure it worked would: at once, since nothing runs.
    let again = s.exactl(&["rack", "down"], COMMAND_LIMIT);
    assert!(
        again.success()
            && again.stdout.contains("nothing was running")
            && again.elapsed < Duration::from_secs(10),
        "exactl rack down, again: {}",
        again.describe()
    );
    assert!(
        namespaces_of(DEFAULT_RACK).is_empty(),
        "namespaces left after rack down: {:?}",
        namespaces_of(DEFAULT_RACK)
    );
}

/// `size` in `text` written as "N.N GiB" (or MiB, KiB) right before `before`, in bytes.
fn size_before(text: &str, before: &str) -> Option<f64> {
    let head = &text[..text.find(before)?];
    let mut words = head.split_whitespace().rev();
    let unit = words.next()?;
    let value: f64 = words.next()?.trim_start_matches('(').parse().ok()?;
    let scale = match unit {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(value * scale)
}

/// Bytes of the memory registered with the rack's daemons: every memfd they hold, each
/// counted once.
fn registered_bytes(rack: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    for p in processes_mentioning(&[rack.to_string_lossy().into_owned()]) {
        if !p.cmdline.contains("exanetd") {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", p.pid)) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_memfd = std::fs::read_link(fd.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:"));
            if let (true, Ok(m)) = (is_memfd, std::fs::metadata(fd.path())) {
                if seen.insert((m.dev(), m.ino())) {
                    total += m.size();
                }
            }
        }
    }
    total
}

#[test]
fn readme_quick_start_as_root_with_ip() {
    const TEST: &str = "quick_start::readme_quick_start_as_root_with_ip";
    if skip_without_ip(TEST) {
        return;
    }
    if !namespaces_of(DEFAULT_RACK).is_empty() {
        // `rack up` would refuse them, rightly: they are another default rack's.
        exanet_tests::skip_unless_required(
            "EXANET_REQUIRE_IP",
            TEST,
            "a rack named exanet-rack with IP is already running on this host",
        );
        return;
    }
    let _turn = turn();
    let s = Scratch::new("root", bin_dir(), None);
    let t0 = Instant::now();
    let up = s.exactl(&["rack", "up"], UP_LIMIT);
    assert!(up.success(), "exactl rack up: {}", up.describe());
    assert!(
        up.stdout
            .contains("is up: shape 4x4x2, 128 nodes, 272 links up")
            && up.stderr.contains("IP over ExaNet up"),
        "exactl rack up: {}",
        up.describe()
    );
    eprintln!(
        "quick start as root: rack up {:.1} s",
        up.elapsed.as_secs_f64()
    );
    // What rack up said the IP services would register before any node talks, against
    // what they did: its figure is computed the way exanet-ip sizes its buffers, in
    // another crate. (Their rings come as peers first send: none yet.)
    let said = size_before(&up.stderr, "until nodes talk to each other")
        .unwrap_or_else(|| panic!("no registered memory figure: {}", up.describe()));
    let held = registered_bytes(&s.rack()) as f64;
    assert!(
        (said - held).abs() <= 0.03 * held,
        "rack up said {said:.0} bytes would be registered at rest, the daemons hold {held:.0}"
    );
    status_ping_down(&s, true);
    eprintln!(
        "quick start as root: {:.1} s in all",
        t0.elapsed().as_secs_f64()
    );
}

/// Whether others may run `path`: it and every directory above it let them through.
fn others_can_run(path: &Path) -> bool {
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    mode(path) & 0o005 == 0o005 && path.ancestors().skip(1).all(|d| mode(d) & 0o001 != 0)
}

#[test]
fn readme_quick_start_as_a_normal_user() {
    const TEST: &str = "quick_start::readme_quick_start_as_a_normal_user";
    if !is_root() || !runs("useradd", "--help") {
        exanet_tests::skip_unless_required(
            "EXANET_REQUIRE_ROOT",
            TEST,
            "it makes a user to run the quick start as: needs root and useradd",
        );
        return;
    }
    let _turn = turn();
    let user = SystemUser::create(USER).unwrap();
    let (uid, gid) = (user.id("-u"), user.id("-g"));
    let mut bin = bin_dir();
    // A checkout under a private home: the user runs copies, side by side as built.
    let copies = std::env::temp_dir().join(format!("exanet-qs-bin-{}", std::process::id()));
    if !others_can_run(&bin.join("exactl")) {
        std::fs::create_dir_all(&copies).unwrap();
        std::fs::set_permissions(&copies, std::fs::Permissions::from_mode(0o755)).unwrap();
        for b in ["exactl", "exanetd", "exanet-ip"] {
            std::fs::copy(bin.join(b), copies.join(b)).unwrap();
        }
        bin = copies.clone();
    }
    let s = Scratch::new("user", bin, Some((uid, gid)));
    let up = s.exactl(&["rack", "up"], UP_LIMIT);
    assert!(up.success(), "exactl rack up as {USER}: {}", up.describe());
    assert!(
        up.stdout
            .contains("is up: shape 4x4x2, 128 nodes, 272 links up")
            && up.stderr.contains("IP over ExaNet off: not root"),
        "exactl rack up as {USER}: {}",
        up.describe()
    );
    eprintln!(
        "quick start as {USER}: rack up {:.1} s",
        up.elapsed.as_secs_f64()
    );
    // The daemons are the user's, not root's.
    let pid = std::fs::read_to_string(s.rack().join("run/M1QAF1.pid")).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
    let real_uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap();
    assert_eq!(
        real_uid,
        uid.to_string(),
        "M1QAF1's daemon runs as uid {real_uid}"
    );
    status_ping_down(&s, false);
    drop(s);
    let _ = std::fs::remove_dir_all(&copies);
}

/// A stand-in for `real` that fails at once for `node` and runs `real` for the others.
fn failing_for(dir: &Path, name: &str, real: &Path, node: &str) -> PathBuf {
    let script = dir.join(name);
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" {node} \"*) echo \"{name}: failing on purpose\" >&2; exit 7;; esac\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// `rack up` failed with exit 1, said why and that it stopped its daemons, and nothing of
/// the rack runs; the rack directory and its logs stay.
#[track_caller]
fn assert_failed_and_stopped(s: &Scratch, up: &Run, why: &str) {
    assert_eq!(up.code(), Some(1), "exactl rack up: {}", up.describe());
    assert!(
        up.stderr.contains(why)
            && up.stderr.contains("stopped the 4 daemon(s) it had started")
            && up.stderr.contains("nothing of the rack is running"),
        "exactl rack up: {}",
        up.describe()
    );
    let left = s.leftovers();
    assert!(
        left.is_empty(),
        "still running after a failed rack up: {left:#?}"
    );
    let pids: Vec<_> = std::fs::read_dir(s.rack().join("run"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".pid") || n.ends_with(".sock"))
                .collect()
        })
        .unwrap_or_default();
    assert!(pids.is_empty(), "pid files and sockets left: {pids:?}");
    assert!(s.rack().join("logs/M1QAF1.log").is_file());
    let st = s.exactl(&["status"], COMMAND_LIMIT);
    assert!(
        !st.success() && st.stderr.contains("not running"),
        "exactl status after a failed rack up: {}",
        st.describe()
    );
}

#[test]
fn a_rack_up_whose_daemon_dies_stops_the_others() {
    let _turn = turn();
    let b = bins();
    let s = Scratch::new("daemon-fails", bin_dir(), None);
    let fake = failing_for(&s.dir, "exanetd-failing", &b.exanetd, "M1QAF3");
    let mut c = s.command(&["rack", "up", "--shape", "1x1x1", "--ip", "off"]);
    c.env("EXANET_DAEMON", &fake);
    let up = run_with_timeout(c, UP_LIMIT).unwrap();
    assert_failed_and_stopped(&s, &up, "M1QAF3: exit status: 7");
    let log = std::fs::read_to_string(s.rack().join("logs/M1QAF3.log")).unwrap();
    assert!(log.contains("failing on purpose"), "{log}");
}

#[test]
fn a_rack_up_whose_ip_service_dies_stops_everything() {
    const TEST: &str = "quick_start::a_rack_up_whose_ip_service_dies_stops_everything";
    if skip_without_ip(TEST) {
        return;
    }
    let _turn = turn();
    let bin = bin_dir();
    let s = Scratch::new("ip-fails", bin.clone(), None);
    let fake = failing_for(
        &s.dir,
        "exanet-ip-failing",
        &bin.join("exanet-ip"),
        "M1QAF2",
    );
    let name = format!("qs-ip-fails-{}", std::process::id());
    let mut c = s.command(&[
        "rack", "up", "--shape", "1x1x1", "--ip", "on", "--name", &name,
    ]);
    c.env("EXANET_IP", &fake);
    let up = run_with_timeout(c, UP_LIMIT).unwrap();
    assert_failed_and_stopped(&s, &up, "the IP service of M1QAF2 exited (exit status: 7)");
    assert!(
        namespaces_of(&name).is_empty(),
        "namespaces left: {:?}",
        namespaces_of(&name)
    );
}

#[test]
fn ctrl_c_during_rack_up_stops_what_it_started() {
    const TEST: &str = "quick_start::ctrl_c_during_rack_up_stops_what_it_started";
    if skip_without_ip(TEST) {
        return;
    }
    let _turn = turn();
    let bin = bin_dir();
    let s = Scratch::new("interrupted", bin, None);
    // An IP service that never gets ready, and writes its pid when it starts (it becomes a
    // `sleep`, so only its pid can find it): rack up waits for it.
    let started = s.dir.join("ip-started");
    // Whatever the assertions below say, no stand-in outlives the test.
    let _reaper = KillListed(started.clone());
    let fake = s.dir.join("exanet-ip-stuck");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho $$ >> {}\nexec sleep 600\n",
            started.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let name = format!("qs-interrupted-{}", std::process::id());
    let mut c = s.command(&[
        "rack", "up", "--shape", "1x1x1", "--ip", "on", "--name", &name,
    ]);
    c.env("EXANET_IP", &fake)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let t0 = Instant::now();
    while !started.exists() && t0.elapsed() < UP_LIMIT {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        started.exists(),
        "no IP service started within {UP_LIMIT:?}"
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // The signal may come while exactl still starts the other services or already waits
    // for the first: either way it says where it was and stops everything.
    assert!(
        (stderr.contains("interrupted while waiting for the IP service of M1QAF1")
            || stderr.contains("interrupted while starting the IP services"))
            && stderr.contains("stopped the 4 daemon(s)"),
        "{stderr}"
    );
    let left = s.leftovers();
    assert!(left.is_empty(), "still running after Ctrl-C: {left:#?}");
    assert!(
        namespaces_of(&name).is_empty(),
        "{:?}",
        namespaces_of(&name)
    );
    // Every stand-in service that started was stopped with the rack.
    let pids: Vec<String> = std::fs::read_to_string(&started)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(!pids.is_empty());
    let alive: Vec<&String> = pids
        .iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|st| !st.contains(") Z "))
        })
        .collect();
    assert!(
        alive.is_empty(),
        "IP services still running after Ctrl-C: {alive:?}"
    );
}

/// Kills (SIGKILL), when dropped, the stand-in IP services whose pids are listed in a
/// file: those still running `sleep 600` (a pid since reused by another program is left
/// alone).
struct KillListed(PathBuf);

impl Drop for KillListed {
    fn drop(&mut self) {
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        for pid in text
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if pid > 1 && cmdline == b"sleep\x00600\x00" {
                // pid > 1 names one process.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// MemAvailable, in bytes.
fn mem_available() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn a_rack_this_host_cannot_hold_is_refused_before_anything_starts() {
    const TEST: &str =
        "quick_start::a_rack_this_host_cannot_hold_is_refused_before_anything_starts";
    if skip_without_ip(TEST) {
        return;
    }
    // 1024 nodes with IP register 258 MiB a node, 258 GiB in all (docs/operating.md).
    if mem_available() > 300 << 30 {
        exanet_tests::skip_unless_required(
            "EXANET_REQUIRE_IP",
            TEST,
            "this host has over 300 GiB available and could hold the rack",
        );
        return;
    }
    let _turn = turn();
    let s = Scratch::new("too-big", bin_dir(), None);
    let up = s.exactl(
        &[
            "rack",
            "up",
            "--shape",
            "8x8x4",
            "--ip",
            "on",
            "--name",
            &format!("qs-too-big-{}", std::process::id()),
        ],
        COMMAND_LIMIT,
    );
    assert_eq!(up.code(), Some(1), "{}", up.describe());
    assert!(
        up.stderr.contains(
            "this host cannot hold the rack: a 8x8x4 rack (1024 nodes) with IP over ExaNet takes about"
        ) && up.stderr.contains("  memory: it needs about 262.9 GiB")
            && up.stderr.contains("258.4 MiB a node")
            && up.stderr.contains("nothing was started"),
        "{}",
        up.describe()
    );
    assert!(
        up.elapsed < Duration::from_secs(10),
        "refusing took {:?}",
        up.elapsed
    );
    assert!(
        !s.rack().exists(),
        "the refused rack's directory was written"
    );
    assert!(s.leftovers().is_empty());
}
