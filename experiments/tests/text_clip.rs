//! The committed text clip of adaptive_strides (experiments/assets/text_clip.*, made by
//! make_text_clip with libespeak-ng): its WAV and phoneme alignment agree with each other and
//! with the class table. The regeneration check needs libespeak-ng and is ignored by default
//! (`.ci/run` runs it: `cargo test --release --workspace --test text_clip -- --ignored`).

use cadence::schedules::{Alignment, PhonemeClass};
use std::path::{Path, PathBuf};

fn asset(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets").join(name)
}

fn source() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(asset("text_clip.source.json")).unwrap()).unwrap()
}

#[test]
fn text_clip_audio_and_alignment_agree() {
    let audio = cadence_media::load_wav(asset("text_clip.wav")).unwrap();
    let src = source();
    let rate = src["sample_rate"].as_u64().unwrap() as f64;
    assert_eq!(audio.source_rate as f64, rate);
    assert!((audio.duration_s - src["samples"].as_u64().unwrap() as f64 / rate).abs() < 1e-9);
    let a = Alignment::read(&asset("text_clip.phonemes.json")).unwrap();
    a.check_duration(audio.duration_s).unwrap();
    // The last phoneme lasts to the end of espeak-ng's audio (rounded to its millisecond events).
    assert!((a.end() - audio.duration_s).abs() < 1e-3, "{} vs {}", a.end(), audio.duration_s);
    let (classes, unknown) = a.interval_classes();
    assert!(unknown.is_empty(), "symbols outside the class table: {unknown:?}");
    let closures = classes.iter().filter(|&&c| c == PhonemeClass::Closure).count();
    assert!(closures >= 20, "{closures} closures: the clip is meant to be rich in p b m f v");
    // The times line up with the sound: the voiceless /p/ closures are quieter than the vowels
    // (an offset of even one phoneme would mix them), and the long pauses are near silence.
    let rms = |s: f64, e: f64| {
        let x = &audio.samples_16k[(s * 16_000.0) as usize..((e * 16_000.0) as usize).min(audio.samples_16k.len())];
        (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len().max(1) as f64).sqrt()
    };
    let mean_rms = |pred: &dyn Fn(&str, PhonemeClass) -> bool| {
        let v: Vec<f64> = a
            .phones()
            .iter()
            .zip(&classes)
            .filter(|(p, &c)| pred(&p.phoneme, c))
            .map(|(p, _)| rms(p.start, p.end))
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let p = mean_rms(&|s, _| s == "p");
    let vowels = mean_rms(&|_, c| matches!(c, PhonemeClass::OpenVowel | PhonemeClass::SustainedVowel));
    let pauses = mean_rms(&|s, _| s.is_empty());
    assert!(p < 0.5 * vowels, "/p/ RMS {p:.4} vs vowels {vowels:.4}");
    assert!(pauses < 0.1 * vowels, "pause RMS {pauses:.4} vs vowels {vowels:.4}");
}

#[test]
#[ignore = "needs libespeak-ng (apt-get install libespeak-ng1)"]
fn text_clip_regenerates_identically() {
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_make_text_clip"))
        .args(["--out-dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let fresh: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("text_clip.source.json")).unwrap()).unwrap();
    assert_eq!(
        fresh["espeak_ng"],
        source()["espeak_ng"],
        "another espeak-ng version than the one that made the committed clip: regenerate it with make_text_clip"
    );
    for f in ["text_clip.wav", "text_clip.phonemes.json", "text_clip.source.json"] {
        assert!(std::fs::read(dir.path().join(f)).unwrap() == std::fs::read(asset(f)).unwrap(), "{f} differs");
    }
}
