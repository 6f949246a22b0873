//! `/v1/jobs`: a render answered at once with an id (202), run when a render slot is free, and
//! followed by polling (`GET /v1/jobs/{id}`) or server-sent events (`/events`); the MP4 comes
//! from `/result` with HTTP ranges; `DELETE` cancels a job that has not finished (202) or forgets
//! one that has (204).

use crate::engines::EngineSet;
use crate::error::ApiError;
use crate::generate::{self, rejected, Intake};
use crate::jobs::{JobError, JobKind, JobRecord, JobState};
use crate::render_job::{self, Target};
use crate::state::{AppState, CancelGuard};
use crate::stats::{FinalStats, Timing};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// The shortest time between two progress events of one job (each frame changes the progress).
const EVENT_INTERVAL: Duration = Duration::from_millis(200);

pub async fn create(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let t_all = Instant::now();
    let set = state.ready_engines().map_err(rejected(&state, "not_ready"))?;
    if let Some(q) = req.uri().query().filter(|q| !q.is_empty()) {
        state.metrics.rejection("invalid");
        let shown: String = q.chars().take(40).collect();
        return Err(ApiError::invalid("unknown_parameter", format!("/v1/jobs takes no query parameters ('{shown}')")));
    }
    if let Some(fleet) = state.fleet.get().cloned() {
        return crate::fleet_jobs::create(&state, &fleet, req).await;
    }
    state.jobs.check_room().map_err(rejected(&state, "too_many_jobs"))?;
    let Intake { checked, dir, guard, timing, .. } = generate::intake(&state, req).await?;
    let record = state
        .jobs
        .create(JobKind::Render, checked.schedule.n_frames(), guard.flag())
        .map_err(rejected(&state, "too_many_jobs"))?;
    let rec = record.clone();
    let target = Target::Keep(record.result.clone().expect("a render job has a result path"));
    let job = checked.into_job(&state, guard.flag(), dir, target, Some(Box::new(move |n| rec.frame_done(n))));
    tracing::info!(job = %record.id, frames = record.frames, "job queued");
    tokio::spawn(run(state.clone(), set, record.clone(), guard, job, timing, t_all));
    let mut r = (StatusCode::ACCEPTED, Json(record.view(&record.status()))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", record.id)) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// Waits for a slot (or the job's cancellation), renders, and records the outcome. The guard
/// registers the job with the drain at shutdown, and holds the temporary directory's owner
/// alive until the render ends.
async fn run(
    state: AppState,
    set: Arc<EngineSet>,
    record: Arc<JobRecord>,
    guard: CancelGuard,
    job: render_job::Job,
    mut timing: Timing,
    t_all: Instant,
) {
    let t = Instant::now();
    let slot = tokio::select! {
        slot = state.admission.wait() => slot,
        _ = record.cancelled() => {
            record.finish(Err(JobError { code: "cancelled", message: "cancelled before it started".into() }));
            tracing::info!(job = %record.id, "job cancelled while queued");
            return;
        }
    };
    timing.push(("queue", t.elapsed().as_secs_f64() * 1e3, None));
    record.set_running();
    let (stride, clip_fps) = (job.settings.stride, job.settings.fps.hz());
    let st = state.clone();
    let rendered = tokio::task::spawn_blocking(move || slot.run(|| render_job::run(&set, &st.metrics, job))).await;
    let outcome = match rendered {
        Ok(Ok(r)) => Ok(FinalStats::new(&r, stride, clip_fps, timing, t_all.elapsed().as_secs_f64() * 1e3)),
        Ok(Err(e)) => Err(JobError::from(e)),
        Err(e) => {
            state.metrics.render_outcome("failed");
            Err(JobError::from(ApiError::internal("the render thread failed", e)))
        }
    };
    record.finish(outcome);
    tracing::info!(job = %record.id, state = record.state().name(), "job ended");
    drop(guard);
}

pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(fleet) = state.fleet.get() {
        return crate::fleet_jobs::get(fleet, &id).await;
    }
    let record = state.jobs.get(&id)?;
    Ok(Json(record.view(&record.status())))
}

/// The MP4 of a finished job, through tower-http's `ServeFile`: `Range` (one range; 206 with
/// `Content-Range`, 416 when it cannot be satisfied), `If-Modified-Since`, `HEAD`.
pub async fn result(State(state): State<AppState>, Path(id): Path<String>, req: Request) -> Result<Response, ApiError> {
    if let Some(fleet) = state.fleet.get().cloned() {
        return crate::fleet_jobs::result(&state, &fleet, &id, req).await;
    }
    let record = state.jobs.get(&id)?;
    let path = match (record.kind, record.state(), &record.result) {
        (JobKind::Render, JobState::Done, Some(p)) => p.clone(),
        (JobKind::Stream, ..) => {
            return Err(ApiError::not_found(
                "no_result",
                "a streamed render's video went to its client; nothing is kept",
            ))
        }
        (_, state, _) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "job_not_done",
                format!("the job is {}: its result exists once it is done", state.name()),
            ))
        }
    };
    let resp = tower_http::services::ServeFile::new(path).oneshot(req).await.unwrap_or_else(|e| match e {});
    if resp.status() == StatusCode::NOT_FOUND {
        // Expired between the lookup and the read.
        return Err(ApiError::not_found("job_not_found", format!("job {id} expired")));
    }
    Ok(resp.map(axum::body::Body::new))
}

/// Server-sent events: one `progress` event at once and then as the render advances (at most
/// one per `EVENT_INTERVAL`), then one event named after the final state (`done`, `failed`
/// or `cancelled`), and the stream ends. Each event's data is the job's JSON.
pub async fn events(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if let Some(fleet) = state.fleet.get() {
        let stream = crate::fleet_jobs::events(fleet, &id).await?;
        return Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response());
    }
    let record = state.jobs.get(&id)?;
    let rx = record.subscribe();
    let stream = futures_util::stream::unfold(Some((record, rx, true)), |next| async move {
        let (record, mut rx, first) = next?;
        if !first {
            // The record holds the sender: the channel never closes under us.
            let _ = rx.changed().await;
            tokio::time::sleep(EVENT_INTERVAL).await;
        }
        let status = rx.borrow_and_update().clone();
        let last = status.state.is_final();
        let name = if last { status.state.name() } else { "progress" };
        let event = Event::default().event(name).data(record.view(&status).to_string());
        Some((Ok::<_, Infallible>(event), (!last).then_some((record, rx, false))))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if let Some(fleet) = state.fleet.get().cloned() {
        return crate::fleet_jobs::delete(&state, &fleet, &id).await;
    }
    let record = state.jobs.get(&id)?;
    if record.state().is_final() {
        state.jobs.remove(&record);
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    record.cancel();
    tracing::info!(job = %record.id, "job cancel requested");
    Ok((StatusCode::ACCEPTED, Json(record.view(&record.status()))).into_response())
}
