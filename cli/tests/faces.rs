//! `cadence faces detect`: an image (text and JSON), a photograph without a face, a directory of
//! frames, an MP4 (written here with cadence's own writer), and bad input (a clear error and a
//! non-zero exit). The detector itself is tested against facenet-pytorch in
//! engines/tests/mtcnn_detect.rs; here the command around it.

mod common;
use cadence_media::{EncoderKind, FrameRate, VideoWriter};
use common::{cadence, s, stderr};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/mtcnn").join(name)
}

fn json(args: &[&str]) -> Value {
    let o = cadence(args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn iou(a: &[f64], b: &[f64]) -> f64 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let area = |r: &[f64]| (r[2] - r[0]) * (r[3] - r[1]);
    iw * ih / (area(a) + area(b) - iw * ih)
}

fn boxes(faces: &Value) -> Vec<Vec<f64>> {
    faces
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["box"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
        .collect()
}

/// facenet-pytorch's box for the portrait (fixtures/mtcnn/detect_reference.json, "portrait").
fn reference_box() -> Vec<f64> {
    let text = std::fs::read_to_string(fixture("detect_reference.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    boxes(&v["frames"]["portrait"]["faces"]).remove(0)
}

#[test]
fn an_image_in_text_and_json() {
    let portrait = fixture("astronaut.png");
    let o = cadence(&["faces", "detect", s(&portrait)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains(": 1 face\n") && text.contains("box 181.1,62.2 to 267.7,172.1"), "{text}");

    let v = json(&["faces", "detect", s(&portrait), "--json"]);
    assert!(v["model"].as_str().unwrap().contains("facenet-pytorch 2.6.0"));
    let faces = &v["faces"];
    assert_eq!(faces.as_array().unwrap().len(), 1);
    assert!(iou(&boxes(faces)[0], &reference_box()) > 0.999);
    assert_eq!(faces[0]["landmarks"].as_array().unwrap().len(), 5);
    assert!(faces[0]["score"].as_f64().unwrap() > 0.99);

    let v = json(&["faces", "detect", s(&fixture("coffee.png")), "--json"]);
    assert_eq!(v["faces"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn a_directory_and_a_video_give_one_entry_per_frame() {
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("frames");
    std::fs::create_dir(&frames).unwrap();
    std::fs::copy(fixture("astronaut.png"), frames.join("0001.png")).unwrap();
    std::fs::copy(fixture("coffee.png"), frames.join("0002.png")).unwrap();
    std::fs::write(frames.join("notes.txt"), "not a frame").unwrap();
    let v = json(&["faces", "detect", s(&frames), "--json"]);
    let f = v["frames"].as_array().unwrap();
    assert_eq!(f.len(), 2);
    assert_eq!((f[0]["faces"].as_array().unwrap().len(), f[1]["faces"].as_array().unwrap().len()), (1, 0));

    // Three frames of the portrait as an MP4 (grey chroma: luma from BT.601 weights).
    let img = cadence_media::load_image(fixture("astronaut.png")).unwrap();
    let (w, h) = img.dimensions();
    let mut nv12: Vec<u8> = img
        .pixels()
        .map(|p| {
            (16.0 + 219.0 * (0.299 * p[0] as f32 + 0.587 * p[1] as f32 + 0.114 * p[2] as f32) / 255.0).round() as u8
        })
        .collect();
    nv12.resize(nv12.len() * 3 / 2, 128);
    let video = dir.path().join("portrait.mp4");
    let mut writer = VideoWriter::create(&video, w, h, FrameRate::whole(25), EncoderKind::OpenH264, None).unwrap();
    for _ in 0..3 {
        writer.push_nv12(&nv12).unwrap();
    }
    writer.finish().unwrap();
    let v = json(&["faces", "detect", s(&video), "--json"]);
    let f = v["frames"].as_array().unwrap();
    assert_eq!(f.len(), 3);
    for frame in f {
        let b = boxes(&frame["faces"]);
        assert_eq!(b.len(), 1, "{frame}");
        // Grey and compressed, the face is still found where it is.
        assert!(iou(&b[0], &reference_box()) > 0.8, "{b:?}");
    }
}

#[test]
fn bad_input_is_refused() {
    let o = cadence(&["faces", "detect", "/nonexistent/face.png"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/nonexistent/face.png"), "{}", stderr(&o));
    let o = cadence(&["faces", "detect", s(&fixture("astronaut.png")), "--min-face-size", "8"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("'8': the smallest face is a number of pixels, at least 12"), "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let o = cadence(&["faces", "detect", s(dir.path())]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no PNG or JPEG files"), "{}", stderr(&o));
    let not_image = dir.path().join("face.png");
    std::fs::write(&not_image, b"not a png").unwrap();
    let o = cadence(&["faces", "detect", s(&not_image)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
}
