//! cadence host library: the render pipeline around the neural engines, from the keyframe
//! schedule to the encoder's input, and everything that runs cadence's kernels.
//!
//! The folders are the architecture, lowest layer first; a module uses only its own folder and
//! the folders listed before it (`scripts/module_graph.py host/src --layers schedules,backend,io,...` checks it,
//! `docs/architecture.md` draws it):
//!
//! | folder | job |
//! |---|---|
//! | [`schedules`] | which frames are keyframes: fixed strides, keyframe lists, adaptive schedules, silence bypass |
//! | [`backend`] | where kernels run (CPU, CUDA, the SIMT emulator), their launches, the compositor, device-resident frames |
//! | [`io`] | files in and out: `.npy` arrays, the one output-file policy, allocation bounds |
//! | [`avatar`] | avatar images, videos and image sequences, face boxes, the avatar frame each output frame shows |
//! | [`frame_loop`] | the one frame loop both engines plug into, its sources (clip audio, live streams) and sinks (MP4, fragmented MP4), its report |
//! | [`musetalk`] | MuseTalk's engines in the loop: whisper features, UNet keyframes, latent SLERP, the decoder; prepared avatars |
//! | [`ditto`] | Ditto's engines in the loop: HuBERT, motion diffusion, warp + SPADE on keyframes, its infills |
//! | [`measure`] | benchmarks, calibration, `gpu-check`, fixtures for tests and benchmarks |
//! | [`args`] | the command-line flags the CLI, the server and the experiments share |
//!
//! The `cadence` binary (`cli/`, package `cadence-cli`) is its CLI; `server/` its HTTP server.

pub mod args;
pub mod avatar;
pub mod backend;
pub mod ditto;
pub mod frame_loop;
pub mod io;
pub mod measure;
pub mod musetalk;
pub mod schedules;

pub use backend::elem::{ColorMatrix, Dtype, Elem, Method, RgbLayout, RgbRange};
pub use backend::grid_sample::GridSample3d;
pub use backend::{Backend, BackendChoice};
pub use schedules::keyframes::KeyframeSchedule;
