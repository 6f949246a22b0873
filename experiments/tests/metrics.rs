//! Metrics against hand-computed cases.

use experiments::metrics::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

/// Deterministic texture in [0, 1].
fn texture(w: usize, h: usize, seed: u64) -> Vec<f32> {
    cadence::measure::fixtures::test_data(w * h, seed).into_iter().map(|v| (v * 0.15 + 0.5).clamp(0.0, 1.0)).collect()
}

#[test]
fn mse_and_max_abs_error_by_hand() {
    let a = [0.0f32, 0.0, 0.0, 0.0];
    let b = [1.0f32, 2.0, 3.0, 4.0];
    assert_eq!(mse(&a, &b).unwrap(), 7.5);
    assert_eq!(max_abs_error(&[1.0, 5.0, -2.0], &[1.0, 2.0, 2.0]).unwrap(), 4.0);
    assert_eq!(max_abs_error(&b, &b).unwrap(), 0.0);
}

#[test]
fn psnr_by_hand() {
    // MSE 0.01 at peak 1: 10 log10(1 / 0.01) = 20 dB.
    let a = vec![0.0f32; 100];
    let b = vec![0.1f32; 100];
    assert!(close(psnr(&a, &b, 1.0).unwrap(), 20.0, 1e-5));
    // 8-bit, every sample off by 5: 10 log10(255^2 / 25) = 34.1514 dB.
    let a: Vec<f32> = (0..64).map(|i| (i * 3) as f32).collect();
    let b: Vec<f32> = a.iter().map(|v| v + 5.0).collect();
    assert!(close(psnr(&a, &b, 255.0).unwrap(), 34.15140352195873, 1e-9));
    assert_eq!(psnr(&a, &a, 255.0).unwrap(), f64::INFINITY);
}

#[test]
fn metrics_reject_bad_input() {
    assert!(psnr(&[0.0, 1.0], &[0.0], 1.0).is_err());
    assert!(psnr(&[0.0, f32::NAN], &[0.0, 1.0], 1.0).is_err());
    assert!(psnr(&[0.0], &[0.0], 0.0).is_err());
    assert!(max_abs_error(&[], &[]).is_err());
    let small = vec![0.5f32; 10 * 10];
    assert!(ssim(&small, &small, ImageShape::gray(10, 10), 1.0).is_err(), "10x10 is smaller than the 11x11 window");
    assert!(ssim(&small, &small, ImageShape::gray(10, 11), 1.0).is_err(), "size mismatch");
    assert!(temporal_flicker(&[0.0; 4], 4, 1.0).is_err(), "one frame has no flicker");
    assert!(temporal_flicker(&[0.0; 5], 2, 1.0).is_err(), "not whole frames");
    assert!(sharpness(&[0.0; 4], ImageShape::gray(2, 2)).is_err());
}

#[test]
fn ssim_gaussian_window_is_normalized_and_symmetric() {
    let g = ssim_gaussian_1d();
    assert!(close(g.iter().sum::<f64>(), 1.0, 1e-15));
    for k in 0..5 {
        assert_eq!(g[k], g[10 - k]);
    }
    assert!(g[5] > g[4] && g[4] > g[0]);
}

#[test]
fn ssim_of_identical_images_is_one() {
    let a = texture(40, 30, 3);
    assert!(close(ssim(&a, &a, ImageShape::gray(40, 30), 1.0).unwrap(), 1.0, 1e-12));
}

#[test]
fn ssim_of_two_constant_images_is_the_luminance_term() {
    // One 11x11 window, both images flat: sigma = cov = 0, so the contrast-structure term is
    // C2/C2 = 1 and SSIM = (2 a b + C1) / (a^2 + b^2 + C1), C1 = (0.01 * 255)^2 = 6.5025:
    // (30000 + 6.5025) / (10000 + 22500 + 6.5025) = 0.923092310530793.
    let a = vec![100.0f32; 121];
    let b = vec![150.0f32; 121];
    let s = ssim(&a, &b, ImageShape::gray(11, 11), 255.0).unwrap();
    assert!(close(s, 0.923092310530793, 1e-12), "{s}");
}

/// 11x11 images a = m + s*sign(x - 5) and b = m - s*sign(x - 5): the Gaussian-weighted means
/// are both m (the window is symmetric), the variances are s^2 (1 - g5) with g5 the centre
/// column's weight, and the covariance is minus that. So SSIM = (C2 - 2 var) / (C2 + 2 var).
#[test]
fn ssim_of_mirrored_structure_by_hand() {
    let (m, s) = (0.5f64, 0.2f64);
    let sign = |x: usize| match x {
        0..=4 => -1.0,
        5 => 0.0,
        _ => 1.0,
    };
    let a: Vec<f64> = (0..121).map(|i| m + s * sign(i % 11)).collect();
    let b: Vec<f64> = (0..121).map(|i| m - s * sign(i % 11)).collect();
    // Centre weight of the 1-D Gaussian (sigma 1.5, radius 5), computed independently.
    let denom: f64 = 1.0 + 2.0 * (1..=5).map(|k| (-(k * k) as f64 / 4.5).exp()).sum::<f64>();
    let g5 = 1.0 / denom;
    let var = s * s * (1.0 - g5);
    let c2 = (0.03f64 * 1.0).powi(2);
    let expected = (c2 - 2.0 * var) / (c2 + 2.0 * var);
    let got = ssim_gray(&a, &b, 11, 11, 1.0).unwrap();
    assert!(close(got, expected, 1e-12), "{got} vs {expected}");
    // Same structure shifted in brightness by d: only the luminance term remains.
    let d = 0.1;
    let c1 = (0.01f64).powi(2);
    let shifted: Vec<f64> = a.iter().map(|v| v + d).collect();
    let expected = (2.0 * m * (m + d) + c1) / (m * m + (m + d) * (m + d) + c1);
    let got = ssim_gray(&a, &shifted, 11, 11, 1.0).unwrap();
    assert!(close(got, expected, 1e-12), "{got} vs {expected}");
}

#[test]
fn ssim_falls_with_noise_and_is_symmetric() {
    let shape = ImageShape::gray(48, 48);
    let a = texture(48, 48, 5);
    let noise = cadence::measure::fixtures::test_data(48 * 48, 9);
    let mut last = 1.0;
    for level in [0.01f32, 0.03, 0.1, 0.3] {
        let b: Vec<f32> = a.iter().zip(&noise).map(|(x, n)| x + level * n).collect();
        let s = ssim(&a, &b, shape, 1.0).unwrap();
        assert!(s < last, "SSIM {s} at noise {level} is not below {last}");
        assert!(close(s, ssim(&b, &a, shape, 1.0).unwrap(), 1e-12));
        last = s;
    }
}

#[test]
fn rgb_metrics_use_bt601_luma() {
    // One red, one green, one blue pixel.
    let img = [1.0f32, 0.0, 0.0, /* G */ 0.0, 1.0, 0.0, /* B */ 0.0, 0.0, 1.0];
    let l = luma(&img, ImageShape { width: 3, height: 1, channels: 3 }).unwrap();
    assert!(close(l[0], 0.299, 1e-7) && close(l[1], 0.587, 1e-7) && close(l[2], 0.114, 1e-7));
    // A gray image stored as RGB has the same SSIM as the gray image itself.
    let (w, h) = (20, 16);
    let a = texture(w, h, 1);
    let b = texture(w, h, 2);
    let rgb = |g: &[f32]| [g, g, g].concat();
    let gray = ssim(&a, &b, ImageShape::gray(w, h), 1.0).unwrap();
    let col = ssim(&rgb(&a), &rgb(&b), ImageShape::rgb(w, h), 1.0).unwrap();
    assert!(close(gray, col, 1e-6), "{gray} vs {col}");
}

#[test]
fn sharpness_by_hand() {
    // Impulse of height v at the centre of 5x5: the interior Laplacian is -4v at the centre,
    // v at its four neighbours, 0 at the corners: mean 0, variance (16 + 4) v^2 / 9.
    let v = 3.0;
    let mut img = vec![0.0f64; 25];
    img[12] = v;
    assert!(close(laplacian_variance(&img, 5, 5).unwrap(), 20.0 * v * v / 9.0, 1e-12));
    // A linear ramp has a zero Laplacian.
    let ramp: Vec<f64> = (0..64).map(|i| (i % 8) as f64 * 0.3 + (i / 8) as f64 * 0.1).collect();
    assert!(laplacian_variance(&ramp, 8, 8).unwrap() < 1e-20);
    // Blurring (3-tap box along rows) makes a texture less sharp.
    let (w, h) = (32, 32);
    let t = texture(w, h, 4);
    let blurred: Vec<f32> = (0..w * h)
        .map(|i| {
            let (x, y) = (i % w, i / w);
            let at = |xx: usize| t[y * w + xx.clamp(0, w - 1)];
            (at(x.saturating_sub(1)) + at(x) + at(x + 1)) / 3.0
        })
        .collect();
    let shape = ImageShape::gray(w, h);
    assert!(sharpness(&blurred, shape).unwrap() < 0.5 * sharpness(&t, shape).unwrap());
}

#[test]
fn flicker_by_hand() {
    // Three 2-sample frames: 0,0 -> 10,10 -> 10,10 (8-bit): differences 10 and 0, mean 5,
    // VBench score (255 - 5) / 255.
    let f = temporal_flicker(&[0.0, 0.0, 10.0, 10.0, 10.0, 10.0], 2, 255.0).unwrap();
    assert_eq!(f.pairs, 2);
    assert!(close(f.mean_abs_diff, 5.0, 1e-12));
    assert!(close(f.vbench_score, 250.0 / 255.0, 1e-12));
    // The same clip in [0, 1] units gives the same 8-bit figures.
    let g = temporal_flicker(&[0.0, 0.0, 10.0 / 255.0, 10.0 / 255.0, 10.0 / 255.0, 10.0 / 255.0], 2, 1.0).unwrap();
    assert!(close(g.mean_abs_diff_8bit, 5.0, 1e-5) && close(g.vbench_score, f.vbench_score, 1e-7));
    // A still clip does not flicker.
    let s = temporal_flicker(&[0.3; 12], 4, 1.0).unwrap();
    assert_eq!((s.mean_abs_diff, s.vbench_score), (0.0, 1.0));
}

#[test]
fn crop_picks_the_region_of_every_plane() {
    // 4x3 planar RGB, sample = 100 c + 10 y + x.
    let shape = ImageShape::rgb(4, 3);
    let img: Vec<f32> =
        (0..3).flat_map(|c| (0..3).flat_map(move |y| (0..4).map(move |x| (100 * c + 10 * y + x) as f32))).collect();
    let r = Region { x: 1, y: 1, width: 2, height: 2 };
    let got = crop(&img, shape, r).unwrap();
    assert_eq!(got, vec![11.0, 12.0, 21.0, 22.0, 111.0, 112.0, 121.0, 122.0, 211.0, 212.0, 221.0, 222.0]);
    assert!(crop(&img, shape, Region { x: 3, y: 0, width: 2, height: 1 }).is_err());
    let two = [img.clone(), img].concat();
    assert_eq!(crop_frames(&two, shape, r).unwrap().len(), 24);
}
