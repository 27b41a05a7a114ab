//! Packetizer -> mailbox ping-pong between two nodes (the Rust twin of `pingpong.c`; the
//! two interoperate).
//!
//! ```text
//! EXANET_RACK=/tmp/rack EXANET_NODE=M1QBF3 cargo run --example pingpong -- serve [COUNT]
//! EXANET_RACK=/tmp/rack EXANET_NODE=M1QAF2 cargo run --example pingpong -- run PEER[:RANK] VI [COUNT]
//! ```
//!
//! `serve` opens a mailbox, prints `ready node=NODE rank=R mailbox=VI` and echoes COUNT
//! messages (default 1000) to their senders. `run` sends COUNT messages of 1..64 bytes to
//! mailbox VI of the peer, checks every echo and prints the one-way latency. The first
//! byte of every message is the sender's mailbox: where the echo goes.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use exanet::{Endpoint, Error, NackReason, OpError};

const WAIT: Option<Duration> = Some(Duration::from_secs(5));

fn serve(ep: &Endpoint, count: u64) -> Result<(), Error> {
    let mb = ep.mailbox(64)?;
    let tx = ep.packetizer()?;
    println!(
        "ready node={} rank={} mailbox={}",
        ep.node(),
        ep.rank(),
        mb.vi()
    );
    let mut served = 0;
    while served < count {
        let m = mb.recv(Some(Duration::from_secs(30)))?;
        let Some(&back_vi) = m.payload.first() else {
            continue;
        };
        let back = ep.mailbox_addr(m.src_node, m.src_rank, back_vi)?;
        let tag = tx.send_any(back, &m.payload)?;
        ep.wait(tag, WAIT)?;
        served += 1;
    }
    println!("served {count} messages");
    Ok(())
}

fn run(ep: &Endpoint, peer: &str, vi: u8, count: u64) -> Result<(), Error> {
    let (name, rank) = match peer.split_once(':') {
        Some((n, r)) => (n, r.parse().map_err(|_| Error::BadRank(u8::MAX))?),
        None => (peer, 0),
    };
    let node = ep.node_by_name(name)?;
    let dst = ep.mailbox_addr(node, rank, vi)?;
    let mb = ep.mailbox(64)?;
    let tx = ep.packetizer()?;
    let (mut best, mut total) = (Duration::MAX, Duration::ZERO);
    for i in 0..count {
        let len = 1 + (i % 64) as usize;
        let mut buf = vec![mb.vi(); len];
        for (k, b) in buf.iter_mut().enumerate().skip(1) {
            *b = (i as u8).wrapping_mul(31).wrapping_add(k as u8);
        }
        let mut t0 = Instant::now();
        loop {
            let tag = tx.send(0, dst, &buf)?;
            match ep.wait(tag, WAIT) {
                // The server may not be up yet.
                Err(Error::Op {
                    error:
                        OpError::Nacked {
                            reason: Some(NackReason::NoContext),
                            ..
                        },
                    ..
                }) if i == 0 => {
                    std::thread::sleep(Duration::from_millis(50));
                    t0 = Instant::now();
                }
                r => break r?,
            }
        }
        let m = mb.recv(WAIT)?;
        let one_way = t0.elapsed() / 2;
        if m.payload != buf || m.src_node != node || m.src_rank != rank {
            eprintln!("pingpong: bad echo {i}: {m:?}");
            return Err(Error::Protocol("bad echo".into()));
        }
        best = best.min(one_way);
        total += one_way;
    }
    println!(
        "pingpong: {count} messages to {peer}, one-way min {:.1} us, mean {:.1} us",
        best.as_secs_f64() * 1e6,
        total.as_secs_f64() * 1e6 / count.max(1) as f64
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        eprintln!("usage: pingpong serve [COUNT] | pingpong run PEER[:RANK] VI [COUNT]");
        ExitCode::from(2)
    };
    let num = |s: Option<&String>, d: u64| s.map_or(Some(d), |s| s.parse().ok());
    let ep = match Endpoint::attach() {
        Ok(ep) => ep,
        Err(e) => {
            eprintln!("pingpong: attach: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match args.first().map(String::as_str) {
        Some("serve") => match num(args.get(1), 1000) {
            Some(n) => serve(&ep, n),
            None => return usage(),
        },
        Some("run") if args.len() >= 3 => {
            match (args[2].parse::<u8>().ok(), num(args.get(3), 1000)) {
                (Some(vi), Some(n)) => run(&ep, &args[1], vi, n),
                _ => return usage(),
            }
        }
        _ => return usage(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}
