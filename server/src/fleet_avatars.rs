//! Registered avatars in a fleet ([`crate::fleet`]): an avatar registered on one replica is
//! stored in the fleet's avatar store, and any replica asked for it (`avatar_id` in a render or
//! a job, `GET /v1/avatars/{id}`) rebuilds its local cache entry from there:
//!
//! - the file as sent and the request's fields are checked again by [`validate::avatar`], the
//!   same code that checked them at registration, so the same faces are found (the id, derived
//!   from the file and its boxes, is checked against the rebuilt one);
//! - the preparation for the render's decoder (the image encoder's latents and the compositor's
//!   tables) is read in the `.cadence-avatar` format, not computed again. A preparation made by
//!   other engines (replicas with other weights or profile) is refused by that format's check,
//!   and this replica prepares its own at render time.
//!
//! The local cache stays bounded as on a single replica; the store is the fleet's record, so a
//! `DELETE` through any replica removes the avatar for every replica (each checks the store
//! before it uses its cached copy).

use crate::avatars::{avatar_id, decoder_name, AvatarEntry, AvatarMedia};
use crate::engines::EngineSet;
use crate::error::ApiError;
use crate::fleet::{unavailable, Fleet};
use crate::generate::{avatar_not_found, check_avatar_id};
use crate::options::RawOptions;
use crate::state::AppState;
use crate::upload::Upload;
use crate::{tempdirs, validate};
use cadence::musetalk::{avatar_file, DecoderKind};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What a registration sent besides its file: the file's field and the text fields.
#[derive(Serialize, Deserialize)]
struct AvatarRequest {
    field: String,
    options: Vec<(String, String)>,
}

fn object(id: &str, what: &str) -> String {
    format!("{id}/{what}")
}

const REQUEST: &str = "request.json";
const SOURCE: &str = "source";

/// The avatar media of a checked avatar file, and the face report shown for it.
pub fn media_of(checked: validate::AvatarFile, bytes: &[u8]) -> (AvatarMedia, serde_json::Value) {
    match checked {
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
                mp4: bytes.to_vec(),
            };
            (media, report)
        }
    }
}

/// Whether the fleet holds avatar `id`.
pub async fn exists(fleet: &Fleet, id: &str) -> Result<bool, ApiError> {
    fleet.has_avatar_object(&object(id, REQUEST)).await.map_err(unavailable)
}

/// Stores a registration in the fleet: the file and the fields unless they are there, and the
/// preparation for `decoder`.
pub async fn publish(
    fleet: &Fleet,
    entry: &AvatarEntry,
    field: &str,
    options: &RawOptions,
    source: Vec<u8>,
    decoder: DecoderKind,
    prepared: Vec<u8>,
) -> Result<(), ApiError> {
    let id = &entry.id;
    fleet.put_avatar_object(&object(id, decoder_name(decoder)), prepared).await.map_err(unavailable)?;
    if !exists(fleet, id).await? {
        let request = AvatarRequest {
            field: field.to_string(),
            options: options.pairs().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        fleet.put_avatar_object(&object(id, SOURCE), source).await.map_err(unavailable)?;
        // Written last: the avatar exists for the fleet once its request does.
        let json = serde_json::to_vec(&request).map_err(|e| ApiError::internal("encoding the avatar's request", e))?;
        fleet.put_avatar_object(&object(id, REQUEST), json).await.map_err(unavailable)?;
    }
    tracing::info!(avatar_id = %id, decoder = decoder_name(decoder), "avatar stored in the fleet");
    Ok(())
}

/// Reads the fleet's preparation of `entry` for `decoder` into the entry; false when the fleet
/// has none, or one these engines refuse (then this replica prepares its own).
pub async fn load_prepared(
    fleet: &Fleet,
    set: &Arc<EngineSet>,
    entry: &Arc<AvatarEntry>,
    decoder: DecoderKind,
) -> bool {
    if entry.prepared(decoder).is_some() {
        return true;
    }
    let bytes = match fleet.avatar_object(&object(&entry.id, decoder_name(decoder))).await {
        Ok(Some(b)) => b,
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!("{e:#}");
            return false;
        }
    };
    let (set, e) = (set.clone(), entry.clone());
    let loaded = tokio::task::spawn_blocking(move || {
        let (engines, _) = set.get(decoder)?;
        let p = avatar_file::decode(&bytes, &engines, &set.backend)?;
        anyhow::ensure!(p.avatar.len() == e.media.faces().len(), "the stored preparation has another frame count");
        e.set_prepared(decoder, Arc::new(p));
        Ok(())
    })
    .await;
    match loaded {
        Ok(Ok(())) => {
            tracing::info!(avatar_id = %entry.id, decoder = decoder_name(decoder), "prepared avatar read from the fleet");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(avatar_id = %entry.id, "the fleet's prepared avatar is not usable here ({e:#}): preparing it here");
            false
        }
        Err(e) => {
            tracing::warn!("reading a prepared avatar: {e}");
            false
        }
    }
}

/// Avatar `id` as the fleet has it, in this replica's cache, with its preparation for
/// `decoder` when the fleet has one: 422 for a malformed id, 404 when the fleet has no such
/// avatar (a copy cached here is dropped then: it was deleted through another replica).
pub async fn ensure(
    state: &AppState,
    fleet: &Fleet,
    id: &str,
    decoder: Option<DecoderKind>,
) -> Result<Arc<AvatarEntry>, ApiError> {
    check_avatar_id(id)?;
    let not_found = || avatar_not_found(id);
    if !exists(fleet, id).await? {
        state.avatars.lock().unwrap().remove(id);
        return Err(not_found());
    }
    let cached = state.avatars.lock().unwrap().get(id);
    let entry = match cached {
        Some(e) => e,
        None => {
            let request =
                fleet.avatar_object(&object(id, REQUEST)).await.map_err(unavailable)?.ok_or_else(not_found)?;
            let source = fleet.avatar_object(&object(id, SOURCE)).await.map_err(unavailable)?.ok_or_else(not_found)?;
            let request: AvatarRequest = serde_json::from_slice(&request)
                .map_err(|e| ApiError::internal("reading the fleet's avatar request", e))?;
            let entry = rebuild(state, id, request, source).await?;
            state.avatars.lock().unwrap().insert_arc(entry)
        }
    };
    if let (Some(decoder), Ok(set)) = (decoder, state.ready_engines()) {
        load_prepared(fleet, &set, &entry, decoder).await;
    }
    Ok(entry)
}

/// The cache entry of a registration the fleet stored: its file checked again with its fields.
async fn rebuild(
    state: &AppState,
    id: &str,
    request: AvatarRequest,
    source: Vec<u8>,
) -> Result<Arc<AvatarEntry>, ApiError> {
    let mut options = RawOptions::default();
    for (name, value) in request.options {
        options.set(&name, value)?;
    }
    let settings = options.settings()?;
    let dir = tempdirs::request_dir(&state.config.temp_root)
        .map_err(|e| ApiError::internal("creating the request's directory", e))?;
    let (st, id) = (state.clone(), id.to_string());
    tokio::task::spawn_blocking(move || {
        let path = dir.path().join(&request.field);
        std::fs::write(&path, &source).map_err(|e| ApiError::internal("writing the avatar's file", e))?;
        let checked = validate::avatar(&path, &request.field, st.config.avatar_limits(), &settings, dir.path())?;
        let (media, report) = media_of(checked, &source);
        let rebuilt = avatar_id(&source, media.faces());
        if rebuilt != id {
            return Err(ApiError::internal(
                "rebuilding a fleet avatar",
                format!("avatar {id} checked here gives id {rebuilt} (replicas of different versions?)"),
            ));
        }
        Ok(Arc::new(AvatarEntry::new(id, media, source.len(), report)))
    })
    .await
    .map_err(|e| ApiError::internal("a worker thread failed", e))?
}

/// Before a render request's fields are checked: its `avatar_id`, if any, brought into this
/// replica's cache from the fleet (the check then finds it there).
pub async fn before_check(state: &AppState, up: &Upload) -> Result<(), ApiError> {
    let (Some(fleet), Some(id)) = (state.fleet.get(), up.options.get("avatar_id")) else { return Ok(()) };
    let decoder = up.options.settings()?.decoder;
    ensure(state, fleet, id, Some(decoder)).await.map(|_| ())
}

/// Removes avatar `id` from the fleet; false when the fleet had none.
pub async fn delete(fleet: &Fleet, id: &str) -> Result<bool, ApiError> {
    check_avatar_id(id)?;
    let had = exists(fleet, id).await?;
    // The request first: the avatar is gone for every replica from then on.
    if had {
        fleet.delete_avatar_objects(&object(id, REQUEST)).await.map_err(unavailable)?;
    }
    fleet.delete_avatar_objects(&format!("{id}/")).await.map_err(unavailable)?;
    Ok(had)
}
