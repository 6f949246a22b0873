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
//!   that ends it, which the next part starts from: MuseTalk hands that keyframe's key on
//!   (`frame_loop::run_carrying`: the UNet does not run on it again), Ditto renders it again
//!   (one warp more per part);
//! - whisper encodes, for each part, the last 30 s of audio received (the lookahead included):
//!   one encoder pass per part instead of one per 30 s;
//! - voice activity is decided with what has arrived ([`super::live_vad`]: Silero's
//!   post-processing over the chunks received, or the energy levels against the percentile of
//!   the levels received so far); a frame's speech decision is final once it is shown;
//! - the silence easing sees speech up to `ramp` frames ahead (the lookahead covers it), so it
//!   is the file's rule on the decisions.
//!
//! The output therefore differs from a render of the same audio as a file; how much is measured
//! (`cadence render --audio -` against a file render: `cli/tests/live_audio.rs`, and the
//! `streaming` experiment). The delay from a sample's arrival to its frame's output is the
//! part, the lookahead and one part's render time.

use crate::backend::resident::Residency;
use crate::frame_loop::audio::Vad;
use crate::frame_loop::live_vad::{lookahead_seconds, LiveVad};
use crate::frame_loop::video::RenderResult;
use crate::frame_loop::{RenderOptions, RenderStats, StageTimes};
use crate::schedules::keyframes::{bypassed_frames, speech_distance};
use anyhow::{ensure, Result};
use cadence_media::{AudioStream, EncoderKind, FragmentedWriter, FrameRate, TARGET_RATE};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// How a live stream is cut into parts.
#[derive(Clone, Copy, Debug)]
pub struct LiveOptions {
    /// The fixed keyframe stride.
    pub stride: usize,
    /// Frames per part: a positive multiple of the stride.
    pub part_frames: usize,
    /// Frames of audio past a part's end that must have arrived before the part is rendered.
    pub lookahead_frames: usize,
}

impl LiveOptions {
    /// Parts of about `window` frames (at least one stride), and a lookahead that covers two
    /// needs, whichever reaches further (they overlap, they do not add):
    /// - the easing: a part's last frame eases toward speech up to the ramp's frames past it,
    ///   so their voice activity must be decided: the ramp plus what the detector's decisions
    ///   can still depend on ([`lookahead_seconds`]: 0.48 s for Silero's defaults, 0.41 s
    ///   without its front end, 0.25 s for the energy detector, none for digital silence);
    /// - whisper: a frame's window reaches [`WHISPER_REACH_SECONDS`] past it.
    pub fn new(stride: usize, window: Option<usize>, opts: &RenderOptions) -> Result<Self> {
        ensure!(stride > 0, "stride must be at least 1 (got 0)");
        let window = window.unwrap_or(
            crate::frame_loop::window_frames(crate::frame_loop::DEFAULT_WINDOW_SECONDS, opts.fps).unwrap_or(1),
        );
        let part_frames = window.div_ceil(stride).max(1) * stride;
        let frames = |seconds: f64| (seconds * opts.fps.hz()).ceil() as usize;
        let easing = opts.ramp as usize + frames(lookahead_seconds(&opts.vad));
        let lookahead_frames = easing.max(frames(WHISPER_REACH_SECONDS));
        Ok(Self { stride, part_frames, lookahead_frames })
    }
}

/// How far past a frame's start its whisper window reaches: the window's last steps, 20 ms
/// each, run to [`cadence_engines::whisper::STEPS_RIGHT`] steps past it (0.12 s: 3 frames at 25
/// fps). The encoder attends to its whole 30 s window, so later audio still moves a frame's
/// features a little, as it does in a file's render at a window's end.
pub const WHISPER_REACH_SECONDS: f64 = cadence_engines::whisper::STEPS_RIGHT as f64 / 50.0;

/// Frames whose audio has fully arrived, for `samples` 16 kHz samples.
pub(crate) fn whole_frames(samples: usize, fps: FrameRate) -> usize {
    // floor(samples * fps / 16000) in integers: exact for every rational rate.
    (samples as u128 * fps.num as u128 / (TARGET_RATE as u128 * fps.den as u128)) as usize
}

/// The 16 kHz sample where frame `f` starts, when that is a whole sample.
pub(crate) fn frame_start_sample(f: usize, fps: FrameRate) -> Option<usize> {
    let num = f as u128 * TARGET_RATE as u128 * fps.den as u128;
    num.is_multiple_of(fps.num as u128).then(|| (num / fps.num as u128) as usize)
}

/// The smallest frame step whose frames all start on a whole 16 kHz sample (1 at 25 fps, 3 at
/// 30, 15 at 30000/1001): whisper's context must start at a frame's first sample for its frames
/// to be the stream's frames.
pub(crate) fn aligned_frame_step(fps: FrameRate) -> usize {
    let a = TARGET_RATE as u64 * fps.den as u64;
    let b = fps.num as u64;
    let g = gcd(a, b);
    (b / g) as usize
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// What has arrived of the stream and is still needed.
pub(crate) struct Received<R: Read> {
    pub(crate) stream: AudioStream<R>,
    /// Source frames asked for per read: 10 ms, so a read returns as soon as that has arrived.
    read_frames: usize,
    pub(crate) ended: bool,
    /// 16 kHz samples from `mono_from` on.
    pub(crate) mono: Vec<f32>,
    pub(crate) mono_from: usize,
    pub(crate) mono_total: usize,
    pub(crate) track: Track,
    vad: LiveVad,
}

impl<R: Read> Received<R> {
    /// A stream whose voice activity `vad` decides.
    pub(crate) fn new(stream: AudioStream<R>, vad: &Vad) -> Result<Self> {
        let rate = stream.reader().format().sample_rate as usize;
        let track_channels = stream.track_format().channels as usize;
        Ok(Self {
            stream,
            read_frames: (rate / 100).max(1),
            ended: false,
            mono: Vec::new(),
            mono_from: 0,
            mono_total: 0,
            track: Track { samples: Vec::new(), from: 0, channels: track_channels.max(1) },
            vad: LiveVad::new(vad)?,
        })
    }

    /// Reads until `frames` whole frames of audio have arrived or the stream ends.
    pub(crate) fn wait_for(&mut self, frames: usize, fps: FrameRate) -> Result<()> {
        let mut fresh = Vec::new();
        while !self.ended && whole_frames(self.mono_total, fps) < frames {
            fresh.clear();
            self.ended = !self.stream.read(self.read_frames, &mut fresh, &mut self.track.samples)?;
            self.mono_total += fresh.len();
            self.mono.extend_from_slice(&fresh);
            self.vad.push(&fresh, self.ended)?;
        }
        Ok(())
    }

    /// Forgets the 16 kHz samples before `sample`, and what voice activity no longer reads for
    /// frame `a` and after.
    pub(crate) fn forget_before(&mut self, sample: usize, a: usize, fps: FrameRate) {
        if sample > self.mono_from {
            let n = (sample - self.mono_from).min(self.mono.len());
            self.mono.drain(..n);
            self.mono_from += n;
        }
        self.vad.forget_before(a, fps);
    }
}

impl<R: Read> Received<R> {
    /// Voice activity of frames a..end (`end` at most the frames known), decided with what has
    /// been received so far.
    pub(crate) fn speech(&self, a: usize, end: usize, fps: FrameRate) -> Vec<bool> {
        self.vad.speech(a, end, fps)
    }
}

/// The speech decisions of the frames already shown that the silence easing still reads (it
/// looks `ramp` frames back): a decision is final once its frame is shown.
pub(crate) struct ShownSpeech {
    speech: Vec<bool>,
    from: usize,
    ramp: usize,
}

impl ShownSpeech {
    pub(crate) fn new(ramp: u32) -> Self {
        Self { speech: Vec::new(), from: 0, ramp: ramp as usize }
    }

    /// Distances to speech of frames a..a + len, over the decisions shown before `a` and
    /// `decided` (frames a.., as far as they are known).
    pub(crate) fn distance(&self, a: usize, decided: &[bool], len: usize) -> Vec<u32> {
        let before = a - self.from;
        let mut speech = self.speech[..before].to_vec();
        speech.extend_from_slice(decided);
        speech.resize(speech.len().max(before + len), false);
        speech_distance(&speech)[before..before + len].to_vec()
    }

    /// Frames a..a + shown were shown with the decisions `decided` (frames a..).
    pub(crate) fn shown(&mut self, a: usize, decided: &[bool], shown: usize) {
        let before = a - self.from;
        self.speech.truncate(before);
        self.speech.extend_from_slice(&decided[..shown.min(decided.len())]);
        self.speech.resize(before + shown, false);
        let keep_from = (a + shown).saturating_sub(self.ramp).max(self.from);
        self.speech.drain(..keep_from - self.from);
        self.from = keep_from;
    }
}

/// Where a live render's frames go.
pub enum LiveTarget<'a, W: Write> {
    /// A fragmented MP4 written to `out`: H.264 by `encoder`, the stream's audio as AAC.
    Mp4 { out: W, encoder: EncoderKind },
    /// Each NV12 frame with its index in the stream, to a caller that encodes and sends it
    /// itself (a WebRTC session, which also sends the stream's audio on its own).
    Frames(&'a mut (dyn FnMut(usize, &[u8]) -> Result<()> + Send)),
}

enum Writer<'a, W: Write> {
    /// Boxed: the writer's encoder state dwarfs a reference.
    Mp4(Box<FragmentedWriter<W>>),
    Frames(&'a mut (dyn FnMut(usize, &[u8]) -> Result<()> + Send)),
}

/// A live render's output: each frame after the stream's audio up to the frame's end, paced to
/// real time when asked, with the times of the first frame and fragment.
pub(crate) struct LiveOutput<'a, W: Write> {
    writer: Writer<'a, W>,
    name: String,
    t0: Instant,
    pace: bool,
    period: f64,
    track_rate: f64,
    started: Option<Instant>,
    first_frame_ms: Option<f64>,
    first_fragment_ms: Option<f64>,
    late_frames: usize,
}

impl<'a, W: Write> LiveOutput<'a, W> {
    /// `t0`: when the render started (the first frame's and fragment's times count from it).
    pub(crate) fn new(
        target: LiveTarget<'a, W>,
        name: &str,
        (width, height): (usize, usize),
        fps: FrameRate,
        track_format: cadence_media::AudioFormat,
        pace: bool,
        t0: Instant,
    ) -> Result<Self> {
        let writer = match target {
            LiveTarget::Mp4 { out, encoder } => Writer::Mp4(Box::new(FragmentedWriter::new(
                out,
                name,
                width as u32,
                height as u32,
                fps,
                encoder,
                Some(track_format),
            )?)),
            LiveTarget::Frames(f) => Writer::Frames(f),
        };
        Ok(Self {
            writer,
            name: name.to_string(),
            t0,
            pace,
            period: 1.0 / fps.hz(),
            track_rate: track_format.sample_rate as f64,
            started: None,
            first_frame_ms: None,
            first_fragment_ms: None,
            late_frames: 0,
        })
    }
    /// The sink of a part that starts at stream frame `a` and shows `shown` frames: its frames go
    /// out ([`Self::show`]) with progress, its closing keyframe (which the next part renders
    /// again and shows) does not.
    pub(crate) fn part_sink<'s>(
        &'s mut self,
        a: usize,
        shown: usize,
        track: &'s mut Track,
        progress: &'s mut dyn FnMut(usize),
    ) -> impl FnMut(usize, &[u8]) -> Result<()> + use<'s, 'a, W> {
        move |i, frame| {
            if i >= shown {
                return Ok(()); // the next part's first frame
            }
            self.show(a + i, frame, track)?;
            progress(1);
            Ok(())
        }
    }

    /// Shows frame `f` (NV12): first the track's audio up to the frame's end, then the frame,
    /// held back to its time with pacing.
    pub(crate) fn show(&mut self, f: usize, frame: &[u8], track: &mut Track) -> Result<()> {
        self.first_frame_ms.get_or_insert_with(|| self.t0.elapsed().as_secs_f64() * 1e3);
        if self.pace {
            let start = *self.started.get_or_insert_with(Instant::now);
            let due = start + Duration::from_secs_f64(f as f64 * self.period);
            let now = Instant::now();
            if now < due {
                std::thread::sleep(due - now);
            } else if (now - due).as_secs_f64() > self.period {
                self.late_frames += 1;
            }
        }
        let upto = ((f + 1) as f64 * self.period * self.track_rate).ceil() as usize;
        match &mut self.writer {
            Writer::Mp4(writer) => {
                track.take(upto, &mut |s| Ok(writer.push_audio(s)?))?;
                writer.push_nv12(frame)?;
                if self.first_fragment_ms.is_none() && writer.fragments_written() > 0 {
                    self.first_fragment_ms = Some(self.t0.elapsed().as_secs_f64() * 1e3);
                }
            }
            Writer::Frames(send) => {
                // The caller has the stream's audio: the track's copy is only let go.
                track.take(upto, &mut |_| Ok(()))?;
                send(f, frame)?;
            }
        }
        Ok(())
    }

    /// The rest of the track, the last fragment, flushed; the render's result with `stats`
    /// (the encoder's time of this last step added, the total set).
    pub(crate) fn finish(mut self, track: &mut Track, mut stats: RenderStats) -> Result<RenderResult> {
        let t = Instant::now();
        let total = track.total();
        let video = match self.writer {
            Writer::Mp4(mut writer) => {
                track.take(total, &mut |s| Ok(writer.push_audio(s)?))?;
                let (video, mut out) = writer.finish()?;
                out.flush().map_err(|e| anyhow::anyhow!("{}: {e}", self.name))?;
                Some(video)
            }
            Writer::Frames(_) => {
                track.take(total, &mut |_| Ok(()))?;
                None
            }
        };
        self.first_fragment_ms.get_or_insert_with(|| self.t0.elapsed().as_secs_f64() * 1e3);
        stats.times.encoder_ms += t.elapsed().as_secs_f64() * 1e3;
        stats.times.total_ms = self.t0.elapsed().as_secs_f64() * 1e3;
        Ok(RenderResult {
            stats,
            video,
            first_frame_ms: self.first_frame_ms,
            first_fragment_ms: self.first_fragment_ms,
            late_frames: self.late_frames,
        })
    }
}

/// The MP4 track's interleaved samples received and not yet muxed: sample frames `from..`.
pub(crate) struct Track {
    samples: Vec<i16>,
    from: usize,
    channels: usize,
}

impl Track {
    /// Sample frames received so far.
    pub(crate) fn total(&self) -> usize {
        self.from + self.samples.len() / self.channels
    }

    /// Hands the sample frames `from..to` (as many as have arrived) to `f` and forgets them.
    fn take(&mut self, to: usize, f: &mut dyn FnMut(&[i16]) -> Result<()>) -> Result<()> {
        let to = to.min(self.total());
        if to > self.from {
            let n = (to - self.from) * self.channels;
            f(&self.samples[..n])?;
            self.samples.drain(..n);
            self.from = to;
        }
        Ok(())
    }
}

/// A live render's statistics before its first part.
pub(crate) fn stream_stats(residency: Residency) -> RenderStats {
    RenderStats {
        frames: 0,
        keyframes_scheduled: 0,
        keyframes_evaluated: 0,
        bypassed_frames: 0,
        decoded_frames: 0,
        residency,
        times: StageTimes::default(),
    }
}

/// Adds a part's statistics to the stream's: the `shown` frames (the part's last frame, a
/// keyframe, is the next part's first), their bypasses by the part's `distance` and `ramp`, its
/// evaluations and times.
pub(crate) fn add_part(stats: &mut RenderStats, part: &RenderStats, distance: &[u32], shown: usize, ramp: u32) {
    stats.frames += shown;
    stats.keyframes_scheduled += part.keyframes_scheduled;
    stats.keyframes_evaluated += part.keyframes_evaluated;
    stats.bypassed_frames += bypassed_frames(&distance[..shown], ramp).iter().filter(|&&b| b).count();
    stats.decoded_frames += part.decoded_frames;
    add_times(&mut stats.times, &part.times);
}

fn add_times(sum: &mut StageTimes, t: &StageTimes) {
    sum.audio_ms += t.audio_ms;
    sum.unet_ms += t.unet_ms;
    sum.expand_ms += t.expand_ms;
    sum.ease_ms += t.ease_ms;
    sum.decoder_ms += t.decoder_ms;
    sum.composite_nv12_ms += t.composite_nv12_ms;
    sum.encoder_ms += t.encoder_ms;
    sum.encoder_busy_ms += t.encoder_busy_ms;
    sum.other_ms += t.other_ms;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_align_to_whole_samples() {
        assert_eq!(aligned_frame_step(FrameRate::whole(25)), 1);
        assert_eq!(aligned_frame_step(FrameRate::whole(30)), 3);
        assert_eq!(aligned_frame_step(FrameRate { num: 30000, den: 1001 }), 15);
        for fps in [FrameRate::whole(25), FrameRate::whole(30), FrameRate { num: 30000, den: 1001 }] {
            let step = aligned_frame_step(fps);
            for m in 0..5 {
                assert!(frame_start_sample(m * step, fps).is_some(), "{fps:?} frame {}", m * step);
            }
            if step > 1 {
                assert!(frame_start_sample(1, fps).is_none());
            }
        }
    }

    #[test]
    fn whole_frames_is_floor_of_time() {
        let fps = FrameRate::whole(25);
        assert_eq!(whole_frames(639, fps), 0);
        assert_eq!(whole_frames(640, fps), 1);
        assert_eq!(whole_frames(16000, fps), 25);
        let ntsc = FrameRate { num: 30000, den: 1001 };
        assert_eq!(whole_frames(8008, ntsc), 15);
        assert_eq!(whole_frames(8007, ntsc), 14);
    }

    #[test]
    fn parts_are_whole_strides() {
        let opts = RenderOptions::default();
        let l = LiveOptions::new(3, Some(100), &opts).unwrap();
        assert_eq!(l.part_frames, 102);
        // The ramp, and Silero's 0.476 s (250 ms of minimum speech, 100 of minimum silence, 30 of
        // padding, a 32 ms chunk, the front end's 64 ms) at 25 fps; 0.412 s without the front
        // end; the energy detector's 0.25 s.
        assert_eq!(l.lookahead_frames, 4 + 12);
        let raw = cadence_media::SileroConfig { denoise: false, ..Default::default() };
        let raw = RenderOptions { vad: Vad::Silero(raw), ..RenderOptions::default() };
        assert_eq!(LiveOptions::new(3, Some(100), &raw).unwrap().lookahead_frames, 4 + 11);
        let energy = RenderOptions { vad: Vad::Energy, ..RenderOptions::default() };
        assert_eq!(LiveOptions::new(3, Some(100), &energy).unwrap().lookahead_frames, 4 + 7);
        // Digital silence decides a frame from its own samples: the ramp is the lookahead, and
        // it covers whisper's window (0.12 s, 3 frames); without a ramp, whisper's reach is.
        let digital = RenderOptions { vad: Vad::Digital, ..RenderOptions::default() };
        assert_eq!(LiveOptions::new(3, Some(100), &digital).unwrap().lookahead_frames, 4);
        let no_ramp = RenderOptions { ramp: 0, ..digital.clone() };
        assert_eq!(LiveOptions::new(3, Some(100), &no_ramp).unwrap().lookahead_frames, 3);
        let one = RenderOptions { ramp: 1, ..opts.clone() };
        assert_eq!(LiveOptions::new(3, Some(100), &one).unwrap().lookahead_frames, 1 + 12);
        assert_eq!(LiveOptions::new(3, Some(1), &opts).unwrap().part_frames, 3);
        assert!(LiveOptions::new(0, None, &opts).is_err());
    }
}
