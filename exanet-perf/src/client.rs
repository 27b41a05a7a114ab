//! `exanet-perf <bench> run`: the measuring side (crate docs).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use exanet::ModelTime;
use exanet::{Endpoint, Error, Gvas, Mailbox, MemoryRegion, NodeId, Packetizer, RdmaPage, Tag};
use serde_json::json;

use crate::progress::Progress;
use crate::stats::{summarize, summarize_us, Row};
use crate::wire::{self, Msg};

pub struct Options {
    pub peer: (String, u8),
    pub peer_mailbox: u8,
    pub iterations: Option<u64>,
    pub warmup: Option<u64>,
    pub json: bool,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// No plan and no progress on stderr.
    pub quiet: bool,
    /// How often progress is shown on stderr.
    pub progress: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    Write,
    Read,
}

pub struct RdmaOptions {
    pub common: Options,
    pub sizes: Vec<u64>,
    pub op: Op,
    pub verify: bool,
    pub notify: bool,
    /// `Some`: bandwidth mode with that many transfers in flight.
    pub window: Option<u8>,
}

/// An open session with a server.
struct Conn<'a> {
    ep: &'a Endpoint,
    mbox: Mailbox,
    tx: Packetizer,
    server: (NodeId, u8),
    server_name: String,
    ctrl: Gvas,
    data: Gvas,
    buf_va: u64,
    buf_len: u64,
    notify_va: u64,
    timeout: Duration,
}

impl<'a> Conn<'a> {
    fn open(ep: &'a Endpoint, o: &Options, bench: u8, buffer: u64) -> Result<Conn<'a>, String> {
        let (name, rank) = &o.peer;
        let node = ep.node_by_name(name).map_err(|e| e.to_string())?;
        let ctrl = ep
            .mailbox_addr(node, *rank, o.peer_mailbox)
            .map_err(|e| e.to_string())?;
        let mbox = ep.mailbox(64).map_err(|e| format!("mailbox: {e}"))?;
        let tx = ep.packetizer().map_err(|e| format!("packetizer: {e}"))?;
        let server_name = format!("{name}:{rank} mailbox {}", o.peer_mailbox);
        let hello = Msg::Hello {
            bench,
            client_vi: mbox.vi(),
            buffer,
        }
        .encode();
        // Say hello until the server's mailbox takes it.
        let deadline = Instant::now() + o.connect_timeout;
        loop {
            let tag = tx.send(0, ctrl, &hello).map_err(|e| e.to_string())?;
            match ep.wait(tag, Some(o.timeout)) {
                Ok(()) => break,
                Err(Error::Op { error, .. }) if error.transient() => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "no server at {server_name} (last answer: {error}); is \
                             `exanet-perf ... serve` running there?"
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(format!("hello to {server_name}: {e}")),
            }
        }
        let mut c = Conn {
            ep,
            mbox,
            tx,
            server: (node, *rank),
            server_name,
            ctrl,
            data: ctrl,
            buf_va: 0,
            buf_len: 0,
            notify_va: 0,
            timeout: o.timeout,
        };
        match c.reply()? {
            Msg::Welcome {
                status: wire::ST_OK,
                data_vi,
                buf_va,
                buf_len,
                notify_va,
            } => {
                c.data = ep
                    .mailbox_addr(node, *rank, data_vi)
                    .map_err(|e| e.to_string())?;
                c.buf_va = buf_va;
                c.buf_len = buf_len;
                c.notify_va = notify_va;
                if buf_len < buffer {
                    return Err(format!(
                        "the server gave {buf_len} B of buffer, {buffer} B were asked for"
                    ));
                }
                Ok(c)
            }
            Msg::Welcome {
                status: wire::ST_TOO_BIG,
                buf_len,
                ..
            } => Err(format!(
                "the server allows buffers of {buf_len} B at most, {buffer} B needed \
                 (smaller --sizes or --window, or serve --max-buffer)"
            )),
            other => Err(format!("the server refused the session: {other:?}")),
        }
    }

    /// The next protocol message from the server (anything else is skipped).
    fn reply(&self) -> Result<Msg, String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = self.mbox.recv(Some(left)).map_err(|e| match e {
                Error::Timeout => format!(
                    "no answer from {} within {} ms",
                    self.server_name,
                    self.timeout.as_millis()
                ),
                e => e.to_string(),
            })?;
            if (m.src_node, m.src_rank) != self.server {
                continue;
            }
            if let Some(msg) = Msg::decode(&m.payload) {
                return Ok(msg);
            }
        }
    }

    fn send_ctrl(&self, m: Msg) -> Result<(), String> {
        let tag = self
            .tx
            .send_any(self.ctrl, &m.encode())
            .map_err(|e| e.to_string())?;
        self.ep
            .wait(tag, Some(self.timeout))
            .map_err(|e| format!("{m:?} to {}: {e}", self.server_name))
    }

    /// Asks the server to fill or check its buffer; `Err` on a mismatch.
    fn verify_remote(&self, m: Msg) -> Result<(), String> {
        self.send_ctrl(m)?;
        match self.reply()? {
            Msg::Done {
                status: wire::ST_OK,
                ..
            } => Ok(()),
            Msg::Done {
                status: wire::ST_MISMATCH,
                detail,
            } => Err(format!(
                "verification failed: {m:?}: first bad byte at offset {detail}"
            )),
            other => Err(format!("{m:?}: the server answered {other:?}")),
        }
    }

    fn bye(&self) {
        if let Err(e) = self.send_ctrl(Msg::Bye) {
            eprintln!("exanet-perf: {e}");
        }
    }
}

pub fn pingpong(ep: &Endpoint, o: &Options, sizes: &[u64]) -> Result<(), String> {
    if let Some(&s) = sizes.iter().find(|&&s| s > exanet::MAX_MESSAGE as u64) {
        return Err(format!(
            "size {s}: a packetizer message carries {} bytes at most",
            exanet::MAX_MESSAGE
        ));
    }
    let iterations = o.iterations.unwrap_or(10_000);
    let warmup = o.warmup.unwrap_or((iterations / 10).clamp(1, 1000));
    let mut progress = Progress::new(o.quiet, o.progress);
    progress.say(&format!(
        "pingpong with {}:{} mailbox {}: sizes {} B, {iterations} round trips each (+{warmup} \
         warmup), every echo compared with what was sent",
        o.peer.0,
        o.peer.1,
        o.peer_mailbox,
        list(sizes)
    ));
    let c = Conn::open(ep, o, wire::BENCH_PINGPONG, 0)?;
    let r = pingpong_sizes(&c, o, sizes, iterations, warmup, &mut progress);
    c.bye();
    r
}

/// `0, 8, 64`.
fn list(sizes: &[u64]) -> String {
    sizes
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn pingpong_sizes(
    c: &Conn<'_>,
    o: &Options,
    sizes: &[u64],
    iterations: u64,
    warmup: u64,
    progress: &mut Progress,
) -> Result<(), String> {
    let mut header = false;
    for &size in sizes {
        let mut payload = vec![0u8; size as usize];
        let mut samples = Vec::with_capacity(iterations as usize);
        let mut modeled = Vec::with_capacity(iterations as usize);
        for i in 0..warmup + iterations {
            // A distinct payload per iteration, so a stale echo is caught.
            let stamp = i.to_be_bytes();
            for (k, b) in payload.iter_mut().enumerate() {
                *b = stamp[7 - k % 8] ^ (k as u8);
            }
            let t0 = Instant::now();
            let m0 = c.ep.clock();
            let tag =
                c.tx.send_any(c.data, &payload)
                    .map_err(|e| format!("ping: {e}"))?;
            let m = c.mbox.recv(Some(o.timeout)).map_err(|e| match e {
                Error::Timeout => format!(
                    "no echo from {} within {} ms (size {size}, iteration {i})",
                    c.server_name,
                    o.timeout.as_millis()
                ),
                e => format!("echo: {e}"),
            })?;
            let rtt = t0.elapsed();
            let modeled_rtt = us_between(m0, c.ep.clock());
            c.ep.wait(tag, Some(o.timeout))
                .map_err(|e| format!("ping {i}: {e}"))?;
            if (m.src_node, m.src_rank) != c.server || m.payload != payload {
                return Err(format!(
                    "bad echo at size {size}, iteration {i}: {} B from {}:{}",
                    m.payload.len(),
                    m.src_node,
                    m.src_rank
                ));
            }
            if i >= warmup {
                samples.push(rtt / 2);
                modeled.push(modeled_rtt / 2.0);
            }
            progress.tick(|| {
                format!(
                    "pingpong {size} B: {}/{} round trips",
                    i + 1,
                    warmup + iterations
                )
            });
        }
        progress.clear();
        Row {
            bench: "pingpong",
            size,
            summary: summarize(&samples),
            gbps: None,
            modeled: Some(summarize_us(modeled)),
            modeled_gbps: None,
            extra: vec![("peer", json!(c.server_name)), ("one_way", json!(true))],
        }
        .print(o.json, &mut header);
    }
    Ok(())
}

pub fn rdma(ep: &Endpoint, o: &RdmaOptions) -> Result<(), String> {
    let Some(&max) = o.sizes.iter().max() else {
        return Err("no sizes".into());
    };
    if let Some(&s) = o
        .sizes
        .iter()
        .find(|&&s| s == 0 || s > exanet::MAX_TRANSFER)
    {
        return Err(format!("size {s}: a transfer is 1 byte to 4 GiB"));
    }
    let window = u64::from(o.window.unwrap_or(1));
    let buffer = max.checked_mul(window).ok_or("sizes x window overflow")?;
    let counts = Counts::of(o);
    let mut progress = Progress::new(o.common.quiet, o.common.progress);
    progress.say(&plan(o, &counts));
    let c = Conn::open(ep, &o.common, wire::BENCH_RDMA, buffer)?;
    let r = (|| {
        let local = ep
            .register(buffer)
            .map_err(|e| format!("registering {buffer} B: {e}"))?;
        let page = ep.rdma_page().map_err(|e| format!("RDMA page: {e}"))?;
        let mut header = false;
        let mut verified = Vec::new();
        for &size in &o.sizes {
            let (row, n) = match o.window {
                None => rdma_lat(&c, o, &page, &local, size, &counts, &mut progress)?,
                Some(_) => rdma_bw(&c, o, &page, &local, size, &counts, &mut progress)?,
            };
            progress.clear();
            row.print(o.common.json, &mut header);
            verified.push((size, n));
        }
        if o.verify {
            let line = verified_line(&verified, o.window);
            if o.common.json {
                progress.say(&line);
            } else {
                println!("{line}");
            }
        }
        Ok(())
    })();
    c.bye();
    r
}

/// Transfers per size: measured and warmup.
struct Counts {
    iterations: u64,
    warmup: u64,
}

impl Counts {
    fn of(o: &RdmaOptions) -> Counts {
        match o.window {
            None => {
                let iterations = o.common.iterations.unwrap_or(100);
                let warmup = o.common.warmup.unwrap_or((iterations / 10).clamp(1, 10));
                Counts { iterations, warmup }
            }
            Some(w) => Counts {
                iterations: o.common.iterations.unwrap_or(64),
                warmup: o.common.warmup.unwrap_or(u64::from(w)),
            },
        }
    }
}

/// What an RDMA run will do, said before it starts.
fn plan(o: &RdmaOptions, n: &Counts) -> String {
    let (bench, pace) = match o.window {
        None => ("rdma-lat", "one at a time".to_string()),
        Some(w) => ("rdma-bw", format!("{w} in flight")),
    };
    let verify = match (o.verify, o.window) {
        (false, _) => "not verified (--verify compares the bytes)".to_string(),
        (true, None) => "every transfer compared byte for byte (not timed)".to_string(),
        (true, Some(w)) => format!(
            "after each size, the last transfer into each of the {w} slots compared byte \
             for byte (not timed)"
        ),
    };
    format!(
        "{bench} {} with {}:{} mailbox {}: sizes {} B, {} transfers each (+{} warmup), {pace}{}; {verify}",
        format!("{:?}", o.op).to_lowercase(),
        o.common.peer.0,
        o.common.peer.1,
        o.common.peer_mailbox,
        list(&o.sizes),
        n.iterations,
        n.warmup,
        if o.notify { ", with notifications" } else { "" },
    )
}

/// "verified N transfers byte for byte (SIZE B: n, ...)".
fn verified_line(per_size: &[(u64, u64)], window: Option<u8>) -> String {
    let total: u64 = per_size.iter().map(|&(_, n)| n).sum();
    let sizes: Vec<String> = per_size
        .iter()
        .map(|(size, n)| format!("{size} B: {n}"))
        .collect();
    format!(
        "verified {total} transfer{} byte for byte ({}){}",
        if total == 1 { "" } else { "s" },
        sizes.join(", "),
        if window.is_some() {
            "; a bandwidth run compares the last transfer into each slot"
        } else {
            ""
        }
    )
}

fn post(
    c: &Conn<'_>,
    o: &RdmaOptions,
    page: &RdmaPage,
    local: &MemoryRegion,
    ch: u8,
    offset: u64,
    size: u64,
) -> Result<Tag, String> {
    let remote =
        c.ep.addr(c.server.0, c.server.1, c.buf_va + offset)
            .map_err(|e| e.to_string())?;
    let r = match o.op {
        Op::Write => page.write(
            ch,
            local,
            offset,
            remote,
            size,
            o.notify.then_some(c.notify_va),
        ),
        Op::Read => page.read(ch, remote, local, offset, size),
    };
    r.map_err(|e| format!("posting a {size} B {:?}: {e}", o.op))
}

/// Waits for a transfer; returns when it completed in modeled time.
fn wait(c: &Conn<'_>, tag: Tag, size: u64, o: &RdmaOptions) -> Result<ModelTime, String> {
    c.ep.wait_modeled(tag, Some(o.common.timeout))
        .map_err(|e| format!("{size} B {:?}: {e}", o.op))
}

/// Picoseconds from `a` to `b` in microseconds.
fn us_between(a: ModelTime, b: ModelTime) -> f64 {
    (b - a) as f64 / 1e6
}

fn fill_local(local: &MemoryRegion, offset: u64, size: u64, seed: u64) -> Result<(), String> {
    let mut v = vec![0u8; size as usize];
    wire::fill(&mut v, seed, 0);
    local.write(offset, &v).map_err(|e| e.to_string())
}

fn check_local(local: &MemoryRegion, offset: u64, size: u64, seed: u64) -> Result<(), String> {
    let v = local.to_vec(offset, size).map_err(|e| e.to_string())?;
    match wire::first_mismatch(&v, seed, 0) {
        None => Ok(()),
        Some(bad) => Err(format!(
            "verification failed: {size} B read, first bad byte at offset {bad}"
        )),
    }
}

fn seed_of(size: u64, i: u64) -> u64 {
    (size << 24) ^ i ^ 0x5EED
}

/// The fields of an RDMA row beyond the summary. `verified_transfers`: how many transfers
/// of this size were compared byte for byte (0 without `--verify`); `verified`: whether
/// any was (kept for scripts that read it; it no longer just echoes `--verify`).
fn extras(o: &RdmaOptions, c: &Conn<'_>, verified: u64) -> Vec<(&'static str, serde_json::Value)> {
    let mut v = vec![
        ("op", json!(format!("{:?}", o.op).to_lowercase())),
        ("peer", json!(c.server_name)),
        ("verified_transfers", json!(verified)),
        ("verified", json!(verified > 0)),
    ];
    if let Some(w) = o.window {
        v.push(("window", json!(w)));
    }
    v
}

/// One row of rdma-lat, and how many transfers were compared.
fn rdma_lat(
    c: &Conn<'_>,
    o: &RdmaOptions,
    page: &RdmaPage,
    local: &MemoryRegion,
    size: u64,
    n: &Counts,
    progress: &mut Progress,
) -> Result<(Row, u64), String> {
    let (iterations, warmup) = (n.iterations, n.warmup);
    let mut verified = 0u64;
    if o.op == Op::Write && !o.verify {
        fill_local(local, 0, size, seed_of(size, 0))?;
    }
    let mut samples = Vec::with_capacity(iterations as usize);
    let mut modeled = Vec::with_capacity(iterations as usize);
    for i in 0..warmup + iterations {
        let seed = seed_of(size, i);
        if o.verify {
            match o.op {
                Op::Write => fill_local(local, 0, size, seed)?,
                Op::Read => c.verify_remote(Msg::Fill {
                    seed,
                    offset: 0,
                    len: size,
                })?,
            }
        }
        let t0 = Instant::now();
        let m0 = c.ep.clock();
        let tag = post(c, o, page, local, 0, 0, size)?;
        let done = wait(c, tag, size, o)?;
        let t = t0.elapsed();
        if o.verify {
            match o.op {
                Op::Write => c.verify_remote(Msg::Check {
                    seed,
                    offset: 0,
                    len: size,
                })?,
                Op::Read => check_local(local, 0, size, seed)?,
            }
            verified += 1;
        }
        if i >= warmup {
            samples.push(t);
            modeled.push(us_between(m0, done));
        }
        progress.tick(|| {
            format!(
                "{size} B: {}/{} transfers{}",
                i + 1,
                warmup + iterations,
                if o.verify { ", each verified" } else { "" }
            )
        });
    }
    let summary = summarize(&samples);
    let gbps = (summary.p50 > 0.0).then(|| size as f64 * 8.0 / (summary.p50 * 1e3));
    let modeled = summarize_us(modeled);
    let modeled_gbps = (modeled.p50 > 0.0).then(|| size as f64 * 8.0 / (modeled.p50 * 1e3));
    let row = Row {
        bench: "rdma-lat",
        size,
        summary,
        gbps,
        modeled: Some(modeled),
        modeled_gbps,
        extra: extras(o, c, verified),
    };
    Ok((row, verified))
}

/// One row of rdma-bw (`o.window` transfers in flight), and how many transfers were
/// compared.
fn rdma_bw(
    c: &Conn<'_>,
    o: &RdmaOptions,
    page: &RdmaPage,
    local: &MemoryRegion,
    size: u64,
    n: &Counts,
    progress: &mut Progress,
) -> Result<(Row, u64), String> {
    let window = u64::from(o.window.unwrap_or(1));
    let (iterations, warmup) = (n.iterations, n.warmup);
    let total = warmup + iterations;
    // Slot s (channel s) always carries the pattern of seed `seed_of(size, s)`.
    for s in 0..window {
        let seed = seed_of(size, s);
        match o.op {
            Op::Write => fill_local(local, s * size, size, seed)?,
            Op::Read if o.verify => c.verify_remote(Msg::Fill {
                seed,
                offset: s * size,
                len: size,
            })?,
            Op::Read => {}
        }
    }
    // Samples in host time and in modeled time (us); returns both elapsed times.
    type Samples = (Vec<Duration>, Vec<f64>);
    let mut run =
        |count: u64, before: u64, samples: &mut Samples| -> Result<(Duration, f64), String> {
            let mut inflight: VecDeque<(Tag, Instant, ModelTime)> = VecDeque::new();
            let (mut posted, mut done) = (0u64, 0u64);
            let start = Instant::now();
            let modeled_start = c.ep.clock();
            while done < count {
                while inflight.len() < window as usize && posted < count {
                    // FIFO completion order: op k reuses the slot of op k - window, done.
                    let slot = posted % window;
                    let m0 = c.ep.clock();
                    let tag = post(c, o, page, local, slot as u8, slot * size, size)?;
                    inflight.push_back((tag, Instant::now(), m0));
                    posted += 1;
                }
                if let Some((tag, t0, m0)) = inflight.pop_front() {
                    let at = wait(c, tag, size, o)?;
                    samples.0.push(t0.elapsed());
                    samples.1.push(us_between(m0, at));
                    done += 1;
                    progress.tick(|| format!("{size} B: {}/{total} transfers", before + done));
                }
            }
            Ok((start.elapsed(), us_between(modeled_start, c.ep.clock())))
        };
    run(warmup, 0, &mut (Vec::new(), Vec::new()))?;
    let mut samples = (
        Vec::with_capacity(iterations as usize),
        Vec::with_capacity(iterations as usize),
    );
    let (elapsed, modeled_us) = run(iterations, warmup, &mut samples)?;
    // Every transfer into slot s carries the same bytes: what the slots hold at the end
    // is the last transfer into each (those of the measured run only).
    let mut verified = 0u64;
    if o.verify {
        for s in 0..window.min(iterations) {
            let seed = seed_of(size, s);
            match o.op {
                Op::Write => c.verify_remote(Msg::Check {
                    seed,
                    offset: s * size,
                    len: size,
                })?,
                Op::Read => check_local(local, s * size, size, seed)?,
            }
            verified += 1;
        }
    }
    let gbps = (size * iterations) as f64 * 8.0 / elapsed.as_secs_f64() / 1e9;
    let modeled_gbps =
        (modeled_us > 0.0).then(|| (size * iterations) as f64 * 8.0 / (modeled_us * 1e3));
    let row = Row {
        bench: "rdma-bw",
        size,
        summary: summarize(&samples.0),
        gbps: Some(gbps),
        modeled: Some(summarize_us(samples.1)),
        modeled_gbps,
        extra: extras(o, c, verified),
    };
    Ok((row, verified))
}
