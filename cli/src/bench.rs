//! `cadence bench`: the one-launch expansion against the copy bandwidth of the same run.

use anyhow::Result;
use cadence::io::output::{OutputPath, Overwrite};
use cadence::{Backend, Method};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct BenchArgs {
    #[arg(long, default_value_t = 640)]
    pub frames: usize,
    /// Comma-separated strides.
    #[arg(long, default_value = "2,3", value_delimiter = ',')]
    pub strides: Vec<usize>,
    /// Elements per frame (4x32x32 latent = 4096).
    #[arg(long, default_value_t = 4096)]
    pub dim: usize,
    #[arg(long, default_value_t = 21)]
    pub reps: usize,
    #[arg(long, value_enum, default_value = "slerp")]
    pub method: Method,
    /// Also write the rows as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Replace an existing JSON file.
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: BenchArgs) -> Result<()> {
    let BenchArgs { frames, strides, dim, reps, method, json, force } = a;
    if let Some(p) = &json {
        OutputPath::check(p, Overwrite::from_force(force), &[])?;
    }
    anyhow::ensure!(reps > 0 && dim > 0 && frames > 0, "frames, dim and reps must be positive");
    let mut rows = Vec::new();
    let backends = Backend::all_available()?;
    for b in &backends {
        for dtype in [cadence::backend::elem::Dtype::F32, cadence::backend::elem::Dtype::F16] {
            for &k in &strides {
                rows.push(cadence::measure::bench::bench_expand_dtype(b, dtype, frames, k, dim, method, reps)?);
            }
        }
    }
    cadence::measure::bench::print_expand_table(&rows);
    if !backends.iter().any(|b| b.is_cuda()) {
        println!("(no CUDA device here: CPU rows only)");
    }
    crate::write_json(json.as_deref(), force, &rows)
}
