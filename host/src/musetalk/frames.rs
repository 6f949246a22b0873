//! MuseTalk in the frame loop ([`crate::frame_loop::run`]): at a keyframe the UNet predicts the
//! face's latent from the avatar's masked and reference latents and the audio features. The
//! frames between are made by the [`MuseTalkInfill`]:
//! - `latent`: one-launch SLERP (or LERP) expansion of the window's keyframe latents, eased
//!   toward the rest latent by the distance to speech (one easing launch); the decoder (TAESD or
//!   the SD VAE) turns runs of those latents into face crops;
//! - `image`: the decoder runs on the keyframes' latents as the UNet makes them, and the same two
//!   launches expand and ease the decoded crops (toward the decoded rest crop) instead of latents;
//!   no network runs between keyframes.
//!
//! Bypassed frames show the decoded rest frame.
//!
//! Between the stages the frames are candle tensors on the engines' device
//! ([`crate::backend::resident`]): with candle's CUDA engines they stay on the GPU from the UNet to
//! the encoder's input, on the CPU they are host memory, and the code below is the same for both.

use crate::avatar::cycle_index;
use crate::backend::composite::Compositor;
use crate::backend::elem::RgbRange;
use crate::backend::resident::{self, Residency};
use crate::frame_loop::clock::Tick;
use crate::frame_loop::{self, ms, ClipPart, FrameEngine, RenderOptions, RenderStats, StageTimes, Window};
use crate::musetalk::features::FrameFeatures;
use crate::musetalk::{unet_input, AvatarLatents, Engines, MuseTalkInfill, FACE_SIDE, LATENT_DIM};
use crate::schedules::keyframes::KeyframeSchedule;
use crate::Backend;
use anyhow::{ensure, Result};
use cadence_engines::{KeyframeModel, Tensor};
use std::ops::Range;
use std::time::Instant;

/// MuseTalk's side of the frame loop for one render (or one part of a live stream).
pub struct MuseTalkFrames<'a> {
    engines: &'a Engines,
    backend: &'a Backend,
    features: &'a dyn FrameFeatures,
    avatar: &'a [AvatarLatents],
    /// The stream's index of this render's frame 0 (the avatar's cycle goes on from it).
    first_frame: usize,
    batch: usize,
    infill: MuseTalkInfill,
    residency: Residency,
    /// A still avatar's UNet input is the same for every keyframe: made once, narrowed per batch.
    still_latents: Option<Tensor>,
    rest_latents: Vec<Tensor>,
    rest_rgb: Vec<Tensor>,
    /// Expanded, eased latents (`image` infill: crops) of frames `pending_from..` not decoded
    /// (handed out) yet.
    pending: Option<Tensor>,
    pending_from: usize,
    decoded: usize,
}

impl<'a> MuseTalkFrames<'a> {
    /// `features`: the audio encoder's (window, dim) block of every frame of the render;
    /// `avatar`: one entry per avatar frame; `keyframes_evaluated`: how many keyframes the UNet
    /// will run on (the still avatar's UNet input is made for the first batch's size).
    pub fn new(
        engines: &'a Engines,
        backend: &'a Backend,
        opts: &RenderOptions,
        features: &'a dyn FrameFeatures,
        avatar: &'a [AvatarLatents],
        first_frame: usize,
        keyframes_evaluated: usize,
    ) -> Result<Self> {
        ensure!(opts.batch > 0, "batch size must be at least 1");
        ensure!(!avatar.is_empty(), "the avatar has no frames of latents");
        let dev = &engines.device;
        let still_latents = match avatar {
            [a] => {
                Some(unet_input(&a.masked, &a.reference, opts.batch.min(keyframes_evaluated).max(1)).into_tensor(dev)?)
            }
            _ => None,
        };
        let rest_latents = avatar
            .iter()
            .map(|a| Tensor::from_slice(&a.rest, (1, 4, 32, 32), dev))
            .collect::<candle_core::Result<_>>()?;
        let rest_rgb = avatar
            .iter()
            .map(|a| Tensor::from_slice(&a.rest_rgb, (1, 3, FACE_SIDE, FACE_SIDE), dev))
            .collect::<candle_core::Result<_>>()?;
        Ok(MuseTalkFrames {
            engines,
            backend,
            features,
            avatar,
            first_frame,
            batch: opts.batch,
            infill: opts.infill,
            residency: resident::residency(backend, dev),
            still_latents,
            rest_latents,
            rest_rgb,
            pending: None,
            pending_from: 0,
            decoded: 0,
        })
    }

    /// The decoder on (b, 4, 32, 32) latents: (b, 3, FACE_SIDE, FACE_SIDE) crops, timed and counted.
    fn decode_latents(&mut self, latents: &Tensor, times: &mut StageTimes) -> Result<Tensor> {
        let t = Tick::now();
        let b = latents.dims()[0];
        let out = self.engines.decoder.decode_tensor(latents)?;
        ensure!(out.dims() == [b, 3, FACE_SIDE, FACE_SIDE], "the decoder returned shape {:?}", out.dims());
        self.engines.device.synchronize()?;
        t.add_to(&mut times.decoder_ms, &mut times.decoder_cpu_ms);
        self.decoded += b;
        Ok(out)
    }

    /// The avatar frame output frame `k` shows.
    fn of(&self, k: usize) -> usize {
        cycle_index(self.first_frame + k, self.avatar.len())
    }
}

/// The rest state the easing blends toward: the rest latent, or (`image` infill) it decoded.
fn rest_state(infill: MuseTalkInfill, a: &AvatarLatents) -> &[f32] {
    match infill {
        MuseTalkInfill::Latent => &a.rest,
        MuseTalkInfill::Image => &a.rest_rgb,
    }
}

impl FrameEngine for MuseTalkFrames<'_> {
    type Key = Tensor;

    fn key_batch(&self) -> usize {
        self.batch
    }

    fn decode_batch(&self) -> usize {
        self.batch
    }

    fn evaluate(&mut self, frames: &[usize], times: &mut StageTimes) -> Result<Vec<Tensor>> {
        let dev = &self.engines.device;
        let b = frames.len();
        let (win, dim_a) = self.features.frame_shape();
        let mut audio = Vec::with_capacity(b * win * dim_a);
        let t = Tick::now();
        self.features.gather(frames, &mut audio)?;
        t.add_to(&mut times.audio_ms, &mut times.audio_cpu_ms);
        ensure!(audio.len() == b * win * dim_a, "the audio features of {b} frames have {} values", audio.len());
        let t = Tick::now();
        let audio = Tensor::from_vec(audio, (b, win, dim_a), dev)?;
        let latents = match &self.still_latents {
            Some(t) => t.narrow(0, 0, b)?,
            None => {
                let mut data = Vec::with_capacity(b * 2 * LATENT_DIM);
                for &f in frames {
                    let a = &self.avatar[self.of(f)];
                    data.extend_from_slice(&a.masked);
                    data.extend_from_slice(&a.reference);
                }
                Tensor::from_vec(data, (b, 8, 32, 32), dev)?
            }
        };
        let out = self.engines.unet.predict_tensor(&latents, &audio)?;
        ensure!(out.dims() == [b, 4, 32, 32], "the UNet returned shape {:?}", out.dims());
        // Wait for the device so that stage times are the stages' and not their launches'.
        dev.synchronize()?;
        t.add_to(&mut times.unet_ms, &mut times.unet_cpu_ms);
        let out = match self.infill {
            MuseTalkInfill::Latent => out,
            // The keyframes' crops, decoded in the UNet's batches: the only decoder calls.
            MuseTalkInfill::Image => self.decode_latents(&out, times)?,
        };
        (0..b).map(|i| Ok(out.narrow(0, i, 1)?)).collect()
    }

    fn rest_key(&self, frame: usize) -> Result<Tensor> {
        Ok(match self.infill {
            MuseTalkInfill::Latent => &self.rest_latents,
            MuseTalkInfill::Image => &self.rest_rgb,
        }[self.of(frame)]
        .clone())
    }

    fn infill(&mut self, window: &Window<'_, Tensor>, times: &mut StageTimes) -> Result<()> {
        let t = Instant::now();
        let keys = Tensor::cat(window.keys, 0)?;
        times.expand_ms += ms(t);
        // The window's keyframes, re-indexed from its first frame, over its frames plus its
        // last keyframe (which the next window starts from and owns).
        let base = window.frames.start;
        let span = window.frames.len();
        let all = window.schedule.keyframes();
        let sub_keys: Vec<usize> =
            (window.first_key..window.first_key + window.keys.len()).map(|j| all[j] as usize - base).collect();
        let sub = KeyframeSchedule::explicit(span, &sub_keys)?;
        // The easing target: the still avatar's rest latent (or decoded rest crop), or each
        // frame's avatar frame's.
        let rest_per_frame: Vec<f32>;
        let rest: &[f32] = match self.avatar {
            [a] => rest_state(self.infill, a),
            _ => {
                rest_per_frame = window
                    .frames
                    .clone()
                    .flat_map(|f| rest_state(self.infill, &self.avatar[self.of(f)]).iter().copied())
                    .collect();
                &rest_per_frame
            }
        };
        let infill = resident::Infill {
            schedule: &sub,
            method: window.method,
            rest,
            distance: &window.distance[window.frames.clone()],
            ramp: window.ramp,
        };
        let (latents, expand_ms, ease_ms) = resident::expand_eased(self.backend, &keys, &infill)?;
        times.expand_ms += expand_ms;
        times.ease_ms += ease_ms;
        let latents = latents.narrow(0, 0, window.end - base)?;
        self.pending = Some(match self.pending.take() {
            Some(p) => Tensor::cat(&[&p, &latents], 0)?,
            None => {
                self.pending_from = base;
                latents
            }
        });
        Ok(())
    }

    fn decode(&mut self, run: Range<usize>, times: &mut StageTimes) -> Result<Tensor> {
        let pending = self.pending.as_ref().expect("frames were infilled");
        let batch = pending.narrow(0, run.start - self.pending_from, run.len())?;
        match self.infill {
            MuseTalkInfill::Latent => self.decode_latents(&batch, times),
            // Already crops: the keyframes were decoded as the UNet made them.
            MuseTalkInfill::Image => Ok(batch),
        }
    }

    fn release(&mut self, frame: usize) -> Result<()> {
        if let Some(p) = self.pending.take() {
            let produced = self.pending_from + p.dims()[0];
            self.pending =
                (frame < produced).then(|| p.narrow(0, frame - self.pending_from, produced - frame)).transpose()?;
            self.pending_from = frame;
        }
        Ok(())
    }

    fn rest_crop(&self, avatar_frame: usize) -> &Tensor {
        &self.rest_rgb[avatar_frame]
    }

    fn crop_range(&self) -> RgbRange {
        self.engines.decoder_range()
    }

    fn decoded_frames(&self) -> usize {
        self.decoded
    }

    fn residency(&self) -> Residency {
        self.residency
    }
}

/// Renders every frame of a MuseTalk render (a clip, or a part of a live stream: [`ClipPart`])
/// through the frame loop and hands each NV12 frame to `sink` in order. `features`: the audio
/// encoder's (50, 384) window of every frame; `part.distance`: frames to the nearest speech.
#[allow(clippy::too_many_arguments)]
pub fn render(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    features: &dyn FrameFeatures,
    part: ClipPart,
    schedule: &KeyframeSchedule,
    avatar: &[AvatarLatents],
    compositors: &[Compositor],
    sink: impl FnMut(usize, &[u8]) -> Result<()>,
    progress: impl FnMut(usize),
) -> Result<RenderStats> {
    render_carrying(engines, backend, opts, features, part, schedule, avatar, compositors, None, sink, progress)
        .map(|(stats, _)| stats)
}

/// As [`render`], for a part of a live stream ([`frame_loop::run_carrying`]): `carried` is the
/// key (the UNet's latent, or with `image` infill its decoded crop) of frame 0 as the part
/// before made it, and the key of this part's last keyframe comes back.
#[allow(clippy::too_many_arguments)]
pub fn render_carrying(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    features: &dyn FrameFeatures,
    part: ClipPart,
    schedule: &KeyframeSchedule,
    avatar: &[AvatarLatents],
    compositors: &[Compositor],
    carried: Option<Tensor>,
    sink: impl FnMut(usize, &[u8]) -> Result<()>,
    progress: impl FnMut(usize),
) -> Result<(RenderStats, Option<Tensor>)> {
    let n = schedule.n_frames();
    ensure!(
        part.distance.len() == n && features.frames() == n,
        "audio features, activity and schedule disagree on the frame count"
    );
    ensure!(
        avatar.len() == compositors.len(),
        "the avatar has {} frames of latents and {} compositors",
        avatar.len(),
        compositors.len()
    );
    let bypassed = crate::schedules::keyframes::bypassed_frames(part.distance, opts.ramp);
    let carries = carried.is_some() && bypassed.first() == Some(&false);
    let evaluated = schedule.keyframes().iter().filter(|&&k| !bypassed[k as usize]).count() - usize::from(carries);
    let mut engine = MuseTalkFrames::new(engines, backend, opts, features, avatar, part.first_frame, evaluated)?;
    frame_loop::run_carrying(&mut engine, backend, opts, part, schedule, compositors, carried, sink, progress)
}
