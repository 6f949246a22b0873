//! `cadence gpu-check`: every kernel on the GPU (or, with `--emulate`, in the SIMT emulator)
//! against the CPU path, then timings on a GPU. The report is written before the exit status
//! says whether any check failed.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct GpuCheckArgs {
    #[arg(long, default_value_t = 51)]
    pub reps: usize,
    /// Write the full report as JSON to this file (also when checks fail).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Replace an existing JSON file.
    #[arg(long)]
    pub force: bool,
    /// Run the kernels in cadence's SIMT emulator on the CPU instead of on a GPU (no GPU needed;
    /// every memory access bounds-checked; no timings).
    #[arg(long)]
    pub emulate: bool,
    /// Check only these kernels (entry point names such as expand_f32, or `render`); no timings.
    #[arg(long = "kernel", value_name = "NAME")]
    pub kernels: Vec<String>,
}

pub fn run(a: GpuCheckArgs) -> Result<()> {
    if let Some(p) = &a.json {
        // Checked before the work: the report must have somewhere to go.
        cadence::io::output::OutputPath::check(p, cadence::io::output::Overwrite::from_force(a.force), &[])?;
    }
    let report = cadence::measure::gpucheck::run(a.reps, a.emulate, &a.kernels)?;
    crate::write_json(a.json.as_deref(), a.force, &report)?;
    report.verdict()
}
