//! `cadence render --engine ditto` end to end on the cpu-reduced profile with synthetic weights:
//! an MP4 with the clip's frames and sound, the summary saying what ran; bad input refused before
//! any network loads, with nothing at the output path.

mod common;
use common::{cadence, s, speech_fixture, stderr};
use std::path::{Path, PathBuf};

fn portrait(dir: &Path) -> PathBuf {
    let (w, h) = (256u32, 288u32);
    let px: Vec<u8> = (0..w * h).flat_map(|i| [(i % w) as u8, (i / w) as u8, ((i * 13) % 251) as u8]).collect();
    let p = dir.join("portrait.png");
    cadence_media::RgbImage::from_raw(w, h, px).unwrap().save(&p).unwrap();
    p
}

#[test]
fn ditto_renders_speech_to_mp4_with_strides() {
    let dir = tempfile::tempdir().unwrap();
    let wav = speech_fixture("goodnight");
    let img = portrait(dir.path());
    let out = dir.path().join("ditto.mp4");
    let o = cadence(&[
        "render",
        "--engine",
        "ditto",
        "--audio",
        s(&wav),
        "--avatar",
        s(&img),
        "--stride",
        "3",
        "--ditto-infill",
        "image",
        "--ditto-steps",
        "4",
        // The synthetic portrait has no face for the detector: the centred box.
        "--face-box",
        "center",
        "-o",
        s(&out),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let frames = (cadence_media::wav_duration(&wav).unwrap() * 25.0).ceil() as u64;
    let info = cadence_media::probe(&out).unwrap();
    assert_eq!((info.frames, info.width, info.height), (frames, 256, 288));
    assert!(info.has_audio);
    assert_eq!(v["engine"], "ditto");
    assert_eq!(v["frames"].as_u64(), Some(frames));
    assert_eq!(v["schedule"], "stride 3");
    assert_eq!(v["ditto"]["infill"], "image");
    assert_eq!(v["ditto"]["audio_features"], "hubert");
    assert!(v["weights"].as_str().unwrap().starts_with("synthetic"), "{}", v["weights"]);
    // Warps only on keyframes that are not in sustained silence; image infill decodes only them.
    let (keys, warps) = (v["keyframes_scheduled"].as_u64().unwrap(), v["unet_evaluations"].as_u64().unwrap());
    assert_eq!(keys, (frames - 1).div_ceil(3) + 1);
    assert!(warps <= keys && warps > 0, "{warps} warps of {keys} keyframes");
    assert_eq!(v["decoded_frames"].as_u64(), Some(warps));
}

#[test]
fn ditto_bad_input_is_refused_before_the_networks_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wav = speech_fixture("goodnight");
    let img = portrait(d);
    let out = d.join("out.mp4");
    let frames = (cadence_media::wav_duration(&wav).unwrap() * 25.0).ceil() as usize;
    let npy = |name: &str, shape: &[usize], v: f32| {
        let p = d.join(name);
        let mut data = vec![0.5f32; shape.iter().product()];
        data[3] = v;
        cadence::io::npy::save(&p, shape, &data).unwrap();
        p
    };
    let nan = npy("nan.npy", &[frames, 256], f32::NAN);
    let short = npy("short.npy", &[frames - 1, 256], 0.0);
    let wide = npy("wide.npy", &[frames, 1024], 0.0);
    let base = ["render", "--engine", "ditto", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&out)];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--audio-features", s(&nan)], "(frame 0) is NaN"),
        (vec!["--audio-features", s(&short)], "frames of audio features for"),
        (vec!["--audio-features", s(&wide)], "takes (frames, 256)"),
        (vec!["--fps", "30"], "25 frames per second"),
        (vec!["--keyframes", "0,5,100000"], "outside the video"),
        (vec!["--schedule", "audio"], "adaptive schedules"),
    ];
    for (extra, want) in cases {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let o = cadence(&args);
        let err = stderr(&o);
        assert!(!o.status.success() && err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("loading the networks"), "{extra:?}: checked only after loading: {err}");
        assert!(!out.exists(), "{extra:?} left an output");
    }
    // MuseTalk does not take HuBERT features.
    let o = cadence(&["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&out), "--audio-features", s(&nan)]);
    assert!(!o.status.success() && stderr(&o).contains("add --engine ditto"), "{}", stderr(&o));
}
