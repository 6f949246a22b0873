//! Compositing of the decoded face crop into the full frame, fused with the conversion to NV12:
//! the background's NV12 is computed once per render, and per frame only the 2x2 blocks of the
//! face box are recomputed (bilinear resize of the crop, feathered blend, BT.709/601).

use crate::elem::{ColorMatrix, RgbLayout, RgbRange};
use crate::Backend;
use anyhow::{ensure, Result};
use cadence_kernels::color;
use cadence_kernels::composite::{crop_coord, feather_alpha};
use rayon::prelude::*;

/// A face box in the full frame, in pixels. Kept on even coordinates and sizes so it covers
/// whole NV12 chroma blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FaceBox {
    pub x: usize,
    pub y: usize,
    pub w: usize,
    pub h: usize,
}

pub struct Compositor {
    pub width: usize,
    pub height: usize,
    /// Background as planar 8-bit-scale RGB (f32), for blending at the feathered edge.
    background_rgb: Vec<f32>,
    background_nv12: Vec<u8>,
    pub face: FaceBox,
    pub feather: f32,
    pub matrix: ColorMatrix,
}

impl Compositor {
    /// `background`: interleaved RGB8, width x height (both even). The NV12 of the background is
    /// computed here once, on the given backend.
    pub fn new(backend: &Backend, background: &[u8], width: usize, height: usize, face: FaceBox, feather: f32, matrix: ColorMatrix) -> Result<Self> {
        ensure!(background.len() == width * height * 3, "background has {} bytes, {width}x{height} RGB needs {}", background.len(), width * height * 3);
        ensure!(width % 2 == 0 && height % 2 == 0, "the output frame must have an even width and height (got {width}x{height})");
        ensure!(face.x % 2 == 0 && face.y % 2 == 0 && face.w % 2 == 0 && face.h % 2 == 0 && face.w > 0 && face.h > 0, "face box {face:?} must have even position and size");
        ensure!(face.x + face.w <= width && face.y + face.h <= height, "face box {face:?} is outside the {width}x{height} frame");
        let plane = width * height;
        let mut planar = vec![0.0f32; 3 * plane];
        for (i, px) in background.chunks_exact(3).enumerate() {
            for c in 0..3 {
                planar[c * plane + i] = px[c] as f32 / 255.0;
            }
        }
        let background_nv12 = backend.rgb_to_nv12(&planar, RgbLayout::packed(width, height, 1), matrix, RgbRange::Unit)?;
        planar.iter_mut().for_each(|v| *v *= 255.0);
        Ok(Self { width, height, background_rgb: planar, background_nv12, face, feather, matrix })
    }

    pub fn frame_bytes(&self) -> usize {
        self.width * self.height * 3 / 2
    }

    pub fn background_nv12(&self) -> &[u8] {
        &self.background_nv12
    }

    /// Writes one NV12 frame: the background with the crop (planar 3 x ch x cw, in `range`)
    /// pasted into the face box.
    pub fn compose(&self, crop: &[f32], cw: usize, ch: usize, range: RgbRange, out: &mut [u8]) {
        assert_eq!(crop.len(), 3 * cw * ch);
        assert_eq!(out.len(), self.frame_bytes());
        out.copy_from_slice(&self.background_nv12);
        let (w, f) = (self.width, self.face);
        let coeffs = color::coeffs(self.matrix.code());
        let plane = w * self.height;
        let cplane = cw * ch;
        let rng = range.code();
        let sample = |c: usize, x: f32, y: f32| -> f32 {
            // Bilinear, clamped to the crop.
            let x = x.clamp(0.0, (cw - 1) as f32);
            let y = y.clamp(0.0, (ch - 1) as f32);
            let (x0, y0) = (x.floor() as usize, y.floor() as usize);
            let (x1, y1) = ((x0 + 1).min(cw - 1), (y0 + 1).min(ch - 1));
            let (fx, fy) = (x - x0 as f32, y - y0 as f32);
            let p = |xx: usize, yy: usize| color::to_8bit(crop[c * cplane + yy * cw + xx], rng);
            let top = p(x0, y0) * (1.0 - fx) + p(x1, y0) * fx;
            let bot = p(x0, y1) * (1.0 - fx) + p(x1, y1) * fx;
            top * (1.0 - fy) + bot * fy
        };
        let (y_plane, uv_plane) = out.split_at_mut(plane);
        let y_rows = &mut y_plane[f.y * w..(f.y + f.h) * w];
        let uv_rows = &mut uv_plane[(f.y / 2) * w..((f.y + f.h) / 2) * w];
        y_rows.par_chunks_mut(2 * w).zip(uv_rows.par_chunks_mut(w)).enumerate().for_each(|(by, (yrows, uvrow))| {
            let (y0, y1) = yrows.split_at_mut(w);
            for bx in 0..f.w / 2 {
                let mut rgb = [[0.0f32; 4]; 3];
                for (k, (dx, dy)) in [(0, 0), (1, 0), (0, 1), (1, 1)].into_iter().enumerate() {
                    let (px, py) = (2 * bx + dx, 2 * by + dy);
                    let a = feather_alpha(px as u32, py as u32, f.w as u32, f.h as u32, self.feather);
                    let (sx, sy) = (crop_coord(px as u32, f.w as u32, cw as u32), crop_coord(py as u32, f.h as u32, ch as u32));
                    let bg = (f.y + py) * w + f.x + px;
                    for c in 0..3 {
                        rgb[c][k] = a * sample(c, sx, sy) + (1.0 - a) * self.background_rgb[c * plane + bg];
                    }
                }
                let t = |c: usize| (rgb[c][0], rgb[c][1], rgb[c][2], rgb[c][3]);
                let blk = color::convert_block(&coeffs, t(0), t(1), t(2));
                let x = f.x + 2 * bx;
                y0[x] = blk.y.0;
                y0[x + 1] = blk.y.1;
                y1[x] = blk.y.2;
                y1[x + 1] = blk.y.3;
                uvrow[x] = blk.u;
                uvrow[x + 1] = blk.v;
            }
        });
    }
}
