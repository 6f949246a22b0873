//! `cadence render`: speech + avatar to an MP4.

use anyhow::{bail, Result};
use cadence::npy;
use cadence::{Backend, BackendChoice, KeyframeSchedule, Method};
use cadence_engines::device::DEVICE_HELP;
use cadence_engines::DeviceRequest;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct RenderArgs {
    /// Speech as WAV (any sample rate and channel count); or --text.
    #[arg(long, required_unless_present_any = ["text", "text_file"])]
    pub audio: Option<PathBuf>,
    /// Portrait as PNG or JPEG (64 to 4096 pixels a side; even width and height).
    #[arg(long)]
    pub avatar: PathBuf,
    /// Output MP4. Not overwritten without --force; nothing is left there if the render fails.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Run the UNet every K frames (1 = dense) [default: 3].
    #[arg(long, conflicts_with = "keyframes")]
    pub stride: Option<usize>,
    /// Explicit keyframe list instead of a stride, e.g. 0,2,5,9.
    #[arg(long)]
    pub keyframes: Option<String>,
    /// Face box in the avatar as x,y,w,h (pixels); default: a centred square of half the shorter side.
    #[arg(long, value_parser = parse_face_box)]
    pub face_box: Option<cadence::composite::FaceBox>,
    /// Video frame rate; the video has ceil(audio seconds x fps) frames.
    #[arg(long, default_value_t = 25.0)]
    pub fps: f32,
    /// Frames of Hermite easing between speech and rest.
    #[arg(long, default_value_t = 4)]
    pub ramp: u32,
    /// Latent decoder (and the matching image encoder for the avatar).
    #[arg(long, value_enum, default_value = "taesd")]
    pub decoder: cadence::pipeline::DecoderKind,
    /// Engine size: cpu-reduced (default on CPU) or full (the published architectures; default
    /// on CUDA).
    #[arg(long)]
    pub profile: Option<String>,
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = DEVICE_HELP)]
    pub device: DeviceRequest,
    /// Directory of real weights (else $CADENCE_MODELS; else seeded synthetic weights).
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Where cadence's kernels run (expansion, easing, compositing + NV12). With the engines on
    /// CUDA, auto and cuda use the engines' GPU and stream, and the frames stay on the GPU.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// H.264 encoder: openh264 (built in), x264 or nvenc (builds with the media crate's `ffmpeg` feature).
    #[arg(long, default_value = "openh264")]
    pub encoder: String,
    /// Frames per UNet and decoder call.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// How in-between latents are made from the keyframes.
    #[arg(long, value_enum, default_value = "slerp")]
    pub method: Method,
    /// Refuse audio longer than this (seconds).
    #[arg(long, default_value_t = 600.0)]
    pub max_seconds: f64,
    #[arg(long)]
    pub force: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub schedule: cadence::schedules::cli::ScheduleArgs,
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

fn encoder_kind(name: &str) -> Result<cadence_media::EncoderKind> {
    Ok(match name {
        "openh264" => cadence_media::EncoderKind::OpenH264,
        "x264" => cadence_media::EncoderKind::X264,
        "nvenc" => cadence_media::EncoderKind::Nvenc,
        other => bail!("unknown encoder '{other}' (openh264, x264 or nvenc)"),
    })
}

pub fn run(a: RenderArgs) -> Result<()> {
    use cadence::pipeline::{Engines, RenderOptions};
    use cadence::render;
    npy::check_output(&a.output, a.force)?;
    let encoder = encoder_kind(&a.encoder)?;
    anyhow::ensure!(a.fps > 0.0 && a.fps <= 120.0, "--fps must be in (0, 120]");
    a.schedule.validate(a.stride, a.keyframes.is_some())?;
    anyhow::ensure!(a.batch > 0, "--batch must be at least 1 (got 0)");
    let engine_device = cadence_engines::select_device(a.device)?;
    let device = engine_device.device.clone();
    let input = a.schedule.input(a.audio.as_deref(), a.max_seconds)?;
    let calibration = a.schedule.calibration()?;
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
    let prepared = render::prepare(&engines, &backend, input.audio, &img, face, &opts)?;
    let planned =
        a.schedule.plan(a.stride, &prepared, input.alignment.as_ref(), calibration.as_ref(), &engines, &opts)?;
    for w in planned.iter().flat_map(|p| &p.warnings) {
        eprintln!("cadence: warning: {w}");
    }
    let stride = a.stride.unwrap_or(cadence::schedules::cli::DEFAULT_STRIDE);
    let (schedule, legacy) = match (&planned, &a.keyframes) {
        (Some(p), _) => (p.schedule.clone(), String::new()),
        (None, Some(list)) => (KeyframeSchedule::parse_list(prepared.frames, list)?, "keyframes".to_string()),
        (None, None) => (KeyframeSchedule::fixed_stride(prepared.frames, stride)?, format!("stride {stride}")),
    };
    let schedule_summary = cadence::schedules::cli::summary(planned.as_ref(), &schedule, &legacy);
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
        "audio": input.source,
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
        "schedule": schedule_summary,
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
        let keys: Vec<String> = schedule.keyframes().iter().map(|k| k.to_string()).collect();
        eprintln!(
            "  schedule {}: {} keyframes{}: {}",
            schedule_summary["source"].as_str().unwrap_or(""),
            schedule.count(),
            planned
                .as_ref()
                .map(|p| format!(" ({} UNet evaluations, made in {:.1} ms)", p.evaluations, p.scheduling_ms))
                .unwrap_or_default(),
            keys.join(",")
        );
    }
    Ok(())
}
