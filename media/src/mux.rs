//! MP4 (ISO BMFF) muxing of one H.264 video track and an optional AAC track.
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
    Minf, Moov, Mp4a, Mvhd, Smhd, Stbl, Stco, Stsc, StscEntry, Stsd, Stss, Stsz, StszSamples, Stts, SttsEntry, Tkhd,
    Trak, Url, Visual, Vmhd,
};

use crate::aac::EncodedAac;
use crate::error::{io_err, MediaError, Result};

/// Movie timescale (mvhd, tkhd, elst durations): milliseconds.
const MOVIE_TIMESCALE: u32 = 1000;
/// Audio access units per chunk (about 1 s at 16 kHz).
const AUDIO_AUS_PER_CHUNK: usize = 16;

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

fn dinf() -> Dinf {
    Dinf { dref: Dref { entries: vec![Url { location: "".into() }.into()] } }
}

/// Streams H.264 access units into an MP4 file.
pub(crate) struct Mp4Muxer {
    path: PathBuf,
    out: BufWriter<File>,
    pos: u64,
    mdat_start: u64,
    width: u32,
    height: u32,
    fps: crate::video::FrameRate,
    compressor: String,
    sps: Option<Vec<u8>>,
    pps: Option<Vec<u8>>,
    video: SampleTable,
    audio: Option<(EncodedAac, SampleTable)>,
}

impl Mp4Muxer {
    pub fn create(
        path: &Path,
        width: u32,
        height: u32,
        fps: crate::video::FrameRate,
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
            compressor: compressor.chars().take(31).collect(),
            sps: None,
            pps: None,
            video: SampleTable::new(),
            audio: None,
        };
        let ftyp = Ftyp {
            major_brand: b"isom".into(),
            minor_version: 512,
            compatible_brands: vec![b"isom".into(), b"iso2".into(), b"avc1".into(), b"mp41".into()],
        };
        let mut buf = Vec::new();
        ftyp.encode(&mut buf).map_err(|e| m.err(e))?;
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

    /// Appends one access unit given as NAL units without start codes. SPS and PPS go to the
    /// `avcC` box (the first of each is kept), access-unit delimiters are dropped, the rest is
    /// written length-prefixed (4 bytes).
    pub fn push_access_unit(&mut self, nals: &[&[u8]], keyframe: bool) -> Result<()> {
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

    pub fn frames(&self) -> u64 {
        self.video.sizes.len() as u64
    }

    /// Writes `moov`, patches the `mdat` size; returns the file size in bytes.
    pub fn finish(mut self) -> Result<u64> {
        let (Some(sps), Some(pps)) = (self.sps.clone(), self.pps.clone()) else {
            return Err(self.err("no frames were encoded (no SPS/PPS)"));
        };
        let mdat_size = self.pos - self.mdat_start;
        let n = self.video.sizes.len() as u64;
        // Whole rates keep a 1000x timescale (25 fps: 25000, 1000 per frame); fractional ones use
        // the fraction itself (29.97: 30000, 1001 per frame), so every frame lasts exactly 1/fps.
        let (video_ts, sample_delta) = match self.fps.den {
            1 => (self.fps.num * 1000, 1000),
            d => (self.fps.num, d),
        };
        let video_media_dur = n * sample_delta as u64;
        let video_movie_dur = video_media_dur * MOVIE_TIMESCALE as u64 / video_ts as u64;

        let avcc = Avcc::new(&sps, &pps).map_err(|e| self.err(format!("avcC: {e}")))?;
        let avc1 = Avc1 {
            visual: Visual {
                data_reference_index: 1,
                width: self.width as u16,
                height: self.height as u16,
                horizresolution: 72.into(),
                vertresolution: 72.into(),
                frame_count: 1,
                compressor: self.compressor.as_str().into(),
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
        let video_trak = Trak {
            tkhd: Tkhd {
                track_id: 1,
                duration: video_movie_dur,
                enabled: true,
                in_movie: true,
                width: (self.width as u16).into(),
                height: (self.height as u16).into(),
                ..Default::default()
            },
            mdia: Mdia {
                mdhd: Mdhd {
                    timescale: video_ts,
                    duration: video_media_dur,
                    language: "und".into(),
                    ..Default::default()
                },
                hdlr: Hdlr { handler: b"vide".into(), name: "VideoHandler".into() },
                minf: Minf {
                    vmhd: Some(Vmhd::default()),
                    dinf: dinf(),
                    stbl: self.video.stbl(
                        Stsd { codecs: vec![avc1.into()] },
                        Stts { entries: vec![SttsEntry { sample_count: n as u32, sample_delta }] },
                        true,
                    ),
                    ..Default::default()
                },
            },
            ..Default::default()
        };
        let mut traks = vec![video_trak];
        let mut movie_dur = video_movie_dur;

        if let Some((aac, table)) = &self.audio {
            let aus = aac.access_units.len() as u64;
            let media_dur = aus * aac.frame_len as u64;
            let play_dur = aac.frames * MOVIE_TIMESCALE as u64 / aac.sample_rate as u64;
            movie_dur = movie_dur.max(play_dur);
            let max_au = table.sizes.iter().copied().max().unwrap_or(0);
            let mp4a = Mp4a {
                audio: AudioEntry {
                    data_reference_index: 1,
                    channel_count: aac.channels,
                    sample_size: 16,
                    sample_rate: (aac.sample_rate as u16).into(),
                },
                esds: Esds {
                    es_desc: mp4_atom::esds::EsDescriptor {
                        es_id: 2,
                        depends_on_es_id: None,
                        url: None,
                        ocr_es_id: None,
                        stream_priority: 0,
                        dec_config: mp4_atom::esds::DecoderConfig {
                            object_type_indication: 0x40, // MPEG-4 Audio
                            stream_type: 5,               // audio stream
                            up_stream: 0,
                            buffer_size_db: [(max_au >> 16) as u8, (max_au >> 8) as u8, max_au as u8].into(),
                            max_bitrate: aac.bitrate,
                            avg_bitrate: aac.bitrate,
                            dec_specific: Some(mp4_atom::esds::DecoderSpecific {
                                profile: 2,
                                freq_index: aac.freq_index,
                                chan_conf: aac.channels as u8,
                                raw: aac.asc.clone(),
                            }),
                        },
                        sl_config: mp4_atom::esds::SLConfig {},
                    },
                },
                btrt: None,
                taic: None,
            };
            traks.push(Trak {
                tkhd: Tkhd {
                    track_id: 2,
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
                            media_time: Some(aac.delay as u64),
                            media_rate: 1i16.into(),
                        }],
                    }),
                }),
                mdia: Mdia {
                    mdhd: Mdhd {
                        timescale: aac.sample_rate,
                        duration: media_dur,
                        language: "und".into(),
                        ..Default::default()
                    },
                    hdlr: Hdlr { handler: b"soun".into(), name: "SoundHandler".into() },
                    minf: Minf {
                        smhd: Some(Smhd::default()),
                        dinf: dinf(),
                        stbl: table.stbl(
                            Stsd { codecs: vec![mp4a.into()] },
                            Stts { entries: vec![SttsEntry { sample_count: aus as u32, sample_delta: aac.frame_len }] },
                            false,
                        ),
                        ..Default::default()
                    },
                },
                ..Default::default()
            });
        }

        let moov = Moov {
            mvhd: Mvhd {
                timescale: MOVIE_TIMESCALE,
                duration: movie_dur,
                rate: 1.into(),
                volume: 1.into(),
                next_track_id: traks.len() as u32 + 1,
                ..Default::default()
            },
            trak: traks,
            ..Default::default()
        };
        let mut buf = Vec::new();
        moov.encode(&mut buf).map_err(|e| self.err(e))?;
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
