//! Throughput of Ditto's networks (and HuBERT) on seeded inputs, for `cadence engine-bench` and
//! the `engine_bench` experiment.

use super::appearance::AppearanceFeatureExtractor;
use super::hubert::{Hubert, SAMPLE_RATE};
use super::lmdm::MotionDecoder;
use super::motion::MotionExtractor;
use super::spade::SpadeDecoder;
use super::stitch::StitchingNetwork;
use super::warp::WarpingNetwork;
use super::DittoConfigs;
use crate::bench::{test_input, time_it, BenchResult};
use crate::{Profile, Result, WeightsSource, DEFAULT_SEED};

/// One of Ditto's networks, or HuBERT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DittoNet {
    Appearance,
    Motion,
    Warp,
    Decoder,
    Stitch,
    Lmdm,
    Hubert,
}

impl DittoNet {
    /// The name `cadence engine-run` and `engine-bench` know it by.
    pub fn name(self) -> &'static str {
        match self {
            DittoNet::Appearance => "ditto-appearance",
            DittoNet::Motion => "ditto-motion",
            DittoNet::Warp => "ditto-warp",
            DittoNet::Decoder => "ditto-decoder",
            DittoNet::Stitch => "ditto-stitch",
            DittoNet::Lmdm => "ditto-lmdm",
            DittoNet::Hubert => "hubert",
        }
    }
}

/// One of Ditto's networks (or HuBERT) at `profile`'s sizes ([`DittoConfigs`]) on seeded inputs:
/// `batch` frames per call (the LMDM: one guided DDIM step on an 80-frame window per call;
/// HuBERT: 25.6 s of audio), FLOPs = 2 × the network's multiply-adds.
pub fn bench(net: DittoNet, profile: Profile, w: &WeightsSource, batch: usize, runs: usize) -> Result<BenchResult> {
    let cfg = DittoConfigs::for_profile(profile);
    let (side, fs) = (cfg.source_side, cfg.feature_side());
    let input = |shape: Vec<usize>, scale: f32| -> Vec<f32> {
        test_input(shape, DEFAULT_SEED).data.iter().map(|v| v * scale).collect()
    };
    let kp = |n: usize| input(vec![n, cfg.warp.num_kp, 3], 0.5);
    let name = format!("{} ({profile})", net.name());
    // The extractors: `batch` forwards of one source image in [0, 1] per call.
    let per_image = |macs: f64, forward: &dyn Fn(&[f32]) -> Result<()>| {
        let img = input(vec![1, 3, side, side], 0.5).iter().map(|v| v + 0.5).collect::<Vec<_>>();
        time_it(&name, batch, batch, 2.0 * macs * batch as f64, runs, || (0..batch).try_for_each(|_| forward(&img)))
    };
    Ok(match net {
        DittoNet::Appearance => {
            let net = AppearanceFeatureExtractor::new(&cfg.appearance, w)?;
            per_image(cfg.appearance.macs(side, side), &|img| net.forward(img, side, side).map(drop))?
        }
        DittoNet::Motion => {
            let net = MotionExtractor::new(&cfg.motion, w)?;
            per_image(cfg.motion.macs(side, side), &|img| net.forward(img, side, side).map(drop))?
        }
        DittoNet::Warp => {
            let net = WarpingNetwork::new(&cfg.warp, w)?;
            let f3d = input(vec![1, cfg.warp.feature_channels, cfg.warp.depth, fs, fs], 1.0);
            let (ks, kd) = (kp(1), input(vec![1, cfg.warp.num_kp, 3], 0.45));
            let flops = 2.0 * cfg.warp.macs(fs, fs) * batch as f64;
            time_it(&name, batch, batch, flops, runs, || {
                (0..batch).try_for_each(|_| net.forward(&f3d, &ks, &kd, fs, fs).map(drop))
            })?
        }
        DittoNet::Decoder => {
            let net = SpadeDecoder::new(&cfg.spade, w)?;
            let feature = input(vec![batch, cfg.spade.channels, fs, fs], 1.0);
            let flops = 2.0 * cfg.spade.macs(fs, fs) * batch as f64;
            time_it(&name, batch, batch, flops, runs, || net.forward(&feature, batch, fs, fs).map(drop))?
        }
        DittoNet::Stitch => {
            let net = StitchingNetwork::new(&cfg.stitch, w)?;
            let (ks, kd) = (kp(batch), input(vec![batch, cfg.warp.num_kp, 3], 0.45));
            let flops = 2.0 * cfg.stitch.macs() * batch as f64;
            time_it(&name, batch, batch, flops, runs, || net.forward(&ks, &kd).map(drop))?
        }
        DittoNet::Lmdm => {
            let net = MotionDecoder::new(&cfg.lmdm, w)?;
            let c = &cfg.lmdm;
            let (x, frame) = (input(vec![c.seq_len, c.nfeats], 1.0), input(vec![c.nfeats], 1.0));
            let cond = input(vec![c.seq_len, c.cond_dim], 1.0);
            // One guided step: two forwards (conditional and unconditional).
            let flops = 2.0 * 2.0 * c.macs() * batch as f64;
            time_it(&name, batch, batch * c.seq_len, flops, runs, || {
                (0..batch).try_for_each(|_| net.step(&x, &frame, &cond, 500).map(drop))
            })?
        }
        DittoNet::Hubert => {
            let net = Hubert::new(&cfg.hubert, w)?;
            let samples = (25.6 * SAMPLE_RATE as f64) as usize;
            let audio = input(vec![samples], 0.1);
            let flops = 2.0 * cfg.hubert.macs(samples);
            time_it(&name, 1, 640, flops, runs, || net.last_hidden_state(&audio).map(drop))?
        }
    })
}
