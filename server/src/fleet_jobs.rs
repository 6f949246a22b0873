//! `/v1/jobs` in a fleet ([`crate::fleet`]): the request is checked here and queued for any
//! replica; each replica's worker renders the jobs it pulls while it holds a free render slot;
//! the job's record and MP4 are read from the fleet by whichever replica is asked.

use crate::engines::EngineSet;
use crate::error::ApiError;
use crate::fleet::{now_ms, unavailable, Fleet, FleetError, FleetJob, JobMessage};
use crate::generate::{self, Intake};
use crate::jobs::JobState;
use crate::render_job::{self, Target};
use crate::state::{AppState, Phase};
use crate::stats::FinalStats;
use crate::tempdirs;
use crate::upload::Upload;
use async_nats::jetstream::AckKind;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{BoxStream, StreamExt};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// `POST /v1/jobs` with `--nats`: the body checked as on a single replica (every 4xx from here),
/// then the files and the job handed to the fleet.
pub async fn create(state: &AppState, fleet: &Fleet, req: Request) -> Result<Response, ApiError> {
    // The fleet's queue bound, before the body is read.
    let queue = fleet.queue_state().await.map_err(unavailable)?;
    if queue.queued >= fleet.config.max_queued {
        state.metrics.rejection("queue_full");
        // The jobs ahead, shared by the renders running in the fleet (at least one).
        let mean = state.metrics.mean_render_seconds().unwrap_or(5.0);
        let wait = (mean * (queue.queued + 1) as f64 / queue.running.max(1) as f64).ceil().clamp(1.0, 3600.0);
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            format!("the fleet's queue is full ({} jobs waiting, --fleet-max-queued)", queue.queued),
        )
        .with_retry_after(wait as u64));
    }
    let Intake { checked, dir, guard, upload, .. } = generate::intake(state, req).await?;
    let id = crate::jobs::new_id();
    let msg = JobMessage {
        id: id.clone(),
        options: upload.options.pairs().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        files: upload.files.iter().map(|(name, _)| name.to_string()).collect(),
    };
    let job = fleet.submit(&msg, checked.schedule.n_frames(), dir.path()).await.map_err(unavailable)?;
    drop(guard);
    tracing::info!(job = %id, frames = job.frames, "job queued in the fleet");
    let mut r = (StatusCode::ACCEPTED, Json(job.view())).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{id}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

async fn record(fleet: &Fleet, id: &str) -> Result<(FleetJob, u64), ApiError> {
    crate::jobs::check_id(id)?;
    fleet.job(id).await.map_err(unavailable)?.ok_or_else(|| crate::jobs::not_found(id))
}

pub async fn get(fleet: &Fleet, id: &str) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(record(fleet, id).await?.0.view()))
}

/// The MP4 of a done job: from this replica's jobs directory when it is there (this replica
/// rendered or fetched it before), else fetched from the fleet's store first; then served as
/// a single replica serves it (ranges, HEAD).
pub async fn result(state: &AppState, fleet: &Fleet, id: &str, req: Request) -> Result<Response, ApiError> {
    let (job, _) = record(fleet, id).await?;
    if job.state != JobState::Done {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "job_not_done",
            format!("the job is {}: its result exists once it is done", job.state.name()),
        ));
    }
    let path = state.jobs.dir().join(format!("{id}.mp4"));
    if !path.exists() {
        fleet.get_result(id, &path).await.map_err(unavailable)?;
    }
    let resp = tower_http::services::ServeFile::new(path).oneshot(req).await.unwrap_or_else(|e| match e {});
    Ok(resp.map(axum::body::Body::new))
}

/// `GET /v1/jobs/{id}/events` in a fleet: the events of a single replica's jobs, from the job
/// table's changes (a running job's record changes at each heartbeat, about once a second).
pub async fn events(fleet: &Fleet, id: &str) -> Result<BoxStream<'static, Result<Event, Infallible>>, ApiError> {
    record(fleet, id).await?;
    let changes = fleet.watch_job(id).await.map_err(unavailable)?;
    // Every change until the first final state, which ends the stream at once (no further
    // change will come).
    let events = futures_util::stream::unfold(Some(changes.boxed()), |changes| async move {
        let mut changes = changes?;
        let job = changes.next().await?;
        let last = job.state.is_final();
        let name = if last { job.state.name() } else { "progress" };
        let event = Event::default().event(name).data(job.view().to_string());
        Some((Ok(event), (!last).then_some(changes)))
    });
    Ok(events.boxed())
}

/// `DELETE /v1/jobs/{id}` in a fleet: a job that has not ended is marked `cancelled` (202). A
/// queued one leaves the queue; a running one's worker sees the record change and stops the
/// render (and failing that, finds its next heartbeat's write refused). An
/// ended job is forgotten (204): its record and its MP4, in the fleet and in this replica's
/// jobs directory.
pub async fn delete(state: &AppState, fleet: &Fleet, id: &str) -> Result<Response, ApiError> {
    loop {
        let (mut job, revision) = record(fleet, id).await?;
        if job.state.is_final() {
            fleet.forget(id).await.map_err(unavailable)?;
            let _ = std::fs::remove_file(state.jobs.dir().join(format!("{id}.mp4")));
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let was_queued = job.state == JobState::Queued;
        job.state = JobState::Cancelled;
        job.finished_ms = Some(now_ms());
        job.error = Some(FleetError { code: "cancelled".into(), message: "cancelled by DELETE".into() });
        // A worker's write in between (progress) moved the revision: read again.
        if fleet.update(&job, revision).await.map_err(unavailable)?.is_some() {
            if was_queued {
                fleet.dequeue(&job).await;
            }
            tracing::info!(job = %id, "job cancel requested");
            return Ok((StatusCode::ACCEPTED, Json(job.view())).into_response());
        }
    }
}

/// This replica's worker: while the server is not draining and a render slot is free, takes the
/// fleet's next job, then the slot, and renders it.
pub async fn worker(state: AppState, fleet: Arc<Fleet>) {
    loop {
        match state.phase() {
            Phase::Draining | Phase::Failed => return,
            Phase::Loading => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Phase::Ready => {}
        }
        let Ok(set) = state.ready_engines() else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        // Pull only while a slot is free, without holding it meanwhile: a slot held while
        // waiting for the queue would make this replica's own requests wait, and count as a
        // render running.
        if state.admission.running() >= state.admission.slots() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let message = match fleet.next_job(Duration::from_secs(1)).await {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("{e:#}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Taken meanwhile by a request here, the slot is waited for; a wait longer than the ack
        // wait has the job delivered to another replica, and the claim here then fails.
        let slot = state.admission.wait().await;
        work(&state, &fleet, set, slot, message).await;
    }
}

/// Hands a delivery back to the queue, to be delivered again a second later (to any replica).
async fn hand_back(message: &async_nats::jetstream::Message, why: String) {
    tracing::warn!("{why}: the job goes back to the queue");
    let _ = message.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
}

/// One delivery of a job: claimed in the job table, rendered with heartbeats, its MP4 stored,
/// its record finished, the message acked. A delivery whose claim another took over (this
/// replica was taken for dead) stops without writing anything.
async fn work(
    state: &AppState,
    fleet: &Fleet,
    set: Arc<EngineSet>,
    slot: crate::admission::Slot,
    message: async_nats::jetstream::Message,
) {
    let msg: JobMessage = match serde_json::from_slice(&message.payload) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("a job message that is not a job ({e}): dropped");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
    // The claim: the record moved to `running` here from the revision read. A write in between
    // (the replica that took the request recording the queue position, a cancel) moves the
    // revision: read again. A claim that cannot be made now is handed back to the queue
    // (redelivered a second later) rather than left to the ack wait.
    let mut tries = 0;
    let (mut job, mut revision) = loop {
        tries += 1;
        let (mut job, revision) = match fleet.job(&msg.id).await {
            Ok(Some(j)) => j,
            Ok(None) => {
                tracing::warn!(job = %msg.id, "a queued job without a record (expired): dropped");
                let _ = message.ack().await;
                return;
            }
            Err(e) => return hand_back(&message, format!("{e:#}")).await,
        };
        if job.state.is_final() {
            // Cancelled while queued, or delivered again after it ended (its ack was lost).
            let _ = message.ack().await;
            return;
        }
        job.state = JobState::Running;
        job.attempts = delivered;
        job.replica = Some(fleet.config.replica.clone());
        job.started_ms = Some(now_ms());
        job.frames_done = 0;
        match fleet.update(&job, revision).await {
            Ok(Some(r)) => break (job, r),
            Ok(None) if tries < 10 => continue,
            Ok(None) => return hand_back(&message, format!("job {}: its record keeps changing", job.id)).await,
            Err(e) => return hand_back(&message, format!("{e:#}")).await,
        }
    };
    tracing::info!(job = %job.id, attempt = delivered, "job taken from the fleet");
    if delivered > 1 {
        state.metrics.fleet_redelivery();
    }

    let t_all = Instant::now();
    let outcome = render(state, fleet, set, slot, &msg, &message, &mut job, &mut revision, t_all).await;
    let Some(outcome) = outcome else {
        // The record changed under the render: cancelled (then the job is over: ack it), or
        // taken over by another replica (whose delivery it now is).
        if let Ok(Some((now, _))) = fleet.job(&job.id).await {
            if now.state == JobState::Cancelled {
                let _ = message.ack().await;
                fleet.remove_inputs(&msg).await;
                tracing::info!(job = %job.id, "job cancelled while it rendered");
                return;
            }
        }
        tracing::warn!(job = %job.id, "another replica took the job over: this render's work is dropped");
        return;
    };
    job.finished_ms = Some(now_ms());
    match outcome {
        Ok(stats) => {
            job.state = JobState::Done;
            job.frames_done = job.frames;
            job.stats = Some(stats);
        }
        Err(e) => {
            job.state = JobState::Failed;
            job.error = Some(FleetError { code: e.code.to_string(), message: e.message });
        }
    }
    match fleet.update(&job, revision).await {
        Ok(Some(_)) => {
            let _ = message.double_ack().await;
            fleet.remove_inputs(&msg).await;
            tracing::info!(job = %job.id, state = job.state.name(), "job ended");
        }
        Ok(None) => tracing::warn!(job = %job.id, "another replica took the job over before it ended"),
        Err(e) => tracing::warn!("{e:#}"),
    }
}

/// Fetches the inputs, checks them, renders with heartbeats, stores the MP4. `None` when the
/// claim was lost (the render was cancelled); else the final statistics or the error.
#[allow(clippy::too_many_arguments)]
async fn render(
    state: &AppState,
    fleet: &Fleet,
    set: Arc<EngineSet>,
    slot: crate::admission::Slot,
    msg: &JobMessage,
    message: &async_nats::jetstream::Message,
    job: &mut FleetJob,
    revision: &mut u64,
    t_all: Instant,
) -> Option<Result<serde_json::Value, ApiError>> {
    let dir = match tempdirs::request_dir(&state.config.temp_root) {
        Ok(d) => d,
        Err(e) => return Some(Err(ApiError::internal("creating the job's directory", e))),
    };
    if let Err(e) = fleet.fetch_inputs(msg, dir.path()).await {
        return Some(Err(ApiError::internal("fetching the job's files", format!("{e:#}"))));
    }
    let mut upload = Upload::default();
    for (name, value) in &msg.options {
        if let Err(e) = upload.options.set(name, value.clone()) {
            return Some(Err(e));
        }
    }
    for field in &msg.files {
        if let Some(name) = generate::FILE_FIELDS.into_iter().find(|f| f == field) {
            upload.files.push((name, dir.path().join(field)));
        }
    }
    if let Err(e) = crate::fleet_avatars::before_check(state, &upload).await {
        return Some(Err(e));
    }
    let (st, dir_path) = (state.clone(), dir.path().to_path_buf());
    let checked = match tokio::task::spawn_blocking(move || generate::check(&st, upload, &dir_path)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Some(Err(e)),
        Err(e) => return Some(Err(ApiError::internal("checking the job", e))),
    };
    let (stride, clip_fps) = (checked.settings.stride, checked.settings.fps.hz());
    let done = Arc::new(AtomicUsize::new(0));
    let cancel = Arc::new(AtomicBool::new(false));
    let counter = done.clone();
    let progress: render_job::Progress = Box::new(move |n| {
        counter.fetch_add(n, Ordering::Relaxed);
    });
    let path = state.jobs.dir().join(format!("{}.mp4", msg.id));
    let render_job = checked.into_job(state, cancel.clone(), dir, Target::Keep(path.clone()), Some(progress));
    let metrics_state = state.clone();
    let render =
        tokio::task::spawn_blocking(move || slot.run(|| render_job::run(&set, &metrics_state.metrics, render_job)));
    tokio::pin!(render);
    // A heartbeat acks the delivery (at most a third of the ack wait apart, so that a long
    // render is not taken for a dead one) and writes the progress (at most a second apart, for
    // the job's pollers and events).
    let beat = (fleet.config.ack_wait / 3).min(Duration::from_secs(1));
    // The record's changes, watched: a cancel (DELETE on any replica) stops the render at once,
    // not at the next heartbeat (a render ending within that second would otherwise finish).
    // Without the watch, the heartbeat's refused write still stops it.
    let mut changes = match fleet.watch_job(&msg.id).await {
        Ok(c) => c.boxed(),
        Err(e) => {
            tracing::warn!("{e:#}");
            futures_util::stream::pending().boxed()
        }
    };
    let rendered = loop {
        tokio::select! {
            r = &mut render => break r,
            Some(record) = changes.next() => {
                if record.state == JobState::Cancelled {
                    cancel.store(true, Ordering::SeqCst);
                }
            }
            _ = tokio::time::sleep(beat) => {
                fleet.in_progress(message).await;
                job.frames_done = done.load(Ordering::Relaxed);
                match fleet.update(job, *revision).await {
                    Ok(Some(r)) => *revision = r,
                    Ok(None) => cancel.store(true, Ordering::SeqCst),
                    Err(e) => tracing::warn!("{e:#}"),
                }
            }
        }
    };
    if cancel.load(Ordering::SeqCst) {
        let _ = std::fs::remove_file(&path);
        return None;
    }
    let rendered = match rendered {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Some(Err(e)),
        Err(e) => {
            state.metrics.render_outcome("failed");
            return Some(Err(ApiError::internal("the render thread failed", e)));
        }
    };
    if let Err(e) = fleet.put_result(&msg.id, &path).await {
        return Some(Err(ApiError::internal("storing the result", format!("{e:#}"))));
    }
    let stats = FinalStats::new(&rendered, stride, clip_fps, Vec::new(), t_all.elapsed().as_secs_f64() * 1e3);
    Some(Ok(serde_json::to_value(stats).unwrap_or_default()))
}
