//! LivePortrait's SPADEDecoder (`src/modules/spade_generator.py`, blocks in `util.py`), Ditto's
//! `decoder.pth`: the warped feature (1, 256, 64, 64) -> RGB (1, 3, 512, 512) in [0, 1].
//!
//! The feature is both the input and the segmentation map of every SPADE:
//! `fc` conv3x3 C->2C; `G_middle_0..5` SPADEResnetBlock(2C, 2C); nearest x2; `up_0`
//! SPADEResnetBlock(2C, C); nearest x2; `up_1` SPADEResnetBlock(C, out); LeakyReLU(0.2);
//! `conv_img.0` conv3x3 out->12; PixelShuffle(2) (`conv_img.1`); sigmoid. C = 256, out = 64.
//!
//! SPADEResnetBlock(fin, fout), middle width min(fin, fout), as in `util.py`:
//! `dx = conv_0(lrelu(norm_0(x, seg)))`, `dx = conv_1(lrelu(norm_1(dx, seg)))`, out = shortcut + dx
//! with LeakyReLU slope 0.2. Only where fin != fout (`up_0`, `up_1`) is the shortcut learned:
//! `conv_s(norm_s(x, seg))`, a 1x1 convolution without bias and *no* activation; otherwise it is x.
//! conv_0, conv_1 and conv_s are spectral-normalised (folded at load, see [`super`]).
//!
//! SPADE(c): InstanceNorm2d(c, affine=False, eps 1e-5)(x) · (1 + γ) + β, with
//! `actv = ReLU(mlp_shared.0(nearest_resize(seg, x's size)))` (conv3x3 label->hidden, hidden = 128)
//! and γ = `mlp_gamma(actv)`, β = `mlp_beta(actv)` (conv3x3 hidden->c each). The two are one
//! convolution here (their weights stacked), and the nearest resize is folded into the gather of
//! `mlp_shared` ([`conv::conv3x3`]'s upsampling; x4 = one materialised x2 plus a folded x2).
//!
//! Cost at the real size: 446 GMAC ([`SpadeConfig::macs`], LivePortrait's docs say 446), three
//! quarters of it at 128x128 and 256x256 in `up_0` and `up_1`, where the SPADE branches (three
//! per block, each a conv3x3 from 256 label channels plus the γ/β conv) cost more than the
//! block's own convolutions.

use crate::conv::{self, conv3x3, instance_norm_stats, Nhwc, PackedConv};
use crate::ditto::{Params, TableBuilder};
use crate::unet::cpu::{conv, Linear};
use crate::weights::ParamTable;
use crate::{EngineError, Result, WeightsSource};
use rayon::prelude::*;

/// InstanceNorm2d's default eps.
const IN_EPS: f64 = 1e-5;
/// The negative slope of every LeakyReLU in the decoder.
const SLOPE: f32 = 0.2;

/// Widths of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpadeConfig {
    /// Channels of the input feature and of the segmentation map (256).
    pub channels: usize,
    /// Output width of `up_1` (64).
    pub out_channels: usize,
    /// SPADE's hidden width (`nhidden`, 128).
    pub hidden: usize,
}

impl Default for SpadeConfig {
    /// LivePortrait's and Ditto's decoder (upscale 2, block_expansion 64, max_features 512).
    fn default() -> Self {
        SpadeConfig { channels: 256, out_channels: 64, hidden: 128 }
    }
}

/// (name, fin, fout) of the eight SPADEResnetBlocks.
fn blocks(cfg: &SpadeConfig) -> Vec<(String, usize, usize)> {
    let c = cfg.channels;
    let mut b: Vec<_> = (0..6).map(|i| (format!("G_middle_{i}"), 2 * c, 2 * c)).collect();
    b.push(("up_0".into(), 2 * c, c));
    b.push(("up_1".into(), c, cfg.out_channels));
    b
}

impl SpadeConfig {
    /// The state dict of `SPADEDecoder` (spectral-norm convs as `weight_orig`, `weight_u`,
    /// `weight_v`).
    pub fn param_table(&self) -> ParamTable {
        let mut t = TableBuilder::default();
        let (c, h) = (self.channels, self.hidden);
        t.conv("fc", 2 * c, c, &[3, 3], true);
        for (name, fin, fout) in blocks(self) {
            let mid = fin.min(fout);
            t.sn_conv(&format!("{name}.conv_0"), mid, fin, &[3, 3], true);
            t.sn_conv(&format!("{name}.conv_1"), fout, mid, &[3, 3], true);
            if fin != fout {
                t.sn_conv(&format!("{name}.conv_s"), fout, fin, &[1, 1], false);
            }
            let mut spade = |norm: &str, nc: usize| {
                t.conv(&format!("{name}.{norm}.mlp_shared.0"), h, c, &[3, 3], true);
                t.conv(&format!("{name}.{norm}.mlp_gamma"), nc, h, &[3, 3], true);
                t.conv(&format!("{name}.{norm}.mlp_beta"), nc, h, &[3, 3], true);
            };
            spade("norm_0", fin);
            spade("norm_1", mid);
            if fin != fout {
                spade("norm_s", fin);
            }
        }
        t.conv("conv_img.0", 12, self.out_channels, &[3, 3], true);
        t.build()
    }

    /// Multiply-adds of one forward on an `h` x `w` feature (output 4h x 4w), from the layer
    /// shapes: every convolution's weight size times its output pixels.
    pub fn macs(&self, h: usize, w: usize) -> f64 {
        let px = |scale: usize| (h * w * scale * scale) as f64;
        let (c, hid) = (self.channels, self.hidden);
        let spade = |nc: usize, p: f64| p * 9.0 * (c * hid + hid * 2 * nc) as f64;
        let mut m = px(1) * 9.0 * (c * 2 * c) as f64;
        for (i, (_, fin, fout)) in blocks(self).into_iter().enumerate() {
            let p = px([1, 1, 1, 1, 1, 1, 2, 4][i]);
            let mid = fin.min(fout);
            m += spade(fin, p) + spade(mid, p) + p * 9.0 * (fin * mid + mid * fout) as f64;
            if fin != fout {
                m += spade(fin, p) + p * (fin * fout) as f64;
            }
        }
        m + px(4) * 9.0 * (self.out_channels * 12) as f64
    }
}

/// Ditto's `decoder.pth` and LivePortrait's `spade_generator.pth`: plain state dicts.
pub(crate) fn normalize(key: &str) -> Option<String> {
    Some(super::strip_module(key))
}

/// One SPADE: the shared conv and the stacked γ/β conv (output channels [γ | β]).
struct Spade {
    shared: PackedConv,
    gamma_beta: PackedConv,
}

impl Spade {
    fn load(p: &Params, prefix: &str) -> Result<Spade> {
        let w = p.weights();
        let shared = conv(&w, &format!("{prefix}.mlp_shared.0"), 1, None)?;
        let (g, b) = (p.vec(&format!("{prefix}.mlp_gamma.weight"))?, p.vec(&format!("{prefix}.mlp_beta.weight"))?);
        let nc = p.vec(&format!("{prefix}.mlp_gamma.bias"))?.len();
        let mut bias = p.vec(&format!("{prefix}.mlp_gamma.bias"))?;
        bias.extend(p.vec(&format!("{prefix}.mlp_beta.bias"))?);
        let stacked: Vec<f32> = g.into_iter().chain(b).collect();
        let gamma_beta = PackedConv::new(2 * nc, shared.cout, &stacked, Some(bias), 1);
        Ok(Spade { shared, gamma_beta })
    }

    /// norm(x)·(1 + γ) + β, then LeakyReLU(0.2) if `act`. `seg` is the segmentation map at half
    /// of x's size when `seg_up` (nearest x2 folded into the shared conv), else at x's size.
    fn forward(&self, x: &Nhwc, seg: &Nhwc, seg_up: bool, act: bool) -> Nhwc {
        let actv = conv3x3(seg, &self.shared, seg_up, None, true);
        let gb = conv3x3(&actv, &self.gamma_beta, false, None, false);
        assert_eq!((gb.h, gb.w, gb.c), (x.h, x.w, 2 * x.c), "SPADE: segmentation map and input sizes");
        let stats = instance_norm_stats(x, IN_EPS);
        let (c, px) = (x.c, x.h * x.w);
        let mut out = vec![0f32; x.data.len()];
        out.par_chunks_mut(c).zip(x.data.par_chunks(c)).zip(gb.data.par_chunks(2 * c)).enumerate().for_each(
            |(q, ((o, xv), gb))| {
                let st = &stats[(q / px) * c..][..c];
                for ch in 0..c {
                    let (mean, rstd) = st[ch];
                    let v = (xv[ch] - mean) * rstd * (1.0 + gb[ch]) + gb[c + ch];
                    o[ch] = if act && v < 0.0 { v * SLOPE } else { v };
                }
            },
        );
        Nhwc { data: out, ..*x }
    }
}

/// One SPADEResnetBlock.
struct Block {
    norm_0: Spade,
    conv_0: PackedConv,
    norm_1: Spade,
    conv_1: PackedConv,
    /// Learned shortcut (fin != fout): norm_s, then the 1x1 conv_s without bias.
    shortcut: Option<(Spade, Linear)>,
}

impl Block {
    fn load(p: &mut Params, name: &str, learned: bool) -> Result<Block> {
        let convs: &[&str] = if learned { &["conv_0", "conv_1", "conv_s"] } else { &["conv_0", "conv_1"] };
        for c in convs {
            p.fold_spectral(&format!("{name}.{c}"))?;
        }
        let w = p.weights();
        let shortcut = if learned {
            Some((Spade::load(p, &format!("{name}.norm_s"))?, Linear::load(&w, &format!("{name}.conv_s"), false)?))
        } else {
            None
        };
        Ok(Block {
            norm_0: Spade::load(p, &format!("{name}.norm_0"))?,
            conv_0: conv(&w, &format!("{name}.conv_0"), 1, None)?,
            norm_1: Spade::load(p, &format!("{name}.norm_1"))?,
            conv_1: conv(&w, &format!("{name}.conv_1"), 1, None)?,
            shortcut,
        })
    }

    fn forward(&self, x: &Nhwc, seg: &Nhwc, seg_up: bool) -> Nhwc {
        let learned = self.shortcut.as_ref().map(|(norm_s, conv_s)| {
            let n = norm_s.forward(x, seg, seg_up, false);
            Nhwc { data: conv_s.forward(&n.data, None), c: conv_s.dout, ..n }
        });
        let h = conv3x3(&self.norm_0.forward(x, seg, seg_up, true), &self.conv_0, false, None, false);
        let h = self.norm_1.forward(&h, seg, seg_up, true);
        conv3x3(&h, &self.conv_1, false, Some(learned.as_ref().unwrap_or(x)), false)
    }
}

/// The SPADE decoder with its weights folded and packed for the CPU path.
pub struct SpadeDecoder {
    cfg: SpadeConfig,
    fc: PackedConv,
    blocks: Vec<Block>,
    conv_img: PackedConv,
}

impl SpadeDecoder {
    pub fn new(cfg: &SpadeConfig, source: &WeightsSource) -> Result<SpadeDecoder> {
        let mut p = Params::obtain(&cfg.param_table(), source, &normalize)?;
        let blocks = blocks(cfg)
            .iter()
            .map(|(name, fin, fout)| Block::load(&mut p, name, fin != fout))
            .collect::<Result<Vec<_>>>()?;
        let w = p.weights();
        Ok(SpadeDecoder { cfg: *cfg, fc: conv(&w, "fc", 1, None)?, blocks, conv_img: conv(&w, "conv_img.0", 1, None)? })
    }

    pub fn config(&self) -> &SpadeConfig {
        &self.cfg
    }

    /// `feature`: (N, C, H, W) NCHW. Returns (N, 3, 4H, 4W) NCHW in (0, 1).
    pub fn forward(&self, feature: &[f32], n: usize, h: usize, w: usize) -> Result<Vec<f32>> {
        let c = self.cfg.channels;
        if feature.len() != n * c * h * w || n == 0 {
            return Err(EngineError::BadInput(format!(
                "SPADE decoder: {} values for a ({n}, {c}, {h}, {w}) feature",
                feature.len()
            )));
        }
        let seg = Nhwc::from_nchw(n, c, h, w, feature);
        let mut x = conv3x3(&seg, &self.fc, false, None, false);
        for b in &self.blocks[..6] {
            x = b.forward(&x, &seg, false);
        }
        // up_0 at 2x: the map's nearest x2 folded into each SPADE's shared conv.
        x = self.blocks[6].forward(&conv::upsample2(&x), &seg, true);
        // up_1 at 4x: one x2 of the map materialised, the other folded.
        let seg2 = conv::upsample2(&seg);
        x = self.blocks[7].forward(&conv::upsample2(&x), &seg2, true);
        x.data.par_iter_mut().for_each(|v| *v = if *v < 0.0 { *v * SLOPE } else { *v });
        let mut y = conv::pixel_shuffle(&conv3x3(&x, &self.conv_img, false, None, false), 2);
        y.data.par_iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
        Ok(y.to_nchw())
    }
}
