//! `exactl exec NODE [--] CMD [ARGS...]`: runs a command on an emulated node, with its
//! standard input, output and error connected and its exit status passed through, so that
//! it can stand in for `ssh NODE CMD` (e.g. as Open MPI's remote-shell agent).
//!
//! On a local rack the command runs on this host with the node's attach settings
//! (`EXANET_RACK`, `EXANET_NODE`): the workloads it starts attach to that node's daemon.
//! When the rack runs IP over ExaNet, the command runs on the node as on a host of its
//! own (`crate::node_host`): the node's network namespace, where the node's TUN device and
//! address are its network, its name as host name, the rack's hosts file as `/etc/hosts`.
//! On a compose rack it runs inside the node's container (`compose exec`), whose
//! environment already names the node.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use exanet_control::rack::{Deploy, Rack};
use exanet_proto::NodeName;

use crate::error::{CliError, Result};

/// What a shell returns for a command it could not run (`sh`: 126 not executable, 127
/// not found); exactl does the same so that callers cannot take it for the command's own.
const CANNOT_EXECUTE: i32 = 126;
const NOT_FOUND: i32 = 127;

/// Runs `cmd` on `node`; returns only on an error before the command ran (on success the
/// process becomes the command, or exits with its status).
pub fn run(dir: &Path, node: NodeName, cmd: &[OsString]) -> Result<()> {
    let rack = Rack::load(dir)?;
    let shape = rack.shape();
    let id = shape.id_of(node)?;
    let name = shape.display(id);
    let Some((program, args)) = cmd.split_first() else {
        return Err(CliError::Usage("exec needs a command to run".into()));
    };
    match rack.file.deploy.clone().unwrap_or(Deploy::Local) {
        Deploy::Local => {
            let rack_dir = rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone());
            let ns = crate::ip_service::netns_path(&rack, &name);
            let mut command = Command::new(program);
            if ns.exists() {
                crate::node_host::enter(&rack, &name, &ns)?;
                // A host of its own has a /tmp of its own.
                command.env(
                    "TMPDIR",
                    crate::ip_service::ensure_node_tmp_dir(&rack, &name)?,
                );
            }
            let e = command
                .args(args)
                .env("EXANET_RACK", rack_dir)
                .env("EXANET_NODE", &name)
                .exec();
            cannot_run(program, &name, &e)
        }
        Deploy::Compose { project, file } => {
            let status = crate::nodes::compose_command()
                .arg("-p")
                .arg(&project)
                .arg("-f")
                .arg(rack.dir.join(&file))
                .args(["exec", "-T"])
                .arg(&name)
                .arg(program)
                .args(args)
                .status()
                .map_err(|e| CliError::Failed(format!("cannot run the compose tool: {e}")))?;
            // A signal's death is reported as a shell does: 128 + the signal.
            let code = status.code().unwrap_or_else(|| {
                use std::os::unix::process::ExitStatusExt;
                128 + status.signal().unwrap_or(0)
            });
            std::process::exit(code)
        }
        Deploy::External { how } => Err(CliError::Usage(format!(
            "this rack's daemons are not run by exactl ({how}); run commands on {name} there"
        ))),
    }
}

/// Says why `program` could not be started and exits as a shell would.
fn cannot_run(program: &OsString, node: &str, e: &std::io::Error) -> ! {
    eprintln!(
        "exactl: cannot run {} on {node}: {e}",
        program.to_string_lossy()
    );
    std::process::exit(match e.kind() {
        std::io::ErrorKind::NotFound => NOT_FOUND,
        _ => CANNOT_EXECUTE,
    })
}
