//! `cadence engine-run` and `cadence engine-bench`: one neural engine on its own.

use anyhow::{Context, Result};
use cadence::npy::{self, Array};
use cadence_engines::device::DEVICE_HELP;
use cadence_engines::DeviceRequest;
use clap::Args;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineModel {
    Taesd,
    SdVae,
    MusetalkUnet,
    WhisperTiny,
}

#[derive(Args)]
pub struct EngineRunArgs {
    #[arg(long, value_enum)]
    model: EngineModel,
    /// Weights (safetensors, original layout). Without it: seeded synthetic weights.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// taesd / sd-vae: latents (B,4,h,w); musetalk-unet: (B,8,32,32) = [masked, reference];
    /// whisper-tiny: 16 kHz mono samples (n,) as float32.
    #[arg(long)]
    input: PathBuf,
    /// musetalk-unet only: audio windows (B,50,384) before the positional encoding.
    #[arg(long)]
    audio: Option<PathBuf>,
    #[arg(long)]
    output: PathBuf,
    /// full (default; what real weights need) or cpu-reduced.
    #[arg(long, default_value = "full")]
    profile: String,
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = DEVICE_HELP)]
    device: DeviceRequest,
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
pub struct EngineBenchArgs {
    #[arg(long, value_enum)]
    pub model: EngineModel,
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = DEVICE_HELP)]
    pub device: DeviceRequest,
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// cpu-reduced (default on the CPU) or full (default on CUDA).
    #[arg(long)]
    pub profile: Option<String>,
    /// Real weights (safetensors); default: seeded synthetic.
    #[arg(long)]
    pub weights: Option<PathBuf>,
}

fn weights_source(path: Option<PathBuf>) -> cadence_engines::WeightsSource {
    match path {
        Some(p) => cadence_engines::WeightsSource::File(p),
        None => cadence_engines::WeightsSource::Synthetic { seed: cadence_engines::DEFAULT_SEED },
    }
}

fn read_f32(path: &std::path::Path, what: &str) -> Result<cadence_engines::Batch> {
    let (shape, data) = match npy::read(path)? {
        Array::F32 { shape, data } => (shape, data),
        Array::F16 { shape, data } => (shape, data.iter().map(|x| x.to_f32()).collect()),
    };
    anyhow::ensure!(!data.iter().any(|v| !v.is_finite()), "{}: {what} contains NaN or infinity", path.display());
    Ok(cadence_engines::Batch::new(shape, data)?)
}

pub fn run(a: EngineRunArgs) -> Result<()> {
    use cadence_engines::*;
    npy::check_output(&a.output, a.force)?;
    let profile = Profile::parse(&a.profile)?;
    let engine_device = select_device(a.device)?;
    let dev = engine_device.device.clone();
    let w = weights_source(a.weights.clone());
    let input = read_f32(&a.input, "the input")?;
    let (out, label) = match a.model {
        EngineModel::Taesd => {
            let d = Taesd::decoder(profile, &w, &dev)?;
            (d.decode(&input)?, d.weights_label())
        }
        EngineModel::SdVae => {
            let d = SdVae::decoder(profile, &w, &dev)?;
            (d.decode(&input)?, d.weights_label())
        }
        EngineModel::MusetalkUnet => {
            let audio_path = a.audio.as_ref().context("--audio (B,50,384) is required for musetalk-unet")?;
            let audio = read_f32(audio_path, "the audio windows")?;
            let u = MuseTalkUnet::new(profile, &w, &dev)?;
            (u.predict(&input, &audio)?, u.weights_label())
        }
        EngineModel::WhisperTiny => {
            anyhow::ensure!(
                input.shape.len() == 1,
                "whisper-tiny takes 16 kHz mono samples of shape (n,), got {:?}",
                input.shape
            );
            let e = WhisperAudio::new(profile, &w, &dev)?;
            (e.encode_audio(&input.data, 25.0)?, e.weights_label())
        }
    };
    npy::write(&a.output, &out.shape, &out.data)?;
    eprintln!(
        "cadence: {:?} ({} profile, weights {label}, on {engine_device}) {:?} -> {:?} -> {}",
        a.model,
        profile,
        input.shape,
        out.shape,
        a.output.display()
    );
    Ok(())
}

pub fn bench(a: EngineBenchArgs) -> Result<()> {
    let EngineBenchArgs { model, device, batch, runs, profile, weights } = a;
    use cadence_engines::bench::*;
    use cadence_engines::*;
    anyhow::ensure!(batch > 0 && runs > 0, "--batch and --runs must be positive");
    let engine_device = select_device(device)?;
    let dev = engine_device.device.clone();
    let profile = match profile.as_deref() {
        Some(p) => Profile::parse(p)?,
        None => Profile::default_for(&dev),
    };
    let w = weights_source(weights);
    let mm = matmul_probe(&dev, 2048, 5)?;
    let (r, label) = match model {
        EngineModel::Taesd => {
            let d = Taesd::decoder(profile, &w, &dev)?;
            (bench_decoder(&d, batch, runs)?, d.weights_label())
        }
        EngineModel::SdVae => {
            let d = SdVae::decoder(profile, &w, &dev)?;
            (bench_decoder(&d, batch, runs)?, d.weights_label())
        }
        EngineModel::MusetalkUnet => {
            let u = MuseTalkUnet::new(profile, &w, &dev)?;
            (bench_keyframe(&u, batch, runs)?, u.weights_label())
        }
        EngineModel::WhisperTiny => {
            let e = WhisperAudio::new(profile, &w, &dev)?;
            (bench_audio(&e, 25.6, runs)?, e.weights_label())
        }
    };
    let mm2 = matmul_probe(&dev, 2048, 5)?;
    let rate = 0.5 * (mm + mm2);
    println!(
        "cpu: {} | engine device {engine_device} | profile {profile} | weights {label}",
        cadence::hardware::cpu_model()
    );
    println!("matmul 2048^3 f32 (before/after): {mm:.1} / {mm2:.1} GFLOP/s");
    println!(
        "{:<30} batch {:>3}: {:>8.2} frames/s (median of {runs}), {:>7.1} GFLOP/s = {:.0}% of the matmul rate",
        r.name,
        r.batch,
        r.frames_per_s,
        r.gflops,
        100.0 * r.gflops / rate
    );
    Ok(())
}
