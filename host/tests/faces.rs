//! The face found and followed through an avatar's frames (`cadence::avatar::faces`: MTCNN with
//! its trained weights, the tracker, the filter over time) on a photograph (the public-domain
//! portrait of fixtures/mtcnn) moved inside a larger frame: a still head moved by sub-pixel
//! shifts must give a steady box, a panned one a box that does not lag, a frame without the face
//! a box filled from its neighbours. The targets are jitter <= 0.5 px and lag <= 1 frame.

use cadence::avatar::faces::{musetalk_crop, track_faces, DetectOptions, FoundFaces};
use cadence::avatar::steady::{centre_jitter_px, lag_frames};
use cadence::measure::fixtures::{place_image, sub_pixel_shifts};
use cadence_media::RgbImage;
use std::path::Path;

const W: u32 = 800;
const H: u32 = 768;
const BG: u8 = 110;

fn portrait() -> RgbImage {
    cadence_media::load_image(Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/mtcnn/astronaut.png")).unwrap()
}

/// The detector over frames with the portrait's top-left corner at `offsets` (None: an empty
/// frame).
fn track(offsets: &[Option<(f64, f64)>]) -> FoundFaces {
    try_track(offsets).unwrap()
}

fn try_track(offsets: &[Option<(f64, f64)>]) -> anyhow::Result<FoundFaces> {
    let p = portrait();
    track_faces(offsets.len(), 25.0, &DetectOptions::default(), |f| {
        for (i, o) in offsets.iter().enumerate() {
            let frame = match o {
                Some((x, y)) => place_image(&p, W, H, *x, *y, BG),
                None => RgbImage::from_raw(W, H, vec![BG; (W * H * 3) as usize]).unwrap(),
            };
            f(i, &frame)?;
        }
        Ok(())
    })
}

fn centre_x(b: &[f32; 4]) -> f64 {
    (b[0] as f64 + b[2] as f64) / 2.0
}

#[test]
fn a_still_head_moved_by_sub_pixel_shifts_gives_a_steady_box() {
    let n = 40;
    let (dx, dy) = (sub_pixel_shifts(n, 7), sub_pixel_shifts(n, 11));
    let offsets: Vec<_> = (0..n).map(|i| Some((140.0 + dx[i], 120.0 + dy[i]))).collect();
    let found = track(&offsets);
    assert_eq!(found.detected, n);
    let raw: Vec<[f32; 4]> = found.raw.iter().map(|f| f.unwrap().bbox).collect();
    let steady: Vec<[f32; 4]> = found.faces.iter().map(|f| f.bbox).collect();
    let (before, after) = (centre_jitter_px(&raw), centre_jitter_px(&steady));
    eprintln!("still head: box centre jitter {before:.3} px detected, {after:.3} px steadied");
    assert!(after <= 0.5, "jitter {after:.3} px after the filter (detected: {before:.3} px)");
    assert!(after < before, "the filter must reduce the jitter ({before:.3} -> {after:.3} px)");
    // The crop follows the steady box: MuseTalk's crop of every frame lies in the frame.
    for f in &found.faces {
        let b = musetalk_crop(f, 0, W, H).unwrap();
        assert!(b.x + b.w <= W && b.y + b.h <= H && b.w >= 64, "{b:?}");
    }
}

#[test]
fn a_panned_head_is_followed_without_lag() {
    let n = 36;
    let speed = 4.0;
    let offsets: Vec<_> = (0..n).map(|i| Some((100.0 + speed * i as f64, 120.0))).collect();
    let found = track(&offsets);
    assert_eq!(found.detected, n);
    // The true centre: the detector's own centre on the unmoved portrait (estimated from every
    // detection, less the known motion) plus the motion.
    let raw: Vec<f64> = found.raw.iter().map(|f| centre_x(&f.unwrap().bbox)).collect();
    let c0 = raw.iter().enumerate().map(|(i, c)| c - speed * i as f64).sum::<f64>() / n as f64;
    let truth: Vec<f64> = (0..n).map(|i| c0 + speed * i as f64).collect();
    let steady: Vec<f64> = found.faces.iter().map(|f| centre_x(&f.bbox)).collect();
    let lag = lag_frames(&steady, &truth);
    eprintln!("panned head at {speed} px/frame: lag {lag:.2} frames (detected: {:.2})", lag_frames(&raw, &truth));
    assert!(lag.abs() <= 1.0, "the steadied box lags {lag:.2} frames behind a head panned at {speed} px/frame");
    for (s, t) in steady.iter().zip(&truth).skip(2).take(n - 4) {
        assert!((s - t).abs() < 3.0, "steadied centre {s:.1} vs {t:.1}");
    }
}

#[test]
fn frames_without_the_face_are_filled_from_their_neighbours() {
    let mut offsets: Vec<_> = (0..12).map(|i| Some((120.0 + i as f64, 120.0))).collect();
    offsets[5] = None;
    offsets[6] = None;
    let found = track(&offsets);
    assert_eq!(found.detected, 10);
    assert!(found.raw[5].is_none() && found.raw[6].is_none());
    let cx: Vec<f64> = found.faces.iter().map(|f| centre_x(&f.bbox)).collect();
    // Filled between frames 4 and 7: in between them, in order.
    assert!(cx[4] <= cx[5] + 0.5 && cx[5] <= cx[6] + 0.5 && cx[6] <= cx[7] + 0.5, "{cx:?}");
    // No face in any frame: an error that says how to give the box.
    let e = try_track(&[None, None]).unwrap_err();
    assert!(cadence::avatar::faces::is_no_face(&e), "{e:#}");
    assert!(format!("{e:#}").contains("--face-box x,y,w,h"), "{e:#}");
}
