//! The audio features a render reads: one (window, dim) block per video frame, asked for a
//! UNet batch at a time, in frame order. A whole-clip [`Batch`] is one source; a source that
//! encodes the audio as the render reaches it keeps only what the next frames need.

use anyhow::{ensure, Result};
use cadence_engines::Batch;

/// Per-frame audio features, read in increasing frame order.
pub trait FrameFeatures: Sync {
    /// Video frames covered.
    fn frames(&self) -> usize;
    /// (window, dim) of one frame's features.
    fn frame_shape(&self) -> (usize, usize);
    /// Appends the features of `frames` (each below [`Self::frames`]), in that order, to `out`.
    fn gather(&self, frames: &[usize], out: &mut Vec<f32>) -> Result<()>;
}

/// The audio encoder's output for the whole clip: (frames, window, dim).
impl FrameFeatures for Batch {
    fn frames(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    fn frame_shape(&self) -> (usize, usize) {
        (self.shape.get(1).copied().unwrap_or(0), self.shape.get(2).copied().unwrap_or(0))
    }

    fn gather(&self, frames: &[usize], out: &mut Vec<f32>) -> Result<()> {
        ensure!(self.shape.len() == 3, "audio features must be (frames, window, dim), got {:?}", self.shape);
        let per = self.shape[1] * self.shape[2];
        for &f in frames {
            ensure!(f < self.frames(), "frame {f} is outside the audio features ({} frames)", self.frames());
            out.extend_from_slice(&self.data[f * per..(f + 1) * per]);
        }
        Ok(())
    }
}

/// Whisper's windows of a clip, encoded a 30 s window at a time as the render reaches them.
impl FrameFeatures for cadence_engines::WhisperClip<'_> {
    fn frames(&self) -> usize {
        cadence_engines::WhisperClip::frames(self)
    }

    fn frame_shape(&self) -> (usize, usize) {
        cadence_engines::WhisperClip::frame_shape(self)
    }

    fn gather(&self, frames: &[usize], out: &mut Vec<f32>) -> Result<()> {
        Ok(self.frame_windows(frames, out)?)
    }
}
