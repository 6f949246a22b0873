//! A live Ditto render (`cadence render --engine ditto --audio -`): speech read from a stream as
//! it arrives, video written as fragmented MP4 as it is made, with no end known in advance.
//!
//! Ditto's audio-to-motion is local in time, so the stream's motion is the file's:
//! - HuBERT encodes every 5 frames a chunk of 6480 samples on its own
//!   ([`cadence_engines::ditto::hubert::DittoFeatureStream`]): a chunk runs once its audio has
//!   arrived, 2 frames and 80 samples past its last frame;
//! - the LMDM samples 80-frame windows every 70 frames
//!   ([`cadence_engines::ditto::lmdm::MotionStream`]): a window runs once its 80 frames of
//!   condition have arrived, and a frame's motion is final once the next window's crossfade and
//!   the smoothing no longer reach it. This is what sets the delay: a frame is rendered up to
//!   one window (3.2 s of audio) and one window's diffusion after its audio arrived.
//!
//! What differs from a file's render is the voice activity, as in the MuseTalk live render
//! ([`crate::frame_loop::live`]): the loudness reference is the percentile of the levels received so far and
//! the silence easing sees `ramp` frames ahead. The frames are rendered in parts of
//! [`LiveOptions::part_frames`] frames starting on keyframes of the stream's fixed-stride
//! schedule; a part is rendered with the keyframe that ends it, which the next part renders
//! again (one warp more per part). Where the decisions agree, a frame is the file render's.

use crate::backend::elem::Method;
use crate::backend::resident::Residency;
use crate::ditto::{self, DittoAvatar, DittoEngines, DittoInfill, DITTO_FPS};
use crate::frame_loop::live::{
    add_part, stream_stats, whole_frames, LiveOptions, LiveOutput, LiveTarget, Received, ShownSpeech,
};
use crate::frame_loop::video::RenderResult;
use crate::frame_loop::RenderOptions;
use crate::schedules::keyframes::KeyframeSchedule;
use anyhow::{ensure, Context, Result};
use cadence_engines::ditto::hubert::DittoFeatureStream;
use cadence_engines::ditto::keypoints::MOTION_DIM;
use cadence_media::{AudioStream, EncoderKind, FrameRate};
use std::io::{Read, Write};
use std::time::Instant;

/// How a live Ditto render cuts its stream (the MuseTalk live render's rule) and fills its
/// frames.
#[derive(Clone, Copy, Debug)]
pub struct DittoLiveOptions {
    /// The stride, the parts and the voice-activity lookahead.
    pub live: LiveOptions,
    /// Frames of silence easing.
    pub ramp: u32,
    pub infill: DittoInfill,
    pub method: Method,
    /// DDIM steps of the motion diffusion.
    pub steps: usize,
    /// The voice activity detector, deciding as the stream arrives.
    pub vad: crate::frame_loop::audio::Vad,
}

impl DittoLiveOptions {
    /// Parts of about `window` frames, as [`LiveOptions::new`] cuts them at Ditto's 25 fps.
    pub fn new(
        stride: usize,
        window: Option<usize>,
        ramp: u32,
        infill: DittoInfill,
        method: Method,
        steps: usize,
        vad: crate::frame_loop::audio::Vad,
    ) -> Result<Self> {
        ensure!(steps > 0, "the motion diffusion needs at least one DDIM step");
        let opts = RenderOptions { fps: FrameRate::whole(DITTO_FPS), ramp, vad, ..RenderOptions::default() };
        Ok(Self { live: LiveOptions::new(stride, window, &opts)?, ramp, infill, method, steps, vad })
    }
}

/// Renders the WAV stream `input` with Ditto as a fragmented MP4 into `out` (`name` names it in
/// errors), part by part as the audio arrives (module docs), until the stream ends; with `pace`,
/// every frame waits for its time counted from the first frame. `progress` gets the frames
/// written.
#[allow(clippy::too_many_arguments)]
pub fn render_live<R: Read, W: Write>(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    opts: DittoLiveOptions,
    input: AudioStream<R>,
    out: W,
    name: &str,
    encoder: EncoderKind,
    pace: bool,
    progress: impl FnMut(usize),
) -> Result<RenderResult> {
    render_live_to(engines, avatar, opts, input, LiveTarget::Mp4 { out, encoder }, name, pace, progress)
}

/// As [`render_live`], with the frames going to `target`: a fragmented MP4, or a caller that
/// takes each frame (a WebRTC session).
#[allow(clippy::too_many_arguments)]
pub fn render_live_to<R: Read, W: Write>(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    opts: DittoLiveOptions,
    input: AudioStream<R>,
    target: LiveTarget<'_, W>,
    name: &str,
    pace: bool,
    mut progress: impl FnMut(usize),
) -> Result<RenderResult> {
    let t0 = Instant::now();
    let fps = FrameRate::whole(DITTO_FPS);
    let LiveOptions { stride: k, part_frames, lookahead_frames: lookahead } = opts.live;
    let ramp = opts.ramp as usize;
    ensure!(k > 0 && part_frames.is_multiple_of(k) && part_frames > 0, "a part is a multiple of the stride");
    let c = &avatar.compositor;
    let mut received = Received::new(input, &opts.vad)?;
    let track_format = received.stream.track_format();
    let mut output = LiveOutput::new(target, name, (c.width, c.height), fps, track_format, pace, t0)?;
    let width = engines.audio_feature_width();
    let mut features = DittoFeatureStream::new();
    let mut motion = ditto::motion_stream(engines, avatar)?;
    let noise = engines.motion_noise(opts.steps);
    // Final motion rows from frame `rows_from` on, and the first frame's (the reference of the
    // relative driving).
    let (mut rows, mut rows_from) = (Vec::<f32>::new(), 0);
    let mut reference: Option<Vec<f32>> = None;
    let mut fed = 0; // 16 kHz samples handed to HuBERT
    let mut shown_speech = ShownSpeech::new(opts.ramp);
    let mut stats = stream_stats(Residency::Host);
    let mut a = 0; // the next frame to show: a keyframe of the stream
    loop {
        // Read until the part's motion and its voice activity's lookahead are known.
        let total = loop {
            let total =
                received.ended.then(|| crate::frame_loop::audio::frames_for_samples(received.mono_total, fps.hz()));
            let need = total.map_or(a + part_frames + 1, |n| n.min(a + part_frames + 1));
            let released = rows_from + rows.len() / MOTION_DIM;
            let heard = total.is_some() || whole_frames(received.mono_total, fps) >= need + lookahead;
            if (released >= need && heard) || motion.is_done() {
                break total;
            }
            received.wait_for(whole_frames(received.mono_total, fps) + 1, fps)?;
            let t = Instant::now();
            features.push(&received.mono[fed - received.mono_from..])?;
            fed = received.mono_total;
            if received.ended {
                features.finish();
            }
            let f = engines.stream_features(&mut features)?;
            if !f.is_empty() {
                motion.push(&ditto::condition(&f, width, avatar))?;
            }
            if features.is_done() {
                motion.finish();
            }
            let m = motion.step(|kp, window| engines.motion_window(kp, window, opts.steps, &noise))?;
            if reference.is_none() && m.len() >= MOTION_DIM {
                reference = Some(m[..MOTION_DIM].to_vec());
            }
            rows.extend(m);
            stats.times.audio_ms += t.elapsed().as_secs_f64() * 1e3;
            // HuBERT keeps the audio it still needs; voice activity, the levels.
            received.forget_before(fed, a, fps);
        };
        let n = match total {
            Some(n) if n <= a => break,
            Some(n) => n,
            None => usize::MAX,
        };
        let last = n - a <= part_frames + 1;
        // The part: frames a..=b, shown a..b (b, a keyframe, starts the next part), or to the
        // end of the stream.
        let (part_len, shown) = if last { (n - a, n - a) } else { (part_frames + 1, part_frames) };
        let released = rows_from + rows.len() / MOTION_DIM;
        ensure!(released >= a + part_len, "the motion of frames {a}..{} is not known", a + part_len);
        let known = total.unwrap_or_else(|| whole_frames(received.mono_total, fps));
        let decided = received.speech(a, (a + part_len + ramp).min(known), fps);
        let distance = shown_speech.distance(a, &decided, part_len);

        let t = Instant::now();
        let part_motion = &rows[(a - rows_from) * MOTION_DIM..(a - rows_from + part_len) * MOTION_DIM];
        let reference = reference.as_deref().context("the first frame's motion")?;
        let kp = ditto::driving_keypoints(engines, avatar, reference, part_motion, &distance, opts.ramp)?;
        stats.times.audio_ms += t.elapsed().as_secs_f64() * 1e3;
        let schedule = KeyframeSchedule::fixed_stride(part_len, k)?;
        let track = &mut received.track;
        let part_stats = ditto::frames::render(
            engines,
            avatar,
            &kp,
            &distance,
            opts.ramp,
            &schedule,
            opts.infill,
            opts.method,
            output.part_sink(a, shown, track, &mut progress),
            |_| {},
        )
        .with_context(|| format!("rendering frames {a}..{}", a + shown))?;
        add_part(&mut stats, &part_stats, &distance, shown, opts.ramp);

        shown_speech.shown(a, &decided, shown);
        a += shown;
        rows.drain(..(a - rows_from) * MOTION_DIM);
        rows_from = a;
        if last {
            break;
        }
    }
    ensure!(a > 0, "the audio is too short for one video frame");
    output.finish(&mut received.track, stats)
}
