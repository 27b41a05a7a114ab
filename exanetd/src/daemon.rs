//! Wiring of one daemon: load the rack, bind the QUIC endpoint, the metrics endpoint and
//! the control socket, start the link tasks, run until SIGTERM/SIGINT or a control
//! `shutdown`, then close every link cleanly.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::Notify;
use tracing::info;

use crate::host_budget::HostBudget;
use crate::metrics::Metrics;
use crate::node::NodeHandle;
use crate::{control_server, http, link};
use exanet_control::rack::{Rack, RackError};
use exanet_control::tls::{NodeTls, TlsError};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error("{0}")]
    Node(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

impl DaemonError {
    /// Configuration mistakes exit 2, failures at run time 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Rack(_) | DaemonError::Node(_) | DaemonError::Tls(_) => 2,
            _ => 1,
        }
    }
}

pub struct Options<'a> {
    pub rack_dir: &'a Path,
    pub node: &'a str,
    /// Worker threads; 1 runs everything on the current thread.
    pub threads: usize,
    /// Restarts of this node's daemon before this one (its supervisor's count).
    pub restarts: u64,
}

pub fn run(opts: Options<'_>) -> Result<(), DaemonError> {
    let rack = Rack::load(opts.rack_dir)?;
    let shape = rack.shape();
    let id = shape
        .parse_node(opts.node)
        .map_err(|e| DaemonError::Node(e.to_string()))?;
    let name = shape.display(id);
    let tls = NodeTls::load(&rack.layout(), &name)?;
    let (server_cfg, client_cfg) = tls.quic_configs(rack.file.link_timeout())?;
    let cuts_cfg = tls.client_config(exanet_control::tls::ALPN_CUTS)?;
    let endpoint_cfg = tls.endpoint_config();
    let rt = if opts.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.threads)
            .enable_all()
            .build()
    }
    .map_err(DaemonError::Runtime)?;
    rt.block_on(serve(
        rack,
        id,
        endpoint_cfg,
        server_cfg,
        client_cfg,
        cuts_cfg,
        opts.restarts,
    ))
}

async fn resolve(what: &'static str, addr: &str) -> Result<std::net::SocketAddr, DaemonError> {
    let bind_err = |source| DaemonError::Bind {
        what,
        addr: addr.to_string(),
        source,
    };
    tokio::net::lookup_host(addr)
        .await
        .map_err(bind_err)?
        .next()
        .ok_or_else(|| bind_err(std::io::Error::other("address resolves to nothing")))
}

async fn serve(
    rack: Rack,
    id: exanet_proto::NodeId,
    endpoint_cfg: quinn::EndpointConfig,
    server_cfg: quinn::ServerConfig,
    client_cfg: quinn::ClientConfig,
    cuts_cfg: quinn::ClientConfig,
    restarts: u64,
) -> Result<(), DaemonError> {
    let entry = rack.entry(id).clone();
    let layout = rack.layout();
    let node =
        NodeHandle::new(rack, id, spin_budget()).map_err(|e| DaemonError::Node(e.to_string()))?;
    node.restarts
        .store(restarts, std::sync::atomic::Ordering::Relaxed);
    let name = node.name.clone();
    // Before the attach socket exists: no region is made outside the host's budget.
    node.memory
        .use_budget(HostBudget::for_daemon(&node.rack, id, &name));

    let link_addr = resolve("bind link endpoint", entry.link_bind()).await?;
    let endpoint =
        link_endpoint(endpoint_cfg, server_cfg, link_addr).map_err(|source| DaemonError::Bind {
            what: "bind link endpoint",
            addr: entry.link_bind().to_string(),
            source,
        })?;
    let metrics_addr = resolve("bind metrics endpoint", entry.metrics_bind()).await?;
    let http_listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .map_err(|source| DaemonError::Bind {
            what: "bind metrics endpoint",
            addr: entry.metrics_bind().to_string(),
            source,
        })?;
    let sock = layout.control_socket(&name);
    let control = control_server::bind(&sock).map_err(|source| DaemonError::Bind {
        what: "bind control socket",
        addr: sock.display().to_string(),
        source,
    })?;

    let attach = layout.attach_socket(&name);
    crate::ni_service::start(
        node.clone(),
        node.memory.clone(),
        &attach,
        tokio::runtime::Handle::current(),
    )
    .map_err(|source| DaemonError::Bind {
        what: "bind attach socket",
        addr: attach.display().to_string(),
        source,
    })?;

    let shutdown = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    let ordered = node.rack.order() == exanet_control::rack::CellOrder::Modeled;
    let coordinator = if ordered && id == exanet_proto::NodeId(0) {
        let c = Arc::new(
            crate::cuts::CoordinatorHandle::new(node.rack.shape())
                .map_err(|e| DaemonError::Node(e.to_string()))?,
        );
        let serve: link::CutServer =
            Arc::new(move |node, conn| Box::pin(c.clone().serve(node, conn)));
        Some(serve)
    } else {
        None
    };
    tasks.push(tokio::spawn(link::accept_loop(
        node.clone(),
        endpoint.clone(),
        shutdown.clone(),
        coordinator,
    )));
    if ordered {
        tasks.push(tokio::spawn(crate::cuts::node_loop(
            node.clone(),
            endpoint.clone(),
            cuts_cfg,
        )));
    }
    // The NI's retransmission, retry and expiry timers.
    tasks.push(tokio::spawn(crate::ni_service::timer_loop(node.clone())));
    for (port, peer, _, _) in node.links() {
        if id < peer {
            tasks.push(tokio::spawn(link::dial_loop(
                node.clone(),
                endpoint.clone(),
                client_cfg.clone(),
                port,
                peer,
            )));
        }
    }
    tasks.push(tokio::spawn(http::serve(
        http_listener,
        node.clone(),
        Arc::new(Metrics::new(node.lock().latency.family())),
    )));
    tasks.push(tokio::spawn(control_server::serve(
        control,
        node.clone(),
        shutdown.clone(),
    )));
    info!(node = %name, link = %link_addr, metrics = %metrics_addr, links = node.links().len(), "exanetd serving");

    wait_for_stop(&shutdown).await;
    info!(node = %name, "shutting down");
    for t in &tasks {
        t.abort();
    }
    endpoint.close(quinn::VarInt::from_u32(0), b"shutdown");
    let _ = tokio::time::timeout(Duration::from_millis(500), endpoint.wait_idle()).await;
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(&attach);
    // What this node's workloads still map is theirs once it is gone.
    node.memory.budget().leave();
    Ok(())
}

/// How long workload rings are polled after activity before the daemon sleeps on their
/// doorbell: `EXANET_SPIN_US` microseconds, default 20.
fn spin_budget() -> Duration {
    std::env::var("EXANET_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros)
        .unwrap_or(exanet_shm::doorbell::DEFAULT_SPIN)
}

/// Socket buffer size asked of the kernel (it caps it at net.core.rmem_max/wmem_max).
const UDP_BUFFER: usize = 4 << 20;

/// The QUIC endpoint on a UDP socket with large buffers: with the default ~200 KB, a
/// daemon that is busy for a moment overflows its receive buffer, and QUIC reads the
/// drops as congestion and throttles the link far below its credit window. Public so that
/// `exanet-perf floor` measures QUIC on exactly the daemon's sockets.
pub fn link_endpoint(
    endpoint_cfg: quinn::EndpointConfig,
    server_cfg: quinn::ServerConfig,
    addr: std::net::SocketAddr,
) -> std::io::Result<quinn::Endpoint> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if let Err(e) = s.set_recv_buffer_size(UDP_BUFFER) {
        tracing::warn!(error = %e, "cannot enlarge UDP receive buffer");
    }
    if let Err(e) = s.set_send_buffer_size(UDP_BUFFER) {
        tracing::warn!(error = %e, "cannot enlarge UDP send buffer");
    }
    s.bind(&addr.into())?;
    quinn::Endpoint::new(
        endpoint_cfg,
        Some(server_cfg),
        s.into(),
        Arc::new(quinn::TokioRuntime),
    )
}

async fn wait_for_stop(shutdown: &Notify) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        shutdown.notified().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = shutdown.notified() => {}
    }
}
