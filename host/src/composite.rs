//! Compositing of the decoded face crop into the full frame, fused with the conversion to NV12:
//! the background's NV12 is computed once per render, and per frame only the 2x2 blocks of the
//! face box are recomputed (bilinear resize of the crop, feathered blend, BT.709/601).

use crate::cpu::multiversion;
use crate::elem::{ColorMatrix, Elem, RgbLayout, RgbRange};
use crate::Backend;
use anyhow::{ensure, Result};
use cadence_kernels::color;
use cadence_kernels::composite::{blend_vertical, feather_alpha, lerp_tap, tap, Tap};
use rayon::prelude::*;

/// The face box in the full frame, in pixels (the media crate's type, the one face-box type of
/// cadence). The compositor needs it on even coordinates and sizes, so that it covers whole NV12
/// chroma blocks; [`crate::render::face_box`] makes it so.
pub use cadence_media::FaceBox;

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
    /// The same per-render data where the backend's kernels run (CUDA or the emulator).
    device: Option<DeviceSide>,
}

/// What a compositor computes once per avatar: per face-box pixel the blend weight and
/// (1 - weight) x background RGB (8-bit scale), and the background's NV12.
#[derive(Clone, Debug, PartialEq)]
pub struct CompositorTables {
    pub alpha: Vec<f32>,
    pub background_term: [Vec<f32>; 3],
    pub background_nv12: Vec<u8>,
}

/// Where a compositor's kernel runs.
enum DeviceSide {
    Cuda(crate::cuda::DeviceCompositor),
    Emulated(crate::emulated::EmulatedCompositor),
}

impl Compositor {
    /// `background`: interleaved RGB8, width x height (both even). The NV12 of the background is
    /// computed here once, on the given backend.
    pub fn new(
        backend: &Backend,
        background: &[u8],
        width: usize,
        height: usize,
        face: FaceBox,
        feather: f32,
        matrix: ColorMatrix,
    ) -> Result<Self> {
        ensure!(
            background.len() == width * height * 3,
            "background has {} bytes, {width}x{height} RGB needs {}",
            background.len(),
            width * height * 3
        );
        ensure!(
            width.is_multiple_of(2) && height.is_multiple_of(2),
            "the output frame must have an even width and height (got {width}x{height})"
        );
        ensure!(
            face.x.is_multiple_of(2)
                && face.y.is_multiple_of(2)
                && face.w.is_multiple_of(2)
                && face.h.is_multiple_of(2)
                && face.w > 0
                && face.h > 0,
            "face box {face:?} must have even position and size"
        );
        let (fx, fy, fw, fh) = face.as_usize();
        ensure!(fx + fw <= width && fy + fh <= height, "face box {face:?} is outside the {width}x{height} frame");
        let plane = width * height;
        let mut planar = vec![0.0f32; 3 * plane];
        for (i, px) in background.chunks_exact(3).enumerate() {
            for c in 0..3 {
                planar[c * plane + i] = px[c] as f32 / 255.0;
            }
        }
        let background_nv12 =
            backend.rgb_to_nv12(&planar, RgbLayout::packed(width, height, 1), matrix, RgbRange::Unit)?;
        let mut alpha = Vec::with_capacity(fw * fh);
        let mut background_term: [Vec<f32>; 3] = Default::default();
        for py in 0..fh {
            for px in 0..fw {
                let a = feather_alpha(px as u32, py as u32, face.w, face.h, feather);
                alpha.push(a);
                let bg = (fy + py) * width + fx + px;
                for (c, term) in background_term.iter_mut().enumerate() {
                    term.push((1.0 - a) * 255.0 * planar[c * plane + bg]);
                }
            }
        }
        let tables = CompositorTables { alpha, background_term, background_nv12 };
        Self::from_tables(backend, width, height, face, feather, matrix, tables)
    }

    /// A compositor from tables made before ([`Self::tables`], e.g. read from a prepared-avatar
    /// file), checked against the frame and face box sizes.
    pub fn from_tables(
        backend: &Backend,
        width: usize,
        height: usize,
        face: FaceBox,
        feather: f32,
        matrix: ColorMatrix,
        tables: CompositorTables,
    ) -> Result<Self> {
        let CompositorTables { alpha, background_term, background_nv12 } = tables;
        let (fx, fy, fw, fh) = face.as_usize();
        ensure!(
            width.is_multiple_of(2) && height.is_multiple_of(2) && fx + fw <= width && fy + fh <= height,
            "face box {face:?} does not fit an even {width}x{height} frame"
        );
        ensure!(
            alpha.len() == fw * fh
                && background_term.iter().all(|t| t.len() == fw * fh)
                && background_nv12.len() == width * height * 3 / 2,
            "compositor tables do not match a {fw}x{fh} face box in a {width}x{height} frame"
        );
        let device = match backend {
            Backend::Cuda(c) => Some(DeviceSide::Cuda(c.compositor(&alpha, &background_term, &background_nv12)?)),
            Backend::Emulated => Some(DeviceSide::Emulated(crate::emulated::EmulatedCompositor::new(
                &alpha,
                &background_term,
                &background_nv12,
            ))),
            Backend::Cpu => None,
        };
        Ok(Self { width, height, alpha, background_term, background_nv12, face, feather, matrix, device })
    }

    /// The per-render tables, as [`Self::from_tables`] takes them.
    pub fn tables(&self) -> CompositorTables {
        CompositorTables {
            alpha: self.alpha.clone(),
            background_term: self.background_term.clone(),
            background_nv12: self.background_nv12.clone(),
        }
    }

    pub fn frame_bytes(&self) -> usize {
        self.width * self.height * 3 / 2
    }

    /// The GPU copy of the per-render data (built on CUDA only).
    pub fn device(&self) -> Option<&crate::cuda::DeviceCompositor> {
        match &self.device {
            Some(DeviceSide::Cuda(d)) => Some(d),
            _ => None,
        }
    }

    /// The frame size, face box and matrix the kernel composites with.
    pub fn target(&self) -> crate::launch::CompositeTarget {
        crate::launch::CompositeTarget { width: self.width, height: self.height, face: self.face, matrix: self.matrix }
    }

    /// What the kernel gets per render: the box's blend weights and the (1 - alpha) x background
    /// term (3 planes of the box, one after the other).
    pub fn per_render_data(&self) -> (&[f32], Vec<f32>) {
        (&self.alpha, self.background_term.iter().flatten().copied().collect())
    }

    pub fn background_nv12(&self) -> &[u8] {
        &self.background_nv12
    }

    /// Writes one NV12 frame on the backend this compositor was made for: the GPU when it was
    /// built on CUDA (crop uploaded, frame downloaded), the emulator when built on it, else the
    /// CPU ([`Self::compose`]). The crop is f32 or f16 (the kernel's two storage types); the CPU
    /// path computes in f32 either way.
    pub fn compose_frame<T: Elem>(
        &self,
        crop: &[T],
        cw: usize,
        ch: usize,
        range: RgbRange,
        out: &mut [u8],
    ) -> Result<()> {
        self.check(crop.len(), cw, ch, out)?;
        if self.device.is_none() {
            out.copy_from_slice(&self.background_nv12);
        }
        self.compose_box(crop, cw, ch, range, out)
    }

    /// As [`Self::compose_frame`], but on the CPU only the face box of `out` is written: the rest
    /// must already hold the background (start the buffer from [`Self::background_nv12`] and
    /// reuse it). The render loop keeps one frame buffer this way and saves a full-frame copy
    /// (3 MB at 1080x1920) per frame.
    pub fn compose_box<T: Elem>(
        &self,
        crop: &[T],
        cw: usize,
        ch: usize,
        range: RgbRange,
        out: &mut [u8],
    ) -> Result<()> {
        self.check(crop.len(), cw, ch, out)?;
        match &self.device {
            Some(DeviceSide::Cuda(d)) => d.compose(crop, cw, ch, range, self, out),
            Some(DeviceSide::Emulated(e)) => e.compose(crop, cw, ch, range, self.target(), out),
            None => {
                match T::as_f32(crop) {
                    Some(c) => self.write_box(c, cw, ch, range, out),
                    None => {
                        let mut wide = vec![0f32; crop.len()];
                        T::widen(crop, &mut wide);
                        self.write_box(&wide, cw, ch, range, out)
                    }
                }
                Ok(())
            }
        }
    }

    fn check(&self, crop_len: usize, cw: usize, ch: usize, out: &[u8]) -> Result<()> {
        ensure!(crop_len == 3 * cw * ch && cw > 0 && ch > 0, "crop has {crop_len} values, 3 x {cw} x {ch} expected");
        ensure!(
            out.len() == self.frame_bytes(),
            "output frame has {} bytes, {} expected",
            out.len(),
            self.frame_bytes()
        );
        Ok(())
    }

    /// Writes one NV12 frame on the CPU: the background with the crop (planar 3 x ch x cw, in
    /// `range`) pasted into the face box.
    pub fn compose(&self, crop: &[f32], cw: usize, ch: usize, range: RgbRange, out: &mut [u8]) {
        assert_eq!(crop.len(), 3 * cw * ch);
        assert_eq!(out.len(), self.frame_bytes());
        out.copy_from_slice(&self.background_nv12);
        self.write_box(crop, cw, ch, range, out);
    }

    /// The face box of `out`, on the CPU, in two separable passes: the horizontal taps of every
    /// crop row once (`hz`, [`lerp_tap`]), then per output row the vertical taps and blend
    /// ([`blend_vertical`]) and NV12. These are the two halves of [`cadence_kernels::composite::blend_bilinear`], which the
    /// GPU kernel evaluates per pixel, so the bytes are identical, at a fraction of the per-pixel
    /// gathers (measured 5.0 ms -> 1.x ms per 512x512 box on 2 cores).
    fn write_box(&self, crop: &[f32], cw: usize, ch: usize, range: RgbRange, out: &mut [u8]) {
        let w = self.width;
        let (fx, fy, fw, fh) = self.face.as_usize();
        let coeffs = color::coeffs(self.matrix.code());
        let rng = range.code();
        let (tx, ty) = (taps(fw, cw), taps(fh, ch));
        let mut hz = vec![0f32; 3 * ch * fw];
        hz.par_chunks_mut(fw)
            .zip(crop.par_chunks(cw))
            .for_each_init(Vec::new, |row8, (dst, src)| resample_row(src, &tx, rng, row8, dst));
        let plane = w * self.height;
        let (y_plane, uv_plane) = out.split_at_mut(plane);
        let y_rows = &mut y_plane[fy * w..(fy + fh) * w];
        let uv_rows = &mut uv_plane[(fy / 2) * w..((fy + fh) / 2) * w];
        y_rows.par_chunks_mut(2 * w).zip(uv_rows.par_chunks_mut(w)).enumerate().for_each(|(by, (yrows, uvrow))| {
            let (y0, y1) = yrows.split_at_mut(w);
            let rows = [2 * by, 2 * by + 1].map(|py| {
                let v = &ty[py];
                let hz_row = |c: usize, row: u32| &hz[(c * ch + row as usize) * fw..(c * ch + row as usize + 1) * fw];
                BoxRow {
                    top: [0, 1, 2].map(|c| hz_row(c, v.i0)),
                    bot: [0, 1, 2].map(|c| hz_row(c, v.i1)),
                    fy: v.f,
                    alpha: &self.alpha[py * fw..(py + 1) * fw],
                    bg: [0, 1, 2].map(|c| &self.background_term[c][py * fw..(py + 1) * fw]),
                }
            });
            let x = fx..fx + fw;
            block_row(&rows, &coeffs, &mut y0[x.clone()], &mut y1[x.clone()], &mut uvrow[x]);
        });
    }
}

/// The inputs of one box row: the horizontally resampled crop rows above and below it, the
/// vertical tap weight, and the per-render blend weight and background terms.
struct BoxRow<'a> {
    top: [&'a [f32]; 3],
    bot: [&'a [f32]; 3],
    fy: f32,
    alpha: &'a [f32],
    bg: [&'a [f32]; 3],
}

multiversion! {
    /// One crop row to the 8-bit scale and resampled to the box width ([`lerp_tap`] per box
    /// column), compiled for the instruction set [`crate::cpu::isa`] returns.
    fn resample_row(src: &[f32], taps: &[Tap], range: u32, row8: &mut Vec<f32>, dst: &mut [f32]) => resample_row_body
}

#[inline(always)]
fn resample_row_body(src: &[f32], taps: &[Tap], range: u32, row8: &mut Vec<f32>, dst: &mut [f32]) {
    row8.clear();
    row8.extend(src.iter().map(|&v| color::to_8bit(v, range)));
    for (d, t) in dst.iter_mut().zip(taps) {
        *d = lerp_tap(row8[t.i0 as usize], row8[t.i1 as usize], t.f);
    }
}

multiversion! {
    /// Two box rows (one row of 2x2 blocks) to NV12, compiled for the instruction set
    /// [`crate::cpu::isa`] returns (the same code, so the same bytes).
    fn block_row(rows: &[BoxRow; 2], coeffs: &color::YuvCoeffs, y0: &mut [u8], y1: &mut [u8], uv: &mut [u8]) => block_row_body
}

#[inline(always)]
fn block_row_body(rows: &[BoxRow; 2], coeffs: &color::YuvCoeffs, y0: &mut [u8], y1: &mut [u8], uv: &mut [u8]) {
    let n = y0.len();
    // Blended 8-bit-scale samples: rgb[r][c][x].
    let mut rgb = [[vec![0f32; n], vec![0f32; n], vec![0f32; n]], [vec![0f32; n], vec![0f32; n], vec![0f32; n]]];
    for ((row, yrow), out) in rows.iter().zip([y0, y1]).zip(rgb.iter_mut()) {
        for (c, o) in out.iter_mut().enumerate() {
            for ((((o, &t), &b), &a), &g) in o.iter_mut().zip(row.top[c]).zip(row.bot[c]).zip(row.alpha).zip(row.bg[c])
            {
                *o = blend_vertical(t, b, row.fy, a, g);
            }
        }
        let [rr, gg, bb] = &*out;
        for (((yv, &r), &g), &b) in yrow.iter_mut().zip(rr).zip(gg).zip(bb) {
            *yv = color::quantize(color::luma(coeffs, r, g, b));
        }
    }
    // Chroma from the 2x2 average in convert_block's order (top-left, top-right, bottom-left,
    // bottom-right).
    let avg = |c: usize, x: usize| (rgb[0][c][x] + rgb[0][c][x + 1] + rgb[1][c][x] + rgb[1][c][x + 1]) * 0.25;
    for (bx, pair) in uv.chunks_exact_mut(2).enumerate() {
        let (u, v) = color::chroma(coeffs, avg(0, 2 * bx), avg(1, 2 * bx), avg(2, 2 * bx));
        pair[0] = color::quantize(u);
        pair[1] = color::quantize(v);
    }
}
