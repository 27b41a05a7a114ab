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
//! | `exanet_ni_attached_workloads` | gauge | node |
//! | `exanet_ni_messages_total` | counter: packetizer messages | node, direction (tx/rx) |
//! | `exanet_ni_acks_total` | counter | node, direction |
//! | `exanet_ni_nacks_total` | counter | node, direction, reason |
//! | `exanet_ni_retransmissions_total` | counter: messages and RDMA blocks sent again | node |
//! | `exanet_ni_timeouts_total` | counter: waits for an answer that expired | node |
//! | `exanet_ni_pdid_violations_total` | counter: cells refused for their PDID | node |
//! | `exanet_ni_rdma_blocks_total` | counter | node, direction |
//! | `exanet_ni_rdma_transfers_total` | counter: RDMA transfers ended | node, result (ok/failed) |

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
    ni_attached: IntGaugeVec,
    ni_messages: IntCounterVec,
    ni_acks: IntCounterVec,
    ni_nacks: IntCounterVec,
    ni_retrans: IntCounterVec,
    ni_timeouts: IntCounterVec,
    ni_pdid: IntCounterVec,
    ni_blocks: IntCounterVec,
    ni_transfers: IntCounterVec,
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
            ni_attached: igv(
                "exanet_ni_attached_workloads",
                "Workloads attached to the node's NI",
                &["node"],
            ),
            ni_messages: icv(
                "exanet_ni_messages_total",
                "Packetizer messages sent (tx) and received (rx)",
                &["node", "direction"],
            ),
            ni_acks: icv(
                "exanet_ni_acks_total",
                "ACKs sent (tx) and received (rx)",
                &["node", "direction"],
            ),
            ni_nacks: icv(
                "exanet_ni_nacks_total",
                "NACKs sent (tx) and received (rx) by reason",
                &["node", "direction", "reason"],
            ),
            ni_retrans: icv(
                "exanet_ni_retransmissions_total",
                "Messages and RDMA blocks sent again",
                &["node"],
            ),
            ni_timeouts: icv(
                "exanet_ni_timeouts_total",
                "Waits for an answer that expired",
                &["node"],
            ),
            ni_pdid: icv(
                "exanet_ni_pdid_violations_total",
                "Cells refused because their PDID is not the destination's",
                &["node"],
            ),
            ni_blocks: icv(
                "exanet_ni_rdma_blocks_total",
                "RDMA blocks sent (tx) and received complete (rx)",
                &["node", "direction"],
            ),
            ni_transfers: icv(
                "exanet_ni_rdma_transfers_total",
                "RDMA transfers ended, by result",
                &["node", "result"],
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
        let ni = &s.ni;
        self.ni_attached
            .with_label_values(&[n])
            .set(i64::from(ni.attached));
        for (dir, msgs, acks, nacks, blocks) in [
            (
                "tx",
                ni.messages_sent,
                ni.acks_sent,
                &ni.nacks_sent,
                ni.rdma_blocks_sent,
            ),
            (
                "rx",
                ni.messages_received,
                ni.acks_received,
                &ni.nacks_received,
                ni.rdma_blocks_received,
            ),
        ] {
            raise(&self.ni_messages.with_label_values(&[n, dir]), msgs);
            raise(&self.ni_acks.with_label_values(&[n, dir]), acks);
            raise(&self.ni_blocks.with_label_values(&[n, dir]), blocks);
            for (reason, v) in nacks {
                raise(
                    &self.ni_nacks.with_label_values(&[n, dir, reason.as_str()]),
                    *v,
                );
            }
        }
        raise(&self.ni_retrans.with_label_values(&[n]), ni.retransmissions);
        raise(&self.ni_timeouts.with_label_values(&[n]), ni.timeouts);
        raise(&self.ni_pdid.with_label_values(&[n]), ni.pdid_violations);
        raise(
            &self.ni_transfers.with_label_values(&[n, "ok"]),
            ni.rdma_transfers_done,
        );
        raise(
            &self.ni_transfers.with_label_values(&[n, "failed"]),
            ni.rdma_transfers_failed,
        );
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
