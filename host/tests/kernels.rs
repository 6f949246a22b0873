//! Every kernel against an f64 reference, written once and run as one named test per device
//! (`test_device!`): the CPU path, the CUDA kernels in the SIMT emulator, and CUDA (which fails
//! where a driver is present and the backend does not start, and is skipped where none is).

mod common;
use cadence::{Backend, ColorMatrix, KeyframeSchedule, Method, RgbLayout, RgbRange};
use common::*;
use half::f16;

const D: usize = 4096; // one 4x32x32 latent

fn slerp_matches_f64_reference_and_keeps_the_interpolated_norm(b: &Backend) {
    let mut r = rng(1);
    for &dim in &[D, 1000, 37, 2, 1] {
        let rows = 64;
        let v0 = randn(&mut r, rows * dim);
        let mut v1 = randn(&mut r, rows * dim);
        // Different norms per row, and some rows close together.
        for (i, x) in v1.iter_mut().enumerate() {
            let row = i / dim;
            *x = if row % 4 == 0 { v0[i] + 0.01 * *x } else { *x * (0.5 + row as f32 / 16.0) };
        }
        let alphas: Vec<f32> = (0..rows).map(|i| (i as f32 + 0.5) / rows as f32).collect();
        let out = b.slerp_pairs(&v0, &v1, &alphas, dim, Method::Slerp).unwrap();
        for (row, &alpha) in alphas.iter().enumerate() {
            let s = row * dim..(row + 1) * dim;
            let (a, c) = (to64(&v0[s.clone()]), to64(&v1[s.clone()]));
            if dim == 1 && (a[0] > 0.0) != (c[0] > 0.0) {
                continue; // 1-D opposite signs are antipodal: tested separately
            }
            let reference = slerp_ref(&a, &c, alpha as f64);
            let got = to64(&out[s]);
            // The pair basis is ill-conditioned near antipodal pairs (coefficients grow as
            // 1/sin theta and cancel): the bound scales with that, as documented in slerp.rs.
            let cond = 1.0 / angle(&a, &c).sin().max(1e-3);
            let err = rel_err(&got, &reference);
            assert!(err < 2e-5 * cond.max(1.0), "dim {dim} row {row}: relative error {err:e}");
            let target = (1.0 - alphas[row] as f64) * norm(&a) + alphas[row] as f64 * norm(&c);
            assert!(
                (norm(&got) / target - 1.0).abs() < 1e-5 * cond.max(1.0),
                "dim {dim} row {row} alpha {}: norm ratio {}",
                alphas[row],
                norm(&got) / target
            );
        }
    }
}
test_device!(slerp_matches_f64_reference_and_keeps_the_interpolated_norm);

fn slerp_endpoints_are_exact(b: &Backend) {
    let mut r = rng(2);
    let v0 = randn(&mut r, 3 * D);
    let v1 = randn(&mut r, 3 * D);
    for alpha in [0.0f32, 1.0] {
        for m in [Method::Slerp, Method::Lerp] {
            let out = b.slerp_pairs(&v0, &v1, &[alpha; 3], D, m).unwrap();
            assert_eq!(out, if alpha == 0.0 { v0.clone() } else { v1.clone() });
        }
    }
}
test_device!(slerp_endpoints_are_exact);

fn slerp_has_constant_angular_velocity(b: &Backend) {
    let mut r = rng(3);
    let u = unit(to64(&randn(&mut r, D)));
    let w = to64(&randn(&mut r, D));
    for theta in [0.05, 0.7, 1.5, 2.5, 3.0] {
        let v0: Vec<f32> = f32s(&u.iter().map(|x| 2.0 * x).collect::<Vec<_>>());
        let v1 = f32s(&at_angle(&u, &w, theta).iter().map(|x| 3.0 * x).collect::<Vec<_>>());
        let steps = 11;
        let alphas: Vec<f32> = (0..steps).map(|i| i as f32 / (steps - 1) as f32).collect();
        let rep = |v: &[f32]| v.iter().copied().cycle().take(steps * D).collect::<Vec<f32>>();
        let out = b.slerp_pairs(&rep(&v0), &rep(&v1), &alphas, D, Method::Slerp).unwrap();
        for (i, &alpha) in alphas.iter().enumerate() {
            let got = to64(&out[i * D..(i + 1) * D]);
            let ang = if alpha == 0.0 { 0.0 } else { angle(&to64(&v0), &got) };
            assert!((ang - alpha as f64 * theta).abs() < 2e-5, "theta {theta} alpha {alpha}: angle {ang}");
        }
    }
}
test_device!(slerp_has_constant_angular_velocity);

fn lerp_midpoint_norm_ratio_is_cos_half_theta(b: &Backend) {
    let mut r = rng(4);
    let u = unit(to64(&randn(&mut r, D)));
    let w = to64(&randn(&mut r, D));
    for i in 1..16 {
        let theta = std::f64::consts::PI * i as f64 / 16.0;
        let v0 = f32s(&u);
        let v1 = f32s(&at_angle(&u, &w, theta));
        let out = b.slerp_pairs(&v0, &v1, &[0.5], D, Method::Lerp).unwrap();
        let ratio = norm(&to64(&out));
        assert!((ratio - (theta / 2.0).cos()).abs() < 1e-5, "theta {theta}: ratio {ratio}");
        let s = b.slerp_pairs(&v0, &v1, &[0.5], D, Method::Slerp).unwrap();
        assert!((norm(&to64(&s)) - 1.0).abs() < 1e-5);
    }
}
test_device!(lerp_midpoint_norm_ratio_is_cos_half_theta);

fn degenerate_pairs_follow_the_documented_rules(b: &Backend) {
    let mut r = rng(5);
    let v = randn(&mut r, D);
    let zero = vec![0.0f32; D];
    let alpha = 0.25f32;
    // Zero vector: plain LERP of the raw vectors; norm is still the interpolated norm.
    let out = b.slerp_pairs(&zero, &v, &[alpha], D, Method::Slerp).unwrap();
    let want: Vec<f32> = v.iter().map(|x| alpha * x).collect();
    assert!(rel_err(&to64(&out), &to64(&want)) < 1e-6);
    let both = b.slerp_pairs(&zero, &zero, &[alpha], D, Method::Slerp).unwrap();
    assert!(both.iter().all(|&x| x == 0.0));
    // Identical vectors: the same vector back.
    let same = b.slerp_pairs(&v, &v, &[alpha], D, Method::Slerp).unwrap();
    assert!(rel_err(&to64(&same), &to64(&v)) < 1e-6);
    // Same direction, different norms: that direction at the interpolated norm.
    let v3: Vec<f32> = v.iter().map(|x| 3.0 * x).collect();
    let scaled = b.slerp_pairs(&v, &v3, &[0.5], D, Method::Slerp).unwrap();
    let want: Vec<f32> = v.iter().map(|x| 2.0 * x).collect();
    assert!(rel_err(&to64(&scaled), &to64(&want)) < 1e-6);
    // Antipodal: no unique great circle; LERP of the raw vectors, zero at the crossing.
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    let mid = b.slerp_pairs(&v, &neg, &[0.5], D, Method::Slerp).unwrap();
    assert!(mid.iter().all(|&x| x == 0.0), "antipodal midpoint is the zero vector");
    let q = b.slerp_pairs(&v, &neg, &[0.25], D, Method::Slerp).unwrap();
    let want: Vec<f32> = v.iter().map(|x| 0.5 * x).collect();
    assert!(rel_err(&to64(&q), &to64(&want)) < 1e-6);
}
test_device!(degenerate_pairs_follow_the_documented_rules);

fn nan_propagates_to_the_frames_it_touches(b: &Backend) {
    let mut r = rng(6);
    let s = KeyframeSchedule::fixed_stride(9, 2).unwrap(); // keys 0 2 4 6 8
    let mut keys = randn(&mut r, s.count() * 8);
    keys[2 * 8 + 3] = f32::NAN; // keyframe at frame 4
    let out = b.expand(&keys, &s, 8, Method::Slerp).unwrap();
    for f in 0..9 {
        let nan = out[f * 8..(f + 1) * 8].iter().any(|x| x.is_nan());
        let all_nan = out[f * 8..(f + 1) * 8].iter().all(|x| x.is_nan());
        match f {
            3 | 5 => assert!(all_nan, "frame {f} interpolates the NaN keyframe"),
            4 => assert!(nan),
            _ => assert!(!nan, "frame {f} does not touch the NaN keyframe"),
        }
    }
}
test_device!(nan_propagates_to_the_frames_it_touches);

/// Expansion of every (N, k) with N up to 20 and k up to 8 (so all tail lengths, N = 1 and
/// k >= N), each frame against the f64 reference, keyframes bit-exact.
fn expansion_covers_all_tails_and_small_n(b: &Backend) {
    let mut r = rng(7);
    let dim = 48;
    for n in 1..=20usize {
        for k in 1..=8usize {
            for method in [Method::Slerp, Method::Lerp] {
                let s = KeyframeSchedule::fixed_stride(n, k).unwrap();
                let keys = randn(&mut r, s.count() * dim);
                let out = b.expand(&keys, &s, dim, method).unwrap();
                check_expansion(&keys, &s, dim, method, &out);
            }
        }
    }
}
test_device!(expansion_covers_all_tails_and_small_n);

fn check_expansion(keys: &[f32], s: &KeyframeSchedule, dim: usize, method: Method, out: &[f32]) {
    let kf = s.keyframes();
    for f in 0..s.n_frames() {
        let got = &out[f * dim..(f + 1) * dim];
        // Reference: the keyframes around f, held outside the first/last.
        let j = kf.iter().rposition(|&k| k as usize <= f);
        let exact = match j {
            None => Some(0),
            Some(j) if kf[j] as usize == f || j + 1 == kf.len() => Some(j),
            _ => None,
        };
        if let Some(j) = exact {
            assert_eq!(got, &keys[j * dim..(j + 1) * dim], "frame {f} must be keyframe {j} exactly");
            continue;
        }
        let j = j.unwrap();
        let (k0, k1) = (kf[j] as usize, kf[j + 1] as usize);
        let alpha = (f - k0) as f64 / (k1 - k0) as f64;
        let (a, c) = (to64(&keys[j * dim..(j + 1) * dim]), to64(&keys[(j + 1) * dim..(j + 2) * dim]));
        let reference = if method == Method::Slerp { slerp_ref(&a, &c, alpha) } else { lerp_ref(&a, &c, alpha) };
        let err = rel_err(&to64(got), &reference);
        assert!(err < 2e-5, "N {} frame {f} ({method:?}): error {err:e}", s.n_frames());
    }
}

fn expansion_with_explicit_keyframes_holds_outside_them(b: &Backend) {
    let mut r = rng(8);
    let dim = 33;
    let s = KeyframeSchedule::explicit(17, &[2, 3, 7, 12]).unwrap();
    let keys = randn(&mut r, 4 * dim);
    let out = b.expand(&keys, &s, dim, Method::Slerp).unwrap();
    check_expansion(&keys, &s, dim, Method::Slerp, &out);
    assert_eq!(&out[..dim], &keys[..dim]);
    assert_eq!(&out[16 * dim..], &keys[3 * dim..]);
}
test_device!(expansion_with_explicit_keyframes_holds_outside_them);

fn expansion_in_f16_storage(b: &Backend) {
    let mut r = rng(9);
    let s = KeyframeSchedule::fixed_stride(40, 3).unwrap();
    let keys: Vec<f16> = randn(&mut r, s.count() * D).into_iter().map(f16::from_f32).collect();
    let out = b.expand(&keys, &s, D, Method::Slerp).unwrap();
    let keys32: Vec<f32> = keys.iter().map(|x| x.to_f32()).collect();
    let reference = b.expand(&keys32, &s, D, Method::Slerp).unwrap();
    let err = rel_err(&to64(&out), &to64(&reference));
    assert!(err < 1e-3, "f16 storage vs f32: {err:e}"); // f16 has an 11-bit significand
    for (j, &k) in s.keyframes().iter().enumerate() {
        assert_eq!(&out[k as usize * D..(k as usize + 1) * D], &keys[j * D..(j + 1) * D]);
    }
}
test_device!(expansion_in_f16_storage);

fn expansion_rejects_a_wrong_keyframe_count(b: &Backend) {
    let s = KeyframeSchedule::fixed_stride(10, 3).unwrap();
    assert!(b.expand(&[1.0f32; 3 * 4], &s, 4, Method::Slerp).is_err());
}
test_device!(expansion_rejects_a_wrong_keyframe_count);

fn easing_blends_toward_rest_geodesically(b: &Backend) {
    let mut r = rng(10);
    let speech = [true, true, false, false, false, false, false, false, true];
    let distance = cadence::schedules::keyframes::speech_distance(&speech);
    assert_eq!(distance, vec![0, 0, 1, 2, 3, 3, 2, 1, 0]);
    let rest = randn(&mut r, D);
    let frames = randn(&mut r, speech.len() * D);
    let mut eased = frames.clone();
    b.ease(&mut eased, &rest, &distance, 3).unwrap();
    for f in 0..speech.len() {
        let w = cadence_kernels::math::easing_weight(distance[f], 3) as f64;
        let got = &eased[f * D..(f + 1) * D];
        let src = &frames[f * D..(f + 1) * D];
        if w == 1.0 {
            assert_eq!(got, src);
        } else if w == 0.0 {
            assert_eq!(got, &rest[..]);
        } else {
            let reference = slerp_ref(&to64(&rest), &to64(src), w);
            assert!(rel_err(&to64(got), &reference) < 2e-5);
        }
    }
}
test_device!(easing_blends_toward_rest_geodesically);

fn nv12_is_within_one_lsb_of_f64_reference(b: &Backend) {
    let mut r = rng(11);
    for &(w, h, pitch, frames) in
        &[(2, 2, 2, 1), (6, 4, 9, 2), (64, 34, 64, 1), (256, 256, 260, 2), (1080, 16, 1080, 1)]
    {
        for signed in [false, true] {
            for bt601 in [false, true] {
                let layout = RgbLayout { width: w, height: h, pitch, frames };
                let (lo, hi) = if signed { (-1.1, 1.1) } else { (-0.1, 1.1) };
                let rgb = uniform(&mut r, layout.len(), lo, hi);
                let (m, rg) = (
                    if bt601 { ColorMatrix::Bt601 } else { ColorMatrix::Bt709 },
                    if signed { RgbRange::Signed } else { RgbRange::Unit },
                );
                let got = b.rgb_to_nv12(&rgb, layout, m, rg).unwrap();
                let fb = layout.nv12_frame_bytes();
                for f in 0..frames {
                    let reference = nv12_ref(
                        &rgb[f * layout.frame_len()..(f + 1) * layout.frame_len()],
                        w,
                        h,
                        pitch,
                        signed,
                        bt601,
                    );
                    let worst = got[f * fb..(f + 1) * fb]
                        .iter()
                        .zip(&reference)
                        .map(|(&a, &c)| (a as i32 - c as i32).abs())
                        .max()
                        .unwrap();
                    assert!(worst <= 1, "{w}x{h} pitch {pitch}: off by {worst}");
                }
            }
        }
    }
    // Known colours: black, white, and pure red in BT.709 limited range.
    let layout = RgbLayout::packed(2, 2, 3);
    let mut rgb = vec![0.0f32; layout.len()];
    rgb[12..24].fill(1.0);
    rgb[24..28].fill(1.0);
    let out = b.rgb_to_nv12(&rgb, layout, ColorMatrix::Bt709, RgbRange::Unit).unwrap();
    assert_eq!(&out[0..6], &[16, 16, 16, 16, 128, 128]);
    assert_eq!(&out[6..12], &[235, 235, 235, 235, 128, 128]);
    assert_eq!(&out[12..18], &[63, 63, 63, 63, 102, 240]);
}
test_device!(nv12_is_within_one_lsb_of_f64_reference);

fn nv12_rejects_odd_sizes(b: &Backend) {
    for (w, h) in [(3, 2), (2, 3), (5, 5)] {
        let layout = RgbLayout::packed(w, h, 1);
        let err = b.rgb_to_nv12(&vec![0.5f32; layout.len()], layout, ColorMatrix::Bt709, RgbRange::Unit).unwrap_err();
        assert!(format!("{err}").contains("even width and height"), "{err}");
    }
}
test_device!(nv12_rejects_odd_sizes);

/// The Hermite smoothstep kernel against h(t) = 3t^2 - 2t^3 in f64, t clamped to [0, 1].
fn hermite_matches_f64_reference(b: &Backend) {
    let t: Vec<f32> = (0..=3000).map(|i| -1.0 + i as f32 / 1000.0).chain([f32::MIN_POSITIVE, 1e-20]).collect();
    let got = b.hermite(&t).unwrap();
    assert_eq!(got.len(), t.len());
    for (&x, &y) in t.iter().zip(&got) {
        let c = (x as f64).clamp(0.0, 1.0);
        let want = c * c * (3.0 - 2.0 * c);
        // Three f32 roundings of values at most 3: a few units in the last place of 1.
        assert!((y as f64 - want).abs() <= 3e-7, "h({x}) = {y}, f64 {want}");
    }
    assert_eq!((got[1000], got[2000]), (0.0, 1.0), "h(0) = 0 and h(1) = 1 exactly");
}
test_device!(hermite_matches_f64_reference);
