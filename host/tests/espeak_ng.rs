//! Text to speech through libespeak-ng (`cadence::schedules::espeak`). These tests need the
//! library (Debian package libespeak-ng1), so they are ignored by default; `.ci/run` installs it
//! and runs them: `cargo test --release --workspace --test espeak_ng -- --ignored`.

use cadence::schedules::classes::classify;
use cadence::schedules::espeak;
use cadence::schedules::PhonemeClass;

const NEEDS: &str = "needs libespeak-ng (apt-get install libespeak-ng1); run with --ignored";

fn rms(samples: &[i16], rate: u32, start: f64, end: f64) -> f64 {
    let (a, b) = ((start * rate as f64) as usize, ((end * rate as f64) as usize).min(samples.len()));
    let s = &samples[a..b.max(a + 1).min(samples.len())];
    (s.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / s.len().max(1) as f64).sqrt()
}

#[test]
#[ignore = "needs libespeak-ng (apt-get install libespeak-ng1)"]
fn speaks_with_phoneme_events_that_line_up_with_the_audio() {
    assert!(espeak::available(), "{NEEDS}");
    let s = espeak::speak("Bob may pay five big bills. <not SSML>", espeak::DEFAULT_VOICE, 150).unwrap();
    assert!(s.sample_rate > 8000, "rate {}", s.sample_rate);
    let dur = s.duration_s();
    assert!(dur > 1.0 && dur < 6.0, "{dur} s");
    let a = &s.alignment;
    a.check_duration(dur).unwrap();
    assert!((a.end() - dur).abs() < 1e-9, "the last phoneme lasts to the end of the audio");
    let (classes, unknown) = a.interval_classes();
    // espeak-ng's IPA names are all in the class table.
    assert!(unknown.is_empty(), "unknown espeak-ng phonemes: {unknown:?}");
    let labels: Vec<&str> = a.phones().iter().map(|p| p.phoneme.as_str()).collect();
    for want in ["b", "m", "p", "f", "v"] {
        assert!(labels.contains(&want), "no '{want}' among {labels:?}");
    }
    // Times line up with the sound: the voiceless closure of /p/ is quieter than the vowels.
    let mean_rms = |c: PhonemeClass, only: Option<&str>| {
        let v: Vec<f64> = a
            .phones()
            .iter()
            .zip(&classes)
            .filter(|(p, &k)| k == c && only.is_none_or(|o| p.phoneme == o))
            .map(|(p, _)| rms(&s.samples, s.sample_rate, p.start, p.end))
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let p = mean_rms(PhonemeClass::Closure, Some("p"));
    let vowels = mean_rms(PhonemeClass::OpenVowel, None).min(mean_rms(PhonemeClass::SustainedVowel, None));
    assert!(p < 0.5 * vowels, "/p/ RMS {p:.0} vs vowels {vowels:.0}");
    // Pauses come as empty names (silence).
    assert!(labels.iter().any(|l| l.is_empty()) && classify("") == Some(PhonemeClass::Silence));
}

#[test]
#[ignore = "needs libespeak-ng (apt-get install libespeak-ng1)"]
fn ssml_breaks_make_pauses_and_bad_voices_are_errors() {
    assert!(espeak::available(), "{NEEDS}");
    let s = espeak::speak(r#"<speak>Bob. <break time="1500ms"/> Mary.</speak>"#, "en-us", 150).unwrap();
    // The longest silence interval spans the break.
    let longest = s
        .alignment
        .phones()
        .iter()
        .filter(|p| classify(&p.phoneme) == Some(PhonemeClass::Silence))
        .map(|p| p.end - p.start)
        .fold(0.0, f64::max);
    assert!(longest >= 1.4, "longest pause {longest} s");
    let e = espeak::speak("hello", "no-such-voice-xx", 150).unwrap_err().to_string();
    assert!(e.contains("no voice"), "{e}");
    assert!(espeak::speak("  ", "en-us", 150).unwrap_err().to_string().contains("empty"));
}
