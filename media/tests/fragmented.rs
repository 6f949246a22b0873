//! The fragmented MP4 writer ([`FragmentedWriter`]) checked without system tools: the box layout
//! read by a small parser written here (not mp4-atom, which writes it), then the stream read
//! back and decoded by the crate's own `Mp4Reader` (OpenH264 and FDK AAC).

mod common;

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;
use std::time::Instant;

use cadence_media::aac::AacEncoder;
use cadence_media::{
    idr_period, AudioFormat, EncoderKind, FragmentedWriter, FrameRate, MediaError, Mp4Reader, SegmentQueue, VideoStats,
};
use common::*;

/// Lowest per-frame PSNR (dB, Y and UV) of a decoded frame against its input. Measured at
/// worst: Y 38.5, UV 42.9 (64x48 at 29.97 fps), Y 43.0, UV 47.8 (160x128 at 5 fps); the bound
/// leaves 3.5 dB of margin.
const MIN_PSNR: f64 = 35.0;

// ---- A minimal ISO BMFF reader (ISO/IEC 14496-12), independent of the writer's box library ----

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// One box: its type, its offset in the stream, and its body (after the 8-byte header).
struct Bx<'a> {
    kind: [u8; 4],
    start: usize,
    body: &'a [u8],
}

impl Bx<'_> {
    fn end(&self) -> usize {
        self.start + 8 + self.body.len()
    }
}

/// The boxes that tile `data` (which starts at stream offset `base`); every box must be whole.
fn boxes(data: &[u8], base: usize) -> Vec<Bx<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        assert!(i + 8 <= data.len(), "box header cut at byte {}", base + i);
        let size = be32(data, i) as usize;
        let kind: [u8; 4] = data[i + 4..i + 8].try_into().unwrap();
        assert!(size >= 8 && i + size <= data.len(), "box {:?} at byte {}: size {size}", kind, base + i);
        out.push(Bx { kind, start: base + i, body: &data[i + 8..i + size] });
        i += size;
    }
    out
}

/// The children of a container box.
fn children<'a>(b: &Bx<'a>) -> Vec<Bx<'a>> {
    boxes(b.body, b.start + 8)
}

fn child<'a>(b: &Bx<'a>, kind: &[u8; 4]) -> Bx<'a> {
    children(b).into_iter().find(|c| &c.kind == kind).unwrap_or_else(|| panic!("no {:?} in {:?}", kind, b.kind))
}

fn kinds(bs: &[Bx]) -> Vec<String> {
    bs.iter().map(|b| String::from_utf8_lossy(&b.kind).into_owned()).collect()
}

/// Sample flags bit `sample_is_non_sync_sample` (§8.8.3.1).
const NON_SYNC: u32 = 0x0001_0000;

struct Sample {
    duration: u32,
    size: u32,
    flags: u32,
}

/// One `traf` (§8.8.6): its track, `tfhd` flags, `tfdt` decode time, `trun` data offset and samples.
struct Run {
    track: u32,
    tfhd_flags: u32,
    tfdt: u64,
    data_offset: i64,
    samples: Vec<Sample>,
}

struct Fragment {
    seq: u32,
    moof_start: usize,
    /// Offset and length of the `mdat` payload.
    data_start: usize,
    data_len: usize,
    runs: Vec<Run>,
}

struct Track {
    id: u32,
    handler: [u8; 4],
    timescale: u32,
    /// The first edit's media time (§8.6.6), if there is an edit list.
    edit_media_time: Option<i64>,
}

/// Track defaults from `trex` (§8.8.3): duration, size, flags.
struct Trex {
    track: u32,
    duration: u32,
    size: u32,
    flags: u32,
}

struct Layout {
    top: Vec<String>,
    major_brand: [u8; 4],
    tracks: Vec<Track>,
    trex: Vec<Trex>,
    /// The `avcC` body (§ ISO/IEC 14496-15 5.3.3.1).
    avcc: Vec<u8>,
    init_len: usize,
    fragments: Vec<Fragment>,
}

impl Layout {
    fn track(&self, handler: &[u8; 4]) -> Option<&Track> {
        self.tracks.iter().find(|t| &t.handler == handler)
    }

    /// The runs of track `id`, one per fragment that has one.
    fn runs(&self, id: u32) -> Vec<&Run> {
        self.fragments.iter().flat_map(|f| f.runs.iter().filter(move |r| r.track == id)).collect()
    }
}

fn full_box_version(b: &[u8]) -> u8 {
    b[0]
}

fn parse_track(trak: &Bx) -> Track {
    let tkhd = child(trak, b"tkhd");
    let id = if full_box_version(tkhd.body) == 1 { be32(tkhd.body, 20) } else { be32(tkhd.body, 12) };
    let mdia = child(trak, b"mdia");
    let mdhd = child(&mdia, b"mdhd");
    let timescale = if full_box_version(mdhd.body) == 1 { be32(mdhd.body, 20) } else { be32(mdhd.body, 12) };
    let handler = child(&mdia, b"hdlr").body[8..12].try_into().unwrap();
    let edit_media_time = children(trak).iter().find(|c| &c.kind == b"edts").map(|edts| {
        let elst = child(edts, b"elst");
        assert!(be32(elst.body, 4) >= 1, "empty edit list");
        match full_box_version(elst.body) {
            1 => be64(elst.body, 16) as i64,
            _ => be32(elst.body, 12) as i32 as i64,
        }
    });
    Track { id, handler, timescale, edit_media_time }
}

fn parse_traf(traf: &Bx, trex: &[Trex]) -> Run {
    let tfhd = child(traf, b"tfhd");
    let tfhd_flags = be32(tfhd.body, 0) & 0xff_ffff;
    let track = be32(tfhd.body, 4);
    let d = trex.iter().find(|t| t.track == track).unwrap_or_else(|| panic!("no trex for track {track}"));
    let (mut dur, mut size, mut flags) = (d.duration, d.size, d.flags);
    let mut p = 8;
    if tfhd_flags & 0x01 != 0 {
        p += 8; // base-data-offset
    }
    if tfhd_flags & 0x02 != 0 {
        p += 4; // sample-description-index
    }
    if tfhd_flags & 0x08 != 0 {
        dur = be32(tfhd.body, p);
        p += 4;
    }
    if tfhd_flags & 0x10 != 0 {
        size = be32(tfhd.body, p);
        p += 4;
    }
    if tfhd_flags & 0x20 != 0 {
        flags = be32(tfhd.body, p);
    }
    let tfdt = child(traf, b"tfdt");
    let tfdt = if full_box_version(tfdt.body) == 1 { be64(tfdt.body, 4) } else { be32(tfdt.body, 4) as u64 };
    let truns: Vec<_> = children(traf).into_iter().filter(|c| &c.kind == b"trun").collect();
    assert_eq!(truns.len(), 1, "one trun per traf");
    let t = truns[0].body;
    let tf = be32(t, 0) & 0xff_ffff;
    let count = be32(t, 4);
    let mut p = 8;
    assert!(tf & 0x01 != 0, "trun without a data offset");
    let data_offset = be32(t, p) as i32 as i64;
    p += 4;
    let mut first_flags = None;
    if tf & 0x04 != 0 {
        first_flags = Some(be32(t, p));
        p += 4;
    }
    let mut samples = Vec::new();
    for i in 0..count {
        let mut s = Sample { duration: dur, size, flags: if i == 0 { first_flags.unwrap_or(flags) } else { flags } };
        for (bit, field) in [(0x100, &mut s.duration), (0x200, &mut s.size), (0x400, &mut s.flags)] {
            if tf & bit != 0 {
                *field = be32(t, p);
                p += 4;
            }
        }
        if tf & 0x800 != 0 {
            p += 4;
        }
        samples.push(s);
    }
    assert_eq!(p, t.len(), "trun has trailing bytes");
    Run { track, tfhd_flags, tfdt, data_offset, samples }
}

/// Parses a whole fragmented stream: `ftyp`, `moov`, then `moof`+`mdat` pairs and nothing else.
fn parse(data: &[u8]) -> Layout {
    let top = boxes(data, 0);
    let names = kinds(&top);
    assert!(names.len() >= 2 && names[0] == "ftyp" && names[1] == "moov", "{names:?}");
    assert!(names[2..].chunks(2).all(|p| p == ["moof", "mdat"]), "fragments must be moof+mdat pairs: {names:?}");
    let major_brand = top[0].body[..4].try_into().unwrap();
    let moov = &top[1];
    let mvex = child(moov, b"mvex");
    let trex: Vec<Trex> = children(&mvex)
        .iter()
        .filter(|c| &c.kind == b"trex")
        .map(|t| Trex {
            track: be32(t.body, 4),
            duration: be32(t.body, 12),
            size: be32(t.body, 16),
            flags: be32(t.body, 20),
        })
        .collect();
    let tracks: Vec<Track> = children(moov).iter().filter(|c| &c.kind == b"trak").map(parse_track).collect();
    let moov_bytes = &data[moov.start..moov.end()];
    let at = moov_bytes.windows(4).position(|w| w == b"avcC").expect("avcC");
    let avcc_len = be32(moov_bytes, at - 4) as usize - 8;
    let avcc = moov_bytes[at + 4..at + 4 + avcc_len].to_vec();
    let mut fragments = Vec::new();
    for pair in top[2..].chunks(2) {
        let (moof, mdat) = (&pair[0], &pair[1]);
        let seq = be32(child(moof, b"mfhd").body, 4);
        let runs = children(moof).iter().filter(|c| &c.kind == b"traf").map(|t| parse_traf(t, &trex)).collect();
        fragments.push(Fragment {
            seq,
            moof_start: moof.start,
            data_start: mdat.start + 8,
            data_len: mdat.body.len(),
            runs,
        });
    }
    Layout { top: names, major_brand, tracks, trex, avcc, init_len: top[1].end(), fragments }
}

/// The layout checks every fragmented stream must pass. `gop` frames per fragment (the last
/// may be shorter), `frames` in all, `fps`.
fn check_layout(l: &Layout, frames: u64, gop: u64, fps: FrameRate, audio: Option<u32>) {
    assert_eq!(&l.major_brand, b"iso5");
    assert!(!l.top.iter().any(|k| k == "sidx" || k == "mfra"), "{:?}", l.top);
    let video = l.track(b"vide").expect("video track");
    assert_eq!(l.tracks.len(), 1 + audio.is_some() as usize);
    assert_eq!(l.trex.len(), l.tracks.len(), "one trex per track");
    for t in &l.tracks {
        assert!(l.trex.iter().any(|x| x.track == t.id), "no trex for track {}", t.id);
    }
    // Exact frame durations: the timescale is a multiple of the rate's numerator.
    let delta = video.timescale as u64 * fps.den as u64 / fps.num as u64;
    assert_eq!(delta * fps.num as u64, video.timescale as u64 * fps.den as u64, "inexact frame duration");

    assert_eq!(l.fragments.len() as u64, frames.div_ceil(gop), "one fragment per GOP");
    let mut next_video = 0u64;
    let mut next_audio = 0u64;
    let mut video_count = 0u64;
    for (k, f) in l.fragments.iter().enumerate() {
        assert_eq!(f.seq, k as u32 + 1, "mfhd sequence numbers count from 1");
        // Each traf's data follows the previous one's in the mdat, which they fill.
        let mut at = f.data_start;
        for r in &f.runs {
            assert!(r.tfhd_flags & 0x02_0000 != 0, "default-base-is-moof");
            assert_eq!(r.tfhd_flags & 0x01, 0, "no base-data-offset");
            assert_eq!(f.moof_start as i64 + r.data_offset, at as i64, "fragment {k}, track {}", r.track);
            at += r.samples.iter().map(|s| s.size as usize).sum::<usize>();
        }
        assert_eq!(at, f.data_start + f.data_len, "fragment {k}: the samples fill the mdat");
        let v: Vec<&Run> = f.runs.iter().filter(|r| r.track == video.id).collect();
        assert_eq!(v.len(), 1, "fragment {k}: one video traf");
        let v = v[0];
        let expected = gop.min(frames - video_count);
        assert_eq!(v.samples.len() as u64, expected, "fragment {k}: video samples");
        assert_eq!(v.tfdt, next_video, "fragment {k}: video tfdt continues the previous fragment");
        for (i, s) in v.samples.iter().enumerate() {
            assert_eq!(s.duration as u64, delta, "fragment {k} frame {i}: duration");
            assert!(s.size > 0);
            assert_eq!(s.flags & NON_SYNC == 0, i == 0, "fragment {k} frame {i}: only the first is a sync sample");
        }
        next_video += v.samples.iter().map(|s| s.duration as u64).sum::<u64>();
        video_count += v.samples.len() as u64;
        if let Some(rate) = audio {
            let at = l.track(b"soun").expect("audio track");
            assert_eq!(at.timescale, rate);
            let delay = at.edit_media_time.expect("an edit list skips the AAC priming");
            // Audio arrives with the video here, so every fragment has some.
            assert_eq!(f.runs.iter().filter(|r| r.track == at.id).count(), 1, "fragment {k}: one audio traf");
            for a in f.runs.iter().filter(|r| r.track == at.id) {
                assert_eq!(a.tfdt, next_audio, "fragment {k}: audio tfdt continues the previous fragment");
                assert!(a.samples.iter().all(|s| s.duration == 1024 && s.flags & NON_SYNC == 0 && s.size > 0));
                // A fragment's first access unit starts (after the priming) in the fragment's
                // time span, the one before it earlier: both tracks' fragments cover the same time.
                if k > 0 && k + 1 < l.fragments.len() {
                    let start = a.tfdt as i64 - delay; // audio timescale
                    let v0 = v.tfdt as i64; // video timescale
                    let (ra, rv) = (rate as i64, video.timescale as i64);
                    assert!(start * rv >= v0 * ra, "fragment {k}: audio starts before its video");
                    assert!((start - 1024) * rv < v0 * ra, "fragment {k}: audio starts a unit late");
                }
                next_audio += a.samples.len() as u64 * 1024;
            }
        }
    }
    assert_eq!(video_count, frames, "video samples over all fragments");
    if audio.is_none() {
        assert!(l.fragments.iter().all(|f| f.runs.len() == 1));
    }
}

// ---- Writing ----

/// Writes `frames` moving-pattern frames (and the audio, in pieces as live audio arrives, each
/// frame's share before the frame) to `out`; checks that a fragment goes out as soon as its
/// GOP is complete. Returns the input frames, the stats and the sink.
fn write_stream<W: Write>(
    out: W,
    (w, h): (usize, usize),
    frames: usize,
    fps: FrameRate,
    audio: Option<(AudioFormat, &[i16])>,
) -> (Vec<Vec<u8>>, VideoStats, W) {
    let gop = idr_period(fps) as u64;
    let mut fw =
        FragmentedWriter::new(out, "test", w as u32, h as u32, fps, EncoderKind::OpenH264, audio.map(|a| a.0)).unwrap();
    let mut input = Vec::new();
    let mut sent = 0usize;
    for t in 0..frames {
        if let Some((fmt, samples)) = audio {
            // Audio up to the end of this frame, cut at odd sizes.
            let ch = fmt.channels as usize;
            let upto = ((t as u64 + 1) * fmt.sample_rate as u64 * fps.den as u64 / fps.num as u64) as usize * ch;
            let upto = upto.min(samples.len());
            while sent < upto {
                let n = (upto - sent).min(ch * (1 + (t * 997 + sent) % 1500));
                fw.push_audio(&samples[sent..sent + n]).unwrap();
                sent += n;
            }
        }
        let f = nv12_frame(w, h, t);
        fw.push_nv12(&f).unwrap();
        input.push(f);
        assert_eq!(fw.fragments_written(), t as u64 / gop, "after frame {t}");
        assert_eq!(fw.frames_written(), fw.fragments_written() * gop);
        assert!(fw.codecs().is_some(), "codecs known after the first frame");
    }
    if let Some((_, samples)) = audio {
        fw.push_audio(&samples[sent..]).unwrap();
    }
    let (stats, out) = fw.finish().unwrap();
    assert_eq!(stats.frames, frames as u64);
    assert_eq!(stats.fragments, (frames as u64).div_ceil(gop));
    assert_eq!(stats.has_audio, audio.is_some());
    (input, stats, out)
}

fn chirp(secs: f64) -> Vec<i16> {
    tone_audio(secs).track.samples
}

fn save(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = tmp_dir(name);
    let p = dir.join("stream.mp4");
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Frames decoded back, each close to its input and closer to it than to its neighbours.
fn assert_frames_match(input: &[Vec<u8>], decoded: &[Vec<u8>], w: usize, h: usize) {
    assert_eq!(decoded.len(), input.len(), "decoded frame count");
    let (mut min_y, mut min_uv) = (f64::MAX, f64::MAX);
    for (t, (f, d)) in input.iter().zip(decoded).enumerate() {
        let py = psnr(&f[..w * h], &d[..w * h]);
        let puv = psnr(&f[w * h..], &d[w * h..]);
        assert!(py > MIN_PSNR && puv > MIN_PSNR, "frame {t}: PSNR Y {py:.1} UV {puv:.1}");
        for n in [t.wrapping_sub(1), t + 1] {
            if let Some(other) = input.get(n) {
                assert!(psnr(&other[..w * h], &d[..w * h]) < py, "frame {t} looks like frame {n}");
            }
        }
        (min_y, min_uv) = (min_y.min(py), min_uv.min(puv));
    }
    println!("{w}x{h}, {} frames: lowest PSNR Y {min_y:.1} dB, UV {min_uv:.1} dB", input.len());
}

/// 64 frames at 5 fps (GOPs of 10: 7 fragments, the last of 4) with a chirp pushed in pieces:
/// the layout, then every frame and the audio decoded back; then the stream cut after k whole
/// fragments reads as its first k GOPs, and cut inside a fragment is a clear error.
#[test]
fn fragments_per_gop_decode_back_and_cut_streams_read() {
    let (w, h, n) = (160, 128, 64);
    let fps = FrameRate::whole(5);
    let secs = n as f64 / 5.0;
    let pcm = chirp(secs);
    let fmt = AudioFormat { sample_rate: 16_000, channels: 1 };
    let t0 = Instant::now();
    let (input, stats, bytes) = write_stream(Vec::new(), (w, h), n, fps, Some((fmt, &pcm)));
    println!("wrote {} frames, {} bytes in {:.2} s", n, bytes.len(), t0.elapsed().as_secs_f64());
    assert_eq!(stats.bytes, bytes.len() as u64);

    let l = parse(&bytes);
    check_layout(&l, n as u64, 10, fps, Some(16_000));
    assert_eq!(l.fragments.len(), 7);
    // The codecs string is the avcC's profile, compatibility and level (RFC 6381 §3.3).
    let codecs = format!("avc1.{:02X}{:02X}{:02X}, mp4a.40.2", l.avcc[1], l.avcc[2], l.avcc[3]);
    let mut fw = FragmentedWriter::new(Vec::new(), "t", 64, 64, fps, EncoderKind::OpenH264, Some(fmt)).unwrap();
    assert_eq!(fw.codecs(), None, "not known before the first frame");
    fw.push_nv12(&nv12_frame(64, 64, 0)).unwrap();
    assert_eq!(fw.codecs().as_deref(), Some(codecs.as_str()));
    assert_eq!(fw.mime_type().unwrap(), format!("video/mp4; codecs=\"{codecs}\""));
    // All the audio is there: the real samples plus the priming, in whole access units.
    let audio = l.track(b"soun").unwrap();
    let aus: usize = l.runs(audio.id).iter().map(|r| r.samples.len()).sum();
    let delay = audio.edit_media_time.unwrap() as usize;
    assert_eq!(aus, (pcm.len() + delay).div_ceil(1024), "audio access units");

    let path = save("fmp4-main", &bytes);
    let mut r = Mp4Reader::open(&path).unwrap();
    assert!(r.is_fragmented());
    assert_eq!(r.fragments(), 7);
    let vs = r.video_samples().unwrap();
    assert_eq!(vs.samples.len(), n);
    assert!(vs.samples.iter().enumerate().all(|(i, s)| s.sync == (i % 10 == 0) && s.time == i as u64 * 1000));
    let video = r.decode_video().unwrap();
    assert_eq!((video.width, video.height), (w as u32, h as u32));
    assert_frames_match(&input, &video.frames, w, h);
    let a = r.decode_audio().unwrap().expect("audio track");
    assert_eq!((a.sample_rate, a.channels), (16_000, 1));
    let dec = a.first_channel();
    // The edit list runs to the end of the media, so the last access unit's padding stays.
    assert!(dec.len() >= pcm.len() && dec.len() < pcm.len() + 1024, "{} decoded vs {} in", dec.len(), pcm.len());
    let reference: Vec<f32> = pcm.iter().map(|&s| s as f32 / 32767.0).collect();
    assert_aligned(&dec, &reference);

    // Cut after k whole fragments: the first k GOPs, identical to the full decode.
    for k in [1usize, 3, 6] {
        let end = l.fragments[k - 1].data_start + l.fragments[k - 1].data_len;
        let p = save(&format!("fmp4-cut{k}"), &bytes[..end]);
        let mut r = Mp4Reader::open(&p).unwrap();
        assert_eq!(r.fragments(), k);
        let v = r.decode_video().unwrap();
        assert_eq!(v.frames.len(), 10 * k, "cut after {k} fragments");
        assert!(v.frames.iter().zip(&video.frames).all(|(a, b)| a == b), "cut after {k}: frames differ");
        let a = r.decode_audio().unwrap().unwrap();
        let covered = 10 * k * 16_000 / 5;
        assert!(a.frames() >= covered - 1024 && a.frames() < covered + 2048, "cut after {k}: {} samples", a.frames());
    }
    // The init segment alone: no frames, no error.
    let p = save("fmp4-cut0", &bytes[..l.init_len]);
    let r = Mp4Reader::open(&p).unwrap();
    assert_eq!(r.fragments(), 0);
    assert_eq!(r.video_samples().unwrap().samples.len(), 0);
    // Cut inside a fragment: an error that says so, not a panic or a silent short read.
    for end in [l.fragments[2].moof_start + 20, l.fragments[2].data_start + 100] {
        let p = save("fmp4-cutmid", &bytes[..end]);
        let e = Mp4Reader::open(&p).err().expect("a cut fragment is an error").to_string();
        assert!(e.contains("truncated") || e.contains("outside the file"), "{e}");
    }
}

/// NTSC rate without audio: GOPs of 60 over 130 frames (fragments of 60, 60, 10), every
/// duration exact in a timescale of 30000 (1001 per frame), no audio track or trex.
#[test]
fn ntsc_without_audio_gop_not_dividing_the_frame_count() {
    let fps = FrameRate { num: 30_000, den: 1001 };
    assert_eq!(idr_period(fps), 60);
    let (input, stats, bytes) = write_stream(Vec::new(), (64, 48), 130, fps, None);
    assert!(!stats.has_audio);
    let l = parse(&bytes);
    check_layout(&l, 130, 60, fps, None);
    let v = l.track(b"vide").unwrap();
    assert_eq!(v.timescale, 30_000);
    let tfdts: Vec<u64> = l.fragments.iter().map(|f| f.runs[0].tfdt).collect();
    assert_eq!(tfdts, [0, 60 * 1001, 120 * 1001]);
    assert!(!String::from_utf8_lossy(&bytes[..l.init_len]).contains("mp4a"));
    let path = save("fmp4-ntsc", &bytes);
    let mut r = Mp4Reader::open(&path).unwrap();
    assert_frames_match(&input, &r.decode_video().unwrap().frames, 64, 48);
    assert!(r.decode_audio().unwrap().is_none());
    let info = cadence_media::probe(&path).unwrap();
    assert_eq!(info.frames, 130);
    assert!((info.fps - 30_000.0 / 1001.0).abs() < 1e-9, "fps {}", info.fps);
    assert!((info.duration_s - 130.0 * 1001.0 / 30_000.0).abs() < 1e-9, "duration {}", info.duration_s);

    // Audio for a stream without an audio track is refused, and the stream goes on.
    let mut fw = FragmentedWriter::new(Vec::new(), "t", 64, 48, fps, EncoderKind::OpenH264, None).unwrap();
    assert!(matches!(fw.push_audio(&[0; 100]), Err(MediaError::InvalidInput(_))));
    fw.push_nv12(&nv12_frame(64, 48, 0)).unwrap();
    assert_eq!(fw.codecs().unwrap().matches("avc1.").count(), 1);
    assert!(!fw.codecs().unwrap().contains("mp4a"));
}

/// One frame with a frame's worth of stereo 48 kHz audio: one fragment, the audio flushed into it.
#[test]
fn one_frame() {
    let fps = FrameRate::whole(25);
    let pcm: Vec<i16> = (0..1920 * 2).map(|i| ((i as f32 * 0.05).sin() * 8000.0) as i16).collect();
    let fmt = AudioFormat { sample_rate: 48_000, channels: 2 };
    let (input, stats, bytes) = write_stream(Vec::new(), (64, 64), 1, fps, Some((fmt, &pcm)));
    assert_eq!((stats.frames, stats.fragments), (1, 1));
    let l = parse(&bytes);
    check_layout(&l, 1, 50, fps, Some(48_000));
    assert_eq!(l.fragments[0].runs.len(), 2, "the audio is in the only fragment");
    let path = save("fmp4-one", &bytes);
    let mut r = Mp4Reader::open(&path).unwrap();
    assert_frames_match(&input, &r.decode_video().unwrap().frames, 64, 64);
    let a = r.decode_audio().unwrap().unwrap();
    assert_eq!((a.sample_rate, a.channels), (48_000, 2));
    assert!(a.frames() >= 1920 && a.frames() < 1920 + 1024, "{} sample frames", a.frames());
}

/// Goertzel power of `x` at `freq` Hz.
fn power_at(x: &[f32], rate: f64, freq: f64) -> f64 {
    let w = 2.0 * std::f64::consts::PI * freq / rate;
    let (mut s1, mut s2) = (0.0f64, 0.0f64);
    for &v in x {
        let s0 = v as f64 + 2.0 * w.cos() * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    (s1 * s1 + s2 * s2 - 2.0 * w.cos() * s1 * s2) / (x.len() as f64).powi(2)
}

/// Stereo 44.1 kHz sines (440 Hz left, 660 Hz right) come back at their frequency, on their
/// channel, at their level, for their duration.
#[test]
fn stereo_sines_keep_frequency_energy_and_duration() {
    let fps = FrameRate::whole(25);
    let rate = 44_100usize;
    let n_frames = 60; // 2.4 s: two fragments (50 + 10)
    let len = n_frames * rate / 25;
    let amp = 0.3f32;
    let mut pcm = Vec::with_capacity(len * 2);
    for i in 0..len {
        for f in [440.0f32, 660.0] {
            pcm.push(((2.0 * std::f32::consts::PI * f * i as f32 / rate as f32).sin() * amp * 32767.0).round() as i16);
        }
    }
    let fmt = AudioFormat { sample_rate: rate as u32, channels: 2 };
    let (_, _, bytes) = write_stream(Vec::new(), (64, 64), n_frames, fps, Some((fmt, &pcm)));
    check_layout(&parse(&bytes), n_frames as u64, 50, fps, Some(rate as u32));
    let path = save("fmp4-stereo", &bytes);
    let a = Mp4Reader::open(&path).unwrap().decode_audio().unwrap().unwrap();
    assert_eq!((a.sample_rate, a.channels), (rate as u32, 2));
    assert!(a.frames() >= len && a.frames() < len + 1024, "{} decoded vs {len}", a.frames());
    for (c, (f, other)) in [(440.0, 660.0), (660.0, 440.0)].into_iter().enumerate() {
        let x: Vec<f32> = a.samples.iter().skip(c).step_by(2).copied().collect();
        let mid = &x[rate / 10..len - rate / 10];
        // Frequency: zero crossings over the middle of the clip.
        let crossings = mid.windows(2).filter(|p| (p[0] < 0.0) != (p[1] < 0.0)).count();
        let est = crossings as f64 / 2.0 / (mid.len() as f64 / rate as f64);
        assert!((est - f).abs() < 2.0, "channel {c}: {est:.1} Hz, expected {f}");
        assert!(power_at(mid, rate as f64, f) > 100.0 * power_at(mid, rate as f64, other), "channel {c}: crosstalk");
        let level = rms(mid) / (amp / 2f32.sqrt());
        assert!((level - 1.0).abs() < 0.05, "channel {c}: level {level:.3} of the input's");
    }
}

#[test]
fn bad_sizes_rates_and_buffers_refused() {
    let fps = FrameRate::whole(25);
    for (w, h) in [(255, 256), (256, 255), (0, 64), (8, 8), (4000, 64)] {
        let e = FragmentedWriter::new(Vec::new(), "t", w, h, fps, EncoderKind::OpenH264, None).err().unwrap();
        assert!(matches!(e, MediaError::InvalidInput(_)), "{w}x{h}: {e:?}");
        if w % 2 == 1 || h % 2 == 1 {
            assert!(e.to_string().contains("must be even"), "{e}");
        }
    }
    let e = FragmentedWriter::new(Vec::new(), "t", 64, 64, FrameRate::whole(0), EncoderKind::OpenH264, None);
    assert!(matches!(e.err().unwrap(), MediaError::InvalidInput(_)));
    let bad_rate = AudioFormat { sample_rate: 12_345, channels: 1 };
    assert!(FragmentedWriter::new(Vec::new(), "t", 64, 64, fps, EncoderKind::OpenH264, Some(bad_rate)).is_err());
    let stereo = AudioFormat { sample_rate: 48_000, channels: 2 };
    let mut fw = FragmentedWriter::new(Vec::new(), "t", 64, 64, fps, EncoderKind::OpenH264, Some(stereo)).unwrap();
    // A wrong-sized frame or half a stereo sample frame is refused; the stream goes on.
    let e = fw.push_nv12(&[0u8; 100]).unwrap_err();
    assert!(e.to_string().contains("expected 6144"), "{e}");
    assert!(matches!(fw.push_audio(&[0; 3]), Err(MediaError::InvalidInput(_))));
    fw.push_audio(&[0; 4]).unwrap();
    fw.push_nv12(&nv12_frame(64, 64, 0)).unwrap();
    let (s, out) = fw.finish().unwrap();
    assert_eq!(s.frames, 1);
    check_layout(&parse(&out), 1, 50, fps, Some(48_000));
    // No frames at all: an error, not an empty stream passed as good.
    let fw = FragmentedWriter::new(Vec::new(), "t", 64, 64, fps, EncoderKind::OpenH264, None).unwrap();
    assert!(fw.finish().is_err());
}

/// A sink that accepts `limit` bytes then fails every write; records what it holds at each flush.
struct FailAt {
    limit: usize,
    data: Rc<RefCell<Vec<u8>>>,
    flushed: Rc<RefCell<usize>>,
}

impl Write for FailAt {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut d = self.data.borrow_mut();
        let room = self.limit.saturating_sub(d.len());
        if room == 0 {
            return Err(std::io::Error::other("disk full"));
        }
        let n = room.min(buf.len());
        d.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        *self.flushed.borrow_mut() = self.data.borrow().len();
        Ok(())
    }
}

/// A sink that fails at byte N (inside the init segment, at its end, inside a fragment, one byte
/// before the end): the call that hits it errors, every later call errors, and what was flushed
/// before is whole segments that read back as the fragments written.
#[test]
fn write_failure_ends_the_stream() {
    let fps = FrameRate::whole(5);
    let (w, h, n) = (64, 64, 25);
    let pcm = chirp(n as f64 / 5.0);
    let fmt = AudioFormat { sample_rate: 16_000, channels: 1 };
    let (_, _, full) = write_stream(Vec::new(), (w, h), n, fps, Some((fmt, &pcm)));
    let l = parse(&full);
    assert_eq!(l.fragments.len(), 3);
    let in_frag2 = l.fragments[1].data_start + 10;
    for limit in [10, l.init_len, in_frag2, full.len() - 1] {
        let data = Rc::new(RefCell::new(Vec::new()));
        let flushed = Rc::new(RefCell::new(0));
        let sink = FailAt { limit, data: data.clone(), flushed: flushed.clone() };
        let mut fw =
            FragmentedWriter::new(sink, "sink", w as u32, h as u32, fps, EncoderKind::OpenH264, Some(fmt)).unwrap();
        let per_frame = pcm.len() / n;
        let mut failed_at = None;
        for t in 0..n {
            let r = fw
                .push_audio(&pcm[t * per_frame..(t + 1) * per_frame])
                .and_then(|()| fw.push_nv12(&nv12_frame(w, h, t)));
            match (r, failed_at) {
                (Err(e), None) => {
                    assert!(matches!(e, MediaError::Io { .. }), "limit {limit}: {e:?}");
                    failed_at = Some(t);
                }
                (Ok(()), Some(f)) => panic!("limit {limit}: frame {t} accepted after the failure at frame {f}"),
                _ => {}
            }
        }
        let written = fw.frames_written();
        if failed_at.is_some() {
            assert!(fw.push_nv12(&nv12_frame(w, h, 0)).is_err());
            assert!(fw.push_audio(&pcm[..100]).is_err());
        }
        let r = fw.finish();
        assert!(r.is_err(), "limit {limit}: finish after a failed write (or a failing last fragment) succeeded");
        // What was flushed before the failure: whole segments, readable.
        let data = data.borrow();
        let good = &data[..*flushed.borrow()];
        println!("limit {limit}: failed at frame {failed_at:?}, {written} frames in {} flushed bytes", good.len());
        if good.len() >= l.init_len {
            let p = save("fmp4-fail", good);
            let mut r = Mp4Reader::open(&p).unwrap();
            assert_eq!(r.video_samples().unwrap().samples.len() as u64, written, "limit {limit}");
            if written > 0 {
                assert_eq!(r.decode_video().unwrap().frames.len() as u64, written, "limit {limit}");
            }
        } else {
            assert!(good.is_empty() && written == 0, "limit {limit}: a partial init segment was flushed");
        }
    }
}

/// A `SegmentQueue` receives the init segment then one fragment per GOP, each whole, as soon as
/// it is complete; together they are the stream.
#[test]
fn segment_queue_holds_whole_segments() {
    let fps = FrameRate::whole(5);
    let mut fw =
        FragmentedWriter::new(SegmentQueue::default(), "queue", 64, 64, fps, EncoderKind::OpenH264, None).unwrap();
    let mut segments = Vec::new();
    for t in 0..25 {
        fw.push_nv12(&nv12_frame(64, 64, t)).unwrap();
        while let Some(s) = fw.get_mut().pop() {
            segments.push((t, s));
        }
    }
    let (_, mut q) = fw.finish().unwrap();
    while let Some(s) = q.pop() {
        segments.push((25, s));
    }
    // The init segment with the first frame, a fragment with frames 10 and 20 (each starting a
    // GOP), the last one at the end.
    assert_eq!(segments.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 10, 20, 25]);
    assert_eq!(kinds(&boxes(&segments[0].1, 0)), ["ftyp", "moov"]);
    for (_, s) in &segments[1..] {
        assert_eq!(kinds(&boxes(s, 0)), ["moof", "mdat"]);
    }
    let all: Vec<u8> = segments.into_iter().flat_map(|s| s.1).collect();
    check_layout(&parse(&all), 25, 10, fps, None);
}

/// However live audio is cut into pieces, the AAC access units are those of one whole push.
#[test]
fn aac_in_pieces_is_byte_identical() {
    let pcm = chirp(1.3);
    let encode = |pieces: &[usize]| {
        let mut e = AacEncoder::new(16_000, 1).unwrap();
        let mut at = 0;
        let mut aus = Vec::new();
        for &p in pieces.iter().cycle() {
            let n = p.min(pcm.len() - at);
            e.push(&pcm[at..at + n]).unwrap();
            aus.extend(e.take_access_units());
            at += n;
            if at == pcm.len() {
                break;
            }
        }
        aus.extend(e.finish().unwrap());
        aus
    };
    let whole = encode(&[pcm.len()]);
    assert_eq!(whole.len(), (pcm.len() + AacEncoder::new(16_000, 1).unwrap().config().delay as usize).div_ceil(1024));
    for pieces in [&[1usize][..], &[1023, 1025, 7], &[5000, 3]] {
        assert!(encode(pieces) == whole, "pieces {pieces:?}");
    }
}

/// Write throughput at 256x256 (run with --ignored --nocapture).
#[test]
#[ignore]
fn fragmented_write_speed() {
    let (w, h, n) = (256, 256, 250);
    let frames: Vec<Vec<u8>> = (0..n).map(|t| nv12_frame(w, h, t)).collect();
    let pcm = chirp(n as f64 / 25.0);
    let fmt = AudioFormat { sample_rate: 16_000, channels: 1 };
    let t = Instant::now();
    let mut fw = FragmentedWriter::new(
        Vec::new(),
        "speed",
        w as u32,
        h as u32,
        FrameRate::whole(25),
        EncoderKind::OpenH264,
        Some(fmt),
    )
    .unwrap();
    for (i, f) in frames.iter().enumerate() {
        fw.push_audio(&pcm[i * 640..(i + 1) * 640]).unwrap();
        fw.push_nv12(f).unwrap();
    }
    let (s, out) = fw.finish().unwrap();
    let wall = t.elapsed().as_secs_f64();
    println!(
        "fragmented 256x256: {n} frames, {:.1} frames/s wall (video encode {:.1} frames/s, audio {:.3} s), {} bytes, {} fragments",
        n as f64 / wall,
        n as f64 / s.encode_s,
        s.audio_encode_s,
        out.len(),
        s.fragments
    );
}

/// Hostile fragments: counts, sizes, offsets and times that point outside the file or overflow
/// are errors that say what is wrong, never a panic or an allocation sized by the claim; and
/// no single corrupted byte of a `moof` makes the reader panic.
#[test]
fn hostile_fragments_are_refused() {
    let fps = FrameRate::whole(5);
    let pcm = chirp(25.0 / 5.0);
    let fmt = AudioFormat { sample_rate: 16_000, channels: 1 };
    let (_, _, good) = write_stream(Vec::new(), (64, 64), 25, fps, Some((fmt, &pcm)));
    let l = parse(&good);
    let f1 = &l.fragments[1];
    // Offsets of fields in fragment 1: its moof, the video traf's tfhd, tfdt and trun.
    let find = |from: usize, tag: &[u8]| from + good[from..].windows(4).position(|w| w == tag).unwrap();
    let moof = f1.moof_start;
    let tfhd = find(moof, b"tfhd") + 4; // body: version/flags, track_id
    let tfdt = find(moof, b"tfdt") + 4; // body: version/flags, time (64-bit in version 1)
    let trun = find(moof, b"trun") + 4; // body: version/flags, count, data offset, samples
    let tfdt_v1 = good[tfdt] == 1;
    let set = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("moof size past the end", set(moof, &0xffff_fff0u32.to_be_bytes()), &["past the end"]),
        ("unknown track", set(tfhd + 4, &99u32.to_be_bytes()), &["track 99"]),
        ("sample count", set(trun + 4, &u32::MAX.to_be_bytes()), &["moof"]),
        ("data offset before the file", set(trun + 8, &i32::MIN.to_be_bytes()), &["before the file"]),
        ("data offset past the end", set(trun + 8, &i32::MAX.to_be_bytes()), &["outside the file"]),
        ("sample size", set(trun + 16, &u32::MAX.to_be_bytes()), &["outside the file"]),
        (
            "decode time overflow",
            if tfdt_v1 { set(tfdt + 4, &u64::MAX.to_be_bytes()) } else { set(tfdt + 4, &u32::MAX.to_be_bytes()) },
            &["overflow"],
        ),
    ];
    for (what, bytes, expect) in cases {
        let p = save("fmp4-hostile", &bytes);
        let e = match Mp4Reader::open(&p) {
            Err(e) => e.to_string(),
            Ok(r) => match r.video_samples() {
                Err(e) => e.to_string(),
                Ok(s) if what == "decode time overflow" && !tfdt_v1 => {
                    // A 32-bit time cannot overflow: it must just be taken as given.
                    assert_eq!(s.samples[10].time, u32::MAX as u64);
                    continue;
                }
                Ok(_) => panic!("{what}: accepted"),
            },
        };
        assert!(expect.iter().any(|x| e.contains(x)), "{what}: {e}");
    }
    // Every byte of fragment 1's moof set to 0xff and 0x00 in turn: errors or a reading, no panic.
    let end = f1.data_start - 8;
    let p = tmp_dir("fmp4-flips").join("x.mp4");
    for at in moof..end {
        for v in [0x00u8, 0xff] {
            let bytes = set(at, &[v]);
            std::fs::write(&p, &bytes).unwrap();
            if let Ok(r) = Mp4Reader::open(&p) {
                let _ = r.video_samples();
                let _ = r.audio_samples();
            }
        }
    }
}
