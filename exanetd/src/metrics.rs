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
//! | `exanet_link_admin_down` | gauge 0/1: cut by the operator | node, peer, port, kind |
//! | `exanet_link_faults_injected_total` | counter: cells this node's injector dropped or corrupted | node, peer, port, kind, fault (drop/corrupt) |
//! | `exanet_link_fault_delayed_frames_total` | counter: frames held back by delay, jitter or rate | node, peer, port, kind |
//! | `exanet_link_fault_delay_seconds_total` | counter: total time frames were held back | node, peer, port, kind |
//! | `exanet_link_fault_held_bytes` | gauge: bytes held back right now | node, peer, port, kind |
//! | `exanet_link_fault_setting` | gauge: the faults set (delay_seconds, jitter_seconds, rate_bytes_per_second, loss_ratio, corrupt_ratio) | node, peer, port, kind, setting |
//! | `exanet_link_rx_corrupt_cells_total` | counter: cells from the link refused as undecodable (CRC) | node, peer, port, kind |
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
//! | `exanet_ni_completion_latency_seconds` | histogram: command to completion | node, op (send/rdma_write/rdma_read), result (ok/failed) |
//!
//! Error kinds of `exanet_node_errors_total` include `tls_refused` (a peer or operator
//! without a certificate of the rack CA), `control_refused` (a rack certificate other
//! than the operator's on the control API), `link_admin_down` (a neighbour dialing a cut
//! link), the frame and cell decoding errors, and the workload interface's refusals.

use prometheus::{
    CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec,
    IntGaugeVec, Opts, Registry,
};

use crate::control::{LinkState, NodeStatus};

/// A workload operation whose latency is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A packetizer or mailbox message, until ACKed (or NACKed, or given up).
    Send,
    Write,
    Read,
}

/// Completion latency histograms, kept by the core and observed as completions happen
/// (a histogram cannot be rebuilt from a snapshot at scrape time like the counters).
/// One observation is a few atomic adds.
pub struct Latency {
    family: HistogramVec,
    /// Bound children by [op][ok]: no label lookup on the hot path.
    bound: [[Histogram; 2]; 3],
}

/// From 5 µs (a message to the node itself) to 10 s (a transfer retried to its limit).
const LATENCY_BUCKETS: &[f64] = &[
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Latency {
    pub fn new(node: &str) -> Latency {
        let family = HistogramVec::new(
            HistogramOpts::new(
                "exanet_ni_completion_latency_seconds",
                "Time from a workload's command to its completion, by operation and result",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["node", "op", "result"],
        )
        .expect("valid metric");
        let bind = |op: &str| {
            [
                family.with_label_values(&[node, op, "failed"]),
                family.with_label_values(&[node, op, "ok"]),
            ]
        };
        let bound = [bind("send"), bind("rdma_write"), bind("rdma_read")];
        Latency { family, bound }
    }

    pub fn observe(&self, op: Op, ok: bool, ns: u64) {
        self.bound[op as usize][usize::from(ok)].observe(ns as f64 / 1e9);
    }

    pub fn family(&self) -> &HistogramVec {
        &self.family
    }
}

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
    link_faults: IntCounterVec,
    link_fault_delayed: IntCounterVec,
    link_fault_delay: CounterVec,
    link_admin_down: IntGaugeVec,
    link_rx_corrupt: IntCounterVec,
    link_held: IntGaugeVec,
    link_setting: GaugeVec,
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
const LINK_FAULT: &[&str] = &["node", "peer", "port", "kind", "fault"];
const LINK_SETTING: &[&str] = &["node", "peer", "port", "kind", "setting"];

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

/// [`raise`] for a counter of seconds.
fn raise_f64(c: &prometheus::Counter, value: f64) {
    let cur = c.get();
    if value > cur {
        c.inc_by(value - cur);
    }
}

impl Metrics {
    /// The daemon's metrics; `latency` is the core's histogram family, observed as
    /// completions happen and exported with the rest.
    pub fn new(latency: &HistogramVec) -> Metrics {
        let r = Registry::new();
        reg(&r, latency.clone());
        let cv = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                CounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
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
        let gv = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
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
            link_stall: cv(
                "exanet_link_stall_seconds_total",
                "Time the link's output had a cell to send but no flow-control credit",
                LINK,
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
            link_faults: icv(
                "exanet_link_faults_injected_total",
                "Cells this node's fault injector dropped or corrupted on the link (fault: drop, corrupt)",
                LINK_FAULT,
            ),
            link_fault_delayed: icv(
                "exanet_link_fault_delayed_frames_total",
                "Frames held back by the link's delay, jitter or rate setting",
                LINK,
            ),
            link_fault_delay: cv(
                "exanet_link_fault_delay_seconds_total",
                "Total time frames were held back by the link's delay, jitter or rate setting",
                LINK,
            ),
            link_admin_down: igv(
                "exanet_link_admin_down",
                "1 when the operator has cut the link",
                LINK,
            ),
            link_rx_corrupt: icv(
                "exanet_link_rx_corrupt_cells_total",
                "Cells from the link refused as undecodable (header or footer CRC errors, bad headers)",
                LINK,
            ),
            link_held: igv(
                "exanet_link_fault_held_bytes",
                "Bytes held back by the link's delay or rate setting right now",
                LINK,
            ),
            link_setting: gv(
                "exanet_link_fault_setting",
                "Faults set on what this node sends over the link (setting: delay_seconds, jitter_seconds, rate_bytes_per_second, loss_ratio, corrupt_ratio)",
                LINK_SETTING,
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
            uptime: gv(
                "exanet_node_uptime_seconds",
                "Seconds since the daemon started",
                &["node"],
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
            raise_f64(&self.link_stall.with_label_values(&base), l.stall_seconds);
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
            let fs = &l.fault_stats;
            for (fault, v) in [("drop", fs.dropped_cells), ("corrupt", fs.corrupted_cells)] {
                let lv = [base[0], base[1], base[2], base[3], fault];
                raise(&self.link_faults.with_label_values(&lv), v);
            }
            raise(
                &self.link_fault_delayed.with_label_values(&base),
                fs.delayed_frames,
            );
            raise_f64(
                &self.link_fault_delay.with_label_values(&base),
                fs.delay_ns as f64 / 1e9,
            );
            self.link_admin_down
                .with_label_values(&base)
                .set(i64::from(l.admin_down));
            raise(
                &self.link_rx_corrupt.with_label_values(&base),
                l.rx_corrupt_cells,
            );
            self.link_held
                .with_label_values(&base)
                .set(l.held_bytes as i64);
            let f = l.faults.unwrap_or_default();
            for (setting, v) in [
                ("delay_seconds", f.delay_ns as f64 / 1e9),
                ("jitter_seconds", f.jitter_ns as f64 / 1e9),
                ("rate_bytes_per_second", f.rate_bps as f64 / 8.0),
                ("loss_ratio", f.loss),
                ("corrupt_ratio", f.corrupt),
            ] {
                let lv = [base[0], base[1], base[2], base[3], setting];
                self.link_setting.with_label_values(&lv).set(v);
            }
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
