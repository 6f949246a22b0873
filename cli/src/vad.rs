//! `cadence vad AUDIO.wav`: speech segments of a WAV file by Silero VAD (cadence-media's
//! `vad::silero`, the embedded ONNX model's weights in cadence's own network): the file is read and resampled to
//! 16 kHz by cadence's WAV reader, goes through cadence's front end (noise suppression and AGC,
//! `vad::denoise`; `--denoise off` skips it), every 512-sample chunk gets a speech probability,
//! and Silero's own post-processing (`get_speech_timestamps`) turns them into segments. `--json`
//! prints the probabilities too.

use anyhow::{bail, Context, Result};
use cadence_media::vad::silero::{self, SileroConfig, CHUNK_SAMPLES, SAMPLE_RATE};
use clap::Args;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

#[derive(Args)]
pub struct VadArgs {
    /// The WAV file (any rate and channel count; downmixed and resampled to 16 kHz).
    audio: PathBuf,
    /// Print a JSON object instead: model, sample_rate, chunk_samples, probabilities (one per
    /// 512-sample chunk) and segments ([[start_s, end_s], ...]).
    #[arg(long)]
    json: bool,
    /// A chunk at or above this probability is speech.
    #[arg(long, default_value_t = 0.5)]
    threshold: f64,
    /// Inside speech, a chunk below this is silence [default: max(threshold - 0.15, 0.01)].
    #[arg(long)]
    neg_threshold: Option<f64>,
    /// Segments this short or shorter are dropped (milliseconds).
    #[arg(long, default_value_t = 250.0)]
    min_speech_ms: f64,
    /// Silence must last this long to end a segment (milliseconds).
    #[arg(long, default_value_t = 100.0)]
    min_silence_ms: f64,
    /// Each segment is widened by this much on each side (milliseconds).
    #[arg(long, default_value_t = 30.0)]
    speech_pad_ms: f64,
    /// Segments longer than this are cut, at their longest silence where there is one (seconds)
    /// [default: no limit].
    #[arg(long)]
    max_speech_s: Option<f64>,
    /// Noise suppression and level normalisation before the network (`on`, as every render
    /// runs Silero by default) or `off` (the samples as they are, as the Silero wheel runs).
    #[arg(long, value_enum, default_value = "on")]
    denoise: cadence::args::OnOff,
}

pub fn run(a: VadArgs) -> Result<()> {
    let cfg = SileroConfig {
        threshold: a.threshold,
        neg_threshold: a.neg_threshold,
        min_speech_duration_ms: a.min_speech_ms,
        max_speech_duration_s: a.max_speech_s.unwrap_or(f64::INFINITY),
        min_silence_duration_ms: a.min_silence_ms,
        speech_pad_ms: a.speech_pad_ms,
        denoise: a.denoise.is_on(),
        ..SileroConfig::default()
    };
    cfg.validate()?;
    if !(0.0..=1.0).contains(&cfg.threshold) {
        bail!("--threshold must be within 0..=1, got {}", cfg.threshold);
    }
    let audio = cadence_media::load_wav(&a.audio)?;
    let probs = silero::speech_probabilities(&audio.samples_16k, &cfg).context("running Silero VAD")?;
    let segments = silero::speech_segments(&probs, audio.samples_16k.len(), &cfg);
    let mut text = String::new();
    if a.json {
        let report = serde_json::json!({
            "model": silero::MODEL_FILE,
            "model_sha256": silero::MODEL_SHA256,
            "sample_rate": SAMPLE_RATE,
            "chunk_samples": CHUNK_SAMPLES,
            "denoise": cfg.denoise,
            "probabilities": probs,
            "segments": segments.iter().map(|s| [s.start_s(), s.end_s()]).collect::<Vec<_>>(),
        });
        writeln!(text, "{}", serde_json::to_string(&report)?)?;
    } else {
        let speech: f64 = segments.iter().map(|s| s.end_s() - s.start_s()).sum();
        writeln!(
            text,
            "{}: {:.3} s, {} speech segment(s), {:.3} s of speech (Silero VAD, threshold {}, front end {})",
            a.audio.display(),
            audio.duration_s,
            segments.len(),
            speech,
            cfg.threshold,
            if cfg.denoise { "on" } else { "off" }
        )?;
        for s in &segments {
            writeln!(text, "{:9.3} {:9.3}", s.start_s(), s.end_s())?;
        }
    }
    // A reader that stops early (`| head`) is not an error.
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.context("writing to standard output")?,
    }
    Ok(())
}
