//! Ctrl-C (SIGINT) and SIGTERM while exactl has something to undo or wait for (`rack up`,
//! `chaos run`, `mpirun`): they only raise a flag, which the waiting loops poll, so that
//! exactl stops what it started instead of dying half way.
//!
//! signal-hook installs the handler (an async-signal-safe store to the flag) and, while
//! exactl does not catch, carries out the signal's default action.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGINT, SIGTERM};

struct Flags {
    /// A signal came since [`catch`] (or [`lower`]).
    raised: Arc<AtomicBool>,
    /// Not catching: a signal ends the process, as if no handler were installed.
    default: Arc<AtomicBool>,
}

static FLAGS: OnceLock<Flags> = OnceLock::new();

/// From now on SIGINT and SIGTERM only raise the flag.
pub fn catch() {
    let f = FLAGS.get_or_init(|| {
        let f = Flags {
            raised: Arc::new(AtomicBool::new(false)),
            default: Arc::new(AtomicBool::new(false)),
        };
        for sig in [SIGINT, SIGTERM] {
            // Neither fails for these signals (only for ones that cannot be caught).
            let _ = signal_hook::flag::register_conditional_default(sig, f.default.clone());
            let _ = signal_hook::flag::register(sig, f.raised.clone());
        }
        f
    });
    f.default.store(false, Ordering::SeqCst);
}

/// Back to the default: the signals end the process.
pub fn restore() {
    if let Some(f) = FLAGS.get() {
        f.default.store(true, Ordering::SeqCst);
    }
}

/// Whether SIGINT or SIGTERM came since [`catch`].
pub fn raised() -> bool {
    FLAGS.get().is_some_and(|f| f.raised.load(Ordering::SeqCst))
}

/// Lowers the flag again (so that a clean-up's own waits run to the end).
pub fn lower() {
    if let Some(f) = FLAGS.get() {
        f.raised.store(false, Ordering::SeqCst);
    }
}
