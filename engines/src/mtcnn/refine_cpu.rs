//! R-Net and O-Net on the CPU: every box's crop resampled from the image bytes straight into the
//! network's input, the convolutions, PReLUs and poolings per crop on [`super::kernels`] (crops
//! in parallel), then the dense layer and the heads on all crops at once (a 1x1 convolution over
//! a row of crops, each crop one pixel whose channels are its flattened features).
//!
//! Why not candle here: its CPU convolution (im2col, then separate passes for the bias, PReLU and
//! padded pooling) on a batch of about 150 R-Net crops took about a fifth of a 1080x1920 frame's
//! detection, for about 0.23 billion multiply-adds.
//!
//! The dense layers were trained on maps flattened in (x, y, channel) order (facenet-pytorch's
//! `permute(0, 3, 2, 1)`); the maps here are (y, x, channel), so the dense weights' input
//! columns are permuted once when packed.
//!
//! Tested against the candle networks ([`super::RNet`], [`super::ONet`], themselves tested
//! against facenet-pytorch) in this file's tests.

use std::cell::RefCell;

use rayon::prelude::*;

use super::kernels::{arms, conv_row, pool_row, pooled, Arm, Packed, Src, PAD};
use super::resample::{Area, RowScratch};

/// R-Net or O-Net, packed.
pub struct RefineCpu {
    /// Crop side (24 or 48).
    size: usize,
    /// Convolutions (with their PReLU), each followed by a max pooling of that size (stride 2)
    /// or none.
    layers: Vec<(Packed, Option<usize>)>,
    /// The dense layer with its PReLU, input columns in this file's (y, x, channel) order.
    dense: Packed,
    /// The output layers as one: R-Net regression 4, class logits 2; O-Net regression 4,
    /// landmarks 10, class logits 2.
    head: Packed,
}

/// One convolution's weights in PyTorch's layout, and the pooling after it.
pub(crate) struct ConvLayer<'a> {
    /// (cout, cin, k, k).
    pub w: &'a [f32],
    pub bias: &'a [f32],
    /// The PReLU's slopes.
    pub slope: &'a [f32],
    pub k: usize,
    /// The size of the max pooling (stride 2) after it, if any.
    pub pool: Option<usize>,
}

/// A worker's maps, kept between crops.
#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    resample: RowScratch,
    dense: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Crops per task of the dense layer and the heads.
const DENSE_CROPS: usize = 24;

impl RefineCpu {
    /// `layers`: the convolutions; `dense`: (weights (out, in) over PyTorch's (x, y, channel)
    /// flattening, bias, PReLU slopes); `heads`: (weights, bias) of each output layer, in the
    /// order of the outputs.
    pub(crate) fn new(
        size: usize,
        layers: &[ConvLayer],
        dense: (&[f32], &[f32], &[f32]),
        heads: &[(&[f32], &[f32])],
    ) -> RefineCpu {
        let mut side = size;
        let mut cin = 3;
        let mut packed = Vec::new();
        for &ConvLayer { w, bias, slope, k, pool } in layers {
            let cout = bias.len();
            packed.push((Packed::new(k, cin, cout, w, bias, Some(slope), None), pool));
            side = side - k + 1;
            if let Some(p) = pool {
                side = pooled(side, p);
            }
            cin = cout;
        }
        // Our feature i = (y side + x) cin + c is PyTorch's (x side + y) cin + c.
        let order: Vec<usize> = (0..side * side * cin)
            .map(|i| {
                let (yx, c) = (i / cin, i % cin);
                ((yx % side) * side + yx / side) * cin + c
            })
            .collect();
        let (dw, db, ds) = dense;
        let dense = Packed::new(1, order.len(), db.len(), dw, db, Some(ds), Some(&order));
        let hw: Vec<f32> = heads.iter().flat_map(|h| h.0.iter().copied()).collect();
        let hb: Vec<f32> = heads.iter().flat_map(|h| h.1.iter().copied()).collect();
        let head = Packed::new(1, dense.cout, hb.len(), &hw, &hb, None, None);
        RefineCpu { size, layers: packed, dense, head }
    }

    /// Features per crop (the flattened last map).
    fn features(&self) -> usize {
        self.dense.cin
    }

    /// The raw outputs (`head.cout` per crop: regressions, landmarks and class logits, before
    /// the softmax) of the crops `windows` (`(x0, y0, w, h)` inside the RGB image `rgb`, `iw`
    /// pixels wide), resampled to the network's size.
    pub(crate) fn forward(&self, rgb: &[u8], iw: usize, windows: &[(usize, usize, usize, usize)]) -> Vec<Vec<f32>> {
        let n = windows.len();
        let fl = self.features();
        if n == 0 {
            return Vec::new();
        }
        let arm = Arm::active();
        // One crop a pixel, PAD more for the tiles' overhang.
        let mut feats = vec![0f32; (n + PAD) * fl];
        feats[..n * fl].par_chunks_mut(fl).zip(windows).for_each(|(f, &win)| {
            let mut s = SCRATCH.take();
            let area = Area::new(rgb, iw, win, self.size, self.size);
            crop_features(arm, self, &area, f, &mut s);
            SCRATCH.set(s);
        });
        let hc = self.head.cs_out();
        let mut out = vec![0f32; n * hc];
        out.par_chunks_mut(DENSE_CROPS * hc).enumerate().for_each(|(t, dst)| {
            let mut s = SCRATCH.take();
            let first = t * DENSE_CROPS;
            dense_heads(arm, self, &feats[first * fl..], dst.len() / hc, dst, &mut s);
            SCRATCH.set(s);
        });
        out.chunks_exact(hc).map(|o| o[..self.head.cout].to_vec()).collect()
    }
}

/// `v.len() >= n`, growing it (with zeros) when shorter.
fn at_least(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

arms! {
    /// One crop through the convolutions and poolings: its flattened features into `feat`.
    fn crop_features<V, P1, P2>(net: &RefineCpu, area: &Area, feat: &mut [f32], s: &mut Scratch) {
        let n = net.size;
        let stride = n + PAD;
        let widest = net.layers.iter().map(|(c, _)| c.cs_out()).max().unwrap_or(0).max(3);
        let (mut a, mut b) = (at_least(&mut s.a, n * stride * widest), at_least(&mut s.b, n * stride * widest));
        for y in 0..n {
            area.row(y, &mut a[y * stride * 3..][..stride * 3], &mut s.resample);
        }
        let (mut h, mut w, mut cs) = (n, n, 3);
        for (c, pool) in &net.layers {
            let (oh, ow, co) = (h - c.k + 1, w - c.k + 1, c.cs_out());
            for y in 0..oh {
                let rows = [0, 1, 2].map(|k| &a[(y + k.min(c.k - 1)) * stride * cs..][..stride * cs]);
                conv_row::<V, P1, P2>(&Src { rows, cs }, ow, c, &mut b[y * stride * co..][..stride * co]);
            }
            (h, w, cs) = (oh, ow, co);
            if let Some(k) = *pool {
                let (ph, pw) = (pooled(h, k), pooled(w, k));
                for y in 0..ph {
                    let rows: Vec<&[f32]> =
                        (2 * y..(2 * y + k).min(h)).map(|r| &b[r * stride * cs..][..stride * cs]).collect();
                    pool_row::<V>(&rows, k, w, cs, pw, &mut a[y * stride * cs..][..stride * cs]);
                }
                (h, w) = (ph, pw);
            } else {
                std::mem::swap(&mut a, &mut b);
            }
        }
        // Flatten (y, x, channel); the last layer has whole blocks of channels (64, 128).
        for y in 0..h {
            feat[y * w * cs..(y + 1) * w * cs].copy_from_slice(&a[y * stride * cs..][..w * cs]);
        }
    }
}

arms! {
    /// The dense layer and the heads of `n` crops whose features start at `feats` (which holds
    /// PAD more crops' worth of floats past them).
    fn dense_heads<V, P1, P2>(net: &RefineCpu, feats: &[f32], n: usize, out: &mut [f32], s: &mut Scratch) {
        let fl = net.features();
        let rows = [&feats[..(n + PAD) * fl]; 3];
        let dc = net.dense.cs_out();
        let dense = at_least(&mut s.dense, (n + PAD) * dc);
        conv_row::<V, P1, P2>(&Src { rows, cs: fl }, n, &net.dense, dense);
        let d: &[f32] = dense;
        let hc = net.head.cs_out();
        let mut tmp = vec![0f32; (n + PAD) * hc];
        conv_row::<V, P1, P2>(&Src { rows: [d; 3], cs: dc }, n, &net.head, &mut tmp);
        out.copy_from_slice(&tmp[..n * hc]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::resample::{Area, RowScratch};
    use super::super::MtcnnNets;
    use candle_core::{Device, Tensor};

    /// R-Net and O-Net on the CPU kernels against the candle networks on the same crops
    /// (downsampled, upsampled, at the image's edges), from a seeded random image.
    #[test]
    fn cpu_refine_nets_match_candle() {
        let nets = MtcnnNets::load(&Device::Cpu).unwrap();
        let (iw, ih) = (97, 83);
        let mut s = 7u64;
        let img: Vec<u8> = (0..iw * ih * 3)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 56) as u8
            })
            .collect();
        let windows = [(0, 0, 97, 83), (10, 5, 30, 30), (50, 40, 13, 17), (90, 70, 7, 13), (3, 60, 60, 23)];
        for (size, onet) in [(24, false), (48, true)] {
            let cpu = if onet { nets.onet_cpu.as_ref() } else { nets.rnet_cpu.as_ref() }.unwrap();
            let got = cpu.forward(&img, iw, &windows);
            let mut chw = Vec::new();
            for &win in &windows {
                let area = Area::new(&img, iw, win, size, size);
                let mut hwc = vec![0f32; size * size * 3];
                let mut scratch = RowScratch::default();
                for (y, row) in hwc.chunks_exact_mut(size * 3).enumerate() {
                    area.row(y, row, &mut scratch);
                }
                chw.extend((0..3).flat_map(|c| hwc.iter().skip(c).step_by(3).copied().collect::<Vec<_>>()));
            }
            let x = Tensor::from_vec(chw, (windows.len(), 3, size, size), &Device::Cpu).unwrap();
            let (reg, marks, prob) = if onet {
                let (r, m, p) = nets.onet.forward(&x).unwrap();
                (r, Some(m.to_vec2::<f32>().unwrap()), p)
            } else {
                let (r, p) = nets.rnet.forward(&x).unwrap();
                (r, None, p)
            };
            let (reg, prob) = (reg.to_vec2::<f32>().unwrap(), prob.to_vec2::<f32>().unwrap());
            let mut err = 0f32;
            for (j, o) in got.iter().enumerate() {
                let n = o.len();
                assert_eq!(n, if onet { 16 } else { 6 });
                err = (0..4).fold(err, |e, k| e.max((o[k] - reg[j][k]).abs()));
                if let Some(m) = &marks {
                    err = (0..10).fold(err, |e, k| e.max((o[4 + k] - m[j][k]).abs()));
                }
                let p = super::super::detect::softmax_face(o[n - 2], o[n - 1]);
                err = err.max((p - prob[j][1]).abs());
            }
            println!("{}: max |cpu - candle| {err:e}", if onet { "O-Net" } else { "R-Net" });
            assert!(err < 1e-5, "{err}");
        }
    }
}
