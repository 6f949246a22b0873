//! The CPU paths' speed work (issue 2) must not change a single bit: the AVX+FMA+F16C version
//! of the hot loops against the baseline one, the blocked f16 conversions against the
//! element-by-element formula, frame copies against the source bits. Plus a smoke test of the
//! benchmark and, ignored by default, the benchmark table itself:
//! `cargo test --release -p cadence --test cpu_fast_paths -- --ignored --nocapture`.

mod common;
use cadence::backend::cpu::{self, Isa};
use cadence::measure::bench::{bench_expand_dtype, print_expand_table, Placed};
use cadence::{Backend, ColorMatrix, Dtype, Elem, KeyframeSchedule, Method, RgbLayout, RgbRange};
use common::*;
use half::f16;

fn bits<T: Elem>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_f32().to_bits()).collect()
}

fn f16s(v: &[f32]) -> Vec<f16> {
    v.iter().map(|&x| f16::from_f32(x)).collect()
}

/// Every CPU kernel's output for one storage type, concatenated as bits.
fn run_all<T: Elem>(dim: usize, seed: u64) -> Vec<u32> {
    let mut r = rng(seed);
    let to = |v: Vec<f32>| -> Vec<T> { v.into_iter().map(T::from_f32).collect() };
    let mut all = Vec::new();
    for (n, k) in [(37usize, 2usize), (40, 3), (11, 7), (5, 1)] {
        let s = KeyframeSchedule::fixed_stride(n, k).unwrap();
        let keys = to(randn(&mut r, s.count() * dim));
        for method in [Method::Slerp, Method::Lerp] {
            let mut out = vec![T::default(); n * dim];
            cpu::expand(&keys, &s, dim, method, &mut out);
            all.extend(bits(&out));
        }
    }
    let rows = 9;
    let (v0, v1) = (to(randn(&mut r, rows * dim)), to(randn(&mut r, rows * dim)));
    let alphas: Vec<f32> = (0..rows).map(|i| i as f32 / (rows - 1) as f32).collect();
    let mut out = vec![T::default(); rows * dim];
    cpu::slerp_pairs(&v0, &v1, &alphas, dim, Method::Slerp, &mut out);
    all.extend(bits(&out));
    let rest = to(randn(&mut r, dim));
    let mut frames = to(randn(&mut r, 7 * dim));
    cpu::ease(&mut frames, &rest, &[0, 1, 2, 3, 4, 2, 0], 4);
    all.extend(bits(&frames));
    let s = cpu::pair_sums(&v0[..dim], &v1[..dim]);
    all.extend([s.s00, s.s11, s.sdiff, s.ssum].map(f32::to_bits));
    let layout = RgbLayout { width: 518, height: 6, pitch: 520, frames: 2 };
    let rgb = to(uniform(&mut r, layout.len(), -0.1, 1.1));
    let mut nv12 = vec![0u8; layout.frames * layout.nv12_frame_bytes()];
    cpu::rgb_to_nv12(&rgb, layout, ColorMatrix::Bt709, RgbRange::Unit, &mut nv12);
    all.extend(nv12.iter().map(|&b| b as u32));
    // The face compositor, upscaling an odd-sized crop into a box wider than 16 columns.
    let (w, h) = (96, 64);
    let bg: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
    let face = cadence::backend::composite::FaceBox { x: 6, y: 4, w: 70, h: 50 };
    let comp =
        cadence::backend::composite::Compositor::new(&Backend::Cpu, &bg, w, h, face, 9.0, ColorMatrix::Bt601).unwrap();
    let crop = uniform(&mut r, 3 * 33 * 29, -0.1, 1.1);
    let mut frame = vec![0u8; comp.frame_bytes()];
    comp.compose_frame(&crop, 33, 29, RgbRange::Unit, &mut frame).unwrap();
    all.extend(frame.iter().map(|&b| b as u32));
    // Ditto's motion infill (gathers 16 columns at a time where AVX-512 is), 40 columns: two
    // vector steps and a scalar tail; moves large enough to reach the clamped edges, and a NaN
    // keypoint (every coordinate NaN, sampled at 0 on both paths).
    let side = 40;
    let img = uniform(&mut r, 3 * side * side, 0.0, 1.0);
    let from = uniform(&mut r, 63, -1.0, 1.0);
    let to_kp: Vec<f32> = from.iter().zip(uniform(&mut r, 63, -0.3, 0.3)).map(|(a, d)| a + d).collect();
    all.extend(cadence::ditto::motion_warp::motion_warp(&img, side, &from, &to_kp).iter().map(|v| v.to_bits()));
    let mut nan_kp = to_kp.clone();
    nan_kp[4] = f32::NAN;
    all.extend(cadence::ditto::motion_warp::motion_warp(&img, side, &from, &nan_kp).iter().map(|v| v.to_bits()));
    all
}

#[test]
fn avx_and_baseline_versions_agree_bit_for_bit() {
    // The only test in this file that switches versions (others would merely run either).
    // Every version this CPU can run (and CADENCE_MAX_ISA allows) against the baseline.
    let versions: Vec<Isa> = [Isa::Avx, Isa::Avx512].into_iter().filter(|&i| cpu::set_isa(Some(i)).is_ok()).collect();
    cpu::set_isa(None).unwrap();
    if !versions.contains(&Isa::Avx512) {
        common::skipped("avx_and_baseline_versions_agree_bit_for_bit (AVX-512)", "no AVX-512 on this CPU (or capped)");
    }
    if versions.is_empty() {
        common::skipped("avx_and_baseline_versions_agree_bit_for_bit", "no AVX+FMA+F16C on this CPU");
        return;
    }
    for dim in [1usize, 15, 17, 1000, 1029, 4096, 4099] {
        cpu::set_isa(Some(Isa::Baseline)).unwrap();
        let (b32, b16) = (run_all::<f32>(dim, dim as u64), run_all::<f16>(dim, dim as u64));
        for &v in &versions {
            cpu::set_isa(Some(v)).unwrap();
            let (a32, a16) = (run_all::<f32>(dim, dim as u64), run_all::<f16>(dim, dim as u64));
            cpu::set_isa(None).unwrap();
            assert!(b32 == a32, "f32, dim {dim}: the {v:?} version differs from the baseline");
            assert!(b16 == a16, "f16, dim {dim}: the {v:?} version differs from the baseline");
        }
    }
}

/// The element-by-element formula the blocked f16 paths replaced.
fn combine_ref(a: &[f16], b: &[f16], c0: f32, c1: f32) -> Vec<f16> {
    if c0 == 1.0 && c1 == 0.0 {
        return a.to_vec();
    }
    if c0 == 0.0 && c1 == 1.0 {
        return b.to_vec();
    }
    a.iter().zip(b).map(|(x, y)| f16::from_f32(c0 * x.to_f32() + c1 * y.to_f32())).collect()
}

#[test]
fn blocked_f16_paths_match_the_elementwise_formula() {
    let mut r = rng(3);
    for dim in [3usize, 1023, 1024, 1025, 4096, 5000] {
        // expand
        let s = KeyframeSchedule::fixed_stride(23, 3).unwrap();
        let keys = f16s(&randn(&mut r, s.count() * dim));
        let mut out = vec![f16::ZERO; 23 * dim];
        cpu::expand(&keys, &s, dim, Method::Slerp, &mut out);
        let kf = s.keyframes();
        for f in 0..23u32 {
            let j = kf.iter().rposition(|&k| k <= f).unwrap().min(kf.len() - 2);
            let (a, b) = (&keys[j * dim..(j + 1) * dim], &keys[(j + 1) * dim..(j + 2) * dim]);
            let g = cpu::pair_geometry(a, b);
            let (c0, c1) = g.coeffs(Method::Slerp.code(), cadence_kernels::slerp::interval_alpha(f, kf[j], kf[j + 1]));
            let got = &out[f as usize * dim..(f as usize + 1) * dim];
            assert!(got == &combine_ref(a, b, c0, c1)[..], "expand f16, dim {dim}, frame {f}");
        }
        // slerp_pairs
        let (v0, v1) = (f16s(&randn(&mut r, 3 * dim)), f16s(&randn(&mut r, 3 * dim)));
        let alphas = [0.0f32, 0.3, 1.0];
        let mut out = vec![f16::ZERO; 3 * dim];
        cpu::slerp_pairs(&v0, &v1, &alphas, dim, Method::Slerp, &mut out);
        for (i, &alpha) in alphas.iter().enumerate() {
            let (a, b) = (&v0[i * dim..(i + 1) * dim], &v1[i * dim..(i + 1) * dim]);
            let (c0, c1) = cpu::pair_geometry(a, b).slerp_coeffs(alpha);
            assert!(
                out[i * dim..(i + 1) * dim] == combine_ref(a, b, c0, c1)[..],
                "slerp_pairs f16, dim {dim}, row {i}"
            );
        }
        // ease
        let rest = f16s(&randn(&mut r, dim));
        let frames = f16s(&randn(&mut r, 4 * dim));
        let distance = [0u32, 1, 2, 5];
        let mut eased = frames.clone();
        cpu::ease(&mut eased, &rest, &distance, 4);
        for (i, &d) in distance.iter().enumerate() {
            let f = &frames[i * dim..(i + 1) * dim];
            let w = cadence_kernels::math::easing_weight(d, 4);
            let want = if w == 1.0 {
                f.to_vec()
            } else {
                let (c0, c1) = cpu::pair_geometry(&rest, f).slerp_coeffs(w);
                combine_ref(&rest, f, c0, c1)
            };
            assert!(eased[i * dim..(i + 1) * dim] == want[..], "ease f16, dim {dim}, frame {i}");
        }
    }
    // rgb_to_nv12: f16 input gives exactly the bytes of its (exact) f32 widening.
    for layout in [
        RgbLayout { width: 2, height: 2, pitch: 2, frames: 1 },
        RgbLayout { width: 600, height: 4, pitch: 611, frames: 2 },
    ] {
        let rgb = f16s(&uniform(&mut r, layout.len(), -0.2, 1.2));
        let wide: Vec<f32> = rgb.iter().map(|x| x.to_f32()).collect();
        let mut a = vec![0u8; layout.frames * layout.nv12_frame_bytes()];
        let mut b = a.clone();
        cpu::rgb_to_nv12(&rgb, layout, ColorMatrix::Bt601, RgbRange::Unit, &mut a);
        cpu::rgb_to_nv12(&wide, layout, ColorMatrix::Bt601, RgbRange::Unit, &mut b);
        assert_eq!(a, b, "{layout:?}");
    }
}

#[test]
fn frame_copies_keep_every_bit() {
    let specials = [f32::NAN, -f32::NAN, f32::from_bits(0x7fc0_1234), f32::INFINITY, -0.0, 1e-42, -3.5];
    let src: Vec<f32> = (0..100).map(|i| specials[i % specials.len()]).collect();
    let mut dst = vec![0.0f32; src.len()];
    f32::copy_bits(&src, &mut dst);
    assert_eq!(bits(&src), bits(&dst));
    let src16: Vec<f16> = (0..100u16).map(|i| f16::from_bits(i.wrapping_mul(0x9e37) | 0x7c01)).collect();
    let mut dst16 = vec![f16::ZERO; src16.len()];
    f16::copy_bits(&src16, &mut dst16);
    assert!(src16.iter().zip(&dst16).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn placed_buffers_start_where_asked() {
    for off in [0usize, 16, 2048, 4092] {
        let p = Placed::<f32>::new(1000, off);
        assert_eq!(p.as_slice().as_ptr() as usize % 4096, off);
        assert_eq!(p.as_slice().len(), 1000);
    }
}

#[test]
fn bench_rows_are_complete_and_sane() {
    for dtype in [Dtype::F32, Dtype::F16] {
        let row = bench_expand_dtype(&Backend::Cpu, dtype, 40, 3, 256, Method::Slerp, 5).unwrap();
        assert_eq!((row.keyframes, row.dtype.as_str()), (14, dtype.suffix()));
        for v in [
            row.median_ms,
            row.min_ms,
            row.q1_ms,
            row.q3_ms,
            row.gbps,
            row.copy_median_ms,
            row.copy_gbps,
            row.ratio_to_copy,
        ] {
            assert!(v.is_finite() && v > 0.0, "{row:?}");
        }
        assert!(row.min_ms <= row.q1_ms && row.q1_ms <= row.median_ms && row.median_ms <= row.q3_ms);
        assert!(row.ratio_q1 <= row.ratio_to_copy && row.ratio_to_copy <= row.ratio_q3);
    }
}

/// The benchmark table (f32 and f16, k = 2 and 3, N = 640, 4x32x32), then the expansion alone
/// on buffers placed where `memcpy` would alias, to show its speed does not depend on placement.
/// REPS (default 201) sets the runs per row.
#[test]
#[ignore]
fn bench_table() {
    let reps = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(201);
    let mut rows = Vec::new();
    for dtype in [Dtype::F32, Dtype::F16] {
        for k in [2, 3] {
            rows.push(bench_expand_dtype(&Backend::Cpu, dtype, 640, k, 4096, Method::Slerp, reps).unwrap());
        }
    }
    print_expand_table(&rows);
    for k in [2usize, 3] {
        let s = KeyframeSchedule::fixed_stride(640, k).unwrap();
        let data = cadence::measure::fixtures::test_data(s.count() * 4096, 7);
        let mut line = format!("expansion f32 k={k}, median ms by (keys, frames) page offsets:");
        for (ko, oo) in [(0usize, 2048usize), (0, 16), (0, 0), (2528, 2544)] {
            let mut keys = Placed::<f32>::new(data.len(), ko);
            keys.as_mut_slice().copy_from_slice(&data);
            let mut out = Placed::<f32>::new(640 * 4096, oo);
            let t = cadence::measure::bench::time_host(3, reps, || {
                cpu::expand(keys.as_slice(), &s, 4096, Method::Slerp, out.as_mut_slice())
            });
            line += &format!("  ({ko},{oo}): {:.3}", cadence::measure::bench::median(&t));
        }
        println!("{line}");
    }
}

#[test]
fn block_conversions_match_halfs_scalar_ones() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut wide = vec![0.0f32; all.len()];
    f16::widen(&all, &mut wide);
    for (h, w) in all.iter().zip(&wide) {
        assert!(h.to_f32().to_bits() == w.to_bits() || (h.is_nan() && w.is_nan()), "{h:?} -> {w}");
    }
    // Every f16 value, the midpoints between neighbours (ties round to even), and values
    // beyond the range, with an odd length so the scalar tail runs too.
    let mut src: Vec<f32> = wide.clone();
    src.extend(wide.windows(2).map(|p| ((p[0] as f64 + p[1] as f64) / 2.0) as f32));
    src.extend([65520.0f32, 65519.99, 1e9, -1e9, 1e-9, f32::MIN_POSITIVE, f32::NAN, 3.0]);
    let mut narrow = vec![f16::ZERO; src.len()];
    f16::narrow(&src, &mut narrow);
    for (x, h) in src.iter().zip(&narrow) {
        let want = f16::from_f32(*x);
        assert!(want.to_bits() == h.to_bits() || (want.is_nan() && h.is_nan()), "{x} -> {h:?}, want {want:?}");
    }
}
