//! Measurement helpers shared by `cadence bench`, `cadence gpu-check` and the experiments:
//! medians of repeated runs, and the copy-bandwidth bound measured in the same run.

use crate::elem::{Elem, Method};
use crate::schedule::KeyframeSchedule;
use crate::{cpu, Backend};
use anyhow::Result;
use rayon::prelude::*;
use std::time::Instant;

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

/// Wall-clock milliseconds of `reps` runs of `f` after `warmup` runs.
pub fn time_host(warmup: usize, reps: usize, mut f: impl FnMut()) -> Vec<f64> {
    for _ in 0..warmup {
        f();
    }
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

/// Deterministic pseudo-random normal-ish data (sum of uniforms), without pulling an RNG
/// into the library: benchmarks and checks must never run on zeros.
pub fn test_data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n).map(|_| (next() + next() + next() + next() - 2.0) * 1.7).collect()
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ExpandBench {
    pub backend: String,
    pub frames: usize,
    pub stride: usize,
    pub keyframes: usize,
    pub frame_elems: usize,
    pub dtype: String,
    pub method: Method,
    pub reps: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    /// Compulsory bytes (each keyframe read once, each frame written once) over the median time.
    pub gbps: f64,
    /// Copy of the same number of bytes on the same backend, median, read + write counted.
    pub copy_gbps: f64,
    pub ratio_to_copy: f64,
    pub launches: usize,
}

/// The expansion at N frames, stride k, `dim` elements per frame, with its copy bound.
pub fn bench_expand<T: Elem>(backend: &Backend, frames: usize, stride: usize, dim: usize, method: Method, reps: usize) -> Result<ExpandBench> {
    let schedule = KeyframeSchedule::fixed_stride(frames, stride)?;
    let keys: Vec<T> = test_data(schedule.count() * dim, 7).into_iter().map(T::from_f32).collect();
    let bytes = ((schedule.count() + frames) * dim * std::mem::size_of::<T>()) as f64;
    let copy_bytes = frames * dim * std::mem::size_of::<T>();
    let (times, copy_times) = match backend {
        Backend::Cpu => {
            let mut out = vec![T::default(); frames * dim];
            let t = time_host(3, reps, || cpu::expand(&keys, &schedule, dim, method, &mut out));
            let src = vec![1u8; copy_bytes];
            let mut dst = vec![0u8; copy_bytes];
            let chunk = copy_bytes.div_ceil(rayon::current_num_threads()).max(1);
            let c = time_host(3, reps, || {
                dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
            });
            (t, c)
        }
        Backend::Cuda(c) => {
            let dk = c.upload(&keys)?;
            let di = c.upload(schedule.keyframes())?;
            let mut out = c.alloc::<T>(frames * dim)?;
            let t = c.time_ms(3, reps, || c.expand_on_device(&dk, &di, schedule.count(), &mut out, frames, dim, method))?;
            let src = c.upload(&vec![1u8; copy_bytes])?;
            let mut dst = c.alloc::<u8>(copy_bytes)?;
            let ct = c.time_ms(3, reps, || c.copy_once(&src, &mut dst))?;
            (t, ct)
        }
    };
    let med = median(&times);
    let copy_gbps = 2.0 * copy_bytes as f64 / (median(&copy_times) * 1e-3) / 1e9;
    let gbps = bytes / (med * 1e-3) / 1e9;
    Ok(ExpandBench {
        backend: backend.describe(),
        frames,
        stride,
        keyframes: schedule.count(),
        frame_elems: dim,
        dtype: T::DTYPE.to_string(),
        method,
        reps,
        median_ms: med,
        min_ms: times.iter().cloned().fold(f64::INFINITY, f64::min),
        gbps,
        copy_gbps,
        ratio_to_copy: gbps / copy_gbps,
        launches: if backend.is_cuda() { 1 } else { 0 },
    })
}
