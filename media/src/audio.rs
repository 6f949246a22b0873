//! WAV input: any sample rate, any channel count, 8/16/24/32-bit integer or 32-bit float PCM
//! ([`crate::wav`]), downmixed to mono and resampled to 16 kHz f32 (rubato's synchronous FFT
//! resampler), plus the samples the MP4 audio track is encoded from.

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
    WavReader::new(std::io::BufReader::new(file), Some(len)).map_err(|e| wav_err(path, e))
}

fn wav_err(path: &Path, e: WavError) -> MediaError {
    match e {
        WavError::NotWav(detail) => MediaError::NotWav { path: path_str(path), detail },
        WavError::Truncated(detail) => MediaError::TruncatedWav { path: path_str(path), detail },
        WavError::Io(detail) => MediaError::Io { path: path_str(path), error: std::io::Error::other(detail) },
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
    let interleaved = reader.read_all().map_err(|e| wav_err(path, e))?;
    audio_from_interleaved(interleaved, reader.format()).map_err(|e| match e {
        MediaError::EmptyAudio { .. } => MediaError::EmptyAudio { path: path_str(path) },
        other => other,
    })
}

/// Builds an [`Audio`] from interleaved samples in `format` (the source of any WAV reader).
pub fn audio_from_interleaved(interleaved: Vec<f32>, format: WavFormat) -> Result<Audio> {
    let channels = format.channels as usize;
    let frames = interleaved.len() / channels;
    if frames == 0 {
        return Err(MediaError::EmptyAudio { path: String::new() });
    }
    let spec = format;
    let mono: Vec<f32> = if channels == 1 {
        interleaved.clone()
    } else {
        interleaved.chunks_exact(channels).map(|f| f.iter().sum::<f32>() / channels as f32).collect()
    };
    let samples_16k = resample(&mono, spec.sample_rate, TARGET_RATE)?;

    // The track keeps the source's rate where AAC can signal it (up to 48 kHz; the mp4a
    // sample entry holds the rate in 16 bits), otherwise it is resampled to 48 kHz. One or
    // two channels are kept, more are downmixed to mono.
    let track_rate =
        if AAC_RATES.contains(&spec.sample_rate) && spec.sample_rate <= 48_000 { spec.sample_rate } else { 48_000 };
    let track_channels: Vec<Vec<f32>> = if channels <= 2 {
        (0..channels).map(|c| interleaved.iter().skip(c).step_by(channels).copied().collect()).collect()
    } else {
        vec![mono]
    };
    let track_channels =
        track_channels.into_iter().map(|ch| resample(&ch, spec.sample_rate, track_rate)).collect::<Result<Vec<_>>>()?;
    let track_frames = track_channels[0].len();
    let mut track_samples = Vec::with_capacity(track_frames * track_channels.len());
    for i in 0..track_frames {
        for ch in &track_channels {
            track_samples.push(f32_to_i16(ch[i]));
        }
    }
    let track = AudioTrack { sample_rate: track_rate, channels: track_channels.len() as u16, samples: track_samples };

    Ok(Audio {
        samples_16k,
        source_rate: spec.sample_rate,
        source_channels: format.channels,
        duration_s: frames as f64 / spec.sample_rate as f64,
        track,
    })
}

/// Number of output samples for `n` input samples: `round(n * to / from)`.
pub fn resampled_len(n: usize, from: u32, to: u32) -> usize {
    ((n as u128 * to as u128 + from as u128 / 2) / from as u128) as usize
}

/// Resamples a mono signal with rubato's synchronous FFT resampler (`FftFixedIn`), removing
/// its delay, so the output has exactly [`resampled_len`] samples aligned with the input.
pub fn resample(mono: &[f32], from: u32, to: u32) -> Result<Vec<f32>> {
    if from == to {
        return Ok(mono.to_vec());
    }
    let err = |detail: String| MediaError::Resample { from, to, detail };
    let want = resampled_len(mono.len(), from, to);
    let chunk = 1024;
    let mut rs = FftFixedIn::<f32>::new(from as usize, to as usize, chunk, 2, 1).map_err(|e| err(e.to_string()))?;
    let delay = rs.output_delay();
    let mut out: Vec<f32> = Vec::with_capacity(want + delay + chunk);
    let mut pos = 0;
    while mono.len() - pos >= rs.input_frames_next() {
        let n = rs.input_frames_next();
        let o = rs.process(&[&mono[pos..pos + n]], None).map_err(|e| err(e.to_string()))?;
        out.extend_from_slice(&o[0]);
        pos += n;
    }
    if pos < mono.len() {
        let o = rs.process_partial(Some(&[&mono[pos..]]), None).map_err(|e| err(e.to_string()))?;
        out.extend_from_slice(&o[0]);
    }
    // Flush the resampler's delay line with silence until the aligned output is complete.
    while out.len() < want + delay {
        let o = rs.process_partial::<&[f32]>(None, None).map_err(|e| err(e.to_string()))?;
        if o[0].is_empty() {
            return Err(err("the resampler produced no output while flushing".into()));
        }
        out.extend_from_slice(&o[0]);
    }
    Ok(out[delay..delay + want].to_vec())
}
