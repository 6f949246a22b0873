//! What the avatar code makes of a face (issue 40), drawn: on each test image, MTCNN's box
//! (blue), its 5 landmarks (yellow), MuseTalk's crop derived from them (green,
//! `cadence::avatar::faces::musetalk_crop`) and the lower-face blend mask
//! (`cadence::avatar::mask::lower_face_alpha`, tinted magenta by its weight) that replaces the
//! feathered rectangle.
//!
//! The images are the committed ones of fixtures/mtcnn (a public-domain portrait, a CC0 photograph
//! without a face) and the bundled cartoon anchor: the portrait, mirrored, placed in a 1080x1920
//! frame, two portraits side by side (the largest face is the default choice), the anchor, and
//! the photograph without a face. Each tile shows the region around the crop (the whole image
//! where there is no face), scaled to 384x384.
//!
//! Writes `faces_grid.png` (2 rows of 3 tiles, in the order above) and `faces_grid.csv` (per
//! image: faces found, the chosen face's score, the crop, and the share of the crop the mask
//! covers), with provenance.

use anyhow::{Context, Result};
use cadence::avatar::faces::musetalk_crop;
use cadence::avatar::mask::lower_face_alpha;
use cadence::measure::fixtures::place_image;
use cadence_engines::mtcnn::detect::{Mtcnn, MtcnnConfig};
use cadence_engines::Device;
use cadence_media::RgbImage;
use clap::Parser;
use experiments::{workspace_root, write_csv, OutDir, Provenance};
use image::{imageops, Rgb};

const TILE: u32 = 384;

#[derive(Parser, Debug)]
#[command(
    name = "faces_grid",
    about = "A picture grid of the face found on the test images: MTCNN's box and landmarks, MuseTalk's crop and the lower-face blend mask"
)]
struct Args {
    #[command(flatten)]
    out: OutDir,
}

#[derive(serde::Serialize)]
struct Row {
    image: String,
    width: u32,
    height: u32,
    faces: usize,
    score: Option<f32>,
    crop_x: Option<u32>,
    crop_y: Option<u32>,
    crop_w: Option<u32>,
    crop_h: Option<u32>,
    mask_mean: Option<f64>,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("faces_grid: error: {e:#}");
        std::process::exit(1);
    }
}

fn mirrored(img: &RgbImage) -> RgbImage {
    imageops::flip_horizontal(img)
}

fn side_by_side(a: &RgbImage, b: &RgbImage) -> RgbImage {
    let mut out = RgbImage::new(a.width() + b.width(), a.height().max(b.height()));
    imageops::replace(&mut out, a, 0, 0);
    imageops::replace(&mut out, b, a.width() as i64, 0);
    out
}

/// A filled square of `r` pixels around (x, y).
fn dot(img: &mut RgbImage, x: f32, y: f32, r: i64, c: Rgb<u8>) {
    for dy in -r..=r {
        for dx in -r..=r {
            let (px, py) = (x as i64 + dx, y as i64 + dy);
            if px >= 0 && py >= 0 && (px as u32) < img.width() && (py as u32) < img.height() {
                img.put_pixel(px as u32, py as u32, c);
            }
        }
    }
}

/// A rectangle outline `t` pixels thick.
fn outline(img: &mut RgbImage, x1: f32, y1: f32, x2: f32, y2: f32, t: i64, c: Rgb<u8>) {
    let (w, h) = (img.width() as i64, img.height() as i64);
    let (x1, y1, x2, y2) = (x1 as i64, y1 as i64, x2 as i64, y2 as i64);
    for y in y1.max(0)..=y2.min(h - 1) {
        for x in x1.max(0)..=x2.min(w - 1) {
            let edge = (x - x1).abs() < t || (x2 - x).abs() < t || (y - y1).abs() < t || (y2 - y).abs() < t;
            if edge {
                img.put_pixel(x as u32, y as u32, c);
            }
        }
    }
}

fn run(a: Args) -> Result<()> {
    let out_dir = a.out.dir()?;
    let root = workspace_root();
    let load = |p: &str| cadence_media::load_image(root.join(p)).with_context(|| p.to_string());
    let portrait = load("fixtures/mtcnn/astronaut.png")?;
    let scenes: Vec<(&str, RgbImage)> = vec![
        ("portrait", portrait.clone()),
        ("portrait mirrored", mirrored(&portrait)),
        ("portrait in 1080x1920", place_image(&portrait, 1080, 1920, 317.0, 903.0, 110)),
        (
            "two portraits",
            side_by_side(&portrait, &imageops::resize(&portrait, 384, 384, imageops::FilterType::Triangle)),
        ),
        ("cartoon anchor 1080x1920", load("experiments/assets/anchor_1080x1920.png")?),
        ("photograph without a face", load("fixtures/mtcnn/coffee.png")?),
    ];
    let mtcnn = Mtcnn::new(&Device::Cpu, MtcnnConfig::default())?;
    let mut grid = RgbImage::from_pixel(3 * TILE, 2 * TILE, Rgb([255, 255, 255]));
    let mut rows = Vec::new();
    for (k, (name, img)) in scenes.iter().enumerate() {
        let (w, h) = img.dimensions();
        let faces = mtcnn.detect(img.as_raw(), w as usize, h as usize)?;
        let mut drawn = img.clone();
        let mut row = Row {
            image: name.to_string(),
            width: w,
            height: h,
            faces: faces.len(),
            score: None,
            crop_x: None,
            crop_y: None,
            crop_w: None,
            crop_h: None,
            mask_mean: None,
        };
        // The region the tile shows: around the crop, or the whole image.
        let mut view = (0, 0, w, h);
        if let Some(f) = faces.first() {
            let crop = musetalk_crop(f, 0, w, h)?;
            let alpha = lower_face_alpha(&crop, &f.landmarks)?;
            let side = (crop.w.max(crop.h) as f32 * 1.6) as u32;
            let side = side.min(w).min(h);
            let cx = (crop.x + crop.w / 2).saturating_sub(side / 2).min(w - side);
            let cy = (crop.y + crop.h / 2).saturating_sub(side / 2).min(h - side);
            view = (cx, cy, side, side);

            for (i, a) in alpha.iter().enumerate() {
                let (x, y) = (crop.x + i as u32 % crop.w, crop.y + i as u32 / crop.w);
                let p = drawn.get_pixel_mut(x, y);
                let tint = [255.0, 0.0, 255.0];
                for c in 0..3 {
                    p[c] = (p[c] as f32 * (1.0 - 0.5 * a) + tint[c] * 0.5 * a).round() as u8;
                }
            }
            // Lines and dots about 2 px thick in the tile.
            let t = (side / 190).max(1) as i64;
            let (cx2, cy2) = ((crop.x + crop.w - 1) as f32, (crop.y + crop.h - 1) as f32);
            outline(&mut drawn, crop.x as f32, crop.y as f32, cx2, cy2, t, Rgb([0, 200, 0]));
            outline(&mut drawn, f.bbox[0], f.bbox[1], f.bbox[2], f.bbox[3], t, Rgb([40, 90, 255]));
            for l in &f.landmarks {
                dot(&mut drawn, l[0], l[1], 2 * t, Rgb([255, 230, 0]));
            }
            row.score = Some(f.score);
            (row.crop_x, row.crop_y, row.crop_w, row.crop_h) = (Some(crop.x), Some(crop.y), Some(crop.w), Some(crop.h));
            row.mask_mean = Some(alpha.iter().map(|&a| a as f64).sum::<f64>() / alpha.len() as f64);
        }
        let region = imageops::crop_imm(&drawn, view.0, view.1, view.2, view.3).to_image();
        let scale = TILE as f32 / region.width().max(region.height()) as f32;
        let (tw, th) = ((region.width() as f32 * scale) as u32, (region.height() as f32 * scale) as u32);
        let tile = imageops::resize(&region, tw.max(1), th.max(1), imageops::FilterType::Triangle);
        let (gx, gy) = ((k as u32 % 3) * TILE, (k as u32 / 3) * TILE);
        imageops::replace(&mut grid, &tile, (gx + (TILE - tw) / 2) as i64, (gy + (TILE - th) / 2) as i64);
        eprintln!("{name}: {} face(s), crop {:?}", faces.len(), (row.crop_x, row.crop_y, row.crop_w, row.crop_h));
        rows.push(row);
    }
    let mut prov = Provenance::gather("cpu", "n/a", "MTCNN: facenet-pytorch 2.6.0's trained weights");
    prov.note("cpu_loops", cadence_engines::isa::describe());
    let png = out_dir.join("faces_grid.png");
    grid.save(&png).with_context(|| png.display().to_string())?;
    write_csv(&out_dir.join("faces_grid.csv"), &prov, &rows)?;
    eprintln!("wrote {} and faces_grid.csv", png.display());
    Ok(())
}
