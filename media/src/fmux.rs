//! Fragmented MP4 layout: an init segment (`ftyp` + `moov` with `mvex`, no samples), then one
//! `moof`+`mdat` fragment per GOP. The sample entries, tracks and edit list come from `mux`, as
//! in the progressive file; only the sample tables move into the fragments (`tfhd`, `tfdt`,
//! `trun`). Each segment is built in memory and written with one `write_all` then a `flush`, so
//! that a consumer can send it on as soon as it is complete and a stream cut short still ends on
//! a whole fragment; nothing is ever sought back to, so the output can be a pipe.

use std::collections::VecDeque;
use std::io::Write;

use mp4_atom::{Atom, Encode, Header, Mdat, Mfhd, Moof, Mvex, Tfdt, Tfhd, Traf, Trex, Trun, TrunEntry};

use crate::aac::AacConfig;
use crate::error::{MediaError, Result};
use crate::mux::{self, AccessUnitSink, AvcSamples, AUDIO_TRACK, VIDEO_TRACK};
use crate::video::FrameRate;

/// `trun`/`trex` sample flags (ISO/IEC 14496-12 8.8.3.1): bits 24-25 `sample_depends_on`, bit 16
/// `sample_is_non_sync_sample`. An IDR picture or an AAC access unit depends on no other sample.
pub(crate) const SYNC_SAMPLE: u32 = 0x0200_0000;
/// A P picture: depends on earlier samples, not a sync sample.
pub(crate) const NON_SYNC_SAMPLE: u32 = 0x0101_0000;

struct AudioQueue {
    cfg: AacConfig,
    /// Access units not yet in a fragment, in order.
    pending: VecDeque<Vec<u8>>,
    /// Index in the track of `pending[0]`.
    next: u64,
}

/// Writes H.264 access units (and AAC access units) as a fragmented MP4 to `out`.
pub(crate) struct FragmentMuxer<W: Write> {
    out: W,
    name: String,
    width: u32,
    height: u32,
    fps: FrameRate,
    compressor: String,
    avc: AvcSamples,
    audio: Option<AudioQueue>,
    init_written: bool,
    /// Samples of the open fragment (one GOP so far); the first is a keyframe.
    gop: Vec<(Vec<u8>, bool)>,
    /// Frames in fragments already written.
    frames_done: u64,
    fragments: u32,
    bytes: u64,
    /// Set when a write failed: what follows could not be appended to a valid stream.
    failed: bool,
}

impl<W: Write> FragmentMuxer<W> {
    pub fn new(out: W, name: String, width: u32, height: u32, fps: FrameRate, compressor: &str) -> Self {
        FragmentMuxer {
            out,
            name,
            width,
            height,
            fps,
            compressor: compressor.to_string(),
            avc: AvcSamples::default(),
            audio: None,
            init_written: false,
            gop: Vec::new(),
            frames_done: 0,
            fragments: 0,
            bytes: 0,
            failed: false,
        }
    }

    /// Declares the audio track; before the first frame (the init segment describes it).
    pub fn set_audio(&mut self, cfg: AacConfig) {
        debug_assert!(!self.init_written);
        self.audio = Some(AudioQueue { cfg, pending: VecDeque::new(), next: 0 });
    }

    fn err(&self, detail: impl Into<String>) -> MediaError {
        MediaError::Mp4 { path: self.name.clone(), detail: detail.into() }
    }

    fn check_ok(&self) -> Result<()> {
        if self.failed {
            return Err(self.err("an earlier write failed; the stream ends at the last whole fragment"));
        }
        Ok(())
    }

    /// Writes one whole segment and flushes it.
    fn emit(&mut self, segment: &[u8]) -> Result<()> {
        match self.out.write_all(segment).and_then(|_| self.out.flush()) {
            Ok(()) => {
                self.bytes += segment.len() as u64;
                Ok(())
            }
            Err(error) => {
                self.failed = true;
                Err(MediaError::Io { path: self.name.clone(), error })
            }
        }
    }

    /// Queues encoded audio; it goes out with the fragment whose time span it starts in.
    pub fn push_audio(&mut self, aus: Vec<Vec<u8>>) -> Result<()> {
        self.check_ok()?;
        match &mut self.audio {
            Some(a) => {
                a.pending.extend(aus);
                Ok(())
            }
            None if aus.is_empty() => Ok(()),
            None => Err(self.err("audio given to a stream declared without an audio track")),
        }
    }

    /// `ftyp` + `moov`: the tracks with empty sample tables, and `mvex` saying fragments follow.
    fn init_segment(&self) -> Result<Vec<u8>> {
        let avcc = self.avc.avcc().map_err(|e| self.err(e))?;
        let (video_ts, delta) = mux::video_timescale(self.fps);
        let mut traks =
            vec![mux::video_trak((self.width, self.height), &self.compressor, avcc, video_ts, 0, 0, mux::empty_stbl)];
        let mut trex = vec![Trex {
            track_id: VIDEO_TRACK,
            default_sample_description_index: 1,
            default_sample_duration: delta,
            default_sample_size: 0,
            default_sample_flags: NON_SYNC_SAMPLE,
        }];
        if let Some(a) = &self.audio {
            // The access units are not known yet: the decoder buffer is the encoder's largest.
            traks.push(mux::audio_trak(&a.cfg, a.cfg.max_au_bytes, 0, 0, mux::empty_stbl));
            trex.push(Trex {
                track_id: AUDIO_TRACK,
                default_sample_description_index: 1,
                default_sample_duration: a.cfg.frame_len,
                default_sample_size: 0,
                default_sample_flags: SYNC_SAMPLE,
            });
        }
        let mut buf = Vec::new();
        mux::ftyp(true).encode(&mut buf).map_err(|e| self.err(e.to_string()))?;
        mux::moov(traks, 0, Some(Mvex { mehd: None, trex })).encode(&mut buf).map_err(|e| self.err(e.to_string()))?;
        Ok(buf)
    }

    /// Whether audio access unit `index` starts (after the priming the edit list skips) before
    /// video frame `frame`: exact in integers, so a fragment's audio covers the same time as its
    /// video whatever the rates.
    fn starts_before(cfg: &AacConfig, fps: FrameRate, index: u64, frame: u64) -> bool {
        let start = index as i128 * cfg.frame_len as i128 - cfg.delay as i128;
        start * (fps.num as i128) < frame as i128 * fps.den as i128 * cfg.sample_rate as i128
    }

    /// Writes the open GOP as one fragment with the audio that starts in its time span (all the
    /// queued audio when `last`).
    fn close_fragment(&mut self, last: bool) -> Result<()> {
        let (_, delta) = mux::video_timescale(self.fps);
        let first = self.frames_done;
        let end = first + self.gop.len() as u64;
        let video: Vec<(Vec<u8>, bool)> = std::mem::take(&mut self.gop);
        let fps = self.fps;
        let mut audio: Vec<Vec<u8>> = Vec::new();
        let mut audio_start = 0;
        if let Some(a) = &mut self.audio {
            audio_start = a.next;
            while !a.pending.is_empty() && (last || Self::starts_before(&a.cfg, fps, a.next, end)) {
                audio.extend(a.pending.pop_front());
                a.next += 1;
            }
        }
        let seq = self.fragments + 1;
        let mut trafs = vec![Traf {
            tfhd: Tfhd { track_id: VIDEO_TRACK, default_base_is_moof: true, ..Default::default() },
            tfdt: Some(Tfdt { base_media_decode_time: first * delta as u64 }),
            trun: vec![Trun {
                data_offset: Some(0),
                samples: video
                    .iter()
                    .map(|(s, sync)| TrunEntry {
                        duration: Some(delta),
                        size: Some(s.len() as u32),
                        flags: Some(if *sync { SYNC_SAMPLE } else { NON_SYNC_SAMPLE }),
                        cts: None,
                    })
                    .collect::<Vec<_>>()
                    .into(),
            }],
            ..Default::default()
        }];
        if let (Some(a), false) = (&self.audio, audio.is_empty()) {
            trafs.push(Traf {
                tfhd: Tfhd { track_id: AUDIO_TRACK, default_base_is_moof: true, ..Default::default() },
                tfdt: Some(Tfdt { base_media_decode_time: audio_start * a.cfg.frame_len as u64 }),
                trun: vec![Trun {
                    data_offset: Some(0),
                    samples: audio
                        .iter()
                        .map(|au| TrunEntry {
                            duration: Some(a.cfg.frame_len),
                            size: Some(au.len() as u32),
                            flags: Some(SYNC_SAMPLE),
                            cts: None,
                        })
                        .collect::<Vec<_>>()
                        .into(),
                }],
                ..Default::default()
            });
        }
        let video_bytes: usize = video.iter().map(|(s, _)| s.len()).sum();
        let audio_bytes: usize = audio.iter().map(Vec::len).sum();
        let payload = video_bytes + audio_bytes;
        let mut mdat_header = Vec::new();
        Header { kind: Mdat::KIND, size: Some(payload) }
            .encode(&mut mdat_header)
            .map_err(|e| self.err(e.to_string()))?;

        // The data offsets count from the start of the moof, whose size does not depend on their
        // values (fixed-width fields): encode once to learn it, then with the offsets.
        let mut moof = Moof { mfhd: Mfhd { sequence_number: seq }, traf: trafs };
        let mut probe = Vec::new();
        moof.encode(&mut probe).map_err(|e| self.err(e.to_string()))?;
        let video_at = probe.len() + mdat_header.len();
        let offsets = [video_at, video_at + video_bytes];
        for (traf, at) in moof.traf.iter_mut().zip(offsets) {
            let at = i32::try_from(at).map_err(|_| self.err(format!("fragment {seq} is larger than 2 GiB")))?;
            traf.trun[0].data_offset = Some(at);
        }
        let mut buf = Vec::with_capacity(probe.len() + mdat_header.len() + payload);
        moof.encode(&mut buf).map_err(|e| self.err(e.to_string()))?;
        if buf.len() != probe.len() {
            return Err(self.err("the moof changed size when its data offsets were set"));
        }
        buf.extend_from_slice(&mdat_header);
        for (s, _) in &video {
            buf.extend_from_slice(s);
        }
        for au in &audio {
            buf.extend_from_slice(au);
        }
        self.emit(&buf)?;
        self.frames_done = end;
        self.fragments = seq;
        Ok(())
    }

    /// Writes the last fragment with every queued audio unit; returns the bytes written in all.
    pub fn finish(&mut self, audio_tail: Vec<Vec<u8>>) -> Result<u64> {
        self.push_audio(audio_tail)?;
        if self.gop.is_empty() {
            self.failed = true;
            return Err(self.err("no frames were encoded"));
        }
        let r = self.close_fragment(true);
        self.failed |= r.is_err();
        r.map(|()| self.bytes)
    }

    /// Ends the stream after a failure elsewhere (an encoder error): later calls fail.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    pub fn check(&self) -> Result<()> {
        self.check_ok()
    }

    /// Frames in fragments already written.
    pub fn frames_written(&self) -> u64 {
        self.frames_done
    }

    pub fn fragments(&self) -> u64 {
        self.fragments as u64
    }

    pub fn has_audio(&self) -> bool {
        self.audio.is_some()
    }

    /// The RFC 6381 `codecs` parameter (`avc1.42C01F, mp4a.40.2`), once the first frame has
    /// given the stream's SPS.
    pub fn codecs(&self) -> Option<String> {
        let video = self.avc.codec_string()?;
        Some(match &self.audio {
            // mp4a, object type 0x40 (MPEG-4 Audio), audio object type 2 (AAC-LC).
            Some(_) => format!("{video}, mp4a.40.2"),
            None => video,
        })
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    pub fn get_ref(&self) -> &W {
        &self.out
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> AccessUnitSink for FragmentMuxer<W> {
    fn push_access_unit(&mut self, nals: &[&[u8]], keyframe: bool) -> Result<()> {
        self.check_ok()?;
        // A frame that did not make it into the stream cannot be skipped over (the next frames
        // refer to it): any failure ends the stream.
        let r = self.push_sample(nals, keyframe);
        self.failed |= r.is_err();
        r
    }
}

impl<W: Write> FragmentMuxer<W> {
    fn push_sample(&mut self, nals: &[&[u8]], keyframe: bool) -> Result<()> {
        let frame = self.frames_done + self.gop.len() as u64;
        let sample = self.avc.sample(nals);
        if sample.is_empty() {
            return Err(self.err(format!("the encoder returned no picture for frame {frame}")));
        }
        if !self.init_written {
            let init = self.init_segment()?;
            self.emit(&init)?;
            self.init_written = true;
        }
        if keyframe && !self.gop.is_empty() {
            self.close_fragment(false)?;
        }
        if self.gop.is_empty() && !keyframe {
            return Err(self.err(format!(
                "frame {frame} would start a fragment but is not a keyframe (the encoder's GOP must start with an IDR)"
            )));
        }
        self.gop.push((sample, keyframe));
        Ok(())
    }
}
