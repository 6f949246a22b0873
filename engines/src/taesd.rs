//! TAESD (madebyollin/taesd), decoder and encoder.
//!
//! Hand-written on candle ops because candle-transformers has no TAESD. The layer list mirrors
//! the original `nn.Sequential` exactly, so the original state-dict keys load unchanged:
//!
//! decoder: `0` Clamp (tanh(x/3)*3), `1` conv 4->C, `2` ReLU, `3..5` Block, `6` Upsample x2,
//! `7` conv (no bias), `8..10` Block, `11` Upsample, `12` conv (no bias), `13..15` Block,
//! `16` Upsample, `17` conv (no bias), `18` Block, `19` conv C->3.
//!
//! encoder: `0` conv 3->C, `1` Block, `2` conv stride 2 (no bias), `3..5` Block, `6` conv s2,
//! `7..9` Block, `10` conv s2, `11..13` Block, `14` conv C->4.
//!
//! Block(C): conv3x3, ReLU, conv3x3, ReLU, conv3x3 (keys `N.conv.0`, `N.conv.2`, `N.conv.4`), add
//! the input, ReLU. All convs are 3x3 with padding 1. C = 64 at [`Profile::Full`] (1,222,531
//! decoder parameters, 1,222,532 encoder parameters), 16 at [`Profile::Cpu`].

use crate::conv::{self, Nhwc, PackedConv};
use crate::weights::{self, default_init, fan_in, Init, ParamTable};
use crate::{
    Batch, Device, Engine, EngineError, EngineInfo, ImageEncoder, LatentDecoder, ModelKind, Profile, Result, Runtime,
    ScaleArm, WeightsSource,
};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;

/// Channel width of a profile on this machine's scale arm.
pub fn channels(profile: Profile) -> usize {
    channels_at(profile, ScaleArm::current())
}

/// [`channels`] on machines of `arm`: at `Cpu` 10 on the AVX-512 arm and 8 on the FMA arm, where
/// the full TAESD costs fewer UNet evaluations (the scale model: [`ScaleArm`], docs/profiles.md).
pub fn channels_at(profile: Profile, arm: ScaleArm) -> usize {
    match (profile, arm) {
        (Profile::Full, _) => 64,
        (Profile::Cpu, ScaleArm::Avx512) => 10,
        (Profile::Cpu, ScaleArm::Fma) => 8,
    }
}

/// One 3x3 convolution (padding 1).
#[derive(Debug, Clone)]
pub(crate) struct Conv3x3 {
    w: Tensor,
    /// Bias reshaped to (1, C, 1, 1) for broadcasting.
    b: Option<Tensor>,
    stride: usize,
}

impl Conv3x3 {
    fn load(
        vb: &VarBuilder,
        key: &str,
        cin: usize,
        cout: usize,
        bias: bool,
        stride: usize,
    ) -> candle_core::Result<Self> {
        let w = vb.get((cout, cin, 3, 3), &format!("{key}.weight"))?;
        let b = if bias { Some(vb.get(cout, &format!("{key}.bias"))?.reshape((1, cout, 1, 1))?) } else { None };
        Ok(Conv3x3 { w, b, stride })
    }
    fn flops(&self, out_h: usize, out_w: usize) -> f64 {
        2.0 * self.w.elem_count() as f64 * (out_h * out_w) as f64
    }
}

impl Module for Conv3x3 {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = x.conv2d(&self.w, 1, self.stride, 1, 1)?;
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// TAESD residual block.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    c0: Conv3x3,
    c2: Conv3x3,
    c4: Conv3x3,
}

impl Block {
    fn load(vb: &VarBuilder, idx: usize, c: usize) -> candle_core::Result<Self> {
        Ok(Block {
            c0: Conv3x3::load(vb, &format!("{idx}.conv.0"), c, c, true, 1)?,
            c2: Conv3x3::load(vb, &format!("{idx}.conv.2"), c, c, true, 1)?,
            c4: Conv3x3::load(vb, &format!("{idx}.conv.4"), c, c, true, 1)?,
        })
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.c0.forward(x)?.relu()?;
        let h = self.c2.forward(&h)?.relu()?;
        let h = self.c4.forward(&h)?;
        (h + x)?.relu()
    }
}

/// tanh(x / 3) * 3, TAESD's latent clamp.
pub(crate) fn clamp(x: &Tensor) -> candle_core::Result<Tensor> {
    (x / 3.0)?.tanh()? * 3.0
}

/// Nearest-neighbour x2 upsampling.
pub(crate) fn upsample2(x: &Tensor) -> candle_core::Result<Tensor> {
    let (_, _, h, w) = x.dims4()?;
    x.upsample_nearest2d(2 * h, 2 * w)
}

#[derive(Debug, Clone)]
enum Layer {
    Clamp,
    Conv(Conv3x3),
    Relu,
    Block(Block),
    Upsample,
}

/// Layer plan: (kind, conv in/out, bias, stride) per sequence index.
#[derive(Clone, Copy)]
enum Plan {
    Clamp,
    Conv { cin: usize, cout: usize, bias: bool, stride: usize },
    Relu,
    Block,
    Up,
}

fn plan(kind: ModelKind, c: usize) -> Vec<Plan> {
    use Plan::*;
    let conv = |cin, cout, bias, stride| Conv { cin, cout, bias, stride };
    match kind {
        ModelKind::TaesdDecoder => vec![
            Clamp,
            conv(4, c, true, 1),
            Relu,
            Block,
            Block,
            Block,
            Up,
            conv(c, c, false, 1),
            Block,
            Block,
            Block,
            Up,
            conv(c, c, false, 1),
            Block,
            Block,
            Block,
            Up,
            conv(c, c, false, 1),
            Block,
            conv(c, 3, true, 1),
        ],
        _ => vec![
            conv(3, c, true, 1),
            Block,
            conv(c, c, false, 2),
            Block,
            Block,
            Block,
            conv(c, c, false, 2),
            Block,
            Block,
            Block,
            conv(c, c, false, 2),
            Block,
            Block,
            Block,
            conv(c, 4, true, 1),
        ],
    }
}

fn build_layers(vb: &VarBuilder, kind: ModelKind, c: usize) -> candle_core::Result<Vec<Layer>> {
    plan(kind, c)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            Ok(match p {
                Plan::Clamp => Layer::Clamp,
                Plan::Relu => Layer::Relu,
                Plan::Up => Layer::Upsample,
                Plan::Block => Layer::Block(Block::load(vb, i, c)?),
                Plan::Conv { cin, cout, bias, stride } => {
                    Layer::Conv(Conv3x3::load(vb, &i.to_string(), cin, cout, bias, stride)?)
                }
            })
        })
        .collect()
}

fn check_kind(kind: ModelKind) -> Result<()> {
    match kind {
        ModelKind::TaesdDecoder | ModelKind::TaesdEncoder => Ok(()),
        other => Err(EngineError::BadInput(format!("{other} is not a TAESD model"))),
    }
}

/// Expected state-dict table of the TAESD decoder or encoder.
pub fn param_table(kind: ModelKind, profile: Profile) -> Result<ParamTable> {
    check_kind(kind)?;
    weights::record_table(|vb| build_layers(&vb, kind, channels(profile)))
}

/// Synthetic init: He-normal convs; the last conv of each Block scaled by 0.2 so the residual
/// stream stays O(1) through 10 blocks; the output conv small (decoder: bias 0.5 so images sit
/// around mid-grey in [0,1]; encoder: LeCun gain so latents are O(1)).
fn init_rule(kind: ModelKind) -> impl Fn(&str, &[usize]) -> Init {
    let last = if kind == ModelKind::TaesdDecoder { "19" } else { "14" };
    move |name: &str, shape: &[usize]| {
        let he = (2.0 / fan_in(shape) as f32).sqrt();
        if name.ends_with(".conv.4.weight") {
            Init::Normal(0.2 * he)
        } else if name == format!("{last}.weight") {
            let gain = if kind == ModelKind::TaesdDecoder { 0.1 } else { 0.7 };
            Init::Normal(gain * he)
        } else if kind == ModelKind::TaesdDecoder && name == format!("{last}.bias") {
            Init::Const(0.5)
        } else {
            default_init(name, shape)
        }
    }
}

/// Accepts the original keys, optionally prefixed `decoder.`/`encoder.` or `first_stage_model.`.
pub(crate) fn normalize(key: &str) -> Option<String> {
    let k = key.strip_prefix("first_stage_model.").unwrap_or(key);
    let k = k.strip_prefix("decoder.").or_else(|| k.strip_prefix("encoder.")).unwrap_or(k);
    Some(k.to_string())
}

pub(crate) fn synthetic_weights(kind: ModelKind, profile: Profile, seed: u64) -> Result<HashMap<String, Tensor>> {
    let table = param_table(kind, profile)?;
    weights::synthetic_tensors(&table, seed, &init_rule(kind), &Device::Cpu)
}

/// One step of the CPU fast path (see [`crate::conv`]).
#[derive(Debug, Clone)]
enum FastOp {
    Clamp,
    Conv { conv: PackedConv, upsample: bool, relu: bool },
    Block([PackedConv; 3]),
}

fn pack(c: &Conv3x3) -> candle_core::Result<PackedConv> {
    let (co, ci, _, _) = c.w.dims4()?;
    let w = c.w.flatten_all()?.to_vec1::<f32>()?;
    let b = c.b.as_ref().map(|b| b.flatten_all()?.to_vec1::<f32>()).transpose()?;
    Ok(PackedConv::new(co, ci, &w, b, c.stride))
}

/// Folds ReLU into the preceding conv and Upsample into the following conv.
fn fast_plan(layers: &[Layer]) -> candle_core::Result<Vec<FastOp>> {
    let mut ops = Vec::new();
    let mut up = false;
    for (i, l) in layers.iter().enumerate() {
        match l {
            Layer::Clamp => ops.push(FastOp::Clamp),
            Layer::Upsample => up = true,
            Layer::Relu => {} // folded below
            Layer::Conv(c) => {
                let relu = matches!(layers.get(i + 1), Some(Layer::Relu));
                ops.push(FastOp::Conv { conv: pack(c)?, upsample: up, relu });
                up = false;
            }
            Layer::Block(b) => {
                if up {
                    candle_core::bail!("TAESD plan: upsample must be followed by a conv");
                }
                ops.push(FastOp::Block([pack(&b.c0)?, pack(&b.c2)?, pack(&b.c4)?]));
            }
        }
    }
    Ok(ops)
}

/// TAESD decoder or encoder.
#[derive(Debug)]
pub struct Taesd {
    info: EngineInfo,
    layers: Vec<Layer>,
    /// CPU fast path (None on other devices, which use the candle layers).
    fast: Option<Vec<FastOp>>,
    device: Device,
}

impl Taesd {
    /// TAESD decoder: (B,4,h,w) -> (B,3,8h,8w).
    pub fn decoder(profile: Profile, weights: &WeightsSource, device: &Device) -> Result<Taesd> {
        Self::new(ModelKind::TaesdDecoder, profile, weights, device)
    }
    /// TAESD encoder: (B,3,H,W) in `[0,1]` -> (B,4,H/8,W/8).
    pub fn encoder(profile: Profile, weights: &WeightsSource, device: &Device) -> Result<Taesd> {
        Self::new(ModelKind::TaesdEncoder, profile, weights, device)
    }
    fn new(kind: ModelKind, profile: Profile, weights: &WeightsSource, device: &Device) -> Result<Taesd> {
        let table = param_table(kind, profile)?;
        let tensors = crate::obtain_tensors(kind, profile, &table, weights, &init_rule(kind), device)?;
        let c = channels(profile);
        let layers = weights::build_from_tensors(tensors, device, kind.name(), |vb| build_layers(&vb, kind, c))?;
        let fast = if device.is_cpu() { Some(fast_plan(&layers)?) } else { None };
        let mut taesd = Taesd {
            info: EngineInfo {
                model: kind,
                profile,
                weights: weights.label(),
                num_params: table.num_params(),
                flops_per_frame: 0.0,
                runtime: if fast.is_some() { Runtime::CpuKernels } else { Runtime::Candle },
            },
            layers,
            fast,
            device: device.clone(),
        };
        // Per frame at MuseTalk's sizes: a 32x32 latent in, or a 256x256 crop in.
        taesd.info.flops_per_frame = match kind {
            ModelKind::TaesdDecoder => taesd.flops_for(32, 32),
            _ => taesd.flops_for(256, 256),
        };
        Ok(taesd)
    }

    /// The same network through candle's layers (used on CUDA; on the CPU it is the reference the
    /// fast path is tested against).
    pub fn forward_candle(&self, x: &Batch) -> Result<Batch> {
        let t = x.to_tensor(&self.device)?;
        Batch::from_tensor(&self.forward(&t)?)
    }

    fn forward_fast(ops: &[FastOp], x: &Batch) -> Batch {
        let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let mut a = Nhwc::from_nchw(n, c, h, w, &x.data);
        for op in ops {
            a = match op {
                FastOp::Clamp => {
                    a.data.iter_mut().for_each(|v| *v = (*v / 3.0).tanh() * 3.0);
                    a
                }
                FastOp::Conv { conv, upsample, relu } => conv::conv3x3(&a, conv, *upsample, None, *relu),
                FastOp::Block([c0, c2, c4]) => {
                    let h = conv::conv3x3(&a, c0, false, None, true);
                    let h = conv::conv3x3(&h, c2, false, None, true);
                    conv::conv3x3(&h, c4, false, Some(&a), true)
                }
            };
        }
        Batch { shape: vec![a.n, a.c, a.h, a.w], data: a.to_nchw() }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = x.clone();
        for l in &self.layers {
            x = match l {
                Layer::Clamp => clamp(&x)?,
                Layer::Conv(c) => c.forward(&x)?,
                Layer::Relu => x.relu()?,
                Layer::Block(b) => b.forward(&x)?,
                Layer::Upsample => upsample2(&x)?,
            };
        }
        Ok(x)
    }

    /// FLOPs of one batch element with an input of spatial size (h, w).
    pub fn flops_for(&self, h: usize, w: usize) -> f64 {
        let (mut h, mut w) = (h, w);
        let mut total = 0.0;
        let conv_flops = |c: &Conv3x3, h: &mut usize, w: &mut usize| {
            if c.stride == 2 {
                *h = h.div_ceil(2);
                *w = w.div_ceil(2);
            }
            c.flops(*h, *w)
        };
        for l in &self.layers {
            match l {
                Layer::Conv(c) => total += conv_flops(c, &mut h, &mut w),
                Layer::Block(b) => {
                    for c in [&b.c0, &b.c2, &b.c4] {
                        total += conv_flops(c, &mut h, &mut w);
                    }
                }
                Layer::Upsample => {
                    h *= 2;
                    w *= 2;
                }
                _ => {}
            }
        }
        total
    }

    fn run(&self, x: &Batch) -> Result<Batch> {
        match &self.fast {
            Some(ops) => Ok(Self::forward_fast(ops, x)),
            None => self.forward_candle(x),
        }
    }
}

impl Engine for Taesd {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
}

impl LatentDecoder for Taesd {
    fn decode(&self, latents: &Batch) -> Result<Batch> {
        if self.info.model != ModelKind::TaesdDecoder {
            return Err(EngineError::BadInput("this TAESD engine is an encoder; use encode()".into()));
        }
        latents.expect("TAESD decoder input", &[None, Some(4), None, None])?;
        self.run(latents)
    }
    /// With candle (on a GPU) the tensors never leave the device.
    fn decode_tensor(&self, latents: &Tensor) -> Result<Tensor> {
        if self.fast.is_some() {
            return crate::decode_through_host(self, latents);
        }
        if self.info.model != ModelKind::TaesdDecoder {
            return Err(EngineError::BadInput("this TAESD engine is an encoder; use encode()".into()));
        }
        crate::expect_tensor("TAESD decoder input", latents, &[None, Some(4), None, None], &self.device)?;
        Ok(self.forward(latents)?)
    }
    fn output_range(&self) -> (f32, f32) {
        (0.0, 1.0)
    }
}

impl ImageEncoder for Taesd {
    fn encode(&self, images: &Batch) -> Result<Batch> {
        if self.info.model != ModelKind::TaesdEncoder {
            return Err(EngineError::BadInput("this TAESD engine is a decoder; use decode()".into()));
        }
        images.expect("TAESD encoder input", &[None, Some(3), None, None])?;
        if !images.shape[2].is_multiple_of(8) || !images.shape[3].is_multiple_of(8) {
            return Err(EngineError::BadInput(format!(
                "TAESD encoder: H and W must be multiples of 8, got {:?}",
                images.shape
            )));
        }
        self.run(images)
    }
    fn input_range(&self) -> (f32, f32) {
        (0.0, 1.0)
    }
}

/// The layer operations used by [`Taesd`], on host buffers, for known-answer tests.
pub mod ops {
    use super::*;

    fn t(b: &Batch) -> Result<Tensor> {
        b.to_tensor(&Device::Cpu)
    }

    /// 3x3 convolution, padding 1: x (B,Ci,H,W), w (Co,Ci,3,3), b (Co).
    pub fn conv3x3(x: &Batch, w: &Batch, b: Option<&Batch>, stride: usize) -> Result<Batch> {
        let co = w.shape[0];
        let b = match b {
            Some(b) => Some(t(b)?.reshape((1, co, 1, 1))?),
            None => None,
        };
        let conv = Conv3x3 { w: t(w)?, b, stride };
        Batch::from_tensor(&conv.forward(&t(x)?)?)
    }
    /// The CPU fast path's conv3x3 (NHWC, packed weights, fused epilogue), optionally with the
    /// nearest x2 upsampling folded in, ReLU applied if `relu`.
    pub fn conv3x3_fast(
        x: &Batch,
        w: &Batch,
        b: Option<&Batch>,
        stride: usize,
        upsample: bool,
        relu: bool,
    ) -> Result<Batch> {
        let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let p = PackedConv::new(w.shape[0], w.shape[1], &w.data, b.map(|b| b.data.clone()), stride);
        let y = conv::conv3x3(&Nhwc::from_nchw(n, c, h, wd, &x.data), &p, upsample, None, relu);
        Ok(Batch { shape: vec![y.n, y.c, y.h, y.w], data: y.to_nchw() })
    }
    /// The CPU fast path's Block (three fused convs, residual in the last epilogue).
    pub fn block_fast(x: &Batch, w: [&Batch; 3], b: [&Batch; 3]) -> Result<Batch> {
        let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let pk = |i: usize| PackedConv::new(w[i].shape[0], w[i].shape[1], &w[i].data, Some(b[i].data.clone()), 1);
        let op = FastOp::Block([pk(0), pk(1), pk(2)]);
        let _ = (n, c, h, wd);
        Ok(Taesd::forward_fast(std::slice::from_ref(&op), x))
    }
    /// The CPU fast path's NHWC nearest x2 upsampling.
    pub fn upsample_nearest2_fast(x: &Batch) -> Result<Batch> {
        let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let y = conv::upsample2(&Nhwc::from_nchw(n, c, h, wd, &x.data));
        Ok(Batch { shape: vec![y.n, y.c, y.h, y.w], data: y.to_nchw() })
    }
    /// Nearest x2 upsampling of (B,C,H,W).
    pub fn upsample_nearest2(x: &Batch) -> Result<Batch> {
        Batch::from_tensor(&upsample2(&t(x)?)?)
    }
    /// tanh(x/3)*3.
    pub fn tanh_clamp(x: &Batch) -> Result<Batch> {
        Batch::from_tensor(&clamp(&t(x)?)?)
    }
    /// TAESD Block with weights (w0,b0), (w2,b2), (w4,b4).
    pub fn block(x: &Batch, w: [&Batch; 3], b: [&Batch; 3]) -> Result<Batch> {
        let mk = |w: &Batch, b: &Batch| -> Result<Conv3x3> {
            let co = w.shape[0];
            Ok(Conv3x3 { w: t(w)?, b: Some(t(b)?.reshape((1, co, 1, 1))?), stride: 1 })
        };
        let blk = Block { c0: mk(w[0], b[0])?, c2: mk(w[1], b[1])?, c4: mk(w[2], b[2])? };
        Batch::from_tensor(&blk.forward(&t(x)?)?)
    }
}
