//! The reduced profile is a scale model of the full one (docs/profiles.md): the committed
//! measurement `results/profile_shares.csv` was made at the widths the code has now, and every
//! share it recorded is within its tolerance of the full profile's. A change of width without a
//! new measurement, or a measurement that missed, fails here.

use cadence_engines::Profile;

#[derive(serde::Deserialize, Debug)]
struct Row {
    decoder: String,
    engine: String,
    full_share_pct: f64,
    reduced_share_pct: f64,
    share_ratio: f64,
    within_tolerance: bool,
}

#[test]
fn the_committed_measurement_is_of_these_widths_and_every_share_is_within_tolerance() {
    let csv = experiments::workspace_root().join("results/profile_shares.csv");
    let prov = experiments::read_provenance(&csv).unwrap();
    let note = |k: &str| prov.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(
        note("widths_cpu_reduced").as_deref(),
        Some(Profile::Cpu.widths().as_str()),
        "results/profile_shares.csv measured other widths than the code's: rerun \
         `cargo run --release -p experiments --bin profile_shares`"
    );
    assert_eq!(note("widths_full").as_deref(), Some(Profile::Full.widths().as_str()));
    assert_eq!(note("dirty").as_deref(), Some("no"), "measured on a modified tree");
    let rows: Vec<Row> = experiments::read_rows(&csv).unwrap();
    assert_eq!(rows.len(), 6, "three engines for each of the two decoders");
    for r in &rows {
        let ratio = r.reduced_share_pct / r.full_share_pct;
        assert!((ratio - r.share_ratio).abs() < 1e-9, "{r:?}");
        assert!(r.within_tolerance && (ratio - 1.0).abs() <= 0.15, "{} with {}: {r:?}", r.engine, r.decoder);
    }
    for decoder in ["taesd", "sd-vae"] {
        let sum: f64 = rows.iter().filter(|r| r.decoder == decoder).map(|r| r.reduced_share_pct).sum();
        assert!((sum - 100.0).abs() < 1e-6, "{decoder}: shares sum to {sum}");
    }
}
