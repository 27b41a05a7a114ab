//! Collective benchmarks: allreduce, broadcast and barrier over a group of ranks, one
//! endpoint per member attached from this process (a thread each), wall-clock and
//! modeled times. A collective's time is its slowest member's.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use exanet::collective::{Collectives, DataType, Group, Path, ReduceOp};
use exanet::{Config, Endpoint, NodeId};
use serde_json::json;

use crate::stats::{summarize, summarize_us, Row};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Allreduce,
    Bcast,
    Barrier,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// The accelerator where the group and vector allow it
    Auto,
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    Sum,
    Min,
    Max,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Type {
    I32,
    I64,
    F32,
    F64,
}

pub struct Options {
    pub kind: Kind,
    pub rack: Option<std::path::PathBuf>,
    pub job_key: Option<String>,
    pub spin: Option<Duration>,
    /// Members: node names with their rank.
    pub members: Vec<(String, u8)>,
    pub sizes: Vec<u64>,
    pub iterations: u64,
    pub warmup: u64,
    pub accel: Accel,
    /// Software collectives' eager limit, bytes (the library's default if None).
    pub eager: Option<usize>,
    pub op: Op,
    pub ty: Type,
    pub root: usize,
    pub json: bool,
    pub timeout: Duration,
}

fn op_of(o: Op) -> ReduceOp {
    match o {
        Op::Sum => ReduceOp::Sum,
        Op::Min => ReduceOp::Min,
        Op::Max => ReduceOp::Max,
    }
}

fn ty_of(t: Type) -> DataType {
    match t {
        Type::I32 => DataType::I32,
        Type::I64 => DataType::I64,
        Type::F32 => DataType::F32,
        Type::F64 => DataType::F64,
    }
}

/// `len` bytes of elements of `ty`, each `v`.
fn filled(ty: DataType, v: f64, len: usize) -> Vec<u8> {
    let one: Vec<u8> = match ty {
        DataType::I32 => (v as i32).to_le_bytes().to_vec(),
        DataType::I64 => (v as i64).to_le_bytes().to_vec(),
        DataType::F32 => (v as f32).to_le_bytes().to_vec(),
        DataType::F64 => v.to_le_bytes().to_vec(),
    };
    one.iter().copied().cycle().take(len).collect()
}

/// Member `i`'s vector: every element `i + 1`, so that the expected sum, min and max are
/// known.
fn vector(ty: DataType, len: usize, i: usize) -> Vec<u8> {
    filled(ty, (i + 1) as f64, len)
}

/// The allreduce of the `n` members' vectors.
fn expected(op: ReduceOp, ty: DataType, len: usize, n: usize) -> Vec<u8> {
    let v = match op {
        ReduceOp::Sum => (n * (n + 1) / 2) as f64,
        ReduceOp::Min => 1.0,
        ReduceOp::Max => n as f64,
    };
    filled(ty, v, len)
}

/// Per member and iteration: (wall, modeled us).
type Samples = Vec<Vec<(Duration, f64)>>;

pub fn run(o: &Options) -> Result<(), String> {
    if o.members.is_empty() {
        return Err("no members".into());
    }
    let attach = |(node, rank): &(String, u8)| -> Result<Endpoint, String> {
        Endpoint::attach_with(&Config {
            rack_dir: o.rack.clone(),
            node: Some(node.clone()),
            job_key: o.job_key.clone(),
            spin: o.spin,
            rank: Some(*rank),
            compute_scale_ppm: crate::network_benchmark_scale(),
            ..Config::default()
        })
        .map_err(|e| format!("attach to {node}:{rank}: {e}"))
    };
    let eps: Vec<Endpoint> = o.members.iter().map(attach).collect::<Result<_, _>>()?;
    let members: Vec<(NodeId, u8)> = eps.iter().map(|e| (e.node_id(), e.rank())).collect();
    let mut colls: Vec<Collectives> = eps
        .iter()
        .map(|e| e.collectives().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for c in &mut colls {
        c.set_timeout(o.timeout);
        if let Some(b) = o.eager {
            c.set_eager_limit(b);
        }
    }
    let groups: Vec<Group> = colls
        .iter()
        .map(|c| c.group(1, &members).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let (op, ty) = (op_of(o.op), ty_of(o.ty));
    let path = match o.accel {
        Accel::Auto => Path::Auto,
        Accel::On => Path::Accelerator,
        Accel::Off => Path::Software,
    };
    let n = members.len();
    let mut header = false;
    let sizes: Vec<u64> = if o.kind == Kind::Barrier {
        vec![0]
    } else {
        o.sizes.clone()
    };
    for &size in &sizes {
        let ops_before: u64 = colls.iter().map(|c| c.stats().accelerator_ops).sum();
        let rdv_before: u64 = colls.iter().map(|c| c.stats().rendezvous).sum();
        let len = size as usize;
        let total = o.warmup + o.iterations;
        let start = Barrier::new(n);
        let per: Result<Samples, String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let (ep, c, g, start) = (&eps[i], &colls[i], &groups[i], &start);
                    s.spawn(move || -> Result<Vec<(Duration, f64)>, String> {
                        let data = vector(ty, len, i);
                        let want = expected(op, ty, len, n);
                        let mut out = Vec::new();
                        start.wait();
                        for it in 0..total {
                            let (t0, m0) = (Instant::now(), ep.clock());
                            match o.kind {
                                Kind::Allreduce => {
                                    let r = c
                                        .allreduce(g, op, ty, &data, path)
                                        .map_err(|e| format!("allreduce {it}: {e}"))?;
                                    if r != want {
                                        return Err(format!(
                                            "allreduce {it} of {len} B: member {i} got a wrong result"
                                        ));
                                    }
                                }
                                Kind::Bcast => {
                                    let r = c
                                        .bcast(g, o.root, &data)
                                        .map_err(|e| format!("bcast {it}: {e}"))?;
                                    if r != vector(ty, len, o.root) {
                                        return Err(format!(
                                            "bcast {it}: member {i} got other bytes than the root's"
                                        ));
                                    }
                                }
                                Kind::Barrier => {
                                    c.barrier(g).map_err(|e| format!("barrier {it}: {e}"))?
                                }
                            }
                            if it >= o.warmup {
                                out.push((t0.elapsed(), (ep.clock() - m0) as f64 / 1e6));
                            }
                        }
                        Ok(out)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| "a member thread panicked".to_string())?
                })
                .collect()
        });
        let per = per?;
        // The collective's time in each iteration: its slowest member's.
        let (mut wall, mut modeled) = (Vec::new(), Vec::new());
        for it in 0..o.iterations as usize {
            wall.push(per.iter().map(|m| m[it].0).max().unwrap_or_default());
            modeled.push(per.iter().map(|m| m[it].1).fold(0.0, f64::max));
        }
        let accel_ops: u64 =
            colls.iter().map(|c| c.stats().accelerator_ops).sum::<u64>() - ops_before;
        let rendezvous: u64 = colls.iter().map(|c| c.stats().rendezvous).sum::<u64>() - rdv_before;
        let bench = match o.kind {
            Kind::Allreduce => "allreduce",
            Kind::Bcast => "bcast",
            Kind::Barrier => "barrier",
        };
        Row {
            bench,
            size,
            summary: summarize(&wall),
            gbps: None,
            modeled: Some(summarize_us(modeled)),
            modeled_gbps: None,
            extra: vec![
                ("ranks", json!(n)),
                ("accel", json!(format!("{:?}", o.accel).to_lowercase())),
                ("accelerator_ops", json!(accel_ops)),
                ("rendezvous_steps", json!(rendezvous)),
                ("op", json!(format!("{:?}", o.op).to_lowercase())),
                ("type", json!(format!("{:?}", o.ty).to_lowercase())),
                ("verified", json!(o.kind != Kind::Barrier)),
            ],
        }
        .print(o.json, &mut header);
    }
    Ok(())
}
