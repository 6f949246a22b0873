//! CPU paths of every kernel: multi-threaded (rayon), f32 arithmetic, f32 or f16 storage, the
//! same scalar math as the device (`cadence_kernels`). Real implementations, used by the
//! pipeline whenever no GPU is present, and the reference the CUDA path is checked against.

use crate::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::schedule::KeyframeSchedule;
use cadence_kernels::color;
use cadence_kernels::math::easing_weight;
use cadence_kernels::slerp::{PairGeometry, PairSums};
use rayon::prelude::*;

/// Independent accumulators: lets the compiler vectorize the reduction (a single running sum
/// is a serial dependency chain). 16 lanes fill four SSE or two AVX registers per sum.
const LANES: usize = 16;
/// f16 input is widened in blocks of this many elements.
const BLOCK: usize = 256;

#[inline]
fn sums_f32(a: &[f32], b: &[f32], acc: &mut [[f32; LANES]; 4]) {
    let (ca, ra) = a.as_chunks::<LANES>();
    let (cb, rb) = b.as_chunks::<LANES>();
    for (x, y) in ca.iter().zip(cb) {
        for l in 0..LANES {
            let (p, q) = (x[l], y[l]);
            let (d, s) = (p - q, p + q);
            acc[0][l] += p * p;
            acc[1][l] += q * q;
            acc[2][l] += d * d;
            acc[3][l] += s * s;
        }
    }
    for (l, (&p, &q)) in ra.iter().zip(rb).enumerate() {
        let (d, s) = (p - q, p + q);
        acc[0][l] += p * p;
        acc[1][l] += q * q;
        acc[2][l] += d * d;
        acc[3][l] += s * s;
    }
}

/// The four sums of a pair of frames, in one pass.
pub fn pair_sums<T: Elem>(a: &[T], b: &[T]) -> PairSums {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [[0.0f32; LANES]; 4];
    if let (Some(a), Some(b)) = (T::as_f32(a), T::as_f32(b)) {
        sums_f32(a, b, &mut acc);
    } else {
        let mut wa = [0.0f32; BLOCK];
        let mut wb = [0.0f32; BLOCK];
        for (x, y) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
            let n = x.len();
            T::widen(x, &mut wa[..n]);
            T::widen(y, &mut wb[..n]);
            sums_f32(&wa[..n], &wb[..n], &mut acc);
        }
    }
    let total = |v: &[f32; LANES]| v.iter().sum::<f32>();
    PairSums { s00: total(&acc[0]), s11: total(&acc[1]), sdiff: total(&acc[2]), ssum: total(&acc[3]) }
}

pub fn pair_geometry<T: Elem>(a: &[T], b: &[T]) -> PairGeometry {
    PairGeometry::from_sums(&pair_sums(a, b))
}

/// dst = c0 a + c1 b, with exact copies at the endpoints (as on the device).
#[inline]
pub fn combine<T: Elem>(a: &[T], b: &[T], dst: &mut [T], c0: f32, c1: f32) {
    if c0 == 1.0 && c1 == 0.0 {
        dst.copy_from_slice(a);
    } else if c0 == 0.0 && c1 == 1.0 {
        dst.copy_from_slice(b);
    } else {
        for ((o, &x), &y) in dst.iter_mut().zip(a).zip(b) {
            *o = T::from_f32(c0 * x.to_f32() + c1 * y.to_f32());
        }
    }
}

fn geometry_for<T: Elem>(method: Method, a: &[T], b: &[T]) -> PairGeometry {
    match method {
        // LERP needs no statistics.
        Method::Lerp => PairGeometry { n0: 1.0, n1: 1.0, theta: 0.0, sin_theta: 0.0, cos_theta: 1.0, kind: 0 },
        Method::Slerp => pair_geometry(a, b),
    }
}

/// out[r] = interp(v0[r], v1[r], alphas[r]) for rows of `dim` elements.
pub fn slerp_pairs<T: Elem>(v0: &[T], v1: &[T], alphas: &[f32], dim: usize, method: Method, out: &mut [T]) {
    assert!(dim > 0 && v0.len() == alphas.len() * dim && v1.len() == v0.len() && out.len() == v0.len());
    out.par_chunks_mut(dim).zip(v0.par_chunks(dim).zip(v1.par_chunks(dim))).zip(alphas.par_iter()).for_each(
        |((o, (a, b)), &alpha)| {
            let g = geometry_for(method, a, b);
            let (c0, c1) = g.coeffs(method.code(), alpha);
            combine(a, b, o, c0, c1);
        },
    );
}

/// Stride expansion: M keyframes (the schedule's, in order) to all N frames. One task per
/// interval: it computes that pair's geometry once and then writes the interval's frames while
/// the two keyframes are still in cache, so memory traffic stays close to one read of each
/// keyframe and one write of each frame.
pub fn expand<T: Elem>(keys: &[T], schedule: &KeyframeSchedule, dim: usize, method: Method, out: &mut [T]) {
    let m = schedule.count();
    let n = schedule.n_frames();
    assert!(dim > 0 && keys.len() == m * dim && out.len() == n * dim);
    let key = |j: usize| &keys[j * dim..(j + 1) * dim];
    if m == 1 {
        out.par_chunks_mut(dim).for_each(|o| o.copy_from_slice(key(0)));
        return;
    }
    // Split the output into the frame ranges each interval owns (the device kernel's ownership).
    let kf = schedule.keyframes();
    let mut parts = Vec::with_capacity(m - 1);
    let mut rest = out;
    for j in 0..m - 1 {
        let end = if j + 2 == m { n } else { kf[j + 1] as usize };
        let first = if j == 0 { 0 } else { kf[j] as usize };
        let (mine, tail) = rest.split_at_mut((end - first) * dim);
        parts.push((j, first, mine));
        rest = tail;
    }
    parts.into_par_iter().for_each(|(j, first, frames)| {
        let (a, b) = (key(j), key(j + 1));
        let g = geometry_for(method, a, b);
        for (i, o) in frames.chunks_mut(dim).enumerate() {
            let alpha = cadence_kernels::slerp::interval_alpha((first + i) as u32, kf[j], kf[j + 1]);
            let (c0, c1) = g.coeffs(method.code(), alpha);
            combine(a, b, o, c0, c1);
        }
    });
}

/// Silence easing, in place: frame f becomes SLERP(rest, frame, h(1 - distance[f]/ramp)).
pub fn ease<T: Elem>(frames: &mut [T], rest: &[T], distance: &[u32], ramp: u32) {
    let dim = rest.len();
    assert!(dim > 0 && frames.len() == distance.len() * dim);
    frames.par_chunks_mut(dim).zip(distance.par_iter()).for_each(|(f, &d)| {
        let w = easing_weight(d, ramp);
        if w == 0.0 {
            f.copy_from_slice(rest);
        } else if w != 1.0 {
            let g = pair_geometry(rest, f);
            let (c0, c1) = g.slerp_coeffs(w);
            for (o, &r) in f.iter_mut().zip(rest) {
                *o = T::from_f32(c0 * r.to_f32() + c1 * o.to_f32());
            }
        }
    });
}

/// Planar RGB to tightly packed NV12 frames (Y: width x height, then height/2 rows of
/// width interleaved U,V bytes). `out` must hold `layout.frames * layout.nv12_frame_bytes()`.
pub fn rgb_to_nv12<T: Elem>(rgb: &[T], layout: RgbLayout, matrix: ColorMatrix, range: RgbRange, out: &mut [u8]) {
    let (w, h, pitch) = (layout.width, layout.height, layout.pitch);
    assert!(layout.validate(rgb.len()).is_ok() && out.len() == layout.frames * layout.nv12_frame_bytes());
    let coeffs = color::coeffs(matrix.code());
    let range = range.code();
    let plane = layout.plane_len();
    out.par_chunks_mut(layout.nv12_frame_bytes()).zip(rgb.par_chunks(layout.frame_len())).for_each(|(frame_out, src)| {
        let (y_plane, uv_plane) = frame_out.split_at_mut(w * h);
        y_plane.par_chunks_mut(2 * w).zip(uv_plane.par_chunks_mut(w)).enumerate().for_each(|(by, (yrows, uvrow))| {
            let (y0, y1) = yrows.split_at_mut(w);
            let r0 = 2 * by * pitch;
            let r1 = r0 + pitch;
            let px = |p: usize, i: usize| color::to_8bit(src[p * plane + i].to_f32(), range);
            for bx in 0..w / 2 {
                let (a, b) = (r0 + 2 * bx, r1 + 2 * bx);
                let blk = color::convert_block(
                    &coeffs,
                    (px(0, a), px(0, a + 1), px(0, b), px(0, b + 1)),
                    (px(1, a), px(1, a + 1), px(1, b), px(1, b + 1)),
                    (px(2, a), px(2, a + 1), px(2, b), px(2, b + 1)),
                );
                y0[2 * bx] = blk.y.0;
                y0[2 * bx + 1] = blk.y.1;
                y1[2 * bx] = blk.y.2;
                y1[2 * bx + 1] = blk.y.3;
                uvrow[2 * bx] = blk.u;
                uvrow[2 * bx + 1] = blk.v;
            }
        });
    });
}
