//! The wire: one thread per session that owns the session's `str0m::Rtc` and UDP socket and
//! sends, each at its time, a video frame every 1/fps and 20 ms of speech every 20 ms.
//!
//! str0m is sans-IO: it never reads a socket or a clock, so this loop does both. It waits on
//! the socket until the earliest of str0m's next timeout, the next frame's time and the next
//! speech packet's time, and then hands str0m what came in and what is due. Every time on
//! the wire comes from the session's [`Timeline`] clock: frame `f` is due at
//! `start + delay + f / fps`, speech sample `s` at `start + delay + s / 16000`, so that video
//! and audio share one clock (their RTP times are these times in 90 kHz and 48 kHz units, and
//! str0m's sender reports map them to the same wall clock). `delay` is the margin the render
//! works ahead of the wire.
//!
//! Frames come from the render through a bounded queue ([`FrameSender`]); a frame that has not
//! arrived at its time is replaced by the last frame sent, and counted (`repeated_frames`), so
//! that the stream never stops; a frame that arrives after its time is dropped (`late_frames`).
//! Speech is never stretched or dropped: its packets go out at their times whatever the video
//! does.

use crate::encode::{AccessUnit, FrameEncoder, SpeechEncoder, OPUS_CLOCK, SPEECH_FRAME, VIDEO_CLOCK};
use crate::timeline::{Timeline, RATE};
use anyhow::{anyhow, Context, Result};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use str0m::change::SdpOffer;
use str0m::format::{Codec, PayloadParams};
use str0m::media::{Direction, Frequency, MediaKind, MediaTime, Mid, Pt};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, IceConnectionState, Input, Output, Rtc, RtcConfig};

/// Where the session listens, and how it is reached.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// The address the UDP socket binds (the server's listen address).
    pub bind: IpAddr,
    /// The address peers reach it at, where that differs (a host behind 1:1 NAT): announced
    /// as a server-reflexive candidate beside the host one.
    pub public_ip: Option<IpAddr>,
    /// UDP ports to take one from (inclusive); `None`: any free port.
    pub ports: Option<(u16, u16)>,
}

/// How the wire sends.
#[derive(Clone, Debug)]
pub struct WireConfig {
    pub fps: f64,
    pub width: usize,
    pub height: usize,
    /// How far behind the timeline's clock the wire runs: the render's margin.
    pub delay: Duration,
    pub video_bitrate_bps: u32,
    pub speech_bitrate_bps: i32,
    /// Close the session when no packet came from the peer for this long once connected
    /// (ICE consent: browsers send checks every few seconds).
    pub peer_timeout: Duration,
    /// Frames over which the picture eases to rest after an interrupt (the render's ramp).
    pub ramp: usize,
}

/// What the wire has done, for the session's figures.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WireStats {
    /// ICE and DTLS are up.
    pub connected: bool,
    /// Why the wire stopped, once it has.
    pub closed: Option<String>,
    pub frames_sent: u64,
    /// Frames sent again because the next had not arrived at its time.
    pub repeated_frames: u64,
    /// Frames that arrived after their time and were dropped.
    pub late_frames: u64,
    pub keyframes_sent: u64,
    pub keyframe_requests: u64,
    pub speech_packets: u64,
    /// The next frame and speech sample the wire sends (timeline units).
    pub next_frame: u64,
    pub next_sample: u64,
    /// The largest gap between two frames leaving the socket (each frame's last packet handed
    /// to `sendto`), milliseconds: the gap on the wire, not when the frame was written to str0m.
    pub max_frame_gap_ms: f64,
    pub interrupts: u64,
    /// Frames sent in place of the render's after an interrupt (the easing to rest, then rest).
    pub eased_frames: u64,
    /// Frames of the render dropped after an interrupt (made with the speech that was cut).
    pub discarded_frames: u64,
    /// From the last interrupt's request to its first eased frame written, milliseconds.
    pub interrupt_latency_ms: Option<f64>,
    /// Seconds spent in the H.264 encoder.
    pub video_encode_s: f64,
    /// The longest one frame took in the H.264 encoder, milliseconds.
    pub max_video_encode_ms: f64,
}

/// The render's end of the frame queue: NV12 frames with their timeline index, in order.
#[derive(Clone)]
pub struct FrameSender {
    tx: SyncSender<(usize, Vec<u8>)>,
}

impl FrameSender {
    /// Hands frame `index` to the wire, waiting while the queue is full (the render's margin
    /// is bounded by it); an error once the session has ended.
    pub fn send(&self, index: usize, nv12: Vec<u8>) -> Result<()> {
        self.tx.send((index, nv12)).map_err(|_| anyhow!("the session has ended"))
    }
}

/// A session's wire before its thread starts: the answer is made, the socket bound.
pub struct Wire {
    rtc: Rtc,
    socket: UdpSocket,
    local: SocketAddr,
}

/// What the wire's thread shares with the session.
pub struct WireShared {
    pub stats: Mutex<WireStats>,
    pub stop: AtomicBool,
    /// The wire sends the next frame as an IDR (set by the session, e.g. after an interrupt).
    pub keyframe: AtomicBool,
    /// An interrupt to act on: (when it was asked, the first frame the render makes after it).
    pub interrupt: Mutex<Option<(Instant, usize)>>,
}

impl Wire {
    /// Accepts `offer` (SDP text): a peer that receives video and audio. Returns the wire and
    /// the SDP answer.
    pub fn accept(offer: &str, net: &NetConfig) -> Result<(Self, String), StartError> {
        let offer = parse_offer(offer)?;
        let socket = bind(net)?;
        let local = socket.local_addr().map_err(|e| StartError::Internal(format!("the socket's address: {e}")))?;
        let config = RtcConfig::new().set_ice_lite(true).clear_codecs().enable_h264(true).enable_opus(true, false);
        let mut rtc = config.build(Instant::now());
        let host = Candidate::host(local, "udp")
            .map_err(|e| StartError::Internal(format!("a host candidate on {local}: {e}")))?;
        rtc.add_local_candidate(host);
        if let Some(public) = net.public_ip {
            let addr = SocketAddr::new(public, local.port());
            let srflx = Candidate::server_reflexive(addr, local, "udp")
                .map_err(|e| StartError::Internal(format!("a candidate on the public address {addr}: {e}")))?;
            rtc.add_local_candidate(srflx);
        }
        let answer = rtc
            .sdp_api()
            .accept_offer(offer)
            .map_err(|e| StartError::Offer(format!("the SDP offer cannot be answered: {e}")))?;
        Ok((Self { rtc, socket, local }, answer.to_sdp_string()))
    }

    /// The UDP address the session listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Runs the wire on its own thread until the peer leaves, it fails, or `shared.stop`.
    /// `queue` frames at most wait between the render and the wire.
    pub fn spawn(
        self,
        config: WireConfig,
        timeline: Arc<Timeline>,
        queue: usize,
    ) -> Result<(FrameSender, Arc<WireShared>, std::thread::JoinHandle<()>)> {
        let (tx, rx) = std::sync::mpsc::sync_channel(queue.max(1));
        let shared = Arc::new(WireShared {
            stats: Mutex::new(WireStats::default()),
            stop: AtomicBool::new(false),
            keyframe: AtomicBool::new(false),
            interrupt: Mutex::new(None),
        });
        let video = FrameEncoder::new(
            config.width,
            config.height,
            config.fps,
            config.video_bitrate_bps,
            // No IDR on a period: one at the start and whenever the peer asks (PLI or FIR), as
            // libwebrtc's senders do. An IDR takes 50-100 ms to encode at 1080x1920 here
            // (about 10 for a P frame), more than the encoding lead covers.
            0,
        )?;
        let speech = SpeechEncoder::new(config.speech_bitrate_bps)?;
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("cadence-wire".into())
            .spawn(move || {
                // While the peer connects (the render's first frames come a delay later).
                let mut video = video;
                let reason = match video.warm_up(WARM_UP_FRAMES) {
                    Err(e) => format!("failed: {e:#}"),
                    Ok(()) => Running::new(self, config, timeline.clone(), rx, s.clone(), video, speech)
                        .run()
                        .unwrap_or_else(|e| format!("failed: {e:#}")),
                };
                timeline.close();
                let mut st = s.stats.lock().unwrap_or_else(|e| e.into_inner());
                st.closed = Some(reason);
            })
            .context("starting the wire's thread")?;
        Ok((FrameSender { tx }, shared, handle))
    }
}

/// Why a session could not start: the peer's offer (its fault), no port free (try later), or
/// anything else (the server's).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Offer(String),
    #[error("{0}")]
    NoPort(String),
    #[error("{0}")]
    Internal(String),
}

/// Checks that `offer` is SDP, before anything is spent on a session.
pub fn parse_offer(offer: &str) -> Result<SdpOffer, StartError> {
    SdpOffer::from_sdp_string(offer).map_err(|e| StartError::Offer(format!("the SDP offer does not parse: {e}")))
}

/// Binds the session's socket: a port of the range, or any.
fn bind(net: &NetConfig) -> Result<UdpSocket, StartError> {
    match net.ports {
        None => UdpSocket::bind((net.bind, 0))
            .map_err(|e| StartError::NoPort(format!("binding a UDP port on {}: {e}", net.bind))),
        Some((a, b)) => (a..=b)
            .find_map(|port| UdpSocket::bind((net.bind, port)).ok())
            .ok_or_else(|| StartError::NoPort(format!("no free UDP port in {a}-{b} on {}", net.bind))),
    }
}

struct Running {
    rtc: Rtc,
    socket: UdpSocket,
    local: SocketAddr,
    config: WireConfig,
    timeline: Arc<Timeline>,
    frames: Receiver<(usize, Vec<u8>)>,
    waiting: VecDeque<(usize, Vec<u8>)>,
    shared: Arc<WireShared>,
    video: FrameEncoder,
    speech: SpeechEncoder,
    video_mid: Option<Mid>,
    audio_mid: Option<Mid>,
    connected: bool,
    next_frame: usize,
    next_sample: usize,
    last_frame: Option<Vec<u8>>,
    /// A frame was written to str0m whose packets have not all left yet.
    frame_unsent: bool,
    /// When the last frame's last packet left the socket.
    last_frame_sent: Option<Instant>,
    want_keyframe: bool,
    last_heard: Instant,
    /// A frame of the render at rest (no speech near it), kept to ease to after an interrupt.
    rest_frame: Option<Vec<u8>>,
    easing: Option<Easing>,
    /// The next frame, taken from the render and encoded, waiting for its time.
    encoded: Option<Encoded>,
}

/// A frame encoded before its time.
struct Encoded {
    unit: AccessUnit,
    /// The render had not made it: the last frame again.
    repeated: bool,
    /// The first eased frame after an interrupt: when the interrupt was asked.
    interrupt: Option<Instant>,
}

/// Frames the wire's H.264 encoder encodes and throws away before the session's first
/// ([`FrameEncoder::warm_up`]): about 0.25 s at 1080x1920 here, while ICE and DTLS run.
const WARM_UP_FRAMES: usize = 8;

/// How long before its time a frame is taken from the render and encoded; it is written at its
/// time. OpenH264 (built without assembly) encodes a 1080x1920 P frame in about 10 ms but an
/// IDR in about 60: encoded at its time, an IDR was written that much late, a gap of about
/// 90 ms on the wire. Under a frame's period, so at most one frame waits encoded (a frame an
/// interrupt can no longer change).
const ENCODE_LEAD: Duration = Duration::from_millis(35);

/// How early the first eased frame after an interrupt may be written (it is encoded at once):
/// the interrupt takes effect within about this much of the request, and the next frame,
/// written at its time, follows at most a period plus this much later.
const EASE_EARLY: Duration = Duration::from_millis(20);

/// The frames after an interrupt: from the last frame sent to the rest frame over the ramp,
/// then rest, until the render's frames are made from audio read after the cut.
struct Easing {
    asked: Instant,
    /// The first frame eased.
    from_index: usize,
    /// The render's first frame that is its own again.
    resume: usize,
    from: Vec<u8>,
}

/// The payload type the frames go out as, of those the peer's offer and this side share: H.264
/// in packetization mode 1 (FU-A: a frame larger than a packet is split) and a baseline
/// profile, which is what OpenH264 writes (constrained baseline), before other profiles (a
/// browser's offer lists main and high too, and any order); mode 0 only if nothing else.
fn video_pt<'a>(params: impl Iterator<Item = &'a PayloadParams>) -> Option<Pt> {
    params
        .filter(|p| p.spec().codec == Codec::H264)
        .min_by_key(|p| {
            let f = &p.spec().format;
            let baseline = f.profile_level_id.is_some_and(|id| id >> 16 == 0x42);
            (f.packetization_mode != Some(1), !baseline)
        })
        .map(|p| p.pt())
}

/// `from` eased toward `to` by weight `w` (0: from, 1: to), byte by byte over the NV12 planes,
/// rounded to nearest (half up: the values are not negative, so `+ 0.5` and truncation is
/// `round`, without a libm call per byte that keeps the loop from vectorising).
fn blend(from: &[u8], to: &[u8], w: f32) -> Vec<u8> {
    from.iter().zip(to).map(|(&a, &b)| (a as f32 + (b as f32 - a as f32) * w + 0.5) as u8).collect()
}

impl Running {
    fn new(
        wire: Wire,
        config: WireConfig,
        timeline: Arc<Timeline>,
        frames: Receiver<(usize, Vec<u8>)>,
        shared: Arc<WireShared>,
        video: FrameEncoder,
        speech: SpeechEncoder,
    ) -> Self {
        Self {
            rtc: wire.rtc,
            socket: wire.socket,
            local: wire.local,
            config,
            timeline,
            frames,
            waiting: VecDeque::new(),
            shared,
            video,
            speech,
            video_mid: None,
            audio_mid: None,
            connected: false,
            next_frame: 0,
            next_sample: 0,
            last_frame: None,
            frame_unsent: false,
            last_frame_sent: None,
            want_keyframe: true,
            last_heard: Instant::now(),
            rest_frame: None,
            easing: None,
            encoded: None,
        }
    }

    fn frame_due(&self, f: usize) -> Instant {
        self.timeline.start() + self.config.delay + Duration::from_secs_f64(f as f64 / self.config.fps)
    }

    fn sample_due(&self, s: usize) -> Instant {
        self.timeline.start() + self.config.delay + Duration::from_secs_f64(s as f64 / RATE as f64)
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, WireStats> {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs until the peer leaves (the reason) or an error.
    fn run(&mut self) -> Result<String> {
        let mut buf = vec![0u8; 2000];
        loop {
            if self.shared.stop.load(Ordering::Relaxed) {
                self.rtc.disconnect();
                return Ok("closed by the server".into());
            }
            // The media whose time has come, before str0m's output: what is written now goes
            // out now, not after the wait below.
            self.pull_frames();
            if self.connected {
                if self.last_heard.elapsed() > self.config.peer_timeout {
                    return Ok(format!("nothing heard from the peer for {:?}", self.config.peer_timeout));
                }
                self.send_due(false)?;
                // str0m packetizes what was written when time advances: now, not at the next
                // wake (up to 20 ms later).
                self.rtc.handle_input(Input::Timeout(Instant::now())).map_err(|e| anyhow!("str0m: {e}"))?;
            }
            // What str0m has to send, and its events.
            let mut last_sent = None;
            let rtc_due = loop {
                match self.rtc.poll_output().map_err(|e| anyhow!("str0m: {e}"))? {
                    Output::Timeout(t) => break t,
                    Output::Transmit(t) => {
                        // A send that fails (the peer's network is gone) is ICE's to notice.
                        let _ = self.socket.send_to(&t.contents, t.destination);
                        last_sent = Some(Instant::now());
                    }
                    Output::Event(e) => {
                        if let Some(reason) = self.on_event(e) {
                            return Ok(reason);
                        }
                    }
                }
            };
            if self.frame_unsent {
                if let Some(sent) = last_sent {
                    // str0m packetizes a written frame whole (no pacer without bandwidth
                    // estimation), so the drain after its write carries all of its packets.
                    self.frame_unsent = false;
                    if let Some(before) = self.last_frame_sent.replace(sent) {
                        let mut st = self.stats();
                        st.max_frame_gap_ms = st.max_frame_gap_ms.max((sent - before).as_secs_f64() * 1e3);
                    }
                }
            }
            if !self.rtc.is_alive() {
                return Ok("the connection closed".into());
            }
            // Encoding (10 ms a frame, an IDR 50-90) waits until str0m has sent what it had:
            // a frame's packets are not held back behind the next frame's encoding.
            if self.connected && rtc_due > Instant::now() && self.send_due(true)? {
                continue;
            }
            // Wait for a packet until the earliest of str0m's timeout and the next media.
            let mut until = rtc_due.min(Instant::now() + Duration::from_millis(50));
            if self.connected {
                until = until.min(self.frame_wake()).min(self.sample_due(self.next_sample));
            }
            let now = Instant::now();
            if until <= now {
                self.rtc.handle_input(Input::Timeout(now)).map_err(|e| anyhow!("str0m: {e}"))?;
                continue;
            }
            if !wait_readable(&self.socket, until - now)? {
                self.rtc.handle_input(Input::Timeout(Instant::now())).map_err(|e| anyhow!("str0m: {e}"))?;
                continue;
            }
            match self.socket.recv_from(&mut buf) {
                Ok((n, source)) => {
                    self.last_heard = Instant::now();
                    let Ok(contents) = buf[..n].try_into() else {
                        continue; // not STUN, DTLS or RTP: ignored
                    };
                    let input = Input::Receive(
                        Instant::now(),
                        Receive { proto: Protocol::Udp, source, destination: self.local, contents },
                    );
                    if self.rtc.accepts(&input) {
                        self.rtc.handle_input(input).map_err(|e| anyhow!("str0m: {e}"))?;
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    self.rtc.handle_input(Input::Timeout(Instant::now())).map_err(|e| anyhow!("str0m: {e}"))?;
                }
                Err(e) => return Err(e).context("receiving on the session's socket"),
            }
        }
    }

    /// Handles one of str0m's events; `Some(reason)` ends the session.
    fn on_event(&mut self, e: Event) -> Option<String> {
        match e {
            Event::Connected => {
                self.connected = true;
                self.last_heard = Instant::now();
                // Start with what is due now: frames and speech before it were never sent.
                let now = Instant::now();
                let since = now.saturating_duration_since(self.timeline.start() + self.config.delay).as_secs_f64();
                self.next_frame = (since * self.config.fps).ceil() as usize;
                self.next_sample = ((since * RATE as f64 / SPEECH_FRAME as f64).ceil() as usize) * SPEECH_FRAME;
                self.stats().connected = true;
            }
            Event::IceConnectionStateChange(IceConnectionState::Disconnected) => {
                return Some("the peer disconnected (ICE)".into());
            }
            Event::MediaAdded(m) => {
                if matches!(m.direction, Direction::SendOnly | Direction::SendRecv) {
                    match m.kind {
                        MediaKind::Video if self.video_mid.is_none() => self.video_mid = Some(m.mid),
                        MediaKind::Audio if self.audio_mid.is_none() => self.audio_mid = Some(m.mid),
                        _ => {}
                    }
                }
            }
            Event::KeyframeRequest(r) if Some(r.mid) == self.video_mid => {
                self.want_keyframe = true;
                self.stats().keyframe_requests += 1;
            }
            _ => {}
        }
        None
    }

    /// Moves the frames the render has made into the wire's own queue, dropping those whose
    /// time has passed.
    fn pull_frames(&mut self) {
        // At most the frames of the wire's delay wait here: beyond, the render waits on the
        // queue, which bounds how far ahead of the wire it runs.
        let most = (self.config.delay.as_secs_f64() * self.config.fps).ceil() as usize + 2;
        while self.waiting.len() < most {
            let Ok((f, frame)) = self.frames.try_recv() else {
                break;
            };
            if self.connected && f < self.next_frame {
                self.stats().late_frames += 1;
            } else {
                self.waiting.push_back((f, frame));
            }
            // Before the peer connects, keep only the frames still to come.
            if !self.connected {
                let now = Instant::now();
                while self.waiting.len() > 1 && self.frame_due(self.waiting[0].0) < now {
                    self.waiting.pop_front();
                }
            }
        }
    }

    /// Writes every speech packet and encoded frame whose time has come and, with `encode`,
    /// encodes the frames whose lead has come. Says whether a frame was encoded, written or
    /// passed over.
    fn send_due(&mut self, encode: bool) -> Result<bool> {
        let now = Instant::now();
        while self.sample_due(self.next_sample) <= now {
            let s = self.next_sample;
            let pcm = self.timeline.take_for_wire(s, SPEECH_FRAME);
            let packet = self.speech.encode(&pcm)?;
            let due = self.sample_due(s);
            if let Some(mid) = self.audio_mid {
                let time = MediaTime::new((s as u64 * OPUS_CLOCK) / RATE as u64, Frequency::FORTY_EIGHT_KHZ);
                if let Some(w) = self.rtc.writer(mid) {
                    let pt = w.payload_params().find(|p| p.spec().codec == Codec::Opus).map(|p| p.pt());
                    if let Some(pt) = pt {
                        w.write(pt, due, time, packet).map_err(|e| anyhow!("writing speech: {e}"))?;
                        self.stats().speech_packets += 1;
                    }
                }
            }
            self.next_sample += SPEECH_FRAME;
            self.stats().next_sample = self.next_sample as u64;
        }
        if let Some((asked, resume)) = self.shared.interrupt.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if let Some(from) = self.last_frame.clone() {
                // A frame already encoded goes out as it is: the easing starts after it.
                let from_index = self.next_frame + self.encoded.is_some() as usize;
                self.easing = Some(Easing { asked, from_index, resume, from });
                self.stats().interrupts += 1;
            }
        }
        let mut progressed = false;
        loop {
            let f = self.next_frame;
            if self.encoded.is_none() {
                let first_eased = self.easing.as_ref().is_some_and(|e| e.from_index == f);
                if !encode || (!first_eased && Instant::now() + ENCODE_LEAD < self.frame_due(f)) {
                    return Ok(progressed);
                }
                self.encoded = self.encode_frame(f)?;
                progressed = true;
                if self.encoded.is_none() {
                    // Nothing rendered yet (nothing to repeat either), or no video track.
                    if Instant::now() < self.frame_due(f) {
                        return Ok(progressed);
                    }
                    self.stats().repeated_frames += self.last_frame.is_none() as u64;
                    self.advance();
                    continue;
                }
            }
            if Instant::now() < self.write_time() {
                return Ok(progressed);
            }
            let e = self.encoded.take().expect("encoded above");
            self.write_frame(e)?;
            self.advance();
            // Its packets leave before anything more is encoded: a wire running late would
            // otherwise hold them behind the next frame's encoding (10 ms, an IDR 50-110).
            return Ok(true);
        }
    }

    /// When the wire next has a frame to take from the render or to write.
    fn frame_wake(&self) -> Instant {
        match &self.encoded {
            Some(_) => self.write_time(),
            None => self.frame_due(self.next_frame).checked_sub(ENCODE_LEAD).unwrap_or_else(Instant::now),
        }
    }

    /// When the frame encoded now may be written: at its time, or up to [`EASE_EARLY`] before
    /// it when it is the first eased frame after an interrupt.
    fn write_time(&self) -> Instant {
        let due = self.frame_due(self.next_frame);
        match &self.encoded {
            Some(e) if e.interrupt.is_some() => due.checked_sub(EASE_EARLY).unwrap_or(due),
            _ => due,
        }
    }

    fn advance(&mut self) {
        self.next_frame += 1;
        self.stats().next_frame = self.next_frame as u64;
    }

    /// Takes frame `f` from the render (or, when it has not arrived, the last frame again; after
    /// an interrupt, the easing to rest) and encodes it. `None` when there is nothing to send:
    /// no frame yet, or no video track.
    fn encode_frame(&mut self, f: usize) -> Result<Option<Encoded>> {
        while self.waiting.front().is_some_and(|(i, _)| *i < f) {
            self.waiting.pop_front();
            self.stats().late_frames += 1;
        }
        let frame = match self.waiting.front() {
            Some((i, _)) if *i == f => self.waiting.pop_front().map(|(_, fr)| fr),
            _ => None,
        };
        let mut repeated = frame.is_none();
        let mut interrupt = None;
        if self.easing.as_ref().is_some_and(|e| f >= e.resume) {
            self.easing = None;
        }
        if let Some(e) = &self.easing {
            // The render's frame was made with the speech that was cut: ease from the last
            // frame sent before the interrupt to rest instead (Hermite, over the ramp).
            let t = (f - e.from_index + 1) as f32 / self.config.ramp.max(1) as f32;
            let eased = match &self.rest_frame {
                Some(rest) => blend(&e.from, rest, cadence_kernels::math::hermite(t)),
                None => e.from.clone(),
            };
            if f == e.from_index {
                interrupt = Some(e.asked);
            }
            let mut st = self.stats();
            st.eased_frames += 1;
            st.discarded_frames += frame.is_some() as u64;
            drop(st);
            self.last_frame = Some(eased);
            repeated = false;
        } else if let Some(fr) = frame {
            // A frame with no speech near it is the avatar at rest.
            let spf = RATE as f64 / self.config.fps;
            let margin = (self.config.ramp + 5) as f64;
            let span = ((f as f64 - margin).max(0.0) * spf) as usize..((f as f64 + 1.0 + margin) * spf) as usize;
            if (self.rest_frame.is_none() || f.is_multiple_of(25)) && self.timeline.silent(span) {
                self.rest_frame = Some(fr.clone());
            }
            self.last_frame = Some(fr);
        }
        let (Some(fr), Some(_)) = (&self.last_frame, self.video_mid) else {
            return Ok(None);
        };
        let keyframe = self.want_keyframe || self.shared.keyframe.swap(false, Ordering::Relaxed);
        let unit = self.video.encode(fr, keyframe)?;
        if unit.keyframe {
            self.want_keyframe = false;
        }
        Ok(Some(Encoded { unit, repeated, interrupt }))
    }

    /// Writes the encoded frame `next_frame` to str0m.
    fn write_frame(&mut self, e: Encoded) -> Result<()> {
        let f = self.next_frame;
        let Some(mid) = self.video_mid else { return Ok(()) };
        let due = self.frame_due(f);
        let time =
            MediaTime::new((f as f64 * VIDEO_CLOCK as f64 / self.config.fps).round() as u64, Frequency::NINETY_KHZ);
        let Some(w) = self.rtc.writer(mid) else { return Ok(()) };
        let Some(pt) = video_pt(w.payload_params()) else { return Ok(()) };
        w.write(pt, due, time, e.unit.data).map_err(|e| anyhow!("writing a frame: {e}"))?;
        let written = Instant::now();
        self.frame_unsent = true;
        let mut st = self.stats();
        st.frames_sent += 1;
        st.repeated_frames += e.repeated as u64;
        st.keyframes_sent += e.unit.keyframe as u64;
        st.video_encode_s = self.video.encode_s;
        st.max_video_encode_ms = self.video.max_encode_s * 1e3;
        if let Some(asked) = e.interrupt {
            st.interrupt_latency_ms = Some(written.saturating_duration_since(asked).as_secs_f64() * 1e3);
        }
        Ok(())
    }
}

/// Waits until `socket` has a packet (true) or `timeout` has passed (false), to within tens of
/// microseconds: `ppoll`'s timer is the kernel's high-resolution one, where a socket's read
/// timeout (SO_RCVTIMEO) is counted in scheduler ticks and woke the wire up to a tick (4-10 ms)
/// after a frame's time. `libc`: std has no poll.
#[cfg(target_os = "linux")]
fn wait_readable(socket: &UdpSocket, timeout: Duration) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let r = unsafe { libc::ppoll(&mut fd, 1, &ts, std::ptr::null()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        // A signal: the caller goes round and waits again.
        return if e.kind() == std::io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(r > 0)
}

/// Elsewhere: the socket's read timeout, the `recv_from` that follows waits.
#[cfg(not(target_os = "linux"))]
fn wait_readable(socket: &UdpSocket, timeout: Duration) -> std::io::Result<bool> {
    socket.set_read_timeout(Some(timeout.max(Duration::from_micros(200))))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chromium 156's offer from the page's live mode (two `recvonly` transceivers; this one
    /// taken after ICE gathering, so it holds an mDNS host candidate): VP8, VP9, AV1, H.264 in
    /// six profile and packetization-mode pairs, rtx, red, ulpfec, flexfec; Opus, red, G.722...
    const CHROMIUM_OFFER: &str = include_str!("testdata/chromium_156_offer.sdp");

    fn loopback() -> NetConfig {
        NetConfig { bind: [127, 0, 0, 1].into(), public_ip: None, ports: None }
    }

    /// The lines of the answer's media section `m` (0 video, 1 audio).
    fn section(answer: &str, m: usize) -> Vec<&str> {
        answer.split("\r\nm=").nth(m + 1).unwrap().lines().collect()
    }

    #[test]
    fn a_chromium_offer_is_answered_with_h264_packetization_mode_1_baseline_and_opus() {
        let (mut wire, answer) = Wire::accept(CHROMIUM_OFFER, &loopback()).unwrap();
        // ICE-lite, the browser's BUNDLE kept, DTLS with the browser as client, rtcp-mux.
        for line in ["a=ice-lite", "a=group:BUNDLE 0 1", "a=setup:passive"] {
            assert!(answer.lines().any(|l| l == line), "no {line} in\n{answer}");
        }
        let (video, audio) = (section(&answer, 0), section(&answer, 1));
        for s in [&video, &audio] {
            assert!(s.contains(&"a=sendonly") && s.contains(&"a=rtcp-mux"), "{s:?}");
        }
        // Only what this side sends: H.264 (and its rtx), Opus.
        let codecs = |s: &[&str]| -> Vec<String> {
            s.iter()
                .filter_map(|l| l.strip_prefix("a=rtpmap:"))
                .map(|l| l.split([' ', '/']).nth(1).unwrap().to_string())
                .collect()
        };
        assert!(codecs(&video).iter().all(|c| c == "H264" || c == "rtx"), "{video:?}");
        assert_eq!(codecs(&audio), ["opus"]);
        // The frames go out as baseline in packetization mode 1: the offer's 102 (42001f).
        let w = wire.rtc.writer(Mid::from("0")).unwrap();
        let pt = video_pt(w.payload_params()).unwrap();
        let p = w.payload_params().find(|p| p.pt() == pt).unwrap();
        assert_eq!(p.spec().format.packetization_mode, Some(1));
        assert_eq!(p.spec().format.profile_level_id.map(|id| id >> 16), Some(0x42));
        assert_eq!(*pt, 102);
    }

    #[test]
    fn frames_go_out_as_baseline_in_packetization_mode_1_whatever_the_offers_order() {
        use str0m::format::{CodecSpec, FormatParams};
        let h264 = |pt: u8, profile: u32, mode: u8| {
            let format = FormatParams {
                profile_level_id: Some(profile),
                packetization_mode: Some(mode),
                ..FormatParams::default()
            };
            let spec = CodecSpec { codec: Codec::H264, clock_rate: Frequency::NINETY_KHZ, channels: None, format };
            PayloadParams::new(Pt::from(pt), None, spec)
        };
        // Safari lists high first; single-NAL mode cannot carry a frame larger than a packet.
        let offered = [h264(96, 0x640c1f, 1), h264(97, 0x42e01f, 0), h264(98, 0x4d001f, 1), h264(99, 0x42e01f, 1)];
        assert_eq!(video_pt(offered.iter()), Some(Pt::from(99)));
        assert_eq!(video_pt(offered[..3].iter()), Some(Pt::from(96)), "mode 1 before a baseline profile");
        assert_eq!(video_pt(offered[1..2].iter()), Some(Pt::from(97)), "mode 0 if nothing else");
        assert_eq!(video_pt([].iter()), None);
    }
}
