//! The MTCNN detector around the three networks: facenet-pytorch's `detect_face` (what
//! `MTCNN.detect(img, landmarks=True)` runs), restated step by step.
//!
//! 1. **Pyramid**: scales `m, m f, m f^2, ...` with `m = 12 / min_face_size` while the short side
//!    times the scale is at least 12 (`f` = [`MtcnnConfig::factor`], 0.709). At each scale the
//!    image is resized to `(int(h s + 1), int(w s + 1))` by area averaging (PyTorch's
//!    `interpolate(mode="area")`, i.e. adaptive average pooling: on the CPU row by row inside
//!    P-Net, `super::resample`; for candle [`resample_area`]) and normalised
//!    `(p - 127.5) * 0.0078125`.
//! 2. **P-Net** on each scale: every output cell with face probability `>= thresholds[0]` is a
//!    box `floor((2 (x, y) + 1) / s)` to `floor((2 (x, y) + 12) / s)` with its regression;
//!    NMS at IoU 0.5 within the scale, then at 0.7 over all scales (`nms`, torchvision's rule:
//!    areas without +1, a box suppressed when its IoU exceeds the threshold); the regression is
//!    applied (`x1 + dx1 (x2 - x1)`, ...) and each box made square around its centre (`rerec`).
//! 3. **R-Net** on each box's crop (coordinates truncated to integers, clipped to the image,
//!    1-based as the Caffe code was), resized to 24x24 by area: probability `> thresholds[1]`
//!    kept, NMS 0.7, regression with +1 widths (`bbreg`), squared.
//! 4. **O-Net** on 48x48 crops: probability `> thresholds[2]` kept; landmarks to pixels
//!    (`x1 - 1 + lx (x2 - x1 + 1)`); regression; NMS at 0.7 with the "Min" rule (overlap over the
//!    smaller area, +1 areas, `nms_min`).
//! 5. Faces sorted largest first (`select_largest=True`, the default).
//!
//! Boxes are `[x1, y1, x2, y2]` floats in pixels, top-left origin, as facenet-pytorch returns
//! them; landmarks in the order left eye, right eye, nose, left mouth corner, right mouth corner.
//! Box arithmetic is in f32 as in the reference (its tensors are float32).
//!
//! On the CPU the three networks run on this crate's own kernels straight from the image bytes
//! ([`super::PNetCpu`], [`super::RefineCpu`]); on another device, on candle.

use std::time::Instant;

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::pnet_cpu::Level;
use super::resample::Area;
use super::{MtcnnNets, PNetMap};
use crate::error::{EngineError, Result};

/// The smallest `min_face_size`: P-Net's 12x12 window (a smaller face would need a pyramid level
/// larger than the image).
pub const SMALLEST_FACE: f64 = 12.0;

/// facenet-pytorch's `MTCNN` defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MtcnnConfig {
    /// Smallest face searched for, in pixels (20).
    pub min_face_size: f64,
    /// Face probability thresholds of P-Net, R-Net and O-Net (0.6, 0.7, 0.7).
    pub thresholds: [f32; 3],
    /// Scale step of the pyramid (0.709).
    pub factor: f64,
}

impl Default for MtcnnConfig {
    fn default() -> Self {
        MtcnnConfig { min_face_size: 20.0, thresholds: [0.6, 0.7, 0.7], factor: 0.709 }
    }
}

/// A detected face.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Face {
    /// `[x1, y1, x2, y2]` in pixels.
    pub bbox: [f32; 4],
    /// O-Net's face probability.
    pub score: f32,
    /// `[x, y]` of the left eye, right eye, nose, left and right mouth corners.
    pub landmarks: [[f32; 2]; 5],
}

/// Seconds spent in each stage of one detection.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    /// The pyramid (each level's resampling, which the CPU path fuses into P-Net), P-Net on
    /// every level, the boxes and their NMS.
    pub pnet: f64,
    /// R-Net: crops, network, NMS.
    pub rnet: f64,
    /// O-Net: crops, network, landmarks, NMS, sorting.
    pub onet: f64,
}

/// The image being searched: its bytes, and as float planes for candle's networks.
struct Image<'a> {
    rgb: &'a [u8],
    w: usize,
    h: usize,
    planes: Option<Vec<f32>>,
}

/// A candidate box: `[x1, y1, x2, y2, score]` and a regression.
#[derive(Debug, Clone, Copy)]
struct Cand {
    b: [f32; 4],
    score: f32,
    reg: [f32; 4],
}

/// MTCNN with its networks loaded.
pub struct Mtcnn {
    nets: MtcnnNets,
    device: Device,
    pub config: MtcnnConfig,
}

impl Mtcnn {
    /// The networks from the embedded weights, on `device`.
    pub fn new(device: &Device, config: MtcnnConfig) -> Result<Self> {
        if !(config.min_face_size >= SMALLEST_FACE && config.factor > 0.0 && config.factor < 1.0) {
            return Err(EngineError::BadInput(format!(
                "MTCNN: min_face_size must be >= {SMALLEST_FACE} and factor in (0, 1), got {} and {}",
                config.min_face_size, config.factor
            )));
        }
        Ok(Self { nets: MtcnnNets::load(device)?, device: device.clone(), config })
    }

    /// The faces in an RGB image (`rgb` is `height` rows of `width` pixels, 3 bytes each),
    /// largest first. An image with no face gives an empty list.
    pub fn detect(&self, rgb: &[u8], width: usize, height: usize) -> Result<Vec<Face>> {
        Ok(self.detect_timed(rgb, width, height)?.0)
    }

    /// [`Mtcnn::detect`] with the time each stage took (for benchmarks and profiling).
    pub fn detect_timed(&self, rgb: &[u8], width: usize, height: usize) -> Result<(Vec<Face>, StageTimes)> {
        let mut times = StageTimes::default();
        let mut clock = Instant::now();
        let mut lap = |stage: &mut f64| {
            *stage += clock.elapsed().as_secs_f64();
            clock = Instant::now();
        };
        if rgb.len() != width * height * 3 || width == 0 || height == 0 {
            return Err(EngineError::BadInput(format!(
                "MTCNN: {} bytes is not a {width}x{height} RGB image",
                rgb.len()
            )));
        }
        let img = Image { rgb, w: width, h: height, planes: None };
        // candle's networks read float planes; the CPU paths read the bytes.
        let img =
            if self.nets.cpu().is_none() { Image { planes: Some(planes(rgb, width, height)), ..img } } else { img };
        let th = self.config.thresholds;

        // Stage 1: P-Net over the pyramid.
        let mut scales = Vec::new();
        let m = 12.0 / self.config.min_face_size;
        let (mut scale, mut minl) = (m, height.min(width) as f64 * m);
        while minl >= 12.0 {
            scales.push(scale);
            scale *= self.config.factor;
            minl *= self.config.factor;
        }
        let mut boxes = Vec::new();
        for &s in &scales {
            let (hs, ws) = ((height as f64 * s + 1.0) as usize, (width as f64 * s + 1.0) as usize);
            let PNetMap { h: oh, w: ow, prob, reg } = self.pnet_level(&img, hs, ws)?;
            let s32 = s as f32;
            let mut found = Vec::new();
            for y in 0..oh {
                for x in 0..ow {
                    let i = y * ow + x;
                    let p = prob[i];
                    if p >= th[0] {
                        let (bx, by) = (x as f32, y as f32);
                        found.push(Cand {
                            b: [
                                ((2.0 * bx + 1.0) / s32).floor(),
                                ((2.0 * by + 1.0) / s32).floor(),
                                ((2.0 * bx + 12.0) / s32).floor(),
                                ((2.0 * by + 12.0) / s32).floor(),
                            ],
                            score: p,
                            reg: reg[i],
                        });
                    }
                }
            }
            let keep = nms(&found, 0.5);
            boxes.extend(keep.into_iter().map(|k| found[k]));
        }
        let keep = nms(&boxes, 0.7);
        let mut boxes: Vec<Cand> = keep
            .into_iter()
            .map(|k| {
                let c = boxes[k];
                let (w, h) = (c.b[2] - c.b[0], c.b[3] - c.b[1]);
                let b = [c.b[0] + c.reg[0] * w, c.b[1] + c.reg[1] * h, c.b[2] + c.reg[2] * w, c.b[3] + c.reg[3] * h];
                Cand { b: rerec(b), score: c.score, reg: [0.0; 4] }
            })
            .collect();
        lap(&mut times.pnet);

        // Stage 2: R-Net on 24x24 crops.
        if !boxes.is_empty() {
            let passed: Vec<Cand> = self
                .refine(&img, &boxes, false)?
                .into_iter()
                .filter(|r| r.prob > th[1])
                .map(|r| Cand { b: boxes[r.index].b, score: r.prob, reg: r.reg })
                .collect();
            boxes = nms(&passed, 0.7)
                .into_iter()
                .map(|k| passed[k])
                .map(|c| Cand { b: rerec(bbreg(c.b, c.reg)), ..c })
                .collect();
        }
        lap(&mut times.rnet);

        // Stage 3: O-Net on 48x48 crops, with the landmarks.
        let mut faces = Vec::new();
        if !boxes.is_empty() {
            for r in self.refine(&img, &boxes, true)? {
                if r.prob <= th[2] {
                    continue;
                }
                let b = boxes[r.index].b;
                let (w, h) = (b[2] - b[0] + 1.0, b[3] - b[1] + 1.0);
                let mut landmarks = [[0f32; 2]; 5];
                for (l, point) in landmarks.iter_mut().enumerate() {
                    *point = [w * r.marks[l] + b[0] - 1.0, h * r.marks[5 + l] + b[1] - 1.0];
                }
                faces.push(Face { bbox: bbreg(b, r.reg), score: r.prob, landmarks });
            }
            let cands: Vec<Cand> = faces.iter().map(|f| Cand { b: f.bbox, score: f.score, reg: [0.0; 4] }).collect();
            faces = nms_min(&cands, 0.7).into_iter().map(|k| faces[k]).collect();
        }
        // Largest first (facenet-pytorch's select_largest): a stable sort by area, descending.
        faces.sort_by(|a, b| area(&b.bbox).total_cmp(&area(&a.bbox)));
        lap(&mut times.onet);
        Ok((faces, times))
    }

    /// P-Net on the pyramid level `hs` x `ws`: each output cell's face probability and
    /// regression. On the CPU by [`super::PNetCpu`] straight from the bytes, else by candle.
    fn pnet_level(&self, img: &Image, hs: usize, ws: usize) -> Result<PNetMap> {
        if let Some((pnet, _, _)) = self.nets.cpu() {
            let area = Area::new(img.rgb, img.w, (0, 0, img.w, img.h), ws, hs);
            return Ok(pnet.level(Level::Area(&area), hs, ws, 0));
        }
        let planes = img.planes.as_ref().expect("float planes for candle");
        let chw = normalised(resample_area(planes, 3, img.h, img.w, hs, ws));
        let x = Tensor::from_vec(chw, (1, 3, hs, ws), &self.device)?;
        let (reg, prob) = self.nets.pnet.forward(&x)?;
        let (oh, ow) = (prob.dim(2)?, prob.dim(3)?);
        let cells = oh * ow;
        let prob = prob.flatten_all()?.to_vec1::<f32>()?;
        let reg = reg.flatten_all()?.to_vec1::<f32>()?;
        let reg = (0..cells).map(|i| [reg[i], reg[cells + i], reg[2 * cells + i], reg[3 * cells + i]]).collect();
        Ok(PNetMap { h: oh, w: ow, prob: prob[cells..].to_vec(), reg })
    }

    /// R-Net (or O-Net when `onet`) on each box's crop: integer coordinates clipped to the
    /// image as facenet-pytorch's `pad` does, resized by area to 24x24 (48x48) and normalised.
    /// Boxes whose crop is empty are left out.
    fn refine(&self, img: &Image, boxes: &[Cand], onet: bool) -> Result<Vec<Refined>> {
        let mut kept = Vec::new();
        let mut windows = Vec::new();
        for (k, c) in boxes.iter().enumerate() {
            // trunc toward zero, then 1-based clipping: x >= 1, y >= 1, ex <= w, ey <= h.
            let x = (c.b[0].trunc() as i64).max(1);
            let y = (c.b[1].trunc() as i64).max(1);
            let ex = (c.b[2].trunc() as i64).min(img.w as i64);
            let ey = (c.b[3].trunc() as i64).min(img.h as i64);
            // The crop is rows y-1..ey, columns x-1..ex; empty ones are left out.
            if ey < y || ex < x {
                continue;
            }
            windows.push(((x - 1) as usize, (y - 1) as usize, (ex - x + 1) as usize, (ey - y + 1) as usize));
            kept.push(k);
        }
        if let Some((_, rnet, onet_cpu)) = self.nets.cpu() {
            let net = if onet { onet_cpu } else { rnet };
            let out = net.forward(img.rgb, img.w, &windows);
            return Ok(kept
                .into_iter()
                .zip(out)
                .map(|(index, o)| {
                    let n = o.len();
                    let mut marks = [0f32; 10];
                    if onet {
                        marks.copy_from_slice(&o[4..14]);
                    }
                    Refined { index, reg: [o[0], o[1], o[2], o[3]], marks, prob: softmax_face(o[n - 2], o[n - 1]) }
                })
                .collect());
        }
        let size = if onet { 48 } else { 24 };
        let planes = img.planes.as_ref().expect("float planes for candle");
        let mut data = Vec::new();
        for &(x0, y0, cw, ch) in &windows {
            let mut crop = Vec::with_capacity(3 * cw * ch);
            for plane in planes.chunks_exact(img.w * img.h) {
                for row in y0..y0 + ch {
                    crop.extend_from_slice(&plane[row * img.w + x0..row * img.w + x0 + cw]);
                }
            }
            data.extend(normalised(resample_area(&crop, 3, ch, cw, size, size)));
        }
        let crops = Tensor::from_vec(data, (kept.len(), 3, size, size), &self.device)?;
        let (reg, marks, prob) = if onet {
            let (reg, marks, prob) = self.nets.onet.forward(&crops)?;
            (reg, Some(marks.to_vec2::<f32>()?), prob)
        } else {
            let (reg, prob) = self.nets.rnet.forward(&crops)?;
            (reg, None, prob)
        };
        let (reg, prob) = (reg.to_vec2::<f32>()?, prob.to_vec2::<f32>()?);
        Ok(kept
            .into_iter()
            .enumerate()
            .map(|(j, index)| {
                let mut m = [0f32; 10];
                if let Some(marks) = &marks {
                    m.copy_from_slice(&marks[j]);
                }
                Refined { index, reg: [reg[j][0], reg[j][1], reg[j][2], reg[j][3]], marks: m, prob: prob[j][1] }
            })
            .collect())
    }
}

/// One box's R-Net or O-Net outputs.
struct Refined {
    /// The box's index.
    index: usize,
    reg: [f32; 4],
    /// O-Net's landmarks (5 x, then 5 y, as fractions of the box); zeros from R-Net.
    marks: [f32; 10],
    prob: f32,
}

/// The face class's probability from the two logits, as torch's softmax computes it:
/// `exp(l - max) / sum`.
pub(crate) fn softmax_face(l0: f32, l1: f32) -> f32 {
    let m = l0.max(l1);
    let (e0, e1) = ((l0 - m).exp(), (l1 - m).exp());
    e1 / (e0 + e1)
}

/// RGB bytes as three float planes [3][h][w] (values 0..255), for candle.
fn planes(rgb: &[u8], w: usize, h: usize) -> Vec<f32> {
    let mut data = vec![0f32; 3 * w * h];
    for (i, px) in rgb.chunks_exact(3).enumerate() {
        for c in 0..3 {
            data[c * w * h + i] = px[c] as f32;
        }
    }
    data
}

fn normalised(mut x: Vec<f32>) -> Vec<f32> {
    x.iter_mut().for_each(|v| *v = (*v - 127.5) * 0.0078125);
    x
}

fn area(b: &[f32; 4]) -> f32 {
    (b[2] - b[0]) * (b[3] - b[1])
}

/// PyTorch's `interpolate(mode="area")` (adaptive average pooling) of `c` planes `h` x `w` to
/// `oh` x `ow`: output cell `i` averages input rows `floor(i h / oh)` to `ceil((i + 1) h / oh)`
/// (exclusive), and likewise columns; the window's sum in row-major order divided by its height,
/// then by its width, as PyTorch computes it. The candle path's resampling (the CPU path's is
/// `super::resample`, the same values from the bytes).
pub fn resample_area(src: &[f32], c: usize, h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
    let span = |i: usize, n: usize, o: usize| (i * n / o, ((i + 1) * n).div_ceil(o));
    let mut out = vec![0f32; c * oh * ow];
    // One output row per task (rows are independent; each sum keeps its order).
    out.par_chunks_mut(ow).enumerate().for_each(|(r, dst)| {
        let (plane, oy) = (&src[(r / oh) * h * w..(r / oh + 1) * h * w], r % oh);
        let (y0, y1) = span(oy, h, oh);
        for (ox, d) in dst.iter_mut().enumerate() {
            let (x0, x1) = span(ox, w, ow);
            let mut sum = 0f32;
            for row in plane[y0 * w..y1 * w].chunks_exact(w) {
                for v in &row[x0..x1] {
                    sum += v;
                }
            }
            // Divided by the height, then the width, as PyTorch does (two roundings).
            *d = sum / (y1 - y0) as f32 / (x1 - x0) as f32;
        }
    });
    out
}

/// Makes a box square around its centre, its side the longer one (`rerec`).
fn rerec(b: [f32; 4]) -> [f32; 4] {
    let (w, h) = (b[2] - b[0], b[3] - b[1]);
    let l = w.max(h);
    let (x1, y1) = (b[0] + w * 0.5 - l * 0.5, b[1] + h * 0.5 - l * 0.5);
    [x1, y1, x1 + l, y1 + l]
}

/// Box regression with +1 widths (`bbreg`).
fn bbreg(b: [f32; 4], r: [f32; 4]) -> [f32; 4] {
    let (w, h) = (b[2] - b[0] + 1.0, b[3] - b[1] + 1.0);
    [b[0] + r[0] * w, b[1] + r[1] * h, b[2] + r[2] * w, b[3] + r[3] * h]
}

/// Indices of `c` sorted by score, highest first (ties by index, as a stable sort).
fn by_score(c: &[Cand]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..c.len()).collect();
    order.sort_by(|&a, &b| c[b].score.total_cmp(&c[a].score));
    order
}

/// torchvision's `nms`: highest score first, dropping every later box whose IoU with a kept one
/// exceeds `threshold`; areas `(x2 - x1) (y2 - y1)`. Returns the kept indices, highest first.
fn nms(c: &[Cand], threshold: f32) -> Vec<usize> {
    let mut keep = Vec::new();
    let mut dropped = vec![false; c.len()];
    let order = by_score(c);
    for (n, &i) in order.iter().enumerate() {
        if dropped[i] {
            continue;
        }
        keep.push(i);
        let a = c[i].b;
        for &j in &order[n + 1..] {
            let b = c[j].b;
            let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
            let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
            let inter = iw * ih;
            if inter / (area(&a) + area(&b) - inter) > threshold {
                dropped[j] = true;
            }
        }
    }
    keep
}

/// facenet-pytorch's `nms_numpy` with the "Min" rule: overlap = intersection over the smaller
/// area, areas and sides with +1; a box is kept while its overlap with every kept one is
/// `<= threshold`. Returns the kept indices, highest score first.
fn nms_min(c: &[Cand], threshold: f32) -> Vec<usize> {
    let area1 = |b: &[f32; 4]| (b[2] - b[0] + 1.0) * (b[3] - b[1] + 1.0);
    let mut keep: Vec<usize> = Vec::new();
    for i in by_score(c) {
        let a = c[i].b;
        let suppressed = keep.iter().any(|&k| {
            let b = c[k].b;
            let iw = (a[2].min(b[2]) - a[0].max(b[0]) + 1.0).max(0.0);
            let ih = (a[3].min(b[3]) - a[1].max(b[1]) + 1.0).max(0.0);
            iw * ih / area1(&a).min(area1(&b)) > threshold
        });
        if !suppressed {
            keep.push(i);
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn area_resampling_averages_the_covered_cells() {
        // 4x4 -> 2x2: each output is the mean of a 2x2 block.
        let src: Vec<f32> = (0..16).map(|v| v as f32).collect();
        assert_eq!(resample_area(&src, 1, 4, 4, 2, 2), vec![2.5, 4.5, 10.5, 12.5]);
        // 3 -> 2 columns: spans [0, 2) and [1, 3) (they overlap, as adaptive pooling's do).
        assert_eq!(resample_area(&[0.0, 3.0, 6.0], 1, 1, 3, 1, 2), vec![1.5, 4.5]);
        // Upsampling repeats: 1 -> 3.
        assert_eq!(resample_area(&[7.0], 1, 1, 1, 1, 3), vec![7.0, 7.0, 7.0]);
    }

    #[test]
    fn nms_keeps_the_best_of_overlapping_boxes() {
        let c = |b: [f32; 4], score| Cand { b, score, reg: [0.0; 4] };
        let boxes = [c([0.0, 0.0, 10.0, 10.0], 0.8), c([1.0, 1.0, 11.0, 11.0], 0.9), c([20.0, 20.0, 30.0, 30.0], 0.7)];
        assert_eq!(nms(&boxes, 0.5), vec![1, 2]);
        // IoU of the first two is 81/119 = 0.68: kept at 0.7.
        assert_eq!(nms(&boxes, 0.7), vec![1, 0, 2]);
        // "Min": a box inside another is dropped however small.
        let nested = [c([0.0, 0.0, 100.0, 100.0], 0.9), c([10.0, 10.0, 20.0, 20.0], 0.95)];
        assert_eq!(nms_min(&nested, 0.7), vec![1]);
        assert_eq!(rerec([0.0, 0.0, 10.0, 4.0]), [0.0, -3.0, 10.0, 7.0]);
    }
}
