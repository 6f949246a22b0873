//! The CUDA backend: cudarc's driver API, loaded at run time (no CUDA needed to build or start),
//! running the PTX that build.rs compiled from `gpu/src`.

use crate::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::ptx::{self, PtxTarget};
use crate::schedule::KeyframeSchedule;
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// Threads per block for the warp-per-pair kernels (4 warps).
const BLOCK: u32 = 128;
const WARPS_PER_BLOCK: u32 = BLOCK / 32;

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

    fn warp_grid(warps: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (warps.div_ceil(WARPS_PER_BLOCK).max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
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
        let f = self.function(&format!("expand_{}", T::DTYPE))?;
        let (nk, nf, d, m) = (n_keys as u32, n_frames as u32, dim as u32, method.code());
        let cfg = Self::warp_grid((n_keys.max(2) - 1) as u32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(keys).arg(key_idx).arg(&nk).arg(out).arg(&nf).arg(&d).arg(&m);
        // SAFETY: argument list matches the kernel signature in gpu/src/kernels.rs; buffer sizes
        // were checked by the caller.
        unsafe { b.launch(cfg) }.map_err(|e| anyhow!("expand launch failed: {e:?}"))?;
        Ok(())
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
        let f = self.function(&format!("slerp_pairs_{}", T::DTYPE))?;
        let (r, d, m) = (rows as u32, dim as u32, method.code());
        let mut b = self.stream.launch_builder(&f);
        b.arg(v0).arg(v1).arg(alphas).arg(out).arg(&r).arg(&d).arg(&m);
        // SAFETY: matches the kernel signature; sizes checked by the caller.
        unsafe { b.launch(Self::warp_grid(r)) }.map_err(|e| anyhow!("slerp launch failed: {e:?}"))?;
        Ok(())
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
        let f = self.function(&format!("ease_{}", T::DTYPE))?;
        let (n, d) = (n_frames as u32, dim as u32);
        // In place: the kernel reads each element before its lane overwrites it.
        let out_ptr = {
            use cudarc::driver::DevicePtrMut;
            let (p, _sync) = frames.device_ptr_mut(&self.stream);
            p
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&out_ptr).arg(rest).arg(distance).arg(&ramp).arg(&out_ptr).arg(&n).arg(&d);
        // SAFETY: matches the kernel signature; `frames` outlives the launch (we synchronize
        // before returning buffers to the host).
        unsafe { b.launch(Self::warp_grid(n)) }.map_err(|e| anyhow!("ease launch failed: {e:?}"))?;
        Ok(())
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
        let f = self.function(&format!("rgb_to_nv12_{}", T::DTYPE))?;
        let (w, h) = (layout.width as u32, layout.height as u32);
        let frame_bytes = layout.nv12_frame_bytes() as u32;
        let (fs, ps, pitch) = (layout.frame_len() as u32, layout.plane_len() as u32, layout.pitch as u32);
        let (frames, mat, rng) = (layout.frames as u32, matrix.code(), range.code());
        let blocks = (w / 2) * (h / 2) * frames;
        let uv_offset = (layout.width * layout.height) as u64;
        let (y_ptr, uv_ptr) = {
            use cudarc::driver::DevicePtrMut;
            let (p, _sync) = out.device_ptr_mut(&self.stream);
            (p, p + uv_offset)
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(rgb).arg(&fs).arg(&ps).arg(&pitch);
        b.arg(&y_ptr).arg(&frame_bytes).arg(&w);
        b.arg(&uv_ptr).arg(&frame_bytes).arg(&w);
        b.arg(&w).arg(&h).arg(&frames).arg(&mat).arg(&rng);
        // SAFETY: matches the kernel signature; `out` holds frames * w * h * 3/2 bytes.
        unsafe { b.launch(LaunchConfig::for_num_elems(blocks)) }.map_err(|e| anyhow!("NV12 launch failed: {e:?}"))?;
        Ok(())
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

    /// Uploads a compositor's per-render data (see [`crate::composite::Compositor`]).
    pub fn compositor(
        &self,
        alpha: &[f32],
        background_term: &[Vec<f32>; 3],
        background_nv12: &[u8],
    ) -> Result<DeviceCompositor> {
        let terms: Vec<f32> = background_term.iter().flatten().copied().collect();
        Ok(DeviceCompositor {
            stream: self.stream.clone(),
            function: self.function("composite_nv12_f32")?,
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
    function: CudaFunction,
    alpha: CudaSlice<f32>,
    background_term: CudaSlice<f32>,
    background_nv12: CudaSlice<u8>,
}

impl DeviceCompositor {
    /// Composites a host crop on the device and writes the NV12 frame to `out`.
    pub fn compose(
        &self,
        crop: &[f32],
        cw: usize,
        ch: usize,
        range: RgbRange,
        c: &crate::composite::Compositor,
        out: &mut [u8],
    ) -> Result<()> {
        let d_crop = self.stream.clone_htod(crop).map_err(|e| anyhow!("host to device copy failed: {e:?}"))?;
        let mut frame =
            self.stream.clone_dtod(&self.background_nv12).map_err(|e| anyhow!("device copy failed: {e:?}"))?;
        self.compose_on_device(&d_crop.as_view(), cw, ch, range, c, &mut frame)?;
        self.stream.memcpy_dtoh(&frame, out).map_err(|e| anyhow!("device to host copy failed: {e:?}"))?;
        self.stream.synchronize().map_err(|e| anyhow!("CUDA error: {e:?}"))
    }

    /// One launch over the face box's 2x2 blocks; `frame` must already hold the background.
    pub fn compose_on_device(
        &self,
        crop: &CudaView<'_, f32>,
        cw: usize,
        ch: usize,
        range: RgbRange,
        c: &crate::composite::Compositor,
        frame: &mut CudaSlice<u8>,
    ) -> Result<()> {
        ensure!(crop.len() == 3 * cw * ch, "crop has {} values, 3 x {cw} x {ch} expected", crop.len());
        ensure!(frame.len() == c.frame_bytes(), "frame buffer has {} bytes, {} expected", frame.len(), c.frame_bytes());
        let f = c.face;
        let (cw, ch, rng) = (cw as u32, ch as u32, range.code());
        let (w, h, mat) = (c.width as u32, c.height as u32, c.matrix.code());
        let (bx, by, bw, bh) = (f.x, f.y, f.w, f.h);
        let mut b = self.stream.launch_builder(&self.function);
        b.arg(crop).arg(&cw).arg(&ch).arg(&rng).arg(&self.alpha).arg(&self.background_term);
        b.arg(frame).arg(&w).arg(&h).arg(&bx).arg(&by).arg(&bw).arg(&bh).arg(&mat);
        // SAFETY: matches composite_nv12_f32's signature; the compositor checked that the box lies
        // inside the frame with even position and size, and the buffers have the sizes checked above.
        unsafe { b.launch(LaunchConfig::for_num_elems((bw / 2) * (bh / 2))) }
            .map_err(|e| anyhow!("composite launch failed: {e:?}"))?;
        Ok(())
    }
}
