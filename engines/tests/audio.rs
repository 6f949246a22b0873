//! Audio front end and MuseTalk windowing.

use cadence_engines::whisper::{self, log_mel, mel_filters, window_indices};
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
    let (mel, n) = log_mel(&x, 3000);
    assert!(n >= 3000);
    let energy = |t: usize| (0..80).map(|m| mel[m * n + t]).sum::<f32>();
    let best = (0..100).max_by(|&a, &b| energy(a).total_cmp(&energy(b))).unwrap();
    assert_eq!(best, 50);
    // A 1 kHz tone peaks in the mel band whose centre is nearest 1 kHz (band 26 or 27 on the
    // Slaney scale: 1000 Hz = mel 15, centres at 45.245*k/81).
    let x: Vec<f32> = (0..16000).map(|i| (i as f32 * 2.0 * std::f32::consts::PI * 1000.0 / 16000.0).sin()).collect();
    let (mel, n) = log_mel(&x, 3000);
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
    assert_eq!(hs.shape, vec![100, 5, 384]); // 2 s at 50 Hz
    let f = enc.encode_audio(&x, 25.0).unwrap();
    assert_eq!(f.shape, vec![50, 50, 384]);
    assert!(f.data.iter().all(|v| v.is_finite()));
    // frame 10 = steps 16..26, each step's 5 x 384 hidden states in order
    let per = 5 * 384;
    for (s, step) in (16..26).enumerate() {
        assert_eq!(
            &f.data[10 * 50 * 384 + s * per..10 * 50 * 384 + (s + 1) * per],
            &hs.data[step * per..(step + 1) * per]
        );
    }
    // the 5 hidden states differ (embedding output, then each layer)
    assert_ne!(&hs.data[0..384], &hs.data[4 * 384..5 * 384]);
    assert_eq!(enc.weights_label(), "synthetic(seed=1)");
}

#[test]
fn audio_longer_than_30s_uses_several_windows() {
    let enc = WhisperAudio::new(Profile::Cpu, &WeightsSource::Synthetic { seed: 1 }, &Device::Cpu).unwrap();
    let x: Vec<f32> = (0..16000 * 31).map(|i| 0.1 * (i as f32 * 0.01).sin()).collect();
    let hs = enc.hidden_states(&x).unwrap();
    assert_eq!(hs.shape[0], 31 * 50);
    let f = enc.encode_audio(&x, 25.0).unwrap();
    assert_eq!(f.shape, vec![31 * 25, 50, 384]);
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
        candle_core::Tensor::zeros((3, 384), candle_core::DType::F32, &Device::Cpu).unwrap(),
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
