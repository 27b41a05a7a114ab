//! The daemon side of the control interface (see [`crate::control`] for the protocol).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::control::{Request, Response, MAX_LINE};
use crate::node::NodeHandle;

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
/// [`crate::tls::ALPN_CONTROL`]: one request per bidirectional stream (the request, then
/// the stream's end; the response, then its end). The TLS handshake already proved the
/// peer holds a certificate of the rack CA; only the operator's is accepted here.
pub async fn serve_quic(conn: quinn::Connection, node: Arc<NodeHandle>, shutdown: Arc<Notify>) {
    let remote = conn.remote_address();
    let certs = conn.peer_identity().and_then(|a| {
        a.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    });
    if !certs.is_some_and(|c| crate::tls::cert_is_for(&c, crate::tls::OPERATOR)) {
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
        let (node, shutdown) = (node.clone(), shutdown.clone());
        tokio::spawn(async move {
            let resp = match recv.read_to_end(MAX_LINE).await {
                Ok(line) => respond(&line, &node, &shutdown).await,
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
        Request::Shutdown => {
            shutdown.notify_one();
            Response::Ok
        }
    }
}
