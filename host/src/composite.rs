//! Compositing of the decoded face crop into the full frame, fused with the conversion to NV12:
//! the background's NV12 is computed once per render, and per frame only the 2x2 blocks of the
//! face box are recomputed (bilinear resize of the crop, feathered blend, BT.709/601).

use crate::elem::{ColorMatrix, RgbLayout, RgbRange};
use crate::Backend;
use anyhow::{ensure, Result};
use cadence_kernels::color;
use cadence_kernels::composite::{blend_bilinear, feather_alpha, tap, Tap};
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

fn taps(box_len: usize, crop_len: usize) -> Vec<Tap> {
    (0..box_len).map(|p| tap(p as u32, box_len as u32, crop_len as u32)).collect()
}

pub struct Compositor {
    pub width: usize,
    pub height: usize,
    /// Per face-box pixel: the face's blend weight, and (1 - weight) x background RGB in the
    /// 8-bit scale. Both are the same for every frame, so they are computed once.
    alpha: Vec<f32>,
    background_term: [Vec<f32>; 3],
    background_nv12: Vec<u8>,
    pub face: FaceBox,
    pub feather: f32,
    pub matrix: ColorMatrix,
    /// The same per-render data on the GPU when the backend is CUDA.
    device: Option<crate::cuda::DeviceCompositor>,
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
        let mut alpha = Vec::with_capacity(face.w * face.h);
        let mut background_term: [Vec<f32>; 3] = Default::default();
        for py in 0..face.h {
            for px in 0..face.w {
                let a = feather_alpha(px as u32, py as u32, face.w as u32, face.h as u32, feather);
                alpha.push(a);
                let bg = (face.y + py) * width + face.x + px;
                for (c, term) in background_term.iter_mut().enumerate() {
                    term.push((1.0 - a) * 255.0 * planar[c * plane + bg]);
                }
            }
        }
        let device = match backend {
            Backend::Cuda(c) => Some(c.compositor(&alpha, &background_term, &background_nv12)?),
            Backend::Cpu => None,
        };
        Ok(Self { width, height, alpha, background_term, background_nv12, face, feather, matrix, device })
    }

    pub fn frame_bytes(&self) -> usize {
        self.width * self.height * 3 / 2
    }

    /// The GPU copy of the per-render data (built on CUDA only).
    pub fn device(&self) -> Option<&crate::cuda::DeviceCompositor> {
        self.device.as_ref()
    }

    pub fn background_nv12(&self) -> &[u8] {
        &self.background_nv12
    }

    /// Writes one NV12 frame on the backend this compositor was made for: the GPU when it was
    /// built on CUDA (crop uploaded, frame downloaded), else the CPU ([`Self::compose`]).
    pub fn compose_frame(&self, crop: &[f32], cw: usize, ch: usize, range: RgbRange, out: &mut [u8]) -> Result<()> {
        ensure!(crop.len() == 3 * cw * ch && cw > 0 && ch > 0, "crop has {} values, 3 x {cw} x {ch} expected", crop.len());
        ensure!(out.len() == self.frame_bytes(), "output frame has {} bytes, {} expected", out.len(), self.frame_bytes());
        match &self.device {
            Some(d) => d.compose(crop, cw, ch, range, self, out),
            None => {
                self.compose(crop, cw, ch, range, out);
                Ok(())
            }
        }
    }

    /// Writes one NV12 frame on the CPU: the background with the crop (planar 3 x ch x cw, in
    /// `range`) pasted into the face box.
    pub fn compose(&self, crop: &[f32], cw: usize, ch: usize, range: RgbRange, out: &mut [u8]) {
        assert_eq!(crop.len(), 3 * cw * ch);
        assert_eq!(out.len(), self.frame_bytes());
        out.copy_from_slice(&self.background_nv12);
        let (w, f) = (self.width, self.face);
        let coeffs = color::coeffs(self.matrix.code());
        let plane = w * self.height;
        let cplane = cw * ch;
        let rng = range.code();
        let (tx, ty) = (taps(f.w, cw), taps(f.h, ch));
        // To the 8-bit scale once per crop pixel, not once per bilinear tap.
        let crop8: Vec<f32> = crop.iter().map(|&v| color::to_8bit(v, rng)).collect();
        let px = |c: usize, x: u32, y: u32| crop8[c * cplane + y as usize * cw + x as usize];
        let (y_plane, uv_plane) = out.split_at_mut(plane);
        let y_rows = &mut y_plane[f.y * w..(f.y + f.h) * w];
        let uv_rows = &mut uv_plane[(f.y / 2) * w..((f.y + f.h) / 2) * w];
        y_rows.par_chunks_mut(2 * w).zip(uv_rows.par_chunks_mut(w)).enumerate().for_each(|(by, (yrows, uvrow))| {
            let (y0, y1) = yrows.split_at_mut(w);
            for bx in 0..f.w / 2 {
                let mut rgb = [[0.0f32; 4]; 3];
                for (k, (dx, dy)) in [(0, 0), (1, 0), (0, 1), (1, 1)].into_iter().enumerate() {
                    let (px_, py_) = (2 * bx + dx, 2 * by + dy);
                    let (a, i) = (self.alpha[py_ * f.w + px_], py_ * f.w + px_);
                    let (h, v) = (&tx[px_], &ty[py_]);
                    for c in 0..3 {
                        rgb[c][k] = blend_bilinear(px(c, h.i0, v.i0), px(c, h.i1, v.i0), px(c, h.i0, v.i1), px(c, h.i1, v.i1), h, v, a, self.background_term[c][i]);
                    }
                }
                let t = |c: usize| (rgb[c][0], rgb[c][1], rgb[c][2], rgb[c][3]);
                let blk = color::convert_block(&coeffs, t(0), t(1), t(2));
                let x = f.x + 2 * bx;
                crate::cpu::store_block(&blk, y0, y1, uvrow, x);
            }
        });
    }
}
