//! Trilinear sampling of a 3-D feature volume at normalised grid coordinates: PyTorch's
//! `F.grid_sample(input, grid, mode='bilinear', padding_mode='zeros', align_corners=False)` for
//! 5-D input (N, C, D, H, W) and grid (N, Do, Ho, Wo, 3), whose last axis is (x, y, z) in
//! [-1, 1] indexing (W, H, D). Ditto's WarpingNetwork (LivePortrait's) warps its appearance
//! volume with it; TensorRT 8.6 has no such layer, so Ditto ships a plugin. The functions here
//! are the per-voxel geometry: the kernel (`grid_sample_3d_f32`), the host's CPU path and the
//! engines' CPU warping network (`cadence_engines::ditto::warp`, channels-last) all call them.
//!
//! Numerics, following PyTorch's CUDA kernel (`aten/src/ATen/native/cuda/GridSampler.cu{,h}`)
//! operation for operation, so the f32 result rounds as PyTorch's does:
//! - **Unnormalisation** for align_corners=False: `u = ((x + 1) * W - 1) / 2` (the `/ 2` is exact).
//!   The grid's -1 and +1 are the *outer edges* of the first and last voxels, not their centres:
//!   [-1, 1] is split into W cells of width 2/W and voxel i's centre is x = (2i + 1)/W - 1, which
//!   maps to u = i. So x = -1 is u = -0.5, half a voxel before the first centre, and sampling
//!   there blends voxel 0 half-and-half with the zero padding: the edge value is `v[0] / 2` (per
//!   axis). (align_corners=True would map ±1 to the corner centres, u = (x + 1)(W - 1) / 2.)
//! - **Corners**: i0 = floor(u), i1 = i0 + 1, weights w0 = (i0 + 1) - u and w1 = u - i0 (both
//!   from u as PyTorch writes them, so w0 + w1 may differ from 1 by a rounding); a corner's weight
//!   is wx * wy * wz in that order, and the eight products are summed in PyTorch's order (tnw,
//!   tne, tsw, tse, bnw, bne, bsw, bse: x varies fastest, then y, then z).
//! - **Zero padding**: a corner outside the volume is skipped (it contributes 0, not 0 * v, so an
//!   infinite value just outside cannot turn into NaN). A corner inside with weight 0 is still
//!   added, as PyTorch does (an infinite value there gives NaN in both). The sample is continuous
//!   in u everywhere, also across the volume's edges, so the f32 rounding of u moves the result
//!   by about |dw| x |v|, never by a jump.
//! - **Out of range, infinite and NaN coordinates**: PyTorch replaces a coordinate that is NaN, ±inf
//!   or beyond the int range by -100 before flooring (`safe_downgrade_to_int_range`, to avoid the
//!   undefined float-to-int conversion, pytorch#35506), so with zeros padding every corner is
//!   outside and the sample is exactly 0. Here an axis with u outside [-1, size) has no corner
//!   inside (for u < -1 both corners are below 0, for u >= size both are at or beyond `size`),
//!   and NaN fails that test too: the sample is +0.0 for every channel, as in PyTorch, and u is
//!   never converted to an integer unless -1 <= u < size, where the conversion is exact.
//! - **Sizes**: every axis at most [`MAX_AXIS`] = 2^24, so `size as f32` and the corner indices are
//!   exact in f32 and i32; D*H*W at most u32::MAX, so a corner's index in the volume is a u32.
//!   The host checks both (and the launch's own limits) before any launch.

/// The largest size of one axis: below 2^24, integers (the voxel indices, the size) are exact f32.
pub const MAX_AXIS: u32 = 16_777_216;

/// The unnormalised coordinate of `x` (in [-1, 1] for the volume's extent) along an axis of `size`
/// voxels, align_corners=False: voxel i's centre is at u = i, x = ±1 at u = -0.5 and size - 0.5.
#[inline(always)]
pub fn unnormalize(x: f32, size: u32) -> f32 {
    ((x + 1.0) * size as f32 - 1.0) / 2.0
}

/// The two taps of one axis: corner indices `i0` and `i0 + 1`, whether each lies inside the
/// volume, and their weights.
pub struct AxisTaps {
    /// floor(u); only meaningful when one of the corners is inside.
    pub i0: i32,
    pub in0: bool,
    pub in1: bool,
    /// Weight of corner i0: (i0 + 1) - u.
    pub w0: f32,
    /// Weight of corner i0 + 1: u - i0.
    pub w1: f32,
}

/// No corner inside: NaN, infinite or far-away coordinates (see the module notes).
const OUTSIDE: AxisTaps = AxisTaps { i0: 0, in0: false, in1: false, w0: 0.0, w1: 0.0 };

/// The taps of grid coordinate `x` along an axis of `size` voxels (1 <= size <= [`MAX_AXIS`]).
#[inline(always)]
pub fn axis_taps(x: f32, size: u32) -> AxisTaps {
    let u = unnormalize(x, size);
    // Written so that NaN fails it: no corner of a NaN coordinate is inside.
    if !(u >= -1.0 && u < size as f32) {
        return OUTSIDE;
    }
    // -1 <= u < 2^24: the conversion truncates toward zero exactly, and floor is one less where
    // that rounded up (negative non-integers).
    let t = u as i32;
    let i0 = if t as f32 > u { t - 1 } else { t };
    let lo = i0 as f32;
    AxisTaps { i0, in0: i0 >= 0, in1: i0 + 1 < size as i32, w0: (lo + 1.0) - u, w1: u - lo }
}

/// One of the eight corners: whether it is inside the volume, its index in the D x H x W volume
/// of one channel (0 when outside), and its weight.
pub struct Corner {
    pub inside: bool,
    pub index: u32,
    pub weight: f32,
}

/// The corner at (z taps `zi`, y taps `yi`, x taps `xi`), `zi`/`yi`/`xi` = 0 for the lower tap,
/// 1 for the upper, in a volume of `h` x `w` voxels per depth slice.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn corner(z: &AxisTaps, y: &AxisTaps, x: &AxisTaps, zi: u32, yi: u32, xi: u32, h: u32, w: u32) -> Corner {
    let (inz, wz) = if zi == 0 { (z.in0, z.w0) } else { (z.in1, z.w1) };
    let (iny, wy) = if yi == 0 { (y.in0, y.w0) } else { (y.in1, y.w1) };
    let (inx, wx) = if xi == 0 { (x.in0, x.w0) } else { (x.in1, x.w1) };
    let inside = inz && iny && inx;
    // Only for a corner inside is every index in [0, size): then (z*H + y)*W + x < D*H*W <= u32::MAX.
    let index = if inside { ((z.i0 as u32 + zi) * h + (y.i0 as u32 + yi)) * w + (x.i0 as u32 + xi) } else { 0 };
    Corner { inside, index, weight: wx * wy * wz }
}

/// The eight corners of one sample point, in PyTorch's order (`c<z><y><x>`: tnw = c000, tne = c001,
/// tsw = c010, tse = c011, bnw = c100, bne = c101, bsw = c110, bse = c111), computed once per
/// output voxel and used for every channel.
pub struct Trilinear {
    pub c000: Corner,
    pub c001: Corner,
    pub c010: Corner,
    pub c011: Corner,
    pub c100: Corner,
    pub c101: Corner,
    pub c110: Corner,
    pub c111: Corner,
}

impl Trilinear {
    /// The corners of grid point (x, y, z) in a volume of `d` x `h` x `w` voxels (each at least 1
    /// and at most [`MAX_AXIS`], d*h*w at most u32::MAX).
    #[inline(always)]
    pub fn new(x: f32, y: f32, z: f32, d: u32, h: u32, w: u32) -> Trilinear {
        let tx = axis_taps(x, w);
        let ty = axis_taps(y, h);
        let tz = axis_taps(z, d);
        Trilinear {
            c000: corner(&tz, &ty, &tx, 0, 0, 0, h, w),
            c001: corner(&tz, &ty, &tx, 0, 0, 1, h, w),
            c010: corner(&tz, &ty, &tx, 0, 1, 0, h, w),
            c011: corner(&tz, &ty, &tx, 0, 1, 1, h, w),
            c100: corner(&tz, &ty, &tx, 1, 0, 0, h, w),
            c101: corner(&tz, &ty, &tx, 1, 0, 1, h, w),
            c110: corner(&tz, &ty, &tx, 1, 1, 0, h, w),
            c111: corner(&tz, &ty, &tx, 1, 1, 1, h, w),
        }
    }

    /// The sample from the eight corner values (`vZYX` for corner `cZYX`; the value of a corner
    /// outside the volume is ignored, so callers pass anything, e.g. 0, without reading memory):
    /// the weighted sum in PyTorch's order, starting from +0.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn blend(&self, v000: f32, v001: f32, v010: f32, v011: f32, v100: f32, v101: f32, v110: f32, v111: f32) -> f32 {
        let mut acc = 0.0f32;
        acc = add_corner(acc, &self.c000, v000);
        acc = add_corner(acc, &self.c001, v001);
        acc = add_corner(acc, &self.c010, v010);
        acc = add_corner(acc, &self.c011, v011);
        acc = add_corner(acc, &self.c100, v100);
        acc = add_corner(acc, &self.c101, v101);
        acc = add_corner(acc, &self.c110, v110);
        add_corner(acc, &self.c111, v111)
    }
}

#[inline(always)]
fn add_corner(acc: f32, c: &Corner, v: f32) -> f32 {
    if c.inside {
        acc + v * c.weight
    } else {
        acc
    }
}
