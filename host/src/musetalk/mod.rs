//! MUSETALK_DOC

pub mod avatar_file;
pub mod features;
pub mod frames;
pub mod live;
pub mod render;
pub mod schedule_args;

use crate::backend::elem::RgbRange;
pub use crate::musetalk::features::FrameFeatures;
use anyhow::{ensure, Context, Result};
use cadence_engines::{
    AudioEncoder, Batch, Device, Engine, ImageEncoder, KeyframeModel, LatentDecoder, ModelKind, ModelsDir,
    MuseTalkUnet, Profile, SdVae, Taesd, WeightsSource, WhisperAudio, DEFAULT_SEED,
};

pub use cadence_engines::{FACE_SIDE, LATENT_DIM};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum DecoderKind {
    /// TAESD (tiny autoencoder): fast, output in [0, 1].
    Taesd,
    /// The full SD VAE decoder (sd-vae-ft-mse), output in [-1, 1].
    SdVae,
}

impl DecoderKind {
    /// The decoder and the matching image encoder this choice loads.
    pub fn models(self) -> [ModelKind; 2] {
        match self {
            DecoderKind::Taesd => [ModelKind::TaesdDecoder, ModelKind::TaesdEncoder],
            DecoderKind::SdVae => [ModelKind::SdVaeDecoder, ModelKind::SdVaeEncoder],
        }
    }
}

/// How MuseTalk makes the frames between keyframes (`--infill`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MuseTalkInfill {
    /// SLERP of the keyframes' latents, eased toward the rest latent; the decoder runs on every
    /// frame that is not bypassed (the source's method).
    #[default]
    Latent,
    /// The decoder runs on keyframes only; the frames between are the SLERP of the decoded
    /// keyframe crops, eased toward the decoded rest crop (docs/infill.md).
    Image,
}

impl MuseTalkInfill {
    /// The name `--infill` takes.
    pub fn name(self) -> &'static str {
        match self {
            MuseTalkInfill::Latent => "latent",
            MuseTalkInfill::Image => "image",
        }
    }
}

/// The engines a render loads with `decoder` (what `cadence models check` checks by default).
pub fn render_models(decoder: DecoderKind) -> [ModelKind; 4] {
    let [dec, enc] = decoder.models();
    [ModelKind::WhisperTiny, ModelKind::MuseTalkUnet, dec, enc]
}

/// The engines of one render, loaded once.
pub struct Engines {
    pub audio: WhisperAudio,
    pub unet: MuseTalkUnet,
    pub decoder: Box<dyn LatentDecoder>,
    pub image_encoder: Box<dyn ImageEncoder>,
    pub decoder_kind: DecoderKind,
    pub profile: Profile,
    /// Where the engines run (and where a render keeps its frames).
    pub device: Device,
    /// The audio encoder's (1, window, features) for one 40 ms frame of zeros, what the rest
    /// latent is predicted from. Whisper pads every input to its 30 s window, so this costs as
    /// much as encoding a whole clip; it depends only on the engines, so it is part of loading.
    pub silence_window: Batch,
}

impl Engines {
    /// Every engine's weights come from `models` (an engine the folder lacks is an error, never
    /// a synthetic stand-in), or all are seeded synthetic weights when no folder was asked for
    /// (`--models`, [`crate::args::EngineArgs`]). `weights_summary` says which.
    pub fn load(
        profile: Profile,
        decoder_kind: DecoderKind,
        device: &Device,
        models: Option<&ModelsDir>,
    ) -> Result<Self> {
        let w = |kind: ModelKind| -> Result<WeightsSource> {
            Ok(match models {
                Some(dir) => dir.weights(kind)?,
                None => WeightsSource::Synthetic { seed: DEFAULT_SEED },
            })
        };
        let audio = WhisperAudio::new(profile, &w(ModelKind::WhisperTiny)?, device).context("loading whisper-tiny")?;
        let unet =
            MuseTalkUnet::new(profile, &w(ModelKind::MuseTalkUnet)?, device).context("loading the MuseTalk UNet")?;
        let [dec, enc] = decoder_kind.models();
        let (decoder, image_encoder): (Box<dyn LatentDecoder>, Box<dyn ImageEncoder>) = match decoder_kind {
            DecoderKind::Taesd => (
                Box::new(Taesd::decoder(profile, &w(dec)?, device).context("loading the TAESD decoder")?),
                Box::new(Taesd::encoder(profile, &w(enc)?, device).context("loading the TAESD encoder")?),
            ),
            DecoderKind::SdVae => (
                Box::new(SdVae::decoder(profile, &w(dec)?, device).context("loading the SD VAE decoder")?),
                Box::new(SdVae::encoder(profile, &w(enc)?, device).context("loading the SD VAE encoder")?),
            ),
        };
        let s = audio.encode_audio(&vec![0.0f32; 16000 / 25], 25.0).context("encoding one frame of silence")?;
        let silence_window = Batch::new(vec![1, s.shape[1], s.shape[2]], s.data[..s.shape[1] * s.shape[2]].to_vec())?;
        Ok(Self { audio, unet, decoder, image_encoder, decoder_kind, profile, device: device.clone(), silence_window })
    }

    fn all(&self) -> [&dyn Engine; 4] {
        [&self.audio, &self.unet, self.decoder.as_ref(), self.image_encoder.as_ref()]
    }

    /// The common label (e.g. `synthetic(seed=13295116)`) when every engine has the same source;
    /// `real: <engine>=<file>, ...` when all are real files; else `mixed: ...`.
    pub fn weights_summary(&self) -> String {
        let labels: Vec<String> = self.all().iter().map(|e| e.weights_label()).collect();
        if labels.iter().all(|l| l == &labels[0]) {
            labels[0].clone()
        } else if labels.iter().all(|l| l.starts_with("real")) {
            let parts: Vec<String> = self
                .all()
                .iter()
                .map(|e| {
                    let l = e.weights_label();
                    let file = l.strip_prefix("real(").and_then(|f| f.strip_suffix(')')).unwrap_or(&l).to_string();
                    format!("{}={file}", e.model())
                })
                .collect();
            format!("real: {}", parts.join(", "))
        } else {
            let parts: Vec<String> =
                self.all().iter().map(|e| format!("{}={}", e.model(), e.weights_label())).collect();
            format!("mixed: {}", parts.join(", "))
        }
    }

    pub fn describe(&self) -> String {
        format!("{} + {} + {} (f32)", self.audio.describe(), self.unet.describe(), self.decoder.describe())
    }

    pub fn decoder_range(&self) -> RgbRange {
        if self.decoder.output_range().0 < 0.0 {
            RgbRange::Signed
        } else {
            RgbRange::Unit
        }
    }
}

/// One avatar frame's latents, computed once per avatar (a still image has one frame, a video
/// avatar one per frame: output frame k uses avatar frame [`crate::avatar::cycle_index`]`(k, frames)`).
pub struct AvatarLatents {
    /// The full face crop encoded.
    pub reference: Vec<f32>,
    /// The crop with its lower half blacked out (MuseTalk's inpainting mask), encoded.
    pub masked: Vec<f32>,
    /// The engine's output for silence: the closed-mouth rest state easing blends toward.
    pub rest: Vec<f32>,
    /// `rest` decoded: reused for every bypassed frame.
    pub rest_rgb: Vec<f32>,
}

/// `face`: planar 3 x 256 x 256 in [0, 1].
pub fn prepare_avatar(engines: &Engines, face: &[f32]) -> Result<AvatarLatents> {
    ensure!(face.len() == 3 * FACE_SIDE * FACE_SIDE, "face crop must be 3x{FACE_SIDE}x{FACE_SIDE}");
    let (lo, hi) = engines.image_encoder.input_range();
    let to_range = |v: f32| lo + (hi - lo) * v;
    let mut both: Vec<f32> = face.iter().map(|&v| to_range(v)).collect();
    let mut masked = both.clone();
    for c in 0..3 {
        masked[c * FACE_SIDE * FACE_SIDE + (FACE_SIDE / 2) * FACE_SIDE..(c + 1) * FACE_SIDE * FACE_SIDE]
            .fill(to_range(0.0));
    }
    both.extend_from_slice(&masked);
    let enc = engines.image_encoder.encode(&Batch::new(vec![2, 3, FACE_SIDE, FACE_SIDE], both)?)?;
    ensure!(enc.data.len() == 2 * LATENT_DIM, "image encoder returned shape {:?}", enc.shape);
    let (reference, masked) = (enc.data[..LATENT_DIM].to_vec(), enc.data[LATENT_DIM..].to_vec());
    // Rest state: the UNet's answer to silence (one 40 ms frame of zeros).
    let rest = engines.unet.predict(&unet_input(&masked, &reference, 1), &engines.silence_window)?.data;
    let rest_rgb = engines.decoder.decode(&Batch::new(vec![1, 4, 32, 32], rest.clone())?)?.data;
    Ok(AvatarLatents { reference, masked, rest, rest_rgb })
}

fn unet_input(masked: &[f32], reference: &[f32], batch: usize) -> Batch {
    let mut data = Vec::with_capacity(batch * 2 * LATENT_DIM);
    for _ in 0..batch {
        data.extend_from_slice(masked);
        data.extend_from_slice(reference);
    }
    Batch { shape: vec![batch, 8, 32, 32], data }
}
