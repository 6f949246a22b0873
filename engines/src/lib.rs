//! # cadence-engines
//!
//! The neural networks whose cost cadence's keyframe strides save, behind small traits that work
//! on plain host buffers ([`Batch`]), so callers need no candle types. Device-resident callers
//! use the tensor entry points ([`KeyframeModel::predict_tensor`],
//! [`LatentDecoder::decode_tensor`]): candle engines on a GPU keep the data there.
//!
//! | engine | type | trait | input -> output |
//! |---|---|---|---|
//! | MuseTalk UNet (diffusers `UNet2DConditionModel`, candle-transformers) | [`MuseTalkUnet`] | [`KeyframeModel`] | (B,8,32,32) + audio (B,50,384) -> (B,4,32,32) |
//! | TAESD decoder (hand-written, not in candle) | [`Taesd`] | [`LatentDecoder`] | (B,4,h,w) -> (B,3,8h,8w), about `[0,1]` |
//! | TAESD encoder | [`Taesd`] | [`ImageEncoder`] | (B,3,H,W) in `[0,1]` -> (B,4,H/8,W/8) |
//! | SD VAE decoder (sd-vae-ft-mse, candle-transformers `AutoEncoderKL`) | [`SdVae`] | [`LatentDecoder`] | latents / 0.18215 decoded, [-1,1] |
//! | SD VAE encoder | [`SdVae`] | [`ImageEncoder`] | (B,3,H,W) in [-1,1] -> posterior mean x 0.18215 |
//! | whisper-tiny encoder + MuseTalk windows | [`WhisperAudio`] | [`AudioEncoder`] | 16 kHz mono -> (frames, 50, 384) |
//!
//! Ditto's (LivePortrait's) networks are in [`ditto`]: the stitching MLP, the warping and SPADE
//! decoder networks it runs per frame, and the appearance and motion extractors, on the CPU
//! path with plain slices (not yet behind these traits).
//!
//! MTCNN's face detection networks (P-Net, R-Net, O-Net) with facenet-pytorch's trained weights,
//! committed and embedded, are in [`mtcnn`] (on candle; the detector around them is to come).
//!
//! ## Weights
//! [`WeightsSource::Synthetic`] builds seeded deterministic weights (He/LeCun-normal, residual
//! outputs scaled down, norms 1, biases 0) for the exact expected name -> shape table, and then loads
//! them through the same `VarBuilder::from_tensors` path as a file. [`WeightsSource::File`] reads a
//! weights file and checks every expected tensor up front: a missing name, a wrong shape or a
//! non-float dtype is an [`EngineError`] naming the tensor. Weights files are safetensors or
//! PyTorch checkpoints (zip or legacy `torch.save` formats, read by [`checkpoint`] through
//! candle's pickle reader, no Python), with their JSON configurations checked ([`config`]).
//! [`ModelsDir`] finds each engine's file in MuseTalk's `models/` folder as downloaded (or
//! cadence's flat folder, [`ModelKind::file_name`]) and checks it without loading
//! ([`ModelsDir::check`], `cadence models check`). Every engine reports
//! [`Engine::weights_label`] (`synthetic(seed=N)` or `real(<file>)`) and [`Engine::profile`].
//!
//! ## Profiles
//! [`Profile::Full`] is the published architecture; [`Profile::Cpu`] keeps the topology and divides
//! channel widths so the main experiment runs on two CPU cores in about two minutes (numbers in
//! the docs of [`Profile::Cpu`] and in engines/README.md).
//!
//! ## Devices
//! Constructors take a [`Device`] (re-exported from candle): `Device::Cpu` by default; with the
//! `cuda` feature, `Device::new_cuda(0)`. [`engine_device`] maps a user's `auto|cpu|cuda[:N]`
//! ([`DeviceRequest`]) to one (module [`device`]). The `tensorrt` feature adds
//! `trt::TensorRtUnet` and `trt::TensorRtDecoder` which run serialized TensorRT engines behind
//! the same traits.
//!
//! ## Benchmarks
//! [`bench::bench_decoder`], [`bench::bench_keyframe`], [`bench::bench_audio`] time engines
//! (median frames/s, GFLOP/s); [`bench::matmul_probe`] measures the CPU's large-matmul rate in the
//! same run so the achieved fraction can be reported.

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod conv;
pub mod device;
pub mod ditto;
pub mod error;
mod flops;
pub mod heap;
pub mod isa;
pub mod models_dir;
pub mod mtcnn;
pub mod sd_vae;
mod simd;
pub mod taesd;
pub mod torch_write;
#[cfg(feature = "tensorrt")]
pub mod trt;
pub mod unet;
pub mod weights;
pub mod whisper;

/// One latent frame of MuseTalk: 4 channels x 32 x 32, the UNet's output and the decoders' input
/// (and the element count the expansion kernels work on per frame).
pub const LATENT_DIM: usize = unet::OUT_CHANNELS * unet::LATENT_HW * unet::LATENT_HW;
/// The face crop the image encoders take and the decoders return: 3 x 256 x 256 RGB, the VAE's
/// 8x downsampling of the latent's 32 x 32.
pub const FACE_SIDE: usize = unet::LATENT_HW * 8;

pub use candle_core::{Device, Tensor};
pub use device::{engine_device, select_device, DeviceRequest, EngineDevice};
pub use error::{EngineError, Result};
pub use models_dir::{check_file, EngineCheck, ModelsDir};
pub use sd_vae::SdVae;
pub use taesd::Taesd;
pub use unet::MuseTalkUnet;
pub use whisper::{ClipSamples, WhisperAudio, WhisperClip};

use std::fmt;
use std::path::{Path, PathBuf};

/// Architecture size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// Exact published sizes (TAESD 64 channels, UNet `[320,640,1280,1280]`, VAE `[128,256,512,512]`,
    /// whisper-tiny d=384). Real weights need this profile.
    Full,
    /// Reduced widths, same layers and keys, for CPU runs, chosen as a **scale model** of `Full`:
    /// each engine's share of a frame's neural time (audio encoder, one UNet evaluation, one
    /// decode) is the full profile's, measured on the same machine by
    /// `cargo run --release -p experiments --bin profile_shares` (results/profile_shares.csv),
    /// so that what a stride saves is what it saves at the published sizes. The balance at
    /// `Full` moves with the speed of `gemm`'s kernel, so the audio encoder's and the SD VAE's
    /// widths are chosen per [`ScaleArm`] (this machine's: [`ScaleArm::current`]); the UNet's and
    /// TAESD's are the same on both. What it does not preserve: absolute speed, the networks'
    /// outputs (synthetic weights only), and the attention's head count. See docs/profiles.md.
    Cpu,
}

impl Profile {
    /// The default profile for a device: `Full` on CUDA, `Cpu` on the CPU.
    pub fn default_for(device: &Device) -> Profile {
        if device.is_cpu() {
            Profile::Cpu
        } else {
            Profile::Full
        }
    }
    /// The profile of a command: `explicit` (`--profile`) if given, else `Full` with real
    /// weights (their shapes are the published ones), else [`Profile::default_for`] the device.
    /// The reduced profile with real weights is an error (its narrower tensors exist only as
    /// synthetic weights).
    pub fn for_weights(explicit: Option<Profile>, device: &Device, real_weights: bool) -> Result<Profile> {
        match (explicit, real_weights) {
            (Some(Profile::Cpu), true) => Err(EngineError::BadInput(
                "real weights need --profile full (cpu-reduced is a narrowed architecture for synthetic weights)"
                    .into(),
            )),
            (Some(p), _) => Ok(p),
            (None, true) => Ok(Profile::Full),
            (None, false) => Ok(Profile::default_for(device)),
        }
    }
    /// The widths that make a profile on this machine, in one line (what
    /// `results/profile_shares.csv` records, so a change of width without a new measurement is
    /// seen).
    pub fn widths(self) -> String {
        self.widths_at(ScaleArm::current())
    }
    /// The widths that make a profile on machines of `arm`.
    pub fn widths_at(self, arm: ScaleArm) -> String {
        format!(
            "unet {:?} x{} heads, taesd {}, sd-vae {:?}, whisper d={} x{} heads",
            unet::block_channels(self),
            unet::attention_heads(self),
            taesd::channels_at(self, arm),
            sd_vae::config(self).block_out_channels,
            whisper::d_model(self),
            whisper::n_heads(self)
        )
    }
    pub fn parse(s: &str) -> Result<Profile> {
        match s {
            "full" => Ok(Profile::Full),
            "cpu" | "cpu-reduced" => Ok(Profile::Cpu),
            _ => Err(EngineError::BadInput(format!("unknown profile `{s}` (expected full or cpu-reduced)"))),
        }
    }
}

/// Which set of `cpu-reduced` widths a machine gets. The full profile's balance between the
/// engines moves with the speed of the matrix products, and the reduced networks, narrower and
/// more bound by overhead, do not follow it: on an AVX2 AMD EPYC one full UNet evaluation cost
/// 5.1 full TAESD decodes (results/profile_shares_fma.csv), on an AVX-512 Emerald Rapids Xeon
/// 3.8 (results/profile_shares.csv), while the reduced UNet cost 5 to 6 reduced decodes at
/// TAESD's width 8 on both. So the arm follows the kernel `gemm` runs ([`isa::gemm_kernel`]):
/// not cadence's own ISA level, so that `CADENCE_MAX_ISA` changes no network's shape. Only
/// TAESD's width differs between the arms ([`taesd::channels_at`]); docs/profiles.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleArm {
    /// `gemm`'s AVX-512 kernel.
    Avx512,
    /// `gemm`'s FMA (AVX2) kernel, or its scalar one (no machine of that kind was measured; the
    /// slower products put it nearer this arm's balance).
    Fma,
}

impl ScaleArm {
    pub const ALL: [ScaleArm; 2] = [ScaleArm::Avx512, ScaleArm::Fma];
    /// This machine's arm.
    pub fn current() -> ScaleArm {
        if isa::gemm_kernel() == "avx512f" {
            ScaleArm::Avx512
        } else {
            ScaleArm::Fma
        }
    }
    /// The name a results file records (`scale_arm`): `gemm`'s kernel name.
    pub fn name(self) -> &'static str {
        match self {
            ScaleArm::Avx512 => "avx512f",
            ScaleArm::Fma => "fma",
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Profile::Full => "full",
            Profile::Cpu => "cpu-reduced",
        })
    }
}

/// Where an engine's weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightsSource {
    /// Seeded deterministic synthetic weights (same seed -> bit-identical weights).
    Synthetic { seed: u64 },
    /// A weights file in the model's original state-dict layout: safetensors, or a PyTorch
    /// checkpoint (`.pth`/`.bin`/`.pt`, zip or legacy format), read directly.
    File(PathBuf),
}

impl WeightsSource {
    pub fn label(&self) -> String {
        match self {
            WeightsSource::Synthetic { seed } => format!("synthetic(seed={seed})"),
            WeightsSource::File(p) => format!("real({})", p.display()),
        }
    }
}

/// Default seed of synthetic weights when nothing else is given.
pub const DEFAULT_SEED: u64 = 0x00CA_DE0C;

/// The networks of this crate (one per weights file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelKind {
    TaesdDecoder,
    TaesdEncoder,
    SdVaeDecoder,
    SdVaeEncoder,
    MuseTalkUnet,
    WhisperTiny,
}

impl ModelKind {
    /// cadence's flat file name inside a models folder, the last place [`models_dir::candidates`]
    /// looks (MuseTalk's own layout comes first):
    /// - `taesd_decoder.safetensors`: madebyollin/taesd `taesd_decoder.pth` as safetensors
    ///   (keys `1.weight` ... `19.bias`);
    /// - `taesd_encoder.safetensors`: `taesd_encoder.pth` as safetensors (keys `0.weight` ... `14.bias`);
    /// - `sd_vae_ft_mse.safetensors`: stabilityai/sd-vae-ft-mse `diffusion_pytorch_model.safetensors`
    ///   (both VAE engines read it);
    /// - `musetalk_unet.safetensors`: MuseTalk's UNet (diffusers UNet keys, optionally prefixed `unet.`);
    /// - `whisper_tiny.safetensors`: openai/whisper-tiny `model.safetensors` (Hugging Face layout,
    ///   `model.encoder.*`; the decoder's tensors are ignored).
    pub fn file_name(self) -> &'static str {
        match self {
            ModelKind::TaesdDecoder => "taesd_decoder.safetensors",
            ModelKind::TaesdEncoder => "taesd_encoder.safetensors",
            ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => "sd_vae_ft_mse.safetensors",
            ModelKind::MuseTalkUnet => "musetalk_unet.safetensors",
            ModelKind::WhisperTiny => "whisper_tiny.safetensors",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::TaesdDecoder => "taesd-decoder",
            ModelKind::TaesdEncoder => "taesd-encoder",
            ModelKind::SdVaeDecoder => "sd-vae-decoder",
            ModelKind::SdVaeEncoder => "sd-vae-encoder",
            ModelKind::MuseTalkUnet => "musetalk-unet",
            ModelKind::WhisperTiny => "whisper-tiny",
        }
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Name of the environment variable holding the models directory (used when `--models` is not
/// given; see [`ModelsDir::requested`]).
pub const MODELS_ENV: &str = "CADENCE_MODELS";

/// A dense f32 tensor on the host, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Batch {
    /// Checks that `data.len()` equals the product of `shape`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Batch> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(EngineError::BadInput(format!("shape {shape:?} needs {n} values, got {}", data.len())));
        }
        Ok(Batch { shape, data })
    }
    pub fn zeros(shape: Vec<usize>) -> Batch {
        let n = shape.iter().product();
        Batch { shape, data: vec![0.0; n] }
    }
    /// Size of the first dimension.
    pub fn batch_size(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }
    pub(crate) fn to_tensor(&self, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_slice(&self.data, self.shape.as_slice(), device)?)
    }
    /// As `to_tensor` without copying the data on the CPU (the vector is moved).
    pub fn into_tensor(self, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_vec(self.data, self.shape, device)?)
    }
    /// A tensor's values as f32 on the host (copied from the device if needed).
    pub(crate) fn from_tensor(t: &Tensor) -> Result<Batch> {
        let shape = t.dims().to_vec();
        let data = t.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(Batch { shape, data })
    }
    /// Checks rank and the fixed (non-`None`) dimensions.
    pub(crate) fn expect(&self, what: &str, dims: &[Option<usize>]) -> Result<()> {
        if !shape_matches(&self.shape, dims) || self.data.len() != self.shape.iter().product::<usize>() {
            return Err(EngineError::BadInput(format!(
                "{what}: expected shape ({}), got {:?} with {} values",
                dims_text(dims),
                self.shape,
                self.data.len()
            )));
        }
        Ok(())
    }
}

fn shape_matches(shape: &[usize], dims: &[Option<usize>]) -> bool {
    shape.len() == dims.len() && shape.iter().zip(dims).all(|(s, d)| d.is_none_or(|d| d == *s))
}

fn dims_text(dims: &[Option<usize>]) -> String {
    let want: Vec<String> = dims.iter().map(|d| d.map_or("_".into(), |d| d.to_string())).collect();
    want.join(",")
}

/// [`Batch::expect`] for a tensor an engine runs directly: f32, on the engine's `device`, with
/// the given rank and fixed dimensions.
pub(crate) fn expect_tensor(what: &str, t: &Tensor, dims: &[Option<usize>], device: &Device) -> Result<()> {
    if t.dtype() != candle_core::DType::F32 {
        return Err(EngineError::BadInput(format!("{what}: expected f32, got {:?}", t.dtype())));
    }
    if !t.device().same_device(device) {
        return Err(EngineError::BadInput(format!(
            "{what}: the tensor is on {:?}, the engine on {:?}",
            t.device().location(),
            device.location()
        )));
    }
    if !shape_matches(t.dims(), dims) {
        return Err(EngineError::BadInput(format!("{what}: expected shape ({}), got {:?}", dims_text(dims), t.dims())));
    }
    Ok(())
}

/// What every engine reports.
pub trait Engine: Send + Sync {
    /// What the engine is, fixed when it is built.
    fn info(&self) -> &EngineInfo;
    fn model(&self) -> ModelKind {
        self.info().model
    }
    fn profile(&self) -> Profile {
        self.info().profile
    }
    /// `synthetic(seed=N)`, `real(<file>)` or `tensorrt(<file>)`.
    fn weights_label(&self) -> String {
        self.info().weights.clone()
    }
    fn num_params(&self) -> usize {
        self.info().num_params
    }
    fn flops_per_frame(&self) -> f64 {
        self.info().flops_per_frame
    }
    fn runtime(&self) -> Runtime {
        self.info().runtime
    }
    /// `name (runtime profile)`, e.g. `musetalk-unet (cadence CPU kernels, cpu-reduced)`.
    fn describe(&self) -> String {
        format!("{} ({}, {})", self.model(), self.runtime(), self.profile())
    }
}

/// The description every engine carries (see [`Engine`]).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineInfo {
    pub model: ModelKind,
    pub profile: Profile,
    /// `synthetic(seed=N)`, `real(<file>)` or `tensorrt(<file>)`.
    pub weights: String,
    /// Number of scalar parameters the architecture has (from its expected table).
    pub num_params: usize,
    /// Floating-point operations (2 x multiply-adds of convolutions, linears and attention
    /// matmuls; norms and activations not counted) for one batch element.
    pub flops_per_frame: f64,
    /// What executes the network: [`Runtime::Candle`] on its device, the hand-written CPU path
    /// ([`Runtime::CpuKernels`]: NHWC convolutions and fused layers, tested against candle), or
    /// TensorRT.
    pub runtime: Runtime,
}

/// What executes an engine's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Candle,
    CpuKernels,
    TensorRt,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Candle => "candle",
            Runtime::CpuKernels => "cadence CPU kernels",
            Runtime::TensorRt => "TensorRT",
        })
    }
}

/// MuseTalk's single-step UNet.
pub trait KeyframeModel: Engine {
    /// The width of an audio window's rows: the whisper encoder's width at the model's profile
    /// (384 at the full profile; [`unet::audio_dim`]).
    fn audio_dim(&self) -> usize;
    /// `latents`: (B, 8, 32, 32) = concat[masked latent, reference latent] along channels;
    /// `audio`: (B, 50, [`Self::audio_dim`]) windows *before* the positional encoding (the engine
    /// adds the sinusoidal PE as MuseTalk does right before its UNet call). Returns
    /// (B, 4, 32, 32), the UNet's raw output at timestep 0.
    fn predict(&self, latents: &Batch, audio: &Batch) -> Result<Batch>;
    /// [`Self::predict`] on f32 tensors, returning a tensor on the device of `latents`. Engines
    /// that run candle on a GPU keep the data there (a device-resident render never copies the
    /// latents to the host); the default goes through host buffers.
    fn predict_tensor(&self, latents: &Tensor, audio: &Tensor) -> Result<Tensor> {
        predict_through_host(self, latents, audio)
    }
}

/// [`KeyframeModel::predict_tensor`] through host buffers (the default, and what engines without
/// a device path call).
pub(crate) fn predict_through_host(
    m: &(impl KeyframeModel + ?Sized),
    latents: &Tensor,
    audio: &Tensor,
) -> Result<Tensor> {
    m.predict(&Batch::from_tensor(latents)?, &Batch::from_tensor(audio)?)?.into_tensor(latents.device())
}

/// [`LatentDecoder::decode_tensor`] through host buffers.
pub(crate) fn decode_through_host(d: &(impl LatentDecoder + ?Sized), latents: &Tensor) -> Result<Tensor> {
    // Batch::from_tensor would convert any dtype: a tensor an engine runs directly is f32, as on
    // the candle path ([`expect_tensor`]).
    if latents.dtype() != candle_core::DType::F32 {
        return Err(EngineError::BadInput(format!("decoder input: expected f32, got {:?}", latents.dtype())));
    }
    d.decode(&Batch::from_tensor(latents)?)?.into_tensor(latents.device())
}

/// A latent -> RGB decoder.
pub trait LatentDecoder: Engine {
    /// (B, 4, h, w) -> (B, 3, 8h, 8w), exactly as the network computes it (no clamping).
    fn decode(&self, latents: &Batch) -> Result<Batch>;
    /// [`Self::decode`] on an f32 tensor, returning a tensor on its device (see
    /// [`KeyframeModel::predict_tensor`]).
    fn decode_tensor(&self, latents: &Tensor) -> Result<Tensor> {
        decode_through_host(self, latents)
    }
    /// Nominal range of the output: (0, 1) for TAESD, (-1, 1) for the SD VAE.
    fn output_range(&self) -> (f32, f32);
}

/// An RGB -> latent encoder (used once per render for the reference face).
pub trait ImageEncoder: Engine {
    /// (B, 3, H, W) with H, W multiples of 8 -> (B, 4, H/8, W/8) in the UNet's latent scale.
    fn encode(&self, images: &Batch) -> Result<Batch>;
    /// Range the input images are expected in: (0, 1) for TAESD, (-1, 1) for the SD VAE.
    fn input_range(&self) -> (f32, f32);
}

/// Audio -> per-video-frame features.
pub trait AudioEncoder: Engine {
    /// 16 kHz mono samples -> (frames, 50, d) windows (before positional encoding; d = 384 at the
    /// full profile), one per
    /// video frame at `fps`; `frames = ceil(len * fps / 16000)`.
    fn encode_audio(&self, samples: &[f32], fps: f32) -> Result<Batch>;
}

/// Synthetic weights of a model written to a safetensors file (the same tensors
/// `WeightsSource::Synthetic { seed }` would use), e.g. to test the file path end to end.
pub fn write_synthetic_weights(model: ModelKind, profile: Profile, seed: u64, path: &Path) -> Result<()> {
    weights::save_tensors(&synthetic_weights(model, profile, seed)?, path)
}

/// The tensors `WeightsSource::Synthetic { seed }` gives `model` at `profile`, by state-dict name.
pub fn synthetic_weights(
    model: ModelKind,
    profile: Profile,
    seed: u64,
) -> Result<std::collections::HashMap<String, Tensor>> {
    match model {
        ModelKind::TaesdDecoder | ModelKind::TaesdEncoder => taesd::synthetic_weights(model, profile, seed),
        ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => sd_vae::synthetic_weights(profile, seed),
        ModelKind::MuseTalkUnet => unet::synthetic_weights(profile, seed),
        ModelKind::WhisperTiny => whisper::synthetic_weights(profile, seed),
    }
}

/// Expected parameter table (names and shapes) of a model at a profile.
pub fn param_table(model: ModelKind, profile: Profile) -> Result<weights::ParamTable> {
    match model {
        ModelKind::TaesdDecoder | ModelKind::TaesdEncoder => taesd::param_table(model, profile),
        ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => sd_vae::param_table(profile),
        ModelKind::MuseTalkUnet => unet::param_table(profile),
        ModelKind::WhisperTiny => whisper::param_table(profile),
    }
}

/// Loads tensors for `table` from `source`: synthetic, or a weights file (safetensors or PyTorch
/// checkpoint) whose configuration ([`config::check`]) and tensors are checked first. An engine
/// built on the CPU sets the CPU engines' heap policy ([`heap`]) as [`select_device`] does, for
/// callers that name `Device::Cpu` themselves.
pub(crate) fn obtain_tensors(
    kind: ModelKind,
    profile: Profile,
    table: &weights::ParamTable,
    source: &WeightsSource,
    rule: &(dyn Fn(&str, &[usize]) -> weights::Init + Sync),
    device: &Device,
) -> Result<std::collections::HashMap<String, Tensor>> {
    if device.is_cpu() {
        heap::retain_freed_blocks();
    }
    match source {
        WeightsSource::Synthetic { seed } => weights::synthetic_tensors(table, *seed, rule, device),
        WeightsSource::File(p) => {
            let mut file = checkpoint::WeightsFile::open(p)?;
            config::check(kind, profile, p, &file.checkpoint)?;
            weights::load_checked(&mut file, table, &normalizer(kind), device)
        }
    }
}

/// How a model maps the tensor names of its weights files to the names its constructor asks
/// for (`None`: a tensor the model does not use, such as a whisper file's text decoder).
pub(crate) fn normalizer(kind: ModelKind) -> fn(&str) -> Option<String> {
    match kind {
        ModelKind::TaesdDecoder | ModelKind::TaesdEncoder => taesd::normalize,
        ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => sd_vae::normalize,
        ModelKind::MuseTalkUnet => unet::normalize,
        ModelKind::WhisperTiny => whisper::normalize,
    }
}
