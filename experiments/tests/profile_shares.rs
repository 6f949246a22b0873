//! The reduced profile is a scale model of the full one (docs/profiles.md): for each scale arm,
//! the committed measurement (`results/profile_shares.csv` for AVX-512, `_fma.csv` for FMA) was
//! made on a machine of that arm at the widths the code has now for it, and every share it
//! recorded is within its tolerance of the full profile's. A change of width without a new
//! measurement, or a measurement that missed, fails here.

use cadence_engines::{Profile, ScaleArm};

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
fn each_arms_committed_measurement_is_of_its_widths_and_every_share_is_within_tolerance() {
    for arm in ScaleArm::ALL {
        check(arm);
    }
}

fn check(arm: ScaleArm) {
    let file = experiments::paths::profile_shares_file(arm);
    let csv = experiments::workspace_root().join("results").join(&file);
    let prov = experiments::read_provenance(&csv).unwrap();
    let note = |k: &str| prov.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    let loops = note("cpu_loops").unwrap_or_default();
    assert!(
        loops.ends_with(&format!("gemm kernel {})", arm.name())),
        "{file} was measured on another arm than {}: {loops}",
        arm.name()
    );
    assert_eq!(
        note("widths_cpu_reduced").as_deref(),
        Some(Profile::Cpu.widths_at(arm).as_str()),
        "{file} measured other widths than the code's for {}: rerun \
         `cargo run --release -p experiments --bin profile_shares` on such a machine",
        arm.name()
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
