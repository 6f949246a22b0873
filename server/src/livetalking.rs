//! LiveTalking-compatible routes: `/offer`, `/human`, `/humanaudio`, `/interrupt_talk` and
//! `/is_speaking` with the request and answer shapes of LiveTalking's server
//! (github.com/lipku/LiveTalking: `server/rtc_manager.py`'s `handle_offer`, `server/routes.py`),
//! so that its pages and clients drive cadence's live sessions ([`crate::sessions`]) unchanged.
//!
//! As in LiveTalking, every answer is HTTP 200 with a JSON body: `{"code": 0, "msg": "ok"}` (and
//! `data` for `/is_speaking`), or `{"code": -1, "msg": "..."}` for an error; `/offer` answers
//! `{"sdp", "type": "answer", "sessionid"}`. The session id is a string of six digits (LiveTalking
//! sends a UUID string now, a six-digit integer before): requests may give it as a string or an
//! integer, and may give cadence's own session id instead. `/human` with `type: "echo"` speaks its
//! text through libespeak-ng where the server has it (as `/v1/sessions/{id}/speak`), and says
//! why not where it has not; `type: "chat"` is an error (cadence has no LLM). The routes take the
//! bearer token like every other (`--token`).

use crate::error::ApiError;
use crate::generate::rejected;
use crate::sessions::{self, LiveSession, Offer};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Multipart, Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The message LiveTalking answers for an unknown session id.
pub const SESSION_NOT_FOUND: &str = "session not found";

/// `/human`'s answer to text where libespeak-ng cannot be loaded.
pub const NO_TTS: &str = "text-to-speech is not available on this server (it needs libespeak-ng: \
    apt-get install libespeak-ng1): send the speech as audio with POST /humanaudio (multipart: file, a WAV; sessionid)";

/// `/human`'s answer to `type: "chat"`.
pub const NO_CHAT: &str = "chat is not available in cadence (it has no LLM and no text-to-speech): \
    send the answer's speech as audio with POST /humanaudio (multipart: file, a WAV; sessionid)";

/// LiveTalking's success: `{"code": 0, "msg": "ok"}`, with `data` when there is some.
fn ok(data: Option<Value>) -> Json<Value> {
    let mut body = json!({"code": 0, "msg": "ok"});
    if let Some(d) = data {
        body["data"] = d;
    }
    Json(body)
}

/// LiveTalking's error: `{"code": -1, "msg": ...}`, answered 200 as LiveTalking does.
fn fail(msg: impl Into<String>) -> Json<Value> {
    let msg = msg.into();
    tracing::warn!(code = -1, "{msg}");
    Json(json!({"code": -1, "msg": msg}))
}

fn from_api(e: ApiError) -> Json<Value> {
    fail(e.message)
}

/// A JSON object body (LiveTalking reads it whatever the Content-Type says).
fn params(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, Json<Value>> {
    let body = body.map_err(|e| fail(format!("the body: {}", e.body_text())))?;
    match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(fail("the body is not a JSON object")),
        Err(e) => Err(fail(format!("the body is not JSON: {e}"))),
    }
}

/// The session a `sessionid` names (a string, or the integer older LiveTalking clients send).
/// A request's JSON body, and the session its `sessionid` names.
type Addressed = (Map<String, Value>, Arc<LiveSession>);

/// The body and session of a request to a session (LiveTalking's error shape when either is bad).
fn addressed(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Addressed, Json<Value>> {
    let p = params(body)?;
    let s = session(state, p.get("sessionid"))?;
    Ok((p, s))
}

fn session(state: &AppState, id: Option<&Value>) -> Result<Arc<LiveSession>, Json<Value>> {
    let key = match id {
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    state.sessions.find(&key).ok_or_else(|| fail(SESSION_NOT_FOUND))
}

/// Python's truth of a JSON value (LiveTalking tests `if params.get('interrupt')`).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|x| x != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// A fresh LiveTalking session id: six digits, as LiveTalking's `randN(6)` made them.
fn six_digits() -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).expect("the operating system's random generator");
    (100_000 + u32::from_le_bytes(b) % 900_000).to_string()
}

/// `/v1/sessions`'s options that `/offer` takes besides LiveTalking's fields.
const CADENCE_OPTIONS: [&str; 3] = ["stride", "decoder", "infill"];

/// `POST /offer`: starts a session from the browser's offer; `{"sdp", "type": "answer",
/// "sessionid"}` (and cadence's `session_id`).
pub async fn offer(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Json<Value> {
    let set = match state.ready_engines().map_err(rejected(&state, "not_ready")) {
        Ok(s) => s,
        Err(e) => return from_api(e),
    };
    let p = match params(body) {
        Ok(p) => p,
        Err(e) => {
            state.metrics.rejection("invalid");
            return e;
        }
    };
    // LiveTalking's `avatar` names a registered avatar here; cadence's session options pass
    // through; LiveTalking's refaudio, reftext and custom_config (a voice for its text to
    // speech, its action orchestration), and any other field, are ignored as LiveTalking does.
    if !p.get("sdp").is_some_and(Value::is_string) {
        state.metrics.rejection("invalid");
        return fail("sdp: the browser's offer is required ({\"sdp\": ..., \"type\": \"offer\"})");
    }
    let mut o = Map::new();
    for (from, to) in [("sdp", "sdp"), ("type", "type"), ("avatar", "avatar_id"), ("avatar_id", "avatar_id")] {
        if let Some(v) = p.get(from).filter(|v| !v.is_null()) {
            o.insert(to.into(), v.clone());
        }
    }
    for k in CADENCE_OPTIONS {
        if let Some(v) = p.get(k).filter(|v| !v.is_null()) {
            o.insert(k.into(), v.clone());
        }
    }
    let offer: Offer = match serde_json::from_value(Value::Object(o)) {
        Ok(o) => o,
        Err(e) => {
            state.metrics.rejection("invalid");
            return fail(format!("the offer: {e}"));
        }
    };
    let (live, answer) = match sessions::start(&state, set, offer).await {
        Ok(x) => x,
        Err(e) => return from_api(e),
    };
    let sessionid = state.sessions.alias(&live, six_digits);
    Json(json!({"sdp": answer, "type": "answer", "sessionid": sessionid, "session_id": live.id}))
}

/// `POST /human`: `{"sessionid", "text", "type": "echo" | "chat", "interrupt"}`. The interrupt is
/// done first; `echo` text is spoken (libespeak-ng) after what is queued; `chat` is an error
/// (no LLM).
pub async fn human(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Json<Value> {
    let (p, s) = match addressed(&state, body) {
        Ok(x) => x,
        Err(e) => return e,
    };
    if truthy(p.get("interrupt")) {
        if let Err(e) = sessions::interrupt(State(state.clone()), Path(s.id.clone())).await {
            return from_api(e);
        }
    }
    let text = p.get("text").and_then(Value::as_str).unwrap_or("").trim();
    match p.get("type").and_then(Value::as_str) {
        // Nothing to say: done (the interrupt, if asked for).
        Some("echo" | "chat") if text.is_empty() => ok(None),
        Some("echo") => {
            let request = sessions::SpeakRequest { text: text.to_string(), voice: None, words_per_minute: None };
            match sessions::speak_text(&s, request).await {
                Ok(_) => ok(None),
                Err(e) if e.code == "tts_unavailable" => fail(NO_TTS),
                Err(e) => from_api(e),
            }
        }
        Some("chat") => fail(NO_CHAT),
        Some(t) => fail(format!("type: echo (speak the text) or chat (answer it), not {t:?}")),
        None => fail("type: echo (speak the text) or chat (answer it)"),
    }
}

/// `POST /humanaudio`: multipart with `file` (a WAV; raw 16 kHz s16le when the part says
/// `audio/L16`) and `sessionid`: queued after the speech already queued.
pub async fn humanaudio(State(state): State<AppState>, form: Result<Multipart, MultipartRejection>) -> Json<Value> {
    let mut form = match form {
        Ok(f) => f,
        Err(e) => return fail(format!("send multipart/form-data with file and sessionid: {}", e.body_text())),
    };
    let (mut id, mut file) = (None, None);
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return fail(format!("the form: {}", e.body_text())),
        };
        let name = field.name().unwrap_or("").to_string();
        let kind = field.content_type().unwrap_or("").to_ascii_lowercase();
        let bytes = match field.bytes().await {
            Ok(b) => b,
            Err(e) => return fail(format!("the form's {name}: {}", e.body_text())),
        };
        match name.as_str() {
            "sessionid" => id = Some(Value::String(String::from_utf8_lossy(&bytes).into_owned())),
            "file" => file = Some((kind, bytes)),
            _ => {}
        }
    }
    let Some((kind, bytes)) = file else {
        return fail("file: the audio file is required (a WAV)");
    };
    let s = match session(&state, id.as_ref()) {
        Ok(s) => s,
        Err(e) => return e,
    };
    // A file is a WAV (whatever type the client guessed for it), unless it says raw PCM.
    let mut headers = HeaderMap::new();
    let raw = kind.starts_with("audio/l16");
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(if raw { "audio/L16" } else { "audio/wav" }));
    match sessions::audio(State(state.clone()), Path(s.id.clone()), headers, bytes).await {
        Ok(_) => ok(None),
        Err(e) => from_api(e),
    }
}

/// `POST /interrupt_talk`: `{"sessionid"}`; the speech not yet sent is dropped.
pub async fn interrupt_talk(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Json<Value> {
    let (_, s) = match addressed(&state, body) {
        Ok(x) => x,
        Err(e) => return e,
    };
    match sessions::interrupt(State(state.clone()), Path(s.id.clone())).await {
        Ok(_) => ok(None),
        Err(e) => from_api(e),
    }
}

/// `POST /is_speaking`: `{"sessionid"}`; `{"code": 0, "msg": "ok", "data": true | false}`.
pub async fn is_speaking(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Json<Value> {
    let (_, s) = match addressed(&state, body) {
        Ok(x) => x,
        Err(e) => return e,
    };
    match s.speaking() {
        Some(b) => ok(Some(json!(b))),
        None => fail(format!("session {} has ended", s.id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truth_is_pythons() {
        for v in [json!(true), json!(1), json!("yes"), json!("false"), json!([0]), json!({"a": 1})] {
            assert!(truthy(Some(&v)), "{v}");
        }
        for v in [json!(false), json!(0), json!(0.0), json!(""), json!([]), json!({}), Value::Null] {
            assert!(!truthy(Some(&v)), "{v}");
        }
        assert!(!truthy(None));
    }

    #[test]
    fn session_ids_are_six_digits() {
        for _ in 0..100 {
            let id = six_digits();
            assert_eq!(id.len(), 6, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_digit()) && !id.starts_with('0'), "{id}");
        }
    }
}
