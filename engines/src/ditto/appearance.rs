//! LivePortrait's AppearanceFeatureExtractor (`src/modules/appearance_feature_extractor.py`),
//! Ditto's `appearance_extractor.pth`: the source image (1, 3, 256, 256) in [0, 1] -> the
//! appearance volume feature_3d (1, 32, 16, 64, 64) the warping network moves. Run once per
//! source image (per frame only for a video source).
//!
//! `first` = SameBlock2d 3->64 (conv3x3, BatchNorm2d, ReLU); `down_blocks.i` = DownBlock2d
//! (conv3x3, BatchNorm2d, ReLU, AvgPool2d 2) 64->128->256; `second` = conv1x1 256->512; the
//! result viewed as (32, 16, 64, 64) (channel c·16 + d); `resblocks_3d.3dr0..5` = ResBlock3d(32):
//! BatchNorm3d, ReLU, Conv3d 3³, BatchNorm3d, ReLU, Conv3d 3³, + input. The BatchNorms after a
//! convolution are folded into it; `norm1` of each ResBlock3d comes first (pre-activation), so
//! it stays a per-channel scale and shift, applied with its ReLU in one pass.
//! Cost: 32.0 GMAC ([`AppearanceConfig::macs`]), two thirds in the 3-D residual blocks.

use crate::conv::conv3d::{conv3d, Ndhwc, PackedConv3d};
use crate::conv::{conv3x3, PackedConv};
use crate::ditto::warp::{avg_pool_hw2, conv3d_from};
use crate::ditto::{Params, TableBuilder, BN_EPS};
use crate::unet::cpu::{conv, Linear};
use crate::weights::ParamTable;
use crate::{EngineError, Result, WeightsSource};
use rayon::prelude::*;

/// Sizes of the extractor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppearanceConfig {
    pub image_channels: usize,
    pub block_expansion: usize,
    pub num_down_blocks: usize,
    pub max_features: usize,
    /// The volume's channels and depth (max_features = channels · depth).
    pub reshape_channels: usize,
    pub reshape_depth: usize,
    pub num_resblocks: usize,
}

impl Default for AppearanceConfig {
    /// LivePortrait's `models.yaml` (and Ditto's defaults).
    fn default() -> Self {
        AppearanceConfig {
            image_channels: 3,
            block_expansion: 64,
            num_down_blocks: 2,
            max_features: 512,
            reshape_channels: 32,
            reshape_depth: 16,
            num_resblocks: 6,
        }
    }
}

impl AppearanceConfig {
    fn width(&self, i: usize) -> usize {
        self.max_features.min(self.block_expansion << i)
    }

    /// The state dict of `AppearanceFeatureExtractor` (`num_batches_tracked` left out).
    pub fn param_table(&self) -> ParamTable {
        let mut t = TableBuilder::default();
        t.conv("first.conv", self.block_expansion, self.image_channels, &[3, 3], true);
        t.batch_norm("first.norm", self.block_expansion);
        for i in 0..self.num_down_blocks {
            t.conv(&format!("down_blocks.{i}.conv"), self.width(i + 1), self.width(i), &[3, 3], true);
            t.batch_norm(&format!("down_blocks.{i}.norm"), self.width(i + 1));
        }
        t.conv("second", self.max_features, self.width(self.num_down_blocks), &[1, 1], true);
        let c = self.reshape_channels;
        for i in 0..self.num_resblocks {
            t.conv(&format!("resblocks_3d.3dr{i}.conv1"), c, c, &[3, 3, 3], true);
            t.conv(&format!("resblocks_3d.3dr{i}.conv2"), c, c, &[3, 3, 3], true);
            t.batch_norm(&format!("resblocks_3d.3dr{i}.norm1"), c);
            t.batch_norm(&format!("resblocks_3d.3dr{i}.norm2"), c);
        }
        t.build()
    }

    /// Multiply-adds of one forward on an `h` x `w` image, from the layer shapes.
    pub fn macs(&self, h: usize, w: usize) -> f64 {
        let px = |s: usize| ((h >> s) * (w >> s)) as f64;
        let mut m = px(0) * 9.0 * (self.image_channels * self.block_expansion) as f64;
        for i in 0..self.num_down_blocks {
            m += px(i) * 9.0 * (self.width(i) * self.width(i + 1)) as f64;
        }
        let s = self.num_down_blocks;
        let c = self.reshape_channels;
        m + px(s) * (self.width(s) * self.max_features) as f64
            + self.num_resblocks as f64 * 2.0 * px(s) * self.reshape_depth as f64 * 27.0 * (c * c) as f64
    }
}

/// Ditto's `appearance_extractor.pth` and LivePortrait's `appearance_feature_extractor.pth`.
pub(crate) fn normalize(key: &str) -> Option<String> {
    Some(super::strip_module(key))
}

/// ResBlock3d: the pre-activation norm as (scale, shift) per channel, conv1 with norm2 folded.
struct ResBlock {
    pre: Vec<(f32, f32)>,
    conv1: PackedConv3d,
    conv2: PackedConv3d,
}

/// The appearance feature extractor with its weights folded and packed for the CPU path.
pub struct AppearanceFeatureExtractor {
    cfg: AppearanceConfig,
    first: PackedConv,
    down: Vec<PackedConv>,
    second: Linear,
    res: Vec<ResBlock>,
}

impl AppearanceFeatureExtractor {
    pub fn new(cfg: &AppearanceConfig, source: &WeightsSource) -> Result<AppearanceFeatureExtractor> {
        if cfg.reshape_channels * cfg.reshape_depth != cfg.max_features {
            return Err(EngineError::BadInput(format!(
                "appearance extractor: {} channels cannot be viewed as {} x {}",
                cfg.max_features, cfg.reshape_channels, cfg.reshape_depth
            )));
        }
        let mut p = Params::obtain(&cfg.param_table(), source, &normalize)?;
        p.fold_batch_norm("first.conv", "first.norm")?;
        for i in 0..cfg.num_down_blocks {
            p.fold_batch_norm(&format!("down_blocks.{i}.conv"), &format!("down_blocks.{i}.norm"))?;
        }
        let res = (0..cfg.num_resblocks)
            .map(|i| {
                let b = format!("resblocks_3d.3dr{i}");
                let (g, beta) = (p.vec(&format!("{b}.norm1.weight"))?, p.vec(&format!("{b}.norm1.bias"))?);
                let (mean, var) =
                    (p.vec(&format!("{b}.norm1.running_mean"))?, p.vec(&format!("{b}.norm1.running_var"))?);
                let pre = (0..g.len())
                    .map(|c| {
                        let s = g[c] as f64 / (var[c] as f64 + BN_EPS).sqrt();
                        (s as f32, (beta[c] as f64 - mean[c] as f64 * s) as f32)
                    })
                    .collect();
                let conv1 = conv3d_from(&mut p, &format!("{b}.conv1"), Some(&format!("{b}.norm2")), [3; 3], [1; 3])?;
                let conv2 = conv3d_from(&mut p, &format!("{b}.conv2"), None, [3; 3], [1; 3])?;
                Ok(ResBlock { pre, conv1, conv2 })
            })
            .collect::<Result<_>>()?;
        let w = p.weights();
        Ok(AppearanceFeatureExtractor {
            cfg: *cfg,
            first: conv(&w, "first.conv", 1, None)?,
            down: (0..cfg.num_down_blocks)
                .map(|i| conv(&w, &format!("down_blocks.{i}.conv"), 1, None))
                .collect::<candle_core::Result<_>>()?,
            second: Linear::load(&w, "second", true)?,
            res,
        })
    }

    /// `image`: (1, C, h, w) NCHW. Returns feature_3d (1, 32, 16, h/4, w/4) NCDHW.
    pub fn forward(&self, image: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let f = 1 << cfg.num_down_blocks;
        if image.len() != cfg.image_channels * h * w || !h.is_multiple_of(f) || !w.is_multiple_of(f) || h == 0 || w == 0
        {
            return Err(EngineError::BadInput(format!(
                "appearance extractor: {} values for a (1, {}, {h}, {w}) image (sides multiples of {f})",
                image.len(),
                cfg.image_channels
            )));
        }
        let x = crate::conv::Nhwc::from_nchw(1, cfg.image_channels, h, w, image);
        let mut x = conv3x3(&x, &self.first, false, None, true);
        for d in &self.down {
            let y = conv3x3(&x, d, false, None, true);
            let v = avg_pool_hw2(&Ndhwc { n: 1, d: 1, h: y.h, w: y.w, c: y.c, data: y.data });
            x = crate::conv::Nhwc { n: 1, h: v.h, w: v.w, c: v.c, data: v.data };
        }
        let flat = self.second.forward(&x.data, None);
        // (h, w, c·D + d) -> (d, h, w, c).
        let (c, depth, px) = (cfg.reshape_channels, cfg.reshape_depth, x.h * x.w);
        let mut vol = vec![0f32; flat.len()];
        vol.par_chunks_mut(px * c).enumerate().for_each(|(z, slice)| {
            for (q, dst) in slice.chunks_exact_mut(c).enumerate() {
                let src = &flat[q * c * depth..(q + 1) * c * depth];
                dst.iter_mut().enumerate().for_each(|(ch, v)| *v = src[ch * depth + z]);
            }
        });
        let mut v = Ndhwc { n: 1, d: depth, h: x.h, w: x.w, c, data: vol };
        for r in &self.res {
            let mut pre = v.data.clone();
            pre.par_chunks_mut(c).for_each(|px| {
                px.iter_mut().zip(&r.pre).for_each(|(x, (s, t))| *x = (*x * s + t).max(0.0));
            });
            let h1 = conv3d(&Ndhwc { data: pre, ..v }, &r.conv1, true);
            let mut out = conv3d(&h1, &r.conv2, false);
            out.data.par_iter_mut().zip(&v.data).for_each(|(o, x)| *o += x);
            v = out;
        }
        Ok(v.to_ncdhw())
    }
}
