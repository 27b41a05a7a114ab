//! Where to attach and how to wait: [`Config`], filled from explicit values, else the
//! environment, else defaults.
//!
//! | setting | explicit | environment | default |
//! |---|---|---|---|
//! | rack directory | [`Config::rack_dir`] | `EXANET_RACK` | `./exanet-rack` |
//! | node | [`Config::node`] | `EXANET_NODE` | the host name, on a node of a rack with IP over ExaNet (a host of its own, named after the node); else [`Error::NoNode`] |
//! | job key | [`Config::job_key`] | `EXANET_JOB_KEY` | none: the rack's default job |
//! | spin budget | [`Config::spin`] | `EXANET_SPIN_US` (microseconds) | [`DEFAULT_SPIN`] (20 us) |
//! | modeled compute scale | [`Config::compute_scale_ppm`] | `EXANET_COMPUTE_SCALE` (a factor, e.g. `0` or `1.5`) | the rack's `[model] compute_scale` |
//! | modeled software cost per call | | `EXANET_SOFTWARE_NS` (nanoseconds, e.g. `418`; `exactl mpirun` sets the rack's MPI cost) | the rack's `[model] software_ns` |
//!
//! An empty environment variable counts as unset.

use std::path::{Path, PathBuf};
use std::time::Duration;

use exanet_control::rack::Layout;
use exanet_proto::Shape;

use crate::error::{Error, Result};

pub use exanet_shm::doorbell::DEFAULT_SPIN;

pub const ENV_NODE: &str = "EXANET_NODE";
pub const ENV_JOB_KEY: &str = "EXANET_JOB_KEY";
pub const ENV_SPIN_US: &str = "EXANET_SPIN_US";
pub const ENV_COMPUTE_SCALE: &str = "EXANET_COMPUTE_SCALE";
/// The modeled software cost of each call that posts or takes data, nanoseconds: what an
/// MPI library's processing costs per call (`exactl mpirun` sets it for its ranks).
pub const ENV_SOFTWARE_NS: &str = "EXANET_SOFTWARE_NS";
/// The rack directory when neither an argument nor `EXANET_RACK` names one, and the rack
/// file inside it: the daemon's, from exanet-rack.
pub use exanet_control::rack::{DEFAULT_RACK_DIR, ENV_RACK, RACK_FILE};
/// How long a control request (attach, register, alloc, free) may take by default.
pub const DEFAULT_CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest spin budget accepted from `EXANET_SPIN_US` (one second).
pub const MAX_SPIN_US: u64 = 1_000_000;

/// How to attach. `None` fields come from the environment or the defaults (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub rack_dir: Option<PathBuf>,
    pub node: Option<String>,
    pub job_key: Option<String>,
    pub spin: Option<Duration>,
    pub control_timeout: Option<Duration>,
    /// The rank to attach at (refused if another workload has it); `None`: the lowest
    /// free rank.
    pub rank: Option<u8>,
    /// How much of the host time the program spends outside library calls counts as
    /// modeled compute, in millionths (0: none, for pure network benchmarks);
    /// `None`: `EXANET_COMPUTE_SCALE`, else the rack's setting.
    pub compute_scale_ppm: Option<u64>,
    /// A factor on top of the compute scale, in millionths: what a library that knows the
    /// program's placement charges for cores that compete for the node's one memory
    /// channel (the libfabric provider: [`memory_channel_factor_ppm`]). `None`: 1.
    pub compute_factor_ppm: Option<u64>,
}

/// A [`Config`] with every field decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub rack_dir: PathBuf,
    pub node: String,
    pub job_key: Option<String>,
    pub spin: Duration,
    pub control_timeout: Duration,
    pub rank: Option<u8>,
    pub compute_scale_ppm: Option<u64>,
    /// `EXANET_SOFTWARE_NS`, in picoseconds; `None`: the rack's.
    pub software_ps: Option<u64>,
    pub compute_factor_ppm: Option<u64>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Parses `EXANET_SPIN_US`-style text: microseconds, 0..=[`MAX_SPIN_US`].
pub fn parse_spin_us(text: &str) -> Result<Duration> {
    let bad = |why| Error::BadSetting {
        name: ENV_SPIN_US,
        value: text.to_string(),
        why,
    };
    let us: u64 = text
        .trim()
        .parse()
        .map_err(|_| bad("expected a number of microseconds"))?;
    if us > MAX_SPIN_US {
        return Err(bad("at most 1000000 (one second)"));
    }
    Ok(Duration::from_micros(us))
}

/// Parses `EXANET_COMPUTE_SCALE`-style text: a factor between 0 and 1000000, in millionths.
pub fn parse_compute_scale(text: &str) -> Result<u64> {
    let bad = |why| Error::BadSetting {
        name: ENV_COMPUTE_SCALE,
        value: text.to_string(),
        why,
    };
    let f: f64 = text
        .trim()
        .parse()
        .map_err(|_| bad("expected a factor such as 0, 1 or 2.5"))?;
    if !(f.is_finite() && (0.0..=1e6).contains(&f)) {
        return Err(bad("between 0 and 1000000"));
    }
    Ok((f * 1e6).round() as u64)
}

/// Parses `EXANET_SOFTWARE_NS`-style text: nanoseconds, 0 to one second; picoseconds.
pub fn parse_software_ns(text: &str) -> Result<u64> {
    let bad = |why| Error::BadSetting {
        name: ENV_SOFTWARE_NS,
        value: text.to_string(),
        why,
    };
    let ns: f64 = text
        .trim()
        .parse()
        .map_err(|_| bad("expected nanoseconds such as 0 or 418"))?;
    if !(ns.is_finite() && (0.0..=1e9).contains(&ns)) {
        return Err(bad("between 0 and 1000000000 (one second)"));
    }
    Ok((ns * 1000.0).round() as u64)
}

/// How much longer a rank's compute takes, per other rank of its node computing beside
/// it, for their share of the MPSoC's one memory channel (a fraction, e.g. `0.041`):
/// `exactl mpirun --modeled` sets the rack's `[model] memory_contention`.
pub const ENV_MEMORY_CONTENTION: &str = "EXANET_MEMORY_CONTENTION";

/// The factor on a rank's compute when `sharers` ranks (itself included) share its
/// node's memory channel, in millionths: 1 + `EXANET_MEMORY_CONTENTION` x (sharers - 1);
/// `None` where the variable is unset (no contention modeled) or sharers is at most 1.
/// A linear model: the report's one figure on it is the LAMMPS weak-scaling drop to 96%
/// at two and 89% at four ranks of one MPSoC, "the memory channel becomes the
/// bottleneck" (section 6.2).
pub fn memory_channel_factor_ppm(sharers: u32) -> Result<Option<u64>> {
    memory_channel_factor(env(ENV_MEMORY_CONTENTION), sharers)
}

/// [`memory_channel_factor_ppm`] for the contention `text`.
fn memory_channel_factor(text: Option<String>, sharers: u32) -> Result<Option<u64>> {
    let Some(text) = text else {
        return Ok(None);
    };
    let bad = |why| Error::BadSetting {
        name: ENV_MEMORY_CONTENTION,
        value: text.clone(),
        why,
    };
    let c: f64 = text
        .trim()
        .parse()
        .map_err(|_| bad("expected a fraction such as 0 or 0.04"))?;
    if !(c.is_finite() && (0.0..=10.0).contains(&c)) {
        return Err(bad("between 0 and 10"));
    }
    if sharers <= 1 {
        return Ok(None);
    }
    Ok(Some(
        ((1.0 + c * f64::from(sharers - 1)) * 1e6).round() as u64
    ))
}

/// Whether `EXANET_SPIN_US` says anything (set and not empty), as [`spin_from_env`]
/// reads it: a library built on this one may pick another default where it does not.
pub fn spin_in_env() -> bool {
    env(ENV_SPIN_US).is_some()
}

/// The spin budget from `EXANET_SPIN_US`, or [`DEFAULT_SPIN`].
pub fn spin_from_env() -> Result<Duration> {
    match env(ENV_SPIN_US) {
        Some(v) => parse_spin_us(&v),
        None => Ok(DEFAULT_SPIN),
    }
}

/// The rack directory: `explicit`, else `EXANET_RACK`, else `./exanet-rack` (as exactl
/// and the daemon find it).
pub fn rack_dir(explicit: Option<&Path>) -> PathBuf {
    exanet_control::rack::rack_dir(explicit)
}

/// The attach socket of `node` in `rack_dir`: where the daemon's layout puts it.
pub fn socket_path(rack_dir: &Path, node: &str) -> PathBuf {
    Layout::new(rack_dir).attach_socket(&node)
}

impl Config {
    /// Everything from the environment.
    pub fn from_env() -> Config {
        Config::default()
    }

    /// The node this configuration attaches to (its canonical name) and its daemon's
    /// socket, without attaching: for a caller that must say whether there is an NI to
    /// attach to at all (the libfabric provider's `fi_getinfo`).
    pub fn node_socket(&self) -> Result<(String, PathBuf)> {
        let r = self.resolve()?;
        let socket = socket_path(&r.rack_dir, &r.node);
        Ok((r.node, socket))
    }

    pub(crate) fn resolve(&self) -> Result<Resolved> {
        let node = match self.node.clone().filter(|n| !n.is_empty()) {
            Some(n) => n,
            None => env(ENV_NODE).or_else(node_host_name).ok_or(Error::NoNode)?,
        };
        // The canonical spelling (upper case), which the daemon names its socket after.
        let name: exanet_proto::NodeName =
            node.parse()
                .map_err(|e: exanet_proto::NameError| Error::UnknownNode {
                    name: node.clone(),
                    reason: e.to_string(),
                })?;
        let spin = match self.spin {
            Some(s) => s,
            None => spin_from_env()?,
        };
        Ok(Resolved {
            rack_dir: rack_dir(self.rack_dir.as_deref()),
            node: name.to_string(),
            job_key: self
                .job_key
                .clone()
                .or_else(|| env(ENV_JOB_KEY))
                .filter(|k| !k.is_empty()),
            spin,
            control_timeout: self.control_timeout.unwrap_or(DEFAULT_CONTROL_TIMEOUT),
            rank: self.rank,
            compute_scale_ppm: match self.compute_scale_ppm {
                Some(s) => Some(s),
                None => env(ENV_COMPUTE_SCALE)
                    .map(|v| parse_compute_scale(&v))
                    .transpose()?,
            },
            software_ps: env(ENV_SOFTWARE_NS)
                .map(|v| parse_software_ns(&v))
                .transpose()?,
            compute_factor_ppm: self.compute_factor_ppm,
        })
    }
}

/// The host name when it is a node's name: on a rack with IP over ExaNet every node is a
/// host of its own, named after the node, and a program started there by a launcher that
/// does not pass `EXANET_NODE` on (or passes its own node's) belongs to that node. Read
/// from the kernel, which answers for this process's UTS namespace.
fn node_host_name() -> Option<String> {
    node_named(&std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?)
}

/// `host` (as the kernel gives it, with its newline) when it names a node.
fn node_named(host: &str) -> Option<String> {
    let name = host.trim();
    name.parse::<exanet_proto::NodeName>()
        .is_ok()
        .then(|| name.to_string())
}

/// Reads the rack's shape from `<rack_dir>/rack.toml` (only the `shape` key is looked at).
pub fn read_shape(rack_dir: &Path) -> Result<Shape> {
    let path = Layout::new(rack_dir).rack_file();
    let text = std::fs::read_to_string(&path).map_err(|e| Error::RackFile {
        path: path.clone(),
        message: e.to_string(),
    })?;
    parse_shape(&text).map_err(|message| Error::RackFile { path, message })
}

/// The `shape = "XxYxZ"` of a rack file's text.
pub fn parse_shape(text: &str) -> Result<Shape, String> {
    exanet_control::rack::parse_shape(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a node the host name is the node's name; elsewhere it names no node and the
    /// library asks for one instead of guessing.
    #[test]
    fn ranks_sharing_a_memory_channel_compute_longer_by_the_contention_each() {
        let f = |c: Option<&str>, k| memory_channel_factor(c.map(String::from), k).unwrap();
        assert_eq!(f(Some("0.04"), 4), Some(1_120_000));
        assert_eq!(f(Some("0.04"), 2), Some(1_040_000));
        assert_eq!(f(Some("0.04"), 1), None, "a rank alone has the channel");
        assert_eq!(f(None, 4), None, "unset: no contention modeled");
        for bad in ["-0.1", "nan", "11", "lots"] {
            assert!(memory_channel_factor(Some(bad.into()), 4).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_software_cost_is_nanoseconds_to_one_second() {
        assert_eq!(parse_software_ns("418").unwrap(), 418_000);
        assert_eq!(parse_software_ns(" 0.5 ").unwrap(), 500);
        for bad in ["-1", "nan", "1e10", "fast"] {
            assert!(parse_software_ns(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_host_name_counts_only_when_it_names_a_node() {
        assert_eq!(node_named("M1QBF3\n"), Some("M1QBF3".to_string()));
        assert_eq!(node_named("m2qaf1"), Some("m2qaf1".to_string()));
        for host in ["vm", "", "\n", "build-host-7", "M1QAF9", "M1QAF1.local"] {
            assert_eq!(node_named(host), None, "{host:?}");
        }
    }
}
