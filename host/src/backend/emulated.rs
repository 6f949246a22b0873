//! The emulated backend: the kernels themselves (`gpu/src/kernels.rs`, compiled for the host) run
//! in the SIMT emulator (`cadence_kernels::emu`) with exactly the launches the CUDA backend makes
//! (`launch.rs`). Every load and store is checked against its buffer, warps meet at their
//! shuffles as on the hardware, and an output is read back only if the launch wrote all of it, so
//! a launch with too few blocks or a buffer that is too short fails with the kernel, block,
//! thread and index instead of returning wrong frames. Each GPU thread runs as a coroutine: this
//! checks the device code without a GPU and is far slower than the CPU backend.

use crate::backend::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::backend::grid_sample::GridSample3d;
use crate::backend::launch::{self, CompositeTarget, Emulated, EmulatedArgs, Launch};
use crate::schedules::keyframes::KeyframeSchedule;
use anyhow::{anyhow, ensure, Result};
use cadence_kernels::emu::{self, Buffer, Scalar};

/// Names a kernel whose emulated launches get one block fewer than launch.rs says: a planted
/// launch error, so that tests can check that `gpu-check --emulate` reports one (and fails).
pub const PLANT_ENV: &str = "CADENCE_EMULATE_ONE_BLOCK_SHORT";

/// Runs one launch in the emulator; a fault becomes the error, in one line.
pub fn run<A: EmulatedArgs>(l: &Launch<A>) -> Result<()> {
    static PLANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let mut blocks = l.shape.blocks;
    if PLANTED.get_or_init(|| std::env::var(PLANT_ENV).ok()).as_deref() == Some(l.kernel) {
        blocks -= 1;
    }
    // SAFETY: `call` runs inside `emu::launch`, and the launch's buffers outlive it (the callers
    // hold them).
    emu::launch(l.kernel, blocks, l.shape.threads, || unsafe { l.args.call() }).map_err(|f| anyhow!("{f}"))
}

/// Reads back an output the launch of `kernel` must have written entirely.
pub fn read_output<T: Scalar>(kernel: &str, b: &Buffer<T>) -> Result<Vec<T>> {
    b.written().map_err(|e| anyhow!("kernel {kernel}: {e}"))
}

pub fn expand<T: Elem>(keys: &[T], schedule: &KeyframeSchedule, dim: usize, method: Method) -> Result<Vec<T>> {
    let k = Buffer::from_slice("keys", keys);
    let idx = Buffer::from_slice("key_idx", schedule.keyframes());
    let out = Buffer::uninit("out", schedule.n_frames() * dim, T::default());
    let l = launch::expand::<Emulated, T>(
        k.ptr(),
        idx.ptr(),
        schedule.count(),
        out.ptr(),
        schedule.n_frames(),
        dim,
        method,
    );
    run(&l)?;
    read_output(l.kernel, &out)
}

pub fn slerp_pairs<T: Elem>(v0: &[T], v1: &[T], alphas: &[f32], dim: usize, method: Method) -> Result<Vec<T>> {
    let (a, b, al) = (Buffer::from_slice("v0", v0), Buffer::from_slice("v1", v1), Buffer::from_slice("alphas", alphas));
    let out = Buffer::uninit("out", v0.len(), T::default());
    let l = launch::slerp_pairs::<Emulated, T>(a.ptr(), b.ptr(), al.ptr(), out.ptr(), alphas.len(), dim, method);
    run(&l)?;
    read_output(l.kernel, &out)
}

pub fn ease<T: Elem>(frames: &mut [T], rest: &[T], distance: &[u32], ramp: u32) -> Result<()> {
    let f = Buffer::from_slice("frames", frames);
    let (r, d) = (Buffer::from_slice("rest", rest), Buffer::from_slice("distance", distance));
    run(&launch::ease::<Emulated, T>(f.ptr(), r.ptr(), d.ptr(), ramp, distance.len(), rest.len()))?;
    frames.copy_from_slice(&f.to_vec());
    Ok(())
}

pub fn rgb_to_nv12<T: Elem>(rgb: &[T], layout: RgbLayout, matrix: ColorMatrix, range: RgbRange) -> Result<Vec<u8>> {
    let input = Buffer::from_slice("rgb", rgb);
    let out = Buffer::uninit("nv12", layout.frames * layout.nv12_frame_bytes(), 0u8);
    let l = launch::rgb_to_nv12::<Emulated, T>(input.ptr(), layout, matrix, range, out.ptr());
    run(&l)?;
    read_output(l.kernel, &out)
}

pub fn hermite(t: &[f32]) -> Result<Vec<f32>> {
    let input = Buffer::from_slice("t", t);
    let out = Buffer::uninit("out", t.len(), 0.0f32);
    let l = launch::hermite::<Emulated>(input.ptr(), out.ptr(), t.len());
    run(&l)?;
    read_output(l.kernel, &out)
}

/// The 3-D grid sample of the validated shape `s` (buffers checked by the caller).
pub fn grid_sample_3d(input: &[f32], grid: &[f32], s: &GridSample3d) -> Result<Vec<f32>> {
    let (i, g) = (Buffer::from_slice("input", input), Buffer::from_slice("grid", grid));
    let out = Buffer::uninit("out", s.output_elements(), 0.0f32);
    let l = launch::grid_sample_3d::<Emulated>(i.ptr(), g.ptr(), out.ptr(), s);
    run(&l)?;
    read_output(l.kernel, &out)
}

/// A compositor's per-render data in the emulator (the twin of `cuda::DeviceCompositor`).
pub struct EmulatedCompositor {
    alpha: Buffer<f32>,
    background_term: Buffer<f32>,
    background_nv12: Vec<u8>,
}

impl EmulatedCompositor {
    pub fn new(alpha: &[f32], background_term: &[Vec<f32>; 3], background_nv12: &[u8]) -> Self {
        let terms: Vec<f32> = background_term.iter().flatten().copied().collect();
        Self {
            alpha: Buffer::from_slice("alpha", alpha),
            background_term: Buffer::from_slice("background_term", &terms),
            background_nv12: background_nv12.to_vec(),
        }
    }

    /// Writes the background with the crop composited into the box to `out`.
    pub fn compose<T: Elem>(
        &self,
        crop: &[T],
        cw: usize,
        ch: usize,
        range: RgbRange,
        target: CompositeTarget,
        out: &mut [u8],
    ) -> Result<()> {
        ensure!(crop.len() == 3 * cw * ch, "crop has {} values, 3 x {cw} x {ch} expected", crop.len());
        let c = Buffer::from_slice("crop", crop);
        let frame = Buffer::from_slice("frame", &self.background_nv12);
        // The kernel must rewrite every byte of the box: mark them unwritten, so that a launch
        // that misses some fails the read-back.
        discard_box(&frame, target);
        let l = launch::composite_nv12::<Emulated, T>(
            c.ptr(),
            cw,
            ch,
            range,
            self.alpha.ptr(),
            self.background_term.ptr(),
            frame.ptr(),
            target,
        );
        run(&l)?;
        out.copy_from_slice(&read_output(l.kernel, &frame)?);
        Ok(())
    }
}

/// Marks the face box of an NV12 frame (its luma rows and its chroma rows) as unwritten (as far
/// as the buffer reaches).
pub fn discard_box(frame: &Buffer<u8>, t: CompositeTarget) {
    let (w, len) = (t.width, frame.len());
    let (fx, fy, fw, fh) = t.face.as_usize();
    let row = |start: usize| frame.discard(start.min(len)..(start + fw).min(len));
    for y in fy..fy + fh {
        row(y * w + fx);
    }
    let uv = w * t.height;
    for y in fy / 2..(fy + fh) / 2 {
        row(uv + y * w + fx);
    }
}
