//! `cadence vad`: Silero VAD's segments and probabilities of a WAV file, against the wheel's own
//! results on the same clip (fixtures/vad/silero_reference.json, scripts/make_vad_fixtures.py),
//! and bad input (clear error, non-zero exit).

mod common;
use common::{cadence, s, speech_fixture, stderr};

use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/vad").join(name)
}

fn reference() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("silero_reference.json")).unwrap()).unwrap()
}

/// Without the front end, the wheel's probabilities and segments.
#[test]
fn json_report_matches_the_reference() {
    let wav = fixture("mix_16k.wav");
    let o = cadence(&["vad", s(&wav), "--json", "--denoise", "off"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object on stdout");
    let want = reference();
    assert_eq!(got["denoise"], false);
    assert_eq!(got["model"], want["model"]);
    assert_eq!(got["sample_rate"], 16000);
    assert_eq!(got["chunk_samples"], 512);
    let max_err = max_probability_difference(&got, &want);
    assert!(max_err < 1e-3, "max probability error {max_err}");
    assert_segments_within(&got, &want, 1e-9);
}

/// With the front end (the default): the JSON says so, the probabilities are not the wheel's,
/// and the clip's four sentences are still found, within two chunks of the wheel's boundaries.
#[test]
fn json_report_with_the_front_end() {
    let wav = fixture("mix_16k.wav");
    let o = cadence(&["vad", s(&wav), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object on stdout");
    let want = reference();
    assert_eq!(got["denoise"], true);
    let max_diff = max_probability_difference(&got, &want);
    assert!(max_diff > 0.05, "the front end changed no probability by more than {max_diff}");
    assert_segments_within(&got, &want, 2.0 * 512.0 / 16000.0);
    let o = cadence(&["vad", s(&wav), "--denoise", "maybe"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--denoise"), "{}", stderr(&o));
}

#[test]
fn text_report_and_flags() {
    let wav = fixture("mix_16k.wav");
    let o = cadence(&["vad", s(&wav)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("4 speech segment(s)") && out.contains("front end on"), "{out}");
    assert_eq!(out.lines().count(), 1 + 4, "{out}");
    let o = cadence(&["vad", s(&wav), "--denoise", "off"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("4 speech segment(s)") && out.contains("front end off"), "{out}");

    // A 1 s limit cuts the long sentences: more segments than the default's 4.
    let o = cadence(&["vad", s(&wav), "--max-speech-s", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().count() > 1 + 4, "{out}");

    // Any WAV rate: a committed 22.05 kHz sentence has speech.
    let o = cadence(&["vad", s(&speech_fixture("fox"))]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 speech segment(s)"));

    let o = cadence(&["vad", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--json",
        "--threshold",
        "--neg-threshold",
        "--min-speech-ms",
        "--min-silence-ms",
        "--speech-pad-ms",
        "--denoise",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}: {help}");
    }
}

#[test]
fn bad_input_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let not_wav = dir.path().join("x.wav");
    std::fs::write(&not_wav, b"not a wav file at all").unwrap();
    let missing = dir.path().join("missing.wav");
    let wav = fixture("mix_16k.wav");
    for (args, needle) in [
        (vec!["vad", s(&missing)], "missing.wav"),
        (vec!["vad", s(&not_wav)], "not a WAV"),
        (vec!["vad", s(&wav), "--threshold", "1.5"], "--threshold"),
        (vec!["vad", s(&wav), "--min-silence-ms=-5"], "min_silence_duration_ms"),
        (vec!["vad", s(&wav), "--max-speech-s", "0"], "max_speech_duration_s"),
    ] {
        let o = cadence(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = stderr(&o);
        assert!(err.contains("cadence: error") && err.contains(needle), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} printed {}", String::from_utf8_lossy(&o.stdout));
    }
}

/// A reader that closes the pipe before the report (`cadence vad clip.wav | head -0`) ends the
/// command quietly: exit 0, no panic.
#[test]
fn a_closed_pipe_is_not_an_error() {
    let wav = fixture("mix_16k.wav");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cadence"))
        .args(["vad", s(&wav), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The model takes tens of milliseconds to load: the pipe is closed before anything is written.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
}

/// `render --vad ...`: a bad detector or threshold is refused by the argument parser, naming the
/// flag, before anything loads.
#[test]
fn render_refuses_bad_vad_flags() {
    let wav = fixture("mix_16k.wav");
    for (flag, value) in
        [("--vad", "webrtc"), ("--vad-threshold", "2"), ("--vad-min-speech-ms", "-5"), ("--vad-denoise", "maybe")]
    {
        let arg = format!("{flag}={value}");
        let avatar = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/assets/anchor_1080x1920.png");
        let o = cadence(&["render", "--audio", s(&wav), "--avatar", s(&avatar), &arg, "-o", "/nonexistent-dir/x.mp4"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains("invalid value") && err.contains(flag), "{flag} {value}: {err}");
    }
}

/// The largest difference between `cadence vad --json`'s probabilities and the wheel's (same count).
fn max_probability_difference(got: &serde_json::Value, want: &serde_json::Value) -> f64 {
    let (p, q) = (got["probabilities"].as_array().unwrap(), want["probabilities"].as_array().unwrap());
    assert_eq!(p.len(), q.len());
    p.iter().zip(q).map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs()).fold(0.0, f64::max)
}

/// The same speech segments as the wheel's default ones, each boundary within `tol` seconds.
fn assert_segments_within(got: &serde_json::Value, want: &serde_json::Value, tol: f64) {
    let segs = got["segments"].as_array().unwrap();
    let want_segs = want["segments"]["default"]["segments"].as_array().unwrap();
    assert_eq!(segs.len(), want_segs.len());
    for (g, w) in segs.iter().zip(want_segs) {
        for k in 0..2 {
            let want_s = w[k].as_f64().unwrap() / 16000.0;
            assert!((g[k].as_f64().unwrap() - want_s).abs() <= tol, "{g} vs {w}");
        }
    }
}
