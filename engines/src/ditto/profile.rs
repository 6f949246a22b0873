//! The sizes of every Ditto network for each engine [`Profile`]: `full` is the published one
//! (a 256² source crop, 512² output), `cpu-reduced` keeps every layer and the motion's meaning
//! (21 keypoints, 66 bins, 265 motion values, 80-frame windows) with narrower layers, a 128²
//! source crop and a 256² output, so that the experiments run on a CPU.

use super::appearance::AppearanceConfig;
use super::hubert::HubertConfig;
use super::keypoints::MOTION_DIM;
use super::lmdm::LmdmConfig;
use super::motion::MotionConfig;
use super::spade::SpadeConfig;
use super::stitch::StitchConfig;
use super::warp::WarpConfig;
use crate::Profile;

/// Condition values per frame besides the audio features: emotion 8, eye open 2, eye ball 6,
/// source keypoints 63.
pub const EXTRA_CONDITION: usize = 8 + 2 + 6 + 63;

/// Every network's configuration for one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct DittoConfigs {
    pub profile: Profile,
    pub appearance: AppearanceConfig,
    pub motion: MotionConfig,
    pub warp: WarpConfig,
    pub spade: SpadeConfig,
    pub stitch: StitchConfig,
    pub lmdm: LmdmConfig,
    pub hubert: HubertConfig,
    /// Side of the square source crop the extractors see (256 in Ditto).
    pub source_side: usize,
}

impl DittoConfigs {
    pub fn for_profile(profile: Profile) -> DittoConfigs {
        match profile {
            Profile::Full => {
                let hubert = HubertConfig::default();
                DittoConfigs {
                    profile,
                    appearance: AppearanceConfig::default(),
                    motion: MotionConfig::default(),
                    warp: WarpConfig::default(),
                    spade: SpadeConfig::default(),
                    stitch: StitchConfig::default(),
                    lmdm: LmdmConfig { cond_dim: hubert.hidden + EXTRA_CONDITION, ..LmdmConfig::default() },
                    hubert,
                    source_side: 256,
                }
            }
            Profile::Cpu => {
                let hubert = HubertConfig {
                    conv_dim: vec![128; 7],
                    hidden: 256,
                    layers: 4,
                    heads: 4,
                    intermediate: 1024,
                    ..HubertConfig::default()
                };
                DittoConfigs {
                    profile,
                    appearance: AppearanceConfig {
                        block_expansion: 32,
                        max_features: 64,
                        reshape_channels: 16,
                        reshape_depth: 4,
                        ..AppearanceConfig::default()
                    },
                    motion: MotionConfig { depths: [2, 2, 6, 2], dims: [48, 96, 192, 384], ..MotionConfig::default() },
                    warp: WarpConfig {
                        feature_channels: 16,
                        depth: 4,
                        compress: 2,
                        block_expansion: 16,
                        max_features: 256,
                        out_channels: 32,
                        ..WarpConfig::default()
                    },
                    spade: SpadeConfig { channels: 32, out_channels: 16, hidden: 32 },
                    stitch: StitchConfig::default(),
                    lmdm: LmdmConfig {
                        nfeats: MOTION_DIM,
                        seq_len: 80,
                        latent: 256,
                        ff: 512,
                        layers: 4,
                        heads: 4,
                        cond_dim: hubert.hidden + EXTRA_CONDITION,
                    },
                    hubert,
                    source_side: 128,
                }
            }
        }
    }

    /// Side of the warp network's feature (the source side / 4).
    pub fn feature_side(&self) -> usize {
        self.source_side / 4
    }

    /// Side of the decoded crop (the feature side × 8).
    pub fn output_side(&self) -> usize {
        self.feature_side() * 8
    }

    /// Audio feature width (HuBERT's hidden size: 1024 in Ditto).
    pub fn audio_features(&self) -> usize {
        self.hubert.hidden
    }

    /// Multiply-adds of the warp network and the decoder for one frame.
    pub fn frame_macs(&self) -> (f64, f64) {
        let s = self.feature_side();
        (self.warp.macs(s, s), self.spade.macs(s, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_profile_is_dittos_and_reduced_keeps_the_motion() {
        let full = DittoConfigs::for_profile(Profile::Full);
        assert_eq!(full.lmdm, LmdmConfig::default());
        assert_eq!((full.feature_side(), full.output_side()), (64, 512));
        let (warp, dec) = full.frame_macs();
        // ≈171 and ≈446 GMAC (counted from LivePortrait's modules).
        assert!((warp / 1e9 - 171.0).abs() < 10.0 && (dec / 1e9 - 446.0).abs() < 10.0, "{warp:e} {dec:e}");
        let cpu = DittoConfigs::for_profile(Profile::Cpu);
        assert_eq!((cpu.lmdm.nfeats, cpu.lmdm.seq_len, cpu.motion.num_kp, cpu.motion.num_bins), (265, 80, 21, 66));
        assert_eq!(cpu.appearance.reshape_channels, cpu.warp.feature_channels);
        assert_eq!(cpu.appearance.reshape_depth, cpu.warp.depth);
        assert_eq!(cpu.warp.out_channels, cpu.spade.channels);
        assert_eq!(cpu.output_side(), 256);
        let (w, d) = cpu.frame_macs();
        eprintln!("cpu-reduced warp {:.2} GMAC, decoder {:.2} GMAC per frame", w / 1e9, d / 1e9);
        assert!(w + d < (warp + dec) / 80.0, "the reduced profile is for CPUs: {:.1} GMAC", (w + d) / 1e9);
    }
}
