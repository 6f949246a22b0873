//! Probe: Ditto's LMDM sampler as the render runs it (one 80-frame window, 50 guided DDIM
//! steps, cpu-reduced sizes or `--full`, synthetic weights): milliseconds per window and per
//! step, median of 5 (the first run also fills the per-step memo that later windows reuse).
use cadence_engines::ditto::lmdm::{DdimNoise, MotionDecoder};
use cadence_engines::ditto::DittoConfigs;
use cadence_engines::{Profile, WeightsSource, DEFAULT_SEED};
use std::time::Instant;

fn main() {
    let profile = if std::env::args().any(|a| a == "--full") { Profile::Full } else { Profile::Cpu };
    let c = DittoConfigs::for_profile(profile).lmdm;
    let net = MotionDecoder::new(&c, &WeightsSource::Synthetic { seed: DEFAULT_SEED }).unwrap();
    let steps = 50;
    let noise = DdimNoise::seeded(7, steps, c.seq_len * c.nfeats);
    let frame: Vec<f32> = (0..c.nfeats).map(|i| (i as f32 * 0.37).sin()).collect();
    let cond: Vec<f32> = (0..c.seq_len * c.cond_dim).map(|i| (i as f32 * 0.013).cos()).collect();
    let mut ms: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(net.sample(&frame, &cond, steps, &noise).unwrap());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    println!(
        "LMDM ({profile}) window of {} frames, {steps} steps: {:.1} ms ({:.2} ms a step)",
        c.seq_len,
        ms[2],
        ms[2] / steps as f64
    );
}
