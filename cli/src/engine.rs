//! `cadence engine-run` and `cadence engine-bench`: one neural engine on its own.

use anyhow::{ensure, Context, Result};
use cadence::memory;
use cadence::npy::{self, Array};
use cadence::output::{OutputPath, Overwrite};
use cadence_engines::device::DEVICE_HELP;
use cadence_engines::{DeviceRequest, ModelKind, ModelsDir, WeightsSource, DEFAULT_SEED};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineModel {
    Taesd,
    SdVae,
    MusetalkUnet,
    WhisperTiny,
}

impl EngineModel {
    fn kind(self) -> ModelKind {
        match self {
            EngineModel::Taesd => ModelKind::TaesdDecoder,
            EngineModel::SdVae => ModelKind::SdVaeDecoder,
            EngineModel::MusetalkUnet => ModelKind::MuseTalkUnet,
            EngineModel::WhisperTiny => ModelKind::WhisperTiny,
        }
    }
}

#[derive(Args)]
pub struct EngineRunArgs {
    #[arg(long, value_enum)]
    model: EngineModel,
    /// Weights file: safetensors or a PyTorch checkpoint (.pth/.bin/.pt), original layout; the
    /// configuration beside it is checked. Without it and --models: seeded synthetic weights.
    #[arg(long, conflicts_with = "models")]
    weights: Option<PathBuf>,
    /// MuseTalk's models/ folder as downloaded (else $CADENCE_MODELS); the model's weights must
    /// be found there.
    #[arg(long)]
    models: Option<PathBuf>,
    /// taesd / sd-vae: latents (B,4,h,w); musetalk-unet: (B,8,32,32) = [masked, reference];
    /// whisper-tiny: 16 kHz mono samples (n,) as float32.
    #[arg(long)]
    input: PathBuf,
    /// musetalk-unet only: audio windows (B,50,384) before the positional encoding.
    #[arg(long)]
    audio: Option<PathBuf>,
    #[arg(long)]
    output: PathBuf,
    /// full (default; what real weights need) or cpu-reduced (synthetic weights only).
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
    /// cpu-reduced (default on the CPU with synthetic weights) or full (default on CUDA and
    /// with real weights).
    #[arg(long)]
    pub profile: Option<String>,
    /// Weights file (safetensors or PyTorch checkpoint); default: seeded synthetic.
    #[arg(long, conflicts_with = "models")]
    pub weights: Option<PathBuf>,
    /// MuseTalk's models/ folder as downloaded (else $CADENCE_MODELS).
    #[arg(long)]
    pub models: Option<PathBuf>,
}

/// The weights of `model`: `--weights FILE`, else the model's file in `--models DIR` (or
/// `$CADENCE_MODELS`, through the same [`ModelsDir`] as `render`), else seeded synthetic weights.
fn weights_source(model: EngineModel, file: Option<PathBuf>, models: Option<&Path>) -> Result<WeightsSource> {
    if let Some(p) = file {
        return Ok(WeightsSource::File(p));
    }
    Ok(match ModelsDir::requested(models)? {
        Some(dir) => dir.weights(model.kind())?,
        None => WeightsSource::Synthetic { seed: DEFAULT_SEED },
    })
}

fn read_f32(path: &std::path::Path, what: &str) -> Result<cadence_engines::Batch> {
    let (shape, data) = match npy::read(path)? {
        Array::F32 { shape, data } => (shape, data),
        Array::F16 { shape, data } => (shape, data.iter().map(|x| x.to_f32()).collect()),
    };
    anyhow::ensure!(!data.iter().any(|v| !v.is_finite()), "{}: {what} contains NaN or infinity", path.display());
    Ok(cadence_engines::Batch::new(shape, data)?)
}

/// Checks the inputs' shapes (and what they would make the engine allocate) before any engine
/// loads: a wrong shape is a one-line error, not a failure after seconds of loading.
fn check_inputs(
    model: EngineModel,
    input: &cadence_engines::Batch,
    audio: Option<&cadence_engines::Batch>,
) -> Result<()> {
    let s = &input.shape;
    match model {
        EngineModel::Taesd | EngineModel::SdVae => {
            ensure!(s.len() == 4 && s[1] == 4 && s[0] > 0, "{model:?} decodes latents of shape (B,4,h,w), got {s:?}");
            // Bound on the decoders' peak memory: at most 128 channels at the output resolution
            // (64 output pixels per latent pixel), three live f32 buffers.
            let latent_px = memory::product(&[s[0], s[2], s[3]]);
            let peak = latent_px.and_then(|p| p.checked_mul(3 * 64 * 128 * 4));
            memory::ensure_allocatable(peak, &format!("decoding latents of shape {s:?}"))?;
        }
        EngineModel::MusetalkUnet => {
            ensure!(
                s.len() == 4 && s[0] > 0 && s[1..] == [8, 32, 32],
                "musetalk-unet takes (B,8,32,32) = [masked, reference] latents, got {s:?}"
            );
            let a = audio.context("--audio (B,50,384) is required for musetalk-unet")?;
            ensure!(
                a.shape.len() == 3 && a.shape[0] == s[0] && a.shape[1..] == [50, 384],
                "--audio must be (B,50,384) with B = {} (the input's batch), got {:?}",
                s[0],
                a.shape
            );
        }
        EngineModel::WhisperTiny => {
            ensure!(s.len() == 1 && s[0] > 0, "whisper-tiny takes 16 kHz mono samples of shape (n,), got {s:?}");
        }
    }
    Ok(())
}

pub fn run(a: EngineRunArgs) -> Result<()> {
    use cadence_engines::*;
    let mut inputs = vec![a.input.as_path()];
    inputs.extend(a.audio.as_deref());
    inputs.extend(a.weights.as_deref());
    let out = OutputPath::check(&a.output, Overwrite::from_force(a.force), &inputs)?;
    let engine_device = select_device(a.device)?;
    let dev = engine_device.device.clone();
    let w = weights_source(a.model, a.weights.clone(), a.models.as_deref())?;
    let profile = Profile::for_weights(Some(Profile::parse(&a.profile)?), &dev, matches!(w, WeightsSource::File(_)))?;
    let input = read_f32(&a.input, "the input")?;
    let audio = a.audio.as_deref().map(|p| read_f32(p, "the audio windows")).transpose()?;
    check_inputs(a.model, &input, audio.as_ref())?;
    let (out_batch, label) = match a.model {
        EngineModel::Taesd => {
            let d = Taesd::decoder(profile, &w, &dev)?;
            (d.decode(&input)?, d.weights_label())
        }
        EngineModel::SdVae => {
            let d = SdVae::decoder(profile, &w, &dev)?;
            (d.decode(&input)?, d.weights_label())
        }
        EngineModel::MusetalkUnet => {
            let audio = audio.context("checked above")?;
            let u = MuseTalkUnet::new(profile, &w, &dev)?;
            (u.predict(&input, &audio)?, u.weights_label())
        }
        EngineModel::WhisperTiny => {
            let e = WhisperAudio::new(profile, &w, &dev)?;
            (e.encode_audio(&input.data, 25.0)?, e.weights_label())
        }
    };
    npy::write(&out, &out_batch.shape, &out_batch.data)?;
    eprintln!(
        "cadence: {:?} ({} profile, weights {label}, on {engine_device}) {:?} -> {:?} -> {}",
        a.model,
        profile,
        input.shape,
        out_batch.shape,
        a.output.display()
    );
    Ok(())
}

pub fn bench(a: EngineBenchArgs) -> Result<()> {
    let EngineBenchArgs { model, device, batch, runs, profile, weights, models } = a;
    use cadence_engines::bench::*;
    use cadence_engines::*;
    anyhow::ensure!(batch > 0 && runs > 0, "--batch and --runs must be positive");
    let engine_device = select_device(device)?;
    let dev = engine_device.device.clone();
    let w = weights_source(model, weights, models.as_deref())?;
    let explicit = profile.as_deref().map(Profile::parse).transpose()?;
    let profile = Profile::for_weights(explicit, &dev, matches!(w, WeightsSource::File(_)))?;
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
        "cpu: {} | cpu loops {} | engine device {engine_device} | profile {profile} | weights {label}",
        cadence::hardware::cpu_model(),
        cadence_engines::isa::describe()
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
