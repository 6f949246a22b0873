//! Weights: determinism of synthetic weights, safetensors round trip, and errors naming tensors.

use cadence_engines::bench::test_input;
use cadence_engines::*;

/// The audio feature width at the reduced profile (this machine's scale arm).
fn audio_width() -> usize {
    unet::audio_dim(Profile::Cpu)
}
use candle_core::Tensor;
use std::collections::HashMap;
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cadence-engines-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn syn(seed: u64) -> WeightsSource {
    WeightsSource::Synthetic { seed }
}

#[test]
fn synthetic_weights_are_deterministic_per_seed() {
    let x = test_input(vec![1, 4, 8, 8], 3);
    let a = Taesd::decoder(Profile::Cpu, &syn(5), &Device::Cpu).unwrap().decode(&x).unwrap();
    let b = Taesd::decoder(Profile::Cpu, &syn(5), &Device::Cpu).unwrap().decode(&x).unwrap();
    let c = Taesd::decoder(Profile::Cpu, &syn(6), &Device::Cpu).unwrap().decode(&x).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn unet_synthetic_deterministic_and_sane() {
    let lat = test_input(vec![2, 8, 32, 32], 7);
    let aud = test_input(vec![2, 50, audio_width()], 8);
    let u1 = MuseTalkUnet::new(Profile::Cpu, &syn(9), &Device::Cpu).unwrap();
    let u2 = MuseTalkUnet::new(Profile::Cpu, &syn(9), &Device::Cpu).unwrap();
    let y1 = u1.predict(&lat, &aud).unwrap();
    assert_eq!(y1.shape, vec![2, 4, 32, 32]);
    assert_eq!(y1, u2.predict(&lat, &aud).unwrap());
    let n = y1.data.len() as f64;
    let mean = y1.data.iter().map(|&v| v as f64).sum::<f64>() / n;
    let std = (y1.data.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    assert!(y1.data.iter().all(|v| v.is_finite()));
    assert!((0.05..20.0).contains(&std), "UNet output std {std}");
    // The audio conditions the output (cross-attention is live).
    let aud2 = test_input(vec![2, 50, audio_width()], 80);
    assert_ne!(y1, u1.predict(&lat, &aud2).unwrap());
    // Batch elements are independent: element 1 of a batch equals a batch of one.
    let one = u1
        .predict(
            &Batch::new(vec![1, 8, 32, 32], lat.data[8 * 1024..].to_vec()).unwrap(),
            &Batch::new(vec![1, 50, audio_width()], aud.data[50 * audio_width()..].to_vec()).unwrap(),
        )
        .unwrap();
    for (a, b) in one.data.iter().zip(&y1.data[4 * 1024..]) {
        assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
fn round_trip_through_safetensors_is_bit_exact() {
    let x = test_input(vec![1, 4, 8, 8], 3);
    let p = tmp("taesd_dec.safetensors");
    write_synthetic_weights(ModelKind::TaesdDecoder, Profile::Cpu, 77, &p).unwrap();
    let from_file = Taesd::decoder(Profile::Cpu, &WeightsSource::File(p.clone()), &Device::Cpu).unwrap();
    let synthetic = Taesd::decoder(Profile::Cpu, &syn(77), &Device::Cpu).unwrap();
    assert_eq!(from_file.decode(&x).unwrap(), synthetic.decode(&x).unwrap());
    assert_eq!(from_file.weights_label(), format!("real({})", p.display()));

    let p = tmp("unet.safetensors");
    write_synthetic_weights(ModelKind::MuseTalkUnet, Profile::Cpu, 3, &p).unwrap();
    let lat = test_input(vec![1, 8, 32, 32], 1);
    let aud = test_input(vec![1, 50, audio_width()], 2);
    let a =
        MuseTalkUnet::new(Profile::Cpu, &WeightsSource::File(p), &Device::Cpu).unwrap().predict(&lat, &aud).unwrap();
    let b = MuseTalkUnet::new(Profile::Cpu, &syn(3), &Device::Cpu).unwrap().predict(&lat, &aud).unwrap();
    assert_eq!(a, b);

    let p = tmp("vae.safetensors");
    write_synthetic_weights(ModelKind::SdVaeDecoder, Profile::Cpu, 4, &p).unwrap();
    let z = test_input(vec![1, 4, 4, 4], 5);
    let a = SdVae::decoder(Profile::Cpu, &WeightsSource::File(p.clone()), &Device::Cpu).unwrap().decode(&z).unwrap();
    let b = SdVae::decoder(Profile::Cpu, &syn(4), &Device::Cpu).unwrap().decode(&z).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.shape, vec![1, 3, 32, 32]);
    let img = test_input(vec![1, 3, 32, 32], 6);
    let a = SdVae::encoder(Profile::Cpu, &WeightsSource::File(p), &Device::Cpu).unwrap().encode(&img).unwrap();
    let b = SdVae::encoder(Profile::Cpu, &syn(4), &Device::Cpu).unwrap().encode(&img).unwrap();
    assert_eq!(a, b, "encoder returns the posterior mean (deterministic, no sampling noise)");
    assert_eq!(a.shape, vec![1, 4, 4, 4]);
}

/// Loads a synthetic TAESD decoder file as a map, lets `edit` break it, writes it back.
fn broken_file(name: &str, edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> PathBuf {
    let p = tmp(name);
    write_synthetic_weights(ModelKind::TaesdDecoder, Profile::Cpu, 1, &p).unwrap();
    let mut m = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
    edit(&mut m);
    candle_core::safetensors::save(&m, &p).unwrap();
    p
}

fn decoder_err(p: PathBuf) -> EngineError {
    match Taesd::decoder(Profile::Cpu, &WeightsSource::File(p), &Device::Cpu) {
        Ok(_) => panic!("broken file loaded"),
        Err(e) => e,
    }
}

#[test]
fn missing_tensor_is_named() {
    let p = broken_file("missing.safetensors", |m| {
        m.remove("7.weight");
    });
    let e = decoder_err(p);
    assert!(matches!(&e, EngineError::MissingTensor { name, .. } if name == "7.weight"), "{e}");
    assert!(e.to_string().contains("`7.weight`"), "{e}");
}

#[test]
fn wrong_shape_is_named() {
    let p = broken_file("shape.safetensors", |m| {
        m.insert(
            "3.conv.0.weight".into(),
            Tensor::zeros((16, 16, 1, 3), candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
    });
    let e = decoder_err(p);
    assert!(
        matches!(&e, EngineError::ShapeMismatch { name, found, .. } if name == "3.conv.0.weight" && found == &vec![16, 16, 1, 3]),
        "{e}"
    );
}

#[test]
fn wrong_dtype_is_named() {
    let p = broken_file("dtype.safetensors", |m| {
        m.insert("19.bias".into(), Tensor::zeros(3, candle_core::DType::U32, &Device::Cpu).unwrap());
    });
    let e = decoder_err(p);
    assert!(matches!(&e, EngineError::BadDtype { name, .. } if name == "19.bias"), "{e}");
}

#[test]
fn half_precision_files_load() {
    let p = broken_file("f16.safetensors", |m| {
        for v in m.values_mut() {
            *v = v.to_dtype(candle_core::DType::F16).unwrap();
        }
    });
    let d = Taesd::decoder(Profile::Cpu, &WeightsSource::File(p), &Device::Cpu).unwrap();
    let y = d.decode(&test_input(vec![1, 4, 4, 4], 1)).unwrap();
    assert_eq!(y.shape, vec![1, 3, 32, 32]);
}

#[test]
fn full_profile_file_rejected_by_cpu_profile_with_tensor_name() {
    let p = tmp("taesd_full.safetensors");
    write_synthetic_weights(ModelKind::TaesdDecoder, Profile::Full, 1, &p).unwrap();
    let e = decoder_err(p);
    assert!(matches!(&e, EngineError::ShapeMismatch { name, .. } if name == "1.weight"), "{e}");
}

#[test]
fn unreadable_files_are_clear_errors() {
    let e = decoder_err(tmp("does_not_exist.safetensors"));
    assert!(matches!(e, EngineError::Io { .. }), "{e}");
    let p = tmp("garbage.safetensors");
    std::fs::write(&p, b"not a safetensors file at all").unwrap();
    let e = decoder_err(p);
    assert!(matches!(e, EngineError::BadFile { .. }), "{e}");
}

#[test]
fn prefixed_keys_are_accepted() {
    // A VAE file with the `vae.` prefix and old attention names (query/key/value/proj_attn),
    // attention projections stored as 1x1 convs.
    let p = tmp("vae_old.safetensors");
    write_synthetic_weights(ModelKind::SdVaeDecoder, Profile::Cpu, 2, &p).unwrap();
    let m = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
    let mut old = HashMap::new();
    for (k, v) in m {
        let k2 = k
            .replace("attentions.0.to_q.", "attentions.0.query.")
            .replace("attentions.0.to_k.", "attentions.0.key.")
            .replace("attentions.0.to_v.", "attentions.0.value.")
            .replace("attentions.0.to_out.0.", "attentions.0.proj_attn.");
        let v = if k2 != k && k2.ends_with("weight") { v.unsqueeze(2).unwrap().unsqueeze(3).unwrap() } else { v };
        old.insert(format!("vae.{k2}"), v);
    }
    let p2 = tmp("vae_old2.safetensors");
    candle_core::safetensors::save(&old, &p2).unwrap();
    let z = test_input(vec![1, 4, 4, 4], 5);
    let a = SdVae::decoder(Profile::Cpu, &WeightsSource::File(p2), &Device::Cpu).unwrap().decode(&z).unwrap();
    let b = SdVae::decoder(Profile::Cpu, &syn(2), &Device::Cpu).unwrap().decode(&z).unwrap();
    assert_eq!(a, b);
}

#[test]
fn flat_models_folder_of_safetensors_files() {
    // cadence's own flat names are the last place a models folder is searched.
    let dir = tmp("models-flat");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("taesd_decoder.safetensors");
    write_synthetic_weights(ModelKind::TaesdDecoder, Profile::Cpu, 4, &f).unwrap();
    let models = ModelsDir::open(&dir).unwrap();
    assert_eq!(models.weights(ModelKind::TaesdDecoder).unwrap(), WeightsSource::File(f));
    assert!(models.weights(ModelKind::TaesdEncoder).is_err(), "no silent synthetic fallback");
    assert!(models.check(ModelKind::TaesdDecoder, Profile::Cpu).loads());
    assert_eq!(models.check(ModelKind::TaesdDecoder, Profile::Cpu).format.as_deref(), Some("safetensors"));
    // At the published size the same file is misshaped, tensor by tensor.
    let full = models.check(ModelKind::TaesdDecoder, Profile::Full);
    let first = format!("1.weight: [{}, 4, 3, 3]", taesd::channels(Profile::Cpu));
    assert!(!full.loads() && full.misshaped.iter().any(|m| m.starts_with(&first)), "{full:?}");
    assert_eq!(WeightsSource::Synthetic { seed: 3 }.label(), "synthetic(seed=3)");
}

#[test]
fn shapes_and_ranges_of_decoders_and_encoders() {
    let dec = Taesd::decoder(Profile::Cpu, &syn(1), &Device::Cpu).unwrap();
    let y = dec.decode(&test_input(vec![2, 4, 32, 32], 1)).unwrap();
    assert_eq!(y.shape, vec![2, 3, 256, 256]);
    let mean = y.data.iter().sum::<f32>() / y.data.len() as f32;
    assert!((0.2..0.8).contains(&mean), "synthetic TAESD output should sit mid-range, mean {mean}");
    assert_eq!(dec.output_range(), (0.0, 1.0));
    let enc = Taesd::encoder(Profile::Cpu, &syn(1), &Device::Cpu).unwrap();
    let z = enc.encode(&test_input(vec![1, 3, 256, 256], 2)).unwrap();
    assert_eq!(z.shape, vec![1, 4, 32, 32]);
    assert!(z.data.iter().all(|v| v.is_finite()));
    // Wrong input shapes are errors, not panics.
    assert!(dec.decode(&test_input(vec![1, 3, 32, 32], 1)).is_err());
    assert!(enc.encode(&test_input(vec![1, 3, 30, 30], 1)).is_err());
    assert!(dec.decode(&Batch { shape: vec![1, 4, 2, 2], data: vec![0.0; 3] }).is_err());
}

#[test]
fn full_taesd_decoder_runs() {
    let dec = Taesd::decoder(Profile::Full, &syn(2), &Device::Cpu).unwrap();
    let y = dec.decode(&test_input(vec![1, 4, 32, 32], 1)).unwrap();
    assert_eq!(y.shape, vec![1, 3, 256, 256]);
    assert!(y.data.iter().all(|v| v.is_finite()));
}
