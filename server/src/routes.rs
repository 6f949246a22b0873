//! The router ([`crate::openapi::ROUTES`] lists the same routes; a test holds them equal) and the
//! small routes: health, readiness, info, metrics and the OpenAPI document.

use crate::avatar_routes;
use crate::avatars::decoder_name;
use crate::calibration;
use crate::error::ApiError;
use crate::generate::generate;
use crate::job_routes;
use crate::livetalking;
use crate::middleware;
use crate::openapi;
use crate::sessions;
use crate::state::AppState;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

pub fn router(state: AppState) -> Router {
    // The body limit of the extractors, raised to the configured one (axum's default is 2 MB);
    // uploads also count each field while they stream.
    let body_limit = DefaultBodyLimit::max(state.config.max_body_bytes);
    Router::new()
        .route("/generate", post(generate))
        .route("/v1/avatars", post(avatar_routes::register))
        .route("/v1/avatars/{id}", get(avatar_routes::get).delete(avatar_routes::delete))
        .route("/v1/jobs", post(job_routes::create))
        .route("/v1/jobs/{id}", get(job_routes::get).delete(job_routes::delete))
        .route("/v1/jobs/{id}/result", get(job_routes::result))
        .route("/v1/jobs/{id}/events", get(job_routes::events))
        .route("/v1/sessions", post(sessions::create))
        .route("/v1/sessions/{id}", get(sessions::get).delete(sessions::delete))
        .route("/v1/sessions/{id}/audio", post(sessions::audio))
        .route("/v1/sessions/{id}/speak", post(sessions::speak))
        .route("/v1/sessions/{id}/interrupt", post(sessions::interrupt))
        // LiveTalking's routes, its shapes (livetalking.rs).
        .route("/offer", post(livetalking::offer))
        .route("/human", post(livetalking::human))
        .route("/humanaudio", post(livetalking::humanaudio))
        .route("/interrupt_talk", post(livetalking::interrupt_talk))
        .route("/is_speaking", post(livetalking::is_speaking))
        .route("/calibrate", post(calibration::post))
        .route("/v1/calibration", get(calibration::get))
        .route("/", get(page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/info", get(info))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::internal("the request handler panicked", "see the panic message above").into_response()
        }))
        .layer(body_limit)
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::auth))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::linger))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::context))
        .with_state(state)
}

/// The page for people: one file, no external assets. Its file mode renders with `stream=fmp4`
/// and plays the stream with Media Source Extensions; its live mode opens a WebRTC session
/// (`/v1/sessions`) and plays the received H.264 and Opus.
pub const PAGE: &str = include_str!("page.html");

async fn page() -> axum::response::Html<&'static str> {
    axum::response::Html(PAGE)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "alive"}))
}

async fn readyz(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    state.ready_engines()?;
    if let Some(fleet) = state.fleet.get() {
        if !fleet.connected() {
            return Err(ApiError::unavailable("fleet_unavailable", "the fleet's NATS server cannot be reached"));
        }
        return Ok(Json(json!({"status": "ready", "fleet": {"nats": "connected", "replica": fleet.config.replica}})));
    }
    Ok(Json(json!({"status": "ready"})))
}

async fn info(State(state): State<AppState>) -> Json<serde_json::Value> {
    let c = &state.config;
    let engines = state.engines().map(|set| {
        let setup = set.setup(set.primary());
        json!({
            "backend": setup.backend,
            "device": setup.engine_device,
            "engines": setup.engines,
            "profile": setup.profile,
            "weights": setup.weights,
            "decoders_loaded": set.loaded().into_iter().map(decoder_name).collect::<Vec<_>>(),
        })
    });
    Json(json!({
        "name": "cadence",
        "version": env!("CARGO_PKG_VERSION"),
        // Set by the build when it knows the commit (CADENCE_COMMIT=$(git rev-parse HEAD)).
        "commit": option_env!("CADENCE_COMMIT"),
        "ready": state.not_ready_reason().is_none(),
        "not_ready_reason": state.not_ready_reason(),
        "engines": engines,
        "limits": {
            "slots": c.slots,
            "queue": c.queue,
            "max_body_bytes": c.max_body_bytes,
            "max_seconds": c.max_seconds,
            "max_pixels": c.max_pixels,
            "max_avatar_bytes": c.max_avatar_bytes,
            "max_avatar_frames": cadence::avatar::MAX_AVATAR_FRAMES,
            "avatar_cache": c.avatar_cache,
            "max_jobs": c.max_jobs,
            "job_ttl_seconds": c.job_ttl.as_secs_f64(),
            "drain_seconds": c.drain.as_secs_f64(),
            "max_sessions": c.sessions.max_sessions,
        },
        "auth": c.token.is_some(),
    }))
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut gauges = state.gauges();
    if let Some(fleet) = state.fleet.get() {
        gauges.fleet = fleet.queue_state().await.inspect_err(|e| tracing::warn!("{e:#}")).ok();
    }
    let text = state.metrics.render_text(&gauges);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn openapi_json() -> Json<serde_json::Value> {
    Json(openapi::document())
}

async fn not_found() -> ApiError {
    ApiError::not_found("no_route", "no such route (GET /openapi.json lists them)")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
}
