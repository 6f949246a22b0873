//! P-Net on the CPU in NHWC on the engines' own 3x3 convolution (`crate::conv`), for the large
//! pyramid levels where most of the detector's time goes.
//!
//! Why not candle here: on a 1080x1920 frame the first pyramid levels are 0.7 and 0.35 million
//! pixels, and candle's CPU path (NCHW im2col, then separate passes for the bias, the PReLU's
//! broadcasts and the pooling) spent most of the detector's time in them. `crate::conv::conv3x3`
//! keeps activations NHWC and multiplies cache-sized im2col tiles. It pads by 1; MTCNN's
//! convolutions are unpadded, so each output is the padded one without its border ring (the
//! interior pixels see no padding, so they are exactly the unpadded convolution's).
//!
//! Tested against the candle P-Net ([`super::PNet`], itself tested against facenet-pytorch) on
//! images of odd and even sizes in `engines/tests/mtcnn.rs`.

use rayon::prelude::*;

use crate::conv::{conv3x3, Nhwc, PackedConv};

/// P-Net's weights packed for [`PNetCpu::forward`].
pub struct PNetCpu {
    convs: [PackedConv; 3],
    slopes: [Vec<f32>; 3],
    /// The two 1x1 heads as one [32][6] matrix: regression (4), then the class logits (2).
    head: Vec<f32>,
    head_bias: [f32; 6],
}

/// A P-Net output map: `h` x `w` cells, each with its face probability and regression.
pub struct PNetMap {
    pub h: usize,
    pub w: usize,
    /// Face probability per cell, row-major.
    pub prob: Vec<f32>,
    /// `[dx1, dy1, dx2, dy2]` per cell, row-major.
    pub reg: Vec<[f32; 4]>,
}

impl PNetCpu {
    /// From PyTorch-layout tensors: the three 3x3 convs (weights, biases), the PReLU slopes, and
    /// the 1x1 heads `conv4_1` (2 x 32, class logits) and `conv4_2` (4 x 32, regression).
    pub(crate) fn new(
        convs: [(&[f32], &[f32], usize, usize); 3],
        slopes: [Vec<f32>; 3],
        (w41, b41): (&[f32], &[f32]),
        (w42, b42): (&[f32], &[f32]),
    ) -> PNetCpu {
        let pack =
            |(w, b, cout, cin): (&[f32], &[f32], usize, usize)| PackedConv::new(cout, cin, w, Some(b.to_vec()), 1);
        let mut head = vec![0f32; 32 * 6];
        for c in 0..32 {
            for o in 0..4 {
                head[c * 6 + o] = w42[o * 32 + c];
            }
            for o in 0..2 {
                head[c * 6 + 4 + o] = w41[o * 32 + c];
            }
        }
        let head_bias = [b42[0], b42[1], b42[2], b42[3], b41[0], b41[1]];
        PNetCpu { convs: convs.map(pack), slopes, head, head_bias }
    }

    /// P-Net on one normalised RGB image in HWC order (`h`, `w` >= 12).
    pub fn forward(&self, hwc: Vec<f32>, h: usize, w: usize) -> PNetMap {
        assert!(h >= 12 && w >= 12 && hwc.len() == h * w * 3);
        let x = Nhwc { n: 1, h, w, c: 3, data: hwc };
        let x = prelu(interior(conv3x3(&x, &self.convs[0], false, None, false)), &self.slopes[0]);
        let x = max_pool2_ceil(&x);
        let x = prelu(interior(conv3x3(&x, &self.convs[1], false, None, false)), &self.slopes[1]);
        let x = prelu(interior(conv3x3(&x, &self.convs[2], false, None, false)), &self.slopes[2]);
        let cells: Vec<(f32, [f32; 4])> = x
            .data
            .par_chunks(32 * 256)
            .flat_map_iter(|block| {
                block.chunks_exact(32).map(|px| {
                    let mut o = self.head_bias;
                    for (c, &v) in px.iter().enumerate() {
                        for (k, out) in o.iter_mut().enumerate() {
                            *out += v * self.head[c * 6 + k];
                        }
                    }
                    // softmax over (not face, face), as torch computes it: exp(l - max) / sum.
                    let m = o[4].max(o[5]);
                    let (e0, e1) = ((o[4] - m).exp(), (o[5] - m).exp());
                    (e1 / (e0 + e1), [o[0], o[1], o[2], o[3]])
                })
            })
            .collect();
        let (prob, reg) = cells.into_iter().unzip();
        PNetMap { h: x.h, w: x.w, prob, reg }
    }
}

/// The map without its outer ring of pixels: a padding-1 convolution's output made the valid one.
fn interior(x: Nhwc) -> Nhwc {
    let (h, w, c) = (x.h - 2, x.w - 2, x.c);
    let mut data = Vec::with_capacity(h * w * c);
    for y in 1..=h {
        data.extend_from_slice(&x.data[(y * x.w + 1) * c..(y * x.w + 1 + w) * c]);
    }
    Nhwc { n: 1, h, w, c, data }
}

fn prelu(mut x: Nhwc, slope: &[f32]) -> Nhwc {
    let c = x.c;
    x.data.par_chunks_mut(c * 1024).for_each(|block| {
        for px in block.chunks_exact_mut(c) {
            for (v, s) in px.iter_mut().zip(slope) {
                if *v < 0.0 {
                    *v *= s;
                }
            }
        }
    });
    x
}

/// 2x2 max pooling, stride 2, output size rounded up (a last odd row or column pools alone).
fn max_pool2_ceil(x: &Nhwc) -> Nhwc {
    let (oh, ow, c) = (x.h.div_ceil(2), x.w.div_ceil(2), x.c);
    let mut data = vec![f32::NEG_INFINITY; oh * ow * c];
    for y in 0..x.h {
        for xx in 0..x.w {
            let src = &x.data[(y * x.w + xx) * c..(y * x.w + xx + 1) * c];
            let dst = &mut data[((y / 2) * ow + xx / 2) * c..((y / 2) * ow + xx / 2 + 1) * c];
            for (d, s) in dst.iter_mut().zip(src) {
                *d = d.max(*s);
            }
        }
    }
    Nhwc { n: 1, h: oh, w: ow, c, data }
}
