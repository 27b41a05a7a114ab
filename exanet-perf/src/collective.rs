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

/// How far past the members' latest clock the measured iterations start: past the end of
/// the allreduce that agrees on it (tens of microseconds) and of the cells it leaves on
/// the rack, so every member starts at the same time on a quiet rack.
const ALIGN_MARGIN_PS: u64 = 1_000_000_000;

/// Moves the member's clock to one time past the members' latest, agreed over the rack
/// (an allreduce of their clocks since `start`, not measured): the measured iterations
/// start from one modeled time after the warm-up, as osu's do after a barrier, and then
/// follow each other. Without it they started from the skew the warm-up left, which on
/// 128 ranks a first iteration whose start the host ordered (members taken for gone
/// while the others attached post behind what their NIs promised) could set, and every
/// measured iteration carried it. The latest clock itself would not do: the allreduce
/// that agrees on it ends at other times for other members.
fn align(
    ep: &Endpoint,
    c: &Collectives,
    g: &Group,
    start: exanet::ModelTime,
) -> exanet::Result<()> {
    let mine = i64::try_from(ep.clock() - start).unwrap_or(i64::MAX);
    let latest = c.allreduce(
        g,
        ReduceOp::Max,
        DataType::I64,
        &mine.to_le_bytes(),
        Path::Software,
    )?;
    let latest = latest
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(mine, i64::from_le_bytes);
    ep.advance_clock(start + (latest.max(0) as u64 + ALIGN_MARGIN_PS));
    Ok(())
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

/// Element `j` of member `i`'s vector, as a small signed integer `k` (-14..=14) and a
/// position `j`: different from member to member and along the vector, as often negative
/// as positive, so that a result taken from the wrong member, the wrong element or with
/// the sign lost (an unsigned min or max) shows.
fn element(i: usize, j: usize) -> i64 {
    ((i * 37 + j * 11 + 5) % 29) as i64 - 14
}

/// Member `i`'s vector: `len` bytes of elements of `ty` (little-endian, as the library
/// takes them). Magnitudes are mixed along the vector (integers shifted by 0, 8 or 16 bits
/// for i32, 0, 20 or 40 for i64; floats scaled by 1/4 to 4), and every sum of up to 1024 of
/// them is exact in its type (no overflow, no rounding), so that the reference reduction
/// below is the same whatever order the collective combines the members in.
fn vector(ty: DataType, len: usize, i: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut j = 0;
    while v.len() < len {
        let k = element(i, j);
        let scale = (j % 5) as i32 - 2;
        match ty {
            DataType::I32 => v.extend_from_slice(&((k << (8 * (j % 3))) as i32).to_le_bytes()),
            DataType::I64 => v.extend_from_slice(&(k << (20 * (j % 3))).to_le_bytes()),
            DataType::F32 => {
                v.extend_from_slice(&(k as f32 * 2f32.powi(scale)).to_le_bytes());
            }
            DataType::F64 => v.extend_from_slice(&(k as f64 * 2f64.powi(scale)).to_le_bytes()),
        }
        j += 1;
    }
    v.truncate(len);
    v
}

/// The allreduce of `inputs`, element by element, with Rust's own arithmetic (not the
/// library's combine, which is what is being checked).
fn reference(op: ReduceOp, ty: DataType, inputs: &[Vec<u8>]) -> Vec<u8> {
    fn fold<T: Copy, const W: usize>(
        inputs: &[Vec<u8>],
        from: fn([u8; W]) -> T,
        to: fn(T) -> [u8; W],
        f: impl Fn(T, T) -> T,
    ) -> Vec<u8> {
        let len = inputs.first().map_or(0, Vec::len);
        let mut out = Vec::with_capacity(len);
        for at in (0..len - len % W).step_by(W) {
            let mut xs = inputs
                .iter()
                .map(|v| from(v[at..at + W].try_into().expect("W bytes")));
            let first = xs.next().expect("at least one member");
            out.extend_from_slice(&to(xs.fold(first, &f)));
        }
        out
    }
    match (ty, op) {
        (DataType::I32, ReduceOp::Sum) => {
            fold(inputs, i32::from_le_bytes, i32::to_le_bytes, |a, b| a + b)
        }
        (DataType::I32, ReduceOp::Min) => {
            fold(inputs, i32::from_le_bytes, i32::to_le_bytes, i32::min)
        }
        (DataType::I32, ReduceOp::Max) => {
            fold(inputs, i32::from_le_bytes, i32::to_le_bytes, i32::max)
        }
        (DataType::I64, ReduceOp::Sum) => {
            fold(inputs, i64::from_le_bytes, i64::to_le_bytes, |a, b| a + b)
        }
        (DataType::I64, ReduceOp::Min) => {
            fold(inputs, i64::from_le_bytes, i64::to_le_bytes, i64::min)
        }
        (DataType::I64, ReduceOp::Max) => {
            fold(inputs, i64::from_le_bytes, i64::to_le_bytes, i64::max)
        }
        (DataType::F32, ReduceOp::Sum) => {
            fold(inputs, f32::from_le_bytes, f32::to_le_bytes, |a, b| a + b)
        }
        (DataType::F32, ReduceOp::Min) => {
            fold(inputs, f32::from_le_bytes, f32::to_le_bytes, f32::min)
        }
        (DataType::F32, ReduceOp::Max) => {
            fold(inputs, f32::from_le_bytes, f32::to_le_bytes, f32::max)
        }
        (DataType::F64, ReduceOp::Sum) => {
            fold(inputs, f64::from_le_bytes, f64::to_le_bytes, |a, b| a + b)
        }
        (DataType::F64, ReduceOp::Min) => {
            fold(inputs, f64::from_le_bytes, f64::to_le_bytes, f64::min)
        }
        (DataType::F64, ReduceOp::Max) => {
            fold(inputs, f64::from_le_bytes, f64::to_le_bytes, f64::max)
        }
    }
}

/// The allreduce of the `n` members' vectors.
fn expected(op: ReduceOp, ty: DataType, len: usize, n: usize) -> Vec<u8> {
    let inputs: Vec<Vec<u8>> = (0..n).map(|i| vector(ty, len, i)).collect();
    reference(op, ty, &inputs)
}

/// Per member: (wall, modeled us) per measured iteration, and how many results it
/// compared (warm-up included).
type Samples = Vec<(Vec<(Duration, f64)>, u64)>;

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
    // Each member's clock starts where its daemon put it at attach; they start together.
    let start = eps.iter().map(Endpoint::clock).max().unwrap_or_default();
    for e in &eps {
        e.advance_clock(start);
    }
    let origin = start;
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
                    s.spawn(move || -> Result<(Vec<(Duration, f64)>, u64), String> {
                        let data = vector(ty, len, i);
                        let want = match o.kind {
                            Kind::Allreduce => expected(op, ty, len, n),
                            Kind::Bcast => vector(ty, len, o.root),
                            Kind::Barrier => Vec::new(),
                        };
                        let mut out = Vec::new();
                        let mut compared = 0u64;
                        start.wait();
                        for it in 0..total {
                            if it == o.warmup {
                                align(ep, c, g, origin).map_err(|e| {
                                    format!("aligning the clocks before {it}: {e}")
                                })?;
                            }
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
                                    compared += 1;
                                }
                                Kind::Bcast => {
                                    let r = c
                                        .bcast(g, o.root, &data)
                                        .map_err(|e| format!("bcast {it}: {e}"))?;
                                    if r != want {
                                        return Err(format!(
                                            "bcast {it}: member {i} got other bytes than the root's"
                                        ));
                                    }
                                    compared += 1;
                                }
                                Kind::Barrier => {
                                    c.barrier(g).map_err(|e| format!("barrier {it}: {e}"))?
                                }
                            }
                            if it >= o.warmup {
                                out.push((t0.elapsed(), (ep.clock() - m0) as f64 / 1e6));
                            }
                        }
                        Ok((out, compared))
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
            wall.push(per.iter().map(|m| m.0[it].0).max().unwrap_or_default());
            modeled.push(per.iter().map(|m| m.0[it].1).fold(0.0, f64::max));
        }
        // Every member's every result, warm-up included, was compared (a wrong one ended
        // the run above); a barrier has none.
        let compared: u64 = per.iter().map(|m| m.1).sum();
        let every = o.kind != Kind::Barrier && compared == n as u64 * total;
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
                ("verified_results", json!(compared)),
                ("verified", json!(every)),
            ],
        }
        .print(o.json, &mut header);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [DataType; 4] = [DataType::I32, DataType::I64, DataType::F32, DataType::F64];
    const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];

    fn i64s(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn the_reference_reduces_element_by_element_with_signs() {
        let inputs = [i64s(&[-5, 3]), i64s(&[2, -7]), i64s(&[1, 9])];
        let r = |op| reference(op, DataType::I64, &inputs);
        assert_eq!(r(ReduceOp::Sum), i64s(&[-2, 5]));
        assert_eq!(r(ReduceOp::Min), i64s(&[-5, -7]));
        assert_eq!(r(ReduceOp::Max), i64s(&[2, 9]));
        let f = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let inputs = [f(&[0.25, -3.0]), f(&[-1.5, 2.0])];
        assert_eq!(
            reference(ReduceOp::Sum, DataType::F32, &inputs),
            f(&[-1.25, -1.0])
        );
        assert_eq!(
            reference(ReduceOp::Min, DataType::F32, &inputs),
            f(&[-1.5, -3.0])
        );
    }

    #[test]
    fn vectors_differ_by_member_and_element_and_carry_negatives() {
        for ty in TYPES {
            let a = vector(ty, 64, 0);
            let b = vector(ty, 64, 1);
            assert_eq!(a.len(), 64);
            assert_ne!(a, b, "{ty:?}: two members with the same vector");
            let w = ty.size();
            let elems: Vec<&[u8]> = a.chunks(w).collect();
            assert!(
                elems.windows(2).any(|p| p[0] != p[1]),
                "{ty:?}: every element the same"
            );
            // The sign bit (top bit of the little-endian element) is set somewhere.
            assert!(
                elems.iter().any(|e| e[w - 1] & 0x80 != 0),
                "{ty:?}: no negative"
            );
        }
        // Any length, also one that ends inside an element (a broadcast of 1 B).
        assert_eq!(vector(DataType::F64, 1, 3).len(), 1);
    }

    /// Whatever order a collective combines the members in, the exact result is the same:
    /// the reference of the members in reverse order equals that in order, for up to 1024
    /// members (the most a rack has ranks).
    #[test]
    fn the_reference_does_not_depend_on_the_order_of_the_members() {
        for ty in TYPES {
            for op in OPS {
                let inputs: Vec<Vec<u8>> = (0..1024).map(|i| vector(ty, 256, i)).collect();
                let mut reversed = inputs.clone();
                reversed.reverse();
                assert_eq!(
                    reference(op, ty, &inputs),
                    reference(op, ty, &reversed),
                    "{ty:?} {op:?}"
                );
            }
        }
    }

    /// The inputs catch a min or max that compares without the sign, and one that takes
    /// the first or the last member's vector.
    #[test]
    fn wrong_reductions_give_other_results() {
        let n = 8;
        let inputs: Vec<Vec<u8>> = (0..n).map(|i| vector(DataType::I64, 256, i)).collect();
        let unsigned = |pick_min: bool| -> Vec<u8> {
            (0..256 / 8)
                .flat_map(|e| {
                    let xs = inputs
                        .iter()
                        .map(|v| u64::from_le_bytes(v[e * 8..e * 8 + 8].try_into().unwrap()));
                    let r = if pick_min { xs.min() } else { xs.max() };
                    r.unwrap().to_le_bytes()
                })
                .collect()
        };
        let min = expected(ReduceOp::Min, DataType::I64, 256, n);
        let max = expected(ReduceOp::Max, DataType::I64, 256, n);
        assert_ne!(min, unsigned(true));
        assert_ne!(max, unsigned(false));
        for op in OPS {
            let r = expected(op, DataType::I64, 256, n);
            assert_ne!(r, inputs[0], "{op:?}");
            assert_ne!(r, inputs[n - 1], "{op:?}");
        }
    }
}
