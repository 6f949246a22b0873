//! PyTorch checkpoints (`.pth`/`.bin`/`.pt`, zip and legacy formats) read without Python, and
//! MuseTalk's `models/` folder as its download script lays it out.
//!
//! Two independent writers feed these tests: `tests/fixtures/tiny_{zip,legacy}.pth`, written by
//! CPython's own pickler (`tests/fixtures/make_torch_fixtures.py`, standard library only), whose
//! values are recomputed here; and `cadence_engines::torch_write`, which writes whole engine
//! state dicts that must load exactly like the same tensors from safetensors.

use cadence_engines::bench::test_input;
use cadence_engines::checkpoint::{inspect_bytes, Checkpoint, Format, Scalar, WeightsFile};
use cadence_engines::models_dir::{candidates, ALL_MODELS};
use cadence_engines::torch_write::{
    legacy_checkpoint, state_dict_pickle, write_musetalk_folder, zip_archive, zip_checkpoint, Entry, StateDict, Storage,
};
use cadence_engines::*;
use candle_core::{DType, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A test's own scratch folder, removed when the test ends.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new() -> Scratch {
        Scratch(tempfile::tempdir().unwrap())
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The synthetic tensors of `kind` at the reduced profile, as a map.
fn synthetic(kind: ModelKind, seed: u64) -> HashMap<String, Tensor> {
    synthetic_weights(kind, Profile::Cpu, seed).unwrap()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// `(dtype, shape, values)` of one tensor of an open file.
fn read(w: &mut WeightsFile, name: &str) -> (String, Vec<usize>, Vec<f32>) {
    let e = w.checkpoint.tensor(name).unwrap_or_else(|| panic!("no tensor {name}")).clone();
    let t = w.read_f32(&e).unwrap();
    (e.dtype.clone(), t.dims().to_vec(), values(&t))
}

#[test]
fn python_written_checkpoints_read_exactly() {
    // make_torch_fixtures.py: one float32 storage s[i] = i/2 - 1 (i < 6) viewed three ways.
    let s: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    for (file, format) in [("tiny_zip.pth", Format::TorchZip), ("tiny_legacy.pth", Format::TorchLegacy)] {
        let mut w = WeightsFile::open(&fixture(file)).unwrap();
        assert_eq!(w.checkpoint.format, format, "{file}");
        let names: Vec<&str> = w.checkpoint.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a.bias", "a.weight", "b.bf16", "bn.num_batches_tracked", "p.param", "t.weight", "v.part"]);
        assert_eq!(read(&mut w, "a.weight"), ("F32".into(), vec![2, 3], s.clone()), "{file}");
        // A transpose of the same storage (strides (1, 3)): t[i][j] = s[i + 3j].
        assert_eq!(read(&mut w, "t.weight"), ("F32".into(), vec![3, 2], vec![s[0], s[3], s[1], s[4], s[2], s[5]]));
        // A view at storage offset 4.
        assert_eq!(read(&mut w, "v.part"), ("F32".into(), vec![2], vec![s[4], s[5]]));
        assert_eq!(read(&mut w, "a.bias"), ("F16".into(), vec![3], vec![0.5, -1.25, 2.0]));
        assert_eq!(read(&mut w, "b.bf16"), ("BF16".into(), vec![2], vec![1.0, -2.5]));
        // nn.Parameter (torch._utils._rebuild_parameter) unwraps to its data.
        assert_eq!(read(&mut w, "p.param"), ("F32".into(), vec![1], vec![3.0]));
        let count = w.checkpoint.tensor("bn.num_batches_tracked").unwrap().clone();
        assert_eq!((count.dtype.as_str(), count.shape.as_slice()), ("I64", &[][..]));
        let e = w.read_f32(&count).unwrap_err();
        assert!(e.to_string().contains("not a float type"), "{e}");
    }
    // The zip fixture nests the state dict as openai-whisper does, beside its `dims`.
    let ck = WeightsFile::open(&fixture("tiny_zip.pth")).unwrap().checkpoint;
    assert_eq!(ck.scalar("dims.n_mels"), Some(&Scalar::Int(80)));
    assert_eq!(ck.scalar("dims.n_audio_state"), Some(&Scalar::Int(384)));
}

fn file_bytes(sd: &StateDict, legacy: bool) -> Vec<u8> {
    if legacy {
        legacy_checkpoint(sd).unwrap()
    } else {
        zip_checkpoint(sd).unwrap()
    }
}

#[test]
fn pytorch_checkpoints_load_exactly_like_safetensors() {
    let scratch = Scratch::new();
    let x = test_input(vec![1, 4, 8, 8], 3);
    let tensors = synthetic(ModelKind::TaesdDecoder, 11);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // The same tensors, rounded to `dtype`, as safetensors: what the checkpoints must equal.
        let rounded: HashMap<String, Tensor> =
            tensors.iter().map(|(k, v)| (k.clone(), v.to_dtype(dtype).unwrap())).collect();
        let st = scratch.path(&format!("taesd-{dtype:?}.safetensors"));
        candle_core::safetensors::save(&rounded, &st).unwrap();
        let want = Taesd::decoder(Profile::Cpu, &WeightsSource::File(st), &Device::Cpu).unwrap().decode(&x).unwrap();
        let sd = StateDict::from_tensors(&tensors, dtype).unwrap();
        for legacy in [false, true] {
            let p = scratch.path(&format!("taesd-{dtype:?}-{legacy}.pth"));
            write(&p, &file_bytes(&sd, legacy));
            let got = Taesd::decoder(Profile::Cpu, &WeightsSource::File(p.clone()), &Device::Cpu).unwrap();
            assert_eq!(got.decode(&x).unwrap(), want, "{dtype:?}, legacy {legacy}");
            assert_eq!(got.weights_label(), format!("real({})", p.display()));
        }
    }
}

/// whisper's tensors renamed to openai-whisper's layout (`encoder.blocks.N.attn.query` ...).
fn openai_whisper_names(t: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    t.iter()
        .map(|(k, v)| {
            let mut n = k.clone();
            for (a, b) in [
                ("layers.", "blocks."),
                (".self_attn.q_proj.", ".attn.query."),
                (".self_attn.k_proj.", ".attn.key."),
                (".self_attn.v_proj.", ".attn.value."),
                (".self_attn.out_proj.", ".attn.out."),
                (".self_attn_layer_norm.", ".attn_ln."),
                (".fc1.", ".mlp.0."),
                (".fc2.", ".mlp.2."),
                (".final_layer_norm.", ".mlp_ln."),
            ] {
                n = n.replacen(a, b, 1);
            }
            (format!("encoder.{n}"), v.clone())
        })
        .collect()
}

/// openai-whisper's `dims` of an encoder `n_audio_state` wide with the heads of the reduced
/// profile (the test's weights are synthetic at that profile).
fn whisper_dims(n_audio_state: i64) -> Vec<(String, i64)> {
    let heads = whisper::n_heads(Profile::Cpu) as i64;
    [
        ("n_mels", 80),
        ("n_audio_ctx", 1500),
        ("n_audio_state", n_audio_state),
        ("n_audio_head", heads),
        ("n_audio_layer", 4),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect()
}

#[test]
fn openai_whisper_checkpoint_with_dims_loads() {
    let scratch = Scratch::new();
    let tensors = synthetic(ModelKind::WhisperTiny, 5);
    let mut openai = openai_whisper_names(&tensors);
    // The text decoder is in the same file; the audio engine ignores it.
    let d = whisper::d_model(Profile::Cpu);
    openai.insert("decoder.token_embedding.weight".into(), Tensor::zeros((4, d), DType::F32, &Device::Cpu).unwrap());
    let mut sd = StateDict::from_tensors(&openai, DType::F16).unwrap();
    sd.whisper_dims = Some(whisper_dims(d as i64));
    let p = scratch.path("whisper/tiny.pt");
    write(&p, &legacy_checkpoint(&sd).unwrap());
    let audio: Vec<f32> = (0..16000).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
    let got = WhisperAudio::new(Profile::Cpu, &WeightsSource::File(p.clone()), &Device::Cpu).unwrap();
    let rounded: HashMap<String, Tensor> =
        tensors.iter().map(|(k, v)| (k.clone(), v.to_dtype(DType::F16).unwrap())).collect();
    let st = scratch.path("whisper-f16.safetensors");
    candle_core::safetensors::save(&rounded, &st).unwrap();
    let want = WhisperAudio::new(Profile::Cpu, &WeightsSource::File(st), &Device::Cpu).unwrap();
    assert_eq!(got.encode_audio(&audio, 25.0).unwrap(), want.encode_audio(&audio, 25.0).unwrap());
    let check = check_file(ModelKind::WhisperTiny, Profile::Cpu, &p);
    assert!(check.loads(), "{check:?}");
    assert_eq!(check.ignored, 1, "the decoder tensor is ignored, not extra");
    assert!(check.config.as_ref().unwrap().source.starts_with("dims inside"), "{check:?}");

    // dims of whisper-base: refused, naming the field.
    sd.whisper_dims = Some(whisper_dims(512));
    let p = scratch.path("whisper-base/tiny.pt");
    write(&p, &legacy_checkpoint(&sd).unwrap());
    let e = WhisperAudio::new(Profile::Cpu, &WeightsSource::File(p), &Device::Cpu).err().unwrap();
    assert!(matches!(&e, EngineError::Config { .. }), "{e}");
    assert!(e.to_string().contains(&format!("`n_audio_state` is 512; cadence implements {d}")), "{e}");
}

/// MuseTalk's `musetalk.json` (TMElyralab/MuseTalk, `train_codes/musetalk.json`, diffusers
/// 0.6 field set), at the block widths and head count given.
fn musetalk_json(channels: [usize; 4], heads: usize) -> String {
    format!(
        r#"{{
  "_class_name": "UNet2DConditionModel",
  "_diffusers_version": "0.6.0.dev0",
  "act_fn": "silu",
  "attention_head_dim": {heads},
  "block_out_channels": {channels:?},
  "center_input_sample": false,
  "cross_attention_dim": 384,
  "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
  "downsample_padding": 1,
  "flip_sin_to_cos": true,
  "freq_shift": 0,
  "in_channels": 8,
  "layers_per_block": 2,
  "mid_block_scale_factor": 1,
  "norm_eps": 1e-05,
  "norm_num_groups": 32,
  "out_channels": 4,
  "sample_size": 64,
  "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]
}}"#
    )
}

/// stabilityai/sd-vae-ft-mse `config.json` (diffusers 0.4.2) at the block widths given.
fn vae_json(channels: [usize; 4]) -> String {
    format!(
        r#"{{
  "_class_name": "AutoencoderKL",
  "_diffusers_version": "0.4.2",
  "act_fn": "silu",
  "block_out_channels": {channels:?},
  "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
  "in_channels": 3,
  "latent_channels": 4,
  "layers_per_block": 2,
  "norm_num_groups": 32,
  "out_channels": 3,
  "sample_size": 256,
  "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
}}"#
    )
}

/// openai/whisper-tiny `config.json` (transformers 4.26) with `d_model` given.
fn whisper_json(d_model: usize) -> String {
    format!(
        r#"{{
  "_name_or_path": "openai/whisper-tiny", "activation_dropout": 0.0, "activation_function": "gelu",
  "architectures": ["WhisperForConditionalGeneration"], "attention_dropout": 0.0,
  "begin_suppress_tokens": [220, 50257], "bos_token_id": 50257, "d_model": {d_model},
  "decoder_attention_heads": 6, "decoder_ffn_dim": 1536, "decoder_layerdrop": 0.0, "decoder_layers": 4,
  "decoder_start_token_id": 50258, "dropout": 0.0, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
  "encoder_layerdrop": 0.0, "encoder_layers": 4, "eos_token_id": 50257, "forced_decoder_ids": null,
  "init_std": 0.02, "is_encoder_decoder": true, "max_length": 448, "max_source_positions": 1500,
  "max_target_positions": 448, "model_type": "whisper", "num_hidden_layers": 4, "num_mel_bins": 80,
  "pad_token_id": 50257, "scale_embedding": false, "torch_dtype": "float32",
  "transformers_version": "4.26.0.dev0", "use_cache": true, "vocab_size": 51865
}}"#
    )
}

/// Seeds of the engines in the test folder (distinct, so a swapped file cannot pass).
fn seed(kind: ModelKind) -> u64 {
    20 + ALL_MODELS.iter().position(|&k| k == kind).unwrap() as u64
}

/// A MuseTalk `models/` folder as `download_weights.sh` lays it out (plus TAESD), with the
/// reduced profile's tensors (a full UNet is 3.4 GB) and configurations describing them.
fn musetalk_folder(scratch: &Scratch, name: &str) -> PathBuf {
    let root = scratch.path(name);
    let _ = std::fs::remove_dir_all(&root);
    write_musetalk_folder(&root, Profile::Cpu, &seed).unwrap();
    root
}

fn syn(seed: u64) -> WeightsSource {
    WeightsSource::Synthetic { seed }
}

#[test]
fn musetalk_folder_as_downloaded_loads_every_engine() {
    let scratch = Scratch::new();
    let root = musetalk_folder(&scratch, "models");
    let dir = ModelsDir::open(&root).unwrap();
    let found = |k| dir.find(k).unwrap().strip_prefix(&root).unwrap().to_path_buf();
    assert_eq!(found(ModelKind::MuseTalkUnet), Path::new("musetalkV15/unet.pth"), "MuseTalk 1.5 first");
    assert_eq!(found(ModelKind::SdVaeEncoder), Path::new("sd-vae/diffusion_pytorch_model.bin"));
    assert_eq!(found(ModelKind::WhisperTiny), Path::new("whisper/pytorch_model.bin"));
    assert_eq!(found(ModelKind::TaesdDecoder), Path::new("taesd/taesd_decoder.pth"));

    for kind in ALL_MODELS {
        let c = dir.check(kind, Profile::Cpu);
        assert!(c.loads(), "{kind}: {c:?}");
        assert_eq!(c.params_matched, c.params_expected, "{kind}");
        assert!(c.missing.is_empty() && c.misshaped.is_empty() && c.not_float.is_empty());
    }
    let w = dir.check(ModelKind::WhisperTiny, Profile::Cpu);
    assert_eq!((w.format.as_deref(), w.ignored), (Some("PyTorch zip"), 1));
    assert_eq!(w.extra, ["model.encoder.embed_positions.weight"]);
    assert!(w.config.as_ref().unwrap().source.ends_with("whisper/config.json"), "{w:?}");
    let u = dir.check(ModelKind::MuseTalkUnet, Profile::Cpu);
    assert!(u.config.as_ref().unwrap().source.ends_with("musetalkV15/musetalk.json"), "{u:?}");
    assert_eq!(dir.check(ModelKind::SdVaeDecoder, Profile::Cpu).format.as_deref(), Some("PyTorch legacy"));

    // Each engine from the folder computes what the same synthetic weights compute.
    let load = |k| dir.weights(k).unwrap();
    let lat = test_input(vec![1, 8, 32, 32], 1);
    let aud = test_input(vec![1, 50, cadence_engines::unet::audio_dim(Profile::Cpu)], 2);
    let u = MuseTalkUnet::new(Profile::Cpu, &load(ModelKind::MuseTalkUnet), &Device::Cpu).unwrap();
    let want = MuseTalkUnet::new(Profile::Cpu, &syn(seed(ModelKind::MuseTalkUnet)), &Device::Cpu).unwrap();
    assert!(u.predict(&lat, &aud).unwrap() == want.predict(&lat, &aud).unwrap(), "UNet 1.5 from the folder");
    let z = test_input(vec![1, 4, 4, 4], 5);
    let v = SdVae::decoder(Profile::Cpu, &load(ModelKind::SdVaeDecoder), &Device::Cpu).unwrap();
    let want = SdVae::decoder(Profile::Cpu, &syn(seed(ModelKind::SdVaeDecoder)), &Device::Cpu).unwrap();
    assert!(v.decode(&z).unwrap() == want.decode(&z).unwrap(), "SD VAE decoder from the folder");
    let img = test_input(vec![1, 3, 32, 32], 6);
    let e = Taesd::encoder(Profile::Cpu, &load(ModelKind::TaesdEncoder), &Device::Cpu).unwrap();
    let want = Taesd::encoder(Profile::Cpu, &syn(seed(ModelKind::TaesdEncoder)), &Device::Cpu).unwrap();
    assert!(e.encode(&img).unwrap() == want.encode(&img).unwrap(), "TAESD encoder from the folder");

    // Without MuseTalk 1.5, the 1.0 UNet is used.
    std::fs::remove_file(root.join("musetalkV15/unet.pth")).unwrap();
    assert_eq!(found(ModelKind::MuseTalkUnet), Path::new("musetalk/pytorch_model.bin"));
    let u1 = MuseTalkUnet::new(Profile::Cpu, &load(ModelKind::MuseTalkUnet), &Device::Cpu).unwrap();
    let want1 = MuseTalkUnet::new(Profile::Cpu, &syn(seed(ModelKind::MuseTalkUnet) + 1), &Device::Cpu).unwrap();
    assert!(u1.predict(&lat, &aud).unwrap() == want1.predict(&lat, &aud).unwrap(), "UNet 1.0 from the folder");
}

#[test]
fn models_folder_errors_name_the_problem() {
    let scratch = Scratch::new();
    let e = ModelsDir::open(&scratch.path("no-such-folder")).unwrap_err().to_string();
    assert!(e.contains("no-such-folder") && e.contains("cannot be read"), "{e}");
    let f = scratch.path("a-file");
    std::fs::write(&f, b"x").unwrap();
    assert!(ModelsDir::open(&f).unwrap_err().to_string().contains("is not a folder"));
    let empty = scratch.path("empty-models");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("README.txt"), b"weights go here").unwrap();
    let e = ModelsDir::open(&empty).unwrap_err().to_string();
    assert!(e.contains("holds no weights cadence reads"), "{e}");

    // A folder with only TAESD: the UNet is an error naming where it was looked for.
    let only = scratch.path("only-taesd");
    let dec = StateDict::from_tensors(&synthetic(ModelKind::TaesdDecoder, 1), DType::F32).unwrap();
    write(&only.join("taesd/taesd_decoder.pth"), &zip_checkpoint(&dec).unwrap());
    let dir = ModelsDir::open(&only).unwrap();
    let e = dir.weights(ModelKind::MuseTalkUnet).unwrap_err().to_string();
    for c in candidates(ModelKind::MuseTalkUnet) {
        assert!(e.contains(&c), "{e} lacks {c}");
    }
    let c = dir.check(ModelKind::MuseTalkUnet, Profile::Full);
    assert!(!c.loads() && c.error.as_deref().unwrap().starts_with("not found"), "{c:?}");
}

#[test]
fn check_lists_missing_misshaped_and_extra_tensors() {
    let scratch = Scratch::new();
    let mut t = synthetic(ModelKind::TaesdDecoder, 2);
    t.remove("7.weight");
    let c = taesd::channels(Profile::Cpu);
    t.insert("3.conv.0.weight".into(), Tensor::zeros((c, c, 1, 3), DType::F32, &Device::Cpu).unwrap());
    t.insert("20.weight".into(), Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap());
    let p = scratch.path("broken_decoder.pth");
    write(&p, &zip_checkpoint(&StateDict::from_tensors(&t, DType::F32).unwrap()).unwrap());
    let c = check_file(ModelKind::TaesdDecoder, Profile::Cpu, &p);
    assert!(!c.loads());
    let ch = taesd::channels(Profile::Cpu);
    assert_eq!(c.missing, [format!("7.weight [{ch}, {ch}, 3, 3]")]);
    assert_eq!(c.misshaped, [format!("3.conv.0.weight: [{ch}, {ch}, 1, 3] in the file, expected [{ch}, {ch}, 3, 3]")]);
    assert_eq!(c.extra, ["20.weight"]);
    // Loading reports the first problem in the constructor's order, before reading any data.
    let e = Taesd::decoder(Profile::Cpu, &WeightsSource::File(p), &Device::Cpu).err().unwrap();
    assert!(matches!(&e, EngineError::ShapeMismatch { name, .. } if name == "3.conv.0.weight"), "{e}");
}

fn empty_checkpoint() -> Checkpoint {
    Checkpoint { format: Format::TorchZip, tensors: vec![], scalars: vec![] }
}

/// Writes `config_name` with `text` beside a (never read) weights file and checks it.
fn check_config(
    scratch: &Scratch,
    kind: ModelKind,
    dir: &str,
    weights: &str,
    config_name: &str,
    text: &str,
) -> Result<()> {
    let d = scratch.path(dir);
    write(&d.join(config_name), text.as_bytes());
    cadence_engines::config::check(kind, Profile::Full, &d.join(weights), &empty_checkpoint()).map(|_| ())
}

#[test]
fn published_configs_are_accepted_and_others_refused_by_field() {
    let scratch = Scratch::new();
    let full = [320, 640, 1280, 1280];
    let unet =
        |text: &str| check_config(&scratch, ModelKind::MuseTalkUnet, "cfg-unet", "unet.pth", "musetalk.json", text);
    unet(&musetalk_json(full, 8)).unwrap();
    // The same config written by a recent diffusers, with every field spelled out.
    let recent = musetalk_json(full, 8).replace(
        "\"act_fn\"",
        r#""addition_embed_type": null, "addition_embed_type_num_heads": 64, "addition_time_embed_dim": null,
        "attention_type": "default", "class_embed_type": null, "class_embeddings_concat": false,
        "conv_in_kernel": 3, "conv_out_kernel": 3, "cross_attention_norm": null, "dropout": 0.0,
        "dual_cross_attention": false, "encoder_hid_dim": null, "encoder_hid_dim_type": null,
        "mid_block_only_cross_attention": null, "mid_block_type": "UNetMidBlock2DCrossAttn",
        "num_attention_heads": null, "num_class_embeds": null, "only_cross_attention": false,
        "projection_class_embeddings_input_dim": null, "resnet_out_scale_factor": 1.0,
        "resnet_skip_time_act": false, "resnet_time_scale_shift": "default",
        "reverse_transformer_layers_per_block": null, "time_cond_proj_dim": null,
        "time_embedding_act_fn": null, "time_embedding_dim": null, "time_embedding_type": "positional",
        "timestep_post_act": null, "transformer_layers_per_block": 1, "upcast_attention": false,
        "use_linear_projection": false, "act_fn""#,
    );
    unet(&recent).unwrap();
    let refused = |text: String, field: &str| {
        let e = unet(&text).unwrap_err();
        assert!(matches!(e, EngineError::Config { .. }), "{e}");
        assert!(e.to_string().contains(&format!("`{field}`")), "{e} does not name {field}");
    };
    refused(
        musetalk_json(full, 8).replace("\"cross_attention_dim\": 384", "\"cross_attention_dim\": 768"),
        "cross_attention_dim",
    );
    refused(
        musetalk_json(full, 8).replace("\"attention_head_dim\": 8", "\"attention_head_dim\": 5"),
        "attention_head_dim",
    );
    refused(musetalk_json([32, 64, 128, 128], 8), "block_out_channels");
    refused(musetalk_json(full, 8).replace("\"in_channels\": 8,", ""), "in_channels");
    refused(
        musetalk_json(full, 8).replace("\"act_fn\"", "\"use_linear_projection\": true, \"act_fn\""),
        "use_linear_projection",
    );
    refused(musetalk_json(full, 8).replace("\"act_fn\"", "\"frobnicate\": 1, \"act_fn\""), "frobnicate");
    let e = unet("{ not json").unwrap_err().to_string();
    assert!(e.contains("not valid JSON"), "{e}");

    let vae = |text: &str| {
        check_config(&scratch, ModelKind::SdVaeDecoder, "cfg-vae", "diffusion_pytorch_model.bin", "config.json", text)
    };
    vae(&vae_json([128, 256, 512, 512])).unwrap();
    // As diffusers >= 0.15 writes it.
    vae(&vae_json([128, 256, 512, 512])
        .replace("\"act_fn\"", "\"scaling_factor\": 0.18215, \"force_upcast\": true, \"act_fn\""))
    .unwrap();
    let e = vae(&vae_json([128, 256, 512, 512]).replace("\"act_fn\"", "\"scaling_factor\": 0.13025, \"act_fn\""))
        .unwrap_err();
    assert!(e.to_string().contains("`scaling_factor` is 0.13025"), "{e}");
    let e =
        vae(&vae_json([128, 256, 512, 512]).replace("\"latent_channels\": 4", "\"latent_channels\": 16")).unwrap_err();
    assert!(e.to_string().contains("`latent_channels`"), "{e}");

    let whisper = |text: &str| {
        check_config(&scratch, ModelKind::WhisperTiny, "cfg-whisper", "pytorch_model.bin", "config.json", text)
    };
    whisper(&whisper_json(384)).unwrap();
    let e = whisper(&whisper_json(512)).unwrap_err();
    assert!(e.to_string().contains("`d_model` is 512; cadence implements 384"), "{e}");
    // A config.json beside a differently named file is not this file's configuration.
    check_config(
        &scratch,
        ModelKind::WhisperTiny,
        "cfg-whisper2",
        "whisper_tiny.safetensors",
        "config.json",
        &whisper_json(512),
    )
    .unwrap();
}

#[test]
fn malformed_checkpoints_are_clear_errors() {
    let t = synthetic(ModelKind::TaesdEncoder, 3);
    let sd = StateDict::from_tensors(&t, DType::F32).unwrap();
    let zip = zip_checkpoint(&sd).unwrap();
    let legacy = legacy_checkpoint(&sd).unwrap();
    assert_eq!(inspect_bytes(&zip).unwrap().tensors.len(), t.len());
    assert_eq!(inspect_bytes(&legacy).unwrap().tensors.len(), t.len());
    let err = |b: &[u8]| inspect_bytes(b).unwrap_err().to_string();

    // A zip cut short loses its central directory.
    let e = err(&zip[..zip.len() / 2]);
    assert!(e.contains("not a readable zip archive"), "{e}");
    // A legacy file cut inside its last storage.
    let e = err(&legacy[..legacy.len() - 10]);
    assert!(e.contains("truncated"), "{e}");
    // An opcode of pickle protocol 4 (FRAME) in place of the state dict's first opcode.
    let mut bad = legacy.clone();
    let at = find_main_pickle(&bad);
    bad[at] = 0x95;
    let e = err(&bad);
    assert!(e.contains("opcode 0x95 (FRAME (protocol 4))"), "{e}");
    // A byte no pickle protocol uses.
    bad[at] = 0xff;
    assert!(err(&bad).contains("unknown or unsupported pickle opcode 0xff"));

    // A tensor whose storage is too short: the pickle promises more elements than it holds.
    let short = StateDict {
        storages: vec![Storage { dtype: "F32", bytes: vec![0; 4 * 6] }],
        entries: vec![Entry { name: "w".into(), storage: 0, offset: 2, shape: vec![2, 3], strides: vec![3, 1] }],
        whisper_dims: None,
    };
    for b in [zip_checkpoint(&short).unwrap(), legacy_checkpoint(&short).unwrap()] {
        let e = err(&b);
        assert!(e.contains("tensor `w` [2, 3] (offset 2, strides [3, 1]) needs 8 elements of storage"), "{e}");
    }
    // A storage entry shorter than its element count: the pickle says 7 floats, the zip entry
    // holds 6 (patch the BININT1 after the storage's location string `cpu` and its BINPUT).
    let mut sd6 = short.clone();
    sd6.entries[0].offset = 0;
    let mut pkl = state_dict_pickle(&sd6, false).unwrap();
    let at = pkl.windows(3).position(|w| w == b"cpu").unwrap() + 3;
    assert_eq!((pkl[at], pkl[at + 2], pkl[at + 3]), (b'q', b'K', 6));
    pkl[at + 3] = 7;
    let z = zip_archive(&[("archive/data.pkl".into(), pkl), ("archive/data/0".into(), sd6.storages[0].bytes.clone())]);
    assert!(inspect_bytes(&zip_archive(&[
        ("archive/data.pkl".into(), state_dict_pickle(&sd6, false).unwrap()),
        ("archive/data/0".into(), sd6.storages[0].bytes.clone())
    ]))
    .is_ok());
    let e = err(&z);
    assert!(e.contains("storage `0` holds 24 bytes in the file; its 7 F32 elements need 28"), "{e}");
    // A legacy storage whose 8-byte header disagrees with the pickle's element count.
    let mut l = legacy_checkpoint(&sd6).unwrap();
    let h = l.len() - 24 - 8;
    assert_eq!(l[h], 6);
    l[h] = 5;
    let e = err(&l);
    assert!(e.contains("the file says 5 elements, the pickle 6"), "{e}");
}

/// Offset of the first opcode after PROTO in the legacy file's fourth pickle (the state dict).
fn find_main_pickle(b: &[u8]) -> usize {
    // Pickles 1 and 2 have fixed sizes; the sys_info pickle ends at its first STOP after them.
    let after_two = 15 + 6;
    let stop = after_two + b[after_two..].iter().position(|&x| x == b'.').unwrap();
    stop + 1 + 2
}

#[test]
fn hostile_pickles_are_refused_before_candle_runs_them() {
    // Objects nested 100 deep: 100 empty lists, each appended to the one below.
    let mut deep = vec![0x80, 2];
    deep.extend(std::iter::repeat_n(b']', 100));
    deep.extend(std::iter::repeat_n(b'a', 99));
    deep.push(b'.');
    let e = inspect_bytes(&legacy_with(deep)).unwrap_err().to_string();
    assert!(e.contains("nested more than 64 deep"), "{e}");
    // Memo doubling: x = [], then 30 times x = (x, x): 2^30 objects from 150 bytes.
    let mut laughs = vec![0x80, 2, b']', b'q', 0];
    for _ in 0..30 {
        laughs.extend([b'h', 0, b'h', 0, 0x86, b'q', 0]);
    }
    laughs.push(b'.');
    let e = inspect_bytes(&legacy_with(laughs)).unwrap_err().to_string();
    assert!(e.contains("would copy more than"), "{e}");
    // An integer of 9 bytes (candle would shift past 64 bits).
    let e =
        inspect_bytes(&legacy_with(vec![0x80, 2, 0x8a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, b'.'])).unwrap_err().to_string();
    assert!(e.contains("integer of 9 bytes"), "{e}");
    // A string longer than the data.
    let e = inspect_bytes(&legacy_with(vec![0x80, 2, b'X', 0xff, 0xff, 0xff, 0x7f, b'a'])).unwrap_err().to_string();
    assert!(e.contains("ends inside a pickle"), "{e}");
}

/// A legacy file whose object pickle is `pkl` (magic, version and sys_info as torch writes them).
fn legacy_with(pkl: Vec<u8>) -> Vec<u8> {
    let mut b = legacy_checkpoint(&StateDict::default()).unwrap();
    let start = find_main_pickle(&b) - 2;
    b.truncate(start);
    b.extend(pkl);
    // The (empty) storage key list.
    b.extend([0x80, 2, b']', b'q', 0, b'.']);
    b
}
