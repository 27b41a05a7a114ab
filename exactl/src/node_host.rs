//! A node of a local rack with IP over ExaNet is a host of its own, as the prototype's
//! MPSoCs were: what `exactl exec` (and `exactl mpirun`) starts on it sees
//!
//! - the node's network namespace (`exanet-RACK-NODE`): loopback and the TUN device
//!   `exanet0`, the same name on every node, so one `btl_tcp_if_include`,
//!   `UCX_NET_DEVICES` or `-iface` names it everywhere;
//! - the node's name as its host name (a UTS namespace of its own);
//! - the rack's hosts file as `/etc/hosts` (a mount namespace of its own, in which only
//!   that file and `/sys` differ from the host's): `localhost`, and every node's name with
//!   its rack address, so a launcher that tells its remote daemons to call back to
//!   `$(hostname)` reaches it over the fabric;
//! - a `/sys` mounted from inside the node, whose `/sys/class/net` lists the node's
//!   devices (UCX finds its TCP devices there), as `ip netns exec` does.
//!
//! The UTS and mount namespaces are made for each command started on the node, the way
//! `ip netns exec` does it, not kept beside the network namespace: a command's children
//! share them, and nothing has to be unmounted or can be left behind by a rack that was
//! not taken down. The mount namespace is a slave of the host's, so the host's later
//! mounts still show in it and nothing mounted in it reaches the host: the host's name
//! and `/etc/hosts` never change.

use std::path::{Path, PathBuf};

use exanet_control::rack::Rack;
use nix::mount::{mount, MsFlags};

use crate::error::{CliError, Result};

pub use exanet_control::ip::DEVICE;

/// The rack's hosts file, which every node sees as `/etc/hosts`.
pub fn hosts_file(rack: &Rack) -> PathBuf {
    rack.layout().ip_run_dir().join("hosts")
}

/// What the nodes' `/etc/hosts` says: loopback's names, then every node's name with its
/// rack address (`exactl hosts`).
pub fn hosts_text(rack: &Rack) -> Result<String> {
    Ok(format!(
        "# The /etc/hosts of every node of this rack (written by `exactl rack up`).\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         {}",
        crate::hosts::fragment(rack)?
    ))
}

/// Writes the rack's hosts file (whole or not at all: a node starting meanwhile reads
/// either the old file or the new one).
pub fn write_hosts_file(rack: &Rack) -> Result<PathBuf> {
    let path = hosts_file(rack);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| CliError::io("create", dir, e))?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, hosts_text(rack)?).map_err(|e| CliError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| CliError::io("rename into place", &path, e))?;
    Ok(path)
}

/// Makes this process (and what it starts from now on) a process of `node`: enters the
/// node's network namespace at `netns`, takes the node's name as its host name and the
/// rack's hosts file as `/etc/hosts`. exactl is single-threaded here, so the whole
/// process moves.
pub fn enter(rack: &Rack, node: &str, netns: &Path) -> Result<()> {
    enter_netns(netns)?;
    let failed = |what: &str, e: nix::Error| {
        CliError::Failed(format!("cannot make {node} a host of its own: {what}: {e}"))
    };
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUTS | nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| failed("new UTS and mount namespaces", e))?;
    nix::unistd::sethostname(node).map_err(|e| failed("set the host name", e))?;
    // Before the bind mount: where `/` is a shared mount (systemd makes it one), a mount
    // made here would otherwise appear in the host's namespace too.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| failed("make the mounts private to the node", e))?;
    // sysfs shows the network devices of the namespace that mounted it: the host's copy
    // lists the host's, and programs that find their interfaces there (UCX does) would
    // see no `exanet0`. A sysfs mounted from inside the node lists the node's, as
    // `ip netns exec` does it.
    let _ = nix::mount::umount2("/sys", nix::mount::MntFlags::MNT_DETACH);
    mount(
        Some("sysfs"),
        "/sys",
        Some("sysfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| failed("mount the node's /sys", e))?;
    let hosts = hosts_file(rack);
    if !hosts.is_file() {
        // A rack brought up by an exactl that did not write it.
        write_hosts_file(rack)?;
    }
    let etc_hosts = Path::new("/etc/hosts");
    if etc_hosts.exists() {
        mount(
            Some(&hosts),
            etc_hosts,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| failed("bind the rack's hosts file on /etc/hosts", e))?;
        // Read-only in the nodes: one node's root editing its /etc/hosts must not rewrite
        // every node's.
        mount(
            None::<&str>,
            etc_hosts,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| failed("make /etc/hosts read-only", e))?;
    }
    Ok(())
}

/// Moves this process into the network namespace at `path` (exactl is single-threaded
/// here, so the whole process, and the command it becomes, is in it).
fn enter_netns(path: &Path) -> Result<()> {
    let f = std::fs::File::open(path).map_err(|e| CliError::io("open", path, e))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
        CliError::Failed(format!(
            "cannot enter the node's network namespace {}: {e}",
            path.display()
        ))
    })
}
