//! `exactl mpirun [--mpi openmpi|mpich] [--nodes LIST | -np N] -- PROGRAM [ARGS...]`: an
//! unmodified MPI program with one rank per emulated node, over the NI (the libfabric
//! provider) or over IP over ExaNet.
//!
//! On a compose rack the launcher runs on this host and the agent starts each node's
//! daemon (Open MPI's orted, Hydra's proxy) in a container beside the node's (`exactl exec
//! --host-programs`: the node's namespaces, this host's `/usr`, and the MPI's own
//! directory when it lives elsewhere, `EXANET_MPI_PREFIX`), so the MPI and programs
//! installed here run there unchanged; the runtime's own connections cross the compose
//! network (Open MPI: `oob_tcp_if_include` is its subnet, which this host reaches; Hydra:
//! `-localhost` is this host's address on it, where the proxies call back), the messages the NI
//! (the ranks load the provider from the rack directory, `/rack/run/fi`) or, with
//! `--fabric ip`, the nodes' `exanet0` devices, which their IP service containers made in
//! the namespaces the ranks share.
//!
//! Debian's MPI runs as it would on a cluster of hosts: the launcher (Open MPI's `mpirun`,
//! MPICH's Hydra `mpiexec`) starts on the first node, a host of its own
//! (`crate::node_host`: its name, the rack's `/etc/hosts`, the device `exanet0`), and
//! reaches the other nodes through a remote-shell agent that is `exactl exec` (a short
//! script, `run/mpi/rsh-agent`, written from `rack up` on, with ssh's command line:
//! options before the host are taken and ignored, and the command is one string for a
//! shell). Settings, passed in the environment (which the agent hands on to every remote
//! daemon and rank):
//!
//! Open MPI (`OMPI_MCA_*`):
//! - `plm_rsh_agent`: the agent; `plm_rsh_no_tree_spawn=1`: mpirun starts every orted
//!   itself, so no orted needs the agent on its PATH;
//! - `pml=ob1`, `btl=tcp,self`: point-to-point over TCP sockets (one rank per node, so
//!   no shared-memory transport has anything to carry);
//! - `btl_tcp_if_include` and `oob_tcp_if_include`: the rack's subnet, so that both the
//!   MPI traffic and the runtime's own connections cross the emulated fabric (a node's
//!   namespace has nothing else but loopback anyway);
//! - `mpi_yield_when_idle=1`: a rank waiting for a message yields the CPU between polls.
//!   Open MPI's ranks poll their sockets without end; on a host whose cores they share
//!   with the daemons and IP services that carry their messages, a spinning rank kept
//!   those from running until the scheduler's next tick, and every small message took
//!   one tick (4 ms at 250 Hz) whatever its size. Yielding lets them run at once
//!   (measured in `docs/ip.md`);
//! - `osc=^rdma,ucx` unless the environment says otherwise: one-sided communication in
//!   messages, by `osc pt2pt` (the default, `osc rdma`, needs an RDMA transport with
//!   atomics, and `MPI_Win_create` failed with MPI_ERR_WIN);
//! - `OMPI_ALLOW_RUN_AS_ROOT*` when run as root (namespaces need root).
//!
//! MPICH (Hydra's arguments `-launcher ssh -launcher-exec AGENT -f HOSTFILE`, and):
//! - over the NI, for an MPICH whose `mpichversion` names `ofi` among its devices (PyPI's
//!   `mpich`): `MPICH_CH4_NETMOD=ofi`, `FI_PROVIDER=exanet`, `FI_PROVIDER_PATH`;
//! - over IP: `UCX_TLS=tcp,self`, `UCX_NET_DEVICES=exanet0`: Debian's MPICH is ch4:ucx, and
//!   UCX would otherwise take loopback, which reaches no other node;
//!   `FI_PROVIDER=tcp`, `FI_TCP_IFACE=exanet0`: the same for an MPICH built on libfabric;
//! - no `EXANET_NODE` or `TMPDIR` in the launcher's environment: Hydra hands all of it to
//!   every rank, over what the rank's node set.
//!
//! Every node also has a temporary directory of its own (`TMPDIR`, see
//! [`crate::ip_service::node_tmp_dir`]), as separate hosts have: runtimes keep per-host
//! state there (Open MPI its session directory, PMIx its shared-memory store). It is made
//! afresh by `rack up` under a name no one can take first, and checked before each use.

use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use exanet_control::rack::{Deploy, Rack};
use exanet_proto::NodeId;

use crate::error::{CliError, Result};

/// Which nodes get ranks.
pub enum Ranks {
    /// These nodes, in this order, each with the ranks per node.
    Nodes(Vec<NodeId>),
    /// N ranks, on the first nodes by id (whole QFDBs first), the ranks per node on each
    /// but perhaps the last.
    Count(u32),
    /// Every node, each with the ranks per node.
    All,
}

/// The most ranks a node takes: an MPSoC's four A53 cores, one rank each, as the
/// report's LAMMPS study ran them.
pub const MAX_RANKS_PER_NODE: u32 = 4;

/// What carries the program's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fabric {
    /// The NI itself, through the libfabric provider `exanet` (Open MPI's pml cm, mtl
    /// ofi; MPICH's ch4:ofi)
    Ni,
    /// TCP over IP over ExaNet
    Ip,
}

impl Fabric {
    /// The fabric to use, and why: the one asked for; otherwise the NI wherever it can
    /// carry the program (Open MPI, or an MPICH with ch4:ofi, `ofi`; the provider built
    /// beside this exactl), since that is the path ExaNeSt's MPI took; otherwise IP,
    /// which carries every MPI.
    pub fn choose(
        asked: Option<Fabric>,
        mpi: Mpi,
        ofi: bool,
        modeled: bool,
    ) -> (Fabric, &'static str) {
        if let Some(f) = asked {
            return (f, "as asked");
        }
        if modeled {
            return (Fabric::Ni, "--modeled needs it");
        }
        if mpi == Mpi::Mpich && !ofi {
            return (
                Fabric::Ip,
                "the default for an MPICH without ch4:ofi (Debian's is ch4:ucx), which \
                 cannot load the provider",
            );
        }
        let exe = std::env::current_exe().ok();
        if exe.as_deref().and_then(newest_provider).is_some() {
            (
                Fabric::Ni,
                "the default: the provider is built beside exactl",
            )
        } else {
            (
                Fabric::Ip,
                "the default without the provider: cargo build --release -p exanet-fi builds it",
            )
        }
    }
}

/// The MPI families `exactl mpirun` knows how to launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mpi {
    /// Open MPI (Debian's openmpi-bin: `mpirun.openmpi`)
    Openmpi,
    /// MPICH with its Hydra launcher (Debian's mpich: `mpiexec.hydra`)
    Mpich,
}

impl Mpi {
    /// The launchers to look for on PATH, in order, when none is named: the family's own
    /// name first, since `mpirun`/`mpiexec` are whichever family Debian's alternatives chose.
    fn launchers(self) -> &'static [&'static str] {
        match self {
            Mpi::Openmpi => &["mpirun.openmpi", "mpirun"],
            Mpi::Mpich => &["mpiexec.hydra", "mpiexec.mpich", "mpiexec"],
        }
    }

    /// The launcher: `named`, or the first of [`Mpi::launchers`] on PATH.
    pub fn launcher(self, named: Option<&OsString>) -> Result<OsString> {
        if let Some(n) = named {
            return Ok(n.clone());
        }
        self.launchers()
            .iter()
            .find(|l| crate::process::on_path(l).is_some())
            .map(OsString::from)
            .ok_or_else(|| {
                CliError::Failed(format!(
                    "no {} on PATH ({}); Debian: apt-get install {}",
                    self.launchers().join(", "),
                    self.name(),
                    self.package()
                ))
            })
    }

    /// Whether `launcher`'s MPI reaches fabrics through libfabric: always for Open MPI
    /// (mtl ofi); for MPICH, when the `mpichversion` beside the launcher names `ofi` among
    /// its devices (PyPI's `mpich` wheel: `ch4:ucx ofi`; Debian's: `ch4:ucx`).
    pub fn has_ofi(self, launcher: &std::ffi::OsStr) -> bool {
        match self {
            Mpi::Openmpi => true,
            Mpi::Mpich => {
                let Some(version) = launcher_path(launcher)
                    .and_then(|p| p.parent().map(|d| d.join("mpichversion")))
                else {
                    return false;
                };
                Command::new(version)
                    .output()
                    .ok()
                    .is_some_and(|o| mpich_device_has_ofi(&String::from_utf8_lossy(&o.stdout)))
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mpi::Openmpi => "Open MPI",
            Mpi::Mpich => "MPICH",
        }
    }

    fn package(self) -> &'static str {
        match self {
            Mpi::Openmpi => "openmpi-bin",
            Mpi::Mpich => "mpich",
        }
    }

    /// The launcher's arguments before the user's: the ranks, on the hosts of `hostfile`
    /// in order, consecutive ranks on one node (as the report's study placed them: ranks
    /// 0-3 on the first MPSoC).
    fn args(self, slots: Slots, hostfile: &Path, agent: &Path) -> Vec<OsString> {
        let n = slots.ranks;
        let mut a: Vec<OsString> = Vec::new();
        match self {
            Mpi::Openmpi => {
                a.extend(["-np".into(), n.to_string().into(), "--hostfile".into()]);
                a.push(hostfile.into());
                // One rank per node: `node` and `slot` place them alike.
                a.extend(["--map-by".into(), "slot".into()]);
            }
            Mpi::Mpich => {
                a.extend(["-launcher".into(), "ssh".into(), "-launcher-exec".into()]);
                a.push(agent.into());
                a.push("-f".into());
                a.push(hostfile.into());
                a.extend(["-n".into(), n.to_string().into()]);
            }
        }
        a
    }

    /// The host file: each node's slots (the last node's may be fewer), in rank order.
    fn hostfile(self, names: &[String], slots: Slots) -> String {
        let mut left = slots.ranks;
        names
            .iter()
            .map(|n| {
                let k = left.min(slots.per_node);
                left -= k;
                match self {
                    Mpi::Openmpi => format!("{n} slots={k}\n"),
                    Mpi::Mpich => format!("{n}:{k}\n"),
                }
            })
            .collect()
    }

    /// The settings the family runs with on the rack (see the module docs); `provider`:
    /// the directory of the libfabric provider, when the NI carries the messages.
    /// `oob`: where the runtime's own connections go (the launcher must reach it);
    /// `messages`: where MPI's TCP traffic goes over IP (the rack's IP over ExaNet subnet).
    pub fn env(
        self,
        agent: &Path,
        oob: &str,
        messages: &str,
        provider: Option<&Path>,
    ) -> Vec<(String, String)> {
        let pairs: Vec<(&str, String)> = match self {
            Mpi::Openmpi => {
                let mut env = vec![
                    ("OMPI_MCA_plm_rsh_agent", agent.display().to_string()),
                    ("OMPI_MCA_plm_rsh_no_tree_spawn", "1".into()),
                ];
                match provider {
                    Some(dir) => env.extend([
                        ("OMPI_MCA_pml", "cm".into()),
                        ("OMPI_MCA_mtl", "ofi".into()),
                        ("OMPI_MCA_mtl_ofi_provider_include", "exanet".into()),
                        ("FI_PROVIDER", "exanet".into()),
                        ("FI_PROVIDER_PATH", dir.display().to_string()),
                    ]),
                    None => env.extend([
                        ("OMPI_MCA_pml", "ob1".into()),
                        ("OMPI_MCA_btl", "tcp,self".into()),
                    ]),
                }
                env.extend([
                    ("OMPI_MCA_btl_tcp_if_include", messages.into()),
                    ("OMPI_MCA_oob_tcp_if_include", oob.into()),
                    ("OMPI_MCA_mpi_yield_when_idle", "1".into()),
                ]);
                // One-sided communication between nodes: Open MPI 4.1 picks `osc rdma`
                // (or `ucx`), which needs an RDMA transport with atomics the rack does not
                // offer, and `MPI_Win_create` failed with MPI_ERR_WIN over either fabric;
                // without them it takes `osc pt2pt`, which carries it in messages. An
                // exclusion, not `pt2pt` by name: Open MPI 5 has no `pt2pt`, and naming a
                // component it lacks would fail every program. The user's choice stays.
                if std::env::var_os("OMPI_MCA_osc").is_none() {
                    env.push(("OMPI_MCA_osc", "^rdma,ucx".into()));
                }
                if nix::unistd::geteuid().is_root() {
                    env.push(("OMPI_ALLOW_RUN_AS_ROOT", "1".into()));
                    env.push(("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1".into()));
                }
                env
            }
            Mpi::Mpich => match provider {
                Some(dir) => vec![
                    ("MPICH_CH4_NETMOD", "ofi".into()),
                    // Ranks of one node talk through its NI, as ExaNet-MPI's did (the
                    // report's two ranks of one MPSoC: 1.17 us, all but the link), not
                    // through ch4's shared memory. (Open MPI's pml cm has no other path.)
                    ("MPIR_CVAR_NOLOCAL", "1".into()),
                    ("FI_PROVIDER", "exanet".into()),
                    ("FI_PROVIDER_PATH", dir.display().to_string()),
                ],
                None => vec![
                    ("UCX_TLS", "tcp,self".into()),
                    ("UCX_NET_DEVICES", crate::node_host::DEVICE.into()),
                    ("FI_PROVIDER", "tcp".into()),
                    ("FI_TCP_IFACE", crate::node_host::DEVICE.into()),
                ],
            },
        };
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// Whether `mpichversion`'s output names the `ofi` netmod among its devices
/// (`MPICH Device: ch4:ucx ofi`, `ch4:ofi`).
fn mpich_device_has_ofi(version: &str) -> bool {
    version
        .lines()
        .find_map(|l| l.strip_prefix("MPICH Device:"))
        .is_some_and(|d| {
            d.split(|c: char| c.is_whitespace() || c == ':' || c == ',')
                .any(|w| w == "ofi")
        })
}

/// The remote-shell agent's script: `exactl exec` with ssh's semantics. It takes what ssh
/// takes before the host (Hydra calls `agent -x HOST ...`; others pass `-q`, `-o X`, `-p N`,
/// `-l USER`, `USER@HOST`), ignores it (a node is entered, not logged into), and runs the
/// rest as one line for a shell on the node.
/// On a compose rack the command runs in a container beside the node's with this host's
/// programs (`exactl exec --host-programs`), whose shell is the host's `/usr/bin/sh`.
/// An MPI installed outside `/usr` (`EXANET_MPI_PREFIX`, set by `exactl mpirun`) is
/// mounted there too.
fn agent_script(exactl: &Path, rack_dir: &Path, compose: bool) -> String {
    let (exec, shell) = if compose {
        (
            "exec --host-programs ${EXANET_MPI_PREFIX:+--mount \"$EXANET_MPI_PREFIX\"}",
            "/usr/bin/sh",
        )
    } else {
        ("exec", "/bin/sh")
    };
    format!(
        r#"#!/bin/sh
# The remote-shell agent of this rack (ssh's command line, `exactl exec` underneath):
# launchers such as Open MPI's and MPICH's Hydra start their remote daemons with it.
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "rsh-agent: no host given" >&2
  exit 255
fi
host=${{1#*@}}; shift
exec '{}' --rack '{}' {exec} "$host" -- {shell} -c "$*"
"#,
        exactl.display(),
        rack_dir.display()
    )
}

/// Writes the rack's remote-shell agent, `run/mpi/rsh-agent` (see [`agent_script`]): from
/// `rack up` on, so that any launcher finds it, and again by `mpirun` (the rack may have
/// come up with another exactl).
pub fn write_agent(rack: &Rack, abs_dir: &Path, compose: bool) -> Result<std::path::PathBuf> {
    let mpi_dir = rack.layout().run_dir().join("mpi");
    std::fs::create_dir_all(&mpi_dir).map_err(|e| CliError::io("create", &mpi_dir, e))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find exactl's own binary: {e}")))?;
    let agent = mpi_dir.join(if compose {
        "rsh-agent-compose"
    } else {
        "rsh-agent"
    });
    std::fs::write(&agent, agent_script(&exe, abs_dir, compose))
        .map_err(|e| CliError::io("write", &agent, e))?;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| CliError::io("make executable", &agent, e))?;
    Ok(agent)
}

/// The directory libfabric loads the provider from (`FI_PROVIDER_PATH`): the rack's
/// `run/fi`, holding `libexanet-fi.so`, the name libfabric looks for, for the
/// `libexanet_fi.so` built beside this exactl. A link to it; on a compose rack a copy,
/// since the ranks' containers see the rack directory and not where the build is.
fn provider_dir(rack: &Rack, compose: bool) -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find exactl's own binary: {e}")))?;
    let beside = exe.with_file_name(PROVIDER_LIB);
    let Some(lib) = newest_provider(&exe) else {
        return Err(CliError::Failed(format!(
            "the libfabric provider is not built: no {} (cargo build --release -p exanet-fi, \
             or --fabric ip)",
            beside.display()
        )));
    };
    let dir = rack.layout().run_dir().join("fi");
    std::fs::create_dir_all(&dir).map_err(|e| CliError::io("create", &dir, e))?;
    let link = dir.join("libexanet-fi.so");
    let _ = std::fs::remove_file(&link);
    if compose {
        // A new file, not a rewrite of one a running job may have mapped.
        let part = dir.join(format!(".libexanet-fi.so.{}", std::process::id()));
        std::fs::copy(&lib, &part).map_err(|e| CliError::io("copy the provider to", &part, e))?;
        std::fs::rename(&part, &link).map_err(|e| CliError::io("rename", &part, e))?;
    } else {
        std::os::unix::fs::symlink(&lib, &link).map_err(|e| CliError::io("link", &link, e))?;
    }
    Ok(dir)
}

/// The compose rack's network as the MPI runtimes on this host take it.
struct ComposeNetwork {
    /// As Open MPI takes it (`10.213.0.0/16`).
    subnet: String,
    /// This host's address on it, which the containers reach.
    gateway: String,
}

/// The network of the compose rack, from the address of a node's container on it.
fn compose_network(container: &str) -> Result<ComposeNetwork> {
    let out = Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}/{{.IPPrefixLen}}/{{.Gateway}} {{end}}",
            container,
        ])
        .output()
        .map_err(|e| CliError::Failed(format!("cannot run docker: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find_map(|n| {
            let (cidr, gateway) = n.rsplit_once('/')?;
            let gateway: std::net::Ipv4Addr = gateway.parse().ok()?;
            Some(ComposeNetwork {
                subnet: network_of(cidr)?,
                gateway: gateway.to_string(),
            })
        })
        .ok_or_else(|| {
            CliError::Failed(format!(
                "container {container} has no IPv4 address and gateway on a network ({}{})",
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })
}

/// Where an MPI installed outside `/usr` lives (the directory above its launcher's
/// `bin`, e.g. a virtual environment with PyPI's MPICH), which the containers of a compose
/// rack need beside this host's `/usr`; `None` for one under `/usr`.
fn mpi_prefix(launcher: &std::ffi::OsStr) -> Option<std::path::PathBuf> {
    let prefix = launcher_path(launcher)?.parent()?.parent()?.to_path_buf();
    (!prefix.starts_with("/usr") && prefix != Path::new("/")).then_some(prefix)
}

/// The launcher's file, links resolved: as named when it names a path, else the first on
/// PATH.
fn launcher_path(launcher: &std::ffi::OsStr) -> Option<std::path::PathBuf> {
    let path = Path::new(launcher);
    let path = if path.components().count() > 1 {
        path.to_path_buf()
    } else {
        crate::process::on_path(launcher.to_str()?)?
    };
    path.canonicalize().ok()
}

/// `10.213.0.16/16` -> `10.213.0.0/16`.
fn network_of(cidr: &str) -> Option<String> {
    let (addr, prefix) = cidr.split_once('/')?;
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let prefix: u32 = prefix.parse().ok().filter(|p| *p <= 32)?;
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    Some(format!(
        "{}/{prefix}",
        std::net::Ipv4Addr::from(u32::from(addr) & mask)
    ))
}

/// The file name cargo gives the provider library.
const PROVIDER_LIB: &str = "libexanet_fi.so";

/// The provider built with this exactl: beside it (`cargo build`), or in `deps/` beside it,
/// where `cargo test` leaves it without copying it up. When both exist the newer is the one
/// built from the current source, since `cargo test` rewrites only the one in `deps/`.
fn newest_provider(exe: &Path) -> Option<std::path::PathBuf> {
    let dir = exe.parent()?;
    [dir.join(PROVIDER_LIB), dir.join("deps").join(PROVIDER_LIB)]
        .into_iter()
        .filter_map(|p| {
            let modified = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
            Some((modified, p))
        })
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p)
}

/// What `exactl mpirun` launches, and how.
pub struct Launch {
    pub mpi: Mpi,
    /// `None`: [`Fabric::choose`] picks.
    pub fabric: Option<Fabric>,
    /// `MPI_Wtime` and the program thread's `gettimeofday` answer the rank's modeled clock
    /// (needs `Fabric::Ni`).
    pub modeled: bool,
    pub ranks: Ranks,
    /// Ranks on each node (1..=[`MAX_RANKS_PER_NODE`]), consecutive ranks together.
    pub ranks_per_node: u32,
    pub launcher: Option<OsString>,
    pub mpirun_args: Vec<OsString>,
    pub program: Vec<OsString>,
}

/// Runs the program with one rank per chosen node; returns its exit status.
pub fn run(dir: &Path, launch: Launch) -> Result<i32> {
    let Launch {
        mpi,
        fabric,
        modeled,
        ranks,
        ranks_per_node,
        launcher,
        mpirun_args,
        program,
    } = launch;
    if !(1..=MAX_RANKS_PER_NODE).contains(&ranks_per_node) {
        return Err(CliError::Usage(format!(
            "--ranks-per-node {ranks_per_node}: 1 to {MAX_RANKS_PER_NODE} (an MPSoC has four \
             cores, one rank each)"
        )));
    }
    let launcher = mpi.launcher(launcher.as_ref())?;
    let ofi = mpi.has_ofi(&launcher);
    let (fabric, why) = Fabric::choose(fabric, mpi, ofi, modeled);
    if modeled && fabric != Fabric::Ni {
        return Err(CliError::Usage(
            "--modeled needs --fabric ni: over IP the program's messages carry no modeled time"
                .into(),
        ));
    }
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let compose = match rack.file.deploy.clone().unwrap_or(Deploy::Local) {
        Deploy::Local => None,
        Deploy::Compose { project, file } => Some((project, file)),
        Deploy::External { how } => {
            return Err(CliError::Usage(format!(
                "this rack's daemons are not run by exactl ({how}): exactl mpirun runs on \
                 local and compose racks"
            )))
        }
    };
    let (nodes, rank_count): (Vec<NodeId>, u32) = match ranks {
        Ranks::Nodes(n) => {
            let count = n.len() as u32 * ranks_per_node;
            (n, count)
        }
        Ranks::Count(n) if n == 0 || n > shape.nodes() * ranks_per_node => {
            return Err(CliError::Usage(format!(
                "-np {n}: the rack has {} nodes, {ranks_per_node} rank(s) each \
                 (--ranks-per-node)",
                shape.nodes()
            )))
        }
        Ranks::Count(n) => (
            shape
                .node_ids()
                .take(n.div_ceil(ranks_per_node) as usize)
                .collect(),
            n,
        ),
        Ranks::All => (shape.node_ids().collect(), shape.nodes() * ranks_per_node),
    };
    let names: Vec<String> = nodes.iter().map(|&id| shape.display(id)).collect();
    let slots = Slots {
        per_node: ranks_per_node,
        ranks: rank_count,
    };
    for n in names.iter().filter(|_| compose.is_none()) {
        if !crate::ip_service::netns_path(&rack, n).exists() {
            return Err(CliError::Failed(format!(
                "{n} has no network namespace: the rack runs without IP over ExaNet \
                 (`exactl rack up --ip on` as root starts it)"
            )));
        }
    }
    let abs_dir = dir
        .canonicalize()
        .map_err(|e| CliError::io("resolve the rack directory", dir, e))?;
    // Before anything is written or started: a node whose daemon is already gone would
    // only make the launcher wait for it. On compose racks the daemons run in containers
    // whose processes exactl does not own: they are watched through the control API only.
    let watch = crate::job_watch::Watch::start(&rack, &abs_dir, &names, compose.is_none())?;
    let job = Job::new();
    let mpi_dir = rack.layout().run_dir().join("mpi");
    let agent = write_agent(&rack, &abs_dir, compose.is_some())?;
    let hostfile = mpi_dir.join(format!("hostfile.{}", std::process::id()));
    std::fs::write(&hostfile, mpi.hostfile(&names, slots))
        .map_err(|e| CliError::io("write", &hostfile, e))?;
    let job_tmp = match compose {
        None => match job.make_tmp_dirs(&rack, &names) {
            Ok(dirs) => dirs,
            Err(e) => {
                let _ = std::fs::remove_file(&hostfile);
                return Err(e);
            }
        },
        Some(_) => Vec::new(),
    };
    // Gone with the job, or with this function at whatever error comes first.
    let mut staged = Staged {
        hostfile: Some(hostfile.clone()),
        dirs: job_tmp.clone(),
    };
    let provider = match fabric {
        Fabric::Ip => None,
        Fabric::Ni if !ofi => {
            return Err(CliError::Usage(format!(
                "--fabric ni needs an MPI that reaches fabrics through libfabric: Open MPI \
                 (mtl ofi) or an MPICH with ch4:ofi, whose mpichversion beside {} would say \
                 so (Debian's MPICH is ch4:ucx: use --fabric ip, or PyPI's `pip install \
                 mpich` and --mpirun with its mpiexec, see docs/mpi.md)",
                launcher.to_string_lossy()
            )))
        }
        Fabric::Ni => Some(provider_dir(&rack, compose.is_some())?),
    };
    eprintln!(
        "exactl: {} ranks{}, messages over {} ({why})",
        slots.ranks,
        if slots.per_node > 1 {
            format!(" ({} per node on {} nodes)", slots.per_node, names.len())
        } else {
            String::new()
        },
        match (fabric, mpi) {
            (Fabric::Ni, Mpi::Openmpi) =>
                "the NI (libfabric provider exanet, Open MPI pml cm / mtl ofi)",
            (Fabric::Ni, Mpi::Mpich) => "the NI (libfabric provider exanet, MPICH ch4:ofi)",
            (Fabric::Ip, _) => "TCP over IP over ExaNet",
        }
    );

    // Where the ranks find the provider: on a compose rack, in the rack directory as
    // their containers see it (`exactl exec --host-programs`).
    let rank_provider = match (&provider, &compose) {
        (Some(dir), Some(_)) => Some(
            dir.strip_prefix(&rack.dir)
                .map(|rel| Path::new("/rack").join(rel))
                .map_err(|_| {
                    CliError::Failed(format!(
                        "the provider's directory {} is outside the rack directory {}",
                        dir.display(),
                        rack.dir.display()
                    ))
                })?,
        ),
        (dir, None) => dir.clone(),
        (None, Some(_)) => None,
    };
    let mut command = Command::new(&launcher);
    let oob = match &compose {
        // mpirun runs on the first node: the orteds it starts reach it over the fabric.
        None => {
            crate::node_host::enter(
                &rack,
                &names[0],
                &crate::ip_service::netns_path(&rack, &names[0]),
            )?;
            // The job's own directory in the node's (made above), which is removed with
            // whatever the runtime left in it when the job ends.
            let tmp = job_tmp[0].clone();
            match mpi {
                // orted hands on only OMPI_* and what -x names: each rank keeps the
                // EXANET_NODE that `exactl exec` gave its node's orted.
                Mpi::Openmpi => command.env("EXANET_NODE", &names[0]).env("TMPDIR", &tmp),
                // Hydra gives every rank the launcher's whole environment, over what the
                // rank's node set: an EXANET_NODE or TMPDIR here would be the first node's
                // for every rank. Without them, a rank goes by what its node's `exactl
                // exec` set, or by its host name (the node's name).
                Mpi::Mpich => command.env_remove("EXANET_NODE").env_remove("TMPDIR"),
            };
            rack.ip_subnet().to_string()
        }
        // mpirun runs on this host, which the containers reach on the compose network:
        // the runtime's own connections go there, the messages through the NI.
        Some((project, file)) => {
            let first = crate::nodes::container_of(&rack, project, file, &names[0])?;
            let net = compose_network(&first)?;
            if let Some(prefix) = mpi_prefix(&launcher) {
                // Hydra's proxies and the ranks run from it in the containers.
                command.env("EXANET_MPI_PREFIX", prefix);
            }
            if mpi == Mpi::Mpich {
                // Hydra hands its proxies the address to call back on: by default this
                // host's name, which the containers do not resolve; its address on the
                // compose network they reach. Every rank takes the launcher's whole
                // environment, over what its container set: the rack is at /rack there.
                command
                    .arg("-localhost")
                    .arg(&net.gateway)
                    .args(["-genv", "EXANET_RACK", "/rack"])
                    .env_remove("EXANET_NODE")
                    .env_remove("TMPDIR");
            }
            net.subnet
        }
    };
    command.args(mpi.args(slots, &hostfile, &agent));
    if let Some(dir) = &rank_provider {
        // Open MPI's orted hands on only OMPI_* and what -x names; Hydra hands on the
        // launcher's whole environment, and -genv sets one for the ranks only.
        let rank_env = |command: &mut Command, name: &str, value: &std::ffi::OsStr| match mpi {
            Mpi::Openmpi => {
                let mut pair = OsString::from(name);
                pair.push("=");
                pair.push(value);
                command.arg("-x").arg(pair);
            }
            Mpi::Mpich => {
                command.arg("-genv").arg(name).arg(value);
            }
        };
        if mpi == Mpi::Openmpi {
            command.args(["-x", "FI_PROVIDER", "-x", "FI_PROVIDER_PATH"]);
        }
        if modeled {
            // The provider's own MPI_Wtime and gettimeofday, ahead of libmpi's and libc's:
            // the rank's modeled clock; and its MPI calls, which hold the rank's
            // attachment so that the MPI library's processing is not the program's
            // compute (exanet-fi's pmpi module).
            // The same file libfabric loads, so one copy of it serves both. Given to the
            // ranks only: on a compose rack the path is theirs, not this host's.
            rank_env(
                &mut command,
                "LD_PRELOAD",
                dir.join("libexanet-fi.so").as_os_str(),
            );
            // A send of ExaNet-MPI's rendezvous waited for its FIN (the receiver read
            // the application's buffer): so do the modeled ones.
            rank_env(
                &mut command,
                "FI_EXANET_SEND_COMPLETION",
                "delivery".as_ref(),
            );
            // ExaNeSt's cores polled: a rank that sleeps between polls spends more CPU
            // time in the MPI library's own code after each wake-up, and that CPU time
            // is modeled compute (docs/mpi.md).
            rank_env(&mut command, "FI_EXANET_IDLE", "poll".as_ref());
            // The MPI library's processing per call, the report's unless the rack file or
            // the user's environment says otherwise: Table 2's MPI rows from a rack as
            // `rack up` made it, while programs on the NI alone keep `software_ns`.
            // The MPI library's processing per call and the ranks' share of their node's
            // memory channel (`exanet::config::ENV_SOFTWARE_NS`, `ENV_MEMORY_CONTENTION`;
            // the provider counts the node's ranks): the rack's, unless the user's
            // environment says otherwise. Handed on either way: Open MPI's orted passes
            // on only what `-x` names.
            for (name, rack_value) in [
                ("EXANET_SOFTWARE_NS", rack.mpi_software_ns()),
                ("EXANET_MEMORY_CONTENTION", rack.memory_contention()),
            ] {
                let value = std::env::var_os(name)
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| rack_value.to_string().into());
                rank_env(&mut command, name, &value);
            }
            eprintln!(
                "exactl: MPI_Wtime and gettimeofday answer each rank's modeled clock; \
                 compute is the program's between its MPI calls"
            );
        }
    }
    command
        .args(&mpirun_args)
        .args(&program)
        .envs(mpi.env(
            &agent,
            &oob,
            &rack.ip_subnet().to_string(),
            rank_provider.as_deref(),
        ))
        // An orted that daemonized would outlive the `docker run` that started it, and
        // so be killed with its container: on a compose rack it stays attached.
        .envs(
            compose
                .as_ref()
                .map(|_| ("OMPI_MCA_orte_leave_session_attached", "1")),
        )
        .env("EXANET_RACK", &abs_dir)
        // Every process of the job inherits it: the launcher, the agent's `exactl exec`,
        // the runtime's daemons (Open MPI's orted daemonizes, out of exactl's process
        // tree) and the ranks. It is how the job is found and ended ([`Job`]).
        .env(JOB_ENV, &job.token);
    // Ctrl-C reaches the launcher (the terminal signals the whole foreground group) and
    // ends the job its own way; exactl stays to remove the host file and pass the status
    // on. A SIGTERM for exactl alone is handed to the launcher. The launcher starts with
    // the default dispositions (exec resets caught signals).
    crate::interrupt::catch();
    let ended = command.spawn().and_then(|mut child| {
        let mut handed_on = false;
        loop {
            if let Some(st) = child.try_wait()? {
                return Ok(Ended::Exited(st));
            }
            if crate::interrupt::raised() && !handed_on {
                handed_on = true;
                let _ = crate::process::signal(child.id() as i32, libc::SIGTERM);
            }
            if let Some(verdict) = watch.verdict() {
                eprintln!(
                    "exactl: {} during the job ({}): ending the job",
                    verdict.what(),
                    verdict.how()
                );
                return Ok(Ended::Watched(verdict, child));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    // A node that dies now is no reason to leave the job's processes behind: the
    // clean-up's own waits run to their end.
    let ended = match ended {
        Ok(Ended::Watched(verdict, mut child)) => {
            let swept = job.end(Some(&mut child), JOB_END_WAIT);
            Ok((None, Some(verdict), swept))
        }
        Ok(Ended::Exited(st)) => {
            // Whatever outlived the launcher (a daemon it could not reach, a rank of a
            // node it lost) goes with it; a moment first, for those on their way out.
            let swept = job.end_stragglers(STRAGGLER_GRACE);
            // The launcher may have ended on its own because of a node that died (an MPI
            // runtime notices a daemon of its own that died with the node, often before
            // the watch's silence is long enough): a failed job's nodes are asked once.
            // A job that succeeded is not failed after the fact by what the watch saw as
            // it ended; nor is a failed one ended because it was told to (Ctrl-C,
            // SIGTERM, which also cut short the requests) looked at for a silent node.
            let death = (!st.success())
                .then(|| watch.verdict())
                .flatten()
                .or_else(|| {
                    (!st.success() && !crate::interrupt::raised())
                        .then(|| watch.silent_now())
                        .flatten()
                });
            Ok((Some(st), death, swept))
        }
        Err(e) => Err(e),
    };
    crate::interrupt::restore();
    let left_dirs = staged.remove();
    let (status, death, swept) = ended.map_err(|e| {
        CliError::Failed(format!(
            "cannot run {} (Debian: apt-get install {}): {e}",
            launcher.to_string_lossy(),
            mpi.package()
        ))
    })?;
    drop(watch);
    if let Some(death) = &death {
        if status.is_some() {
            eprintln!("exactl: {} during the job ({})", death.what(), death.how());
        }
    }
    if !swept.ended.is_empty() && death.is_none() {
        eprintln!(
            "exactl: {} process(es) of the job outlived its launcher and were ended: {}",
            swept.ended.len(),
            swept.describe_ended()
        );
    }
    let mut left = Vec::new();
    if !swept.left.is_empty() {
        left.push(format!(
            "process(es) {} of the job would not end",
            swept.describe_left()
        ));
    }
    if !left_dirs.is_empty() {
        left.push(format!("could not remove {}", left_dirs.join(", ")));
    }
    match (death, status) {
        (Some(death), _) => Err(CliError::Failed(format!(
            "the job ended because {} ({}, noticed {:.1} s after the launcher started): {}",
            death.what(),
            death.how(),
            death.after().as_secs_f64(),
            if left.is_empty() {
                format!(
                    "{} process(es) of it ended in {:.1} s, nothing of it left",
                    swept.ended.len(),
                    swept.took.as_secs_f64()
                )
            } else {
                left.join("; ")
            }
        ))),
        (None, _) if !left.is_empty() => Err(CliError::Failed(format!(
            "the job is over but not all gone: {}",
            left.join("; ")
        ))),
        (None, Some(status)) => {
            use std::os::unix::process::ExitStatusExt;
            Ok(status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
        }
        (None, None) => Err(CliError::Failed(
            "the launcher ended without a status".into(),
        )),
    }
}

/// What `run` wrote for a job (its host file, its directory on each node), removed when
/// the job is over or, at an error before it starts, when `run` returns.
struct Staged {
    hostfile: Option<std::path::PathBuf>,
    dirs: Vec<std::path::PathBuf>,
}

impl Staged {
    /// Removes it all; what could not be removed, said.
    fn remove(&mut self) -> Vec<String> {
        if let Some(h) = self.hostfile.take() {
            let _ = std::fs::remove_file(h);
        }
        Job::remove_tmp_dirs(&std::mem::take(&mut self.dirs))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for left in self.remove() {
            eprintln!("exactl: could not remove the job's directory {left}");
        }
    }
}

/// The variable that marks every process of one `exactl mpirun` job, with the job's
/// token as its value. `exactl exec` reads it to give the command the job's temporary
/// directory ([`job_tmp_dir`]).
pub const JOB_ENV: &str = "EXANET_MPIRUN_JOB";

/// How long the job's processes have after SIGTERM before SIGKILL, and how long exactl
/// tries in all. MPI runtimes that lost a node wait for it for minutes (Open MPI's mpirun
/// printed "abort is already in progress" and waited), so the grace is short.
const JOB_END_WAIT: EndWait = EndWait {
    term: Duration::from_secs(1),
    total: Duration::from_secs(10),
};
/// How long the processes still there after the launcher exited have to go on their own
/// (Open MPI's orted exits just after mpirun) before they are ended as above.
const STRAGGLER_GRACE: Duration = Duration::from_secs(2);

/// How many ranks, and how many on each node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slots {
    per_node: u32,
    ranks: u32,
}

/// How the launcher's wait ended.
enum Ended {
    Exited(std::process::ExitStatus),
    /// The watch saw the job could not go on.
    Watched(crate::job_watch::Verdict, std::process::Child),
}

/// How long [`Job::end`] waits.
#[derive(Clone, Copy, Debug)]
struct EndWait {
    term: Duration,
    total: Duration,
}

/// One `exactl mpirun` job: the token its processes carry in [`JOB_ENV`].
struct Job {
    token: String,
}

/// What ending a job's processes did.
#[derive(Debug, Default)]
struct Swept {
    /// Processes signalled (pid, command name).
    ended: Vec<(i32, String)>,
    /// Processes still there when exactl gave up.
    left: Vec<(i32, String)>,
    took: Duration,
}

impl Swept {
    fn describe(list: &[(i32, String)]) -> String {
        list.iter()
            .map(|(pid, name)| format!("{name} ({pid})"))
            .collect::<Vec<_>>()
            .join(", ")
    }
    fn describe_ended(&self) -> String {
        Swept::describe(&self.ended)
    }
    fn describe_left(&self) -> String {
        Swept::describe(&self.left)
    }
}

impl Job {
    /// A token no other job of this host carries: this exactl's pid and the time.
    fn new() -> Job {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Job {
            token: format!("{}-{nanos}", std::process::id()),
        }
    }

    /// Makes the job's temporary directory on each node (see [`job_tmp_dir`]): a new one,
    /// or the job is refused. Open MPI keeps its session directory there, PMIx its
    /// shared-memory store; a job ended by SIGKILL removes none of it itself.
    fn make_tmp_dirs(&self, rack: &Rack, names: &[String]) -> Result<Vec<std::path::PathBuf>> {
        let mut made = Vec::with_capacity(names.len());
        for n in names {
            let base = crate::ip_service::node_tmp_dir(rack, n)?;
            let dir = base.join(job_dir_name(&self.token));
            let created = std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| CliError::io("create the job's temporary directory", &dir, e));
            if let Err(e) = created {
                Job::remove_tmp_dirs(&made);
                return Err(e);
            }
            made.push(dir);
        }
        Ok(made)
    }

    /// Removes the job's temporary directories; returns those it could not.
    fn remove_tmp_dirs(dirs: &[std::path::PathBuf]) -> Vec<String> {
        dirs.iter()
            .filter(|d| match std::fs::remove_dir_all(d) {
                Ok(()) => false,
                Err(e) => e.kind() != std::io::ErrorKind::NotFound,
            })
            .map(|d| d.display().to_string())
            .collect()
    }

    /// The processes of this host that carry the job's token (not exactl itself), with
    /// their command names. Ranks and runtime daemons run in the nodes' network, UTS
    /// and mount namespaces, but in this PID namespace.
    fn processes(&self) -> Vec<(i32, String)> {
        let want = format!("{JOB_ENV}={}", self.token);
        let me = std::process::id() as i32;
        let Ok(proc_dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut found: Vec<(i32, String)> = proc_dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| pid != me && pid > 1)
            .filter(|&pid| {
                // Gone meanwhile, or another user's: not the job's (its processes are
                // this user's, whose environment this user reads).
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want.as_bytes()))
            })
            .map(|pid| {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|c| c.trim().to_string())
                    .unwrap_or_else(|_| "?".into());
                (pid, name)
            })
            .collect();
        found.sort_unstable();
        found
    }

    /// Ends every process of the job: SIGTERM, then SIGKILL to what is left after
    /// `wait.term`, looking again until none is left (a daemon may start a rank meanwhile)
    /// or `wait.total` has passed. `launcher` is reaped.
    fn end(&self, mut launcher: Option<&mut std::process::Child>, wait: EndWait) -> Swept {
        let start = Instant::now();
        let mut swept = Swept::default();
        let mut killing = false;
        loop {
            if let Some(c) = launcher.as_deref_mut() {
                let _ = c.try_wait();
            }
            let now = self.processes();
            if now.is_empty() {
                break;
            }
            if start.elapsed() >= wait.total {
                swept.left = now;
                break;
            }
            if !killing && start.elapsed() >= wait.term {
                killing = true;
            }
            let sig = if killing {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            for (pid, name) in &now {
                if !swept.ended.iter().any(|(p, _)| p == pid) {
                    swept.ended.push((*pid, name.clone()));
                } else if !killing {
                    // Sent its SIGTERM already.
                    continue;
                }
                let _ = crate::process::signal(*pid, sig);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(c) = launcher {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        swept.took = start.elapsed();
        swept
    }

    /// After the launcher exited: what of the job is still there after `grace` is ended
    /// ([`Job::end`]).
    fn end_stragglers(&self, grace: Duration) -> Swept {
        let start = Instant::now();
        while start.elapsed() < grace && !self.processes().is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.end(None, JOB_END_WAIT)
    }
}

/// The name of a job's directory in a node's temporary directory.
fn job_dir_name(token: &str) -> String {
    format!("job.{token}")
}

/// The temporary directory `exactl exec` gives a command of job `token` on the node whose
/// temporary directory is `node_tmp`: the job's own, made by `exactl mpirun`, when it is
/// there and a directory of this user's (not a link) that no one else may enter; `None`
/// when the token is not one exactl makes or the directory is not there (the job is
/// over, or was not started by `exactl mpirun`), and the node's own serves. A directory
/// under that name that is not the job's is refused: it is someone else's.
pub fn job_tmp_dir(node_tmp: &Path, token: &str) -> Result<Option<std::path::PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    if token.is_empty()
        || token.len() > 64
        || !token.bytes().all(|b| b.is_ascii_digit() || b == b'-')
    {
        return Ok(None);
    }
    let dir = node_tmp.join(job_dir_name(token));
    let meta = match std::fs::symlink_metadata(&dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(CliError::io(
                "inspect the job's temporary directory",
                dir,
                e,
            ))
        }
    };
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(CliError::Failed(format!(
            "{}, the temporary directory of MPI job {token}, is not the job's (a {} of uid \
             {}, mode {:o}): it is not handed to commands as TMPDIR",
            dir.display(),
            if meta.is_dir() {
                "directory"
            } else {
                "file or link"
            },
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compose_network_is_named_by_a_containers_address_on_it() {
        assert_eq!(
            network_of("10.213.0.16/16").as_deref(),
            Some("10.213.0.0/16")
        );
        assert_eq!(
            network_of("172.18.3.7/24").as_deref(),
            Some("172.18.3.0/24")
        );
        assert_eq!(network_of("10.0.0.1/0").as_deref(), Some("0.0.0.0/0"));
        assert_eq!(network_of("10.0.0.1/32").as_deref(), Some("10.0.0.1/32"));
        for bad in ["10.0.0.1/33", "fe80::1/64", "/16", "10.0.0.1", ""] {
            assert_eq!(network_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_host_file_gives_each_node_its_ranks_the_last_perhaps_fewer() {
        let names = ["M1QAF1".to_string(), "M1QAF2".to_string()];
        let slots = Slots {
            per_node: 4,
            ranks: 6,
        };
        assert_eq!(
            Mpi::Openmpi.hostfile(&names, slots),
            "M1QAF1 slots=4\nM1QAF2 slots=2\n"
        );
        assert_eq!(Mpi::Mpich.hostfile(&names, slots), "M1QAF1:4\nM1QAF2:2\n");
        let a = Mpi::Openmpi.args(slots, Path::new("h"), Path::new("a"));
        let a: Vec<_> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        assert_eq!(a, ["-np", "6", "--hostfile", "h", "--map-by", "slot"]);
    }

    #[test]
    fn a_fabric_asked_for_or_needed_is_the_one_used() {
        for mpi in [Mpi::Openmpi, Mpi::Mpich] {
            for f in [Fabric::Ni, Fabric::Ip] {
                assert_eq!(Fabric::choose(Some(f), mpi, true, false).0, f);
            }
        }
        assert_eq!(Fabric::choose(None, Mpi::Openmpi, true, true).0, Fabric::Ni);
        // Debian's MPICH cannot load the provider: IP unless asked otherwise.
        let (f, why) = Fabric::choose(None, Mpi::Mpich, false, false);
        assert_eq!(f, Fabric::Ip);
        assert!(why.contains("ch4:ucx"), "{why}");
    }

    #[test]
    fn an_mpich_with_ofi_among_its_devices_can_load_the_provider() {
        let wheel = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\nMPICH configure:    --with-device=ch4:ucx,ofi\n";
        let debian = "MPICH Version:    \t4.0.2\nMPICH Device:    \tch4:ucx\nMPICH configure: \t--with-libfabric=/usr --with-device=ch4:ucx\n";
        assert!(mpich_device_has_ofi(wheel));
        assert!(mpich_device_has_ofi("MPICH Device: ch4:ofi\n"));
        assert!(!mpich_device_has_ofi(debian));
        assert!(!mpich_device_has_ofi("MPICH Device: ch4:ofish\n"));
        assert!(!mpich_device_has_ofi(""));
    }

    /// The agent skips what ssh takes before the host, strips a user, and hands the rest
    /// to `exactl exec` as one shell line: run with a stand-in exactl that prints its
    /// arguments.
    #[test]
    fn the_agent_takes_ssh_options_before_the_host() {
        let dir = std::env::temp_dir().join(format!("exactl-agent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("exactl");
        std::fs::write(
            &fake,
            "#!/bin/sh\nfor a in \"$@\"; do echo \"[$a]\"; done\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let agent = dir.join("rsh-agent");
        std::fs::write(&agent, agent_script(&fake, Path::new("/racks/r"), false)).unwrap();
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new(&agent).args(args).output().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        let want = "[--rack]\n[/racks/r]\n[exec]\n[M1QAF2]\n[--]\n[/bin/sh]\n[-c]\n[hydra_pmi_proxy --control-port vm:1234]\n";
        for args in [
            &["M1QAF2", "hydra_pmi_proxy", "--control-port", "vm:1234"][..],
            &[
                "-x",
                "M1QAF2",
                "hydra_pmi_proxy",
                "--control-port",
                "vm:1234",
            ],
            &[
                "-q",
                "-x",
                "-o",
                "BatchMode=yes",
                "-p",
                "22",
                "-l",
                "root",
                "M1QAF2",
                "hydra_pmi_proxy",
                "--control-port",
                "vm:1234",
            ],
            &[
                "-oBatchMode=yes",
                "root@M1QAF2",
                "hydra_pmi_proxy",
                "--control-port",
                "vm:1234",
            ],
            &[
                "-x",
                "--",
                "M1QAF2",
                "hydra_pmi_proxy",
                "--control-port",
                "vm:1234",
            ],
        ] {
            assert_eq!(run(args), (Some(0), want.to_string()), "{args:?}");
        }
        // No host: ssh's failure status, and a word on stderr.
        assert_eq!(run(&["-x", "-p", "22"]).0, Some(255));

        // On a compose rack: beside the node, with the MPI's own directory when the
        // launcher's environment names one (a path with a space stays one argument).
        std::fs::write(&agent, agent_script(&fake, Path::new("/racks/r"), true)).unwrap();
        let compose = |prefix: Option<&str>| {
            let mut c = Command::new(&agent);
            c.args(["-x", "M1QAF2", "hydra_pmi_proxy"]);
            match prefix {
                Some(p) => c.env("EXANET_MPI_PREFIX", p),
                None => c.env_remove("EXANET_MPI_PREFIX"),
            };
            String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
        };
        let tail = "[M1QAF2]\n[--]\n[/usr/bin/sh]\n[-c]\n[hydra_pmi_proxy]\n";
        assert_eq!(
            compose(None),
            format!("[--rack]\n[/racks/r]\n[exec]\n[--host-programs]\n{tail}")
        );
        assert_eq!(
            compose(Some("/opt/my mpich")),
            format!(
                "[--rack]\n[/racks/r]\n[exec]\n[--host-programs]\n[--mount]\n[/opt/my mpich]\n{tail}"
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A job's processes get its own temporary directory only when it is the job's: made
    /// by this user, a directory and not a link, closed to others. A token exactl does
    /// not make, or a directory that is not there, leaves the node's.
    #[test]
    fn a_jobs_temporary_directory_is_handed_out_only_when_it_is_the_jobs() {
        let base = std::env::temp_dir().join(format!("exactl-jobtmp-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let token = "123-456";
        let dir = base.join(job_dir_name(token));
        assert_eq!(job_tmp_dir(&base, token).unwrap(), None, "not made yet");
        for bad in ["", "../x", "1/2", "a-b"] {
            assert_eq!(job_tmp_dir(&base, bad).unwrap(), None, "{bad:?}");
        }
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        assert_eq!(job_tmp_dir(&base, token).unwrap(), Some(dir.clone()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(job_tmp_dir(&base, token).is_err(), "open to others");
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&base, &dir).unwrap();
        let e = job_tmp_dir(&base, token).unwrap_err().to_string();
        assert!(e.contains("file or link"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// An MPI outside `/usr` is mounted from the directory above its launcher's `bin`
    /// (links resolved); one under `/usr` is there already.
    #[test]
    fn an_mpi_outside_usr_is_found_above_its_launchers_bin() {
        let dir = std::env::temp_dir().join(format!("exactl-prefix-{}", std::process::id()));
        let bin = dir.join("venv/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("mpiexec.hydra"), "").unwrap();
        std::os::unix::fs::symlink("mpiexec.hydra", bin.join("mpiexec")).unwrap();
        let venv = dir.join("venv").canonicalize().unwrap();
        assert_eq!(mpi_prefix(bin.join("mpiexec").as_os_str()), Some(venv));
        assert_eq!(mpi_prefix("/usr/bin/mpirun.openmpi".as_ref()), None);
        assert_eq!(mpi_prefix(dir.join("nothing/bin/x").as_os_str()), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
