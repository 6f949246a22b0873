//! The Ditto render path (`cadence render --engine ditto`): audio -> HuBERT features -> LMDM
//! motion -> per-frame driving keypoints (relative driving, silence easing, stitching) -> the
//! warping network and SPADE decoder on keyframes -> infill between keyframes -> the same
//! compositor, NV12 conversion and encoder as the MuseTalk path ([`crate::frame_loop::video::write_video`]).
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
//! **Keyframes** run warp (+ decoder) in the frame loop ([`frames`]); the frames between are filled by [`DittoInfill`]. A
//! keyframe in sustained silence is the rest frame (no network runs).
//!
//! cadence has no face-landmark model, so two of Ditto's per-source conditions are constants:
//! the eye-open ratios ([`EYE_OPEN`]) and the eye-ball offsets (zeros); Ditto measures them
//! from the source's landmarks. The emotion is Ditto's default (4, neutral).

pub mod frames;
pub mod live;
pub mod motion_warp;

use crate::backend::composite::{Compositor, FaceBox};
use crate::backend::elem::Method;
use crate::frame_loop::audio::ClipAudio;
use crate::schedules::keyframes::KeyframeSchedule;
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
    /// Time of the voice activity decisions.
    pub vad_ms: f64,
}

/// How a clip's motion is made: DDIM steps of the LMDM, the easing ramp in frames, and the
/// voice activity detector.
#[derive(Clone, Copy, Debug)]
pub struct ClipOptions {
    pub steps: usize,
    pub ramp: u32,
    pub vad: crate::frame_loop::audio::Vad,
}

/// Audio to driving keypoints: HuBERT's features (or `features`, checked by the caller with
/// [`check_features`]), the LMDM with `opts.steps` DDIM steps, voice activity by `opts.vad`,
/// easing over `opts.ramp` frames. `say` reports each stage as it starts.
pub fn prepare_clip(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    audio: cadence_media::Audio,
    features: Option<Vec<f32>>,
    opts: &ClipOptions,
    say: &dyn Fn(&str),
) -> Result<DittoClip> {
    let ClipOptions { steps, ramp, vad } = *opts;
    let t = Instant::now();
    let frames = crate::frame_loop::audio::frames_for_samples(audio.samples_16k.len(), DITTO_FPS as f64);
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
    let t_vad = Instant::now();
    let speech = audio.voice_activity(DITTO_FPS as f64, frames, &vad)?;
    let vad_ms = t_vad.elapsed().as_secs_f64() * 1e3;
    let distance = crate::schedules::keyframes::speech_distance(&speech);
    let kp_driving = driving_keypoints(engines, avatar, &motion[..MOTION_DIM], &motion, &distance, ramp)?;
    let audio_ms = t.elapsed().as_secs_f64() * 1e3 - vad_ms;
    Ok(DittoClip { audio, frames, distance, kp_driving, audio_ms, vad_ms })
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
    output: crate::frame_loop::video::Output,
    progress: impl FnMut(usize),
) -> Result<crate::frame_loop::video::RenderResult> {
    ensure!(
        schedule.n_frames() == clip.frames,
        "schedule covers {} frames, the audio {}",
        schedule.n_frames(),
        clip.frames
    );
    let c = &avatar.compositor;
    let frames = |sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>, progress: Box<dyn FnMut(usize) + '_>| {
        frames::render(
            engines,
            avatar,
            &clip.kp_driving,
            &clip.distance,
            ramp,
            schedule,
            infill,
            method,
            sink,
            progress,
        )
    };
    let fps = cadence_media::FrameRate::whole(DITTO_FPS);
    crate::frame_loop::video::write_video(&clip.audio, (c.width as u32, c.height as u32), fps, output, frames, progress)
}

/// The render's report (the MuseTalk path's, with Ditto's stages in its fields: docs/ditto.md):
/// HuBERT, the LMDM and the keypoints as the audio encoder (`audio_ms`: a clip's
/// [`DittoClip::audio_ms`]; a live render counts them in its stages' times instead), the
/// voice activity's time (`vad_ms`), the extractors and the rest frame as the avatar's, the warp
/// as the keyframe network.
pub fn render_report(
    engines: &DittoEngines,
    avatar: &DittoAvatar,
    (audio_ms, vad_ms): (f64, f64),
    engine_device: &cadence_engines::EngineDevice,
    result: &crate::frame_loop::video::RenderResult,
    engine_load_ms: f64,
) -> crate::frame_loop::report::RenderReport {
    let setup = crate::frame_loop::report::RenderSetup {
        backend: Backend::Cpu.describe(),
        engine_device: engine_device.label(),
        engines: engines.describe(),
        profile: engines.cfg.profile.to_string(),
        weights: engines.weights.clone(),
        keyframe_network: "warp",
    };
    let times = crate::frame_loop::report::PreparationTimes {
        audio_encoder_ms: audio_ms,
        avatar_encoder_ms: avatar.encoder_ms,
        compositor_setup_ms: 0.0,
        vad_ms,
        prepare_other_ms: 0.0,
        // Ditto's preparation has wall clocks only.
        audio_encoder_cpu_ms: None,
        avatar_encoder_cpu_ms: None,
    };
    let fps = cadence_media::FrameRate::whole(DITTO_FPS);
    crate::frame_loop::report::RenderReport::with_preparation(
        setup,
        &times,
        &result.stats,
        result.video.as_ref(),
        fps,
        engine_load_ms,
    )
}
