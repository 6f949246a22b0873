//! WAV input: any sample rate, any channel count, 8/16/24/32-bit integer or 32-bit float PCM
//! ([`crate::wav`]), downmixed to mono and resampled to 16 kHz f32 (rubato's synchronous FFT
//! resampler), plus the samples the MP4 audio track is encoded from.

use std::io::Read;
use std::path::Path;

use rubato::{FftFixedIn, Resampler};

use crate::error::{io_err, MediaError, Result};
use crate::wav::{WavError, WavFormat, WavReader};

/// The sample rate every analysis path works at (whisper, VAD).
pub const TARGET_RATE: u32 = 16_000;

/// Sample rates that AAC (and so the MP4 audio track) can signal with a sampling-frequency
/// index (ISO/IEC 14496-3 table 1.18). A WAV at one of these rates is muxed at its own rate.
pub const AAC_RATES: [u32; 13] =
    [96_000, 88_200, 64_000, 48_000, 44_100, 32_000, 24_000, 22_050, 16_000, 12_000, 11_025, 8_000, 7_350];

/// Audio samples for the MP4 audio track: interleaved 16-bit PCM at a rate AAC can carry.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioTrack {
    /// One of [`AAC_RATES`].
    pub sample_rate: u32,
    /// 1 or 2.
    pub channels: u16,
    /// Interleaved samples, `frames * channels` long.
    pub samples: Vec<i16>,
}

impl AudioTrack {
    /// Number of sample frames (samples per channel).
    pub fn frames(&self) -> usize {
        self.samples.len() / self.channels.max(1) as usize
    }

    pub fn format(&self) -> AudioFormat {
        AudioFormat { sample_rate: self.sample_rate, channels: self.channels }
    }
}

/// Sample rate and channel count of an audio track: what a stream's audio track is declared
/// with before any of its audio has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioFormat {
    /// One of [`AAC_RATES`].
    pub sample_rate: u32,
    /// 1 or 2.
    pub channels: u16,
}

/// A decoded audio clip.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Mono, 16 kHz, f32 in [-1, 1]: the analysis signal (VAD, audio features).
    pub samples_16k: Vec<f32>,
    /// Sample rate of the source file.
    pub source_rate: u32,
    /// Channel count of the source file.
    pub source_channels: u16,
    /// Duration of the source in seconds (source frames / source rate).
    pub duration_s: f64,
    /// What the MP4 audio track is encoded from: the source's samples at the source rate when
    /// AAC can signal it (8 to 48 kHz), else resampled to 48 kHz; one or two channels kept,
    /// more downmixed to mono.
    pub track: AudioTrack,
}

impl Audio {
    /// Wraps an already 16 kHz mono signal (synthetic audio in experiments and tests).
    pub fn from_samples_16k(samples_16k: Vec<f32>) -> Self {
        let duration_s = samples_16k.len() as f64 / TARGET_RATE as f64;
        let track = AudioTrack {
            sample_rate: TARGET_RATE,
            channels: 1,
            samples: samples_16k.iter().map(|&s| f32_to_i16(s)).collect(),
        };
        Audio { samples_16k, source_rate: TARGET_RATE, source_channels: 1, duration_s, track }
    }
}

fn f32_to_i16(s: f32) -> i16 {
    (s.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

fn path_str(path: &Path) -> String {
    path.display().to_string()
}

/// Opens a WAV file positioned at its first sample (see [`crate::wav`] for what is accepted).
fn open(path: &Path) -> Result<WavReader<std::io::BufReader<std::fs::File>>> {
    let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let len = file.metadata().map_err(|e| io_err(path, e))?.len();
    if len == 0 {
        return Err(MediaError::NotWav { path: path_str(path), detail: "the file is empty".into() });
    }
    WavReader::new(std::io::BufReader::new(file), Some(len)).map_err(|e| wav_err(&path_str(path), e))
}

/// A WAV reader's error, naming its source (a path, or "standard input").
pub fn wav_err(name: &str, e: WavError) -> MediaError {
    let path = name.to_string();
    match e {
        WavError::NotWav(detail) => MediaError::NotWav { path, detail },
        WavError::Truncated(detail) => MediaError::TruncatedWav { path, detail },
        WavError::Io(detail) => MediaError::Io { path, error: std::io::Error::other(detail) },
    }
}

/// Duration in seconds of the samples the WAV file holds, from its header and length, without
/// decoding them: lets the caller reject a too-long file (`--max-seconds`) before the work of
/// loading it. A placeholder data size (a WAV written to a pipe) counts what the file holds.
pub fn wav_duration(path: impl AsRef<Path>) -> Result<f64> {
    let path = path.as_ref();
    let reader = open(path)?;
    let frames = reader.frames_total().unwrap_or(0);
    Ok(frames as f64 / reader.format().sample_rate as f64)
}

/// Loads a WAV file: downmix to mono, resample to 16 kHz (see [`Audio`]).
///
/// Errors (each one line, naming the file): not a WAV / not PCM audio, truncated header or
/// data, zero samples, non-finite float samples, unsupported sample format.
pub fn load_wav(path: impl AsRef<Path>) -> Result<Audio> {
    let path = path.as_ref();
    let mut reader = open(path)?;
    let interleaved = reader.read_all().map_err(|e| wav_err(&path_str(path), e))?;
    audio_from_interleaved(interleaved, reader.format()).map_err(|e| match e {
        MediaError::EmptyAudio { .. } => MediaError::EmptyAudio { path: path_str(path) },
        other => other,
    })
}

/// Builds an [`Audio`] from interleaved samples in `format` (the source of any WAV reader):
/// an [`AudioDecoder`] given all of them at once.
pub fn audio_from_interleaved(interleaved: Vec<f32>, format: WavFormat) -> Result<Audio> {
    let channels = format.channels as usize;
    let frames = interleaved.len() / channels.max(1);
    if frames == 0 {
        return Err(MediaError::EmptyAudio { path: String::new() });
    }
    let mut decoder = AudioDecoder::new(format)?;
    let track_format = decoder.track_format();
    let mut samples_16k = Vec::with_capacity(resampled_len(frames, format.sample_rate, TARGET_RATE));
    let mut track = Vec::new();
    decoder.push(&interleaved, &mut samples_16k, &mut track)?;
    drop(interleaved);
    decoder.finish(&mut samples_16k, &mut track)?;
    Ok(Audio {
        samples_16k,
        source_rate: format.sample_rate,
        source_channels: format.channels,
        duration_s: frames as f64 / format.sample_rate as f64,
        track: AudioTrack { sample_rate: track_format.sample_rate, channels: track_format.channels, samples: track },
    })
}

/// The format of the MP4 track made from a source in `format`: the source's rate where AAC can
/// signal it (up to 48 kHz; the mp4a sample entry holds the rate in 16 bits), otherwise 48 kHz;
/// one or two channels kept, more downmixed to mono.
pub fn track_format(format: WavFormat) -> AudioFormat {
    let rate = format.sample_rate;
    let sample_rate = if AAC_RATES.contains(&rate) && rate <= 48_000 { rate } else { 48_000 };
    AudioFormat { sample_rate, channels: if format.channels <= 2 { format.channels } else { 1 } }
}

/// Interleaved source samples in, [`Audio`]'s two signals out, in pieces: the 16 kHz mono
/// analysis signal (the channels' mean, resampled) and the MP4 track's 16-bit samples
/// ([`track_format`]). The output is the same, sample for sample, however the input is cut
/// ([`StreamResampler`]); [`load_wav`] is this decoder given the whole file.
pub struct AudioDecoder {
    channels: usize,
    to_16k: StreamResampler,
    /// One resampler per track channel, and each one's output not yet interleaved.
    track: Vec<StreamResampler>,
    track_out: Vec<Vec<f32>>,
    track_format: AudioFormat,
    mono: Vec<f32>,
    channel: Vec<f32>,
}

impl AudioDecoder {
    pub fn new(format: WavFormat) -> Result<Self> {
        let track_format = track_format(format);
        let track = (0..track_format.channels)
            .map(|_| StreamResampler::new(format.sample_rate, track_format.sample_rate))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            channels: format.channels.max(1) as usize,
            to_16k: StreamResampler::new(format.sample_rate, TARGET_RATE)?,
            track_out: vec![Vec::new(); track.len()],
            track,
            track_format,
            mono: Vec::new(),
            channel: Vec::new(),
        })
    }

    pub fn track_format(&self) -> AudioFormat {
        self.track_format
    }

    /// Decodes whole interleaved frames: appends the 16 kHz samples they determine to
    /// `samples_16k` and the track's interleaved samples to `track`.
    pub fn push(&mut self, interleaved: &[f32], samples_16k: &mut Vec<f32>, track: &mut Vec<i16>) -> Result<()> {
        let ch = self.channels;
        self.mono.clear();
        if ch == 1 {
            self.mono.extend_from_slice(interleaved);
        } else {
            self.mono.extend(interleaved.chunks_exact(ch).map(|f| f.iter().sum::<f32>() / ch as f32));
        }
        self.to_16k.push(&self.mono, samples_16k)?;
        for (c, (rs, out)) in self.track.iter_mut().zip(&mut self.track_out).enumerate() {
            if ch <= 2 {
                self.channel.clear();
                self.channel.extend(interleaved.iter().skip(c).step_by(ch));
                rs.push(&self.channel, out)?;
            } else {
                rs.push(&self.mono, out)?;
            }
        }
        self.interleave(track);
        Ok(())
    }

    /// Ends the input: appends the rest of both signals.
    pub fn finish(self, samples_16k: &mut Vec<f32>, track: &mut Vec<i16>) -> Result<()> {
        let AudioDecoder { to_16k, track: resamplers, mut track_out, .. } = self;
        to_16k.finish(samples_16k)?;
        for (rs, out) in resamplers.into_iter().zip(&mut track_out) {
            rs.finish(out)?;
        }
        interleave(&mut track_out, track);
        Ok(())
    }

    fn interleave(&mut self, track: &mut Vec<i16>) {
        interleave(&mut self.track_out, track);
    }
}

/// Moves the frames every channel of `channels` has into `track`, interleaved as 16-bit samples.
fn interleave(channels: &mut [Vec<f32>], track: &mut Vec<i16>) {
    let n = channels.iter().map(Vec::len).min().unwrap_or(0);
    for i in 0..n {
        for out in channels.iter() {
            track.push(f32_to_i16(out[i]));
        }
    }
    for out in channels.iter_mut() {
        out.drain(..n);
    }
}

/// A WAV decoded as it is read (a file, or a pipe being written): an [`AudioDecoder`] fed from a
/// [`WavReader`] a piece at a time, so what it holds does not grow with the clip.
pub struct AudioStream<R: Read> {
    reader: WavReader<R>,
    decoder: Option<AudioDecoder>,
    name: String,
    buf: Vec<f32>,
}

impl<R: Read> AudioStream<R> {
    /// `name` names the source in errors (a path, or "standard input").
    pub fn new(reader: WavReader<R>, name: &str) -> Result<Self> {
        let decoder = AudioDecoder::new(reader.format())?;
        Ok(Self { reader, decoder: Some(decoder), name: name.to_string(), buf: Vec::new() })
    }

    pub fn reader(&self) -> &WavReader<R> {
        &self.reader
    }

    pub fn track_format(&self) -> AudioFormat {
        track_format(self.reader.format())
    }

    /// Reads up to `max_frames` source frames and appends what they decode to (see
    /// [`AudioDecoder::push`]). At the end of the data it flushes the decoder and returns
    /// `false`; later calls return `false` and add nothing. A source with no samples at all is
    /// [`MediaError::EmptyAudio`].
    pub fn read(&mut self, max_frames: usize, samples_16k: &mut Vec<f32>, track: &mut Vec<i16>) -> Result<bool> {
        let Some(decoder) = self.decoder.as_mut() else {
            return Ok(false);
        };
        self.buf.clear();
        let n = self.reader.read_frames(max_frames.max(1), &mut self.buf).map_err(|e| wav_err(&self.name, e))?;
        if n > 0 {
            decoder.push(&self.buf, samples_16k, track)?;
            return Ok(true);
        }
        if self.reader.frames_read() == 0 {
            return Err(MediaError::EmptyAudio { path: self.name.clone() });
        }
        self.decoder.take().expect("checked above").finish(samples_16k, track)?;
        Ok(false)
    }
}

/// Opens a WAV file as an [`AudioStream`] positioned at its first sample.
pub fn open_wav_stream(path: impl AsRef<Path>) -> Result<AudioStream<std::io::BufReader<std::fs::File>>> {
    let path = path.as_ref();
    AudioStream::new(open(path)?, &path_str(path))
}

/// Number of output samples for `n` input samples: `round(n * to / from)`.
pub fn resampled_len(n: usize, from: u32, to: u32) -> usize {
    ((n as u128 * to as u128 + from as u128 / 2) / from as u128) as usize
}

/// Resamples a mono signal with rubato's synchronous FFT resampler (`FftFixedIn`), removing
/// its delay, so the output has exactly [`resampled_len`] samples aligned with the input. It is
/// a [`StreamResampler`] given the whole signal at once.
pub fn resample(mono: &[f32], from: u32, to: u32) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(resampled_len(mono.len(), from, to));
    let mut rs = StreamResampler::new(from, to)?;
    rs.push(mono, &mut out)?;
    rs.finish(&mut out)?;
    Ok(out)
}

/// [`resample`] for a signal that arrives in pieces (a WAV read as it is written): the output
/// is the same, sample for sample, however the input is cut, because the resampler always
/// sees the same 1024-sample chunks in the same order; only the time each output sample
/// becomes available depends on the pieces.
pub struct StreamResampler {
    from: u32,
    to: u32,
    /// `None` when `from == to` (the samples pass through).
    rs: Option<FftFixedIn<f32>>,
    /// Input not yet a whole chunk.
    pending: Vec<f32>,
    /// Leading output samples still to drop (the resampler's delay).
    delay_left: usize,
    /// Output held back: past `resampled_len` of the input so far, it may not be part of the
    /// aligned output (known at [`Self::finish`]).
    held: Vec<f32>,
    consumed: usize,
    emitted: usize,
}

impl StreamResampler {
    const CHUNK: usize = 1024;

    pub fn new(from: u32, to: u32) -> Result<Self> {
        let rs = if from == to {
            None
        } else {
            let rs = FftFixedIn::<f32>::new(from as usize, to as usize, Self::CHUNK, 2, 1)
                .map_err(|e| MediaError::Resample { from, to, detail: e.to_string() })?;
            Some(rs)
        };
        let delay_left = rs.as_ref().map_or(0, |r| r.output_delay());
        Ok(Self { from, to, rs, pending: Vec::new(), delay_left, held: Vec::new(), consumed: 0, emitted: 0 })
    }

    fn err(&self, detail: String) -> MediaError {
        MediaError::Resample { from: self.from, to: self.to, detail }
    }

    /// Appends to `out` the output samples the input so far determines.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) -> Result<()> {
        self.consumed += input.len();
        let Some(rs) = self.rs.as_mut() else {
            out.extend_from_slice(input);
            self.emitted += input.len();
            return Ok(());
        };
        self.pending.extend_from_slice(input);
        let mut pos = 0;
        let mut produced = Vec::new();
        while self.pending.len() - pos >= rs.input_frames_next() {
            let n = rs.input_frames_next();
            let o = rs.process(&[&self.pending[pos..pos + n]], None).map_err(|e| e.to_string());
            let o = o.map_err(|d| MediaError::Resample { from: self.from, to: self.to, detail: d })?;
            produced.extend_from_slice(&o[0]);
            pos += n;
        }
        self.pending.drain(..pos);
        self.take(&produced, out);
        Ok(())
    }

    /// Drops the delay, then emits up to `resampled_len` of the input so far and holds the rest.
    fn take(&mut self, produced: &[f32], out: &mut Vec<f32>) {
        let skip = self.delay_left.min(produced.len());
        self.delay_left -= skip;
        self.held.extend_from_slice(&produced[skip..]);
        let limit = resampled_len(self.consumed, self.from, self.to);
        let n = limit.saturating_sub(self.emitted).min(self.held.len());
        out.extend(self.held.drain(..n));
        self.emitted += n;
    }

    /// Ends the signal: appends the rest of the output, so that `out` has received exactly
    /// [`resampled_len`] of all the input in all.
    pub fn finish(mut self, out: &mut Vec<f32>) -> Result<()> {
        let want = resampled_len(self.consumed, self.from, self.to);
        let Some(mut rs) = self.rs.take() else {
            return Ok(());
        };
        if !self.pending.is_empty() {
            let o = rs.process_partial(Some(&[&self.pending]), None).map_err(|e| self.err(e.to_string()))?;
            self.take(&o[0], out);
        }
        // Flush the resampler's delay line with silence until the aligned output is complete.
        while self.emitted < want {
            let o = rs.process_partial::<&[f32]>(None, None).map_err(|e| self.err(e.to_string()))?;
            if o[0].is_empty() {
                return Err(self.err("the resampler produced no output while flushing".into()));
            }
            self.take(&o[0], out);
        }
        Ok(())
    }
}
