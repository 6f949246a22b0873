//! The command-line arguments `cadence` and the experiments share, defined once (clap derive,
//! flattened into each command), with their parsers and the checks that can run before any
//! engine loads.

use crate::avatar::{DetectOptions, FaceBoxArg, FaceSpec};
use crate::frame_loop::audio::Vad;
use crate::musetalk::{DecoderKind, Engines};
use anyhow::{ensure, Result};
use cadence_engines::device::DEVICE_HELP;
use cadence_engines::{DeviceRequest, EngineDevice, ModelsDir, Profile};
use cadence_media::vad::silero::SileroConfig;
use cadence_media::{EncoderKind, FrameRate};
use std::path::PathBuf;

/// Which neural engines to load, where, and with which weights.
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// Engine size: cpu-reduced (default on the CPU with synthetic weights) or full (the
    /// published architectures; default on CUDA and with --models, and what real weights need).
    /// cpu-reduced is a scale model: narrower networks (1/12 to 1/17 of a full frame's time) whose
    /// UNet, decoder and audio encoder keep the full profile's shares of a frame's neural time
    /// within 15% on this kind of machine (its widths follow the kernel gemm runs, AVX-512 or
    /// FMA), so stride gains carry over; absolute times and outputs do not (docs/profiles.md).
    #[arg(long, value_parser = parse_profile)]
    pub profile: Option<Profile>,
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = DEVICE_HELP)]
    pub device: DeviceRequest,
    /// Latent decoder (and the matching image encoder for the avatar).
    #[arg(long, value_enum, default_value = "taesd")]
    pub decoder: DecoderKind,
    /// MuseTalk's models/ folder as downloaded (else $CADENCE_MODELS; else seeded synthetic
    /// weights). Every engine must be found there; `cadence models check DIR` says what is.
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Frames per UNet and decoder call.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub batch: u32,
}

impl EngineArgs {
    /// The engines' device and profile: cheap, so a command can check everything else before
    /// [`EngineArgs::load`] does the expensive part. The models folder is checked here too (it
    /// must exist and hold weights), and decides the default profile: `full` with real weights
    /// (`cpu-reduced` with them is an error), else the device's default.
    pub fn device(&self) -> Result<(EngineDevice, Profile)> {
        let d = cadence_engines::select_device(self.device)?;
        let models = self.models_dir()?;
        let profile = Profile::for_weights(self.profile, &d.device, models.is_some())?;
        Ok((d, profile))
    }

    /// `--models`, else `$CADENCE_MODELS`, else none (seeded synthetic weights).
    pub fn models_dir(&self) -> Result<Option<ModelsDir>> {
        Ok(ModelsDir::requested(self.models.as_deref())?)
    }

    pub fn load(&self, device: &EngineDevice, profile: Profile) -> Result<Engines> {
        Engines::load(profile, self.decoder, &device.device, self.models_dir()?.as_ref())
    }
}

fn parse_profile(s: &str) -> std::result::Result<Profile, String> {
    Profile::parse(s).map_err(|e| e.to_string())
}

/// The talking-head engine a render runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineFamily {
    /// MuseTalk: whisper features, a latent inpainting UNet on keyframes, SLERP of latents, a
    /// VAE decoder (--decoder).
    Musetalk,
    /// Ditto: HuBERT features, motion diffusion (LMDM), the warping network and SPADE decoder on
    /// keyframes, --ditto-infill between them (a still image avatar, 25 fps).
    Ditto,
}

/// The H.264 encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EncoderArg {
    /// OpenH264, built in.
    Openh264,
    /// libx264 through ffmpeg (builds with the media crate's `ffmpeg` feature).
    X264,
    /// NVIDIA's hardware encoder through ffmpeg (`ffmpeg` feature and an NVIDIA driver).
    Nvenc,
}

impl EncoderArg {
    pub fn kind(self) -> EncoderKind {
        match self {
            EncoderArg::Openh264 => EncoderKind::OpenH264,
            EncoderArg::X264 => EncoderKind::X264,
            EncoderArg::Nvenc => EncoderKind::Nvenc,
        }
    }

    /// The encoder, if this build has it (checked before any work starts).
    pub fn available(self) -> Result<EncoderKind> {
        let k = self.kind();
        ensure!(
            k.compiled_in(),
            "encoder '{k}' is not in this build: rebuild with the media crate's `ffmpeg` feature \
             (see media/README.md), or use openh264"
        );
        Ok(k)
    }
}

/// A frame rate (see [`FrameRate::parse`]).
pub fn parse_frame_rate(s: &str) -> std::result::Result<FrameRate, String> {
    FrameRate::parse(s)
}

/// A positive, finite number of seconds.
/// `--window`: a render window in seconds, 0 (the clip as one window) to an hour.
pub fn parse_window_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a window length in seconds (0 to 3600; 0 = the whole clip)")),
    }
}

pub fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

/// Where the face box comes from (docs/faces.md): found by the detector by default, or given.
#[derive(clap::Args, Clone, Debug)]
pub struct FaceArgs {
    /// The face box as x,y,w,h (pixels, at least 16x16) for every avatar frame, or `center`
    /// for a centred square of half the shorter side. Default: the face is found (MTCNN) and
    /// MuseTalk's crop derived from its box and landmarks.
    #[arg(long, value_parser = crate::avatar::faces::parse_face_box_arg)]
    pub face_box: Option<FaceBoxArg>,
    /// A video avatar's face boxes, one per avatar frame: a text file with one x,y,w,h line
    /// per frame, in order (blank lines and lines starting with # are skipped).
    #[arg(long, conflicts_with = "face_box")]
    pub face_boxes: Option<PathBuf>,
    /// With several faces, which one the detector's box follows: 0 the largest, 1 the next...
    #[arg(long, default_value_t = 0)]
    pub face_index: usize,
    /// MuseTalk's bbox_shift (pixels): moves the crop's centre line down (+), giving the mouth
    /// more room, or up (-). Found faces only.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub bbox_shift: i32,
    /// The smallest face the detector searches for, in pixels (smaller is slower).
    #[arg(long, default_value_t = 20.0, value_parser = parse_min_face_size)]
    pub min_face_size: f64,
}

impl FaceArgs {
    /// The face boxes' source these flags name, with progress on stderr when detecting.
    pub fn spec(&self) -> Result<FaceSpec> {
        let detect = DetectOptions {
            face_index: self.face_index,
            bbox_shift: self.bbox_shift,
            min_face_size: self.min_face_size,
            progress: true,
        };
        let spec = FaceSpec::from_flags(self.face_box, self.face_boxes.clone(), detect)?;
        ensure!(
            spec.detects() || (self.face_index == 0 && self.bbox_shift == 0),
            "--face-index and --bbox-shift choose and crop a face the detector finds; with --face-box or --face-boxes the box is given"
        );
        Ok(spec)
    }

    /// Whether any face flag was given (a prepared avatar takes none: its boxes are in it).
    pub fn any_given(&self) -> bool {
        self.face_box.is_some() || self.face_boxes.is_some() || self.face_index != 0 || self.bbox_shift != 0
    }
}

/// `--min-face-size`: at least P-Net's 12-pixel window.
pub fn parse_min_face_size(s: &str) -> std::result::Result<f64, String> {
    use cadence_engines::mtcnn::detect::SMALLEST_FACE;
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= SMALLEST_FACE => Ok(v),
        _ => Err(format!("'{s}': the smallest face is a number of pixels, at least {SMALLEST_FACE} (P-Net's window)")),
    }
}

/// Which detector decides voice activity, and Silero's thresholds (docs/vad.md).
#[derive(clap::Args, Clone, Debug)]
pub struct VadArgs {
    /// Voice activity, which decides where silence eases into the rest state and where
    /// sustained silence bypasses every network: `silero` (Silero VAD v5, a trained model
    /// committed with cadence; the default), `energy` (an RMS level against the clip's
    /// loudness: fooled by breaths, music and noise) or `digital` (a frame is silence when its
    /// samples are all zero: for audio whose pauses are written, as a speech synthesizer
    /// writes them; recorded pauses are speech to it). A live render (--audio -) decides as
    /// the stream arrives, with a lookahead the detector sets (none for `digital`; docs/vad.md).
    #[arg(long, value_enum, default_value = "silero")]
    pub vad: VadKind,
    /// Silero: a 32 ms chunk at or above this speech probability is speech (0 to 1).
    #[arg(long, default_value_t = 0.5, value_parser = parse_probability)]
    pub vad_threshold: f64,
    /// Silero: speech shorter than this is dropped (ms).
    #[arg(long, default_value_t = 250.0, value_parser = parse_ms)]
    pub vad_min_speech_ms: f64,
    /// Silero: a pause shorter than this stays inside the speech around it (ms).
    #[arg(long, default_value_t = 100.0, value_parser = parse_ms)]
    pub vad_min_silence_ms: f64,
    /// Silero: each speech segment is widened by this much on both sides (ms).
    #[arg(long, default_value_t = 30.0, value_parser = parse_ms)]
    pub vad_pad_ms: f64,
    /// Silero: noise suppression and level normalisation before the network (`on`, the
    /// default: a Wiener filter against the stationary background and an AGC, so quiet speech
    /// in noise is not missed; 64 ms more lookahead live) or `off` (the samples as they are,
    /// as the Silero wheel runs). docs/vad.md.
    #[arg(long, value_enum, default_value = "on")]
    pub vad_denoise: OnOff,
}

/// A switch's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    pub fn is_on(self) -> bool {
        self == OnOff::On
    }
}

/// `--vad`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VadKind {
    Silero,
    Energy,
    Digital,
}

impl VadArgs {
    /// The detector `--vad` names, Silero with these thresholds.
    pub fn vad(&self) -> Vad {
        self.with_kind(self.vad)
    }

    /// The detector `kind`, Silero with these thresholds.
    pub fn with_kind(&self, kind: VadKind) -> Vad {
        match kind {
            VadKind::Energy => Vad::Energy,
            VadKind::Digital => Vad::Digital,
            VadKind::Silero => Vad::Silero(SileroConfig {
                threshold: self.vad_threshold,
                min_speech_duration_ms: self.vad_min_speech_ms,
                min_silence_duration_ms: self.vad_min_silence_ms,
                speech_pad_ms: self.vad_pad_ms,
                denoise: self.vad_denoise.is_on(),
                ..SileroConfig::default()
            }),
        }
    }
}

fn parse_probability(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a probability from 0 to 1")),
    }
}

fn parse_ms(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("'{s}' is not a duration in milliseconds (0 or more)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--vad-denoise` switches Silero's front end, on by default; other values are refused.
    #[test]
    fn vad_denoise_flag() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            vad: VadArgs,
        }
        assert_eq!(T::parse_from(["t"]).vad.vad(), Vad::Silero(SileroConfig::default()));
        assert!(SileroConfig::default().denoise);
        let off = T::parse_from(["t", "--vad-denoise", "off", "--vad-threshold", "0.4"]).vad.vad();
        assert_eq!(off, Vad::Silero(SileroConfig { denoise: false, threshold: 0.4, ..SileroConfig::default() }));
        assert_eq!(T::parse_from(["t", "--vad-denoise=on"]).vad.vad(), Vad::Silero(SileroConfig::default()));
        assert!(T::try_parse_from(["t", "--vad-denoise", "maybe"]).is_err());
    }

    #[test]
    fn seconds_must_be_positive_and_finite() {
        assert_eq!(parse_seconds("2.5"), Ok(2.5));
        for bad in ["-5", "0", "NaN", "inf", "x"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }
}
