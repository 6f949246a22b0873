//! A live render: speech read from a stream as it arrives (a pipe, a FIFO, standard input),
//! video written as fragmented MP4 as it is made, with no end known in advance.
//!
//! A file's render knows its whole clip: the loudness reference of voice activity is a
//! percentile of the whole clip, and whisper encodes each 30 s segment with all of its audio. A
//! live render cannot wait for either, so it renders the stream a part at a time, each part as
//! soon as the audio of the part and a short lookahead has arrived:
//! - parts are [`LiveOptions::part_frames`] frames (the render window, rounded up to a multiple
//!   of the stride), starting on keyframes of the stream's fixed-stride schedule (every k-th
//!   frame, and the last frame, as in a file's render). A part is rendered with the keyframe
//!   that ends it, which the next part starts from with the key this part made for it
//!   (`frame_loop::run_carrying`: the UNet does not run on it again; its audio features are
//!   the ones of this part's whisper pass);
//! - whisper encodes, for each part, the last 30 s of audio received (the lookahead included):
//!   one encoder pass per part instead of one per 30 s;
//! - the loudness reference is the percentile of the levels received so far
//!   ([`cadence_media::LevelReference`]); a frame's speech decision is final once it is
//!   shown;
//! - the silence easing sees speech up to `ramp` frames ahead (the lookahead covers it), so it
//!   is the file's rule on the decisions.
//!
//! The output therefore differs from a render of the same audio as a file; how much is measured
//! (`cadence render --audio -` against a file render: `cli/tests/live_audio.rs`, and the
//! `streaming` experiment). The delay from a sample's arrival to its frame's output is the
//! part, the lookahead and one part's render time.

use crate::frame_loop::live::{
    add_part, aligned_frame_step, frame_start_sample, stream_stats, whole_frames, LiveOptions, LiveOutput, LiveTarget,
    Received, ShownSpeech,
};
use crate::frame_loop::live_vad::frame_sample;
use crate::frame_loop::stride_governor::{PartMeasure, StrideGovernor};
use crate::frame_loop::video::RenderResult;
use crate::frame_loop::{ClipPart, RenderOptions};
use crate::musetalk::features::FrameFeatures;
use crate::musetalk::render::PreparedAvatar;
use crate::musetalk::Engines;
use crate::schedules::keyframes::KeyframeSchedule;
use crate::Backend;
use anyhow::{ensure, Context, Result};
use cadence_media::{AudioStream, EncoderKind, TARGET_RATE};
use std::io::{Read, Write};
use std::time::Instant;

/// Whisper's window: the audio a part's features are made from at most.
const CONTEXT_SAMPLES: usize = 30 * TARGET_RATE as usize;

/// A part's features: whisper's frames of the context audio, which starts `offset` frames
/// before the part.
struct Shifted<'a> {
    inner: &'a dyn FrameFeatures,
    offset: usize,
    frames: usize,
}

impl FrameFeatures for Shifted<'_> {
    fn frames(&self) -> usize {
        self.frames
    }

    fn frame_shape(&self) -> (usize, usize) {
        self.inner.frame_shape()
    }

    fn gather(&self, frames: &[usize], out: &mut Vec<f32>) -> Result<()> {
        let shifted: Vec<usize> = frames.iter().map(|&f| f + self.offset).collect();
        self.inner.gather(&shifted, out)
    }
}

/// Renders the WAV stream `input` with `avatar` as a fragmented MP4 into `out` (`name` names it
/// in errors), part by part as the audio arrives (see the module documentation), until the
/// stream ends; with `pace`, every frame waits for its time counted from the first frame.
/// `progress` gets the frames written.
#[allow(clippy::too_many_arguments)]
pub fn render_live<R: Read, W: Write>(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    live: LiveOptions,
    avatar: &PreparedAvatar,
    input: AudioStream<R>,
    out: W,
    name: &str,
    encoder: EncoderKind,
    pace: bool,
    progress: impl FnMut(usize),
) -> Result<RenderResult> {
    render_live_to(
        engines,
        backend,
        opts,
        live,
        None,
        avatar,
        input,
        LiveTarget::Mp4 { out, encoder },
        name,
        pace,
        progress,
    )
}

/// As [`render_live`], with the frames going to `target`: a fragmented MP4, or a caller that
/// takes each frame (a WebRTC session). With a `governor`, each part runs at the stride it
/// chooses from what the parts before measured (its part length must be `live`'s); without,
/// at `live.stride`.
#[allow(clippy::too_many_arguments)]
pub fn render_live_to<R: Read, W: Write>(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    live: LiveOptions,
    governor: Option<&StrideGovernor>,
    avatar: &PreparedAvatar,
    input: AudioStream<R>,
    target: LiveTarget<'_, W>,
    name: &str,
    pace: bool,
    mut progress: impl FnMut(usize),
) -> Result<RenderResult> {
    let t0 = Instant::now();
    let fps = opts.fps;
    ensure!(
        live.stride > 0 && live.part_frames > 0 && live.part_frames.is_multiple_of(live.stride),
        "a part is a multiple of the stride"
    );
    ensure!(
        governor.is_none_or(|g| g.part_frames() == live.part_frames),
        "the stride governor's parts are not the render's"
    );
    let c = &avatar.compositors[0];
    let mut received = Received::new(input, &opts.vad)?;
    let track_format = received.stream.track_format();
    let mut output = LiveOutput::new(target, name, (c.width, c.height), fps, track_format, pace, t0)?;
    let step = aligned_frame_step(fps);
    let ramp = opts.ramp as usize;
    // Windows of one stride: a part's frames go out as soon as the keyframes around them are
    // made (with keyframe batches of `opts.batch`), not after every keyframe of the part.
    let mut part_opts = opts.clone();
    let mut shown_speech = ShownSpeech::new(opts.ramp);
    let mut stats = stream_stats(crate::backend::resident::residency(backend, &engines.device));
    // The next frame to show (a keyframe of the stream), and its key as the part before made
    // it (that part's last keyframe): not evaluated again.
    let mut a = 0;
    let mut carried = None;
    loop {
        received.wait_for(a + live.part_frames + 1 + live.lookahead_frames, fps)?;
        let t_part = Instant::now();
        let k = governor.map_or(live.stride, StrideGovernor::stride);
        let available = whole_frames(received.mono_total, fps);
        // The stream's frame count once it has ended: ceil(seconds x fps), as for a file.
        let total = received
            .ended
            .then(|| cadence_media::frame_count(received.mono_total as f64 / TARGET_RATE as f64, fps.hz()));
        let last = match total {
            Some(n) if n <= a => break,
            Some(n) => n - a <= live.part_frames + 1,
            None => false,
        };
        // The part: frames a..=b, shown a..b (b, a keyframe, starts the next part), or to the
        // end of the stream.
        let (part_len, shown) = match total {
            Some(n) if last => (n - a, n - a),
            _ => (live.part_frames + 1, live.part_frames),
        };
        ensure!(
            total.is_some() || a + part_len + live.lookahead_frames <= available,
            "the stream's audio ({available} frames) does not reach past the part"
        );
        let schedule = KeyframeSchedule::fixed_stride(part_len, k)?;
        part_opts.window = Some(k);

        // Voice activity for frames a.. (up to `ramp` past the part), with the reference so far.
        let known_frames = total.unwrap_or(available);
        let decided = received.speech(a, (a + part_len + ramp).min(known_frames), fps);
        let distance = shown_speech.distance(a, &decided, part_len);

        // Whisper over the last 30 s received (from a frame's first sample on).
        let end_sample = received.mono_total;
        let ctx_frame = {
            let earliest = end_sample.saturating_sub(CONTEXT_SAMPLES);
            let f = whole_frames(earliest, fps);
            let f = if frame_start_sample(f, fps).is_some_and(|s| s >= earliest) { f } else { f + 1 };
            f.div_ceil(step) * step
        };
        let ctx_frame = ctx_frame.min(a / step * step);
        let ctx_start = frame_start_sample(ctx_frame, fps).context("an aligned frame starts on a sample")?;
        ensure!(ctx_start >= received.mono_from, "the audio before sample {ctx_start} was forgotten");
        let ctx = &received.mono[ctx_start - received.mono_from..];
        let t = Instant::now();
        let clip = engines.audio.clip(ctx, fps.hz() as f32)?;
        let features = Shifted { inner: &clip, offset: a - ctx_frame, frames: part_len };
        ensure!(
            a - ctx_frame + part_len <= clip.frames(),
            "whisper's context covers {} frames, the part needs {}",
            clip.frames(),
            a - ctx_frame + part_len
        );
        stats.times.audio_ms += t.elapsed().as_secs_f64() * 1e3;

        let part = ClipPart { first_frame: a, distance: &distance };
        let track = &mut received.track;
        let (part_stats, last_key) = crate::musetalk::frames::render_carrying(
            engines,
            backend,
            &part_opts,
            &features,
            part,
            &schedule,
            &avatar.avatar,
            &avatar.compositors,
            carried.take(),
            output.part_sink(a, shown, track, &mut progress),
            |_| {},
        )
        .with_context(|| format!("rendering frames {a}..{}", a + shown))?;
        carried = last_key;
        add_part(&mut stats, &part_stats, &distance, shown, opts.ramp);
        if let Some(g) = governor {
            g.observe(&PartMeasure {
                shown_frames: shown,
                rendered_frames: part_len,
                unet_evaluations: part_stats.keyframes_evaluated,
                decoded_frames: part_stats.decoded_frames,
                unet_ms: part_stats.times.unet_ms,
                decoder_ms: part_stats.times.decoder_ms,
                // Without the time the frames waited for the wire to take them.
                compute_ms: (t_part.elapsed().as_secs_f64() * 1e3 - part_stats.times.encoder_ms).max(0.0),
            });
        }

        shown_speech.shown(a, &decided, shown);
        a += shown;
        if last {
            break;
        }
        // What the next part can still need: whisper's 30 s before the audio received by then
        // (at least as much as now), what voice activity reads for its frames.
        let next_context = end_sample.saturating_sub(CONTEXT_SAMPLES).min(frame_sample(a / step * step, fps));
        received.forget_before(next_context, a, fps);
    }
    ensure!(a > 0, "the audio is too short for one video frame");
    output.finish(&mut received.track, stats)
}
