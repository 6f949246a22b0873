//! Scratch probe: Winograd F(2,3) against im2col at the engines' layer sizes.
use cadence_engines::conv::winograd::{self, WinogradWeights};
use cadence_engines::conv::{conv3x3, Nhwc, PackedConv};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    for &(n, h, w, cin, cout) in &[
        (2, 32, 32, 512, 512),
        (2, 64, 64, 512, 512),
        (2, 128, 128, 256, 256),
        (2, 256, 256, 128, 128),
        (8, 32, 32, 320, 320),
        (8, 16, 16, 640, 640),
        (8, 8, 8, 1280, 1280),
        (8, 4, 4, 1280, 1280),
        (8, 32, 32, 64, 64),
        (8, 64, 64, 64, 64),
        (8, 128, 128, 64, 64),
        (4, 256, 256, 64, 64),
        (8, 16, 16, 128, 128),
        (8, 8, 8, 128, 128),
        (2, 32, 32, 80, 80),
        (2, 64, 64, 80, 80),
        (2, 128, 128, 48, 48),
        (2, 128, 128, 80, 48),
        (8, 32, 32, 48, 48),
        (8, 32, 32, 32, 32),
    ] {
        let x = Nhwc { n, h, w, c: cin, data: (0..n * h * w * cin).map(|i| (i % 13) as f32 * 0.01).collect() };
        let wt: Vec<f32> = (0..cout * cin * 9).map(|i| (i % 7) as f32 * 0.001).collect();
        let p = PackedConv::im2col(cout, cin, &wt, None, 1);
        let q = WinogradWeights::new(cout, cin, &wt);
        let reps = 5;
        let mut a = vec![];
        let mut b = vec![];
        for _ in 0..reps {
            let t = Instant::now();
            std::hint::black_box(conv3x3(&x, &p, false, None, false));
            a.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            std::hint::black_box(winograd::conv3x3(&x, &q, None, false, None, false));
            b.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (a, b) = (median(a), median(b));
        let gf = 2.0 * (n * h * w * cin * cout * 9) as f64 / 1e9;
        println!(
            "n{n} {h}x{w} {cin}->{cout}: im2col {a:.1} ms ({:.0} GFLOP/s), winograd {b:.1} ms (eff {:.0}), speedup {:.2}",
            gf / a * 1e3,
            gf / b * 1e3,
            a / b
        );
    }
}
