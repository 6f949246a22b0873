//! `POST /generate`: the source's contract (multipart `audio`, `video`, `stride`, `decoder`) and
//! its JSON variant, answered with the MP4 and the source's headers plus cadence's.
//!
//! Order of work: readiness, content type and declared length; the body streamed into the
//! request's temporary directory; every field checked and the files decoded (all before any
//! engine runs); a render slot (or the queue, or 429); the render on a blocking thread.

use crate::avatars;
use crate::error::ApiError;
use crate::options::Settings;
use crate::render_job::{self, AvatarInput, Job, Rendered};
use crate::state::AppState;
use crate::tempdirs;
use crate::upload::{self, BodyKind, Upload};
use crate::validate;
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use cadence::pipeline::RenderOptions;
use cadence::{render, KeyframeSchedule};
use cadence_media::Audio;
use std::path::Path;
use std::time::Instant;

/// Server-Timing entries: (name, milliseconds, description).
type Timing = Vec<(&'static str, f64, Option<&'static str>)>;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Counts a refusal that happens before any engine work under `reason`.
pub fn rejected<'a>(state: &'a AppState, reason: &'static str) -> impl Fn(ApiError) -> ApiError + 'a {
    move |e| {
        state.metrics.rejection(reason);
        e
    }
}

pub async fn generate(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let t_all = Instant::now();
    let set = state.ready_engines().map_err(rejected(&state, "not_ready"))?;
    let kind = upload::body_kind(req.headers(), state.config.max_body_bytes).inspect_err(|e| {
        state.metrics.rejection(if e.status == StatusCode::PAYLOAD_TOO_LARGE { "too_large" } else { "media_type" });
    })?;
    // From here a dropped future (the client went away) cancels whatever runs for it.
    let guard = state.track();
    let dir = tempdirs::request_dir(&state.config.temp_root)
        .map_err(|e| ApiError::internal(format!("creating the request's directory: {e}")))?;
    let t = Instant::now();
    let up = match kind {
        BodyKind::Multipart => {
            upload::read_multipart(req, dir.path(), &["audio", "video"], state.config.max_body_bytes).await
        }
        BodyKind::Json => upload::read_json(req, dir.path()).await,
    }
    .map_err(|e| count_invalid(&state, e))?;
    let mut timing: Timing = vec![("upload", ms(t), None)];

    let t = Instant::now();
    let (st, dir_path) = (state.clone(), dir.path().to_path_buf());
    let checked = tokio::task::spawn_blocking(move || check(&st, up, &dir_path))
        .await
        .map_err(|e| ApiError::internal(format!("checking the request: {e}")))?
        .map_err(|e| count_invalid(&state, e))?;
    timing.push(("validate", ms(t), None));

    let t = Instant::now();
    let slot = state.admission.admit().await.map_err(|q| {
        state.metrics.rejection("queue_full");
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            format!("every render slot is busy and the queue is full ({} ahead)", q.ahead),
        )
        .with_retry_after(state.retry_after(q.ahead))
    })?;
    timing.push(("queue", ms(t), None));

    let Checked { audio, avatar, schedule, settings } = checked;
    let stride = settings.stride;
    let fps = settings.fps;
    let job = Job {
        audio,
        avatar,
        schedule,
        settings,
        batch: state.config.engines.batch as usize,
        cancel: guard.flag(),
        dir,
    };
    let st = state.clone();
    let rendered = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        render_job::run(&set, &st.metrics, job)
    })
    .await
    .map_err(|e| {
        state.metrics.render_outcome("failed");
        ApiError::internal(format!("the render thread failed: {e}"))
    })??;
    drop(guard);
    Ok(response(rendered, stride, fps.hz(), timing, ms(t_all)))
}

fn count_invalid(state: &AppState, e: ApiError) -> ApiError {
    let reason = match e.status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::NOT_FOUND => "not_found",
        s if s.is_client_error() => "invalid",
        _ => return e,
    };
    state.metrics.rejection(reason);
    e
}

/// A request whose every field was checked: what the render needs.
pub struct Checked {
    pub audio: Audio,
    pub avatar: AvatarInput,
    pub schedule: KeyframeSchedule,
    pub settings: Settings,
}

fn check(state: &AppState, up: Upload, dir: &Path) -> Result<Checked, ApiError> {
    let settings = up.options.settings()?;
    let audio_path = up
        .file("audio")
        .ok_or_else(|| ApiError::invalid("missing_field", "the audio field (a WAV file) is required"))?;
    let audio = validate::audio(audio_path, state.config.max_seconds)?;
    let avatar = match &settings.avatar_id {
        Some(id) => {
            if up.file("video").is_some() || settings.face_box.is_some() {
                return Err(ApiError::invalid(
                    "conflicting_fields",
                    "avatar_id names a registered avatar: send no video or face_box with it",
                ));
            }
            AvatarInput::Cached(lookup(state, id)?)
        }
        None => {
            // The pixel bound is for what clients send, not for the operator's default.
            let (path, max_pixels) = match up.file("video") {
                Some(p) => (p.to_path_buf(), state.config.max_pixels),
                None => {
                    let p = dir.join("default_avatar");
                    std::fs::write(&p, &state.config.default_avatar)
                        .map_err(|e| ApiError::internal(format!("writing the default avatar: {e}")))?;
                    (p, u64::MAX)
                }
            };
            let image = validate::image(&path, "video", max_pixels)?;
            let face = render::face_box(&image, settings.face_box)
                .map_err(|e| ApiError::invalid("invalid_face_box", format!("face_box: {e:#}")))?;
            AvatarInput::Image { image, face }
        }
    };
    let opts = RenderOptions { fps: settings.fps, ..RenderOptions::default() };
    let frames = render::video_frames(&audio, &opts);
    if frames == 0 {
        return Err(ApiError::invalid("audio_too_short", "audio: too short for one video frame"));
    }
    let (schedule, _) = render::fixed_schedule(frames, settings.keyframes.as_deref(), settings.stride)
        .map_err(|e| ApiError::invalid("invalid_keyframes", format!("keyframes: {e:#}")))?;
    Ok(Checked { audio, avatar, schedule, settings })
}

/// The registered avatar `id` (422 for a malformed id, 404 for an unknown one).
pub fn lookup(state: &AppState, id: &str) -> Result<std::sync::Arc<avatars::AvatarEntry>, ApiError> {
    if !avatars::valid_id(id) {
        return Err(ApiError::invalid("invalid_avatar_id", "avatar_id: expected 64 lowercase hex digits"));
    }
    state.avatars.lock().unwrap().get(id).ok_or_else(|| {
        ApiError::not_found("avatar_not_found", format!("no avatar {id} (register it with POST /v1/avatars)"))
    })
}

/// Header-safe text: anything but visible ASCII and spaces becomes '?'.
fn header_text(s: &str) -> HeaderValue {
    let clean: String = s.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect();
    HeaderValue::from_str(&clean).unwrap_or(HeaderValue::from_static("?"))
}

fn response(r: Rendered, stride: usize, clip_fps: f64, mut timing: Timing, total_ms: f64) -> Response {
    let rep = &r.report;
    let s = &rep.stages_ms;
    if r.engine_load_ms > 0.0 {
        timing.push(("engine_load", r.engine_load_ms, None));
    }
    timing.push(("avatar", r.avatar_ms, Some(if r.avatar_cached { "cached" } else { "prepared" })));
    timing.extend([
        ("audio_encoder", s.audio_encoder, None),
        ("unet", s.unet, None),
        ("decoder", s.decoder, None),
        ("composite", s.composite_nv12 + s.expand + s.ease, None),
        ("encoder", s.encoder, None),
        ("render", rep.end_to_end_ms, None),
        ("total", total_ms, None),
    ]);
    let server_timing: Vec<String> = timing
        .iter()
        .map(|(name, dur, desc)| match desc {
            Some(d) => format!("{name};dur={dur:.1};desc=\"{d}\""),
            None => format!("{name};dur={dur:.1}"),
        })
        .collect();
    let h = |name: &'static str| HeaderName::from_static(name);
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("video/mp4")),
        (h("x-inference-fps"), header_text(&format!("{:.2}", rep.render_fps))),
        (h("x-stride"), HeaderValue::from(stride)),
        (h("x-realtime-factor"), header_text(&format!("{:.2}x", rep.render_fps / clip_fps))),
        (h("x-frames"), HeaderValue::from(rep.frames)),
        (h("x-keyframes-evaluated"), HeaderValue::from(rep.unet_evaluations)),
        (h("x-bypassed-frames"), HeaderValue::from(rep.bypassed_frames)),
        (h("x-weights"), header_text(&rep.setup.weights)),
        (h("server-timing"), header_text(&server_timing.join(", "))),
    ];
    let mut resp = (StatusCode::OK, r.mp4).into_response();
    for (name, value) in headers {
        resp.headers_mut().insert(name, value);
    }
    resp
}
