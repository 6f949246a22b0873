//! The system-tools test group: cadence's MP4 checked by Debian's ffprobe and decoded by ffmpeg,
//! an oracle independent of this crate's own reader. Needs `ffmpeg` on PATH (apt-get install
//! ffmpeg), so the tests are ignored by default, and fail, not skip, when run without it:
//! `cargo test --release --workspace --test ffmpeg_oracle -- --ignored` (`.ci/run` does, after
//! installing ffmpeg; `--workspace` builds with the test command's features, so nothing is
//! compiled again).

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
#[ignore = "needs ffmpeg and ffprobe on PATH (apt-get install ffmpeg)"]
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

/// A fragmented MP4 (`FragmentedWriter`: init segment, then one `moof`+`mdat` per GOP) at NTSC's
/// 30000/1001 with AAC: ffprobe sees both streams with exact timing and a keyframe at the start
/// of every fragment, ffmpeg decodes it without a complaint, every frame comes back close to its
/// input, and the audio comes back aligned, for its duration.
#[test]
#[ignore = "needs ffmpeg and ffprobe on PATH (apt-get install ffmpeg)"]
fn fragmented_mp4_probes_and_decodes() {
    use cadence_media::{AudioFormat, EncoderKind, FragmentedWriter, FrameRate};
    let dir = tmp_dir("fmp4-ffprobe");
    let path = dir.join("frag.mp4");
    let (w, h, n) = (160usize, 128usize, 130usize);
    let fps = FrameRate { num: 30_000, den: 1001 };
    let secs = n as f64 * 1001.0 / 30_000.0;
    let audio = tone_audio(secs);
    let pcm = &audio.track.samples;
    let file = std::fs::File::create(&path).unwrap();
    let fmt = AudioFormat { sample_rate: 16_000, channels: 1 };
    let mut fw = FragmentedWriter::new(
        file,
        path.display().to_string(),
        w as u32,
        h as u32,
        fps,
        EncoderKind::OpenH264,
        Some(fmt),
    )
    .unwrap();
    let mut input = Vec::new();
    let mut sent = 0;
    for t in 0..n {
        let upto = (((t + 1) as u64 * 16_000 * 1001 / 30_000) as usize).min(pcm.len());
        fw.push_audio(&pcm[sent..upto]).unwrap();
        sent = upto;
        let f = nv12_frame(w, h, t);
        fw.push_nv12(&f).unwrap();
        input.push(f);
    }
    fw.push_audio(&pcm[sent..]).unwrap();
    let (stats, _) = fw.finish().unwrap();
    assert_eq!((stats.frames, stats.fragments), (130, 3));

    let j = ffprobe_json(&path);
    let streams = j["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 2, "{streams:?}");
    let v = streams.iter().find(|s| s["codec_type"] == "video").expect("video stream");
    assert_eq!(v["codec_name"], "h264");
    assert_eq!((v["width"].as_u64(), v["height"].as_u64()), (Some(w as u64), Some(h as u64)));
    assert_eq!(v["r_frame_rate"], "30000/1001");
    assert_eq!(v["avg_frame_rate"], "30000/1001");
    assert_eq!(v["time_base"], "1/30000");
    assert_eq!(v["nb_read_frames"], "130");
    let vdur: f64 = v["duration"].as_str().unwrap().parse().unwrap();
    assert!((vdur - secs).abs() < 1e-6, "video duration {vdur}, expected {secs}");
    let a = streams.iter().find(|s| s["codec_type"] == "audio").expect("audio stream");
    assert_eq!(a["codec_name"], "aac");
    assert_eq!(a["profile"], "LC");
    assert_eq!(a["sample_rate"], "16000");
    assert_eq!(a["channels"], 1);
    // ffmpeg reads the edit list of a fragmented file as a negative start (the priming plays
    // before time 0) rather than trimming it: the audio must end with the input, give or take
    // the last access unit's padding.
    let adur: f64 = a["duration"].as_str().unwrap().parse().unwrap();
    let astart: f64 = a["start_time"].as_str().unwrap().parse().unwrap();
    assert!(astart < 0.0 && a["start_pts"].as_i64().unwrap() < 0, "the priming is not before 0: {a:?}");
    let aend = astart + adur;
    assert!(aend >= secs - 1e-6 && aend < secs + 1024.0 / 16_000.0, "audio ends at {aend}, the input at {secs}");
    println!(
        "ffprobe: {} frames at {}, video {vdur} s, audio {adur} s from {astart} s",
        v["nb_read_frames"], v["r_frame_rate"]
    );

    // The keyframes ffprobe reports (its H.264 parser's IDRs, not the trun flags, which
    // tests/fragmented.rs checks): the first frame of each fragment.
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v", "-show_entries", "packet=flags", "-of", "csv=p=0"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let keys: Vec<usize> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, f)| f.starts_with('K'))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(keys, [0, 60, 120]);

    // ffmpeg decodes every packet of both streams with no error or warning.
    let out = Command::new("ffmpeg").args(["-v", "error", "-i"]).arg(&path).args(["-f", "null", "-"]).output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "ffmpeg: {}", String::from_utf8_lossy(&out.stderr));

    // Passthrough: the file starts at the audio's -0.128 s, and a constant-rate output would
    // fill the video's first 0.128 s with copies of its first frame.
    let raw = dir.join("back.nv12");
    let st = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-i"])
        .arg(&path)
        .args(["-map", "0:v", "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "nv12"])
        .arg(&raw)
        .status()
        .unwrap();
    assert!(st.success());
    let back = std::fs::read(&raw).unwrap();
    let fl = w * h * 3 / 2;
    assert_eq!(back.len(), n * fl, "decoded frames");
    for (t, f) in input.iter().enumerate() {
        let d = &back[t * fl..(t + 1) * fl];
        let (py, puv) = (psnr(&f[..w * h], &d[..w * h]), psnr(&f[w * h..], &d[w * h..]));
        assert!(py > 35.0 && puv > 35.0, "frame {t}: PSNR Y {py:.1} UV {puv:.1}");
    }

    // The audio from time 0 on, as a player keyed on timestamps plays it (-copyts keeps the
    // file's times, atrim drops the priming before 0).
    let pcm_out = dir.join("back.f32");
    let st = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-copyts", "-i"])
        .arg(&path)
        .args(["-map", "0:a", "-af", "atrim=start=0", "-f", "f32le", "-ac", "1", "-ar", "16000"])
        .arg(&pcm_out)
        .status()
        .unwrap();
    assert!(st.success());
    let bytes = std::fs::read(&pcm_out).unwrap();
    let dec: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert!(
        dec.len() >= audio.samples_16k.len() && dec.len() < audio.samples_16k.len() + 1024,
        "{} decoded vs {} in",
        dec.len(),
        audio.samples_16k.len()
    );
    assert_aligned(&dec, &audio.samples_16k);
}
