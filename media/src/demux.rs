//! Reads an MP4's tracks back in Rust: each track's sample table (offsets and sizes from
//! `stsz`/`stsc`/`stco`/`co64`, checked against the file), H.264 video decoded with OpenH264 into
//! NV12 frames, AAC audio decoded with FDK AAC with the edit list applied. The tests use it to
//! check cadence's own output without ffmpeg; it reads any progressive MP4 with an `avc1` video
//! track (no B-frames reordering is needed for OpenH264's baseline/constrained output, and the
//! decoder returns frames in decode order, which is presentation order for such streams).
//!
//! Everything read from the file is untrusted: sizes and counts are checked before anything is
//! allocated from them (every sample must lie inside the file, so the number of samples is
//! bounded by the file size).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use mp4_atom::{Codec, Moov, StszSamples, Trak};
use openh264::decoder::Decoder;
use openh264::formats::YUVSource;

use crate::error::{io_err, MediaError, Result};

/// Where one sample lies in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleRef {
    pub offset: u64,
    pub size: u32,
}

/// An open MP4 file with its `moov` parsed.
pub struct Mp4Reader {
    path: PathBuf,
    file: File,
    len: u64,
    moov: Moov,
}

/// Decoded audio: interleaved samples in [-1, 1].
#[derive(Clone, Debug)]
pub struct DecodedAudio {
    pub sample_rate: u32,
    pub channels: u16,
    pub samples: Vec<f32>,
}

impl DecodedAudio {
    /// Samples per channel.
    pub fn frames(&self) -> usize {
        self.samples.len() / self.channels.max(1) as usize
    }
    /// The first channel alone.
    pub fn first_channel(&self) -> Vec<f32> {
        self.samples.iter().step_by(self.channels.max(1) as usize).copied().collect()
    }
}

impl Mp4Reader {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let (moov, file, len) = crate::probe::read_moov(path)?;
        Ok(Self { path: path.to_path_buf(), file, len, moov })
    }

    pub fn moov(&self) -> &Moov {
        &self.moov
    }

    fn err(&self, detail: impl Into<String>) -> MediaError {
        MediaError::Mp4 { path: self.path.display().to_string(), detail: detail.into() }
    }

    fn track(&self, handler: &[u8; 4]) -> Option<&Trak> {
        self.moov.trak.iter().find(|t| t.mdia.hdlr.handler == (*handler).into())
    }

    fn read_sample(&mut self, s: SampleRef, buf: &mut Vec<u8>) -> Result<()> {
        buf.resize(s.size as usize, 0);
        self.file.seek(SeekFrom::Start(s.offset)).map_err(|e| io_err(&self.path, e))?;
        self.file.read_exact(buf).map_err(|e| io_err(&self.path, e))
    }

    /// Decodes every frame of the first video track to NV12 (`width * height * 3 / 2` bytes each).
    pub fn decode_video(&mut self) -> Result<DecodedVideo> {
        let mut frames = Vec::new();
        let (width, height) = self.for_each_video_frame(|f| {
            frames.push(f.to_vec());
            Ok(())
        })?;
        Ok(DecodedVideo { width, height, frames })
    }

    /// Decodes the first video track frame by frame, handing each NV12 frame to `f` (memory stays
    /// at one frame). Returns the frame size.
    pub fn for_each_video_frame(&mut self, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<(u32, u32)> {
        let trak = self.track(b"vide").ok_or_else(|| self.err("no video track"))?.clone();
        let avcc = match trak.mdia.minf.stbl.stsd.codecs.first() {
            Some(Codec::Avc1(a)) => a.avcc.clone(),
            Some(other) => return Err(self.err(format!("video codec {other:?} is not H.264 (avc1)"))),
            None => return Err(self.err("the video track has no sample description")),
        };
        let length_size = avcc.length_size as usize;
        if !matches!(length_size, 1 | 2 | 4) {
            return Err(self.err(format!("avcC NAL length size {length_size} (1, 2 or 4 expected)")));
        }
        let samples = sample_table(&trak, self.len).map_err(|d| self.err(d))?;
        let mut decoder = Decoder::new().map_err(|e| self.err(format!("OpenH264 decoder: {e}")))?;
        let mut annexb = Vec::new();
        for ps in avcc.sequence_parameter_sets.iter().chain(&avcc.picture_parameter_sets) {
            annexb.extend_from_slice(&[0, 0, 0, 1]);
            annexb.extend_from_slice(ps);
        }
        let mut size = None;
        let mut nv12 = Vec::new();
        let mut sample = Vec::new();
        for (i, s) in samples.iter().enumerate() {
            self.read_sample(*s, &mut sample)?;
            length_prefixed_to_annexb(&sample, length_size, &mut annexb)
                .map_err(|d| self.err(format!("video sample {i}: {d}")))?;
            let decoded = decoder.decode(&annexb).map_err(|e| self.err(format!("video sample {i}: H.264: {e}")))?;
            annexb.clear();
            if let Some(yuv) = decoded {
                size = Some(to_nv12(&yuv, &mut nv12));
                f(&nv12)?;
            }
        }
        for yuv in decoder.flush_remaining().map_err(|e| self.err(format!("H.264 flush: {e}")))? {
            size = Some(to_nv12(&yuv, &mut nv12));
            f(&nv12)?;
        }
        let (w, h) = size.ok_or_else(|| self.err("no decodable video frame"))?;
        Ok((w as u32, h as u32))
    }

    /// Decodes the first audio track (AAC), with the edit list's start offset (the encoder's
    /// priming samples) and duration applied as a player does. `None` without an audio track.
    pub fn decode_audio(&mut self) -> Result<Option<DecodedAudio>> {
        let Some(trak) = self.track(b"soun").cloned() else { return Ok(None) };
        let asc = match trak.mdia.minf.stbl.stsd.codecs.first() {
            Some(Codec::Mp4a(m)) => m
                .esds
                .es_desc
                .dec_config
                .dec_specific
                .as_ref()
                .map(|d| d.raw.clone())
                .ok_or_else(|| self.err("the AAC track has no AudioSpecificConfig"))?,
            Some(other) => return Err(self.err(format!("audio codec {other:?} is not AAC (mp4a)"))),
            None => return Err(self.err("the audio track has no sample description")),
        };
        let samples = sample_table(&trak, self.len).map_err(|d| self.err(d))?;
        let mut dec = crate::aac::Decoder::new(&asc).map_err(|e| self.err(format!("AAC: {e}")))?;
        let mut out: Vec<i16> = Vec::new();
        let mut sample = Vec::new();
        for (i, s) in samples.iter().enumerate() {
            self.read_sample(*s, &mut sample)?;
            out.extend_from_slice(dec.decode(&sample).map_err(|e| self.err(format!("audio sample {i}: {e}")))?);
        }
        let (rate, channels) = dec.format();
        if rate == 0 || channels == 0 {
            return Err(self.err("the AAC track decoded to no audio"));
        }
        // The edit list: skip `media_time` samples, keep `segment_duration` (movie timescale).
        let mut start = 0usize;
        let mut keep = usize::MAX;
        if let Some(e) = trak.edts.as_ref().and_then(|e| e.elst.as_ref()).and_then(|l| l.entries.first()) {
            let skip = e.media_time.unwrap_or(0).saturating_add(dec.output_delay() as u64);
            start = skip.min(out.len() as u64) as usize * channels as usize;
            let movie_ts = self.moov.mvhd.timescale.max(1) as u128;
            let frames = e.segment_duration as u128 * rate as u128 / movie_ts;
            keep = usize::try_from(frames).unwrap_or(usize::MAX).saturating_mul(channels as usize);
        }
        let start = start.min(out.len());
        let end = start.saturating_add(keep).min(out.len());
        let samples = out[start..end].iter().map(|&v| v as f32 / 32768.0).collect();
        Ok(Some(DecodedAudio { sample_rate: rate, channels, samples }))
    }
}

/// Decoded video: NV12 frames of `width` x `height`.
#[derive(Clone, Debug)]
pub struct DecodedVideo {
    pub width: u32,
    pub height: u32,
    pub frames: Vec<Vec<u8>>,
}

/// Copies a decoded picture (planar I420 with strides) into `out` as NV12; returns (w, h).
fn to_nv12(yuv: &impl YUVSource, out: &mut Vec<u8>) -> (usize, usize) {
    let (w, h) = yuv.dimensions();
    let (sy, su, sv) = yuv.strides();
    out.clear();
    out.reserve(w * h * 3 / 2);
    for row in yuv.y().chunks(sy).take(h) {
        out.extend_from_slice(&row[..w]);
    }
    for (ru, rv) in yuv.u().chunks(su).zip(yuv.v().chunks(sv)).take(h / 2) {
        for (&u, &v) in ru[..w / 2].iter().zip(&rv[..w / 2]) {
            out.push(u);
            out.push(v);
        }
    }
    (w, h)
}

/// Appends the NAL units of one length-prefixed (avcC) sample to `out` with Annex B start codes.
fn length_prefixed_to_annexb(sample: &[u8], length_size: usize, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let mut rest = sample;
    while !rest.is_empty() {
        if rest.len() < length_size {
            return Err(format!("{} bytes left where a {length_size}-byte NAL length is expected", rest.len()));
        }
        let (len_bytes, tail) = rest.split_at(length_size);
        let n = len_bytes.iter().fold(0usize, |acc, &b| (acc << 8) | b as usize);
        if n == 0 || n > tail.len() {
            return Err(format!("NAL unit of {n} bytes in a sample with {} bytes left", tail.len()));
        }
        out.extend_from_slice(&[0, 0, 0, 1]);
        out.extend_from_slice(&tail[..n]);
        rest = &tail[n..];
    }
    Ok(())
}

/// Each sample's offset and size from the track's sample table, checked: every sample lies inside
/// the file (`file_len` bytes) and is at least one byte long, so the table cannot claim more
/// samples than the file has bytes.
pub fn sample_table(trak: &Trak, file_len: u64) -> std::result::Result<Vec<SampleRef>, String> {
    let stbl = &trak.mdia.minf.stbl;
    let (count, fixed) = match &stbl.stsz.samples {
        StszSamples::Identical { count, size } => (*count as u64, Some(*size)),
        StszSamples::Different { sizes } => (sizes.len() as u64, None),
    };
    if count > file_len {
        return Err(format!("the sample table claims {count} samples in a file of {file_len} bytes"));
    }
    let size_of = |i: usize| match (&stbl.stsz.samples, fixed) {
        (_, Some(s)) => s,
        (StszSamples::Different { sizes }, None) => sizes[i],
        (StszSamples::Identical { size, .. }, None) => *size,
    };
    let chunks: Vec<u64> = match (&stbl.stco, &stbl.co64) {
        (Some(s), _) => s.entries.iter().map(|&o| o as u64).collect(),
        (None, Some(c)) => c.entries.clone(),
        (None, None) => return Err("the sample table has no chunk offsets (stco/co64)".into()),
    };
    let runs = &stbl.stsc.entries;
    if count > 0 && runs.first().map(|e| e.first_chunk) != Some(1) {
        return Err("stsc does not start at chunk 1".into());
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut run = 0usize;
    for (c, &chunk_offset) in chunks.iter().enumerate() {
        let chunk_no = c as u64 + 1;
        while run + 1 < runs.len() && runs[run + 1].first_chunk as u64 <= chunk_no {
            if runs[run + 1].first_chunk <= runs[run].first_chunk {
                return Err("stsc chunk numbers are not increasing".into());
            }
            run += 1;
        }
        let per_chunk = runs.get(run).map(|e| e.samples_per_chunk).unwrap_or(0);
        let mut offset = chunk_offset;
        for _ in 0..per_chunk {
            if out.len() as u64 == count {
                break;
            }
            let size = size_of(out.len());
            let end = offset.checked_add(size as u64).filter(|&e| e <= file_len);
            match end {
                Some(end) if size > 0 => {
                    out.push(SampleRef { offset, size });
                    offset = end;
                }
                _ => return Err(format!("sample {} ({size} bytes at byte {offset}) lies outside the file", out.len())),
            }
        }
    }
    if (out.len() as u64) < count {
        return Err(format!("the chunk table holds {} of the {count} samples", out.len()));
    }
    Ok(out)
}
