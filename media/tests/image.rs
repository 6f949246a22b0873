mod common;

/// The engines' face crop side (media does not depend on the engines).
const CROP_SIDE: u32 = 256;

use cadence_media::{crop_to_planar, load_image, paste_region, planar_to_rgb, FaceBox, MediaError, RgbImage};
use common::*;

fn gradient(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, ((x + y) % 256) as u8]))
}

#[test]
fn png_and_jpeg_load_as_rgb8() {
    let dir = tmp_dir("img-ok");
    let png = dir.join("a.png");
    let img = gradient(300, 200);
    img.save(&png).unwrap();
    let back = load_image(&png).unwrap();
    assert_eq!(back, img);

    let jpg = dir.join("a.jpg");
    gradient(640, 480).save(&jpg).unwrap();
    let j = load_image(&jpg).unwrap();
    assert_eq!(j.dimensions(), (640, 480));

    // RGBA PNG: alpha dropped.
    let rgba = dir.join("rgba.png");
    image::RgbaImage::from_pixel(64, 80, image::Rgba([10, 20, 30, 40])).save(&rgba).unwrap();
    let r = load_image(&rgba).unwrap();
    assert_eq!(r.get_pixel(5, 5).0, [10, 20, 30]);
}

fn image_err(path: &std::path::Path) -> String {
    let e = load_image(path).unwrap_err();
    assert!(matches!(e, MediaError::Image { .. }), "{e:?}");
    let m = e.to_string();
    assert!(!m.contains('\n'));
    assert!(m.contains(&path.display().to_string()));
    m
}

#[test]
fn too_small_too_big_not_an_image() {
    let dir = tmp_dir("img-bad");
    let tiny = dir.join("tiny.png");
    gradient(32, 32).save(&tiny).unwrap();
    assert!(image_err(&tiny).contains("smaller than the minimum 64x64"));
    let narrow = dir.join("narrow.png");
    gradient(63, 500).save(&narrow).unwrap();
    assert!(image_err(&narrow).contains("smaller"));

    let big = dir.join("big.png");
    RgbImage::new(3842, 64).save(&big).unwrap();
    assert!(image_err(&big).contains("larger than the maximum 3840x3840"));
    // Each side under 3840, but both over 2160: more than the H.264 encoder takes.
    let square = dir.join("square.png");
    RgbImage::new(2162, 2162).save(&square).unwrap();
    assert!(image_err(&square).contains("at most 3840x2160 or 2160x3840"), "{}", image_err(&square));
    assert!(cadence_media::image_size(&square).unwrap_err().to_string().contains("at most 3840x2160"));

    let text = dir.join("face.png");
    std::fs::write(&text, "hello, not an image").unwrap();
    assert!(image_err(&text).contains("not a PNG or JPEG"));

    // A PNG signature followed by garbage.
    let broken = dir.join("broken.png");
    let mut bytes = std::fs::read(&tiny).unwrap();
    bytes.truncate(30);
    std::fs::write(&broken, bytes).unwrap();
    assert!(image_err(&broken).contains("unreadable"));

    assert!(matches!(load_image(dir.join("missing.png")).unwrap_err(), MediaError::Io { .. }));
}

#[test]
fn face_box_validation() {
    let c = FaceBox::centered(1080, 1920);
    assert_eq!(c, FaceBox { x: 270, y: 690, w: 540, h: 540 });
    c.validate(1080, 1920).unwrap();
    let outside = FaceBox { x: 1000, y: 0, w: 200, h: 200 };
    let e = outside.validate(1080, 1920).unwrap_err();
    assert!(matches!(e, MediaError::FaceBox { .. }));
    assert!(e.to_string().contains("outside the 1080x1920 image"), "{e}");
    assert!(FaceBox { x: 0, y: 1900, w: 100, h: 100 }.validate(1080, 1920).is_err());
    assert!(FaceBox { x: 0, y: 0, w: 0, h: 100 }.validate(1080, 1920).is_err());
    assert!(FaceBox { x: u32::MAX, y: 0, w: 100, h: 100 }.validate(1080, 1920).is_err());
    let img = gradient(200, 200);
    assert!(crop_to_planar(&img, &outside, CROP_SIDE).is_err());
}

#[test]
fn crop_is_planar_unit_range() {
    let img = RgbImage::from_pixel(400, 300, image::Rgb([255, 128, 0]));
    let face = FaceBox { x: 50, y: 20, w: 200, h: 180 };
    let t = crop_to_planar(&img, &face, CROP_SIDE).unwrap();
    let n = (CROP_SIDE * CROP_SIDE) as usize;
    assert_eq!(t.len(), 3 * n);
    assert!(t[..n].iter().all(|&v| (v - 1.0).abs() < 1e-6));
    assert!(t[n..2 * n].iter().all(|&v| (v - 128.0 / 255.0).abs() < 1e-6));
    assert!(t[2 * n..].iter().all(|&v| v.abs() < 1e-6));
}

#[test]
fn crop_picks_the_box_and_paste_inverts_it() {
    // Left half red, right half blue; the box covers only the right half.
    let img =
        RgbImage::from_fn(512, 512, |x, _| if x < 256 { image::Rgb([255, 0, 0]) } else { image::Rgb([0, 0, 255]) });
    let face = FaceBox { x: 300, y: 100, w: 128, h: 128 };
    let t = crop_to_planar(&img, &face, 256).unwrap();
    let n = 256 * 256;
    assert!(t[..n].iter().all(|&v| v < 1e-6), "red in a blue region");
    assert!(t[2 * n..].iter().all(|&v| v > 1.0 - 1e-6));

    // Identity round trip at the crop's own size.
    let g = gradient(256, 256);
    let face = FaceBox { x: 0, y: 0, w: 256, h: 256 };
    let t = crop_to_planar(&g, &face, 256).unwrap();
    let back = paste_region(&t, 256, &face, 256, 256).unwrap();
    assert_eq!(back.rgb, g);
    assert_eq!((back.x, back.y), (0, 0));

    // Down to 256 and back up to the box: close to the original (smooth image).
    let big = RgbImage::from_fn(1080, 1920, |x, y| image::Rgb([(x / 5) as u8, (y / 8) as u8, 128]));
    let face = FaceBox { x: 270, y: 690, w: 540, h: 540 };
    let t = crop_to_planar(&big, &face, 256).unwrap();
    let p = paste_region(&t, 256, &face, 1080, 1920).unwrap();
    assert_eq!(p.rgb.dimensions(), (540, 540));
    assert_eq!((p.x, p.y), (270, 690));
    let mut max_err = 0i32;
    for (i, j, px) in p.rgb.enumerate_pixels() {
        let o = big.get_pixel(face.x + i, face.y + j);
        for c in 0..3 {
            max_err = max_err.max((px[c] as i32 - o[c] as i32).abs());
        }
    }
    assert!(max_err <= 2, "max error {max_err}");
    assert!(paste_region(&t, 256, &FaceBox { x: 600, y: 0, w: 540, h: 540 }, 1080, 1920).is_err());
    assert!(paste_region(&t[1..], 256, &face, 1080, 1920).is_err());
}

#[test]
fn planar_to_rgb_clamps() {
    let v = vec![-0.5f32, 2.0, 0.5, 0.25, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let img = planar_to_rgb(&v, 2).unwrap();
    assert_eq!(img.get_pixel(0, 0).0, [0, 255, 0]);
    assert_eq!(img.get_pixel(1, 0).0, [255, 0, 0]);
    assert_eq!(img.get_pixel(0, 1).0, [128, 0, 0]);
}
