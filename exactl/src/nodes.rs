//! `exactl node pause|resume|kill|restart NAME`: node failures on purpose. What carries
//! them out depends on what runs the daemons (`[deploy]` in rack.toml): signals to local
//! processes (SIGSTOP, SIGCONT, SIGKILL, and a fresh daemon for restart), or the compose
//! tool for a compose rack (pause, unpause, kill, restart of the node's container).
//!
//! A restarted daemon rejoins by itself: it dials its lower-numbered neighbours and the
//! others dial it. `restart` waits until it reports all its links up again and says how
//! long that took.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use exanet_control::rack::{Deploy, Layout, Rack};
use exanet_proto::{NodeId, NodeName};

use crate::error::{CliError, Result};
use crate::fabric;
use crate::process::{self, PidFile};

/// What an operator does to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeOp {
    /// Freeze the daemon (it keeps its sockets; peers see silence, then idle timeouts).
    Pause,
    Resume,
    /// Crash it: no goodbye to its peers.
    Kill,
    /// Stop it (if running) and start a fresh daemon.
    Restart,
}

impl NodeOp {
    /// Every operation, in the order they are offered (`exactl node --help`, plans).
    pub const ALL: [NodeOp; 4] = [NodeOp::Pause, NodeOp::Resume, NodeOp::Kill, NodeOp::Restart];

    /// Its word: the `exactl node` subcommand and a plan's `action`.
    pub fn label(self) -> &'static str {
        match self {
            NodeOp::Pause => "pause",
            NodeOp::Resume => "resume",
            NodeOp::Kill => "kill",
            NodeOp::Restart => "restart",
        }
    }

    /// The help line of its subcommand.
    pub fn help(self) -> &'static str {
        match self {
            NodeOp::Pause => "Freeze the node's daemon (SIGSTOP / docker pause)",
            NodeOp::Resume => "Let a paused daemon run again",
            NodeOp::Kill => "Kill the daemon without warning (a crash)",
            NodeOp::Restart => {
                "Stop the daemon if it runs, start a fresh one and wait until it rejoins"
            }
        }
    }

    /// The operation a word names (any case).
    pub fn from_label(s: &str) -> Option<NodeOp> {
        NodeOp::ALL
            .into_iter()
            .find(|op| op.label().eq_ignore_ascii_case(s))
    }

    /// `pause, resume, kill or restart`, for messages.
    pub fn choices() -> String {
        crate::units::one_of(&NodeOp::ALL.map(NodeOp::label))
    }
}

/// `exactl node OP NAME`: one subcommand per [`NodeOp`], built from [`NodeOp::ALL`].
#[derive(Debug)]
pub struct NodeCommand {
    pub op: NodeOp,
    pub name: NodeName,
}

impl clap::FromArgMatches for NodeCommand {
    fn from_arg_matches(m: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        use clap::error::ErrorKind;
        let (word, sub) = m
            .subcommand()
            .ok_or_else(|| clap::Error::raw(ErrorKind::MissingSubcommand, "give an operation"))?;
        let op = NodeOp::from_label(word).ok_or_else(|| {
            clap::Error::raw(
                ErrorKind::InvalidSubcommand,
                format!("no operation {word:?}"),
            )
        })?;
        let name = sub
            .get_one::<NodeName>("name")
            .copied()
            .ok_or_else(|| clap::Error::raw(ErrorKind::MissingRequiredArgument, "give NAME"))?;
        Ok(NodeCommand { op, name })
    }

    fn update_from_arg_matches(
        &mut self,
        m: &clap::ArgMatches,
    ) -> std::result::Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Subcommand for NodeCommand {
    fn augment_subcommands(mut cmd: clap::Command) -> clap::Command {
        for op in NodeOp::ALL {
            cmd = cmd.subcommand(
                clap::Command::new(op.label()).about(op.help()).arg(
                    clap::Arg::new("name")
                        .value_name("NAME")
                        .required(true)
                        .value_parser(|s: &str| s.parse::<NodeName>().map_err(|e| e.to_string())),
                ),
            );
        }
        cmd
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        NodeOp::from_label(name).is_some()
    }
}

/// How long `restart` waits for the node to rejoin.
const REJOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stopping daemon gets after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// `exactl node OP NAME`.
pub fn run(dir: &Path, op: NodeOp, name: NodeName) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let id = shape.id_of(name)?;
    let done = apply(&rack, op, id)?;
    // What changed, on stdout; how the restarted node rejoined follows on stderr.
    crate::stdout::outln!("{}: {done}", shape.display(id));
    if op == NodeOp::Restart {
        let took = wait_rejoined(&rack, id, REJOIN_TIMEOUT)?;
        eprintln!(
            "exactl: {} rejoined: all its links up {:.2} s after the restart",
            shape.display(id),
            took.as_secs_f64()
        );
    }
    Ok(())
}

/// Carries out `op` on node `id` without waiting for any consequence; what was done, in
/// a few words (`killed (SIGKILL to pid 1234)`).
pub fn apply(rack: &Rack, op: NodeOp, id: NodeId) -> Result<String> {
    let node = rack.shape().display(id);
    match rack.file.deploy.clone().unwrap_or(Deploy::Local) {
        Deploy::Local => local(rack, op, &node),
        Deploy::Compose { project, file } => compose(rack, op, &node, &project, &file),
        Deploy::External { how } => Err(CliError::Usage(format!(
            "this rack's daemons are not run by exactl ({how}); {} {node} there",
            op.label()
        ))),
    }
}

fn local(rack: &Rack, op: NodeOp, node: &str) -> Result<String> {
    let layout: Layout = rack.layout();
    let dir = rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone());
    let running = match process::read_pid_file(&layout.pid_file(&node), node, &dir) {
        PidFile::Running(d) => Some(d),
        _ => None,
    };
    let signal = |sig, d: &process::Daemon| {
        process::signal(d.pid, sig)
            .map_err(|e| CliError::Failed(format!("cannot signal {node} (pid {}): {e}", d.pid)))
    };
    match (op, running) {
        (NodeOp::Pause, Some(d)) => {
            signal(libc::SIGSTOP, &d)?;
            Ok(format!("paused (SIGSTOP to pid {})", d.pid))
        }
        (NodeOp::Resume, Some(d)) => {
            signal(libc::SIGCONT, &d)?;
            Ok(format!("resumed (SIGCONT to pid {})", d.pid))
        }
        (NodeOp::Kill, Some(d)) => {
            signal(libc::SIGKILL, &d)?;
            wait_gone(&d);
            let _ = process::remove_if_present(&layout.pid_file(&node));
            Ok(format!("killed (SIGKILL to pid {})", d.pid))
        }
        (NodeOp::Restart, running) => {
            let mut stopped = "it was not running".to_string();
            if let Some(d) = running {
                // A paused daemon cannot act on SIGTERM.
                let _ = process::signal(d.pid, libc::SIGCONT);
                signal(libc::SIGTERM, &d)?;
                stopped = format!("pid {} stopped", d.pid);
                if !wait_gone(&d) && process::is_our_daemon(d.pid, node, &dir) {
                    let _ = process::signal(d.pid, libc::SIGKILL);
                    wait_gone(&d);
                    stopped = format!("pid {} killed after SIGTERM", d.pid);
                }
            }
            let binary = process::daemon_binary()?;
            let child = process::spawn_daemon(&binary, &layout, &dir, node)?;
            Ok(format!(
                "restarted ({stopped}; new daemon pid {})",
                child.id()
            ))
        }
        (op, None) => Err(CliError::Failed(format!(
            "{node}: {} here (no live daemon behind {}); nothing to {}",
            crate::error::NOT_RUNNING,
            layout.pid_file(&node).display(),
            op.label()
        ))),
    }
}

/// Waits up to [`STOP_TIMEOUT`] for the daemon to exit; true if it did.
fn wait_gone(d: &process::Daemon) -> bool {
    let t0 = Instant::now();
    while process::is_alive(d.pid) {
        if t0.elapsed() > STOP_TIMEOUT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The compose tool of this machine: `docker-compose` (v1) if installed, else the
/// `docker compose` plugin (v2). Both take the same arguments here.
pub fn compose_command() -> Command {
    if crate::process::on_path("docker-compose").is_some() {
        Command::new("docker-compose")
    } else {
        let mut c = Command::new("docker");
        c.arg("compose");
        c
    }
}

fn compose(rack: &Rack, op: NodeOp, node: &str, project: &str, file: &str) -> Result<String> {
    let path: PathBuf = rack.dir.join(file);
    let verb = match op {
        NodeOp::Pause => "pause",
        NodeOp::Resume => "unpause",
        NodeOp::Kill => "kill",
        NodeOp::Restart => "restart",
    };
    let out = compose_command()
        .arg("-p")
        .arg(project)
        .arg("-f")
        .arg(&path)
        .arg(verb)
        .arg(node)
        .output()
        .map_err(|e| CliError::Failed(format!("cannot run the compose tool: {e}")))?;
    if !out.status.success() {
        return Err(CliError::Failed(format!(
            "compose {verb} {node} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let done = match op {
        NodeOp::Pause => "paused",
        NodeOp::Resume => "resumed",
        NodeOp::Kill => "killed",
        NodeOp::Restart => "restarted",
    };
    Ok(format!("{done} (compose {verb} of its container)"))
}

/// Waits until node `id` answers and reports every one of its links up.
pub fn wait_rejoined(rack: &Rack, id: NodeId, timeout: Duration) -> Result<Duration> {
    let client = crate::control::client(rack)?;
    let want = exanet_proto::topology::node_links(&rack.shape(), id).len();
    let t0 = Instant::now();
    let mut last = String::from("no answer yet");
    while t0.elapsed() < timeout {
        match fabric::query_one(&client, id, Duration::from_millis(500)) {
            Ok(st) if st.links_up() == want => return Ok(t0.elapsed()),
            Ok(st) => last = format!("{}/{want} links up", st.links_up()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(CliError::Failed(format!(
        "{} did not rejoin within {} s ({last})",
        rack.shape().display(id),
        timeout.as_secs()
    )))
}
