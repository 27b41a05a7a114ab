//! Whole-rack simulation tests: every node's core wired together by `sim::Sim`, driven in
//! simulated time, deterministic for a seed.
//!
//! What is checked here is what the fabric actually does, observed from outside:
//! - probes record the path the cells really took, which must be the dimension-order path
//!   of `routing::path` (SPEC §3), for every pair of nodes;
//! - the path classes of the report's Table 1 (SPEC §1) come out with the right hop counts
//!   and link kinds;
//! - saturating whole racks neither deadlocks nor overruns a buffer, and delivers every cell
//!   exactly once to the right node (SPEC §3: lossless, deadlock-free);
//! - a receiver that stops draining pushes back hop by hop to the sender, which can then
//!   have injected no more than the buffers along the path hold;
//! - rings of size >= 5 under saturation use the dateline's second virtual channel.

use std::collections::HashMap;

use exanet_proto::cell::OVERHEAD;
use exanet_proto::routing::{self, Vc};
use exanet_proto::sim::{Sim, SimConfig};
use exanet_proto::topology::{self, LinkKind, Port};
use exanet_proto::Instant;
use exanet_proto::NodeEvent;
use exanet_proto::SwitchConfig;
use exanet_proto::{NodeId, Shape};

/// Payload of the load cells: full cells, 288 B on the wire.
const PAYLOAD: usize = 256;
const WIRE: u32 = (OVERHEAD + PAYLOAD) as u32;

/// Small buffers so that queues fill and backpressure is exercised.
fn small() -> SwitchConfig {
    SwitchConfig {
        window: 4096,
        local_window: 4096,
        ..SwitchConfig::default()
    }
}

fn shape(s: &str) -> Shape {
    s.parse().unwrap()
}

fn id(shape: &Shape, name: &str) -> NodeId {
    shape.parse_node(name).unwrap()
}

fn new_sim(shape: Shape, cfg: SimConfig) -> Sim {
    Sim::new(shape, cfg).unwrap()
}

/// Runs until no event is pending (true) or `limit_us` of simulated time has passed (false).
/// Events are handed to `on_event` as they come, so that big runs keep memory bounded.
fn run_to_quiet(
    sim: &mut Sim,
    limit_us: u64,
    mut on_event: impl FnMut(NodeId, Instant, NodeEvent),
) -> bool {
    let limit = Instant::from_micros(limit_us);
    loop {
        let slice = Instant(sim.now().nanos() + 20_000).min(limit);
        let emptied = sim.run_until(slice);
        for (n, t, e) in sim.take_events() {
            on_event(n, t, e);
        }
        if emptied {
            return true;
        }
        if sim.now() >= limit {
            return false;
        }
    }
}

/// Asserts that the rack is quiet: nothing in flight, nothing queued anywhere. A rack whose
/// event queue is empty while cells are still queued is deadlocked.
fn assert_quiet(sim: &Sim, what: &str) {
    let stuck: Vec<String> = sim
        .nodes()
        .filter(|n| !n.is_idle())
        .map(|n| {
            let mut q = String::new();
            for p in Port::all() {
                let c = n.switch().queue_cells(p);
                if c > 0 {
                    q.push_str(&format!(" {p}:{c}"));
                }
            }
            format!(
                "{} (load left {}, queued{})",
                sim.shape().display(n.id()),
                n.load_remaining(),
                q
            )
        })
        .collect();
    assert!(
        stuck.is_empty(),
        "{what}: rack went silent with cells stuck (deadlock) at {} nodes: {:?}",
        stuck.len(),
        &stuck[..stuck.len().min(8)]
    );
    assert!(sim.is_quiet(), "{what}: rack not quiet");
    // Credit is conserved: with nothing queued or in flight every output holds its whole
    // window again, so no credit leaked or was minted anywhere.
    for n in sim.nodes() {
        let sw = n.switch();
        for p in std::iter::once(Port::Local).chain(sw.link_ports()) {
            assert_eq!(
                sw.in_flight(p),
                0,
                "{what}: {} port {p} is missing credit at rest",
                sim.shape().display(n.id())
            );
            assert_eq!(sw.queue_bytes(p), 0);
        }
    }
}

fn assert_no_errors(sim: &Sim, what: &str) {
    assert!(
        sim.errors().is_empty(),
        "{what}: switches reported {} errors, first {:?}",
        sim.errors().len(),
        sim.errors().first()
    );
    for n in sim.nodes() {
        assert!(
            n.stats().errors.is_empty(),
            "{what}: node {} counted errors {:?}",
            sim.shape().display(n.id()),
            n.stats().errors
        );
    }
}

/// The node sequence of the dimension-order route.
fn route_nodes(shape: &Shape, src: NodeId, dst: NodeId) -> Vec<NodeId> {
    routing::path(shape, src, dst)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// The dimension-order path of SPEC §3 worked out from coordinates alone, independently of
/// `routing`: source F -> its F1 -> torus X, then Y, then Z, the shorter way round each
/// ring with ties to `+` -> destination F1 -> destination F; direct inside a QFDB.
fn spec_path(shape: &Shape, src: NodeId, dst: NodeId) -> Vec<NodeId> {
    let (a, b) = (shape.coord(src).unwrap(), shape.coord(dst).unwrap());
    let mut out = vec![src];
    if src == dst {
        return out;
    }
    if a.same_qfdb(&b) {
        out.push(dst);
        return out;
    }
    let mut c = a;
    if c.fpga != 1 {
        c.fpga = 1;
        out.push(shape.id(c).unwrap());
    }
    for d in 0..3 {
        let k = shape.ring(d);
        while c.dim(d) != b.dim(d) {
            let ahead = (b.dim(d) + k - c.dim(d)) % k;
            let step = if ahead <= k - ahead { 1 } else { k - 1 };
            let next = (c.dim(d) + step) % k;
            match d {
                0 => c.x = next,
                1 => c.y = next,
                _ => c.z = next,
            }
            out.push(shape.id(c).unwrap());
        }
    }
    if b.fpga != 1 {
        out.push(dst);
    }
    out
}

/// The kind of the link between two adjacent nodes (there is at most one).
fn link_kinds(shape: &Shape) -> HashMap<(NodeId, NodeId), LinkKind> {
    let mut m = HashMap::new();
    for l in topology::links(shape) {
        assert!(m.insert((l.a, l.b), l.kind).is_none(), "two links {l:?}");
        m.insert((l.b, l.a), l.kind);
    }
    m
}

/// Every node probes every other node; returns the (forward, back) paths the fabric
/// recorded for each (src, dst).
fn probe_all_pairs(shape: Shape) -> HashMap<(NodeId, NodeId), (Vec<NodeId>, Vec<NodeId>)> {
    let mut sim = new_sim(shape, SimConfig::default());
    for src in shape.node_ids() {
        for dst in shape.node_ids().filter(|d| *d != src) {
            sim.node_mut(src).send_probe(dst, dst.0).unwrap();
        }
    }
    sim.kick_all();
    let mut got = HashMap::new();
    let quiet = run_to_quiet(&mut sim, 100_000, |n, _, e| {
        if let NodeEvent::ProbeReply {
            id,
            forward,
            back,
            truncated,
        } = e
        {
            assert!(!truncated, "probe {n}->{id} truncated");
            let prev = got.insert((n, NodeId(id)), (forward, back));
            assert!(prev.is_none(), "probe {n}->{id} answered twice");
        }
    });
    assert!(quiet, "probes did not finish");
    assert_quiet(&sim, "all-pairs probes");
    assert_no_errors(&sim, "all-pairs probes");
    let n = u64::from(shape.nodes());
    for node in sim.nodes() {
        assert_eq!(node.stats().probes_answered, n - 1);
    }
    got
}

fn check_all_pairs(shape: Shape) {
    let got = probe_all_pairs(shape);
    let n = shape.nodes() as usize;
    assert_eq!(got.len(), n * (n - 1), "every pair answered");
    let kinds = link_kinds(&shape);
    for src in shape.node_ids() {
        for dst in shape.node_ids().filter(|d| *d != src) {
            let (fwd, back) = &got[&(src, dst)];
            let want = route_nodes(&shape, src, dst);
            assert_eq!(
                fwd,
                &want,
                "forward path {} -> {} differs from the routing function",
                shape.display(src),
                shape.display(dst)
            );
            assert_eq!(
                fwd,
                &spec_path(&shape, src, dst),
                "forward path {} -> {} is not SPEC §3's dimension order",
                shape.display(src),
                shape.display(dst)
            );
            let want_back = route_nodes(&shape, dst, src);
            assert_eq!(
                back,
                &want_back,
                "return path {} -> {} differs from dimension order",
                shape.display(dst),
                shape.display(src)
            );
            // Every recorded hop is a real link.
            for w in fwd.windows(2).chain(back.windows(2)) {
                assert!(kinds.contains_key(&(w[0], w[1])), "no link {:?}", w);
            }
        }
    }
}

#[test]
fn all_pairs_16_nodes_follow_dimension_order() {
    check_all_pairs(shape("2x2x1"));
}

#[test]
fn all_pairs_128_nodes_follow_dimension_order() {
    check_all_pairs(Shape::PROTOTYPE);
}

#[test]
fn all_pairs_odd_rings_follow_dimension_order() {
    // Rings of 3 and 5 have no ties and a real minus direction.
    check_all_pairs(shape("5x3x1"));
}

/// (inter-blade 10G hops, intra-blade 10G hops, intra-QFDB 16G hops) of a list of link kinds.
fn ijk(kinds: &[LinkKind]) -> (usize, usize, usize) {
    let c = |f: &dyn Fn(LinkKind) -> bool| kinds.iter().filter(|k| f(**k)).count();
    (
        c(&|k| matches!(k, LinkKind::TorusY | LinkKind::TorusZ)),
        c(&|k| k == LinkKind::TorusX),
        c(&|k| k == LinkKind::IntraQfdb),
    )
}

#[test]
fn table1_path_classes_on_the_prototype() {
    use LinkKind::*;
    let s = Shape::PROTOTYPE;
    // (e): Table 2's Inter-mezz(3,1,2) = 3 inter-blade + 1 intra-blade 10G hops and 2
    // intra-QFDB hops. Inter-blade hops are Y/Z torus hops (blade = z*Y + y + 1), intra-blade
    // hops X hops. In a 4x4x2 rack a Y distance of 2 (the most a ring of 4 needs) plus the one
    // Z hop give 3; an X distance of 1 gives 1; endpoints that are not F1 give the 2 intra-QFDB
    // hops. From M1QAF2 = (x0,y0,z0,F2): x=1 (slot B), y=2, z=1 is blade 1*4+2+1 = 7, so
    // M7QBF3: F2->F1, X 0->1, Y 0->1->2, Z 0->1, F1->F3.
    let cases: &[(&str, &str, &str, &[LinkKind])] = &[
        ("(a) intra-QFDB", "M1QAF1", "M1QAF2", &[IntraQfdb]),
        ("(b) intra-mezz 1 hop", "M1QAF1", "M1QBF1", &[TorusX]),
        (
            "(c) intra-mezz 2 hops",
            "M1QAF1",
            "M1QBF2",
            &[TorusX, IntraQfdb],
        ),
        (
            "(d) intra-mezz 3 hops",
            "M1QAF2",
            "M1QBF3",
            &[IntraQfdb, TorusX, IntraQfdb],
        ),
        (
            "(e) inter-mezz (3,1,2)",
            "M1QAF2",
            "M7QBF3",
            &[IntraQfdb, TorusX, TorusY, TorusY, TorusZ, IntraQfdb],
        ),
    ];
    let kinds = link_kinds(&s);
    let mut sim = new_sim(s, SimConfig::default());
    for (i, (_, a, b, _)) in cases.iter().enumerate() {
        sim.node_mut(id(&s, a))
            .send_probe(id(&s, b), i as u32)
            .unwrap();
        sim.kick(id(&s, a));
    }
    let mut replies = HashMap::new();
    assert!(run_to_quiet(&mut sim, 10_000, |n, _, e| {
        if let NodeEvent::ProbeReply { id, forward, .. } = e {
            replies.insert(id, (n, forward));
        }
    }));
    assert_quiet(&sim, "table 1");
    assert_no_errors(&sim, "table 1");
    for (i, (what, a, b, want)) in cases.iter().enumerate() {
        let (from, fwd) = replies
            .get(&(i as u32))
            .unwrap_or_else(|| panic!("{what}: no reply"));
        assert_eq!(*from, id(&s, a), "{what}: reply went to the wrong node");
        assert_eq!(fwd.first(), Some(&id(&s, a)), "{what}");
        assert_eq!(fwd.last(), Some(&id(&s, b)), "{what}");
        // The hops the fabric recorded, classified by the link each one used ...
        let got: Vec<LinkKind> = fwd.windows(2).map(|w| kinds[&(w[0], w[1])]).collect();
        assert_eq!(got.len(), want.len(), "{what}: hop count of {a}->{b}");
        assert_eq!(&got, want, "{what}: link kinds of {a}->{b}");
        // ... and the same from the routing function's ports.
        let from_route: Vec<LinkKind> = routing::path(&s, id(&s, a), id(&s, b))
            .unwrap()
            .iter()
            .filter(|(_, h)| h.port != Port::Local)
            .map(|(n, h)| {
                let (peer, _) = topology::neighbour(&s, *n, h.port).unwrap();
                kinds[&(*n, peer)]
            })
            .collect();
        assert_eq!(&from_route, want, "{what}: routed link kinds");
        let gbps: Vec<u32> = got.iter().map(|k| k.gbps()).collect();
        let want_gbps: Vec<u32> = want
            .iter()
            .map(|k| if *k == IntraQfdb { 16 } else { 10 })
            .collect();
        assert_eq!(gbps, want_gbps, "{what}: link rates");
    }
    // The (i,j,k) of (e) and the blades at its ends.
    let e = &cases[4];
    assert_eq!(ijk(e.3), (3, 1, 2));
    let (ba, bb) = (
        s.name(id(&s, e.1)).unwrap().blade,
        s.name(id(&s, e.2)).unwrap().blade,
    );
    assert_ne!(ba, bb, "(e) is inter-mezzanine");
    // (a)-(d) stay on blade 1.
    for (what, a, b, _) in &cases[..4] {
        assert_eq!(s.name(id(&s, a)).unwrap().blade, 1, "{what}");
        assert_eq!(s.name(id(&s, b)).unwrap().blade, 1, "{what}");
    }
    // Every (i,j,k) a 4x4x2 rack can produce: i <= 3 (2 Y + 1 Z), j <= 2, k <= 2, and
    // (3,1,2) is one of them.
    let mut classes = std::collections::BTreeSet::new();
    for src in s.node_ids() {
        for dst in s.node_ids().filter(|d| *d != src) {
            let ks: Vec<LinkKind> = route_nodes(&s, src, dst)
                .windows(2)
                .map(|w| kinds[&(w[0], w[1])])
                .collect();
            classes.insert(ijk(&ks));
        }
    }
    assert!(classes.contains(&(3, 1, 2)));
    assert_eq!(classes.iter().max(), Some(&(3, 2, 2)));
    assert!(classes.iter().all(|&(i, j, k)| i <= 3 && j <= 2 && k <= 2));
}

/// What a saturation run found.
struct Saturation {
    sim: Sim,
    delivered: u64,
    sim_us: u64,
}

/// Every node in `senders` sends `per_dst` full cells to each node of `dsts_of(sender)`,
/// round-robin, all at once; the run must end with every cell delivered exactly once to the
/// node its sequence number names, nothing stuck, no buffer overrun.
fn saturate_to(
    shape: Shape,
    cfg: SimConfig,
    senders: &[NodeId],
    dsts_of: &dyn Fn(NodeId) -> Vec<NodeId>,
    per_dst: u64,
) -> Saturation {
    let what = format!(
        "saturation of {shape} (seed {}, jitter {})",
        cfg.seed, cfg.jitter_ns
    );
    let mut sim = new_sim(shape, cfg);
    let mut dsts = HashMap::new();
    let mut totals = HashMap::new();
    for &src in senders {
        let d = dsts_of(src);
        let total = per_dst * d.len() as u64;
        let node = sim.node_mut(src);
        node.set_trace_load(true);
        node.start_load(&d, total, PAYLOAD).unwrap();
        dsts.insert(src, d);
        totals.insert(src, total);
    }
    // Receivers trace too (a node that is not a sender still reports what it gets).
    for r in shape.node_ids() {
        sim.node_mut(r).set_trace_load(true);
    }
    sim.kick_all();
    let mut seen: HashMap<NodeId, Vec<u8>> = totals
        .iter()
        .map(|(s, t)| (*s, vec![0u8; *t as usize]))
        .collect();
    let mut delivered = 0u64;
    let mut load_sent = 0usize;
    let mut misdelivered = Vec::new();
    let quiet = run_to_quiet(&mut sim, 1_000_000, |at, _, e| match e {
        NodeEvent::LoadDelivered { src, seq } => {
            delivered += 1;
            let d = &dsts[&src];
            let want = d[(seq % d.len() as u64) as usize];
            if want != at && misdelivered.len() < 8 {
                misdelivered.push((src, seq, at, want));
            }
            match seen.get_mut(&src).and_then(|v| v.get_mut(seq as usize)) {
                Some(c) => *c = c.saturating_add(1),
                None => panic!("{what}: cell ({src}, {seq}) was never sent"),
            }
        }
        NodeEvent::LoadSent => load_sent += 1,
        NodeEvent::ProbeReply { .. } => panic!("no probes were sent"),
        NodeEvent::Ni(e) => panic!("no NI traffic was posted, yet the NI reported {e:?}"),
    });
    assert!(quiet, "{what}: not finished after 1 s of simulated time");
    assert_quiet(&sim, &what);
    assert_no_errors(&sim, &what);
    assert!(
        misdelivered.is_empty(),
        "{what}: (src, seq, at, want) {misdelivered:?}"
    );
    for (src, s) in &seen {
        let bad: Vec<(usize, u8)> = s
            .iter()
            .enumerate()
            .filter(|(_, c)| **c != 1)
            .map(|(i, c)| (i, *c))
            .take(8)
            .collect();
        assert!(
            bad.is_empty(),
            "{what}: cells of {} delivered other than once (seq, times): {bad:?}",
            shape.display(*src)
        );
    }
    assert_eq!(delivered, totals.values().sum::<u64>(), "{what}");
    assert_eq!(load_sent, senders.len(), "{what}: LoadSent events");
    let mut rx = 0;
    for node in sim.nodes() {
        assert_eq!(node.load_remaining(), 0);
        rx += node.stats().load_rx_cells;
        // Buffers never held more than their capacity: one queue per VC on links (only torus
        // links use VC1), one on the NI's injection port.
        let sw = node.switch();
        for p in std::iter::once(Port::Local).chain(sw.link_ports()) {
            let vcs = if matches!(p, Port::Torus(..)) { 2 } else { 1 };
            let peak = sw.port_stats(p).peak_queue_bytes;
            assert!(
                peak <= 2 * sw.input_capacity(p),
                "{what}: {} port {p} peaked at {peak} B",
                shape.display(node.id())
            );
            assert!(
                peak <= vcs * sw.input_capacity(p),
                "{what}: {} port {p} peaked at {peak} B on {vcs} VCs",
                shape.display(node.id())
            );
        }
    }
    assert_eq!(rx, delivered);
    let sim_us = sim.now().nanos() / 1000;
    eprintln!(
        "{what}: {delivered} cells delivered in {sim_us} simulated us, {} events",
        sim.processed()
    );
    Saturation {
        sim,
        delivered,
        sim_us,
    }
}

/// [`saturate_to`] with every other node as a destination, starting at the next node up so
/// that the sources do not all aim at node 0 first.
fn saturate(shape: Shape, cfg: SimConfig, senders: &[NodeId], per_dst: u64) -> Saturation {
    let n = shape.nodes();
    let all_others =
        move |src: NodeId| -> Vec<NodeId> { (1..n).map(|k| NodeId((src.0 + k) % n)).collect() };
    saturate_to(shape, cfg, senders, &all_others, per_dst)
}

/// Checks that a saturation run really saturated: some input queue filled to within one
/// cell of its window and some output waited for credit.
fn assert_backpressure_exercised(s: &Saturation, what: &str) {
    let now = s.sim.now();
    let mut fullest = 0;
    let mut stalled = 0u64;
    for node in s.sim.nodes() {
        let sw = node.switch();
        for p in sw.link_ports() {
            fullest = fullest.max(sw.port_stats(p).peak_queue_bytes);
            stalled += sw.stall_ns(p, now);
        }
    }
    let window = s.sim.node(NodeId(0)).switch().config().window;
    assert!(
        fullest + WIRE > window,
        "{what}: no link queue ever filled (fullest {fullest} B of {window})"
    );
    assert!(stalled > 0, "{what}: no output ever waited for credit");
}

#[test]
fn all_to_all_saturation_of_the_prototype_rack() {
    let s = Shape::PROTOTYPE;
    let cfg = SimConfig {
        switch: small(),
        ..SimConfig::default()
    };
    let all: Vec<NodeId> = s.node_ids().collect();
    let r = saturate(s, cfg, &all, 20);
    assert_eq!(r.delivered, 128 * 127 * 20);
    assert_backpressure_exercised(&r, "4x4x2 all-to-all");
    // Many microseconds of saturation: 325k cells of 288 B cannot cross the rack faster than
    // its links allow.
    assert!(r.sim_us > 100, "ran only {} us", r.sim_us);
}

#[test]
fn all_to_all_saturation_with_jitter_and_seeds() {
    let s = Shape::PROTOTYPE;
    let all: Vec<NodeId> = s.node_ids().collect();
    let mut ends = Vec::new();
    for seed in [7, 1234, 0xE8A] {
        let cfg = SimConfig {
            seed,
            switch: small(),
            latency_ns: 120,
            jitter_ns: 400,
            ..Default::default()
        };
        let r = saturate(s, cfg, &all, 10);
        assert_backpressure_exercised(&r, "4x4x2 all-to-all with jitter");
        ends.push(r.sim.now());
    }
    // Different seeds draw different jitter, so the runs really differ.
    assert!(
        ends.windows(2).any(|w| w[0] != w[1]),
        "seeds made no difference: {ends:?}"
    );
}

#[test]
fn saturation_is_deterministic_for_a_seed() {
    let s = shape("2x2x1");
    let all: Vec<NodeId> = s.node_ids().collect();
    let cfg = SimConfig {
        seed: 99,
        switch: small(),
        latency_ns: 120,
        jitter_ns: 300,
        ..Default::default()
    };
    let a = saturate(s, cfg, &all, 10);
    let b = saturate(s, cfg, &all, 10);
    assert_eq!(a.sim.now(), b.sim.now());
    assert_eq!(a.sim.processed(), b.sim.processed());
}

#[test]
fn backpressure_bounds_what_a_sender_injects() {
    let s = shape("2x2x1");
    let src = id(&s, "M1QAF2");
    let dst = id(&s, "M2QBF3");
    let route = routing::path(&s, src, dst).unwrap();
    // M1QAF2 -> M1QAF1 -> M1QBF1 (X) -> M2QBF1 (Y) -> M2QBF3: four links, each used on one
    // VC (rings of 2 never cross a dateline on the way out of position 0).
    let link_hops = route.len() - 1;
    assert_eq!(link_hops, 4);
    assert!(route.iter().all(|(_, h)| h.vc == Vc::ZERO));

    let cfg = SimConfig {
        switch: small(),
        ..SimConfig::default()
    };
    let mut sim = new_sim(s, cfg);
    sim.node_mut(dst).set_sink_paused(true);
    sim.node_mut(dst).set_trace_load(true);
    const CELLS: u64 = 1000;
    sim.node_mut(src)
        .start_load(&[dst], CELLS, PAYLOAD)
        .unwrap();
    sim.kick(src);
    // With the sink paused the rack runs out of events with cells parked along the path.
    let mut early = 0;
    assert!(run_to_quiet(&mut sim, 100_000, |_, _, e| {
        if matches!(e, NodeEvent::LoadDelivered { .. }) {
            early += 1;
        }
    }));
    assert_eq!(early, 0, "a paused sink consumed cells");
    assert_no_errors(&sim, "paused sink");

    // Where the injected cells can be, with credit flow control (a cell occupies its wire
    // length of credit from the moment it leaves the upstream switch until the downstream
    // switch forwards it):
    //   - the source NI's injection queue: local_window bytes;
    //   - on or at the far end of each of the `link_hops` links: one VC's window;
    //   - the paused destination NI: the delivery credit, local_window bytes.
    // A queue holds whole cells, so each holds floor(bytes / wire) of them; a few cells of
    // slack cover nothing in particular but keep the bound from being a knife edge.
    let per = |bytes: u32| u64::from(bytes / WIRE);
    let exact = 2 * per(small().local_window) + link_hops as u64 * per(small().window);
    let bound = exact + 3;
    let injected = sim.node(src).stats().load_tx_cells;
    let left = sim.node(src).load_remaining();
    eprintln!("paused sink: sender injected {injected} cells, path holds {exact}, bound {bound}");
    assert!(left > 0, "the sender was never pushed back");
    assert_eq!(injected + left, CELLS);
    assert!(
        injected <= bound,
        "sender injected {injected} cells, the path can hold only {bound}"
    );
    // And the path really filled: nothing but backpressure stopped the sender.
    assert!(
        injected + 2 * (link_hops as u64 + 2) >= exact,
        "sender injected only {injected} of the {exact} cells the path holds"
    );
    // The destination took exactly its delivery credit.
    assert_eq!(
        sim.node(dst).stats().delivered_cells,
        per(small().local_window)
    );
    assert_eq!(sim.node(dst).stats().load_rx_cells, 0);
    // Every switch on the path is holding cells and every link on it ran out of credit.
    for (n, hop) in &route[..link_hops] {
        assert!(!sim.node(*n).is_idle(), "{} holds nothing", s.display(*n));
        assert!(
            sim.node(*n).switch().stall_ns(hop.port, sim.now()) > 0,
            "{} never stalled on {}",
            s.display(*n),
            hop.port
        );
    }
    assert!(!sim.is_quiet());

    // Unpause: everything arrives, once, in order (one path, FIFO links).
    sim.node_mut(dst).set_sink_paused(false);
    sim.kick(dst);
    let mut seqs = Vec::new();
    assert!(run_to_quiet(&mut sim, 1_000_000, |at, _, e| {
        if let NodeEvent::LoadDelivered { src: from, seq } = e {
            assert_eq!((at, from), (dst, src));
            seqs.push(seq);
        }
    }));
    assert_quiet(&sim, "after unpausing");
    assert_no_errors(&sim, "after unpausing");
    assert_eq!(
        seqs,
        (0..CELLS).collect::<Vec<_>>(),
        "each cell exactly once, in order"
    );
    assert_eq!(sim.node(src).stats().load_tx_cells, CELLS);
    assert_eq!(sim.node(dst).stats().load_rx_cells, CELLS);
}

/// Flows on a ring of QFDBs whose dimension-order route uses VC1 somewhere.
fn dateline_flows(s: &Shape) -> usize {
    let mut n = 0;
    for a in s.node_ids() {
        for b in s.node_ids().filter(|b| *b != a) {
            if routing::path(s, a, b)
                .unwrap()
                .iter()
                .any(|(_, h)| h.vc == Vc::ONE)
            {
                n += 1;
            }
        }
    }
    n
}

/// Some torus input held more than one VC's window at once: both VCs were occupied, so
/// VC1 carried traffic while VC0 was full.
fn both_vcs_filled(s: &Saturation) -> bool {
    s.sim.nodes().any(|n| {
        let sw = n.switch();
        sw.link_ports().any(|p| {
            matches!(p, Port::Torus(..)) && sw.port_stats(p).peak_queue_bytes > sw.input_capacity(p)
        })
    })
}

#[test]
fn dateline_ring_of_five_under_saturation() {
    let s = shape("5x1x1");
    assert!(dateline_flows(&s) > 0);
    // Every node sends to the four nodes two QFDBs ahead and the four two behind: every
    // flow crosses two torus links the same way round, so each link direction carries two
    // flows and the transit cells waiting at each F1 for the next link form the cycle of
    // waits around the ring that a ring without a dateline deadlocks on.
    let two_away = |src: NodeId| -> Vec<NodeId> {
        let c = s.coord(src).unwrap();
        let mut d = Vec::new();
        for x in [(c.x + 2) % 5, (c.x + 3) % 5] {
            for fpga in 1..=4 {
                d.push(s.id(exanet_proto::Coord { x, fpga, ..c }).unwrap());
            }
        }
        d
    };
    // Those flows do use VC1: the ones whose two hops cross the dateline between x=4 and 0.
    let crossing = s
        .node_ids()
        .flat_map(|a| two_away(a).into_iter().map(move |b| (a, b)))
        .filter(|&(a, b)| {
            routing::path(&s, a, b)
                .unwrap()
                .iter()
                .any(|(_, h)| h.vc == Vc::ONE)
        })
        .count();
    assert_eq!(
        crossing,
        20 * 8 * 2 / 5,
        "two of the five ring positions cross per direction"
    );
    let all: Vec<NodeId> = s.node_ids().collect();
    for (seed, jitter) in [(1, 0), (5, 250), (6, 900)] {
        let cfg = SimConfig {
            seed,
            switch: small(),
            latency_ns: 120,
            jitter_ns: jitter,
            ..Default::default()
        };
        let r = saturate_to(s, cfg, &all, &two_away, 100);
        assert_backpressure_exercised(&r, "5x1x1");
        assert!(
            both_vcs_filled(&r),
            "5x1x1 seed {seed}: VC1 never held cells beside a full VC0"
        );
    }
}

#[test]
fn dateline_rings_of_six_and_three_under_saturation() {
    let s = shape("6x3x1");
    assert!(dateline_flows(&s) > 0);
    let all: Vec<NodeId> = s.node_ids().collect();
    let cfg = SimConfig {
        seed: 3,
        switch: small(),
        latency_ns: 120,
        jitter_ns: 200,
        ..Default::default()
    };
    let r = saturate(s, cfg, &all, 6);
    assert_backpressure_exercised(&r, "6x3x1");
    assert!(
        both_vcs_filled(&r),
        "6x3x1: VC1 never held cells beside a full VC0"
    );
}
