//! ditto_parity end to end on 30 frames (cpu-reduced engines, synthetic weights, 2 DDIM steps):
//! every engine, stride and infill row, metrics that agree with how they are defined, provenance
//! and the picture grid.

use std::path::Path;

mod common;
use common::run;

#[derive(serde::Deserialize, Debug)]
struct Row {
    engine: String,
    stride: usize,
    infill: String,
    frames: usize,
    keyframes: usize,
    infilled_frames: usize,
    psnr_db: f64,
    psnr_infilled_db: f64,
    ssim_infilled: f64,
    flicker_mouth: f64,
    flicker_mouth_dense: f64,
}

#[test]
fn ditto_parity_on_a_few_frames() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    run(
        env!("CARGO_BIN_EXE_ditto_parity"),
        &["--frames", "30", "--ditto-steps", "2", "--backend", "cpu", "--out", out],
    );
    let csv = Path::new(out).join("ditto_parity.csv");
    let rows: Vec<Row> = experiments::read_rows(&csv).unwrap();
    let got: Vec<(&str, usize, &str)> = rows.iter().map(|r| (r.engine.as_str(), r.stride, r.infill.as_str())).collect();
    let want = [
        ("ditto", 2, "feature"),
        ("ditto", 2, "image"),
        ("ditto", 2, "motion"),
        ("ditto", 3, "feature"),
        ("ditto", 3, "image"),
        ("ditto", 3, "motion"),
        ("musetalk", 2, "latent"),
        ("musetalk", 2, "image"),
        ("musetalk", 3, "latent"),
        ("musetalk", 3, "image"),
    ];
    assert_eq!(got, want);
    for r in &rows {
        let keys = cadence::KeyframeSchedule::fixed_stride(30, r.stride).unwrap().count();
        assert_eq!((r.frames, r.keyframes), (30, keys), "{r:?}");
        assert!(r.infilled_frames > 0 && r.infilled_frames <= 30 - keys, "{r:?}");
        // Keyframes and bypassed frames are the dense render's own bytes (outside the easing
        // ramps), so the PSNR over every frame is above the PSNR over the infilled ones (one MSE
        // over more, mostly identical, frames).
        assert!(r.psnr_infilled_db.is_finite() && r.psnr_db > r.psnr_infilled_db, "{r:?}");
        assert!(r.ssim_infilled > 0.0 && r.ssim_infilled < 1.0, "{r:?}");
        let dense = rows.iter().find(|d| d.engine == r.engine).unwrap().flicker_mouth_dense;
        assert!(r.flicker_mouth > 0.0 && r.flicker_mouth_dense == dense, "{r:?}");
    }
    let prov = experiments::read_provenance(&csv).unwrap();
    let key = |k: &str| prov.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()).unwrap_or_default();
    assert!(key("caveat").contains("not a trained face") && key("ditto_ddim_steps") == "2");
    assert!(key("grid").contains("frames [17, 22, 25]"), "{}", key("grid"));
    assert!(key("grid").contains("musetalk stride 3 image"), "{}", key("grid"));
    let png = image::open(Path::new(out).join("ditto_parity_grid.png")).unwrap();
    assert!(png.width() > 0 && png.height() > 0);
}
