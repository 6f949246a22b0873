//! 3x3 stride-1 convolutions by Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016), in NHWC.
//!
//! Each 2x2 block of output pixels (a tile) comes from a 4x4 input patch d: Y = Aᵀ[(G g Gᵀ) ⊙
//! (Bᵀ d B)]A. Over all channels the element-wise product becomes 16 matrix products, one per
//! position ξ of the 4x4 transformed tile: M_ξ (tiles x cout) = V_ξ (tiles x cin) U_ξ (cin x
//! cout). That is 16 multiply-adds per tile, channel pair, where im2col spends 4 x 9 = 36: 2.25x
//! fewer, paid for with the two transforms (additions only, O(tiles x channels)), so it wins
//! when the channel counts are large enough for the products to dominate.
//!
//! Numerics: B and A hold only 0 and ±1, G holds ±1/2, so the transforms add and subtract at
//! most four values per step; against the direct sum the error grows by a small constant factor
//! (measured in the tests against an f64 direct convolution, next to im2col's).

use crate::conv::{epilogue, gemm_st, Nhwc};
use crate::simd::simd_fn;
use rayon::prelude::*;
use std::cell::RefCell;

/// Tiles per task: the 16 V and 16 M blocks of a task (16 x TILES x (cin + cout) floats) stay in
/// the last-level cache, and each product has enough rows for the GEMM's micro-kernel.
const TILES: usize = 128;

/// The transformed weights of a 3x3 convolution: U_ξ = G g Gᵀ, stored `[ξ][ci][co]`.
#[derive(Debug, Clone)]
pub struct WinogradWeights {
    pub cin: usize,
    pub cout: usize,
    u: Vec<f32>,
}

impl WinogradWeights {
    /// From weights in PyTorch layout (cout, cin, 3, 3), transformed in f64. In parallel over
    /// the input channels, each into rows `[ξ][co]` of its own, then laid out `[ξ][ci][co]`: on one
    /// thread, with writes strided by `cout`, the full UNet's convolutions took about 10 s of its
    /// load (a `perf` profile of `examples/load_probe.rs`).
    pub fn new(cout: usize, cin: usize, w: &[f32]) -> WinogradWeights {
        assert_eq!(w.len(), cout * cin * 9, "winograd: weight length");
        const G: [[f64; 3]; 4] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]];
        // by_input[(i * 16 + ξ) * cout + o]
        let mut by_input = vec![0f32; 16 * cin * cout];
        by_input.par_chunks_mut(16 * cout).enumerate().for_each(|(i, rows)| {
            for o in 0..cout {
                let g = &w[(o * cin + i) * 9..(o * cin + i + 1) * 9];
                // (G g) is 4x3, then (G g) Gᵀ is 4x4.
                let mut gg = [[0f64; 3]; 4];
                for (r, row) in gg.iter_mut().enumerate() {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = (0..3).map(|k| G[r][k] * g[k * 3 + c] as f64).sum();
                    }
                }
                for r in 0..4 {
                    for c in 0..4 {
                        let v: f64 = (0..3).map(|k| gg[r][k] * G[c][k]).sum();
                        rows[(r * 4 + c) * cout + o] = v as f32;
                    }
                }
            }
        });
        let mut u = vec![0f32; 16 * cin * cout];
        u.par_chunks_mut(cin * cout).enumerate().for_each(|(xi, block)| {
            for (i, row) in block.chunks_exact_mut(cout).enumerate() {
                row.copy_from_slice(&by_input[(i * 16 + xi) * cout..(i * 16 + xi + 1) * cout]);
            }
        });
        WinogradWeights { cin, cout, u }
    }
}

thread_local! {
    /// The current worker's V and M blocks, kept between tasks and layers.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// y = conv3x3(upsample2?(x)) + bias (+ residual), then ReLU if `relu`: stride 1, padding 1,
/// the same contract as [`crate::conv::conv3x3`].
///
/// Tiles are counted across the batch: a task takes about 128 tiles (`TILES`) in whole rows of tiles,
/// which may span images. At the UNet's 4x4 and 8x8 levels (1280 channels, 4 and 16 tiles an
/// image) a task per image multiplied 4-16 rows by the whole of U (105 MB at 1280 channels) once
/// per image; across the batch U is read once a layer. When there are fewer tasks than threads,
/// the 16 products of a task run in parallel instead.
pub fn conv3x3(
    x: &Nhwc,
    p: &WinogradWeights,
    bias: Option<&[f32]>,
    upsample: bool,
    residual: Option<&Nhwc>,
    relu: bool,
) -> Nhwc {
    assert_eq!(x.c, p.cin, "winograd conv3x3: channel mismatch");
    let (oh, ow) = if upsample { (2 * x.h, 2 * x.w) } else { (x.h, x.w) };
    let cout = p.cout;
    if let Some(r) = residual {
        assert_eq!((r.n, r.h, r.w, r.c), (x.n, oh, ow, cout), "winograd conv3x3: residual shape");
    }
    let geo = Geometry { oh, ow, tiles_y: oh.div_ceil(2), tiles_x: ow.div_ceil(2), upsample };
    let tile_rows = (TILES / geo.tiles_x).max(1);
    let all_rows = x.n * geo.tiles_y;
    // Each task's output is a contiguous run of whole output rows: the rows of its tile rows.
    let mut out = vec![0f32; x.n * oh * ow * cout];
    let mut tasks = Vec::with_capacity(all_rows.div_ceil(tile_rows));
    let mut rest = &mut out[..];
    for r0 in (0..all_rows).step_by(tile_rows) {
        let r1 = (r0 + tile_rows).min(all_rows);
        let (dst, tail) = rest.split_at_mut((geo.row_start(r1) - geo.row_start(r0)) * ow * cout);
        rest = tail;
        tasks.push((r0..r1, dst));
    }
    let nested = tasks.len() < rayon::current_num_threads();
    tasks.into_par_iter().for_each(|(rows, dst)| {
        let o0 = geo.row_start(rows.start) * ow * cout;
        if nested {
            // Few tasks: buffers of the task's own (the thread-local ones could be borrowed again
            // by a task this thread steals while it waits for the products).
            let n_tiles = rows.len() * geo.tiles_x;
            let (mut v, mut m) = (vec![0f32; 16 * n_tiles * p.cin], vec![0f32; 16 * n_tiles * cout]);
            task(x, p, &geo, rows, dst, &mut v, &mut m, true);
        } else {
            SCRATCH.with_borrow_mut(|(v, m)| task(x, p, &geo, rows, dst, v, m, false));
        }
        let res = residual.map(|r| &r.data[o0..o0 + dst.len()]);
        epilogue(dst, cout, bias, res, relu);
    });
    Nhwc { n: x.n, h: oh, w: ow, c: cout, data: out }
}

/// Output size and tiling of one convolution.
struct Geometry {
    oh: usize,
    ow: usize,
    tiles_y: usize,
    tiles_x: usize,
    upsample: bool,
}

impl Geometry {
    /// The first output row (counted across the batch) of global tile row `r`; rows of tiles are
    /// numbered image after image, so consecutive tile rows own consecutive output rows.
    fn row_start(&self, r: usize) -> usize {
        (r / self.tiles_y) * self.oh + 2 * (r % self.tiles_y)
    }
}

/// One task: the tiles of global tile rows `rows`, transformed into `v`, multiplied into `m`
/// (the 16 products in parallel when `parallel`), transformed back into `dst`.
#[allow(clippy::too_many_arguments)]
fn task(
    x: &Nhwc,
    p: &WinogradWeights,
    geo: &Geometry,
    rows: std::ops::Range<usize>,
    dst: &mut [f32],
    v: &mut Vec<f32>,
    m: &mut Vec<f32>,
    parallel: bool,
) {
    let (cin, cout, tiles_x) = (p.cin, p.cout, geo.tiles_x);
    let n_tiles = rows.len() * tiles_x;
    v.resize(v.len().max(16 * n_tiles * cin), 0.0);
    m.resize(m.len().max(16 * n_tiles * cout), 0.0);
    let (v, m) = (&mut v[..16 * n_tiles * cin], &mut m[..16 * n_tiles * cout]);
    let zeros = vec![0f32; cin];
    let img_in = x.h * x.w * cin;
    let base = geo.row_start(rows.start);
    for tile in 0..n_tiles {
        let r = rows.start + tile / tiles_x;
        let (b, ty, tx) = (r / geo.tiles_y, r % geo.tiles_y, tile % tiles_x);
        let src = &x.data[b * img_in..(b + 1) * img_in];
        // The 16 input pixels of the patch (zeros outside the image; nearest x2 upsampling folded
        // into the index).
        let patch: [&[f32]; 16] = std::array::from_fn(|k| {
            let iy = (2 * ty + k / 4) as isize - 1;
            let ix = (2 * tx + k % 4) as isize - 1;
            if iy < 0 || ix < 0 || iy >= geo.oh as isize || ix >= geo.ow as isize {
                return &zeros[..];
            }
            let (sy, sx) = if geo.upsample { (iy as usize / 2, ix as usize / 2) } else { (iy as usize, ix as usize) };
            let s = (sy * x.w + sx) * cin;
            &src[s..s + cin]
        });
        input_transform(v, &patch, tile, n_tiles, cin);
    }
    let product = |xi: usize, mx: &mut [f32]| {
        // SAFETY: M_ξ is n_tiles x cout, V_ξ n_tiles x cin, U_ξ cin x cout, all row-major inside
        // their buffers; `mx` is M_ξ alone.
        unsafe {
            gemm_st(
                n_tiles,
                cout,
                cin,
                mx.as_mut_ptr(),
                cout,
                v.as_ptr().add(xi * n_tiles * cin),
                cin,
                1,
                p.u.as_ptr().add(xi * cin * cout),
                cout,
                1,
                1.0,
            )
        };
    };
    if parallel {
        m.par_chunks_mut(n_tiles * cout).enumerate().for_each(|(xi, mx)| product(xi, mx));
    } else {
        m.chunks_mut(n_tiles * cout).enumerate().for_each(|(xi, mx)| product(xi, mx));
    }
    for tile in 0..n_tiles {
        let r = rows.start + tile / tiles_x;
        let (ty, tx) = (r % geo.tiles_y, tile % tiles_x);
        // The tile's rows in `dst`, clipped at its image's last row.
        let y0 = geo.row_start(r) - base;
        let valid = (geo.oh - 2 * ty).min(2);
        output_transform(dst, m, tile, n_tiles, cout, (y0, 2 * tx), (y0 + valid, geo.ow));
    }
}

/// Channels per step of the transforms: one 16-float vector per patch position.
const LANES: usize = 16;

simd_fn! {
    /// V_ξ[tile] = (Bᵀ d B)_ξ for every channel of the tile's 4x4 patch `d`.
    fn input_transform(v: &mut [f32], d: &[&[f32]; 16], tile: usize, n_tiles: usize, cin: usize) {
        let mut c0 = 0;
        while c0 < cin {
            let l = LANES.min(cin - c0);
            let mut e = [[0f32; LANES]; 16];
            for (k, ek) in e.iter_mut().enumerate() {
                ek[..l].copy_from_slice(&d[k][c0..c0 + l]);
            }
            // Bᵀ d: rows r0 - r2, r1 + r2, r2 - r1, r1 - r3 (lane by lane).
            let mut t = [[0f32; LANES]; 16];
            for k in 0..4 {
                for j in 0..LANES {
                    t[k][j] = e[k][j] - e[8 + k][j];
                    t[4 + k][j] = e[4 + k][j] + e[8 + k][j];
                    t[8 + k][j] = e[8 + k][j] - e[4 + k][j];
                    t[12 + k][j] = e[4 + k][j] - e[12 + k][j];
                }
            }
            // (Bᵀ d) B: the same on the columns.
            let mut u = [[0f32; LANES]; 16];
            for r in 0..4 {
                for j in 0..LANES {
                    u[r * 4][j] = t[r * 4][j] - t[r * 4 + 2][j];
                    u[r * 4 + 1][j] = t[r * 4 + 1][j] + t[r * 4 + 2][j];
                    u[r * 4 + 2][j] = t[r * 4 + 2][j] - t[r * 4 + 1][j];
                    u[r * 4 + 3][j] = t[r * 4 + 1][j] - t[r * 4 + 3][j];
                }
            }
            for (xi, ux) in u.iter().enumerate() {
                let o = (xi * n_tiles + tile) * cin + c0;
                v[o..o + l].copy_from_slice(&ux[..l]);
            }
            c0 += l;
        }
    }
}

simd_fn! {
    /// The 2x2 output pixels of `tile` (those inside the band's `rows` x `ow`), Aᵀ M A, from its
    /// 16 products, into the NHWC band `dst`.
    fn output_transform(dst: &mut [f32], m: &[f32], tile: usize, n_tiles: usize, cout: usize, at: (usize, usize), band: (usize, usize)) {
        let (y0, x0) = at;
        let (rows, ow) = band;
        let px = |dy: usize, dx: usize| (y0 + dy < rows && x0 + dx < ow).then(|| ((y0 + dy) * ow + x0 + dx) * cout);
        let pos = [px(0, 0), px(0, 1), px(1, 0), px(1, 1)];
        let mut c0 = 0;
        while c0 < cout {
            let l = LANES.min(cout - c0);
            let mut e = [[0f32; LANES]; 16];
            for (k, ek) in e.iter_mut().enumerate() {
                let o = (k * n_tiles + tile) * cout + c0;
                ek[..l].copy_from_slice(&m[o..o + l]);
            }
            // Aᵀ M: rows m0 + m1 + m2 and m1 - m2 - m3; then the same on the columns.
            let mut s = [[0f32; LANES]; 8];
            for k in 0..4 {
                for j in 0..LANES {
                    s[k][j] = e[k][j] + e[4 + k][j] + e[8 + k][j];
                    s[4 + k][j] = e[4 + k][j] - e[8 + k][j] - e[12 + k][j];
                }
            }
            let mut y = [[0f32; LANES]; 4];
            for r in 0..2 {
                for j in 0..LANES {
                    y[r * 2][j] = s[r * 4][j] + s[r * 4 + 1][j] + s[r * 4 + 2][j];
                    y[r * 2 + 1][j] = s[r * 4 + 1][j] - s[r * 4 + 2][j] - s[r * 4 + 3][j];
                }
            }
            for (p, yv) in pos.iter().zip(&y) {
                if let Some(p) = p {
                    dst[p + c0..p + c0 + l].copy_from_slice(&yv[..l]);
                }
            }
            c0 += l;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::reference::{lcg, reference};
    use crate::conv::{self, PackedConv};

    /// Against the f64 direct convolution, at sizes with partial tiles (odd heights and widths),
    /// one tile, several tasks, upsampling, residual and ReLU; the error stays within a small
    /// multiple of im2col's on the same data.
    #[test]
    fn matches_direct_convolution_in_f64() {
        let cases = [
            // (n, h, w, cin, cout, upsample, residual, relu)
            (1, 1, 1, 3, 5, false, false, false),
            (2, 5, 7, 16, 24, false, true, false),
            (1, 9, 3, 8, 8, true, false, true),
            (1, 34, 37, 32, 40, false, true, true),
            (1, 17, 300, 12, 20, false, false, false),
            (2, 6, 5, 64, 48, true, true, false),
            // Tasks whose tile rows span images: one task for all three images; tasks of three
            // tile rows over images of four (an odd height: each image's last row is half a tile).
            (3, 7, 6, 16, 8, false, true, true),
            (2, 7, 80, 8, 8, false, true, false),
        ];
        // One thread (the products in turn) and four (more threads than tasks: the products in
        // parallel, on buffers of the task's own).
        for threads in [1, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| check_cases(&cases));
        }
    }

    #[allow(clippy::type_complexity)]
    fn check_cases(cases: &[(usize, usize, usize, usize, usize, bool, bool, bool)]) {
        for (i, &(n, h, w, cin, cout, up, res, relu)) in cases.iter().enumerate() {
            let x = Nhwc { n, h, w, c: cin, data: lcg(10 + i as u64, n * h * w * cin) };
            let wt = lcg(20 + i as u64, cout * cin * 9);
            let bias = lcg(30 + i as u64, cout);
            let (oh, ow) = if up { (2 * h, 2 * w) } else { (h, w) };
            let r = res.then(|| Nhwc { n, h: oh, w: ow, c: cout, data: lcg(40 + i as u64, n * oh * ow * cout) });
            let want = reference(&x, &wt, &bias, up, r.as_ref(), relu);
            let got = conv3x3(&x, &WinogradWeights::new(cout, cin, &wt), Some(&bias), up, r.as_ref(), relu);
            let im2col =
                conv::conv3x3(&x, &PackedConv::im2col(cout, cin, &wt, Some(bias.clone()), 1), up, r.as_ref(), relu);
            assert_eq!((got.n, got.h, got.w, got.c), (n, oh, ow, cout));
            let err = |v: &[f32]| v.iter().zip(&want).fold(0f64, |a, (g, w)| a.max((*g as f64 - w).abs()));
            let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
            let (e_w, e_i) = (err(&got.data), err(&im2col.data));
            assert!(
                e_w <= 1e-5 * scale.max(1.0) && e_w <= 8.0 * e_i.max(1e-7),
                "case {i}: winograd error {e_w}, im2col {e_i}, scale {scale}"
            );
        }
    }

    /// `PackedConv::new` picks Winograd from the channel threshold on, for stride 1 only, and
    /// `conv::conv3x3` then runs it (against the f64 reference).
    #[test]
    fn packed_convs_from_the_threshold_on_run_winograd() {
        let c = crate::conv::winograd_min_channels();
        let w = |co: usize, ci: usize| lcg(co as u64, co * ci * 9);
        assert!(PackedConv::new(c, c, &w(c, c), None, 1).winograd.is_some());
        assert!(PackedConv::new(c, c, &w(c, c), None, 2).winograd.is_none());
        assert!(PackedConv::new(c - 1, c, &w(c - 1, c), None, 1).winograd.is_none());
        assert!(PackedConv::new(c, c - 1, &w(c, c - 1), None, 1).winograd.is_none());
        let (wt, bias) = (w(c, c), lcg(7, c));
        let x = Nhwc { n: 1, h: 3, w: 5, c, data: lcg(8, 15 * c) };
        let p = PackedConv::new(c, c, &wt, Some(bias.clone()), 1);
        assert!(p.w.is_empty(), "the im2col packing is not kept beside the Winograd weights");
        let got = conv::conv3x3(&x, &p, false, None, true);
        let want = reference(&x, &wt, &bias, false, None, true);
        let err = got.data.iter().zip(&want).fold(0f64, |a, (g, w)| a.max((*g as f64 - w).abs()));
        assert!(err < 1e-4, "error {err}");
    }
}
