//! `cadence gpu-check`: every entry point of the kernel table (`cadence_kernels::KERNELS`, f32 and
//! f16) run on a device and compared with the CPU path on fresh random data, then a short render
//! with the device's kernels compared with the same render on the CPU. The device is the GPU (a
//! CUDA driver is needed; a timing table follows), or with `--emulate` the kernels themselves in
//! cadence's SIMT emulator (`cadence_kernels::emu`: no GPU, every memory access bounds-checked,
//! the CUDA backend's launch shapes; no timings, the emulator's speed says nothing about the
//! kernels'). A kernel that fails to run is a failed row, not an abort: the report always lists
//! every check, and the command exits non-zero when any failed, after writing it.

use crate::backend::composite::{Compositor, FaceBox};
use crate::backend::cuda::CudaBackend;
use crate::backend::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::measure::bench::{bench_expand, median};
use crate::measure::fixtures::test_data;
use crate::musetalk::FACE_SIDE;
use crate::{Backend, KeyframeSchedule};
use anyhow::{bail, Result};
use cadence_kernels::{kernel_name, Op, Storage, KERNELS};
use half::f16;

#[derive(Debug, serde::Serialize)]
pub struct Check {
    /// The entry point (or `render` for the end-to-end check).
    pub kernel: String,
    pub case: String,
    /// max |device - cpu| over max |cpu| (for NV12 bytes: the largest difference in LSB); none
    /// when the kernel failed to run.
    pub max_err: Option<f64>,
    pub tolerance: f64,
    pub pass: bool,
    /// Why the kernel did not run (an emulator fault, a CUDA error).
    pub error: Option<String>,
}

fn rel_max<T: Elem>(dev: &[T], cpu: &[T]) -> f64 {
    if dev.len() != cpu.len() {
        return f64::INFINITY;
    }
    let scale = cpu.iter().map(|x| x.to_f32().abs() as f64).fold(0.0, f64::max).max(1e-30);
    let worst = dev
        .iter()
        .zip(cpu)
        .map(|(a, b)| {
            let (a, b) = (a.to_f32() as f64, b.to_f32() as f64);
            if a.is_nan() || b.is_nan() {
                f64::INFINITY
            } else {
                (a - b).abs()
            }
        })
        .fold(0.0, f64::max);
    worst / scale
}

fn lsb_max(dev: &[u8], cpu: &[u8]) -> f64 {
    if dev.len() != cpu.len() {
        return f64::INFINITY;
    }
    dev.iter().zip(cpu).map(|(&x, &y)| x.abs_diff(y)).max().unwrap_or(0) as f64
}

fn convert<T: Elem>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// Runs checks on `device` against `cpu` and keeps every row.
struct Checker<'a> {
    device: &'a Backend,
    cpu: &'a Backend,
    seed: u64,
    /// Kernel names (or `render`) to check; empty: all.
    only: &'a [String],
    checks: Vec<Check>,
}

impl Checker<'_> {
    fn wants(&self, kernel: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|k| k == kernel)
    }

    fn next_seed(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(1);
        self.seed
    }

    /// One row: `err` is the measured error (or why the kernel could not run).
    fn record(&mut self, kernel: &str, case: String, tolerance: f64, err: Result<f64>) {
        let (max_err, error) = match err {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        let pass = max_err.is_some_and(|e| e <= tolerance);
        self.checks.push(Check { kernel: kernel.into(), case, max_err, tolerance, pass, error });
    }

    /// Expansion, pair interpolation, easing and NV12 in storage type `T`.
    fn typed<T: Elem>(&mut self, tol: f64) {
        let (dev, cpu) = (self.device, self.cpu);
        let storage = T::DTYPE.storage();
        let wants = |op| self.wants(kernel_name(op, storage));
        let (w_expand, w_slerp, w_ease, w_nv12) =
            (wants(Op::Expand), wants(Op::SlerpPairs), wants(Op::Ease), wants(Op::RgbToNv12));
        for &(n, k, dim) in &[(640usize, 2usize, 4096usize), (640, 3, 4096), (1, 3, 4096), (17, 40, 999), (101, 7, 33)]
        {
            for method in [Method::Slerp, Method::Lerp] {
                let seed = self.next_seed();
                if !w_expand {
                    continue;
                }
                let err = (|| {
                    let s = KeyframeSchedule::fixed_stride(n, k)?;
                    let keys: Vec<T> = convert(&test_data(s.count() * dim, seed));
                    Ok(rel_max(&dev.expand(&keys, &s, dim, method)?, &cpu.expand(&keys, &s, dim, method)?))
                })();
                let case = format!("N={n} k={k} D={dim} {method:?}");
                self.record(kernel_name(Op::Expand, storage), case, tol, err);
            }
        }
        let (rows, dim) = (300, 4096);
        let v0: Vec<T> = convert(&test_data(rows * dim, self.next_seed()));
        let v1: Vec<T> = convert(&test_data(rows * dim, self.next_seed()));
        let alphas: Vec<f32> = (0..rows).map(|i| i as f32 / (rows - 1) as f32).collect();
        for method in [Method::Slerp, Method::Lerp].into_iter().filter(|_| w_slerp) {
            let err = (|| {
                let d = dev.slerp_pairs(&v0, &v1, &alphas, dim, method)?;
                Ok(rel_max(&d, &cpu.slerp_pairs(&v0, &v1, &alphas, dim, method)?))
            })();
            self.record(kernel_name(Op::SlerpPairs, storage), format!("{rows} rows D={dim} {method:?}"), tol, err);
        }
        let speech: Vec<bool> = (0..200).map(|i| (i / 23) % 3 != 1).collect();
        let distance = crate::schedules::keyframes::speech_distance(&speech);
        let rest: Vec<T> = convert(&test_data(dim, self.next_seed()));
        let frames: Vec<T> = convert(&test_data(200 * dim, self.next_seed()));
        if w_ease {
            let err = (|| {
                let (mut a, mut b) = (frames.clone(), frames.clone());
                dev.ease(&mut a, &rest, &distance, 4)?;
                cpu.ease(&mut b, &rest, &distance, 4)?;
                Ok(rel_max(&a, &b))
            })();
            self.record(kernel_name(Op::Ease, storage), "200 frames, ramp 4".into(), tol, err);
        }
        for &(w, h, pitch, frames) in &[(256usize, 256usize, 256usize, 8usize), (1080, 1920, 1088, 2), (6, 4, 7, 3)] {
            for (m, r) in [(ColorMatrix::Bt709, RgbRange::Unit), (ColorMatrix::Bt601, RgbRange::Signed)] {
                let layout = RgbLayout { width: w, height: h, pitch, frames };
                let seed = self.next_seed();
                if !w_nv12 {
                    continue;
                }
                let err = (|| {
                    let rgb: Vec<T> =
                        convert(&test_data(layout.len(), seed).iter().map(|x| x * 0.3 + 0.5).collect::<Vec<_>>());
                    Ok(lsb_max(&dev.rgb_to_nv12(&rgb, layout, m, r)?, &cpu.rgb_to_nv12(&rgb, layout, m, r)?))
                })();
                let case = format!("{w}x{h} pitch {pitch} x{frames} {m:?} {r:?}");
                self.record(kernel_name(Op::RgbToNv12, storage), case, 1.0, err);
            }
        }
    }

    /// The face compositor (bilinear resize, feathered blend, NV12) with a crop stored as `T`.
    fn composite<T: Elem>(&mut self) {
        let (dev, cpu) = (self.device, self.cpu);
        if !self.wants(kernel_name(Op::CompositeNv12, T::DTYPE.storage())) {
            return;
        }
        for &(w, h, face, crop, feather) in &[
            (1080usize, 1920usize, FaceBox { x: 284, y: 544, w: 512, h: 512 }, 256usize, 64.0f32),
            (96, 64, FaceBox { x: 20, y: 10, w: 40, h: 36 }, 16, 6.0),
            (64, 64, FaceBox { x: 0, y: 0, w: 64, h: 64 }, 100, 0.0),
        ] {
            let (s1, s2) = (self.next_seed(), self.next_seed());
            let err = (|| {
                let bg: Vec<u8> =
                    test_data(w * h * 3, s1).iter().map(|v| ((v * 0.3 + 0.5).clamp(0.0, 1.0) * 255.0) as u8).collect();
                let rgb: Vec<T> =
                    convert(&test_data(3 * crop * crop, s2).iter().map(|v| v * 0.4 + 0.5).collect::<Vec<_>>());
                let g = Compositor::new(dev, &bg, w, h, face, feather, ColorMatrix::Bt709)?;
                let c = Compositor::new(cpu, &bg, w, h, face, feather, ColorMatrix::Bt709)?;
                let (mut a, mut b) = (vec![0u8; g.frame_bytes()], vec![0u8; c.frame_bytes()]);
                g.compose_frame(&rgb, crop, crop, RgbRange::Unit, &mut a)?;
                c.compose_frame(&rgb, crop, crop, RgbRange::Unit, &mut b)?;
                Ok(lsb_max(&a, &b))
            })();
            let case = format!("{w}x{h} box {}x{} crop {crop} feather {feather}", face.w, face.h);
            self.record(kernel_name(Op::CompositeNv12, T::DTYPE.storage()), case, 1.0, err);
        }
    }

    /// Hermite weights over [-0.5, 1.5] (clamped outside [0, 1]), endpoints included.
    fn hermite(&mut self, tol: f64) {
        if !self.wants(kernel_name(Op::Hermite, Storage::F32)) {
            return;
        }
        let t: Vec<f32> = (0..=4000).map(|i| -0.5 + i as f32 / 2000.0).chain([0.0, 1.0, f32::MIN_POSITIVE]).collect();
        let err = (|| Ok(rel_max(&self.device.hermite(&t)?, &self.cpu.hermite(&t)?)))();
        self.record(kernel_name(Op::Hermite, Storage::F32), format!("{} values in [-0.5, 1.5]", t.len()), tol, err);
    }

    /// The 3-D grid sample: odd sizes with two batch items, grid points spread over [-1.36, 1.36]
    /// (so some fall outside the volume) plus NaN, infinite and edge coordinates; and Ditto's
    /// warp, a 1x32x16x64x64 volume sampled at the identity grid displaced by up to ~0.1.
    /// Both sides run the same operations in the same order (expected bitwise equal).
    fn grid_sample(&mut self, tol: f64) {
        let name = kernel_name(Op::GridSample3d, Storage::F32);
        if !self.wants(name) {
            return;
        }
        for &(input, out) in &[([2usize, 5, 6, 7, 9], [4usize, 6, 5]), ([1, 32, 16, 64, 64], [16, 64, 64])] {
            let (s1, s2) = (self.next_seed(), self.next_seed());
            let grid_shape = [input[0], out[0], out[1], out[2], 3];
            let ditto = input[1] == 32;
            let err = (|| {
                let volume = test_data(input.iter().product(), s1);
                let jitter = test_data(grid_shape.iter().product(), s2);
                let grid: Vec<f32> = if ditto {
                    // The identity grid (voxel centres) plus a displacement of up to ~0.1.
                    let centre = |i: usize, n: usize| (2 * i + 1) as f32 / n as f32 - 1.0;
                    (0..jitter.len())
                        .map(|k| {
                            let (v, axis) = (k / 3, k % 3);
                            let (z, y, x) = (v / (out[1] * out[2]), v / out[2] % out[1], v % out[2]);
                            let c = [centre(x, out[2]), centre(y, out[1]), centre(z, out[0])][axis];
                            c + 0.03 * jitter[k]
                        })
                        .collect()
                } else {
                    let mut g: Vec<f32> = jitter.iter().map(|x| 0.4 * x).collect();
                    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, 1.0, 1e30];
                    for (k, &x) in special.iter().enumerate() {
                        g[7 * k + 1] = x;
                    }
                    g
                };
                let d = self.device.grid_sample_3d(&volume, input, &grid, grid_shape)?;
                Ok(rel_max(&d, &self.cpu.grid_sample_3d(&volume, input, &grid, grid_shape)?))
            })();
            let [n, c, dd, h, w] = input;
            let case = format!(
                "{}{n}x{c}x{dd}x{h}x{w} at {}x{}x{} points",
                if ditto { "Ditto " } else { "" },
                out[0],
                out[1],
                out[2]
            );
            self.record(name, case, tol, err);
        }
    }

    /// The whole render loop with the device's kernels (engines on the CPU, as in the default
    /// build) against the same render with the CPU's: expansion, easing and compositing run on the
    /// device with the pipeline's own uploads and downloads.
    fn render(&mut self) {
        use crate::measure::fixtures::CheckClip;
        use crate::musetalk::{DecoderKind, Engines};
        if !self.wants("render") {
            return;
        }
        let mut case = String::from("40 frames stride 3");
        let err = (|| {
            let engines =
                Engines::load(cadence_engines::Profile::Cpu, DecoderKind::Taesd, &cadence_engines::Device::Cpu, None)?;
            let clip = CheckClip::new(&engines, 40, 7)?;
            case = format!("{case}, {}x{} box in {}x{}", clip.face.w, clip.face.h, clip.width, clip.height);
            let (g, _) = clip.render(&engines, self.device)?;
            let (c, _) = clip.render(&engines, self.cpu)?;
            if g.len() != c.len() {
                bail!("{} frames on the device, {} on the CPU", g.len(), c.len());
            }
            Ok(g.iter().zip(&c).map(|(a, b)| lsb_max(a, b)).fold(0.0, f64::max))
        })();
        self.record("render", format!("{case}, kernels on {}", self.device.name()), 1.0, err);
    }

    /// A failed row for every kernel of the table no check ran (a kernel added to the table
    /// without a check here).
    fn coverage(&mut self) {
        for k in &KERNELS {
            if self.wants(k.name) && !self.checks.iter().any(|c| c.kernel == k.name) {
                self.record(
                    k.name,
                    "no check".into(),
                    0.0,
                    Err(anyhow::anyhow!("gpu-check has no check for this kernel")),
                );
            }
        }
    }
}

/// Every check of the table on `device` against `cpu` (the rows `gpu-check` prints), or those of
/// the kernels named in `only` (entry point names, `render`).
pub fn kernel_checks(device: &Backend, cpu: &Backend, seed: u64, only: &[String]) -> Result<Vec<Check>> {
    for name in only {
        anyhow::ensure!(
            name == "render" || KERNELS.iter().any(|k| k.name == name),
            "no kernel named '{name}': the kernels are {} (and `render`)",
            KERNELS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        );
    }
    let mut c = Checker { device, cpu, seed, only, checks: Vec::new() };
    // f32: both sides compute in f32, in different reduction orders; f16 outputs may differ by one
    // f16 rounding step (2^-11 relative).
    c.typed::<f32>(1e-5);
    c.typed::<f16>(2e-3);
    c.composite::<f32>();
    c.composite::<f16>();
    c.hermite(1e-6);
    c.grid_sample(1e-6);
    c.render();
    c.coverage();
    Ok(c.checks)
}

#[derive(serde::Serialize)]
pub struct Report {
    pub device: String,
    pub cpu: String,
    /// The first seed of the random inputs (printed, so a failure can be looked at again).
    pub seed: u64,
    pub checks: Vec<Check>,
    pub failed: usize,
    /// GPU timings (none in the emulator).
    pub expand: Vec<crate::measure::bench::ExpandBench>,
    pub nv12_1080x1920_ms: Option<f64>,
    pub nv12_gbps: Option<f64>,
    pub composite_512_ms: Option<f64>,
    /// Why the timings could not be taken (counted in `failed`).
    pub timing_error: Option<String>,
}

impl Report {
    /// An error naming the failed checks, if any (after the report has been written).
    pub fn verdict(&self) -> Result<()> {
        if self.failed > 0 {
            bail!("{} checks failed (see the table above)", self.failed);
        }
        Ok(())
    }
}

fn print_checks(checks: &[Check]) {
    println!("{:<20} {:<48} {:>12} {:>10}  result", "kernel", "case", "max err", "tolerance");
    for c in checks {
        let err = c.max_err.map_or("-".to_string(), |e| format!("{e:.3e}"));
        let result = match (&c.error, c.pass) {
            (Some(e), _) => format!("ERROR: {e}"),
            (None, true) => "ok".into(),
            (None, false) => "MISMATCH".into(),
        };
        println!("{:<20} {:<48} {:>12} {:>10.1e}  {result}", c.kernel, c.case, err, c.tolerance);
    }
}

/// Runs the checks (of the kernels in `only`; all when empty) on the GPU, and times it, or with
/// `emulate` in the emulator.
pub fn run(reps: usize, emulate: bool, only: &[String]) -> Result<Report> {
    let device = if emulate { Backend::Emulated } else { Backend::Cuda(Box::new(CudaBackend::new(0)?)) };
    let cpu = Backend::Cpu;
    println!("device: {}", device.describe());
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    println!("seed: {seed}");
    let checks = kernel_checks(&device, &cpu, seed, only)?;
    print_checks(&checks);
    let failed = checks.iter().filter(|c| !c.pass).count();
    let mut report = Report {
        device: device.describe(),
        cpu: cpu.describe(),
        seed,
        checks,
        failed,
        expand: Vec::new(),
        nv12_1080x1920_ms: None,
        nv12_gbps: None,
        composite_512_ms: None,
        timing_error: None,
    };
    if let (Backend::Cuda(c), true) = (&device, only.is_empty()) {
        if let Err(e) = time_on_gpu(c, &device, &cpu, reps, &mut report) {
            report.timing_error = Some(format!("{e:#}"));
            report.failed += 1;
            println!("timings: ERROR: {e:#}");
        }
    }
    Ok(report)
}

/// The timing table on the GPU (the expansion against the CPU's, NV12, compositing).
fn time_on_gpu(c: &CudaBackend, device: &Backend, cpu: &Backend, reps: usize, report: &mut Report) -> Result<()> {
    for b in [cpu, device] {
        for k in [2, 3] {
            report.expand.push(bench_expand::<f32>(b, 640, k, 4096, Method::Slerp, reps)?);
        }
    }
    crate::measure::bench::print_expand_table(&report.expand);
    let layout = RgbLayout::packed(1080, 1920, 1);
    let rgb = c.upload(&test_data(layout.len(), 3))?;
    let mut out = c.alloc::<u8>(layout.nv12_frame_bytes())?;
    let t =
        median(&c.time_ms(3, reps, || {
            c.rgb_to_nv12_on_device(&rgb, layout, ColorMatrix::Bt709, RgbRange::Unit, &mut out)
        })?);
    let gbps = (layout.len() * 4 + layout.nv12_frame_bytes()) as f64 / (t * 1e-3) / 1e9;
    println!("rgb_to_nv12_f32 1080x1920: {t:.4} ms median of {reps}, {gbps:.1} GB/s");
    let bg = vec![128u8; 1080 * 1920 * 3];
    let face = FaceBox { x: 284, y: 544, w: 512, h: 512 };
    let comp = Compositor::new(device, &bg, 1080, 1920, face, 64.0, ColorMatrix::Bt709)?;
    let crop = c.upload(&test_data(3 * FACE_SIDE * FACE_SIDE, 4))?;
    let mut frame = c.alloc::<u8>(comp.frame_bytes())?;
    let dc = comp.device().expect("built on CUDA");
    let tc = median(&c.time_ms(3, reps, || {
        dc.compose_on_device(&crop.as_view(), FACE_SIDE, FACE_SIDE, RgbRange::Unit, comp.target(), &mut frame)
    })?);
    println!("composite_nv12_f32 512x512 box in 1080x1920 (256x256 crop): {tc:.4} ms median of {reps}");
    (report.nv12_1080x1920_ms, report.nv12_gbps, report.composite_512_ms) = (Some(t), Some(gbps), Some(tc));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The render check compares two different implementations: the device code (here in the
    /// emulator) against the CPU path, frame by frame.
    #[test]
    fn render_check_compares_the_emulated_kernels_with_the_cpu() {
        let checks = kernel_checks(&Backend::Emulated, &Backend::Cpu, 1, &["render".into()]).unwrap();
        assert_eq!(checks.len(), 1);
        let c = &checks[0];
        assert_eq!(c.kernel, "render");
        assert!(c.case.starts_with("40 frames stride 3") && c.case.ends_with("kernels on emulated"), "{}", c.case);
        assert!(c.pass, "{}: {:?} {:?}", c.case, c.max_err, c.error);
    }

    #[test]
    fn unknown_kernel_names_are_refused() {
        let e = kernel_checks(&Backend::Emulated, &Backend::Cpu, 1, &["expand_f64".into()]).unwrap_err();
        assert!(e.to_string().starts_with("no kernel named 'expand_f64': the kernels are slerp_pairs_f32,"), "{e}");
    }
}
