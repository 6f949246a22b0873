//! Dense UNet runs and decoding for the experiments that compare schedules against a dense
//! render (lerp_slerp_ablation, adaptive_strides): the UNet on chosen frames of a prepared clip,
//! and the decoder over a list of latents with its output clamped to the nominal range.

use anyhow::{ensure, Result};
use cadence::musetalk::{AvatarLatents, FACE_SIDE, LATENT_DIM};
use cadence_engines::{Batch, KeyframeModel, LatentDecoder, MuseTalkUnet};

/// Samples of one decoded face crop (3 x 256 x 256).
pub const CROP: usize = 3 * FACE_SIDE * FACE_SIDE;

/// Latent `f` of a contiguous list of 4 x 32 x 32 latents.
pub fn frame_of(v: &[f32], f: usize) -> &[f32] {
    &v[f * LATENT_DIM..(f + 1) * LATENT_DIM]
}

/// The UNet's raw output (no bypass, no easing) for each frame in `frames`, in that order, in
/// batches of `batch`; `features` are the audio encoder's windows for the whole clip.
/// `on_batch(b)` is called after each batch of b frames.
pub fn unet_frames(
    unet: &MuseTalkUnet,
    features: &Batch,
    avatar: &AvatarLatents,
    frames: &[usize],
    batch: usize,
    mut on_batch: impl FnMut(usize),
) -> Result<Vec<f32>> {
    let (win, dim_a) = (features.shape[1], features.shape[2]);
    let per_window = win * dim_a;
    let mut out = Vec::with_capacity(frames.len() * LATENT_DIM);
    for chunk in frames.chunks(batch.max(1)) {
        let b = chunk.len();
        let mut lat = Vec::with_capacity(b * 2 * LATENT_DIM);
        let mut audio = Vec::with_capacity(b * per_window);
        for &f in chunk {
            ensure!(f < features.shape[0], "frame {f} is past the audio features ({} frames)", features.shape[0]);
            lat.extend_from_slice(&avatar.masked);
            lat.extend_from_slice(&avatar.reference);
            audio.extend_from_slice(&features.data[f * per_window..(f + 1) * per_window]);
        }
        let o = unet.predict(&Batch::new(vec![b, 8, 32, 32], lat)?, &Batch::new(vec![b, win, dim_a], audio)?)?;
        ensure!(o.data.len() == b * LATENT_DIM, "UNet returned shape {:?}", o.shape);
        out.extend_from_slice(&o.data);
        on_batch(b);
    }
    ensure!(out.iter().all(|v| v.is_finite()), "the UNet produced a non-finite latent");
    Ok(out)
}

/// Decodes `latents` (contiguous 4 x 32 x 32) in batches of `batch`, clamps the samples to the
/// decoder's nominal range and hands each decoded frame to `each` (index, samples). Returns how
/// many samples lay outside the range before clamping.
pub fn decode_each(
    decoder: &dyn LatentDecoder,
    latents: &[f32],
    batch: usize,
    mut each: impl FnMut(usize, &[f32]) -> Result<()>,
) -> Result<usize> {
    let (lo, hi) = decoder.output_range();
    let count = latents.len() / LATENT_DIM;
    let mut outside = 0;
    for start in (0..count).step_by(batch.max(1)) {
        let b = batch.max(1).min(count - start);
        let out = decoder
            .decode(&Batch::new(vec![b, 4, 32, 32], latents[start * LATENT_DIM..(start + b) * LATENT_DIM].to_vec())?)?;
        ensure!(out.data.len() == b * CROP, "decoder returned shape {:?}", out.shape);
        let mut data = out.data;
        for v in data.iter_mut() {
            ensure!(v.is_finite(), "the decoder produced a non-finite sample");
            if *v < lo || *v > hi {
                outside += 1;
                *v = v.clamp(lo, hi);
            }
        }
        for i in 0..b {
            each(start + i, &data[i * CROP..(i + 1) * CROP])?;
        }
    }
    Ok(outside)
}
