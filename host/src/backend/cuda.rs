//! The CUDA backend: cudarc's driver API, loaded at run time (no CUDA needed to build or start),
//! running the PTX that build.rs compiled from `gpu/src`.

use crate::backend::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::backend::grid_sample::GridSample3d;
use crate::backend::launch::{self, CompositeTarget, Cuda, CudaArgs, CudaPtr, Launch};
use crate::backend::ptx::{self, PtxTarget};
use crate::schedules::keyframes::KeyframeSchedule;
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr,
    SyncOnDrop,
};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// The device pointers of one launch's buffers. cudarc orders work on a buffer across streams
/// with events recorded when the returned guards drop, so they are kept until the launch is queued.
struct Pointers<'a> {
    stream: &'a CudaStream,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Pointers<'a> {
    fn new(stream: &'a CudaStream) -> Self {
        Self { stream, guards: Vec::new() }
    }
    fn read<T>(&mut self, buffer: &'a impl DevicePtr<T>) -> CudaPtr<T> {
        let (p, guard) = buffer.device_ptr(self.stream);
        self.guards.push(guard);
        CudaPtr::new(p)
    }
    fn write<T>(&mut self, buffer: &'a mut impl DevicePtrMut<T>) -> CudaPtr<T> {
        let (p, guard) = buffer.device_ptr_mut(self.stream);
        self.guards.push(guard);
        CudaPtr::new(p)
    }
}

/// Queues `l` on `stream` (the shape and arguments are the emulator's too: launch.rs).
fn run<A: CudaArgs>(stream: &Arc<CudaStream>, f: &CudaFunction, l: &Launch<A>) -> Result<()> {
    let mut b = stream.launch_builder(f);
    l.args.push(&mut b);
    // SAFETY: the argument list is generated from the entry point's parameter list
    // (launch.rs); the callers checked the buffers' sizes.
    unsafe { b.launch(l.shape.into()) }.map_err(|e| anyhow!("{} launch failed: {e:?}", l.kernel))?;
    Ok(())
}

pub struct CudaBackend {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    pub target: &'static PtxTarget,
    pub device_name: String,
    pub compute_capability: (i32, i32),
}

/// Whether a CUDA driver library can be loaded at all (checked before any driver call, since
/// cudarc panics on first use when it is missing).
#[cfg(not(feature = "engines-cuda"))]
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library; no driver call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// With `engines-cuda`, candle makes cudarc link libcuda.so.1 (`dynamic-linking`), so a running
/// binary has the driver library loaded already (it does not start without it).
#[cfg(feature = "engines-cuda")]
pub fn driver_present() -> bool {
    true
}

impl CudaBackend {
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            bail!("no CUDA driver found (libcuda.so could not be loaded)");
        }
        let count = CudaContext::device_count().map_err(|e| anyhow!("CUDA driver present but unusable: {e:?}"))?;
        ensure!(count > 0, "CUDA driver present but it reports no GPU");
        ensure!((ordinal as i32) < count, "GPU {ordinal} requested, the driver reports {count}");
        let ctx =
            CudaContext::new(ordinal).map_err(|e| anyhow!("cannot create a CUDA context on GPU {ordinal}: {e:?}"))?;
        Self::on_stream(ctx.default_stream())
    }

    /// A backend whose kernels run on `stream` (e.g. candle's stream for its CUDA device, so that
    /// the kernels are ordered with the engines' work and can use candle's tensors in place).
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context().clone();
        let cc = ctx.compute_capability().map_err(|e| anyhow!("{e:?}"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let target = ptx::for_compute_capability(cc.0, cc.1);
        let module = ctx.load_module(Ptx::from_src(target.source)).map_err(|e| {
            anyhow!("the driver rejected the embedded {} PTX on {name} (sm_{}{}): {e:?}", target.name, cc.0, cc.1)
        })?;
        Ok(Self { ctx, stream, module, target, device_name: name, compute_capability: cc })
    }

    pub fn describe(&self) -> String {
        let (ma, mi) = self.compute_capability;
        format!("cuda ({}, sm_{ma}{mi}, PTX {})", self.device_name, self.target.name)
    }

    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        self.module.load_function(name).map_err(|e| anyhow!("kernel {name} missing from the PTX: {e:?}"))
    }

    /// Queues one launch on this backend's stream.
    fn run<A: CudaArgs>(&self, l: &Launch<A>) -> Result<()> {
        run(&self.stream, &self.function(l.kernel)?, l)
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(host).map_err(|e| anyhow!("host to device copy failed: {e:?}"))
    }
    pub fn download<T: DeviceRepr>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(dev).map_err(|e| anyhow!("device to host copy failed: {e:?}"))
    }
    pub fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every kernel writing into this buffer writes all of it before it is read.
        unsafe { self.stream.alloc::<T>(len) }.map_err(|e| anyhow!("cannot allocate {len} elements on the GPU: {e:?}"))
    }
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| anyhow!("CUDA error: {e:?}"))
    }

    /// One launch: all frames of the schedule from the keyframes, on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn expand_on_device<T: Elem>(
        &self,
        keys: &CudaView<'_, T>,
        key_idx: &CudaSlice<u32>,
        n_keys: usize,
        out: &mut CudaSlice<T>,
        n_frames: usize,
        dim: usize,
        method: Method,
    ) -> Result<()> {
        let mut p = Pointers::new(&self.stream);
        let l = launch::expand::<Cuda, T>(p.read(keys), p.read(key_idx), n_keys, p.write(out), n_frames, dim, method);
        self.run(&l)
    }

    pub fn expand<T: Elem>(
        &self,
        keys: &[T],
        schedule: &KeyframeSchedule,
        dim: usize,
        method: Method,
    ) -> Result<Vec<T>> {
        let dk = self.upload(keys)?;
        let di = self.stream.clone_htod(schedule.keyframes()).map_err(|e| anyhow!("{e:?}"))?;
        let mut out = self.alloc::<T>(schedule.n_frames() * dim)?;
        self.expand_on_device(&dk.as_view(), &di, schedule.count(), &mut out, schedule.n_frames(), dim, method)?;
        self.download(&out).context("reading back the expanded frames")
    }

    #[allow(clippy::too_many_arguments)]
    pub fn slerp_pairs_on_device<T: Elem>(
        &self,
        v0: &CudaSlice<T>,
        v1: &CudaSlice<T>,
        alphas: &CudaSlice<f32>,
        out: &mut CudaSlice<T>,
        rows: usize,
        dim: usize,
        method: Method,
    ) -> Result<()> {
        let mut p = Pointers::new(&self.stream);
        let l = launch::slerp_pairs::<Cuda, T>(p.read(v0), p.read(v1), p.read(alphas), p.write(out), rows, dim, method);
        self.run(&l)
    }

    pub fn slerp_pairs<T: Elem>(
        &self,
        v0: &[T],
        v1: &[T],
        alphas: &[f32],
        dim: usize,
        method: Method,
    ) -> Result<Vec<T>> {
        let (a, b, al) = (self.upload(v0)?, self.upload(v1)?, self.upload(alphas)?);
        let mut out = self.alloc::<T>(v0.len())?;
        self.slerp_pairs_on_device(&a, &b, &al, &mut out, alphas.len(), dim, method)?;
        self.download(&out)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn ease_on_device<T: Elem>(
        &self,
        frames: &mut CudaSlice<T>,
        rest: &CudaSlice<T>,
        distance: &CudaSlice<u32>,
        ramp: u32,
        n_frames: usize,
        dim: usize,
    ) -> Result<()> {
        // In place: the kernel reads each element before its lane overwrites it.
        let mut p = Pointers::new(&self.stream);
        let l = launch::ease::<Cuda, T>(p.write(frames), p.read(rest), p.read(distance), ramp, n_frames, dim);
        self.run(&l)
    }

    pub fn ease<T: Elem>(&self, frames: &mut [T], rest: &[T], distance: &[u32], ramp: u32) -> Result<()> {
        let mut df = self.upload(frames)?;
        let (dr, dd) = (self.upload(rest)?, self.stream.clone_htod(distance).map_err(|e| anyhow!("{e:?}"))?);
        self.ease_on_device(&mut df, &dr, &dd, ramp, distance.len(), rest.len())?;
        self.stream.memcpy_dtoh(&df, frames).map_err(|e| anyhow!("{e:?}"))?;
        self.synchronize()
    }

    pub fn rgb_to_nv12_on_device<T: Elem>(
        &self,
        rgb: &CudaSlice<T>,
        layout: RgbLayout,
        matrix: ColorMatrix,
        range: RgbRange,
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        ensure!(
            out.len() >= layout.frames * layout.nv12_frame_bytes(),
            "NV12 buffer of {} bytes for {} frames of {}",
            out.len(),
            layout.frames,
            layout.nv12_frame_bytes()
        );
        let mut p = Pointers::new(&self.stream);
        let l = launch::rgb_to_nv12::<Cuda, T>(p.read(rgb), layout, matrix, range, p.write(out));
        self.run(&l)
    }

    pub fn rgb_to_nv12<T: Elem>(
        &self,
        rgb: &[T],
        layout: RgbLayout,
        matrix: ColorMatrix,
        range: RgbRange,
    ) -> Result<Vec<u8>> {
        layout.validate(rgb.len())?;
        let d = self.upload(rgb)?;
        let mut out = self.alloc::<u8>(layout.frames * layout.nv12_frame_bytes())?;
        self.rgb_to_nv12_on_device(&d, layout, matrix, range, &mut out)?;
        self.download(&out)
    }

    /// Times `f` on the stream with events: median of `reps` runs after `warmup` runs, in ms.
    pub fn time_ms(&self, warmup: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
        for _ in 0..warmup {
            f()?;
        }
        self.synchronize()?;
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = self
                .stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| anyhow!("{e:?}"))?;
            f()?;
            let end = self
                .stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| anyhow!("{e:?}"))?;
            end.synchronize().map_err(|e| anyhow!("{e:?}"))?;
            times.push(start.elapsed_ms(&end).map_err(|e| anyhow!("{e:?}"))? as f64);
        }
        Ok(times)
    }

    /// Device-to-device copy of `bytes` bytes (the bandwidth bound of the kernels), one run.
    pub fn copy_once(&self, src: &CudaSlice<u8>, dst: &mut CudaSlice<u8>) -> Result<()> {
        self.stream.memcpy_dtod(src, dst).map_err(|e| anyhow!("{e:?}"))
    }

    /// Hermite weights h(t) of `t` on the device (`hermite_f32`).
    pub fn hermite(&self, t: &[f32]) -> Result<Vec<f32>> {
        let dt = self.upload(t)?;
        let mut out = self.alloc::<f32>(t.len())?;
        {
            let mut p = Pointers::new(&self.stream);
            let l = launch::hermite::<Cuda>(p.read(&dt), p.write(&mut out), t.len());
            self.run(&l)?;
        }
        self.download(&out)
    }

    /// One launch: the 3-D grid sample of the validated shape `s` on device buffers (`input`
    /// N x C x D x H x W, `grid` N x Do x Ho x Wo x 3, `out` N x C x Do x Ho x Wo).
    pub fn grid_sample_3d_on_device(
        &self,
        input: &CudaView<'_, f32>,
        grid: &CudaView<'_, f32>,
        out: &mut CudaSlice<f32>,
        s: &GridSample3d,
    ) -> Result<()> {
        s.check_buffers(input.len(), grid.len())?;
        ensure!(
            out.len() == s.output_elements(),
            "output buffer of {} for {} elements",
            out.len(),
            s.output_elements()
        );
        let mut p = Pointers::new(&self.stream);
        let l = launch::grid_sample_3d::<Cuda>(p.read(input), p.read(grid), p.write(out), s);
        self.run(&l)
    }

    /// The 3-D grid sample on the device (`grid_sample_3d_f32`), host buffers in and out.
    pub fn grid_sample_3d(&self, input: &[f32], grid: &[f32], s: &GridSample3d) -> Result<Vec<f32>> {
        let (di, dg) = (self.upload(input)?, self.upload(grid)?);
        let mut out = self.alloc::<f32>(s.output_elements())?;
        self.grid_sample_3d_on_device(&di.as_view(), &dg.as_view(), &mut out, s)?;
        self.download(&out)
    }

    /// Uploads a compositor's per-render data (see `backend::composite::Compositor`).
    pub fn compositor(
        &self,
        alpha: &[f32],
        background_term: &[Vec<f32>; 3],
        background_nv12: &[u8],
    ) -> Result<DeviceCompositor> {
        let terms: Vec<f32> = background_term.iter().flatten().copied().collect();
        let function =
            |storage| self.function(cadence_kernels::kernel_name(cadence_kernels::Op::CompositeNv12, storage));
        Ok(DeviceCompositor {
            stream: self.stream.clone(),
            functions: [function(cadence_kernels::Storage::F32)?, function(cadence_kernels::Storage::F16)?],
            alpha: self.upload(alpha)?,
            background_term: self.upload(&terms)?,
            background_nv12: self.upload(background_nv12)?,
        })
    }
}

/// A compositor's per-render data resident on the GPU: the face box's blend weights, the
/// (1 - alpha) x background term, and the background's NV12 that every frame starts from.
pub struct DeviceCompositor {
    stream: Arc<CudaStream>,
    /// `composite_nv12_f32`, `composite_nv12_f16`.
    functions: [CudaFunction; 2],
    alpha: CudaSlice<f32>,
    background_term: CudaSlice<f32>,
    background_nv12: CudaSlice<u8>,
}

impl DeviceCompositor {
    /// Composites a host crop on the device and writes the NV12 frame to `out`.
    pub fn compose<T: Elem>(
        &self,
        crop: &[T],
        cw: usize,
        ch: usize,
        range: RgbRange,
        target: CompositeTarget,
        out: &mut [u8],
    ) -> Result<()> {
        let d_crop = self.stream.clone_htod(crop).map_err(|e| anyhow!("host to device copy failed: {e:?}"))?;
        let mut frame =
            self.stream.clone_dtod(&self.background_nv12).map_err(|e| anyhow!("device copy failed: {e:?}"))?;
        self.compose_on_device(&d_crop.as_view(), cw, ch, range, target, &mut frame)?;
        self.stream.memcpy_dtoh(&frame, out).map_err(|e| anyhow!("device to host copy failed: {e:?}"))?;
        self.stream.synchronize().map_err(|e| anyhow!("CUDA error: {e:?}"))
    }

    /// One launch over the face box's 2x2 blocks; `frame` must already hold the background.
    pub fn compose_on_device<T: Elem>(
        &self,
        crop: &CudaView<'_, T>,
        cw: usize,
        ch: usize,
        range: RgbRange,
        target: CompositeTarget,
        frame: &mut CudaSlice<u8>,
    ) -> Result<()> {
        ensure!(crop.len() == 3 * cw * ch, "crop has {} values, 3 x {cw} x {ch} expected", crop.len());
        let frame_bytes = target.width * target.height * 3 / 2;
        ensure!(frame.len() == frame_bytes, "frame buffer has {} bytes, {frame_bytes} expected", frame.len());
        let f = &self.functions[if T::DTYPE == crate::Dtype::F32 { 0 } else { 1 }];
        let mut p = Pointers::new(&self.stream);
        let l = launch::composite_nv12::<Cuda, T>(
            p.read(crop),
            cw,
            ch,
            range,
            p.read(&self.alpha),
            p.read(&self.background_term),
            p.write(frame),
            target,
        );
        run(&self.stream, f, &l)
    }
}
