//! What the rack's observability pages show, declared once: the Grafana dashboards
//! ([`crate::grafana`]) and Prometheus' console pages ([`crate::consoles`]) both render
//! from these definitions, so the two cannot show different quantities or compute one
//! quantity two ways.
//!
//! A [`View`] is one quantity: a title, a unit, how it is displayed, the scope it
//! describes and its PromQL. Expressions are templates with placeholders that each
//! renderer binds ([`Binding`], [`expand`]):
//!
//! | placeholder | means | Grafana | consoles |
//! |---|---|---|---|
//! | `$SEL` | label matchers of what is shown | `node=~"$node"` (and `port=~"$port"` for links) | `node="M1QAF2"` (and `peer="M1QAF1"`) |
//! | `$NODE` | matchers of the node that measures it (links: the sending or receiving end) | `node=~"$node"` | `node="M1QAF2"` |
//! | `$BY(l, ...)` | ` by (<scope labels>, l, ...)`, nothing when there are no labels | scope labels of the panel's series | the same |
//! | `$W` | window of rates and increases | `$__rate_interval` | the page's `w` parameter |
//! | `$RANGE` | window of totals "over the range" | `$__range` | the page's `range` parameter |
//! | `$RATE` | nominal bit rate of the link(s), for utilizations | per link, from its `kind` label | the link's rate, known from the topology |
//!
//! Scope labels: a rack-wide view has none, a node's `node`, a link direction's `node`
//! and `peer` (Grafana adds `port`, which its legends show). Link directions are named
//! from the sender: direction `A -> B` is what `A` sends to `B`. Some link quantities are
//! measured at the sender (bytes sent, stalls, bytes in flight), some at the receiver
//! (its input queue, cells refused for bad CRCs); [`Side`] says which, and a renderer that
//! shows direction `A -> B` selects `node="A",peer="B"` or `node="B",peer="A"` accordingly.

use exanet_proto::topology::LinkKind;

/// Which end of a link direction measures a quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The node that sends on the direction (`node` is the sender, `peer` the receiver).
    Sender,
    /// The node that receives from it (`node` is the receiver, `peer` the sender).
    Receiver,
}

/// What a view describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The rack as a whole (or the nodes a dashboard has selected).
    Rack,
    /// One node: its switch and its NI.
    Node,
    /// One direction of one link.
    Link(Side),
}

impl Scope {
    /// The labels that tell one series of the scope from another.
    pub fn labels(self) -> &'static [&'static str] {
        match self {
            Scope::Rack => &[],
            Scope::Node => &["node"],
            Scope::Link(_) => &["node", "peer"],
        }
    }
}

/// How a view is displayed: Grafana's panel type; on a console page both are the current
/// value (consoles render server-side and have no graphs; each value links to
/// Prometheus' own graph of its expression).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Display {
    /// One current number per series.
    Stat,
    /// A time series.
    Graph,
}

/// The unit of a view's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Count,
    PerSecond,
    BitsPerSecond,
    Bytes,
    Seconds,
    /// A fraction, shown as a percentage.
    Ratio,
}

impl Unit {
    /// Grafana's name of the unit.
    pub fn grafana(self) -> &'static str {
        match self {
            Unit::Count => "short",
            Unit::PerSecond => "ops",
            Unit::BitsPerSecond => "bps",
            Unit::Bytes => "bytes",
            Unit::Seconds => "s",
            Unit::Ratio => "percentunit",
        }
    }

    /// A short name, used to pick the console library's formatter (`exanet.fmt.<name>`).
    pub fn key(self) -> &'static str {
        match self {
            Unit::Count => "count",
            Unit::PerSecond => "ops",
            Unit::BitsPerSecond => "bps",
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
            Unit::Ratio => "ratio",
        }
    }

    pub const ALL: &'static [Unit] = &[
        Unit::Count,
        Unit::PerSecond,
        Unit::BitsPerSecond,
        Unit::Bytes,
        Unit::Seconds,
        Unit::Ratio,
    ];
}

/// One PromQL expression of a view and the legend of its series (Grafana's legend
/// format: `{{label}}` is the series' label value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub expr: &'static str,
    pub legend: &'static str,
}

/// One quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// Stable name: console pages mark each view's values with it (`data-view`).
    pub id: &'static str,
    pub title: &'static str,
    pub unit: Unit,
    pub scope: Scope,
    pub display: Display,
    pub queries: &'static [Query],
}

const fn q(expr: &'static str, legend: &'static str) -> Query {
    Query { expr, legend }
}

// The formulas two views share (a link's and the rack's busiest links), written once.
// `$by` is the inner grouping of the view that uses them.

/// Bits per second a link direction sends.
macro_rules! throughput {
    ($by:literal) => {
        concat!(
            "sum$BY(",
            $by,
            r#") (rate(exanet_link_bytes_total{$SEL,direction="tx"}[$W])) * 8"#
        )
    };
}

/// Modeled utilization: the modeled time the output spent sending over the increase of
/// its node's modeled clock (exanet-proto's metric catalog). A node whose clock did not
/// move (no cell left its switch in the window) gives no value rather than 0/0.
macro_rules! modeled_util {
    ($by:literal) => {
        concat!(
            "sum$BY(",
            $by,
            ") (increase(exanet_link_modeled_busy_seconds_total{$SEL}[$W])) / on(node) group_left() \
             (sum by (node) (increase(exanet_node_modeled_time_seconds{$NODE}[$W])) > 0)"
        )
    };
}

pub const LINKS_UP: View = View {
    id: "links_up",
    title: "Link ends up",
    unit: Unit::Count,
    scope: Scope::Rack,
    display: Display::Stat,
    queries: &[q("sum(exanet_link_up{$SEL})", "")],
};

pub const LINK_ENDS: View = View {
    id: "link_ends",
    title: "Link ends",
    unit: Unit::Count,
    scope: Scope::Rack,
    display: Display::Stat,
    queries: &[q("count(exanet_link_up{$SEL})", "")],
};

pub const SCRAPED: View = View {
    id: "scraped",
    title: "Daemons scraped",
    unit: Unit::Count,
    scope: Scope::Rack,
    display: Display::Stat,
    queries: &[q(r#"sum(up{job="exanet"})"#, "")],
};

pub const RACK_WORKLOADS: View = View {
    id: "rack_workloads",
    title: "Workloads attached",
    unit: Unit::Count,
    scope: Scope::Rack,
    display: Display::Stat,
    queries: &[q("sum(exanet_ni_attached_workloads{$SEL})", "")],
};

pub const RACK_PDID: View = View {
    id: "rack_pdid",
    title: "PDID violations (range)",
    unit: Unit::Count,
    scope: Scope::Rack,
    display: Display::Stat,
    queries: &[q(
        "sum(increase(exanet_ni_pdid_violations_total{$SEL}[$RANGE]))",
        "",
    )],
};

pub const RACK_RECONNECTS: View = View {
    id: "rack_reconnects",
    title: "Link reconnects (range)",
    unit: Unit::Count,
    scope: Scope::Rack,
    display: Display::Stat,
    queries: &[q(
        "sum(increase(exanet_link_sessions_total{$SEL}[$RANGE]))",
        "",
    )],
};

pub const BUSIEST_TRAFFIC: View = View {
    id: "busiest_traffic",
    title: "Link traffic, busiest 10 link ends (tx)",
    unit: Unit::BitsPerSecond,
    scope: Scope::Rack,
    display: Display::Graph,
    queries: &[q(
        concat!("topk(10, ", throughput!("node, port, peer"), ")"),
        "{{node}} {{port}} -> {{peer}}",
    )],
};

pub const BUSIEST_MODELED: View = View {
    id: "busiest_modeled",
    // Where the modeled hardware, not the emulator, is saturated (docs/modeled-time.md).
    title: "Modeled link utilization, busiest 10 link ends",
    unit: Unit::Ratio,
    scope: Scope::Rack,
    display: Display::Graph,
    queries: &[q(
        concat!("topk(10, ", modeled_util!("node, port, peer"), ")"),
        "{{node}} {{port}} -> {{peer}}",
    )],
};

/// Rack-wide views, in display order.
pub const RACK: &[&View] = &[
    &LINKS_UP,
    &LINK_ENDS,
    &SCRAPED,
    &RACK_WORKLOADS,
    &RACK_PDID,
    &RACK_RECONNECTS,
    &BUSIEST_TRAFFIC,
    &BUSIEST_MODELED,
];

pub const RETRANSMISSIONS: View = View {
    id: "retransmissions",
    title: "Retransmissions (messages and RDMA blocks sent again)",
    unit: Unit::PerSecond,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[q(
        "sum$BY() (rate(exanet_ni_retransmissions_total{$SEL}[$W]))",
        "",
    )],
};

pub const NACKS: View = View {
    id: "nacks",
    title: "NACKs by reason",
    unit: Unit::PerSecond,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[q(
        "sum$BY(reason, direction) (rate(exanet_ni_nacks_total{$SEL}[$W]))",
        "{{reason}} ({{direction}})",
    )],
};

pub const TIMEOUTS: View = View {
    id: "timeouts",
    title: "Timeouts (waits for an answer that expired)",
    unit: Unit::PerSecond,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[q("sum$BY() (rate(exanet_ni_timeouts_total{$SEL}[$W]))", "")],
};

pub const PDID_VIOLATIONS: View = View {
    id: "pdid_violations",
    title: "PDID violations (cells refused for their protection domain)",
    unit: Unit::Count,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[q(
        "sum$BY() (increase(exanet_ni_pdid_violations_total{$SEL}[$W]))",
        "",
    )],
};

pub const LATENCY: View = View {
    id: "latency",
    title: "Completion latency p50 / p99 by operation",
    unit: Unit::Seconds,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[
        q(
            "histogram_quantile(0.5, sum$BY(le, op) (rate(exanet_ni_completion_latency_seconds_bucket{$SEL}[$W])))",
            "p50 {{op}}",
        ),
        q(
            "histogram_quantile(0.99, sum$BY(le, op) (rate(exanet_ni_completion_latency_seconds_bucket{$SEL}[$W])))",
            "p99 {{op}}",
        ),
    ],
};

pub const RDMA_TRANSFERS: View = View {
    id: "rdma_transfers",
    title: "RDMA transfers ended, by result",
    unit: Unit::PerSecond,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[q(
        "sum$BY(result) (rate(exanet_ni_rdma_transfers_total{$SEL}[$W]))",
        "{{result}}",
    )],
};

pub const MESSAGES: View = View {
    id: "messages",
    title: "NI messages (packetizer)",
    unit: Unit::PerSecond,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[q(
        "sum$BY(direction) (rate(exanet_ni_messages_total{$SEL}[$W]))",
        "{{direction}}",
    )],
};

pub const WORKLOADS: View = View {
    id: "workloads",
    title: "Workloads attached to the NI",
    unit: Unit::Count,
    scope: Scope::Node,
    display: Display::Stat,
    queries: &[q("sum$BY() (exanet_ni_attached_workloads{$SEL})", "")],
};

pub const CELLS: View = View {
    id: "cells",
    title: "Cells injected, delivered, forwarded",
    unit: Unit::PerSecond,
    scope: Scope::Node,
    display: Display::Graph,
    queries: &[
        q(
            "sum$BY() (rate(exanet_node_cells_injected_total{$SEL}[$W]))",
            "injected",
        ),
        q(
            "sum$BY() (rate(exanet_node_cells_delivered_total{$SEL}[$W]))",
            "delivered",
        ),
        q(
            "sum$BY() (rate(exanet_node_cells_forwarded_total{$SEL}[$W]))",
            "forwarded",
        ),
    ],
};

/// One node's views, in display order. (Not errors by kind: their series appear only
/// once an error happened, and every view must have data on a rack that carried traffic,
/// which the container tests check of every dashboard expression.)
pub const NODE: &[&View] = &[
    &CELLS,
    &RETRANSMISSIONS,
    &NACKS,
    &TIMEOUTS,
    &PDID_VIOLATIONS,
    &LATENCY,
    &RDMA_TRANSFERS,
    &MESSAGES,
    &WORKLOADS,
];

pub const THROUGHPUT: View = View {
    id: "throughput",
    title: "Throughput",
    unit: Unit::BitsPerSecond,
    scope: Scope::Link(Side::Sender),
    display: Display::Graph,
    queries: &[q(throughput!(""), "")],
};

pub const MODELED_UTIL: View = View {
    id: "modeled_util",
    title: "Modeled utilization (modeled busy time over the node's modeled clock)",
    unit: Unit::Ratio,
    scope: Scope::Link(Side::Sender),
    display: Display::Graph,
    queries: &[q(modeled_util!(""), "")],
};

pub const WIRE_UTIL: View = View {
    id: "wire_util",
    // The emulator carries cells as fast as the host allows: above 1 it ran faster than
    // the hardware would have.
    title: "Wire utilization (tx bit rate over the link's nominal rate)",
    unit: Unit::Ratio,
    scope: Scope::Link(Side::Sender),
    display: Display::Graph,
    queries: &[q(concat!(throughput!(""), " / $RATE"), "")],
};

pub const STALL: View = View {
    id: "stall",
    title: "Flow-control stalls (fraction of time the output waited for credit)",
    unit: Unit::Ratio,
    scope: Scope::Link(Side::Sender),
    display: Display::Graph,
    queries: &[q(
        "sum$BY() (rate(exanet_link_stall_seconds_total{$SEL}[$W]))",
        "",
    )],
};

pub const QUEUE_CELLS: View = View {
    id: "queue_cells",
    title: "Cells queued at the receiving switch's input",
    unit: Unit::Count,
    scope: Scope::Link(Side::Receiver),
    display: Display::Graph,
    queries: &[q("sum$BY() (exanet_link_queue_cells{$SEL})", "")],
};

pub const QUEUE_BYTES: View = View {
    id: "queue_bytes",
    title: "Bytes queued at the receiving switch's input",
    unit: Unit::Bytes,
    scope: Scope::Link(Side::Receiver),
    display: Display::Graph,
    queries: &[q("sum$BY() (exanet_link_queue_bytes{$SEL})", "")],
};

pub const IN_FLIGHT: View = View {
    id: "in_flight",
    title: "Bytes in flight (sent, credit not back)",
    unit: Unit::Bytes,
    scope: Scope::Link(Side::Sender),
    display: Display::Graph,
    queries: &[q("sum$BY() (exanet_link_in_flight_bytes{$SEL})", "")],
};

pub const FAULTS_INJECTED: View = View {
    id: "faults_injected",
    // What the operator broke on purpose (exactl link set, partition, chaos).
    title: "Faults injected (cells dropped, corrupted)",
    unit: Unit::PerSecond,
    scope: Scope::Link(Side::Sender),
    display: Display::Graph,
    queries: &[q(
        "sum$BY(fault) (rate(exanet_link_faults_injected_total{$SEL}[$W]))",
        "{{fault}}",
    )],
};

pub const CRC_REFUSED: View = View {
    id: "crc_refused",
    title: "Cells refused for bad CRCs at the receiving input",
    unit: Unit::PerSecond,
    scope: Scope::Link(Side::Receiver),
    display: Display::Graph,
    queries: &[q(
        "sum$BY() (rate(exanet_link_rx_corrupt_cells_total{$SEL}[$W]))",
        "",
    )],
};

pub const LINK_UP: View = View {
    id: "link_up",
    title: "Link up",
    unit: Unit::Count,
    scope: Scope::Link(Side::Sender),
    display: Display::Stat,
    queries: &[q("min$BY() (exanet_link_up{$SEL})", "")],
};

pub const ADMIN_DOWN: View = View {
    id: "admin_down",
    title: "Cut by the operator",
    unit: Unit::Count,
    scope: Scope::Link(Side::Sender),
    display: Display::Stat,
    queries: &[q("max$BY() (exanet_link_admin_down{$SEL})", "")],
};

pub const FAULT_SETTINGS: View = View {
    id: "fault_settings",
    title: "Fault settings on what the sender sends",
    unit: Unit::Count,
    scope: Scope::Link(Side::Sender),
    display: Display::Stat,
    queries: &[q(
        "max$BY(setting) (exanet_link_fault_setting{$SEL})",
        "{{setting}}",
    )],
};

pub const SESSIONS: View = View {
    id: "sessions",
    title: "Link sessions (1 + reconnects)",
    unit: Unit::Count,
    scope: Scope::Link(Side::Sender),
    display: Display::Stat,
    queries: &[q("max$BY() (exanet_link_sessions_total{$SEL})", "")],
};

/// One link direction's views, in display order.
pub const LINK: &[&View] = &[
    &THROUGHPUT,
    &MODELED_UTIL,
    &WIRE_UTIL,
    &STALL,
    &QUEUE_CELLS,
    &QUEUE_BYTES,
    &IN_FLIGHT,
    &FAULTS_INJECTED,
    &CRC_REFUSED,
    &LINK_UP,
    &ADMIN_DOWN,
    &FAULT_SETTINGS,
    &SESSIONS,
];

/// Every view.
pub fn all() -> impl Iterator<Item = &'static View> {
    RACK.iter().chain(NODE).chain(LINK).copied()
}

/// What a renderer gives the placeholders of an expression (see the module doc).
#[derive(Clone, Debug)]
pub struct Binding<'a> {
    pub sel: &'a str,
    pub node: &'a str,
    /// Labels every `$BY(...)` groups by before the view's own.
    pub by: &'a [&'a str],
    pub window: &'a str,
    pub range: &'a str,
    pub rate: &'a str,
}

/// `expr` with its placeholders bound. Text that is no placeholder, `$` included (Grafana's
/// own variables in a binding), is kept as it is.
pub fn expand(expr: &str, b: &Binding) -> String {
    let mut out = String::with_capacity(expr.len() + 64);
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$BY(") {
            if let Some(close) = after.find(')') {
                let mut labels: Vec<&str> = b.by.to_vec();
                for l in after[..close].split(',').map(str::trim) {
                    if !l.is_empty() && !labels.contains(&l) {
                        labels.push(l);
                    }
                }
                if !labels.is_empty() {
                    out.push_str(" by (");
                    out.push_str(&labels.join(", "));
                    out.push(')');
                }
                rest = &after[close + 1..];
                continue;
            }
        }
        // Longest names first: `$RANGE` and `$RATE` share a prefix.
        let tokens: [(&str, &str); 5] = [
            ("$RANGE", b.range),
            ("$RATE", b.rate),
            ("$NODE", b.node),
            ("$SEL", b.sel),
            ("$W", b.window),
        ];
        match tokens.iter().find(|(t, _)| rest.starts_with(t)) {
            Some((t, v)) => {
                out.push_str(v);
                rest = &rest[t.len()..];
            }
            None => {
                out.push('$');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A PromQL vector of the nominal bit rate of every link end `sel` selects, from its
/// `kind` label (the rates of `exanet_proto::topology`), labelled `node` and `peer`: what
/// `$RATE` is where one expression covers links of several kinds.
pub fn nominal_rate_by_kind(sel: &str) -> String {
    let kinds = [
        LinkKind::IntraQfdb,
        LinkKind::TorusX,
        LinkKind::TorusY,
        LinkKind::TorusZ,
    ];
    let parts: Vec<String> = kinds
        .iter()
        .map(|k| {
            format!(
                r#"max by (node, peer) (exanet_link_up{{{sel},kind="{}"}}) * 0 + {}e9"#,
                k.label(),
                k.gbps()
            )
        })
        .collect();
    format!("on(node, peer) ({})", parts.join(" or "))
}

/// The metric names an expression reads (words starting `exanet_`, and `up`).
pub fn metric_names(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("exanet_"))
        .collect()
}

/// Whether `name` is a series of a family of exanet-proto's catalog (a histogram's by its
/// `_bucket`, `_sum` and `_count` suffixes).
pub fn in_catalog(name: &str) -> bool {
    use exanet_proto::metric::{Family, MetricType};
    Family::from_name(name).is_some()
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .and_then(Family::from_name)
                .is_some_and(|f| f.spec().kind == MetricType::Histogram)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn console_binding() -> Binding<'static> {
        Binding {
            sel: r#"node="M1QAF2",peer="M1QAF1""#,
            node: r#"node="M1QAF2""#,
            by: &["node", "peer"],
            window: "1m",
            range: "1h",
            rate: "16e9",
        }
    }

    #[test]
    fn placeholders_expand_and_nothing_else_changes() {
        let b = console_binding();
        assert_eq!(
            expand(MODELED_UTIL.queries[0].expr, &b),
            r#"sum by (node, peer) (increase(exanet_link_modeled_busy_seconds_total{node="M1QAF2",peer="M1QAF1"}[1m])) / on(node) group_left() (sum by (node) (increase(exanet_node_modeled_time_seconds{node="M1QAF2"}[1m])) > 0)"#
        );
        assert_eq!(
            expand(WIRE_UTIL.queries[0].expr, &b),
            r#"sum by (node, peer) (rate(exanet_link_bytes_total{node="M1QAF2",peer="M1QAF1",direction="tx"}[1m])) * 8 / 16e9"#
        );
        // Inner labels join the scope's once; no labels at all, no `by`.
        assert_eq!(
            expand("sum$BY(peer, le) (x{$SEL}[$RANGE])", &b),
            r#"sum by (node, peer, le) (x{node="M1QAF2",peer="M1QAF1"}[1h])"#
        );
        let rack = Binding { by: &[], ..b };
        assert_eq!(expand("sum$BY() (x)", &rack), "sum (x)");
        // Grafana's variables pass through.
        let g = Binding {
            sel: r#"node=~"$node""#,
            window: "$__rate_interval",
            ..rack
        };
        assert_eq!(
            expand("rate(x{$SEL}[$W]) $other", &g),
            r#"rate(x{node=~"$node"}[$__rate_interval]) $other"#
        );
    }

    #[test]
    fn every_view_binds_completely_and_reads_catalog_families() {
        let b = console_binding();
        let mut ids = std::collections::HashSet::new();
        let mut titles = std::collections::HashSet::new();
        for v in all() {
            assert!(ids.insert(v.id), "view id {} used twice", v.id);
            // Renderings name views by title (Grafana's panels), so titles are unique too.
            assert!(titles.insert(v.title), "title {:?} used twice", v.title);
            assert!(!v.queries.is_empty(), "{}", v.id);
            for q in v.queries {
                let e = expand(q.expr, &b);
                assert!(!e.contains('$'), "{}: {e}", v.id);
                for name in metric_names(&e) {
                    assert!(in_catalog(name), "{}: {name} is not in the catalog", v.id);
                }
                // Every link and node view selects what it shows.
                if v.scope != Scope::Rack {
                    assert!(q.expr.contains("{$SEL"), "{}: {}", v.id, q.expr);
                }
            }
        }
        assert!(!in_catalog("exanet_link_up_bucket"));
        assert!(in_catalog("exanet_ni_completion_latency_seconds_bucket"));
    }

    #[test]
    fn nominal_rates_come_from_the_topology() {
        let r = nominal_rate_by_kind(r#"node=~"$node""#);
        assert!(r.starts_with("on(node, peer) ("), "{r}");
        assert!(r.contains(r#"kind="qfdb"}) * 0 + 16e9"#), "{r}");
        assert!(r.contains(r#"kind="torus_z"}) * 0 + 10e9"#), "{r}");
        assert_eq!(r.matches(" or ").count(), 3);
    }
}
