//! The `cadence` binary end to end: outputs, and bad input (clear error, non-zero exit, no
//! output file).

mod common;
use common::{cadence, s, stderr};

use std::process::Command;

#[test]
fn expand_f32_and_f16_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.npy");
    let out = dir.path().join("frames.npy");
    // 10 frames at stride 3: keyframes 0 3 6 9.
    let data: Vec<f32> = (0..4 * 2 * 3 * 5).map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0).collect();
    cadence::io::npy::save(&keys, &[4, 2, 3, 5], &data).unwrap();
    let o = cadence(&[
        "expand",
        "--input",
        s(&keys),
        "--output",
        s(&out),
        "--frames",
        "10",
        "--stride",
        "3",
        "--backend",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let arr = cadence::io::npy::read(&out).unwrap();
    assert_eq!(arr.shape(), &[10, 2, 3, 5]);
    let cadence::io::npy::Array::F32 { data: frames, .. } = arr else { panic!("dtype changed") };
    assert_eq!(&frames[3 * 30..4 * 30], &data[30..60]);

    let data16: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
    let keys16 = dir.path().join("keys16.npy");
    let out16 = dir.path().join("frames16.npy");
    cadence::io::npy::save(&keys16, &[4, 30], &data16).unwrap();
    let o = cadence(&[
        "expand",
        "--input",
        s(&keys16),
        "--output",
        s(&out16),
        "--frames",
        "10",
        "--keyframes",
        "0,3,6,9",
        "--method",
        "lerp",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let arr = cadence::io::npy::read(&out16).unwrap();
    assert_eq!(arr.shape(), &[10, 30]);
    assert_eq!(arr.dtype(), cadence::Dtype::F16);
}

#[test]
fn expand_bad_inputs_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.npy");
    let out = dir.path().join("frames.npy");
    cadence::io::npy::save(&keys, &[4, 8], &[0.5f32; 32]).unwrap();
    let mut nan = vec![0.5f32; 32];
    nan[17] = f32::NAN;
    let nan_keys = dir.path().join("nan.npy");
    cadence::io::npy::save(&nan_keys, &[4, 8], &nan).unwrap();
    let garbage = dir.path().join("garbage.npy");
    std::fs::write(&garbage, b"not an npy file at all").unwrap();
    let truncated = dir.path().join("truncated.npy");
    let bytes = std::fs::read(&keys).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 9]).unwrap();
    let ints = dir.path().join("ints.npy");
    npyz::to_file_1d(&ints, vec![1i32, 2, 3, 4]).unwrap();

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--input", s(&keys), "--frames", "10", "--stride", "2"], "schedule"), // 6 keyframes needed
        (vec!["--input", s(&keys), "--frames", "10", "--stride", "0"], "stride"),
        (
            vec!["--input", s(&nan_keys), "--frames", "10", "--stride", "3"],
            "keyframe 2, element 1 is not a finite number",
        ),
        (vec!["--input", s(&garbage), "--frames", "10", "--stride", "3"], "is not a usable .npy file"),
        (vec!["--input", s(&truncated), "--frames", "10", "--stride", "3"], "truncated"),
        (vec!["--input", s(&ints), "--frames", "10", "--stride", "3"], "dtype"),
        (vec!["--input", "/nonexistent/keys.npy", "--frames", "10", "--stride", "3"], "cannot read"),
        (vec!["--input", s(&keys), "--frames", "10", "--keyframes", "0,5,3,9"], "strictly increasing"),
    ];
    for (args, needle) in cases {
        let mut full = vec!["expand", "--output", s(&out)];
        full.extend(args.iter());
        let o = cadence(&full);
        assert!(!o.status.success(), "{full:?} should fail");
        assert!(stderr(&o).contains(needle), "{full:?}: expected '{needle}' in: {}", stderr(&o));
        assert!(!out.exists(), "{full:?} left an output file");
    }
    // No leftovers of partial writes either.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn existing_output_is_not_overwritten_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.npy");
    let out = dir.path().join("frames.npy");
    cadence::io::npy::save(&keys, &[2, 4], &[1.0f32, 0., 0., 0., 0., 1., 0., 0.]).unwrap();
    std::fs::write(&out, b"precious").unwrap();
    let args = ["expand", "--input", s(&keys), "--output", s(&out), "--frames", "5", "--stride", "4"];
    let o = cadence(&args);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--force"));
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    let mut forced = args.to_vec();
    forced.push("--force");
    assert!(cadence(&forced).status.success());
    assert_eq!(cadence::io::npy::read(&out).unwrap().shape(), &[5, 4]);
}

#[test]
fn ptx_info_and_help() {
    for (arch, target) in [("sm_90", ".target sm_90"), ("sm_120", ".target sm_120"), ("portable", ".target sm_75")] {
        let o = cadence(&["ptx", "--arch", arch]);
        assert!(o.status.success());
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains(target) && text.contains(".entry expand_f32("), "{arch}");
    }
    let o = cadence(&["ptx", "--arch", "sm_52"]);
    assert!(!o.status.success() && stderr(&o).contains("available"));
    let o = cadence(&["info"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("backend (auto)"));
    for sub in ["ptx", "expand", "info"] {
        let o = cadence(&[sub, "--help"]);
        assert!(o.status.success() && !o.stdout.is_empty(), "{sub} --help");
    }
}

/// The engines' CUDA feature of this build (`engines-cuda` turns on cadence-engines' `cuda`).
const ENGINES_CUDA: bool = cfg!(feature = "engines-cuda");

#[test]
fn engine_device_flag() {
    let dir = tempfile::tempdir().unwrap();
    let lat = dir.path().join("lat.npy");
    let out = dir.path().join("out.npy");
    cadence::io::npy::save(&lat, &[1, 4, 2, 2], &[0.25f32; 16]).unwrap();
    // Bad strings: clap's usage error naming the accepted forms.
    for (dev, needle) in [("gpu", "unknown device"), ("cuda:x", "`x` is not a device ordinal")] {
        for sub in [
            vec!["engine-bench", "--model", "taesd", "--device", dev],
            vec!["engine-run", "--model", "taesd", "--input", s(&lat), "--output", s(&out), "--device", dev],
        ] {
            let o = cadence(&sub);
            let err = stderr(&o);
            assert!(!o.status.success(), "{sub:?} should fail");
            assert!(err.contains(needle) && err.contains("expected auto, cpu, cuda or cuda:N"), "{sub:?}: {err}");
        }
    }
    // cpu: runs there and says so.
    let o = cadence(&[
        "engine-run",
        "--model",
        "taesd",
        "--profile",
        "cpu-reduced",
        "--input",
        s(&lat),
        "--output",
        s(&out),
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("on cpu)"), "{}", stderr(&o));
    assert_eq!(cadence::io::npy::read(&out).unwrap().shape(), &[1, 3, 16, 16]);
    for sub in ["engine-bench", "engine-run", "render"] {
        let o = cadence(&[sub, "--help"]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success()
                && text.contains("--device <DEVICE>")
                && text.contains("engines-cuda")
                && text.contains("[default: auto]"),
            "{sub} --help: {text}"
        );
    }
}

#[test]
fn cuda_engine_device_without_the_feature_is_a_one_line_error() {
    if ENGINES_CUDA {
        return; // a CUDA build: `--device cuda` is valid (and needs a GPU)
    }
    let dir = tempfile::tempdir().unwrap();
    let lat = dir.path().join("lat.npy");
    let out = dir.path().join("out.npy");
    cadence::io::npy::save(&lat, &[1, 4, 2, 2], &[0.25f32; 16]).unwrap();
    for dev in ["cuda", "cuda:1"] {
        for sub in [
            vec!["engine-bench", "--model", "taesd", "--runs", "1", "--batch", "1", "--device", dev],
            vec!["engine-run", "--model", "taesd", "--input", s(&lat), "--output", s(&out), "--device", dev],
        ] {
            let o = cadence(&sub);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{sub:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{sub:?}: one line: {err}");
            assert!(err.starts_with("cadence: error: "), "{err}");
            assert!(err.contains("`engines-cuda` feature") && err.contains("scripts/build_cuda.sh"), "{sub:?}: {err}");
            assert!(o.stdout.is_empty(), "nothing measured: {}", String::from_utf8_lossy(&o.stdout));
            assert!(!out.exists());
        }
    }
}

/// `--backend emulated` runs the CUDA kernels in the SIMT emulator: same frames as the CPU path
/// (to float rounding: the kernel sums in another order), and the backend is named.
#[test]
fn expand_on_the_emulated_backend_matches_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.npy");
    let data: Vec<f32> = (0..5 * 64).map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0).collect();
    cadence::io::npy::save(&keys, &[5, 64], &data).unwrap();
    let mut frames = Vec::new();
    for backend in ["cpu", "emulated"] {
        let out = dir.path().join(format!("{backend}.npy"));
        let args = ["expand", "--input", s(&keys), "--output", s(&out), "--frames", "13", "--stride", "3"];
        let o = cadence(&[&args[..], &["--backend", backend]].concat());
        assert!(o.status.success(), "{backend}: {}", stderr(&o));
        let cadence::io::npy::Array::F32 { data, .. } = cadence::io::npy::read(&out).unwrap() else {
            panic!("dtype changed")
        };
        frames.push(data);
    }
    assert_eq!(frames[0].len(), 13 * 64);
    let worst = frames[0].iter().zip(&frames[1]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= 1e-6, "emulated vs cpu: {worst}");
}

#[test]
fn cadence_bench_writes_json_rows() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let bin = env!("CARGO_BIN_EXE_cadence");
    let args = ["bench", "--frames", "40", "--strides", "2,3", "--dim", "256", "--reps", "3", "--json"];
    let o = Command::new(bin).args(args).arg(&json).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4, "CPU: f32 and f16 at strides 2 and 3");
    for r in rows {
        let k = r["stride"].as_u64().unwrap() as usize;
        assert_eq!(r["frames"], 40);
        assert_eq!(
            r["keyframes"].as_u64().unwrap() as usize,
            cadence::KeyframeSchedule::fixed_stride_count(40, k).unwrap()
        );
        let (q1, med, q3) =
            (r["q1_ms"].as_f64().unwrap(), r["median_ms"].as_f64().unwrap(), r["q3_ms"].as_f64().unwrap());
        assert!(r["min_ms"].as_f64().unwrap() <= q1 && q1 <= med && med <= q3 && med > 0.0, "{r}");
    }
    // Not replaced without --force.
    let o = Command::new(bin).args(args).arg(&json).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--force"));
}
