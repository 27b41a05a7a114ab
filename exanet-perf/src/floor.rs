//! The floor: what QUIC alone does, with nothing of exanet on top.
//!
//! Two quinn endpoints in this process, on loopback (127.0.0.1, ports chosen by the
//! kernel), each on its own single-threaded tokio runtime and OS thread, as two
//! single-threaded daemons are. They are configured by the daemon's own code: the UDP
//! sockets of [`exanetd::daemon::link_endpoint`] (4 MiB buffers), the endpoint, server and
//! client settings of [`exanet_control::tls::NodeTls`] (TLS 1.3 over ring, mutual TLS against a
//! rack CA, the link ALPN, the links' transport settings: windows, keep-alive, initial RTT,
//! MTU discovery up to 4096 B). The PKI is a throwaway rack CA and two node certificates
//! made by [`exanet_control::tls::ensure_rack_pki`] in a temporary directory, which is removed as
//! soon as they are loaded. M1QAF1 dials M1QAF2, as the lower node id does in a rack.
//!
//! On that one connection, in this order:
//!
//! 1. ping-pong: one bidirectional stream; the dialer writes a `size`-byte message, the
//!    acceptor reads it whole and writes it back, `warmup + iterations` times. One-way
//!    latency = round trip / 2; the dialer checks every echo byte for byte.
//! 2. frame stream: a second bidirectional stream; the dialer writes `frame`-byte frames
//!    back to back (`batch` frames per `write_chunk`, 64 by default, as the daemon's link
//!    writer hands quinn what it has queued), for `--frames N` frames or `--duration-ms`.
//!    `--batch 1` writes each frame on its own and measures quinn's cost per write
//!    instead: quinn-proto 0.11 finds the bytes of each packet by a linear walk over the
//!    stream's unacknowledged writes (`SendBuffer::get`), so many small writes in flight
//!    cost it dearly. Every frame
//!    starts with its sequence number (u64, little-endian); the acceptor reads with
//!    `read_chunk(256 KiB)` as the daemon's link reader does, counts the bytes and checks
//!    every sequence number. Throughput = payload bytes / time from the first write to the
//!    acceptor holding the last byte.
//!
//! Stream headers (the first bytes of each stream, from the dialer):
//! ping-pong `b'P' | size u32 | count u64`, frames `b'F' | frame u32`, little-endian. After
//! the frames the acceptor answers `bytes u64 | frames in sequence u64`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use exanet_control::rack::{dns_name, Layout};
use exanet_control::tls::{self, NodeTls};
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use serde_json::json;

use crate::progress::Progress;
use crate::stats::{summarize, Row, Summary};

/// The dialer (lower node id) and the acceptor of the measured link.
const DIALER: &str = "M1QAF1";
const ACCEPTOR: &str = "M1QAF2";
/// What the daemon's link reader takes from QUIC at once (exanetd/src/link.rs).
const READ_CHUNK: usize = 256 * 1024;
/// Bytes of a frame that carry its sequence number.
pub const SEQ_BYTES: u64 = 8;
const KIND_PING: u8 = b'P';
const KIND_FRAMES: u8 = b'F';

/// How the frame stream ends.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    Frames(u64),
    Duration(Duration),
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Ping-pong message size, bytes (>= 1).
    pub size: u32,
    pub iterations: u64,
    pub warmup: u64,
    /// Frame size, bytes (>= SEQ_BYTES).
    pub frame: u32,
    /// Frames per write.
    pub batch: u32,
    pub until: Until,
    pub json: bool,
    pub quiet: bool,
    /// Each side gives up after this long.
    pub timeout: Duration,
}

/// What the dialer measured.
struct DialerReport {
    /// One-way latencies (round trip / 2) of the measured round trips.
    one_way: Vec<Duration>,
    /// First frame write.
    start: Instant,
    frames_sent: u64,
    /// What the acceptor said it received.
    acked_bytes: u64,
    acked_frames: u64,
    /// Path MTU (largest UDP payload) at the end of the stream.
    mtu: u16,
}

/// What the acceptor received.
struct AcceptorReport {
    bytes: u64,
    frames_in_sequence: u64,
    /// When it held the last byte of the frame stream.
    last_byte: Option<Instant>,
}

/// Runs both measurements. `o` comes from the command line, whose parsers
/// (`parse_floor_size`, `parse_floor_frame`, the `--batch` range in `main.rs`) refuse a
/// message of 0 bytes, a frame shorter than its sequence number and an empty batch.
pub fn run(o: &Options) -> Result<(), String> {
    let mut plan = Progress::new(o.quiet, Duration::from_secs(3600));
    plan.say(&format!(
        "floor: quinn on loopback, {DIALER} dials {ACCEPTOR} with exanetd's link settings; \
         ping-pong {} B x {} (+{} warm-up), then {} B frames {} ({} per write)",
        o.size,
        o.iterations,
        o.warmup,
        o.frame,
        match o.until {
            Until::Frames(n) => format!("x {n}"),
            Until::Duration(d) => format!("for {} ms", d.as_millis()),
        },
        o.batch
    ));

    let ((dialer_cfgs, client_cfg), acceptor_cfgs) = configs()?;
    let (addr_tx, addr_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let timeout = o.timeout;
    std::thread::Builder::new()
        .name(format!("floor-{ACCEPTOR}"))
        .spawn(move || {
            let r = on_runtime(timeout, "acceptor", async move {
                accept_side(acceptor_cfgs, addr_tx).await
            });
            let _ = done_tx.send(r);
        })
        .map_err(|e| format!("cannot start the acceptor thread: {e}"))?;
    // The acceptor says where it listens, or fails (and drops the sender).
    let Ok(addr) = addr_rx.recv_timeout(o.timeout) else {
        return Err(match done_rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Err(e)) => e,
            _ => "the acceptor did not start".into(),
        });
    };
    let opts = o.clone();
    let dialer = std::thread::Builder::new()
        .name(format!("floor-{DIALER}"))
        .spawn(move || {
            on_runtime(timeout, "dialer", async move {
                dial_side(dialer_cfgs, client_cfg, addr, &opts).await
            })
        })
        .map_err(|e| format!("cannot start the dialer thread: {e}"))?;
    let d = dialer
        .join()
        .map_err(|_| "the dialer thread panicked".to_string())?;
    // The acceptor ends when the dialer closes the connection. A failed dialer may not have
    // reached it: then its own error says more than waiting out the acceptor's timeout.
    let wait = if d.is_ok() {
        o.timeout
    } else {
        Duration::from_secs(2)
    };
    let a = match done_rx.recv_timeout(wait) {
        Ok(a) => a,
        Err(_) if d.is_err() => Err("(no word from the acceptor)".into()),
        Err(_) => Err("the acceptor did not finish".into()),
    };
    let (d, a) = match (d, a) {
        (Ok(d), Ok(a)) => (d, a),
        (Err(d), Err(a)) => return Err(format!("{d}; {a}")),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(e),
    };
    report(o, &d, &a)
}

fn report(o: &Options, d: &DialerReport, a: &AcceptorReport) -> Result<(), String> {
    let frame = u64::from(o.frame);
    let sent = d.frames_sent * frame;
    if a.bytes != sent || d.acked_bytes != sent {
        return Err(format!(
            "frame stream: {sent} bytes sent, the acceptor received {} (and acknowledged {})",
            a.bytes, d.acked_bytes
        ));
    }
    if a.frames_in_sequence != d.frames_sent || d.acked_frames != d.frames_sent {
        return Err(format!(
            "frame stream: {} frames sent, {} arrived in sequence",
            d.frames_sent, a.frames_in_sequence
        ));
    }
    let seconds = a
        .last_byte
        .map_or(0.0, |t| t.saturating_duration_since(d.start).as_secs_f64());
    let (gbps, fps) = if seconds > 0.0 {
        (
            a.bytes as f64 * 8.0 / seconds / 1e9,
            d.frames_sent as f64 / seconds,
        )
    } else {
        (0.0, 0.0)
    };
    let lat: Summary = summarize(&d.one_way);
    if o.json {
        if lat.n > 0 {
            println!(
                "{}",
                Row {
                    bench: "floor-pingpong",
                    size: u64::from(o.size),
                    summary: lat,
                    gbps: None,
                    modeled: None,
                    modeled_gbps: None,
                    extra: vec![
                        ("one_way", json!(true)),
                        ("transport", json!("quinn")),
                        ("link", json!(format!("{DIALER}->{ACCEPTOR}"))),
                    ],
                }
                .json()
            );
        }
        println!(
            "{}",
            json!({
                "bench": "floor-stream",
                "transport": "quinn",
                "link": format!("{DIALER}->{ACCEPTOR}"),
                "frame": o.frame,
                "batch": o.batch,
                "frames": d.frames_sent,
                "bytes_sent": sent,
                "bytes_received": a.bytes,
                "frames_verified": a.frames_in_sequence,
                "seconds": crate::stats::round(seconds, 6),
                "gbps": crate::stats::round(gbps, 3),
                "frames_per_s": fps.round(),
                "path_mtu": d.mtu,
            })
        );
        return Ok(());
    }
    if lat.n > 0 {
        println!(
            "ping-pong {} B, {} round trips: one-way (RTT/2) p50 {:.1} us, min {:.1} us, max {:.1} us",
            o.size, lat.n, lat.p50, lat.min, lat.max
        );
    }
    println!(
        "frame stream, {} B frames ({} per write): {:.3} Gb/s payload, {:.0} frames/s over {:.3} s",
        o.frame, o.batch, gbps, fps, seconds
    );
    println!(
        "  the acceptor received {} bytes = {} frames x {} B, every sequence number in order; path MTU {} B",
        a.bytes, d.frames_sent, o.frame, d.mtu
    );
    Ok(())
}

type EndpointCfgs = (quinn::EndpointConfig, quinn::ServerConfig);

/// The daemon's QUIC settings for both nodes, from a throwaway rack PKI.
fn configs() -> Result<((EndpointCfgs, quinn::ClientConfig), EndpointCfgs), String> {
    let dir = TempDir::new()?;
    let layout = Layout::new(&dir.0);
    tls::ensure_rack_pki(&layout, &[DIALER.to_string(), ACCEPTOR.to_string()])
        .map_err(|e| format!("floor PKI in {}: {e}", dir.0.display()))?;
    let node = |name: &str| -> Result<(EndpointCfgs, quinn::ClientConfig), String> {
        let t = NodeTls::load(&layout, name).map_err(|e| format!("{name} TLS: {e}"))?;
        let (server, client) = t
            .quic_configs(tls::DEFAULT_LINK_TIMEOUT)
            .map_err(|e| format!("{name} QUIC configuration: {e}"))?;
        Ok(((t.endpoint_config(), server), client))
    };
    let dialer = node(DIALER)?;
    let (acceptor, _) = node(ACCEPTOR)?;
    Ok((dialer, acceptor))
}

/// A private temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, String> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("exanet-perf-floor.{}.{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `f` on a single-threaded tokio runtime of this thread (as `exanetd --threads 1`),
/// giving up after `timeout`.
fn on_runtime<T>(
    timeout: Duration,
    side: &str,
    f: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("{side}: cannot build a tokio runtime: {e}"))?;
    rt.block_on(async {
        tokio::time::timeout(timeout, f).await.map_err(|_| {
            format!(
                "{side}: not done within {} ms (--timeout-ms)",
                timeout.as_millis()
            )
        })?
    })
}

fn bind(cfgs: EndpointCfgs, side: &str) -> Result<Endpoint, String> {
    let (endpoint_cfg, server_cfg) = cfgs;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    exanetd::daemon::link_endpoint(endpoint_cfg, server_cfg, addr)
        .map_err(|e| format!("{side}: cannot bind a QUIC endpoint on {addr}: {e}"))
}

async fn accept_side(
    cfgs: EndpointCfgs,
    addr_tx: mpsc::Sender<SocketAddr>,
) -> Result<AcceptorReport, String> {
    let ep = bind(cfgs, "acceptor")?;
    let addr = ep
        .local_addr()
        .map_err(|e| format!("acceptor: local address: {e}"))?;
    addr_tx
        .send(addr)
        .map_err(|_| "acceptor: nobody to dial".to_string())?;
    let result = async {
        let incoming = ep
            .accept()
            .await
            .ok_or("acceptor: the endpoint closed before a connection")?;
        let conn = incoming
            .await
            .map_err(|e| format!("acceptor: handshake: {e}"))?;
        let r = accept_streams(&conn).await;
        if r.is_ok() {
            // The dialer closes once it has the acknowledgement.
            conn.closed().await;
        }
        r
    }
    .await;
    ep.close(VarInt::from_u32(0), b"done");
    ep.wait_idle().await;
    result
}

async fn accept_streams(conn: &Connection) -> Result<AcceptorReport, String> {
    let mut report = AcceptorReport {
        bytes: 0,
        frames_in_sequence: 0,
        last_byte: None,
    };
    loop {
        let (mut send, mut recv) = match conn.accept_bi().await {
            Ok(s) => s,
            // The dialer closed the connection: every stream is done.
            Err(quinn::ConnectionError::ApplicationClosed(_)) => return Ok(report),
            Err(e) => return Err(format!("acceptor: accept stream: {e}")),
        };
        let mut kind = [0u8; 1];
        read_exact(&mut recv, &mut kind, "acceptor: stream header").await?;
        match kind[0] {
            KIND_PING => echo(&mut send, &mut recv).await?,
            KIND_FRAMES => {
                let mut h = [0u8; 4];
                read_exact(&mut recv, &mut h, "acceptor: frame header").await?;
                let frame = u64::from(u32::from_le_bytes(h));
                if frame < SEQ_BYTES {
                    return Err(format!("acceptor: frame size {frame} < {SEQ_BYTES}"));
                }
                let mut v = Verifier::new(frame);
                loop {
                    match recv.read_chunk(READ_CHUNK, true).await {
                        Ok(Some(c)) => v.push(&c.bytes)?,
                        Ok(None) => break,
                        Err(e) => return Err(format!("acceptor: frame stream: {e}")),
                    }
                }
                report.last_byte = Some(Instant::now());
                if v.pos % frame != 0 {
                    return Err(format!(
                        "acceptor: the stream ended inside a frame ({} bytes of {frame} B frames)",
                        v.pos
                    ));
                }
                report.bytes = v.pos;
                report.frames_in_sequence = v.next;
                let mut ack = [0u8; 16];
                ack[..8].copy_from_slice(&v.pos.to_le_bytes());
                ack[8..].copy_from_slice(&v.next.to_le_bytes());
                send.write_all(&ack)
                    .await
                    .map_err(|e| format!("acceptor: acknowledgement: {e}"))?;
                let _ = send.finish();
            }
            k => return Err(format!("acceptor: unknown stream kind {k:#04x}")),
        }
    }
}

async fn echo(send: &mut SendStream, recv: &mut RecvStream) -> Result<(), String> {
    let mut h = [0u8; 12];
    read_exact(recv, &mut h, "acceptor: ping-pong header").await?;
    let size = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let mut count = [0u8; 8];
    count.copy_from_slice(&h[4..]);
    let count = u64::from_le_bytes(count);
    let mut buf = vec![0u8; size];
    for i in 0..count {
        read_exact(recv, &mut buf, "acceptor: ping").await?;
        send.write_all(&buf)
            .await
            .map_err(|e| format!("acceptor: pong {i}: {e}"))?;
    }
    let _ = send.finish();
    Ok(())
}

async fn read_exact(recv: &mut RecvStream, buf: &mut [u8], what: &str) -> Result<(), String> {
    recv.read_exact(buf)
        .await
        .map_err(|e| format!("{what}: {e}"))
}

async fn dial_side(
    cfgs: EndpointCfgs,
    client_cfg: quinn::ClientConfig,
    to: SocketAddr,
    o: &Options,
) -> Result<DialerReport, String> {
    let ep = bind(cfgs, "dialer")?;
    let result = async {
        let conn = ep
            .connect_with(client_cfg, to, &dns_name(&ACCEPTOR))
            .map_err(|e| format!("dialer: connect to {to}: {e}"))?
            .await
            .map_err(|e| format!("dialer: handshake with {to}: {e}"))?;
        let r = dial_streams(&conn, o).await;
        conn.close(VarInt::from_u32(0), b"done");
        r
    }
    .await;
    ep.wait_idle().await;
    result
}

async fn dial_streams(conn: &Connection, o: &Options) -> Result<DialerReport, String> {
    let one_way = ping_pong(conn, o).await?;

    let mut h = [0u8; 5];
    h[0] = KIND_FRAMES;
    h[1..].copy_from_slice(&o.frame.to_le_bytes());
    let (mut send, mut recv) = open_stream(conn, &h, "frame").await?;
    let frame = o.frame as usize;
    let batch = u64::from(o.batch);
    let (limit, deadline) = match o.until {
        Until::Frames(n) => (n, None),
        Until::Duration(d) => (u64::MAX, Some(d)),
    };
    let start = Instant::now();
    let mut seq = 0u64;
    while seq < limit && deadline.is_none_or(|d| start.elapsed() < d) {
        let n = batch.min(limit - seq);
        let mut buf = BytesMut::with_capacity(n as usize * frame);
        for _ in 0..n {
            buf.put_u64_le(seq);
            buf.put_bytes(0, frame - SEQ_BYTES as usize);
            seq += 1;
        }
        send.write_chunk(buf.freeze())
            .await
            .map_err(|e| format!("dialer: frame {seq}: {e}"))?;
    }
    send.finish()
        .map_err(|e| format!("dialer: finish the frame stream: {e}"))?;
    let mut ack = [0u8; 16];
    recv.read_exact(&mut ack)
        .await
        .map_err(|e| format!("dialer: the acceptor's acknowledgement: {e}"))?;
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    Ok(DialerReport {
        one_way,
        start,
        frames_sent: seq,
        acked_bytes: word(&ack[..8]),
        acked_frames: word(&ack[8..]),
        mtu: conn.stats().path.current_mtu,
    })
}

/// Opens a stream of the dialer's and sends its `header` (kind and parameters).
async fn open_stream(
    conn: &Connection,
    header: &[u8],
    what: &str,
) -> Result<(SendStream, RecvStream), String> {
    let (mut send, recv) = conn
        .open_bi()
        .await
        .map_err(|e| format!("dialer: open the {what} stream: {e}"))?;
    send.write_all(header)
        .await
        .map_err(|e| format!("dialer: {what} header: {e}"))?;
    Ok((send, recv))
}

async fn ping_pong(conn: &Connection, o: &Options) -> Result<Vec<Duration>, String> {
    let total = o.warmup.saturating_add(o.iterations);
    if o.iterations == 0 {
        return Ok(Vec::new());
    }
    let mut h = [0u8; 13];
    h[0] = KIND_PING;
    h[1..5].copy_from_slice(&o.size.to_le_bytes());
    h[5..].copy_from_slice(&total.to_le_bytes());
    let (mut send, mut recv) = open_stream(conn, &h, "ping-pong").await?;
    let size = o.size as usize;
    let mut ping = vec![0u8; size];
    let mut pong = vec![0u8; size];
    let mut one_way = Vec::with_capacity(o.iterations as usize);
    for i in 0..total {
        // A different message each time, so a stale echo cannot pass for this one.
        for (j, b) in ping.iter_mut().enumerate() {
            *b = (i as u8).wrapping_add(j as u8);
        }
        let t0 = Instant::now();
        send.write_all(&ping)
            .await
            .map_err(|e| format!("dialer: ping {i}: {e}"))?;
        read_exact(&mut recv, &mut pong, "dialer: pong").await?;
        let rtt = t0.elapsed();
        if pong != ping {
            return Err(format!(
                "dialer: round trip {i}: the echo differs from the ping"
            ));
        }
        if i >= o.warmup {
            one_way.push(rtt / 2);
        }
    }
    send.finish()
        .map_err(|e| format!("dialer: finish the ping-pong stream: {e}"))?;
    Ok(one_way)
}

/// Counts a frame stream's bytes and checks each frame's sequence number, whatever the
/// chunk boundaries.
#[derive(Debug)]
struct Verifier {
    frame: u64,
    /// Bytes received.
    pos: u64,
    /// The sequence number being assembled.
    seq: [u8; SEQ_BYTES as usize],
    /// Frames whose sequence number was checked (all in order), = the next one expected.
    next: u64,
}

impl Verifier {
    fn new(frame: u64) -> Verifier {
        Verifier {
            frame,
            pos: 0,
            seq: [0; SEQ_BYTES as usize],
            next: 0,
        }
    }

    fn push(&mut self, mut chunk: &[u8]) -> Result<(), String> {
        while !chunk.is_empty() {
            let off = self.pos % self.frame;
            let n = if off < SEQ_BYTES {
                let n = ((SEQ_BYTES - off) as usize).min(chunk.len());
                let o = off as usize;
                self.seq[o..o + n].copy_from_slice(&chunk[..n]);
                if off + n as u64 == SEQ_BYTES {
                    let got = u64::from_le_bytes(self.seq);
                    if got != self.next {
                        return Err(format!(
                            "acceptor: frame {} carries sequence number {got}",
                            self.next
                        ));
                    }
                    self.next += 1;
                }
                n
            } else {
                ((self.frame - off) as usize).min(chunk.len())
            };
            self.pos += n as u64;
            chunk = &chunk[n..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(n: u64, frame: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for s in 0..n {
            v.extend_from_slice(&s.to_le_bytes());
            v.resize(v.len() + frame - 8, 0xa5);
        }
        v
    }

    #[test]
    fn verifier_checks_sequence_numbers_across_any_chunking() {
        let data = frames(50, 24);
        for step in [1, 3, 7, 8, 24, 25, 100, data.len()] {
            let mut v = Verifier::new(24);
            for c in data.chunks(step) {
                v.push(c).unwrap();
            }
            assert_eq!((v.pos, v.next), (50 * 24, 50), "chunks of {step}");
        }
    }

    #[test]
    fn verifier_refuses_a_frame_out_of_sequence() {
        let mut data = frames(10, 16);
        data[5 * 16] = 9; // frame 5 claims to be frame 9
        let mut v = Verifier::new(16);
        let e = v.push(&data).unwrap_err();
        assert!(e.contains("frame 5 carries sequence number 9"), "{e}");
        assert_eq!(v.next, 5);
    }

    #[test]
    fn verifier_takes_frames_of_exactly_the_sequence_number() {
        let data = frames(4, 8);
        let mut v = Verifier::new(8);
        v.push(&data).unwrap();
        assert_eq!((v.pos, v.next), (32, 4));
    }
}
