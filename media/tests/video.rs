mod common;

use std::time::Instant;

use cadence_media::{probe, EncoderKind, FrameRate, MediaError, Mp4Reader, VideoWriter};
use common::*;

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
    for (w, h) in [(255, 256), (256, 255), (0, 256), (8, 8), (4000, 256), (2880, 2880), (2162, 2162)] {
        let e = VideoWriter::create(&p, w, h, FrameRate::whole(25), EncoderKind::OpenH264, None).err().unwrap();
        assert!(matches!(e, MediaError::InvalidInput(_)), "{w}x{h}: {e:?}");
    }
    // The encoder's largest frames, landscape and portrait.
    for (w, h) in [(3840, 2160), (2160, 3840)] {
        assert!(VideoWriter::create(&p, w, h, FrameRate::whole(25), EncoderKind::OpenH264, None).is_ok(), "{w}x{h}");
    }
    let e = cadence_media::check_frame_size(2880, 2880).unwrap_err();
    assert!(e.contains("at most 3840x2160 or 2160x3840"), "{e}");
    let e = VideoWriter::create(&p, 256, 256, FrameRate::whole(0), EncoderKind::OpenH264, None).err().unwrap();
    assert!(matches!(e, MediaError::InvalidInput(_)));
    let mut vw = VideoWriter::create(&p, 256, 256, FrameRate::whole(25), EncoderKind::OpenH264, None).unwrap();
    let e = vw.push_nv12(&[0u8; 100]).unwrap_err();
    assert!(e.to_string().contains("expected 98304"), "{e}");
    // Finishing with no frames is an error, not a broken file passed as good.
    assert!(vw.finish().is_err());
    let e = VideoWriter::create(dir.join("nodir/x.mp4"), 256, 256, FrameRate::whole(25), EncoderKind::OpenH264, None)
        .err()
        .unwrap();
    assert!(matches!(e, MediaError::Io { .. }));
}

#[cfg(not(feature = "ffmpeg"))]
#[test]
fn ffmpeg_encoders_need_the_feature() {
    let dir = tmp_dir("mp4-nofeature");
    for k in [EncoderKind::X264, EncoderKind::Nvenc] {
        let e = VideoWriter::create(dir.join("x.mp4"), 256, 256, FrameRate::whole(25), k, None).err().unwrap();
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

/// Decodes the file in-process (OpenH264 and FDK AAC through `Mp4Reader`): every frame is
/// there and matches what went in (catches swapped or misplaced chroma, dropped or reordered
/// frames), and the audio decodes to the chirp with the priming samples removed by the edit list.
#[test]
fn decoded_back_matches_the_input() {
    let dir = tmp_dir("mp4-decode");
    let path = dir.join("out.mp4");
    let audio = tone_audio(64.0 / 25.0);
    let input = write_clip(&path, 256, 256, 64, Some(&audio));
    let mut r = Mp4Reader::open(&path).unwrap();
    let video = r.decode_video().unwrap();
    assert_eq!((video.width, video.height, video.frames.len()), (256, 256, 64));
    for (t, (f, d)) in input.iter().zip(&video.frames).enumerate() {
        let py = psnr(&f[..256 * 256], &d[..256 * 256]);
        let puv = psnr(&f[256 * 256..], &d[256 * 256..]);
        assert!(py > 30.0 && puv > 30.0, "frame {t}: PSNR Y {py:.1} UV {puv:.1}");
        // Each decoded frame is closer to its own input than to its neighbours' (order kept).
        for n in [t.wrapping_sub(1), t + 1] {
            if let Some(other) = input.get(n) {
                assert!(psnr(&other[..256 * 256], &d[..256 * 256]) < py, "frame {t} looks like frame {n}");
            }
        }
    }
    let a = r.decode_audio().unwrap().expect("audio track");
    assert_eq!((a.sample_rate, a.channels), (16_000, 1));
    let dec = a.first_channel();
    assert!(
        (dec.len() as i64 - audio.samples_16k.len() as i64).abs() <= 16,
        "{} vs {}",
        dec.len(),
        audio.samples_16k.len()
    );
    assert_aligned(&dec, &audio.samples_16k);
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
            let mut vw = match VideoWriter::create(&path, w, h, FrameRate::whole(25), kind, None) {
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
    let mut vw = VideoWriter::create(&path, 256, 256, FrameRate::whole(25), EncoderKind::X264, Some(&audio)).unwrap();
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
    assert_eq!(Mp4Reader::open(&path).unwrap().decode_video().unwrap().frames.len(), 64);
}

#[cfg(feature = "ffmpeg")]
#[test]
fn nvenc_works_or_says_why_not() {
    let dir = tmp_dir("mp4-nvenc");
    let path = dir.join("out.mp4");
    match VideoWriter::create(&path, 256, 256, FrameRate::whole(25), EncoderKind::Nvenc, None) {
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

/// The sample table is checked against the file before anything is read or allocated from it: a
/// chunk offset moved past the end, or a sample count larger than the file, is a clear error.
#[test]
fn corrupt_sample_tables_are_refused() {
    let dir = tmp_dir("mp4-corrupt");
    let good = dir.join("good.mp4");
    write_clip(&good, 64, 64, 5, None);
    let bytes = std::fs::read(&good).unwrap();
    let find = |tag: &[u8]| bytes.windows(4).position(|w| w == tag).unwrap();
    // stco: size, 'stco', version/flags, entry count, then the first chunk offset.
    let mut moved = bytes.clone();
    let first = find(b"stco") + 12;
    moved[first..first + 4].copy_from_slice(&0x7fff_fff0u32.to_be_bytes());
    let p = dir.join("moved.mp4");
    std::fs::write(&p, &moved).unwrap();
    let e = Mp4Reader::open(&p).unwrap().decode_video().unwrap_err().to_string();
    assert!(e.contains("lies outside the file"), "{e}");
    // stsz: size, 'stsz', version/flags, sample size, then the sample count.
    let mut many = bytes.clone();
    let count = find(b"stsz") + 12;
    many[count..count + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    let p = dir.join("many.mp4");
    std::fs::write(&p, &many).unwrap();
    match Mp4Reader::open(&p) {
        Err(e) => println!("refused while parsing the moov: {e}"),
        Ok(mut r) => {
            let e = r.decode_video().unwrap_err().to_string();
            assert!(e.contains("samples") || e.contains("outside"), "{e}");
        }
    }
}

/// NTSC's 29.97 is 30000/1001 exactly: every frame lasts 1001/30000 s in the file.
#[test]
fn ntsc_frame_rate_is_exact() {
    let rate = FrameRate::parse("29.97").unwrap();
    assert_eq!(rate, FrameRate { num: 30_000, den: 1001 });
    let dir = tmp_dir("mp4-ntsc");
    let path = dir.join("out.mp4");
    let mut vw = VideoWriter::create(&path, 64, 64, rate, EncoderKind::OpenH264, None).unwrap();
    for t in 0..30 {
        vw.push_nv12(&nv12_frame(64, 64, t)).unwrap();
    }
    vw.finish().unwrap();
    let info = probe(&path).unwrap();
    assert!((info.fps - 30_000.0 / 1001.0).abs() < 1e-9, "fps {}", info.fps);
    assert!((info.duration_s - 30.0 * 1001.0 / 30_000.0).abs() < 1e-9, "duration {}", info.duration_s);
    assert_eq!(Mp4Reader::open(&path).unwrap().decode_video().unwrap().frames.len(), 30);
}

#[test]
fn frame_rates_parse_exactly_or_not_at_all() {
    let p = |s: &str| FrameRate::parse(s).map(|r| (r.num, r.den));
    assert_eq!(p("25"), Ok((25, 1)));
    assert_eq!(p("12.5"), Ok((25, 2)));
    assert_eq!(p("59.94"), Ok((60_000, 1001)));
    assert_eq!(p("23.976"), Ok((24_000, 1001)));
    assert_eq!(p("24000/1001"), Ok((24_000, 1001)));
    assert_eq!(p("50/2"), Ok((25, 1)));
    for bad in ["0", "-5", "NaN", "inf", "25fps", "1/0", "241", "29.9701", "", "4294967296", ".5"] {
        assert!(FrameRate::parse(bad).is_err(), "{bad} accepted");
    }
}

/// The H.264 streams OpenH264 cannot decode are refused from the container, before any frame is
/// decoded, naming the profile and how to re-encode: B-frames (libx264's default, in a
/// progressive and in a fragmented MP4) and a 10-bit profile. The same profile without
/// B-frames decodes.
#[test]
fn h264_that_openh264_cannot_decode_is_refused_by_name() {
    let fixture = |name: &str| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/h264").join(name);
    for (name, says) in [
        ("high_bframes.mp4", "High profile with B-frames"),
        ("high_bframes_fragmented.mp4", "High profile with B-frames"),
        ("high10.mp4", "High 10 profile"),
    ] {
        let e = cadence_media::avatar_video_info(fixture(name)).unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("-bf 0 -pix_fmt yuv420p"), "{name}: {e}");
        let e = Mp4Reader::open(fixture(name)).unwrap().decode_video().unwrap_err().to_string();
        assert!(e.contains(says), "{name}: {e}");
        // The library's debugging text stays out of the message.
        assert!(!e.contains("Backtraces") && !e.contains("Native:"), "{name}: {e}");
    }
    let info = cadence_media::avatar_video_info(fixture("high_no_bframes.mp4")).unwrap();
    assert_eq!((info.width, info.height, info.frames), (96, 64, 12));
    let video = Mp4Reader::open(fixture("high_no_bframes.mp4")).unwrap().decode_video().unwrap();
    assert_eq!(video.frames.len(), 12);
}
