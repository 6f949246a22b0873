//! Audio features as MuseTalk builds them: whisper-tiny encoder hidden states at 50 Hz, windowed
//! per video frame.
//!
//! Front end: 80-bin log-mel, 400-point FFT, hop 160, at 16 kHz, made per 30 s segment as
//! MuseTalk v1.5 makes it ([`segment_log_mel`]). The Slaney mel filter bank (librosa
//! `mel(sr=16000, n_fft=400, n_mels=80)`, whisper's `mel_filters.npz`) is computed in code
//! ([`mel_filters`]) instead of being downloaded.
//!
//! Encoder: hand-written from candle-nn layers because candle-transformers' `AudioEncoder` only
//! returns the final (post-LayerNorm) output while MuseTalk needs every hidden state: the embedding
//! output (conv1-GELU-conv2-GELU + sinusoidal positions) and the output of each of the 4 blocks,
//! before `ln_post` (MuseTalk's modified whisper `AudioEncoder.forward(include_embeddings=True)`).
//! That is 5 x 384 per 20 ms step. Exact GELU (erf), as PyTorch's `nn.GELU()`.
//!
//! Windows (MuseTalk `Audio2Feature.get_sliced_feature`, audio_feat_length [2, 2]): video frame i
//! at `fps` takes steps `c-4 .. c+6` with `c = floor(i * 50 / fps)`, indices clamped to the valid
//! range, giving 10 steps x 5 layers x 384 = (50, 384) (row = step * 5 + layer).
//!
//! Long audio: the encoder sees fixed, non-overlapping 30 s segments, each with its own log-mel
//! (MuseTalk v1.5's `AudioProcessor.get_audio_feature`), and the first floor(frames / 2)
//! positions of each are kept.

pub mod cpu;

use crate::weights::{self, default_init, fan_in, Init, ParamTable};
use crate::whisper::cpu::WhisperEncoderCpu;
use crate::{
    AudioEncoder, Batch, Device, Engine, EngineError, EngineInfo, ModelKind, Profile, Result, Runtime, WeightsSource,
};
use candle_core::{Module, Tensor};
use candle_nn::{Conv1d, Conv1dConfig, LayerNorm, Linear, VarBuilder};
use std::collections::HashMap;

pub const SAMPLE_RATE: usize = 16000;
pub const N_FFT: usize = 400;
pub const HOP: usize = 160;
pub const N_MELS: usize = 80;
/// Mel frames per encoder window (30 s).
pub const WINDOW_FRAMES: usize = 3000;
/// whisper-tiny's published sizes ([`Profile::Full`]; real weights have them).
pub const D_MODEL: usize = 384;
pub const N_HEADS: usize = 6;
pub const N_LAYERS: usize = 4;

/// The encoder's width at a profile: whisper-tiny's 384 at `Full`; 32 at `Cpu`, where the
/// 384-wide encoder would cost 10x more of a frame's neural time than it does at the full
/// profile (the reduced profile is a scale model: docs/profiles.md). At these widths the log-mel
/// front end and the 1500 x 1500 attention, which do not narrow, are most of the cost: on an
/// AVX-512 Xeon widths 8, 12 and 16 cost the same, 32 the full profile's share. The UNet's
/// cross-attention takes this width ([`crate::unet::audio_dim`]).
pub const fn d_model(profile: Profile) -> usize {
    match profile {
        Profile::Full => D_MODEL,
        Profile::Cpu => 32,
    }
}

/// Attention heads at a profile (heads of 64 at `Full`; one head at `Cpu`).
pub const fn n_heads(profile: Profile) -> usize {
    match profile {
        Profile::Full => N_HEADS,
        Profile::Cpu => 1,
    }
}
/// Hidden states per step (embedding output + each layer).
pub const N_HIDDEN: usize = N_LAYERS + 1;
/// 50 Hz steps per window on each side of the centre (MuseTalk `audio_feat_length [2,2]`).
pub const STEPS_LEFT: usize = 4;
pub const STEPS_RIGHT: usize = 6;

fn hz_to_mel(f: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

/// Slaney-style mel filter bank, (n_mels, 1 + n_fft/2) row-major, as librosa
/// `filters.mel(sr, n_fft, n_mels)` (htk=False, norm="slaney") computes it.
pub fn mel_filters(sr: usize, n_fft: usize, n_mels: usize) -> Vec<f32> {
    let n_freq = 1 + n_fft / 2;
    let fftfreqs: Vec<f64> = (0..n_freq).map(|k| k as f64 * sr as f64 / n_fft as f64).collect();
    let (mmin, mmax) = (hz_to_mel(0.0), hz_to_mel(sr as f64 / 2.0));
    let mel_f: Vec<f64> =
        (0..n_mels + 2).map(|i| mel_to_hz(mmin + (mmax - mmin) * i as f64 / (n_mels + 1) as f64)).collect();
    let mut w = vec![0f32; n_mels * n_freq];
    for i in 0..n_mels {
        let enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
        for (k, &f) in fftfreqs.iter().enumerate() {
            let lower = (f - mel_f[i]) / (mel_f[i + 1] - mel_f[i]);
            let upper = (mel_f[i + 2] - f) / (mel_f[i + 2] - mel_f[i + 1]);
            w[i * n_freq + k] = (lower.min(upper).max(0.0) * enorm) as f32;
        }
    }
    w
}

/// Samples in one whisper segment: 30 s at 16 kHz, [`WINDOW_FRAMES`] mel frames.
pub const SEGMENT_SAMPLES: usize = WINDOW_FRAMES * HOP;

/// The log-mel of one 30 s segment as MuseTalk makes it: (80, 3000) row-major, frame t centred
/// on sample 160 t of the segment.
///
/// MuseTalk v1.5 (`musetalk/utils/audio_processor.py`, `AudioProcessor.get_audio_feature`)
/// splits the 16 kHz signal into 30 s segments and runs Hugging Face's `WhisperFeatureExtractor`
/// on each one separately; its `_np_extract_fbank_features` (openai-whisper's
/// `log_mel_spectrogram` in numpy) does, per segment:
/// 1. zero-pad the segment to 480,000 samples;
/// 2. reflect-pad 200 samples on both sides (`center=True`; the edge sample is not repeated), so
///    a full segment's last frame reflects its own end, never the next segment's samples;
/// 3. 400-point periodic Hann window, hop 160, power spectrum, Slaney mel filters
///    ([`mel_filters`]), `log10(max(power, 1e-10))`, keeping 3000 of the 3001 frames;
/// 4. clamp to (maximum of these 3000 frames) - 8, then `/ 4 + 1`.
///
/// So the clamp is per segment, and a segment depends on nothing outside it: a render makes
/// each one when it reaches it. (realfft does the FFT; candle's `pcm_to_mel` cannot be used
/// because it pads the signal by a further 15 s and takes the clamp's maximum over those
/// frames too.)
pub fn segment_log_mel(segment: &[f32]) -> Result<Vec<f32>> {
    if segment.len() > SEGMENT_SAMPLES {
        return Err(EngineError::BadInput(format!(
            "a whisper segment holds at most {SEGMENT_SAMPLES} samples, got {}",
            segment.len()
        )));
    }
    let n = SEGMENT_SAMPLES as isize;
    // Sample i of the zero-padded segment, reflected at both of its ends.
    let at = |i: isize| -> f32 {
        let i = if i < 0 {
            -i
        } else if i >= n {
            2 * (n - 1) - i
        } else {
            i
        };
        segment.get(i as usize).copied().unwrap_or(0.0)
    };
    let window: Vec<f32> =
        (0..N_FFT).map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos()) as f32).collect();
    let filters = mel_filters(SAMPLE_RATE, N_FFT, N_MELS);
    let n_freq = N_FFT / 2 + 1;
    // Each filter's non-zero run (a triangle): (first bin, weights).
    let bands: Vec<(usize, &[f32])> = (0..N_MELS)
        .map(|m| {
            let row = &filters[m * n_freq..(m + 1) * n_freq];
            let lo = row.iter().position(|&w| w != 0.0).unwrap_or(0);
            let hi = row.iter().rposition(|&w| w != 0.0).map_or(lo, |h| h + 1);
            (lo, &row[lo..hi])
        })
        .collect();
    let fft = realfft::RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
    // Frames in parallel blocks, each with its own FFT buffers; a block's rows are (frame, mel)
    // and are transposed into the (mel, frame) result below.
    const BLOCK: usize = 100;
    let mut by_frame = vec![0f32; WINDOW_FRAMES * N_MELS];
    use rayon::prelude::*;
    by_frame.par_chunks_mut(BLOCK * N_MELS).enumerate().try_for_each(|(b, rows)| -> Result<()> {
        let mut input = fft.make_input_vec();
        let mut spectrum = fft.make_output_vec();
        let mut power = vec![0f32; n_freq];
        for (i, row) in rows.chunks_mut(N_MELS).enumerate() {
            let t = b * BLOCK + i;
            let start = (t * HOP) as isize - (N_FFT / 2) as isize;
            let end = start + N_FFT as isize;
            if start >= segment.len() as isize && end <= n {
                // Only the zero padding: a zero spectrum, so every band is log10(1e-10) (what
                // the FFT of zeros gives, exactly), without the FFT.
                row.fill(-10.0);
                continue;
            }
            if start >= 0 && end <= segment.len() as isize {
                let samples = &segment[start as usize..end as usize];
                input.iter_mut().zip(samples).zip(&window).for_each(|((x, s), w)| *x = s * w);
            } else {
                for (i, x) in input.iter_mut().enumerate() {
                    *x = at(start + i as isize) * window[i];
                }
            }
            fft.process(&mut input, &mut spectrum).map_err(|e| EngineError::BadInput(format!("log-mel FFT: {e}")))?;
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.re * c.re + c.im * c.im;
            }
            for (m, (lo, w)) in bands.iter().enumerate() {
                let e: f32 = w.iter().zip(&power[*lo..]).map(|(w, p)| w * p).sum();
                row[m] = e.max(1e-10).log10();
            }
        }
        Ok(())
    })?;
    let mut mel = vec![0f32; N_MELS * WINDOW_FRAMES];
    for (t, row) in by_frame.chunks(N_MELS).enumerate() {
        for (m, &v) in row.iter().enumerate() {
            mel[m * WINDOW_FRAMES + t] = v;
        }
    }
    let floor = mel.iter().copied().fold(f32::NEG_INFINITY, f32::max) - 8.0;
    mel.iter_mut().for_each(|v| *v = (v.max(floor) + 4.0) / 4.0);
    Ok(mel)
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln1: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    ln2: LayerNorm,
}

pub(crate) struct Encoder {
    conv1: Conv1d,
    conv2: Conv1d,
    layers: Vec<Layer>,
    d: usize,
    heads: usize,
    /// The same network on cadence's CPU kernels (set on the CPU; [`crate::whisper::cpu`]).
    fast: Option<WhisperEncoderCpu>,
}

pub(crate) fn build(vb: VarBuilder, profile: Profile) -> candle_core::Result<Encoder> {
    let d = d_model(profile);
    let c1 = Conv1dConfig { padding: 1, stride: 1, ..Default::default() };
    let c2 = Conv1dConfig { padding: 1, stride: 2, ..Default::default() };
    let conv1 = candle_nn::conv1d(N_MELS, d, 3, c1, vb.pp("conv1"))?;
    let conv2 = candle_nn::conv1d(d, d, 3, c2, vb.pp("conv2"))?;
    let ln = |vb: VarBuilder| candle_nn::layer_norm(d, 1e-5, vb);
    let layers = (0..N_LAYERS)
        .map(|i| {
            let vb = vb.pp(format!("layers.{i}"));
            let a = vb.pp("self_attn");
            Ok(Layer {
                q: candle_nn::linear(d, d, a.pp("q_proj"))?,
                k: candle_nn::linear_no_bias(d, d, a.pp("k_proj"))?,
                v: candle_nn::linear(d, d, a.pp("v_proj"))?,
                o: candle_nn::linear(d, d, a.pp("out_proj"))?,
                ln1: ln(vb.pp("self_attn_layer_norm"))?,
                fc1: candle_nn::linear(d, 4 * d, vb.pp("fc1"))?,
                fc2: candle_nn::linear(4 * d, d, vb.pp("fc2"))?,
                ln2: ln(vb.pp("final_layer_norm"))?,
            })
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Encoder { conv1, conv2, layers, d, heads: n_heads(profile), fast: None })
}

/// Whisper's sinusoidal position table (length, channels): [sin | cos] halves.
pub(crate) fn sinusoids(length: usize, channels: usize) -> Vec<f32> {
    let inc = (10000f64).ln() / (channels / 2 - 1) as f64;
    let mut out = vec![0f32; length * channels];
    for t in 0..length {
        for i in 0..channels / 2 {
            let a = t as f64 * (-(i as f64) * inc).exp();
            out[t * channels + i] = a.sin() as f32;
            out[t * channels + channels / 2 + i] = a.cos() as f32;
        }
    }
    out
}

impl Encoder {
    /// mel (B, 80, 3000) -> hidden states (B, T=1500, 5, d), on the CPU through the fast path.
    fn hidden_states(&self, mel: &Tensor) -> candle_core::Result<Tensor> {
        let Some(fast) = self.fast.as_ref().filter(|_| mel.device().is_cpu()) else {
            return self.hidden_states_candle(mel);
        };
        let (b, _, frames) = mel.dims3()?;
        let images = (0..b)
            .map(|i| {
                let hs = fast.hidden_states(&mel.get(i)?.flatten_all()?.to_vec1::<f32>()?, frames);
                let t = hs.len() / (N_HIDDEN * self.d);
                Tensor::from_vec(hs, (t, N_HIDDEN, self.d), mel.device())
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::stack(&images, 0)
    }

    /// [`Self::hidden_states`] through candle's layers (the reference of the fast path).
    pub(crate) fn hidden_states_candle(&self, mel: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.conv1.forward(mel)?.gelu_erf()?;
        let x = self.conv2.forward(&x)?.gelu_erf()?;
        let mut x = x.transpose(1, 2)?.contiguous()?; // (B, T, d)
        let (b, t, d) = x.dims3()?;
        let pos = Tensor::from_vec(sinusoids(t, d), (1, t, d), x.device())?;
        x = x.broadcast_add(&pos)?;
        let mut hs = vec![x.clone()];
        let hd = self.d / self.heads;
        let scale = 1.0 / (hd as f64).sqrt();
        for l in &self.layers {
            let h = l.ln1.forward(&x)?;
            let split = |y: Tensor| y.reshape((b, t, self.heads, hd))?.transpose(1, 2)?.contiguous();
            let q = split((l.q.forward(&h)? * scale)?)?;
            let k = split(l.k.forward(&h)?)?;
            let v = split(l.v.forward(&h)?)?;
            let p = candle_nn::ops::softmax_last_dim(&q.matmul(&k.t()?)?)?;
            let a = p.matmul(&v)?.transpose(1, 2)?.reshape((b, t, self.d))?;
            x = (x + l.o.forward(&a)?)?;
            let m = l.fc2.forward(&l.fc1.forward(&l.ln2.forward(&x)?)?.gelu_erf()?)?;
            x = (x + m)?;
            hs.push(x.clone());
        }
        Tensor::stack(&hs, 2)
    }
}

/// Expected table (canonical names: Hugging Face encoder keys without the `model.encoder.`
/// prefix; the positional table is computed, `layer_norm` (ln_post) is not used).
pub fn param_table(profile: Profile) -> Result<ParamTable> {
    weights::record_table(|vb| build(vb, profile))
}

fn init_rule(name: &str, shape: &[usize]) -> Init {
    if name.ends_with("fc2.weight") || name.ends_with("out_proj.weight") {
        Init::Normal(0.2 * (1.0 / fan_in(shape) as f32).sqrt())
    } else {
        default_init(name, shape)
    }
}

/// Accepts Hugging Face keys (`model.encoder.*`, `encoder.*`), openai-whisper keys
/// (`encoder.blocks.N.attn.query` ...), or bare canonical names; drops decoder keys.
pub(crate) fn normalize(key: &str) -> Option<String> {
    let k = if let Some(k) = key.strip_prefix("model.encoder.") {
        k
    } else if let Some(k) = key.strip_prefix("encoder.") {
        k
    } else if key.starts_with("model.") || key.starts_with("decoder.") || key.starts_with("proj_out") {
        return None;
    } else {
        key
    };
    let mut k = k.to_string();
    if k.starts_with("blocks.") {
        for (a, b) in [
            ("blocks.", "layers."),
            (".attn.query.", ".self_attn.q_proj."),
            (".attn.key.", ".self_attn.k_proj."),
            (".attn.value.", ".self_attn.v_proj."),
            (".attn.out.", ".self_attn.out_proj."),
            (".attn_ln.", ".self_attn_layer_norm."),
            (".mlp.0.", ".fc1."),
            (".mlp.2.", ".fc2."),
            (".mlp_ln.", ".final_layer_norm."),
        ] {
            k = k.replacen(a, b, 1);
        }
    }
    Some(k)
}

pub(crate) fn synthetic_weights(profile: Profile, seed: u64) -> Result<HashMap<String, Tensor>> {
    let table = param_table(profile)?;
    weights::synthetic_tensors(&table, seed, &init_rule, &Device::Cpu)
}

/// Index list of MuseTalk's window for video frame `i` over `n_steps` 50 Hz steps.
pub fn window_indices(i: usize, fps: f32, n_steps: usize) -> Vec<usize> {
    let c = (i as f64 * 50.0 / fps as f64).floor() as i64;
    (c - STEPS_LEFT as i64..c + STEPS_RIGHT as i64)
        .map(|j| j.clamp(0, n_steps.saturating_sub(1) as i64) as usize)
        .collect()
}

/// whisper-tiny encoder + MuseTalk windowing.
pub struct WhisperAudio {
    info: EngineInfo,
    enc: Encoder,
    device: Device,
}

impl WhisperAudio {
    pub fn new(profile: Profile, weights: &WeightsSource, device: &Device) -> Result<WhisperAudio> {
        let table = param_table(profile)?;
        let tensors = crate::obtain_tensors(ModelKind::WhisperTiny, profile, &table, weights, &init_rule, device)?;
        let fast =
            if device.is_cpu() { Some(WhisperEncoderCpu::new(&tensors, N_LAYERS, n_heads(profile))?) } else { None };
        let runtime = if fast.is_some() { Runtime::CpuKernels } else { Runtime::Candle };
        let mut enc = weights::build_from_tensors(tensors, device, "whisper-tiny", |vb| build(vb, profile))?;
        enc.fast = fast;
        let t = (WINDOW_FRAMES / 2) as f64;
        let flops_window = crate::flops::weight_flops(&table, |name| {
            Some(if name.starts_with("conv1") { WINDOW_FRAMES as f64 } else { t })
        }) + N_LAYERS as f64 * crate::flops::attention_flops(t, t, d_model(profile) as f64);
        Ok(WhisperAudio {
            info: EngineInfo {
                model: ModelKind::WhisperTiny,
                profile,
                weights: weights.label(),
                num_params: table.num_params(),
                // One 30 s window's FLOPs spread over its 750 video frames at 25 fps.
                flops_per_frame: flops_window / 750.0,
                runtime,
            },
            enc,
            device: device.clone(),
        })
    }

    /// The width of a hidden state ([`d_model`] of the profile).
    pub fn d_model(&self) -> usize {
        self.enc.d
    }

    /// 50 Hz hidden states of the whole signal: (steps, 5, d).
    pub fn hidden_states(&self, samples: &[f32]) -> Result<Batch> {
        let clip = self.clip(samples, 25.0)?;
        let parts = (0..clip.windows()).map(|w| clip.encode_window(w)).collect::<Result<Vec<_>>>()?;
        let data: Vec<f32> = parts.into_iter().flatten().collect();
        Batch::new(vec![clip.steps, N_HIDDEN, self.d_model()], data)
    }

    /// `samples` prepared for encoding at `fps` video frames per second, with nothing computed
    /// yet. [`WhisperClip::frame_windows`] makes the log-mel of the 30 s segments that the frames
    /// asked for need and encodes them, as they are asked for, and keeps only the last ones:
    /// memory stays bounded however long the clip, and the first frames' features exist after
    /// one segment's work.
    pub fn clip<'a>(&'a self, samples: &'a [f32], fps: f32) -> Result<WhisperClip<'a>> {
        self.clip_of(Source::Slice(samples), samples.len(), fps)
    }

    /// [`Self::clip`] over `len` samples that `source` hands out as the segments are reached
    /// (audio read from a file or a pipe as the render goes).
    pub fn clip_from<'a>(&'a self, source: &'a dyn ClipSamples, len: usize, fps: f32) -> Result<WhisperClip<'a>> {
        self.clip_of(Source::Reader(source), len, fps)
    }

    fn clip_of<'a>(&'a self, source: Source<'a>, len: usize, fps: f32) -> Result<WhisperClip<'a>> {
        if !(fps > 0.0 && fps.is_finite()) {
            return Err(EngineError::BadInput(format!("fps must be positive, got {fps}")));
        }
        if len == 0 {
            return Err(EngineError::BadInput("no audio samples".into()));
        }
        let content_frames = len / HOP;
        let frames = ((len as f64 * fps as f64) / SAMPLE_RATE as f64).ceil() as usize;
        Ok(WhisperClip {
            whisper: self,
            source,
            len,
            windows: content_frames.div_ceil(WINDOW_FRAMES).max(1),
            steps: (content_frames / 2).max(1),
            frames,
            fps,
            cache: std::sync::Mutex::new(Vec::new()),
        })
    }
}

/// Where a [`WhisperClip`] reads its 16 kHz mono samples from.
pub trait ClipSamples: Sync {
    /// Appends samples `from..to` of the clip to `out`. A clip asks for its 30 s segments in
    /// increasing order, each once, so a source read as a stream may forget what came before
    /// `from`.
    fn read_samples(&self, from: usize, to: usize, out: &mut Vec<f32>) -> Result<()>;
}

/// A [`WhisperClip`]'s samples: the whole signal in memory, or a reader.
enum Source<'a> {
    Slice(&'a [f32]),
    Reader(&'a dyn ClipSamples),
}

/// One clip's whisper features, made a 30 s segment at a time on demand
/// ([`WhisperAudio::clip`]): the segment's log-mel ([`segment_log_mel`]), then the encoder.
/// Frames are asked for in increasing order; the segments before the earliest one a request
/// needs are dropped.
pub struct WhisperClip<'a> {
    whisper: &'a WhisperAudio,
    /// 16 kHz mono, `len` samples.
    source: Source<'a>,
    len: usize,
    windows: usize,
    /// 50 Hz steps of the clip (the first floor(mel frames / 2) positions of each window).
    steps: usize,
    frames: usize,
    fps: f32,
    /// Encoded windows kept: (window index, (kept steps, 5, 384) values).
    cache: std::sync::Mutex<Vec<(usize, std::sync::Arc<Vec<f32>>)>>,
}

impl WhisperClip<'_> {
    /// Video frames: ceil(seconds x fps).
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// (50, d): one frame's window (d = 384 at the full profile).
    pub fn frame_shape(&self) -> (usize, usize) {
        ((STEPS_LEFT + STEPS_RIGHT) * N_HIDDEN, self.whisper.d_model())
    }

    fn windows(&self) -> usize {
        self.windows
    }

    /// Steps window `w` contributes: 1500 for every window but the last, which keeps what is left.
    fn window_steps(&self, w: usize) -> usize {
        (self.steps - (w * WINDOW_FRAMES / 2).min(self.steps)).min(WINDOW_FRAMES / 2)
    }

    /// Window `w`'s log-mel as the encoder's input: (1, 80, 3000) on the CPU.
    fn window_mel(&self, w: usize) -> Result<Tensor> {
        let from = (w * SEGMENT_SAMPLES).min(self.len);
        let to = (from + SEGMENT_SAMPLES).min(self.len);
        let mut segment = Vec::with_capacity(to - from);
        match self.source {
            Source::Slice(s) => segment.extend_from_slice(&s[from..to]),
            Source::Reader(r) => r.read_samples(from, to, &mut segment)?,
        }
        let mel = segment_log_mel(&segment)?;
        Ok(Tensor::from_vec(mel, (1, N_MELS, WINDOW_FRAMES), &Device::Cpu)?)
    }

    /// The hidden states of window `w`'s kept steps: (steps, 5, 384) values.
    fn encode_window(&self, w: usize) -> Result<Vec<f32>> {
        let mel = self.window_mel(w)?;
        let hs = self.whisper.enc.hidden_states(&mel.to_device(&self.whisper.device)?)?; // (1, 1500, 5, d)
        let kept = hs.get(0)?.narrow(0, 0, self.window_steps(w))?;
        Ok(kept.flatten_all()?.to_device(&Device::Cpu)?.to_vec1::<f32>()?)
    }

    /// Appends the (50, 384) windows of `frames` (increasing, each below [`Self::frames`]) to
    /// `out`: steps `c-4 .. c+6` of each frame, `c = floor(i * 50 / fps)`, clamped to the clip.
    pub fn frame_windows(&self, frames: &[usize], out: &mut Vec<f32>) -> Result<()> {
        let per_step = N_HIDDEN * self.whisper.d_model();
        let half = WINDOW_FRAMES / 2;
        let mut need: Vec<usize> = Vec::new();
        for &f in frames {
            if f >= self.frames {
                return Err(EngineError::BadInput(format!("frame {f} is outside the clip ({} frames)", self.frames)));
            }
            for j in window_indices(f, self.fps, self.steps) {
                if !need.contains(&(j / half)) {
                    need.push(j / half);
                }
            }
        }
        let mut cache = self.cache.lock().map_err(|_| EngineError::BadInput("whisper cache poisoned".into()))?;
        if let Some(&lowest) = need.iter().min() {
            cache.retain(|(w, _)| *w >= lowest);
        }
        for &w in &need {
            if !cache.iter().any(|(c, _)| *c == w) {
                let hs = self.encode_window(w)?;
                cache.push((w, std::sync::Arc::new(hs)));
            }
        }
        for &f in frames {
            for j in window_indices(f, self.fps, self.steps) {
                let (w, at) = (j / half, j % half);
                let hs = &cache.iter().find(|(c, _)| *c == w).expect("encoded above").1;
                out.extend_from_slice(&hs[at * per_step..(at + 1) * per_step]);
            }
        }
        Ok(())
    }
}

impl Engine for WhisperAudio {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
}

impl AudioEncoder for WhisperAudio {
    fn encode_audio(&self, samples: &[f32], fps: f32) -> Result<Batch> {
        let clip = self.clip(samples, fps)?;
        let (win, dim) = clip.frame_shape();
        let all: Vec<usize> = (0..clip.frames()).collect();
        let mut data = Vec::with_capacity(all.len() * win * dim);
        clip.frame_windows(&all, &mut data)?;
        Batch::new(vec![clip.frames(), win, dim], data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clip's windows encoded one at a time, on demand ([`WhisperClip`]), against all of them
    /// in one batch (how the encoder was run before windowed renders): the same values, and
    /// the frame windows asked for in pieces (increasing, across the 30 s boundaries) equal
    /// those asked for at once.
    #[test]
    fn windows_encoded_on_demand_equal_one_batch_of_all() {
        let enc = WhisperAudio::new(Profile::Cpu, &WeightsSource::Synthetic { seed: 3 }, &Device::Cpu).unwrap();
        // 61.3 s: three encoder windows, the last one partial.
        let x: Vec<f32> =
            (0..(16000.0 * 61.3) as usize).map(|i| 0.2 * (i as f32 * 0.013).sin() * ((i / 5000) % 3) as f32).collect();
        let clip = enc.clip(&x, 25.0).unwrap();
        assert_eq!(clip.windows(), 3);
        let batch: Vec<Tensor> = (0..3).map(|w| clip.window_mel(w).unwrap()).collect();
        let all = enc.enc.hidden_states(&Tensor::cat(&batch, 0).unwrap()).unwrap();
        for w in 0..3 {
            let one = clip.encode_window(w).unwrap();
            let want = all.get(w).unwrap().narrow(0, 0, clip.window_steps(w)).unwrap().flatten_all().unwrap();
            let want = want.to_vec1::<f32>().unwrap();
            assert_eq!(one.len(), want.len());
            let worst = one.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert_eq!(worst, 0.0, "window {w}: alone and in a batch differ by {worst}");
        }
        let whole = enc.encode_audio(&x, 25.0).unwrap();
        let (win, dim) = clip.frame_shape();
        assert_eq!(whole.shape, vec![clip.frames(), win, dim]);
        let fresh = enc.clip(&x, 25.0).unwrap();
        let mut pieces = Vec::new();
        let mut f = 0;
        for len in [7usize, 1, 700, 3, 40, 800].iter().cycle() {
            if f >= fresh.frames() {
                break;
            }
            let frames: Vec<usize> = (f..(f + len).min(fresh.frames())).collect();
            fresh.frame_windows(&frames, &mut pieces).unwrap();
            // Windows before the request's first frame (step 2f - 4 at 25 fps) are dropped.
            let lowest = (2 * f).saturating_sub(STEPS_LEFT) / (WINDOW_FRAMES / 2);
            assert!(fresh.cache.lock().unwrap().iter().all(|(w, _)| *w >= lowest));
            f += len;
        }
        assert!(pieces == whole.data, "frame windows asked for in pieces differ from the whole clip's");
        assert!(fresh.frame_windows(&[fresh.frames()], &mut Vec::new()).is_err());
    }
}
