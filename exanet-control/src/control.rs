//! The control interface of a daemon: JSON lines over a Unix socket in the rack directory
//! (`run/<NODE>.sock`). One request per line, one response line per request.
//!
//! ```text
//! {"op":"status"}
//! {"op":"ping","dst":"M1QBF2","count":3,"timeout_ms":1000}
//! {"op":"load","dsts":["M1QAF2"],"cells":100000,"payload":256}
//! {"op":"link_set","peer":"M1QAF2","faults":{"delay_ns":200000,"loss":0.01}}
//! {"op":"link_clear"}
//! {"op":"shutdown"}
//! ```
//!
//! The socket is created mode 0600: only the rack's owner can operate it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exanet_proto::fault::{FaultStats, LinkFaults};
use exanet_proto::metric::{LinkStats, NiStats};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest request line a daemon reads; anything longer is refused.
pub const MAX_LINE: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Status,
    /// Probe `dst` from this node's switch `count` times, one after the other.
    Ping {
        dst: String,
        count: u32,
        timeout_ms: u64,
    },
    /// Inject synthetic load cells round-robin to `dsts` (benchmarks, saturation).
    Load {
        dsts: Vec<String>,
        cells: u64,
        payload: usize,
    },
    /// Set the faults on what this node sends to its neighbour `peer` (replacing any set
    /// before). `seed` restarts the fault draws, for reproducible fault plans.
    LinkSet {
        peer: String,
        faults: LinkFaults,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seed: Option<u64>,
    },
    /// Clear the faults of every link of this node, setting cut links up again.
    LinkClear,
    /// Capture the cells crossing this node's links. Unlike every other request the
    /// answer is a stream: the response line, then the captured records as they come,
    /// then a [`CaptureSummary`] (see [`capture_stream`] for the format). The capture ends
    /// after `count` records or `duration_ms`, whichever comes first, or when the operator
    /// stops reading.
    Capture {
        /// The neighbours whose links are captured; empty: every link of the node.
        #[serde(default)]
        peers: Vec<String>,
        /// Cells the node receives from those links.
        #[serde(default = "yes")]
        rx: bool,
        /// Cells the node sends on them.
        #[serde(default = "yes")]
        tx: bool,
        /// Only cells of this type (its label, e.g. `write`, `ack`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cell_type: Option<String>,
        /// Only cells whose destination GVAS has this PDID.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pdid: Option<u16>,
        /// Only cells whose destination GVAS names this node.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dst: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
    Shutdown,
}

fn yes() -> bool {
    true
}

/// How a capture ended, sent after its last record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSummary {
    /// Records sent.
    pub captured: u64,
    /// Cells that matched but were not recorded because the capture could not keep up
    /// (the fabric never waits for a capture).
    pub dropped: u64,
}

/// The byte stream of a capture's answer, after its response line: records, each
/// `u32` length (of the record), `u64` wall-clock time in nanoseconds since the Unix
/// epoch, and the record ([`exanet_proto::capture::Record`]); then [`END`](capture_stream::END)
/// in place of a length and the [`CaptureSummary`] as one JSON line. All big-endian.
pub mod capture_stream {
    /// The length that ends the records.
    pub const END: u32 = u32::MAX;
    /// The longest record: a capture header and the largest cell.
    pub const MAX_RECORD: u32 =
        (exanet_proto::capture::RECORD_HEADER_LEN + exanet_proto::cell::MAX_CELL) as u32;
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Boxed: a status is far larger than every other answer.
    Status(Box<NodeStatus>),
    Ping(PingReport),
    Ok,
    Error {
        message: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    Up,
    Down,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkStatus {
    /// This node's port (`f2`, `x+`, ...).
    pub port: String,
    pub peer: String,
    /// `qfdb`, `torus_x`, `torus_y`, `torus_z`.
    pub kind: String,
    pub gbps: u32,
    pub state: LinkState,
    /// Link sessions established so far (1 + reconnects).
    pub sessions: u64,
    pub tx_cells: u64,
    pub tx_bytes: u64,
    pub rx_cells: u64,
    pub rx_bytes: u64,
    pub stall_seconds: f64,
    pub queue_cells: u64,
    pub queue_bytes: u64,
    pub in_flight_bytes: u64,
    /// Set down by the operator (`exactl link set --down`, `exactl partition`).
    #[serde(default)]
    pub admin_down: bool,
    /// Faults set on what this node sends over the link; absent when clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<LinkFaults>,
    /// What the fault injector did so far on this direction.
    #[serde(default)]
    pub fault_stats: FaultStats,
    /// Bytes held back by delay or rate right now.
    #[serde(default)]
    pub held_bytes: u64,
    /// What the link end counted, each under its own key.
    #[serde(default, flatten)]
    pub counters: LinkStats,
    /// Modeled time this node's output to the link spent sending, seconds: against the
    /// node's `modeled_time_seconds`, the link's modeled utilization.
    #[serde(default)]
    pub modeled_busy_seconds: f64,
    /// Transport statistics of the QUIC connection carrying the link, while it is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<QuicStats>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuicStats {
    pub rtt_us: f64,
    pub cwnd: u64,
    pub mtu: u16,
    pub sent_packets: u64,
    pub lost_packets: u64,
    pub congestion_events: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    pub id: u32,
    pub shape: String,
    pub pid: u32,
    pub uptime_seconds: f64,
    /// Times this node's daemon was started again after it died on its own, as whoever
    /// restarted it counted (exactl's supervisor); 0 for a daemon started by hand.
    #[serde(default)]
    pub restarts: u64,
    pub links: Vec<LinkStatus>,
    pub forwarded_cells: u64,
    pub injected_cells: u64,
    pub delivered_cells: u64,
    pub load_tx_cells: u64,
    pub load_rx_cells: u64,
    pub load_rx_bytes: u64,
    pub errors: BTreeMap<String, u64>,
    /// The node's modeled clock, seconds: the latest modeled time a cell left its switch.
    #[serde(default)]
    pub modeled_time_seconds: f64,
    /// Cells the switch forwarded out of modeled order (modeled order only).
    #[serde(default)]
    pub late_cells: u64,
    /// The network interface: attached workloads and protocol counters.
    #[serde(default)]
    pub ni: NiStatus,
    /// Records copied to captures over the daemon's life (`dropped`: not kept up with).
    #[serde(default)]
    pub capture: CaptureSummary,
    /// Collectives the node's workloads reported, by job, kind and path: each job's own,
    /// so that what one job reports (workloads can report anything) moves only its own.
    #[serde(default)]
    pub collectives: Vec<JobCollectives>,
}

/// What the workloads of one job reported of one kind of collective on one path.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobCollectives {
    pub job: String,
    #[serde(flatten)]
    pub report: exanet_proto::attach::CollectiveReport,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NiStatus {
    pub attached: u32,
    /// The NI's counters, each under its own name (NACKs as a map from reason to count):
    /// declared once, in exanet-proto's metric catalog, with the family each feeds.
    #[serde(flatten)]
    pub counters: NiStats,
    /// Who is attached, by rank, and what each holds.
    pub workloads: Vec<WorkloadStatus>,
    /// What no job may take from its owner (`exanet_proto::reserved`).
    pub reserved: Vec<exanet_proto::reserved::Reservation>,
}

/// One attached workload: its job and process, and what it holds of the node's NI.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkloadStatus {
    pub rank: u8,
    pub job: String,
    pub pdid: u16,
    pub pid: i32,
    pub uid: u32,
    pub rdma_pages: u32,
    pub packetizers: u32,
    pub mailboxes: u32,
    pub registered_bytes: u64,
}

impl NodeStatus {
    pub fn links_up(&self) -> usize {
        self.links
            .iter()
            .filter(|l| l.state == LinkState::Up)
            .count()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PingReport {
    pub src: String,
    pub dst: String,
    /// Node names from `src` to `dst`, as recorded by the fabric.
    pub path: Vec<String>,
    /// Node names from `dst` back to `src`.
    pub back: Vec<String>,
    /// Links crossed from `src` to `dst`.
    pub hops: usize,
    /// Median round trip of the probes that came back, microseconds.
    pub rtt_us: f64,
    pub rtts_us: Vec<f64>,
    pub sent: u32,
    pub received: u32,
    pub truncated: bool,
}

#[derive(Debug, Error)]
pub enum ControlError {
    #[error("cannot reach the daemon at {path}: {source} (is the rack up?)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control connection to {path} failed: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("daemon at {path} sent a bad response: {message}")]
    Protocol { path: PathBuf, message: String },
    #[error("cannot reach {node} at {addr}: {message} (is the rack up?)")]
    Unreachable {
        node: String,
        addr: String,
        message: String,
    },
    #[error("control request to {node} at {addr} failed: {message}")]
    Remote {
        node: String,
        addr: String,
        message: String,
    },
    #[error("operator credentials: {0}")]
    Credentials(String),
}

/// Sends one request to the daemon listening on `sock` and waits up to `timeout`.
pub fn request(sock: &Path, req: &Request, timeout: Duration) -> Result<Response, ControlError> {
    let io = |source| ControlError::Io {
        path: sock.to_path_buf(),
        source,
    };
    let mut s = UnixStream::connect(sock).map_err(|source| ControlError::Connect {
        path: sock.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = serde_json::to_vec(req).map_err(|e| ControlError::Protocol {
        path: sock.to_path_buf(),
        message: e.to_string(),
    })?;
    line.push(b'\n');
    s.write_all(&line).map_err(io)?;
    let mut reader = BufReader::new(s);
    let mut resp = String::new();
    reader.read_line(&mut resp).map_err(io)?;
    if resp.is_empty() {
        return Err(ControlError::Protocol {
            path: sock.to_path_buf(),
            message: "connection closed without a response".into(),
        });
    }
    serde_json::from_str(&resp).map_err(|e| ControlError::Protocol {
        path: sock.to_path_buf(),
        message: e.to_string(),
    })
}
