//! What can go wrong generating a deployment. exactl turns each into its own error of the
//! same wording and exit code (bad input 2, failures 1).

use std::path::PathBuf;

use exanet_control::rack::RackError;
use exanet_control::tls::TlsError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DeployError {
    /// An option that cannot be honoured (`--name`, `--shape`, `--image`, `--out`, ...).
    #[error("{what} {value}: {message}")]
    BadValue {
        what: &'static str,
        value: String,
        message: String,
    },

    /// A generated file that could not be rendered.
    #[error("{0}")]
    Render(String),

    #[error("cannot {action} {path}: {source}", path = .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    /// The rack file `rack pki` reads.
    #[error(transparent)]
    Rack(#[from] RackError),

    #[error("cannot create the rack's TLS material: {0}")]
    Tls(#[from] TlsError),
}

impl DeployError {
    /// The operator asked for something that cannot be (exactl's exit code 2), rather
    /// than something failing while it was done.
    pub fn is_bad_input(&self) -> bool {
        match self {
            DeployError::BadValue { .. } => true,
            DeployError::Rack(RackError::Write { .. }) => false,
            DeployError::Rack(_) => true,
            DeployError::Render(_) | DeployError::Io { .. } | DeployError::Tls(_) => false,
        }
    }

    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DeployError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = DeployError> = std::result::Result<T, E>;
