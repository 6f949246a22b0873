//! Scratch probe: TAESD decoder frames/s on the CPU fast path at several widths (used to pick
//! Profile::Cpu). Builds the decoder's conv sequence directly from `cpu_conv`.
use cadence_engines::bench::{matmul_probe, test_input};
use cadence_engines::conv::{conv3x3, Nhwc, PackedConv};
use std::time::Instant;

fn main() {
    let b: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    let mm = matmul_probe(&cadence_engines::Device::Cpu, 2048, 5).unwrap();
    println!("matmul {mm:.1} GFLOP/s");
    for c in [8usize, 12, 16, 24, 32, 64] {
        let mk = |ci: usize, co: usize, bias: bool, seed: u64| {
            let w = test_input(vec![co, ci, 3, 3], seed);
            let scale = (2.0 / (9 * ci) as f32).sqrt();
            let w: Vec<f32> = w.data.iter().map(|v| v * scale).collect();
            PackedConv::new(co, ci, &w, bias.then(|| vec![0.01; co]), 1)
        };
        let blocks: Vec<[PackedConv; 3]> =
            (0..10).map(|i| [mk(c, c, true, 10 * i), mk(c, c, true, 10 * i + 1), mk(c, c, true, 10 * i + 2)]).collect();
        let first = mk(4, c, true, 999);
        let mids: Vec<PackedConv> = (0..3).map(|i| mk(c, c, false, 500 + i)).collect();
        let last = mk(c, 3, true, 998);
        let x = test_input(vec![b, 4, 32, 32], 1);
        let run = || {
            let mut a = conv3x3(&Nhwc::from_nchw(b, 4, 32, 32, &x.data), &first, false, None, true);
            let mut bi = 0;
            #[allow(clippy::needless_range_loop)]
            for stage in 0..4 {
                let nb = if stage < 3 { 3 } else { 1 };
                for _ in 0..nb {
                    let [c0, c2, c4] = &blocks[bi];
                    let h = conv3x3(&a, c0, false, None, true);
                    let h = conv3x3(&h, c2, false, None, true);
                    a = conv3x3(&h, c4, false, Some(&a), true);
                    bi += 1;
                }
                if stage < 3 {
                    a = conv3x3(&a, &mids[stage], true, None, false);
                }
            }
            let y = conv3x3(&a, &last, false, None, false);
            y.to_nchw()
        };
        run();
        let mut ts = vec![];
        for _ in 0..3 {
            let t = Instant::now();
            std::hint::black_box(run());
            ts.push(t.elapsed().as_secs_f64());
        }
        ts.sort_by(|a, b| a.total_cmp(b));
        let s = ts[1];
        let gmac = 17.68 * (c as f64 / 64.0).powi(2);
        println!(
            "C={c:>2}: {:>7.2} frames/s  ~{:.1} GFLOP/s ({:.0}% of matmul)",
            b as f64 / s,
            2.0 * gmac * b as f64 / s,
            100.0 * 2.0 * gmac * b as f64 / s / mm
        );
    }
}
