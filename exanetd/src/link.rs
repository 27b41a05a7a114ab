//! Links over QUIC. One QUIC connection per emulated link, one bidirectional stream per
//! connection carrying the link framing of `exanet_proto::frame`. The node with the
//! lower id dials, the other accepts; the dialer retries with backoff until the neighbour
//! is up and again whenever the link drops. Both ends authenticate with the rack CA
//! (mutual TLS), and the acceptor checks that the certificate was issued for the node the
//! peer's hello names.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use exanet_proto::capture::{self, Direction, Seen};
use exanet_proto::frame::{Frame, FrameDecoder, Hello};
use exanet_proto::model::ModelTime;
use exanet_proto::SessionEnd;
use exanet_proto::{NodeId, Port, Vc};
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use rand::Rng;
use rustls::pki_types::CertificateDer;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::held_credit::{HeldCredit, Offered};
use crate::node::NodeHandle;
use exanet_control::rack::dns_name;

/// How much a reader takes from QUIC at once before feeding the core.
const READ_CHUNK: usize = 256 * 1024;
/// Longest a hello may take to arrive on a fresh connection.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Dials the neighbour on `port` for as long as the daemon runs.
pub async fn dial_loop(
    node: Arc<NodeHandle>,
    endpoint: Endpoint,
    client: quinn::ClientConfig,
    port: Port,
    peer: NodeId,
) {
    let shape = node.rack.shape();
    let peer_name = shape.display(peer);
    let addr_text = node.rack.entry(peer).link.clone();
    let mut backoff = Duration::from_millis(50);
    loop {
        if let Some(gate) = node.admin_gate(port) {
            // Set down by the operator: wait until it is set up again.
            debug!(peer = %peer_name, %port, "link set down; not dialing");
            gate.notified().await;
            backoff = Duration::from_millis(50);
            continue;
        }
        match dial_once(&endpoint, &client, &addr_text, &peer_name).await {
            Ok((conn, send, recv)) => {
                backoff = Duration::from_millis(50);
                info!(peer = %peer_name, %port, "link up (dialed)");
                run_session(&node, port, conn, send, recv, None).await;
                info!(peer = %peer_name, %port, "link down");
            }
            Err(e) => {
                debug!(peer = %peer_name, %port, error = %e, "dial failed");
            }
        }
        let jitter = rand::thread_rng().gen_range(0..=backoff.as_millis() as u64 / 2);
        tokio::time::sleep(backoff + Duration::from_millis(jitter)).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to nothing"))
}

/// How long a dial waits for the handshake before it is tried again. Not the link
/// timeout: a peer that is not listening yet (a rack coming up) makes QUIC resend its
/// first packet at doubling intervals until the link timeout, so a dial left to run would
/// notice the peer seconds after it started (a 1024-node rack with a 30 s link timeout
/// came up in 19.7 s instead of 11.5); redialing after this long notices it within the
/// dial loop's backoff.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// One dial of `peer_name` at `addr` (the links' and the cut coordinator's): resolved,
/// connected within [`DIAL_TIMEOUT`], one bidirectional stream opened.
pub(crate) async fn dial_once(
    endpoint: &Endpoint,
    client: &quinn::ClientConfig,
    addr: &str,
    peer_name: &str,
) -> Result<(Connection, SendStream, RecvStream), String> {
    let sa = resolve(addr).await?;
    let connecting = endpoint
        .connect_with(client.clone(), sa, &dns_name(&peer_name))
        .map_err(|e| e.to_string())?;
    let conn = tokio::time::timeout(DIAL_TIMEOUT, connecting)
        .await
        .map_err(|_| format!("no handshake within {DIAL_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let (send, recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    Ok((conn, send, recv))
}

/// The application protocol a connection negotiated.
fn alpn(conn: &Connection) -> Option<Vec<u8>> {
    conn.handshake_data()?
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .ok()?
        .protocol
}

/// What serves the daemons' cut connections on the node that coordinates (the daemon
/// hands it over: the links know nothing of cuts).
pub type CutServer = Arc<
    dyn Fn(
            Arc<NodeHandle>,
            Connection,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// Accepts neighbours' links and operators' control connections for as long as the
/// endpoint is open.
/// On the rack's first node in modeled order, `coordinator` takes the daemons' cut
/// connections.
pub async fn accept_loop(
    node: Arc<NodeHandle>,
    endpoint: Endpoint,
    shutdown: Arc<Notify>,
    coordinator: Option<CutServer>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let (node, shutdown, coordinator) = (node.clone(), shutdown.clone(), coordinator.clone());
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) if is_tls_refusal(&e) => {
                    // Certificates not from the rack CA end up here.
                    warn!(%remote, error = %e, "refused incoming link");
                    node.count_error("tls_refused");
                    return;
                }
                Err(e) => {
                    // A handshake that was reset or timed out (a restarted peer's dead
                    // run, a dialer that gave up) refused nothing: no alarm for it.
                    debug!(%remote, error = %e, "incoming handshake abandoned");
                    return;
                }
            };
            if alpn(&conn).as_deref() == Some(exanet_control::tls::ALPN_CONTROL) {
                crate::control_server::serve_quic(conn, node, shutdown).await;
                return;
            }
            if alpn(&conn).as_deref() == Some(exanet_control::tls::ALPN_CUTS) {
                match coordinator {
                    Some(serve) => serve(node, conn).await,
                    None => {
                        // Only the first node coordinates, and only a rack in modeled order.
                        node.count_error("cut_not_coordinator");
                        conn.close(
                            VarInt::from_u32(SessionEnd::Protocol.code()),
                            b"not the coordinator",
                        );
                    }
                }
                return;
            }
            if let Err(e) = accept_session(&node, conn.clone()).await {
                warn!(%remote, error = %e, "incoming link refused");
                conn.close(VarInt::from_u32(SessionEnd::Protocol.code()), e.as_bytes());
            }
        });
    }
}

/// Whether a failed handshake was a TLS refusal, by either end: QUIC carries TLS alerts as
/// the crypto error codes 0x100..=0x1ff (RFC 9001 §4.8).
fn is_tls_refusal(e: &quinn::ConnectionError) -> bool {
    let code = match e {
        quinn::ConnectionError::TransportError(t) => t.code,
        quinn::ConnectionError::ConnectionClosed(c) => c.error_code,
        _ => return false,
    };
    (0x100..=0x1ff).contains(&u64::from(code))
}

async fn accept_session(node: &Arc<NodeHandle>, conn: Connection) -> Result<(), String> {
    let (send, mut recv) = tokio::time::timeout(HELLO_TIMEOUT, conn.accept_bi())
        .await
        .map_err(|_| "no stream opened in time".to_string())?
        .map_err(|e| e.to_string())?;
    let mut dec = FrameDecoder::new();
    let hello = read_hello(&mut recv, &mut dec).await?;
    let shape = node.rack.shape();
    // Which of our ports does this peer sit on?
    let Some(port) = node.lock().station.port_of_hello(&hello) else {
        node.count_error("hello_neighbour");
        return Err(format!(
            "peer claims to be node {} port {}, not a neighbour of ours",
            hello.node, hello.port
        ));
    };
    let claimed = shape.display(hello.node);
    if node.lock().is_admin_down(port) {
        node.count_error("link_admin_down");
        return Err(format!("link to {claimed} is set down by the operator"));
    }
    let certs = conn
        .peer_identity()
        .and_then(|a| a.downcast::<Vec<CertificateDer<'static>>>().ok());
    if !certs.is_some_and(|c| exanet_control::tls::cert_is_for(&c, &claimed)) {
        node.count_error("cert_mismatch");
        return Err(format!("certificate is not issued for {claimed}"));
    }
    info!(peer = %claimed, %port, "link up (accepted)");
    run_session(node, port, conn, send, recv, Some((hello, dec))).await;
    info!(peer = %claimed, %port, "link down");
    Ok(())
}

async fn read_hello(recv: &mut RecvStream, dec: &mut FrameDecoder) -> Result<Hello, String> {
    let fut = async {
        loop {
            if let Some(f) = dec.next_frame() {
                return match f {
                    Ok(Frame::Hello(h)) => Ok(h),
                    Ok(_) => Err("first frame is not a hello".to_string()),
                    Err(e) => Err(e.to_string()),
                };
            }
            match recv.read_chunk(READ_CHUNK, true).await {
                Ok(Some(c)) => dec.push_bytes(c.bytes),
                Ok(None) => return Err("stream closed before hello".to_string()),
                Err(e) => return Err(e.to_string()),
            }
        }
    };
    tokio::time::timeout(HELLO_TIMEOUT, fut)
        .await
        .map_err(|_| "no hello in time".to_string())?
}

/// Runs one link session until the connection fails or a newer session replaces it.
/// `accepted` carries the hello (and the decoder holding any bytes after it) when the
/// peer's hello was already read to identify it.
async fn run_session(
    node: &Arc<NodeHandle>,
    port: Port,
    conn: Connection,
    mut send: SendStream,
    mut recv: RecvStream,
    accepted: Option<(Hello, FrameDecoder)>,
) {
    let wake = Arc::new(Notify::new());
    let sid = {
        let now = node.now();
        let mut core = node.lock();
        match core.begin_session(port, wake.clone(), conn.clone(), now) {
            Ok(sid) => sid,
            Err(e) => {
                warn!(%port, error = %e, "cannot start link session");
                return;
            }
        }
    };
    let writer = async {
        let timer = crate::precise_timer::PreciseTimer::get();
        let mut armed = None;
        let peer = node
            .links()
            .into_iter()
            .find(|(p, ..)| *p == port)
            .map_or(node.id, |(_, peer, ..)| peer);
        let mut held = HeldCredit::new(node.lock().node().switch().config().window);
        loop {
            wake.notified().await;
            let now = node.now();
            let Some(out) = node.lock().take_output(port, sid, now) else {
                return (SessionEnd::Replaced, "replaced");
            };
            // Frames held back by link shaping: wake when the first falls due. tokio's
            // timer would round sub-millisecond delays up to milliseconds.
            if let Some(at) = out.next_due {
                if armed.is_none_or(|a| at < a || a <= now) {
                    armed = Some(at);
                    timer.wake_at(node.deadline_std(at), wake.clone());
                }
            }
            if node.taps.any() && !out.bytes.is_empty() && node.taps.wants(port, Direction::Sent) {
                // Captures of sent cells read back what leaves the port (corrupted by
                // fault injection or not); an output is whole frames.
                let seen = Seen {
                    direction: Direction::Sent,
                    node: node.id,
                    peer,
                    port,
                    vc: Vc(0),
                    modeled: ModelTime::ZERO,
                };
                capture::sent_cells(out.bytes.clone(), seen, |seen, cell| {
                    node.taps.offer(seen, cell)
                });
            }
            match held.offer(out.bytes, out.credit_only, now) {
                Offered::Held { arm } => {
                    if let Some(at) = arm {
                        timer.wake_at(node.deadline_std(at), wake.clone());
                    }
                }
                Offered::Write(mut chunks) => {
                    if send.write_all_chunks(&mut chunks).await.is_err() {
                        return (SessionEnd::Shutdown, "write failed");
                    }
                }
                Offered::Nothing => {
                    // Woken for nothing to send (the injector dropped it all): let the
                    // other tasks run, or a link losing every cell would spin here
                    // unopposed.
                    tokio::task::yield_now().await;
                }
            }
        }
    };
    let reader = async {
        let (hello, mut dec) = match accepted {
            Some(x) => x,
            None => {
                let mut dec = FrameDecoder::new();
                match read_hello(&mut recv, &mut dec).await {
                    Ok(h) => (h, dec),
                    Err(e) => {
                        warn!(%port, error = %e, "no hello from dialed peer");
                        return (SessionEnd::Protocol, "no hello");
                    }
                }
            }
        };
        let now = node.now();
        if let Err(e) = node.lock().on_hello(port, sid, &hello, now) {
            warn!(%port, error = %e, "peer hello refused");
            return (SessionEnd::Protocol, "bad hello");
        }
        let mut frames = Vec::new();
        let (me, peer) = (node.id, hello.node);
        loop {
            // Frames that arrived together with the hello are decoded first.
            let mut fatal = false;
            // Only a running capture pays for the cells' raw bytes.
            let tapping = node.taps.any();
            while let Some((f, raw)) = if tapping {
                dec.next_frame_and_cell_bytes()
            } else {
                dec.next_frame().map(|f| (f, None))
            } {
                if let Some(raw) = raw {
                    let seen = Seen {
                        direction: Direction::Received,
                        node: me,
                        peer,
                        port,
                        vc: raw.vc,
                        modeled: raw.stamp.tail,
                    };
                    node.taps.offer(&seen, &raw.wire);
                }
                match f {
                    Ok(f) => frames.push(f),
                    Err(e) => {
                        warn!(%port, error = %e, "bad frame from peer");
                        let now = node.now();
                        fatal |= node.lock().on_bad_frame(port, &e, now);
                    }
                }
            }
            if !frames.is_empty() {
                let now = node.now();
                if !node
                    .lock()
                    .apply(port, sid, std::mem::take(&mut frames), now)
                {
                    return (SessionEnd::Replaced, "replaced");
                }
            }
            if fatal {
                return (SessionEnd::Protocol, "stream out of sync");
            }
            match recv.read_chunk(READ_CHUNK, true).await {
                Ok(Some(c)) => dec.push_bytes(c.bytes),
                Ok(None) => return (SessionEnd::Shutdown, "peer closed"),
                Err(_) => return (SessionEnd::Shutdown, "read failed"),
            }
        }
    };
    let (end, why) = tokio::select! {
        w = writer => w,
        r = reader => r,
    };
    debug!(%port, why, "link session over");
    let now = node.now();
    node.lock().end_session(port, sid, now);
    conn.close(VarInt::from_u32(end.code()), why.as_bytes());
}
