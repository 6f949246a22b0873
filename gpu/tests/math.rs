//! The scalar math the kernels share, against f64 `std`, to the bounds stated in `math.rs`.

use cadence_kernels::math::{atan2_nonneg, easing_weight, hermite, sin_0_pi};

fn ulp_f32(x: f64) -> f64 {
    // Spacing of f32 values around |x| (the smallest normal spacing for tiny x).
    let a = (x.abs() as f32).max(f32::MIN_POSITIVE);
    (f32::from_bits(a.to_bits() + 1) - a) as f64
}

/// Dense sweep plus pseudo-random points (fixed seed xorshift: no dependency needed).
fn samples(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..=n).map(|i| lo + (hi - lo) * (i as f32 / n as f32)).collect();
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.push(lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32));
    }
    v.extend([lo, hi, 0.0, 1e-30, 1e-20, 1e-8, 1e-4].iter().filter(|&&x| x >= lo && x <= hi));
    v
}

#[test]
fn sin_error_bound() {
    let mut max_abs = 0.0f64;
    let mut max_ulp = 0.0f64;
    for x in samples(-std::f32::consts::PI, std::f32::consts::PI, 400_000) {
        let got = sin_0_pi(x) as f64;
        let want = (x as f64).sin();
        let err = (got - want).abs();
        max_abs = max_abs.max(err);
        if want.abs() >= 1e-30 {
            max_ulp = max_ulp.max(err / ulp_f32(want));
        }
    }
    // Near pi the argument itself is an f32: compare with sin of the exact f32 input.
    let near_pi = f32::from_bits(std::f32::consts::PI.to_bits() - 3);
    let e = (sin_0_pi(near_pi) as f64 - (near_pi as f64).sin()).abs() / ulp_f32((near_pi as f64).sin());
    println!("sin: max abs {max_abs:e}, max ulp {max_ulp:.2}, near pi {e:.2} ulp");
    assert!(max_abs <= 1.2e-7, "sin max abs error {max_abs:e}");
    assert!(max_ulp <= 2.0, "sin max error {max_ulp} ulp");
    assert!(e <= 2.0);
    assert!(sin_0_pi(f32::NAN).is_nan());
    assert_eq!(sin_0_pi(0.0), 0.0);
}

#[test]
fn atan2_error_bound() {
    let mut max_abs = 0.0f64;
    let mut max_ulp = 0.0f64;
    let ts = samples(0.0, 1.0, 200_000);
    for &t in &ts {
        for (y, x) in [(t, 1.0f32), (1.0, t), (t * 3.0e-5, 7.0e-5), (5.0, t * 11.0)] {
            let got = atan2_nonneg(y, x) as f64;
            let want = (y as f64).atan2(x as f64);
            let err = (got - want).abs();
            max_abs = max_abs.max(err);
            if want > 0.0 {
                max_ulp = max_ulp.max(err / ulp_f32(want));
            }
        }
    }
    println!("atan2: max abs {max_abs:e}, max ulp {max_ulp:.2}");
    assert!(max_abs <= 2.4e-7, "atan2 max abs error {max_abs:e}");
    assert!(max_ulp <= 3.0, "atan2 max error {max_ulp} ulp");
    assert_eq!(atan2_nonneg(0.0, 0.0), 0.0);
    assert_eq!(atan2_nonneg(0.0, 1.0), 0.0);
    assert!((atan2_nonneg(1.0, 0.0) as f64 - std::f64::consts::FRAC_PI_2).abs() < 1e-7);
    assert!(atan2_nonneg(f32::NAN, 1.0).is_nan());
    assert!(atan2_nonneg(1.0, f32::NAN).is_nan());
}

#[test]
fn hermite_values_and_shape() {
    assert_eq!(hermite(0.0), 0.0);
    assert_eq!(hermite(1.0), 1.0);
    assert_eq!(hermite(0.5), 0.5);
    assert_eq!(hermite(-3.0), 0.0);
    assert_eq!(hermite(7.0), 1.0);
    // Monotone, symmetric h(1-t) = 1 - h(t), zero slope at both ends.
    let mut prev = 0.0;
    for i in 0..=1000 {
        let t = i as f32 / 1000.0;
        let h = hermite(t);
        assert!(h >= prev);
        assert!((hermite(1.0 - t) - (1.0 - h)).abs() < 1e-6);
        prev = h;
    }
    let d = 1e-3f32;
    assert!(hermite(d) / d < 1e-2 && (1.0 - hermite(1.0 - d)) / d < 1e-2);
}

#[test]
fn four_frame_speech_to_pause_transition() {
    let w: Vec<f32> = (0..=4).map(|d| easing_weight(d, 4)).collect();
    assert_eq!(w, vec![1.0, 0.84375, 0.5, 0.15625, 0.0]);
    assert_eq!(easing_weight(9, 4), 0.0);
    assert_eq!(easing_weight(0, 0), 1.0);
    assert_eq!(easing_weight(1, 0), 0.0);
}

/// `color::quantize` (round half up, clamp to a byte, NaN to 0) against the rule in f64, on a
/// stride through every f32 bit pattern plus the boundaries. The half is added in f32 as the
/// kernels do (0.49999997 + 0.5 rounds to 1.0 in f32), the rest is exact in f64.
#[test]
fn quantize_matches_round_half_up_then_clamp() {
    use cadence_kernels::color::quantize;
    let rule = |x: f32| {
        let y = x + 0.5;
        if y.is_nan() {
            0
        } else {
            (y as f64).floor().clamp(0.0, 255.0) as u8
        }
    };
    let special = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        -0.5,
        -0.49999997,
        0.49999997,
        0.5,
        1.5,
        127.5,
        254.49998,
        254.5,
        255.0,
        255.49998,
        255.5,
        256.0,
        1e30,
        -1e30,
        f32::MIN_POSITIVE,
    ];
    let stride = (0..=u32::MAX).step_by(251).map(f32::from_bits);
    let dense = (-2000..=260_000).map(|i| i as f32 * 1e-3);
    for x in special.into_iter().chain(stride).chain(dense) {
        assert_eq!(quantize(x), rule(x), "quantize({x:e}) (bits {:#010x})", x.to_bits());
    }
}
