//! Video avatars (`render --avatar clip.mp4 | DIR`, `avatar prepare clip.mp4`): each output
//! frame uses the reference latent, rest latent and background of avatar frame cycle(k)
//! (MuseTalk's forward-then-backward order); a prepared video avatar gives the same MP4 bytes
//! as the clip; an image sequence of the clip's frames gives the same video as the clip; and
//! every bad avatar is refused with a clear message, a non-zero exit and no output file. The
//! avatar clips are written here with cadence's own MP4 writer (no system tool).

mod common;
use common::{cadence, s};

use cadence::avatar::AvatarSource;
use cadence::frame_loop::RenderOptions;
use cadence::musetalk::{DecoderKind, Engines};
use cadence::{Backend, KeyframeSchedule};
use cadence_media::{EncoderKind, FaceBox, FrameRate, Mp4Reader, RgbImage, VideoWriter};
use std::path::{Path, PathBuf};
use std::process::Output;

const W: u32 = 128;
const H: u32 = 160;
const FACE: FaceBox = FaceBox { x: 32, y: 40, w: 64, h: 80 };
const FACE_ARG: &str = "--face-box=32,40,64,80";
/// Luma level of each avatar frame's background: far apart, so a frame's background is
/// recognised in the output whatever the codec's rounding.
const LEVELS: [u8; 3] = [60, 120, 180];

/// NV12 frame `i` of a test avatar: a flat background at `level` with a textured face (a
/// different texture per frame, so the reference latents differ too).
fn avatar_nv12(i: usize, level: u8, w: u32, h: u32) -> Vec<u8> {
    let (w, h) = (w as usize, h as usize);
    let mut f = vec![level; w * h];
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (x as f32, y as f32);
            let inside = (FACE.x as usize..(FACE.x + FACE.w) as usize).contains(&x)
                && (FACE.y as usize..(FACE.y + FACE.h) as usize).contains(&y);
            if inside {
                f[y * w + x] = (128.0 + 90.0 * ((fx * 0.21 + i as f32 * 1.7).sin() * (fy * 0.13).cos())) as u8;
            }
        }
    }
    // Chroma near grey, so that the background stays inside the RGB gamut (no clamping).
    f.extend((0..w * h / 2).map(|j| if j % 2 == 0 { 128 - 6 * i as u8 } else { 124 + 5 * i as u8 }));
    f
}

/// Writes an avatar MP4 of the given frames' levels with cadence's writer (OpenH264, 25 fps).
fn avatar_mp4(dir: &Path, name: &str, levels: &[u8], w: u32, h: u32) -> PathBuf {
    let p = dir.join(name);
    let mut v = VideoWriter::create(&p, w, h, FrameRate::whole(25), EncoderKind::OpenH264, None).unwrap();
    for (i, &l) in levels.iter().enumerate() {
        v.push_nv12(&avatar_nv12(i % 3, l, w, h)).unwrap();
    }
    v.finish().unwrap();
    p
}

/// "Thank you, and good night." then 1.5 s of silence (speech, easing and bypassed frames).
fn speech_then_pause(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech/goodnight.wav");
    let mut r = hound::WavReader::open(src).unwrap();
    let spec = r.spec();
    let mut samples: Vec<i16> = r.samples::<i16>().map(|x| x.unwrap()).collect();
    samples.extend(std::iter::repeat_n(0i16, spec.sample_rate as usize * 3 / 2));
    let out = dir.join("speech.wav");
    let mut w = hound::WavWriter::create(&out, spec).unwrap();
    samples.iter().for_each(|&x| w.write_sample(x).unwrap());
    w.finalize().unwrap();
    out
}

/// MuseTalk's order, written out as its code builds it (`frame_list + frame_list[::-1]`,
/// indexed `k % len`), independently of cadence's `cycle_index`.
fn musetalk_cycle(k: usize, n: usize) -> usize {
    let list: Vec<usize> = (0..n).chain((0..n).rev()).collect();
    list[k % list.len()]
}

fn engines() -> Engines {
    Engines::load(cadence_engines::Profile::Cpu, DecoderKind::Taesd, &cadence_engines::Device::Cpu, None).unwrap()
}

/// Mean absolute difference of the luma outside the face box.
fn background_distance(a: &[u8], b: &[u8]) -> f64 {
    let (w, h) = (W as usize, H as usize);
    let mut sum = 0u64;
    let mut n = 0u64;
    for y in 0..h {
        for x in 0..w {
            let inside = (FACE.x as usize..(FACE.x + FACE.w) as usize).contains(&x)
                && (FACE.y as usize..(FACE.y + FACE.h) as usize).contains(&y);
            if !inside {
                sum += (a[y * w + x] as i64 - b[y * w + x] as i64).unsigned_abs();
                n += 1;
            }
        }
    }
    sum as f64 / n as f64
}

/// The core check: with a 3-frame video avatar, output frame k equals (every byte) frame k of a
/// render of the still image cycle(k) alone, so it used that frame's reference latent (speech),
/// rest latent (easing and silence) and background; and its background outside the face box is
/// the decoded avatar frame cycle(k)'s, in the ping-pong order, and far from the other two.
#[test]
fn each_output_frame_uses_its_avatar_frames_latents_and_background() {
    let dir = tempfile::tempdir().unwrap();
    let clip = avatar_mp4(dir.path(), "clip.mp4", &LEVELS, W, H);
    let wav = speech_then_pause(dir.path());
    let engines = engines();
    let backend = Backend::Cpu;
    let opts = RenderOptions { batch: 4, window: Some(16), ..RenderOptions::default() };
    let audio = cadence::frame_loop::audio::load_audio(&wav, 60.0).unwrap();
    let source = AvatarSource::open(&clip, &cadence::avatar::FaceSpec::Given(FACE)).unwrap();
    assert_eq!(source.frames(), 3);
    let avatar = cadence::musetalk::render::prepare_avatar_source(&engines, &backend, &source).unwrap();
    let prepared = cadence::musetalk::render::prepare_with_avatar(&engines, audio.clone(), &avatar, &opts).unwrap();
    // Stride 1: every frame's latent comes from its own UNet evaluation (no interpolation
    // between keyframes of different avatar frames), so a still render can reproduce it.
    let schedule = KeyframeSchedule::fixed_stride(prepared.frames, 1).unwrap();
    let (video, stats) =
        cadence::measure::fixtures::render_prepared(&engines, &backend, &opts, &prepared, &schedule).unwrap();
    assert!(stats.bypassed_frames > 10 && stats.keyframes_evaluated > 20, "{stats:?}");

    let mut images: Vec<RgbImage> = Vec::new();
    source
        .for_each_frame(|_, img| {
            images.push(img.clone());
            Ok(())
        })
        .unwrap();
    for (a, img) in images.iter().enumerate() {
        let still = cadence::musetalk::render::prepare(&engines, &backend, audio.clone(), img, FACE, &opts).unwrap();
        let (frames, _) =
            cadence::measure::fixtures::render_prepared(&engines, &backend, &opts, &still, &schedule).unwrap();
        let shown: Vec<usize> = (0..video.len()).filter(|&k| musetalk_cycle(k, 3) == a).collect();
        assert!(shown.len() > 20);
        for &k in &shown {
            assert!(video[k] == frames[k], "output frame {k} is not avatar frame {a}'s");
        }
    }

    // Independently of cadence's conversions: the avatar decoded by OpenH264 (NV12).
    let decoded = Mp4Reader::open(&clip).unwrap().decode_video().unwrap().frames;
    for (k, frame) in video.iter().enumerate() {
        let d: Vec<f64> = decoded.iter().map(|a| background_distance(frame, a)).collect();
        let want = musetalk_cycle(k, 3);
        assert!(d[want] < 1.5, "frame {k}: background {:.2} from avatar frame {want}", d[want]);
        for (a, &x) in d.iter().enumerate() {
            assert!(a == want || x > 30.0, "frame {k}: background close to avatar frame {a} too ({x:.1})");
        }
    }
}

fn render_cli(avatar: &Path, wav: &Path, out: &Path, extra: &[&str]) -> Output {
    let args = ["render", "--backend", "cpu", "--stride", "2", "--audio", s(wav), "--avatar", s(avatar), "-o", s(out)];
    cadence(&[&args[..], extra].concat())
}

fn ok(o: &Output) {
    assert!(o.status.success(), "cadence failed: {}", String::from_utf8_lossy(&o.stderr));
}

/// A clip, its prepared file and the image sequence of its decoded frames give the same MP4
/// bytes; a box file of the same box for every frame gives the same video as --face-box.
#[test]
fn a_clip_its_prepared_file_and_its_frames_as_images_render_the_same_video() {
    let dir = tempfile::tempdir().unwrap();
    let clip = avatar_mp4(dir.path(), "clip.mp4", &LEVELS, W, H);
    let wav = speech_then_pause(dir.path());
    let prepared = dir.path().join("anchor.cadence-avatar");
    ok(&cadence(&["avatar", "prepare", s(&clip), "-o", s(&prepared), FACE_ARG]));
    let frames_dir = dir.path().join("frames");
    std::fs::create_dir(&frames_dir).unwrap();
    AvatarSource::open(&clip, &cadence::avatar::FaceSpec::Centered)
        .unwrap()
        .for_each_frame(|i, img| Ok(img.save(frames_dir.join(format!("frame_{i:03}.png")))?))
        .unwrap();
    std::fs::write(frames_dir.join("notes.txt"), "not an image: ignored").unwrap();
    let boxes = dir.path().join("boxes.txt");
    std::fs::write(&boxes, "# x,y,w,h per frame\n32,40,64,80\n32,40,64,80\n\n32,40,64,80\n").unwrap();

    let outs: Vec<PathBuf> =
        ["clip", "prepared", "dir", "boxes"].iter().map(|n| dir.path().join(format!("out_{n}.mp4"))).collect();
    ok(&render_cli(&clip, &wav, &outs[0], &[FACE_ARG]));
    ok(&render_cli(&prepared, &wav, &outs[1], &[]));
    ok(&render_cli(&frames_dir, &wav, &outs[2], &[FACE_ARG]));
    ok(&render_cli(&clip, &wav, &outs[3], &["--face-boxes", s(&boxes)]));
    let bytes: Vec<Vec<u8>> = outs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(bytes[0] == bytes[1], "the prepared avatar renders another video than its clip");
    assert!(bytes[0] == bytes[2], "the image sequence renders another video than the clip");
    assert!(bytes[0] == bytes[3], "a box file of --face-box's box renders another video");
    // Boxes that move per frame make another video.
    std::fs::write(&boxes, "32,40,64,80\n34,42,60,76\n30,38,64,80\n").unwrap();
    let moved = dir.path().join("moved.mp4");
    ok(&render_cli(&clip, &wav, &moved, &["--face-boxes", s(&boxes)]));
    assert!(std::fs::read(&moved).unwrap() != bytes[0]);
    let info = cadence_media::probe(&outs[0]).unwrap();
    assert_eq!((info.width, info.height), (W, H));
}

/// Replaces the `moov` (the last box of cadence's progressive MP4) after `edit`.
fn rewrite_moov(path: &Path, edit: impl FnOnce(&mut mp4_atom::Moov)) {
    use mp4_atom::{Decode, Encode};
    let bytes = std::fs::read(path).unwrap();
    let mut pos = 0usize;
    let mut moov = None;
    while pos + 8 <= bytes.len() {
        let mut size = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        if size == 1 {
            size = u64::from_be_bytes(bytes[pos + 8..pos + 16].try_into().unwrap()) as usize;
        }
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
    std::fs::write(path, out).unwrap();
}

fn video_trak(m: &mut mp4_atom::Moov) -> &mut mp4_atom::Trak {
    m.trak.iter_mut().find(|t| t.mdia.hdlr.handler == (*b"vide").into()).unwrap()
}

/// Refused: non-zero exit, the message, no panic, nothing at the output path.
fn refused(o: &Output, out: &Path, says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(1 | 2)), "expected a refusal ('{says}'), got {:?}: {err}", o.status);
    assert!(err.contains(says), "expected '{says}' in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "{} was left behind", out.display());
    let partial = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains(".partial"));
    assert!(!partial, "a partial output was left behind");
}

#[test]
fn bad_video_avatars_are_refused_before_any_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wav = speech_then_pause(d);
    let out = d.join("out.mp4");
    let render = |avatar: &Path, extra: &[&str]| render_cli(avatar, &wav, &out, extra);

    // No video track.
    let no_video = avatar_mp4(d, "no_video.mp4", &LEVELS, W, H);
    rewrite_moov(&no_video, |m| m.trak.retain(|t| t.mdia.hdlr.handler != (*b"vide").into()));
    refused(&render(&no_video, &[]), &out, "no video track");
    // Corrupt H.264: every sample's bytes zeroed (the mdat payload).
    let corrupt = avatar_mp4(d, "corrupt.mp4", &LEVELS, W, H);
    let mut bytes = std::fs::read(&corrupt).unwrap();
    let mdat = bytes.windows(4).position(|w| w == b"mdat").unwrap() + 12;
    let moov = bytes.windows(4).rposition(|w| w == b"moov").unwrap() - 4;
    bytes[mdat..moov].fill(0);
    std::fs::write(&corrupt, bytes).unwrap();
    refused(&render(&corrupt, &[]), &out, "video sample 0");
    // Odd width declared by the container.
    let odd = avatar_mp4(d, "odd.mp4", &LEVELS, W, H);
    rewrite_moov(&odd, |m| {
        if let Some(mp4_atom::Codec::Avc1(a)) = video_trak(m).mdia.minf.stbl.stsd.codecs.first_mut() {
            a.visual.width = 127;
        }
    });
    refused(&render(&odd, &[]), &out, "127x160: H.264 in 4:2:0 needs an even width and height");
    // Variable frame rate: the last frame lasts twice as long.
    let vfr = avatar_mp4(d, "vfr.mp4", &LEVELS, W, H);
    rewrite_moov(&vfr, |m| {
        let stts = &mut video_trak(m).mdia.minf.stbl.stts;
        let e = stts.entries[0].clone();
        assert_eq!((stts.entries.len(), e.sample_count), (1, 3));
        stts.entries = vec![
            mp4_atom::SttsEntry { sample_count: 2, sample_delta: e.sample_delta },
            mp4_atom::SttsEntry { sample_count: 1, sample_delta: 2 * e.sample_delta },
        ];
    });
    refused(
        &render(&vfr, &[]),
        &out,
        "variable frame rate: the frames' durations give 25.000 fps (2 frames), 12.500 fps (1 frame)",
    );
    // More frames than an avatar may have.
    let long = avatar_mp4(d, "long.mp4", &[100u8; cadence::avatar::MAX_AVATAR_FRAMES + 1], 64, 64);
    refused(&render(&long, &[]), &out, "1001 frames; an avatar has at most 1000");

    // Face-box files: a box too many, a box outside the frame.
    let clip = avatar_mp4(d, "clip.mp4", &LEVELS, W, H);
    let boxes = d.join("boxes.txt");
    std::fs::write(&boxes, "32,40,64,80\n32,40,64,80\n32,40,64,80\n32,40,64,80\n").unwrap();
    refused(&render(&clip, &["--face-boxes", s(&boxes)]), &out, "4 face boxes for an avatar of 3 frames");
    std::fs::write(&boxes, "32,40,64,80\n100,40,64,80\n32,40,64,80\n").unwrap();
    refused(
        &render(&clip, &["--face-boxes", s(&boxes)]),
        &out,
        "line 2: face box 100,40 64x80: the box reaches (164,120), outside the 128x160 image",
    );
    refused(&render(&clip, &["--face-boxes", s(&boxes), FACE_ARG]), &out, "cannot be used with");

    // Image sequences: no images; images of two sizes.
    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("readme.txt"), "no frames here").unwrap();
    refused(&render(&empty, &[]), &out, "no PNG or JPEG files");
    let mixed = d.join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    RgbImage::new(W, H).save(mixed.join("001.png")).unwrap();
    RgbImage::new(W, H + 2).save(mixed.join("002.png")).unwrap();
    refused(&render(&mixed, &[]), &out, "128x162, but");

    // A prepared avatar of format version 1 (before video avatars).
    let prepared = d.join("old.cadence-avatar");
    ok(&cadence(&["avatar", "prepare", s(&clip), "-o", s(&prepared), FACE_ARG]));
    let mut old = std::fs::read(&prepared).unwrap();
    old[16..20].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&prepared, old).unwrap();
    refused(&render(&prepared, &[]), &out, "format version 1; this cadence reads version 2: prepare it again");
    // The same refusals from `avatar prepare`, with no file written.
    let target = d.join("x.cadence-avatar");
    refused(&cadence(&["avatar", "prepare", s(&vfr), "-o", s(&target)]), &target, "variable frame rate");
}
