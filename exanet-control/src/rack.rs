//! The rack file (`rack.toml`) and the rack directory layout.
//!
//! A rack directory holds everything about one virtual rack:
//!
//! ```text
//! rack.toml          the rack file (below)
//! tls/ca.pem         the rack CA certificate (tls/ca.key: its key, kept by exactl)
//! tls/<NODE>.pem     each node's certificate, signed by the CA, valid for DNS name <node>
//! tls/<NODE>.key     its private key
//! run/<NODE>.sock    each daemon's control socket
//! run/<NODE>.pid     pid of each local daemon
//! run/memory-budget.toml  registered memory the host's daemons may hold ([`MemoryBudget`])
//! run/memory-ledger  what each of them holds (exanetd's `host_budget`)
//! logs/<NODE>.log    each local daemon's log
//! ```
//!
//! The rack file:
//!
//! ```toml
//! name = "exanet-rack"      # rack identity: daemons of different racks never link
//! shape = "2x2x1"           # QFDBs along X, Y, Z
//! window = 262144           # emulator in-flight window per link and VC, bytes
//! local_window = 65536      # NI injection / delivery buffer, bytes
//! link_timeout_s = 10       # a link whose peer is silent this long is down (3..=600)
//!
//! [nodes.M1QAF1]
//! link = "127.0.0.1:21000"      # QUIC address neighbours dial (host names allowed)
//! metrics = "127.0.0.1:22000"   # HTTP: /metrics, /health, /ready
//! # listen = "0.0.0.0:21000"    # optional: bind address when it differs from `link`
//! # metrics_listen = "0.0.0.0:22000"
//!
//! [ni]                          # NI protocol settings (all optional)
//! window_blocks = 32            # RDMA blocks of a transfer in flight (16 KB each)
//! rank_window_blocks = 256      # ... of all transfers reading one rank's memory
//! retransmit_us = 5000          # wait for an ACK before sending again (doubles per try)
//! max_attempts = 14             # tries per message or block before failing (absent:
//!                               #   the fewest outlasting link_timeout_s + 1 s: 14 at 10 s)
//! rank_max_rdma_pages = 8       # what one attached process may hold (defaults shown)
//! rank_max_packetizers = 32
//! rank_max_mailboxes = 32
//! rank_max_registered_mib = 4096
//! job_host_memory_percent = 50  # share of the host's registered-memory budget one job
//!                               # may hold over all its nodes (default 50, or 100 when
//!                               # the rack has a single job; docs/operating.md)
//! mpi_eager_limit = 32          # longest MPI message sent eager by the libfabric provider
//!
//! [jobs.default]                # the job of workloads that attach without a key
//! pdid = 1                      # (this is also what applies when no default is given)
//! [jobs.alice]
//! key_sha256 = "9f86d0...0f00a08"   # SHA-256 (hex) of the key that admits workloads
//! # key = "a-long-random-secret"    # or the key itself (the rack file is world-readable)
//! pdid = 42
//! uid = [1001]                  # only processes of these users or groups may attach
//! gid = [1001]                  # (absent: only the daemon's own user and root)
//! max_ranks = 6                 # what the job may hold on one node (defaults shown; a
//!                               # rack with a single job lets it hold the whole node)
//! max_rdma_pages = 12
//! max_packetizers = 48
//! max_mailboxes = 48
//! max_registered_mib = 8192
//!
//! [model]                       # the modeled hardware (all optional; the report's figures
//! qfdb_link_gbps = 16.0         # shown): link rates, Gb/s
//! torus_link_gbps = 10.0
//! qfdb_link_ns = 120.0          # link latencies, ns
//! torus_link_ns = 120.0
//! router_ns = 145.0             # a QFDB router traversal (a torus port involved), ns
//! switch_ns = 13.333            # any other switch traversal (2 cycles at 150 MHz), ns
//! torus_control_bytes = 80      # control data the routing logic between QFDBs sends
//!                               #   after each cell on a torus link (report §6.1.2)
//! ni_gbps = 19.2                # the NI's datapath (128 bit x 150 MHz)
//! input_buffer = 4096           # bytes per link input and VC
//! cpu_ni_ns = 125.0             # a CPU <-> NI request
//! mem_write_ns = 50.0           # the NI writing what arrived to memory
//! ack_ns = 13.333               # generating a block ACK/NACK
//! retransmit_ns = 100000.0      # the NI's retransmission timer, modeled
//! software_ns = 0.0             # software cost per send/receive call
//! memory_contention = 0.0       # compute longer by this per other rank of the node, for
//!                               #   the MPSoC's one memory channel (`exactl mpirun
//!                               #   --modeled`, several ranks per node)
//! mpi_software_ns = 418.0       # ... of an MPI library's call: `exactl mpirun --modeled`
//!                               #   gives its ranks this (default: software_ns if set,
//!                               #   else 418, the report's intra-FPGA MPI row's)
//! accel_setup_ns = 3000.0       # programming the allreduce accelerator, per operation
//! compute_scale = 1.0           # share of host compute time counted as modeled time
//! order = "host"                # "modeled": switches serve cells in modeled-time order,
//!                               # from cuts of the rack (docs/modeled-time.md); slower
//!
//! [deploy]                      # optional: what runs the daemons (default: local processes)
//! kind = "compose"              # local | compose | external
//! project = "exanet-2x2x1"      # compose: the project name
//! file = "../docker-compose.yml"  # compose: the compose file, relative to the rack dir
//! ```
//!
//! Every node of the shape has a `[nodes.NAME]` table, and only those.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use exanet_proto::model::{Model, ModelError, ModelParams};
use exanet_proto::{NodeId, Shape, SwitchConfig};
use exanet_proto::{DEFAULT_LOCAL_WINDOW, DEFAULT_WINDOW, MIN_WINDOW};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::ip::IpSettings;
use crate::quota::{JobQuota, RankQuota};

pub const RACK_FILE: &str = "rack.toml";
pub const DEFAULT_RACK_DIR: &str = "exanet-rack";
/// The environment variable naming the rack directory when no `--rack` does.
pub const ENV_RACK: &str = "EXANET_RACK";

#[derive(Debug, Error)]
pub enum RackError {
    #[error("cannot read rack file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad rack file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("bad rack file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// A `[model]` setting out of range; the message names the field.
    #[error("bad rack file {path}: {source}")]
    Model { path: PathBuf, source: ModelError },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How to reach one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// `host:port` neighbours dial (UDP, QUIC).
    pub link: String,
    /// `host:port` of the HTTP metrics and health endpoint.
    pub metrics: String,
    /// Bind address for the QUIC endpoint, when it differs from `link` (containers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Bind address for the HTTP endpoint, when it differs from `metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
}

impl NodeEntry {
    pub fn link_bind(&self) -> &str {
        self.listen.as_deref().unwrap_or(&self.link)
    }
    pub fn metrics_bind(&self) -> &str {
        self.metrics_listen.as_deref().unwrap_or(&self.metrics)
    }
}

/// A link whose peer has been silent this long is down (a peer that exits cleanly closes
/// its links at once; this is for peers that die or hang), unless the rack file says
/// otherwise (`link_timeout_s`).
/// The software cost of an MPI call that reproduces the report's 0 B MPI one-way between
/// two ranks of one MPSoC (1.17 us, section 6.1.2) over the modeled NI: a calibration, on
/// that one row only (docs/modeled-time.md, "Fidelity").
pub const REPORT_MPI_SOFTWARE_NS: f64 = 418.0;

/// The default memory-channel contention: none. It would be calibrated on the report's
/// LAMMPS weak scaling at four ranks of one MPSoC (89%, section 6.2), but on the 2-core
/// host it was measured on the rack already falls below that without it (the host's own
/// shared cores inflate four ranks' CPU time), so nothing is added (docs/study.md).
pub const REPORT_MEMORY_CONTENTION: f64 = 0.0;

pub const DEFAULT_LINK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The link timeouts a rack file may set, in seconds.
pub const LINK_TIMEOUT_S: std::ops::RangeInclusive<u32> = 3..=600;

fn default_window() -> u32 {
    DEFAULT_WINDOW
}
fn default_local_window() -> u32 {
    DEFAULT_LOCAL_WINDOW
}

/// Not `Eq`: `[model]` holds real numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackFile {
    pub name: String,
    pub shape: Shape,
    #[serde(default = "default_window")]
    pub window: u32,
    #[serde(default = "default_local_window")]
    pub local_window: u32,
    /// Seconds of silence from a link's peer after which the link is down; absent: 10
    /// (`DEFAULT_LINK_TIMEOUT`). Keep-alives go at under a third of it, and
    /// they are an idle rack's main cost: a large rack on few cores may want more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_timeout_s: Option<u32>,
    pub nodes: BTreeMap<String, NodeEntry>,
    /// NI protocol settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ni: Option<NiSettings>,
    /// Protection domains workloads may join, by job name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<String, Job>,
    /// IP over ExaNet: the rack's subnet, from which each node's address derives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpSettings>,
    /// The modeled hardware: rates, latencies and costs of modeled time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSettings>,
    /// What runs the daemons, for the operations that start and stop them (`exactl node`).
    /// Absent: local processes started by `exactl rack up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy: Option<Deploy>,
}

/// What runs a rack's daemons. exactl talks to every daemon over the network whatever
/// runs them; only starting, stopping and pausing a node depend on this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Deploy {
    /// One process per node on this host (`exactl rack up`).
    Local,
    /// One container per node, service named after the node, in a compose project.
    Compose {
        /// The compose project name (`docker-compose -p`).
        project: String,
        /// The compose file, relative to the rack directory.
        file: String,
    },
    /// Daemons run by something exactl does not drive (swarm, Kubernetes, systemd on
    /// hosts): node operations are refused with a pointer to that tool.
    External {
        /// Shown to the operator: how nodes of this rack are started and stopped.
        how: String,
    },
}

impl RackFile {
    /// A rack file of `shape` with these node entries, default windows, and no NI
    /// settings, jobs or deploy section.
    pub fn new(name: &str, shape: Shape, nodes: BTreeMap<String, NodeEntry>) -> RackFile {
        RackFile {
            name: name.to_string(),
            shape,
            window: DEFAULT_WINDOW,
            local_window: DEFAULT_LOCAL_WINDOW,
            link_timeout_s: None,
            nodes,
            ni: None,
            jobs: BTreeMap::new(),
            ip: None,
            model: None,
            deploy: None,
        }
    }

    /// A rack of `shape` whose nodes all listen on loopback, `ports(id)` giving each
    /// node's (link, metrics) ports, with default windows and no jobs or NI settings.
    pub fn loopback(
        name: &str,
        shape: Shape,
        mut ports: impl FnMut(NodeId) -> (u16, u16),
    ) -> RackFile {
        let nodes = shape
            .node_ids()
            .map(|id| {
                let (link, metrics) = ports(id);
                (
                    shape.display(id),
                    NodeEntry {
                        link: format!("127.0.0.1:{link}"),
                        metrics: format!("127.0.0.1:{metrics}"),
                        listen: None,
                        metrics_listen: None,
                    },
                )
            })
            .collect();
        RackFile::new(name, shape, nodes)
    }
}

/// A job: the protection domain its workloads get, who may join it, and what it may hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// The key that admits workloads, in clear. The rack file is world-readable (daemons of
    /// other users read it), so `key_sha256` is the better choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The SHA-256 of the key, in hex: the rack file then holds no secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sha256: Option<String>,
    pub pdid: u16,
    /// Users whose processes may attach to this job (`SO_PEERCRED` of the attach socket).
    /// With neither `uid` nor `gid`, only the daemon's own user and root may.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uid: Vec<u32>,
    /// Groups (the process's primary group) whose processes may attach to this job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gid: Vec<u32>,
    #[serde(flatten)]
    pub quota: JobQuota,
}

/// The rack's NI protocol settings; absent fields keep their defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NiSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_blocks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_window_blocks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmit_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u8>,
    /// What one attached process may hold ([`crate::quota::RANK_DEFAULTS`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_max_rdma_pages: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_max_packetizers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_max_mailboxes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_max_registered_mib: Option<u64>,
    /// Percent of the host's registered-memory budget ([`MemoryBudget`]) one job may hold
    /// over all its nodes on the host, 1..=100 ([`RackFile::job_host_memory_percent`]
    /// when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_host_memory_percent: Option<u8>,
    /// Longest message the libfabric provider sends eager, in one packetizer message;
    /// longer ones go by rendezvous ([`DEFAULT_MPI_EAGER_LIMIT`] when absent, at most
    /// [`MPI_EAGER_MAX`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi_eager_limit: Option<u32>,
}

/// ExaNet-MPI's eager limit (report §5.2.1): messages up to 32 bytes go in one packetizer
/// message.
pub const DEFAULT_MPI_EAGER_LIMIT: u32 = 32;
/// What the provider's eager message carries at most: a 64-byte packetizer message less
/// its 24-byte header (`exanet-fi`'s wire format; a test there checks the two agree).
pub const MPI_EAGER_MAX: u32 = 40;

/// The NI's retransmission floor (real time) when cells are served in modeled order: when
/// it first looks whether a copy is due. Whether one goes is the model's to say (a copy
/// waits until its answer can no longer come first in modeled time), so looking sooner
/// sends no more copies; a cell truly lost costs this much wall clock. It was 2 s, and a
/// ping-pong over a link losing 5% of its cells gave up (two losses of one exchange took
/// its 10 s reply timeout).
pub const ORDERED_RETRANSMIT_NS: u64 = 100_000_000;

/// How long, in real time, an NI in modeled order goes on sending copies (its retry
/// budget, unless `[ni] max_attempts` says otherwise): blocks wait for the rack's cuts in
/// real time, seconds each on a loaded 128-node rack, and a send must not fail for that.
/// About what a 2 s floor gave with the NI's default attempts (382 s); receivers remember
/// what finished for twice as long (`NiConfig::keep_ns`).
pub const ORDERED_RETRY_NS: u64 = 300_000_000_000;

/// `[model]` in the rack file: the parameters of the modeled hardware
/// ([`ModelParams`], whose documentation gives each one's source), in its units (rates in
/// Gb/s, times in nanoseconds, the input buffer in bytes). Absent fields keep the
/// report's figures ([`ModelParams::default`]); [`Rack::new`] checks the result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qfdb_link_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torus_link_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qfdb_link_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torus_link_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch_ns: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torus_control_bytes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ni_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_buffer: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ni_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_write_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retransmit_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub software_ns: Option<f64>,
    /// The software cost of an MPI library's call, which `exactl mpirun --modeled` gives
    /// its ranks (`EXANET_SOFTWARE_NS`): absent, `software_ns` if set, else
    /// [`REPORT_MPI_SOFTWARE_NS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi_software_ns: Option<f64>,
    /// How much longer a rank's compute takes per other rank of its node, for their one
    /// memory channel, under `exactl mpirun --modeled` (`EXANET_MEMORY_CONTENTION`):
    /// absent, [`REPORT_MEMORY_CONTENTION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_contention: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accel_setup_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_scale: Option<f64>,
    /// In which order switches serve competing cells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<CellOrder>,
}

/// In which order switches serve cells that compete for an output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellOrder {
    /// The order the host delivers them in: as fast as the host goes, but contended
    /// figures depend on scheduling.
    #[default]
    Host,
    /// Modeled-time order, from consistent cuts of the rack gathered by the first node's
    /// daemon: the same figures on every run, at the cost of the cuts.
    Modeled,
}

impl ModelSettings {
    /// The parameters these settings give: each field set, else its default.
    pub fn params(&self) -> ModelParams {
        let d = ModelParams::default();
        ModelParams {
            qfdb_link_gbps: self.qfdb_link_gbps.unwrap_or(d.qfdb_link_gbps),
            torus_link_gbps: self.torus_link_gbps.unwrap_or(d.torus_link_gbps),
            qfdb_link_ns: self.qfdb_link_ns.unwrap_or(d.qfdb_link_ns),
            torus_link_ns: self.torus_link_ns.unwrap_or(d.torus_link_ns),
            router_ns: self.router_ns.unwrap_or(d.router_ns),
            switch_ns: self.switch_ns.unwrap_or(d.switch_ns),
            torus_control_bytes: self.torus_control_bytes.unwrap_or(d.torus_control_bytes),
            ni_gbps: self.ni_gbps.unwrap_or(d.ni_gbps),
            input_buffer: self.input_buffer.unwrap_or(d.input_buffer),
            cpu_ni_ns: self.cpu_ni_ns.unwrap_or(d.cpu_ni_ns),
            mem_write_ns: self.mem_write_ns.unwrap_or(d.mem_write_ns),
            ack_ns: self.ack_ns.unwrap_or(d.ack_ns),
            retransmit_ns: self.retransmit_ns.unwrap_or(d.retransmit_ns),
            software_ns: self.software_ns.unwrap_or(d.software_ns),
            accel_setup_ns: self.accel_setup_ns.unwrap_or(d.accel_setup_ns),
            compute_scale: self.compute_scale.unwrap_or(d.compute_scale),
        }
    }
}

impl RackFile {
    /// How long a link's peer may be silent before the link is down.
    pub fn link_timeout(&self) -> std::time::Duration {
        self.link_timeout_s.map_or(DEFAULT_LINK_TIMEOUT, |s| {
            std::time::Duration::from_secs(u64::from(s))
        })
    }
}

impl RackFile {
    /// Percent of the host's registered-memory budget one job may hold: `[ni]
    /// job_host_memory_percent`, else half when the rack names jobs beside the default one
    /// (so no job can lock the others out of the host's memory), and all of it when the
    /// default job is the only one (the total still protects the host).
    pub fn job_host_memory_percent(&self) -> u8 {
        let set = self.ni.as_ref().and_then(|ni| ni.job_host_memory_percent);
        let jobs = self.jobs.len() + usize::from(!self.jobs.contains_key("default"));
        set.unwrap_or(if jobs > 1 { 50 } else { 100 })
    }
}

/// What the daemons of one host may register together, as `rack up` measured the host
/// (`run/memory-budget.toml`). Each daemon derives its limits from it and keeps what it
/// holds in the ledger beside it (exanetd's `host_budget` module, docs/operating.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryBudget {
    /// Registered memory of every job together, the IP services' included.
    pub total_bytes: u64,
    /// Of `total_bytes`, what only the IP services may take: what `rack up` counted for
    /// their rings, so that no job can deny a node IP over ExaNet.
    pub ip_bytes: u64,
    /// What `rack up` measured (memory available to it) and counted for the rack itself,
    /// for the operator reading the file.
    #[serde(default)]
    pub available_bytes: u64,
    #[serde(default)]
    pub rack_bytes: u64,
}

impl MemoryBudget {
    /// Percent of the memory available to the rack, after what the rack itself takes, that
    /// registered memory may take in all (docs/operating.md says why three quarters).
    pub const AVAILABLE_PERCENT: u64 = 75;

    /// What one job other than the IP service's may hold on the host: `percent` of what
    /// the jobs share.
    pub fn per_job(&self, percent: u8) -> u64 {
        let shared = self.total_bytes.saturating_sub(self.ip_bytes);
        // In u128: a percent of a byte count near u64::MAX must not overflow.
        (u128::from(shared) * u128::from(percent.min(100)) / 100) as u64
    }

    /// Reads `path`; `Ok(None)` when there is none (a rack not brought up by `rack up`, a
    /// container, a host whose memory `rack up` could not read).
    pub fn read(path: &Path) -> Result<Option<MemoryBudget>, RackError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(RackError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let b: MemoryBudget = toml::from_str(&text).map_err(|e| RackError::Parse {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })?;
        if b.ip_bytes > b.total_bytes {
            return Err(RackError::Invalid {
                path: path.to_path_buf(),
                message: "ip_bytes is more than total_bytes".into(),
            });
        }
        Ok(Some(b))
    }

    /// Writes `path` (through a new file renamed over it: a daemon starting meanwhile
    /// reads the old figures or the new, never half of them).
    pub fn write(&self, path: &Path) -> Result<(), RackError> {
        let err = |source| RackError::Write {
            path: path.to_path_buf(),
            source,
        };
        let text = toml::to_string(self).map_err(|e| RackError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let tmp = path.with_extension("toml.new");
        std::fs::write(
            &tmp,
            format!(
                "# Written by `exactl rack up`: registered memory the daemons of this host may \
                 hold (docs/operating.md).\n{text}"
            ),
        )
        .map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }
}

impl RackFile {
    /// The modeled hardware's parameters: `[model]`, defaults where absent.
    pub fn model_params(&self) -> ModelParams {
        self.model.unwrap_or_default().params()
    }
}

impl Job {
    /// Who may attach to this job: its `uid`/`gid` lists, or, with neither, the daemon's
    /// own user and root (what the owner-only socket allowed before jobs could name
    /// users).
    pub fn may_join(&self, peer_uid: u32, peer_gid: u32, daemon_uid: u32) -> bool {
        if self.uid.is_empty() && self.gid.is_empty() {
            return peer_uid == daemon_uid || peer_uid == 0;
        }
        self.uid.contains(&peer_uid) || self.gid.contains(&peer_gid)
    }
}

impl NiSettings {
    /// The `rank_max_*` settings: what one attached process may hold.
    pub fn rank_quota(&self) -> RankQuota {
        RankQuota {
            max_rdma_pages: self.rank_max_rdma_pages,
            max_packetizers: self.rank_max_packetizers,
            max_mailboxes: self.rank_max_mailboxes,
            max_registered_mib: self.rank_max_registered_mib,
        }
    }
}

/// PDID of the default job when the rack file names none.
pub const DEFAULT_PDID: u16 = 1;

fn ip_key_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A validated rack file with its node table keyed by node id.
#[derive(Clone, Debug)]
pub struct Rack {
    pub dir: PathBuf,
    pub file: RackFile,
    nodes: Vec<NodeEntry>,
    /// `[model]`, checked.
    model: Model,
}

impl Rack {
    pub fn load(dir: &Path) -> Result<Rack, RackError> {
        let path = dir.join(RACK_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| RackError::Read {
            path: path.clone(),
            source,
        })?;
        let file: RackFile = toml::from_str(&text).map_err(|e| RackError::Parse {
            path: path.clone(),
            message: e.message().to_string(),
        })?;
        if let Err(source) = file.model_params().model() {
            return Err(RackError::Model { path, source });
        }
        Rack::new(dir, file).map_err(|message| RackError::Invalid { path, message })
    }

    /// Validates a rack file: every node of the shape present exactly once, windows sane,
    /// the modeled hardware's parameters in range.
    pub fn new(dir: &Path, file: RackFile) -> Result<Rack, String> {
        if file.name.is_empty() {
            return Err("name is empty".into());
        }
        let model = file.model_params().model().map_err(|e| e.to_string())?;
        if let Some(c) = file.model.as_ref().and_then(|m| m.memory_contention) {
            if !(c.is_finite() && (0.0..=10.0).contains(&c)) {
                return Err(format!(
                    "[model] memory_contention = {c}: a fraction from 0 to 10"
                ));
            }
        }
        if let Some(ns) = file.model.as_ref().and_then(|m| m.mpi_software_ns) {
            if !(ns.is_finite() && (0.0..=1e9).contains(&ns)) {
                return Err(format!(
                    "[model] mpi_software_ns = {ns}: a cost per call is 0 to 1e9 ns"
                ));
            }
        }
        if let Some(t) = file.link_timeout_s {
            if !LINK_TIMEOUT_S.contains(&t) {
                return Err(format!(
                    "link_timeout_s = {t}: a link timeout is {} to {} seconds",
                    LINK_TIMEOUT_S.start(),
                    LINK_TIMEOUT_S.end()
                ));
            }
        }
        for (what, w) in [("window", file.window), ("local_window", file.local_window)] {
            if w < MIN_WINDOW {
                return Err(format!(
                    "{what} = {w} cannot hold one {MIN_WINDOW}-byte cell"
                ));
            }
            if w > 1 << 30 {
                return Err(format!("{what} = {w} is over 1 GiB"));
            }
        }
        if let Some(ni) = &file.ni {
            if let Some(e) = ni.mpi_eager_limit.filter(|&e| e > MPI_EAGER_MAX) {
                return Err(format!(
                    "ni.mpi_eager_limit = {e}: an eager message carries at most \
                     {MPI_EAGER_MAX} bytes"
                ));
            }
            if ni.window_blocks.is_some_and(|w| !(1..=4096).contains(&w)) {
                return Err("ni.window_blocks must be 1..=4096".into());
            }
            let window = ni
                .window_blocks
                .map_or(exanet_proto::ni::NiConfig::default().window_blocks, |w| {
                    w as usize
                });
            if let Some(r) = ni.rank_window_blocks {
                if !(1..=65_536).contains(&r) {
                    return Err("ni.rank_window_blocks must be 1..=65536".into());
                }
                if (r as usize) < window {
                    return Err(format!(
                        "ni.rank_window_blocks = {r} is below the window of one transfer \
                         ({window} blocks): no transfer could fill its window"
                    ));
                }
            }
            if ni
                .retransmit_us
                .is_some_and(|t| !(10..=60_000_000).contains(&t))
            {
                return Err("ni.retransmit_us must be 10..=60000000".into());
            }
            if ni.max_attempts.is_some_and(|a| !(1..=100).contains(&a)) {
                return Err("ni.max_attempts must be 1..=100".into());
            }
            if ni
                .job_host_memory_percent
                .is_some_and(|p| !(1..=100).contains(&p))
            {
                return Err("ni.job_host_memory_percent must be 1..=100".into());
            }
        }
        let mut pdids = BTreeMap::new();
        let mut keys = BTreeMap::new();
        let ip_pdid = crate::ip::pdid(file.ip.as_ref());
        if ip_pdid == 0 {
            return Err("ip.pdid: PDID 0 is reserved for the fabric's own cells".into());
        }
        let ip_job = crate::ip::JOB_NAME.to_string();
        pdids.insert(ip_pdid, &ip_job);
        if file.jobs.contains_key(crate::ip::JOB_NAME) {
            return Err(format!(
                "job {}: the name is the IP service's ([ip] in the rack file)",
                crate::ip::JOB_NAME
            ));
        }
        if let Some(h) = file.ip.as_ref().and_then(|i| i.key_sha256.as_deref()) {
            if crate::quota::parse_digest(h).is_none() {
                return Err("ip.key_sha256 is not 64 hex digits".into());
            }
        }
        for (name, job) in &file.jobs {
            if job.pdid == 0 {
                return Err(format!(
                    "job {name}: PDID 0 is reserved for the fabric's own cells"
                ));
            }
            if let Some(other) = pdids.insert(job.pdid, name) {
                return Err(format!(
                    "jobs {other} and {name} have the same PDID {}: they would share one \
                     protection domain",
                    job.pdid
                ));
            }
            if job.key.is_some() && job.key_sha256.is_some() {
                return Err(format!("job {name}: give key or key_sha256, not both"));
            }
            let digest = match (&job.key, &job.key_sha256) {
                (Some(k), None) if !k.is_empty() => Some(crate::quota::key_digest(k)),
                (None, Some(h)) => Some(
                    crate::quota::parse_digest(h)
                        .ok_or_else(|| format!("job {name}: key_sha256 is not 64 hex digits"))?,
                ),
                _ => None,
            };
            match digest {
                None if name != "default" => {
                    return Err(format!(
                        "job {name}: a job other than `default` needs a key (or key_sha256)"
                    ))
                }
                None => {}
                Some(d) => {
                    if let Some(other) = keys.insert(d, name) {
                        return Err(format!(
                            "jobs {other} and {name} have the same key: a workload could not \
                             say which it means"
                        ));
                    }
                }
            }
            crate::quota::Limits::check_job(&job.quota).map_err(|e| format!("job {name}: {e}"))?;
        }
        if let Some(ni) = &file.ni {
            crate::quota::Limits::check_rank(&ni.rank_quota()).map_err(|e| format!("ni.{e}"))?;
        }
        crate::ip::check(crate::ip::subnet(file.ip.as_ref()), &file.shape)
            .map_err(|e| e.to_string())?;
        let mtu = crate::ip::mtu(file.ip.as_ref());
        if !(68..=65535).contains(&mtu) {
            return Err(crate::ip::IpError::Mtu(mtu).to_string());
        }
        let shape = file.shape;
        let mut nodes: Vec<Option<NodeEntry>> = vec![None; shape.nodes() as usize];
        for (name, entry) in &file.nodes {
            let id = shape.parse_node(name).map_err(|e| e.to_string())?;
            let canon = shape.display(id);
            if nodes[id.0 as usize].is_some() {
                return Err(format!("node {canon} is listed twice"));
            }
            for (what, addr) in [("link", &entry.link), ("metrics", &entry.metrics)] {
                check_addr(addr).map_err(|e| format!("node {canon}: {what} {e}"))?;
            }
            nodes[id.0 as usize] = Some(entry.clone());
        }
        let missing: Vec<String> = shape
            .node_ids()
            .filter(|id| nodes[id.0 as usize].is_none())
            .map(|id| shape.display(id))
            .collect();
        if !missing.is_empty() {
            let more = if missing.len() > 5 { ", ..." } else { "" };
            return Err(format!(
                "{} node(s) of the {shape} rack have no [nodes.NAME] entry: {}{more}",
                missing.len(),
                missing[..missing.len().min(5)].join(", ")
            ));
        }
        Ok(Rack {
            dir: dir.to_path_buf(),
            file,
            nodes: nodes.into_iter().map(|n| n.expect("checked")).collect(),
            model,
        })
    }

    /// The rack's IP subnet (see [`crate::ip`]).
    pub fn ip_subnet(&self) -> ipnet::Ipv4Net {
        crate::ip::subnet(self.file.ip.as_ref())
    }

    /// Makes sure the rack has a key for the IP service's job: the key in `tls/ip.key`
    /// (readable by the rack's owner only) and its SHA-256 in `[ip] key_sha256` of the rack
    /// file. Returns whether it made one (the rack file was then rewritten: daemons started
    /// before read the old one).
    pub fn ensure_ip_key(&mut self) -> std::io::Result<bool> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.layout().ip_key();
        let have = self.file.ip.as_ref().and_then(|i| i.key_sha256.clone());
        if let (Some(h), Ok(key)) = (&have, std::fs::read_to_string(&path)) {
            let d = crate::quota::key_digest(key.trim());
            if crate::quota::digests_equal(crate::quota::parse_digest(h).as_ref(), &d) {
                return Ok(false);
            }
        }
        let mut raw = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
            .map_err(|_| std::io::Error::other("no random bytes from the system"))?;
        let key = ip_key_hex(&raw);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?
            .write_all(format!("{key}\n").as_bytes())?;
        let settings = self
            .file
            .ip
            .get_or_insert_with(crate::ip::IpSettings::default);
        settings.key_sha256 = Some(ip_key_hex(&crate::quota::key_digest(&key)));
        self.save().map_err(std::io::Error::other)?;
        Ok(true)
    }

    /// The MTU of the nodes' TUN devices.
    pub fn ip_mtu(&self) -> u32 {
        crate::ip::mtu(self.file.ip.as_ref())
    }

    /// Node `id`'s IP address; every node of a loaded rack has one (its subnet was
    /// checked when the rack was loaded).
    pub fn ip_addr(&self, id: NodeId) -> Option<std::net::Ipv4Addr> {
        crate::ip::node_addr(self.ip_subnet(), id)
    }

    pub fn shape(&self) -> Shape {
        self.file.shape
    }

    pub fn entry(&self, id: NodeId) -> &NodeEntry {
        &self.nodes[id.0 as usize]
    }

    pub fn switch_config(&self) -> SwitchConfig {
        SwitchConfig {
            window: self.file.window,
            local_window: self.file.local_window,
            model: self.model,
            modeled_order: self.order() == CellOrder::Modeled,
        }
    }

    /// In which order switches serve competing cells (`[model] order`).
    pub fn order(&self) -> CellOrder {
        self.file.model.and_then(|m| m.order).unwrap_or_default()
    }

    /// The modeled hardware's parameters as the rack file gives them (`[model]`, the
    /// report's figures where absent).
    pub fn model_params(&self) -> ModelParams {
        self.file.model_params()
    }

    /// How much longer a rank's compute takes per other rank of its node (`[model]
    /// memory_contention`, else the report's calibration).
    pub fn memory_contention(&self) -> f64 {
        self.file
            .model
            .as_ref()
            .and_then(|m| m.memory_contention)
            .unwrap_or(REPORT_MEMORY_CONTENTION)
    }

    /// The modeled software cost of an MPI library's call, nanoseconds: `[model]
    /// mpi_software_ns`, else `software_ns` if the file sets it, else the report's.
    pub fn mpi_software_ns(&self) -> f64 {
        let m = self.file.model.as_ref();
        m.and_then(|m| m.mpi_software_ns)
            .or_else(|| m.and_then(|m| m.software_ns))
            .unwrap_or(REPORT_MPI_SOFTWARE_NS)
    }

    /// The modeled hardware in the units the core computes with, checked when the rack
    /// was loaded.
    pub fn model(&self) -> Model {
        self.model
    }

    /// A 64-bit digest of the rack's identity (name and shape), carried in link hellos.
    pub fn digest(&self) -> u64 {
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in format!("{}/{}", self.file.name, self.file.shape).bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// The NI configuration the rack file asks for (its model is the switch
    /// configuration's: the node gives its NI the same).
    pub fn ni_config(&self) -> exanet_proto::ni::NiConfig {
        let mut c = exanet_proto::ni::NiConfig::default();
        if let Some(ni) = &self.file.ni {
            if let Some(w) = ni.window_blocks {
                c.window_blocks = w as usize;
            }
            if let Some(r) = ni.rank_window_blocks {
                c.rank_window_blocks = r as usize;
            }
            if let Some(t) = ni.retransmit_us {
                c.retransmit_ns = t * 1000;
                c.nack_retry_ns = (t * 1000 / 5).max(1000);
            }
        }
        if self.order() == CellOrder::Modeled {
            // Blocks wait for cuts in real time; one sent again because it waited is not
            // ordered, and its copy costs modeled time.
            // (Receivers remember finished blocks for twice the retry budget this
            // implies: `NiConfig::keep_ns`.)
            c.retransmit_ns = c.retransmit_ns.max(ORDERED_RETRANSMIT_NS);
        }
        match self.file.ni.as_ref().and_then(|ni| ni.max_attempts) {
            Some(a) => c.max_attempts = a,
            // A cut the rack does not call down yet (shorter than the link timeout) must
            // not fail what waits across it: the sends outlast it, and a second more for
            // the answer's way back once it heals. The price: a send to a node that is
            // truly gone fails that late too (11.5 s with the defaults).
            None => {
                let outage = self.file.link_timeout() + std::time::Duration::from_secs(1);
                let mut budget = outage.as_nanos() as u64;
                if self.order() == CellOrder::Modeled {
                    budget = budget.max(ORDERED_RETRY_NS);
                }
                c.max_attempts = c.attempts_outlasting(budget);
            }
        }
        c
    }

    /// The job a workload presenting `key` joins (its name and table): the job with that key,
    /// or the default job without a key. `None` for a key no job has.
    pub fn job_for(&self, key: Option<&str>) -> Option<(&str, std::borrow::Cow<'_, Job>)> {
        use std::borrow::Cow;
        match key {
            None | Some("") => Some(match self.file.jobs.get_key_value("default") {
                Some((name, job)) => (name.as_str(), Cow::Borrowed(job)),
                None => (
                    "default",
                    Cow::Owned(Job {
                        pdid: DEFAULT_PDID,
                        ..Job::default()
                    }),
                ),
            }),
            Some(k) => {
                let d = crate::quota::key_digest(k);
                let ip = self.file.ip.as_ref();
                let ip_key = ip
                    .and_then(|i| i.key_sha256.as_deref())
                    .and_then(crate::quota::parse_digest);
                if crate::quota::digests_equal(ip_key.as_ref(), &d) {
                    // One service per node, and what it needs: a ring per peer.
                    return Some((
                        crate::ip::JOB_NAME,
                        Cow::Owned(Job {
                            pdid: crate::ip::pdid(ip),
                            quota: JobQuota {
                                max_ranks: Some(1),
                                ..JobQuota::default()
                            },
                            ..Job::default()
                        }),
                    ));
                }
                self.file.jobs.iter().find_map(|(name, j)| {
                    let theirs = match (&j.key, &j.key_sha256) {
                        (Some(key), _) => Some(crate::quota::key_digest(key)),
                        (None, Some(h)) => crate::quota::parse_digest(h),
                        _ => None,
                    };
                    crate::quota::digests_equal(theirs.as_ref(), &d)
                        .then_some((name.as_str(), Cow::Borrowed(j)))
                })
            }
        }
    }

    /// The PDID a workload presenting `key` joins: the job with that key, or the default
    /// job without a key. `None` for a key no job has.
    pub fn pdid_for(&self, key: Option<&str>) -> Option<u16> {
        self.job_for(key).map(|(_, j)| j.pdid)
    }

    pub fn save(&self) -> Result<(), RackError> {
        write_rack_file(&self.dir, &self.file)
    }

    pub fn layout(&self) -> Layout {
        Layout::new(&self.dir)
    }
}

pub fn write_rack_file(dir: &Path, file: &RackFile) -> Result<(), RackError> {
    let path = dir.join(RACK_FILE);
    let text = toml::to_string(file).map_err(|e| RackError::Invalid {
        path: path.clone(),
        message: e.to_string(),
    })?;
    std::fs::write(&path, text).map_err(|source| RackError::Write { path, source })
}

fn check_addr(addr: &str) -> Result<(), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("{addr:?} is not host:port"))?;
    if host.is_empty() {
        return Err(format!("{addr:?} has no host"));
    }
    port.parse::<u16>()
        .map_err(|_| format!("{addr:?} has a bad port"))?;
    Ok(())
}

/// Paths inside a rack directory.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: &Path) -> Layout {
        Layout {
            dir: dir.to_path_buf(),
        }
    }
    pub fn rack_file(&self) -> PathBuf {
        self.dir.join(RACK_FILE)
    }
    pub fn tls_dir(&self) -> PathBuf {
        self.dir.join("tls")
    }
    pub fn ca_cert(&self) -> PathBuf {
        self.tls_dir().join("ca.pem")
    }
    /// The key that admits the IP service to its job (see [`crate::ip`]).
    pub fn ip_key(&self) -> PathBuf {
        self.tls_dir().join("ip.key")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.tls_dir().join("ca.key")
    }
    pub fn node_cert(&self, name: &impl fmt::Display) -> PathBuf {
        self.tls_dir().join(format!("{name}.pem"))
    }
    pub fn node_key(&self, name: &impl fmt::Display) -> PathBuf {
        self.tls_dir().join(format!("{name}.key"))
    }
    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }
    /// The IP services' pid, ready and metrics files, and the rack's hosts file.
    pub fn ip_run_dir(&self) -> PathBuf {
        self.run_dir().join("ip")
    }
    pub fn control_socket(&self, name: &impl fmt::Display) -> PathBuf {
        self.run_dir().join(format!("{name}.sock"))
    }
    /// Where workloads attach to the node's NI.
    pub fn attach_socket(&self, name: &impl fmt::Display) -> PathBuf {
        self.run_dir().join(format!("{name}.ni"))
    }
    pub fn pid_file(&self, name: &impl fmt::Display) -> PathBuf {
        self.run_dir().join(format!("{name}.pid"))
    }
    /// The host's registered-memory budget `rack up` measured ([`MemoryBudget`]).
    pub fn memory_budget(&self) -> PathBuf {
        self.run_dir().join("memory-budget.toml")
    }
    /// What each daemon of the host holds of that budget (exanetd's `host_budget`).
    pub fn memory_ledger(&self) -> PathBuf {
        self.run_dir().join("memory-ledger")
    }
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn log_file(&self, name: &impl fmt::Display) -> PathBuf {
        self.log_dir().join(format!("{name}.log"))
    }
}

/// The rack directory from `--rack`, else `EXANET_RACK`, else `./exanet-rack`.
pub fn rack_dir(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        return p.to_path_buf();
    }
    match std::env::var_os(ENV_RACK) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(DEFAULT_RACK_DIR),
    }
}

/// The `shape = "XxYxZ"` of a rack file's text, without checking the rest: a workload
/// needs only the shape, and must not fail on settings only the daemon reads.
pub fn parse_shape(text: &str) -> Result<Shape, String> {
    let v: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| e.message().to_string())?;
    let s = v
        .get("shape")
        .ok_or("no `shape` key")?
        .as_str()
        .ok_or("`shape` is not a string")?;
    s.parse::<Shape>().map_err(|e| e.to_string())
}

/// The DNS name a node's certificate is issued for.
pub fn dns_name(node: &impl fmt::Display) -> String {
    node.to_string().to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(shape: &str) -> RackFile {
        let shape: Shape = shape.parse().unwrap();
        RackFile::loopback("t", shape, |id| (20000 + id.0 as u16, 30000 + id.0 as u16))
    }

    #[test]
    fn round_trips_through_toml() {
        let f = file("1x1x1");
        let text = toml::to_string(&f).unwrap();
        let back: RackFile = toml::from_str(&text).unwrap();
        assert_eq!(back, f);
        assert!(Rack::new(Path::new("."), back).is_ok());
    }

    #[test]
    fn missing_and_extra_nodes_are_named() {
        let mut f = file("1x1x1");
        f.nodes.remove("M1QAF3");
        let e = Rack::new(Path::new("."), f.clone()).unwrap_err();
        assert!(e.contains("M1QAF3"), "{e}");
        f.nodes.insert("M2QAF1".into(), f.nodes["M1QAF1"].clone());
        let e = Rack::new(Path::new("."), f).unwrap_err();
        assert!(e.contains("M2QAF1"), "{e}");
    }

    #[test]
    fn typos_and_bad_values_are_refused() {
        let mut f = file("1x1x1");
        f.window = 100;
        assert!(Rack::new(Path::new("."), f).unwrap_err().contains("window"));
        let mut f = file("1x1x1");
        f.nodes.get_mut("M1QAF1").unwrap().link = "nohost".into();
        assert!(Rack::new(Path::new("."), f).unwrap_err().contains("M1QAF1"));
        let bad = "name = \"x\"\nshape = \"1x1x1\"\nwindwo = 5\n[nodes]\n";
        assert!(toml::from_str::<RackFile>(bad).is_err());
        let bad = "name = \"x\"\nshape = \"1x0x1\"\n[nodes]\n";
        assert!(toml::from_str::<RackFile>(bad).is_err());
    }

    fn with_jobs(jobs: &str) -> Result<Rack, String> {
        let mut text = toml::to_string(&file("1x1x1")).unwrap();
        text.push_str(jobs);
        let f: RackFile = toml::from_str(&text).map_err(|e| e.to_string())?;
        Rack::new(Path::new("."), f)
    }

    #[test]
    fn jobs_are_found_by_key_or_its_hash_and_never_share_one() {
        // SHA-256 of "test".
        let h = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let r = with_jobs(&format!(
            "[jobs.a]\nkey = \"alpha\"\npdid = 5\n[jobs.b]\nkey_sha256 = \"{h}\"\npdid = 6\n\
             uid = [1001]\nmax_rdma_pages = 2\n"
        ))
        .unwrap();
        assert_eq!(r.pdid_for(Some("alpha")), Some(5));
        let (name, job) = r.job_for(Some("test")).unwrap();
        assert_eq!((name, job.pdid, job.uid.as_slice()), ("b", 6, &[1001][..]));
        assert_eq!(job.quota.max_rdma_pages, Some(2));
        assert_eq!(r.pdid_for(Some("tesT")), None);
        assert_eq!(r.pdid_for(None), Some(DEFAULT_PDID));

        let e = with_jobs("[jobs.a]\nkey = \"k\"\npdid = 5\n[jobs.b]\nkey = \"j\"\npdid = 5\n")
            .unwrap_err();
        assert!(e.contains("same PDID 5"), "{e}");
        let e = with_jobs(&format!(
            "[jobs.a]\nkey = \"test\"\npdid = 5\n[jobs.b]\nkey_sha256 = \"{h}\"\npdid = 6\n"
        ))
        .unwrap_err();
        assert!(e.contains("same key"), "{e}");
        let e = with_jobs("[jobs.a]\nkey_sha256 = \"abc\"\npdid = 5\n").unwrap_err();
        assert!(e.contains("64 hex digits"), "{e}");
        let e = with_jobs("[jobs.a]\nkey = \"k\"\npdid = 5\nmax_ranks = 9\n").unwrap_err();
        assert!(e.contains("max_ranks = 9"), "{e}");
        let r = with_jobs("[ni]\nmpi_eager_limit = 8\n").unwrap();
        assert_eq!(r.file.ni.as_ref().and_then(|n| n.mpi_eager_limit), Some(8));
        let e = with_jobs("[ni]\nmpi_eager_limit = 41\n").unwrap_err();
        assert!(e.to_string().contains("at most 40"), "{e}");
        let e = with_jobs("[ni]\nrank_max_mailboxes = 65\n").unwrap_err();
        assert!(e.contains("rank_max_mailboxes"), "{e}");
        assert!(with_jobs("[jobs.a]\nkey = \"k\"\npdid = 5\nmax_rank = 2\n").is_err());
    }

    /// In modeled order blocks wait for cuts in real time, so the NI retransmits later,
    /// and (through `NiConfig::keep_ns`, tested with the NI) receivers remember what
    /// finished for longer.
    #[test]
    fn modeled_order_retransmits_late_and_remembers_longer() {
        let host = with_jobs("").unwrap().ni_config();
        let modeled = with_jobs("[model]\norder = \"modeled\"\n")
            .unwrap()
            .ni_config();
        assert_eq!(modeled.retransmit_ns, ORDERED_RETRANSMIT_NS);
        assert!(host.retransmit_ns < ORDERED_RETRANSMIT_NS);
        assert!(modeled.keep_ns() > host.keep_ns());
        // Copies go on for as long as blocks may wait for cuts, and no copy outlives
        // the receivers' memory of what it duplicates.
        assert!(modeled.retry_budget_ns() >= ORDERED_RETRY_NS);
        assert!(modeled.copy_limit_ns() >= ORDERED_RETRY_NS);
    }

    /// A cut shorter than the link timeout heals: by default the NI's sends outlast the
    /// link timeout (and a second), whatever the timeout; an explicit count is kept.
    #[test]
    fn the_retry_budget_outlasts_the_link_timeout_unless_told_otherwise() {
        let d = with_jobs("").unwrap().ni_config();
        assert_eq!(d.max_attempts, 14);
        assert!(
            d.retry_budget_ns() >= 11_000_000_000,
            "{}",
            d.retry_budget_ns()
        );
        let mut f = file("1x1x1");
        f.link_timeout_s = Some(30);
        let long = Rack::new(Path::new("."), f).unwrap().ni_config();
        assert!(long.retry_budget_ns() >= 31_000_000_000);
        assert!(long.max_attempts > d.max_attempts);
        let told = with_jobs("[ni]\nmax_attempts = 8\n").unwrap().ni_config();
        assert_eq!(told.max_attempts, 8);
        // In modeled order copies go later, so fewer attempts outlast the same timeout,
        // but never fewer than the NI's own default.
        let modeled = with_jobs("[model]\norder = \"modeled\"\n")
            .unwrap()
            .ni_config();
        assert!(modeled.retry_budget_ns() >= 11_000_000_000);
        assert!(modeled.max_attempts >= exanet_proto::ni::NiConfig::default().max_attempts);
    }

    #[test]
    fn a_ranks_rdma_window_must_hold_one_transfers() {
        let r = with_jobs("[ni]\nwindow_blocks = 16\nrank_window_blocks = 64\n").unwrap();
        assert_eq!(r.ni_config().rank_window_blocks, 64);
        let e = with_jobs("[ni]\nwindow_blocks = 16\nrank_window_blocks = 8\n").unwrap_err();
        assert!(e.contains("rank_window_blocks = 8"), "{e}");
        // The default window of one transfer (32) counts when window_blocks is not given.
        let e = with_jobs("[ni]\nrank_window_blocks = 31\n").unwrap_err();
        assert!(e.contains("32 blocks"), "{e}");
        let e = with_jobs("[ni]\nrank_window_blocks = 0\n").unwrap_err();
        assert!(e.contains("1..=65536"), "{e}");
    }

    #[test]
    fn a_link_timeout_is_three_to_600_seconds() {
        let dir = Path::new("/nonexistent-rack");
        let mut f = file("1x1x1");
        assert_eq!(f.link_timeout(), DEFAULT_LINK_TIMEOUT);
        for (t, ok) in [(2, false), (3, true), (600, true), (601, false)] {
            f.link_timeout_s = Some(t);
            match Rack::new(dir, f.clone()) {
                Ok(r) => {
                    assert!(ok, "{t} s accepted");
                    assert_eq!(r.file.link_timeout().as_secs(), u64::from(t));
                }
                Err(e) => {
                    assert!(!ok, "{t} s refused: {e}");
                    assert!(e.contains("link_timeout_s"), "{e}");
                }
            }
        }
        // Written only when set, read back as written.
        f.link_timeout_s = None;
        assert!(!toml::to_string(&f).unwrap().contains("link_timeout_s"));
        f.link_timeout_s = Some(30);
        let back: RackFile = toml::from_str(&toml::to_string(&f).unwrap()).unwrap();
        assert_eq!(back.link_timeout_s, Some(30));
    }

    fn load_with(extra: &str) -> Result<Rack, RackError> {
        // Each call its own directory: the tests run in parallel.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("exanet-rack-model-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = toml::to_string(&file("1x1x1")).unwrap();
        text.push_str(extra);
        std::fs::write(dir.join(RACK_FILE), text).unwrap();
        let r = Rack::load(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn an_absent_model_section_gives_the_reports_figures() {
        let r = load_with("").unwrap();
        assert_eq!(r.model_params(), ModelParams::default());
        assert_eq!(r.model(), Model::default());
        assert_eq!(r.switch_config().model, Model::default());
        // Default figures in picoseconds: 120 ns links, 145 ns router, 4 KB buffers.
        let m = r.switch_config().model;
        assert_eq!(
            (m.qfdb_link, m.torus_link, m.router),
            (120_000, 120_000, 145_000)
        );
        assert_eq!(m.input_buffer, 4096);
        // An empty section is the same as none.
        assert_eq!(load_with("[model]\n").unwrap().model(), Model::default());
    }

    #[test]
    fn model_settings_reach_the_switch_and_keep_defaults_elsewhere() {
        let r = load_with(
            "[model]\ntorus_link_gbps = 40\nrouter_ns = 200.5\ninput_buffer = 8192\n\
             software_ns = 350.0\ncompute_scale = 0.5\ntorus_control_bytes = 96\n",
        )
        .unwrap();
        let p = r.model_params();
        assert_eq!(p.torus_link_gbps, 40.0);
        assert_eq!(p.software_ns, 350.0);
        assert_eq!(p.compute_scale, 0.5);
        assert_eq!(p.qfdb_link_gbps, ModelParams::default().qfdb_link_gbps);
        let m = r.switch_config().model;
        assert_eq!(m, r.model());
        assert_eq!(m.router, 200_500);
        assert_eq!(m.input_buffer, 8192);
        assert_eq!(m.software, 350_000);
        assert_eq!(m.compute_scale_ppm, 500_000);
        assert_eq!(m.torus_control, 96);
        // 288 B at 40 Gb/s is 57.6 ns; the QFDB links keep 16 Gb/s (144 ns).
        assert_eq!(m.torus_rate.ps(288), 57_600);
        assert_eq!(m.qfdb_rate.ps(288), 144_000);
        assert_eq!(m.qfdb_link, Model::default().qfdb_link);
        // The section survives a rewrite of the rack file (`ensure_ip_key` saves it).
        let text = toml::to_string(&r.file).unwrap();
        let back: RackFile = toml::from_str(&text).unwrap();
        assert_eq!(back, r.file);
        assert!(!text.contains("qfdb_link_gbps"), "{text}");
    }

    #[test]
    fn an_mpi_call_costs_the_reports_software_unless_the_file_says_otherwise() {
        let r = with_jobs("").unwrap();
        assert_eq!(r.mpi_software_ns(), REPORT_MPI_SOFTWARE_NS);
        // The NI-level cost stays what it was: programs that are not an MPI library.
        assert_eq!(r.model_params().software_ns, 0.0);
        let r = with_jobs("[model]\nsoftware_ns = 300.0\n").unwrap();
        assert_eq!(r.mpi_software_ns(), 300.0);
        let r = with_jobs("[model]\nsoftware_ns = 300.0\nmpi_software_ns = 0.0\n").unwrap();
        assert_eq!(r.mpi_software_ns(), 0.0);
        let e = with_jobs("[model]\nmpi_software_ns = -1.0\n").unwrap_err();
        assert!(e.contains("mpi_software_ns = -1"), "{e}");
    }

    #[test]
    fn bad_model_settings_are_refused_naming_the_field() {
        for (setting, field) in [
            ("torus_link_gbps = 0", "[model] torus_link_gbps = 0"),
            ("qfdb_link_ns = -1.0", "[model] qfdb_link_ns = -1"),
            ("router_ns = nan", "[model] router_ns = NaN"),
            ("input_buffer = 100", "[model] input_buffer = 100"),
            ("compute_scale = -0.5", "[model] compute_scale = -0.5"),
            (
                "torus_control_bytes = 5000",
                "[model] torus_control_bytes = 5000",
            ),
        ] {
            let e = load_with(&format!("[model]\n{setting}\n")).unwrap_err();
            assert!(
                matches!(
                    e,
                    RackError::Model {
                        source: ModelError::Bad { .. },
                        ..
                    }
                ),
                "{setting}: {e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains(field), "{setting}: {msg}");
            assert!(msg.contains(RACK_FILE), "{setting}: {msg}");
        }
        // A validated rack from a rack file built in code is checked the same way.
        let mut f = file("1x1x1");
        f.model = Some(ModelSettings {
            ni_gbps: Some(0.0),
            ..ModelSettings::default()
        });
        let e = Rack::new(Path::new("."), f).unwrap_err();
        assert!(e.contains("[model] ni_gbps = 0"), "{e}");
        // Typos and wrong types are parse errors naming what is wrong.
        let e = load_with("[model]\ntorus_gbps = 5\n").unwrap_err();
        assert!(matches!(e, RackError::Parse { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("torus_gbps") && msg.contains("torus_link_gbps"),
            "{msg}"
        );
        let e = load_with("[model]\nrouter_ns = \"fast\"\n").unwrap_err();
        assert!(matches!(e, RackError::Parse { .. }), "{e:?}");
    }

    #[test]
    fn who_may_join() {
        let open = Job::default();
        assert!(open.may_join(500, 500, 500));
        assert!(open.may_join(0, 0, 500));
        assert!(!open.may_join(1001, 1001, 500));
        let alice = Job {
            uid: vec![1001],
            gid: vec![2000],
            ..Job::default()
        };
        assert!(alice.may_join(1001, 1, 500));
        assert!(alice.may_join(7, 2000, 500));
        assert!(!alice.may_join(500, 500, 500));
        assert!(!alice.may_join(0, 0, 500));
    }

    #[test]
    fn a_job_gets_half_the_host_budget_beside_others_and_all_of_it_alone() {
        let mut f = file("1x1x1");
        assert_eq!(f.job_host_memory_percent(), 100, "the default job alone");
        f.jobs.insert(
            "alice".into(),
            Job {
                key: Some("k".into()),
                pdid: 42,
                ..Job::default()
            },
        );
        assert_eq!(f.job_host_memory_percent(), 50);
        f.ni = Some(NiSettings {
            job_host_memory_percent: Some(30),
            ..NiSettings::default()
        });
        assert_eq!(f.job_host_memory_percent(), 30);
        assert!(Rack::new(Path::new("."), f.clone()).is_ok());
        f.ni = Some(NiSettings {
            job_host_memory_percent: Some(0),
            ..NiSettings::default()
        });
        let e = Rack::new(Path::new("."), f).unwrap_err();
        assert!(e.contains("job_host_memory_percent"), "{e}");
        // The IP services' share is theirs: jobs split the rest.
        let b = MemoryBudget {
            total_bytes: 1000,
            ip_bytes: 200,
            available_bytes: 0,
            rack_bytes: 0,
        };
        assert_eq!((b.per_job(50), b.per_job(100)), (400, 800));
        let huge = MemoryBudget {
            total_bytes: u64::MAX,
            ip_bytes: 0,
            ..b
        };
        assert_eq!(huge.per_job(100), u64::MAX);
    }

    #[test]
    fn a_budget_file_round_trips_and_a_bad_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("exanet-budget-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("memory-budget.toml");
        assert_eq!(
            MemoryBudget::read(&path).unwrap(),
            None,
            "absent is not an error"
        );
        let b = MemoryBudget {
            total_bytes: 3 << 30,
            ip_bytes: 1 << 20,
            available_bytes: 4 << 30,
            rack_bytes: 1 << 28,
        };
        b.write(&path).unwrap();
        assert_eq!(MemoryBudget::read(&path).unwrap(), Some(b));
        for bad in [
            "total_bytes = 1\nip_bytes = 2\n",
            "total_bytes = -1\n",
            "\u{0}",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(MemoryBudget::read(&path).is_err(), "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
