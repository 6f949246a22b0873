//! A render's audio: decoded whole before the render ([`Audio`]: what a progressive MP4 and the
//! schedules that analyse the whole clip need), or read from the WAV as the render goes
//! ([`StreamedAudio`]: a windowed render with fragmented output, whose memory then does not
//! grow with the clip). Both give the same samples, so the same video.

use anyhow::{ensure, Result};
use cadence_engines::{ClipSamples, EngineError, WhisperAudio, WhisperClip};
use cadence_media::vad::{digital, silero};
use cadence_media::{frame_count, Audio, AudioFormat, AudioStream, HopLevels, VadConfig, TARGET_RATE};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Source frames read from the WAV at a time.
const READ_FRAMES: usize = 1 << 14;

pub enum ClipAudio {
    Whole(Audio),
    /// Boxed: its reader and resamplers are large next to [`Audio`].
    Streamed(Box<StreamedAudio>),
}

impl From<Audio> for ClipAudio {
    fn from(a: Audio) -> Self {
        ClipAudio::Whole(a)
    }
}

impl From<StreamedAudio> for ClipAudio {
    fn from(a: StreamedAudio) -> Self {
        ClipAudio::Streamed(Box::new(a))
    }
}

/// Video frames for `samples_16k` samples of 16 kHz audio at the render's frame rate:
/// ceil(seconds x fps).
pub fn frames_for_samples(samples_16k: usize, fps: f64) -> usize {
    frame_count(samples_16k as f64 / TARGET_RATE as f64, fps)
}

impl ClipAudio {
    /// The audio decoded whole, if it was.
    pub fn whole(&self) -> Option<&Audio> {
        match self {
            ClipAudio::Whole(a) => Some(a),
            ClipAudio::Streamed(_) => None,
        }
    }

    /// Samples of the 16 kHz analysis signal.
    pub fn samples_16k(&self) -> usize {
        match self {
            ClipAudio::Whole(a) => a.samples_16k.len(),
            ClipAudio::Streamed(s) => s.samples_16k,
        }
    }

    /// Video frames at `fps`.
    pub fn video_frames(&self, fps: f64) -> usize {
        frames_for_samples(self.samples_16k(), fps)
    }

    /// Voice activity per video frame, decided by `vad` over the whole clip (every detector
    /// give the same decisions for the audio decoded whole and read as a stream).
    pub fn voice_activity(&self, fps: f64, frames: usize, vad: &Vad) -> Result<Vec<bool>> {
        Ok(match (self, vad) {
            (ClipAudio::Whole(a), Vad::Energy) => cadence_media::voice_activity(&a.samples_16k, fps, frames),
            (ClipAudio::Whole(a), Vad::Silero(cfg)) => {
                silero::try_voice_activity_with(&a.samples_16k, fps, frames, cfg)?
            }
            (ClipAudio::Whole(a), Vad::Digital) => digital::voice_activity(&a.samples_16k, fps, frames),
            (ClipAudio::Streamed(s), Vad::Digital) => match &s.zero_runs {
                Some(runs) => runs.speech(0, frames, fps),
                None => anyhow::bail!("{}: the WAV's runs of zeros were not kept when it was opened", s.path.display()),
            },
            (ClipAudio::Streamed(s), Vad::Energy) => {
                cadence_media::voice_activity_from_levels(&s.levels, fps, frames, &VadConfig::default())
            }
            (ClipAudio::Streamed(s), Vad::Silero(cfg)) => {
                cfg.validate()?;
                let probs = match &s.silero {
                    Some((denoise, probs)) if *denoise == cfg.denoise => probs,
                    _ => anyhow::bail!(
                        "{}: Silero's probabilities were not made with this front end (denoise {}) when the WAV was opened",
                        s.path.display(),
                        cfg.denoise
                    ),
                };
                let segments = silero::speech_segments(probs, s.samples_16k, cfg);
                silero::frames_from_segments(&segments, fps, frames)
            }
        })
    }

    /// The MP4 track's format, `None` when the track has no samples.
    pub fn track_format(&self) -> Option<AudioFormat> {
        match self {
            ClipAudio::Whole(a) => (a.track.frames() > 0).then(|| a.track.format()),
            ClipAudio::Streamed(s) => (s.track_frames > 0).then_some(s.track_format),
        }
    }

    /// Sample frames of the MP4 track.
    pub fn track_frames(&self) -> usize {
        match self {
            ClipAudio::Whole(a) => a.track.frames(),
            ClipAudio::Streamed(s) => s.track_frames,
        }
    }

    /// Hands the track's sample frames `from..to` (interleaved 16-bit samples) to `f`. The
    /// calls must come in order, each starting where the last one ended.
    pub fn take_track(&self, from: usize, to: usize, f: &mut dyn FnMut(&[i16]) -> Result<()>) -> Result<()> {
        match self {
            ClipAudio::Whole(a) => {
                let ch = a.track.channels.max(1) as usize;
                f(&a.track.samples[from * ch..to * ch])
            }
            ClipAudio::Streamed(s) => s.take_track(from, to, f),
        }
    }

    /// The audio encoder's features of this clip, made as the render asks for them.
    pub fn whisper_clip<'a>(&'a self, whisper: &'a WhisperAudio, fps: f64) -> Result<WhisperClip<'a>> {
        Ok(match self {
            ClipAudio::Whole(a) => whisper.clip(&a.samples_16k, fps as f32)?,
            ClipAudio::Streamed(s) => whisper.clip_from(&**s, s.samples_16k, fps as f32)?,
        })
    }
}

/// A WAV file read as the render goes. Opening it reads it once to the end, keeping only its
/// 10 ms levels for voice activity (its loudness reference is a percentile of the whole clip's
/// levels) and checking every sample, so a bad file is refused before any rendering; the render
/// then reads it again, a piece at a time, as whisper's 30 s segments and the MP4 track need
/// it. What it holds is the levels (8 bytes per 10 ms) and the samples between the track's
/// position and whisper's (at most about two segments), whatever the clip's length.
pub struct StreamedAudio {
    path: PathBuf,
    samples_16k: usize,
    track_format: AudioFormat,
    track_frames: usize,
    levels: Vec<f64>,
    /// With Silero (the detector it was opened for): whether its front end ran
    /// ([`silero::SileroConfig::denoise`]), and the speech probability of every 512-sample chunk
    /// (4 bytes per 32 ms).
    silero: Option<(bool, Vec<f32>)>,
    /// With digital silence (the detector it was opened for): the runs of zeros.
    zero_runs: Option<digital::ZeroRuns>,
    state: Mutex<StreamState>,
}

struct StreamState {
    stream: AudioStream<BufReader<std::fs::File>>,
    more: bool,
    /// 16 kHz samples from `mono_from` on, read and not yet handed to whisper.
    mono: Vec<f32>,
    mono_from: usize,
    /// Track sample frames from `track_from` on (interleaved), read and not yet muxed.
    track: Vec<i16>,
    track_from: usize,
}

impl StreamedAudio {
    /// Opens `path` (see [`StreamedAudio`]), refusing more than `max_seconds` of audio before
    /// reading the samples; with `vad` Silero, its probabilities are made in the same pass, with
    /// or without its front end as `vad` says.
    pub fn open(path: &Path, max_seconds: f64, vad: &Vad) -> Result<Self> {
        let d = cadence_media::wav_duration(path)?;
        ensure!(d > 0.0, "{}: the audio has no samples", path.display());
        ensure!(d <= max_seconds, "{}: {d:.1} s of audio is longer than --max-seconds {max_seconds}", path.display());
        let mut first = cadence_media::open_wav_stream(path)?;
        let mut levels = HopLevels::new(&VadConfig::default());
        let mut silero = match vad {
            Vad::Silero(cfg) => Some((cfg.denoise, silero::ChunkProbabilities::new(cfg)?)),
            Vad::Energy | Vad::Digital => None,
        };
        let mut zero_runs = (*vad == Vad::Digital).then(digital::ZeroRuns::new);
        let (mut mono, mut track) = (Vec::new(), Vec::new());
        let (mut samples_16k, mut track_samples) = (0, 0);
        loop {
            let more = first.read(READ_FRAMES, &mut mono, &mut track)?;
            levels.push(&mono);
            if let Some((_, s)) = silero.as_mut() {
                s.push(&mono)?;
            }
            if let Some(z) = zero_runs.as_mut() {
                z.push(&mono);
            }
            samples_16k += mono.len();
            track_samples += track.len();
            mono.clear();
            track.clear();
            if !more {
                break;
            }
        }
        let track_format = first.track_format();
        let stream = cadence_media::open_wav_stream(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            samples_16k,
            track_format,
            track_frames: track_samples / track_format.channels.max(1) as usize,
            levels: levels.finish(),
            silero: match silero {
                Some((denoise, mut s)) => {
                    s.finish()?;
                    Some((denoise, s.take()))
                }
                None => None,
            },
            zero_runs,
            state: Mutex::new(StreamState {
                stream,
                more: true,
                mono: Vec::new(),
                mono_from: 0,
                track: Vec::new(),
                track_from: 0,
            }),
        })
    }

    /// Samples of the 16 kHz analysis signal.
    pub fn samples_16k(&self) -> usize {
        self.samples_16k
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, StreamState>> {
        self.state.lock().map_err(|_| anyhow::anyhow!("{}: the audio reader was poisoned", self.path.display()))
    }

    /// Reads on until `done` holds or the file ends.
    fn read_until(&self, st: &mut StreamState, done: impl Fn(&StreamState) -> bool) -> Result<()> {
        while !done(st) && st.more {
            st.more = st.stream.read(READ_FRAMES, &mut st.mono, &mut st.track)?;
        }
        Ok(())
    }

    fn take_track(&self, from: usize, to: usize, f: &mut dyn FnMut(&[i16]) -> Result<()>) -> Result<()> {
        let ch = self.track_format.channels.max(1) as usize;
        let mut st = self.lock()?;
        ensure!(from == st.track_from && from <= to, "track frames {from}..{to} asked for out of order");
        self.read_until(&mut st, |s| s.track_from + s.track.len() / ch >= to)?;
        let n = (to - from) * ch;
        ensure!(
            st.track.len() >= n,
            "{}: the file ended before track frame {to} (it held {} frames when opened)",
            self.path.display(),
            self.track_frames
        );
        f(&st.track[..n])?;
        st.track.drain(..n);
        st.track_from = to;
        Ok(())
    }

    fn read_mono(&self, from: usize, to: usize, out: &mut Vec<f32>) -> Result<()> {
        let mut st = self.lock()?;
        ensure!(from >= st.mono_from && from <= to, "samples {from}..{to} asked for after sample {}", st.mono_from);
        self.read_until(&mut st, |s| s.mono_from + s.mono.len() >= to)?;
        let (a, b) = (from - st.mono_from, to - st.mono_from);
        ensure!(
            st.mono.len() >= b,
            "{}: the file ended before sample {to} (it held {} when opened)",
            self.path.display(),
            self.samples_16k
        );
        out.extend_from_slice(&st.mono[a..b]);
        // Segments are asked for in order, each once: what came before this one is done.
        st.mono.drain(..b);
        st.mono_from = to;
        Ok(())
    }
}

impl ClipSamples for StreamedAudio {
    fn read_samples(&self, from: usize, to: usize, out: &mut Vec<f32>) -> cadence_engines::Result<()> {
        self.read_mono(from, to, out).map_err(|e| EngineError::BadInput(format!("{e:#}")))
    }
}

/// Which detector decides voice activity (docs/vad.md): which frames are speech, which ease
/// toward the rest state, which sustained silence bypasses every network.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Vad {
    /// Silero VAD v5, a trained network, with Silero's own post-processing (the default).
    Silero(silero::SileroConfig),
    /// The energy detector (RMS level against the clip's loudness, with a hangover): the
    /// fallback, and the comparison.
    Energy,
    /// Digital silence (`cadence_media::vad::digital`): a frame is silence when its samples are
    /// all zero. For audio whose pauses are written, not recorded (a live session's timeline,
    /// a synthesizer's output): no lookahead.
    Digital,
}

impl Default for Vad {
    fn default() -> Self {
        Vad::Silero(silero::SileroConfig::default())
    }
}

impl Vad {
    /// `silero` or `energy`, as `--vad` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            Vad::Silero(_) => "silero",
            Vad::Energy => "energy",
            Vad::Digital => "digital",
        }
    }
}

/// Reads the WAV, refusing files longer than `max_seconds` before decoding them. (The media
/// crate's errors name the file already.)
pub fn load_audio(path: &Path, max_seconds: f64) -> Result<Audio> {
    let d = cadence_media::wav_duration(path)?;
    ensure!(d > 0.0, "{}: the audio has no samples", path.display());
    ensure!(d <= max_seconds, "{}: {d:.1} s of audio is longer than --max-seconds {max_seconds}", path.display());
    Ok(cadence_media::load_wav(path)?)
}
