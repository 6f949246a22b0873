//! Digital silence: a frame is silence when every 16 kHz sample of it is exactly zero, and
//! speech otherwise.
//!
//! For audio whose pauses are written rather than recorded: a live session's timeline writes
//! zeros wherever nothing was queued, a speech synthesizer writes zeros between phrases. Such
//! audio needs no detector: each frame is decided from its own samples as soon as they have
//! arrived, with no lookahead, no hangover and no padding. A recorded pause (room noise,
//! dither) is speech to it: Silero or the energy detector decide those.
//!
//! Frame `f` at `fps` holds samples `floor(f x 16000 / fps) .. floor((f + 1) x 16000 / fps)`,
//! the frames of the other detectors. Only runs of zeros at least [`MIN_RUN`] samples long are
//! kept: no frame at a rate up to 1000 fps is shorter, so no frame lies inside a shorter run.

use std::ops::Range;

/// The shortest run of zeros kept: 1 ms at 16 kHz, the shortest frame at 1000 fps.
pub const MIN_RUN: usize = 16;

/// The runs of zero samples of a 16 kHz signal read in pieces.
#[derive(Clone, Debug, Default)]
pub struct ZeroRuns {
    /// Runs that have ended (in order, disjoint, each at least [`MIN_RUN`] long).
    runs: Vec<Range<usize>>,
    /// Where the run of zeros the signal read so far ends in started, if it ends in zeros.
    open: Option<usize>,
    /// Samples read.
    samples: usize,
}

impl ZeroRuns {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the samples that follow those read so far.
    pub fn push(&mut self, fresh: &[f32]) {
        for (i, &v) in fresh.iter().enumerate() {
            let s = self.samples + i;
            if v == 0.0 {
                self.open.get_or_insert(s);
            } else if let Some(a) = self.open.take() {
                if s - a >= MIN_RUN {
                    self.runs.push(a..s);
                }
            }
        }
        self.samples += fresh.len();
    }

    /// Samples read so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Whether samples `r` are all zero; of a range that reaches past what has been read, the
    /// part read (a frame with no sample read is silence).
    fn silent(&self, r: Range<usize>) -> bool {
        let end = r.end.min(self.samples);
        if r.start >= end {
            return true;
        }
        if self.open.is_some_and(|a| a <= r.start) {
            return true;
        }
        // The last run that starts at or before the range.
        let i = self.runs.partition_point(|run| run.start <= r.start);
        i > 0 && self.runs[i - 1].end >= end
    }

    /// Speech decisions of frames `a..end` at `fps` frames per second, from what has been read.
    pub fn speech(&self, a: usize, end: usize, fps: f64) -> Vec<bool> {
        (a..end).map(|f| !self.silent(frame_start(f, fps)..frame_start(f + 1, fps))).collect()
    }

    /// Forgets the runs that end before `sample` (the decisions of frames from there on stay).
    pub fn forget_before(&mut self, sample: usize) {
        let n = self.runs.partition_point(|run| run.end < sample);
        self.runs.drain(..n);
    }
}

/// The 16 kHz sample frame `f` starts at, floor(f x 16000 / fps). The tolerance keeps a frame
/// that starts on a whole sample there when `fps` is a rounded fraction (30000/1001).
fn frame_start(f: usize, fps: f64) -> usize {
    (f as f64 * crate::TARGET_RATE as f64 / fps + 1e-6).floor() as usize
}

/// Digital-silence decisions of `frames` video frames at `fps` over a whole 16 kHz clip.
pub fn voice_activity(samples_16k: &[f32], fps: f64, frames: usize) -> Vec<bool> {
    let mut runs = ZeroRuns::new();
    runs.push(samples_16k);
    runs.speech(0, frames, fps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clip of zeros with non-zero samples at `at`.
    fn clip(len: usize, at: &[usize]) -> Vec<f32> {
        let mut x = vec![0.0; len];
        for &i in at {
            x[i] = 1e-4;
        }
        x
    }

    #[test]
    fn one_nonzero_sample_makes_its_frame_speech_and_no_other() {
        // 25 fps: 640 samples a frame. Sample 639 is frame 0's last, 640 frame 1's first.
        assert_eq!(voice_activity(&clip(3200, &[639]), 25.0, 5), [true, false, false, false, false]);
        assert_eq!(voice_activity(&clip(3200, &[640]), 25.0, 5), [false, true, false, false, false]);
        assert_eq!(voice_activity(&clip(3200, &[0, 3199]), 25.0, 5), [true, false, false, false, true]);
        assert_eq!(voice_activity(&clip(3200, &[]), 25.0, 5), [false; 5]);
        // NaN is not zero: speech (the renders refuse non-finite audio before this).
        let mut x = clip(3200, &[]);
        x[1500] = f32::NAN;
        assert_eq!(voice_activity(&x, 25.0, 5), [false, false, true, false, false]);
        // -0.0 is zero.
        x[1500] = -0.0;
        assert_eq!(voice_activity(&x, 25.0, 5), [false; 5]);
    }

    #[test]
    fn ntsc_frames_start_on_their_samples() {
        // At 30000/1001 fps, frame 15 starts exactly on sample 8008 (15 x 16000 x 1001 / 30000).
        let fps = 30000.0 / 1001.0;
        let v = voice_activity(&clip(16_000, &[8008]), fps, 20);
        assert_eq!(v.iter().position(|&s| s), Some(15));
        let v = voice_activity(&clip(16_000, &[8007]), fps, 20);
        assert_eq!(v.iter().position(|&s| s), Some(14));
    }

    #[test]
    fn pieces_decide_as_the_whole_clip_and_forgetting_keeps_later_frames() {
        // Speech-like bursts between runs of zeros, some shorter than a frame.
        let mut x = vec![0.0f32; 40_000];
        let mut seed = 7u64;
        for burst in 0..30 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let start = (seed >> 33) as usize % 39_000;
            let len = 1 + burst * 37 % 900;
            for (k, v) in x[start..(start + len).min(40_000)].iter_mut().enumerate() {
                *v = if k % 5 == 0 { 0.0 } else { 0.01 };
            }
        }
        let frames = 62;
        let whole = voice_activity(&x, 25.0, frames);
        assert!(whole.iter().any(|&s| s) && whole.iter().any(|&s| !s), "{whole:?}");
        let mut runs = ZeroRuns::new();
        let mut at = 0;
        for piece in [1, 15, 16, 17, 639, 640, 641, 3000, 12_345] {
            runs.push(&x[at..at + piece]);
            at += piece;
            // Every frame read whole is decided as the whole clip decides it.
            let done = runs.samples() / 640;
            assert_eq!(runs.speech(0, done, 25.0), whole[..done], "after {at} samples");
        }
        runs.push(&x[at..]);
        runs.forget_before(20 * 640);
        assert_eq!(runs.speech(20, frames, 25.0), whole[20..]);
    }
}
