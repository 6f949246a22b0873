//! Pasting the decoded face crop back into the full frame: the coordinate map of the bilinear
//! resize and the feathered blend mask, shared by the compositing paths.

use crate::math::hermite;

/// Position in the crop (in crop pixels, centres at integers) of output pixel `p` of a box
/// `box_len` pixels long that shows a crop `crop_len` pixels long (pixel centres aligned).
#[inline(always)]
pub fn crop_coord(p: u32, box_len: u32, crop_len: u32) -> f32 {
    (p as f32 + 0.5) * (crop_len as f32 / box_len as f32) - 0.5
}

#[inline(always)]
fn min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// Blend weight of the face at pixel (px, py) of a w x h box: 1 inside, easing to 0 over
/// `feather` pixels toward every edge with the Hermite smoothstep (no visible seam, and
/// exactly the background at the border). `feather == 0` gives a hard edge.
#[inline(always)]
pub fn feather_alpha(px: u32, py: u32, w: u32, h: u32, feather: f32) -> f32 {
    if feather <= 0.0 {
        return 1.0;
    }
    let dx = min(px as f32 + 0.5, w as f32 - px as f32 - 0.5);
    let dy = min(py as f32 + 0.5, h as f32 - py as f32 - 0.5);
    hermite(min(dx, dy) / feather)
}

/// The two source indices of one output position's bilinear taps and the weight of the second.
pub struct Tap {
    pub i0: u32,
    pub i1: u32,
    pub f: f32,
}

/// Bilinear taps of output pixel `p` of a box `box_len` long showing a crop `crop_len` long
/// (clamped to the crop: the border pixels repeat).
#[inline(always)]
pub fn tap(p: u32, box_len: u32, crop_len: u32) -> Tap {
    let c = crate::prim::clamp(crop_coord(p, box_len, crop_len), 0.0, (crop_len - 1) as f32);
    // c >= 0, so truncation is the floor.
    let i0 = c as u32;
    let i1 = if i0 + 1 < crop_len { i0 + 1 } else { crop_len - 1 };
    Tap { i0, i1, f: c - i0 as f32 }
}

/// One output sample: the bilinear interpolation of the four crop samples (8-bit scale;
/// `pXY` = column X, row Y of the taps) weighted by the face's `alpha`, plus `background_term`
/// = (1 - alpha) x background, which is the same every frame and precomputed.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn blend_bilinear(
    p00: f32,
    p10: f32,
    p01: f32,
    p11: f32,
    tx: &Tap,
    ty: &Tap,
    alpha: f32,
    background_term: f32,
) -> f32 {
    blend_vertical(lerp_tap(p00, p10, tx.f), lerp_tap(p01, p11, tx.f), ty.f, alpha, background_term)
}

/// The horizontal half of [`blend_bilinear`]: one crop row sampled between two columns.
#[inline(always)]
pub fn lerp_tap(p0: f32, p1: f32, f: f32) -> f32 {
    p0 + f * (p1 - p0)
}

/// The vertical half of [`blend_bilinear`] and the blend: `top` and `bot` are [`lerp_tap`] of
/// the two crop rows. Separable CPU code calls the halves directly and gets the same bits.
#[inline(always)]
pub fn blend_vertical(top: f32, bot: f32, fy: f32, alpha: f32, background_term: f32) -> f32 {
    alpha * (top + fy * (bot - top)) + background_term
}
