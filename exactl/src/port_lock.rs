//! One rack at a time picks ports on this host. A rack's ports are drawn at random among
//! those free right now (`exanet_control::ports::pick_free`) and only bound when its
//! daemons start: two racks coming up at once (tests do) could each find the same port
//! free and one daemon then fails to bind it. Holding this lock from picking the ports
//! until the daemons have bound them closes that window. It is an advisory `flock` on a
//! file in the temporary directory, released when its holder exits however it exits.
//!
//! The lock is each user's own (`exanet-ports-UID.lock`, mode 0600, never through a link,
//! used only when that user owns it): `flock` needs nothing but an open descriptor, so a
//! lock file others could open was a lock any local user could hold, and with it stall
//! every `rack up` of root's for the [`PATIENCE`]; and root opened the name with
//! `O_CREAT` through whatever link another user had put there. Racks of different users
//! no longer take turns: the rare port one of them takes first fails that daemon's start,
//! which says so.

use std::fs::File;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// How long a rack waits for another to finish coming up before it goes on without the
/// lock (a rack whose daemons hang at start must not stop every other).
const PATIENCE: Duration = Duration::from_secs(120);

/// Held while it lives.
pub struct PortLock {
    _held: Option<Flock<File>>,
}

impl PortLock {
    /// Waits for this user's port lock; without one (no temporary directory, a file at its
    /// name that is a link or another user's) it goes on unlocked, as before the lock
    /// existed, and says why.
    pub fn acquire() -> PortLock {
        let uid = nix::unistd::geteuid();
        PortLock::acquire_at(&std::env::temp_dir().join(format!("exanet-ports-{uid}.lock")))
    }

    fn acquire_at(path: &std::path::Path) -> PortLock {
        let mut file = match crate::process::open_private_lock(path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("exactl: warning: no port lock ({e}): picking ports without it");
                return PortLock { _held: None };
            }
        };
        let start = Instant::now();
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(held) => return PortLock { _held: Some(held) },
                Err((f, _)) if start.elapsed() < PATIENCE => {
                    file = f;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => {
                    eprintln!(
                        "exactl: another rack held {} for {} s: picking ports without it",
                        path.display(),
                        PATIENCE.as_secs()
                    );
                    return PortLock { _held: None };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second holder (another rack's exactl; here another open of the file, which
    /// `flock` treats alike) gets the lock only once the first has let it go.
    #[test]
    fn a_second_rack_waits_for_the_first_to_let_go() {
        let first = PortLock::acquire();
        assert!(first._held.is_some(), "no lock taken");
        let (tx, rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn(move || {
            let held = PortLock::acquire();
            tx.send((Instant::now(), held._held.is_some())).unwrap();
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(rx.try_recv().is_err(), "taken while the first held it");
        let released = Instant::now();
        drop(first);
        let (got, locked) = rx.recv().unwrap();
        assert!(locked && got >= released);
        second.join().unwrap();
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("exactl-portlock-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_lock_is_a_private_file_of_ours() {
        let d = scratch("own");
        let path = d.join("lock");
        let held = PortLock::acquire_at(&path);
        assert!(held._held.is_some());
        let meta = std::fs::symlink_metadata(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        drop(held);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_at_the_name_is_not_followed() {
        let d = scratch("link");
        let target = d.join("elsewhere");
        let path = d.join("lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let held = PortLock::acquire_at(&path);
        assert!(held._held.is_none());
        assert!(!target.exists(), "the link was followed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn another_users_file_is_not_used() {
        if !nix::unistd::geteuid().is_root() {
            // Only root can give a file away; the test is about root anyway.
            return;
        }
        let d = scratch("theirs");
        let path = d.join("lock");
        std::fs::write(&path, b"").unwrap();
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let held = PortLock::acquire_at(&path);
        assert!(held._held.is_none(), "root took another user's lock file");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
