//! LivePortrait's MotionExtractor (`src/modules/motion_extractor.py`, backbone
//! `convnextv2.py`), Ditto's `motion_extractor.pth`: an image (1, 3, 256, 256) in [0, 1] -> head
//! pose bins, translation, expression, scale and canonical keypoints. Run per source image (and
//! per driving frame for a video source).
//!
//! ConvNeXtV2-tiny under `detector.`: stem `downsample_layers.0` = conv 4x4 stride 4 + LayerNorm;
//! `downsample_layers.1..3` = LayerNorm + conv 2x2 stride 2; stages of [3, 3, 9, 3] blocks at
//! widths [96, 192, 384, 768]. Block: depthwise conv 7x7 (`dwconv`), LayerNorm (`norm`),
//! `pwconv1` Linear d->4d, exact GELU, GRN (`grn.gamma`, `grn.beta`: x + γ·(x·N) + β with N the
//! per-channel L2 norm over the pixels divided by its mean over channels + 1e-6), `pwconv2`
//! Linear 4d->d, + input (no layer scale, no drop path in eval). Every LayerNorm has eps 1e-6
//! (the channels-first ones normalise each pixel over its channels, which on channels-last data
//! is the ordinary one). Head: mean over the pixels, `norm` LayerNorm(768), then `fc_pitch`,
//! `fc_yaw`, `fc_roll` (66 bins), `fc_t` (3), `fc_exp` (63), `fc_scale` (1), `fc_kp` (63).
//!
//! The strided convolutions have stride = kernel, so they are a patch gather and one GEMM.

use crate::conv::Nhwc;
use crate::ditto::{Params, TableBuilder};
use crate::unet::cpu::Linear;
use crate::weights::ParamTable;
use crate::whisper::cpu::gelu_erf;
use crate::{EngineError, Result, WeightsSource};
use rayon::prelude::*;

const LN_EPS: f32 = 1e-6;
const D: &str = "detector";
/// The heads in the ONNX export's output order.
pub const HEADS: [&str; 7] = ["pitch", "yaw", "roll", "t", "exp", "scale", "kp"];

/// Sizes of the extractor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MotionConfig {
    pub depths: [usize; 4],
    pub dims: [usize; 4],
    pub num_kp: usize,
    pub num_bins: usize,
}

impl Default for MotionConfig {
    /// ConvNeXtV2-tiny with Ditto's 21 keypoints and 66 bins.
    fn default() -> Self {
        MotionConfig { depths: [3, 3, 9, 3], dims: [96, 192, 384, 768], num_kp: 21, num_bins: 66 }
    }
}

impl MotionConfig {
    fn head_size(&self, head: &str) -> usize {
        match head {
            "pitch" | "yaw" | "roll" => self.num_bins,
            "t" => 3,
            "scale" => 1,
            _ => 3 * self.num_kp,
        }
    }

    /// The state dict of `MotionExtractor` (all under `detector.`).
    pub fn param_table(&self) -> ParamTable {
        let mut t = TableBuilder::default();
        let ln = |t: &mut TableBuilder, p: String, c: usize| {
            t.add(format!("{p}.weight"), &[c]);
            t.add(format!("{p}.bias"), &[c]);
        };
        let dims = self.dims;
        t.conv(&format!("{D}.downsample_layers.0.0"), dims[0], 3, &[4, 4], true);
        ln(&mut t, format!("{D}.downsample_layers.0.1"), dims[0]);
        for i in 1..4 {
            ln(&mut t, format!("{D}.downsample_layers.{i}.0"), dims[i - 1]);
            t.conv(&format!("{D}.downsample_layers.{i}.1"), dims[i], dims[i - 1], &[2, 2], true);
        }
        for (i, (&depth, &d)) in self.depths.iter().zip(&dims).enumerate() {
            for j in 0..depth {
                let b = format!("{D}.stages.{i}.{j}");
                t.conv(&format!("{b}.dwconv"), d, 1, &[7, 7], true);
                ln(&mut t, format!("{b}.norm"), d);
                t.add(format!("{b}.pwconv1.weight"), &[4 * d, d]);
                t.add(format!("{b}.pwconv1.bias"), &[4 * d]);
                t.add(format!("{b}.grn.gamma"), &[1, 1, 1, 4 * d]);
                t.add(format!("{b}.grn.beta"), &[1, 1, 1, 4 * d]);
                t.add(format!("{b}.pwconv2.weight"), &[d, 4 * d]);
                t.add(format!("{b}.pwconv2.bias"), &[d]);
            }
        }
        ln(&mut t, format!("{D}.norm"), dims[3]);
        for h in ["kp", "scale", "pitch", "yaw", "roll", "t", "exp"] {
            t.add(format!("{D}.fc_{h}.weight"), &[self.head_size(h), dims[3]]);
            t.add(format!("{D}.fc_{h}.bias"), &[self.head_size(h)]);
        }
        t.build()
    }

    /// Multiply-adds of one forward on an `h` x `w` image, from the layer shapes.
    pub fn macs(&self, h: usize, w: usize) -> f64 {
        let px = |i: usize| ((h >> (2 + i)) * (w >> (2 + i))) as f64;
        let d = self.dims;
        let mut m = px(0) * (48 * d[0]) as f64;
        for i in 0..4 {
            if i > 0 {
                m += px(i) * (4 * d[i - 1] * d[i]) as f64;
            }
            m += self.depths[i] as f64 * px(i) * (49 * d[i] + 8 * d[i] * d[i]) as f64;
        }
        m + HEADS.iter().map(|h| (self.head_size(h) * d[3]) as f64).sum::<f64>()
    }
}

/// Ditto's `motion_extractor.pth` and LivePortrait's `motion_extractor.pth`.
pub(crate) fn normalize(key: &str) -> Option<String> {
    Some(super::strip_module(key))
}

/// LayerNorm over the channels of each pixel (eps 1e-6), in f32 as PyTorch's.
struct Ln {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl Ln {
    fn load(p: &Params, prefix: &str) -> Result<Ln> {
        Ok(Ln { gamma: p.vec(&format!("{prefix}.weight"))?, beta: p.vec(&format!("{prefix}.bias"))? })
    }
    fn forward(&self, x: &mut [f32]) {
        let c = self.gamma.len();
        x.par_chunks_mut(c).for_each(|px| {
            let mean = px.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let var = px.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
            let inv = 1.0 / (var + LN_EPS as f64).sqrt();
            for (ch, v) in px.iter_mut().enumerate() {
                *v = ((*v as f64 - mean) * inv) as f32 * self.gamma[ch] + self.beta[ch];
            }
        });
    }
}

/// A conv with stride = kernel = k as a patch gather + GEMM (weights reordered to (ky, kx, ci)).
struct Patchify {
    k: usize,
    linear: Linear,
}

impl Patchify {
    fn load(p: &mut Params, prefix: &str) -> Result<Patchify> {
        let dims = p.dims(&format!("{prefix}.weight"))?;
        let (cout, cin, k) = (dims[0], dims[1], dims[2]);
        let w = p.vec(&format!("{prefix}.weight"))?;
        let mut r = vec![0f32; w.len()];
        for o in 0..cout {
            for i in 0..cin {
                for t in 0..k * k {
                    r[(o * k * k + t) * cin + i] = w[(o * cin + i) * k * k + t];
                }
            }
        }
        let name = format!("{prefix}.patch");
        p.put(format!("{name}.weight"), &[cout, k * k * cin], r)?;
        let b = p.vec(&format!("{prefix}.bias"))?;
        p.put(format!("{name}.bias"), &[cout], b)?;
        Ok(Patchify { k, linear: Linear::load(&p.weights(), &name, true)? })
    }
    fn forward(&self, x: &Nhwc) -> Nhwc {
        let (k, c) = (self.k, x.c);
        let (oh, ow) = (x.h / k, x.w / k);
        let mut patches = vec![0f32; oh * ow * k * k * c];
        patches.par_chunks_mut(k * k * c).enumerate().for_each(|(q, dst)| {
            let (oy, ox) = (q / ow, q % ow);
            for ky in 0..k {
                let s = ((oy * k + ky) * x.w + ox * k) * c;
                dst[ky * k * c..(ky + 1) * k * c].copy_from_slice(&x.data[s..s + k * c]);
            }
        });
        Nhwc { n: 1, h: oh, w: ow, c: self.linear.dout, data: self.linear.forward(&patches, None) }
    }
}

/// One ConvNeXtV2 block.
struct Block {
    /// Depthwise 7x7 weights as [ky·7 + kx][c], and bias.
    dw: Vec<f32>,
    dw_bias: Vec<f32>,
    norm: Ln,
    pw1: Linear,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    pw2: Linear,
}

impl Block {
    fn load(p: &Params, b: &str) -> Result<Block> {
        let w = p.vec(&format!("{b}.dwconv.weight"))?;
        let c = w.len() / 49;
        let mut dw = vec![0f32; w.len()];
        for ch in 0..c {
            for t in 0..49 {
                dw[t * c + ch] = w[ch * 49 + t];
            }
        }
        let ws = p.weights();
        Ok(Block {
            dw,
            dw_bias: p.vec(&format!("{b}.dwconv.bias"))?,
            norm: Ln::load(p, &format!("{b}.norm"))?,
            pw1: Linear::load(&ws, &format!("{b}.pwconv1"), true)?,
            gamma: p.vec(&format!("{b}.grn.gamma"))?,
            beta: p.vec(&format!("{b}.grn.beta"))?,
            pw2: Linear::load(&ws, &format!("{b}.pwconv2"), true)?,
        })
    }

    fn forward(&self, x: &Nhwc) -> Nhwc {
        let (h, w, c) = (x.h, x.w, x.c);
        // Depthwise 7x7, padding 3, per output row.
        let mut y = vec![0f32; x.data.len()];
        y.par_chunks_mut(w * c).enumerate().for_each(|(oy, row)| {
            for ox in 0..w {
                let acc = &mut row[ox * c..(ox + 1) * c];
                acc.copy_from_slice(&self.dw_bias);
                for ky in 0..7 {
                    let iy = oy as isize + ky as isize - 3;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for kx in 0..7 {
                        let ix = ox as isize + kx as isize - 3;
                        if ix < 0 || ix >= w as isize {
                            continue;
                        }
                        let src = &x.data[(iy as usize * w + ix as usize) * c..][..c];
                        let wt = &self.dw[(ky * 7 + kx) * c..][..c];
                        acc.iter_mut().zip(src.iter().zip(wt)).for_each(|(a, (s, k))| *a += s * k);
                    }
                }
            }
        });
        self.norm.forward(&mut y);
        let mut hdn = self.pw1.forward(&y, None);
        hdn.par_iter_mut().for_each(|v| *v = gelu_erf(*v));
        // GRN: per-channel L2 norm over the pixels, divided by its mean over channels.
        let c4 = self.pw1.dout;
        let sq = hdn
            .par_chunks(c4 * 64)
            .map(|rows| {
                let mut s = vec![0f64; c4];
                rows.chunks_exact(c4).for_each(|px| s.iter_mut().zip(px).for_each(|(a, v)| *a += (*v as f64).powi(2)));
                s
            })
            .reduce(|| vec![0f64; c4], |a, b| a.iter().zip(&b).map(|(a, b)| a + b).collect());
        let g: Vec<f64> = sq.iter().map(|s| s.sqrt()).collect();
        let gm = g.iter().sum::<f64>() / c4 as f64;
        let nx: Vec<f32> = g.iter().map(|v| (v / (gm + 1e-6)) as f32).collect();
        hdn.par_chunks_mut(c4).for_each(|px| {
            for (ch, v) in px.iter_mut().enumerate() {
                *v = self.gamma[ch] * (*v * nx[ch]) + self.beta[ch] + *v;
            }
        });
        Nhwc { data: self.pw2.forward(&hdn, Some(&x.data)), ..*x }
    }
}

/// The motion extractor with its weights packed for the CPU path.
pub struct MotionExtractor {
    stem: Patchify,
    /// LayerNorm after the stem, then (LayerNorm, conv) for stages 1..3.
    stem_norm: Ln,
    downs: Vec<(Ln, Patchify)>,
    stages: Vec<Vec<Block>>,
    norm: Ln,
    heads: Vec<Linear>,
}

impl MotionExtractor {
    pub fn new(cfg: &MotionConfig, source: &WeightsSource) -> Result<MotionExtractor> {
        let mut p = Params::obtain(&cfg.param_table(), source, &normalize)?;
        let stem = Patchify::load(&mut p, &format!("{D}.downsample_layers.0.0"))?;
        let downs = (1..4)
            .map(|i| {
                let ln = Ln::load(&p, &format!("{D}.downsample_layers.{i}.0"))?;
                Ok((ln, Patchify::load(&mut p, &format!("{D}.downsample_layers.{i}.1"))?))
            })
            .collect::<Result<_>>()?;
        let stages = (0..4)
            .map(|i| (0..cfg.depths[i]).map(|j| Block::load(&p, &format!("{D}.stages.{i}.{j}"))).collect())
            .collect::<Result<_>>()?;
        let w = p.weights();
        Ok(MotionExtractor {
            stem,
            stem_norm: Ln::load(&p, &format!("{D}.downsample_layers.0.1"))?,
            downs,
            stages,
            norm: Ln::load(&p, &format!("{D}.norm"))?,
            heads: HEADS
                .iter()
                .map(|h| Linear::load(&w, &format!("{D}.fc_{h}"), true))
                .collect::<candle_core::Result<_>>()?,
        })
    }

    /// `image`: (1, 3, h, w) NCHW, h and w multiples of 32. Returns the raw head outputs in
    /// [`HEADS`] order: pitch, yaw, roll (bin logits), t, exp, scale, kp.
    pub fn forward(&self, image: &[f32], h: usize, w: usize) -> Result<Vec<Vec<f32>>> {
        if image.len() != 3 * h * w || h == 0 || w == 0 || !h.is_multiple_of(32) || !w.is_multiple_of(32) {
            return Err(EngineError::BadInput(format!(
                "motion extractor: {} values for a (1, 3, {h}, {w}) image (sides multiples of 32)",
                image.len()
            )));
        }
        let mut x = self.stem.forward(&Nhwc::from_nchw(1, 3, h, w, image));
        self.stem_norm.forward(&mut x.data);
        for (i, stage) in self.stages.iter().enumerate() {
            if i > 0 {
                let (ln, conv) = &self.downs[i - 1];
                ln.forward(&mut x.data);
                x = conv.forward(&x);
            }
            for b in stage {
                x = b.forward(&x);
            }
        }
        let px = (x.h * x.w) as f64;
        let mut pooled: Vec<f32> = (0..x.c)
            .map(|ch| (x.data.iter().skip(ch).step_by(x.c).map(|&v| v as f64).sum::<f64>() / px) as f32)
            .collect();
        self.norm.forward(&mut pooled);
        Ok(self.heads.iter().map(|l| l.forward(&pooled, None)).collect())
    }
}
