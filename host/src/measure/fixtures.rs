//! Deterministic test data and a small synthetic clip, shared by the tests, the benchmarks and
//! `cadence gpu-check` (fixtures in one place, not one copy per test file).

use crate::backend::composite::Compositor;
use crate::frame_loop::ClipPart;
use crate::frame_loop::{RenderOptions, RenderStats};
use crate::musetalk::{prepare_avatar, AvatarLatents, Engines, FACE_SIDE};
use crate::schedules::keyframes::speech_distance;
use crate::{Backend, KeyframeSchedule};
use anyhow::{ensure, Result};
use cadence_engines::Batch;

/// Deterministic pseudo-random normal-ish data (sum of uniforms), without pulling an RNG
/// into the library: benchmarks and checks must never run on zeros.
pub fn test_data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n).map(|_| (next() + next() + next() + next() - 2.0) * 1.7).collect()
}

/// A small synthetic render for checks that compare two ways of rendering the same frames (the
/// resident-loop test, `cadence gpu-check`): random audio windows, speech with a pause long
/// enough to be bypassed, a smooth face crop, a noise background, and a face box of another size
/// than the crop (so the compositor resamples).
pub struct CheckClip {
    pub features: Batch,
    pub speech: Vec<bool>,
    pub avatar: AvatarLatents,
    /// Interleaved RGB8, `width` x `height`.
    pub background: Vec<u8>,
    pub width: usize,
    pub height: usize,
    pub face: crate::backend::composite::FaceBox,
    pub schedule: KeyframeSchedule,
    pub opts: RenderOptions,
}

impl CheckClip {
    /// `frames` >= 24 (the pause is frames 9..21); stride 3 and batch 4, so the UNet and the
    /// decoder both run several batches and some keyframes fall inside the pause.
    pub fn new(engines: &Engines, frames: usize, seed: u64) -> Result<Self> {
        ensure!(frames >= 24, "a check clip needs at least 24 frames");
        let (win, dim) = (engines.silence_window.shape[1], engines.silence_window.shape[2]);
        let features = Batch::new(vec![frames, win, dim], test_data(frames * win * dim, seed))?;
        let speech = (0..frames).map(|f| !(9..21).contains(&f)).collect();
        let mut face_crop = Vec::with_capacity(3 * FACE_SIDE * FACE_SIDE);
        for c in 0..3 {
            for y in 0..FACE_SIDE {
                for x in 0..FACE_SIDE {
                    let (fx, fy) = (x as f32 / FACE_SIDE as f32, y as f32 / FACE_SIDE as f32);
                    face_crop.push(0.5 + 0.4 * ((3.0 + c as f32) * fx + 2.0 * fy).sin() * (4.0 * fy - c as f32).cos());
                }
            }
        }
        let avatar = prepare_avatar(engines, &face_crop)?;
        let (width, height) = (384, 320);
        let background = test_data(width * height * 3, seed + 1)
            .iter()
            .map(|v| ((v * 0.3 + 0.5).clamp(0.0, 1.0) * 255.0) as u8)
            .collect();
        let face = crate::backend::composite::FaceBox { x: 40, y: 30, w: 200, h: 240 };
        let schedule = KeyframeSchedule::fixed_stride(frames, 3)?;
        let opts = RenderOptions { batch: 4, ..RenderOptions::default() };
        Ok(Self { features, speech, avatar, background, width, height, face, schedule, opts })
    }

    /// The clip's compositor on `backend` (feather 12 px, BT.709).
    pub fn compositor(&self, backend: &Backend) -> Result<Compositor> {
        Compositor::new(backend, &self.background, self.width, self.height, self.face, 12.0, crate::ColorMatrix::Bt709)
    }

    /// Renders the clip on `backend` and returns its NV12 frames in order.
    pub fn render(&self, engines: &Engines, backend: &Backend) -> Result<(Vec<Vec<u8>>, RenderStats)> {
        let compositor = self.compositor(backend)?;
        collect_frames(|sink| {
            crate::musetalk::frames::render(
                engines,
                backend,
                &self.opts,
                &self.features,
                ClipPart::whole(&speech_distance(&self.speech)),
                &self.schedule,
                std::slice::from_ref(&self.avatar),
                std::slice::from_ref(&compositor),
                sink,
                |_| {},
            )
        })
    }
}

/// Renders `prepared` with `schedule` and returns its NV12 frames in order (tests that compare
/// frames rather than an MP4).
pub fn render_prepared(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    prepared: &crate::musetalk::render::Prepared,
    schedule: &KeyframeSchedule,
) -> Result<(Vec<Vec<u8>>, RenderStats)> {
    collect_frames(|sink| prepared.render_frames(engines, backend, opts, schedule, sink, |_| {}))
}

/// Runs a render whose sink collects the NV12 frames, checking that they arrive in order.
fn collect_frames(
    render: impl FnOnce(&mut dyn FnMut(usize, &[u8]) -> Result<()>) -> Result<RenderStats>,
) -> Result<(Vec<Vec<u8>>, RenderStats)> {
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let stats = render(&mut |i, f| {
        ensure!(i == frames.len(), "frame {i} reached the sink out of order");
        frames.push(f.to_vec());
        Ok(())
    })?;
    Ok((frames, stats))
}

/// `img` drawn into a `width` x `height` frame of grey `bg` with its top-left corner at `(x, y)`,
/// which may be fractional (bilinear, the frame outside the image counting as `bg`): a face
/// moved by sub-pixel shifts or panned, for the face tracker's tests and benchmark.
pub fn place_image(
    img: &cadence_media::RgbImage,
    width: u32,
    height: u32,
    x: f64,
    y: f64,
    bg: u8,
) -> cadence_media::RgbImage {
    let (w, h) = (width as usize, height as usize);
    let mut out = vec![bg; w * h * 3];
    let (iw, ih) = (img.width() as i64, img.height() as i64);
    let src = img.as_raw();
    let at = |sx: i64, sy: i64, c: usize| -> f64 {
        if (0..iw).contains(&sx) && (0..ih).contains(&sy) {
            src[((sy * iw + sx) * 3) as usize + c] as f64
        } else {
            bg as f64
        }
    };
    let (x0, y0) = ((x.floor() as i64 - 1).max(0), (y.floor() as i64 - 1).max(0));
    let (x1, y1) = ((x.ceil() as i64 + iw + 1).min(w as i64), (y.ceil() as i64 + ih + 1).min(h as i64));
    for py in y0..y1 {
        for px in x0..x1 {
            // The frame pixel's position in the image, and its four neighbours' weights.
            let (sx, sy) = (px as f64 - x, py as f64 - y);
            let (fx, fy) = (sx.floor(), sy.floor());
            let (ax, ay) = (sx - fx, sy - fy);
            let (ix, iy) = (fx as i64, fy as i64);
            for c in 0..3 {
                let top = at(ix, iy, c) * (1.0 - ax) + at(ix + 1, iy, c) * ax;
                let bottom = at(ix, iy + 1, c) * (1.0 - ax) + at(ix + 1, iy + 1, c) * ax;
                out[(py as usize * w + px as usize) * 3 + c] =
                    (top * (1.0 - ay) + bottom * ay).round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    cadence_media::RgbImage::from_raw(width, height, out).expect("width x height x 3 bytes")
}

/// `n` seeded uniform numbers in [-0.5, 0.5): sub-pixel shifts for [`place_image`].
pub fn sub_pixel_shifts(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        })
        .collect()
}
