//! The catalog of the metric families a node exports, as plain data: name, help, type,
//! labels. The daemon registers its Prometheus families by walking [`Family::ALL`], the
//! dashboards name families through [`Family::name`], and the NI's counters are declared
//! here with the family each feeds ([`NiStats`], [`NI_COUNTERS`]), so a family is declared
//! once and a new NI counter is one line here plus the place that counts it.
//!
//! Nothing here depends on Prometheus: the core only counts, and an exporter turns the
//! counts into whatever format it serves.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ni::nack::{NackReason, REASONS};

/// How a family's values behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up (an exporter raises it to the core's count).
    Counter,
    /// Set to the current value.
    Gauge,
    /// Observed as events happen, into [`LATENCY_BUCKETS`].
    Histogram,
}

impl MetricType {
    /// The word Prometheus's `# TYPE` line uses.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// How a family's values are kept. Counts stay integers so that they are exact however
/// large they grow; times and ratios are real numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Number {
    Int,
    Float,
}

/// One metric family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MetricFamily {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
    pub number: Number,
    /// Label names, in the order an exporter gives their values; `node` is always first.
    pub labels: &'static [&'static str],
}

/// Bucket bounds of the latency histograms, seconds: from 5 µs (a message to the node
/// itself) to 10 s (a transfer retried to its limit).
pub const LATENCY_BUCKETS: &[f64] = &[
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Declares every family once: the [`Family`] enum, its table and the catalog's
/// documentation (the table on [`Family`] is generated from the same entries, so it
/// cannot drift from what is exported).
macro_rules! families {
    ($(
        $(#[doc = $doc:literal])*
        $id:ident: $kind:ident $number:ident $name:literal
            [$first:literal $(, $label:literal)*] $help:literal;
    )*) => {
        /// A metric family a node exports. Every family, generated from the catalog:
        ///
        /// | metric | type | labels | help |
        /// |---|---|---|---|
        $(
            #[doc = concat!(
                "| `", $name, "` | ", stringify!($kind), " | ",
                $first, $(", ", $label,)* " | ", $help, " |"
            )]
        )*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Family {
            $( $(#[doc = $doc])* $id, )*
        }

        impl Family {
            /// Every family, in the order of the catalog.
            pub const ALL: &'static [Family] = &[$(Family::$id),*];
            /// How many families there are (the size of a per-family array).
            pub const COUNT: usize = Self::ALL.len();

            /// Its place in [`Family::ALL`] (for per-family arrays).
            pub fn index(self) -> usize {
                self as usize
            }

            /// Its declaration.
            pub fn spec(self) -> &'static MetricFamily {
                match self {
                    $(Family::$id => &MetricFamily {
                        name: $name,
                        help: $help,
                        kind: MetricType::$kind,
                        number: Number::$number,
                        labels: &[$first $(, $label)*],
                    },)*
                }
            }

            pub fn name(self) -> &'static str {
                self.spec().name
            }

            /// The family a name names, if the catalog has it.
            pub fn from_name(name: &str) -> Option<Family> {
                Self::ALL.iter().copied().find(|f| f.name() == name)
            }
        }
    };
}

families! {
    LinkCells: Counter Int "exanet_link_cells_total"
        ["node", "peer", "port", "kind", "direction"]
        "Cells carried by the link";
    LinkBytes: Counter Int "exanet_link_bytes_total"
        ["node", "peer", "port", "kind", "direction"]
        "Bytes (cell headers, payloads and footers) carried by the link";
    LinkStall: Counter Float "exanet_link_stall_seconds_total"
        ["node", "peer", "port", "kind"]
        "Time the link's output had a cell to send but no flow-control credit";
    /// Modeled time ([`crate::model`]), from [`crate::switch::PortStats::modeled_busy_ps`]:
    /// its increase over that of [`Family::NodeModeledTime`] is the link's modeled
    /// utilization.
    LinkModeledBusy: Counter Float "exanet_link_modeled_busy_seconds_total"
        ["node", "peer", "port", "kind"]
        "Modeled time the link's output spent sending (modeled utilization: its increase over that of exanet_node_modeled_time_seconds)";
    LinkQueueCells: Gauge Int "exanet_link_queue_cells"
        ["node", "peer", "port", "kind"]
        "Cells from the link queued at this node's switch input";
    LinkQueueBytes: Gauge Int "exanet_link_queue_bytes"
        ["node", "peer", "port", "kind"]
        "Bytes from the link queued at this node's switch input";
    LinkInFlight: Gauge Int "exanet_link_in_flight_bytes"
        ["node", "peer", "port", "kind"]
        "Bytes sent on the link whose credit has not come back";
    LinkUp: Gauge Int "exanet_link_up"
        ["node", "peer", "port", "kind"]
        "1 when the link session is up";
    LinkSessions: Counter Int "exanet_link_sessions_total"
        ["node", "peer", "port", "kind"]
        "Link sessions established (1 + reconnects)";
    /// `fault` is `drop` or `corrupt`.
    LinkFaultsInjected: Counter Int "exanet_link_faults_injected_total"
        ["node", "peer", "port", "kind", "fault"]
        "Cells this node's fault injector acted on over the link (fault: drop, corrupt, duplicate, reorder)";
    LinkFaultDelayedFrames: Counter Int "exanet_link_fault_delayed_frames_total"
        ["node", "peer", "port", "kind"]
        "Frames held back by the link's delay, jitter or rate setting";
    LinkFaultDelay: Counter Float "exanet_link_fault_delay_seconds_total"
        ["node", "peer", "port", "kind"]
        "Total time frames were held back by the link's delay, jitter or rate setting";
    LinkAdminDown: Gauge Int "exanet_link_admin_down"
        ["node", "peer", "port", "kind"]
        "1 when the operator has cut the link";
    LinkRxCorrupt: Counter Int "exanet_link_rx_corrupt_cells_total"
        ["node", "peer", "port", "kind"]
        "Cells from the link refused as undecodable (header or footer CRC errors, bad headers)";
    LinkFaultHeld: Gauge Int "exanet_link_fault_held_bytes"
        ["node", "peer", "port", "kind"]
        "Bytes held back by the link's delay or rate setting right now";
    /// One series per [`crate::fault::FaultKind`] with a metric setting, labelled with
    /// [`crate::fault::FaultKind::metric`], valued by
    /// [`crate::fault::FaultValue::metric_value`].
    LinkFaultSetting: Gauge Float "exanet_link_fault_setting"
        ["node", "peer", "port", "kind", "setting"]
        "Faults set on what this node sends over the link (setting: delay_seconds, jitter_seconds, rate_bytes_per_second, loss_ratio, corrupt_ratio, duplicate_ratio, reorder_ratio, reorder_window_seconds)";
    NodeForwarded: Counter Int "exanet_node_cells_forwarded_total"
        ["node"]
        "Cells switched from one link to another";
    NodeInjected: Counter Int "exanet_node_cells_injected_total"
        ["node"]
        "Cells injected by the node's network interface";
    NodeDelivered: Counter Int "exanet_node_cells_delivered_total"
        ["node"]
        "Cells delivered to the node's network interface";
    /// Kinds include `tls_refused` (a peer or operator without a certificate of the
    /// rack CA), `control_refused` (a rack certificate other than the operator's on the
    /// control API), `link_admin_down` (a neighbour dialing a cut link), the frame and
    /// cell decoding errors, and the workload interface's refusals.
    NodeErrors: Counter Int "exanet_node_errors_total"
        ["node", "kind"]
        "Errors by kind (malformed cells, refused peers, ...)";
    NodeUptime: Gauge Float "exanet_node_uptime_seconds"
        ["node"]
        "Seconds since the daemon started";
    /// Counted by whoever restarts the daemon (a process's own counters start at 0):
    /// exactl's supervisor on a local rack brought up with `--restart unless-stopped`.
    NodeRestarts: Counter Int "exanet_node_restarts_total"
        ["node"]
        "Times the node's daemon was started again after it died on its own";
    /// [`crate::switch::Switch::modeled_now`]: the clock against which
    /// [`Family::LinkModeledBusy`] is a utilization.
    NodeModeledTime: Gauge Float "exanet_node_modeled_time_seconds"
        ["node"]
        "The node's modeled clock: the latest modeled time a cell left its switch";
    /// [`crate::switch::Switch::late_cells`]: with `[model] order = "modeled"`, cells a
    /// switch had to forward after a cell of another input with a later key (a post that
    /// came after the horizons moved past it, a retransmission); their figures may
    /// differ from run to run. Always 0 in host order.
    NodeLateCells: Counter Int "exanet_node_late_cells_total"
        ["node"]
        "Cells forwarded out of modeled order (modeled order only: a late post or a retransmission)";
    /// `result` is `captured` or `dropped` (the capture could not keep up; the cell
    /// itself went on).
    NodeCaptureRecords: Counter Int "exanet_node_capture_records_total"
        ["node", "result"]
        "Cells copied to operators' captures (result: captured, dropped because a capture could not keep up)";
    NiAttached: Gauge Int "exanet_ni_attached_workloads"
        ["node"]
        "Workloads attached to the node's NI";
    NiMessages: Counter Int "exanet_ni_messages_total"
        ["node", "direction"]
        "Packetizer messages sent (tx) and received (rx)";
    NiAcks: Counter Int "exanet_ni_acks_total"
        ["node", "direction"]
        "ACKs sent (tx) and received (rx)";
    /// `reason` is a [`NackReason::label`].
    NiNacks: Counter Int "exanet_ni_nacks_total"
        ["node", "direction", "reason"]
        "NACKs sent (tx) and received (rx) by reason";
    NiRetransmissions: Counter Int "exanet_ni_retransmissions_total"
        ["node"]
        "Messages and RDMA blocks sent again";
    NiTimeouts: Counter Int "exanet_ni_timeouts_total"
        ["node"]
        "Waits for an answer that expired";
    NiPdidViolations: Counter Int "exanet_ni_pdid_violations_total"
        ["node"]
        "Cells refused because their PDID is not the destination's";
    NiStampsClamped: Counter Int "exanet_ni_stamps_clamped_total"
        ["node"]
        "Workload commands stamped more than a day of modeled time ahead of their rank's clock, taken at a day ahead";
    /// `program`: what the rank's program was taken to be doing when the promise was
    /// made (`gone`: silent, promising nothing; `running`; `waiting` in the library).
    NiLatePosts: Counter Int "exanet_ni_late_posts_total"
        ["node", "program"]
        "In modeled order, workload commands stamped behind what the NI had promised for its programs, by what the poster was taken to be doing";
    NiRdmaBlocks: Counter Int "exanet_ni_rdma_blocks_total"
        ["node", "direction"]
        "RDMA blocks sent (tx) and received complete (rx)";
    NiRdmaTransfers: Counter Int "exanet_ni_rdma_transfers_total"
        ["node", "result"]
        "RDMA transfers ended, by result";
    NiAllreduce: Counter Int "exanet_ni_allreduce_total"
        ["node", "result"]
        "Allreduces on the NI's accelerator: started, and ended by result";
    /// Reported by the workloads' libraries ([`crate::attach::Request::CollectiveCounts`]):
    /// `kind` barrier, bcast, reduce, allreduce; `path` accelerator, software; `result`
    /// started, completed, failed. Per `job` (a rack file's job name): a workload can report
    /// any count, and must only move its own job's.
    NiCollectives: Counter Int "exanet_ni_collectives_total"
        ["node", "job", "kind", "path", "result"]
        "Collectives the node's workloads ran, by job, kind, path (accelerator, software) and result (started, completed, failed), as their libraries report them";
    NiAllreduceCells: Counter Int "exanet_ni_allreduce_cells_total"
        ["node", "direction"]
        "Accelerator cells sent and received (retransmissions included)";
    /// `op` is `send`, `rdma_write` or `rdma_read`; `result` is `ok` or `failed`.
    NiCompletionLatency: Histogram Float "exanet_ni_completion_latency_seconds"
        ["node", "op", "result"]
        "Time from a workload's command to its completion, by operation and result";
}

/// One [`NiStats`] field's count, as the field keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NiCount<'a> {
    One(u64),
    /// Indexed by [`NackReason`] code; exported as one series per reason, labelled with
    /// [`NackReason::label`], once that reason has happened.
    ByReason(&'a [u64; REASONS]),
}

impl<'a> From<&'a u64> for NiCount<'a> {
    fn from(v: &'a u64) -> Self {
        NiCount::One(*v)
    }
}

impl<'a> From<&'a [u64; REASONS]> for NiCount<'a> {
    fn from(v: &'a [u64; REASONS]) -> Self {
        NiCount::ByReason(v)
    }
}

/// Where one [`NiStats`] field is exported.
#[derive(Clone, Copy, Debug)]
pub struct NiCounter {
    /// The field's name, which is also its key in a daemon's status (`NiStatus`).
    pub field: &'static str,
    pub family: Family,
    /// Values of the family's labels after `node` (and before `reason`, for a count by
    /// reason).
    pub labels: &'static [&'static str],
    pub get: for<'a> fn(&'a NiStats) -> NiCount<'a>,
}

/// Where one [`LinkStats`] field is exported: a family labelled with the link (`node`,
/// `peer`, `port`, `kind`).
#[derive(Clone, Copy, Debug)]
pub struct LinkCounter {
    /// The field's name, which is also its key in a daemon's status (`LinkStatus`).
    pub field: &'static str,
    pub family: Family,
    pub get: fn(&LinkStats) -> u64,
}

/// Declares the counters a link end keeps once: the [`LinkStats`] fields and the family
/// each feeds ([`LINK_COUNTERS`]). A new one is a line here (and its family above) plus
/// the place that counts it.
macro_rules! link_stats {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident => $family:ident;
    )*) => {
        /// Counters of one link end (`exanet_proto::LinkEnd`), carried in a
        /// daemon's status report under their field names.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct LinkStats {
            $( $(#[doc = $doc])* pub $field: u64, )*
        }

        /// Every [`LinkStats`] field and the family it feeds.
        pub const LINK_COUNTERS: &[LinkCounter] = &[
            $(LinkCounter {
                field: stringify!($field),
                family: Family::$family,
                get: |s| s.$field,
            },)*
        ];
    };
}

link_stats! {
    /// Cells from the peer refused as undecodable (bad CRC, bad header).
    rx_corrupt_cells => LinkRxCorrupt;
}

/// One series of an NI counter: its family, its label values after `node`, its count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NiSample {
    pub family: Family,
    pub labels: Vec<&'static str>,
    pub value: u64,
}

/// Declares the NI's counters once: the [`NiStats`] fields and, for each exported one,
/// the family and label values it feeds ([`NI_COUNTERS`]).
macro_rules! ni_stats {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty $(=> $family:ident [$($value:literal),*])?;
    )*) => {
        /// Counters of the NI, for metrics. Serialised as the daemon's status report
        /// carries them (`NiStatus`): each under its field name, NACK counts as a map from
        /// [`NackReason::label`] to the count of the reasons that happened.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct NiStats {
            $( $(#[doc = $doc])* #[serde(with = "tally")] pub $field: $ty, )*
        }

        /// Every exported [`NiStats`] field and the family it feeds.
        pub const NI_COUNTERS: &[NiCounter] = &[
            $($(NiCounter {
                field: stringify!($field),
                family: Family::$family,
                labels: &[$($value),*],
                get: |s| NiCount::from(&s.$field),
            },)?)*
        ];
    };
}

ni_stats! {
    messages_sent: u64 => NiMessages["tx"];
    messages_received: u64 => NiMessages["rx"];
    acks_sent: u64 => NiAcks["tx"];
    /// Indexed by [`NackReason`] code.
    nacks_sent: [u64; REASONS] => NiNacks["tx"];
    acks_received: u64 => NiAcks["rx"];
    /// Indexed by [`NackReason`] code.
    nacks_received: [u64; REASONS] => NiNacks["rx"];
    retransmissions: u64 => NiRetransmissions[];
    timeouts: u64 => NiTimeouts[];
    pdid_violations: u64 => NiPdidViolations[];
    /// Commands stamped more than `ni::MAX_LEAD` ahead of their rank's clock.
    stamps_clamped: u64 => NiStampsClamped[];
    /// Posts behind the NI's promise, by what the program was taken for (see
    /// `ni::Program`): gone (silent: `Scripted`), running, waiting.
    late_posts_gone: u64 => NiLatePosts["gone"];
    late_posts_running: u64 => NiLatePosts["running"];
    late_posts_waiting: u64 => NiLatePosts["waiting"];
    rdma_blocks_sent: u64 => NiRdmaBlocks["tx"];
    rdma_blocks_received: u64 => NiRdmaBlocks["rx"];
    rdma_transfers_done: u64 => NiRdmaTransfers["ok"];
    rdma_transfers_failed: u64 => NiRdmaTransfers["failed"];
    allreduce_started: u64 => NiAllreduce["started"];
    allreduce_done: u64 => NiAllreduce["ok"];
    allreduce_failed: u64 => NiAllreduce["failed"];
    allreduce_cells_sent: u64 => NiAllreduceCells["tx"];
    allreduce_cells_received: u64 => NiAllreduceCells["rx"];
    /// Accelerator cells that came before their collective was posted and that it did not
    /// vouch for (not exported).
    allreduce_early_refused: u64;
    /// RDMA cells or answers for a block no longer awaited (shown by `exactl`, not
    /// exported).
    stale_cells: u64;
    /// RDMA blocks received again after they were complete (not exported).
    duplicates: u64;
}

/// How a counter field is written in the status report.
trait Tally: Sized {
    fn put<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
    fn take<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

impl Tally for u64 {
    fn put<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*self)
    }

    fn take<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u64::deserialize(d)
    }
}

impl Tally for [u64; REASONS] {
    fn put<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let by_label: BTreeMap<&str, u64> = NiCount::ByReason(self)
            .samples()
            .into_iter()
            .filter_map(|(label, n)| Some((label?, n)))
            .collect();
        by_label.serialize(s)
    }

    fn take<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let by_label = BTreeMap::<String, u64>::deserialize(d)?;
        let mut counts = [0; REASONS];
        for (label, n) in by_label {
            let slot = NackReason::all()
                .find(|r| r.label() == label)
                .and_then(|r| counts.get_mut(r as usize))
                .ok_or_else(|| serde::de::Error::custom(format!("unknown NACK reason {label}")))?;
            *slot = n;
        }
        Ok(counts)
    }
}

/// `#[serde(with)]` for every [`NiStats`] field, whichever its shape.
mod tally {
    use serde::{Deserializer, Serializer};

    use super::Tally;

    pub fn serialize<T: Tally, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        v.put(s)
    }

    pub fn deserialize<'de, T: Tally, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        T::take(d)
    }
}

impl NiCount<'_> {
    /// Each series: the `reason` label value, if counted by reason, and the count.
    /// Reasons that never happened are left out, so a family shows only real reasons.
    pub fn samples(self) -> Vec<(Option<&'static str>, u64)> {
        match self {
            NiCount::One(v) => vec![(None, v)],
            NiCount::ByReason(counts) => NackReason::all()
                .filter_map(|r| {
                    let n = counts.get(r as usize).copied().unwrap_or(0);
                    (n > 0).then_some((Some(r.label()), n))
                })
                .collect(),
        }
    }
}

impl NiStats {
    /// Every exported series of these counters, through [`NI_COUNTERS`].
    pub fn samples(&self) -> Vec<NiSample> {
        let mut out = Vec::new();
        for c in NI_COUNTERS {
            for (reason, value) in (c.get)(self).samples() {
                let mut labels = c.labels.to_vec();
                labels.extend(reason);
                out.push(NiSample {
                    family: c.family,
                    labels,
                    value,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_are_unique_and_prometheus_valid() {
        let mut seen = HashSet::new();
        for f in Family::ALL {
            let s = f.spec();
            assert!(seen.insert(s.name), "{} declared twice", s.name);
            assert!(s.name.starts_with("exanet_"), "{}", s.name);
            assert!(
                s.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{}",
                s.name
            );
            assert_eq!(s.labels.first(), Some(&"node"), "{}", s.name);
            assert_eq!(
                s.kind == MetricType::Counter,
                s.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                s.name
            );
            assert!(!s.help.is_empty(), "{}", s.name);
            assert_eq!(Family::from_name(s.name), Some(*f));
            assert_eq!(Family::ALL[f.index()], *f);
        }
        assert_eq!(Family::COUNT, seen.len());
    }

    #[test]
    fn ni_counters_fill_their_families_labels() {
        let mut fields = HashSet::new();
        for c in NI_COUNTERS {
            assert!(fields.insert(c.field), "{} exported twice", c.field);
            let spec = c.family.spec();
            assert_eq!(spec.kind, MetricType::Counter, "{}", c.field);
            let by_reason = matches!((c.get)(&NiStats::default()), NiCount::ByReason(_));
            let given = 1 + c.labels.len() + usize::from(by_reason);
            assert_eq!(given, spec.labels.len(), "{} for {}", c.field, spec.name);
            assert_eq!(spec.labels.last() == Some(&"reason"), by_reason);
        }
    }

    #[test]
    fn samples_follow_the_table() {
        let mut st = NiStats {
            messages_sent: 7,
            rdma_transfers_failed: 3,
            ..NiStats::default()
        };
        st.nacks_received[NackReason::PageFault as usize] = 2;
        let s = st.samples();
        let find = |family, labels: &[&str]| {
            s.iter()
                .find(|x| x.family == family && x.labels == labels)
                .map(|x| x.value)
        };
        assert_eq!(find(Family::NiMessages, &["tx"]), Some(7));
        assert_eq!(find(Family::NiMessages, &["rx"]), Some(0));
        assert_eq!(find(Family::NiRdmaTransfers, &["failed"]), Some(3));
        assert_eq!(find(Family::NiNacks, &["rx", "page_fault"]), Some(2));
        // A reason that never happened has no series.
        assert_eq!(find(Family::NiNacks, &["rx", "crc"]), None);
        assert!(!s
            .iter()
            .any(|x| x.family == Family::NiNacks && x.labels[0] == "tx"));
    }

    /// The help of the two fault families lists what the fault table gives them, so
    /// that a new kind cannot be left out of it.
    #[test]
    fn fault_families_help_lists_the_fault_tables_words() {
        use crate::fault::FaultKind;
        for (family, label, word) in [
            (
                Family::LinkFaultsInjected,
                "fault",
                FaultKind::counter as fn(FaultKind) -> Option<&'static str>,
            ),
            (Family::LinkFaultSetting, "setting", FaultKind::metric),
        ] {
            let words: Vec<&str> = FaultKind::ALL.iter().filter_map(|&k| word(k)).collect();
            let help = family.spec().help;
            assert!(
                help.ends_with(&format!("({label}: {})", words.join(", "))),
                "{help}"
            );
        }
    }
}
