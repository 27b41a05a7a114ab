//! The daemon side of the control interface (see [`crate::control`] for the protocol).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::capture::TapSpec;
use crate::node::NodeHandle;
use exanet_control::control::{Request, Response, MAX_LINE};
use exanet_proto::capture::CaptureFilter;
use exanet_proto::cell::CellType;
use exanet_proto::gvas::Pdid;

/// Binds a Unix socket of the rack directory, replacing a stale one, usable only by the
/// rack's owner (workloads in a container share its IPC namespace and user).
pub fn bind_owner_only(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = std::os::unix::net::UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Binds the control socket (see [`bind_owner_only`]).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let l = bind_owner_only(path)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

pub async fn serve(listener: UnixListener, node: Arc<NodeHandle>, shutdown: Arc<Notify>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (node, shutdown) = (node.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = handle(stream, &node, &shutdown).await {
                debug!(error = %e, "control connection ended");
            }
        });
    }
}

async fn handle(s: UnixStream, node: &NodeHandle, shutdown: &Notify) -> std::io::Result<()> {
    let (r, mut w) = s.into_split();
    let mut r = BufReader::new(r).take(MAX_LINE as u64 + 1);
    let mut line = String::new();
    loop {
        line.clear();
        r.set_limit(MAX_LINE as u64 + 1);
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        if let Some(ask) = serde_json::from_str::<Request>(&line)
            .ok()
            .and_then(|r| capture_ask(node, r))
        {
            // The connection is the capture's from here on; the operator is gone when
            // it closes its end.
            let mut rest = r.into_inner().into_inner();
            let gone = async move {
                let mut b = [0u8; 64];
                while matches!(rest.read(&mut b).await, Ok(n) if n > 0) {}
            };
            stream_capture(node, ask, &mut w, gone).await;
            let _ = w.shutdown().await;
            return Ok(());
        }
        let resp = if line.len() > MAX_LINE {
            too_long(node)
        } else {
            respond(line.as_bytes(), node, shutdown).await
        };
        w.write_all(&encode(&resp)).await?;
        if line.len() > MAX_LINE {
            return Ok(());
        }
    }
}

fn too_long(node: &NodeHandle) -> Response {
    node.count_error("control_request");
    Response::Error {
        message: format!("request longer than {MAX_LINE} bytes"),
    }
}

/// Parses and carries out one request, whichever transport it came by.
async fn respond(line: &[u8], node: &NodeHandle, shutdown: &Notify) -> Response {
    match serde_json::from_slice::<Request>(line) {
        Ok(req) => execute(req, node, shutdown).await,
        Err(e) => {
            node.count_error("control_request");
            warn!(error = %e, "bad control request");
            Response::Error {
                message: format!("bad request: {e}"),
            }
        }
    }
}

fn encode(resp: &Response) -> Vec<u8> {
    let mut out = serde_json::to_vec(resp)
        .unwrap_or_else(|e| format!("{{\"result\":\"error\",\"message\":\"{e}\"}}").into_bytes());
    out.push(b'\n');
    out
}

/// QUIC close code of a control connection without the operator certificate.
pub const CLOSE_NOT_OPERATOR: u32 = 0x10;

/// Serves the control API on a QUIC connection that negotiated
/// [`exanet_control::tls::ALPN_CONTROL`]: one request per bidirectional stream (the request, then
/// the stream's end; the response, then its end). The TLS handshake already proved the
/// peer holds a certificate of the rack CA; only the operator's is accepted here.
pub async fn serve_quic(conn: quinn::Connection, node: Arc<NodeHandle>, shutdown: Arc<Notify>) {
    let remote = conn.remote_address();
    let certs = conn.peer_identity().and_then(|a| {
        a.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    });
    if !certs.is_some_and(|c| exanet_control::tls::cert_is_for(&c, exanet_control::tls::OPERATOR)) {
        node.count_error("control_refused");
        warn!(%remote, "control connection refused: not the rack's operator certificate");
        conn.close(
            quinn::VarInt::from_u32(CLOSE_NOT_OPERATOR),
            b"the control API needs the rack's operator certificate",
        );
        return;
    }
    debug!(%remote, "operator connected");
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        let (node, shutdown, conn) = (node.clone(), shutdown.clone(), conn.clone());
        tokio::spawn(async move {
            let resp = match recv.read_to_end(MAX_LINE).await {
                Ok(line) => match serde_json::from_slice::<Request>(&line)
                    .ok()
                    .and_then(|r| capture_ask(&node, r))
                {
                    // The one request whose answer is a stream.
                    Some(ask) => {
                        let gone = async move {
                            conn.closed().await;
                        };
                        if stream_capture(&node, ask, &mut send, gone).await {
                            let _ = send.finish();
                            // Let the summary reach the operator before the stream goes.
                            let _ = send.stopped().await;
                        }
                        return;
                    }
                    None => respond(&line, &node, &shutdown).await,
                },
                Err(quinn::ReadToEndError::TooLong) => too_long(&node),
                Err(e) => {
                    debug!(error = %e, "control stream failed");
                    return;
                }
            };
            if send.write_all(&encode(&resp)).await.is_ok() {
                let _ = send.finish();
            }
        });
    }
}

async fn execute(req: Request, node: &NodeHandle, shutdown: &Notify) -> Response {
    let shape = node.rack.shape();
    let err = |message: String| Response::Error { message };
    match req {
        Request::Status => Response::Status(Box::new(node.status())),
        Request::Ping {
            dst,
            count,
            timeout_ms,
        } => {
            let dst = match shape.parse_node(&dst) {
                Ok(d) => d,
                Err(e) => return err(e.to_string()),
            };
            let timeout = Duration::from_millis(timeout_ms.clamp(1, 60_000));
            match node.ping(dst, count, timeout).await {
                Ok(r) => Response::Ping(r),
                Err(e) => err(e.to_string()),
            }
        }
        Request::Load {
            dsts,
            cells,
            payload,
        } => {
            let mut ids = Vec::with_capacity(dsts.len());
            for d in &dsts {
                match shape.parse_node(d) {
                    Ok(id) => ids.push(id),
                    Err(e) => return err(e.to_string()),
                }
            }
            match node.start_load(&ids, cells, payload) {
                Ok(()) => Response::Ok,
                Err(e) => err(e.to_string()),
            }
        }
        Request::LinkSet { peer, faults, seed } => {
            let peer = match shape.parse_node(&peer) {
                Ok(d) => d,
                Err(e) => return err(e.to_string()),
            };
            match node.set_link_faults(peer, faults, seed) {
                Ok(()) => {
                    tracing::info!(peer = %shape.display(peer), ?faults, "link faults set");
                    Response::Ok
                }
                Err(e) => err(e.to_string()),
            }
        }
        Request::LinkClear => {
            node.clear_link_faults();
            tracing::info!("link faults cleared");
            Response::Ok
        }
        Request::Capture { .. } => err(
            "a capture streams its records: ask over the QUIC control API (exactl capture)".into(),
        ),
        Request::Shutdown => {
            shutdown.notify_one();
            Response::Ok
        }
    }
}

/// The longest a capture runs without a duration: a forgotten one must not tap forever.
const CAPTURE_MAX: Duration = Duration::from_secs(24 * 3600);

/// A capture asked for: its tap (or what is wrong with the request) and when it ends.
struct CaptureAsk {
    spec: Result<TapSpec, String>,
    count: Option<u64>,
    duration_ms: Option<u64>,
}

/// The capture `req` asks for, if it is a capture request.
fn capture_ask(node: &NodeHandle, req: Request) -> Option<CaptureAsk> {
    let Request::Capture {
        count, duration_ms, ..
    } = req
    else {
        return None;
    };
    Some(CaptureAsk {
        spec: capture_spec(node, req),
        count,
        duration_ms,
    })
}

/// Turns a capture request's fields into a tap, or says what is wrong with them.
fn capture_spec(node: &NodeHandle, req: Request) -> Result<TapSpec, String> {
    let Request::Capture {
        peers,
        rx,
        tx,
        cell_type,
        pdid,
        dst,
        count,
        ..
    } = req
    else {
        return Err("not a capture request".into());
    };
    let shape = node.rack.shape();
    let links = node.links();
    let mut ports = Vec::new();
    for p in &peers {
        let id = shape.parse_node(p).map_err(|e| e.to_string())?;
        let port = links
            .iter()
            .find(|(_, peer, ..)| *peer == id)
            .map(|(port, ..)| *port)
            .ok_or_else(|| {
                format!(
                    "{p} is not a neighbour of {} (no link between them)",
                    node.name
                )
            })?;
        ports.push(port);
    }
    if !rx && !tx {
        return Err("a capture of neither received nor sent cells takes nothing".into());
    }
    if count == Some(0) {
        return Err("count must be at least 1".into());
    }
    let kind = match cell_type {
        None => None,
        Some(t) => Some(CellType::from_label(&t).ok_or_else(|| {
            format!(
                "unknown cell type {t:?} (one of: {})",
                CellType::ALL.map(|k| k.label()).join(", ")
            )
        })?),
    };
    let dst = match dst {
        None => None,
        Some(d) => Some(shape.parse_node(&d).map_err(|e| e.to_string())?),
    };
    Ok(TapSpec {
        ports: (!ports.is_empty()).then_some(ports),
        rx,
        tx,
        filter: CaptureFilter {
            kind,
            pdid: pdid.map(Pdid),
            dst,
        },
        count,
    })
}

/// Answers a capture: the response line, the records as they come (batched into one
/// write when several are queued), then the end mark and the summary. Returns when the
/// capture is over or the operator stops reading; the tap goes with it.
/// Returns whether the answer was written whole (the caller then ends the stream).
async fn stream_capture<W: tokio::io::AsyncWrite + Unpin>(
    node: &NodeHandle,
    ask: CaptureAsk,
    send: &mut W,
    gone: impl std::future::Future<Output = ()>,
) -> bool {
    // A capture that matches nothing never writes, so a failed write cannot be what
    // tells it the operator left: it watches the connection.
    tokio::pin!(gone);
    let CaptureAsk {
        spec,
        count,
        duration_ms,
    } = ask;
    use exanet_control::control::capture_stream::END;
    use exanet_control::control::CaptureSummary;
    let spec = match spec {
        Ok(s) => s,
        Err(message) => {
            node.count_error("control_request");
            return send
                .write_all(&encode(&Response::Error { message }))
                .await
                .is_ok();
        }
    };
    if send.write_all(&encode(&Response::Ok)).await.is_err() {
        return false;
    }
    tracing::info!(
        ports = ?spec.ports,
        rx = spec.rx,
        tx = spec.tx,
        ?count,
        ?duration_ms,
        "capture started"
    );
    let mut cap = node.taps.start(spec);
    let limit = duration_ms
        .map_or(CAPTURE_MAX, Duration::from_millis)
        .min(CAPTURE_MAX);
    let deadline = tokio::time::Instant::now() + limit;
    let mut sent = 0u64;
    let mut batch = Vec::new();
    let done = |sent: u64| count.is_some_and(|c| sent >= c);
    while !done(sent) {
        let first = tokio::select! {
            r = cap.records.recv() => r,
            () = tokio::time::sleep_until(deadline) => {
                // What was queued before the deadline still goes out; nothing after it.
                cap.close();
                cap.records.try_recv().ok()
            }
            () = &mut gone => {
                tracing::info!(sent, "capture over: the operator left");
                return false;
            }
        };
        let Some(first) = first else { break };
        batch.clear();
        let mut next = Some(first);
        while let Some((wall, rec)) = next.take() {
            batch.extend_from_slice(&(rec.len() as u32).to_be_bytes());
            batch.extend_from_slice(&wall.to_be_bytes());
            batch.extend_from_slice(&rec);
            sent += 1;
            if done(sent) || batch.len() > 256 * 1024 {
                break;
            }
            next = cap.records.try_recv().ok();
        }
        if send.write_all(&batch).await.is_err() {
            debug!(sent, "capture reader gone");
            return false;
        }
    }
    let summary = CaptureSummary {
        captured: sent,
        dropped: cap.dropped(),
    };
    drop(cap);
    tracing::info!(
        captured = summary.captured,
        dropped = summary.dropped,
        "capture over"
    );
    let mut tail = END.to_be_bytes().to_vec();
    tail.extend_from_slice(&serde_json::to_vec(&summary).unwrap_or_default());
    tail.push(b'\n');
    send.write_all(&tail).await.is_ok() && send.flush().await.is_ok()
}
