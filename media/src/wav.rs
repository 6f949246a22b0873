//! WAV (RIFF/WAVE) reading over any `Read`: a file, or a pipe whose length nobody knows yet.
//!
//! Hand-written rather than `hound` because real files break hound's assumptions in two ways
//! cadence must accept: a WAV written to a pipe carries a placeholder data size (`espeak-ng
//! --stdout` writes 0x7FFFF000, ffmpeg 0xFFFFFFFF) since the writer could not seek back, and
//! live input (`--audio -`) must be decoded as it arrives, without seeking. The convention here
//! is the one players follow: a data size that is a known placeholder means "samples up to the
//! end of the stream", and the duration is measured from the samples actually present, never
//! taken from the placeholder. A real size larger than the file is a truncated file.
//!
//! Everything in the header is untrusted: sizes are checked before anything is allocated from
//! them, chunk skipping is bounded by the stream, and the formats accepted are PCM (8-bit
//! unsigned, 16/24/32-bit signed) and 32-bit IEEE float, plain or in WAVE_FORMAT_EXTENSIBLE.

use std::io::{ErrorKind, Read};

/// The sample format of a WAV stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WavFormat {
    pub sample_rate: u32,
    pub channels: u16,
    pub bits_per_sample: u16,
    pub float: bool,
}

impl WavFormat {
    /// Bytes per sample frame (all channels).
    pub fn block_align(&self) -> usize {
        self.channels as usize * (self.bits_per_sample as usize / 8)
    }
}

/// What is wrong with a WAV stream (the caller adds the file name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WavError {
    /// Not RIFF/WAVE, or a format cadence does not read.
    NotWav(String),
    /// The stream ends inside the header or inside a sample frame.
    Truncated(String),
    /// A read failed.
    Io(String),
}

impl std::fmt::Display for WavError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WavError::NotWav(d) | WavError::Truncated(d) | WavError::Io(d) => f.write_str(d),
        }
    }
}

/// Data sizes that writers put in the header when they cannot seek back to fill it in.
const PLACEHOLDER_SIZES: [u32; 2] = [0xFFFF_FFFF, 0x7FFF_F000];
/// Bytes of non-audio chunks (LIST, fact, ...) skipped before `data`: far above what real files
/// carry, and a bound on the work a hostile header can ask for.
const MAX_SKIPPED: u64 = 64 << 20;

/// A WAV stream positioned at its first sample.
pub struct WavReader<R: Read> {
    inner: R,
    format: WavFormat,
    /// Bytes of sample data left by the header's count; `None`: up to the end of the stream.
    remaining: Option<u64>,
    /// Bytes of sample data the header announces (`None` for a placeholder).
    announced: Option<u64>,
    /// Sample frames handed out so far.
    frames_read: u64,
    /// Sample frames the stream holds, where the header's count or the stream length tells.
    frames_total: Option<u64>,
}

fn read_exact_or<R: Read>(r: &mut R, buf: &mut [u8], what: &str) -> Result<(), WavError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => WavError::Truncated(format!("the stream ends inside the {what}")),
        _ => WavError::Io(format!("reading the {what}: {e}")),
    })
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Parses a `fmt ` chunk body.
fn parse_fmt(b: &[u8]) -> Result<WavFormat, WavError> {
    if b.len() < 16 {
        return Err(WavError::NotWav(format!("the fmt chunk has {} bytes (16 at least)", b.len())));
    }
    let mut tag = u16_at(b, 0);
    let channels = u16_at(b, 2);
    let sample_rate = u32_at(b, 4);
    let bits = u16_at(b, 14);
    if tag == 0xFFFE {
        // WAVE_FORMAT_EXTENSIBLE: the real format is the first two bytes of the sub-format GUID.
        if b.len() < 40 {
            return Err(WavError::NotWav("WAVE_FORMAT_EXTENSIBLE with a short fmt chunk".into()));
        }
        tag = u16_at(b, 24);
    }
    let float = match (tag, bits) {
        (1, 8 | 16 | 24 | 32) => false,
        (3, 32) => true,
        (1, b) => return Err(WavError::NotWav(format!("{b}-bit integer samples are not supported (8, 16, 24, 32)"))),
        (3, b) => return Err(WavError::NotWav(format!("{b}-bit float samples are not supported (32)"))),
        (t, _) => return Err(WavError::NotWav(format!("audio format {t} is not PCM or IEEE float"))),
    };
    if channels == 0 || channels > 64 {
        return Err(WavError::NotWav(format!("{channels} channels (1 to 64 supported)")));
    }
    if !(1_000..=768_000).contains(&sample_rate) {
        return Err(WavError::NotWav(format!("sample rate {sample_rate} Hz (1 kHz to 768 kHz supported)")));
    }
    Ok(WavFormat { sample_rate, channels, bits_per_sample: bits, float })
}

impl<R: Read> WavReader<R> {
    /// Reads the header up to the first sample. `stream_len`, when known (a file), lets a data
    /// size larger than the file count as "to the end" instead of a truncation.
    pub fn new(mut inner: R, stream_len: Option<u64>) -> Result<Self, WavError> {
        let mut riff = [0u8; 12];
        inner.read_exact(&mut riff).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => WavError::NotWav("the stream is shorter than a RIFF header".into()),
            _ => WavError::Io(format!("reading the RIFF header: {e}")),
        })?;
        if &riff[0..4] != b"RIFF" || &riff[8..12] != b"WAVE" {
            return Err(WavError::NotWav("no RIFF/WAVE header".into()));
        }
        let mut pos = 12u64;
        let mut format = None;
        let mut skipped = 0u64;
        loop {
            let mut head = [0u8; 8];
            read_exact_or(&mut inner, &mut head, "chunk headers (no data chunk)")?;
            pos += 8;
            let (id, size) = (&head[0..4], u32_at(&head, 4));
            match id {
                b"fmt " => {
                    if size > 1024 {
                        return Err(WavError::NotWav(format!("a fmt chunk of {size} bytes")));
                    }
                    let mut body = vec![0u8; size as usize + (size as usize & 1)];
                    read_exact_or(&mut inner, &mut body, "fmt chunk")?;
                    pos += body.len() as u64;
                    format = Some(parse_fmt(&body[..size as usize])?);
                }
                b"data" => {
                    let format = format.ok_or_else(|| WavError::NotWav("the data chunk comes before fmt".into()))?;
                    let available = stream_len.map(|l| l.saturating_sub(pos));
                    let to_end = PLACEHOLDER_SIZES.contains(&size);
                    if let Some(a) = available.filter(|&a| !to_end && size as u64 > a) {
                        return Err(WavError::Truncated(format!(
                            "the header announces {size} bytes of samples, the file holds {a}"
                        )));
                    }
                    let remaining = if to_end { None } else { Some(size as u64) };
                    let announced = remaining;
                    let bytes = remaining.or(available);
                    let frames_total = bytes.map(|b| b / format.block_align() as u64);
                    return Ok(Self { inner, format, remaining, announced, frames_read: 0, frames_total });
                }
                _ => {
                    // Other chunks (LIST, fact, cue, ...) are skipped, padded to even size.
                    let n = size as u64 + (size as u64 & 1);
                    skipped += n;
                    if skipped > MAX_SKIPPED {
                        return Err(WavError::NotWav(format!("more than {MAX_SKIPPED} bytes of chunks before data")));
                    }
                    let copied = std::io::copy(&mut (&mut inner).take(n), &mut std::io::sink())
                        .map_err(|e| WavError::Io(format!("skipping a chunk: {e}")))?;
                    if copied < n {
                        return Err(WavError::Truncated("the stream ends inside a chunk before data".into()));
                    }
                    pos += n;
                }
            }
        }
    }

    pub fn format(&self) -> WavFormat {
        self.format
    }

    /// Sample data bytes the header announces, if it is a real count (not a placeholder).
    pub fn announced_bytes(&self) -> Option<u64> {
        self.announced
    }

    /// Whether the samples run to the end of the stream rather than to a count in the header.
    pub fn reads_to_end(&self) -> bool {
        self.remaining.is_none()
    }

    /// Sample frames in the stream (whole frames only), where known before reading them: from the
    /// header's count, or for data that runs to the end, from the stream length given to `new`.
    pub fn frames_total(&self) -> Option<u64> {
        self.frames_total
    }

    /// Sample frames returned so far.
    pub fn frames_read(&self) -> u64 {
        self.frames_read
    }

    /// Reads up to `max_frames` sample frames, interleaved, as f32 in [-1, 1], appended to `out`.
    /// Returns the frames read: 0 at the end of the data. A frame cut short by the end of the
    /// stream is an error (the file was truncated), as is a non-finite float sample.
    pub fn read_frames(&mut self, max_frames: usize, out: &mut Vec<f32>) -> Result<usize, WavError> {
        let align = self.format.block_align();
        let mut want = max_frames.saturating_mul(align);
        if let Some(r) = self.remaining {
            want = want.min(usize::try_from(r).unwrap_or(usize::MAX));
        }
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(WavError::Io(format!("reading samples: {e}"))),
            }
        }
        if got % align != 0 {
            return Err(WavError::Truncated(format!(
                "the stream ends inside sample frame {} ({} of its {align} bytes present)",
                self.frames_read + (got / align) as u64,
                got % align
            )));
        }
        if let Some(r) = self.remaining.as_mut() {
            if got < want {
                return Err(WavError::Truncated(format!(
                    "the header announces {} more bytes of samples, the stream holds {got}",
                    *r
                )));
            }
            *r -= got as u64;
        }
        let frames = got / align;
        let first = self.frames_read;
        decode_samples(&buf[..got], self.format, out).map_err(|i| {
            let frame = first + (i / self.format.channels as usize) as u64;
            WavError::NotWav(format!(
                "sample frame {frame} ({:.3} s) is not a finite number (NaN or infinity)",
                frame as f64 / self.format.sample_rate as f64
            ))
        })?;
        self.frames_read += frames as u64;
        Ok(frames)
    }

    /// Reads every remaining sample frame (interleaved f32).
    pub fn read_all(&mut self) -> Result<Vec<f32>, WavError> {
        let mut out = Vec::new();
        while self.read_frames(1 << 16, &mut out)? > 0 {}
        Ok(out)
    }
}

/// Decodes little-endian samples to f32 in [-1, 1]; `Err(i)`: sample i is NaN or infinite.
fn decode_samples(b: &[u8], f: WavFormat, out: &mut Vec<f32>) -> Result<(), usize> {
    let start = out.len();
    match (f.float, f.bits_per_sample) {
        (true, _) => {
            for c in b.chunks_exact(4) {
                out.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
            if let Some(i) = out[start..].iter().position(|v| !v.is_finite()) {
                out.truncate(start);
                return Err(i);
            }
        }
        (false, 8) => out.extend(b.iter().map(|&v| (v as f32 - 128.0) / 128.0)),
        (false, 16) => out.extend(b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0)),
        (false, 24) => {
            out.extend(b.chunks_exact(3).map(|c| (i32::from_le_bytes([0, c[0], c[1], c[2]]) >> 8) as f32 / 8_388_608.0))
        }
        (false, _) => {
            out.extend(b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32 / 2_147_483_648.0))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fmt_tag: u16, channels: u16, rate: u32, bits: u16, data_size: u32) -> Vec<u8> {
        let block = channels * bits / 8;
        let mut h = Vec::new();
        h.extend_from_slice(b"RIFF");
        h.extend_from_slice(&0xFFFF_FFFFu32.to_le_bytes());
        h.extend_from_slice(b"WAVEfmt ");
        h.extend_from_slice(&16u32.to_le_bytes());
        h.extend_from_slice(&fmt_tag.to_le_bytes());
        h.extend_from_slice(&channels.to_le_bytes());
        h.extend_from_slice(&rate.to_le_bytes());
        h.extend_from_slice(&(rate * block as u32).to_le_bytes());
        h.extend_from_slice(&block.to_le_bytes());
        h.extend_from_slice(&bits.to_le_bytes());
        h.extend_from_slice(b"data");
        h.extend_from_slice(&data_size.to_le_bytes());
        h
    }

    #[test]
    fn placeholder_sizes_read_to_the_end() {
        for placeholder in PLACEHOLDER_SIZES {
            let mut f = header(1, 1, 16_000, 16, placeholder);
            for v in [0i16, 16384, -32768] {
                f.extend_from_slice(&v.to_le_bytes());
            }
            // No length known (a pipe): the samples present are read, then the end.
            let mut r = WavReader::new(&f[..], None).unwrap();
            assert!(r.reads_to_end());
            assert_eq!(r.read_all().unwrap(), vec![0.0, 0.5, -1.0]);
        }
    }

    #[test]
    fn a_real_size_past_the_file_is_a_truncation_and_so_is_a_cut_frame() {
        let mut f = header(1, 2, 8_000, 16, 1000);
        f.extend_from_slice(&[1, 0, 2, 0, 3, 0, 4, 0]);
        let len = f.len() as u64;
        let e = WavReader::new(&f[..], Some(len)).err().unwrap().to_string();
        assert!(e.contains("announces 1000 bytes of samples, the file holds 8"), "{e}");
        // Without the stream length, the truncation shows when the samples run out.
        let e = WavReader::new(&f[..], None).unwrap().read_all().unwrap_err();
        assert!(matches!(e, WavError::Truncated(_)), "{e:?}");
        let mut f = header(1, 2, 8_000, 16, u32::MAX);
        f.extend_from_slice(&[1, 0, 2, 0, 3, 0, 4, 0, 9]);
        let e = WavReader::new(&f[..], Some(f.len() as u64)).unwrap().read_all().unwrap_err();
        assert!(e.to_string().contains("inside sample frame 2"), "{e}");
    }

    #[test]
    fn non_finite_floats_are_refused_with_their_time() {
        let mut f = header(3, 1, 1_000, 32, 12);
        for v in [0.25f32, f32::INFINITY, 0.0] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        let e = WavReader::new(&f[..], None).unwrap().read_all().unwrap_err().to_string();
        assert!(e.contains("sample frame 1 (0.001 s)"), "{e}");
    }

    #[test]
    fn formats_and_bad_headers() {
        let mut f = header(1, 1, 8_000, 24, 6);
        f.extend_from_slice(&[0, 0, 0x80, 0xff, 0xff, 0x7f]);
        let v = WavReader::new(&f[..], None).unwrap().read_all().unwrap();
        assert_eq!(v, vec![-1.0, 8_388_607.0 / 8_388_608.0]);
        let mut f = header(1, 1, 8_000, 8, 2);
        f.extend_from_slice(&[0, 255]);
        assert_eq!(WavReader::new(&f[..], None).unwrap().read_all().unwrap(), vec![-1.0, 127.0 / 128.0]);
        for (tag, ch, rate, bits, want) in [
            (1, 1, 8_000, 12, "12-bit integer"),
            (3, 1, 8_000, 64, "64-bit float"),
            (2, 1, 8_000, 16, "audio format 2"),
            (1, 0, 8_000, 16, "0 channels"),
            (1, 1, 0, 16, "sample rate 0"),
        ] {
            let e = WavReader::new(&header(tag, ch, rate, bits, 0)[..], None).err().unwrap().to_string();
            assert!(e.contains(want), "{e}");
        }
        let mut f = header(1, 1, 8_000, 16, 2);
        f.truncate(30);
        assert!(matches!(WavReader::new(&f[..], None).err().unwrap(), WavError::Truncated(_)));
        assert!(matches!(WavReader::new(&b"RIFF\0\0\0\0AVI LIST"[..], None).err().unwrap(), WavError::NotWav(_)));
    }
}
