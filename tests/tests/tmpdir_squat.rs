//! A local user squats the nodes' temporary directories before root's `rack up` (issue 47,
//! item 5): a world-writable directory of theirs holding a chain too deep to remove, or a
//! symbolic link, where the node's directory used to be (`$TMPDIR/exanet-RACK-NODE`).
//! Root's commands on the nodes (`exactl exec`, `exactl mpirun`) get the node's directory
//! as `TMPDIR`, so wherever it points root writes: it must never be anything the squatter
//! controls, at `rack up` or later at `exec`; a directory exactl cannot remove is reported,
//! naming it and its owner, and never used again, without keeping the rack from coming up
//! (anyone can fill a node's directory with what cannot be removed).
//!
//! Needs root (the namespaces of IP over ExaNet, and another owner for the squatter's
//! files), `/dev/net/tun` and `ip`: without them each test prints a SKIPPED line, and
//! fails instead with `EXANET_REQUIRE_IP` set.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exanet_proto::Shape;
use exanet_tests::{run_with_timeout, Run, TestRack};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, Gid, Uid, UnlinkatFlags};

const SHAPE: &str = "1x1x1";
/// The squatter: `nobody`, an owner other than root that every system has.
const SQUATTER: u32 = 65534;
/// Deeper than the descriptors exactl may hold ([`NOFILE`]): `std::fs::remove_dir_all`
/// keeps one open per level and fails. (70,000 levels did the same under the host's own
/// limit in the audit; this many under a limit set here fails on any host, in a second.)
const DEPTH: usize = 5000;
/// The descriptor limit exactl runs under here, a common default.
const NOFILE: u64 = 1024;

/// True when the test must skip (and says so); panics instead when IP is required.
fn skip(test: &str) -> bool {
    exanet_tests::skip_without_ip(test, &["ip"])
}

/// The tests of this file bring their racks up one at a time (two racks picking ports at
/// once may draw the same one).
static ONE_RACK_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn nodes() -> Vec<String> {
    let shape: Shape = SHAPE.parse().unwrap();
    shape.node_ids().map(|id| shape.display(id)).collect()
}

/// A rack name of this process and test, so that the squatted paths are known before
/// `rack up` and no other run's.
fn rack_name(tag: &str) -> String {
    format!("sq{tag}{}", std::process::id())
}

/// Where the node's temporary directory was before this fix: what a squatter takes.
fn old_node_dir(name: &str, node: &str) -> PathBuf {
    std::env::temp_dir().join(format!("exanet-{name}-{node}"))
}

/// `exactl ARGS` on `rack`, with at most [`NOFILE`] descriptors.
fn exactl_limited(rack: &TestRack, args: &[&str], timeout: Duration) -> Run {
    let mut c = rack.command(args);
    // SAFETY: setrlimit is async-signal-safe, and nothing else runs in the child.
    unsafe {
        c.pre_exec(|| {
            let (_, hard) =
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_NOFILE,
                NOFILE.min(hard),
                hard,
            )?;
            Ok(())
        });
    }
    run_with_timeout(c, timeout).unwrap_or_else(|e| panic!("{e}"))
}

fn up(rack: &TestRack, name: &str) -> Run {
    exactl_limited(
        rack,
        &[
            "rack",
            "up",
            "--shape",
            SHAPE,
            "--name",
            name,
            "--ip",
            "on",
            "--timeout",
            "60",
        ],
        Duration::from_secs(120),
    )
}

/// `exactl exec NODE`, as root, of a shell that prints its TMPDIR and creates a file
/// `probe` in it, as a job's runtime would.
fn exec_probe(rack: &TestRack, node: &str) -> Run {
    rack.exactl(&[
        "exec",
        node,
        "--",
        "sh",
        "-c",
        "printf %s \"$TMPDIR\"; : > \"$TMPDIR/probe\"",
    ])
}

/// A node's TMPDIR as `exactl exec` gives it, after checking the exec succeeded.
#[track_caller]
fn tmpdir_of(rack: &TestRack, node: &str) -> PathBuf {
    let r = exec_probe(rack, node);
    assert!(r.success(), "exec on {node}: {}", r.describe());
    assert!(
        !r.stdout.is_empty(),
        "no TMPDIR on {node}: {}",
        r.describe()
    );
    PathBuf::from(&r.stdout)
}

/// What root may hand out as TMPDIR: a real directory (not a link), root's, sticky and
/// world-writable like /tmp.
#[track_caller]
fn assert_roots(dir: &Path) {
    let m = std::fs::symlink_metadata(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert!(
        m.file_type().is_dir(),
        "{} is not a directory: {m:?}",
        dir.display()
    );
    assert_eq!(m.uid(), 0, "{} is not root's", dir.display());
    assert_eq!(m.mode() & 0o7777, 0o1777, "{} mode", dir.display());
}

/// A chain of `depth` nested directories `d/d/d/...` in `top`, made level by level through
/// descriptors (its paths are far longer than PATH_MAX).
fn deep_chain(top: &Path, depth: usize) {
    let mut fd: OwnedFd =
        nix::fcntl::open(top, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
            .unwrap_or_else(|e| panic!("open {}: {e}", top.display()));
    for _ in 0..depth {
        mkdirat(fd.as_fd(), "d", Mode::from_bits_truncate(0o777)).unwrap();
        fd = openat(
            fd.as_fd(),
            "d",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
    }
}

/// Removes what [`deep_chain`] made, holding two descriptors at a time (`rm -rf` took
/// minutes for the audit's 70,000 levels): down to the bottom, then up through `..`.
fn remove_deep_chain(top: &Path) {
    let Ok(mut fd) = nix::fcntl::open(
        top,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
        Mode::empty(),
    ) else {
        return;
    };
    let mut depth = 0;
    while let Ok(next) = openat(
        fd.as_fd(),
        "d",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
        Mode::empty(),
    ) {
        fd = next;
        depth += 1;
    }
    for _ in 0..depth {
        let up = openat(
            fd.as_fd(),
            "..",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        fd = up;
        unlinkat(fd.as_fd(), "d", UnlinkatFlags::RemoveDir).unwrap();
    }
    drop(fd);
    let _ = std::fs::remove_dir_all(top);
}

/// The squatter's paths, removed when dropped (also when the test fails).
struct Squat(Vec<PathBuf>);

impl Drop for Squat {
    fn drop(&mut self) {
        for p in &self.0 {
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_dir() => remove_deep_chain(p),
                Ok(_) => {
                    let _ = std::fs::remove_file(p);
                }
                Err(_) => {}
            }
        }
    }
}

/// A world-writable directory of the squatter's at `path`, 0777 like the audit's.
fn squatter_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    nix::unistd::chown(
        path,
        Some(Uid::from_raw(SQUATTER)),
        Some(Gid::from_raw(SQUATTER)),
    )
    .unwrap();
}

/// Names in `dir`.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn squatted_node_directories_are_never_handed_to_roots_commands() {
    if skip("squatted_node_directories_are_never_handed_to_roots_commands") {
        return;
    }
    let _turn = ONE_RACK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let name = rack_name("a");
    let nodes = nodes();
    let rack = TestRack::new("squat");
    std::fs::create_dir_all(&rack.dir).unwrap();
    // Where a link of the squatter's points: a directory root writes into only if it
    // follows the link.
    let victim = rack.dir.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let squat = Squat(nodes.iter().map(|n| old_node_dir(&name, n)).collect());
    // The first node: the audit's squat, a chain root cannot remove.
    squatter_dir(&squat.0[0]);
    deep_chain(&squat.0[0], DEPTH);
    // The second: a link to the victim, the squatter's own.
    let _ = std::fs::remove_file(&squat.0[1]);
    std::os::unix::fs::symlink(&victim, &squat.0[1]).unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &squat.0[1],
        Some(Uid::from_raw(SQUATTER)),
        Some(Gid::from_raw(SQUATTER)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    // The third: an empty directory of the squatter's.
    squatter_dir(&squat.0[2]);

    let r = up(&rack, &name);
    assert!(r.success(), "rack up: {}", r.describe());
    for (i, node) in nodes.iter().enumerate() {
        let tmp = tmpdir_of(&rack, node);
        for s in &squat.0 {
            assert!(
                !tmp.starts_with(s),
                "{node}'s TMPDIR {} is the squatter's {}",
                tmp.display(),
                s.display()
            );
        }
        assert_roots(&tmp);
        assert_eq!(
            entries(&tmp),
            ["probe"],
            "{node}'s TMPDIR {}",
            tmp.display()
        );
        if i < 3 {
            // The squat is as the squatter left it: root neither wrote nor chmodded there.
            let m = std::fs::symlink_metadata(&squat.0[i]).unwrap();
            assert_eq!(m.uid(), SQUATTER, "{}", squat.0[i].display());
        }
    }
    assert_eq!(
        entries(&squat.0[0]),
        ["d"],
        "root wrote into the squatter's directory"
    );
    assert_eq!(
        entries(&squat.0[2]),
        Vec::<String>::new(),
        "root wrote into the squatter's directory"
    );
    assert!(
        entries(&victim).is_empty(),
        "root wrote through the squatter's link"
    );
    let down = rack.down().unwrap();
    assert!(down.success(), "rack down: {}", down.describe());
}

#[test]
fn exec_refuses_a_node_directory_that_is_no_longer_roots() {
    if skip("exec_refuses_a_node_directory_that_is_no_longer_roots") {
        return;
    }
    let _turn = ONE_RACK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let name = rack_name("b");
    let node = &nodes()[0];
    let rack = TestRack::new("squat");
    let r = up(&rack, &name);
    assert!(r.success(), "rack up: {}", r.describe());
    let tmp = tmpdir_of(&rack, node);
    assert_roots(&tmp);

    // Given to another user (by whatever means): not handed out, and the message says
    // which directory and whose it is.
    nix::unistd::chown(&tmp, Some(Uid::from_raw(SQUATTER)), None).unwrap();
    let r = exec_probe(&rack, node);
    assert!(
        !r.success(),
        "exec used a directory uid {SQUATTER} owns: {}",
        r.describe()
    );
    assert!(
        r.stderr.contains(&tmp.display().to_string()) && r.stderr.contains(&SQUATTER.to_string()),
        "the refusal names the directory and its owner: {}",
        r.describe()
    );
    nix::unistd::chown(&tmp, Some(Uid::from_raw(0)), None).unwrap();
    assert!(exec_probe(&rack, node).success());

    // Replaced by a link: not followed.
    let victim = rack.dir.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let moved = tmp.with_extension("moved");
    std::fs::rename(&tmp, &moved).unwrap();
    std::os::unix::fs::symlink(&victim, &tmp).unwrap();
    let r = exec_probe(&rack, node);
    let _ = std::fs::remove_file(&tmp);
    std::fs::rename(&moved, &tmp).unwrap();
    assert!(!r.success(), "exec followed a link: {}", r.describe());
    assert!(
        r.stderr.contains(&tmp.display().to_string()),
        "the refusal names the directory: {}",
        r.describe()
    );
    assert!(entries(&victim).is_empty(), "root wrote through the link");
    let down = rack.down().unwrap();
    assert!(down.success(), "rack down: {}", down.describe());
}

#[test]
fn a_node_directory_that_cannot_be_removed_is_reported_and_not_reused() {
    if skip("a_node_directory_that_cannot_be_removed_is_reported_and_not_reused") {
        return;
    }
    let _turn = ONE_RACK_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let name = rack_name("c");
    let node = &nodes()[0];
    let rack = TestRack::new("squat");
    let r = up(&rack, &name);
    assert!(r.success(), "rack up: {}", r.describe());
    let tmp = tmpdir_of(&rack, node);
    // A job on the node leaves a chain too deep to remove in the node's directory.
    let chain = tmp.join("chain");
    std::fs::create_dir(&chain).unwrap();
    let _cleanup = Squat(vec![chain.clone()]);
    deep_chain(&chain, DEPTH);

    let down = exactl_limited(
        &rack,
        &["rack", "down", "--timeout", "10"],
        Duration::from_secs(60),
    );
    assert!(
        down.stderr.contains(&tmp.display().to_string()),
        "rack down says it could not remove {}: {}",
        tmp.display(),
        down.describe()
    );
    assert!(
        down.stderr.contains("(root)"),
        "rack down names the owner: {}",
        down.describe()
    );
    // Not removed, so not used again: the next rack up comes up with a new directory (a
    // local user filling a node's directory must not keep root's racks down).
    let r = up(&rack, &name);
    assert!(r.success(), "rack up: {}", r.describe());
    let fresh = tmpdir_of(&rack, node);
    assert_ne!(
        fresh, tmp,
        "the directory that could not be removed was used again"
    );
    assert_roots(&fresh);
    drop(_cleanup);
    std::fs::remove_dir_all(&tmp).unwrap();
    let down = rack.down().unwrap();
    assert!(down.success(), "rack down: {}", down.describe());
}
