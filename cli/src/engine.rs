//! `cadence engine-run` and `cadence engine-bench`: one neural engine on its own.

use anyhow::{ensure, Context, Result};
use cadence::io::memory;
use cadence::io::npy::{self, Array};
use cadence::io::output::{OutputPath, Overwrite};
use cadence_engines::device::DEVICE_HELP;
use cadence_engines::{DeviceRequest, ModelKind, ModelsDir, WeightsSource, DEFAULT_SEED};
use clap::Args;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineModel {
    Taesd,
    SdVae,
    MusetalkUnet,
    WhisperTiny,
    DittoAppearance,
    DittoMotion,
    DittoWarp,
    DittoDecoder,
    DittoStitch,
    DittoLmdm,
    Hubert,
}

impl EngineModel {
    /// The MuseTalk-family model's file in a models folder (None for Ditto's networks).
    fn kind(self) -> Option<ModelKind> {
        match self {
            EngineModel::Taesd => Some(ModelKind::TaesdDecoder),
            EngineModel::SdVae => Some(ModelKind::SdVaeDecoder),
            EngineModel::MusetalkUnet => Some(ModelKind::MuseTalkUnet),
            EngineModel::WhisperTiny => Some(ModelKind::WhisperTiny),
            _ => None,
        }
    }

    /// Ditto's networks (and HuBERT) as the engines crate names them.
    fn ditto_net(self) -> Option<cadence_engines::ditto::bench::DittoNet> {
        use cadence_engines::ditto::bench::DittoNet;
        Some(match self {
            EngineModel::DittoAppearance => DittoNet::Appearance,
            EngineModel::DittoMotion => DittoNet::Motion,
            EngineModel::DittoWarp => DittoNet::Warp,
            EngineModel::DittoDecoder => DittoNet::Decoder,
            EngineModel::DittoStitch => DittoNet::Stitch,
            EngineModel::DittoLmdm => DittoNet::Lmdm,
            EngineModel::Hubert => DittoNet::Hubert,
            _ => return None,
        })
    }

    /// Ditto's networks: the input and output names of Ditto's ONNX exports.
    fn ditto_io(self) -> Option<(&'static [&'static str], &'static [&'static str])> {
        type Names = &'static [&'static str];
        let io: (Names, Names) = match self {
            EngineModel::DittoAppearance => (&["image"], &["pred"]),
            EngineModel::DittoMotion => (&["image"], &cadence_engines::ditto::motion::HEADS),
            EngineModel::DittoWarp => (&["feature_3d", "kp_source", "kp_driving"], &["out"]),
            EngineModel::DittoDecoder => (&["feature"], &["output"]),
            EngineModel::DittoStitch => (&["kp_source", "kp_driving"], &["out"]),
            EngineModel::DittoLmdm => (&["x", "cond_frame", "cond", "time_cond"], &["pred_noise", "x_start"]),
            EngineModel::Hubert => (&["input_values"], &["encoding_out"]),
            _ => return None,
        };
        Some(io)
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
    /// whisper-tiny: 16 kHz mono samples (n,) as float32. (Ditto's networks: --inputs.)
    #[arg(long)]
    input: Option<PathBuf>,
    /// musetalk-unet only: audio windows (B,50,d) before the positional encoding (d: whisper's
    /// width at the profile, 384 at full, 32 at cpu-reduced).
    #[arg(long)]
    audio: Option<PathBuf>,
    #[arg(long)]
    output: Option<PathBuf>,
    /// Ditto's networks and hubert: NAME=FILE.npy for each input of Ditto's ONNX export
    /// (ditto-appearance, ditto-motion: image; ditto-warp: feature_3d, kp_source, kp_driving;
    /// ditto-decoder: feature; ditto-stitch: kp_source, kp_driving; ditto-lmdm: x, cond_frame,
    /// cond, time_cond; hubert: input_values), comma-separated.
    #[arg(long, value_delimiter = ',')]
    inputs: Vec<String>,
    /// Ditto's networks and hubert: the folder for one NAME.npy per output (ditto-appearance:
    /// pred; ditto-motion: pitch, yaw, roll, t, exp, scale, kp; ditto-warp, ditto-stitch: out;
    /// ditto-decoder: output; ditto-lmdm: pred_noise, x_start; hubert: encoding_out).
    #[arg(long)]
    output_dir: Option<PathBuf>,
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
    let Some(kind) = model.kind() else {
        ensure!(models.is_none(), "{model:?}: --models holds MuseTalk's files; give Ditto's with --weights");
        return Ok(WeightsSource::Synthetic { seed: DEFAULT_SEED });
    };
    Ok(match ModelsDir::requested(models)? {
        Some(dir) => dir.weights(kind)?,
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
    profile: cadence_engines::Profile,
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
            let d = cadence_engines::unet::audio_dim(profile);
            let a = audio.with_context(|| format!("--audio (B,50,{d}) is required for musetalk-unet"))?;
            ensure!(
                a.shape.len() == 3 && a.shape[0] == s[0] && a.shape[1..] == [50, d],
                "--audio must be (B,50,{d}) at the {profile} profile with B = {} (the input's batch), got {:?}",
                s[0],
                a.shape
            );
        }
        EngineModel::WhisperTiny => {
            ensure!(s.len() == 1 && s[0] > 0, "whisper-tiny takes 16 kHz mono samples of shape (n,), got {s:?}");
        }
        _ => anyhow::bail!("{model:?} takes --inputs NAME=FILE.npy,... and --output-dir DIR"),
    }
    Ok(())
}

pub fn run(a: EngineRunArgs) -> Result<()> {
    use cadence_engines::*;
    if a.model.ditto_io().is_some() {
        return run_ditto(a);
    }
    ensure!(
        a.inputs.is_empty() && a.output_dir.is_none(),
        "--inputs and --output-dir are for Ditto's networks and hubert"
    );
    let (Some(input_path), Some(output)) = (a.input.clone(), a.output.clone()) else {
        anyhow::bail!("{:?} needs --input FILE.npy and --output FILE.npy", a.model);
    };
    let mut inputs = vec![input_path.as_path()];
    inputs.extend(a.audio.as_deref());
    inputs.extend(a.weights.as_deref());
    let out = OutputPath::check(&output, Overwrite::from_force(a.force), &inputs)?;
    let engine_device = select_device(a.device)?;
    let dev = engine_device.device.clone();
    let w = weights_source(a.model, a.weights.clone(), a.models.as_deref())?;
    let profile = Profile::for_weights(Some(Profile::parse(&a.profile)?), &dev, matches!(w, WeightsSource::File(_)))?;
    let input = read_f32(&input_path, "the input")?;
    let audio = a.audio.as_deref().map(|p| read_f32(p, "the audio windows")).transpose()?;
    check_inputs(a.model, profile, &input, audio.as_ref())?;
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
        _ => unreachable!("Ditto's networks return above"),
    };
    npy::write(&out, &out_batch.shape, &out_batch.data)?;
    eprintln!(
        "cadence: {:?} ({} profile, weights {label}, on {engine_device}) {:?} -> {:?} -> {}",
        a.model,
        profile,
        input.shape,
        out_batch.shape,
        output.display()
    );
    Ok(())
}

/// Ditto's networks at their published sizes on the CPU: inputs by ONNX name, every input
/// checked (names, shapes, finite values) before the weights load, one `.npy` per output.
fn run_ditto(a: EngineRunArgs) -> Result<()> {
    use cadence_engines::ditto::*;
    let model = a.model;
    let (in_names, out_names) = model.ditto_io().context("a Ditto network")?;
    ensure!(
        a.input.is_none() && a.output.is_none() && a.audio.is_none(),
        "{model:?} takes --inputs {} and --output-dir DIR, not --input/--output/--audio",
        in_names.iter().map(|n| format!("{n}=FILE.npy")).collect::<Vec<_>>().join(",")
    );
    let dir = a.output_dir.clone().context("--output-dir DIR is required for Ditto's networks")?;
    ensure!(a.profile == "full", "{model:?} has one size (full), not `{}`", a.profile);
    let mut files: HashMap<&str, PathBuf> = HashMap::new();
    for spec in &a.inputs {
        let (name, file) =
            spec.split_once('=').with_context(|| format!("--inputs `{spec}`: expected NAME=FILE.npy"))?;
        let name = *in_names
            .iter()
            .find(|n| **n == name)
            .with_context(|| format!("{model:?} has no input `{name}` (its inputs: {})", in_names.join(", ")))?;
        ensure!(files.insert(name, PathBuf::from(file)).is_none(), "input `{name}` given twice");
    }
    if let Some(missing) = in_names.iter().find(|n| !files.contains_key(*n)) {
        anyhow::bail!("{model:?}: input `{missing}` is missing (its inputs: {})", in_names.join(", "));
    }
    let engine_device = cadence_engines::select_device(a.device)?;
    ensure!(engine_device.device.is_cpu(), "{model:?} runs on the CPU only so far (got {engine_device})");
    let mut read = HashMap::new();
    for name in in_names {
        read.insert(*name, read_f32(&files[name], &format!("input `{name}`"))?);
    }
    let arr = |n: &str| &read[n];
    let shape_is = |n: &str, want: &[usize]| -> Result<()> {
        let s = &arr(n).shape;
        ensure!(s == want, "{model:?}: input `{n}` must have shape {want:?}, got {s:?}");
        Ok(())
    };
    let image_hw = |n: &str| -> Result<(usize, usize)> {
        let s = &arr(n).shape;
        ensure!(s.len() == 4 && s[0] == 1 && s[1] == 3, "{model:?}: input `{n}` must be (1,3,H,W), got {s:?}");
        Ok((s[2], s[3]))
    };
    match model {
        EngineModel::DittoAppearance | EngineModel::DittoMotion => {
            image_hw("image")?;
        }
        EngineModel::DittoWarp => {
            let c = warp::WarpConfig::default();
            let s = &arr("feature_3d").shape;
            ensure!(
                s.len() == 5 && s[..3] == [1, c.feature_channels, c.depth],
                "{model:?}: input `feature_3d` must be (1,{},{},h,w), got {s:?}",
                c.feature_channels,
                c.depth
            );
            shape_is("kp_source", &[1, c.num_kp, 3])?;
            shape_is("kp_driving", &[1, c.num_kp, 3])?;
        }
        EngineModel::DittoDecoder => {
            let s = &arr("feature").shape;
            let c = spade::SpadeConfig::default().channels;
            ensure!(s.len() == 4 && s[0] > 0 && s[1] == c, "{model:?}: input `feature` must be (N,{c},H,W), got {s:?}");
        }
        EngineModel::DittoStitch => {
            let s = &arr("kp_source").shape;
            ensure!(
                s.len() == 3 && s[0] > 0 && s[1..] == [21, 3],
                "{model:?}: `kp_source` must be (B,21,3), got {s:?}"
            );
            shape_is("kp_driving", s)?;
        }
        EngineModel::DittoLmdm => {
            let c = lmdm::LmdmConfig::default();
            shape_is("x", &[1, c.seq_len, c.nfeats])?;
            shape_is("cond_frame", &[1, c.nfeats])?;
            shape_is("cond", &[1, c.seq_len, c.cond_dim])?;
            let t = &arr("time_cond").data;
            ensure!(
                t.len() == 1 && t[0].fract() == 0.0 && (0.0..lmdm::NUM_TIMESTEPS as f32).contains(&t[0]),
                "{model:?}: `time_cond` must be one whole step in 0..{}, got {t:?}",
                lmdm::NUM_TIMESTEPS
            );
        }
        EngineModel::Hubert => {
            let s = &arr("input_values").shape;
            ensure!(
                s.len() == 2 && s[0] == 1 && s[1] >= 400,
                "{model:?}: `input_values` must be (1,n) 16 kHz samples, n >= 400, got {s:?}"
            );
        }
        _ => unreachable!("not a Ditto network"),
    }
    let w = weights_source(model, a.weights.clone(), a.models.as_deref())?;
    let mut input_paths: Vec<&Path> = files.values().map(PathBuf::as_path).collect();
    input_paths.extend(a.weights.as_deref());
    if !dir.exists() {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let outs = out_names
        .iter()
        .map(|n| OutputPath::check(&dir.join(format!("{n}.npy")), Overwrite::from_force(a.force), &input_paths))
        .collect::<Result<Vec<_>>>()?;
    let results: Vec<(Vec<usize>, Vec<f32>)> = match model {
        EngineModel::DittoAppearance => {
            let c = appearance::AppearanceConfig::default();
            let (h, wd) = image_hw("image")?;
            let net = appearance::AppearanceFeatureExtractor::new(&c, &w)?;
            let f = 1 << c.num_down_blocks;
            vec![(vec![1, c.reshape_channels, c.reshape_depth, h / f, wd / f], net.forward(&arr("image").data, h, wd)?)]
        }
        EngineModel::DittoMotion => {
            let (h, wd) = image_hw("image")?;
            let net = motion::MotionExtractor::new(&motion::MotionConfig::default(), &w)?;
            net.forward(&arr("image").data, h, wd)?.into_iter().map(|v| (vec![1, v.len()], v)).collect()
        }
        EngineModel::DittoWarp => {
            let c = warp::WarpConfig::default();
            let s = arr("feature_3d").shape.clone();
            let net = warp::WarpingNetwork::new(&c, &w)?;
            let out =
                net.forward(&arr("feature_3d").data, &arr("kp_source").data, &arr("kp_driving").data, s[3], s[4])?;
            vec![(vec![1, c.out_channels, s[3], s[4]], out)]
        }
        EngineModel::DittoDecoder => {
            let s = arr("feature").shape.clone();
            let net = spade::SpadeDecoder::new(&spade::SpadeConfig::default(), &w)?;
            let out = net.forward(&arr("feature").data, s[0], s[2], s[3])?;
            // The output side over the input side, from the sizes (the decoder's upscaling).
            let f = ((out.len() / (3 * s[0] * s[2] * s[3])) as f64).sqrt() as usize;
            vec![(vec![s[0], 3, f * s[2], f * s[3]], out)]
        }
        EngineModel::DittoStitch => {
            let s = arr("kp_source").shape.clone();
            let net = stitch::StitchingNetwork::new(&stitch::StitchConfig::default(), &w)?;
            vec![(s, net.forward(&arr("kp_source").data, &arr("kp_driving").data)?)]
        }
        EngineModel::DittoLmdm => {
            let c = lmdm::LmdmConfig::default();
            let net = lmdm::MotionDecoder::new(&c, &w)?;
            let time = arr("time_cond").data[0] as i64;
            let st = net.step(&arr("x").data, &arr("cond_frame").data, &arr("cond").data, time)?;
            vec![(vec![1, c.seq_len, c.nfeats], st.pred_noise), (vec![1, c.seq_len, c.nfeats], st.x_start)]
        }
        EngineModel::Hubert => {
            let c = hubert::HubertConfig::default();
            let net = hubert::Hubert::new(&c, &w)?;
            let out = net.last_hidden_state(&arr("input_values").data)?;
            vec![(vec![1, out.len() / c.hidden, c.hidden], out)]
        }
        _ => unreachable!("not a Ditto network"),
    };
    for (out, (shape, data)) in outs.iter().zip(&results) {
        npy::write(out, shape, data)?;
    }
    eprintln!(
        "cadence: {model:?} (weights {}, on {engine_device}) -> {} in {}",
        w.label(),
        out_names.iter().zip(&results).map(|(n, (s, _))| format!("{n} {s:?}")).collect::<Vec<_>>().join(", "),
        dir.display()
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
    if model.kind().is_none() {
        ensure!(dev.is_cpu(), "{model:?} runs on the CPU only so far (got {engine_device})");
    }
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
        _ => {
            let net = model.ditto_net().context("a Ditto network")?;
            (cadence_engines::ditto::bench::bench(net, profile, &w, batch, runs)?, w.label())
        }
    };
    let mm2 = matmul_probe(&dev, 2048, 5)?;
    let rate = 0.5 * (mm + mm2);
    println!(
        "cpu: {} | cpu loops {} | engine device {engine_device} | profile {profile} | weights {label}",
        cadence::backend::hardware::cpu_model(),
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
