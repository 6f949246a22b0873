//! Keyframe schedules: which frames the neural engine evaluates. A schedule is a value (the
//! sorted keyframe list over N frames), whatever produced it: a fixed stride, an explicit or
//! adaptive list.

use anyhow::{bail, ensure, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyframeSchedule {
    n_frames: usize,
    keys: Vec<u32>,
}

impl KeyframeSchedule {
    /// Frames 0, k, 2k, ... and, when N-1 is not among them, N-1 as a last keyframe so the tail
    /// is interpolated rather than held (the source document's rule). The count is the true one:
    /// at N = 640 that is 640, 321, 214 keyframes for k = 1, 2, 3 (not 320 at k = 2 as the
    /// source's table prints).
    pub fn fixed_stride(n_frames: usize, stride: usize) -> Result<Self> {
        let count = Self::fixed_stride_count(n_frames, stride)?;
        let mut keys: Vec<u32> = (0..n_frames).step_by(stride).map(|f| f as u32).collect();
        if *keys.last().unwrap() as usize != n_frames - 1 {
            keys.push((n_frames - 1) as u32);
        }
        debug_assert_eq!(keys.len(), count);
        Ok(Self { n_frames, keys })
    }

    /// The number of keyframes [`Self::fixed_stride`] makes, computed without making them (so a
    /// caller can check an input against it before allocating anything).
    pub fn fixed_stride_count(n_frames: usize, stride: usize) -> Result<usize> {
        ensure!(stride > 0, "stride must be at least 1 (got 0)");
        ensure!(n_frames > 0, "the video has no frames");
        ensure!(n_frames <= u32::MAX as usize, "too many frames ({n_frames}; at most {})", u32::MAX);
        let last = n_frames - 1;
        Ok(last / stride + 1 + usize::from(!last.is_multiple_of(stride)))
    }

    /// Any strictly increasing list of frame indices below N. Frames before the first keyframe
    /// hold it, frames after the last hold the last.
    pub fn explicit(n_frames: usize, keys: &[usize]) -> Result<Self> {
        ensure!(n_frames > 0, "the video has no frames");
        ensure!(!keys.is_empty(), "the keyframe list is empty");
        for w in keys.windows(2) {
            if w[1] <= w[0] {
                bail!("keyframes must be strictly increasing: {} is followed by {}", w[0], w[1]);
            }
        }
        let last = *keys.last().unwrap();
        ensure!(last < n_frames, "keyframe {last} is outside the video (frames 0..{})", n_frames - 1);
        Ok(Self { n_frames, keys: keys.iter().map(|&k| k as u32).collect() })
    }

    /// Parses "0,3,6,9" (spaces allowed).
    pub fn parse_list(n_frames: usize, list: &str) -> Result<Self> {
        let keys = list
            .split(',')
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<usize>().map_err(|_| anyhow::anyhow!("keyframe list: '{s}' is not a frame index")))
            .collect::<Result<Vec<_>>>()?;
        Self::explicit(n_frames, &keys)
    }

    pub fn n_frames(&self) -> usize {
        self.n_frames
    }
    pub fn keyframes(&self) -> &[u32] {
        &self.keys
    }
    pub fn count(&self) -> usize {
        self.keys.len()
    }
    /// Fraction of frames the neural engine evaluates.
    pub fn duty_cycle(&self) -> f64 {
        self.keys.len() as f64 / self.n_frames as f64
    }
    /// Number of keyframe pairs (intervals); 0 with a single keyframe.
    pub fn n_intervals(&self) -> usize {
        self.keys.len() - 1
    }

    /// For each frame, the interval that writes it and its alpha inside that interval, by the
    /// kernels' ownership rule ([`cadence_kernels::slerp::interval_frames`]).
    pub fn frame_positions(&self) -> Vec<(usize, f32)> {
        use cadence_kernels::slerp::{interval_alpha, interval_frames};
        let mut out = Vec::with_capacity(self.n_frames);
        let m = self.keys.len();
        if m == 1 {
            out.resize(self.n_frames, (0, 0.0));
            return out;
        }
        for j in 0..m - 1 {
            let (k0, k1) = (self.keys[j], self.keys[j + 1]);
            let (first, end) = interval_frames(j as u32, m as u32, k0, k1, self.n_frames as u32);
            out.extend((first..end).map(|f| (j, interval_alpha(f, k0, k1))));
        }
        out
    }
}

/// Distance in frames from each frame to the nearest speech frame (u32::MAX when there is none):
/// the input of the silence easing, whose weight is h(1 - distance/ramp).
pub fn speech_distance(speech: &[bool]) -> Vec<u32> {
    let n = speech.len();
    let mut d = vec![u32::MAX; n];
    let mut last: Option<usize> = None;
    for i in 0..n {
        if speech[i] {
            last = Some(i);
        }
        if let Some(l) = last {
            d[i] = (i - l) as u32;
        }
    }
    last = None;
    for i in (0..n).rev() {
        if speech[i] {
            last = Some(i);
        }
        if let Some(l) = last {
            d[i] = d[i].min((l - i) as u32);
        }
    }
    d
}

/// Which frames the pipeline bypasses (every network skipped, the decoded rest frame reused): the
/// frames whose silence-easing weight h(1 - distance/ramp) is exactly 0, i.e. `ramp` or more
/// frames from the nearest speech frame. `distance` as [`speech_distance`] returns it.
pub fn bypassed_frames(distance: &[u32], ramp: u32) -> Vec<bool> {
    distance.iter().map(|&d| cadence_kernels::math::easing_weight(d, ramp) == 0.0).collect()
}

/// The schedule of a render without an adaptive `--schedule`: the keyframe list when one is
/// given, else every `stride`-th frame; with its label for the summary (`keyframes`, `stride 3`).
pub fn fixed_schedule(frames: usize, keyframes: Option<&str>, stride: usize) -> Result<(KeyframeSchedule, String)> {
    Ok(match keyframes {
        Some(list) => (KeyframeSchedule::parse_list(frames, list)?, "keyframes".to_string()),
        None => (KeyframeSchedule::fixed_stride(frames, stride)?, format!("stride {stride}")),
    })
}
