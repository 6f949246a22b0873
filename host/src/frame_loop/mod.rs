//! The one frame loop: keyframe schedule with silence bypass -> the engine's keyframe network on
//! the keyframes that are not bypassed -> the engine's infill of the frames between -> its
//! decoder -> compositing fused with NV12 -> a sink. Both engines plug into it through
//! [`FrameEngine`] (MuseTalk: [`crate::musetalk::frames`], Ditto: [`crate::ditto::frames`]); a whole
//! clip, a windowed clip and a live stream's parts are its sources, and every output is a sink:
//! an MP4, a fragmented MP4 on a stream ([`video`]), the server's responses, a live stream
//! ([`live`]). Every stage is timed ([`StageTimes`], [`report`]).
//!
//! The loop works in **windows** of keyframes ([`RenderOptions::window`]): each window's
//! keyframes are evaluated, its frames infilled, decoded and handed to the sink before the next
//! window's keyframe work starts, so the first frame leaves after one window's work and the
//! frames in flight are bounded by a window, not by the clip. The output is byte-identical
//! whatever the window, because every engine call and every kernel sees exactly the inputs of
//! the whole-clip render:
//! - the keyframe network runs the same batches (consecutive keyframes that are not bypassed,
//!   [`FrameEngine::key_batch`] at a time); a window ends at a keyframe and takes as many batches
//!   as its keyframes need (a batch may reach into the next window: its results wait there);
//! - windows share their boundary keyframe, and each frame is infilled from the keyframe interval
//!   that owns it in the whole clip (a boundary keyframe belongs to the interval it starts);
//! - the decoder runs the same batches: a run of frames that would cross the end of a window
//!   waits for the next one.

pub mod audio;
pub mod clock;
pub mod live;
pub mod live_vad;
pub mod report;
pub mod stride_governor;
pub mod video;

use crate::avatar::cycle_index;
use crate::backend::composite::Compositor;
use crate::backend::elem::{Method, RgbRange};
use crate::backend::resident::{FrameBuffer, Residency};
use crate::schedules::keyframes::{bypassed_frames, KeyframeSchedule};
use crate::Backend;
use anyhow::{ensure, Context, Result};
use cadence_engines::Tensor;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct RenderOptions {
    pub fps: cadence_media::FrameRate,
    /// Frames of Hermite easing between speech and rest (4 gives 1, 0.84375, 0.5, 0.15625, 0).
    pub ramp: u32,
    /// Engine batch size.
    pub batch: usize,
    pub method: Method,
    /// MuseTalk's infill: on latents (the decoder on every frame) or on the decoded keyframe
    /// crops (the decoder on keyframes only). Ditto's infills are given to its render.
    pub infill: crate::musetalk::MuseTalkInfill,
    /// Frames per render window ([`run`]); `None` renders the clip as one window.
    /// The output is the same whatever the window; memory and the time to the first frame
    /// grow with it.
    pub window: Option<usize>,
    /// Which detector decides voice activity (the easing and the bypass) before the render.
    pub vad: audio::Vad,
    /// Set from another thread to stop the render: it is checked before every engine batch
    /// (UNet and decoder), and a cancelled render returns the error [`Cancelled`].
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            fps: cadence_media::FrameRate::whole(25),
            ramp: 4,
            batch: 8,
            method: Method::Slerp,
            infill: crate::musetalk::MuseTalkInfill::Latent,
            window: None,
            vad: audio::Vad::default(),
            cancel: None,
        }
    }
}

/// The render window `cadence render` and the server use unless told otherwise: a few seconds
/// bound memory and the wait for the first frame, and cost nothing in throughput
/// (`results/streaming.csv`).
pub const DEFAULT_WINDOW_SECONDS: f64 = 4.0;

/// A window of `seconds` at `fps` as frames (at least one); `None` (the clip as one window) for
/// 0 seconds.
pub fn window_frames(seconds: f64, fps: cadence_media::FrameRate) -> Option<usize> {
    (seconds > 0.0).then(|| ((seconds * fps.hz()).ceil() as usize).max(1))
}

impl RenderOptions {
    fn check_cancelled(&self) -> Result<()> {
        match &self.cancel {
            Some(flag) if flag.load(Ordering::Relaxed) => Err(Cancelled.into()),
            _ => Ok(()),
        }
    }
}

/// The error of a render stopped through [`RenderOptions::cancel`] (find it with
/// `anyhow::Error::is::<Cancelled>()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the render was cancelled")
    }
}

impl std::error::Error for Cancelled {}

/// Milliseconds per stage.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StageTimes {
    /// The audio encoder inside the render loop: features made as the windows reach them
    /// (0 when the whole clip's features were made before the render).
    pub audio_ms: f64,
    pub unet_ms: f64,
    pub expand_ms: f64,
    pub ease_ms: f64,
    pub decoder_ms: f64,
    /// CPU time of the render's threads in the audio encoder, the keyframe network and the
    /// decoder ([`clock`]): the same work reports the same time whatever runs beside it.
    pub audio_cpu_ms: f64,
    pub unet_cpu_ms: f64,
    pub decoder_cpu_ms: f64,
    pub composite_nv12_ms: f64,
    /// The frame loop's time on the encoder: handing frames over (waiting when the encoder is
    /// behind) and, for an MP4, waiting for it to finish. Where the encoder runs beside the loop
    /// (`frame_loop::video::write_video` to an MP4) this is what it added to the render, not its own work.
    pub encoder_ms: f64,
    /// The encoder thread's own time where it runs beside the frame loop (0 where it runs
    /// inline): its CPU time on Linux, elsewhere the wall time of its calls.
    pub encoder_busy_ms: f64,
    pub other_ms: f64,
    pub total_ms: f64,
}

impl StageTimes {
    /// The named stages' sum (everything but `other_ms`, `total_ms` and the encoder thread's own
    /// time, which overlaps the loop).
    pub fn stages_ms(&self) -> f64 {
        self.audio_ms
            + self.unet_ms
            + self.expand_ms
            + self.ease_ms
            + self.decoder_ms
            + self.composite_nv12_ms
            + self.encoder_ms
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct RenderStats {
    pub frames: usize,
    pub keyframes_scheduled: usize,
    /// Keyframes the keyframe network actually ran on (scheduled minus bypassed).
    pub keyframes_evaluated: usize,
    pub bypassed_frames: usize,
    pub decoded_frames: usize,
    /// Where the frames were kept between the stages.
    pub residency: Residency,
    pub times: StageTimes,
}

pub(crate) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Where the frames of a render ([`run`]) sit in a longer stream (a live render renders its
/// stream a part at a time).
#[derive(Clone, Copy)]
pub struct ClipPart<'a> {
    /// The stream's index of the part's frame 0: the avatar's cycle ([`cycle_index`]) goes on
    /// from it. The sink and the engine still count frames from 0.
    pub first_frame: usize,
    /// Per frame of the part, frames to the nearest speech in the stream
    /// ([`crate::schedules::keyframes::speech_distance`] of the stream, which may see speech before and
    /// after the part).
    pub distance: &'a [u32],
}

impl<'a> ClipPart<'a> {
    /// A whole clip: frame 0 is the stream's frame 0.
    pub fn whole(distance: &'a [u32]) -> Self {
        ClipPart { first_frame: 0, distance }
    }
}

/// What an engine does in the frame loop: what it computes at a keyframe, how it fills the frames
/// between, how it decodes. The loop owns the rest (the schedule, the bypass, windows and batches,
/// cancellation, compositing, the sink, the counts and the times).
///
/// Frames are counted from the render's frame 0 ([`ClipPart`] says where that sits in a stream).
pub trait FrameEngine {
    /// A keyframe's result (MuseTalk: its latent, or its decoded crop with `image` infill; Ditto:
    /// the warped feature, with the decoded crop where the infill works on pixels). Cloned when a
    /// window reuses it (keep it cheap).
    type Key: Clone;

    /// Keyframes per call of [`Self::evaluate`] at most.
    fn key_batch(&self) -> usize;
    /// Frames per call of [`Self::decode`] at most.
    fn decode_batch(&self) -> usize;
    /// Runs the keyframe network on `frames` (keyframes, none bypassed, in order): one key each.
    /// Adds its stages' times to `times`.
    fn evaluate(&mut self, frames: &[usize], times: &mut StageTimes) -> Result<Vec<Self::Key>>;
    /// The key of a bypassed keyframe: the rest state of the avatar frame `frame` shows.
    fn rest_key(&self, frame: usize) -> Result<Self::Key>;
    /// Takes the keys of `window` and prepares its frames `window.frames.start..window.end` (the
    /// frames not bypassed among them are decoded next, in runs).
    fn infill(&mut self, window: &Window<'_, Self::Key>, times: &mut StageTimes) -> Result<()>;
    /// The decoded face crops of frames `run` (none bypassed, all infilled): (run.len(), 3, H, W).
    fn decode(&mut self, run: Range<usize>, times: &mut StageTimes) -> Result<Tensor>;
    /// Frames before `frame` are done: what the engine keeps for them can go.
    fn release(&mut self, frame: usize) -> Result<()>;
    /// The decoded rest state shown on the bypassed frames of avatar frame `avatar_frame`: (1, 3, H, W).
    fn rest_crop(&self, avatar_frame: usize) -> &Tensor;
    /// The decoder's output range.
    fn crop_range(&self) -> RgbRange;
    /// Frames (and keyframes) the decoder has run on so far.
    fn decoded_frames(&self) -> usize;
    /// Where the engine keeps the frames between the stages.
    fn residency(&self) -> Residency;
}

/// One window of the loop, as [`FrameEngine::infill`] sees it.
pub struct Window<'a, K> {
    /// The render's schedule (frames from 0).
    pub schedule: &'a KeyframeSchedule,
    /// The window's keyframes, as indices into `schedule.keyframes()`: `first_key..=last_key`.
    pub first_key: usize,
    /// Their keys, in order (bypassed keyframes hold [`FrameEngine::rest_key`]).
    pub keys: &'a [K],
    /// The frames the window's keyframes span: from its first keyframe to its last keyframe
    /// included (the next window starts there and owns it), or to the end of the clip for the
    /// last window.
    pub frames: Range<usize>,
    /// The window hands out frames `frames.start..end`.
    pub end: usize,
    /// Frames to the nearest speech over `frames` (the render's whole `distance`, indexed by frame).
    pub distance: &'a [u32],
    pub ramp: u32,
    pub method: Method,
}

/// Renders every frame of a render whose schedule is `schedule` with `engine`, and hands each NV12
/// frame to `sink` in order (the sink's time is recorded as the encoder's). `compositors`: one per
/// avatar frame; output frame k shows avatar frame [`cycle_index`]`(part.first_frame + k, ..)`.
/// See the module docs for the windows.
#[allow(clippy::too_many_arguments)]
pub fn run<E: FrameEngine>(
    engine: &mut E,
    backend: &Backend,
    opts: &RenderOptions,
    part: ClipPart,
    schedule: &KeyframeSchedule,
    compositors: &[Compositor],
    sink: impl FnMut(usize, &[u8]) -> Result<()>,
    progress: impl FnMut(usize),
) -> Result<RenderStats> {
    run_carrying(engine, backend, opts, part, schedule, compositors, None, sink, progress).map(|(stats, _)| stats)
}

/// As [`run`], for one part of a live stream that starts on the keyframe the part before ended
/// on: `carried` is that keyframe's key as the part before made it (the keyframe network does
/// not run on frame 0 again, unless frame 0 is bypassed here, when its rest key is used), and
/// the key of this part's last keyframe comes back for the next part (`None` where the network
/// did not make it: bypassed).
#[allow(clippy::too_many_arguments)]
pub fn run_carrying<E: FrameEngine>(
    engine: &mut E,
    backend: &Backend,
    opts: &RenderOptions,
    part: ClipPart,
    schedule: &KeyframeSchedule,
    compositors: &[Compositor],
    carried: Option<E::Key>,
    mut sink: impl FnMut(usize, &[u8]) -> Result<()>,
    mut progress: impl FnMut(usize),
) -> Result<(RenderStats, Option<E::Key>)> {
    let t_total = Instant::now();
    let mut times = StageTimes::default();
    let n = schedule.n_frames();
    let distance = part.distance;
    ensure!(distance.len() == n, "the voice activity covers {} frames, the schedule {n}", distance.len());
    ensure!(engine.key_batch() > 0 && engine.decode_batch() > 0, "batch size must be at least 1");
    ensure!(opts.window != Some(0), "the render window must hold at least one frame");
    ensure!(!compositors.is_empty(), "the avatar has no frames");
    ensure!(
        compositors.iter().all(|c| (c.width, c.height) == (compositors[0].width, compositors[0].height)),
        "the avatar's frames differ in size"
    );
    // Output frame k shows avatar frame `of(k)`: its compositor (background and face box), and
    // in the engine its reference and rest state.
    let of = |k: usize| cycle_index(part.first_frame + k, compositors.len());

    // Silence: distance to speech -> easing weight; weight 0 frames bypass every network.
    let bypassed = bypassed_frames(distance, opts.ramp);
    let keys = schedule.keyframes();
    let m = keys.len();
    // A carried key stands for keyframe 0 (always frame 0) where the network would run on it.
    ensure!(carried.is_none() || keys[0] == 0, "a carried key stands for frame 0, which is not a keyframe here");
    let carried = carried.filter(|_| !bypassed[0]);
    let carried_first = |j: usize| j == 0 && carried.is_some();
    let evaluate: Vec<usize> = (0..m).filter(|&j| !bypassed[keys[j] as usize] && !carried_first(j)).collect();
    let key_batches: Vec<&[usize]> = evaluate.chunks(engine.key_batch()).collect();
    let range = engine.crop_range();
    // One frame buffer for the whole render: outside the face box it keeps the background (of
    // the avatar frame it was last composited with).
    let mut frame_nv12 = FrameBuffer::new(&compositors[0]);

    // Keys from the keyframe network, kept from the current window's first keyframe on.
    let mut key_out: Vec<Option<E::Key>> = vec![None; m];
    key_out[0] = carried;
    let mut next_batch = 0;
    let mut first_key = 0; // the current window's first keyframe (index into `keys`)
    let mut produced = 0; // frames infilled so far
    let mut decoded_upto = 0; // frames handed to the sink so far
    while produced < n {
        // The window ends at the first keyframe at least `window` frames after its start (at
        // least one keyframe interval); the last window runs to the end of the clip.
        let last_key = match opts.window {
            _ if m == 1 => 0,
            None => m - 1,
            Some(w) => (first_key + 1..m).find(|&j| keys[j] as usize >= produced + w).unwrap_or(m - 1),
        };
        let is_last = last_key == m - 1;
        let end = if is_last { n } else { keys[last_key] as usize };

        // Keyframe batches until every keyframe of the window is known.
        while next_batch < key_batches.len() && key_batches[next_batch][0] <= last_key {
            opts.check_cancelled()?;
            let chunk = key_batches[next_batch];
            let frames: Vec<usize> = chunk.iter().map(|&j| keys[j] as usize).collect();
            let out = engine.evaluate(&frames, &mut times)?;
            ensure!(out.len() == chunk.len(), "{} keys for {} keyframes", out.len(), chunk.len());
            for (key, &j) in out.into_iter().zip(chunk) {
                key_out[j] = Some(key);
            }
            next_batch += 1;
            progress(0);
        }
        let window_keys: Vec<E::Key> = (first_key..=last_key)
            .map(|j| match &key_out[j] {
                Some(k) => Ok(k.clone()),
                None => engine.rest_key(keys[j] as usize),
            })
            .collect::<Result<_>>()?;
        let base = produced;
        let span_end = if is_last { n } else { end + 1 };
        let window = Window {
            schedule,
            first_key,
            keys: &window_keys,
            frames: base..span_end,
            end,
            distance,
            ramp: opts.ramp,
            method: opts.method,
        };
        engine.infill(&window, &mut times)?;
        produced = end;
        for slot in &mut key_out[first_key..last_key] {
            *slot = None;
        }
        first_key = last_key;

        // Decode (runs of frames not bypassed), composite + NV12, hand to the sink, in order.
        let mut f = decoded_upto;
        while f < produced {
            // A run of up to `decode_batch` consecutive frames that need decoding, or one
            // bypassed frame (the whole-clip rule: a run that would cross the window's end waits).
            let g = if bypassed[f] {
                f + 1
            } else {
                (f..n).take(engine.decode_batch()).take_while(|&x| !bypassed[x]).last().unwrap() + 1
            };
            if g > produced {
                break;
            }
            let crops = if bypassed[f] {
                None
            } else {
                opts.check_cancelled()?;
                let crops = engine.decode(f..g, &mut times)?;
                ensure!(crops.dims().first() == Some(&(g - f)), "the decoder returned shape {:?}", crops.dims());
                Some(crops)
            };
            for (i, frame) in (f..g).enumerate() {
                let t = Instant::now();
                let a = of(frame);
                match &crops {
                    Some(crops) => frame_nv12.compose(backend, compositors, a, crops, i, range)?,
                    // Inside a run of bypassed frames showing the same avatar frame, the buffer
                    // already holds its rest frame.
                    None if frame > 0 && bypassed[frame - 1] && of(frame - 1) == a => {}
                    None => frame_nv12.compose(backend, compositors, a, engine.rest_crop(a), 0, range)?,
                }
                times.composite_nv12_ms += ms(t);
                let t = Instant::now();
                sink(frame, frame_nv12.host()).with_context(|| format!("encoding frame {frame}"))?;
                times.encoder_ms += ms(t);
                progress(1);
            }
            f = g;
        }
        engine.release(f)?;
        decoded_upto = f;
    }
    times.total_ms = ms(t_total);
    times.other_ms = (times.total_ms - times.stages_ms()).max(0.0);
    let stats = RenderStats {
        frames: n,
        keyframes_scheduled: m,
        keyframes_evaluated: evaluate.len(),
        bypassed_frames: bypassed.iter().filter(|&&b| b).count(),
        decoded_frames: engine.decoded_frames(),
        residency: engine.residency(),
        times,
    };
    // The last window keeps its first keyframe's slot: the last keyframe's key is still there.
    Ok((stats, key_out[m - 1].take()))
}
