//! Ditto in the frame loop ([`crate::frame_loop::run`]): at a keyframe the warping network moves
//! the avatar's 3-D appearance feature to the frame's stitched driving keypoints (and, for the
//! infills on pixels, the SPADE decoder decodes it); the frames between are made by the chosen
//! [`DittoInfill`] one frame at a time as the loop decodes them; bypassed frames (and bypassed
//! keyframes) are the avatar's rest frame. Ditto's easing is in keypoint space, before the warp
//! ([`super::driving_keypoints`]), so nothing is eased here.

use super::motion_warp::motion_warp;
use super::{DittoAvatar, DittoEngines, DittoInfill};
use crate::backend::elem::{Method, RgbRange};
use crate::backend::resident::Residency;
use crate::frame_loop::clock::Tick;
use crate::frame_loop::{self, ms, ClipPart, FrameEngine, RenderOptions, RenderStats, StageTimes, Window};
use crate::schedules::keyframes::KeyframeSchedule;
use crate::Backend;
use anyhow::{ensure, Result};
use cadence_engines::ditto::keypoints::NUM_KP;
use cadence_engines::Tensor;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// A keyframe's outputs: the warp's feature and, where the infill needs it, the decoded crop.
#[derive(Clone)]
pub struct Key(Arc<KeyOutputs>);

struct KeyOutputs {
    feature: Vec<f32>,
    crop: Option<Vec<f32>>,
}

/// Ditto's side of the frame loop for one render (or one part of a live stream).
pub struct DittoFrames<'a> {
    engines: &'a DittoEngines,
    avatar: &'a DittoAvatar,
    /// frames × 63.
    kp_driving: &'a [f32],
    infill: DittoInfill,
    method: Method,
    /// (keyframe interval, position in it) of every frame.
    positions: Vec<(usize, f32)>,
    keyframes: Vec<u32>,
    /// The current window's keys: keyframe `window_first + i` is `window[i]`.
    window: Vec<Key>,
    window_first: usize,
    rest: Key,
    rest_crop: Tensor,
    side: usize,
    decoded: usize,
}

impl<'a> DittoFrames<'a> {
    pub fn new(
        engines: &'a DittoEngines,
        avatar: &'a DittoAvatar,
        kp_driving: &'a [f32],
        schedule: &KeyframeSchedule,
        infill: DittoInfill,
        method: Method,
    ) -> Result<Self> {
        let n = schedule.n_frames();
        ensure!(kp_driving.len() == n * 3 * NUM_KP, "keypoints and schedule disagree on the frame count");
        let side = engines.cfg.output_side();
        Ok(DittoFrames {
            engines,
            avatar,
            kp_driving,
            infill,
            method,
            positions: schedule.frame_positions(),
            keyframes: schedule.keyframes().to_vec(),
            window: Vec::new(),
            window_first: 0,
            rest: Key(Arc::new(KeyOutputs {
                feature: avatar.rest_feature.clone(),
                crop: Some(avatar.rest_crop.clone()),
            })),
            rest_crop: Tensor::from_slice(&avatar.rest_crop, (1, 3, side, side), &cadence_engines::Device::Cpu)?,
            side,
            decoded: 0,
        })
    }

    fn kp(&self, f: usize) -> &[f32] {
        &self.kp_driving[f * 3 * NUM_KP..(f + 1) * 3 * NUM_KP]
    }

    fn key(&self, j: usize) -> &KeyOutputs {
        &self.window[j - self.window_first].0
    }

    fn decode_feature(&mut self, feature: &[f32], times: &mut StageTimes) -> Result<Vec<f32>> {
        let t = Tick::now();
        let c = self.engines.decode(feature)?;
        t.add_to(&mut times.decoder_ms, &mut times.decoder_cpu_ms);
        self.decoded += 1;
        Ok(c)
    }

    /// Frame `f`'s crop (f not bypassed): a keyframe's, or the infill between two.
    fn crop(&mut self, f: usize, times: &mut StageTimes) -> Result<Vec<f32>> {
        let (j, alpha) = self.positions[f];
        let m = self.keyframes.len();
        let (j0, j1) = if m == 1 { (0, 0) } else { (j, j + 1) };
        if alpha <= 0.0 || alpha >= 1.0 {
            let k = self.window[(if alpha <= 0.0 { j0 } else { j1 }) - self.window_first].clone();
            return match &k.0.crop {
                Some(c) => Ok(c.clone()),
                None => self.decode_feature(&k.0.feature, times),
            };
        }
        match self.infill {
            DittoInfill::Feature => {
                let (a, b) = (&self.key(j0).feature, &self.key(j1).feature);
                let t = Instant::now();
                let mut mid = vec![0f32; a.len()];
                crate::backend::cpu::slerp_pairs(a, b, &[alpha], a.len(), self.method, &mut mid);
                times.expand_ms += ms(t);
                self.decode_feature(&mid, times)
            }
            DittoInfill::Image => {
                let (a, b) = (self.key(j0), self.key(j1));
                let (a, b) = (a.crop.as_ref().expect("keyframes decoded"), b.crop.as_ref().expect("keyframes decoded"));
                let t = Instant::now();
                let mut mid = vec![0f32; a.len()];
                crate::backend::cpu::slerp_pairs(a, b, &[alpha], a.len(), self.method, &mut mid);
                times.expand_ms += ms(t);
                Ok(mid)
            }
            DittoInfill::Motion => {
                let jn = if alpha <= 0.5 { j0 } else { j1 };
                let t = Instant::now();
                let crop = self.key(jn).crop.as_ref().expect("keyframes decoded");
                let moved = motion_warp(crop, self.side, self.kp(self.keyframes[jn] as usize), self.kp(f));
                times.expand_ms += ms(t);
                Ok(moved)
            }
        }
    }
}

impl FrameEngine for DittoFrames<'_> {
    type Key = Key;

    /// The warp runs one keyframe at a time (its inputs differ per keyframe only in the keypoints).
    fn key_batch(&self) -> usize {
        1
    }

    fn decode_batch(&self) -> usize {
        1
    }

    fn evaluate(&mut self, frames: &[usize], times: &mut StageTimes) -> Result<Vec<Key>> {
        let mut keys = Vec::with_capacity(frames.len());
        for &f in frames {
            let t = Tick::now();
            let feature = self.engines.warp(self.avatar, self.kp(f))?;
            t.add_to(&mut times.unet_ms, &mut times.unet_cpu_ms);
            let crop = match self.infill {
                DittoInfill::Feature => None,
                _ => Some(self.decode_feature(&feature, times)?),
            };
            keys.push(Key(Arc::new(KeyOutputs { feature, crop })));
        }
        Ok(keys)
    }

    fn rest_key(&self, _frame: usize) -> Result<Key> {
        Ok(self.rest.clone())
    }

    /// Keeps the window's keys: each frame is made when the loop decodes it ([`Self::decode`]),
    /// so a window holds its keys and no infilled frames.
    fn infill(&mut self, window: &Window<'_, Key>, _times: &mut StageTimes) -> Result<()> {
        self.window = window.keys.to_vec();
        self.window_first = window.first_key;
        Ok(())
    }

    fn decode(&mut self, run: Range<usize>, times: &mut StageTimes) -> Result<Tensor> {
        let mut data = Vec::with_capacity(run.len() * 3 * self.side * self.side);
        for f in run.clone() {
            data.extend(self.crop(f, times)?);
        }
        Ok(Tensor::from_vec(data, (run.len(), 3, self.side, self.side), &cadence_engines::Device::Cpu)?)
    }

    fn release(&mut self, _frame: usize) -> Result<()> {
        Ok(())
    }

    fn rest_crop(&self, _avatar_frame: usize) -> &Tensor {
        &self.rest_crop
    }

    fn crop_range(&self) -> RgbRange {
        RgbRange::Unit
    }

    fn decoded_frames(&self) -> usize {
        self.decoded
    }

    fn residency(&self) -> Residency {
        Residency::Host
    }
}

/// Renders every frame of a clip (or a live stream's part) whose driving keypoints are
/// `kp_driving` (frames × 63) through the frame loop and hands each NV12 frame to `sink` in order.
/// `distance`: frames to the nearest speech per frame. One keyframe interval per window: a window
/// holds its two keys (a warped feature and a decoded crop each), whatever the clip's length.
#[allow(clippy::too_many_arguments)]
pub fn render(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    kp_driving: &[f32],
    distance: &[u32],
    ramp: u32,
    schedule: &KeyframeSchedule,
    infill: DittoInfill,
    method: Method,
    sink: impl FnMut(usize, &[u8]) -> Result<()>,
    progress: impl FnMut(usize),
) -> Result<RenderStats> {
    ensure!(
        kp_driving.len() == schedule.n_frames() * 3 * NUM_KP && distance.len() == schedule.n_frames(),
        "keypoints, activity and schedule disagree on the frame count"
    );
    let opts = RenderOptions { ramp, batch: 1, method, window: Some(1), ..RenderOptions::default() };
    let mut engine = DittoFrames::new(engines, avatar, kp_driving, schedule, infill, method)?;
    frame_loop::run(
        &mut engine,
        &Backend::Cpu,
        &opts,
        ClipPart::whole(distance),
        schedule,
        std::slice::from_ref(&avatar.compositor),
        sink,
        progress,
    )
}
