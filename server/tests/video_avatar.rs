//! Video avatars over HTTP: an H.264 MP4 sent as `/generate`'s `video` (multipart and JSON) or
//! registered with `/v1/avatars` renders each output frame over avatar frame cycle(k)
//! (MuseTalk's forward-then-backward order), and the three ways give the same MP4 bytes; a bad
//! MP4 is a 422 before any engine work. The avatar clips are written here with cadence's own
//! MP4 writer (no system tool), as `cli/tests/video_avatar.rs` does.

mod common;

use base64::Engine as _;
use cadence_media::Mp4Reader;
use common::*;

const W: u32 = VIDEO_W;
const H: u32 = VIDEO_H;
/// The face box of every frame, as the `face_box` field gives it.
const FACE_FIELD: &str = "32,40,64,80";
/// Luma level of each avatar frame's background: far apart, so that a frame's background is
/// recognised in the output whatever the codec's rounding.
const LEVELS: [u8; 3] = [60, 120, 180];

/// The video frames of an MP4, decoded (NV12).
fn decode(mp4: &[u8]) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v.mp4");
    std::fs::write(&p, mp4).unwrap();
    Mp4Reader::open(&p).unwrap().decode_video().unwrap().frames
}

/// Mean absolute difference of the luma outside the face box.
fn background_distance(a: &[u8], b: &[u8]) -> f64 {
    let (w, h) = (W as usize, H as usize);
    let (mut sum, mut n) = (0u64, 0u64);
    for y in 0..h {
        for x in (0..w).filter(|&x| !in_video_face(x, y)) {
            sum += (a[y * w + x] as i64 - b[y * w + x] as i64).unsigned_abs();
            n += 1;
        }
    }
    sum as f64 / n as f64
}

/// MuseTalk's order, written out as its code builds it (`frame_list + frame_list[::-1]`,
/// indexed `k % len`), independently of cadence's `cycle_index`.
fn musetalk_cycle(k: usize, n: usize) -> usize {
    let list: Vec<usize> = (0..n).chain((0..n).rev()).collect();
    list[k % list.len()]
}

/// Each output frame's background is avatar frame cycle(k)'s (as the avatar itself decodes),
/// and far from the other frames'.
fn assert_backgrounds_cycle(output: &[Vec<u8>], avatar: &[Vec<u8>]) {
    for (k, frame) in output.iter().enumerate() {
        let d: Vec<f64> = avatar.iter().map(|a| background_distance(frame, a)).collect();
        let want = musetalk_cycle(k, avatar.len());
        assert!(d[want] < 4.0, "output frame {k}: background {:.2} from avatar frame {want} ({d:?})", d[want]);
        for (a, &x) in d.iter().enumerate() {
            assert!(a == want || x > 30.0, "output frame {k}: background close to avatar frame {a} too ({d:?})");
        }
    }
}

#[test]
fn a_video_avatar_renders_each_frame_over_its_avatar_frame_sent_registered_or_in_json() {
    let _r = render_lock();
    let s = start(&[]);
    let c = client();
    let clip = video_avatar(&LEVELS, W, H);
    let audio = std::fs::read(fixture("goodnight")).unwrap();

    // Sent with the request (multipart), under a name and type that say nothing: the bytes decide.
    let f = form(audio.clone(), &[("stride", "3"), ("face_box", FACE_FIELD)])
        .part("video", part(clip.clone(), "avatar.bin", "application/octet-stream"));
    let r = c.post(s.url("/generate")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text());
    let frames: usize = header(&r, "x-frames").parse().unwrap();
    assert!(header(&r, "server-timing").contains("desc=\"prepared\""), "{}", header(&r, "server-timing"));
    let direct = r.bytes().unwrap().to_vec();
    let info = probe(&direct);
    // 2.0 s at 25 fps.
    assert_eq!((info.width, info.height, info.frames as usize, frames), (W, H, 51, 51));
    assert!(info.has_audio);
    let output = decode(&direct);
    assert_eq!(output.len(), frames);
    assert_backgrounds_cycle(&output, &decode(&clip));
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 1.0);

    // Registered (as `image`), then rendered by id: prepared once, the same bytes.
    let reg = reqwest::blocking::multipart::Form::new()
        .text("face_box", FACE_FIELD)
        .part("image", part(clip.clone(), "clip.mp4", "video/mp4"));
    let r = c.post(s.url("/v1/avatars")).multipart(reg).send().unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text());
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!((v["kind"].as_str(), v["frames"].as_u64(), v["width"].as_u64()), (Some("video"), Some(3), Some(128)));
    assert_eq!(v["face_box"], serde_json::json!([32, 40, 64, 80]));
    let id = v["avatar_id"].as_str().unwrap().to_string();
    // The same file as `video`: the same content, the same id, nothing prepared.
    let again = reqwest::blocking::multipart::Form::new()
        .text("face_box", FACE_FIELD)
        .part("video", part(clip.clone(), "clip.mp4", "video/mp4"));
    let r = c.post(s.url("/v1/avatars")).multipart(again).send().unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().unwrap()["avatar_id"], id.as_str());
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 2.0);
    let r = c.post(s.url("/generate")).multipart(form(audio.clone(), &[("stride", "3"), ("avatar_id", &id)])).send();
    let r = r.unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "server-timing").contains("desc=\"cached\""));
    assert!(r.bytes().unwrap() == direct, "the registered video avatar renders another video than the same clip sent");
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 2.0);
    assert_eq!(metric(&s, "cadence_avatar_cache_hits_total"), 1.0);

    // JSON, the clip in avatar_b64: the same bytes.
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let body =
        serde_json::json!({"audio_b64": b64(&audio), "avatar_b64": b64(&clip), "stride": 3, "face_box": FACE_FIELD});
    let r = c.post(s.url("/generate")).header("content-type", "application/json").body(body.to_string()).send();
    let r = r.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().unwrap() == direct, "the JSON variant renders another video than multipart");
    assert!(s.temp_entries().is_empty(), "{:?}", s.temp_entries());
}

/// Replaces the `moov` (the last box of cadence's progressive MP4) after `edit`.
fn rewrite_moov(bytes: &[u8], edit: impl FnOnce(&mut mp4_atom::Moov)) -> Vec<u8> {
    use mp4_atom::{Decode, Encode};
    let mut pos = 0usize;
    let mut moov = None;
    while pos + 8 <= bytes.len() {
        let mut size = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        if size == 1 {
            // A 64-bit size follows the type (cadence's writer sizes its mdat so).
            size = u64::from_be_bytes(bytes[pos + 8..pos + 16].try_into().unwrap()) as usize;
        }
        assert!(size >= 8, "an open-ended box at {pos}");
        if &bytes[pos + 4..pos + 8] == b"moov" {
            moov = Some((pos, size));
        }
        pos += size;
    }
    let (at, size) = moov.expect("a moov box");
    assert_eq!(at + size, bytes.len(), "the moov is the last box");
    let mut m = mp4_atom::Moov::decode(&mut &bytes[at..]).unwrap();
    edit(&mut m);
    let mut out = bytes[..at].to_vec();
    m.encode(&mut out).unwrap();
    out
}

fn video_trak(m: &mut mp4_atom::Moov) -> &mut mp4_atom::Trak {
    m.trak.iter_mut().find(|t| t.mdia.hdlr.handler == (*b"vide").into()).unwrap()
}

#[test]
fn bad_video_avatars_are_422_before_any_engine_work() {
    let s = start(&["--max-avatar-mb", "1"]);
    let c = client();
    let temp = s.temp.path().display().to_string();
    // The refusal's code and message; the message names the field, never the server's path.
    let refused = |r: reqwest::blocking::Response| -> (String, String) {
        assert_eq!(r.status(), 422);
        let v: serde_json::Value = r.json().unwrap();
        let message = v["error"]["message"].as_str().unwrap().to_string();
        assert!(!message.contains(&temp), "{message}");
        (v["error"]["code"].as_str().unwrap().to_string(), message)
    };
    let generate = |video: Vec<u8>, fields: &[(&str, &str)]| {
        let f = form(tone_wav(0.3), fields).part("video", part(video, "a.mp4", "video/mp4"));
        refused(c.post(s.url("/generate")).multipart(f).send().unwrap())
    };
    let expect = |(code, message): (String, String), want_code: &str, says: &str| {
        assert_eq!(code, want_code, "{message}");
        assert!(message.contains(says), "expected '{says}' in: {message}");
    };
    let clip = video_avatar(&LEVELS, W, H);

    // Corrupt H.264: every sample's bytes zeroed (the container is fine; the frames do not decode).
    let mut corrupt = clip.clone();
    let mdat = corrupt.windows(4).position(|w| w == b"mdat").unwrap() + 12;
    let moov = corrupt.windows(4).rposition(|w| w == b"moov").unwrap() - 4;
    corrupt[mdat..moov].fill(0);
    let (code, message) = generate(corrupt.clone(), &[]);
    // OpenH264's debugging text (native codes, "Backtraces enabled.") stays out of the answer.
    assert!(!message.contains("Backtraces") && !message.contains("Native:"), "{message}");
    expect((code, message), "invalid_video", "video: ");
    // libx264's default output (High profile with B-frames), which OpenH264 does not decode:
    // named, with how to re-encode it.
    let bframes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/h264/high_bframes.mp4")).unwrap();
    expect(generate(bframes, &[]), "invalid_video", "High profile with B-frames");
    // Frames within --max-pixels (2880x2880 is exactly 3840x2160 pixels) that the encoder cannot take.
    let square = rewrite_moov(&clip, |m| {
        if let Some(mp4_atom::Codec::Avc1(a)) = video_trak(m).mdia.minf.stbl.stsd.codecs.first_mut() {
            (a.visual.width, a.visual.height) = (2880, 2880);
        }
    });
    expect(generate(square, &[]), "invalid_video", "at most 3840x2160 or 2160x3840");
    // Cut short: half the file.
    expect(generate(clip[..clip.len() / 2].to_vec(), &[]), "invalid_video", "video: ");
    // An ftyp box and then nothing of an MP4.
    let mut junk = clip[..32].to_vec();
    junk.extend_from_slice(&[0xAB; 500]);
    expect(generate(junk, &[]), "invalid_video", "video: ");
    // No video track.
    let no_video = rewrite_moov(&clip, |m| m.trak.retain(|t| t.mdia.hdlr.handler != (*b"vide").into()));
    expect(generate(no_video, &[]), "invalid_video", "no video track");
    // Odd width declared by the container.
    let odd = rewrite_moov(&clip, |m| {
        if let Some(mp4_atom::Codec::Avc1(a)) = video_trak(m).mdia.minf.stbl.stsd.codecs.first_mut() {
            a.visual.width = 127;
        }
    });
    expect(generate(odd, &[]), "invalid_video", "127x160: H.264 in 4:2:0 needs an even width and height");
    // Variable frame rate: the last frame lasts twice as long.
    let vfr = rewrite_moov(&clip, |m| {
        let stts = &mut video_trak(m).mdia.minf.stbl.stts;
        let e = stts.entries[0].clone();
        stts.entries = vec![
            mp4_atom::SttsEntry { sample_count: 2, sample_delta: e.sample_delta },
            mp4_atom::SttsEntry { sample_count: 1, sample_delta: 2 * e.sample_delta },
        ];
    });
    expect(generate(vfr, &[]), "invalid_video", "variable frame rate");
    // Face boxes: one too many for the frames; boxes for an image.
    let boxes = "32,40,64,80\n32,40,64,80\n32,40,64,80\n32,40,64,80\n";
    expect(generate(clip.clone(), &[("face_boxes", boxes)]), "invalid_video", "4 face boxes for an avatar of 3 frames");
    let f =
        form(tone_wav(0.3), &[("face_boxes", "32,40,64,80")]).part("video", part(png(128, 160), "a.png", "image/png"));
    expect(refused(c.post(s.url("/generate")).multipart(f).send().unwrap()), "invalid_face_box", "face_boxes");
    // 18 frames of 128x160 decode to 1.05 MiB: over --max-avatar-mb 1, refused from the container.
    let long = video_avatar(&[100; 18], W, H);
    expect(generate(long, &[]), "video_too_large", "--max-avatar-mb");

    // The same checks for a registration, and for the JSON variant.
    let reg = reqwest::blocking::multipart::Form::new().part("image", part(corrupt.clone(), "a.mp4", "video/mp4"));
    expect(refused(c.post(s.url("/v1/avatars")).multipart(reg).send().unwrap()), "invalid_video", "image: ");
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let body = serde_json::json!({"audio_b64": b64(&tone_wav(0.3)), "avatar_b64": b64(&corrupt)});
    let r = c.post(s.url("/generate")).header("content-type", "application/json").body(body.to_string()).send();
    expect(refused(r.unwrap()), "invalid_video", "video: ");

    // Frames over --max-pixels (128x160 = 20480 pixels), on a server with that bound.
    let small = start(&["--max-pixels", "10000"]);
    let f = form(tone_wav(0.3), &[]).part("video", part(clip.clone(), "a.mp4", "video/mp4"));
    let (code, message) = refused(c.post(small.url("/generate")).multipart(f).send().unwrap());
    assert_eq!(code, "video_too_large");
    assert!(message.contains("128x160") && message.contains("--max-pixels"), "{message}");

    // None of it reached an engine, and nothing is left on disk.
    for server in [&s, &small] {
        assert_eq!(metric(server, "cadence_avatar_preparations_total"), 0.0);
        assert_eq!(metric(server, "cadence_rendered_frames_total"), 0.0);
        assert!(server.temp_entries().is_empty(), "{:?}", server.temp_entries());
    }
    assert_eq!(metric(&s, "cadence_rejections_total{reason=\"invalid\"}"), 13.0);
}
