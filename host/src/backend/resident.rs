//! The render's frame data as candle tensors on the engines' device, and the cadence kernels run
//! on them where they lie. With candle's CUDA engines (`engines-cuda`) and a CUDA backend made on
//! candle's own stream ([`crate::Backend::for_engines`]), the keyframe latents, the expanded and
//! eased latents and the decoded crops never leave the GPU: the kernels read and write the
//! tensors' device memory directly, and the only copy to the host is the finished NV12 frame the
//! encoder reads. Everywhere else (CPU engines, or CUDA kernels beside CPU engines) the same
//! functions work on host memory, so the render loop is written once.

use crate::backend::composite::Compositor;
use crate::backend::elem::{Method, RgbRange};
use crate::schedules::keyframes::KeyframeSchedule;
use crate::Backend;
use anyhow::{ensure, Context, Result};
use cadence_engines::{Device, Tensor};
use candle_core::Storage;

/// Where a render keeps its frames between the engines and the encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Residency {
    /// Host memory between stages (CPU engines; CUDA kernels then copy in and out).
    Host,
    /// GPU memory from the UNet to the encoder's input (candle CUDA engines + CUDA backend).
    Device,
}

impl std::fmt::Display for Residency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Residency::Host => "host memory between stages",
            Residency::Device => "device-resident (UNet to encoder input on the GPU)",
        })
    }
}

/// Whether tensors on `device` stay there through the kernels of `backend`.
pub fn residency(backend: &Backend, device: &Device) -> Residency {
    if device_backend(backend, device).is_some() {
        Residency::Device
    } else {
        Residency::Host
    }
}

/// Runs `f` on the f32 values of `t` in host memory: borrowed from a CPU tensor, copied from any
/// other device.
pub fn with_host_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    ensure!(t.dtype() == candle_core::DType::F32, "expected an f32 tensor, got {:?}", t.dtype());
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    if let Storage::Cpu(cpu) = &*storage {
        let start = layout.start_offset();
        return f(&cpu.as_slice::<f32>()?[start..start + t.elem_count()]);
    }
    drop(storage);
    f(&t.flatten_all()?.to_vec1::<f32>()?)
}

/// What turns keyframe latents into every frame's eased latent.
#[derive(Clone, Copy)]
pub struct Infill<'a> {
    pub schedule: &'a KeyframeSchedule,
    pub method: Method,
    /// The rest latent easing blends toward: one frame's (a still avatar), or one per frame of
    /// the schedule (a video avatar: each frame's avatar frame's rest latent).
    pub rest: &'a [f32],
    /// Per frame, the distance to the nearest speech frame.
    pub distance: &'a [u32],
    pub ramp: u32,
}

/// Every frame's latent from the keyframes' (one expansion launch), eased toward the rest latent
/// by the distance to speech (one easing launch), on the device of `keys`. Returns the frames as
/// (n_frames, ..keys' frame shape) and the two stage times in ms.
pub fn expand_eased(backend: &Backend, keys: &Tensor, infill: &Infill) -> Result<(Tensor, f64, f64)> {
    let Infill { schedule, method, rest, distance, ramp } = *infill;
    ensure!(
        schedule.count() > 0 && keys.elem_count() > 0 && keys.elem_count().is_multiple_of(schedule.count()),
        "{} keyframe values do not split into the schedule's {} keyframes",
        keys.elem_count(),
        schedule.count()
    );
    let dim = keys.elem_count() / schedule.count();
    let per_frame = rest.len() != dim;
    ensure!(
        !per_frame || rest.len() == schedule.n_frames() * dim,
        "{} rest values: one frame ({dim}) or one per frame ({} x {dim}) expected",
        rest.len(),
        schedule.n_frames()
    );
    ensure!(
        dim > 0 && keys.elem_count() == schedule.count() * dim,
        "{} keyframe values, the schedule needs {} x {dim}",
        keys.elem_count(),
        schedule.count()
    );
    ensure!(
        distance.len() == schedule.n_frames(),
        "easing distances cover {} frames, the schedule {}",
        distance.len(),
        schedule.n_frames()
    );
    let mut shape = keys.dims().to_vec();
    shape[0] = schedule.n_frames();
    // Per-frame rest latents (video avatars) are eased frame by frame on the host: the easing
    // kernel takes one rest latent.
    #[cfg(feature = "engines-cuda")]
    if let (Some(cuda), false) = (device_backend(backend, keys.device()), per_frame) {
        return on_gpu::expand_eased(cuda, keys, infill, &shape);
    }
    let t = std::time::Instant::now();
    let mut frames = with_host_f32(keys, |k| backend.expand(k, schedule, dim, method))?;
    let expand_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = std::time::Instant::now();
    if per_frame {
        for ((frame, rest), d) in frames.chunks_exact_mut(dim).zip(rest.chunks_exact(dim)).zip(distance.chunks(1)) {
            backend.ease(frame, rest, d, ramp)?;
        }
    } else {
        backend.ease(&mut frames, rest, distance, ramp)?;
    }
    let ease_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok((Tensor::from_vec(frames, shape, keys.device())?, expand_ms, ease_ms))
}

/// The NV12 frame a render writes into, kept for the whole render: only the face box is
/// rewritten per frame, the rest keeps the background (reset when the frame is composited with
/// another compositor, i.e. another frame of a video avatar). `host` is what the encoder reads;
/// on the device-resident path a GPU twin is composited into and copied to `host` once per frame.
pub struct FrameBuffer {
    host: Vec<u8>,
    /// The index of the compositor whose background the buffer holds.
    background_of: usize,
    #[cfg(feature = "engines-cuda")]
    device: Option<cudarc::driver::CudaSlice<u8>>,
}

impl FrameBuffer {
    pub fn new(compositor: &Compositor) -> Self {
        Self {
            host: compositor.background_nv12().to_vec(),
            background_of: 0,
            #[cfg(feature = "engines-cuda")]
            device: None,
        }
    }

    pub fn host(&self) -> &[u8] {
        &self.host
    }

    /// Composites crop `i` of `crops` (B, 3, H, W) into the frame with `compositors[which]` and
    /// converts the face box to NV12, on the GPU when the crops are there and the backend shares
    /// their stream. The buffer starts as `compositors[0]`'s background.
    pub fn compose(
        &mut self,
        backend: &Backend,
        compositors: &[Compositor],
        which: usize,
        crops: &Tensor,
        i: usize,
        range: RgbRange,
    ) -> Result<()> {
        let compositor = &compositors[which];
        if which != self.background_of {
            self.host.copy_from_slice(compositor.background_nv12());
            // The device twin is made again from this compositor's background on first use.
            #[cfg(feature = "engines-cuda")]
            let _ = self.device.take();
            self.background_of = which;
        }
        let (b, c, ch, cw) = crops.dims4().context("decoded crops must be (batch, 3, height, width)")?;
        ensure!(c == 3 && i < b, "crop {i} of a batch of shape {:?}", crops.dims());
        let crop = crops.narrow(0, i, 1)?;
        #[cfg(feature = "engines-cuda")]
        if let (Some(cuda), Some(dc)) = (device_backend(backend, crops.device()), compositor.device()) {
            return on_gpu::compose(cuda, dc, compositor, &crop, cw, ch, range, self);
        }
        let _ = backend;
        with_host_f32(&crop, |crop| compositor.compose_box(crop, cw, ch, range, &mut self.host))
    }
}

/// The CUDA backend to run kernels on tensors of `device` in place: the backend's stream must be
/// candle's stream for that device (so the kernels are ordered after the engines' work).
#[cfg(feature = "engines-cuda")]
fn device_backend<'a>(backend: &'a Backend, device: &Device) -> Option<&'a crate::backend::cuda::CudaBackend> {
    match (backend, device) {
        (Backend::Cuda(c), Device::Cuda(d)) if std::sync::Arc::ptr_eq(&c.stream, &d.cuda_stream()) => Some(c),
        _ => None,
    }
}

#[cfg(not(feature = "engines-cuda"))]
fn device_backend<'a>(_: &'a Backend, _: &Device) -> Option<&'a crate::backend::cuda::CudaBackend> {
    None
}

/// The bridge between candle's CUDA tensors and cadence's kernels: a tensor's device memory is
/// borrowed as a `CudaView` for a launch, and a kernel's output `CudaSlice` becomes a tensor
/// without a copy. Compiled with `engines-cuda` only; never executed in this repository's
/// sessions (no GPU), see README.
#[cfg(feature = "engines-cuda")]
mod on_gpu {
    use super::*;
    use crate::backend::cuda::{CudaBackend, DeviceCompositor};
    use anyhow::anyhow;
    use candle_core::cuda::CudaStorage;
    use cudarc::driver::CudaView;
    use std::time::Instant;

    /// Runs `f` on the device memory of an f32 tensor (made contiguous first).
    fn with_view<R>(t: &Tensor, f: impl FnOnce(CudaView<'_, f32>) -> Result<R>) -> Result<R> {
        ensure!(t.dtype() == candle_core::DType::F32, "expected an f32 tensor, got {:?}", t.dtype());
        let t = t.contiguous()?;
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(s) = &*storage else { anyhow::bail!("the tensor is not on a CUDA device") };
        let slice = s.as_cuda_slice::<f32>()?;
        let start = layout.start_offset();
        f(slice.slice(start..start + t.elem_count()))
    }

    pub fn expand_eased(
        c: &CudaBackend,
        keys: &Tensor,
        infill: &Infill,
        shape: &[usize],
    ) -> Result<(Tensor, f64, f64)> {
        let Infill { schedule, method, rest, distance, ramp } = *infill;
        let Device::Cuda(dev) = keys.device() else { anyhow::bail!("the keyframes are not on a CUDA device") };
        let (n, dim) = (schedule.n_frames(), rest.len());
        let t = Instant::now();
        let mut frames = c.alloc::<f32>(n * dim)?;
        let idx = c.upload(schedule.keyframes())?;
        with_view(keys, |k| c.expand_on_device(&k, &idx, schedule.count(), &mut frames, n, dim, method))?;
        c.synchronize()?;
        let expand_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let (rest, distance) = (c.upload(rest)?, c.upload(distance)?);
        c.ease_on_device(&mut frames, &rest, &distance, ramp, n, dim)?;
        c.synchronize()?;
        let ease_ms = t.elapsed().as_secs_f64() * 1e3;
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(frames, dev.clone()));
        let tensor = Tensor::from_storage(storage, shape, candle_core::op::BackpropOp::none(), false);
        Ok((tensor, expand_ms, ease_ms))
    }

    /// Composites on the device frame (made from the background on first use), then copies the
    /// finished frame into the host buffer the encoder reads.
    #[allow(clippy::too_many_arguments)]
    pub fn compose(
        c: &CudaBackend,
        dc: &DeviceCompositor,
        compositor: &Compositor,
        crop: &Tensor,
        cw: usize,
        ch: usize,
        range: RgbRange,
        frame: &mut FrameBuffer,
    ) -> Result<()> {
        if frame.device.is_none() {
            frame.device = Some(c.upload(compositor.background_nv12())?);
        }
        let device_frame = frame.device.as_mut().expect("set above");
        with_view(crop, |v| dc.compose_on_device(&v, cw, ch, range, compositor.target(), device_frame))?;
        c.stream
            .memcpy_dtoh(device_frame, frame.host.as_mut_slice())
            .map_err(|e| anyhow!("device to host copy of the frame failed: {e:?}"))?;
        c.synchronize()
    }
}
