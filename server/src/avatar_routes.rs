//! `POST /v1/avatars` (multipart `image`: a PNG/JPEG image or an H.264 MP4 video avatar, also
//! accepted as `video`; optional `face_box`, `face_boxes` and `decoder`) prepares an avatar once
//! and answers its content-derived id; `GET` and `DELETE /v1/avatars/{id}` read and drop it.

use crate::avatars::{avatar_id, AvatarEntry, AvatarMedia};
use crate::error::ApiError;
use crate::generate::{lookup, rejected};
use crate::render_job;
use crate::state::AppState;
use crate::tempdirs;
use crate::upload::{self, BodyKind};
use crate::validate;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

pub async fn register(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let set = state.ready_engines().map_err(rejected(&state, "not_ready"))?;
    if upload::body_kind(req.headers(), state.config.max_body_bytes).map_err(rejected(&state, "invalid"))?
        != BodyKind::Multipart
    {
        state.metrics.rejection("media_type");
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the avatar as multipart/form-data (field image: PNG, JPEG or an H.264 MP4)",
        ));
    }
    let guard = state.track();
    let dir = tempdirs::request_dir(&state.config.temp_root)
        .map_err(|e| ApiError::internal("creating the request's directory", e))?;
    let up = upload::read_multipart(req, dir.path(), &["image", "video"], state.config.max_body_bytes)
        .await
        .map_err(rejected(&state, "invalid"))?;
    let settings = up.options.settings().map_err(rejected(&state, "invalid"))?;
    if let Some(extra) = ["stride", "keyframes", "method", "infill", "ramp", "fps", "encoder", "avatar_id", "vad"]
        .into_iter()
        .find(|f| up.options.get(f).is_some())
    {
        state.metrics.rejection("invalid");
        return Err(ApiError::invalid("unknown_field", format!("{extra} is not a field of an avatar")));
    }
    let (field, path) = match (up.file("image"), up.file("video")) {
        (Some(p), None) => ("image", p.to_path_buf()),
        (None, Some(p)) => ("video", p.to_path_buf()),
        (Some(_), Some(_)) => {
            state.metrics.rejection("invalid");
            return Err(ApiError::invalid("conflicting_fields", "send the avatar as image or as video, not both"));
        }
        (None, None) => {
            state.metrics.rejection("invalid");
            return Err(ApiError::invalid(
                "missing_field",
                "the image field (a PNG or JPEG image, or an H.264 MP4 video avatar) is required",
            ));
        }
    };

    // Decode and check off the runtime (a video's every frame); then the preparation takes a
    // render slot.
    let st = state.clone();
    let scratch = dir.path().to_path_buf();
    let face_settings = settings.clone();
    let (media, bytes) = tokio::task::spawn_blocking(move || {
        let checked = validate::avatar(&path, field, st.config.avatar_limits(), &face_settings, &scratch)?;
        let bytes = std::fs::read(&path).map_err(|e| ApiError::internal("reading the upload", e))?;
        let media = match checked {
            validate::AvatarFile::Image { image, face, landmarks, report } => {
                (AvatarMedia::Image { image, face, landmarks }, report)
            }
            validate::AvatarFile::Video(source) => {
                let report = cadence::avatar::faces::report(&source);
                let media = AvatarMedia::Video {
                    width: source.width,
                    height: source.height,
                    faces: source.faces.clone(),
                    found: source.found.clone(),
                    mp4: bytes.clone(),
                };
                (media, report)
            }
        };
        Ok::<_, ApiError>((media, bytes))
    })
    .await
    .map_err(|e| ApiError::internal("a worker thread failed", e))?
    .map_err(rejected(&state, "invalid"))?;

    let (media, face_report) = media;
    let id = avatar_id(&bytes, media.faces());
    let existing = state.avatars.lock().unwrap().get(&id);
    if let Some(e) = existing.as_ref().filter(|e| e.prepared(settings.decoder).is_some()) {
        return Ok(answer(StatusCode::OK, e));
    }
    let slot = state.admission.admit().await.map_err(|q| {
        state.metrics.rejection("queue_full");
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", "every render slot is busy and the queue is full")
            .with_retry_after(state.retry_after(q.ahead))
    })?;
    let st = state.clone();
    let created = existing.is_none();
    let scratch = dir.path().to_path_buf();
    let entry = tokio::task::spawn_blocking(move || {
        slot.run(|| {
            let entry =
                existing.unwrap_or_else(|| std::sync::Arc::new(AvatarEntry::new(id, media, bytes.len(), face_report)));
            let (engines, _) = set.get(settings.decoder)?;
            render_job::avatar_for(&set, &engines, &entry, &st.metrics, &scratch)?;
            Ok::<_, anyhow::Error>(entry)
        })
    })
    .await
    .map_err(|e| ApiError::internal("a worker thread failed", e))?
    .map_err(|e| ApiError::internal("preparing the avatar", format!("{e:#}")))?;
    drop((guard, dir));
    let cached = state.avatars.lock().unwrap().insert_arc(entry);
    Ok(answer(if created { StatusCode::CREATED } else { StatusCode::OK }, &cached))
}

fn answer(status: StatusCode, e: &AvatarEntry) -> Response {
    let mut body = e.describe();
    body["status"] = "ready".into();
    let mut r = (status, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/avatars/{}", e.id)) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let e = lookup(&state, &id)?;
    Ok(answer(StatusCode::OK, &e))
}

pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    lookup(&state, &id)?;
    state.avatars.lock().unwrap().remove(&id);
    Ok(StatusCode::NO_CONTENT)
}
