//! The OpenAPI 3.1 document of the routes, written by hand from [`ROUTES`] (the table the tests
//! hold the router to): the routes are few and their bodies are files, which derive macros
//! describe no better than a table does.

use serde_json::{json, Value};

pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    /// Status codes the route answers besides 401 (with a token), 500 and the error body's.
    pub responses: &'static [(u16, &'static str)],
}

const RENDER_ERRORS: &[(u16, &str)] = &[
    (200, "the MP4 (video/mp4) with X-Inference-FPS, X-Stride, X-Realtime-Factor, X-Frames, X-Keyframes-Evaluated, X-Bypassed-Frames, X-Weights, X-Request-Id and Server-Timing; with stream=fmp4, a fragmented MP4 (video/mp4; codecs=...) in chunked transfer, sent segment by segment while it renders, with X-Stride, X-Frames, X-Weights, X-Request-Id, X-Job-Id and Server-Timing up to the first byte (a render that fails after the first byte cuts the body off)"),
    (400, "malformed body"),
    (404, "unknown avatar_id"),
    (408, "the body arrived too slowly (--body-timeout-seconds, --body-min-rate, --body-max-seconds)"),
    (413, "body or field over --max-body-mb"),
    (415, "not multipart/form-data or application/json"),
    (422, "a field that cannot be rendered (or a stream value other than fmp4): corrupt or NaN audio, audio over --max-seconds, an image or video frame over --max-pixels or larger than the H.264 encoder takes (3840x2160 or 2160x3840), a video avatar that is not H.264, is H.264 with B-frames or in a 10-bit or 4:2:2/4:4:4 profile, corrupt, odd-sided, of variable frame rate, over 1000 frames or over --max-avatar-mb decoded, stride 0, a bad keyframe list, ..."),
    (429, "render slots and queue full, or (stream=fmp4) the job table full (Retry-After)"),
    (503, "loading, draining or cancelled at shutdown (Retry-After)"),
];

const JOB_LOOKUP: &[(u16, &str)] = &[(200, "the job"), (400, "not a job id"), (404, "unknown or expired")];

pub const ROUTES: &[Route] = &[
    Route {
        method: "post",
        path: "/generate",
        summary: "Render speech and an avatar to an MP4 (multipart: audio, video, stride, decoder, ...; or JSON with base64 files)",
        responses: RENDER_ERRORS,
    },
    Route {
        method: "post",
        path: "/v1/avatars",
        summary: "Prepare an avatar once (multipart: image, a PNG/JPEG image or an H.264 MP4 video avatar; face_box, face_boxes, face_index, bbox_shift, decoder; without a box the face is found); the id is derived from its content",
        responses: &[
            (200, "already registered"),
            (201, "prepared"),
            (408, "the body arrived too slowly"),
            (413, "too large"),
            (415, "not multipart"),
            (422, "not an image or video avatar cadence renders (see /generate's 422)"),
            (429, "busy"),
            (503, "not ready"),
        ],
    },
    Route {
        method: "get",
        path: "/v1/avatars/{id}",
        summary: "A registered avatar",
        responses: &[(200, "the avatar"), (404, "unknown"), (422, "malformed id")],
    },
    Route {
        method: "delete",
        path: "/v1/avatars/{id}",
        summary: "Forget a registered avatar",
        responses: &[(204, "removed"), (404, "unknown"), (422, "malformed id")],
    },
    Route {
        method: "post",
        path: "/v1/jobs",
        summary: "Queue a render (the same bodies as /generate); answered at once with the job (Location: /v1/jobs/{id})",
        responses: &[
            (202, "the job, queued"),
            (400, "malformed body"),
            (404, "unknown avatar_id"),
            (408, "the body arrived too slowly"),
            (413, "body or field over --max-body-mb"),
            (415, "not multipart/form-data or application/json"),
            (422, "a field that cannot be rendered, or a query parameter"),
            (429, "the job table is full (--max-jobs), or in a fleet (--nats) its queue (--fleet-max-queued); Retry-After"),
            (503, "loading or draining, or (--nats) the fleet's NATS server unreachable (Retry-After)"),
        ],
    },
    Route {
        method: "get",
        path: "/v1/jobs/{id}",
        summary: "A job or streamed render: state (queued, running, done, failed, cancelled), progress, frames_done, eta_seconds, and the final statistics",
        responses: JOB_LOOKUP,
    },
    Route {
        method: "delete",
        path: "/v1/jobs/{id}",
        summary: "Cancel a job that has not finished (202; its render stops at the next batch, its files are removed), or forget one that has (204)",
        responses: &[
            (202, "cancelling"),
            (204, "forgotten"),
            (400, "not a job id"),
            (404, "unknown or expired"),
            (503, "in a fleet (--nats): its NATS server unreachable"),
        ],
    },
    Route {
        method: "get",
        path: "/v1/jobs/{id}/result",
        summary: "The MP4 of a finished job, with HTTP Range support",
        responses: &[
            (200, "the MP4 (video/mp4)"),
            (206, "the requested range (Content-Range)"),
            (400, "not a job id"),
            (404, "unknown or expired, or a streamed render (nothing kept)"),
            (409, "the job is not done"),
            (416, "the range cannot be satisfied (Content-Range: bytes */size)"),
        ],
    },
    Route {
        method: "get",
        path: "/v1/jobs/{id}/events",
        summary: "Server-sent events: 'progress' events with the job's JSON, then one named after the final state (done, failed, cancelled)",
        responses: &[
            (200, "text/event-stream"),
            (400, "not a job id"),
            (404, "unknown or expired"),
            (503, "in a fleet (--nats): its NATS server unreachable"),
        ],
    },
    Route {
        method: "post",
        path: "/v1/sessions",
        summary: "Start a live WebRTC session (JSON: sdp, the browser's offer to receive video and audio; type \"offer\"; avatar_id, else the default avatar; stride 1..=12, default 6, or \"auto\" (chosen part by part from the rates the session measures); decoder; infill, image (default) or latent): the SDP answer and the session (Location: /v1/sessions/{id}). H.264 and Opus over ICE-lite; the avatar idles at rest until audio is sent",
        responses: &[
            (201, "the session with sdp (the answer) and type \"answer\""),
            (400, "malformed JSON"),
            (404, "unknown avatar_id"),
            (415, "not application/json"),
            (422, "an offer that does not parse or cannot be answered (no video or audio to receive, no H.264 or Opus), a bad stride or decoder"),
            (429, "--max-sessions sessions run already (Retry-After)"),
            (503, "loading or draining, or no UDP port free in --webrtc-ports (no_port; Retry-After)"),
        ],
    },
    Route {
        method: "get",
        path: "/v1/sessions/{id}",
        summary: "A session's figures: state, speaking, queued_audio_s, frames_sent, repeated_frames (and %), late_frames, keyframes, av_skew_ms, max_frame_gap_ms, stride (the current one), stride_mode (fixed or auto), stride_changes, vad, delay_ms, max_video_encode_ms",
        responses: &[(200, "the session"), (404, "unknown or ended")],
    },
    Route {
        method: "delete",
        path: "/v1/sessions/{id}",
        summary: "End a session",
        responses: &[(204, "ended"), (404, "unknown or ended")],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/audio",
        summary: "Queue speech: a WAV file, or raw 16 kHz mono s16le PCM (Content-Type audio/L16); it plays after what is queued, or at once",
        responses: &[
            (200, "start_s, waits_s (behind the speech queued before it), duration_s, queued_audio_s"),
            (404, "unknown session"),
            (410, "the session has ended"),
            (413, "over --max-body-mb"),
            (422, "empty or not audio"),
            (429, "more than --session-max-queued-seconds would wait (Retry-After)"),
        ],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/speak",
        summary: "Speak text with libespeak-ng and queue the speech as /audio does (JSON: text, voice, default en-us, words_per_minute 80..=450, default 150; or the body itself as UTF-8 text; text that starts with <speak is SSML)",
        responses: &[
            (200, "start_s, waits_s (behind the speech queued before it), duration_s, queued_audio_s"),
            (400, "malformed JSON"),
            (404, "unknown session"),
            (410, "the session has ended"),
            (422, "empty text, over 2000 characters, not UTF-8, a rate outside 80..=450, an unknown voice or field"),
            (429, "more than --session-max-queued-seconds would wait (Retry-After)"),
            (501, "tts_unavailable: libespeak-ng cannot be loaded on this server (Debian: libespeak-ng1)"),
        ],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/interrupt",
        summary: "Drop the speech not yet sent: the avatar stops speaking and eases to rest",
        responses: &[(200, "dropped_audio_s"), (404, "unknown session"), (410, "the session has ended")],
    },
    Route {
        method: "post",
        path: "/offer",
        summary: "LiveTalking-compatible: start a live session (JSON: sdp, type \"offer\"; avatar, a registered avatar's id, else the default avatar; stride, decoder as for /v1/sessions; LiveTalking's refaudio, reftext and custom_config are ignored)",
        responses: &[(200, "{\"sdp\", \"type\": \"answer\", \"sessionid\"} (six digits, as a string) and session_id (cadence's id); or {\"code\": -1, \"msg\"} when no session starts (the reasons /v1/sessions answers 4xx or 503 for)")],
    },
    Route {
        method: "post",
        path: "/human",
        summary: "LiveTalking-compatible: text for a session (JSON: sessionid, text, type echo or chat, interrupt). interrupt: true interrupts first; echo text is spoken by libespeak-ng as /v1/sessions/{id}/speak speaks it; chat is refused (no LLM)",
        responses: &[(200, "{\"code\": 0, \"msg\": \"ok\"} with nothing to speak or the echo text queued; {\"code\": -1, \"msg\"} for chat, echo text without libespeak-ng, an unknown session or a malformed body")],
    },
    Route {
        method: "post",
        path: "/humanaudio",
        summary: "LiveTalking-compatible: queue speech for a session (multipart: file, a WAV, or raw 16 kHz s16le with the part's Content-Type audio/L16; sessionid)",
        responses: &[(200, "{\"code\": 0, \"msg\": \"ok\"}; or {\"code\": -1, \"msg\"}: no file, not audio, an unknown or ended session, the queue full (--session-max-queued-seconds)")],
    },
    Route {
        method: "post",
        path: "/interrupt_talk",
        summary: "LiveTalking-compatible: drop a session's speech not yet sent (JSON: sessionid)",
        responses: &[(200, "{\"code\": 0, \"msg\": \"ok\"}; or {\"code\": -1, \"msg\"} for an unknown or ended session")],
    },
    Route {
        method: "post",
        path: "/is_speaking",
        summary: "LiveTalking-compatible: whether a session is sending speech now (JSON: sessionid)",
        responses: &[(200, "{\"code\": 0, \"msg\": \"ok\", \"data\": true | false}; or {\"code\": -1, \"msg\"} for an unknown or ended session")],
    },
    Route {
        method: "post",
        path: "/calibrate",
        summary: "Measure the engines (the source's JSON: benchmarks.musetalk.{unet, taesd, stride_projections.stride_1..3}), with a render per stride beside each projection, the hardware, backend, device, profile, weights and recommended_render_slots; holds every render slot while it runs. Query: frames (5..=250, default 50), runs (1..=5, default 3), infill (latent or image, default latent: the infill projected and rendered)",
        responses: &[
            (200, "the calibration (also GET /v1/calibration until the next)"),
            (422, "frames or runs out of bounds, infill not latent or image, or another query parameter"),
            (503, "loading, draining, or a calibration already running (Retry-After)"),
        ],
    },
    Route {
        method: "get",
        path: "/v1/calibration",
        summary: "The last calibration's JSON",
        responses: &[(200, "the calibration"), (404, "no calibration yet")],
    },
    Route {
        method: "get",
        path: "/",
        summary: "A page for people: pick a WAV and a portrait (or an avatar id), stride, decoder and infill, and watch the render play as it streams (no token needed for the page itself)",
        responses: &[(200, "text/html")],
    },
    Route { method: "get", path: "/healthz", summary: "Liveness (no token needed)", responses: &[(200, "alive")] },
    Route {
        method: "get",
        path: "/readyz",
        summary: "Readiness (no token needed)",
        responses: &[(200, "ready"), (503, "loading, draining or failed")],
    },
    Route {
        method: "get",
        path: "/v1/info",
        summary: "Version, backend, device, profile, weights, limits",
        responses: &[(200, "JSON")],
    },
    Route { method: "get", path: "/metrics", summary: "Prometheus text metrics", responses: &[(200, "text/plain")] },
    Route { method: "get", path: "/openapi.json", summary: "This document", responses: &[(200, "JSON")] },
];

fn multipart_schema() -> Value {
    json!({
        "type": "object",
        "required": ["audio"],
        "properties": {
            "audio": {"type": "string", "format": "binary", "description": "speech, WAV"},
            "video": {"type": "string", "format": "binary", "description": "avatar: a PNG or JPEG image, or a video avatar (an H.264 MP4 at a constant frame rate, at most 1000 frames; output frame k shows avatar frame k, k+1, .. forward then backward); absent: the default avatar"},
            "stride": {"type": "integer", "minimum": 1, "default": 1},
            "decoder": {"type": "string", "enum": ["taesd", "full_vae", "sd-vae"], "default": "taesd"},
            "keyframes": {"type": "string", "description": "strictly increasing frame list, e.g. 0,3,7 (instead of stride)"},
            "method": {"type": "string", "enum": ["slerp", "lerp"], "default": "slerp"},
            "infill": {"type": "string", "enum": ["latent", "image"], "default": "latent", "description": "what the frames between keyframes are blended from: latent (SLERP of the keyframes' latents, the decoder on every frame not bypassed) or image (the decoder on the evaluated keyframes only, the frames between blended from their decoded face crops: fewer decoder runs, more values per blended frame)"},
            "ramp": {"type": "integer", "minimum": 0, "maximum": 250, "default": 4},
            "fps": {"type": "string", "default": "25", "description": "25, 30, 29.97, 30000/1001, ..."},
            "encoder": {"type": "string", "enum": ["openh264", "x264", "nvenc"], "default": "openh264"},
            "face_box": {"type": "string", "description": "x,y,w,h in pixels (every frame of a video avatar), or center (the centred square of half the shorter side); absent with no face_boxes: the face is found (MTCNN) and MuseTalk's crop derived"},
            "face_boxes": {"type": "string", "description": "a video avatar's boxes, one x,y,w,h line per frame"},
            "face_index": {"type": "integer", "minimum": 0, "default": 0, "description": "which found face: 0 the largest"},
            "bbox_shift": {"type": "integer", "default": 0, "description": "MuseTalk's bbox_shift in pixels (found faces)"},
            "avatar_id": {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "a registered avatar instead of video"},
            "vad": {"type": "string", "enum": ["silero", "energy"], "description": "voice activity detector deciding the silence easing and bypass; absent: the server's --vad (silero by default)"}
        }
    })
}

fn json_schema() -> Value {
    let mut s = multipart_schema();
    let props = s["properties"].as_object_mut().expect("an object");
    props.remove("audio");
    props.remove("video");
    props.insert("audio_b64".into(), json!({"type": "string", "contentEncoding": "base64"}));
    props.insert("avatar_b64".into(), json!({"type": "string", "contentEncoding": "base64"}));
    props.insert("stride".into(), json!({"type": ["integer", "string"], "minimum": 1, "default": 1}));
    props.insert("keyframes".into(), json!({"type": ["array", "string"], "items": {"type": "integer"}}));
    s["required"] = json!(["audio_b64"]);
    s
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}
    })
}

/// The bodies of the LiveTalking-compatible routes (LiveTalking reads JSON whatever the
/// Content-Type; sessionid a string, or an integer as older LiveTalking clients send it).
fn livetalking_body(path: &str) -> Option<Value> {
    let sessionid =
        json!({"type": ["string", "integer"], "description": "/offer's sessionid (or cadence's session_id)"});
    let schema = match path {
        "/offer" => json!({"type": "object", "required": ["sdp"], "properties": {
            "sdp": {"type": "string"}, "type": {"type": "string", "enum": ["offer"]},
            "avatar": {"type": "string", "description": "a registered avatar's id"},
            "stride": {"type": "integer", "minimum": 1, "maximum": 12, "default": 12},
            "decoder": {"type": "string", "enum": ["taesd", "full_vae"]}}}),
        "/human" => json!({"type": "object", "required": ["sessionid", "type"], "properties": {
            "sessionid": sessionid, "text": {"type": "string"}, "type": {"type": "string", "enum": ["echo", "chat"]},
            "interrupt": {"type": "boolean", "default": false}}}),
        "/interrupt_talk" | "/is_speaking" => {
            json!({"type": "object", "required": ["sessionid"], "properties": {"sessionid": sessionid}})
        }
        "/humanaudio" => {
            return Some(json!({"required": true, "content": {"multipart/form-data": {"schema": {
                "type": "object", "required": ["file", "sessionid"], "properties": {
                    "file": {"type": "string", "format": "binary", "description": "speech: a WAV, or raw 16 kHz s16le with the part's Content-Type audio/L16"},
                    "sessionid": {"type": "string"}}}}}}))
        }
        _ => return None,
    };
    Some(json!({"required": true, "content": {"application/json": {"schema": schema}}}))
}

pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for r in ROUTES {
        let mut responses = serde_json::Map::new();
        for &(code, what) in r.responses {
            let content = if code >= 400 {
                json!({"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}})
            } else {
                json!({})
            };
            responses.insert(code.to_string(), json!({"description": what, "content": content}));
        }
        let open = crate::middleware::OPEN_ROUTES.contains(&r.path);
        if !open {
            responses.insert(
                "401".into(),
                json!({"description": "missing or wrong bearer token (when the server has one)",
                       "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
            );
        }
        let mut op = json!({"summary": r.summary, "responses": responses});
        if open {
            op["security"] = json!([]);
        }
        if r.path.contains("{id}") {
            let pattern = if r.path.starts_with("/v1/jobs/") {
                format!("^[0-9a-f]{{{}}}$", crate::jobs::ID_LEN)
            } else if r.path.starts_with("/v1/sessions/") {
                // `s-` and the request id that started the session.
                "^s-[0-9a-f]+-[0-9a-f]+$".to_string()
            } else {
                "^[0-9a-f]{64}$".to_string()
            };
            op["parameters"] = json!([{"name": "id", "in": "path", "required": true,
                "schema": {"type": "string", "pattern": pattern}}]);
        }
        if r.path == "/generate" {
            op["parameters"] = json!([{"name": "stream", "in": "query", "required": false,
                "description": "fmp4: send a fragmented MP4 (an init segment, then one moof+mdat per 2 s GOP) while it \
                    renders, in chunked transfer; the statistics known only at the end go to the job record named by \
                    the X-Job-Id header (GET /v1/jobs/{id}), the server's log and the metrics. Absent: the whole MP4 \
                    after the render, with the statistics in its headers.",
                "schema": {"type": "string", "enum": ["fmp4"]}}]);
        }
        if r.path == "/generate" || r.path == "/v1/jobs" {
            op["requestBody"] = json!({"required": true, "content": {
                "multipart/form-data": {"schema": multipart_schema()},
                "application/json": {"schema": json_schema()}}});
        }
        if r.path == "/v1/avatars" {
            op["requestBody"] = json!({"required": true, "content": {"multipart/form-data": {"schema": {
                "type": "object", "required": ["image"], "properties": {
                    "image": {"type": "string", "format": "binary", "description": "PNG or JPEG image, or H.264 MP4 video avatar (also accepted as video)"},
                    "face_box": {"type": "string", "description": "x,y,w,h or center; absent with no face_boxes: the face is found"},
                    "face_boxes": {"type": "string", "description": "a video avatar's boxes, one x,y,w,h line per frame"},
                    "face_index": {"type": "integer", "minimum": 0, "default": 0},
                    "bbox_shift": {"type": "integer", "default": 0},
                    "decoder": {"type": "string", "enum": ["taesd", "full_vae", "sd-vae"]}}}}}});
        }
        if let Some(body) = livetalking_body(r.path) {
            op["requestBody"] = body;
        }
        let entry = paths.entry(r.path.to_string()).or_insert_with(|| json!({}));
        entry[r.method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "cadence render server", "version": env!("CARGO_PKG_VERSION")},
        "components": {
            "schemas": {"Error": error_schema()},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "security": [{"bearer": []}],
        "paths": paths,
    })
}
