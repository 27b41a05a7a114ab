//! Workloads run to completion on a simulated rack, and the modeled time each part took:
//! RDMA flows ([`flows`]) and allreduces on the accelerator ([`allreduce`]).
//!
//! The yardstick of modeled figures: the simulator's tests check them against hand
//! calculations, and a rack of daemons in modeled order given the same workload from the
//! same rack file must model the same times (`tests/tests/modeled_order.rs`;
//! docs/modeled-time.md).

use crate::gvas::{Gvas, GvasError, Pdid};
use crate::model::ModelTime;
use crate::ni::{
    Allreduce, DataType, Failure, MemFault, NiConfig, NiError, NiEvent, RdmaWrite, ReduceOp,
    VecMemory,
};
use crate::node::{NodeError, NodeEvent};
use crate::shape::{NodeId, Shape};
use crate::sim::{Sim, SimConfig};
use crate::time::Instant;

const PDID: Pdid = Pdid(9);
const SRC_VA: u64 = 0x10_0000;
const DST_VA: u64 = 0x1000_0000;
/// How long a run may take in simulated real time before its flows count as stuck.
const LIMIT_NS: u64 = 600_000_000_000;

/// One RDMA write of `len` bytes from `from`'s memory to `to`'s, posted at modeled time
/// `at` by rank 0 of `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub from: NodeId,
    pub to: NodeId,
    pub len: u64,
    pub at: ModelTime,
}

/// The rack a workload runs on.
#[derive(Clone, Copy, Debug)]
pub struct BenchConfig {
    /// The simulator, its switches (their model, and whether they serve cells in modeled
    /// order) and links.
    pub sim: SimConfig,
    /// Every NI's configuration; its model is the switches'.
    pub ni: NiConfig,
}

/// What a run of flows gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowsRun {
    /// When each flow's write completed at its sender, in modeled time, by flow.
    pub done: Vec<ModelTime>,
    /// Cells forwarded out of modeled order, over the rack.
    pub late: u64,
    /// Cuts a coordinator took, when horizons came from cuts.
    pub cuts: u64,
    /// Nodes' parts of those cuts (a node left out of a cut costs nothing).
    pub parts: u64,
    /// Blocks sent again, over the rack.
    pub retransmissions: u64,
    /// When the last node event happened, in simulated real time.
    pub wall: Instant,
}

impl FlowsRun {
    /// Each flow's modeled duration from when it was posted, picoseconds.
    pub fn took(&self, flows: &[Flow]) -> Vec<u64> {
        self.done
            .iter()
            .zip(flows)
            .map(|(d, f)| d.since(f.at))
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("the simulated rack: {0}")]
    Rack(#[from] NodeError),
    #[error("flow {flow}: its destination: {error}")]
    Destination { flow: usize, error: GvasError },
    #[error("flow {flow}: the NI refused it: {error}")]
    Refused { flow: usize, error: NiError },
    #[error("flow {flow} ({from:?} -> {to:?}) did not complete")]
    Incomplete {
        flow: usize,
        from: NodeId,
        to: NodeId,
    },
    #[error("allreduce member {member} ({node:?}): the NI refused it: {error}")]
    Member {
        member: usize,
        node: NodeId,
        error: NiError,
    },
    #[error("allreduce member {member} ({node:?}): its vector: {error}")]
    Memory {
        member: usize,
        node: NodeId,
        error: MemFault,
    },
    #[error("allreduce member {member} ({node:?}) failed: {failure:?}")]
    Failed {
        member: usize,
        node: NodeId,
        failure: Failure,
    },
    #[error("allreduce member {member} ({node:?}) never completed")]
    Unfinished { member: usize, node: NodeId },
}

/// Runs `flows` on a rack of `shape` to completion. A node that sends several flows sends
/// each from a rank of its own, in the order of `flows` (as a benchmark with one
/// endpoint per flow attached in that order does: `exanet-perf contend`), from the same
/// source buffer; every flow writes a region of its own at its destination's rank 0.
pub fn flows(shape: Shape, flows: &[Flow], cfg: BenchConfig) -> Result<FlowsRun, BenchError> {
    let mut sim = Sim::new(shape, cfg.sim)?;
    let longest = flows.iter().map(|f| f.len).max().unwrap_or(0) as usize;
    let total: u64 = flows.iter().map(|f| f.len).sum();
    // The rank of each flow at its sender: how many of that node's flows come before it.
    let ranks: Vec<u8> = (0..flows.len())
        .map(|k| {
            flows[..k]
                .iter()
                .filter(|p| p.from == flows[k].from)
                .count()
        })
        .map(|r| u8::try_from(r).unwrap_or(u8::MAX))
        .collect();
    let mut pages = std::collections::BTreeMap::new();
    for id in shape.node_ids() {
        let senders = flows.iter().filter(|f| f.from == id).count().max(1);
        let senders = u8::try_from(senders).unwrap_or(u8::MAX);
        let n = sim.node_mut(id);
        n.set_ni_config(cfg.ni);
        let mut mem = VecMemory::new();
        mem.register(0, DST_VA, total as usize);
        for rank in 0..senders {
            mem.register(rank, SRC_VA, longest);
        }
        n.set_memory(Box::new(mem));
        let (ni, _) = n.ni_mut();
        for rank in 0..senders {
            let page = ni
                .attach(rank, PDID)
                .and_then(|()| ni.alloc_rdma_page(rank))
                .map_err(|error| BenchError::Refused { flow: 0, error })?;
            pages.insert((id, rank), page);
        }
    }
    let mut ids = Vec::with_capacity(flows.len());
    let mut offset = 0;
    for (k, f) in flows.iter().enumerate() {
        let dst = Gvas::new(PDID, f.to, 0, DST_VA + offset)
            .map_err(|error| BenchError::Destination { flow: k, error })?;
        offset += f.len;
        let now = sim.now();
        let (ni, mem) = sim.node_mut(f.from).ni_mut();
        let rank = ranks[k];
        let page = pages[&(f.from, rank)];
        let op = RdmaWrite {
            page,
            ch: 0,
            src_va: SRC_VA,
            dst,
            len: f.len,
            notify: None,
        };
        let id = ni
            .rdma_write_at(rank, &op, now, f.at, mem)
            .map_err(|error| BenchError::Refused { flow: k, error })?;
        ids.push(id);
    }
    sim.kick_all();
    sim.run_until(sim.now() + LIMIT_NS);
    let events = sim.take_events();
    let wall = events
        .iter()
        .map(|(_, at, _)| *at)
        .max()
        .unwrap_or(sim.now());
    let done = flows
        .iter()
        .zip(&ids)
        .enumerate()
        .map(|(k, (f, &id))| {
            events
                .iter()
                .find_map(|(n, _, e)| match e {
                    NodeEvent::Ni(NiEvent::Rdma {
                        id: i,
                        result: Ok(()),
                        at,
                        ..
                    }) if *n == f.from && *i == id => Some(*at),
                    _ => None,
                })
                .ok_or(BenchError::Incomplete {
                    flow: k,
                    from: f.from,
                    to: f.to,
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(FlowsRun {
        done,
        late: late_cells(&sim),
        cuts: sim.cuts(),
        parts: sim.cut_parts(),
        retransmissions: sim.nodes().map(|n| n.ni().stats().retransmissions).sum(),
        wall,
    })
}

/// An allreduce on the accelerator: when each member's completion came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllreduceRun {
    /// When each member's completion came, in modeled time, by member.
    pub done: Vec<ModelTime>,
    /// Cells forwarded out of modeled order, over the rack.
    pub late: u64,
    /// Cuts a coordinator took, when horizons came from cuts.
    pub cuts: u64,
}

/// Runs one allreduce of `len` bytes (a sum of doubles) on the accelerator, rank 0 of each
/// of `members` posting it at modeled time `at`, to completion.
pub fn allreduce(
    shape: Shape,
    members: &[NodeId],
    len: u16,
    at: ModelTime,
    cfg: BenchConfig,
) -> Result<AllreduceRun, BenchError> {
    let mut sim = Sim::new(shape, cfg.sim)?;
    for id in shape.node_ids() {
        let n = sim.node_mut(id);
        n.set_ni_config(cfg.ni);
        let mut mem = VecMemory::new();
        mem.register(0, SRC_VA, usize::from(len));
        mem.register(0, DST_VA, usize::from(len));
        n.set_memory(Box::new(mem));
        n.ni_mut()
            .0
            .attach(0, PDID)
            .map_err(|error| BenchError::Member {
                member: 0,
                node: id,
                error,
            })?;
    }
    let op = Allreduce {
        id: 1,
        op: ReduceOp::Sum,
        ty: DataType::F64,
        members: members.iter().map(|&n| (n, 0)).collect(),
        src_va: SRC_VA,
        dst_va: DST_VA,
        len,
    };
    let ones: Vec<u8> = (0..len / 8).flat_map(|_| 1f64.to_le_bytes()).collect();
    for (member, &node) in members.iter().enumerate() {
        let now = sim.now();
        let (ni, mem) = sim.node_mut(node).ni_mut();
        mem.write(0, SRC_VA, &ones)
            .map_err(|error| BenchError::Memory {
                member,
                node,
                error,
            })?;
        ni.allreduce_at(0, &op, now, at, mem)
            .map_err(|error| BenchError::Member {
                member,
                node,
                error,
            })?;
    }
    sim.kick_all();
    sim.run_until(sim.now() + LIMIT_NS);
    let mut done = vec![None; members.len()];
    for (node, _, e) in sim.take_events() {
        if let NodeEvent::Ni(NiEvent::Allreduce {
            rank: 0,
            id: 1,
            result,
            at,
        }) = e
        {
            if let Some(member) = members.iter().position(|&m| m == node) {
                if let Err(failure) = result {
                    return Err(BenchError::Failed {
                        member,
                        node,
                        failure,
                    });
                }
                done[member] = Some(at);
            }
        }
    }
    let done = done
        .into_iter()
        .enumerate()
        .map(|(member, d)| {
            d.ok_or(BenchError::Unfinished {
                member,
                node: members[member],
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(AllreduceRun {
        done,
        late: late_cells(&sim),
        cuts: sim.cuts(),
    })
}

/// Cells forwarded out of modeled order over the simulated rack.
fn late_cells(sim: &Sim) -> u64 {
    sim.nodes().map(|n| n.switch().late_cells()).sum()
}
