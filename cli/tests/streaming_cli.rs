//! `cadence render` streaming: windows (`--window`) and fragmented output (`--fragmented`,
//! `-o -` to standard output, `--realtime`), read back with the media crate's own MP4 reader.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cadence_media::Mp4Reader;

fn speech() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech/goodnight.wav")
}

/// A 320x256 avatar (small frames keep the encoder's share of the test short).
fn avatar(dir: &Path) -> PathBuf {
    let (w, h) = (320u32, 256u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 29 % 253) as u8).collect();
    let p = dir.join("avatar.png");
    cadence_media::RgbImage::from_raw(w, h, px).unwrap().save(&p).unwrap();
    p
}

fn cadence(args: &[&str], stdout: Stdio) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cadence"))
        // The synthetic avatar has no face for the detector: the centred box.
        .args(["render", "--backend", "cpu", "--stride", "3", "--face-box", "center"])
        .args(args)
        .stdout(stdout)
        .output()
        .expect("run cadence")
}

fn ok(o: &Output) {
    assert!(o.status.success(), "cadence failed: {}", String::from_utf8_lossy(&o.stderr));
}

fn video_samples(path: &Path) -> (Vec<Vec<u8>>, bool, usize) {
    let r = Mp4Reader::open(path).unwrap();
    let bytes = std::fs::read(path).unwrap();
    let v = r.video_samples().unwrap();
    let samples =
        v.samples.iter().map(|s| bytes[s.offset as usize..s.offset as usize + s.size as usize].to_vec()).collect();
    (samples, r.audio_samples().unwrap().is_some(), r.fragments())
}

/// The window changes nothing in the file, and a fragmented MP4 on standard output carries the
/// same H.264 samples as the progressive file, with its audio, in one fragment per GOP.
#[test]
fn windows_and_fragmented_output_carry_the_same_video() {
    let dir = tempfile::tempdir().unwrap();
    let (audio, img) = (speech(), avatar(dir.path()));
    let base = ["--audio", audio.to_str().unwrap(), "--avatar", img.to_str().unwrap()];
    let whole = dir.path().join("whole.mp4");
    let windowed = dir.path().join("windowed.mp4");
    ok(&cadence(&[&base[..], &["--window", "0", "-o", whole.to_str().unwrap()]].concat(), Stdio::null()));
    ok(&cadence(&[&base[..], &["--window", "0.5", "-o", windowed.to_str().unwrap()]].concat(), Stdio::null()));
    assert!(std::fs::read(&whole).unwrap() == std::fs::read(&windowed).unwrap(), "the window changed the MP4");

    let streamed = dir.path().join("streamed.mp4");
    let file = std::fs::File::create(&streamed).unwrap();
    ok(&cadence(&[&base[..], &["--window", "1", "-o", "-"]].concat(), Stdio::from(file)));
    let (progressive, has_audio, fragments) = video_samples(&whole);
    assert!(has_audio && fragments == 0);
    let (fragmented, has_audio, fragments) = video_samples(&streamed);
    assert!(has_audio, "the stream has no audio track");
    let gop = cadence_media::idr_period(cadence_media::FrameRate::whole(25)) as usize;
    assert_eq!(fragments, progressive.len().div_ceil(gop), "one fragment per GOP of {gop} frames");
    assert_eq!(fragmented.len(), progressive.len());
    assert!(fragmented == progressive, "the fragmented stream's H.264 samples differ from the file's");
    // And it decodes: every frame.
    let decoded = Mp4Reader::open(&streamed).unwrap().decode_video().unwrap();
    assert_eq!(decoded.frames.len(), progressive.len());
    // The windowed stream reads the WAV as it goes; one window decodes it whole first: the same
    // bytes, audio track included.
    let whole_fragmented = dir.path().join("whole-fragmented.mp4");
    let args = ["--window", "0", "--fragmented", "-o", whole_fragmented.to_str().unwrap()];
    ok(&cadence(&[&base[..], &args].concat(), Stdio::null()));
    assert!(
        std::fs::read(&whole_fragmented).unwrap() == std::fs::read(&streamed).unwrap(),
        "the stream read as it goes differs from the whole clip's fragmented MP4"
    );
}

/// `--realtime` holds the frames to the clip's clock: the render takes at least the clip's
/// duration, and reports the late frames.
#[test]
fn realtime_output_takes_the_clips_duration() {
    let dir = tempfile::tempdir().unwrap();
    let (audio, img) = (speech(), avatar(dir.path()));
    let out = dir.path().join("live.mp4");
    let t = std::time::Instant::now();
    let o = cadence(
        &[
            "--audio",
            audio.to_str().unwrap(),
            "--avatar",
            img.to_str().unwrap(),
            "--fragmented",
            "--realtime",
            "--json",
            "-o",
            out.to_str().unwrap(),
        ],
        Stdio::piped(),
    );
    ok(&o);
    let wall = t.elapsed().as_secs_f64();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let frames = v["frames"].as_u64().unwrap() as f64;
    assert!(wall >= (frames - 1.0) / 25.0, "{frames} frames paced at 25 fps took only {wall:.2} s");
    assert!(v["late_frames"].is_u64() && v["fragmented"] == true, "{v}");
    assert!(v["first_fragment_ms"].as_f64().unwrap() >= v["first_frame_ms"].as_f64().unwrap());
}

#[test]
fn streaming_flags_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let (audio, img) = (speech(), avatar(dir.path()));
    let base = ["--audio", audio.to_str().unwrap(), "--avatar", img.to_str().unwrap()];
    let out = dir.path().join("x.mp4");
    for (args, says) in [
        (vec!["-o", "-", "--json"], "--json"),
        (vec!["-o", out.to_str().unwrap(), "--realtime"], "--realtime"),
        (vec!["-o", out.to_str().unwrap(), "--window=-1"], "window length"),
    ] {
        let o = cadence(&[&base[..], &args].concat(), Stdio::piped());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} wrote to standard output");
        assert!(!out.exists());
    }
}
