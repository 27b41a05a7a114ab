//! The fidelity benchmark's short run (`cargo run --release -p exanet-proto --example
//! fidelity` is the full one): modeled time reproduces the report's figures where the
//! mechanism reaches them, and what it gives elsewhere follows from the parameters.

use exanet_proto::fidelity::{run, table, Row};
use exanet_proto::model::{Model, ModelParams};

fn row<'a>(rows: &'a [Row], prefix: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.what.starts_with(prefix) || r.what.contains(prefix))
        .unwrap_or_else(|| panic!("no row {prefix:?} in\n{}", table(rows)))
}

#[test]
fn the_report_rows_within_five_percent_where_the_mechanism_reaches_them() {
    let rows = run(Model::default(), true);
    println!("{}", table(&rows));
    for what in [
        "user-level packetizer->mailbox",
        "MPI 0 B one-way intra-FPGA",
        "(a) intra-QFDB",
        "(b) intra-mezz-sh",
        "(e) inter-mezz(3,1,2)",
    ] {
        let r = row(&rows, what);
        assert!(
            r.error_pct().abs() <= 5.0,
            "{what}: {:.3} against {:.3}\n{}",
            r.modeled,
            r.report,
            table(&rows)
        );
    }
    // Cell overheads alone bound RDMA at 256/288 of the link rate; the model gets within
    // a few percent of that ceiling and never above it.
    for (what, link) in [
        ("RDMA 256 KB intra-QFDB", 16.0),
        ("RDMA 256 KB one torus", 10.0),
    ] {
        let r = row(&rows, what);
        let ceiling = link * 256.0 / 288.0;
        assert!(r.modeled <= ceiling && r.modeled > 0.95 * ceiling, "{r:?}");
    }
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
