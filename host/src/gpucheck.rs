//! `cadence gpu-check`: on a machine with a CUDA driver (no Rust needed), every kernel's CUDA
//! output against the CPU path on fresh random data, a short render with the kernels on the GPU
//! against the same render on the CPU, then the timing table. Non-zero exit on any mismatch.

use crate::bench::{bench_expand, median, test_data};
use crate::cuda::CudaBackend;
use crate::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::{Backend, KeyframeSchedule};
use anyhow::{bail, Result};
use half::f16;

#[derive(serde::Serialize)]
pub struct Check {
    pub kernel: String,
    pub case: String,
    /// max |gpu - cpu| over max |cpu| (for NV12: max difference in LSB).
    pub max_err: f64,
    pub tolerance: f64,
    pub pass: bool,
}

fn rel_max<T: Elem>(gpu: &[T], cpu: &[T]) -> f64 {
    let scale = cpu.iter().map(|x| x.to_f32().abs() as f64).fold(0.0, f64::max).max(1e-30);
    let worst = gpu
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

fn convert<T: Elem>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

fn checks_for<T: Elem>(cuda: &Backend, cpu: &Backend, seed: &mut u64, tol: f64, out: &mut Vec<Check>) -> Result<()> {
    let mut next_seed = || {
        *seed += 1;
        *seed
    };
    let dt = T::DTYPE;
    for &(n, k, dim) in &[(640usize, 2usize, 4096usize), (640, 3, 4096), (1, 3, 4096), (17, 40, 999), (101, 7, 33)] {
        for method in [Method::Slerp, Method::Lerp] {
            let s = KeyframeSchedule::fixed_stride(n, k)?;
            let keys: Vec<T> = convert(&test_data(s.count() * dim, next_seed()));
            let g = cuda.expand(&keys, &s, dim, method)?;
            let c = cpu.expand(&keys, &s, dim, method)?;
            let e = rel_max(&g, &c);
            out.push(Check {
                kernel: format!("expand_{dt}"),
                case: format!("N={n} k={k} D={dim} {method:?}"),
                max_err: e,
                tolerance: tol,
                pass: e <= tol,
            });
        }
    }
    let (rows, dim) = (300, 4096);
    let v0: Vec<T> = convert(&test_data(rows * dim, next_seed()));
    let v1: Vec<T> = convert(&test_data(rows * dim, next_seed()));
    let alphas: Vec<f32> = (0..rows).map(|i| i as f32 / (rows - 1) as f32).collect();
    for method in [Method::Slerp, Method::Lerp] {
        let e = rel_max(
            &cuda.slerp_pairs(&v0, &v1, &alphas, dim, method)?,
            &cpu.slerp_pairs(&v0, &v1, &alphas, dim, method)?,
        );
        out.push(Check {
            kernel: format!("slerp_pairs_{dt}"),
            case: format!("{rows} rows D={dim} {method:?}"),
            max_err: e,
            tolerance: tol,
            pass: e <= tol,
        });
    }
    let speech: Vec<bool> = (0..200).map(|i| (i / 23) % 3 != 1).collect();
    let distance = crate::schedule::speech_distance(&speech);
    let rest: Vec<T> = convert(&test_data(dim, next_seed()));
    let frames: Vec<T> = convert(&test_data(200 * dim, next_seed()));
    let (mut a, mut b) = (frames.clone(), frames);
    cuda.ease(&mut a, &rest, &distance, 4)?;
    cpu.ease(&mut b, &rest, &distance, 4)?;
    let e = rel_max(&a, &b);
    out.push(Check {
        kernel: format!("ease_{dt}"),
        case: "200 frames, ramp 4".into(),
        max_err: e,
        tolerance: tol,
        pass: e <= tol,
    });
    for &(w, h, pitch, frames) in &[(256usize, 256usize, 256usize, 8usize), (1080, 1920, 1088, 2), (6, 4, 7, 3)] {
        for (m, r) in [(ColorMatrix::Bt709, RgbRange::Unit), (ColorMatrix::Bt601, RgbRange::Signed)] {
            let layout = RgbLayout { width: w, height: h, pitch, frames };
            let rgb: Vec<T> =
                convert(&test_data(layout.len(), next_seed()).iter().map(|x| x * 0.3 + 0.5).collect::<Vec<_>>());
            let g = cuda.rgb_to_nv12(&rgb, layout, m, r)?;
            let c = cpu.rgb_to_nv12(&rgb, layout, m, r)?;
            let e = g.iter().zip(&c).map(|(&x, &y)| (x as i32 - y as i32).abs()).max().unwrap_or(0) as f64;
            out.push(Check {
                kernel: format!("rgb_to_nv12_{dt}"),
                case: format!("{w}x{h} pitch {pitch} x{frames} {m:?} {r:?}"),
                max_err: e,
                tolerance: 1.0,
                pass: e <= 1.0,
            });
        }
    }
    Ok(())
}

/// The face compositor (bilinear resize, feathered blend, NV12) on both backends.
fn composite_checks(cuda: &Backend, cpu: &Backend, seed: &mut u64, out: &mut Vec<Check>) -> Result<()> {
    use crate::composite::{Compositor, FaceBox};
    for &(w, h, face, crop, feather) in &[
        (1080usize, 1920usize, FaceBox { x: 284, y: 544, w: 512, h: 512 }, 256usize, 64.0f32),
        (96, 64, FaceBox { x: 20, y: 10, w: 40, h: 36 }, 16, 6.0),
        (64, 64, FaceBox { x: 0, y: 0, w: 64, h: 64 }, 100, 0.0),
    ] {
        *seed += 1;
        let bg: Vec<u8> =
            test_data(w * h * 3, *seed).iter().map(|v| ((v * 0.3 + 0.5).clamp(0.0, 1.0) * 255.0) as u8).collect();
        *seed += 1;
        let rgb: Vec<f32> = test_data(3 * crop * crop, *seed).iter().map(|v| v * 0.4 + 0.5).collect();
        let g = Compositor::new(cuda, &bg, w, h, face, feather, ColorMatrix::Bt709)?;
        let c = Compositor::new(cpu, &bg, w, h, face, feather, ColorMatrix::Bt709)?;
        let (mut a, mut b) = (vec![0u8; g.frame_bytes()], vec![0u8; c.frame_bytes()]);
        g.compose_frame(&rgb, crop, crop, RgbRange::Unit, &mut a)?;
        c.compose_frame(&rgb, crop, crop, RgbRange::Unit, &mut b)?;
        let e = a.iter().zip(&b).map(|(&x, &y)| (x as i32 - y as i32).abs()).max().unwrap_or(0) as f64;
        out.push(Check {
            kernel: "composite_nv12_f32".into(),
            case: format!("{w}x{h} box {}x{} crop {crop} feather {feather}", face.w, face.h),
            max_err: e,
            tolerance: 1.0,
            pass: e <= 1.0,
        });
    }
    Ok(())
}

/// The whole render loop with the kernels on the GPU (engines on the CPU, as in the default
/// build) against the same render on the CPU backend: expansion, easing and compositing run on
/// the device with the pipeline's own uploads and downloads.
fn render_check(cuda: &Backend, cpu: &Backend, out: &mut Vec<Check>) -> Result<()> {
    use crate::pipeline::{CheckClip, DecoderKind, Engines};
    let engines =
        Engines::load(cadence_engines::Profile::Cpu, DecoderKind::Taesd, &cadence_engines::Device::Cpu, None)?;
    let clip = CheckClip::new(&engines, 40, 7)?;
    let (g, _) = clip.render(&engines, cuda)?;
    let (c, _) = clip.render(&engines, cpu)?;
    let e = g.iter().zip(&c).flat_map(|(a, b)| a.iter().zip(b).map(|(&x, &y)| x.abs_diff(y))).max().unwrap_or(0) as f64;
    let case =
        format!("{} frames stride 3, {}x{} box in {}x{}", c.len(), clip.face.w, clip.face.h, clip.width, clip.height);
    out.push(Check {
        kernel: "render (CPU engines)".into(),
        case,
        max_err: e,
        tolerance: 1.0,
        pass: e <= 1.0 && g.len() == c.len(),
    });
    Ok(())
}

#[derive(serde::Serialize)]
pub struct Report {
    pub device: String,
    pub cpu: String,
    pub checks: Vec<Check>,
    pub expand: Vec<crate::bench::ExpandBench>,
    pub nv12_1080x1920_ms: f64,
    pub nv12_gbps: f64,
}

pub fn run(reps: usize) -> Result<Report> {
    let cuda = Backend::Cuda(Box::new(CudaBackend::new(0)?));
    let cpu = Backend::Cpu;
    println!("device: {}", cuda.describe());
    let mut checks = Vec::new();
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    // f32: both sides compute in f32 with different reduction orders; f16 outputs may differ
    // by one f16 rounding step (2^-11 relative).
    checks_for::<f32>(&cuda, &cpu, &mut seed, 1e-5, &mut checks)?;
    checks_for::<f16>(&cuda, &cpu, &mut seed, 2e-3, &mut checks)?;
    composite_checks(&cuda, &cpu, &mut seed, &mut checks)?;
    render_check(&cuda, &cpu, &mut checks)?;
    println!("{:<20} {:<40} {:>12} {:>10}  result", "kernel", "case", "max err", "tolerance");
    for c in &checks {
        println!(
            "{:<20} {:<40} {:>12.3e} {:>10.1e}  {}",
            c.kernel,
            c.case,
            c.max_err,
            c.tolerance,
            if c.pass { "ok" } else { "MISMATCH" }
        );
    }
    let mut expand = Vec::new();
    for b in [&cpu, &cuda] {
        for k in [2, 3] {
            expand.push(bench_expand::<f32>(b, 640, k, 4096, Method::Slerp, reps)?);
        }
    }
    crate::bench::print_expand_table(&expand);
    let Backend::Cuda(c) = &cuda else { unreachable!() };
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
    let face = crate::composite::FaceBox { x: 284, y: 544, w: 512, h: 512 };
    let comp = crate::composite::Compositor::new(&cuda, &bg, 1080, 1920, face, 64.0, ColorMatrix::Bt709)?;
    let crop = c.upload(&test_data(3 * 256 * 256, 4))?;
    let mut frame = c.alloc::<u8>(comp.frame_bytes())?;
    let dc = comp.device().expect("built on CUDA");
    let tc = median(
        &c.time_ms(3, reps, || dc.compose_on_device(&crop.as_view(), 256, 256, RgbRange::Unit, &comp, &mut frame))?,
    );
    println!("composite_nv12_f32 512x512 box in 1080x1920 (256x256 crop): {tc:.4} ms median of {reps}");
    let failed = checks.iter().filter(|c| !c.pass).count();
    let report =
        Report { device: cuda.describe(), cpu: cpu.describe(), checks, expand, nv12_1080x1920_ms: t, nv12_gbps: gbps };
    if failed > 0 {
        bail!("{failed} kernel checks failed (see the table above)");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The render check's own plumbing, with the CPU on both sides (no GPU here): equal frames.
    #[test]
    fn render_check_passes_for_identical_backends() {
        let mut checks = Vec::new();
        render_check(&Backend::Cpu, &Backend::Cpu, &mut checks).unwrap();
        assert_eq!(checks.len(), 1);
        assert!(checks[0].pass && checks[0].max_err == 0.0, "{}: {}", checks[0].case, checks[0].max_err);
        assert!(checks[0].case.starts_with("40 frames"), "{}", checks[0].case);
    }
}
