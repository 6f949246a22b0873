//! Generates the text clip of `adaptive_strides`: speech from libespeak-ng and the phoneme
//! alignment from its phoneme events, committed in `experiments/assets/` so that the experiment
//! and the tests run without espeak-ng installed.
//!
//! Writes (default names; `--out-dir` to choose):
//! - `text_clip.wav`: 16-bit mono at espeak-ng's rate;
//! - `text_clip.phonemes.json`: `[{"start", "end", "phoneme"}]`, IPA names as espeak-ng reports
//!   them (an empty name is a pause);
//! - `text_clip.source.json`: the text (SSML), voice, rate and the espeak-ng version.
//!
//! Needs libespeak-ng (Debian: `apt-get install libespeak-ng1`):
//! `cargo run --release -p experiments --bin make_text_clip`.

use anyhow::{ensure, Result};
use cadence::schedules::espeak;
use clap::Parser;
use std::path::PathBuf;

/// A newscast-style text rich in bilabial and labiodental closures (p, b, m, f, v), with
/// pauses long enough for the pipeline's silence bypass between paragraphs.
pub const TEXT: &str = r#"<speak>Good evening. The mayor promised more buses, bike paths and better pavements by the month of March. <break time="1500ms"/> Meanwhile, five families from the valley moved back to Bramble Park, where the power is finally back on. <break time="1200ms"/> Before we move on, a brief look at the weather: warm, bright and breezy by Friday. <break time="1500ms"/> From all of us, thank you for watching.</speak>"#;

#[derive(Parser)]
#[command(about = "Speak the adaptive_strides text clip with libespeak-ng: WAV + phoneme alignment + source notes")]
struct Args {
    /// Directory for the three files [default: experiments/assets in the workspace]
    #[arg(long)]
    out_dir: Option<PathBuf>,
    #[arg(long, default_value = espeak::DEFAULT_VOICE)]
    voice: String,
    /// Words per minute.
    #[arg(long, default_value_t = espeak::DEFAULT_RATE_WPM)]
    rate: u32,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("make_text_clip: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<()> {
    let dir = match a.out_dir {
        Some(d) => experiments::paths::ensure_dir(&d)?,
        None => experiments::workspace_root().join("experiments/assets"),
    };
    let speech = espeak::speak(TEXT, &a.voice, a.rate)?;
    ensure!(!speech.alignment.phones().is_empty(), "espeak-ng reported no phonemes");
    let wav = dir.join("text_clip.wav");
    let json = dir.join("text_clip.phonemes.json");
    let source = dir.join("text_clip.source.json");
    // Written beside the targets, then renamed: a failure leaves the committed files alone.
    let tmp = |p: &PathBuf| p.with_extension(format!("partial-{}", std::process::id()));
    let result = (|| -> Result<()> {
        speech.write_wav(&tmp(&wav))?;
        std::fs::write(tmp(&json), speech.alignment.to_json() + "\n")?;
        let notes = serde_json::json!({
            "text": TEXT,
            "voice": a.voice,
            "rate_wpm": a.rate,
            "espeak_ng": speech.version,
            "sample_rate": speech.sample_rate,
            "samples": speech.samples.len(),
            "generated_by": "cargo run --release -p experiments --bin make_text_clip",
        });
        std::fs::write(tmp(&source), serde_json::to_string_pretty(&notes)? + "\n")?;
        for p in [&wav, &json, &source] {
            std::fs::rename(tmp(p), p)?;
        }
        Ok(())
    })();
    if result.is_err() {
        for p in [&wav, &json, &source] {
            let _ = std::fs::remove_file(tmp(p));
        }
    }
    result?;
    println!(
        "{:.2} s of speech at {} Hz, {} phonemes (espeak-ng {}) -> {}, {}, {}",
        speech.duration_s(),
        speech.sample_rate,
        speech.alignment.phones().len(),
        speech.version,
        wav.display(),
        json.display(),
        source.display()
    );
    Ok(())
}
