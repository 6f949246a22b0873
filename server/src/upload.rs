//! Request bodies into the request's temporary directory: multipart files streamed to disk with
//! a byte count per field, or the JSON variant with base64 files. Nothing here decodes audio or
//! images; [`crate::validate`] does, after the whole body has arrived within its limits.

use crate::error::ApiError;
use crate::options::{RawOptions, MAX_TEXT_BYTES};
use axum::body::Bytes;
use axum::extract::multipart::MultipartError;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{header, HeaderMap, StatusCode};
use base64::Engine as _;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    Multipart,
    Json,
}

/// The body's kind from `Content-Type` (415 for anything else), after refusing a declared length
/// over the limit (413) before reading a byte of it.
pub fn body_kind(headers: &HeaderMap, max_body: usize) -> Result<BodyKind, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > max_body as u64) {
        return Err(ApiError::too_large(format!("the body is {n} bytes; the limit is {max_body} (--max-body-mb)")));
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    match ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase().as_str() {
        "multipart/form-data" => Ok(BodyKind::Multipart),
        "application/json" => Ok(BodyKind::Json),
        "" => Err(unsupported("no Content-Type")),
        other => Err(unsupported(&format!("Content-Type {other}"))),
    }
}

fn unsupported(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!("{what}: send multipart/form-data or application/json"),
    )
}

/// What a body held: files saved under the request's directory, and the text options.
#[derive(Debug, Default, Clone)]
pub struct Upload {
    pub files: Vec<(&'static str, PathBuf)>,
    pub options: RawOptions,
}

impl Upload {
    pub fn file(&self, name: &str) -> Option<&Path> {
        self.files.iter().find(|(n, _)| *n == name).map(|(_, p)| p.as_path())
    }
}

fn multipart_error(e: MultipartError) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(format!("the body is larger than the limit (--max-body-mb): {}", e.body_text()))
    } else {
        ApiError::bad_request(format!("malformed multipart body: {}", e.body_text()))
    }
}

fn io_error(e: std::io::Error) -> ApiError {
    ApiError::internal("writing the upload", e)
}

/// Streams a multipart body: the fields named in `files` go to `dir/<name>` (each at most
/// `max_field` bytes), every other field is a text option.
pub async fn read_multipart(
    req: Request,
    dir: &Path,
    files: &[&'static str],
    max_field: usize,
) -> Result<Upload, ApiError> {
    let mut mp = Multipart::from_request(req, &())
        .await
        .map_err(|r| ApiError::new(r.status(), "bad_multipart", r.body_text()))?;
    let mut up = Upload::default();
    while let Some(mut field) = mp.next_field().await.map_err(multipart_error)? {
        let name = field.name().unwrap_or_default().to_string();
        if let Some(&file) = files.iter().find(|&&f| f == name) {
            if up.file(file).is_some() {
                return Err(ApiError::invalid("duplicate_field", format!("field '{name}' is given twice")));
            }
            // A browser form whose file input was left empty sends an empty part without a name.
            let unnamed = field.file_name().is_none_or(str::is_empty);
            let path = dir.join(file);
            let mut out = tokio::fs::File::create(&path).await.map_err(io_error)?;
            let mut n = 0usize;
            while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                n += chunk.len();
                if n > max_field {
                    return Err(ApiError::too_large(format!("field '{name}' is larger than {max_field} bytes")));
                }
                out.write_all(&chunk).await.map_err(io_error)?;
            }
            out.flush().await.map_err(io_error)?;
            if n == 0 {
                if unnamed {
                    continue;
                }
                return Err(ApiError::invalid("empty_field", format!("field '{name}' is empty")));
            }
            up.files.push((file, path));
        } else {
            let mut text = Vec::new();
            while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                text.extend_from_slice(&chunk);
                if text.len() > MAX_TEXT_BYTES {
                    return Err(ApiError::too_large(format!("field '{name}' is larger than {MAX_TEXT_BYTES} bytes")));
                }
            }
            let text = String::from_utf8(text)
                .map_err(|_| ApiError::invalid("invalid_option", format!("field '{name}' is not UTF-8 text")))?;
            up.options.set(&name, text)?;
        }
    }
    Ok(up)
}

/// The JSON variant of `/generate`. Files come inline as base64; no URL is ever fetched.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerateJson {
    audio_b64: String,
    #[serde(alias = "video_b64")]
    avatar_b64: Option<String>,
    avatar_id: Option<String>,
    stride: Option<Scalar>,
    decoder: Option<String>,
    keyframes: Option<Keyframes>,
    method: Option<String>,
    infill: Option<String>,
    ramp: Option<Scalar>,
    fps: Option<Scalar>,
    encoder: Option<String>,
    face_box: Option<String>,
    face_boxes: Option<String>,
    face_index: Option<Scalar>,
    bbox_shift: Option<Scalar>,
    vad: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Scalar {
    Number(serde_json::Number),
    Text(String),
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Keyframes {
    List(Vec<u64>),
    Text(String),
}

impl Scalar {
    fn text(self) -> String {
        match self {
            Scalar::Number(n) => n.to_string(),
            Scalar::Text(s) => s,
        }
    }
}

/// Reads a JSON body (at most the body limit), writing its files as `audio` and `video` into
/// `dir`, as the multipart form names them.
pub async fn read_json(req: Request, dir: &Path) -> Result<Upload, ApiError> {
    let bytes = Bytes::from_request(req, &()).await.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large("the body is larger than the limit (--max-body-mb)")
        } else {
            ApiError::bad_request(r.body_text())
        }
    })?;
    let j: GenerateJson =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("invalid_json", format!("the JSON body: {e}")))?;
    drop(bytes);
    let mut up = Upload::default();
    for (name, b64) in [("audio", Some(j.audio_b64)), ("video", j.avatar_b64)] {
        let Some(b64) = b64 else { continue };
        let data = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| ApiError::invalid("invalid_base64", format!("{name}: {e}")))?;
        let path = dir.join(name);
        tokio::fs::write(&path, data).await.map_err(io_error)?;
        up.files.push((name, path));
    }
    let text = [
        ("stride", j.stride.map(Scalar::text)),
        ("decoder", j.decoder),
        ("method", j.method),
        ("infill", j.infill),
        ("ramp", j.ramp.map(Scalar::text)),
        ("fps", j.fps.map(Scalar::text)),
        ("encoder", j.encoder),
        ("face_box", j.face_box),
        ("face_boxes", j.face_boxes),
        ("face_index", j.face_index.map(Scalar::text)),
        ("bbox_shift", j.bbox_shift.map(Scalar::text)),
        ("avatar_id", j.avatar_id),
        ("vad", j.vad),
        (
            "keyframes",
            j.keyframes.map(|k| match k {
                Keyframes::List(v) => v.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                Keyframes::Text(s) => s,
            }),
        ),
    ];
    for (k, v) in text {
        if let Some(v) = v {
            up.options.set(k, v)?;
        }
    }
    Ok(up)
}
