//! exanet-perf as a pair of processes against a local rack (needs `exactl` and `exanetd`
//! built with the same profile).

#[path = "../../exanet/tests/rack/mod.rs"]
mod rack;

use std::path::PathBuf;
use std::time::Duration;

use rack::{Proc, Rack};
use serde_json::Value;

fn perf() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_exanet-perf"))
}

/// Starts `exanet-perf <bench> serve --sessions N` on `node` and waits for its ready line.
fn server(rack: &Rack, node: &str, sessions: u32) -> (Proc, String) {
    let mut p = Proc::spawn({
        let mut c = rack.workload(&perf(), node);
        c.args(["pingpong", "serve", "--sessions", &sessions.to_string()]);
        c
    });
    let ready = p.wait_line("ready ", Duration::from_secs(30));
    (p, ready)
}

/// Runs a client on `node`; its stdout parsed as JSON lines.
fn client(rack: &Rack, node: &str, args: &[&str]) -> Vec<Value> {
    client_with_stderr(rack, node, args).0
}

/// Runs a client on `node`; its stdout parsed as JSON lines (every line must be one), and
/// its stderr.
fn client_with_stderr(rack: &Rack, node: &str, args: &[&str]) -> (Vec<Value>, String) {
    let (ok, out, err) = rack::run(
        {
            let mut c = rack.workload(&perf(), node);
            c.args(args);
            c
        },
        Duration::from_secs(300),
    );
    assert!(ok, "exanet-perf {args:?} failed:\n{out}\n{err}");
    let rows = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (rows, err)
}

/// Runs a client on `node` without `--json`: (stdout, stderr).
fn client_text(rack: &Rack, node: &str, args: &[&str]) -> (String, String) {
    let (ok, out, err) = rack::run(
        {
            let mut c = rack.workload(&perf(), node);
            c.args(args);
            c
        },
        Duration::from_secs(300),
    );
    assert!(ok, "exanet-perf {args:?} failed:\n{out}\n{err}");
    (out, err)
}

fn num(v: &Value, k: &str) -> f64 {
    v.get(k)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number {k} in {v}"))
}

#[test]
fn pingpong_and_rdma_pairs_report_json() {
    let rack = Rack::up("perf", "2x1x1");
    // Sessions: pingpong, 2 x (rdma-lat, rdma-bw), an unverified run, a human-readable one.
    let (srv, ready) = server(&rack, "M1QBF3", 7);
    assert!(
        ready.contains("node=M1QBF3") && ready.contains("mailbox=0"),
        "{ready}"
    );

    let rows = client(
        &rack,
        "M1QAF2",
        &[
            "pingpong",
            "run",
            "--peer",
            "M1QBF3",
            "--sizes",
            "0,8,64",
            "--iterations",
            "200",
            "--json",
        ],
    );
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (r, size) in rows.iter().zip([0, 8, 64]) {
        assert_eq!(num(r, "size"), size as f64);
        assert_eq!(num(r, "iterations"), 200.0);
        assert!(
            num(r, "p50_us") > 0.0 && num(r, "p99_us") >= num(r, "p50_us"),
            "{r}"
        );
        // Modeled: F2 -> F1 -> torus -> F1 -> F3 with the report's parameters, no
        // software cost (the rack's default) and no compute (exanet-perf's): about a
        // microsecond, and the same in every round trip whatever the host did.
        let m = num(r, "modeled_p50_us");
        assert!((0.8..1.6).contains(&m), "{r}");
        assert!(
            num(r, "modeled_max_us") - num(r, "modeled_min_us") < 0.01 * m,
            "{r}"
        );
        eprintln!("{r}");
    }

    for op in ["write", "read"] {
        // Progress every tick (--progress-ms 0), on stderr only: stdout stays JSON lines.
        let (rows, err) = client_with_stderr(
            &rack,
            "M1QAF2",
            &[
                "rdma-lat",
                "run",
                "--peer",
                "M1QBF3:0",
                "--op",
                op,
                "--sizes",
                "4K,64K,1M",
                "--iterations",
                "3",
                "--warmup",
                "2",
                "--verify",
                "--json",
                "--progress-ms",
                "0",
            ],
        );
        assert_eq!(rows.len(), 3, "{rows:?}");
        for r in &rows {
            // rdma-lat compares every transfer, warmup included: 2 + 3.
            assert_eq!(num(r, "verified_transfers"), 5.0, "{r}");
            assert_eq!(r["verified"], Value::Bool(true));
            assert_eq!(r["op"], op);
            assert!(num(r, "gbps") > 0.0, "{r}");
            eprintln!("{r}");
        }
        // The plan first, then progress up to the last transfer of each size, then the
        // count.
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!(
                "exanet-perf: rdma-lat {op} with M1QBF3:0 mailbox 0: sizes 4096, 65536, \
                 1048576 B, 3 transfers each (+2 warmup), one at a time; every transfer \
                 compared byte for byte"
            )),
            "{err}"
        );
        for size in [4096, 65536, 1048576] {
            let last = format!("exanet-perf: {size} B: 5/5 transfers, each verified (");
            assert!(err.lines().any(|l| l.starts_with(&last)), "{last}\n{err}");
        }
        assert!(
            err.contains(
                "exanet-perf: verified 15 transfers byte for byte (4096 B: 5, 65536 B: 5, \
                 1048576 B: 5)"
            ),
            "{err}"
        );
        let rows = client(
            &rack,
            "M1QAF2",
            &[
                "rdma-bw",
                "run",
                "--peer",
                "M1QBF3",
                "--op",
                op,
                "--sizes",
                "4K,4M",
                "--iterations",
                "8",
                "--window",
                "4",
                "--verify",
                "--notify",
                "--json",
            ],
        );
        assert_eq!(rows.len(), 2, "{rows:?}");
        for r in &rows {
            // rdma-bw compares what its 4 slots hold at the end: the last transfer into
            // each.
            assert_eq!(num(r, "verified_transfers"), 4.0, "{r}");
            assert_eq!(num(r, "window"), 4.0);
            assert!(num(r, "gbps") > 0.0, "{r}");
            assert!(num(r, "p99_us") >= num(r, "p50_us"));
            // One torus link on the path: never above its ceiling, 256 B of payload per
            // 288 B cell and the routing logic's 80 B of control data after it.
            let g = num(r, "modeled_gbps");
            assert!(g > 0.5 && g <= 10.0 * 256.0 / 368.0, "{r}");
            eprintln!("{r}");
        }
    }
    // Without --verify nothing is compared, and the row says so.
    let rows = client(
        &rack,
        "M1QAF2",
        &[
            "rdma-lat",
            "run",
            "--peer",
            "M1QBF3",
            "--sizes",
            "4K",
            "--iterations",
            "3",
            "--json",
            "--quiet",
        ],
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(num(&rows[0], "verified_transfers"), 0.0, "{}", rows[0]);
    assert_eq!(rows[0]["verified"], Value::Bool(false));
    // The table, and a line saying how many transfers were verified.
    let (out, err) = client_text(
        &rack,
        "M1QAF2",
        &[
            "rdma-bw",
            "run",
            "--peer",
            "M1QBF3",
            "--sizes",
            "4K,16K",
            "--iterations",
            "2",
            "--window",
            "3",
            "--verify",
        ],
    );
    assert!(
        out.lines().any(|l| l.split_whitespace().eq([
            "size",
            "iters",
            "min_us",
            "p50_us",
            "p99_us",
            "mean_us",
            "gbps",
            "model_p50_us",
            "model_gbps"
        ])),
        "{out}"
    );
    // 2 transfers per size, so 2 of the 3 slots hold one.
    assert!(
        out.contains(
            "verified 4 transfers byte for byte (4096 B: 2, 16384 B: 2); a bandwidth run \
             compares the last transfer into each slot"
        ),
        "{out}"
    );
    assert!(
        err.starts_with(
            "exanet-perf: rdma-bw write with M1QBF3:0 mailbox 0: sizes 4096, 16384 B, 2 \
             transfers each (+3 warmup), 3 in flight; after each size, the last transfer \
             into each of the 3 slots compared"
        ),
        "{err}"
    );
    // Seven sessions ended: the server exits on its own.
    let (ok, out, err) = srv.finish(Duration::from_secs(30));
    assert!(ok, "server failed:\n{out}\n{err}");
}

#[test]
fn a_client_without_a_server_fails_clearly() {
    let rack = Rack::up("perf-none", "1x1x1");
    let (ok, _out, err) = rack::run(
        {
            let mut c = rack.workload(&perf(), "M1QAF2");
            c.args([
                "pingpong",
                "run",
                "--peer",
                "M1QAF3",
                "--connect-timeout-ms",
                "500",
            ]);
            c
        },
        Duration::from_secs(60),
    );
    assert!(!ok);
    assert!(err.contains("no server at M1QAF3:0"), "{err}");
    // A node that is not in the rack is a usage-level error, before anything is sent.
    let (ok, _out, err) = rack::run(
        {
            let mut c = rack.workload(&perf(), "M1QAF2");
            c.args(["pingpong", "run", "--peer", "M2QAF1"]);
            c
        },
        Duration::from_secs(60),
    );
    assert!(!ok);
    assert!(err.contains("M2QAF1"), "{err}");
    // A wrong job key: refused at attach.
    let (ok, _out, err) = rack::run(
        {
            let mut c = rack.workload(&perf(), "M1QAF2");
            c.args(["--job-key", "nope", "pingpong", "serve"]);
            c
        },
        Duration::from_secs(60),
    );
    assert!(!ok);
    assert!(err.contains("refused to attach"), "{err}");
}

/// Allreduce on the NI's accelerator and in software, broadcast and barrier, over the 8
/// ranks of a 2x1x1 rack, every result of every member checked by exanet-perf against
/// its own reference (`verified_results`: 8 members x 6 runs, warm-up included).
#[test]
fn collectives_on_the_accelerator_and_in_software() {
    let rack = Rack::up("coll", "2x1x1");
    let run = |args: &[&str]| -> Vec<Value> {
        let mut a = args.to_vec();
        a.extend([
            "--qfdbs",
            "2",
            "--iterations",
            "5",
            "--warmup",
            "1",
            "--json",
        ]);
        client(&rack, "M1QAF1", &a)
    };
    for (accel, ops) in [("on", true), ("off", false)] {
        let rows = run(&["allreduce", "--sizes", "8,256,1K", "--accel", accel]);
        assert_eq!(rows.len(), 3, "{rows:?}");
        for (r, size) in rows.iter().zip([8u64, 256, 1024]) {
            assert_eq!(r["verified"], Value::Bool(true), "{r}");
            assert_eq!(num(r, "verified_results"), 48.0, "{r}");
            assert_eq!(num(r, "ranks"), 8.0);
            // 256 B per accelerator operation, each member posts each: 8 ranks x 6 runs.
            let want = if ops {
                (size.div_ceil(256) * 8 * 6) as f64
            } else {
                0.0
            };
            assert_eq!(num(r, "accelerator_ops"), want, "{r}");
            assert!(num(r, "modeled_p50_us") > 0.5, "{r}");
            eprintln!("{r}");
        }
    }
    // The members' libraries reported them to their daemons: the node's metrics count
    // both paths (exanet_ni_collectives_total; here through the status they come from).
    let (ok, out, err) = rack::run(rack.exactl(&["status", "--json"]), Duration::from_secs(30));
    assert!(ok, "status: {err}");
    let status: Value = serde_json::from_str(&out).unwrap();
    let node = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "M1QAF1")
        .unwrap();
    // Three sizes, five measured runs and one warm-up each; in software also the
    // allreduce of the members' clocks after each size's warm-up, in both runs.
    for (path, n) in [("accelerator", 18.0), ("software", 18.0 + 6.0)] {
        let c = node["collectives"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == "allreduce" && c["path"] == path)
            .unwrap_or_else(|| panic!("no {path} allreduce reported: {node}"));
        assert_eq!(
            (num(c, "started"), num(c, "completed"), num(c, "failed")),
            (n, n, 0.0),
            "{c}"
        );
    }
    // Integers and min: the software path takes any group (here one QFDB plus one node).
    let rows = client(
        &rack,
        "M1QAF1",
        &[
            "allreduce",
            "--members",
            "M1QAF1,M1QAF2,M1QAF3,M1QAF4,M1QBF2",
            "--sizes",
            "24",
            "--op",
            "min",
            "--type",
            "i32",
            "--iterations",
            "3",
            "--json",
        ],
    );
    assert_eq!(rows[0]["verified"], Value::Bool(true), "{rows:?}");
    // 5 members, 3 measured runs and the default 10 warm-up runs.
    assert_eq!(num(&rows[0], "verified_results"), 65.0, "{rows:?}");
    assert_eq!(num(&rows[0], "accelerator_ops"), 0.0);
    let rows = run(&["bcast", "--sizes", "1,300", "--root", "5"]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r["verified"] == Value::Bool(true) && num(r, "verified_results") == 48.0),
        "{rows:?}"
    );
    let rows = run(&["barrier"]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(num(&rows[0], "p50_us") > 0.0);
    // A barrier has no result to compare: it does not claim to be verified.
    assert_eq!(
        (num(&rows[0], "verified_results"), &rows[0]["verified"]),
        (0.0, &Value::Bool(false)),
        "{rows:?}"
    );
    // 1% loss and 0.1% corruption on the torus link between the QFDBs (both directions):
    // both paths still give every member the right result (exanet-perf checks them).
    rack.link_set("M1QAF1", "M1QBF1", &["--loss", "1%", "--corrupt", "0.1%"]);
    for accel in ["on", "off"] {
        let rows = run(&["allreduce", "--sizes", "256,1K", "--accel", accel]);
        assert_eq!(rows.len(), 2, "{rows:?}");
        for r in &rows {
            assert_eq!(r["verified"], Value::Bool(true), "{r}");
            assert_eq!(num(r, "verified_results"), 48.0, "{r}");
        }
    }
    // The accelerator refuses a group it cannot take, with the reason.
    let (ok, _, err) = rack::run(
        {
            let mut c = rack.workload(&perf(), "M1QAF1");
            c.args([
                "allreduce",
                "--members",
                "M1QAF1,M1QAF2,M1QAF3",
                "--sizes",
                "8",
                "--accel",
                "on",
                "--iterations",
                "1",
            ]);
            c
        },
        Duration::from_secs(60),
    );
    assert!(!ok && err.contains("whole QFDBs"), "{err}");
}
