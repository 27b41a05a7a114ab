//! exactl's errors. Each says what went wrong and where; [`CliError::exit_code`] sorts
//! them into bad input (exit 2, like clap's own usage errors) and runtime failures (exit 1).

use std::path::PathBuf;

use exanet_control::control::ControlError;
use exanet_control::rack::RackError;
use exanet_control::tls::TlsError;
use exanet_deploy::DeployError;
use exanet_proto::NameError;
use thiserror::Error;

/// Exit code for bad input: bad arguments, names, shapes, rack files.
pub const EXIT_USAGE: u8 = 2;
/// Exit code for runtime failures: a daemon that does not answer, a rack that does not come up.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code of a `rack up` that failed and could not stop all it had started: unlike
/// exit 1, part of the rack is still running (the message names it).
pub const EXIT_LEFT_RUNNING: u8 = 3;

/// The phrase every command uses for a node whose process is gone.
pub const NOT_RUNNING: &str = "process not running";

#[derive(Debug, Error)]
pub enum CliError {
    // ---- bad input (exit 2) ----
    #[error("no rack at {dir}: {file} does not exist (create and start one with `exactl rack up`)", file = .dir.join(exanet_control::rack::RACK_FILE).display(), dir = .dir.display())]
    NoRack { dir: PathBuf },

    #[error(transparent)]
    RackFile(RackError),

    #[error("{0}")]
    Node(#[from] NameError),

    /// Arguments that are each fine but cannot be carried out together or on this rack.
    #[error("{0}")]
    Usage(String),

    /// A fault given a value of another kind's unit.
    #[error(transparent)]
    FaultUnit(#[from] exanet_proto::fault::FaultUnitMismatch),

    #[error("{what} {value}: {message}")]
    BadValue {
        what: &'static str,
        value: String,
        message: String,
    },

    #[error(
        "the rack at {dir} was created with {setting} {existing}, not {requested}; \
         to change it run `exactl rack down` and remove {file} (or use another --rack DIR)",
        dir = .dir.display(),
        file = .dir.join(exanet_control::rack::RACK_FILE).display()
    )]
    SettingMismatch {
        dir: PathBuf,
        setting: &'static str,
        existing: String,
        requested: String,
    },

    // ---- runtime failures (exit 1) ----
    #[error(
        "the rack at {dir} is already running ({running} of {total} daemons); \
         `exactl status` shows it, `exactl rack down` stops it",
        dir = .dir.display()
    )]
    AlreadyRunning {
        dir: PathBuf,
        running: usize,
        total: usize,
    },

    #[error("cannot find {0}")]
    DaemonNotFound(String),

    #[error("cannot start {binary} for {node}: {source}", binary = .binary.display())]
    Spawn {
        node: String,
        binary: PathBuf,
        source: std::io::Error,
    },

    #[error("cannot {action} {path}: {source}", path = .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("cannot write the rack file: {0}")]
    WriteRack(RackError),

    #[error("cannot create the rack's TLS material: {0}")]
    Tls(#[from] TlsError),

    #[error("cannot pick free ports on 127.0.0.1: {0}")]
    Ports(std::io::Error),

    #[error("{node}: {source}")]
    Control { node: String, source: ControlError },

    /// A node of a local rack whose daemon process is gone (not asked: it cannot answer).
    #[error("{node}: {} ({why})", NOT_RUNNING)]
    NotRunning { node: String, why: String },

    /// Every daemon process of a local rack is gone.
    #[error(
        "rack {name:?} at {dir} is not running: none of its {nodes} daemon processes is alive \
         (`exactl rack up` starts it)",
        dir = .dir.display()
    )]
    RackNotRunning {
        name: String,
        dir: PathBuf,
        nodes: usize,
    },

    #[error("{node}: the daemon refused the request: {message}")]
    Refused { node: String, message: String },

    #[error("{node}: unexpected answer to {request}: {answer}")]
    Unexpected {
        node: String,
        request: &'static str,
        answer: String,
    },

    /// A failure whose details were already printed on stderr.
    #[error("{0}")]
    Failed(String),

    /// `rack up` found, before starting anything, that this host lacks what the rack needs.
    #[error(
        "this host cannot hold the rack: {needs}\n{}\nnothing was started; {}",
        .shortfalls.iter().map(|s| format!("  {s}")).collect::<Vec<_>>().join("\n"),
        .without_ip.as_ref().map_or_else(
            || "a smaller --shape may fit".to_string(),
            |w| format!("without IP (`--ip off`) {w}, which fits")
        )
    )]
    HostTooSmall {
        needs: String,
        shortfalls: Vec<String>,
        /// What the rack takes without IP, when this host could hold that.
        without_ip: Option<String>,
    },

    /// `rack up` failed and stopped everything it had started.
    #[error(
        "{cause}\n{}; its logs are in {logs}",
        if *.stopped == 0 {
            "rack up started nothing".to_string()
        } else {
            format!(
                "rack up stopped the {stopped} daemon(s) it had started, and their IP services \
                 if any: nothing of the rack is running"
            )
        },
        logs = .logs.display()
    )]
    UpFailed {
        cause: Box<CliError>,
        stopped: usize,
        logs: PathBuf,
    },

    /// `rack up` failed and some of what it started would not stop.
    #[error(
        "{cause}\n{} daemon(s) rack up started did not stop even after SIGKILL and still run: \
         {}; it stopped everything else it had started, and `exactl rack down` tries these \
         again (logs in {logs})",
        .left.len(),
        .left.join(", "),
        logs = .logs.display()
    )]
    UpLeftRunning {
        cause: Box<CliError>,
        left: Vec<String>,
        logs: PathBuf,
    },
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NoRack { .. }
            | CliError::RackFile(_)
            | CliError::Node(_)
            | CliError::BadValue { .. }
            | CliError::FaultUnit(_)
            | CliError::Usage(_)
            | CliError::SettingMismatch { .. } => EXIT_USAGE,
            CliError::UpLeftRunning { .. } => EXIT_LEFT_RUNNING,
            _ => EXIT_FAILURE,
        }
    }

    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CliError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

impl From<DeployError> for CliError {
    /// The generators' errors, in the same words and with the same exit codes as when they
    /// were exactl's own.
    fn from(e: DeployError) -> Self {
        match e {
            DeployError::BadValue {
                what,
                value,
                message,
            } => CliError::BadValue {
                what,
                value,
                message,
            },
            DeployError::Render(m) => CliError::Failed(m),
            DeployError::Io {
                action,
                path,
                source,
            } => CliError::Io {
                action,
                path,
                source,
            },
            DeployError::Rack(e) => e.into(),
            DeployError::Tls(e) => CliError::Tls(e),
        }
    }
}

impl From<RackError> for CliError {
    /// Reading a rack file fails on bad input: a missing file says there is no rack there,
    /// anything else names the file and the problem. Writing one is a runtime failure.
    fn from(e: RackError) -> Self {
        match e {
            RackError::Read {
                ref path,
                ref source,
            } if source.kind() == std::io::ErrorKind::NotFound => {
                let dir = path
                    .parent()
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("."));
                CliError::NoRack { dir }
            }
            RackError::Write { .. } => CliError::WriteRack(e),
            other => CliError::RackFile(other),
        }
    }
}

pub type Result<T, E = CliError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The generators moved to exanet-deploy; their errors keep exactl's words and codes.
    #[test]
    fn deploy_errors_keep_their_exit_codes() {
        let bad = CliError::from(DeployError::BadValue {
            what: "--name",
            value: "\"X\"".into(),
            message: "must be lower-case".into(),
        });
        assert_eq!(bad.exit_code(), EXIT_USAGE);
        assert_eq!(bad.to_string(), "--name \"X\": must be lower-case");
        let missing = CliError::from(DeployError::Rack(RackError::Read {
            path: "/r/rack.toml".into(),
            source: std::io::ErrorKind::NotFound.into(),
        }));
        assert!(matches!(missing, CliError::NoRack { .. }), "{missing}");
        let io = CliError::from(DeployError::io(
            "write",
            "/o/x",
            std::io::ErrorKind::PermissionDenied.into(),
        ));
        assert_eq!(io.exit_code(), EXIT_FAILURE);
        assert!(io.to_string().starts_with("cannot write /o/x"), "{io}");
        let render = CliError::from(DeployError::Render("cannot render".into()));
        assert_eq!(render.exit_code(), EXIT_FAILURE);
    }

    /// A failed `rack up` tells by its exit status whether any of the rack still runs.
    #[test]
    fn a_failed_rack_up_says_what_it_left_running() {
        let cause = || Box::new(CliError::Failed("M1QAF3 exited".into()));
        let stopped = CliError::UpFailed {
            cause: cause(),
            stopped: 4,
            logs: "/r/logs".into(),
        };
        assert_eq!(stopped.exit_code(), EXIT_FAILURE);
        let text = stopped.to_string();
        assert!(
            text.starts_with("M1QAF3 exited\nrack up stopped the 4 daemon(s)")
                && text.contains("nothing of the rack is running")
                && text.ends_with("/r/logs"),
            "{text}"
        );
        let left = CliError::UpLeftRunning {
            cause: cause(),
            left: vec!["M1QAF2 (pid 42)".into()],
            logs: "/r/logs".into(),
        };
        assert_eq!(left.exit_code(), EXIT_LEFT_RUNNING);
        assert!(
            left.to_string().contains("still run: M1QAF2 (pid 42)"),
            "{left}"
        );
    }
}
