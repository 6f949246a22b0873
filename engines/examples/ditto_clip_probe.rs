//! Probe: Ditto's per-clip networks as the render runs them, cpu-reduced sizes or `--full`,
//! synthetic weights, median of 5: HuBERT's 25 fps features of 25.6 s of audio (Ditto's chunks),
//! and the LMDM sampler on one 80-frame window with 50 guided DDIM steps (the first run also
//! fills the per-step memo that a clip's later windows reuse).
use cadence_engines::ditto::hubert::{Hubert, SAMPLE_RATE};
use cadence_engines::ditto::lmdm::{offline_motion, DdimNoise, MotionDecoder};
use cadence_engines::ditto::DittoConfigs;
use cadence_engines::{Profile, WeightsSource, DEFAULT_SEED};
use std::time::Instant;

fn main() {
    let profile = if std::env::args().any(|a| a == "--full") { Profile::Full } else { Profile::Cpu };
    let cfg = DittoConfigs::for_profile(profile);
    let w = WeightsSource::Synthetic { seed: DEFAULT_SEED };
    let median = |f: &dyn Fn()| {
        let mut ms: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(|a, b| a.total_cmp(b));
        ms[2]
    };
    let hubert = Hubert::new(&cfg.hubert, &w).unwrap();
    let audio: Vec<f32> = (0..(25.6 * SAMPLE_RATE as f64) as usize).map(|i| (i as f32 * 0.031).sin() * 0.1).collect();
    let ms = median(&|| drop(std::hint::black_box(hubert.ditto_features(&audio).unwrap())));
    println!("HuBERT ({profile}) features of 25.6 s: {ms:.1} ms");
    let c = cfg.lmdm;
    let net = MotionDecoder::new(&c, &w).unwrap();
    let steps = 50;
    let noise = DdimNoise::seeded(7, steps, c.seq_len * c.nfeats);
    let frame: Vec<f32> = (0..c.nfeats).map(|i| (i as f32 * 0.37).sin()).collect();
    let cond: Vec<f32> = (0..c.seq_len * c.cond_dim).map(|i| (i as f32 * 0.013).cos()).collect();
    let ms = median(&|| drop(std::hint::black_box(net.sample(&frame, &cond, steps, &noise).unwrap())));
    println!(
        "LMDM ({profile}) window of {} frames, {steps} steps: {ms:.1} ms ({:.2} ms a step)",
        c.seq_len,
        ms / steps as f64
    );
    // A clip of 640 frames: Ditto's offline windows (80 frames every 70), once.
    let frames = 640;
    let cond_all: Vec<f32> = (0..frames * c.cond_dim).map(|i| (i as f32 * 0.017).cos()).collect();
    let t = Instant::now();
    offline_motion(&cond_all, c.cond_dim, &frame, c.seq_len, 10, |kp, w| net.sample(kp, w, steps, &noise)).unwrap();
    println!("LMDM ({profile}) {frames} frames in windows: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
}
