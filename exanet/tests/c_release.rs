//! Releasing C handles while other threads use them: tests/c_release.c, compiled against
//! exanet.h and the static library, races a release against calls on the same handle (a
//! thread blocked in exanet_wait, exanet_wait_notification or exanet_recv, a copy into a
//! region, a poll loop), against the in-process fake daemon; and detaches waiting endpoints
//! on a real daemon more times than a node has ranks. Needs gcc (or $CC); the real-daemon
//! test also needs `exactl` and `exanetd` built (`cargo build -p exactl -p exanetd`);
//! valgrind, when installed, runs a few iterations too; without it that test prints a
//! SKIPPED line and passes, unless `EXANET_REQUIRE_VALGRIND` is set (to anything): then
//! it fails. CI sets it.

mod common;
mod rack;
// The helper every test of the workspace that needs root or a tool shares (std only).
#[allow(dead_code)]
#[path = "../../tests/src/require.rs"]
mod require;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Behavior, Fake, NODE};

/// tests/c_release.c, built as `name` in a directory of this test process.
fn build(name: &str) -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("exanet-c-release-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let (ok, out) = rack::compile_c(
        &manifest.join("tests/c_release.c"),
        &exe,
        &[
            "-std=c11",
            "-D_GNU_SOURCE",
            "-g",
            "-O1",
            "-pthread",
            "-Wall",
            "-Wextra",
            "-Werror",
        ],
    );
    assert!(ok, "compiling c_release.c failed:\n{out}");
    exe
}

/// Runs the race of c_release.c for `iterations` and checks its per-mode summary.
fn race(program: Command, iterations: usize, limit: Duration) -> String {
    let (ok, out, err) = rack::run(program, limit);
    // A crash (a use after free...) shows as a failure with no FAIL line.
    assert!(
        ok,
        "c_release race failed (crashed if no FAIL line):\n{out}\n{err}"
    );
    let modes: Vec<(String, [usize; 3])> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "mode").then_some(())?;
            let name = w.next()?.to_string();
            let mut n = [0; 3];
            for (slot, key) in n.iter_mut().zip(["runs=", "disconnected=", "einval="]) {
                *slot = w.next()?.strip_prefix(key)?.parse().ok()?;
            }
            Some((name, n))
        })
        .collect();
    assert_eq!(modes.len(), 6, "no summary of six modes:\n{out}\n{err}");
    let total: usize = modes.iter().map(|(_, [runs, _, _])| runs).sum();
    assert_eq!(total, iterations, "{out}");
    for (name, [runs, disc, inval]) in &modes {
        // Every run ended in one of the two errors (c_release.c checks it per run).
        assert_eq!(runs, &(disc + inval), "{name}: {out}");
        match name.as_str() {
            // A thread blocked on the endpoint was woken by the detach at least once (not
            // only refused a stale handle because the detach came first). Not asked of
            // poll_detach: exanet_poll does not block, so the detach falls inside one only
            // by chance (measured: 1 run in 40 at 0e5d4be, 0 in 160 after the daemon's
            // cell-path changes that followed it); that every run ended in one of the two
            // errors is asked of it above.
            "wait_notification" | "wait_tag" if iterations >= 24 => {
                assert!(
                    *disc > 0,
                    "{name}: the detach never met a call in progress\n{out}"
                )
            }
            "recv_detach" => assert_eq!(disc, runs, "{name}: {out}"),
            "recv_close" | "write_free" => assert_eq!(inval, runs, "{name}: {out}"),
            _ => {}
        }
    }
    out
}

fn race_command(exe: &Path, lo: &Fake, silent: &Fake, iterations: usize) -> Command {
    let mut c = Command::new(exe);
    c.arg("race")
        .arg(&lo.dir)
        .arg(&silent.dir)
        .arg(NODE)
        .arg(iterations.to_string())
        .env_remove("EXANET_JOB_KEY")
        .env_remove("EXANET_SPIN_US");
    c
}

#[test]
fn c_release_races_with_calls_in_progress() {
    let exe = build("c_release");
    let _dir = rack::RemoveOnDrop(exe.parent().unwrap().to_path_buf());
    let lo = Fake::start("rel-lo", Behavior::Serve);
    let silent = Fake::start("rel-si", Behavior::Silent);
    let out = race(
        race_command(&exe, &lo, &silent, 240),
        240,
        Duration::from_secs(600),
    );
    eprintln!("{out}");
}

/// The same race under valgrind's memcheck (a use after free or a double free in the
/// library shows there even where it does not crash); skipped without valgrind, unless
/// `EXANET_REQUIRE_VALGRIND` is set.
#[test]
fn c_release_races_under_valgrind() {
    if !require::runs("valgrind", "--version") {
        require::skip_unless_required(
            "EXANET_REQUIRE_VALGRIND",
            "c_release_races_under_valgrind",
            "valgrind is not installed (Debian: apt-get install valgrind)",
        );
        return;
    }
    let exe = build("c_release_vg");
    let _dir = rack::RemoveOnDrop(exe.parent().unwrap().to_path_buf());
    let lo = Fake::start("rel-vg-lo", Behavior::Serve);
    let silent = Fake::start("rel-vg-si", Behavior::Silent);
    let inner = race_command(&exe, &lo, &silent, 12);
    let mut c = Command::new("valgrind");
    c.args([
        "--quiet",
        "--error-exitcode=99",
        "--exit-on-first-error=yes",
        "--leak-check=no",
    ])
    .arg(inner.get_program())
    .args(inner.get_args())
    .env_remove("EXANET_JOB_KEY")
    .env_remove("EXANET_SPIN_US")
    // Everything is slower under valgrind; a waiter still has to return.
    .env("EXANET_TEST_STUCK_S", "60");
    race(c, 12, Duration::from_secs(900));
}

#[test]
fn c_detach_frees_the_rank_of_a_waiting_endpoint() {
    let exe = build("c_release_ranks");
    let _dir = rack::RemoveOnDrop(exe.parent().unwrap().to_path_buf());
    let rack = rack::Rack::up("rel", "1x1x1");
    let mut c = Command::new(&exe);
    c.arg("ranks")
        .arg(&rack.dir)
        .arg("M1QAF1")
        .arg("12")
        .env_remove("EXANET_JOB_KEY");
    let (ok, out, err) = rack::run(c, Duration::from_secs(300));
    assert!(
        ok,
        "c_release ranks failed (crashed if no FAIL line):\n{out}\n{err}"
    );
    assert!(out.contains("ranks ok"), "{out}");
}

/// The same contract seen from Rust, in-process: handles are ids that are never reused (a
/// stale one never reaches a newer object, of the same kind or another), and a detach
/// wakes every thread in a call on the endpoint.
#[test]
fn handles_are_never_reused_and_detach_wakes_every_caller() {
    use exanet::error::codes;
    use exanet::ffi;
    use std::ffi::{CStr, CString};
    use std::ptr::{null, null_mut};

    let lo = Fake::start("rel-rs", Behavior::Serve);
    let rack_dir = CString::new(lo.dir.to_str().unwrap()).unwrap();
    let node = CString::new(NODE).unwrap();
    let attach = || {
        let mut ep = null_mut();
        // SAFETY: NUL-terminated strings and a live out pointer.
        let rc = unsafe { ffi::exanet_attach(rack_dir.as_ptr(), node.as_ptr(), null(), &mut ep) };
        assert_eq!(rc, codes::OK);
        ep
    };
    let last_error = || {
        // SAFETY: never NULL, valid until this thread's next exanet call.
        unsafe { CStr::from_ptr(ffi::exanet_last_error()) }
            .to_string_lossy()
            .into_owned()
    };
    let open_mailbox = |ep| {
        let mut m = null_mut();
        // SAFETY: a live out pointer.
        assert_eq!(
            unsafe { ffi::exanet_mailbox_open(ep, 4, &mut m) },
            codes::OK
        );
        m
    };

    let ep = attach();
    let m1 = open_mailbox(ep);
    assert!(ffi::exanet_mailbox_vi(m1) >= 0);
    ffi::exanet_mailbox_close(m1);
    let m2 = open_mailbox(ep);
    assert_ne!(m1, m2, "a released handle was reused");
    assert!(ffi::exanet_mailbox_vi(m2) >= 0);
    assert_eq!(ffi::exanet_mailbox_vi(m1), codes::INVALID_ARGUMENT);
    assert!(
        last_error().contains("stale mailbox handle"),
        "{}",
        last_error()
    );
    // An endpoint handle is not a mailbox handle, nor the other way round.
    assert_eq!(
        ffi::exanet_mailbox_vi(ep.cast::<ffi::exanet_mailbox>()),
        codes::INVALID_ARGUMENT
    );
    assert_eq!(
        ffi::exanet_poll(m2.cast::<ffi::exanet_endpoint>()),
        codes::INVALID_ARGUMENT
    );
    assert!(
        last_error().contains("stale endpoint handle"),
        "{}",
        last_error()
    );

    // Threads in calls on the endpoint: pollers in a loop, one waiting for a notification
    // forever, one receiving forever. The detach must bring every one back.
    let (tx, rx) = std::sync::mpsc::channel();
    let (ep_id, m2_id) = (ep as usize, m2 as usize);
    for i in 0..5 {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let ep = ep_id as *const ffi::exanet_endpoint;
            let rc = match i {
                0 => {
                    let mut n = std::mem::MaybeUninit::uninit();
                    // SAFETY: a live out pointer.
                    unsafe { ffi::exanet_wait_notification(ep, -1, n.as_mut_ptr()) }
                }
                1 => {
                    let mut m = std::mem::MaybeUninit::uninit();
                    let mb = m2_id as *const ffi::exanet_mailbox;
                    // SAFETY: a live out pointer.
                    unsafe { ffi::exanet_recv(mb, -1, m.as_mut_ptr()) }
                }
                _ => loop {
                    let rc = ffi::exanet_poll(ep);
                    if rc < 0 {
                        break rc;
                    }
                },
            };
            let _ = tx.send((i, rc));
        });
    }
    drop(tx);
    std::thread::sleep(Duration::from_millis(100));
    ffi::exanet_detach(ep);
    let mut back = Vec::new();
    for _ in 0..5 {
        let (i, rc) = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("threads still in a call 10 s after the detach: {back:?}"));
        back.push(i);
        assert!(
            rc == codes::DISCONNECTED || (i >= 2 && rc == codes::INVALID_ARGUMENT),
            "thread {i} returned {rc}"
        );
        if i < 2 {
            // Blocked for 100 ms before the detach: woken by it, not refused a stale handle.
            assert_eq!(rc, codes::DISCONNECTED, "thread {i}");
        }
    }
    assert_eq!(ffi::exanet_poll(ep), codes::INVALID_ARGUMENT);
    assert_eq!(ffi::exanet_mailbox_vi(m2), codes::DISCONNECTED);
    ffi::exanet_mailbox_close(m2);
    ffi::exanet_mailbox_close(m2);
    ffi::exanet_detach(ep);
    assert!(
        last_error().contains("stale endpoint handle"),
        "{}",
        last_error()
    );

    // A new attachment gets new ids: the old ones stay stale.
    let ep2 = attach();
    assert!(ep2 != ep && ep2.cast::<ffi::exanet_mailbox>() != m1 && ep2.cast() != m2);
    assert!(ffi::exanet_poll(ep2) >= 0);
    assert_eq!(ffi::exanet_poll(ep), codes::INVALID_ARGUMENT);
    ffi::exanet_detach(ep2);
}
