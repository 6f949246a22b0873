//! Ditto's networks (antgroup/ditto-talkinghead): the per-frame and per-avatar ones are
//! LivePortrait's (KwaiVGI/LivePortrait); the per-clip ones are HuBERT and Ditto's own LMDM; all
//! on cadence's CPU kernels.
//!
//! Per video frame Ditto runs the stitching MLP on the keypoints, then the warping network
//! (≈171 GMAC) and the SPADE decoder (≈446 GMAC); together they are nearly all of its per-frame
//! cost, which is why these three came first. Per clip, HuBERT turns the audio into 25 fps
//! features and the LMDM samples the motion from them (≈2.6 GMAC per forward, two per DDIM step).
//!
//! | network | module | input -> output |
//! |---|---|---|
//! | StitchingNetwork (Ditto `core/models/modules/stitching_network.py`) | [`stitch`] | kp_source, kp_driving (B,21,3) -> kp_driving stitched (B,21,3) |
//! | SPADEDecoder (LP `src/modules/spade_generator.py`) | [`spade`] | feature (1,256,64,64) -> image (1,3,512,512) in `[0, 1]` |
//! | WarpingNetwork + DenseMotionNetwork (LP `warping_network.py`, `dense_motion.py`) | [`warp`] | feature_3d (1,32,16,64,64), kp_source, kp_driving (1,21,3) -> (1,256,64,64) |
//! | AppearanceFeatureExtractor (LP `appearance_feature_extractor.py`; per source image) | [`appearance`] | image (1,3,256,256) in `[0, 1]` -> feature_3d (1,32,16,64,64) |
//! | MotionExtractor (LP `motion_extractor.py`, ConvNeXtV2-tiny; per source image) | [`motion`] | image (1,3,256,256) -> pitch, yaw, roll (66 bins), t, exp, scale, kp |
//! | LMDM MotionDecoder + DDIM sampler (Ditto `core/models/modules/LMDM.py`; per clip) | [`lmdm`] | x (80,265), cond_frame (265), cond (80,1103), step -> x_start (80,265) |
//! | HuBERT-large (HF `HubertModel`; per clip) | [`hubert`] | audio 16 kHz -> features (N,1024) at 25 fps |
//!
//! **Parameter names** are the published state dicts' (the attribute paths of the PyTorch
//! modules), so Ditto's `stitch_network.pth`, `warp_network.pth` and `decoder.pth` (and
//! LivePortrait's own files) load unchanged through [`crate::checkpoint`]. Each network's
//! table (name -> shape) comes from its config; the default config is the published size and a
//! reduced one keeps every layer (the tests use it against PyTorch).
//!
//! **Eval-time folding at load**: BatchNorm (running statistics, eps 1e-5) is folded into the
//! convolution before it; spectral normalisation (`weight_orig`, `weight_u`, `weight_v`) becomes
//! `weight_orig / (uᵀ W v)` with the stored vectors, which is what `torch.nn.utils.spectral_norm`
//! computes in eval mode (no power iteration). Both happen once, in `Params`, so the forward
//! passes see plain convolutions.
//!
//! **Synthetic weights** (the default, [`WeightsSource::Synthetic`]): the engines' seeded rule
//! ([`crate::weights`]), BatchNorm running statistics (0, 1), and spectral-norm vectors set by
//! power iteration on the seeded `weight_orig` (what training leaves behind), so every
//! spectral-normalised convolution has spectral norm about 1 as in a trained network; and the
//! output layers that give keypoints and motion sized as a trained network's (`output_scale`),
//! so that the warp samples inside the source's feature volume.

pub mod appearance;
pub mod bench;
pub mod hubert;
pub mod keypoints;
pub mod lmdm;
pub mod motion;
pub mod profile;
pub mod spade;
pub mod stitch;
pub mod warp;

pub use profile::DittoConfigs;

use std::collections::HashMap;

use candle_core::Tensor;

use crate::checkpoint::WeightsFile;
use crate::weights::{self, default_init, Init, ParamSpec, ParamTable};
use crate::{Device, EngineError, Result, WeightsSource};

/// BatchNorm's eps (PyTorch's default, which LivePortrait keeps).
pub(crate) const BN_EPS: f64 = 1e-5;

/// Builds a [`ParamTable`] in declaration order.
#[derive(Default)]
pub(crate) struct TableBuilder(Vec<ParamSpec>);

impl TableBuilder {
    pub(crate) fn add(&mut self, name: impl Into<String>, shape: &[usize]) {
        self.0.push(ParamSpec { name: name.into(), shape: shape.to_vec() });
    }
    /// A convolution's `weight` (cout, cin, k...) and, if `bias`, its `bias`.
    pub(crate) fn conv(&mut self, prefix: &str, cout: usize, cin: usize, kernel: &[usize], bias: bool) {
        let mut shape = vec![cout, cin];
        shape.extend_from_slice(kernel);
        self.add(format!("{prefix}.weight"), &shape);
        if bias {
            self.add(format!("{prefix}.bias"), &[cout]);
        }
    }
    /// A spectral-normalised convolution: `weight_orig`, `bias`, `weight_u` (cout), `weight_v`
    /// (cin x taps), as `spectral_norm` registers them.
    pub(crate) fn sn_conv(&mut self, prefix: &str, cout: usize, cin: usize, kernel: &[usize], bias: bool) {
        let mut shape = vec![cout, cin];
        shape.extend_from_slice(kernel);
        self.add(format!("{prefix}.weight_orig"), &shape);
        if bias {
            self.add(format!("{prefix}.bias"), &[cout]);
        }
        self.add(format!("{prefix}.weight_u"), &[cout]);
        self.add(format!("{prefix}.weight_v"), &[cin * kernel.iter().product::<usize>()]);
    }
    /// A BatchNorm with affine parameters and running statistics (`num_batches_tracked`, an
    /// integer the eval forward does not use, is left out: a file's copy is ignored).
    pub(crate) fn batch_norm(&mut self, prefix: &str, c: usize) {
        for p in ["weight", "bias", "running_mean", "running_var"] {
            self.add(format!("{prefix}.{p}"), &[c]);
        }
    }
    pub(crate) fn build(self) -> ParamTable {
        ParamTable { entries: self.0 }
    }
}

/// The seeded rule for Ditto's synthetic weights: the engines' default, BatchNorm statistics
/// (0, 1), spectral-norm vectors N(0, 1) (replaced by power iteration, [`settle_spectral`]).
fn init_rule(name: &str, shape: &[usize]) -> Init {
    let last = name.rsplit('.').next().unwrap_or(name);
    match last {
        "running_mean" => Init::Const(0.0),
        "running_var" => Init::Const(1.0),
        "weight_u" | "weight_v" => Init::Normal(1.0),
        // LMDM's null-condition embeddings are torch.randn at init.
        "null_cond_embed" | "null_cond_hidden" => Init::Normal(1.0),
        // Weight norm's scale: 1 gives each tap of the positional convolution unit norm.
        "weight_g" => Init::Const(1.0),
        _ => match output_scale(name) {
            Some((std, _)) if last == "weight" => Init::Normal(std / (weights::fan_in(shape) as f32).sqrt()),
            Some((_, bias)) => Init::Const(bias),
            None => default_init(name, shape),
        },
    }
}

/// Output layers whose synthetic values are sized like a trained network's (weight std making
/// the output's std `.0` for unit inputs, bias `.1`): the motion extractor's canonical
/// keypoints within the unit cube the warp samples (std 0.3), a neutral scale of 1, expression
/// and translation of a few hundredths; the LMDM's motion (std 0.02), whose frame-to-frame
/// differences drive the face, and the stitching MLP's correction. With the default rule these come out of unit size, the keypoints
/// land far outside the feature volume and the warp samples only its zero padding.
fn output_scale(name: &str) -> Option<(f32, f32)> {
    let layer = name.rsplit_once('.').map_or(name, |(l, _)| l);
    match layer {
        "detector.fc_kp" => Some((0.3, 0.0)),
        "detector.fc_scale" => Some((0.02, 1.0)),
        "detector.fc_exp" | "detector.fc_t" => Some((0.02, 0.0)),
        "final_layer" => Some((0.02, 0.0)),
        // The stitching MLP's output: a correction of a few hundredths.
        "mlp.6" => Some((0.02, 0.0)),
        _ => None,
    }
}

/// Power iteration on every spectral-normalised weight of synthetic tensors, so that the stored
/// u, v are (close to) the top singular vectors, as after training.
fn settle_spectral(tensors: &mut HashMap<String, Tensor>) -> Result<()> {
    let prefixes: Vec<String> =
        tensors.keys().filter_map(|k| k.strip_suffix(".weight_orig").map(str::to_string)).collect();
    for p in prefixes {
        let w = tensors[&format!("{p}.weight_orig")].flatten_all()?.to_vec1::<f32>()?;
        let mut u = tensors[&format!("{p}.weight_u")].to_vec1::<f32>()?;
        let mut v = tensors[&format!("{p}.weight_v")].to_vec1::<f32>()?;
        let (rows, cols) = (u.len(), v.len());
        for _ in 0..10 {
            // v = normalize(Wᵀ u), u = normalize(W v), as spectral_norm's training step.
            let mut nv = vec![0f64; cols];
            for (o, &uo) in u.iter().enumerate() {
                for (i, acc) in nv.iter_mut().enumerate() {
                    *acc += w[o * cols + i] as f64 * uo as f64;
                }
            }
            v = normalized(&nv);
            let nu: Vec<f64> =
                (0..rows).map(|o| (0..cols).map(|i| w[o * cols + i] as f64 * v[i] as f64).sum()).collect();
            u = normalized(&nu);
        }
        tensors.insert(format!("{p}.weight_u"), Tensor::from_vec(u, rows, &Device::Cpu)?);
        tensors.insert(format!("{p}.weight_v"), Tensor::from_vec(v, cols, &Device::Cpu)?);
    }
    Ok(())
}

fn normalized(x: &[f64]) -> Vec<f32> {
    let n = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
    x.iter().map(|v| (v / n) as f32).collect()
}

/// Strips DataParallel's `module.` (Ditto's stitching checkpoint has it; the others may).
fn strip_module(key: &str) -> String {
    key.strip_prefix("module.").unwrap_or(key).to_string()
}

/// A network's tensors, checked against its table, with the eval-time folds applied.
pub(crate) struct Params(pub(crate) HashMap<String, Tensor>);

impl Params {
    /// Synthetic (seeded) or read from a file (safetensors or PyTorch checkpoint) through the
    /// engines' checked loader: every tensor of `table` must be present with its shape; other
    /// tensors in the file are ignored.
    pub(crate) fn obtain(
        table: &ParamTable,
        source: &WeightsSource,
        normalize: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Params> {
        let tensors = match source {
            WeightsSource::Synthetic { seed } => {
                let mut t = weights::synthetic_tensors(table, *seed, &init_rule, &Device::Cpu)?;
                settle_spectral(&mut t)?;
                t
            }
            WeightsSource::File(p) => {
                let mut file = WeightsFile::open(p)?;
                weights::load_checked(&mut file, table, normalize, &Device::Cpu)?
            }
        };
        Ok(Params(tensors))
    }

    pub(crate) fn vec(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.0.get(name).ok_or_else(|| EngineError::BadInput(format!("missing tensor `{name}`")))?;
        Ok(t.flatten_all()?.to_vec1::<f32>()?)
    }

    fn dims(&self, name: &str) -> Result<Vec<usize>> {
        let t = self.0.get(name).ok_or_else(|| EngineError::BadInput(format!("missing tensor `{name}`")))?;
        Ok(t.dims().to_vec())
    }

    fn put(&mut self, name: String, dims: &[usize], v: Vec<f32>) -> Result<()> {
        self.0.insert(name, Tensor::from_vec(v, dims, &Device::Cpu)?);
        Ok(())
    }

    /// `{prefix}.weight` = `weight_orig / σ`, σ = uᵀ (W v) with W = weight_orig as (cout, rest)
    /// and the stored u, v: spectral_norm's eval-mode weight. σ in f64.
    pub(crate) fn fold_spectral(&mut self, prefix: &str) -> Result<()> {
        let dims = self.dims(&format!("{prefix}.weight_orig"))?;
        let mut w = self.vec(&format!("{prefix}.weight_orig"))?;
        let u = self.vec(&format!("{prefix}.weight_u"))?;
        let v = self.vec(&format!("{prefix}.weight_v"))?;
        let cols = v.len();
        let sigma: f64 = u
            .iter()
            .enumerate()
            .map(|(o, &uo)| {
                uo as f64 * w[o * cols..(o + 1) * cols].iter().zip(&v).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
            })
            .sum();
        w.iter_mut().for_each(|x| *x = (*x as f64 / sigma) as f32);
        self.put(format!("{prefix}.weight"), &dims, w)
    }

    /// Folds BatchNorm `bn` (eval: running statistics) into convolution `conv` before it:
    /// W' = W·s, b' = (b − mean)·s + β with s = γ / sqrt(var + eps), per output channel.
    pub(crate) fn fold_batch_norm(&mut self, conv: &str, bn: &str) -> Result<()> {
        let dims = self.dims(&format!("{conv}.weight"))?;
        let mut w = self.vec(&format!("{conv}.weight"))?;
        let mut b = self.vec(&format!("{conv}.bias"))?;
        let (g, beta) = (self.vec(&format!("{bn}.weight"))?, self.vec(&format!("{bn}.bias"))?);
        let (mean, var) = (self.vec(&format!("{bn}.running_mean"))?, self.vec(&format!("{bn}.running_var"))?);
        let per = w.len() / dims[0];
        for o in 0..dims[0] {
            let s = g[o] as f64 / (var[o] as f64 + BN_EPS).sqrt();
            w[o * per..(o + 1) * per].iter_mut().for_each(|x| *x = (*x as f64 * s) as f32);
            b[o] = ((b[o] as f64 - mean[o] as f64) * s + beta[o] as f64) as f32;
        }
        self.put(format!("{conv}.weight"), &dims, w)?;
        self.put(format!("{conv}.bias"), &[dims[0]], b)
    }

    /// For the CPU packers of the other engines.
    pub(crate) fn weights(&self) -> crate::unet::cpu::Weights<'_> {
        crate::unet::cpu::Weights(&self.0)
    }
}
