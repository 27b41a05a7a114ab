//! exactl: operate an exanet virtual rack.
//!
//! ```text
//! exactl [--rack DIR] rack up [--shape 4x4x2] [--name NAME] [--window BYTES] [--link-timeout SECS] [--base-port N] [--timeout SECS]
//! exactl [--rack DIR] rack down [--timeout SECS]
//! exactl [--rack DIR] status [--json]
//! exactl [--rack DIR] ping SRC DST [--count N] [--timeout-ms MS] [--json]
//! exactl [--rack DIR] link set A B [--dir both|A-B|B-A] [--delay D] [--jitter J] [--rate R]
//!                              [--loss P] [--corrupt P] [--down|--up]
//! exactl [--rack DIR] link clear (A B | --all)
//! exactl [--rack DIR] link show [--all] [--json]
//! exactl [--rack DIR] node pause|resume|kill|restart NAME
//! exactl [--rack DIR] partition NODES... [--from NODES...]
//! exactl [--rack DIR] heal
//! exactl [--rack DIR] top [--interval D] [--count N] [--limit N] [--json]
//! exactl [--rack DIR] chaos run PLAN [--seed N] [--dry-run]
//! exactl [--rack DIR] hosts
//! exactl [--rack DIR] exec NODE [--] CMD [ARGS...]
//! ```
//!
//! The rack directory is `--rack DIR`, else `$EXANET_RACK`, else `./exanet-rack`, taken
//! relative to the directory exactl is run in.
//! Exit codes: 0 success, 1 runtime failure, 2 bad input, 3 a `rack up` that failed and
//! could not stop all it had started.

#![forbid(unsafe_code)]

mod capture;
mod chaos;
mod control;
mod error;
mod exec;
mod fabric;
mod faults;
mod hosts;
mod interrupt;
mod ip_service;
mod job_watch;
mod live;
mod mpirun;
mod needs;
mod node_host;
mod nodes;
mod ping;
mod port_lock;
mod process;
mod rack_cmd;
mod rack_prometheus;
mod status;
mod stdout;
mod supervisor;
mod table;
mod top;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use exanet_deploy as deploy;
use exanet_proto::{NodeName, Shape};

use crate::error::{CliError, EXIT_USAGE};

#[derive(Debug, Parser)]
#[command(
    name = "exactl",
    version,
    arg_required_else_help = false,
    about = "Operate an exanet virtual rack (an emulated ExaNeSt rack of exanetd daemons)",
    after_help = "The rack directory is --rack DIR, else $EXANET_RACK, else ./exanet-rack.\n\
                  Exit status: 0 success, 1 runtime failure, 2 bad input, 3 a failed\n\
                  `rack up` that could not stop all it had started."
)]
struct Cli {
    /// Rack directory [default: $EXANET_RACK, else ./exanet-rack]
    #[arg(long, global = true, value_name = "DIR")]
    rack: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start or stop the local rack
    #[command(subcommand, arg_required_else_help = false)]
    Rack(RackCommand),
    /// Show every node and link of the rack with state and counters
    Status(StatusArgs),
    /// Probe DST from SRC: the path hop by hop and the round-trip times
    Ping(PingArgs),
    /// Faults on links: delay, jitter, rate, loss, corruption, cuts
    #[command(subcommand)]
    Link(LinkCommand),
    /// Pause, resume, kill or restart a node's daemon
    #[command(subcommand)]
    Node(nodes::NodeCommand),
    /// Cut every link between two sets of nodes (NODES from the rest of the rack by default)
    Partition(PartitionArgs),
    /// Set every cut link up again (other faults stay)
    Heal,
    /// Live view of the rack: busiest links, stalls, retransmissions, NACKs
    Top(top::TopArgs),
    /// Fault plans: faults scheduled over time, reproducible for a seed
    #[command(subcommand)]
    Chaos(ChaosCommand),
    /// Print the nodes' IP over ExaNet addresses as an /etc/hosts fragment
    Hosts,
    /// Run a command on a node (its workloads attach to that node's daemon)
    Exec(ExecArgs),
    /// Run an unmodified MPI program with one rank per node, over the NI (the libfabric
    /// provider, Open MPI) or over IP over ExaNet; on local and compose racks
    Mpirun(MpirunArgs),
    /// Capture the cells passing a node or one link direction into a pcapng file (read it
    /// with Wireshark and the dissector `exactl dissector` prints)
    Capture(capture::CaptureArgs),
    /// Print the Wireshark dissector (Lua) for this build's captures, e.g.
    /// `exactl dissector > exanet.lua; tshark -X lua_script:exanet.lua -r cap.pcapng`
    Dissector,
}

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
struct MpirunArgs {
    /// The nodes that get a rank, in rank order, e.g. M1QAF1,M1QBF2 [default: every node]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_node_name, conflicts_with = "np")]
    nodes: Vec<NodeName>,
    /// N ranks on the first nodes (by node id: whole QFDBs in turn), --ranks-per-node on
    /// each
    #[arg(long = "np", short = 'n', value_name = "N")]
    np: Option<u32>,
    /// Ranks on each node, consecutive ranks together, each attached to the node's NI as
    /// ExaNet-MPI's ranks were (1 to 4: an MPSoC's four A53 cores; the report's LAMMPS
    /// study ran 4)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4))]
    ranks_per_node: u32,
    /// The MPI to launch with, Open MPI or MPICH (Debian's, or another named by --mpirun;
    /// each with the launcher and transport settings it needs on the rack)
    #[arg(long, value_enum, default_value = "openmpi", env = "EXANET_MPI")]
    mpi: mpirun::Mpi,
    /// What carries the messages: the NI itself through the libfabric provider exanet
    /// (Open MPI; an MPICH with ch4:ofi, e.g. PyPI's), or TCP over IP over ExaNet
    /// [default: ni when the provider is built beside exactl and the MPI can load it,
    /// otherwise ip; exactl says which it chose and why]
    #[arg(long, value_enum, env = "EXANET_MPI_FABRIC")]
    fabric: Option<mpirun::Fabric>,
    /// MPI_Wtime and the program thread's gettimeofday answer each rank's modeled clock
    /// (what the ExaNeSt hardware would have taken), so that the program's own timings are
    /// modeled; the program's compute between its MPI calls counts, the MPI library's
    /// processing inside them is the rack's software_ns per call (needs --fabric ni)
    #[arg(long)]
    modeled: bool,
    /// The launcher to run [default: mpirun.openmpi or mpirun; with --mpi mpich,
    /// mpiexec.hydra, mpiexec.mpich or mpiexec: the first on PATH]
    #[arg(long, value_name = "PATH", env = "EXANET_MPIRUN")]
    mpirun: Option<std::ffi::OsString>,
    /// An extra argument for the launcher (repeat for several), e.g. --mpi-arg=--mca --mpi-arg=btl_base_verbose --mpi-arg=30
    #[arg(long = "mpi-arg", value_name = "ARG", allow_hyphen_values = true)]
    mpi_args: Vec<std::ffi::OsString>,
    /// The program and its arguments (after `--` if they start with a dash)
    #[arg(value_name = "PROGRAM", required = true, num_args = 1.., allow_hyphen_values = true)]
    program: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
struct ExecArgs {
    /// On a compose rack: run it in a container beside the node's (its IPC, PID and
    /// network namespaces, the rack directory at /rack) that has this host's /usr and the
    /// working directory, so that programs installed here (an MPI and its applications)
    /// run on the node. Elsewhere commands run on this host anyway.
    #[arg(long)]
    host_programs: bool,
    /// With --host-programs: also this host's directory DIR, read-only at the same path
    /// (repeat for several), e.g. an MPI installed outside /usr (a virtual environment)
    #[arg(long, value_name = "DIR", requires = "host_programs")]
    mount: Vec<std::path::PathBuf>,
    /// The node, e.g. M1QAF2
    #[arg(value_name = "NODE", value_parser = parse_node_name)]
    node: NodeName,
    /// The command and its arguments (after `--` if they start with a dash)
    #[arg(value_name = "CMD", required = true, num_args = 1.., allow_hyphen_values = true)]
    cmd: Vec<std::ffi::OsString>,
}

#[derive(Debug, Subcommand)]
enum ChaosCommand {
    /// Run a fault plan against the rack (undoing what it set at the end or on Ctrl-C)
    Run(chaos::ChaosRunArgs),
}

#[derive(Debug, Subcommand)]
enum LinkCommand {
    /// Change the faults of the link between A and B (faults not named stay as they are)
    Set(LinkSetArgs),
    /// Remove every fault from the link between A and B (or from all links)
    Clear(LinkClearArgs),
    /// Links with faults set or injected, with what the injectors did
    Show(LinkShowArgs),
}

#[derive(Debug, Args)]
struct LinkSetArgs {
    #[arg(value_name = "A", value_parser = parse_node_name)]
    a: NodeName,
    #[arg(value_name = "B", value_parser = parse_node_name)]
    b: NodeName,
    /// Direction the faults apply to: both, A-B or B-A (node names work too)
    #[arg(long, value_name = "DIR", default_value = "both")]
    dir: String,
    /// One flag per fault kind, from exanet_proto::fault::FaultKind
    #[command(flatten)]
    faults: faults::FaultFlags,
}

#[derive(Debug, Args)]
struct LinkClearArgs {
    #[arg(value_name = "A", value_parser = parse_node_name, required_unless_present = "all", requires = "b", conflicts_with = "all")]
    a: Option<NodeName>,
    #[arg(value_name = "B", value_parser = parse_node_name)]
    b: Option<NodeName>,
    /// Clear every link of the rack
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Args)]
struct LinkShowArgs {
    /// List every link, not only those with faults
    #[arg(long)]
    all: bool,
    /// Print one JSON object
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PartitionArgs {
    /// Nodes on one side (space- or comma-separated)
    #[arg(value_name = "NODES", required = true)]
    nodes: Vec<String>,
    /// Nodes on the other side [default: every other node]
    #[arg(long, value_name = "NODES", num_args = 1..)]
    from: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum RackCommand {
    /// Create the rack (if needed) and start one exanetd per node on this machine; returns
    /// once every link is up
    Up(UpArgs),
    /// Stop every daemon of the rack
    Down(DownArgs),
    /// Create the rack CA and every missing node certificate of the rack file (for racks
    /// started by compose, swarm or Kubernetes rather than `rack up`)
    Pki,
    /// Write a docker compose project (and swarm stack) running the rack, one container
    /// per node
    Compose(ComposeArgs),
    /// Write Kubernetes manifests (StatefulSet, headless Service, kustomization) running
    /// the rack, one pod per node
    K8s(K8sArgs),
    /// Run Debian's prometheus against this local rack's daemons, serving the rack's
    /// console pages (rack view, per-link and per-node pages)
    Prometheus(rack_prometheus::PrometheusArgs),
    /// The local rack's supervisor, started by `rack up` and stopped by `rack down`:
    /// restarts IP services that die while their daemon runs
    #[command(hide = true)]
    Supervise,
}

#[derive(Debug, Args)]
struct ComposeArgs {
    /// Rack shape in QFDBs along X, Y, Z
    #[arg(long, value_name = "XxYxZ", value_parser = parse_shape, allow_hyphen_values = true)]
    shape: Shape,
    /// Rack and compose project name [default: exanet-<shape>]
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Directory to write [default: ./exanet-<shape>]
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Private IPv4 network of the rack; nodes get static addresses from its lower half
    #[arg(long, value_name = "CIDR", default_value = deploy::compose::DEFAULT_SUBNET)]
    subnet: String,
    /// Image of the daemons and workloads (docker/build.sh makes exanet:latest)
    #[arg(long, value_name = "IMAGE", default_value = deploy::DEFAULT_IMAGE)]
    image: String,
    /// Add a Prometheus service that scrapes every node
    #[arg(long)]
    prometheus: bool,
    /// Add Grafana with the rack's dashboards (needs --prometheus)
    #[arg(long, requires = "prometheus")]
    grafana: bool,
}

#[derive(Debug, Args)]
struct K8sArgs {
    /// Rack shape in QFDBs along X, Y, Z
    #[arg(long, value_name = "XxYxZ", value_parser = parse_shape, allow_hyphen_values = true)]
    shape: Shape,
    /// StatefulSet, Service and rack name [default: exanet-<shape>]
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Directory to write [default: ./exanet-<shape>-k8s]
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Image of the daemons
    #[arg(long, value_name = "IMAGE", default_value = deploy::DEFAULT_IMAGE)]
    image: String,
}

#[derive(Debug, Args)]
struct UpArgs {
    /// Rack shape in QFDBs along X, Y, Z (a new rack only) [default: 4x4x2]
    #[arg(long, value_name = "XxYxZ", value_parser = parse_shape, allow_hyphen_values = true)]
    shape: Option<Shape>,
    /// Rack name: daemons of differently named racks never link (a new rack only)
    /// [default: the rack directory's name]
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// In-flight window per link and virtual channel, bytes (a new rack only)
    /// [default: 262144]
    #[arg(long, value_name = "BYTES")]
    window: Option<u32>,
    /// Seconds of silence from a link's peer after which the link is down (3..=600; a new
    /// rack only). Keep-alives, an idle rack's main cost, go at under a third of it
    /// [default: 10]
    #[arg(long, value_name = "SECS")]
    link_timeout: Option<u32>,
    /// Number ports from N: link (UDP) N+id, metrics (TCP) N+nodes+id (a new rack only)
    /// [default: free ports picked at random]
    #[arg(long, value_name = "N")]
    base_port: Option<u16>,
    /// IP over ExaNet: a network namespace, TUN device and exanet-ip service per node.
    /// auto: when this machine allows it (root, /dev/net/tun, ip), else say why and go
    /// on; on: fail without it; off: none
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = rack_cmd::IpMode::Auto, env = "EXANET_RACK_IP")]
    ip: rack_cmd::IpMode,
    /// What becomes of a daemon that dies on its own (not by exactl node kill/restart or
    /// rack down): no: it stays down until `exactl node restart`; unless-stopped: the
    /// rack's supervisor starts it again with its IP service, counted
    /// (exanet_node_restarts_total), as compose and systemd racks do
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = rack_cmd::RestartPolicy::No, env = "EXANET_RACK_RESTART")]
    restart: rack_cmd::RestartPolicy,
    /// Give up when the links are not all up after this many seconds
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    timeout: u64,
}

#[derive(Debug, Args)]
struct DownArgs {
    /// Seconds to wait after SIGTERM before killing the daemons that are still running
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600))]
    timeout: u64,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// Print one JSON object instead of tables
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PingArgs {
    /// Node that sends the probes, e.g. M1QAF1
    #[arg(value_name = "SRC", value_parser = parse_node_name)]
    src: NodeName,
    /// Node that answers them, e.g. M1QBF2
    #[arg(value_name = "DST", value_parser = parse_node_name)]
    dst: NodeName,
    /// Number of probes, sent one after the other
    #[arg(long, short = 'c', value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10000))]
    count: u32,
    /// How long to wait for each probe, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
    /// Print the daemon's report as one JSON object
    #[arg(long)]
    json: bool,
}

fn parse_shape(s: &str) -> Result<Shape, String> {
    s.parse::<Shape>().map_err(|e| e.to_string())
}

pub(crate) fn parse_node_name(s: &str) -> Result<NodeName, String> {
    s.parse::<NodeName>().map_err(|e| e.to_string())
}

fn run(cli: Cli) -> Result<(), CliError> {
    // Resolved once, here: the programs a rack starts (daemons, IP services, mpirun's
    // agent) run in other directories, and a relative rack directory would name another
    // place for each of them.
    let dir = exanet_control::rack::rack_dir(cli.rack.as_deref());
    if dir.as_os_str().is_empty() {
        return Err(CliError::BadValue {
            what: "--rack",
            value: "\"\"".into(),
            message: "names no directory".into(),
        });
    }
    let dir = std::path::absolute(&dir)
        .map_err(|e| CliError::io("resolve the rack directory", &dir, e))?;
    match cli.command {
        Command::Rack(RackCommand::Up(a)) => rack_cmd::up(
            &dir,
            &rack_cmd::UpOptions {
                shape: a.shape,
                name: a.name,
                window: a.window,
                link_timeout: a.link_timeout,
                base_port: a.base_port,
                ip: a.ip,
                restart: a.restart,
                timeout: Duration::from_secs(a.timeout),
            },
        ),
        Command::Rack(RackCommand::Down(a)) => rack_cmd::down(&dir, Duration::from_secs(a.timeout)),
        Command::Rack(RackCommand::Pki) => say(deploy::pki(&dir)),
        Command::Rack(RackCommand::Compose(a)) => {
            let subnet = a.subnet.parse().map_err(|message| CliError::BadValue {
                what: "--subnet",
                value: a.subnet.clone(),
                message,
            })?;
            let out = a
                .out
                .unwrap_or_else(|| PathBuf::from(format!("exanet-{}", a.shape)));
            say(deploy::compose::run(
                &out,
                &deploy::compose::ComposeOptions {
                    shape: a.shape,
                    name: a.name,
                    subnet,
                    image: a.image,
                    prometheus: a.prometheus,
                    grafana: a.grafana,
                },
            ))
        }
        Command::Rack(RackCommand::K8s(a)) => {
            let out = a
                .out
                .unwrap_or_else(|| PathBuf::from(format!("exanet-{}-k8s", a.shape)));
            say(deploy::k8s::run(
                &out,
                &deploy::k8s::K8sOptions {
                    shape: a.shape,
                    name: a.name,
                    image: a.image,
                },
            ))
        }
        Command::Status(a) => status::run(&dir, a.json),
        Command::Ping(a) => ping::run(
            &dir,
            &ping::PingOptions {
                src: a.src,
                dst: a.dst,
                count: a.count,
                timeout_ms: a.timeout_ms,
                json: a.json,
            },
        ),
        Command::Link(LinkCommand::Set(a)) => faults::set(&dir, a.a, a.b, &a.dir, &a.faults.0),
        Command::Link(LinkCommand::Clear(a)) => faults::clear(&dir, a.a.zip(a.b)),
        Command::Link(LinkCommand::Show(a)) => faults::show(&dir, a.json, a.all),
        Command::Node(c) => nodes::run(&dir, c.op, c.name),
        Command::Partition(a) => faults::partition(&dir, &a.nodes, &a.from),
        Command::Heal => faults::heal(&dir),
        Command::Top(a) => top::run(&dir, &a),
        Command::Chaos(ChaosCommand::Run(a)) => chaos::run(&dir, &a),
        Command::Hosts => hosts::run(&dir),
        Command::Capture(a) => capture::run(&dir, a),
        Command::Dissector => capture::print_dissector(),
        Command::Rack(RackCommand::Prometheus(a)) => rack_prometheus::run(&dir, a),
        Command::Rack(RackCommand::Supervise) => supervisor::run(&dir),
        Command::Exec(a) => exec::run(
            &dir,
            a.node,
            &a.cmd,
            a.host_programs.then_some(a.mount.as_slice()),
        ),
        Command::Mpirun(a) => {
            let ranks = match (a.np, a.nodes.is_empty()) {
                (Some(n), _) => mpirun::Ranks::Count(n),
                (None, false) => {
                    let shape = exanet_control::rack::Rack::load(&dir)?.shape();
                    let ids = a
                        .nodes
                        .iter()
                        .map(|&n| shape.id_of(n))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| CliError::Usage(e.to_string()))?;
                    mpirun::Ranks::Nodes(ids)
                }
                (None, true) => mpirun::Ranks::All,
            };
            let code = mpirun::run(
                &dir,
                mpirun::Launch {
                    mpi: a.mpi,
                    fabric: a.fabric,
                    modeled: a.modeled,
                    ranks,
                    ranks_per_node: a.ranks_per_node,
                    launcher: a.mpirun,
                    mpirun_args: a.mpi_args,
                    program: a.program,
                },
            )?;
            std::process::exit(code)
        }
    }
}

/// Prints the report of a generator (what it wrote, how to start it) when it succeeded.
fn say(report: exanet_deploy::error::Result<String>) -> Result<(), CliError> {
    crate::stdout::outln!("{}", report?);
    Ok(())
}

/// A clap usage error folded onto one line: the problem, then the usage it violated.
fn one_line_usage_error(rendered: &str) -> String {
    let mut message: Vec<&str> = Vec::new();
    let mut usage = None;
    for line in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(u) = line.strip_prefix("Usage:") {
            usage = Some(u.trim());
        } else if line.starts_with("For more information") {
            continue;
        } else {
            message.push(line);
        }
    }
    let mut text = message.join(" ");
    if let Some(rest) = text.strip_prefix("error:") {
        text = rest.trim().to_string();
    }
    match usage {
        Some(u) => format!("{text} (usage: {u})"),
        None => format!("{text} (see --help)"),
    }
}

/// mpirun's own spelling `-np N` for `exactl mpirun`'s `--np N`: clap has no
/// two-letter short options, and without this `-np` would be taken for the start of the
/// program (and `--nodes`, `--mpi-arg` after it handed to mpirun as the program's).
/// Only exactl's options are rewritten: nothing after the subcommand's `--` or program.
fn mpirun_np_spelling(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let Some(sub) = args.iter().position(|a| a == "mpirun") else {
        return args;
    };
    // Options of exactl mpirun that take a value (its own and the global ones, as clap
    // declares them): their value is never the program.
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let valued: Vec<String> = cmd
        .find_subcommand("mpirun")
        .map(|m| {
            m.get_arguments()
                .filter(|a| !a.is_positional() && a.get_action().takes_values())
                .flat_map(|a| {
                    let long = a.get_long().map(|l| format!("--{l}"));
                    let short = a.get_short().map(|c| format!("-{c}"));
                    long.into_iter().chain(short)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out: Vec<std::ffi::OsString> = args[..=sub].to_vec();
    let mut rest = args[sub + 1..].iter();
    while let Some(a) = rest.next() {
        let text = a.to_string_lossy();
        if a == "-np" {
            out.push("--np".into());
        } else if valued.iter().any(|v| v == text.as_ref()) {
            out.push(a.clone());
            out.extend(rest.next().cloned());
        } else if text.starts_with('-') && text != "--" {
            out.push(a.clone());
        } else {
            // `--` or the program: everything from here is the program's.
            out.push(a.clone());
            out.extend(rest.cloned());
            break;
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(mpirun_np_spelling(std::env::args_os().collect())) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                        ExitCode::from(EXIT_USAGE)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                _ => {
                    eprintln!("exactl: {}", one_line_usage_error(&e.render().to_string()));
                    ExitCode::from(EXIT_USAGE)
                }
            };
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exactl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn usage_errors_fold_to_one_line() {
        let e = Cli::try_parse_from(["exactl", "ping", "M1QAF1"]).unwrap_err();
        let line = one_line_usage_error(&e.render().to_string());
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains("<DST>") && line.contains("usage: exactl ping"),
            "{line}"
        );
        let e = Cli::try_parse_from(["exactl", "rack", "up", "--shape", "4x0x2"]).unwrap_err();
        let line = one_line_usage_error(&e.render().to_string());
        assert!(
            line.contains("every dimension must be at least 1"),
            "{line}"
        );
        assert!(!line.starts_with("error:"), "{line}");
    }

    #[test]
    fn mpirun_takes_np_as_mpirun_spells_it_and_leaves_the_program_alone() {
        let parse = |args: &[&str]| {
            let args = args.iter().map(std::ffi::OsString::from).collect();
            match Cli::try_parse_from(mpirun_np_spelling(args))
                .unwrap()
                .command
            {
                Command::Mpirun(a) => a,
                other => panic!("{other:?}"),
            }
        };
        let a = parse(&[
            "exactl",
            "mpirun",
            "-np",
            "4",
            "--mpi-arg=-x",
            "--",
            "prog",
            "-np",
            "2",
        ]);
        assert_eq!(a.np, Some(4));
        assert_eq!(a.mpi_args, vec![std::ffi::OsString::from("-x")]);
        assert_eq!(a.program, ["prog", "-np", "2"]);
        let a = parse(&["exactl", "mpirun", "--fabric", "ni", "-np", "3", "prog"]);
        assert_eq!((a.fabric, a.np), (Some(mpirun::Fabric::Ni), Some(3)));
        assert_eq!(a.program, ["prog"]);
        let a = parse(&["exactl", "mpirun", "--mpi-arg", "-np", "prog", "-np"]);
        assert_eq!(a.np, None, "a value of --mpi-arg is not exactl's -np");
        assert_eq!(a.mpi_args, ["-np"]);
        assert_eq!(a.program, ["prog", "-np"]);
        // After the MPI or the fabric is chosen, -np is still exactl's.
        for (mpi, fabric) in [
            (&["--mpi", "mpich"][..], &["--fabric", "ip"][..]),
            (&["--mpi=mpich"], &["--fabric=ip"]),
            (&["--mpi", "mpich"], &["--rack", "/r"]),
        ] {
            let mut args = vec!["exactl", "mpirun"];
            args.extend_from_slice(mpi);
            args.extend_from_slice(fabric);
            args.extend_from_slice(&["--mpirun", "echo", "-np", "8", "--", "prog"]);
            let a = parse(&args);
            assert_eq!(a.mpi, mpirun::Mpi::Mpich, "{args:?}");
            let asked = fabric[0]
                .starts_with("--fabric")
                .then_some(mpirun::Fabric::Ip);
            assert_eq!(a.fabric, asked, "{args:?}");
            assert_eq!(a.np, Some(8), "{args:?}");
            assert_eq!(a.program, ["prog"], "{args:?}");
        }
    }

    #[test]
    fn global_rack_option_goes_anywhere() {
        let c = Cli::try_parse_from(["exactl", "status", "--rack", "/r", "--json"]).unwrap();
        assert_eq!(c.rack.as_deref(), Some(std::path::Path::new("/r")));
        let c = Cli::try_parse_from(["exactl", "--rack", "/r", "rack", "down"]).unwrap();
        assert!(matches!(c.command, Command::Rack(RackCommand::Down(_))));
    }
}
