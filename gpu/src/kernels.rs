//! Kernel entry points (device only). Each frame-pair kernel gives one warp to a pair: a
//! strided pass accumulates the four `PairSums` (coalesced: lane l reads elements l, l+32,
//! ...), a butterfly shuffle gives every lane the totals, the pair's geometry is computed
//! once, and the warp writes its frames. No shared memory, no barriers; launch with a block
//! size that is a multiple of 32 and enough blocks to cover every warp.
//!
//! In-place is allowed where noted: each lane writes only elements it has already read.
//!
//! Safety (every entry point): the pointers must point to buffers of at least the sizes the
//! arguments imply, as the host's launchers check (host/src/launch.rs); on the host they are
//! the emulator's checked pointers, where a violation is a fault instead of undefined behaviour.
#![allow(clippy::missing_safety_doc)]

use crate::composite::{blend_bilinear, tap};
use crate::grid_sample::{Corner, Trilinear};
use crate::math::{easing_weight, hermite};
use crate::slerp::{interval_alpha, interval_frames, PairGeometry, PairSums, METHOD_LERP};
// The device intrinsics: LLVM's NVPTX intrinsics on the device, the emulated grid on the host.
// Memory goes through `Ptr`/`PtrMut` and `load`/`store`/`offset` only: raw pointers on the
// device (the PTX is the same as with `*p`), bounds-checked handles in the emulator.
#[cfg(not(target_arch = "nvptx64"))]
use crate::emu::device::*;
#[cfg(target_arch = "nvptx64")]
use crate::shim::*;

const FULL_MASK: u32 = 0xffff_ffff;

/// Storage types: f32 arithmetic, f32 or f16 in memory.
pub trait Elem: Copy {
    unsafe fn ld(p: Ptr<Self>, i: usize) -> f32;
    unsafe fn st(p: PtrMut<Self>, i: usize, v: f32);
}
impl Elem for f32 {
    #[inline(always)]
    unsafe fn ld(p: Ptr<f32>, i: usize) -> f32 {
        load(p, i)
    }
    #[inline(always)]
    unsafe fn st(p: PtrMut<f32>, i: usize, v: f32) {
        store(p, i, v)
    }
}
impl Elem for f16 {
    #[inline(always)]
    unsafe fn ld(p: Ptr<f16>, i: usize) -> f32 {
        f16_to_f32(load(p, i))
    }
    #[inline(always)]
    unsafe fn st(p: PtrMut<f16>, i: usize, v: f32) {
        store(p, i, f32_to_f16(v))
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
unsafe fn warp_geometry<T: Elem>(v0: Ptr<T>, v1: Ptr<T>, dim: usize) -> PairGeometry {
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
unsafe fn warp_combine<T: Elem>(v0: Ptr<T>, v1: Ptr<T>, out: PtrMut<T>, dim: usize, c0: f32, c1: f32) {
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
unsafe fn pair_geometry_for<T: Elem>(method: u32, v0: Ptr<T>, v1: Ptr<T>, dim: usize) -> PairGeometry {
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
    v0: Ptr<T>,
    v1: Ptr<T>,
    alphas: Ptr<f32>,
    out: PtrMut<T>,
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
    let (c0, c1) = g.coeffs(method, load(alphas, row as usize));
    warp_combine(a, b, o, d, c0, c1);
}

/// Stride expansion: `n_keys` keyframes at sorted frame indices `key_idx` to `n_frames`
/// frames. Warp j owns interval j (keyframes j and j+1): it computes that pair's geometry once
/// and writes every frame of the interval. Frames before the first keyframe copy it, frames
/// after the last copy the last. Launch max(n_keys - 1, 1) warps.
#[inline(always)]
unsafe fn expand<T: Elem>(
    keys: Ptr<T>,
    key_idx: Ptr<u32>,
    n_keys: u32,
    out: PtrMut<T>,
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
    let k0 = load(key_idx, j as usize);
    let k1 = load(key_idx, j as usize + 1);
    let (first, end) = interval_frames(j, n_keys, k0, k1, n_frames);
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
    frames: Ptr<T>,
    rest: Ptr<T>,
    distance: Ptr<u32>,
    ramp: u32,
    out: PtrMut<T>,
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
    let w = easing_weight(load(distance, f as usize), ramp);
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
    rgb: Ptr<T>,
    rgb_frame_stride: u32,
    plane_stride: u32,
    rgb_pitch: u32,
    y_out: PtrMut<u8>,
    y_frame_stride: u32,
    y_pitch: u32,
    uv_out: PtrMut<u8>,
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
        (pixel(src, p0, range), pixel(src, p0 + 1, range), pixel(src, p1, range), pixel(src, p1 + 1, range)),
        (
            pixel(src, ps + p0, range),
            pixel(src, ps + p0 + 1, range),
            pixel(src, ps + p1, range),
            pixel(src, ps + p1 + 1, range),
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
    store(y, y0, blk.y.0);
    store(y, y0 + 1, blk.y.1);
    store(y, y1, blk.y.2);
    store(y, y1 + 1, blk.y.3);
    let uv = offset(uv_out, frame * uv_frame_stride as usize + by * uv_pitch as usize + 2 * bx);
    store(uv, 0, blk.u);
    store(uv, 1, blk.v);
}

#[inline(always)]
unsafe fn pixel<T: Elem>(src: Ptr<T>, i: usize, range: u32) -> f32 {
    crate::color::to_8bit(T::ld(src, i), range)
}

/// One pixel of the face box composited over the background, in the 8-bit scale (r, g, b).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn composite_pixel<T: Elem>(
    crop: Ptr<T>,
    cw: u32,
    ch: u32,
    range: u32,
    alpha: Ptr<f32>,
    background_term: Ptr<f32>,
    box_w: u32,
    box_h: u32,
    px: u32,
    py: u32,
) -> (f32, f32, f32) {
    let tx = tap(px, box_w, cw);
    let ty = tap(py, box_h, ch);
    let i = (py * box_w + px) as usize;
    let a = load(alpha, i);
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
            load(background_term, c * bplane + i),
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
    crop: Ptr<T>,
    cw: u32,
    ch: u32,
    range: u32,
    alpha: Ptr<f32>,
    background_term: Ptr<f32>,
    frame: PtrMut<u8>,
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
    store(frame, y0, blk.y.0);
    store(frame, y0 + 1, blk.y.1);
    store(frame, y0 + w, blk.y.2);
    store(frame, y0 + w + 1, blk.y.3);
    let uv = w * height as usize + ((box_y + py) / 2) as usize * w + (box_x + px) as usize;
    store(frame, uv, blk.u);
    store(frame, uv + 1, blk.v);
}

/// Hermite weights alone (for inspection and tests of the device math).
#[inline(always)]
unsafe fn hermite_table(t: Ptr<f32>, out: PtrMut<f32>, n: u32) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i < n {
        store(out, i as usize, hermite(load(t, i as usize)));
    }
}

/// A corner's value in one channel's volume, 0 for a corner outside it (never read: the blend
/// skips it, and the load would be out of bounds).
#[inline(always)]
unsafe fn corner_value(volume: Ptr<f32>, c: &Corner) -> f32 {
    if c.inside {
        load(volume, c.index as usize)
    } else {
        0.0
    }
}

/// `F.grid_sample` of a 5-D volume, trilinear, zero padding, align_corners=False
/// (`grid_sample.rs`): `input` (batch, channels, in_d, in_h, in_w) and `grid` (batch, out_voxels,
/// 3) with (x, y, z) last, to `out` (batch, channels, out_voxels), all contiguous as PyTorch's
/// NCDHW. One thread per output voxel of one batch item: the eight corners (indices and weights)
/// are computed once and every channel is sampled with them. Consecutive threads take consecutive
/// output voxels, so the grid reads and the output writes of a warp are contiguous.
///
/// Index arithmetic: the thread id and batch offsets in usize; a corner's index in one channel's
/// volume in u32, which the host's limits keep exact (each axis <= 2^24, in_d*in_h*in_w and
/// batch*out_voxels <= u32::MAX: `host/src/grid_sample.rs`). ptxas (13.5) gives it 48 registers on
/// sm_90 and sm_120 and 55 on sm_75, no spills (the launch's block size fits any register
/// count: `ITEM_BLOCK` in `host/src/launch.rs`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn grid_sample_3d(
    input: Ptr<f32>,
    grid: Ptr<f32>,
    out: PtrMut<f32>,
    batch: u32,
    channels: u32,
    in_d: u32,
    in_h: u32,
    in_w: u32,
    out_voxels: u32,
) {
    let gid = block_idx_x() as usize * block_dim_x() as usize + thread_idx_x() as usize;
    let per_item = out_voxels as usize;
    if gid >= per_item * batch as usize {
        return;
    }
    let n = unchecked_div(gid, per_item);
    let v = gid - n * per_item;
    let g = 3 * gid;
    let t = Trilinear::new(load(grid, g), load(grid, g + 1), load(grid, g + 2), in_d, in_h, in_w);
    let volume = (in_d * in_h * in_w) as usize;
    let first = n * channels as usize;
    let mut c = 0usize;
    while c < channels as usize {
        let src = offset(input, (first + c) * volume);
        let s = t.blend(
            corner_value(src, &t.c000),
            corner_value(src, &t.c001),
            corner_value(src, &t.c010),
            corner_value(src, &t.c011),
            corner_value(src, &t.c100),
            corner_value(src, &t.c101),
            corner_value(src, &t.c110),
            corner_value(src, &t.c111),
        );
        store(out, (first + c) * per_item + v, s);
        c += 1;
    }
}

/// An entry point: `extern "ptx-kernel"` with its symbol on the device, a plain function the
/// emulator calls on the host. The parameter list is written once, here.
macro_rules! entry {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        #[cfg(target_arch = "nvptx64")]
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body
        $(#[$m])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub unsafe fn $name($($arg: $ty),*) $body
    };
}

macro_rules! typed_kernels {
    ($t:ty, $slerp:ident, $expand:ident, $ease:ident, $nv12:ident, $composite:ident) => {
        entry! {
            #[allow(clippy::too_many_arguments)]
            fn $composite(
                crop: Ptr<$t>,
                cw: u32,
                ch: u32,
                range: u32,
                alpha: Ptr<f32>,
                background_term: Ptr<f32>,
                frame: PtrMut<u8>,
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
        }
        entry! {
            fn $slerp(v0: Ptr<$t>, v1: Ptr<$t>, alphas: Ptr<f32>, out: PtrMut<$t>, rows: u32, dim: u32, method: u32) {
                slerp_pairs::<$t>(v0, v1, alphas, out, rows, dim, method)
            }
        }
        entry! {
            fn $expand(
                keys: Ptr<$t>,
                key_idx: Ptr<u32>,
                n_keys: u32,
                out: PtrMut<$t>,
                n_frames: u32,
                dim: u32,
                method: u32,
            ) {
                expand::<$t>(keys, key_idx, n_keys, out, n_frames, dim, method)
            }
        }
        entry! {
            fn $ease(
                frames: Ptr<$t>,
                rest: Ptr<$t>,
                distance: Ptr<u32>,
                ramp: u32,
                out: PtrMut<$t>,
                n_frames: u32,
                dim: u32,
            ) {
                ease::<$t>(frames, rest, distance, ramp, out, n_frames, dim)
            }
        }
        entry! {
            #[allow(clippy::too_many_arguments)]
            fn $nv12(
                rgb: Ptr<$t>,
                rgb_frame_stride: u32,
                plane_stride: u32,
                rgb_pitch: u32,
                y_out: PtrMut<u8>,
                y_frame_stride: u32,
                y_pitch: u32,
                uv_out: PtrMut<u8>,
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
        }
        /// The emulator's way to the entry points of this storage type.
        #[cfg(not(target_arch = "nvptx64"))]
        impl Entries for $t {
            const SLERP_PAIRS: SlerpPairsFn<$t> = $slerp;
            const EXPAND: ExpandFn<$t> = $expand;
            const EASE: EaseFn<$t> = $ease;
            const RGB_TO_NV12: RgbToNv12Fn<$t> = $nv12;
            const COMPOSITE_NV12: CompositeNv12Fn<$t> = $composite;
        }
    };
}
typed_kernels!(f32, slerp_pairs_f32, expand_f32, ease_f32, rgb_to_nv12_f32, composite_nv12_f32);
typed_kernels!(f16, slerp_pairs_f16, expand_f16, ease_f16, rgb_to_nv12_f16, composite_nv12_f16);

entry! {
    fn hermite_f32(t: Ptr<f32>, out: PtrMut<f32>, n: u32) {
        hermite_table(t, out, n)
    }
}

entry! {
    #[allow(clippy::too_many_arguments)]
    fn grid_sample_3d_f32(
        input: Ptr<f32>,
        grid: Ptr<f32>,
        out: PtrMut<f32>,
        batch: u32,
        channels: u32,
        in_d: u32,
        in_h: u32,
        in_w: u32,
        out_voxels: u32,
    ) {
        grid_sample_3d(input, grid, out, batch, channels, in_d, in_h, in_w, out_voxels)
    }
}

// The entry points' types, for the host (the compiler checks them against the functions above).
#[cfg(not(target_arch = "nvptx64"))]
pub type SlerpPairsFn<T> = unsafe fn(Ptr<T>, Ptr<T>, Ptr<f32>, PtrMut<T>, u32, u32, u32);
#[cfg(not(target_arch = "nvptx64"))]
pub type ExpandFn<T> = unsafe fn(Ptr<T>, Ptr<u32>, u32, PtrMut<T>, u32, u32, u32);
#[cfg(not(target_arch = "nvptx64"))]
pub type EaseFn<T> = unsafe fn(Ptr<T>, Ptr<T>, Ptr<u32>, u32, PtrMut<T>, u32, u32);
#[cfg(not(target_arch = "nvptx64"))]
pub type RgbToNv12Fn<T> =
    unsafe fn(Ptr<T>, u32, u32, u32, PtrMut<u8>, u32, u32, PtrMut<u8>, u32, u32, u32, u32, u32, u32, u32);
#[cfg(not(target_arch = "nvptx64"))]
pub type CompositeNv12Fn<T> =
    unsafe fn(Ptr<T>, u32, u32, u32, Ptr<f32>, Ptr<f32>, PtrMut<u8>, u32, u32, u32, u32, u32, u32, u32);

/// The entry points of one storage type, so host code generic over it can launch them in the
/// emulator (`Ptr`/`PtrMut` are the emulator's checked pointers there).
#[cfg(not(target_arch = "nvptx64"))]
pub trait Entries: Elem + Sized {
    const SLERP_PAIRS: SlerpPairsFn<Self>;
    const EXPAND: ExpandFn<Self>;
    const EASE: EaseFn<Self>;
    const RGB_TO_NV12: RgbToNv12Fn<Self>;
    const COMPOSITE_NV12: CompositeNv12Fn<Self>;
}
