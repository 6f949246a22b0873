//! Every kernel of the table launched in the SIMT emulator exactly as the CUDA backend launches
//! it (host/src/launch.rs), then with a planted launch error: one block fewer than the launch
//! shape says, and each buffer one element short. The right launch must match the CPU path; every
//! planted error must fail, naming the kernel (and for a short buffer, the buffer and the index
//! one past its end). And `gpu-check --emulate` itself: a planted error makes it report the
//! failed checks, exit non-zero and still write its JSON report; `scripts/gpu_check.sh` passes
//! the failure on.

use anyhow::Result;
use cadence::backend::composite::{Compositor, FaceBox};
use cadence::backend::emulated::{read_output, run};
use cadence::backend::launch::{self, CompositeTarget, Emulated};
use cadence::{Backend, ColorMatrix, KeyframeSchedule, Method, RgbLayout, RgbRange};
use cadence_kernels::emu::Buffer;
use std::process::Command;

/// What to break in a launch.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Plant {
    Nothing,
    /// One block fewer than the shape launch.rs computes.
    OneBlockShort,
    /// This buffer one element shorter than the kernel needs.
    Short(&'static str),
}

impl Plant {
    /// `v` as a buffer named `name`, one element short if that is the plant.
    fn buffer<T: cadence_kernels::emu::Scalar>(self, name: &'static str, v: &[T]) -> Buffer<T> {
        Buffer::from_slice(name, &v[..v.len() - (self == Plant::Short(name)) as usize])
    }
    fn output<T: cadence_kernels::emu::Scalar + Default>(self, name: &'static str, len: usize) -> Buffer<T> {
        Buffer::uninit(name, len - (self == Plant::Short(name)) as usize, T::default())
    }
    fn shape(self, s: &mut launch::Shape) {
        if self == Plant::OneBlockShort {
            s.blocks -= 1;
        }
    }
}

fn data(n: usize, seed: u64) -> Vec<f32> {
    cadence::measure::fixtures::test_data(n, seed)
}

fn as_f64<T: cadence::Elem>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// The largest difference between `a` and `b` relative to the largest |b| (infinite for
/// different lengths).
fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Runs `case` right (it must match `cpu` within `tol`: the float kernels sum in another order
/// than the CPU path; the byte outputs match exactly), then with every plant (each must fail).
fn check_plants(
    kernel: &str,
    buffers: &[&'static str],
    cpu: Vec<f64>,
    tol: f64,
    case: impl Fn(Plant) -> Result<Vec<f64>>,
) {
    let good = case(Plant::Nothing).unwrap_or_else(|e| panic!("{kernel}: the right launch failed: {e:#}"));
    let d = rel_diff(&good, &cpu);
    assert!(d <= tol, "{kernel}: the emulated kernel differs from the CPU path by {d:e}");
    let e = case(Plant::OneBlockShort).expect_err(&format!("{kernel}: one block short went unnoticed"));
    let msg = format!("{e:#}");
    assert!(msg.starts_with(&format!("kernel {kernel}")), "{msg}");
    assert!(msg.contains("never written"), "{kernel}: {msg}");
    for &b in buffers {
        let e = case(Plant::Short(b)).expect_err(&format!("{kernel}: `{b}` one element short went unnoticed"));
        let msg = format!("{e:#}");
        assert!(msg.starts_with(&format!("kernel {kernel}, block ")), "{msg}");
        assert!(msg.contains(&format!("`{b}`[")) && msg.contains("out of bounds"), "{kernel}: {msg}");
    }
}

#[test]
fn expand_launch_errors_are_caught() {
    // 9 intervals: 3 blocks of 4 warps, the last one part-full.
    let (s, dim) = (KeyframeSchedule::fixed_stride(28, 3).unwrap(), 70);
    let keys = data(s.count() * dim, 1);
    let cpu = Backend::Cpu.expand(&keys, &s, dim, Method::Slerp).unwrap();
    check_plants("expand_f32", &["keys", "key_idx", "out"], as_f64(&cpu), 1e-6, |p| {
        let (k, idx) = (p.buffer("keys", &keys), p.buffer("key_idx", s.keyframes()));
        let out = p.output::<f32>("out", s.n_frames() * dim);
        let mut l =
            launch::expand::<Emulated, f32>(k.ptr(), idx.ptr(), s.count(), out.ptr(), s.n_frames(), dim, Method::Slerp);
        p.shape(&mut l.shape);
        run(&l)?;
        Ok(as_f64(&read_output(l.kernel, &out)?))
    });
}

#[test]
fn slerp_pairs_launch_errors_are_caught() {
    let (rows, dim) = (9, 50);
    let (v0, v1) = (data(rows * dim, 2), data(rows * dim, 3));
    let alphas: Vec<f32> = (0..rows).map(|r| r as f32 / 8.0).collect();
    let cpu = Backend::Cpu.slerp_pairs(&v0, &v1, &alphas, dim, Method::Slerp).unwrap();
    check_plants("slerp_pairs_f32", &["v0", "v1", "alphas", "out"], as_f64(&cpu), 1e-6, |p| {
        let (a, b, al) = (p.buffer("v0", &v0), p.buffer("v1", &v1), p.buffer("alphas", &alphas));
        let out = p.output::<f32>("out", rows * dim);
        let mut l =
            launch::slerp_pairs::<Emulated, f32>(a.ptr(), b.ptr(), al.ptr(), out.ptr(), rows, dim, Method::Slerp);
        p.shape(&mut l.shape);
        run(&l)?;
        Ok(as_f64(&read_output(l.kernel, &out)?))
    });
}

#[test]
fn ease_launch_errors_are_caught() {
    // Easing is in place, so a frame the launch misses keeps its input: it shows as a frame
    // that differs from the CPU path, not as unwritten memory.
    let (n, dim, ramp) = (9, 40, 3);
    let distance: Vec<u32> = vec![0, 1, 2, 3, 4, 2, 1, 5, 4];
    let (frames, rest) = (data(n * dim, 4), data(dim, 5));
    let mut cpu = frames.clone();
    Backend::Cpu.ease(&mut cpu, &rest, &distance, ramp).unwrap();
    let case = |p: Plant| -> Result<Vec<f64>> {
        let f = p.buffer("frames", &frames);
        let (r, d) = (p.buffer("rest", &rest), p.buffer("distance", &distance));
        let mut l = launch::ease::<Emulated, f32>(f.ptr(), r.ptr(), d.ptr(), ramp, n, dim);
        p.shape(&mut l.shape);
        run(&l)?;
        Ok(as_f64(&f.to_vec()))
    };
    let d = rel_diff(&case(Plant::Nothing).unwrap(), &as_f64(&cpu));
    assert!(d <= 1e-6, "ease_f32: the emulated kernel differs from the CPU path by {d:e}");
    // The last block's frames stay as they came: far from the CPU's.
    let d = rel_diff(&case(Plant::OneBlockShort).unwrap(), &as_f64(&cpu));
    assert!(d > 1e-2, "ease_f32: one block short went unnoticed ({d:e})");
    for b in ["frames", "rest", "distance"] {
        let msg = format!("{:#}", case(Plant::Short(b)).unwrap_err());
        assert!(msg.starts_with("kernel ease_f32, block ") && msg.contains(&format!("`{b}`[")), "{msg}");
    }
}

#[test]
fn rgb_to_nv12_launch_errors_are_caught() {
    // 48 x 96: 1152 threads, five blocks of 256.
    let layout = RgbLayout::packed(48, 96, 1);
    let rgb: Vec<f32> = data(layout.len(), 6).iter().map(|x| x * 0.3 + 0.5).collect();
    let cpu = Backend::Cpu.rgb_to_nv12(&rgb, layout, ColorMatrix::Bt709, RgbRange::Unit).unwrap();
    check_plants("rgb_to_nv12_f32", &["rgb", "nv12"], cpu.iter().map(|&b| b as f64).collect(), 0.0, |p| {
        let input = p.buffer("rgb", &rgb);
        let out = p.output::<u8>("nv12", layout.nv12_frame_bytes());
        let mut l =
            launch::rgb_to_nv12::<Emulated, f32>(input.ptr(), layout, ColorMatrix::Bt709, RgbRange::Unit, out.ptr());
        p.shape(&mut l.shape);
        run(&l)?;
        Ok(read_output(l.kernel, &out)?.iter().map(|&b| b as f64).collect())
    });
}

#[test]
fn composite_nv12_launch_errors_are_caught() {
    // An 80 x 60 box (1200 threads: five blocks of 256) in the bottom-right corner of a 100 x 90 frame,
    // so the box's last pixel is the frame's last byte.
    let (w, h, cw, ch) = (100usize, 90usize, 30usize, 26usize);
    let face = FaceBox { x: 20, y: 30, w: 80, h: 60 };
    let bg: Vec<u8> = data(w * h * 3, 7).iter().map(|v| ((v * 0.3 + 0.5).clamp(0.0, 1.0) * 255.0) as u8).collect();
    let crop: Vec<f32> = data(3 * cw * ch, 8).iter().map(|v| v * 0.4 + 0.5).collect();
    let comp = Compositor::new(&Backend::Cpu, &bg, w, h, face, 7.0, ColorMatrix::Bt709).unwrap();
    let mut cpu = vec![0u8; comp.frame_bytes()];
    comp.compose_frame(&crop, cw, ch, RgbRange::Unit, &mut cpu).unwrap();
    let (alpha, terms) = comp.per_render_data();
    let target = CompositeTarget { width: w, height: h, face, matrix: ColorMatrix::Bt709 };
    check_plants(
        "composite_nv12_f32",
        &["crop", "alpha", "background_term", "frame"],
        cpu.iter().map(|&b| b as f64).collect(),
        0.0,
        |p| {
            let (c, a, t) = (p.buffer("crop", &crop), p.buffer("alpha", alpha), p.buffer("background_term", &terms));
            let frame = p.buffer("frame", comp.background_nv12());
            cadence::backend::emulated::discard_box(&frame, target);
            let mut l = launch::composite_nv12::<Emulated, f32>(
                c.ptr(),
                cw,
                ch,
                RgbRange::Unit,
                a.ptr(),
                t.ptr(),
                frame.ptr(),
                target,
            );
            p.shape(&mut l.shape);
            run(&l)?;
            Ok(read_output(l.kernel, &frame)?.iter().map(|&b| b as f64).collect())
        },
    );
}

#[test]
fn hermite_launch_errors_are_caught() {
    let t: Vec<f32> = (0..1500).map(|i| i as f32 / 1000.0 - 0.2).collect();
    let cpu = Backend::Cpu.hermite(&t).unwrap();
    check_plants("hermite_f32", &["t", "out"], as_f64(&cpu), 0.0, |p| {
        let (input, out) = (p.buffer("t", &t), p.output::<f32>("out", t.len()));
        let mut l = launch::hermite::<Emulated>(input.ptr(), out.ptr(), t.len());
        p.shape(&mut l.shape);
        run(&l)?;
        Ok(as_f64(&read_output(l.kernel, &out)?))
    });
}

#[test]
fn grid_sample_3d_launch_errors_are_caught() {
    // Two batch items of 8x9x10 points: 1440 threads, six blocks of 256. The last point of the
    // last item lies a quarter voxel beyond the centre of the volume's far corner voxel, so the
    // last element of `input` (that voxel in the last channel) is read.
    let (input_shape, out) = ([2usize, 3, 5, 6, 7], [8usize, 9, 10]);
    let s = cadence::GridSample3d::new(input_shape, [2, out[0], out[1], out[2], 3]).unwrap();
    let input = data(s.input_elements(), 9);
    let mut grid: Vec<f32> = data(s.grid_elements(), 10).iter().map(|x| 0.4 * x).collect();
    let n = grid.len();
    grid[n - 3..].copy_from_slice(&[6.5 / 7.0, 5.5 / 6.0, 4.5 / 5.0]);
    let gshape = [2, out[0], out[1], out[2], 3];
    let cpu = Backend::Cpu.grid_sample_3d(&input, input_shape, &grid, gshape).unwrap();
    check_plants("grid_sample_3d_f32", &["input", "grid", "out"], as_f64(&cpu), 0.0, |p| {
        let (i, g) = (p.buffer("input", &input), p.buffer("grid", &grid));
        let o = p.output::<f32>("out", s.output_elements());
        let mut l = launch::grid_sample_3d::<Emulated>(i.ptr(), g.ptr(), o.ptr(), &s);
        p.shape(&mut l.shape);
        run(&l)?;
        Ok(as_f64(&read_output(l.kernel, &o)?))
    });
}

/// The CLI's failure path: a planted launch error in one kernel (the emulated backend's fault
/// hook) makes `gpu-check --emulate` print the failure, write the report and exit non-zero.
#[test]
fn gpu_check_reports_a_planted_launch_error_and_still_writes_its_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let bin = env!("CARGO_BIN_EXE_cadence");
    let args = ["gpu-check", "--emulate", "--kernel", "hermite_f32", "--kernel", "rgb_to_nv12_f16", "--json"];
    let o = Command::new(bin)
        .args(args)
        .arg(&json)
        .env(cadence::backend::emulated::PLANT_ENV, "hermite_f32")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!o.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("1 checks failed"), "{stderr}");
    // 4004 values, one thread each: the plant launches one block fewer than they need.
    let block = cadence::backend::launch::ITEM_BLOCK as usize;
    let unwritten = 4004 - (4004usize.div_ceil(block) - 1) * block;
    let unwritten = format!("ERROR: kernel hermite_f32: {unwritten} of the 4004 elements of `out` were never written");
    assert!(stdout.contains(&unwritten), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["failed"], 1);
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 7, "one hermite row and six NV12 rows");
    assert!(checks.iter().filter(|c| c["kernel"] == "rgb_to_nv12_f16").all(|c| c["pass"] == true));
    // The same run without the plant passes (replacing the report needs --force).
    let o = Command::new(bin).args(args).arg(&json).arg("--force").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `scripts/gpu_check.sh` keeps gpu-check's exit status through its log pipe.
#[test]
fn gpu_check_script_fails_when_gpu_check_fails() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (name, gpu_check_status) in [("failing", 1), ("passing", 0)] {
        // A stand-in for the binary: every subcommand succeeds except gpu-check as told.
        let stub = dir.path().join(name);
        std::fs::write(
            &stub,
            format!(
                "#!/bin/sh\nif [ \"$1\" = gpu-check ]; then echo checks; exit {gpu_check_status}; fi\necho \"$1\"\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let out = dir.path().join(format!("{name}-out"));
        let o =
            Command::new("bash").arg(root.join("scripts/gpu_check.sh")).arg(&stub).env("OUT", &out).output().unwrap();
        let log = std::fs::read_to_string(out.join("gpu_check.log")).unwrap();
        assert_eq!(o.status.success(), gpu_check_status == 0, "{name}: {log}");
        assert!(log.contains(&format!("gpu-check exit: {gpu_check_status}")), "{name}: {log}");
    }
}
