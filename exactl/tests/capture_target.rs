//! `exactl capture -w FILE` never writes a capture (every job's payloads) where another
//! user can read it (issue 47, item 6): a file someone else made at that name, waiting for
//! root's capture, and a symbolic link there are refused, and left as they were: content,
//! owner and mode. The file is checked before the daemon is asked for anything, so a rack
//! that is not running does here.

#[allow(dead_code)] // each test file uses some of the helpers
mod common;
// The helper every test of the workspace that needs root shares (std only).
#[allow(dead_code)]
#[path = "../../tests/src/require.rs"]
mod require;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{rack_toml, text, Scratch};

/// Not root: the uid of `nobody`, which every system has.
const OTHER: u32 = 65534;

/// `exactl capture --node M1QAF1 --count 1 -w FILE` on a rack that is not running, killed
/// if it is still running after 30 s (a capture that got past the file would try the
/// daemon next).
fn capture_into(s: &Scratch, file: &Path) -> Output {
    let mut child = s
        .command(&["capture", "--node", "M1QAF1", "--count", "1", "-w"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run exactl");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

/// Content, owner and mode.
fn state(p: &Path) -> (Vec<u8>, u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (std::fs::read(p).unwrap(), m.uid(), m.mode() & 0o7777)
}

#[test]
fn a_symbolic_link_is_refused_and_its_target_left_as_it_was() {
    let s = Scratch::new("capture-link").with_rack_file(&rack_toml("1x1x1"));
    let target = s.dir.join("someone-elses.txt");
    std::fs::write(&target, b"not a capture").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    let before = state(&target);
    let link = s.dir.join("x.pcapng");
    std::os::unix::fs::symlink(&target, &link).unwrap();

    let out = capture_into(&s, &link);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "capture through a link: {err}");
    assert_eq!(state(&target), before, "the link's target changed: {err}");
    assert!(
        err.contains(&link.display().to_string()) && err.contains("symbolic link"),
        "the refusal names the file and why: {err}"
    );
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn another_users_file_is_refused_and_left_as_it_was() {
    const TEST: &str = "another_users_file_is_refused_and_left_as_it_was";
    if !require::is_root() {
        require::skip_unless_required(
            "EXANET_REQUIRE_ROOT",
            TEST,
            "not root (a file of another user needs it)",
        );
        return;
    }
    let s = Scratch::new("capture-theirs").with_rack_file(&rack_toml("1x1x1"));
    // The audit's: a file another user made, world-writable, in a directory everyone
    // writes to (here only the file's owner matters), waiting for root's capture.
    let file = s.dir.join("x.pcapng");
    std::fs::write(&file, b"theirs").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&file, Some(OTHER), Some(OTHER)).unwrap();
    let before = state(&file);

    let out = capture_into(&s, &file);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "capture into uid {OTHER}'s file: {err}"
    );
    assert_eq!(state(&file), before, "the other user's file changed: {err}");
    assert!(
        err.contains(&file.display().to_string())
            && err.contains(&OTHER.to_string())
            && err.contains("remove it or choose another name"),
        "the refusal names the file, its owner and what to do: {err}"
    );
    // And nothing was left beside it (a temporary file of the capture's, say).
    let names: Vec<_> = std::fs::read_dir(&s.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n == "x.pcapng" || n == "rack.toml"),
        "{names:?}"
    );
}
