//! Avatar image input (PNG/JPEG through the `image` crate), the face box, the 256x256 crop
//! for the image encoder, and the inverse mapping of a decoded crop back into the frame.

use std::path::Path;

use image::imageops::{self, FilterType};
pub use image::RgbImage;

use crate::error::{io_err, MediaError, Result};

/// Smallest accepted image side in pixels.
pub const MIN_SIDE: u32 = 64;
/// Largest accepted image side in pixels: the avatar is the output frame, so this is the
/// encoder's limit ([`crate::video::MAX_FRAME_SIDE`]), and an image the encoder would refuse is
/// refused when it is read.
pub const MAX_SIDE: u32 = crate::video::MAX_FRAME_SIDE;

/// Largest avatar file accepted: a 3840x3840 RGB PNG with no compression at all is 44 MB.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// Loads a PNG or JPEG as 8-bit RGB (alpha dropped, 16-bit scaled down).
///
/// Both sides at least `MIN_SIDE` (64), and a size the encoder takes
/// ([`crate::video::check_frame_size`]: at most 3840x2160 or 2160x3840); the size is checked from the
/// header before the pixels are decoded.
pub fn load_image(path: impl AsRef<Path>) -> Result<RgbImage> {
    let path = path.as_ref();
    let err = |detail: String| MediaError::Image { path: path.display().to_string(), detail };
    let len = std::fs::metadata(path).map_err(|e| io_err(path, e))?.len();
    if len > MAX_FILE_BYTES {
        return Err(err(format!("{len} bytes is larger than any avatar image cadence reads ({MAX_FILE_BYTES})")));
    }
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    decode_image(&bytes).map_err(err)
}

/// A PNG's or JPEG's width and height from its header alone (the file size and the sides
/// checked as [`load_image`] does), without decoding the pixels.
pub fn image_size(path: impl AsRef<Path>) -> Result<(u32, u32)> {
    let path = path.as_ref();
    let err = |detail: String| MediaError::Image { path: path.display().to_string(), detail };
    let len = std::fs::metadata(path).map_err(|e| io_err(path, e))?.len();
    if len > MAX_FILE_BYTES {
        return Err(err(format!("{len} bytes is larger than any avatar image cadence reads ({MAX_FILE_BYTES})")));
    }
    let reader = image::ImageReader::open(path).map_err(|e| io_err(path, e))?;
    let reader = reader.with_guessed_format().map_err(|e| io_err(path, e))?;
    match reader.format() {
        Some(image::ImageFormat::Png | image::ImageFormat::Jpeg) => {}
        Some(other) => return Err(err(format!("{other:?} images are not supported (PNG or JPEG)"))),
        None => return Err(err("not a PNG or JPEG image".into())),
    }
    let (w, h) = reader.into_dimensions().map_err(|e| err(format!("unreadable image ({e})")))?;
    check_size(w, h).map_err(err)?;
    Ok((w, h))
}

/// Decodes a PNG or JPEG held in memory (see [`load_image`]); the error is the detail only.
pub fn decode_image(bytes: &[u8]) -> std::result::Result<RgbImage, String> {
    // The format is judged from the content only (not the file name's extension).
    let format = match image::guess_format(bytes) {
        Ok(fmt @ (image::ImageFormat::Png | image::ImageFormat::Jpeg)) => fmt,
        Ok(other) => return Err(format!("{other:?} images are not supported (PNG or JPEG)")),
        Err(_) => return Err("not a PNG or JPEG image".into()),
    };
    let open = || {
        let mut r = image::ImageReader::new(std::io::Cursor::new(bytes));
        r.set_format(format);
        r
    };
    let (w, h) = open().into_dimensions().map_err(|e| format!("unreadable image ({e})"))?;
    check_size(w, h)?;
    let mut reader = open();
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| format!("unreadable image ({e})"))?;
    Ok(img.into_rgb8())
}

fn check_size(w: u32, h: u32) -> std::result::Result<(), String> {
    if w < MIN_SIDE || h < MIN_SIDE {
        return Err(format!("image is {w}x{h}, smaller than the minimum {MIN_SIDE}x{MIN_SIDE}"));
    }
    crate::video::check_frame_size(w, h).map_err(|e| format!("image is {e}"))
}

/// A face box in image pixels: top-left corner and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaceBox {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

impl FaceBox {
    /// (x, y, w, h) as `usize`, for indexing.
    pub fn as_usize(&self) -> (usize, usize, usize, usize) {
        (self.x as usize, self.y as usize, self.w as usize, self.h as usize)
    }

    /// The default box: a square of half the image's shorter side, centred.
    pub fn centered(width: u32, height: u32) -> FaceBox {
        let side = (width.min(height) / 2).max(1);
        FaceBox { x: (width - side) / 2, y: (height - side) / 2, w: side, h: side }
    }

    /// Checks that the box has at least 16x16 pixels and lies inside a `width` x `height`
    /// image.
    pub fn validate(&self, width: u32, height: u32) -> Result<()> {
        let err = |detail: String| MediaError::FaceBox { x: self.x, y: self.y, w: self.w, h: self.h, detail };
        if self.w < 16 || self.h < 16 {
            return Err(err("the box must be at least 16x16 pixels".into()));
        }
        let right = self.x as u64 + self.w as u64;
        let bottom = self.y as u64 + self.h as u64;
        if right > width as u64 || bottom > height as u64 {
            return Err(err(format!("the box reaches ({right},{bottom}), outside the {width}x{height} image")));
        }
        Ok(())
    }
}

/// Crops `face` out of `img` and resizes it (bilinear, `image`'s Triangle filter) to
/// `side` x `side`, returned planar (CHW: R plane, G plane, B plane) f32 in [0, 1]:
/// the input layout of the image encoders (their side is `cadence_engines::FACE_SIDE`).
pub fn crop_to_planar(img: &RgbImage, face: &FaceBox, side: u32) -> Result<Vec<f32>> {
    face.validate(img.width(), img.height())?;
    if side == 0 {
        return Err(MediaError::InvalidInput("crop side must be positive".into()));
    }
    let crop = imageops::crop_imm(img, face.x, face.y, face.w, face.h).to_image();
    let resized = imageops::resize(&crop, side, side, FilterType::Triangle);
    let n = (side * side) as usize;
    let mut out = vec![0f32; 3 * n];
    for (i, px) in resized.pixels().enumerate() {
        out[i] = px[0] as f32 / 255.0;
        out[n + i] = px[1] as f32 / 255.0;
        out[2 * n + i] = px[2] as f32 / 255.0;
    }
    Ok(out)
}

/// Converts a planar (CHW) f32 crop in [0, 1] of `side` x `side` to an RGB8 image
/// (values clamped, rounded).
pub fn planar_to_rgb(planar: &[f32], side: u32) -> Result<RgbImage> {
    let n = (side * side) as usize;
    if planar.len() != 3 * n {
        return Err(MediaError::InvalidInput(format!(
            "planar crop has {} values, expected 3x{side}x{side} = {}",
            planar.len(),
            3 * n
        )));
    }
    let q = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round() as u8;
    let mut img = RgbImage::new(side, side);
    for (i, px) in img.pixels_mut().enumerate() {
        *px = image::Rgb([q(planar[i]), q(planar[n + i]), q(planar[2 * n + i])]);
    }
    Ok(img)
}

/// Where a decoded crop goes in the full frame: the crop resized (bilinear) to the face box's
/// size; pixel (i, j) of `rgb` belongs at frame pixel (x + i, y + j).
#[derive(Debug, Clone, PartialEq)]
pub struct PasteRegion {
    pub x: u32,
    pub y: u32,
    /// `face.w` x `face.h` RGB8.
    pub rgb: RgbImage,
}

/// The inverse of [`crop_to_planar`] for compositing: resizes the decoded `side` x `side`
/// planar crop back to the face box's size (bilinear, `image`'s Triangle filter).
/// Feathered blending and NV12 conversion are the caller's (fused with compositing).
pub fn paste_region(
    decoded_planar: &[f32],
    side: u32,
    face: &FaceBox,
    frame_width: u32,
    frame_height: u32,
) -> Result<PasteRegion> {
    face.validate(frame_width, frame_height)?;
    let crop = planar_to_rgb(decoded_planar, side)?;
    let rgb = if face.w == side && face.h == side {
        crop
    } else {
        imageops::resize(&crop, face.w, face.h, FilterType::Triangle)
    };
    Ok(PasteRegion { x: face.x, y: face.y, rgb })
}
