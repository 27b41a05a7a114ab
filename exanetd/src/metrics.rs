//! Prometheus metrics of one daemon. The core keeps plain counters; at every scrape this
//! module brings the Prometheus families up to date from a status snapshot, so the hot
//! path pays nothing for metrics.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `exanet_link_cells_total` | counter | node, peer, port, kind, direction (tx/rx) |
//! | `exanet_link_bytes_total` | counter | node, peer, port, kind, direction |
//! | `exanet_link_stall_seconds_total` | counter: time an output had a cell but no credit | node, peer, port, kind |
//! | `exanet_link_queue_cells` | gauge: cells queued at this node's input from the link | node, peer, port, kind |
//! | `exanet_link_queue_bytes` | gauge | node, peer, port, kind |
//! | `exanet_link_in_flight_bytes` | gauge: sent, credit not yet returned | node, peer, port, kind |
//! | `exanet_link_up` | gauge 0/1 | node, peer, port, kind |
//! | `exanet_link_sessions_total` | counter: link sessions established (reconnects + 1) | node, peer, port, kind |
//! | `exanet_node_cells_forwarded_total` | counter: link-to-link | node |
//! | `exanet_node_cells_injected_total` | counter: by the node's NI | node |
//! | `exanet_node_cells_delivered_total` | counter: to the node's NI | node |
//! | `exanet_node_errors_total` | counter | node, kind |
//! | `exanet_node_uptime_seconds` | gauge | node |

use prometheus::{CounterVec, Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::control::{LinkState, NodeStatus};

pub struct Metrics {
    registry: Registry,
    link_cells: IntCounterVec,
    link_bytes: IntCounterVec,
    link_stall: CounterVec,
    link_queue_cells: IntGaugeVec,
    link_queue_bytes: IntGaugeVec,
    link_in_flight: IntGaugeVec,
    link_up: IntGaugeVec,
    link_sessions: IntCounterVec,
    forwarded: IntCounterVec,
    injected: IntCounterVec,
    delivered: IntCounterVec,
    errors: IntCounterVec,
    uptime: GaugeVec,
}

const LINK: &[&str] = &["node", "peer", "port", "kind"];
const LINK_DIR: &[&str] = &["node", "peer", "port", "kind", "direction"];

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone()))
        .expect("metric names are unique and valid");
    c
}

/// Raises a counter to `value` (counters only go up; a lower value is ignored).
fn raise(c: &prometheus::IntCounter, value: u64) {
    let cur = c.get();
    if value > cur {
        c.inc_by(value - cur);
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let icv = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let igv = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        Metrics {
            link_cells: icv(
                "exanet_link_cells_total",
                "Cells carried by the link",
                LINK_DIR,
            ),
            link_bytes: icv(
                "exanet_link_bytes_total",
                "Bytes (cell headers, payloads and footers) carried by the link",
                LINK_DIR,
            ),
            link_stall: reg(
                &r,
                CounterVec::new(
                    Opts::new(
                        "exanet_link_stall_seconds_total",
                        "Time the link's output had a cell to send but no flow-control credit",
                    ),
                    LINK,
                )
                .expect("valid metric"),
            ),
            link_queue_cells: igv(
                "exanet_link_queue_cells",
                "Cells from the link queued at this node's switch input",
                LINK,
            ),
            link_queue_bytes: igv(
                "exanet_link_queue_bytes",
                "Bytes from the link queued at this node's switch input",
                LINK,
            ),
            link_in_flight: igv(
                "exanet_link_in_flight_bytes",
                "Bytes sent on the link whose credit has not come back",
                LINK,
            ),
            link_up: igv("exanet_link_up", "1 when the link session is up", LINK),
            link_sessions: icv(
                "exanet_link_sessions_total",
                "Link sessions established (1 + reconnects)",
                LINK,
            ),
            forwarded: icv(
                "exanet_node_cells_forwarded_total",
                "Cells switched from one link to another",
                &["node"],
            ),
            injected: icv(
                "exanet_node_cells_injected_total",
                "Cells injected by the node's network interface",
                &["node"],
            ),
            delivered: icv(
                "exanet_node_cells_delivered_total",
                "Cells delivered to the node's network interface",
                &["node"],
            ),
            errors: icv(
                "exanet_node_errors_total",
                "Errors by kind (malformed cells, refused peers, ...)",
                &["node", "kind"],
            ),
            uptime: reg(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "exanet_node_uptime_seconds",
                        "Seconds since the daemon started",
                    ),
                    &["node"],
                )
                .expect("valid metric"),
            ),
            registry: r,
        }
    }

    /// Brings every family up to date with `s` and renders the text exposition format.
    pub fn render(&self, s: &NodeStatus) -> String {
        let n = s.node.as_str();
        for l in &s.links {
            let base = [n, l.peer.as_str(), l.port.as_str(), l.kind.as_str()];
            for (dir, cells, bytes) in [
                ("tx", l.tx_cells, l.tx_bytes),
                ("rx", l.rx_cells, l.rx_bytes),
            ] {
                let lv = [base[0], base[1], base[2], base[3], dir];
                raise(&self.link_cells.with_label_values(&lv), cells);
                raise(&self.link_bytes.with_label_values(&lv), bytes);
            }
            let stall = self.link_stall.with_label_values(&base);
            if l.stall_seconds > stall.get() {
                stall.inc_by(l.stall_seconds - stall.get());
            }
            self.link_queue_cells
                .with_label_values(&base)
                .set(l.queue_cells as i64);
            self.link_queue_bytes
                .with_label_values(&base)
                .set(l.queue_bytes as i64);
            self.link_in_flight
                .with_label_values(&base)
                .set(l.in_flight_bytes as i64);
            self.link_up
                .with_label_values(&base)
                .set(i64::from(l.state == LinkState::Up));
            raise(&self.link_sessions.with_label_values(&base), l.sessions);
        }
        raise(&self.forwarded.with_label_values(&[n]), s.forwarded_cells);
        raise(&self.injected.with_label_values(&[n]), s.injected_cells);
        raise(&self.delivered.with_label_values(&[n]), s.delivered_cells);
        for (kind, v) in &s.errors {
            raise(&self.errors.with_label_values(&[n, kind.as_str()]), *v);
        }
        self.uptime.with_label_values(&[n]).set(s.uptime_seconds);
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
