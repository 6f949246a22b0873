//! Every neural engine's throughput (median frames/s and GFLOP/s of several runs) against the
//! large-matmul rate of the same device, measured before and after the engines in the same run:
//! the figures `cadence engine-bench` prints one engine at a time, as one CSV with provenance.

use anyhow::{ensure, Result};
use cadence_engines::bench::{bench_audio, bench_decoder, bench_keyframe, matmul_probe, BenchResult};
use cadence_engines::ditto::bench::DittoNet;
use cadence_engines::{
    select_device, DeviceRequest, Engine, MuseTalkUnet, Profile, SdVae, Taesd, WeightsSource, WhisperAudio,
    DEFAULT_SEED,
};
use clap::Parser;
use experiments::csvout::write_csv;
use experiments::provenance::{load_average, Provenance};

#[derive(Parser)]
#[command(
    about = "Throughput of every engine (UNet, TAESD, SD VAE, whisper; Ditto's warping network and SPADE decoder) \
             with synthetic weights, as a fraction of the matmul rate measured in the same run; writes \
             results/engine_bench.csv"
)]
struct Args {
    /// Engine profile: cpu-reduced (the CPU default) or full (the published sizes; minutes per
    /// engine on a few CPU cores).
    #[arg(long, default_value = "cpu-reduced")]
    profile: String,
    /// Frames per call of the UNet and TAESD.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Frames per call of the SD VAE decoder (about 7x TAESD's cost per frame at the full profile).
    #[arg(long, default_value_t = 2)]
    vae_batch: usize,
    /// Frames per call of Ditto's warping network and decoder (the render calls them one frame at
    /// a time).
    #[arg(long, default_value_t = 1)]
    ditto_batch: usize,
    /// Timed runs per engine (the median is reported; one untimed warm-up run precedes them).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[command(flatten)]
    out: experiments::OutDir,
}

#[derive(serde::Serialize)]
struct Row {
    engine: String,
    runtime: String,
    profile: String,
    batch: usize,
    runs: usize,
    median_ms_per_call: f64,
    frames_per_s: f64,
    gflops: f64,
    matmul_gflops: f64,
    pct_of_matmul: f64,
    weights: String,
}

/// What names a measured engine in its row.
struct Label {
    engine: String,
    runtime: String,
    profile: String,
    weights: String,
}

impl Label {
    fn of(engine: &dyn Engine) -> Label {
        Label {
            engine: engine.model().to_string(),
            runtime: engine.runtime().to_string(),
            profile: engine.profile().to_string(),
            weights: engine.weights_label(),
        }
    }
}

fn row(r: BenchResult, label: Label, matmul: f64) -> Row {
    eprintln!("{:<34} {:>8.2} frames/s {:>7.1} GFLOP/s", r.name, r.frames_per_s, r.gflops);
    Row {
        engine: label.engine,
        runtime: label.runtime,
        profile: label.profile,
        batch: r.batch,
        runs: r.runs,
        median_ms_per_call: r.median_s * 1e3,
        frames_per_s: r.frames_per_s,
        gflops: r.gflops,
        matmul_gflops: matmul,
        pct_of_matmul: 100.0 * r.gflops / matmul,
        weights: label.weights,
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    cadence_engines::isa::check_env()?;
    ensure!(
        a.batch > 0 && a.vae_batch > 0 && a.ditto_batch > 0 && a.runs > 0,
        "--batch, --vae-batch, --ditto-batch and --runs must be positive"
    );
    let out_dir = a.out.dir()?;
    let profile = Profile::parse(&a.profile)?;
    let dev = select_device(DeviceRequest::Cpu)?.device;
    let w = WeightsSource::Synthetic { seed: DEFAULT_SEED };
    let load_start = load_average();
    let t0 = std::time::Instant::now();

    let mm_before = matmul_probe(&dev, 2048, 5)?;
    eprintln!("matmul 2048^3 f32: {mm_before:.1} GFLOP/s");
    // Each engine is compared with the matmul rate of its own moment: the probe's mean before
    // and after all engines (a VM's speed drifts; the two probes bound it).
    let mut measured: Vec<(BenchResult, Label)> = Vec::new();
    let unet = MuseTalkUnet::new(profile, &w, &dev)?;
    measured.push((bench_keyframe(&unet, a.batch, a.runs)?, Label::of(&unet)));
    let taesd = Taesd::decoder(profile, &w, &dev)?;
    measured.push((bench_decoder(&taesd, a.batch, a.runs)?, Label::of(&taesd)));
    let vae = SdVae::decoder(profile, &w, &dev)?;
    measured.push((bench_decoder(&vae, a.vae_batch, a.runs)?, Label::of(&vae)));
    let whisper = WhisperAudio::new(profile, &w, &dev)?;
    measured.push((bench_audio(&whisper, 25.6, a.runs)?, Label::of(&whisper)));
    // Ditto's per-frame networks, the part of its render a stride skips.
    for net in [DittoNet::Warp, DittoNet::Decoder] {
        let label = Label {
            engine: net.name().to_string(),
            runtime: "cadence CPU kernels".to_string(),
            profile: profile.to_string(),
            weights: w.label(),
        };
        measured.push((cadence_engines::ditto::bench::bench(net, profile, &w, a.ditto_batch, a.runs)?, label));
    }
    let mm_after = matmul_probe(&dev, 2048, 5)?;
    eprintln!("matmul 2048^3 f32 after: {mm_after:.1} GFLOP/s");
    let matmul = 0.5 * (mm_before + mm_after);
    let rows: Vec<Row> = measured.into_iter().map(|(r, label)| row(r, label, matmul)).collect();

    let mut prov = Provenance::gather(
        format!("cpu ({} threads)", rayon::current_num_threads()),
        profile.to_string(),
        format!("synthetic(seed={DEFAULT_SEED})"),
    );
    prov.note("cpu_loops", cadence_engines::isa::describe());
    prov.note("matmul_probe", format!("candle f32 2048^3 matmul, median of 5: {mm_before:.1} GFLOP/s before the engines, {mm_after:.1} after; pct_of_matmul uses their mean"));
    prov.note("method", "median of --runs timed calls after one warm-up; GFLOP/s from each engine's analytic FLOP count (2 per multiply-add); whisper: 25.6 s of audio per call, frames = video frames at 25 fps; ditto-warp and ditto-decoder: --ditto-batch frames per call");
    prov.note("load_average", format!("{load_start} at start, {} at end (1/5/15 min)", load_average()));
    prov.note("runtime", format!("{:.0} s", t0.elapsed().as_secs_f64()));
    let path = out_dir.join("engine_bench.csv");
    write_csv(&path, &prov, &rows)?;
    println!("wrote {}", path.display());
    Ok(())
}
