//! MTCNN's three networks (Zhang et al. 2016) with the trained weights facenet-pytorch ships:
//! P-Net (fully convolutional, run on every scale of an image pyramid), R-Net (24x24 crops) and
//! O-Net (48x48 crops, with the 5 landmarks), on candle (the CPU, or the device the other engines
//! run on), and on the CPU on this module's own kernels, which the detector uses there
//! ([`PNetCpu`], [`RefineCpu`]; `kernels.rs`: convolutions with the bias and PReLU in registers,
//! AVX-512, AVX2 or portable by the active ISA level).
//!
//! ## The weights
//! `engines/models/mtcnn/{pnet,rnet,onet}.pt`, copied unchanged from the PyPI wheel
//! `facenet-pytorch` 2.6.0 (MIT; `engines/models/mtcnn/LICENSE-facenet-pytorch` and
//! `PROVENANCE.md`, with the sha256 of the wheel and of each file, [`MODEL_FILES`]), embedded in the
//! binary with `include_bytes!`: nothing is downloaded. They are state dicts in torch's legacy
//! `torch.save` format, read by [`crate::checkpoint`] (no Python, nothing executed).
//!
//! ## The layers (facenet-pytorch's `models/mtcnn.py`, restated)
//! Convolutions without padding, stride 1; PReLU with one slope per channel; max pooling that
//! rounds its output size up (`ceil_mode=True`: the last window may hang over the bottom and right
//! edges, which count as -infinity); softmax over the two classes (face is class 1).
//! - P-Net: conv 3->10 (3x3), PReLU, pool 2/2; conv 10->16 (3x3), PReLU; conv 16->32 (3x3),
//!   PReLU; then two 1x1 convs: `conv4_2` 32->4 (box regression) and `conv4_1` 32->2 (softmax).
//!   Outputs (regression `[N, 4, H', W']`, probabilities `[N, 2, H', W']`).
//! - R-Net on 24x24: conv 3->28 (3x3), PReLU, pool 3/2; conv 28->48 (3x3), PReLU, pool 3/2;
//!   conv 48->64 (2x2), PReLU; flattened in (x, y, channel) order (`permute(0, 3, 2, 1)`, the
//!   layout of the original Caffe weights), dense 576->128, PReLU; `dense5_2` 128->4,
//!   `dense5_1` 128->2 (softmax). Outputs (regression `[N, 4]`, probabilities `[N, 2]`).
//! - O-Net on 48x48: conv 3->32, PReLU, pool 3/2; conv 32->64, PReLU, pool 3/2; conv 64->64,
//!   PReLU, pool 2/2; conv 64->128 (2x2), PReLU; flattened as R-Net, dense 1152->256, PReLU;
//!   `dense6_2` 256->4, `dense6_3` 256->10 (landmarks: 5 x then 5 y, relative to the box),
//!   `dense6_1` 256->2 (softmax). Outputs (regression `[N, 4]`, landmarks `[N, 10]`, probabilities
//!   `[N, 2]`).
//!
//! Inputs are NCHW RGB, normalised as facenet-pytorch's `detect_face` does: `(pixel - 127.5) *
//! 0.0078125`. The detector around the networks (the image pyramid, box regression, NMS, the
//! crops between the stages) is [`detect`].
//!
//! Tests: `engines/tests/mtcnn.rs` against facenet-pytorch's own networks on the same inputs
//! (`fixtures/mtcnn/nets_reference.json`, written by `scripts/make_mtcnn_fixtures.py`), and
//! `engines/tests/mtcnn_detect.rs` against its detector on whole frames; the CPU networks
//! against the candle ones there and in their files' tests, the kernels against f64 sums.

pub mod detect;
mod kernels;
mod pnet_cpu;
mod refine_cpu;
mod resample;

pub use pnet_cpu::{PNetCpu, PNetMap};
pub use refine_cpu::RefineCpu;

use refine_cpu::ConvLayer;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::{self, Checkpoint};
use crate::error::{EngineError, Result};

static PNET_BYTES: &[u8] = include_bytes!("../models/mtcnn/pnet.pt");
static RNET_BYTES: &[u8] = include_bytes!("../models/mtcnn/rnet.pt");
static ONET_BYTES: &[u8] = include_bytes!("../models/mtcnn/onet.pt");

/// The committed weight files: (path from the repository root, sha256), P-Net, R-Net, O-Net.
pub const MODEL_FILES: [(&str, &str); 3] = [
    ("engines/models/mtcnn/pnet.pt", "a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f"),
    ("engines/models/mtcnn/rnet.pt", "bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86"),
    ("engines/models/mtcnn/onet.pt", "165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d"),
];
/// Where the weights come from.
pub const MODEL_SOURCE: &str = "facenet-pytorch 2.6.0 (PyPI, MIT), facenet_pytorch/data/{pnet,rnet,onet}.pt";

/// The embedded bytes of P-Net, R-Net and O-Net, in [`MODEL_FILES`]' order (to hash them).
pub fn model_bytes() -> [&'static [u8]; 3] {
    [PNET_BYTES, RNET_BYTES, ONET_BYTES]
}

/// One embedded state dict and its tensors, read by name with the expected shape.
struct StateDict<'a> {
    file: &'static str,
    bytes: &'a [u8],
    ckpt: Checkpoint,
    device: &'a Device,
}

impl<'a> StateDict<'a> {
    fn open(file: &'static str, bytes: &'a [u8], device: &'a Device) -> Result<Self> {
        let ckpt = checkpoint::inspect_bytes(bytes)
            .map_err(|e| EngineError::BadFile { file: PathBuf::from(file), msg: e.to_string() })?;
        Ok(Self { file, bytes, ckpt, device })
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let file = PathBuf::from(self.file);
        let entry = self.ckpt.tensor(name).ok_or_else(|| EngineError::MissingTensor {
            file: file.clone(),
            name: name.into(),
            expected: shape.to_vec(),
        })?;
        if entry.shape != shape {
            return Err(EngineError::ShapeMismatch {
                file,
                name: name.into(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let t = checkpoint::read_bytes_f32(self.bytes, entry)
            .map_err(|e| EngineError::BadFile { file, msg: e.to_string() })?;
        Ok(t.to_dtype(DType::F32)?.to_device(self.device)?)
    }

    fn conv(&self, name: &str, cout: usize, cin: usize, k: usize) -> Result<Conv> {
        Ok(Conv {
            w: self.get(&format!("{name}.weight"), &[cout, cin, k, k])?,
            b: self.get(&format!("{name}.bias"), &[cout])?.reshape((1, cout, 1, 1))?,
        })
    }

    fn prelu(&self, name: &str, c: usize) -> Result<PRelu> {
        Ok(PRelu { slope: self.get(&format!("{name}.weight"), &[c])? })
    }

    fn dense(&self, name: &str, out: usize, inp: usize) -> Result<Dense> {
        Ok(Dense {
            w_t: self.get(&format!("{name}.weight"), &[out, inp])?.t()?.contiguous()?,
            b: self.get(&format!("{name}.bias"), &[out])?,
        })
    }
}

/// A convolution without padding, stride 1.
struct Conv {
    w: Tensor,
    /// [1, C, 1, 1].
    b: Tensor,
}

impl Conv {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.conv2d(&self.w, 0, 1, 1, 1)?.broadcast_add(&self.b)?)
    }
}

/// PReLU: `max(0, x) + slope[c] * min(0, x)`, one slope per channel (dimension 1).
struct PRelu {
    slope: Tensor,
}

impl PRelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut shape = vec![1; x.rank()];
        shape[1] = self.slope.elem_count();
        let slope = self.slope.reshape(shape)?;
        Ok((x.relu()? + x.minimum(0f32)?.broadcast_mul(&slope)?)?)
    }
}

/// A linear layer (`x W^T + b`).
struct Dense {
    w_t: Tensor,
    b: Tensor,
}

impl Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.w_t)?.broadcast_add(&self.b)?)
    }
}

/// Output length of a `ceil_mode` pooling without padding: `ceil((n - k) / s) + 1` (a window
/// always starts inside the input when `k >= s`, so PyTorch's correction never applies here).
fn ceil_pool_len(n: usize, k: usize, s: usize) -> usize {
    (n - k).div_ceil(s) + 1
}

/// Max pooling with PyTorch's `ceil_mode=True`: the input padded on the bottom and right with
/// -infinity up to the last window's end, then ordinary pooling.
fn max_pool_ceil(x: &Tensor, k: usize, s: usize) -> Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    if h < k || w < k {
        return Err(EngineError::BadInput(format!("MTCNN: a {h}x{w} map is smaller than its {k}x{k} pooling")));
    }
    let (oh, ow) = (ceil_pool_len(h, k, s), ceil_pool_len(w, k, s));
    let (ph, pw) = ((oh - 1) * s + k - h, (ow - 1) * s + k - w);
    let mut x = x.clone();
    if pw > 0 {
        let pad = Tensor::full(f32::NEG_INFINITY, (n, c, h, pw), x.device())?;
        x = Tensor::cat(&[&x, &pad], 3)?;
    }
    if ph > 0 {
        let pad = Tensor::full(f32::NEG_INFINITY, (n, c, ph, w + pw), x.device())?;
        x = Tensor::cat(&[&x, &pad], 2)?;
    }
    Ok(x.max_pool2d_with_stride((k, k), (s, s))?)
}

/// Flattens [N, C, H, W] in the (x, y, channel) order the dense layers were trained with
/// (facenet-pytorch's `permute(0, 3, 2, 1)`).
fn flatten_xyc(x: &Tensor) -> Result<Tensor> {
    let n = x.dim(0)?;
    Ok(x.permute((0, 3, 2, 1))?.contiguous()?.reshape((n, ()))?)
}

fn softmax_classes(x: &Tensor, dim: usize) -> Result<Tensor> {
    Ok(candle_nn::ops::softmax(x, dim)?)
}

/// P-Net: the proposal network, fully convolutional.
pub struct PNet {
    conv1: Conv,
    prelu1: PRelu,
    conv2: Conv,
    prelu2: PRelu,
    conv3: Conv,
    prelu3: PRelu,
    conv4_1: Conv,
    conv4_2: Conv,
}

impl PNet {
    /// (box regression [N, 4, H', W'], face probabilities [N, 2, H', W']) of images [N, 3, H, W]
    /// (H, W >= 12), each output cell a 12x12 window of the input at stride 2.
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (_, c, h, w) = x.dims4()?;
        if c != 3 || h < 12 || w < 12 {
            return Err(EngineError::BadInput(format!("P-Net takes [N, 3, H, W] with H, W >= 12, got {:?}", x.dims())));
        }
        let x = max_pool_ceil(&self.prelu1.forward(&self.conv1.forward(x)?)?, 2, 2)?;
        let x = self.prelu2.forward(&self.conv2.forward(&x)?)?;
        let x = self.prelu3.forward(&self.conv3.forward(&x)?)?;
        Ok((self.conv4_2.forward(&x)?, softmax_classes(&self.conv4_1.forward(&x)?, 1)?))
    }
}

/// R-Net: the refinement network, on 24x24 crops.
pub struct RNet {
    conv1: Conv,
    prelu1: PRelu,
    conv2: Conv,
    prelu2: PRelu,
    conv3: Conv,
    prelu3: PRelu,
    dense4: Dense,
    prelu4: PRelu,
    dense5_1: Dense,
    dense5_2: Dense,
}

impl RNet {
    /// (box regression [N, 4], face probabilities [N, 2]) of crops [N, 3, 24, 24].
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        check_crops(x, 24, "R-Net")?;
        let x = max_pool_ceil(&self.prelu1.forward(&self.conv1.forward(x)?)?, 3, 2)?;
        let x = max_pool_ceil(&self.prelu2.forward(&self.conv2.forward(&x)?)?, 3, 2)?;
        let x = self.prelu3.forward(&self.conv3.forward(&x)?)?;
        let x = self.prelu4.forward(&self.dense4.forward(&flatten_xyc(&x)?)?)?;
        Ok((self.dense5_2.forward(&x)?, softmax_classes(&self.dense5_1.forward(&x)?, 1)?))
    }
}

/// O-Net: the output network, on 48x48 crops, with the landmarks.
pub struct ONet {
    conv1: Conv,
    prelu1: PRelu,
    conv2: Conv,
    prelu2: PRelu,
    conv3: Conv,
    prelu3: PRelu,
    conv4: Conv,
    prelu4: PRelu,
    dense5: Dense,
    prelu5: PRelu,
    dense6_1: Dense,
    dense6_2: Dense,
    dense6_3: Dense,
}

impl ONet {
    /// (box regression [N, 4], landmarks [N, 10] (5 x, then 5 y, as fractions of the box: left
    /// eye, right eye, nose, left and right mouth corners), face probabilities [N, 2]) of crops
    /// [N, 3, 48, 48].
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        check_crops(x, 48, "O-Net")?;
        let x = max_pool_ceil(&self.prelu1.forward(&self.conv1.forward(x)?)?, 3, 2)?;
        let x = max_pool_ceil(&self.prelu2.forward(&self.conv2.forward(&x)?)?, 3, 2)?;
        let x = max_pool_ceil(&self.prelu3.forward(&self.conv3.forward(&x)?)?, 2, 2)?;
        let x = self.prelu4.forward(&self.conv4.forward(&x)?)?;
        let x = self.prelu5.forward(&self.dense5.forward(&flatten_xyc(&x)?)?)?;
        Ok((self.dense6_2.forward(&x)?, self.dense6_3.forward(&x)?, softmax_classes(&self.dense6_1.forward(&x)?, 1)?))
    }
}

fn check_crops(x: &Tensor, size: usize, net: &str) -> Result<()> {
    let (_, c, h, w) = x.dims4()?;
    if (c, h, w) != (3, size, size) {
        return Err(EngineError::BadInput(format!("{net} takes [N, 3, {size}, {size}] crops, got {:?}", x.dims())));
    }
    Ok(())
}

/// The three networks, read from the embedded weights onto `device`.
pub struct MtcnnNets {
    pub pnet: PNet,
    pub rnet: RNet,
    pub onet: ONet,
    /// The three networks on this crate's CPU kernels, when `device` is the CPU: the detector
    /// then runs them instead of candle ([`PNetCpu`], [`RefineCpu`]).
    pub pnet_cpu: Option<PNetCpu>,
    pub rnet_cpu: Option<RefineCpu>,
    pub onet_cpu: Option<RefineCpu>,
}

impl MtcnnNets {
    pub fn load(device: &Device) -> Result<Self> {
        let p = StateDict::open(MODEL_FILES[0].0, PNET_BYTES, device)?;
        let pnet = PNet {
            conv1: p.conv("conv1", 10, 3, 3)?,
            prelu1: p.prelu("prelu1", 10)?,
            conv2: p.conv("conv2", 16, 10, 3)?,
            prelu2: p.prelu("prelu2", 16)?,
            conv3: p.conv("conv3", 32, 16, 3)?,
            prelu3: p.prelu("prelu3", 32)?,
            conv4_1: p.conv("conv4_1", 2, 32, 1)?,
            conv4_2: p.conv("conv4_2", 4, 32, 1)?,
        };
        let pnet_cpu = if device.is_cpu() {
            let v = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
                Ok(p.get(name, shape)?.flatten_all()?.to_vec1::<f32>()?)
            };
            let conv = |i: usize, cout: usize, cin: usize| -> Result<(Vec<f32>, Vec<f32>)> {
                Ok((v(&format!("conv{i}.weight"), &[cout, cin, 3, 3])?, v(&format!("conv{i}.bias"), &[cout])?))
            };
            let (c1, c2, c3) = (conv(1, 10, 3)?, conv(2, 16, 10)?, conv(3, 32, 16)?);
            let (w41, b41) = (v("conv4_1.weight", &[2, 32, 1, 1])?, v("conv4_1.bias", &[2])?);
            let (w42, b42) = (v("conv4_2.weight", &[4, 32, 1, 1])?, v("conv4_2.bias", &[4])?);
            Some(PNetCpu::new(
                [(&c1.0, &c1.1, 10, 3), (&c2.0, &c2.1, 16, 10), (&c3.0, &c3.1, 32, 16)],
                [v("prelu1.weight", &[10])?, v("prelu2.weight", &[16])?, v("prelu3.weight", &[32])?],
                (&w41, &b41),
                (&w42, &b42),
            ))
        } else {
            None
        };
        let r = StateDict::open(MODEL_FILES[1].0, RNET_BYTES, device)?;
        let rnet = RNet {
            conv1: r.conv("conv1", 28, 3, 3)?,
            prelu1: r.prelu("prelu1", 28)?,
            conv2: r.conv("conv2", 48, 28, 3)?,
            prelu2: r.prelu("prelu2", 48)?,
            conv3: r.conv("conv3", 64, 48, 2)?,
            prelu3: r.prelu("prelu3", 64)?,
            dense4: r.dense("dense4", 128, 576)?,
            prelu4: r.prelu("prelu4", 128)?,
            dense5_1: r.dense("dense5_1", 2, 128)?,
            dense5_2: r.dense("dense5_2", 4, 128)?,
        };
        let o = StateDict::open(MODEL_FILES[2].0, ONET_BYTES, device)?;
        let onet = ONet {
            conv1: o.conv("conv1", 32, 3, 3)?,
            prelu1: o.prelu("prelu1", 32)?,
            conv2: o.conv("conv2", 64, 32, 3)?,
            prelu2: o.prelu("prelu2", 64)?,
            conv3: o.conv("conv3", 64, 64, 3)?,
            prelu3: o.prelu("prelu3", 64)?,
            conv4: o.conv("conv4", 128, 64, 2)?,
            prelu4: o.prelu("prelu4", 128)?,
            dense5: o.dense("dense5", 256, 1152)?,
            prelu5: o.prelu("prelu5", 256)?,
            dense6_1: o.dense("dense6_1", 2, 256)?,
            dense6_2: o.dense("dense6_2", 4, 256)?,
            dense6_3: o.dense("dense6_3", 10, 256)?,
        };
        let (rnet_cpu, onet_cpu) = if device.is_cpu() {
            (
                Some(refine_cpu(
                    &r,
                    24,
                    &[(28, 3, 3, Some(3)), (48, 28, 3, Some(3)), (64, 48, 2, None)],
                    "dense4",
                    128,
                    &["dense5_2", "dense5_1"],
                    &[4, 2],
                )?),
                Some(refine_cpu(
                    &o,
                    48,
                    &[(32, 3, 3, Some(3)), (64, 32, 3, Some(3)), (64, 64, 3, Some(2)), (128, 64, 2, None)],
                    "dense5",
                    256,
                    &["dense6_2", "dense6_3", "dense6_1"],
                    &[4, 10, 2],
                )?),
            )
        } else {
            (None, None)
        };
        Ok(Self { pnet, rnet, onet, pnet_cpu, rnet_cpu, onet_cpu })
    }

    /// The CPU networks, when loaded on the CPU.
    pub(crate) fn cpu(&self) -> Option<(&PNetCpu, &RefineCpu, &RefineCpu)> {
        Some((self.pnet_cpu.as_ref()?, self.rnet_cpu.as_ref()?, self.onet_cpu.as_ref()?))
    }
}

/// R-Net or O-Net packed for the CPU from its state dict: `convs` (cout, cin, k, pooling after
/// it) named conv1, conv2, ... with PReLUs prelu1, prelu2, ...; the dense layer `dense` (with the
/// next PReLU) of `hidden` outputs; the output layers `heads` with `outs` outputs each.
fn refine_cpu(
    sd: &StateDict,
    size: usize,
    convs: &[(usize, usize, usize, Option<usize>)],
    dense: &str,
    hidden: usize,
    heads: &[&str],
    outs: &[usize],
) -> Result<RefineCpu> {
    let v = |name: String, shape: &[usize]| -> Result<Vec<f32>> {
        Ok(sd.get(&name, shape)?.flatten_all()?.to_vec1::<f32>()?)
    };
    let mut layers = Vec::new();
    for (i, &(cout, cin, k, pool)) in convs.iter().enumerate() {
        let n = i + 1;
        layers.push((
            v(format!("conv{n}.weight"), &[cout, cin, k, k])?,
            v(format!("conv{n}.bias"), &[cout])?,
            v(format!("prelu{n}.weight"), &[cout])?,
            k,
            pool,
        ));
    }
    let (last, side) = convs.iter().fold((3, size), |(_, s), &(cout, _, k, pool)| {
        let s = s - k + 1;
        (cout, pool.map_or(s, |p| (s - p).div_ceil(2) + 1))
    });
    let features = last * side * side;
    let dw = v(format!("{dense}.weight"), &[hidden, features])?;
    let db = v(format!("{dense}.bias"), &[hidden])?;
    let ds = v(format!("prelu{}.weight", convs.len() + 1), &[hidden])?;
    let mut hs = Vec::new();
    for (h, &o) in heads.iter().zip(outs) {
        hs.push((v(format!("{h}.weight"), &[o, hidden])?, v(format!("{h}.bias"), &[o])?));
    }
    let layers: Vec<_> =
        layers.iter().map(|(w, bias, slope, k, pool)| ConvLayer { w, bias, slope, k: *k, pool: *pool }).collect();
    let heads: Vec<_> = hs.iter().map(|(w, b)| (&w[..], &b[..])).collect();
    Ok(RefineCpu::new(size, &layers, (&dw, &db, &ds), &heads))
}

/// Seeded values in [-1, 1) for the CPU networks' unit tests (one generator for them all).
#[cfg(test)]
pub(crate) fn test_values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_mode_pool_lengths_are_pytorchs() {
        // nn.MaxPool2d(k, s, ceil_mode=True) output sizes, as PyTorch gives them.
        for (n, k, s, want) in
            [(21, 2, 2, 11), (22, 2, 2, 11), (22, 3, 2, 11), (21, 3, 2, 10), (10, 3, 2, 5), (4, 2, 2, 2), (3, 2, 2, 2)]
        {
            assert_eq!(ceil_pool_len(n, k, s), want, "n={n} k={k} s={s}");
        }
    }
}
