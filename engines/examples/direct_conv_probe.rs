//! Probe: the direct 3x3 kernel (each arm the CPU runs) against im2col + gemm at narrow widths
//! (TAESD's cpu-reduced 16 channels, the full profile's 64), the measurement behind
//! `direct::DIRECT_MAX_COUT`. Median of 7 runs each; GFLOP/s counts 2 x MACs.
//!
//!     cargo run --release -p cadence-engines --example direct_conv_probe
use cadence_engines::conv::direct::{self, Arm, DirectWeights};
use cadence_engines::conv::{conv3x3, Nhwc, PackedConv};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn time(f: impl Fn()) -> f64 {
    f();
    median(
        (0..7)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

fn main() {
    println!("cpu: {}", cadence_engines::isa::describe());
    for &(n, h, w, cin, cout, up) in &[
        (4, 32, 32, 16, 16, false),
        (4, 64, 64, 16, 16, false),
        (4, 128, 128, 16, 16, false),
        (4, 256, 256, 16, 16, false),
        (4, 128, 128, 16, 16, true),
        (4, 256, 256, 16, 3, false),
        (4, 128, 128, 32, 32, false),
        (4, 64, 64, 48, 48, false),
        (4, 64, 64, 64, 64, false),
        (4, 128, 128, 64, 64, false),
    ] {
        let x = Nhwc { n, h, w, c: cin, data: (0..n * h * w * cin).map(|i| (i % 13) as f32 * 0.01).collect() };
        let wt: Vec<f32> = (0..cout * cin * 9).map(|i| (i % 7) as f32 * 0.001).collect();
        let bias: Vec<f32> = (0..cout).map(|i| i as f32 * 0.01).collect();
        let p = PackedConv::im2col(cout, cin, &wt, Some(bias.clone()), 1);
        let q = DirectWeights::new(cout, cin, &wt, Some(&bias));
        let (oh, ow) = if up { (2 * h, 2 * w) } else { (h, w) };
        let gf = 2.0 * (n * oh * ow * cin * cout * 9) as f64 / 1e9;
        let a = time(|| {
            std::hint::black_box(conv3x3(&x, &p, up, None, true));
        });
        let mut line = format!(
            "n{n} {oh}x{ow} {cin}->{cout}{}: im2col {a:.2} ms ({:.0} GFLOP/s)",
            if up { " (up)" } else { "" },
            gf / a * 1e3
        );
        for arm in Arm::runnable() {
            let b = time(|| {
                std::hint::black_box(direct::conv3x3_on(arm, &x, &q, up, None, true));
            });
            line += &format!(", {arm:?} {b:.2} ms ({:.0} GFLOP/s, x{:.2})", gf / b * 1e3, a / b);
        }
        println!("{line}");
    }
}
