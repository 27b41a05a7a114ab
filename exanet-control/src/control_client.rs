//! The operator's side of the control API over QUIC (served by exanetd's `control_server`):
//! what `exactl` uses to reach every daemon of a rack, wherever it runs (local processes,
//! containers, other hosts). It presents the operator certificate of the rack directory
//! (`tls/exactl.pem`) and checks that each daemon holds its node's certificate.
//!
//! The client is blocking so that the CLI stays simple; it owns a small runtime that
//! drives the QUIC endpoint, and keeps one connection per daemon for as long as it
//! lives (`exactl top` asks every second; a fresh handshake each time would cost more
//! than the question).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use exanet_proto::NodeId;
use tokio::task::JoinSet;

use crate::control::{CaptureSummary, ControlError, Request, Response};
use crate::rack::{dns_name, Rack};
use crate::tls::{NodeTls, ALPN_CONTROL, OPERATOR};

/// Largest response read; a status of a node with every counter set is a few KiB.
const MAX_RESPONSE: usize = 4 << 20;

pub struct ControlClient {
    rt: tokio::runtime::Runtime,
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    rack: Rack,
    conns: Mutex<HashMap<NodeId, quinn::Connection>>,
}

impl ControlClient {
    /// A client for `rack`, with the operator credentials of its directory.
    pub fn new(rack: &Rack) -> Result<ControlClient, ControlError> {
        let tls = NodeTls::load(&rack.layout(), OPERATOR)
            .map_err(|e| ControlError::Credentials(e.to_string()))?;
        let config = tls
            .client_config(ALPN_CONTROL)
            .map_err(|e| ControlError::Credentials(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| ControlError::Credentials(format!("cannot start a runtime: {e}")))?;
        let endpoint = rt
            .block_on(async { quinn::Endpoint::client(SocketAddr::from(([0, 0, 0, 0], 0))) })
            .map_err(|e| ControlError::Credentials(format!("cannot open a UDP socket: {e}")))?;
        Ok(ControlClient {
            rt,
            endpoint,
            config,
            rack: rack.clone(),
            conns: Mutex::new(HashMap::new()),
        })
    }

    pub fn rack(&self) -> &Rack {
        &self.rack
    }

    /// Sends `req` to `node` and waits up to `timeout` for the answer.
    pub fn request(
        &self,
        node: NodeId,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, ControlError> {
        self.request_all(vec![(node, req.clone())], timeout)
            .pop()
            .unwrap_or_else(|| Err(self.failed(node, "no answer".into())))
    }

    /// Sends each request to its node, all at once; the answers come back in order.
    pub fn request_all(
        &self,
        reqs: Vec<(NodeId, Request)>,
        timeout: Duration,
    ) -> Vec<Result<Response, ControlError>> {
        let n = reqs.len();
        self.rt.block_on(async {
            let mut set = JoinSet::new();
            for (i, (node, req)) in reqs.into_iter().enumerate() {
                let conn = self.cached(node);
                let target = self.target(node);
                let (endpoint, config) = (self.endpoint.clone(), self.config.clone());
                set.spawn(async move {
                    let r = tokio::time::timeout(
                        timeout,
                        ask(endpoint, config, target.clone(), conn, req),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(Failure::Unreachable(format!(
                            "no answer within {} ms",
                            timeout.as_millis()
                        )))
                    });
                    (i, node, target, r)
                });
            }
            let mut out: Vec<Option<Result<Response, ControlError>>> =
                (0..n).map(|_| None).collect();
            while let Some(joined) = set.join_next().await {
                let Ok((i, node, target, r)) = joined else {
                    continue;
                };
                out[i] = Some(match r {
                    Ok((resp, conn)) => {
                        self.keep(node, conn);
                        Ok(resp)
                    }
                    Err(f) => {
                        self.forget(node);
                        Err(f.into_error(&target))
                    }
                });
            }
            out.into_iter()
                .map(|r| r.unwrap_or_else(|| Err(ControlError::Credentials("task lost".into()))))
                .collect()
        })
    }

    /// Runs a capture on `node` (`req` is a [`Request::Capture`]): hands each record, with
    /// its wall-clock time (ns since the Unix epoch), to `on_record` until the daemon
    /// ends the capture, `on_record` returns false, or `stop` completes (Ctrl-C, say).
    /// Returns the daemon's summary, or, when the operator stopped first, what was
    /// received (the daemon's drop count is then unknown, and reported as 0).
    pub fn capture(
        &self,
        node: NodeId,
        req: &Request,
        stop: impl std::future::Future<Output = ()>,
        on_record: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<CaptureSummary, ControlError> {
        let target = self.target(node);
        let body = serde_json::to_vec(req).map_err(|e| self.failed(node, e.to_string()))?;
        self.rt.block_on(async {
            let conn = match self.cached(node) {
                Some(c) => c,
                None => connect(&self.endpoint, &self.config, &target)
                    .await
                    .map_err(|f| f.into_error(&target))?,
            };
            let fail = |m: String| self.failed(node, m);
            let (mut send, recv) = conn.open_bi().await.map_err(|e| fail(e.to_string()))?;
            send.write_all(&body)
                .await
                .map_err(|e| fail(e.to_string()))?;
            send.finish().map_err(|e| fail(e.to_string()))?;
            let r = read_capture(tokio::io::BufReader::new(recv), stop, on_record).await;
            self.keep(node, conn);
            r.map_err(fail)
        })
    }

    fn target(&self, node: NodeId) -> Target {
        Target {
            name: self.rack.shape().display(node),
            addr: self.rack.entry(node).link.clone(),
        }
    }

    fn failed(&self, node: NodeId, message: String) -> ControlError {
        let t = self.target(node);
        ControlError::Remote {
            node: t.name,
            addr: t.addr,
            message,
        }
    }

    fn cached(&self, node: NodeId) -> Option<quinn::Connection> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .get(&node)
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    fn keep(&self, node: NodeId, conn: quinn::Connection) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.insert(node, conn);
    }

    fn forget(&self, node: NodeId) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.remove(&node);
    }
}

impl Drop for ControlClient {
    fn drop(&mut self) {
        self.endpoint.close(quinn::VarInt::from_u32(0), b"done");
    }
}

#[derive(Clone)]
struct Target {
    name: String,
    addr: String,
}

enum Failure {
    /// No connection could be made.
    Unreachable(String),
    /// Connected, but the request failed.
    Request(String),
}

impl Failure {
    fn into_error(self, t: &Target) -> ControlError {
        let (node, addr) = (t.name.clone(), t.addr.clone());
        match self {
            Failure::Unreachable(message) => ControlError::Unreachable {
                node,
                addr,
                message,
            },
            Failure::Request(message) => ControlError::Remote {
                node,
                addr,
                message,
            },
        }
    }
}

async fn connect(
    endpoint: &quinn::Endpoint,
    config: &quinn::ClientConfig,
    t: &Target,
) -> Result<quinn::Connection, Failure> {
    let sa = tokio::net::lookup_host(&t.addr)
        .await
        .map_err(|e| Failure::Unreachable(format!("cannot resolve: {e}")))?
        .next()
        .ok_or_else(|| Failure::Unreachable("resolves to nothing".into()))?;
    endpoint
        .connect_with(config.clone(), sa, &dns_name(&t.name))
        .map_err(|e| Failure::Unreachable(e.to_string()))?
        .await
        .map_err(|e| match e {
            // The daemon answered but refused us: that is not "is it up?".
            quinn::ConnectionError::ApplicationClosed(c) => {
                Failure::Request(format!("refused: {}", String::from_utf8_lossy(&c.reason)))
            }
            quinn::ConnectionError::ConnectionClosed(c) => Failure::Request(format!(
                "refused in the TLS handshake: {c} (is this the rack's operator certificate?)"
            )),
            e => Failure::Unreachable(e.to_string()),
        })
}

/// One request on one stream, over the cached connection if it still works, else a new one.
async fn ask(
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    t: Target,
    cached: Option<quinn::Connection>,
    req: Request,
) -> Result<(Response, quinn::Connection), Failure> {
    let body = serde_json::to_vec(&req).map_err(|e| Failure::Request(e.to_string()))?;
    if let Some(conn) = cached {
        if let Ok(resp) = exchange(&conn, &body).await {
            return Ok((resp, conn));
        }
        // The daemon restarted or the connection idled out: try once afresh.
    }
    let conn = connect(&endpoint, &config, &t).await?;
    let resp = exchange(&conn, &body).await?;
    Ok((resp, conn))
}

async fn exchange(conn: &quinn::Connection, body: &[u8]) -> Result<Response, Failure> {
    let lost = |e: &dyn std::fmt::Display| match conn.close_reason() {
        Some(quinn::ConnectionError::ApplicationClosed(c)) => {
            Failure::Request(format!("refused: {}", String::from_utf8_lossy(&c.reason)))
        }
        _ => Failure::Request(e.to_string()),
    };
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
    send.write_all(body).await.map_err(|e| lost(&e))?;
    send.finish().map_err(|e| lost(&e))?;
    let bytes = recv.read_to_end(MAX_RESPONSE).await.map_err(|e| lost(&e))?;
    serde_json::from_slice(&bytes).map_err(|e| Failure::Request(format!("bad response: {e}")))
}

/// Reads one JSON line (up to [`crate::control::MAX_LINE`]) into `out`, without the newline.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut limited = AsyncReadExt::take(r, crate::control::MAX_LINE as u64);
    let n = limited
        .read_until(b'\n', out)
        .await
        .map_err(|e| e.to_string())?;
    if n == 0 || out.last() != Some(&b'\n') {
        return Err("the stream ended inside a line".into());
    }
    out.pop();
    Ok(())
}

/// Runs a capture over a daemon's control socket (a local rack: the same stream as over
/// QUIC, without its encryption, which would cost the host as much as the link it taps).
/// As [`ControlClient::capture`] otherwise.
pub fn capture_local(
    socket: &std::path::Path,
    req: &Request,
    stop: impl std::future::Future<Output = ()>,
    on_record: impl FnMut(u64, &[u8]) -> bool,
) -> Result<CaptureSummary, String> {
    use tokio::io::AsyncWriteExt;
    let mut body = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    body.push(b'\n');
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    rt.block_on(async {
        let mut s = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
        s.write_all(&body).await.map_err(|e| e.to_string())?;
        read_capture(tokio::io::BufReader::new(s), stop, on_record).await
    })
    .map_err(|e| format!("{e} (control socket {})", socket.display()))
}

/// Reads a capture's answer (see [`crate::control::capture_stream`]).
async fn read_capture<R: tokio::io::AsyncBufRead + Unpin>(
    mut recv: R,
    stop: impl std::future::Future<Output = ()>,
    mut on_record: impl FnMut(u64, &[u8]) -> bool,
) -> Result<CaptureSummary, String> {
    use crate::control::capture_stream::{END, MAX_RECORD};
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    read_line(&mut recv, &mut line)
        .await
        .map_err(|e| format!("no answer to the capture: {e}"))?;
    match serde_json::from_slice::<Response>(&line) {
        Ok(Response::Ok) => {}
        Ok(Response::Error { message }) => return Err(message),
        Ok(other) => return Err(format!("unexpected answer {other:?}")),
        Err(e) => return Err(format!("bad answer: {e}")),
    }
    let mut captured = 0u64;
    let mut record = Vec::new();
    let reading = async {
        loop {
            let len = recv.read_u32().await.map_err(|e| e.to_string())?;
            if len == END {
                line.clear();
                read_line(&mut recv, &mut line).await?;
                return serde_json::from_slice::<CaptureSummary>(&line)
                    .map(Some)
                    .map_err(|e| format!("bad capture summary: {e}"));
            }
            if len > MAX_RECORD {
                return Err(format!(
                    "record of {len} B is longer than any capture record ({MAX_RECORD} B)"
                ));
            }
            let wall = recv.read_u64().await.map_err(|e| e.to_string())?;
            record.resize(len as usize, 0);
            recv.read_exact(&mut record)
                .await
                .map_err(|e| e.to_string())?;
            captured += 1;
            if !on_record(wall, &record) {
                return Ok(None);
            }
        }
    };
    let summary = tokio::select! {
        r = reading => r.map_err(|e| format!("capture stream: {e}"))?,
        () = stop => None,
    };
    Ok(summary.unwrap_or(CaptureSummary {
        captured,
        dropped: 0,
    }))
}
