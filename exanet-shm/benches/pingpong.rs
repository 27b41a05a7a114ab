//! Ping-pong latency between two processes over two shared-memory rings.
//!
//! ```text
//! cargo bench -p exanet-shm --bench pingpong
//! ```
//!
//! The bench binary re-executes itself as the child (selected by an environment variable);
//! the parent sends the memfd and the child's ends of two doorbell socket pairs over a Unix socket. Each sample is one round
//! trip timed by the parent (push + wake-if-sleeping, then wait for and pop the echo); the
//! one-way latency reported is half the round trip. Modes:
//! - `spin`: both sides busy-poll (spin budget effectively infinite);
//! - `adaptive`: the default 20 us spin budget, then sleep;
//! - `sleep`: spin budget 0, so every message goes through a doorbell wake-up.
//!
//! A first line, `floor`, measures the machine rather than the crate: two threads bounce a
//! counter between two cache lines (each spins on the other's line), timed the same way.
//! No ring that carries each direction in its own memory can beat it.
//!
//! `EXANET_SHM_BENCH_SCALE` (a float, default 1) scales the sample counts.

use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use exanet_shm::{doorbell, recv_fds, send_fds, Doorbell, Region, Ring, Ringer, Waiter};

const CHILD_ENV: &str = "EXANET_SHM_BENCH_CHILD_SOCKET";
const SLOTS: u32 = 64;
const TIMEOUT: Duration = Duration::from_secs(60);
/// "Spin forever": the waiter clamps its budget to the wait's timeout.
const SPIN_FOREVER: Duration = Duration::from_secs(3600);

struct Config {
    name: &'static str,
    slot_size: u32,
    payload: usize,
    spin: Duration,
    warmup: usize,
    samples: usize,
}

/// The hello message: geometry and mode, so the child needs no other configuration.
#[derive(Clone, Copy)]
struct Hello {
    region_len: u64,
    slot_size: u32,
    spin_ns: u64,
}

impl Hello {
    const LEN: usize = 20;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&self.region_len.to_le_bytes());
        b[8..12].copy_from_slice(&self.slot_size.to_le_bytes());
        b[12..].copy_from_slice(&self.spin_ns.to_le_bytes());
        b
    }

    fn decode(b: &[u8; Self::LEN]) -> Hello {
        Hello {
            region_len: u64::from_le_bytes(b[..8].try_into().unwrap()),
            slot_size: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            spin_ns: u64::from_le_bytes(b[12..].try_into().unwrap()),
        }
    }
}

fn rings(slot_size: u32) -> (Ring, Ring) {
    let ping = Ring::new(0, SLOTS, slot_size).unwrap();
    let pong = Ring::new(ping.end(), SLOTS, slot_size).unwrap();
    (ping, pong)
}

fn main() {
    if let Some(name) = std::env::var_os(CHILD_ENV) {
        let addr = SocketAddr::from_abstract_name(name.as_encoded_bytes()).unwrap();
        child(UnixStream::connect_addr(&addr).expect("child: connect"));
        return;
    }
    let scale: f64 = std::env::var("EXANET_SHM_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let n = |x: usize| ((x as f64 * scale) as usize).max(100);
    let configs = [
        Config {
            name: "spin",
            slot_size: 128,
            payload: 64,
            spin: SPIN_FOREVER,
            warmup: n(100_000),
            samples: n(1_000_000),
        },
        Config {
            name: "spin",
            slot_size: 64,
            payload: 56,
            spin: SPIN_FOREVER,
            warmup: n(100_000),
            samples: n(1_000_000),
        },
        Config {
            name: "adaptive",
            slot_size: 128,
            payload: 64,
            spin: exanet_shm::doorbell::DEFAULT_SPIN,
            warmup: n(50_000),
            samples: n(300_000),
        },
        Config {
            name: "sleep",
            slot_size: 128,
            payload: 64,
            spin: Duration::ZERO,
            warmup: n(2_000),
            samples: n(50_000),
        },
    ];
    println!(
        "exanet-shm ping-pong, two processes, {} CPUs, clock read ~{} ns",
        cpus(),
        clock_overhead_ns()
    );
    println!("one-way latency = round trip / 2, in ns; msg = payload bytes, slot = slot size");
    println!(
        "{:<9} {:>5} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "mode", "slot", "msg", "samples", "p50", "p90", "p99", "p99.9", "mean"
    );
    let report = |name: &str, slot: &str, msg: &str, mut one_way: Vec<u64>| {
        one_way.sort_unstable();
        let pct = |p: f64| one_way[((one_way.len() as f64 * p) as usize).min(one_way.len() - 1)];
        let mean = one_way.iter().sum::<u64>() / one_way.len() as u64;
        println!(
            "{:<9} {:>5} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
            name,
            slot,
            msg,
            one_way.len(),
            pct(0.50),
            pct(0.90),
            pct(0.99),
            pct(0.999),
            mean
        );
    };
    report("floor", "-", "8", floor(n(100_000), n(1_000_000)));
    for config in &configs {
        report(
            config.name,
            &config.slot_size.to_string(),
            &config.payload.to_string(),
            run(config),
        );
    }
}

/// Two threads, two cache lines: the parent stores `i` into `ping` and spins until `pong`
/// says `i`; the child spins on `ping` and answers on `pong`. One-way latencies in ns.
fn floor(warmup: usize, samples: usize) -> Vec<u64> {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let lines = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let total = (warmup + samples) as u64;
    let theirs = Arc::clone(&lines);
    let echo = thread::spawn(move || {
        for i in 1..=total {
            while theirs.0 .0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            theirs.1 .0.store(i, Ordering::Release);
        }
    });
    let mut one_way = Vec::with_capacity(samples);
    for i in 1..=total {
        let t0 = Instant::now();
        lines.0 .0.store(i, Ordering::Release);
        while lines.1 .0.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        let rtt = t0.elapsed();
        if i as usize > warmup {
            one_way.push(rtt.as_nanos() as u64 / 2);
        }
    }
    echo.join().unwrap();
    one_way
}

fn cpus() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// Cost of one `Instant::now()`, which every sample pays once.
fn clock_overhead_ns() -> u64 {
    let start = Instant::now();
    let mut last = start;
    for _ in 0..1_000_000 {
        last = Instant::now();
    }
    (last - start).as_nanos() as u64 / 1_000_000
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs one configuration against a fresh child; returns one-way latencies in ns.
fn run(config: &Config) -> Vec<u64> {
    let (ping, pong) = rings(config.slot_size);
    let region = Arc::new(Region::create("exanet-shm-bench", pong.end()).unwrap());
    ping.init(&region).unwrap();
    pong.init(&region).unwrap();
    // The parent rings `child_bell` and waits on `parent_bell`; the child gets the other ends.
    let (child_bell, child_end_of_child_bell) = doorbell().unwrap();
    let (child_end_of_parent_bell, parent_bell) = doorbell().unwrap();
    let mut tx = ping.producer(Arc::clone(&region)).unwrap();
    let mut rx = pong.consumer(Arc::clone(&region)).unwrap();

    // An abstract socket: no file to clean up.
    let name = format!("exanet-shm-bench-{}", std::process::id());
    let listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, &name)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + TIMEOUT;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(child.0.try_wait().unwrap().is_none(), "child exited early");
                assert!(Instant::now() < deadline, "child never connected");
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    let hello = Hello {
        region_len: region.len() as u64,
        slot_size: config.slot_size,
        spin_ns: config.spin.as_nanos() as u64,
    };
    send_fds(
        &stream,
        &hello.encode(),
        &[
            region.as_raw_fd(),
            child_end_of_child_bell.as_raw_fd(),
            child_end_of_parent_bell.as_raw_fd(),
        ],
    )
    .unwrap();

    let waiter = Waiter::new(config.spin);
    let mut msg = vec![0xA5u8; config.payload];
    let mut buf = vec![0u8; tx.max_message_len()];
    let mut one_way = Vec::with_capacity(config.samples);
    for i in 0..(config.warmup + config.samples) as u64 {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        let t0 = Instant::now();
        tx.push(&msg).unwrap();
        tx.wake_consumer(&child_bell).unwrap();
        let n = rx
            .pop_wait(&mut buf, &waiter, &parent_bell, Some(TIMEOUT))
            .unwrap()
            .expect("echo timed out");
        let rtt = t0.elapsed();
        assert!(n == msg.len() && buf[..8] == msg[..8], "bad echo for {i}");
        if i as usize >= config.warmup {
            one_way.push(rtt.as_nanos() as u64 / 2);
        }
    }
    // An empty message tells the child to stop.
    tx.push(&[]).unwrap();
    tx.wake_consumer(&child_bell).unwrap();
    let status = child.0.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
    one_way
}

fn child(stream: UnixStream) {
    let mut hello = [0u8; Hello::LEN];
    let (n, fds) = recv_fds(&stream, &mut hello, 3).unwrap();
    assert_eq!(n, Hello::LEN);
    let hello = Hello::decode(&hello);
    let [mem, child_bell, parent_bell]: [_; 3] = fds.try_into().expect("three descriptors");
    let region = Arc::new(Region::from_fd_with_len(mem, hello.region_len as usize).unwrap());
    let child_bell = Doorbell::from_fd(child_bell).unwrap();
    let parent_bell = Ringer::from_fd(parent_bell).unwrap();
    let (ping, pong) = rings(hello.slot_size);
    let mut rx = ping.consumer(Arc::clone(&region)).unwrap();
    let mut tx = pong.producer(region).unwrap();
    let waiter = Waiter::new(Duration::from_nanos(hello.spin_ns));
    let mut buf = vec![0u8; rx.max_message_len()];
    loop {
        let n = rx
            .pop_wait(&mut buf, &waiter, &child_bell, Some(TIMEOUT))
            .unwrap()
            .expect("child: nothing to echo");
        if n == 0 {
            return;
        }
        tx.push(&buf[..n]).unwrap();
        tx.wake_consumer(&parent_bell).unwrap();
    }
}
