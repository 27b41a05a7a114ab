//! Ctrl-C (SIGINT) and SIGTERM while exactl has something to undo or wait for (`rack up`,
//! `chaos run`, `mpirun`): they only raise a flag, which the waiting loops poll, so that
//! exactl stops what it started instead of dying half way.

use std::sync::atomic::{AtomicBool, Ordering};

static RAISED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    RAISED.store(true, Ordering::SeqCst);
}

/// From now on SIGINT and SIGTERM only raise the flag.
#[allow(unsafe_code)] // installing a signal handler: std and nix have no safe way
pub fn catch() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installing a handler is sound; the handler only stores to a static atomic,
    // which is async-signal-safe, and touches no lock, allocation or I/O.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Back to the default: the signals end the process.
#[allow(unsafe_code)]
pub fn restore() {
    // SAFETY: restoring the default disposition of a signal is always sound.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
}

/// Whether SIGINT or SIGTERM came since [`catch`].
pub fn raised() -> bool {
    RAISED.load(Ordering::SeqCst)
}

/// Lowers the flag again (so that a clean-up's own waits run to the end).
pub fn lower() {
    RAISED.store(false, Ordering::SeqCst);
}
