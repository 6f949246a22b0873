//! f64 references and random data shared by the host tests.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn randn(r: &mut StdRng, n: usize) -> Vec<f32> {
    use rand_distr::{Distribution, StandardNormal};
    (0..n).map(|_| StandardNormal.sample(r)).collect()
}

pub fn uniform(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

pub fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

pub fn to64<T: cadence::Elem>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// Angle between two vectors, computed stably in f64.
pub fn angle(a: &[f64], b: &[f64]) -> f64 {
    let (na, nb) = (norm(a), norm(b));
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x / na - y / nb).powi(2)).sum::<f64>().sqrt();
    let s: f64 = a.iter().zip(b).map(|(x, y)| (x / na + y / nb).powi(2)).sum::<f64>().sqrt();
    2.0 * d.atan2(s)
}

/// Geodesic SLERP with norm re-projection to (1-a)|v0| + a|v1|, in f64 (docs/design.md, the kernels' mathematics).
pub fn slerp_ref(v0: &[f64], v1: &[f64], alpha: f64) -> Vec<f64> {
    let (n0, n1) = (norm(v0), norm(v1));
    let theta = angle(v0, v1);
    let target = (1.0 - alpha) * n0 + alpha * n1;
    // Identical directions: the limit of the weights as theta -> 0.
    let (w0, w1) = if theta < 1e-12 {
        (1.0 - alpha, alpha)
    } else {
        ((((1.0 - alpha) * theta).sin()) / theta.sin(), (alpha * theta).sin() / theta.sin())
    };
    let mut out: Vec<f64> = v0.iter().zip(v1).map(|(a, b)| w0 * a / n0 + w1 * b / n1).collect();
    let r = norm(&out);
    out.iter_mut().for_each(|x| *x *= target / r);
    out
}

pub fn lerp_ref(v0: &[f64], v1: &[f64], alpha: f64) -> Vec<f64> {
    v0.iter().zip(v1).map(|(a, b)| (1.0 - alpha) * a + alpha * b).collect()
}

/// ||a - b|| / ||b||.
pub fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    d / norm(b).max(f64::MIN_POSITIVE)
}

/// A unit vector at exactly `theta` from the unit vector `u` (in the plane of u and w).
pub fn at_angle(u: &[f64], w: &[f64], theta: f64) -> Vec<f64> {
    let dot: f64 = u.iter().zip(w).map(|(a, b)| a * b).sum();
    let mut p: Vec<f64> = w.iter().zip(u).map(|(b, a)| b - dot * a).collect();
    let np = norm(&p);
    p.iter_mut().for_each(|x| *x /= np);
    u.iter().zip(&p).map(|(a, b)| theta.cos() * a + theta.sin() * b).collect()
}

pub fn unit(v: Vec<f64>) -> Vec<f64> {
    let n = norm(&v);
    v.into_iter().map(|x| x / n).collect()
}

pub fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// NV12 of planar 8-bit-scale RGB in f64: the formula of docs/design.md, the kernels' mathematics, 2x2 averaged chroma.
pub fn nv12_ref(rgb: &[f32], w: usize, h: usize, pitch: usize, signed: bool, bt601: bool) -> Vec<u8> {
    let (ky, ku, kv): ([f64; 3], [f64; 3], [f64; 3]) = if bt601 {
        ([0.256788, 0.504129, 0.097906], [-0.148223, -0.290993, 0.439216], [0.439216, -0.367788, -0.071427])
    } else {
        ([0.182586, 0.614231, 0.062007], [-0.100644, -0.338572, 0.439216], [0.439216, -0.398942, -0.040274])
    };
    let plane = pitch * h;
    let px = |c: usize, x: usize, y: usize| {
        let v = rgb[c * plane + y * pitch + x] as f64;
        let u = if signed { (v + 1.0) / 2.0 } else { v };
        u.clamp(0.0, 1.0) * 255.0
    };
    let q = |x: f64| (x + 0.5).floor().clamp(0.0, 255.0) as u8;
    let mut out = vec![0u8; w * h * 3 / 2];
    for y in 0..h {
        for x in 0..w {
            out[y * w + x] = q(16.0 + ky[0] * px(0, x, y) + ky[1] * px(1, x, y) + ky[2] * px(2, x, y));
        }
    }
    for by in 0..h / 2 {
        for bx in 0..w / 2 {
            let avg = |c| {
                (px(c, 2 * bx, 2 * by)
                    + px(c, 2 * bx + 1, 2 * by)
                    + px(c, 2 * bx, 2 * by + 1)
                    + px(c, 2 * bx + 1, 2 * by + 1))
                    / 4.0
            };
            let (r, g, b) = (avg(0), avg(1), avg(2));
            out[w * h + by * w + 2 * bx] = q(128.0 + ku[0] * r + ku[1] * g + ku[2] * b);
            out[w * h + by * w + 2 * bx + 1] = q(128.0 + kv[0] * r + kv[1] * g + kv[2] * b);
        }
    }
    out
}

/// Records that a test could check nothing on this machine: a `SKIPPED` line on stderr, and a line
/// in `target/tmp/skipped-tests.txt`, which `scripts/test.sh` (the test command) counts and lists
/// after the run, so a skip never passes unseen.
pub fn skipped(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("{test}: {reason}");
    eprintln!("SKIPPED: {line}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// The CUDA backend for a per-device test: `None` (recorded as skipped) on a machine without a
/// CUDA driver; on a machine with one, a backend that fails to start fails the test.
pub fn cuda_backend(test: &str) -> Option<cadence::Backend> {
    if !cadence::backend::cuda::driver_present() {
        skipped(test, "no CUDA driver on this machine");
        return None;
    }
    let c =
        cadence::backend::cuda::CudaBackend::new(0).expect("a CUDA driver is present, so the CUDA backend must start");
    Some(cadence::Backend::Cuda(Box::new(c)))
}

/// One named test per device for a test body `fn name(b: &Backend)` (candle's `test_device!`):
/// `name::cpu`, `name::emulated` (the CUDA kernels in the SIMT emulator) and `name::cuda`.
#[macro_export]
macro_rules! test_device {
    ($name:ident) => {
        mod $name {
            #[test]
            fn cpu() {
                super::$name(&cadence::Backend::Cpu)
            }
            #[test]
            fn emulated() {
                super::$name(&cadence::Backend::Emulated)
            }
            #[test]
            fn cuda() {
                if let Some(b) = $crate::common::cuda_backend(concat!(stringify!($name), "::cuda")) {
                    super::$name(&b)
                }
            }
        }
    };
}
