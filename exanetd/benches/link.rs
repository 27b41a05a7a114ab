//! Two daemons on loopback, one link (M1QAF1 <-> M1QAF2 of a 1x1x1 rack):
//! payload throughput of 256-byte cells and probe round-trip time.
//!
//! `cargo bench -p exanetd --bench link` (env: CELLS, PINGS, WINDOW to vary).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use exanet_control::control::{request, Request, Response};
use support::TestRack;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    let cells = env_u64("CELLS", 2_000_000);
    let pings = env_u64("PINGS", 2000) as u32;
    let mut r = TestRack::new("bench-link", "1x1x1", env!("CARGO_BIN_EXE_exanetd"));
    r.log_level = "warn".into();
    if let Ok(w) = std::env::var("WINDOW") {
        let mut f = r.rack().file.clone();
        f.window = w.parse().expect("WINDOW in bytes");
        exanet_control::rack::write_rack_file(&r.dir, &f).unwrap();
    }
    let window = r.rack().file.window;
    r.start("M1QAF1");
    r.start("M1QAF2");
    // Only the F1-F2 link matters; the others stay down.
    let t0 = Instant::now();
    loop {
        let up = r.status("M1QAF1").is_some_and(|s| {
            s.links
                .iter()
                .any(|l| l.peer == "M1QAF2" && l.state == exanet_control::control::LinkState::Up)
        });
        if up {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "link did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Round trip first, on an idle link.
    let rep = match request(
        &r.sock("M1QAF1"),
        &Request::Ping {
            dst: "M1QAF2".into(),
            count: pings,
            timeout_ms: 1000,
        },
        Duration::from_secs(120),
    )
    .unwrap()
    {
        Response::Ping(p) => p,
        other => panic!("{other:?}"),
    };
    let mut rtts = rep.rtts_us.clone();
    rtts.sort_by(f64::total_cmp);
    let pct = |p: f64| rtts[((rtts.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "probe rtt, 1 hop: p50 {:.1} us, p99 {:.1} us, min {:.1} us ({} of {} probes)",
        pct(0.5),
        pct(0.99),
        rtts[0],
        rep.received,
        rep.sent
    );

    let before = r.status("M1QAF2").unwrap().load_rx_cells;
    let t0 = Instant::now();
    match request(
        &r.sock("M1QAF1"),
        &Request::Load {
            dsts: vec!["M1QAF2".into()],
            cells,
            payload: 256,
        },
        Duration::from_secs(5),
    )
    .unwrap()
    {
        Response::Ok => {}
        other => panic!("{other:?}"),
    }
    loop {
        let got = r.status("M1QAF2").unwrap().load_rx_cells - before;
        if got >= cells {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "only {got} of {cells} cells arrived"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let secs = t0.elapsed().as_secs_f64();
    let s = r.status("M1QAF1").unwrap();
    let link = s.links.iter().find(|l| l.peer == "M1QAF2").unwrap();
    println!(
        "throughput, 1 link, 256 B cells: {:.2} Gb/s payload, {:.2} Gb/s on the wire, {:.2} M cells/s ({cells} cells in {secs:.2} s, window {window} B/VC, stalled {:.2} s)",
        cells as f64 * 256.0 * 8.0 / secs / 1e9,
        cells as f64 * 288.0 * 8.0 / secs / 1e9,
        cells as f64 / secs / 1e6,
        link.stall_seconds,
    );
    println!("quic: {:?}", link.quic);
    let e2 = r.status("M1QAF2").unwrap().errors;
    assert!(e2.is_empty(), "receiver counted errors: {e2:?}");
}
