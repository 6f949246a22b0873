//! LivePortrait's WarpingNetwork with its DenseMotionNetwork (`src/modules/warping_network.py`,
//! `dense_motion.py`, blocks in `util.py`), Ditto's `warp_network.pth`: warps the source's
//! appearance volume feature_3d (1, 32, 16, 64, 64) from the source keypoints to the driving ones
//! -> (1, 256, 64, 64), the SPADE decoder's input. Ditto's wrapper takes (feature_3d, kp_source,
//! kp_driving); LivePortrait's forward takes (feature_3d, kp_driving, kp_source).
//!
//! DenseMotionNetwork (prefix `dense_motion_network.`), as LivePortrait's `models.yaml`
//! configures it (block_expansion 32, max_features 1024, num_blocks 5, reshape_depth 16,
//! compress 4, `estimate_occlusion_map: True`):
//! 1. `compress` Conv3d 1x1x1 32->4, `norm` BatchNorm3d, ReLU.
//! 2. 22 sparse motions: the identity grid (x, y, z each `2·(i/(n−1)) − 1`, i.e. corner-aligned)
//!    and, per keypoint k, `grid − kp_driving[k] + kp_source[k]`.
//! 3. The compressed volume sampled at each: `F.grid_sample` trilinear, zero padding,
//!    align_corners=False (note: the grids are corner-aligned, the sampling is not).
//! 4. Heatmaps exp(−0.5‖g − kp‖² / 0.01), driving minus source, zero for the background; per
//!    motion the heatmap then its 4 sampled channels: 22 x 5 = 110 channels.
//! 5. Hourglass: encoder `down_blocks.i` = Conv3d 3³ + BatchNorm3d + ReLU + AvgPool3d (1,2,2),
//!    widths min(1024, 32·2^(i+1)) = 64..1024; decoder `up_blocks.j` = nearest (1,2,2) + Conv3d
//!    3³ + BatchNorm3d + ReLU, each output concatenated with the encoder's skip (output first),
//!    then `decoder.conv` 3³ 142->142 + `decoder.norm` + ReLU (142 = 32 + 110).
//! 6. `mask` Conv3d 7³ 142->22, softmax over the 22: deformation = Σ mask_k · motion_k.
//! 7. `occlusion` Conv2d 7x7 over the hourglass output viewed as (142·16, 64, 64)
//!    (channel c·16 + d), sigmoid.
//!
//! Then feature_3d is sampled at the deformation (same grid_sample), viewed as (32·16, 64, 64),
//! `third` = SameBlock2d (conv3x3 512->256, BatchNorm2d, LeakyReLU with PyTorch's default slope
//! 0.01), `fourth` = conv1x1 256->256, and multiplied by the occlusion map
//! (`flag_use_occlusion_map` defaults to True).
//!
//! BatchNorms are folded into the convolutions before them at load. The trilinear sample is the
//! kernel math the GPU kernel and the host's CPU path share (`cadence_kernels::grid_sample`,
//! bitwise PyTorch's operation order), applied here to channels-last volumes.

use crate::conv::conv3d::{conv3d, Ndhwc, PackedConv3d};
use crate::conv::{conv3x3, Nhwc, PackedConv};
use crate::ditto::{Params, TableBuilder};
use crate::unet::cpu::{conv, Linear};
use crate::weights::ParamTable;
use crate::{EngineError, Result, WeightsSource};
use cadence_kernels::grid_sample::{Corner, Trilinear};
use rayon::prelude::*;

/// kp2gaussian's variance in the dense motion network.
const KP_VARIANCE: f32 = 0.01;
/// nn.LeakyReLU's default negative slope (SameBlock2d with lrelu=True).
const THIRD_SLOPE: f32 = 0.01;
const DM: &str = "dense_motion_network";

/// Sizes of the warping network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarpConfig {
    pub num_kp: usize,
    /// Channels of feature_3d (`reshape_channel`, 32).
    pub feature_channels: usize,
    /// Depth of feature_3d (`reshape_depth`, 16).
    pub depth: usize,
    /// Channels after `compress` (4).
    pub compress: usize,
    /// The hourglass's `block_expansion` (32), `max_features` (1024), `num_blocks` (5).
    pub block_expansion: usize,
    pub max_features: usize,
    pub num_blocks: usize,
    /// Output channels of `third` and `fourth` (block_expansion 64 · 2^num_down_blocks 2 = 256).
    pub out_channels: usize,
}

impl Default for WarpConfig {
    fn default() -> Self {
        WarpConfig {
            num_kp: 21,
            feature_channels: 32,
            depth: 16,
            compress: 4,
            block_expansion: 32,
            max_features: 1024,
            num_blocks: 5,
            out_channels: 256,
        }
    }
}

impl WarpConfig {
    fn width(&self, i: usize) -> usize {
        self.max_features.min(self.block_expansion << i)
    }
    /// Hourglass input: (kp + 1) motions x (heatmap + compressed channels).
    fn hourglass_in(&self) -> usize {
        (self.num_kp + 1) * (self.compress + 1)
    }
    /// Hourglass output (`out_filters`): block_expansion + its input.
    fn hourglass_out(&self) -> usize {
        self.block_expansion + self.hourglass_in()
    }
    /// (cin, cout) of `down_blocks.i`.
    fn down(&self, i: usize) -> (usize, usize) {
        (if i == 0 { self.hourglass_in() } else { self.width(i) }, self.width(i + 1))
    }
    /// (cin, cout) of `up_blocks.j` (j = 0 is the deepest).
    fn up(&self, j: usize) -> (usize, usize) {
        let i = self.num_blocks - 1 - j;
        ((if j == 0 { 1 } else { 2 }) * self.width(i + 1), self.width(i))
    }

    /// The state dict of `WarpingNetwork` (BatchNorms' `num_batches_tracked` left out).
    pub fn param_table(&self) -> ParamTable {
        let mut t = TableBuilder::default();
        let hg = format!("{DM}.hourglass");
        for i in 0..self.num_blocks {
            let (cin, cout) = self.down(i);
            t.conv(&format!("{hg}.encoder.down_blocks.{i}.conv"), cout, cin, &[3, 3, 3], true);
            t.batch_norm(&format!("{hg}.encoder.down_blocks.{i}.norm"), cout);
        }
        for j in 0..self.num_blocks {
            let (cin, cout) = self.up(j);
            t.conv(&format!("{hg}.decoder.up_blocks.{j}.conv"), cout, cin, &[3, 3, 3], true);
            t.batch_norm(&format!("{hg}.decoder.up_blocks.{j}.norm"), cout);
        }
        let out = self.hourglass_out();
        t.conv(&format!("{hg}.decoder.conv"), out, out, &[3, 3, 3], true);
        t.batch_norm(&format!("{hg}.decoder.norm"), out);
        t.conv(&format!("{DM}.mask"), self.num_kp + 1, out, &[7, 7, 7], true);
        t.conv(&format!("{DM}.compress"), self.compress, self.feature_channels, &[1, 1, 1], true);
        t.batch_norm(&format!("{DM}.norm"), self.compress);
        t.conv(&format!("{DM}.occlusion"), 1, out * self.depth, &[7, 7], true);
        t.conv("third.conv", self.out_channels, self.feature_channels * self.depth, &[3, 3], true);
        t.batch_norm("third.norm", self.out_channels);
        t.conv("fourth", self.out_channels, self.out_channels, &[1, 1], true);
        t.build()
    }

    /// Multiply-adds of one forward on a (depth, h, w) volume, from the layer shapes.
    pub fn macs(&self, h: usize, w: usize) -> f64 {
        let vox = |s: usize| (self.depth * (h >> s) * (w >> s)) as f64;
        let mut m = vox(0) * (self.feature_channels * self.compress) as f64;
        for i in 0..self.num_blocks {
            let (cin, cout) = self.down(i);
            m += vox(i) * 27.0 * (cin * cout) as f64;
            let (cin, cout) = self.up(i);
            m += vox(self.num_blocks - 1 - i) * 27.0 * (cin * cout) as f64;
        }
        let out = self.hourglass_out();
        m += vox(0) * 27.0 * (out * out) as f64 + vox(0) * 343.0 * (out * (self.num_kp + 1)) as f64;
        let px = (h * w) as f64;
        m + px * 49.0 * (out * self.depth) as f64
            + px * 9.0 * (self.feature_channels * self.depth * self.out_channels) as f64
            + px * (self.out_channels * self.out_channels) as f64
    }
}

/// Ditto's `warp_network.pth` and LivePortrait's `warping_module.pth`: plain state dicts.
pub(crate) fn normalize(key: &str) -> Option<String> {
    Some(super::strip_module(key))
}

/// A Conv3d (PyTorch layout in `p`) packed, with its BatchNorm folded in if `bn`.
pub(crate) fn conv3d_from(
    p: &mut Params,
    name: &str,
    bn: Option<&str>,
    kernel: [usize; 3],
    pad: [usize; 3],
) -> Result<PackedConv3d> {
    if let Some(bn) = bn {
        p.fold_batch_norm(name, bn)?;
    }
    let w = p.vec(&format!("{name}.weight"))?;
    let b = p.vec(&format!("{name}.bias"))?;
    let cout = b.len();
    Ok(PackedConv3d::new(cout, w.len() / (cout * kernel.iter().product::<usize>()), kernel, pad, &w, Some(b)))
}

/// The warping network with its weights folded and packed for the CPU path.
pub struct WarpingNetwork {
    cfg: WarpConfig,
    compress: PackedConv3d,
    down: Vec<PackedConv3d>,
    up: Vec<PackedConv3d>,
    out_conv: PackedConv3d,
    mask: PackedConv3d,
    /// The 7x7 occlusion Conv2d as a depth-1 Conv3d.
    occlusion: PackedConv3d,
    third: PackedConv,
    fourth: Linear,
}

/// What the dense motion network predicts (channels-last).
pub struct DenseMotion {
    /// (D, H, W, 3): the sampling grid of feature_3d, (x, y, z) per voxel.
    pub deformation: Vec<f32>,
    /// (H, W): the occlusion map in (0, 1).
    pub occlusion: Vec<f32>,
}

impl WarpingNetwork {
    pub fn new(cfg: &WarpConfig, source: &WeightsSource) -> Result<WarpingNetwork> {
        let mut p = Params::obtain(&cfg.param_table(), source, &normalize)?;
        let hg = format!("{DM}.hourglass");
        let k3 = ([3; 3], [1; 3]);
        let down = (0..cfg.num_blocks)
            .map(|i| {
                let b = format!("{hg}.encoder.down_blocks.{i}");
                conv3d_from(&mut p, &format!("{b}.conv"), Some(&format!("{b}.norm")), k3.0, k3.1)
            })
            .collect::<Result<_>>()?;
        let up = (0..cfg.num_blocks)
            .map(|j| {
                let b = format!("{hg}.decoder.up_blocks.{j}");
                conv3d_from(&mut p, &format!("{b}.conv"), Some(&format!("{b}.norm")), k3.0, k3.1)
            })
            .collect::<Result<_>>()?;
        p.fold_batch_norm("third.conv", "third.norm")?;
        let w = p.weights();
        let third = conv(&w, "third.conv", 1, None)?;
        let fourth = Linear::load(&w, "fourth", true)?;
        Ok(WarpingNetwork {
            cfg: *cfg,
            compress: conv3d_from(&mut p, &format!("{DM}.compress"), Some(&format!("{DM}.norm")), [1; 3], [0; 3])?,
            down,
            up,
            out_conv: conv3d_from(
                &mut p,
                &format!("{hg}.decoder.conv"),
                Some(&format!("{hg}.decoder.norm")),
                k3.0,
                k3.1,
            )?,
            mask: conv3d_from(&mut p, &format!("{DM}.mask"), None, [7; 3], [3; 3])?,
            occlusion: conv3d_from(&mut p, &format!("{DM}.occlusion"), None, [1, 7, 7], [0, 3, 3])?,
            third,
            fourth,
        })
    }

    pub fn config(&self) -> &WarpConfig {
        &self.cfg
    }

    fn check(&self, f: &[f32], kp_s: &[f32], kp_d: &[f32], h: usize, w: usize) -> Result<()> {
        let c = &self.cfg;
        let blocks_fit = h.is_multiple_of(1 << c.num_blocks) && w.is_multiple_of(1 << c.num_blocks) && h > 1 && w > 1;
        if f.len() != c.feature_channels * c.depth * h * w
            || kp_s.len() != 3 * c.num_kp
            || kp_d.len() != kp_s.len()
            || !blocks_fit
        {
            return Err(EngineError::BadInput(format!(
                "warping network: feature_3d of {} values for (1, {}, {}, {h}, {w}) (h, w multiples of {}), keypoints of {} and {} values for (1, {}, 3)",
                f.len(),
                c.feature_channels,
                c.depth,
                1 << c.num_blocks,
                kp_s.len(),
                kp_d.len(),
                c.num_kp
            )));
        }
        Ok(())
    }

    /// The dense motion network alone (`feature_3d` NCDHW (1, C, D, h, w), keypoints (1, kp, 3)).
    pub fn dense_motion(
        &self,
        feature_3d: &[f32],
        kp_source: &[f32],
        kp_driving: &[f32],
        h: usize,
        w: usize,
    ) -> Result<DenseMotion> {
        self.check(feature_3d, kp_source, kp_driving, h, w)?;
        let f = Ndhwc::from_ncdhw(1, self.cfg.feature_channels, self.cfg.depth, h, w, feature_3d);
        Ok(self.dense_motion_ndhwc(&f, kp_source, kp_driving))
    }

    /// Ditto's forward: `feature_3d` NCDHW (1, C, D, h, w), `kp_source`, `kp_driving` (1, kp, 3).
    /// Returns (1, out_channels, h, w) NCHW.
    pub fn forward(
        &self,
        feature_3d: &[f32],
        kp_source: &[f32],
        kp_driving: &[f32],
        h: usize,
        w: usize,
    ) -> Result<Vec<f32>> {
        self.check(feature_3d, kp_source, kp_driving, h, w)?;
        let cfg = &self.cfg;
        let f = Ndhwc::from_ncdhw(1, cfg.feature_channels, cfg.depth, h, w, feature_3d);
        let dm = self.dense_motion_ndhwc(&f, kp_source, kp_driving);
        let warped = sample_to_2d(&f, &dm.deformation);
        let mut x = conv3x3(&warped, &self.third, false, None, false);
        x.data.par_iter_mut().for_each(|v| *v = if *v < 0.0 { *v * THIRD_SLOPE } else { *v });
        let mut y = Nhwc { data: self.fourth.forward(&x.data, None), ..x };
        y.data
            .par_chunks_mut(cfg.out_channels)
            .zip(&dm.occlusion)
            .for_each(|(px, o)| px.iter_mut().for_each(|v| *v *= o));
        Ok(y.to_nchw())
    }

    fn dense_motion_ndhwc(&self, f: &Ndhwc, kp_s: &[f32], kp_d: &[f32]) -> DenseMotion {
        let cfg = &self.cfg;
        let comp = conv3d(f, &self.compress, true);
        let motions = Motions::new(kp_s, kp_d, [f.d, f.h, f.w]);
        // Hourglass input: per motion k, [heatmap, sampled compressed channels].
        let (cc, per) = (cfg.compress, cfg.compress + 1);
        let kin = cfg.hourglass_in();
        let mut x = vec![0f32; motions.voxels() * kin];
        x.par_chunks_mut(kin).enumerate().for_each(|(v, dst)| {
            let g = motions.identity(v);
            for k in 0..=cfg.num_kp {
                let d = &mut dst[k * per..(k + 1) * per];
                d[0] = if k == 0 {
                    0.0
                } else {
                    flush_subnormal(gaussian(g, &kp_d[3 * (k - 1)..]) - gaussian(g, &kp_s[3 * (k - 1)..]))
                };
                let p = motions.motion(g, k);
                let t = Trilinear::new(p[0], p[1], p[2], f.d as u32, f.h as u32, f.w as u32);
                for (ch, o) in d[1..].iter_mut().enumerate() {
                    *o = sample(&t, &comp.data, cc, ch);
                }
            }
        });
        let x = Ndhwc { n: 1, d: f.d, h: f.h, w: f.w, c: kin, data: x };
        // Hourglass.
        let mut skips = vec![x];
        for d in &self.down {
            let y = conv3d(skips.last().expect("hourglass input"), d, true);
            skips.push(avg_pool_hw2(&y));
        }
        let mut out = skips.pop().expect("deepest block");
        for u in &self.up {
            let y = conv3d(&upsample_hw2(&out), u, true);
            out = concat_channels(&y, &skips.pop().expect("skip per up block"));
        }
        let pred = conv3d(&out, &self.out_conv, true);
        // Mask: softmax over the motions, then the deformation as their weighted sum.
        let logits = conv3d(&pred, &self.mask, false);
        let n = cfg.num_kp + 1;
        let mut deformation = vec![0f32; motions.voxels() * 3];
        deformation.par_chunks_mut(3).zip(logits.data.par_chunks(n)).enumerate().for_each(|(v, (def, l))| {
            let max = l.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let e: Vec<f32> = l.iter().map(|x| (x - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            let g = motions.identity(v);
            let mut acc = [0f32; 3];
            for (k, ek) in e.iter().enumerate() {
                let (p, m) = (motions.motion(g, k), ek / sum);
                (0..3).for_each(|a| acc[a] += p[a] * m);
            }
            def.copy_from_slice(&acc);
        });
        // Occlusion: the hourglass output as a 2-D map of (channel, depth) channels.
        let pred2d = depth_into_channels(&pred);
        let occ = conv3d(
            &Ndhwc { n: 1, d: 1, h: pred2d.h, w: pred2d.w, c: pred2d.c, data: pred2d.data },
            &self.occlusion,
            false,
        );
        let occlusion = occ.data.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
        DenseMotion { deformation, occlusion }
    }
}

/// The identity grid and the keypoints of the sparse motions.
struct Motions<'a> {
    kp_s: &'a [f32],
    kp_d: &'a [f32],
    /// Per axis (x, y, z), the grid coordinate of each index: 2·(i/(n−1)) − 1 in f32, as
    /// LivePortrait's make_coordinate_grid computes it.
    axes: [Vec<f32>; 3],
    dhw: [usize; 3],
}

impl<'a> Motions<'a> {
    fn new(kp_s: &'a [f32], kp_d: &'a [f32], dhw: [usize; 3]) -> Motions<'a> {
        let axis = |n: usize| (0..n).map(|i| 2.0 * (i as f32 / (n - 1) as f32) - 1.0).collect::<Vec<f32>>();
        Motions { kp_s, kp_d, axes: [axis(dhw[2]), axis(dhw[1]), axis(dhw[0])], dhw }
    }
    fn voxels(&self) -> usize {
        self.dhw.iter().product()
    }
    /// (x, y, z) of voxel `v` (D, H, W order) on the identity grid.
    fn identity(&self, v: usize) -> [f32; 3] {
        let [_, h, w] = self.dhw;
        [self.axes[0][v % w], self.axes[1][v / w % h], self.axes[2][v / (h * w)]]
    }
    /// Motion k at grid point g: g itself for k = 0 (background), else g − kp_d + kp_s.
    fn motion(&self, g: [f32; 3], k: usize) -> [f32; 3] {
        if k == 0 {
            return g;
        }
        let (s, d) = (&self.kp_s[3 * (k - 1)..], &self.kp_d[3 * (k - 1)..]);
        [g[0] - d[0] + s[0], g[1] - d[1] + s[1], g[2] - d[2] + s[2]]
    }
}

/// kp2gaussian: exp(−0.5·‖g − kp‖² / 0.01), the squares summed x, y, z.
fn gaussian(g: [f32; 3], kp: &[f32]) -> f32 {
    let s = (g[0] - kp[0]).powi(2) + (g[1] - kp[1]).powi(2) + (g[2] - kp[2]).powi(2);
    (-0.5 * s / KP_VARIANCE).exp()
}

/// `v`, or zero where it is subnormal. The heatmaps' tails pass through f32's subnormal range
/// (exp(−50·s) for 1.75 < s < 2.07), and a subnormal operand makes x86's multiply-adds take
/// a microcode assist: the hourglass's convolutions that read the heatmaps (its first, and its
/// output conv through the skip) ran 20x slower on a 2-core Xeon (5.5 against 120 GFLOP/s,
/// `engines/examples/conv3d_probe.rs --subnormal`). Values below 1.2e-38 change no sum the
/// network makes, so this is not a change of its numbers at f32 precision.
fn flush_subnormal(v: f32) -> f32 {
    if v.abs() < f32::MIN_POSITIVE {
        0.0
    } else {
        v
    }
}

/// Channel `ch` of a channels-last volume with `c` channels sampled at the eight corners `t`.
#[inline(always)]
fn sample(t: &Trilinear, vol: &[f32], c: usize, ch: usize) -> f32 {
    let v = |k: &Corner| if k.inside { vol[k.index as usize * c + ch] } else { 0.0 };
    t.blend(v(&t.c000), v(&t.c001), v(&t.c010), v(&t.c011), v(&t.c100), v(&t.c101), v(&t.c110), v(&t.c111))
}

/// feature_3d sampled at the deformation and viewed as PyTorch's `(C·D, H, W)` map (channel
/// c·D + d), written straight in that 2-D channels-last layout.
fn sample_to_2d(f: &Ndhwc, deformation: &[f32]) -> Nhwc {
    let (d, h, w, c) = (f.d, f.h, f.w, f.c);
    let mut out = vec![0f32; h * w * c * d];
    out.par_chunks_mut(c * d).enumerate().for_each(|(px, dst)| {
        for z in 0..d {
            let g = &deformation[(z * h * w + px) * 3..][..3];
            let t = Trilinear::new(g[0], g[1], g[2], d as u32, h as u32, w as u32);
            for ch in 0..c {
                dst[ch * d + z] = sample(&t, &f.data, c, ch);
            }
        }
    });
    Nhwc { n: 1, h, w, c: c * d, data: out }
}

/// A (1, D, H, W, C) volume as the (C·D, H, W) map PyTorch's `view(bs, -1, h, w)` gives.
fn depth_into_channels(x: &Ndhwc) -> Nhwc {
    let (d, h, w, c) = (x.d, x.h, x.w, x.c);
    let mut out = vec![0f32; x.data.len()];
    out.par_chunks_mut(c * d).enumerate().for_each(|(px, dst)| {
        for z in 0..d {
            let src = &x.data[(z * h * w + px) * c..][..c];
            for ch in 0..c {
                dst[ch * d + z] = src[ch];
            }
        }
    });
    Nhwc { n: 1, h, w, c: c * d, data: out }
}

/// AvgPool3d((1, 2, 2)): the mean of each 2x2 block of every depth slice.
pub(crate) fn avg_pool_hw2(x: &Ndhwc) -> Ndhwc {
    let (h, w, c) = (x.h / 2, x.w / 2, x.c);
    let mut out = vec![0f32; x.n * x.d * h * w * c];
    out.par_chunks_mut(w * c).enumerate().for_each(|(row, dst)| {
        // row = slice · h + y over the n·d slices.
        let (s, y) = (row / h, row % h);
        let at = |yy: usize, xx: usize| &x.data[((s * x.h + yy) * x.w + xx) * c..][..c];
        for xo in 0..w {
            let (a, b, e, f) =
                (at(2 * y, 2 * xo), at(2 * y, 2 * xo + 1), at(2 * y + 1, 2 * xo), at(2 * y + 1, 2 * xo + 1));
            for ch in 0..c {
                dst[xo * c + ch] = (a[ch] + b[ch] + e[ch] + f[ch]) / 4.0;
            }
        }
    });
    Ndhwc { n: x.n, d: x.d, h, w, c, data: out }
}

/// Nearest upsampling by (1, 2, 2).
fn upsample_hw2(x: &Ndhwc) -> Ndhwc {
    let (h, w, c) = (2 * x.h, 2 * x.w, x.c);
    let mut out = vec![0f32; x.n * x.d * h * w * c];
    out.par_chunks_mut(w * c).enumerate().for_each(|(row, dst)| {
        let (s, y) = (row / h, row % h);
        for xo in 0..w {
            dst[xo * c..(xo + 1) * c].copy_from_slice(&x.data[((s * x.h + y / 2) * x.w + xo / 2) * c..][..c]);
        }
    });
    Ndhwc { n: x.n, d: x.d, h, w, c, data: out }
}

/// torch.cat([a, b], dim=1) on channels-last volumes of the same size.
fn concat_channels(a: &Ndhwc, b: &Ndhwc) -> Ndhwc {
    assert_eq!((a.n, a.d, a.h, a.w), (b.n, b.d, b.h, b.w), "concat: sizes");
    let c = a.c + b.c;
    let mut out = vec![0f32; a.data.len() + b.data.len()];
    out.par_chunks_mut(c).zip(a.data.par_chunks(a.c).zip(b.data.par_chunks(b.c))).for_each(|(o, (x, y))| {
        o[..a.c].copy_from_slice(x);
        o[a.c..].copy_from_slice(y);
    });
    Ndhwc { c, data: out, ..*a }
}
