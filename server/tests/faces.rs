//! The face box over HTTP: found by the detector (MTCNN) where no `face_box` is sent, reported in
//! the avatar's `face`; an avatar without a face is a 422 `no_face` before any engine work unless
//! the box is given (`face_box=center` is the centred square); `face_index` and `bbox_shift`
//! need a face the detector finds.

mod common;

use base64::Engine as _;
use common::*;
use serde_json::Value;

fn register(s: &TestServer, image: Vec<u8>, fields: &[(&str, &str)]) -> reqwest::blocking::Response {
    let mut f = reqwest::blocking::multipart::Form::new().part("image", part(image, "me.png", "image/png"));
    for (k, v) in fields {
        f = f.text(k.to_string(), v.to_string());
    }
    client().post(s.url("/v1/avatars")).multipart(f).send().unwrap()
}

/// A 422's code and message.
fn refused(r: reqwest::blocking::Response) -> (String, String) {
    assert_eq!(r.status(), 422);
    let v: Value = r.json().unwrap();
    (v["error"]["code"].as_str().unwrap().to_string(), v["error"]["message"].as_str().unwrap().to_string())
}

fn nums(v: &Value) -> Vec<f64> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}")).iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn a_portrait_is_registered_and_rendered_with_the_face_the_detector_found() {
    let _r = render_lock();
    let s = start(&[]);
    let r = register(&s, face_png(), &[]);
    assert_eq!(r.status(), 201);
    let v: Value = r.json().unwrap();
    let face = &v["face"];
    assert_eq!(face["source"], "detected", "{v}");
    assert!(face["detector"].as_str().unwrap().starts_with("MTCNN"), "{face}");
    assert_eq!((face["frames"].as_u64(), face["detected_frames"].as_u64()), (Some(1), Some(1)), "{face}");
    assert!(face["face"]["score"].as_f64().unwrap() > 0.99, "{face}");
    // The box used is MuseTalk's crop around the face: inside the 256x256 image, holding the
    // detector's landmarks and the middle of its box; not the centred square.
    let crop = nums(&v["face_box"]);
    assert_eq!(crop, nums(&face["box"]));
    let [x, y, w, h] = crop[..] else { panic!("{crop:?}") };
    assert!(w >= 16.0 && h >= 16.0 && x + w <= 256.0 && y + h <= 256.0, "{crop:?}");
    assert_ne!(crop, [64.0, 64.0, 128.0, 128.0]);
    let inside = |p: &[f64]| p[0] >= x && p[0] <= x + w && p[1] >= y && p[1] <= y + h;
    for l in face["face"]["landmarks"].as_array().unwrap() {
        assert!(inside(&nums(l)), "landmark {l} outside the crop {crop:?}");
    }
    let b = nums(&face["face"]["box"]);
    assert!(inside(&[(b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0]), "{b:?} vs {crop:?}");
    // The avatar's record says the same.
    let id = v["avatar_id"].as_str().unwrap().to_string();
    let got: Value = get(&s, &format!("/v1/avatars/{id}")).json().unwrap();
    assert_eq!(got["face"], *face);
    // bbox_shift moves the crop's top (another crop: another avatar); the sides stay.
    let r = register(&s, face_png(), &[("bbox_shift", "8")]);
    assert_eq!(r.status(), 201);
    let shifted: Value = r.json().unwrap();
    let moved = nums(&shifted["face_box"]);
    assert_ne!(shifted["avatar_id"], v["avatar_id"]);
    assert!(moved[1] != y && (moved[0], moved[2]) == (x, w), "{moved:?} vs {crop:?}");

    // A video avatar: the face found in every frame, reported per frame.
    let r = register(&s, face_video(3), &[]);
    assert_eq!(r.status(), 201);
    let video: Value = r.json().unwrap();
    let face = &video["face"];
    assert_eq!((face["source"].as_str(), face["frames"].as_u64()), (Some("detected"), Some(3)), "{face}");
    assert_eq!(face["detected_frames"].as_u64(), Some(3), "{face}");
    assert_eq!(face["faces"].as_array().map(Vec::len), Some(3), "{face}");

    // /generate finds it too (sent with the request), and renders over the registered one.
    let f = form(tone_wav(0.2), &[("stride", "2")]).part("video", part(face_png(), "a.png", "image/png"));
    let r = client().post(s.url("/generate")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text());
    assert_eq!(probe(&r.bytes().unwrap()).width, 256);
    let r = client().post(s.url("/generate")).multipart(form(tone_wav(0.2), &[("avatar_id", &id)])).send().unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn an_avatar_without_a_face_is_422_no_face_unless_the_box_is_given() {
    let s = start(&[]);
    let c = client();
    let says_how = |(code, message): (String, String), field: &str| {
        assert_eq!(code, "no_face", "{message}");
        assert!(message.starts_with(&format!("{field}: ")), "{message}");
        assert!(message.contains("no face found") && message.contains("face_box center"), "{message}");
        assert!(!message.contains("--face-box"), "the CLI's flag in a server message: {message}");
    };
    // The synthetic portrait: registered, sent with /generate (multipart and JSON).
    says_how(refused(register(&s, png(128, 128), &[])), "image");
    let f = form(tone_wav(0.2), &[]).part("video", part(png(128, 128), "a.png", "image/png"));
    says_how(refused(c.post(s.url("/generate")).multipart(f).send().unwrap()), "video");
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let body = serde_json::json!({"audio_b64": b64(&tone_wav(0.2)), "avatar_b64": b64(&png(128, 128))});
    let r = c.post(s.url("/generate")).header("content-type", "application/json").body(body.to_string()).send();
    says_how(refused(r.unwrap()), "video");
    // A video avatar with no face in any frame.
    let clip = video_avatar(&[60, 120, 180], VIDEO_W, VIDEO_H);
    let f = form(tone_wav(0.2), &[]).part("video", part(clip.clone(), "a.mp4", "video/mp4"));
    let (code, message) = refused(c.post(s.url("/generate")).multipart(f).send().unwrap());
    assert_eq!(code, "no_face", "{message}");
    assert!(message.contains("any of its frames"), "{message}");
    // None of it reached an engine.
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 0.0);
    assert_eq!(metric(&s, "cadence_rendered_frames_total"), 0.0);

    // The centred square, asked for: accepted, and said to be given.
    let _r = render_lock();
    let r = register(&s, png(128, 128), &[("face_box", "center")]);
    assert_eq!(r.status(), 201);
    let v: Value = r.json().unwrap();
    assert_eq!(v["face_box"], serde_json::json!([32, 32, 64, 64]));
    assert_eq!(v["face"], serde_json::json!({"box": [32, 32, 64, 64], "source": "given"}));
    assert!(s.temp_entries().is_empty(), "{:?}", s.temp_entries());
}

#[test]
fn face_index_and_bbox_shift_choose_a_found_face_only() {
    let s = start(&[]);
    let c = client();
    let generate = |fields: &[(&str, &str)], avatar: Vec<u8>| {
        let f = form(tone_wav(0.2), fields).part("video", part(avatar, "a.png", "image/png"));
        refused(c.post(s.url("/generate")).multipart(f).send().unwrap())
    };
    let expect = |(code, message): (String, String), want: &str, starts: &str| {
        assert_eq!(code, want, "{message}");
        assert!(message.starts_with(starts), "expected '{starts}...': {message}");
    };
    // With a given box there is no face to choose or crop.
    expect(
        generate(&[("face_index", "1"), ("face_box", "32,32,64,64")], png(128, 128)),
        "invalid_option",
        "face_index",
    );
    expect(generate(&[("bbox_shift", "4"), ("face_box", "center")], png(128, 128)), "invalid_option", "face_index");
    expect(
        refused(register(&s, png(128, 128), &[("face_index", "1"), ("face_box", "center")])),
        "invalid_option",
        "face_index",
    );
    expect(generate(&[("face_index", "-1")], png(128, 128)), "invalid_option", "face_index: '-1'");
    expect(generate(&[("bbox_shift", "up")], png(128, 128)), "invalid_option", "bbox_shift: 'up'");
    // The portrait has one face: there is no second.
    let (code, message) = generate(&[("face_index", "1")], face_png());
    assert_eq!(code, "no_face", "{message}");
    assert!(message.contains("face_index 1") && message.contains("at most 1 face"), "{message}");
    // A registered avatar has its box.
    let id = "ab".repeat(32);
    let r = c.post(s.url("/generate")).multipart(form(tone_wav(0.2), &[("avatar_id", &id), ("bbox_shift", "2")]));
    let (code, message) = refused(r.send().unwrap());
    assert_eq!(code, "conflicting_fields", "{message}");
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 0.0);
}
