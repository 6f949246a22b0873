//! The uploaded files checked and decoded by the CLI's own loaders, before any engine work: a
//! corrupt WAV or image, NaN samples, audio over `--max-seconds` and images over `--max-pixels`
//! are 422. Messages name the form field, not the server's temporary path.

use crate::error::ApiError;
use cadence::render;
use cadence_media::{Audio, RgbImage};
use std::path::Path;

fn named(e: impl std::fmt::Display, path: &Path, field: &str) -> String {
    e.to_string().replace(&path.display().to_string(), field)
}

/// The audio field as a decoded clip.
pub fn audio(path: &Path, max_seconds: f64) -> Result<Audio, ApiError> {
    let seconds =
        cadence_media::wav_duration(path).map_err(|e| ApiError::invalid("invalid_audio", named(e, path, "audio")))?;
    if seconds > max_seconds {
        return Err(ApiError::invalid(
            "audio_too_long",
            format!("audio: {seconds:.1} s is longer than this server's limit of {max_seconds} s (--max-seconds)"),
        ));
    }
    render::load_audio(path, max_seconds)
        .map_err(|e| ApiError::invalid("invalid_audio", named(format!("{e:#}"), path, "audio")))
}

/// The avatar image, its size checked from the header before it is decoded.
pub fn image(path: &Path, field: &str, max_pixels: u64) -> Result<RgbImage, ApiError> {
    let invalid = |e: String| ApiError::invalid("invalid_image", named(e, path, field));
    let (w, h) = image::ImageReader::open(path)
        .and_then(|r| r.with_guessed_format())
        .map_err(|e| invalid(e.to_string()))?
        .into_dimensions()
        .map_err(|e| invalid(format!("{field}: not a PNG or JPEG image ({e})")))?;
    if u64::from(w) * u64::from(h) > max_pixels {
        return Err(ApiError::invalid(
            "image_too_large",
            format!("{field}: {w}x{h} is more than this server's limit of {max_pixels} pixels (--max-pixels)"),
        ));
    }
    render::load_avatar(path).map_err(|e| invalid(format!("{e:#}")))
}
