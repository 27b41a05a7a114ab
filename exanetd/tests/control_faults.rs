//! The control API over QUIC (who may use it) and link faults set through it: real
//! exanetd processes on loopback, one QFDB (4 nodes, 6 links).

// The helper every test of the workspace that needs root or a tool shares (std only).
#[allow(dead_code)]
#[path = "../../tests/src/require.rs"]
mod require;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use exanet_control::control::{request, LinkState, LinkStatus, NodeStatus, Request, Response};
use exanet_control::control_client::ControlClient;
use exanet_control::rack::{Layout, Rack};
use exanet_control::tls::{NodeTls, ALPN_CONTROL};
use exanet_proto::fault::{FaultKind, LinkFaults};
use support::TestRack;

const ALL: [&str; 4] = ["M1QAF1", "M1QAF2", "M1QAF3", "M1QAF4"];
const T: Duration = Duration::from_secs(5);

fn up(tag: &str) -> TestRack {
    let mut r = TestRack::new(tag, "1x1x1", env!("CARGO_BIN_EXE_exanetd"));
    r.log_level = "info".into();
    r.start_all();
    r.wait_links_up(&ALL, Duration::from_secs(20));
    r
}

fn ask(r: &TestRack, node: &str, req: Request) -> Response {
    request(&r.sock(node), &req, Duration::from_secs(20)).unwrap()
}

fn link<'a>(st: &'a NodeStatus, peer: &str) -> &'a LinkStatus {
    st.links.iter().find(|l| l.peer == peer).unwrap()
}

fn errors(st: &NodeStatus, kind: &str) -> u64 {
    st.errors.get(kind).copied().unwrap_or(0)
}

fn ping(r: &TestRack, from: &str, to: &str, count: u32, timeout_ms: u64) -> (u32, f64) {
    match ask(
        r,
        from,
        Request::Ping {
            dst: to.into(),
            count,
            timeout_ms,
        },
    ) {
        Response::Ping(p) => (p.received, p.rtt_us),
        other => panic!("ping: {other:?}"),
    }
}

fn set(r: &TestRack, node: &str, peer: &str, faults: LinkFaults) -> Response {
    ask(
        r,
        node,
        Request::LinkSet {
            peer: peer.into(),
            faults,
            seed: Some(7),
        },
    )
}

/// A metric sample's value, by name and label fragments.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .find(|l| labels.iter().all(|f| l.contains(f)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Connects to `node`'s control API with `tls`'s identity and asks for its status.
fn raw_control(rack: &Rack, node: &str, tls: &NodeTls) -> Result<(), String> {
    let cfg = tls.client_config(ALPN_CONTROL).unwrap();
    let id = rack.shape().parse_node(node).unwrap();
    let addr: SocketAddr = rack.entry(id).link.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let conn = ep
            .connect_with(cfg, addr, &exanet_control::rack::dns_name(&node))
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (mut s, mut rcv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        s.write_all(br#"{"op":"status"}"#)
            .await
            .map_err(|e| e.to_string())?;
        s.finish().map_err(|e| e.to_string())?;
        let body = rcv.read_to_end(1 << 20).await.map_err(|e| e.to_string())?;
        serde_json::from_slice::<Response>(&body).map_err(|e| e.to_string())?;
        Ok(())
    })
}

#[test]
fn control_api_admits_only_the_operator_certificate() {
    let r = up("auth");
    let rack = r.rack();
    // The operator, over the network: answered.
    let client = ControlClient::new(&rack).unwrap();
    let id = rack.shape().parse_node("M1QAF1").unwrap();
    match client.request(id, &Request::Status, T).unwrap() {
        Response::Status(st) => assert_eq!(st.node, "M1QAF1"),
        other => panic!("{other:?}"),
    }
    let layout = Layout::new(&r.dir);
    raw_control(&rack, "M1QAF1", &NodeTls::load(&layout, "exactl").unwrap())
        .expect("the operator certificate is admitted");

    // A node's certificate is the rack's, but not the operator's: refused and counted.
    let before = errors(&r.status("M1QAF1").unwrap(), "control_refused");
    let e = raw_control(&rack, "M1QAF1", &NodeTls::load(&layout, "M1QAF2").unwrap())
        .expect_err("a node certificate must not operate the rack");
    assert!(!e.is_empty());
    let after = errors(&r.status("M1QAF1").unwrap(), "control_refused");
    assert_eq!(after, before + 1, "refusal counted ({e})");

    // Credentials of another rack CA: the handshake fails, counted as a TLS refusal.
    let other = std::env::temp_dir().join(format!("exanetd-test-stranger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&other);
    std::fs::create_dir_all(&other).unwrap();
    exanet_control::tls::ensure_rack_pki(&Layout::new(&other), &[]).unwrap();
    let stranger = NodeTls::load(&Layout::new(&other), "exactl").unwrap();
    let before = errors(&r.status("M1QAF1").unwrap(), "tls_refused");
    assert!(raw_control(&rack, "M1QAF1", &stranger).is_err());
    // The client gives up on the daemon's certificate too; the daemon sees the aborted
    // handshake shortly after.
    let t0 = std::time::Instant::now();
    while errors(&r.status("M1QAF1").unwrap(), "tls_refused") == before {
        assert!(t0.elapsed() < T, "stranger's handshake not counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&other);
    let m = r.metrics("M1QAF1");
    assert!(
        sample(
            &m,
            "exanet_node_errors_total",
            &["kind=\"control_refused\""]
        )
        .unwrap()
            >= 1.0,
        "{m}"
    );
}

#[test]
fn link_faults_take_effect_show_everywhere_and_clear() {
    let r = up("faults");
    let (a, b) = ("M1QAF1", "M1QAF2");
    assert_eq!(ping(&r, a, b, 3, 2000).0, 3);

    // Loss of everything a sends to b: no probe comes back; the drops are counted.
    let all_lost = LinkFaults {
        loss: 1.0,
        ..Default::default()
    };
    assert_eq!(set(&r, a, b, all_lost), Response::Ok);
    assert_eq!(ping(&r, a, b, 3, 300).0, 0);
    let st = r.status(a).unwrap();
    let l = link(&st, b);
    assert_eq!(l.faults, Some(all_lost));
    assert!(l.fault_stats.cells(FaultKind::Loss) >= 3, "{l:?}");
    let m = r.metrics(a);
    let drops = sample(
        &m,
        "exanet_link_faults_injected_total",
        &["fault=\"drop\"", "node=\"M1QAF1\"", "peer=\"M1QAF2\""],
    );
    assert!(drops.unwrap() >= 3.0, "{m}");
    let loss = sample(
        &m,
        "exanet_link_fault_setting",
        &["setting=\"loss_ratio\"", "peer=\"M1QAF2\""],
    );
    assert_eq!(loss, Some(1.0));
    // The other direction and the other links are untouched.
    assert_eq!(ping(&r, a, "M1QAF3", 2, 2000).0, 2);

    // Every cell corrupted: the receiver refuses them; nothing comes back as an answer.
    let b_before = r.status(b).unwrap();
    let all_bad = LinkFaults {
        corrupt: 1.0,
        ..Default::default()
    };
    assert_eq!(set(&r, a, b, all_bad), Response::Ok);
    assert_eq!(ping(&r, a, b, 4, 300).0, 0, "a corrupt probe was answered");
    let st = r.status(a).unwrap();
    assert!(link(&st, b).fault_stats.cells(FaultKind::Corrupt) >= 4);
    let b_after = r.status(b).unwrap();
    // A flipped header or footer bit fails that CRC as the frame is decoded (counted on
    // the link; its error kind too, so errors are not summed); a payload bit fails the
    // probe's payload CRC at the switch.
    let caught = |s: &NodeStatus| link(s, a).counters.rx_corrupt_cells + errors(s, "payload_crc");
    assert!(
        caught(&b_after) >= caught(&b_before) + 4,
        "corruption not caught at {b}: {:?}",
        b_after.errors
    );

    // Delay, on one direction: the round trip pays it once. 200 ms keeps "once" and
    // "twice" apart by more than a loaded machine adds to a round trip.
    let delayed = LinkFaults {
        delay_ns: 200_000_000,
        ..Default::default()
    };
    assert_eq!(set(&r, a, b, delayed), Response::Ok);
    let (got, rtt) = ping(&r, a, b, 5, 5000);
    assert_eq!(got, 5);
    assert!(rtt >= 200_000.0, "rtt {rtt} us under a 200 ms delay");
    assert!(
        rtt < 400_000.0,
        "rtt {rtt} us: the 200 ms delay was paid twice"
    );
    let st = r.status(a).unwrap();
    assert!(link(&st, b).fault_stats.delayed_frames >= 5);

    // Down: the session ends at once and stays down at both ends until set up.
    let cut = LinkFaults {
        down: true,
        ..Default::default()
    };
    assert_eq!(set(&r, a, b, cut), Response::Ok);
    let st = r.status(a).unwrap();
    assert!(link(&st, b).admin_down);
    assert_eq!(link(&st, b).state, LinkState::Down);
    std::thread::sleep(Duration::from_millis(300));
    let sb = r.status(b).unwrap();
    assert_eq!(
        link(&sb, a).state,
        LinkState::Down,
        "{b} redialed a cut link"
    );
    assert_eq!(ping(&r, a, b, 1, 200).0, 0);

    // Clear: everything back, the link up again, traffic flows.
    assert_eq!(ask(&r, a, Request::LinkClear), Response::Ok);
    r.wait_links_up(&[a, b], Duration::from_secs(10));
    let st = r.status(a).unwrap();
    assert_eq!(link(&st, b).faults, None);
    assert!(!link(&st, b).admin_down);
    assert_eq!(ping(&r, a, b, 3, 2000).0, 3);
}

#[test]
fn bad_fault_requests_change_nothing() {
    let r = up("badfaults");
    for (req, want) in [
        (
            Request::LinkSet {
                peer: "M1QAF2".into(),
                faults: LinkFaults {
                    loss: 1.5,
                    ..Default::default()
                },
                seed: None,
            },
            "loss",
        ),
        (
            Request::LinkSet {
                peer: "M1QAF2".into(),
                faults: LinkFaults {
                    rate_bps: 5,
                    ..Default::default()
                },
                seed: None,
            },
            "rate",
        ),
        (
            Request::LinkSet {
                peer: "M1QAF1".into(),
                faults: LinkFaults::default(),
                seed: None,
            },
            "not a neighbour",
        ),
        (
            Request::LinkSet {
                peer: "M7QXF9".into(),
                faults: LinkFaults::default(),
                seed: None,
            },
            "M7QXF9",
        ),
    ] {
        match ask(&r, "M1QAF1", req) {
            Response::Error { message } => assert!(message.contains(want), "{message}"),
            other => panic!("accepted: {other:?}"),
        }
    }
    // A malformed fault object is refused by the parser.
    let raw = r#"{"op":"link_set","peer":"M1QAF2","faults":{"loss":"lots"}}"#;
    let mut s = std::os::unix::net::UnixStream::connect(r.sock("M1QAF1")).unwrap();
    use std::io::{BufRead, Write};
    writeln!(s, "{raw}").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("bad request"), "{line}");
    let st = r.status("M1QAF1").unwrap();
    assert!(st.links.iter().all(|l| l.faults.is_none()));
    assert!(st.links.iter().all(|l| l.state == LinkState::Up));
}

/// The exposition passes Prometheus's own linter. promtool comes with Debian's
/// `prometheus` package, which `.ci/run` installs; elsewhere the test says it is skipped
/// unless `EXANET_REQUIRE_PROMTOOL` is set.
#[test]
fn metrics_pass_promtool() {
    let have = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        require::skip_unless_required(
            "EXANET_REQUIRE_PROMTOOL",
            "metrics_pass_promtool",
            "promtool is not installed (Debian: apt-get install prometheus)",
        );
        return;
    }
    let r = up("promtool");
    // Exercise the fault families so that they have series.
    let f = LinkFaults {
        loss: 0.5,
        delay_ns: 1_000_000,
        ..Default::default()
    };
    assert_eq!(set(&r, "M1QAF1", "M1QAF2", f), Response::Ok);
    ping(&r, "M1QAF1", "M1QAF2", 4, 200);
    let text = r.metrics("M1QAF1");
    let body = text
        .split_once("\r\n\r\n")
        .map_or(text.as_str(), |(_, b)| b);
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}"
    );
    assert!(body.contains("exanet_ni_completion_latency_seconds"));
    assert!(body.contains("exanet_link_fault_setting"));
    // The modeled-time families, with series after the probes.
    assert!(sample(body, "exanet_link_modeled_busy_seconds_total", &["M1QAF2"]).is_some());
    assert!(sample(body, "exanet_node_modeled_time_seconds", &["M1QAF1"]).is_some());
}

/// Modeled time in the metrics: traffic over a link counts the modeled time its output
/// spent sending, at least the serialisation of every byte it sent at the link's modeled
/// rate, and never more than the node's modeled clock (their ratio is the link's modeled
/// utilization).
#[test]
fn traffic_counts_modeled_busy_time_within_the_nodes_modeled_clock() {
    let r = up("modeled");
    let cells = 2000;
    let req = Request::Load {
        dsts: vec!["M1QAF2".into()],
        cells,
        payload: 256,
    };
    assert_eq!(ask(&r, "M1QAF1", req), Response::Ok);
    let t0 = std::time::Instant::now();
    while r.status("M1QAF2").map_or(0, |s| s.load_rx_cells) < cells {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the load did not arrive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ping(&r, "M1QAF1", "M1QAF2", 2, 1000).0, 2);

    let st = r.status("M1QAF1").unwrap();
    let l = link(&st, "M1QAF2");
    assert!(l.tx_cells > cells, "{} cells sent", l.tx_cells);
    // 16 Gb/s inside a QFDB: 0.5 ns a byte (2000 full cells are 288 us of it).
    let wire = l.tx_bytes as f64 * 8.0 / 16e9;
    assert!(
        l.modeled_busy_seconds >= wire * 0.999,
        "modeled busy {} s for {} B ({wire} s on the wire)",
        l.modeled_busy_seconds,
        l.tx_bytes
    );
    assert!(l.modeled_busy_seconds <= st.modeled_time_seconds);
    // A link that carried nothing was never modeled-busy.
    let idle = link(&st, "M1QAF4");
    assert_eq!((idle.tx_cells, idle.modeled_busy_seconds), (0, 0.0));

    let m = r.metrics("M1QAF1");
    let busy = sample(
        &m,
        "exanet_link_modeled_busy_seconds_total",
        &["peer=\"M1QAF2\""],
    )
    .expect("a busy series for the link");
    let clock = sample(&m, "exanet_node_modeled_time_seconds", &["node=\"M1QAF1\""])
        .expect("the node's modeled clock");
    assert!(busy > 0.0 && busy >= wire * 0.999, "busy {busy} s");
    assert!(
        busy <= clock,
        "busy {busy} s beyond the modeled clock {clock} s"
    );
}
