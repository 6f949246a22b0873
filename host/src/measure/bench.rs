//! Measurement helpers shared by `cadence bench`, `cadence gpu-check` and the experiments:
//! medians of repeated runs, and the copy-bandwidth bound measured in the same run.
//!
//! Fairness of the CPU comparison (issue 2): the expansion and its copy reference run on the
//! same buffers (the keyframes and one output buffer, allocated and written before timing, so
//! neither pays first-touch page faults), move the same bytes (every keyframe read, every frame
//! written), are split over the same rayon tasks (one per keyframe interval), and are timed
//! back to back in every run, alternating which goes first. The ratio is the median over runs
//! of the per-run ratio, so a slow patch of a shared machine slows both sides of a pair rather
//! than one side of the table.

use crate::backend::elem::{Dtype, Elem, Method};
use crate::measure::fixtures::test_data;
use crate::schedules::keyframes::KeyframeSchedule;
use crate::{backend::cpu, Backend};
use anyhow::Result;
use rayon::prelude::*;
use std::time::Instant;

pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// The q-quantile (0 <= q <= 1) with linear interpolation between order statistics; NaN for
/// an empty slice.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
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

/// Wall-clock milliseconds of `a` and of `b` on a shared `state`, `reps` runs each, timed back
/// to back in every run (alternating which goes first), after `warmup` runs of each.
pub fn time_host_paired<S>(
    state: &mut S,
    warmup: usize,
    reps: usize,
    mut a: impl FnMut(&mut S),
    mut b: impl FnMut(&mut S),
) -> (Vec<f64>, Vec<f64>) {
    for _ in 0..warmup {
        a(state);
        b(state);
    }
    let mut ms = |f: &mut dyn FnMut(&mut S)| {
        let t = Instant::now();
        f(state);
        t.elapsed().as_secs_f64() * 1e3
    };
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for r in 0..reps {
        if r % 2 == 0 {
            ta.push(ms(&mut a));
            tb.push(ms(&mut b));
        } else {
            tb.push(ms(&mut b));
            ta.push(ms(&mut a));
        }
    }
    (ta, tb)
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ExpandBench {
    pub backend: String,
    /// CPU rows: the compiled version of the hot loops that ran (see [`cpu::isa`]).
    pub cpu_isa: Option<String>,
    pub frames: usize,
    pub stride: usize,
    pub keyframes: usize,
    pub frame_elems: usize,
    pub dtype: String,
    pub method: Method,
    pub reps: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    /// Quartiles of the expansion's times (the spread).
    pub q1_ms: f64,
    pub q3_ms: f64,
    /// Compulsory bytes (each keyframe read once, each frame written once) over the median time.
    pub gbps: f64,
    /// The copy reference over the same bytes, median. CPU: every frame copied from its
    /// interval's first keyframe (the cheapest way to read every keyframe and write every
    /// frame), on the same buffers and tasks as the expansion. CUDA: one device-to-device copy
    /// of half the compulsory bytes (read + write = the same byte count).
    pub copy_median_ms: f64,
    pub copy_gbps: f64,
    /// gbps / copy_gbps. CPU: the median over runs of copy time / expansion time, each pair
    /// timed back to back; CUDA: the ratio of the medians.
    pub ratio_to_copy: f64,
    /// Quartiles of the per-run ratio (CPU; CUDA: ratios of the time quartiles).
    pub ratio_q1: f64,
    pub ratio_q3: f64,
    pub launches: usize,
}

/// Copy reference of the expansion (CPU): each frame gets its interval's first keyframe,
/// through the C library's `memcpy` (see [`Placed`] for why its buffers are placed).
fn replicate<T: Elem>(keys: &[T], schedule: &KeyframeSchedule, dim: usize, out: &mut [T]) {
    let key = |j: usize| &keys[j * dim..(j + 1) * dim];
    if schedule.count() == 1 {
        out.par_chunks_mut(dim).for_each(|o| o.copy_from_slice(key(0)));
        return;
    }
    cpu::interval_parts(schedule, dim, out).into_par_iter().for_each(|(j, _, frames)| {
        for o in frames.chunks_mut(dim) {
            o.copy_from_slice(key(j));
        }
    });
}

/// A buffer of `len` elements starting `page_offset` bytes past a 4096-byte boundary, written
/// (so its pages exist) before any timing.
///
/// Why place them: glibc 2.36 (Debian 12, this machine) copies 16 KB with `rep movsb`, which on
/// this AMD EPYC runs 4-16x slower when the destination is a few bytes ahead of the source's
/// alignment (measured: destination 4 or 16 bytes past a 64-byte boundary, source on one; a
/// known weakness of AMD's fast `rep movsb` with misaligned destinations). With the keyframes
/// at page offset 0 and the frames at 2048, every frame copy of the reference has both ends
/// 64-byte aligned at the default frame size, so the reference measures what `memcpy` can do,
/// not the allocator's luck (in the old benchmark the copy bound was erratic, and whichever
/// stride ran second in a process got heap buffers at an unlucky offset). The CPU kernels do
/// not call `memcpy` (see [`Elem::copy_bits`]), so their speed does not depend on this
/// placement (host/tests/cpu_fast_paths.rs `bench_table` times them at several).
pub struct Placed<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Elem> Placed<T> {
    pub fn new(len: usize, page_offset: usize) -> Self {
        let size = std::mem::size_of::<T>();
        assert!(page_offset < 4096 && page_offset.is_multiple_of(size));
        let buf = vec![T::from_f32(1.0); len + 8192 / size];
        let addr = buf.as_ptr() as usize;
        let start = ((page_offset + 4096 - addr % 4096) % 4096) / size;
        Self { buf, start, len }
    }
    pub fn as_slice(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// [`bench_expand`] for a storage type chosen at run time.
pub fn bench_expand_dtype(
    backend: &Backend,
    dtype: Dtype,
    frames: usize,
    stride: usize,
    dim: usize,
    method: Method,
    reps: usize,
) -> Result<ExpandBench> {
    match dtype {
        Dtype::F32 => bench_expand::<f32>(backend, frames, stride, dim, method, reps),
        Dtype::F16 => bench_expand::<half::f16>(backend, frames, stride, dim, method, reps),
    }
}

/// The expansion at N frames, stride k, `dim` elements per frame, with its copy bound.
pub fn bench_expand<T: Elem>(
    backend: &Backend,
    frames: usize,
    stride: usize,
    dim: usize,
    method: Method,
    reps: usize,
) -> Result<ExpandBench> {
    bench_expand_of::<T>(backend, frames, stride, dim, method, reps, |x| x)
}

/// [`bench_expand`] with the keyframes' values mapped by `value` from the test data (e.g. into a
/// decoder's RGB range, for the expansion of decoded face crops).
pub fn bench_expand_of<T: Elem>(
    backend: &Backend,
    frames: usize,
    stride: usize,
    dim: usize,
    method: Method,
    reps: usize,
    value: impl Fn(f32) -> f32,
) -> Result<ExpandBench> {
    anyhow::ensure!(reps > 0, "at least one timed run is needed");
    anyhow::ensure!(
        !matches!(backend, Backend::Emulated),
        "the emulated backend checks the kernels; its speed is not the kernels' (time on cpu or cuda)"
    );
    let schedule = KeyframeSchedule::fixed_stride(frames, stride)?;
    let mut placed_keys = Placed::<T>::new(schedule.count() * dim, 0);
    let key_values: Vec<f32> = test_data(schedule.count() * dim, 7).into_iter().map(value).collect();
    T::narrow(&key_values, placed_keys.as_mut_slice());
    let keys = placed_keys.as_slice();
    let bytes = ((schedule.count() + frames) * dim * std::mem::size_of::<T>()) as f64;
    let (times, copy_times, ratios) = match backend {
        Backend::Cpu => {
            // Written before any timing: no first-touch page faults on either side.
            let mut out = Placed::<T>::new(frames * dim, 2048);
            let (t, c) = time_host_paired(
                &mut out,
                3,
                reps,
                |out| cpu::expand(keys, &schedule, dim, method, out.as_mut_slice()),
                |out| replicate(keys, &schedule, dim, out.as_mut_slice()),
            );
            let r: Vec<f64> = t.iter().zip(&c).map(|(t, c)| c / t).collect();
            (t, c, r)
        }
        Backend::Cuda(c) => {
            let dk = c.upload(keys)?;
            let di = c.upload(schedule.keyframes())?;
            let mut out = c.alloc::<T>(frames * dim)?;
            let t = c.time_ms(3, reps, || {
                c.expand_on_device(&dk.as_view(), &di, schedule.count(), &mut out, frames, dim, method)
            })?;
            let half_bytes = (bytes as usize / 2).max(1);
            let src = c.upload(&vec![1u8; half_bytes])?;
            let mut dst = c.alloc::<u8>(half_bytes)?;
            let ct = c.time_ms(3, reps, || c.copy_once(&src, &mut dst))?;
            let r = vec![median(&ct) / median(&t)];
            (t, ct, r)
        }
        Backend::Emulated => unreachable!("refused above"),
    };
    let med = median(&times);
    let copy_med = median(&copy_times);
    let (ratio_q1, ratio_q3) = if backend.is_cuda() {
        (copy_med / quantile(&times, 0.75), copy_med / quantile(&times, 0.25))
    } else {
        (quantile(&ratios, 0.25), quantile(&ratios, 0.75))
    };
    Ok(ExpandBench {
        backend: backend.describe(),
        cpu_isa: (!backend.is_cuda()).then(|| format!("{:?}", cpu::isa()).to_lowercase()),
        frames,
        stride,
        keyframes: schedule.count(),
        frame_elems: dim,
        dtype: T::DTYPE.to_string(),
        method,
        reps,
        median_ms: med,
        min_ms: times.iter().cloned().fold(f64::INFINITY, f64::min),
        q1_ms: quantile(&times, 0.25),
        q3_ms: quantile(&times, 0.75),
        gbps: bytes / (med * 1e-3) / 1e9,
        copy_median_ms: copy_med,
        copy_gbps: bytes / (copy_med * 1e-3) / 1e9,
        ratio_to_copy: median(&ratios),
        ratio_q1,
        ratio_q3,
        launches: if backend.is_cuda() { 1 } else { 0 },
    })
}

/// The expansion rows with their spread (interquartile ranges of the time and of the ratio).
pub fn print_expand_table(rows: &[ExpandBench]) {
    println!(
        "{:<8} {:<5} {:>5} {:>3} {:>5} {:>10} {:>17} {:>8} {:>10} {:>10} {:>6} {:>13}",
        "backend",
        "dtype",
        "N",
        "k",
        "keys",
        "median ms",
        "IQR ms",
        "GB/s",
        "copy ms",
        "copy GB/s",
        "ratio",
        "ratio IQR"
    );
    for r in rows {
        let name =
            if r.launches > 0 { "cuda".to_string() } else { format!("cpu/{}", r.cpu_isa.as_deref().unwrap_or("?")) };
        println!(
            "{:<8} {:<5} {:>5} {:>3} {:>5} {:>10.4} {:>8.4}-{:<8.4} {:>8.1} {:>10.4} {:>10.1} {:>6.2} {:>6.2}-{:<6.2}",
            name,
            r.dtype,
            r.frames,
            r.stride,
            r.keyframes,
            r.median_ms,
            r.q1_ms,
            r.q3_ms,
            r.gbps,
            r.copy_median_ms,
            r.copy_gbps,
            r.ratio_to_copy,
            r.ratio_q1,
            r.ratio_q3
        );
    }
    if let Some(r) = rows.first() {
        println!("({} runs per row, each expansion timed back to back with its copy reference; {})", r.reps, r.backend);
    }
}
