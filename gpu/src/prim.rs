//! Primitive operations with one meaning on host and device: IEEE correctly rounded sqrt and
//! fused multiply-add (`sqrt.rn.f32` / `fma.rn.f32` on the device, `f32::sqrt` / `mul_add` on
//! the host), so shared math gives the same results in both places up to operation order.

#[cfg(target_arch = "nvptx64")]
use crate::shim::{fmaf32, sqrtf32};

#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        sqrtf32(x)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        x.sqrt()
    }
}

/// a * b + c with a single rounding.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        fmaf32(a, b, c)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.mul_add(b, c)
    }
}

#[inline(always)]
pub fn abs(x: f32) -> f32 {
    if x < 0.0 {
        -x
    } else {
        x
    }
}

/// max(x, 0) that keeps NaN (a NaN input must stay visible downstream).
#[inline(always)]
pub fn max0(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

#[inline(always)]
pub fn clamp(x: f32, lo: f32, hi: f32) -> f32 {
    if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}
