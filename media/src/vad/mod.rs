//! Voice activity: which video frames hold speech.
//!
//! Three detectors with the same per-frame shape, `fn(samples_16k, fps, n_frames) -> Vec<bool>`:
//! - [`energy`] (re-exported here, so every path of the original `vad` module still works:
//!   [`voice_activity`], [`VadConfig`], [`HopLevels`], ...): RMS level of 10 ms hops against the
//!   clip's own loudness, with a hangover. No model; fooled by loud non-speech (breaths, music,
//!   noise).
//! - [`silero`]: Silero VAD v5, a small trained network (STFT, four convolutions, an LSTM) on
//!   512-sample chunks, written out in `silero_net` (tract runs the published graph as its
//!   reference), with Silero's own post-processing ([`silero::voice_activity`],
//!   [`silero::SileroVad`] for a stream, [`silero::VadIterator`] for live events), by default
//!   after [`denoise`], cadence's front end (noise suppression and AGC, so that quiet speech in
//!   stationary noise is not missed).
//! - [`digital`]: digital silence, for audio whose pauses are written (a live session's
//!   timeline, a synthesizer's output): a frame is silence when its samples are all zero.
//!
//! The module was one file (`vad.rs`, the energy detector); it became this folder so the
//! detectors sit side by side while every existing public item keeps its path
//! (`cadence_media::vad::X` and the crate-root re-exports).

pub mod denoise;
pub mod digital;
pub mod energy;
pub mod silero;
mod silero_net;

pub use energy::*;
