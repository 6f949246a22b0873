//! P-Net on the CPU, fused: one pass over a pyramid level from the image bytes to each output
//! cell's probability and regression, in bands of output rows run in parallel.
//!
//! P-Net runs on every level of the image pyramid, so on a 1080x1920 frame it sees about 1.5
//! million input pixels for a handful of faces; layer by layer on whole maps (as candle does,
//! and as this file did before) most of its time went to writing, allocating and re-reading maps
//! of several megabytes and to separate passes for the bias, PReLU and pooling. Here a band of
//! output rows is computed row by row through small ring buffers that stay in the core's cache:
//! - an input row is the area resampling of the image rows it covers, normalised
//!   ([`super::resample::Area`], PyTorch's values to the bit);
//! - conv1 (3 -> 10) with its PReLU on two rows, then the 2x2 max pool (`ceil_mode`: a last odd
//!   row or column pools alone) into a ring of 3 pooled rows;
//! - conv2 (10 -> 16) with PReLU into a ring of 3 rows; conv3 (16 -> 32) with PReLU into one
//!   row; the two 1x1 heads as one 1x1 convolution 32 -> 6 (regression 4, class logits 2);
//! - the softmax of the two logits as torch computes it (`exp(l - max) / sum`).
//!
//! The convolutions are unpadded, so each output pixel reads only pixels of the map; a band
//! recomputes the few rows it shares with the previous one (2 rows of conv2, 4 pooled rows).
//! The kernels are [`super::kernels`] (AVX-512, AVX2 or portable, by the active ISA level).
//!
//! Tested against the candle P-Net ([`super::PNet`], itself tested against facenet-pytorch) on
//! images of odd and even sizes in `engines/tests/mtcnn.rs`, and the band split against one
//! band in this file's tests.

use std::cell::RefCell;

use rayon::prelude::*;

use super::kernels::{arms, conv_row, pool_row, Arm, Packed, Src, LANES, PAD};
use super::resample::{Area, RowScratch};

/// P-Net's weights packed for the kernels.
pub struct PNetCpu {
    /// conv1 (3 -> 10), conv2 (10 -> 16), conv3 (16 -> 32), each with its PReLU.
    convs: [Packed; 3],
    /// `conv4_2` (regression, 4) and `conv4_1` (class logits, 2) as one 1x1 convolution 32 -> 6.
    head: Packed,
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

/// Where a level's normalised input rows come from.
#[derive(Clone, Copy)]
pub(crate) enum Level<'a> {
    /// Normalised RGB in HWC order, `w` pixels a row.
    Hwc { data: &'a [f32], w: usize },
    /// The area resampling of an image.
    Area(&'a Area<'a>),
}

impl Level<'_> {
    /// Input row `y` into `dst` (3 floats a pixel).
    fn row(&self, y: usize, dst: &mut [f32], s: &mut RowScratch) {
        match self {
            Level::Hwc { data, w } => dst[..w * 3].copy_from_slice(&data[y * w * 3..(y + 1) * w * 3]),
            Level::Area(a) => a.row(y, dst, s),
        }
    }
}

/// A worker's ring buffers, kept between bands and levels.
#[derive(Default)]
struct Scratch {
    input: Vec<f32>,
    resample: RowScratch,
    conv1: Vec<f32>,
    pool1: Vec<f32>,
    conv2: Vec<f32>,
    conv3: Vec<f32>,
    head: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The sizes of one level's maps.
#[derive(Clone, Copy)]
struct Dims {
    /// Input width.
    w: usize,
    /// conv1's output (before pooling).
    w1: usize,
    h1: usize,
    /// Pooled.
    pw: usize,
    /// conv2's output width; conv3's (the output's) size.
    w2: usize,
    h3: usize,
    w3: usize,
}

impl Dims {
    fn new(h: usize, w: usize) -> Dims {
        let (h1, w1) = (h - 2, w - 2);
        let (ph, pw) = (h1.div_ceil(2), w1.div_ceil(2));
        Dims { w, h1, w1, pw, w2: pw - 2, h3: ph - 4, w3: pw - 4 }
    }
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
        let pack = |(w, b, cout, cin): (&[f32], &[f32], usize, usize), slope: &[f32]| {
            Packed::new(3, cin, cout, w, b, Some(slope), None)
        };
        let [c1, c2, c3] = convs;
        let convs = [pack(c1, &slopes[0]), pack(c2, &slopes[1]), pack(c3, &slopes[2])];
        let head_w: Vec<f32> = w42.iter().chain(w41).copied().collect();
        let head_b: Vec<f32> = b42.iter().chain(b41).copied().collect();
        PNetCpu { convs, head: Packed::new(1, 32, 6, &head_w, &head_b, None, None) }
    }

    /// P-Net on one normalised RGB image in HWC order (`h`, `w` >= 12).
    pub fn forward(&self, hwc: Vec<f32>, h: usize, w: usize) -> PNetMap {
        assert!(h >= 12 && w >= 12 && hwc.len() == h * w * 3);
        self.level(Level::Hwc { data: &hwc, w }, h, w, 0)
    }

    /// P-Net on a level `h` x `w` (>= 12 each), in bands of `band_rows` output rows (0: chosen
    /// for the thread count).
    pub(crate) fn level(&self, src: Level, h: usize, w: usize, band_rows: usize) -> PNetMap {
        assert!(h >= 12 && w >= 12);
        let d = Dims::new(h, w);
        // About four bands per thread, so that the last ones balance; at least 8 rows each (a
        // band recomputes 2 rows of conv2 and 4 pooled rows).
        let rows =
            if band_rows > 0 { band_rows.min(d.h3) } else { d.h3.div_ceil(4 * rayon::current_num_threads()).max(8) };
        let cells = d.h3 * d.w3;
        let mut prob = vec![0f32; cells];
        let mut reg = vec![[0f32; 4]; cells];
        let arm = Arm::active();
        prob.par_chunks_mut(rows * d.w3).zip(reg.par_chunks_mut(rows * d.w3)).enumerate().for_each(
            |(b, (prob, reg))| {
                let mut s = SCRATCH.take();
                let r0 = b * rows;
                band(arm, self, &src, d, r0, r0 + prob.len() / d.w3, prob, reg, &mut s);
                SCRATCH.set(s);
            },
        );
        PNetMap { h: d.h3, w: d.w3, prob, reg }
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
    /// Output rows `r0..r1` of one level into `prob` and `reg` (those rows only).
    fn band<V, P1, P2>(
        net: &PNetCpu,
        src: &Level,
        d: Dims,
        r0: usize,
        r1: usize,
        prob: &mut [f32],
        reg: &mut [[f32; 4]],
        s: &mut Scratch,
    ) {
        let [c1, c2, c3] = &net.convs;
        // Every row is `stride` pixels long: the map's width and the tiles' overhang.
        let stride = d.w + PAD;
        let (in_len, row_len) = (stride * 3, stride * LANES);
        let input = at_least(&mut s.input, 4 * in_len);
        let conv1 = at_least(&mut s.conv1, 2 * row_len);
        let pool1 = at_least(&mut s.pool1, 3 * row_len);
        let conv2 = at_least(&mut s.conv2, 3 * row_len);
        let conv3 = at_least(&mut s.conv3, 2 * row_len);
        let head = at_least(&mut s.head, row_len);
        let sums = &mut s.resample;
        // Rings: input row y in slot y % 4, pooled row y in slot y % 3, conv2 row y in y % 3.
        let (mut next_in, mut next_pool, mut next_conv2) = (2 * r0, r0, r0);
        for r in r0..r1 {
            while next_conv2 <= r + 2 {
                while next_pool <= next_conv2 + 2 {
                    // Pooled row p: conv1 rows 2p and 2p + 1 (when inside the map).
                    let p = next_pool;
                    let both = 2 * p + 1 < d.h1;
                    let last_in = 2 * p + if both { 3 } else { 2 };
                    while next_in <= last_in {
                        src.row(next_in, &mut input[(next_in % 4) * in_len..][..in_len], sums);
                        next_in += 1;
                    }
                    let (c1a, c1b) = conv1.split_at_mut(row_len);
                    for (cy, dst) in [(2 * p, c1a), (2 * p + 1, c1b)].into_iter().take(1 + both as usize) {
                        let rows = [0, 1, 2].map(|k| &input[((cy + k) % 4) * in_len..][..in_len]);
                        conv_row::<V, P1, P2>(&Src { rows, cs: 3 }, d.w1, c1, dst);
                    }
                    let pooled = &mut pool1[(p % 3) * row_len..][..row_len];
                    let (c1a, c1b) = conv1.split_at(row_len);
                    pool_row::<V>(&[c1a, c1b][..1 + both as usize], 2, d.w1, LANES, d.pw, pooled);
                    next_pool += 1;
                }
                let q = next_conv2;
                let rows = [0, 1, 2].map(|k| &pool1[((q + k) % 3) * row_len..][..row_len]);
                conv_row::<V, P1, P2>(&Src { rows, cs: LANES }, d.w2, c2, &mut conv2[(q % 3) * row_len..][..row_len]);
                next_conv2 += 1;
            }
            let rows = [0, 1, 2].map(|k| &conv2[((r + k) % 3) * row_len..][..row_len]);
            conv_row::<V, P1, P2>(&Src { rows, cs: LANES }, d.w3, c3, conv3);
            let c3row: &[f32] = conv3;
            conv_row::<V, P1, P2>(&Src { rows: [c3row; 3], cs: 2 * LANES }, d.w3, &net.head, head);
            let o = (r - r0) * d.w3;
            for (x, (p, g)) in prob[o..o + d.w3].iter_mut().zip(&mut reg[o..o + d.w3]).enumerate() {
                let h = &head[x * LANES..x * LANES + 6];
                // softmax over (not face, face), as torch computes it: exp(l - max) / sum.
                let m = h[4].max(h[5]);
                let (e0, e1) = ((h[4] - m).exp(), (h[5] - m).exp());
                *p = e1 / (e0 + e1);
                *g = [h[0], h[1], h[2], h[3]];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::mtcnn::test_values as lcg;

    fn net() -> PNetCpu {
        let conv = |i: u64, co: usize, ci: usize| (lcg(i, co * ci * 9), lcg(i + 10, co));
        let (a, b, c) = (conv(1, 10, 3), conv(2, 16, 10), conv(3, 32, 16));
        let slopes = [lcg(4, 10), lcg(5, 16), lcg(6, 32)];
        let (w41, b41, w42, b42) = (lcg(7, 64), lcg(8, 2), lcg(9, 128), lcg(11, 4));
        PNetCpu::new(
            [(&a.0, &a.1, 10, 3), (&b.0, &b.1, 16, 10), (&c.0, &c.1, 32, 16)],
            slopes,
            (&w41, &b41),
            (&w42, &b42),
        )
    }

    /// Bands of any height give the bits of one band (each output row's sums are the same).
    #[test]
    fn bands_give_the_bits_of_one_band() {
        let net = net();
        for (h, w) in [(12, 12), (41, 29), (64, 37)] {
            let x = lcg(h as u64 * 100 + w as u64, h * w * 3);
            let one = net.level(Level::Hwc { data: &x, w }, h, w, usize::MAX);
            for rows in [1, 2, 5] {
                let m = net.level(Level::Hwc { data: &x, w }, h, w, rows);
                assert_eq!((m.h, m.w), (one.h, one.w));
                assert!(m.prob.iter().zip(&one.prob).all(|(a, b)| a.to_bits() == b.to_bits()), "{h}x{w} by {rows}");
                assert!(m.reg == one.reg, "{h}x{w} by {rows}");
            }
        }
    }
}
