//! The CPU kernels of MTCNN's three networks: unpadded stride-1 convolutions (3x3, 2x2 and 1x1,
//! the last also serving the dense layers) with the bias and PReLU applied in registers, and max
//! pooling, on feature maps in HWC with padded rows.
//!
//! A convolution computes a tile of `P` neighbouring output pixels x 16 or 32 output channels in
//! vector registers: per tap (row-major) and input channel, the input value is broadcast and
//! multiplied with one packed weight vector per 16 channels (a fused multiply-add), so nothing is
//! gathered into an im2col buffer and a layer's output is written once, with its PReLU applied.
//! MTCNN's layers are narrow (10 to 128 channels) and its inputs have 3 channels, shapes where a
//! general GEMM's packing costs about as much as the multiplies.
//!
//! The arms: AVX-512 (one 512-bit register per 16 channels, 12-pixel tiles), AVX2 (two 256-bit
//! registers, 6- or 3-pixel tiles) and a portable one (arrays, a separate multiply and add), at the
//! level [`crate::isa::active`] gives (so `CADENCE_MAX_ISA` caps it). The two FMA arms do the same
//! operations in the same order for every output (bias, then the taps row-major, then the input
//! channels) and give the same bits; the portable arm rounds each product before adding it, so it
//! differs from them by a few ulps (the tests bound it).
//!
//! Maps: pixel `(y, x)`, channel `c` at `data[(y * row + x) * cs + c]`, with `cs` (floats per
//! pixel) a multiple of 16 for every map a kernel writes. A tile reads up to `P + K` pixels past
//! its first one and writes whole tiles, so rows are padded by [`PAD`] pixels: the pixels past a
//! map's width hold values that no valid output reads.

use crate::isa::Isa;

/// Output channels per vector block.
pub(crate) const LANES: usize = 16;
/// Pixels of padding every map row needs past its width (the widest tile plus a 3x3 kernel).
pub(crate) const PAD: usize = 16;

/// 16 f32 lanes: what the kernels are written over.
pub(crate) trait Lanes: Copy {
    /// # Safety
    /// `p` points at 16 readable floats.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// `p` points at 16 writable floats.
    unsafe fn store(self, p: *mut f32);
    fn splat(v: f32) -> Self;
    /// `x * w + acc` (fused on the FMA arms).
    fn mul_add(x: Self, w: Self, acc: Self) -> Self;
    fn max(self, o: Self) -> Self;
    /// PyTorch's PReLU: `x > 0 ? x : slope * x`.
    fn prelu(self, slope: Self) -> Self;
}

/// The portable arm: a separate multiply and add per lane.
#[derive(Clone, Copy)]
pub(crate) struct Portable([f32; LANES]);

impl Lanes for Portable {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: forwarded from the caller.
        Portable(unsafe { p.cast::<[f32; LANES]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: forwarded from the caller.
        unsafe { p.cast::<[f32; LANES]>().write_unaligned(self.0) }
    }
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Portable([v; LANES])
    }
    #[inline(always)]
    fn mul_add(x: Self, w: Self, acc: Self) -> Self {
        Portable(std::array::from_fn(|i| x.0[i] * w.0[i] + acc.0[i]))
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        Portable(std::array::from_fn(|i| self.0[i].max(o.0[i])))
    }
    #[inline(always)]
    fn prelu(self, slope: Self) -> Self {
        Portable(std::array::from_fn(|i| if self.0[i] > 0.0 { self.0[i] } else { slope.0[i] * self.0[i] }))
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The FMA arms with intrinsics. Their methods are `#[inline(always)]` without target features
    //! of their own: they are only called from the `#[target_feature]` arms below, into which they
    //! are inlined (a tile's accumulators then stay in registers).
    use super::{Lanes, LANES};
    use std::arch::x86_64::*;

    /// One 512-bit register.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(__m512);

    impl Lanes for Avx512 {
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: forwarded from the caller; only called where AVX-512 F is enabled.
            Avx512(unsafe { _mm512_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn splat(v: f32) -> Self {
            // SAFETY: only called where AVX-512 F is enabled.
            Avx512(unsafe { _mm512_set1_ps(v) })
        }
        #[inline(always)]
        fn mul_add(x: Self, w: Self, acc: Self) -> Self {
            // SAFETY: as above.
            Avx512(unsafe { _mm512_fmadd_ps(x.0, w.0, acc.0) })
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            // SAFETY: as above.
            Avx512(unsafe { _mm512_max_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn prelu(self, slope: Self) -> Self {
            // SAFETY: as above.
            unsafe {
                let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self.0, _mm512_setzero_ps());
                Avx512(_mm512_mask_blend_ps(pos, _mm512_mul_ps(slope.0, self.0), self.0))
            }
        }
    }

    /// Two 256-bit registers.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(__m256, __m256);

    impl Lanes for Avx2 {
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: forwarded from the caller; only called where AVX2 and FMA are enabled.
            unsafe { Avx2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(LANES / 2))) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: as above.
            unsafe {
                _mm256_storeu_ps(p, self.0);
                _mm256_storeu_ps(p.add(LANES / 2), self.1);
            }
        }
        #[inline(always)]
        fn splat(v: f32) -> Self {
            // SAFETY: only called where AVX2 is enabled.
            let s = unsafe { _mm256_set1_ps(v) };
            Avx2(s, s)
        }
        #[inline(always)]
        fn mul_add(x: Self, w: Self, acc: Self) -> Self {
            // SAFETY: only called where FMA is enabled.
            unsafe { Avx2(_mm256_fmadd_ps(x.0, w.0, acc.0), _mm256_fmadd_ps(x.1, w.1, acc.1)) }
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            // SAFETY: only called where AVX2 is enabled.
            unsafe { Avx2(_mm256_max_ps(self.0, o.0), _mm256_max_ps(self.1, o.1)) }
        }
        #[inline(always)]
        fn prelu(self, slope: Self) -> Self {
            // SAFETY: as above.
            unsafe {
                let z = _mm256_setzero_ps();
                let (a, b) = (self.0, self.1);
                Avx2(
                    _mm256_blendv_ps(_mm256_mul_ps(slope.0, a), a, _mm256_cmp_ps::<_CMP_GT_OQ>(a, z)),
                    _mm256_blendv_ps(_mm256_mul_ps(slope.1, b), b, _mm256_cmp_ps::<_CMP_GT_OQ>(b, z)),
                )
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

/// Which arm runs: the active ISA level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arm {
    Portable,
    Avx2,
    Avx512,
}

impl Arm {
    pub(crate) fn active() -> Arm {
        match crate::isa::active() {
            Isa::Avx512 => Arm::Avx512,
            Isa::Avx2 => Arm::Avx2,
            Isa::Baseline => Arm::Portable,
        }
    }
}

/// Defines `fn $name(arm: Arm, args...)` that runs its body with `$V` the arm's lane type and
/// `$P1`, `$P2` its tile widths (pixels) for one and two blocks of 16 channels, compiled with the
/// arm's target features (as `cadence_cpu::simd_fn!` does for the auto-vectorised loops; the
/// body is a generic function, never a closure, which would be compiled without them).
macro_rules! arms {
    ($(#[$m:meta])* $vis:vis fn $name:ident<$V:ident, $P1:ident, $P2:ident>($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(arm: $crate::mtcnn::kernels::Arm, $($a: $t),*) $(-> $r)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn imp<$V: $crate::mtcnn::kernels::Lanes, const $P1: usize, const $P2: usize>($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($a: $t),*) $(-> $r)? {
                    imp::<$crate::mtcnn::kernels::Avx512, 12, 12>($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($a: $t),*) $(-> $r)? {
                    imp::<$crate::mtcnn::kernels::Avx2, 6, 3>($($a),*)
                }
                match arm {
                    // SAFETY: Arm::active() never exceeds what the CPU supports.
                    $crate::mtcnn::kernels::Arm::Avx512 => return unsafe { avx512($($a),*) },
                    // SAFETY: as above.
                    $crate::mtcnn::kernels::Arm::Avx2 => return unsafe { avx2($($a),*) },
                    $crate::mtcnn::kernels::Arm::Portable => {}
                }
            }
            let _ = arm;
            imp::<$crate::mtcnn::kernels::Portable, 4, 2>($($a),*)
        }
    };
}
pub(crate) use arms;

/// A convolution's weights packed as `[block][tap][ci][16]` (taps row-major; output channels past
/// `cout` zero), its bias and PReLU slopes padded the same way (`[block][16]`).
#[derive(Debug, Clone)]
pub(crate) struct Packed {
    pub k: usize,
    pub cin: usize,
    pub cout: usize,
    w: Vec<f32>,
    bias: Vec<f32>,
    /// None: no PReLU.
    slope: Option<Vec<f32>>,
}

impl Packed {
    /// From PyTorch's layout `(cout, cin, k, k)` (a dense layer is `k = 1`), with `order[i]` the
    /// PyTorch input index of the kernel's input channel `i` (None: the same).
    pub(crate) fn new(
        k: usize,
        cin: usize,
        cout: usize,
        w: &[f32],
        bias: &[f32],
        slope: Option<&[f32]>,
        order: Option<&[usize]>,
    ) -> Packed {
        assert_eq!(w.len(), cout * cin * k * k);
        assert_eq!(bias.len(), cout);
        let blocks = cout.div_ceil(LANES);
        let taps = k * k;
        let mut p = vec![0f32; blocks * taps * cin * LANES];
        for o in 0..cout {
            let (b, j) = (o / LANES, o % LANES);
            for i in 0..cin {
                let src = order.map_or(i, |ord| ord[i]);
                for t in 0..taps {
                    p[((b * taps + t) * cin + i) * LANES + j] = w[(o * cin + src) * taps + t];
                }
            }
        }
        let pad = |v: &[f32]| {
            let mut out = vec![0f32; blocks * LANES];
            out[..cout].copy_from_slice(v);
            out
        };
        Packed { k, cin, cout, w: p, bias: pad(bias), slope: slope.map(pad) }
    }

    pub(crate) fn blocks(&self) -> usize {
        self.cout.div_ceil(LANES)
    }

    /// Floats per output pixel: the blocks' lanes.
    pub(crate) fn cs_out(&self) -> usize {
        self.blocks() * LANES
    }
}

/// A map being read: rows of pixels, `cs` floats per pixel.
#[derive(Clone, Copy)]
pub(crate) struct Src<'a> {
    /// The rows the kernel reads (for a K x K kernel, K of them).
    pub rows: [&'a [f32]; 3],
    pub cs: usize,
}

/// The tile sums of `P` pixels from `x0` and blocks `blk..blk + NB`: bias, then per tap and input
/// channel one multiply-add; PReLU when the layer has one.
#[inline(always)]
fn tile<V: Lanes, const K: usize, const P: usize, const NB: usize>(
    src: &Src,
    x0: usize,
    c: &Packed,
    blk: usize,
) -> [[V; NB]; P] {
    let (cin, cs) = (c.cin, src.cs);
    let bstride = K * K * cin * LANES;
    for r in &src.rows[..K] {
        assert!(r.len() >= (x0 + P + K - 1) * cs && cs >= cin);
    }
    assert!(c.w.len() >= (blk + NB) * bstride && c.bias.len() >= (blk + NB) * LANES);
    let w = c.w.as_ptr();
    // SAFETY: every read below lies inside the lengths asserted above.
    unsafe {
        let mut acc = [[V::splat(0.0); NB]; P];
        for (b, a) in acc[0].iter_mut().enumerate() {
            *a = V::load(c.bias.as_ptr().add((blk + b) * LANES));
        }
        for p in 1..P {
            acc[p] = acc[0];
        }
        for ky in 0..K {
            let row = src.rows[ky].as_ptr();
            for kx in 0..K {
                let s = row.add((x0 + kx) * cs);
                let wt = w.add(blk * bstride + (ky * K + kx) * cin * LANES);
                for ci in 0..cin {
                    let mut wv = [V::splat(0.0); NB];
                    for (b, v) in wv.iter_mut().enumerate() {
                        *v = V::load(wt.add(b * bstride + ci * LANES));
                    }
                    for (p, a) in acc.iter_mut().enumerate() {
                        let x = V::splat(*s.add(p * cs + ci));
                        for b in 0..NB {
                            a[b] = V::mul_add(x, wv[b], a[b]);
                        }
                    }
                }
            }
        }
        if let Some(slope) = &c.slope {
            for b in 0..NB {
                let s = V::load(slope.as_ptr().add((blk + b) * LANES));
                for a in acc.iter_mut() {
                    a[b] = a[b].prelu(s);
                }
            }
        }
        acc
    }
}

/// One output row of a K x K convolution (K = 1, 2 or 3) of width `ow`: pixel `x`, channel `o`
/// at `dst[x * c.cs_out() + o]`, whole tiles written (`dst` holds `ow + PAD` pixels).
#[inline(always)]
pub(crate) fn conv_row<V: Lanes, const P1: usize, const P2: usize>(src: &Src, ow: usize, c: &Packed, dst: &mut [f32]) {
    match c.k {
        1 => conv_row_k::<V, 1, P1, P2>(src, ow, c, dst),
        2 => conv_row_k::<V, 2, P1, P2>(src, ow, c, dst),
        3 => conv_row_k::<V, 3, P1, P2>(src, ow, c, dst),
        k => unreachable!("MTCNN has no {k}x{k} convolution"),
    }
}

#[inline(always)]
fn conv_row_k<V: Lanes, const K: usize, const P1: usize, const P2: usize>(
    src: &Src,
    ow: usize,
    c: &Packed,
    dst: &mut [f32],
) {
    let blocks = c.blocks();
    let mut blk = 0;
    while blk < blocks {
        if blk + 1 < blocks {
            store::<V, K, P2, 2>(src, ow, c, blk, dst);
            blk += 2;
        } else {
            store::<V, K, P1, 1>(src, ow, c, blk, dst);
            blk += 1;
        }
    }
}

/// The tiles of blocks `blk..blk + NB` along the row, stored.
#[inline(always)]
fn store<V: Lanes, const K: usize, const P: usize, const NB: usize>(
    src: &Src,
    ow: usize,
    c: &Packed,
    blk: usize,
    dst: &mut [f32],
) {
    let (tiles, cso) = (ow.div_ceil(P), c.cs_out());
    assert!(dst.len() >= (tiles * P - 1) * cso + (blk + NB) * LANES);
    for t in 0..tiles {
        let x0 = t * P;
        let acc = tile::<V, K, P, NB>(src, x0, c, blk);
        for (p, a) in acc.iter().enumerate() {
            for (b, v) in a.iter().enumerate() {
                // SAFETY: inside dst's length, asserted above.
                unsafe { v.store(dst.as_mut_ptr().add((x0 + p) * cso + (blk + b) * LANES)) };
            }
        }
    }
}

/// One output row of a k x k max pooling with stride 2 that rounds its size up (PyTorch's
/// `ceil_mode=True`): output pixel `x` takes the maximum over input rows `rows` (those inside the
/// map) and columns `2x .. 2x + k` inside the width `iw`. `cs` floats per pixel, a multiple of 16.
#[inline(always)]
pub(crate) fn pool_row<V: Lanes>(rows: &[&[f32]], k: usize, iw: usize, cs: usize, ow: usize, dst: &mut [f32]) {
    assert!(cs.is_multiple_of(LANES) && dst.len() >= ow * cs && !rows.is_empty());
    for r in rows {
        assert!(r.len() >= iw * cs);
    }
    for x in 0..ow {
        let (x0, x1) = (2 * x, (2 * x + k).min(iw));
        for b in (0..cs).step_by(LANES) {
            // SAFETY: pixels x0..x1 < iw of every row and output pixel x < ow, asserted above.
            unsafe {
                let mut m = V::load(rows[0].as_ptr().add(x0 * cs + b));
                for r in rows {
                    for xx in x0..x1 {
                        m = m.max(V::load(r.as_ptr().add(xx * cs + b)));
                    }
                }
                m.store(dst.as_mut_ptr().add(x * cs + b));
            }
        }
    }
}

/// Output length of a `ceil_mode` pooling with stride 2 (a window always starts inside the input).
pub(crate) fn pooled(n: usize, k: usize) -> usize {
    (n - k).div_ceil(2) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::mtcnn::test_values as lcg;

    /// Every arm this CPU runs (the portable one always).
    fn runnable() -> Vec<Arm> {
        let mut arms = vec![Arm::Portable];
        if Isa::Avx2.supported() {
            arms.push(Arm::Avx2);
        }
        if Isa::Avx512.supported() {
            arms.push(Arm::Avx512);
        }
        arms
    }

    arms! {
        /// A whole unpadded convolution of an `h` x `w` map (`cs` floats a pixel, rows of
        /// `w + PAD` pixels), row by row: the output rows, `c.cs_out()` floats a pixel.
        fn conv_map<V, P1, P2>(c: &Packed, x: &[f32], h: usize, w: usize, cs: usize) -> Vec<f32> {
            let (oh, ow, co) = (h - c.k + 1, w - c.k + 1, c.cs_out());
            let row = |y: usize| &x[y * (w + PAD) * cs..][..(w + PAD) * cs];
            let mut out = vec![0f32; oh * (w + PAD) * co];
            for y in 0..oh {
                let rows = [0, 1, 2].map(|k| row(y + k.min(c.k - 1)));
                conv_row::<V, P1, P2>(&Src { rows, cs }, ow, c, &mut out[y * (w + PAD) * co..][..(w + PAD) * co]);
            }
            out
        }
    }

    arms! {
        fn pool_map<V, P1, P2>(x: &[f32], h: usize, w: usize, cs: usize, k: usize) -> Vec<f32> {
            let (oh, ow) = (pooled(h, k), pooled(w, k));
            let mut out = vec![0f32; oh * ow * cs];
            for y in 0..oh {
                let rows: Vec<&[f32]> = (2 * y..(2 * y + k).min(h)).map(|r| &x[r * w * cs..(r + 1) * w * cs]).collect();
                pool_row::<V>(&rows, k, w, cs, ow, &mut out[y * ow * cs..(y + 1) * ow * cs]);
            }
            out
        }
    }

    /// Each arm against an f64 convolution (bias, taps, PReLU) on MTCNN's layer shapes and widths
    /// that end inside a tile of every arm; the FMA arms agree bit for bit.
    #[test]
    fn every_arm_matches_the_f64_convolution() {
        let cases = [
            // (k, cin, cs, cout, h, w, prelu)
            (3, 3, 3, 10, 5, 17, true),
            (3, 10, 16, 16, 4, 13, true),
            (3, 16, 16, 32, 6, 25, true),
            (3, 28, 32, 48, 9, 9, true),
            (2, 48, 48, 64, 4, 4, true),
            (1, 32, 32, 6, 1, 29, false),
            (1, 576, 576, 128, 1, 7, true),
        ];
        for (i, &(k, cin, cs, cout, h, w, prelu)) in cases.iter().enumerate() {
            let seed = 10 * i as u64;
            let x = lcg(seed, h * (w + PAD) * cs);
            let (wt, bias, slope) = (lcg(seed + 1, cout * cin * k * k), lcg(seed + 2, cout), lcg(seed + 3, cout));
            let c = Packed::new(k, cin, cout, &wt, &bias, prelu.then_some(&slope[..]), None);
            let (oh, ow, co) = (h - k + 1, w - k + 1, c.cs_out());
            let mut fma_bits: Option<Vec<u32>> = None;
            for arm in runnable() {
                let got = conv_map(arm, &c, &x, h, w, cs);
                let mut bits = Vec::new();
                for y in 0..oh {
                    for xx in 0..ow {
                        for o in 0..cout {
                            let mut want = bias[o] as f64;
                            for ky in 0..k {
                                for kx in 0..k {
                                    for ci in 0..cin {
                                        let v = x[((y + ky) * (w + PAD) + xx + kx) * cs + ci] as f64;
                                        want += v * wt[((o * cin + ci) * k + ky) * k + kx] as f64;
                                    }
                                }
                            }
                            if prelu && want <= 0.0 {
                                want *= slope[o] as f64;
                            }
                            let g = got[(y * (w + PAD) + xx) * co + o];
                            let tol = 1e-6 * (cin * k * k) as f64;
                            assert!((g as f64 - want).abs() <= tol, "case {i} {arm:?} ({xx}, {y}) {o}: {g} vs {want}");
                            bits.push(g.to_bits());
                        }
                    }
                }
                if arm != Arm::Portable {
                    match &fma_bits {
                        None => fma_bits = Some(bits),
                        Some(b) => assert!(b == &bits, "case {i}: {arm:?} differs from the other FMA arm"),
                    }
                }
            }
        }
    }

    /// Max pooling that rounds up, on every arm, against the direct definition.
    #[test]
    fn pooling_rounds_up_as_pytorch() {
        for (h, w, k) in [(22, 22, 3), (9, 9, 3), (21, 21, 3), (8, 8, 2), (7, 5, 2), (2, 3, 2)] {
            let x = lcg((h * 100 + w) as u64, h * w * LANES);
            let (oh, ow) = (pooled(h, k), pooled(w, k));
            for arm in runnable() {
                let got = pool_map(arm, &x, h, w, LANES, k);
                for y in 0..oh {
                    for xx in 0..ow {
                        for c in 0..LANES {
                            let mut m = f32::NEG_INFINITY;
                            for yy in 2 * y..(2 * y + k).min(h) {
                                for xi in 2 * xx..(2 * xx + k).min(w) {
                                    m = m.max(x[(yy * w + xi) * LANES + c]);
                                }
                            }
                            assert_eq!(got[(y * ow + xx) * LANES + c], m, "{h}x{w} k{k} {arm:?}");
                        }
                    }
                }
            }
        }
    }
}
