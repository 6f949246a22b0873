//! A models folder as users have it: MuseTalk's `models/` as its download script lays it out
//! (plus TAESD's two files), or cadence's flat folder of safetensors files. One code path finds
//! each engine's weights in it ([`ModelsDir::weights`]) and checks them without loading
//! ([`ModelsDir::check`], `cadence models check`).
//!
//! Where each engine's weights are looked for, first match wins ([`candidates`]):
//!
//! | engine | paths under the folder |
//! |---|---|
//! | musetalk-unet | `musetalkV15/unet.pth` (MuseTalk 1.5), `musetalk/pytorch_model.bin` (1.0), `musetalk_unet.safetensors` |
//! | sd-vae-decoder, sd-vae-encoder | `sd-vae/diffusion_pytorch_model.{safetensors,bin}`, the same under `sd-vae-ft-mse/` (MuseTalk's first README), `sd_vae_ft_mse.safetensors` |
//! | whisper-tiny | `whisper/model.safetensors`, `whisper/pytorch_model.bin` (Hugging Face `openai/whisper-tiny`), `whisper/tiny.pt` (openai-whisper), `whisper_tiny.safetensors` |
//! | taesd-decoder | `taesd/taesd_decoder.{safetensors,pth}`, `taesd_decoder.{pth,safetensors}` |
//! | taesd-encoder | `taesd/taesd_encoder.{safetensors,pth}`, `taesd_encoder.{pth,safetensors}` |
//!
//! MuseTalk 1.5 is preferred when both UNets are present (MuseTalk's own default, `--version
//! v15`). The configuration beside each file is read and checked ([`crate::config`]).

use crate::checkpoint::WeightsFile;
use crate::error::{EngineError, Result};
use crate::weights::TableMatch;
use crate::{config, param_table, sd_vae, taesd, unet, whisper, ModelKind, Profile, WeightsSource};
use std::path::{Path, PathBuf};

/// Every engine cadence has, in the order `models check` lists them.
pub const ALL_MODELS: [ModelKind; 6] = [
    ModelKind::WhisperTiny,
    ModelKind::MuseTalkUnet,
    ModelKind::TaesdDecoder,
    ModelKind::TaesdEncoder,
    ModelKind::SdVaeDecoder,
    ModelKind::SdVaeEncoder,
];

/// Relative paths where `kind`'s weights are looked for, in order (see the module docs). The
/// last is cadence's flat name, [`ModelKind::file_name`].
pub fn candidates(kind: ModelKind) -> Vec<String> {
    let mut v: Vec<String> = match kind {
        ModelKind::MuseTalkUnet => vec!["musetalkV15/unet.pth".into(), "musetalk/pytorch_model.bin".into()],
        ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => ["sd-vae", "sd-vae-ft-mse"]
            .iter()
            .flat_map(|d| ["safetensors", "bin"].map(|e| format!("{d}/diffusion_pytorch_model.{e}")))
            .collect(),
        ModelKind::WhisperTiny => {
            vec!["whisper/model.safetensors".into(), "whisper/pytorch_model.bin".into(), "whisper/tiny.pt".into()]
        }
        ModelKind::TaesdDecoder | ModelKind::TaesdEncoder => {
            let stem = if kind == ModelKind::TaesdDecoder { "taesd_decoder" } else { "taesd_encoder" };
            vec![format!("taesd/{stem}.safetensors"), format!("taesd/{stem}.pth"), format!("{stem}.pth")]
        }
    };
    v.push(kind.file_name().to_string());
    v
}

/// A models folder that exists and holds at least one weights file cadence reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelsDir {
    root: PathBuf,
}

impl ModelsDir {
    /// Opens `root`: an error if it does not exist, is not a folder, or holds none of the files
    /// of [`candidates`] (so a mistyped `--models` never falls back to synthetic weights).
    pub fn open(root: &Path) -> Result<ModelsDir> {
        let fail = |msg: String| EngineError::Models { dir: root.to_path_buf(), msg };
        let meta = std::fs::metadata(root).map_err(|e| fail(format!("cannot be read: {e}")))?;
        if !meta.is_dir() {
            return Err(fail("is not a folder".into()));
        }
        let dir = ModelsDir { root: root.to_path_buf() };
        if ALL_MODELS.iter().all(|&k| dir.find(k).is_none()) {
            return Err(fail(format!(
                "holds no weights cadence reads (MuseTalk's models/ layout: {}, ...; see README \"Using real weights\")",
                ["musetalkV15/unet.pth", "sd-vae/diffusion_pytorch_model.bin", "whisper/pytorch_model.bin"].join(", ")
            )));
        }
        Ok(dir)
    }

    /// The models folder a command was asked for: `explicit` (`--models`), else
    /// `$CADENCE_MODELS` when set and not empty, else none (synthetic weights).
    pub fn requested(explicit: Option<&Path>) -> Result<Option<ModelsDir>> {
        let env = std::env::var_os(crate::MODELS_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
        match explicit.map(Path::to_path_buf).or(env) {
            Some(dir) => ModelsDir::open(&dir).map(Some),
            None => Ok(None),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The first existing candidate file for `kind`.
    pub fn find(&self, kind: ModelKind) -> Option<PathBuf> {
        candidates(kind).into_iter().map(|c| self.root.join(c)).find(|p| p.is_file())
    }

    /// `kind`'s weights in this folder; an error naming the paths looked at when there are none
    /// (an engine asked for from a models folder never gets synthetic weights).
    pub fn weights(&self, kind: ModelKind) -> Result<WeightsSource> {
        self.find(kind).map(WeightsSource::File).ok_or_else(|| EngineError::Models {
            dir: self.root.clone(),
            msg: format!("no weights for {kind} (looked for {})", candidates(kind).join(", ")),
        })
    }

    /// Checks `kind`'s weights in this folder without loading them, against the architecture
    /// cadence builds at `profile` (`Profile::Full` for real weights).
    pub fn check(&self, kind: ModelKind, profile: Profile) -> EngineCheck {
        match self.find(kind) {
            Some(p) => check_file(kind, profile, &p),
            None => EngineCheck {
                error: Some(format!("not found (looked for {})", candidates(kind).join(", "))),
                ..EngineCheck::empty(kind, profile)
            },
        }
    }
}

/// What `models check` reports for one engine.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EngineCheck {
    pub model: String,
    /// The weights file (`None` when not found).
    pub file: Option<PathBuf>,
    /// `safetensors`, `PyTorch zip`, `PyTorch legacy`.
    pub format: Option<String>,
    /// The configuration read and checked (`None`: none beside the file, or refused).
    pub config: Option<config::ConfigInfo>,
    /// Why the configuration was refused (the field, its value and cadence's).
    pub config_error: Option<String>,
    /// The network cadence builds from this file.
    pub architecture: String,
    /// Parameters the architecture has (its whole table: both halves for the SD VAE).
    pub params_expected: usize,
    /// Parameters in the file's tensors that the architecture uses.
    pub params_matched: usize,
    /// Tensors in the file.
    pub tensors_in_file: usize,
    /// Expected tensors the file lacks: `name [shape]`.
    pub missing: Vec<String>,
    /// `name: [file shape] in the file, expected [shape]`.
    pub misshaped: Vec<String>,
    /// Expected tensors stored as integers or booleans: `name: dtype`.
    pub not_float: Vec<String>,
    /// File tensors the architecture does not use (not an error).
    pub extra: Vec<String>,
    /// File tensors the engine drops on purpose (whisper's text decoder).
    pub ignored: usize,
    /// Why the weights cannot load when it is neither the configuration nor a tensor: not
    /// found, unreadable.
    pub error: Option<String>,
}

impl EngineCheck {
    fn empty(kind: ModelKind, profile: Profile) -> EngineCheck {
        EngineCheck {
            model: kind.name().to_string(),
            file: None,
            format: None,
            config: None,
            config_error: None,
            architecture: architecture(kind, profile),
            params_expected: param_table(kind, profile).map(|t| t.num_params()).unwrap_or(0),
            params_matched: 0,
            tensors_in_file: 0,
            missing: vec![],
            misshaped: vec![],
            not_float: vec![],
            extra: vec![],
            ignored: 0,
            error: None,
        }
    }

    /// Whether the engine would load from this file.
    pub fn loads(&self) -> bool {
        self.error.is_none()
            && self.config_error.is_none()
            && self.file.is_some()
            && self.missing.is_empty()
            && self.misshaped.is_empty()
            && self.not_float.is_empty()
    }
}

/// Checks one weights file for `kind` against the architecture cadence builds at `profile`
/// (`Profile::Full` for real weights): format, configuration, every expected tensor's presence,
/// shape and dtype. Reads headers only: this is what loading checks before it reads any data.
pub fn check_file(kind: ModelKind, profile: Profile, path: &Path) -> EngineCheck {
    let mut c = EngineCheck { file: Some(path.to_path_buf()), ..EngineCheck::empty(kind, profile) };
    if let Err(e) = fill(kind, profile, path, &mut c) {
        c.error = Some(e.to_string());
    }
    c
}

fn fill(kind: ModelKind, profile: Profile, path: &Path, c: &mut EngineCheck) -> Result<()> {
    let file = WeightsFile::open(path)?;
    let ck = &file.checkpoint;
    c.format = Some(ck.format.to_string());
    c.tensors_in_file = ck.tensors.len();
    // A refused configuration is reported with the tensors' state, not instead of it.
    match config::check(kind, profile, path, ck) {
        Ok(info) => c.config = info,
        Err(e) => c.config_error = Some(e.to_string()),
    }
    let table = param_table(kind, profile)?;
    let m = TableMatch::new(ck, &table, &crate::normalizer(kind))?;
    c.params_matched = m.matched_params(ck);
    c.missing = m.missing(&table);
    c.misshaped = m.misshaped(&table, ck);
    c.not_float = m.not_float(ck);
    c.extra = m.extra.clone();
    c.ignored = m.ignored;
    Ok(())
}

/// The network cadence builds for `kind` at `profile`, in words.
pub fn architecture(kind: ModelKind, profile: Profile) -> String {
    match kind {
        ModelKind::TaesdDecoder | ModelKind::TaesdEncoder => format!(
            "TAESD {} ({} channels, 4 latent channels)",
            if kind == ModelKind::TaesdDecoder { "decoder" } else { "encoder" },
            taesd::channels(profile)
        ),
        ModelKind::MuseTalkUnet => format!(
            "MuseTalk UNet (diffusers UNet2DConditionModel: in {}, out {}, blocks {:?}, attention heads {}, cross-attention {})",
            unet::IN_CHANNELS,
            unet::OUT_CHANNELS,
            unet::block_channels(profile),
            unet::attention_heads(profile),
            unet::audio_dim(profile)
        ),
        ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => {
            let c = sd_vae::config(profile);
            format!(
                "SD VAE {} (AutoencoderKL: blocks {:?}, {} latent channels; the file holds both halves)",
                if kind == ModelKind::SdVaeDecoder { "decoder" } else { "encoder" },
                c.block_out_channels,
                c.latent_channels
            )
        }
        ModelKind::WhisperTiny => format!(
            "whisper-tiny encoder (d={}, {} layers, {} heads, {} mel bins)",
            whisper::d_model(profile),
            whisper::N_LAYERS,
            whisper::n_heads(profile),
            whisper::N_MELS
        ),
    }
}
