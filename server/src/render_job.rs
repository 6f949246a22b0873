//! One render, run on a blocking thread that holds a render slot: the avatar prepared (or taken
//! from the cache), the audio encoded, then the CLI's own `render_clip`, either into the
//! request's temporary directory (the MP4 comes back as bytes) or as a fragmented MP4 into a
//! writer (a streamed response). The directory goes when the job drops.

use crate::avatars::{AvatarEntry, AvatarMedia};
use crate::engines::EngineSet;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::options::Settings;
use cadence::avatar::AvatarSource;
use cadence::frame_loop::report::RenderReport;
use cadence::frame_loop::{Cancelled, RenderOptions};
use cadence::io::output::{OutputPath, Overwrite};
use cadence::musetalk::render::PreparedAvatar;
use cadence::KeyframeSchedule;
use cadence_media::{Audio, FaceBox, RgbImage};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tempfile::TempDir;

pub enum AvatarInput {
    /// An image sent with the request (or the default avatar): prepared for this render only.
    Image { image: RgbImage, face: FaceBox, landmarks: Option<[[f32; 2]; 5]> },
    /// A video avatar sent with the request (checked, its file in the request's directory):
    /// prepared frame by frame for this render only.
    Video(AvatarSource),
    /// A registered avatar: prepared now for this decoder only if it never was.
    Cached(Arc<AvatarEntry>),
}

/// Where a render's video goes.
pub enum Target {
    /// An MP4 in the request's directory, read back into [`Rendered::mp4`].
    File,
    /// An MP4 at this path (a job's result), written beside it and moved into place only when
    /// complete; [`Rendered::mp4`] stays empty.
    Keep(PathBuf),
    /// A fragmented MP4 (init segment, then one fragment per GOP) written to this writer as it
    /// renders; [`Rendered::mp4`] stays empty.
    Fragmented(Box<dyn Write + Send>),
}

/// Called with 1 for each frame written (a job's progress).
pub type Progress = Box<dyn FnMut(usize) + Send>;

pub struct Job {
    pub audio: Audio,
    pub avatar: AvatarInput,
    pub schedule: KeyframeSchedule,
    pub settings: Settings,
    pub batch: usize,
    pub cancel: Arc<AtomicBool>,
    pub dir: TempDir,
    pub target: Target,
    /// The render window in seconds (0: the clip as one window).
    pub window_seconds: f64,
    /// Which detector decides the clip's voice activity.
    pub vad: cadence::frame_loop::audio::Vad,
    pub progress: Option<Progress>,
}

pub struct Rendered {
    /// The MP4 ([`Target::File`]; empty for the other targets).
    pub mp4: Vec<u8>,
    pub report: RenderReport,
    /// Milliseconds spent loading the engines of a second decoder for this request.
    pub engine_load_ms: f64,
    pub avatar_ms: f64,
    pub avatar_cached: bool,
    /// Milliseconds from the start of `render_clip` to the first frame encoded, and to the first
    /// whole fragment (fragmented target only).
    pub first_frame_ms: Option<f64>,
    pub first_fragment_ms: Option<f64>,
    /// Bytes of video written.
    pub bytes: u64,
}

/// Prepares `entry` (or takes its preparation) for the decoder of `engines`; the flag says whether
/// it was cached. A video avatar's file is written into `scratch` (the request's directory) to be
/// decoded again.
pub fn avatar_for(
    set: &EngineSet,
    engines: &cadence::musetalk::Engines,
    entry: &AvatarEntry,
    metrics: &Metrics,
    scratch: &Path,
) -> anyhow::Result<(Arc<PreparedAvatar>, bool)> {
    if let Some(p) = entry.prepared(engines.decoder_kind) {
        metrics.avatar_cache_hit();
        return Ok((p, true));
    }
    let p = match &entry.media {
        AvatarMedia::Image { image, face, landmarks } => {
            cadence::musetalk::render::prepare_avatar_image(engines, &set.backend, image, *face, landmarks.as_ref())?
        }
        AvatarMedia::Video { mp4, faces, found, .. } => {
            let path = scratch.join("avatar.mp4");
            std::fs::write(&path, mp4)?;
            // The boxes (and landmarks) found when it was registered, not found again.
            let mut source = AvatarSource::open(&path, &cadence::avatar::FaceSpec::Centered)?;
            anyhow::ensure!(source.frames() == faces.len(), "the registered video avatar changed its frame count");
            source.faces = faces.clone();
            source.found = found.clone();
            cadence::musetalk::render::prepare_avatar_source(engines, &set.backend, &source)?
        }
    };
    let p = Arc::new(p);
    metrics.avatar_prepared();
    entry.set_prepared(engines.decoder_kind, p.clone());
    Ok((p, false))
}

pub fn run(set: &EngineSet, metrics: &Metrics, job: Job) -> Result<Rendered, ApiError> {
    let cancelled = job.cancel.clone();
    let result = render(set, metrics, job);
    match result {
        Ok(r) => {
            metrics.render_outcome("ok");
            Ok(r)
        }
        Err(e) if cancelled.load(Ordering::SeqCst) || e.chain().any(|c| c.is::<Cancelled>()) => {
            metrics.render_outcome("cancelled");
            Err(ApiError::unavailable(
                "cancelled",
                "the render was cancelled (its client went away, or the server is shutting down)",
            ))
        }
        Err(e) => {
            metrics.render_outcome("failed");
            Err(ApiError::internal("the render failed", format!("{e:#}")))
        }
    }
}

fn render(set: &EngineSet, metrics: &Metrics, job: Job) -> anyhow::Result<Rendered> {
    // Cancelled while it waited for its slot (a drain deadline passed).
    if job.cancel.load(Ordering::SeqCst) {
        return Err(Cancelled.into());
    }
    let s = &job.settings;
    let (engines, engine_load_ms) = set.get(s.decoder)?;
    let opts = RenderOptions {
        fps: s.fps,
        ramp: s.ramp,
        batch: job.batch,
        method: s.method,
        infill: s.infill,
        window: cadence::frame_loop::window_frames(job.window_seconds, s.fps),
        vad: job.vad,
        cancel: Some(job.cancel.clone()),
    };
    let t = Instant::now();
    let (avatar, avatar_cached) = match &job.avatar {
        AvatarInput::Image { image, face, landmarks } => {
            let p = cadence::musetalk::render::prepare_avatar_image(
                &engines,
                &set.backend,
                image,
                *face,
                landmarks.as_ref(),
            )?;
            metrics.avatar_prepared();
            (Arc::new(p), false)
        }
        AvatarInput::Video(source) => {
            let p = cadence::musetalk::render::prepare_avatar_source(&engines, &set.backend, source)?;
            metrics.avatar_prepared();
            (Arc::new(p), false)
        }
        AvatarInput::Cached(entry) => avatar_for(set, &engines, entry, metrics, job.dir.path())?,
    };
    let avatar_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut prepared = cadence::musetalk::render::prepare_with_avatar(&engines, job.audio, &avatar, &opts)?;
    if !avatar_cached {
        prepared.avatar_encoder_ms = avatar.avatar_encoder_ms;
        prepared.compositor_setup_ms = avatar.compositor_setup_ms;
    }
    let mut progress = job.progress.unwrap_or_else(|| Box::new(|_| {}));
    // The pipeline also ticks 0 after each UNet batch; a job counts frames.
    let progress = |n: usize| {
        if n > 0 {
            progress(n)
        }
    };
    let clip = |output| {
        cadence::musetalk::render::render_clip(
            &engines,
            &set.backend,
            &opts,
            &prepared,
            &job.schedule,
            output,
            progress,
        )
    };
    let (result, mp4) = match job.target {
        Target::File => {
            let path = job.dir.path().join("out.mp4");
            let out = OutputPath::check(&path, Overwrite::Ask, &[])?;
            let r = clip(cadence::frame_loop::video::Output::Mp4 { out: &out, encoder: s.encoder })?;
            (r, std::fs::read(&path)?)
        }
        Target::Keep(path) => {
            let out = OutputPath::check(&path, Overwrite::Ask, &[])?;
            (clip(cadence::frame_loop::video::Output::Mp4 { out: &out, encoder: s.encoder })?, Vec::new())
        }
        Target::Fragmented(mut w) => {
            let sink = cadence::frame_loop::video::Sink::Writer { out: &mut *w, name: "the response body" };
            (
                clip(cadence::frame_loop::video::Output::Fragmented { sink, encoder: s.encoder, pace: false })?,
                Vec::new(),
            )
        }
    };
    let report =
        RenderReport::new(set.setup(&engines), &prepared, &result.stats, result.video.as_ref(), s.fps, engine_load_ms);
    let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 / (ms * 1e-3) } else { f64::NAN };
    metrics.rendered(
        report.frames,
        report.end_to_end_ms * 1e-3,
        &[
            ("unet", per_s(result.stats.keyframes_evaluated, result.stats.times.unet_ms)),
            ("decoder", per_s(result.stats.decoded_frames, result.stats.times.decoder_ms)),
        ],
    );
    Ok(Rendered {
        mp4,
        report,
        engine_load_ms,
        avatar_ms,
        avatar_cached,
        first_frame_ms: result.first_frame_ms,
        first_fragment_ms: result.first_fragment_ms,
        bytes: result.video.as_ref().map_or(0, |v| v.bytes),
    })
}
