//! Known-answer tests of the hand-written TAESD layers against naive loops written here.

use cadence_engines::bench::test_input;
use cadence_engines::taesd::ops;
use cadence_engines::Batch;

/// Naive 3x3 convolution, padding 1, NCHW.
fn naive_conv(x: &Batch, w: &Batch, b: Option<&Batch>, stride: usize) -> Batch {
    let (n, ci, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let co = w.shape[0];
    let (oh, ow) = ((h + 2 - 3) / stride + 1, (wd + 2 - 3) / stride + 1);
    let mut out = vec![0f32; n * co * oh * ow];
    for bi in 0..n {
        for o in 0..co {
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b.data[o] as f64);
                    for c in 0..ci {
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let iy = (y * stride + ky) as i64 - 1;
                                let ix = (xx * stride + kx) as i64 - 1;
                                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wd as i64 {
                                    continue;
                                }
                                let xv = x.data[((bi * ci + c) * h + iy as usize) * wd + ix as usize];
                                let wv = w.data[((o * ci + c) * 3 + ky) * 3 + kx];
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    out[((bi * co + o) * oh + y) * ow + xx] = acc as f32;
                }
            }
        }
    }
    Batch { shape: vec![n, co, oh, ow], data: out }
}

fn assert_close(a: &Batch, b: &Batch, tol: f32) {
    assert_eq!(a.shape, b.shape);
    for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "index {i}: {x} vs {y}");
    }
}

#[test]
fn conv3x3_matches_naive_loops() {
    let x = test_input(vec![2, 5, 7, 6], 11);
    let w = test_input(vec![4, 5, 3, 3], 12);
    let b = test_input(vec![4], 13);
    assert_close(&ops::conv3x3(&x, &w, Some(&b), 1).unwrap(), &naive_conv(&x, &w, Some(&b), 1), 1e-5);
    assert_close(&ops::conv3x3(&x, &w, None, 1).unwrap(), &naive_conv(&x, &w, None, 1), 1e-5);
}

#[test]
fn conv3x3_stride2_matches_naive_loops() {
    let x = test_input(vec![1, 3, 8, 8], 21);
    let w = test_input(vec![2, 3, 3, 3], 22);
    let got = ops::conv3x3(&x, &w, None, 2).unwrap();
    assert_eq!(got.shape, vec![1, 2, 4, 4]);
    assert_close(&got, &naive_conv(&x, &w, None, 2), 1e-5);
}

#[test]
fn conv3x3_tiny_hand_computed_value() {
    // 1 channel 3x3 input 1..9, all-ones kernel, bias 0.5: centre = 45.5, corner = 1+2+4+5+0.5.
    let x = Batch::new(vec![1, 1, 3, 3], (1..=9).map(|v| v as f32).collect()).unwrap();
    let w = Batch::new(vec![1, 1, 3, 3], vec![1.0; 9]).unwrap();
    let b = Batch::new(vec![1], vec![0.5]).unwrap();
    let y = ops::conv3x3(&x, &w, Some(&b), 1).unwrap();
    assert_eq!(y.data[4], 45.5);
    assert_eq!(y.data[0], 12.5);
    assert_eq!(y.data[8], 5.0 + 6.0 + 8.0 + 9.0 + 0.5);
}

#[test]
fn upsample_nearest_matches_naive() {
    let x = test_input(vec![2, 3, 4, 5], 31);
    let y = ops::upsample_nearest2(&x).unwrap();
    assert_eq!(y.shape, vec![2, 3, 8, 10]);
    for n in 0..2 {
        for c in 0..3 {
            for i in 0..8 {
                for j in 0..10 {
                    let want = x.data[((n * 3 + c) * 4 + i / 2) * 5 + j / 2];
                    assert_eq!(y.data[((n * 3 + c) * 8 + i) * 10 + j], want);
                }
            }
        }
    }
}

#[test]
fn tanh_clamp_known_values() {
    let x = Batch::new(vec![1, 1, 1, 5], vec![0.0, 3.0, -3.0, 30.0, 1.5]).unwrap();
    let y = ops::tanh_clamp(&x).unwrap();
    let want = [0.0, 3.0 * 1f64.tanh(), -3.0 * 1f64.tanh(), 3.0 * 10f64.tanh(), 3.0 * 0.5f64.tanh()];
    for (g, w) in y.data.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
    }
}

#[test]
fn block_matches_naive_composition() {
    let c = 3;
    let x = test_input(vec![1, c, 5, 5], 41);
    let ws: Vec<Batch> = (0..3).map(|i| test_input(vec![c, c, 3, 3], 50 + i)).collect();
    let bs: Vec<Batch> = (0..3).map(|i| test_input(vec![c], 60 + i)).collect();
    let relu = |b: Batch| Batch { shape: b.shape, data: b.data.into_iter().map(|v| v.max(0.0)).collect() };
    let h = relu(naive_conv(&x, &ws[0], Some(&bs[0]), 1));
    let h = relu(naive_conv(&h, &ws[1], Some(&bs[1]), 1));
    let h = naive_conv(&h, &ws[2], Some(&bs[2]), 1);
    let want = relu(Batch { shape: h.shape.clone(), data: h.data.iter().zip(&x.data).map(|(a, b)| a + b).collect() });
    let got = ops::block(&x, [&ws[0], &ws[1], &ws[2]], [&bs[0], &bs[1], &bs[2]]).unwrap();
    assert_close(&got, &want, 1e-5);
    assert!(want.data.contains(&0.0) && want.data.iter().any(|&v| v > 0.0), "test exercises the ReLU");
}

#[test]
fn fast_conv3x3_matches_naive_loops() {
    // 5 and 21 input channels: the gather copies whole 16-float blocks plus a remainder.
    for cin in [5, 21] {
        let x = test_input(vec![2, cin, 9, 7], 71);
        let w = test_input(vec![6, cin, 3, 3], 72);
        let b = test_input(vec![6], 73);
        for stride in [1, 2] {
            let got = ops::conv3x3_fast(&x, &w, Some(&b), stride, false, false).unwrap();
            assert_close(&got, &naive_conv(&x, &w, Some(&b), stride), 1e-5);
        }
    }
    let x = test_input(vec![2, 5, 9, 7], 71);
    let w = test_input(vec![6, 5, 3, 3], 72);
    // ReLU epilogue
    let got = ops::conv3x3_fast(&x, &w, None, 1, false, true).unwrap();
    let want = naive_conv(&x, &w, None, 1);
    let want = Batch { shape: want.shape, data: want.data.into_iter().map(|v| v.max(0.0)).collect() };
    assert_close(&got, &want, 1e-5);
}

#[test]
fn fast_conv3x3_with_folded_upsample_matches_upsample_then_conv() {
    // large enough that several GEMM tiles (256 output pixels each) are used
    let x = test_input(vec![1, 4, 20, 24], 81);
    let w = test_input(vec![3, 4, 3, 3], 82);
    let up = {
        let (c, h, wd) = (4, 20, 24);
        let mut d = vec![0f32; c * 4 * h * wd];
        for ch in 0..c {
            for i in 0..2 * h {
                for j in 0..2 * wd {
                    d[(ch * 2 * h + i) * 2 * wd + j] = x.data[(ch * h + i / 2) * wd + j / 2];
                }
            }
        }
        Batch { shape: vec![1, c, 2 * h, 2 * wd], data: d }
    };
    let got = ops::conv3x3_fast(&x, &w, None, 1, true, false).unwrap();
    assert_eq!(got.shape, vec![1, 3, 40, 48]);
    assert_close(&got, &naive_conv(&up, &w, None, 1), 1e-5);
    assert_eq!(ops::upsample_nearest2_fast(&x).unwrap(), up);
}

#[test]
fn fast_block_matches_candle_block() {
    let c = 8;
    let x = test_input(vec![2, c, 17, 19], 91);
    let ws: Vec<Batch> = (0..3).map(|i| test_input(vec![c, c, 3, 3], 92 + i)).collect();
    let bs: Vec<Batch> = (0..3).map(|i| test_input(vec![c], 95 + i)).collect();
    let a = ops::block(&x, [&ws[0], &ws[1], &ws[2]], [&bs[0], &bs[1], &bs[2]]).unwrap();
    let b = ops::block_fast(&x, [&ws[0], &ws[1], &ws[2]], [&bs[0], &bs[1], &bs[2]]).unwrap();
    assert_close(&b, &a, 1e-4);
}

#[test]
fn taesd_cpu_fast_path_matches_candle_layers() {
    use cadence_engines::*;
    for kind in [ModelKind::TaesdDecoder, ModelKind::TaesdEncoder] {
        let w = WeightsSource::Synthetic { seed: 12 };
        let (m, x): (Taesd, Batch) = if kind == ModelKind::TaesdDecoder {
            (Taesd::decoder(Profile::Cpu, &w, &Device::Cpu).unwrap(), test_input(vec![2, 4, 12, 10], 5))
        } else {
            (Taesd::encoder(Profile::Cpu, &w, &Device::Cpu).unwrap(), test_input(vec![2, 3, 48, 40], 6))
        };
        let fast = if kind == ModelKind::TaesdDecoder { m.decode(&x).unwrap() } else { m.encode(&x).unwrap() };
        let reference = m.forward_candle(&x).unwrap();
        assert_eq!(fast.shape, reference.shape);
        let max = reference.data.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (a, b) in fast.data.iter().zip(&reference.data) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + max), "{kind}: {a} vs {b}");
        }
    }
}
