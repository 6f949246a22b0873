//! Frame and clip quality metrics for the stride experiments (docs/design.md, metrics): PSNR,
//! SSIM, max abs error, temporal flicker and sharpness.
//!
//! Images are f32 samples in planar layout (all of channel 0, then channel 1, ...), row-major,
//! the layout the decoders and the NV12 kernel use; `peak` is the value range (1.0 for samples
//! in [0, 1], 255.0 for 8-bit values, 2.0 for [-1, 1]). Colour metrics work on luma
//! (BT.601 weights, as MATLAB's rgb2gray and Wang et al.'s evaluations use). Every function
//! rejects mismatched sizes and NaN input with an error instead of returning NaN.

use anyhow::{bail, ensure, Result};

/// Size of one planar image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageShape {
    pub width: usize,
    pub height: usize,
    /// 1 (gray) or 3 (planar RGB).
    pub channels: usize,
}

impl ImageShape {
    pub fn gray(width: usize, height: usize) -> Self {
        ImageShape { width, height, channels: 1 }
    }
    pub fn rgb(width: usize, height: usize) -> Self {
        ImageShape { width, height, channels: 3 }
    }
    pub fn plane_len(&self) -> usize {
        self.width * self.height
    }
    pub fn len(&self) -> usize {
        self.plane_len() * self.channels
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn check(&self, data: &[f32], what: &str) -> Result<()> {
        ensure!(self.width > 0 && self.height > 0, "{what}: empty image {}x{}", self.width, self.height);
        ensure!(
            self.channels == 1 || self.channels == 3,
            "{what}: {} channels; expected 1 (gray) or 3 (RGB)",
            self.channels
        );
        ensure!(
            data.len() == self.len(),
            "{what}: {} samples for a {}x{}x{} image ({} expected)",
            data.len(),
            self.channels,
            self.height,
            self.width,
            self.len()
        );
        Ok(())
    }
}

/// A rectangle of pixels (e.g. the mouth region).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

fn check_pair(a: &[f32], b: &[f32]) -> Result<()> {
    ensure!(!a.is_empty(), "cannot compare empty images");
    ensure!(a.len() == b.len(), "images differ in size: {} and {} samples", a.len(), b.len());
    check_finite(a, "first image")?;
    check_finite(b, "second image")
}

fn check_finite(a: &[f32], what: &str) -> Result<()> {
    if let Some(i) = a.iter().position(|v| !v.is_finite()) {
        bail!("{what}: non-finite sample {} at index {i}", a[i]);
    }
    Ok(())
}

/// Mean squared error.
pub fn mse(a: &[f32], b: &[f32]) -> Result<f64> {
    check_pair(a, b)?;
    Ok(a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>() / a.len() as f64)
}

/// PSNR in dB, 10 log10(peak^2 / MSE); +infinity for identical images.
pub fn psnr(a: &[f32], b: &[f32], peak: f64) -> Result<f64> {
    ensure!(peak > 0.0 && peak.is_finite(), "PSNR needs a positive peak value (got {peak})");
    let m = mse(a, b)?;
    Ok(if m == 0.0 { f64::INFINITY } else { 10.0 * (peak * peak / m).log10() })
}

/// max |a - b|.
pub fn max_abs_error(a: &[f32], b: &[f32]) -> Result<f64> {
    check_pair(a, b)?;
    Ok(a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).abs()).fold(0.0, f64::max))
}

/// BT.601 luma weights (R, G, B).
pub const LUMA_601: [f64; 3] = [0.299, 0.587, 0.114];

/// Luma plane of a planar image (the plane itself for gray).
pub fn luma(img: &[f32], shape: ImageShape) -> Result<Vec<f64>> {
    shape.check(img, "image")?;
    check_finite(img, "image")?;
    let p = shape.plane_len();
    Ok(if shape.channels == 1 {
        img.iter().map(|&v| v as f64).collect()
    } else {
        (0..p)
            .map(|i| {
                LUMA_601[0] * img[i] as f64 + LUMA_601[1] * img[p + i] as f64 + LUMA_601[2] * img[2 * p + i] as f64
            })
            .collect()
    })
}

/// SSIM window: 11 x 11 Gaussian, sigma 1.5 (Wang, Bovik, Sheikh, Simoncelli 2004).
pub const SSIM_WINDOW: usize = 11;
pub const SSIM_SIGMA: f64 = 1.5;
/// K1, K2 of Wang et al. 2004: C1 = (K1 L)^2, C2 = (K2 L)^2 with L the peak value.
pub const SSIM_K1: f64 = 0.01;
pub const SSIM_K2: f64 = 0.03;

/// The normalized 1-D Gaussian of the SSIM window (the 2-D window is its outer product).
pub fn ssim_gaussian_1d() -> [f64; SSIM_WINDOW] {
    let r = (SSIM_WINDOW / 2) as f64;
    let mut g = [0.0; SSIM_WINDOW];
    for (i, w) in g.iter_mut().enumerate() {
        let d = i as f64 - r;
        *w = (-d * d / (2.0 * SSIM_SIGMA * SSIM_SIGMA)).exp();
    }
    let s: f64 = g.iter().sum();
    g.iter_mut().for_each(|w| *w /= s);
    g
}

/// Gaussian-weighted means over every full window ("valid" filtering: no padding), output
/// (h - 10) x (w - 10), separably.
fn filter_valid(img: &[f64], w: usize, h: usize, g: &[f64; SSIM_WINDOW]) -> Vec<f64> {
    let (ow, oh) = (w - SSIM_WINDOW + 1, h - SSIM_WINDOW + 1);
    let mut rows = vec![0.0; h * ow];
    for y in 0..h {
        for x in 0..ow {
            rows[y * ow + x] = (0..SSIM_WINDOW).map(|k| g[k] * img[y * w + x + k]).sum();
        }
    }
    let mut out = vec![0.0; oh * ow];
    for y in 0..oh {
        for x in 0..ow {
            out[y * ow + x] = (0..SSIM_WINDOW).map(|k| g[k] * rows[(y + k) * ow + x]).sum();
        }
    }
    out
}

/// Mean SSIM of two gray images (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5,
/// K1 = 0.01, K2 = 0.03, mean over the windows that fit entirely in the image).
pub fn ssim_gray(a: &[f64], b: &[f64], width: usize, height: usize, peak: f64) -> Result<f64> {
    ensure!(peak > 0.0 && peak.is_finite(), "SSIM needs a positive peak value (got {peak})");
    ensure!(
        width >= SSIM_WINDOW && height >= SSIM_WINDOW,
        "SSIM needs images of at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels (got {width}x{height})"
    );
    ensure!(a.len() == width * height && b.len() == a.len(), "SSIM: image sizes do not match {width}x{height}");
    ensure!(a.iter().chain(b).all(|v| v.is_finite()), "SSIM: non-finite sample in the input");
    let g = ssim_gaussian_1d();
    let c1 = (SSIM_K1 * peak).powi(2);
    let c2 = (SSIM_K2 * peak).powi(2);
    let prod = |f: &dyn Fn(f64, f64) -> f64| -> Vec<f64> { a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect() };
    let mu_a = filter_valid(a, width, height, &g);
    let mu_b = filter_valid(b, width, height, &g);
    let e_aa = filter_valid(&prod(&|x, _| x * x), width, height, &g);
    let e_bb = filter_valid(&prod(&|_, y| y * y), width, height, &g);
    let e_ab = filter_valid(&prod(&|x, y| x * y), width, height, &g);
    let n = mu_a.len();
    let mut sum = 0.0;
    for i in 0..n {
        let (ma, mb) = (mu_a[i], mu_b[i]);
        let va = e_aa[i] - ma * ma;
        let vb = e_bb[i] - mb * mb;
        let cov = e_ab[i] - ma * mb;
        sum += ((2.0 * ma * mb + c1) * (2.0 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2));
    }
    Ok(sum / n as f64)
}

/// Mean SSIM of two images of `shape`, on luma.
pub fn ssim(a: &[f32], b: &[f32], shape: ImageShape, peak: f64) -> Result<f64> {
    let (la, lb) = (luma(a, shape)?, luma(b, shape)?);
    ssim_gray(&la, &lb, shape.width, shape.height, peak)
}

/// Variance of the 4-neighbour Laplacian (kernel [0 1 0; 1 -4 1; 0 1 0], OpenCV's
/// `Laplacian(ksize=1)`) over the interior pixels: a focus/sharpness measure, larger is
/// sharper. In squared sample units (scale by (255/peak)^2 to compare across ranges).
pub fn laplacian_variance(gray: &[f64], width: usize, height: usize) -> Result<f64> {
    ensure!(width >= 3 && height >= 3, "sharpness needs at least 3x3 pixels (got {width}x{height})");
    ensure!(gray.len() == width * height, "sharpness: {} samples for {width}x{height}", gray.len());
    ensure!(gray.iter().all(|v| v.is_finite()), "sharpness: non-finite sample in the input");
    let mut vals = Vec::with_capacity((width - 2) * (height - 2));
    for y in 1..height - 1 {
        for x in 1..width - 1 {
            let i = y * width + x;
            vals.push(gray[i - 1] + gray[i + 1] + gray[i - width] + gray[i + width] - 4.0 * gray[i]);
        }
    }
    let mean = vals.iter().sum::<f64>() / vals.len() as f64;
    Ok(vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64)
}

/// Sharpness (variance of the Laplacian of luma) of an image of `shape`.
pub fn sharpness(img: &[f32], shape: ImageShape) -> Result<f64> {
    laplacian_variance(&luma(img, shape)?, shape.width, shape.height)
}

/// Temporal flicker of a clip.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Flicker {
    /// Mean `|frame[t+1] - frame[t]|` over all consecutive pairs and samples, in input units.
    pub mean_abs_diff: f64,
    /// The same on the 8-bit scale (x 255 / peak).
    pub mean_abs_diff_8bit: f64,
    /// VBench's temporal-flickering score, (255 - mean_abs_diff_8bit) / 255: 1 = no change.
    /// VBench quantizes frames to 8 bits first; this uses the samples as given.
    pub vbench_score: f64,
    /// Number of consecutive frame pairs.
    pub pairs: usize,
}

/// Temporal flicker of `frames` (contiguous frames of `frame_len` samples each, at least two).
pub fn temporal_flicker(frames: &[f32], frame_len: usize, peak: f64) -> Result<Flicker> {
    ensure!(peak > 0.0 && peak.is_finite(), "flicker needs a positive peak value (got {peak})");
    ensure!(frame_len > 0, "flicker: frames have no samples");
    ensure!(
        frames.len().is_multiple_of(frame_len),
        "flicker: {} samples is not a whole number of {frame_len}-sample frames",
        frames.len()
    );
    let n = frames.len() / frame_len;
    ensure!(n >= 2, "flicker needs at least two frames (got {n})");
    check_finite(frames, "clip")?;
    let total: f64 = frames
        .chunks_exact(frame_len)
        .zip(frames.chunks_exact(frame_len).skip(1))
        .map(|(a, b)| a.iter().zip(b).map(|(&x, &y)| (y as f64 - x as f64).abs()).sum::<f64>())
        .sum();
    let mean = total / ((n - 1) * frame_len) as f64;
    let m8 = mean * 255.0 / peak;
    Ok(Flicker { mean_abs_diff: mean, mean_abs_diff_8bit: m8, vbench_score: (255.0 - m8) / 255.0, pairs: n - 1 })
}

/// The pixels of `region` of one planar image, as a planar image of the region's size.
pub fn crop(img: &[f32], shape: ImageShape, r: Region) -> Result<Vec<f32>> {
    shape.check(img, "image")?;
    ensure!(r.width > 0 && r.height > 0, "empty crop region {r:?}");
    ensure!(
        r.x + r.width <= shape.width && r.y + r.height <= shape.height,
        "crop region {r:?} lies outside the {}x{} image",
        shape.width,
        shape.height
    );
    let mut out = Vec::with_capacity(r.width * r.height * shape.channels);
    for c in 0..shape.channels {
        let plane = &img[c * shape.plane_len()..(c + 1) * shape.plane_len()];
        for y in r.y..r.y + r.height {
            out.extend_from_slice(&plane[y * shape.width + r.x..y * shape.width + r.x + r.width]);
        }
    }
    Ok(out)
}

/// `region` of every frame of a clip (contiguous frames of `shape`).
pub fn crop_frames(frames: &[f32], shape: ImageShape, r: Region) -> Result<Vec<f32>> {
    ensure!(
        !shape.is_empty() && frames.len().is_multiple_of(shape.len()),
        "clip length {} is not a whole number of frames",
        frames.len()
    );
    let mut out = Vec::new();
    for f in frames.chunks_exact(shape.len()) {
        out.extend(crop(f, shape, r)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Latent trajectories (lerp_slerp_ablation): norms, angles and the interpolation norm deficit.
// ---------------------------------------------------------------------------------------------

/// Euclidean norm, accumulated in f64.
pub fn l2_norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt()
}

/// The angle (radians, in [0, pi]) between two vectors of the same length, in f64 as
/// 2 atan2(|u0 - u1|, |u0 + u1|) of the unit vectors, which stays accurate for tiny angles
/// (where acos of the dot product loses half its digits). Errors on a zero vector, mismatched
/// lengths or non-finite input.
pub fn angle_between(a: &[f32], b: &[f32]) -> Result<f64> {
    check_pair(a, b)?;
    let (na, nb) = (l2_norm(a), l2_norm(b));
    ensure!(na > 0.0 && nb > 0.0, "the angle to a zero vector is undefined");
    let (mut diff, mut sum) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (u, v) = (x as f64 / na, y as f64 / nb);
        diff += (u - v) * (u - v);
        sum += (u + v) * (u + v);
    }
    Ok(2.0 * diff.sqrt().atan2(sum.sqrt()))
}

/// Norm deficit of an interpolated vector `v` between keyframes `v0` and `v1` at `alpha`:
/// |v| / ((1 - alpha)|v0| + alpha|v1|) - 1 (docs/design.md's norm ratio minus one).
/// 0 for SLERP by construction; cos(theta/2) - 1 for the LERP midpoint of equal-norm vectors.
/// Negative means the interpolated vector is shorter than the keyframes' norms suggest.
pub fn norm_deficit(v: &[f32], v0: &[f32], v1: &[f32], alpha: f64) -> Result<f64> {
    ensure!((0.0..=1.0).contains(&alpha), "alpha {alpha} is outside [0, 1]");
    ensure!(
        v.len() == v0.len() && v0.len() == v1.len() && !v.is_empty(),
        "norm deficit: vectors differ in length or are empty"
    );
    check_finite(v, "interpolated vector")?;
    check_finite(v0, "first keyframe")?;
    check_finite(v1, "second keyframe")?;
    let target = (1.0 - alpha) * l2_norm(v0) + alpha * l2_norm(v1);
    ensure!(target > 0.0, "norm deficit: both keyframes are zero vectors");
    Ok(l2_norm(v) / target - 1.0)
}

/// Mean and worst of signed values (deficits, errors): `worst` is the value of largest
/// magnitude, with its sign.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SignedSummary {
    pub mean: f64,
    pub worst: f64,
    pub count: usize,
}

/// [`SignedSummary`] of `values` (at least one, all finite).
pub fn signed_summary(values: &[f64]) -> Result<SignedSummary> {
    ensure!(!values.is_empty(), "nothing to summarize");
    ensure!(values.iter().all(|v| v.is_finite()), "non-finite value among {} to summarize", values.len());
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let worst = values.iter().copied().fold(0.0f64, |w, v| if v.abs() > w.abs() { v } else { w });
    Ok(SignedSummary { mean, worst, count: values.len() })
}

// Throughput projection (calibrate): in the library, where the server's `POST /calibrate` uses it
// too; the pipeline's bypass rule is the schedule module's.
pub use cadence::measure::calibrate::{
    duty_cycle_label, fps, projected_render_ms, projection_error_pct, ComponentCosts, RenderCounts,
};
pub use cadence::schedules::keyframes::bypassed_frames;
