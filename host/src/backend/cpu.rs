//! CPU paths of every kernel: multi-threaded (rayon), f32 arithmetic, f32 or f16 storage, the
//! same scalar math as the device (`cadence_kernels`). Real implementations, used by the
//! pipeline whenever no GPU is present, and the reference the CUDA path is checked against.
//!
//! Speed (issue 2; measurements and causes in host/tests/cpu_fast_paths.rs and the bench):
//! - Frame copies (the keyframes' own frames, held tails, easing at rest) never go through the
//!   C library's `memcpy` ([`Elem::copy_bits`]): glibc 2.36 copies 16 KB with `rep movsb`,
//!   which on this AMD EPYC runs 4-16x slower when the destination is misaligned relative to
//!   the source, so the speed depended on where the allocator put the buffers.
//! - The binary targets baseline x86-64 (SSE2), so the hot loops are compiled three times, as
//!   they are, with AVX + FMA + F16C and with AVX-512, and the version is chosen at run time
//!   ([`isa`], capped by `CADENCE_MAX_ISA`, see `cadence_engines::isa`). All run
//!   the same operations in the same order: plain multiplies and adds are never contracted
//!   into fused ones (Rust does not contract), and the shared math's explicit `mul_add` is
//!   correctly rounded either way (an instruction, or compiler-builtins' `fmaf`), so the
//!   outputs are bitwise identical whichever runs (tested).
//! - f16 storage is never converted element by element: with F16C the conversions are fused
//!   into the loops (`f16_avx`), otherwise each keyframe pair is widened once into per-task
//!   staging ([`Scratch`]) and output is narrowed in blocks of `BLOCK` elements.

use crate::backend::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::backend::grid_sample::GridSample3d;
use crate::schedules::keyframes::KeyframeSchedule;
use cadence_kernels::color;
use cadence_kernels::grid_sample::{Corner, Trilinear};
use cadence_kernels::math::easing_weight;
use cadence_kernels::slerp::{interval_alpha, interval_frames, PairGeometry, PairSums};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU8, Ordering};

/// Independent accumulators: lets the compiler vectorize the reduction (a single running sum
/// is a serial dependency chain). 16 lanes fill four SSE or two AVX registers per sum.
const LANES: usize = 16;
/// f16 output is computed in f32 blocks of this many elements (4 KB, stays in L1) and narrowed.
const BLOCK: usize = 1024;

// ---------------------------------------------------------------------------------------------
// Instruction-set choice

/// Which compiled version of the hot loops runs (lowest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// What the build targets (x86-64: SSE2).
    Baseline,
    /// x86-64 with AVX, FMA and F16C, detected at run time.
    Avx,
    /// The same plus AVX-512 F, BW, DQ and VL.
    Avx512,
}

const ISA_UNKNOWN: u8 = u8::MAX;
static ISA: AtomicU8 = AtomicU8::new(ISA_UNKNOWN);

fn supported(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let avx = std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        match isa {
            Isa::Baseline => true,
            Isa::Avx => avx,
            Isa::Avx512 => avx && cadence_engines::isa::Isa::Avx512.supported(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        isa == Isa::Baseline
    }
}

/// The highest version `CADENCE_MAX_ISA` allows (the engines' [`cadence_engines::isa`] reads
/// it): `avx2` allows [`Isa::Avx`]; unset, every version.
fn allowed(isa: Isa) -> bool {
    use cadence_engines::isa::{env_cap, Isa as Level};
    let cap = env_cap().unwrap_or_else(|e| panic!("{e}"));
    match (isa, cap) {
        (_, None) | (Isa::Baseline, _) | (_, Some(Level::Avx512)) => true,
        (Isa::Avx, Some(l)) => l >= Level::Avx2,
        (Isa::Avx512, Some(_)) => false,
    }
}

const VERSIONS: [Isa; 3] = [Isa::Baseline, Isa::Avx, Isa::Avx512];

/// The version in use: the best this CPU supports and `CADENCE_MAX_ISA` allows, unless
/// [`set_isa`] chose one.
#[inline]
pub fn isa() -> Isa {
    match ISA.load(Ordering::Relaxed) {
        ISA_UNKNOWN => {
            let v = VERSIONS.into_iter().rev().find(|&i| supported(i) && allowed(i)).unwrap_or(Isa::Baseline);
            ISA.store(v as u8, Ordering::Relaxed);
            v
        }
        i => VERSIONS[i as usize],
    }
}

/// Forces a version (`None`: detect again). Fails for a version this CPU lacks or
/// `CADENCE_MAX_ISA` forbids. For tests and benchmarks: the results are the same either way,
/// only the speed differs.
pub fn set_isa(choice: Option<Isa>) -> anyhow::Result<()> {
    let v = match choice {
        None => ISA_UNKNOWN,
        Some(i) => {
            anyhow::ensure!(supported(i), "this CPU cannot run the {i:?} version");
            anyhow::ensure!(allowed(i), "CADENCE_MAX_ISA forbids the {i:?} version");
            i as u8
        }
    };
    ISA.store(v, Ordering::Relaxed);
    Ok(())
}

/// `pub fn $name` runs `$body` compiled for the instruction set [`isa`] returns. The bodies are
/// `#[inline(always)]`, so each is compiled once per version, loops included. Generic over the
/// storage type (`fn name<T: Elem>(..)`) or not.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident<T: Elem>($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? => $body:ident) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name<T: Elem>($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                fn avx<T: Elem>($($a: $t),*) $(-> $r)? {
                    $body::<T>($($a),*)
                }
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                fn avx512<T: Elem>($($a: $t),*) $(-> $r)? {
                    $body::<T>($($a),*)
                }
                match $crate::backend::cpu::isa() {
                    // SAFETY: isa() returns a version only where the CPU has its features.
                    $crate::backend::cpu::Isa::Avx512 => return unsafe { avx512::<T>($($a),*) },
                    // SAFETY: as above.
                    $crate::backend::cpu::Isa::Avx => return unsafe { avx::<T>($($a),*) },
                    $crate::backend::cpu::Isa::Baseline => {}
                }
            }
            $body::<T>($($a),*)
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? => $body:ident) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                fn avx($($a: $t),*) $(-> $r)? {
                    $body($($a),*)
                }
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                fn avx512($($a: $t),*) $(-> $r)? {
                    $body($($a),*)
                }
                match $crate::backend::cpu::isa() {
                    // SAFETY: isa() returns a version only where the CPU has its features.
                    $crate::backend::cpu::Isa::Avx512 => return unsafe { avx512($($a),*) },
                    // SAFETY: as above.
                    $crate::backend::cpu::Isa::Avx => return unsafe { avx($($a),*) },
                    $crate::backend::cpu::Isa::Baseline => {}
                }
            }
            $body($($a),*)
        }
    };
}
pub(crate) use multiversion;

// ---------------------------------------------------------------------------------------------
// Building blocks (always inlined into the versions above)

#[inline(always)]
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

/// The four sums from the lane accumulators.
#[inline(always)]
fn sums_total(acc: &[[f32; LANES]; 4]) -> PairSums {
    let total = |v: &[f32; LANES]| v.iter().sum::<f32>();
    PairSums { s00: total(&acc[0]), s11: total(&acc[1]), sdiff: total(&acc[2]), ssum: total(&acc[3]) }
}

#[inline(always)]
fn pair_sums_body<T: Elem>(a: &[T], b: &[T]) -> PairSums {
    assert_eq!(a.len(), b.len());
    let mut acc = [[0.0f32; LANES]; 4];
    if let (Some(a), Some(b)) = (T::as_f32(a), T::as_f32(b)) {
        sums_f32(a, b, &mut acc);
    } else {
        // Blocks are multiples of LANES, so every element lands in the lane it would in one
        // pass over the whole frame: the same sums, bit for bit.
        let mut wa = [0.0f32; BLOCK];
        let mut wb = [0.0f32; BLOCK];
        for (x, y) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
            let n = x.len();
            T::widen(x, &mut wa[..n]);
            T::widen(y, &mut wb[..n]);
            sums_f32(&wa[..n], &wb[..n], &mut acc);
        }
    }
    sums_total(&acc)
}

/// f32 staging for f16 storage, made once per rayon job (not per frame or per block): each
/// keyframe pair is widened once, then serves both the reduction and every frame it writes.
#[derive(Default)]
pub struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    out: Vec<f32>,
}

/// `x` as f32: itself for f32 storage, else widened into `buf`.
#[inline(always)]
fn wide<'s, T: Elem>(x: &'s [T], buf: &'s mut Vec<f32>) -> &'s [f32] {
    match T::as_f32(x) {
        Some(s) => s,
        None => {
            buf.resize(x.len(), 0.0);
            T::widen(x, buf);
            buf
        }
    }
}

/// LERP needs no statistics.
const LERP_GEOMETRY: PairGeometry =
    PairGeometry { n0: 1.0, n1: 1.0, theta: 0.0, sin_theta: 0.0, cos_theta: 1.0, kind: 0 };

#[inline(always)]
fn geometry_f32(method: Method, a: &[f32], b: &[f32]) -> PairGeometry {
    match method {
        Method::Lerp => LERP_GEOMETRY,
        Method::Slerp => {
            let mut acc = [[0.0f32; LANES]; 4];
            sums_f32(a, b, &mut acc);
            PairGeometry::from_sums(&sums_total(&acc))
        }
    }
}

/// o = c0 a + c1 b (two roundings per element and one for the sum, as on the device).
#[inline(always)]
fn lin_f32(a: &[f32], b: &[f32], o: &mut [f32], c0: f32, c1: f32) {
    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
        *o = c0 * x + c1 * y;
    }
}

/// dst = c0 a + c1 b, with exact copies of the stored keyframes at the endpoints (as on the
/// device: NaN or infinite elements of the other keyframe must not leak into a keyframe's own
/// frame). `af`, `bf` are `a`, `b` as f32; `buf` stages f16 output a block at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn write_frame<T: Elem>(a: &[T], b: &[T], af: &[f32], bf: &[f32], dst: &mut [T], c0: f32, c1: f32, buf: &mut Vec<f32>) {
    if c0 == 1.0 && c1 == 0.0 {
        T::copy_bits(a, dst);
    } else if c0 == 0.0 && c1 == 1.0 {
        T::copy_bits(b, dst);
    } else if let Some(d) = T::as_f32_mut(dst) {
        lin_f32(af, bf, d, c0, c1);
    } else {
        buf.resize(BLOCK, 0.0);
        for ((d, x), y) in dst.chunks_mut(BLOCK).zip(af.chunks(BLOCK)).zip(bf.chunks(BLOCK)) {
            let o = &mut buf[..d.len()];
            lin_f32(x, y, o, c0, c1);
            T::narrow(o, d);
        }
    }
}

/// One interval of the expansion: the pair's geometry once, then every frame it owns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn interval_body<T: Elem>(
    a: &[T],
    b: &[T],
    method: Method,
    k0: u32,
    k1: u32,
    first: usize,
    frames: &mut [T],
    s: &mut Scratch,
) {
    #[cfg(target_arch = "x86_64")]
    if let (Some(a), Some(b), true) = (T::as_f16(a), T::as_f16(b), isa() >= Isa::Avx) {
        // SAFETY: isa() is Avx or above only where the CPU has AVX, FMA and F16C.
        return unsafe { f16_avx::interval(a, b, method, k0, k1, first, T::as_f16_mut(frames).expect("f16 storage")) };
    }
    let (af, bf) = (wide(a, &mut s.a), wide(b, &mut s.b));
    let g = geometry_f32(method, af, bf);
    for (i, o) in frames.chunks_mut(a.len()).enumerate() {
        let (c0, c1) = g.coeffs(method.code(), interval_alpha((first + i) as u32, k0, k1));
        write_frame(a, b, af, bf, o, c0, c1, &mut s.out);
    }
}

#[inline(always)]
fn row_body<T: Elem>(a: &[T], b: &[T], alpha: f32, method: Method, out: &mut [T], s: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    if let (Some(a), Some(b), true) = (T::as_f16(a), T::as_f16(b), isa() >= Isa::Avx) {
        // SAFETY: as in interval_body.
        return unsafe { f16_avx::row(a, b, alpha, method, T::as_f16_mut(out).expect("f16 storage")) };
    }
    let (af, bf) = (wide(a, &mut s.a), wide(b, &mut s.b));
    let (c0, c1) = geometry_f32(method, af, bf).coeffs(method.code(), alpha);
    write_frame(a, b, af, bf, out, c0, c1, &mut s.out);
}

/// f = c0 rest + c1 f, in place.
#[inline(always)]
fn ease_body<T: Elem>(f: &mut [T], rest: &[T], w: f32, s: &mut Scratch) {
    if w == 0.0 {
        T::copy_bits(rest, f);
        return;
    }
    if w == 1.0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(r), true) = (T::as_f16(rest), isa() >= Isa::Avx) {
        // SAFETY: as in interval_body.
        return unsafe { f16_avx::ease(T::as_f16_mut(f).expect("f16 storage"), r, w) };
    }
    let rf = wide(rest, &mut s.a);
    if let Some(ff) = T::as_f32_mut(f) {
        let (c0, c1) = geometry_f32(Method::Slerp, rf, ff).slerp_coeffs(w);
        for (o, &x) in ff.iter_mut().zip(rf) {
            *o = c0 * x + c1 * *o;
        }
        return;
    }
    s.b.resize(f.len(), 0.0);
    T::widen(f, &mut s.b);
    let ff = &s.b[..];
    let (c0, c1) = geometry_f32(Method::Slerp, rf, ff).slerp_coeffs(w);
    s.out.resize(BLOCK, 0.0);
    for ((d, x), y) in f.chunks_mut(BLOCK).zip(rf.chunks(BLOCK)).zip(ff.chunks(BLOCK)) {
        let o = &mut s.out[..d.len()];
        lin_f32(x, y, o, c0, c1);
        T::narrow(o, d);
    }
}

#[inline(always)]
fn combine_body<T: Elem>(a: &[T], b: &[T], dst: &mut [T], c0: f32, c1: f32) {
    let mut s = Scratch::default();
    let (af, bf) = (wide(a, &mut s.a), wide(b, &mut s.b));
    write_frame(a, b, af, bf, dst, c0, c1, &mut s.out);
}

/// f16 storage on CPUs with F16C: the conversions fused into the loops (eight elements per
/// instruction), so the keyframes are read as f16 straight from L1 and no f32 copy of them or
/// of the output is ever stored. Same operations in the same order as the generic path (the
/// sums in the same 16 lanes, plain multiplies and adds, round to nearest even on output), so
/// the same bits.
#[cfg(target_arch = "x86_64")]
mod f16_avx {
    use super::{interval_alpha, sums_total, Method, PairGeometry, PairSums, LANES, LERP_GEOMETRY};
    use crate::backend::elem::Elem;
    use half::f16;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    #[inline(always)]
    unsafe fn store8(p: *mut f16, v: __m256) {
        unsafe { _mm_storeu_si128(p as *mut __m128i, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
    }

    /// `sums_f32` on the widened values: lanes 0-7 and 8-15 of each sum in two registers.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn sums(a: &[f16], b: &[f16]) -> PairSums {
        assert_eq!(a.len(), b.len());
        let n16 = a.len() / LANES * LANES;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let mut i = 0;
        while i < n16 {
            for h in 0..2 {
                // SAFETY: i + 16 <= len.
                let (p, q) = unsafe { (load8(pa.add(i + 8 * h)), load8(pb.add(i + 8 * h))) };
                let (d, s) = (_mm256_sub_ps(p, q), _mm256_add_ps(p, q));
                acc[0][h] = _mm256_add_ps(acc[0][h], _mm256_mul_ps(p, p));
                acc[1][h] = _mm256_add_ps(acc[1][h], _mm256_mul_ps(q, q));
                acc[2][h] = _mm256_add_ps(acc[2][h], _mm256_mul_ps(d, d));
                acc[3][h] = _mm256_add_ps(acc[3][h], _mm256_mul_ps(s, s));
            }
            i += LANES;
        }
        let mut lanes = [[0.0f32; LANES]; 4];
        for (k, l) in lanes.iter_mut().enumerate() {
            // SAFETY: each row holds 16 floats.
            unsafe {
                _mm256_storeu_ps(l.as_mut_ptr(), acc[k][0]);
                _mm256_storeu_ps(l.as_mut_ptr().add(8), acc[k][1]);
            }
        }
        for (l, (x, y)) in a[n16..].iter().zip(&b[n16..]).enumerate() {
            let (p, q) = (x.to_f32(), y.to_f32());
            let (d, s) = (p - q, p + q);
            lanes[0][l] += p * p;
            lanes[1][l] += q * q;
            lanes[2][l] += d * d;
            lanes[3][l] += s * s;
        }
        sums_total(&lanes)
    }

    /// dst = c0 a + c1 b; `a` and `dst` may be the same memory (easing in place).
    #[inline(always)]
    unsafe fn lin(a: *const f16, b: *const f16, dst: *mut f16, len: usize, c0: f32, c1: f32) {
        let (v0, v1) = (_mm256_set1_ps(c0), _mm256_set1_ps(c1));
        let n8 = len / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: the caller's three ranges hold len elements; each element is read before
            // it is written.
            unsafe {
                let r = _mm256_add_ps(_mm256_mul_ps(v0, load8(a.add(i))), _mm256_mul_ps(v1, load8(b.add(i))));
                store8(dst.add(i), r);
            }
            i += 8;
        }
        while i < len {
            // SAFETY: as above.
            unsafe { *dst.add(i) = f16::from_f32(c0 * (*a.add(i)).to_f32() + c1 * (*b.add(i)).to_f32()) };
            i += 1;
        }
    }

    #[inline(always)]
    fn write_frame(a: &[f16], b: &[f16], dst: &mut [f16], c0: f32, c1: f32) {
        assert!(a.len() == dst.len() && b.len() == dst.len());
        if c0 == 1.0 && c1 == 0.0 {
            f16::copy_bits(a, dst);
        } else if c0 == 0.0 && c1 == 1.0 {
            f16::copy_bits(b, dst);
        } else {
            // SAFETY: three distinct slices of one length; the enclosing function has AVX+F16C.
            unsafe { lin(a.as_ptr(), b.as_ptr(), dst.as_mut_ptr(), dst.len(), c0, c1) }
        }
    }

    #[inline(always)]
    fn geometry(method: Method, a: &[f16], b: &[f16]) -> PairGeometry {
        match method {
            Method::Lerp => LERP_GEOMETRY,
            // SAFETY: the enclosing function has AVX+F16C.
            Method::Slerp => PairGeometry::from_sums(&unsafe { sums(a, b) }),
        }
    }

    #[target_feature(enable = "avx,fma,f16c")]
    pub(super) fn interval(a: &[f16], b: &[f16], method: Method, k0: u32, k1: u32, first: usize, frames: &mut [f16]) {
        let g = geometry(method, a, b);
        for (i, o) in frames.chunks_mut(a.len()).enumerate() {
            let (c0, c1) = g.coeffs(method.code(), interval_alpha((first + i) as u32, k0, k1));
            write_frame(a, b, o, c0, c1);
        }
    }

    #[target_feature(enable = "avx,fma,f16c")]
    pub(super) fn row(a: &[f16], b: &[f16], alpha: f32, method: Method, out: &mut [f16]) {
        let (c0, c1) = geometry(method, a, b).coeffs(method.code(), alpha);
        write_frame(a, b, out, c0, c1);
    }

    /// f = c0 rest + c1 f for 0 < w < 1.
    #[target_feature(enable = "avx,fma,f16c")]
    pub(super) fn ease(f: &mut [f16], rest: &[f16], w: f32) {
        assert_eq!(f.len(), rest.len());
        let (c0, c1) = geometry(Method::Slerp, rest, f).slerp_coeffs(w);
        let p = f.as_mut_ptr();
        // SAFETY: f is read element by element before being overwritten in place.
        unsafe { lin(rest.as_ptr(), p, p, f.len(), c0, c1) }
    }
}

// ---------------------------------------------------------------------------------------------
// Dispatched entry points

multiversion! {
    /// The four sums of a pair of frames, in one pass.
    pub fn pair_sums<T: Elem>(a: &[T], b: &[T]) -> PairSums => pair_sums_body
}

multiversion! {
    /// dst = c0 a + c1 b, with exact copies at the endpoints (as on the device). The bulk
    /// functions below are faster for many frames (they reuse their f16 staging).
    pub fn combine<T: Elem>(a: &[T], b: &[T], dst: &mut [T], c0: f32, c1: f32) => combine_body
}

multiversion! {
    fn interval<T: Elem>(a: &[T], b: &[T], method: Method, k0: u32, k1: u32, first: usize, frames: &mut [T], s: &mut Scratch) => interval_body
}

multiversion! {
    fn row<T: Elem>(a: &[T], b: &[T], alpha: f32, method: Method, out: &mut [T], s: &mut Scratch) => row_body
}

multiversion! {
    fn ease_frame<T: Elem>(f: &mut [T], rest: &[T], w: f32, s: &mut Scratch) => ease_body
}

pub fn pair_geometry<T: Elem>(a: &[T], b: &[T]) -> PairGeometry {
    PairGeometry::from_sums(&pair_sums(a, b))
}

/// `out[r] = interp(v0[r], v1[r], alphas[r])` for rows of `dim` elements.
pub fn slerp_pairs<T: Elem>(v0: &[T], v1: &[T], alphas: &[f32], dim: usize, method: Method, out: &mut [T]) {
    assert!(dim > 0 && v0.len() == alphas.len() * dim && v1.len() == v0.len() && out.len() == v0.len());
    out.par_chunks_mut(dim)
        .zip(v0.par_chunks(dim).zip(v1.par_chunks(dim)))
        .zip(alphas.par_iter())
        .for_each_init(Scratch::default, |s, ((o, (a, b)), &alpha)| row(a, b, alpha, method, o, s));
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
        out.par_chunks_mut(dim).for_each(|o| T::copy_bits(key(0), o));
        return;
    }
    let kf = schedule.keyframes();
    interval_parts(schedule, dim, out).into_par_iter().for_each_init(Scratch::default, |s, (j, first, frames)| {
        interval(key(j), key(j + 1), method, kf[j], kf[j + 1], first, frames, s);
    });
}

/// The output split into the frame ranges each keyframe interval owns
/// ([`interval_frames`], the device kernel's rule): (interval j, its first frame, its frames).
/// Needs at least two keyframes.
pub fn interval_parts<'a, T>(
    schedule: &KeyframeSchedule,
    dim: usize,
    out: &'a mut [T],
) -> Vec<(usize, usize, &'a mut [T])> {
    let m = schedule.count();
    let n = schedule.n_frames();
    assert!(m >= 2 && out.len() == n * dim);
    let kf = schedule.keyframes();
    let mut parts = Vec::with_capacity(m - 1);
    let mut rest = out;
    for j in 0..m - 1 {
        let (first, end) = interval_frames(j as u32, m as u32, kf[j], kf[j + 1], n as u32);
        let (first, end) = (first as usize, end as usize);
        let (mine, tail) = rest.split_at_mut((end - first) * dim);
        parts.push((j, first, mine));
        rest = tail;
    }
    parts
}

/// Silence easing, in place: frame f becomes `SLERP(rest, frame, h(1 - distance[f]/ramp))`.
pub fn ease<T: Elem>(frames: &mut [T], rest: &[T], distance: &[u32], ramp: u32) {
    let dim = rest.len();
    assert!(dim > 0 && frames.len() == distance.len() * dim);
    frames
        .par_chunks_mut(dim)
        .zip(distance.par_iter())
        .for_each_init(Scratch::default, |s, (f, &d)| ease_frame(f, rest, easing_weight(d, ramp), s));
}

/// Pixels per block of the NV12 conversion (6 rows of f32 staging for f16 input: 6 KB).
const NV12_BLOCK: usize = 256;

/// Planar RGB to tightly packed NV12 frames (Y: width x height, then height/2 rows of
/// width interleaved U,V bytes). `out` must hold `layout.frames * layout.nv12_frame_bytes()`.
pub fn rgb_to_nv12<T: Elem>(rgb: &[T], layout: RgbLayout, matrix: ColorMatrix, range: RgbRange, out: &mut [u8]) {
    let (w, h, pitch) = (layout.width, layout.height, layout.pitch);
    assert!(layout.validate(rgb.len()).is_ok() && out.len() == layout.frames * layout.nv12_frame_bytes());
    let coeffs = color::coeffs(matrix.code());
    let range = range.code();
    let plane = layout.plane_len();
    out.par_chunks_mut(layout.nv12_frame_bytes()).zip(rgb.par_chunks(layout.frame_len())).for_each(
        |(frame_out, src)| {
            let (y_plane, uv_plane) = frame_out.split_at_mut(w * h);
            // Rows (R0, R1, G0, G1, B0, B1) of a row pair, a block of columns at a time, widened to
            // f32 in blocks when stored as f16 (the staging buffer is made once per rayon job).
            let staging = || [[0.0f32; NV12_BLOCK]; 6];
            y_plane.par_chunks_mut(2 * w).zip(uv_plane.par_chunks_mut(w)).enumerate().for_each_init(
                staging,
                |staging, (by, (yrows, uvrow))| {
                    let (y0, y1) = yrows.split_at_mut(w);
                    let r0 = 2 * by * pitch;
                    let mut x0 = 0;
                    while x0 < w {
                        let n = NV12_BLOCK.min(w - x0);
                        let mut rows: [&[f32]; 6] = [&[]; 6];
                        for (i, buf) in staging.iter_mut().enumerate() {
                            let start = (i / 2) * plane + r0 + (i % 2) * pitch + x0;
                            let seg = &src[start..start + n];
                            rows[i] = match T::as_f32(seg) {
                                Some(s) => s,
                                None => {
                                    T::widen(seg, &mut buf[..n]);
                                    &buf[..n]
                                }
                            };
                        }
                        let px = |i: usize, x: usize| color::to_8bit(rows[i][x], range);
                        for bx in 0..n / 2 {
                            let (a, b) = (2 * bx, 2 * bx + 1);
                            let blk = color::convert_block(
                                &coeffs,
                                (px(0, a), px(0, b), px(1, a), px(1, b)),
                                (px(2, a), px(2, b), px(3, a), px(3, b)),
                                (px(4, a), px(4, b), px(5, a), px(5, b)),
                            );
                            let x = x0 + a;
                            store_block(&blk, y0, y1, uvrow, x);
                        }
                        x0 += n;
                    }
                },
            );
        },
    );
}

/// Writes one converted 2x2 block: two luma rows and the interleaved U,V row, at column `x`.
#[inline(always)]
fn store_block(blk: &cadence_kernels::color::Block2x2, y0: &mut [u8], y1: &mut [u8], uv: &mut [u8], x: usize) {
    y0[x] = blk.y.0;
    y0[x + 1] = blk.y.1;
    y1[x] = blk.y.2;
    y1[x + 1] = blk.y.3;
    uv[x] = blk.u;
    uv[x + 1] = blk.v;
}

/// The 3-D grid sample (`grid_sample_3d_f32`'s CPU path) with the kernel's shared math: per batch
/// item, the eight corners of every output voxel once (in parallel over voxels), then every
/// channel's plane from them (in parallel over channels). Same operations in the same order as the
/// kernel, so the results are bitwise the same.
pub fn grid_sample_3d(input: &[f32], grid: &[f32], s: &GridSample3d, out: &mut [f32]) {
    assert!(s.check_buffers(input.len(), grid.len()).is_ok() && out.len() == s.output_elements());
    let (volume, voxels) = (s.in_volume(), s.out_voxels());
    let (d, h, w) = (s.in_d as u32, s.in_h as u32, s.in_w as u32);
    let value = |plane: &[f32], c: &Corner| if c.inside { plane[c.index as usize] } else { 0.0 };
    for n in 0..s.batch {
        let points = &grid[n * voxels * 3..(n + 1) * voxels * 3];
        let taps: Vec<Trilinear> = points.par_chunks(3).map(|p| Trilinear::new(p[0], p[1], p[2], d, h, w)).collect();
        let planes = &input[n * s.channels * volume..(n + 1) * s.channels * volume];
        let outs = &mut out[n * s.channels * voxels..(n + 1) * s.channels * voxels];
        outs.par_chunks_mut(voxels).zip(planes.par_chunks(volume)).for_each(|(o, plane)| {
            for (o, t) in o.iter_mut().zip(&taps) {
                *o = t.blend(
                    value(plane, &t.c000),
                    value(plane, &t.c001),
                    value(plane, &t.c010),
                    value(plane, &t.c011),
                    value(plane, &t.c100),
                    value(plane, &t.c101),
                    value(plane, &t.c110),
                    value(plane, &t.c111),
                );
            }
        });
    }
}
