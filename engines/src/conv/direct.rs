//! Direct 3x3 convolution (stride 1, padding 1) for narrow layers: TAESD's cpu-reduced decoder,
//! whose 3x3 convolutions have 16 output channels on up to 256x256 pixels.
//!
//! Why not im2col + `gemm` there: with 16 output channels the product is (pixels x 144) times
//! (144 x 16), a shape where the GEMM's packing and the im2col tile it reads (144 floats written and
//! read per output pixel, for 16 results) cost about as much as the multiplies; TAESD's decoder
//! ran at about a quarter of the machine's matmul rate. Here a tile of `P` neighbouring output
//! pixels x 16 output channels stays in vector registers (16 channels are one AVX-512 register, two
//! AVX2 ones) while the 9 taps x `cin` input values are broadcast from a zero-padded copy of the
//! three source rows, each multiplied with one packed weight vector: one fused multiply-add per
//! input value and 16 outputs, no intermediate buffer. Nearest x2 upsampling is folded into the
//! row copy; bias, residual and ReLU into the write of the tile.
//!
//! Like the `gemm` crate this is a product kernel with fused multiply-adds, so it has arms only
//! for CPUs with FMA (AVX2, AVX-512), chosen from what the CPU has ([`crate::isa::detected`]),
//! not from `CADENCE_MAX_ISA`; without FMA [`crate::conv::PackedConv::new`] keeps im2col.
//! Both arms do the same operations in the same order for every output (bias, then the taps
//! row-major, then the input channels), so they give the same bits; the tests compare each arm
//! the CPU can run with an f64 direct convolution and with each other.

use crate::conv::Nhwc;
use crate::isa::Isa;
use rayon::prelude::*;

/// Output channels per packed block: one AVX-512 register of f32.
pub const LANES: usize = 16;

/// Stride-1 convolutions with at most this many output channels run here instead of im2col.
/// Measured on a 2-core Intel Xeon with AVX-512 (`engines/examples/direct_conv_probe.rs`).
pub const DIRECT_MAX_COUT: usize = 32;

/// Which compiled arm runs the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// 6 pixels x 16 channels in twelve 256-bit registers.
    Avx2,
    /// 12 pixels x 16 channels in twelve 512-bit registers.
    Avx512,
}

impl Arm {
    /// The best arm this CPU runs, `None` without FMA.
    pub fn best() -> Option<Arm> {
        match crate::isa::detected() {
            Isa::Avx512 => Some(Arm::Avx512),
            Isa::Avx2 => Some(Arm::Avx2),
            Isa::Baseline => None,
        }
    }
    /// Every arm this CPU runs.
    pub fn runnable() -> Vec<Arm> {
        match Arm::best() {
            Some(Arm::Avx512) => vec![Arm::Avx2, Arm::Avx512],
            Some(Arm::Avx2) => vec![Arm::Avx2],
            None => vec![],
        }
    }
}

/// Weights packed per block of 16 output channels as `[block][tap][ci][16]` (taps row-major;
/// output channels past `cout` are zero), and the bias padded the same way.
#[derive(Debug, Clone)]
pub struct DirectWeights {
    pub cin: usize,
    pub cout: usize,
    w: Vec<f32>,
    bias: Vec<f32>,
}

impl DirectWeights {
    /// `w` in PyTorch layout (cout, cin, 3, 3).
    pub fn new(cout: usize, cin: usize, w: &[f32], bias: Option<&[f32]>) -> DirectWeights {
        assert_eq!(w.len(), cout * cin * 9);
        let blocks = cout.div_ceil(LANES);
        let mut p = vec![0f32; blocks * 9 * cin * LANES];
        for o in 0..cout {
            let (b, j) = (o / LANES, o % LANES);
            for i in 0..cin {
                for t in 0..9 {
                    p[((b * 9 + t) * cin + i) * LANES + j] = w[(o * cin + i) * 9 + t];
                }
            }
        }
        let mut bp = vec![0f32; blocks * LANES];
        if let Some(bias) = bias {
            bp[..cout].copy_from_slice(bias);
        }
        DirectWeights { cin, cout, w: p, bias: bp }
    }

    fn blocks(&self) -> usize {
        self.cout.div_ceil(LANES)
    }
}

/// y = conv3x3(upsample2?(x)) + bias (+ residual), then ReLU if `relu`, on the best arm.
///
/// # Panics
/// On a CPU without FMA (callers check [`Arm::best`]) or mismatched shapes.
pub fn conv3x3(x: &Nhwc, q: &DirectWeights, upsample: bool, residual: Option<&Nhwc>, relu: bool) -> Nhwc {
    let arm = Arm::best().expect("direct_conv: needs FMA (AVX2 or AVX-512)");
    conv3x3_on(arm, x, q, upsample, residual, relu)
}

/// [`conv3x3`] on a chosen arm (tests compare the arms).
///
/// # Panics
/// If the CPU cannot run `arm`, or on mismatched shapes.
pub fn conv3x3_on(arm: Arm, x: &Nhwc, q: &DirectWeights, upsample: bool, residual: Option<&Nhwc>, relu: bool) -> Nhwc {
    assert!(Arm::runnable().contains(&arm), "direct_conv: this CPU cannot run {arm:?}");
    assert_eq!(x.c, q.cin, "direct_conv: channel mismatch");
    let (oh, ow) = if upsample { (2 * x.h, 2 * x.w) } else { (x.h, x.w) };
    let cout = q.cout;
    if let Some(r) = residual {
        assert_eq!((r.n, r.h, r.w, r.c), (x.n, oh, ow, cout), "direct_conv: residual shape");
    }
    let mut out = vec![0f32; x.n * oh * ow * cout];
    if out.is_empty() {
        return Nhwc { n: x.n, h: oh, w: ow, c: cout, data: out };
    }
    out.par_chunks_mut(ow * cout).enumerate().for_each(|(row, dst)| {
        let (b, oy) = (row / oh, row % oh);
        let res = residual.map(|r| &r.data[row * ow * cout..(row + 1) * ow * cout]);
        let task = RowTask { x, b, oy, upsample, dst, res, relu };
        match arm {
            // SAFETY: `runnable` above checked that the CPU has the arm's features.
            Arm::Avx512 => unsafe { row_avx512(q, task) },
            // SAFETY: as above.
            Arm::Avx2 => unsafe { row_avx2(q, task) },
        }
    });
    Nhwc { n: x.n, h: oh, w: ow, c: cout, data: out }
}

/// One output row: where it comes from and where it goes.
struct RowTask<'a> {
    x: &'a Nhwc,
    b: usize,
    oy: usize,
    upsample: bool,
    dst: &'a mut [f32],
    res: Option<&'a [f32]>,
    relu: bool,
}

thread_local! {
    /// The three zero-padded source rows of the current worker's output row, reused between rows.
    static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn row_avx512(q: &DirectWeights, t: RowTask) {
    row::<12>(q, t, x86::tile_avx512::<12>)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2(q: &DirectWeights, t: RowTask) {
    row::<6>(q, t, x86::tile_avx2::<6>)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn row_avx512(_: &DirectWeights, _: RowTask) {
    unreachable!("no x86-64 arms on this target")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn row_avx2(_: &DirectWeights, _: RowTask) {
    unreachable!("no x86-64 arms on this target")
}

/// What one tile of `P` pixels x 16 output channels reads.
struct Tile<'a> {
    /// The three zero-padded source rows (pixel -1 first).
    rows: [&'a [f32]; 3],
    /// Whether each row lies inside the image (a row outside contributes nothing).
    present: [bool; 3],
    /// The tile's first output pixel.
    x0: usize,
    cin: usize,
    /// The block's packed weights, `[tap][ci][16]`.
    w: &'a [f32],
    bias: &'a [f32; LANES],
}

/// The tile's sums: bias, then per tap (row-major) and input channel one fused multiply-add.
type TileFn<const P: usize> = unsafe fn(&Tile) -> [[f32; LANES]; P];

/// One output row in tiles of `P` pixels x 16 channels.
#[inline(always)]
fn row<const P: usize>(q: &DirectWeights, t: RowTask, tile: TileFn<P>) {
    let (x, cin, cout) = (t.x, q.cin, q.cout);
    let (ih, ow) = if t.upsample { (2 * x.h, 2 * x.w) } else { (x.h, x.w) };
    // Padded row: pixel -1 and pixels ow..ow_tiles+1 are zero, so every tile reads in bounds.
    let ow_tiles = ow.div_ceil(P) * P;
    let row_len = (ow_tiles + 2) * cin;
    // Taken out of the thread-local rather than borrowed in a closure: a closure is compiled
    // without the arm's target features, and its fused multiply-adds became libm calls.
    let mut buf = ROWS.take();
    buf.resize(3 * row_len, 0.0);
    {
        let mut present = [false; 3];
        for (ky, r) in buf.chunks_exact_mut(row_len).enumerate() {
            let iy = t.oy as isize + ky as isize - 1;
            if iy < 0 || iy >= ih as isize {
                continue;
            }
            present[ky] = true;
            let sy = if t.upsample { iy as usize / 2 } else { iy as usize };
            let src = &x.data[(t.b * x.h + sy) * x.w * cin..][..x.w * cin];
            r[..cin].fill(0.0);
            if t.upsample {
                for (ix, d) in r[cin..(ow + 1) * cin].chunks_exact_mut(cin).enumerate() {
                    crate::conv::copy(d, &src[ix / 2 * cin..(ix / 2 + 1) * cin]);
                }
            } else {
                r[cin..(ow + 1) * cin].copy_from_slice(src);
            }
            r[(ow + 1) * cin..].fill(0.0);
        }
        let rows = [&buf[..row_len], &buf[row_len..2 * row_len], &buf[2 * row_len..]];
        for blk in 0..q.blocks() {
            let w = &q.w[blk * 9 * cin * LANES..(blk + 1) * 9 * cin * LANES];
            let bias: &[f32; LANES] = q.bias[blk * LANES..(blk + 1) * LANES].try_into().unwrap();
            let lanes = LANES.min(cout - blk * LANES);
            for x0 in (0..ow).step_by(P) {
                let args = Tile { rows, present, x0, cin, w, bias };
                // SAFETY: the arm's features were checked by the caller; the rows are padded to
                // whole tiles plus the right neighbour, so every read lies inside them.
                let mut acc = unsafe { tile(&args) };
                for (p, a) in acc.iter_mut().enumerate().take(ow - x0) {
                    let o = (x0 + p) * cout + blk * LANES;
                    // On the whole 16-lane vector (fixed length, no copy loop): residual, ReLU.
                    if let Some(res) = t.res {
                        a.iter_mut().zip(&res[o..o + lanes]).for_each(|(v, r)| *v += r);
                    }
                    if t.relu {
                        a.iter_mut().for_each(|v| *v = v.max(0.0));
                    }
                    if lanes == LANES {
                        *<&mut [f32; LANES]>::try_from(&mut t.dst[o..o + LANES]).unwrap() = *a;
                    } else {
                        t.dst[o..o + lanes].copy_from_slice(&a[..lanes]);
                    }
                }
            }
        }
    }
    ROWS.set(buf);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The tile sums with intrinsics: written generically over the accumulators, LLVM kept part of
    //! them in memory (a store and reload per multiply-add) and ran at a third of the rate.
    use super::{Tile, LANES};
    use std::arch::x86_64::*;

    /// 16 channels in one 512-bit register per pixel.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn tile_avx512<const P: usize>(t: &Tile) -> [[f32; LANES]; P] {
        let cin = t.cin;
        let mut acc = [_mm512_loadu_ps(t.bias.as_ptr()); P];
        for ky in 0..3 {
            if !t.present[ky] {
                continue;
            }
            assert!(t.rows[ky].len() >= (t.x0 + P + 2) * cin && t.w.len() == 9 * cin * LANES);
            for kx in 0..3 {
                let src = t.rows[ky].as_ptr().add((t.x0 + kx) * cin);
                let w = t.w.as_ptr().add((ky * 3 + kx) * cin * LANES);
                for ci in 0..cin {
                    let wv = _mm512_loadu_ps(w.add(ci * LANES));
                    for (p, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(*src.add(p * cin + ci)), wv, *a);
                    }
                }
            }
        }
        let mut out = [[0f32; LANES]; P];
        for (o, a) in out.iter_mut().zip(acc) {
            _mm512_storeu_ps(o.as_mut_ptr(), a);
        }
        out
    }

    /// 16 channels in two 256-bit registers per pixel: the same operations per channel as the
    /// AVX-512 arm, so the same bits.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2<const P: usize>(t: &Tile) -> [[f32; LANES]; P] {
        let cin = t.cin;
        let (b0, b1) = (_mm256_loadu_ps(t.bias.as_ptr()), _mm256_loadu_ps(t.bias.as_ptr().add(8)));
        let mut acc = [(b0, b1); P];
        for ky in 0..3 {
            if !t.present[ky] {
                continue;
            }
            assert!(t.rows[ky].len() >= (t.x0 + P + 2) * cin && t.w.len() == 9 * cin * LANES);
            for kx in 0..3 {
                let src = t.rows[ky].as_ptr().add((t.x0 + kx) * cin);
                let w = t.w.as_ptr().add((ky * 3 + kx) * cin * LANES);
                for ci in 0..cin {
                    let (w0, w1) = (_mm256_loadu_ps(w.add(ci * LANES)), _mm256_loadu_ps(w.add(ci * LANES + 8)));
                    for (p, a) in acc.iter_mut().enumerate() {
                        let x = _mm256_set1_ps(*src.add(p * cin + ci));
                        *a = (_mm256_fmadd_ps(x, w0, a.0), _mm256_fmadd_ps(x, w1, a.1));
                    }
                }
            }
        }
        let mut out = [[0f32; LANES]; P];
        for (o, a) in out.iter_mut().zip(acc) {
            _mm256_storeu_ps(o.as_mut_ptr(), a.0);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), a.1);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::reference::{lcg, reference};
    use crate::conv::{self, PackedConv};

    /// Every arm this CPU runs against the f64 direct convolution: one pixel, widths that end
    /// inside a tile of either arm, more output channels than one block (and a partial block),
    /// a single input channel, upsampling, residual, ReLU; the arms agree bit for bit.
    #[test]
    fn every_arm_matches_the_f64_convolution_and_the_others() {
        let cases = [
            // (n, h, w, cin, cout, upsample, residual, relu)
            (1, 1, 1, 3, 5, false, false, false),
            (2, 5, 7, 16, 16, false, true, false),
            (1, 9, 13, 1, 16, true, false, true),
            (1, 4, 25, 16, 3, false, false, true),
            (2, 6, 11, 20, 32, true, true, true),
            (1, 3, 40, 7, 20, false, true, false),
        ];
        if Arm::best().is_none() {
            eprintln!("SKIPPED: direct_conv arms: the CPU has no FMA");
            return;
        }
        for (i, &(n, h, w, cin, cout, up, res, relu)) in cases.iter().enumerate() {
            let x = Nhwc { n, h, w, c: cin, data: lcg(110 + i as u64, n * h * w * cin) };
            let wt = lcg(120 + i as u64, cout * cin * 9);
            let bias = lcg(130 + i as u64, cout);
            let (oh, ow) = if up { (2 * h, 2 * w) } else { (h, w) };
            let r = res.then(|| Nhwc { n, h: oh, w: ow, c: cout, data: lcg(140 + i as u64, n * oh * ow * cout) });
            let want = reference(&x, &wt, &bias, up, r.as_ref(), relu);
            let scale = want.iter().fold(0f64, |a, v| a.max(v.abs())).max(1.0);
            let q = DirectWeights::new(cout, cin, &wt, Some(&bias));
            let mut first: Option<Vec<u32>> = None;
            for arm in Arm::runnable() {
                let got = conv3x3_on(arm, &x, &q, up, r.as_ref(), relu);
                assert_eq!((got.n, got.h, got.w, got.c), (n, oh, ow, cout));
                let err = got.data.iter().zip(&want).fold(0f64, |a, (g, w)| a.max((*g as f64 - w).abs()));
                // f32 sums of at most 9 x 32 products of values below 0.5: a few ulps of the scale.
                assert!(err <= 2e-6 * scale, "case {i} {arm:?}: error {err}, scale {scale}");
                let bits: Vec<u32> = got.data.iter().map(|v| v.to_bits()).collect();
                match &first {
                    None => first = Some(bits),
                    Some(b) => assert!(b == &bits, "case {i}: {arm:?} differs from the other arm"),
                }
            }
        }
    }

    /// `PackedConv::new` picks the direct kernel for stride-1 layers up to `DIRECT_MAX_COUT`
    /// output channels (on a CPU with FMA), and `conv::conv3x3` then runs it.
    #[test]
    fn narrow_packed_convs_run_the_direct_kernel() {
        let w = |co: usize, ci: usize| lcg(co as u64, co * ci * 9);
        let fma = Arm::best().is_some();
        assert_eq!(PackedConv::new(DIRECT_MAX_COUT, 8, &w(DIRECT_MAX_COUT, 8), None, 1).direct.is_some(), fma);
        assert!(PackedConv::new(DIRECT_MAX_COUT + 1, 8, &w(DIRECT_MAX_COUT + 1, 8), None, 1).direct.is_none());
        assert!(PackedConv::new(16, 8, &w(16, 8), None, 2).direct.is_none());
        let (wt, bias) = (w(16, 16), lcg(7, 16));
        let x = Nhwc { n: 1, h: 6, w: 9, c: 16, data: lcg(8, 54 * 16) };
        let p = PackedConv::new(16, 16, &wt, Some(bias.clone()), 1);
        assert_eq!(p.w.is_empty(), fma, "the im2col packing is kept only when the direct kernel is not used");
        let got = conv::conv3x3(&x, &p, true, None, false);
        let want = reference(&x, &wt, &bias, true, None, false);
        let err = got.data.iter().zip(&want).fold(0f64, |a, (g, w)| a.max((*g as f64 - w).abs()));
        assert!(err < 1e-5, "error {err}");
    }
}
