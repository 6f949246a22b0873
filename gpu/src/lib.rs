//! cadence's kernels, written once in Rust.
//!
//! For `nvptx64-nvidia-cuda` this crate is compiled by `host/build.rs` straight with rustc's
//! NVPTX backend into PTX (sm_90, sm_120 and a portable sm_75 baseline) under `#![no_core]`
//! with the small shim in `shim.rs`, and [`kernels`] holds the entry points. For the host it is
//! an ordinary library: the scalar math ([`math`]), the interpolation geometry ([`slerp`]) and
//! the colour conversion ([`color`]) are the very functions the kernels call, so the CPU paths
//! of the `cadence` crate and the tests use them unchanged (the rust-gpu pattern).
//!
//! Code outside `kernels` and `shim` must compile both ways: no `for` loops (they need the
//! iterator lang items), no slices or arrays, no std methods on floats (use [`prim`]).
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

pub mod color;
pub mod composite;
pub mod math;
pub mod prim;
pub mod slerp;

#[cfg(target_arch = "nvptx64")]
pub mod kernels;

/// Names of the kernels each PTX module exports; the host checks them at load time.
pub const KERNEL_NAMES: &str = "slerp_pairs_f32 slerp_pairs_f16 expand_f32 expand_f16 ease_f32 ease_f16 rgb_to_nv12_f32 rgb_to_nv12_f16 composite_nv12_f32 composite_nv12_f16 hermite_f32";
