//! lerp_slerp_ablation's trajectory part and calibrate end to end on a few frames (cpu-reduced
//! engines, synthetic weights): outputs, columns, provenance, JSON shape, and values that must
//! hold whatever the weights.

use std::path::Path;
use std::process::Command;

mod common;
use common::run;

fn fails_with(bin: &str, args: &[&str], message: &str) {
    let out = Command::new(bin).args(args).output().expect("binary starts");
    assert!(!out.status.success(), "{bin} {args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(message), "{bin} {args:?}: expected '{message}' in:\n{err}");
}

fn provenance(path: &Path) -> impl Fn(&str) -> String {
    let prov = experiments::read_provenance(path).unwrap();
    move |k: &str| {
        prov.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no {k} in {prov:?}"))
    }
}

#[derive(serde::Deserialize, Debug)]
struct TrajectoryRow {
    stride: usize,
    method: String,
    weights_kind: String,
    engine_profile: String,
    frames: usize,
    keyframes: usize,
    inbetween_frames: usize,
    keyframe_angle_mean_rad: f64,
    keyframe_angle_max_rad: f64,
    norm_deficit_mean: f64,
    norm_deficit_worst: f64,
    norm_vs_dense_mean: f64,
    norm_vs_dense_worst: f64,
    latent_rel_error_mean: f64,
    hold_latent_rel_error_mean: f64,
    hold_psnr_db_mean: f64,
    psnr_db_mean: f64,
    psnr_db_min: f64,
    ssim_mean: f64,
    ssim_min: f64,
    sharpness_mean: f64,
    dense_sharpness_mean: f64,
    sharpness_ratio: f64,
}

#[test]
fn ablation_trajectory_part_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_lerp_slerp_ablation");
    let o = run(
        bin,
        &["--skip-synthetic", "--frames", "6", "--strides", "2,3", "--batch", "3", "--backend", "cpu", "--out", out],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("SYNTHETIC WEIGHTS"), "the synthetic-weights caveat is printed:\n{stdout}");
    assert!(!dir.path().join("lerp_slerp_norm.csv").exists(), "--skip-synthetic skips the synthetic part");
    let csv = dir.path().join("lerp_slerp_trajectory.csv");
    let get = provenance(&csv);
    assert!(get("weights").starts_with("synthetic"), "{}", get("weights"));
    assert_eq!(get("engine_profile"), "cpu-reduced");
    assert!(get("weights_caveat").starts_with("SYNTHETIC WEIGHTS"));
    assert!(get("dense_motion").contains("lag 1: mean"));
    assert!(get("trajectory").contains("no silence bypass"));
    // --device auto (the default): what the engines crate picks on this machine and build.
    assert_eq!(
        get("engine_device"),
        cadence_engines::select_device(cadence_engines::DeviceRequest::Auto).unwrap().label()
    );
    let header = std::fs::read_to_string(&csv).unwrap().lines().find(|l| !l.starts_with('#')).unwrap().to_string();
    assert!(
        header.starts_with("stride,method,weights_kind,engine_profile,frames,keyframes,inbetween_frames,"),
        "{header}"
    );
    let rows: Vec<TrajectoryRow> = experiments::read_rows(&csv).unwrap();
    assert_eq!(rows.len(), 4, "2 strides x 2 methods");
    // 6 frames: stride 2 keeps 0, 2, 4, 5 (2 in between); stride 3 keeps 0, 3, 5 (3 in between).
    for (k, keys, between) in [(2, 4, 2), (3, 3, 3)] {
        for m in ["lerp", "slerp"] {
            let r = rows.iter().find(|r| r.stride == k && r.method == m).unwrap_or_else(|| panic!("no row {k} {m}"));
            assert_eq!((r.frames, r.keyframes, r.inbetween_frames), (6, keys, between), "{r:?}");
            assert_eq!(r.weights_kind, "synthetic");
            assert_eq!(r.engine_profile, "cpu-reduced");
            assert!(r.keyframe_angle_mean_rad > 0.0 && r.keyframe_angle_max_rad >= r.keyframe_angle_mean_rad);
            assert!(r.norm_deficit_worst.abs() >= r.norm_deficit_mean.abs());
            assert!(r.norm_vs_dense_worst.abs() >= r.norm_vs_dense_mean.abs());
            // What any infill must achieve, whatever the weights: each in-between frame closer to
            // the dense frame than its nearest keyframe is, in latent space and after decoding
            // (frames written to the wrong positions, or decoded out of order, fail this).
            assert!(
                r.latent_rel_error_mean > 0.0 && r.latent_rel_error_mean < 0.8 * r.hold_latent_rel_error_mean,
                "{r:?}"
            );
            assert!(r.psnr_db_mean > r.hold_psnr_db_mean + 1.0 && r.psnr_db_min <= r.psnr_db_mean, "{r:?}");
            assert!(r.ssim_mean > 0.0 && r.ssim_mean <= 1.0 && r.ssim_min <= r.ssim_mean);
            assert!(r.sharpness_mean > 0.0 && r.dense_sharpness_mean > 0.0);
            assert!((r.sharpness_ratio - r.sharpness_mean / r.dense_sharpness_mean).abs() < 1e-9);
        }
        let lerp = rows.iter().find(|r| r.stride == k && r.method == "lerp").unwrap();
        let slerp = rows.iter().find(|r| r.stride == k && r.method == "slerp").unwrap();
        // Whatever the weights: SLERP keeps the interpolated norm, LERP falls short of it.
        assert!(slerp.norm_deficit_worst.abs() < 1e-5, "SLERP deficit {}", slerp.norm_deficit_worst);
        assert!(
            lerp.norm_deficit_mean < 0.0 && lerp.norm_deficit_worst < 0.0,
            "LERP deficit {}",
            lerp.norm_deficit_mean
        );
        assert!(lerp.norm_deficit_mean.abs() > 10.0 * slerp.norm_deficit_mean.abs());
    }
    for f in ["lerp_slerp_trajectory.png", "lerp_slerp_trajectory.svg"] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
}

#[test]
fn ablation_rejects_bad_trajectory_arguments() {
    let bin = env!("CARGO_BIN_EXE_lerp_slerp_ablation");
    fails_with(bin, &["--skip-synthetic", "--skip-trajectory"], "leave nothing to do");
    fails_with(bin, &["--skip-synthetic", "--strides", "1,2"], "at least 2");
    fails_with(bin, &["--skip-synthetic", "--frames", "4", "--strides", "4"], "must exceed the largest stride");
}

/// `--device` of the pipeline experiments (SessionArgs): bad strings are usage errors, `cuda` in a
/// build without the engines' CUDA feature names the feature, and --help documents the flag.
#[test]
fn pipeline_experiments_take_an_engine_device() {
    let bins = [
        env!("CARGO_BIN_EXE_stride_table"),
        env!("CARGO_BIN_EXE_calibrate"),
        env!("CARGO_BIN_EXE_lerp_slerp_ablation"),
    ];
    for bin in bins {
        let help = run(bin, &["--help"]);
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(
            text.contains("--device <DEVICE>") && text.contains("engines-cuda") && text.contains("[default: auto]"),
            "{bin}: {text}"
        );
        fails_with(bin, &["--device", "gpu"], "expected auto, cpu, cuda or cuda:N");
        fails_with(bin, &["--device", "cuda:x"], "`x` is not a device ordinal");
    }
    if !cadence_engines::device::CUDA_COMPILED {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_str().unwrap();
        fails_with(bins[0], &["--device", "cuda", "--frames", "4", "--out", out], "`engines-cuda` feature");
        fails_with(bins[1], &["--device", "cuda", "--frames", "4", "--out", out], "scripts/build_cuda.sh");
        fails_with(
            bins[2],
            &["--skip-synthetic", "--device", "cuda", "--frames", "6", "--out", out],
            "`engines-cuda` feature",
        );
    }
}

#[test]
fn calibrate_end_to_end_has_the_source_json_shape() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_calibrate");
    run(
        bin,
        &[
            "--frames",
            "10",
            "--strides",
            "1,2",
            "--runs",
            "1",
            "--batch",
            "2",
            "--no-encoder",
            "--backend",
            "cpu",
            "--device",
            "cpu",
            "--out",
            out,
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("calibrate.json")).unwrap()).unwrap();
    let m = &json["benchmarks"]["musetalk"];
    for engine in ["unet", "taesd"] {
        assert!(m[engine]["engine"].is_string(), "{engine}.engine in {m}");
        assert!(m[engine]["throughput_fps"].as_f64().unwrap() > 0.0, "{engine}.throughput_fps");
    }
    for (k, duty) in [(1u64, "100%"), (2, "60%")] {
        let p = &m["stride_projections"][format!("stride_{k}")];
        assert_eq!(p["stride"].as_u64(), Some(k), "{p}");
        assert_eq!(p["unet_duty_cycle"].as_str(), Some(duty), "10 frames at stride {k}: {p}");
        assert!(p["description"].is_string());
        let (proj, meas, err) = (
            p["projected_fps"].as_f64().unwrap(),
            p["measured_fps"].as_f64().unwrap(),
            p["error_pct"].as_f64().unwrap(),
        );
        assert!(proj > 0.0 && meas > 0.0);
        assert!((err - 100.0 * (proj - meas) / meas).abs() < 1e-9, "error_pct is (projected - measured) / measured");
    }
    assert!(json["provenance"]["weights"].as_str().unwrap().starts_with("synthetic"));
    let csv = dir.path().join("calibrate.csv");
    let get = provenance(&csv);
    assert_eq!(get("engine_profile"), "cpu-reduced");
    assert_eq!(get("engine_device"), "cpu");
    assert_eq!(json["provenance"]["engine_device"].as_str(), Some("cpu"));
    assert!(get("load_average").contains("noisy"));
    assert!(
        experiments::read_provenance(&csv).unwrap().iter().all(|(k, _)| k != "count_mismatch"),
        "the projected evaluation counts match the render's"
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(lines[0].starts_with("stride,frames,keyframes,unet_evaluations,decoded_frames,bypassed_frames,unet_duty_cycle_pct,projected_fps,measured_fps,error_pct,"));
    assert_eq!(lines.len(), 3, "header + strides 1 and 2");
}
