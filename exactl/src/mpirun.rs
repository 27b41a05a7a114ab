//! `exactl mpirun [--nodes LIST | -np N] -- PROGRAM [ARGS...]`: an unmodified MPI program
//! with one rank per emulated node, over IP over ExaNet.
//!
//! Debian's Open MPI runs as it would on a cluster: `mpirun` starts in the first node's
//! network namespace, and reaches the other nodes through a remote-shell agent that is
//! `exactl exec` (a two-line script in `run/mpi/`, with ssh's semantics: the command is
//! one string for a shell). Its settings, passed as `OMPI_MCA_*` in the environment (which
//! the agent hands on to every `orted` and rank):
//!
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
//! - `OMPI_ALLOW_RUN_AS_ROOT*` when run as root (namespaces need root).
//!
//! Every node has a temporary directory of its own (`TMPDIR`, see
//! [`crate::ip_service::node_tmp_dir`]): Open MPI keys its session directory, and PMIx its
//! shared-memory store, by host name, which all the nodes' namespaces share; in one
//! directory the nodes' daemons found each other's files and jobs hung now and then.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use exanet_control::rack::{Deploy, Rack};
use exanet_proto::NodeId;

use crate::error::{CliError, Result};

/// Which nodes get a rank.
pub enum Ranks {
    /// These nodes, in this order.
    Nodes(Vec<NodeId>),
    /// The first N nodes by id (whole QFDBs first).
    Count(u32),
    /// Every node.
    All,
}

/// The Open MPI settings `exactl mpirun` runs with (see the module docs).
pub fn mca_env(agent: &Path, subnet: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("OMPI_MCA_plm_rsh_agent".into(), agent.display().to_string()),
        ("OMPI_MCA_plm_rsh_no_tree_spawn".into(), "1".into()),
        ("OMPI_MCA_pml".into(), "ob1".into()),
        ("OMPI_MCA_btl".into(), "tcp,self".into()),
        ("OMPI_MCA_btl_tcp_if_include".into(), subnet.into()),
        ("OMPI_MCA_oob_tcp_if_include".into(), subnet.into()),
        ("OMPI_MCA_mpi_yield_when_idle".into(), "1".into()),
    ];
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        env.push(("OMPI_ALLOW_RUN_AS_ROOT".into(), "1".into()));
        env.push(("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM".into(), "1".into()));
    }
    env
}

/// Runs `program` with one rank per chosen node; returns its exit status.
pub fn run(
    dir: &Path,
    ranks: Ranks,
    mpirun: &OsString,
    mpirun_args: &[OsString],
    program: &[OsString],
) -> Result<i32> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    if !matches!(
        rack.file.deploy.clone().unwrap_or(Deploy::Local),
        Deploy::Local
    ) {
        return Err(CliError::Usage(
            "exactl mpirun runs on local racks (IP over ExaNet in compose racks is not there yet)"
                .into(),
        ));
    }
    let nodes: Vec<NodeId> = match ranks {
        Ranks::Nodes(n) => n,
        Ranks::Count(n) if n == 0 || n > shape.nodes() => {
            return Err(CliError::Usage(format!(
                "-np {n}: the rack has {} nodes, one rank each",
                shape.nodes()
            )))
        }
        Ranks::Count(n) => shape.node_ids().take(n as usize).collect(),
        Ranks::All => shape.node_ids().collect(),
    };
    let names: Vec<String> = nodes.iter().map(|&id| shape.display(id)).collect();
    for n in &names {
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
    let mpi_dir = rack.layout().run_dir().join("mpi");
    std::fs::create_dir_all(&mpi_dir).map_err(|e| CliError::io("create", &mpi_dir, e))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find exactl's own binary: {e}")))?;
    // ssh's semantics: the remote command is the arguments joined into one shell line.
    let agent = mpi_dir.join("rsh-agent");
    let script = format!(
        "#!/bin/sh\n# Open MPI's remote-shell agent for this rack: `exactl exec` with ssh's semantics.\nhost=$1; shift\nexec '{}' --rack '{}' exec \"$host\" -- /bin/sh -c \"$*\"\n",
        exe.display(),
        abs_dir.display()
    );
    std::fs::write(&agent, script).map_err(|e| CliError::io("write", &agent, e))?;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| CliError::io("make executable", &agent, e))?;
    let hostfile = mpi_dir.join(format!("hostfile.{}", std::process::id()));
    let hosts: String = names.iter().map(|n| format!("{n} slots=1\n")).collect();
    std::fs::write(&hostfile, hosts).map_err(|e| CliError::io("write", &hostfile, e))?;

    // mpirun runs on the first node: the orteds it starts reach it over the fabric.
    crate::exec::enter_netns(&crate::ip_service::netns_path(&rack, &names[0]))?;
    let tmp = crate::ip_service::ensure_node_tmp_dir(&rack, &names[0])?;
    let status = Command::new(mpirun)
        .arg("-np")
        .arg(names.len().to_string())
        .arg("--hostfile")
        .arg(&hostfile)
        .arg("--map-by")
        .arg("node")
        .args(mpirun_args)
        .args(program)
        .envs(mca_env(&agent, &rack.ip_subnet().to_string()))
        .env("EXANET_RACK", &abs_dir)
        .env("EXANET_NODE", &names[0])
        .env("TMPDIR", &tmp)
        .status();
    let _ = std::fs::remove_file(&hostfile);
    let status = status.map_err(|e| {
        CliError::Failed(format!(
            "cannot run {} (Debian: apt-get install openmpi-bin): {e}",
            mpirun.to_string_lossy()
        ))
    })?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
