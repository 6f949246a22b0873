//! WAV input: any sample rate, any channel count, 8/16/24/32-bit integer or 32-bit float PCM
//! (hound), downmixed to mono and resampled to 16 kHz f32 (rubato's synchronous FFT
//! resampler), plus the samples the MP4 audio track is encoded from.

use std::path::Path;

use rubato::{FftFixedIn, Resampler};

use crate::error::{io_err, MediaError, Result};

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

/// Opens a WAV reader, mapping hound's errors to one-line messages that tell a file that is
/// not a WAV from one that is cut short.
fn open(path: &Path) -> Result<hound::WavReader<std::io::BufReader<std::fs::File>>> {
    // Read the first 12 bytes ourselves: hound reports a cut-off header and a non-WAV file
    // alike as an I/O or format error; the RIFF/WAVE magic tells them apart.
    let magic_ok = {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        let mut head = [0u8; 12];
        let n = f.read(&mut head).map_err(|e| io_err(path, e))?;
        if n == 0 {
            return Err(MediaError::NotWav { path: path_str(path), detail: "the file is empty".into() });
        }
        n == 12 && &head[0..4] == b"RIFF" && &head[8..12] == b"WAVE"
    };
    if !magic_ok {
        return Err(MediaError::NotWav { path: path_str(path), detail: "no RIFF/WAVE header".into() });
    }
    hound::WavReader::open(path).map_err(|e| match e {
        // The file opened and its first 12 bytes were read above, so a read failure here is
        // the header ending early (hound reports it as UnexpectedEof or "Failed to read
        // enough bytes").
        hound::Error::IoError(io) => MediaError::TruncatedWav {
            path: path_str(path),
            detail: format!("the header ends before the data chunk: {io}"),
        },
        other => MediaError::NotWav { path: path_str(path), detail: other.to_string() },
    })
}

/// Duration in seconds announced by the WAV header, without decoding the samples: lets the
/// caller reject a too-long file (`--max-seconds`) before the work of loading it.
pub fn wav_duration(path: impl AsRef<Path>) -> Result<f64> {
    let path = path.as_ref();
    let reader = open(path)?;
    let spec = reader.spec();
    if spec.sample_rate == 0 {
        return Err(MediaError::NotWav { path: path_str(path), detail: "sample rate 0".into() });
    }
    Ok(reader.duration() as f64 / spec.sample_rate as f64)
}

/// Loads a WAV file: downmix to mono, resample to 16 kHz (see [`Audio`]).
///
/// Errors (each one line, naming the file): not a WAV / not PCM audio, truncated header or
/// data, zero samples, unsupported sample format.
pub fn load_wav(path: impl AsRef<Path>) -> Result<Audio> {
    let path = path.as_ref();
    let mut reader = open(path)?;
    let spec = reader.spec();
    let channels = spec.channels as usize;
    if channels == 0 || spec.sample_rate == 0 {
        return Err(MediaError::NotWav {
            path: path_str(path),
            detail: format!("{} channels at {} Hz", spec.channels, spec.sample_rate),
        });
    }
    let announced = reader.len() as usize;
    if announced == 0 {
        return Err(MediaError::EmptyAudio { path: path_str(path) });
    }

    let truncated = |read: usize| MediaError::TruncatedWav {
        path: path_str(path),
        detail: format!("the header announces {announced} samples, the file holds {read}"),
    };
    let mut interleaved: Vec<f32> = Vec::with_capacity(announced);
    match spec.sample_format {
        hound::SampleFormat::Float => {
            if spec.bits_per_sample != 32 {
                return Err(MediaError::NotWav {
                    path: path_str(path),
                    detail: format!("{}-bit float samples are not supported", spec.bits_per_sample),
                });
            }
            for s in reader.samples::<f32>() {
                match s {
                    Ok(v) => interleaved.push(v),
                    Err(_) => return Err(truncated(interleaved.len())),
                }
            }
        }
        hound::SampleFormat::Int => {
            if spec.bits_per_sample == 0 || spec.bits_per_sample > 32 {
                return Err(MediaError::NotWav {
                    path: path_str(path),
                    detail: format!("{}-bit integer samples", spec.bits_per_sample),
                });
            }
            let scale = 1.0 / (1u64 << (spec.bits_per_sample - 1)) as f32;
            for s in reader.samples::<i32>() {
                match s {
                    Ok(v) => interleaved.push(v as f32 * scale),
                    Err(_) => return Err(truncated(interleaved.len())),
                }
            }
        }
    }
    if interleaved.len() < announced {
        return Err(truncated(interleaved.len()));
    }
    let frames = interleaved.len() / channels;
    if frames == 0 {
        return Err(MediaError::EmptyAudio { path: path_str(path) });
    }

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
        source_channels: spec.channels,
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
