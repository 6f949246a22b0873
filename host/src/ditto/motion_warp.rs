//! The `motion` infill of Ditto's frames: a keyframe's decoded crop moved to a frame's keypoints
//! by a dense 2-D flow interpolated from the 21 keypoints' displacements ([`motion_warp`]), with
//! no network between keyframes. Bilinear sampling, sixteen columns at a time with AVX-512
//! gathers where the CPU has them.

use rayon::prelude::*;

/// Variance of the keypoint weights, in normalised coordinates: the warping network's own
/// heatmap width (exp(−½‖p − kp‖²/0.01)).
const FLOW_VARIANCE: f32 = 0.01;

/// The `motion` infill: `crop` (planar 3 × side × side, decoded at keypoints `from`) moved to
/// keypoints `to` (both 21 × 3, x and y in the crop's normalised [−1, 1] coordinates, as the
/// warping network reads them). Backward warp: output pixel p samples the crop at p + u(p), where
/// u(p) = Σᵢ gᵢ(p)·(fromᵢ − toᵢ) / max(Σᵢ gᵢ(p), 1) and gᵢ(p) = exp(−½‖p − toᵢ‖²/0.01): near a
/// keypoint it moves as that keypoint did, between keypoints it blends their moves, far from all
/// of them (the weights sum below 1) it fades to no motion. Bilinear sampling, edges clamped.
pub fn motion_warp(crop: &[f32], side: usize, from: &[f32], to: &[f32]) -> Vec<f32> {
    assert_eq!(crop.len(), 3 * side * side);
    assert!(from.len() == to.len() && from.len().is_multiple_of(3));
    // The Gaussian is separable: gᵢ(x, y) = exp(−½(x − xᵢ)²/v)·exp(−½(y − yᵢ)²/v), so each
    // keypoint's factors are tabulated once per column and per row, and the per-pixel loop
    // multiplies instead of calling exp (21 × 2 × side exps per frame instead of 21 × side²).
    let s = side as f32;
    let centre = |i: usize| (2 * i + 1) as f32 / s - 1.0; // pixel centres, align_corners=False
    let kps: Vec<([f32; 2], [f32; 2])> =
        from.chunks_exact(3).zip(to.chunks_exact(3)).map(|(a, b)| ([b[0], b[1]], [a[0] - b[0], a[1] - b[1]])).collect();
    // Factors below 1e-18 are dropped: their products would fall below f32's normal range
    // (1.2e-38), where every multiply-add takes a microcode assist on x86, and a weight that
    // small moves no pixel by a measurable amount (the flow is normalised by max(Σg, 1)).
    let factor = |axis: usize| -> Vec<f32> {
        let mut t = Vec::with_capacity(kps.len() * side);
        for (p, _) in &kps {
            t.extend((0..side).map(|i| {
                let g = (-0.5 * (centre(i) - p[axis]).powi(2) / FLOW_VARIANCE).exp();
                if g < 1e-18 {
                    0.0
                } else {
                    g
                }
            }));
        }
        t
    };
    let (gx, gy) = (factor(0), factor(1));
    let moves: Vec<[f32; 2]> = kps.iter().map(|(_, d)| *d).collect();
    let cols: Vec<f32> = (0..side).map(centre).collect();
    let plane = side * side;
    let mut out = vec![0f32; crop.len()];
    let (r, rest) = out.split_at_mut(plane);
    let (g, b) = rest.split_at_mut(plane);
    r.par_chunks_mut(side).zip(g.par_chunks_mut(side)).zip(b.par_chunks_mut(side)).enumerate().for_each(
        |(y, ((ro, go), bo))| {
            let wy: Vec<f32> = (0..moves.len()).map(|i| gy[i * side + y]).collect();
            let row = FlowRow { crop, side, gx: &gx, wy: &wy, moves: &moves, cols: &cols, py: centre(y) };
            motion_warp_row(&row, ro, go, bo);
        },
    );
    out
}

/// What one output row of [`motion_warp`] reads.
struct FlowRow<'a> {
    /// The keyframe crop, planar 3 × side × side.
    crop: &'a [f32],
    side: usize,
    /// Each keypoint's column factors (keypoints × side) and its factor at this row.
    gx: &'a [f32],
    wy: &'a [f32],
    /// Each keypoint's displacement (from − to), x and y.
    moves: &'a [[f32; 2]],
    /// The column centres and this row's, in normalised coordinates.
    cols: &'a [f32],
    py: f32,
}

crate::backend::cpu::multiversion! {
    /// One output row of [`motion_warp`], compiled for the instruction set [`crate::backend::cpu::isa`]
    /// returns: the row's flow keypoint by keypoint over contiguous columns, then the bilinear
    /// samples into the three planes' rows.
    fn motion_warp_row(row: &FlowRow, ro: &mut [f32], go: &mut [f32], bo: &mut [f32]) => motion_warp_row_body
}

#[inline(always)]
fn motion_warp_row_body(row: &FlowRow, ro: &mut [f32], go: &mut [f32], bo: &mut [f32]) {
    let side = row.side;
    let s = side as f32;
    let (mut wsum, mut ux, mut uy) = (vec![0f32; side], vec![0f32; side], vec![0f32; side]);
    for ((d, &wy), gx) in row.moves.iter().zip(row.wy).zip(row.gx.chunks_exact(side)) {
        if wy == 0.0 {
            continue;
        }
        for (((gxv, ws), u), v) in gx.iter().zip(&mut wsum).zip(&mut ux).zip(&mut uy) {
            let w = gxv * wy;
            *ws += w;
            *u += w * d[0];
            *v += w * d[1];
        }
    }
    // Back to pixel coordinates of the source positions (reusing the flow's buffers).
    for (((ws, u), v), px) in wsum.iter().zip(&mut ux).zip(&mut uy).zip(row.cols) {
        let norm = ws.max(1.0);
        *u = ((px + *u / norm + 1.0) * s - 1.0) / 2.0;
        *v = ((row.py + *v / norm + 1.0) * s - 1.0) / 2.0;
    }
    sample_row(row.crop, side, &ux, &uy, ro, go, bo);
}

/// Bilinear samples of the three planes of `img` at the columns' source positions (`sx`, `sy`
/// in pixels): [`bilinear3`] per column, sixteen columns at a time with AVX-512 gathers where
/// the CPU has them (the loop does not vectorise by itself: every sample is a gather).
fn sample_row(img: &[f32], side: usize, sx: &[f32], sy: &[f32], ro: &mut [f32], go: &mut [f32], bo: &mut [f32]) {
    let n = sx.len();
    assert!(sy.len() == n && ro.len() == n && go.len() == n && bo.len() == n && img.len() == 3 * side * side);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::backend::cpu::isa() == crate::backend::cpu::Isa::Avx512 {
        // SAFETY: isa() reports AVX-512 only where the CPU has it; the lengths are checked above.
        done = unsafe { sample_row_avx512(img, side, sx, sy, ro, go, bo) };
    }
    for i in done..n {
        (ro[i], go[i], bo[i]) = bilinear3(img, side, sx[i], sy[i]);
    }
}

/// [`bilinear3`] for the first multiple of 16 columns, operation for operation (no fused
/// multiply-add), so the same bits; returns how many columns it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sample_row_avx512(
    img: &[f32],
    side: usize,
    sx: &[f32],
    sy: &[f32],
    ro: &mut [f32],
    go: &mut [f32],
    bo: &mut [f32],
) -> usize {
    use std::arch::x86_64::*;
    let plane = side * side;
    assert!(3 * plane <= i32::MAX as usize && img.len() == 3 * plane);
    let n = sx.len() / 16 * 16;
    assert!([sy.len(), ro.len(), go.len(), bo.len()].iter().all(|&l| l == sx.len()));
    let (max, one) = (_mm512_set1_ps((side - 1) as f32), _mm512_set1_ps(1.0));
    let (side_i, last, one_i) =
        (_mm512_set1_epi32(side as i32), _mm512_set1_epi32(side as i32 - 1), _mm512_set1_epi32(1));
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= the lengths of sx, sy, ro, go, bo (checked above), and
        // every gathered index is y * side + x with x, y clamped to [0, side - 1], inside a plane.
        unsafe {
            // max(v, 0) first: NaN becomes 0, as in bilinear3.
            let x = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(sx.as_ptr().add(i)), _mm512_setzero_ps()), max);
            let y = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(sy.as_ptr().add(i)), _mm512_setzero_ps()), max);
            let (x0, y0) = (_mm512_cvttps_epi32(x), _mm512_cvttps_epi32(y));
            let (x1, y1) = (
                _mm512_min_epi32(_mm512_add_epi32(x0, one_i), last),
                _mm512_min_epi32(_mm512_add_epi32(y0, one_i), last),
            );
            let (fx, fy) = (_mm512_sub_ps(x, _mm512_cvtepi32_ps(x0)), _mm512_sub_ps(y, _mm512_cvtepi32_ps(y0)));
            let (gx, gy) = (_mm512_sub_ps(one, fx), _mm512_sub_ps(one, fy));
            let (r0, r1) = (_mm512_mullo_epi32(y0, side_i), _mm512_mullo_epi32(y1, side_i));
            let (i00, i01, i10, i11) = (
                _mm512_add_epi32(r0, x0),
                _mm512_add_epi32(r0, x1),
                _mm512_add_epi32(r1, x0),
                _mm512_add_epi32(r1, x1),
            );
            for (c, out) in [&mut *ro, &mut *go, &mut *bo].into_iter().enumerate() {
                let p = img.as_ptr().add(c * plane);
                let g = |idx| _mm512_i32gather_ps::<4>(idx, p);
                let top = _mm512_add_ps(_mm512_mul_ps(g(i00), gx), _mm512_mul_ps(g(i01), fx));
                let bot = _mm512_add_ps(_mm512_mul_ps(g(i10), gx), _mm512_mul_ps(g(i11), fx));
                let v = _mm512_add_ps(_mm512_mul_ps(top, gy), _mm512_mul_ps(bot, fy));
                _mm512_storeu_ps(out.as_mut_ptr().add(i), v);
            }
        }
    }
    n
}

/// The three planes of `img` at (x, y) in pixels, bilinear, coordinates clamped to the image
/// (a NaN coordinate to 0).
#[inline(always)]
fn bilinear3(img: &[f32], side: usize, x: f32, y: f32) -> (f32, f32, f32) {
    let max = (side - 1) as f32;
    let (x, y) = (x.max(0.0).min(max), y.max(0.0).min(max));
    // Truncation is floor here: the coordinates are clamped to be non-negative.
    let (x0, y0) = (x as usize, y as usize);
    let (x1, y1) = ((x0 + 1).min(side - 1), (y0 + 1).min(side - 1));
    let (fx, fy) = (x - x0 as f32, y - y0 as f32);
    let plane = side * side;
    let (i00, i01, i10, i11) = (y0 * side + x0, y0 * side + x1, y1 * side + x0, y1 * side + x1);
    let at = |p: &[f32]| {
        let top = p[i00] * (1.0 - fx) + p[i01] * fx;
        let bot = p[i10] * (1.0 - fx) + p[i11] * fx;
        top * (1.0 - fy) + bot * fy
    };
    let (r, rest) = img.split_at(plane);
    let (g, b) = rest.split_at(plane);
    (at(r), at(g), at(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(side: usize) -> Vec<f32> {
        (0..3 * side * side)
            .map(|i| ((i % side) as f32 + 2.0 * ((i / side) % side) as f32) / (3.0 * side as f32))
            .collect()
    }

    #[test]
    fn motion_warp_without_motion_is_the_identity() {
        let side = 16;
        let img = gradient(side);
        let kp: Vec<f32> = (0..63).map(|i| ((i * 37) % 17) as f32 / 10.0 - 0.8).collect();
        let out = motion_warp(&img, side, &kp, &kp);
        for (a, b) in out.iter().zip(&img) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    /// Against the flow written directly (f64, one exp per keypoint and pixel), sampled by the
    /// same bilinear rule: the separable tabulation changes nothing but rounding.
    #[test]
    fn motion_warp_matches_the_direct_formula() {
        let side = 24;
        let img = gradient(side);
        let from: Vec<f32> = (0..63).map(|i| ((i * 37) % 23) as f32 / 12.0 - 0.9).collect();
        let to: Vec<f32> = from.iter().enumerate().map(|(i, v)| v + 0.05 * ((i as f32) * 0.7).sin()).collect();
        let out = motion_warp(&img, side, &from, &to);
        let s = side as f64;
        for y in 0..side {
            for x in 0..side {
                let (px, py) = ((2 * x + 1) as f64 / s - 1.0, (2 * y + 1) as f64 / s - 1.0);
                let (mut w, mut ux, mut uy) = (0.0, 0.0, 0.0);
                for k in 0..21 {
                    let (tx, ty) = (to[3 * k] as f64, to[3 * k + 1] as f64);
                    let g = (-0.5 * ((px - tx).powi(2) + (py - ty).powi(2)) / 0.01).exp();
                    w += g;
                    ux += g * (from[3 * k] - to[3 * k]) as f64;
                    uy += g * (from[3 * k + 1] - to[3 * k + 1]) as f64;
                }
                let n = w.max(1.0);
                let sx = ((px + ux / n + 1.0) * s - 1.0) / 2.0;
                let sy = ((py + uy / n + 1.0) * s - 1.0) / 2.0;
                let want = bilinear3(&img, side, sx as f32, sy as f32);
                let i = y * side + x;
                assert!((out[i] - want.0).abs() < 1e-4, "({x}, {y}): {} vs {}", out[i], want.0);
                assert!((out[2 * side * side + i] - want.2).abs() < 1e-4);
            }
        }
    }

    /// One keypoint moved by whole pixels: next to it the image moves with it, far away it stays.
    #[test]
    fn motion_warp_moves_near_keypoints_and_keeps_far_pixels() {
        let side = 64;
        let img = gradient(side);
        let mut from = vec![5.0f32; 63]; // all other keypoints far outside the crop
        let mut to = from.clone();
        // Keypoint 0 at the pixel centre (32, 32) in the frame, (28, 32) in the keyframe:
        // 4 pixels = 8/64 in normalised units.
        let c = |p: f32| (2.0 * p + 1.0) / side as f32 - 1.0;
        to[0..3].copy_from_slice(&[c(32.0), c(32.0), 0.0]);
        from[0..3].copy_from_slice(&[c(28.0), c(32.0), 0.0]);
        let out = motion_warp(&img, side, &from, &to);
        let px = |v: &[f32], x: usize, y: usize| v[y * side + x];
        assert!((px(&out, 32, 32) - px(&img, 28, 32)).abs() < 1e-5, "the keypoint's pixel came from 4 px left");
        assert!((px(&out, 2, 2) - px(&img, 2, 2)).abs() < 1e-6, "a far corner does not move");
    }
}
