//! `exactl top`: a live view of the rack: the busiest link directions, stalls, injected
//! faults, and the nodes whose NIs retransmit or NACK the most.
//!
//! The daemons report cumulative counters, so every figure on screen is a rate between
//! two snapshots. Computing and rendering are pure functions over the two snapshots
//! ([`compute`], [`render`], [`to_json`]); [`run`] only polls, times and prints.
//!
//! Counters can go backwards: a daemon that was restarted starts again from zero. A
//! restart (new pid, or an uptime that went back) counts everything the fresh daemon
//! reports as new, and any single counter that still went back is read as "reset during
//! the interval" (as Prometheus' `rate()` does), so a rate is never negative and never
//! the wrap-around of an unsigned subtraction.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use exanet_control::control::{LinkState, LinkStatus, NiStatus, NodeStatus};
use exanet_control::rack::Rack;
use exanet_proto::ni::{NackReason, REASONS};
use exanet_proto::{NodeId, Shape};
use serde_json::{json, Value};

use crate::error::{CliError, Result};
use crate::fabric::{self, Answer, Health};
use crate::faults::describe;
use crate::table::{Column, Table};

/// Shortest refresh interval: faster, the status queries themselves become the load.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Longest refresh interval accepted (beyond it `exactl status` twice is the better tool).
const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// `exactl top` options.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Time between refreshes, e.g. 500ms, 2s (at least 100ms)
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after N refreshes [default: run until Ctrl-C]
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub count: Option<u64>,
    /// Rows per table
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = parse_limit)]
    pub limit: usize,
    /// Print one JSON object per refresh, one per line
    #[arg(long)]
    pub json: bool,
}

fn parse_interval(s: &str) -> std::result::Result<Duration, String> {
    let d = Duration::from_nanos(crate::units::parse_duration(s)?);
    if d < MIN_INTERVAL {
        return Err(format!(
            "{s:?} is shorter than 100ms (the status queries would become the load)"
        ));
    }
    if d > MAX_INTERVAL {
        return Err(format!("{s:?} is longer than an hour"));
    }
    Ok(d)
}

fn parse_count(s: &str) -> std::result::Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a number of refreshes (1 or more)")),
    }
}

fn parse_limit(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a row count from 1 to 100000")),
    }
}

/// Rates of one link direction between two snapshots, per second.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkRates {
    pub tx_bytes: f64,
    pub tx_cells: f64,
    /// Bits sent over the link's nominal capacity (0.25 = a quarter of it).
    pub utilization: f64,
    /// Seconds an output had a cell but no credit, per second.
    pub stall: f64,
    /// Cells each fault kind with a counter acted on, per second, by its counter word
    /// (`drop`, `corrupt`, ...: the fault table's).
    pub faulted: BTreeMap<&'static str, f64>,
}

impl LinkRates {
    /// Cells the faults acted on, all kinds together, per second.
    pub fn faulted_total(&self) -> f64 {
        // Folded from +0: a sum of no f64 is -0, which would print as "-0".
        self.faulted.values().fold(0.0, |a, b| a + b)
    }
}

/// One direction of a link, as its sender reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkRow {
    pub from: String,
    pub to: String,
    pub kind: String,
    pub gbps: u32,
    /// `up`, `down`, or `cut` (set down by an operator).
    pub state: &'static str,
    /// The faults set on it in `exactl link set` words; `None` when clear.
    pub faults: Option<String>,
    pub queue_bytes: u64,
    /// `None` when the earlier snapshot has no report of this direction.
    pub rates: Option<LinkRates>,
}

/// NI rates of one node, per second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NiRates {
    pub retransmissions: f64,
    pub timeouts: f64,
    pub nacks_sent: BTreeMap<String, f64>,
    pub nacks_received: BTreeMap<String, f64>,
    pub pdid_violations: f64,
    /// Since the daemon started: one violation is worth seeing long after it happened.
    pub pdid_violations_total: u64,
}

impl NiRates {
    pub fn nacks_sent_total(&self) -> f64 {
        shown(self.nacks_sent.values().sum())
    }

    pub fn nacks_received_total(&self) -> f64 {
        shown(self.nacks_received.values().sum())
    }

    /// What the node table is sorted by.
    fn trouble(&self) -> f64 {
        self.retransmissions
            + self.timeouts
            + self.nacks_sent_total()
            + self.nacks_received_total()
            + self.pdid_violations
    }
}

/// What one node said in the later snapshot.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeState {
    /// Answered both times with the same daemon.
    Answering,
    /// Answered now, with a different daemon (or an uptime that went back) than before.
    Restarted,
    /// Answered now but not before: no rates yet.
    New,
    /// Did not answer now; why.
    Silent(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    pub node: String,
    pub state: NodeState,
    pub ni: Option<NiRates>,
}

/// One refresh: everything the screen shows, already computed.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// Seconds between the two snapshots.
    pub seconds: f64,
    pub nodes: usize,
    pub nodes_answering: usize,
    pub links: usize,
    pub links_up: usize,
    /// Every direction reported in the later snapshot, busiest first.
    pub link_rows: Vec<LinkRow>,
    /// Every node in id order.
    pub node_rows: Vec<NodeRow>,
}

impl Frame {
    fn total(&self, f: impl Fn(&LinkRates) -> f64) -> f64 {
        self.link_rows
            .iter()
            .filter_map(|r| r.rates.as_ref())
            .map(f)
            .fold(0.0, |a, b| a + b)
    }

    /// Cells the faults acted on per second over every link, by counter word.
    fn faulted_totals(&self) -> BTreeMap<&'static str, f64> {
        let mut out = BTreeMap::new();
        for r in self.link_rows.iter().filter_map(|r| r.rates.as_ref()) {
            for (word, v) in &r.faulted {
                *out.entry(*word).or_insert(0.0) += v;
            }
        }
        out
    }

    fn ni_total(&self, f: impl Fn(&NiRates) -> f64) -> f64 {
        self.node_rows
            .iter()
            .filter_map(|r| r.ni.as_ref())
            .map(f)
            .fold(0.0, |a, b| a + b)
    }
}

/// How far a counter moved: `cur - prev`, or `cur` when it went back (reset in between).
fn delta(prev: u64, cur: u64) -> u64 {
    cur.checked_sub(prev).unwrap_or(cur)
}

fn delta_f(prev: f64, cur: f64) -> f64 {
    let d = if cur >= prev { cur - prev } else { cur };
    if d.is_finite() && d > 0.0 {
        d
    } else {
        0.0
    }
}

/// A daemon other than the one of the earlier snapshot: its counters started from zero.
fn restarted(prev: &NodeStatus, cur: &NodeStatus) -> bool {
    prev.pid != cur.pid || cur.uptime_seconds < prev.uptime_seconds
}

fn link_of<'a>(st: &'a NodeStatus, peer: &str) -> Option<&'a LinkStatus> {
    st.links.iter().find(|l| l.peer.eq_ignore_ascii_case(peer))
}

fn link_rates(prev: Option<&LinkStatus>, cur: &LinkStatus, dt: f64) -> LinkRates {
    // A restarted daemon's link is compared with an all-zero one.
    let zero = LinkStatus {
        tx_cells: 0,
        tx_bytes: 0,
        stall_seconds: 0.0,
        fault_stats: Default::default(),
        ..cur.clone()
    };
    let p = prev.unwrap_or(&zero);
    let per_s = |d: u64| d as f64 / dt;
    let tx_bytes = per_s(delta(p.tx_bytes, cur.tx_bytes));
    let capacity = f64::from(cur.gbps) * 1e9;
    LinkRates {
        tx_bytes,
        tx_cells: per_s(delta(p.tx_cells, cur.tx_cells)),
        utilization: if capacity > 0.0 {
            tx_bytes * 8.0 / capacity
        } else {
            0.0
        },
        stall: delta_f(p.stall_seconds, cur.stall_seconds) / dt,
        faulted: cur
            .fault_stats
            .counted()
            .map(|(k, word, n)| (word, per_s(delta(p.fault_stats.cells(k), n))))
            .collect(),
    }
}

/// Rates of NACKs by reason label, leaving out the reasons that did not move.
fn by_reason(prev: &[u64; REASONS], cur: &[u64; REASONS], dt: f64) -> BTreeMap<String, f64> {
    NackReason::all()
        .map(|r| {
            let i = r as usize;
            (r.label().to_string(), delta(prev[i], cur[i]) as f64 / dt)
        })
        .filter(|(_, r)| *r > 0.0)
        .collect()
}

fn ni_rates(prev: &NiStatus, cur: &NiStatus, dt: f64) -> NiRates {
    let (prev, cur) = (&prev.counters, &cur.counters);
    let per_s = |p: u64, c: u64| delta(p, c) as f64 / dt;
    NiRates {
        retransmissions: per_s(prev.retransmissions, cur.retransmissions),
        timeouts: per_s(prev.timeouts, cur.timeouts),
        nacks_sent: by_reason(&prev.nacks_sent, &cur.nacks_sent, dt),
        nacks_received: by_reason(&prev.nacks_received, &cur.nacks_received, dt),
        pdid_violations: per_s(prev.pdid_violations, cur.pdid_violations),
        pdid_violations_total: cur.pdid_violations,
    }
}

fn link_state(l: &LinkStatus) -> &'static str {
    match (l.admin_down, l.state) {
        (true, _) => "cut",
        (false, LinkState::Up) => "up",
        (false, LinkState::Down) => "down",
    }
}

/// The frame between snapshots `prev` and `cur` (both indexed by node id) taken `seconds`
/// apart. A node missing from `prev` (or from `cur`) has no rates.
pub fn compute(shape: &Shape, prev: &[Answer], cur: &[Answer], seconds: f64) -> Frame {
    // Guards the divisions: the caller measures at least MIN_INTERVAL, but a pure function
    // takes what it is given.
    let dt = if seconds.is_finite() && seconds > 1e-3 {
        seconds
    } else {
        1e-3
    };
    let mut link_rows = Vec::new();
    let mut node_rows = Vec::new();
    for (i, now) in cur.iter().enumerate() {
        let name = shape.display(NodeId(i as u32));
        let before = prev.get(i).and_then(|a| a.as_ref().ok());
        let st = match now {
            Ok(st) => st,
            Err(e) => {
                node_rows.push(NodeRow {
                    node: name,
                    state: NodeState::Silent(e.clone()),
                    ni: None,
                });
                continue;
            }
        };
        let (state, base) = match before {
            None => (NodeState::New, None),
            Some(p) if restarted(p, st) => (NodeState::Restarted, None),
            Some(p) => (NodeState::Answering, Some(p)),
        };
        let ni = match (&state, base) {
            (NodeState::New, _) => None,
            (_, Some(p)) => Some(ni_rates(&p.ni, &st.ni, dt)),
            (_, None) => Some(ni_rates(&NiStatus::default(), &st.ni, dt)),
        };
        for l in &st.links {
            let rates = match (&state, base) {
                (NodeState::New, _) => None,
                // A link this daemon did not report before is new; its counters are too.
                (_, Some(p)) => Some(link_rates(link_of(p, &l.peer), l, dt)),
                (_, None) => Some(link_rates(None, l, dt)),
            };
            link_rows.push(LinkRow {
                from: st.node.clone(),
                to: l.peer.clone(),
                kind: l.kind.clone(),
                gbps: l.gbps,
                state: link_state(l),
                faults: l.faults.filter(|f| !f.is_clear()).map(|f| describe(&f)),
                queue_bytes: l.queue_bytes,
                rates,
            });
        }
        node_rows.push(NodeRow {
            node: name,
            state,
            ni,
        });
    }
    // Busiest first; directions without rates last; names break ties so that the order
    // does not flicker between refreshes.
    link_rows.sort_by(|a, b| {
        let ua = a.rates.as_ref().map_or(-1.0, |r| r.utilization);
        let ub = b.rates.as_ref().map_or(-1.0, |r| r.utilization);
        ub.total_cmp(&ua)
            .then_with(|| a.from.cmp(&b.from))
            .then_with(|| a.to.cmp(&b.to))
    });
    let views = fabric::link_views(shape, cur);
    Frame {
        seconds: dt,
        nodes: cur.len(),
        nodes_answering: cur.iter().filter(|a| a.is_ok()).count(),
        links: views.len(),
        links_up: views.iter().filter(|v| v.health() == Health::Up).count(),
        link_rows,
        node_rows,
    }
}

/// `v`, with negative zero (what summing nothing gives) and the rounding noise of float
/// deltas below zero made 0, so a quiet rack never shows `-0`.
fn shown(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 {
        v
    } else {
        0.0
    }
}

/// `1.5 MB/s`, `980 B/s`: decimal units like the rates of `exactl link set`.
fn bytes_per_s(v: f64) -> String {
    let v = shown(v);
    let (v, unit) = if v >= 1e9 {
        (v / 1e9, "GB/s")
    } else if v >= 1e6 {
        (v / 1e6, "MB/s")
    } else if v >= 1e3 {
        (v / 1e3, "kB/s")
    } else {
        (v, "B/s")
    };
    if unit == "B/s" {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

/// A per-second count: `0`, `0.5`, `12`, `1.2k`.
fn count_per_s(v: f64) -> String {
    if v <= 0.0 {
        "0".into()
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn or_dash<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// `crc 3.0, queue_full 1.0` (largest first).
fn reasons(m: &BTreeMap<String, f64>) -> String {
    let mut v: Vec<(&String, &f64)> = m.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1).then_with(|| a.0.cmp(b.0)));
    v.iter()
        .map(|(k, r)| format!("{k} {}", count_per_s(**r)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The screen: a header line, the busiest `limit` link directions, then up to `limit`
/// nodes with retransmissions, timeouts, NACKs or PDID violations, and the silent nodes.
pub fn render(rack: &str, shape: &Shape, f: &Frame, limit: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rack {rack:?} ({shape}), rates over {:.2}s: {}/{} nodes answering, {}/{} links up, \
         tx {}, stalls {:.3} s/s, retx {}/s, nacks {}/s, faulted {}/s",
        f.seconds,
        f.nodes_answering,
        f.nodes,
        f.links_up,
        f.links,
        bytes_per_s(f.total(|r| r.tx_bytes)),
        shown(f.total(|r| r.stall)),
        count_per_s(f.ni_total(|n| n.retransmissions)),
        count_per_s(f.ni_total(|n| n.nacks_sent_total())),
        count_per_s(f.total(|r| r.faulted_total())),
    );
    out.push('\n');
    let links = Table::new(vec![
        Column::left("LINK").min(16),
        Column::left("KIND").min(7),
        Column::left("STATE").min(4),
        Column::right("TX").min(11),
        Column::right("UTIL").min(6),
        Column::right("STALL").min(8),
        Column::right("FAULTED/s").min(9),
        Column::right("QUEUE").min(9),
        Column::left("FAULTS").gap(2),
    ])
    .rows(f.link_rows.iter().take(limit).map(|r| {
        let rt = r.rates.as_ref();
        vec![
            format!("{}->{}", r.from, r.to),
            r.kind.to_string(),
            r.state.to_string(),
            or_dash(rt, |x| bytes_per_s(x.tx_bytes)),
            or_dash(rt, |x| format!("{:.1}%", shown(x.utilization * 100.0))),
            or_dash(rt, |x| format!("{:.3}", shown(x.stall))),
            or_dash(rt, |x| count_per_s(x.faulted_total())),
            r.queue_bytes.to_string(),
            r.faults.as_deref().unwrap_or("-").to_string(),
        ]
    }));
    out.push_str(&links.render());
    if f.link_rows.len() > limit {
        let _ = writeln!(out, "({} more link directions)", f.link_rows.len() - limit);
    }
    if f.link_rows.is_empty() {
        out.push_str("no link reported (no node answers)\n");
    }
    out.push('\n');
    let mut troubled: Vec<(&NodeRow, &NiRates)> = f
        .node_rows
        .iter()
        .filter_map(|n| n.ni.as_ref().map(|ni| (n, ni)))
        .filter(|(_, ni)| ni.trouble() > 0.0 || ni.pdid_violations_total > 0)
        .collect();
    troubled.sort_by(|a, b| {
        b.1.trouble()
            .total_cmp(&a.1.trouble())
            .then_with(|| a.0.node.cmp(&b.0.node))
    });
    if troubled.is_empty() {
        out.push_str("no node retransmits, times out or NACKs\n");
    } else {
        let nodes = Table::new(vec![
            Column::left("NODE").min(8),
            Column::right("RETX/s").min(7),
            Column::right("TMO/s").min(7),
            Column::right("NACK_TX/s").min(9),
            Column::right("NACK_RX/s").min(9),
            Column::right("PDID").min(7),
            Column::left("NACK REASONS (sent; received)").gap(2),
        ])
        .rows(troubled.iter().take(limit).map(|(n, ni)| {
            vec![
                n.node.clone(),
                count_per_s(ni.retransmissions),
                count_per_s(ni.timeouts),
                count_per_s(ni.nacks_sent_total()),
                count_per_s(ni.nacks_received_total()),
                ni.pdid_violations_total.to_string(),
                format!(
                    "{}; {}{}",
                    or_empty(reasons(&ni.nacks_sent)),
                    or_empty(reasons(&ni.nacks_received)),
                    if n.state == NodeState::Restarted {
                        " (restarted)"
                    } else {
                        ""
                    }
                ),
            ]
        }));
        out.push_str(&nodes.render());
        if troubled.len() > limit {
            let _ = writeln!(out, "({} more nodes)", troubled.len() - limit);
        }
    }
    for n in &f.node_rows {
        match &n.state {
            NodeState::Silent(e) => {
                let _ = writeln!(out, "{}: not answering: {e}", n.node);
            }
            NodeState::Restarted => {
                let _ = writeln!(out, "{}: restarted since the last refresh", n.node);
            }
            NodeState::New => {
                let _ = writeln!(
                    out,
                    "{}: answering again; rates from the next refresh",
                    n.node
                );
            }
            NodeState::Answering => {}
        }
    }
    out
}

fn or_empty(s: String) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

/// One refresh as JSON: `{"seconds", "nodes", "nodes_answering", "links", "links_up",
/// "totals", "links": [...], "nodes": [...]}`; rates are per second, `null` when unknown.
pub fn to_json(f: &Frame, limit: usize) -> Value {
    let links: Vec<Value> = f
        .link_rows
        .iter()
        .take(limit)
        .map(|r| {
            let rt = r.rates.as_ref();
            json!({
                "from": r.from, "to": r.to, "kind": r.kind, "gbps": r.gbps,
                "state": r.state, "faults": r.faults, "queue_bytes": r.queue_bytes,
                "tx_bytes_per_s": rt.map(|x| x.tx_bytes),
                "tx_cells_per_s": rt.map(|x| x.tx_cells),
                "utilization": rt.map(|x| x.utilization),
                "stall_per_s": rt.map(|x| x.stall),
                "faulted_per_s": rt.map(|x| &x.faulted),
            })
        })
        .collect();
    let nodes: Vec<Value> = f
        .node_rows
        .iter()
        .map(|n| {
            let (state, error) = match &n.state {
                NodeState::Answering => ("answering", None),
                NodeState::Restarted => ("restarted", None),
                NodeState::New => ("new", None),
                NodeState::Silent(e) => ("silent", Some(e.clone())),
            };
            let ni = n.ni.as_ref();
            json!({
                "node": n.node, "state": state, "error": error,
                "retransmissions_per_s": ni.map(|x| x.retransmissions),
                "timeouts_per_s": ni.map(|x| x.timeouts),
                "nacks_sent_per_s": ni.map(|x| &x.nacks_sent),
                "nacks_received_per_s": ni.map(|x| &x.nacks_received),
                "pdid_violations_per_s": ni.map(|x| x.pdid_violations),
                "pdid_violations": ni.map(|x| x.pdid_violations_total),
            })
        })
        .collect();
    json!({
        "seconds": f.seconds,
        "nodes": f.nodes,
        "nodes_answering": f.nodes_answering,
        "links": f.links,
        "links_up": f.links_up,
        "totals": {
            "tx_bytes_per_s": f.total(|r| r.tx_bytes),
            "stall_per_s": f.total(|r| r.stall),
            "faulted_per_s": f.total(|r| r.faulted_total()),
            "retransmissions_per_s": f.ni_total(|n| n.retransmissions),
            "timeouts_per_s": f.ni_total(|n| n.timeouts),
            "nacks_sent_per_s": f.ni_total(|n| n.nacks_sent_total()),
        },
        "faulted_by_kind_per_s": f.faulted_totals(),
        "link_directions": links,
        "node_ni": nodes,
    })
}

/// Clear the screen and put the cursor home, so each frame replaces the last.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// `exactl top`: polls every `interval` and prints a frame, `count` times or until killed.
pub fn run(dir: &Path, args: &TopArgs) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    if crate::live::RackLiveness::of(&rack).all_gone() {
        return Err(crate::live::not_running(&rack));
    }
    let client = crate::control::client(&rack)?;
    // A silent node costs this much per refresh; never more than the interval itself
    // (within reason), so a paused daemon does not freeze the view.
    let timeout = args
        .interval
        .clamp(Duration::from_millis(300), Duration::from_secs(2));
    let tty = std::io::stdout().is_terminal() && !args.json;
    let mut prev = fabric::query_all(&client, timeout);
    let mut taken = Instant::now();
    let mut shown = 0u64;
    let mut last_answering = prev.iter().filter(|a| a.is_ok()).count();
    while args.count.is_none_or(|n| shown < n) {
        // Polls on a fixed schedule from the earlier snapshot, so slow answers shorten the
        // wait rather than stretch the interval.
        std::thread::sleep(args.interval.saturating_sub(taken.elapsed()));
        let cur = fabric::query_all(&client, timeout);
        let now = Instant::now();
        let frame = compute(&shape, &prev, &cur, now.duration_since(taken).as_secs_f64());
        let text = if args.json {
            let mut s = serde_json::to_string(&to_json(&frame, args.limit))
                .map_err(|e| CliError::Failed(format!("cannot encode a frame as JSON: {e}")))?;
            s.push('\n');
            s
        } else if tty {
            format!(
                "{CLEAR}{}",
                render(&rack.file.name, &shape, &frame, args.limit)
            )
        } else if shown == 0 {
            render(&rack.file.name, &shape, &frame, args.limit)
        } else {
            format!("\n{}", render(&rack.file.name, &shape, &frame, args.limit))
        };
        let mut out = std::io::stdout().lock();
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            // `exactl top | head`: the reader has seen enough.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(CliError::Failed(format!("cannot write to stdout: {e}"))),
        }
        last_answering = frame.nodes_answering;
        prev = cur;
        taken = now;
        shown += 1;
    }
    if last_answering == 0 {
        return Err(CliError::Failed(format!(
            "no daemon of the rack at {} answers (is it up? `exactl rack up` starts it)",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::tests::healthy_rack;

    fn shape() -> Shape {
        "1x1x1".parse().unwrap()
    }

    fn link_mut<'a>(a: &'a mut Answer, peer: &str) -> &'a mut LinkStatus {
        let st = a.as_mut().unwrap();
        st.links.iter_mut().find(|l| l.peer == peer).unwrap()
    }

    fn row<'a>(f: &'a Frame, from: &str, to: &str) -> &'a LinkRow {
        f.link_rows
            .iter()
            .find(|r| r.from == from && r.to == to)
            .unwrap()
    }

    #[test]
    fn rates_are_deltas_over_the_interval_and_busiest_come_first() {
        let s = shape();
        let prev = healthy_rack(&s);
        let mut cur = prev.clone();
        for a in &mut cur {
            a.as_mut().unwrap().uptime_seconds += 2.0;
        }
        // F1 -> F2 (a 16 Gb/s QFDB link) sent 4 GB in 2 s: 16 Gbit/s, all of it.
        let l = link_mut(&mut cur[0], "M1QAF2");
        l.tx_bytes += 4_000_000_000;
        l.tx_cells += 1000;
        l.stall_seconds += 0.5;
        for _ in 0..20 {
            l.fault_stats.count(exanet_proto::fault::FaultKind::Loss);
        }
        l.faults = Some(exanet_proto::fault::LinkFaults {
            loss: 0.05,
            ..Default::default()
        });
        // F3 -> F4 a quarter of that.
        link_mut(&mut cur[2], "M1QAF4").tx_bytes += 1_000_000_000;
        let f = compute(&s, &prev, &cur, 2.0);
        assert_eq!(
            (f.nodes, f.nodes_answering, f.links, f.links_up),
            (4, 4, 6, 6)
        );
        assert_eq!(f.link_rows.len(), 12);
        assert_eq!(
            (f.link_rows[0].from.as_str(), f.link_rows[0].to.as_str()),
            ("M1QAF1", "M1QAF2")
        );
        assert_eq!(
            (f.link_rows[1].from.as_str(), f.link_rows[1].to.as_str()),
            ("M1QAF3", "M1QAF4")
        );
        let r = f.link_rows[0].rates.as_ref().unwrap();
        assert_eq!(r.tx_bytes, 2e9);
        assert_eq!(r.tx_cells, 500.0);
        assert!((r.utilization - 1.0).abs() < 1e-9, "{}", r.utilization);
        assert_eq!(r.stall, 0.25);
        assert_eq!(r.faulted["drop"], 10.0);
        assert_eq!((r.faulted["corrupt"], r.faulted_total()), (0.0, 10.0));
        assert_eq!(f.link_rows[0].faults.as_deref(), Some("loss 5%"));
        assert!((f.link_rows[1].rates.as_ref().unwrap().utilization - 0.25).abs() < 1e-9);
        // Idle directions: zero, not absent.
        let idle = row(&f, "M1QAF2", "M1QAF1").rates.as_ref().unwrap();
        assert_eq!(
            (idle.tx_bytes, idle.stall, idle.faulted_total()),
            (0.0, 0.0, 0.0)
        );
        assert_eq!(row(&f, "M1QAF2", "M1QAF1").faults, None);

        let text = render("t", &s, &f, 3);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("4/4 nodes answering, 6/6 links up"),
            "{text}"
        );
        assert!(lines[0].contains("tx 2.5 GB/s"), "{text}");
        assert!(
            lines[3].starts_with("M1QAF1->M1QAF2") && lines[3].contains("100.0%"),
            "{text}"
        );
        assert!(
            lines[3].contains("loss 5%") && lines[3].contains(" 10 "),
            "{text}"
        );
        assert!(
            lines[4].starts_with("M1QAF3->M1QAF4") && lines[4].contains("25.0%"),
            "{text}"
        );
        assert!(text.contains("(9 more link directions)"), "{text}");
        assert!(text.contains("no node retransmits"), "{text}");
    }

    #[test]
    fn ni_rates_by_reason_and_the_worst_nodes_first() {
        let s = shape();
        let prev = healthy_rack(&s);
        let mut cur = prev.clone();
        {
            let ni = &mut cur[1].as_mut().unwrap().ni;
            ni.counters.retransmissions = 10;
            ni.counters.timeouts = 2;
            ni.counters.nacks_sent[NackReason::Crc as usize] = 4;
        }
        {
            let ni = &mut cur[3].as_mut().unwrap().ni;
            ni.counters.retransmissions = 100;
            ni.counters.nacks_received[NackReason::PageFault as usize] = 6;
            ni.counters.pdid_violations = 3;
        }
        let f = compute(&s, &prev, &cur, 2.0);
        let f2 = f.node_rows[1].ni.as_ref().unwrap();
        assert_eq!((f2.retransmissions, f2.timeouts), (5.0, 1.0));
        // Reasons that did not move are left out.
        assert_eq!(f2.nacks_sent, BTreeMap::from([("crc".to_string(), 2.0)]));
        let f4 = f.node_rows[3].ni.as_ref().unwrap();
        assert_eq!((f4.pdid_violations, f4.pdid_violations_total), (1.5, 3));
        let text = render("t", &s, &f, 20);
        let f4_at = text.find("\nM1QAF4 ").expect(&text);
        let f2_at = text.find("\nM1QAF2 ").expect(&text);
        assert!(f4_at < f2_at, "{text}");
        assert!(text.contains("crc 2.0; -"), "{text}");
        assert!(text.contains("-; page_fault 3.0"), "{text}");
        assert!(
            !text.contains("\nM1QAF1 "),
            "quiet nodes are not listed: {text}"
        );
        let v = to_json(&f, 20);
        assert_eq!(v["node_ni"][3]["pdid_violations"], 3);
        assert_eq!(v["node_ni"][1]["nacks_sent_per_s"]["crc"], 2.0);
        assert_eq!(v["totals"]["retransmissions_per_s"], 55.0);
    }

    #[test]
    fn silent_restarted_and_returning_nodes() {
        let s = shape();
        let mut prev = healthy_rack(&s);
        for a in &mut prev {
            let st = a.as_mut().unwrap();
            st.uptime_seconds = 100.0;
            st.ni.counters.retransmissions = 1_000_000;
            for l in &mut st.links {
                l.tx_bytes = 1_000_000_000;
                l.stall_seconds = 50.0;
            }
        }
        prev[3] = Err("no answer within 300 ms".into());
        let mut cur = prev.clone();
        // F2 was restarted: fresh pid, small counters. It must not read as a huge rate
        // (u64 wrap) nor a negative one.
        {
            let st = cur[1].as_mut().unwrap();
            st.pid += 1;
            st.uptime_seconds = 0.5;
            st.ni.counters.retransmissions = 3;
            for l in &mut st.links {
                l.tx_bytes = 2560;
                l.stall_seconds = 0.0;
            }
        }
        // F1 was not restarted but one link's counters still went back (reset).
        link_mut(&mut cur[0], "M1QAF3").tx_bytes = 1000;
        // F3 stopped answering; F4 answers again.
        cur[2] = Err("no answer within 300 ms".into());
        cur[3] = Ok(crate::fabric::tests::healthy(&s, NodeId(3)));
        let f = compute(&s, &prev, &cur, 1.0);
        assert_eq!(f.nodes_answering, 3);
        for r in &f.link_rows {
            if let Some(x) = &r.rates {
                for v in [x.tx_bytes, x.utilization, x.stall, x.faulted_total()] {
                    assert!(v.is_finite() && (0.0..=1e9).contains(&v), "{r:?}");
                }
            }
        }
        assert_eq!(
            row(&f, "M1QAF2", "M1QAF1").rates.as_ref().unwrap().tx_bytes,
            2560.0
        );
        assert_eq!(
            row(&f, "M1QAF1", "M1QAF3").rates.as_ref().unwrap().tx_bytes,
            1000.0
        );
        assert!(row(&f, "M1QAF4", "M1QAF1").rates.is_none());
        assert!(!f.link_rows.iter().any(|r| r.from == "M1QAF3"));
        assert_eq!(f.node_rows[1].state, NodeState::Restarted);
        assert_eq!(f.node_rows[1].ni.as_ref().unwrap().retransmissions, 3.0);
        assert_eq!(f.node_rows[3].state, NodeState::New);
        assert!(matches!(&f.node_rows[2].state, NodeState::Silent(e) if e.contains("no answer")));
        let text = render("t", &s, &f, 50);
        assert!(
            text.contains("M1QAF3: not answering: no answer within 300 ms"),
            "{text}"
        );
        assert!(text.contains("M1QAF2: restarted"), "{text}");
        assert!(text.contains("M1QAF4: answering again"), "{text}");
        // The rows without rates come last and show dashes.
        let last = text.lines().find(|l| l.starts_with("M1QAF4->")).unwrap();
        assert!(last.contains(" - "), "{last}");
        let v = to_json(&f, 50);
        assert_eq!(v["node_ni"][2]["state"], "silent");
        assert!(v["link_directions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["tx_bytes_per_s"].is_null()));
    }

    #[test]
    fn nobody_answering_and_degenerate_intervals() {
        let s = shape();
        let none: Vec<Answer> = (0..4).map(|_| Err("gone".to_string())).collect();
        let f = compute(&s, &none, &none, 0.0);
        assert_eq!((f.nodes_answering, f.links_up), (0, 0));
        let text = render("t", &s, &f, 20);
        assert!(text.contains("0/4 nodes answering, 0/6 links up"), "{text}");
        assert!(text.contains("no link reported"), "{text}");
        // A zero or NaN interval must not divide by zero.
        let prev = healthy_rack(&s);
        let mut cur = prev.clone();
        link_mut(&mut cur[0], "M1QAF2").tx_bytes += 1;
        for dt in [0.0, f64::NAN, -1.0] {
            let f = compute(&s, &prev, &cur, dt);
            assert!(f
                .link_rows
                .iter()
                .all(|r| r.rates.as_ref().unwrap().tx_bytes.is_finite()));
        }
    }

    /// Issue 10: a rack with nothing to sum showed `tx -0 B/s, stalls -0.000` (a sum of no
    /// f64 is negative zero).
    #[test]
    fn never_negative_zero() {
        let s = shape();
        let none: Vec<Answer> = (0..4).map(|_| Err("gone".to_string())).collect();
        let idle = healthy_rack(&s);
        for (prev, cur) in [(&none, &none), (&idle, &idle)] {
            let f = compute(&s, prev, cur, 1.0);
            let text = render("t", &s, &f, 20);
            assert!(!text.contains("-0"), "{text}");
            assert!(text.contains("tx 0 B/s, stalls 0.000 s/s"), "{text}");
            let v = to_json(&f, 20);
            for (k, t) in v["totals"].as_object().unwrap() {
                let t = t.as_f64().unwrap();
                assert!(t == 0.0 && t.is_sign_positive(), "{k}: {t}");
            }
        }
        assert_eq!(bytes_per_s(-0.0), "0 B/s");
        assert_eq!(bytes_per_s(-1e-12), "0 B/s");
        assert_eq!(format!("{:.3}", shown(-0.0)), "0.000");
    }

    #[test]
    fn interval_and_limit_are_checked() {
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("200ms"), Ok(Duration::from_millis(200)));
        assert!(parse_interval("50ms").unwrap_err().contains("100ms"));
        assert!(parse_interval("2").unwrap_err().contains("no unit"));
        assert!(parse_interval("2h").is_err());
        assert_eq!(parse_limit("5"), Ok(5));
        assert_eq!(parse_count("3"), Ok(3));
        assert!(parse_count("0").is_err() && parse_count("-1").is_err());
        assert!(parse_limit("0").is_err() && parse_limit("x").is_err());
    }

    #[test]
    fn counts_and_byte_rates_read_well() {
        assert_eq!(bytes_per_s(2.5e9), "2.5 GB/s");
        assert_eq!(bytes_per_s(980.0), "980 B/s");
        assert_eq!(count_per_s(0.0), "0");
        assert_eq!(count_per_s(0.5), "0.5");
        assert_eq!(count_per_s(12.4), "12");
        assert_eq!(count_per_s(25_000.0), "25.0k");
    }
}
