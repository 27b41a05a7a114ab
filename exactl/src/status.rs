//! `exactl status`: every node and link of the rack with state and counters.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use exanet_control::control::{LinkState, LinkStatus};
use exanet_control::rack::Rack;
use exanet_proto::topology;
use exanet_proto::{NodeId, Shape};
use serde_json::{json, Value};

use crate::error::{CliError, Result};
use crate::fabric::{self, Answer, Health, LinkView};
use crate::live::{NodeServices, RackLiveness, RackServices, ServiceState};
use crate::table::{Column, Table};

/// How long one node may take to answer `status`.
const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// `exactl status`. Fails (exit 1) after printing when some node does not answer. A local
/// rack whose daemon processes are all gone is reported in one line, at once (as JSON: every
/// node unreachable, "process not running").
pub fn run(dir: &Path, as_json: bool) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let live = RackLiveness::of(&rack);
    if live.all_gone() && !as_json {
        return Err(crate::live::not_running(&rack));
    }
    // Without operator credentials no daemon can be asked; the rack is still shown, every
    // node unreachable for that reason (or because its process is gone).
    let answers = if live.all_gone() {
        shape
            .node_ids()
            .map(|id| Err(live.message(id).unwrap_or_default()))
            .collect()
    } else {
        match crate::control::client(&rack) {
            Ok(client) => fabric::query_live(&client, &live, QUERY_TIMEOUT),
            Err(e) => shape
                .node_ids()
                .map(|id| Err(live.message(id).unwrap_or_else(|| e.to_string())))
                .collect(),
        }
    };
    let views = fabric::link_views(&shape, &answers);
    let answered: Vec<std::result::Result<(), String>> = answers
        .iter()
        .map(|a| a.as_ref().map(|_| ()).map_err(Clone::clone))
        .collect();
    let services = RackServices::of(&rack, &live, &answered);
    let out = if as_json {
        let mut s = serde_json::to_string_pretty(&to_json(&rack, &answers, &views, &services))
            .map_err(|e| CliError::Failed(format!("cannot encode the status as JSON: {e}")))?;
        s.push('\n');
        s
    } else {
        render(&rack, &answers, &views, &services)
    };
    crate::stdout::out!("{out}");
    let silent = answers.iter().filter(|a| a.is_err()).count();
    let gone = live.gone_count();
    match silent {
        // Every daemon answers, but a node is whole only with its other services.
        0 => match down_services(&shape, &services) {
            down if down.is_empty() => Ok(()),
            down => Err(CliError::Failed(format!(
                "{} of the rack's services {}: {}",
                down.len(),
                if down.len() == 1 {
                    "is down"
                } else {
                    "are down"
                },
                down.join(", ")
            ))),
        },
        _ if live.all_gone() => Err(crate::live::not_running(&rack)),
        n if n == answers.len() => Err(CliError::Failed(format!(
            "no daemon of the rack at {} answers (is it up? `exactl rack up` starts it)",
            dir.display()
        ))),
        n if gone > 0 => Err(CliError::Failed(format!(
            "{n} of {} nodes did not answer ({gone} with no process running)",
            answers.len()
        ))),
        n => Err(CliError::Failed(format!(
            "{n} of {} nodes did not answer",
            answers.len()
        ))),
    }
}

fn state_label(s: LinkState) -> &'static str {
    match s {
        LinkState::Up => "up",
        LinkState::Down => "down",
    }
}

/// The JSON form: `{"rack", "dir", "shape", "summary", "nodes": [...], "links": [...]}`.
/// A node that answered is its `NodeStatus` plus `"reachable": true`; one that did not is
/// `{"node", "id", "reachable": false, "error"}`. A link carries what each end reported.
pub fn to_json(
    rack: &Rack,
    answers: &[Answer],
    views: &[LinkView<'_>],
    services: &RackServices,
) -> Value {
    let shape = rack.shape();
    let nodes: Vec<Value> = shape
        .node_ids()
        .zip(answers)
        .zip(&services.nodes)
        .map(|((id, a), sv)| {
            let mut v = match a {
                Ok(st) => {
                    let mut v = serde_json::to_value(st).unwrap_or(Value::Null);
                    if let Value::Object(m) = &mut v {
                        m.insert("reachable".into(), Value::Bool(true));
                    }
                    v
                }
                Err(e) => json!({
                    "node": shape.display(id),
                    "id": id.0,
                    "reachable": false,
                    "error": e,
                }),
            };
            if let Value::Object(m) = &mut v {
                m.insert("services".into(), services_json(sv));
                m.insert("whole".into(), Value::Bool(sv.whole()));
            }
            v
        })
        .collect();
    let links: Vec<Value> = views
        .iter()
        .map(|v| {
            let end_state = |e: Option<&LinkStatus>| e.map_or("unknown", |l| state_label(l.state));
            json!({
                "a": shape.display(v.link.a),
                "a_port": v.link.a_port.to_string(),
                "b": shape.display(v.link.b),
                "b_port": v.link.b_port.to_string(),
                "kind": v.link.kind.label(),
                "gbps": v.link.kind.gbps(),
                "state": v.health().label(),
                "a_state": end_state(v.a_end),
                "b_state": end_state(v.b_end),
                "a_end": v.a_end,
                "b_end": v.b_end,
            })
        })
        .collect();
    let up = views.iter().filter(|v| v.health() == Health::Up).count();
    json!({
        "rack": rack.file.name,
        "dir": rack.dir.display().to_string(),
        "shape": shape.to_string(),
        "summary": {
            "nodes": answers.len(),
            "nodes_reachable": answers.iter().filter(|a| a.is_ok()).count(),
            "links": views.len(),
            "links_up": up,
            "links_half": views.iter().filter(|v| v.health() == Health::Half).count(),
            "nodes_whole": services.nodes.iter().filter(|n| n.whole()).count(),
            "services_down": services.down_count(),
        },
        "supervisor": match services.supervisor {
            None => Value::Null,
            Some(pid) => json!({ "running": pid.is_some(), "pid": pid }),
        },
        "nodes": nodes,
        "links": links,
    })
}

/// `{"state": "up", "pid": 123}` (and `"error"` when down), for one service.
fn service_json(s: &ServiceState) -> Value {
    let mut v = json!({ "state": s.label() });
    if let Some(pid) = s.pid() {
        v["pid"] = json!(pid);
    }
    if let ServiceState::Down(why) = s {
        v["error"] = json!(why);
    }
    v
}

/// A node's `"services"`: its daemon, its IP service (with the supervisor's restarts) and
/// its namespace.
fn services_json(sv: &NodeServices) -> Value {
    let mut ip = service_json(&sv.ip);
    ip["restarts"] = json!(sv.ip_restarts.count);
    if let Some(t) = sv.ip_restarts.last {
        ip["last_restart_unix"] = json!(t);
    }
    let mut netns = service_json(&sv.netns);
    if let Some(n) = &sv.netns_name {
        netns["name"] = json!(n);
    }
    json!({
        "daemon": service_json(&sv.daemon),
        "ip": ip,
        "netns": netns,
    })
}

/// `M1QBF2 IP service (not running (pid 1234 exited); ...)` for each service down or
/// paused, for the error that ends `exactl status`.
fn down_services(shape: &Shape, services: &RackServices) -> Vec<String> {
    shape
        .node_ids()
        .zip(&services.nodes)
        .flat_map(|(id, sv)| {
            sv.down()
                .into_iter()
                .map(move |(what, s)| format!("{} {what} {}", shape.display(id), s.label()))
        })
        .collect()
}

/// One line per service down or paused: `  M1QBF2 IP service: down: not running (...)`.
fn service_lines(shape: &Shape, services: &RackServices) -> String {
    let mut out = String::new();
    for (id, sv) in shape.node_ids().zip(&services.nodes) {
        for (what, s) in sv.down() {
            let why = match s {
                ServiceState::Down(why) => why.clone(),
                ServiceState::Paused { pid } => format!(
                    "pid {pid} stopped (SIGSTOP); `exactl node resume {}` lets it run",
                    shape.display(id)
                ),
                _ => continue,
            };
            let _ = writeln!(out, "  {} {what}: {}: {why}", shape.display(id), s.label());
        }
    }
    out
}

/// The human form: a summary line, a table of nodes and a table of links.
pub fn render(
    rack: &Rack,
    answers: &[Answer],
    views: &[LinkView<'_>],
    services: &RackServices,
) -> String {
    let shape = rack.shape();
    let reachable = answers.iter().filter(|a| a.is_ok()).count();
    let up = views.iter().filter(|v| v.health() == Health::Up).count();
    let ip = services.supervisor.is_some();
    let ip_up = if ip {
        let n = services
            .nodes
            .iter()
            .filter(|n| matches!(n.ip, ServiceState::Up { .. }))
            .count();
        format!(", {n}/{} IP services up", services.nodes.len())
    } else {
        String::new()
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rack {:?} ({shape}) at {}: {reachable}/{} nodes answering, {up}/{} links up{ip_up}",
        rack.file.name,
        rack.dir.display(),
        answers.len(),
        views.len()
    );
    if services.supervisor == Some(None) {
        let _ = writeln!(
            out,
            "the rack's supervisor is not running: an IP service that dies stays down \
             (`exactl node restart NODE` starts the node's again, and the supervisor with it)"
        );
    }
    out.push('\n');
    out.push_str(&node_table(&shape, answers, services));
    let down = service_lines(&shape, services);
    if !down.is_empty() {
        out.push_str("\nservices down:\n");
        out.push_str(&down);
    }
    let workloads = workload_table(answers);
    if !workloads.is_empty() {
        out.push_str("\nworkloads:\n");
        out.push_str(&workloads);
    }
    let reserved = reserved_lines(answers);
    if !reserved.is_empty() {
        out.push_str("\nreserved on every node (no job may take them):\n");
        out.push_str(&reserved);
    }
    let errors = error_lines(answers);
    if !errors.is_empty() {
        out.push_str("\nerrors:\n");
        out.push_str(&errors);
    }
    out.push('\n');
    out.push_str(&link_table(&shape, views));
    out
}

/// The node table. STATE is `up` for a whole node, `down` when its daemon does not
/// answer, `degraded` when it does but another of its services is down; with IP over
/// ExaNet, DAEMON, IP and NETNS show each service and RESTARTS the supervisor's restarts
/// of the IP service and of the daemon (as the daemon reports them).
fn node_table(shape: &Shape, answers: &[Answer], services: &RackServices) -> String {
    let ip = services.supervisor.is_some();
    let mut headers = vec!["NODE", "STATE"];
    if ip {
        headers.extend(["DAEMON", "IP", "NETNS", "RESTARTS"]);
    }
    headers.extend([
        "LINKS",
        "FORWARDED",
        "INJECTED",
        "DELIVERED",
        "ERRORS",
        "UPTIME",
    ]);
    let rows = shape
        .node_ids()
        .zip(answers)
        .zip(&services.nodes)
        .map(|((id, a), sv)| {
            let state = match (a, sv.whole()) {
                (Err(_), _) => "down",
                (Ok(_), true) => "up",
                (Ok(_), false) => "degraded",
            };
            let mut r = vec![shape.display(id), state.to_string()];
            if ip {
                r.extend([
                    sv.daemon.label().to_string(),
                    sv.ip.label().to_string(),
                    sv.netns.label().to_string(),
                    (sv.ip_restarts.count + a.as_ref().map_or(0, |st| st.restarts)).to_string(),
                ]);
            }
            match a {
                Ok(st) => r.extend([
                    format!("{}/{}", st.links_up(), expected_links(shape, id)),
                    st.forwarded_cells.to_string(),
                    st.injected_cells.to_string(),
                    st.delivered_cells.to_string(),
                    st.errors.values().sum::<u64>().to_string(),
                    duration(st.uptime_seconds),
                ]),
                Err(e) => {
                    r.extend(vec!["-".to_string(); 5]);
                    r.push(e.clone());
                }
            }
            r
        })
        .collect();
    let mut right = vec![false, false];
    if ip {
        right.extend([false, false, false, true]);
    }
    right.extend([true, true, true, true, true, false]);
    table(&headers, &right, rows)
}

/// What the nodes keep for their owners: the same on every node, so told once, from the
/// first node that answered.
fn reserved_lines(answers: &[Answer]) -> String {
    let Some(st) = answers.iter().find_map(|a| a.as_ref().ok()) else {
        return String::new();
    };
    st.ni
        .reserved
        .iter()
        .map(|r| format!("  {}: {}\n", r.resource, r.owner))
        .collect()
}

/// Who holds what of each node's NI: one row per attached workload (empty: none attached).
fn workload_table(answers: &[Answer]) -> String {
    let rows: Vec<Vec<String>> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .flat_map(|st| {
            st.ni.workloads.iter().map(|w| {
                vec![
                    st.node.clone(),
                    w.rank.to_string(),
                    w.job.clone(),
                    w.pdid.to_string(),
                    w.pid.to_string(),
                    w.uid.to_string(),
                    w.rdma_pages.to_string(),
                    w.packetizers.to_string(),
                    w.mailboxes.to_string(),
                    bytes(w.registered_bytes),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    table(
        &[
            "NODE", "RANK", "JOB", "PDID", "PID", "UID", "PAGES", "PKTZ", "MBOX", "MEMORY",
        ],
        &[false, true, false, true, true, true, true, true, true, true],
        rows,
    )
}

fn expected_links(shape: &Shape, id: NodeId) -> usize {
    topology::Port::all()
        .filter(|&p| topology::neighbour(shape, id, p).is_some())
        .count()
}

/// `  M1QAF1: crc=3 no_route=1` for every node with nonzero error counters.
fn error_lines(answers: &[Answer]) -> String {
    let mut out = String::new();
    for st in answers.iter().filter_map(|a| a.as_ref().ok()) {
        let nonzero: Vec<String> = st
            .errors
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        if !nonzero.is_empty() {
            let _ = writeln!(out, "  {}: {}", st.node, nonzero.join(" "));
        }
    }
    out
}

fn link_table(shape: &Shape, views: &[LinkView<'_>]) -> String {
    let headers = [
        "LINK",
        "KIND",
        "STATE",
        "A>B CELLS tx/rx",
        "A>B BYTES tx/rx",
        "B>A CELLS tx/rx",
        "B>A BYTES tx/rx",
        "STALL s A/B",
        "QUEUE A/B",
        "FAULTS A>B / B>A",
    ];
    let rows = views
        .iter()
        .map(|v| {
            let (a, b) = (v.a_end, v.b_end);
            let num = |e: Option<&LinkStatus>, f: fn(&LinkStatus) -> u64| {
                e.map_or_else(|| "-".to_string(), |l| f(l).to_string())
            };
            let size = |e: Option<&LinkStatus>, f: fn(&LinkStatus) -> u64| {
                e.map_or_else(|| "-".to_string(), |l| bytes(f(l)))
            };
            vec![
                format!(
                    "{} <-> {}",
                    shape.display(v.link.a),
                    shape.display(v.link.b)
                ),
                v.link.kind.label().to_string(),
                // A link the operator cut says so: "down" alone would read as a failure.
                if [a, b].iter().any(|e| e.is_some_and(|l| l.admin_down)) {
                    "cut".to_string()
                } else {
                    v.health().label().to_string()
                },
                format!("{}/{}", num(a, |l| l.tx_cells), num(b, |l| l.rx_cells)),
                format!("{}/{}", size(a, |l| l.tx_bytes), size(b, |l| l.rx_bytes)),
                format!("{}/{}", num(b, |l| l.tx_cells), num(a, |l| l.rx_cells)),
                format!("{}/{}", size(b, |l| l.tx_bytes), size(a, |l| l.rx_bytes)),
                format!(
                    "{}/{}",
                    a.map_or_else(|| "-".into(), |l| format!("{:.2}", l.stall_seconds)),
                    b.map_or_else(|| "-".into(), |l| format!("{:.2}", l.stall_seconds))
                ),
                format!(
                    "{}/{}",
                    num(a, |l| l.queue_cells),
                    num(b, |l| l.queue_cells)
                ),
                {
                    let faults = |e: Option<&LinkStatus>| {
                        e.and_then(|l| l.faults)
                            .map_or_else(|| "-".to_string(), |f| crate::faults::describe(&f))
                    };
                    match (faults(a), faults(b)) {
                        (x, y) if x == "-" && y == "-" => "-".to_string(),
                        (x, y) => format!("{x} / {y}"),
                    }
                },
            ]
        })
        .collect();
    table(
        &headers,
        &[
            false, false, false, true, true, true, true, true, true, false,
        ],
        rows,
    )
}

/// Columns padded to their widest cell, two blanks apart; `right[i]` right-aligns
/// column i.
fn table(headers: &[&'static str], right: &[bool], rows: Vec<Vec<String>>) -> String {
    let columns = headers
        .iter()
        .zip(right)
        .map(|(h, r)| {
            if *r {
                Column::right(h)
            } else {
                Column::left(h)
            }
        })
        .collect();
    Table::new(columns).with_gap(2).rows(rows).render()
}

/// `0`, `512B`, `2.5K`, `1.2M`, `3.4G` (binary units).
pub fn bytes(n: u64) -> String {
    if n == 0 {
        return "0".into();
    }
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v < 10.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

/// `42s`, `3m05s`, `2h01m`, `3d04h`.
fn duration(secs: f64) -> String {
    let s = if secs.is_finite() && secs > 0.0 {
        secs as u64
    } else {
        0
    };
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::tests::healthy_rack;
    use exanet_control::rack::RackFile;

    /// The services of a rack without IP over ExaNet, as its daemons answered.
    fn no_ip(answers: &[Answer]) -> RackServices {
        RackServices {
            nodes: answers
                .iter()
                .map(|a| NodeServices {
                    daemon: match a {
                        Ok(_) => ServiceState::Up { pid: Some(1234) },
                        Err(e) => ServiceState::Down(e.clone()),
                    },
                    ip: ServiceState::Off,
                    netns: ServiceState::Off,
                    netns_name: None,
                    ip_restarts: Default::default(),
                })
                .collect(),
            supervisor: None,
        }
    }

    fn rack(shape: &str) -> Rack {
        let shape: Shape = shape.parse().unwrap();
        let mut file =
            RackFile::loopback("t", shape, |id| (20000 + id.0 as u16, 30000 + id.0 as u16));
        file.window = 65536;
        file.local_window = 65536;
        Rack::new(Path::new("/r"), file).unwrap()
    }

    #[test]
    fn json_lists_every_node_and_link() {
        let r = rack("1x1x1");
        let mut answers = healthy_rack(&r.shape());
        answers[2] = Err("no control socket".into());
        let views = fabric::link_views(&r.shape(), &answers);
        let v = to_json(&r, &answers, &views, &no_ip(&answers));
        assert_eq!(v["shape"], "1x1x1");
        let nodes = v["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0]["reachable"], true);
        assert_eq!(nodes[0]["node"], "M1QAF1");
        assert_eq!(nodes[2]["reachable"], false);
        assert_eq!(nodes[2]["node"], "M1QAF3");
        let links = v["links"].as_array().unwrap();
        assert_eq!(links.len(), 6);
        let half = links.iter().filter(|l| l["state"] == "half").count();
        assert_eq!(half, 3);
        assert_eq!(v["summary"]["links_up"], 3);
        let l = &links[0];
        assert_eq!(
            (l["a"].as_str(), l["b"].as_str()),
            (Some("M1QAF1"), Some("M1QAF2"))
        );
        assert_eq!(l["kind"], "qfdb");
        assert_eq!(l["a_end"]["tx_cells"], 10);
    }

    #[test]
    fn human_tables_show_states_and_counters() {
        let r = rack("2x1x1");
        let mut answers = healthy_rack(&r.shape());
        answers[5] = Err("no control socket".into());
        if let Ok(st) = &mut answers[0] {
            st.errors.insert("crc".into(), 3);
        }
        let views = fabric::link_views(&r.shape(), &answers);
        let text = render(&r, &answers, &views, &no_ip(&answers));
        assert!(text.contains("7/8 nodes answering"), "{text}");
        assert!(text.contains("M1QAF1: crc=3"), "{text}");
        let f1 = text.lines().find(|l| l.starts_with("M1QAF1 ")).unwrap();
        assert!(f1.contains(" up ") && f1.contains("4/4"), "{f1}");
        let down = text.lines().find(|l| l.starts_with("M1QBF2 ")).unwrap();
        assert!(
            down.contains("down") && down.contains("no control socket"),
            "{down}"
        );
        let torus = text
            .lines()
            .find(|l| l.starts_with("M1QAF1 <-> M1QBF1"))
            .unwrap();
        assert!(
            torus.contains("torus_x") && torus.contains(" up "),
            "{torus}"
        );
        assert!(
            torus.contains("10/10") && torus.contains("2.5K/2.5K"),
            "{torus}"
        );
        let half = text
            .lines()
            .find(|l| l.starts_with("M1QBF1 <-> M1QBF2"))
            .unwrap();
        assert!(half.contains("half") && half.contains("10/-"), "{half}");
        assert!(
            torus.trim_end().ends_with(" -"),
            "no faults shown as -: {torus}"
        );

        // Faults set on a link show in words, per direction; a cut link says "cut".
        let mut answers = healthy_rack(&r.shape());
        for (i, peer, f) in [
            (0, "M1QBF1", r#"{"loss":0.01}"#),
            (4, "M1QAF1", r#"{"down":true}"#),
        ] {
            let Ok(st) = &mut answers[i] else { panic!() };
            let l = st.links.iter_mut().find(|l| l.peer == peer).unwrap();
            l.faults = Some(serde_json::from_str(f).unwrap());
            l.admin_down = l.faults.unwrap().down;
        }
        let views = fabric::link_views(&r.shape(), &answers);
        let text = render(&r, &answers, &views, &no_ip(&answers));
        let torus = text
            .lines()
            .find(|l| l.starts_with("M1QAF1 <-> M1QBF1"))
            .unwrap();
        assert!(torus.contains(" cut "), "{torus}");
        assert!(torus.trim_end().ends_with("loss 1% / down"), "{torus}");
    }

    #[test]
    fn attached_workloads_are_listed_with_what_they_hold() {
        let r = rack("1x1x1");
        let mut answers = healthy_rack(&r.shape());
        let text = render(
            &r,
            &answers,
            &fabric::link_views(&r.shape(), &answers),
            &no_ip(&answers),
        );
        assert!(!text.contains("workloads:"), "{text}");
        if let Ok(st) = &mut answers[1] {
            st.ni
                .workloads
                .push(exanet_control::control::WorkloadStatus {
                    rank: 3,
                    job: "alice".into(),
                    pdid: 42,
                    pid: 4242,
                    uid: 1001,
                    rdma_pages: 2,
                    packetizers: 1,
                    mailboxes: 5,
                    registered_bytes: 64 << 20,
                });
        }
        let text = render(
            &r,
            &answers,
            &fabric::link_views(&r.shape(), &answers),
            &no_ip(&answers),
        );
        let row = text
            .lines()
            .skip_while(|l| *l != "workloads:")
            .find(|l| l.starts_with("M1QAF2 "))
            .unwrap_or_else(|| panic!("{text}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols,
            ["M1QAF2", "3", "alice", "42", "4242", "1001", "2", "1", "5", "64M"],
            "{row}"
        );
    }

    #[test]
    fn reservations_are_told_once() {
        let r = rack("1x1x1");
        let mut answers = healthy_rack(&r.shape());
        let kept = exanet_proto::reserved::Reservations::with_service(exanet_proto::Pdid(65535));
        for st in answers.iter_mut().flatten() {
            st.ni.reserved = kept.list();
        }
        let text = render(
            &r,
            &answers,
            &fabric::link_views(&r.shape(), &answers),
            &no_ip(&answers),
        );
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("reserved on every node"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert_eq!(
            section,
            [
                "  rank 7: the IP service (PDID 65535)",
                "  mailbox 63: the IP service (PDID 65535)",
                "  mailboxes 48..55: rank r, mailbox 48 + r (its collective mailbox)",
            ],
            "{text}"
        );
    }

    /// Issue 48: a node whose IP service died showed as up.
    #[test]
    fn a_node_without_its_ip_service_is_not_whole_and_says_why() {
        let r = rack("2x1x1");
        let answers = healthy_rack(&r.shape());
        let mut services = no_ip(&answers);
        services.supervisor = Some(Some(4321));
        for (i, n) in services.nodes.iter_mut().enumerate() {
            n.ip = ServiceState::Up {
                pid: Some(2000 + i as i32),
            };
            n.netns = ServiceState::Up { pid: None };
            n.netns_name = Some(format!("exanet-t-{i}"));
        }
        services.nodes[5].ip = ServiceState::Down(
            "not running (pid 2005 exited); the rack's supervisor starts it again".into(),
        );
        services.nodes[5].ip_restarts = crate::ip_service::Restarts {
            count: 2,
            last: Some(1_796_615_655),
        };
        services.nodes[6].ip = ServiceState::Paused { pid: 2006 };
        let views = fabric::link_views(&r.shape(), &answers);
        let text = render(&r, &answers, &views, &services);
        assert!(
            text.contains("8/8 nodes answering, 13/13 links up, 6/8 IP services up"),
            "{text}"
        );
        let row = text.lines().find(|l| l.starts_with("M1QBF2 ")).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols[..6],
            ["M1QBF2", "degraded", "up", "down", "up", "2"],
            "{row}"
        );
        let whole = text.lines().find(|l| l.starts_with("M1QAF1 ")).unwrap();
        let cols: Vec<&str> = whole.split_whitespace().collect();
        assert_eq!(
            cols[..6],
            ["M1QAF1", "up", "up", "up", "up", "0"],
            "{whole}"
        );
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "services down:")
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert_eq!(
            section,
            [
                "  M1QBF2 IP service: down: not running (pid 2005 exited); the rack's \
                 supervisor starts it again",
                "  M1QBF3 IP service: paused: pid 2006 stopped (SIGSTOP); `exactl node resume \
                 M1QBF3` lets it run",
            ],
            "{text}"
        );
        assert!(!text.contains("supervisor is not running"), "{text}");
        assert_eq!(
            down_services(&r.shape(), &services),
            ["M1QBF2 IP service down", "M1QBF3 IP service paused"]
        );
        let v = to_json(&r, &answers, &views, &services);
        let n = &v["nodes"][5];
        assert_eq!(n["whole"], false);
        assert_eq!(n["services"]["ip"]["state"], "down");
        assert_eq!(n["services"]["ip"]["restarts"], 2);
        assert_eq!(n["services"]["ip"]["last_restart_unix"], 1_796_615_655u64);
        assert_eq!(n["services"]["netns"]["name"], "exanet-t-5");
        assert_eq!(v["nodes"][0]["services"]["ip"]["pid"], 2000);
        assert_eq!(v["summary"]["services_down"], 2);
        assert_eq!(v["summary"]["nodes_whole"], 6);
        assert_eq!(v["supervisor"]["pid"], 4321);

        // Nothing supervising: said once, at the top.
        services.supervisor = Some(None);
        let text = render(&r, &answers, &views, &services);
        assert!(
            text.lines()
                .nth(1)
                .unwrap()
                .contains("supervisor is not running"),
            "{text}"
        );
    }

    #[test]
    fn sizes_and_durations_are_short() {
        assert_eq!(bytes(0), "0");
        assert_eq!(bytes(1000), "1000B");
        assert_eq!(bytes(2560), "2.5K");
        assert_eq!(bytes(300 << 20), "300M");
        assert_eq!(duration(5.7), "5s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(f64::NAN), "0s");
        assert_eq!(duration(90000.0), "1d01h");
    }
}
