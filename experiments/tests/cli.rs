//! The experiment binaries end to end on tiny sizes: outputs, columns, provenance, values.

use std::path::Path;
use std::process::Command;

mod common;
use common::run;

fn data_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect()
}

#[test]
fn every_binary_has_help() {
    for bin in [
        env!("CARGO_BIN_EXE_lerp_slerp_ablation"),
        env!("CARGO_BIN_EXE_kernel_bench"),
        env!("CARGO_BIN_EXE_stride_table"),
        env!("CARGO_BIN_EXE_calibrate"),
        env!("CARGO_BIN_EXE_cross_arch"),
        env!("CARGO_BIN_EXE_profile_shares"),
    ] {
        let out = run(bin, &["--help"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--out <"), "{bin}: {text}");
        assert!(text.lines().next().is_some_and(|l| l.len() > 20), "{bin}: no description: {text}");
    }
}

#[test]
fn ablation_writes_the_contract_columns_and_correct_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let o = run(
        env!("CARGO_BIN_EXE_lerp_slerp_ablation"),
        &["--dim", "256", "--angles", "5", "--alphas", "0.25,0.5", "--skip-trajectory", "--out", out],
    );
    assert!(o.status.success());
    assert!(!dir.path().join("lerp_slerp_trajectory.csv").exists());
    let csv = dir.path().join("lerp_slerp_norm.csv");
    let prov = experiments::read_provenance(&csv).unwrap();
    let get = |k: &str| {
        prov.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no {k} in {prov:?}"))
    };
    assert!(get("backend").starts_with("cpu"), "{}", get("backend"));
    assert_eq!(get("engine_profile"), "n/a");
    assert_eq!(get("weights"), "n/a");
    let lines = data_lines(&csv);
    assert_eq!(lines[0], "theta_rad,alpha,lerp_norm_ratio,slerp_norm_ratio,analytic_lerp_ratio");
    assert_eq!(lines.len(), 1 + 5 * 2);
    for l in &lines[1..] {
        let v: Vec<f64> = l.split(',').map(|x| x.parse().unwrap()).collect();
        let (theta, alpha, lerp, slerp, analytic) = (v[0], v[1], v[2], v[3], v[4]);
        let expected =
            ((1.0 - alpha).powi(2) + alpha * alpha + 2.0 * alpha * (1.0 - alpha) * theta.cos()).max(0.0).sqrt();
        assert!((analytic - expected).abs() < 1e-12);
        if alpha == 0.5 {
            assert!((analytic - (theta / 2.0).cos()).abs() < 1e-9, "cos(theta/2) at alpha 0.5");
        }
        assert!((lerp - analytic).abs() < 1e-5, "measured LERP {lerp} vs analytic {analytic} at theta {theta}");
        if theta < std::f64::consts::PI - 1e-9 {
            assert!((slerp - 1.0).abs() < 1e-5, "SLERP keeps the interpolated norm: {slerp} at theta {theta}");
        }
    }
    for f in ["lerp_slerp_norm.png", "lerp_slerp_norm.svg", "lerp_slerp_norm_alphas.png", "lerp_slerp_norm_alphas.svg"]
    {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
}

#[test]
fn ablation_rejects_bad_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_lerp_slerp_ablation"))
        .args(["--alphas", "0.5,1.5", "--out", "/nonexistent-dir-for-test"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("alpha 1.5 is outside (0, 1)"));
}

#[test]
fn kernel_bench_covers_every_kernel_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    run(
        env!("CARGO_BIN_EXE_kernel_bench"),
        &[
            "--frames",
            "5",
            "--latents",
            "1x4x4",
            "--nv12",
            "8x4",
            "--nv12-frames",
            "2",
            "--composite",
            "16x12/8/6",
            "--min-reps",
            "3",
            "--max-reps",
            "4",
            "--warmup",
            "0",
            "--backends",
            "cpu",
            "--out",
            out,
        ],
    );
    let csv = dir.path().join("kernel_bench.csv");
    let lines = data_lines(&csv);
    assert_eq!(
        lines[0],
        "backend,kernel,dtype,method,shape,frames,stride,keyframes,compulsory_bytes,reps,median_ms,min_ms,gbps,copy_gbps,ratio_to_copy"
    );
    let rows: Vec<Vec<String>> = lines[1..].iter().map(|l| l.split(',').map(str::to_string).collect()).collect();
    // expand and slerp_pairs: 2 types x 2 methods; ease: 2 types; NV12: 2 types; compositing: f32.
    assert_eq!(rows.len(), 4 + 4 + 2 + 2 + 1);
    for kernel in ["expand", "slerp_pairs", "ease", "rgb_to_nv12"] {
        for dt in ["f32", "f16"] {
            assert!(rows.iter().any(|r| r[1] == kernel && r[2] == dt), "{kernel} {dt} missing");
        }
    }
    for r in &rows {
        let num = |i: usize| r[i].parse::<f64>().unwrap();
        assert!((3.0..=4.0).contains(&num(9)), "timed runs within --min-reps..--max-reps: {r:?}");
        assert!(num(12) > 0.0 && num(13) > 0.0, "{r:?}");
        assert!(
            (num(14) - num(12) / num(13)).abs() <= 1e-9 * num(14).abs().max(1.0),
            "ratio is GB/s over copy GB/s: {r:?}"
        );
    }
    // Compulsory bytes, by hand: N=5 frames at stride 3 -> keyframes 0, 3, 4; 16 elements.
    let expand_f32 = rows.iter().find(|r| r[1] == "expand" && r[2] == "f32").unwrap();
    assert_eq!(expand_f32[7], "3");
    assert_eq!(expand_f32[8], ((3 + 5) * 16 * 4).to_string());
    let nv12_f16 = rows.iter().find(|r| r[1] == "rgb_to_nv12" && r[2] == "f16").unwrap();
    assert_eq!(nv12_f16[8], (2 * (3 * 8 * 4 * 2 + 8 * 4 * 3 / 2)).to_string());
    // Compositing a 6x6 crop into an 8x8 box: crop + 4 per-pixel f32 terms in, the box's NV12 out.
    let comp = rows.iter().find(|r| r[1] == "composite_nv12").unwrap();
    assert_eq!((comp[2].as_str(), comp[4].as_str()), ("f32", "16x12/8/6"));
    assert_eq!(comp[8], (3 * 6 * 6 * 4 + 4 * 8 * 8 * 4 + 8 * 8 * 3 / 2).to_string());
    assert!(dir.path().join("kernel_bench.png").is_file() && dir.path().join("kernel_bench.svg").is_file());
}

#[test]
fn kernel_bench_rejects_bad_compositing_cases() {
    for (case, msg) in [
        ("10x10/12/6", "must be even-sized and hold the box"),
        ("10x10/8", "WIDTHxHEIGHT/BOX/CROP"),
        ("10x10/8/5", "even numbers"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_kernel_bench"))
            .args(["--kernels", "composite", "--composite", case, "--out", dir.path().to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(msg), "{case}: {err}");
        assert!(!dir.path().join("kernel_bench.csv").exists(), "{case}: no output on bad input");
    }
}

#[test]
fn pipeline_experiments_refuse_a_zero_batch_before_loading_engines() {
    let dir = tempfile::tempdir().unwrap();
    for bin in [env!("CARGO_BIN_EXE_stride_table"), env!("CARGO_BIN_EXE_calibrate")] {
        let out = Command::new(bin).args(["--batch", "0", "--out"]).arg(dir.path()).output().unwrap();
        assert!(!out.status.success(), "{bin}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("0 is not in 1..=1024"),
            "{bin}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{bin} wrote into the output directory");
    }
}
