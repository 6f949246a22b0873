//! `server_load` end to end on tiny settings: a real `cadence serve` child loaded by a few
//! clients, and `cadence render` processes beside it. The CSV must carry its provenance, every
//! request kind's figures, no 5xx and no corrupt output, and a verdict for each target.

mod common;
use common::run;

/// (phase, kind, metric) -> (value, verdict) of the CSV's rows.
fn rows(path: &std::path::Path) -> Vec<(String, String, String, f64, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut r = csv::ReaderBuilder::new().comment(Some(b'#')).from_reader(text.as_bytes());
    let header = r.headers().unwrap().clone();
    assert_eq!(header.iter().collect::<Vec<_>>(), ["phase", "kind", "metric", "value", "unit", "target", "verdict"]);
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            (rec[0].to_string(), rec[1].to_string(), rec[2].to_string(), rec[3].parse().unwrap(), rec[6].to_string())
        })
        .collect()
}

#[test]
fn server_load_writes_its_figures_with_provenance() {
    let bin = env!("CARGO_BIN_EXE_server_load");
    let help = run(bin, &["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in ["--requests", "--concurrency", "--slots", "--clip-seconds", "--out <"] {
        assert!(text.contains(flag), "{flag}: {text}");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    // 12 requests: renders of the five kinds at 0, 2, .., 10 and one of each bad kind between.
    let o = run(
        bin,
        &[
            "--requests",
            "12",
            "--concurrency",
            "2",
            "--slots",
            "1",
            "--render-every",
            "2",
            "--clip-seconds",
            "0.4",
            "--compare-renders",
            "1",
            "--out",
            out,
        ],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let csv = dir.path().join("server_load.csv");
    let prov = experiments::read_provenance(&csv).unwrap();
    for key in ["commit", "date_utc", "hardware", "backend", "engine_profile", "weights", "setup", "load_average"] {
        assert!(prov.iter().any(|(k, v)| k == key && !v.is_empty()), "no {key} in {prov:?}");
    }
    assert!(dir.path().join("server_load.png").is_file() && dir.path().join("server_load.svg").is_file());
    let rows = rows(&csv);
    let get = |phase: &str, kind: &str, metric: &str| {
        rows.iter()
            .find(|r| r.0 == phase && r.1 == kind && r.2 == metric)
            .unwrap_or_else(|| panic!("no row {phase}/{kind}/{metric}"))
            .clone()
    };
    // Every kind came back right: renders parsed with the clip's 10 frames, bad requests with
    // their status.
    for kind in ["avatar_id", "multipart", "json", "job", "stream", "bad_413_body", "bad_401_token", "bad_404_avatar"] {
        assert!(get("load", kind, "requests").3 >= 1.0, "{kind}");
        assert_eq!(get("load", kind, "wrong").3, 0.0, "{kind}: {stdout}");
    }
    assert_eq!(get("load", "all", "5xx").3, 0.0);
    assert_eq!(get("load", "all", "corrupt_outputs").3, 0.0);
    // 12 requests, and the registrations of the two avatar_id renders (requests 0 and 10).
    assert_eq!(get("load", "all", "requests").3, 14.0);
    assert!(get("load", "stream", "time_to_first_byte_p50").3 > 0.0);
    assert_eq!(get("load", "status_413", "responses").3, 1.0);
    assert!(get("memory", "server", "rss_end").3 > 10.0);
    assert!(get("throughput", "cli", "renders_per_minute").3 > 0.0);
    assert_eq!(get("throughput", "server", "renders_ok").3, 1.0);
    // Fewer than 200 requests: the zero-error target cannot be met by this run.
    assert_eq!(get("targets", "all", "5xx_no_answer_and_corrupt").4, "NOT MET");
    for metric in ["rss_growth_after_warmup", "server_overhead_p50", "throughput_server_over_cli"] {
        let v = get("targets", "all", metric).4;
        assert!(v == "met" || v == "NOT MET", "{metric}: {v}");
        assert!(stdout.contains(&format!("{metric}: ")), "{stdout}");
    }
}
