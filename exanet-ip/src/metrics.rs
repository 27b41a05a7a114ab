//! `exanet_ip_*` metrics, served at `GET /metrics` of the service's metrics address.

use std::sync::{Arc, Mutex};

use exanet_ip_proto::{Drop, IpStats};
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use tracing::warn;

/// What a scrape reads: the service's counters and gauges as of now.
pub struct Snapshot {
    pub stats: IpStats,
    pub ring_occupancy: u64,
    pub queued: u64,
    /// Bytes of receive rings registered (slabs registered as peers first sent).
    pub registered: u64,
}

pub struct Metrics {
    registry: Registry,
    packets: IntCounterVec,
    bytes: IntCounterVec,
    batches: IntCounterVec,
    drops: IntCounterVec,
    stalls: IntCounterVec,
    streams: IntCounterVec,
    occupancy: IntGauge,
    queued: IntGauge,
    registered: IntGauge,
    node: String,
    last: Mutex<IpStats>,
}

fn counter(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    reg.register(Box::new(c.clone())).expect("registered once");
    c
}

impl Metrics {
    /// `restarts`: how many times the node's service was restarted before this one.
    pub fn new(node: &str, restarts: u64) -> Metrics {
        let registry = Registry::new();
        let dir = &["node", "direction"];
        let occupancy = IntGauge::with_opts(
            Opts::new(
                "exanet_ip_ring_occupancy_bytes",
                "Bytes written into peers' receive rings and not yet returned by credit",
            )
            .const_label("node", node),
        )
        .expect("valid metric");
        let queued = IntGauge::with_opts(
            Opts::new(
                "exanet_ip_queued_bytes",
                "Bytes of packets waiting for a batch (ring full or a batch in flight)",
            )
            .const_label("node", node),
        )
        .expect("valid metric");
        registry
            .register(Box::new(occupancy.clone()))
            .expect("once");
        registry.register(Box::new(queued.clone())).expect("once");
        let registered = IntGauge::with_opts(
            Opts::new(
                "exanet_ip_registered_bytes",
                "Bytes of receive rings registered with the NI (a slab of rings once a peer \
                 among them first sends)",
            )
            .const_label("node", node),
        )
        .expect("valid metric");
        registry
            .register(Box::new(registered.clone()))
            .expect("once");
        // Counted by whoever restarts the service (a process's own counters start at 0
        // with it), and carried into each new process, so the series keeps rising.
        let restarts_total = IntCounter::with_opts(
            Opts::new(
                "exanet_ip_restarts_total",
                "Times this node's IP service was started again after it died on its own \
                 (by the rack's supervisor), since the rack came up",
            )
            .const_label("node", node),
        )
        .expect("valid metric");
        restarts_total.inc_by(restarts);
        registry.register(Box::new(restarts_total)).expect("once");
        Metrics {
            packets: counter(
                &registry,
                "exanet_ip_packets_total",
                "IP packets carried (out: to peers, in: to this node's host)",
                dir,
            ),
            bytes: counter(
                &registry,
                "exanet_ip_bytes_total",
                "Bytes of IP packets carried",
                dir,
            ),
            batches: counter(
                &registry,
                "exanet_ip_batches_total",
                "RDMA transfers (batches of packets) written or received",
                dir,
            ),
            drops: counter(
                &registry,
                "exanet_ip_drops_total",
                "Packets (or fabric messages) not carried, by reason",
                &["node", "reason"],
            ),
            stalls: counter(
                &registry,
                "exanet_ip_credit_stalls_total",
                "Times a batch waited for a peer to return ring space",
                &["node"],
            ),
            streams: counter(
                &registry,
                "exanet_ip_streams_opened_total",
                "Streams opened to peers (one per peer, one more after each failed write)",
                &["node"],
            ),
            occupancy,
            queued,
            registered,
            registry,
            node: node.to_string(),
            last: Mutex::new(IpStats::default()),
        }
    }

    /// Brings the counters up to `now` and renders the registry.
    pub fn render(&self, now: &Snapshot) -> String {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.node.as_str();
        let s = &now.stats;
        let d = |a: u64, b: u64| a.saturating_sub(b);
        self.packets
            .with_label_values(&[n, "out"])
            .inc_by(d(s.packets_out, last.packets_out));
        self.packets
            .with_label_values(&[n, "in"])
            .inc_by(d(s.packets_in, last.packets_in));
        self.bytes
            .with_label_values(&[n, "out"])
            .inc_by(d(s.bytes_out, last.bytes_out));
        self.bytes
            .with_label_values(&[n, "in"])
            .inc_by(d(s.bytes_in, last.bytes_in));
        self.batches
            .with_label_values(&[n, "out"])
            .inc_by(d(s.batches_out, last.batches_out));
        self.batches
            .with_label_values(&[n, "in"])
            .inc_by(d(s.batches_in, last.batches_in));
        for why in Drop::ALL {
            self.drops
                .with_label_values(&[n, why.label()])
                .inc_by(d(s.dropped(why), last.dropped(why)));
        }
        self.stalls
            .with_label_values(&[n])
            .inc_by(d(s.credit_stalls, last.credit_stalls));
        self.streams
            .with_label_values(&[n])
            .inc_by(d(s.streams_opened, last.streams_opened));
        self.occupancy.set(now.ring_occupancy as i64);
        self.queued.set(now.queued as i64);
        self.registered.set(now.registered as i64);
        *last = s.clone();
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            warn!(error = %e, "cannot encode the metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Serves `GET /metrics` (and `/health`) on `server` until the process ends.
pub fn serve(server: tiny_http::Server, metrics: Arc<Metrics>, snapshot: impl Fn() -> Snapshot) {
    for req in server.incoming_requests() {
        let resp = match req.url() {
            "/metrics" => tiny_http::Response::from_string(metrics.render(&snapshot()))
                .with_header(
                    "Content-Type: text/plain; version=0.0.4"
                        .parse::<tiny_http::Header>()
                        .expect("a valid header"),
                ),
            "/health" => tiny_http::Response::from_string("ok\n"),
            _ => tiny_http::Response::from_string("not found\n").with_status_code(404),
        };
        if let Err(e) = req.respond(resp) {
            warn!(error = %e, "cannot answer a metrics request");
        }
    }
}
