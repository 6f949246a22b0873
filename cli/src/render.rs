//! `cadence render`: speech + avatar to an MP4.

use anyhow::{ensure, Result};
use cadence::args::{parse_face_box, parse_frame_rate, parse_seconds, EncoderArg, EngineArgs};
use cadence::output::{OutputPath, Overwrite};
use cadence::pipeline::RenderOptions;
use cadence::report::{RenderReport, RenderSetup};
use cadence::schedules::cli::{self, ScheduleArgs, DEFAULT_STRIDE};
use cadence::{render, Backend, BackendChoice, Method};
use cadence_media::{FaceBox, FrameRate};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct RenderArgs {
    /// Speech as WAV (any sample rate and channel count; PCM or float; a WAV written to a pipe,
    /// whose header holds no length, is read to its end); or --text.
    #[arg(long, required_unless_present_any = ["text", "text_file"])]
    pub audio: Option<PathBuf>,
    /// Portrait as PNG or JPEG (64 to 3840 pixels a side, even width and height): it is the
    /// video frame.
    #[arg(long)]
    pub avatar: PathBuf,
    /// Output MP4. Not replaced without --force (and never if it is one of the inputs); nothing
    /// is left there or beside it if the render fails or is interrupted.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Run the UNet every K frames (1 = dense) [default: 3].
    #[arg(long, conflicts_with = "keyframes", value_parser = clap::value_parser!(u32).range(1..))]
    pub stride: Option<u32>,
    /// Explicit keyframe list instead of a stride, e.g. 0,2,5,9 (strictly increasing, below the
    /// frame count).
    #[arg(long)]
    pub keyframes: Option<String>,
    /// Face box in the avatar as x,y,w,h (pixels, at least 16x16); default: a centred square of
    /// half the shorter side.
    #[arg(long, value_parser = parse_face_box)]
    pub face_box: Option<FaceBox>,
    /// Video frame rate: 25, 30, 29.97 (= 30000/1001), 50, 59.94 ...; the video has
    /// ceil(audio seconds x fps) frames.
    #[arg(long, default_value = "25", value_parser = parse_frame_rate)]
    pub fps: FrameRate,
    /// Frames of Hermite easing between speech and rest.
    #[arg(long, default_value_t = 4)]
    pub ramp: u32,
    #[command(flatten)]
    pub engines: EngineArgs,
    /// Where cadence's kernels run (expansion, easing, compositing + NV12). With the engines on
    /// CUDA, auto and cuda use the engines' GPU and stream, and the frames stay on the GPU.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// H.264 encoder.
    #[arg(long, value_enum, default_value = "openh264")]
    pub encoder: EncoderArg,
    /// How in-between latents are made from the keyframes.
    #[arg(long, value_enum, default_value = "slerp")]
    pub method: Method,
    /// Refuse audio longer than this (seconds).
    #[arg(long, default_value = "600", value_parser = parse_seconds)]
    pub max_seconds: f64,
    /// Replace an existing output file.
    #[arg(long)]
    pub force: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Adaptive keyframe schedules and text to speech (docs/adaptive_keyframes.md).
    #[command(flatten)]
    pub schedule: ScheduleArgs,
}

pub fn run(a: RenderArgs) -> Result<()> {
    // Everything that can be checked from the arguments and the input files comes first: the
    // engines take seconds to gigabytes to load.
    let inputs: Vec<&std::path::Path> =
        [&a.audio, &a.schedule.phonemes, &a.schedule.calibration, &a.schedule.text_file]
            .into_iter()
            .flatten()
            .map(|p| p.as_path())
            .chain([a.avatar.as_path()])
            .collect();
    let out = OutputPath::check(&a.output, Overwrite::from_force(a.force), &inputs)?;
    let stride = a.stride.map(|k| k as usize);
    a.schedule.validate(stride, a.keyframes.is_some())?;
    let encoder = a.encoder.available()?;
    let (engine_device, profile) = a.engines.device()?;
    let opts =
        RenderOptions { fps: a.fps, ramp: a.ramp, batch: a.engines.batch as usize, method: a.method, cancel: None };
    // The --audio WAV, or the --text speech (libespeak-ng), and the phoneme alignment.
    let input = a.schedule.input(a.audio.as_deref(), a.max_seconds)?;
    let calibration = a.schedule.calibration()?;
    let audio = input.audio;
    let img = render::load_avatar(&a.avatar)?;
    let face = render::face_box(&img, a.face_box)?;
    let frames = render::video_frames(&audio, &opts);
    ensure!(frames > 0, "{}: the audio is too short for one video frame", input.source);
    let stride = stride.unwrap_or(DEFAULT_STRIDE);
    // The pipeline's own schedule when --schedule is not given (checked before the engines load).
    let (fixed, legacy) = render::fixed_schedule(frames, a.keyframes.as_deref(), stride)?;
    let backend = Backend::for_engines(a.backend, &engine_device.device)?;

    let t0 = Instant::now();
    let engines = a.engines.load(&engine_device, profile)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let prepared = render::prepare(&engines, &backend, audio, &img, face, &opts)?;
    let planned = a.schedule.plan(
        a.stride.map(|k| k as usize),
        &prepared,
        input.alignment.as_ref(),
        calibration.as_ref(),
        &engines,
        &opts,
    )?;
    for w in planned.iter().flat_map(|p| &p.warnings) {
        eprintln!("cadence: warning: {w}");
    }
    let schedule = planned.as_ref().map_or(fixed, |p| p.schedule.clone());
    let schedule_summary = cli::summary(planned.as_ref(), &schedule, &legacy);
    let bar = indicatif::ProgressBar::new(prepared.frames as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} render [{bar:40}] {pos}/{len} frames {per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let result = render::render_clip(
        &engines,
        &backend,
        &opts,
        &prepared,
        &schedule,
        render::Output::Mp4 { out: &out, encoder },
        |d| bar.inc(d as u64),
    )?;
    bar.finish_and_clear();
    let setup = RenderSetup::new(&backend, &engine_device, &engines);
    let report = RenderReport::new(setup, &prepared, &result.stats, result.video.as_ref(), a.fps, load_ms);
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        v["output"] = serde_json::json!(a.output);
        v["audio"] = serde_json::json!(input.source);
        v["schedule"] = schedule_summary;
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for line in report.summary_lines(&a.output) {
            eprintln!("{line}");
        }
        eprintln!("{}", cli::summary_line(planned.as_ref(), &schedule, &legacy));
    }
    Ok(())
}
