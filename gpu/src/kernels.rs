//! Kernel entry points (device only). Each frame-pair kernel gives one warp to a pair: a
//! strided pass accumulates the four [`PairSums`] (coalesced: lane l reads elements l, l+32,
//! ...), a butterfly shuffle gives every lane the totals, the pair's geometry is computed
//! once, and the warp writes its frames. No shared memory, no barriers; launch with a block
//! size that is a multiple of 32 and enough blocks to cover every warp.
//!
//! In-place is allowed where noted: each lane writes only elements it has already read.

use crate::composite::{blend_bilinear, tap};
use crate::math::{easing_weight, hermite};
use crate::shim::*;
use crate::slerp::{interval_alpha, PairGeometry, PairSums, METHOD_LERP};

const FULL_MASK: u32 = 0xffff_ffff;

/// Storage types: f32 arithmetic, f32 or f16 in memory.
pub trait Elem: Copy {
    unsafe fn ld(p: *const Self, i: usize) -> f32;
    unsafe fn st(p: *mut Self, i: usize, v: f32);
}
impl Elem for f32 {
    #[inline(always)]
    unsafe fn ld(p: *const f32, i: usize) -> f32 {
        *offset(p, i)
    }
    #[inline(always)]
    unsafe fn st(p: *mut f32, i: usize, v: f32) {
        *offset(p, i) = v
    }
}
impl Elem for f16 {
    #[inline(always)]
    unsafe fn ld(p: *const f16, i: usize) -> f32 {
        *offset(p, i) as f32
    }
    #[inline(always)]
    unsafe fn st(p: *mut f16, i: usize, v: f32) {
        *offset(p, i) = v as f16
    }
}

#[inline(always)]
unsafe fn lane() -> u32 {
    thread_idx_x() % 32
}

#[inline(always)]
unsafe fn global_warp() -> u32 {
    (block_idx_x() * block_dim_x() + thread_idx_x()) / 32
}

#[inline(always)]
unsafe fn warp_sum(x: f32) -> f32 {
    let mut v = x;
    v += shfl_bfly_f32(FULL_MASK, v, 16, 31);
    v += shfl_bfly_f32(FULL_MASK, v, 8, 31);
    v += shfl_bfly_f32(FULL_MASK, v, 4, 31);
    v += shfl_bfly_f32(FULL_MASK, v, 2, 31);
    v += shfl_bfly_f32(FULL_MASK, v, 1, 31);
    v
}

/// The pair's geometry, identical in every lane of the warp.
#[inline(always)]
unsafe fn warp_geometry<T: Elem>(v0: *const T, v1: *const T, dim: usize) -> PairGeometry {
    let mut s = PairSums::ZERO;
    let mut i = lane() as usize;
    while i < dim {
        s.add(T::ld(v0, i), T::ld(v1, i));
        i += 32;
    }
    PairGeometry::from_sums(&PairSums {
        s00: warp_sum(s.s00),
        s11: warp_sum(s.s11),
        sdiff: warp_sum(s.sdiff),
        ssum: warp_sum(s.ssum),
    })
}

/// Writes c0 v0 + c1 v1, copying exactly at the endpoints (so an infinite or NaN element of
/// the other frame cannot leak into a keyframe copy).
#[inline(always)]
unsafe fn warp_combine<T: Elem>(v0: *const T, v1: *const T, out: *mut T, dim: usize, c0: f32, c1: f32) {
    let mut i = lane() as usize;
    if c1 == 0.0 && c0 == 1.0 {
        while i < dim {
            T::st(out, i, T::ld(v0, i));
            i += 32;
        }
    } else if c0 == 0.0 && c1 == 1.0 {
        while i < dim {
            T::st(out, i, T::ld(v1, i));
            i += 32;
        }
    } else {
        while i < dim {
            T::st(out, i, c0 * T::ld(v0, i) + c1 * T::ld(v1, i));
            i += 32;
        }
    }
}

#[inline(always)]
unsafe fn pair_geometry_for<T: Elem>(method: u32, v0: *const T, v1: *const T, dim: usize) -> PairGeometry {
    if method == METHOD_LERP {
        // LERP needs no statistics; skip the read pass.
        PairGeometry { n0: 1.0, n1: 1.0, theta: 0.0, sin_theta: 0.0, cos_theta: 1.0, kind: 0 }
    } else {
        warp_geometry(v0, v1, dim)
    }
}

/// out[r] = interp(v0[r], v1[r], alphas[r]) for `rows` frame pairs of `dim` elements.
#[inline(always)]
unsafe fn slerp_pairs<T: Elem>(
    v0: *const T,
    v1: *const T,
    alphas: *const f32,
    out: *mut T,
    rows: u32,
    dim: u32,
    method: u32,
) {
    let row = global_warp();
    if row >= rows {
        return;
    }
    let d = dim as usize;
    let base = row as usize * d;
    let (a, b, o) = (offset(v0, base), offset(v1, base), offset(out, base));
    let g = pair_geometry_for(method, a, b, d);
    let (c0, c1) = g.coeffs(method, *offset(alphas, row as usize));
    warp_combine(a, b, o, d, c0, c1);
}

/// Stride expansion: `n_keys` keyframes at sorted frame indices `key_idx` to `n_frames`
/// frames. Warp j owns interval j (keyframes j and j+1): it computes that pair's geometry once
/// and writes every frame of the interval. Frames before the first keyframe copy it, frames
/// after the last copy the last. Launch max(n_keys - 1, 1) warps.
#[inline(always)]
unsafe fn expand<T: Elem>(
    keys: *const T,
    key_idx: *const u32,
    n_keys: u32,
    out: *mut T,
    n_frames: u32,
    dim: u32,
    method: u32,
) {
    let j = global_warp();
    let d = dim as usize;
    if n_keys == 1 {
        if j == 0 {
            let mut f = 0;
            while f < n_frames {
                warp_combine(keys, keys, offset(out, f as usize * d), d, 1.0, 0.0);
                f += 1;
            }
        }
        return;
    }
    if j + 1 >= n_keys {
        return;
    }
    let k0 = *offset(key_idx, j as usize);
    let k1 = *offset(key_idx, j as usize + 1);
    let first = if j == 0 { 0 } else { k0 };
    let end = if j + 2 == n_keys { n_frames } else { k1 };
    let v0 = offset(keys, j as usize * d);
    let v1 = offset(keys, (j as usize + 1) * d);
    let g = pair_geometry_for(method, v0, v1, d);
    let mut f = first;
    while f < end {
        let (c0, c1) = g.coeffs(method, interval_alpha(f, k0, k1));
        warp_combine(v0, v1, offset(out, f as usize * d), d, c0, c1);
        f += 1;
    }
}

/// Silence easing: frame f becomes SLERP(rest, frames[f], w) with w = h(1 - distance[f]/ramp)
/// (distance to the nearest speech frame). w = 1 keeps the frame, w = 0 gives the rest latent
/// exactly. In-place (out == frames) is allowed.
#[inline(always)]
unsafe fn ease<T: Elem>(
    frames: *const T,
    rest: *const T,
    distance: *const u32,
    ramp: u32,
    out: *mut T,
    n_frames: u32,
    dim: u32,
) {
    let f = global_warp();
    if f >= n_frames {
        return;
    }
    let d = dim as usize;
    let src = offset(frames, f as usize * d);
    let dst = offset(out, f as usize * d);
    let w = easing_weight(*offset(distance, f as usize), ramp);
    if w == 1.0 {
        warp_combine(src, src, dst, d, 1.0, 0.0);
    } else if w == 0.0 {
        warp_combine(rest, rest, dst, d, 1.0, 0.0);
    } else {
        let g = warp_geometry(rest, src, d);
        let (c0, c1) = g.slerp_coeffs(w);
        warp_combine(rest, src, dst, d, c0, c1);
    }
}

/// Planar RGB frames (3 planes of `height` rows, `rgb_pitch` elements per row, planes
/// `plane_stride` elements apart, frames `rgb_frame_stride` apart) to NV12. One thread per
/// 2x2 block; width and height must be even (the host checks).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rgb_to_nv12<T: Elem>(
    rgb: *const T,
    rgb_frame_stride: u32,
    plane_stride: u32,
    rgb_pitch: u32,
    y_out: *mut u8,
    y_frame_stride: u32,
    y_pitch: u32,
    uv_out: *mut u8,
    uv_frame_stride: u32,
    uv_pitch: u32,
    width: u32,
    height: u32,
    frames: u32,
    matrix: u32,
    range: u32,
) {
    let gid = block_idx_x() as usize * block_dim_x() as usize + thread_idx_x() as usize;
    let bw = (width / 2) as usize;
    let per_frame = bw * (height / 2) as usize;
    if gid >= per_frame * frames as usize {
        return;
    }
    let frame = unchecked_div(gid, per_frame);
    let rem = gid - frame * per_frame;
    let by = unchecked_div(rem, bw);
    let bx = rem - by * bw;
    let src = offset(rgb, frame * rgb_frame_stride as usize);
    let ps = plane_stride as usize;
    let p0 = 2 * by * rgb_pitch as usize + 2 * bx;
    let p1 = p0 + rgb_pitch as usize;
    let c = crate::color::coeffs(matrix);
    let blk = crate::color::convert_block(
        &c,
        (
            pixel(src, 0 * ps + p0, range),
            pixel(src, 0 * ps + p0 + 1, range),
            pixel(src, 0 * ps + p1, range),
            pixel(src, 0 * ps + p1 + 1, range),
        ),
        (
            pixel(src, 1 * ps + p0, range),
            pixel(src, 1 * ps + p0 + 1, range),
            pixel(src, 1 * ps + p1, range),
            pixel(src, 1 * ps + p1 + 1, range),
        ),
        (
            pixel(src, 2 * ps + p0, range),
            pixel(src, 2 * ps + p0 + 1, range),
            pixel(src, 2 * ps + p1, range),
            pixel(src, 2 * ps + p1 + 1, range),
        ),
    );
    let y = offset(y_out, frame * y_frame_stride as usize);
    let y0 = 2 * by * y_pitch as usize + 2 * bx;
    let y1 = y0 + y_pitch as usize;
    *offset(y, y0) = blk.y.0;
    *offset(y, y0 + 1) = blk.y.1;
    *offset(y, y1) = blk.y.2;
    *offset(y, y1 + 1) = blk.y.3;
    let uv = offset(uv_out, frame * uv_frame_stride as usize + by * uv_pitch as usize + 2 * bx);
    *uv = blk.u;
    *offset(uv, 1usize) = blk.v;
}

#[inline(always)]
unsafe fn pixel<T: Elem>(src: *const T, i: usize, range: u32) -> f32 {
    crate::color::to_8bit(T::ld(src, i), range)
}

/// One pixel of the face box composited over the background, in the 8-bit scale (r, g, b).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn composite_pixel<T: Elem>(
    crop: *const T,
    cw: u32,
    ch: u32,
    range: u32,
    alpha: *const f32,
    background_term: *const f32,
    box_w: u32,
    box_h: u32,
    px: u32,
    py: u32,
) -> (f32, f32, f32) {
    let tx = tap(px, box_w, cw);
    let ty = tap(py, box_h, ch);
    let i = (py * box_w + px) as usize;
    let a = *offset(alpha, i);
    let bplane = (box_w * box_h) as usize;
    let cplane = (cw * ch) as usize;
    let (r0, r1) = ((ty.i0 * cw) as usize, (ty.i1 * cw) as usize);
    let (x0, x1) = (tx.i0 as usize, tx.i1 as usize);
    // No closures here: the no_core shim has no Fn traits.
    let mut rgb = (0.0f32, 0.0f32, 0.0f32);
    let mut c = 0usize;
    while c < 3 {
        let base = c * cplane;
        let v = blend_bilinear(
            pixel(crop, base + r0 + x0, range),
            pixel(crop, base + r0 + x1, range),
            pixel(crop, base + r1 + x0, range),
            pixel(crop, base + r1 + x1, range),
            &tx,
            &ty,
            a,
            *offset(background_term, c * bplane + i),
        );
        if c == 0 {
            rgb.0 = v;
        } else if c == 1 {
            rgb.1 = v;
        } else {
            rgb.2 = v;
        }
        c += 1;
    }
    rgb
}

/// Compositing fused with NV12 (the CUDA path of `host::composite::Compositor`): one thread per
/// 2x2 block of the face box. The frame already holds the background's NV12; only the box's
/// blocks are rewritten. `alpha` (box_w x box_h) and `background_term` (3 planes of that size,
/// 8-bit scale) are computed once per render; `crop` is planar 3 x ch x cw in `range`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn composite_nv12<T: Elem>(
    crop: *const T,
    cw: u32,
    ch: u32,
    range: u32,
    alpha: *const f32,
    background_term: *const f32,
    frame: *mut u8,
    width: u32,
    height: u32,
    box_x: u32,
    box_y: u32,
    box_w: u32,
    box_h: u32,
    matrix: u32,
) {
    let gid = block_idx_x() as usize * block_dim_x() as usize + thread_idx_x() as usize;
    let bw = (box_w / 2) as usize;
    if gid >= bw * (box_h / 2) as usize {
        return;
    }
    let by = unchecked_div(gid, bw) as u32;
    let bx = gid as u32 - by * bw as u32;
    let (px, py) = (2 * bx, 2 * by);
    let a = composite_pixel(crop, cw, ch, range, alpha, background_term, box_w, box_h, px, py);
    let b = composite_pixel(crop, cw, ch, range, alpha, background_term, box_w, box_h, px + 1, py);
    let c = composite_pixel(crop, cw, ch, range, alpha, background_term, box_w, box_h, px, py + 1);
    let d = composite_pixel(crop, cw, ch, range, alpha, background_term, box_w, box_h, px + 1, py + 1);
    let blk = crate::color::convert_block(
        &crate::color::coeffs(matrix),
        (a.0, b.0, c.0, d.0),
        (a.1, b.1, c.1, d.1),
        (a.2, b.2, c.2, d.2),
    );
    let w = width as usize;
    let y0 = (box_y + py) as usize * w + (box_x + px) as usize;
    *offset(frame, y0) = blk.y.0;
    *offset(frame, y0 + 1) = blk.y.1;
    *offset(frame, y0 + w) = blk.y.2;
    *offset(frame, y0 + w + 1) = blk.y.3;
    let uv = w * height as usize + ((box_y + py) / 2) as usize * w + (box_x + px) as usize;
    *offset(frame, uv) = blk.u;
    *offset(frame, uv + 1) = blk.v;
}

/// Hermite weights alone (for inspection and tests of the device math).
#[inline(always)]
unsafe fn hermite_table(t: *const f32, out: *mut f32, n: u32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        *offset(out, i as usize) = hermite(*offset(t, i as usize));
    }
}

macro_rules! typed_kernels {
    ($t:ty, $slerp:ident, $expand:ident, $ease:ident, $nv12:ident, $composite:ident) => {
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $composite(
            crop: *const $t,
            cw: u32,
            ch: u32,
            range: u32,
            alpha: *const f32,
            background_term: *const f32,
            frame: *mut u8,
            width: u32,
            height: u32,
            box_x: u32,
            box_y: u32,
            box_w: u32,
            box_h: u32,
            matrix: u32,
        ) {
            composite_nv12::<$t>(
                crop,
                cw,
                ch,
                range,
                alpha,
                background_term,
                frame,
                width,
                height,
                box_x,
                box_y,
                box_w,
                box_h,
                matrix,
            )
        }
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $slerp(
            v0: *const $t,
            v1: *const $t,
            alphas: *const f32,
            out: *mut $t,
            rows: u32,
            dim: u32,
            method: u32,
        ) {
            slerp_pairs::<$t>(v0, v1, alphas, out, rows, dim, method)
        }
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $expand(
            keys: *const $t,
            key_idx: *const u32,
            n_keys: u32,
            out: *mut $t,
            n_frames: u32,
            dim: u32,
            method: u32,
        ) {
            expand::<$t>(keys, key_idx, n_keys, out, n_frames, dim, method)
        }
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $ease(
            frames: *const $t,
            rest: *const $t,
            distance: *const u32,
            ramp: u32,
            out: *mut $t,
            n_frames: u32,
            dim: u32,
        ) {
            ease::<$t>(frames, rest, distance, ramp, out, n_frames, dim)
        }
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $nv12(
            rgb: *const $t,
            rgb_frame_stride: u32,
            plane_stride: u32,
            rgb_pitch: u32,
            y_out: *mut u8,
            y_frame_stride: u32,
            y_pitch: u32,
            uv_out: *mut u8,
            uv_frame_stride: u32,
            uv_pitch: u32,
            width: u32,
            height: u32,
            frames: u32,
            matrix: u32,
            range: u32,
        ) {
            rgb_to_nv12::<$t>(
                rgb,
                rgb_frame_stride,
                plane_stride,
                rgb_pitch,
                y_out,
                y_frame_stride,
                y_pitch,
                uv_out,
                uv_frame_stride,
                uv_pitch,
                width,
                height,
                frames,
                matrix,
                range,
            )
        }
    };
}
typed_kernels!(f32, slerp_pairs_f32, expand_f32, ease_f32, rgb_to_nv12_f32, composite_nv12_f32);
typed_kernels!(f16, slerp_pairs_f16, expand_f16, ease_f16, rgb_to_nv12_f16, composite_nv12_f16);

#[no_mangle]
pub unsafe extern "ptx-kernel" fn hermite_f32(t: *const f32, out: *mut f32, n: u32) {
    hermite_table(t, out, n)
}
