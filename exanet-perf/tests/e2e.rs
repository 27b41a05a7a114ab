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
    let (ok, out, err) = rack::run(
        {
            let mut c = rack.workload(&perf(), node);
            c.args(args);
            c
        },
        Duration::from_secs(300),
    );
    assert!(ok, "exanet-perf {args:?} failed:\n{out}\n{err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn num(v: &Value, k: &str) -> f64 {
    v.get(k)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number {k} in {v}"))
}

#[test]
fn pingpong_and_rdma_pairs_report_json() {
    let rack = Rack::up("perf", "2x1x1");
    let (srv, ready) = server(&rack, "M1QBF3", 5);
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
        eprintln!("{r}");
    }

    for op in ["write", "read"] {
        let rows = client(
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
                "--verify",
                "--json",
            ],
        );
        assert_eq!(rows.len(), 3, "{rows:?}");
        for r in &rows {
            assert_eq!(r["verified"], Value::Bool(true));
            assert_eq!(r["op"], op);
            assert!(num(r, "gbps") > 0.0, "{r}");
            eprintln!("{r}");
        }
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
            assert_eq!(num(r, "window"), 4.0);
            assert!(num(r, "gbps") > 0.0, "{r}");
            assert!(num(r, "p99_us") >= num(r, "p50_us"));
            eprintln!("{r}");
        }
    }
    // Five sessions ended: the server exits on its own.
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
