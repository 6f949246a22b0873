//! `cadence`: the command-line front end of the cadence host library, one module per subcommand.

mod avatar;
mod bench;
mod engine;
mod expand;
mod faces;
mod gpu_check;
mod info;
mod models;
mod render;
mod vad;

use anyhow::Result;
use cadence::io::output::{OutputPath, Overwrite};
use clap::{Parser, Subcommand};
use std::path::Path;

#[derive(Parser)]
#[command(name = "cadence", version, about = "Temporal cadence strides for neural talking heads: kernels, backends and tools", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print an embedded PTX module (compiled from gpu/src by rustc's NVPTX backend).
    Ptx(info::PtxArgs),
    /// Expand keyframe latents to every frame by geodesic SLERP (or LERP) in one launch.
    Expand(expand::ExpandArgs),
    /// Toolchain, embedded PTX targets, and the backend and device this machine would use.
    Info,
    /// Run one neural engine on a .npy input and write its output tensor exactly as computed.
    EngineRun(engine::EngineRunArgs),
    /// Frames per second (median of runs) and GFLOP/s of an engine, against the matmul rate of
    /// the same device measured in the same run.
    EngineBench(engine::EngineBenchArgs),
    /// Speech audio and an avatar image to an MP4 with cadence strides, silence easing,
    /// compositing, NV12 and H.264.
    Render(Box<render::RenderArgs>),
    /// Prepared avatars: `avatar prepare face.png -o anchor.cadence-avatar` does an avatar's
    /// per-render work once; `render --avatar anchor.cadence-avatar` then skips it.
    Avatar(Box<avatar::AvatarArgs>),
    /// Weights as users have them: `models check DIR` lists what cadence would load from
    /// MuseTalk's models/ folder and whether it can.
    Models(models::ModelsArgs),
    /// Microbenchmark of the one-launch stride expansion against the copy bandwidth measured
    /// in the same run (median of runs; CPU always, CUDA when present).
    Bench(bench::BenchArgs),
    /// On a CUDA machine: every kernel's GPU output against the CPU path on random data, a short
    /// render with the kernels on the GPU against the same render on the CPU, then a timing
    /// table. With --emulate, the same checks with the kernels run by cadence's SIMT emulator on
    /// the CPU (no GPU needed; every memory access bounds-checked). Exits non-zero on any
    /// mismatch or failed kernel, after writing the report.
    GpuCheck(gpu_check::GpuCheckArgs),
    /// The render server: the source's POST /generate over HTTP with the engines loaded once,
    /// avatars prepared once, render slots, limits and metrics (server/README.md). SIGTERM or
    /// SIGINT drains it.
    Serve(Box<cadence_server::ServeArgs>),
    /// Speech segments of a WAV file by Silero VAD (a trained detector, its model embedded):
    /// start and end in seconds, or with --json the probability of every 32 ms chunk too.
    Vad(vad::VadArgs),
    /// Faces found by MTCNN (trained weights embedded): `faces detect IMAGE|DIR|VIDEO [--json]`
    /// prints every face's box, score and 5 landmarks per frame.
    Faces(faces::FacesArgs),
}

fn main() {
    let cli = Cli::parse();
    // The server handles SIGINT/SIGTERM itself (it drains); its renders write into per-request
    // directories that it removes.
    if !matches!(cli.command, Command::Serve(_)) {
        if let Err(e) = cadence::io::output::install_interrupt_cleanup() {
            eprintln!("cadence: warning: {e:#}; an interrupted run may leave a temporary file beside its output");
        }
    }
    // A bad CADENCE_MAX_ISA is an error before any work (not a panic in the first CPU loop).
    let result = cadence_engines::isa::check_env().map_err(anyhow::Error::from).and_then(|()| match cli.command {
        Command::Ptx(a) => info::ptx(a),
        Command::Expand(a) => expand::run(a),
        Command::Info => info::info(),
        Command::Render(a) => render::run(*a),
        Command::Avatar(a) => avatar::run(*a),
        Command::EngineRun(a) => engine::run(a),
        Command::EngineBench(a) => engine::bench(a),
        Command::Models(a) => models::run(a),
        Command::Bench(a) => bench::run(a),
        Command::GpuCheck(a) => gpu_check::run(a),
        Command::Serve(a) => cadence_server::serve(*a),
        Command::Vad(a) => vad::run(a),
        Command::Faces(a) => faces::run(a),
    });
    if let Err(e) = result {
        eprintln!("cadence: error: {e:#}");
        std::process::exit(1);
    }
}

/// Writes `value` as pretty JSON to `path`, when one is given, through the output policy
/// ([`cadence::io::output`]: an existing file is replaced only with `--force`).
pub(crate) fn write_json<T: serde::Serialize>(path: Option<&Path>, force: bool, value: &T) -> Result<()> {
    if let Some(p) = path {
        OutputPath::check(p, Overwrite::from_force(force), &[])?
            .write(|w| Ok(serde_json::to_writer_pretty(w, value)?))?;
        eprintln!("cadence: wrote {}", p.display());
    }
    Ok(())
}
