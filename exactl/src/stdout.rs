//! What exactl prints for its user goes through here: a reader that goes away early
//! (`exactl status | head`) ends exactl quietly, as ripgrep and most Unix tools end, instead
//! of the panic `print!` makes of a closed pipe.

use std::io::Write;

/// Writes `args` to stdout. A closed pipe ends the process with success: its reader has
/// what it wanted. Any other failure to print is said on stderr and ends it with 1.
pub fn write(args: std::fmt::Arguments<'_>) {
    if let Err(e) = try_write(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("exactl: cannot print: {e}");
        std::process::exit(1);
    }
}

/// Writes `args` to stdout and says whether that worked, for a command that must go on
/// when its reader has left (a fault plan still has to undo what it set).
pub fn try_write(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args).and_then(|()| out.flush())
}

/// `print!` through [`write`].
macro_rules! out {
    ($($t:tt)*) => { $crate::stdout::write(format_args!($($t)*)) };
}

/// `println!` through [`write`].
macro_rules! outln {
    () => { $crate::stdout::write(format_args!("\n")) };
    ($($t:tt)*) => { $crate::stdout::write(format_args!("{}\n", format_args!($($t)*))) };
}

pub(crate) use {out, outln};
