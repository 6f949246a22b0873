//! `cadence render`: speech + avatar to an MP4.

mod ditto;

use anyhow::{ensure, Result};
use cadence::args::{parse_frame_rate, parse_seconds, EncoderArg, EngineArgs, EngineFamily};
use cadence::avatar::AvatarSource;
use cadence::ditto::DittoInfill;
use cadence::frame_loop::audio::{ClipAudio, StreamedAudio};
use cadence::frame_loop::report::{RenderReport, RenderSetup};
use cadence::frame_loop::RenderOptions;
use cadence::io::output::{OutputPath, Overwrite};
use cadence::musetalk::schedule_args::{self, ScheduleArgs, DEFAULT_STRIDE};
use cadence::musetalk::MuseTalkInfill;
use cadence::{Backend, BackendChoice, Method};
use cadence_media::FrameRate;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct RenderArgs {
    /// Speech as WAV (any sample rate and channel count; PCM or float; a WAV written to a pipe,
    /// whose header holds no length, is read to its end); or --text. `-` reads a live WAV
    /// stream from standard input and renders it as it arrives, part by part (--window), to a
    /// fragmented MP4, until the input closes (docs/live_audio.md: what a live render does
    /// differently from a file's).
    #[arg(long, required_unless_present_any = ["text", "text_file"])]
    pub audio: Option<PathBuf>,
    /// Portrait as PNG or JPEG (even width and height, each at least 64 pixels, at most 3840x2160
    /// or 2160x3840: the H.264 encoder's limit): it is the video frame. Or a video avatar: an H.264
    /// MP4 (constant frame rate, no B-frames, 8-bit 4:2:0), or a directory of
    /// numbered PNG/JPEG frames (sorted by name, one size), shown forward then backward, one
    /// avatar frame per output frame. Or a prepared avatar (`cadence avatar prepare`, a
    /// .cadence-avatar file), which skips the avatar's preparation.
    #[arg(long)]
    pub avatar: PathBuf,
    /// Output MP4. Not replaced without --force (and never if it is one of the inputs); nothing
    /// is left there or beside it if the render fails or is interrupted. `-` writes a
    /// fragmented MP4 to standard output (a pipe or a file, never a terminal), each fragment
    /// as soon as it is complete.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Write a fragmented MP4 (an init segment, then one moof+mdat fragment per GOP: what a
    /// live player or a browser's Media Source Extensions read) instead of a progressive one.
    /// Always on for `-o -`.
    #[arg(long)]
    pub fragmented: bool,
    /// Hold every frame back to its time in the clip, counted from the first frame (a live
    /// feed); the summary counts the frames that came more than a frame late. Fragmented output
    /// only.
    #[arg(long)]
    pub realtime: bool,
    /// Run the UNet every K frames (1 = dense) [default: 3].
    #[arg(long, conflicts_with = "keyframes", value_parser = clap::value_parser!(u32).range(1..))]
    pub stride: Option<u32>,
    /// Explicit keyframe list instead of a stride, e.g. 0,2,5,9 (strictly increasing, below the
    /// frame count).
    #[arg(long)]
    pub keyframes: Option<String>,
    #[command(flatten)]
    pub faces: cadence::args::FaceArgs,
    /// Video frame rate: 25, 30, 29.97 (= 30000/1001), 50, 59.94 ...; the video has
    /// ceil(audio seconds x fps) frames.
    #[arg(long, default_value = "25", value_parser = parse_frame_rate)]
    pub fps: FrameRate,
    /// Frames of Hermite easing between speech and rest.
    #[arg(long, default_value_t = 4)]
    pub ramp: u32,
    /// Render in windows of this many seconds: each window's frames are encoded before the next
    /// window's UNet work, so the frames in flight are bounded by the window, not the clip. The video is the
    /// same whatever the window; `0` renders the clip as one window.
    #[arg(long, default_value_t = cadence::frame_loop::DEFAULT_WINDOW_SECONDS, value_parser = cadence::args::parse_window_seconds)]
    pub window: f64,
    #[command(flatten)]
    pub engines: EngineArgs,
    #[command(flatten)]
    pub vad: cadence::args::VadArgs,
    /// Where cadence's kernels run (expansion, easing, compositing + NV12). With the engines on
    /// CUDA, auto and cuda use the engines' GPU and stream, and the frames stay on the GPU.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// H.264 encoder.
    #[arg(long, value_enum, default_value = "openh264")]
    pub encoder: EncoderArg,
    /// How in-between frames are blended from the keyframes (latents, or crops with --infill
    /// image).
    #[arg(long, value_enum, default_value = "slerp")]
    pub method: Method,
    /// MuseTalk: what the frames between keyframes are made from. latent: the blend of the
    /// UNet's keyframe latents, decoded on every frame (the source's method); image: the decoder
    /// runs on keyframes only and the frames between are blends of the decoded keyframe crops
    /// (faster by the decoder's share; docs/infill.md says what it costs in quality). Ditto's
    /// infill is --ditto-infill.
    #[arg(long, value_enum, default_value = "latent")]
    pub infill: MuseTalkInfill,
    /// Refuse audio longer than this (seconds). A live stream (`--audio -`) runs until its input
    /// closes.
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
    /// The talking-head engine (see docs/ditto.md for Ditto's path).
    #[arg(long, value_enum, default_value = "musetalk")]
    pub engine: EngineFamily,
    /// Ditto: how the frames between keyframes are made. feature: SLERP of the warping
    /// network's output, decoder on every frame; image: SLERP of the decoded crops; motion: the
    /// nearest keyframe's crop moved along the keypoints' flow (no network between keyframes).
    #[arg(long, value_enum, default_value = "feature")]
    pub ditto_infill: DittoInfill,
    /// Ditto: the clip's audio features as .npy, (frames, 1024) float32 at 25 fps (HuBERT-large's
    /// width; the cpu-reduced profile's is 256), instead of running HuBERT on --audio. The
    /// audio still gives the sound track and the silence easing; its length must match.
    #[arg(long)]
    pub audio_features: Option<PathBuf>,
    /// Ditto: DDIM steps of the motion diffusion (Ditto's offline default).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub ditto_steps: u32,
}

pub fn run(a: RenderArgs) -> Result<()> {
    // Everything that can be checked from the arguments and the input files comes first: the
    // engines take seconds to gigabytes to load.
    let live = a.audio.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let inputs: Vec<&std::path::Path> = [
        &a.audio,
        &a.schedule.phonemes,
        &a.schedule.calibration,
        &a.schedule.text_file,
        &a.faces.face_boxes,
        &a.audio_features,
    ]
    .into_iter()
    .flatten()
    .map(|p| p.as_path())
    .filter(|p| p.as_os_str() != "-")
    .chain([a.avatar.as_path()])
    .collect();
    let to_stdout = a.output.as_os_str() == "-";
    let fragmented = a.fragmented || to_stdout;
    if live {
        ensure!(
            fragmented,
            "--audio -: a live stream is written as it renders, as a fragmented MP4: add --fragmented or write to -o -"
        );
        ensure!(
            a.keyframes.is_none() && a.schedule.schedule.is_none() && !a.schedule.needs_whole_audio(),
            "--audio -: a live stream is rendered with a fixed --stride; --keyframes, --schedule and --phonemes need the whole clip"
        );
        ensure!(
            !std::io::IsTerminal::is_terminal(&std::io::stdin()),
            "--audio -: standard input is a terminal; pipe a WAV stream into it (... | cadence render --audio - ...)"
        );
    }
    ensure!(!a.realtime || fragmented, "--realtime paces a fragmented MP4: add --fragmented or write to -o -");
    ensure!(!(to_stdout && a.json), "-o - writes the video to standard output: --json cannot go there too");
    // Standard output is the video: refuse a terminal before any work.
    ensure!(
        !to_stdout || !std::io::IsTerminal::is_terminal(&std::io::stdout()),
        "-o -: standard output is a terminal; pipe it (cadence render ... -o - | ffplay -) or redirect it to a file"
    );
    let out =
        if to_stdout { None } else { Some(OutputPath::check(&a.output, Overwrite::from_force(a.force), &inputs)?) };
    let stride = a.stride.map(|k| k as usize);
    a.schedule.validate(stride, a.keyframes.is_some())?;
    let encoder = a.encoder.available()?;
    let (engine_device, profile) = a.engines.device()?;
    if a.engine == EngineFamily::Ditto {
        ensure!(
            a.infill == MuseTalkInfill::Latent,
            "--infill is MuseTalk's; Ditto's infill is --ditto-infill (feature, image or motion)"
        );
        return ditto::run(&a, live, out.as_ref(), fragmented, encoder, engine_device, profile);
    }
    ensure!(
        a.audio_features.is_none(),
        "--audio-features gives Ditto's HuBERT features: add --engine ditto (MuseTalk computes whisper's from --audio)"
    );
    if live {
        return run_live(a, out.as_ref(), encoder, engine_device, profile);
    }
    let opts = render_options(&a, cadence::frame_loop::window_frames(a.window, a.fps));
    // The --audio WAV, or the --text speech (libespeak-ng), and the phoneme alignment. A
    // windowed render to a fragmented MP4 reads the WAV as it goes (memory flat in the clip's
    // length) unless the options analyse the whole clip first.
    let streamed = fragmented && opts.window.is_some() && !a.schedule.needs_whole_audio();
    let (audio, alignment, source): (ClipAudio, _, _) = match a.audio.as_deref() {
        Some(path) if streamed => {
            (StreamedAudio::open(path, a.max_seconds, &opts.vad)?.into(), None, path.display().to_string())
        }
        _ => {
            let input = a.schedule.input(a.audio.as_deref(), a.max_seconds)?;
            (input.audio.into(), input.alignment, input.source)
        }
    };
    let calibration = a.schedule.calibration()?;
    let frames = audio.video_frames(opts.fps.hz());
    ensure!(frames > 0, "{source}: the audio is too short for one video frame");
    let stride = stride.unwrap_or(DEFAULT_STRIDE);
    // The pipeline's own schedule when --schedule is not given (checked before the face detector
    // runs and the engines load).
    let (fixed, legacy) = cadence::schedules::keyframes::fixed_schedule(frames, a.keyframes.as_deref(), stride)?;
    let avatar_source = open_avatar(&a)?;
    let backend = Backend::for_engines(a.backend, &engine_device.device)?;

    let t0 = Instant::now();
    let engines = a.engines.load(&engine_device, profile)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let avatar = prepare_avatar(&a.avatar, avatar_source.as_ref(), &engines, &backend)?;
    let prepared = match &avatar_source {
        Some(_) => cadence::musetalk::render::prepare_with_new_avatar(&engines, audio, &avatar, &opts, t)?,
        None => {
            let mut p = cadence::musetalk::render::prepare_with_avatar(&engines, audio, &avatar, &opts)?;
            // Reading the file is this render's avatar preparation.
            p.avatar_encoder_ms = t.elapsed().as_secs_f64() * 1e3;
            p
        }
    };
    let planned = a.schedule.plan(
        a.stride.map(|k| k as usize),
        &prepared,
        alignment.as_ref(),
        calibration.as_ref(),
        &engines,
        &opts,
    )?;
    for w in planned.iter().flat_map(|p| &p.warnings) {
        eprintln!("cadence: warning: {w}");
    }
    let schedule = planned.as_ref().map_or(fixed, |p| p.schedule.clone());
    let schedule_summary = schedule_args::summary(planned.as_ref(), &schedule, &legacy);
    let bar = progress_bar(prepared.frames, "render", a.json);
    let mut stdout = std::io::stdout().lock();
    let output = output_for(out.as_ref(), fragmented, encoder, a.realtime, &mut stdout);
    let result =
        cadence::musetalk::render::render_clip(&engines, &backend, &opts, &prepared, &schedule, output, |d| {
            bar.inc(d as u64)
        })?;
    bar.finish_and_clear();
    let setup = RenderSetup::new(&backend, &engine_device, &engines);
    let report = RenderReport::new(setup, &prepared, &result.stats, result.video.as_ref(), a.fps, load_ms);
    let mut fields = serde_json::json!({"audio": source, "schedule": schedule_summary, "fragmented": fragmented, "vad": opts.vad.name(), "infill": opts.infill});
    if let Some(s) = &avatar_source {
        fields["face"] = cadence::avatar::faces::report(s);
    }
    let line = format!(
        "  infill {}\n{}",
        opts.infill.name(),
        schedule_args::summary_line(planned.as_ref(), &schedule, &legacy)
    );
    print_summary(&a, &report, &result, fields, &line)
}

/// The render's progress bar over `frames` (hidden with --json, whose standard output is data).
pub(crate) fn progress_bar(frames: usize, label: &str, json: bool) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(frames as u64);
    let template = format!("{{spinner}} {label} [{{bar:40}}] {{pos}}/{{len}} frames {{per_sec}} eta {{eta}}");
    bar.set_style(indicatif::ProgressStyle::with_template(&template).expect("valid template").progress_chars("=> "));
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

/// Where a render's video goes: the checked output file (an MP4, or a fragmented MP4 with
/// --fragmented), or a fragmented MP4 on standard output (`-o -`).
pub(crate) fn output_for<'a>(
    out: Option<&'a OutputPath>,
    fragmented: bool,
    encoder: cadence_media::EncoderKind,
    realtime: bool,
    stdout: &'a mut dyn std::io::Write,
) -> cadence::frame_loop::video::Output<'a> {
    match out {
        Some(out) if fragmented => cadence::frame_loop::video::Output::Fragmented {
            sink: cadence::frame_loop::video::Sink::File(out),
            encoder,
            pace: realtime,
        },
        Some(out) => cadence::frame_loop::video::Output::Mp4 { out, encoder },
        None => cadence::frame_loop::video::Output::Fragmented {
            sink: cadence::frame_loop::video::Sink::Writer { out: stdout, name: "standard output" },
            encoder,
            pace: realtime,
        },
    }
}

/// A render's summary: JSON on standard output with --json (the report, the output, `fields`,
/// the first frame's and fragment's times), else lines on standard error (`line` says how the
/// keyframes were chosen).
pub(crate) fn print_summary(
    a: &RenderArgs,
    report: &RenderReport,
    result: &cadence::frame_loop::video::RenderResult,
    fields: serde_json::Value,
    line: &str,
) -> Result<()> {
    if a.json {
        let mut v = serde_json::to_value(report)?;
        v["output"] = serde_json::json!(a.output);
        for (key, value) in fields.as_object().into_iter().flatten() {
            v[key] = value.clone();
        }
        v["first_frame_ms"] = serde_json::json!(result.first_frame_ms);
        v["first_fragment_ms"] = serde_json::json!(result.first_fragment_ms);
        if a.realtime {
            v["late_frames"] = serde_json::json!(result.late_frames);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for line in report.summary_lines(&a.output) {
            eprintln!("{line}");
        }
        eprintln!("{line}");
        if let Some(ms) = result.first_fragment_ms {
            eprintln!(
                "  first frame after {:.0} ms, first fragment after {ms:.0} ms",
                result.first_frame_ms.unwrap_or(f64::NAN)
            );
        }
        if a.realtime {
            eprintln!("  paced to real time: {} frame(s) more than a frame late", result.late_frames);
        }
    }
    Ok(())
}

/// A prepared avatar (checked now: version, size, checksum; `None`) or an image, video or image
/// sequence to prepare (checked now: sizes, frame rate, frame count, face boxes).
fn open_avatar(a: &RenderArgs) -> Result<Option<AvatarSource>> {
    if cadence::musetalk::avatar_file::is_avatar_file(&a.avatar) {
        ensure!(
            !a.faces.any_given(),
            "--face-box, --face-boxes, --face-index, --bbox-shift: a prepared avatar has its face boxes already"
        );
        cadence::musetalk::avatar_file::check(&a.avatar)?;
        Ok(None)
    } else {
        let source = AvatarSource::open(&a.avatar, &a.faces.spec()?)?;
        eprintln!("cadence: {}", cadence::avatar::faces::summary(&source));
        Ok(Some(source))
    }
}

/// The avatar's latents and compositors: prepared from `source`, or read from the prepared
/// avatar file `path`.
fn prepare_avatar(
    path: &std::path::Path,
    source: Option<&AvatarSource>,
    engines: &cadence::musetalk::Engines,
    backend: &Backend,
) -> Result<cadence::musetalk::render::PreparedAvatar> {
    match source {
        Some(source) => cadence::musetalk::render::prepare_avatar_source(engines, backend, source),
        None => cadence::musetalk::avatar_file::load(path, engines, backend),
    }
}

/// A live render's output: `go(sink, name)` writes the fragmented MP4 into the checked output
/// file (through its partial file, committed only if `go` succeeds) or to standard output.
pub(crate) fn write_live<T>(
    out: Option<&OutputPath>,
    go: impl FnOnce(&mut dyn std::io::Write, &str) -> Result<T>,
) -> Result<T> {
    match out {
        Some(out) => {
            let partial = out.begin()?;
            let file = std::fs::File::create(partial.path())
                .map_err(|e| partial.user_error(anyhow::anyhow!("{}: cannot create: {e}", partial.path().display())))?;
            let mut file = std::io::BufWriter::new(file);
            let r = go(&mut file, &out.path().display().to_string()).map_err(|e| partial.user_error(e))?;
            drop(file);
            partial.commit()?;
            Ok(r)
        }
        None => go(&mut std::io::stdout().lock(), "standard output"),
    }
}

/// A live render's spinner (hidden with --json).
pub(crate) fn live_spinner(json: bool) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} live render: {pos} frames {per_sec}")
            .expect("valid template"),
    );
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

/// The WAV stream on standard input, its header read (a stream that is not a WAV fails here,
/// before the engines load).
pub(crate) fn stdin_stream() -> Result<cadence_media::AudioStream<std::io::StdinLock<'static>>> {
    let name = "standard input";
    let reader = cadence_media::wav::WavReader::new(std::io::stdin().lock(), None)
        .map_err(|e| cadence_media::audio::wav_err(name, e))?;
    Ok(cadence_media::AudioStream::new(reader, name)?)
}

/// The MuseTalk render's options from the flags, with the render window `window`.
fn render_options(a: &RenderArgs, window: Option<usize>) -> RenderOptions {
    RenderOptions {
        fps: a.fps,
        ramp: a.ramp,
        batch: a.engines.batch as usize,
        method: a.method,
        infill: a.infill,
        window,
        vad: a.vad.vad(),
        cancel: None,
    }
}

/// `--audio -`: the WAV stream on standard input rendered as it arrives ([`cadence::musetalk::live`]).
fn run_live(
    a: RenderArgs,
    out: Option<&OutputPath>,
    encoder: cadence_media::EncoderKind,
    engine_device: cadence_engines::EngineDevice,
    profile: cadence_engines::Profile,
) -> Result<()> {
    // A live stream's parts are windowed by the live loop (`LiveOptions`), not by the renders.
    let opts = render_options(&a, None);
    let stride = a.stride.map_or(DEFAULT_STRIDE, |k| k as usize);
    let live = cadence::frame_loop::live::LiveOptions::new(
        stride,
        cadence::frame_loop::window_frames(a.window, a.fps),
        &opts,
    )?;
    let avatar_source = open_avatar(&a)?;
    let backend = Backend::for_engines(a.backend, &engine_device.device)?;
    let input = stdin_stream()?;

    let t0 = Instant::now();
    let engines = a.engines.load(&engine_device, profile)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let avatar = prepare_avatar(&a.avatar, avatar_source.as_ref(), &engines, &backend)?;
    let times = cadence::frame_loop::report::PreparationTimes {
        avatar_encoder_ms: t.elapsed().as_secs_f64() * 1e3,
        ..Default::default()
    };
    let bar = live_spinner(a.json);
    let go = |sink: &mut dyn std::io::Write, name: &str| {
        cadence::musetalk::live::render_live(
            &engines,
            &backend,
            &opts,
            live,
            &avatar,
            input,
            sink,
            name,
            encoder,
            a.realtime,
            |d| bar.inc(d as u64),
        )
    };
    let result = write_live(out, go)?;
    bar.finish_and_clear();
    let setup = RenderSetup::new(&backend, &engine_device, &engines);
    let report = RenderReport::with_preparation(setup, &times, &result.stats, result.video.as_ref(), a.fps, load_ms);
    let mut fields = serde_json::json!({
        "audio": "-",
        "live": {"stride": stride, "part_frames": live.part_frames, "lookahead_frames": live.lookahead_frames},
        "fragmented": true,
        "vad": opts.vad.name(),
        "infill": opts.infill,
    });
    if let Some(s) = &avatar_source {
        fields["face"] = cadence::avatar::faces::report(s);
    }
    let line = format!(
        "  live: parts of {} frames (stride {stride}), {} frames of lookahead; infill {}",
        live.part_frames,
        live.lookahead_frames,
        opts.infill.name()
    );
    print_summary(&a, &report, &result, fields, &line)
}
