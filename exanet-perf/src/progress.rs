//! What a run says on stderr while it goes: its plan first, then how far it got, every
//! `interval` (on a terminal one line rewritten in place, else a line each time), so that
//! a long run is never silent. Never on stdout, which carries the results (`--json`).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    /// `--quiet`: say nothing.
    quiet: bool,
    /// stderr is a terminal: rewrite one line.
    tty: bool,
    interval: Duration,
    start: Instant,
    last: Instant,
    /// A progress line is on the terminal and must be cleared before anything else.
    pending: bool,
    /// Progress lines written.
    pub shown: u64,
}

impl Progress {
    pub fn new(quiet: bool, interval: Duration) -> Progress {
        let now = Instant::now();
        Progress {
            quiet,
            tty: std::io::stderr().is_terminal(),
            interval,
            start: now,
            last: now,
            pending: false,
            shown: 0,
        }
    }

    /// A line of its own (the plan, a summary), after clearing a progress line.
    pub fn say(&mut self, line: &str) {
        if self.quiet {
            return;
        }
        self.clear();
        eprintln!("exanet-perf: {line}");
    }

    /// Shows `what()` if `interval` passed since the last progress line (or the start).
    pub fn tick(&mut self, what: impl FnOnce() -> String) {
        if self.quiet || self.last.elapsed() < self.interval {
            return;
        }
        self.last = Instant::now();
        self.shown += 1;
        let line = format!(
            "exanet-perf: {} ({:.1} s)",
            what(),
            self.start.elapsed().as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r{line}\x1b[K");
            self.pending = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Removes a progress line from the terminal (before results are printed).
    pub fn clear(&mut self) {
        if self.pending {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.pending = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
