//! Round trip of an 8-byte message from a workload to its own mailbox through its node's
//! daemon: packetizer -> switch -> NI -> mailbox ring, and the ACK back. Measures the
//! shared-memory path alone, with no link in between.
//!
//! `EXANET_RACK=DIR EXANET_NODE=M1QAF1 cargo run --release -p exanet --example self_rtt [N]`

use std::time::{Duration, Instant};

fn main() -> Result<(), exanet::Error> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let ep = exanet::Endpoint::attach()?;
    let mbox = ep.mailbox(64)?;
    let tx = ep.packetizer()?;
    let me = mbox.addr();
    let t = Some(Duration::from_secs(5));
    let mut rtts = Vec::with_capacity(n);
    for i in 0..n + 1000 {
        let t0 = Instant::now();
        let tag = tx.send(0, me, &(i as u64).to_be_bytes())?;
        let m = mbox.recv(t)?;
        ep.wait(tag, t)?;
        let rtt = t0.elapsed();
        assert_eq!(m.payload, (i as u64).to_be_bytes(), "message out of order");
        if i >= 1000 {
            rtts.push(rtt.as_secs_f64() * 1e6);
        }
    }
    rtts.sort_by(f64::total_cmp);
    let p = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    println!(
        "self mailbox, 8 B: round trip p50 {:.2} us, p99 {:.2} us, min {:.2} us ({} messages, node {}, rank {})",
        p(0.5),
        p(0.99),
        rtts[0],
        n,
        ep.node(),
        ep.rank()
    );
    Ok(())
}
