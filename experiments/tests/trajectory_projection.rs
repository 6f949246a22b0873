//! The pure logic behind lerp_slerp_ablation's trajectory part (angles, norm deficit, signed
//! summaries) and calibrate's projection (bypass rule, evaluation counts, projected time, error,
//! duty-cycle label), against hand-computed cases and the project's own expansion.

use cadence::musetalk::MuseTalkInfill;
use cadence::{Backend, KeyframeSchedule, Method};
use experiments::metrics::*;
use std::f64::consts::{FRAC_PI_2, FRAC_PI_4, PI};

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

/// Unit vector along axis `i` of dimension `d`.
fn axis(d: usize, i: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; d];
    v[i] = 1.0;
    v
}

/// `r` (cos t e0 + sin t e1) in dimension `d`: a point on a circle of radius r.
fn on_circle(d: usize, t: f64, r: f64) -> Vec<f32> {
    let mut v = vec![0.0f32; d];
    v[0] = (r * t.cos()) as f32;
    v[1] = (r * t.sin()) as f32;
    v
}

#[test]
fn angle_between_known_cases() {
    let (e0, e1) = (axis(8, 0), axis(8, 1));
    assert!(close(angle_between(&e0, &e1).unwrap(), FRAC_PI_2, 1e-12));
    assert!(close(angle_between(&e0, &e0).unwrap(), 0.0, 1e-12));
    let minus: Vec<f32> = e0.iter().map(|x| -x).collect();
    assert!(close(angle_between(&e0, &minus).unwrap(), PI, 1e-12));
    // Scale does not matter; 45 degrees.
    let a = on_circle(8, 0.0, 3.0);
    let b = on_circle(8, FRAC_PI_4, 0.25);
    assert!(close(angle_between(&a, &b).unwrap(), FRAC_PI_4, 1e-7));
    // Small angles stay accurate (acos of the dot product would lose them in f32).
    for t in [1e-3, 1e-2, 0.05] {
        let got = angle_between(&on_circle(4, 0.2, 1.0), &on_circle(4, 0.2 + t, 1.0)).unwrap();
        assert!(close(got, t, 1e-6), "angle {t}: got {got}");
    }
}

#[test]
fn angle_between_rejects_bad_input() {
    assert!(angle_between(&[0.0, 0.0], &[1.0, 0.0]).is_err(), "zero vector");
    assert!(angle_between(&[1.0, 0.0], &[1.0]).is_err(), "length mismatch");
    assert!(angle_between(&[1.0, f32::NAN], &[1.0, 0.0]).is_err(), "NaN");
    assert!(angle_between(&[], &[]).is_err(), "empty");
}

#[test]
fn norm_deficit_by_hand() {
    let (e0, e1) = (axis(4, 0), axis(4, 1));
    // LERP midpoint of orthogonal unit vectors: |(e0 + e1)/2| = cos(pi/4).
    let mid: Vec<f32> = e0.iter().zip(&e1).map(|(a, b)| 0.5 * a + 0.5 * b).collect();
    assert!(close(norm_deficit(&mid, &e0, &e1, 0.5).unwrap(), FRAC_PI_4.cos() - 1.0, 1e-7));
    // Target norm is (1-a)|v0| + a|v1|: keyframes of norms 2 and 4 at a = 0.25 -> 2.5.
    let v0 = on_circle(4, 0.0, 2.0);
    let v1 = on_circle(4, 0.0, 4.0);
    let v = on_circle(4, 1.0, 2.5);
    assert!(close(norm_deficit(&v, &v0, &v1, 0.25).unwrap(), 0.0, 1e-7));
    let longer = on_circle(4, 1.0, 3.0);
    assert!(close(norm_deficit(&longer, &v0, &v1, 0.25).unwrap(), 0.2, 1e-7));
    // At the keyframes themselves the deficit is 0.
    assert!(close(norm_deficit(&v0, &v0, &v1, 0.0).unwrap(), 0.0, 1e-12));
    assert!(close(norm_deficit(&v1, &v0, &v1, 1.0).unwrap(), 0.0, 1e-12));
}

#[test]
fn norm_deficit_rejects_bad_input() {
    let (e0, e1) = (axis(4, 0), axis(4, 1));
    assert!(norm_deficit(&e0, &e0, &e1, 1.5).is_err(), "alpha outside [0, 1]");
    assert!(norm_deficit(&e0, &e0, &e1, -0.1).is_err());
    assert!(norm_deficit(&e0, &[0.0; 4], &[0.0; 4], 0.5).is_err(), "both keyframes zero");
    assert!(norm_deficit(&e0, &e0, &[1.0, 0.0], 0.5).is_err(), "length mismatch");
    assert!(norm_deficit(&[f32::NAN, 0.0, 0.0, 0.0], &e0, &e1, 0.5).is_err(), "NaN");
}

#[test]
fn signed_summary_keeps_the_sign_of_the_worst() {
    let s = signed_summary(&[0.1, -0.3, 0.2]).unwrap();
    assert!(close(s.mean, 0.0, 1e-15));
    assert_eq!(s.worst, -0.3);
    assert_eq!(s.count, 3);
    assert_eq!(signed_summary(&[0.5, 0.4]).unwrap().worst, 0.5);
    assert!(signed_summary(&[]).is_err());
    assert!(signed_summary(&[1.0, f64::NAN]).is_err());
}

/// A trajectory at constant angular speed w on a great circle, constant norm: stride-2 LERP
/// midpoints fall short by exactly cos(w) - 1; SLERP reproduces the dense frames (through the
/// project's own expansion on the CPU backend).
#[test]
fn deficit_on_a_great_circle_through_the_expansion() {
    let (d, n, w, r) = (16usize, 9usize, 0.3f64, 2.0f64);
    let dense: Vec<f32> = (0..n).flat_map(|f| on_circle(d, w * f as f64, r)).collect();
    let schedule = KeyframeSchedule::fixed_stride(n, 2).unwrap();
    let keys: Vec<f32> =
        schedule.keyframes().iter().flat_map(|&f| dense[f as usize * d..(f as usize + 1) * d].to_vec()).collect();
    let pos = schedule.frame_positions();
    let frame = |v: &[f32], f: usize| v[f * d..(f + 1) * d].to_vec();
    for method in [Method::Lerp, Method::Slerp] {
        let out = Backend::Cpu.expand(&keys, &schedule, d, method).unwrap();
        for f in (1..n).step_by(2) {
            let (j, a) = pos[f];
            assert!(close(a as f64, 0.5, 1e-6));
            let k = schedule.keyframes();
            let def = norm_deficit(
                &frame(&out, f),
                &frame(&dense, k[j] as usize),
                &frame(&dense, k[j + 1] as usize),
                a as f64,
            )
            .unwrap();
            let rel = mse(&frame(&out, f), &frame(&dense, f)).unwrap().sqrt() * (d as f64).sqrt() / r;
            match method {
                Method::Lerp => {
                    assert!(close(def, w.cos() - 1.0, 1e-6), "LERP deficit {def}, expected {}", w.cos() - 1.0);
                    assert!(rel > 0.04, "LERP midpoints lie inside the circle (relative error {rel})");
                }
                Method::Slerp => {
                    assert!(def.abs() < 1e-6, "SLERP deficit {def}");
                    assert!(rel < 1e-5, "SLERP reproduces the great-circle trajectory (relative error {rel})");
                }
            }
        }
    }
}

#[test]
fn bypass_rule_matches_the_easing_weights() {
    // Weight h(1 - d/ramp) is 0 exactly when d >= ramp (d > 0): 1, 0.84375, 0.5, 0.15625, 0.
    let d = [0, 1, 2, 3, 4, 5, u32::MAX];
    assert_eq!(bypassed_frames(&d, 4), vec![false, false, false, false, true, true, true]);
    assert_eq!(bypassed_frames(&d, 1), vec![false, true, true, true, true, true, true]);
    assert_eq!(
        bypassed_frames(&d, 0),
        vec![false, true, true, true, true, true, true],
        "no ramp: only speech frames render"
    );
}

#[test]
fn render_counts_from_schedule_and_bypass() {
    // Keyframes 0, 2, 4, 5 of 6 frames; frames 2..=4 bypassed.
    let bypassed = [false, false, true, true, true, false];
    let c = RenderCounts::from_schedule(&[0, 2, 4, 5], &bypassed, MuseTalkInfill::Latent).unwrap();
    assert_eq!(c, RenderCounts { frames: 6, unet_evaluations: 2, decoded_frames: 3 });
    let none = RenderCounts::from_schedule(&[0, 1, 2, 3, 4, 5], &[false; 6], MuseTalkInfill::Latent).unwrap();
    assert_eq!(none, RenderCounts { frames: 6, unet_evaluations: 6, decoded_frames: 6 });
    assert!(
        RenderCounts::from_schedule(&[0, 6], &[false; 6], MuseTalkInfill::Latent).is_err(),
        "keyframe outside the frames"
    );
    assert!(RenderCounts::from_schedule(&[], &[], MuseTalkInfill::Latent).is_err());
}

#[test]
fn projection_by_hand() {
    let c = ComponentCosts {
        unet_ms_per_frame: 100.0,
        decoder_ms_per_frame: 10.0,
        composite_nv12_ms_per_frame: 1.0,
        encoder_ms_per_frame: 2.0,
        fixed_ms_per_render: 50.0,
        loop_threads: 1,
    };
    let n = RenderCounts { frames: 10, unet_evaluations: 4, decoded_frames: 8 };
    // One loop thread, serial: 4 x 100 + 8 x 10 + 10 x (1 + 2) + 0.5 + 50.
    assert!(close(projected_render_ms(&c, &n, 0.5), 560.5, 1e-12));
    // The encoder beside a loop on 2 threads: its 20 ms shared over them.
    let two = ComponentCosts { loop_threads: 2, ..c };
    assert!(close(projected_render_ms(&two, &n, 0.5), 550.5, 1e-12));
    // An encoder slower than the whole loop sets the time: 10 x 100 ms.
    let slow = ComponentCosts { encoder_ms_per_frame: 100.0, ..two };
    assert!(close(projected_render_ms(&slow, &n, 0.5), 1050.0, 1e-12));
    // Fewer UNet evaluations (a longer stride) can only make it faster.
    let k2 = RenderCounts { unet_evaluations: 2, ..n };
    assert!(projected_render_ms(&c, &k2, 0.5) < projected_render_ms(&c, &n, 0.5));
    assert!(close(fps(10, 500.0), 20.0, 1e-12));
    assert!(close(projection_error_pct(110.0, 100.0), 10.0, 1e-12));
    assert!(close(projection_error_pct(90.0, 100.0), -10.0, 1e-12));
}

#[test]
fn duty_cycle_labels_like_the_source() {
    assert_eq!(duty_cycle_label(1.0), "100%");
    assert_eq!(duty_cycle_label(0.5), "50%");
    assert_eq!(duty_cycle_label(1.0 / 3.0), "33.3%");
    assert_eq!(duty_cycle_label(321.0 / 640.0), "50.2%");
    assert_eq!(duty_cycle_label(0.0), "0%");
}
