//! cadence's kernels, written once in Rust.
//!
//! For `nvptx64-nvidia-cuda` this crate is compiled by `host/build.rs` straight with rustc's
//! NVPTX backend into PTX (sm_90, sm_120 and a portable sm_75 baseline) under `#![no_core]`
//! with the small shim in `shim.rs`, and [`kernels`] holds the entry points. For the host it is
//! an ordinary library: the scalar math ([`math`]), the interpolation geometry ([`slerp`]), the
//! colour conversion ([`color`]) and the 3-D grid sample's corners ([`grid_sample`]) are the
//! very functions the kernels call, so the CPU paths of the `cadence` crate and the tests use
//! them unchanged (the rust-gpu pattern). With the `emulate` feature the entry points themselves
//! compile for the host too, and [`emu`] runs them on an emulated grid with bounds-checked memory
//! (gpu/README.md).
//!
//! Code outside `kernels`, `shim` and `emu` must compile both ways: no `for` loops (they need the
//! iterator lang items), no slices or arrays in code (a `const` table such as [`KERNELS`] is
//! fine), no `Option`, no std methods on floats (use [`prim`]).
#![cfg_attr(
    target_arch = "nvptx64",
    feature(no_core, lang_items, abi_ptx, intrinsics, rustc_attrs, link_llvm_intrinsics, f16, auto_traits),
    no_core,
    allow(internal_features, improper_ctypes_definitions)
)]
#![cfg_attr(not(target_arch = "nvptx64"), no_std)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

#[cfg(target_arch = "nvptx64")]
mod shim;

/// The SIMT emulator: the device intrinsics of `shim` backed by an emulated grid on the host.
#[cfg(all(feature = "emulate", not(target_arch = "nvptx64")))]
pub mod emu;

pub mod color;
pub mod composite;
pub mod grid_sample;
pub mod math;
pub mod prim;
pub mod slerp;

/// The entry points: PTX on the device; with `emulate`, host functions the emulator runs.
#[cfg(any(target_arch = "nvptx64", feature = "emulate"))]
pub mod kernels;

/// What a kernel computes; with a [`Storage`] type it names one entry point ([`Kernel`]).
#[cfg_attr(not(target_arch = "nvptx64"), derive(Clone, Copy, Debug, PartialEq, Eq, Hash))]
pub enum Op {
    SlerpPairs,
    Expand,
    Ease,
    RgbToNv12,
    CompositeNv12,
    Hermite,
    /// `F.grid_sample` of a 5-D volume (trilinear, zero padding, align_corners=False): Ditto's
    /// WarpingNetwork ([`grid_sample`]).
    GridSample3d,
}

/// The element type a kernel reads and writes in memory (arithmetic is f32 either way).
#[cfg_attr(not(target_arch = "nvptx64"), derive(Clone, Copy, Debug, PartialEq, Eq, Hash))]
pub enum Storage {
    F32,
    F16,
}

/// One kernel entry point.
#[cfg_attr(not(target_arch = "nvptx64"), derive(Clone, Copy, Debug, PartialEq, Eq, Hash))]
pub struct Kernel {
    pub op: Op,
    pub storage: Storage,
    /// The entry point's symbol: the `#[no_mangle]` function in `kernels.rs`.
    pub name: &'static str,
}

/// Every entry point each PTX module exports: `host/build.rs` checks the PTX against this table
/// (both ways), the CUDA backend loads kernels by these names ([`kernel`]) and the emulator
/// reports faults under them.
pub const KERNELS: [Kernel; 12] = [
    Kernel { op: Op::SlerpPairs, storage: Storage::F32, name: "slerp_pairs_f32" },
    Kernel { op: Op::SlerpPairs, storage: Storage::F16, name: "slerp_pairs_f16" },
    Kernel { op: Op::Expand, storage: Storage::F32, name: "expand_f32" },
    Kernel { op: Op::Expand, storage: Storage::F16, name: "expand_f16" },
    Kernel { op: Op::Ease, storage: Storage::F32, name: "ease_f32" },
    Kernel { op: Op::Ease, storage: Storage::F16, name: "ease_f16" },
    Kernel { op: Op::RgbToNv12, storage: Storage::F32, name: "rgb_to_nv12_f32" },
    Kernel { op: Op::RgbToNv12, storage: Storage::F16, name: "rgb_to_nv12_f16" },
    Kernel { op: Op::CompositeNv12, storage: Storage::F32, name: "composite_nv12_f32" },
    Kernel { op: Op::CompositeNv12, storage: Storage::F16, name: "composite_nv12_f16" },
    Kernel { op: Op::Hermite, storage: Storage::F32, name: "hermite_f32" },
    Kernel { op: Op::GridSample3d, storage: Storage::F32, name: "grid_sample_3d_f32" },
];

/// The entry point of `op` for `storage` (`None` where there is none: Hermite weights and the
/// 3-D grid sample are f32 only).
#[cfg(not(target_arch = "nvptx64"))]
pub fn kernel(op: Op, storage: Storage) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.op == op && k.storage == storage)
}

/// The symbol of `op`'s entry point for `storage`; panics where the table has none (a caller
/// asking for a kernel that does not exist is a bug in cadence, not bad input).
#[cfg(not(target_arch = "nvptx64"))]
pub fn kernel_name(op: Op, storage: Storage) -> &'static str {
    match kernel(op, storage) {
        Some(k) => k.name,
        None => panic!("no {op:?} kernel for {storage:?} storage"),
    }
}
