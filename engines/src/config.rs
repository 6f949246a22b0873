//! Model configurations read from the files that come with the weights, checked against the
//! architecture cadence implements.
//!
//! | engine | configuration | where |
//! |---|---|---|
//! | MuseTalk UNet | diffusers `UNet2DConditionModel` config | `musetalk.json` beside the weights |
//! | SD VAE | diffusers `AutoencoderKL` config | `config.json` beside `diffusion_pytorch_model.*` |
//! | whisper-tiny | Hugging Face `WhisperConfig` | `config.json` beside `pytorch_model.bin` / `model.safetensors` |
//! | whisper-tiny | openai-whisper `ModelDimensions` | `dims` inside `tiny.pt` |
//! | TAESD | none (the architecture is fixed; the tensor shapes are checked) | |
//!
//! Every field that changes the computation is compared with what cadence implements (for an
//! absent field, with the library's default); a difference is an error naming the field, its
//! value and cadence's. The diffusers configs must not carry fields cadence does not know (a
//! newer option could change the network); the whisper config is checked on its encoder fields
//! only (the rest describe the text decoder and generation, which cadence does not run). A
//! weights file with no configuration beside it is taken as the published architecture, which
//! its tensor shapes then have to match.

use crate::checkpoint::{Checkpoint, Scalar};
use crate::error::{EngineError, Result};
use crate::{sd_vae, unet, whisper, ModelKind, Profile};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Where a model's configuration came from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ConfigInfo {
    /// `musetalkV15/musetalk.json`, `dims inside tiny.pt`, ...
    pub source: String,
    /// Fields compared with cadence's architecture.
    pub fields_checked: usize,
}

/// The configuration file that describes a weights file, if there is one (one rule for every
/// caller: MuseTalk keeps `musetalk.json` beside its UNet weights; diffusers and transformers
/// keep `config.json` beside `diffusion_pytorch_model.*` and `pytorch_model.bin` /
/// `model.safetensors`).
pub fn config_file(kind: ModelKind, weights: &Path) -> Option<PathBuf> {
    let dir = weights.parent()?;
    let name = weights.file_name()?.to_str()?;
    let cfg = match kind {
        ModelKind::MuseTalkUnet => dir.join("musetalk.json"),
        ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder if name.starts_with("diffusion_pytorch_model.") => {
            dir.join("config.json")
        }
        ModelKind::WhisperTiny if name == "pytorch_model.bin" || name == "model.safetensors" => dir.join("config.json"),
        _ => return None,
    };
    cfg.is_file().then_some(cfg)
}

/// What a field must be.
struct Rule {
    field: &'static str,
    /// cadence's value.
    expected: Value,
    /// The library's default when the field is absent (`None`: the field is required).
    default: Option<Value>,
}

fn rule(field: &'static str, expected: Value, default: Value) -> Rule {
    Rule { field, expected, default: Some(default) }
}

/// Checks the configuration of the weights at `weights` (whose headers are `ck`) against the
/// architecture cadence builds for `kind` at `profile` (the published one at `Profile::Full`).
/// `Ok(None)`: no configuration (the tensors alone decide).
pub fn check(kind: ModelKind, profile: Profile, weights: &Path, ck: &Checkpoint) -> Result<Option<ConfigInfo>> {
    if let Some(path) = config_file(kind, weights) {
        let text = std::fs::read_to_string(&path).map_err(|error| EngineError::Io { path: path.clone(), error })?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| EngineError::Config { file: path.clone(), msg: format!("not valid JSON: {e}") })?;
        let fail = |msg: String| EngineError::Config { file: path.clone(), msg };
        let obj = json.as_object().ok_or_else(|| fail("not a JSON object".into()))?;
        let (rules, known_only) = match kind {
            ModelKind::MuseTalkUnet => (unet_rules(profile), true),
            ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => (vae_rules(profile), true),
            ModelKind::WhisperTiny => (whisper_hf_rules(profile), false),
            _ => return Ok(None),
        };
        apply(&rules, |f| obj.get(f).cloned(), &fail)?;
        if known_only {
            if let Some(unknown) = obj.keys().find(|k| !k.starts_with('_') && !rules.iter().any(|r| r.field == *k)) {
                if !ignored_field(kind, unknown) {
                    return Err(fail(format!(
                        "field `{unknown}` is not one cadence knows; refusing rather than guessing what it changes"
                    )));
                }
            }
        }
        return Ok(Some(ConfigInfo { source: path.display().to_string(), fields_checked: rules.len() }));
    }
    // openai-whisper checkpoints carry their `ModelDimensions` as `dims`.
    if kind == ModelKind::WhisperTiny && ck.scalars.iter().any(|(k, _)| k.starts_with("dims.")) {
        let rules = whisper_dims_rules(profile);
        let fail = |msg: String| EngineError::Config { file: weights.to_path_buf(), msg: format!("dims: {msg}") };
        apply(
            &rules,
            |f| {
                ck.scalar(&format!("dims.{f}")).map(|s| match s {
                    Scalar::Int(i) => json!(i),
                    Scalar::Float(x) => json!(x),
                    Scalar::Bool(b) => json!(b),
                    Scalar::Str(s) => json!(s),
                })
            },
            &fail,
        )?;
        return Ok(Some(ConfigInfo {
            source: format!("dims inside {}", weights.display()),
            fields_checked: rules.len(),
        }));
    }
    Ok(None)
}

fn apply(rules: &[Rule], get: impl Fn(&str) -> Option<Value>, fail: &dyn Fn(String) -> EngineError) -> Result<()> {
    for r in rules {
        let (found, absent) = match get(r.field) {
            Some(v) => (v, false),
            None => match &r.default {
                Some(d) => (d.clone(), true),
                None => return Err(fail(format!("`{}` is missing; cadence implements {}", r.field, r.expected))),
            },
        };
        if !json_eq(&found, &r.expected) {
            let how = if absent { format!("absent (default {found})") } else { format!("{found}") };
            return Err(fail(format!("`{}` is {how}; cadence implements {}", r.field, r.expected)));
        }
    }
    Ok(())
}

/// JSON equality with numbers compared as numbers (`1` equals `1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q)),
        _ => a == b,
    }
}

/// Fields that do not change what cadence computes: the training resolution, dropout (off at
/// inference), attention upcasting (cadence computes in f32 throughout), VAE fp16 advice.
fn ignored_field(kind: ModelKind, field: &str) -> bool {
    match kind {
        ModelKind::MuseTalkUnet => matches!(field, "sample_size" | "dropout" | "upcast_attention"),
        ModelKind::SdVaeDecoder | ModelKind::SdVaeEncoder => matches!(field, "sample_size" | "force_upcast"),
        _ => false,
    }
}

/// MuseTalk's UNet as cadence builds it ([`unet::config`]), in diffusers' field names, with
/// diffusers' defaults for absent fields.
fn unet_rules(profile: Profile) -> Vec<Rule> {
    let c = unet::config(profile);
    let channels: Vec<usize> = c.blocks.iter().map(|b| b.out_channels).collect();
    let down: Vec<&str> = c
        .blocks
        .iter()
        .map(|b| if b.use_cross_attn.is_some() { "CrossAttnDownBlock2D" } else { "DownBlock2D" })
        .collect();
    let up: Vec<&str> = c
        .blocks
        .iter()
        .rev()
        .map(|b| if b.use_cross_attn.is_some() { "CrossAttnUpBlock2D" } else { "UpBlock2D" })
        .collect();
    let heads = c.blocks[0].attention_head_dim;
    let null = Value::Null;
    vec![
        rule("in_channels", json!(unet::IN_CHANNELS), json!(4)),
        rule("out_channels", json!(unet::OUT_CHANNELS), json!(4)),
        rule("block_out_channels", json!(channels), json!([320, 640, 1280, 1280])),
        rule(
            "down_block_types",
            json!(down),
            json!(["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"]),
        ),
        rule(
            "up_block_types",
            json!(up),
            json!(["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]),
        ),
        rule("layers_per_block", json!(c.layers_per_block), json!(2)),
        rule("attention_head_dim", json!(heads), json!(8)),
        rule("num_attention_heads", null.clone(), null.clone()),
        rule("cross_attention_dim", json!(c.cross_attention_dim), json!(1280)),
        rule("norm_num_groups", json!(c.norm_num_groups), json!(32)),
        rule("norm_eps", json!(c.norm_eps), json!(1e-5)),
        rule("act_fn", json!("silu"), json!("silu")),
        rule("center_input_sample", json!(c.center_input_sample), json!(false)),
        rule("flip_sin_to_cos", json!(c.flip_sin_to_cos), json!(true)),
        rule("freq_shift", json!(c.freq_shift), json!(0)),
        rule("downsample_padding", json!(c.downsample_padding), json!(1)),
        rule("mid_block_scale_factor", json!(c.mid_block_scale_factor), json!(1)),
        rule("use_linear_projection", json!(c.use_linear_projection), json!(false)),
        rule("only_cross_attention", json!(false), json!(false)),
        rule("dual_cross_attention", json!(false), json!(false)),
        rule("mid_block_type", json!("UNetMidBlock2DCrossAttn"), json!("UNetMidBlock2DCrossAttn")),
        rule("transformer_layers_per_block", json!(1), json!(1)),
        rule("reverse_transformer_layers_per_block", null.clone(), null.clone()),
        rule("conv_in_kernel", json!(3), json!(3)),
        rule("conv_out_kernel", json!(3), json!(3)),
        rule("time_embedding_type", json!("positional"), json!("positional")),
        rule("time_embedding_dim", null.clone(), null.clone()),
        rule("time_embedding_act_fn", null.clone(), null.clone()),
        rule("timestep_post_act", null.clone(), null.clone()),
        rule("time_cond_proj_dim", null.clone(), null.clone()),
        rule("resnet_time_scale_shift", json!("default"), json!("default")),
        rule("resnet_skip_time_act", json!(false), json!(false)),
        rule("resnet_out_scale_factor", json!(1.0), json!(1.0)),
        rule("class_embed_type", null.clone(), null.clone()),
        rule("num_class_embeds", null.clone(), null.clone()),
        rule("class_embeddings_concat", json!(false), json!(false)),
        rule("projection_class_embeddings_input_dim", null.clone(), null.clone()),
        rule("addition_embed_type", null.clone(), null.clone()),
        rule("addition_time_embed_dim", null.clone(), null.clone()),
        // Used only with an addition embedding, which must be absent (above).
        rule("addition_embed_type_num_heads", json!(64), json!(64)),
        rule("encoder_hid_dim", null.clone(), null.clone()),
        rule("encoder_hid_dim_type", null.clone(), null.clone()),
        rule("mid_block_only_cross_attention", null.clone(), null.clone()),
        rule("cross_attention_norm", null.clone(), null.clone()),
        rule("attention_type", json!("default"), json!("default")),
    ]
}

/// sd-vae-ft-mse as cadence builds it ([`sd_vae::config`]).
fn vae_rules(profile: Profile) -> Vec<Rule> {
    let c = sd_vae::config(profile);
    let n = c.block_out_channels.len();
    let null = Value::Null;
    vec![
        rule("in_channels", json!(sd_vae::IMAGE_CHANNELS), json!(3)),
        rule("out_channels", json!(sd_vae::IMAGE_CHANNELS), json!(3)),
        rule("block_out_channels", json!(c.block_out_channels), json!([64])),
        rule("down_block_types", json!(vec!["DownEncoderBlock2D"; n]), json!(["DownEncoderBlock2D"])),
        rule("up_block_types", json!(vec!["UpDecoderBlock2D"; n]), json!(["UpDecoderBlock2D"])),
        rule("layers_per_block", json!(c.layers_per_block), json!(1)),
        rule("latent_channels", json!(c.latent_channels), json!(4)),
        rule("norm_num_groups", json!(c.norm_num_groups), json!(32)),
        rule("act_fn", json!("silu"), json!("silu")),
        rule("scaling_factor", json!(sd_vae::SCALING_FACTOR), json!(0.18215)),
        rule("shift_factor", null.clone(), null.clone()),
        rule("latents_mean", null.clone(), null.clone()),
        rule("latents_std", null.clone(), null.clone()),
        rule("use_quant_conv", json!(c.use_quant_conv), json!(true)),
        rule("use_post_quant_conv", json!(c.use_post_quant_conv), json!(true)),
        rule("mid_block_add_attention", json!(true), json!(true)),
    ]
}

/// whisper-tiny's encoder in `WhisperConfig` names (transformers' defaults for absent fields), at
/// the widths of `profile` ([`whisper::d_model`]).
fn whisper_hf_rules(profile: Profile) -> Vec<Rule> {
    let d = whisper::d_model(profile);
    vec![
        Rule { field: "model_type", expected: json!("whisper"), default: None },
        rule("d_model", json!(d), json!(384)),
        rule("encoder_layers", json!(whisper::N_LAYERS), json!(4)),
        rule("encoder_attention_heads", json!(whisper::n_heads(profile)), json!(6)),
        rule("encoder_ffn_dim", json!(4 * d), json!(1536)),
        rule("num_mel_bins", json!(whisper::N_MELS), json!(80)),
        rule("max_source_positions", json!(whisper::WINDOW_FRAMES / 2), json!(1500)),
        rule("activation_function", json!("gelu"), json!("gelu")),
        rule("scale_embedding", json!(false), json!(false)),
    ]
}

/// whisper-tiny's encoder in openai-whisper's `ModelDimensions` (all fields required there).
fn whisper_dims_rules(profile: Profile) -> Vec<Rule> {
    let req = |field, expected| Rule { field, expected, default: None };
    vec![
        req("n_mels", json!(whisper::N_MELS)),
        req("n_audio_ctx", json!(whisper::WINDOW_FRAMES / 2)),
        req("n_audio_state", json!(whisper::d_model(profile))),
        req("n_audio_head", json!(whisper::n_heads(profile))),
        req("n_audio_layer", json!(whisper::N_LAYERS)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_as_numbers() {
        assert!(json_eq(&json!(1), &json!(1.0)));
        assert!(json_eq(&json!([320, 640]), &json!([320.0, 640])));
        assert!(!json_eq(&json!(1e-5), &json!(1e-6)));
        assert!(!json_eq(&json!("silu"), &json!("gelu")));
    }
}
