//! One render, from files to an MP4: what `cadence render` runs and what the experiments time.
//! Inputs are prepared once per render (the audio decoded whole, or opened to be read as the
//! render goes, [`ClipAudio`]; the avatar cropped and encoded), then [`pipeline::render_frames`] runs with the video encoder as its
//! sink. The MP4 goes through [`crate::output`]: written beside the target, renamed at the end.

use crate::clip_audio::ClipAudio;
use crate::composite::{Compositor, FaceBox};
use crate::output::OutputPath;
use crate::pipeline::{self, AvatarLatents, Engines, FrameFeatures, RenderOptions, RenderStats};
use crate::{Backend, ColorMatrix, KeyframeSchedule};
use anyhow::{bail, ensure, Context, Result};
use cadence_engines::{AudioEncoder, Batch};
use cadence_media::{Audio, EncoderKind, FragmentedWriter, RgbImage, VideoStats, VideoWriter};
use std::borrow::Cow;
use std::io::Write;
use std::path::Path;
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
    /// Time of the compositor's per-render tables and the background's NV12.
    pub compositor_setup_ms: f64,
    /// The rest of the preparation (voice activity, checks).
    pub prepare_other_ms: f64,
}

impl Prepared {
    /// [`pipeline::render_frames`] over this clip's features, activity, avatar and compositor:
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
        pipeline::render_frames(
            engines,
            backend,
            opts,
            features,
            &self.speech,
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

/// The face box for an avatar image ([`crate::avatar::face_box_in`] its size).
pub fn face_box(img: &RgbImage, given: Option<FaceBox>) -> Result<FaceBox> {
    crate::avatar::face_box_in(img.width(), img.height(), given)
}

/// Frames of video for `audio` at the render's frame rate: ceil(seconds x fps).
pub fn video_frames(audio: &Audio, opts: &RenderOptions) -> usize {
    crate::clip_audio::frames_for_samples(audio.samples_16k.len(), opts.fps.hz())
}

/// The schedule of a render without an adaptive `--schedule`: the keyframe list when one is
/// given, else every `stride`-th frame; with its label for the summary (`keyframes`, `stride 3`).
pub fn fixed_schedule(frames: usize, keyframes: Option<&str>, stride: usize) -> Result<(KeyframeSchedule, String)> {
    Ok(match keyframes {
        Some(list) => (KeyframeSchedule::parse_list(frames, list)?, "keyframes".to_string()),
        None => (KeyframeSchedule::fixed_stride(frames, stride)?, format!("stride {stride}")),
    })
}

/// The avatar's share of a preparation, per avatar frame (one for a still image): the crop, the
/// image encoder's latents, the rest latent and its decoded frame, and the compositor (its
/// face box and tables, with that frame as the background). None of it depends on the audio,
/// so a server prepares an avatar once and renders it many times.
pub struct PreparedAvatar {
    pub avatar: Arc<Vec<AvatarLatents>>,
    pub compositors: Arc<Vec<Compositor>>,
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
    let mut p = empty_avatar();
    prepare_avatar_frame(engines, backend, img, face, &mut p)?;
    Ok(p)
}

/// Prepares every frame of `source` (see [`PreparedAvatar`]), decoding one frame at a time.
pub fn prepare_avatar_source(
    engines: &Engines,
    backend: &Backend,
    source: &crate::avatar::AvatarSource,
) -> Result<PreparedAvatar> {
    let mut p = empty_avatar();
    source.for_each_frame(|i, img| prepare_avatar_frame(engines, backend, img, source.faces[i], &mut p))?;
    ensure!(p.avatar.len() == source.frames(), "{} avatar frames prepared of {}", p.avatar.len(), source.frames());
    Ok(p)
}

fn empty_avatar() -> PreparedAvatar {
    PreparedAvatar {
        avatar: Arc::new(Vec::new()),
        compositors: Arc::new(Vec::new()),
        avatar_encoder_ms: 0.0,
        compositor_setup_ms: 0.0,
    }
}

/// Adds one avatar frame to `p`: `img` with its face box `face`.
fn prepare_avatar_frame(
    engines: &Engines,
    backend: &Backend,
    img: &RgbImage,
    face: FaceBox,
    p: &mut PreparedAvatar,
) -> Result<()> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    ensure!(w % 2 == 0 && h % 2 == 0, "the avatar is {w}x{h}: its width and height must be even (see load_avatar)");
    let t = Instant::now();
    let crop = cadence_media::crop_to_planar(img, &face, pipeline::FACE_SIDE as u32)?;
    let latents = pipeline::prepare_avatar(engines, &crop)?;
    p.avatar_encoder_ms += t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let compositor =
        Compositor::new(backend, img.as_raw(), w, h, face, (face.w.min(face.h) / 8) as f32, ColorMatrix::Bt709)?;
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
    let avatar = prepare_avatar_image(engines, backend, img, face)?;
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
    prepared.compositor_setup_ms = avatar.compositor_setup_ms;
    prepared.prepare_other_ms = started.elapsed().as_secs_f64() * 1e3
        - prepared.audio_encoder_ms
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
    let t = Instant::now();
    let features = match (opts.window, audio.whole()) {
        (Some(_), _) => None,
        (None, Some(whole)) => Some(engines.audio.encode_audio(&whole.samples_16k, opts.fps.hz() as f32)?),
        (None, None) => bail!("audio read as a stream needs a windowed render (a --window above 0)"),
    };
    let audio_encoder_ms = t.elapsed().as_secs_f64() * 1e3;
    if let Some(f) = &features {
        ensure!(f.shape[0] == frames, "audio encoder gave {} frames, expected {frames}", f.shape[0]);
    }
    let speech = audio.voice_activity(opts.fps.hz(), frames);
    let prepare_other_ms = t_all.elapsed().as_secs_f64() * 1e3 - audio_encoder_ms;
    Ok(Prepared {
        audio,
        features,
        speech,
        frames,
        avatar: avatar.avatar.clone(),
        compositors: avatar.compositors.clone(),
        audio_encoder_ms,
        avatar_encoder_ms: 0.0,
        compositor_setup_ms: 0.0,
        prepare_other_ms,
    })
}

/// Where the encoded frames go: an MP4 (a checked output, see [`crate::output`]), a fragmented
/// MP4 to a file (checked the same way) or to any writer (standard output, a socket), or nowhere
/// (timing the rest of the pipeline alone).
pub enum Output<'a> {
    Mp4 {
        out: &'a OutputPath,
        encoder: EncoderKind,
    },
    /// An init segment then one `moof`+`mdat` fragment per GOP, each written (and flushed) as
    /// soon as it is complete; `pace` holds every frame back to its time in the clip, counted
    /// from the first frame (a live feed).
    Fragmented {
        sink: Sink<'a>,
        encoder: EncoderKind,
        pace: bool,
    },
    Discard,
}

/// Where a fragmented MP4 goes.
pub enum Sink<'a> {
    /// A checked output file: written beside the target, renamed when complete.
    File(&'a OutputPath),
    /// Any writer (`name` names it in errors): what was written stays written, a failed render
    /// ends it after its last whole fragment.
    Writer { out: &'a mut dyn Write, name: &'a str },
}

pub struct RenderResult {
    pub stats: RenderStats,
    pub video: Option<VideoStats>,
    /// Milliseconds from the start of the render to the first frame handed to the encoder, and
    /// to the first fragment written (fragmented output only).
    pub first_frame_ms: Option<f64>,
    pub first_fragment_ms: Option<f64>,
    /// Paced output: frames that reached the encoder more than one frame period after their
    /// time (a live feed would have stalled there).
    pub late_frames: usize,
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

/// A frame loop as [`write_video`] runs it: it hands each NV12 frame to the sink in order and
/// reports progress in frames.
pub trait FrameLoop:
    FnMut(&mut dyn FnMut(usize, &[u8]) -> Result<()>, Box<dyn FnMut(usize) + '_>) -> Result<RenderStats>
{
}
impl<F> FrameLoop for F where
    F: FnMut(&mut dyn FnMut(usize, &[u8]) -> Result<()>, Box<dyn FnMut(usize) + '_>) -> Result<RenderStats>
{
}

/// Runs `frames` (any engine's frame loop, `size` pixels at `fps`) into `output` with `audio` as
/// the sound track: the one place where frames become an MP4 (checked output, encoder beside the
/// loop), a fragmented MP4 or nothing.
pub fn write_video(
    audio: &ClipAudio,
    size: (u32, u32),
    fps: cadence_media::FrameRate,
    output: Output,
    mut frames: impl FrameLoop,
    progress: impl FnMut(usize),
) -> Result<RenderResult> {
    let (w, h) = size;
    let t0 = Instant::now();
    let mut first_frame_ms = None;
    let mut go = |sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>, progress: Box<dyn FnMut(usize) + '_>| {
        let mut timed = |i: usize, f: &[u8]| {
            first_frame_ms.get_or_insert_with(|| t0.elapsed().as_secs_f64() * 1e3);
            sink(i, f)
        };
        frames(&mut timed, progress)
    };
    let result =
        |stats, video| RenderResult { stats, video, first_frame_ms: None, first_fragment_ms: None, late_frames: 0 };
    match output {
        Output::Discard => {
            let stats = go(&mut |_, _| Ok(()), Box::new(progress))?;
            Ok(RenderResult { first_frame_ms, ..result(stats, None) })
        }
        Output::Mp4 { out, encoder } => {
            let partial = out.begin()?;
            let whole = audio.whole().context("a progressive MP4 needs the audio decoded whole")?;
            let writer = VideoWriter::create(partial.path(), w, h, fps, encoder, Some(whole))
                .map_err(|e| partial.user_error(e.into()))?;
            let (mut stats, beside) =
                encode_beside(writer, |sink| go(sink, Box::new(progress))).map_err(|e| partial.user_error(e))?;
            stats.times.encoder_ms += beside.flush_wait_ms;
            stats.times.total_ms += beside.flush_wait_ms;
            stats.times.encoder_busy_ms = beside.busy_ms;
            let video = beside.video;
            partial.commit()?;
            Ok(RenderResult { first_frame_ms, ..result(stats, Some(video)) })
        }
        Output::Fragmented { sink: Sink::File(out), encoder, pace } => {
            let partial = out.begin()?;
            let file = std::fs::File::create(partial.path())
                .map_err(|e| partial.user_error(anyhow::anyhow!("{}: cannot create: {e}", partial.path().display())))?;
            let name = out.path().display().to_string();
            let mut r =
                render_fragmented(go, audio, fps, w, h, encoder, pace, std::io::BufWriter::new(file), &name, progress)
                    .map_err(|e| partial.user_error(e))?;
            partial.commit()?;
            r.first_frame_ms = first_frame_ms;
            Ok(r)
        }
        Output::Fragmented { sink: Sink::Writer { out, name }, encoder, pace } => {
            let mut r = render_fragmented(go, audio, fps, w, h, encoder, pace, out, name, progress)?;
            r.first_frame_ms = first_frame_ms;
            Ok(r)
        }
    }
}

/// What [`encode_beside`] reports besides the frame loop's own result.
struct EncodedBeside {
    video: VideoStats,
    /// The encoder thread's own time (encoding and finishing), which overlapped the frame loop.
    busy_ms: f64,
    /// How long the frame loop, once done, waited for the encoder to drain its queue and finish.
    flush_wait_ms: f64,
}

/// Frames waiting for the encoder thread at most (3 MB each at 1080x1920).
const ENCODER_QUEUE: usize = 4;

/// Runs the frame loop `frames` with a sink that hands each NV12 frame to `writer` on a thread of
/// its own. The encoders take one frame at a time on one thread (OpenH264 without slices), so run
/// inline they left the other cores idle for each frame's encode; beside the loop they overlap the
/// next frames' neural stages. At most [`ENCODER_QUEUE`] frames wait (the loop blocks beyond
/// that, and the sink's time, which the loop records as the encoder's, is then the wait). An
/// encoder error ends the loop at its next frame and is the error returned.
fn encode_beside<T>(
    mut writer: VideoWriter,
    frames: impl FnOnce(&mut dyn FnMut(usize, &[u8]) -> Result<()>) -> Result<T>,
) -> Result<(T, EncodedBeside)> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(ENCODER_QUEUE);
    // Buffers come back for reuse, so the loop does not allocate a frame per frame.
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let encoder = scope.spawn(move || -> Result<(VideoStats, f64)> {
            let mut busy_ms = 0.0;
            for frame in rx {
                let t = Instant::now();
                writer.push_nv12(&frame)?;
                busy_ms += t.elapsed().as_secs_f64() * 1e3;
                let _ = back_tx.send(frame);
            }
            let t = Instant::now();
            let video = writer.finish()?;
            Ok((video, busy_ms + t.elapsed().as_secs_f64() * 1e3))
        });
        let looped = {
            let tx = tx; // dropped at the end of this block: the encoder's end of input
            frames(&mut |_, f: &[u8]| {
                let mut buf = back_rx.try_recv().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(f);
                tx.send(buf).map_err(|_| anyhow::anyhow!("the video encoder stopped"))
            })
        };
        let t = Instant::now();
        let encoded = encoder.join().map_err(|_| anyhow::anyhow!("the video encoder thread panicked"))?;
        let flush_wait_ms = t.elapsed().as_secs_f64() * 1e3;
        // The encoder's error first: a loop that stopped because the encoder did reports only
        // that the encoder stopped.
        let (video, busy_ms) = encoded.context("video encoder")?;
        Ok((looped?, EncodedBeside { video, busy_ms, flush_wait_ms }))
    })
}

/// The fragmented MP4 branch of [`render_clip`]: the clip's audio goes into the stream as the
/// frames reach it (each fragment carries the audio of its time span), and with `pace` each
/// frame waits for its time.
#[allow(clippy::too_many_arguments)]
fn render_fragmented<W: Write>(
    mut go: impl FrameLoop,
    clip: &ClipAudio,
    fps: cadence_media::FrameRate,
    w: u32,
    h: u32,
    encoder: EncoderKind,
    pace: bool,
    out: W,
    name: &str,
    progress: impl FnMut(usize),
) -> Result<RenderResult> {
    let t0 = Instant::now();
    let audio = clip.track_format();
    let mut writer = FragmentedWriter::new(out, name, w, h, fps, encoder, audio)?;
    let mut audio_sent = 0; // sample frames of the track already given to the writer
    let mut first_fragment_ms = None;
    let mut late_frames = 0;
    let mut started: Option<Instant> = None;
    let period = 1.0 / fps.hz();
    let mut stats = go(
        &mut |i, f| {
            if pace {
                let start = *started.get_or_insert_with(Instant::now);
                let due = start + std::time::Duration::from_secs_f64(i as f64 * period);
                let now = Instant::now();
                if now < due {
                    std::thread::sleep(due - now);
                } else if (now - due).as_secs_f64() > period {
                    late_frames += 1;
                }
            }
            // The audio up to the end of this frame, then the frame.
            if let Some(format) = audio {
                let upto =
                    (((i + 1) as f64 * period * format.sample_rate as f64).ceil() as usize).min(clip.track_frames());
                if upto > audio_sent {
                    clip.take_track(audio_sent, upto, &mut |s| Ok(writer.push_audio(s)?))?;
                    audio_sent = upto;
                }
            }
            writer.push_nv12(f)?;
            if first_fragment_ms.is_none() && writer.fragments_written() > 0 {
                first_fragment_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
            }
            Ok(())
        },
        Box::new(progress),
    )?;
    let t = Instant::now();
    if audio.is_some() && audio_sent < clip.track_frames() {
        clip.take_track(audio_sent, clip.track_frames(), &mut |s| Ok(writer.push_audio(s)?))?;
    }
    let (video, mut out) = writer.finish()?;
    out.flush().map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    first_fragment_ms.get_or_insert_with(|| t0.elapsed().as_secs_f64() * 1e3);
    stats.times.encoder_ms += t.elapsed().as_secs_f64() * 1e3;
    stats.times.total_ms += t.elapsed().as_secs_f64() * 1e3;
    Ok(RenderResult { stats, video: Some(video), first_frame_ms: None, first_fragment_ms, late_frames })
}
