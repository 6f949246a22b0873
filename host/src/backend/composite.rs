//! Compositing of the decoded face crop into the full frame, fused with the conversion to NV12:
//! the background's NV12 is computed once per render, and per frame only the 2x2 blocks of the
//! face box are recomputed (bilinear resize of the crop, blend by a per-pixel weight, BT.709/601).
//! The weight is a feathered rectangle ([`Compositor::new`]) or any table given
//! ([`Compositor::with_alpha`], e.g. the lower-face mask of [`crate::avatar::mask`]).

use crate::backend::cpu::multiversion;
use crate::backend::elem::{ColorMatrix, Elem, RgbLayout, RgbRange};
use crate::Backend;
use anyhow::{bail, ensure, Result};
use cadence_kernels::color;
use cadence_kernels::composite::{blend_vertical, feather_alpha, lerp_tap, tap, Tap};

/// The face box in the full frame, in pixels (the media crate's type, the one face-box type of
/// cadence). The compositor needs it on even coordinates and sizes, so that it covers whole NV12
/// chroma blocks; [`crate::avatar::face_box`] makes it so.
pub use cadence_media::FaceBox;

fn taps(box_len: usize, crop_len: usize) -> Vec<Tap> {
    (0..box_len).map(|p| tap(p as u32, box_len as u32, crop_len as u32)).collect()
}

/// The horizontal taps as three arrays (structure of arrays, so that the resampling loop
/// gathers with vector instructions), each index checked once here against the crop width.
struct RowTaps {
    i0: Vec<u32>,
    i1: Vec<u32>,
    f: Vec<f32>,
    crop_len: usize,
}

impl RowTaps {
    fn new(box_len: usize, crop_len: usize) -> Self {
        let t = taps(box_len, crop_len);
        let (i0, i1): (Vec<u32>, Vec<u32>) = t.iter().map(|t| (t.i0, t.i1)).unzip();
        assert!(i0.iter().chain(&i1).all(|&i| (i as usize) < crop_len), "a tap outside the crop");
        Self { i0, i1, f: t.iter().map(|t| t.f).collect(), crop_len }
    }
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
    /// The feathered rectangle's ramp in pixels when [`Self::new`] made the blend weights; 0
    /// when they were given ([`Self::with_alpha`]). Informational: the weights themselves are
    /// in the tables ([`Self::tables`]), which a prepared avatar stores with this value.
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
    Cuda(crate::backend::cuda::DeviceCompositor),
    Emulated(crate::backend::emulated::EmulatedCompositor),
}

/// The feathered rectangle: per pixel of `face` (row-major, w x h) the blend weight
/// [`feather_alpha`], 1 inside easing to 0 over `feather` pixels toward every edge (0 gives a
/// hard edge). The table [`Compositor::new`] blends with.
pub fn feathered_rect_alpha(face: &FaceBox, feather: f32) -> Vec<f32> {
    (0..face.h).flat_map(|py| (0..face.w).map(move |px| feather_alpha(px, py, face.w, face.h, feather))).collect()
}

/// The checks every constructor makes before it allocates per-box tables: the background's
/// size, an even frame, an even non-empty face box inside it.
fn check_geometry(background_len: usize, width: usize, height: usize, face: &FaceBox) -> Result<()> {
    ensure!(
        background_len == width * height * 3,
        "background has {background_len} bytes, {width}x{height} RGB needs {}",
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
    Ok(())
}

impl Compositor {
    /// `background`: interleaved RGB8, width x height (both even). The blend weight is the
    /// feathered rectangle ([`feathered_rect_alpha`]: `feather` pixels of Hermite ramp at every
    /// edge of the box), recorded in [`Self::feather`]; otherwise as [`Self::with_alpha`].
    pub fn new(
        backend: &Backend,
        background: &[u8],
        width: usize,
        height: usize,
        face: FaceBox,
        feather: f32,
        matrix: ColorMatrix,
    ) -> Result<Self> {
        check_geometry(background.len(), width, height, &face)?;
        let alpha = feathered_rect_alpha(&face, feather);
        let mut c = Self::with_alpha(backend, background, width, height, face, alpha, matrix)?;
        c.feather = feather;
        Ok(c)
    }

    /// A compositor that blends with the given per-box-pixel weight table `alpha` (row-major,
    /// `face.w` x `face.h`, each in [0, 1]), e.g. [`crate::avatar::mask::lower_face_alpha`] or
    /// [`feathered_rect_alpha`]. `background`: interleaved RGB8, width x height (both even); its
    /// NV12 and the (1 - alpha) x background terms are computed here once, on the given backend.
    /// [`Self::feather`] is 0: the table is the whole blend description.
    pub fn with_alpha(
        backend: &Backend,
        background: &[u8],
        width: usize,
        height: usize,
        face: FaceBox,
        alpha: Vec<f32>,
        matrix: ColorMatrix,
    ) -> Result<Self> {
        check_geometry(background.len(), width, height, &face)?;
        let (fx, fy, fw, fh) = face.as_usize();
        ensure!(
            alpha.len() == fw * fh,
            "the blend weight table has {} values, the {fw}x{fh} face box needs {}",
            alpha.len(),
            fw * fh
        );
        if let Some(i) = alpha.iter().position(|a| !(0.0..=1.0).contains(a)) {
            bail!("blend weight {} at box pixel ({}, {}) is not in [0, 1]", alpha[i], i % fw, i / fw);
        }
        let plane = width * height;
        let mut planar = vec![0.0f32; 3 * plane];
        for (i, px) in background.chunks_exact(3).enumerate() {
            for c in 0..3 {
                planar[c * plane + i] = px[c] as f32 / 255.0;
            }
        }
        let background_nv12 =
            backend.rgb_to_nv12(&planar, RgbLayout::packed(width, height, 1), matrix, RgbRange::Unit)?;
        let mut background_term: [Vec<f32>; 3] = std::array::from_fn(|_| Vec::with_capacity(fw * fh));
        for (py, row) in alpha.chunks_exact(fw).enumerate() {
            for (px, &a) in row.iter().enumerate() {
                let bg = (fy + py) * width + fx + px;
                for (c, term) in background_term.iter_mut().enumerate() {
                    term.push((1.0 - a) * 255.0 * planar[c * plane + bg]);
                }
            }
        }
        let tables = CompositorTables { alpha, background_term, background_nv12 };
        Self::from_tables(backend, width, height, face, 0.0, matrix, tables)
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
            Backend::Emulated => Some(DeviceSide::Emulated(crate::backend::emulated::EmulatedCompositor::new(
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
    pub fn device(&self) -> Option<&crate::backend::cuda::DeviceCompositor> {
        match &self.device {
            Some(DeviceSide::Cuda(d)) => Some(d),
            _ => None,
        }
    }

    /// The frame size, face box and matrix the kernel composites with.
    pub fn target(&self) -> crate::backend::launch::CompositeTarget {
        crate::backend::launch::CompositeTarget {
            width: self.width,
            height: self.height,
            face: self.face,
            matrix: self.matrix,
        }
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
            Some(DeviceSide::Cuda(d)) => d.compose(crop, cw, ch, range, self.target(), out),
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
    /// gathers.
    ///
    /// On the calling thread alone: a 512x512 box takes about 1 ms, and split over a thread pool
    /// it waited on workers descheduled by the render's encoder thread. In the Ditto stride-3
    /// render on 2 cores the compositor took 1.4-1.6 s split and 0.8-0.9 s on one thread.
    fn write_box(&self, crop: &[f32], cw: usize, ch: usize, range: RgbRange, out: &mut [u8]) {
        let w = self.width;
        let (fx, fy, fw, fh) = self.face.as_usize();
        let coeffs = color::coeffs(self.matrix.code());
        let rng = range.code();
        let (tx, ty) = (RowTaps::new(fw, cw), taps(fh, ch));
        let mut hz = vec![0f32; 3 * ch * fw];
        let mut row8 = Vec::new();
        for (dst, src) in hz.chunks_mut(fw).zip(crop.chunks(cw)) {
            resample_row(src, &tx, rng, &mut row8, dst);
        }
        let plane = w * self.height;
        let (y_plane, uv_plane) = out.split_at_mut(plane);
        let y_rows = &mut y_plane[fy * w..(fy + fh) * w];
        let uv_rows = &mut uv_plane[(fy / 2) * w..((fy + fh) / 2) * w];
        let mut rgb = BlockRgb::default();
        for (by, (yrows, uvrow)) in y_rows.chunks_mut(2 * w).zip(uv_rows.chunks_mut(w)).enumerate() {
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
            block_row(&rows, &coeffs, &mut y0[x.clone()], &mut y1[x.clone()], &mut uvrow[x], &mut rgb);
        }
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
    /// column), compiled for the instruction set [`crate::backend::cpu::isa`] returns.
    fn resample_row(src: &[f32], taps: &RowTaps, range: u32, row8: &mut Vec<f32>, dst: &mut [f32]) => resample_row_body
}

#[inline(always)]
fn resample_row_body(src: &[f32], taps: &RowTaps, range: u32, row8: &mut Vec<f32>, dst: &mut [f32]) {
    assert_eq!(src.len(), taps.crop_len, "crop row and taps disagree");
    row8.clear();
    row8.extend(src.iter().map(|&v| color::to_8bit(v, range)));
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::backend::cpu::isa() == crate::backend::cpu::Isa::Avx512 {
        // SAFETY: isa() reports AVX-512 only where the CPU has it.
        done = unsafe { lerp_taps_avx512(row8, taps, dst) };
    }
    for (((d, &i0), &i1), &f) in dst.iter_mut().zip(&taps.i0).zip(&taps.i1).zip(&taps.f).skip(done) {
        // SAFETY: RowTaps::new checked every index against crop_len, which is row8's length.
        let (p0, p1) = unsafe { (*row8.get_unchecked(i0 as usize), *row8.get_unchecked(i1 as usize)) };
        *d = lerp_tap(p0, p1, f);
    }
}

/// The tap loop of [`resample_row_body`] for the first multiple of 16 box columns with AVX-512
/// gathers (the loop does not vectorise by itself), operation for operation [`lerp_tap`], so the
/// same bits; returns how many columns it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn lerp_taps_avx512(row8: &[f32], taps: &RowTaps, dst: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    assert!(row8.len() == taps.crop_len && row8.len() <= i32::MAX as usize);
    let n = dst.len().min(taps.f.len()) / 16 * 16;
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= the lengths of dst and the tap arrays (all box_len long), and
        // RowTaps::new checked every index against crop_len, row8's length.
        unsafe {
            let i0 = _mm512_loadu_si512(taps.i0.as_ptr().add(i).cast());
            let i1 = _mm512_loadu_si512(taps.i1.as_ptr().add(i).cast());
            let (p0, p1) = (_mm512_i32gather_ps::<4>(i0, row8.as_ptr()), _mm512_i32gather_ps::<4>(i1, row8.as_ptr()));
            let f = _mm512_loadu_ps(taps.f.as_ptr().add(i));
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_add_ps(p0, _mm512_mul_ps(f, _mm512_sub_ps(p1, p0))));
        }
    }
    n
}

multiversion! {
    /// Two box rows (one row of 2x2 blocks) to NV12, compiled for the instruction set
    /// [`crate::backend::cpu::isa`] returns (the same code, so the same bytes).
    fn block_row(rows: &[BoxRow; 2], coeffs: &color::YuvCoeffs, y0: &mut [u8], y1: &mut [u8], uv: &mut [u8], rgb: &mut BlockRgb) => block_row_body
}

/// The blended 8-bit-scale samples of one block row, `rgb[row][channel][x]`: scratch reused
/// from one block row to the next.
type BlockRgb = [[Vec<f32>; 3]; 2];

#[inline(always)]
fn block_row_body(
    rows: &[BoxRow; 2],
    coeffs: &color::YuvCoeffs,
    y0: &mut [u8],
    y1: &mut [u8],
    uv: &mut [u8],
    rgb: &mut BlockRgb,
) {
    for ((row, yrow), out) in rows.iter().zip([y0, y1]).zip(rgb.iter_mut()) {
        for (c, o) in out.iter_mut().enumerate() {
            o.clear();
            o.extend(
                row.top[c]
                    .iter()
                    .zip(row.bot[c])
                    .zip(row.alpha)
                    .zip(row.bg[c])
                    .map(|(((&t, &b), &a), &g)| blend_vertical(t, b, row.fy, a, g)),
            );
        }
        let [rr, gg, bb] = &*out;
        for (((yv, &r), &g), &b) in yrow.iter_mut().zip(rr).zip(gg).zip(bb) {
            *yv = color::quantize(color::luma(coeffs, r, g, b));
        }
    }
    // Chroma from the 2x2 average in convert_block's order (top-left, top-right, bottom-left,
    // bottom-right). Pairs of columns through `chunks_exact(2)`, so that the loop vectorises.
    let [top, bot] = &*rgb;
    let avg = |t: &[f32], b: &[f32]| (t[0] + t[1] + b[0] + b[1]) * 0.25;
    fn pairs(v: &[f32]) -> std::slice::ChunksExact<'_, f32> {
        v.chunks_exact(2)
    }
    for ((((((pair, r0), g0), b0), r1), g1), b1) in uv
        .chunks_exact_mut(2)
        .zip(pairs(&top[0]))
        .zip(pairs(&top[1]))
        .zip(pairs(&top[2]))
        .zip(pairs(&bot[0]))
        .zip(pairs(&bot[1]))
        .zip(pairs(&bot[2]))
    {
        let (u, v) = color::chroma(coeffs, avg(r0, r1), avg(g0, g1), avg(b0, b1));
        pair[0] = color::quantize(u);
        pair[1] = color::quantize(v);
    }
}
