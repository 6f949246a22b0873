//! `cadence render` on real speech (committed espeak-ng sentences joined by a long pause): the MP4
//! is checked, frames in the sustained pause are bypassed and identical, and every bad input
//! fails with a clear error, a non-zero exit and nothing left at the output path.

mod common;
use common::{cadence, s};

use std::path::{Path, PathBuf};

const PAUSE_S: f64 = 2.5;

/// A committed espeak-ng sentence (fixtures/speech, made by scripts/make_speech_fixtures.sh).
fn speech_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech").join(format!("{name}.wav"))
}

/// Sentence, PAUSE_S of silence, sentence, as one WAV (espeak's 22.05 kHz mono).
fn speech_with_pause(dir: &Path) -> PathBuf {
    // "Good evening, here is the news." and "Thank you, and good night."
    let (a, b) = (speech_fixture("news"), speech_fixture("goodnight"));
    let read = |p: &Path| {
        let mut r = hound::WavReader::open(p).unwrap();
        let spec = r.spec();
        (spec, r.samples::<i16>().map(|s| s.unwrap()).collect::<Vec<i16>>())
    };
    let (spec, mut s) = read(&a);
    let (_, s2) = read(&b);
    s.extend(std::iter::repeat_n(0i16, (PAUSE_S * spec.sample_rate as f64) as usize));
    s.extend(s2);
    let out = dir.join("speech.wav");
    let mut w = hound::WavWriter::create(&out, spec).unwrap();
    s.iter().for_each(|&x| w.write_sample(x).unwrap());
    w.finalize().unwrap();
    out
}

fn avatar(dir: &Path, w: u32, h: u32) -> PathBuf {
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            px.extend_from_slice(&[(x * 7 % 256) as u8, (y * 3 % 256) as u8, 128]);
        }
    }
    let img = cadence_media::RgbImage::from_raw(w, h, px).unwrap();
    let p = dir.join(format!("avatar_{w}x{h}.png"));
    img.save(&p).unwrap();
    p
}

#[test]
fn render_real_speech_to_mp4() {
    let dir = tempfile::tempdir().unwrap();
    let wav = speech_with_pause(dir.path());
    let img = avatar(dir.path(), 320, 384);
    let out = dir.path().join("out.mp4");
    let o = cadence(&[
        "render",
        "--audio",
        s(&wav),
        "--avatar",
        s(&img),
        "--stride",
        "3",
        // The synthetic avatar has no face for the detector: the centred box.
        "--face-box",
        "center",
        "-o",
        s(&out),
        "--backend",
        "cpu",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let info = cadence_media::probe(&out).unwrap();
    let duration = cadence_media::wav_duration(&wav).unwrap();
    let frames = (duration * 25.0).ceil() as u64;
    assert_eq!(info.video_codec, "h264");
    assert!((info.fps - 25.0).abs() < 1e-6, "fps {}", info.fps);
    assert_eq!(info.frames, frames);
    assert_eq!((info.width, info.height), (320, 384));
    assert!(info.has_audio);
    assert_eq!(summary["frames"].as_u64(), Some(frames));
    // `--face-box center`: the centred square of half the shorter side, given (not found).
    assert_eq!(summary["face"], serde_json::json!({"box": [80, 112, 160, 160], "source": "given"}));
    // The 2.5 s pause minus the 4-frame ramps on each side leaves about 54 bypassed frames.
    let bypassed = summary["bypassed_frames"].as_u64().unwrap();
    assert!(bypassed >= 40, "bypassed {bypassed}");
    assert!(summary["unet_evaluations"].as_u64() < summary["keyframes_scheduled"].as_u64());
    assert!(summary["weights"].as_str().unwrap().starts_with("synthetic"));
    // --device auto (the default): the CPU in a build without the engines' CUDA feature.
    let device = summary["engine_device"].as_str().unwrap();
    if !cfg!(feature = "engines-cuda") {
        assert_eq!(device, "cpu (auto: built without the engines' CUDA feature)");
        assert_eq!(summary["profile"].as_str(), Some("cpu-reduced"));
        assert_eq!(summary["frames_kept_in"].as_str(), Some("host"));
    }
}

/// `--infill image`: the decoder runs on the UNet's keyframes only, and the summary says which
/// infill ran; Ditto refuses MuseTalk's flag and names its own.
#[test]
fn image_infill_decodes_keyframes_only() {
    let dir = tempfile::tempdir().unwrap();
    let wav = speech_with_pause(dir.path());
    let img = avatar(dir.path(), 256, 256);
    let out = dir.path().join("image.mp4");
    let args =
        ["render", "--audio", s(&wav), "--avatar", s(&img), "--face-box", "center", "--stride", "3", "-o", s(&out)];
    let o = cadence(&[&args[..], &["--backend", "cpu", "--infill", "image", "--json"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["infill"], "image");
    let (decoded, evaluated, frames) =
        (summary["decoded_frames"].as_u64(), summary["unet_evaluations"].as_u64(), summary["frames"].as_u64());
    assert_eq!(decoded, evaluated, "{summary}");
    assert!(decoded.unwrap() * 2 < frames.unwrap(), "{summary}");
    assert_eq!(cadence_media::probe(&out).unwrap().frames, frames.unwrap());

    let o = cadence(&[&args[..], &["--engine", "ditto", "--infill", "image", "--force"]].concat());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--ditto-infill"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn frames_in_a_sustained_pause_are_bypassed_and_identical() {
    use cadence::frame_loop::RenderOptions;
    use cadence::musetalk::{DecoderKind, Engines};
    let dir = tempfile::tempdir().unwrap();
    let wav = speech_with_pause(dir.path());
    let img_path = avatar(dir.path(), 256, 256);
    let backend = cadence::Backend::Cpu;
    let engines =
        Engines::load(cadence_engines::Profile::Cpu, DecoderKind::Taesd, &cadence_engines::Device::Cpu, None).unwrap();
    let opts = RenderOptions::default();
    let audio = cadence::frame_loop::audio::load_audio(&wav, 60.0).unwrap();
    let img = cadence::avatar::load_avatar(&img_path).unwrap();
    let face = cadence::avatar::face_box(&img, None).unwrap();
    let prepared = cadence::musetalk::render::prepare(&engines, &backend, audio, &img, face, &opts).unwrap();
    let schedule = cadence::KeyframeSchedule::fixed_stride(prepared.frames, 2).unwrap();
    let (frames, stats) =
        cadence::measure::fixtures::render_prepared(&engines, &backend, &opts, &prepared, &schedule).unwrap();
    let distance = cadence::schedules::keyframes::speech_distance(&prepared.speech);
    let bypassed: Vec<usize> = (0..frames.len()).filter(|&i| distance[i] >= opts.ramp).collect();
    assert_eq!(bypassed.len(), stats.bypassed_frames);
    assert!(bypassed.len() >= 40, "the pause should be detected: {} bypassed", bypassed.len());
    // The rest frame composited from scratch: every bypassed frame is exactly it (the render loop
    // composites the first frame of a bypassed run and reuses it for the others).
    let mut rest = vec![0u8; prepared.compositors[0].frame_bytes()];
    prepared.compositors[0]
        .compose_frame(&prepared.avatar[0].rest_rgb, 256, 256, engines.decoder_range(), &mut rest)
        .unwrap();
    for &i in &bypassed {
        assert!(frames[i] == rest, "bypassed frame {i} differs from the rest frame");
    }
    // Speech frames are not all the rest frame (the network ran on them).
    let speaking =
        (0..frames.len()).filter(|&i| distance[i] == 0).filter(|&i| frames[i] != frames[bypassed[0]]).count();
    assert!(speaking > 0);
    assert_eq!(stats.decoded_frames + stats.bypassed_frames, frames.len());
}

#[test]
fn bad_inputs_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good_wav = d.join("tone.wav");
    {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&good_wav, spec).unwrap();
        for i in 0..16000 {
            w.write_sample(((i as f32 * 0.05).sin() * 8000.0) as i16).unwrap();
        }
        w.finalize().unwrap();
    }
    let text = d.join("text.wav");
    std::fs::write(&text, "this is not audio").unwrap();
    let truncated = d.join("truncated.wav");
    std::fs::write(&truncated, &std::fs::read(&good_wav).unwrap()[..30]).unwrap();
    let empty = d.join("empty.wav");
    hound::WavWriter::create(
        &empty,
        hound::WavSpec {
            channels: 1,
            sample_rate: 16000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        },
    )
    .unwrap()
    .finalize()
    .unwrap();
    let img = avatar(d, 256, 256);
    let tiny = avatar(d, 16, 16);
    let not_image = d.join("not.png");
    std::fs::write(&not_image, "nope").unwrap();
    let out = d.join("out.mp4");
    let missing_dir_out = d.join("no/such/dir/out.mp4");
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--audio", s(&text), "--avatar", s(&img)], "wav"),
        (vec!["--audio", s(&truncated), "--avatar", s(&img)], "wav"),
        (vec!["--audio", s(&empty), "--avatar", s(&img)], "no samples"),
        (vec!["--audio", s(&good_wav), "--avatar", s(&img), "--max-seconds", "0.5"], "--max-seconds"),
        (vec!["--audio", s(&good_wav), "--avatar", s(&not_image)], "not a png or jpeg"),
        (vec!["--audio", s(&good_wav), "--avatar", s(&tiny)], "smaller than the minimum"),
        (vec!["--audio", s(&good_wav), "--avatar", s(&img), "--face-box", "200,200,128,128"], "face box"),
        (vec!["--audio", s(&good_wav), "--avatar", s(&img), "--stride", "0"], "stride"),
        (vec!["--audio", s(&good_wav), "--avatar", s(&img), "--batch", "0"], "--batch"),
        (vec!["--audio", "/nonexistent.wav", "--avatar", s(&img)], "nonexistent"),
        (vec!["--audio", s(&good_wav), "--avatar", s(&img), "--device", "gpu"], "expected auto, cpu, cuda or cuda:N"),
    ];
    if !cfg!(feature = "engines-cuda") {
        cases.push((vec!["--audio", s(&good_wav), "--avatar", s(&img), "--device", "cuda"], "`engines-cuda` feature"));
    }
    for (args, needle) in cases {
        let mut full = vec!["render", "-o", s(&out)];
        full.extend(&args);
        let o = cadence(&full);
        let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
        assert!(!o.status.success(), "{full:?} should fail");
        assert!(err.contains(&needle.to_lowercase()), "{full:?}: expected '{needle}' in: {err}");
        assert!(!out.exists(), "{full:?} left an output file");
    }
    let o = cadence(&["render", "--audio", s(&good_wav), "--avatar", s(&img), "-o", s(&missing_dir_out)]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("does not exist"));
    std::fs::write(&out, "keep me").unwrap();
    let o = cadence(&["render", "--audio", s(&good_wav), "--avatar", s(&img), "-o", s(&out)]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let leftovers = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .count();
    assert_eq!(leftovers, 0);
}
