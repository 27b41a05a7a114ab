//! `exanet-ip`: IP over ExaNet for one emulated node.
//!
//! Attaches to the node's daemon as a workload of the IP service's own job, at the same
//! rank on every node, creates the node's TUN device (in the node's network namespace
//! with `--netns`) with the node's address, and carries the device's packets to the
//! services of the other nodes over the NI: RDMA writes of batches into per-peer receive
//! rings, completion notifications, credit messages. See `docs/ip.md`.

#![forbid(unsafe_code)]

mod metrics;
mod shell;
mod tun_dev;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use exanet::{Config, Endpoint};
use exanet_control::rack::Rack;
use exanet_ip_proto::{
    ring_len, slab_rings, IpConfig, IpService, IP_MAILBOX_VI, IP_RANK, MAX_BATCH, MAX_IN_FLIGHT,
};
use tracing::{error, info};

use crate::shell::{Ni, Shell};

/// Bytes queued per peer before packets are dropped (as a full qdisc would).
const QUEUE_LIMIT: usize = 1 << 20;
/// Messages the service mailbox holds: every peer's credit and control messages.
const MAILBOX_CAPACITY: u32 = 8192;

#[derive(Parser, Debug)]
#[command(
    name = "exanet-ip",
    version,
    about = "IP over ExaNet for one emulated node"
)]
struct Args {
    /// The rack directory.
    #[arg(long, env = "EXANET_RACK", default_value = "exanet-rack")]
    rack: PathBuf,
    /// The node to serve (e.g. M1QAF2).
    #[arg(long, env = "EXANET_NODE")]
    node: String,
    /// The network namespace to create the TUN device in (a path, e.g.
    /// /run/netns/exanet-rack-M1QAF2); absent: this process's own.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Name of the TUN device. The same on every node, so that one name (an MPI
    /// library's interface setting, say) fits them all; a host that serves several nodes
    /// without a namespace each must give each its own.
    #[arg(long, default_value = exanet_control::ip::DEVICE)]
    dev: String,
    /// Where to serve /metrics (e.g. 127.0.0.1:23000; port 0: any free one, named in the
    /// ready file); absent: no metrics endpoint.
    #[arg(long)]
    metrics: Option<String>,
    /// A file to write once the service is attached and its device is up (its content:
    /// the device name, its address/prefix and the metrics address); exactl waits for it.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Batches in flight to one peer at most (1..=8).
    #[arg(long, default_value_t = MAX_IN_FLIGHT, env = "EXANET_IP_IN_FLIGHT",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_IN_FLIGHT)))]
    in_flight: u32,
    /// How long the service polls its endpoint after activity before sleeping, in
    /// microseconds (0..=1000000). 0 by default, unlike workloads' 20: the service wakes
    /// for every packet and every completion, and on a host with fewer cores than busy
    /// processes (each node's daemon and service, and the programs) a spinning service
    /// takes the core the daemons and programs are waiting for. NetPIPE 8 B over one torus
    /// hop on a 2-core host: 205-234 us one-way without the spin, 302-376 us with 20 us.
    #[arg(long, default_value_t = 0, env = "EXANET_IP_SPIN_US",
          value_parser = clap::value_parser!(u64).range(0..=exanet::config::MAX_SPIN_US))]
    spin_us: u64,
    /// How many times this node's service was started again after it died on its own
    /// (exactl's supervisor passes its count), exported as `exanet_ip_restarts_total`.
    #[arg(long, default_value_t = 0)]
    restarts: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            eprintln!("exanet-ip: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let rack = Rack::load(&args.rack).map_err(|e| e.to_string())?;
    let shape = rack.shape();
    let me = shape.parse_node(&args.node).map_err(|e| e.to_string())?;
    let name = shape.display(me);
    let subnet = exanet_control::ip::rack_subnet(rack.ip_subnet(), &shape);
    let addr = subnet
        .node_addr(me)
        .ok_or_else(|| format!("{name} has no address in {}", rack.ip_subnet()))?;
    let mtu = rack.ip_mtu();
    let key_path = rack.layout().ip_key();
    // The service's rank and mailbox are kept for the IP job's PDID: without its key the
    // daemon would refuse them, so say what is missing instead.
    let key = std::fs::read_to_string(&key_path)
        .map(|k| Some(k.trim().to_string()))
        .map_err(|e| {
            format!(
                "no IP service key ({}: {e}); `exactl rack up` makes it, and rank {IP_RANK} \
                 and mailbox {IP_MAILBOX_VI} are kept for the IP service's job",
                key_path.display()
            )
        })?;
    let ep = Endpoint::attach_with(&Config {
        rack_dir: Some(args.rack.clone()),
        node: Some(name.clone()),
        job_key: key,
        rank: Some(IP_RANK),
        spin: Some(std::time::Duration::from_micros(args.spin_us)),
        ..Config::default()
    })
    .map_err(|e| format!("attach to {name}: {e}"))?;
    let cfg = IpConfig {
        me,
        subnet,
        mtu,
        ring_len: ring_len(shape.nodes(), mtu),
        max_batch: MAX_BATCH,
        queue_limit: QUEUE_LIMIT,
        slab_rings: slab_rings(shape.nodes()),
        first_stream: rand::random(),
        retry_ns: 1_000_000_000,
        max_in_flight: args.in_flight,
    };
    cfg.check().map_err(|e| format!("IP settings: {e}"))?;
    let staging = ep
        .register(u64::from(exanet::RDMA_WRITE_CHANNELS) * u64::from(MAX_BATCH))
        .map_err(|e| format!("register the send buffers: {e}"))?;
    let mailbox = ep
        .mailbox_at(IP_MAILBOX_VI, MAILBOX_CAPACITY)
        .map_err(|e| format!("allocate the service mailbox ({IP_MAILBOX_VI}): {e}"))?;
    let tx = ep
        .packetizer()
        .map_err(|e| format!("allocate a packetizer: {e}"))?;
    let page = ep
        .rdma_page()
        .map_err(|e| format!("allocate an RDMA page: {e}"))?;
    let dev_name = args.dev.clone();
    let dev = tun_dev::create(
        &tun_dev::TunSpec {
            name: &dev_name,
            addr,
            prefix: subnet.prefix(),
            mtu: u16::try_from(mtu).map_err(|_| format!("MTU {mtu}"))?,
        },
        args.netns.as_deref(),
    )
    .map_err(|e| e.to_string())?;
    let svc = IpService::new(cfg);
    let shell = Arc::new(Shell::new(
        Ni {
            ep,
            staging,
            page,
            tx,
            mailbox,
        },
        dev,
        svc,
    ));
    let mut metrics_addr = None;
    if let Some(m) = &args.metrics {
        let server =
            tiny_http::Server::http(m.as_str()).map_err(|e| format!("metrics on {m}: {e}"))?;
        // With port 0 the kernel picks one: the ready file says which.
        metrics_addr = server.server_addr().to_ip();
        let metrics = Arc::new(metrics::Metrics::new(&name, args.restarts));
        let s = Arc::clone(&shell);
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || metrics::serve(server, metrics, move || s.snapshot()))
            .map_err(|e| e.to_string())?;
    }
    info!(node = %name, %addr, dev = %dev_name, mtu, "IP over ExaNet up");
    if let Some(f) = &args.ready_file {
        let metrics = metrics_addr.map_or_else(|| "-".to_string(), |a| a.to_string());
        std::fs::write(
            f,
            format!("{dev_name} {addr}/{} {metrics}\n", subnet.prefix()),
        )
        .map_err(|e| format!("write {}: {e}", f.display()))?;
    }
    let host = Arc::clone(&shell);
    std::thread::Builder::new()
        .name("host".into())
        .spawn(move || {
            let e = host.host_loop();
            error!(error = %e, "the TUN device failed");
            std::process::exit(1);
        })
        .map_err(|e| e.to_string())?;
    let e = shell.fabric_loop();
    Err(format!("the endpoint failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use exanet_ip_proto::{AREA_BUDGET, RING_LEN};

    #[test]
    fn rings_shrink_with_the_rack_but_always_hold_four_mtu_batches() {
        assert_eq!(ring_len(8, 65000), RING_LEN.div_ceil(4096) * 4096);
        let big = ring_len(128, 65000);
        assert!((4 * (65000 + 64)..RING_LEN).contains(&big), "{big}");
        assert!(u64::from(big) * 128 <= AREA_BUDGET + 128 * 4096);
        // A small MTU lets a large rack stay within the budget.
        assert!(u64::from(ring_len(1024, 1500)) * 1024 <= AREA_BUDGET + 1024 * 4096);
        for (nodes, mtu) in [(8, 65000), (128, 65000), (1024, 9000), (1024, 1500)] {
            let r = ring_len(nodes, mtu);
            let cfg = IpConfig {
                me: exanet_proto::NodeId(0),
                subnet: exanet_ip_proto::RackSubnet::new([10, 200, 0, 0].into(), 16, nodes),
                mtu,
                ring_len: r,
                max_batch: MAX_BATCH,
                queue_limit: QUEUE_LIMIT,
                slab_rings: slab_rings(nodes),
                first_stream: 0,
                retry_ns: 1,
                max_in_flight: MAX_IN_FLIGHT,
            };
            cfg.check()
                .unwrap_or_else(|e| panic!("{nodes} nodes, MTU {mtu}: {e}"));
            // Every slab registered stays within what a rank may hold, and the slabs
            // together are a ring per node, no more.
            assert!(cfg.slabs() <= exanet_ip_proto::MAX_SLABS, "{nodes} nodes");
            let all: u64 = (0..cfg.slabs()).map(|k| cfg.slab_len(k)).sum();
            assert_eq!(all, cfg.area_len(), "{nodes} nodes");
        }
    }
}
