//! Ditto's networks (`cadence_engines::ditto`) against independent PyTorch references.
//!
//! `scripts/ditto_reference.py` builds each network in PyTorch from the module descriptions
//! (nn.Linear/Conv2d/Conv3d, `spectral_norm`, InstanceNorm2d, BatchNorm, `F.grid_sample`), at a
//! reduced size with seeded weights, non-trivial BatchNorm statistics and power-iterated
//! spectral-norm vectors, and writes its state dict (published names), inputs and outputs to
//! `fixtures/ditto/`. Here the CPU path loads those state dicts by name and must reproduce the
//! outputs. Tolerances are f32 accumulation-order differences (im2col GEMM vs PyTorch's
//! convolutions, f64 vs f32 statistics), measured and given about ten times headroom.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use cadence_engines::checkpoint::WeightsFile;
use cadence_engines::ditto::appearance::{AppearanceConfig, AppearanceFeatureExtractor};
use cadence_engines::ditto::motion::{MotionConfig, MotionExtractor, HEADS};
use cadence_engines::ditto::spade::{SpadeConfig, SpadeDecoder};
use cadence_engines::ditto::stitch::{StitchConfig, StitchingNetwork};
use cadence_engines::ditto::warp::{WarpConfig, WarpingNetwork};
use cadence_engines::weights::ParamTable;
use cadence_engines::{Device, Tensor, WeightsSource};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ditto").join(name)
}

fn io(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(name), &Device::Cpu).expect("fixture")
}

fn values(t: &HashMap<String, Tensor>, name: &str) -> Vec<f32> {
    t[name].flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Largest absolute difference.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths");
    let d = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    eprintln!("max |diff| {d:e} over {} values", a.len());
    d
}

/// The fixtures' configurations (see scripts/ditto_reference.py).
fn spade_small() -> SpadeConfig {
    SpadeConfig { channels: 8, out_channels: 4, hidden: 8 }
}

fn warp_small() -> WarpConfig {
    WarpConfig {
        num_kp: 3,
        feature_channels: 4,
        depth: 4,
        compress: 2,
        block_expansion: 4,
        max_features: 16,
        num_blocks: 3,
        out_channels: 8,
    }
}

/// The table's names and shapes are exactly the float tensors of PyTorch's state dict.
fn assert_table_is_state_dict(table: &ParamTable, file: &str) {
    let ck = WeightsFile::open(&fixture(file)).unwrap().checkpoint;
    let mut file_float: Vec<(String, Vec<usize>)> =
        ck.tensors.iter().filter(|t| t.float_dtype().is_some()).map(|t| (t.name.clone(), t.shape.clone())).collect();
    let mut ours: Vec<(String, Vec<usize>)> = table.entries.iter().map(|e| (e.name.clone(), e.shape.clone())).collect();
    file_float.sort();
    ours.sort();
    assert_eq!(ours, file_float, "{file}: table vs state dict");
}

#[test]
fn stitching_matches_pytorch_from_dittos_checkpoint_layout() {
    // {"retarget_shoulder": {"module.mlp.*"}, "retarget_mouth": {...}} as torch.save wrote it.
    let net = StitchingNetwork::new(&StitchConfig::default(), &WeightsSource::File(fixture("stitch.pth"))).unwrap();
    let t = io("stitch_io.safetensors");
    let got = net.forward(&values(&t, "in.kp_source"), &values(&t, "in.kp_driving")).unwrap();
    // Four small GEMMs: measured ~1e-7.
    let d = max_diff(&got, &values(&t, "out.kp"));
    assert!(d < 2e-6, "stitching: max |diff| {d}");
    assert!(net.forward(&[0.0; 63], &[0.0; 60]).is_err());
}

#[test]
fn stitching_table_is_dittos() {
    let t = StitchConfig::default().param_table();
    let shapes: Vec<_> = t.entries.iter().map(|e| (e.name.as_str(), e.shape.clone())).collect();
    assert_eq!(shapes[0], ("mlp.0.weight", vec![128, 126]));
    assert_eq!(shapes[6], ("mlp.6.weight", vec![65, 64]));
    assert_eq!(t.num_params(), 126 * 128 + 128 + 128 * 128 + 128 + 128 * 64 + 64 + 64 * 65 + 65);
}

#[test]
fn spade_decoder_matches_pytorch() {
    let cfg = spade_small();
    assert_table_is_state_dict(&cfg.param_table(), "spade_weights.safetensors");
    let net = SpadeDecoder::new(&cfg, &WeightsSource::File(fixture("spade_weights.safetensors"))).unwrap();
    let t = io("spade_io.safetensors");
    let got = net.forward(&values(&t, "in.feature"), 1, 8, 8).unwrap();
    let want = values(&t, "out.image");
    // Output in (0, 1) after a sigmoid; measured max |diff| ~1e-7 .. 1e-6.
    let d = max_diff(&got, &want);
    assert!(d < 1e-5, "SPADE decoder: max |diff| {d}");
}

#[test]
fn warping_network_matches_pytorch() {
    let cfg = warp_small();
    assert_table_is_state_dict(&cfg.param_table(), "warp_weights.safetensors");
    let net = WarpingNetwork::new(&cfg, &WeightsSource::File(fixture("warp_weights.safetensors"))).unwrap();
    let t = io("warp_io.safetensors");
    let (f, s, d) = (values(&t, "in.feature_3d"), values(&t, "in.kp_source"), values(&t, "in.kp_driving"));
    let dm = net.dense_motion(&f, &s, &d, 16, 16).unwrap();
    // Deformation: grid coordinates in about [-2, 2]; occlusion in (0, 1).
    let dd = max_diff(&dm.deformation, &values(&t, "out.deformation"));
    assert!(dd < 1e-5, "deformation: max |diff| {dd}");
    let od = max_diff(&dm.occlusion, &values(&t, "out.occlusion"));
    assert!(od < 1e-5, "occlusion: max |diff| {od}");
    let got = net.forward(&f, &s, &d, 16, 16).unwrap();
    let o = max_diff(&got, &values(&t, "out.out"));
    assert!(o < 1e-5, "warping network: max |diff| {o}");
    assert!(net.forward(&f, &s, &d, 16, 8).is_err());
}

#[test]
fn appearance_extractor_matches_pytorch() {
    let cfg = AppearanceConfig {
        image_channels: 3,
        block_expansion: 4,
        num_down_blocks: 2,
        max_features: 16,
        reshape_channels: 4,
        reshape_depth: 4,
        num_resblocks: 2,
    };
    assert_table_is_state_dict(&cfg.param_table(), "appearance_weights.safetensors");
    let net =
        AppearanceFeatureExtractor::new(&cfg, &WeightsSource::File(fixture("appearance_weights.safetensors"))).unwrap();
    let t = io("appearance_io.safetensors");
    let got = net.forward(&values(&t, "in.image"), 16, 16).unwrap();
    let want = values(&t, "out.feature_3d");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = max_diff(&got, &want);
    assert!(d < 1e-5 * scale.max(1.0), "appearance extractor: max |diff| {d} (scale {scale})");
    assert!(net.forward(&values(&t, "in.image"), 16, 15).is_err());
}

#[test]
fn motion_extractor_matches_pytorch() {
    let cfg = MotionConfig { depths: [1, 1, 2, 1], dims: [8, 16, 24, 32], num_kp: 3, num_bins: 5 };
    assert_table_is_state_dict(&cfg.param_table(), "motion_weights.safetensors");
    let net = MotionExtractor::new(&cfg, &WeightsSource::File(fixture("motion_weights.safetensors"))).unwrap();
    let t = io("motion_io.safetensors");
    let got = net.forward(&values(&t, "in.image"), 64, 64).unwrap();
    for (head, got) in HEADS.iter().zip(&got) {
        // Logits of order 1; GELU's erf is Abramowitz & Stegun's (6e-7 absolute).
        let d = max_diff(got, &values(&t, &format!("out.{head}")));
        assert!(d < 2e-5, "motion extractor `{head}`: max |diff| {d}");
    }
    assert!(net.forward(&[0.0; 3 * 48 * 48], 48, 48).is_err());
}

#[test]
fn full_size_tables_and_costs_are_liveportraits() {
    // Learned parameters as PyTorch counts them (`sum(p.numel() for p in m.parameters())` of the
    // reference modules at full size: 55,365,388 and 45,529,829; LivePortrait's speed.md rounds
    // to 55.37 M and 45.53 M); buffers (spectral-norm vectors, running statistics) excluded.
    // MACs against LivePortrait's 446 and 171 GMAC.
    let learned = |t: &ParamTable| -> usize {
        let buffer = |n: &str| ["weight_u", "weight_v", "running_mean", "running_var"].iter().any(|b| n.ends_with(b));
        t.entries.iter().filter(|e| !buffer(&e.name)).map(|e| e.shape.iter().product::<usize>()).sum()
    };
    let spade = SpadeConfig::default();
    assert_eq!(learned(&spade.param_table()), 55_365_388);
    let m = spade.macs(64, 64) / 1e9;
    assert!((m - 446.0).abs() < 2.0, "decoder: {m} GMAC");
    let warp = WarpConfig::default();
    assert_eq!(learned(&warp.param_table()), 45_529_829);
    let m = warp.macs(64, 64) / 1e9;
    assert!((m - 171.0).abs() < 2.0, "warp: {m} GMAC");
    // Appearance extractor: 836,224 parameters (0.84 M), about 32 GMAC per 256x256 image.
    let ap = AppearanceConfig::default();
    assert_eq!(learned(&ap.param_table()), 836_224);
    let m = ap.macs(256, 256) / 1e9;
    assert!((m - 32.0).abs() < 0.5, "appearance: {m} GMAC");
    // Motion extractor (ConvNeXtV2-tiny): 28,118,728 parameters (28.1 M), about 5.8 GMAC.
    let me = MotionConfig::default();
    assert_eq!(learned(&me.param_table()), 28_118_728);
    let m = me.macs(256, 256) / 1e9;
    assert!((m - 5.8).abs() < 0.3, "motion: {m} GMAC");
}

/// Runs `f` three times and prints the median.
fn time3(what: &str, mut f: impl FnMut()) {
    let mut t: Vec<f64> = (0..3)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    eprintln!("{what}: median of 3 forwards {:.3} ms ({t:.4?} s)", t[1] * 1e3);
}

#[test]
#[ignore = "full size: tens of seconds on two cores"]
fn full_size_networks_run_with_synthetic_weights() {
    let seed = WeightsSource::Synthetic { seed: 7 };
    let stitch = StitchingNetwork::new(&StitchConfig::default(), &seed).unwrap();
    let kp: Vec<f32> = (0..63).map(|i| (i as f32 * 0.37).sin() * 0.5).collect();
    time3("stitching", || assert_eq!(stitch.forward(&kp, &kp).unwrap().len(), 63));

    let warp = WarpingNetwork::new(&WarpConfig::default(), &seed).unwrap();
    let f3d: Vec<f32> = (0..32 * 16 * 64 * 64).map(|i| ((i % 977) as f32 * 0.013).sin()).collect();
    let kp_d: Vec<f32> = kp.iter().map(|v| v * 1.05 + 0.01).collect();
    let mut out = Vec::new();
    time3("warping network", || out = warp.forward(&f3d, &kp, &kp_d, 64, 64).unwrap());
    assert_eq!(out.len(), 256 * 64 * 64);
    assert!(out.iter().all(|v| v.is_finite()));

    let ap = AppearanceFeatureExtractor::new(&AppearanceConfig::default(), &seed).unwrap();
    let img: Vec<f32> = (0..3 * 256 * 256).map(|i| (i % 251) as f32 / 251.0).collect();
    let mut vol = Vec::new();
    time3("appearance extractor", || vol = ap.forward(&img, 256, 256).unwrap());
    assert_eq!(vol.len(), 32 * 16 * 64 * 64);
    assert!(vol.iter().all(|v| v.is_finite()));

    let me = MotionExtractor::new(&MotionConfig::default(), &seed).unwrap();
    let mut heads = Vec::new();
    time3("motion extractor", || heads = me.forward(&img, 256, 256).unwrap());
    assert_eq!(heads.iter().map(Vec::len).collect::<Vec<_>>(), [66, 66, 66, 3, 63, 1, 63]);

    let dec = SpadeDecoder::new(&SpadeConfig::default(), &seed).unwrap();
    let mut img = Vec::new();
    time3("SPADE decoder", || img = dec.forward(&out, 1, 64, 64).unwrap());
    assert_eq!(img.len(), 3 * 512 * 512);
    assert!(img.iter().all(|v| (0.0..=1.0).contains(v)));
}

#[test]
fn synthetic_weights_are_seeded_and_usable_at_reduced_size() {
    // Same seed, same output; another seed, another output; values finite (the spectral-norm
    // vectors are power-iterated, so the folded weights are well scaled).
    let (s1, s2) = (WeightsSource::Synthetic { seed: 1 }, WeightsSource::Synthetic { seed: 2 });
    let feature: Vec<f32> = (0..8 * 8 * 8).map(|i| (i as f32 * 0.1).sin()).collect();
    let run = |s: &WeightsSource| SpadeDecoder::new(&spade_small(), s).unwrap().forward(&feature, 1, 8, 8).unwrap();
    let (a, b, c) = (run(&s1), run(&s1), run(&s2));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|v| v.is_finite() && (0.0..=1.0).contains(v)));
    let f3d: Vec<f32> = (0..4 * 4 * 16 * 16).map(|i| (i as f32 * 0.37).cos()).collect();
    let kp = [0.1, -0.2, 0.3, 0.5, 0.0, -0.4, -0.6, 0.2, 0.1];
    let kd: Vec<f32> = kp.iter().map(|v| v + 0.05).collect();
    let run =
        |s: &WeightsSource| WarpingNetwork::new(&warp_small(), s).unwrap().forward(&f3d, &kp, &kd, 16, 16).unwrap();
    let (a, b) = (run(&s1), run(&s1));
    assert_eq!(a, b);
    assert!(a.iter().all(|v| v.is_finite()) && a.iter().any(|v| *v != 0.0));
}

#[test]
fn a_file_of_another_network_is_refused_by_tensor_name() {
    let err = SpadeDecoder::new(&spade_small(), &WeightsSource::File(fixture("warp_weights.safetensors")))
        .err()
        .expect("a warping network's weights are not a decoder's")
        .to_string();
    assert!(err.contains("fc.weight"), "{err}");
    // The right network at the wrong size: a shape error naming the tensor.
    let mut cfg = warp_small();
    cfg.out_channels = 16;
    let err = WarpingNetwork::new(&cfg, &WeightsSource::File(fixture("warp_weights.safetensors")))
        .err()
        .expect("wrong width")
        .to_string();
    assert!(err.contains("third.conv.weight"), "{err}");
}
