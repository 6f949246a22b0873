//! The tensor entry points (`predict_tensor`, `decode_tensor`) a device-resident render uses.
//!
//! What this guards, plainly: on the CPU the tensor entry points *are* the buffer entry points
//! behind one host round trip, so the equality tests below check that plumbing (layouts,
//! shapes, batch order, the output tensor's device), not the networks. The networks themselves
//! are checked against candle's forward and independent references (`arch.rs`, `layers.rs`,
//! `weights_io.rs`). In a build with the `cuda` feature the same entry points run candle's CUDA
//! forward, which these tests do not reach on a machine without a GPU. The last test checks the
//! clear errors for tensors an engine cannot run.

use cadence_engines::*;

/// The audio feature width at the reduced profile (this machine's scale arm).
fn aud() -> usize {
    unet::audio_dim(Profile::Cpu)
}

fn syn() -> WeightsSource {
    WeightsSource::Synthetic { seed: 7 }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn latents(shape: &[usize]) -> Batch {
    let n: usize = shape.iter().product();
    Batch::new(shape.to_vec(), (0..n).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect()).unwrap()
}

#[test]
fn decode_tensor_equals_decode() {
    let x = latents(&[2, 4, 4, 4]);
    let decoders: [Box<dyn LatentDecoder>; 2] = [
        Box::new(Taesd::decoder(Profile::Cpu, &syn(), &Device::Cpu).unwrap()),
        Box::new(SdVae::decoder(Profile::Cpu, &syn(), &Device::Cpu).unwrap()),
    ];
    for d in &decoders {
        let want = d.decode(&x).unwrap();
        let got = d.decode_tensor(&x.clone().into_tensor(&Device::Cpu).unwrap()).unwrap();
        assert_eq!(got.dims(), want.shape.as_slice(), "{}", d.describe());
        assert_eq!(values(&got), want.data, "{}", d.describe());
    }
}

#[test]
fn predict_tensor_equals_predict() {
    let unet = MuseTalkUnet::new(Profile::Cpu, &syn(), &Device::Cpu).unwrap();
    let x = latents(&[2, 8, 32, 32]);
    let audio = latents(&[2, 50, aud()]);
    let want = unet.predict(&x, &audio).unwrap();
    let got = unet
        .predict_tensor(
            &x.clone().into_tensor(&Device::Cpu).unwrap(),
            &audio.clone().into_tensor(&Device::Cpu).unwrap(),
        )
        .unwrap();
    assert_eq!(got.dims(), &[2, 4, 32, 32]);
    assert_eq!(values(&got), want.data);
}

#[test]
fn tensors_an_engine_cannot_run_are_clear_errors() {
    let vae = SdVae::decoder(Profile::Cpu, &syn(), &Device::Cpu).unwrap();
    let f64_latents =
        latents(&[1, 4, 4, 4]).into_tensor(&Device::Cpu).unwrap().to_dtype(candle_core::DType::F64).unwrap();
    let err = vae.decode_tensor(&f64_latents).unwrap_err().to_string();
    assert!(err.contains("expected f32"), "{err}");
    let err = vae.decode_tensor(&latents(&[1, 3, 4, 4]).into_tensor(&Device::Cpu).unwrap()).unwrap_err().to_string();
    assert!(err.contains("expected shape (_,4,_,_)"), "{err}");
    let encoder = SdVae::encoder(Profile::Cpu, &syn(), &Device::Cpu).unwrap();
    let err =
        encoder.decode_tensor(&latents(&[1, 4, 4, 4]).into_tensor(&Device::Cpu).unwrap()).unwrap_err().to_string();
    assert!(err.contains("encoder"), "{err}");
    let unet = MuseTalkUnet::new(Profile::Cpu, &syn(), &Device::Cpu).unwrap();
    let err = unet
        .predict_tensor(
            &latents(&[1, 8, 32, 32]).into_tensor(&Device::Cpu).unwrap(),
            &latents(&[2, 50, aud()]).into_tensor(&Device::Cpu).unwrap(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("audio"), "{err}");
}
