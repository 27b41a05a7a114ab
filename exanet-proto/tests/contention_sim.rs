//! Contention in modeled order on a simulated rack (see `exanet_proto::order`): flows that
//! share a resource get the shares a hand calculation gives, and the same modeled figures
//! whatever order the host delivers cells in.

use exanet_proto::bench::{self, BenchConfig, Flow, FlowsRun};
use exanet_proto::ni::NiConfig;
use exanet_proto::sim::SimConfig;
use exanet_proto::topology::{neighbour, Dir};
use exanet_proto::{ModelTime, NodeId, Port, Shape, SwitchConfig};

/// Each flow's RDMA write.
const LEN: u64 = 1 << 20;
/// Payload over wire bytes of a full RDMA cell: 256 B of data in a 288 B cell.
const PAYLOAD_SHARE: f64 = 256.0 / 288.0;
/// The same on a torus link, where each cell is followed by the routing logic's 80 B of
/// control data (`ModelParams::torus_control_bytes`).
const TORUS_PAYLOAD_SHARE: f64 = 256.0 / 368.0;

/// Each flow's modeled rate, Gb/s (all start at zero).
fn gbps(r: &FlowsRun) -> Vec<f64> {
    r.done
        .iter()
        .map(|t| (LEN * 8) as f64 / (t.ps() as f64 / 1000.0))
        .collect()
}

/// Each flow got `share` of `capacity` Gb/s, within `within` (a fraction of the
/// capacity), with nothing forwarded out of order.
fn assert_shares(r: &FlowsRun, capacity: f64, share: f64, within: f64) {
    eprintln!("Gb/s of payload by flow: {:.3?}", gbps(r));
    for (i, g) in gbps(r).iter().enumerate() {
        let got = g / capacity;
        assert!(
            (got - share).abs() <= within,
            "flow {i}: {g:.3} Gb/s is {:.2}% of {capacity:.3} Gb/s, not {:.1}% +- {:.1}",
            got * 100.0,
            share * 100.0,
            within * 100.0
        );
    }
    assert_eq!(r.late, 0, "cells forwarded out of modeled order");
}

/// Writes `LEN` bytes from each pair's first node to its second, all posted at modeled
/// time zero, in modeled order, with the links' real-time latency drawn up to
/// `jitter_ns` beyond its 120 ns.
fn run(shape: &str, pairs: &[(NodeId, NodeId)], jitter_ns: u64) -> FlowsRun {
    run_with(shape, pairs, jitter_ns, NiConfig::default(), None)
}

/// [`run`] with NIs configured by `ni`. With `coordinator_ns`, horizons come from cuts of
/// the rack gathered by a coordinator that far from every node, as on daemons.
fn run_with(
    shape: &str,
    pairs: &[(NodeId, NodeId)],
    jitter_ns: u64,
    ni: NiConfig,
    coordinator_ns: Option<u64>,
) -> FlowsRun {
    let flows: Vec<Flow> = pairs
        .iter()
        .map(|&(from, to)| Flow {
            from,
            to,
            len: LEN,
            at: ModelTime::ZERO,
        })
        .collect();
    let cfg = BenchConfig {
        sim: SimConfig {
            seed: 7 + jitter_ns,
            jitter_ns,
            switch: SwitchConfig {
                modeled_order: true,
                ..SwitchConfig::default()
            },
            coordinator_ns,
            ..SimConfig::default()
        },
        ni,
    };
    let r = bench::flows(shape.parse().unwrap(), &flows, cfg).unwrap();
    eprintln!("retransmissions {}", r.retransmissions);
    r
}

fn named(shape: &str, pairs: &[(&str, &str)]) -> Vec<(NodeId, NodeId)> {
    let s: Shape = shape.parse().unwrap();
    pairs
        .iter()
        .map(|(a, b)| (s.parse_node(a).unwrap(), s.parse_node(b).unwrap()))
        .collect()
}

/// Four senders of two QFDBs into F2 of a third (3x1x1), the first through its F1.
fn incast_of_four() -> Vec<(NodeId, NodeId)> {
    named(
        "3x1x1",
        &[
            ("M1QBF1", "M1QAF2"),
            ("M1QBF3", "M1QAF2"),
            ("M1QCF2", "M1QAF2"),
            ("M1QCF4", "M1QAF2"),
        ],
    )
}

/// Two flows from two FPGAs of one QFDB to two of the next share the torus link between
/// their F1s.
fn shared_link() -> Vec<(NodeId, NodeId)> {
    named("2x1x1", &[("M1QAF2", "M1QBF2"), ("M1QAF3", "M1QBF3")])
}

/// Hand calculation: a torus link carries 10 Gb/s of cells and their control data, 6.957
/// Gb/s of RDMA payload;
/// two flows through it get half of that each: two FPGAs whose cells both cross an
/// intra-QFDB link to the F1, and the F1 itself beside one of them (its NI's cells enter
/// the router directly, and once got 31% of the link, their buffer's account letting
/// them in before cells that had waited: `Switch::admission`).
#[test]
fn two_streams_through_one_torus_link_get_half_of_it_each() {
    let f1 = named("2x1x1", &[("M1QAF1", "M1QBF1"), ("M1QAF2", "M1QBF2")]);
    for pairs in [shared_link(), f1] {
        let r = run("2x1x1", &pairs, 0);
        assert_shares(&r, 10.0 * TORUS_PAYLOAD_SHARE, 0.5, 0.02);
    }
}

/// Eight senders into one receiver, each through an input of its own: two FPGAs of the
/// receiver's QFDB and the F1s of its six torus neighbours (a 3x3x3 rack), into F1 of
/// the first QFDB. Hand calculation: the receiver's NI takes 19.2 Gb/s of cells, 17.07
/// Gb/s of payload; each sender gets an eighth of it, 2.133 Gb/s.
#[test]
fn eight_senders_into_one_get_an_eighth_each() {
    let shape: Shape = "3x3x3".parse().unwrap();
    let rx = NodeId(0);
    let mut tx = vec![NodeId(1), NodeId(2)];
    for d in 0..3 {
        for dir in [Dir::Plus, Dir::Minus] {
            tx.push(neighbour(&shape, rx, Port::Torus(d, dir)).unwrap().0);
        }
    }
    let pairs: Vec<_> = tx.iter().map(|&t| (t, rx)).collect();
    let r = run("3x3x3", &pairs, 0);
    assert_shares(&r, 19.2 * PAYLOAD_SHARE, 0.125, 0.01);
}

/// The same runs with the links' real-time latency jittered up to 0.3 and 3 us give the
/// same modeled times to the picosecond: the host's order of delivery does not enter.
#[test]
fn modeled_figures_do_not_depend_on_the_hosts_order() {
    let incast = incast_of_four();
    for (shape, pairs) in [("2x1x1", shared_link()), ("3x1x1", incast)] {
        let base = run(shape, &pairs, 0);
        for jitter in [300, 3000] {
            let r = run(shape, &pairs, jitter);
            assert_eq!(r.done, base.done, "{shape}, jitter {jitter} ns");
        }
    }
}

/// Eight transfers of one rank whose window holds 16 blocks, over one intra-QFDB link:
/// a block cut once the window is full starts when an answer freed its place, so even the
/// engine's own queueing goes in modeled order (no late cell), and the link stays full.
/// Hand calculation: 16 Gb/s of cells, 14.22 Gb/s of payload, for 8 MiB.
#[test]
fn a_full_rank_window_starts_blocks_when_places_free() {
    let pairs: Vec<_> = (0..8).map(|_| (NodeId(0), NodeId(1))).collect();
    let ni = NiConfig {
        rank_window_blocks: 16,
        ..NiConfig::default()
    };
    let r = run_with("1x1x1", &pairs, 0, ni, None);
    assert_eq!(r.late, 0, "cells forwarded out of modeled order");
    let last = r.done.iter().max().unwrap();
    let gbps = (8 * LEN * 8) as f64 / (last.ps() as f64 / 1000.0);
    let link = 16.0 * PAYLOAD_SHARE;
    assert!(
        (gbps / link - 1.0).abs() < 0.02,
        "8 MiB in {last}: {gbps:.3} Gb/s against the link's {link:.3}"
    );
}

/// With the NI's default real-time timer, which fires while blocks wait for cuts, the
/// flows of a cut rack still model what the whole rack does, and no copy goes: the
/// answers a deep queue delays come within the modeled timeout, which follows the
/// modeled round trip (a fixed 100 us sent 66 copies on the shared link, and the figures
/// depended on which real-time timers fired first).
#[test]
fn answers_late_only_behind_a_queue_send_no_copy() {
    for (shape, pairs) in [("2x1x1", shared_link()), ("3x1x1", incast_of_four())] {
        let whole = run(shape, &pairs, 0);
        let cut = run_with(shape, &pairs, 3000, NiConfig::default(), Some(20_000));
        assert_eq!(
            (whole.retransmissions, cut.retransmissions),
            (0, 0),
            "{shape}: copies"
        );
        assert_eq!(cut.done, whole.done, "{shape}");
        assert_eq!(cut.late, 0, "{shape}: cells forwarded out of modeled order");
    }
}

/// Horizons from consistent cuts, gathered by a coordinator 20 us from every node with
/// link jitter of 3 us, as daemons would have them, give the same modeled times to the
/// picosecond as horizons from the whole rack after every event, with nothing out of
/// order. What they cost is the cuts: every cut lets the rack go about one round trip of
/// modeled time further. Blocks wait for cuts in real time, so the retransmission timer
/// (real time) is raised beyond that wait, as a rack ordering cells must: a block sent
/// again is not ordered, and its copy would cost modeled time. (A copy also waits until
/// its answer cannot come first in modeled time, `Ni::set_arrival_bound`; that keeps out
/// copies of answers late in real time only, and the modeled timer follows the modeled
/// round trip: with the default timer the shared-link run sends none, see
/// `answers_late_only_behind_a_queue_send_no_copy`.)
#[test]
fn horizons_from_cuts_give_the_same_figures_as_the_whole_rack() {
    let incast = incast_of_four();
    let patient = NiConfig {
        retransmit_ns: 10_000_000_000,
        ..NiConfig::default()
    };
    // The cuts and parts each takes, as docs/modeled-time.md publishes them (with every
    // node in every cut: 8263 and 12449 cuts, 66104 and 149388 parts).
    for (shape, pairs, cuts) in [
        ("2x1x1", shared_link(), (8264, 36886)),
        ("3x1x1", incast, (16349, 76549)),
    ] {
        let whole = run(shape, &pairs, 0);
        let cut = run_with(shape, &pairs, 3000, patient, Some(20_000));
        assert_eq!(cut.done, whole.done, "{shape}");
        assert_eq!(cut.late, 0, "{shape}: cells forwarded out of modeled order");
        assert_eq!((cut.cuts, cut.parts), cuts, "{shape}: cuts and parts taken");
        let modeled = cut.done.iter().max().unwrap().ps() as f64 / 1e6;
        eprintln!(
            "{shape}: {} cuts, {} parts for {modeled:.3} us of modeled time ({:.0} ns per cut), \
             {:.1} ms simulated",
            cut.cuts,
            cut.parts,
            modeled * 1000.0 / cut.cuts as f64,
            cut.wall.nanos() as f64 / 1e6,
        );
    }
}

/// A lone small write and its answer cross several hops per cut: a cut's horizons bound
/// what can still come in on each link exactly, router traversals included, so a cell a
/// cut saw upstream can pass every switch on its way. Before, its bound fell a router's
/// extra short at every torus hop, and an answer waited at each switch on its own link's
/// lower VCs: ten cuts for the three hops out and back below, eighteen over the report's
/// path (e). Same modeled completion either way, nothing out of order. The cuts are of
/// the nodes that may matter: 5 and 9 cuts of every node before quiet nodes were left
/// out (40 and 1152 parts), 8 and 14 cuts after, of 21 and 153 parts (the first cut of
/// the 128-node rack is of every node, 128 of the 153).
#[test]
fn a_small_write_and_its_answer_cross_several_hops_per_cut() {
    for (shape, from, to, hops, cuts, done_ps) in [
        ("2x1x1", "M1QAF2", "M1QBF3", 3, (8, 21), 1_605_665),
        ("4x4x2", "M1QAF2", "M3QCF2", 6, (14, 153), 3_195_665),
    ] {
        let s: Shape = shape.parse().unwrap();
        let flows = [Flow {
            from: s.parse_node(from).unwrap(),
            to: s.parse_node(to).unwrap(),
            len: 8,
            at: ModelTime::ZERO,
        }];
        let cfg = BenchConfig {
            sim: SimConfig {
                seed: 7,
                switch: SwitchConfig {
                    modeled_order: true,
                    ..SwitchConfig::default()
                },
                coordinator_ns: Some(20_000),
                ..SimConfig::default()
            },
            ni: NiConfig::default(),
        };
        let r = bench::flows(s, &flows, cfg).unwrap();
        eprintln!(
            "{shape} {from} -> {to}: {} cuts, {} parts for {hops} hops out and back",
            r.cuts, r.parts
        );
        assert_eq!(r.done, [ModelTime(done_ps)], "{shape}");
        assert_eq!(r.late, 0, "{shape}");
        assert_eq!(
            (r.cuts, r.parts),
            cuts,
            "{shape}: cuts and parts for {hops} hops out and back"
        );
    }
}
