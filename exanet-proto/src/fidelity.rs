//! The fidelity benchmark: the report's measurements (SPEC §6) repeated in the simulator
//! in modeled time, beside the report's figures.
//!
//! Everything here is modeled time, so a run gives the same table on any host. The
//! software cost of an MPI call is calibrated on the intra-FPGA row only: the same
//! exchange is run with no software cost, and each of the two calls of a one-way message
//! (send, receive) is given half of what separates that from the report's 1.17 us. Every
//! other row then follows from the mechanism (links, switches, routers, the NI).

use crate::gvas::{Gvas, Pdid};
use crate::model::{Model, ModelTime};
use crate::ni::{mailbox_gvas, NiEvent, RdmaWrite, SendMessage, VecMemory};
use crate::node::NodeEvent;
use crate::routing::path;
use crate::shape::{NodeId, Shape};
use crate::sim::{Sim, SimConfig};
use crate::switch::SwitchConfig;
use crate::topology::Port;

const PDID: Pdid = Pdid(7);
const SRC_VA: u64 = 0x1000_0000;
const DST_VA: u64 = 0x4000_0000;
/// A user-level ping carries a word; an MPI envelope of a 0-byte message a few.
const USER_PAYLOAD: usize = 8;
const MPI_ENVELOPE: usize = 16;

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub what: String,
    pub report: f64,
    pub modeled: f64,
    pub unit: &'static str,
}

impl Row {
    /// (modeled - report) / report, in percent.
    pub fn error_pct(&self) -> f64 {
        (self.modeled - self.report) / self.report * 100.0
    }
}

/// A rack of `shape` with rank 0 (and rank 1 on `extra_rank`) attached everywhere,
/// memory for `bytes` of RDMA at each, and one RDMA page.
fn rack(shape: Shape, model: Model, bytes: usize) -> Sim {
    let mut sim = Sim::new(
        shape,
        SimConfig {
            switch: SwitchConfig {
                model,
                ..SwitchConfig::default()
            },
            ..SimConfig::default()
        },
    )
    .expect("a valid shape");
    for id in shape.node_ids() {
        let n = sim.node_mut(id);
        let mut mem = VecMemory::new();
        mem.register(0, SRC_VA, bytes.max(4096));
        mem.register(0, DST_VA, bytes.max(4096));
        n.set_memory(Box::new(mem));
        let (ni, _) = n.ni_mut();
        ni.attach(0, PDID).expect("rank 0 is free");
        ni.attach(1, PDID).expect("rank 1 is free");
        ni.alloc_rdma_page(0).expect("a page is free");
    }
    sim
}

fn settle(sim: &mut Sim) {
    sim.kick_all();
    while sim.step() {}
}

/// A ping-pong of packetizer messages between two ranks' mailboxes.
struct Pingpong {
    shape: Shape,
    model: Model,
    payload: usize,
    /// Picoseconds of software per send or receive call.
    software: u64,
    rounds: u32,
}

impl Pingpong {
    /// Modeled one-way time (us) from (`a`, rank 0) to (`b`, `b_rank`) and back, as half
    /// the round trip (the way osu_latency measures it), averaged over the rounds.
    fn one_way(&self, a: NodeId, b: NodeId, b_rank: u8) -> f64 {
        let Pingpong {
            shape,
            model,
            payload,
            software,
            rounds,
        } = *self;
        let mut sim = rack(shape, model, 4096);
        let ends = [(a, 0u8), (b, b_rank)];
        let mut mb = [0u8; 2];
        let mut pk = [0u8; 2];
        for (i, &(n, r)) in ends.iter().enumerate() {
            let (ni, _) = sim.node_mut(n).ni_mut();
            mb[i] = ni.alloc_mailbox(r, 1024).expect("a mailbox");
            pk[i] = ni.alloc_packetizer(r).expect("a packetizer");
        }
        let start = ModelTime::from_ns(1_000);
        let mut clock = start;
        for _ in 0..rounds {
            for (from, to) in [(0usize, 1usize), (1, 0)] {
                let (n, r) = ends[from];
                let (dn, dr) = ends[to];
                let dst = mailbox_gvas(PDID, dn, dr, mb[to]).expect("a mailbox address");
                let op = SendMessage {
                    vi: pk[from],
                    ch: 0,
                    dst,
                    payload: vec![0x5A; payload],
                };
                let now = sim.now();
                // The send call's software runs before the descriptor is written.
                sim.node_mut(n)
                    .ni_mut()
                    .0
                    .send_message_at(r, &op, now, clock + software)
                    .expect("the channel is free");
                settle(&mut sim);
                let (ni, _) = sim.node_mut(dn).ni_mut();
                let m = ni
                    .mailboxes
                    .pop(dr, mb[to])
                    .expect("the mailbox is open")
                    .expect("the message arrived");
                // The reader sees it a CPU request later, then its receive call runs.
                clock = m.at + model.cpu_ni + software;
            }
        }
        (clock - start) as f64 / f64::from(2 * rounds) / 1e6
    }
}

/// Modeled bandwidth (Gb/s) of one RDMA write of `bytes` from `a` to `b`.
fn rdma_gbps(shape: Shape, model: Model, a: NodeId, b: NodeId, bytes: usize) -> f64 {
    let mut sim = rack(shape, model, bytes);
    let start = ModelTime::from_ns(1_000);
    let op = RdmaWrite {
        page: 0,
        ch: 0,
        src_va: SRC_VA,
        dst: Gvas::new(PDID, b, 0, DST_VA).expect("a valid address"),
        len: bytes as u64,
        notify: None,
    };
    let now = sim.now();
    {
        let (ni, mem) = sim.node_mut(a).ni_mut();
        ni.rdma_write_at(0, &op, now, start, mem)
            .expect("the channel is free");
    }
    settle(&mut sim);
    let done = sim.take_events().into_iter().find_map(|(n, _, e)| match e {
        NodeEvent::Ni(NiEvent::Rdma { result, at, .. }) if n == a => Some((result, at)),
        _ => None,
    });
    match done {
        Some((Ok(()), at)) => bytes as f64 * 8.0 / ((at - start) as f64 / 1e3),
        other => panic!("the RDMA write did not complete: {other:?}"),
    }
}

/// A pair of nodes whose dimension-order path has `torus` torus links and `intra` links
/// inside QFDBs, the source not an F1 when `intra` > 0.
fn pair_with(shape: &Shape, torus: usize, intra: usize) -> Option<(NodeId, NodeId)> {
    for a in shape.node_ids() {
        for b in shape.node_ids() {
            let Ok(p) = path(shape, a, b) else { continue };
            let t = p
                .iter()
                .filter(|(_, h)| matches!(h.port, Port::Torus(..)))
                .count();
            let q = p
                .iter()
                .filter(|(_, h)| matches!(h.port, Port::Qfdb(_)))
                .count();
            if t == torus && q == intra {
                return Some((a, b));
            }
        }
    }
    None
}

/// Runs the benchmark. `short` uses 256 KB instead of 4 MB transfers and fewer rounds.
pub fn run(model: Model, short: bool) -> Vec<Row> {
    let shape = Shape::PROTOTYPE;
    let n = |s: &str| shape.parse_node(s).expect("a prototype node name");
    let rounds = if short { 2 } else { 10 };
    let mut rows = Vec::new();
    let user = Pingpong {
        shape,
        model,
        payload: USER_PAYLOAD,
        software: 0,
        rounds,
    }
    .one_way(n("M1QAF1"), n("M1QAF2"), 0);
    rows.push(Row {
        what: "user-level packetizer->mailbox one-way, adjacent intra-QFDB".into(),
        report: 0.470,
        modeled: user,
        unit: "us",
    });
    // Calibration: the intra-FPGA exchange (two ranks of one node) with no software.
    let f1 = n("M1QAF1");
    let mut mpi_calls = Pingpong {
        shape,
        model,
        payload: MPI_ENVELOPE,
        software: 0,
        rounds,
    };
    let bare = mpi_calls.one_way(f1, f1, 1);
    mpi_calls.software = (((1.17 - bare) / 2.0).max(0.0) * 1e6).round() as u64;
    let software = mpi_calls.software;
    let mpi = |a: NodeId, b: NodeId, rank: u8| mpi_calls.one_way(a, b, rank);
    rows.push(Row {
        what: format!(
            "MPI 0 B one-way intra-FPGA (calibrates software = {:.3} us per call)",
            software as f64 / 1e6
        ),
        report: 1.17,
        modeled: mpi(f1, f1, 1),
        unit: "us",
    });
    let paths: [(&str, f64, usize, usize); 5] = [
        ("(a) intra-QFDB, 1 x 16G", 1.293, 0, 1),
        ("(b) intra-mezz-sh, 1 x 10G", 1.579, 1, 0),
        ("(c) intra-mezz-mh(2), 10G + 16G", 2.0, 1, 1),
        ("(d) intra-mezz-mh(3), 10G + 2 x 16G", 2.111, 1, 2),
        ("(e) inter-mezz(3,1,2), 4 x 10G + 2 x 16G", 2.555, 4, 2),
    ];
    for (what, report, torus, intra) in paths {
        let Some((a, b)) = pair_with(&shape, torus, intra) else {
            continue;
        };
        rows.push(Row {
            what: format!(
                "MPI 0 B one-way {what}: {} -> {}",
                shape.display(a),
                shape.display(b)
            ),
            report,
            modeled: mpi(a, b, 0),
            unit: "us",
        });
    }
    let bytes = if short { 256 << 10 } else { 4 << 20 };
    let label = if short { "256 KB" } else { "4 MB" };
    // osu_bw, 4 MB (report §6.1.2): 81.9% of 16 Gb/s, 64.3% of 10 Gb/s; and the RDMA
    // engine alone (thesis §7) on one intra-QFDB hop whose transceivers ran at 10 Gb/s.
    let thesis = Model {
        qfdb_rate: crate::model::Rate::from_gbps(10.0),
        ..model
    };
    for (what, report, to, model) in [
        ("intra-QFDB (16 Gb/s link)", 13.1, "M1QAF2", model),
        ("one torus link (10 Gb/s)", 6.42, "M1QBF1", model),
        (
            "intra-QFDB at 10 Gb/s, engine alone (thesis)",
            8.23,
            "M1QAF2",
            thesis,
        ),
    ] {
        rows.push(Row {
            what: format!("RDMA {label} {what}"),
            report,
            modeled: rdma_gbps(shape, model, n("M1QAF1"), n(to), bytes),
            unit: "Gb/s",
        });
    }
    rows
}

/// The table as text.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<78} {:>10} {:>10} {:>8}\n",
        "what", "report", "modeled", "error %"
    );
    for r in rows {
        s += &format!(
            "{:<78} {:>7.3} {:<2} {:>7.3} {:<2} {:>+8.1}\n",
            r.what,
            r.report,
            r.unit,
            r.modeled,
            r.unit,
            r.error_pct()
        );
    }
    s
}
