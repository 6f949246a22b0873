//! CPU fast path for the whisper-tiny encoder's forward (the hidden states MuseTalk takes, see
//! [`crate::whisper`]): the same network on token-major (time x channels) activations.
//!
//! Hand-written because candle 0.11's op-by-op forward reached about a quarter of its own
//! matmul rate here: its 1D convolutions, the per-head layout copies, the materialised 1500 x
//! 1500 scores per head and separate bias, GELU and residual passes. This path runs both
//! convolutions as im2col + gemm with bias and exact GELU in the epilogue, and the blocks with
//! the UNet path's layers ([`crate::unet::cpu`]: gemm with bias and residual in the epilogue,
//! attention per block of queries with the scores in cache). `tests` compare it with candle's
//! forward on the same weights.

use std::cell::RefCell;
use std::collections::HashMap;

use candle_core::Tensor;
use rayon::prelude::*;

use crate::conv::{epilogue, gemm_st};
use crate::simd::simd_fn;
use crate::unet::cpu::{exp, Attention, LayerNorm, Linear, Weights, ROWS};

type CResult<T> = candle_core::Result<T>;

/// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7; 6.4e-7 in f32 arithmetic,
/// tested), branch-free around [`exp`] so that the GELU loop vectorizes; libm's scalar erff
/// would dominate the MLP's epilogue.
#[inline(always)]
fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152_1, 1.061_405_4];
    let a = x.abs();
    let t = 1.0 / (1.0 + P * a);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * exp(-a * a);
    y.copysign(x)
}

/// PyTorch's exact GELU, x/2 (1 + erf(x / sqrt 2)), as whisper's `nn.GELU()`.
#[inline(always)]
pub(crate) fn gelu_erf(v: f32) -> f32 {
    0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2))
}

simd_fn! {
    /// v = gelu_erf(v) in place.
    pub(crate) fn gelu_in_place(v: &mut [f32]) {
        v.iter_mut().for_each(|x| *x = gelu_erf(*x));
    }
}

thread_local! {
    /// Per-worker scratch: a convolution's im2col rows, or the MLP's hidden rows.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A kernel-3, padding-1 1D convolution with weights packed as `[(tap*cin + ci)][cout]`.
struct Conv1d {
    cin: usize,
    cout: usize,
    stride: usize,
    w: Vec<f32>,
    bias: Vec<f32>,
}

impl Conv1d {
    fn load(w: &Weights, prefix: &str, stride: usize) -> CResult<Conv1d> {
        let (dims, v) = w.get(&format!("{prefix}.weight"))?;
        if dims.len() != 3 || dims[2] != 3 {
            candle_core::bail!("{prefix}.weight: expected a kernel-3 1D convolution, got {dims:?}");
        }
        let (cout, cin) = (dims[0], dims[1]);
        let mut p = vec![0f32; 3 * cin * cout];
        for o in 0..cout {
            for i in 0..cin {
                for t in 0..3 {
                    p[(t * cin + i) * cout + o] = v[(o * cin + i) * 3 + t];
                }
            }
        }
        Ok(Conv1d { cin, cout, stride, w: p, bias: w.vec(&format!("{prefix}.bias"))? })
    }

    /// gelu(conv(x) + bias) for `x` (len x cin, token-major); returns (out_len x cout).
    fn forward_gelu(&self, x: &[f32]) -> Vec<f32> {
        let len = x.len() / self.cin;
        let out_len = (len + 2 - 3) / self.stride + 1;
        let (cin, cout, k) = (self.cin, self.cout, 3 * self.cin);
        let mut out = vec![0f32; out_len * cout];
        out.par_chunks_mut(ROWS * cout).enumerate().for_each(|(c, dst)| {
            let rows = dst.len() / cout;
            SCRATCH.with_borrow_mut(|col| {
                col.resize(col.len().max(rows * k), 0.0);
                let col = &mut col[..rows * k];
                for (r, row) in col.chunks_exact_mut(k).enumerate() {
                    let t = c * ROWS + r;
                    for tap in 0..3 {
                        let d = &mut row[tap * cin..(tap + 1) * cin];
                        match (t * self.stride + tap).checked_sub(1).filter(|&s| s < len) {
                            Some(s) => d.copy_from_slice(&x[s * cin..(s + 1) * cin]),
                            None => d.fill(0.0),
                        }
                    }
                }
                // SAFETY: dst is rows x cout, col rows x k, w k x cout, all row-major and disjoint.
                unsafe {
                    gemm_st(rows, cout, k, dst.as_mut_ptr(), cout, col.as_ptr(), k, 1, self.w.as_ptr(), cout, 1, 1.0)
                };
            });
            epilogue(dst, cout, Some(&self.bias), None, false);
            gelu_in_place(dst);
        });
        out
    }
}

/// One pre-LN encoder block: x + attn(ln1 x), then + fc2(gelu(fc1(ln2 x))).
pub(crate) struct Block {
    pub(crate) ln1: LayerNorm,
    pub(crate) attn: Attention,
    pub(crate) ln2: LayerNorm,
    pub(crate) fc1: Linear,
    pub(crate) fc2: Linear,
}

impl Block {
    pub(crate) fn forward(&self, x: &[f32]) -> Vec<f32> {
        let x = self.attn.forward(&self.ln1.forward(x), 1, None, x);
        let h = self.ln2.forward(&x);
        let (d, hidden) = (self.fc1.din, self.fc1.dout);
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(ROWS * d).enumerate().for_each(|(i, dst)| {
            let rows = dst.len() / d;
            let src = &h[i * ROWS * d..i * ROWS * d + rows * d];
            SCRATCH.with_borrow_mut(|act| {
                act.resize(act.len().max(rows * hidden), 0.0);
                let act = &mut act[..rows * hidden];
                self.fc1.apply(src, act, None);
                gelu_in_place(act);
                self.fc2.apply(act, dst, Some(&x[i * ROWS * d..i * ROWS * d + rows * d]));
            });
        });
        out
    }
}

/// The encoder with its weights packed for the CPU path.
pub struct WhisperEncoderCpu {
    conv1: Conv1d,
    conv2: Conv1d,
    blocks: Vec<Block>,
    d: usize,
}

impl WhisperEncoderCpu {
    /// From the canonical tensor names of [`crate::whisper`] (`conv1`, `conv2`, `layers.N.*`).
    pub fn new(tensors: &HashMap<String, Tensor>, layers: usize, heads: usize) -> CResult<WhisperEncoderCpu> {
        let w = Weights(tensors);
        let blocks = (0..layers)
            .map(|i| {
                let p = format!("layers.{i}");
                let lin = |name: &str, bias: bool| Linear::load(&w, &format!("{p}.{name}"), bias);
                Ok(Block {
                    ln1: LayerNorm::load(&w, &format!("{p}.self_attn_layer_norm"))?,
                    // whisper's 1/sqrt(head dim) on the queries is the attention's score scale.
                    attn: Attention::from_parts(
                        heads,
                        lin("self_attn.q_proj", true)?,
                        lin("self_attn.k_proj", false)?,
                        lin("self_attn.v_proj", true)?,
                        lin("self_attn.out_proj", true)?,
                    ),
                    ln2: LayerNorm::load(&w, &format!("{p}.final_layer_norm"))?,
                    fc1: lin("fc1", true)?,
                    fc2: lin("fc2", true)?,
                })
            })
            .collect::<CResult<_>>()?;
        let conv1 = Conv1d::load(&w, "conv1", 1)?;
        let d = conv1.cout;
        Ok(WhisperEncoderCpu { conv1, conv2: Conv1d::load(&w, "conv2", 2)?, blocks, d })
    }

    /// mel (n_mels x frames, channel-major as whisper's input) -> hidden states (T, 1 + layers, d):
    /// the embedding output, then each block's.
    pub fn hidden_states(&self, mel: &[f32], frames: usize) -> Vec<f32> {
        let n_mels = mel.len() / frames;
        let mut x = vec![0f32; mel.len()];
        for (t, row) in x.chunks_exact_mut(n_mels).enumerate() {
            for (m, v) in row.iter_mut().enumerate() {
                *v = mel[m * frames + t];
            }
        }
        let mut x = self.conv2.forward_gelu(&self.conv1.forward_gelu(&x));
        let t = x.len() / self.d;
        x.iter_mut().zip(crate::whisper::sinusoids(t, self.d)).for_each(|(v, p)| *v += p);
        let mut states = vec![x];
        for b in &self.blocks {
            let next = b.forward(states.last().expect("the embedding output"));
            states.push(next);
        }
        let (d, n) = (self.d, states.len());
        let mut out = vec![0f32; t * n * d];
        out.par_chunks_mut(n * d).enumerate().for_each(|(step, dst)| {
            for (l, s) in states.iter().enumerate() {
                dst[l * d..(l + 1) * d].copy_from_slice(&s[step * d..(step + 1) * d]);
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::whisper::{build, n_heads, synthetic_weights, N_LAYERS};
    use crate::{Device, Profile};

    /// The fast path against candle's forward ([`crate::whisper`]'s layers) on the same weights:
    /// every hidden state, at whisper's 3000 mel frames and at an odd length (the stride-2
    /// convolution's last window half outside).
    #[test]
    fn hidden_states_match_candle() {
        let tensors = synthetic_weights(Profile::Cpu, 11).unwrap();
        let fast = WhisperEncoderCpu::new(&tensors, N_LAYERS, n_heads(Profile::Cpu)).unwrap();
        let enc =
            crate::weights::build_from_tensors(tensors, &Device::Cpu, "whisper-tiny", |vb| build(vb, Profile::Cpu))
                .unwrap();
        for frames in [3000usize, 601] {
            let mel = crate::bench::test_input(vec![80, frames], frames as u64);
            let t = Tensor::from_vec(mel.data.clone(), (1, 80, frames), &Device::Cpu).unwrap();
            let want = enc.hidden_states_candle(&t).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let got = fast.hidden_states(&mel.data, frames);
            assert_eq!(got.len(), want.len(), "{frames} frames");
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let err = got.iter().zip(&want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(
                scale > 0.1 && err <= 1e-4 * scale,
                "{frames} frames: max |fast - candle| = {err} at scale {scale}"
            );
        }
    }

    #[test]
    fn erf_and_gelu_match_f64() {
        let mut worst = 0f64;
        for i in -60_000..=60_000 {
            let x = i as f32 * 1e-4;
            let want = erf_f64(x as f64);
            worst = worst.max((erf(x) as f64 - want).abs());
        }
        assert!(worst < 1e-6, "erf abs error {worst}");
        assert_eq!(gelu_erf(0.0), 0.0);
        assert!((gelu_erf(10.0) - 10.0).abs() < 1e-6 && gelu_erf(-10.0).abs() < 1e-6);
        let g1 = gelu_erf(1.0) as f64;
        assert!((g1 - 0.841_344_746_068_542_9).abs() < 1e-6, "gelu(1) = {g1}");
    }

    /// erf in f64 by the series 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1)) for |x| < 3, and
    /// the continued fraction of erfc beyond (both far more accurate than f32).
    fn erf_f64(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 3.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            2.0 / std::f64::consts::PI.sqrt() * sum
        } else {
            // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + 1/2/(a + 1/(a + 3/2/(a + ...)))).
            let mut f = a;
            for k in (1..60).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
        };
        r.copysign(x)
    }
}
