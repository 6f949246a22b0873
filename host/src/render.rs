//! One render, from files to an MP4: what `cadence render` runs and what the experiments time.
//! Inputs are prepared once per render (audio decoded, resampled and encoded to features; the
//! avatar cropped and encoded), then [`pipeline::render_frames`] runs with the video encoder as its
//! sink. The MP4 goes through [`crate::output`]: written beside the target, renamed at the end.

use crate::composite::{Compositor, FaceBox};
use crate::output::OutputPath;
use crate::pipeline::{self, AvatarLatents, Engines, RenderOptions, RenderStats};
use crate::{Backend, ColorMatrix, KeyframeSchedule};
use anyhow::{bail, ensure, Result};
use cadence_engines::{AudioEncoder, Batch};
use cadence_media::{Audio, EncoderKind, RgbImage, VideoStats, VideoWriter};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Everything computed once per render before the frame loop.
pub struct Prepared {
    pub audio: Audio,
    pub features: Batch,
    pub speech: Vec<bool>,
    pub frames: usize,
    /// Shared with the [`PreparedAvatar`] it came from (a server renders one avatar many times).
    pub avatar: Arc<AvatarLatents>,
    pub compositor: Arc<Compositor>,
    pub face: FaceBox,
    /// Time of the audio encoder (whisper) on the whole clip.
    pub audio_encoder_ms: f64,
    /// Time of the avatar's image encoder (reference and rest latents, with the crop).
    pub avatar_encoder_ms: f64,
    /// Time of the compositor's per-render tables and the background's NV12.
    pub compositor_setup_ms: f64,
    /// The rest of the preparation (voice activity, checks).
    pub prepare_other_ms: f64,
}

impl Prepared {
    /// [`pipeline::render_frames`] over this clip's features, activity, avatar and compositor:
    /// each NV12 frame goes to `sink` in order.
    pub fn render_frames(
        &self,
        engines: &Engines,
        backend: &Backend,
        opts: &RenderOptions,
        schedule: &KeyframeSchedule,
        sink: impl FnMut(usize, &[u8]) -> Result<()>,
        progress: impl FnMut(usize),
    ) -> Result<RenderStats> {
        pipeline::render_frames(
            engines,
            backend,
            opts,
            &self.features,
            &self.speech,
            schedule,
            &self.avatar,
            &self.compositor,
            sink,
            progress,
        )
    }
}

/// Reads the WAV, refusing files longer than `max_seconds` before decoding them. (The media
/// crate's errors name the file already.)
pub fn load_audio(path: &Path, max_seconds: f64) -> Result<Audio> {
    let d = cadence_media::wav_duration(path)?;
    ensure!(d > 0.0, "{}: the audio has no samples", path.display());
    ensure!(d <= max_seconds, "{}: {d:.1} s of audio is longer than --max-seconds {max_seconds}", path.display());
    Ok(cadence_media::load_wav(path)?)
}

/// Reads the avatar image; it becomes the output frame, so its width and height must be even.
pub fn load_avatar(path: &Path) -> Result<RgbImage> {
    let img = cadence_media::load_image(path)?;
    let (w, h) = (img.width(), img.height());
    if w % 2 != 0 || h % 2 != 0 {
        bail!(
            "{}: the avatar is {w}x{h}: H.264 in 4:2:0 needs an even width and height (crop or pad it by one pixel)",
            path.display()
        );
    }
    Ok(img)
}

/// The face box for an avatar: the given one (validated) or the default centred box, moved to
/// even coordinates and sizes (NV12 chroma blocks are 2x2).
pub fn face_box(img: &RgbImage, given: Option<FaceBox>) -> Result<FaceBox> {
    let (w, h) = (img.width(), img.height());
    let b = given.unwrap_or_else(|| FaceBox::centered(w, h));
    b.validate(w, h)?;
    let even = |v: u32| v & !1;
    let f = FaceBox { x: even(b.x), y: even(b.y), w: even(b.w), h: even(b.h) };
    ensure!(f.w >= 16 && f.h >= 16, "face box {f:?} is too small (at least 16x16 pixels)");
    Ok(f)
}

/// Frames of video for `audio` at the render's frame rate: ceil(seconds x fps).
pub fn video_frames(audio: &Audio, opts: &RenderOptions) -> usize {
    cadence_media::frame_count(audio.samples_16k.len() as f64 / cadence_media::TARGET_RATE as f64, opts.fps.hz())
}

/// The schedule of a render without an adaptive `--schedule`: the keyframe list when one is
/// given, else every `stride`-th frame; with its label for the summary (`keyframes`, `stride 3`).
pub fn fixed_schedule(frames: usize, keyframes: Option<&str>, stride: usize) -> Result<(KeyframeSchedule, String)> {
    Ok(match keyframes {
        Some(list) => (KeyframeSchedule::parse_list(frames, list)?, "keyframes".to_string()),
        None => (KeyframeSchedule::fixed_stride(frames, stride)?, format!("stride {stride}")),
    })
}

/// The avatar's share of a preparation: the crop, the image encoder's latents, the rest latent
/// and the compositor's tables. None of it depends on the audio, so a server prepares an avatar
/// once and renders it many times.
pub struct PreparedAvatar {
    pub avatar: Arc<AvatarLatents>,
    pub compositor: Arc<Compositor>,
    pub face: FaceBox,
    /// Time of the image encoder (reference and rest latents, with the crop).
    pub avatar_encoder_ms: f64,
    /// Time of the compositor's tables and the background's NV12.
    pub compositor_setup_ms: f64,
}

/// Prepares `img` with its face box `face` (see [`PreparedAvatar`]).
pub fn prepare_avatar_image(
    engines: &Engines,
    backend: &Backend,
    img: &RgbImage,
    face: FaceBox,
) -> Result<PreparedAvatar> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    ensure!(w % 2 == 0 && h % 2 == 0, "the avatar is {w}x{h}: its width and height must be even (see load_avatar)");
    let t = Instant::now();
    let crop = cadence_media::crop_to_planar(img, &face, pipeline::FACE_SIDE as u32)?;
    let avatar = pipeline::prepare_avatar(engines, &crop)?;
    let avatar_encoder_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let compositor =
        Compositor::new(backend, img.as_raw(), w, h, face, (face.w.min(face.h) / 8) as f32, ColorMatrix::Bt709)?;
    let compositor_setup_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(PreparedAvatar {
        avatar: Arc::new(avatar),
        compositor: Arc::new(compositor),
        face,
        avatar_encoder_ms,
        compositor_setup_ms,
    })
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
    ensure!(w % 2 == 0 && h % 2 == 0, "the avatar is {w}x{h}: its width and height must be even (see load_avatar)");
    ensure!(video_frames(&audio, opts) > 0, "the audio is too short for one video frame");
    let t_all = Instant::now();
    let avatar = prepare_avatar_image(engines, backend, img, face)?;
    let mut prepared = prepare_with_avatar(engines, audio, &avatar, opts)?;
    prepared.avatar_encoder_ms = avatar.avatar_encoder_ms;
    prepared.compositor_setup_ms = avatar.compositor_setup_ms;
    prepared.prepare_other_ms = t_all.elapsed().as_secs_f64() * 1e3
        - prepared.audio_encoder_ms
        - avatar.avatar_encoder_ms
        - avatar.compositor_setup_ms;
    Ok(prepared)
}

/// The audio's share of a preparation, for an avatar prepared before: the avatar's times are not
/// part of this render, so they are zero in the result.
pub fn prepare_with_avatar(
    engines: &Engines,
    audio: Audio,
    avatar: &PreparedAvatar,
    opts: &RenderOptions,
) -> Result<Prepared> {
    let frames = video_frames(&audio, opts);
    ensure!(frames > 0, "the audio is too short for one video frame");
    let t_all = Instant::now();
    let t = Instant::now();
    let features = engines.audio.encode_audio(&audio.samples_16k, opts.fps.hz() as f32)?;
    let audio_encoder_ms = t.elapsed().as_secs_f64() * 1e3;
    ensure!(features.shape[0] == frames, "audio encoder gave {} frames, expected {frames}", features.shape[0]);
    let speech = cadence_media::voice_activity(&audio.samples_16k, opts.fps.hz(), frames);
    let prepare_other_ms = t_all.elapsed().as_secs_f64() * 1e3 - audio_encoder_ms;
    Ok(Prepared {
        audio,
        features,
        speech,
        frames,
        avatar: avatar.avatar.clone(),
        compositor: avatar.compositor.clone(),
        face: avatar.face,
        audio_encoder_ms,
        avatar_encoder_ms: 0.0,
        compositor_setup_ms: 0.0,
        prepare_other_ms,
    })
}

/// Where the encoded frames go: an MP4 (a checked output, see [`crate::output`]), or nowhere
/// (timing the rest of the pipeline alone).
pub enum Output<'a> {
    Mp4 { out: &'a OutputPath, encoder: EncoderKind },
    Discard,
}

pub struct RenderResult {
    pub stats: RenderStats,
    pub video: Option<VideoStats>,
}

/// Renders all frames of `prepared` with `schedule` into `output`.
pub fn render_clip(
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
        prepared.render_frames(engines, backend, opts, schedule, sink, progress)
    };
    match output {
        Output::Discard => Ok(RenderResult { stats: go(&mut |_, _| Ok(()), Box::new(progress))?, video: None }),
        Output::Mp4 { out, encoder } => {
            let partial = out.begin()?;
            let (w, h) = (c.width as u32, c.height as u32);
            let mut writer = VideoWriter::create(partial.path(), w, h, opts.fps, encoder, Some(&prepared.audio))
                .map_err(|e| partial.user_error(e.into()))?;
            let mut stats =
                go(&mut |_, f| Ok(writer.push_nv12(f)?), Box::new(progress)).map_err(|e| partial.user_error(e))?;
            let t = Instant::now();
            let video = writer.finish().map_err(|e| partial.user_error(e.into()))?;
            stats.times.encoder_ms += t.elapsed().as_secs_f64() * 1e3;
            stats.times.total_ms += t.elapsed().as_secs_f64() * 1e3;
            partial.commit()?;
            Ok(RenderResult { stats, video: Some(video) })
        }
    }
}
