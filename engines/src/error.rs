//! Error type of the engines crate. Every weight problem names the tensor.

use std::path::PathBuf;

/// Errors returned by every public function of this crate.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("weights file {file}: missing tensor `{name}` (expected shape {expected:?})")]
    MissingTensor { file: PathBuf, name: String, expected: Vec<usize> },
    #[error("weights file {file}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { file: PathBuf, name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("weights file {file}: tensor `{name}` has dtype {dtype}, expected a float type (F32, F16, BF16, F64)")]
    BadDtype { file: PathBuf, name: String, dtype: String },
    #[error("weights file {file}: {msg}")]
    BadFile { file: PathBuf, msg: String },
    #[error("bad input: {0}")]
    BadInput(String),
    #[error("not available: {0}")]
    Unavailable(String),
    // The OS error is part of the message, not an error `source` (which would print it twice).
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, EngineError>;
