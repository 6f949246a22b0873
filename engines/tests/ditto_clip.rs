//! Ditto's per-clip networks (`cadence_engines::ditto::{lmdm, hubert}`) against PyTorch.
//!
//! `scripts/ditto_reference_clip.py` writes, at reduced sizes with seeded weights:
//! - the LMDM MotionDecoder as `torch.save({"model_state_dict": ...})` (Ditto's checkpoint
//!   layout, rotary buffers included), one guided step at t = 499 and t = 0 (unconditional and
//!   conditional forwards, x_start, pred_noise), a 4-step DDIM sample with injected noise, the
//!   schedule's ᾱ and the DDIM times for several step counts. That reference module is
//!   bit-identical to ditto-talkinghead's own (checked when it was written).
//! - HuBERT from the real `transformers.HubertModel` (small config of the large model's kind),
//!   under the CTC checkpoint's `hubert.` prefix: the last hidden state and the first layer's
//!   output for 6480 samples, and Ditto's paired 25 fps features of a 0.5 s clip.
//!
//! Tolerances: f32 accumulation-order differences (GEMM blocking vs PyTorch's, f64 softmax and
//! statistics here), measured and given about ten times headroom, relative to the output's scale.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use cadence_engines::checkpoint::WeightsFile;
use cadence_engines::ditto::hubert::{DittoFeatureStream, Hubert, HubertConfig};
use cadence_engines::ditto::lmdm::{ddim_times, DdimNoise, LmdmConfig, MotionDecoder, NUM_TIMESTEPS};
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

/// Largest absolute difference relative to the reference's largest magnitude.
fn rel_diff(got: &[f32], want: &[f32], what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let d = got.iter().zip(want).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    assert!(scale > 0.1, "{what}: reference scale {scale}");
    eprintln!("{what}: max |diff| {d:e} at scale {scale} over {} values", got.len());
    d / scale
}

fn lmdm_small() -> LmdmConfig {
    LmdmConfig { nfeats: 10, seq_len: 12, latent: 32, ff: 48, layers: 2, heads: 4, cond_dim: 24 }
}

fn hubert_small() -> HubertConfig {
    HubertConfig {
        conv_dim: vec![16; 7],
        hidden: 32,
        layers: 2,
        heads: 4,
        intermediate: 64,
        pos_kernel: 16,
        pos_groups: 4,
        ..HubertConfig::default()
    }
}

fn lmdm() -> MotionDecoder {
    MotionDecoder::new(&lmdm_small(), &WeightsSource::File(fixture("lmdm.pth"))).unwrap()
}

#[test]
fn lmdm_table_is_the_state_dict_without_rotary_buffers() {
    // The checkpoint reader unwraps the top-level `model_state_dict` entry.
    let ck = WeightsFile::open(&fixture("lmdm.pth")).unwrap().checkpoint;
    assert!(ck.tensors.iter().filter(|t| t.name.ends_with("rotary.freqs")).count() == 5);
    let mut file: Vec<(String, Vec<usize>)> = ck
        .tensors
        .iter()
        .filter(|t| !t.name.ends_with("rotary.freqs"))
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    let mut ours: Vec<(String, Vec<usize>)> =
        lmdm_small().param_table().entries.iter().map(|e| (e.name.clone(), e.shape.clone())).collect();
    file.sort();
    ours.sort();
    assert_eq!(ours, file);
}

#[test]
fn lmdm_forward_and_guided_step_match_pytorch() {
    let net = lmdm();
    let t = io("lmdm_io.safetensors");
    let (x, cf, c) = (values(&t, "in.x"), values(&t, "in.cond_frame"), values(&t, "in.cond"));
    // Two encoder and two decoder layers of 32-wide GEMMs: measured 1.6e-7 .. 5.2e-7 relative.
    let unc = net.forward(&x, &cf, &c, 499, false).unwrap();
    assert!(rel_diff(&unc, &values(&t, "out.unc"), "unconditional") < 5e-6);
    let con = net.forward(&x, &cf, &c, 499, true).unwrap();
    assert!(rel_diff(&con, &values(&t, "out.cond"), "conditional") < 5e-6);
    let s = net.step(&x, &cf, &c, 499).unwrap();
    assert!(rel_diff(&s.x_start, &values(&t, "out.x_start"), "x_start") < 5e-6);
    assert!(rel_diff(&s.pred_noise, &values(&t, "out.pred_noise"), "pred_noise") < 5e-6);
    let s0 = net.step(&x, &cf, &c, 0).unwrap();
    assert!(rel_diff(&s0.x_start, &values(&t, "out.x_start_t0"), "x_start at t = 0") < 5e-6);
}

#[test]
fn lmdm_ddim_sample_with_injected_noise_matches_pytorch() {
    let net = lmdm();
    let t = io("lmdm_io.safetensors");
    let len = 12 * 10;
    let z = values(&t, "in.noise");
    let noise = DdimNoise { init: values(&t, "in.x_init"), steps: z.chunks(len).map(<[f32]>::to_vec).collect() };
    let got = net.sample(&values(&t, "in.cond_frame"), &values(&t, "in.cond"), 4, &noise).unwrap();
    // Four guided steps (eight forwards): measured 7.6e-7 relative.
    assert!(rel_diff(&got, &values(&t, "out.sample"), "DDIM sample") < 6e-6);
    // A seeded default is deterministic and differs by seed.
    let a = DdimNoise::seeded(1, 4, len);
    assert_eq!(a, DdimNoise::seeded(1, 4, len));
    assert_ne!(a.init, DdimNoise::seeded(2, 4, len).init);
    assert_eq!(a.steps.len(), 3);
}

#[test]
fn lmdm_schedule_and_times_are_dittos() {
    let net = lmdm();
    let t = io("lmdm_io.safetensors");
    let want = values(&t, "alphas_cumprod");
    // PyTorch's f32 buffer: equal to within one f32 rounding.
    for (i, (g, w)) in net.alphas_cumprod().iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1.2e-7 * w.abs(), "alphas_cumprod[{i}]: {g} vs {w}");
    }
    assert_eq!(net.alphas_cumprod().len(), NUM_TIMESTEPS);
    for s in [1usize, 3, 4, 7, 50, 1000] {
        let want: Vec<i64> = t[&format!("times.{s}")].to_vec1::<i64>().unwrap();
        let got = ddim_times(s, NUM_TIMESTEPS);
        assert_eq!(&got[..s], &want[..], "{s} steps");
        assert_eq!(got[s], -1);
    }
}

#[test]
fn lmdm_bad_input_is_a_clear_error() {
    let net = lmdm();
    let (x, cf, c) = (vec![0.1f32; 120], vec![0.0f32; 10], vec![0.0f32; 12 * 24]);
    let err = |r: cadence_engines::Result<Vec<f32>>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(net.forward(&x[..119], &cf, &c, 5, true)).contains("`x`"));
    assert!(err(net.forward(&x, &cf[..9], &c, 5, true)).contains("cond_frame"));
    let mut nan = c.clone();
    nan[7] = f32::NAN;
    let e = err(net.forward(&x, &cf, &nan, 5, true));
    assert!(e.contains("`cond`") && e.contains("NaN"), "{e}");
    assert!(err(net.forward(&x, &cf, &c, 1000, true)).contains("time_cond"));
    assert!(net.sample(&cf, &c, 4, &DdimNoise::seeded(0, 3, 120)).is_err());
    // A file missing a tensor names it.
    let e = MotionDecoder::new(&LmdmConfig { layers: 3, ..lmdm_small() }, &WeightsSource::File(fixture("lmdm.pth")))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("seqTransDecoder.stack.2."), "{e}");
}

#[test]
fn hubert_matches_transformers() {
    let cfg = hubert_small();
    let net = Hubert::new(&cfg, &WeightsSource::File(fixture("hubert_weights.safetensors"))).unwrap();
    let t = io("hubert_io.safetensors");
    let audio = values(&t, "in.audio");
    assert_eq!(cfg.frames(audio.len()), 20);
    // Seven strided convolutions with LayerNorm, a grouped positional convolution of 16 taps
    // and two layers: measured 1.8e-6 relative (the final LayerNorm scales the differences up),
    // 1.3e-6 for the paired features, 1.8e-6 for the first layer's output.
    let last = net.last_hidden_state(&audio).unwrap();
    assert!(rel_diff(&last, &values(&t, "out.last_hidden_state"), "last_hidden_state") < 2e-5);
    let first = net.layer_output(&audio, 1).unwrap();
    assert!(rel_diff(&first, &values(&t, "out.hidden_state_1"), "first layer") < 2e-5);
    let feats = net.ditto_features(&values(&t, "in.clip")).unwrap();
    assert!(rel_diff(&feats, &values(&t, "out.ditto_features"), "Ditto's 25 fps features") < 2e-5);
    assert_eq!(feats.len(), 13 * 32);
}

/// The live stream's features, fed in uneven pieces and stepped after each, are the whole clip's
/// (bit for bit: each chunk is encoded on its own) and PyTorch's; each chunk comes out as soon
/// as its audio has arrived, not at the end.
#[test]
fn hubert_feature_stream_gives_the_whole_clip_features_as_audio_arrives() {
    let net = Hubert::new(&hubert_small(), &WeightsSource::File(fixture("hubert_weights.safetensors"))).unwrap();
    let t = io("hubert_io.safetensors");
    let clip = values(&t, "in.clip");
    let whole = net.ditto_features(&clip).unwrap();
    let h = 32;
    let mut stream = DittoFeatureStream::new();
    let (mut got, mut at) = (Vec::new(), 0);
    for piece in [1usize, 700, 333, 2048, 5].iter().cycle() {
        if at >= clip.len() {
            break;
        }
        let to = (at + piece).min(clip.len());
        stream.push(&clip[at..to]).unwrap();
        at = to;
        got.extend(stream.step(&net).unwrap());
        // The chunk of frames f..f + 5 is 6480 samples from f x 640 of the audio behind 2000
        // zeros: it has arrived once 640 (f + 7) samples have (so all its frames are the clip's).
        let ready = (0..).step_by(5).take_while(|&f: &usize| 640 * (f + 7) <= at).count();
        assert_eq!(got.len(), ready * 5 * h, "after {at} samples");
    }
    assert!(!stream.is_done());
    stream.finish();
    got.extend(stream.step(&net).unwrap());
    assert!(stream.is_done());
    assert_eq!(stream.frames_total(), Some(whole.len() / h));
    assert_eq!(got.len(), whole.len());
    assert!(got.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()), "the stream's rows are the clip's");
    assert!(rel_diff(&got, &values(&t, "out.ditto_features"), "streamed features") < 2e-5);
    let mut bad = DittoFeatureStream::new();
    assert!(bad.push(&[0.0, f32::NAN]).unwrap_err().to_string().contains("sample 1"));
    bad.finish();
    assert!(bad.push(&[0.0]).is_err());
}

#[test]
fn hubert_bad_input_is_a_clear_error() {
    let net = Hubert::new(&hubert_small(), &WeightsSource::File(fixture("hubert_weights.safetensors"))).unwrap();
    let mut a = vec![0.1f32; 1000];
    a[3] = f32::INFINITY;
    assert!(net.last_hidden_state(&a).unwrap_err().to_string().contains("sample 3"));
    assert!(net.ditto_features(&a).is_err());
    assert!(net.ditto_features(&[]).is_err());
    assert!(net.last_hidden_state(&[0.0; 399]).is_err());
    // A file of another size names the first misshaped tensor.
    let e = Hubert::new(
        &HubertConfig { hidden: 64, ..hubert_small() },
        &WeightsSource::File(fixture("hubert_weights.safetensors")),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("feature_projection.projection.weight"), "{e}");
}

#[test]
fn full_size_tables_are_dittos_and_hubert_large() {
    // LMDM: 47.8 M parameters including the rotary buffers' absence (they are not learned).
    let l = LmdmConfig::default().param_table().num_params();
    assert!((47_000_000..48_500_000).contains(&l), "LMDM {l}");
    let gmac = LmdmConfig::default().macs() / 1e9;
    assert!((2.3..2.8).contains(&gmac), "LMDM {gmac} GMAC");
    // hubert-large: 315.4 M parameters without masked_spec_embed.
    let h = HubertConfig::default().param_table().num_params();
    assert!((315_000_000..316_000_000).contains(&h), "HuBERT {h}");
    assert_eq!(HubertConfig::default().frames(16_000), 49);
    assert_eq!(HubertConfig::default().frames(6480), 20);
}

fn time(what: &str, mut f: impl FnMut()) {
    f();
    let t = Instant::now();
    f();
    eprintln!("{what}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
}

/// Full-size forwards on synthetic weights (timings printed; `--ignored` because building
/// HuBERT-large's 315 M synthetic parameters takes a while).
#[test]
#[ignore]
fn full_size_forwards_with_synthetic_weights() {
    let net = MotionDecoder::new(&LmdmConfig::default(), &WeightsSource::Synthetic { seed: 3 }).unwrap();
    let (x, cf, c) = (vec![0.1f32; 80 * 265], vec![0.0f32; 265], vec![0.05f32; 80 * 1103]);
    time("LMDM forward (conditional, full size)", || {
        assert!(net.forward(&x, &cf, &c, 999, true).unwrap().iter().all(|v| v.is_finite()))
    });
    time("LMDM guided step (2 forwards)", || assert_eq!(net.step(&x, &cf, &c, 999).unwrap().x_start.len(), 80 * 265));
    let h = Hubert::new(&HubertConfig::default(), &WeightsSource::Synthetic { seed: 3 }).unwrap();
    let audio: Vec<f32> = (0..16_000).map(|i| 0.1 * (i as f32 * 0.05).sin()).collect();
    time("HuBERT-large, 1 s of audio", || {
        let o = h.last_hidden_state(&audio).unwrap();
        assert_eq!(o.len(), 49 * 1024);
        assert!(o.iter().all(|v| v.is_finite()));
    });
    time("HuBERT-large, Ditto features of 1 s", || assert_eq!(h.ditto_features(&audio).unwrap().len(), 25 * 1024));
}
