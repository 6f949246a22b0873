//! The wire's encoders: speech as Opus packets of 20 ms, frames as H.264 access units.
//!
//! Opus: browsers expect it for WebRTC audio. Its RTP clock is 48 kHz whatever the input rate
//! (RFC 7587), so the 16 kHz speech the render reads is encoded as it is (an Opus encoder at
//! 16 kHz codes wideband, all that speech at 16 kHz holds) with no resampling; a decoder
//! plays it at 48 kHz.
//!
//! H.264: constrained baseline (what every browser decodes), from OpenH264, whose source the
//! `openh264` crate builds. Unlike the file encoder in `cadence-media` (no rate control, so
//! that no frame is ever skipped), the wire's encoder bounds its bit rate with OpenH264's rate
//! control, still with frame skipping off (a skipped frame would be a gap on the wire), and
//! makes an IDR when the receiver asks for one (PLI or FIR), and on a period if given one.

use anyhow::{anyhow, ensure, Result};
use openh264::encoder::{
    BitRate, Encoder, EncoderConfig, FrameType, IntraFramePeriod, RateControlMode, UsageType, VuiConfig,
};
use openh264::formats::YUVSlices;
use openh264::OpenH264API;

/// Speech samples per Opus packet: 20 ms at 16 kHz.
pub const SPEECH_FRAME: usize = 320;
/// The RTP clock of Opus (RFC 7587): 48 kHz, whatever the encoder's input rate.
pub const OPUS_CLOCK: u64 = 48_000;
/// The RTP clock of video.
pub const VIDEO_CLOCK: u64 = 90_000;

/// Speech (16 kHz mono) into Opus packets of [`SPEECH_FRAME`] samples.
pub struct SpeechEncoder {
    enc: opus_rs::OpusEncoder,
    out: Vec<u8>,
}

impl SpeechEncoder {
    /// An encoder for speech at `bitrate_bps` (variable bit rate).
    pub fn new(bitrate_bps: i32) -> Result<Self> {
        let mut enc = opus_rs::OpusEncoder::new(16_000, 1, opus_rs::Application::Voip)
            .map_err(|e| anyhow!("the Opus encoder: {e}"))?;
        enc.bitrate_bps = bitrate_bps;
        Ok(Self { enc, out: vec![0; 1500] })
    }

    /// One packet of exactly [`SPEECH_FRAME`] samples.
    pub fn encode(&mut self, pcm: &[i16]) -> Result<Vec<u8>> {
        ensure!(pcm.len() == SPEECH_FRAME, "an Opus packet takes {SPEECH_FRAME} samples, got {}", pcm.len());
        let n = self.enc.encode_i16(pcm, SPEECH_FRAME, &mut self.out).map_err(|e| anyhow!("Opus: {e}"))?;
        Ok(self.out[..n].to_vec())
    }
}

/// NV12 frames into H.264 access units (Annex B, start codes included, as RTP packetizers
/// take them).
pub struct FrameEncoder {
    enc: Encoder,
    width: usize,
    height: usize,
    u: Vec<u8>,
    v: Vec<u8>,
    /// Seconds spent encoding.
    pub encode_s: f64,
    /// The longest one frame took, seconds.
    pub max_encode_s: f64,
}

/// One encoded frame.
pub struct AccessUnit {
    /// Annex B NAL units.
    pub data: Vec<u8>,
    /// An IDR: a receiver can start decoding here.
    pub keyframe: bool,
}

impl FrameEncoder {
    /// `width` x `height` (even) at `fps`, rate-controlled to `bitrate_bps`, with an IDR first
    /// and then at least every `idr_frames` frames (0: only when asked).
    pub fn new(width: usize, height: usize, fps: f64, bitrate_bps: u32, idr_frames: u32) -> Result<Self> {
        ensure!(
            width >= 16 && height >= 16 && width.is_multiple_of(2) && height.is_multiple_of(2),
            "frame size {width}x{height}: each side even and at least 16"
        );
        let config = EncoderConfig::new()
            .bitrate(BitRate::from_bps(bitrate_bps))
            .max_frame_rate(openh264::encoder::FrameRate::from_hz(fps as f32))
            .rate_control_mode(RateControlMode::Bitrate)
            .usage_type(UsageType::CameraVideoRealTime)
            .skip_frames(false)
            .intra_frame_period(IntraFramePeriod::from_num_frames(idr_frames))
            .scene_change_detect(false)
            // cadence's NV12 is BT.709 limited range (docs/design.md).
            .vui(VuiConfig::bt709());
        let enc = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| anyhow!("the H.264 encoder: {e}"))?;
        Ok(Self {
            enc,
            width,
            height,
            u: vec![0; width * height / 4],
            v: vec![0; width * height / 4],
            encode_s: 0.0,
            max_encode_s: 0.0,
        })
    }

    /// Encodes `frames` gray frames and forgets them (their output and their times). A fresh
    /// OpenH264 encoder at 1080x1920 took 55-76 ms for each of its first P frames here, against
    /// about 10 later (its buffers and threads are set up as it first uses them), so a session
    /// that started sending cold wrote its first frames late, one gap after another. The wire
    /// warms its encoder while the peer connects; the session's first frame is an IDR all the
    /// same (the caller asks for it).
    pub fn warm_up(&mut self, frames: usize) -> Result<()> {
        let mut frame = vec![128u8; self.frame_len()];
        for i in 0..frames {
            // A moving bar, so that the P frames have motion to search, as real ones do.
            let row = (i * 16) % self.height;
            frame[row * self.width..(row + 1) * self.width].fill(64 + (i % 4) as u8 * 32);
            self.encode(&frame, i == 0)?;
        }
        self.encode_s = 0.0;
        self.max_encode_s = 0.0;
        Ok(())
    }

    /// Bytes of one NV12 frame.
    pub fn frame_len(&self) -> usize {
        self.width * self.height * 3 / 2
    }

    /// Encodes `nv12`; with `keyframe`, as an IDR.
    pub fn encode(&mut self, nv12: &[u8], keyframe: bool) -> Result<AccessUnit> {
        ensure!(nv12.len() == self.frame_len(), "an NV12 frame of {} bytes, expected {}", nv12.len(), self.frame_len());
        let t = std::time::Instant::now();
        let (w, h) = (self.width, self.height);
        let (y, uv) = nv12.split_at(w * h);
        // OpenH264 takes I420: de-interleave NV12's UV plane.
        for ((pair, u), v) in uv.chunks_exact(2).zip(&mut self.u).zip(&mut self.v) {
            *u = pair[0];
            *v = pair[1];
        }
        if keyframe {
            self.enc.force_intra_frame();
        }
        let src = YUVSlices::new((y, &self.u, &self.v), (w, h), (w, w / 2, w / 2));
        let bs = self.enc.encode(&src).map_err(|e| anyhow!("H.264: {e}"))?;
        let unit = AccessUnit { data: bs.to_vec(), keyframe: matches!(bs.frame_type(), FrameType::IDR) };
        let took = t.elapsed().as_secs_f64();
        self.encode_s += took;
        self.max_encode_s = self.max_encode_s.max(took);
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gray(w: usize, h: usize, y: u8) -> Vec<u8> {
        let mut f = vec![y; w * h];
        f.resize(w * h * 3 / 2, 128);
        f
    }

    /// With no period, the first frame is the only IDR until one is asked for.
    #[test]
    fn without_a_period_only_the_first_frame_and_those_asked_for_are_idrs() {
        let mut e = FrameEncoder::new(64, 48, 25.0, 300_000, 0).unwrap();
        let idrs: Vec<usize> =
            (0..600).filter(|&i| e.encode(&gray(64, 48, 60 + (i % 7) as u8), i == 400).unwrap().keyframe).collect();
        assert_eq!(idrs, [0, 400]);
    }

    #[test]
    fn a_requested_keyframe_is_an_idr_and_others_are_not() {
        let mut e = FrameEncoder::new(64, 48, 25.0, 300_000, 250).unwrap();
        let first = e.encode(&gray(64, 48, 60), false).unwrap();
        assert!(first.keyframe, "the first frame is an IDR");
        assert!(first.data.starts_with(&[0, 0, 0, 1]), "Annex B");
        let second = e.encode(&gray(64, 48, 61), false).unwrap();
        assert!(!second.keyframe);
        let asked = e.encode(&gray(64, 48, 62), true).unwrap();
        assert!(asked.keyframe, "a keyframe on request");
        assert!(e.encode(&[0; 10], false).is_err(), "a short frame is refused");
    }

    /// Warming up leaves no trace in the figures, and the next frame asked for as an IDR is one.
    #[test]
    fn a_warmed_up_encoder_reports_nothing_of_it_and_starts_with_the_idr_asked_for() {
        let mut e = FrameEncoder::new(64, 48, 25.0, 300_000, 0).unwrap();
        e.warm_up(4).unwrap();
        assert_eq!((e.encode_s, e.max_encode_s), (0.0, 0.0));
        let first = e.encode(&gray(64, 48, 60), true).unwrap();
        assert!(first.keyframe);
        assert!(e.encode_s > 0.0 && e.max_encode_s > 0.0);
        assert!(!e.encode(&gray(64, 48, 61), false).unwrap().keyframe);
    }

    #[test]
    fn speech_packets_decode_back_to_speech() {
        let mut enc = SpeechEncoder::new(32_000).unwrap();
        let mut dec = opus_rs::OpusDecoder::new(48_000, 1).unwrap();
        // A 440 Hz tone at -12 dBFS for 0.4 s: after the codec's start, the decoded tone has
        // the same level within 3 dB.
        let tone: Vec<i16> = (0..6400)
            .map(|i| (0.25 * 32767.0 * (2.0 * std::f64::consts::PI * 440.0 * i as f64 / 16_000.0).sin()) as i16)
            .collect();
        let mut decoded = Vec::new();
        for chunk in tone.chunks_exact(SPEECH_FRAME) {
            let packet = enc.encode(chunk).unwrap();
            assert!(!packet.is_empty() && packet.len() < 400);
            let mut pcm = vec![0f32; 960];
            let n = dec.decode(&packet, 960, &mut pcm).unwrap();
            assert_eq!(n, 960, "20 ms at 48 kHz");
            decoded.extend_from_slice(&pcm);
        }
        let tail = &decoded[decoded.len() / 2..];
        let rms = (tail.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / tail.len() as f64).sqrt();
        let want = 0.25 / 2f64.sqrt();
        assert!((20.0 * (rms / want).log10()).abs() < 3.0, "decoded level {rms}, sent {want}");
        assert!(enc.encode(&tone[..100]).is_err());
    }
}
