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
