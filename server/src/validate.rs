//! The uploaded files checked and decoded by the CLI's own loaders, before any engine work: a
//! corrupt WAV, image or video, NaN samples, audio over `--max-seconds`, images (and video
//! frames) over `--max-pixels` and video avatars over `--max-avatar-mb` decoded are 422.
//! Messages name the form field, not the server's temporary path.

use crate::error::ApiError;
use crate::options::Settings;
use cadence::avatar::{self as host_avatar, AvatarSource, FaceSpec};
use cadence_media::{Audio, FaceBox, RgbImage};
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
    cadence::frame_loop::audio::load_audio(path, max_seconds)
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
    cadence::avatar::load_avatar(path).map_err(|e| invalid(format!("{e:#}")))
}

/// What the server bounds in an avatar a client sends (the operator's default avatar is not).
#[derive(Clone, Copy, Debug)]
pub struct AvatarLimits {
    /// Pixels of the image, or of each frame of a video (`--max-pixels`).
    pub max_pixels: u64,
    /// A video's frames decoded as RGB, all together (`--max-avatar-mb`): the decoding work
    /// a request may ask for, bounded before any frame is decoded.
    pub max_decoded_bytes: u64,
}

impl AvatarLimits {
    /// No bound: the operator's own default avatar.
    pub const NONE: Self = Self { max_pixels: u64::MAX, max_decoded_bytes: u64::MAX };
}

/// An avatar file checked: a still image with its face box (and the detector's landmarks when
/// it found the face), or a video avatar (an H.264 MP4) whose container and every frame were
/// checked. `report` describes the face box ([`cadence::avatar::faces::report`]).
pub enum AvatarFile {
    Image { image: RgbImage, face: FaceBox, landmarks: Option<[[f32; 2]; 5]>, report: serde_json::Value },
    Video(AvatarSource),
}

/// The 422 for a face box that could not be had: `no_face` when the detector could not give it,
/// else `invalid_face_box`.
fn face_error(e: &anyhow::Error, message: String) -> ApiError {
    let code = if cadence::avatar::faces::is_no_face(e) { "no_face" } else { "invalid_face_box" };
    // The CLI's wording, in the API's field names (and without the CLI's hint).
    let message = message.replace("; `cadence faces detect` shows what the detector sees", "");
    ApiError::invalid(code, message.replace("--face-box", "face_box").replace("--face-index", "face_index"))
}

/// The avatar in `path` (form field `field`): an MP4 (by its `ftyp` box, the CLI's own test) is
/// a video avatar, anything else must be a PNG or JPEG image. The face box comes from
/// `settings` (`face_box`, `face_boxes`: the text of a face-box file, one box per video frame,
/// written into `dir` for the CLI's reader; neither: the detector finds the face).
pub fn avatar(
    path: &Path,
    field: &str,
    limits: AvatarLimits,
    settings: &Settings,
    dir: &Path,
) -> Result<AvatarFile, ApiError> {
    let boxes_path = dir.join("face_boxes.txt");
    let spec = settings.face_spec(settings.face_boxes.as_ref().map(|_| boxes_path.clone()))?;
    if !host_avatar::is_mp4(path) {
        if settings.face_boxes.is_some() {
            return Err(ApiError::invalid(
                "invalid_face_box",
                format!("face_boxes gives one box per frame of a video avatar; {field} is an image (use face_box)"),
            ));
        }
        let image = image(path, field, limits.max_pixels)?;
        let source =
            AvatarSource::from_image(image, Path::new(field), &spec).map_err(|e| face_error(&e, format!("{e:#}")))?;
        let report = cadence::avatar::faces::report(&source);
        let (face, landmarks) = (source.faces[0], source.landmarks(0).copied());
        let image = source.into_still().expect("an image avatar is a still");
        return Ok(AvatarFile::Image { image, face, landmarks, report });
    }
    if let Some(text) = &settings.face_boxes {
        std::fs::write(&boxes_path, text).map_err(|e| ApiError::internal("writing the face boxes", e))?;
    }
    video(path, field, limits, &spec, &boxes_path).map(AvatarFile::Video)
}

/// A video avatar: the CLI's checks from the container alone ([`AvatarSource::open`]: H.264,
/// even sides, a constant frame rate, at most [`host_avatar::MAX_AVATAR_FRAMES`] frames and
/// [`host_avatar::MAX_AVATAR_BYTES`] of per-frame tables, the face boxes), then this server's
/// bounds, then every frame decoded once (and dropped; by the detector when it finds the face),
/// so that a damaged stream is a 422 here rather than a failure in a render slot. The render
/// decodes the frames again, one at a time: holding them all would cost up to the decoded bound
/// in memory per request.
fn video(
    path: &Path,
    field: &str,
    limits: AvatarLimits,
    spec: &FaceSpec,
    boxes_path: &Path,
) -> Result<AvatarSource, ApiError> {
    let message = |e: &anyhow::Error| {
        named(format!("{e:#}"), path, field).replace(&boxes_path.display().to_string(), "face_boxes")
    };
    // The container and the server's bounds first: the detector decodes every frame.
    let probe = if spec.detects() { &FaceSpec::Centered } else { spec };
    let source = AvatarSource::open(path, probe).map_err(|e| ApiError::invalid("invalid_video", message(&e)))?;
    let (w, h, n) = (u64::from(source.width), u64::from(source.height), source.frames() as u64);
    if w * h > limits.max_pixels {
        return Err(ApiError::invalid(
            "video_too_large",
            format!(
                "{field}: frames of {w}x{h} are more than this server's limit of {} pixels (--max-pixels)",
                limits.max_pixels
            ),
        ));
    }
    let decoded = n * w * h * 3;
    if decoded > limits.max_decoded_bytes {
        return Err(ApiError::invalid(
            "video_too_large",
            format!(
                "{field}: {n} frames of {w}x{h} decode to {} MiB, more than this server's limit of {} MiB \
                 (--max-avatar-mb): send fewer or smaller frames",
                decoded >> 20,
                limits.max_decoded_bytes >> 20
            ),
        ));
    }
    if spec.detects() {
        return source.with_faces(path, spec).map_err(|e| {
            if cadence::avatar::faces::is_no_face(&e) {
                face_error(&e, message(&e))
            } else {
                ApiError::invalid("invalid_video", message(&e))
            }
        });
    }
    source.for_each_frame(|_, _| Ok(())).map_err(|e| ApiError::invalid("invalid_video", message(&e)))?;
    Ok(source)
}
