//! Fragmented MP4 output, for live streams: H.264 from NV12 frames and AAC from PCM that arrives
//! in pieces, written as an init segment then one `moof`+`mdat` fragment per GOP to any
//! [`Write`] (a file, standard output, a network sink). Nothing is sought back to.
//!
//! Each fragment starts with an IDR frame and holds the audio access units that start in its
//! time span (those not yet encoded when it closes go into the next one), so a player (or a
//! browser's Media Source Extensions) can start at any fragment after the init segment.
//!
//! ## What a browser's Media Source Extensions need, and where it is met
//! (W3C "ISO BMFF Byte Stream Format" for MSE; ISO/IEC 14496-12 sections below)
//! - The `codecs` parameter of the MIME type given to `addSourceBuffer`:
//!   [`FragmentedWriter::codecs`] derives `avc1.PPCCLL` from the `avcC` (profile, profile
//!   compatibility, level; RFC 6381 §3.3) and gives `mp4a.40.2` for AAC-LC.
//! - An init segment of `ftyp` + `moov` whose tracks have no samples and an `mvex` with a
//!   `trex` per track (§8.8.1, §8.8.3), then media segments of `moof` + `mdat` only. No `sidx`
//!   (§8.16.3) is written or needed: MSE appends segments in order and seeks by time.
//! - Every `tfhd` sets `default-base-is-moof` (§8.8.7; brand `iso5` in the `ftyp`), so each
//!   `trun`'s data offset counts from its own `moof` and a segment means the same wherever it
//!   is appended; every `traf` has a `tfdt` (§8.8.12) with its decode time.
//! - Every media segment starts with a sync sample (an IDR; sample flags §8.8.3.1), so
//!   playback can start at any of them.
//! - Durations are exact integers: the video timescale is the frame rate's numerator (×1000
//!   for whole rates), so 30000/1001 fps has a timescale of 30000 and 1001 per frame; the audio
//!   timescale is its sample rate, 1024 per AAC access unit. No rounding accumulates.
//! - The AAC encoder's priming samples are skipped by an edit list (§8.6.6) whose duration 0
//!   runs to the end of the media (the length is unknown when the `moov` is written). ffmpeg
//!   (5.1) reads it as a negative start time for the audio (the priming before 0) rather than
//!   trimming it; the last access unit's padding stays (at most 1023 samples).

use std::collections::VecDeque;
use std::io::Write;
use std::time::Instant;

use crate::aac::AacEncoder;
use crate::audio::AudioFormat;
use crate::error::{MediaError, Result};
use crate::fmux::FragmentMuxer;
use crate::video::{EncoderKind, FrameRate, VideoEncoder, VideoStats};

/// Writes a fragmented MP4 to `W`: the init segment (`ftyp` + `moov`) when the first frame has
/// been encoded (the `avcC` needs the encoder's parameter sets), then a fragment each time a GOP
/// is complete, that is when the next GOP's first frame is encoded, and the last one in
/// [`finish`](Self::finish).
///
/// Every segment reaches `W` as one `write_all` followed by one `flush`, and nothing else is
/// written: a sink sees whole segments at its flushes ([`SegmentQueue`] collects them for a
/// server). A stream ended early (the writer dropped, or a write failed) is, up to its last
/// flush, an init segment and whole fragments, which players and
/// [`Mp4Reader`](crate::Mp4Reader) accept; a failed write may leave part of a segment after
/// that flush. After a failed write every call fails. A file written this way is not removed on failure: write to a
/// temporary and rename it, as for [`VideoWriter`](crate::VideoWriter).
pub struct FragmentedWriter<W: Write> {
    enc: VideoEncoder,
    mux: FragmentMuxer<W>,
    aac: Option<AacEncoder>,
    audio_encode_s: f64,
}

impl<W: Write> FragmentedWriter<W> {
    /// A writer to `out`; `name` names it in error messages (a file name, `standard output`).
    /// `width` and `height` even, at least 16, in a size [`crate::check_frame_size`] passes; `fps` in (0, 240]; `audio`, if any, is the
    /// format of what [`push_audio`](Self::push_audio) will be given (an AAC rate, 1 or 2
    /// channels). Nothing is written yet.
    pub fn new(
        out: W,
        name: impl Into<String>,
        width: u32,
        height: u32,
        fps: FrameRate,
        encoder: EncoderKind,
        audio: Option<AudioFormat>,
    ) -> Result<Self> {
        let enc = VideoEncoder::new(width, height, fps, encoder)?;
        let mut mux = FragmentMuxer::new(out, name.into(), width, height, fps, encoder.name());
        let aac = match audio {
            Some(f) => {
                let aac = AacEncoder::new(f.sample_rate, f.channels)?;
                mux.set_audio(aac.config().clone());
                Some(aac)
            }
            None => None,
        };
        Ok(FragmentedWriter { enc, mux, aac, audio_encode_s: 0.0 })
    }

    /// Bytes of one NV12 frame: `width * height * 3 / 2`.
    pub fn frame_len(&self) -> usize {
        self.enc.frame_len()
    }

    /// Adds audio: interleaved 16-bit samples in the format given to [`new`](Self::new), whole
    /// sample frames, any number at a time (live input arrives in pieces). However the audio is
    /// cut, the AAC track is the same.
    pub fn push_audio(&mut self, samples: &[i16]) -> Result<()> {
        self.mux.check()?;
        let Some(aac) = &mut self.aac else {
            return Err(MediaError::InvalidInput("audio given to a stream created without an audio track".into()));
        };
        let channels = aac.config().channels as usize;
        if !samples.len().is_multiple_of(channels) {
            return Err(MediaError::InvalidInput(format!(
                "{} audio samples are not whole frames of {channels} channels",
                samples.len()
            )));
        }
        let t = Instant::now();
        let r = aac.push(samples);
        let aus = aac.take_access_units();
        self.audio_encode_s += t.elapsed().as_secs_f64();
        // Audio lost inside the encoder would shift what follows: the stream ends here.
        let r = r.and_then(|()| self.mux.push_audio(aus));
        if r.is_err() {
            self.mux.fail();
        }
        r
    }

    /// Encodes one NV12 frame (as [`VideoWriter::push_nv12`](crate::VideoWriter::push_nv12)).
    /// When it starts a new GOP, the previous GOP's fragment is written. A frame of the wrong
    /// size is refused and the stream goes on; any other failure ends it (later calls fail).
    pub fn push_nv12(&mut self, frame: &[u8]) -> Result<()> {
        self.mux.check()?;
        if frame.len() != self.frame_len() {
            return self.enc.encode(frame, &mut self.mux);
        }
        let r = self.enc.encode(frame, &mut self.mux);
        if r.is_err() {
            self.mux.fail();
        }
        r
    }

    /// Frames in the fragments written so far.
    pub fn frames_written(&self) -> u64 {
        self.mux.frames_written()
    }

    /// Fragments written so far.
    pub fn fragments_written(&self) -> u64 {
        self.mux.fragments()
    }

    /// The RFC 6381 `codecs` parameter, e.g. `avc1.42C01F, mp4a.40.2` (`avc1.` then the
    /// `avcC`'s profile, profile compatibility and level bytes in hex; `mp4a.40.2` is AAC-LC;
    /// the video codec alone for a stream without audio). Known once the init segment is out
    /// (after the first frame).
    pub fn codecs(&self) -> Option<String> {
        self.mux.codecs()
    }

    /// `video/mp4; codecs="…"` with [`codecs`](Self::codecs): what `MediaSource.isTypeSupported`
    /// and `addSourceBuffer` take.
    pub fn mime_type(&self) -> Option<String> {
        self.codecs().map(|c| format!("video/mp4; codecs=\"{c}\""))
    }

    pub fn get_ref(&self) -> &W {
        self.mux.get_ref()
    }

    /// The sink, e.g. to take the segments a [`SegmentQueue`] has collected.
    pub fn get_mut(&mut self) -> &mut W {
        self.mux.get_mut()
    }

    /// Ends the stream: flushes the encoders and writes the last fragment (the last GOP with all
    /// the audio not yet written, its last access unit padded with silence). Returns the
    /// statistics and the sink.
    pub fn finish(mut self) -> Result<(VideoStats, W)> {
        self.enc.flush(&mut self.mux)?;
        let t = Instant::now();
        let tail = match self.aac.take() {
            Some(mut aac) => {
                let mut aus = aac.take_access_units();
                aus.extend(aac.finish()?);
                aus
            }
            None => Vec::new(),
        };
        self.audio_encode_s += t.elapsed().as_secs_f64();
        let has_audio = self.mux.has_audio();
        let bytes = self.mux.finish(tail)?;
        let stats =
            self.enc.stats(self.mux.frames_written(), bytes, self.mux.fragments(), self.audio_encode_s, has_audio);
        Ok((stats, self.mux.into_inner()))
    }
}

/// A [`Write`] sink that keeps each segment a [`FragmentedWriter`] completes (everything
/// written between two flushes) as its own buffer, for a server to send on as soon as it exists:
/// `while let Some(s) = writer.get_mut().pop() { send(s) }`.
#[derive(Debug, Default)]
pub struct SegmentQueue {
    done: VecDeque<Vec<u8>>,
    open: Vec<u8>,
}

impl SegmentQueue {
    /// The oldest complete segment not yet taken.
    pub fn pop(&mut self) -> Option<Vec<u8>> {
        self.done.pop_front()
    }

    /// Complete segments not yet taken.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }
}

impl Write for SegmentQueue {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.open.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.open.is_empty() {
            self.done.push_back(std::mem::take(&mut self.open));
        }
        Ok(())
    }
}
