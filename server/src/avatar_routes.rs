//! `POST /v1/avatars` (multipart `image`: a PNG/JPEG image or an H.264 MP4 video avatar, also
//! accepted as `video`; optional `face_box`, `face_boxes` and `decoder`) prepares an avatar once
//! and answers its content-derived id; `GET` and `DELETE /v1/avatars/{id}` read and drop it.

use crate::avatars::{avatar_id, AvatarEntry};
use crate::error::ApiError;
use crate::fleet_avatars;
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
use cadence::musetalk::avatar_file;
use std::sync::Arc;

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
        Ok::<_, ApiError>((fleet_avatars::media_of(checked, &bytes), bytes))
    })
    .await
    .map_err(|e| ApiError::internal("a worker thread failed", e))?
    .map_err(rejected(&state, "invalid"))?;

    let (media, face_report) = media;
    let id = avatar_id(&bytes, media.faces());
    let decoder = settings.decoder;
    let existing = state.avatars.lock().unwrap().get(&id);
    let fleet = state.fleet.get().cloned();
    // Known here and, in a fleet, still in the fleet (not deleted through another replica).
    let in_fleet = match &fleet {
        Some(f) => Some(fleet_avatars::exists(f, &id).await?),
        None => None,
    };
    if let Some(e) = existing.as_ref().filter(|e| e.prepared(decoder).is_some() && in_fleet != Some(false)) {
        return Ok(answer(StatusCode::OK, e));
    }
    let created = existing.is_none() && in_fleet != Some(true);
    let entry = existing.unwrap_or_else(|| Arc::new(AvatarEntry::new(id, media, bytes.len(), face_report)));
    // Prepared once for the whole fleet: another replica's preparation is read, not made again.
    if let Some(f) = fleet.as_ref().filter(|_| in_fleet == Some(true)) {
        if fleet_avatars::load_prepared(f, &set, &entry, decoder).await {
            drop((guard, dir));
            let cached = state.avatars.lock().unwrap().insert_arc(entry);
            return Ok(answer(StatusCode::OK, &cached));
        }
    }
    let slot = state.admission.admit().await.map_err(|q| {
        state.metrics.rejection("queue_full");
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", "every render slot is busy and the queue is full")
            .with_retry_after(state.retry_after(q.ahead))
    })?;
    let (st, e, publish) = (state.clone(), entry.clone(), fleet.is_some());
    let scratch = dir.path().to_path_buf();
    let stored = tokio::task::spawn_blocking(move || {
        slot.run(|| {
            let (engines, _) = set.get(decoder)?;
            let (prepared, _) = render_job::avatar_for(&set, &engines, &e, &st.metrics, &scratch)?;
            // What the fleet stores: the preparation in the `.cadence-avatar` format.
            publish.then(|| avatar_file::encode(&prepared, &engines)).transpose()
        })
    })
    .await
    .map_err(|e| ApiError::internal("a worker thread failed", e))?
    .map_err(|e| ApiError::internal("preparing the avatar", format!("{e:#}")))?;
    if let (Some(f), Some(prepared)) = (&fleet, stored) {
        fleet_avatars::publish(f, &entry, field, &up.options, bytes, decoder, prepared).await?;
    }
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
    let e = match state.fleet.get() {
        Some(fleet) => fleet_avatars::ensure(&state, fleet, &id, None).await?,
        None => lookup(&state, &id)?,
    };
    Ok(answer(StatusCode::OK, &e))
}

/// Drops the avatar; in a fleet, from the fleet's store too (for every replica).
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    match state.fleet.get() {
        Some(fleet) => {
            let had = fleet_avatars::delete(fleet, &id).await?;
            if !state.avatars.lock().unwrap().remove(&id) && !had {
                return Err(crate::generate::avatar_not_found(&id));
            }
        }
        None => {
            lookup(&state, &id)?;
            state.avatars.lock().unwrap().remove(&id);
        }
    }
    Ok(StatusCode::NO_CONTENT)
}
