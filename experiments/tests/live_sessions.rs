//! `live_sessions` end to end on tiny settings: `cadence serve` as a child, one session fed
//! 6 s of speech with an interrupt, the extra session refused. The CSV must carry its
//! provenance and each figure the targets are judged on.

mod common;
use common::run;

#[test]
fn live_sessions_writes_its_figures_with_provenance() {
    let bin = env!("CARGO_BIN_EXE_live_sessions");
    let help = run(bin, &["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in ["--seconds", "--sessions", "--chunk-ms", "--interrupt-every", "--stride", "--margin-ms", "--out <"] {
        assert!(text.contains(flag), "{flag}: {text}");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let o = run(bin, &["--seconds", "6", "--sessions", "1", "--interrupt-every", "3", "--out", out]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let csv = dir.path().join("live_sessions.csv");
    let prov = experiments::read_provenance(&csv).unwrap();
    for key in ["commit", "date_utc", "hardware", "backend", "weights", "cpu_loops", "chunk_ms", "receiver"] {
        assert!(prov.iter().any(|(k, v)| k == key && !v.is_empty()), "no {key} in {prov:?}");
    }
    assert!(dir.path().join("live_sessions.png").is_file() && dir.path().join("live_sessions.svg").is_file());
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut r = csv::ReaderBuilder::new().comment(Some(b'#')).from_reader(text.as_bytes());
    let header = r.headers().unwrap().clone();
    let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    let get = |name: &str| -> f64 {
        let i = header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}"));
        rows[0][i].parse().unwrap_or(f64::NAN)
    };
    // Frames and speech arrived and decoded; the extra session was refused; the interrupt eased
    // the picture (the server's latency is a number, not NaN).
    assert!(get("frames_received") >= 100.0, "{stdout}");
    assert_eq!(get("undecodable_frames"), 0.0);
    assert_eq!(get("extra_session_status"), 429.0);
    assert!(get("audio_to_mouth_p95_ms") > 0.0, "{stdout}");
    assert!(get("interrupts") >= 1.0 && get("interrupt_wire_p95_ms").is_finite(), "{stdout}");
    assert!(get("av_skew_ms").is_finite());
    assert!(stdout.contains("one more session: 429 (met)"), "{stdout}");
}
