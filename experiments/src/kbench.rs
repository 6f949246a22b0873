//! Kernel timing for `kernel_bench` (and any experiment that needs it): every kernel on a
//! given backend with preallocated buffers, its compulsory bytes, and the copy bandwidth of
//! the same number of bytes measured on the same backend in the same run.
//!
//! Host timing: wall clock around the CPU path (`cadence::measure::bench::time_host`). CUDA timing:
//! events around the launch on the stream (`CudaBackend::time_ms`), data already on the device.

use anyhow::{ensure, Result};
use cadence::backend::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use cadence::measure::bench::{median, time_host};
use cadence::measure::fixtures::test_data;
use cadence::Dtype;
use cadence::{backend::cpu, Backend, KeyframeSchedule};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::any::Any;
use std::sync::Mutex;

/// Timing policy: `warmup` untimed runs, then a number of timed runs chosen from the first
/// timed one so that a case takes about `target_ms` in all, but never fewer than `min_reps`
/// nor more than `max_reps` (the median is reported). Short cases get many runs (stable
/// medians), long ones `min_reps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reps {
    pub warmup: usize,
    pub min_reps: usize,
    pub max_reps: usize,
    pub target_ms: f64,
}

impl Reps {
    /// Exactly `reps` timed runs.
    pub fn fixed(warmup: usize, reps: usize) -> Reps {
        Reps { warmup, min_reps: reps, max_reps: reps, target_ms: 0.0 }
    }
    /// Timed runs to do in all, given the first one took `first_ms`.
    pub fn count(&self, first_ms: f64) -> usize {
        let want = if first_ms > 0.0 { (self.target_ms / first_ms).ceil() as usize } else { self.max_reps };
        want.clamp(self.min_reps.max(1), self.max_reps.max(self.min_reps).max(1))
    }
}

/// Untimed runs of short cases continue until they add up to this long, so that caches, page
/// faults, sleeping worker threads and clock ramp-up settle before timing.
pub const MIN_WARMUP_MS: f64 = 20.0;

/// Host wall-clock times of `f` under the policy `r`, called from the current thread as the
/// pipeline calls the kernels (rayon dispatch included).
pub fn host_times(r: Reps, mut f: impl FnMut()) -> Vec<f64> {
    let mut times = time_host(r.warmup, 1, &mut f);
    if r.warmup > 0 {
        let mut spent = times[0];
        for _ in 0..r.max_reps.max(1) {
            if spent >= MIN_WARMUP_MS {
                break;
            }
            times = time_host(0, 1, &mut f);
            spent += times[0];
        }
    }
    let n = r.count(times[0]);
    times.extend(time_host(0, n - 1, &mut f));
    times
}

/// CUDA event times of `f` on the backend's stream under the policy `r`.
pub fn cuda_times(
    c: &cadence::backend::cuda::CudaBackend,
    r: Reps,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let mut times = c.time_ms(r.warmup, 1, &mut f)?;
    let n = r.count(times[0]);
    times.extend(c.time_ms(0, n - 1, &mut f)?);
    Ok(times)
}

/// The times of one kernel case and the bytes it must move at least.
#[derive(Clone, Debug)]
pub struct Timing {
    pub times_ms: Vec<f64>,
    pub compulsory_bytes: u64,
}

impl Timing {
    pub fn median_ms(&self) -> f64 {
        median(&self.times_ms)
    }
    pub fn min_ms(&self) -> f64 {
        self.times_ms.iter().cloned().fold(f64::INFINITY, f64::min)
    }
    /// Compulsory bytes over the median time, in GB/s (10^9 bytes).
    pub fn gbps(&self) -> f64 {
        gbps(self.compulsory_bytes, self.median_ms())
    }
}

pub fn gbps(bytes: u64, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

/// Expansion: each of the M keyframes read once, each of the N frames written once.
pub fn expand_bytes(keyframes: usize, frames: usize, dim: usize, elem_size: usize) -> u64 {
    ((keyframes + frames) * dim * elem_size) as u64
}

/// Pairwise interpolation of `rows` pairs: two reads and one write per row, plus the alphas.
pub fn slerp_pairs_bytes(rows: usize, dim: usize, elem_size: usize) -> u64 {
    (3 * rows * dim * elem_size + 4 * rows) as u64
}

/// Easing in place with every frame inside a transition: each frame read and written, the
/// rest frame read once, one u32 distance per frame.
pub fn ease_bytes(frames: usize, dim: usize, elem_size: usize) -> u64 {
    ((2 * frames + 1) * dim * elem_size + 4 * frames) as u64
}

/// Planar RGB in (3 planes of `elem_size` samples), NV12 out (1.5 bytes per pixel).
pub fn nv12_bytes(layout: RgbLayout, elem_size: usize) -> u64 {
    (layout.len() * elem_size + layout.frames * layout.nv12_frame_bytes()) as u64
}

/// Median-ready times of copying `bytes / 2` bytes (so the copy reads and writes `bytes` in
/// all, the same traffic as a kernel with that many compulsory bytes) on `backend`: a
/// parallel memcpy over rayon's threads on the CPU, a device-to-device copy on CUDA.
pub fn copy_times(backend: &Backend, bytes: u64, r: Reps) -> Result<Vec<f64>> {
    let n = (bytes / 2).max(1) as usize;
    match backend {
        Backend::Emulated => Err(emulated_not_timed()),
        Backend::Cpu => {
            let mut buf = vec![1u8; 2 * n + 4 * PAGE];
            let (src, dst) = copy_buffers(&mut buf, n);
            let chunk = n.div_ceil(rayon::current_num_threads()).div_ceil(64).max(1) * 64;
            Ok(host_times(r, || {
                dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
            }))
        }
        Backend::Cuda(c) => {
            let src = c.upload(&vec![1u8; n])?;
            let mut dst = c.alloc::<u8>(n)?;
            cuda_times(c, r, || c.copy_once(&src, &mut dst))
        }
    }
}

const PAGE: usize = 4096;

/// Source and destination of `n` bytes each inside `buf` (which holds 2n + 4 pages): both
/// page-aligned, the destination half a page further, so that the CPU copy measures the
/// memory system rather than the allocator's placement. (On this machine's AMD EPYC, memcpy
/// between two malloc'd buffers ran anywhere from 3 to 40 GB/s depending on where the
/// allocator put them: 4K aliasing of source and destination.)
pub fn copy_buffers(buf: &mut [u8], n: usize) -> (&[u8], &mut [u8]) {
    assert!(buf.len() >= 2 * n + 4 * PAGE, "copy buffer too small");
    let start = buf.as_ptr().align_offset(PAGE);
    let gap = n.div_ceil(PAGE) * PAGE + PAGE / 2;
    let (src, dst) = buf[start..].split_at_mut(gap);
    (&src[..n], &mut dst[..n])
}

/// Copy bandwidth (read + write counted) for a traffic of `bytes`, GB/s, median of the runs.
pub fn copy_gbps(backend: &Backend, bytes: u64, r: Reps) -> Result<f64> {
    let times = copy_times(backend, bytes, r)?;
    Ok(gbps(2 * (bytes / 2).max(1), median(&times)))
}

/// `n` elements of benchmark data (never zeros): a window of one shared pool of
/// `cadence::measure::fixtures::test_data`, generated once and grown on demand, at an offset chosen by
/// `seed`, so that a sweep does not spend most of its time making data.
pub fn data<T: Elem>(n: usize, seed: u64) -> Vec<T> {
    static POOL: Mutex<Vec<f32>> = Mutex::new(Vec::new());
    const WINDOWS: usize = 4099;
    let offset = (seed as usize).wrapping_mul(2_654_435_761) % WINDOWS;
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < n + WINDOWS {
        *pool = test_data((n + WINDOWS).max(2 * pool.len()), 0x5EED);
    }
    to_elem(&pool[offset..offset + n])
}

/// f32 values in the storage type `T` (f16 through half's vectorized slice conversion).
pub fn to_elem<T: Elem>(src: &[f32]) -> Vec<T> {
    let out: Box<dyn Any> = match T::DTYPE {
        Dtype::F32 => Box::new(src.to_vec()),
        Dtype::F16 => {
            let mut v = vec![f16::ZERO; src.len()];
            v.convert_from_f32_slice(src);
            Box::new(v)
        }
    };
    *out.downcast::<Vec<T>>().expect("Elem::DTYPE names the element type")
}

/// One-launch stride expansion of `frames` frames of `dim` elements at `stride`.
pub fn time_expand<T: Elem>(
    backend: &Backend,
    frames: usize,
    stride: usize,
    dim: usize,
    method: Method,
    r: Reps,
) -> Result<Timing> {
    let s = KeyframeSchedule::fixed_stride(frames, stride)?;
    let keys: Vec<T> = data(s.count() * dim, 11);
    let compulsory_bytes = expand_bytes(s.count(), frames, dim, std::mem::size_of::<T>());
    let times_ms = match backend {
        Backend::Emulated => return Err(emulated_not_timed()),
        Backend::Cpu => {
            let mut out = vec![T::default(); frames * dim];
            host_times(r, || cpu::expand(&keys, &s, dim, method, &mut out))
        }
        Backend::Cuda(c) => {
            let dk = c.upload(&keys)?;
            let di = c.upload(s.keyframes())?;
            let mut out = c.alloc::<T>(frames * dim)?;
            cuda_times(c, r, || c.expand_on_device(&dk.as_view(), &di, s.count(), &mut out, frames, dim, method))?
        }
    };
    Ok(Timing { times_ms, compulsory_bytes })
}

/// `rows` independent pairs at alphas spread over (0, 1).
pub fn time_slerp_pairs<T: Elem>(
    backend: &Backend,
    rows: usize,
    dim: usize,
    method: Method,
    r: Reps,
) -> Result<Timing> {
    ensure!(rows > 0 && dim > 0, "slerp_pairs needs at least one row of one element");
    let v0: Vec<T> = data(rows * dim, 21);
    let v1: Vec<T> = data(rows * dim, 22);
    let alphas: Vec<f32> = (0..rows).map(|i| (i as f32 + 0.5) / rows as f32).collect();
    let compulsory_bytes = slerp_pairs_bytes(rows, dim, std::mem::size_of::<T>());
    let times_ms = match backend {
        Backend::Emulated => return Err(emulated_not_timed()),
        Backend::Cpu => {
            let mut out = vec![T::default(); rows * dim];
            host_times(r, || cpu::slerp_pairs(&v0, &v1, &alphas, dim, method, &mut out))
        }
        Backend::Cuda(c) => {
            let (a, b, al) = (c.upload(&v0)?, c.upload(&v1)?, c.upload(&alphas)?);
            let mut out = c.alloc::<T>(rows * dim)?;
            cuda_times(c, r, || c.slerp_pairs_on_device(&a, &b, &al, &mut out, rows, dim, method))?
        }
    };
    Ok(Timing { times_ms, compulsory_bytes })
}

/// Distances that put every frame inside a transition of a `ramp`-frame easing (the case
/// where every frame is read and written): 1, 2, ..., ramp-1, 1, 2, ...
pub fn transition_distances(frames: usize, ramp: u32) -> Vec<u32> {
    let period = ramp.saturating_sub(1).max(1);
    (0..frames).map(|f| 1 + (f as u32 % period)).collect()
}

/// Silence easing, in place, of `frames` frames all inside a transition of `ramp` frames.
pub fn time_ease<T: Elem>(backend: &Backend, frames: usize, dim: usize, ramp: u32, r: Reps) -> Result<Timing> {
    ensure!(ramp >= 2, "the easing benchmark needs a ramp of at least 2 frames");
    let rest: Vec<T> = data(dim, 31);
    let mut fr: Vec<T> = data(frames * dim, 32);
    let distance = transition_distances(frames, ramp);
    let compulsory_bytes = ease_bytes(frames, dim, std::mem::size_of::<T>());
    let times_ms = match backend {
        Backend::Emulated => return Err(emulated_not_timed()),
        Backend::Cpu => host_times(r, || cpu::ease(&mut fr, &rest, &distance, ramp)),
        Backend::Cuda(c) => {
            let mut df = c.upload(&fr)?;
            let (dr, dd) = (c.upload(&rest)?, c.upload(&distance)?);
            cuda_times(c, r, || c.ease_on_device(&mut df, &dr, &dd, ramp, frames, dim))?
        }
    };
    Ok(Timing { times_ms, compulsory_bytes })
}

/// Planar RGB (samples in [0, 1]) to NV12, BT.709, all of `layout.frames` in one call.
pub fn time_nv12<T: Elem>(backend: &Backend, layout: RgbLayout, r: Reps) -> Result<Timing> {
    layout.validate(layout.len())?;
    // Samples in about [0, 1]: the pool's values (within +-3.4) scaled into range.
    let scaled: Vec<f32> = data::<f32>(layout.len(), 41).into_iter().map(|x| x * 0.15 + 0.5).collect();
    let rgb: Vec<T> = to_elem(&scaled);
    let compulsory_bytes = nv12_bytes(layout, std::mem::size_of::<T>());
    let (m, rg) = (ColorMatrix::Bt709, RgbRange::Unit);
    let times_ms = match backend {
        Backend::Emulated => return Err(emulated_not_timed()),
        Backend::Cpu => {
            let mut out = vec![0u8; layout.frames * layout.nv12_frame_bytes()];
            host_times(r, || cpu::rgb_to_nv12(&rgb, layout, m, rg, &mut out))
        }
        Backend::Cuda(c) => {
            let d = c.upload(&rgb)?;
            let mut out = c.alloc::<u8>(layout.frames * layout.nv12_frame_bytes())?;
            cuda_times(c, r, || c.rgb_to_nv12_on_device(&d, layout, m, rg, &mut out))?
        }
    };
    Ok(Timing { times_ms, compulsory_bytes })
}

/// Compulsory bytes of one compositing call: the crop in (f32), the per-render blend weight and
/// three background terms read (f32 per box pixel), the face box's NV12 written.
pub fn composite_bytes(crop: usize, box_w: usize, box_h: usize) -> u64 {
    (3 * crop * crop * 4 + 4 * box_w * box_h * 4 + box_w * box_h * 3 / 2) as u64
}

/// The face compositor (bilinear resize of a `crop`-square decoded face into a `box_side`-square
/// box, feathered blend, NV12 of the box) into a reused `width` x `height` frame, as the render
/// loop runs it: [`cadence::backend::composite::Compositor::compose_box`].
pub fn time_composite(
    backend: &Backend,
    width: usize,
    height: usize,
    box_side: usize,
    crop: usize,
    r: Reps,
) -> Result<Timing> {
    use cadence::backend::composite::{Compositor, FaceBox};
    anyhow::ensure!(
        box_side <= width && box_side <= height,
        "a {box_side} px face box does not fit a {width}x{height} frame"
    );
    let bg: Vec<u8> =
        data::<f32>(width * height * 3, 43).into_iter().map(|x| (x * 37.0 + 128.0).clamp(0.0, 255.0) as u8).collect();
    let (x, y) = (((width - box_side) / 2) & !1, ((height - box_side) / 2) & !1);
    let face = FaceBox { x: x as u32, y: y as u32, w: box_side as u32, h: box_side as u32 };
    let comp = Compositor::new(backend, &bg, width, height, face, (box_side / 8) as f32, ColorMatrix::Bt709)?;
    let rgb: Vec<f32> = data::<f32>(3 * crop * crop, 44).into_iter().map(|x| x * 0.15 + 0.5).collect();
    let mut frame = comp.background_nv12().to_vec();
    let compulsory_bytes = composite_bytes(crop, box_side, box_side);
    let times_ms = match backend {
        Backend::Emulated => return Err(emulated_not_timed()),
        Backend::Cpu => {
            let mut err = None;
            let t = host_times(r, || {
                if let Err(e) = comp.compose_box(&rgb, crop, crop, RgbRange::Unit, &mut frame) {
                    err = Some(e);
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            t
        }
        Backend::Cuda(c) => {
            let dc = comp.device().ok_or_else(|| anyhow::anyhow!("the CUDA compositor was not built"))?;
            let d_rgb = c.upload(&rgb)?;
            let mut d_frame = c.upload(&frame)?;
            cuda_times(c, r, || {
                dc.compose_on_device(&d_rgb.as_view(), crop, crop, RgbRange::Unit, comp.target(), &mut d_frame)
            })?
        }
    };
    Ok(Timing { times_ms, compulsory_bytes })
}

/// The emulated backend runs the kernels to check them; its times say nothing about them.
fn emulated_not_timed() -> anyhow::Error {
    anyhow::anyhow!("the emulated backend is for checking the kernels, not timing them: use cpu or cuda")
}
