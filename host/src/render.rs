//! One render, from files to an MP4: what `cadence render` runs and what the experiments time.
//! Inputs are prepared once per render (audio decoded, resampled and encoded to features; the
//! avatar cropped and encoded), then [`pipeline::render`] runs with the video encoder as its
//! sink. The MP4 is written to a temporary file beside the output and renamed at the end.

use crate::composite::{Compositor, FaceBox};
use crate::pipeline::{self, AvatarLatents, Engines, RenderOptions, RenderStats};
use crate::{Backend, ColorMatrix, KeyframeSchedule};
use anyhow::{bail, ensure, Context, Result};
use cadence_engines::{AudioEncoder, Batch};
use cadence_media::{Audio, EncoderKind, RgbImage, VideoStats, VideoWriter};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Everything computed once per render before the frame loop.
pub struct Prepared {
    pub audio: Audio,
    pub features: Batch,
    pub speech: Vec<bool>,
    pub frames: usize,
    pub avatar: AvatarLatents,
    pub compositor: Compositor,
    pub face: FaceBox,
    /// Time of the audio encoder (whisper) on the whole clip.
    pub audio_encoder_ms: f64,
    /// Time of the avatar preparation (image encoder, rest latent, background NV12).
    pub avatar_ms: f64,
}

/// Reads the WAV, refusing files longer than `max_seconds` before decoding them.
pub fn load_audio(path: &Path, max_seconds: f64) -> Result<Audio> {
    let d = cadence_media::wav_duration(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(d > 0.0, "{}: the audio has no samples", path.display());
    ensure!(d <= max_seconds, "{}: {d:.1} s of audio is longer than --max-seconds {max_seconds}", path.display());
    cadence_media::load_wav(path).with_context(|| format!("reading {}", path.display()))
}

pub fn load_avatar(path: &Path) -> Result<RgbImage> {
    cadence_media::load_image(path).with_context(|| format!("reading the avatar {}", path.display()))
}

/// The face box for an avatar: the given one (validated) or the default centred box, moved to
/// even coordinates and sizes (NV12 chroma blocks are 2x2).
pub fn face_box(img: &RgbImage, given: Option<FaceBox>) -> Result<FaceBox> {
    let (w, h) = (img.width(), img.height());
    let b = match given {
        Some(f) => cadence_media::FaceBox { x: f.x as u32, y: f.y as u32, w: f.w as u32, h: f.h as u32 },
        None => cadence_media::FaceBox::centered(w, h),
    };
    b.validate(w, h).map_err(|e| anyhow::anyhow!("face box: {e}"))?;
    let even = |v: u32| (v & !1) as usize;
    let f = FaceBox { x: even(b.x), y: even(b.y), w: even(b.w), h: even(b.h) };
    ensure!(f.w >= 16 && f.h >= 16, "face box {f:?} is too small (at least 16x16 pixels)");
    Ok(f)
}

pub fn prepare(
    engines: &Engines,
    backend: &Backend,
    audio: Audio,
    img: &RgbImage,
    face: FaceBox,
    opts: &RenderOptions,
) -> Result<Prepared> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    if w % 2 != 0 || h % 2 != 0 {
        bail!("the avatar is {w}x{h}: H.264 in 4:2:0 needs an even width and height (crop or pad it by one pixel)");
    }
    let frames =
        cadence_media::frame_count(audio.samples_16k.len() as f64 / cadence_media::TARGET_RATE as f64, opts.fps as f64);
    ensure!(frames > 0, "the audio is too short for one video frame");
    let t = Instant::now();
    let features = engines.audio.encode_audio(&audio.samples_16k, opts.fps)?;
    let audio_encoder_ms = t.elapsed().as_secs_f64() * 1e3;
    ensure!(features.shape[0] == frames, "audio encoder gave {} frames, expected {frames}", features.shape[0]);
    let speech = cadence_media::voice_activity(&audio.samples_16k, opts.fps as f64, frames);
    let t = Instant::now();
    let mb = cadence_media::FaceBox { x: face.x as u32, y: face.y as u32, w: face.w as u32, h: face.h as u32 };
    let crop = cadence_media::crop_to_planar(img, &mb, pipeline::FACE as u32)?;
    let avatar = pipeline::prepare_avatar(engines, &crop)?;
    let compositor =
        Compositor::new(backend, img.as_raw(), w, h, face, (face.w.min(face.h) / 8) as f32, ColorMatrix::Bt709)?;
    let avatar_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(Prepared { audio, features, speech, frames, avatar, compositor, face, audio_encoder_ms, avatar_ms })
}

/// Where the encoded frames go: an MP4, or nowhere (timing the rest of the pipeline alone).
pub enum Output<'a> {
    Mp4 { path: &'a Path, encoder: EncoderKind },
    Discard,
}

pub struct RenderResult {
    pub stats: RenderStats,
    pub video: Option<VideoStats>,
}

fn partial_path(path: &Path) -> Result<PathBuf> {
    let mut name = path.file_name().context("output path has no file name")?.to_os_string();
    name.push(format!(".partial-{}.mp4", std::process::id()));
    Ok(path.with_file_name(name))
}

/// Renders all frames of `prepared` with `schedule` into `output`.
pub fn run(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    prepared: &Prepared,
    schedule: &KeyframeSchedule,
    output: Output,
    progress: impl FnMut(usize),
) -> Result<RenderResult> {
    ensure!(
        schedule.n_frames() == prepared.frames,
        "schedule covers {} frames, the audio {}",
        schedule.n_frames(),
        prepared.frames
    );
    let c = &prepared.compositor;
    let go = |sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>, progress: Box<dyn FnMut(usize) + '_>| {
        pipeline::render(
            engines,
            backend,
            opts,
            &prepared.features,
            &prepared.speech,
            schedule,
            &prepared.avatar,
            c,
            |i, f| sink(i, f),
            progress,
        )
    };
    match output {
        Output::Discard => Ok(RenderResult { stats: go(&mut |_, _| Ok(()), Box::new(progress))?, video: None }),
        Output::Mp4 { path, encoder } => {
            let tmp = partial_path(path)?;
            let result = (|| {
                let fps = opts.fps.round() as u32;
                ensure!(
                    (opts.fps - fps as f32).abs() < 1e-6,
                    "the MP4 writer needs an integer frame rate (got {})",
                    opts.fps
                );
                let mut writer =
                    VideoWriter::create(&tmp, c.width as u32, c.height as u32, fps, encoder, Some(&prepared.audio))
                        .with_context(|| format!("creating {}", tmp.display()))?;
                let mut stats = go(&mut |_, f| Ok(writer.push_nv12(f)?), Box::new(progress))?;
                let t = Instant::now();
                let video = writer.finish()?;
                stats.times.encoder_ms += t.elapsed().as_secs_f64() * 1e3;
                stats.times.total_ms += t.elapsed().as_secs_f64() * 1e3;
                std::fs::rename(&tmp, path).with_context(|| format!("moving the video into {}", path.display()))?;
                Ok(RenderResult { stats, video: Some(video) })
            })();
            if result.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            result
        }
    }
}
