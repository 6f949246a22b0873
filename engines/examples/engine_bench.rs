//! Prints frames/s and GFLOP/s of every engine next to the CPU matmul rate measured in the same
//! run. Usage: engine_bench [profile=cpu|full] [batch] [runs] [only-model]
use cadence_engines::bench::*;
use cadence_engines::*;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let profile = Profile::parse(args.get(1).map(String::as_str).unwrap_or("cpu"))?;
    let batch: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let runs: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let only = args.get(4).cloned();
    let dev = Device::Cpu;
    let w = WeightsSource::Synthetic { seed: DEFAULT_SEED };
    let mm = matmul_probe(&dev, 2048, 5)?;
    println!("matmul 2048^3 f32: {mm:.1} GFLOP/s  (profile {profile}, batch {batch}, {runs} runs)");
    let want = |m: &str| only.as_deref().is_none_or(|o| o == m);
    let show = |r: &BenchResult| {
        println!(
            "{:<32} batch {:>3}  {:>8.2} frames/s  {:>7.1} GFLOP/s  ({:.0}% of matmul)",
            r.name,
            r.batch,
            r.frames_per_s,
            r.gflops,
            100.0 * r.gflops / mm
        )
    };
    if want("taesd") {
        let d = Taesd::decoder(profile, &w, &dev)?;
        show(&bench_decoder(&d, batch, runs)?);
    }
    if want("unet") {
        let u = MuseTalkUnet::new(profile, &w, &dev)?;
        show(&bench_keyframe(&u, batch, runs)?);
    }
    if want("sd-vae") {
        let d = SdVae::decoder(profile, &w, &dev)?;
        show(&bench_decoder(&d, batch.min(2), runs)?);
    }
    if want("whisper") {
        let a = WhisperAudio::new(profile, &w, &dev)?;
        show(&bench_audio(&a, 25.6, runs)?);
    }
    let mm2 = matmul_probe(&dev, 2048, 5)?;
    println!("matmul again: {mm2:.1} GFLOP/s");
    Ok(())
}
