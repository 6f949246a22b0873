//! `cadence`: the command-line front end of the cadence host library.

use anyhow::{bail, Context, Result};
use cadence::npy::{self, Array};
use cadence::{ptx, Backend, BackendChoice, Elem, KeyframeSchedule, Method};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "cadence", version, about = "Temporal cadence strides for neural talking heads: kernels, backends and tools", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print an embedded PTX module (compiled from gpu/src by rustc's NVPTX backend).
    Ptx {
        /// sm_90 (Hopper), sm_120 (Blackwell) or portable (sm_75 baseline, JIT-compiled on newer GPUs).
        #[arg(long, default_value = "sm_90")]
        arch: String,
    },
    /// Expand keyframe latents to every frame by geodesic SLERP (or LERP) in one launch.
    Expand(ExpandArgs),
    /// Toolchain, embedded PTX targets, and the backend and device this machine would use.
    Info,
    /// Microbenchmark of the one-launch stride expansion against the copy bandwidth measured
    /// in the same run (median of runs; CPU always, CUDA when present).
    Bench {
        #[arg(long, default_value_t = 640)]
        frames: usize,
        /// Comma-separated strides.
        #[arg(long, default_value = "2,3", value_delimiter = ',')]
        strides: Vec<usize>,
        /// Elements per frame (4x32x32 latent = 4096).
        #[arg(long, default_value_t = 4096)]
        dim: usize,
        #[arg(long, default_value_t = 21)]
        reps: usize,
        #[arg(long, value_enum, default_value = "slerp")]
        method: Method,
        /// Also write the rows as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// On a CUDA machine: every kernel's GPU output against the CPU path on random data, then
    /// a timing table. Exits non-zero on any mismatch.
    GpuCheck {
        #[arg(long, default_value_t = 51)]
        reps: usize,
        /// Write the full report as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ExpandArgs {
    /// Keyframes as .npy, shape (M, ...), float32 or float16, in schedule order.
    #[arg(long)]
    input: PathBuf,
    /// Output .npy, shape (N, ...), same dtype as the input. Not overwritten without --force.
    #[arg(long)]
    output: PathBuf,
    /// Number of output frames N.
    #[arg(long)]
    frames: usize,
    /// Fixed stride k: keyframes 0, k, 2k, ... plus N-1 when N-1 is not a multiple of k.
    #[arg(long, conflicts_with = "keyframes", required_unless_present = "keyframes")]
    stride: Option<usize>,
    /// Explicit keyframe indices, strictly increasing, e.g. 0,3,6,9.
    #[arg(long)]
    keyframes: Option<String>,
    #[arg(long, value_enum, default_value = "slerp")]
    method: Method,
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendChoice,
    /// Replace an existing output file.
    #[arg(long)]
    force: bool,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ptx { arch } => cmd_ptx(&arch),
        Command::Expand(a) => cmd_expand(a),
        Command::Info => cmd_info(),
        Command::Bench { frames, strides, dim, reps, method, json } => cmd_bench(frames, &strides, dim, reps, method, json),
        Command::GpuCheck { reps, json } => cadence::gpucheck::run(reps).and_then(|r| write_json(json, &r)),
    };
    if let Err(e) = result {
        eprintln!("cadence: error: {e:#}");
        std::process::exit(1);
    }
}

fn cmd_ptx(arch: &str) -> Result<()> {
    let Some(t) = ptx::by_name(arch) else {
        let names: Vec<_> = ptx::TARGETS.iter().map(|t| t.name).collect();
        bail!("no embedded PTX for '{arch}'; available: {}", names.join(", "));
    };
    print!("{}", t.source);
    Ok(())
}

fn cmd_info() -> Result<()> {
    println!("cadence {}", env!("CARGO_PKG_VERSION"));
    println!("kernel compiler: {} (NVPTX backend, no CUDA toolkit)", ptx::COMPILER);
    println!("embedded PTX:");
    for t in &ptx::TARGETS {
        println!("  {:<9} .target {:<7} PTX ISA {:<4} {:>7} bytes", t.name, t.arch, ptx::isa_version(t), t.source.len());
    }
    println!("cpu: {} ({} logical CPUs)", cadence::hardware::cpu_model(), cadence::hardware::logical_cpus());
    let backend = Backend::select(BackendChoice::Auto)?;
    println!("backend (auto): {}", backend.describe());
    Ok(())
}

fn cmd_expand(a: ExpandArgs) -> Result<()> {
    npy::check_output(&a.output, a.force)?;
    let schedule = match (&a.stride, &a.keyframes) {
        (Some(k), _) => KeyframeSchedule::fixed_stride(a.frames, *k)?,
        (None, Some(list)) => KeyframeSchedule::parse_list(a.frames, list)?,
        (None, None) => bail!("give --stride or --keyframes"),
    };
    let input = npy::read(&a.input)?;
    let shape = input.shape().to_vec();
    if shape.is_empty() {
        bail!("{}: a 0-d array holds no keyframes; expected shape (M, ...)", a.input.display());
    }
    let m = shape[0];
    if m != schedule.count() {
        bail!(
            "{} holds {m} keyframes, but the schedule ({} over {} frames) has {}",
            a.input.display(),
            a.stride.map(|k| format!("stride {k}")).unwrap_or_else(|| "the keyframe list".into()),
            a.frames,
            schedule.count()
        );
    }
    let dim: usize = shape[1..].iter().product();
    if dim == 0 {
        bail!("{}: frames have no elements (shape {shape:?})", a.input.display());
    }
    if let Some(i) = input.first_nan() {
        bail!("{}: NaN at keyframe {}, element {}; interpolation of NaN is undefined", a.input.display(), i / dim, i % dim);
    }
    let backend = Backend::select(a.backend)?;
    let mut out_shape = shape.clone();
    out_shape[0] = a.frames;
    let t0 = Instant::now();
    match &input {
        Array::F32 { data, .. } => write_expanded(&backend, data, &schedule, dim, a.method, &a.output, &out_shape)?,
        Array::F16 { data, .. } => write_expanded(&backend, data, &schedule, dim, a.method, &a.output, &out_shape)?,
    }
    eprintln!(
        "cadence: {} keyframes -> {} frames of {:?} {} ({:?}) on {} in {:.1} ms -> {}",
        schedule.count(),
        a.frames,
        &shape[1..],
        input.dtype(),
        a.method,
        backend.describe(),
        t0.elapsed().as_secs_f64() * 1e3,
        a.output.display()
    );
    Ok(())
}

fn write_expanded<T: Elem + npyz::AutoSerialize>(
    backend: &Backend,
    keys: &[T],
    schedule: &KeyframeSchedule,
    dim: usize,
    method: Method,
    output: &std::path::Path,
    shape: &[usize],
) -> Result<()> {
    let frames = backend.expand(keys, schedule, dim, method)?;
    npy::write(output, shape, &frames).with_context(|| format!("writing {}", output.display()))
}

fn write_json<T: serde::Serialize>(path: Option<PathBuf>, value: &T) -> Result<()> {
    if let Some(p) = path {
        npy::write_atomically(&p, |w| Ok(serde_json::to_writer_pretty(w, value)?))?;
        eprintln!("cadence: wrote {}", p.display());
    }
    Ok(())
}

fn cmd_bench(frames: usize, strides: &[usize], dim: usize, reps: usize, method: Method, json: Option<PathBuf>) -> Result<()> {
    anyhow::ensure!(reps > 0 && dim > 0 && frames > 0, "frames, dim and reps must be positive");
    let mut rows = Vec::new();
    for b in Backend::all_available() {
        for &k in strides {
            rows.push(cadence::bench::bench_expand::<f32>(&b, frames, k, dim, method, reps)?);
        }
    }
    cadence::gpucheck::print_expand_table(&rows);
    if !Backend::all_available().iter().any(|b| b.is_cuda()) {
        println!("(no CUDA device here: CPU rows only)");
    }
    write_json(json, &rows)
}
