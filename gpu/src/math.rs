//! Scalar functions the kernels need and NVPTX cannot lower from LLVM intrinsics (`llvm.sin`,
//! acos and atan have no PTX instruction and there is no libdevice here): written once, used
//! by the device and the CPU paths alike.
//!
//! Error bounds, measured against f64 `std` by the tests in this crate (`tests/math.rs`,
//! dense sweeps plus random samples) and asserted there:
//! - [`sin_0_pi`] on [-pi, pi]: absolute error <= 1.2e-7 (the f32 spacing of values near 1 is 6e-8)
//!   and relative error <= 2 ulp wherever |sin x| >= 1e-30.
//! - [`atan2_nonneg`] on y, x >= 0: absolute error <= 2.4e-7 rad (about 2 ulp at pi/2),
//!   relative error <= 3 ulp.
//!
//! Both are cephes-style minimax polynomials (Moshier's `sinf`, `cosf`, `atanf` coefficients)
//! after exact Cody-Waite reductions; the polynomial evaluation uses fused multiply-adds.

// The constants are written as published (more digits than an f32 holds); the compiler rounds
// them to the nearest f32, which is the value the error bounds above were measured with.
#![allow(clippy::excessive_precision)]

use crate::prim::fma;

/// pi split as a float plus its residual so that `PI_HI - x` (exact by Sterbenz's lemma for
/// x in [pi/2, pi]) followed by `+ PI_LO` keeps full accuracy near pi.
pub const PI_HI: f32 = 3.141_592_741_012_573_2;
pub const PI_LO: f32 = -8.742_278e-8;
pub const PIO2_HI: f32 = 1.570_796_370_506_286_6;
pub const PIO2_LO: f32 = -4.371_139e-8;
pub const PIO4_HI: f32 = 0.785_398_185_253_143_3;
pub const PIO4_LO: f32 = -2.185_569_5e-8;
const TAN_PI_8: f32 = 0.414_213_562_373_095;

#[inline(always)]
fn sin_poly(x: f32) -> f32 {
    let z = x * x;
    let p = fma(fma(-1.951_529_589_1e-4, z, 8.332_160_873_6e-3), z, -1.666_665_461_1e-1);
    fma(p * z, x, x)
}

#[inline(always)]
fn cos_poly(x: f32) -> f32 {
    let z = x * x;
    let p = fma(fma(2.443_315_711_809_948e-5, z, -1.388_731_625_493_765e-3), z, 4.166_664_568_298_827e-2);
    fma(p * z, z, fma(-0.5, z, 1.0))
}

/// sin(x) for x in [-pi, pi] (the only range the kernels use: alpha * theta with theta <= pi).
/// Outside that range the result is not meaningful. NaN in, NaN out.
#[inline]
pub fn sin_0_pi(x: f32) -> f32 {
    let neg = x < 0.0;
    let ax = if neg { -x } else { x };
    // Reduce to r in [0, pi/2] with sin(r) == sin(ax).
    let r = if ax > PIO2_HI { (PI_HI - ax) + PI_LO } else { ax };
    let s = if r > PIO4_HI { cos_poly((PIO2_HI - r) + PIO2_LO) } else { sin_poly(r) };
    if neg {
        -s
    } else {
        s
    }
}

/// atan(t) for t in [0, 1].
#[inline(always)]
fn atan_unit(t: f32) -> f32 {
    let big = t > TAN_PI_8;
    let u = if big { (t - 1.0) / (t + 1.0) } else { t };
    let z = u * u;
    let p =
        fma(fma(fma(8.053_744_495_38e-2, z, -1.387_768_560_32e-1), z, 1.997_771_064_78e-1), z, -3.333_294_915_39e-1);
    let y = fma(p * z, u, u);
    if big {
        PIO4_HI + (y + PIO4_LO)
    } else {
        y
    }
}

/// atan2(y, x) for y >= 0 and x >= 0, in [0, pi/2]; atan2(0, 0) = 0. NaN in, NaN out.
#[inline]
pub fn atan2_nonneg(y: f32, x: f32) -> f32 {
    if y <= x {
        if x == 0.0 {
            0.0
        } else {
            atan_unit(y / x)
        }
    } else if y > x {
        (PIO2_HI - atan_unit(x / y)) + PIO2_LO
    } else {
        // Unordered: a NaN argument.
        y + x
    }
}

/// Hermite smoothstep h(t) = 3t^2 - 2t^3, with t clamped to [0, 1]: h(0)=0, h(1)=1 and
/// h'(0) = h'(1) = 0, so easing in and out of rest has a continuous slope.
#[inline]
pub fn hermite(t: f32) -> f32 {
    let t = crate::prim::clamp(t, 0.0, 1.0);
    t * t * (3.0 - 2.0 * t)
}

/// Easing weight of a frame at `distance` frames from the nearest speech frame, for a ramp of
/// `ramp` frames: h(1 - distance/ramp). Speech frames (distance 0) get 1; frames `ramp` or
/// more away get exactly 0 (these are the ones whose neural compute is bypassed). With
/// ramp = 4 the frames after speech get 0.84375, 0.5, 0.15625, 0.0; the frames before a
/// speech onset mirror that, so the mouth is already moving when the sound starts.
/// `ramp == 0` means no easing: 1 on speech, 0 elsewhere.
#[inline]
pub fn easing_weight(distance: u32, ramp: u32) -> f32 {
    if distance == 0 {
        1.0
    } else if distance >= ramp {
        0.0
    } else {
        hermite(1.0 - distance as f32 / ramp as f32)
    }
}
