//! `POST /v1/avatars` (multipart `image`, optional `face_box` and `decoder`) prepares an avatar
//! once and answers its content-derived id; `GET` and `DELETE /v1/avatars/{id}` read and drop it.

use crate::avatars::{avatar_id, AvatarEntry};
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
use cadence::render;

pub async fn register(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let set = state.ready_engines().map_err(rejected(&state, "not_ready"))?;
    if upload::body_kind(req.headers(), state.config.max_body_bytes).map_err(rejected(&state, "invalid"))?
        != BodyKind::Multipart
    {
        state.metrics.rejection("media_type");
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the avatar as multipart/form-data (field image)",
        ));
    }
    let guard = state.track();
    let dir = tempdirs::request_dir(&state.config.temp_root)
        .map_err(|e| ApiError::internal(format!("creating the request's directory: {e}")))?;
    let up = upload::read_multipart(req, dir.path(), &["image"], state.config.max_body_bytes)
        .await
        .map_err(rejected(&state, "invalid"))?;
    let settings = up.options.settings().map_err(rejected(&state, "invalid"))?;
    if let Some(extra) = ["stride", "keyframes", "method", "ramp", "fps", "encoder", "avatar_id"]
        .into_iter()
        .find(|f| up.options.get(f).is_some())
    {
        state.metrics.rejection("invalid");
        return Err(ApiError::invalid("unknown_field", format!("{extra} is not a field of an avatar")));
    }
    let path = up
        .file("image")
        .ok_or_else(|| ApiError::invalid("missing_field", "the image field (PNG or JPEG) is required"))
        .map_err(rejected(&state, "invalid"))?
        .to_path_buf();

    // Decode and check off the runtime; then the preparation takes a render slot.
    let st = state.clone();
    let face_box = settings.face_box;
    let (image, face, bytes) = tokio::task::spawn_blocking(move || {
        let image = validate::image(&path, "image", st.config.max_pixels)?;
        let face = render::face_box(&image, face_box)
            .map_err(|e| ApiError::invalid("invalid_face_box", format!("face_box: {e:#}")))?;
        let bytes = std::fs::read(&path).map_err(|e| ApiError::internal(format!("reading the upload: {e}")))?;
        Ok::<_, ApiError>((image, face, bytes))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(rejected(&state, "invalid"))?;
    drop(dir);

    let id = avatar_id(&bytes, &face);
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
    let entry = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let entry = existing.unwrap_or_else(|| std::sync::Arc::new(AvatarEntry::new(id, image, face, bytes.len())));
        let (engines, _) = set.get(settings.decoder)?;
        render_job::avatar_for(&set, &engines, &entry, &st.metrics)?;
        Ok::<_, anyhow::Error>(entry)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(format!("preparing the avatar: {e:#}")))?;
    drop(guard);
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
