mod common;

use std::process::Command;
use std::time::Instant;

use cadence_media::{probe, Audio, EncoderKind, MediaError, VideoWriter};
use common::*;

/// A smooth moving NV12 test pattern (Y gradient that scrolls, UV varying across the frame).
fn nv12_frame(w: usize, h: usize, t: usize) -> Vec<u8> {
    let mut f = vec![0u8; w * h * 3 / 2];
    for y in 0..h {
        for x in 0..w {
            f[y * w + x] = (16 + ((x + 2 * t) * 200 / w + y * 20 / h) % 220) as u8;
        }
    }
    let uv = &mut f[w * h..];
    for y in 0..h / 2 {
        for x in 0..w / 2 {
            uv[y * w + 2 * x] = (64 + x * 128 / (w / 2)) as u8; // U rises left to right
            uv[y * w + 2 * x + 1] = (192 - y * 128 / (h / 2)) as u8; // V falls top to bottom
        }
    }
    f
}

fn tone_audio(secs: f64) -> Audio {
    let n = (secs * 16_000.0) as usize;
    // A chirp from 200 Hz to 2 kHz: unlike a steady tone it has one best alignment.
    let (f0, f1) = (200.0f64, 2000.0f64);
    Audio::from_samples_16k(
        (0..n)
            .map(|i| {
                let t = i as f64 / 16_000.0;
                let phase = 2.0 * std::f64::consts::PI * (f0 * t + (f1 - f0) * t * t / (2.0 * secs));
                (0.3 * phase.sin()) as f32
            })
            .collect(),
    )
}

fn write_clip(path: &std::path::Path, w: u32, h: u32, frames: usize, audio: Option<&Audio>) -> Vec<Vec<u8>> {
    let mut vw = VideoWriter::create(path, w, h, 25, EncoderKind::OpenH264, audio).unwrap();
    let mut input = Vec::new();
    for t in 0..frames {
        let f = nv12_frame(w as usize, h as usize, t);
        vw.push_nv12(&f).unwrap();
        input.push(f);
    }
    let stats = vw.finish().unwrap();
    assert_eq!(stats.frames, frames as u64);
    assert_eq!(stats.encoder, "openh264");
    assert_eq!(stats.bytes, std::fs::metadata(path).unwrap().len());
    assert_eq!(stats.has_audio, audio.is_some());
    input
}

#[test]
fn mp4_with_audio_probes_right() {
    let dir = tmp_dir("mp4-probe");
    let path = dir.join("out.mp4");
    let audio = tone_audio(64.0 / 25.0);
    write_clip(&path, 256, 256, 64, Some(&audio));
    let info = probe(&path).unwrap();
    assert_eq!(info.video_codec, "h264");
    assert_eq!((info.width, info.height), (256, 256));
    assert!((info.fps - 25.0).abs() < 1e-9, "fps {}", info.fps);
    assert_eq!(info.frames, 64);
    assert!((info.duration_s - 2.56).abs() < 1e-9);
    assert!(info.has_audio);
    assert_eq!(info.audio_codec.as_deref(), Some("aac"));
    assert_eq!(info.audio_sample_rate, Some(16_000));
    assert_eq!(info.audio_channels, Some(1));
    assert!(info.keyframes >= 2, "IDR every 2 s: {} keyframes", info.keyframes);
}

#[test]
fn mp4_without_audio_and_portrait_size() {
    let dir = tmp_dir("mp4-noaudio");
    let path = dir.join("out.mp4");
    write_clip(&path, 360, 640, 10, None);
    let info = probe(&path).unwrap();
    assert_eq!((info.width, info.height, info.frames), (360, 640, 10));
    assert!(!info.has_audio);
    assert_eq!(info.audio_codec, None);
}

#[test]
fn stereo_44k1_wav_track() {
    let dir = tmp_dir("mp4-stereo");
    let wav = dir.join("a.wav");
    write_wav(&wav, 44_100, 2, 16, false, 44_100, sine(330.0, 44_100, 0.4));
    let audio = cadence_media::load_wav(&wav).unwrap();
    let path = dir.join("out.mp4");
    write_clip(&path, 128, 96, 25, Some(&audio));
    let info = probe(&path).unwrap();
    assert_eq!(info.audio_sample_rate, Some(44_100));
    assert_eq!(info.audio_channels, Some(2));
    assert_eq!(info.frames, 25);
}

#[test]
fn bad_sizes_and_buffers_rejected() {
    let dir = tmp_dir("mp4-bad");
    let p = dir.join("x.mp4");
    for (w, h) in [(255, 256), (256, 255), (0, 256), (8, 8), (4000, 256)] {
        let e = VideoWriter::create(&p, w, h, 25, EncoderKind::OpenH264, None).err().unwrap();
        assert!(matches!(e, MediaError::InvalidInput(_)), "{w}x{h}: {e:?}");
    }
    let e = VideoWriter::create(&p, 256, 256, 0, EncoderKind::OpenH264, None).err().unwrap();
    assert!(matches!(e, MediaError::InvalidInput(_)));
    let mut vw = VideoWriter::create(&p, 256, 256, 25, EncoderKind::OpenH264, None).unwrap();
    let e = vw.push_nv12(&[0u8; 100]).unwrap_err();
    assert!(e.to_string().contains("expected 98304"), "{e}");
    // Finishing with no frames is an error, not a broken file passed as good.
    assert!(vw.finish().is_err());
    let e = VideoWriter::create(dir.join("nodir/x.mp4"), 256, 256, 25, EncoderKind::OpenH264, None).err().unwrap();
    assert!(matches!(e, MediaError::Io { .. }));
}

#[cfg(not(feature = "ffmpeg"))]
#[test]
fn ffmpeg_encoders_need_the_feature() {
    let dir = tmp_dir("mp4-nofeature");
    for k in [EncoderKind::X264, EncoderKind::Nvenc] {
        let e = VideoWriter::create(dir.join("x.mp4"), 256, 256, 25, k, None).err().unwrap();
        assert!(matches!(e, MediaError::EncoderUnavailable(_)));
        assert!(e.to_string().contains("--features ffmpeg"), "{e}");
    }
    assert_eq!(EncoderKind::available(), vec![EncoderKind::OpenH264]);
}

#[test]
fn probe_rejects_non_mp4() {
    let dir = tmp_dir("probe-bad");
    let p = dir.join("x.mp4");
    std::fs::write(&p, b"not an mp4 file at all").unwrap();
    assert!(probe(&p).is_err());
    // A truncated MP4 (moov cut off) is an error too.
    let good = dir.join("good.mp4");
    write_clip(&good, 64, 64, 5, None);
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 40]).unwrap();
    assert!(probe(&p).is_err());
}

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

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>() / a.len() as f64;
    10.0 * (255.0f64 * 255.0 / mse.max(1e-12)).log10()
}

/// Checks the file with Debian's ffprobe and decodes it with ffmpeg; skipped (with a note)
/// where they are not installed.
#[test]
fn ffprobe_and_ffmpeg_decode_agree() {
    if !have("ffprobe") || !have("ffmpeg") {
        eprintln!("NOTE: ffprobe/ffmpeg not installed: skipping the ffprobe check (apt-get install ffmpeg)");
        return;
    }
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
    // Best alignment within +-5 ms should be 0 (priming samples removed by the edit list).
    let corr = |lag: i64| -> f64 {
        (2000..30000).map(|i| dec[i] as f64 * audio.samples_16k[(i as i64 + lag) as usize] as f64).sum()
    };
    let best = (-80..=80).max_by(|&a, &b| corr(a).partial_cmp(&corr(b)).unwrap()).unwrap();
    assert!(best.abs() <= 2, "audio is offset by {best} samples");
}

/// Encode speed at 256x256 and 1080x1920 for each encoder in the build
/// (run with --ignored --nocapture).
#[test]
#[ignore]
fn encode_speed() {
    let dir = tmp_dir("mp4-speed");
    for kind in EncoderKind::available() {
        for (w, h, n) in [(256u32, 256u32, 250usize), (1080, 1920, 50)] {
            let frames: Vec<Vec<u8>> = (0..n).map(|t| nv12_frame(w as usize, h as usize, t)).collect();
            let path = dir.join(format!("{kind}-{w}x{h}.mp4"));
            let t = Instant::now();
            let mut vw = match VideoWriter::create(&path, w, h, 25, kind, None) {
                Ok(vw) => vw,
                Err(e) => {
                    println!("{kind}: skipped: {e}");
                    break;
                }
            };
            for f in &frames {
                vw.push_nv12(f).unwrap();
            }
            let s = vw.finish().unwrap();
            println!(
                "{kind} {w}x{h}: {n} frames, encode {:.1} frames/s (wall incl. mux {:.1} frames/s), {} bytes",
                n as f64 / s.encode_s,
                n as f64 / t.elapsed().as_secs_f64(),
                s.bytes
            );
        }
    }
}

#[cfg(feature = "ffmpeg")]
#[test]
fn x264_through_ffmpeg() {
    let dir = tmp_dir("mp4-x264");
    let path = dir.join("out.mp4");
    let audio = tone_audio(64.0 / 25.0);
    let mut vw = VideoWriter::create(&path, 256, 256, 25, EncoderKind::X264, Some(&audio)).unwrap();
    for t in 0..64 {
        vw.push_nv12(&nv12_frame(256, 256, t)).unwrap();
    }
    let s = vw.finish().unwrap();
    assert_eq!((s.frames, s.encoder.as_str()), (64, "x264"));
    let info = probe(&path).unwrap();
    assert_eq!(info.video_codec, "h264");
    assert_eq!((info.width, info.height, info.frames), (256, 256, 64));
    assert!((info.fps - 25.0).abs() < 1e-9);
    assert_eq!(info.audio_codec.as_deref(), Some("aac"));
    if have("ffprobe") {
        let j = ffprobe_json(&path);
        let v = &j["streams"].as_array().unwrap().iter().find(|s| s["codec_type"] == "video").unwrap().clone();
        assert_eq!(v["nb_read_frames"], "64");
        assert_eq!(v["r_frame_rate"], "25/1");
    }
}

#[cfg(feature = "ffmpeg")]
#[test]
fn nvenc_works_or_says_why_not() {
    let dir = tmp_dir("mp4-nvenc");
    let path = dir.join("out.mp4");
    match VideoWriter::create(&path, 256, 256, 25, EncoderKind::Nvenc, None) {
        Ok(mut vw) => {
            for t in 0..30 {
                vw.push_nv12(&nv12_frame(256, 256, t)).unwrap();
            }
            let s = vw.finish().unwrap();
            assert_eq!(s.frames, 30);
            assert_eq!(probe(&path).unwrap().frames, 30);
            println!("nvenc: encoded 30 frames");
        }
        Err(e) => {
            let m = e.to_string();
            println!("nvenc unavailable here: {m}");
            assert!(matches!(e, MediaError::EncoderUnavailable(_)), "{e:?}");
            assert!(m.contains("libnvidia-encode"), "{m}");
            assert!(!m.contains('\n'));
        }
    }
}
