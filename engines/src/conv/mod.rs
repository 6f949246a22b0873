//! CPU fast path for 3x3 convolutions in NHWC layout (TAESD on the CPU).
//!
//! Hand-written because candle 0.11's CPU conv2d reached only ~6% of its own large-matmul rate on
//! TAESD here (NCHW<->NHWC conversions on one thread, separate passes for bias, ReLU, residual and
//! upsampling). This keeps activations NHWC, builds an im2col tile of a few output rows in cache,
//! multiplies it with the `gemm` crate (the same GEMM candle uses), and applies bias, residual and
//! ReLU while the tile is hot; nearest x2 upsampling is folded into the im2col gather. Tiles run in
//! parallel on rayon.

pub mod conv3d;
pub mod direct;
#[cfg(test)]
mod reference;
pub mod winograd;

use crate::conv::direct::{DirectWeights, DIRECT_MAX_COUT};
use crate::conv::winograd::WinogradWeights;
use crate::simd::simd_fn;
use rayon::prelude::*;

/// Activations, NHWC, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Nhwc {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub data: Vec<f32>,
}

impl Nhwc {
    /// From NCHW data.
    pub fn from_nchw(n: usize, c: usize, h: usize, w: usize, src: &[f32]) -> Nhwc {
        let mut data = vec![0f32; n * h * w * c];
        data.par_chunks_mut(h * w * c).enumerate().for_each(|(b, dst)| {
            let s = &src[b * c * h * w..(b + 1) * c * h * w];
            for ch in 0..c {
                for p in 0..h * w {
                    dst[p * c + ch] = s[ch * h * w + p];
                }
            }
        });
        Nhwc { n, h, w, c, data }
    }
    /// To NCHW data.
    pub fn to_nchw(&self) -> Vec<f32> {
        let (h, w, c) = (self.h, self.w, self.c);
        let mut out = vec![0f32; self.data.len()];
        out.par_chunks_mut(h * w * c).enumerate().for_each(|(b, dst)| {
            let s = &self.data[b * h * w * c..(b + 1) * h * w * c];
            for p in 0..h * w {
                for ch in 0..c {
                    dst[ch * h * w + p] = s[p * c + ch];
                }
            }
        });
        out
    }
}

/// A 3x3 convolution (padding 1): weights packed as `[(ky*3+kx)*cin + ci][cout]` for im2col,
/// transformed for Winograd's F(2x2, 3x3) where that is faster ([`winograd_min_channels`]), or
/// packed for the direct kernel of narrow layers ([`DIRECT_MAX_COUT`]).
#[derive(Debug, Clone)]
pub struct PackedConv {
    pub cin: usize,
    pub cout: usize,
    pub stride: usize,
    /// The im2col packing; empty when `winograd` or `direct` holds the weights.
    pub w: Vec<f32>,
    pub winograd: Option<Box<WinogradWeights>>,
    pub direct: Option<Box<DirectWeights>>,
    pub bias: Option<Vec<f32>>,
}

/// Stride-1 convolutions with at least this many input and output channels run by Winograd's
/// F(2x2, 3x3) ([`crate::conv::winograd`]): [`WINOGRAD_MIN_CHANNELS_AVX512`] where `gemm` runs its
/// AVX-512 kernel, [`WINOGRAD_MIN_CHANNELS_FMA`] elsewhere (the [`crate::ScaleArm`]). The
/// break-even moves with the GEMM's speed: Winograd trades 2.25x fewer multiply-adds for two
/// transforms (additions, linear in the channels), and the faster the products, the more the
/// transforms weigh. Keyed on the `gemm` kernel, not on cadence's ISA level, so that forcing a
/// level (`CADENCE_MAX_ISA`) changes no bits.
pub fn winograd_min_channels() -> usize {
    match crate::ScaleArm::current() {
        crate::ScaleArm::Avx512 => WINOGRAD_MIN_CHANNELS_AVX512,
        crate::ScaleArm::Fma => WINOGRAD_MIN_CHANNELS_FMA,
    }
}

/// The threshold with `gemm`'s AVX-512 kernel. Measured against im2col on a 2-core AMD EPYC with
/// AVX-512 (`engines/examples/winograd_probe.rs`, median of 5): 512 channels at 32x32 and 64x64
/// 1.5x faster, 320-1280 channels (the UNet's) 1.3-1.5x, 256 at 128x128 0.9-1.2x, 128 at
/// 256x256 1.0-1.1x, 64 channels 0.4-0.8x (the transforms, which scale with the channels,
/// outweigh the products, which scale with their square).
pub const WINOGRAD_MIN_CHANNELS_AVX512: usize = 256;

/// The threshold with `gemm`'s FMA (AVX2) kernel, whose products run at half the AVX-512 rate.
/// Measured on a 2-core AMD EPYC with AVX2 and no AVX-512 (the same probe): 1.2-1.35x faster at
/// 64 channels (TAESD's, 32x32 to 256x256), 1.23-1.29x at 48, 1.45-1.5x at 80, 1.5-1.75x at
/// 128-256 channels on 256x256 and 128x128, 1.7-3.1x at the UNet's 320-1280; 32 channels
/// broke even (and go to the direct kernel, [`DIRECT_MAX_COUT`]).
pub const WINOGRAD_MIN_CHANNELS_FMA: usize = 48;

impl PackedConv {
    /// `w` in PyTorch layout (cout, cin, 3, 3).
    pub fn new(cout: usize, cin: usize, w: &[f32], bias: Option<Vec<f32>>, stride: usize) -> PackedConv {
        assert_eq!(w.len(), cout * cin * 9);
        if stride == 1 && cin.min(cout) >= winograd_min_channels() {
            let winograd = Some(Box::new(WinogradWeights::new(cout, cin, w)));
            return PackedConv { cin, cout, stride, w: Vec::new(), winograd, direct: None, bias };
        }
        if stride == 1 && cout <= DIRECT_MAX_COUT && direct::Arm::best().is_some() {
            let direct = Some(Box::new(DirectWeights::new(cout, cin, w, bias.as_deref())));
            return PackedConv { cin, cout, stride, w: Vec::new(), winograd: None, direct, bias };
        }
        Self::im2col(cout, cin, w, bias, stride)
    }

    /// Packed for im2col whatever the channel counts (the reference Winograd is tested against).
    pub fn im2col(cout: usize, cin: usize, w: &[f32], bias: Option<Vec<f32>>, stride: usize) -> PackedConv {
        assert_eq!(w.len(), cout * cin * 9);
        let mut p = vec![0f32; 9 * cin * cout];
        for o in 0..cout {
            for i in 0..cin {
                for t in 0..9 {
                    p[(t * cin + i) * cout + o] = w[(o * cin + i) * 9 + t];
                }
            }
        }
        PackedConv { cin, cout, stride, w: p, winograd: None, direct: None, bias }
    }
}

/// Output pixels per GEMM tile (rounded up to whole rows).
const TILE_PIXELS: usize = 256;

thread_local! {
    /// The im2col tile of the current rayon worker, kept between tiles and layers: allocating and
    /// zeroing it per tile cost about as much as the narrow (16-channel) GEMM it feeds.
    static COL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// dst = src (equal lengths) in 16-float blocks the compiler inlines: the gather copies 16-192
/// floats at a time, where a `memcpy` call per piece cost a tenth of TAESD's time.
#[inline(always)]
pub(crate) fn copy(dst: &mut [f32], src: &[f32]) {
    let mut d = dst.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (d, s) in (&mut d).zip(&mut s) {
        let d: &mut [f32; 16] = d.try_into().unwrap();
        *d = *<&[f32; 16]>::try_from(s).unwrap();
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = *s;
    }
}

/// y = conv3x3(upsample2?(x)) + bias (+ residual), then ReLU if `relu`.
pub fn conv3x3(x: &Nhwc, p: &PackedConv, upsample: bool, residual: Option<&Nhwc>, relu: bool) -> Nhwc {
    assert_eq!(x.c, p.cin, "conv3x3: channel mismatch");
    if let Some(q) = &p.winograd {
        return crate::conv::winograd::conv3x3(x, q, p.bias.as_deref(), upsample, residual, relu);
    }
    if let Some(q) = &p.direct {
        return direct::conv3x3(x, q, upsample, residual, relu);
    }
    let (ih, iw) = if upsample { (2 * x.h, 2 * x.w) } else { (x.h, x.w) };
    let oh = (ih + 2 - 3) / p.stride + 1;
    let ow = (iw + 2 - 3) / p.stride + 1;
    let (cin, cout, k) = (p.cin, p.cout, 9 * p.cin);
    if let Some(r) = residual {
        assert_eq!((r.n, r.h, r.w, r.c), (x.n, oh, ow, cout), "conv3x3: residual shape");
    }
    let rows = TILE_PIXELS.div_ceil(ow).clamp(1, oh);
    let mut out = vec![0f32; x.n * oh * ow * cout];
    let img_in = x.h * x.w * cin;
    let img_out = oh * ow * cout;
    out.par_chunks_mut(img_out).enumerate().for_each(|(b, oimg)| {
        let src = &x.data[b * img_in..(b + 1) * img_in];
        oimg.par_chunks_mut(rows * ow * cout).enumerate().for_each(|(t, dst)| {
            let oy0 = t * rows;
            let npix = dst.len() / cout;
            COL.with_borrow_mut(|col| {
                // Every element is written below (taps outside the image are zero-filled), so
                // the buffer is reused across tiles without clearing.
                col.resize(col.len().max(npix * k), 0.0);
                let col = &mut col[..npix * k];
                gather(col, src, x.w, cin, (ih, iw), ow, oy0, p.stride, upsample);
                // SAFETY: dst is npix x cout, col npix x k, w k x cout, all row-major, exactly
                // that long and disjoint.
                unsafe {
                    gemm_st(npix, cout, k, dst.as_mut_ptr(), cout, col.as_ptr(), k, 1, p.w.as_ptr(), cout, 1, 1.0)
                };
            });
            let res =
                residual.map(|r| &r.data[b * img_out + oy0 * ow * cout..b * img_out + oy0 * ow * cout + dst.len()]);
            epilogue(dst, cout, p.bias.as_deref(), res, relu);
        });
    });
    Nhwc { n: x.n, h: oh, w: ow, c: cout, data: out }
}

simd_fn! {
    /// The im2col rows of output pixels from row `oy0` on: per pixel, 9 taps x `cin` values
    /// (zeros outside the image; nearest x2 upsampling folded in).
    #[allow(clippy::too_many_arguments)]
    fn gather(col: &mut [f32], src: &[f32], xw: usize, cin: usize, in_hw: (usize, usize), ow: usize, oy0: usize, stride: usize, upsample: bool) {
        let (ih, iw) = in_hw;
        let k = 9 * cin;
        for (q, colrow) in col.chunks_mut(k).enumerate() {
            let oy = oy0 + q / ow;
            let ox = q % ow;
            for ky in 0..3 {
                let iy = (oy * stride + ky) as isize - 1;
                let taps = &mut colrow[ky * 3 * cin..(ky + 1) * 3 * cin];
                if iy < 0 || iy >= ih as isize {
                    taps.fill(0.0);
                    continue;
                }
                // Interior pixel of a plain stride-1 conv: its three taps of this row
                // are three neighbouring source pixels, one contiguous copy.
                if !upsample && stride == 1 && ox >= 1 && ox + 1 < iw {
                    let s = (iy as usize * xw + ox - 1) * cin;
                    copy(taps, &src[s..s + 3 * cin]);
                    continue;
                }
                for kx in 0..3 {
                    let ix = (ox * stride + kx) as isize - 1;
                    let d = &mut colrow[(ky * 3 + kx) * cin..(ky * 3 + kx + 1) * cin];
                    if iy < 0 || ix < 0 || iy >= ih as isize || ix >= iw as isize {
                        d.fill(0.0);
                    } else {
                        let (sy, sx) = if upsample {
                            (iy as usize / 2, ix as usize / 2)
                        } else {
                            (iy as usize, ix as usize)
                        };
                        let s = (sy * xw + sx) * cin;
                        copy(d, &src[s..s + cin]);
                    }
                }
            }
        }
    }
}

/// dst = scale x lhs rhs for an m x k `lhs` and a k x n `rhs` given by row and column strides
/// (in elements), into a row-major `dst` with row stride `dst_rs`; one thread (callers split the
/// work into tiles). The `gemm` crate is what candle uses on the CPU.
///
/// # Safety
/// Every element the strides address must lie in the allocation behind its pointer, and `dst`
/// must not overlap `lhs` or `rhs`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_st(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    lhs: *const f32,
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: *const f32,
    rhs_rs: usize,
    rhs_cs: usize,
    scale: f32,
) {
    // SAFETY: forwarded from the caller.
    unsafe { gemm_st_into(m, n, k, dst, dst_rs, lhs, lhs_rs, lhs_cs, rhs, rhs_rs, rhs_cs, scale, false) }
}

/// [`gemm_st`] that adds the product to `dst` (dst += scale x lhs rhs) when `accumulate`.
///
/// # Safety
/// As [`gemm_st`]; `lhs` rows may overlap each other (a row stride below `k` reads a sliding
/// window, as the row path of [`crate::conv::conv3d`] does).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_st_into(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    lhs: *const f32,
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: *const f32,
    rhs_rs: usize,
    rhs_cs: usize,
    scale: f32,
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            lhs,
            lhs_cs as isize,
            lhs_rs as isize,
            rhs,
            rhs_cs as isize,
            rhs_rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

simd_fn! {
    /// bias (+ residual), then ReLU, on `cout`-wide output pixels.
    pub(crate) fn epilogue(dst: &mut [f32], cout: usize, bias: Option<&[f32]>, res: Option<&[f32]>, relu: bool) {
        for (q, px) in dst.chunks_exact_mut(cout).enumerate() {
            if let Some(bias) = bias {
                px.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
            if let Some(r) = res {
                px.iter_mut().zip(&r[q * cout..(q + 1) * cout]).for_each(|(v, r)| *v += r);
            }
            if relu {
                px.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
    }
}

/// Nearest x2 upsampling (used only by tests and the reference path; the fast path folds it into
/// the following convolution).
pub fn upsample2(x: &Nhwc) -> Nhwc {
    let (h, w, c) = (x.h, x.w, x.c);
    let mut out = vec![0f32; x.n * 4 * h * w * c];
    out.par_chunks_mut(2 * w * c).enumerate().for_each(|(row, dst)| {
        let b = row / (2 * h);
        let y = (row % (2 * h)) / 2;
        for ox in 0..2 * w {
            let s = ((b * h + y) * w + ox / 2) * c;
            dst[ox * c..(ox + 1) * c].copy_from_slice(&x.data[s..s + c]);
        }
    });
    Nhwc { n: x.n, h: 2 * h, w: 2 * w, c, data: out }
}

/// Per image and channel, the mean and 1/sqrt(var + eps) over the pixels (biased variance, two
/// passes in f64): the statistics of PyTorch's `InstanceNorm2d` (affine=False, no running
/// statistics), which SPADE normalises with. Returns `n * c` pairs, image-major.
pub fn instance_norm_stats(x: &Nhwc, eps: f64) -> Vec<(f32, f32)> {
    let (c, px) = (x.c, x.h * x.w);
    let mut out = Vec::with_capacity(x.n * c);
    for img in x.data.chunks_exact(px * c) {
        // Partial sums per block of rows in parallel, then one reduction.
        let sums = |f: &(dyn Fn(usize, f32) -> f64 + Sync)| -> Vec<f64> {
            img.par_chunks(ROWS_PER_TASK * c)
                .map(|rows| {
                    let mut acc = vec![0f64; c];
                    for p in rows.chunks_exact(c) {
                        acc.iter_mut().zip(p).enumerate().for_each(|(ch, (a, v))| *a += f(ch, *v));
                    }
                    acc
                })
                .reduce(|| vec![0f64; c], |a, b| a.iter().zip(&b).map(|(a, b)| a + b).collect())
        };
        let mean: Vec<f64> = sums(&|_, v| v as f64).iter().map(|s| s / px as f64).collect();
        let var = sums(&|ch, v| (v as f64 - mean[ch]).powi(2));
        out.extend(mean.iter().zip(&var).map(|(m, v)| (*m as f32, (1.0 / (v / px as f64 + eps).sqrt()) as f32)));
    }
    out
}

/// Pixels per parallel task of [`instance_norm_stats`].
const ROWS_PER_TASK: usize = 1024;

/// PyTorch's `PixelShuffle(r)`: channel `c·r² + i·r + j` of pixel (y, x) moves to channel `c` of
/// pixel (y·r + i, x·r + j).
pub fn pixel_shuffle(x: &Nhwc, r: usize) -> Nhwc {
    assert_eq!(x.c % (r * r), 0, "pixel_shuffle: {} channels are not a multiple of {r}²", x.c);
    let co = x.c / (r * r);
    let (oh, ow) = (x.h * r, x.w * r);
    let mut out = vec![0f32; x.data.len()];
    out.par_chunks_mut(ow * co).enumerate().for_each(|(row, dst)| {
        let (b, oy) = (row / oh, row % oh);
        let (y, i) = (oy / r, oy % r);
        for ox in 0..ow {
            let (xx, j) = (ox / r, ox % r);
            let src = &x.data[((b * x.h + y) * x.w + xx) * x.c..][..x.c];
            for ch in 0..co {
                dst[ox * co + ch] = src[ch * r * r + i * r + j];
            }
        }
    });
    Nhwc { n: x.n, h: oh, w: ow, c: co, data: out }
}
