//! Ditto's LMDM (latent motion diffusion model, `core/models/modules/LMDM.py` and
//! `lmdm_modules/{model,utils,rotary_embedding_torch}.py`; `lmdm_v0.4_hubert.pth`): from HuBERT
//! features and the source's motion, 80 frames of motion per window, by DDIM sampling of the
//! `MotionDecoder` with classifier-free guidance.
//!
//! **Motion** (265 per frame): scale − 1 (1) | pitch, yaw, roll bin logits (66 each) | t (3) |
//! exp (63). **Condition** (1103 per frame): HuBERT 1024 | emotion 8 | eye open 2 | eye ball 6 |
//! source keypoints 63.
//!
//! **MotionDecoder** (latent d = 512, ff 1024, 8 heads, exact GELU, LayerNorm eps 1e-5, batch 1):
//! - input: `input_projection` Linear(2·265 -> d) of cat(x, cond_frame repeated per frame);
//! - condition tokens: `cond_projection` Linear(1103 -> d), then `cond_encoder.{0,1}`, pre-LN
//!   encoder layers (`norm1`, `self_attn`, `norm2`, `linear1`, `linear2`); their mean over the
//!   frames through `non_attn_cond_projection` (LayerNorm, Linear, SiLU, Linear) is the
//!   condition's FiLM part;
//! - time: sinusoidal embedding of the integer step (d, [sin | cos] with frequencies
//!   exp(−i·ln 10⁴/(d/2 − 1))), `time_mlp.1` Linear(d -> 4d) + Mish; `to_time_cond.0`
//!   Linear(4d -> d) plus the condition's FiLM part is `t`; `to_time_tokens.0` Linear(4d -> 2d)
//!   gives two more tokens; memory = `norm_cond`(cat(condition tokens, time tokens));
//! - unconditional pass (guidance): the condition tokens are `null_cond_embed` (1, 80, d) and the
//!   FiLM part `null_cond_hidden` (1, d) instead;
//! - `seqTransDecoder.stack.{i}` (8): x += FiLM₁(self-attn(norm1 x)); x += FiLM₂(cross-attn(norm2
//!   x, memory)); x += FiLM₃(linear2(gelu(linear1(norm3 x)))); FiLMₖ(y) = (scale + 1)·y + shift
//!   with [scale | shift] = `filmₖ.block.1`(Mish(t));
//! - `final_layer` Linear(d -> 265) is x₀ (the model predicts the clean motion).
//!
//! **Rotary positions** (`RotaryEmbedding(dim = d)`, interleaved pairs): applied to the whole
//! d-wide tokens *before* the attention's input projection, to the query and key inputs only
//! (the value input is the unrotated tokens): pair (2i, 2i+1) at position p is rotated by
//! p·θᵢ, θᵢ = 10000^(−2i/d), positions counted from 0 separately for x (80) and memory (82).
//! `nn.MultiheadAttention` keeps q, k, v in one `in_proj_weight` (3d, d) / `in_proj_bias`.
//!
//! **Sampler** (`LMDM.ddim_sample`): cosine β schedule (s = 8e-3, T = 1000, β ≤ 0.999, ᾱ as
//! Ditto's f32 buffer); one step = x₀ = unc + 2·(cond − unc) and ε = x/√(1 − ᾱₜ) − x₀/√(1/ᾱₜ − 1);
//! steps at int(linspace(−1, 999, S + 1)) (f32, truncated) from the top; DDIM with eta = 1:
//! x ← x₀·√ᾱₙ + c·ε + σ·z, σ = √((1 − ᾱₜ/ᾱₙ)(1 − ᾱₙ)/(1 − ᾱₜ)), c = √(1 − ᾱₙ − σ²); the last
//! step returns x₀. The noise (initial x and one z per step but the last) is the caller's
//! ([`DdimNoise`]); Ditto draws it once per `setup`.
//!
//! **Windows** (`core/atomic_components/audio2motion.py`, offline): windows of 80 frames every
//! 80 − overlap (10), the condition's last row repeated to fill the last window; each new window
//! is crossfaded over `overlap` frames with weights i/overlap, then smoothed (mean over 3 frames,
//! dims [0, 202): scale, pose, t; not exp); the next window's `cond_frame` is the motion at
//! frame len − overlap − 1 (Ditto's default of not resetting it); finally the sequence is cut
//! to N frames and smoothed once more. See [`offline_motion`].
//!
//! **Weights**: `lmdm_v0.4_hubert.pth` is `{"model_state_dict": {...}, ...}`, loaded by Ditto
//! into the `MotionDecoder` as is: the checkpoint reader unwraps that entry (a flattened
//! `model_state_dict.` prefix is stripped too), other entries are ignored; a plain state dict
//! loads too. The rotary frequency
//! buffers (`rotary.freqs` and their copies under every layer) are the formula above and are
//! recomputed, the file's copies ignored.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::conv::gemm_st;
use crate::ditto::{Params, TableBuilder};
use crate::unet::cpu::{softmax_rows, LayerNorm, Linear};
use crate::weights::{synthetic_values, Init, ParamTable};
use crate::whisper::cpu::gelu_in_place;
use crate::{EngineError, Result, WeightsSource};

/// Diffusion steps of the schedule.
pub const NUM_TIMESTEPS: usize = 1000;
/// The cosine schedule's offset s.
pub const COSINE_S: f64 = 8e-3;
/// Classifier-free guidance weight (x₀ = unc + w·(cond − unc)).
pub const GUIDANCE: f32 = 2.0;
/// Motion dims the window smoothing averages: scale, pitch, yaw, roll, t (1 + 3·66 + 3).
pub const SMOOTH_DIMS: usize = 202;

/// Sizes of the MotionDecoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LmdmConfig {
    /// Motion features per frame.
    pub nfeats: usize,
    /// Frames per window.
    pub seq_len: usize,
    pub latent: usize,
    pub ff: usize,
    pub layers: usize,
    pub heads: usize,
    /// Condition features per frame.
    pub cond_dim: usize,
}

impl Default for LmdmConfig {
    /// Ditto's `lmdm_v0.4_hubert`: 265 motion, 80 frames, 512 wide, ff 1024, 8 layers, 8 heads,
    /// condition 1024 + 35.
    fn default() -> Self {
        LmdmConfig { nfeats: 265, seq_len: 80, latent: 512, ff: 1024, layers: 8, heads: 8, cond_dim: 1103 }
    }
}

impl LmdmConfig {
    /// `MotionDecoder.state_dict()` without the rotary buffers (see the module docs).
    pub fn param_table(&self) -> ParamTable {
        let (d, ff) = (self.latent, self.ff);
        let mut t = TableBuilder::default();
        let lin = |t: &mut TableBuilder, p: &str, dout: usize, din: usize| {
            t.add(format!("{p}.weight"), &[dout, din]);
            t.add(format!("{p}.bias"), &[dout]);
        };
        let ln = |t: &mut TableBuilder, p: &str| {
            t.add(format!("{p}.weight"), &[d]);
            t.add(format!("{p}.bias"), &[d]);
        };
        let mha = |t: &mut TableBuilder, p: &str| {
            t.add(format!("{p}.in_proj_weight"), &[3 * d, d]);
            t.add(format!("{p}.in_proj_bias"), &[3 * d]);
            t.add(format!("{p}.out_proj.weight"), &[d, d]);
            t.add(format!("{p}.out_proj.bias"), &[d]);
        };
        lin(&mut t, "time_mlp.1", 4 * d, d);
        lin(&mut t, "to_time_cond.0", d, 4 * d);
        lin(&mut t, "to_time_tokens.0", 2 * d, 4 * d);
        t.add("null_cond_embed", &[1, self.seq_len, d]);
        t.add("null_cond_hidden", &[1, d]);
        ln(&mut t, "norm_cond");
        lin(&mut t, "input_projection", d, 2 * self.nfeats);
        for i in 0..2 {
            let p = format!("cond_encoder.{i}");
            mha(&mut t, &format!("{p}.self_attn"));
            lin(&mut t, &format!("{p}.linear1"), ff, d);
            lin(&mut t, &format!("{p}.linear2"), d, ff);
            ln(&mut t, &format!("{p}.norm1"));
            ln(&mut t, &format!("{p}.norm2"));
        }
        lin(&mut t, "cond_projection", d, self.cond_dim);
        ln(&mut t, "non_attn_cond_projection.0");
        lin(&mut t, "non_attn_cond_projection.1", d, d);
        lin(&mut t, "non_attn_cond_projection.3", d, d);
        for i in 0..self.layers {
            let p = format!("seqTransDecoder.stack.{i}");
            mha(&mut t, &format!("{p}.self_attn"));
            mha(&mut t, &format!("{p}.multihead_attn"));
            lin(&mut t, &format!("{p}.linear1"), ff, d);
            lin(&mut t, &format!("{p}.linear2"), d, ff);
            for n in 1..=3 {
                ln(&mut t, &format!("{p}.norm{n}"));
                lin(&mut t, &format!("{p}.film{n}.block.1"), 2 * d, d);
            }
        }
        lin(&mut t, "final_layer", self.nfeats, d);
        t.build()
    }

    /// Multiply-adds of one conditional forward (the projections, attention scores and values).
    pub fn macs(&self) -> f64 {
        let (n, m, d, ff) = (self.seq_len as f64, self.seq_len as f64 + 2.0, self.latent as f64, self.ff as f64);
        let time = d * 4.0 * d + 4.0 * d * 3.0 * d;
        let attn = |nq: f64, nk: f64| nq * d * d * 2.0 + nk * d * d * 2.0 + 2.0 * nq * nk * d;
        let enc = 2.0 * (attn(n, n) + 2.0 * n * d * ff);
        let cond = n * self.cond_dim as f64 * d + enc + 2.0 * d * d;
        let layer = attn(n, n) + attn(n, m) + 2.0 * n * d * ff + 3.0 * d * 2.0 * d;
        n * 2.0 * self.nfeats as f64 * d + time + cond + self.layers as f64 * layer + n * d * self.nfeats as f64
    }
}

/// `lmdm_v0.4_hubert.pth`'s names: the `model_state_dict` entry (prefix stripped), the rotary
/// buffers dropped (recomputed).
pub(crate) fn normalize(key: &str) -> Option<String> {
    let key = key.strip_prefix("model_state_dict.").unwrap_or(key);
    if key == "rotary.freqs" || key.ends_with(".rotary.freqs") {
        return None;
    }
    Some(key.to_string())
}

/// Mish, x·tanh(softplus(x)), in f64 (applied to a few thousand values per forward).
fn mish(x: f32) -> f32 {
    let x = x as f64;
    (x * x.exp().ln_1p().tanh()) as f32
}

fn silu(x: f32) -> f32 {
    let x = x as f64;
    (x / (1.0 + (-x).exp())) as f32
}

/// Interleaved rotary positions: cos and sin of p·θᵢ per position p and pair i. The angle is the
/// f32 product, as `RotaryEmbedding` forms it, then its cosine and sine to f32.
struct Rotary {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rotary {
    fn new(d: usize, positions: usize) -> Rotary {
        let half = d / 2;
        let theta: Vec<f32> =
            (0..half).map(|i| 1.0 / (10000f64.powf(((2 * i) as f32 / d as f32) as f64) as f32)).collect();
        let (mut cos, mut sin) = (Vec::with_capacity(positions * half), Vec::with_capacity(positions * half));
        for p in 0..positions {
            for &th in &theta {
                let a = (p as f32 * th) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Rotary { half, cos, sin }
    }

    /// Rotates each pair (x₂ᵢ, x₂ᵢ₊₁) of token p by p·θᵢ: (x₂ᵢ c − x₂ᵢ₊₁ s, x₂ᵢ₊₁ c + x₂ᵢ s),
    /// the tokens at positions `first`, `first` + 1, ...
    fn apply(&self, x: &[f32], first: usize) -> Vec<f32> {
        let d = 2 * self.half;
        let mut out = vec![0f32; x.len()];
        for (p, (o, t)) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)).enumerate() {
            let p = first + p;
            let (c, s) = (&self.cos[p * self.half..][..self.half], &self.sin[p * self.half..][..self.half]);
            for i in 0..self.half {
                let (a, b) = (t[2 * i], t[2 * i + 1]);
                o[2 * i] = a * c[i] + -b * s[i];
                o[2 * i + 1] = b * c[i] + a * s[i];
            }
        }
        out
    }
}

/// `nn.MultiheadAttention` (no mask, eval): in-projection split into q, k, v.
struct Mha {
    heads: usize,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
}

impl Mha {
    fn load(p: &mut Params, prefix: &str, heads: usize) -> Result<Mha> {
        let w = p.vec(&format!("{prefix}.in_proj_weight"))?;
        let b = p.vec(&format!("{prefix}.in_proj_bias"))?;
        let d = b.len() / 3;
        if d % heads != 0 {
            return Err(EngineError::BadInput(format!("{prefix}: {heads} heads do not divide width {d}")));
        }
        for (j, name) in ["q", "k", "v"].iter().enumerate() {
            p.put(format!("{prefix}.{name}.weight"), &[d, d], w[j * d * d..(j + 1) * d * d].to_vec())?;
            p.put(format!("{prefix}.{name}.bias"), &[d], b[j * d..(j + 1) * d].to_vec())?;
        }
        let ws = p.weights();
        let lin = |n: &str| Linear::load(&ws, &format!("{prefix}.{n}"), true);
        Ok(Mha { heads, q: lin("q")?, k: lin("k")?, v: lin("v")?, out: lin("out_proj")? })
    }

    /// out_proj(softmax(q kᵀ/√dₕ) v) per head, with q, k, v the projections of the three inputs
    /// (token-major), plus `residual` if given.
    fn forward(&self, q_in: &[f32], k_in: &[f32], v_in: &[f32], residual: Option<&[f32]>) -> Vec<f32> {
        let (q, k, v) = (self.q.forward(q_in, None), self.k.forward(k_in, None), self.v.forward(v_in, None));
        self.attend(&q, &k, &v, residual)
    }

    /// As [`Mha::forward`] from the projected queries, keys and values.
    fn attend(&self, q: &[f32], k: &[f32], v: &[f32], residual: Option<&[f32]>) -> Vec<f32> {
        let d = self.q.dout;
        let dh = d / self.heads;
        let nk = k.len() / d;
        let nq = q.len() / d;
        let scale = 1.0 / (dh as f32).sqrt();
        // Per head: scores = q kᵀ·scale by GEMM (the heads are column slices of q, k, v with row
        // stride d), softmax per row with the max subtracted, then scores·v.
        let per_head: Vec<Vec<f32>> = (0..self.heads)
            .into_par_iter()
            .map(|h| {
                let mut s = vec![0f32; nq * nk];
                // SAFETY: s is nq x nk; q rows (nq x dh at column h·dh, row stride d) and kᵀ
                // (dh x nk: element (c, j) at k[j·d + h·dh + c]) lie within q and k.
                unsafe {
                    gemm_st(
                        nq,
                        nk,
                        dh,
                        s.as_mut_ptr(),
                        nk,
                        q.as_ptr().add(h * dh),
                        d,
                        1,
                        k.as_ptr().add(h * dh),
                        1,
                        d,
                        scale,
                    )
                };
                softmax_rows(&mut s, nk);
                let mut o = vec![0f32; nq * dh];
                // SAFETY: o is nq x dh; s nq x nk; v's head columns (nk x dh, row stride d).
                unsafe {
                    gemm_st(nq, dh, nk, o.as_mut_ptr(), dh, s.as_ptr(), nk, 1, v.as_ptr().add(h * dh), d, 1, 1.0)
                };
                o
            })
            .collect();
        let mut attn = vec![0f32; q.len()];
        for (h, o) in per_head.iter().enumerate() {
            for (dst, src) in attn.chunks_exact_mut(d).zip(o.chunks_exact(dh)) {
                dst[h * dh..(h + 1) * dh].copy_from_slice(src);
            }
        }
        self.out.forward(&attn, residual)
    }
}

/// `linear2(gelu(linear1(x)))`, plus `residual` if given.
struct FeedForward {
    linear1: Linear,
    linear2: Linear,
}

impl FeedForward {
    fn load(p: &Params, prefix: &str) -> Result<FeedForward> {
        let w = p.weights();
        Ok(FeedForward {
            linear1: Linear::load(&w, &format!("{prefix}.linear1"), true)?,
            linear2: Linear::load(&w, &format!("{prefix}.linear2"), true)?,
        })
    }
    fn forward(&self, x: &[f32], residual: Option<&[f32]>) -> Vec<f32> {
        let mut h = self.linear1.forward(x, None);
        gelu_in_place(&mut h);
        self.linear2.forward(&h, residual)
    }
}

/// Pre-LN encoder layer of the condition encoder (rotary self-attention, GELU feed-forward).
struct EncoderLayer {
    norm1: LayerNorm,
    attn: Mha,
    norm2: LayerNorm,
    ff: FeedForward,
}

impl EncoderLayer {
    fn forward(&self, x: &[f32], rot: &Rotary) -> Vec<f32> {
        let h = self.norm1.forward(x);
        let qk = rot.apply(&h, 0);
        let x = self.attn.forward(&qk, &qk, &h, Some(x));
        self.ff.forward(&self.norm2.forward(&x), Some(&x))
    }
}

/// One FiLM transformer decoder layer.
struct DecoderLayer {
    norm: [LayerNorm; 3],
    self_attn: Mha,
    cross_attn: Mha,
    ff: FeedForward,
    film: [Linear; 3],
}

/// x + ((scale + 1)·y + shift) per token, [scale | shift] one (2d) row.
fn add_film(x: &mut [f32], y: &[f32], ss: &[f32]) {
    let d = ss.len() / 2;
    let (scale, shift) = ss.split_at(d);
    for (xr, yr) in x.chunks_exact_mut(d).zip(y.chunks_exact(d)) {
        for i in 0..d {
            xr[i] += (scale[i] + 1.0) * yr[i] + shift[i];
        }
    }
}

impl DecoderLayer {
    /// `keys`, `values`: the cross-attention's projected memory; `films`: the three FiLM rows
    /// ([scale | shift] of film₁..₃(Mish(t))).
    fn forward(&self, x: &mut [f32], keys: &[f32], values: &[f32], films: &[Vec<f32>; 3], rot: &Rotary) {
        let h = self.norm[0].forward(x);
        let qk = rot.apply(&h, 0);
        let y = self.self_attn.forward(&qk, &qk, &h, None);
        add_film(x, &y, &films[0]);
        let q = self.cross_attn.q.forward(&rot.apply(&self.norm[1].forward(x), 0), None);
        let y = self.cross_attn.attend(&q, keys, values, None);
        add_film(x, &y, &films[1]);
        let y = self.ff.forward(&self.norm[2].forward(x), None);
        add_film(x, &y, &films[2]);
    }
}

/// The cosine schedule's cumulative ᾱ as Ditto's buffer: β from the f64 formula, clipped to
/// [0, 0.999], cast to f32; ᾱ = cumprod(1 − β) (f32 factors, f64 running product as PyTorch's
/// CPU cumprod, f32 results).
pub fn cosine_alphas_cumprod(n: usize, s: f64) -> Vec<f32> {
    let f = |t: usize| ((t as f64 / n as f64 + s) / (1.0 + s) * std::f64::consts::FRAC_PI_2).cos().powi(2);
    let f0 = f(0);
    let mut acc = 1f64;
    (0..n)
        .map(|t| {
            let beta = (1.0 - (f(t + 1) / f0) / (f(t) / f0)).clamp(0.0, 0.999) as f32;
            acc *= (1.0 - beta) as f64;
            acc as f32
        })
        .collect()
}

/// The DDIM steps from the top: int(linspace(−1, T − 1, S + 1)) reversed, with linspace in f32
/// as PyTorch computes it (start + i·step up to the middle, end − (S − i)·step after it) and the
/// cast truncating. Returns the S + 1 times; step k goes from `times[k]` to `times[k + 1]`.
pub fn ddim_times(steps: usize, total: usize) -> Vec<i64> {
    let n = steps + 1;
    let (start, end) = (-1f32, (total - 1) as f32);
    let step = (end - start) / steps as f32;
    let mut t: Vec<i64> = (0..n)
        .map(|i| {
            let v = if i < n / 2 { start + step * i as f32 } else { end - step * (n - 1 - i) as f32 };
            v as i64
        })
        .collect();
    t.reverse();
    t
}

/// One DDIM update with eta = 1: x₀·√ᾱₙ + c·ε + σ·z, the scalars in f32 as Ditto's tensors.
pub fn ddim_update(x_start: &[f32], pred_noise: &[f32], noise: &[f32], alpha: f32, alpha_next: f32) -> Vec<f32> {
    let sigma = ((1.0 - alpha / alpha_next) * (1.0 - alpha_next) / (1.0 - alpha)).sqrt();
    let c = (1.0 - alpha_next - sigma * sigma).sqrt();
    let a = alpha_next.sqrt();
    x_start.iter().zip(pred_noise).zip(noise).map(|((x0, e), z)| x0 * a + c * e + sigma * z).collect()
}

/// The sampler's noise: the initial x and one draw per DDIM step but the last, each
/// seq_len × nfeats.
#[derive(Debug, Clone, PartialEq)]
pub struct DdimNoise {
    pub init: Vec<f32>,
    pub steps: Vec<Vec<f32>>,
}

impl DdimNoise {
    /// Standard normal draws from the engines' seeded generator.
    pub fn seeded(seed: u64, steps: usize, len: usize) -> DdimNoise {
        let draw = |name: String| synthetic_values(seed, &name, len, Init::Normal(1.0));
        DdimNoise {
            init: draw("lmdm.noise.init".into()),
            steps: (0..steps.saturating_sub(1)).map(|i| draw(format!("lmdm.noise.{i}"))).collect(),
        }
    }
}

/// The condition as the decoder layers read it. The memory's first seq_len rows (the condition
/// tokens after `norm_cond`; LayerNorm is per token) do not depend on x or the step, so their
/// cross-attention keys and values are computed here once per window (the null condition's once
/// per model); only the two time tokens' rows are projected at every step.
struct EncodedCondition {
    /// Per decoder layer: keys (from the rotated rows) and values, seq_len × latent each.
    kv: Vec<(Vec<f32>, Vec<f32>)>,
    /// The pooled hidden state (latent) that joins the time embedding.
    hidden: Vec<f32>,
}

/// What a forward computes from the diffusion step alone, the same in both guidance passes and
/// in every window: computed once per step value ([`MotionDecoder::time_terms`]).
struct TimeTerms {
    /// to_time_cond(Mish(time_mlp(embedding))), before the condition's hidden state joins it.
    t_base: Vec<f32>,
    /// Per decoder layer: the cross-attention keys and values of the two time tokens.
    kv: Vec<(Vec<f32>, Vec<f32>)>,
    /// Per decoder layer: the null pass's three FiLM rows (its hidden state is fixed).
    null_films: Vec<[Vec<f32>; 3]>,
}

/// One sampler step's results (Ditto's ONNX outputs `pred_noise`, `x_start`).
pub struct Step {
    pub pred_noise: Vec<f32>,
    pub x_start: Vec<f32>,
}

/// The MotionDecoder with its weights packed for the CPU path, and the schedule.
pub struct MotionDecoder {
    cfg: LmdmConfig,
    input_projection: Linear,
    cond_projection: Linear,
    cond_encoder: Vec<EncoderLayer>,
    non_attn: (LayerNorm, Linear, Linear),
    time_mlp: Linear,
    to_time_cond: Linear,
    to_time_tokens: Linear,
    norm_cond: LayerNorm,
    decoder: Vec<DecoderLayer>,
    final_layer: Linear,
    rotary: Rotary,
    alphas_cumprod: Vec<f32>,
    /// The guidance's null condition (`null_cond_embed`, `null_cond_hidden`), encoded.
    null: EncodedCondition,
    /// [`TimeTerms`] by step value: at most [`NUM_TIMESTEPS`] entries (50 for Ditto's sampler,
    /// reused by every window of a clip).
    time_terms: Mutex<HashMap<i64, Arc<TimeTerms>>>,
}

impl MotionDecoder {
    pub fn new(cfg: &LmdmConfig, source: &WeightsSource) -> Result<MotionDecoder> {
        let mut p = Params::obtain(&cfg.param_table(), source, &normalize)?;
        let heads = cfg.heads;
        let cond_encoder = (0..2)
            .map(|i| {
                let pre = format!("cond_encoder.{i}");
                let w = p.weights();
                let (norm1, norm2) =
                    (LayerNorm::load(&w, &format!("{pre}.norm1"))?, LayerNorm::load(&w, &format!("{pre}.norm2"))?);
                Ok(EncoderLayer {
                    norm1,
                    norm2,
                    ff: FeedForward::load(&p, &pre)?,
                    attn: Mha::load(&mut p, &format!("{pre}.self_attn"), heads)?,
                })
            })
            .collect::<Result<_>>()?;
        let decoder = (0..cfg.layers)
            .map(|i| {
                let pre = format!("seqTransDecoder.stack.{i}");
                let self_attn = Mha::load(&mut p, &format!("{pre}.self_attn"), heads)?;
                let cross_attn = Mha::load(&mut p, &format!("{pre}.multihead_attn"), heads)?;
                let w = p.weights();
                let norm = |n: usize| LayerNorm::load(&w, &format!("{pre}.norm{n}"));
                let film = |n: usize| Linear::load(&w, &format!("{pre}.film{n}.block.1"), true);
                Ok(DecoderLayer {
                    norm: [norm(1)?, norm(2)?, norm(3)?],
                    self_attn,
                    cross_attn,
                    ff: FeedForward::load(&p, &pre)?,
                    film: [film(1)?, film(2)?, film(3)?],
                })
            })
            .collect::<Result<_>>()?;
        let w = p.weights();
        let lin = |n: &str| Linear::load(&w, n, true);
        let mut net = MotionDecoder {
            cfg: cfg.clone(),
            input_projection: lin("input_projection")?,
            cond_projection: lin("cond_projection")?,
            cond_encoder,
            non_attn: (
                LayerNorm::load(&w, "non_attn_cond_projection.0")?,
                lin("non_attn_cond_projection.1")?,
                lin("non_attn_cond_projection.3")?,
            ),
            time_mlp: lin("time_mlp.1")?,
            to_time_cond: lin("to_time_cond.0")?,
            to_time_tokens: lin("to_time_tokens.0")?,
            norm_cond: LayerNorm::load(&w, "norm_cond")?,
            decoder,
            final_layer: lin("final_layer")?,
            rotary: Rotary::new(cfg.latent, cfg.seq_len + 2),
            alphas_cumprod: cosine_alphas_cumprod(NUM_TIMESTEPS, COSINE_S),
            null: EncodedCondition { kv: Vec::new(), hidden: Vec::new() },
            time_terms: Mutex::default(),
        };
        net.null = net.encode_tokens(&p.vec("null_cond_embed")?, p.vec("null_cond_hidden")?);
        Ok(net)
    }

    pub fn config(&self) -> &LmdmConfig {
        &self.cfg
    }

    /// The schedule's ᾱ (f32, [`NUM_TIMESTEPS`]).
    pub fn alphas_cumprod(&self) -> &[f32] {
        &self.alphas_cumprod
    }

    fn check(&self, x: &[f32], cond_frame: &[f32], cond: &[f32], time: i64) -> Result<()> {
        let c = &self.cfg;
        for (name, v, want) in [
            ("x", x, c.seq_len * c.nfeats),
            ("cond_frame", cond_frame, c.nfeats),
            ("cond", cond, c.seq_len * c.cond_dim),
        ] {
            if v.len() != want {
                return Err(EngineError::BadInput(format!("LMDM `{name}`: {} values, expected {want}", v.len())));
            }
            if let Some(i) = v.iter().position(|v| !v.is_finite()) {
                return Err(EngineError::BadInput(format!("LMDM `{name}`: value {i} is {}", v[i])));
            }
        }
        if !(0..NUM_TIMESTEPS as i64).contains(&time) {
            return Err(EngineError::BadInput(format!("LMDM `time_cond` {time} outside 0..{NUM_TIMESTEPS}")));
        }
        Ok(())
    }

    /// One unguided forward: x (seq_len, nfeats), cond_frame (nfeats), cond (seq_len, cond_dim),
    /// diffusion step `time`; `conditioned` false is the guidance's null-condition pass.
    /// Returns x₀ (seq_len, nfeats).
    pub fn forward(
        &self,
        x: &[f32],
        cond_frame: &[f32],
        cond: &[f32],
        time: i64,
        conditioned: bool,
    ) -> Result<Vec<f32>> {
        self.check(x, cond_frame, cond, time)?;
        Ok(self.forward_unchecked(x, cond_frame, cond, time, conditioned))
    }

    fn forward_unchecked(&self, x: &[f32], cond_frame: &[f32], cond: &[f32], time: i64, conditioned: bool) -> Vec<f32> {
        let terms = self.time_terms(time);
        if conditioned {
            let c = self.encode_condition(cond);
            self.forward_encoded(x, cond_frame, &c, &terms, &self.films(&terms.t_base, &c.hidden))
        } else {
            self.forward_encoded(x, cond_frame, &self.null, &terms, &terms.null_films)
        }
    }

    /// The condition encoder's output for `cond`: it depends on neither x nor the step, so a
    /// sampler encodes each window's condition once, not once per step (the same numbers).
    fn encode_condition(&self, cond: &[f32]) -> EncodedCondition {
        let (n, d) = (self.cfg.seq_len, self.cfg.latent);
        let mut tok = self.cond_projection.forward(cond, None);
        for layer in &self.cond_encoder {
            tok = layer.forward(&tok, &self.rotary);
        }
        let mean: Vec<f32> =
            (0..d).map(|c| (tok.iter().skip(c).step_by(d).map(|&v| v as f64).sum::<f64>() / n as f64) as f32).collect();
        let (ln, l1, l2) = &self.non_attn;
        let mut a = l1.forward(&ln.forward(&mean), None);
        a.iter_mut().for_each(|v| *v = silu(*v));
        self.encode_tokens(&tok, l2.forward(&a, None))
    }

    /// The memory rows of condition `tokens` (seq_len × latent) projected to every decoder
    /// layer's cross-attention keys and values.
    fn encode_tokens(&self, tokens: &[f32], hidden: Vec<f32>) -> EncodedCondition {
        let memory = self.norm_cond.forward(tokens);
        let rotated = self.rotary.apply(&memory, 0);
        let kv = self
            .decoder
            .iter()
            .map(|l| (l.cross_attn.k.forward(&rotated, None), l.cross_attn.v.forward(&memory, None)))
            .collect();
        EncodedCondition { kv, hidden }
    }

    /// The [`TimeTerms`] of step `time`, computed on first use.
    fn time_terms(&self, time: i64) -> Arc<TimeTerms> {
        let mut memo = self.time_terms.lock().unwrap_or_else(|e| e.into_inner());
        memo.entry(time).or_insert_with(|| Arc::new(self.compute_time_terms(time))).clone()
    }

    fn compute_time_terms(&self, time: i64) -> TimeTerms {
        let d = self.cfg.latent;
        // Sinusoidal embedding: frequencies and angles in f32 as SinusoidalPosEmb's tensors.
        let half = d / 2;
        let e = (10000f64.ln() / (half - 1) as f64) as f32;
        let args: Vec<f32> = (0..half).map(|i| time as f32 * ((i as f32 * -e) as f64).exp() as f32).collect();
        let emb: Vec<f32> = args
            .iter()
            .map(|&a| (a as f64).sin() as f32)
            .chain(args.iter().map(|&a| (a as f64).cos() as f32))
            .collect();
        let mut t_hidden = self.time_mlp.forward(&emb, None);
        t_hidden.iter_mut().for_each(|v| *v = mish(*v));
        let t_base = self.to_time_cond.forward(&t_hidden, None);
        // The memory's last two rows, the time tokens, at positions seq_len and seq_len + 1.
        let memory = self.norm_cond.forward(&self.to_time_tokens.forward(&t_hidden, None));
        let rotated = self.rotary.apply(&memory, self.cfg.seq_len);
        let kv = self
            .decoder
            .iter()
            .map(|l| (l.cross_attn.k.forward(&rotated, None), l.cross_attn.v.forward(&memory, None)))
            .collect();
        let null_films = self.films(&t_base, &self.null.hidden);
        TimeTerms { t_base, kv, null_films }
    }

    /// Every decoder layer's FiLM rows from t = t_base + hidden (added in that order, as the
    /// linear's epilogue adds a residual after the bias): film_k(Mish(t)).
    fn films(&self, t_base: &[f32], hidden: &[f32]) -> Vec<[Vec<f32>; 3]> {
        let mish_t: Vec<f32> = t_base.iter().zip(hidden).map(|(t, h)| mish(t + h)).collect();
        self.decoder.iter().map(|l| l.film.each_ref().map(|f| f.forward(&mish_t, None))).collect()
    }

    /// One forward under condition `c` at the step of `terms`, with `films` the FiLM rows of
    /// that condition and step ([`Self::films`], or the null pass's in `terms`).
    fn forward_encoded(
        &self,
        x: &[f32],
        cond_frame: &[f32],
        c: &EncodedCondition,
        terms: &TimeTerms,
        films: &[[Vec<f32>; 3]],
    ) -> Vec<f32> {
        let f = self.cfg.nfeats;
        let mut inp = Vec::with_capacity(self.cfg.seq_len * 2 * f);
        for row in x.chunks_exact(f) {
            inp.extend_from_slice(row);
            inp.extend_from_slice(cond_frame);
        }
        let mut h = self.input_projection.forward(&inp, None);
        for (((layer, (k, v)), (tk, tv)), film) in self.decoder.iter().zip(&c.kv).zip(&terms.kv).zip(films) {
            let keys = [k.as_slice(), tk].concat();
            let values = [v.as_slice(), tv].concat();
            layer.forward(&mut h, &keys, &values, film, &self.rotary);
        }
        self.final_layer.forward(&h, None)
    }

    /// One sampler step as Ditto's ONNX export (`x`, `cond_frame`, `cond`, `time_cond` ->
    /// `pred_noise`, `x_start`): the guided x₀ = unc + 2·(cond − unc) and the noise it implies.
    pub fn step(&self, x: &[f32], cond_frame: &[f32], cond: &[f32], time: i64) -> Result<Step> {
        self.check(x, cond_frame, cond, time)?;
        Ok(self.guided_step(x, cond_frame, &self.encode_condition(cond), time))
    }

    fn guided_step(&self, x: &[f32], cond_frame: &[f32], encoded: &EncodedCondition, time: i64) -> Step {
        // The two passes in parallel, each on one thread: splitting each GEMM between the
        // threads instead (reading the weights once) measured about a third slower: its many
        // joins wake a sleeping thread dozens of times a step.
        let terms = self.time_terms(time);
        let (unc, con) = rayon::join(
            || self.forward_encoded(x, cond_frame, &self.null, &terms, &terms.null_films),
            || self.forward_encoded(x, cond_frame, encoded, &terms, &self.films(&terms.t_base, &encoded.hidden)),
        );
        let x_start: Vec<f32> = unc.iter().zip(&con).map(|(u, c)| u + (c - u) * GUIDANCE).collect();
        let ac = self.alphas_cumprod[time as usize];
        // Ditto's buffers sqrt(1/(1 − ᾱ)) and sqrt(1/ᾱ − 1), in f32.
        let (a, b) = ((1.0 / (1.0 - ac)).sqrt(), (1.0 / ac - 1.0).sqrt());
        let pred_noise = x.iter().zip(&x_start).map(|(xt, x0)| a * xt - x0 / b).collect();
        Step { pred_noise, x_start }
    }

    /// DDIM with eta = 1 over `steps` steps from `noise` (its `init` is x at the first step, and
    /// it needs steps − 1 further draws). Returns the motion (seq_len, nfeats).
    pub fn sample(&self, cond_frame: &[f32], cond: &[f32], steps: usize, noise: &DdimNoise) -> Result<Vec<f32>> {
        if steps == 0 || steps > NUM_TIMESTEPS || noise.steps.len() + 1 < steps {
            return Err(EngineError::BadInput(format!(
                "LMDM sampler: {steps} steps (1..={NUM_TIMESTEPS}) with {} noise draws",
                noise.steps.len()
            )));
        }
        let want = self.cfg.seq_len * self.cfg.nfeats;
        if let Some(bad) = noise.steps.iter().take(steps - 1).find(|z| z.len() != want) {
            return Err(EngineError::BadInput(format!(
                "LMDM sampler: a noise draw of {} values, expected {want}",
                bad.len()
            )));
        }
        let encoded = self.encode_condition(cond);
        let times = ddim_times(steps, NUM_TIMESTEPS);
        let mut x = noise.init.clone();
        for (k, pair) in times.windows(2).enumerate() {
            self.check(&x, cond_frame, cond, pair[0])?;
            let s = self.guided_step(&x, cond_frame, &encoded, pair[0]);
            if pair[1] < 0 {
                return Ok(s.x_start);
            }
            let (a, an) = (self.alphas_cumprod[pair[0] as usize], self.alphas_cumprod[pair[1] as usize]);
            x = ddim_update(&s.x_start, &s.pred_noise, &noise.steps[k], a, an);
        }
        Ok(x)
    }
}

/// Crossfade weights of `fuse` frames: i / fuse (the previous window's share is 1 − that).
pub fn fuse_alpha(fuse: usize) -> Vec<f32> {
    (0..fuse).map(|i| i as f32 / fuse as f32).collect()
}

/// Appends a new window `pred` (seq_len rows of `dim`) to `res` as Ditto's offline fuse: the last
/// `overlap` rows of `res` become (1 − αᵢ)·res + αᵢ·`pred[i]`, and pred's rows from `overlap` on are
/// appended (seq_len − overlap new frames).
pub fn fuse_window(res: &mut Vec<f32>, pred: &[f32], dim: usize, overlap: usize) {
    let n = res.len() / dim;
    let alpha = fuse_alpha(overlap);
    for (i, a) in alpha.iter().enumerate() {
        let r = &mut res[(n - overlap + i) * dim..][..dim];
        r.iter_mut().zip(&pred[i * dim..(i + 1) * dim]).for_each(|(r, p)| *r = *r * (1.0 - a) + p * a);
    }
    res.extend_from_slice(&pred[overlap * dim..]);
}

/// Ditto's `_smo`: rows s..e of the first `dims` features become the mean over the rows
/// [i − k/2, i + k/2] (clipped to the sequence) of the values before smoothing.
pub fn smooth(res: &mut [f32], dim: usize, s: usize, e: usize, k: usize, dims: usize) {
    if k <= 1 {
        return;
    }
    let n = res.len() / dim;
    let before = res.to_vec();
    let half = k / 2;
    for i in s..e.min(n) {
        let (lo, hi) = (i.saturating_sub(half), (i + half + 1).min(n));
        for c in 0..dims.min(dim) {
            res[i * dim + c] = row_mean(&before, dim, lo, hi, c);
        }
    }
}

/// The mean of feature `c` over rows lo..hi, summed in order in f32: the one rule of the
/// windows' smoothing and of the final one ([`MotionStream`]'s release).
fn row_mean(rows: &[f32], dim: usize, lo: usize, hi: usize, c: usize) -> f32 {
    let sum: f32 = (lo..hi).map(|j| rows[j * dim + c]).sum();
    sum / (hi - lo) as f32
}

/// Frames averaged by Ditto's smoothing.
const SMOOTH_K: usize = 3;

/// Ditto's offline audio-to-motion over a whole clip: windows of `seq_len` frames every
/// seq_len − overlap (the last one padded with the condition's last row), each sampled by
/// `sample(cond_frame, window_cond)`, crossfaded and smoothed (k = 3 on [`SMOOTH_DIMS`]) as the
/// module docs say; the first `cond_frame` is the source's motion `kp_source`. Returns N × dim.
/// It is [`MotionStream`] given the whole condition at once.
pub fn offline_motion(
    cond_all: &[f32],
    cond_dim: usize,
    kp_source: &[f32],
    seq_len: usize,
    overlap: usize,
    sample: impl FnMut(&[f32], &[f32]) -> Result<Vec<f32>>,
) -> Result<Vec<f32>> {
    if cond_all.is_empty() {
        return Err(EngineError::BadInput("motion windows: no condition (need at least one frame)".into()));
    }
    let mut stream = MotionStream::new(cond_dim, kp_source, seq_len, overlap)?;
    stream.push(cond_all)?;
    stream.finish();
    stream.step(sample)
}

/// [`offline_motion`] over a condition that arrives a few rows at a time (a live stream), with
/// the same result: a window is sampled as soon as its `seq_len` condition rows have arrived (the
/// last one, padded, once the stream has ended), and a frame's final motion is handed out as
/// soon as nothing later can change it: when the next window's crossfade and the final smoothing
/// no longer reach it, about `seq_len` frames behind the condition. Memory is bounded by a
/// window, whatever the stream's length.
pub struct MotionStream {
    cond_dim: usize,
    dim: usize,
    seq_len: usize,
    overlap: usize,
    /// Condition rows from frame `cond_from` on.
    cond: Vec<f32>,
    cond_from: usize,
    ended: bool,
    /// The next window's first frame.
    idx: usize,
    windows: usize,
    kp_cond: Vec<f32>,
    /// Motion rows before the final smoothing, from frame `res_from` on.
    res: Vec<f32>,
    res_from: usize,
    /// Frames whose final motion was handed out.
    released: usize,
}

impl MotionStream {
    /// A stream of condition rows of `cond_dim`, the first window conditioned on `kp_source`.
    pub fn new(cond_dim: usize, kp_source: &[f32], seq_len: usize, overlap: usize) -> Result<Self> {
        if cond_dim == 0 || kp_source.is_empty() || overlap >= seq_len {
            return Err(EngineError::BadInput(format!(
                "motion windows: condition width {cond_dim}, motion width {}, overlap {overlap} of {seq_len}",
                kp_source.len()
            )));
        }
        Ok(Self {
            cond_dim,
            dim: kp_source.len(),
            seq_len,
            overlap,
            cond: Vec::new(),
            cond_from: 0,
            ended: false,
            idx: 0,
            windows: 0,
            kp_cond: kp_source.to_vec(),
            res: Vec::new(),
            res_from: 0,
            released: 0,
        })
    }

    /// Condition rows received so far.
    pub fn frames_received(&self) -> usize {
        self.cond_from + self.cond.len() / self.cond_dim
    }

    /// Frames whose final motion has been handed out.
    pub fn frames_released(&self) -> usize {
        self.released
    }

    /// Appends condition rows (a whole number of rows, every value finite).
    pub fn push(&mut self, rows: &[f32]) -> Result<()> {
        if self.ended {
            return Err(EngineError::BadInput("motion windows: condition after the end of the stream".into()));
        }
        if !rows.len().is_multiple_of(self.cond_dim) {
            return Err(EngineError::BadInput(format!(
                "motion windows: {} condition values are not rows of {}",
                rows.len(),
                self.cond_dim
            )));
        }
        if let Some(i) = rows.iter().position(|v| !v.is_finite()) {
            let at = self.frames_received() * self.cond_dim + i;
            return Err(EngineError::BadInput(format!("motion windows: condition value {at} is {}", rows[i])));
        }
        self.cond.extend_from_slice(rows);
        Ok(())
    }

    /// Marks the end of the condition: the last window may be sampled padded.
    pub fn finish(&mut self) {
        self.ended = true;
    }

    /// Whether every frame's motion has been handed out.
    pub fn is_done(&self) -> bool {
        self.ended && self.released == self.frames_received()
    }

    /// Samples every window whose condition has arrived (`sample(cond_frame, window_cond)`) and
    /// returns the rows (frames × dim) whose motion became final, in order after those returned
    /// before.
    pub fn step(&mut self, mut sample: impl FnMut(&[f32], &[f32]) -> Result<Vec<f32>>) -> Result<Vec<f32>> {
        let (dim, cd, seq_len, overlap) = (self.dim, self.cond_dim, self.seq_len, self.overlap);
        let valid = seq_len - overlap;
        loop {
            let total = self.frames_received();
            let ready = if self.ended { self.idx < total } else { total >= self.idx + seq_len };
            if !ready {
                break;
            }
            let rows =
                &self.cond[(self.idx - self.cond_from) * cd..((self.idx + seq_len).min(total) - self.cond_from) * cd];
            let mut window = rows.to_vec();
            let last = window[window.len() - cd..].to_vec();
            while window.len() < seq_len * cd {
                window.extend_from_slice(&last);
            }
            let pred = sample(&self.kp_cond, &window)?;
            if pred.len() != seq_len * dim {
                return Err(EngineError::BadInput(format!(
                    "motion windows: a window of {} values, expected {}",
                    pred.len(),
                    seq_len * dim
                )));
            }
            if self.windows == 0 {
                self.res = pred;
                smooth(&mut self.res, dim, 0, seq_len, SMOOTH_K, SMOOTH_DIMS);
            } else {
                // Rows from the one before this window's first on are kept (`forget`), so the
                // smoothing's clipping at row 0 is the sequence's own.
                fuse_window(&mut self.res, &pred, dim, overlap);
                let n = self.res.len() / dim;
                smooth(&mut self.res, dim, n - valid - overlap, n - valid + 1, SMOOTH_K, SMOOTH_DIMS);
            }
            self.windows += 1;
            let at = self.res.len() / dim - overlap;
            self.kp_cond = self.res[(at - 1) * dim..at * dim].to_vec();
            self.idx += valid;
        }
        let out = self.release();
        self.forget();
        Ok(out)
    }

    /// The final rows now known: the mean over frames i − 1..=i + 1 (clipped to the clip) of
    /// the first [`SMOOTH_DIMS`] features, once frame i + 1 is fixed.
    fn release(&mut self) -> Vec<f32> {
        let dim = self.dim;
        let total = self.frames_received();
        let done = self.ended && self.idx >= total;
        let end = if done {
            // The sequence is cut to the clip's frames before the final smoothing.
            self.res.truncate((total - self.res_from) * dim);
            total
        } else if self.windows == 0 {
            0
        } else {
            // The last `overlap` rows change with the next window; a row's final value needs
            // the next row.
            (self.res_from + self.res.len() / dim - self.overlap).saturating_sub(1)
        };
        let n = self.res.len() / dim;
        let mut out = Vec::with_capacity(end.saturating_sub(self.released) * dim);
        for f in self.released..end {
            let i = f - self.res_from;
            let (lo, hi) = (i.saturating_sub(SMOOTH_K / 2), (i + SMOOTH_K / 2 + 1).min(n));
            let row = &self.res[i * dim..(i + 1) * dim];
            out.extend((0..dim).map(|c| if c < SMOOTH_DIMS { row_mean(&self.res, dim, lo, hi, c) } else { row[c] }));
        }
        self.released = self.released.max(end);
        out
    }

    /// Drops the condition rows before the next window and the motion rows no later window or
    /// release reads (each keeps the row before the first it needs: smoothing reads it).
    fn forget(&mut self) {
        let n = self.idx.min(self.frames_received()) - self.cond_from;
        self.cond.drain(..n * self.cond_dim);
        self.cond_from += n;
        let keep = self.released.saturating_sub(1).min(self.idx.saturating_sub(1));
        if self.windows > 0 && keep > self.res_from {
            let n = (keep - self.res_from).min(self.res.len() / self.dim);
            self.res.drain(..n * self.dim);
            self.res_from += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ᾱ against the closed form: the product telescopes to f(t + 1)/f(0) while no β is
    /// clipped; the last β is clipped to 0.999 (f(T) = 0).
    #[test]
    fn cosine_schedule_matches_f64_formula() {
        let ac = cosine_alphas_cumprod(1000, COSINE_S);
        let s = COSINE_S;
        let f = |t: f64| ((t / 1000.0 + s) / (1.0 + s) * std::f64::consts::FRAC_PI_2).cos().powi(2);
        let mut worst = 0f64;
        for (t, &a) in ac.iter().enumerate().take(999) {
            let want = f(t as f64 + 1.0) / f(0.0);
            worst = worst.max((a as f64 - want).abs() / want);
        }
        // f32 β and f32 results: a few ulps of relative error accumulate over 999 factors.
        assert!(worst < 2e-5, "relative error {worst}");
        let want_last = f(999.0) / f(0.0) * 0.001;
        assert!((ac[999] as f64 - want_last).abs() / want_last < 1e-4, "{} vs {want_last}", ac[999]);
        assert!((ac[0] as f64 - f(1.0) / f(0.0)).abs() < 1e-7);
    }

    /// DDIM eta = 1 on numbers worked by hand: ᾱₜ = 0.25, ᾱₙ = 0.5 gives σ² = (1 − 0.5)(0.5)/0.75
    /// = 1/3, c = √(1 − 0.5 − 1/3) = √(1/6), √ᾱₙ = √0.5.
    #[test]
    fn ddim_update_with_eta_one_on_known_numbers() {
        let out = ddim_update(&[1.0, -2.0], &[0.5, 0.0], &[2.0, 1.0], 0.25, 0.5);
        let (sig, c, a) = ((1f64 / 3.0).sqrt(), (1f64 / 6.0).sqrt(), 0.5f64.sqrt());
        let want = [a + c * 0.5 + sig * 2.0, -2.0 * a + sig];
        for (o, w) in out.iter().zip(want) {
            assert!((*o as f64 - w).abs() < 1e-6, "{o} vs {w}");
        }
    }

    #[test]
    fn ddim_times_truncate_an_f32_linspace() {
        assert_eq!(ddim_times(1, 1000), [999, -1]);
        assert_eq!(ddim_times(4, 1000), [999, 749, 499, 249, -1]);
        // 1000/3 is not exact: 332.33 and 665.67 truncate down.
        assert_eq!(ddim_times(3, 1000), [999, 665, 332, -1]);
        let t = ddim_times(50, 1000);
        assert_eq!((t.len(), t[0], t[1], t[49], t[50]), (51, 999, 979, 19, -1));
    }

    #[test]
    fn crossfade_weights_and_fuse() {
        assert_eq!(fuse_alpha(4), [0.0, 0.25, 0.5, 0.75]);
        // 3 frames of 1 feature, window of 4 with overlap 2.
        let mut res = vec![1.0, 2.0, 3.0];
        fuse_window(&mut res, &[10.0, 20.0, 30.0, 40.0], 1, 2);
        assert_eq!(res, [1.0, 2.0, 3.0 * 0.5 + 20.0 * 0.5, 30.0, 40.0]);
    }

    #[test]
    fn smoothing_averages_three_frames_of_the_leading_dims_only() {
        // 4 frames of 2 features; smooth dim 0 only.
        let mut r = vec![0.0, 5.0, 3.0, 6.0, 6.0, 7.0, 9.0, 8.0];
        smooth(&mut r, 2, 0, 4, 3, 1);
        assert_eq!(r, [1.5, 5.0, 3.0, 6.0, 6.0, 7.0, 7.5, 8.0]);
    }

    /// Windows of 4 with overlap 1 over 7 frames: starts 0, 3, 6 (the last padded), each new
    /// window conditioned on the frame before the overlap.
    #[test]
    fn offline_windows_pad_chain_and_cut() {
        let cond: Vec<f32> = (0..7).map(|v| v as f32).collect();
        let mut seen = Vec::new();
        let out = offline_motion(&cond, 1, &[100.0], 4, 1, |kp, w| {
            seen.push((kp[0], w.to_vec()));
            Ok(w.to_vec())
        })
        .unwrap();
        assert_eq!(seen[0], (100.0, vec![0.0, 1.0, 2.0, 3.0]));
        assert_eq!(seen[1].1, [3.0, 4.0, 5.0, 6.0]);
        assert_eq!(seen[2].1, [6.0, 6.0, 6.0, 6.0]);
        assert_eq!(seen.len(), 3);
        // The next cond_frame is the (smoothed) frame before the overlap: mean(1, 2, 3), then
        // frame 5 of the fused sequence.
        assert_eq!((seen[1].0, seen[2].0), (2.0, 5.0));
        // Worked by hand: window 1 smoothed [0.5, 1, 2, 2.5]; window 2 fused (α = 0 keeps 2.5)
        // and rows 3, 4 smoothed -> [.., 8.5/3, 11.5/3, 5, 6]; window 3 -> row 6 = 17/3; cut to
        // 7 frames and smoothed once more.
        let r = [0.5, 1.0, 2.0, 8.5 / 3.0, 11.5 / 3.0, 5.0, 17.0 / 3.0];
        let want = [
            (r[0] + r[1]) / 2.0,
            (r[0] + r[1] + r[2]) / 3.0,
            (r[1] + r[2] + r[3]) / 3.0,
            (r[2] + r[3] + r[4]) / 3.0,
            (r[3] + r[4] + r[5]) / 3.0,
            (r[4] + r[5] + r[6]) / 3.0,
            (r[5] + r[6]) / 2.0,
        ];
        assert_eq!(out.len(), 7);
        for (g, w) in out.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-5, "{out:?} vs {want:?}");
        }
        assert!(offline_motion(&[f32::NAN], 1, &[0.0], 4, 1, |_, w| Ok(w.to_vec())).is_err());
        assert!(offline_motion(&[], 1, &[0.0], 4, 1, |_, w| Ok(w.to_vec())).is_err());
    }

    /// Ditto's offline windows over the whole array at once, written as `audio2motion.py` reads
    /// (the reference for [`MotionStream`], which keeps a window's rows only).
    fn whole_array_motion(
        cond: &[f32],
        cd: usize,
        kp: &[f32],
        seq_len: usize,
        overlap: usize,
        mut sample: impl FnMut(&[f32], &[f32]) -> Vec<f32>,
    ) -> Vec<f32> {
        let (dim, frames, valid) = (kp.len(), cond.len() / cd, seq_len - overlap);
        let (mut kp_cond, mut res, mut idx) = (kp.to_vec(), Vec::<f32>::new(), 0);
        while idx < frames {
            let mut w = cond[idx * cd..(idx + seq_len).min(frames) * cd].to_vec();
            let last = w[w.len() - cd..].to_vec();
            while w.len() < seq_len * cd {
                w.extend_from_slice(&last);
            }
            let pred = sample(&kp_cond, &w);
            if res.is_empty() {
                res = pred;
                smooth(&mut res, dim, 0, seq_len, 3, SMOOTH_DIMS);
            } else {
                fuse_window(&mut res, &pred, dim, overlap);
                let n = res.len() / dim;
                smooth(&mut res, dim, n - valid - overlap, n - valid + 1, 3, SMOOTH_DIMS);
            }
            let at = res.len() / dim - overlap;
            kp_cond = res[(at - 1) * dim..at * dim].to_vec();
            idx += valid;
        }
        res.truncate(frames * dim);
        smooth(&mut res, dim, 0, frames, 3, SMOOTH_DIMS);
        res
    }

    /// A stream fed a few rows at a time, stepped after each, hands out the whole-array motion
    /// (bit for bit) for clips shorter than a window, of exactly one, and of many, with a
    /// sampler that depends on its condition frame and on every window row; each row is handed
    /// out well before the end once its window has been sampled.
    #[test]
    fn a_stream_gives_the_whole_clip_motion_piece_by_piece() {
        let cd = 2;
        let dim = SMOOTH_DIMS + 3; // smoothed and unsmoothed features
        for (seq_len, overlap) in [(8usize, 2usize), (5, 1), (80, 10)] {
            for frames in [1usize, 3, seq_len, seq_len + 1, 3 * seq_len + 7, 250] {
                let cond: Vec<f32> = (0..frames * cd).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
                let kp: Vec<f32> = (0..dim).map(|c| c as f32 * 0.01).collect();
                let sampler = |kp: &[f32], w: &[f32]| -> Vec<f32> {
                    let wsum: f32 = w.iter().enumerate().map(|(i, v)| v * (1.0 + i as f32 * 1e-3)).sum();
                    (0..seq_len * dim)
                        .map(|i| kp[i % dim] * 0.5 + w[(i / dim) * cd + i % cd] + wsum * 1e-3 + (i % 7) as f32)
                        .collect()
                };
                let want = whole_array_motion(&cond, cd, &kp, seq_len, overlap, sampler);
                let mut stream = MotionStream::new(cd, &kp, seq_len, overlap).unwrap();
                let mut got = Vec::new();
                let mut at = 0;
                for piece in [1usize, 4, 2, 9, 3].iter().cycle() {
                    if at >= frames {
                        break;
                    }
                    let to = (at + piece).min(frames);
                    stream.push(&cond[at * cd..to * cd]).unwrap();
                    at = to;
                    got.extend(stream.step(|k, w| Ok(sampler(k, w))).unwrap());
                    assert_eq!(got.len(), stream.frames_released() * dim);
                    if at < frames {
                        // No more than a window behind the condition.
                        assert!(stream.frames_released() + seq_len >= at, "{at}: {}", stream.frames_released());
                    }
                    assert!(stream.res.len() <= (seq_len + 2) * dim * 2, "the stream keeps a bounded history");
                }
                assert!(!stream.is_done() || frames == 0);
                stream.finish();
                got.extend(stream.step(|k, w| Ok(sampler(k, w))).unwrap());
                assert!(stream.is_done());
                assert_eq!(got.len(), want.len(), "seq {seq_len}, {frames} frames");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "seq {seq_len}, {frames} frames: value {i}: {g} vs {w}");
                }
            }
        }
        let mut s = MotionStream::new(2, &[0.0], 4, 1).unwrap();
        assert!(s.push(&[1.0]).is_err(), "half a row");
        assert!(s.push(&[1.0, f32::INFINITY]).is_err());
        s.finish();
        assert!(s.push(&[1.0, 2.0]).is_err(), "after the end");
        assert!(MotionStream::new(2, &[0.0], 4, 4).is_err());
    }
}
