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
//! environment already names the node. With `--host-programs` it runs instead in a
//! container of its own beside the node's ([`beside`]): the programs of the node's image
//! are exanet's only, while an MPI and its applications are installed on the host
//! (`--mount DIR` adds a directory outside `/usr`, e.g. an MPI's virtual environment).

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
/// process becomes the command, or exits with its status). `host_programs`: run beside a
/// compose rack's node with this host's programs, and these directories too.
pub fn run(
    dir: &Path,
    node: NodeName,
    cmd: &[OsString],
    host_programs: Option<&[std::path::PathBuf]>,
) -> Result<()> {
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
                // A host of its own has a /tmp of its own, checked here, as the command
                // is about to get it, not only when `rack up` made it.
                let tmp = crate::ip_service::node_tmp_dir(&rack, &name)?;
                // A process of an `exactl mpirun` job (its runtime's daemon, started
                // through the rack's remote-shell agent) gets the job's own directory in
                // it, which `exactl mpirun` removes when the job ends, however it ends.
                let job = std::env::var(crate::mpirun::JOB_ENV).ok();
                let tmp = match job.as_deref() {
                    Some(token) => crate::mpirun::job_tmp_dir(&tmp, token)?.unwrap_or(tmp),
                    None => tmp,
                };
                command.env("TMPDIR", tmp);
            }
            let e = command
                .args(args)
                .env("EXANET_RACK", rack_dir)
                .env("EXANET_NODE", &name)
                .exec();
            cannot_run(program, &name, &e)
        }
        Deploy::Compose { project, file } if host_programs.is_some() => {
            let mounts = host_programs.unwrap_or_default();
            for m in mounts {
                if !m.is_absolute() || !m.is_dir() {
                    return Err(CliError::Usage(format!(
                        "--mount {}: not an absolute path of a directory on this host",
                        m.display()
                    )));
                }
            }
            let container = crate::nodes::container_of(&rack, &project, &file, &name)?;
            let status = beside(&rack, &container, &name, mounts, program, args)?
                .status()
                .map_err(|e| CliError::Failed(format!("cannot run docker: {e}")))?;
            std::process::exit(exit_code(status))
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
            std::process::exit(exit_code(status))
        }
        Deploy::External { how } => Err(CliError::Usage(format!(
            "this rack's daemons are not run by exactl ({how}); run commands on {name} there"
        ))),
    }
}

/// A command's status as a shell reports it: a death by signal is 128 + the signal.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Variables of this process that a command run beside a node does not take: they name
/// this host's places and the node is another host.
const HOST_ONLY: &[&str] = &[
    "HOME",
    "HOSTNAME",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "TMPDIR",
    "_",
    "EXANET_RACK",
    "EXANET_NODE",
];

/// `docker run` of `program` in a container beside `node`'s `container`: its IPC namespace
/// (the NI's doorbells), its PID namespace (the daemon sees the workload's threads, which
/// modeled time asks about), its network namespace (the node's address on the compose
/// network: an MPI's runtime reaches it there), the rack directory at `/rack` (the NI's
/// socket), the node's image for the dynamic loader and a shell, and over it this host's
/// `/usr` and `/etc/alternatives` read-only and the working directory read-write, at the
/// same paths: a program installed here, its libraries and data, and the files of the
/// directory it was started in, and `mounts` read-only. This process's environment goes
/// with it, but for what names this host.
pub fn beside(
    rack: &Rack,
    container: &str,
    node: &str,
    mounts: &[std::path::PathBuf],
    program: &OsString,
    args: &[OsString],
) -> Result<Command> {
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.Config.Image}}", container])
        .output()
        .map_err(|e| CliError::Failed(format!("cannot run docker: {e}")))?;
    let image = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || image.is_empty() {
        return Err(CliError::Failed(format!(
            "cannot find the image of {node}'s container {container}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let rack_dir = rack.dir.canonicalize().unwrap_or_else(|_| rack.dir.clone());
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::Failed(format!("cannot find the working directory: {e}")))?;
    let mut c = Command::new("docker");
    // -i: its standard input is the caller's, as `exactl exec` promises everywhere.
    c.args(["run", "--rm", "-i"]);
    for ns in ["--ipc", "--pid", "--network"] {
        c.arg(ns).arg(format!("container:{container}"));
    }
    let mut volume = |from: &Path, to: &Path, mode: &str| {
        let mut v = OsString::from(from);
        v.push(":");
        v.push(to);
        v.push(mode);
        c.arg("-v").arg(v);
    };
    volume(&rack_dir, Path::new("/rack"), "");
    volume(Path::new("/usr"), Path::new("/usr"), ":ro");
    if Path::new("/etc/alternatives").is_dir() {
        volume(
            Path::new("/etc/alternatives"),
            Path::new("/etc/alternatives"),
            ":ro",
        );
    }
    for m in mounts {
        volume(m, m, ":ro");
    }
    volume(&cwd, &cwd, "");
    c.arg("-w").arg(&cwd);
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if !HOST_ONLY.contains(&k) && !k.is_empty() && !k.contains('=') {
            // Without a value docker takes it from its own environment: nothing of it
            // shows on a command line.
            c.arg("-e").arg(k);
        }
    }
    c.args(["-e", "EXANET_RACK=/rack"])
        .arg("-e")
        .arg(format!("EXANET_NODE={node}"))
        .arg(&image)
        .arg(program)
        .args(args);
    Ok(c)
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
