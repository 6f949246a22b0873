//! `cadence ptx` and `cadence info`: what this build embeds and what this machine would use.

use anyhow::{bail, Result};
use cadence::{backend::ptx, Backend, BackendChoice};
use clap::Args;

#[derive(Args)]
pub struct PtxArgs {
    /// sm_90 (Hopper), sm_120 (Blackwell) or portable (sm_75 baseline, JIT-compiled on newer GPUs).
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
}

pub fn ptx(a: PtxArgs) -> Result<()> {
    let arch = a.arch.as_str();
    let Some(t) = ptx::by_name(arch) else {
        let names: Vec<_> = ptx::TARGETS.iter().map(|t| t.name).collect();
        bail!("no embedded PTX for '{arch}'; available: {}", names.join(", "));
    };
    print!("{}", t.source);
    Ok(())
}

pub fn info() -> Result<()> {
    println!("cadence {}", env!("CARGO_PKG_VERSION"));
    println!("kernel compiler: {} (NVPTX backend, no CUDA toolkit)", ptx::COMPILER);
    println!("embedded PTX:");
    for t in &ptx::TARGETS {
        println!(
            "  {:<9} .target {:<7} PTX ISA {:<4} {:>7} bytes",
            t.name,
            t.arch,
            ptx::isa_version(t),
            t.source.len()
        );
    }
    println!(
        "cpu: {} ({} logical CPUs)",
        cadence::backend::hardware::cpu_model(),
        cadence::backend::hardware::logical_cpus()
    );
    println!("cpu loops: {} (host kernels: {:?})", cadence_engines::isa::describe(), cadence::backend::cpu::isa());
    let backend = Backend::select(BackendChoice::Auto)?;
    println!("backend (auto): {}", backend.describe());
    Ok(())
}
