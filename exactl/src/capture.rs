//! `exactl capture`: the cells passing a node or one link direction, into a pcapng file.

use std::path::Path;

use clap::Args;

use crate::error::{CliError, Result};

#[derive(Debug, Args)]
pub struct CaptureArgs {}

pub fn run(_dir: &Path, _a: CaptureArgs) -> Result<()> {
    Err(CliError::Failed("exactl capture is not built yet".into()))
}
