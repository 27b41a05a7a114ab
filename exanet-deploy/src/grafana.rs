//! Grafana provisioning and dashboards for a generated rack.
//!
//! Two dashboards, both reading the rack's Prometheus (datasource uid [`DATASOURCE_UID`]):
//!
//! - `exanet-rack`: the rack-wide views of [`crate::views`] (links up, daemons scraped,
//!   busiest links), then every node view (traffic through the switch, retransmissions,
//!   NACKs by reason, timeouts, PDID violations, latency, RDMA results, ...) over the
//!   selected nodes (`$node`) and every link view (throughput, modeled and wire
//!   utilization, stalls, queues, bytes in flight, faults, CRC refusals, state, sessions)
//!   over their selected link ends (`$port`), a series per node or link end. The console
//!   pages ([`crate::consoles`]) show the same views for one node or one link.
//! - `exanet-torus`: link utilization laid out as the rack: one heatmap per torus
//!   dimension and one for the QFDB links, one row per QFDB in (z, y, x) order, so a hot
//!   ring or plane shows as a band. This one depends on the shape.
//!
//! The torus heatmaps show the wire utilization ([`views::WIRE_UTIL`]): the tx bit rate
//! over the links' nominal rate (10 Gb/s torus, 16 Gb/s inside a QFDB). The emulator
//! carries cells over QUIC as fast as the host allows, so values above 1 mean faster than
//! the hardware would go.

use exanet_proto::topology::LinkKind;
use exanet_proto::{Coord, NodeId, Shape};
use serde_json::{json, Value};

use crate::error::{DeployError, Result};
use crate::views::{self, Binding, Display, Scope, Side, View};
use crate::yaml::{render, s, MapBuilder, Yaml};
use crate::GenFile;

/// Grafana's windows for `$W` and `$RANGE`.
const RATE_INTERVAL: &str = "$__rate_interval";
const RANGE: &str = "$__range";

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

fn stat(id: u32, title: &str, pos: Value, unit: &str, targets: Vec<Value>) -> Value {
    json!({
        "id": id,
        "type": "stat",
        "title": title,
        "datasource": ds(),
        "gridPos": pos,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": false},
            "colorMode": "value",
            "graphMode": "none",
        },
        "targets": targets,
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

/// Panels of `views` laid out three to a row from `y`, each bound by `bind` with the
/// legend prefix `prefix` (which names the series of a node or a link end); the row after.
fn view_panels(
    views: &[&View],
    y: u32,
    next: &mut impl FnMut() -> u32,
    bind: &Binding,
    prefix: &dyn Fn(&View) -> &'static str,
    panels: &mut Vec<Value>,
) -> u32 {
    let mut row_y = y;
    for (i, v) in views.iter().enumerate() {
        let col = (i % 3) as u32;
        if i > 0 && col == 0 {
            row_y += 8;
        }
        panels.push(view_panel(
            next(),
            v,
            grid(col * 8, row_y, 8, 8),
            bind,
            prefix(v),
        ));
    }
    row_y + 8
}

/// One view as a Grafana panel.
fn view_panel(id: u32, v: &View, pos: Value, bind: &Binding, prefix: &str) -> Value {
    let refs = ["A", "B", "C", "D", "E", "F"];
    let targets = v
        .queries
        .iter()
        .zip(refs)
        .map(|(q, r)| {
            let legend = match (prefix.is_empty(), q.legend.is_empty()) {
                (true, _) => q.legend.to_string(),
                (false, true) => prefix.to_string(),
                (false, false) => format!("{prefix} {}", q.legend),
            };
            target(r, &views::expand(q.expr, bind), &legend)
        })
        .collect();
    match v.display {
        Display::Stat => stat(id, v.title, pos, v.unit.grafana(), targets),
        Display::Graph => timeseries(id, v.title, pos, v.unit.grafana(), targets),
    }
}

fn row(id: u32, title: &str, y: u32) -> Value {
    json!({
        "id": id,
        "type": "row",
        "title": title,
        "gridPos": grid(0, y, 24, 1),
        "collapsed": false,
        "panels": [],
    })
}

/// The rack dashboard: the rack-wide views, then every node view and every link view
/// (`views`), each over the selected nodes (`$node`) and link ends (`$port`), with a series
/// per node or link end.
fn rack_dashboard(shape: Shape, rack: &str) -> Value {
    let first = shape.display(NodeId(0));
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    let nodes = r#"node=~"$node""#;
    let links = r#"node=~"$node",port=~"$port""#;
    let rack_bind = Binding {
        sel: nodes,
        node: nodes,
        by: &[],
        window: RATE_INTERVAL,
        range: RANGE,
        rate: &views::nominal_rate_by_kind(nodes),
    };
    let mut panels = Vec::new();
    let (stats, graphs): (Vec<&View>, Vec<&View>) =
        views::RACK.iter().partition(|v| v.display == Display::Stat);
    for (i, v) in stats.iter().enumerate() {
        panels.push(view_panel(
            next(),
            v,
            grid(4 * (i as u32 % 6), 4 * (i as u32 / 6), 4, 4),
            &rack_bind,
            "",
        ));
    }
    let mut y = 4 * stats.len().div_ceil(6) as u32;
    for (i, v) in graphs.iter().enumerate() {
        let (col, w) = (12 * (i as u32 % 2), 12);
        if i > 0 && col == 0 {
            y += 8;
        }
        panels.push(view_panel(next(), v, grid(col, y, w, 8), &rack_bind, ""));
    }
    y += 8;
    panels.push(row(next(), "Nodes ($node)", y));
    let node_bind = Binding {
        by: &["node"],
        ..rack_bind.clone()
    };
    y = view_panels(
        views::NODE,
        y + 1,
        &mut next,
        &node_bind,
        &|_| "{{node}}",
        &mut panels,
    );
    panels.push(row(next(), "Link ends ($node, $port)", y));
    let link_rate = views::nominal_rate_by_kind(links);
    let link_bind = Binding {
        sel: links,
        by: &["node", "port", "peer"],
        rate: &link_rate,
        ..rack_bind.clone()
    };
    view_panels(
        views::LINK,
        y + 1,
        &mut next,
        &link_bind,
        // Series are named by the direction they describe, sender first.
        &|v| match v.scope {
            Scope::Link(Side::Receiver) => "{{peer}} -> {{node}} {{port}}",
            _ => "{{node}} {{port}} -> {{peer}}",
        },
        &mut panels,
    );
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

/// [`views::WIRE_UTIL`] of a group of link ends (`sel`) taken together: their tx bit rate
/// over the sum of their nominal rates, `gbps`.
fn group_wire_util(sel: &str, gbps: u32) -> String {
    let rate = format!("{gbps}e9");
    views::expand(
        views::WIRE_UTIL.queries[0].expr,
        &Binding {
            sel,
            node: sel,
            by: &[],
            window: RATE_INTERVAL,
            range: RANGE,
            rate: &rate,
        },
    )
}

/// The torus dashboard: a heatmap per torus dimension (rows: QFDBs, value: utilization of
/// the QFDB's out-links in that dimension) and one for the links inside each QFDB.
fn torus_dashboard(shape: Shape, rack: &str) -> Value {
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
                    &group_wire_util(
                        &format!(r#"node="{f1}",kind="{}""#, kind.label()),
                        out_links * kind.gbps(),
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
                &group_wire_util(
                    &format!(
                        r#"node=~"{q}F[1-4]",kind="{}""#,
                        LinkKind::IntraQfdb.label()
                    ),
                    12 * LinkKind::IntraQfdb.gbps(),
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
