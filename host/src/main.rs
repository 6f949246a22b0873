//! `cadence`: the command-line front end of the cadence host library.

use anyhow::{bail, Context, Result};
use cadence::npy::{self, Array};
use cadence::{ptx, Backend, BackendChoice, Elem, KeyframeSchedule, Method};
use cadence_engines::device::DEVICE_HELP;
use cadence_engines::DeviceRequest;
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
    /// Run one neural engine on a .npy input and write its output tensor exactly as computed.
    EngineRun(EngineRunArgs),
    /// Frames per second (median of runs) and GFLOP/s of an engine, against the matmul rate of
    /// the same device measured in the same run.
    EngineBench {
        #[arg(long, value_enum)]
        model: EngineModel,
        #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = DEVICE_HELP)]
        device: DeviceRequest,
        #[arg(long, default_value_t = 8)]
        batch: usize,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// cpu-reduced (default on the CPU) or full (default on CUDA).
        #[arg(long)]
        profile: Option<String>,
        /// Real weights (safetensors); default: seeded synthetic.
        #[arg(long)]
        weights: Option<PathBuf>,
    },
    /// Speech audio and an avatar image to an MP4 with cadence strides, silence easing,
    /// compositing, NV12 and H.264.
    Render(Box<RenderArgs>),
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
    /// On a CUDA machine: every kernel's GPU output against the CPU path on random data, a short
    /// render with the kernels on the GPU against the same render on the CPU, then a timing
    /// table. With --emulate, the same checks with the kernels run by cadence's SIMT emulator on
    /// the CPU (no GPU needed; every memory access bounds-checked). Exits non-zero on any
    /// mismatch or failed kernel, after writing the report.
    GpuCheck {
        #[arg(long, default_value_t = 51)]
        reps: usize,
        /// Write the full report as JSON to this file (also when checks fail).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Run the kernels in the SIMT emulator instead of on a GPU (no timings).
        #[arg(long)]
        emulate: bool,
        /// Check only these kernels (entry point names, e.g. expand_f32, or `render`); no
        /// timings.
        #[arg(long = "kernel", value_name = "NAME")]
        kernels: Vec<String>,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum EngineModel {
    Taesd,
    SdVae,
    MusetalkUnet,
    WhisperTiny,
}

#[derive(Args)]
struct EngineRunArgs {
    #[arg(long, value_enum)]
    model: EngineModel,
    /// Weights (safetensors, original layout). Without it: seeded synthetic weights.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// taesd / sd-vae: latents (B,4,h,w); musetalk-unet: (B,8,32,32) = [masked, reference];
    /// whisper-tiny: 16 kHz mono samples (n,) as float32.
    #[arg(long)]
    input: PathBuf,
    /// musetalk-unet only: audio windows (B,50,384) before the positional encoding.
    #[arg(long)]
    audio: Option<PathBuf>,
    #[arg(long)]
    output: PathBuf,
    /// full (default; what real weights need) or cpu-reduced.
    #[arg(long, default_value = "full")]
    profile: String,
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = DEVICE_HELP)]
    device: DeviceRequest,
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
struct RenderArgs {
    /// Speech as WAV (any sample rate and channel count).
    #[arg(long)]
    audio: PathBuf,
    /// Portrait as PNG or JPEG (64 to 4096 pixels a side; even width and height).
    #[arg(long)]
    avatar: PathBuf,
    /// Output MP4. Not overwritten without --force; nothing is left there if the render fails.
    #[arg(short, long)]
    output: PathBuf,
    /// Run the UNet every K frames (1 = dense).
    #[arg(long, default_value_t = 3, conflicts_with = "keyframes")]
    stride: usize,
    /// Explicit keyframe list instead of a stride, e.g. 0,2,5,9.
    #[arg(long)]
    keyframes: Option<String>,
    /// Face box in the avatar as x,y,w,h (pixels); default: a centred square of half the shorter side.
    #[arg(long, value_parser = parse_face_box)]
    face_box: Option<cadence::composite::FaceBox>,
    /// Video frame rate; the video has ceil(audio seconds x fps) frames.
    #[arg(long, default_value_t = 25.0)]
    fps: f32,
    /// Frames of Hermite easing between speech and rest.
    #[arg(long, default_value_t = 4)]
    ramp: u32,
    /// Latent decoder (and the matching image encoder for the avatar).
    #[arg(long, value_enum, default_value = "taesd")]
    decoder: cadence::pipeline::DecoderKind,
    /// Engine size: cpu-reduced (default on CPU) or full (the published architectures; default
    /// on CUDA).
    #[arg(long)]
    profile: Option<String>,
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = DEVICE_HELP)]
    device: DeviceRequest,
    /// Directory of real weights (else $CADENCE_MODELS; else seeded synthetic weights).
    #[arg(long)]
    models: Option<PathBuf>,
    /// Where cadence's kernels run (expansion, easing, compositing + NV12). With the engines on
    /// CUDA, auto and cuda use the engines' GPU and stream, and the frames stay on the GPU.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendChoice,
    /// H.264 encoder: openh264 (built in), x264 or nvenc (builds with the media crate's `ffmpeg` feature).
    #[arg(long, default_value = "openh264")]
    encoder: String,
    /// Frames per UNet and decoder call.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// How in-between latents are made from the keyframes.
    #[arg(long, value_enum, default_value = "slerp")]
    method: Method,
    /// Refuse audio longer than this (seconds).
    #[arg(long, default_value_t = 600.0)]
    max_seconds: f64,
    #[arg(long)]
    force: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_face_box(s: &str) -> std::result::Result<cadence::composite::FaceBox, String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| format!("'{s}': expected x,y,w,h"))?;
    match v[..] {
        [x, y, w, h] if w > 0 && h > 0 => Ok(cadence::composite::FaceBox { x, y, w, h }),
        _ => Err(format!("'{s}': expected four numbers x,y,w,h with w, h > 0")),
    }
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ptx { arch } => cmd_ptx(&arch),
        Command::Expand(a) => cmd_expand(a),
        Command::Info => cmd_info(),
        Command::Render(a) => cmd_render(*a),
        Command::EngineRun(a) => cmd_engine_run(a),
        Command::EngineBench { model, device, batch, runs, profile, weights } => {
            cmd_engine_bench(model, device, batch, runs, profile.as_deref(), weights)
        }
        Command::Bench { frames, strides, dim, reps, method, json } => {
            cmd_bench(frames, &strides, dim, reps, method, json)
        }
        Command::GpuCheck { reps, json, emulate, kernels } => {
            cadence::gpucheck::run(reps, emulate, &kernels).and_then(|r| {
                write_json(json, &r)?;
                r.verdict()
            })
        }
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
        println!(
            "  {:<9} .target {:<7} PTX ISA {:<4} {:>7} bytes",
            t.name,
            t.arch,
            ptx::isa_version(t),
            t.source.len()
        );
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
        bail!(
            "{}: NaN at keyframe {}, element {}; interpolation of NaN is undefined",
            a.input.display(),
            i / dim,
            i % dim
        );
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

fn cmd_bench(
    frames: usize,
    strides: &[usize],
    dim: usize,
    reps: usize,
    method: Method,
    json: Option<PathBuf>,
) -> Result<()> {
    anyhow::ensure!(reps > 0 && dim > 0 && frames > 0, "frames, dim and reps must be positive");
    let mut rows = Vec::new();
    let backends = Backend::all_available()?;
    for b in &backends {
        for dtype in [cadence::elem::Dtype::F32, cadence::elem::Dtype::F16] {
            for &k in strides {
                rows.push(cadence::bench::bench_expand_dtype(b, dtype, frames, k, dim, method, reps)?);
            }
        }
    }
    cadence::bench::print_expand_table(&rows);
    if !backends.iter().any(|b| b.is_cuda()) {
        println!("(no CUDA device here: CPU rows only)");
    }
    write_json(json, &rows)
}

fn encoder_kind(name: &str) -> Result<cadence_media::EncoderKind> {
    Ok(match name {
        "openh264" => cadence_media::EncoderKind::OpenH264,
        "x264" => cadence_media::EncoderKind::X264,
        "nvenc" => cadence_media::EncoderKind::Nvenc,
        other => bail!("unknown encoder '{other}' (openh264, x264 or nvenc)"),
    })
}

fn cmd_render(a: RenderArgs) -> Result<()> {
    use cadence::pipeline::{Engines, RenderOptions};
    use cadence::render;
    npy::check_output(&a.output, a.force)?;
    let encoder = encoder_kind(&a.encoder)?;
    anyhow::ensure!(a.fps > 0.0 && a.fps <= 120.0, "--fps must be in (0, 120]");
    anyhow::ensure!(a.stride > 0, "--stride must be at least 1 (got 0)");
    anyhow::ensure!(a.batch > 0, "--batch must be at least 1 (got 0)");
    let engine_device = cadence_engines::select_device(a.device)?;
    let device = engine_device.device.clone();
    let audio = render::load_audio(&a.audio, a.max_seconds)?;
    let img = render::load_avatar(&a.avatar)?;
    let face = render::face_box(&img, a.face_box)?;
    let backend = Backend::for_engines(a.backend, &device)?;
    let profile = match &a.profile {
        Some(p) => cadence_engines::Profile::parse(p)?,
        None => cadence_engines::Profile::default_for(&device),
    };
    let opts = RenderOptions { fps: a.fps, ramp: a.ramp, batch: a.batch, method: a.method };
    let t0 = Instant::now();
    let engines = Engines::load(profile, a.decoder, &device, a.models.as_deref())?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let prepared = render::prepare(&engines, &backend, audio, &img, face, &opts)?;
    let schedule = match &a.keyframes {
        Some(list) => KeyframeSchedule::parse_list(prepared.frames, list)?,
        None => KeyframeSchedule::fixed_stride(prepared.frames, a.stride)?,
    };
    let bar = indicatif::ProgressBar::new(prepared.frames as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} render [{bar:40}] {pos}/{len} frames {per_sec} eta {eta}")
            .unwrap()
            .progress_chars("=> "),
    );
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let result = render::run(
        &engines,
        &backend,
        &opts,
        &prepared,
        &schedule,
        render::Output::Mp4 { path: &a.output, encoder },
        |d| bar.inc(d as u64),
    )?;
    bar.finish_and_clear();
    let s = &result.stats;
    let t = &s.times;
    let total_ms = t.total_ms + prepared.audio_encoder_ms + prepared.avatar_ms;
    let summary = serde_json::json!({
        "output": a.output,
        "frames": s.frames,
        "fps_video": a.fps,
        "keyframes_scheduled": s.keyframes_scheduled,
        "unet_evaluations": s.keyframes_evaluated,
        "bypassed_frames": s.bypassed_frames,
        "decoded_frames": s.decoded_frames,
        "audio_encoder_ms": prepared.audio_encoder_ms,
        "avatar_prep_ms": prepared.avatar_ms,
        "engine_load_ms": load_ms,
        "stages_ms": t,
        "neural_ms": t.neural_ms() + prepared.audio_encoder_ms,
        "render_ms": total_ms,
        "render_fps": s.frames as f64 / (total_ms * 1e-3),
        "realtime_factor": s.frames as f64 / (total_ms * 1e-3) / a.fps as f64,
        "encoder": result.video.as_ref().map(|v| v.encoder.clone()),
        "mp4_bytes": result.video.as_ref().map(|v| v.bytes),
        "backend": backend.describe(),
        "frames_kept_in": s.residency,
        "engine_device": engine_device.label(),
        "engines": engines.describe(),
        "profile": engines.profile.to_string(),
        "weights": engines.weights_summary(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!(
            "cadence: {} frames ({} keyframes scheduled, {} UNet evaluations, {} bypassed in silence) -> {}",
            s.frames,
            s.keyframes_scheduled,
            s.keyframes_evaluated,
            s.bypassed_frames,
            a.output.display()
        );
        eprintln!(
            "  neural {:.0} ms (audio {:.0}, UNet {:.0}, decoder {:.0}) | expand {:.1} ms, ease {:.1} ms, composite+NV12 {:.0} ms | encoder {:.0} ms",
            t.neural_ms() + prepared.audio_encoder_ms, prepared.audio_encoder_ms, t.unet_ms, t.decoder_ms, t.expand_ms, t.ease_ms, t.composite_nv12_ms, t.encoder_ms
        );
        eprintln!(
            "  total {:.2} s: {:.1} frames/s, {:.2}x real time | {} | engines on {}: {} | frames: {} | {} profile | weights {}",
            total_ms / 1e3,
            summary["render_fps"].as_f64().unwrap_or(0.0),
            summary["realtime_factor"].as_f64().unwrap_or(0.0),
            backend.describe(),
            engine_device,
            engines.describe(),
            s.residency,
            engines.profile,
            engines.weights_summary()
        );
    }
    Ok(())
}

fn weights_source(path: Option<PathBuf>) -> cadence_engines::WeightsSource {
    match path {
        Some(p) => cadence_engines::WeightsSource::File(p),
        None => cadence_engines::WeightsSource::Synthetic { seed: cadence_engines::DEFAULT_SEED },
    }
}

fn read_f32(path: &std::path::Path, what: &str) -> Result<cadence_engines::Batch> {
    let (shape, data) = match npy::read(path)? {
        Array::F32 { shape, data } => (shape, data),
        Array::F16 { shape, data } => (shape, data.iter().map(|x| x.to_f32()).collect()),
    };
    anyhow::ensure!(!data.iter().any(|v| !v.is_finite()), "{}: {what} contains NaN or infinity", path.display());
    Ok(cadence_engines::Batch::new(shape, data)?)
}

fn cmd_engine_run(a: EngineRunArgs) -> Result<()> {
    use cadence_engines::*;
    npy::check_output(&a.output, a.force)?;
    let profile = Profile::parse(&a.profile)?;
    let engine_device = select_device(a.device)?;
    let dev = engine_device.device.clone();
    let w = weights_source(a.weights.clone());
    let input = read_f32(&a.input, "the input")?;
    let (out, label) = match a.model {
        EngineModel::Taesd => {
            let d = Taesd::decoder(profile, &w, &dev)?;
            (d.decode(&input)?, d.weights_label())
        }
        EngineModel::SdVae => {
            let d = SdVae::decoder(profile, &w, &dev)?;
            (d.decode(&input)?, d.weights_label())
        }
        EngineModel::MusetalkUnet => {
            let audio_path = a.audio.as_ref().context("--audio (B,50,384) is required for musetalk-unet")?;
            let audio = read_f32(audio_path, "the audio windows")?;
            let u = MuseTalkUnet::new(profile, &w, &dev)?;
            (u.predict(&input, &audio)?, u.weights_label())
        }
        EngineModel::WhisperTiny => {
            anyhow::ensure!(
                input.shape.len() == 1,
                "whisper-tiny takes 16 kHz mono samples of shape (n,), got {:?}",
                input.shape
            );
            let e = WhisperAudio::new(profile, &w, &dev)?;
            (e.encode_audio(&input.data, 25.0)?, e.weights_label())
        }
    };
    npy::write(&a.output, &out.shape, &out.data)?;
    eprintln!(
        "cadence: {:?} ({} profile, weights {label}, on {engine_device}) {:?} -> {:?} -> {}",
        a.model,
        profile,
        input.shape,
        out.shape,
        a.output.display()
    );
    Ok(())
}

fn cmd_engine_bench(
    model: EngineModel,
    device: DeviceRequest,
    batch: usize,
    runs: usize,
    profile: Option<&str>,
    weights: Option<PathBuf>,
) -> Result<()> {
    use cadence_engines::bench::*;
    use cadence_engines::*;
    anyhow::ensure!(batch > 0 && runs > 0, "--batch and --runs must be positive");
    let engine_device = select_device(device)?;
    let dev = engine_device.device.clone();
    let profile = match profile {
        Some(p) => Profile::parse(p)?,
        None => Profile::default_for(&dev),
    };
    let w = weights_source(weights);
    let mm = matmul_probe(&dev, 2048, 5)?;
    let (r, label) = match model {
        EngineModel::Taesd => {
            let d = Taesd::decoder(profile, &w, &dev)?;
            (bench_decoder(&d, batch, runs)?, d.weights_label())
        }
        EngineModel::SdVae => {
            let d = SdVae::decoder(profile, &w, &dev)?;
            (bench_decoder(&d, batch, runs)?, d.weights_label())
        }
        EngineModel::MusetalkUnet => {
            let u = MuseTalkUnet::new(profile, &w, &dev)?;
            (bench_keyframe(&u, batch, runs)?, u.weights_label())
        }
        EngineModel::WhisperTiny => {
            let e = WhisperAudio::new(profile, &w, &dev)?;
            (bench_audio(&e, 25.6, runs)?, e.weights_label())
        }
    };
    let mm2 = matmul_probe(&dev, 2048, 5)?;
    let rate = 0.5 * (mm + mm2);
    println!(
        "cpu: {} | engine device {engine_device} | profile {profile} | weights {label}",
        cadence::hardware::cpu_model()
    );
    println!("matmul 2048^3 f32 (before/after): {mm:.1} / {mm2:.1} GFLOP/s");
    println!(
        "{:<30} batch {:>3}: {:>8.2} frames/s (median of {runs}), {:>7.1} GFLOP/s = {:.0}% of the matmul rate",
        r.name,
        r.batch,
        r.frames_per_s,
        r.gflops,
        100.0 * r.gflops / rate
    );
    Ok(())
}
