//! Cells in modeled order on a rack of daemons (`[model] order = "modeled"`). A daemon
//! sees only itself, so the link horizons come from consistent cuts of the rack
//! (`exanet_proto::horizon`): the daemon of the rack's first node runs the
//! [`Coordinator`], and every daemon, that one included, keeps a QUIC connection to it
//! (ALPN `exanet-cuts/4`, the rack's certificates). A daemon begins each cut it is told
//! to (its station sends the markers), sends its part once complete, and applies the
//! horizons it gets back. The coordinator starts the next cut while anything was pending
//! in the last one, and otherwise waits for a daemon to say it has work.
//!
//! Messages are bincode, each after its length (u32, big-endian).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use exanet_proto::horizon::{Begin, Coordinator, NodeCut};
use exanet_proto::{ModelTime, NodeId, Port};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use rustls::pki_types::CertificateDer;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::node::{AfterPump, NodeHandle};

/// The longest message: a node's part carries at most 64 busy intervals per port.
const MAX_MESSAGE: usize = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
enum ToCoordinator {
    /// The first message: which node this is (its certificate must say the same).
    Hello {
        node: u32,
    },
    Part(NodeCut),
    /// The node has work and the last horizons said nothing was pending.
    Wake,
}

#[derive(Debug, Serialize, Deserialize)]
enum FromCoordinator {
    /// Begin cut `epoch`, waiting for the markers of the ports in `waits` (bit per port
    /// index): the neighbours in the cut.
    Begin { epoch: u64, waits: u16 },
    Horizons {
        horizons: Vec<(Port, ModelTime)>,
        pending: bool,
    },
}

async fn write_msg<T: Serialize>(send: &mut SendStream, m: &T) -> Result<(), String> {
    let body = bincode::serialize(m).map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(&body);
    send.write_all(&buf).await.map_err(|e| e.to_string())
}

/// Writes what comes on the returned sender to `send`, in order, until the stream fails.
fn spawn_writer<T: Serialize + Send + Sync + 'static>(
    mut send: SendStream,
) -> (mpsc::UnboundedSender<T>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if write_msg(&mut send, &m).await.is_err() {
                return;
            }
        }
    });
    (tx, writer)
}

/// `e` and what caused it: quinn's "connection lost" alone does not say whether the
/// peer closed, reset or went silent past the idle timeout.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(&format!(": {c}"));
        cause = c.source();
    }
    out
}

/// The next message; `None` when the peer closed the stream.
async fn read_msg<T: DeserializeOwned>(recv: &mut RecvStream) -> Result<Option<T>, String> {
    let mut len = [0u8; 4];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(with_causes(&e)),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(format!("message of {len} B is over {MAX_MESSAGE} B"));
    }
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body)
        .await
        .map_err(|e| with_causes(&e))?;
    bincode::deserialize(&body)
        .map(Some)
        .map_err(|e| format!("undecodable message: {e}"))
}

/// A daemon's side of the connection, kept in its core: where its parts and wake-ups go.
struct CutLink {
    tx: mpsc::UnboundedSender<ToCoordinator>,
}

impl AfterPump for CutLink {
    /// After the station ran: its part of the cut, once complete, goes to the coordinator,
    /// and work that appeared while the rack was idle wakes it.
    fn after_pump(&mut self, station: &mut exanet_proto::Station) {
        if let Some(part) = station.take_cut() {
            debug!(
                epoch = part.epoch,
                busy = part.busy,
                "part of a cut complete"
            );
            let _ = self.tx.send(ToCoordinator::Part(part));
        }
        if station.take_wake() {
            let _ = self.tx.send(ToCoordinator::Wake);
        }
    }
}

/// Keeps this daemon connected to the coordinator for as long as it runs.
pub async fn node_loop(node: Arc<NodeHandle>, endpoint: Endpoint, client: quinn::ClientConfig) {
    let shape = node.rack.shape();
    let first = NodeId(0);
    let name = shape.display(first);
    let addr = node.rack.entry(first).link.clone();
    let mut backoff = Duration::from_millis(50);
    loop {
        match crate::link::dial_once(&endpoint, &client, &addr, &name).await {
            Ok((conn, send, recv)) => {
                backoff = Duration::from_millis(50);
                info!(coordinator = %name, "cut coordinator connected");
                let e = run_node(&node, send, recv).await;
                node.lock().cuts = None;
                conn.close(0u32.into(), b"");
                warn!(coordinator = %name, error = %e, "cut coordinator lost");
            }
            Err(e) => debug!(coordinator = %name, error = %e, "cannot reach the cut coordinator"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn run_node(node: &Arc<NodeHandle>, mut send: SendStream, mut recv: RecvStream) -> String {
    let hello = ToCoordinator::Hello { node: node.id.0 };
    if let Err(e) = write_msg(&mut send, &hello).await {
        return e;
    }
    let (tx, writer) = spawn_writer(send);
    {
        let now = node.now();
        let mut core = node.lock();
        core.cuts = Some(Box::new(CutLink { tx }));
        // Work that came before the connection wakes the coordinator now.
        core.station.assume_rack_idle();
        core.pump(now);
    }
    let why = loop {
        let m = match read_msg::<FromCoordinator>(&mut recv).await {
            Ok(Some(m)) => m,
            Ok(None) => break "the coordinator closed the connection".to_string(),
            Err(e) => break e,
        };
        let now = node.now();
        let mut core = node.lock();
        match m {
            FromCoordinator::Begin { epoch, waits } => {
                // A process that attaches from now on starts its clock no earlier: what
                // it posts cannot go before this cut.
                let floor = Some(crate::ni_service::attach_clock());
                core.station.node_mut().ni_mut().0.set_attach_floor(floor);
                core.station.begin_cut(epoch, waits, now);
            }
            FromCoordinator::Horizons { horizons, pending } => {
                core.station.set_horizons(&horizons, pending);
            }
        }
        core.pump(now);
    };
    writer.abort();
    why
}

/// What a node left out of a cut started now promises: no process attaches there with an
/// earlier start than the wall clock (the daemons' clocks are the host's; on hosts whose
/// clocks differ, a process's first posts may come late, and are counted).
fn floor() -> Option<ModelTime> {
    Some(crate::ni_service::attach_clock())
}

/// The coordinator, on the rack's first node.
pub struct CoordinatorHandle {
    state: Mutex<State>,
}

struct State {
    coordinator: Coordinator,
    /// Each node's connection, once it said hello, with the number it joined under.
    nodes: Vec<Option<(u64, mpsc::UnboundedSender<FromCoordinator>)>>,
    /// The number the next connection joins under.
    joins: u64,
}

impl State {
    /// Node `id` said hello on a new connection: it takes the place of any earlier one.
    /// Returns the number the connection joined under.
    fn connect(&mut self, id: NodeId, tx: mpsc::UnboundedSender<FromCoordinator>) -> u64 {
        self.joins += 1;
        let n = self.joins;
        self.nodes[id.0 as usize] = Some((n, tx));
        let begins = self.coordinator.join(id, floor());
        self.begin(begins);
        n
    }

    /// The connection node `id` joined under as `n` ended. The node is gone only if no
    /// newer connection took its place: on a loaded host a node notices a lost connection
    /// and is back on a new one before the coordinator notices the old one end, and taking
    /// that end for the node's leaving left the node connected and never told of a cut
    /// again, and the rack with no cut for ever (every cut needs every part). False when
    /// a newer connection holds the place.
    fn disconnect(&mut self, id: NodeId, n: u64) -> bool {
        let slot = &mut self.nodes[id.0 as usize];
        if slot.as_ref().is_none_or(|(held, _)| *held != n) {
            return false;
        }
        *slot = None;
        self.coordinator.leave(id);
        true
    }

    /// Tells each node the coordinator named to begin its cut.
    fn begin(&self, begins: Vec<Begin>) {
        if let Some(b) = begins.first() {
            debug!(epoch = b.epoch, nodes = begins.len(), "cut begun");
        }
        for b in begins {
            if let Some((_, tx)) = &self.nodes[b.node.0 as usize] {
                let _ = tx.send(FromCoordinator::Begin {
                    epoch: b.epoch,
                    waits: b.waits,
                });
            }
        }
    }
}

impl CoordinatorHandle {
    pub fn new(
        shape: exanet_proto::Shape,
    ) -> Result<CoordinatorHandle, exanet_proto::routing::RouteError> {
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let coordinator = Coordinator::new(shape)?.numbering_after(now_us);
        Ok(CoordinatorHandle {
            state: Mutex::new(State {
                coordinator,
                nodes: (0..shape.nodes()).map(|_| None).collect(),
                joins: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts completed.
    pub fn cuts(&self) -> u64 {
        self.lock().coordinator.cuts()
    }

    /// Serves one daemon's connection until it closes.
    pub async fn serve(self: Arc<Self>, node: Arc<NodeHandle>, conn: Connection) {
        let remote = conn.remote_address();
        match self.serve_conn(&node, &conn).await {
            Ok(()) => debug!(%remote, "cut connection closed"),
            Err(e) => {
                warn!(%remote, error = %e, "cut connection refused or broken");
                node.count_error("cut_connection");
            }
        }
    }

    async fn serve_conn(&self, node: &Arc<NodeHandle>, conn: &Connection) -> Result<(), String> {
        let (send, mut recv) = conn.accept_bi().await.map_err(|e| e.to_string())?;
        let Some(ToCoordinator::Hello { node: id }) = read_msg(&mut recv).await? else {
            return Err("the first message was not a hello".into());
        };
        let shape = node.rack.shape();
        if id >= shape.nodes() {
            return Err(format!("hello names node {id}, not in the rack"));
        }
        let id = NodeId(id);
        let claimed = shape.display(id);
        let certs = conn
            .peer_identity()
            .and_then(|a| a.downcast::<Vec<CertificateDer<'static>>>().ok());
        if !certs.is_some_and(|c| exanet_control::tls::cert_is_for(&c, &claimed)) {
            return Err(format!("certificate is not issued for {claimed}"));
        }
        let (tx, writer) = spawn_writer(send);
        let joined = self.lock().connect(id, tx);
        debug!(node = %claimed, "joined the cuts");
        let r = loop {
            let m = match read_msg::<ToCoordinator>(&mut recv).await {
                Ok(Some(m)) => m,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            let mut st = self.lock();
            match m {
                ToCoordinator::Hello { .. } => break Err("a second hello".into()),
                ToCoordinator::Wake => {
                    let begins = st.coordinator.wake(id, floor());
                    st.begin(begins);
                }
                ToCoordinator::Part(part) => match st.coordinator.report(id, part, floor()) {
                    Ok(r) => {
                        if let Some(h) = r.horizons {
                            debug!(
                                epoch = h.epoch,
                                pending = h.pending,
                                nodes = h.by_node.len(),
                                "cut complete"
                            );
                            let pending = h.pending;
                            for (node, horizons) in h.by_node {
                                if let Some((_, tx)) = &st.nodes[node.0 as usize] {
                                    let _ =
                                        tx.send(FromCoordinator::Horizons { horizons, pending });
                                }
                            }
                        }
                        st.begin(r.begins);
                    }
                    // A part of a cut given up (a node reconnected): the next one counts.
                    Err(e) => debug!(node = %claimed, error = %e, "part not taken"),
                },
            }
        };
        writer.abort();
        if !self.lock().disconnect(id, joined) {
            debug!(node = %claimed, "an old cut connection ended after its new one joined");
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exanet_proto::Shape;

    fn part(epoch: u64) -> NodeCut {
        NodeCut {
            epoch,
            busy: false,
            relays: false,
            ports: Vec::new(),
            quiet: false,
            sent: 0,
        }
    }

    /// A node back on a new connection before the coordinator saw its old one end: the
    /// old one's end must not take the node out of the cuts (it did, and the rack took
    /// no cut again). The cut its return started completes with every node's part.
    #[test]
    fn an_old_connection_ending_late_leaves_its_node_in_the_cuts() {
        let shape: Shape = "1x1x1".parse().unwrap();
        let handle = CoordinatorHandle::new(shape).unwrap();
        let mut st = handle.lock();
        let nodes = shape.nodes();
        // The receivers are kept so that what the coordinator sends them is not refused.
        let mut _receivers = Vec::new();
        let mut joined = Vec::new();
        for id in 0..nodes {
            let (tx, r) = mpsc::unbounded_channel();
            joined.push(st.connect(NodeId(id), tx));
            _receivers.push(r);
        }
        // A node has work: a cut begins.
        let first = st.coordinator.wake(NodeId(0), None);
        assert!(!first.is_empty(), "no cut began");
        let first_epoch = first[0].epoch;
        st.begin(first);
        // Node 0 comes back on a new connection with the cut under way; its old
        // connection ends only then. Its return gives the cut up and starts a newer one.
        let (tx, mut back) = mpsc::unbounded_channel();
        let again = st.connect(NodeId(0), tx);
        let epoch = match back.try_recv() {
            Ok(FromCoordinator::Begin { epoch, .. }) if epoch > first_epoch => epoch,
            other => panic!("the node's return started no newer cut: {other:?}"),
        };
        assert!(
            !st.disconnect(NodeId(0), joined[0]),
            "the old connection took the place"
        );
        let mut done = None;
        for id in 0..nodes {
            done = st
                .coordinator
                .report(NodeId(id), part(epoch), None)
                .unwrap()
                .horizons;
        }
        assert!(done.is_some(), "the cut did not complete with every part");
        // The node's new connection ending does take it out.
        assert!(st.disconnect(NodeId(0), again));
    }
}
