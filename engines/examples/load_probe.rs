//! Scratch probe: how long each full-profile engine takes to load with synthetic weights.
use cadence_engines::{Device, MuseTalkUnet, Profile, Taesd, WeightsSource, WhisperAudio};
use std::time::Instant;
fn main() {
    let w = WeightsSource::Synthetic { seed: 1 };
    let t = Instant::now();
    let _u = MuseTalkUnet::new(Profile::Full, &w, &Device::Cpu).unwrap();
    println!("unet {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let _d = Taesd::decoder(Profile::Full, &w, &Device::Cpu).unwrap();
    let _e = Taesd::encoder(Profile::Full, &w, &Device::Cpu).unwrap();
    println!("taesd {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let _a = WhisperAudio::new(Profile::Full, &w, &Device::Cpu).unwrap();
    println!("whisper {:.1} s", t.elapsed().as_secs_f64());
}
