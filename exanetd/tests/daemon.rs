//! Daemon-level tests: real exanetd processes on loopback, a single-QFDB rack (4 nodes,
//! 6 links), driven through the control socket and the metrics endpoint.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use exanet_control::control::{request, LinkState, Request, Response};
use exanet_control::rack::write_rack_file;
use exanet_proto::frame::{self, Frame, FrameDecoder, Hello};
use exanet_proto::{Cell, CellType, Gvas, NodeId, Pdid, Port, Vc};
use support::TestRack;

fn rack(tag: &str, shape: &str) -> TestRack {
    TestRack::new(tag, shape, env!("CARGO_BIN_EXE_exanetd"))
}

const ALL: [&str; 4] = ["M1QAF1", "M1QAF2", "M1QAF3", "M1QAF4"];

#[test]
fn qfdb_links_come_up_ping_and_shut_down_cleanly() {
    let mut r = rack("qfdb", "1x1x1");
    r.start_all();
    r.wait_links_up(&ALL, Duration::from_secs(20));
    let s = r.status("M1QAF1").unwrap();
    assert_eq!(s.links.len(), 3);
    let rep = match request(
        &r.sock("M1QAF2"),
        &Request::Ping {
            dst: "M1QAF4".into(),
            count: 5,
            timeout_ms: 2000,
        },
        Duration::from_secs(15),
    )
    .unwrap()
    {
        Response::Ping(p) => p,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(rep.received, 5);
    assert_eq!(rep.path, vec!["M1QAF2", "M1QAF4"]);
    assert_eq!(rep.back, vec!["M1QAF4", "M1QAF2"]);
    assert_eq!(rep.hops, 1);
    assert!(rep.rtt_us > 0.0);
    let m = r.metrics("M1QAF2");
    assert!(
        m.contains("exanet_link_cells_total{direction=\"tx\",kind=\"qfdb\",node=\"M1QAF2\",peer=\"M1QAF4\",port=\"f4\"} 5"),
        "{m}"
    );
    assert!(
        m.contains("exanet_link_up{kind=\"qfdb\",node=\"M1QAF2\",peer=\"M1QAF1\",port=\"f1\"} 1")
    );
    for n in ALL {
        assert!(r.stop(n).success(), "{n} did not exit cleanly");
        assert!(!r.sock(n).exists(), "{n} left its control socket behind");
    }
}

#[test]
fn restarted_neighbour_rejoins() {
    let mut r = rack("restart", "1x1x1");
    r.start_all();
    r.wait_links_up(&ALL, Duration::from_secs(20));
    // M1QAF1 dials everyone (lowest id); kill a node it dials and one that dials M1QAF4.
    for victim in ["M1QAF2", "M1QAF4"] {
        r.stop(victim);
        r.start(victim);
        r.wait_links_up(&ALL, Duration::from_secs(20));
    }
    // Both victims came back to both survivors, the dialing and the dialed side.
    for survivor in ["M1QAF1", "M1QAF3"] {
        let s = r.status(survivor).unwrap();
        for victim in ["M1QAF2", "M1QAF4"] {
            let l = s.links.iter().find(|l| l.peer == victim).unwrap();
            assert!(l.sessions >= 2, "{survivor}: no reconnect counted: {l:?}");
        }
    }
    for n in ALL {
        let s = r.status(n).unwrap();
        assert_eq!(s.errors.get("tls_refused"), None, "{n}: {:?}", s.errors);
    }
}

/// A node that crashes and restarts is back with all its neighbours well before their
/// idle timeout would have noticed the crash: its restarted endpoint recognises the dead
/// run's connection IDs and resets them, so the neighbours that dial it redial at once.
#[test]
fn crashed_neighbour_is_rejoined_before_the_idle_timeout() {
    let mut r = rack("crash", "1x1x1");
    r.start_all();
    r.wait_links_up(&ALL, Duration::from_secs(20));
    // M1QAF3 is dialed by M1QAF1 and M1QAF2, and dials M1QAF4.
    r.kill("M1QAF3");
    r.start("M1QAF3");
    let limit = exanet_control::tls::DEFAULT_LINK_TIMEOUT - Duration::from_secs(1);
    let t0 = Instant::now();
    // The survivors' stale sessions still look up; the new daemon's view, and the
    // survivors' session counts, say whether the links really came back.
    r.wait_links_up(&ALL, limit);
    loop {
        let redialed = ["M1QAF1", "M1QAF2"].iter().all(|n| {
            r.status(n).is_some_and(|s| {
                s.links
                    .iter()
                    .any(|l| l.peer == "M1QAF3" && l.sessions >= 2 && l.state == LinkState::Up)
            })
        });
        if redialed {
            break;
        }
        assert!(
            t0.elapsed() < limit,
            "the crashed node's dialing neighbours did not reconnect within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Connections of the dead run that end in a reset or a timeout are no certificate
    // refusal: a healthy rack that lost a node shows no TLS alarm.
    for n in ALL {
        let s = r.status(n).unwrap();
        assert_eq!(s.errors.get("tls_refused"), None, "{n}: {:?}", s.errors);
    }
}

#[test]
fn peer_from_another_rack_is_refused_and_counted() {
    let mut a = rack("ca-a", "1x1x1");
    a.start("M1QAF2");
    // Rack B's M1QAF1 (another CA) is pointed at rack A's M1QAF2 and dials it.
    let b = rack("ca-b", "1x1x1");
    let mut file = b.rack().file.clone();
    file.name = a.rack().file.name.clone();
    file.nodes.get_mut("M1QAF2").unwrap().link = a.rack().file.nodes["M1QAF2"].link.clone();
    write_rack_file(&b.dir, &file).unwrap();
    let mut b = b;
    b.start("M1QAF1");
    let t0 = Instant::now();
    loop {
        let s = a.status("M1QAF2");
        if s.as_ref()
            .is_some_and(|s| s.errors.get("tls_refused").copied().unwrap_or(0) > 0)
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no refusal counted: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = a.status("M1QAF2").unwrap();
    assert!(s.links.iter().all(|l| l.state == LinkState::Down));
}

/// Plays M1QAF1 by hand: dials M1QAF2 with M1QAF1's certificate and sends bad frames.
#[test]
fn malformed_cells_are_dropped_counted_and_the_link_survives() {
    let mut r = rack("malformed", "1x1x1");
    r.start("M1QAF2");
    let rack = r.rack();
    let shape = r.shape;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tls = exanet_control::tls::NodeTls::load(&rack.layout(), "M1QAF1").unwrap();
        let (_, client) = tls
            .quic_configs(exanet_control::tls::DEFAULT_LINK_TIMEOUT)
            .unwrap();
        let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = rack.entry(NodeId(1)).link.parse().unwrap();
        let t0 = Instant::now();
        let conn = loop {
            match ep
                .connect_with(client.clone(), addr, "m1qaf2")
                .unwrap()
                .await
            {
                Ok(c) => break c,
                Err(e) => {
                    assert!(t0.elapsed() < Duration::from_secs(10), "{e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let mut out = BytesMut::new();
        frame::encode_hello(
            &Hello::new(
                NodeId(0),
                Port::Qfdb(2),
                &shape,
                rack.digest(),
                [65536, 0, 65536, 0],
            ),
            &mut out,
        );
        // A cell for M1QAF2 itself, then the same cell with a flipped payload bit.
        let cell = Cell::new(
            Gvas::new(Pdid(0), NodeId(1), 0, 0).unwrap(),
            CellType::Load,
            NodeId(0),
            bytes::Bytes::from(vec![0xA5; 64]),
        )
        .unwrap();
        frame::encode_cell(Vc::ZERO, &cell, &mut out).unwrap();
        let mut bad = cell.to_bytes().unwrap().to_vec();
        bad[40] ^= 0x01;
        frame::encode_raw_cell(Vc::ZERO, Default::default(), &bad, &mut out);
        // VC1 on an intra-QFDB link is refused by the switch, not fatal either.
        frame::encode_cell(Vc::ONE, &cell, &mut out).unwrap();
        send.write_all(&out).await.unwrap();
        // The daemon's hello comes back with its grant; then credit for all three cells:
        // refused and corrupt cells return their credit too, or a bad peer would shrink
        // its own window for good.
        let owed = 3 * cell.wire_len() as u32;
        let mut dec = FrameDecoder::new();
        let mut credited = 0u32;
        let mut hello = None;
        let t0 = Instant::now();
        while credited < owed {
            assert!(t0.elapsed() < Duration::from_secs(10), "no credit back");
            let c = tokio::time::timeout(Duration::from_secs(5), recv.read_chunk(65536, true))
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            dec.push(&c.bytes);
            while let Some(f) = dec.next_frame() {
                match f.unwrap() {
                    Frame::Hello(h) => hello = Some(h),
                    Frame::Credit(_, n, _) => credited += n,
                    Frame::Cell(..) | Frame::Marker(_) => {}
                }
            }
        }
        let h = hello.expect("hello first");
        assert_eq!(h.node, NodeId(1));
        assert_eq!(h.port, Port::Qfdb(1));
        assert_eq!(credited, owed);
        let s = loop {
            let s = r.status("M1QAF2").unwrap();
            if s.load_rx_cells >= 1 && s.errors.contains_key("payload_crc") {
                break s;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{s:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(s.load_rx_cells, 1, "the corrupt cell must not be delivered");
        assert_eq!(s.errors.get("payload_crc"), Some(&1));
        assert_eq!(s.errors.get("wrong_vc"), Some(&1));
        let l = s.links.iter().find(|l| l.peer == "M1QAF1").unwrap();
        assert_eq!(
            l.state,
            LinkState::Up,
            "a bad cell must not take the link down"
        );
        // Garbage that breaks the framing resets the link; the daemon keeps serving.
        send.write_all(&[0xEE, 1, 2, 3]).await.unwrap();
        let t0 = Instant::now();
        loop {
            let s = r.status("M1QAF2").unwrap();
            if s.errors.contains_key("frame_tag") {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{s:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert!(r.status("M1QAF2").is_some(), "daemon must keep serving");
}

#[test]
fn bad_configuration_exits_2_with_one_line() {
    let r = rack("badcfg", "1x1x1");
    let run = |args: &[&str], dir: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_exanetd"))
            .args(["--rack", dir.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&["--node", "M2QAF1"], &r.dir);
    assert_eq!(code, Some(2));
    assert!(err.contains("M2QAF1"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let (code, err) = run(&["--node", "bogus"], &r.dir);
    assert_eq!(code, Some(2));
    assert!(err.contains("bogus"), "{err}");
    std::fs::write(r.dir.join("rack.toml"), "name = \"x\"\nshape = \"2x\"\n").unwrap();
    let (code, err) = run(&["--node", "M1QAF1"], &r.dir);
    assert_eq!(code, Some(2));
    assert!(err.contains("rack.toml"), "{err}");
    let (code, _) = run(&["--node", "M1QAF1", "--threads", "0"], &r.dir);
    assert_eq!(code, Some(2));
}

/// The rack file's link timeout is the links': with `link_timeout_s = 3`, a neighbour that
/// stops answering (SIGSTOP) is down for its neighbours within about 3 s, well before the
/// default 10 s, and its links come back once it runs again.
#[test]
fn a_silent_neighbour_is_down_after_the_rack_files_link_timeout() {
    let mut r = rack("linktimeout", "1x1x1");
    let mut f = r.rack().file.clone();
    f.link_timeout_s = Some(3);
    write_rack_file(&r.dir, &f).unwrap();
    r.start_all();
    r.wait_links_up(&ALL, Duration::from_secs(20));
    let pid = r.pid("M1QAF3").unwrap();
    support::signal(pid, 19); // SIGSTOP
    let t0 = Instant::now();
    let down = |n: &str| {
        r.status(n).is_some_and(|s| {
            s.links
                .iter()
                .any(|l| l.peer == "M1QAF3" && l.state != LinkState::Up)
        })
    };
    while !["M1QAF1", "M1QAF2", "M1QAF4"].iter().all(|n| down(n)) {
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "the paused node's links still look up after {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let noticed = t0.elapsed();
    eprintln!("a paused neighbour was down everywhere after {noticed:?}");
    assert!(
        noticed >= Duration::from_secs(2),
        "down after {noticed:?}: sooner than the timeout"
    );
    support::signal(pid, 18); // SIGCONT
    r.wait_links_up(&ALL, Duration::from_secs(20));
}
