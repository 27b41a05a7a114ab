//! Switch throughput, on one core.
//!
//! 1. One `Switch`: the F1 of a 4x4x2 rack (M1QAF1: three intra-QFDB ports and five torus
//!    ports) with every link port fed cells bound for other link ports. The neighbours are
//!    simulated as instant: an upstream neighbour refills an input queue as soon as it has
//!    room, a downstream neighbour takes a cell and returns its credit at once. What is
//!    timed is exactly the switch's work per cell: `receive` (credit check, routing, queueing),
//!    `poll_transmit` (arbitration, credit), `credit` and `poll_credit`.
//! 2. The whole-rack simulator: all-to-all load on a 4x4x2 rack, cells delivered per wall
//!    second (every cell crosses several switches plus the event queue).
//!
//! A plain `main` timed with `std::time::Instant` (harness = false): run with
//! `cargo bench -p exanet-proto --bench switch`. Target: >= 2 M cells/s through one switch.

use std::hint::black_box;
use std::time::{Duration, Instant as WallClock};

use bytes::Bytes;

use exanet_proto::cell::{Cell, CellType, OVERHEAD};
use exanet_proto::gvas::{Gvas, Pdid};
use exanet_proto::routing::{route, Vc, NVCS};
use exanet_proto::sim::{Sim, SimConfig};
use exanet_proto::topology::Port;
use exanet_proto::Instant;
use exanet_proto::NodeEvent;
use exanet_proto::{NodeId, Shape};
use exanet_proto::{Switch, SwitchConfig};

/// Whether a cell that arrived on `inp` may leave by `out` on a dimension-order route:
/// from an F2..F4 only onto the torus; from the torus onward the same way round the same
/// ring (a cell arriving on the - port travels +, so it leaves by +), into a later
/// dimension, or down to an F2..F4.
fn dimension_order_allows(inp: Port, out: Port) -> bool {
    match (inp, out) {
        (Port::Qfdb(_), Port::Torus(..)) => true,
        (Port::Qfdb(_), _) => false,
        (Port::Torus(d, din), Port::Torus(e, dout)) => e > d || (e == d && din != dout),
        (Port::Torus(..), Port::Qfdb(_)) => true,
        _ => false,
    }
}

/// Input feeds of the switch at `here`: for each link port and VC it uses, cells that
/// arrive there and leave by another link port on a dimension-order route. Torus ports are
/// fed on both VCs (a cell that crossed the ring's dateline arrives on VC1 and keeps it).
fn traffic(shape: &Shape, here: NodeId, payload: usize) -> Vec<(Port, Vc, Vec<Cell>)> {
    let sw = Switch::new(*shape, here, SwitchConfig::default()).unwrap();
    let ports: Vec<Port> = sw.link_ports().collect();
    let mut out = Vec::new();
    for &p in &ports {
        let vcs: &[Vc] = if matches!(p, Port::Torus(..)) {
            &[Vc::ZERO, Vc::ONE]
        } else {
            &[Vc::ZERO]
        };
        for &vc in vcs {
            let mut cells = Vec::new();
            for dst in shape.node_ids() {
                let hop = route(shape, here, dst, p, vc).unwrap();
                if hop.port == Port::Local || !dimension_order_allows(p, hop.port) {
                    continue;
                }
                let g = Gvas::new(Pdid(1), dst, 0, 0).unwrap();
                let payload = Bytes::from(vec![0xA5; payload]);
                let mut c = Cell::new(g, CellType::Write, NodeId(1), payload).unwrap();
                c.seq = cells.len() as u16;
                cells.push(c);
            }
            if !cells.is_empty() {
                out.push((p, vc, cells));
            }
        }
    }
    out
}

struct SwitchRun {
    cells: u64,
    secs: f64,
    out_ports: usize,
    in_queues: usize,
}

fn run_switch(window: u32, payload: usize, budget: Duration) -> SwitchRun {
    let shape = Shape::PROTOTYPE;
    let here = shape.parse_node("M1QAF1").unwrap();
    let cfg = SwitchConfig {
        window,
        local_window: window,
        ..SwitchConfig::default()
    };
    let mut sw = Switch::new(shape, here, cfg).unwrap();
    let now = Instant::ZERO;
    let ports: Vec<Port> = sw.link_ports().collect();
    for &p in &ports {
        sw.link_up(p).unwrap();
        sw.peer_grant(p, [window; NVCS], now).unwrap();
    }
    let feeds = traffic(&shape, here, payload);
    // The upstream neighbours' view: credit per feed, as granted by our Hello.
    let mut credit = vec![window; feeds.len()];
    let mut next = vec![0usize; feeds.len()];
    let wire = (OVERHEAD + payload) as u32;
    let mut used = [false; 11];
    let mut cells = 0u64;
    let start = WallClock::now();
    let mut rounds = 0u64;
    loop {
        // Upstream neighbours send while they hold credit.
        for (k, (p, vc, list)) in feeds.iter().enumerate() {
            while credit[k] >= wire {
                credit[k] -= wire;
                let c = list[next[k]].clone();
                next[k] = (next[k] + 1) % list.len();
                sw.receive(*p, *vc, c, now).unwrap();
            }
        }
        // Downstream neighbours take every cell at once and give the credit straight back.
        while let Some(t) = sw.poll_transmit(now) {
            used[t.port.index()] = true;
            sw.credit(
                t.port,
                t.vc,
                t.cell.wire_len() as u32,
                t.cell.stamp.tail,
                now,
            )
            .unwrap();
            black_box(&t.cell);
            cells += 1;
        }
        // Credit for the freed input space goes back upstream.
        while let Some((p, vc, bytes, _)) = sw.poll_credit() {
            let k = feeds
                .iter()
                .position(|(fp, fv, _)| (*fp, *fv) == (p, vc))
                .expect("credit only for fed inputs");
            credit[k] += bytes;
        }
        rounds += 1;
        if rounds & 15 == 0 && start.elapsed() >= budget {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(sw.forwarded(), cells, "every cell went link to link");
    SwitchRun {
        cells,
        secs,
        out_ports: used.iter().filter(|u| **u).count(),
        in_queues: feeds.len(),
    }
}

struct SimRun {
    delivered: u64,
    /// Cells sent over links, summed over every hop.
    link_cells: u64,
    secs: f64,
    events: u64,
    sim_us: u64,
}

fn run_sim(cfg: SimConfig, per_dst: u64) -> SimRun {
    let shape = Shape::PROTOTYPE;
    let n = shape.nodes();
    let mut sim = Sim::new(shape, cfg).unwrap();
    for src in shape.node_ids() {
        let dsts: Vec<NodeId> = (1..n).map(|k| NodeId((src.0 + k) % n)).collect();
        sim.node_mut(src)
            .start_load(&dsts, per_dst * u64::from(n - 1), 256)
            .unwrap();
    }
    let start = WallClock::now();
    sim.kick_all();
    assert!(sim.run_until(Instant::from_micros(10_000_000)));
    let secs = start.elapsed().as_secs_f64();
    assert!(sim.is_quiet() && sim.errors().is_empty());
    let delivered: u64 = sim.nodes().map(|n| n.stats().load_rx_cells).sum();
    assert_eq!(delivered, per_dst * u64::from(n) * u64::from(n - 1));
    let events = sim.processed();
    let link_cells = sim
        .nodes()
        .map(|n| {
            let sw = n.switch();
            sw.link_ports()
                .map(|p| sw.port_stats(p).tx_cells)
                .sum::<u64>()
        })
        .sum();
    assert!(sim
        .take_events()
        .iter()
        .all(|(_, _, e)| matches!(e, NodeEvent::LoadSent)));
    SimRun {
        delivered,
        link_cells,
        secs,
        events,
        sim_us: sim.now().nanos() / 1000,
    }
}

/// Encode and decode speed of full 256 B cells (the per-cell cost at every link end).
fn cell_codec(budget: Duration) {
    use bytes::BytesMut;
    let cell = Cell::new(
        exanet_proto::Gvas::new(exanet_proto::Pdid(1), NodeId(5), 0, 0).unwrap(),
        exanet_proto::CellType::Load,
        NodeId(1),
        bytes::Bytes::from(vec![0x5A; 256]),
    )
    .unwrap();
    let mut buf = BytesMut::with_capacity(1 << 20);
    let (mut n, t0) = (0u64, std::time::Instant::now());
    while t0.elapsed() < budget {
        for _ in 0..1000 {
            buf.clear();
            cell.encode(&mut buf).unwrap();
        }
        n += 1000;
    }
    let enc = t0.elapsed().as_secs_f64() / n as f64 * 1e9;
    let wire = cell.to_bytes().unwrap();
    let (mut n, t0) = (0u64, std::time::Instant::now());
    while t0.elapsed() < budget {
        for _ in 0..1000 {
            std::hint::black_box(Cell::decode(&wire).unwrap());
        }
        n += 1000;
    }
    let dec = t0.elapsed().as_secs_f64() / n as f64 * 1e9;
    println!("cell: encode {enc:.0} ns, decode {dec:.0} ns per 256 B cell (all three CRCs)");
}

fn main() {
    // `cargo bench` passes `--bench`; a filter, if given, picks the parts to run.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let budget = Duration::from_millis(1500);

    if wants("cell") {
        cell_codec(budget);
    }

    if wants("switch") {
        // Warm up caches and the allocator once.
        run_switch(256 * 1024, 256, Duration::from_millis(200));
        for (window, payload, label) in [
            (256 * 1024, 256, "256 KiB window, 256 B payload"),
            (256 * 1024, 0, "256 KiB window, header-only cells"),
            (4096, 256, "4 KiB window, 256 B payload"),
        ] {
            let r = run_switch(window, payload, budget);
            println!(
                "switch: {:.2} M cells/s forwarded ({}; {} cells in {:.2} s from {} input queues to {} output ports; {:.1} Gb/s of cells)",
                r.cells as f64 / r.secs / 1e6,
                label,
                r.cells,
                r.secs,
                r.in_queues,
                r.out_ports,
                r.cells as f64 * (OVERHEAD + payload) as f64 * 8.0 / r.secs / 1e9,
            );
        }
    }

    if wants("sim") {
        for (cfg, label) in [
            (SimConfig::default(), "default windows"),
            (
                SimConfig {
                    switch: SwitchConfig {
                        window: 4096,
                        local_window: 4096,
                        ..SwitchConfig::default()
                    },
                    ..SimConfig::default()
                },
                "4 KiB windows",
            ),
            (
                SimConfig {
                    switch: SwitchConfig {
                        window: 4096,
                        local_window: 4096,
                        ..SwitchConfig::default()
                    },
                    jitter_ns: 400,
                    ..SimConfig::default()
                },
                "4 KiB windows, 400 ns jitter",
            ),
        ] {
            let r = run_sim(cfg, 20);
            println!(
                "sim: {:.2} M cells/s delivered, whole 4x4x2 rack all-to-all ({}; {} cells of 256 B in {:.2} s wall, {:.2} M link hops/s, {} simulated us, {:.2} M events/s)",
                r.delivered as f64 / r.secs / 1e6,
                label,
                r.delivered,
                r.secs,
                r.link_cells as f64 / r.secs / 1e6,
                r.sim_us,
                r.events as f64 / r.secs / 1e6,
            );
        }
    }
}
