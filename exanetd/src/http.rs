//! A small HTTP/1.1 endpoint for Prometheus and health checks: `GET /metrics`,
//! `GET /health` (the daemon is serving) and `GET /ready` (every link is up). Requests
//! are read with a size limit and a timeout; anything else gets 404 or 400.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::metrics::Metrics;
use crate::node::NodeHandle;

const MAX_REQUEST: usize = 8192;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn serve(listener: TcpListener, node: Arc<NodeHandle>, metrics: Arc<Metrics>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (node, metrics) = (node.clone(), metrics.clone());
        tokio::spawn(async move {
            if let Err(e) = handle(stream, &node, &metrics).await {
                debug!(%peer, error = %e, "http request failed");
            }
        });
    }
}

async fn handle(mut s: TcpStream, node: &NodeHandle, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = tokio::time::timeout(READ_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok::<_, std::io::Error>(Some(p));
            }
            if buf.len() > MAX_REQUEST {
                return Ok(None);
            }
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head timeout"))??;
    let Some(end) = head_end else {
        return respond(&mut s, "400 Bad Request", "text/plain", "bad request\n").await;
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut s, "405 Method Not Allowed", "text/plain", "GET only\n").await;
    }
    match path.split('?').next().unwrap_or("") {
        "/metrics" => {
            let body = metrics.render(&node.status());
            respond(&mut s, "200 OK", "text/plain; version=0.0.4", &body).await
        }
        "/health" => {
            let body = format!("{{\"node\":\"{}\",\"status\":\"serving\"}}\n", node.name);
            respond(&mut s, "200 OK", "application/json", &body).await
        }
        "/ready" => {
            let st = node.status();
            let (up, all) = (st.links_up(), st.links.len());
            let body = format!(
                "{{\"node\":\"{}\",\"links_up\":{up},\"links\":{all}}}\n",
                st.node
            );
            let code = if up == all {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            respond(&mut s, code, "application/json", &body).await
        }
        _ => respond(&mut s, "404 Not Found", "text/plain", "not found\n").await,
    }
}

async fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}
