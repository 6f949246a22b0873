//! Audio front end and MuseTalk windowing.

use cadence_engines::whisper::{self, mel_filters, segment_log_mel, window_indices, SEGMENT_SAMPLES};
use cadence_engines::*;

#[test]
fn mel_filters_known_values_and_properties() {
    let f = mel_filters(16000, 400, 80);
    assert_eq!(f.len(), 80 * 201);
    // Slaney scale: top mel = 15 + ln(8)/(ln(6.4)/27) = 45.245; first centre at 45.245/81 mel
    // = 37.24 Hz; bin 1 (40 Hz) weight = upper slope (74.48-40)/(74.48-37.24) * 2/74.48 = 0.024862
    // (whisper's mel_filters.npz has 0.02486259 there).
    assert!((f[1] - 0.024_862).abs() < 2e-5, "{}", f[1]);
    assert_eq!(f[0], 0.0);
    for m in 0..80 {
        let row = &f[m * 201..(m + 1) * 201];
        assert!(row.iter().all(|&v| v >= 0.0));
        // one contiguous non-zero run (a triangle)
        let nz: Vec<usize> = (0..201).filter(|&k| row[k] > 0.0).collect();
        assert!(!nz.is_empty(), "filter {m} empty");
        assert_eq!(nz.last().unwrap() - nz[0] + 1, nz.len(), "filter {m} not contiguous");
        // Slaney normalisation: unit area in Hz (sum * 40 Hz) for filters wider than a few bins
        if m >= 20 {
            let area: f32 = row.iter().sum::<f32>() * 40.0;
            assert!((area - 1.0).abs() < 0.1, "filter {m} area {area}");
        }
    }
}

#[test]
fn log_mel_is_centred_and_pitched() {
    // An impulse at sample 160*50 gives the loudest frame 50 (torch.stft centre=True framing).
    let mut x = vec![0f32; 16000];
    x[160 * 50] = 1.0;
    let mel = segment_log_mel(&x).unwrap();
    let n = 3000;
    assert_eq!(mel.len(), 80 * n);
    let energy = |t: usize| (0..80).map(|m| mel[m * n + t]).sum::<f32>();
    let best = (0..100).max_by(|&a, &b| energy(a).total_cmp(&energy(b))).unwrap();
    assert_eq!(best, 50);
    // A 1 kHz tone peaks in the mel band whose centre is nearest 1 kHz (band 26 or 27 on the
    // Slaney scale: 1000 Hz = mel 15, centres at 45.245*k/81).
    let x: Vec<f32> = (0..16000).map(|i| (i as f32 * 2.0 * std::f32::consts::PI * 1000.0 / 16000.0).sin()).collect();
    let mel = segment_log_mel(&x).unwrap();
    let band = (0..80).max_by(|&a, &b| mel[a * n + 40].total_cmp(&mel[b * n + 40])).unwrap();
    assert!(band == 25 || band == 26, "peak band {band}");
    // whisper normalisation: max value - 8 floor, then /4 + 1 -> values within (max-2, max].
    let mx = mel.iter().cloned().fold(f32::MIN, f32::max);
    let mn = mel.iter().cloned().fold(f32::MAX, f32::min);
    assert!((mx - mn - 2.0).abs() < 1e-5, "range {}", mx - mn);
}

#[test]
fn musetalk_window_indices() {
    // frame 0: centre 0, steps -4..6 clamped
    assert_eq!(window_indices(0, 25.0, 100), vec![0, 0, 0, 0, 0, 1, 2, 3, 4, 5]);
    // frame 10 at 25 fps: centre 20
    assert_eq!(window_indices(10, 25.0, 100), (16..26).collect::<Vec<_>>());
    // end clamp
    assert_eq!(window_indices(49, 25.0, 100), vec![94, 95, 96, 97, 98, 99, 99, 99, 99, 99]);
    // 30 fps: centre floor(7 * 50/30) = 11
    assert_eq!(window_indices(7, 30.0, 100)[4], 11);
}

#[test]
fn audio_features_shape_and_layout() {
    let enc = WhisperAudio::new(Profile::Cpu, &WeightsSource::Synthetic { seed: 1 }, &Device::Cpu).unwrap();
    let x: Vec<f32> = (0..16000 * 2).map(|i| 0.2 * (i as f32 * 0.031).sin() * ((i / 4000) % 2) as f32).collect();
    let hs = enc.hidden_states(&x).unwrap();
    let d = whisper::d_model(Profile::Cpu);
    assert_eq!(enc.d_model(), d);
    assert_eq!(hs.shape, vec![100, 5, d]); // 2 s at 50 Hz
    let f = enc.encode_audio(&x, 25.0).unwrap();
    assert_eq!(f.shape, vec![50, 50, d]);
    assert!(f.data.iter().all(|v| v.is_finite()));
    // frame 10 = steps 16..26, each step's 5 x d hidden states in order
    let per = 5 * d;
    for (s, step) in (16..26).enumerate() {
        assert_eq!(&f.data[10 * 50 * d + s * per..10 * 50 * d + (s + 1) * per], &hs.data[step * per..(step + 1) * per]);
    }
    // the 5 hidden states differ (embedding output, then each layer)
    assert_ne!(&hs.data[0..d], &hs.data[4 * d..5 * d]);
    assert_eq!(enc.weights_label(), "synthetic(seed=1)");
}

#[test]
fn audio_longer_than_30s_uses_several_windows() {
    let enc = WhisperAudio::new(Profile::Cpu, &WeightsSource::Synthetic { seed: 1 }, &Device::Cpu).unwrap();
    let x: Vec<f32> = (0..16000 * 31).map(|i| 0.1 * (i as f32 * 0.01).sin()).collect();
    let hs = enc.hidden_states(&x).unwrap();
    assert_eq!(hs.shape[0], 31 * 50);
    let f = enc.encode_audio(&x, 25.0).unwrap();
    assert_eq!(f.shape, vec![31 * 25, 50, whisper::d_model(Profile::Cpu)]);
    assert!(enc.encode_audio(&[], 25.0).is_err());
    assert!(enc.encode_audio(&x, 0.0).is_err());
}

#[test]
fn whisper_file_round_trip_with_hf_prefix() {
    let d = std::env::temp_dir().join(format!("cadence-engines-audio-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("w.safetensors");
    write_synthetic_weights(ModelKind::WhisperTiny, Profile::Cpu, 4, &p).unwrap();
    // rename to the Hugging Face layout and add a decoder tensor that must be ignored
    let m = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
    let mut hf: std::collections::HashMap<String, candle_core::Tensor> =
        m.into_iter().map(|(k, v)| (format!("model.encoder.{k}"), v)).collect();
    hf.insert(
        "model.decoder.embed_tokens.weight".into(),
        candle_core::Tensor::zeros((3, whisper::d_model(Profile::Cpu)), candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    let p2 = d.join("hf.safetensors");
    candle_core::safetensors::save(&hf, &p2).unwrap();
    let x: Vec<f32> = (0..8000).map(|i| (i as f32 * 0.07).sin() * 0.1).collect();
    let a = WhisperAudio::new(Profile::Cpu, &WeightsSource::File(p2), &Device::Cpu)
        .unwrap()
        .encode_audio(&x, 25.0)
        .unwrap();
    let b = WhisperAudio::new(Profile::Cpu, &WeightsSource::Synthetic { seed: 4 }, &Device::Cpu)
        .unwrap()
        .encode_audio(&x, 25.0)
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn positional_encoding_values() {
    let pe = cadence_engines::unet::positional_encoding(50, 384);
    assert_eq!(pe[0], 0.0);
    assert_eq!(pe[1], 1.0);
    assert!((pe[384] - 1f32.sin()).abs() < 1e-7);
    assert!((pe[385] - 1f32.cos()).abs() < 1e-7);
    let w = (-2.0f64 * 10000f64.ln() / 384.0).exp();
    assert!((pe[7 * 384 + 2] as f64 - (7.0 * w).sin()).abs() < 1e-6);
    assert!((pe[7 * 384 + 3] as f64 - (7.0 * w).cos()).abs() < 1e-6);
    let _ = whisper::D_MODEL;
}

/// MuseTalk's log-mel of one 30 s segment in f64, written from its definition with a direct
/// DFT (Hugging Face `WhisperFeatureExtractor._np_extract_fbank_features`, which MuseTalk v1.5's
/// `AudioProcessor.get_audio_feature` runs per segment): zero-pad to 480,000 samples, numpy
/// reflect padding of 200 on both sides, periodic Hann, power of the one-sided DFT, Slaney mel
/// filters, `log10(max(., 1e-10))`, the first 3000 of the 3001 frames, clamp at their maximum
/// minus 8, then `/ 4 + 1`. (80, 3000) row-major.
fn reference_segment_log_mel(segment: &[f32]) -> Vec<f64> {
    const N: usize = 480_000;
    let mut padded: Vec<f64> = segment.iter().map(|&v| v as f64).collect();
    padded.resize(N, 0.0);
    let mut x: Vec<f64> = (1..=200).rev().map(|i| padded[i]).collect();
    x.extend_from_slice(&padded);
    x.extend((1..=200).map(|i| padded[N - 1 - i]));
    let frames = 1 + (x.len() - 400) / 160;
    assert_eq!(frames, 3001);
    let tau = 2.0 * std::f64::consts::PI;
    let hann: Vec<f64> = (0..400).map(|i| 0.5 - 0.5 * (tau * i as f64 / 400.0).cos()).collect();
    let (cos, sin): (Vec<f64>, Vec<f64>) =
        (0..400).map(|j| ((tau * j as f64 / 400.0).cos(), (tau * j as f64 / 400.0).sin())).unzip();
    let filters: Vec<f64> = mel_filters(16000, 400, 80).iter().map(|&w| w as f64).collect();
    let mut mel = vec![0f64; 80 * 3000];
    let mut frame = [0f64; 400];
    let mut power = [0f64; 201];
    for t in 0..3000 {
        for (n, v) in frame.iter_mut().enumerate() {
            *v = x[160 * t + n] * hann[n];
        }
        for (k, p) in power.iter_mut().enumerate() {
            let (mut re, mut im) = (0.0, 0.0);
            for (n, v) in frame.iter().enumerate() {
                re += v * cos[k * n % 400];
                im -= v * sin[k * n % 400];
            }
            *p = re * re + im * im;
        }
        for m in 0..80 {
            let e: f64 = (0..201).map(|k| filters[m * 201 + k] * power[k]).sum();
            mel[m * 3000 + t] = e.max(1e-10).log10();
        }
    }
    let floor = mel.iter().copied().fold(f64::NEG_INFINITY, f64::max) - 8.0;
    mel.iter().map(|&v| (v.max(floor) + 4.0) / 4.0).collect()
}

/// 35 s of test signal across a segment boundary: quiet noisy tones in the first segment with a
/// loud burst in its last 10 ms (the frames whose windows reach past the segment's end, and
/// the 3001st frame that the feature extractor drops), and a louder, different signal in the
/// second segment, so that the per-segment clamp and reflection differ from a whole-clip one.
fn two_segment_signal() -> Vec<f32> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..16000 * 35)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let noise = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let t = i as f32 / 16000.0;
            let tone = (t * 2.0 * std::f32::consts::PI * (220.0 + 40.0 * (t * 3.0).sin())).sin();
            match i {
                i if (SEGMENT_SAMPLES - 160..SEGMENT_SAMPLES).contains(&i) => 0.8 * tone + 0.2 * noise,
                i if i < SEGMENT_SAMPLES => (0.01 * tone + 0.002 * noise) * ((i / 4000) % 3) as f32,
                _ => 0.2 * tone * ((i / 6000) % 2) as f32 + 0.01 * noise,
            }
        })
        .collect()
}

#[test]
fn segment_log_mel_matches_an_f64_reference_of_musetalks_per_segment_rule() {
    let x = two_segment_signal();
    for (k, segment) in x.chunks(SEGMENT_SAMPLES).enumerate() {
        let got = segment_log_mel(segment).unwrap();
        let want = reference_segment_log_mel(segment);
        assert_eq!(got.len(), want.len());
        let worst = got.iter().zip(&want).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max);
        eprintln!("segment {k}: max |f32 - f64 reference| = {worst:.3e}");
        assert!(worst < 1e-4, "segment {k}: the log-mel differs from the f64 reference by {worst}");
    }
    // Short segments are zero-padded; more than 30 s is not a segment.
    let short = &x[..1000];
    let got = segment_log_mel(short).unwrap();
    let worst =
        got.iter().zip(&reference_segment_log_mel(short)).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-4, "a 1000-sample segment differs from the reference by {worst}");
    assert!(segment_log_mel(&x[..SEGMENT_SAMPLES + 1]).is_err());
}

/// Each 30 s segment depends on nothing outside it: the steps of a long clip's second segment
/// are the steps of that segment's audio encoded alone.
#[test]
fn a_clips_second_segment_is_encoded_as_if_alone() {
    let enc = WhisperAudio::new(Profile::Cpu, &WeightsSource::Synthetic { seed: 2 }, &Device::Cpu).unwrap();
    let x = two_segment_signal();
    let whole = enc.hidden_states(&x).unwrap();
    let alone = enc.hidden_states(&x[SEGMENT_SAMPLES..]).unwrap();
    let per = whisper::N_HIDDEN * whisper::d_model(Profile::Cpu);
    assert_eq!(whole.shape[0], 1500 + alone.shape[0]);
    assert!(whole.data[1500 * per..] == alone.data[..], "the second segment's steps depend on the first segment");
}
