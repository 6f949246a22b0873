//! `cadence render --schedule ...` end to end: the adaptive schedule in the render summary, and
//! bad schedule input (clear one-line error, non-zero exit, nothing at the output path). Uses
//! the committed speech fixtures; needs no espeak-ng (a missing libespeak-ng is simulated).

mod common;
use common::s;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech").join(format!("{name}.wav"))
}

fn avatar(dir: &Path) -> PathBuf {
    let (w, h) = (256u32, 256u32);
    let px: Vec<u8> = (0..w * h).flat_map(|i| [(i % 251) as u8, (i / w * 3 % 256) as u8, 90]).collect();
    let p = dir.join("avatar.png");
    cadence_media::RgbImage::from_raw(w, h, px).unwrap().save(&p).unwrap();
    p
}

fn cadence(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cadence"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Runs a render that must fail: non-zero exit, one `cadence: error:` line containing `needle`,
/// and no file at the output path.
fn refused(extra: &[&str], env: &[(&str, &str)], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let img = avatar(dir.path());
    let out = dir.path().join("out.mp4");
    let wav = fixture("news");
    let mut args = vec!["render", "--avatar", s(&img), "-o", s(&out), "--backend", "cpu"];
    if !extra.contains(&"--text") {
        args.extend(["--audio", s(&wav)]);
    }
    args.extend(extra);
    let o = cadence(&args, env);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{extra:?} should fail:\n{err}");
    assert!(err.contains(needle), "{extra:?}: expected '{needle}' in:\n{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("cadence: error:")).collect();
    assert_eq!(lines.len(), 1, "{extra:?}: one error line expected:\n{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!out.exists(), "{extra:?} left an output: {left:?}");
    assert!(left.iter().all(|n| !n.to_string_lossy().contains("out.mp4")), "{extra:?} left {left:?}");
}

#[test]
fn bad_schedule_input_is_refused_before_rendering() {
    let dir = tempfile::tempdir().unwrap();
    let tg = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_string()
    };
    let overlapping =
        tg("overlap.json", r#"[{"start":0.0,"end":0.5,"phoneme":"b"},{"start":0.4,"end":0.9,"phoneme":"a"}]"#);
    let unsorted =
        tg("unsorted.json", r#"[{"start":0.5,"end":0.9,"phoneme":"b"},{"start":0.0,"end":0.4,"phoneme":"a"}]"#);
    // news.wav lasts about 2.2 s.
    let late = tg("late.json", r#"[{"start":0.0,"end":0.5,"phoneme":"b"},{"start":0.5,"end":9.0,"phoneme":"a"}]"#);
    let broken = tg("broken.TextGrid", "File type = \"ooTextFile\"\nObject class = \"TextGrid\"\n0\n2\n<exists>\n1\n\"IntervalTier\"\n\"phones\"\n0\n2\n3\n0\n1\n\"b\"\n");
    for b in ["0", "1.5", "-0.2", "nan"] {
        refused(&["--schedule", "fixed", &format!("--budget={b}")], &[], "(0, 1]");
    }
    refused(&["--schedule", "phonemes", "--phonemes", &overlapping], &[], "overlap");
    refused(&["--schedule", "phonemes", "--phonemes", &unsorted], &[], "not sorted");
    refused(&["--schedule", "phonemes", "--phonemes", &late], &[], "past the end of the audio");
    refused(&["--schedule", "phonemes", "--phonemes", &broken], &[], "ends early");
    refused(&["--schedule", "phonemes", "--budget", "0.3"], &[], "needs a phoneme alignment");
    refused(&["--schedule", "phonemes", "--phonemes", &late, "--stride", "2"], &[], "not --stride");
    refused(&["--schedule", "audio", "--phonemes", &late], &[], "--schedule phonemes only");
    refused(&["--schedule", "error-bounded", "--max-error", "0.01"], &[], "--calibration");
    refused(&["--schedule", "phonemes", "--phonemes", &late, "--class-strides", "closure=0.5"], &[], "below 1");
    // --text where libespeak-ng cannot be loaded: the error names the Debian package.
    refused(
        &["--text", "Bob may pay.", "--schedule", "phonemes"],
        &[("CADENCE_ESPEAK_LIBRARY", "/nonexistent/libespeak-ng.so.1")],
        "libespeak-ng1",
    );
}

#[test]
fn phonemes_schedule_in_the_render_summary_with_one_warning_for_unknown_symbols() {
    let dir = tempfile::tempdir().unwrap();
    let img = avatar(dir.path());
    let out = dir.path().join("out.mp4");
    let wav = fixture("news");
    // A made-up alignment over the clip's first 2 s, with two unknown symbols (three intervals).
    let phones: Vec<serde_json::Value> = (0..20)
        .map(|i| {
            let sym = ["b", "a", "XX", "m", "i", "@@"][i % 6];
            serde_json::json!({"start": i as f64 * 0.1, "end": (i + 1) as f64 * 0.1, "phoneme": sym})
        })
        .collect();
    let align = dir.path().join("align.json");
    std::fs::write(&align, serde_json::to_string(&phones).unwrap()).unwrap();
    let o = cadence(
        &[
            "render",
            "--audio",
            s(&wav),
            "--avatar",
            s(&img),
            "-o",
            s(&out),
            "--backend",
            "cpu",
            // The synthetic avatar has no face: the centred box (the face is not the point here).
            "--face-box",
            "center",
            "--schedule",
            "phonemes",
            "--phonemes",
            s(&align),
            "--budget",
            "0.5",
            "--json",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("cadence: warning:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("'@@'") && warnings[0].contains("'XX'"), "{}", warnings[0]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sched = &v["schedule"];
    assert_eq!(sched["source"], "phonemes");
    let keys: Vec<u64> = sched["keyframes"].as_array().unwrap().iter().map(|k| k.as_u64().unwrap()).collect();
    assert_eq!(sched["count"].as_u64().unwrap() as usize, keys.len());
    let frames = v["frames"].as_u64().unwrap();
    assert_eq!(keys[0], 0);
    assert_eq!(*keys.last().unwrap(), frames - 1);
    // Exactly round(0.5 x frames not bypassed) evaluations, as the pipeline counted them.
    let active = sched["active_frames"].as_u64().unwrap();
    assert_eq!(active, frames - v["bypassed_frames"].as_u64().unwrap());
    assert_eq!(v["unet_evaluations"].as_u64().unwrap(), (0.5 * active as f64).round() as u64);
    assert_eq!(sched["unet_evaluations"], v["unet_evaluations"]);
    assert_eq!(v["keyframes_scheduled"].as_u64().unwrap() as usize, keys.len());
    assert!(out.exists());
}
