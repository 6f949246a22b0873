//! Scratch probe: the full-profile UNet at batch 8 (as `peer_bench` times it), for a profiler.
use cadence_engines::bench::test_input;
use cadence_engines::{Device, KeyframeModel, MuseTalkUnet, Profile, WeightsSource, DEFAULT_SEED};
use std::time::Instant;

fn main() {
    let runs: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let u = MuseTalkUnet::new(Profile::Full, &WeightsSource::Synthetic { seed: DEFAULT_SEED }, &Device::Cpu).unwrap();
    let x = test_input(vec![8, 8, 32, 32], 2);
    let a = test_input(vec![8, 50, cadence_engines::unet::AUDIO_DIM], 3);
    for _ in 0..runs {
        let t = Instant::now();
        u.predict(&x, &a).unwrap();
        println!("{:.3} s", t.elapsed().as_secs_f64());
    }
}
