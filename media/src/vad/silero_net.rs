//! Silero VAD v5's network, written out in Rust, with its weights read from the committed ONNX
//! file.
//!
//! ## Why not only tract
//! tract runs the published graph one chunk per call (`results/vad_speed.csv` times it beside this
//! network, docs/vad.md), but a clip's chunks do not depend on each
//! other until the LSTM: the STFT and the four convolutions of chunk `j` read only its samples and
//! the 64 before it. So here every chunk of a block goes through the front end at once, as
//! matrix products over the whole block, and only the LSTM's recurrent product `W_hh h`
//! (512 x 128) runs chunk by chunk. Streaming one chunk at a time is the same code with a block
//! of one.
//!
//! ## Why its own matrix product, not `gemm`
//! `gemm` (which the engines use) picks its path from the matrix sizes (a matrix-vector path for
//! one row, other block sizes below 64 rows) and its kernel from the CPU (FMA or not), so a chunk's
//! probability would change in its last bits with the number of chunks run together and with the
//! machine: enough to flip a decision at the threshold, and a windowed or live render must decide
//! exactly as a whole one. [`matmul`] computes every output as `bias + a[0] w[0] + a[1] w[1] + ...`
//! in that order, unfused, whatever the number of rows and the instruction-set level
//! (`cadence_cpu::simd_fn!`), so the probabilities are the same bits for a chunk alone, in a
//! block, and on every machine.
//!
//! ## The graph (read off `silero_vad_openvino_16k.onnx`; docs/vad.md restates it)
//! input `x` = [context 64 | chunk 512] ->
//! 1. reflect-pad 64 samples on the right (`x[574 - k]` for `k` in 0..64): 640 samples;
//! 2. STFT as a convolution with the stored basis (258 filters of 256 taps, stride 128): 4 frames;
//!    magnitude `sqrt(re^2 + im^2)` of the 129 (re, im) pairs;
//! 3. four conv1d (kernel 3, padding 1) + ReLU: 129->128 stride 1 (4 frames), 128->64 stride 2
//!    (2 frames), 64->64 stride 2 (1 frame), 64->128 stride 1 (1 frame: only the centre tap
//!    meets data);
//! 4. one LSTM step (hidden 128, PyTorch gate order i, f, g, o; both biases) from the state
//!    [h; c];
//! 5. ReLU, conv1d 128->1 (kernel 1), sigmoid: the chunk's speech probability.
//!
//! Convolutions are matrix products over "im2col" rows (the three taps' inputs side by side,
//! zeros past the chunk's edges), so a padded tap never reads a neighbouring chunk.
//!
//! Tests: `media/tests/silero.rs` checks the probabilities against ONNX Runtime's on the same
//! file (`fixtures/vad/silero_reference.json`) and against tract running the graph itself on
//! random and silent input, chunk by chunk and in blocks.

use std::io::Cursor;
use std::sync::{Arc, OnceLock};

use tract_onnx::pb;
use tract_onnx::prelude::Framework;

use super::silero::{CHUNK_SAMPLES, CONTEXT_SAMPLES, STATE_LEN};
use crate::error::{MediaError, Result};

const HIDDEN: usize = 128;
const GATES: usize = 4 * HIDDEN;
/// STFT: 129 frequency bins (re and im rows of the basis), 256-tap window, hop 128.
const BINS: usize = 129;
const WINDOW: usize = 256;
const HOP: usize = 128;
/// Frames per chunk: (576 + 64 reflect - 256) / 128 + 1.
const FRAMES: usize = 4;
/// Reflect padding on the right of the 576-sample input.
const REFLECT: usize = 64;
/// Channels after each encoder convolution.
const C0: usize = 128;
const C1: usize = 64;
const C2: usize = 64;
const C3: usize = 128;
/// Chunks whose front end is computed together: 64 chunks (2 s of audio) keep the block's
/// matrices (at most 256 rows of 387 floats) in the core's L2.
const BLOCK: usize = 64;
const _: () = assert!((CONTEXT_SAMPLES + CHUNK_SAMPLES + REFLECT - WINDOW) / HOP + 1 == FRAMES);

/// The network's weights, each matrix stored as [input][output] (transposed from the ONNX
/// layout) for [`matmul`].
pub(crate) struct SileroNet {
    /// [256][258]: outputs 0..129 the real parts, 129..258 the imaginary parts.
    basis: Vec<f32>,
    /// No bias on the STFT: zeros.
    basis_bias: Vec<f32>,
    /// Encoder convolutions as [tap * in + in_channel][out] (im2col order), and their biases.
    w0: Vec<f32>,
    b0: Vec<f32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
    /// Only the centre tap of encoder 3: [64][128].
    w3: Vec<f32>,
    b3: Vec<f32>,
    /// LSTM: [128][512] each, gates i, f, g, o; `b_gates` = `bias_ih + bias_hh`.
    w_ih: Vec<f32>,
    w_hh: Vec<f32>,
    b_gates: Vec<f32>,
    /// Decoder conv 128 -> 1.
    w_dec: Vec<f32>,
    b_dec: f32,
}

/// The network of the embedded model file, read once per process.
pub(crate) fn net() -> Result<Arc<SileroNet>> {
    static NET: OnceLock<std::result::Result<Arc<SileroNet>, String>> = OnceLock::new();
    NET.get_or_init(|| SileroNet::load(super::silero::model_bytes()).map(Arc::new))
        .clone()
        .map_err(|e| MediaError::Model(format!("reading {}: {e}", super::silero::MODEL_FILE)))
}

/// The constant tensors of the graph, by the suffix of their names.
struct Constants(Vec<(String, pb::TensorProto)>);

impl Constants {
    fn get(&self, suffix: &str, dims: &[i64]) -> std::result::Result<Vec<f32>, String> {
        let (name, t) = self
            .0
            .iter()
            .find(|(name, _)| name.ends_with(suffix))
            .ok_or_else(|| format!("the model has no constant `{suffix}`"))?;
        if t.dims != dims {
            return Err(format!("`{name}` has shape {:?}, expected {dims:?}", t.dims));
        }
        if t.data_type != pb::tensor_proto::DataType::Float as i32 {
            return Err(format!("`{name}` is not float32 (ONNX type {})", t.data_type));
        }
        let values: Vec<f32> = if t.raw_data.is_empty() {
            t.float_data.clone()
        } else {
            t.raw_data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
        };
        let want: i64 = dims.iter().product();
        if values.len() as i64 != want {
            return Err(format!("`{name}` holds {} values, expected {want}", values.len()));
        }
        Ok(values)
    }
}

/// A conv1d weight [out][in][3] (ONNX layout) as [tap * in + c][out], for im2col rows.
fn im2col_weight(w: &[f32], out: usize, inp: usize) -> Vec<f32> {
    let mut r = vec![0.0; out * 3 * inp];
    for o in 0..out {
        for c in 0..inp {
            for tap in 0..3 {
                r[(tap * inp + c) * out + o] = w[(o * inp + c) * 3 + tap];
            }
        }
    }
    r
}

/// A row-major [rows][cols] matrix as [cols][rows].
fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| w[(i % rows) * cols + i / rows]).collect()
}

impl SileroNet {
    /// Reads the weights from the ONNX file's `Constant` nodes (the OpenVINO export stores them
    /// there rather than as initializers), checking every shape.
    fn load(onnx: &[u8]) -> std::result::Result<SileroNet, String> {
        let model = tract_onnx::onnx().proto_model_for_read(&mut Cursor::new(onnx)).map_err(|e| format!("{e:#}"))?;
        let graph = model.graph.ok_or("the model has no graph")?;
        let mut constants = Vec::new();
        for node in graph.node.iter().filter(|n| n.op_type == "Constant") {
            if let (Some(out), Some(t)) =
                (node.output.first(), node.attribute.iter().find(|a| a.name == "value").and_then(|a| a.t.clone()))
            {
                constants.push((out.clone(), t));
            }
        }
        constants.extend(graph.initializer.into_iter().map(|t| (t.name.clone(), t)));
        let k = Constants(constants);
        let enc = |i: usize, out: usize, inp: usize| -> std::result::Result<(Vec<f32>, Vec<f32>), String> {
            Ok((
                k.get(&format!("encoder.{i}.reparam_conv.weight"), &[out as i64, inp as i64, 3])?,
                k.get(&format!("encoder.{i}.reparam_conv.bias"), &[out as i64])?,
            ))
        };
        let (w0, b0) = enc(0, C0, BINS)?;
        let (w1, b1) = enc(1, C1, C0)?;
        let (w2, b2) = enc(2, C2, C1)?;
        let (w3, b3) = enc(3, C3, C2)?;
        let b_ih = k.get("decoder.rnn.bias_ih", &[GATES as i64])?;
        let b_hh = k.get("decoder.rnn.bias_hh", &[GATES as i64])?;
        let b_dec = k.get("decoder.decoder.2.bias", &[1])?;
        Ok(SileroNet {
            basis: transpose(
                &k.get("stft.forward_basis_buffer", &[2 * BINS as i64, 1, WINDOW as i64])?,
                2 * BINS,
                WINDOW,
            ),
            basis_bias: vec![0.0; 2 * BINS],
            w0: im2col_weight(&w0, C0, BINS),
            b0,
            w1: im2col_weight(&w1, C1, C0),
            b1,
            w2: im2col_weight(&w2, C2, C1),
            b2,
            w3: transpose(&(0..C3 * C2).map(|i| w3[i * 3 + 1]).collect::<Vec<_>>(), C3, C2),
            b3,
            w_ih: transpose(&k.get("decoder.rnn.weight_ih", &[GATES as i64, HIDDEN as i64])?, GATES, HIDDEN),
            w_hh: transpose(&k.get("decoder.rnn.weight_hh", &[GATES as i64, HIDDEN as i64])?, GATES, HIDDEN),
            b_gates: b_ih.iter().zip(&b_hh).map(|(a, b)| a + b).collect(),
            w_dec: k.get("decoder.decoder.2.weight", &[1, HIDDEN as i64, 1])?,
            b_dec: b_dec[0],
        })
    }

    /// Runs whole chunks (`chunks.len()` a multiple of 512) from `state` ([h; c], 256 floats) and
    /// `context` (the 64 samples before the first chunk), pushing one probability per chunk and
    /// leaving the state and context ready for the next chunk.
    pub(crate) fn run(
        &self,
        state: &mut [f32],
        context: &mut [f32],
        chunks: &[f32],
        probs: &mut Vec<f32>,
        scratch: &mut Scratch,
    ) {
        assert_eq!(state.len(), STATE_LEN);
        assert_eq!(context.len(), CONTEXT_SAMPLES);
        assert_eq!(chunks.len() % CHUNK_SAMPLES, 0);
        for block in chunks.chunks(BLOCK * CHUNK_SAMPLES) {
            self.front_end(context, block, scratch);
            let n = block.len() / CHUNK_SAMPLES;
            let (h, c) = state.split_at_mut(HIDDEN);
            for j in 0..n {
                let gates = &scratch.gates[j * GATES..(j + 1) * GATES];
                probs.push(self.lstm_step(h, c, gates, &mut scratch.step));
            }
            context.copy_from_slice(&block[block.len() - CONTEXT_SAMPLES..]);
        }
    }

    /// STFT, the four convolutions and the LSTM's input product for every chunk of a block:
    /// leaves `scratch.gates` = `W_ih x + b_ih + b_hh`, [n][512].
    fn front_end(&self, context: &[f32], block: &[f32], s: &mut Scratch) {
        let n = block.len() / CHUNK_SAMPLES;
        let frames = n * FRAMES;
        // 1. The frames of each chunk's padded input.
        s.frames.resize(frames * WINDOW, 0.0);
        let mut x = [0.0f32; CONTEXT_SAMPLES + CHUNK_SAMPLES];
        for j in 0..n {
            let chunk = &block[j * CHUNK_SAMPLES..(j + 1) * CHUNK_SAMPLES];
            let prev = if j == 0 { context } else { &block[j * CHUNK_SAMPLES - CONTEXT_SAMPLES..j * CHUNK_SAMPLES] };
            x[..CONTEXT_SAMPLES].copy_from_slice(prev);
            x[CONTEXT_SAMPLES..].copy_from_slice(chunk);
            let padded = |i: usize| if i < x.len() { x[i] } else { x[2 * (x.len() - 1) - i] };
            for t in 0..FRAMES {
                let row = &mut s.frames[(j * FRAMES + t) * WINDOW..(j * FRAMES + t + 1) * WINDOW];
                let start = t * HOP;
                if start + WINDOW <= x.len() {
                    row.copy_from_slice(&x[start..start + WINDOW]);
                } else {
                    row.iter_mut().enumerate().for_each(|(i, v)| *v = padded(start + i));
                }
            }
        }
        // 2. STFT and magnitude.
        s.spectrum.resize(frames * 2 * BINS, 0.0);
        matmul(frames, WINDOW, &s.frames, &self.basis, &self.basis_bias, &mut s.spectrum);
        s.magnitude.resize(frames * BINS, 0.0);
        for (m, sp) in s.magnitude.chunks_exact_mut(BINS).zip(s.spectrum.chunks_exact(2 * BINS)) {
            let (re, im) = sp.split_at(BINS);
            m.iter_mut().zip(re.iter().zip(im)).for_each(|(m, (r, i))| *m = (r * r + i * i).sqrt());
        }
        // 3. Encoder 0: 4 frames, stride 1.
        conv3(&s.magnitude, n, FRAMES, BINS, 1, &mut s.im2col, &self.w0, &self.b0, C0, &mut s.enc0);
        // Encoder 1: 4 -> 2 frames; encoder 2: 2 -> 1 frame.
        conv3(&s.enc0, n, FRAMES, C0, 2, &mut s.im2col, &self.w1, &self.b1, C1, &mut s.enc1);
        conv3(&s.enc1, n, FRAMES / 2, C1, 2, &mut s.im2col, &self.w2, &self.b2, C2, &mut s.enc2);
        // Encoder 3 on one frame: the centre tap only.
        s.enc3.resize(n * C3, 0.0);
        matmul(n, C2, &s.enc2, &self.w3, &self.b3, &mut s.enc3);
        s.enc3.iter_mut().for_each(|v| *v = v.max(0.0));
        // 4. The LSTM's input product for every chunk.
        s.gates.resize(n * GATES, 0.0);
        matmul(n, HIDDEN, &s.enc3, &self.w_ih, &self.b_gates, &mut s.gates);
    }

    /// One LSTM step from `gates` = `W_ih x + biases` and the state (h, c), then the decoder:
    /// the chunk's probability.
    fn lstm_step(&self, h: &mut [f32], c: &mut [f32], gates: &[f32], step: &mut Vec<f32>) -> f32 {
        // gates + W_hh h (the input gates as the product's starting values).
        step.resize(GATES, 0.0);
        matmul(1, HIDDEN, h, &self.w_hh, gates, step);
        let (i, rest) = step.split_at(HIDDEN);
        let (f, rest) = rest.split_at(HIDDEN);
        let (g, o) = rest.split_at(HIDDEN);
        let mut logit = self.b_dec;
        for k in 0..HIDDEN {
            let c_next = sigmoid(f[k]) * c[k] + sigmoid(i[k]) * tanh(g[k]);
            let h_next = sigmoid(o[k]) * tanh(c_next);
            c[k] = c_next;
            h[k] = h_next;
            logit += self.w_dec[k] * h_next.max(0.0);
        }
        sigmoid(logit)
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `tanh(x) = 1 - 2 / (exp(2x) + 1)`: one `exp`, about three times faster than libm's `tanhf`
/// (which goes through `expm1f`); off by at most a few 1e-8 near 0, where the subtraction loses
/// the relative precision `tanhf` keeps (an absolute error far below what the probabilities
/// need). Saturates to +-1 for large |x| (exp overflows to infinity, 2/inf = 0).
fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / ((2.0 * x).exp() + 1.0)
}

/// Buffers reused from block to block (one per detector, so a detector allocates once).
#[derive(Default, Debug)]
pub(crate) struct Scratch {
    frames: Vec<f32>,
    spectrum: Vec<f32>,
    magnitude: Vec<f32>,
    im2col: Vec<f32>,
    enc0: Vec<f32>,
    enc1: Vec<f32>,
    enc2: Vec<f32>,
    enc3: Vec<f32>,
    gates: Vec<f32>,
    step: Vec<f32>,
}

/// A kernel-3, padding-1 convolution (+ bias, ReLU) over each chunk's `len` frames of
/// `inp` channels (rows [n * len][inp]), with stride `stride`: rows [n * out_len][out].
#[allow(clippy::too_many_arguments)]
fn conv3(
    x: &[f32],
    n: usize,
    len: usize,
    inp: usize,
    stride: usize,
    im2col: &mut Vec<f32>,
    w: &[f32],
    b: &[f32],
    out: usize,
    y: &mut Vec<f32>,
) {
    let out_len = (len + 2 - 3) / stride + 1;
    let rows = n * out_len;
    im2col.resize(rows * 3 * inp, 0.0);
    for j in 0..n {
        for t in 0..out_len {
            let row = &mut im2col[(j * out_len + t) * 3 * inp..(j * out_len + t + 1) * 3 * inp];
            for tap in 0..3 {
                // Input frame t * stride + tap - 1; zeros past the chunk's edges.
                let dst = &mut row[tap * inp..(tap + 1) * inp];
                match (t * stride + tap).checked_sub(1).filter(|&f| f < len) {
                    Some(f) => dst.copy_from_slice(&x[(j * len + f) * inp..(j * len + f + 1) * inp]),
                    None => dst.fill(0.0),
                }
            }
        }
    }
    y.resize(rows * out, 0.0);
    matmul(rows, 3 * inp, im2col, w, b, y);
    y.iter_mut().for_each(|v| *v = v.max(0.0));
}

/// Output columns computed together: 32 floats are two AVX-512 or four AVX2 registers per row.
const TILE: usize = 32;

cadence_cpu::simd_fn! {
    /// `out[i][j] = bias[j] + a[i][0] w[0][j] + a[i][1] w[1][j] + ...` for `m` rows `a[i]` of `k`
    /// values, `w` [k][n] with `n = bias.len()`: each output summed in that order, unfused, so the
    /// same bits whatever `m`, the row's place among them and the instruction-set level. Four rows
    /// at a time share each load of `w`.
    fn matmul(m: usize, k: usize, a: &[f32], w: &[f32], bias: &[f32], out: &mut [f32]) {
        let n = bias.len();
        assert!(a.len() >= m * k && w.len() >= k * n && out.len() >= m * n);
        let mut i = 0;
        while i + 4 <= m {
            rows::<4>(k, &a[i * k..(i + 4) * k], w, bias, &mut out[i * n..(i + 4) * n]);
            i += 4;
        }
        while i < m {
            rows::<1>(k, &a[i * k..(i + 1) * k], w, bias, &mut out[i * n..(i + 1) * n]);
            i += 1;
        }
    }
}

/// [`matmul`] of `R` rows: tiles of [`TILE`] columns kept in registers over the whole `k` loop.
#[inline(always)]
fn rows<const R: usize>(k: usize, a: &[f32], w: &[f32], bias: &[f32], out: &mut [f32]) {
    let n = bias.len();
    let mut j0 = 0;
    while j0 + TILE <= n {
        let mut acc = [[0f32; TILE]; R];
        for row in acc.iter_mut() {
            row.copy_from_slice(&bias[j0..j0 + TILE]);
        }
        // Row r's k values, as slices of length k, so the loop below indexes them unchecked-free.
        let ar: [&[f32]; R] = std::array::from_fn(|r| &a[r * k..(r + 1) * k]);
        for (kk, wrow) in w.chunks_exact(n).take(k).enumerate() {
            let wt: &[f32; TILE] = wrow[j0..j0 + TILE].try_into().unwrap();
            let xs: [f32; R] = std::array::from_fn(|r| ar[r][kk]);
            for (row, x) in acc.iter_mut().zip(xs) {
                for l in 0..TILE {
                    row[l] += x * wt[l];
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            out[r * n + j0..r * n + j0 + TILE].copy_from_slice(row);
        }
        j0 += TILE;
    }
    // The last columns (fewer than a tile): the same sums, one column at a time.
    for j in j0..n {
        for r in 0..R {
            let mut v = bias[j];
            for kk in 0..k {
                v += a[r * k + kk] * w[kk * n + j];
            }
            out[r * n + j] = v;
        }
    }
}
