//! Every kernel launch written once: its entry point (from the kernel table), its grid and block
//! shape, and its argument list in the entry point's order. The CUDA backend (`cuda.rs`) pushes
//! these arguments to the driver and the emulated backend (`emulated.rs`) calls the same entry
//! point on the host with them, so the emulator checks the very launches the GPU gets.
//!
//! An argument struct is generic over where its buffers live ([`Mem`]): [`Cuda`] device pointers
//! or [`Emulated`] checked pointers. Its fields are declared in the entry point's parameter order
//! once (`kernel_args!`); both the driver's argument list and the emulator's call are generated
//! from that declaration, and the emulator's call is type-checked against the entry point.

use crate::backend::elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use crate::backend::grid_sample::GridSample3d;
use cadence_kernels::emu::DevPtr;
use cadence_kernels::{kernel_name, Op, Storage};
use cadence_media::FaceBox;
use std::marker::PhantomData;

/// Threads per block of the warp-per-pair kernels (4 warps).
pub const WARP_BLOCK: u32 = 128;
const WARPS_PER_BLOCK: u32 = WARP_BLOCK / 32;
/// Threads per block of the one-thread-per-item kernels. A block must find all its threads'
/// registers in one SM's 65536; ptxas gives a thread at most 255, so at 256 threads any kernel
/// fits whatever its register count (at 1024 only kernels of <= 64 registers would: the
/// compositor needs 72, and its launch would fail with `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`).
pub const ITEM_BLOCK: u32 = 256;
const _: () = assert!(ITEM_BLOCK * 255 <= 65536 && WARP_BLOCK * 255 <= 65536);

/// A 1-D launch: `blocks` blocks of `threads` threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub blocks: u32,
    pub threads: u32,
}

impl Shape {
    /// One warp per work item (a frame pair, an interval, a frame).
    pub fn warps(warps: u32) -> Shape {
        Shape { blocks: warps.div_ceil(WARPS_PER_BLOCK).max(1), threads: WARP_BLOCK }
    }

    /// One thread per work item (a 2x2 pixel block, a value).
    pub fn items(items: u32) -> Shape {
        Shape { blocks: items.div_ceil(ITEM_BLOCK).max(1), threads: ITEM_BLOCK }
    }
}

impl From<Shape> for cudarc::driver::LaunchConfig {
    fn from(s: Shape) -> Self {
        cudarc::driver::LaunchConfig { grid_dim: (s.blocks, 1, 1), block_dim: (s.threads, 1, 1), shared_mem_bytes: 0 }
    }
}

/// Where a launch's buffers live.
pub trait Mem {
    /// A device pointer to `T`s (the entry points' `Ptr<T>` and `PtrMut<T>` alike).
    type Ptr<T>: Copy;
    /// `p + n` elements.
    fn offset<T>(p: Self::Ptr<T>, n: usize) -> Self::Ptr<T>;
}

/// A CUDA device address of `T`s (a `CUdeviceptr`, as the kernel's pointer parameter receives it).
#[repr(transparent)]
pub struct CudaPtr<T>(pub u64, PhantomData<fn() -> T>);

impl<T> CudaPtr<T> {
    pub fn new(address: u64) -> Self {
        Self(address, PhantomData)
    }
}
impl<T> Clone for CudaPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for CudaPtr<T> {}
// SAFETY: a u64 address, passed by value like the `CUdeviceptr` it is.
unsafe impl<T> cudarc::driver::DeviceRepr for CudaPtr<T> {}

/// Buffers on a CUDA device.
pub struct Cuda;
impl Mem for Cuda {
    type Ptr<T> = CudaPtr<T>;
    fn offset<T>(p: CudaPtr<T>, n: usize) -> CudaPtr<T> {
        CudaPtr::new(p.0 + (n * std::mem::size_of::<T>()) as u64)
    }
}

/// Buffers in the emulator.
pub struct Emulated;
impl Mem for Emulated {
    type Ptr<T> = DevPtr<T>;
    fn offset<T>(p: DevPtr<T>, n: usize) -> DevPtr<T> {
        p.offset(n)
    }
}

/// One launch: which entry point, its shape and its arguments.
pub struct Launch<A> {
    /// The entry point's symbol (`cadence_kernels::KERNELS`).
    pub kernel: &'static str,
    pub shape: Shape,
    pub args: A,
}

/// Arguments a CUDA launch pushes.
pub trait CudaArgs {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
}

/// Arguments an emulated launch passes to the entry point.
pub trait EmulatedArgs: Sync {
    /// Runs the entry point for the current emulated thread.
    ///
    /// # Safety
    /// Only inside `cadence_kernels::emu::launch`, with pointers to live buffers.
    unsafe fn call(&self);
}

/// Declares a kernel's argument struct: fields in the entry point's parameter order, once.
macro_rules! kernel_args {
    ($(#[$doc:meta])* $name:ident<$m:ident $(, $t:ident)?> calls $entry:expr; { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        pub struct $name<$m: Mem $(, $t)?> {
            $(pub $field: $ty),*
        }
        impl<$($t: Elem)?> CudaArgs for $name<Cuda $(, $t)?> {
            fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
                use cudarc::driver::PushKernelArg;
                $(b.arg(&self.$field);)*
            }
        }
        impl<$($t: Elem)?> EmulatedArgs for $name<Emulated $(, $t)?> {
            unsafe fn call(&self) {
                // SAFETY: the caller's contract.
                unsafe { ($entry)($(self.$field),*) }
            }
        }
    };
}

kernel_args! {
    /// `slerp_pairs_*`: `out[r] = interp(v0[r], v1[r], alphas[r])`.
    SlerpPairsArgs<M, T> calls <T as cadence_kernels::kernels::Entries>::SLERP_PAIRS; {
        v0: M::Ptr<T>, v1: M::Ptr<T>, alphas: M::Ptr<f32>, out: M::Ptr<T>, rows: u32, dim: u32, method: u32,
    }
}

kernel_args! {
    /// `expand_*`: every frame of a schedule from its keyframes.
    ExpandArgs<M, T> calls <T as cadence_kernels::kernels::Entries>::EXPAND; {
        keys: M::Ptr<T>, key_idx: M::Ptr<u32>, n_keys: u32, out: M::Ptr<T>, n_frames: u32, dim: u32, method: u32,
    }
}

kernel_args! {
    /// `ease_*`: silence easing toward the rest latent (`frames == out` in place).
    EaseArgs<M, T> calls <T as cadence_kernels::kernels::Entries>::EASE; {
        frames: M::Ptr<T>, rest: M::Ptr<T>, distance: M::Ptr<u32>, ramp: u32, out: M::Ptr<T>, n_frames: u32, dim: u32,
    }
}

kernel_args! {
    /// `rgb_to_nv12_*`: planar RGB frames to NV12.
    RgbToNv12Args<M, T> calls <T as cadence_kernels::kernels::Entries>::RGB_TO_NV12; {
        rgb: M::Ptr<T>,
        rgb_frame_stride: u32,
        plane_stride: u32,
        rgb_pitch: u32,
        y_out: M::Ptr<u8>,
        y_frame_stride: u32,
        y_pitch: u32,
        uv_out: M::Ptr<u8>,
        uv_frame_stride: u32,
        uv_pitch: u32,
        width: u32,
        height: u32,
        frames: u32,
        matrix: u32,
        range: u32,
    }
}

kernel_args! {
    /// `composite_nv12_*`: the face box of one NV12 frame from a crop.
    CompositeNv12Args<M, T> calls <T as cadence_kernels::kernels::Entries>::COMPOSITE_NV12; {
        crop: M::Ptr<T>,
        cw: u32,
        ch: u32,
        range: u32,
        alpha: M::Ptr<f32>,
        background_term: M::Ptr<f32>,
        frame: M::Ptr<u8>,
        width: u32,
        height: u32,
        box_x: u32,
        box_y: u32,
        box_w: u32,
        box_h: u32,
        matrix: u32,
    }
}

kernel_args! {
    /// `hermite_f32`: the Hermite smoothstep of each value.
    HermiteArgs<M> calls cadence_kernels::kernels::hermite_f32; {
        t: M::Ptr<f32>, out: M::Ptr<f32>, n: u32,
    }
}

kernel_args! {
    /// `grid_sample_3d_f32`: PyTorch's 5-D `grid_sample` (trilinear, zeros, align_corners=False).
    GridSample3dArgs<M> calls cadence_kernels::kernels::grid_sample_3d_f32; {
        input: M::Ptr<f32>,
        grid: M::Ptr<f32>,
        out: M::Ptr<f32>,
        batch: u32,
        channels: u32,
        in_d: u32,
        in_h: u32,
        in_w: u32,
        out_voxels: u32,
    }
}

fn name(op: Op, storage: Storage) -> &'static str {
    kernel_name(op, storage)
}

/// `rows` frame pairs of `dim` elements: one warp per pair.
#[allow(clippy::too_many_arguments)]
pub fn slerp_pairs<M: Mem, T: Elem>(
    v0: M::Ptr<T>,
    v1: M::Ptr<T>,
    alphas: M::Ptr<f32>,
    out: M::Ptr<T>,
    rows: usize,
    dim: usize,
    method: Method,
) -> Launch<SlerpPairsArgs<M, T>> {
    Launch {
        kernel: name(Op::SlerpPairs, T::DTYPE.storage()),
        shape: Shape::warps(rows as u32),
        args: SlerpPairsArgs { v0, v1, alphas, out, rows: rows as u32, dim: dim as u32, method: method.code() },
    }
}

/// `n_keys` keyframes to `n_frames` frames: one warp per keyframe interval (one warp for a
/// single keyframe).
#[allow(clippy::too_many_arguments)]
pub fn expand<M: Mem, T: Elem>(
    keys: M::Ptr<T>,
    key_idx: M::Ptr<u32>,
    n_keys: usize,
    out: M::Ptr<T>,
    n_frames: usize,
    dim: usize,
    method: Method,
) -> Launch<ExpandArgs<M, T>> {
    Launch {
        kernel: name(Op::Expand, T::DTYPE.storage()),
        shape: Shape::warps((n_keys.max(2) - 1) as u32),
        args: ExpandArgs {
            keys,
            key_idx,
            n_keys: n_keys as u32,
            out,
            n_frames: n_frames as u32,
            dim: dim as u32,
            method: method.code(),
        },
    }
}

/// Easing of `n_frames` frames of `dim` elements in place (`frames` is read and written): one
/// warp per frame.
pub fn ease<M: Mem, T: Elem>(
    frames: M::Ptr<T>,
    rest: M::Ptr<T>,
    distance: M::Ptr<u32>,
    ramp: u32,
    n_frames: usize,
    dim: usize,
) -> Launch<EaseArgs<M, T>> {
    Launch {
        kernel: name(Op::Ease, T::DTYPE.storage()),
        shape: Shape::warps(n_frames as u32),
        args: EaseArgs { frames, rest, distance, ramp, out: frames, n_frames: n_frames as u32, dim: dim as u32 },
    }
}

/// RGB frames in `layout` to tightly packed NV12 frames in `out` (`layout.nv12_frame_bytes()`
/// each: the Y plane, then the interleaved U,V rows): one thread per 2x2 block.
pub fn rgb_to_nv12<M: Mem, T: Elem>(
    rgb: M::Ptr<T>,
    layout: RgbLayout,
    matrix: ColorMatrix,
    range: RgbRange,
    out: M::Ptr<u8>,
) -> Launch<RgbToNv12Args<M, T>> {
    let (w, h) = (layout.width as u32, layout.height as u32);
    let frame_bytes = layout.nv12_frame_bytes() as u32;
    Launch {
        kernel: name(Op::RgbToNv12, T::DTYPE.storage()),
        shape: Shape::items((w / 2) * (h / 2) * layout.frames as u32),
        args: RgbToNv12Args {
            rgb,
            rgb_frame_stride: layout.frame_len() as u32,
            plane_stride: layout.plane_len() as u32,
            rgb_pitch: layout.pitch as u32,
            y_out: out,
            y_frame_stride: frame_bytes,
            y_pitch: w,
            uv_out: M::offset(out, layout.width * layout.height),
            uv_frame_stride: frame_bytes,
            uv_pitch: w,
            width: w,
            height: h,
            frames: layout.frames as u32,
            matrix: matrix.code(),
            range: range.code(),
        },
    }
}

/// Where a compositor pastes: the frame's size, the face box in it and the YUV matrix.
#[derive(Clone, Copy, Debug)]
pub struct CompositeTarget {
    pub width: usize,
    pub height: usize,
    pub face: FaceBox,
    pub matrix: ColorMatrix,
}

/// A `cw` x `ch` planar crop composited into the face box of one NV12 frame: one thread per
/// 2x2 block of the box.
#[allow(clippy::too_many_arguments)]
pub fn composite_nv12<M: Mem, T: Elem>(
    crop: M::Ptr<T>,
    cw: usize,
    ch: usize,
    range: RgbRange,
    alpha: M::Ptr<f32>,
    background_term: M::Ptr<f32>,
    frame: M::Ptr<u8>,
    target: CompositeTarget,
) -> Launch<CompositeNv12Args<M, T>> {
    let f = target.face;
    Launch {
        kernel: name(Op::CompositeNv12, T::DTYPE.storage()),
        shape: Shape::items((f.w / 2) * (f.h / 2)),
        args: CompositeNv12Args {
            crop,
            cw: cw as u32,
            ch: ch as u32,
            range: range.code(),
            alpha,
            background_term,
            frame,
            width: target.width as u32,
            height: target.height as u32,
            box_x: f.x,
            box_y: f.y,
            box_w: f.w,
            box_h: f.h,
            matrix: target.matrix.code(),
        },
    }
}

/// Hermite weights of `n` values: one thread per value.
pub fn hermite<M: Mem>(t: M::Ptr<f32>, out: M::Ptr<f32>, n: usize) -> Launch<HermiteArgs<M>> {
    Launch {
        kernel: name(Op::Hermite, Storage::F32),
        shape: Shape::items(n as u32),
        args: HermiteArgs { t, out, n: n as u32 },
    }
}

/// A 3-D grid sample of the validated shape `s` (input N x C x D x H x W, grid N x Do x Ho x Wo
/// x 3, output N x C x Do x Ho x Wo): one thread per output voxel of one batch item, each
/// sampling every channel. [`GridSample3d::new`] keeps every size within the u32 arguments.
pub fn grid_sample_3d<M: Mem>(
    input: M::Ptr<f32>,
    grid: M::Ptr<f32>,
    out: M::Ptr<f32>,
    s: &GridSample3d,
) -> Launch<GridSample3dArgs<M>> {
    Launch {
        kernel: name(Op::GridSample3d, Storage::F32),
        shape: Shape::items((s.batch * s.out_voxels()) as u32),
        args: GridSample3dArgs {
            input,
            grid,
            out,
            batch: s.batch as u32,
            channels: s.channels as u32,
            in_d: s.in_d as u32,
            in_h: s.in_h as u32,
            in_w: s.in_w as u32,
            out_voxels: s.out_voxels() as u32,
        },
    }
}
