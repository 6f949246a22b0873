//! The `system-tools` test group: cadence's MP4 checked by Debian's ffprobe and decoded by ffmpeg,
//! an oracle independent of this crate's own reader. Needs `ffmpeg` on PATH (apt-get install
//! ffmpeg) and fails, not skips, without it. Run with
//! `cargo test --release -p cadence-media --features system-tools --test ffmpeg_oracle`
//! (`.ci/run` does, after installing ffmpeg).

mod common;

use common::*;
use std::process::Command;

fn ffprobe_json(path: &std::path::Path) -> serde_json::Value {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-show_streams", "-show_format", "-of", "json"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "ffprobe: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "ffprobe complained: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Checks the file with Debian's ffprobe and decodes it with ffmpeg.
#[test]
fn ffprobe_and_ffmpeg_decode_agree() {
    let dir = tmp_dir("mp4-ffprobe");
    let path = dir.join("out.mp4");
    let audio = tone_audio(64.0 / 25.0);
    let input = write_clip(&path, 256, 256, 64, Some(&audio));
    let j = ffprobe_json(&path);
    let streams = j["streams"].as_array().unwrap();
    let v = streams.iter().find(|s| s["codec_type"] == "video").expect("video stream");
    assert_eq!(v["codec_name"], "h264");
    assert_eq!(v["width"], 256);
    assert_eq!(v["height"], 256);
    assert_eq!(v["r_frame_rate"], "25/1");
    assert_eq!(v["avg_frame_rate"], "25/1");
    assert_eq!(v["nb_frames"], "64");
    assert_eq!(v["nb_read_frames"], "64");
    assert_eq!(v["pix_fmt"], "yuv420p");
    let a = streams.iter().find(|s| s["codec_type"] == "audio").expect("audio stream");
    assert_eq!(a["codec_name"], "aac");
    assert_eq!(a["sample_rate"], "16000");
    let adur: f64 = a["duration"].as_str().unwrap().parse().unwrap();
    assert!((adur - 2.56).abs() < 0.01, "audio duration {adur}");
    println!(
        "ffprobe: video {} {}x{} {} fps {} frames; audio {} {} Hz {} s",
        v["codec_name"],
        v["width"],
        v["height"],
        v["r_frame_rate"],
        v["nb_read_frames"],
        a["codec_name"],
        a["sample_rate"],
        a["duration"]
    );

    // Decode back to NV12 and compare with what went in (catches swapped or misplaced chroma).
    let raw = dir.join("back.nv12");
    let st = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-i"])
        .arg(&path)
        .args(["-f", "rawvideo", "-pix_fmt", "nv12"])
        .arg(&raw)
        .status()
        .unwrap();
    assert!(st.success());
    let back = std::fs::read(&raw).unwrap();
    let fl = 256 * 256 * 3 / 2;
    assert_eq!(back.len(), 64 * fl);
    for (t, f) in input.iter().enumerate() {
        let d = &back[t * fl..(t + 1) * fl];
        let py = psnr(&f[..256 * 256], &d[..256 * 256]);
        let puv = psnr(&f[256 * 256..], &d[256 * 256..]);
        assert!(py > 30.0 && puv > 30.0, "frame {t}: PSNR Y {py:.1} UV {puv:.1}");
    }

    // The audio decodes to the tone, delay-compensated: compare with the input.
    let pcm = dir.join("back.f32");
    let st = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-i"])
        .arg(&path)
        .args(["-map", "0:a", "-f", "f32le", "-ac", "1", "-ar", "16000"])
        .arg(&pcm)
        .status()
        .unwrap();
    assert!(st.success());
    let bytes = std::fs::read(&pcm).unwrap();
    let dec: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert!(
        (dec.len() as i64 - audio.samples_16k.len() as i64).abs() <= 16,
        "{} vs {}",
        dec.len(),
        audio.samples_16k.len()
    );
    assert_aligned(&dec, &audio.samples_16k);
}
