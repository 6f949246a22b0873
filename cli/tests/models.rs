//! Real weights as users have them: MuseTalk's `models/` folder through `render`'s one loading
//! path, `cadence models check`, and `--models` that cannot be used (a clear error, never a
//! silent fallback to synthetic weights).
//!
//! The folders are written by `cadence_engines::torch_write::write_musetalk_folder` (PyTorch
//! checkpoints in both formats, configurations beside them) at the reduced profile: the published
//! UNet alone is 3.4 GB.

mod common;
use common::{cadence, s};

use cadence::musetalk::{DecoderKind, Engines};

use cadence::frame_loop::RenderOptions;
use cadence_engines::torch_write::write_musetalk_folder;
use cadence_engines::{Device, ModelsDir, Profile, DEFAULT_SEED};
use std::path::{Path, PathBuf};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A MuseTalk folder whose every engine holds the synthetic weights of DEFAULT_SEED.
fn folder(dir: &Path) -> PathBuf {
    let root = dir.join("models");
    write_musetalk_folder(&root, Profile::Cpu, &|_| DEFAULT_SEED).unwrap();
    root
}

/// A committed espeak-ng sentence (fixtures/speech).
fn speech() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech/news.wav")
}

fn avatar(dir: &Path) -> PathBuf {
    let (w, h) = (256u32, 256u32);
    let px: Vec<u8> = (0..w * h).flat_map(|i| [(i % w * 7 % 256) as u8, (i / w * 3 % 256) as u8, 128]).collect();
    let p = dir.join("avatar.png");
    cadence_media::RgbImage::from_raw(w, h, px).unwrap().save(&p).unwrap();
    p
}

/// Every NV12 frame of a stride-2 render of the sentence's first 0.8 s (20 frames).
fn render_frames(engines: &Engines, avatar_path: &Path) -> Vec<Vec<u8>> {
    let backend = cadence::Backend::Cpu;
    let opts = RenderOptions::default();
    let mut audio = cadence::frame_loop::audio::load_audio(&speech(), 60.0).unwrap();
    audio.samples_16k.truncate(16000 * 8 / 10);
    let img = cadence::avatar::load_avatar(avatar_path).unwrap();
    let face = cadence::avatar::face_box(&img, None).unwrap();
    let prepared = cadence::musetalk::render::prepare(engines, &backend, audio, &img, face, &opts).unwrap();
    let schedule = cadence::KeyframeSchedule::fixed_stride(prepared.frames, 2).unwrap();
    cadence::measure::fixtures::render_prepared(engines, &backend, &opts, &prepared, &schedule).unwrap().0
}

#[test]
fn a_musetalk_folder_renders_exactly_what_its_weights_compute() {
    let dir = tempfile::tempdir().unwrap();
    let models = ModelsDir::open(&folder(dir.path())).unwrap();
    let img = avatar(dir.path());
    let real = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, Some(&models)).unwrap();
    let summary = real.weights_summary();
    assert!(summary.starts_with("real: whisper-tiny="), "{summary}");
    assert!(summary.contains("musetalkV15/unet.pth") && summary.contains("taesd/taesd_encoder.pth"), "{summary}");
    let synthetic = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None).unwrap();
    assert_eq!(synthetic.weights_summary(), format!("synthetic(seed={DEFAULT_SEED})"));
    let (a, b) = (render_frames(&real, &img), render_frames(&synthetic, &img));
    assert!(a.len() == 20 && a == b, "the folder's weights must render what the same weights render");
    // The SD VAE pair from the same folder (a render with it takes minutes on the CPU: one decode).
    let real = Engines::load(Profile::Cpu, DecoderKind::SdVae, &Device::Cpu, Some(&models)).unwrap();
    assert!(real.weights_summary().contains("sd-vae-decoder=") && real.weights_summary().contains("sd-vae/"));
    let synthetic = Engines::load(Profile::Cpu, DecoderKind::SdVae, &Device::Cpu, None).unwrap();
    let z = cadence_engines::bench::test_input(vec![1, 4, 4, 4], 9);
    assert!(real.decoder.decode(&z).unwrap() == synthetic.decoder.decode(&z).unwrap());
}

#[test]
fn models_check_reports_every_engine_and_fails_on_a_requested_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path());
    let o = cadence(&["models", "check", s(&root), "--profile", "cpu-reduced"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    for needle in [
        "musetalk-unet   loads        musetalkV15/unet.pth  [requested]",
        "whisper-tiny    loads        whisper/pytorch_model.bin  [requested]",
        "sd-vae-decoder  loads        sd-vae/diffusion_pytorch_model.bin\n",
        "PyTorch zip; config musetalkV15/musetalk.json",
        "PyTorch legacy; config sd-vae/config.json",
        "extra, not used (1): model.encoder.embed_positions.weight",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    // JSON: all six engines, the four `render` loads requested, parameter counts complete.
    let o = cadence(&["models", "check", s(&root), "--profile", "cpu-reduced", "--json", "--decoder", "sd-vae"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let engines = v["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 6);
    let requested: Vec<&str> =
        engines.iter().filter(|e| e["requested"] == true).map(|e| e["model"].as_str().unwrap()).collect();
    assert_eq!(requested, ["whisper-tiny", "musetalk-unet", "sd-vae-decoder", "sd-vae-encoder"]);
    for e in engines {
        assert_eq!(e["loads"], true, "{e}");
        assert_eq!(e["params_expected"], e["params_matched"], "{e}");
    }

    // Against the published architecture this (reduced) folder cannot load: the configuration
    // says so first, naming the field.
    let o = cadence(&["models", "check", s(&root)]);
    assert!(!o.status.success());
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let unet_widths = format!("{:?}", cadence_engines::unet::block_channels(Profile::Cpu)).replace(' ', "");
    let refused = format!("`block_out_channels` is {unet_widths}; cadence implements [320,640,1280,1280]");
    assert!(out.contains(&refused), "{out}");
    assert!(err.contains("requested engines cannot load") && err.contains("musetalk-unet"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // A requested engine that is not there.
    std::fs::remove_file(root.join("taesd/taesd_decoder.pth")).unwrap();
    let o = cadence(&["models", "check", s(&root), "--profile", "cpu-reduced", "--engine", "taesd-decoder"]);
    assert!(!o.status.success());
    let out = text(&o.stdout);
    assert!(
        out.contains("taesd-decoder   CANNOT LOAD  -  [requested]") && out.contains("not found (looked for taesd/"),
        "{out}"
    );
    // ... but it is not needed with the SD VAE.
    let o = cadence(&["models", "check", s(&root), "--profile", "cpu-reduced", "--decoder", "sd-vae"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn models_that_cannot_be_used_are_one_line_errors_and_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let img = avatar(dir.path());
    let out = dir.path().join("out.mp4");
    let wav = speech();
    let render = |models: &str, extra: &[&str]| {
        // The synthetic avatar has no face for the detector: the centred box.
        let mut args = vec!["render", "--audio", s(&wav), "--avatar", s(&img), "--face-box", "center"];
        args.extend(["-o", s(&out), "--models", models]);
        args.extend(extra);
        cadence(&args)
    };
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let root = folder(dir.path());
    let missing = dir.path().join("no-such-folder");
    // At the published size the folder's reduced configuration is refused, naming the field (of
    // whisper, the first engine loaded).
    let reduced_whisper =
        format!("`d_model` is {}; cadence implements 384", cadence_engines::whisper::d_model(Profile::Cpu));
    for (models, extra, want) in [
        (s(&missing), &[][..], "cannot be read"),
        (s(&img), &[][..], "is not a folder"),
        (s(&empty), &[][..], "holds no weights cadence reads"),
        (s(&root), &["--profile", "cpu-reduced"][..], "real weights need --profile full"),
        (s(&root), &[][..], reduced_whisper.as_str()),
    ] {
        let o = render(models, extra);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{models} {extra:?} succeeded");
        assert!(err.contains(want), "{models} {extra:?}: {err}");
        assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "one error line: {err}");
        assert!(!out.exists(), "an output file was left");
    }
    // engine-run and engine-bench resolve through the same folder.
    let o =
        cadence(&["engine-run", "--model", "taesd", "--models", s(&empty), "--input", s(&img), "--output", s(&out)]);
    assert!(!o.status.success() && text(&o.stderr).contains("holds no weights"), "{}", text(&o.stderr));
    std::fs::remove_file(root.join("taesd/taesd_decoder.pth")).unwrap();
    let o = cadence(&["engine-bench", "--model", "taesd", "--models", s(&root), "--runs", "1"]);
    let err = text(&o.stderr);
    assert!(!o.status.success() && err.contains("no weights for taesd-decoder (looked for"), "{err}");
}
