//! Grafana provisioning and dashboards for a generated rack.
//!
//! Two dashboards, both reading the rack's Prometheus (datasource uid [`DATASOURCE_UID`]):
//!
//! - `exanet-rack`: the whole rack and, per node and link, what an operator watches: links
//!   up, traffic, flow-control stalls, queues, retransmissions, NACKs by reason, PDID
//!   violations, timeouts, RDMA results, reconnects; then one row per selected node with
//!   one panel per link (rows repeat over `$node`, panels over `$port`).
//! - `exanet-torus`: link utilization laid out as the rack: one heatmap per torus
//!   dimension and one for the QFDB links, one row per QFDB in (z, y, x) order, so a hot
//!   ring or plane shows as a band. This one depends on the shape.
//!
//! Utilization is the tx bit rate over the link's nominal rate (10 Gb/s torus, 16 Gb/s
//! inside a QFDB): the emulator carries cells over QUIC as fast as the host allows, so
//! values above 1 mean faster than the hardware would go.

use exanet_proto::topology::LinkKind;
use exanet_proto::{Coord, NodeId, Shape};
use serde_json::{json, Value};

use crate::error::{DeployError, Result};
use crate::yaml::{render, s, MapBuilder, Yaml};
use crate::GenFile;

pub const DATASOURCE_UID: &str = "exanet-prometheus";
/// Where the compose file mounts the dashboards in the Grafana container.
pub const DASHBOARD_MOUNT: &str = "/etc/grafana/dashboards/exanet";

fn ds() -> Value {
    json!({"type": "prometheus", "uid": DATASOURCE_UID})
}

/// Provisioning files and dashboards, under `grafana/`.
pub fn files(shape: Shape, rack: &str) -> Result<Vec<GenFile>> {
    let datasource = MapBuilder::new()
        .put("apiVersion", Yaml::Int(1))
        .put(
            "datasources",
            Yaml::List(vec![MapBuilder::new()
                .put("name", s("exanet-prometheus"))
                .put("uid", s(DATASOURCE_UID))
                .put("type", s("prometheus"))
                .put("access", s("proxy"))
                .put("url", s("http://prometheus:9090"))
                .put("isDefault", Yaml::Bool(true))
                .put(
                    "jsonData",
                    MapBuilder::new().put("timeInterval", s("5s")).build(),
                )
                .build()]),
        )
        .build();
    let provider = MapBuilder::new()
        .put("apiVersion", Yaml::Int(1))
        .put(
            "providers",
            Yaml::List(vec![MapBuilder::new()
                .put("name", s("exanet"))
                .put("folder", s("exanet"))
                .put("type", s("file"))
                .put("disableDeletion", Yaml::Bool(true))
                .put(
                    "options",
                    MapBuilder::new().put("path", s(DASHBOARD_MOUNT)).build(),
                )
                .build()]),
        )
        .build();
    let json_text = |v: &Value| -> Result<String> {
        serde_json::to_string_pretty(v)
            .map(|t| t + "\n")
            .map_err(|e| DeployError::Render(format!("cannot render a dashboard: {e}")))
    };
    Ok(vec![
        GenFile::new(
            "grafana/provisioning/datasources/exanet.yml",
            render(&datasource),
        ),
        GenFile::new(
            "grafana/provisioning/dashboards/exanet.yml",
            render(&provider),
        ),
        GenFile::new(
            "grafana/dashboards/exanet-rack.json",
            json_text(&rack_dashboard(shape, rack))?,
        ),
        GenFile::new(
            "grafana/dashboards/exanet-torus.json",
            json_text(&torus_dashboard(shape, rack))?,
        ),
    ])
}

/// Every PromQL expression of a dashboard (the `expr` of its targets), for checks.
#[cfg(test)]
pub fn expressions(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let (Some(Value::String(e)), Some(_)) = (m.get("expr"), m.get("refId")) {
                    out.push(e.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(dashboard, &mut out);
    out
}

fn grid(x: u32, y: u32, w: u32, h: u32) -> Value {
    json!({"x": x, "y": y, "w": w, "h": h})
}

fn target(ref_id: &str, expr: &str, legend: &str) -> Value {
    json!({
        "datasource": ds(),
        "refId": ref_id,
        "expr": expr,
        "legendFormat": legend,
        "range": true,
        "editorMode": "code",
    })
}

fn timeseries(id: u32, title: &str, pos: Value, unit: &str, targets: Vec<Value>) -> Value {
    json!({
        "id": id,
        "type": "timeseries",
        "title": title,
        "datasource": ds(),
        "gridPos": pos,
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10}},
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": true},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    })
}

fn stat(id: u32, title: &str, pos: Value, expr: &str) -> Value {
    json!({
        "id": id,
        "type": "stat",
        "title": title,
        "datasource": ds(),
        "gridPos": pos,
        "fieldConfig": {"defaults": {"unit": "short"}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": false},
            "colorMode": "value",
            "graphMode": "none",
        },
        "targets": [target("A", expr, "")],
    })
}

fn dashboard(uid: &str, title: &str, variables: Vec<Value>, panels: Vec<Value>) -> Value {
    json!({
        "uid": uid,
        "title": title,
        "tags": ["exanet"],
        "editable": true,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-15m", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "templating": {"list": variables},
        "panels": panels,
    })
}

fn query_variable(name: &str, label: &str, query: &str, current: Option<&str>) -> Value {
    let current = match current {
        Some(v) => json!({"selected": true, "text": [v], "value": [v]}),
        None => json!({"selected": true, "text": ["All"], "value": ["$__all"]}),
    };
    json!({
        "name": name,
        "label": label,
        "type": "query",
        "datasource": ds(),
        "query": {"query": query, "refId": format!("var-{name}")},
        "definition": query,
        "refresh": 2,
        "multi": true,
        "includeAll": true,
        "allValue": ".*",
        "sort": 1,
        "current": current,
    })
}

/// The rack dashboard: rack-wide panels, then a row per `$node` with a panel per `$port`.
fn rack_dashboard(shape: Shape, rack: &str) -> Value {
    let sel = r#"node=~"$node""#;
    let ri = "$__rate_interval";
    let first = shape.display(NodeId(0));
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    let mut panels = vec![
        stat(
            next(),
            "Link ends up",
            grid(0, 0, 4, 4),
            &format!("sum(exanet_link_up{{{sel}}})"),
        ),
        stat(
            next(),
            "Link ends",
            grid(4, 0, 4, 4),
            &format!("count(exanet_link_up{{{sel}}})"),
        ),
        stat(
            next(),
            "Daemons scraped",
            grid(8, 0, 4, 4),
            r#"sum(up{job="exanet"})"#,
        ),
        stat(
            next(),
            "Workloads attached",
            grid(12, 0, 4, 4),
            &format!("sum(exanet_ni_attached_workloads{{{sel}}})"),
        ),
        stat(
            next(),
            "PDID violations (range)",
            grid(16, 0, 4, 4),
            &format!("sum(increase(exanet_ni_pdid_violations_total{{{sel}}}[$__range]))"),
        ),
        stat(
            next(),
            "Link reconnects (range)",
            grid(20, 0, 4, 4),
            &format!("sum(increase(exanet_link_sessions_total{{{sel}}}[$__range]))"),
        ),
        timeseries(
            next(),
            "Link traffic, busiest 10 link ends (tx)",
            grid(0, 4, 8, 8),
            "bps",
            vec![target(
                "A",
                &format!(
                    r#"topk(10, sum by (node, port, peer) (rate(exanet_link_bytes_total{{{sel},direction="tx"}}[{ri}])) * 8)"#
                ),
                "{{node}} {{port}} -> {{peer}}",
            )],
        ),
        timeseries(
            next(),
            "Flow-control stalls (fraction of time an output waited for credit)",
            grid(8, 4, 8, 8),
            "percentunit",
            vec![target(
                "A",
                &format!(
                    "sum by (node, port) (rate(exanet_link_stall_seconds_total{{{sel}}}[{ri}]))"
                ),
                "{{node}} {{port}}",
            )],
        ),
        timeseries(
            next(),
            // Modeled busy time over the node's modeled clock: where the modeled
            // hardware, not the emulator, is saturated (docs/modeled-time.md).
            "Modeled link utilization, busiest 10 link ends",
            grid(16, 4, 8, 8),
            "percentunit",
            vec![target(
                "A",
                &format!(
                    "topk(10, sum by (node, port, peer) (rate(exanet_link_modeled_busy_seconds_total{{{sel}}}[{ri}])) \
                     / on(node) group_left sum by (node) (rate(exanet_node_modeled_time_seconds{{{sel}}}[{ri}])))"
                ),
                "{{node}} {{port}} -> {{peer}}",
            )],
        ),
        timeseries(
            next(),
            "Retransmissions (messages and RDMA blocks sent again)",
            grid(0, 12, 8, 8),
            "ops",
            vec![target(
                "A",
                &format!("sum by (node) (rate(exanet_ni_retransmissions_total{{{sel}}}[{ri}]))"),
                "{{node}}",
            )],
        ),
        timeseries(
            next(),
            "NACKs by reason",
            grid(8, 12, 8, 8),
            "ops",
            vec![target(
                "A",
                &format!("sum by (reason, direction) (rate(exanet_ni_nacks_total{{{sel}}}[{ri}]))"),
                "{{reason}} ({{direction}})",
            )],
        ),
        timeseries(
            next(),
            "PDID violations (cells refused for their protection domain)",
            grid(16, 12, 8, 8),
            "short",
            vec![target(
                "A",
                &format!(
                    "sum by (node) (increase(exanet_ni_pdid_violations_total{{{sel}}}[{ri}]))"
                ),
                "{{node}}",
            )],
        ),
        timeseries(
            next(),
            "Queued bytes at switch inputs",
            grid(0, 20, 8, 8),
            "bytes",
            vec![target(
                "A",
                &format!("sum by (node, port) (exanet_link_queue_bytes{{{sel}}})"),
                "{{node}} {{port}}",
            )],
        ),
        timeseries(
            next(),
            "Bytes in flight (sent, credit not back)",
            grid(8, 20, 8, 8),
            "bytes",
            vec![target(
                "A",
                &format!("sum by (node, port) (exanet_link_in_flight_bytes{{{sel}}})"),
                "{{node}} {{port}}",
            )],
        ),
        timeseries(
            next(),
            "NI messages, timeouts, RDMA transfers",
            grid(16, 20, 8, 8),
            "ops",
            vec![
                target(
                    "A",
                    &format!("sum by (direction) (rate(exanet_ni_messages_total{{{sel}}}[{ri}]))"),
                    "messages {{direction}}",
                ),
                target(
                    "B",
                    &format!("sum(rate(exanet_ni_timeouts_total{{{sel}}}[{ri}]))"),
                    "timeouts",
                ),
                target(
                    "C",
                    &format!(
                        "sum by (result) (rate(exanet_ni_rdma_transfers_total{{{sel}}}[{ri}]))"
                    ),
                    "RDMA {{result}}",
                ),
            ],
        ),
        // What the operator broke on purpose (exactl link set, partition, chaos) and
        // what the NIs made of it.
        timeseries(
            next(),
            "Faults injected on links (cells dropped, corrupted)",
            grid(0, 28, 6, 8),
            "ops",
            vec![target(
                "A",
                &format!(
                    "sum by (node, peer, fault) (rate(exanet_link_faults_injected_total{{{sel}}}[{ri}]))"
                ),
                "{{node}} -> {{peer}} {{fault}}",
            )],
        ),
        timeseries(
            next(),
            "Cells refused for bad CRCs at link inputs",
            grid(6, 28, 6, 8),
            "ops",
            vec![target(
                "A",
                &format!(
                    "sum by (node, peer) (rate(exanet_link_rx_corrupt_cells_total{{{sel}}}[{ri}]))"
                ),
                "{{peer}} -> {{node}}",
            )],
        ),
        timeseries(
            next(),
            "Link ends cut or with faults set",
            grid(12, 28, 6, 8),
            "short",
            vec![
                target(
                    "A",
                    &format!("sum(exanet_link_admin_down{{{sel}}})"),
                    "cut",
                ),
                target(
                    "B",
                    &format!(
                        "sum(max by (node, peer) (exanet_link_fault_setting{{{sel}}} > bool 0))"
                    ),
                    "faults set",
                ),
            ],
        ),
        timeseries(
            next(),
            "Completion latency p50 / p99 by operation",
            grid(18, 28, 6, 8),
            "s",
            vec![
                target(
                    "A",
                    &format!(
                        "histogram_quantile(0.5, sum by (le, op) (rate(exanet_ni_completion_latency_seconds_bucket{{{sel}}}[{ri}])))"
                    ),
                    "p50 {{op}}",
                ),
                target(
                    "B",
                    &format!(
                        "histogram_quantile(0.99, sum by (le, op) (rate(exanet_ni_completion_latency_seconds_bucket{{{sel}}}[{ri}])))"
                    ),
                    "p99 {{op}}",
                ),
            ],
        ),
    ];
    // One row per selected node, one panel per link end of it.
    panels.push(json!({
        "id": next(),
        "type": "row",
        "title": "Links of $node",
        "gridPos": grid(0, 36, 24, 1),
        "collapsed": false,
        "repeat": "node",
        "panels": [],
    }));
    let mut per_link = timeseries(
        next(),
        "$node $port",
        grid(0, 37, 6, 7),
        "bps",
        vec![
            target(
                "A",
                &format!(
                    r#"sum by (direction, peer) (rate(exanet_link_bytes_total{{node=~"$node",port=~"$port"}}[{ri}])) * 8"#
                ),
                "{{direction}} ({{peer}})",
            ),
            target(
                "B",
                &format!(
                    r#"sum(rate(exanet_link_stall_seconds_total{{node=~"$node",port=~"$port"}}[{ri}])) * 1e9"#
                ),
                "stalled (ns/s)",
            ),
            target(
                "C",
                r#"min(exanet_link_up{node=~"$node",port=~"$port"})"#,
                "up",
            ),
        ],
    );
    per_link["repeat"] = json!("port");
    per_link["repeatDirection"] = json!("h");
    per_link["maxPerRow"] = json!(4);
    panels.push(per_link);
    dashboard(
        "exanet-rack",
        &format!("exanet rack {rack}"),
        vec![
            query_variable(
                "node",
                "Node",
                "label_values(exanet_node_uptime_seconds, node)",
                Some(&first),
            ),
            query_variable(
                "port",
                "Link (port)",
                r#"label_values(exanet_link_up{node=~"$node"}, port)"#,
                None,
            ),
        ],
        panels,
    )
}

/// The QFDBs of a shape in (z, y, x) order with their F1 node.
fn qfdbs(shape: &Shape) -> Vec<(Coord, String)> {
    let mut out = Vec::new();
    for z in 0..shape.z() {
        for y in 0..shape.y() {
            for x in 0..shape.x() {
                let c = Coord { x, y, z, fpga: 1 };
                if let Some(id) = shape.id(c) {
                    out.push((c, shape.display(id)));
                }
            }
        }
    }
    out
}

fn heatmap(id: u32, title: &str, pos: Value, targets: Vec<Value>) -> Value {
    json!({
        "id": id,
        "type": "heatmap",
        "title": title,
        "datasource": ds(),
        "gridPos": pos,
        "fieldConfig": {
            "defaults": {
                "custom": {
                    "hideFrom": {"legend": false, "tooltip": false, "viz": false},
                    "scaleDistribution": {"type": "linear"},
                },
            },
            "overrides": [],
        },
        "options": {
            // The rows are already the buckets: one series per QFDB, in rack order.
            "calculate": false,
            "rowsFrame": {"layout": "unknown"},
            "yAxis": {"axisPlacement": "left", "reverse": true},
            "cellGap": 1,
            "cellValues": {"unit": "percentunit", "decimals": 1},
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "scale": "linear",
                "steps": 64,
                "min": 0,
                "max": 1,
                "exponent": 0.5,
                "fill": "dark-orange",
                "reverse": false,
            },
            "legend": {"show": true},
            "tooltip": {"mode": "single", "yHistogram": false, "showColorScale": true},
            "showValue": "never",
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
        },
        "targets": targets,
    })
}

/// The torus dashboard: a heatmap per torus dimension (rows: QFDBs, value: utilization of
/// the QFDB's out-links in that dimension) and one for the links inside each QFDB.
fn torus_dashboard(shape: Shape, rack: &str) -> Value {
    let ri = "$__rate_interval";
    let qs = qfdbs(&shape);
    let row_label = |c: &Coord, f1: &str| {
        let q = f1.trim_end_matches("F1");
        format!("z{} y{} x{} {q}", c.z, c.y, c.x)
    };
    let mut panels = vec![json!({
        "id": 1,
        "type": "text",
        "title": "Layout",
        "gridPos": grid(0, 0, 24, 3),
        "options": {
            "mode": "markdown",
            "content": format!(
                "Rack **{rack}**, shape **{shape}**: one row per QFDB in (z, y, x) order, \
                 labelled with its coordinates and blade/slot. Colour: tx rate of the QFDB's \
                 links in that dimension over their nominal rate (10 Gb/s torus, 16 Gb/s \
                 inside a QFDB); above 1 the emulator runs faster than the hardware."
            ),
        },
    })];
    let mut id = 1;
    let mut y = 3;
    let dims = [
        (0usize, LinkKind::TorusX, "X"),
        (1, LinkKind::TorusY, "Y"),
        (2, LinkKind::TorusZ, "Z"),
    ];
    for (d, kind, dname) in dims {
        let ring = shape.ring(d);
        if ring < 2 {
            continue;
        }
        // Out-links of an F1 node in this dimension: both directions, except in a ring of
        // two, where one link joins the pair (topology::neighbour).
        let out_links = if ring == 2 { 1 } else { 2 };
        let targets = qs
            .iter()
            .enumerate()
            .map(|(i, (c, f1))| {
                target(
                    &format!("Q{i}"),
                    &format!(
                        r#"sum(rate(exanet_link_bytes_total{{node="{f1}",kind="{}",direction="tx"}}[{ri}])) * 8 / {}e9"#,
                        kind.label(),
                        out_links * kind.gbps()
                    ),
                    &row_label(c, f1),
                )
            })
            .collect();
        id += 1;
        panels.push(heatmap(
            id,
            &format!("Torus {dname} links (ring of {ring}): utilization per QFDB"),
            grid(0, y, 24, 2 + qs.len() as u32 / 2),
            targets,
        ));
        y += 2 + qs.len() as u32 / 2;
    }
    // Inside a QFDB: 6 links, 12 directed, between F1..F4.
    let targets = qs
        .iter()
        .enumerate()
        .map(|(i, (c, f1))| {
            let q = f1.trim_end_matches("F1");
            target(
                &format!("Q{i}"),
                &format!(
                    r#"sum(rate(exanet_link_bytes_total{{node=~"{q}F[1-4]",kind="qfdb",direction="tx"}}[{ri}])) * 8 / {}e9"#,
                    12 * LinkKind::IntraQfdb.gbps()
                ),
                &row_label(c, f1),
            )
        })
        .collect();
    id += 1;
    panels.push(heatmap(
        id,
        "QFDB links (F1..F4 all-to-all): utilization per QFDB",
        grid(0, y, 24, 2 + qs.len() as u32 / 2),
        targets,
    ));
    dashboard(
        "exanet-torus",
        &format!("exanet torus {rack}"),
        vec![],
        panels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dashboards(shape: &str) -> (Value, Value) {
        let files = files(shape.parse().unwrap(), "r").unwrap();
        let get = |p: &str| -> Value {
            let f = files.iter().find(|f| f.path.to_str() == Some(p)).unwrap();
            serde_json::from_str(&f.text).unwrap()
        };
        (
            get("grafana/dashboards/exanet-rack.json"),
            get("grafana/dashboards/exanet-torus.json"),
        )
    }

    #[test]
    fn torus_rows_cover_every_qfdb_of_every_dimension() {
        let (_, torus) = dashboards("4x4x2");
        let heatmaps: Vec<&Value> = torus["panels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "heatmap")
            .collect();
        // X, Y, Z rings all longer than 1, plus the QFDB panel.
        assert_eq!(heatmaps.len(), 4);
        for h in &heatmaps {
            let t = h["targets"].as_array().unwrap();
            assert_eq!(t.len(), 32);
            assert_eq!(t[0]["legendFormat"], "z0 y0 x0 M1QA");
            assert_eq!(t[31]["legendFormat"], "z1 y3 x3 M8QD");
        }
        // Z is a ring of two: one out-link per F1 node.
        assert!(heatmaps[2]["targets"][0]["expr"]
            .as_str()
            .unwrap()
            .ends_with("* 8 / 10e9"));
        // 2x2x1: no Z ring, so no Z panel.
        let (_, torus) = dashboards("2x2x1");
        let titles: Vec<&str> = torus["panels"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["title"].as_str())
            .collect();
        assert!(
            !titles.iter().any(|t| t.starts_with("Torus Z")),
            "{titles:?}"
        );
        assert!(
            titles.iter().any(|t| t.starts_with("Torus Y")),
            "{titles:?}"
        );
    }

    #[test]
    fn every_panel_has_a_unique_id_and_expressions_name_exanet_metrics() {
        let (rack, torus) = dashboards("2x2x1");
        for d in [&rack, &torus] {
            let ids: Vec<u64> = d["panels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["id"].as_u64().unwrap())
                .collect();
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), ids.len());
        }
        let exprs = expressions(&rack);
        assert!(exprs.len() >= 15, "{exprs:?}");
        for metric in [
            "exanet_link_stall_seconds_total",
            "exanet_link_modeled_busy_seconds_total",
            "exanet_node_modeled_time_seconds",
            "exanet_ni_retransmissions_total",
            "exanet_ni_nacks_total",
            "exanet_ni_pdid_violations_total",
            "exanet_link_faults_injected_total",
            "exanet_link_rx_corrupt_cells_total",
            "exanet_link_admin_down",
            "exanet_ni_completion_latency_seconds_bucket",
        ] {
            assert!(exprs.iter().any(|e| e.contains(metric)), "{metric}");
        }
        assert_eq!(expressions(&torus).len(), 4 * 3);
    }

    /// The dashboards and the daemon's exporter name the same families: every metric an
    /// expression reads is a family of exanet-proto's catalog (a histogram's series by
    /// their suffixes), so a family renamed or dropped there fails here, not in a browser.
    #[test]
    fn every_metric_a_dashboard_reads_is_in_the_catalog() {
        use exanet_proto::metric::{Family, MetricType};
        let (rack, torus) = dashboards("2x2x1");
        let mut seen = 0;
        for e in expressions(&rack).iter().chain(&expressions(&torus)) {
            let names = e
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("exanet_"));
            for name in names {
                seen += 1;
                let family = Family::from_name(name).or_else(|| {
                    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
                        let f = Family::from_name(name.strip_suffix(suffix)?)?;
                        (f.spec().kind == MetricType::Histogram).then_some(f)
                    })
                });
                assert!(family.is_some(), "{name} (in {e}) is not a catalog family");
            }
        }
        assert!(seen >= 20, "only {seen} metric names found");
    }
}
