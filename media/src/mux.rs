//! MP4 (ISO BMFF) boxes for one H.264 video track and an optional AAC track, and the
//! progressive file layout. The fragmented layout (`fmux`) builds its init segment from the same
//! sample entries and tracks, so each box has one source.
//!
//! Box structures come from `mp4-atom` (full box set, read and write). Its writer-level
//! crates did not fit: the `mp4` crate's `Mp4Writer` cannot write an edit list, which the
//! AAC track needs to hide the encoder's priming samples (lip sync), and `muxide` has none
//! either. So this module lays out the file itself: `ftyp`, one `mdat` streamed to disk,
//! then `moov` built from `mp4-atom` types at the end.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use mp4_atom::{
    Audio as AudioEntry, Avc1, Avcc, Co64, Dinf, Dref, Edts, Elst, ElstEntry, Encode, Esds, Ftyp, Hdlr, Mdhd, Mdia,
    Minf, Moov, Mp4a, Mvex, Mvhd, Smhd, Stbl, Stco, Stsc, StscEntry, Stsd, Stss, Stsz, StszSamples, Stts, SttsEntry,
    Tkhd, Trak, Url, Visual, Vmhd,
};

use crate::aac::{AacConfig, EncodedAac};
use crate::error::{io_err, MediaError, Result};
use crate::video::FrameRate;

/// Movie timescale (mvhd, tkhd, elst durations): milliseconds.
pub(crate) const MOVIE_TIMESCALE: u32 = 1000;
/// Audio access units per chunk (about 1 s at 16 kHz).
const AUDIO_AUS_PER_CHUNK: usize = 16;
/// Track IDs: the video track first, the audio track second (both layouts).
pub(crate) const VIDEO_TRACK: u32 = 1;
pub(crate) const AUDIO_TRACK: u32 = 2;

/// Where an encoder backend hands its access units: the progressive or the fragmented muxer.
pub(crate) trait AccessUnitSink {
    /// One access unit given as NAL units without start codes, in decode order.
    fn push_access_unit(&mut self, nals: &[&[u8]], keyframe: bool) -> Result<()>;
}

/// The H.264 parameter sets seen so far and the conversion of access units to MP4 samples.
#[derive(Default)]
pub(crate) struct AvcSamples {
    sps: Option<Vec<u8>>,
    pps: Option<Vec<u8>>,
}

impl AvcSamples {
    /// The MP4 sample for one access unit: SPS and PPS go to the `avcC` box instead (the first of
    /// each is kept), access-unit delimiters are dropped, the rest is written length-prefixed (4
    /// bytes). Empty when the access unit holds no picture.
    pub fn sample(&mut self, nals: &[&[u8]]) -> Vec<u8> {
        let mut sample = Vec::new();
        for nal in nals {
            if nal.is_empty() {
                continue;
            }
            match nal[0] & 0x1f {
                7 => {
                    if self.sps.is_none() {
                        self.sps = Some(nal.to_vec());
                    }
                }
                8 => {
                    if self.pps.is_none() {
                        self.pps = Some(nal.to_vec());
                    }
                }
                9 => {}
                _ => {
                    sample.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                    sample.extend_from_slice(nal);
                }
            }
        }
        sample
    }

    /// The `avcC` box from the first SPS and PPS; an error before the encoder has sent them.
    pub fn avcc(&self) -> std::result::Result<Avcc, String> {
        let (Some(sps), Some(pps)) = (&self.sps, &self.pps) else {
            return Err("no frames were encoded (no SPS/PPS)".into());
        };
        Avcc::new(sps, pps).map_err(|e| format!("avcC: {e}"))
    }

    /// The RFC 6381 codec string of the stream (`avc1.` then the SPS's profile, constraint flags
    /// and level in hex), as a browser's Media Source Extensions expect it.
    pub fn codec_string(&self) -> Option<String> {
        self.sps.as_ref().filter(|s| s.len() >= 4).map(|s| format!("avc1.{:02X}{:02X}{:02X}", s[1], s[2], s[3]))
    }
}

/// The file type box. A fragmented file declares `iso5` (fragments whose data offsets count from
/// their own `moof`, as `tfhd`'s default-base-is-moof says) and `iso6`.
pub(crate) fn ftyp(fragmented: bool) -> Ftyp {
    if fragmented {
        Ftyp {
            major_brand: b"iso5".into(),
            minor_version: 512,
            compatible_brands: vec![b"iso5".into(), b"iso6".into(), b"avc1".into(), b"mp41".into()],
        }
    } else {
        Ftyp {
            major_brand: b"isom".into(),
            minor_version: 512,
            compatible_brands: vec![b"isom".into(), b"iso2".into(), b"avc1".into(), b"mp41".into()],
        }
    }
}

/// The video track's timescale and the duration of one frame in it. Whole rates keep a 1000x
/// timescale (25 fps: 25000, 1000 per frame); fractional ones use the fraction itself (29.97:
/// 30000, 1001 per frame), so every frame lasts exactly 1/fps.
pub(crate) fn video_timescale(fps: FrameRate) -> (u32, u32) {
    match fps.den {
        1 => (fps.num * 1000, 1000),
        d => (fps.num, d),
    }
}

/// The duration of `frames` audio samples (per channel) in the movie timescale: the edit that
/// plays the real audio after the encoder's priming samples.
pub(crate) fn audio_play_duration(cfg: &AacConfig, frames: u64) -> u64 {
    frames * MOVIE_TIMESCALE as u64 / cfg.sample_rate as u64
}

fn dinf() -> Dinf {
    Dinf { dref: Dref { entries: vec![Url { location: "".into() }.into()] } }
}

/// A sample table with no samples (a fragmented file's tracks: the samples are in fragments).
pub(crate) fn empty_stbl(stsd: Stsd) -> Stbl {
    Stbl {
        stsd,
        stts: Stts::default(),
        stsc: Stsc::default(),
        stsz: Stsz { samples: StszSamples::Different { sizes: Vec::new() } },
        stco: Some(Stco::default()),
        ..Default::default()
    }
}

/// The video track: its `avc1` sample entry (frame size, `avcC`) and the given sample table.
/// Durations are in the track's timescale (`media_dur`) and the movie's (`movie_dur`).
pub(crate) fn video_trak(
    (width, height): (u32, u32),
    compressor: &str,
    avcc: Avcc,
    timescale: u32,
    media_dur: u64,
    movie_dur: u64,
    stbl: impl FnOnce(Stsd) -> Stbl,
) -> Trak {
    let avc1 = Avc1 {
        visual: Visual {
            data_reference_index: 1,
            width: width as u16,
            height: height as u16,
            horizresolution: 72.into(),
            vertresolution: 72.into(),
            frame_count: 1,
            compressor: compressor.chars().take(31).collect::<String>().as_str().into(),
            depth: 24,
        },
        avcc,
        btrt: None,
        colr: None,
        pasp: None,
        taic: None,
        fiel: None,
        spatial: None,
    };
    Trak {
        tkhd: Tkhd {
            track_id: VIDEO_TRACK,
            duration: movie_dur,
            enabled: true,
            in_movie: true,
            width: (width as u16).into(),
            height: (height as u16).into(),
            ..Default::default()
        },
        mdia: Mdia {
            mdhd: Mdhd { timescale, duration: media_dur, language: "und".into(), ..Default::default() },
            hdlr: Hdlr { handler: b"vide".into(), name: "VideoHandler".into() },
            minf: Minf {
                vmhd: Some(Vmhd::default()),
                dinf: dinf(),
                stbl: stbl(Stsd { codecs: vec![avc1.into()] }),
                ..Default::default()
            },
        },
        ..Default::default()
    }
}

/// The audio track: its `mp4a`/`esds` sample entry (`buffer_size`: the largest access unit, the
/// decoder's buffer size), the edit list that starts playback after the encoder's priming
/// samples, and the given sample table. `play_dur` (movie timescale) is the edit's duration: 0
/// in a fragmented file, whose length is not known when the `moov` is written, means "to the
/// end of the media" (as ffmpeg writes and reads it).
pub(crate) fn audio_trak(
    cfg: &AacConfig,
    buffer_size: u32,
    media_dur: u64,
    play_dur: u64,
    stbl: impl FnOnce(Stsd) -> Stbl,
) -> Trak {
    let mp4a = Mp4a {
        audio: AudioEntry {
            data_reference_index: 1,
            channel_count: cfg.channels,
            sample_size: 16,
            sample_rate: (cfg.sample_rate as u16).into(),
        },
        esds: Esds {
            es_desc: mp4_atom::esds::EsDescriptor {
                es_id: AUDIO_TRACK as u16,
                depends_on_es_id: None,
                url: None,
                ocr_es_id: None,
                stream_priority: 0,
                dec_config: mp4_atom::esds::DecoderConfig {
                    object_type_indication: 0x40, // MPEG-4 Audio
                    stream_type: 5,               // audio stream
                    up_stream: 0,
                    buffer_size_db: [(buffer_size >> 16) as u8, (buffer_size >> 8) as u8, buffer_size as u8].into(),
                    max_bitrate: cfg.bitrate,
                    avg_bitrate: cfg.bitrate,
                    dec_specific: Some(mp4_atom::esds::DecoderSpecific {
                        profile: 2,
                        freq_index: cfg.freq_index,
                        chan_conf: cfg.channels as u8,
                        raw: cfg.asc.clone(),
                    }),
                },
                sl_config: mp4_atom::esds::SLConfig {},
            },
        },
        btrt: None,
        taic: None,
    };
    Trak {
        tkhd: Tkhd {
            track_id: AUDIO_TRACK,
            duration: play_dur,
            alternate_group: 1,
            enabled: true,
            in_movie: true,
            volume: 1.into(),
            ..Default::default()
        },
        // Skip the encoder's priming samples: playback starts at media time `delay`.
        edts: Some(Edts {
            elst: Some(Elst {
                entries: vec![ElstEntry {
                    segment_duration: play_dur,
                    media_time: Some(cfg.delay as u64),
                    media_rate: 1i16.into(),
                }],
            }),
        }),
        mdia: Mdia {
            mdhd: Mdhd {
                timescale: cfg.sample_rate,
                duration: media_dur,
                language: "und".into(),
                ..Default::default()
            },
            hdlr: Hdlr { handler: b"soun".into(), name: "SoundHandler".into() },
            minf: Minf {
                smhd: Some(Smhd::default()),
                dinf: dinf(),
                stbl: stbl(Stsd { codecs: vec![mp4a.into()] }),
                ..Default::default()
            },
        },
        ..Default::default()
    }
}

/// The movie box around the tracks; `mvex` (with one `trex` per track) for a fragmented file.
pub(crate) fn moov(traks: Vec<Trak>, movie_dur: u64, mvex: Option<Mvex>) -> Moov {
    Moov {
        mvhd: Mvhd {
            timescale: MOVIE_TIMESCALE,
            duration: movie_dur,
            rate: 1.into(),
            volume: 1.into(),
            next_track_id: traks.len() as u32 + 1,
            ..Default::default()
        },
        mvex,
        trak: traks,
        ..Default::default()
    }
}

struct SampleTable {
    sizes: Vec<u32>,
    /// One chunk offset per entry; `chunk_len[i]` samples in chunk i.
    chunk_offsets: Vec<u64>,
    chunk_len: Vec<u32>,
    /// 1-based sample numbers of sync samples.
    sync: Vec<u32>,
}

impl SampleTable {
    fn new() -> Self {
        SampleTable { sizes: Vec::new(), chunk_offsets: Vec::new(), chunk_len: Vec::new(), sync: Vec::new() }
    }

    fn stbl(&self, stsd: Stsd, stts: Stts, with_stss: bool) -> Stbl {
        let mut stsc = Stsc::default();
        for (i, &n) in self.chunk_len.iter().enumerate() {
            if stsc.entries.last().map(|e| e.samples_per_chunk) != Some(n) {
                stsc.entries.push(StscEntry {
                    first_chunk: i as u32 + 1,
                    samples_per_chunk: n,
                    sample_description_index: 1,
                });
            }
        }
        let (stco, co64) = if self.chunk_offsets.iter().all(|&o| o <= u32::MAX as u64) {
            (Some(Stco { entries: self.chunk_offsets.iter().map(|&o| o as u32).collect() }), None)
        } else {
            (None, Some(Co64 { entries: self.chunk_offsets.clone() }))
        };
        Stbl {
            stsd,
            stts,
            stss: with_stss.then(|| Stss { entries: self.sync.clone() }),
            stsc,
            stsz: Stsz { samples: StszSamples::Different { sizes: self.sizes.clone() } },
            stco,
            co64,
            ..Default::default()
        }
    }
}

/// Streams H.264 access units into a progressive MP4 file.
pub(crate) struct Mp4Muxer {
    path: PathBuf,
    out: BufWriter<File>,
    pos: u64,
    mdat_start: u64,
    width: u32,
    height: u32,
    fps: FrameRate,
    compressor: String,
    avc: AvcSamples,
    video: SampleTable,
    audio: Option<(EncodedAac, SampleTable)>,
}

impl Mp4Muxer {
    pub fn create(
        path: &Path,
        width: u32,
        height: u32,
        fps: FrameRate,
        compressor: &str,
        audio: Option<EncodedAac>,
    ) -> Result<Self> {
        let file = File::create(path).map_err(|e| io_err(path, e))?;
        let mut m = Mp4Muxer {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            mdat_start: 0,
            width,
            height,
            fps,
            compressor: compressor.to_string(),
            avc: AvcSamples::default(),
            video: SampleTable::new(),
            audio: None,
        };
        let mut buf = Vec::new();
        ftyp(false).encode(&mut buf).map_err(|e| m.err(e))?;
        m.write(&buf)?;
        // mdat with a 64-bit size field, patched in finish(): hand-written because
        // mp4-atom's Mdat needs the whole payload in memory, and frames are streamed.
        m.mdat_start = m.pos;
        let mut hdr = Vec::with_capacity(16);
        hdr.extend_from_slice(&1u32.to_be_bytes());
        hdr.extend_from_slice(b"mdat");
        hdr.extend_from_slice(&0u64.to_be_bytes());
        m.write(&hdr)?;

        // The whole audio track is known up front: write it first, in chunks.
        if let Some(aac) = audio {
            let mut table = SampleTable::new();
            for chunk in aac.access_units.chunks(AUDIO_AUS_PER_CHUNK) {
                table.chunk_offsets.push(m.pos);
                table.chunk_len.push(chunk.len() as u32);
                for au in chunk {
                    table.sizes.push(au.len() as u32);
                    m.write(au)?;
                }
            }
            m.audio = Some((aac, table));
        }
        Ok(m)
    }

    fn err(&self, e: impl std::fmt::Display) -> MediaError {
        MediaError::Mp4 { path: self.path.display().to_string(), detail: e.to_string() }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| io_err(&self.path, e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    pub fn frames(&self) -> u64 {
        self.video.sizes.len() as u64
    }

    /// Writes `moov`, patches the `mdat` size; returns the file size in bytes.
    pub fn finish(mut self) -> Result<u64> {
        let avcc = self.avc.avcc().map_err(|e| self.err(e))?;
        let mdat_size = self.pos - self.mdat_start;
        let n = self.video.sizes.len() as u64;
        let (video_ts, sample_delta) = video_timescale(self.fps);
        let video_media_dur = n * sample_delta as u64;
        let video_movie_dur = video_media_dur * MOVIE_TIMESCALE as u64 / video_ts as u64;
        let video_trak = video_trak(
            (self.width, self.height),
            &self.compressor,
            avcc,
            video_ts,
            video_media_dur,
            video_movie_dur,
            |stsd| {
                self.video.stbl(stsd, Stts { entries: vec![SttsEntry { sample_count: n as u32, sample_delta }] }, true)
            },
        );
        let mut traks = vec![video_trak];
        let mut movie_dur = video_movie_dur;

        if let Some((aac, table)) = &self.audio {
            let cfg = &aac.config;
            let aus = aac.access_units.len() as u64;
            let play_dur = audio_play_duration(cfg, aac.frames);
            movie_dur = movie_dur.max(play_dur);
            let max_au = table.sizes.iter().copied().max().unwrap_or(0);
            traks.push(audio_trak(cfg, max_au, aus * cfg.frame_len as u64, play_dur, |stsd| {
                table.stbl(
                    stsd,
                    Stts { entries: vec![SttsEntry { sample_count: aus as u32, sample_delta: cfg.frame_len }] },
                    false,
                )
            }));
        }

        let mut buf = Vec::new();
        moov(traks, movie_dur, None).encode(&mut buf).map_err(|e| self.err(e))?;
        self.write(&buf)?;
        let total = self.pos;
        let path = self.path.clone();
        self.out.flush().map_err(|e| io_err(&path, e))?;
        let mut file = self.out.into_inner().map_err(|e| io_err(&path, e.into_error()))?;
        file.seek(SeekFrom::Start(self.mdat_start + 8))
            .and_then(|_| file.write_all(&mdat_size.to_be_bytes()))
            .and_then(|_| file.sync_all())
            .map_err(|e| io_err(&path, e))?;
        Ok(total)
    }
}

impl AccessUnitSink for Mp4Muxer {
    fn push_access_unit(&mut self, nals: &[&[u8]], keyframe: bool) -> Result<()> {
        let sample = self.avc.sample(nals);
        if sample.is_empty() {
            return Err(self.err(format!("the encoder returned no picture for frame {}", self.video.sizes.len())));
        }
        self.video.chunk_offsets.push(self.pos);
        self.video.chunk_len.push(1);
        self.video.sizes.push(sample.len() as u32);
        if keyframe {
            self.video.sync.push(self.video.sizes.len() as u32);
        }
        self.write(&sample)
    }
}
