//! Reads an MP4's tracks back in Rust: each track's samples (offsets and sizes from
//! `stsz`/`stsc`/`stco`/`co64` in a progressive file, from the `moof`/`traf`/`trun` boxes of a
//! fragmented one; all checked against the file), H.264 video decoded with OpenH264 into NV12
//! frames, AAC audio decoded with FDK AAC with the edit list applied. The tests use it to check
//! cadence's own output without ffmpeg; it reads any MP4 with an `avc1` video track (no B-frames
//! reordering is needed for OpenH264's baseline/constrained output, and the decoder returns
//! frames in decode order, which is presentation order for such streams).
//!
//! Everything read from the file is untrusted: sizes and counts are checked before anything is
//! allocated from them (every sample must lie inside the file, so the number of samples, over the
//! sample table and all fragments together, is bounded by the file size).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use mp4_atom::{Atom, Codec, Header, Moof, Moov, ReadAtom, ReadFrom, StszSamples, Trak};
use openh264::decoder::Decoder;
use openh264::formats::YUVSource;

use crate::error::{io_err, MediaError, Result};

/// Where one sample lies in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleRef {
    pub offset: u64,
    pub size: u32,
}

/// One sample of a track: where it lies and when it is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub offset: u64,
    pub size: u32,
    /// Decode time in the track's timescale.
    pub time: u64,
    /// Duration in the track's timescale.
    pub duration: u32,
    /// A sync sample (an IDR picture; every AAC access unit).
    pub sync: bool,
    /// Index of the `moof` (in file order) the sample is in; `None` for the `moov`'s table.
    pub fragment: Option<u32>,
}

/// A track's samples in decode order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackSamples {
    /// Units per second of the times and durations.
    pub timescale: u32,
    pub samples: Vec<Sample>,
}

/// The samples of one `traf`, resolved against its defaults and checked against the file.
#[derive(Debug)]
struct FragmentRun {
    track_id: u32,
    fragment: u32,
    /// `tfdt`: the decode time of the first sample, when given.
    base_time: Option<u64>,
    /// (offset, size, duration, flags)
    samples: Vec<(u64, u32, u32, u32)>,
    /// The samples' composition time offsets (`trun`), where the run gives them.
    composition_offsets: Vec<i64>,
}

/// An open MP4 file with its `moov` parsed, and its fragments' sample references when it is
/// fragmented.
pub struct Mp4Reader {
    path: PathBuf,
    file: File,
    len: u64,
    moov: Moov,
    fragments: u32,
    runs: Vec<FragmentRun>,
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
        let mut r = Self { path: path.to_path_buf(), file, len, moov, fragments: 0, runs: Vec::new() };
        if r.moov.mvex.is_some() {
            r.read_fragments()?;
        }
        Ok(r)
    }

    pub fn moov(&self) -> &Moov {
        &self.moov
    }

    /// Whether the file is fragmented (its `moov` has an `mvex`).
    pub fn is_fragmented(&self) -> bool {
        self.moov.mvex.is_some()
    }

    /// Number of `moof` fragments.
    pub fn fragments(&self) -> usize {
        self.fragments as usize
    }

    fn err(&self, detail: impl Into<String>) -> MediaError {
        MediaError::Mp4 { path: self.path.display().to_string(), detail: detail.into() }
    }

    fn track(&self, handler: &[u8; 4]) -> Option<&Trak> {
        self.moov.trak.iter().find(|t| t.mdia.hdlr.handler == (*handler).into())
    }

    /// Walks the top-level boxes and resolves every `traf` of every `moof` into sample
    /// references. A box that runs past the end of the file (a stream cut inside a fragment) is
    /// an error, as in a progressive file.
    fn read_fragments(&mut self) -> Result<()> {
        let len = self.len;
        let mut r = BufReader::new(&self.file);
        r.seek(SeekFrom::Start(0)).map_err(|e| io_err(&self.path, e))?;
        let mut runs = Vec::new();
        // Every sample is at least a byte of the file: the samples of all fragments together
        // cannot outnumber the file's bytes, whatever the fragments' counts claim.
        let mut budget = len;
        let mut fragments = 0u32;
        loop {
            let pos = r.stream_position().map_err(|e| io_err(&self.path, e))?;
            if pos >= len {
                break;
            }
            let header = <Option<Header>>::read_from(&mut r)
                .map_err(|e| self.err(format!("bad box header at byte {pos}: {e}")))?;
            let Some(header) = header else { break };
            let body = r.stream_position().map_err(|e| io_err(&self.path, e))?;
            let size = match header.size {
                Some(size) => size as u64,
                // A last box without a size runs to the end of the file.
                None => len - body,
            };
            if body.checked_add(size).is_none_or(|end| end > len) {
                return Err(
                    self.err(format!("box '{}' at byte {pos} runs past the end of the file (truncated?)", header.kind))
                );
            }
            if header.kind == Moof::KIND {
                let header = Header { kind: header.kind, size: Some(size as usize) };
                let moof =
                    Moof::read_atom(&header, &mut r).map_err(|e| self.err(format!("bad moof at byte {pos}: {e}")))?;
                resolve_moof(&self.moov, &moof, pos, fragments, len, &mut budget, &mut runs)
                    .map_err(|d| self.err(format!("fragment {fragments} (byte {pos}): {d}")))?;
                fragments += 1;
            }
            r.seek(SeekFrom::Start(body + size)).map_err(|e| io_err(&self.path, e))?;
        }
        self.fragments = fragments;
        self.runs = runs;
        Ok(())
    }

    /// The samples of `trak`: those of its sample table, then those of the fragments in file
    /// order, with decode times (a fragment's `tfdt` where given, else continuing from the
    /// previous sample) and sync flags (`stss`, or the fragment's sample flags).
    pub fn track_samples(&self, trak: &Trak) -> Result<TrackSamples> {
        self.track_samples_checked(trak).map_err(|d| self.err(d))
    }

    fn track_samples_checked(&self, trak: &Trak) -> std::result::Result<TrackSamples, String> {
        let refs = sample_table(trak, self.len)?;
        let stbl = &trak.mdia.minf.stbl;
        let mut samples = Vec::with_capacity(refs.len());
        let mut time = 0u64;
        let mut durations =
            stbl.stts.entries.iter().flat_map(|e| std::iter::repeat_n(e.sample_delta, e.sample_count as usize));
        for r in &refs {
            let duration = durations
                .next()
                .ok_or_else(|| format!("stts gives durations for {} of the {} samples", samples.len(), refs.len()))?;
            samples.push(Sample { offset: r.offset, size: r.size, time, duration, sync: true, fragment: None });
            time = time.checked_add(duration as u64).ok_or("sample times overflow")?;
        }
        if let Some(stss) = &stbl.stss {
            samples.iter_mut().for_each(|s| s.sync = false);
            for &n in &stss.entries {
                if let Some(s) = (n as usize).checked_sub(1).and_then(|i| samples.get_mut(i)) {
                    s.sync = true;
                }
            }
        }
        let id = trak.tkhd.track_id;
        for run in self.runs.iter().filter(|r| r.track_id == id) {
            if let Some(t) = run.base_time {
                time = t;
            }
            for &(offset, size, duration, flags) in &run.samples {
                let sync = flags & NON_SYNC_FLAG == 0;
                samples.push(Sample { offset, size, time, duration, sync, fragment: Some(run.fragment) });
                time = time.checked_add(duration as u64).ok_or("sample times overflow")?;
            }
        }
        Ok(TrackSamples { timescale: trak.mdia.mdhd.timescale, samples })
    }

    /// Whether OpenH264's decoder can decode `trak`'s H.264, judged from the container before
    /// any frame is decoded: the profile must be 8-bit 4:2:0 (Baseline, Main, Extended or High;
    /// not High 10, High 4:2:2 or High 4:4:4) and the frames stored in display order. B-frames
    /// (x264's and ffmpeg's default) store frames out of order, which shows as composition
    /// offsets (`ctts`, or a fragment's `trun`) that differ from frame to frame; OpenH264 hands
    /// frames back in decode order and fails on such streams. The error names what was found
    /// and how to re-encode.
    pub fn check_h264_decodable(&self, trak: &Trak) -> std::result::Result<(), String> {
        let avcc = match trak.mdia.minf.stbl.stsd.codecs.first() {
            Some(Codec::Avc1(a)) => &a.avcc,
            _ => return Ok(()),
        };
        let profile = h264_profile_name(avcc.avc_profile_indication);
        const REENCODE: &str = "re-encode it, e.g. `ffmpeg -i IN -c:v libx264 -bf 0 -pix_fmt yuv420p OUT.mp4`";
        if !matches!(avcc.avc_profile_indication, 66 | 77 | 88 | 100) {
            return Err(format!(
                "the video is H.264 {profile} profile; cadence's decoder (OpenH264) decodes 8-bit 4:2:0 \
                 H.264 only (Baseline, Main or High): {REENCODE}"
            ));
        }
        let stbl = &trak.mdia.minf.stbl;
        let from_table =
            stbl.ctts.iter().flat_map(|c| &c.entries).filter(|e| e.sample_count > 0).map(|e| e.sample_offset);
        let id = trak.tkhd.track_id;
        let from_runs =
            self.runs.iter().filter(|r| r.track_id == id).flat_map(|r| r.composition_offsets.iter().copied());
        let mut offsets = from_table.chain(from_runs);
        let reordered = offsets.next().is_some_and(|first| offsets.any(|o| o != first));
        if reordered {
            return Err(format!(
                "the video is H.264 {profile} profile with B-frames (frames stored out of display order), \
                 which cadence's decoder (OpenH264) does not decode: {REENCODE}"
            ));
        }
        Ok(())
    }

    /// The first video track's samples.
    pub fn video_samples(&self) -> Result<TrackSamples> {
        let trak = self.track(b"vide").ok_or_else(|| self.err("no video track"))?;
        self.track_samples(trak)
    }

    /// The first audio track's samples; `None` without an audio track.
    pub fn audio_samples(&self) -> Result<Option<TrackSamples>> {
        self.track(b"soun").map(|t| self.track_samples(t)).transpose()
    }

    fn read_sample(&mut self, s: &Sample, buf: &mut Vec<u8>) -> Result<()> {
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
        self.check_h264_decodable(&trak).map_err(|d| self.err(d))?;
        let samples = self.track_samples(&trak)?.samples;
        let mut decoder = Decoder::new().map_err(|e| self.err(format!("OpenH264 decoder: {}", openh264_error(&e))))?;
        let mut annexb = Vec::new();
        for ps in avcc.sequence_parameter_sets.iter().chain(&avcc.picture_parameter_sets) {
            annexb.extend_from_slice(&[0, 0, 0, 1]);
            annexb.extend_from_slice(ps);
        }
        let mut size = None;
        let mut nv12 = Vec::new();
        let mut sample = Vec::new();
        for (i, s) in samples.iter().enumerate() {
            self.read_sample(s, &mut sample)?;
            length_prefixed_to_annexb(&sample, length_size, &mut annexb)
                .map_err(|d| self.err(format!("video sample {i}: {d}")))?;
            let decoded = decoder
                .decode(&annexb)
                .map_err(|e| self.err(format!("video sample {i}: H.264: {}", openh264_error(&e))))?;
            annexb.clear();
            if let Some(yuv) = decoded {
                size = Some(to_nv12(&yuv, &mut nv12));
                f(&nv12)?;
            }
        }
        for yuv in decoder.flush_remaining().map_err(|e| self.err(format!("H.264 flush: {}", openh264_error(&e))))? {
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
        let samples = self.track_samples(&trak)?.samples;
        let mut dec = crate::aac::Decoder::new(&asc).map_err(|e| self.err(format!("AAC: {e}")))?;
        let mut out: Vec<i16> = Vec::new();
        let mut sample = Vec::new();
        for (i, s) in samples.iter().enumerate() {
            self.read_sample(s, &mut sample)?;
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
            // In a fragmented file an edit of duration 0 runs to the end of the media: the length
            // of a stream is not known when its moov is written.
            if !(e.segment_duration == 0 && self.is_fragmented()) {
                let movie_ts = self.moov.mvhd.timescale.max(1) as u128;
                let frames = e.segment_duration as u128 * rate as u128 / movie_ts;
                keep = usize::try_from(frames).unwrap_or(usize::MAX).saturating_mul(channels as usize);
            }
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

/// An H.264 `profile_idc`'s name (ITU-T H.264 Annex A).
fn h264_profile_name(profile_idc: u8) -> String {
    match profile_idc {
        66 => "Baseline".into(),
        77 => "Main".into(),
        88 => "Extended".into(),
        100 => "High".into(),
        110 => "High 10".into(),
        122 => "High 4:2:2".into(),
        244 => "High 4:4:4 Predictive".into(),
        44 => "CAVLC 4:4:4 Intra".into(),
        other => format!("profile_idc {other}"),
    }
}

/// An OpenH264 error as a user reads it: the library's own message where it gives one, else its
/// native code, without the debugging text its `Display` adds (the decoding-state bits,
/// "User Message:None", "Backtraces enabled.").
pub(crate) fn openh264_error(e: &openh264::Error) -> String {
    let text = e.to_string();
    let message = text.split(". User Message:").nth(1).map(|m| m.trim_end_matches(". Backtraces enabled."));
    match message {
        Some(m) if m != "None" => m.trim_start_matches("Some(").trim_end_matches(')').trim_matches('"').to_string(),
        _ => format!("OpenH264 error {}", e.native_code()),
    }
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

/// `sample_is_non_sync_sample` in a fragment's sample flags (ISO/IEC 14496-12 8.8.3.1).
const NON_SYNC_FLAG: u32 = 0x0001_0000;

/// Resolves the `traf`s of the `moof` at byte `moof_pos` into sample references, each checked
/// to lie inside the file (`file_len` bytes); `budget` is the number of samples the file can
/// still hold.
fn resolve_moof(
    moov: &Moov,
    moof: &Moof,
    moof_pos: u64,
    fragment: u32,
    file_len: u64,
    budget: &mut u64,
    runs: &mut Vec<FragmentRun>,
) -> std::result::Result<(), String> {
    let trexs = moov.mvex.as_ref().map(|m| m.trex.as_slice()).unwrap_or_default();
    // Where the previous traf's data ended: the base of a traf that names none.
    let mut prev_end = moof_pos;
    for (k, traf) in moof.traf.iter().enumerate() {
        let tfhd = &traf.tfhd;
        let id = tfhd.track_id;
        if !moov.trak.iter().any(|t| t.tkhd.track_id == id) {
            return Err(format!("traf for track {id}, which the moov does not declare"));
        }
        let trex = trexs.iter().find(|t| t.track_id == id).ok_or_else(|| format!("no trex for track {id}"))?;
        let base = match (tfhd.base_data_offset, tfhd.default_base_is_moof) {
            (Some(b), _) => b,
            (None, true) => moof_pos,
            (None, false) if k == 0 => moof_pos,
            (None, false) => prev_end,
        };
        let mut pos = base;
        let mut samples = Vec::new();
        let mut composition_offsets = Vec::new();
        for trun in &traf.trun {
            if let Some(off) = trun.data_offset {
                pos = base
                    .checked_add_signed(off as i64)
                    .ok_or_else(|| format!("track {id}: data offset {off} points before the file"))?;
            }
            let count = trun.samples.len() as u64;
            if count > *budget {
                return Err(format!(
                    "track {id}: the fragments claim more samples than the file has bytes ({file_len})"
                ));
            }
            *budget -= count;
            for e in trun.samples.iter() {
                let size = e.size.or(tfhd.default_sample_size).unwrap_or(trex.default_sample_size);
                let duration = e.duration.or(tfhd.default_sample_duration).unwrap_or(trex.default_sample_duration);
                let flags = e.flags.or(tfhd.default_sample_flags).unwrap_or(trex.default_sample_flags);
                composition_offsets.extend(e.cts);
                match pos.checked_add(size as u64).filter(|&end| end <= file_len) {
                    Some(end) if size > 0 => {
                        samples.push((pos, size, duration, flags));
                        pos = end;
                    }
                    _ => {
                        return Err(format!(
                            "track {id}: sample {} ({size} bytes at byte {pos}) lies outside the file",
                            samples.len()
                        ))
                    }
                }
            }
        }
        prev_end = pos;
        runs.push(FragmentRun {
            track_id: id,
            fragment,
            base_time: traf.tfdt.as_ref().map(|t| t.base_media_decode_time),
            samples,
            composition_offsets,
        });
    }
    Ok(())
}
