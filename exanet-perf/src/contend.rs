//! `exanet-perf contend`: RDMA write streams that compete for the rack, all from this
//! process, so that their modeled clocks start together (each moved to the latest
//! endpoint's start, `Endpoint::advance_clock`) and contend in modeled time.
//!
//! Each flow is an endpoint (a rank) of its own on its source node, writing `--iterations`
//! transfers of `--size` bytes with `--window` in flight into a slot of memory registered
//! by one endpoint on its destination node. The patterns are the classic contention
//! cases:
//! - `incast`: `--senders N` nodes into one receiver (the lowest node id by default);
//! - `shared-link`: two flows whose paths cross the same direction of one torus link,
//!   with no other link in common, found from the rack's routing;
//! - `bidir`: the two directions of one torus link, one flow each;
//! - `qfdb-all-to-all`: every ordered pair of the first QFDB's four nodes (12 flows).
//!
//! For each flow it reports wall-clock and modeled throughput, and its share of the
//! flows' modeled total (1/N each when the rack shares fairly); for `shared-link` and
//! `bidir` also the link's modeled rate, which the flows through it share. With
//! `--alone`, each flow first runs by itself, so that what it gets alone stands beside
//! what it gets competing.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use exanet::{Config, Endpoint, MemoryRegion, NodeId, RdmaPage, Shape};
use exanet_proto::routing::path;
use exanet_proto::topology::{links, Link, LinkKind};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pattern {
    Incast,
    SharedLink,
    Bidir,
    QfdbAllToAll,
}

pub struct Options {
    pub rack: Option<std::path::PathBuf>,
    pub job_key: Option<String>,
    pub spin: Option<Duration>,
    pub pattern: Pattern,
    pub senders: u32,
    pub to: Option<String>,
    pub size: u64,
    pub iterations: u64,
    pub window: u8,
    /// Measure each flow alone first, and report each flow's contended rate beside it.
    pub alone: bool,
    pub json: bool,
    pub timeout: Duration,
}

/// One stream: from a node to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub src: NodeId,
    pub dst: NodeId,
}

/// What the flows were chosen around: the link they share, if one.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub flows: Vec<Flow>,
    pub link: Option<Link>,
}

/// The flows of `pattern` on a rack of `shape`.
pub fn plan(
    shape: &Shape,
    pattern: Pattern,
    senders: u32,
    to: Option<NodeId>,
) -> Result<Plan, String> {
    // The nodes of `n`'s QFDB.
    let qfdb = |n: NodeId| {
        let c = shape.coord(n).map_err(|e| e.to_string())?;
        Ok::<_, String>(
            shape
                .node_ids()
                .filter(|m| shape.coord(*m).is_ok_and(|d| d.same_qfdb(&c)))
                .collect::<Vec<_>>(),
        )
    };
    let torus = || {
        links(shape)
            .into_iter()
            .find(|l| l.kind != LinkKind::IntraQfdb)
            .ok_or_else(|| format!("a {shape} rack has no torus link"))
    };
    match pattern {
        Pattern::Incast => {
            let dst = to.unwrap_or(NodeId(0));
            if senders == 0 || senders >= shape.nodes() {
                return Err(format!(
                    "--senders {senders}: a {shape} rack has room for 1..={} beside the receiver",
                    shape.nodes() - 1
                ));
            }
            let flows = shape
                .node_ids()
                .filter(|&n| n != dst)
                .take(senders as usize)
                .map(|src| Flow { src, dst })
                .collect();
            Ok(Plan { flows, link: None })
        }
        Pattern::Bidir => {
            let l = torus()?;
            Ok(Plan {
                flows: vec![Flow { src: l.a, dst: l.b }, Flow { src: l.b, dst: l.a }],
                link: Some(l),
            })
        }
        Pattern::SharedLink => {
            let l = torus()?;
            let hops = |f: Flow| -> Result<Vec<(NodeId, NodeId)>, String> {
                let p = path(shape, f.src, f.dst).map_err(|e| e.to_string())?;
                Ok(p.windows(2).map(|w| (w[0].0, w[1].0)).collect())
            };
            // Sources on the link's near QFDB, destinations on its far one: the first two
            // flows with distinct ends whose only common hop is the link a -> b.
            let mut candidates = Vec::new();
            for &src in &qfdb(l.a)? {
                for &dst in &qfdb(l.b)? {
                    let f = Flow { src, dst };
                    let h = hops(f)?;
                    if h.contains(&(l.a, l.b)) {
                        candidates.push((f, h));
                    }
                }
            }
            for (i, (f1, h1)) in candidates.iter().enumerate() {
                for (f2, h2) in &candidates[i + 1..] {
                    let shared: Vec<_> = h1.iter().filter(|h| h2.contains(h)).collect();
                    if f1.src != f2.src && f1.dst != f2.dst && shared == [&(l.a, l.b)] {
                        return Ok(Plan {
                            flows: vec![*f1, *f2],
                            link: Some(l),
                        });
                    }
                }
            }
            Err(format!(
                "no two flows share only the link {} -> {} on a {shape} rack",
                shape.display(l.a),
                shape.display(l.b)
            ))
        }
        Pattern::QfdbAllToAll => {
            let nodes = qfdb(NodeId(0))?;
            let flows = nodes
                .iter()
                .flat_map(|&src| {
                    nodes
                        .iter()
                        .filter(move |&&dst| dst != src)
                        .map(move |&dst| Flow { src, dst })
                })
                .collect();
            Ok(Plan { flows, link: None })
        }
    }
}

/// What one flow measured.
struct Measured {
    wall: Duration,
    modeled_ps: u64,
    verified: bool,
}

fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds / 1e9
    } else {
        f64::INFINITY
    }
}

/// The byte at `i` of flow `f`'s source memory.
fn pattern_byte(f: usize, i: u64) -> u8 {
    (i.wrapping_mul(31) ^ (f as u64).wrapping_mul(0x9e37_79b9)) as u8
}

pub fn run(o: &Options) -> Result<(), String> {
    if o.window == 0 || o.iterations == 0 || o.size == 0 {
        return Err("--size, --iterations and --window must be at least 1".into());
    }
    let attach = |node: &str| -> Result<Endpoint, String> {
        Endpoint::attach_with(&Config {
            rack_dir: o.rack.clone(),
            node: Some(node.to_string()),
            job_key: o.job_key.clone(),
            spin: o.spin,
            compute_scale_ppm: crate::network_benchmark_scale(),
            ..Config::default()
        })
        .map_err(|e| format!("attach to {node}: {e}"))
    };
    let dir = exanet::config::rack_dir(o.rack.as_deref());
    let shape = exanet::config::read_shape(&dir).map_err(|e| e.to_string())?;
    let to =
        o.to.as_deref()
            .map(|n| shape.parse_node(n).map_err(|e| format!("--to {n}: {e}")))
            .transpose()?;
    let plan = plan(&shape, o.pattern, o.senders, to)?;
    let flows = &plan.flows;
    let slot = o.size * u64::from(o.window);

    // One receiving endpoint per destination node, with a slot per flow into it.
    let mut dsts: Vec<NodeId> = flows.iter().map(|f| f.dst).collect();
    dsts.sort();
    dsts.dedup();
    let receivers: Vec<(NodeId, Endpoint, MemoryRegion)> = dsts
        .iter()
        .map(|&d| {
            let ep = attach(&shape.display(d))?;
            let into = flows.iter().filter(|f| f.dst == d).count() as u64;
            let mem = ep
                .register(slot * into)
                .map_err(|e| format!("register {} B on {}: {e}", slot * into, shape.display(d)))?;
            Ok((d, ep, mem))
        })
        .collect::<Result<_, String>>()?;
    // Where each flow writes: its receiver and the offset of its slot.
    let mut next = vec![0u64; receivers.len()];
    let targets: Vec<(usize, u64)> = flows
        .iter()
        .map(|f| {
            let r = receivers
                .iter()
                .position(|(d, _, _)| *d == f.dst)
                .expect("every dst");
            let off = next[r];
            next[r] += slot;
            (r, off)
        })
        .collect();
    // Each flow's endpoint, RDMA page and source memory, made before any flow starts, so
    // that a refusal ends the run rather than leaving the others at the start line.
    let senders: Vec<(Endpoint, RdmaPage, MemoryRegion, Vec<u8>)> = flows
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let name = shape.display(f.src);
            let ep = attach(&name)?;
            let page = ep.rdma_page().map_err(|e| format!("{name}: {e}"))?;
            let local = ep.register(slot).map_err(|e| format!("{name}: {e}"))?;
            let data: Vec<u8> = (0..slot).map(|b| pattern_byte(i, b)).collect();
            local.write(0, &data).map_err(|e| format!("{name}: {e}"))?;
            Ok((ep, page, local, data))
        })
        .collect::<Result<_, String>>()?;

    // Runs the flows `which` together; each starts at the latest clock of every flow's
    // endpoint (each clock starts where its daemon put it at attach), so that they compete
    // in modeled time and start after whatever ran before.
    let run_flows = |which: &[usize]| -> Result<Vec<Measured>, String> {
        let start = Barrier::new(which.len());
        let latest = senders
            .iter()
            .map(|s| s.0.clock())
            .max()
            .unwrap_or_default();
        let measured: Vec<Result<Measured, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = which
                .iter()
                .map(|&i| {
                    let f = &flows[i];
                    let (ep, page, local, data) = &senders[i];
                    let start = &start;
                    let (r, off) = targets[i];
                    let (_, rep, rmem) = &receivers[r];
                    let (dst_rank, dst_va) = (rep.rank(), rmem.va() + off);
                    s.spawn(move || -> Result<Measured, String> {
                        ep.advance_clock(latest);
                        start.wait();
                        let (t0, m0) = (Instant::now(), ep.clock());
                        let mut inflight = std::collections::VecDeque::new();
                        let (mut posted, mut done) = (0u64, 0u64);
                        while done < o.iterations {
                            while inflight.len() < usize::from(o.window) && posted < o.iterations {
                                let ch = (posted % u64::from(o.window)) as u8;
                                let at = u64::from(ch) * o.size;
                                let remote = ep
                                    .addr(f.dst, dst_rank, dst_va + at)
                                    .map_err(|e| e.to_string())?;
                                let tag = page
                                    .write(ch, local, at, remote, o.size, None)
                                    .map_err(|e| format!("posting transfer {posted}: {e}"))?;
                                inflight.push_back(tag);
                                posted += 1;
                            }
                            if let Some(tag) = inflight.pop_front() {
                                ep.wait_modeled(tag, Some(o.timeout))
                                    .map_err(|e| format!("transfer {done}: {e}"))?;
                                done += 1;
                            }
                        }
                        let wall = t0.elapsed();
                        let modeled_ps = ep.clock().ps().saturating_sub(m0.ps());
                        // Every slot's last transfer landed whole.
                        let got = rmem.to_vec(off, slot).map_err(|e| e.to_string())?;
                        Ok(Measured {
                            wall,
                            modeled_ps,
                            verified: got == *data,
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a flow's thread panicked".into()))
                })
                .collect()
        });
        measured.into_iter().collect()
    };
    // Each flow alone first, when asked: what it gets with nothing to share.
    let alone: Option<Vec<Measured>> = if o.alone {
        let mut v = Vec::new();
        for i in 0..flows.len() {
            v.extend(run_flows(&[i])?);
        }
        Some(v)
    } else {
        None
    };
    let all: Vec<usize> = (0..flows.len()).collect();
    let measured = run_flows(&all)?;

    let bytes = o.size * o.iterations;
    let modeled_gbps = |m: &Measured| gbps(bytes, m.modeled_ps as f64 * 1e-12);
    let modeled: Vec<f64> = measured.iter().map(modeled_gbps).collect();
    let alone: Option<Vec<f64>> = alone.map(|v| v.iter().map(modeled_gbps).collect());
    let total: f64 = modeled.iter().sum();
    let pattern = clap::ValueEnum::to_possible_value(&o.pattern)
        .map_or_else(|| format!("{:?}", o.pattern), |v| v.get_name().to_string());
    let link = plan.link.map(|l| {
        (
            format!("{} -> {}", shape.display(l.a), shape.display(l.b)),
            l.kind.gbps(),
        )
    });
    if !o.json {
        println!(
            "{:>8} {:>8} {:>10} {:>12} {:>8} {:>12} {:>8}",
            "from", "to", "gbps", "model_gbps", "share", "model_alone", "verified"
        );
    }
    for (k, ((f, m), g)) in flows.iter().zip(&measured).zip(&modeled).enumerate() {
        let by_itself = alone.as_ref().map(|a| a[k]);
        let wall = gbps(bytes, m.wall.as_secs_f64());
        let share = if total > 0.0 { g / total } else { 0.0 };
        if o.json {
            println!(
                "{}",
                json!({
                    "bench": "contend",
                    "pattern": pattern,
                    "from": shape.display(f.src),
                    "to": shape.display(f.dst),
                    "size": o.size,
                    "iterations": o.iterations,
                    "window": o.window,
                    "gbps": crate::stats::round(wall, 3),
                    "modeled_gbps": crate::stats::round(*g, 3),
                    "modeled_share": crate::stats::round(share, 4),
                    "modeled_gbps_alone": by_itself.map(|a| crate::stats::round(a, 3)),
                    "verified": m.verified,
                })
            );
        } else {
            println!(
                "{:>8} {:>8} {:>10.3} {:>12.3} {:>8.4} {:>12} {:>8}",
                shape.display(f.src),
                shape.display(f.dst),
                wall,
                g,
                share,
                by_itself.map_or("-".to_string(), |a| format!("{a:.3}")),
                m.verified
            );
        }
    }
    let (lo, hi) = modeled.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), g| {
        (lo.min(*g), hi.max(*g))
    });
    let mut summary = json!({
        "bench": "contend",
        "pattern": pattern,
        "flows": flows.len(),
        "size": o.size,
        "iterations": o.iterations,
        "modeled_gbps_total": crate::stats::round(total, 3),
        "modeled_gbps_min": crate::stats::round(lo, 3),
        "modeled_gbps_max": crate::stats::round(hi, 3),
        "verified": measured.iter().all(|m| m.verified),
    });
    if let Some((name, rate)) = &link {
        summary["link"] = json!(name);
        summary["link_gbps"] = json!(rate);
    }
    if o.json {
        println!("{summary}");
    } else {
        let on = link
            .map(|(name, rate)| format!(" through {name} ({rate} Gb/s)"))
            .unwrap_or_default();
        println!(
            "{} flows{on}: modeled {:.3} Gb/s in all, {:.3} to {:.3} each",
            flows.len(),
            total,
            lo,
            hi
        );
    }
    if measured.iter().all(|m| m.verified) {
        Ok(())
    } else {
        Err("a flow's memory did not hold what it wrote".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(s: &str) -> Shape {
        s.parse().unwrap()
    }

    #[test]
    fn incast_takes_the_first_senders_beside_the_receiver() {
        let p = plan(&shape("2x1x1"), Pattern::Incast, 3, Some(NodeId(1))).unwrap();
        let srcs: Vec<u32> = p.flows.iter().map(|f| f.src.0).collect();
        assert_eq!(srcs, [0, 2, 3]);
        assert!(p.flows.iter().all(|f| f.dst == NodeId(1)));
        assert!(plan(&shape("1x1x1"), Pattern::Incast, 4, None).is_err());
        assert!(plan(&shape("1x1x1"), Pattern::Incast, 0, None).is_err());
    }

    #[test]
    fn shared_link_flows_have_that_link_and_nothing_else_in_common() {
        for s in ["2x1x1", "4x4x2"] {
            let sh = shape(s);
            let p = plan(&sh, Pattern::SharedLink, 0, None).unwrap();
            let l = p.link.unwrap();
            assert_ne!(l.kind, LinkKind::IntraQfdb);
            let hops = |f: &Flow| -> Vec<(NodeId, NodeId)> {
                let p = path(&sh, f.src, f.dst).unwrap();
                p.windows(2).map(|w| (w[0].0, w[1].0)).collect()
            };
            let (a, b) = (hops(&p.flows[0]), hops(&p.flows[1]));
            let common: Vec<_> = a.iter().filter(|h| b.contains(h)).collect();
            assert_eq!(common, [&(l.a, l.b)], "{s}");
            assert_ne!(p.flows[0].src, p.flows[1].src);
            assert_ne!(p.flows[0].dst, p.flows[1].dst);
        }
        // One QFDB has no torus link.
        assert!(plan(&shape("1x1x1"), Pattern::SharedLink, 0, None).is_err());
    }

    #[test]
    fn bidir_and_all_to_all_cover_their_pairs() {
        let p = plan(&shape("2x1x1"), Pattern::Bidir, 0, None).unwrap();
        let l = p.link.unwrap();
        assert_eq!(
            p.flows,
            [Flow { src: l.a, dst: l.b }, Flow { src: l.b, dst: l.a }]
        );
        let p = plan(&shape("1x1x1"), Pattern::QfdbAllToAll, 0, None).unwrap();
        assert_eq!(p.flows.len(), 12);
        let mut pairs: Vec<_> = p.flows.iter().map(|f| (f.src.0, f.dst.0)).collect();
        pairs.dedup();
        assert_eq!(pairs.len(), 12);
        assert!(pairs.iter().all(|(a, b)| a != b && *a < 4 && *b < 4));
    }
}
