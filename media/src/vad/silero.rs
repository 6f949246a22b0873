//! Silero VAD v5: a trained voice activity detector, run in Rust by cadence's own network.
//!
//! ## The model
//! `media/models/silero_vad_openvino_16k.onnx` ([`MODEL_FILE`], sha256 [`MODEL_SHA256`]), from
//! the PyPI wheel `silero-vad` 6.2.3 (MIT; `media/models/LICENSE-silero-vad`,
//! `media/models/PROVENANCE.md`), embedded in the binary with `include_bytes!`: nothing is
//! downloaded at build or run time. It is the wheel's 16 kHz export without `If` nodes; on the
//! committed test clip ONNX Runtime gives bit-identical probabilities for it and for the wheel's
//! default `silero_vad.onnx` (`fixtures/vad/silero_reference.json`, `default_model`).
//! One call of the network takes `input` [1, 64 + 512] (the previous chunk's last 64 samples,
//! then the chunk) and `state` [2, 1, 128] (the LSTM's h and c), and returns the chunk's speech
//! probability and the next state.
//!
//! ## The runtime: cadence's own network, tract as its reference
//! [`SileroVad`] runs the network written out in `silero_net.rs` (STFT, four convolutions, one
//! LSTM step, the decoder) with the weights read from the embedded file by tract's ONNX parser.
//! It runs a clip's chunks in blocks (everything before the LSTM batched), its matrix products
//! give the same bits whatever the batching and the instruction-set level, and it is several
//! times faster than tract running the graph chunk by chunk (`experiments/src/bin/vad.rs`,
//! `results/vad_speed.csv`). [`TractSileroVad`] is that peer: tract-onnx (pure Rust, crates.io
//! only) running the published graph itself, which the tests compare the network with. The
//! wheel's other exports use ONNX `If` nodes that tract does not load, and ONNX Runtime's crate
//! (`ort`) downloads binaries at build time, which this project does not allow.
//!
//! ## What is reproduced (from the wheel's `silero_vad/utils_vad.py`)
//! - [`SileroVad`]: `OnnxWrapper.__call__` at 16 kHz: the 64-sample context (zeros after a reset)
//!   is put before each 512-sample chunk, the recurrent state is carried from call to call,
//!   [`SileroVad::reset`] is `reset_states`.
//! - [`speech_probabilities`]: the loop of `get_speech_timestamps`: one probability per
//!   512-sample chunk, the last chunk zero-padded, the state carried across the whole clip.
//! - [`speech_segments`]: `get_speech_timestamps_from_probs`, every branch (hysteresis with
//!   `neg_threshold`, minimum silence, minimum speech, maximum speech length with its two ways of
//!   cutting, padding and the halving of short gaps), with the same integer and float arithmetic
//!   so the sample positions come out identical ([`SileroConfig`] holds the defaults).
//! - [`VadIterator`]: `VADIterator`, the streaming post-processor for a live feed.
//! - [`voice_activity`]: the per-video-frame decisions, shaped like the energy detector's
//!   [`super::voice_activity`]: a frame is speech when its time span overlaps a speech segment.
//!
//! Input is mono 16 kHz (`Audio::samples_16k`: cadence's WAV reader resamples any rate with
//! rubato's FFT resampler). The wheel itself decimates a 32/48 kHz signal by taking every 2nd or
//! 3rd sample without a filter; cadence filters, which is why its decisions on a 44.1 or 48 kHz
//! copy of a clip match the 16 kHz original's (tested in `media/tests/silero.rs`).
//!
//! ## The front end (cadence's, not the wheel's)
//! By default ([`SileroConfig::denoise`]) the samples go through [`super::denoise`] before the
//! network: a Wiener noise suppressor and an AGC, which keep Silero from missing quiet speech
//! in stationary noise (its module says why and how). It is applied wherever probabilities are
//! made from samples: [`speech_probabilities`], [`ChunkProbabilities`] (a stream, a WAV read as
//! it goes, a live render), [`VadIterator`], and so everything built on them. It delays a
//! stream's probabilities by [`super::denoise::LATENCY_CHUNKS`] chunks (the probability of chunk
//! `k` is known once chunk `k + 2` has arrived; [`ChunkProbabilities::finish`] and
//! [`VadIterator::finish`] flush the rest at the end), never shifts them: probability `k` is
//! still chunk `k`'s. [`SileroVad`] and [`TractSileroVad`] are the network alone. With
//! `denoise: false` everything is the wheel's, which is how the tests compare the network and
//! the post-processing with ONNX Runtime and Python.
//!
//! Samples must be finite: [`ChunkProbabilities`] (every path's entry) and the front end
//! refuse a NaN or infinity with an error; [`SileroVad`] does not check (a NaN would poison
//! its recurrent state until a reset), and cadence's WAV reader refuses them in files.
//!
//! Tests: `media/tests/silero.rs` against `fixtures/vad/silero_reference.json`, written by
//! `scripts/make_vad_fixtures.py` with ONNX Runtime and the wheel's own Python code (front end
//! off); the front end's own tests are in `denoise.rs`.

use std::io::Cursor;
use std::sync::{Arc, OnceLock};

use tract_onnx::prelude::*;

use super::denoise::{self, Denoiser};
use super::silero_net;
use crate::error::{MediaError, Result};

/// The sample rate the model runs at.
pub const SAMPLE_RATE: u32 = 16_000;
/// Samples per model call at 16 kHz (32 ms).
pub const CHUNK_SAMPLES: usize = 512;
/// Samples of the previous chunk put before each chunk (Silero's `context_size` at 16 kHz).
pub const CONTEXT_SAMPLES: usize = 64;
/// Floats in the recurrent state: [2, 1, 128] (the LSTM's h and c).
pub const STATE_LEN: usize = 2 * 128;
/// The model file, relative to the repository root.
pub const MODEL_FILE: &str = "media/models/silero_vad_openvino_16k.onnx";
/// sha256 of [`MODEL_FILE`] (checked by a test against the embedded bytes).
pub const MODEL_SHA256: &str = "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87";
/// The wheel the model file comes from.
pub const MODEL_SOURCE: &str = "silero-vad 6.2.3 (PyPI), silero_vad/data/silero_vad_openvino_16k.onnx";

static MODEL_BYTES: &[u8] = include_bytes!("../../models/silero_vad_openvino_16k.onnx");

/// The embedded ONNX file (for provenance: hash it to check [`MODEL_SHA256`]).
pub fn model_bytes() -> &'static [u8] {
    MODEL_BYTES
}

type Plan = Arc<TypedSimplePlan>;

/// The model, loaded and optimised once per process (a few tens of milliseconds) and shared by
/// every [`SileroVad`]; each one has its own execution state.
fn plan() -> Result<Plan> {
    static PLAN: OnceLock<std::result::Result<Plan, String>> = OnceLock::new();
    PLAN.get_or_init(|| load(MODEL_BYTES).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| MediaError::Model(format!("loading {MODEL_FILE}: {e}")))
}

fn load(bytes: &[u8]) -> TractResult<Plan> {
    let model = tract_onnx::onnx()
        .model_for_read(&mut Cursor::new(bytes))?
        .with_input_fact(0, f32::fact([1, CONTEXT_SAMPLES + CHUNK_SAMPLES]).into())?
        .with_input_fact(1, f32::fact([2, 1, 128]).into())?
        .into_optimized()?;
    TypedSimplePlan::new(model)
}

fn model_err(e: TractError) -> MediaError {
    MediaError::Model(format!("{e:#}"))
}

/// Silero VAD on a stream of 512-sample chunks at 16 kHz: the network (cadence's own, on `gemm`:
/// `silero_net`) with its recurrent state and its 64-sample context, as the wheel's
/// `OnnxWrapper` keeps them. [`SileroVad::process_chunks`] runs many chunks at once (the
/// network's STFT and convolutions as matrix products over all of them), with the same results
/// as one call per chunk. The network alone: the noise suppression and AGC in front of it
/// ([`SileroConfig::denoise`]) are applied by [`ChunkProbabilities`], [`speech_probabilities`]
/// and [`VadIterator`], which every cadence path uses.
pub struct SileroVad {
    net: Arc<silero_net::SileroNet>,
    /// The LSTM state [h; c], fed to the next call.
    state: Vec<f32>,
    /// The 64 samples before the next chunk (zeros after a reset).
    context: Vec<f32>,
    scratch: silero_net::Scratch,
    probs: Vec<f32>,
}

impl std::fmt::Debug for SileroVad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SileroVad").field("state", &self.state).field("context", &self.context).finish_non_exhaustive()
    }
}

impl SileroVad {
    /// A detector in the reset state (zero state, zero context).
    pub fn new() -> Result<Self> {
        Ok(Self {
            net: silero_net::net()?,
            state: vec![0.0; STATE_LEN],
            context: vec![0.0; CONTEXT_SAMPLES],
            scratch: Default::default(),
            probs: Vec::with_capacity(1),
        })
    }

    /// Back to the state of a new detector (`OnnxWrapper.reset_states`): zero LSTM state and zero
    /// context, for the start of another stream.
    pub fn reset(&mut self) {
        self.state.fill(0.0);
        self.context.fill(0.0);
    }

    /// The speech probability of the next chunk (exactly [`CHUNK_SAMPLES`] samples, mono 16 kHz,
    /// in [-1, 1]). The chunk's last 64 samples become the next call's context and the new
    /// state the next call's state.
    pub fn process_chunk(&mut self, chunk: &[f32]) -> Result<f32> {
        if chunk.len() != CHUNK_SAMPLES {
            return Err(MediaError::InvalidInput(format!(
                "Silero VAD: a chunk is {CHUNK_SAMPLES} samples at 16 kHz, got {}",
                chunk.len()
            )));
        }
        self.probs.clear();
        let mut probs = std::mem::take(&mut self.probs);
        self.process_chunks(chunk, &mut probs)?;
        let p = probs[0];
        self.probs = probs;
        Ok(p)
    }

    /// The probabilities of consecutive chunks (`chunks.len()` a multiple of [`CHUNK_SAMPLES`]),
    /// appended to `probs`: the same values as [`SileroVad::process_chunk`] on each in turn.
    pub fn process_chunks(&mut self, chunks: &[f32], probs: &mut Vec<f32>) -> Result<()> {
        if !chunks.len().is_multiple_of(CHUNK_SAMPLES) {
            return Err(MediaError::InvalidInput(format!(
                "Silero VAD: whole chunks of {CHUNK_SAMPLES} samples at 16 kHz, got {} samples",
                chunks.len()
            )));
        }
        self.net.run(&mut self.state, &mut self.context, chunks, probs, &mut self.scratch);
        Ok(())
    }
}

/// The published graph run by tract, chunk by chunk: the peer that [`SileroVad`] (cadence's own
/// network) is tested against and timed beside. Same interface as [`SileroVad`].
#[derive(Debug)]
pub struct TractSileroVad {
    exec: TypedSimpleState,
    /// The LSTM state, [2, 1, 128], fed to the next call.
    state: Vec<f32>,
    /// The model's input being built: context (64), then the chunk (512).
    input: Vec<f32>,
}

impl TractSileroVad {
    /// A detector in the reset state (zero state, zero context).
    pub fn new() -> Result<Self> {
        let exec = TypedSimpleState::new(&plan()?).map_err(model_err)?;
        Ok(Self { exec, state: vec![0.0; STATE_LEN], input: vec![0.0; CONTEXT_SAMPLES + CHUNK_SAMPLES] })
    }

    /// Back to the state of a new detector (`OnnxWrapper.reset_states`): zero LSTM state and zero
    /// context, for the start of another stream.
    pub fn reset(&mut self) {
        self.state.iter_mut().for_each(|s| *s = 0.0);
        self.input.iter_mut().for_each(|s| *s = 0.0);
    }

    /// The speech probability of the next chunk (exactly [`CHUNK_SAMPLES`] samples, mono 16 kHz,
    /// in [-1, 1]). The chunk's last 64 samples become the next call's context and the returned
    /// state the next call's state.
    pub fn process_chunk(&mut self, chunk: &[f32]) -> Result<f32> {
        if chunk.len() != CHUNK_SAMPLES {
            return Err(MediaError::InvalidInput(format!(
                "Silero VAD: a chunk is {CHUNK_SAMPLES} samples at 16 kHz, got {}",
                chunk.len()
            )));
        }
        // input = [context | chunk]; the context slot already holds the previous chunk's tail.
        self.input[CONTEXT_SAMPLES..].copy_from_slice(chunk);
        let input = Tensor::from_shape(&[1, CONTEXT_SAMPLES + CHUNK_SAMPLES], &self.input).map_err(model_err)?;
        let state = Tensor::from_shape(&[2, 1, 128], &self.state).map_err(model_err)?;
        let out = self.exec.run(tvec![input.into_tvalue(), state.into_tvalue()]).map_err(model_err)?;
        let (prob, next) =
            (out[0].try_as_plain_ram().map_err(model_err)?, out[1].try_as_plain_ram().map_err(model_err)?);
        let (prob, next) = (prob.as_slice::<f32>().map_err(model_err)?, next.as_slice::<f32>().map_err(model_err)?);
        if prob.len() != 1 || next.len() != STATE_LEN {
            return Err(MediaError::Model(format!(
                "unexpected output sizes {} and {} (want 1 and {STATE_LEN})",
                prob.len(),
                next.len()
            )));
        }
        let p = prob[0];
        self.state.copy_from_slice(next);
        // The next context: the last 64 samples of this call's input, i.e. of the chunk.
        self.input.copy_within(CHUNK_SAMPLES.., 0);
        Ok(p)
    }
}

/// Speech probability of every 512-sample chunk of a clip (mono 16 kHz), from a reset detector:
/// `ceil(len / 512)` values, the last chunk zero-padded, as `get_speech_timestamps` computes them;
/// through the front end first if `cfg.denoise` (the only field read here). A non-finite
/// sample is an error.
pub fn speech_probabilities(samples_16k: &[f32], cfg: &SileroConfig) -> Result<Vec<f32>> {
    let mut chunks = ChunkProbabilities::new(cfg)?;
    chunks.push(samples_16k)?;
    chunks.finish()?;
    Ok(chunks.take())
}

/// [`speech_probabilities`] of audio that arrives a piece at a time (a WAV read as it goes, a
/// live stream): pieces of any length, cut into the same 512-sample chunks from the first
/// sample, the last one zero-padded by [`ChunkProbabilities::finish`]; so the same values as for
/// the clip whole. With the front end ([`SileroConfig::denoise`]) the probabilities come
/// [`ChunkProbabilities::latency_chunks`] chunks behind the samples (after `n` samples, those of
/// the first `max(floor(n / 512) - 2, 0)` chunks), and `finish` gives the rest.
pub struct ChunkProbabilities {
    vad: SileroVad,
    /// The front end, when on.
    front: Option<Box<Denoiser>>,
    /// The front end's output (scratch).
    cleaned: Vec<f32>,
    /// Samples not yet a whole chunk.
    pending: Vec<f32>,
    /// Probabilities not yet taken.
    probs: Vec<f32>,
}

impl ChunkProbabilities {
    /// Probabilities with the front end if `cfg.denoise` (the only field read here).
    pub fn new(cfg: &SileroConfig) -> Result<Self> {
        Ok(Self {
            vad: SileroVad::new()?,
            front: cfg.denoise.then(|| Box::new(Denoiser::new())),
            cleaned: Vec::new(),
            pending: Vec::with_capacity(CHUNK_SAMPLES),
            probs: Vec::new(),
        })
    }

    /// Chunks the probabilities lag the samples by: [`denoise::LATENCY_CHUNKS`] with the front
    /// end, 0 without.
    pub fn latency_chunks(&self) -> usize {
        if self.front.is_some() {
            denoise::LATENCY_CHUNKS
        } else {
            0
        }
    }

    /// Runs the network on every chunk these samples complete (with the front end: every chunk
    /// it gives out). A non-finite sample is an error, and then none of `samples_16k` is taken.
    pub fn push(&mut self, samples_16k: &[f32]) -> Result<()> {
        match self.front.as_mut() {
            Some(front) => {
                let mut cleaned = std::mem::take(&mut self.cleaned);
                cleaned.clear();
                let pushed = front.push(samples_16k, &mut cleaned).and_then(|()| self.run(&cleaned));
                self.cleaned = cleaned;
                pushed
            }
            None => {
                if let Some(i) = samples_16k.iter().position(|v| !v.is_finite()) {
                    return Err(MediaError::InvalidInput(format!(
                        "Silero VAD: sample {i} of a piece is not a finite number ({})",
                        samples_16k[i]
                    )));
                }
                self.run(samples_16k)
            }
        }
    }

    /// Runs the network on every chunk these (front-end) samples complete.
    fn run(&mut self, mut samples_16k: &[f32]) -> Result<()> {
        if !self.pending.is_empty() {
            let n = (CHUNK_SAMPLES - self.pending.len()).min(samples_16k.len());
            self.pending.extend_from_slice(&samples_16k[..n]);
            samples_16k = &samples_16k[n..];
            if self.pending.len() < CHUNK_SAMPLES {
                return Ok(());
            }
            self.probs.push(self.vad.process_chunk(&self.pending)?);
            self.pending.clear();
        }
        let whole = samples_16k.len() - samples_16k.len() % CHUNK_SAMPLES;
        self.vad.process_chunks(&samples_16k[..whole], &mut self.probs)?;
        self.pending.extend_from_slice(&samples_16k[whole..]);
        Ok(())
    }

    /// The end of the audio: the front end's last chunks are run, and a last, partial chunk
    /// is zero-padded and run. The front end is then back at the start of a stream (the
    /// network's state is not: a new stream needs a new `ChunkProbabilities`).
    pub fn finish(&mut self) -> Result<()> {
        if let Some(front) = self.front.as_mut() {
            let mut cleaned = std::mem::take(&mut self.cleaned);
            cleaned.clear();
            front.finish(&mut cleaned);
            let run = self.run(&cleaned);
            self.cleaned = cleaned;
            run?;
        }
        if !self.pending.is_empty() {
            self.pending.resize(CHUNK_SAMPLES, 0.0);
            self.probs.push(self.vad.process_chunk(&self.pending)?);
            self.pending.clear();
        }
        Ok(())
    }

    /// The probabilities computed since the last call.
    pub fn take(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.probs)
    }
}

/// Thresholds of Silero's post-processing; the defaults are those of the wheel's
/// `get_speech_timestamps` (and, for the fields it has, `VADIterator`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SileroConfig {
    /// A chunk whose probability is at or above this starts (or continues) speech. Default 0.5.
    pub threshold: f64,
    /// Inside speech, a chunk below this counts as silence (hysteresis). `None` (the default):
    /// `max(threshold - 0.15, 0.01)`. ([`VadIterator`] always uses `threshold - 0.15`, as the
    /// wheel's `VADIterator` does.)
    pub neg_threshold: Option<f64>,
    /// Speech segments this short or shorter are dropped. Default 250 ms.
    pub min_speech_duration_ms: f64,
    /// Longer segments are cut (at the longest silence of at least
    /// `min_silence_at_max_speech_ms` inside them, or else where they reach the limit).
    /// Default infinity (never cut).
    pub max_speech_duration_s: f64,
    /// Silence must last this long (from its first chunk below `neg_threshold`) to end a segment.
    /// Default 100 ms.
    pub min_silence_duration_ms: f64,
    /// Each segment is widened by this much on each side; a gap shorter than twice this is split
    /// between its two segments instead. Default 30 ms.
    pub speech_pad_ms: f64,
    /// With a finite `max_speech_duration_s`: the shortest silence that counts as a place to cut.
    /// Default 98 ms.
    pub min_silence_at_max_speech_ms: f64,
    /// With a finite `max_speech_duration_s`: cut at the longest such silence (`true`, default) or
    /// at the last one (`false`, the wheel's older behaviour).
    pub use_max_poss_sil_at_max_speech: bool,
    /// cadence's front end before the network ([`super::denoise`]: Wiener noise suppression and
    /// AGC; not in the wheel): `true` (the default) or `false` (the samples as they are, the
    /// wheel's behaviour). Read where probabilities are made ([`speech_probabilities`],
    /// [`ChunkProbabilities::new`], [`VadIterator::new`]), not by [`speech_segments`].
    pub denoise: bool,
}

impl Default for SileroConfig {
    fn default() -> Self {
        SileroConfig {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_duration_ms: 250.0,
            max_speech_duration_s: f64::INFINITY,
            min_silence_duration_ms: 100.0,
            speech_pad_ms: 30.0,
            min_silence_at_max_speech_ms: 98.0,
            use_max_poss_sil_at_max_speech: true,
            denoise: true,
        }
    }
}

impl SileroConfig {
    /// The silence threshold in effect: `neg_threshold`, or `max(threshold - 0.15, 0.01)`.
    pub fn neg_threshold(&self) -> f64 {
        self.neg_threshold.unwrap_or((self.threshold - 0.15).max(0.01))
    }

    /// Checks the values are usable (finite where they must be, not negative).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: f64| MediaError::InvalidInput(format!("Silero VAD: {what} must be >= 0, got {v}"));
        for (what, v) in [
            ("threshold", self.threshold),
            ("min_speech_duration_ms", self.min_speech_duration_ms),
            ("min_silence_duration_ms", self.min_silence_duration_ms),
            ("speech_pad_ms", self.speech_pad_ms),
            ("min_silence_at_max_speech_ms", self.min_silence_at_max_speech_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(what, v));
            }
        }
        if self.max_speech_duration_s.is_nan() || self.max_speech_duration_s <= 0.0 {
            return Err(MediaError::InvalidInput(format!(
                "Silero VAD: max_speech_duration_s must be > 0, got {}",
                self.max_speech_duration_s
            )));
        }
        if let Some(n) = self.neg_threshold {
            if !n.is_finite() {
                return Err(MediaError::InvalidInput(format!("Silero VAD: neg_threshold must be finite, got {n}")));
            }
        }
        Ok(())
    }
}

/// A speech segment in samples at 16 kHz: `start..end` (end exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeechSegment {
    pub start: usize,
    pub end: usize,
}

impl SpeechSegment {
    pub fn start_s(&self) -> f64 {
        self.start as f64 / SAMPLE_RATE as f64
    }
    pub fn end_s(&self) -> f64 {
        self.end as f64 / SAMPLE_RATE as f64
    }
}

/// Silero's `get_speech_timestamps_from_probs` at 16 kHz: speech segments (samples) from the
/// chunk probabilities of a clip of `audio_len` samples.
///
/// The numbers follow the Python code: the durations become float sample counts
/// (`16000 * ms / 1000`), positions are integer multiples of 512, comparisons of an integer
/// with a float count are exact (as Python's are), `int()` truncates and `//` floors.
pub fn speech_segments(probs: &[f32], audio_len: usize, cfg: &SileroConfig) -> Vec<SpeechSegment> {
    let sr = SAMPLE_RATE as f64;
    let window = CHUNK_SAMPLES as i64;
    let audio_len = audio_len as i64;
    let min_speech_samples = sr * cfg.min_speech_duration_ms / 1000.0;
    let speech_pad_samples = sr * cfg.speech_pad_ms / 1000.0;
    let max_speech_samples = sr * cfg.max_speech_duration_s - window as f64 - 2.0 * speech_pad_samples;
    let min_silence_samples = sr * cfg.min_silence_duration_ms / 1000.0;
    let min_silence_samples_at_max_speech = sr * cfg.min_silence_at_max_speech_ms / 1000.0;
    let threshold = cfg.threshold;
    let neg_threshold = cfg.neg_threshold();

    let mut triggered = false;
    // (start, end) pairs; `current` is the Python `current_speech` dict's `start` (None = {}).
    let mut speeches: Vec<(i64, i64)> = Vec::new();
    let mut current: Option<i64> = None;
    // 0 means "unset", as in the Python (`if temp_end:`).
    let mut temp_end: i64 = 0;
    let mut prev_end: i64 = 0;
    let mut next_start: i64 = 0;
    let mut possible_ends: Vec<(i64, i64)> = Vec::new();

    for (i, &p) in probs.iter().enumerate() {
        let p = p as f64;
        let cur_sample = window * i as i64;

        // Speech returns after a tentative end: remember that silence if long enough.
        if p >= threshold && temp_end != 0 {
            let sil_dur = cur_sample - temp_end;
            if sil_dur as f64 > min_silence_samples_at_max_speech {
                possible_ends.push((temp_end, sil_dur));
            }
            temp_end = 0;
            if next_start < prev_end {
                next_start = cur_sample;
            }
        }

        // Start of speech.
        if p >= threshold && !triggered {
            triggered = true;
            current = Some(cur_sample);
            continue;
        }

        // Maximum speech length reached: decide where to cut.
        if let (true, Some(start)) = (triggered, current) {
            if (cur_sample - start) as f64 > max_speech_samples {
                if cfg.use_max_poss_sil_at_max_speech && !possible_ends.is_empty() {
                    // The longest silence; the first of equals, as Python's max() returns.
                    let mut best = possible_ends[0];
                    for &pe in &possible_ends[1..] {
                        if pe.1 > best.1 {
                            best = pe;
                        }
                    }
                    let (end, dur) = best;
                    speeches.push((start, end));
                    current = None;
                    next_start = end + dur;
                    if next_start < end + cur_sample {
                        current = Some(next_start);
                    } else {
                        triggered = false;
                    }
                    prev_end = 0;
                    next_start = 0;
                    temp_end = 0;
                    possible_ends.clear();
                } else if prev_end != 0 {
                    speeches.push((start, prev_end));
                    current = None;
                    if next_start < prev_end {
                        triggered = false;
                    } else {
                        current = Some(next_start);
                    }
                    prev_end = 0;
                    next_start = 0;
                    temp_end = 0;
                    possible_ends.clear();
                } else {
                    speeches.push((start, cur_sample));
                    current = None;
                    prev_end = 0;
                    next_start = 0;
                    temp_end = 0;
                    triggered = false;
                    possible_ends.clear();
                    continue;
                }
            }
        }

        // Silence while in speech.
        if p < neg_threshold && triggered {
            if temp_end == 0 {
                temp_end = cur_sample;
            }
            let sil_dur_now = cur_sample - temp_end;
            if !cfg.use_max_poss_sil_at_max_speech && sil_dur_now as f64 > min_silence_samples_at_max_speech {
                prev_end = temp_end;
            }
            if (sil_dur_now as f64) < min_silence_samples {
                continue;
            }
            if let Some(start) = current {
                if (temp_end - start) as f64 > min_speech_samples {
                    speeches.push((start, temp_end));
                }
            }
            current = None;
            prev_end = 0;
            next_start = 0;
            temp_end = 0;
            triggered = false;
            possible_ends.clear();
            continue;
        }
    }

    if let Some(start) = current {
        if (audio_len - start) as f64 > min_speech_samples {
            speeches.push((start, audio_len));
        }
    }

    // Padding: `int(max(0, start - pad))`, `int(min(len, end + pad))`; a gap shorter than two
    // pads is split in half (`silence // 2`) between its two segments.
    let n = speeches.len();
    for i in 0..n {
        if i == 0 {
            speeches[0].0 = (speeches[0].0 as f64 - speech_pad_samples).max(0.0) as i64;
        }
        if i + 1 != n {
            let silence = speeches[i + 1].0 - speeches[i].1;
            if (silence as f64) < 2.0 * speech_pad_samples {
                let half = silence.div_euclid(2);
                speeches[i].1 += half;
                speeches[i + 1].0 = (speeches[i + 1].0 - half).max(0);
            } else {
                speeches[i].1 = (speeches[i].1 as f64 + speech_pad_samples).min(audio_len as f64) as i64;
                speeches[i + 1].0 = (speeches[i + 1].0 as f64 - speech_pad_samples).max(0.0) as i64;
            }
        } else {
            speeches[i].1 = (speeches[i].1 as f64 + speech_pad_samples).min(audio_len as f64) as i64;
        }
    }
    speeches.into_iter().map(|(s, e)| SpeechSegment { start: s.max(0) as usize, end: e.max(0) as usize }).collect()
}

/// Silero's `get_speech_timestamps` at 16 kHz: the clip's chunk probabilities
/// ([`speech_probabilities`]) post-processed by [`speech_segments`].
pub fn speech_timestamps(samples_16k: &[f32], cfg: &SileroConfig) -> Result<Vec<SpeechSegment>> {
    cfg.validate()?;
    let probs = speech_probabilities(samples_16k, cfg)?;
    Ok(speech_segments(&probs, samples_16k.len(), cfg))
}

/// Per-video-frame decisions from speech segments: frame `f` spans `[f / fps, (f + 1) / fps)`
/// and is speech when that span overlaps a segment `[start, end)` (a segment ending exactly
/// where a frame begins does not reach it). Frames past the audio are silence, since segments
/// end within it.
pub fn frames_from_segments(segments: &[SpeechSegment], fps: f64, n_frames: usize) -> Vec<bool> {
    let mut frames = vec![false; n_frames];
    if fps.is_nan() || fps <= 0.0 {
        return frames;
    }
    let rate = SAMPLE_RATE as f64;
    for seg in segments.iter().filter(|s| s.end > s.start) {
        // First frame whose end is past the start; last frame whose start is before the end.
        let first = (seg.start as f64 * fps / rate).floor().max(0.0) as usize;
        let last_excl = (seg.end as f64 * fps / rate).ceil().max(0.0) as usize;
        for slot in frames.iter_mut().take(last_excl).skip(first) {
            *slot = true;
        }
    }
    frames
}

/// Voice activity per video frame with Silero and the default thresholds: the drop-in twin of
/// the energy detector's [`super::voice_activity`] (same arguments, same result shape).
///
/// # Panics
/// If the embedded model cannot be loaded by tract, which the tests rule out for the committed
/// file (use [`try_voice_activity_with`] to get that as an error instead).
pub fn voice_activity(samples_16k: &[f32], fps: f64, n_frames: usize) -> Vec<bool> {
    try_voice_activity_with(samples_16k, fps, n_frames, &SileroConfig::default())
        .unwrap_or_else(|e| panic!("Silero VAD with its embedded model: {e}"))
}

/// [`voice_activity`] with explicit thresholds, errors returned.
pub fn try_voice_activity_with(
    samples_16k: &[f32],
    fps: f64,
    n_frames: usize,
    cfg: &SileroConfig,
) -> Result<Vec<bool>> {
    Ok(frames_from_segments(&speech_timestamps(samples_16k, cfg)?, fps, n_frames))
}

/// An event of the streaming post-processor, in samples at 16 kHz since the stream's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeechEvent {
    /// Speech began here (padding included).
    Start(usize),
    /// Speech ended here (padding included).
    End(usize),
}

/// Silero's `VADIterator` for a live feed: chunks in, speech start and end events out, as soon
/// as they are known (a start on the first chunk at or above the threshold, an end once the
/// probability has stayed below `threshold - 0.15` for `min_silence_duration_ms`). Uses
/// `threshold`, `min_silence_duration_ms` and `speech_pad_ms` of the [`SileroConfig`] (the
/// wheel's iterator has no minimum speech duration nor configurable silence threshold).
///
/// With the front end ([`SileroConfig::denoise`], the default) each chunk's decision comes
/// [`super::denoise::LATENCY_CHUNKS`] chunks later (the positions in the events are unchanged),
/// and [`VadIterator::finish`] decides the last chunks at the end of the stream.
#[derive(Debug)]
pub struct VadIterator {
    vad: SileroVad,
    /// The front end, when on.
    front: Option<Box<Denoiser>>,
    /// The front end's output (scratch).
    cleaned: Vec<f32>,
    threshold: f64,
    min_silence_samples: f64,
    speech_pad_samples: f64,
    triggered: bool,
    temp_end: i64,
    current_sample: i64,
    last_probability: f32,
    /// Samples of a [`VadIterator::push`] not yet making up a whole chunk.
    pending: Vec<f32>,
}

impl VadIterator {
    pub fn new(cfg: &SileroConfig) -> Result<Self> {
        cfg.validate()?;
        let sr = SAMPLE_RATE as f64;
        Ok(Self {
            vad: SileroVad::new()?,
            front: cfg.denoise.then(|| Box::new(Denoiser::new())),
            cleaned: Vec::new(),
            threshold: cfg.threshold,
            min_silence_samples: sr * cfg.min_silence_duration_ms / 1000.0,
            speech_pad_samples: sr * cfg.speech_pad_ms / 1000.0,
            triggered: false,
            temp_end: 0,
            current_sample: 0,
            last_probability: 0.0,
            pending: Vec::new(),
        })
    }

    /// The start of another stream (`reset_states`).
    pub fn reset(&mut self) {
        self.vad.reset();
        if let Some(front) = self.front.as_mut() {
            front.reset();
        }
        self.triggered = false;
        self.temp_end = 0;
        self.current_sample = 0;
        self.pending.clear();
    }

    /// Whether the stream is inside speech now.
    pub fn in_speech(&self) -> bool {
        self.triggered
    }

    /// The speech probability of the last chunk.
    pub fn last_probability(&self) -> f32 {
        self.last_probability
    }

    /// One chunk of [`CHUNK_SAMPLES`] samples (`VADIterator.__call__`). With the front end, the
    /// chunk decided is the one [`super::denoise::LATENCY_CHUNKS`] before (none for the first
    /// ones).
    pub fn push_chunk(&mut self, chunk: &[f32]) -> Result<Option<SpeechEvent>> {
        if chunk.len() != CHUNK_SAMPLES {
            return Err(MediaError::InvalidInput(format!(
                "Silero VAD: a chunk is {CHUNK_SAMPLES} samples at 16 kHz, got {}",
                chunk.len()
            )));
        }
        let Some(front) = self.front.as_mut() else {
            return self.step(chunk);
        };
        let mut cleaned = std::mem::take(&mut self.cleaned);
        cleaned.clear();
        let mut event = front.push(chunk, &mut cleaned).map(|()| None);
        // Whole chunks in, so at most one chunk out.
        debug_assert!(cleaned.len() <= CHUNK_SAMPLES);
        if let (Ok(_), Some(c)) = (&event, cleaned.chunks_exact(CHUNK_SAMPLES).next()) {
            event = self.step(c);
        }
        self.cleaned = cleaned;
        event
    }

    /// The end of the stream: with the front end, the chunks it still holds are decided (their
    /// events returned); without, nothing (a partial chunk is never run, as in the wheel).
    /// [`VadIterator::reset`] before another stream.
    pub fn finish(&mut self) -> Result<Vec<SpeechEvent>> {
        let Some(front) = self.front.as_mut() else {
            return Ok(Vec::new());
        };
        let mut cleaned = std::mem::take(&mut self.cleaned);
        cleaned.clear();
        front.finish(&mut cleaned);
        let mut events = Vec::new();
        let mut result = Ok(());
        for c in cleaned.chunks_exact(CHUNK_SAMPLES) {
            match self.step(c) {
                Ok(Some(ev)) => events.push(ev),
                Ok(None) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.cleaned = cleaned;
        result.map(|()| events)
    }

    /// One chunk (after the front end) through the network and the iterator's rules.
    fn step(&mut self, chunk: &[f32]) -> Result<Option<SpeechEvent>> {
        let window = chunk.len() as i64;
        let p = self.vad.process_chunk(chunk)?;
        self.current_sample += window;
        self.last_probability = p;
        let p = p as f64;
        if p >= self.threshold && self.temp_end != 0 {
            self.temp_end = 0;
        }
        if p >= self.threshold && !self.triggered {
            self.triggered = true;
            let start = (self.current_sample as f64 - self.speech_pad_samples - window as f64).max(0.0);
            return Ok(Some(SpeechEvent::Start(start as usize)));
        }
        if p < self.threshold - 0.15 && self.triggered {
            if self.temp_end == 0 {
                self.temp_end = self.current_sample;
            }
            if ((self.current_sample - self.temp_end) as f64) < self.min_silence_samples {
                return Ok(None);
            }
            let end = self.temp_end as f64 + self.speech_pad_samples - window as f64;
            self.temp_end = 0;
            self.triggered = false;
            return Ok(Some(SpeechEvent::End(end.max(0.0) as usize)));
        }
        Ok(None)
    }

    /// Samples in pieces of any length: every whole chunk they complete is run
    /// ([`VadIterator::push_chunk`]), the rest is kept for the next call.
    pub fn push(&mut self, samples_16k: &[f32]) -> Result<Vec<SpeechEvent>> {
        let mut events = Vec::new();
        self.pending.extend_from_slice(samples_16k);
        let whole = self.pending.len() / CHUNK_SAMPLES * CHUNK_SAMPLES;
        let pending = std::mem::take(&mut self.pending);
        for chunk in pending[..whole].chunks_exact(CHUNK_SAMPLES) {
            if let Some(ev) = self.push_chunk(chunk)? {
                events.push(ev);
            }
        }
        self.pending = pending[whole..].to_vec();
        Ok(events)
    }
}
