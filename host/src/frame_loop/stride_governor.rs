//! A live render's stride chosen part by part from the rates its own parts measure (a session's
//! `stride: "auto"`).
//!
//! A live render must make each part before the wire needs it. How fast a part renders depends
//! on the machine, on what else runs on it (other sessions) and on the stride: a part of `P`
//! frames all in speech evaluates the UNet on `P / k` keyframes (the one it starts on was made
//! by the part before: `frame_loop::run_carrying`) and decodes those keyframes (`image` infill)
//! or all `P + 1` frames it renders (`latent`). The governor keeps, per
//! part, the wall time of one UNet evaluation, of one decoded frame and of the rest of the part
//! per frame (whisper, infill, compositing), smoothed over parts, and projects from them what a
//! part in speech would cost at each stride, as `/calibrate` projects a render from its
//! component rates. The next part runs at the smallest stride whose projection fits
//! [`TARGET_LOAD`] of the part's duration on the wire:
//!
//! - it raises the stride at once when a part's measured compute passed [`RAISE_LOAD`] of its
//!   duration, or when the projection at the current stride no longer fits (the machine slowed:
//!   another session started), before the wire has to repeat a frame;
//! - it lowers the stride only after [`SETTLE_PARTS`] parts at the current one, so that one fast
//!   part does not start an oscillation.
//!
//! Until a part in speech has measured the UNet and the decoder, the stride stays where it
//! starts: the largest allowed (the safe end).
//!
//! Every stride offered divides the part length, so that parts stay whole strides and the
//! session's delay (a function of the part length) does not change with the stride.

use anyhow::{ensure, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A part's projected compute at the chosen stride: at most this share of its duration (the
/// rest absorbs what the projection misses: the encoder's and the wire's threads, jitter).
pub const TARGET_LOAD: f64 = 0.7;
/// A part whose measured compute took more than this share of its duration raises the stride.
pub const RAISE_LOAD: f64 = 0.9;
/// Parts at one stride before the governor lowers it.
pub const SETTLE_PARTS: usize = 2;
/// Weight of the newest part in the smoothed rates.
const NEWEST_WEIGHT: f64 = 0.5;

/// What one part measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PartMeasure {
    /// Frames the part shows (its duration on the wire).
    pub shown_frames: usize,
    /// Frames it rendered (the shown ones and the keyframe that starts the next part).
    pub rendered_frames: usize,
    pub unet_evaluations: usize,
    pub decoded_frames: usize,
    /// Wall time of the UNet stage, of the decoder stage, and of the whole part without the
    /// time its frames waited to be taken by the wire.
    pub unet_ms: f64,
    pub decoder_ms: f64,
    pub compute_ms: f64,
}

/// Smoothed wall times: per UNet evaluation, per decoded frame, per rendered frame for the rest.
#[derive(Clone, Copy, Debug, Default)]
struct Rates {
    unet_ms: Option<f64>,
    decoder_ms: Option<f64>,
    rest_ms: Option<f64>,
    parts_at_stride: usize,
}

fn smooth(old: Option<f64>, new: f64) -> Option<f64> {
    Some(match old {
        Some(o) => o + NEWEST_WEIGHT * (new - o),
        None => new,
    })
}

/// Chooses a live render's stride part by part (see the module documentation). Shared between
/// the render (which reports each part) and whoever reports the session's figures.
#[derive(Debug)]
pub struct StrideGovernor {
    /// Allowed strides, ascending: the divisors of the part length up to the largest allowed.
    strides: Vec<usize>,
    part_frames: usize,
    frame_ms: f64,
    /// Whether only keyframes are decoded (`image` infill).
    keyframes_only: bool,
    current: AtomicUsize,
    changes: AtomicUsize,
    rates: Mutex<Rates>,
}

impl StrideGovernor {
    /// Strides from 1 to `max_stride` that divide `part_frames`, starting at the largest, for
    /// frames of `1000 / fps` ms.
    pub fn new(part_frames: usize, max_stride: usize, fps: f64, keyframes_only: bool) -> Result<Self> {
        ensure!(part_frames > 0 && max_stride > 0, "a part and a stride hold at least one frame");
        ensure!(fps > 0.0 && fps.is_finite(), "the frame rate must be positive (got {fps})");
        let strides: Vec<usize> =
            (1..=max_stride.min(part_frames)).filter(|k| part_frames.is_multiple_of(*k)).collect();
        let start = *strides.last().expect("1 divides every part");
        Ok(StrideGovernor {
            strides,
            part_frames,
            frame_ms: 1e3 / fps,
            keyframes_only,
            current: AtomicUsize::new(start),
            changes: AtomicUsize::new(0),
            rates: Mutex::new(Rates::default()),
        })
    }

    /// The stride of the next part.
    pub fn stride(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// The strides the governor chooses among, ascending.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Frames per part (every allowed stride divides it).
    pub fn part_frames(&self) -> usize {
        self.part_frames
    }

    /// How many times the stride changed.
    pub fn changes(&self) -> usize {
        self.changes.load(Ordering::Relaxed)
    }

    /// Projected wall time of a part in speech at stride `k`, once the rates are known.
    fn projected_ms(&self, r: &Rates, k: usize) -> Option<f64> {
        let rendered = self.part_frames + 1;
        let evaluations = self.part_frames / k;
        let decoded = if self.keyframes_only { evaluations } else { rendered };
        Some(r.unet_ms? * evaluations as f64 + r.decoder_ms? * decoded as f64 + r.rest_ms? * rendered as f64)
    }

    /// Takes what a part measured; returns the stride of the next part.
    pub fn observe(&self, m: &PartMeasure) -> usize {
        let mut r = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        if m.unet_evaluations > 0 {
            r.unet_ms = smooth(r.unet_ms, m.unet_ms / m.unet_evaluations as f64);
        }
        if m.decoded_frames > 0 {
            r.decoder_ms = smooth(r.decoder_ms, m.decoder_ms / m.decoded_frames as f64);
        }
        if m.rendered_frames > 0 {
            let rest = (m.compute_ms - m.unet_ms - m.decoder_ms).max(0.0);
            r.rest_ms = smooth(r.rest_ms, rest / m.rendered_frames as f64);
        }
        r.parts_at_stride += 1;
        let k = self.stride();
        let budget = TARGET_LOAD * self.part_frames as f64 * self.frame_ms;
        // The smallest stride whose projection fits the budget (the largest when none does).
        let fitting = self
            .strides
            .iter()
            .copied()
            .find(|&s| self.projected_ms(&r, s).is_some_and(|p| p <= budget))
            .unwrap_or(*self.strides.last().expect("at least one stride"));
        let overloaded = m.shown_frames > 0 && m.compute_ms > RAISE_LOAD * m.shown_frames as f64 * self.frame_ms;
        let next = if overloaded {
            // Measured too slow: up at least one step, further if the projection says so.
            let up = self.strides.iter().copied().find(|&s| s > k).unwrap_or(k);
            up.max(fitting)
        } else if self.projected_ms(&r, k).is_none() {
            k
        } else if fitting > k || r.parts_at_stride >= SETTLE_PARTS {
            fitting
        } else {
            k
        };
        if next != k {
            r.parts_at_stride = 0;
            self.current.store(next, Ordering::Relaxed);
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part of `p` frames (+1 rendered) in speech at stride `k`, its first key carried, with
    /// UNet `u` ms per evaluation, decoder `d` ms per decoded frame, `rest` ms per frame.
    fn speech_part(g: &StrideGovernor, k: usize, u: f64, d: f64, rest: f64) -> PartMeasure {
        let p = g.part_frames();
        let evaluations = p / k;
        let decoded = if g.keyframes_only { evaluations } else { p + 1 };
        let (unet_ms, decoder_ms) = (u * evaluations as f64, d * decoded as f64);
        PartMeasure {
            shown_frames: p,
            rendered_frames: p + 1,
            unet_evaluations: evaluations,
            decoded_frames: decoded,
            unet_ms,
            decoder_ms,
            compute_ms: unet_ms + decoder_ms + rest * (p + 1) as f64,
        }
    }

    fn silent_part(p: usize, ms: f64) -> PartMeasure {
        PartMeasure { shown_frames: p, rendered_frames: p + 1, compute_ms: ms, ..PartMeasure::default() }
    }

    #[test]
    fn strides_divide_the_part_and_start_at_the_largest() {
        let g = StrideGovernor::new(24, 12, 25.0, true).unwrap();
        assert_eq!(g.strides(), &[1, 2, 3, 4, 6, 8, 12]);
        assert_eq!(g.stride(), 12);
        assert_eq!(StrideGovernor::new(10, 12, 25.0, true).unwrap().strides(), &[1, 2, 5, 10]);
        assert_eq!(StrideGovernor::new(1, 12, 25.0, true).unwrap().stride(), 1);
        assert!(StrideGovernor::new(0, 12, 25.0, true).is_err());
        assert!(StrideGovernor::new(24, 12, f64::NAN, true).is_err());
    }

    #[test]
    fn silence_alone_keeps_the_starting_stride() {
        let g = StrideGovernor::new(24, 12, 25.0, true).unwrap();
        for _ in 0..5 {
            assert_eq!(g.observe(&silent_part(24, 20.0)), 12);
        }
        assert_eq!(g.changes(), 0);
    }

    #[test]
    fn a_fast_machine_settles_at_the_smallest_stride_that_fits() {
        // 24 frames = 960 ms; budget 0.7 x 960 = 672 ms. UNet 40 ms, decoder 10 ms, rest 2 ms
        // per frame (50 ms a part): keyframes only, stride k costs 50 + 50 x 24/k.
        // k = 1: 1250 > 672; k = 2: 650 fits.
        let g = StrideGovernor::new(24, 12, 25.0, true).unwrap();
        let mut k = g.stride();
        for _ in 0..8 {
            k = g.observe(&speech_part(&g, k, 40.0, 10.0, 2.0));
        }
        assert_eq!(k, 2);
        // Settled: it lowered once, straight to the stride that fits.
        assert_eq!(g.changes(), 1);
    }

    #[test]
    fn lowering_waits_for_settled_parts() {
        let g = StrideGovernor::new(24, 12, 25.0, true).unwrap();
        assert_eq!(g.observe(&speech_part(&g, 12, 40.0, 10.0, 2.0)), 12, "one part is not enough to lower");
        assert_eq!(g.observe(&speech_part(&g, 12, 40.0, 10.0, 2.0)), 2);
    }

    #[test]
    fn a_slower_machine_raises_at_once() {
        let g = StrideGovernor::new(24, 12, 25.0, true).unwrap();
        let mut k = g.stride();
        for _ in 0..4 {
            k = g.observe(&speech_part(&g, k, 40.0, 10.0, 2.0));
        }
        assert_eq!(k, 2);
        // Another session arrives: everything takes three times as long. The part at stride 2
        // took 1950 ms of 960: raised on that part, past the next stride (3) to where the
        // smoothed rates (twice the old) fit: 100 + 100 x 24/k <= 672 at k = 6.
        assert_eq!(g.observe(&speech_part(&g, 2, 120.0, 30.0, 6.0)), 6);
        // With the new rates smoothed in, it ends where the slower machine fits:
        // 150 + 150 x 24/k <= 672 needs 24/k <= 3.48: k = 8.
        let mut k = 6;
        for _ in 0..6 {
            k = g.observe(&speech_part(&g, k, 120.0, 30.0, 6.0));
        }
        assert_eq!(k, 8);
    }

    #[test]
    fn a_projection_over_budget_raises_without_waiting() {
        let g = StrideGovernor::new(24, 12, 25.0, true).unwrap();
        let mut k = g.stride();
        for _ in 0..2 {
            k = g.observe(&speech_part(&g, k, 40.0, 10.0, 2.0));
        }
        assert_eq!(k, 2);
        // The first part at 2 is 1.2 times slower: it took 780 ms, under the 864 ms that counts
        // as overloaded, but the smoothed rates (1.1 times) project 715 ms at stride 2, over the
        // 672 ms budget: the next part is at 3 (495 ms), without settled parts.
        assert_eq!(g.observe(&speech_part(&g, 2, 40.0 * 1.2, 10.0 * 1.2, 2.0 * 1.2)), 3);
    }

    #[test]
    fn latent_infill_counts_every_frame_decoded() {
        // Latent infill decodes all 25 frames: 25 x 20 ms = 500 ms at every stride, so only the
        // UNet's 40 ms x 24/k is left to fit in 672 - 500 = 172: k = 6 (160), not 4 (240).
        let g = StrideGovernor::new(24, 12, 25.0, false).unwrap();
        let mut k = g.stride();
        for _ in 0..6 {
            k = g.observe(&speech_part(&g, k, 40.0, 20.0, 0.0));
        }
        assert_eq!(k, 6);
    }

    #[test]
    fn a_machine_too_slow_for_any_stride_stays_at_the_largest() {
        let g = StrideGovernor::new(24, 12, 25.0, true).unwrap();
        for _ in 0..4 {
            assert_eq!(g.observe(&speech_part(&g, 12, 500.0, 100.0, 10.0)), 12);
        }
        assert_eq!(g.changes(), 0);
    }
}
