//! Text spoken into a live session through libespeak-ng: `POST /v1/sessions/{id}/speak` and
//! LiveTalking's `/human` with `type: "echo"`, heard by a WebRTC peer in this process
//! (`cadence_live::receiver`). These tests need the library (Debian package libespeak-ng1), so
//! they are ignored by default; `.ci/run` installs it and runs them with the rest of the group:
//! `cargo test --release --workspace --test espeak_ng -- --ignored`. Without it, `/speak`
//! answers 501 (tests/sessions.rs).

mod common;

use cadence::schedules::espeak;
use cadence_live::receiver::Receiver;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NEEDS: &str = "needs libespeak-ng (apt-get install libespeak-ng1); run with --ignored";

/// A peer and its session: (peer, session id, the session's delay in seconds).
fn connect(s: &TestServer) -> (Receiver, String, f64) {
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let r = client().post(s.url("/v1/sessions")).json(&json!({"sdp": offer, "type": "offer"})).send().unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().unwrap();
    peer.accept(v["sdp"].as_str().unwrap()).unwrap();
    (peer, v["session_id"].as_str().unwrap().to_string(), v["delay_ms"].as_f64().unwrap() / 1e3)
}

/// Seconds of loud 20 ms packets the peer received after packet `mark`.
fn loud_seconds(peer: &Receiver, mark: usize) -> f64 {
    peer.speech[mark..].iter().filter(|p| p.rms > 0.02).count() as f64 * 0.02
}

#[test]
#[ignore = "needs libespeak-ng (apt-get install libespeak-ng1)"]
fn text_sent_to_a_session_is_spoken_and_its_peer_hears_it() {
    assert!(espeak::available(), "{NEEDS}");
    let _lock = render_lock();
    let s = start(&["--session-idle-seconds", "60"]);
    let (mut peer, id, delay) = connect(&s);
    peer.run_for(Duration::from_secs(3)).unwrap();
    assert!(peer.connected && !peer.frames.is_empty());
    assert_eq!(loud_seconds(&peer, 0), 0.0, "silence while idle");

    // /speak: the speech is espeak-ng's, resampled to 16 kHz, queued as /audio queues.
    let text = "Bob may pay five big bills.";
    let made = espeak::speak(text, espeak::DEFAULT_VOICE, espeak::DEFAULT_RATE_WPM).unwrap();
    let mark = peer.speech.len();
    let sent = Instant::now();
    let r = client().post(s.url(&format!("/v1/sessions/{id}/speak"))).json(&json!({"text": text})).send().unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().unwrap();
    let duration = v["duration_s"].as_f64().unwrap();
    assert!((duration - made.duration_s()).abs() < 1e-3, "{v}: espeak-ng made {} s", made.duration_s());
    assert!(v["queued_audio_s"].as_f64().unwrap() > 0.0, "{v}");
    peer.run_for(Duration::from_secs_f64(delay + duration + 1.0)).unwrap();
    let heard = loud_seconds(&peer, mark);
    // Speech has its pauses and quiet consonants: most of it, not all, is loud.
    assert!(heard > 0.5 * duration && heard <= duration + 0.1, "{heard:.2} s loud of {duration:.2} s");
    let first = peer.speech[mark..].iter().find(|p| p.rms > 0.02).unwrap().at;
    assert!((first - sent).as_secs_f64() <= delay + 1.0, "first speech {:?} after the request", first - sent);

    // What espeak-ng cannot do is the request's fault.
    let r = client()
        .post(s.url(&format!("/v1/sessions/{id}/speak")))
        .json(&json!({"text": "hi", "voice": "no-such-voice"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(error_code(r), "invalid_voice");

    // LiveTalking's /human with type echo speaks too (cadence's session id names the session).
    let mark = peer.speech.len();
    let r = client()
        .post(s.url("/human"))
        .json(&json!({"sessionid": id, "type": "echo", "text": "Mary sells sea shells.", "interrupt": true}))
        .send()
        .unwrap();
    assert_eq!(r.json::<Value>().unwrap(), json!({"code": 0, "msg": "ok"}));
    peer.run_for(Duration::from_secs_f64(delay + 3.0)).unwrap();
    let heard = loud_seconds(&peer, mark);
    assert!(heard > 0.5, "{heard:.2} s loud after /human");
    let v: Value = get(&s, &format!("/v1/sessions/{id}")).json().unwrap();
    assert_eq!(v["state"], "connected", "{v}");
}
