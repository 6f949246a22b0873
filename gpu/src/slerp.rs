//! Geodesic interpolation of two frames v0, v1 (flattened to D-vectors) as two scalar
//! coefficients: out = c0 * v0 + c1 * v1. The kernels make one reduction pass over a pair to
//! get four sums (`PairSums`), turn them into the pair's geometry once ([`PairGeometry`]), and
//! then write any number of in-between frames with one multiply-add per element, so an
//! interval of k frames costs one read of its two keyframes, not k.
//!
//! Behaviour where the formula breaks (docs/design.md, the kernels' mathematics):
//! - a zero vector (either side): no direction, so plain LERP of the raw vectors; its norm is
//!   still exactly the interpolated norm (1-a)|v0| + a|v1|.
//! - identical directions (sin theta < [`SIN_EPS`], cos > 0): LERP weights on the unit vectors,
//!   renormalized: the limit of SLERP, with the norm of the interpolated magnitude.
//! - antipodal directions (sin theta < [`SIN_EPS`], cos < 0): the great circle is not unique;
//!   plain LERP of the raw vectors, which passes through zero at the crossing. Documented,
//!   tested, and reported by [`PairGeometry::kind`].
//! - NaN anywhere in a frame propagates to the whole interpolated frame (the keyframes
//!   themselves are copied exactly). The CLI and pipeline reject NaN input up front.
//! - alpha = 0 and alpha = 1 return the keyframes exactly (c = (1, 0) and (0, 1)).
//!
//! Accuracy (f32 arithmetic, tests in host/tests/kernels.rs against f64): relative error of the
//! frame and of its norm below 2e-5 and 1e-5 for well-separated pairs; near antipodal pairs the
//! coefficients grow as 1/sin(theta) and partly cancel, so the error grows by that factor. The
//! chords' sums lose digits when the norms differ by a large factor r = max/min: the squared
//! chords come from |v0 -+ v1|^2 - (|v0| - |v1|)^2, whose terms are about |v_max|^2 while the
//! result is about |v0||v1|, so the error grows by about r (3.7e-5 at r = 551, measured by the
//! property test). Keyframe latents of one clip differ in norm by small factors.

use crate::math::{atan2_nonneg, sin_0_pi};
use crate::prim::{max0, sqrt};

/// Below this sin(theta) the pair counts as collinear (theta < 1e-6 rad or within 1e-6 of pi).
pub const SIN_EPS: f32 = 1e-6;

pub const METHOD_SLERP: u32 = 0;
pub const METHOD_LERP: u32 = 1;

/// The four sums one pass over a pair accumulates.
pub struct PairSums {
    /// |v0|^2
    pub s00: f32,
    /// |v1|^2
    pub s11: f32,
    /// |v0 - v1|^2
    pub sdiff: f32,
    /// |v0 + v1|^2
    pub ssum: f32,
}

impl PairSums {
    pub const ZERO: PairSums = PairSums { s00: 0.0, s11: 0.0, sdiff: 0.0, ssum: 0.0 };

    #[inline(always)]
    pub fn add(&mut self, a: f32, b: f32) {
        let d = a - b;
        let s = a + b;
        self.s00 = crate::prim::fma(a, a, self.s00);
        self.s11 = crate::prim::fma(b, b, self.s11);
        self.sdiff = crate::prim::fma(d, d, self.sdiff);
        self.ssum = crate::prim::fma(s, s, self.ssum);
    }

    #[inline(always)]
    pub fn merge(&mut self, o: &PairSums) {
        self.s00 += o.s00;
        self.s11 += o.s11;
        self.sdiff += o.sdiff;
        self.ssum += o.ssum;
    }
}

pub const KIND_GENERAL: u32 = 0;
pub const KIND_ZERO: u32 = 1;
pub const KIND_IDENTICAL: u32 = 2;
pub const KIND_ANTIPODAL: u32 = 3;

/// Norms and angle of a pair, computed once per interval.
pub struct PairGeometry {
    pub n0: f32,
    pub n1: f32,
    /// Angle between the directions, in [0, pi].
    pub theta: f32,
    pub sin_theta: f32,
    pub cos_theta: f32,
    /// One of the `KIND_*` constants.
    pub kind: u32,
}

impl PairGeometry {
    /// The angle comes from the chords of the unit vectors rather than from acos of the
    /// normalized dot product, which loses half the digits near 0 and pi:
    /// |v0 -+ v1|^2 - (|v0| - |v1|)^2 = |v0||v1| |u0 -+ u1|^2, so
    /// theta = 2 atan2(|u0 - u1|, |u0 + u1|), with the common factor cancelling.
    #[inline]
    pub fn from_sums(s: &PairSums) -> PairGeometry {
        let n0 = sqrt(s.s00);
        let n1 = sqrt(s.s11);
        let dn = n0 - n1;
        let dn2 = dn * dn;
        let a2 = max0(s.sdiff - dn2);
        let b2 = max0(s.ssum - dn2);
        let a = sqrt(a2);
        let b = sqrt(b2);
        let theta = 2.0 * atan2_nonneg(a, b);
        let r2 = a2 + b2;
        let sin_theta = 2.0 * a * b / r2;
        let cos_theta = (b2 - a2) / r2;
        let kind = if n0 == 0.0 || n1 == 0.0 {
            KIND_ZERO
        } else if sin_theta < SIN_EPS {
            if cos_theta > 0.0 {
                KIND_IDENTICAL
            } else {
                KIND_ANTIPODAL
            }
        } else {
            KIND_GENERAL
        };
        PairGeometry { n0, n1, theta, sin_theta, cos_theta, kind }
    }

    /// Coefficients (c0, c1) of the SLERP frame at `alpha`: out = c0 v0 + c1 v1, a vector on
    /// the great circle from v0 to v1 at angle alpha * theta whose norm is (1-a)|v0| + a|v1|.
    #[inline]
    pub fn slerp_coeffs(&self, alpha: f32) -> (f32, f32) {
        if alpha == 0.0 {
            return (1.0, 0.0);
        }
        if alpha == 1.0 {
            return (0.0, 1.0);
        }
        let beta = 1.0 - alpha;
        if self.kind == KIND_ZERO || self.kind == KIND_ANTIPODAL {
            return (beta, alpha);
        }
        let (w0, w1) = if self.kind == KIND_IDENTICAL {
            (beta, alpha)
        } else {
            (sin_0_pi(beta * self.theta) / self.sin_theta, sin_0_pi(alpha * self.theta) / self.sin_theta)
        };
        // |w0 u0 + w1 u1| (1 in exact arithmetic; dividing by it is the norm re-projection),
        // written as |(w0 + w1 cos, w1 sin)| in the plane of u0 and u1: a sum of squares, so
        // it cannot cancel to zero or below near antipodal pairs as w0^2 + w1^2 + 2 w0 w1 cos can.
        let x = w0 + w1 * self.cos_theta;
        let y = w1 * self.sin_theta;
        let r = sqrt(x * x + y * y);
        let target = beta * self.n0 + alpha * self.n1;
        let scale = target / r;
        (scale * w0 / self.n0, scale * w1 / self.n1)
    }

    #[inline]
    pub fn coeffs(&self, method: u32, alpha: f32) -> (f32, f32) {
        if method == METHOD_LERP {
            lerp_coeffs(alpha)
        } else {
            self.slerp_coeffs(alpha)
        }
    }
}

/// Plain linear interpolation, the ablation baseline.
#[inline]
pub fn lerp_coeffs(alpha: f32) -> (f32, f32) {
    (1.0 - alpha, alpha)
}

/// Position of frame `frame` inside the interval [k0, k1] of keyframe indices: 0 at k0, 1 at k1.
#[inline]
pub fn interval_alpha(frame: u32, k0: u32, k1: u32) -> f32 {
    if frame <= k0 {
        0.0
    } else if frame >= k1 {
        1.0
    } else {
        (frame - k0) as f32 / (k1 - k0) as f32
    }
}

/// The frames `[first, end)` that keyframe interval `j` writes (keyframes `j` and `j + 1` of
/// `n_keys >= 2`, at frames `k0 < k1`, in a video of `n_frames`): from its first keyframe up to,
/// not including, the next one. The first interval also writes the frames before keyframe 0 (they
/// hold it: alpha 0), the last one the frames from its second keyframe to the end (they hold the
/// last keyframe: alpha 1). So every frame has exactly one writer: the device kernel (one warp
/// per interval), the CPU path (one task per interval) and the schedule's per-frame positions all
/// split the video with this function.
#[inline(always)]
pub fn interval_frames(j: u32, n_keys: u32, k0: u32, k1: u32, n_frames: u32) -> (u32, u32) {
    let first = if j == 0 { 0 } else { k0 };
    let end = if j + 2 == n_keys { n_frames } else { k1 };
    (first, end)
}
