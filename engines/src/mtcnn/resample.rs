//! Area resampling (PyTorch's `interpolate(mode="area")`, i.e. adaptive average pooling) of a
//! window of an RGB byte image straight to the networks' normalised input, one output row at a
//! time: the pyramid levels P-Net reads and the crops R-Net and O-Net read.
//!
//! Output cell `(i, j)` averages input rows `floor(i h / oh) .. ceil((i + 1) h / oh)` and likewise
//! columns. PyTorch sums the window's values in f32, row by row, and divides by its height, then
//! by its width (`sum / kh / kw`, two roundings). The inputs are bytes, so while every window's sum
//! stays below 2^24 each partial sum is an exact integer whatever the order: here each output row
//! first sums its input rows per column, then each cell sums its columns (separable, about
//! `kh + kw` additions a cell instead of `kh kw`), and the result is PyTorch's to the bit. A window
//! that could reach 2^24 (`kh kw 255`, images of several thousand pixels a side) is summed in
//! PyTorch's own order instead. Then `(v - 127.5) * 0.0078125`, as facenet-pytorch normalises.

use crate::simd::simd_fn;

/// The spans `(start, end)` of adaptive pooling from `n` cells to `o`.
fn spans(n: usize, o: usize) -> Vec<(usize, usize)> {
    (0..o).map(|i| (i * n / o, ((i + 1) * n).div_ceil(o))).collect()
}

/// Resampling of the window `(x0, y0)`, `cw` x `ch` pixels, of an RGB image `iw` pixels wide to
/// `ow` x `oh`.
pub(crate) struct Area<'a> {
    img: &'a [u8],
    iw: usize,
    x0: usize,
    y0: usize,
    cw: usize,
    rows: Vec<(usize, usize)>,
    cols: Vec<(usize, usize)>,
    /// Each output value's window width, per value (`ow * 3`).
    widths: Vec<f32>,
    /// Every window's sum is exact in f32 whatever the order.
    separable: bool,
    /// The column sums fit u16 (windows of at most 257 rows).
    narrow: bool,
}

/// A worker's scratch space for [`Area::row`].
#[derive(Default)]
pub(crate) struct RowScratch {
    wide: Vec<u16>,
    sums: Vec<f32>,
}

impl<'a> Area<'a> {
    /// # Panics
    /// If the window does not lie inside the image or a size is zero.
    pub(crate) fn new(
        img: &'a [u8],
        iw: usize,
        (x0, y0, cw, ch): (usize, usize, usize, usize),
        ow: usize,
        oh: usize,
    ) -> Self {
        assert!(cw > 0 && ch > 0 && ow > 0 && oh > 0 && x0 + cw <= iw && (y0 + ch) * iw * 3 <= img.len());
        let (rows, cols) = (spans(ch, oh), spans(cw, ow));
        let longest = |s: &[(usize, usize)]| s.iter().map(|(a, b)| b - a).max().unwrap_or(0);
        let separable = longest(&rows) * longest(&cols) * 255 < 1 << 24;
        let narrow = longest(&rows) * 255 <= u16::MAX as usize;
        let widths = cols.iter().flat_map(|(a, b)| [(b - a) as f32; 3]).collect();
        Area { img, iw, x0, y0, cw, rows, cols, widths, separable, narrow }
    }

    /// Output row `oy`, normalised, as RGB pixels into `dst` (`3 ow` floats).
    pub(crate) fn row(&self, oy: usize, dst: &mut [f32], s: &mut RowScratch) {
        let (ya, yb) = self.rows[oy];
        let line = |y: usize| &self.img[((self.y0 + y) * self.iw + self.x0) * 3..][..self.cw * 3];
        let kh = (yb - ya) as f32;
        let dst = &mut dst[..self.widths.len()];
        if self.separable {
            // The column sums of the window's rows (exact integers), in u16 while they fit.
            let n = self.cw * 3;
            s.sums.resize(n, 0.0);
            if self.narrow {
                s.wide.resize(n, 0);
                widen(&mut s.wide, line(ya));
                for y in ya + 1..yb {
                    add_u16(&mut s.wide, line(y));
                }
                to_f32(&mut s.sums, &s.wide);
            } else {
                s.sums.iter_mut().zip(line(ya)).for_each(|(v, &b)| *v = b as f32);
                for y in ya + 1..yb {
                    add_f32(&mut s.sums, line(y));
                }
            }
            let sums = &s.sums;
            for (px, &(xa, xb)) in dst.chunks_exact_mut(3).zip(&self.cols) {
                let mut v = [0f32; 3];
                for x in xa..xb {
                    for c in 0..3 {
                        v[c] += sums[x * 3 + c];
                    }
                }
                px.copy_from_slice(&v);
            }
        } else {
            for (px, &(xa, xb)) in dst.chunks_exact_mut(3).zip(&self.cols) {
                for (c, d) in px.iter_mut().enumerate() {
                    let mut v = 0f32;
                    for y in ya..yb {
                        let l = line(y);
                        for x in xa..xb {
                            v += l[x * 3 + c] as f32;
                        }
                    }
                    *d = v;
                }
            }
        }
        average(dst, kh, &self.widths);
    }
}

simd_fn! {
    /// wide[i] = bytes[i].
    fn widen(wide: &mut [u16], bytes: &[u8]) {
        for (w, &b) in wide.iter_mut().zip(bytes) {
            *w = b as u16;
        }
    }
}

simd_fn! {
    /// wide[i] += bytes[i] (callers keep the sums within u16).
    fn add_u16(wide: &mut [u16], bytes: &[u8]) {
        for (w, &b) in wide.iter_mut().zip(bytes) {
            *w += b as u16;
        }
    }
}

simd_fn! {
    fn to_f32(dst: &mut [f32], src: &[u16]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as f32;
        }
    }
}

simd_fn! {
    /// sums[i] += bytes[i].
    fn add_f32(sums: &mut [f32], bytes: &[u8]) {
        for (s, &b) in sums.iter_mut().zip(bytes) {
            *s += b as f32;
        }
    }
}

simd_fn! {
    /// The window sums to normalised averages: `(sum / kh / kw - 127.5) * 0.0078125`, dividing
    /// twice as PyTorch does.
    fn average(v: &mut [f32], kh: f32, widths: &[f32]) {
        for (v, &kw) in v.iter_mut().zip(widths) {
            *v = (*v / kh / kw - 127.5) * 0.0078125;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the direct definition (the window's sum in row-major order, then `/ kh / kw`), on
    /// downsampling by fractional factors, upsampling and an offset window, bit for bit; the
    /// last case has windows of over 257 rows (f32 column sums).
    #[test]
    fn rows_are_the_direct_window_averages() {
        let (iw, ih) = (37, 600);
        let img: Vec<u8> = (0..iw * ih * 3).map(|i| (i * 97 % 251) as u8).collect();
        for (win, ow, oh) in
            [((0, 0, 37, 29), 23, 17), ((5, 3, 11, 7), 24, 24), ((2, 1, 30, 25), 7, 9), ((0, 0, 37, 600), 5, 2)]
        {
            let a = Area::new(&img, iw, win, ow, oh);
            let (x0, y0, cw, ch) = win;
            let mut scratch = RowScratch::default();
            let mut row = vec![0f32; ow * 3];
            for oy in 0..oh {
                a.row(oy, &mut row, &mut scratch);
                let (ya, yb) = (oy * ch / oh, ((oy + 1) * ch).div_ceil(oh));
                for ox in 0..ow {
                    let (xa, xb) = (ox * cw / ow, ((ox + 1) * cw).div_ceil(ow));
                    for c in 0..3 {
                        let mut s = 0f32;
                        for y in ya..yb {
                            for x in xa..xb {
                                s += img[((y0 + y) * iw + x0 + x) * 3 + c] as f32;
                            }
                        }
                        let want = (s / (yb - ya) as f32 / (xb - xa) as f32 - 127.5) * 0.0078125;
                        assert_eq!(row[ox * 3 + c].to_bits(), want.to_bits(), "{win:?} ({ox}, {oy}) {c}");
                    }
                }
            }
        }
    }
}
