//! Live WebRTC sessions (`/v1/sessions`): an avatar that idles at its rest state, speaks the
//! audio it is sent, and stops when interrupted, streamed to the peer as H.264 and Opus
//! ([`cadence_live`]).
//!
//! Each session runs a MuseTalk live render (`cadence::musetalk::live::render_live_to`) over
//! its speech timeline: silence is read at the clock's pace and eased to rest (and, sustained,
//! bypasses every network), speech is rendered as it is queued. The wire runs `delay` behind
//! the clock: the live render's part and lookahead, plus `--session-margin-ms` for the render
//! itself, so that a frame is made before its time on the wire.
//!
//! Text sent to `/speak` is spoken by libespeak-ng, loaded at run time as `render --text` does
//! (`cadence::schedules::espeak`): a server without it answers 501 `tts_unavailable`.
//!
//! Sessions do not take render slots (they last as long as their peer stays); their number is
//! bounded by `--max-sessions`. A session ends when its peer leaves (ICE consent stops, or
//! DTLS closes), when it is deleted, when no audio came for `--session-idle-seconds` while it
//! was silent, or when the server drains.

use crate::avatars::{avatar_id, AvatarEntry};
use crate::error::ApiError;
use crate::generate::{lookup, rejected};
use crate::render_job;
use crate::state::AppState;
use crate::validate;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cadence::frame_loop::live::{LiveOptions, LiveTarget};
use cadence::frame_loop::stride_governor::StrideGovernor;
use cadence::frame_loop::{Cancelled, RenderOptions};
use cadence::schedules::espeak;
use cadence_live::{NetConfig, QueueError, Session, StartError, WireConfig};
use cadence_media::FrameRate;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The frame rate of a session.
const FPS: u32 = 25;
/// Frames that may wait between a session's render and its wire, beyond its delay.
const QUEUE_FRAMES: usize = 4;

/// The running sessions.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<LiveSession>>>,
    /// Sessions being started (their avatar prepared, their offer answered): they count
    /// against `--max-sessions` from the request on, so that requests at the same instant
    /// cannot start more than it allows.
    starting: AtomicUsize,
}

/// A place among `--max-sessions` held while a session starts; given back when dropped.
struct Reservation<'a>(&'a Sessions);

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.0.starting.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct LiveSession {
    pub id: String,
    /// Another id the session is found by ([`Sessions::alias`]).
    alias: std::sync::OnceLock<String>,
    session: Mutex<Option<Session>>,
    created: Instant,
    /// When audio was last queued (or the session made).
    last_audio: Mutex<Instant>,
    stride: SessionStride,
    infill: &'static str,
    decoder: &'static str,
    /// The voice activity detector's name.
    vad: &'static str,
    delay: Duration,
    width: usize,
    height: usize,
}

impl Sessions {
    pub fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A place for one more session, if fewer than `max` run or are starting.
    fn reserve(&self, max: usize) -> Option<Reservation<'_>> {
        let map = self.map.lock().unwrap();
        if map.len() + self.starting.load(Ordering::SeqCst) >= max {
            return None;
        }
        self.starting.fetch_add(1, Ordering::SeqCst);
        Some(Reservation(self))
    }

    pub(crate) fn get(&self, id: &str) -> Result<Arc<LiveSession>, ApiError> {
        self.map.lock().unwrap().get(id).cloned().ok_or_else(|| {
            ApiError::not_found("session_not_found", format!("no session {id} (it ended, or never was)"))
        })
    }

    fn remove(&self, id: &str) -> Option<Arc<LiveSession>> {
        self.map.lock().unwrap().remove(id)
    }

    /// The session whose id, or whose alias ([`Sessions::alias`]), is `key`.
    pub(crate) fn find(&self, key: &str) -> Option<Arc<LiveSession>> {
        let map = self.map.lock().unwrap();
        map.get(key).or_else(|| map.values().find(|s| s.alias.get().is_some_and(|a| a == key))).cloned()
    }

    /// Gives `s` an alias (another id it is found by, such as a LiveTalking client's): the first
    /// of `make`'s that no running session holds as its id or alias. Its alias, if it had one.
    pub(crate) fn alias(&self, s: &LiveSession, mut make: impl FnMut() -> String) -> String {
        let map = self.map.lock().unwrap();
        if let Some(a) = s.alias.get() {
            return a.clone();
        }
        let a = loop {
            let a = make();
            if !map.contains_key(&a) && !map.values().any(|x| x.alias.get() == Some(&a)) {
                break a;
            }
        };
        s.alias.get_or_init(|| a).clone()
    }

    /// Ends every session (the server is draining).
    pub fn close_all(&self) {
        let all: Vec<_> = self.map.lock().unwrap().drain().map(|(_, s)| s).collect();
        for s in all {
            s.close();
        }
    }

    /// Ends the sessions whose peer left, and those silent and sent no audio for `idle`.
    pub fn reap(&self, idle: Duration) -> Vec<(String, String)> {
        let mut ended = Vec::new();
        let candidates: Vec<_> = self.map.lock().unwrap().values().cloned().collect();
        for s in candidates {
            let reason = {
                let guard = s.session.lock().unwrap();
                match guard.as_ref() {
                    None => Some("closed".to_string()),
                    Some(x) if x.ended() => {
                        Some(x.stats().wire.closed.unwrap_or_else(|| "the session's wire stopped".into()))
                    }
                    Some(x) if !x.timeline().speaking() && s.last_audio.lock().unwrap().elapsed() > idle => {
                        Some(format!("idle for {:.0} s", idle.as_secs_f64()))
                    }
                    _ => None,
                }
            };
            if let Some(r) = reason {
                self.remove(&s.id);
                s.close();
                ended.push((s.id.clone(), r));
            }
        }
        ended
    }
}

impl LiveSession {
    /// Whether the wire is sending speech now; `None` once the session is closed.
    pub(crate) fn speaking(&self) -> Option<bool> {
        self.session.lock().unwrap().as_ref().map(|s| s.timeline().speaking())
    }

    fn close(&self) {
        if let Some(s) = self.session.lock().unwrap().take() {
            // Joining the threads waits for at most one part of the render: off the runtime.
            std::thread::spawn(move || drop(s.close()));
        }
    }

    fn describe(&self) -> serde_json::Value {
        let guard = self.session.lock().unwrap();
        let stats = guard.as_ref().map(|s| s.stats());
        let wire = stats.as_ref().map(|s| &s.wire);
        let frames = wire.map_or(0, |w| w.frames_sent);
        json!({
            "session_id": self.id,
            "state": match (guard.as_ref(), wire) {
                (None, _) => "closed",
                (Some(s), _) if s.ended() => "ended",
                (Some(_), Some(w)) if w.connected => "connected",
                _ => "connecting",
            },
            "age_s": self.created.elapsed().as_secs_f64(),
            "speaking": stats.as_ref().is_some_and(|s| s.speaking),
            "queued_audio_s": stats.as_ref().map_or(0.0, |s| s.queued_audio_s),
            "frames_sent": frames,
            "repeated_frames": wire.map_or(0, |w| w.repeated_frames),
            "late_frames": wire.map_or(0, |w| w.late_frames),
            "repeated_pct": if frames == 0 { 0.0 } else { 100.0 * wire.map_or(0, |w| w.repeated_frames) as f64 / frames as f64 },
            "keyframes_sent": wire.map_or(0, |w| w.keyframes_sent),
            "keyframe_requests": wire.map_or(0, |w| w.keyframe_requests),
            "speech_packets": wire.map_or(0, |w| w.speech_packets),
            // Both are sent from one clock: the skew is the difference of the next frame's and
            // the next speech packet's times on it.
            "av_skew_ms": wire.map_or(0.0, |w| 1e3 * (w.next_frame as f64 / FPS as f64 - w.next_sample as f64 / 16_000.0)),
            "max_frame_gap_ms": wire.map_or(0.0, |w| w.max_frame_gap_ms),
            "max_video_encode_ms": wire.map_or(0.0, |w| w.max_video_encode_ms),
            "interrupts": wire.map_or(0, |w| w.interrupts),
            "interrupt_latency_ms": wire.and_then(|w| w.interrupt_latency_ms),
            "eased_frames": wire.map_or(0, |w| w.eased_frames),
            "discarded_frames": wire.map_or(0, |w| w.discarded_frames),
            "stride": self.stride.current(),
            "stride_mode": match self.stride { SessionStride::Fixed(_) => "fixed", SessionStride::Auto(_) => "auto" },
            "stride_changes": match &self.stride { SessionStride::Fixed(_) => 0, SessionStride::Auto(g) => g.changes() },
            "infill": self.infill,
            "vad": self.vad,
            "decoder": self.decoder,
            "fps": FPS,
            "width": self.width,
            "height": self.height,
            "delay_ms": self.delay.as_secs_f64() * 1e3,
            "closed_reason": wire.and_then(|w| w.closed.clone()),
            "render_error": stats.as_ref().and_then(|s| s.render_error.clone()),
        })
    }
}

/// `POST /v1/sessions`'s body.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offer {
    /// The SDP offer.
    pub sdp: String,
    /// `offer` when present (the browser's RTCSessionDescription as it is).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub avatar_id: Option<String>,
    /// A fixed stride (1 to 12), or `"auto"`: chosen part by part from the rates the session's
    /// own parts measure (`cadence::frame_loop::stride_governor`).
    pub stride: Option<serde_json::Value>,
    /// `taesd` (default) or `full_vae`.
    pub decoder: Option<String>,
    /// `image` (default: the decoder runs on keyframes only, what holds real time on a CPU)
    /// or `latent`.
    pub infill: Option<String>,
}

/// The JSON body of `POST /v1/sessions` (415 for another media type, 400 for JSON that does
/// not parse, 422 for a field that is not one).
fn offer_of(headers: &HeaderMap, body: &[u8]) -> Result<Offer, ApiError> {
    let kind = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !kind.starts_with("application/json") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the offer as application/json: {\"sdp\": ..., \"type\": \"offer\"}",
        ));
    }
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid("invalid_field", format!("{e}")),
        _ => ApiError::bad_request(format!("the body is not JSON: {e}")),
    })
}

/// A session's stride when its request names none: the largest whose delay keeps audio to
/// mouth under 1 s (a part of 8 frames, 0.32 s, and the delay 0.94 s with digital silence).
/// On 2 cores with the cpu-reduced engines a part's render takes most of the session's 420 ms
/// margin, more or less as the VM runs faster or slower: one session held real time in three
/// runs (the `live_sessions` experiment, docs/results.md); at 6 it repeated 5% of its frames.
/// Two sessions on 2 cores do not hold real time even at 12 (a 1.1 s delay); `"auto"` keeps
/// parts of 12 frames and chooses its stride from the rates its parts measure. A GPU holds
/// smaller strides.
pub const DEFAULT_STRIDE: usize = 8;

/// The largest stride a session runs at, named or chosen.
pub const MAX_STRIDE: usize = 12;

/// What a request asks of the stride.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StrideRequest {
    Fixed(usize),
    Auto,
}

/// A session's stride: named, or chosen by its governor.
enum SessionStride {
    Fixed(usize),
    Auto(Arc<StrideGovernor>),
}

impl SessionStride {
    fn current(&self) -> usize {
        match self {
            SessionStride::Fixed(k) => *k,
            SessionStride::Auto(g) => g.stride(),
        }
    }
}

fn stride_of(v: Option<&serde_json::Value>) -> Result<StrideRequest, ApiError> {
    let invalid = || ApiError::invalid("invalid_stride", "stride: a whole number from 1 to 12, or \"auto\"");
    match v {
        None => Ok(StrideRequest::Fixed(DEFAULT_STRIDE)),
        Some(serde_json::Value::Number(n)) => match n.as_u64() {
            Some(k @ 1..=12) => Ok(StrideRequest::Fixed(k as usize)),
            _ => Err(invalid()),
        },
        Some(serde_json::Value::String(s)) if s == "auto" => Ok(StrideRequest::Auto),
        Some(_) => Err(invalid()),
    }
}

/// The default avatar as a registered avatar (prepared once, kept in the cache).
fn default_entry(state: &AppState) -> Result<Arc<AvatarEntry>, ApiError> {
    let dir = crate::tempdirs::request_dir(&state.config.temp_root)
        .map_err(|e| ApiError::internal("creating the request's directory", e))?;
    let path = dir.path().join("default_avatar");
    std::fs::write(&path, &state.config.default_avatar)
        .map_err(|e| ApiError::internal("writing the default avatar", e))?;
    let settings = crate::options::RawOptions::default().settings()?;
    let checked = validate::avatar(&path, "video", validate::AvatarLimits::NONE, &settings, dir.path())?;
    let (media, report) = crate::fleet_avatars::media_of(checked, &state.config.default_avatar);
    let id = avatar_id(&state.config.default_avatar, media.faces());
    if let Some(e) = state.avatars.lock().unwrap().get(&id) {
        return Ok(e);
    }
    let entry = Arc::new(AvatarEntry::new(id, media, state.config.default_avatar.len(), report));
    Ok(state.avatars.lock().unwrap().insert_arc(entry))
}

/// `POST /v1/sessions`: answers the offer and starts the session.
pub async fn create(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let set = state.ready_engines().map_err(rejected(&state, "not_ready"))?;
    let offer = offer_of(&headers, &body).map_err(rejected(&state, "invalid"))?;
    let (live, answer) = start(&state, set, offer).await?;
    let id = live.id.clone();
    let mut body = live.describe();
    body["sdp"] = json!(answer);
    body["type"] = json!("answer");
    Ok((StatusCode::CREATED, [(header::LOCATION, format!("/v1/sessions/{id}"))], Json(body)).into_response())
}

/// Starts a session from its offer (the engines ready): the session, and the SDP answer.
pub(crate) async fn start(
    state: &AppState,
    set: Arc<crate::engines::EngineSet>,
    offer: Offer,
) -> Result<(Arc<LiveSession>, String), ApiError> {
    let max = state.config.sessions.max_sessions;
    let Some(reservation) = state.sessions.reserve(max) else {
        state.metrics.rejection("session_limit");
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "session_limit",
            format!("{max} sessions run already (--max-sessions); end one, or try later"),
        )
        .with_retry_after(5));
    };
    if offer.kind.as_deref().is_some_and(|k| k != "offer") {
        return Err(ApiError::invalid("invalid_sdp_type", "type: a session starts from an \"offer\""));
    }
    // The offer is checked before the avatar is prepared: a bad one costs nothing.
    cadence_live::parse_offer(&offer.sdp).map_err(start_error)?;
    let stride_request = stride_of(offer.stride.as_ref())?;
    let decoder = match offer.decoder.as_deref() {
        None => cadence::musetalk::DecoderKind::Taesd,
        Some(s) => crate::options::parse_decoder(s)
            .ok_or_else(|| ApiError::invalid("invalid_decoder", format!("decoder: taesd or full_vae, not {s:?}")))?,
    };
    let st = state.clone();
    let avatar_id = offer.avatar_id.clone();
    // The avatar, prepared (once) off the runtime.
    let (engines, prepared) = tokio::task::spawn_blocking(move || {
        let entry = match avatar_id {
            Some(id) => lookup(&st, &id)?,
            None => default_entry(&st)?,
        };
        let scratch = tempfile::tempdir().map_err(|e| ApiError::internal("a scratch directory", e))?;
        let (engines, _) = set.get(decoder).map_err(|e| ApiError::internal("loading the decoder", format!("{e:#}")))?;
        let (prepared, _) = render_job::avatar_for(&set, &engines, &entry, &st.metrics, scratch.path())
            .map_err(|e| ApiError::internal("preparing the avatar", format!("{e:#}")))?;
        Ok::<_, ApiError>(((set, engines), prepared))
    })
    .await
    .map_err(|e| ApiError::internal("a worker thread failed", e))??;
    let (set, engines) = engines;

    let c = &state.config.sessions;
    let infill = match offer.infill.as_deref() {
        None | Some("image") => cadence::musetalk::MuseTalkInfill::Image,
        Some("latent") => cadence::musetalk::MuseTalkInfill::Latent,
        Some(other) => {
            return Err(ApiError::invalid("invalid_infill", format!("infill: image or latent, not {other:?}")));
        }
    };
    let opts = RenderOptions {
        fps: FrameRate::whole(FPS),
        window: None,
        vad: state.config.vad.with_kind(c.vad),
        infill,
        ..RenderOptions::default()
    };
    // Parts of one stride: a part starts from the key its predecessor made for its first
    // frame (no UNet evaluation is repeated), and a shorter part is a shorter delay. `auto`
    // keeps the parts of the largest stride (every stride it chooses divides them), so its
    // delay is the default stride's.
    let (stride, part) = match stride_request {
        StrideRequest::Fixed(k) => (k, k),
        StrideRequest::Auto => (MAX_STRIDE, MAX_STRIDE),
    };
    let live = LiveOptions::new(stride, Some(part), &opts)
        .map_err(|e| ApiError::invalid("invalid_stride", format!("{e:#}")))?;
    let stride = match stride_request {
        StrideRequest::Fixed(k) => SessionStride::Fixed(k),
        StrideRequest::Auto => SessionStride::Auto(Arc::new(
            StrideGovernor::new(
                live.part_frames,
                MAX_STRIDE,
                FPS as f64,
                infill == cadence::musetalk::MuseTalkInfill::Image,
            )
            .map_err(|e| ApiError::internal("the stride governor", format!("{e:#}")))?,
        )),
    };
    let governor = match &stride {
        SessionStride::Auto(g) => Some(g.clone()),
        SessionStride::Fixed(_) => None,
    };
    let delay = Duration::from_secs_f64((live.part_frames + 1 + live.lookahead_frames) as f64 / FPS as f64) + c.margin;
    let opts_vad = opts.vad.name();
    let comp = &prepared.compositors[0];
    let (width, height) = (comp.width, comp.height);
    let wire = WireConfig {
        fps: FPS as f64,
        width,
        height,
        delay,
        video_bitrate_bps: c.video_bitrate_bps,
        speech_bitrate_bps: 32_000,
        peer_timeout: c.peer_timeout,
        ramp: opts.ramp as usize,
    };
    let render: cadence_live::session::Render = Box::new(move |timeline, frames, stop| {
        let wav = cadence_media::wav::WavReader::new(cadence_live::TimelineReader::new(timeline), None)
            .map_err(|e| anyhow::anyhow!("the session's audio: {e}"))?;
        let stream = cadence_media::AudioStream::new(wav, "session")?;
        let opts = RenderOptions { cancel: Some(stop), ..opts };
        let mut send = |i: usize, nv12: &[u8]| frames.send(i, nv12.to_vec());
        // The render's threads yield to the wire's: a frame late on the wire is a gap the peer
        // sees, a render a few milliseconds later is absorbed by the session's margin.
        lower_priority();
        let pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("cadence-session-{i}"))
            .start_handler(|_| lower_priority())
            .build()?;
        let r = pool.install(|| {
            cadence::musetalk::live::render_live_to(
                &engines,
                &set.backend,
                &opts,
                live,
                governor.as_deref(),
                &prepared,
                stream,
                LiveTarget::<std::io::Sink>::Frames(&mut send),
                "session",
                false,
                |_| {},
            )
        });
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.chain().any(|c| c.is::<Cancelled>()) => Ok(()),
            Err(e) => Err(e),
        }
    });
    let net = NetConfig { bind: state.config.listen.ip(), public_ip: c.public_ip, ports: c.ports };
    let (session, answer) =
        Session::start(&offer.sdp, &net, wire, QUEUE_FRAMES, c.max_queued_seconds, render).map_err(start_error)?;
    let id = format!("s-{}", state.request_id());
    let live = Arc::new(LiveSession {
        id: id.clone(),
        alias: std::sync::OnceLock::new(),
        session: Mutex::new(Some(session)),
        created: Instant::now(),
        last_audio: Mutex::new(Instant::now()),
        stride,
        infill: infill.name(),
        decoder: crate::avatars::decoder_name(decoder),
        vad: opts_vad,
        delay,
        width,
        height,
    });
    state.sessions.map.lock().unwrap().insert(id, live.clone());
    drop(reservation);
    state.metrics.session_started();
    Ok((live, answer))
}

/// A session that could not start: 422 for the peer's offer, 503 when no UDP port is free,
/// 500 otherwise.
fn start_error(e: StartError) -> ApiError {
    match e {
        StartError::Offer(m) => ApiError::invalid("invalid_offer", m),
        StartError::NoPort(m) => ApiError::unavailable("no_port", m),
        StartError::Internal(m) => ApiError::internal("starting the session", m),
    }
}

/// Lowers the calling thread's scheduling priority (nice 10): sessions' render threads, so
/// that the wire's thread, at the default priority, runs as soon as a frame is due.
fn lower_priority() {
    // SAFETY: setpriority on this thread's id (Linux: a thread is a task with its own nice
    // value); a failure (another OS) leaves the priority as it was.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// `GET /v1/sessions/{id}`.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(state.sessions.get(&id)?.describe()))
}

/// `DELETE /v1/sessions/{id}`.
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    let s = state.sessions.get(&id)?;
    state.sessions.remove(&id);
    s.close();
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sessions/{id}/interrupt`: the speech not yet sent is dropped.
pub async fn interrupt(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let s = state.sessions.get(&id)?;
    let dropped = match s.session.lock().unwrap().as_ref() {
        Some(x) => x.interrupt(),
        None => return Err(ended(&id)),
    };
    Ok(Json(json!({"session_id": id, "dropped_audio_s": dropped})))
}

fn ended(id: &str) -> ApiError {
    ApiError::new(StatusCode::GONE, "session_ended", format!("session {id} has ended"))
}

/// Speech from a request body: a WAV file (any rate and channel count the WAV reader takes,
/// resampled to 16 kHz mono), or raw 16 kHz mono s16le PCM (`Content-Type: audio/L16` or
/// `application/octet-stream`).
fn speech_of(headers: &HeaderMap, body: &[u8]) -> Result<Vec<i16>, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid("empty_audio", "the body holds no audio"));
    }
    let kind = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let raw = kind.starts_with("audio/l16") || kind.starts_with("audio/L16") || kind == "application/octet-stream";
    if raw && !body.starts_with(b"RIFF") {
        if !body.len().is_multiple_of(2) {
            return Err(ApiError::invalid("invalid_audio", "raw PCM: an odd number of bytes (16-bit samples)"));
        }
        return Ok(body.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect());
    }
    let reader =
        cadence_media::wav::WavReader::new(std::io::Cursor::new(body), Some(body.len() as u64)).map_err(|e| {
            ApiError::invalid(
                "invalid_audio",
                format!("audio: {e} (send a WAV, or raw 16 kHz s16le with Content-Type audio/L16)"),
            )
        })?;
    let mut stream = cadence_media::AudioStream::new(reader, "audio")
        .map_err(|e| ApiError::invalid("invalid_audio", format!("audio: {e}")))?;
    let (mut mono, mut track) = (Vec::new(), Vec::new());
    while stream
        .read(4096, &mut mono, &mut track)
        .map_err(|e| ApiError::invalid("invalid_audio", format!("audio: {e}")))?
    {
        track.clear();
    }
    Ok(mono.iter().map(|&v| (v.clamp(-1.0, 1.0) * 32767.0).round() as i16).collect())
}

/// `POST /v1/sessions/{id}/audio`: queues speech after what is queued (or now).
pub async fn audio(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let s = state.sessions.get(&id)?;
    let pcm = tokio::task::spawn_blocking(move || speech_of(&headers, &body))
        .await
        .map_err(|e| ApiError::internal("a worker thread failed", e))??;
    queue(&s, &pcm).map(Json)
}

/// Queues 16 kHz speech on a session: when it starts, how long it is, and what waits.
fn queue(s: &LiveSession, pcm: &[i16]) -> Result<serde_json::Value, ApiError> {
    let guard = s.session.lock().unwrap();
    let session = guard.as_ref().ok_or_else(|| ended(&s.id))?;
    let (start, waits) = session.speak(pcm).map_err(|e| match e {
        QueueError::Full { .. } => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "audio_queue_full", e.to_string())
            .with_retry_after(session.timeline().queued_seconds().ceil() as u64),
        QueueError::Closed => ended(&s.id),
    })?;
    *s.last_audio.lock().unwrap() = Instant::now();
    Ok(json!({
        "session_id": s.id,
        "start_s": start,
        "waits_s": waits,
        "duration_s": pcm.len() as f64 / 16_000.0,
        "queued_audio_s": session.timeline().queued_seconds(),
    }))
}

/// The most text one `/speak` request may hold: about two minutes of speech at the default
/// rate, what `--session-max-queued-seconds` holds by default; longer text would be spoken
/// (at the server's cost) only to be refused.
pub const MAX_TEXT_CHARS: usize = 2000;

/// What `/speak` says: `{"text", "voice"?, "words_per_minute"?}` as JSON, or the body itself as
/// UTF-8 text with any other Content-Type. Text that starts with `<speak` is SSML
/// (`<break time="500ms"/>` for a pause).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeakRequest {
    pub text: String,
    /// An espeak-ng voice (default `en-us`).
    pub voice: Option<String>,
    /// 80 to 450 (default 150).
    pub words_per_minute: Option<u32>,
}

fn speak_of(headers: &HeaderMap, body: &[u8]) -> Result<SpeakRequest, ApiError> {
    let kind = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if kind.starts_with("application/json") {
        return serde_json::from_slice(body).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => ApiError::invalid("invalid_field", format!("{e}")),
            _ => ApiError::bad_request(format!("the body is not JSON: {e}")),
        });
    }
    let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("invalid_text", "the text is not UTF-8"))?;
    Ok(SpeakRequest { text: text.to_string(), voice: None, words_per_minute: None })
}

/// 422 for text there is nothing to speak in, text longer than [`MAX_TEXT_CHARS`], or a rate
/// espeak-ng does not take.
fn check(r: &SpeakRequest) -> Result<(), ApiError> {
    if r.text.trim().is_empty() {
        return Err(ApiError::invalid("empty_text", "text: there is nothing to speak"));
    }
    if r.text.chars().count() > MAX_TEXT_CHARS {
        return Err(ApiError::invalid(
            "text_too_long",
            format!("text: at most {MAX_TEXT_CHARS} characters a request (send the rest after)"),
        ));
    }
    if r.text.contains('\0') {
        return Err(ApiError::invalid("invalid_text", "the text contains a NUL character"));
    }
    let rate = r.words_per_minute.unwrap_or(espeak::DEFAULT_RATE_WPM);
    if !(80..=450).contains(&rate) {
        return Err(ApiError::invalid("invalid_rate", "words_per_minute: 80 to 450"));
    }
    Ok(())
}

/// Text spoken by libespeak-ng, resampled to the timeline's 16 kHz: 501 `tts_unavailable`
/// when the library cannot be loaded here, 422 for a voice it does not have.
fn synthesise(r: &SpeakRequest) -> Result<Vec<i16>, ApiError> {
    if !espeak::available() {
        return Err(tts_unavailable());
    }
    let voice = r.voice.as_deref().unwrap_or(espeak::DEFAULT_VOICE);
    if voice.is_empty() || voice.contains('\0') {
        return Err(ApiError::invalid("invalid_voice", "voice: an espeak-ng voice name, such as en-us"));
    }
    let rate = r.words_per_minute.unwrap_or(espeak::DEFAULT_RATE_WPM);
    let speech = espeak::speak(&r.text, voice, rate).map_err(|e| {
        let m = format!("{e:#}");
        if m.contains("has no voice") {
            ApiError::invalid("invalid_voice", m)
        } else {
            ApiError::internal("speaking the text", m)
        }
    })?;
    // The same resampler as `render --text`'s (its speech is read through a WAV).
    let mono: Vec<f32> = speech.samples.iter().map(|&v| v as f32 / 32768.0).collect();
    let mono = cadence_media::audio::resample(&mono, speech.sample_rate, 16_000)
        .map_err(|e| ApiError::internal("resampling the speech", format!("{e:#}")))?;
    Ok(mono.iter().map(|&v| (v.clamp(-1.0, 1.0) * 32767.0).round() as i16).collect())
}

fn tts_unavailable() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "tts_unavailable",
        format!(
            "text to speech needs libespeak-ng, which could not be loaded on this server (Debian: apt-get install {}): \
             send the speech as audio (POST /v1/sessions/{{id}}/audio)",
            espeak::PACKAGE
        ),
    )
}

/// `POST /v1/sessions/{id}/speak`: speaks the text with libespeak-ng and queues the speech as
/// `/audio` does.
pub async fn speak(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let s = state.sessions.get(&id)?;
    let request = speak_of(&headers, &body)?;
    speak_text(&s, request).await.map(Json)
}

/// Speaks `request` (off the runtime: libespeak-ng takes one synthesis at a time) and queues
/// it on `s`.
pub(crate) async fn speak_text(s: &LiveSession, request: SpeakRequest) -> Result<serde_json::Value, ApiError> {
    check(&request)?;
    let pcm = tokio::task::spawn_blocking(move || synthesise(&request))
        .await
        .map_err(|e| ApiError::internal("a worker thread failed", e))??;
    queue(s, &pcm)
}

/// Ends sessions whose peer left or that idled, every second, for as long as the server lives.
pub fn spawn_reaper(state: AppState) {
    let weak = Arc::downgrade(&state);
    drop(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let Some(state) = weak.upgrade() else { break };
            for (id, reason) in state.sessions.reap(state.config.sessions.idle) {
                tracing::info!(session = %id, "session ended: {reason}");
            }
        }
    });
}
