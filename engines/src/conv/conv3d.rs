//! CPU 3-D convolution in NDHWC layout, for Ditto's networks (LivePortrait's appearance feature
//! extractor and warping network convolve a (C, 16, 64, 64) feature volume with `nn.Conv3d`:
//! stride 1, kernels 3x3x3 with padding 1, 7x7x7 with padding 3, and 1x1x1).
//!
//! candle 0.11 has no Conv3d. This is [`crate::conv`]'s scheme in one more dimension: activations
//! channels-last, an im2col tile of output voxels built in cache (zeros where a tap falls in the
//! padding), multiplied with the packed weights by the `gemm` crate, bias and ReLU applied while
//! the tile is hot; tiles in parallel on rayon.

use crate::conv::{copy, epilogue, gemm_st, gemm_st_into};
use crate::simd::simd_fn;
use rayon::prelude::*;

/// Activations, NDHWC, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Ndhwc {
    pub n: usize,
    pub d: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub data: Vec<f32>,
}

impl Ndhwc {
    /// From NCDHW data (PyTorch's layout).
    pub fn from_ncdhw(n: usize, c: usize, d: usize, h: usize, w: usize, src: &[f32]) -> Ndhwc {
        let vox = d * h * w;
        assert_eq!(src.len(), n * c * vox, "from_ncdhw: length");
        let mut data = vec![0f32; src.len()];
        data.par_chunks_mut(vox * c).enumerate().for_each(|(b, dst)| {
            let s = &src[b * c * vox..(b + 1) * c * vox];
            for ch in 0..c {
                for p in 0..vox {
                    dst[p * c + ch] = s[ch * vox + p];
                }
            }
        });
        Ndhwc { n, d, h, w, c, data }
    }

    /// To NCDHW data.
    pub fn to_ncdhw(&self) -> Vec<f32> {
        let (vox, c) = (self.d * self.h * self.w, self.c);
        let mut out = vec![0f32; self.data.len()];
        out.par_chunks_mut(vox * c).enumerate().for_each(|(b, dst)| {
            let s = &self.data[b * vox * c..(b + 1) * vox * c];
            for p in 0..vox {
                for ch in 0..c {
                    dst[ch * vox + p] = s[p * c + ch];
                }
            }
        });
        out
    }
}

/// A stride-1 3-D convolution with weights packed as `[((kz*kh + ky)*kw + kx)*cin + ci][cout]`.
#[derive(Debug, Clone)]
pub struct PackedConv3d {
    pub cin: usize,
    pub cout: usize,
    /// Kernel size (depth, height, width).
    pub kernel: [usize; 3],
    /// Zero padding on each side (depth, height, width).
    pub pad: [usize; 3],
    pub w: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

impl PackedConv3d {
    /// `w` in PyTorch layout (cout, cin, kd, kh, kw).
    pub fn new(
        cout: usize,
        cin: usize,
        kernel: [usize; 3],
        pad: [usize; 3],
        w: &[f32],
        bias: Option<Vec<f32>>,
    ) -> Self {
        let taps = kernel.iter().product::<usize>();
        assert!(taps > 0, "conv3d: empty kernel {kernel:?}");
        assert_eq!(w.len(), cout * cin * taps, "conv3d: weight length");
        if let Some(b) = &bias {
            assert_eq!(b.len(), cout, "conv3d: bias length");
        }
        let mut p = vec![0f32; taps * cin * cout];
        for o in 0..cout {
            for i in 0..cin {
                for t in 0..taps {
                    p[(t * cin + i) * cout + o] = w[(o * cin + i) * taps + t];
                }
            }
        }
        PackedConv3d { cin, cout, kernel, pad, w: p, bias }
    }

    /// The output's (depth, height, width) for an input of `dhw`; None where the kernel does not
    /// fit in the padded input.
    pub fn output_dims(&self, dhw: [usize; 3]) -> Option<[usize; 3]> {
        let dim = |i: usize| (dhw[i] + 2 * self.pad[i] + 1).checked_sub(self.kernel[i]).filter(|&o| o > 0);
        Some([dim(0)?, dim(1)?, dim(2)?])
    }
}

/// Floats of one im2col tile (1 MiB): a tile holds as many output voxels as fit, so a 7x7x7
/// kernel over many channels still gets a tile that stays in cache, and a 1x1x1 one a large
/// GEMM.
const TILE_FLOATS: usize = 1 << 18;

thread_local! {
    /// The im2col tile of the current rayon worker, kept between tiles and layers (see crate::conv).
    static COL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How [`conv3d_via`] computes a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv3dPath {
    /// Tiles of output voxels gathered into im2col rows in cache, one GEMM per tile.
    Im2col,
    /// No im2col copy: GEMMs read a zero-padded copy of the input in place, `rows` output rows
    /// at a time (the row path, engines/README.md).
    Rows { rows: usize },
}

/// Output voxels per im2col tile below which the im2col path is not used: a 7x7x7 kernel over
/// 142 channels (LivePortrait's mask conv, k = 48,706) fits 5 voxels in a tile, and a GEMM of 5
/// rows re-reads its whole 4 MB weight matrix for every 5 voxels.
const MIN_TILE_VOXELS: usize = 64;

/// GEMM rows the row path aims for per task (rounded to whole padded rows): enough for the
/// `gemm` crate's register blocking to run at full rate, few enough that a (16, 64, 64)
/// volume still splits into many tasks.
const ROWS_PATH_M: usize = 384;

/// The path [`conv3d`] takes. The row path computes `kw − 1` padding columns per padded row
/// for nothing, so it is taken where they are at most a quarter of the row (or where im2col
/// tiles would be too small). `engines/examples/conv3d_probe.rs` times both at the cpu-reduced
/// warping network's layers; engines/README.md gives the figures (the row path 1.2-4x faster).
pub fn path_for(x: [usize; 3], p: &PackedConv3d) -> Conv3dPath {
    let taps = p.kernel.iter().product::<usize>();
    let padded_w = x[2] + 2 * p.pad[2];
    let tiles_too_small = TILE_FLOATS / (taps * p.cin) < MIN_TILE_VOXELS;
    let little_padding_work = taps > 1 && 4 * (p.kernel[2] - 1) <= padded_w;
    if tiles_too_small || little_padding_work {
        Conv3dPath::Rows { rows: ROWS_PATH_M.div_ceil(padded_w) }
    } else {
        Conv3dPath::Im2col
    }
}

/// y = conv3d(x) + bias, then ReLU if `relu`.
pub fn conv3d(x: &Ndhwc, p: &PackedConv3d, relu: bool) -> Ndhwc {
    conv3d_via(x, p, relu, path_for([x.d, x.h, x.w], p))
}

/// [`conv3d`] by a chosen path (every path gives the same result up to rounding).
pub fn conv3d_via(x: &Ndhwc, p: &PackedConv3d, relu: bool, path: Conv3dPath) -> Ndhwc {
    assert_eq!(x.c, p.cin, "conv3d: channel mismatch");
    let Some(out) = p.output_dims([x.d, x.h, x.w]) else {
        panic!("conv3d: kernel {:?} with padding {:?} does not fit a {}x{}x{} input", p.kernel, p.pad, x.d, x.h, x.w)
    };
    match path {
        Conv3dPath::Im2col => conv3d_im2col(x, p, relu, out),
        Conv3dPath::Rows { rows } => conv3d_rows(x, p, relu, out, rows),
    }
}

/// The im2col path: tiles of output voxels gathered in cache, one GEMM each.
fn conv3d_im2col(x: &Ndhwc, p: &PackedConv3d, relu: bool, [od, oh, ow]: [usize; 3]) -> Ndhwc {
    let (cin, cout) = (p.cin, p.cout);
    let k = p.kernel.iter().product::<usize>() * cin;
    let tile = (TILE_FLOATS / k).clamp(1, od * oh * ow);
    let img_in = x.d * x.h * x.w * cin;
    let img_out = od * oh * ow * cout;
    let mut out = vec![0f32; x.n * img_out];
    let geom = Geometry { in_dhw: [x.d, x.h, x.w], out_hw: [oh, ow], cin, kernel: p.kernel, pad: p.pad };
    out.par_chunks_mut(img_out).enumerate().for_each(|(b, oimg)| {
        let src = &x.data[b * img_in..(b + 1) * img_in];
        oimg.par_chunks_mut(tile * cout).enumerate().for_each(|(t, dst)| {
            let npix = dst.len() / cout;
            COL.with_borrow_mut(|col| {
                // Every element is written by the gather (padding taps are zero-filled).
                col.resize(col.len().max(npix * k), 0.0);
                let col = &mut col[..npix * k];
                gather3d(col, src, &geom, t * tile);
                // SAFETY: dst is npix x cout, col npix x k, w k x cout, all row-major, exactly
                // that long and disjoint.
                unsafe {
                    gemm_st(npix, cout, k, dst.as_mut_ptr(), cout, col.as_ptr(), k, 1, p.w.as_ptr(), cout, 1, 1.0)
                };
            });
            epilogue(dst, cout, p.bias.as_deref(), None, relu);
        });
    });
    Ndhwc { n: x.n, d: od, h: oh, w: ow, c: cout, data: out }
}

/// The row path: the input is zero-padded once, and a task of `rows` output rows of one depth
/// slice accumulates one GEMM per (kz, ky) tap pair whose input slice is not padding. The GEMM
/// reads the padded input in place: in padded coordinates, output voxel (oy, ox) needs the
/// kw·cin contiguous values from padded voxel (oy + ky, ox) on, which is `q·cin` floats past the
/// task's first row for q = oy·zw + ox. So the left matrix is the padded volume itself with a
/// row stride of cin (overlapping windows), k = kw·cin, and q runs over whole padded rows: the
/// kw − 1 results per row that fall in the padding are computed into a scratch and dropped.
fn conv3d_rows(x: &Ndhwc, p: &PackedConv3d, relu: bool, [od, oh, ow]: [usize; 3], rows: usize) -> Ndhwc {
    let ([kd, kh, kw], [pd, ph, pw]) = (p.kernel, p.pad);
    let (cin, cout) = (p.cin, p.cout);
    let [zd, zh, zw] = [x.d + 2 * pd, x.h + 2 * ph, x.w + 2 * pw];
    let (img_in, img_out) = (x.d * x.h * x.w * cin, od * oh * ow * cout);
    let rows = rows.clamp(1, oh);
    let tasks_per_slice = oh.div_ceil(rows);
    let mut out = vec![0f32; x.n * img_out];
    for (b, oimg) in out.chunks_mut(img_out).enumerate() {
        let src = &x.data[b * img_in..(b + 1) * img_in];
        let mut padded = vec![0f32; zd * zh * zw * cin];
        padded.par_chunks_mut(zw * cin).enumerate().for_each(|(row, dst)| {
            let (z, y) = (row / zh, row % zh);
            if z >= pd && z < pd + x.d && y >= ph && y < ph + x.h {
                let s = ((z - pd) * x.h + (y - ph)) * x.w * cin;
                dst[pw * cin..(pw + x.w) * cin].copy_from_slice(&src[s..s + x.w * cin]);
            }
        });
        // Tasks never straddle a depth slice: chunks of `rows` rows, the last of a slice shorter.
        let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::with_capacity(od * tasks_per_slice);
        for (oz, slice) in oimg.chunks_mut(oh * ow * cout).enumerate() {
            for (t, dst) in slice.chunks_mut(rows * ow * cout).enumerate() {
                tasks.push((oz, t * rows, dst));
            }
        }
        tasks.into_par_iter().for_each(|(oz, oy0, dst)| {
            let nrows = dst.len() / (ow * cout);
            // GEMM rows: whole padded rows but the last, which stops at its ow-th voxel.
            let m = (nrows - 1) * zw + ow;
            COL.with_borrow_mut(|acc| {
                acc.resize(acc.len().max(m * cout), 0.0);
                let acc = &mut acc[..m * cout];
                let mut accumulate = false;
                for kz in (0..kd).filter(|kz| (pd..pd + x.d).contains(&(oz + kz))) {
                    for ky in 0..kh {
                        let lhs = &padded[((oz + kz) * zh + oy0 + ky) * zw * cin..];
                        let rhs = &p.w[(kz * kh + ky) * kw * cin * cout..][..kw * cin * cout];
                        // SAFETY: acc is m x cout; lhs row q reads [q·cin, (q + kw)·cin), whose
                        // end for q = m − 1 is ((nrows − 1)·zw + ow − 1 + kw)·cin =
                        // nrows·zw·cin past the row (oy0 + ky), inside the padded slice since
                        // oy0 + nrows + ky <= oh + kh − 1 = zh; rhs is kw·cin x cout; acc is
                        // disjoint from both.
                        unsafe {
                            gemm_st_into(
                                m,
                                cout,
                                kw * cin,
                                acc.as_mut_ptr(),
                                cout,
                                lhs.as_ptr(),
                                cin,
                                1,
                                rhs.as_ptr(),
                                cout,
                                1,
                                1.0,
                                accumulate,
                            )
                        };
                        accumulate = true;
                    }
                }
                // A slice whose every tap is padding (kd > d + pd) is the bias alone.
                if !accumulate {
                    acc.fill(0.0);
                }
                for (r, d) in dst.chunks_mut(ow * cout).enumerate() {
                    d.copy_from_slice(&acc[r * zw * cout..][..ow * cout]);
                }
            });
            epilogue(dst, cout, p.bias.as_deref(), None, relu);
        });
    }
    Ndhwc { n: x.n, d: od, h: oh, w: ow, c: cout, data: out }
}

/// What the gather needs to know of a convolution.
struct Geometry {
    in_dhw: [usize; 3],
    out_hw: [usize; 2],
    cin: usize,
    kernel: [usize; 3],
    pad: [usize; 3],
}

simd_fn! {
    /// The im2col rows of the output voxels from `v0` on (in D, H, W order): per voxel,
    /// kd x kh x kw taps of `cin` values, zeros where a tap lies in the padding.
    fn gather3d(col: &mut [f32], src: &[f32], g: &Geometry, v0: usize) {
        let [id, ih, iw] = g.in_dhw;
        let [oh, ow] = g.out_hw;
        let [kd, kh, kw] = g.kernel;
        let [pd, ph, pw] = g.pad;
        let cin = g.cin;
        let row = kw * cin;
        for (q, colrow) in col.chunks_mut(kd * kh * row).enumerate() {
            let v = v0 + q;
            let (oz, oy, ox) = (v / (oh * ow), v / ow % oh, v % ow);
            for kz in 0..kd {
                let iz = (oz + kz) as isize - pd as isize;
                for ky in 0..kh {
                    let iy = (oy + ky) as isize - ph as isize;
                    let taps = &mut colrow[(kz * kh + ky) * row..(kz * kh + ky + 1) * row];
                    if iz < 0 || iz >= id as isize || iy < 0 || iy >= ih as isize {
                        taps.fill(0.0);
                        continue;
                    }
                    let line = (iz as usize * ih + iy as usize) * iw;
                    // The whole row of taps inside the input: one contiguous copy.
                    if ox >= pw && ox + kw <= iw + pw {
                        let s = (line + ox - pw) * cin;
                        copy(taps, &src[s..s + row]);
                        continue;
                    }
                    for kx in 0..kw {
                        let ix = (ox + kx) as isize - pw as isize;
                        let d = &mut taps[kx * cin..(kx + 1) * cin];
                        if ix < 0 || ix >= iw as isize {
                            d.fill(0.0);
                        } else {
                            let s = (line + ix as usize) * cin;
                            copy(d, &src[s..s + cin]);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }

    /// PyTorch's Conv3d (stride 1, zero padding) written out directly in f64 on NCDHW data.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        x: &[f32],
        [n, cin, d, h, w]: [usize; 5],
        wt: &[f32],
        cout: usize,
        [kd, kh, kw]: [usize; 3],
        [pd, ph, pw]: [usize; 3],
        bias: Option<&[f32]>,
    ) -> (Vec<f64>, [usize; 3]) {
        let (od, oh, ow) = (d + 2 * pd + 1 - kd, h + 2 * ph + 1 - kh, w + 2 * pw + 1 - kw);
        let mut out = vec![0f64; n * cout * od * oh * ow];
        for b in 0..n {
            for o in 0..cout {
                for z in 0..od {
                    for y in 0..oh {
                        for xo in 0..ow {
                            let mut acc = bias.map_or(0.0, |bs| bs[o] as f64);
                            for i in 0..cin {
                                for a in 0..kd {
                                    for c in 0..kh {
                                        for e in 0..kw {
                                            let (iz, iy, ix) = (
                                                (z + a) as isize - pd as isize,
                                                (y + c) as isize - ph as isize,
                                                (xo + e) as isize - pw as isize,
                                            );
                                            if iz < 0
                                                || iy < 0
                                                || ix < 0
                                                || iz >= d as isize
                                                || iy >= h as isize
                                                || ix >= w as isize
                                            {
                                                continue;
                                            }
                                            let xv = x[(((b * cin + i) * d + iz as usize) * h + iy as usize) * w
                                                + ix as usize]
                                                as f64;
                                            let wv = wt[(((o * cin + i) * kd + a) * kh + c) * kw + e] as f64;
                                            acc += xv * wv;
                                        }
                                    }
                                }
                            }
                            out[(((b * cout + o) * od + z) * oh + y) * ow + xo] = acc;
                        }
                    }
                }
            }
        }
        (out, [od, oh, ow])
    }

    fn check(shape: [usize; 5], cout: usize, kernel: [usize; 3], pad: [usize; 3], bias: bool, relu: bool) {
        let [n, cin, d, h, w] = shape;
        let x = data(n * cin * d * h * w, 1);
        let wt = data(cout * cin * kernel.iter().product::<usize>(), 2);
        let b = bias.then(|| data(cout, 3));
        let (want, [od, oh, ow]) = reference(&x, shape, &wt, cout, kernel, pad, b.as_deref());
        let p = PackedConv3d::new(cout, cin, kernel, pad, &wt, b);
        assert_eq!(p.output_dims([d, h, w]), Some([od, oh, ow]));
        let input = Ndhwc::from_ncdhw(n, cin, d, h, w, &x);
        // Every path, whichever conv3d would pick for this size: row tasks of one row, of
        // several (the last of a slice shorter) and of a whole slice.
        let paths = [
            Conv3dPath::Im2col,
            Conv3dPath::Rows { rows: 1 },
            Conv3dPath::Rows { rows: 2 },
            Conv3dPath::Rows { rows: oh },
        ];
        for path in paths {
            let got = conv3d_via(&input, &p, relu, path);
            assert_eq!((got.n, got.d, got.h, got.w, got.c), (n, od, oh, ow, cout));
            let got = got.to_ncdhw();
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let w = if relu { w.max(0.0) } else { *w };
                assert!(
                    (*g as f64 - w).abs() <= 1e-5 * scale.max(1.0),
                    "{path:?}: {shape:?} k{kernel:?} p{pad:?}: element {i}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn matches_a_direct_f64_convolution() {
        // LivePortrait's shapes, narrowed: 3x3x3 with padding 1, with bias and ReLU.
        check([2, 3, 4, 5, 6], 5, [3, 3, 3], [1, 1, 1], true, true);
        // 1x1x1 (a per-voxel linear map), no bias.
        check([1, 4, 3, 2, 5], 3, [1, 1, 1], [0, 0, 0], false, false);
        // The 7x7x7 mask conv with padding 3, on a volume smaller than the kernel: most taps pad.
        check([1, 2, 2, 5, 4], 3, [7, 7, 7], [3, 3, 3], true, false);
        // A kernel that differs per axis, padding on some axes only (no output is padding-free).
        check([1, 3, 5, 4, 7], 2, [3, 1, 5], [0, 0, 2], true, false);
        // Many channels: k = 27 * 200 floats, so a tile holds 48 of the 189 output voxels and
        // tiles end inside depth slices (63 voxels each).
        check([1, 200, 3, 7, 9], 2, [3, 3, 3], [1, 1, 1], true, false);
        // Depth padding wider than the kernel: the outer output slices see only padding.
        check([1, 2, 1, 4, 5], 3, [1, 3, 3], [2, 1, 1], true, false);
    }

    #[test]
    fn layouts_round_trip() {
        let x = data(2 * 3 * 4 * 5 * 6, 4);
        let v = Ndhwc::from_ncdhw(2, 3, 4, 5, 6, &x);
        // Voxel (b=1, z=2, y=3, x=4), channel 2, in both layouts.
        assert_eq!(v.data[((((4 + 2) * 5 + 3) * 6) + 4) * 3 + 2], x[(((3 + 2) * 4 + 2) * 5 + 3) * 6 + 4]);
        assert_eq!(v.to_ncdhw(), x);
    }

    #[test]
    fn a_kernel_larger_than_the_padded_input_has_no_output() {
        let p = PackedConv3d::new(1, 1, [7, 3, 3], [1, 1, 1], &[0.0; 63], None);
        assert_eq!(p.output_dims([4, 8, 8]), None);
        assert_eq!(p.output_dims([5, 8, 8]), Some([1, 8, 8]));
    }
}
