//! Silero VAD against the energy VAD (issue 36): speed, and what each would make the render do.
//!
//! Silero runs two ways: `silero + denoise`, cadence's default (the front end of
//! `cadence_media::vad::denoise`, Wiener noise suppression and AGC, then the network), and
//! `silero, raw` (the network on the samples as they are, as the Silero wheel runs it).
//!
//! Speed, one thread, median of `--runs` runs, as x real time (audio seconds per wall second) and
//! milliseconds per 512-sample chunk, on one mix: both Silero paths on the whole clip
//! ([`silero::speech_probabilities`]: the network's STFT and convolutions batched over blocks of
//! chunks) and chunk by chunk (as a live stream runs them: [`silero::ChunkProbabilities`] fed
//! one chunk at a time with the front end, [`silero::SileroVad::process_chunk`] without), at
//! every instruction-set level this machine runs; the front end alone
//! ([`cadence_media::vad::denoise::denoise`]; its FFTs pick their own SIMD); tract running the
//! published graph chunk by chunk (the peer, [`silero::TractSileroVad`]); the energy VAD for
//! scale.
//!
//! Accuracy: test mixes at 16 kHz with speech of known boundaries, made from the committed
//! espeak-ng sentences (fixtures/speech/*.wav; a sentence's speech runs from its first to its last
//! sample above -40 dB of its peak), each at a gain of 0, -3, -6 or -12 dB, separated by pauses
//! of 0.4 to 4 s, some empty, some holding a breath (noise band-passed to about 300-2000 Hz with a
//! sin^2 envelope, 20 dB below the speech), a music-like chord (three notes with five harmonics,
//! attack and decay, 10 dB below the speech) or both. One mix without background noise
//! (`clean`), then the same mix with a pink-ish background noise at 20, 10, 5 and 0 dB SNR
//! (relative to the 0 dB speech level); all of it once per seed of `--seeds` (the seed draws the
//! breaths and the background noise; every row names its seed). At 25 fps, for each detector's
//! per-frame decisions (`cadence_media::voice_activity`,
//! [`silero::try_voice_activity_with`]):
//! - frame accuracy against the truth (a frame is speech when it overlaps a sentence's span);
//! - false bypasses: speech frames (truth) that the render would bypass. The render eases to
//!   rest and skips the networks on silence longer than its easing ramp; computed here as
//!   frames whose distance to the nearest frame the detector calls speech exceeds 4 frames;
//! - missed silences: frames the render would bypass with the true decisions (distance to the
//!   nearest true speech frame above 4) but does not with the detector's.
//!
//! The energy detector is also tuned on each mix with the truth (an oracle, which favours it):
//! `energy, matched` is its relative threshold with the fewest false bypasses among those missing
//! no more silence than `silero + denoise` at its default (and `energy, matched to silero raw`
//! the same against `silero, raw`); `silero + denoise, matched` is Silero's threshold with the
//! fewest false bypasses among those missing no more silence than `energy, matched`. The sweep
//! (`vad_sweep.csv`) runs `silero + denoise` at thresholds 0.1 to 0.9 against the energy
//! detector tuned to miss no more silence at each.
//!
//! Writes `vad.csv` (one row per seed, mix and detector), `vad_sweep.csv`, `vad_speed.csv` and
//! `vad.{png,svg}` (false bypass and missed silence rates), each with provenance (commit, date,
//! hardware, the instruction-set level of cadence's loops, the model file and its sha256).

use anyhow::{ensure, Context, Result};
use cadence_media::vad::denoise;
use cadence_media::vad::silero::{self, SileroConfig, CHUNK_SAMPLES, MODEL_FILE};
use cadence_media::{frame_count, load_wav, VadConfig};
use clap::Parser;
use experiments::plot::{bar_plot, BarChart};
use experiments::{workspace_root, write_csv, OutDir, Provenance};
use sha2::{Digest, Sha256};
use std::time::Instant;

const RATE: f64 = 16_000.0;
/// Frames of silence the render eases over before it bypasses (its easing ramp).
const RAMP_FRAMES: usize = 4;

#[derive(Parser, Debug)]
#[command(
    name = "vad",
    about = "Silero VAD vs the energy VAD: speed on one thread (x real time), and per 25 fps frame the accuracy, false bypasses and missed silences on speech mixed with breaths, music-like tones, long pauses and noise at several SNRs",
    long_about = None
)]
struct Args {
    /// Timed runs (the median is reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Video frame rate of the per-frame decisions.
    #[arg(long, default_value_t = 25.0)]
    fps: f64,
    /// Background noise levels, dB SNR against the speech (comma-separated); a clean mix is
    /// always included.
    #[arg(long, value_delimiter = ',', default_value = "20,10,5,0")]
    snr_db: Vec<f64>,
    /// How many times the four sentences repeat in a mix.
    #[arg(long, default_value_t = 4)]
    repeats: usize,
    /// Seeds of the breaths and the background noise (comma-separated): every mix is made once
    /// per seed.
    #[arg(long, value_delimiter = ',', default_value = "36,7")]
    seeds: Vec<u64>,
    /// Also write each mix as a 16 kHz 16-bit WAV in `DIR/seed_<seed>/`, with `truth.json` (the
    /// sentences' spans in samples), to listen to or to try other detectors on.
    #[arg(long, value_name = "DIR")]
    write_mixes: Option<std::path::PathBuf>,
    #[command(flatten)]
    out: OutDir,
}

/// One row of `vad.csv`.
#[derive(serde::Serialize, Clone, Debug)]
struct AccuracyRow {
    mix: String,
    /// The seed the mix was made with.
    seed: u64,
    /// Background noise SNR in dB; empty for the clean mix.
    snr_db: Option<f64>,
    detector: String,
    /// The energy detector's threshold relative to the clip's loudness (dB); empty for Silero.
    energy_threshold_db: Option<f64>,
    /// Silero's speech threshold; empty for the energy detector.
    silero_threshold: Option<f64>,
    duration_s: f64,
    frames: usize,
    speech_frames: usize,
    /// Frames the render would bypass with the true decisions.
    bypassable_frames: usize,
    frame_accuracy: f64,
    false_bypass_frames: usize,
    /// Of the speech frames.
    false_bypass_pct: f64,
    missed_silence_frames: usize,
    /// Of the bypassable frames.
    missed_silence_pct: f64,
    /// On the Silero rows at their default: the false bypasses of the energy detector tuned to
    /// miss no more silence (`energy, matched`, or `energy, matched to silero raw`) over
    /// Silero's (Silero's 0 counted as 1). The target is at least 5.
    fewer_false_bypasses_than_matched_energy_x: Option<f64>,
}

/// One row of `vad_sweep.csv`: Silero (with its front end, the default) at one threshold on one
/// mix, and the energy detector at its best threshold (fewest false bypasses) missing no more
/// silence.
#[derive(serde::Serialize, Clone, Debug)]
struct SweepRow {
    mix: String,
    seed: u64,
    silero_threshold: f64,
    silero_false_bypass_frames: usize,
    silero_missed_silence_frames: usize,
    /// Empty where no energy threshold misses as little silence.
    energy_threshold_db: Option<f64>,
    energy_false_bypass_frames: Option<usize>,
    energy_missed_silence_frames: Option<usize>,
    /// Energy's false bypasses over Silero's (Silero's 0 counted as 1).
    fewer_false_bypasses_x: Option<f64>,
}

/// One row of `vad_speed.csv`.
#[derive(serde::Serialize, Clone, Debug)]
struct SpeedRow {
    detector: String,
    /// The instruction-set level cadence's loops ran at (`cadence_cpu` levels); for tract, the
    /// level tract-linalg picks on its own.
    isa: String,
    threads: usize,
    audio_s: f64,
    runs: usize,
    median_s: f64,
    min_s: f64,
    x_realtime: f64,
    ms_per_chunk: f64,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("vad: error: {e:#}");
        std::process::exit(1);
    }
}

/// xorshift64* with a normal deviate from the sum of 4 uniforms (variance scaled to 1).
struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        // Sum of 4 U(0,1) has variance 4/12; centred and scaled to unit variance.
        ((0..4).map(|_| self.uniform()).sum::<f64>() - 2.0) * (3.0f64).sqrt()
    }
}

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

/// A sentence: its samples and the span of its speech (first to last sample above -40 dB of
/// its peak).
struct Sentence {
    samples: Vec<f64>,
    span: (usize, usize),
}

fn sentences() -> Result<Vec<Sentence>> {
    let mut out = Vec::new();
    for name in ["fox", "goodnight", "news", "sleep"] {
        let path = workspace_root().join("fixtures/speech").join(format!("{name}.wav"));
        let a = load_wav(&path).with_context(|| format!("reading {}", path.display()))?;
        let x: Vec<f64> = a.samples_16k.iter().map(|&v| v as f64).collect();
        let peak = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let floor = peak * 10f64.powf(-40.0 / 20.0);
        let first = x.iter().position(|v| v.abs() > floor).context("silent sentence")?;
        let last = x.iter().rposition(|v| v.abs() > floor).unwrap() + 1;
        // Normalise the speech span to -20 dBFS RMS.
        let g = 0.1 / rms(&x[first..last]);
        out.push(Sentence { samples: x.iter().map(|v| v * g).collect(), span: (first, last) });
    }
    Ok(out)
}

/// A breath: noise band-passed by two one-pole filters (high-pass ~300 Hz, low-pass ~2 kHz),
/// sin^2 envelope, scaled to `level` RMS.
fn breath(len: usize, level: f64, rng: &mut Rng) -> Vec<f64> {
    let a_lo = (-2.0 * std::f64::consts::PI * 2000.0 / RATE).exp();
    let a_hi = (-2.0 * std::f64::consts::PI * 300.0 / RATE).exp();
    let (mut lp, mut lp2) = (0.0, 0.0);
    let mut x: Vec<f64> = (0..len)
        .map(|i| {
            let w = rng.normal();
            lp = a_lo * lp + (1.0 - a_lo) * w;
            lp2 = a_hi * lp2 + (1.0 - a_hi) * lp;
            let env = (std::f64::consts::PI * i as f64 / len as f64).sin().powi(2);
            (lp - lp2) * env
        })
        .collect();
    let g = level / rms(&x);
    x.iter_mut().for_each(|v| *v *= g);
    x
}

/// A music-like chord: A3, C#4, E4 with harmonics 1..5 at 1/k, 50 ms attack, exponential decay.
fn chord(len: usize, level: f64) -> Vec<f64> {
    let mut x: Vec<f64> = (0..len)
        .map(|i| {
            let t = i as f64 / RATE;
            let env = (t / 0.05).min(1.0) * (-t / 0.8).exp();
            let s: f64 = [220.0, 277.18, 329.63]
                .iter()
                .flat_map(|f| (1..=5).map(move |k| (2.0 * std::f64::consts::PI * f * k as f64 * t).sin() / k as f64))
                .sum();
            s * env
        })
        .collect();
    let g = level / rms(&x);
    x.iter_mut().for_each(|v| *v *= g);
    x
}

/// The mix without background noise and its true speech spans (samples).
fn clean_mix(sents: &[Sentence], repeats: usize, rng: &mut Rng) -> (Vec<f64>, Vec<(usize, usize)>) {
    let speech = 0.1; // the 0 dB speech RMS
    let gains_db = [0.0, -3.0, -6.0, -12.0, -3.0];
    // (pause seconds, breath, chord)
    let pauses = [(0.4, false, false), (3.0, false, false), (2.0, true, false), (2.5, false, true), (4.0, true, true)];
    let mut x = vec![0.0; RATE as usize];
    let mut spans = Vec::new();
    let mut k = 0;
    for _ in 0..repeats {
        for s in sents {
            let g = 10f64.powf(gains_db[k % gains_db.len()] / 20.0);
            let at = x.len();
            x.extend(s.samples.iter().map(|v| v * g));
            spans.push((at + s.span.0, at + s.span.1));
            let (secs, b, c) = pauses[k % pauses.len()];
            let n = (secs * RATE) as usize;
            let mut p = vec![0.0; n];
            if b {
                let len = (0.45 * RATE) as usize;
                let start = n / 4;
                for (d, v) in p[start..start + len].iter_mut().zip(breath(len, speech * 10f64.powf(-20.0 / 20.0), rng))
                {
                    *d += v;
                }
            }
            if c {
                let len = (1.5 * RATE) as usize;
                let start = n - len - (0.3 * RATE) as usize;
                for (d, v) in p[start..start + len].iter_mut().zip(chord(len, speech * 10f64.powf(-10.0 / 20.0))) {
                    *d += v;
                }
            }
            x.extend(p);
            k += 1;
        }
    }
    (x, spans)
}

/// Pink-ish noise (white through a one-pole low-pass at 1 kHz, plus a fifth of white), at `level`.
fn background(len: usize, level: f64, rng: &mut Rng) -> Vec<f64> {
    let a = (-2.0 * std::f64::consts::PI * 1000.0 / RATE).exp();
    let mut lp = 0.0;
    let mut x: Vec<f64> = (0..len)
        .map(|_| {
            let w = rng.normal();
            lp = a * lp + (1.0 - a) * w;
            lp + 0.2 * w
        })
        .collect();
    let g = level / rms(&x);
    x.iter_mut().for_each(|v| *v *= g);
    x
}

/// Frames the render would bypass: distance to the nearest speech frame above the ramp.
fn bypassed(speech: &[bool]) -> Vec<bool> {
    let n = speech.len();
    let mut dist = vec![usize::MAX; n];
    let mut last = None;
    for i in 0..n {
        if speech[i] {
            last = Some(i);
        }
        if let Some(l) = last {
            dist[i] = i - l;
        }
    }
    last = None;
    for i in (0..n).rev() {
        if speech[i] {
            last = Some(i);
        }
        if let Some(l) = last {
            dist[i] = dist[i].min(l - i);
        }
    }
    dist.iter().map(|&d| d > RAMP_FRAMES).collect()
}

/// Frames right, speech frames bypassed, bypassable frames not bypassed.
#[derive(Clone, Copy, Debug)]
struct Score {
    correct: usize,
    false_bypass: usize,
    missed: usize,
}

/// The energy detector's relative threshold (dB, -35..=-1) with the fewest false bypasses among
/// those missing at most `max_missed` silent frames (ties: fewer missed), or, where none does,
/// the one missing the fewest; with its score.
fn energy_candidates(x: &[f32], fps: f64, n_frames: usize, score: &dyn Fn(&[bool]) -> Score) -> Vec<(f64, Score)> {
    (1..=35)
        .map(|t| {
            let cfg = VadConfig { relative_threshold_db: -(t as f64), ..VadConfig::default() };
            (-(t as f64), score(&cadence_media::voice_activity_with(x, fps, n_frames, &cfg)))
        })
        .collect()
}

/// Of `(setting, score)` candidates, the one with the fewest false bypasses among those missing
/// at most `max_missed` frames (ties: fewer missed); where none does, the one missing the fewest.
fn best_within(candidates: &[(f64, Score)], max_missed: usize) -> (f64, Score) {
    let within = candidates.iter().filter(|(_, s)| s.missed <= max_missed);
    let best = within.min_by_key(|(_, s)| (s.false_bypass, s.missed));
    *best.unwrap_or_else(|| candidates.iter().min_by_key(|(_, s)| (s.missed, s.false_bypass)).unwrap())
}

/// `--write-mixes`: each mix of one seed as `<name>.wav` (spaces as `_`), and `truth.json`.
fn write_mixes(
    dir: &std::path::Path,
    mixes: &[(String, Option<f64>, Vec<f32>)],
    spans: &[(usize, usize)],
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, _, x) in mixes {
        let path = dir.join(format!("{}.wav", name.replace(' ', "_")));
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: RATE as u32,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&path, spec).with_context(|| format!("writing {}", path.display()))?;
        for &v in x {
            w.write_sample((v.clamp(-1.0, 1.0) * 32767.0).round() as i16)?;
        }
        w.finalize()?;
    }
    let truth = serde_json::json!({ "sample_rate": RATE, "speech_spans": spans });
    std::fs::write(dir.join("truth.json"), serde_json::to_string_pretty(&truth)?)?;
    println!("vad: wrote the mixes to {}", dir.display());
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn run(a: Args) -> Result<()> {
    ensure!(a.runs >= 1 && a.repeats >= 1 && a.fps > 0.0, "--runs, --repeats and --fps must be positive");
    let out_dir = a.out.dir()?;
    let sha = format!("{:x}", Sha256::digest(silero::model_bytes()));
    ensure!(sha == silero::MODEL_SHA256, "embedded model sha256 {sha} is not the committed file's");
    let mut prov = Provenance::gather(
        "cpu, 1 thread (cadence's Silero network; tract-onnx as the peer)",
        "n/a",
        format!("Silero VAD v5: {MODEL_FILE} (sha256 {sha}; {})", silero::MODEL_SOURCE),
    );
    prov.note("cpu_loops", cadence_engines::isa::describe());
    prov.note("model_file", MODEL_FILE);
    prov.note("model_sha256", &sha);
    prov.note("fps", a.fps.to_string());
    prov.note("bypass_rule", format!("frames more than {RAMP_FRAMES} frames from the nearest speech frame"));

    ensure!(!a.seeds.is_empty(), "--seeds needs at least one seed");
    prov.note("seeds", a.seeds.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(","));
    prov.note(
        "silero_front_end",
        format!(
            "silero + denoise: Wiener noise suppression (STFT {} / hop {}, minimum statistics over {} frames) and AGC, then the network (the default); silero, raw: the network alone",
            denoise::FRAME,
            denoise::HOP,
            denoise::NOISE_WINDOW_FRAMES
        ),
    );
    let front = SileroConfig::default();
    ensure!(front.denoise, "the default Silero config runs the front end");
    let raw = SileroConfig { denoise: false, ..front };

    let sents = sentences()?;
    let mut rows = Vec::new();
    let mut sweep = Vec::new();
    let mut noisiest = Vec::new();
    for &seed in &a.seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (clean, spans) = clean_mix(&sents, a.repeats, &mut rng);
        let duration_s = clean.len() as f64 / RATE;
        let n_frames = frame_count(duration_s, a.fps);
        let truth = silero::frames_from_segments(
            &spans.iter().map(|&(s, e)| silero::SpeechSegment { start: s, end: e }).collect::<Vec<_>>(),
            a.fps,
            n_frames,
        );
        let truth_bypass = bypassed(&truth);
        println!(
            "vad: seed {seed}: mix of {duration_s:.1} s, {} sentences, {} of {n_frames} frames speech",
            spans.len(),
            truth.iter().filter(|&&v| v).count()
        );

        let mut mixes: Vec<(String, Option<f64>, Vec<f32>)> =
            vec![("clean".into(), None, clean.iter().map(|&v| v as f32).collect())];
        for &snr in &a.snr_db {
            let noise = background(clean.len(), 0.1 / 10f64.powf(snr / 20.0), &mut rng);
            let x: Vec<f32> = clean.iter().zip(&noise).map(|(s, n)| (s + n).clamp(-1.0, 1.0) as f32).collect();
            mixes.push((format!("noise {snr} dB SNR"), Some(snr), x));
        }

        if let Some(dir) = &a.write_mixes {
            write_mixes(&dir.join(format!("seed_{seed}")), &mixes, &spans)?;
        }
        let speech_frames = truth.iter().filter(|&&v| v).count();
        let bypassable = truth_bypass.iter().filter(|&&v| v).count();
        let score = |d: &[bool]| -> Score {
            let by = bypassed(d);
            Score {
                correct: d.iter().zip(&truth).filter(|(a, b)| a == b).count(),
                false_bypass: truth.iter().zip(&by).filter(|(t, b)| **t && **b).count(),
                missed: truth_bypass.iter().zip(&by).filter(|(t, b)| **t && !**b).count(),
            }
        };
        // Energy's false bypasses over Silero's (Silero's 0 counted as 1).
        let fewer_x = |energy: &Score, silero: &Score| energy.false_bypass as f64 / silero.false_bypass.max(1) as f64;
        for (name, snr, x) in &mixes {
            let energy = cadence_media::voice_activity(x, a.fps, n_frames);
            // Both Silero paths at their defaults, as the render decides.
            let front_score = score(&silero::try_voice_activity_with(x, a.fps, n_frames, &front)?);
            let raw_score = score(&silero::try_voice_activity_with(x, a.fps, n_frames, &raw)?);
            // The energy detector at its best operating point on this mix, chosen with the truth
            // (an oracle tuning, which favours it): of the relative thresholds -35..=-1 dB, the
            // one with the fewest false bypasses among those missing no more silence than
            // Silero does; where none does, the one missing the least.
            let energy_all = energy_candidates(x, a.fps, n_frames, &score);
            let (matched_db, matched) = best_within(&energy_all, front_score.missed);
            let (matched_raw_db, matched_raw) = best_within(&energy_all, raw_score.missed);
            // And the other way: Silero's threshold (0.05..=0.95) with the fewest false bypasses
            // among those missing no more silence than that tuned energy detector.
            let probs = silero::speech_probabilities(x, &front)?;
            let silero_at = |t: f64| {
                let cfg = SileroConfig { threshold: t, ..front };
                score(&silero::frames_from_segments(&silero::speech_segments(&probs, x.len(), &cfg), a.fps, n_frames))
            };
            let silero_candidates: Vec<(f64, Score)> =
                (1..=19).map(|i| (i as f64 * 0.05, silero_at(i as f64 * 0.05))).collect();
            let (silero_t, silero_matched) = best_within(&silero_candidates, matched.missed);
            // The trade-off at one Silero threshold for every mix: Silero's false bypasses
            // against the energy detector's fewest at no more missed silence (tuned on each mix).
            for &(t, s) in silero_candidates.iter().filter(|(t, _)| ((t * 20.0).round() as usize).is_multiple_of(2)) {
                let within: Vec<&(f64, Score)> = energy_all.iter().filter(|(_, e)| e.missed <= s.missed).collect();
                let best = within.iter().min_by_key(|(_, e)| (e.false_bypass, e.missed));
                sweep.push(SweepRow {
                    mix: name.clone(),
                    seed,
                    silero_threshold: (t * 100.0).round() / 100.0,
                    silero_false_bypass_frames: s.false_bypass,
                    silero_missed_silence_frames: s.missed,
                    energy_threshold_db: best.map(|b| b.0),
                    energy_false_bypass_frames: best.map(|b| b.1.false_bypass),
                    energy_missed_silence_frames: best.map(|b| b.1.missed),
                    fewer_false_bypasses_x: best.map(|b| fewer_x(&b.1, &s)),
                });
            }
            let default_db = Some(VadConfig::default().relative_threshold_db);
            let decisions = [
                ("energy", score(&energy), default_db, None, None),
                ("silero + denoise", front_score, None, Some(front.threshold), Some(fewer_x(&matched, &front_score))),
                ("silero, raw", raw_score, None, Some(raw.threshold), Some(fewer_x(&matched_raw, &raw_score))),
                ("energy, matched", matched, Some(matched_db), None, None),
                ("energy, matched to silero raw", matched_raw, Some(matched_raw_db), None, None),
                ("silero + denoise, matched", silero_matched, None, Some(silero_t), None),
            ];
            for (det, sc, threshold_db, silero_threshold, fewer) in decisions {
                let pct = |n: usize, of: usize| if of == 0 { 0.0 } else { 100.0 * n as f64 / of as f64 };
                let row = AccuracyRow {
                    mix: name.clone(),
                    seed,
                    snr_db: *snr,
                    detector: det.to_string(),
                    energy_threshold_db: threshold_db,
                    silero_threshold,
                    duration_s,
                    frames: n_frames,
                    speech_frames,
                    bypassable_frames: bypassable,
                    frame_accuracy: sc.correct as f64 / n_frames as f64,
                    false_bypass_frames: sc.false_bypass,
                    false_bypass_pct: pct(sc.false_bypass, speech_frames),
                    missed_silence_frames: sc.missed,
                    missed_silence_pct: pct(sc.missed, bypassable),
                    fewer_false_bypasses_than_matched_energy_x: fewer,
                };
                println!(
                    "{:>5} {:>16} {:>29}: accuracy {:.3}, false bypasses {:4} ({:5.2} %), missed silences {:4} ({:5.2} %){}",
                    row.seed,
                    row.mix,
                    row.detector,
                    row.frame_accuracy,
                    row.false_bypass_frames,
                    row.false_bypass_pct,
                    row.missed_silence_frames,
                    row.missed_silence_pct,
                    fewer.map(|f| format!(", {f:.1}x fewer than energy matched")).unwrap_or_default()
                );
                rows.push(row);
            }
        }
        if noisiest.is_empty() {
            noisiest = mixes.pop().unwrap().2;
        }
    }

    // Speed, on the first seed's noisiest mix (every mix has the same length).
    let x = &noisiest;
    let n_frames = frame_count(x.len() as f64 / RATE, a.fps);
    let audio_s = x.len() as f64 / RATE;
    let chunks = x.len().div_ceil(CHUNK_SAMPLES);
    // Every variant once per round, `--runs` rounds, so that all see the same machine (a shared
    // VM's speed drifts over seconds); the median of each variant's runs is reported.
    type Variant<'a> = (&'static str, String, Option<cadence_engines::isa::Isa>, Box<dyn Fn() -> Result<()> + 'a>);
    let whole = |cfg: SileroConfig| {
        move || -> Result<()> {
            std::hint::black_box(silero::speech_probabilities(x, &cfg)?);
            Ok(())
        }
    };
    // A live stream: one chunk at a time through the front end and the network, then the end.
    let by_chunk_front = || -> Result<()> {
        let mut chunks = silero::ChunkProbabilities::new(&front)?;
        for c in x.chunks(CHUNK_SAMPLES) {
            chunks.push(c)?;
            std::hint::black_box(chunks.take());
        }
        chunks.finish()?;
        std::hint::black_box(chunks.take());
        Ok(())
    };
    let by_chunk_raw = || -> Result<()> {
        let mut vad = silero::SileroVad::new()?;
        for c in x.chunks_exact(CHUNK_SAMPLES) {
            std::hint::black_box(vad.process_chunk(c)?);
        }
        Ok(())
    };
    let mut variants: Vec<Variant> = Vec::new();
    // The machine's own level first (the headline figures), then the lower ones.
    for level in cadence_engines::isa::runnable().into_iter().rev() {
        variants.push(("silero + denoise, whole clip", level.to_string(), Some(level), Box::new(whole(front))));
        variants.push(("silero + denoise, chunk by chunk", level.to_string(), Some(level), Box::new(by_chunk_front)));
        variants.push(("silero, raw, whole clip", level.to_string(), Some(level), Box::new(whole(raw))));
        variants.push(("silero, raw, chunk by chunk", level.to_string(), Some(level), Box::new(by_chunk_raw)));
    }
    variants.push((
        "front end alone (denoise + AGC), whole clip",
        "rustfft's own choice".into(),
        None,
        Box::new(|| {
            std::hint::black_box(denoise::denoise(x)?);
            Ok(())
        }),
    ));
    variants.push((
        "silero by tract, chunk by chunk",
        "tract-linalg's own choice".into(),
        None,
        Box::new(|| {
            let mut vad = silero::TractSileroVad::new()?;
            for c in x.chunks_exact(CHUNK_SAMPLES) {
                std::hint::black_box(vad.process_chunk(c)?);
            }
            Ok(())
        }),
    ));
    variants.push((
        "energy",
        "n/a".into(),
        None,
        Box::new(|| {
            std::hint::black_box(cadence_media::voice_activity(x, a.fps, n_frames));
            Ok(())
        }),
    ));
    let mut times = vec![Vec::with_capacity(a.runs); variants.len()];
    for _ in 0..a.runs {
        for (v, t) in variants.iter().zip(&mut times) {
            cadence_engines::isa::force(v.2).map_err(anyhow::Error::msg)?;
            let start = Instant::now();
            (v.3)()?;
            t.push(start.elapsed().as_secs_f64());
        }
    }
    cadence_engines::isa::force(None).map_err(anyhow::Error::msg)?;
    let mut speed = Vec::new();
    for (v, mut t) in variants.iter().zip(times) {
        let min_s = t.iter().cloned().fold(f64::INFINITY, f64::min);
        let median_s = median(&mut t);
        let row = SpeedRow {
            detector: v.0.into(),
            isa: v.1.clone(),
            threads: 1,
            audio_s,
            runs: a.runs,
            median_s,
            min_s,
            x_realtime: audio_s / median_s,
            ms_per_chunk: 1000.0 * median_s / chunks as f64,
        };
        println!(
            "{} ({}): {audio_s:.1} s of audio in {median_s:.4} s (median of {}): {:.0}x real time, {:.4} ms per 512-sample chunk",
            v.0, row.isa, a.runs, row.x_realtime, row.ms_per_chunk
        );
        speed.push(row);
    }
    let x_rt = |det: &str| speed.iter().find(|r| r.detector == det).map(|r| r.x_realtime).unwrap_or(f64::NAN);
    prov.note("silero_x_realtime", format!("{:.0}", speed[0].x_realtime));
    prov.note("silero_ms_per_chunk", format!("{:.4}", speed[0].ms_per_chunk));
    prov.note("silero_chunk_by_chunk_x_realtime", format!("{:.0}", speed[1].x_realtime));
    prov.note("silero_raw_x_realtime", format!("{:.0}", speed[2].x_realtime));
    prov.note("front_end_x_realtime", format!("{:.0}", x_rt("front end alone (denoise + AGC), whole clip")));

    let csv = out_dir.join("vad.csv");
    write_csv(&csv, &prov, &rows)?;
    let csv_speed = out_dir.join("vad_speed.csv");
    write_csv(&csv_speed, &prov, &speed)?;
    let csv_sweep = out_dir.join("vad_sweep.csv");
    write_csv(&csv_sweep, &prov, &sweep)?;

    let pick = |det: &str, f: fn(&AccuracyRow) -> f64| -> Vec<f64> {
        rows.iter().filter(|r| r.detector == det).map(f).collect()
    };
    let chart = BarChart {
        title: format!(
            "Silero (with and without its front end) vs the energy VAD tuned with the truth, per {} fps frame",
            a.fps
        ),
        x_label: "mix, seed (false bypasses: % of speech frames; missed silences: % of bypassable frames)".into(),
        y_label: "% of frames".into(),
        categories: rows
            .iter()
            .filter(|r| r.detector == "silero + denoise")
            .map(|r| format!("{}, {}", r.mix.replace("noise ", "").replace(" SNR", ""), r.seed))
            .collect(),
        series: vec![
            ("silero + denoise: false bypass".into(), pick("silero + denoise", |r| r.false_bypass_pct)),
            ("silero, raw: false bypass".into(), pick("silero, raw", |r| r.false_bypass_pct)),
            ("energy, matched: false bypass".into(), pick("energy, matched", |r| r.false_bypass_pct)),
            ("silero + denoise: missed silence".into(), pick("silero + denoise", |r| r.missed_silence_pct)),
            ("silero, raw: missed silence".into(), pick("silero, raw", |r| r.missed_silence_pct)),
            ("energy, matched: missed silence".into(), pick("energy, matched", |r| r.missed_silence_pct)),
        ],
        value_labels: false,
    };
    let files = bar_plot(&out_dir.join("vad"), &chart, &prov)?;
    println!(
        "vad: wrote {}, {}, {} and {}",
        csv.display(),
        csv_speed.display(),
        files.png.display(),
        files.svg.display()
    );
    Ok(())
}
