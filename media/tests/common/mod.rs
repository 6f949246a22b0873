//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// A fresh, empty directory under the system temp dir, unique per test.
pub fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cadence-media-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes a WAV with hound. `frames[i][c]` in [-1, 1].
pub fn write_wav(
    path: &std::path::Path,
    rate: u32,
    channels: u16,
    bits: u16,
    float: bool,
    n_frames: usize,
    f: impl Fn(usize, u16) -> f32,
) {
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format: if float { hound::SampleFormat::Float } else { hound::SampleFormat::Int },
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..n_frames {
        for c in 0..channels {
            let v = f(i, c);
            if float {
                w.write_sample(v).unwrap();
            } else {
                let max = ((1i64 << (bits - 1)) - 1) as f32;
                w.write_sample((v * max).round() as i32).unwrap();
            }
        }
    }
    w.finalize().unwrap();
}

pub fn sine(freq: f32, rate: u32, amp: f32) -> impl Fn(usize, u16) -> f32 {
    move |i, _| amp * (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin()
}

pub fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
}

/// Speech from espeak-ng as 16-bit mono samples at espeak's rate. Panics with a clear
/// message when espeak-ng is not installed: these tests must not pass silently.
pub fn espeak(text: &str, dir: &std::path::Path, name: &str) -> (u32, Vec<i16>) {
    let out = dir.join(format!("{name}.wav"));
    let status =
        std::process::Command::new("espeak-ng").args(["-v", "en-us", "-s", "150", "-w"]).arg(&out).arg(text).status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("espeak-ng failed ({s}) generating test speech"),
        Err(e) => panic!(
            "espeak-ng is required for the voice-activity tests on real speech and was not \
             found ({e}); install it: apt-get install -y espeak-ng"
        ),
    }
    let mut r = hound::WavReader::open(&out).unwrap();
    let rate = r.spec().sample_rate;
    assert_eq!(r.spec().channels, 1);
    let s: Vec<i16> = r.samples::<i16>().map(|s| s.unwrap()).collect();
    (rate, s)
}

pub fn have(cmd: &str) -> bool {
    std::process::Command::new(cmd).arg("-version").output().is_ok()
}
