//! The rack view in a browser: a 2x1x1 rack (two QFDBs joined by the torus link
//! M1QAF1 <-> M1QBF1), Debian's Prometheus started by `exactl rack prometheus` scraping it
//! every second, RDMA traffic from M1QAF2 to M1QBF3 (dimension-order routing takes it
//! through both F1s and the torus link), then headless Chromium renders the console pages
//! Prometheus serves. The rendered rack view must have every link direction of the
//! topology, each with a number for its utilization, and the directions the traffic took
//! must be busier than every other; the link and node pages must render values. A
//! screenshot goes to `<target>/test-artifacts/rack-view.png`.
//!
//! Needs `chromium` and `prometheus` (Debian's packages): without them it says SKIPPED
//! and passes, unless `EXANET_REQUIRE_BROWSER` is set to anything (CI), which makes that a failure. Needs
//! `exactl`, `exanetd` and `exanet-perf` of the same profile (`cargo build --workspace`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use exanet_proto::topology::{self, LinkKind};
use exanet_proto::{routing, Shape};
use exanet_tests::{http_get, run_with_timeout, TestRack};

const SHAPE: &str = "2x1x1";
/// The traffic: a writer on SRC, its server on DST, on different QFDBs.
const SRC: &str = "M1QAF2";
const DST: &str = "M1QBF3";
const HTTP_TIMEOUT: Duration = Duration::from_secs(20);
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);

/// The cargo target directory this test was built in: `$CARGO_TARGET_DIR`, else the
/// directory above the profile's (the test binary runs from `target/<profile>/deps/`).
fn target_dir() -> PathBuf {
    if let Some(v) = std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        return std::path::absolute(PathBuf::from(v)).expect("an absolute CARGO_TARGET_DIR");
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .filter(|d| d.file_name().is_some_and(|n| n == "deps"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| {
            panic!(
                "{} is not in a cargo target directory (<target>/<profile>/deps/); set \
                 CARGO_TARGET_DIR",
                exe.display()
            )
        })
}

/// `name` on PATH, if it is there.
fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `s` percent-encoded for a URL's query string.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The programs the test drives besides the rack's own, or why it cannot run.
struct Tools {
    chromium: PathBuf,
}

fn tools() -> Option<Tools> {
    let chromium = find_on_path("chromium");
    let prometheus = std::env::var_os("EXANET_PROMETHEUS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| find_on_path("prometheus"));
    let missing: Vec<&str> = [
        ("chromium", chromium.is_none()),
        ("prometheus", prometheus.is_none()),
    ]
    .iter()
    .filter(|(_, gone)| *gone)
    .map(|(n, _)| *n)
    .collect();
    if missing.is_empty() {
        return chromium.map(|chromium| Tools { chromium });
    }
    let why = format!(
        "no {} (Debian: apt-get install {})",
        missing.join(", no "),
        missing.join(" ")
    );
    exanet_tests::skip_unless_required("EXANET_REQUIRE_BROWSER", "rack view browser test", &why);
    None
}

/// The tags of `html` that carry attribute `attr`: each tag's offset and attributes, values
/// with their character references decoded (browsers serialise `>` in attributes as
/// `&gt;`, Prometheus' templates escape what they insert).
fn tags_with(html: &str, attr: &str) -> Vec<(usize, BTreeMap<String, String>)> {
    let needle = format!(" {attr}=\"");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = html[from..].find(&needle).map(|i| i + from) {
        from = i + needle.len();
        let Some(start) = html[..i].rfind('<') else {
            continue;
        };
        if out.iter().any(|(s, _)| *s == start) {
            continue;
        }
        out.push((start, attributes(&html[start..])));
    }
    out
}

/// The attributes of the tag `tag` starts with.
fn attributes(tag: &str) -> BTreeMap<String, String> {
    let mut attrs = BTreeMap::new();
    let body = tag.trim_start_matches('<');
    let mut rest = body.find(char::is_whitespace).map_or("", |i| &body[i..]);
    loop {
        rest = rest.trim_start();
        if rest.is_empty() || rest.starts_with('>') || rest.starts_with("/>") {
            break;
        }
        let name_end = rest
            .find(|c: char| c == '=' || c == '>' || c.is_whitespace())
            .unwrap_or(rest.len());
        let name = rest[..name_end].to_string();
        rest = &rest[name_end..];
        if let Some(r) = rest.strip_prefix("=\"") {
            let end = r.find('"').unwrap_or(r.len());
            attrs.insert(name, unescape(&r[..end]));
            rest = &r[(end + 1).min(r.len())..];
        } else {
            attrs.insert(name, String::new());
        }
    }
    attrs
}

fn unescape(s: &str) -> String {
    s.replace("&gt;", ">")
        .replace("&lt;", "<")
        .replace("&quot;", "\"")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#43;", "+")
        .replace("&amp;", "&")
}

/// The numbers (`data-value`) of view `view` (for link direction `dir`, if given) on a
/// console page: those after its `data-view` tag up to the next one.
fn view_values(html: &str, view: &str, dir: Option<&str>) -> Vec<f64> {
    let views = tags_with(html, "data-view");
    let Some(k) = views.iter().position(|(_, a)| {
        a.get("data-view").map(String::as_str) == Some(view)
            && dir.is_none_or(|d| a.get("data-dir").map(String::as_str) == Some(d))
    }) else {
        panic!("no data-view={view:?} (dir {dir:?}) on the page");
    };
    let start = views[k].0;
    let end = views.get(k + 1).map_or(html.len(), |v| v.0);
    tags_with(&html[start..end], "data-value")
        .iter()
        .filter_map(|(_, a)| a.get("data-value")?.parse().ok())
        .collect()
}

/// Runs headless Chromium with `args` and then `url`, with a profile of its own under
/// `profile`; its stdout.
fn chromium(tools: &Tools, profile: &Path, args: &[&str], url: &str) -> String {
    let mut c = Command::new(&tools.chromium);
    c.args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url);
    let r = run_with_timeout(c, BROWSER_TIMEOUT).unwrap_or_else(|e| panic!("chromium: {e}"));
    assert!(
        r.success(),
        "chromium {args:?} {url} failed: {}",
        r.describe()
    );
    r.stdout
}

/// An instant query of Prometheus' HTTP API: the value of its first sample.
fn prom_value(addr: &str, query: &str) -> Option<f64> {
    let path = format!("/api/v1/query?query={}", url_encode(query));
    let r = http_get(addr, &path, HTTP_TIMEOUT).ok()?;
    let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// Waits until Prometheus has scraped all `nodes` daemons, each after `after` (unix time).
fn wait_for_scrape(addr: &str, after: f64, nodes: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let last = prom_value(addr, r#"min(timestamp(up{job="exanet"}))"#);
        let scraped = prom_value(addr, r#"count(up{job="exanet"} == 1)"#);
        if last.is_some_and(|t| t > after + 0.05) && scraped == Some(f64::from(nodes)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape all {nodes} daemons after unix time {after:.1} \
             (last scrape {last:?}, {scraped:?} targets up)"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every `expr` of a Grafana dashboard's targets.
fn grafana_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if let (Some(serde_json::Value::String(e)), true) =
                (m.get("expr"), m.contains_key("refId"))
            {
                out.push(e.clone());
            }
            m.values().for_each(|v| grafana_exprs(v, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| grafana_exprs(v, out)),
        _ => {}
    }
}

/// True when `pid` exists and is not a zombie (whose parent, gone, cannot reap it).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[test]
fn rack_view_shows_the_busy_path() {
    let Some(tools) = tools() else { return };
    let t0 = Instant::now();
    let shape: Shape = SHAPE.parse().unwrap();
    let rack = TestRack::new("view");
    let perf = rack.bins.exactl.with_file_name("exanet-perf");
    assert!(
        perf.is_file(),
        "{} not found: build it with the same profile (`cargo build --workspace`)",
        perf.display()
    );
    rack.up(SHAPE, 30);

    let r = rack.exactl(&["rack", "prometheus", "--scrape-interval", "1s"]);
    assert!(r.success(), "exactl rack prometheus: {}", r.describe());
    let url = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("rack view: "))
        .unwrap_or_else(|| panic!("no rack view URL in: {}", r.describe()))
        .trim()
        .to_string();
    let addr = url
        .strip_prefix("http://")
        .and_then(|u| u.split('/').next())
        .unwrap_or_else(|| panic!("{url} is not http://ADDR/..."))
        .to_string();
    let prom_pid: i32 = std::fs::read_to_string(rack.dir.join("prometheus/prometheus.pid"))
        .ok()
        .and_then(|t| t.lines().next()?.trim().parse().ok())
        .expect("exactl rack prometheus writes its pid file");

    // The path the traffic takes, from the routing function.
    let src = shape.parse_node(SRC).unwrap();
    let dst = shape.parse_node(DST).unwrap();
    let hops: Vec<String> = routing::path(&shape, src, dst)
        .unwrap()
        .into_iter()
        .map(|(n, _)| shape.display(n))
        .collect();
    let on_path: BTreeSet<String> = hops
        .windows(2)
        .map(|w| format!("{}->{}", w[0], w[1]))
        .collect();
    let links = topology::links(&shape);
    // The torus link the path crosses, in the direction it crosses it.
    let torus_hop = hops
        .windows(2)
        .find(|w| {
            let (a, b) = (
                shape.parse_node(&w[0]).unwrap(),
                shape.parse_node(&w[1]).unwrap(),
            );
            links
                .iter()
                .any(|l| (l.a, l.b) == (a.min(b), a.max(b)) && l.kind != LinkKind::IntraQfdb)
        })
        .map(|w| format!("{}->{}", w[0], w[1]))
        .unwrap_or_else(|| panic!("the path {hops:?} crosses no torus link"));

    // A scrape of every daemon before the traffic, so that what it adds shows as an
    // increase (a series first scraped after the traffic would have none).
    wait_for_scrape(&addr, unix_now(), shape.nodes());

    // Traffic: RDMA writes from SRC into a server on DST.
    let server_log = rack.dir.join("logs/perf-server.log");
    let log = std::fs::File::create(&server_log).unwrap();
    let server = exanet_tests::KillOnDrop(
        Command::new(&perf)
            .args(["rdma-bw", "serve", "--sessions", "1"])
            .env("EXANET_RACK", &rack.dir)
            .env("EXANET_NODE", DST)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut client = Command::new(&perf);
    client
        .args(["rdma-bw", "run", "--peer", DST, "--sizes", "64K"])
        .args(["--iterations", "400", "--warmup", "10", "--quiet", "--json"])
        .env("EXANET_RACK", &rack.dir)
        .env("EXANET_NODE", SRC);
    let run = run_with_timeout(client, Duration::from_secs(90)).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        run.success(),
        "exanet-perf rdma-bw run: {}\n--- server:\n{}",
        run.describe(),
        std::fs::read_to_string(&server_log).unwrap_or_default()
    );
    let ended = unix_now();
    drop(server);

    eprintln!(
        "traffic: {:.1} s, {}",
        run.elapsed.as_secs_f64(),
        run.stdout.trim()
    );
    wait_for_scrape(&addr, ended, shape.nodes());

    // The rack view as the browser renders it.
    let profile = rack.dir.join("chromium");
    let dom = chromium(&tools, &profile, &["--dump-dom"], &url);
    assert!(
        !dom.contains("error executing template"),
        "the rack view failed to render:\n{dom}"
    );
    let mut util: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (_, a) in tags_with(&dom, "data-link") {
        let link = a["data-link"].clone();
        let num = |k: &str| -> f64 {
            let v = a.get(k).unwrap_or_else(|| panic!("{link} has no {k}"));
            let x: f64 = v
                .parse()
                .unwrap_or_else(|_| panic!("{link}: {k}={v:?} is not a number"));
            assert!(x.is_finite() && x >= 0.0, "{link}: {k}={v}");
            x
        };
        let (u, w) = (num("data-util"), num("data-wire-util"));
        assert_eq!(
            a.get("data-up").map(String::as_str),
            Some("1"),
            "{link}: {a:?}"
        );
        assert!(
            util.insert(link.clone(), (u, w)).is_none(),
            "{link} drawn twice"
        );
    }
    let expected: BTreeSet<String> = links
        .iter()
        .flat_map(|l| {
            let (a, b) = (shape.display(l.a), shape.display(l.b));
            [format!("{a}->{b}"), format!("{b}->{a}")]
        })
        .collect();
    assert_eq!(util.len(), 2 * links.len());
    assert_eq!(
        util.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "the rack view's link directions are not the topology's"
    );
    let table = util
        .iter()
        .map(|(k, (u, w))| {
            let mark = if on_path.contains(k) { "*" } else { " " };
            format!("{mark} {k:16} modeled {u:.6} wire {w:.6}")
        })
        .collect::<Vec<_>>()
        .join("\n");
    for (what, pick) in [
        ("modeled", (|v: &(f64, f64)| v.0) as fn(&(f64, f64)) -> f64),
        ("wire", |v: &(f64, f64)| v.1),
    ] {
        let least_on = on_path
            .iter()
            .map(|d| pick(&util[d]))
            .fold(f64::INFINITY, f64::min);
        let most_off = util
            .iter()
            .filter(|(d, _)| !on_path.contains(*d))
            .map(|(_, v)| pick(v))
            .fold(0.0, f64::max);
        assert!(
            least_on > most_off,
            "{what} utilization: the path {hops:?} is not busier than every other link \
             direction (* on the path):\n{table}"
        );
    }
    // Idle directions are 0, not missing: F3 and F4 of the first QFDB carried nothing.
    assert_eq!(util["M1QAF3->M1QAF4"], (0.0, 0.0), "{table}");

    // A picture of it.
    let shot = target_dir().join("test-artifacts/rack-view.png");
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&shot);
    chromium(
        &tools,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1000",
        ],
        &url,
    );
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
    assert!(
        png.len() > 10_000 && png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG of the page ({} bytes)",
        shot.display(),
        png.len()
    );

    // The page of the torus hop and the node that sent: values, no template errors.
    let (a, b) = torus_hop.split_once("->").unwrap();
    let page = |path: &str| -> String {
        let r = http_get(&addr, path, HTTP_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        assert!(
            !r.body.contains("error executing template"),
            "GET {path} failed to render:\n{}",
            r.body
        );
        r.body
    };
    let link = page(&format!(
        "/consoles/exanet-link.html?node={}&peer={}",
        url_encode(a),
        url_encode(b)
    ));
    for view in ["throughput", "modeled_util", "wire_util"] {
        let v = view_values(&link, view, Some(&torus_hop));
        assert!(
            v.len() == 1 && v[0] > 0.0,
            "link page of {torus_hop}: {view} = {v:?}"
        );
    }
    assert_eq!(view_values(&link, "link_up", Some(&torus_hop)), [1.0]);
    let back = format!("{b}->{a}");
    assert_eq!(view_values(&link, "link_up", Some(&back)), [1.0]);
    let node = page(&format!("/consoles/exanet-node.html?node={SRC}"));
    let cells = view_values(&node, "cells", None);
    assert!(
        cells.first().is_some_and(|&injected| injected > 0.0),
        "node page of {SRC}: cells injected, delivered, forwarded = {cells:?}"
    );
    let first_hop = format!("exanet-link.html?node={}&amp;peer={}", hops[0], hops[1]);
    assert!(
        node.contains(&first_hop),
        "node page of {SRC} has no row for its first hop ({first_hop})"
    );
    // A name that is no node is refused in words, not run as PromQL.
    let bad = page("/consoles/exanet-node.html?node=M1QAF1%22%7D");
    assert!(bad.contains("has no node"), "{bad}");

    // The Grafana dashboards draw from the same views: every expression of the committed
    // example's dashboards is PromQL this Prometheus accepts (Grafana's variables given the
    // values that select everything, as the container tests do).
    let dashboards =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose/2x2x1/grafana/dashboards");
    let mut checked = 0;
    for d in ["exanet-rack.json", "exanet-torus.json"] {
        let path = dashboards.join(d);
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut exprs = Vec::new();
        grafana_exprs(&v, &mut exprs);
        for e in exprs {
            let e = e
                .replace("$__rate_interval", "1m")
                .replace("$__range", "10m")
                .replace("$node", ".*")
                .replace("$port", ".*");
            let r = http_get(
                &addr,
                &format!("/api/v1/query?query={}", url_encode(&e)),
                HTTP_TIMEOUT,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                r.status == 200 && r.body.contains(r#""status":"success""#),
                "{d}: Prometheus refuses {e}: {}",
                r.body
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} dashboard expressions");

    // `rack down` stops the rack's Prometheus with the daemons.
    let down = rack.down().unwrap_or_else(|e| panic!("{e}"));
    assert!(down.success(), "exactl rack down: {}", down.describe());
    let left: Vec<_> = rack
        .processes()
        .into_iter()
        .filter(|p| p.cmdline.contains("prometheus"))
        .collect();
    assert!(
        left.is_empty() && !alive(prom_pid),
        "prometheus (pid {prom_pid}) still runs after rack down: {left:?}"
    );
    eprintln!(
        "rack view test: {:.1} s; screenshot {}",
        t0.elapsed().as_secs_f64(),
        shot.display()
    );
}
