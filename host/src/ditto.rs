//! The Ditto render path (`cadence render --engine ditto`): audio -> HuBERT features -> LMDM
//! motion -> per-frame driving keypoints (relative driving, silence easing, stitching) -> the
//! warping network and SPADE decoder on keyframes -> infill between keyframes -> the same
//! compositor, NV12 conversion and encoder as the MuseTalk path ([`crate::render::write_video`]).
//!
//! **Per avatar** (a still image): the face box cropped to the profile's source side, the
//! appearance extractor's `feature_3d`, the motion extractor's pose, expression and canonical
//! keypoints, the source keypoints x_s, and the rest frame (the source's own motion through the
//! warp, the decoder and the stitching), which sustained silence reuses.
//!
//! **Per clip**: HuBERT's 25 fps features (or the user's `--audio-features`), the condition
//! (features | emotion | eye open | eye ball | source canonical keypoints), the LMDM's windows
//! (DDIM, seeded noise drawn once per clip as Ditto does), then for every frame the driving
//! keypoints of [`cadence_engines::ditto::keypoints`]: relative to the first frame, eased toward
//! the rest state with h(t) = 3t² − 2t³ (rotation on SO(3)), stitched.
//!
//! **Keyframes** run warp (+ decoder); the frames between are filled by [`DittoInfill`]. A
//! keyframe in sustained silence is the rest frame (no network runs).
//!
//! cadence has no face-landmark model, so two of Ditto's per-source conditions are constants:
//! the eye-open ratios ([`EYE_OPEN`]) and the eye-ball offsets (zeros); Ditto measures them
//! from the source's landmarks. The emotion is Ditto's default (4, neutral).

use crate::clip_audio::ClipAudio;
use crate::composite::{Compositor, FaceBox};
use crate::elem::{Method, RgbRange};
use crate::pipeline::{RenderStats, StageTimes};
use crate::resident::Residency;
use crate::schedule::{bypassed_frames, KeyframeSchedule};
use crate::{Backend, ColorMatrix};
use anyhow::{bail, ensure, Context, Result};
use cadence_engines::ditto::appearance::AppearanceFeatureExtractor;
use cadence_engines::ditto::hubert::{DittoFeatureStream, Hubert};
use cadence_engines::ditto::keypoints::{relative_driving, KpInfo, Pose, MOTION_DIM, NUM_KP};
use cadence_engines::ditto::lmdm::{offline_motion, DdimNoise, MotionDecoder, MotionStream};
use cadence_engines::ditto::motion::MotionExtractor;
use cadence_engines::ditto::spade::SpadeDecoder;
use cadence_engines::ditto::stitch::StitchingNetwork;
use cadence_engines::ditto::warp::WarpingNetwork;
use cadence_engines::ditto::DittoConfigs;
use cadence_engines::{Profile, WeightsSource, DEFAULT_SEED};
use cadence_kernels::math::easing_weight;
use cadence_media::RgbImage;
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

/// Ditto's motion is made at 25 frames per second (HuBERT's 50 Hz frames paired).
pub const DITTO_FPS: u32 = 25;
/// The eye-open ratios cadence conditions on (module docs).
pub const EYE_OPEN: [f32; 2] = [0.3, 0.3];
/// Ditto's default emotion label (neutral of 'Angry', 'Disgust', 'Fear', 'Happy', 'Neutral',
/// 'Sad', 'Surprise', 'Contempt').
pub const EMOTION: usize = 4;
/// DDIM steps of Ditto's offline pipeline.
pub const DEFAULT_STEPS: usize = 50;
/// Frames shared by consecutive LMDM windows (Ditto's offline `overlap_v2`).
pub const WINDOW_OVERLAP: usize = 10;

/// How the frames between keyframes are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DittoInfill {
    /// SLERP of the warping network's output feature between keyframes; the decoder runs on
    /// every frame.
    Feature,
    /// SLERP of the decoded crops between keyframes (the MuseTalk path's expansion on pixels).
    Image,
    /// The nearest keyframe's decoded crop moved to the frame's keypoints by a dense 2-D flow
    /// interpolated from the 21 keypoints' displacements; no network runs between keyframes.
    Motion,
}

impl DittoInfill {
    /// The name `--ditto-infill` takes.
    pub fn name(self) -> &'static str {
        match self {
            DittoInfill::Feature => "feature",
            DittoInfill::Image => "image",
            DittoInfill::Motion => "motion",
        }
    }
}

/// Ditto's files in a models folder (`ditto_pytorch/models/` of the published checkpoints),
/// HuBERT-large as `hubert.safetensors` or `hubert.pth` beside them.
pub const MODEL_FILES: [(&str, &str); 6] = [
    ("appearance", "appearance_extractor.pth"),
    ("motion", "motion_extractor.pth"),
    ("warp", "warp_network.pth"),
    ("decoder", "decoder.pth"),
    ("stitch", "stitch_network.pth"),
    ("lmdm", "lmdm_v0.4_hubert.pth"),
];

/// Ditto's networks, loaded once.
pub struct DittoEngines {
    pub cfg: DittoConfigs,
    appearance: AppearanceFeatureExtractor,
    motion: MotionExtractor,
    warp: WarpingNetwork,
    decoder: SpadeDecoder,
    stitch: StitchingNetwork,
    lmdm: MotionDecoder,
    hubert: Hubert,
    /// `synthetic(seed=N)` or `real(<folder>)`.
    pub weights: String,
    pub seed: u64,
}

impl DittoEngines {
    /// Seeded synthetic weights, or every network from `models` (a missing file is an error,
    /// never a synthetic stand-in). Real weights need the full profile.
    pub fn load(profile: Profile, models: Option<&Path>) -> Result<DittoEngines> {
        let cfg = DittoConfigs::for_profile(profile);
        let source = |name: &str| -> Result<WeightsSource> {
            Ok(match models {
                None => WeightsSource::Synthetic { seed: DEFAULT_SEED },
                Some(dir) => {
                    let candidates: Vec<&str> = match name {
                        "hubert" => vec!["hubert.safetensors", "hubert.pth"],
                        _ => vec![MODEL_FILES.iter().find(|(n, _)| *n == name).expect("a known network").1],
                    };
                    let found = candidates.iter().map(|f| dir.join(f)).find(|p| p.is_file());
                    WeightsSource::File(found.with_context(|| {
                        format!(
                            "{}: Ditto's {name} weights not found (looked for {})",
                            dir.display(),
                            candidates.join(", ")
                        )
                    })?)
                }
            })
        };
        ensure!(
            models.is_none() || profile == Profile::Full,
            "Ditto's published weights are the full profile's sizes: use --profile full with --models"
        );
        let ctx = |what: &str| format!("loading Ditto's {what}");
        Ok(DittoEngines {
            appearance: AppearanceFeatureExtractor::new(&cfg.appearance, &source("appearance")?)
                .with_context(|| ctx("appearance extractor"))?,
            motion: MotionExtractor::new(&cfg.motion, &source("motion")?).with_context(|| ctx("motion extractor"))?,
            warp: WarpingNetwork::new(&cfg.warp, &source("warp")?).with_context(|| ctx("warping network"))?,
            decoder: SpadeDecoder::new(&cfg.spade, &source("decoder")?).with_context(|| ctx("SPADE decoder"))?,
            stitch: StitchingNetwork::new(&cfg.stitch, &source("stitch")?).with_context(|| ctx("stitching network"))?,
            lmdm: MotionDecoder::new(&cfg.lmdm, &source("lmdm")?).with_context(|| ctx("LMDM"))?,
            hubert: Hubert::new(&cfg.hubert, &source("hubert")?).with_context(|| ctx("HuBERT"))?,
            weights: match models {
                None => format!("synthetic(seed={DEFAULT_SEED})"),
                Some(d) => format!("real({})", d.display()),
            },
            seed: DEFAULT_SEED,
            cfg,
        })
    }

    /// `ditto (cadence CPU kernels, <profile>)`.
    pub fn describe(&self) -> String {
        format!("ditto warp+SPADE, HuBERT, LMDM (cadence CPU kernels, {})", self.cfg.profile)
    }

    /// Width of the audio features the LMDM is conditioned on.
    pub fn audio_feature_width(&self) -> usize {
        self.cfg.audio_features()
    }

    /// HuBERT's 25 fps features of 16 kHz audio: (frames, width).
    pub fn audio_features(&self, samples_16k: &[f32]) -> Result<Vec<f32>> {
        Ok(self.hubert.ditto_features(samples_16k)?)
    }

    /// The rows of every HuBERT chunk of `stream` whose audio has arrived.
    pub fn stream_features(&self, stream: &mut DittoFeatureStream) -> Result<Vec<f32>> {
        Ok(stream.step(&self.hubert)?)
    }

    /// The DDIM noise of a clip (drawn once per clip, as Ditto does).
    pub fn motion_noise(&self, steps: usize) -> DdimNoise {
        let lm = &self.cfg.lmdm;
        DdimNoise::seeded(self.seed, steps, lm.seq_len * lm.nfeats)
    }

    /// One LMDM window: `steps` DDIM steps from `noise`, conditioned on the motion `kp_cond`.
    pub fn motion_window(
        &self,
        kp_cond: &[f32],
        window: &[f32],
        steps: usize,
        noise: &DdimNoise,
    ) -> cadence_engines::Result<Vec<f32>> {
        self.lmdm.sample(kp_cond, window, steps, noise)
    }

    fn warp(&self, avatar: &DittoAvatar, kp_driving: &[f32]) -> Result<Vec<f32>> {
        let s = self.cfg.feature_side();
        Ok(self.warp.forward(&avatar.feature_3d, &avatar.x_s, kp_driving, s, s)?)
    }

    fn decode(&self, feature: &[f32]) -> Result<Vec<f32>> {
        let s = self.cfg.feature_side();
        Ok(self.decoder.forward(feature, 1, s, s)?)
    }
}

/// What a still avatar gives Ditto (module docs).
pub struct DittoAvatar {
    feature_3d: Vec<f32>,
    source: KpInfo,
    /// Canonical keypoints (21 × 3).
    kp: Vec<f32>,
    /// Source keypoints x_s (21 × 3).
    x_s: Vec<f32>,
    rest_feature: Vec<f32>,
    rest_crop: Vec<f32>,
    pub compositor: Compositor,
    /// Time of the whole preparation: the crop, the extractors, the compositor's tables and the
    /// rest frame (reported as the avatar's; its compositor share is not split out).
    pub encoder_ms: f64,
}

impl DittoAvatar {
    /// The source keypoints x_s (21 × 3), in the warp's normalised coordinates.
    pub fn source_keypoints(&self) -> &[f32] {
        &self.x_s
    }

    /// The rest state's pose (the source's own motion).
    fn rest_pose(&self) -> Pose {
        Pose::of(&self.source)
    }
}

/// Prepares a still image with its face box.
pub fn prepare_avatar(engines: &DittoEngines, backend: &Backend, img: &RgbImage, face: FaceBox) -> Result<DittoAvatar> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    ensure!(w % 2 == 0 && h % 2 == 0, "the avatar is {w}x{h}: its width and height must be even (see load_avatar)");
    let t = Instant::now();
    let side = engines.cfg.source_side;
    let crop = cadence_media::crop_to_planar(img, &face, side as u32)?;
    let feature_3d = engines.appearance.forward(&crop, side, side)?;
    let (source, kp) = KpInfo::from_heads(&engines.motion.forward(&crop, side, side)?)?;
    ensure!(source.is_finite() && kp.iter().all(|v| v.is_finite()), "the motion extractor gave non-finite values");
    let x_s = Pose::of(&source).keypoints(&kp);
    let rest_kp = engines.stitch.forward(&x_s, &x_s)?;
    let mut avatar = DittoAvatar {
        feature_3d,
        source,
        kp,
        x_s,
        rest_feature: Vec::new(),
        rest_crop: Vec::new(),
        compositor: Compositor::new(
            backend,
            img.as_raw(),
            w,
            h,
            face,
            (face.w.min(face.h) / 8) as f32,
            ColorMatrix::Bt709,
        )?,
        encoder_ms: 0.0,
    };
    avatar.rest_feature = engines.warp(&avatar, &rest_kp)?;
    avatar.rest_crop = engines.decode(&avatar.rest_feature)?;
    avatar.encoder_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(avatar)
}

/// Ditto's `_get_emo_avg(label)`: softmax of 8 at the label, 0 elsewhere.
fn emotion(label: usize) -> [f32; 8] {
    let mut e = [0f64; 8];
    e[label] = 8.0;
    let den: f64 = e.iter().map(|v| v.exp()).sum();
    e.map(|v| (v.exp() / den) as f32)
}

/// The per-frame condition (frames × (width + 79)) of audio features (frames × width).
pub fn condition(features: &[f32], width: usize, avatar: &DittoAvatar) -> Vec<f32> {
    let extra: Vec<f32> =
        emotion(EMOTION).iter().chain(&EYE_OPEN).chain(&[0.0; 6]).chain(&avatar.kp).copied().collect();
    features.chunks_exact(width).flat_map(|f| f.iter().chain(&extra).copied()).collect()
}

/// Checks user-given audio features: (frames, width), every value finite.
pub fn check_features(features: &[f32], shape: &[usize], width: usize, frames: usize, name: &str) -> Result<()> {
    ensure!(
        shape.len() == 2 && shape[1] == width,
        "{name}: audio features of shape {shape:?}; this profile's LMDM takes (frames, {width}) (HuBERT-large's 1024 at the full profile)"
    );
    ensure!(
        shape[0] == frames,
        "{name}: {} frames of audio features for {frames} video frames of audio (25 per second)",
        shape[0]
    );
    if let Some(i) = features.iter().position(|v| !v.is_finite()) {
        bail!("{name}: audio feature {i} (frame {}) is {}", i / width, features[i]);
    }
    Ok(())
}

/// The clip's motion (frames × 265) from its audio features, by the LMDM's offline windows.
pub fn sample_motion(engines: &DittoEngines, avatar: &DittoAvatar, features: &[f32], steps: usize) -> Result<Vec<f32>> {
    let width = engines.audio_feature_width();
    ensure!(!features.is_empty() && features.len().is_multiple_of(width), "audio features: {} values", features.len());
    let cond = condition(features, width, avatar);
    let lm = &engines.cfg.lmdm;
    let noise = engines.motion_noise(steps);
    Ok(offline_motion(&cond, lm.cond_dim, &avatar.source.to_motion(), lm.seq_len, WINDOW_OVERLAP, |kp, window| {
        engines.motion_window(kp, window, steps, &noise)
    })?)
}

/// The motion of a stream, window by window as its condition arrives ([`MotionStream`]): the
/// same windows as [`sample_motion`]'s.
pub fn motion_stream(engines: &DittoEngines, avatar: &DittoAvatar) -> Result<MotionStream> {
    let lm = &engines.cfg.lmdm;
    Ok(MotionStream::new(lm.cond_dim, &avatar.source.to_motion(), lm.seq_len, WINDOW_OVERLAP)?)
}

/// Every frame's stitched driving keypoints (frames × 63): relative driving against
/// `reference` (the clip's first frame's motion), easing toward rest with weight
/// h(1 − distance/ramp), stitching.
pub fn driving_keypoints(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    reference: &[f32],
    motion: &[f32],
    distance: &[u32],
    ramp: u32,
) -> Result<Vec<f32>> {
    ensure!(
        motion.len() == distance.len() * MOTION_DIM,
        "motion of {} values for {} frames",
        motion.len(),
        distance.len()
    );
    let reference = KpInfo::from_motion(reference)?;
    let rows: Vec<KpInfo> = motion.chunks_exact(MOTION_DIM).map(KpInfo::from_motion).collect::<Result<_, _>>()?;
    let rest = avatar.rest_pose();
    let mut kp_d = Vec::with_capacity(rows.len() * 3 * NUM_KP);
    for (d, &dist) in rows.iter().zip(distance) {
        let driving = Pose::of(&relative_driving(&avatar.source, d, &reference));
        kp_d.extend(driving.eased(&rest, easing_weight(dist, ramp)).keypoints(&avatar.kp));
    }
    let stitched = engines.stitch.forward(&avatar.x_s.repeat(rows.len()), &kp_d)?;
    ensure!(stitched.iter().all(|v| v.is_finite()), "the driving keypoints are not finite");
    Ok(stitched)
}

/// A clip made ready for Ditto's frame loop: its audio (the sound track and the activity), the
/// per-frame distance to speech, and every frame's driving keypoints.
pub struct DittoClip {
    pub audio: ClipAudio,
    pub frames: usize,
    pub distance: Vec<u32>,
    /// frames × 63.
    pub kp_driving: Vec<f32>,
    /// Time of HuBERT (0 with the user's features), the LMDM and the keypoints.
    pub audio_ms: f64,
}

/// Audio to driving keypoints: HuBERT's features (or `features`, checked by the caller with
/// [`check_features`]), the LMDM with `steps` DDIM steps, voice activity, easing over `ramp`
/// frames. `say` reports each stage as it starts.
pub fn prepare_clip(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    audio: cadence_media::Audio,
    features: Option<Vec<f32>>,
    steps: usize,
    ramp: u32,
    say: &dyn Fn(&str),
) -> Result<DittoClip> {
    let t = Instant::now();
    let frames = crate::clip_audio::frames_for_samples(audio.samples_16k.len(), DITTO_FPS as f64);
    ensure!(frames > 0, "the audio is too short for one video frame");
    let features = match features {
        Some(f) => f,
        None => {
            say("HuBERT features");
            engines.audio_features(&audio.samples_16k)?
        }
    };
    let width = engines.audio_feature_width();
    ensure!(
        features.len() == frames * width,
        "{} frames of audio features for {frames} video frames",
        features.len() / width
    );
    say(&format!("motion diffusion ({steps} DDIM steps)"));
    let motion = sample_motion(engines, avatar, &features, steps)?;
    let audio: ClipAudio = audio.into();
    let distance = crate::schedule::speech_distance(&audio.voice_activity(DITTO_FPS as f64, frames));
    let kp_driving = driving_keypoints(engines, avatar, &motion[..MOTION_DIM], &motion, &distance, ramp)?;
    Ok(DittoClip { audio, frames, distance, kp_driving, audio_ms: t.elapsed().as_secs_f64() * 1e3 })
}

/// Renders `clip` with `schedule` into `output` (the MuseTalk path's writer: checked output,
/// encoder beside the frame loop).
#[allow(clippy::too_many_arguments)]
pub fn render_clip(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    clip: &DittoClip,
    schedule: &KeyframeSchedule,
    infill: DittoInfill,
    method: Method,
    ramp: u32,
    output: crate::render::Output,
    progress: impl FnMut(usize),
) -> Result<crate::render::RenderResult> {
    ensure!(
        schedule.n_frames() == clip.frames,
        "schedule covers {} frames, the audio {}",
        schedule.n_frames(),
        clip.frames
    );
    let c = &avatar.compositor;
    let frames = |sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>, progress: Box<dyn FnMut(usize) + '_>| {
        render_frames(engines, avatar, &clip.kp_driving, &clip.distance, ramp, schedule, infill, method, sink, progress)
    };
    let fps = cadence_media::FrameRate::whole(DITTO_FPS);
    crate::render::write_video(&clip.audio, (c.width as u32, c.height as u32), fps, output, frames, progress)
}

/// The render's report (the MuseTalk path's, with Ditto's stages in its fields: docs/ditto.md):
/// HuBERT, the LMDM and the keypoints as the audio encoder (`audio_ms`: a clip's
/// [`DittoClip::audio_ms`]; a live render counts them in its stages' times instead), the
/// extractors and the rest frame as the avatar's, the warp as the keyframe network.
pub fn render_report(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    audio_ms: f64,
    engine_device: &cadence_engines::EngineDevice,
    result: &crate::render::RenderResult,
    engine_load_ms: f64,
) -> crate::report::RenderReport {
    let setup = crate::report::RenderSetup {
        backend: Backend::Cpu.describe(),
        engine_device: engine_device.label(),
        engines: engines.describe(),
        profile: engines.cfg.profile.to_string(),
        weights: engines.weights.clone(),
        keyframe_network: "warp",
    };
    let times = crate::report::PreparationTimes {
        audio_encoder_ms: audio_ms,
        avatar_encoder_ms: avatar.encoder_ms,
        compositor_setup_ms: 0.0,
        prepare_other_ms: 0.0,
    };
    let fps = cadence_media::FrameRate::whole(DITTO_FPS);
    crate::report::RenderReport::with_preparation(
        setup,
        &times,
        &result.stats,
        result.video.as_ref(),
        fps,
        engine_load_ms,
    )
}

/// A keyframe's outputs: the warp's feature and, where the infill needs it, the decoded crop.
#[derive(Clone)]
struct Key {
    feature: Vec<f32>,
    crop: Option<Vec<f32>>,
}

/// What the frame loop runs its networks with, and counts.
struct Networks<'a> {
    engines: &'a DittoEngines,
    avatar: &'a DittoAvatar,
    kp_driving: &'a [f32],
    keys: &'a [u32],
    bypassed: &'a [bool],
    infill: DittoInfill,
    /// Keyframe j's outputs, made when a frame first needs them; the current interval's are kept.
    cache: Vec<(usize, Key)>,
    warped: usize,
    decoded: usize,
}

impl Networks<'_> {
    fn kp(&self, f: usize) -> &[f32] {
        &self.kp_driving[f * 3 * NUM_KP..(f + 1) * 3 * NUM_KP]
    }

    fn key(&mut self, j: usize, times: &mut StageTimes) -> Result<Key> {
        if let Some((_, k)) = self.cache.iter().find(|(i, _)| *i == j) {
            return Ok(k.clone());
        }
        let f = self.keys[j] as usize;
        let k = if self.bypassed[f] {
            Key { feature: self.avatar.rest_feature.clone(), crop: Some(self.avatar.rest_crop.clone()) }
        } else {
            let t = Instant::now();
            let feature = self.engines.warp(self.avatar, self.kp(f))?;
            times.unet_ms += ms(t);
            self.warped += 1;
            let crop = match self.infill {
                DittoInfill::Feature => None,
                _ => Some(self.decode(&feature, times)?),
            };
            Key { feature, crop }
        };
        self.cache.retain(|(i, _)| *i + 1 >= j);
        self.cache.push((j, k.clone()));
        Ok(k)
    }

    fn decode(&mut self, feature: &[f32], times: &mut StageTimes) -> Result<Vec<f32>> {
        let t = Instant::now();
        let c = self.engines.decode(feature)?;
        times.decoder_ms += ms(t);
        self.decoded += 1;
        Ok(c)
    }
}

/// Renders every frame of a clip whose driving keypoints are `kp_driving` (frames × 63) and hands
/// each NV12 frame to `sink` in order. `distance`: frames to the nearest speech per frame.
#[allow(clippy::too_many_arguments)]
pub fn render_frames(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    kp_driving: &[f32],
    distance: &[u32],
    ramp: u32,
    schedule: &KeyframeSchedule,
    infill: DittoInfill,
    method: Method,
    mut sink: impl FnMut(usize, &[u8]) -> Result<()>,
    mut progress: impl FnMut(usize),
) -> Result<RenderStats> {
    let t_total = Instant::now();
    let mut times = StageTimes::default();
    let n = schedule.n_frames();
    ensure!(
        kp_driving.len() == n * 3 * NUM_KP && distance.len() == n,
        "keypoints, activity and schedule disagree on the frame count"
    );
    let side = engines.cfg.output_side();
    let bypassed = bypassed_frames(distance, ramp);
    let keys = schedule.keyframes();
    let m = keys.len();
    let positions = schedule.frame_positions();
    let mut nets = Networks {
        engines,
        avatar,
        kp_driving,
        keys,
        bypassed: &bypassed,
        infill,
        cache: Vec::with_capacity(2),
        warped: 0,
        decoded: 0,
    };
    let mut frame = avatar.compositor.background_nv12().to_vec();
    let mut showing_rest = false;
    for f in 0..n {
        let (j, alpha) = positions[f];
        let (j0, j1) = if m == 1 { (0, 0) } else { (j, j + 1) };
        let crop: Option<Vec<f32>> = if bypassed[f] {
            None
        } else if alpha <= 0.0 || alpha >= 1.0 {
            let k = nets.key(if alpha <= 0.0 { j0 } else { j1 }, &mut times)?;
            Some(match k.crop {
                Some(c) => c,
                None => nets.decode(&k.feature, &mut times)?,
            })
        } else {
            Some(match infill {
                DittoInfill::Feature => {
                    let (a, b) = (nets.key(j0, &mut times)?, nets.key(j1, &mut times)?);
                    let t = Instant::now();
                    let mut mid = vec![0f32; a.feature.len()];
                    crate::cpu::slerp_pairs(&a.feature, &b.feature, &[alpha], a.feature.len(), method, &mut mid);
                    times.expand_ms += ms(t);
                    nets.decode(&mid, &mut times)?
                }
                DittoInfill::Image => {
                    let (a, b) = (nets.key(j0, &mut times)?, nets.key(j1, &mut times)?);
                    let (a, b) = (a.crop.expect("keyframes decoded"), b.crop.expect("keyframes decoded"));
                    let t = Instant::now();
                    let mut mid = vec![0f32; a.len()];
                    crate::cpu::slerp_pairs(&a, &b, &[alpha], a.len(), method, &mut mid);
                    times.expand_ms += ms(t);
                    mid
                }
                DittoInfill::Motion => {
                    let jn = if alpha <= 0.5 { j0 } else { j1 };
                    let k = nets.key(jn, &mut times)?;
                    let t = Instant::now();
                    let crop = k.crop.as_ref().expect("keyframes decoded");
                    let moved = motion_warp(crop, side, nets.kp(keys[jn] as usize), nets.kp(f));
                    times.expand_ms += ms(t);
                    moved
                }
            })
        };
        let t = Instant::now();
        match &crop {
            Some(c) => avatar.compositor.compose_box(c, side, side, RgbRange::Unit, &mut frame)?,
            // A run of bypassed frames shows the rest frame, composited once.
            None if showing_rest => {}
            None => avatar.compositor.compose_box(&avatar.rest_crop, side, side, RgbRange::Unit, &mut frame)?,
        }
        showing_rest = crop.is_none();
        times.composite_nv12_ms += ms(t);
        let t = Instant::now();
        sink(f, &frame).with_context(|| format!("encoding frame {f}"))?;
        times.encoder_ms += ms(t);
        progress(1);
    }
    times.total_ms = ms(t_total);
    let accounted = times.unet_ms + times.decoder_ms + times.expand_ms + times.composite_nv12_ms + times.encoder_ms;
    times.other_ms = (times.total_ms - accounted).max(0.0);
    Ok(RenderStats {
        frames: n,
        keyframes_scheduled: m,
        keyframes_evaluated: nets.warped,
        bypassed_frames: bypassed.iter().filter(|&&b| b).count(),
        decoded_frames: nets.decoded,
        residency: Residency::Host,
        times,
    })
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Variance of the keypoint weights, in normalised coordinates: the warping network's own
/// heatmap width (exp(−½‖p − kp‖²/0.01)).
const FLOW_VARIANCE: f32 = 0.01;

/// The `motion` infill: `crop` (planar 3 × side × side, decoded at keypoints `from`) moved to
/// keypoints `to` (both 21 × 3, x and y in the crop's normalised [−1, 1] coordinates, as the
/// warping network reads them). Backward warp: output pixel p samples the crop at p + u(p), where
/// u(p) = Σᵢ gᵢ(p)·(fromᵢ − toᵢ) / max(Σᵢ gᵢ(p), 1) and gᵢ(p) = exp(−½‖p − toᵢ‖²/0.01): near a
/// keypoint it moves as that keypoint did, between keypoints it blends their moves, far from all
/// of them (the weights sum below 1) it fades to no motion. Bilinear sampling, edges clamped.
pub fn motion_warp(crop: &[f32], side: usize, from: &[f32], to: &[f32]) -> Vec<f32> {
    assert_eq!(crop.len(), 3 * side * side);
    assert!(from.len() == to.len() && from.len().is_multiple_of(3));
    // The Gaussian is separable: gᵢ(x, y) = exp(−½(x − xᵢ)²/v)·exp(−½(y − yᵢ)²/v), so each
    // keypoint's factors are tabulated once per column and per row, and the per-pixel loop
    // multiplies instead of calling exp (21 × 2 × side exps per frame instead of 21 × side²).
    let s = side as f32;
    let centre = |i: usize| (2 * i + 1) as f32 / s - 1.0; // pixel centres, align_corners=False
    let kps: Vec<([f32; 2], [f32; 2])> =
        from.chunks_exact(3).zip(to.chunks_exact(3)).map(|(a, b)| ([b[0], b[1]], [a[0] - b[0], a[1] - b[1]])).collect();
    // Factors below 1e-18 are dropped: their products would fall below f32's normal range
    // (1.2e-38), where every multiply-add takes a microcode assist on x86, and a weight that
    // small moves no pixel by a measurable amount (the flow is normalised by max(Σg, 1)).
    let factor = |axis: usize| -> Vec<f32> {
        let mut t = Vec::with_capacity(kps.len() * side);
        for (p, _) in &kps {
            t.extend((0..side).map(|i| {
                let g = (-0.5 * (centre(i) - p[axis]).powi(2) / FLOW_VARIANCE).exp();
                if g < 1e-18 {
                    0.0
                } else {
                    g
                }
            }));
        }
        t
    };
    let (gx, gy) = (factor(0), factor(1));
    let moves: Vec<[f32; 2]> = kps.iter().map(|(_, d)| *d).collect();
    let cols: Vec<f32> = (0..side).map(centre).collect();
    let plane = side * side;
    let mut out = vec![0f32; crop.len()];
    let (r, rest) = out.split_at_mut(plane);
    let (g, b) = rest.split_at_mut(plane);
    r.par_chunks_mut(side).zip(g.par_chunks_mut(side)).zip(b.par_chunks_mut(side)).enumerate().for_each(
        |(y, ((ro, go), bo))| {
            let wy: Vec<f32> = (0..moves.len()).map(|i| gy[i * side + y]).collect();
            let row = FlowRow { crop, side, gx: &gx, wy: &wy, moves: &moves, cols: &cols, py: centre(y) };
            motion_warp_row(&row, ro, go, bo);
        },
    );
    out
}

/// What one output row of [`motion_warp`] reads.
struct FlowRow<'a> {
    /// The keyframe crop, planar 3 × side × side.
    crop: &'a [f32],
    side: usize,
    /// Each keypoint's column factors (keypoints × side) and its factor at this row.
    gx: &'a [f32],
    wy: &'a [f32],
    /// Each keypoint's displacement (from − to), x and y.
    moves: &'a [[f32; 2]],
    /// The column centres and this row's, in normalised coordinates.
    cols: &'a [f32],
    py: f32,
}

crate::cpu::multiversion! {
    /// One output row of [`motion_warp`], compiled for the instruction set [`crate::cpu::isa`]
    /// returns: the row's flow keypoint by keypoint over contiguous columns, then the bilinear
    /// samples into the three planes' rows.
    fn motion_warp_row(row: &FlowRow, ro: &mut [f32], go: &mut [f32], bo: &mut [f32]) => motion_warp_row_body
}

#[inline(always)]
fn motion_warp_row_body(row: &FlowRow, ro: &mut [f32], go: &mut [f32], bo: &mut [f32]) {
    let side = row.side;
    let s = side as f32;
    let (mut wsum, mut ux, mut uy) = (vec![0f32; side], vec![0f32; side], vec![0f32; side]);
    for ((d, &wy), gx) in row.moves.iter().zip(row.wy).zip(row.gx.chunks_exact(side)) {
        if wy == 0.0 {
            continue;
        }
        for (((gxv, ws), u), v) in gx.iter().zip(&mut wsum).zip(&mut ux).zip(&mut uy) {
            let w = gxv * wy;
            *ws += w;
            *u += w * d[0];
            *v += w * d[1];
        }
    }
    // Back to pixel coordinates of the source positions (reusing the flow's buffers).
    for (((ws, u), v), px) in wsum.iter().zip(&mut ux).zip(&mut uy).zip(row.cols) {
        let norm = ws.max(1.0);
        *u = ((px + *u / norm + 1.0) * s - 1.0) / 2.0;
        *v = ((row.py + *v / norm + 1.0) * s - 1.0) / 2.0;
    }
    sample_row(row.crop, side, &ux, &uy, ro, go, bo);
}

/// Bilinear samples of the three planes of `img` at the columns' source positions (`sx`, `sy`
/// in pixels): [`bilinear3`] per column, sixteen columns at a time with AVX-512 gathers where
/// the CPU has them (the loop does not vectorise by itself: every sample is a gather).
fn sample_row(img: &[f32], side: usize, sx: &[f32], sy: &[f32], ro: &mut [f32], go: &mut [f32], bo: &mut [f32]) {
    let n = sx.len();
    assert!(sy.len() == n && ro.len() == n && go.len() == n && bo.len() == n && img.len() == 3 * side * side);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::isa() == crate::cpu::Isa::Avx512 {
        // SAFETY: isa() reports AVX-512 only where the CPU has it; the lengths are checked above.
        done = unsafe { sample_row_avx512(img, side, sx, sy, ro, go, bo) };
    }
    for i in done..n {
        (ro[i], go[i], bo[i]) = bilinear3(img, side, sx[i], sy[i]);
    }
}

/// [`bilinear3`] for the first multiple of 16 columns, operation for operation (no fused
/// multiply-add), so the same bits; returns how many columns it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sample_row_avx512(
    img: &[f32],
    side: usize,
    sx: &[f32],
    sy: &[f32],
    ro: &mut [f32],
    go: &mut [f32],
    bo: &mut [f32],
) -> usize {
    use std::arch::x86_64::*;
    let plane = side * side;
    assert!(3 * plane <= i32::MAX as usize && img.len() == 3 * plane);
    let n = sx.len() / 16 * 16;
    assert!([sy.len(), ro.len(), go.len(), bo.len()].iter().all(|&l| l == sx.len()));
    let (max, one) = (_mm512_set1_ps((side - 1) as f32), _mm512_set1_ps(1.0));
    let (side_i, last, one_i) =
        (_mm512_set1_epi32(side as i32), _mm512_set1_epi32(side as i32 - 1), _mm512_set1_epi32(1));
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= the lengths of sx, sy, ro, go, bo (checked above), and
        // every gathered index is y * side + x with x, y clamped to [0, side - 1], inside a plane.
        unsafe {
            // max(v, 0) first: NaN becomes 0, as in bilinear3.
            let x = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(sx.as_ptr().add(i)), _mm512_setzero_ps()), max);
            let y = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(sy.as_ptr().add(i)), _mm512_setzero_ps()), max);
            let (x0, y0) = (_mm512_cvttps_epi32(x), _mm512_cvttps_epi32(y));
            let (x1, y1) = (
                _mm512_min_epi32(_mm512_add_epi32(x0, one_i), last),
                _mm512_min_epi32(_mm512_add_epi32(y0, one_i), last),
            );
            let (fx, fy) = (_mm512_sub_ps(x, _mm512_cvtepi32_ps(x0)), _mm512_sub_ps(y, _mm512_cvtepi32_ps(y0)));
            let (gx, gy) = (_mm512_sub_ps(one, fx), _mm512_sub_ps(one, fy));
            let (r0, r1) = (_mm512_mullo_epi32(y0, side_i), _mm512_mullo_epi32(y1, side_i));
            let (i00, i01, i10, i11) = (
                _mm512_add_epi32(r0, x0),
                _mm512_add_epi32(r0, x1),
                _mm512_add_epi32(r1, x0),
                _mm512_add_epi32(r1, x1),
            );
            for (c, out) in [&mut *ro, &mut *go, &mut *bo].into_iter().enumerate() {
                let p = img.as_ptr().add(c * plane);
                let g = |idx| _mm512_i32gather_ps::<4>(idx, p);
                let top = _mm512_add_ps(_mm512_mul_ps(g(i00), gx), _mm512_mul_ps(g(i01), fx));
                let bot = _mm512_add_ps(_mm512_mul_ps(g(i10), gx), _mm512_mul_ps(g(i11), fx));
                let v = _mm512_add_ps(_mm512_mul_ps(top, gy), _mm512_mul_ps(bot, fy));
                _mm512_storeu_ps(out.as_mut_ptr().add(i), v);
            }
        }
    }
    n
}

/// The three planes of `img` at (x, y) in pixels, bilinear, coordinates clamped to the image
/// (a NaN coordinate to 0).
#[inline(always)]
fn bilinear3(img: &[f32], side: usize, x: f32, y: f32) -> (f32, f32, f32) {
    let max = (side - 1) as f32;
    let (x, y) = (x.max(0.0).min(max), y.max(0.0).min(max));
    // Truncation is floor here: the coordinates are clamped to be non-negative.
    let (x0, y0) = (x as usize, y as usize);
    let (x1, y1) = ((x0 + 1).min(side - 1), (y0 + 1).min(side - 1));
    let (fx, fy) = (x - x0 as f32, y - y0 as f32);
    let plane = side * side;
    let (i00, i01, i10, i11) = (y0 * side + x0, y0 * side + x1, y1 * side + x0, y1 * side + x1);
    let at = |p: &[f32]| {
        let top = p[i00] * (1.0 - fx) + p[i01] * fx;
        let bot = p[i10] * (1.0 - fx) + p[i11] * fx;
        top * (1.0 - fy) + bot * fy
    };
    let (r, rest) = img.split_at(plane);
    let (g, b) = rest.split_at(plane);
    (at(r), at(g), at(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(side: usize) -> Vec<f32> {
        (0..3 * side * side)
            .map(|i| ((i % side) as f32 + 2.0 * ((i / side) % side) as f32) / (3.0 * side as f32))
            .collect()
    }

    #[test]
    fn motion_warp_without_motion_is_the_identity() {
        let side = 16;
        let img = gradient(side);
        let kp: Vec<f32> = (0..63).map(|i| ((i * 37) % 17) as f32 / 10.0 - 0.8).collect();
        let out = motion_warp(&img, side, &kp, &kp);
        for (a, b) in out.iter().zip(&img) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    /// Against the flow written directly (f64, one exp per keypoint and pixel), sampled by the
    /// same bilinear rule: the separable tabulation changes nothing but rounding.
    #[test]
    fn motion_warp_matches_the_direct_formula() {
        let side = 24;
        let img = gradient(side);
        let from: Vec<f32> = (0..63).map(|i| ((i * 37) % 23) as f32 / 12.0 - 0.9).collect();
        let to: Vec<f32> = from.iter().enumerate().map(|(i, v)| v + 0.05 * ((i as f32) * 0.7).sin()).collect();
        let out = motion_warp(&img, side, &from, &to);
        let s = side as f64;
        for y in 0..side {
            for x in 0..side {
                let (px, py) = ((2 * x + 1) as f64 / s - 1.0, (2 * y + 1) as f64 / s - 1.0);
                let (mut w, mut ux, mut uy) = (0.0, 0.0, 0.0);
                for k in 0..21 {
                    let (tx, ty) = (to[3 * k] as f64, to[3 * k + 1] as f64);
                    let g = (-0.5 * ((px - tx).powi(2) + (py - ty).powi(2)) / 0.01).exp();
                    w += g;
                    ux += g * (from[3 * k] - to[3 * k]) as f64;
                    uy += g * (from[3 * k + 1] - to[3 * k + 1]) as f64;
                }
                let n = w.max(1.0);
                let sx = ((px + ux / n + 1.0) * s - 1.0) / 2.0;
                let sy = ((py + uy / n + 1.0) * s - 1.0) / 2.0;
                let want = bilinear3(&img, side, sx as f32, sy as f32);
                let i = y * side + x;
                assert!((out[i] - want.0).abs() < 1e-4, "({x}, {y}): {} vs {}", out[i], want.0);
                assert!((out[2 * side * side + i] - want.2).abs() < 1e-4);
            }
        }
    }

    /// One keypoint moved by whole pixels: next to it the image moves with it, far away it stays.
    #[test]
    fn motion_warp_moves_near_keypoints_and_keeps_far_pixels() {
        let side = 64;
        let img = gradient(side);
        let mut from = vec![5.0f32; 63]; // all other keypoints far outside the crop
        let mut to = from.clone();
        // Keypoint 0 at the pixel centre (32, 32) in the frame, (28, 32) in the keyframe:
        // 4 pixels = 8/64 in normalised units.
        let c = |p: f32| (2.0 * p + 1.0) / side as f32 - 1.0;
        to[0..3].copy_from_slice(&[c(32.0), c(32.0), 0.0]);
        from[0..3].copy_from_slice(&[c(28.0), c(32.0), 0.0]);
        let out = motion_warp(&img, side, &from, &to);
        let px = |v: &[f32], x: usize, y: usize| v[y * side + x];
        assert!((px(&out, 32, 32) - px(&img, 28, 32)).abs() < 1e-5, "the keypoint's pixel came from 4 px left");
        assert!((px(&out, 2, 2) - px(&img, 2, 2)).abs() < 1e-6, "a far corner does not move");
    }
}
