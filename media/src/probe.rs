//! Reads back an MP4's `moov` (with `mp4-atom`) and summarises it, so tests can check outputs
//! without ffprobe. Top-level boxes other than `moov` (e.g. a large `mdat`) are skipped by
//! seeking, not read; in a fragmented file the `moof`s are read too (by [`crate::Mp4Reader`]),
//! since the samples are there.

use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};
use std::path::Path;

use mp4_atom::{Atom, Codec, Header, Moov, ReadAtom, ReadFrom, StszSamples, Trak};

use crate::error::{io_err, MediaError, Result};

/// Summary of an MP4 file.
#[derive(Debug, Clone, PartialEq)]
pub struct Mp4Info {
    /// `h264`, `hevc`, `vp9`, `av1`, or the sample entry's four-character code.
    pub video_codec: String,
    pub width: u32,
    pub height: u32,
    /// Frames per second from the sample durations.
    pub fps: f64,
    /// Number of video samples (frames).
    pub frames: u64,
    /// Video track duration in seconds.
    pub duration_s: f64,
    pub has_audio: bool,
    /// `aac`, `mp3`, `opus`, `flac`, ... of the first audio track.
    pub audio_codec: Option<String>,
    pub audio_sample_rate: Option<u32>,
    pub audio_channels: Option<u16>,
    /// Number of IDR/sync samples in the video track (all frames when there is no `stss`).
    pub keyframes: u64,
}

fn codec_name(c: &Codec) -> String {
    match c {
        Codec::Avc1(_) | Codec::Avc3(_) => "h264".into(),
        Codec::Hev1(_) | Codec::Hvc1(_) => "hevc".into(),
        Codec::Vp08(_) => "vp8".into(),
        Codec::Vp09(_) => "vp9".into(),
        Codec::Av01(_) => "av1".into(),
        Codec::Mp4a(m) => match m.es_desc_oti() {
            0x40 | 0x66 | 0x67 | 0x68 => "aac".into(),
            0x69 | 0x6B => "mp3".into(),
            other => format!("mp4a(oti 0x{other:02x})"),
        },
        Codec::Mp3(_) => "mp3".into(),
        Codec::Opus(_) => "opus".into(),
        Codec::Flac(_) => "flac".into(),
        Codec::Ac3(_) => "ac3".into(),
        Codec::Eac3(_) => "eac3".into(),
        Codec::Unknown(kind, _) => kind.to_string(),
        other => format!("{other:?}").chars().take_while(|c| c.is_alphanumeric()).collect::<String>().to_lowercase(),
    }
}

trait OtiExt {
    fn es_desc_oti(&self) -> u8;
}
impl OtiExt for mp4_atom::Mp4a {
    fn es_desc_oti(&self) -> u8 {
        self.esds.es_desc.dec_config.object_type_indication
    }
}

fn sample_count(t: &Trak) -> u64 {
    match &t.mdia.minf.stbl.stsz.samples {
        StszSamples::Identical { count, .. } => *count as u64,
        StszSamples::Different { sizes } => sizes.len() as u64,
    }
}

/// Reads `path`'s `moov` box (skipping other top-level boxes by seeking); also returns the open
/// file and its length for readers of the samples.
pub(crate) fn read_moov(path: &Path) -> Result<(Moov, File, u64)> {
    let err = |detail: String| MediaError::Mp4 { path: path.display().to_string(), detail };
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let len = file.metadata().map_err(|e| io_err(path, e))?.len();
    let mut r = BufReader::new(file);
    let mut moov = None;
    loop {
        let pos = r.stream_position().map_err(|e| io_err(path, e))?;
        if pos >= len {
            break;
        }
        let header =
            <Option<Header>>::read_from(&mut r).map_err(|e| err(format!("bad box header at byte {pos}: {e}")))?;
        let Some(header) = header else { break };
        if header.kind == Moov::KIND {
            moov = Some(Moov::read_atom(&header, &mut r).map_err(|e| err(format!("bad moov: {e}")))?);
            break;
        }
        match header.size {
            Some(size) => {
                let body = r.stream_position().map_err(|e| io_err(path, e))?;
                if body.checked_add(size as u64).is_none_or(|end| end > len) {
                    return Err(err(format!(
                        "box '{}' at byte {pos} runs past the end of the file (truncated?)",
                        header.kind
                    )));
                }
                r.seek(SeekFrom::Start(body.saturating_add(size as u64))).map_err(|e| io_err(path, e))?;
            }
            None => break,
        }
    }
    let moov = moov.ok_or_else(|| err("no moov box (not an MP4, or unfinished)".into()))?;
    Ok((moov, r.into_inner(), len))
}

/// Reads `path`'s `moov` box and summarises its first video track and first audio track.
pub fn probe(path: impl AsRef<Path>) -> Result<Mp4Info> {
    let path = path.as_ref();
    let err = |detail: String| MediaError::Mp4 { path: path.display().to_string(), detail };
    let (moov, _, _) = read_moov(path)?;

    let video =
        moov.trak.iter().find(|t| t.mdia.hdlr.handler == b"vide".into()).ok_or_else(|| err("no video track".into()))?;
    let codec =
        video.mdia.minf.stbl.stsd.codecs.first().ok_or_else(|| err("video track has no sample description".into()))?;
    let (width, height) = match codec.visual() {
        Some(v) => (v.width as u32, v.height as u32),
        None => (video.tkhd.width.integer() as u32, video.tkhd.height.integer() as u32),
    };
    let ts = video.mdia.mdhd.timescale as f64;
    let (frames, total, fps, keyframes) = if moov.mvex.is_some() {
        // A fragmented file: the samples are in the fragments, which the reader walks.
        let samples = crate::demux::Mp4Reader::open(path)?.track_samples(video)?.samples;
        let frames = samples.len() as u64;
        let total: u64 = samples.iter().map(|s| s.duration as u64).sum();
        let fps = match samples.first() {
            Some(s) if s.duration > 0 && samples.iter().all(|t| t.duration == s.duration) => ts / s.duration as f64,
            _ if total > 0 => frames as f64 * ts / total as f64,
            _ => 0.0,
        };
        (frames, total, fps, samples.iter().filter(|s| s.sync).count() as u64)
    } else {
        let frames = sample_count(video);
        let total: u64 =
            video.mdia.minf.stbl.stts.entries.iter().map(|e| e.sample_count as u64 * e.sample_delta as u64).sum();
        let fps = match video.mdia.minf.stbl.stts.entries.as_slice() {
            [one] if one.sample_delta > 0 => ts / one.sample_delta as f64,
            _ if total > 0 => frames as f64 * ts / total as f64,
            _ => 0.0,
        };
        let keyframes = match &video.mdia.minf.stbl.stss {
            Some(s) => s.entries.len() as u64,
            None => frames,
        };
        (frames, total, fps, keyframes)
    };

    let audio = moov.trak.iter().find(|t| t.mdia.hdlr.handler == b"soun".into());
    let (audio_codec, audio_sample_rate, audio_channels) = match audio {
        Some(t) => {
            let c = t.mdia.minf.stbl.stsd.codecs.first();
            (
                Some(c.map(codec_name).unwrap_or_else(|| "unknown".into())),
                Some(t.mdia.mdhd.timescale),
                c.and_then(|c| c.audio()).map(|a| a.channel_count),
            )
        }
        None => (None, None, None),
    };

    Ok(Mp4Info {
        video_codec: codec_name(codec),
        width,
        height,
        fps,
        frames,
        duration_s: if ts > 0.0 { total as f64 / ts } else { 0.0 },
        has_audio: audio.is_some(),
        audio_codec,
        audio_sample_rate,
        audio_channels,
        keyframes,
    })
}
