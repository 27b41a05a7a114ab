//! How fast a fault set over the control API takes effect on a busy link, and what the
//! control round trip costs. Two daemons on loopback (M1QAF1 -> M1QAF2 of a 1x1x1 rack),
//! a stream of load cells on the link; for each trial, a `link_set` of 100% loss goes to
//! the sender through the operator's QUIC control API (what `exactl link set` uses) and
//! the sender's drop counter is watched until it moves.
//!
//! `cargo bench -p exanetd --bench faults` (env: TRIALS).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use exanet_control::control::{request, LinkState, Request, Response};
use exanet_control::control_client::ControlClient;
use exanet_proto::fault::{FaultKind, LinkFaults};
use support::TestRack;

fn main() {
    let trials: usize = std::env::var("TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut r = TestRack::new("bench-faults", "1x1x1", env!("CARGO_BIN_EXE_exanetd"));
    r.log_level = "warn".into();
    r.start("M1QAF1");
    r.start("M1QAF2");
    let t0 = Instant::now();
    while !r.status("M1QAF1").is_some_and(|s| {
        s.links
            .iter()
            .any(|l| l.peer == "M1QAF2" && l.state == LinkState::Up)
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "link did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rack = r.rack();
    let a = rack.shape().parse_node("M1QAF1").unwrap();
    let client = ControlClient::new(&rack).unwrap();
    let set = |loss: f64| Request::LinkSet {
        peer: "M1QAF2".into(),
        faults: LinkFaults {
            loss,
            ..Default::default()
        },
        seed: None,
    };
    let drops = |r: &TestRack| {
        r.status("M1QAF1")
            .and_then(|s| s.links.into_iter().find(|l| l.peer == "M1QAF2"))
            .map_or(0, |l| l.fault_stats.cells(FaultKind::Loss))
    };
    // First contact pays the QUIC handshake; exactl pays it once per command.
    let h0 = Instant::now();
    client
        .request(a, &Request::Status, Duration::from_secs(5))
        .unwrap();
    let handshake = h0.elapsed();
    let mut effect = Vec::new();
    let mut rpc = Vec::new();
    for _ in 0..trials {
        // Keep the link busy: cells are always about to be sent.
        let load = Request::Load {
            dsts: vec!["M1QAF2".into()],
            cells: 50_000_000,
            payload: 256,
        };
        assert_eq!(
            request(&r.sock("M1QAF1"), &load, Duration::from_secs(5)).unwrap(),
            Response::Ok
        );
        std::thread::sleep(Duration::from_millis(50));
        let before = drops(&r);
        let t = Instant::now();
        let resp = client
            .request(a, &set(1.0), Duration::from_secs(5))
            .unwrap();
        rpc.push(t.elapsed());
        assert_eq!(resp, Response::Ok);
        while drops(&r) == before {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the fault never took effect"
            );
        }
        effect.push(t.elapsed());
        if std::env::var_os("VERBOSE").is_some() {
            eprintln!(
                "trial: rpc {:?} effect {:?} drops {}",
                rpc.last().unwrap(),
                t.elapsed(),
                drops(&r)
            );
        }
        client
            .request(a, &set(0.0), Duration::from_secs(5))
            .unwrap();
        // Stop the load: restart it with zero cells.
        let stop = Request::Load {
            dsts: vec!["M1QAF2".into()],
            cells: 0,
            payload: 256,
        };
        let _ = request(&r.sock("M1QAF1"), &stop, Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(20));
    }
    let pct = |v: &mut Vec<Duration>, p: f64| {
        v.sort();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    println!("control API first contact (QUIC handshake + status): {handshake:?}");
    println!(
        "link_set round trip: p50 {:?}, max {:?} ({trials} trials)",
        pct(&mut rpc, 0.5),
        pct(&mut rpc, 1.0)
    );
    println!(
        "link_set to first dropped cell on a busy link: p50 {:?}, max {:?} (target < 100 ms)",
        pct(&mut effect, 0.5),
        pct(&mut effect, 1.0)
    );
}
