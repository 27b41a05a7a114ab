//! exanet-perf: workload programs that measure an exanet rack through the NI, the way an
//! application sees it (packetizer, mailboxes, RDMA over the attach interface).
//!
//! ```text
//! exanet-perf [--rack DIR] [--node NODE] [--job-key KEY] [--spin-us N] <BENCH> serve [--sessions N]
//! exanet-perf [...] pingpong run --peer NODE[:RANK] [--sizes 0,8,64] [--iterations N] [--json]
//! exanet-perf [...] rdma-lat run --peer NODE[:RANK] [--op write|read] [--sizes 4K,4M] [--verify] [--json]
//! exanet-perf [...] rdma-bw  run --peer NODE[:RANK] [--op write|read] [--window W] [--verify] [--json]
//! exanet-perf [...] contend --pattern incast|shared-link|bidir|qfdb-all-to-all [--senders 8] [--size 4M] [--json]
//! exanet-perf floor [--size 8] [--frame 256] [--batch 64] [--frames N | --duration-ms 2000] [--json]
//! ```
//!
//! Benchmarks run as a pair: `serve` attached to one node (`EXANET_NODE` or `--node`),
//! `run --peer NODE` attached to another. Any `serve` serves every benchmark; the bench
//! name in front of `serve` is only for symmetry.
//!
//! - `pingpong`: the client sends a message of each size (0..=64 B) from a packetizer to the
//!   server's data mailbox, the server echoes it back to the client's mailbox; one-way
//!   latency = round trip / 2.
//! - `rdma-lat`: one RDMA write (or read) at a time into (from) the server's buffer; the
//!   latency is from posting to the completion (every block ACKed; for a read, the data in
//!   the client's memory).
//! - `rdma-bw`: `--window` transfers in flight on as many channels, each into its own slot
//!   of the server's buffer; bandwidth = bytes / time from the first post to the last
//!   completion.
//! - `contend`: RDMA write streams that compete for the rack (incast, two flows through one
//!   torus link, both directions of one, all-to-all in a QFDB), all from this process so
//!   that they contend in modeled time; each flow's throughput and share (see
//!   `contend.rs`).
//! - `floor`: no rack; QUIC alone, two endpoints set up by exanetd's own code on loopback
//!   in this process: ping-pong one-way latency and a 256 B frame stream (see `floor.rs`).
//!
//! `--json` prints one JSON object per size, with at least `size`, `iterations`,
//! `p50_us`, `p99_us` and (RDMA) `gbps`, `verified_transfers` (how many transfers of that
//! size were compared byte for byte: with `--verify`, every one of rdma-lat, warmup
//! included, and the last one into each of the window's slots for rdma-bw; 0 without).
//! Without `--json`, a table, and with `--verify` a line `verified N transfers byte for
//! byte (...)`.
//!
//! The collectives (`allreduce`, `bcast`, `barrier`) check every result of every member,
//! warm-up included, against a reference computed here (each member's vector differs from
//! the others' and along its length, negatives included), and stop at the first wrong one.
//! Their rows carry `verified_results` (how many results were compared) and `verified`
//! (every member's every result was; false for a barrier, which has none).
//!
//! A client says on stderr what it will do (peer, sizes, counts, whether it verifies)
//! before it starts, and shows how far it got every `--progress-ms` (2 s) while it runs;
//! `--quiet` silences both. stdout carries only results.
//!
//! # Rendezvous protocol
//!
//! The server allocates, in this order, its **control mailbox** (the first mailbox it
//! allocates, so vi 0 when it is the node's only workload using mailboxes), its **data
//! mailbox** and a packetizer, then prints
//! `ready node=NODE rank=R mailbox=VI data_mailbox=VI pdid=P` on stdout. A client is told
//! the server's node and rank (`--peer NODE[:RANK]`, rank 0 by default) and control mailbox
//! (`--peer-mailbox VI`, 0 by default). Messages (one packetizer message each, layout in
//! `wire.rs`: `"XPRF"`, version 1, kind, big-endian fields):
//!
//! 1. client -> server control mailbox: `HELLO {bench, client mailbox vi, buffer bytes}`.
//!    The client's node and rank are not in the message: the server takes them from the
//!    message's source, which the NI stamps. A NACK (`no_context`: no server yet) or a
//!    network timeout is retried until `--connect-timeout`.
//! 2. server -> client mailbox: `WELCOME {status, data mailbox vi, buffer VA, buffer length,
//!    notification VA}`. For RDMA the server registers `buffer + 4096` bytes: the buffer,
//!    then a page where `--notify` writes put their completion notifications.
//! 3. pingpong: client pings -> server data mailbox, which echoes each message verbatim to
//!    the mailbox of the session of its source (node, rank).
//!    RDMA: the client writes into / reads from the buffer. With `--verify`, the client
//!    asks the server (control mailbox) to `FILL {seed, offset, len}` its buffer with a
//!    test pattern before a read and to `CHECK {seed, offset, len}` it after a write; the
//!    server answers `DONE {status, first bad offset}`. Verification is not timed.
//! 4. client -> server control mailbox: `BYE`; the server frees the session's buffer.
//!    `serve --sessions N` exits after N sessions ended (0, the default: never).
//!
//! Exit status: 0 success, 1 runtime failure, 2 bad usage.

#![forbid(unsafe_code)]

mod client;
mod collective;
mod contend;
mod floor;
mod progress;
mod server;
mod stats;
mod wire;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use exanet::{Config, Endpoint};

#[derive(Debug, Parser)]
#[command(
    name = "exanet-perf",
    version,
    about = "Measure an exanet rack through the NI: packetizer ping-pong, RDMA latency and bandwidth",
    after_help = "Run as a pair: `exanet-perf <bench> serve` attached to one node (EXANET_NODE), \
                  `exanet-perf <bench> run --peer NODE[:RANK]` attached to another."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Debug, Args)]
struct Global {
    /// Rack directory [default: $EXANET_RACK, else ./exanet-rack]
    #[arg(long, global = true, value_name = "DIR")]
    rack: Option<PathBuf>,
    /// Node to attach to, e.g. M1QAF2 [default: $EXANET_NODE]
    #[arg(long, global = true, value_name = "NODE")]
    node: Option<String>,
    /// Job key [default: $EXANET_JOB_KEY, else the rack's default job]
    #[arg(long, global = true, value_name = "KEY")]
    job_key: Option<String>,
    /// Spin budget of waits before sleeping, microseconds [default: $EXANET_SPIN_US, else 20]
    #[arg(long, global = true, value_name = "US")]
    spin_us: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Packetizer -> mailbox ping-pong, 0..64 B messages
    #[command(subcommand)]
    Pingpong(PingRole),
    /// RDMA write or read latency, one transfer at a time
    #[command(subcommand)]
    RdmaLat(RdmaLatRole),
    /// RDMA write or read bandwidth, several transfers in flight
    #[command(subcommand)]
    RdmaBw(RdmaBwRole),
    /// Allreduce over a group: the NI's accelerator or software (one thread per member)
    Allreduce(CollArgs),
    /// Broadcast from a root over a group (binomial tree)
    Bcast(CollArgs),
    /// Barrier over a group
    Barrier(CollArgs),
    /// RDMA write streams competing for the rack: incast, a shared torus link, both
    /// directions of a link, all-to-all in a QFDB (one endpoint per flow, in this process)
    Contend(ContendArgs),
    /// The floor: QUIC alone, two endpoints set up as exanetd's links, on loopback in this
    /// process (no rack): ping-pong one-way latency and a stream of 256 B frames
    Floor(FloorArgs),
}

#[derive(Debug, Args)]
struct FloorArgs {
    /// Ping-pong message size, bytes (>= 1)
    #[arg(long, value_name = "BYTES", default_value = "8", value_parser = parse_floor_size)]
    size: u32,
    /// Measured ping-pong round trips (0: no ping-pong)
    #[arg(long, value_name = "N", default_value_t = 5000)]
    iterations: u64,
    /// Unmeasured round trips first
    #[arg(long, value_name = "N", default_value_t = 200)]
    warmup: u64,
    /// Frame size of the stream, bytes (>= 8: each frame carries its sequence number)
    #[arg(long, value_name = "BYTES", default_value = "256", value_parser = parse_floor_frame)]
    frame: u32,
    /// Frames per write to the stream, as the daemon's link writer hands quinn the cells it
    /// has queued (1: a write per frame, which quinn 0.11 pays for per write)
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    batch: u32,
    /// Send this many frames [default: for --duration-ms]
    #[arg(long, value_name = "N", conflicts_with = "duration_ms")]
    frames: Option<u64>,
    /// Send frames for this long, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    duration_ms: u64,
    /// Two JSON objects on stdout: `floor-pingpong` (one-way p50_us, min_us, max_us, ...)
    /// and `floor-stream` (gbps, frames_per_s, bytes_received, frames_verified, ...)
    #[arg(long)]
    json: bool,
    /// Give up after this long, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    timeout_ms: u64,
    /// Say nothing on stderr but errors
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Debug, Args)]
struct ContendArgs {
    /// Which flows compete
    #[arg(long, value_enum)]
    pattern: contend::Pattern,
    /// incast: how many nodes send
    #[arg(long, value_name = "N", default_value_t = 8)]
    senders: u32,
    /// incast: the receiving node [default: the rack's first]
    #[arg(long, value_name = "NODE")]
    to: Option<String>,
    /// Bytes per transfer (K, M suffixes)
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1M")]
    size: u64,
    /// Transfers per flow
    #[arg(long, value_name = "N", default_value_t = 16)]
    iterations: u64,
    /// Transfers in flight per flow
    #[arg(long, value_name = "W", default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=8))]
    window: u8,
    /// Run each flow by itself first and report its modeled rate alone beside the
    /// competing one
    #[arg(long)]
    alone: bool,
    /// One JSON object per flow, then one for all, on stdout
    #[arg(long)]
    json: bool,
    /// Give a transfer up after this long, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    timeout_ms: u64,
}

#[derive(Debug, Args)]
struct CollArgs {
    /// Members in rank order: NODE[:RANK],... (this process attaches to each)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_peer, conflicts_with = "qfdbs")]
    members: Vec<(String, u8)>,
    /// Members: the nodes of the rack's first N QFDBs, rank 0 each
    #[arg(long, value_name = "N")]
    qfdbs: Option<u32>,
    /// Vector sizes, bytes (K suffix: 1024)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_size, default_value = "8,64,256,1K")]
    sizes: Vec<u64>,
    /// Measured iterations per size
    #[arg(long, value_name = "N", default_value_t = 100)]
    iterations: u64,
    /// Unmeasured iterations per size first
    #[arg(long, value_name = "N", default_value_t = 10)]
    warmup: u64,
    /// The NI's allreduce accelerator: on, off (software), or auto
    #[arg(long, value_enum, default_value_t = collective::Accel::Auto)]
    accel: collective::Accel,
    /// Software collectives send steps of up to this many bytes as messages, longer ones by
    /// rendezvous over RDMA [default: 32, ExaNet-MPI's; at most 65535]
    #[arg(long, value_name = "BYTES")]
    eager: Option<usize>,
    #[arg(long, value_enum, default_value_t = collective::Op::Sum)]
    op: collective::Op,
    #[arg(long = "type", value_enum, default_value_t = collective::Type::F64)]
    ty: collective::Type,
    /// The broadcast's root (member index)
    #[arg(long, default_value_t = 0)]
    root: usize,
    /// One JSON object per size on stdout
    #[arg(long)]
    json: bool,
    /// Give a collective up after this long, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    timeout_ms: u64,
}

#[derive(Debug, Subcommand)]
enum PingRole {
    /// Serve clients (of any benchmark)
    Serve(ServeArgs),
    /// Measure against a server
    Run(PingArgs),
}

#[derive(Debug, Subcommand)]
enum RdmaLatRole {
    /// Serve clients (of any benchmark)
    Serve(ServeArgs),
    /// Measure against a server
    Run(RdmaArgs),
}

#[derive(Debug, Subcommand)]
enum RdmaBwRole {
    /// Serve clients (of any benchmark)
    Serve(ServeArgs),
    /// Measure against a server
    Run(RdmaBwArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Exit after this many client sessions ended (0: serve forever)
    #[arg(long, value_name = "N", default_value_t = 0)]
    sessions: u64,
    /// Largest buffer a client may ask for, bytes (K/M/G suffixes)
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = parse_size)]
    max_buffer: u64,
}

#[derive(Debug, Args)]
struct Common {
    /// The server: its node and rank, e.g. M1QBF3 or M1QBF3:1
    #[arg(long, value_name = "NODE[:RANK]", value_parser = parse_peer)]
    peer: (String, u8),
    /// The server's control mailbox (what its `ready` line says)
    #[arg(long, value_name = "VI", default_value_t = 0)]
    peer_mailbox: u8,
    /// Measured iterations per size
    #[arg(long, value_name = "N")]
    iterations: Option<u64>,
    /// Unmeasured iterations per size before the measured ones
    #[arg(long, value_name = "N")]
    warmup: Option<u64>,
    /// One JSON object per size on stdout
    #[arg(long)]
    json: bool,
    /// How long to wait for any one reply or completion, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    timeout_ms: u64,
    /// How long to keep trying to reach the server, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    connect_timeout_ms: u64,
    /// Show progress on stderr this often while running, milliseconds
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    progress_ms: u64,
    /// Say nothing on stderr but errors (no plan, no progress)
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Debug, Args)]
struct PingArgs {
    #[command(flatten)]
    common: Common,
    /// Message sizes, bytes (0..=64)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_size, default_value = "0,8,16,32,64")]
    sizes: Vec<u64>,
}

#[derive(Debug, Args)]
struct RdmaArgs {
    #[command(flatten)]
    common: Common,
    /// Transfer sizes, bytes (K, M suffixes: powers of 1024)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_size, default_value = "4K,16K,64K,256K,1M,4M")]
    sizes: Vec<u64>,
    /// RDMA write into the server's buffer, or read from it
    #[arg(long, value_enum, default_value_t = client::Op::Write)]
    op: client::Op,
    /// Check every byte that was transferred (not timed)
    #[arg(long)]
    verify: bool,
    /// Ask for a completion notification at the server with every write
    #[arg(long)]
    notify: bool,
}

#[derive(Debug, Args)]
struct RdmaBwArgs {
    #[command(flatten)]
    rdma: RdmaArgs,
    /// Transfers in flight (one channel each, 1..=32)
    #[arg(long, value_name = "W", default_value_t = 8, value_parser = clap::value_parser!(u8).range(1..=32))]
    window: u8,
}

/// A ping-pong message: 1 byte to 1 MiB.
fn parse_floor_size(s: &str) -> Result<u32, String> {
    match parse_size(s)? {
        n @ 1..=0x10_0000 => Ok(n as u32),
        n => Err(format!("{n} bytes: a message is 1 byte to 1 MiB")),
    }
}

/// A frame: its 8-byte sequence number to 1 MiB.
fn parse_floor_frame(s: &str) -> Result<u32, String> {
    match parse_size(s)? {
        n @ 8..=0x10_0000 => Ok(n as u32),
        n => Err(format!(
            "{n} bytes: a frame is 8 bytes (its sequence number) to 1 MiB"
        )),
    }
}

/// `4096`, `4K`, `4KB`, `4KiB`, `1M`, `1G` (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let digits_end = upper
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(upper.len());
    let (num, unit) = upper.split_at(digits_end);
    if num.is_empty() {
        return Err(format!("{s:?} is not a size (e.g. 64, 4K, 4M)"));
    }
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is too large"))?;
    let mult: u64 = match unit {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown unit (use K, M or G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_peer(s: &str) -> Result<(String, u8), String> {
    let (node, rank) = match s.split_once(':') {
        Some((n, r)) => {
            let rank: u8 = r
                .parse()
                .map_err(|_| format!("rank {r:?} is not a number 0..7"))?;
            (n, rank)
        }
        None => (s, 0),
    };
    if rank > 7 {
        return Err(format!("rank {rank} is outside 0..7"));
    }
    let name: exanet::NodeName = node.parse().map_err(|e: exanet::NameError| e.to_string())?;
    Ok((name.to_string(), rank))
}

/// A network benchmark's compute scale: host time between its calls is not modeled
/// compute (0), unless `EXANET_COMPUTE_SCALE` says otherwise (then the library reads it).
pub(crate) fn network_benchmark_scale() -> Option<u64> {
    match std::env::var(exanet::config::ENV_COMPUTE_SCALE) {
        Ok(v) if !v.is_empty() => None,
        _ => Some(0),
    }
}

fn attach(g: &Global) -> Result<Endpoint, String> {
    let config = Config {
        rack_dir: g.rack.clone(),
        node: g.node.clone(),
        job_key: g.job_key.clone(),
        spin: g.spin_us.map(Duration::from_micros),
        compute_scale_ppm: network_benchmark_scale(),
        ..Config::default()
    };
    Endpoint::attach_with(&config).map_err(|e| format!("attach: {e}"))
}

fn run(cli: Cli) -> Result<(), String> {
    let coll = match &cli.bench {
        Bench::Allreduce(a) => Some((collective::Kind::Allreduce, a)),
        Bench::Bcast(a) => Some((collective::Kind::Bcast, a)),
        Bench::Barrier(a) => Some((collective::Kind::Barrier, a)),
        _ => None,
    };
    if let Some((kind, a)) = coll {
        return collective::run(&coll_opts(&cli.global, kind, a)?);
    }
    if let Bench::Contend(a) = &cli.bench {
        let g = &cli.global;
        return contend::run(&contend::Options {
            rack: g.rack.clone(),
            job_key: g.job_key.clone(),
            spin: g.spin_us.map(Duration::from_micros),
            pattern: a.pattern,
            senders: a.senders,
            to: a.to.clone(),
            size: a.size,
            iterations: a.iterations,
            window: a.window,
            alone: a.alone,
            json: a.json,
            timeout: Duration::from_millis(a.timeout_ms),
        });
    }
    if let Bench::Floor(a) = &cli.bench {
        return floor::run(&floor::Options {
            size: a.size,
            iterations: a.iterations,
            warmup: a.warmup,
            frame: a.frame,
            batch: a.batch,
            until: match a.frames {
                Some(n) => floor::Until::Frames(n),
                None => floor::Until::Duration(Duration::from_millis(a.duration_ms)),
            },
            json: a.json,
            quiet: a.quiet,
            timeout: Duration::from_millis(a.timeout_ms),
        });
    }
    let ep = attach(&cli.global)?;
    match cli.bench {
        Bench::Allreduce(_)
        | Bench::Bcast(_)
        | Bench::Barrier(_)
        | Bench::Contend(_)
        | Bench::Floor(_) => {
            unreachable!("run above")
        }
        Bench::Pingpong(PingRole::Serve(a))
        | Bench::RdmaLat(RdmaLatRole::Serve(a))
        | Bench::RdmaBw(RdmaBwRole::Serve(a)) => server::serve(
            &ep,
            &server::Options {
                sessions: a.sessions,
                max_buffer: a.max_buffer,
            },
        ),
        Bench::Pingpong(PingRole::Run(a)) => client::pingpong(&ep, &common(&a.common), &a.sizes),
        Bench::RdmaLat(RdmaLatRole::Run(a)) => client::rdma(&ep, &rdma_opts(&a, None)),
        Bench::RdmaBw(RdmaBwRole::Run(a)) => client::rdma(&ep, &rdma_opts(&a.rdma, Some(a.window))),
    }
}

fn coll_opts(
    g: &Global,
    kind: collective::Kind,
    a: &CollArgs,
) -> Result<collective::Options, String> {
    let members = match a.qfdbs {
        Some(q) => {
            let dir = exanet::config::rack_dir(g.rack.as_deref());
            let shape = exanet::config::read_shape(&dir).map_err(|e| e.to_string())?;
            if q == 0 || q > shape.qfdbs() {
                return Err(format!("--qfdbs {q}: the rack has {} QFDBs", shape.qfdbs()));
            }
            (0..q * 4)
                .map(|i| (shape.display(exanet::NodeId(i)), 0))
                .collect()
        }
        None => a.members.clone(),
    };
    if members.is_empty() {
        return Err("give the members: --members NODE[:RANK],... or --qfdbs N".into());
    }
    Ok(collective::Options {
        kind,
        rack: g.rack.clone(),
        job_key: g.job_key.clone(),
        spin: g.spin_us.map(Duration::from_micros),
        members,
        sizes: a.sizes.clone(),
        iterations: a.iterations,
        warmup: a.warmup,
        accel: a.accel,
        eager: a.eager,
        op: a.op,
        ty: a.ty,
        root: a.root,
        json: a.json,
        timeout: Duration::from_millis(a.timeout_ms),
    })
}

fn common(c: &Common) -> client::Options {
    client::Options {
        peer: c.peer.clone(),
        peer_mailbox: c.peer_mailbox,
        iterations: c.iterations,
        warmup: c.warmup,
        json: c.json,
        timeout: Duration::from_millis(c.timeout_ms),
        connect_timeout: Duration::from_millis(c.connect_timeout_ms),
        quiet: c.quiet,
        progress: Duration::from_millis(c.progress_ms),
    }
}

fn rdma_opts(a: &RdmaArgs, window: Option<u8>) -> client::RdmaOptions {
    client::RdmaOptions {
        common: common(&a.common),
        sizes: a.sizes.clone(),
        op: a.op,
        verify: a.verify,
        notify: a.notify,
        window,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exanet-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
