//! Link sessions in the simulator run as on daemons, because both drive the same
//! `Station`: a link the operator cuts closes at both ends and refuses to connect, comes
//! back with new sessions and hellos when set up, and a reconnection while the old
//! connection stands replaces its sessions. What was queued for a cut link gets through
//! once it is back; what was in flight on a closed or replaced connection is lost with it
//! (the NI's retransmission is for that), as on daemons. A simulator capture is made of the bytes a daemon's would be, and
//! reads back with the same decoders.

use exanet_proto::capture::{CaptureFilter, Direction};
use exanet_proto::cell::{Cell, CellType};
use exanet_proto::fault::LinkFaults;
use exanet_proto::sim::{Sim, SimConfig};
use exanet_proto::topology::port_to;
use exanet_proto::Instant;
use exanet_proto::NodeEvent;
use exanet_proto::{NodeId, Shape};

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

fn sim() -> Sim {
    let shape: Shape = "1x1x1".parse().unwrap();
    Sim::new(shape, SimConfig::default()).unwrap()
}

/// (sessions started, whether one is current) at each end of the A-B link.
fn sessions(sim: &Sim) -> [(u64, bool); 2] {
    [(A, B), (B, A)].map(|(n, peer)| {
        let port = port_to(sim.shape(), n, peer).unwrap();
        let end = sim.station(n).end(port).unwrap();
        (end.sessions(), end.session().is_some())
    })
}

/// Runs for `us` more microseconds of simulated time; returns the probe replies heard.
fn run_for(sim: &mut Sim, us: u64) -> Vec<(NodeId, u32, Vec<NodeId>)> {
    let until = Instant(sim.now().nanos() + us * 1000);
    sim.run_until(until);
    sim.take_events()
        .into_iter()
        .filter_map(|(n, _, e)| match e {
            NodeEvent::ProbeReply { id, forward, .. } => Some((n, id, forward)),
            _ => None,
        })
        .collect()
}

fn probe(sim: &mut Sim, id: u32) {
    sim.node_mut(A).send_probe(B, id).unwrap();
    sim.kick(A);
}

fn errors(sim: &Sim, n: NodeId, kind: &str) -> u64 {
    sim.node(n).stats().errors.get(kind).copied().unwrap_or(0)
}

fn down() -> LinkFaults {
    LinkFaults {
        down: true,
        ..Default::default()
    }
}

#[test]
fn a_cut_link_closes_refuses_and_comes_back_with_new_sessions_and_hellos() {
    let mut sim = sim();
    assert_eq!(
        sessions(&sim),
        [(1, true), (1, true)],
        "a rack comes up linked"
    );
    probe(&mut sim, 1);
    assert_eq!(run_for(&mut sim, 50), vec![(A, 1, vec![A, B])]);

    // The dialer's end cut: both ends lose the session (the far end a latency later).
    sim.set_link_faults(A, B, down(), 0).unwrap();
    assert_eq!(sessions(&sim)[0], (1, false));
    run_for(&mut sim, 1);
    assert_eq!(sessions(&sim), [(1, false), (1, false)]);
    // A probe waits in A's switch for the link; nothing redials a cut link.
    probe(&mut sim, 2);
    assert_eq!(run_for(&mut sim, 200_000), vec![], "no path while cut");
    assert_eq!(sessions(&sim), [(1, false), (1, false)]);

    // Set up: the dialer connects, both ends run a new session and exchange hellos, and
    // the waiting probe goes through.
    sim.set_link_faults(A, B, LinkFaults::default(), 0).unwrap();
    assert_eq!(run_for(&mut sim, 50), vec![(A, 2, vec![A, B])]);
    assert_eq!(sessions(&sim), [(2, true), (2, true)]);

    // The acceptor's end cut: the dialer's session closes with it and it does not dial
    // into a cut link; set up again, the dialer connects.
    sim.set_link_faults(B, A, down(), 0).unwrap();
    run_for(&mut sim, 1);
    assert_eq!(sessions(&sim), [(2, false), (2, false)]);
    probe(&mut sim, 3);
    assert_eq!(run_for(&mut sim, 200_000), vec![]);
    assert_eq!(sessions(&sim), [(2, false), (2, false)]);
    sim.set_link_faults(B, A, LinkFaults::default(), 0).unwrap();
    assert_eq!(run_for(&mut sim, 50), vec![(A, 3, vec![A, B])]);
    assert_eq!(sessions(&sim), [(3, true), (3, true)]);

    // A reconnection while the old connection stands (a restarted peer) replaces both
    // sessions; the link carries cells on the new ones.
    sim.reconnect(A, B).unwrap();
    run_for(&mut sim, 1);
    assert_eq!(sessions(&sim), [(4, true), (4, true)]);
    probe(&mut sim, 4);
    assert_eq!(run_for(&mut sim, 50), vec![(A, 4, vec![A, B])]);
    assert_eq!(sessions(&sim), [(4, true), (4, true)]);

    for n in [A, B] {
        for kind in [
            "hello_version",
            "hello_rack",
            "hello_shape",
            "hello_neighbour",
        ] {
            assert_eq!(errors(&sim, n, kind), 0, "{kind} at {n}");
        }
        assert_eq!(
            errors(&sim, n, "no_session"),
            0,
            "cells waited, none dropped"
        );
    }
    assert!(sim.errors().is_empty(), "{:?}", sim.errors());
    assert!(run_for(&mut sim, 1_000).is_empty());
    assert!(sim.is_quiet());
}

#[test]
fn a_simulator_capture_reads_back_as_a_daemons_does() {
    let mut sim = sim();
    sim.capture(B, CaptureFilter::default());
    probe(&mut sim, 7);
    assert_eq!(run_for(&mut sim, 50).len(), 1);
    let records = sim.take_capture(B);
    let seen: Vec<(Direction, NodeId, NodeId, CellType)> = records
        .iter()
        .map(|r| {
            let cell = Cell::decode(&r.cell.clone().into()).expect("captured cells decode");
            (r.seen.direction, r.seen.node, r.seen.peer, cell.kind)
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (Direction::Received, B, A, CellType::Probe),
            (Direction::Sent, B, A, CellType::ProbeReply),
        ]
    );
    let port = port_to(sim.shape(), B, A).unwrap();
    assert!(records.iter().all(|r| r.seen.port == port));
    assert!(
        records[0].seen.modeled < records[1].seen.modeled,
        "records carry the cells' modeled time"
    );
    // A filter takes only what it names.
    sim.capture(
        B,
        CaptureFilter {
            kind: Some(CellType::ProbeReply),
            ..Default::default()
        },
    );
    probe(&mut sim, 8);
    run_for(&mut sim, 50);
    let kinds: Vec<Direction> = sim
        .take_capture(B)
        .iter()
        .map(|r| r.seen.direction)
        .collect();
    assert_eq!(kinds, vec![Direction::Sent]);
}
