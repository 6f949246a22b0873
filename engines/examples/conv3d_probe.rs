//! Probe: the 3-D convolution's paths at the cpu-reduced warping network's layer sizes
//! (a 4x32x32 volume), medians of 7, GFLOP/s of useful work. `--subnormal` makes a fifth of
//! the inputs subnormal, to show what that costs on this CPU.
use cadence_engines::conv::conv3d::{conv3d_via, path_for, Conv3dPath, Ndhwc, PackedConv3d};
use std::time::Instant;

fn main() {
    let subnormal = std::env::args().any(|a| a == "--subnormal");
    for &(name, cin, cout, k) in &[
        ("hourglass first 3x3x3", 66, 32, 3),
        ("hourglass last up 3x3x3", 64, 16, 3),
        ("hourglass output 3x3x3", 82, 82, 3),
        ("mask 7x7x7", 82, 22, 7),
    ] {
        let (d, side) = (4, 32);
        let taps = k * k * k;
        let w: Vec<f32> = (0..cout * cin * taps).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let p = PackedConv3d::new(cout, cin, [k; 3], [k / 2; 3], &w, Some(vec![0.1; cout]));
        let data = (0..d * side * side * cin)
            .map(|i| if subnormal && i % 5 == 0 { 1e-39 } else { ((i * 31) % 97) as f32 / 97.0 })
            .collect();
        let x = Ndhwc { n: 1, d, h: side, w: side, c: cin, data };
        let gflop = 2.0 * (d * side * side * cin * cout * taps) as f64 / 1e9;
        let chosen = path_for([d, side, side], &p);
        let mut line = format!("{name} {cin}->{cout} (conv3d takes {chosen:?}):");
        for path in [Conv3dPath::Im2col, Conv3dPath::Rows { rows: 1 }, Conv3dPath::Rows { rows: 4 }, chosen] {
            let mut ms: Vec<f64> = (0..7)
                .map(|_| {
                    let t = Instant::now();
                    std::hint::black_box(conv3d_via(&x, &p, true, path));
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            ms.sort_by(|a, b| a.total_cmp(b));
            line += &format!("  {path:?} {:.2} ms = {:.0} GFLOP/s", ms[3], gflop / ms[3] * 1e3);
        }
        println!("{line}");
    }
}
