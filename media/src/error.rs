//! One error type for the crate. Every message is a single line that names the file (where
//! there is one) and what is wrong with it, so the CLI can print it as is.

use std::path::Path;

/// Errors of the media crate. `Display` is one line, meant for the end user.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// The file could not be opened, read or written. (The OS error is part of the message and
    /// deliberately not an error `source`, which would print it twice in a chain.)
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    /// The file is not a WAV file (or not PCM/float audio that WAV can carry).
    #[error("{path}: not a WAV audio file ({detail})")]
    NotWav { path: String, detail: String },
    /// The WAV header or data ends before what the header announces.
    #[error("{path}: truncated WAV file ({detail})")]
    TruncatedWav { path: String, detail: String },
    /// The WAV file holds no samples.
    #[error("{path}: zero-length audio (the WAV file holds no samples)")]
    EmptyAudio { path: String },
    /// Sample-rate conversion failed.
    #[error("resampling {from} Hz to {to} Hz failed: {detail}")]
    Resample { from: u32, to: u32, detail: String },
    /// The image could not be read, or its size is outside the accepted range.
    #[error("{path}: {detail}")]
    Image { path: String, detail: String },
    /// A face box that does not fit the image, or has no area.
    #[error("face box {x},{y} {w}x{h}: {detail}")]
    FaceBox { x: u32, y: u32, w: u32, h: u32, detail: String },
    /// Invalid arguments to a function of this crate (sizes, frame rates, buffer lengths).
    #[error("{0}")]
    InvalidInput(String),
    /// The requested encoder is not part of this build or not usable on this machine.
    #[error("{0}")]
    EncoderUnavailable(String),
    /// The video or audio encoder failed.
    #[error("{encoder} encoder: {detail}")]
    Encode { encoder: String, detail: String },
    /// The Silero VAD model could not be loaded or run (see [`crate::vad::silero`]).
    #[error("Silero VAD: {0}")]
    Model(String),
    /// Writing or reading the MP4 container failed.
    #[error("{path}: MP4: {detail}")]
    Mp4 { path: String, detail: String },
}

/// `Result` with [`MediaError`].
pub type Result<T> = std::result::Result<T, MediaError>;

pub(crate) fn io_err(path: &Path, error: std::io::Error) -> MediaError {
    MediaError::Io { path: path.display().to_string(), error }
}
