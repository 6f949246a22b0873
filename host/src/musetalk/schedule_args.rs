//! `cadence render`'s schedule and text-to-speech options, and what the render does with them:
//! checks before anything is loaded, the speech or audio input with its alignment, and the
//! schedule for the prepared clip. Kept here (not in the binary) so that every rule about the
//! options has one place and a test.

use crate::frame_loop::RenderOptions;
use crate::musetalk::render::Prepared;
use crate::musetalk::Engines;
use crate::schedules::{espeak, Alignment, Calibration, ClassStrides, Inputs, Planned, ScheduleKind, Target};
use anyhow::{bail, ensure, Context, Result};
use cadence_media::Audio;
use std::path::{Path, PathBuf};

/// The stride of a schedule when neither `--stride` nor `--budget` is given.
pub const DEFAULT_STRIDE: usize = 3;

#[derive(clap::Args, Clone, Debug)]
pub struct ScheduleArgs {
    /// Keyframe schedule: fixed (evenly over the speech runs), phonemes (from --phonemes or
    /// --text), audio (onset strength) or error-bounded (predicted infill error). Without it,
    /// --stride / --keyframes as before. See docs/adaptive_keyframes.md.
    #[arg(long, value_enum, conflicts_with = "keyframes")]
    pub schedule: Option<ScheduleKind>,
    /// Fraction of the frames not bypassed in silence that the UNet evaluates, in (0, 1]:
    /// exactly round(b x those frames) evaluations (0.33 is about the fixed stride 3).
    #[arg(long, requires = "schedule", conflicts_with_all = ["stride", "max_error"])]
    pub budget: Option<f64>,
    /// Phoneme alignment for --schedule phonemes: a Praat TextGrid (long or short text format,
    /// the tier named "phones" or the only interval tier) or JSON [{"start","end","phoneme"}].
    #[arg(long, value_name = "FILE", conflicts_with_all = ["text", "text_file"])]
    pub phonemes: Option<PathBuf>,
    /// Per-class strides of --schedule phonemes, e.g. closure=1,open-vowel=2,sustained-vowel=4
    /// (classes: closure, release, open-vowel, other-consonant, sustained-vowel, silence).
    #[arg(long, value_name = "LIST")]
    pub class_strides: Option<String>,
    /// --schedule error-bounded: keyframes until every frame's predicted relative latent error
    /// is at most this (needs --calibration).
    #[arg(long, value_name = "E", conflicts_with = "stride")]
    pub max_error: Option<f64>,
    /// Calibration of the error predictor for --max-error (JSON written by the adaptive_strides
    /// experiment for these engines and weights).
    #[arg(long, value_name = "FILE", requires = "max_error")]
    pub calibration: Option<PathBuf>,
    /// Speak this text with libespeak-ng (Debian package libespeak-ng1) and render that speech
    /// instead of --audio; its phoneme events feed --schedule phonemes. Text starting with
    /// <speak is SSML.
    #[arg(long, conflicts_with_all = ["audio", "text_file"])]
    pub text: Option<String>,
    /// Like --text, with the text read from a UTF-8 file.
    #[arg(long, value_name = "FILE", conflicts_with = "audio")]
    pub text_file: Option<PathBuf>,
    /// espeak-ng voice for --text.
    #[arg(long, default_value = espeak::DEFAULT_VOICE)]
    pub voice: String,
    /// Speaking rate for --text (words per minute, 80..450).
    #[arg(long, default_value_t = espeak::DEFAULT_RATE_WPM)]
    pub words_per_minute: u32,
}

/// The render's audio and, where there is one, its phoneme alignment.
pub struct RenderInput {
    pub audio: Audio,
    pub alignment: Option<Alignment>,
    /// What the audio is: the WAV's path, or `"espeak-ng <version> (<voice>, <rate> words/min)"`.
    pub source: String,
}

impl ScheduleArgs {
    fn speaks(&self) -> bool {
        self.text.is_some() || self.text_file.is_some()
    }

    /// Checks the option combinations clap cannot express, before anything is loaded.
    pub fn validate(&self, stride: Option<usize>, keyframes: bool) -> Result<()> {
        if let Some(b) = self.budget {
            crate::schedules::budget_evaluations(b, 0).context("--budget")?;
        }
        if let Some(k) = stride {
            ensure!(k > 0, "--stride must be at least 1 (got 0)");
        }
        let kind = self.schedule;
        if self.phonemes.is_some() && kind != Some(ScheduleKind::Phonemes) {
            bail!("--phonemes is read by --schedule phonemes only");
        }
        if self.class_strides.is_some() && kind != Some(ScheduleKind::Phonemes) {
            bail!("--class-strides belongs to --schedule phonemes");
        }
        if let Some(s) = &self.class_strides {
            ClassStrides::parse(s)?;
        }
        if self.max_error.is_some() && kind != Some(ScheduleKind::ErrorBounded) {
            bail!("--max-error belongs to --schedule error-bounded");
        }
        if let Some(e) = self.max_error {
            ensure!(e.is_finite() && e > 0.0, "--max-error must be positive (got {e})");
            ensure!(self.calibration.is_some(), "--max-error needs --calibration FILE (written by adaptive_strides)");
        }
        match kind {
            Some(ScheduleKind::Phonemes) => {
                ensure!(
                    self.phonemes.is_some() || self.speaks(),
                    "--schedule phonemes needs a phoneme alignment: --phonemes FILE, or --text"
                );
                ensure!(
                    stride.is_none(),
                    "--schedule phonemes takes --budget, or its class strides (--class-strides) without it; not --stride"
                );
            }
            Some(_) => {}
            None => ensure!(!keyframes || stride.is_none(), "--stride and --keyframes exclude each other"),
        }
        Ok(())
    }

    /// The --audio WAV or the --text speech, and the alignment (--phonemes, or the speech's),
    /// checked against the audio's duration. Speaking happens here, so a missing libespeak-ng
    /// stops the render before any engine is loaded.
    pub fn input(&self, audio: Option<&Path>, max_seconds: f64) -> Result<RenderInput> {
        if self.speaks() {
            let text = match (&self.text, &self.text_file) {
                (Some(t), _) => t.clone(),
                (None, Some(p)) => std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
                (None, None) => unreachable!("speaks() checked"),
            };
            let speech = espeak::speak(&text, &self.voice, self.words_per_minute)?;
            // Through a WAV, so the speech is read, resampled and muxed exactly like --audio.
            let tmp = std::env::temp_dir().join(format!("cadence-speech-{}.wav", std::process::id()));
            let loaded = speech.write_wav(&tmp).and_then(|_| crate::frame_loop::audio::load_audio(&tmp, max_seconds));
            let _ = std::fs::remove_file(&tmp);
            let audio = loaded?;
            speech.alignment.check_duration(audio.duration_s)?;
            let source = format!("espeak-ng {} ({}, {} words/min)", speech.version, self.voice, self.words_per_minute);
            return Ok(RenderInput { audio, alignment: Some(speech.alignment), source });
        }
        let path = audio.context("give --audio WAV, or --text")?;
        let audio = crate::frame_loop::audio::load_audio(path, max_seconds)?;
        let alignment = match &self.phonemes {
            Some(p) => {
                let a = Alignment::read(p)?;
                a.check_duration(audio.duration_s).with_context(|| format!("{}", p.display()))?;
                Some(a)
            }
            None => None,
        };
        Ok(RenderInput { audio, alignment, source: path.display().to_string() })
    }

    /// Whether these options read the whole clip's audio before the render: an adaptive
    /// schedule analyses it, speech is made whole, and an alignment is checked against its length.
    pub fn needs_whole_audio(&self) -> bool {
        self.schedule.is_some() || self.speaks() || self.phonemes.is_some()
    }

    /// The --calibration file (read before the engines load; checked against them in
    /// [`ScheduleArgs::plan`]).
    pub fn calibration(&self) -> Result<Option<Calibration>> {
        self.calibration.as_deref().map(Calibration::read).transpose()
    }

    /// The adaptive schedule of a prepared render, or None without --schedule.
    pub fn plan(
        &self,
        stride: Option<usize>,
        prepared: &Prepared,
        alignment: Option<&Alignment>,
        calibration: Option<&Calibration>,
        engines: &Engines,
        opts: &RenderOptions,
    ) -> Result<Option<Planned>> {
        let Some(kind) = self.schedule else { return Ok(None) };
        let target = match (self.budget, self.max_error, stride) {
            (Some(b), _, _) => Target::Budget(b),
            (None, Some(e), _) => Target::MaxError(e),
            (None, None, Some(k)) => Target::Stride(k),
            (None, None, None) if kind == ScheduleKind::Phonemes => Target::ClassStrides,
            (None, None, None) => Target::Stride(DEFAULT_STRIDE),
        };
        if let Some(c) = calibration {
            c.check_engines(&engines.weights_summary(), &engines.profile.to_string())?;
        }
        let t = std::time::Instant::now();
        let distance = crate::schedules::keyframes::speech_distance(&prepared.speech);
        let bypassed = crate::schedules::keyframes::bypassed_frames(&distance, opts.ramp);
        let mut inputs = Inputs::new(opts.fps.hz(), &bypassed);
        inputs.alignment = alignment;
        if let Some(s) = &self.class_strides {
            inputs.class_strides = ClassStrides::parse(s)?;
        }
        let audio = prepared.audio.whole().context("--schedule needs the audio decoded whole, not read as a stream")?;
        inputs.samples_16k = Some(&audio.samples_16k);
        let f = prepared.whole_features(engines, opts)?;
        inputs.features = Some((&f.data, f.shape[1..].iter().product()));
        inputs.error_scale = calibration.map(|c| c.scale);
        let mut planned = crate::schedules::plan(kind, target, &inputs)?;
        // The bypass decision belongs to making the schedule too.
        planned.scheduling_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(Some(planned))
    }
}

/// The schedule part of a render summary: source, keyframe list and count (and, for an adaptive
/// schedule, its target, evaluations and time).
pub fn summary(planned: Option<&Planned>, schedule: &crate::KeyframeSchedule, legacy: &str) -> serde_json::Value {
    let keys = schedule.keyframes();
    match planned {
        Some(p) => serde_json::json!({
            "source": p.kind.name(),
            "target": p.target,
            "keyframes": keys,
            "count": keys.len(),
            "unet_evaluations": p.evaluations,
            "active_frames": p.active_frames,
            "scheduling_ms": p.scheduling_ms,
            "warnings": p.warnings,
        }),
        None => serde_json::json!({ "source": legacy, "keyframes": keys, "count": keys.len() }),
    }
}

/// The schedule line of the text summary: source, count, evaluations and the keyframe list.
pub fn summary_line(planned: Option<&Planned>, schedule: &crate::KeyframeSchedule, legacy: &str) -> String {
    let keys: Vec<String> = schedule.keyframes().iter().map(|k| k.to_string()).collect();
    format!(
        "  schedule {}: {} keyframes{}: {}",
        planned.map_or(legacy, |p| p.kind.name()),
        schedule.count(),
        planned
            .map(|p| format!(" ({} UNet evaluations, made in {:.1} ms)", p.evaluations, p.scheduling_ms))
            .unwrap_or_default(),
        keys.join(",")
    )
}
