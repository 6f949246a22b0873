//! What the pipeline experiments (stride_table, calibrate) share: the bundled default inputs,
//! and loading engines and inputs once.

use anyhow::{bail, ensure, Context, Result};
use cadence::composite::FaceBox;
use cadence::pipeline::{DecoderKind, Engines, RenderOptions};
use cadence::{render, Backend, BackendChoice};
use cadence_engines::{DeviceRequest, EngineDevice};
use std::path::PathBuf;

/// The bundled clip: espeak-ng speech with pauses, 25.6 s (640 frames at 25 fps).
pub const DEFAULT_AUDIO: &str = "experiments/assets/newscast_25s6.wav";
/// The bundled 1080x1920 synthetic anchor portrait and its face box.
pub const DEFAULT_AVATAR: &str = "experiments/assets/anchor_1080x1920.png";
pub const DEFAULT_FACE: FaceBox = FaceBox { x: 284, y: 544, w: 512, h: 512 };

/// Command-line options common to the pipeline experiments.
#[derive(clap::Args, Clone, Debug)]
pub struct SessionArgs {
    /// Frames to render at 25 fps (default: the whole clip; the bundled one is 640 frames).
    #[arg(long)]
    pub frames: Option<usize>,
    /// Speech WAV (default: the bundled 25.6 s clip with pauses).
    #[arg(long)]
    pub audio: Option<PathBuf>,
    /// Portrait PNG/JPEG (default: the bundled 1080x1920 anchor).
    #[arg(long)]
    pub avatar: Option<PathBuf>,
    /// Face box x,y,w,h (default: 284,544,512,512 for the bundled anchor, else centred).
    #[arg(long)]
    pub face_box: Option<String>,
    /// Engine size: cpu-reduced (default on CPU with synthetic weights) or full (default on
    /// CUDA and with --models).
    #[arg(long)]
    pub profile: Option<String>,
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse_arg, help = cadence_engines::device::DEVICE_HELP)]
    pub device: DeviceRequest,
    #[arg(long, value_enum, default_value = "taesd")]
    pub decoder: DecoderKind,
    /// MuseTalk's models/ folder as downloaded (else $CADENCE_MODELS, else seeded synthetic
    /// weights); every engine must be found there.
    #[arg(long)]
    pub models: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// H.264 encoder: openh264, x264, nvenc, or none.
    #[arg(long, default_value = "openh264")]
    pub encoder: String,
    /// Engine batch size.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
}

pub struct Session {
    pub backend: Backend,
    /// Where the neural engines run (`--device`).
    pub engine_device: EngineDevice,
    pub engines: Engines,
    pub opts: RenderOptions,
    pub audio: cadence_media::Audio,
    pub audio_path: PathBuf,
    pub avatar_path: PathBuf,
    pub img: cadence_media::RgbImage,
    pub face: FaceBox,
    pub encoder: Option<cadence_media::EncoderKind>,
}

pub fn parse_box(s: &str) -> Result<FaceBox> {
    let v: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse())
        .collect::<std::result::Result<_, _>>()
        .context("--face-box: expected x,y,w,h")?;
    ensure!(v.len() == 4, "--face-box: expected x,y,w,h");
    Ok(FaceBox { x: v[0], y: v[1], w: v[2], h: v[3] })
}

pub fn parse_encoder(s: &str) -> Result<Option<cadence_media::EncoderKind>> {
    Ok(match s {
        "none" => None,
        "openh264" => Some(cadence_media::EncoderKind::OpenH264),
        "x264" => Some(cadence_media::EncoderKind::X264),
        "nvenc" => Some(cadence_media::EncoderKind::Nvenc),
        e => bail!("unknown encoder '{e}' (openh264, x264, nvenc or none)"),
    })
}

impl Session {
    pub fn open(a: &SessionArgs) -> Result<Session> {
        let root = crate::paths::workspace_root();
        let audio_path = a.audio.clone().unwrap_or_else(|| root.join(DEFAULT_AUDIO));
        let avatar_path = a.avatar.clone().unwrap_or_else(|| root.join(DEFAULT_AVATAR));
        let face = match (&a.face_box, &a.avatar) {
            (Some(s), _) => Some(parse_box(s)?),
            (None, None) => Some(DEFAULT_FACE),
            (None, Some(_)) => None,
        };
        ensure!(a.batch > 0, "--batch must be at least 1 (got 0)");
        let encoder = parse_encoder(&a.encoder)?;
        let engine_device = cadence_engines::select_device(a.device)?;
        let device = engine_device.device.clone();
        let backend = Backend::for_engines(a.backend, &device)?;
        let (models, profile) =
            cadence::pipeline::models_and_profile(a.models.as_deref(), a.profile.as_deref(), &device)?;
        let opts = RenderOptions { fps: 25.0, ramp: 4, batch: a.batch, method: cadence::Method::Slerp };
        let engines = Engines::load(profile, a.decoder, &device, models.as_ref())?;
        let mut audio = render::load_audio(&audio_path, 3600.0)?;
        if let Some(n) = a.frames {
            let keep = (n as f64 / opts.fps as f64 * cadence_media::TARGET_RATE as f64).round() as usize;
            ensure!(
                n > 0 && keep <= audio.samples_16k.len(),
                "--frames {n} is longer than the audio ({:.1} s)",
                audio.duration_s
            );
            audio.samples_16k.truncate(keep);
        }
        let img = render::load_avatar(&avatar_path)?;
        let face = render::face_box(&img, face)?;
        Ok(Session { backend, engine_device, engines, opts, audio, audio_path, avatar_path, img, face, encoder })
    }

    pub fn provenance(&self) -> crate::provenance::Provenance {
        let mut p = crate::provenance::Provenance::for_backend(
            &self.backend,
            self.engines.profile.to_string(),
            self.engines.weights_summary(),
        );
        p.note(crate::provenance::ENGINE_DEVICE_KEY, self.engine_device.label());
        p.note(
            crate::provenance::FRAMES_KEPT_IN_KEY,
            cadence::resident::residency(&self.backend, &self.engines.device).to_string(),
        );
        p.note("engines", self.engines.describe());
        p.note(
            "input",
            format!("{} + {} face box {:?}", self.audio_path.display(), self.avatar_path.display(), self.face),
        );
        p.note("output_frame", format!("{}x{} NV12", self.img.width(), self.img.height()));
        p
    }
}
