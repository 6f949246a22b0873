//! LiveTalking-compatible routes (`/offer`, `/human`, `/humanaudio`, `/interrupt_talk`,
//! `/is_speaking`) with LiveTalking's request and answer shapes, against a WebRTC peer in this
//! process (`cadence_live::receiver`): the server renders the default avatar with the
//! cpu-reduced engines, the peer decodes its H.264 and Opus.

mod common;

use cadence_live::receiver::Receiver;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A LiveTalking route's JSON answer: always HTTP 200, as LiveTalking answers.
fn post_lt(s: &TestServer, path: &str, body: &Value) -> Value {
    let r = client().post(s.url(path)).json(body).send().unwrap();
    assert_eq!(r.status(), 200, "{path} {body}");
    r.json().unwrap()
}

/// `/humanaudio` as LiveTalking's page sends it: multipart, file and sessionid.
fn humanaudio(s: &TestServer, sessionid: &str, wav: Vec<u8>) -> Value {
    let form = reqwest::blocking::multipart::Form::new()
        .part("file", part(wav, "speech.wav", "audio/wav"))
        .text("sessionid", sessionid.to_string());
    let r = client().post(s.url("/humanaudio")).multipart(form).send().unwrap();
    assert_eq!(r.status(), 200);
    r.json().unwrap()
}

fn is_speaking(s: &TestServer, sessionid: &str) -> bool {
    let v = post_lt(s, "/is_speaking", &json!({"sessionid": sessionid}));
    assert_eq!((&v["code"], &v["msg"]), (&json!(0), &json!("ok")), "{v}");
    v["data"].as_bool().unwrap_or_else(|| panic!("data is not a bool: {v}"))
}

fn assert_ok(v: &Value) {
    assert_eq!(v, &json!({"code": 0, "msg": "ok"}));
}

/// A LiveTalking error, `{"code": -1, "msg"}`: its message.
fn lt_error(v: &Value) -> String {
    assert_eq!(v["code"], -1, "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    let m = v["msg"].as_str().unwrap_or_else(|| panic!("no msg: {v}"));
    assert!(!m.is_empty());
    m.to_string()
}

/// The peer runs until `heard` loud 20 ms packets arrived after packet `mark`.
fn hear(peer: &mut Receiver, mark: usize, heard: usize, within: Duration) {
    let t = Instant::now();
    while peer.speech[mark..].iter().filter(|p| p.rms > 0.02).nth(heard).is_none() {
        assert!(t.elapsed() < within, "the speech was not heard within {within:?}");
        peer.run_for(Duration::from_millis(20)).unwrap();
    }
}

/// Runs the peer until `ok` holds.
fn run_until(peer: &mut Receiver, within: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < within, "condition not met within {within:?}");
        peer.run_for(Duration::from_millis(50)).unwrap();
    }
}

#[test]
fn livetalking_clients_offer_send_audio_ask_whether_it_speaks_and_interrupt() {
    let _lock = render_lock();
    let s = start(&["--max-sessions", "1", "--session-idle-seconds", "60"]);

    // /offer as LiveTalking's client.js sends it: the answer in LiveTalking's shape.
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let v = post_lt(&s, "/offer", &json!({"sdp": offer, "type": "offer"}));
    assert_eq!(v["type"], "answer", "{v}");
    let sid = v["sessionid"].as_str().unwrap_or_else(|| panic!("sessionid is not a string: {v}")).to_string();
    assert!(sid.len() == 6 && sid.bytes().all(|b| b.is_ascii_digit()), "{sid}");
    peer.accept(v["sdp"].as_str().unwrap()).unwrap();
    let cadence_id = v["session_id"].as_str().unwrap().to_string();
    assert_eq!(get(&s, &format!("/v1/sessions/{cadence_id}")).status(), 200);

    // Idle: frames arrive, silence, not speaking.
    peer.run_for(Duration::from_secs(4)).unwrap();
    assert!(peer.connected);
    assert!(peer.frames.len() >= 25, "{} frames in 4 s (2 s of them the session's delay)", peer.frames.len());
    assert_eq!(peer.undecodable, 0);
    assert!(peer.speech.iter().all(|p| p.rms < 0.01), "silence while idle");
    assert!(!is_speaking(&s, &sid));

    // One session at most: the second offer is refused in LiveTalking's shape.
    let (_other, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let m = lt_error(&post_lt(&s, "/offer", &json!({"sdp": offer, "type": "offer"})));
    assert!(m.contains("--max-sessions"), "{m}");

    // /humanaudio: speaking while it plays, heard at the peer, not speaking after.
    let mark = peer.speech.len();
    assert_ok(&humanaudio(&s, &sid, speech_clip(2.0)));
    assert!(is_speaking(&s, &sid), "speaking once the audio is queued");
    hear(&mut peer, mark, 10, Duration::from_secs(5));
    assert!(is_speaking(&s, &sid), "speaking while the speech is heard");
    run_until(&mut peer, Duration::from_secs(5), || !is_speaking(&s, &sid));
    peer.run_for(Duration::from_millis(500)).unwrap();
    let loud = peer.speech[mark..].iter().filter(|p| p.rms > 0.02).count();
    assert!(loud >= 40, "{loud} loud packets of 20 ms");

    // /interrupt_talk, with the sessionid an integer (as older LiveTalking pages send it).
    let mark = peer.speech.len();
    assert_ok(&humanaudio(&s, &sid, speech_clip(4.0)));
    hear(&mut peer, mark, 25, Duration::from_secs(6));
    assert_ok(&post_lt(&s, "/interrupt_talk", &json!({"sessionid": sid.parse::<u64>().unwrap()})));
    let interrupted = Instant::now();
    assert!(!is_speaking(&s, &sid), "not speaking after the interrupt");
    peer.run_for(Duration::from_secs(2)).unwrap();
    let late = peer.speech.iter().filter(|p| p.rms > 0.02 && p.at > interrupted + Duration::from_millis(100)).count();
    assert_eq!(late, 0, "speech after /interrupt_talk");

    // /human: interrupt: true interrupts (LiveTalking's pages send it with every text; with
    // nothing to say, that is all it does).
    let mark = peer.speech.len();
    assert_ok(&humanaudio(&s, &sid, speech_clip(4.0)));
    hear(&mut peer, mark, 25, Duration::from_secs(6));
    let v = post_lt(&s, "/human", &json!({"text": "", "type": "echo", "interrupt": true, "sessionid": sid}));
    let interrupted = Instant::now();
    assert_ok(&v);
    assert!(!is_speaking(&s, &sid), "/human's interrupt");
    peer.run_for(Duration::from_secs(2)).unwrap();
    let late = peer.speech.iter().filter(|p| p.rms > 0.02 && p.at > interrupted + Duration::from_millis(100)).count();
    assert_eq!(late, 0, "speech after /human's interrupt");
    let m = lt_error(&post_lt(&s, "/human", &json!({"text": "hello", "type": "chat", "sessionid": sid})));
    assert!(m.contains("chat is not available"), "{m}");
    // Text to echo is spoken where libespeak-ng loads (tests/espeak_ng.rs); else it says why.
    if !cadence::schedules::espeak::available() {
        let m = lt_error(&post_lt(&s, "/human", &json!({"text": "hello", "type": "echo", "sessionid": sid})));
        assert!(m.contains("text-to-speech is not available") && m.contains("/humanaudio"), "{m}");
    }

    // The session's audio must be audio; cadence's own session id names it too.
    let m = lt_error(&humanaudio(&s, &sid, b"RIFF....WAVEjunk".to_vec()));
    assert!(m.starts_with("audio:"), "{m}");
    assert!(!is_speaking(&s, &cadence_id));
    let v: Value = get(&s, &format!("/v1/sessions/{cadence_id}")).json().unwrap();
    assert_eq!(v["state"], "connected", "{v}");
    assert_eq!(v["interrupts"], 2, "{v}");
}

#[test]
fn livetalking_errors_are_livetalking_shaped() {
    let s = start(&[]);
    // Unknown sessions, as a string or an integer, on every route.
    for id in [json!("123456"), json!(123456), json!(""), json!(null)] {
        for path in ["/is_speaking", "/interrupt_talk", "/human"] {
            let v = post_lt(&s, path, &json!({"sessionid": id, "type": "echo", "text": "hi"}));
            assert_eq!(lt_error(&v), "session not found", "{path} {id}");
        }
    }
    assert_eq!(lt_error(&humanaudio(&s, "123456", speech_clip(0.5))), "session not found");
    assert_eq!(lt_error(&post_lt(&s, "/is_speaking", &json!({}))), "session not found");

    // Malformed bodies.
    for path in ["/offer", "/human", "/interrupt_talk", "/is_speaking"] {
        let r = client().post(s.url(path)).header("content-type", "application/json").body("{").send().unwrap();
        assert_eq!(r.status(), 200);
        assert!(lt_error(&r.json().unwrap()).contains("not JSON"), "{path}");
    }
    let form = reqwest::blocking::multipart::Form::new().text("sessionid", "123456");
    let r = client().post(s.url("/humanaudio")).multipart(form).send().unwrap();
    assert!(lt_error(&r.json().unwrap()).contains("file"));
    let r = client().post(s.url("/humanaudio")).json(&json!({"sessionid": "123456"})).send().unwrap();
    assert!(lt_error(&r.json().unwrap()).contains("multipart"));

    // Offers that start no session.
    let (_peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    for body in [
        json!({"sdp": "v=0 not an offer", "type": "offer"}),
        json!({"type": "offer"}),
        json!({"sdp": offer, "type": "answer"}),
        json!({"sdp": offer, "type": "offer", "avatar": "wav2lip256_avatar1"}),
        json!({"sdp": offer, "type": "offer", "stride": 0}),
    ] {
        lt_error(&post_lt(&s, "/offer", &body));
    }
    assert_eq!(metric(&s, "cadence_sessions"), 0.0, "no session was left behind");

    // With --token, these routes take it too (LiveTalking's pages send none).
    let t = start(&["--token", "s3cret"]);
    let r = client().post(t.url("/is_speaking")).json(&json!({"sessionid": "1"})).send().unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(error_code(r), "unauthorized");
    let r = client().post(t.url("/is_speaking")).bearer_auth("s3cret").json(&json!({"sessionid": "1"})).send().unwrap();
    assert_eq!(lt_error(&r.json().unwrap()), "session not found");
}
