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
            node.count_error("control_request");
            Response::Error {
                message: format!("request longer than {MAX_LINE} bytes"),
            }
        } else {
            match serde_json::from_str::<Request>(&line) {
                Ok(req) => execute(req, node, shutdown).await,
                Err(e) => {
                    node.count_error("control_request");
                    warn!(error = %e, "bad control request");
                    Response::Error {
                        message: format!("bad request: {e}"),
                    }
                }
            }
        };
        let mut out = serde_json::to_vec(&resp).unwrap_or_else(|e| {
            format!("{{\"result\":\"error\",\"message\":\"{e}\"}}").into_bytes()
        });
        out.push(b'\n');
        w.write_all(&out).await?;
        if line.len() > MAX_LINE {
            return Ok(());
        }
    }
}

async fn execute(req: Request, node: &NodeHandle, shutdown: &Notify) -> Response {
    let shape = node.rack.shape();
    let err = |message: String| Response::Error { message };
    match req {
        Request::Status => Response::Status(node.status()),
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
        Request::Shutdown => {
            shutdown.notify_one();
            Response::Ok
        }
    }
}
