//! RDMA flows on a simulated rack: writes from node to node, each posted at a modeled
//! time, run to completion, and what each took.
//!
//! The reference for contention figures: the simulator's tests check it against hand
//! calculations, and a rack of daemons in modeled order given the same flows must model
//! the same times (`tests/tests/modeled_order.rs`; docs/modeled-time.md).

use crate::gvas::{Gvas, GvasError, Pdid};
use crate::model::ModelTime;
use crate::ni::{NiConfig, NiError, NiEvent, RdmaWrite, VecMemory};
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

/// The rack the flows run on.
#[derive(Clone, Copy, Debug)]
pub struct FlowsConfig {
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
pub enum FlowsError {
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
}

/// Runs `flows` on a rack of `shape` to completion. A node that sends several flows sends
/// each on a channel of its own, from the same source buffer; every flow writes a
/// region of its own at its destination.
pub fn run(shape: Shape, flows: &[Flow], cfg: FlowsConfig) -> Result<FlowsRun, FlowsError> {
    let mut sim = Sim::new(shape, cfg.sim)?;
    let longest = flows.iter().map(|f| f.len).max().unwrap_or(0) as usize;
    let total: u64 = flows.iter().map(|f| f.len).sum();
    for id in shape.node_ids() {
        let n = sim.node_mut(id);
        n.set_ni_config(cfg.ni);
        let mut mem = VecMemory::new();
        mem.register(0, SRC_VA, longest);
        mem.register(0, DST_VA, total as usize);
        n.set_memory(Box::new(mem));
        let (ni, _) = n.ni_mut();
        ni.attach(0, PDID)
            .and_then(|()| ni.alloc_rdma_page(0).map(|_| ()))
            .map_err(|error| FlowsError::Refused { flow: 0, error })?;
    }
    let mut ids = Vec::with_capacity(flows.len());
    let mut offset = 0;
    for (k, f) in flows.iter().enumerate() {
        let ch = flows[..k].iter().filter(|p| p.from == f.from).count() as u8;
        let dst = Gvas::new(PDID, f.to, 0, DST_VA + offset)
            .map_err(|error| FlowsError::Destination { flow: k, error })?;
        offset += f.len;
        let now = sim.now();
        let (ni, mem) = sim.node_mut(f.from).ni_mut();
        let op = RdmaWrite {
            page: 0,
            ch,
            src_va: SRC_VA,
            dst,
            len: f.len,
            notify: None,
        };
        let id = ni
            .rdma_write_at(0, &op, now, f.at, mem)
            .map_err(|error| FlowsError::Refused { flow: k, error })?;
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
                .ok_or(FlowsError::Incomplete {
                    flow: k,
                    from: f.from,
                    to: f.to,
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(FlowsRun {
        done,
        late: shape
            .node_ids()
            .map(|n| sim.node(n).switch().late_cells())
            .sum(),
        cuts: sim.cuts(),
        retransmissions: shape
            .node_ids()
            .map(|n| sim.node(n).ni().stats().retransmissions)
            .sum(),
        wall,
    })
}
