//! A session against a WebRTC peer made with str0m in this test, over UDP on the loopback: the
//! peer offers to receive video and audio, the session answers, ICE and DTLS connect, and the
//! peer decodes what arrives (H.264 with OpenH264's decoder, Opus with opus-rs's).
//!
//! The frames come from a synthetic render (a frame number written into the picture), so that
//! what is tested is the wire: pacing, decodability, keyframes on request, speech at its time,
//! an interrupt that silences the speech at once, and a peer that leaves.

use cadence_live::receiver::Receiver;
use cadence_live::{FrameSender, NetConfig, Session, StartError, Timeline, WireConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const W: usize = 64;
const H: usize = 48;
const FPS: f64 = 25.0;

/// A frame whose luma holds `f` (so a decoded frame tells which it was).
fn synthetic_frame(f: usize) -> Vec<u8> {
    let mut frame = vec![16 + ((f * 7) % 200) as u8; W * H];
    frame.resize(W * H * 3 / 2, 128);
    frame
}

/// A render as fast as can be: frames 0, 1, 2, ... until asked to stop or the session ends.
fn synthetic_render(_t: Arc<Timeline>, frames: FrameSender, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let mut f = 0;
    while !stop.load(Ordering::Relaxed) {
        if frames.send(f, synthetic_frame(f)).is_err() {
            break;
        }
        f += 1;
    }
    Ok(())
}

fn config() -> WireConfig {
    WireConfig {
        fps: FPS,
        width: W,
        height: H,
        delay: Duration::from_millis(200),
        video_bitrate_bps: 200_000,
        speech_bitrate_bps: 24_000,
        peer_timeout: Duration::from_secs(2),
        ramp: 4,
    }
}

fn loopback() -> NetConfig {
    NetConfig { bind: "127.0.0.1".parse().unwrap(), public_ip: None, ports: None }
}

fn tone(seconds: f64) -> Vec<i16> {
    (0..(seconds * 16_000.0) as usize)
        .map(|i| (0.3 * 32767.0 * (2.0 * std::f64::consts::PI * 300.0 * i as f64 / 16_000.0).sin()) as i16)
        .collect()
}

#[test]
fn a_peer_receives_decodable_video_at_its_rate_speech_at_its_time_and_an_interrupt_silences_it() {
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let (session, answer) = Session::start(&offer, &loopback(), config(), 4, 10.0, Box::new(synthetic_render)).unwrap();
    peer.accept(&answer).unwrap();

    // Connect and stream silence.
    peer.run_for(Duration::from_millis(1500)).unwrap();
    assert!(peer.connected, "ICE and DTLS connect");
    let s = session.stats();
    assert!(s.wire.connected);
    assert!(!peer.frames.is_empty(), "frames arrive: {s:?}");
    assert!(peer.frames[0].keyframe, "the first frame decoded is a keyframe");
    assert!(peer.speech.iter().all(|p| p.rms < 0.01), "silence before any speech");

    // Ask for a keyframe: one arrives.
    let before = peer.frames.len();
    peer.request_keyframe().unwrap();
    peer.run_for(Duration::from_millis(400)).unwrap();
    assert!(peer.frames[before..].iter().any(|f| f.keyframe), "a keyframe after the request");
    assert!(session.stats().wire.keyframe_requests >= 1);

    // Speak 1.5 s; interrupt after 0.6 s of it on the wire.
    let (at, _) = session.speak(&tone(1.5)).unwrap();
    let spoke = Instant::now();
    assert!(session.stats().queued_audio_s > 1.0);
    // The speech reaches the wire after the wire's delay.
    peer.run_for(config().delay + Duration::from_millis(600)).unwrap();
    let interrupted = Instant::now();
    let dropped = session.interrupt();
    assert!(dropped > 0.5 && dropped < 1.0, "dropped {dropped} s");
    peer.run_for(Duration::from_millis(600)).unwrap();

    let loud: Vec<_> = peer.speech.iter().filter(|p| p.rms > 0.05).collect();
    assert!(!loud.is_empty(), "the speech was heard");
    let first_loud = loud[0];
    assert!(first_loud.at >= spoke, "no speech before it was sent");
    // The speech plays for as long as it was sent before the interrupt: 0.6 s of packets,
    // give or take the interrupt's timing (20 ms packets).
    let heard = loud.len() as f64 * 0.02;
    assert!((0.4..=0.9).contains(&heard), "{heard:.2} s of speech heard");
    assert!(at > 0.0);
    // Nothing loud arrives later than 60 ms after the interrupt (3 packets: in flight and the
    // codec's own tail).
    let late: Vec<_> = loud.iter().filter(|p| p.at > interrupted + Duration::from_millis(60)).collect();
    assert!(late.is_empty(), "{} loud packets after the interrupt", late.len());
    assert!(!session.stats().speaking);

    // Pacing: frames arrive every 40 ms, with no gap over 80 ms; none repeated (the render
    // keeps ahead), none undecodable.
    let max_gap = peer.max_frame_gap_ms();
    assert!(max_gap <= 80.0, "a gap of {max_gap:.1} ms between frames");
    let stats = session.stats();
    assert_eq!(peer.undecodable, 0);
    assert_eq!(stats.wire.repeated_frames, 0, "{stats:?}");
    // The wire's own figure: frames' packets leaving its socket 40 ms apart, none over 80.
    let wire_gap = stats.wire.max_frame_gap_ms;
    assert!((35.0..=80.0).contains(&wire_gap), "the wire's largest gap: {wire_gap:.1} ms");
    let seconds = (peer.frames.last().unwrap().at - peer.frames[0].at).as_secs_f64();
    let rate = (peer.frames.len() - 1) as f64 / seconds;
    assert!((rate - FPS).abs() < 1.5, "{rate:.2} frames per second");

    let closed = session.close().unwrap();
    assert!(closed.wire.closed.is_some());
}

#[test]
fn a_slow_render_is_covered_by_repeated_frames_and_the_stream_never_stops() {
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let slow = |_t: Arc<Timeline>, frames: FrameSender, stop: Arc<AtomicBool>| -> anyhow::Result<()> {
        // Half the wire's rate.
        let mut f = 0;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(80));
            if frames.send(f, synthetic_frame(f)).is_err() {
                break;
            }
            f += 2;
        }
        Ok(())
    };
    let (session, answer) = Session::start(&offer, &loopback(), config(), 4, 10.0, Box::new(slow)).unwrap();
    peer.accept(&answer).unwrap();
    peer.run_for(Duration::from_millis(2000)).unwrap();
    let stats = session.stats();
    assert!(stats.wire.repeated_frames >= 10, "{stats:?}");
    let max_gap = peer.max_frame_gap_ms();
    assert!(max_gap <= 80.0, "a gap of {max_gap:.1} ms between frames");
}

#[test]
fn a_peer_that_goes_away_ends_the_session() {
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let mut cfg = config();
    cfg.peer_timeout = Duration::from_millis(700);
    let (session, answer) = Session::start(&offer, &loopback(), cfg, 4, 10.0, Box::new(synthetic_render)).unwrap();
    peer.accept(&answer).unwrap();
    peer.run_for(Duration::from_millis(800)).unwrap();
    assert!(session.stats().wire.connected);
    drop(peer); // no close: the peer's machine is gone
    let t = Instant::now();
    while !session.ended() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(session.ended(), "the session ended");
    let stats = session.stats();
    assert!(stats.wire.closed.as_deref().is_some_and(|r| r.contains("nothing heard")), "{stats:?}");
    assert!(session.speak(&[0; 10]).is_err(), "nothing can be queued to an ended session");
}

#[test]
fn an_offer_that_is_not_sdp_is_refused() {
    let err = Session::start("hello", &loopback(), config(), 4, 10.0, Box::new(synthetic_render)).err().unwrap();
    assert!(matches!(err, StartError::Offer(_)), "{err:?}");
    assert!(err.to_string().contains("SDP"), "{err}");
}

#[test]
fn a_port_range_with_no_free_port_is_told_apart_from_a_bad_offer() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (_peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let net = NetConfig { ports: Some((port, port)), ..loopback() };
    let err = Session::start(&offer, &net, config(), 4, 10.0, Box::new(synthetic_render)).err().unwrap();
    assert!(matches!(err, StartError::NoPort(_)), "{err:?}");
    assert!(err.to_string().contains(&format!("no free UDP port in {port}-{port}")), "{err}");
}

#[test]
fn a_render_that_fails_says_why_in_the_figures_and_at_close() {
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let failing = |_t: Arc<Timeline>, _f: FrameSender, _s: Arc<AtomicBool>| -> anyhow::Result<()> {
        anyhow::bail!("the engines are gone")
    };
    let (session, answer) = Session::start(&offer, &loopback(), config(), 4, 10.0, Box::new(failing)).unwrap();
    peer.accept(&answer).unwrap();
    peer.run_for(Duration::from_millis(300)).unwrap();
    let stats = session.stats();
    assert_eq!(stats.render_error.as_deref(), Some("the engines are gone"), "{stats:?}");
    assert!(session.speak(&[0; 10]).is_err(), "the render's end closes the timeline");
    let err = session.close().unwrap_err();
    assert!(format!("{err:#}").contains("the engines are gone"), "{err:#}");
}

/// A render that follows the audio at the clock, as the real one does (without its lookahead):
/// frame f is bright (luma 200) where its 40 ms of audio hold speech, dark (50, the rest state)
/// where they are silent.
fn audio_following_render(t: Arc<Timeline>, frames: FrameSender, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let wav = cadence_media::wav::WavReader::new(cadence_live::TimelineReader::new(t), None)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut stream = cadence_media::AudioStream::new(wav, "timeline")?;
    let (mut mono, mut track) = (Vec::new(), Vec::new());
    let mut f = 0;
    while !stop.load(Ordering::Relaxed) {
        while mono.len() < (f + 1) * 640 {
            if !stream.read(160, &mut mono, &mut track)? {
                return Ok(());
            }
        }
        let speech = mono[f * 640..(f + 1) * 640].iter().any(|v| v.abs() > 1e-3);
        let mut frame = vec![if speech { 200 } else { 50 }; W * H];
        frame.resize(W * H * 3 / 2, 128);
        if frames.send(f, frame).is_err() {
            break;
        }
        f += 1;
    }
    Ok(())
}

#[test]
fn an_interrupt_eases_the_picture_to_rest_within_two_frames() {
    let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into()).unwrap();
    let (session, answer) =
        Session::start(&offer, &loopback(), config(), 4, 10.0, Box::new(audio_following_render)).unwrap();
    peer.accept(&answer).unwrap();
    peer.run_for(Duration::from_millis(1000)).unwrap();
    assert!(peer.frames.iter().all(|f| (f.mean_luma - 50.0).abs() < 4.0), "rest while idle");

    session.speak(&tone(3.0)).unwrap();
    // Speaking: bright frames arrive.
    let t = Instant::now();
    while !peer.frames.iter().rev().take(5).all(|f| f.mean_luma > 190.0) {
        assert!(t.elapsed() < Duration::from_secs(3), "no speech frames");
        peer.run_for(Duration::from_millis(20)).unwrap();
    }
    peer.run_for(Duration::from_millis(300)).unwrap();
    let asked = Instant::now();
    assert!(session.interrupt() > 1.0);
    let mark = peer.frames.len();
    peer.run_for(Duration::from_millis(1500)).unwrap();
    let after = &peer.frames[mark..];
    // The first frame darker than speech arrives within two frame periods of the request...
    let first = after.iter().find(|f| f.mean_luma < 195.0).expect("an eased frame");
    let latency = (first.at - asked).as_secs_f64() * 1e3;
    assert!(latency <= 80.0, "the first eased frame arrived {latency:.1} ms after the interrupt");
    // ... the picture darkens frame by frame to rest within the ramp, and stays there (the
    // render's frames made with the cut speech never show).
    let eased: Vec<f64> = after.iter().skip_while(|f| f.mean_luma >= 195.0).map(|f| f.mean_luma).collect();
    assert!(eased.windows(2).all(|w| w[1] <= w[0] + 2.0), "not monotone: {eased:?}");
    assert!(eased.iter().skip(4).all(|&l| (l - 50.0).abs() < 4.0), "not at rest after the ramp: {eased:?}");
    assert!(eased.len() > 30);
    let stats = session.stats();
    assert_eq!(stats.wire.interrupts, 1);
    assert!(stats.wire.interrupt_latency_ms.unwrap() <= 80.0, "{stats:?}");
    assert!(stats.wire.discarded_frames > 0, "{stats:?}");
}
