//! adaptive_strides end to end on a few frames of the text clip (cpu-reduced engines,
//! synthetic weights): every schedule at exactly the stride's evaluations, the columns,
//! provenance, caveat, calibration file and plots.

use std::path::Path;

mod common;
use common::run;

#[derive(serde::Deserialize, Debug)]
struct Row {
    clip: String,
    schedule: String,
    budget: f64,
    stride_equivalent: usize,
    unet_evaluations: usize,
    active_frames: usize,
    latent_err_mean: f64,
    err_closure: Option<f64>,
    psnr_db: f64,
    ssim_mean: f64,
    flicker_mouth_8bit: f64,
    scheduling_ms: f64,
    scheduling_share_pct: f64,
    weights_kind: String,
}

#[test]
fn adaptive_strides_on_a_few_frames() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let o = run(
        env!("CARGO_BIN_EXE_adaptive_strides"),
        &["--clips", "text", "--frames", "40", "--budgets", "0.5", "--batch", "4", "--backend", "cpu", "--out", out],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("SYNTHETIC WEIGHTS"), "{stdout}");
    let csv = Path::new(out).join("adaptive_strides.csv");
    let rows: Vec<Row> = experiments::read_rows(&csv).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r.schedule.as_str()).collect();
    for want in ["stride 2", "fixed", "phonemes", "audio", "error-bounded", "error-bounded max-error"] {
        assert!(names.contains(&want), "no {want} row in {names:?}");
    }
    let stride = rows.iter().find(|r| r.schedule == "stride 2").unwrap();
    for r in rows.iter().filter(|r| r.schedule != "error-bounded max-error") {
        assert_eq!((r.clip.as_str(), r.budget, r.stride_equivalent), ("text", 0.5, 2));
        assert_eq!(r.unet_evaluations, stride.unet_evaluations, "{}: equal UNet evaluations", r.schedule);
        assert!(r.latent_err_mean > 0.0 && r.psnr_db.is_finite() && r.ssim_mean <= 1.0 && r.flicker_mouth_8bit >= 0.0);
        assert!(r.err_closure.is_some() && r.scheduling_ms >= 0.0 && r.scheduling_share_pct >= 0.0);
        assert_eq!(r.weights_kind, "synthetic");
        assert!(r.active_frames <= 40);
    }
    // The phonemes schedule keys every closure frame here (stride 1 fits in half the frames).
    assert_eq!(rows.iter().find(|r| r.schedule == "phonemes").unwrap().err_closure, Some(0.0));
    let prov = experiments::read_provenance(&csv).unwrap();
    let key = |k: &str| prov.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()).unwrap_or_default();
    assert!(key("weights_caveat").contains("measure the schedules on this network"));
    assert!(key("text_clip").contains("text_clip.wav") && !key("commit").is_empty());
    let cal: cadence::schedules::Calibration =
        serde_json::from_str(&std::fs::read_to_string(Path::new(out).join("adaptive_calibration.json")).unwrap())
            .unwrap();
    assert!(cal.scale > 0.0 && cal.weights.starts_with("synthetic") && cal.clip == "text");
    for f in [
        "adaptive_strides_pareto.png",
        "adaptive_strides_pareto.svg",
        "adaptive_strides_timeline.png",
        "adaptive_strides_timeline.svg",
    ] {
        assert!(Path::new(out).join(f).metadata().unwrap().len() > 1000, "{f}");
    }
}
