//! One rack at a time picks ports on this host. A rack's ports are drawn at random among
//! those free right now (`exanet_control::ports::pick_free`) and only bound when its
//! daemons start: two racks coming up at once (tests do) could each find the same port
//! free and one daemon then fails to bind it. Holding this lock from picking the ports
//! until the daemons have bound them closes that window. It is an advisory `flock` on a
//! file in the temporary directory, released when its holder exits however it exits.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
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
    /// Waits for the host's port lock; without one (no temporary directory, another user's
    /// lock file it may not open) it goes on unlocked, as before the lock existed.
    pub fn acquire() -> PortLock {
        let path = std::env::temp_dir().join("exanet-ports.lock");
        // Another user's rack opens it read-only if it may not write it: flock needs only
        // an open descriptor.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&path)
            .or_else(|_| File::open(&path));
        let Ok(mut file) = file else {
            return PortLock { _held: None };
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
}
