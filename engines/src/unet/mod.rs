//! MuseTalk's UNet: diffusers `UNet2DConditionModel` (candle-transformers implementation) with
//! in_channels 8, out_channels 4, block_out_channels [320, 640, 1280, 1280] (3 cross-attention
//! down blocks + 1 plain, mirrored up), 2 layers per block, 8 attention heads,
//! cross_attention_dim 384, 32 norm groups, conv proj_in/proj_out (SD 1.x layout). Evaluated once
//! at timestep 0. The audio window gets MuseTalk's sinusoidal positional encoding (d = 384,
//! interleaved sin/cos) added right before the UNet call, as in MuseTalk's `PositionalEncoding`.

pub mod cpu;

use crate::flops::{attention_flops, index_after, weight_flops};
use crate::unet::cpu::UnetCpu;
use crate::weights::{self, default_init, fan_in, Init, ParamTable};
use crate::{Batch, Device, Engine, EngineInfo, KeyframeModel, ModelKind, Profile, Result, Runtime, WeightsSource};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::unet_2d::{
    BlockConfig, UNet2DConditionModel, UNet2DConditionModelConfig,
};
use std::collections::HashMap;

/// Audio feature width at the full profile (whisper-tiny's d_model) and tokens per window.
pub const AUDIO_DIM: usize = 384;
pub const AUDIO_TOKENS: usize = 50;

/// The audio feature width the UNet's cross-attention takes at a profile: the whisper encoder's
/// width ([`crate::whisper::d_model`]; 384 at `Full`).
pub fn audio_dim(profile: Profile) -> usize {
    crate::whisper::d_model(profile)
}
/// Input channels (masked latent + reference latent) and output channels of MuseTalk's UNet.
pub const IN_CHANNELS: usize = 8;
pub const OUT_CHANNELS: usize = 4;
/// Latent spatial size of MuseTalk (256x256 face crop / 8).
pub const LATENT_HW: usize = 32;

/// Block widths of a profile.
pub fn block_channels(profile: Profile) -> [usize; 4] {
    match profile {
        Profile::Full => [320, 640, 1280, 1280],
        Profile::Cpu => [64, 128, 288, 288],
    }
}

/// Attention heads (diffusers' `attention_head_dim`, which SD 1.x uses as the head count): 8 at
/// `Full`; 1 at `Cpu`, where 8 heads of width 4..16 made the 1024-token softmax cost 2.7x the rest
/// of the network on the CPU (measured: 0.8 vs 2.2 frames/s at batch 8).
pub fn attention_heads(profile: Profile) -> usize {
    match profile {
        Profile::Full => 8,
        Profile::Cpu => 1,
    }
}

/// The UNet configuration of a profile (MuseTalk's `musetalk.json` at `Full`).
pub fn config(profile: Profile) -> UNet2DConditionModelConfig {
    let ch = block_channels(profile);
    let heads = attention_heads(profile);
    let blk = |c: usize, attn: bool| BlockConfig {
        out_channels: c,
        use_cross_attn: attn.then_some(1),
        attention_head_dim: heads,
    };
    UNet2DConditionModelConfig {
        center_input_sample: false,
        flip_sin_to_cos: true,
        freq_shift: 0.0,
        blocks: vec![blk(ch[0], true), blk(ch[1], true), blk(ch[2], true), blk(ch[3], false)],
        layers_per_block: 2,
        downsample_padding: 1,
        mid_block_scale_factor: 1.0,
        norm_num_groups: 32,
        norm_eps: 1e-5,
        cross_attention_dim: audio_dim(profile),
        sliced_attention_size: None,
        use_linear_projection: false,
    }
}

fn build(vb: VarBuilder, profile: Profile) -> candle_core::Result<UNet2DConditionModel> {
    UNet2DConditionModel::new(vb, IN_CHANNELS, OUT_CHANNELS, false, config(profile))
}

/// Expected diffusers state-dict table.
pub fn param_table(profile: Profile) -> Result<ParamTable> {
    weights::record_table(|vb| build(vb, profile))
}

/// Residual-branch outputs (resnet conv2, attention out, feed-forward out, proj_out) scaled 0.2.
fn init_rule(name: &str, shape: &[usize]) -> Init {
    let he = (2.0 / fan_in(shape) as f32).sqrt();
    if name.ends_with("conv2.weight")
        || name.ends_with("to_out.0.weight")
        || name.ends_with("ff.net.2.weight")
        || name.ends_with("proj_out.weight")
    {
        Init::Normal(0.2 * he)
    } else if name == "conv_out.weight" {
        Init::Normal((1.0 / fan_in(shape) as f32).sqrt())
    } else {
        default_init(name, shape)
    }
}

/// Accepts diffusers keys, optionally prefixed `unet.`.
pub(crate) fn normalize(key: &str) -> Option<String> {
    Some(key.strip_prefix("unet.").unwrap_or(key).to_string())
}

pub(crate) fn synthetic_weights(profile: Profile, seed: u64) -> Result<HashMap<String, Tensor>> {
    let table = param_table(profile)?;
    weights::synthetic_tensors(&table, seed, &init_rule, &Device::Cpu)
}

/// MuseTalk's positional encoding table (seq_len, d): pe[p, 2i] = sin(p * w_i),
/// pe[p, 2i+1] = cos(p * w_i), w_i = exp(-2i * ln(10000) / d).
pub fn positional_encoding(seq_len: usize, d: usize) -> Vec<f32> {
    let mut pe = vec![0f32; seq_len * d];
    for p in 0..seq_len {
        for i in (0..d).step_by(2) {
            let w = (-(i as f64) * (10000f64).ln() / d as f64).exp();
            let a = p as f64 * w;
            pe[p * d + i] = a.sin() as f32;
            if i + 1 < d {
                pe[p * d + i + 1] = a.cos() as f32;
            }
        }
    }
    pe
}

/// FLOPs of one frame at 32x32 latents with a 50-token audio context.
fn unet_flops(table: &ParamTable) -> f64 {
    let n = 4usize;
    let top = LATENT_HW as f64;
    let px = |r: f64| r * r;
    let low = top / 2f64.powi(n as i32 - 1);
    let positions = |name: &str| -> Option<f64> {
        if name.contains("time_embedding") || name.contains("time_emb_proj") {
            return Some(1.0);
        }
        if name.contains("attn2.to_k") || name.contains("attn2.to_v") {
            return Some(AUDIO_TOKENS as f64);
        }
        if name.starts_with("conv_in") || name.starts_with("conv_out") {
            return Some(px(top));
        }
        if name.starts_with("mid_block") {
            return Some(px(low));
        }
        if name.starts_with("down_blocks.") {
            let i = index_after(name, "down_blocks.")?;
            let r = top / 2f64.powi(i as i32);
            return Some(if name.contains("downsamplers") { px(r / 2.0) } else { px(r) });
        }
        if name.starts_with("up_blocks.") {
            let i = index_after(name, "up_blocks.")?;
            let r = low * 2f64.powi(i as i32);
            return Some(if name.contains("upsamplers") { px(r * 2.0) } else { px(r) });
        }
        None
    };
    let mut f = weight_flops(table, positions);
    for e in &table.entries {
        if e.name.ends_with("attn1.to_q.weight") || e.name.ends_with("attn2.to_q.weight") {
            let t = positions(&e.name).unwrap_or(0.0);
            let kv = if e.name.contains("attn1") { t } else { AUDIO_TOKENS as f64 };
            f += attention_flops(t, kv, e.shape[0] as f64);
        }
    }
    f
}

/// MuseTalk UNet engine.
pub struct MuseTalkUnet {
    info: EngineInfo,
    forward: Forward,
    device: Device,
}

/// What runs the network, each with the positional-encoding table in the form it adds: cadence's
/// CPU path on the CPU (the candle model is built once to check the weights, then dropped, so the
/// weights are held once), candle elsewhere.
// One per loaded model: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Forward {
    Cpu { net: UnetCpu, pe: Vec<f32> },
    Candle { net: UNet2DConditionModel, pe: Tensor },
}

impl MuseTalkUnet {
    pub fn new(profile: Profile, weights: &WeightsSource, device: &Device) -> Result<MuseTalkUnet> {
        let table = param_table(profile)?;
        let tensors = crate::obtain_tensors(ModelKind::MuseTalkUnet, profile, &table, weights, &init_rule, device)?;
        let fast = if device.is_cpu() { Some(UnetCpu::for_profile(&tensors, profile)?) } else { None };
        let unet = weights::build_from_tensors(tensors, device, "musetalk-unet", |vb| build(vb, profile))?;
        let runtime = if fast.is_some() { Runtime::CpuKernels } else { Runtime::Candle };
        let dim = audio_dim(profile);
        let pe = positional_encoding(AUDIO_TOKENS, dim);
        let forward = match fast {
            Some(net) => Forward::Cpu { net, pe },
            None => Forward::Candle { net: unet, pe: Tensor::from_vec(pe, (1, AUDIO_TOKENS, dim), device)? },
        };
        Ok(MuseTalkUnet {
            info: EngineInfo {
                model: ModelKind::MuseTalkUnet,
                profile,
                weights: weights.label(),
                num_params: table.num_params(),
                flops_per_frame: unet_flops(&table),
                runtime,
            },
            forward,
            device: device.clone(),
        })
    }

    fn check(&self, latents: &Batch, audio: &Batch) -> Result<()> {
        latents.expect("MuseTalk UNet latents", &LATENTS_DIMS)?;
        audio.expect("MuseTalk UNet audio", &[Some(latents.batch_size()), Some(AUDIO_TOKENS), Some(self.audio_dim())])
    }
}

const LATENTS_DIMS: [Option<usize>; 4] = [None, Some(8), Some(LATENT_HW), Some(LATENT_HW)];

impl Engine for MuseTalkUnet {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
}

impl KeyframeModel for MuseTalkUnet {
    fn audio_dim(&self) -> usize {
        audio_dim(self.info.profile)
    }

    fn predict(&self, latents: &Batch, audio: &Batch) -> Result<Batch> {
        self.check(latents, audio)?;
        let Forward::Cpu { net, pe } = &self.forward else {
            let out = self.predict_tensor(&latents.to_tensor(&self.device)?, &audio.to_tensor(&self.device)?)?;
            return Batch::from_tensor(&out);
        };
        let b = latents.batch_size();
        let mut context = audio.data.clone();
        context.chunks_mut(pe.len()).for_each(|w| w.iter_mut().zip(pe).for_each(|(a, p)| *a += p));
        let out = net.forward(&latents.data, b, (LATENT_HW, LATENT_HW), &context);
        Batch::new(vec![b, 4, LATENT_HW, LATENT_HW], out)
    }

    /// With candle (on a GPU) the tensors never leave the device.
    fn predict_tensor(&self, latents: &Tensor, audio: &Tensor) -> Result<Tensor> {
        let Forward::Candle { net, pe } = &self.forward else {
            return crate::predict_through_host(self, latents, audio);
        };
        crate::expect_tensor("MuseTalk UNet latents", latents, &LATENTS_DIMS, &self.device)?;
        let dims = [Some(latents.dim(0)?), Some(AUDIO_TOKENS), Some(self.audio_dim())];
        crate::expect_tensor("MuseTalk UNet audio", audio, &dims, &self.device)?;
        Ok(net.forward(latents, 0.0, &audio.broadcast_add(pe)?)?)
    }
}

/// FLOPs per frame of the full-size UNet (for engines that do not build the candle model).
pub fn full_flops_per_frame() -> f64 {
    param_table(Profile::Full).map(|t| unet_flops(&t)).unwrap_or(0.0)
}
