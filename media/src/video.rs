//! H.264 video (+ AAC audio) in MP4 from NV12 frames.
//!
//! Encoders: OpenH264 (default; the `openh264` crate builds Cisco's source with `cc`), and
//! with the `ffmpeg` feature libx264 and h264_nvenc through ffmpeg-next. Whatever the encoder,
//! the MP4 is written by `mux` (pure Rust), and the audio by `aac`.

use std::path::Path;
use std::str::FromStr;
use std::time::Instant;

use openh264::encoder::{
    BitRate, Encoder, EncoderConfig, FrameType, IntraFramePeriod, RateControlMode, UsageType, VuiConfig,
};
use openh264::formats::YUVSlices;
use openh264::OpenH264API;

use crate::audio::Audio;
use crate::error::{MediaError, Result};
use crate::mux::{AccessUnitSink, Mp4Muxer};

/// Largest accepted frame side (portrait 1080x1920 fits; OpenH264 stops at 3840x2160).
pub const MAX_FRAME_SIDE: u32 = 3840;
/// Largest accepted shorter side: OpenH264 (H.264 up to level 5.2) encodes at most 3840x2160
/// landscape or 2160x3840 portrait, so a 2880x2880 frame, each side under 3840, is refused.
pub const MAX_FRAME_SHORT_SIDE: u32 = 2160;

/// Whether the encoder takes a `w`x`h` frame: the longer side at most [`MAX_FRAME_SIDE`], the
/// shorter at most [`MAX_FRAME_SHORT_SIDE`]. The one rule every avatar (image or video) and
/// every writer is checked against, so a frame the encoder would refuse is refused before any
/// engine runs. The error is the detail, naming the limit.
pub fn check_frame_size(w: u32, h: u32) -> std::result::Result<(), String> {
    if w > MAX_FRAME_SIDE || h > MAX_FRAME_SIDE {
        return Err(format!("{w}x{h}, larger than the maximum {MAX_FRAME_SIDE}x{MAX_FRAME_SIDE}"));
    }
    if w.min(h) > MAX_FRAME_SHORT_SIDE {
        return Err(format!(
            "{w}x{h}, larger than the H.264 encoder takes (OpenH264: at most {MAX_FRAME_SIDE}x{MAX_FRAME_SHORT_SIDE} \
             or {MAX_FRAME_SHORT_SIDE}x{MAX_FRAME_SIDE}); scale it down so that its shorter side is at most {MAX_FRAME_SHORT_SIDE}"
        ));
    }
    Ok(())
}

/// A video frame rate as a fraction, so that broadcast rates are exact: 25 is 25/1, NTSC's
/// "29.97" is 30000/1001 (as are 59.94 and 23.976 with 60000 and 24000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRate {
    pub num: u32,
    pub den: u32,
}

impl FrameRate {
    /// Frames per second as a number.
    pub fn hz(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// An integer rate.
    pub const fn whole(fps: u32) -> Self {
        FrameRate { num: fps, den: 1 }
    }

    /// Parses `25`, `30000/1001`, or a decimal: `29.97`, `59.94` and `23.976` (or `23.98`) are
    /// the NTSC rates N x 1000/1001; other decimals must be exact (`12.5` is 25/2). Rates must
    /// lie in (0, 240].
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        let bad = || format!("'{s}' is not a frame rate (e.g. 25, 29.97, 30000/1001)");
        let r = if let Some((n, d)) = s.split_once('/') {
            let (num, den) = (n.trim().parse::<u32>().map_err(|_| bad())?, d.trim().parse::<u32>().map_err(|_| bad())?);
            if den == 0 {
                return Err(bad());
            }
            FrameRate { num, den }
        } else {
            match s {
                "29.97" => FrameRate { num: 30_000, den: 1001 },
                "59.94" => FrameRate { num: 60_000, den: 1001 },
                "23.976" | "23.98" => FrameRate { num: 24_000, den: 1001 },
                _ => {
                    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
                    if int.is_empty()
                        || frac.len() > 3
                        || !(int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()))
                    {
                        return Err(bad());
                    }
                    let den = 10u32.pow(frac.len() as u32);
                    let num = format!("{int}{frac}").parse::<u32>().map_err(|_| bad())?;
                    FrameRate { num, den }
                }
            }
        };
        let g = gcd(r.num, r.den);
        let r = FrameRate { num: r.num / g.max(1), den: r.den / g.max(1) };
        if r.num == 0 || r.hz() > 240.0 {
            return Err(format!("frame rate {s}: must be above 0 and at most 240"));
        }
        Ok(r)
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl std::fmt::Display for FrameRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.den {
            1 => write!(f, "{}", self.num),
            d => write!(f, "{}/{d}", self.num),
        }
    }
}

/// Which H.264 encoder to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncoderKind {
    /// Cisco OpenH264, built from source by the `openh264` crate: always available.
    #[default]
    OpenH264,
    /// libx264 through ffmpeg-next (feature `ffmpeg`).
    X264,
    /// NVIDIA NVENC (h264_nvenc) through ffmpeg-next (feature `ffmpeg`); needs an NVIDIA GPU
    /// and the driver's libnvidia-encode at run time.
    Nvenc,
}

impl EncoderKind {
    /// Name as used on the command line: `openh264`, `x264`, `nvenc`.
    pub fn name(self) -> &'static str {
        match self {
            EncoderKind::OpenH264 => "openh264",
            EncoderKind::X264 => "x264",
            EncoderKind::Nvenc => "nvenc",
        }
    }

    /// Whether this build contains the encoder (NVENC may still fail at run time without
    /// the NVIDIA library).
    pub fn compiled_in(self) -> bool {
        match self {
            EncoderKind::OpenH264 => true,
            EncoderKind::X264 | EncoderKind::Nvenc => cfg!(feature = "ffmpeg"),
        }
    }

    /// The encoders this build contains.
    pub fn available() -> Vec<EncoderKind> {
        [EncoderKind::OpenH264, EncoderKind::X264, EncoderKind::Nvenc].into_iter().filter(|k| k.compiled_in()).collect()
    }
}

impl std::fmt::Display for EncoderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EncoderKind {
    type Err = MediaError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "openh264" => Ok(EncoderKind::OpenH264),
            "x264" | "libx264" => Ok(EncoderKind::X264),
            "nvenc" | "h264_nvenc" => Ok(EncoderKind::Nvenc),
            other => Err(MediaError::InvalidInput(format!("unknown encoder '{other}' (openh264, x264, nvenc)"))),
        }
    }
}

/// Frames from one IDR to the next (the GOP): 2 s, so that a file is seekable and a stream's
/// fragments (one per GOP) are a couple of seconds long. Every encoder backend uses it.
pub fn idr_period(fps: FrameRate) -> u32 {
    (2.0 * fps.hz()).round().max(1.0) as u32
}

/// What [`VideoWriter::finish`] and [`FragmentedWriter::finish`](crate::FragmentedWriter::finish) report.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoStats {
    /// Video frames written.
    pub frames: u64,
    /// Size of the MP4 file (or stream) in bytes.
    pub bytes: u64,
    /// `moof`+`mdat` fragments written: one per GOP in a fragmented MP4, 0 in a progressive one.
    pub fragments: u64,
    /// Encoder name, e.g. `openh264`.
    pub encoder: String,
    /// Seconds spent in the video encoder (conversion to the encoder's input included,
    /// muxing excluded).
    pub encode_s: f64,
    /// Seconds spent encoding the audio track.
    pub audio_encode_s: f64,
    pub width: u32,
    pub height: u32,
    pub fps: FrameRate,
    pub has_audio: bool,
}

/// Target bit rate: 0.1 bit per pixel per frame, at least 500 kb/s.
fn target_bitrate(width: u32, height: u32, fps: FrameRate) -> u32 {
    let bps = width as f64 * height as f64 * fps.hz() / 10.0;
    bps.clamp(500_000.0, 20_000_000.0) as u32
}

struct OpenH264Enc {
    enc: Encoder,
    width: usize,
    height: usize,
    u: Vec<u8>,
    v: Vec<u8>,
}

impl OpenH264Enc {
    fn new(width: u32, height: u32, fps: FrameRate) -> Result<Self> {
        let config = EncoderConfig::new()
            .bitrate(BitRate::from_bps(target_bitrate(width, height, fps)))
            .max_frame_rate(openh264::encoder::FrameRate::from_hz(fps.hz() as f32))
            // OpenH264's rate control only works with frame skipping, which would break the
            // frame count; without rate control it encodes at its base QP (26).
            .rate_control_mode(RateControlMode::Off)
            .usage_type(UsageType::CameraVideoRealTime)
            // Every input frame must come out: the frame count is part of the contract.
            .skip_frames(false)
            .intra_frame_period(IntraFramePeriod::from_num_frames(idr_period(fps)))
            // IDRs on the period only: scene-change detection would add some (a smooth moving
            // test pattern set one off at frame 17), and a stream's fragments follow the IDRs.
            .scene_change_detect(false)
            // NV12 of this project is BT.709 limited range (docs/design.md, the kernels' mathematics).
            .vui(VuiConfig::bt709());
        let enc = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| MediaError::Encode { encoder: "openh264".into(), detail: crate::demux::openh264_error(&e) })?;
        let (w, h) = (width as usize, height as usize);
        Ok(OpenH264Enc { enc, width: w, height: h, u: vec![0; w * h / 4], v: vec![0; w * h / 4] })
    }

    fn encode(&mut self, nv12: &[u8], mux: &mut dyn AccessUnitSink) -> Result<()> {
        let (w, h) = (self.width, self.height);
        let (y, uv) = nv12.split_at(w * h);
        // OpenH264 takes I420: de-interleave NV12's UV plane (one pass over w*h/2 bytes).
        for ((pair, u), v) in uv.chunks_exact(2).zip(&mut self.u).zip(&mut self.v) {
            *u = pair[0];
            *v = pair[1];
        }
        let src = YUVSlices::new((y, &self.u, &self.v), (w, h), (w, w / 2, w / 2));
        let bs = self
            .enc
            .encode(&src)
            .map_err(|e| MediaError::Encode { encoder: "openh264".into(), detail: crate::demux::openh264_error(&e) })?;
        let keyframe = matches!(bs.frame_type(), FrameType::IDR);
        let layers: Vec<_> = (0..bs.num_layers()).filter_map(|l| bs.layer(l)).collect();
        let mut nals: Vec<&[u8]> = Vec::new();
        for layer in &layers {
            for i in 0..layer.nal_count() {
                if let Some(nal) = layer.nal_unit(i) {
                    nals.push(strip_start_code(nal));
                }
            }
        }
        mux.push_access_unit(&nals, keyframe)
    }
}

/// Removes a leading Annex B start code (00 00 01 or 00 00 00 01).
fn strip_start_code(nal: &[u8]) -> &[u8] {
    if nal.starts_with(&[0, 0, 0, 1]) {
        &nal[4..]
    } else if nal.starts_with(&[0, 0, 1]) {
        &nal[3..]
    } else {
        nal
    }
}

/// Splits an Annex B byte stream into NAL units. Hand-written (a dozen lines): only the
/// ffmpeg encoders' packets need it, and a parsing crate would add nothing here.
#[cfg_attr(not(feature = "ffmpeg"), allow(dead_code))]
pub(crate) fn split_annex_b(data: &[u8]) -> Vec<&[u8]> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 3 <= data.len() {
        if data[i] == 0 && data[i + 1] == 0 && data[i + 2] == 1 {
            starts.push(i + 3);
            i += 3;
        } else {
            i += 1;
        }
    }
    let mut nals = Vec::with_capacity(starts.len());
    for (k, &s) in starts.iter().enumerate() {
        let mut e = if k + 1 < starts.len() { starts[k + 1] - 3 } else { data.len() };
        // A 4-byte start code leaves its leading zero (and trailing_zero bytes) behind.
        while e > s && data[e - 1] == 0 {
            e -= 1;
        }
        if e > s {
            nals.push(&data[s..e]);
        }
    }
    nals
}

enum Backend {
    OpenH264(Box<OpenH264Enc>),
    #[cfg(feature = "ffmpeg")]
    Ffmpeg(Box<crate::ffmpeg_enc::FfmpegEnc>),
}

/// An H.264 encoder of NV12 frames with the checks both writers share (frame size, rate, buffer
/// length, encoder in the build), handing access units to a muxer.
pub(crate) struct VideoEncoder {
    backend: Backend,
    pub width: u32,
    pub height: u32,
    pub fps: FrameRate,
    pub kind: EncoderKind,
    /// Seconds spent in the encoder so far.
    pub encode_s: f64,
}

impl VideoEncoder {
    /// The statistics of a finished file or stream written from this encoder's output.
    pub(crate) fn stats(
        &self,
        frames: u64,
        bytes: u64,
        fragments: u64,
        audio_encode_s: f64,
        has_audio: bool,
    ) -> VideoStats {
        VideoStats {
            frames,
            bytes,
            fragments,
            encoder: self.kind.name().to_string(),
            encode_s: self.encode_s,
            audio_encode_s,
            width: self.width,
            height: self.height,
            fps: self.fps,
            has_audio,
        }
    }

    /// `width` and `height` must be even, at least 16, and pass [`check_frame_size`]; `fps` in (0, 240].
    pub fn new(width: u32, height: u32, fps: FrameRate, encoder: EncoderKind) -> Result<Self> {
        if !width.is_multiple_of(2) || !height.is_multiple_of(2) {
            return Err(MediaError::InvalidInput(format!(
                "frame size {width}x{height}: width and height must be even (NV12 / 4:2:0)"
            )));
        }
        if width < 16 || height < 16 {
            return Err(MediaError::InvalidInput(format!(
                "frame size {width}x{height}: each side must be at least 16"
            )));
        }
        check_frame_size(width, height).map_err(|e| MediaError::InvalidInput(format!("frame size {e}")))?;
        if fps.num == 0 || fps.den == 0 || fps.hz() > 240.0 {
            return Err(MediaError::InvalidInput(format!("frame rate {fps}: must be above 0 and at most 240")));
        }
        if !encoder.compiled_in() {
            return Err(MediaError::EncoderUnavailable(format!(
                "encoder '{encoder}' is not in this build: rebuild with `--features ffmpeg` \
                 (see media/README.md), or use openh264"
            )));
        }
        let backend = match encoder {
            EncoderKind::OpenH264 => Backend::OpenH264(Box::new(OpenH264Enc::new(width, height, fps)?)),
            #[cfg(feature = "ffmpeg")]
            EncoderKind::X264 | EncoderKind::Nvenc => Backend::Ffmpeg(Box::new(crate::ffmpeg_enc::FfmpegEnc::new(
                encoder,
                width,
                height,
                fps,
                target_bitrate(width, height, fps),
            )?)),
            #[cfg(not(feature = "ffmpeg"))]
            _ => unreachable!("checked by compiled_in"),
        };
        Ok(VideoEncoder { backend, width, height, fps, kind: encoder, encode_s: 0.0 })
    }

    pub fn frame_len(&self) -> usize {
        self.width as usize * self.height as usize * 3 / 2
    }

    pub fn encode(&mut self, frame: &[u8], sink: &mut dyn AccessUnitSink) -> Result<()> {
        if frame.len() != self.frame_len() {
            return Err(MediaError::InvalidInput(format!(
                "NV12 frame has {} bytes, expected {} for {}x{}",
                frame.len(),
                self.frame_len(),
                self.width,
                self.height
            )));
        }
        let t = Instant::now();
        let r = match &mut self.backend {
            Backend::OpenH264(e) => e.encode(frame, sink),
            #[cfg(feature = "ffmpeg")]
            Backend::Ffmpeg(e) => e.encode(frame, sink),
        };
        self.encode_s += t.elapsed().as_secs_f64();
        r
    }

    /// Hands out the frames an encoder with delay still holds.
    pub fn flush(&mut self, sink: &mut dyn AccessUnitSink) -> Result<()> {
        let t = Instant::now();
        let r = match &mut self.backend {
            Backend::OpenH264(_) => {
                let _ = sink;
                Ok(())
            }
            #[cfg(feature = "ffmpeg")]
            Backend::Ffmpeg(e) => e.flush(sink),
        };
        self.encode_s += t.elapsed().as_secs_f64();
        r
    }
}

/// Writes H.264 video from NV12 frames, with an optional AAC audio track, to a progressive MP4
/// file (`moov` at the end): the default for files. For a live stream, or a file that must be
/// playable while it is being written, see [`FragmentedWriter`](crate::FragmentedWriter).
///
/// The file is written in place; the caller renames a temporary file if it wants atomicity.
/// Dropping a writer without [`finish`](VideoWriter::finish) leaves an unplayable file.
pub struct VideoWriter {
    enc: VideoEncoder,
    mux: Mp4Muxer,
    audio_encode_s: f64,
    has_audio: bool,
}

impl VideoWriter {
    /// Creates `path` and the encoder. `width` and `height` even, at least 16, in a size
    /// [`check_frame_size`] passes;
    /// `fps` in (0, 240]. The audio (if any) is AAC-encoded here and written first.
    pub fn create(
        path: impl AsRef<Path>,
        width: u32,
        height: u32,
        fps: FrameRate,
        encoder: EncoderKind,
        audio: Option<&Audio>,
    ) -> Result<Self> {
        let path = path.as_ref();
        let enc = VideoEncoder::new(width, height, fps, encoder)?;
        let t = Instant::now();
        let aac = match audio {
            Some(a) if a.track.frames() > 0 => Some(crate::aac::encode(&a.track)?),
            _ => None,
        };
        let audio_encode_s = t.elapsed().as_secs_f64();
        let has_audio = aac.is_some();
        let mux = Mp4Muxer::create(path, width, height, fps, encoder.name(), aac)?;
        Ok(VideoWriter { enc, mux, audio_encode_s, has_audio })
    }

    /// Bytes of one NV12 frame: `width * height * 3 / 2`.
    pub fn frame_len(&self) -> usize {
        self.enc.frame_len()
    }

    /// Encodes one NV12 frame: the Y plane (`width*height` bytes), then `height/2` rows of
    /// interleaved U,V (`width` bytes each).
    pub fn push_nv12(&mut self, frame: &[u8]) -> Result<()> {
        self.enc.encode(frame, &mut self.mux)
    }

    /// Frames pushed so far that have reached the file (encoders with delay may lag).
    pub fn frames_written(&self) -> u64 {
        self.mux.frames()
    }

    /// Flushes the encoder, writes the MP4 index, closes the file.
    pub fn finish(mut self) -> Result<VideoStats> {
        self.enc.flush(&mut self.mux)?;
        let frames = self.mux.frames();
        let bytes = self.mux.finish()?;
        Ok(self.enc.stats(frames, bytes, 0, self.audio_encode_s, self.has_audio))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annex_b_split() {
        let data = [0, 0, 0, 1, 0x67, 1, 2, 0, 0, 1, 0x68, 3, 0, 0, 0, 1, 0x65, 4, 5];
        let nals = split_annex_b(&data);
        assert_eq!(nals, vec![&[0x67, 1, 2][..], &[0x68, 3][..], &[0x65, 4, 5][..]]);
    }

    #[test]
    fn encoder_names_round_trip() {
        for k in [EncoderKind::OpenH264, EncoderKind::X264, EncoderKind::Nvenc] {
            assert_eq!(k.name().parse::<EncoderKind>().unwrap(), k);
        }
        assert!("vp9".parse::<EncoderKind>().is_err());
    }
}
