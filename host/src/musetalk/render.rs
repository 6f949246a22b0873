//! One render, from files to an MP4: what `cadence render` runs and what the experiments time.
//! Inputs are prepared once per render (the audio decoded whole, or opened to be read as the
//! render goes, [`ClipAudio`]; the avatar cropped and encoded), then the frame loop ([`crate::musetalk::frames::render`]) runs with
//! the video encoder as its sink ([`crate::frame_loop::video`]). The MP4 goes through [`crate::io::output`]: written beside the target, renamed at the end.

use crate::backend::composite::{Compositor, FaceBox};
use crate::frame_loop::audio::ClipAudio;
use crate::frame_loop::clock::Tick;
use crate::frame_loop::report::{PreparationTimes, RenderReport, RenderSetup};
use crate::frame_loop::video::{write_video, Output, RenderResult};
use crate::frame_loop::{ClipPart, RenderOptions, RenderStats};
use crate::musetalk::features::FrameFeatures;
use crate::musetalk::{AvatarLatents, Engines};
use crate::schedules::keyframes::speech_distance;
use crate::{Backend, ColorMatrix, KeyframeSchedule};
use anyhow::{bail, ensure, Result};
use cadence_engines::{AudioEncoder, Batch};
use cadence_media::{Audio, RgbImage};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

/// Everything computed once per render before the frame loop.
pub struct Prepared {
    pub audio: ClipAudio,
    /// The audio encoder's windows for the whole clip, made before the render; `None` when the
    /// render is windowed ([`RenderOptions::window`]): it then encodes the audio as its windows
    /// reach it, keeping only the encoder windows the next frames need. [`Self::whole_features`] makes them.
    pub features: Option<Batch>,
    pub speech: Vec<bool>,
    pub frames: usize,
    /// Per avatar frame (one for a still image), shared with the [`PreparedAvatar`] it came
    /// from (a server renders one avatar many times).
    pub avatar: Arc<Vec<AvatarLatents>>,
    pub compositors: Arc<Vec<Compositor>>,
    /// Time of the audio encoder (whisper) on the whole clip.
    pub audio_encoder_ms: f64,
    /// Time of the avatar's image encoder (reference and rest latents, with the crop).
    pub avatar_encoder_ms: f64,
    /// CPU times of the render's threads in the two ([`crate::frame_loop::clock`]).
    pub audio_encoder_cpu_ms: f64,
    pub avatar_encoder_cpu_ms: f64,
    /// Time of the compositor's per-render tables and the background's NV12.
    pub compositor_setup_ms: f64,
    /// Time of the voice activity decisions of the whole clip.
    pub vad_ms: f64,
    /// The rest of the preparation (checks).
    pub prepare_other_ms: f64,
}

impl Prepared {
    /// [`crate::musetalk::frames::render`] over this clip's features, activity, avatar and compositor:
    /// each NV12 frame goes to `sink` in order. Without whole-clip features, whisper encodes the
    /// audio window by window as the render reaches it (the same values).
    pub fn render_frames(
        &self,
        engines: &Engines,
        backend: &Backend,
        opts: &RenderOptions,
        schedule: &KeyframeSchedule,
        sink: impl FnMut(usize, &[u8]) -> Result<()>,
        progress: impl FnMut(usize),
    ) -> Result<RenderStats> {
        let lazy;
        let features: &dyn FrameFeatures = match &self.features {
            Some(whole) => whole,
            None => {
                lazy = self.audio.whisper_clip(&engines.audio, opts.fps.hz())?;
                &lazy
            }
        };
        crate::musetalk::frames::render(
            engines,
            backend,
            opts,
            features,
            ClipPart::whole(&speech_distance(&self.speech)),
            schedule,
            &self.avatar,
            &self.compositors,
            sink,
            progress,
        )
    }

    /// The whole clip's audio features: the ones made before the render, or made now.
    /// Audio read as the render goes ([`ClipAudio::Streamed`]) has none: an error.
    pub fn whole_features(&self, engines: &Engines, opts: &RenderOptions) -> Result<Cow<'_, Batch>> {
        Ok(match (&self.features, self.audio.whole()) {
            (Some(f), _) => Cow::Borrowed(f),
            (None, Some(audio)) => Cow::Owned(engines.audio.encode_audio(&audio.samples_16k, opts.fps.hz() as f32)?),
            (None, None) => bail!("the whole clip's audio features need the audio decoded whole, not read as a stream"),
        })
    }
}

/// Frames of video for `audio` at the render's frame rate: ceil(seconds x fps).
pub fn video_frames(audio: &Audio, opts: &RenderOptions) -> usize {
    crate::frame_loop::audio::frames_for_samples(audio.samples_16k.len(), opts.fps.hz())
}

/// The avatar's share of a preparation, per avatar frame (one for a still image): the crop, the
/// image encoder's latents, the rest latent and its decoded frame, and the compositor (its
/// face box and tables, with that frame as the background). None of it depends on the audio,
/// so a server prepares an avatar once and renders it many times.
pub struct PreparedAvatar {
    pub avatar: Arc<Vec<AvatarLatents>>,
    pub compositors: Arc<Vec<Compositor>>,
    /// Time of the image encoder (reference and rest latents, with the crop), and its CPU time.
    pub avatar_encoder_ms: f64,
    pub avatar_encoder_cpu_ms: f64,
    /// Time of the compositor's tables and the background's NV12.
    pub compositor_setup_ms: f64,
}

/// Prepares `img` with its face box `face` (see [`PreparedAvatar`]); with the detector's
/// `landmarks`, the face is blended by the lower-face mask ([`crate::avatar::mask`]), else by
/// the feathered box.
pub fn prepare_avatar_image(
    engines: &Engines,
    backend: &Backend,
    img: &RgbImage,
    face: FaceBox,
    landmarks: Option<&[[f32; 2]; 5]>,
) -> Result<PreparedAvatar> {
    let mut p = empty_avatar();
    prepare_avatar_frame(engines, backend, img, face, landmarks, &mut p)?;
    Ok(p)
}

/// Prepares every frame of `source` (see [`PreparedAvatar`]), decoding one frame at a time.
pub fn prepare_avatar_source(
    engines: &Engines,
    backend: &Backend,
    source: &crate::avatar::AvatarSource,
) -> Result<PreparedAvatar> {
    let mut p = empty_avatar();
    source.for_each_frame(|i, img| {
        prepare_avatar_frame(engines, backend, img, source.faces[i], source.landmarks(i), &mut p)
    })?;
    ensure!(p.avatar.len() == source.frames(), "{} avatar frames prepared of {}", p.avatar.len(), source.frames());
    Ok(p)
}

fn empty_avatar() -> PreparedAvatar {
    PreparedAvatar {
        avatar: Arc::new(Vec::new()),
        compositors: Arc::new(Vec::new()),
        avatar_encoder_ms: 0.0,
        avatar_encoder_cpu_ms: 0.0,
        compositor_setup_ms: 0.0,
    }
}

/// Adds one avatar frame to `p`: `img` with its face box `face` (and landmarks, when found).
fn prepare_avatar_frame(
    engines: &Engines,
    backend: &Backend,
    img: &RgbImage,
    face: FaceBox,
    landmarks: Option<&[[f32; 2]; 5]>,
    p: &mut PreparedAvatar,
) -> Result<()> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    ensure!(w % 2 == 0 && h % 2 == 0, "the avatar is {w}x{h}: its width and height must be even (see load_avatar)");
    let t = Tick::now();
    let crop = cadence_media::crop_to_planar(img, &face, crate::musetalk::FACE_SIDE as u32)?;
    let latents = crate::musetalk::prepare_avatar(engines, &crop)?;
    t.add_to(&mut p.avatar_encoder_ms, &mut p.avatar_encoder_cpu_ms);
    let t = Instant::now();
    // The lower-face mask where the landmarks make one; else (no landmarks, or landmarks the
    // mask refuses, e.g. eyes outside a box cropped by a large bbox_shift) the feathered box.
    let mask = landmarks.map(|l| crate::avatar::mask::lower_face_alpha(&face, l));
    let compositor = match mask {
        Some(Ok(alpha)) => Compositor::with_alpha(backend, img.as_raw(), w, h, face, alpha, ColorMatrix::Bt709)?,
        other => {
            if let Some(Err(e)) = other {
                eprintln!("cadence: warning: no lower-face mask ({e:#}); blending the feathered face box");
            }
            let feather = (face.w.min(face.h) / 8) as f32;
            Compositor::new(backend, img.as_raw(), w, h, face, feather, ColorMatrix::Bt709)?
        }
    };
    p.compositor_setup_ms += t.elapsed().as_secs_f64() * 1e3;
    Arc::get_mut(&mut p.avatar).expect("not shared yet").push(latents);
    Arc::get_mut(&mut p.compositors).expect("not shared yet").push(compositor);
    Ok(())
}

pub fn prepare(
    engines: &Engines,
    backend: &Backend,
    audio: impl Into<ClipAudio>,
    img: &RgbImage,
    face: FaceBox,
    opts: &RenderOptions,
) -> Result<Prepared> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    ensure!(w % 2 == 0 && h % 2 == 0, "the avatar is {w}x{h}: its width and height must be even (see load_avatar)");
    let audio = audio.into();
    ensure!(audio.video_frames(opts.fps.hz()) > 0, "the audio is too short for one video frame");
    let t_all = Instant::now();
    let avatar = prepare_avatar_image(engines, backend, img, face, None)?;
    prepare_with_new_avatar(engines, audio, &avatar, opts, t_all)
}

/// [`prepare_with_avatar`] for an avatar prepared for this render alone (since `started`): its
/// times are part of this render's preparation.
pub fn prepare_with_new_avatar(
    engines: &Engines,
    audio: impl Into<ClipAudio>,
    avatar: &PreparedAvatar,
    opts: &RenderOptions,
    started: Instant,
) -> Result<Prepared> {
    let mut prepared = prepare_with_avatar(engines, audio, avatar, opts)?;
    prepared.avatar_encoder_ms = avatar.avatar_encoder_ms;
    prepared.avatar_encoder_cpu_ms = avatar.avatar_encoder_cpu_ms;
    prepared.compositor_setup_ms = avatar.compositor_setup_ms;
    prepared.prepare_other_ms = started.elapsed().as_secs_f64() * 1e3
        - prepared.audio_encoder_ms
        - prepared.vad_ms
        - avatar.avatar_encoder_ms
        - avatar.compositor_setup_ms;
    Ok(prepared)
}

/// The audio's share of a preparation, for an avatar prepared before: the avatar's times are not
/// part of this render, so they are zero in the result. Audio read as the render goes
/// ([`ClipAudio::Streamed`]) needs a windowed render.
pub fn prepare_with_avatar(
    engines: &Engines,
    audio: impl Into<ClipAudio>,
    avatar: &PreparedAvatar,
    opts: &RenderOptions,
) -> Result<Prepared> {
    let audio = audio.into();
    let frames = audio.video_frames(opts.fps.hz());
    ensure!(frames > 0, "the audio is too short for one video frame");
    let t_all = Instant::now();
    let t = Tick::now();
    let features = match (opts.window, audio.whole()) {
        (Some(_), _) => None,
        (None, Some(whole)) => Some(engines.audio.encode_audio(&whole.samples_16k, opts.fps.hz() as f32)?),
        (None, None) => bail!("audio read as a stream needs a windowed render (a --window above 0)"),
    };
    let (audio_encoder_ms, audio_encoder_cpu_ms) = t.elapsed_ms();
    if let Some(f) = &features {
        ensure!(f.shape[0] == frames, "audio encoder gave {} frames, expected {frames}", f.shape[0]);
    }
    let t_vad = Instant::now();
    let speech = audio.voice_activity(opts.fps.hz(), frames, &opts.vad)?;
    let vad_ms = t_vad.elapsed().as_secs_f64() * 1e3;
    let prepare_other_ms = t_all.elapsed().as_secs_f64() * 1e3 - audio_encoder_ms - vad_ms;
    Ok(Prepared {
        audio,
        features,
        speech,
        frames,
        avatar: avatar.avatar.clone(),
        compositors: avatar.compositors.clone(),
        audio_encoder_ms,
        avatar_encoder_ms: 0.0,
        audio_encoder_cpu_ms,
        avatar_encoder_cpu_ms: 0.0,
        compositor_setup_ms: 0.0,
        vad_ms,
        prepare_other_ms,
    })
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
    let c = &prepared.compositors[0];
    let size = (c.width as u32, c.height as u32);
    let frames = |sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>, progress: Box<dyn FnMut(usize) + '_>| {
        prepared.render_frames(engines, backend, opts, schedule, sink, progress)
    };
    write_video(&prepared.audio, size, opts.fps, output, frames, progress)
}

/// What a MuseTalk render ran with.
impl RenderSetup {
    pub fn new(backend: &crate::Backend, engine_device: &cadence_engines::EngineDevice, engines: &Engines) -> Self {
        RenderSetup {
            backend: backend.describe(),
            engine_device: engine_device.label(),
            engines: engines.describe(),
            profile: engines.profile.to_string(),
            weights: engines.weights_summary(),
            keyframe_network: "UNet",
        }
    }
}

/// The report of a MuseTalk render, with its preparation's times.
impl RenderReport {
    pub fn new(
        setup: RenderSetup,
        prepared: &Prepared,
        stats: &RenderStats,
        video: Option<&cadence_media::VideoStats>,
        fps: cadence_media::FrameRate,
        engine_load_ms: f64,
    ) -> Self {
        let times = PreparationTimes {
            audio_encoder_ms: prepared.audio_encoder_ms,
            avatar_encoder_ms: prepared.avatar_encoder_ms,
            compositor_setup_ms: prepared.compositor_setup_ms,
            vad_ms: prepared.vad_ms,
            prepare_other_ms: prepared.prepare_other_ms,
            audio_encoder_cpu_ms: Some(prepared.audio_encoder_cpu_ms),
            avatar_encoder_cpu_ms: Some(prepared.avatar_encoder_cpu_ms),
        };
        Self::with_preparation(setup, &times, stats, video, fps, engine_load_ms)
    }
}
