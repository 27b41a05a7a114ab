#![forbid(unsafe_code)]
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// exanetd: emulates one node (MPSoC) of an ExaNeSt rack: its switch, its links to the
/// neighbours over QUIC, metrics and a control socket.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Rack directory (holds rack.toml, tls/, run/); default $EXANET_RACK, else ./exanet-rack.
    #[arg(long)]
    rack: Option<PathBuf>,
    /// The node to run, e.g. M1QAF2; default $EXANET_NODE.
    #[arg(long, env = "EXANET_NODE")]
    node: String,
    /// Runtime worker threads (1 = single-threaded, the lightest for many daemons per host).
    #[arg(long, env = "EXANETD_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
    /// Start a session of its own, as `exactl rack up` asks of local daemons: the
    /// terminal's ^C and hang-up then never reach it.
    #[arg(long)]
    new_session: bool,
    /// How many times this node's daemon was restarted before this one, by whoever
    /// restarts it (exactl's supervisor): exported as `exanet_node_restarts_total`.
    #[arg(long, default_value_t = 0)]
    restarts: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if cli.new_session {
        // Fails only for a process group leader (a shell's job), which keeps its session.
        if let Err(e) = nix::unistd::setsid() {
            tracing::warn!(error = %e, "cannot start a session of its own; staying in the caller's");
        }
    }
    let dir = exanet_control::rack::rack_dir(cli.rack.as_deref());
    match exanetd::daemon::run(exanetd::daemon::Options {
        rack_dir: &dir,
        node: &cli.node,
        threads: cli.threads as usize,
        restarts: cli.restarts,
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exanetd: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
