//! `exactl rack prometheus`: Debian's prometheus against a local rack, with its consoles.

use std::path::Path;

use clap::Args;

use crate::error::{CliError, Result};

#[derive(Debug, Args)]
pub struct PrometheusArgs {}

pub fn run(_dir: &Path, _a: PrometheusArgs) -> Result<()> {
    Err(CliError::Failed("exactl rack prometheus is not built yet".into()))
}
