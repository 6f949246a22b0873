//! HuBERT-large (facebook/hubert-large-ls960-ft's architecture, HF transformers `HubertModel`),
//! Ditto's audio features: 16 kHz audio -> hidden states at 50 Hz, paired into Ditto's 25 fps
//! (N, 1024) rows by [`Hubert::ditto_features`].
//!
//! Architecture (the "stable layer norm" variant, `do_stable_layer_norm`, `feat_extract_norm =
//! "layer"`):
//! - `feature_extractor.conv_layers.{0..6}`: Conv1d (512 channels, kernels 10, 3, 3, 3, 3, 2, 2,
//!   strides 5, 2, 2, 2, 2, 2, 2, no padding, with bias), LayerNorm over the channels (eps
//!   1e-5), exact GELU: 320 samples per frame, receptive field 400;
//! - `feature_projection`: LayerNorm(512), Linear(512 -> 1024);
//! - `encoder.pos_conv_embed.conv`: grouped Conv1d(1024, 1024, kernel 128, padding 64, 16
//!   groups) with weight norm over dim 2 (w = g·v/‖v‖, the norm per tap over the other two dims;
//!   `weight_g` (1, 1, 128) and `weight_v`, or the newer `parametrizations.weight.original0/1`),
//!   its last output frame dropped (even kernel), GELU, added to the projection;
//! - `encoder.layers.{0..23}`: x + attention(`layer_norm` x) (16 heads, q, k, v, out projections
//!   with biases, scale 1/√64), then x + `feed_forward.output_dense`(GELU(`intermediate_dense`
//!   (`final_layer_norm` x))) (4096 hidden) — the pre-LN block of [`crate::whisper::cpu`];
//! - `encoder.layer_norm` on the last layer's output is `last_hidden_state`.
//!
//! Names are the HF state dict's; the CTC checkpoint's `hubert.` prefix is stripped and its
//! `lm_head` and `masked_spec_embed` (training only) are ignored.
//!
//! **Ditto's features** (`core/atomic_components/wav2feat.py`, offline): N = ⌈25·len/16000⌉;
//! the audio padded with 2000 zeros before and 6480 after; every 5 frames a 6480-sample chunk
//! (0.4 s + 80 samples, starting at int(i·0.04·16000)) goes through the encoder on its own (20
//! hidden frames); frames [−14, −4) of it, averaged in pairs, are the 5 feature rows of frames
//! i..i+5. Ditto runs an ONNX export (`hubert_streaming_fix_kv.onnx`, output `encoding_out`)
//! whose graph is not in its source: which hidden state it returns is not stated there. This
//! module takes `last_hidden_state` (the encoder's output, after its final LayerNorm); other
//! layers are available through [`Hubert::layer_output`]. Ditto feeds the raw samples (no
//! zero-mean/unit-variance normalisation), and so does this.

use rayon::prelude::*;

use crate::conv::{epilogue, gemm_st};
use crate::ditto::{Params, TableBuilder};
use crate::unet::cpu::{Attention, LayerNorm, Linear, ROWS};
use crate::weights::ParamTable;
use crate::whisper::cpu::{gelu_in_place, Block};
use crate::{EngineError, Result, WeightsSource};

/// Audio sample rate the encoder expects.
pub const SAMPLE_RATE: usize = 16_000;
/// Ditto's chunking (pre-context, valid, post-context frames at 25 fps).
const CHUNK: (usize, usize, usize) = (3, 5, 2);

/// Sizes of the encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubertConfig {
    pub conv_dim: Vec<usize>,
    pub conv_kernel: Vec<usize>,
    pub conv_stride: Vec<usize>,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub pos_kernel: usize,
    pub pos_groups: usize,
}

impl Default for HubertConfig {
    /// hubert-large-ls960-ft.
    fn default() -> Self {
        HubertConfig {
            conv_dim: vec![512; 7],
            conv_kernel: vec![10, 3, 3, 3, 3, 2, 2],
            conv_stride: vec![5, 2, 2, 2, 2, 2, 2],
            hidden: 1024,
            layers: 24,
            heads: 16,
            intermediate: 4096,
            pos_kernel: 128,
            pos_groups: 16,
        }
    }
}

impl HubertConfig {
    /// `HubertModel.state_dict()` without `masked_spec_embed`, weight norm as `weight_g`/`weight_v`.
    pub fn param_table(&self) -> ParamTable {
        let mut t = TableBuilder::default();
        let ln = |t: &mut TableBuilder, p: &str, c: usize| {
            t.add(format!("{p}.weight"), &[c]);
            t.add(format!("{p}.bias"), &[c]);
        };
        let lin = |t: &mut TableBuilder, p: &str, dout: usize, din: usize| {
            t.add(format!("{p}.weight"), &[dout, din]);
            t.add(format!("{p}.bias"), &[dout]);
        };
        let mut cin = 1;
        for (i, ((&c, &k), _)) in self.conv_dim.iter().zip(&self.conv_kernel).zip(&self.conv_stride).enumerate() {
            let p = format!("feature_extractor.conv_layers.{i}");
            t.conv(&format!("{p}.conv"), c, cin, &[k], true);
            ln(&mut t, &format!("{p}.layer_norm"), c);
            cin = c;
        }
        ln(&mut t, "feature_projection.layer_norm", cin);
        lin(&mut t, "feature_projection.projection", self.hidden, cin);
        let h = self.hidden;
        t.add("encoder.pos_conv_embed.conv.bias", &[h]);
        t.add("encoder.pos_conv_embed.conv.weight_g", &[1, 1, self.pos_kernel]);
        t.add("encoder.pos_conv_embed.conv.weight_v", &[h, h / self.pos_groups, self.pos_kernel]);
        ln(&mut t, "encoder.layer_norm", h);
        for i in 0..self.layers {
            let p = format!("encoder.layers.{i}");
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                lin(&mut t, &format!("{p}.attention.{proj}"), h, h);
            }
            ln(&mut t, &format!("{p}.layer_norm"), h);
            lin(&mut t, &format!("{p}.feed_forward.intermediate_dense"), self.intermediate, h);
            lin(&mut t, &format!("{p}.feed_forward.output_dense"), h, self.intermediate);
            ln(&mut t, &format!("{p}.final_layer_norm"), h);
        }
        t.build()
    }

    /// Hidden frames for `samples` audio samples (0 if shorter than the receptive field).
    pub fn frames(&self, samples: usize) -> usize {
        self.conv_kernel
            .iter()
            .zip(&self.conv_stride)
            .fold(samples, |n, (&k, &s)| if n < k { 0 } else { (n - k) / s + 1 })
    }

    /// Multiply-adds of one forward on `samples` samples.
    pub fn macs(&self, samples: usize) -> f64 {
        let (mut n, mut cin, mut m) = (samples, 1usize, 0f64);
        for ((&c, &k), &s) in self.conv_dim.iter().zip(&self.conv_kernel).zip(&self.conv_stride) {
            n = if n < k { 0 } else { (n - k) / s + 1 };
            m += (n * c * cin * k) as f64;
            cin = c;
        }
        let (t, h) = (n as f64, self.hidden as f64);
        m += t * cin as f64 * h;
        m += t * h * (h / self.pos_groups as f64) * self.pos_kernel as f64;
        m + self.layers as f64 * (t * 4.0 * h * h + 2.0 * t * t * h + 2.0 * t * h * self.intermediate as f64)
    }
}

/// HF names: the CTC model's `hubert.` prefix stripped, weight norm's parametrization names
/// mapped to `weight_g`/`weight_v`, everything outside the encoder dropped.
pub(crate) fn normalize(key: &str) -> Option<String> {
    let key = key.strip_prefix("hubert.").unwrap_or(key);
    if !(key.starts_with("feature_extractor.") || key.starts_with("feature_projection.") || key.starts_with("encoder."))
    {
        return None;
    }
    Some(
        key.replace("conv.parametrizations.weight.original0", "conv.weight_g")
            .replace("conv.parametrizations.weight.original1", "conv.weight_v"),
    )
}

/// A Conv1d without padding on token-major activations: the window of output t is the
/// contiguous input rows t·stride .. t·stride + k, so the GEMM reads the input in place with a
/// row stride of stride·cin (no im2col copy). Weights packed [(tap·cin + ci)][cout].
struct StridedConv {
    k: usize,
    stride: usize,
    cin: usize,
    cout: usize,
    w: Vec<f32>,
    bias: Vec<f32>,
}

impl StridedConv {
    fn load(p: &Params, prefix: &str, stride: usize) -> Result<StridedConv> {
        let w = p.vec(&format!("{prefix}.weight"))?;
        let bias = p.vec(&format!("{prefix}.bias"))?;
        let cout = bias.len();
        let k = p.dims(&format!("{prefix}.weight"))?[2];
        let cin = w.len() / cout / k;
        Ok(StridedConv { k, stride, cin, cout, w: pack_taps(&w, cout, cin, k), bias })
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let len = x.len() / self.cin;
        let out_len = (len - self.k) / self.stride + 1;
        let (cout, kk, rs) = (self.cout, self.k * self.cin, self.stride * self.cin);
        let mut out = vec![0f32; out_len * cout];
        out.par_chunks_mut(ROWS * cout).enumerate().for_each(|(c, dst)| {
            let rows = dst.len() / cout;
            // SAFETY: rows r of this chunk read x[(c·ROWS + r)·rs ..][..kk], inside x since the
            // last window ends at (out_len − 1)·stride + k ≤ len rows; dst is rows x cout.
            unsafe {
                gemm_st(
                    rows,
                    cout,
                    kk,
                    dst.as_mut_ptr(),
                    cout,
                    x.as_ptr().add(c * ROWS * rs),
                    rs,
                    1,
                    self.w.as_ptr(),
                    cout,
                    1,
                    1.0,
                )
            };
            epilogue(dst, cout, Some(&self.bias), None, false);
        });
        out
    }
}

/// (cout, cin, k) -> [(tap·cin + ci)][cout].
fn pack_taps(w: &[f32], cout: usize, cin: usize, k: usize) -> Vec<f32> {
    let mut p = vec![0f32; w.len()];
    for o in 0..cout {
        for i in 0..cin {
            for t in 0..k {
                p[(t * cin + i) * cout + o] = w[(o * cin + i) * k + t];
            }
        }
    }
    p
}

/// The weight-normalised grouped positional convolution (+ GELU), same length out as in.
struct PosConv {
    k: usize,
    groups: usize,
    /// Per group: [(tap·cg + ci)][co].
    w: Vec<Vec<f32>>,
    bias: Vec<f32>,
}

impl PosConv {
    fn load(p: &Params, prefix: &str, groups: usize) -> Result<PosConv> {
        let dims = p.dims(&format!("{prefix}.weight_v"))?;
        let (h, cg, k) = (dims[0], dims[1], dims[2]);
        let v = p.vec(&format!("{prefix}.weight_v"))?;
        let g = p.vec(&format!("{prefix}.weight_g"))?;
        // w = v · (g / ‖v[:, :, t]‖) per tap t (torch's _weight_norm with dim = 2), norm in f64.
        let mut scale = vec![0f64; k];
        for (i, x) in v.iter().enumerate() {
            scale[i % k] += (*x as f64).powi(2);
        }
        let scale: Vec<f32> = scale.iter().zip(&g).map(|(s, g)| (*g as f64 / s.sqrt()) as f32).collect();
        let w: Vec<f32> = v.iter().enumerate().map(|(i, x)| x * scale[i % k]).collect();
        let co = h / groups;
        let w = (0..groups).map(|gi| pack_taps(&w[gi * co * cg * k..(gi + 1) * co * cg * k], co, cg, k)).collect();
        Ok(PosConv { k, groups, w, bias: p.vec(&format!("{prefix}.bias"))? })
    }

    /// x (T, h) -> gelu(conv(x))[..T] (T, h): padding k/2 both sides; for an even kernel the
    /// convolution gives T + 1 frames and the last is dropped.
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let h = self.bias.len();
        let t = x.len() / h;
        let (cg, pad) = (h / self.groups, self.k / 2);
        let per_group: Vec<Vec<f32>> = (0..self.groups)
            .into_par_iter()
            .map(|gi| {
                // The group's channels, zero-padded in time; output s reads rows s..s + k.
                let mut xg = vec![0f32; (t + 2 * pad) * cg];
                for s in 0..t {
                    xg[(s + pad) * cg..(s + pad + 1) * cg].copy_from_slice(&x[s * h + gi * cg..][..cg]);
                }
                let mut out = vec![0f32; t * cg];
                // SAFETY: row s reads xg[s·cg ..][..k·cg], the last (t − 1 + k)·cg ≤ len; out is
                // t x cg; w is (k·cg) x cg.
                unsafe {
                    gemm_st(
                        t,
                        cg,
                        self.k * cg,
                        out.as_mut_ptr(),
                        cg,
                        xg.as_ptr(),
                        cg,
                        1,
                        self.w[gi].as_ptr(),
                        cg,
                        1,
                        1.0,
                    )
                };
                out
            })
            .collect();
        let mut out = vec![0f32; t * h];
        for (gi, o) in per_group.iter().enumerate() {
            for s in 0..t {
                out[s * h + gi * cg..][..cg].copy_from_slice(&o[s * cg..(s + 1) * cg]);
            }
        }
        epilogue(&mut out, h, Some(&self.bias), None, false);
        gelu_in_place(&mut out);
        out
    }
}

/// The encoder with its weights packed for the CPU path.
pub struct Hubert {
    cfg: HubertConfig,
    convs: Vec<(StridedConv, LayerNorm)>,
    proj_norm: LayerNorm,
    projection: Linear,
    pos_conv: PosConv,
    blocks: Vec<Block>,
    final_norm: LayerNorm,
}

impl Hubert {
    pub fn new(cfg: &HubertConfig, source: &WeightsSource) -> Result<Hubert> {
        let p = Params::obtain(&cfg.param_table(), source, &normalize)?;
        let w = p.weights();
        let convs = cfg
            .conv_stride
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let pre = format!("feature_extractor.conv_layers.{i}");
                Ok((
                    StridedConv::load(&p, &format!("{pre}.conv"), s)?,
                    LayerNorm::load(&w, &format!("{pre}.layer_norm"))?,
                ))
            })
            .collect::<Result<_>>()?;
        let blocks = (0..cfg.layers)
            .map(|i| {
                let pre = format!("encoder.layers.{i}");
                let lin = |n: &str| Linear::load(&w, &format!("{pre}.{n}"), true);
                Ok(Block {
                    ln1: LayerNorm::load(&w, &format!("{pre}.layer_norm"))?,
                    attn: Attention::from_parts(
                        cfg.heads,
                        lin("attention.q_proj")?,
                        lin("attention.k_proj")?,
                        lin("attention.v_proj")?,
                        lin("attention.out_proj")?,
                    ),
                    ln2: LayerNorm::load(&w, &format!("{pre}.final_layer_norm"))?,
                    fc1: lin("feed_forward.intermediate_dense")?,
                    fc2: lin("feed_forward.output_dense")?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Hubert {
            cfg: cfg.clone(),
            convs,
            proj_norm: LayerNorm::load(&w, "feature_projection.layer_norm")?,
            projection: Linear::load(&w, "feature_projection.projection", true)?,
            pos_conv: PosConv::load(&p, "encoder.pos_conv_embed.conv", cfg.pos_groups)?,
            blocks,
            final_norm: LayerNorm::load(&w, "encoder.layer_norm")?,
        })
    }

    pub fn config(&self) -> &HubertConfig {
        &self.cfg
    }

    fn check(&self, audio: &[f32]) -> Result<()> {
        if self.cfg.frames(audio.len()) == 0 {
            return Err(EngineError::BadInput(format!(
                "HuBERT: {} audio samples, fewer than one frame's receptive field",
                audio.len()
            )));
        }
        if let Some(i) = audio.iter().position(|v| !v.is_finite()) {
            return Err(EngineError::BadInput(format!("HuBERT: audio sample {i} is {}", audio[i])));
        }
        Ok(())
    }

    /// Runs the convolutions, projection, positional convolution and the first `layers` blocks.
    fn run(&self, audio: &[f32], layers: usize) -> Vec<f32> {
        let mut x = audio.to_vec();
        for (conv, ln) in &self.convs {
            x = ln.forward(&conv.forward(&x));
            gelu_in_place(&mut x);
        }
        let mut x = self.projection.forward(&self.proj_norm.forward(&x), None);
        let pos = self.pos_conv.forward(&x);
        x.iter_mut().zip(&pos).for_each(|(a, b)| *a += b);
        for b in &self.blocks[..layers] {
            x = b.forward(&x);
        }
        x
    }

    /// `last_hidden_state` (T, hidden) of 16 kHz audio: the last layer's output after the
    /// encoder's final LayerNorm.
    pub fn last_hidden_state(&self, audio: &[f32]) -> Result<Vec<f32>> {
        self.check(audio)?;
        Ok(self.final_norm.forward(&self.run(audio, self.cfg.layers)))
    }

    /// The input of the first encoder layer (`k` = 0) or layer k's output (k = 1..=layers),
    /// before the final LayerNorm: (T, hidden).
    pub fn layer_output(&self, audio: &[f32], k: usize) -> Result<Vec<f32>> {
        self.check(audio)?;
        if k > self.cfg.layers {
            return Err(EngineError::BadInput(format!("HuBERT: layer {k} of {}", self.cfg.layers)));
        }
        Ok(self.run(audio, k))
    }

    /// Ditto's 25 fps features of 16 kHz audio (module docs): (N, hidden), N = ⌈25·len/16000⌉.
    pub fn ditto_features(&self, audio: &[f32]) -> Result<Vec<f32>> {
        if audio.is_empty() {
            return Err(EngineError::BadInput("HuBERT: no audio samples".into()));
        }
        if let Some(i) = audio.iter().position(|v| !v.is_finite()) {
            return Err(EngineError::BadInput(format!("HuBERT: audio sample {i} is {}", audio[i])));
        }
        let num_f = ditto_frames(audio.len());
        let (split, lead) = (chunk_samples(), lead_samples());
        let mut padded = vec![0f32; lead + audio.len() + split];
        padded[lead..lead + audio.len()].copy_from_slice(audio);
        // The chunks are independent and small (a few dozen frames each, too little work to keep
        // two threads busy inside one): one chunk per task.
        let chunks: Vec<Vec<f32>> = (0..num_f)
            .step_by(CHUNK.1)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|i| {
                let s = chunk_start(i);
                self.ditto_chunk(&padded[s..s + split])
            })
            .collect::<Result<_>>()?;
        let mut out = chunks.concat();
        out.truncate(num_f * self.cfg.hidden);
        Ok(out)
    }

    /// The 5 feature rows of one chunk of the padded audio ([`chunk_samples`] long): frames
    /// [n − 2(valid + post), n − 2·post) of its encoding, averaged in pairs.
    fn ditto_chunk(&self, chunk: &[f32]) -> Result<Vec<f32>> {
        let (_, valid, post) = CHUNK;
        let h = self.cfg.hidden;
        let enc = self.final_norm.forward(&self.run(chunk, self.cfg.layers));
        let n = enc.len() / h;
        if n < 2 * (valid + post) {
            return Err(EngineError::BadInput(format!(
                "HuBERT: a {}-sample chunk gives {n} frames, fewer than Ditto's window",
                chunk.len()
            )));
        }
        let first = n - 2 * (valid + post);
        Ok((0..valid)
            .flat_map(|f| {
                let (a, b) = (&enc[(first + 2 * f) * h..][..h], &enc[(first + 2 * f + 1) * h..][..h]);
                a.iter().zip(b).map(|(x, y)| (x + y) / 2.0)
            })
            .collect())
    }
}

/// Ditto's float arithmetic for sample positions, so that the chunk boundaries land on the same
/// samples: int(frames · 0.04 · 16000).
fn samples_of(frames: f64) -> usize {
    (frames * 0.04 * SAMPLE_RATE as f64) as usize
}

/// Feature frames of `len` samples: ⌈25·len/16000⌉.
fn ditto_frames(len: usize) -> usize {
    (len as f64 / SAMPLE_RATE as f64 * 25.0).ceil() as usize
}

/// Samples of one chunk: (pre + valid + post) frames and 80 (6480).
fn chunk_samples() -> usize {
    let (pre, valid, post) = CHUNK;
    samples_of((pre + valid + post) as f64) + 80
}

/// Zeros before the audio (2000).
fn lead_samples() -> usize {
    let (_, valid, post) = CHUNK;
    chunk_samples() - samples_of((valid + post) as f64)
}

/// Where the chunk of frames i..i + 5 starts in the padded audio.
fn chunk_start(i: usize) -> usize {
    samples_of(i as f64)
}

/// [`Hubert::ditto_features`] of audio that arrives a piece at a time (a live stream), with the
/// same rows: each chunk is encoded on its own, so a chunk is run as soon as its 6480 samples
/// (the audio to 2 frames and 80 samples past its last frame) have arrived, or zeros stand for
/// them once the stream has ended. Keeps one chunk of audio, whatever the stream's length.
pub struct DittoFeatureStream {
    /// The padded audio (the lead zeros, the samples, the trailing zeros once ended) from
    /// sample `from` on.
    padded: Vec<f32>,
    from: usize,
    audio_len: usize,
    ended: bool,
    /// The next chunk's first frame.
    next: usize,
}

impl Default for DittoFeatureStream {
    fn default() -> Self {
        Self::new()
    }
}

impl DittoFeatureStream {
    pub fn new() -> Self {
        Self { padded: vec![0.0; lead_samples()], from: 0, audio_len: 0, ended: false, next: 0 }
    }

    /// Appends 16 kHz samples (every one finite).
    pub fn push(&mut self, samples: &[f32]) -> Result<()> {
        if self.ended {
            return Err(EngineError::BadInput("HuBERT: audio after the end of the stream".into()));
        }
        if let Some(i) = samples.iter().position(|v| !v.is_finite()) {
            return Err(EngineError::BadInput(format!(
                "HuBERT: audio sample {} is {}",
                self.audio_len + i,
                samples[i]
            )));
        }
        self.padded.extend_from_slice(samples);
        self.audio_len += samples.len();
        Ok(())
    }

    /// Marks the end of the audio: the last chunks are run on zeros past it.
    pub fn finish(&mut self) {
        if !self.ended {
            self.ended = true;
            self.padded.extend(std::iter::repeat_n(0.0, chunk_samples()));
        }
    }

    /// The stream's feature frames, once it has ended.
    pub fn frames_total(&self) -> Option<usize> {
        self.ended.then(|| ditto_frames(self.audio_len))
    }

    /// Whether every feature row has been handed out.
    pub fn is_done(&self) -> bool {
        self.frames_total().is_some_and(|n| self.next >= n)
    }

    /// Runs every chunk whose audio has arrived and returns its rows (frames × hidden), in order
    /// after those returned before.
    pub fn step(&mut self, hubert: &Hubert) -> Result<Vec<f32>> {
        let split = chunk_samples();
        let mut out = Vec::new();
        loop {
            let limit = self.frames_total().unwrap_or(usize::MAX);
            let s = chunk_start(self.next);
            if self.next >= limit || s + split > self.from + self.padded.len() {
                break;
            }
            let mut rows = hubert.ditto_chunk(&self.padded[s - self.from..s - self.from + split])?;
            rows.truncate((limit - self.next).min(CHUNK.1) * hubert.cfg.hidden);
            out.extend(rows);
            self.next += CHUNK.1;
        }
        let keep = chunk_start(self.next).min(self.from + self.padded.len());
        self.padded.drain(..keep - self.from);
        self.from = keep;
        Ok(out)
    }
}
