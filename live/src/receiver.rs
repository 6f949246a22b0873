//! A receiving WebRTC peer made with str0m: it offers to receive one video and one audio
//! track, connects over UDP, and decodes what arrives (H.264 with OpenH264's decoder, Opus with
//! opus-rs), recording when each frame and speech packet arrived. The tests and the
//! `live_sessions` experiment use it as the far end of a session, in the same process.

use anyhow::{anyhow, Result};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use str0m::change::{SdpAnswer, SdpPendingOffer};
use str0m::format::Codec;
use str0m::media::{Direction, KeyframeRequestKind, MediaKind, Mid};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, Input, Output, Rtc, RtcConfig};

/// A decoded frame's arrival.
#[derive(Clone, Copy, Debug)]
pub struct FrameArrival {
    /// When its last packet reached the socket (the kernel's stamp, [`crate::arrival`]): the
    /// receiver's own scheduling and decoding are not the wire's.
    pub at: Instant,
    /// Its RTP time in seconds.
    pub rtp_s: f64,
    pub keyframe: bool,
    /// The mean luma of the decoded picture.
    pub mean_luma: f64,
    /// Bytes of its H.264 access unit.
    pub bytes: usize,
}

/// A speech packet's arrival.
#[derive(Clone, Copy, Debug)]
pub struct SpeechArrival {
    /// When its packet reached the socket.
    pub at: Instant,
    pub rtp_s: f64,
    /// RMS of the decoded 20 ms (full scale 1).
    pub rms: f64,
}

/// See the module documentation.
pub struct Receiver {
    rtc: Rtc,
    socket: UdpSocket,
    local: SocketAddr,
    video: Mid,
    audio: Mid,
    pending: Option<SdpPendingOffer>,
    decoder: openh264::decoder::Decoder,
    opus: opus_rs::OpusDecoder,
    pub frames: Vec<FrameArrival>,
    pub speech: Vec<SpeechArrival>,
    pub connected: bool,
    /// Frames that did not decode.
    pub undecodable: usize,
    /// The size of the last decoded picture.
    pub size: Option<(usize, usize)>,
    /// When the packet last taken in reached the socket ([`crate::arrival`]): a frame or
    /// speech packet that str0m completes with it arrived then.
    last_packet_at: Instant,
}

impl Receiver {
    /// A receiver bound to `ip` (port chosen by the system), and its SDP offer.
    pub fn offer(ip: std::net::IpAddr) -> Result<(Self, String)> {
        let socket = UdpSocket::bind((ip, 0))?;
        crate::arrival::enable(&socket)?;
        let local = socket.local_addr()?;
        let mut rtc = RtcConfig::new().clear_codecs().enable_h264(true).enable_opus(true, false).build(Instant::now());
        rtc.add_local_candidate(Candidate::host(local, "udp").map_err(|e| anyhow!("{e}"))?);
        let mut api = rtc.sdp_api();
        let video = api.add_media(MediaKind::Video, Direction::RecvOnly, None, None, None);
        let audio = api.add_media(MediaKind::Audio, Direction::RecvOnly, None, None, None);
        let (offer, pending) = api.apply().ok_or_else(|| anyhow!("no offer"))?;
        let r = Self {
            rtc,
            socket,
            local,
            video,
            audio,
            pending: Some(pending),
            decoder: openh264::decoder::Decoder::new().map_err(|e| anyhow!("{e}"))?,
            opus: opus_rs::OpusDecoder::new(48_000, 1).map_err(|e| anyhow!("{e}"))?,
            frames: Vec::new(),
            speech: Vec::new(),
            connected: false,
            undecodable: 0,
            size: None,
            last_packet_at: Instant::now(),
        };
        Ok((r, offer.to_sdp_string()))
    }

    /// Takes the session's SDP answer.
    pub fn accept(&mut self, answer: &str) -> Result<()> {
        let answer = SdpAnswer::from_sdp_string(answer).map_err(|e| anyhow!("the answer: {e}"))?;
        let pending = self.pending.take().ok_or_else(|| anyhow!("an answer was taken already"))?;
        self.rtc.sdp_api().accept_answer(pending, answer).map_err(|e| anyhow!("the answer: {e}"))
    }

    /// Runs the peer for `d`: sends what str0m has to send, takes what arrives, decodes it.
    pub fn run_for(&mut self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        let mut buf = vec![0u8; 2000];
        while Instant::now() < end {
            let due = loop {
                match self.rtc.poll_output().map_err(|e| anyhow!("{e}"))? {
                    Output::Timeout(t) => break t,
                    Output::Transmit(t) => {
                        let _ = self.socket.send_to(&t.contents, t.destination);
                    }
                    Output::Event(e) => self.on_event(e)?,
                }
            };
            let wait = due.min(end).saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            self.socket.set_read_timeout(Some(wait))?;
            let input = match crate::arrival::recv(&self.socket, &mut buf) {
                Ok((n, source, at)) => match buf[..n].try_into() {
                    Ok(contents) => {
                        self.last_packet_at = at;
                        Input::Receive(
                            Instant::now(),
                            Receive { proto: Protocol::Udp, source, destination: self.local, contents },
                        )
                    }
                    Err(_) => continue,
                },
                Err(_) => Input::Timeout(Instant::now()),
            };
            self.rtc.handle_input(input).map_err(|e| anyhow!("{e}"))?;
        }
        Ok(())
    }

    fn on_event(&mut self, e: Event) -> Result<()> {
        match e {
            Event::Connected => self.connected = true,
            Event::MediaData(d) if d.mid == self.video => {
                let at = self.last_packet_at;
                anyhow::ensure!(d.params.spec().codec == Codec::H264, "video arrived as {:?}", d.params.spec().codec);
                match self.decoder.decode(&d.data) {
                    Ok(Some(yuv)) => {
                        use openh264::formats::YUVSource;
                        let (w, h) = yuv.dimensions();
                        let (ys, _, _) = yuv.strides();
                        let y = yuv.y();
                        let sum: u64 =
                            (0..h).map(|r| y[r * ys..r * ys + w].iter().map(|&v| v as u64).sum::<u64>()).sum();
                        self.size = Some((w, h));
                        self.frames.push(FrameArrival {
                            at,
                            rtp_s: d.time.as_seconds(),
                            keyframe: d.is_keyframe(),
                            mean_luma: sum as f64 / (w * h) as f64,
                            bytes: d.data.len(),
                        });
                    }
                    _ => self.undecodable += 1,
                }
            }
            Event::MediaData(d) if d.mid == self.audio => {
                let at = self.last_packet_at;
                anyhow::ensure!(d.params.spec().codec == Codec::Opus, "audio arrived as {:?}", d.params.spec().codec);
                let mut pcm = vec![0f32; 960];
                let n = self.opus.decode(&d.data, 960, &mut pcm).map_err(|e| anyhow!("Opus: {e}"))?;
                let rms = (pcm[..n].iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n.max(1) as f64).sqrt();
                self.speech.push(SpeechArrival { at, rtp_s: d.time.as_seconds(), rms });
            }
            _ => {}
        }
        Ok(())
    }

    /// Asks the sender for a keyframe (PLI), as a decoder that lost its reference does.
    pub fn request_keyframe(&mut self) -> Result<()> {
        let mid = self.video;
        let mut w = self.rtc.writer(mid).ok_or_else(|| anyhow!("not connected"))?;
        w.request_keyframe(None, KeyframeRequestKind::Pli).map_err(|e| anyhow!("{e}"))
    }

    /// The largest gap between two frames' arrivals, in milliseconds.
    pub fn max_frame_gap_ms(&self) -> f64 {
        self.frames.windows(2).map(|w| (w[1].at - w[0].at).as_secs_f64() * 1e3).fold(0.0, f64::max)
    }
}
