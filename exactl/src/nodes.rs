//! `exactl node pause|resume|kill|restart NAME`: node failures on purpose. What carries
//! them out depends on what runs the daemons (`[deploy]` in rack.toml): signals to local
//! processes (SIGSTOP, SIGCONT, SIGKILL, and a fresh daemon for restart), or the compose
//! tool for a compose rack (pause, unpause, kill, restart of the node's container).
//!
//! Each acts on the node as a whole: with IP over ExaNet, its daemon and its IP service
//! together (the service in the node's namespace, which stays: it is the node's host, and
//! what runs there keeps running). A restart starts the service again once the daemon
//! takes workloads, with the node's address, so that IP works again when it returns.
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
            NodeOp::Pause => "Freeze the node: its daemon and IP service (SIGSTOP / docker pause)",
            NodeOp::Resume => "Let a paused node run again",
            NodeOp::Kill => "Kill the node's daemon and IP service without warning (a crash)",
            NodeOp::Restart => {
                "Stop the node if it runs, start a fresh daemon and IP service, and wait until \
                 it rejoins"
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
/// How long a node operation waits for whoever else starts or stops the node's IP
/// service (the supervisor, for at most its start timeout).
const NODE_LOCK_WAIT: Duration = Duration::from_secs(30);

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
    let dir = rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone());
    let layout = Layout::new(&dir);
    // With IP over ExaNet the node is its daemon, its IP service and its namespace: what
    // happens to one happens to the node, or the node is left half there (a restarted
    // daemon without its service: every link up, IP dead).
    let ip = crate::ip_service::enabled(&layout);
    // Held while the node's service is signalled, stopped or started, so that the
    // supervisor does not start one meanwhile (see `supervisor`).
    // The supervisor also restarts daemons that die on their own, on racks that ask it.
    let _held = if ip || crate::supervisor::restarts_daemons(&layout) {
        let locks = layout.ip_run_dir();
        std::fs::create_dir_all(&locks).map_err(|e| CliError::io("create", &locks, e))?;
        crate::ip_service::lock_node(&layout, node, Some(NODE_LOCK_WAIT))?
    } else {
        None
    };
    let running = match process::read_pid_file(&layout.pid_file(&node), node, &dir) {
        PidFile::Running(d) => Some(d),
        _ => None,
    };
    let signal = |sig, d: &process::Daemon| {
        process::signal(d.pid, sig)
            .map_err(|e| CliError::Failed(format!("cannot signal {node} (pid {}): {e}", d.pid)))
    };
    let service = |sig| -> Result<String> {
        if !ip {
            return Ok(String::new());
        }
        Ok(match crate::ip_service::signal_node(&layout, node, sig)? {
            Some(pid) => format!(" and to its IP service, pid {pid}"),
            None => " (its IP service was not running)".to_string(),
        })
    };
    match (op, running) {
        (NodeOp::Pause, Some(d)) => {
            signal(libc::SIGSTOP, &d)?;
            let also = service(libc::SIGSTOP)?;
            Ok(format!("paused (SIGSTOP to pid {}{also})", d.pid))
        }
        (NodeOp::Resume, Some(d)) => {
            signal(libc::SIGCONT, &d)?;
            let also = service(libc::SIGCONT)?;
            Ok(format!("resumed (SIGCONT to pid {}{also})", d.pid))
        }
        (NodeOp::Kill, Some(d)) => {
            signal(libc::SIGKILL, &d)?;
            let service = ip
                .then(|| crate::ip_service::signal_node(&layout, node, libc::SIGKILL))
                .transpose()?
                .flatten();
            wait_gone(d.pid);
            let _ = process::remove_if_present(&layout.pid_file(&node));
            let also = match service {
                Some(pid) => {
                    wait_gone(pid);
                    format!(" and to its IP service, pid {pid}")
                }
                None if ip => " (its IP service was not running)".to_string(),
                None => String::new(),
            };
            Ok(format!("killed (SIGKILL to pid {}{also})", d.pid))
        }
        (NodeOp::Restart, running) => {
            let mut stopped = "it was not running".to_string();
            if ip {
                if let Some(pid) = crate::ip_service::stop_node(&layout, node, STOP_TIMEOUT) {
                    stopped = format!("IP service pid {pid} stopped");
                }
            }
            if let Some(d) = running {
                // A paused daemon cannot act on SIGTERM.
                let _ = process::signal(d.pid, libc::SIGCONT);
                signal(libc::SIGTERM, &d)?;
                let mut how = "stopped";
                if !wait_gone(d.pid) && process::is_our_daemon(d.pid, node, &dir) {
                    let _ = process::signal(d.pid, libc::SIGKILL);
                    wait_gone(d.pid);
                    how = "killed after SIGTERM";
                }
                stopped = if ip && stopped != "it was not running" {
                    format!("pid {} {how}, {stopped}", d.pid)
                } else {
                    format!("pid {} {how}", d.pid)
                };
            }
            let binary = process::daemon_binary()?;
            // An operator's restart is not the supervisor's: the count carries on.
            let restarts = crate::ip_service::restarts_at(
                &crate::supervisor::daemon_restarts_file(&layout, node),
            )
            .count;
            let child = process::spawn_daemon(&binary, &layout, &dir, node, restarts)?;
            if !ip {
                // A rack whose daemons are restarted needs its supervisor for that.
                if let Err(e) = crate::supervisor::ensure_running(rack) {
                    eprintln!("exactl: warning: {e}");
                }
                return Ok(format!(
                    "restarted ({stopped}; new daemon pid {})",
                    child.id()
                ));
            }
            let service = crate::ip_service::start_node(rack, node).map_err(|e| {
                CliError::Failed(format!(
                    "{node}: its daemon was restarted (pid {}) but not its IP service: {e}",
                    child.id()
                ))
            })?;
            // A supervisor that died (or a rack brought up without one) would leave the
            // next service that dies dead.
            if let Err(e) = crate::supervisor::ensure_running(rack) {
                eprintln!("exactl: warning: {e}");
            }
            Ok(format!(
                "restarted ({stopped}; new daemon pid {}, IP service pid {service})",
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

/// Waits up to [`STOP_TIMEOUT`] for process `pid` to exit; true if it did.
fn wait_gone(pid: i32) -> bool {
    let t0 = Instant::now();
    while process::is_alive(pid) {
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

/// The node's IP service in a compose file, if it has one: `exactl rack compose` writes
/// it as the service `NODE-ip` beside `NODE` (a line `  NODE-ip:` under `services:`).
fn compose_ip_service(path: &Path, node: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let name = format!("{node}-ip");
    text.lines()
        .any(|l| l.strip_prefix("  ").and_then(|r| r.strip_suffix(':')) == Some(&name))
        .then_some(name)
}

fn compose(rack: &Rack, op: NodeOp, node: &str, project: &str, file: &str) -> Result<String> {
    let path: PathBuf = rack.dir.join(file);
    let verb = match op {
        NodeOp::Pause => "pause",
        NodeOp::Resume => "unpause",
        NodeOp::Kill => "kill",
        NodeOp::Restart => "restart",
    };
    let run = |service: &str| -> Result<()> {
        let out = compose_command()
            .arg("-p")
            .arg(project)
            .arg("-f")
            .arg(&path)
            .arg(verb)
            .arg(service)
            .output()
            .map_err(|e| CliError::Failed(format!("cannot run the compose tool: {e}")))?;
        if !out.status.success() {
            return Err(CliError::Failed(format!(
                "compose {verb} {service} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    };
    // The node's IP service lives in the node container's network namespace. Restarted
    // after the node, it joins the new one at once, rather than when docker's restart
    // policy gets round to it (backing off up to a minute while the node was down).
    // Killed or paused before the node, it is still running when told, rather than in
    // docker's restart loop, which refuses both; killed, docker (which does not restart
    // what it was told to kill) leaves it down with the node until the restart.
    // Only a service that has a container: compose creates `NODE-ip` only when it is
    // brought up (`docker-compose up -d NODE-ip`), and a rack may run without it.
    let ip = compose_ip_service(&path, node).filter(|ip| {
        compose_command()
            .arg("-p")
            .arg(project)
            .arg("-f")
            .arg(&path)
            .args(["ps", "-a", "-q", ip])
            .output()
            .is_ok_and(|o| o.status.success() && !o.stdout.trim_ascii().is_empty())
    });
    // What became of the IP service, for the message: `" and of M1QAF2-ip"`, or why it
    // did not follow. Only a restart fails with it: the node's own container is what the
    // other operations are about, and they are done.
    let service = |ip: &str| -> Result<String> {
        match run(ip) {
            Ok(()) => Ok(format!(" and of {ip}")),
            Err(e) if op == NodeOp::Restart => Err(e),
            Err(e) => Ok(format!("; {ip} did not follow: {e}")),
        }
    };
    let mut note = String::new();
    if matches!(op, NodeOp::Kill | NodeOp::Pause) {
        if let Some(ip) = &ip {
            note = service(ip)?;
        }
    }
    run(node)?;
    if matches!(op, NodeOp::Resume | NodeOp::Restart) {
        if let Some(ip) = &ip {
            note = service(ip)?;
        }
    }
    let done = match op {
        NodeOp::Pause => "paused",
        NodeOp::Resume => "resumed",
        NodeOp::Kill => "killed",
        NodeOp::Restart => "restarted",
    };
    Ok(if note.starts_with(" and of ") {
        format!("{done} (compose {verb} of its container{note})")
    } else {
        format!("{done} (compose {verb} of its container){note}")
    })
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

/// The id of `node`'s running container in the compose project.
pub fn container_of(rack: &Rack, project: &str, file: &str, node: &str) -> Result<String> {
    let out = crate::nodes::compose_command()
        .arg("-p")
        .arg(project)
        .arg("-f")
        .arg(rack.dir.join(file))
        .args(["ps", "-q"])
        .arg(node)
        .output()
        .map_err(|e| CliError::Failed(format!("cannot run the compose tool: {e}")))?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || id.is_empty() || id.contains(char::is_whitespace) {
        return Err(CliError::Failed(format!(
            "{node} has no running container in compose project {project}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compose_node_has_its_ip_service_when_the_file_says_so() {
        let dir = std::env::temp_dir().join(format!("exactl-nodes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("docker-compose.yml");
        std::fs::write(
            &f,
            "services:\n  M1QAF1:\n    image: x\n  M1QAF1-ip:\n    network_mode: \"service:M1QAF1\"\n  \
             M1QAF2:\n    image: x\n    command: [\"M1QAF2-ip:\"]\n",
        )
        .unwrap();
        assert_eq!(
            compose_ip_service(&f, "M1QAF1").as_deref(),
            Some("M1QAF1-ip")
        );
        // A node without one, even where its name appears elsewhere in the file.
        assert_eq!(compose_ip_service(&f, "M1QAF2"), None);
        assert_eq!(compose_ip_service(&dir.join("absent.yml"), "M1QAF1"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
