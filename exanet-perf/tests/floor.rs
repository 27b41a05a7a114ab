//! `exanet-perf floor`: QUIC alone, in one process, no rack. What it reports must be what
//! happened (every frame received and counted, latencies ordered), whatever the machine's
//! speed: nothing here is timed.

use std::process::{Command, Output};

use serde_json::Value;

fn floor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_exanet-perf"))
        .arg("floor")
        .args(args)
        .output()
        .expect("run exanet-perf floor")
}

/// Runs `floor --json` with `args`; its stdout lines by `bench`.
fn floor_json(args: &[&str]) -> (Value, Value) {
    let out = floor(&[&["--json", "--quiet", "--timeout-ms", "120000"], args].concat());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "exanet-perf floor {args:?} failed:\n{stdout}\n{stderr}"
    );
    assert!(stderr.is_empty(), "--quiet, yet stderr says:\n{stderr}");
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(rows.len(), 2, "two JSON objects expected:\n{stdout}");
    let by = |bench: &str| {
        rows.iter()
            .find(|r| r["bench"] == bench)
            .unwrap_or_else(|| panic!("no {bench} row in:\n{stdout}"))
            .clone()
    };
    (by("floor-pingpong"), by("floor-stream"))
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

#[test]
fn the_floor_reports_latency_and_a_fully_received_frame_stream() {
    let (ping, stream) =
        floor_json(&["--iterations", "300", "--warmup", "20", "--frames", "20000"]);

    assert_eq!(ping["size"], 8, "{ping}");
    assert_eq!(ping["iterations"], 300, "{ping}");
    assert_eq!(ping["one_way"], true, "{ping}");
    let (min, p50, max) = (
        num(&ping, "min_us"),
        num(&ping, "p50_us"),
        num(&ping, "max_us"),
    );
    assert!(min > 0.0, "one-way latency must be positive: {ping}");
    assert!(min <= p50 && p50 <= max, "min <= p50 <= max: {ping}");

    assert_eq!(stream["frame"], 256, "{stream}");
    assert_eq!(stream["frames"], 20000, "{stream}");
    assert_eq!(stream["bytes_sent"], 20000 * 256, "{stream}");
    assert_eq!(stream["bytes_received"], 20000 * 256, "{stream}");
    assert_eq!(stream["frames_verified"], 20000, "{stream}");
    assert!(num(&stream, "gbps") > 0.0, "{stream}");
    assert!(num(&stream, "frames_per_s") > 0.0, "{stream}");
    assert!(num(&stream, "seconds") > 0.0, "{stream}");
    // The link settings' MTU discovery: at least QUIC's minimum datagram.
    assert!(num(&stream, "path_mtu") >= 1200.0, "{stream}");
}

#[test]
fn odd_sizes_and_a_partial_last_batch_arrive_whole() {
    // 1001 frames in writes of 7: the last write carries 0 < n < 7 frames.
    let (ping, stream) = floor_json(&[
        "--size",
        "3000",
        "--iterations",
        "50",
        "--warmup",
        "0",
        "--frame",
        "24",
        "--batch",
        "7",
        "--frames",
        "1001",
    ]);
    assert_eq!(ping["size"], 3000, "{ping}");
    assert_eq!(ping["iterations"], 50, "{ping}");
    assert!(num(&ping, "min_us") > 0.0, "{ping}");
    assert_eq!(stream["batch"], 7, "{stream}");
    assert_eq!(stream["bytes_received"], 1001 * 24, "{stream}");
    assert_eq!(stream["frames_verified"], 1001, "{stream}");
    assert!(num(&stream, "gbps") > 0.0, "{stream}");
}

#[test]
fn the_text_output_says_what_was_measured() {
    let out = floor(&["--quiet", "--iterations", "20", "--frames", "500"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ping-pong 8 B, 20 round trips: one-way"),
        "{stdout}"
    );
    assert!(stdout.contains("frame stream, 256 B frames"), "{stdout}");
    assert!(
        stdout.contains("received 128000 bytes = 500 frames x 256 B"),
        "{stdout}"
    );
}

#[test]
fn bad_arguments_are_refused_with_a_reason_not_a_panic() {
    for (args, says) in [
        (&["--frame", "4"][..], "--frame"),
        (&["--size", "0"][..], "--size"),
        (&["--batch", "0"][..], "--batch"),
        (&["--frame", "12Q"][..], "unknown unit"),
        (
            &["--frames", "10", "--duration-ms", "10"][..],
            "cannot be used with",
        ),
    ] {
        let out = floor(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
