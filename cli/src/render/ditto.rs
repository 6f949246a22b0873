//! `cadence render --engine ditto`: the same inputs, output policy, encoder, progress and
//! summary as the MuseTalk path, with Ditto's networks ([`cadence::ditto`]); `--audio -` renders
//! a live stream as it arrives ([`cadence::ditto::live`]).

use super::{output_for, print_summary, progress_bar, RenderArgs};
use anyhow::{ensure, Context, Result};
use cadence::avatar::AvatarSource;
use cadence::ditto::live;
use cadence::ditto::{self, DittoEngines, DITTO_FPS};
use cadence::io::output::OutputPath;
use cadence::musetalk::schedule_args::DEFAULT_STRIDE;
use cadence::Backend;
use cadence_engines::{EngineDevice, Profile};
use cadence_media::{EncoderKind, FrameRate, RgbImage};
use std::time::Instant;

pub fn run(
    a: &RenderArgs,
    live: bool,
    out: Option<&OutputPath>,
    fragmented: bool,
    encoder: EncoderKind,
    engine_device: EngineDevice,
    profile: Profile,
) -> Result<()> {
    // Everything that can be checked before the networks load, first.
    ensure!(
        a.fps == FrameRate::whole(DITTO_FPS),
        "--engine ditto: Ditto's motion is made at {DITTO_FPS} frames per second; --fps {} is not supported",
        a.fps
    );
    ensure!(
        a.schedule.schedule.is_none() && a.schedule.calibration.is_none() && a.schedule.phonemes.is_none(),
        "--engine ditto: adaptive schedules (--schedule, --calibration, --phonemes) are for MuseTalk so far; use --stride or --keyframes"
    );
    ensure!(
        !(live && a.audio_features.is_some()),
        "--audio - with --audio-features: a live stream's HuBERT features are computed as the audio arrives"
    );
    let input = if live { None } else { Some(a.schedule.input(a.audio.as_deref(), a.max_seconds)?) };
    let vad = a.vad.vad();
    let frames = input
        .as_ref()
        .map(|input| cadence::frame_loop::audio::frames_for_samples(input.audio.samples_16k.len(), DITTO_FPS as f64));
    if let (Some(input), Some(0)) = (&input, frames) {
        anyhow::bail!("{}: the audio is too short for one video frame", input.source);
    }
    let user_features = match (&a.audio_features, frames) {
        (Some(path), Some(frames)) => {
            let arr = cadence::io::npy::read(path)?;
            let cadence::io::npy::Array::F32 { shape, data } = arr else {
                anyhow::bail!("{}: audio features must be float32", path.display());
            };
            let width = cadence_engines::ditto::DittoConfigs::for_profile(profile).audio_features();
            ditto::check_features(&data, &shape, width, frames, &path.display().to_string())?;
            Some(data)
        }
        _ => None,
    };
    let stride = a.stride.map_or(DEFAULT_STRIDE, |k| k as usize);
    let schedule = match frames {
        Some(frames) => Some(cadence::schedules::keyframes::fixed_schedule(frames, a.keyframes.as_deref(), stride)?),
        None => None,
    };
    // After the checks from the arguments: finding the face runs the detector.
    let (img, face, face_report) = still_avatar(a)?;
    let live_opts = live::DittoLiveOptions::new(
        stride,
        cadence::frame_loop::window_frames(a.window, a.fps),
        a.ramp,
        a.ditto_infill,
        a.method,
        a.ditto_steps as usize,
        vad,
    )?;
    // A live stream's header is read before the networks load (a stream that is not a WAV fails
    // first).
    let stream = if live { Some(super::stdin_stream()?) } else { None };
    let backend = Backend::Cpu;
    if !engine_device.device.is_cpu() {
        eprintln!(
            "cadence: note: Ditto's networks run on cadence's CPU kernels (no CUDA path yet); the device is not used"
        );
    }
    let say = |what: &str| {
        if !a.json {
            eprintln!("cadence: ditto: {what}");
        }
    };

    let t0 = Instant::now();
    say(&format!("loading the networks ({profile} profile)"));
    let engines = DittoEngines::load(profile, a.engines.models.as_deref())?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    say("preparing the avatar (appearance and motion extractors, rest frame)");
    let avatar = ditto::prepare_avatar(&engines, &backend, &img, face)?;
    let features_from = a.audio_features.as_ref().map_or_else(|| "hubert".to_string(), |p| p.display().to_string());
    let ditto_fields =
        serde_json::json!({"infill": a.ditto_infill, "ddim_steps": a.ditto_steps, "audio_features": features_from});
    let ditto_line = |label: &str| {
        format!(
            "  ditto: {label}, infill {}, {} DDIM steps, audio features from {features_from}",
            a.ditto_infill.name(),
            a.ditto_steps
        )
    };
    let (Some(input), Some(frames), Some((schedule, label))) = (input, frames, schedule) else {
        // `--audio -`: rendered part by part as the stream arrives.
        let stream = stream.context("a live render reads standard input")?;
        let bar = super::live_spinner(a.json);
        let go = |sink: &mut dyn std::io::Write, name: &str| {
            live::render_live(&engines, &avatar, live_opts, stream, sink, name, encoder, a.realtime, |d| {
                bar.inc(d as u64)
            })
        };
        let result = super::write_live(out, go)?;
        bar.finish_and_clear();
        let report = ditto::render_report(&engines, &avatar, (0.0, 0.0), &engine_device, &result, load_ms);
        let live = live_opts.live;
        let k = live.stride;
        let fields = serde_json::json!({
            "audio": "-",
            "engine": "ditto",
            "live": {"stride": k, "part_frames": live.part_frames, "lookahead_frames": live.lookahead_frames},
            "fragmented": true,
            "vad": vad.name(),
            "ditto": ditto_fields,
            "face": face_report,
        });
        let line = format!(
            "{}\n  live: parts of {} frames (stride {k}); a frame waits for its LMDM window (80 frames of audio)",
            ditto_line(&format!("stride {k}")),
            live.part_frames
        );
        return print_summary(a, &report, &result, fields, &line);
    };
    let clip_opts = ditto::ClipOptions { steps: a.ditto_steps as usize, ramp: a.ramp, vad };
    let clip = ditto::prepare_clip(&engines, &avatar, input.audio, user_features, &clip_opts, &say)?;
    let bar = progress_bar(frames, "ditto", a.json);
    let mut stdout = std::io::stdout().lock();
    let output = output_for(out, fragmented, encoder, a.realtime, &mut stdout);
    let result =
        ditto::render_clip(&engines, &avatar, &clip, &schedule, a.ditto_infill, a.method, a.ramp, output, |d| {
            bar.inc(d as u64)
        })?;
    bar.finish_and_clear();
    let report =
        ditto::render_report(&engines, &avatar, (clip.audio_ms, clip.vad_ms), &engine_device, &result, load_ms);
    let fields = serde_json::json!({
        "audio": input.source,
        "engine": "ditto",
        "schedule": label,
        "fragmented": fragmented,
        "vad": vad.name(),
        "ditto": ditto_fields,
        "face": face_report,
    });
    print_summary(a, &report, &result, fields, &ditto_line(&label))
}

/// The avatar as one image, its face box, and the box's report (`"face"` in `--json`): Ditto's
/// path takes a still image.
fn still_avatar(a: &RenderArgs) -> Result<(RgbImage, cadence_media::FaceBox, serde_json::Value)> {
    ensure!(
        !cadence::musetalk::avatar_file::is_avatar_file(&a.avatar),
        "--engine ditto: a prepared avatar file holds MuseTalk's latents; give the portrait image"
    );
    // The frame count first (from the container), then the face: the detector decodes frames.
    let spec = a.faces.spec()?;
    let source = AvatarSource::open(&a.avatar, &cadence::avatar::FaceSpec::Centered)?;
    ensure!(
        source.frames() == 1,
        "--engine ditto: the avatar has {} frames; Ditto's path takes a still image so far",
        source.frames()
    );
    let source = source.with_faces(&a.avatar, &spec)?;
    eprintln!("cadence: {}", cadence::avatar::faces::summary(&source));
    let report = cadence::avatar::faces::report(&source);
    let mut img = None;
    source.for_each_frame(|_, frame| {
        img = Some(frame.clone());
        Ok(())
    })?;
    Ok((img.context("the avatar has no frame")?, source.faces[0], report))
}
