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

/// `x` truncated to a byte, for `x` already finite and in [0, 255] (callers clamp first). On the
/// host without the saturating cast's checks, which would keep the loops around it scalar; on the
/// device the plain cast (one `cvt.rzi` either way).
#[inline(always)]
pub fn trunc_byte(x: f32) -> u8 {
    #[cfg(target_arch = "nvptx64")]
    {
        x as u8
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        debug_assert!((0.0..=255.0).contains(&x), "trunc_byte({x}) outside [0, 255]");
        // SAFETY: x is finite and in [0, 255] (the callers' clamp), so it fits an i32.
        unsafe { x.to_int_unchecked::<i32>() as u8 }
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
