//! Cells in modeled order on a rack of daemons (`[model] order = "modeled"`, issue 26):
//! two RDMA flows that share a torus link, started together in modeled time, model the
//! same times run after run on one rack (within the 0.5%), whatever the host
//! did; the daemons take cuts of the rack to know what may still come
//! (docs/modeled-time.md).
//!
//! Needs `exactl` and `exanetd` built with the same profile.

use std::time::Duration;

use exanet::Endpoint;
use exanet_tests::{pattern, TestRack};

const LEN: u64 = 64 << 10;
const WAIT: Option<Duration> = Some(Duration::from_secs(120));

/// Two writes of `LEN` through the torus link M1QAF1 -> M1QBF1, one from M1QAF1 and one
/// from M1QAF2, from clocks set to the same modeled time: each flow's modeled duration,
/// picoseconds, and the data checked.
fn shared_link(rack: &TestRack) -> Vec<u64> {
    let flows = [("M1QAF1", "M1QBF1"), ("M1QAF2", "M1QBF2")];
    let ends: Vec<(Endpoint, Endpoint)> = flows
        .iter()
        .map(|(a, b)| (rack.attach_unscaled(a), rack.attach_unscaled(b)))
        .collect();
    // Start together: the latest clock of the senders, and a microsecond.
    let start = ends.iter().map(|(a, _)| a.clock()).max().unwrap() + 1_000_000;
    // Everything set up first, then the two posts back to back: a program that gives no
    // command for 2 ms while the rack has work is no longer waited for
    // (`workload::SILENT_NS`), and its post would then come late, out of order.
    let mut set = Vec::new();
    for (i, (a, b)) in ends.iter().enumerate() {
        let from = a.register(LEN).unwrap();
        let to = b.register(LEN).unwrap();
        from.write(0, &pattern(i as u64, LEN as usize)).unwrap();
        let page = a.rdma_page().unwrap();
        a.advance_clock(start);
        set.push((from, to, page));
    }
    let mut posted = Vec::new();
    for (from, to, page) in set {
        let tag = page
            .write(0, &from, 0, to.gvas(0).unwrap(), LEN, None)
            .unwrap();
        posted.push((tag, to, page, from));
    }
    let mut took = Vec::new();
    for (i, ((a, _), (tag, to, _, _))) in ends.iter().zip(&posted).enumerate() {
        a.wait(*tag, WAIT)
            .unwrap_or_else(|e| panic!("flow {i}: {e}\n{}", rack.log_tails(20)));
        assert!(
            to.to_vec(0, LEN).unwrap() == pattern(i as u64, LEN as usize),
            "flow {i} corrupt"
        );
        took.push(a.clock().since(start));
    }
    took
}

#[test]
fn contended_flows_model_the_same_times_run_after_run() {
    let rack = TestRack::new("order");
    let r = rack.exactl_timeout(
        &["rack", "up", "--shape", "2x1x1", "--ip", "off"],
        Duration::from_secs(90),
    );
    assert!(r.success(), "rack up: {}", r.describe());
    assert!(rack.down().is_ok_and(|r| r.success()));
    let file = rack.dir.join("rack.toml");
    let mut toml = std::fs::read_to_string(&file).unwrap();
    toml.push_str("\n[model]\norder = \"modeled\"\n");
    std::fs::write(&file, toml).unwrap();
    let r = rack.exactl_timeout(&["rack", "up", "--ip", "off"], Duration::from_secs(90));
    assert!(r.success(), "rack up in modeled order: {}", r.describe());

    let first = shared_link(&rack);
    eprintln!("two 64 KiB writes through one torus link: {first:?} ps");
    // A 64 KiB write alone over a 10 Gb/s torus link takes at least 59 us of modeled
    // time (288 B cells of 256 B at 10 Gb/s); sharing the link, at least one takes more.
    assert!(first.iter().all(|&t| t > 59_000_000), "{first:?} ps");
    assert!(
        first.iter().any(|&t| t > 70_000_000),
        "no contention: {first:?} ps"
    );
    // The bound on repeatability: a spread under 0.5% of each figure. Release
    // builds repeat to the picosecond; a debug build's slower daemons have moved the flow
    // from the F1 by one or two cell times (0.2-0.4%), which a path still ordered by real
    // time must explain (docs/modeled-time.md, "What is not done").
    let mut runs = vec![first.clone()];
    for _ in 1..3 {
        runs.push(shared_link(&rack));
    }
    for f in 0..first.len() {
        let (lo, hi) = runs
            .iter()
            .map(|r| r[f])
            .fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        assert!(
            (hi - lo) as f64 / lo as f64 <= 0.005,
            "flow {f}: modeled durations {runs:?} ps spread over 0.5%"
        );
    }
    let r = rack.down().expect("rack down");
    assert!(r.success(), "rack down: {}", r.describe());
}
