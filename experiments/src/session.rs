//! What the pipeline experiments (stride_table, calibrate) share: the bundled default inputs,
//! and loading engines and inputs once.

use anyhow::{ensure, Result};
use cadence::args::{EncoderArg, EngineArgs};
use cadence::avatar::parse_face_box;
use cadence::backend::composite::FaceBox;
use cadence::frame_loop::RenderOptions;
use cadence::musetalk::Engines;
use cadence::{Backend, BackendChoice};
use cadence_engines::EngineDevice;
use std::path::PathBuf;

/// The bundled clip: espeak-ng speech with pauses, 25.6 s (640 frames at 25 fps).
pub const DEFAULT_AUDIO: &str = "experiments/assets/newscast_25s6.wav";
/// The bundled 1080x1920 synthetic anchor portrait and its face box.
pub const DEFAULT_AVATAR: &str = "experiments/assets/anchor_1080x1920.png";
pub const DEFAULT_FACE: FaceBox = FaceBox { x: 284, y: 544, w: 512, h: 512 };

/// Command-line options common to the pipeline experiments (the engine, encoder and face-box
/// options are `cadence render`'s own, from [`cadence::args`]).
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
    #[arg(long, value_parser = parse_face_box)]
    pub face_box: Option<FaceBox>,
    #[command(flatten)]
    pub vad: cadence::args::VadArgs,
    #[command(flatten)]
    pub engines: EngineArgs,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// H.264 encoder.
    #[arg(long, value_enum, default_value = "openh264")]
    pub encoder: EncoderArg,
    /// Time everything but the video encoder, and write no video.
    #[arg(long)]
    pub no_encoder: bool,
}

pub struct Session {
    /// Everything but the engines (and, through `Deref`, its fields: `session.audio`, ...).
    pub inputs: Inputs,
    pub engines: Engines,
}

impl std::ops::Deref for Session {
    type Target = Inputs;
    fn deref(&self) -> &Inputs {
        &self.inputs
    }
}

impl std::ops::DerefMut for Session {
    fn deref_mut(&mut self) -> &mut Inputs {
        &mut self.inputs
    }
}

/// A session's inputs without the MuseTalk engines (what an experiment on another engine
/// family, e.g. `stride_table --engine ditto`, needs).
pub struct Inputs {
    pub backend: Backend,
    pub engine_device: EngineDevice,
    pub profile: cadence_engines::Profile,
    pub opts: RenderOptions,
    pub audio: cadence_media::Audio,
    pub audio_path: PathBuf,
    pub avatar_path: PathBuf,
    pub img: cadence_media::RgbImage,
    pub face: FaceBox,
    pub encoder: Option<cadence_media::EncoderKind>,
}

impl Inputs {
    pub fn open(a: &SessionArgs) -> Result<Inputs> {
        let root = crate::paths::workspace_root();
        let audio_path = a.audio.clone().unwrap_or_else(|| root.join(DEFAULT_AUDIO));
        let avatar_path = a.avatar.clone().unwrap_or_else(|| root.join(DEFAULT_AVATAR));
        let face = match (a.face_box, &a.avatar) {
            (Some(b), _) => Some(b),
            (None, None) => Some(DEFAULT_FACE),
            (None, Some(_)) => None,
        };
        let encoder = if a.no_encoder { None } else { Some(a.encoder.available()?) };
        let (engine_device, profile) = a.engines.device()?;
        let backend = Backend::for_engines(a.backend, &engine_device.device)?;
        let opts = RenderOptions { batch: a.engines.batch as usize, vad: a.vad.vad(), ..RenderOptions::default() };
        let mut audio = cadence::frame_loop::audio::load_audio(&audio_path, 3600.0)?;
        if let Some(n) = a.frames {
            let keep = (n as f64 / opts.fps.hz() * cadence_media::TARGET_RATE as f64).round() as usize;
            ensure!(
                n > 0 && keep <= audio.samples_16k.len(),
                "--frames {n} is longer than the audio ({:.1} s)",
                audio.duration_s
            );
            audio.samples_16k.truncate(keep);
        }
        let img = cadence::avatar::load_avatar(&avatar_path)?;
        let face = cadence::avatar::face_box(&img, face)?;
        Ok(Inputs { backend, engine_device, profile, opts, audio, audio_path, avatar_path, img, face, encoder })
    }

    /// The provenance of a run on these inputs with engines described by `engines` and weights
    /// `weights`.
    pub fn provenance(&self, engines: &str, weights: &str) -> crate::provenance::Provenance {
        let mut p = crate::provenance::Provenance::for_backend(&self.backend, self.profile.to_string(), weights);
        p.note(crate::provenance::ENGINE_DEVICE_KEY, self.engine_device.label());
        p.note("engines", engines.to_string());
        p.note("cpu_loops", cadence_engines::isa::describe());
        p.note("vad", self.opts.vad.name());
        input_notes(&mut p, &self.audio_path, &self.avatar_path, self.face, &self.img);
        p
    }
}

/// The provenance notes that say what was rendered.
fn input_notes(
    p: &mut crate::provenance::Provenance,
    audio: &std::path::Path,
    avatar: &std::path::Path,
    face: FaceBox,
    img: &cadence_media::RgbImage,
) {
    p.note("input", format!("{} + {} face box {:?}", audio.display(), avatar.display(), face));
    p.note("output_frame", format!("{}x{} NV12", img.width(), img.height()));
}

impl Session {
    pub fn open(a: &SessionArgs) -> Result<Session> {
        let inputs = Inputs::open(a)?;
        let engines = a.engines.load(&inputs.engine_device, inputs.profile)?;
        Ok(Session { inputs, engines })
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
            cadence::backend::resident::residency(&self.backend, &self.engines.device).to_string(),
        );
        p.note("engines", self.engines.describe());
        p.note("cpu_loops", cadence_engines::isa::describe());
        p.note("vad", self.opts.vad.name());
        input_notes(&mut p, &self.audio_path, &self.avatar_path, self.face, &self.img);
        p
    }
}

/// `synthetic`, `real` or `mixed`, from an engines' weights summary (`synthetic(seed=..)` /
/// `real(<file>)` per engine): what an experiment's caveat line says about its numbers.
pub fn weights_kind(summary: &str) -> &'static str {
    if summary.starts_with("synthetic") {
        "synthetic"
    } else if summary.starts_with("real") {
        "real"
    } else {
        "mixed"
    }
}
