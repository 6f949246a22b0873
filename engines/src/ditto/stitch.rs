//! Ditto's StitchingNetwork (`core/models/modules/stitching_network.py`, LivePortrait's
//! "retarget_shoulder" MLP): keeps the animated head aligned with the shoulders of the source.
//!
//! MLP `mlp.0` 126->128, ReLU, `mlp.2` 128->128, ReLU, `mlp.4` 128->64, ReLU, `mlp.6` 64->65 on
//! cat(kp_source.flatten(), kp_driving.flatten()) (21 x 3 each). The output is kp_driving +
//! `delta[:63]` as (21, 3), with `delta[63]` and `delta[64]` added to x and y of every keypoint.
//!
//! Weights: Ditto's `stitch_network.pth` is `{"retarget_shoulder": {"module.mlp.0.weight": ...}}`
//! (LivePortrait's `stitching_retargeting_module.pth` has the same entry beside
//! `retarget_mouth`/`retarget_eye`): the entry's keys are read with `module.` stripped and the
//! other MLPs ignored. A plain state dict (`mlp.0.weight`, ...) loads too.

use crate::ditto::{Params, TableBuilder};
use crate::unet::cpu::Linear;
use crate::weights::ParamTable;
use crate::{EngineError, Result, WeightsSource};

/// Sizes of the MLP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StitchConfig {
    pub num_kp: usize,
    /// Hidden widths (ReLU after each).
    pub hidden: Vec<usize>,
}

impl Default for StitchConfig {
    /// Ditto's: 21 keypoints, hidden [128, 128, 64] (input 126, output 65).
    fn default() -> Self {
        StitchConfig { num_kp: 21, hidden: vec![128, 128, 64] }
    }
}

impl StitchConfig {
    /// Layer widths from input to output: 2·3·kp, hidden..., 3·kp + 2.
    fn widths(&self) -> Vec<usize> {
        let mut w = vec![6 * self.num_kp];
        w.extend(&self.hidden);
        w.push(3 * self.num_kp + 2);
        w
    }

    /// `mlp.{2i}.weight` (out, in) and `.bias`: index 2i in the `nn.Sequential` (ReLUs between).
    pub fn param_table(&self) -> ParamTable {
        let mut t = TableBuilder::default();
        for (i, pair) in self.widths().windows(2).enumerate() {
            t.add(format!("mlp.{}.weight", 2 * i), &[pair[1], pair[0]]);
            t.add(format!("mlp.{}.bias", 2 * i), &[pair[1]]);
        }
        t.build()
    }

    /// Multiply-adds per batch element.
    pub fn macs(&self) -> f64 {
        self.widths().windows(2).map(|p| (p[0] * p[1]) as f64).sum()
    }
}

/// Maps a checkpoint's names to the table's: the `retarget_shoulder` entry (LivePortrait's
/// other retargeting MLPs dropped), `module.` stripped.
pub(crate) fn normalize(key: &str) -> Option<String> {
    let key = match key.strip_prefix("retarget_shoulder.") {
        Some(k) => k,
        None if key.starts_with("retarget_") => return None,
        None => key,
    };
    Some(super::strip_module(key))
}

/// The stitching MLP, weights transposed for the GEMM.
pub struct StitchingNetwork {
    num_kp: usize,
    layers: Vec<Linear>,
}

impl StitchingNetwork {
    pub fn new(cfg: &StitchConfig, source: &WeightsSource) -> Result<StitchingNetwork> {
        let p = Params::obtain(&cfg.param_table(), source, &normalize)?;
        let w = p.weights();
        let layers = (0..cfg.hidden.len() + 1)
            .map(|i| Linear::load(&w, &format!("mlp.{}", 2 * i), true))
            .collect::<candle_core::Result<_>>()?;
        Ok(StitchingNetwork { num_kp: cfg.num_kp, layers })
    }

    /// `kp_source`, `kp_driving`: (B, kp, 3) row-major. Returns the stitched driving keypoints
    /// (B, kp, 3).
    pub fn forward(&self, kp_source: &[f32], kp_driving: &[f32]) -> Result<Vec<f32>> {
        let per = 3 * self.num_kp;
        if kp_source.len() != kp_driving.len() || kp_source.is_empty() || !kp_source.len().is_multiple_of(per) {
            return Err(EngineError::BadInput(format!(
                "stitching: keypoints of {} and {} values; each needs B x {} x 3",
                kp_source.len(),
                kp_driving.len(),
                self.num_kp
            )));
        }
        let batch = kp_source.len() / per;
        let mut x = Vec::with_capacity(batch * 2 * per);
        for b in 0..batch {
            x.extend_from_slice(&kp_source[b * per..(b + 1) * per]);
            x.extend_from_slice(&kp_driving[b * per..(b + 1) * per]);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, None);
            if i + 1 < self.layers.len() {
                x.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
        let mut out = kp_driving.to_vec();
        for b in 0..batch {
            let delta = &x[b * (per + 2)..(b + 1) * (per + 2)];
            for (k, kp) in out[b * per..(b + 1) * per].chunks_exact_mut(3).enumerate() {
                // (kp + delta) + shift, in PyTorch's order.
                kp[0] = kp[0] + delta[3 * k] + delta[per];
                kp[1] = kp[1] + delta[3 * k + 1] + delta[per + 1];
                kp[2] += delta[3 * k + 2];
            }
        }
        Ok(out)
    }
}
