//! Stable Diffusion VAE (sd-vae-ft-mse), via candle-transformers' `AutoEncoderKL`.
//!
//! Decoder: latents are divided by 0.18215 and decoded; output nominally in [-1, 1]. On the CPU
//! the decoder runs cadence's NHWC forward of the same network ([`crate::sd_vae::cpu`]), tested
//! against candle's.
//! Encoder: the posterior mean times 0.18215 (MuseTalk's `get_latents_for_unet` convention).
//!
//! candle's `DiagonalGaussianDistribution` keeps its mean private and only offers `sample()`. We
//! get the exact mean without patching candle: after the weights are checked, the log-variance
//! half of `quant_conv` is set to weight 0 / bias -1e4, so std = exp(-5e3) underflows to exactly 0
//! and `sample()` returns `mean + 0 * noise = mean` bit-exactly. The log-variance is never used.

pub mod cpu;

use crate::flops::{attention_flops, index_after, weight_flops};
use crate::sd_vae::cpu::SdVaeDecoderCpu;
use crate::weights::{self, default_init, fan_in, Init, ParamTable};
use crate::{
    Batch, Device, Engine, EngineError, EngineInfo, ImageEncoder, LatentDecoder, ModelKind, Profile, Result, Runtime,
    WeightsSource,
};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::vae::{AutoEncoderKL, AutoEncoderKLConfig};
use std::collections::HashMap;

/// Latent scaling factor of SD 1.x VAEs.
pub const SCALING_FACTOR: f64 = 0.18215;

/// RGB in and out.
pub const IMAGE_CHANNELS: usize = 3;

/// VAE configuration of a profile. The reduced profile keeps every layer and key (a width
/// changes between the same blocks as at full, so the same shortcut convolutions exist) and
/// normalises over 16 groups instead of 32: with 32 the top block could not be narrower than
/// 32 channels, and the decoder's share of a frame would stay about 1.5x the full profile's
/// (docs/profiles.md).
pub fn config(profile: Profile) -> AutoEncoderKLConfig {
    let (block_out_channels, norm_num_groups) = match profile {
        Profile::Full => (vec![128, 256, 512, 512], 32),
        Profile::Cpu => (vec![16, 64, 96, 96], 16),
    };
    AutoEncoderKLConfig {
        block_out_channels,
        layers_per_block: 2,
        latent_channels: 4,
        norm_num_groups,
        use_quant_conv: true,
        use_post_quant_conv: true,
    }
}

fn build(vb: VarBuilder, profile: Profile) -> candle_core::Result<AutoEncoderKL> {
    AutoEncoderKL::new(vb, IMAGE_CHANNELS, IMAGE_CHANNELS, config(profile))
}

/// Expected table of the whole VAE (encoder and decoder; one file holds both).
pub fn param_table(profile: Profile) -> Result<ParamTable> {
    weights::record_table(|vb| build(vb, profile))
}

/// Residual outputs (resnet conv2, attention output) scaled by 0.2; output convs small.
fn init_rule(name: &str, shape: &[usize]) -> Init {
    let he = (2.0 / fan_in(shape) as f32).sqrt();
    let lecun = (1.0 / fan_in(shape) as f32).sqrt();
    if name.ends_with("conv2.weight") || name.ends_with("to_out.0.weight") {
        Init::Normal(0.2 * he)
    } else if name == "decoder.conv_out.weight" {
        Init::Normal(0.3 * lecun)
    } else if name == "encoder.conv_out.weight" || name.contains("quant_conv.weight") {
        Init::Normal(lecun)
    } else {
        default_init(name, shape)
    }
}

/// Accepts diffusers keys, optionally prefixed `vae.`, with either attention naming
/// (`to_q/to_k/to_v/to_out.0` or the older `query/key/value/proj_attn`).
pub(crate) fn normalize(key: &str) -> Option<String> {
    let k = key.strip_prefix("vae.").unwrap_or(key);
    let k = k
        .replace(".attentions.0.query.", ".attentions.0.to_q.")
        .replace(".attentions.0.key.", ".attentions.0.to_k.")
        .replace(".attentions.0.value.", ".attentions.0.to_v.")
        .replace(".attentions.0.proj_attn.", ".attentions.0.to_out.0.");
    Some(k)
}

pub(crate) fn synthetic_weights(profile: Profile, seed: u64) -> Result<HashMap<String, Tensor>> {
    let table = param_table(profile)?;
    weights::synthetic_tensors(&table, seed, &init_rule, &Device::Cpu)
}

/// SD VAE decoder or encoder.
pub struct SdVae {
    info: EngineInfo,
    vae: AutoEncoderKL,
    /// The decoder's CPU fast path (None for the encoder and on other devices).
    fast: Option<SdVaeDecoderCpu>,
    device: Device,
}

impl SdVae {
    /// Decoder: (B,4,h,w) latents (UNet scale) -> (B,3,8h,8w) in about [-1,1].
    pub fn decoder(profile: Profile, weights: &WeightsSource, device: &Device) -> Result<SdVae> {
        Self::new(ModelKind::SdVaeDecoder, profile, weights, device)
    }
    /// Encoder: (B,3,H,W) in [-1,1] -> posterior mean x 0.18215.
    pub fn encoder(profile: Profile, weights: &WeightsSource, device: &Device) -> Result<SdVae> {
        Self::new(ModelKind::SdVaeEncoder, profile, weights, device)
    }

    fn new(kind: ModelKind, profile: Profile, weights: &WeightsSource, device: &Device) -> Result<SdVae> {
        let table = param_table(profile)?;
        let mut tensors = crate::obtain_tensors(kind, profile, &table, weights, &init_rule, device)?;
        if kind == ModelKind::SdVaeEncoder {
            zero_logvar(&mut tensors)?;
        }
        let fast = if kind == ModelKind::SdVaeDecoder && device.is_cpu() {
            Some(SdVaeDecoderCpu::for_profile(&tensors, profile)?)
        } else {
            None
        };
        let vae = weights::build_from_tensors(tensors, device, kind.name(), |vb| build(vb, profile))?;
        let half = if kind == ModelKind::SdVaeDecoder {
            ["decoder.", "post_quant_conv."]
        } else {
            ["encoder.", "quant_conv."]
        };
        let num_params = table
            .entries
            .iter()
            .filter(|e| half.iter().any(|p| e.name.starts_with(p)))
            .map(|e| e.shape.iter().product::<usize>())
            .sum();
        let flops = vae_flops(&table, kind, &config(profile).block_out_channels);
        Ok(SdVae {
            info: EngineInfo {
                model: kind,
                profile,
                weights: weights.label(),
                num_params,
                flops_per_frame: flops,
                runtime: if fast.is_some() { Runtime::CpuKernels } else { Runtime::Candle },
            },
            vae,
            fast,
            device: device.clone(),
        })
    }
}

/// Sets the log-variance rows of quant_conv to weight 0, bias -1e4 (see module docs).
fn zero_logvar(t: &mut HashMap<String, Tensor>) -> Result<()> {
    let w = t.get("quant_conv.weight").ok_or_else(|| EngineError::BadInput("quant_conv.weight".into()))?;
    let (o, i, kh, kw) = w.dims4()?;
    let half = o / 2;
    let w_new = Tensor::cat(&[w.narrow(0, 0, half)?, Tensor::zeros((o - half, i, kh, kw), w.dtype(), w.device())?], 0)?;
    let b = t.get("quant_conv.bias").ok_or_else(|| EngineError::BadInput("quant_conv.bias".into()))?;
    let b_new = Tensor::cat(&[b.narrow(0, 0, half)?, (Tensor::ones(o - half, b.dtype(), b.device())? * -1e4)?], 0)?;
    t.insert("quant_conv.weight".into(), w_new);
    t.insert("quant_conv.bias".into(), b_new);
    Ok(())
}

/// FLOPs of one frame: decoder at 32x32 latents -> 256x256, encoder at 256x256 -> 32x32.
fn vae_flops(table: &ParamTable, kind: ModelKind, ch: &[usize]) -> f64 {
    let lat = 32.0f64;
    let px = |r: f64| r * r;
    let n = ch.len();
    if kind == ModelKind::SdVaeDecoder {
        let res = |i: usize| lat * 2f64.powi(i as i32);
        let f = weight_flops(table, |name| {
            if name.starts_with("post_quant_conv")
                || name.starts_with("decoder.conv_in")
                || name.starts_with("decoder.mid_block")
            {
                Some(px(lat))
            } else if name.starts_with("decoder.conv_out") {
                Some(px(res(n - 1)))
            } else if name.starts_with("decoder.up_blocks.") {
                let i = index_after(name, "up_blocks.")?;
                Some(if name.contains("upsamplers") { px(res(i) * 2.0) } else { px(res(i)) })
            } else {
                None
            }
        });
        f + attention_flops(px(lat), px(lat), ch[n - 1] as f64)
    } else {
        let img = 256.0f64;
        let res = |i: usize| img / 2f64.powi(i as i32);
        let f = weight_flops(table, |name| {
            if name.starts_with("encoder.conv_in") {
                Some(px(img))
            } else if name.starts_with("quant_conv")
                || name.starts_with("encoder.conv_out")
                || name.starts_with("encoder.mid_block")
            {
                Some(px(lat))
            } else if name.starts_with("encoder.down_blocks.") {
                let i = index_after(name, "down_blocks.")?;
                Some(if name.contains("downsamplers") { px(res(i) / 2.0) } else { px(res(i)) })
            } else {
                None
            }
        });
        f + attention_flops(px(lat), px(lat), ch[n - 1] as f64)
    }
}

impl Engine for SdVae {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
}

impl SdVae {
    /// The decoder through candle's `AutoEncoderKL` (used on CUDA; on the CPU it is the
    /// reference the fast path is tested against).
    pub fn decode_candle(&self, latents: &Batch) -> Result<Batch> {
        if self.info.model != ModelKind::SdVaeDecoder {
            return Err(EngineError::BadInput("this SD VAE engine is an encoder; use encode()".into()));
        }
        latents.expect("SD VAE decoder input", &[None, Some(4), None, None])?;
        let x = latents.to_tensor(&self.device)?;
        Batch::from_tensor(&self.vae.decode(&(x / SCALING_FACTOR)?)?)
    }
}

impl LatentDecoder for SdVae {
    fn decode(&self, latents: &Batch) -> Result<Batch> {
        if self.info.model != ModelKind::SdVaeDecoder {
            return Err(EngineError::BadInput("this SD VAE engine is an encoder; use encode()".into()));
        }
        latents.expect("SD VAE decoder input", &[None, Some(4), None, None])?;
        match &self.fast {
            Some(net) => {
                let (n, h, w) = (latents.shape[0], latents.shape[2], latents.shape[3]);
                let (data, (oh, ow)) = net.forward(&latents.data, n, (h, w));
                Batch::new(vec![n, IMAGE_CHANNELS, oh, ow], data)
            }
            None => self.decode_candle(latents),
        }
    }
    /// Candle on the engine's device: on a GPU the tensors never leave it.
    fn decode_tensor(&self, latents: &Tensor) -> Result<Tensor> {
        if self.fast.is_some() {
            return crate::decode_through_host(self, latents);
        }
        if self.info.model != ModelKind::SdVaeDecoder {
            return Err(EngineError::BadInput("this SD VAE engine is an encoder; use encode()".into()));
        }
        crate::expect_tensor("SD VAE decoder input", latents, &[None, Some(4), None, None], &self.device)?;
        Ok(self.vae.decode(&(latents / SCALING_FACTOR)?)?)
    }
    fn output_range(&self) -> (f32, f32) {
        (-1.0, 1.0)
    }
}

impl ImageEncoder for SdVae {
    fn encode(&self, images: &Batch) -> Result<Batch> {
        if self.info.model != ModelKind::SdVaeEncoder {
            return Err(EngineError::BadInput("this SD VAE engine is a decoder; use decode()".into()));
        }
        images.expect("SD VAE encoder input", &[None, Some(3), None, None])?;
        if !images.shape[2].is_multiple_of(8) || !images.shape[3].is_multiple_of(8) {
            return Err(EngineError::BadInput(format!(
                "SD VAE encoder: H and W must be multiples of 8, got {:?}",
                images.shape
            )));
        }
        let x = images.to_tensor(&self.device)?;
        let mean = self.vae.encode(&x)?.sample()?;
        Batch::from_tensor(&(mean * SCALING_FACTOR)?)
    }
    fn input_range(&self) -> (f32, f32) {
        (-1.0, 1.0)
    }
}
