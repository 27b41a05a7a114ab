//! The fabric of real daemons where the simulator alone vouched for it (issue 10, "Tests
//! that must be able to fail", Missing):
//!
//! 1. rings longer than two and Z > 1: a 4x1x2 rack (32 daemons; the X ring of 4 is the
//!    prototype's, and the shortest ring where a route takes two hops round it, so the only
//!    one where a ring can hold a cycle of waits that the dateline must break; Z = 2).
//!    Verified RDMA and messages, plus the daemons' load generator, between every pair of
//!    QFDBs whose route crosses the X dateline and a Z link, and the pairs that close the
//!    `+` cycle round the ring, all at once: a deadlock shows as a run that does not end;
//! 2. backpressure between real daemons: a receiver stopped with SIGSTOP bounds what the
//!    sender puts on each link of the path to the window, and the sender stalls;
//! 3. an endpoint daemon killed and restarted with transfers in flight.
//!
//! The tests run one at a time (each starts its own rack; on a small machine three racks
//! at once would only measure each other). Needs `exactl` and `exanetd` built with the
//! same profile (`cargo build -p exanetd -p exactl`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exanet::{Endpoint, Error, OpError, Tag};
use exanet_proto::cell::MAX_CELL;
use exanet_proto::routing::{self, Vc};
use exanet_proto::topology::Port;
use exanet_proto::{Coord, NodeId, Shape};
use exanet_tests::{metric_sum, pattern, rss_kib, Sample, TestRack};
use serde_json::{json, Value};

const HTTP: Duration = Duration::from_secs(10);
const CONTROL: Duration = Duration::from_secs(10);

/// One test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// An operation's error must be the NI's verdict (timed out, NACKed), with its reason.
fn reason(e: &Error) -> Result<String, String> {
    match e {
        Error::Op {
            error: error @ (OpError::TimedOut | OpError::Nacked { .. }),
            ..
        } => Ok(error.to_string()),
        other => Err(format!(
            "an operation failed for a reason other than the network's: {other}"
        )),
    }
}

fn node(shape: &Shape, x: u32, z: u32, fpga: u32) -> NodeId {
    shape
        .id(Coord { x, y: 0, z, fpga })
        .unwrap_or_else(|| panic!("({x},0,{z}) F{fpga} is not in {shape}"))
}

/// The route as node names, both ends included.
fn names(shape: &Shape, p: &[(NodeId, routing::Hop)]) -> Vec<String> {
    p.iter().map(|(n, _)| shape.display(*n)).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap_or("?").to_string())
        .collect()
}

#[track_caller]
fn exactl_ok(rack: &TestRack, args: &[&str]) -> String {
    let r = rack.exactl(args);
    assert!(r.success(), "exactl {args:?}: {}", r.describe());
    r.stdout
}

#[track_caller]
fn metrics(rack: &TestRack, node: &str) -> Vec<Sample> {
    rack.node_metrics(node, HTTP)
        .unwrap_or_else(|e| panic!("metrics of {node}: {e}"))
}

/// A link metric of `node`'s end of its link to `peer` (summed over directions unless one
/// is given).
fn link_metric(s: &[Sample], name: &str, peer: &str, direction: Option<&str>) -> f64 {
    match direction {
        Some(d) => metric_sum(s, name, &[("peer", peer), ("direction", d)]),
        None => metric_sum(s, name, &[("peer", peer)]),
    }
}

/// Starts a rack of `shape` (with `--window`), then, if `ni` is given, takes it down,
/// appends `ni` to its rack file and starts it again (the NI settings are read at start).
fn rack_with(tag: &str, shape: &str, window: Option<&str>, ni: Option<&str>) -> TestRack {
    let rack = TestRack::new(tag);
    let mut args = vec!["rack", "up", "--shape", shape, "--timeout", "60"];
    if let Some(w) = window {
        args.extend(["--window", w]);
    }
    let r = rack.exactl_timeout(&args, Duration::from_secs(90));
    assert!(r.success(), "rack up: {}", r.describe());
    if let Some(ni) = ni {
        let r = rack.down().unwrap_or_else(|e| panic!("{e}"));
        assert!(r.success(), "rack down: {}", r.describe());
        let path = rack.dir.join("rack.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(ni);
        std::fs::write(&path, text).unwrap();
        rack.up(shape, 60);
    }
    rack
}

// ---------------------------------------------------------------------------------------
// 1. The dateline and Z on real links.

const RING_SHAPE: &str = "4x1x2";
/// A small window (113 full cells per link and VC) so that the ring's buffers fill under
/// this load: a cycle of waits, were the dateline broken, would then close.
const RING_WINDOW: u32 = 32 * 1024;
/// Verified RDMA per flow: rounds of one write of this many bytes.
const FLOW_ROUNDS: u64 = 4;
const FLOW_LEN: u64 = 1 << 20;
/// Messages per round.
const FLOW_MSGS: u64 = 8;
/// Load cells per generator (256 B payload each).
const LOAD_CELLS: u64 = 6000;
/// Everything must be over within this; a deadlock never is.
const RING_DEADLINE: Duration = Duration::from_secs(120);
/// One operation's wait: past the NI's whole retry budget.
const OP_WAIT: Option<Duration> = Some(Duration::from_secs(60));

struct Flow {
    src: String,
    dst: String,
    path: Vec<(NodeId, routing::Hop)>,
}

/// What one flow carried.
#[derive(Debug, Default)]
struct Carried {
    rdma_bytes: u64,
    acked: u64,
    delivered: u64,
}

/// One flow: rounds of a verified RDMA write and ACKed messages, each ACKed message
/// delivered exactly once. An error names the flow and what went wrong.
fn run_flow(a: Endpoint, b: Endpoint, seed: u64, what: String) -> Result<Carried, String> {
    let e = |x: Error| format!("{what}: {x}");
    let src = a.register(FLOW_LEN).map_err(e)?;
    let dst = b.register(FLOW_LEN).map_err(e)?;
    let page = a.rdma_page().map_err(e)?;
    let tx = a.packetizer().map_err(e)?;
    let inbox = b.mailbox(64).map_err(e)?;
    let inbox_addr = a
        .mailbox_addr(b.node_id(), b.rank(), inbox.vi())
        .map_err(e)?;
    let mut sent: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut acked: HashSet<u64> = HashSet::new();
    let mut delivered: HashSet<u64> = HashSet::new();
    let mut carried = Carried::default();
    let drain = |delivered: &mut HashSet<u64>, sent: &HashMap<u64, Vec<u8>>| {
        while let Some(m) = inbox.try_recv().map_err(e)? {
            let seq = u64::from_le_bytes(m.payload[..8].try_into().unwrap());
            match sent.get(&seq) {
                Some(p) if *p == m.payload => {}
                _ => return Err(format!("{what}: message {seq} arrived corrupt")),
            }
            if !delivered.insert(seq) {
                return Err(format!("{what}: message {seq} was delivered twice"));
            }
        }
        Ok::<(), String>(())
    };
    for round in 0..FLOW_ROUNDS {
        let data = pattern(seed * 1000 + round, FLOW_LEN as usize);
        src.write(0, &data).map_err(e)?;
        let tag = page
            .write(0, &src, 0, dst.gvas(0).map_err(e)?, FLOW_LEN, None)
            .map_err(e)?;
        a.wait(tag, OP_WAIT)
            .map_err(|x| format!("{what}: RDMA write of round {round} failed: {x}"))?;
        if dst.to_vec(0, FLOW_LEN).map_err(e)? != data {
            return Err(format!(
                "{what}: RDMA write of round {round} completed with corrupt data"
            ));
        }
        carried.rdma_bytes += FLOW_LEN;
        for m in 0..FLOW_MSGS {
            let seq = seed * 1_000_000 + round * 1000 + m;
            let mut p = pattern(seq, 64);
            p[..8].copy_from_slice(&seq.to_le_bytes());
            sent.insert(seq, p.clone());
            let tag = tx.send(0, inbox_addr, &p).map_err(e)?;
            a.wait(tag, OP_WAIT)
                .map_err(|x| format!("{what}: message {seq} failed: {x}"))?;
            acked.insert(seq);
            drain(&mut delivered, &sent)?;
        }
    }
    // The destination queues a message before it answers; its workload hears of it
    // through its own daemon, so allow that a moment.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        drain(&mut delivered, &sent)?;
        if acked.is_subset(&delivered) {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<_> = acked.difference(&delivered).collect();
            return Err(format!(
                "{what}: messages ACKed, never delivered: {missing:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if delivered.len() as u64 != acked.len() as u64 {
        return Err(format!("{what}: delivered messages that were never ACKed"));
    }
    carried.acked = acked.len() as u64;
    carried.delivered = delivered.len() as u64;
    Ok(carried)
}

/// Queue, in-flight and stall figures of every link of `nodes`, for a stuck run's message.
fn link_report(rack: &TestRack, nodes: &[String]) -> String {
    let mut out = String::new();
    for n in nodes {
        let Ok(st) = rack.node_status(n, Duration::from_secs(3)) else {
            out.push_str(&format!("  {n}: no status\n"));
            continue;
        };
        for l in st["links"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  {n} -> {} ({}): queue {} B, in flight {} B, stall {:.2} s, tx {} cells\n",
                l["peer"].as_str().unwrap_or("?"),
                l["state"],
                l["queue_bytes"],
                l["in_flight_bytes"],
                l["stall_seconds"].as_f64().unwrap_or(f64::NAN),
                l["tx_cells"]
            ));
        }
        out.push_str(&format!(
            "  {n}: load tx {} rx {}\n",
            st["load_tx_cells"], st["load_rx_cells"]
        ));
    }
    out
}

#[test]
fn dateline_and_z_links_carry_both_ways_round_a_ring_of_four_without_deadlock() {
    let _one = serial();
    let t0 = Instant::now();
    let shape: Shape = RING_SHAPE.parse().unwrap();
    assert_eq!((shape.x(), shape.z()), (4, 2));
    // NI timers that do not take queueing for loss: saturated ring links on a busy
    // 2-core machine can hold a block longer than the default retry budget (~1 s), and
    // this test is about the fabric, not the NI's patience (100 attempts, up to 64 x 5 ms
    // each: ~30 s). A deadlock still shows: the load cells, which nothing retries, stop
    // arriving, and the flows' writes fail or never end.
    let rack = rack_with(
        "ring",
        RING_SHAPE,
        Some(&RING_WINDOW.to_string()),
        Some("\n[ni]\nmax_attempts = 100\n"),
    );
    eprintln!(
        "[{:5.1} s] rack {RING_SHAPE} up",
        t0.elapsed().as_secs_f64()
    );

    // The flows: from every position of the X ring in each Z plane to the other plane, to
    // x+2 (a tie, two hops the + way: together these close the + cycle round the ring),
    // and to the neighbour across the wrap link each way (3 -> 0 the + way, 0 -> 3 the -
    // way). That includes every pair of QFDBs whose route crosses the dateline.
    let mut flows = Vec::new();
    let mut i = 0u32;
    for z in 0..2 {
        let mut pairs: Vec<(u32, u32)> = (0..4).map(|x| (x, (x + 2) % 4)).collect();
        pairs.extend([(3, 0), (0, 3)]);
        for (sx, dx) in pairs {
            let (s, d) = (
                node(&shape, sx, z, 2 + i % 3),
                node(&shape, dx, 1 - z, 2 + (i + 1) % 3),
            );
            i += 1;
            let path = routing::path(&shape, s, d).unwrap();
            flows.push(Flow {
                src: shape.display(s),
                dst: shape.display(d),
                path,
            });
        }
    }
    // The wrap-around links of the X rings (positions 3 and 0), each direction.
    let wrap = |n: NodeId| shape.coord(n).unwrap().x;
    let mut dateline_pairs = 0;
    for f in &flows {
        let hops: Vec<_> = f
            .path
            .windows(2)
            .map(|w| (w[0].0, w[1].0, w[0].1))
            .collect();
        assert!(
            hops.iter()
                .any(|(_, _, h)| matches!(h.port, Port::Torus(2, _))),
            "{} -> {} does not cross Z: {:?}",
            f.src,
            f.dst,
            names(&shape, &f.path)
        );
        // Within the X ring a route is on VC0 before the dateline and VC1 from it on.
        let mut past = false;
        for (a, b, h) in hops
            .iter()
            .filter(|(_, _, h)| matches!(h.port, Port::Torus(0, _)))
        {
            let crossing = (wrap(*a), wrap(*b)) == (3, 0) || (wrap(*a), wrap(*b)) == (0, 3);
            past |= crossing;
            assert_eq!(
                h.vc,
                if past { Vc::ONE } else { Vc::ZERO },
                "{} -> {}",
                f.src,
                f.dst
            );
        }
        dateline_pairs += usize::from(past);
    }
    // (3 -> 0), (3 -> 1), (2 -> 0) the + way, (0 -> 3) the - way, in both planes.
    assert_eq!(dateline_pairs, 8, "flows crossing the X dateline");

    // 1a. The fabric records the routes the routing function gives, both ways.
    for f in &flows {
        let v = {
            let r = rack.exactl(&[
                "ping",
                &f.src,
                &f.dst,
                "--count",
                "2",
                "--timeout-ms",
                "10000",
                "--json",
            ]);
            assert!(r.success(), "ping {} {}: {}", f.src, f.dst, r.describe());
            r.json()
        };
        assert_eq!(strings(&v["path"]), names(&shape, &f.path), "{v:#}");
        let back = routing::path(
            &shape,
            shape.parse_node(&f.dst).unwrap(),
            shape.parse_node(&f.src).unwrap(),
        )
        .unwrap();
        assert_eq!(strings(&v["back"]), names(&shape, &back), "{v:#}");
        assert_eq!(v["received"], 2, "{v:#}");
    }
    eprintln!(
        "[{:5.1} s] {} routes pinged, each recorded as routing::path gives it",
        t0.elapsed().as_secs_f64(),
        flows.len()
    );

    // What must cross each wrap-around link, each way, on VC1: the bytes of the flows'
    // RDMA payload and of the load cells below (a lower bound of the link's byte count).
    let mut over: BTreeMap<(String, String), u64> = BTreeMap::new();
    let crossing_links = |p: &[(NodeId, routing::Hop)]| -> Vec<(String, String)> {
        p.windows(2)
            .filter(|w| w[0].1.vc == Vc::ONE && matches!(w[0].1.port, Port::Torus(0, _)))
            .filter(|w| {
                let (a, b) = (wrap(w[0].0), wrap(w[1].0));
                (a, b) == (3, 0) || (a, b) == (0, 3)
            })
            .map(|w| (shape.display(w[0].0), shape.display(w[1].0)))
            .collect()
    };
    for f in &flows {
        for l in crossing_links(&f.path) {
            *over.entry(l).or_default() += FLOW_ROUNDS * FLOW_LEN;
        }
    }
    // Load generators: from F2 of every QFDB to the other plane, x+2 (+ way, 2 hops) and
    // x-1 (- way, 1 hop), round-robin, 256 B cells.
    let mut loads: Vec<(String, Vec<String>)> = Vec::new();
    let mut load_rx: BTreeMap<String, u64> = BTreeMap::new();
    for z in 0..2 {
        for x in 0..4 {
            let from = node(&shape, x, z, 2);
            let dsts = [
                node(&shape, (x + 2) % 4, 1 - z, 3),
                node(&shape, (x + 3) % 4, 1 - z, 4),
            ];
            for d in dsts {
                let p = routing::path(&shape, from, d).unwrap();
                for l in crossing_links(&p) {
                    *over.entry(l).or_default() += LOAD_CELLS / 2 * 256;
                }
                *load_rx.entry(shape.display(d)).or_default() += LOAD_CELLS / 2;
            }
            loads.push((
                shape.display(from),
                dsts.iter().map(|d| shape.display(*d)).collect(),
            ));
        }
    }
    assert_eq!(
        over.len(),
        4,
        "both wrap links of both planes, both ways: {over:?}"
    );
    let link_tx = |a: &str, b: &str| -> f64 {
        link_metric(&metrics(&rack, a), "exanet_link_bytes_total", b, Some("tx"))
    };
    let tx0: BTreeMap<(String, String), f64> = over
        .keys()
        .map(|(a, b)| ((a.clone(), b.clone()), link_tx(a, b)))
        .collect();

    // 1b. Everything at once.
    let mut threads: Vec<(String, JoinHandle<Result<Carried, String>>)> = Vec::new();
    let mut endpoints = Vec::new();
    for (k, f) in flows.iter().enumerate() {
        let a = Endpoint::attach_to(&rack.dir, &f.src, None)
            .unwrap_or_else(|e| panic!("attach {}: {e}", f.src));
        let b = Endpoint::attach_to(&rack.dir, &f.dst, None)
            .unwrap_or_else(|e| panic!("attach {}: {e}", f.dst));
        endpoints.push((a, b, k as u64 + 1, format!("{} -> {}", f.src, f.dst)));
    }
    let start = Instant::now();
    for (from, dsts) in &loads {
        let v = rack
            .control(
                from,
                &json!({"op": "load", "dsts": dsts, "cells": LOAD_CELLS, "payload": 256}),
                CONTROL,
            )
            .unwrap_or_else(|e| panic!("load from {from}: {e}"));
        assert_eq!(v["result"], "ok", "load from {from}: {v}");
    }
    for (a, b, seed, what) in endpoints {
        let w = what.clone();
        threads.push((what, std::thread::spawn(move || run_flow(a, b, seed, w))));
    }
    let ring_nodes: Vec<String> = (0..2)
        .flat_map(|z| (0..4).map(move |x| (x, z)))
        .map(|(x, z)| shape.display(node(&shape, x, z, 1)))
        .collect();
    let deadline = start + RING_DEADLINE;
    let stuck = |what: &str| -> ! {
        panic!(
            "{what} within {} s of the start of the traffic: the ring or Z links are stuck \
             (a routing deadlock would look like this). Links of the F1 nodes:\n{}",
            RING_DEADLINE.as_secs(),
            link_report(&rack, &ring_nodes)
        )
    };
    let mut carried = Carried::default();
    let mut failures = Vec::new();
    for (what, t) in threads {
        while !t.is_finished() {
            if Instant::now() > deadline {
                stuck(&format!("flow {what} did not finish"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        match t.join() {
            Ok(Ok(c)) => {
                carried.rdma_bytes += c.rdma_bytes;
                carried.acked += c.acked;
                carried.delivered += c.delivered;
            }
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push(format!("flow {what} panicked")),
        }
    }
    let flows_done = start.elapsed();
    // Links are lossless: every load cell arrives.
    loop {
        let mut missing = Vec::new();
        for (n, want) in &load_rx {
            let st = rack
                .node_status(n, CONTROL)
                .unwrap_or_else(|e| panic!("{e}"));
            let got = st["load_rx_cells"].as_u64().unwrap_or(0);
            assert!(
                got <= *want,
                "{n} received {got} load cells, {want} were sent to it"
            );
            if got < *want {
                missing.push(format!("{n}: {got} of {want}"));
            }
        }
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            stuck(&format!("load cells not delivered ({missing:?})"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let all_done = start.elapsed();
    assert!(
        failures.is_empty(),
        "flows failed with no fault set:\n{}",
        failures.join("\n")
    );
    assert_eq!(
        carried.rdma_bytes,
        flows.len() as u64 * FLOW_ROUNDS * FLOW_LEN
    );
    assert_eq!(carried.acked, flows.len() as u64 * FLOW_ROUNDS * FLOW_MSGS);
    assert_eq!(carried.delivered, carried.acked);

    // 1c. The wrap links carried what was routed across them on VC1 (the metrics have no
    // per-VC counters; routing::path above says the VC).
    for ((a, b), want) in &over {
        let grew = link_tx(a, b) - tx0[&(a.clone(), b.clone())];
        eprintln!("wrap link {a} -> {b} (VC1): {grew:.0} B sent, at least {want} B routed");
        assert!(
            grew >= *want as f64,
            "the dateline link {a} -> {b} sent {grew} B during the run, but {want} B of \
             payload were routed across it"
        );
    }
    // No switch refused a cell: wrong VC (VC1 off a torus port), credit overrun, ...
    let (mut timeouts, mut retransmissions) = (0, 0);
    for n in shape.node_ids().map(|i| shape.display(i)) {
        let st = rack
            .node_status(&n, CONTROL)
            .unwrap_or_else(|e| panic!("{e}"));
        timeouts += st["ni"]["timeouts"].as_u64().unwrap_or(0);
        retransmissions += st["ni"]["retransmissions"].as_u64().unwrap_or(0);
        let bad: Vec<(&String, &Value)> = st["errors"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "wrong_vc"
                        | "credit_overrun"
                        | "no_such_vc"
                        | "no_such_port"
                        | "bad_destination"
                        | "config"
                        | "full"
                        | "payload_crc"
                )
            })
            .collect();
        assert!(bad.is_empty(), "{n} counted switching errors: {bad:?}");
    }
    let load_bytes = loads.len() as u64 * LOAD_CELLS * 256;
    eprintln!(
        "{} flows: {} MiB verified RDMA, {} messages ACKed and delivered once, in {:.1} s; \
         {} load cells ({} MiB) from {} generators all delivered by {:.1} s; NI timeouts \
         {timeouts}, retransmissions {retransmissions} (no fault set: all spurious); total {:.1} s",
        flows.len(),
        carried.rdma_bytes >> 20,
        carried.acked,
        flows_done.as_secs_f64(),
        loads.len() as u64 * LOAD_CELLS,
        load_bytes >> 20,
        loads.len(),
        all_done.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------
// 2. Backpressure from a stopped receiver.

const BP_SHAPE: &str = "2x1x1";
const WINDOW: u64 = exanet_proto::DEFAULT_WINDOW as u64;
const BP_LEN: u64 = 4 << 20;
const BP_WRITES: u64 = 8;
/// Longest the receiver stays stopped: under the links' QUIC idle timeout (10 s), which
/// would otherwise close them (not what is tested here).
const MAX_PAUSE: Duration = Duration::from_secs(6);

#[test]
fn a_stopped_receiver_bounds_what_the_sender_puts_on_each_link() {
    let _one = serial();
    let t0 = Instant::now();
    let shape: Shape = BP_SHAPE.parse().unwrap();
    // NI timers that outlast the pause: 100 attempts, backing off to 64 x 20 ms.
    let rack = rack_with(
        "bp",
        BP_SHAPE,
        None,
        Some("\n[ni]\nretransmit_us = 20000\nmax_attempts = 100\n"),
    );
    let (src, dst) = ("M1QAF2", "M1QBF3");
    let path = routing::path(
        &shape,
        shape.parse_node(src).unwrap(),
        shape.parse_node(dst).unwrap(),
    )
    .unwrap();
    let hops: Vec<(String, String)> = path
        .windows(2)
        .map(|w| (shape.display(w[0].0), shape.display(w[1].0)))
        .collect();
    assert_eq!(
        names(&shape, &path),
        ["M1QAF2", "M1QAF1", "M1QBF1", "M1QBF3"]
    );
    // Towards the stopped node only data travels (its answers are what is stopped), on
    // one VC per link: at most one window per link is outstanding.
    assert!(path.iter().all(|(_, h)| h.vc == Vc::ZERO));
    let bound = WINDOW + MAX_CELL as u64;

    let a = Endpoint::attach_to(&rack.dir, src, None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, dst, None).unwrap();
    let from = a.register(BP_LEN * BP_WRITES).unwrap();
    let to = b.register(BP_LEN * BP_WRITES).unwrap();
    let page = a.rdma_page().unwrap();
    let data: Vec<Vec<u8>> = (0..BP_WRITES)
        .map(|k| pattern(500 + k, BP_LEN as usize))
        .collect();
    for (k, d) in data.iter().enumerate() {
        from.write(k as u64 * BP_LEN, d).unwrap();
    }
    let post = |k: u64| -> Tag {
        page.write(
            k as u8,
            &from,
            k * BP_LEN,
            to.gvas(k * BP_LEN).unwrap(),
            BP_LEN,
            None,
        )
        .unwrap()
    };
    let blocks_rx = || {
        metric_sum(
            &metrics(&rack, dst),
            "exanet_ni_rdma_blocks_total",
            &[("direction", "rx")],
        )
    };

    // The sender streams: half the writes posted; once the receiver is taking blocks in, it
    // stops (SIGSTOP) and the other half is posted into the stopped path.
    let mut tags: Vec<Tag> = (0..BP_WRITES / 2).map(post).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while blocks_rx() < 1.0 {
        assert!(
            Instant::now() < deadline,
            "{dst} received no RDMA block in 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    exactl_ok(&rack, &["node", "pause", dst]);
    let paused_at = Instant::now();
    tags.extend((BP_WRITES / 2..BP_WRITES).map(post));

    // Every live end of the path, sampled until the path is full and still: the last
    // link stalls, nothing more leaves the source.
    let live: Vec<&(String, String)> = hops.iter().collect();
    let sample = || -> Vec<(f64, f64, f64)> {
        live.iter()
            .map(|(n, peer)| {
                let s = metrics(&rack, n);
                (
                    link_metric(&s, "exanet_link_in_flight_bytes", peer, None),
                    link_metric(&s, "exanet_link_bytes_total", peer, Some("tx")),
                    link_metric(&s, "exanet_link_stall_seconds_total", peer, None),
                )
            })
            .collect()
    };
    let queued_at = |n: &str, from_peer: &str| {
        link_metric(
            &metrics(&rack, n),
            "exanet_link_queue_bytes",
            from_peer,
            None,
        )
    };
    let first = sample();
    let rss0: Vec<(String, Option<u64>)> = hops
        .iter()
        .map(|(n, _)| (n.clone(), rack.daemon_pid(n).and_then(rss_kib)))
        .collect();
    let mut max_in_flight = vec![0f64; live.len()];
    let mut max_queue = vec![0f64; live.len()];
    let mut last = first.clone();
    let mut still_since: Option<Instant> = None;
    let mut samples = 0;
    let settled = loop {
        let now = sample();
        samples += 1;
        for (i, s) in now.iter().enumerate() {
            max_in_flight[i] = max_in_flight[i].max(s.0);
            assert!(
                s.0 <= bound as f64,
                "{} -> {}: {} B in flight with {dst} stopped; the window is {WINDOW} B per VC",
                live[i].0,
                live[i].1,
                s.0
            );
        }
        // Input queues of the live path nodes that are fed by the path: at most a window.
        for (i, (n, _)) in hops.iter().enumerate().skip(1) {
            let q = queued_at(n, &hops[i - 1].0);
            max_queue[i] = max_queue[i].max(q);
            assert!(
                q <= bound as f64,
                "{n} holds {q} B queued from {}; the window is {WINDOW} B per VC",
                hops[i - 1].0
            );
        }
        let moving = now.iter().zip(&last).any(|(n, l)| n.1 != l.1);
        if moving {
            still_since = None;
        } else {
            still_since.get_or_insert_with(Instant::now);
        }
        last = now;
        let stalled = last.iter().zip(&first).all(|(n, f)| n.2 - f.2 >= 0.5);
        if stalled && still_since.is_some_and(|t| t.elapsed() >= Duration::from_millis(500)) {
            break true;
        }
        if paused_at.elapsed() > MAX_PAUSE {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let paused_for = paused_at.elapsed();
    let rss1: Vec<Option<u64>> = hops
        .iter()
        .map(|(n, _)| rack.daemon_pid(n).and_then(rss_kib))
        .collect();
    exactl_ok(&rack, &["node", "resume", dst]);
    let sent_while_stopped = last[0].1 - first[0].1;
    for (i, (n, peer)) in hops.iter().enumerate() {
        eprintln!(
            "{n} -> {peer}: in flight max {:.0} B (bound {bound}), queued from upstream max \
             {}, stall +{:.2} s, sent +{:.0} B while {dst} was stopped; RSS {:?} -> {:?} KiB",
            max_in_flight[i],
            if i == 0 {
                "- (the source)".to_string()
            } else {
                format!("{:.0} B", max_queue[i])
            },
            last[i].2 - first[i].2,
            last[i].1 - first[i].1,
            rss0[i].1,
            rss1[i]
        );
    }
    assert!(
        settled,
        "within {} s of stopping {dst} the path did not settle (every link stalled 0.5 s, \
         nothing sent for 0.5 s): the sender kept putting cells on the path; last sample {last:?}",
        MAX_PAUSE.as_secs()
    );
    // The path holds at most a window per link: what the source sent after the stop fits.
    let capacity = hops.len() as f64 * bound as f64;
    assert!(
        sent_while_stopped <= capacity,
        "{src} sent {sent_while_stopped} B after {dst} stopped; the path holds {capacity} B"
    );
    // The last link was full: backpressure reached it (the window was used, not merely
    // bounded because the sender had nothing more).
    assert!(
        max_in_flight[hops.len() - 1] >= (WINDOW / 2) as f64,
        "{:?}: only {} B in flight into the stopped node",
        hops.last(),
        max_in_flight[hops.len() - 1]
    );

    // Resumed: everything completes, byte for byte.
    for (k, t) in tags.into_iter().enumerate() {
        a.wait(t, Some(Duration::from_secs(60)))
            .unwrap_or_else(|e| panic!("write {k} after the receiver resumed: {e}"));
        assert!(
            to.to_vec(k as u64 * BP_LEN, BP_LEN).unwrap() == data[k],
            "write {k} completed with corrupt data"
        );
    }
    eprintln!(
        "{dst} stopped {:.1} s ({samples} samples); {} x {} MiB verified after resume; total {:.1} s",
        paused_for.as_secs_f64(),
        BP_WRITES,
        BP_LEN >> 20,
        t0.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------
// 3. An endpoint daemon restarting with transfers in flight.

const RS_LEN: u64 = 8 << 20;
const RS_WRITES: u64 = 4;

#[test]
fn an_endpoint_daemon_restarting_with_transfers_in_flight() {
    let _one = serial();
    let t0 = Instant::now();
    // An NI that retries for ~10 s (30 attempts, 5 ms doubling to 320 ms): the transfers
    // are still being retried when the restarted daemon is back, the case where what was
    // meant for the old daemon meets the new one.
    let rack = rack_with(
        "restart",
        BP_SHAPE,
        None,
        Some("\n[ni]\nmax_attempts = 30\n"),
    );
    let (an, bn) = ("M1QAF2", "M1QBF3");
    let a = Endpoint::attach_to(&rack.dir, an, None).unwrap();
    let b = Endpoint::attach_to(&rack.dir, bn, None).unwrap();
    let from = a.register(RS_LEN * RS_WRITES).unwrap();
    let to = b.register(RS_LEN * RS_WRITES).unwrap();
    let old_va = to.va();
    let page = a.rdma_page().unwrap();
    let data: Vec<Vec<u8>> = (0..RS_WRITES)
        .map(|k| pattern(900 + k, RS_LEN as usize))
        .collect();
    for (k, d) in data.iter().enumerate() {
        from.write(k as u64 * RS_LEN, d).unwrap();
    }
    let blocks_rx = || {
        rack.node_metrics(bn, Duration::from_secs(2))
            .map(|s| metric_sum(&s, "exanet_ni_rdma_blocks_total", &[("direction", "rx")]))
    };
    let tags: Vec<Tag> = (0..RS_WRITES)
        .map(|k| {
            page.write(
                k as u8,
                &from,
                k * RS_LEN,
                to.gvas(k * RS_LEN).unwrap(),
                RS_LEN,
                None,
            )
            .unwrap()
        })
        .collect();
    // Mid-transfer: the destination has taken blocks in, and the writes are not all done.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if blocks_rx().unwrap_or(0.0) > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{bn} received no RDMA block in 30 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    a.poll().unwrap();
    let pending_at_kill = a.in_flight();
    exactl_ok(&rack, &["node", "kill", bn]);
    let killed_after = blocks_rx().err();
    assert!(
        pending_at_kill > 0,
        "every write had completed before {bn} was killed: not a mid-transfer kill \
         ({RS_WRITES} x {} MiB)",
        RS_LEN >> 20
    );
    assert!(
        killed_after.is_some(),
        "{bn} still serves metrics after the kill"
    );

    exactl_ok(&rack, &["node", "restart", bn]);
    let restarted = Instant::now();
    // The old workload went with the old daemon: its rank is free, its endpoint broken.
    let st = rack
        .node_status(bn, CONTROL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(st["ni"]["attached"], 0, "{bn} after the restart: {st:#}");
    assert!(
        b.register(4096).is_err(),
        "the old endpoint at {bn} still registers memory"
    );
    // A new workload at once, while the writes meant for the old one may still be retried:
    // its first region is placed afresh, not where the old one's was.
    let b2 = Endpoint::attach_to(&rack.dir, bn, None)
        .unwrap_or_else(|e| panic!("attach to the restarted {bn}: {e}"));
    let fresh = b2.register(RS_LEN * RS_WRITES).unwrap();
    const SENTINEL: u8 = 0xEE;
    fresh
        .write(0, &vec![SENTINEL; (RS_LEN * RS_WRITES) as usize])
        .unwrap();
    eprintln!(
        "new workload at {bn}: rank {} (old {}), region at VA {:#x} (old {old_va:#x}), {:.2} s \
         after the restart returned",
        b2.rank(),
        b.rank(),
        fresh.va(),
        restarted.elapsed().as_secs_f64()
    );

    // Every write ends, OK with its bytes where it was meant to go, or with the NI's reason.
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (k, t) in tags.into_iter().enumerate() {
        match a.wait(t, Some(Duration::from_secs(90))) {
            Ok(()) => {
                *outcomes.entry("ok".into()).or_default() += 1;
                let old = to.to_vec(k as u64 * RS_LEN, RS_LEN).unwrap();
                if old != data[k] {
                    let at_new = fresh.to_vec(k as u64 * RS_LEN, RS_LEN).unwrap();
                    let new_blocks = at_new
                        .chunks(16 << 10)
                        .zip(data[k].chunks(16 << 10))
                        .filter(|(n, d)| n == d)
                        .count();
                    wrong.push(format!(
                        "write {k} completed OK but the old workload's memory does not hold \
                         its data ({} of {} bytes differ); {new_blocks} of its 16 KiB blocks \
                         are in the new workload's memory instead",
                        old.iter().zip(&data[k]).filter(|(a, b)| a != b).count(),
                        RS_LEN
                    ));
                }
            }
            Err(Error::Timeout) => panic!("write {k} did not end within 90 s of the restart"),
            Err(e) => match reason(&e) {
                Ok(r) => *outcomes.entry(r).or_default() += 1,
                Err(m) => panic!("write {k}: {m}"),
            },
        }
    }
    let all_ended = restarted.elapsed();
    // Nothing meant for the old workload reached the new one.
    let now = fresh.to_vec(0, RS_LEN * RS_WRITES).unwrap();
    let stale: Vec<u64> = now
        .chunks(16 << 10)
        .enumerate()
        .filter(|(_, c)| c.iter().any(|&x| x != SENTINEL))
        .map(|(i, _)| i as u64)
        .collect();
    eprintln!(
        "{pending_at_kill} of {RS_WRITES} writes pending at the kill; outcomes {outcomes:?}, \
         all ended {:.1} s after the restart; {} blocks of the new workload's memory \
         overwritten by the old transfers",
        all_ended.as_secs_f64(),
        stale.len()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(
        stale.is_empty(),
        "{} of the {} 16 KiB blocks of the memory that a new workload registered at the \
         restarted {bn} were written by transfers posted to the previous daemon's workload \
         (blocks {:?}...): a write meant for one incarnation was delivered into another",
        stale.len(),
        now.len() / (16 << 10),
        &stale[..stale.len().min(8)]
    );

    // The restarted node serves the new workload from the first attempt.
    let st = rack.node_status(bn, CONTROL).unwrap();
    assert_eq!(st["ni"]["attached"], 1, "{st:#}");
    let fresh_data = pattern(4242, RS_LEN as usize);
    from.write(0, &fresh_data).unwrap();
    let t = page
        .write(0, &from, 0, fresh.gvas(0).unwrap(), RS_LEN, None)
        .unwrap();
    a.wait(t, Some(Duration::from_secs(60)))
        .unwrap_or_else(|e| panic!("fresh write to the restarted {bn}: {e}"));
    assert!(
        fresh.to_vec(0, RS_LEN).unwrap() == fresh_data,
        "the fresh write to the restarted {bn} completed with corrupt data"
    );
    eprintln!(
        "fresh {} MiB write to the restarted {bn} verified at the first attempt; total {:.1} s",
        RS_LEN >> 20,
        t0.elapsed().as_secs_f64()
    );
    drop(b);
}
