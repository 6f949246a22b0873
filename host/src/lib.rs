//! cadence host library: backends (CUDA through cudarc, CPU through rayon), the kernels'
//! launches and CPU paths, keyframe schedules, and array I/O. The `cadence` binary (`cli/`,
//! package `cadence-cli`) is its CLI.

pub mod args;
pub mod avatar;
pub mod avatar_file;
pub mod backend;
pub mod bench;
pub mod calibrate;
pub mod clip_audio;
pub mod composite;
pub mod cpu;
pub mod cuda;
pub mod ditto;
pub mod ditto_live;
pub mod elem;
pub mod emulated;
pub mod features;
pub mod fixtures;
pub mod gpucheck;
pub mod grid_sample;
pub mod hardware;
pub mod launch;
pub mod live;
pub mod memory;
pub mod npy;
pub mod output;
pub mod pipeline;
pub mod ptx;
pub mod render;
pub mod report;
pub mod resident;
pub mod schedule;
pub mod schedules;

pub use backend::{Backend, BackendChoice};
pub use elem::{ColorMatrix, Dtype, Elem, Method, RgbLayout, RgbRange};
pub use grid_sample::GridSample3d;
pub use schedule::KeyframeSchedule;
