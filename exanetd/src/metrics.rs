//! Prometheus metrics of one daemon. The core keeps plain counters; at every scrape this
//! module brings the Prometheus families up to date from a status snapshot, so the hot
//! path pays nothing for metrics.
//!
//! The families (name, help, type, labels) are declared once, in exanet-proto's catalog
//! [`exanet_proto::metric::Family`], whose documentation is the table of every metric;
//! this module registers each family of the catalog and says where its values come from.
//! The NI's counters reach their families through [`exanet_proto::metric::NI_COUNTERS`],
//! and the fault settings through the fault-kind table ([`FaultKind::metric`]), so
//! neither is listed here.

use exanet_proto::fault::FaultKind;
use exanet_proto::metric::{Family, MetricType, Number, LATENCY_BUCKETS, LINK_COUNTERS};
use exanet_proto::workload::OpKind;
use prometheus::core::Collector;
use prometheus::{
    CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec,
    IntGaugeVec, Opts, Registry,
};
use tracing::warn;

use exanet_control::control::{LinkState, NodeStatus};

/// Completion latency histograms, kept by the core and observed as completions happen
/// (a histogram cannot be rebuilt from a snapshot at scrape time like the counters).
/// One observation is a few atomic adds.
pub struct Latency {
    family: HistogramVec,
    /// Bound children by [op][ok]: no label lookup on the hot path.
    bound: [[Histogram; 2]; OpKind::ALL.len()],
}

/// The histogram family of the catalog's `family`.
fn histogram(family: Family) -> prometheus::Result<HistogramVec> {
    let spec = family.spec();
    HistogramVec::new(
        HistogramOpts::new(spec.name, spec.help).buckets(LATENCY_BUCKETS.to_vec()),
        spec.labels,
    )
}

impl Latency {
    pub fn new(node: &str) -> Latency {
        // The catalog's declaration is static data checked by this module's tests
        // (`every_family_registers`), so this cannot fail at run time.
        let family = histogram(Family::NiCompletionLatency).expect("valid catalog histogram");
        let bind = |op: &str| {
            [
                family.with_label_values(&[node, op, "failed"]),
                family.with_label_values(&[node, op, "ok"]),
            ]
        };
        let bound = OpKind::ALL.map(|op| bind(op.label()));
        Latency { family, bound }
    }

    pub fn observe(&self, op: OpKind, ok: bool, ns: u64) {
        self.bound[op as usize][usize::from(ok)].observe(ns as f64 / 1e9);
    }

    pub fn family(&self) -> &HistogramVec {
        &self.family
    }
}

/// One registered family, of the Prometheus type its declaration asks for.
#[derive(Clone)]
enum Handle {
    IntCounter(IntCounterVec),
    Counter(CounterVec),
    IntGauge(IntGaugeVec),
    Gauge(GaugeVec),
    /// Observed by the core as completions happen, not set at scrape time.
    Histogram(HistogramVec),
}

impl Handle {
    fn new(family: Family) -> prometheus::Result<Handle> {
        let spec = family.spec();
        let opts = || Opts::new(spec.name, spec.help);
        Ok(match (spec.kind, spec.number) {
            (MetricType::Counter, Number::Int) => {
                Handle::IntCounter(IntCounterVec::new(opts(), spec.labels)?)
            }
            (MetricType::Counter, Number::Float) => {
                Handle::Counter(CounterVec::new(opts(), spec.labels)?)
            }
            (MetricType::Gauge, Number::Int) => {
                Handle::IntGauge(IntGaugeVec::new(opts(), spec.labels)?)
            }
            (MetricType::Gauge, Number::Float) => {
                Handle::Gauge(GaugeVec::new(opts(), spec.labels)?)
            }
            (MetricType::Histogram, _) => Handle::Histogram(histogram(family)?),
        })
    }

    fn collector(&self) -> Box<dyn prometheus::core::Collector> {
        match self {
            Handle::IntCounter(c) => Box::new(c.clone()),
            Handle::Counter(c) => Box::new(c.clone()),
            Handle::IntGauge(c) => Box::new(c.clone()),
            Handle::Gauge(c) => Box::new(c.clone()),
            Handle::Histogram(c) => Box::new(c.clone()),
        }
    }
}

/// A value read from the status, in the number it is kept in there.
#[derive(Clone, Copy, Debug)]
enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Int(u64::from(v))
    }
}

impl Value {
    fn int(self) -> u64 {
        match self {
            Value::Int(v) => v,
            Value::Float(v) => v as u64,
        }
    }

    fn float(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::Float(v) => v,
        }
    }
}

pub struct Metrics {
    registry: Registry,
    /// By [`Family::index`]; `None` for a family that could not be registered.
    families: Vec<Option<Handle>>,
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
    /// The daemon's metrics, one family per entry of the catalog; `latency` is the core's
    /// histogram family, observed as completions happen and exported with the rest.
    pub fn new(latency: &HistogramVec) -> Metrics {
        let registry = Registry::new();
        let is_latency = |f: Family| {
            latency
                .desc()
                .first()
                .is_some_and(|d| d.fq_name == f.name())
        };
        let families = Family::ALL
            .iter()
            .map(|&f| {
                let handle = if is_latency(f) {
                    Ok(Handle::Histogram(latency.clone()))
                } else {
                    Handle::new(f)
                };
                // A family that cannot be registered is left out of the exposition rather
                // than taking the daemon down; the catalog's tests keep this from happening.
                match handle.and_then(|h| registry.register(h.collector()).map(|()| h)) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        warn!(family = f.name(), error = %e, "metric family not exported");
                        None
                    }
                }
            })
            .collect();
        Metrics { registry, families }
    }

    /// Brings the series `labels` of `family` to `value`: a counter is raised to it, a
    /// gauge set to it.
    fn put(&self, family: Family, labels: &[&str], value: impl Into<Value>) {
        let value = value.into();
        // A label count other than the family's is a bug of this module that the tests
        // catch; at run time the series is skipped.
        match self.families.get(family.index()) {
            Some(Some(Handle::IntCounter(c))) => {
                if let Ok(c) = c.get_metric_with_label_values(labels) {
                    raise(&c, value.int());
                }
            }
            Some(Some(Handle::Counter(c))) => {
                if let Ok(c) = c.get_metric_with_label_values(labels) {
                    raise_f64(&c, value.float());
                }
            }
            Some(Some(Handle::IntGauge(c))) => {
                if let Ok(c) = c.get_metric_with_label_values(labels) {
                    c.set(i64::try_from(value.int()).unwrap_or(i64::MAX));
                }
            }
            Some(Some(Handle::Gauge(c))) => {
                if let Ok(c) = c.get_metric_with_label_values(labels) {
                    c.set(value.float());
                }
            }
            Some(Some(Handle::Histogram(_)) | None) | None => {}
        }
    }

    /// Brings every family up to date with `s` and renders the text exposition format.
    pub fn render(&self, s: &NodeStatus) -> String {
        let n = s.node.as_str();
        for l in &s.links {
            let base = [n, l.peer.as_str(), l.port.as_str(), l.kind.as_str()];
            let with = |last: &'static str| [base[0], base[1], base[2], base[3], last];
            for (dir, cells, bytes) in [
                ("tx", l.tx_cells, l.tx_bytes),
                ("rx", l.rx_cells, l.rx_bytes),
            ] {
                self.put(Family::LinkCells, &with(dir), cells);
                self.put(Family::LinkBytes, &with(dir), bytes);
            }
            self.put(Family::LinkStall, &base, l.stall_seconds);
            self.put(Family::LinkModeledBusy, &base, l.modeled_busy_seconds);
            self.put(Family::LinkQueueCells, &base, l.queue_cells);
            self.put(Family::LinkQueueBytes, &base, l.queue_bytes);
            self.put(Family::LinkInFlight, &base, l.in_flight_bytes);
            self.put(Family::LinkUp, &base, l.state == LinkState::Up);
            self.put(Family::LinkSessions, &base, l.sessions);
            let fs = &l.fault_stats;
            for (_, fault, v) in fs.counted() {
                self.put(Family::LinkFaultsInjected, &with(fault), v);
            }
            self.put(Family::LinkFaultDelayedFrames, &base, fs.delayed_frames);
            self.put(Family::LinkFaultDelay, &base, fs.delay_ns as f64 / 1e9);
            self.put(Family::LinkAdminDown, &base, l.admin_down);
            for c in LINK_COUNTERS {
                self.put(c.family, &base, (c.get)(&l.counters));
            }
            self.put(Family::LinkFaultHeld, &base, l.held_bytes);
            let f = l.faults.unwrap_or_default();
            for kind in FaultKind::ALL {
                if let Some(setting) = kind.metric() {
                    let v = kind.get(&f).metric_value();
                    self.put(Family::LinkFaultSetting, &with(setting), v);
                }
            }
        }
        self.put(Family::NodeForwarded, &[n], s.forwarded_cells);
        self.put(Family::NodeInjected, &[n], s.injected_cells);
        self.put(Family::NodeDelivered, &[n], s.delivered_cells);
        for (kind, v) in &s.errors {
            self.put(Family::NodeErrors, &[n, kind.as_str()], *v);
        }
        self.put(Family::NodeUptime, &[n], s.uptime_seconds);
        self.put(Family::NodeRestarts, &[n], s.restarts);
        self.put(Family::NodeModeledTime, &[n], s.modeled_time_seconds);
        self.put(Family::NodeLateCells, &[n], s.late_cells);
        self.put(
            Family::NodeCaptureRecords,
            &[n, "captured"],
            s.capture.captured,
        );
        self.put(
            Family::NodeCaptureRecords,
            &[n, "dropped"],
            s.capture.dropped,
        );
        for j in &s.collectives {
            let c = &j.report;
            let (kind, path) = (c.kind.label(), c.path.label());
            for (result, v) in [
                ("started", c.started),
                ("completed", c.completed),
                ("failed", c.failed),
            ] {
                self.put(Family::NiCollectives, &[n, &j.job, kind, path, result], v);
            }
        }
        self.put(Family::NiAttached, &[n], u64::from(s.ni.attached));
        for sample in s.ni.counters.samples() {
            let mut labels = vec![n];
            labels.extend(sample.labels);
            self.put(sample.family, &labels, sample.value);
        }
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exanet_control::control::LinkStatus;
    use exanet_control::control::NiStatus;
    use exanet_proto::fault::{FaultKind, FaultStats, LinkFaults};
    use exanet_proto::metric::{LinkStats, NiCount, NI_COUNTERS};
    use exanet_proto::ni::NackReason;
    use exanet_proto::ni::NiStats;

    /// A status in which every value the exporter reads is distinct and non-zero.
    #[allow(clippy::needless_update)]
    fn sample() -> NodeStatus {
        let link = |port: &str, peer: &str, base: u64| LinkStatus {
            port: port.into(),
            peer: peer.into(),
            kind: "qfdb".into(),
            gbps: 10,
            state: LinkState::Up,
            sessions: base + 1,
            tx_cells: base + 2,
            tx_bytes: base + 3,
            rx_cells: base + 4,
            rx_bytes: base + 5,
            stall_seconds: 0.25,
            queue_cells: base + 6,
            queue_bytes: base + 7,
            in_flight_bytes: base + 8,
            admin_down: true,
            faults: Some(LinkFaults {
                delay_ns: 1_500_000,
                jitter_ns: 250_000,
                rate_bps: 8_000_000,
                loss: 0.125,
                corrupt: 0.0625,
                down: true,
                ..LinkFaults::default()
            }),
            fault_stats: {
                let mut fs = FaultStats::default();
                fs.delayed_frames = base + 11;
                fs.delay_ns = 3_000_000_000;
                for _ in 0..base + 9 {
                    fs.count(FaultKind::Loss);
                }
                for _ in 0..base + 10 {
                    fs.count(FaultKind::Corrupt);
                }
                fs
            },
            held_bytes: base + 12,
            // Counters added later read as zero here rather than needing this test
            // edited for each (so the update is needless only until then).
            counters: LinkStats {
                rx_corrupt_cells: base + 13,
                ..LinkStats::default()
            },
            modeled_busy_seconds: 0.000_125,
            quic: None,
        };
        let mut errors = std::collections::BTreeMap::new();
        errors.insert("tls_refused".to_string(), 3);
        errors.insert("bad_cell".to_string(), 4);
        let mut nacks_sent = [0; exanet_proto::ni::REASONS];
        nacks_sent[NackReason::PageFault as usize] = 21;
        nacks_sent[NackReason::Crc as usize] = 22;
        let mut nacks_received = [0; exanet_proto::ni::REASONS];
        nacks_received[NackReason::NoContext as usize] = 23;
        NodeStatus {
            node: "M1QAF2".into(),
            id: 1,
            shape: "1x1x1".into(),
            pid: 42,
            uptime_seconds: 12.5,
            restarts: 2,
            links: vec![link("f1", "M1QAF1", 100), link("f4", "M1QAF4", 200)],
            forwarded_cells: 31,
            injected_cells: 32,
            delivered_cells: 33,
            load_tx_cells: 34,
            load_rx_cells: 35,
            load_rx_bytes: 36,
            errors,
            modeled_time_seconds: 0.0005,
            late_cells: 3,
            ni: NiStatus {
                attached: 2,
                counters: NiStats {
                    messages_sent: 41,
                    messages_received: 42,
                    acks_sent: 43,
                    acks_received: 44,
                    nacks_sent,
                    nacks_received,
                    retransmissions: 45,
                    timeouts: 46,
                    pdid_violations: 47,
                    rdma_blocks_sent: 48,
                    rdma_blocks_received: 49,
                    rdma_transfers_done: 50,
                    rdma_transfers_failed: 51,
                    // Counters added later read as zero here rather than needing this test
                    // edited for each.
                    ..NiStats::default()
                },
                ..NiStatus::default()
            },
            capture: exanet_control::control::CaptureSummary {
                captured: 61,
                dropped: 62,
            },
            collectives: vec![exanet_control::control::JobCollectives {
                job: "alice".into(),
                report: exanet_proto::attach::CollectiveReport {
                    kind: exanet_proto::attach::CollectiveKind::Allreduce,
                    path: exanet_proto::attach::CollectivePath::Software,
                    started: 71,
                    completed: 70,
                    failed: 1,
                },
            }],
        }
    }

    fn rendered() -> String {
        let lat = Latency::new("M1QAF2");
        lat.observe(OpKind::Write, true, 30_000);
        let m = Metrics::new(lat.family());
        // Twice: the second scrape raises counters to the same values, changing nothing.
        m.render(&sample());
        m.render(&sample())
    }

    #[test]
    fn every_family_registers() {
        let lat = Latency::new("M1QAF2");
        let m = Metrics::new(lat.family());
        for f in Family::ALL {
            assert!(
                m.families[f.index()].is_some(),
                "{} not registered",
                f.name()
            );
        }
    }

    #[test]
    fn exposition_lists_exactly_the_catalog() {
        let out = rendered();
        let mut exported: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        exported.sort_unstable();
        let mut catalog: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
        catalog.sort_unstable();
        assert_eq!(exported, catalog);
        for f in Family::ALL {
            let spec = f.spec();
            let help = format!("# HELP {} {}\n", spec.name, spec.help);
            let ty = format!("# TYPE {} {}\n", spec.name, spec.kind.as_str());
            assert!(out.contains(&help), "{help}");
            assert!(out.contains(&ty), "{ty}");
        }
    }

    #[test]
    fn series_carry_the_status_values() {
        let out = rendered();
        for line in [
            r#"exanet_link_cells_total{direction="tx",kind="qfdb",node="M1QAF2",peer="M1QAF4",port="f4"} 202"#,
            r#"exanet_link_stall_seconds_total{kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1"} 0.25"#,
            r#"exanet_link_up{kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1"} 1"#,
            r#"exanet_link_admin_down{kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1"} 1"#,
            r#"exanet_link_faults_injected_total{fault="corrupt",kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1"} 110"#,
            r#"exanet_link_fault_delay_seconds_total{kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1"} 3"#,
            r#"exanet_link_fault_setting{kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1",setting="delay_seconds"} 0.0015"#,
            r#"exanet_link_fault_setting{kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1",setting="rate_bytes_per_second"} 1000000"#,
            r#"exanet_link_fault_setting{kind="qfdb",node="M1QAF2",peer="M1QAF1",port="f1",setting="corrupt_ratio"} 0.0625"#,
            r#"exanet_node_errors_total{kind="tls_refused",node="M1QAF2"} 3"#,
            r#"exanet_node_uptime_seconds{node="M1QAF2"} 12.5"#,
            r#"exanet_node_restarts_total{node="M1QAF2"} 2"#,
            r#"exanet_link_modeled_busy_seconds_total{kind="qfdb",node="M1QAF2",peer="M1QAF4",port="f4"} 0.000125"#,
            r#"exanet_node_modeled_time_seconds{node="M1QAF2"} 0.0005"#,
            r#"exanet_node_late_cells_total{node="M1QAF2"} 3"#,
            r#"exanet_node_capture_records_total{node="M1QAF2",result="captured"} 61"#,
            r#"exanet_node_capture_records_total{node="M1QAF2",result="dropped"} 62"#,
            r#"exanet_ni_collectives_total{job="alice",kind="allreduce",node="M1QAF2",path="software",result="failed"} 1"#,
            r#"exanet_ni_collectives_total{job="alice",kind="allreduce",node="M1QAF2",path="software",result="started"} 71"#,
            r#"exanet_ni_attached_workloads{node="M1QAF2"} 2"#,
            r#"exanet_ni_messages_total{direction="rx",node="M1QAF2"} 42"#,
            r#"exanet_ni_acks_total{direction="tx",node="M1QAF2"} 43"#,
            r#"exanet_ni_nacks_total{direction="tx",node="M1QAF2",reason="crc"} 22"#,
            r#"exanet_ni_nacks_total{direction="rx",node="M1QAF2",reason="no_context"} 23"#,
            r#"exanet_ni_retransmissions_total{node="M1QAF2"} 45"#,
            r#"exanet_ni_timeouts_total{node="M1QAF2"} 46"#,
            r#"exanet_ni_pdid_violations_total{node="M1QAF2"} 47"#,
            r#"exanet_ni_rdma_blocks_total{direction="rx",node="M1QAF2"} 49"#,
            r#"exanet_ni_rdma_transfers_total{node="M1QAF2",result="failed"} 51"#,
            r#"exanet_ni_completion_latency_seconds_count{node="M1QAF2",op="rdma_write",result="ok"} 1"#,
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line}");
        }
        // NACK reasons that never happened have no series, and the down switch, which
        // has no metric setting in the fault-kind table, is not a setting.
        assert!(!out.contains(r#"direction="rx",node="M1QAF2",reason="crc""#));
        assert!(!out.contains(r#"setting="down"#));
    }

    /// The status report carries the NI's counters flat, each under its own name, as it
    /// did before they were one `NiStats`: exactl, the tests and scripts read that JSON.
    #[test]
    fn the_status_report_carries_every_ni_counter_under_its_name() {
        let json = serde_json::to_value(sample().ni).expect("status serialises");
        assert_eq!(json["attached"], 2);
        assert_eq!(json["messages_sent"], 41);
        assert_eq!(json["rdma_transfers_failed"], 51);
        assert_eq!(
            json["nacks_sent"],
            serde_json::json!({ "page_fault": 21, "crc": 22 })
        );
        for c in NI_COUNTERS {
            let shape_ok = match ((c.get)(&NiStats::default()), json.get(c.field)) {
                (NiCount::One(_), Some(v)) => v.is_u64(),
                (NiCount::ByReason(_), Some(v)) => v.is_object(),
                (_, None) => false,
            };
            assert!(shape_ok, "the status lacks `{}` in its shape", c.field);
        }
        let back: NiStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, sample().ni);
    }

    #[test]
    fn ni_stats_travel_in_the_status_reports_shape() {
        let mut st = NiStats {
            timeouts: 4,
            ..NiStats::default()
        };
        st.nacks_sent[NackReason::Crc as usize] = 5;
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["timeouts"], 4);
        assert_eq!(json["nacks_sent"], serde_json::json!({ "crc": 5 }));
        assert_eq!(json["nacks_received"], serde_json::json!({}));
        assert_eq!(serde_json::from_value::<NiStats>(json).unwrap(), st);
        // An older report without a counter reads as zero.
        let old: NiStats = serde_json::from_str(r#"{"timeouts": 2}"#).unwrap();
        assert_eq!(old.timeouts, 2);
        assert!(serde_json::from_str::<NiStats>(r#"{"nacks_sent": {"nope": 1}}"#).is_err());
    }
}
