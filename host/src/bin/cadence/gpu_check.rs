//! `cadence gpu-check`: every kernel on the GPU against the CPU path, then timings.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct GpuCheckArgs {
    #[arg(long, default_value_t = 51)]
    pub reps: usize,
    /// Write the full report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(a: GpuCheckArgs) -> Result<()> {
    cadence::gpucheck::run(a.reps).and_then(|r| crate::write_json(a.json, &r))
}
