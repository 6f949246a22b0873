//! The face box found by default (MTCNN) where `render` and `avatar prepare` are given none: on
//! the committed public-domain portrait (fixtures/mtcnn/astronaut.png, 512x512) the crop is
//! around the face the detector sees, `render --json` reports it; an image without a face is a
//! clear error that says how to give the box, with no output; the face flags that only a found
//! face takes are refused with a given box. (The detector itself: engines/tests/mtcnn*.rs; the
//! crop rule: host/tests/faces.rs.)

mod common;
use common::{cadence, s, speech_fixture, stderr};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn portrait() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/mtcnn/astronaut.png")
}

/// The portrait at (`dx`, `dy`) in a larger `w` x `h` grey frame, written into `dir`.
fn framed_portrait(dir: &Path, w: u32, h: u32, dx: u32, dy: u32) -> PathBuf {
    let img = cadence_media::load_image(portrait()).unwrap();
    let mut frame = cadence_media::RgbImage::from_raw(w, h, vec![96u8; (w * h * 3) as usize]).unwrap();
    for (x, y, p) in img.enumerate_pixels() {
        frame.put_pixel(x + dx, y + dy, *p);
    }
    let p = dir.join("framed.png");
    frame.save(&p).unwrap();
    p
}

/// A flat-colour 256x256 PNG (no face anywhere).
fn flat(dir: &Path) -> PathBuf {
    let p = dir.join("flat.png");
    let px: Vec<u8> = [180u8, 140, 120].repeat(256 * 256);
    cadence_media::RgbImage::from_raw(256, 256, px).unwrap().save(&p).unwrap();
    p
}

/// `cadence faces detect --json` on `img`: the faces it sees.
fn detected(img: &Path) -> Vec<Value> {
    let o = cadence(&["faces", "detect", s(img), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["faces"].as_array().unwrap().clone()
}

fn nums(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// MuseTalk's crop `x,y,w,h` as the stderr line names it ("... MuseTalk's crop x,y,w,h = X,Y,W,H ...").
fn crop_in_stderr(err: &str) -> [u32; 4] {
    let line = err.lines().find(|l| l.starts_with("cadence: face found (MTCNN")).unwrap_or_else(|| panic!("{err}"));
    let at = line.split("x,y,w,h = ").nth(1).unwrap_or_else(|| panic!("{line}"));
    let v: Vec<u32> = at.split([' ', ')']).next().unwrap().split(',').map(|n| n.parse().unwrap()).collect();
    v.try_into().unwrap_or_else(|v| panic!("{line}: {v:?}"))
}

/// The crop holds every one of MTCNN's landmarks and the middle of its box.
fn around_the_face(crop: [u32; 4], face: &Value) {
    let [x, y, w, h] = crop.map(f64::from);
    let inside = |p: &[f64]| p[0] >= x && p[0] <= x + w && p[1] >= y && p[1] <= y + h;
    for l in face["landmarks"].as_array().unwrap() {
        assert!(inside(&nums(l)), "landmark {l} outside the crop {crop:?}");
    }
    let b = nums(&face["box"]);
    assert!(inside(&[(b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0]), "box {b:?} not in the crop {crop:?}");
}

fn refused(o: &Output, out: &Path, says: &[&str]) {
    let err = stderr(o);
    assert!(matches!(o.status.code(), Some(1 | 2)), "expected a refusal ({says:?}), got {:?}: {err}", o.status);
    for s in says {
        assert!(err.contains(s), "expected '{s}' in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "{} was left behind", out.display());
}

#[test]
fn prepare_finds_the_portraits_face_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let img = portrait();
    let faces = detected(&img);
    assert_eq!(faces.len(), 1, "{faces:?}");
    let out = dir.path().join("astronaut.cadence-avatar");
    let o = cadence(&["avatar", "prepare", s(&img), "-o", s(&out), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.exists());
    let crop = crop_in_stderr(&stderr(&o));
    around_the_face(crop, &faces[0]);
    let [x, y, w, h] = crop;
    assert!(x + w <= 512 && y + h <= 512 && w >= 16 && h >= 16, "{crop:?}");
    // The face (87x110 pixels) fills most of the crop: not the centred 256x256 square.
    assert!(w < 200 && h < 200, "{crop:?}");
    // --json says the same: the box used and the detector's face, as `faces detect` sees it.
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let face = &v["face"];
    assert_eq!(face["source"], "detected", "{face}");
    assert_eq!(face["box"], serde_json::json!(crop));
    assert_eq!((face["frames"].as_u64(), face["detected_frames"].as_u64()), (Some(1), Some(1)), "{face}");
    let (mine, theirs) = (nums(&face["face"]["box"]), nums(&faces[0]["box"]));
    assert!(mine.iter().zip(&theirs).all(|(a, b)| (a - b).abs() < 1.0), "{mine:?} vs {theirs:?}");

    // MuseTalk's bbox_shift moves the crop's top (its centre line down: + gives the mouth more
    // room); the sides and bottom stay on the face.
    let shifted = dir.path().join("shifted.cadence-avatar");
    let o = cadence(&["avatar", "prepare", s(&img), "-o", s(&shifted), "--bbox-shift", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let moved = crop_in_stderr(&stderr(&o));
    assert_ne!(moved, crop);
    assert_eq!((moved[0], moved[2]), (crop[0], crop[2]), "{moved:?} vs {crop:?}");
    around_the_face(moved, &faces[0]);
}

#[test]
fn an_image_without_a_face_is_refused_saying_how_to_give_the_box() {
    let dir = tempfile::tempdir().unwrap();
    let img = flat(dir.path());
    assert!(detected(&img).is_empty());
    let out = dir.path().join("flat.cadence-avatar");
    let o = cadence(&["avatar", "prepare", s(&img), "-o", s(&out)]);
    refused(&o, &out, &["flat.png", "no face found", "--face-box"]);
    assert_eq!(stderr(&o).lines().filter(|l| l.starts_with("cadence: error:")).count(), 1, "{}", stderr(&o));
    let mp4 = dir.path().join("flat.mp4");
    let wav = speech_fixture("goodnight");
    let o = cadence(&["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&mp4)]);
    refused(&o, &mp4, &["no face found", "--face-box center"]);
    // The centred square, asked for, is the old default.
    let o = cadence(&["avatar", "prepare", s(&img), "-o", s(&out), "--face-box", "center"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("64,64,128,128"), "{}", stderr(&o));
    let only: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(only.len(), 2, "{only:?}");
}

#[test]
fn face_flags_that_choose_a_found_face_are_refused_with_a_given_box_or_a_missing_face() {
    let dir = tempfile::tempdir().unwrap();
    let img = portrait();
    let out = dir.path().join("x.cadence-avatar");
    let prepare = |extra: &[&str]| cadence(&[&["avatar", "prepare", s(&img), "-o", s(&out)][..], extra].concat());
    // One face: there is no second.
    refused(&prepare(&["--face-index", "1"]), &out, &["--face-index 1", "at most 1 face"]);
    // With a given box there is no face to choose or crop.
    refused(&prepare(&["--bbox-shift", "5", "--face-box", "center"]), &out, &["--bbox-shift"]);
    refused(&prepare(&["--face-index", "1", "--face-box", "100,40,200,200"]), &out, &["--face-index"]);
    refused(&prepare(&["--min-face-size", "8"]), &out, &["at least 12"]);
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "a file was left");
}

#[test]
fn render_json_reports_the_face_it_found() {
    let dir = tempfile::tempdir().unwrap();
    // The portrait at (64, 32) of a 640x576 frame: the face moves with it.
    let (dx, dy) = (64u32, 32u32);
    let img = framed_portrait(dir.path(), 640, 576, dx, dy);
    let reference = detected(&portrait());
    let wav = speech_fixture("goodnight");
    let out = dir.path().join("out.mp4");
    let o = cadence(&[
        "render",
        "--audio",
        s(&wav),
        "--avatar",
        s(&img),
        "--backend",
        "cpu",
        "--stride",
        "4",
        "-o",
        s(&out),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let face = &v["face"];
    assert_eq!(face["source"], "detected", "{face}");
    assert!(face["detector"].as_str().unwrap().starts_with("MTCNN"), "{face}");
    let b: Vec<u64> = face["box"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert!(b[2] >= 16 && b[3] >= 16 && b[0] + b[2] <= 640 && b[1] + b[3] <= 576, "{b:?}");
    let crop: [u32; 4] = [b[0] as u32, b[1] as u32, b[2] as u32, b[3] as u32];
    assert_eq!(crop, crop_in_stderr(&stderr(&o)));
    // The detector's box is the portrait's own, moved by the offset.
    let found = nums(&face["face"]["box"]);
    let want = nums(&reference[0]["box"]);
    let moved = [want[0] + dx as f64, want[1] + dy as f64, want[2] + dx as f64, want[3] + dy as f64];
    assert!(found.iter().zip(&moved).all(|(a, b)| (a - b).abs() < 3.0), "{found:?} vs {moved:?}");
    around_the_face(crop, &face["face"]);
    assert!(face["face"]["score"].as_f64().unwrap() > 0.99, "{face}");
    let info = cadence_media::probe(&out).unwrap();
    assert_eq!((info.width, info.height), (640, 576));
}
