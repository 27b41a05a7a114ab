//! Modeled figures of a program do not depend on what ran before it on the same nodes
//! (issue 26, "Isolation"): the same RDMA flow, measured in modeled time by fresh
//! processes on one rack, before and after other programs drove the same link and the
//! same NIs (a heavier flow through the link, thousands of small messages between the
//! flow's own nodes, a program whose clock leaps to the end of modeled time, and one that
//! stays attached to the same nodes, sending now and then, while the flow runs again),
//! models the same time.
//!
//! The defect this catches: each process's clock started at zero, in the busy past of
//! every program before it, so the same flows through a link modeled 9.06 Gb/s on a fresh
//! rack, then 2.37, then 1.83 (with clocks from zero this test fails: 7.56 ms, then 30.3
//! and 53.0 ms). Another defect found the same way, a timeline that forgot a reservation
//! earlier than all it remembered, is the unit test
//! `a_stream_before_everything_remembered_is_still_serialised` in exanet-proto's model:
//! with clocks that start after the past, no program here reserves before it.
//!
//! Needs `exactl` and `exanetd` built with the same profile.

use std::time::Duration;

use exanet_tests::{pattern, TestRack};

/// The measured flow: rounds of one 1 MiB RDMA write, each waited for.
const ROUNDS: u64 = 8;
const LEN: u64 = 1 << 20;
const WAIT: Option<Duration> = Some(Duration::from_secs(60));

/// A program: `rounds` RDMA writes of `len` bytes from `src` to `dst`, each verified;
/// returns the modeled time they took, picoseconds. Its processes end with it.
fn rdma_program(rack: &TestRack, src: &str, dst: &str, rounds: u64, len: u64) -> u64 {
    let (a, b) = (rack.attach_unscaled(src), rack.attach_unscaled(dst));
    let from = a.register(len).unwrap();
    let to = b.register(len).unwrap();
    let page = a.rdma_page().unwrap();
    let start = a.clock();
    for round in 0..rounds {
        let data = pattern(round, len as usize);
        from.write(0, &data).unwrap();
        let tag = page
            .write(0, &from, 0, to.gvas(0).unwrap(), len, None)
            .unwrap();
        a.wait(tag, WAIT)
            .unwrap_or_else(|e| panic!("{src} -> {dst} round {round}: {e}"));
        assert!(to.to_vec(0, len).unwrap() == data, "round {round} corrupt");
    }
    a.clock().since(start)
}

/// A hostile program: its clock leaps as far as a clock goes, then it writes through the
/// same link (the NI takes its commands at most a day of modeled time ahead of its
/// rank's clock, and counts them).
fn hostile_program(rack: &TestRack, src: &str, dst: &str) {
    let (a, b) = (rack.attach_unscaled(src), rack.attach_unscaled(dst));
    let from = a.register(LEN).unwrap();
    let to = b.register(LEN).unwrap();
    let page = a.rdma_page().unwrap();
    a.advance_clock(exanet::ModelTime(u64::MAX / 2));
    let tag = page
        .write(0, &from, 0, to.gvas(0).unwrap(), LEN, None)
        .unwrap();
    a.wait(tag, WAIT).unwrap();
}

/// A program of `n` small messages from `src` to `dst`, each ACKed: thousands of
/// separate busy intervals on every resource of the path.
fn message_program(rack: &TestRack, src: &str, dst: &str, n: u64) {
    let (a, b) = (rack.attach_unscaled(src), rack.attach_unscaled(dst));
    let inbox = b.mailbox(1024).unwrap();
    let addr = a.mailbox_addr(b.node_id(), b.rank(), inbox.vi()).unwrap();
    let tx = a.packetizer().unwrap();
    for i in 0..n {
        let tag = tx.send(0, addr, &i.to_le_bytes()).unwrap();
        a.wait(tag, WAIT).unwrap();
        // Keep the mailbox from filling: take what has come.
        while inbox.try_recv().unwrap().is_some() {}
    }
}

#[test]
fn a_program_models_the_same_time_whatever_ran_before_it() {
    let rack = TestRack::new("isolation");
    // Two QFDBs: M1QAF1 -> M1QBF1 is the torus link between them, which M1QAF2 -> M1QBF2
    // crosses too (dimension-order routing goes through the F1s).
    let r = rack.up("2x1x1", 60);
    assert!(r.success(), "rack up: {}", r.describe());

    let fresh = rdma_program(&rack, "M1QAF1", "M1QBF1", ROUNDS, LEN);
    assert!(fresh > 0);
    let mut after = Vec::new();
    for _ in 0..2 {
        // Another program: a heavier flow through the same link.
        rdma_program(&rack, "M1QAF2", "M1QBF2", 2 * ROUNDS, LEN);
        after.push(rdma_program(&rack, "M1QAF1", "M1QBF1", ROUNDS, LEN));
    }
    // And 5000 messages between the measured flow's own nodes: more busy intervals than a
    // resource remembers.
    message_program(&rack, "M1QAF1", "M1QBF1", 5000);
    after.push(rdma_program(&rack, "M1QAF1", "M1QBF1", ROUNDS, LEN));
    hostile_program(&rack, "M1QAF1", "M1QBF1");
    after.push(rdma_program(&rack, "M1QAF1", "M1QBF1", ROUNDS, LEN));
    // A long-lived program on the same two nodes, attached throughout and sending a
    // message now and then on the same link, beside the measured flow.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (a, b) = (
                rack.attach_unscaled("M1QAF1"),
                rack.attach_unscaled("M1QBF1"),
            );
            let inbox = b.mailbox(64).unwrap();
            let addr = a.mailbox_addr(b.node_id(), b.rank(), inbox.vi()).unwrap();
            let tx = a.packetizer().unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let tag = tx.send(0, addr, b"beside").unwrap();
                a.wait(tag, WAIT).unwrap();
                while inbox.try_recv().unwrap().is_some() {}
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        after.push(rdma_program(&rack, "M1QAF1", "M1QBF1", ROUNDS, LEN));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    for t in &after {
        let off = (*t as f64 - fresh as f64).abs() / fresh as f64;
        assert!(
            off < 0.005,
            "{ROUNDS} writes of {LEN} B modeled {fresh} ps on a fresh rack, {after:?} ps \
             after other programs"
        );
    }
    let down = rack.down().unwrap_or_else(|e| panic!("{e}"));
    assert!(down.success(), "rack down: {}", down.describe());
}
