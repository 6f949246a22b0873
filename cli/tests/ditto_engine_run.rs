//! `cadence engine-run` on Ditto's networks: inputs and outputs by the names of Ditto's ONNX
//! exports, one `.npy` per output, bad inputs refused before anything is written. The networks'
//! numbers are tested against PyTorch in engines/tests/ditto*.rs; here the CLI's outputs must be
//! the library's on the same inputs and weights.

mod common;
use common::{cadence, s, stderr};

use std::path::{Path, PathBuf};

use cadence::io::npy::{self, Array};
use cadence_engines::ditto::lmdm::{LmdmConfig, MotionDecoder};
use cadence_engines::ditto::stitch::{StitchConfig, StitchingNetwork};
use cadence_engines::{WeightsSource, DEFAULT_SEED};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ditto").join(name)
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| scale * ((i as f32 * 0.37).sin())).collect()
}

fn read(p: &Path) -> (Vec<usize>, Vec<f32>) {
    match npy::read(p).unwrap() {
        Array::F32 { shape, data } => (shape, data),
        Array::F16 { .. } => panic!("f16 output"),
    }
}

#[test]
fn stitch_runs_from_dittos_checkpoint_by_onnx_names() {
    let d = tempfile::tempdir().unwrap();
    let (ks, kd, out) = (d.path().join("ks.npy"), d.path().join("kd.npy"), d.path().join("out"));
    let (a, b) = (ramp(2 * 63, 0.5), ramp(2 * 63, 0.6));
    npy::save(&ks, &[2, 21, 3], &a).unwrap();
    npy::save(&kd, &[2, 21, 3], &b).unwrap();
    let inputs = format!("kp_source={},kp_driving={}", s(&ks), s(&kd));
    let weights = fixture("stitch.pth");
    let o = cadence(&[
        "engine-run",
        "--model",
        "ditto-stitch",
        "--weights",
        s(&weights),
        "--inputs",
        &inputs,
        "--output-dir",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (shape, got) = read(&out.join("out.npy"));
    assert_eq!(shape, [2, 21, 3]);
    let net = StitchingNetwork::new(&StitchConfig::default(), &WeightsSource::File(weights)).unwrap();
    assert_eq!(got, net.forward(&a, &b).unwrap());
}

#[test]
fn lmdm_step_writes_pred_noise_and_x_start() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(format!("{n}.npy"));
    let (x, cf, c) = (ramp(80 * 265, 1.0), ramp(265, 0.5), ramp(80 * 1103, 0.3));
    npy::save(&p("x"), &[1, 80, 265], &x).unwrap();
    npy::save(&p("cond_frame"), &[1, 265], &cf).unwrap();
    npy::save(&p("cond"), &[1, 80, 1103], &c).unwrap();
    npy::save(&p("time_cond"), &[1], &[499f32]).unwrap();
    let out = d.path().join("out");
    let inputs = ["x", "cond_frame", "cond", "time_cond"].map(|n| format!("{n}={}", s(&p(n)))).join(",");
    let o = cadence(&["engine-run", "--model", "ditto-lmdm", "--inputs", &inputs, "--output-dir", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let net = MotionDecoder::new(&LmdmConfig::default(), &WeightsSource::Synthetic { seed: DEFAULT_SEED }).unwrap();
    let want = net.step(&x, &cf, &c, 499).unwrap();
    let (shape, x_start) = read(&out.join("x_start.npy"));
    assert_eq!(shape, [1, 80, 265]);
    assert_eq!(x_start, want.x_start);
    assert_eq!(read(&out.join("pred_noise.npy")).1, want.pred_noise);
}

#[test]
fn bad_ditto_inputs_are_one_line_errors_and_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(format!("{n}.npy"));
    npy::save(&p("x"), &[1, 80, 265], &vec![0.5f32; 80 * 265]).unwrap();
    let mut nan = vec![0.5f32; 265];
    nan[3] = f32::NAN;
    npy::save(&p("cond_frame_nan"), &[1, 265], &nan).unwrap();
    npy::save(&p("cond_frame"), &[1, 265], &[0.5f32; 265]).unwrap();
    npy::save(&p("cond"), &[1, 80, 1103], &vec![0.1f32; 80 * 1103]).unwrap();
    npy::save(&p("short"), &[1, 79, 1103], &vec![0.1f32; 79 * 1103]).unwrap();
    npy::save(&p("time_cond"), &[1], &[3f32]).unwrap();
    let out = d.path().join("out");
    let lmdm = |inputs: &str, extra: &[&str]| {
        let mut a = vec!["engine-run", "--model", "ditto-lmdm", "--inputs", inputs, "--output-dir", s(&out)];
        a.extend_from_slice(extra);
        cadence(&a)
    };
    let x = format!("x={}", s(&p("x")));
    let (cf, cfn) = (format!("cond_frame={}", s(&p("cond_frame"))), format!("cond_frame={}", s(&p("cond_frame_nan"))));
    let (c, short, t) = (
        format!("cond={}", s(&p("cond"))),
        format!("cond={}", s(&p("short"))),
        format!("time_cond={}", s(&p("time_cond"))),
    );
    let reduced = fixture("lmdm.pth");
    let cases = [
        (lmdm(&[x.as_str(), &cf, &c].join(","), &[]), "input `time_cond` is missing"),
        (lmdm(&[x.as_str(), &cf, &c, &t, "noise=a.npy"].join(","), &[]), "has no input `noise`"),
        (lmdm(&[x.as_str(), &cfn, &c, &t].join(","), &[]), "NaN or infinity"),
        (lmdm(&[x.as_str(), &cf, &short, &t].join(","), &[]), "`cond` must have shape [1, 80, 1103]"),
        // The fixture's reduced-size LMDM: the first tensor of another shape is named.
        (lmdm(&[x.as_str(), &cf, &c, &t].join(","), &["--weights", s(&reduced)]), "time_mlp.1.weight"),
        (
            cadence(&["engine-run", "--model", "ditto-stitch", "--input", s(&p("x")), "--output", s(&p("o"))]),
            "takes --inputs kp_source=FILE.npy,kp_driving=FILE.npy",
        ),
    ];
    for (o, needle) in cases {
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{needle}: {err}");
        assert!(err.contains(needle), "want `{needle}` in: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(!out.join("x_start.npy").exists() && !out.join("pred_noise.npy").exists());
    }
}

/// Output names and shapes.
type Outputs = Vec<(&'static str, Vec<usize>)>;

/// Every Ditto network and HuBERT at its published size with synthetic weights on small inputs:
/// each output is written under its ONNX name with the network's shape, and is finite.
#[test]
fn every_ditto_network_writes_its_outputs_by_onnx_name() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(format!("{n}.npy"));
    npy::save(&p("image16"), &[1, 3, 16, 16], &ramp(3 * 16 * 16, 0.5).iter().map(|v| v + 0.5).collect::<Vec<_>>())
        .unwrap();
    npy::save(&p("image64"), &[1, 3, 64, 64], &ramp(3 * 64 * 64, 0.5).iter().map(|v| v + 0.5).collect::<Vec<_>>())
        .unwrap();
    npy::save(&p("f3d"), &[1, 32, 16, 32, 32], &ramp(32 * 16 * 32 * 32, 1.0)).unwrap();
    npy::save(&p("kp_s"), &[1, 21, 3], &ramp(63, 0.5)).unwrap();
    npy::save(&p("kp_d"), &[1, 21, 3], &ramp(63, 0.55)).unwrap();
    npy::save(&p("feature"), &[1, 256, 4, 4], &ramp(256 * 16, 1.0)).unwrap();
    npy::save(&p("audio"), &[1, 800], &ramp(800, 0.2)).unwrap();
    let kp = format!("kp_source={},kp_driving={}", s(&p("kp_s")), s(&p("kp_d")));
    let cases: [(&str, String, Outputs); 5] = [
        ("ditto-appearance", format!("image={}", s(&p("image16"))), vec![("pred", vec![1, 32, 16, 4, 4])]),
        (
            "ditto-motion",
            format!("image={}", s(&p("image64"))),
            vec![
                ("pitch", vec![1, 66]),
                ("yaw", vec![1, 66]),
                ("roll", vec![1, 66]),
                ("t", vec![1, 3]),
                ("exp", vec![1, 63]),
                ("scale", vec![1, 1]),
                ("kp", vec![1, 63]),
            ],
        ),
        ("ditto-warp", format!("feature_3d={},{kp}", s(&p("f3d"))), vec![("out", vec![1, 256, 32, 32])]),
        ("ditto-decoder", format!("feature={}", s(&p("feature"))), vec![("output", vec![1, 3, 32, 32])]),
        ("hubert", format!("input_values={}", s(&p("audio"))), vec![("encoding_out", vec![1, 2, 1024])]),
    ];
    for (model, inputs, outputs) in cases {
        let out = d.path().join(model);
        let o = cadence(&["engine-run", "--model", model, "--inputs", &inputs, "--output-dir", s(&out)]);
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        for (name, shape) in outputs {
            let (got, data) = read(&out.join(format!("{name}.npy")));
            assert_eq!(got, shape, "{model} `{name}`");
            assert!(data.iter().all(|v| v.is_finite()), "{model} `{name}`");
        }
    }
}

/// `engine-bench` on Ditto's per-frame networks and the LMDM at the cpu-reduced profile: a rate
/// against the same run's matmul for each.
#[test]
fn engine_bench_covers_dittos_networks() {
    for model in ["ditto-warp", "ditto-decoder", "ditto-stitch", "ditto-lmdm"] {
        let o = cadence(&["engine-bench", "--model", model, "--batch", "1", "--runs", "1", "--device", "cpu"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        assert!(out.contains("profile cpu-reduced") && out.contains("% of the matmul rate"), "{model}: {out}");
        assert!(out.contains("weights synthetic"), "{model}: {out}");
    }
}
