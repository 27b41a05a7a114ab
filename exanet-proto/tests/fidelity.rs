//! The fidelity benchmark's short run (`cargo run --release -p exanet-proto --example
//! fidelity` is the full one) and the NI's allreduce accelerator, in modeled time, against
//! the report's figures.
//!
//! The figures are written out here, from SPEC.md §6 (the ExaNeSt report's Table 2 and
//! §6.1, the RDMA engine thesis §7), and never taken from the crate: the benchmark prints
//! its own copy of them beside the modeled values, and a test that compared against that
//! copy would follow it wherever it drifted. Each figure is checked as what it is:
//!
//! - a **calibration**: a model parameter was fitted on this figure, so the modeled value
//!   meets it by construction and comparing them proves nothing. What is checked is the
//!   fitted parameter, pinned in a band, so that a change of the mechanism under it shows.
//! - a **reproduction**: the mechanism alone (links, switches, routers, the NI), with no
//!   parameter fitted on this figure, reaches it within 5%; today's modeled value is
//!   also pinned in a band (about 1%), so that drift shows before the 5% is lost.
//! - a **known miss**: the model does not reach the figure, for reasons docs/modeled-time.md
//!   and docs/collectives.md give. Today's modeled value is pinned in a band that excludes
//!   the report's figure, so that drift either way fails here and the docs are updated
//!   with it (the band is where to write the new figure when the change is meant).
//!
//! Modeled time does not depend on the host: every value below is the same on any
//! machine, so the bands are narrow (about 1% around today's value).

use exanet_proto::fidelity::{run, table, Row};
use exanet_proto::gvas::Pdid;
use exanet_proto::model::{Model, ModelParams, ModelTime};
use exanet_proto::ni::{Allreduce, DataType, NiEvent, ReduceOp, VecMemory};
use exanet_proto::sim::{Sim, SimConfig};
use exanet_proto::NodeEvent;
use exanet_proto::{NodeId, Shape};

/// How a figure is checked (see the module's documentation).
#[derive(Clone, Copy, Debug)]
enum Check {
    /// A parameter is fitted on the figure, so meeting it is no evidence. `band` pins what
    /// the fit leaves free: a parameter the benchmark computes (the MPI software cost, us
    /// per call), or the modeled value where the parameter is a fixed default fitted by
    /// hand (the accelerator's setup), which the mechanism under it still moves.
    Calibration { band: (f64, f64) },
    /// The mechanism reaches the figure within 5%, and today's modeled value lies in
    /// `band`.
    Reproduced { band: (f64, f64) },
    /// The model misses the figure; today's modeled value lies in `band`.
    Miss { band: (f64, f64) },
}

/// A figure of the report, with where it comes from.
struct Figure {
    /// The benchmark row it is compared with: a prefix (or part) of the row's label.
    row: &'static str,
    report: f64,
    source: &'static str,
    check: Check,
}

/// SPEC.md §6: the user-level latency, Table 2 (MPI 0-byte one-way latency by path),
/// osu_bw at 4 MB. The RDMA rows run 256 KB here (the short run); the model streams a
/// transfer at a steady rate after its first block, so the size changes them by well
/// under the bands.
const FIGURES: &[Figure] = &[
    Figure {
        row: "user-level packetizer->mailbox",
        report: 0.470,
        source: "report §6.1.1, ~470 ns",
        // The NI's own costs (`cpu_ni_ns`, `mem_write_ns`) were chosen so that this row
        // lands on 470 ns: a calibration of the NI part (docs/modeled-time.md).
        check: Check::Calibration {
            band: (0.462, 0.472),
        },
    },
    Figure {
        row: "MPI 0 B one-way intra-FPGA",
        report: 1.17,
        source: "report Table 2, intra-FPGA",
        // The MPI software cost per call is fitted here: 1.17 us less the NI's part of
        // the exchange, halved (send and receive). The NI's part is about 0.33 us.
        check: Check::Calibration {
            band: (0.413, 0.423),
        },
    },
    Figure {
        row: "MPI 0 B one-way (a) intra-QFDB",
        report: 1.293,
        source: "report Table 2, (a)",
        // The link latency (120 ns) is the report's own difference between (a) and the
        // intra-FPGA row: fitted on this row.
        check: Check::Calibration {
            band: (1.294, 1.320),
        },
    },
    Figure {
        row: "MPI 0 B one-way (b) intra-mezz-sh",
        report: 1.579,
        source: "report Table 2, (b)",
        // The inter-QFDB router's extra latency (~280 ns) is the report's difference
        // between (b) and (a): fitted on this row.
        check: Check::Calibration {
            band: (1.569, 1.601),
        },
    },
    Figure {
        row: "MPI 0 B one-way (c) intra-mezz-mh(2)",
        report: 2.0,
        source: "report Table 2, (c)",
        // -14%: the report's (c) and (d) exceed its own latency model (1.17 us + routers
        // x 145 ns + links x 120 ns), which the mechanism follows.
        check: Check::Miss {
            band: (1.70, 1.735),
        },
    },
    Figure {
        row: "MPI 0 B one-way (d) intra-mezz-mh(3)",
        report: 2.111,
        source: "report Table 2, (d)",
        check: Check::Miss {
            band: (1.835, 1.87),
        },
    },
    Figure {
        row: "MPI 0 B one-way (e) inter-mezz(3,1,2)",
        report: 2.555,
        source: "report Table 2, (e)(3,1,2)",
        // The only latency row no parameter was fitted on.
        check: Check::Reproduced {
            band: (2.62, 2.674),
        },
    },
    Figure {
        row: "RDMA 256 KB intra-QFDB (16",
        report: 13.1,
        source: "report §6.1.2, osu_bw 4 MB, 81.9% of 16 Gb/s",
        // +8%: the model has no DMA or software gaps between blocks, only the cells'
        // overheads (the ceiling checked below).
        check: Check::Miss {
            band: (14.03, 14.22),
        },
    },
    Figure {
        row: "RDMA 256 KB one torus link",
        report: 6.42,
        source: "report §6.1.2, osu_bw 4 MB, 64.3% of 10 Gb/s",
        // +8%, as the intra-QFDB row and for the same reason. What separates the two
        // links, the control data the routing logic between QFDBs sends with each cell,
        // is calibrated on the report's ratio of the two (checked below).
        check: Check::Miss {
            band: (6.86, 6.957),
        },
    },
    Figure {
        row: "RDMA 256 KB intra-QFDB at 10 Gb/s",
        report: 8.23,
        source: "RDMA engine thesis §7, 1 intra-QFDB hop at 10 Gb/s, ceiling ~8.9",
        // +7.5%: the engine alone, closer, but the model still streams at the ceiling.
        check: Check::Miss {
            band: (8.76, 8.889),
        },
    },
];

impl Figure {
    fn unit(&self) -> &'static str {
        if self.row.starts_with("RDMA") {
            "Gb/s"
        } else {
            "us"
        }
    }

    /// What is wrong with `modeled` for this figure, if anything; `fitted` is the
    /// parameter a calibration computed, if it computes one.
    fn verdict(&self, modeled: f64, fitted: Option<f64>) -> Option<String> {
        let err = (modeled - self.report) / self.report * 100.0;
        let what = format!(
            "{} ({}): modeled {modeled:.3} {}, report {:.3} ({err:+.1}%)",
            self.row,
            self.source,
            self.unit(),
            self.report
        );
        match self.check {
            Check::Calibration { band: (lo, hi) } => {
                let (name, v) = match fitted {
                    Some(p) => ("fitted parameter", p),
                    None => ("modeled value", modeled),
                };
                (!(lo..=hi).contains(&v)).then(|| {
                    format!(
                        "calibration {what}: {name} {v:.3} outside [{lo}, {hi}]: the \
                         mechanism under the calibration changed"
                    )
                })
            }
            Check::Reproduced { band: (lo, hi) } => {
                if err.abs() > 5.0 {
                    Some(format!("reproduction lost (over 5%): {what}"))
                } else {
                    (!(lo..=hi).contains(&modeled)).then(|| {
                        format!(
                            "reproduction drifted out of [{lo}, {hi}]: {what}; if that is \
                             meant, say so in the docs and move the band"
                        )
                    })
                }
            }
            Check::Miss { band: (lo, hi) } => {
                assert!(
                    !(lo..=hi).contains(&self.report),
                    "{}: a band holding the report's figure is no miss",
                    self.row
                );
                (!(lo..=hi).contains(&modeled)).then(|| {
                    format!(
                        "known miss drifted out of [{lo}, {hi}]: {what}; if that is meant, \
                         say so in the docs and move the band"
                    )
                })
            }
        }
    }
}

fn row<'a>(rows: &'a [Row], part: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.what.starts_with(part) || r.what.contains(part))
        .unwrap_or_else(|| panic!("no row {part:?} in\n{}", table(rows)))
}

/// The software cost the benchmark fitted, read from its calibration row's label
/// ("... (calibrates software = 0.418 us per call)").
fn fitted_software_us(r: &Row) -> f64 {
    r.what
        .split("software = ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("the calibration row does not say what it fitted: {r:?}"))
}

#[test]
fn the_report_figures_reproduced_calibrated_or_missed_as_known() {
    // The hand-fitted defaults the calibration rows stand for (the NI's costs on the
    // user-level row, the link latency on (a), the router on (b)): a change of one is a
    // new calibration, whose band must be fitted again.
    let d = ModelParams::default();
    assert_eq!(
        (
            d.cpu_ni_ns,
            d.mem_write_ns,
            d.qfdb_link_ns,
            d.torus_link_ns,
            d.router_ns,
            d.torus_control_bytes
        ),
        (125.0, 50.0, 120.0, 120.0, 145.0, 80)
    );
    let rows = run(Model::default(), true);
    println!("{}", table(&rows));
    let mut failures = Vec::new();
    for f in FIGURES {
        let r = row(&rows, f.row);
        assert_eq!(r.unit, f.unit(), "{}", f.row);
        // Only the software cost is fitted by the benchmark itself; the other
        // calibrations are defaults fitted by hand (pinned below), so their band holds
        // the modeled value.
        let fitted = (matches!(f.check, Check::Calibration { .. })
            && r.what.contains("calibrates software"))
        .then(|| fitted_software_us(r));
        failures.extend(f.verdict(r.modeled, fitted));
    }
    // Only the figures above stand for the report: a row the benchmark adds must be
    // given a figure here, and the figure it prints must be the report's.
    for r in &rows {
        let Some(f) = FIGURES.iter().find(|f| r.what.starts_with(f.row)) else {
            failures.push(format!("row without a figure in this test: {}", r.what));
            continue;
        };
        if r.report != f.report {
            failures.push(format!(
                "{}: the benchmark prints {} as the report's figure, the report says {}",
                r.what, r.report, f.report
            ));
        }
    }
    // Cell overheads alone bound RDMA at 256/288 of the link rate (256/368 on a torus
    // link, whose cells carry 80 B of control data each): the model streams within a few
    // percent of that ceiling and never above it.
    for (what, link, wire) in [
        ("RDMA 256 KB intra-QFDB (16", 16.0, 288.0),
        ("RDMA 256 KB one torus", 10.0, 368.0),
        ("RDMA 256 KB intra-QFDB at 10", 10.0, 288.0),
    ] {
        let r = row(&rows, what);
        let ceiling = link * 256.0 / wire;
        if !(r.modeled <= ceiling && r.modeled > 0.95 * ceiling) {
            failures.push(format!(
                "{what}: {:.3} against ceiling {ceiling:.3}",
                r.modeled
            ));
        }
    }
    // The calibration of the torus control data: the report blames the routing logic's
    // control data for the gap between 64.3% of a torus link and 81.9% of a QFDB link;
    // the model's ratio of the two rows is the report's within 1%.
    let ratio = row(&rows, "RDMA 256 KB one torus").modeled
        / row(&rows, "RDMA 256 KB intra-QFDB (16").modeled;
    let report = 6.42 / 13.1;
    if (ratio / report - 1.0).abs() > 0.01 {
        failures.push(format!(
            "torus / intra-QFDB RDMA: modeled {ratio:.4}, report {report:.4}: the \
             calibration of torus_control_bytes no longer holds"
        ));
    }
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        table(&rows)
    );
}

/// "What if": a faster torus shortens the torus rows and leaves the intra-QFDB ones alone,
/// and doubles the torus RDMA bandwidth.
#[test]
fn changing_a_parameter_changes_the_figures_the_way_the_hardware_would() {
    let base = run(Model::default(), true);
    let fast = run(
        ModelParams {
            torus_link_gbps: 20.0,
            router_ns: 45.0,
            ..ModelParams::default()
        }
        .model()
        .unwrap(),
        true,
    );
    let a = |rows: &[Row], w: &str| row(rows, w).modeled;
    assert_eq!(a(&base, "(a) intra-QFDB"), a(&fast, "(a) intra-QFDB"));
    // Two router traversals of 100 ns less each.
    let gain = a(&base, "(b) intra-mezz-sh") - a(&fast, "(b) intra-mezz-sh");
    assert!((0.2..0.25).contains(&gain), "{gain}");
    let bw = a(&fast, "RDMA 256 KB one torus") / a(&base, "RDMA 256 KB one torus");
    assert!((1.9..2.05).contains(&bw), "{bw}");
}

// --- The allreduce accelerator (report §6.1.5).

const PDID: Pdid = Pdid(7);
const SRC_VA: u64 = 0x1000_0000;
const DST_VA: u64 = 0x2000_0000;

/// Modeled time (us) of an allreduce of `bytes` over one rank on every node of the first
/// `qfdbs` QFDBs of `shape`, from the posts to the last member's completion. The
/// accelerator takes 256 B per operation; longer vectors are, as in the report, one
/// operation after the other, each member posting the next when its previous one
/// completed.
fn accelerated_allreduce_us(shape: &str, qfdbs: u32, bytes: usize) -> f64 {
    let shape: Shape = shape.parse().unwrap();
    let mut sim = Sim::new(shape, SimConfig::default()).unwrap();
    for id in shape.node_ids() {
        let n = sim.node_mut(id);
        let mut mem = VecMemory::new();
        mem.register(0, SRC_VA, 4096);
        mem.register(0, DST_VA, 4096);
        n.set_memory(Box::new(mem));
        n.ni_mut().0.attach(0, PDID).unwrap();
    }
    let members: Vec<(NodeId, u8)> = (0..qfdbs * 4).map(|i| (NodeId(i), 0)).collect();
    let start = ModelTime::from_ns(1_000);
    let mut posted_at = vec![start; members.len()];
    for (pass, off) in (0..bytes).step_by(256).enumerate() {
        let len = (bytes - off).min(256);
        let op = Allreduce {
            id: pass as u32 + 1,
            op: ReduceOp::Sum,
            ty: DataType::F64,
            members: members.clone(),
            src_va: SRC_VA + off as u64,
            dst_va: DST_VA + off as u64,
            len: len as u16,
        };
        for (i, &(node, rank)) in members.iter().enumerate() {
            let now = sim.now();
            let (ni, mem) = sim.node_mut(node).ni_mut();
            ni.allreduce_at(rank, &op, now, posted_at[i], mem).unwrap();
        }
        sim.kick_all();
        while sim.step() {}
        let mut done = vec![None; members.len()];
        for (node, _, e) in sim.take_events() {
            if let NodeEvent::Ni(NiEvent::Allreduce {
                rank, result, at, ..
            }) = e
            {
                let i = members.iter().position(|&m| m == (node, rank)).unwrap();
                assert_eq!(result, Ok(()), "member {i}, pass {pass}");
                done[i] = Some(at);
            }
        }
        for (i, d) in done.into_iter().enumerate() {
            posted_at[i] = d.unwrap_or_else(|| panic!("member {i} never completed pass {pass}"));
        }
    }
    let last = posted_at.into_iter().max().unwrap();
    (last.ps() - start.ps()) as f64 / 1e6
}

/// Report §6.1.5, allreduce of 256 B vectors on the accelerator (one rank per node,
/// whole QFDBs; 512 B and 1024 B take one pass per 256 B). The report's software
/// allreduces (39.7 and 76.9 us, and §6.1.3's 5.34 and 33.62 us on 4 ranks) are the client
/// library's, not the NI's: scripts/bench-collectives.sh measures them on a rack of
/// daemons, whose modeled times vary with the host's scheduling (docs/collectives.md).
const ALLREDUCE: &[(Figure, &str, u32, usize)] = &[
    (
        Figure {
            row: "allreduce 256 B, 16 ranks, accelerator",
            report: 6.79,
            source: "report §6.1.5",
            // accel_setup_ns (3 us) was fitted on this row by hand.
            check: Check::Calibration { band: (6.43, 6.56) },
        },
        "4x1x1",
        4,
        256,
    ),
    (
        Figure {
            row: "allreduce 256 B, 128 ranks, accelerator",
            report: 9.61,
            source: "report §6.1.5",
            check: Check::Reproduced { band: (9.16, 9.25) },
        },
        "4x4x2",
        32,
        256,
    ),
    (
        Figure {
            row: "allreduce 512 B, 16 ranks, accelerator",
            report: 13.38,
            source: "report §6.1.5",
            check: Check::Reproduced {
                band: (12.77, 12.89),
            },
        },
        "4x1x1",
        4,
        512,
    ),
    (
        Figure {
            row: "allreduce 1024 B, 16 ranks, accelerator",
            report: 26.11,
            source: "report §6.1.5",
            check: Check::Reproduced {
                band: (25.30, 25.56),
            },
        },
        "4x1x1",
        4,
        1024,
    ),
];

#[test]
fn the_allreduce_accelerator_against_the_report() {
    // The calibration the 16-rank row stands for: a change of it is a new calibration,
    // whose band above must be fitted again.
    assert_eq!(ModelParams::default().accel_setup_ns, 3000.0);
    let mut failures = Vec::new();
    for (f, shape, qfdbs, bytes) in ALLREDUCE {
        let modeled = accelerated_allreduce_us(shape, *qfdbs, *bytes);
        eprintln!(
            "{}: report {:.2} us, modeled {modeled:.3} us ({:+.1}%)",
            f.row,
            f.report,
            (modeled - f.report) / f.report * 100.0
        );
        failures.extend(f.verdict(modeled, None));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
