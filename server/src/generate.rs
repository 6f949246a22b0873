//! `POST /generate`: the source's contract (multipart `audio`, `video`, `stride`, `decoder`) and
//! its JSON variant, answered with the MP4 and the source's headers plus cadence's; with
//! `?stream=fmp4`, a fragmented MP4 sent while it renders ([`crate::stream`]).
//!
//! Order of work: readiness, content type and declared length, the query; the body streamed
//! into the request's temporary directory; every field checked and the files decoded (all before
//! any engine runs); a render slot (or the queue, or 429); the render on a blocking thread.

use crate::admission::Slot;
use crate::avatars;
use crate::engines::EngineSet;
use crate::error::ApiError;
use crate::jobs::{JobError, JobKind, JobRecord};
use crate::options::Settings;
use crate::render_job::{self, AvatarInput, Job, Progress, Rendered, Target};
use crate::state::{AppState, CancelGuard};
use crate::stats::{header_text, server_timing, FinalStats, Timing};
use crate::stream::{self, Chunk, Mode, SegmentSender, StreamBody};
use crate::tempdirs;
use crate::upload::{self, BodyKind, Upload};
use crate::validate;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use cadence::frame_loop::RenderOptions;
use cadence::KeyframeSchedule;
use cadence_media::Audio;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tempfile::TempDir;
use tokio::sync::mpsc;

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

/// The file fields of a render request.
pub const FILE_FIELDS: [&str; 2] = ["audio", "video"];

/// A request's body read and checked (before any engine work): what the render needs, the
/// request's temporary directory, its cancel guard and the Server-Timing entries so far.
pub struct Intake {
    pub checked: Checked,
    pub dir: TempDir,
    pub guard: CancelGuard,
    pub timing: Timing,
    /// The body's fields and files as sent (a fleet hands them to another replica).
    pub upload: Upload,
}

/// The body of a render request (`/generate`, `/v1/jobs`), multipart or JSON: streamed into a
/// fresh temporary directory within the limits, then every field checked and the files decoded.
pub async fn intake(state: &AppState, req: Request) -> Result<Intake, ApiError> {
    let kind = upload::body_kind(req.headers(), state.config.max_body_bytes).inspect_err(|e| {
        state.metrics.rejection(if e.status == StatusCode::PAYLOAD_TOO_LARGE { "too_large" } else { "media_type" });
    })?;
    // From here a dropped future (the client went away) cancels whatever runs for it.
    let guard = state.track();
    let dir = tempdirs::request_dir(&state.config.temp_root)
        .map_err(|e| ApiError::internal("creating the request's directory", e))?;
    let t = Instant::now();
    let up = match kind {
        BodyKind::Multipart => upload::read_multipart(req, dir.path(), &FILE_FIELDS, state.config.max_body_bytes).await,
        BodyKind::Json => upload::read_json(req, dir.path()).await,
    }
    .map_err(|e| count_invalid(state, e))?;
    let mut timing: Timing = vec![("upload", ms(t), None)];

    let t = Instant::now();
    crate::fleet_avatars::before_check(state, &up).await.map_err(|e| count_invalid(state, e))?;
    let (st, dir_path, upload) = (state.clone(), dir.path().to_path_buf(), up.clone());
    let checked = tokio::task::spawn_blocking(move || check(&st, up, &dir_path))
        .await
        .map_err(|e| ApiError::internal("checking the request", e))?
        .map_err(|e| count_invalid(state, e))?;
    timing.push(("validate", ms(t), None));
    Ok(Intake { checked, dir, guard, timing, upload })
}

pub async fn generate(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let t_all = Instant::now();
    let set = state.ready_engines().map_err(rejected(&state, "not_ready"))?;
    let mode = stream::mode(req.uri().query()).map_err(rejected(&state, "invalid"))?;
    if mode == Mode::Fmp4 {
        // A streamed render's statistics go to a job record.
        state.jobs.check_room().map_err(rejected(&state, "too_many_jobs"))?;
    }
    let Intake { checked, dir, guard, mut timing, .. } = intake(&state, req).await?;

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

    let stride = checked.settings.stride;
    let fps = checked.settings.fps;
    let cancel = guard.flag();
    if mode == Mode::Fmp4 {
        let record = state
            .jobs
            .create(JobKind::Stream, checked.schedule.n_frames(), cancel.clone())
            .map_err(rejected(&state, "too_many_jobs"))?;
        let (tx, rx) = mpsc::channel(stream::CHANNEL_SEGMENTS);
        let first_sent = Arc::new(OnceLock::new());
        let sender = SegmentSender::new(tx.clone(), cancel.clone(), first_sent.clone());
        let rec = record.clone();
        let progress: Progress = Box::new(move |n| rec.frame_done(n));
        let job = checked.into_job(&state, cancel, dir, Target::Fragmented(Box::new(sender)), Some(progress));
        let pipe = Pipe { tx, rx, first_sent };
        return streamed(&state, set, slot, guard, job, pipe, record, timing, t_all).await;
    }
    let job = checked.into_job(&state, cancel, dir, Target::File, None);
    let st = state.clone();
    let rendered = tokio::task::spawn_blocking(move || slot.run(|| render_job::run(&set, &st.metrics, job)))
        .await
        .map_err(|e| {
        state.metrics.render_outcome("failed");
        ApiError::internal("the render thread failed", e)
    })??;
    drop(guard);
    Ok(response(rendered, stride, fps.hz(), timing, ms(t_all)))
}

/// The channel between a streamed render and its response body.
struct Pipe {
    tx: mpsc::Sender<Chunk>,
    rx: mpsc::Receiver<Chunk>,
    /// When the render thread sent the first segment.
    first_sent: Arc<OnceLock<Instant>>,
}

/// `stream=fmp4`: the render starts, and the response (headers, then the segments as they come)
/// waits for its first segment, the init segment written at the first frame. A render that
/// fails before it is still answered with its JSON error and status, and the `codecs` of the
/// `Content-Type` are read from it. The statistics known only at the end go to the log (in the
/// request's span, with its id) and to the metrics.
#[allow(clippy::too_many_arguments)]
async fn streamed(
    state: &AppState,
    set: Arc<EngineSet>,
    slot: Slot,
    guard: CancelGuard,
    job: Job,
    pipe: Pipe,
    record: Arc<JobRecord>,
    mut timing: Timing,
    t_all: Instant,
) -> Result<Response, ApiError> {
    let Pipe { tx, mut rx, first_sent } = pipe;
    let (stride, frames, decoder) = (job.settings.stride, job.schedule.n_frames(), job.settings.decoder);
    let clip_fps = job.settings.fps.hz();
    let (st, engines, span) = (state.clone(), set.clone(), tracing::Span::current());
    let (rec, pre_render) = (record.clone(), timing.clone());
    let render = tokio::task::spawn_blocking(move || {
        let _span = span.enter();
        rec.set_running();
        let result = slot.run(|| render_job::run(&engines, &st.metrics, job));
        drop(slot);
        rec.finish(match &result {
            Ok(r) => Ok(FinalStats::new(r, stride, clip_fps, pre_render, ms(t_all))),
            Err(e) => Err(JobError::from(e.clone())),
        });
        let first_byte_s = first_sent.get().map(|t| t.duration_since(t_all).as_secs_f64());
        if let Some(s) = first_byte_s {
            st.metrics.first_byte(s);
        }
        match &result {
            Ok(r) => {
                st.metrics.streamed("ok");
                let rep = &r.report;
                let ms1 = |v: Option<f64>| v.map(|v| format!("{v:.1}"));
                tracing::info!(
                    frames = rep.frames,
                    fps = format!("{:.2}", rep.render_fps),
                    realtime_factor = format!("{:.2}x", rep.render_fps / clip_fps),
                    keyframes_evaluated = rep.unet_evaluations,
                    bypassed_frames = rep.bypassed_frames,
                    time_to_first_byte_ms = ms1(first_byte_s.map(|s| s * 1e3)),
                    first_frame_ms = ms1(r.first_frame_ms),
                    first_fragment_ms = ms1(r.first_fragment_ms),
                    render_ms = format!("{:.1}", rep.end_to_end_ms),
                    total_ms = format!("{:.1}", ms(t_all)),
                    bytes = r.bytes,
                    job = %rec.id,
                    "streamed render done"
                );
                let _ = tx.blocking_send(Chunk::End);
            }
            Err(e) => {
                st.metrics.streamed(if e.code == "cancelled" { "cancelled" } else { "failed" });
                // Before the first segment the error is the response, and is logged as one.
                if first_byte_s.is_some() {
                    tracing::warn!(code = e.code, "the streamed render ended early, its body cut off: {}", e.message);
                }
                let _ = tx.blocking_send(Chunk::Error(e.message.clone()));
            }
        }
        result.map(|_| ())
    });
    let first = match rx.recv().await {
        Some(Chunk::Data(first)) => first,
        _ => {
            return Err(match render.await {
                Ok(Err(e)) => e,
                Ok(Ok(())) => {
                    ApiError::internal("the render ended without writing a stream", "no segment and no error")
                }
                Err(e) => {
                    state.metrics.render_outcome("failed");
                    state.metrics.streamed("failed");
                    let e = ApiError::internal("the render thread failed", e);
                    record.finish(Err(JobError::from(e.clone())));
                    e
                }
            });
        }
    };
    // A render thread that dies after the first segment: the body ends with an error (the
    // channel closes without its end), and the failure is counted here.
    let (st, rec) = (state.clone(), record.clone());
    tokio::spawn(async move {
        if let Err(e) = render.await {
            st.metrics.render_outcome("failed");
            st.metrics.streamed("failed");
            rec.finish(Err(JobError::from(ApiError::internal("the streamed render's thread failed", e))));
        }
    });
    let content_type = match stream::codecs(&first) {
        Some(c) => header_text(&format!("video/mp4; codecs=\"{c}\"")),
        None => HeaderValue::from_static("video/mp4"),
    };
    // The render runs with these engines: they are loaded by now.
    let weights = set.if_loaded(decoder).map(|e| set.setup(&e).weights).unwrap_or_default();
    timing.push(("first_byte", ms(t_all), None));
    let h = |name: &'static str| HeaderName::from_static(name);
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (h("x-stride"), HeaderValue::from(stride)),
        (h("x-frames"), HeaderValue::from(frames)),
        (h("x-weights"), header_text(&weights)),
        (h("server-timing"), header_text(&server_timing(&timing))),
        // The final statistics, once the stream has ended: GET /v1/jobs/{id}.
        (h("x-job-id"), header_text(&record.id)),
        // Proxies that buffer responses (nginx) pass this one through as it comes.
        (h("x-accel-buffering"), HeaderValue::from_static("no")),
    ];
    let mut resp = Response::new(Body::new(StreamBody::new(guard, first, rx)));
    for (name, value) in headers {
        resp.headers_mut().insert(name, value);
    }
    Ok(resp)
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

impl Checked {
    /// The render of this request with the server's batch and window.
    pub fn into_job(
        self,
        state: &AppState,
        cancel: Arc<AtomicBool>,
        dir: TempDir,
        target: Target,
        progress: Option<Progress>,
    ) -> Job {
        let vad = state.config.vad.with_kind(self.settings.vad.unwrap_or(state.config.vad.vad));
        Job {
            audio: self.audio,
            avatar: self.avatar,
            schedule: self.schedule,
            settings: self.settings,
            batch: state.config.engines.batch as usize,
            cancel,
            dir,
            target,
            window_seconds: state.config.window_seconds,
            vad,
            progress,
        }
    }
}

pub(crate) fn check(state: &AppState, up: Upload, dir: &Path) -> Result<Checked, ApiError> {
    let settings = up.options.settings()?;
    let audio_path = up
        .file("audio")
        .ok_or_else(|| ApiError::invalid("missing_field", "the audio field (a WAV file) is required"))?;
    let audio = validate::audio(audio_path, state.config.max_seconds)?;
    let avatar = match &settings.avatar_id {
        Some(id) => {
            if up.file("video").is_some() || settings.any_face_field() {
                return Err(ApiError::invalid(
                    "conflicting_fields",
                    "avatar_id names a registered avatar: send no video, face_box, face_boxes, face_index or bbox_shift with it",
                ));
            }
            AvatarInput::Cached(lookup(state, id)?)
        }
        None => {
            // The bounds are for what clients send, not for the operator's default.
            let (path, limits) = match up.file("video") {
                Some(p) => (p.to_path_buf(), state.config.avatar_limits()),
                None => {
                    let p = dir.join("default_avatar");
                    std::fs::write(&p, &state.config.default_avatar)
                        .map_err(|e| ApiError::internal("writing the default avatar", e))?;
                    (p, validate::AvatarLimits::NONE)
                }
            };
            match validate::avatar(&path, "video", limits, &settings, dir)? {
                validate::AvatarFile::Image { image, face, landmarks, .. } => {
                    AvatarInput::Image { image, face, landmarks }
                }
                validate::AvatarFile::Video(source) => AvatarInput::Video(source),
            }
        }
    };
    let opts = RenderOptions { fps: settings.fps, ..RenderOptions::default() };
    let frames = cadence::musetalk::render::video_frames(&audio, &opts);
    if frames == 0 {
        return Err(ApiError::invalid("audio_too_short", "audio: too short for one video frame"));
    }
    let (schedule, _) =
        cadence::schedules::keyframes::fixed_schedule(frames, settings.keyframes.as_deref(), settings.stride)
            .map_err(|e| ApiError::invalid("invalid_keyframes", format!("keyframes: {e:#}")))?;
    Ok(Checked { audio, avatar, schedule, settings })
}

/// The registered avatar `id` (422 for a malformed id, 404 for an unknown one).
pub fn lookup(state: &AppState, id: &str) -> Result<std::sync::Arc<avatars::AvatarEntry>, ApiError> {
    check_avatar_id(id)?;
    state.avatars.lock().unwrap().get(id).ok_or_else(|| avatar_not_found(id))
}

/// 422 unless `id` has the form of an avatar id.
pub fn check_avatar_id(id: &str) -> Result<(), ApiError> {
    if !avatars::valid_id(id) {
        return Err(ApiError::invalid("invalid_avatar_id", "avatar_id: expected 64 lowercase hex digits"));
    }
    Ok(())
}

pub fn avatar_not_found(id: &str) -> ApiError {
    ApiError::not_found("avatar_not_found", format!("no avatar {id} (register it with POST /v1/avatars)"))
}

fn response(r: Rendered, stride: usize, clip_fps: f64, timing: Timing, total_ms: f64) -> Response {
    let stats = FinalStats::new(&r, stride, clip_fps, timing, total_ms);
    let mut resp = (StatusCode::OK, r.mp4).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("video/mp4"));
    for (name, value) in stats.headers() {
        resp.headers_mut().insert(name, value);
    }
    resp
}
