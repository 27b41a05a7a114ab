//! End to end: a 2x2x1 virtual rack of 16 real `exanetd` processes on loopback, driven by
//! `exactl` exactly as an operator would: up, status, a ping over every Table-1 path class
//! the shape has, the metrics and readiness endpoints of a node on the pinged paths, down.
//!
//! Needs the `exactl` and `exanetd` binaries of the same profile (`cargo build --workspace`,
//! which `cargo test --workspace` does) or `EXANET_BIN_DIR`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use exanet_proto::topology::{self, Link, LinkKind};
use exanet_proto::{routing, NodeId, Shape};
use exanet_tests::{http_get, parse_prometheus, Run, TestRack};
use serde_json::Value;

const SHAPE: &str = "2x2x1";
const PINGS: u32 = 5;
/// Per-probe wait: generous, for a loaded machine; a healthy probe takes well under 1 ms.
const PROBE_TIMEOUT_MS: &str = "5000";
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

fn shape() -> Shape {
    SHAPE.parse().expect("valid shape")
}

fn id(shape: &Shape, name: &str) -> NodeId {
    shape
        .parse_node(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The route the fabric should take, as node names, both ends included.
fn expected_path(shape: &Shape, src: &str, dst: &str) -> Vec<String> {
    routing::path(shape, id(shape, src), id(shape, dst))
        .unwrap_or_else(|e| panic!("no route {src} -> {dst}: {e}"))
        .into_iter()
        .map(|(n, _)| shape.display(n))
        .collect()
}

/// The link joining two nodes, if they are neighbours.
fn link_between(shape: &Shape, a: &str, b: &str) -> Option<Link> {
    let (a, b) = (id(shape, a), id(shape, b));
    topology::links(shape)
        .into_iter()
        .find(|l| (l.a, l.b) == (a, b) || (l.a, l.b) == (b, a))
}

/// The report's (i, j, k) of a path: i inter-blade (torus Y/Z) hops, j intra-blade 10G
/// (torus X) hops, k intra-QFDB 16G hops. Panics on a step that is not a link.
fn ijk(shape: &Shape, path: &[String]) -> (usize, usize, usize) {
    let mut c = (0, 0, 0);
    for w in path.windows(2) {
        let l = link_between(shape, &w[0], &w[1])
            .unwrap_or_else(|| panic!("{} -> {} is not a link (path {path:?})", w[0], w[1]));
        match l.kind {
            LinkKind::TorusY | LinkKind::TorusZ => c.0 += 1,
            LinkKind::TorusX => c.1 += 1,
            LinkKind::IntraQfdb => c.2 += 1,
        }
    }
    c
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s}"))
                .to_string()
        })
        .collect()
}

/// Times `what`, printing it, so that a slow run shows where the time went.
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    eprintln!("[{:6.2} s] {what}", t.elapsed().as_secs_f64());
    r
}

#[track_caller]
fn assert_ok(what: &str, r: &Run) {
    assert!(r.success(), "{what} failed: {}", r.describe());
}

/// One Table-1 path class to probe.
struct Case {
    class: &'static str,
    src: &'static str,
    dst: &'static str,
    /// The path as Table 1 gives it, when it does.
    table1: Option<&'static [&'static str]>,
    /// (i, j, k): inter-blade, intra-blade 10G, intra-QFDB 16G hops.
    ijk: (usize, usize, usize),
}

const CASES: &[Case] = &[
    Case {
        class: "(a) intra-QFDB, 1 hop",
        src: "M1QAF1",
        dst: "M1QAF2",
        table1: Some(&["M1QAF1", "M1QAF2"]),
        ijk: (0, 0, 1),
    },
    Case {
        class: "(b) intra-mezzanine over the torus, 1 hop",
        src: "M1QAF1",
        dst: "M1QBF1",
        table1: Some(&["M1QAF1", "M1QBF1"]),
        ijk: (0, 1, 0),
    },
    Case {
        class: "(c) 2 hops via M1QBF1",
        src: "M1QAF1",
        dst: "M1QBF2",
        table1: Some(&["M1QAF1", "M1QBF1", "M1QBF2"]),
        ijk: (0, 1, 1),
    },
    Case {
        class: "(d) 3 hops",
        src: "M1QAF2",
        dst: "M1QBF3",
        table1: Some(&["M1QAF2", "M1QAF1", "M1QBF1", "M1QBF3"]),
        ijk: (0, 1, 2),
    },
    Case {
        class: "(e) inter-mezzanine, blade 1 to blade 2",
        src: "M1QAF2",
        dst: "M2QBF3",
        table1: None,
        // Up to M1QAF1, X to M1QBF1, Y to M2QBF1 (the other blade), down to M2QBF3.
        ijk: (1, 1, 2),
    },
];

/// The recorded forward and return paths of one ping.
struct Pinged {
    path: Vec<String>,
    back: Vec<String>,
}

fn ping_case(rack: &TestRack, shape: &Shape, c: &Case) -> Pinged {
    let expected = expected_path(shape, c.src, c.dst);
    if let Some(t) = c.table1 {
        assert_eq!(
            expected, t,
            "{}: the routing function disagrees with Table 1",
            c.class
        );
    }
    assert_eq!(
        ijk(shape, &expected),
        c.ijk,
        "{}: (i,j,k) of the expected path {expected:?}",
        c.class
    );
    let count = PINGS.to_string();
    let r = timed(&format!("ping {} -> {} {}", c.src, c.dst, c.class), || {
        rack.exactl(&[
            "ping",
            c.src,
            c.dst,
            "--count",
            &count,
            "--timeout-ms",
            PROBE_TIMEOUT_MS,
            "--json",
        ])
    });
    assert_ok(&format!("ping {} {} ({})", c.src, c.dst, c.class), &r);
    let v = r.json();
    let ctx = format!("{} {} -> {}: {v:#}", c.class, c.src, c.dst);
    assert_eq!(v["src"], c.src, "{ctx}");
    assert_eq!(v["dst"], c.dst, "{ctx}");
    assert_eq!(v["sent"], PINGS, "{ctx}");
    assert_eq!(v["received"], PINGS, "{ctx}");
    assert_eq!(v["truncated"], false, "{ctx}");
    let path = strings(&v["path"]);
    assert_eq!(path, expected, "recorded path; {ctx}");
    assert_eq!(
        v["hops"].as_u64(),
        Some(expected.len() as u64 - 1),
        "hops; {ctx}"
    );
    assert_eq!(
        ijk(shape, &path),
        c.ijk,
        "(i,j,k) of the recorded path; {ctx}"
    );
    // The reply is routed dimension-order from the destination: not necessarily the
    // forward path reversed (for (e) it is not).
    let back = strings(&v["back"]);
    assert_eq!(
        back,
        expected_path(shape, c.dst, c.src),
        "return path; {ctx}"
    );
    let rtt = v["rtt_us"].as_f64().unwrap_or(f64::NAN);
    assert!(rtt.is_finite() && rtt > 0.0, "rtt_us; {ctx}");
    let rtts = v["rtts_us"].as_array().expect("rtts_us");
    assert_eq!(rtts.len(), PINGS as usize, "{ctx}");
    assert!(
        rtts.iter()
            .all(|t| t.as_f64().is_some_and(|t| t.is_finite() && t > 0.0)),
        "every round trip positive; {ctx}"
    );
    Pinged { path, back }
}

/// How many times `a -> b` is a step of `path`.
fn crossings(path: &[String], a: &str, b: &str) -> u64 {
    path.windows(2).filter(|w| w[0] == a && w[1] == b).count() as u64
}

/// `exactl status --json` once every node answers it. `rack up` returned with every link
/// up, so this is normally the first answer; a daemon slow to answer on a loaded machine
/// (exactl gives each 3 s) earns a retry, a link that is down does not.
fn status_of_all_nodes(rack: &TestRack, nodes: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempt = 1;
    loop {
        let r = timed("status --json", || rack.exactl(&["status", "--json"]));
        let v = r.json();
        let answering = v["summary"]["nodes_reachable"].as_u64();
        if answering == Some(nodes as u64) || Instant::now() >= deadline {
            assert_ok("status --json", &r);
            return v;
        }
        eprintln!(
            "status attempt {attempt}: {answering:?} of {nodes} nodes answered: {}",
            r.stderr.trim_end()
        );
        attempt += 1;
    }
}

fn check_status(rack: &TestRack, shape: &Shape) {
    let v = status_of_all_nodes(rack, shape.nodes() as usize);
    let nodes = shape.nodes() as usize;
    let links = topology::links(shape);
    // Per QFDB 6 all-to-all links; X ring of 2 = one link per row (y), Y ring of 2 = one
    // link per column (x).
    assert_eq!(nodes, 16);
    assert_eq!(links.len(), 4 * 6 + 2 + 2);
    assert_eq!(v["shape"], SHAPE, "{v:#}");
    assert_eq!(v["summary"]["nodes"], nodes, "{:#}", v["summary"]);
    assert_eq!(v["summary"]["nodes_reachable"], nodes, "{:#}", v["summary"]);
    assert_eq!(v["summary"]["links"], links.len(), "{:#}", v["summary"]);
    assert_eq!(v["summary"]["links_up"], links.len(), "{:#}", v["summary"]);

    let listed = v["nodes"].as_array().expect("nodes");
    let names: BTreeSet<String> = listed
        .iter()
        .map(|n| n["node"].as_str().expect("node name").to_string())
        .collect();
    let want: BTreeSet<String> = shape.node_ids().map(|i| shape.display(i)).collect();
    assert_eq!(names, want);
    let silent: Vec<&Value> = listed.iter().filter(|n| n["reachable"] != true).collect();
    assert!(silent.is_empty(), "unreachable nodes: {silent:#?}");

    let seen: BTreeSet<(String, String, String)> = v["links"]
        .as_array()
        .expect("links")
        .iter()
        .map(|l| {
            let up = l["state"] == "up" && l["a_state"] == "up" && l["b_state"] == "up";
            assert!(up, "link not up: {l:#}");
            (
                l["a"].as_str().unwrap_or("?").to_string(),
                l["b"].as_str().unwrap_or("?").to_string(),
                l["kind"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    let want: BTreeSet<(String, String, String)> = links
        .iter()
        .map(|l| {
            (
                shape.display(l.a),
                shape.display(l.b),
                l.kind.label().to_string(),
            )
        })
        .collect();
    assert_eq!(seen, want, "the links status lists are the rack's links");
}

/// `/metrics` of `node`: the link to `peer` carried at least `min_tx` cells out and
/// `min_rx` in; every link of the node is up. `/ready` says 200.
fn check_metrics(rack: &TestRack, shape: &Shape, node: &str, peer: &str, min_tx: u64, min_rx: u64) {
    let addr = rack.metrics_addr(node);
    let link = link_between(shape, node, peer).expect("a link");
    let port = link
        .port_of(id(shape, node))
        .expect("node is an end")
        .to_string();
    let m = timed(&format!("GET {addr}/metrics ({node})"), || {
        http_get(&addr, "/metrics", HTTP_TIMEOUT)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.status, 200, "GET /metrics of {node}: {}", m.body);
    assert!(m.body.contains("exanet_link_cells_total"), "{}", m.body);
    let samples = parse_prometheus(&m.body);
    let cells = |direction: &str| -> f64 {
        let hits: Vec<_> = samples
            .iter()
            .filter(|s| {
                s.name == "exanet_link_cells_total"
                    && s.label("node") == Some(node)
                    && s.label("peer") == Some(peer)
                    && s.label("direction") == Some(direction)
            })
            .collect();
        assert_eq!(
            hits.len(),
            1,
            "one {direction} series of {node} -> {peer}:\n{}",
            m.body
        );
        assert_eq!(hits[0].label("port"), Some(port.as_str()), "{:?}", hits[0]);
        assert_eq!(
            hits[0].label("kind"),
            Some(link.kind.label()),
            "{:?}",
            hits[0]
        );
        hits[0].value
    };
    let (tx, rx) = (cells("tx"), cells("rx"));
    assert!(
        tx > 0.0 && tx >= min_tx as f64,
        "{node} -> {peer}: {tx} cells sent, the pings alone sent {min_tx}"
    );
    assert!(
        rx >= min_rx as f64,
        "{peer} -> {node}: {rx} cells received, the pings alone sent {min_rx}"
    );
    let ups: Vec<_> = samples
        .iter()
        .filter(|s| s.name == "exanet_link_up" && s.label("node") == Some(node))
        .collect();
    assert_eq!(
        ups.len(),
        topology::node_links(shape, id(shape, node)).len(),
        "{ups:?}"
    );
    assert!(ups.iter().all(|s| s.value == 1.0), "{ups:?}");

    let ready = http_get(&addr, "/ready", HTTP_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ready.status, 200, "GET /ready of {node}: {}", ready.body);
}

#[test]
fn rack_2x2x1_up_ping_every_path_class_down() {
    let t0 = Instant::now();
    let shape = shape();
    let rack = TestRack::new("rack");

    timed("rack up --shape 2x2x1", || rack.up(SHAPE, 60));

    check_status(&rack, &shape);

    let pinged: Vec<Pinged> = CASES.iter().map(|c| ping_case(&rack, &shape, c)).collect();

    // A node outside the rack is refused with exit 2 and one line naming it.
    let r = rack.exactl(&["ping", "M1QAF1", "M3QAF1"]);
    assert_eq!(r.code(), Some(2), "{}", r.describe());
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.describe());
    assert!(
        r.stderr.contains("M3QAF1") && r.stderr.contains(SHAPE),
        "{}",
        r.describe()
    );

    // M1QAF1's torus X link to M1QBF1 carries (b), (c), (d) and (e) out and their replies
    // (all but (e)'s, which returns along Y first) back.
    let (node, peer) = ("M1QAF1", "M1QBF1");
    let tx: u64 = pinged
        .iter()
        .map(|p| crossings(&p.path, node, peer) + crossings(&p.back, node, peer))
        .sum::<u64>()
        * u64::from(PINGS);
    let rx: u64 = pinged
        .iter()
        .map(|p| crossings(&p.path, peer, node) + crossings(&p.back, peer, node))
        .sum::<u64>()
        * u64::from(PINGS);
    assert_eq!((tx, rx), (20, 15), "probe cells over {node} <-> {peer}");
    check_metrics(&rack, &shape, node, peer, tx, rx);

    let down = timed("rack down", || rack.down()).unwrap_or_else(|e| panic!("{e}"));
    assert_ok("rack down", &down);
    let left = rack.processes();
    assert!(
        left.is_empty(),
        "processes of {} still running after rack down: {left:#?}",
        rack.dir.display()
    );
    let run: Vec<String> = std::fs::read_dir(rack.run_dir())
        .expect("run directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock") || n.ends_with(".pid"))
        .collect();
    assert!(run.is_empty(), "left in run/: {run:?}");
    eprintln!("total {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn bad_node_names_exit_2() {
    let rack = TestRack::new("names");
    // A well-formed name can only be checked against a rack's shape: with no rack, exactl
    // says there is none (bad input, exit 2) and how to make one.
    let r = rack.exactl(&["ping", "M9QAF1", "M1QAF1"]);
    assert_eq!(r.code(), Some(2), "{}", r.describe());
    assert!(r.stdout.is_empty(), "{}", r.describe());
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.describe());
    assert!(
        r.stderr.contains("no rack at")
            && r.stderr.contains(&*rack.dir.to_string_lossy())
            && r.stderr.contains("rack up"),
        "{}",
        r.describe()
    );
    // A malformed one is refused before the rack is looked at, naming the expected form.
    let r = rack.exactl(&["ping", "MxQAF1", "M1QAF1"]);
    assert_eq!(r.code(), Some(2), "{}", r.describe());
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.describe());
    assert!(
        r.stderr.contains("MxQAF1") && r.stderr.contains("M<blade>Q<slot>F<fpga>"),
        "{}",
        r.describe()
    );
    assert!(!rack.dir.exists(), "{} was created", rack.dir.display());
}
