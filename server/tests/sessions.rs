//! Live WebRTC sessions (`/v1/sessions`) against a WebRTC peer in this process
//! (`cadence_live::receiver`, str0m over loopback UDP): the server renders the default avatar
//! with the cpu-reduced engines, the peer decodes its H.264 and Opus.

mod common;

use cadence_live::receiver::Receiver;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn post_json(s: &TestServer, path: &str, body: &Value) -> reqwest::blocking::Response {
    client().post(s.url(path)).json(body).send().unwrap()
}

fn post_audio(s: &TestServer, id: &str, wav: Vec<u8>) -> reqwest::blocking::Response {
    client()
        .post(s.url(&format!("/v1/sessions/{id}/audio")))
        .header("content-type", "audio/wav")
        .body(wav)
        .send()
        .unwrap()
}

/// A peer and its session: (peer, session id, the session's JSON).
fn connect(s: &TestServer) -> (Receiver, String, Value) {
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let r = post_json(s, "/v1/sessions", &json!({"sdp": offer, "type": "offer"}));
    assert_eq!(r.status(), 201);
    let v: Value = r.json().unwrap();
    assert_eq!(v["type"], "answer");
    peer.accept(v["sdp"].as_str().unwrap()).unwrap();
    (peer, v["session_id"].as_str().unwrap().to_string(), v)
}

#[test]
fn a_session_streams_the_idle_avatar_speaks_what_it_is_sent_and_stops_when_interrupted() {
    let _lock = render_lock();
    let s = start(&["--max-sessions", "1", "--session-idle-seconds", "60"]);
    let (mut peer, id, created) = connect(&s);
    assert_eq!((created["stride"].as_u64(), created["infill"].as_str()), (Some(8), Some("image")));
    // Digital silence: the lookahead is the 4-frame ramp (it covers whisper's 3 frames), the
    // part one stride; then the default margin of 420 ms.
    let figures: Value = get(&s, &format!("/v1/sessions/{id}")).json().unwrap();
    assert_eq!(figures["vad"], "digital");
    assert!((created["delay_ms"].as_f64().unwrap() - ((8 + 1 + 4) as f64 * 40.0 + 420.0)).abs() < 1e-6);
    let (w, h) = (created["width"].as_u64().unwrap() as usize, created["height"].as_u64().unwrap() as usize);

    // Idle: frames of the avatar at rest, and silence.
    peer.run_for(Duration::from_secs(4)).unwrap();
    assert!(peer.connected);
    assert!(peer.frames.len() >= 25, "{} frames in 4 s (2 s of them the session's delay)", peer.frames.len());
    assert_eq!(peer.size, Some((w, h)), "the avatar's size");
    assert_eq!(peer.undecodable, 0);
    assert!(peer.speech.iter().all(|p| p.rms < 0.01), "silence while idle");
    assert_eq!(metric(&s, "cadence_sessions"), 1.0);
    let idle: Value = get(&s, &format!("/v1/sessions/{id}")).json().unwrap();
    assert_eq!(idle["repeated_frames"], 0, "an idle session keeps up: {idle}");

    // A second session is refused while the first runs.
    let (_other, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let r = post_json(&s, "/v1/sessions", &json!({"sdp": offer}));
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(error_code(r), "session_limit");

    // Speech: 2 s of the clip, heard at the peer after the session's delay.
    let sent = Instant::now();
    let r = post_audio(&s, &id, speech_clip(2.0));
    assert_eq!(r.status(), 200);
    let v: Value = r.json().unwrap();
    assert!((v["duration_s"].as_f64().unwrap() - 2.0).abs() < 0.01, "{v}");
    let heard_before = peer.speech.len();
    peer.run_for(Duration::from_secs(4)).unwrap();
    let loud: Vec<_> = peer.speech[heard_before..].iter().filter(|p| p.rms > 0.02).collect();
    assert!(loud.len() >= 40, "{} loud packets of 20 ms", loud.len());
    let delay = (loud[0].at - sent).as_secs_f64();
    let stated = created["delay_ms"].as_f64().unwrap() / 1e3;
    assert!(delay <= stated + 0.5, "first speech after {delay:.2} s (the session's delay: {stated:.2} s)");

    // Interrupt 1 s into 4 s of speech: no speech arrives later than 100 ms after it.
    assert_eq!(post_audio(&s, &id, speech_clip(4.0)).status(), 200);
    let mark = peer.speech.len();
    let t = Instant::now();
    while peer.speech[mark..].iter().filter(|p| p.rms > 0.02).nth(25).is_none() {
        assert!(t.elapsed() < Duration::from_secs(6), "the second utterance was not heard");
        peer.run_for(Duration::from_millis(20)).unwrap();
    }
    let r = client().post(s.url(&format!("/v1/sessions/{id}/interrupt"))).send().unwrap();
    let interrupted = Instant::now();
    assert_eq!(r.status(), 200);
    let dropped = r.json::<Value>().unwrap()["dropped_audio_s"].as_f64().unwrap();
    assert!(dropped > 1.5, "dropped {dropped} s");
    peer.run_for(Duration::from_secs(2)).unwrap();
    let late = peer.speech.iter().filter(|p| p.rms > 0.02 && p.at > interrupted + Duration::from_millis(100)).count();
    assert_eq!(late, 0, "speech after the interrupt");
    let v: Value = get(&s, &format!("/v1/sessions/{id}")).json().unwrap();
    assert_eq!(v["state"], "connected");
    assert_eq!(v["speaking"], false);
    assert!(v["frames_sent"].as_u64().unwrap() >= 150, "{v}");
    // The picture eased to rest from the next frame on, in place of the frames rendered with
    // the speech that was cut.
    assert_eq!(v["interrupts"], 1, "{v}");
    assert!(v["interrupt_latency_ms"].as_f64().unwrap() <= 80.0, "{v}");
    assert!(v["discarded_frames"].as_u64().unwrap() > 0, "{v}");

    // Deleted: gone, and the slot is free again.
    assert_eq!(client().delete(s.url(&format!("/v1/sessions/{id}"))).send().unwrap().status(), 204);
    assert_eq!(get(&s, &format!("/v1/sessions/{id}")).status(), 404);
    wait_for(Duration::from_secs(5), || metric(&s, "cadence_sessions") == 0.0);
    let (_again, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    assert_eq!(post_json(&s, "/v1/sessions", &json!({"sdp": offer})).status(), 201);
}

#[test]
fn an_auto_stride_session_chooses_its_stride_while_it_speaks() {
    let _lock = render_lock();
    let s = start(&[]);
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let r = post_json(&s, "/v1/sessions", &json!({"sdp": offer, "stride": "auto"}));
    assert_eq!(r.status(), 201);
    let created: Value = r.json().unwrap();
    peer.accept(created["sdp"].as_str().unwrap()).unwrap();
    let id = created["session_id"].as_str().unwrap();
    // It starts at the safe end, with the parts (and so the delay) of the default stride.
    assert_eq!((created["stride"].as_u64(), created["stride_mode"].as_str()), (Some(12), Some("auto")));
    let fixed: Value = get(&s, &format!("/v1/sessions/{id}")).json().unwrap();
    assert_eq!(fixed["stride_changes"], 0, "no speech yet, nothing measured: {fixed}");

    // 6 s of speech: its parts measure the UNet and the decoder; the governor may lower the
    // stride (how far depends on the machine: the unit tests pin the rule), and the session
    // keeps streaming whatever it chooses.
    assert_eq!(post_audio(&s, id, speech_clip(6.0)).status(), 200);
    let delay = created["delay_ms"].as_f64().unwrap() / 1e3;
    peer.run_for(Duration::from_secs_f64(delay + 7.0)).unwrap();
    let v: Value = get(&s, &format!("/v1/sessions/{id}")).json().unwrap();
    assert_eq!(v["stride_mode"], "auto");
    let k = v["stride"].as_u64().unwrap();
    assert!([1, 2, 3, 4, 6, 12].contains(&k), "stride {k} does not divide the parts of 12 frames");
    // 7 s after the delay: 175 frames were due (a second's slack for a slow machine's start).
    assert!(v["frames_sent"].as_u64().unwrap() >= 25 * 6, "{v}");
    assert_eq!(peer.undecodable, 0);
    let loud = peer.speech.iter().filter(|p| p.rms > 0.02).count();
    assert!(loud >= 100, "{loud} loud packets of 20 ms: the speech was not heard");
}

#[test]
fn a_peer_that_leaves_ends_its_session() {
    let _lock = render_lock();
    let s = start(&["--session-peer-timeout-seconds", "1"]);
    let (mut peer, id, created) = connect(&s);
    // Frames start after the session's delay.
    let delay = created["delay_ms"].as_f64().unwrap() / 1e3;
    peer.run_for(Duration::from_secs_f64(delay + 1.0)).unwrap();
    assert!(peer.connected && !peer.frames.is_empty());
    drop(peer);
    wait_for(Duration::from_secs(10), || get(&s, &format!("/v1/sessions/{id}")).status() == 404);
    assert_eq!(metric(&s, "cadence_sessions"), 0.0);
}

#[test]
fn bad_session_requests_say_why() {
    let s = start(&[]);
    let (_peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let cases = [
        (json!({"sdp": "v=0 not an offer"}), 422, "invalid_offer"),
        (json!({"sdp": offer, "stride": 0}), 422, "invalid_stride"),
        (json!({"sdp": offer, "stride": "fast"}), 422, "invalid_stride"),
        (json!({"sdp": offer, "decoder": "vqgan"}), 422, "invalid_decoder"),
        (json!({"sdp": offer, "type": "answer"}), 422, "invalid_sdp_type"),
        (json!({"sdp": offer, "avatar_id": "0".repeat(64)}), 404, "avatar_not_found"),
    ];
    for (body, status, code) in cases {
        let r = post_json(&s, "/v1/sessions", &body);
        assert_eq!(r.status(), status, "{body}");
        assert_eq!(error_code(r), code, "{body}");
    }
    // Unknown fields and non-JSON bodies are refused too.
    assert_eq!(error_code(post_json(&s, "/v1/sessions", &json!({"sdp": offer, "strid": 3}))), "invalid_field");
    let r = client().post(s.url("/v1/sessions")).body("x").send().unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(error_code(r), "unsupported_media_type");
    let r = client().post(s.url("/v1/sessions")).header("content-type", "application/json").body("{").send().unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(metric(&s, "cadence_sessions"), 0.0, "no session was left behind");

    let none = "/v1/sessions/s-nope";
    assert_eq!(get(&s, none).status(), 404);
    assert_eq!(post_audio(&s, "s-nope", speech_clip(0.5)).status(), 404);

    // With a session: its audio must be audio; speak is not in this build.
    let (_peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let v: Value = post_json(&s, "/v1/sessions", &json!({"sdp": offer})).json().unwrap();
    let id = v["session_id"].as_str().unwrap();
    let r = post_audio(&s, id, b"RIFF....WAVEjunk".to_vec());
    assert_eq!(r.status(), 422);
    assert_eq!(error_code(r), "invalid_audio");
    assert_eq!(error_code(post_audio(&s, id, Vec::new())), "empty_audio");
    // Text is spoken where libespeak-ng loads (tests/espeak_ng.rs), else 501; what cannot be
    // spoken is refused either way.
    let speak = s.url(&format!("/v1/sessions/{id}/speak"));
    let r = client().post(&speak).body("hello").send().unwrap();
    if cadence::schedules::espeak::available() {
        assert_eq!(r.status(), 200);
    } else {
        assert_eq!(r.status(), 501);
        assert_eq!(error_code(r), "tts_unavailable");
    }
    for (body, code) in [
        (json!({"text": " "}), "empty_text"),
        (json!({"text": "x".repeat(2001)}), "text_too_long"),
        (json!({"text": "hi", "words_per_minute": 20}), "invalid_rate"),
        (json!({"txt": "hi"}), "invalid_field"),
    ] {
        let r = client().post(&speak).json(&body).send().unwrap();
        assert_eq!(r.status(), 422, "{body}");
        assert_eq!(error_code(r), code, "{body}");
    }
    let r = client()
        .post(s.url(&format!("/v1/sessions/{id}/audio")))
        .header("content-type", "audio/L16")
        .body(vec![0u8; 3])
        .send()
        .unwrap();
    assert_eq!(r.status(), 422, "an odd number of bytes");
    let r = client()
        .post(s.url(&format!("/v1/sessions/{id}/audio")))
        .header("content-type", "audio/L16")
        .body(vec![0u8; 3200])
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "0.1 s of raw PCM");
}

#[test]
fn offers_at_the_same_instant_start_no_more_sessions_than_allowed() {
    let _lock = render_lock();
    let s = start(&["--max-sessions", "1"]);
    let offers: Vec<(Receiver, String)> = (0..3).map(|_| Receiver::offer([127, 0, 0, 1].into()).unwrap()).collect();
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = offers
            .iter()
            .map(|(_, offer)| {
                let s = &s;
                scope.spawn(move || post_json(s, "/v1/sessions", &json!({"sdp": offer})).status().as_u16())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(sorted, vec![201, 429, 429], "{statuses:?}");
    assert_eq!(metric(&s, "cadence_sessions"), 1.0);
}

#[test]
fn no_free_udp_port_is_a_503_not_the_offers_fault() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let range = format!("{port}-{port}");
    let s = start(&["--webrtc-ports", &range]);
    let (_peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let r = post_json(&s, "/v1/sessions", &json!({"sdp": offer}));
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(error_code(r), "no_port");
    assert_eq!(metric(&s, "cadence_sessions"), 0.0);
    // The place it held is free again: with the port back, a session starts.
    drop(taken);
    let (_peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    assert_eq!(post_json(&s, "/v1/sessions", &json!({"sdp": offer})).status(), 201);
}
