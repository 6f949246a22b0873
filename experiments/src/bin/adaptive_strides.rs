//! Adaptive keyframe schedules against fixed strides at equal UNet evaluations (issue 17).
//!
//! For each clip (the bundled 25.6 s clip; the espeak-ng text clip in `experiments/assets/`, made
//! by `make_text_clip`, with its phoneme alignment) the UNet runs once on every frame that is not
//! bypassed in silence: the dense render. For each budget (default 0.25, 0.33, 0.5) the
//! comparison stride is k = round(1 / budget), and every schedule gets exactly the UNet
//! evaluations of the pipeline's fixed stride k (`KeyframeSchedule::fixed_stride`, whose keyframes
//! in bypassed silence are not evaluated): `stride k` itself, and `fixed` (evenly spread over
//! the speech runs), `phonemes` (clips with an alignment), `audio` and `error-bounded` from
//! `cadence::schedules`. Each schedule's keyframes are taken from the dense latents, expanded and
//! eased by the pipeline's own infill (`resident::expand_eased`), decoded where they differ from
//! the dense render, and compared with it:
//! - latent error: |v - v_dense| / |v_dense| per frame, mean over the frames that are not
//!   bypassed, and per phoneme class (a frame's class is the most demanding phoneme touching it);
//! - PSNR of the clip (from the mean squared error over those frames) and mean SSIM of the
//!   decoded crops against the dense decode;
//! - flicker: mean absolute difference between consecutive frames in the mouth region (8-bit
//!   scale, as VBench's temporal flickering score), against the dense render's own;
//! - time: making the schedule, against a lower bound of the render's time (audio encoder + UNet
//!   x evaluations + decoder x decoded frames, measured here; compositing and encoding left out).
//!
//! The error-bounded predictor is calibrated on the first clip (0.9 quantile of measured over
//! predicted error), written to `adaptive_calibration.json`, and on the other clips a
//! `--max-error` schedule is run with the first clip's mean stride-3 error as the bound.
//!
//! Writes `adaptive_strides.csv`, `adaptive_strides_pareto.{png,svg}` (quality against UNet
//! evaluations, one curve per schedule), `adaptive_strides_timeline.{png,svg}` (phoneme classes,
//! keyframes, per-frame error) and `adaptive_calibration.json`.

use anyhow::{ensure, Context, Result};
use cadence::backend::resident::{expand_eased, Infill};
use cadence::musetalk::FACE_SIDE;
use cadence::musetalk::LATENT_DIM;
use cadence::schedules::keyframes::{bypassed_frames, speech_distance};
use cadence::schedules::{self, Alignment, Calibration, Inputs, PhonemeClass, ScheduleKind, Target};
use cadence::{KeyframeSchedule, Method};
use cadence_engines::{Device, Tensor};
use clap::Parser;
use experiments::frames::{decode_each, frame_of, unet_frames, CROP};
use experiments::metrics::{self, ImageShape, Region};
use experiments::plot::{line_plot_grid, timeline_plot, Legend, LineChart, LineStyle, Series, Timeline};
use experiments::session::{Inputs as SessionInputs, Session, SessionArgs};
use experiments::{progress_bar, write_csv, OutDir, Provenance};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The text clip, its alignment and its source notes (written by `make_text_clip`).
const TEXT_WAV: &str = "experiments/assets/text_clip.wav";
const TEXT_PHONEMES: &str = "experiments/assets/text_clip.phonemes.json";
const TEXT_SOURCE: &str = "experiments/assets/text_clip.source.json";

/// The mouth region of the 256 x 256 face crop for the flicker index: the middle half of the
/// crop's width, rows 144..240 (MuseTalk inpaints the lower half, rows 128..256; the lips sit in
/// its upper part).
const MOUTH: Region = Region { x: 64, y: 144, width: 128, height: 96 };

/// Quantile of measured / predicted error the calibration's scale is fitted to: with it, about
/// 90% of frames are expected to stay under a `--max-error` bound.
const CALIBRATION_QUANTILE: f64 = 0.9;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ClipName {
    /// The bundled clip (or --audio); no phoneme alignment.
    Bundled,
    /// The espeak-ng text clip with its phoneme alignment.
    Text,
}

#[derive(Parser, Debug)]
#[command(
    name = "adaptive_strides",
    about = "Adaptive keyframe schedules (phonemes, audio, error-bounded) against fixed strides at equal UNet evaluations: latent error, PSNR/SSIM vs the dense render, error per phoneme class, mouth flicker, scheduling time",
    long_about = None
)]
struct Args {
    /// Clips, in order; the first calibrates the error-bounded predictor.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "bundled,text")]
    clips: Vec<ClipName>,
    /// Budgets: fraction of the frames that are not bypassed that the UNet evaluates; each is
    /// matched exactly to the evaluations of the fixed stride round(1 / budget).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.33,0.5")]
    budgets: Vec<f64>,
    /// The text clip's WAV and alignment (TextGrid or JSON) [default: experiments/assets/text_clip.*]
    #[arg(long)]
    text_audio: Option<PathBuf>,
    #[arg(long)]
    text_phonemes: Option<PathBuf>,
    /// Engines and the avatar (`--audio` replaces the bundled clip; `--frames` keeps the first
    /// frames of every clip; `--encoder` is not used).
    #[command(flatten)]
    session: SessionArgs,
    #[command(flatten)]
    out: OutDir,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("adaptive_strides: error: {e:#}");
        std::process::exit(1);
    }
}

/// One schedule on one clip.
#[derive(serde::Serialize, Clone, Debug)]
struct Row {
    clip: String,
    schedule: String,
    /// Nominal budget, and the comparison stride whose evaluations every schedule matches.
    budget: f64,
    stride_equivalent: usize,
    unet_evaluations: usize,
    keyframes: usize,
    frames: usize,
    active_frames: usize,
    /// Runs of frames that are not bypassed; the adaptive schedules spend an evaluation on each
    /// end of each (fixed stride k anchors them on bypassed keyframes, which cost nothing).
    speech_runs: usize,
    /// unet_evaluations / active_frames.
    evaluated_fraction: f64,
    latent_err_mean: f64,
    latent_err_p90: f64,
    latent_err_max: f64,
    /// Mean latent error over the frames of each class (empty without an alignment).
    err_closure: Option<f64>,
    err_release: Option<f64>,
    err_open_vowel: Option<f64>,
    err_other_consonant: Option<f64>,
    err_sustained_vowel: Option<f64>,
    err_silence: Option<f64>,
    closure_frames: Option<usize>,
    psnr_db: f64,
    psnr_closure_db: Option<f64>,
    ssim_mean: f64,
    ssim_min: f64,
    flicker_mouth_8bit: f64,
    dense_flicker_mouth_8bit: f64,
    scheduling_ms: f64,
    /// Audio encoder + UNet x evaluations + decoder x decoded frames (a lower bound of a render).
    render_neural_ms: f64,
    scheduling_share_pct: f64,
    /// error-bounded with --max-error: the bound and the share of frames whose measured error
    /// exceeds it.
    max_error_bound: Option<f64>,
    frames_over_bound_pct: Option<f64>,
    weights_kind: String,
    engine_profile: String,
}

/// Per-frame results of one schedule (for the timeline and the calibration).
struct Outcome {
    row: Row,
    keys: Vec<usize>,
    err: Vec<f64>,
}

/// A prepared clip with its dense render.
struct Dense {
    name: String,
    n: usize,
    bypassed: Vec<bool>,
    distance: Vec<u32>,
    active: Vec<usize>,
    /// Raw UNet latents of every frame (the rest latent on bypassed frames).
    raw: Vec<f32>,
    /// Eased dense latents (what a stride-1 render decodes).
    eased: Vec<f32>,
    /// Decoded dense crops of the active frames, indexed by position in `active`.
    rgb: Vec<f32>,
    /// Mouth crops of every frame of the dense render (bypassed: the rest frame).
    mouth: Vec<f32>,
    rest_mouth: Vec<f32>,
    features: Vec<f32>,
    window: usize,
    samples: Vec<f32>,
    alignment: Option<Alignment>,
    classes: Option<Vec<PhonemeClass>>,
    audio_encoder_ms: f64,
    unet_ms_per_eval: f64,
    decoder_ms_per_frame: f64,
    rest: Vec<f32>,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s: Vec<f64> = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() - 1) as f64 * q).round() as usize]
}

fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let (mx, my) = (mean(x), mean(y));
    let cov: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
    cov / (vx * vy).sqrt()
}

fn run(args: Args) -> Result<()> {
    let t_run = Instant::now();
    let load_before = experiments::provenance::load_average();
    ensure!(!args.clips.is_empty(), "--clips is empty");
    ensure!(!args.budgets.is_empty(), "--budgets is empty");
    for &b in &args.budgets {
        ensure!(b > 0.0 && b <= 1.0, "budget {b} is outside (0, 1]");
    }
    let out_dir = args.out.dir()?;
    let root = experiments::workspace_root();
    eprintln!("adaptive_strides: loading engines and inputs ...");
    let session = Session::open(&args.session)?;
    let mut prov = session.provenance();
    let weights = session.engines.weights_summary();
    let kind = experiments::session::weights_kind(&weights);
    let profile = session.engines.profile.to_string();

    let mut rows: Vec<Row> = Vec::new();
    let mut timeline: Option<(Dense, Vec<Outcome>, f64)> = None;
    let mut calibration: Option<(Calibration, f64)> = None;
    let mut notes: Vec<(String, String)> = Vec::new();
    for (ci, &clip) in args.clips.iter().enumerate() {
        let (name, audio, alignment) = match clip {
            ClipName::Bundled => ("bundled".to_string(), session.audio.clone(), None),
            ClipName::Text => {
                let wav = args.text_audio.clone().unwrap_or_else(|| root.join(TEXT_WAV));
                let ph = args.text_phonemes.clone().unwrap_or_else(|| root.join(TEXT_PHONEMES));
                let mut audio = cadence::frame_loop::audio::load_audio(&wav, 3600.0)?;
                let alignment = Alignment::read(&ph)?;
                alignment.check_duration(audio.duration_s).with_context(|| format!("{}", ph.display()))?;
                if let Some(n) = args.session.frames {
                    let keep = (n as f64 / 25.0 * cadence_media::TARGET_RATE as f64).round() as usize;
                    ensure!(n > 0 && keep <= audio.samples_16k.len(), "--frames {n} is longer than the text clip");
                    audio.samples_16k.truncate(keep);
                }
                let source = std::fs::read_to_string(root.join(TEXT_SOURCE)).ok();
                let espeak = source
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
                    .and_then(|v| v["espeak_ng"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "unknown".into());
                notes.push((
                    "text_clip".into(),
                    format!("{} + {} (espeak-ng {espeak}; make_text_clip)", wav.display(), ph.display()),
                ));
                ("text".to_string(), audio, Some(alignment))
            }
        };
        let dense = dense_render(&session, &name, audio, alignment)?;
        let budgets: Vec<(f64, usize)> =
            args.budgets.iter().map(|&b| (b, (1.0 / b).round().max(1.0) as usize)).collect();
        let mut outcomes = Vec::new();
        for &(b, k) in &budgets {
            let legacy = KeyframeSchedule::fixed_stride(dense.n, k)?;
            let t = Instant::now();
            let _ = KeyframeSchedule::fixed_stride(dense.n, k)?;
            let legacy_ms = t.elapsed().as_secs_f64() * 1e3;
            let keys: Vec<usize> = legacy.keyframes().iter().map(|&f| f as usize).collect();
            let e = keys.iter().filter(|&&f| !dense.bypassed[f]).count();
            outcomes.push(evaluate(&session, &dense, &format!("stride {k}"), b, k, keys, legacy_ms, None)?);
            let mut kinds = vec![ScheduleKind::Fixed, ScheduleKind::Audio, ScheduleKind::ErrorBounded];
            if dense.alignment.is_some() {
                kinds.insert(1, ScheduleKind::Phonemes);
            }
            for sk in kinds {
                let p = plan(&dense, sk, Target::Evaluations(e), None)?;
                for w in &p.warnings {
                    eprintln!("adaptive_strides: {}: {w}", dense.name);
                }
                ensure!(p.evaluations == e, "{} gave {} evaluations, not {e}", sk.name(), p.evaluations);
                let keys = p.schedule.keyframes().iter().map(|&f| f as usize).collect();
                outcomes.push(evaluate(&session, &dense, sk.name(), b, k, keys, p.scheduling_ms, None)?);
            }
        }
        // The error predictor against the measured error, for the fixed schedules.
        let predictor = schedules::FeaturePredictor::new(&dense.features, dense.window)?;
        let mut ratios = Vec::new();
        let mut corr = Vec::new();
        for o in outcomes.iter().filter(|o| o.row.schedule == "fixed") {
            let pred = predictor.errors(&o.keys, &dense.bypassed);
            let (mut p, mut m) = (Vec::new(), Vec::new());
            for &f in &dense.active {
                if pred[f] > 0.0 && !o.keys.contains(&f) {
                    p.push(pred[f]);
                    m.push(o.err[f]);
                    ratios.push(o.err[f] / pred[f]);
                }
            }
            corr.push(format!("budget {}: r = {:.3} over {} frames", o.row.budget, pearson(&p, &m), p.len()));
        }
        notes.push((
            format!("predictor_{}", dense.name),
            format!(
                "Pearson correlation of predicted and measured per-frame latent error (fixed schedule): {}",
                corr.join("; ")
            ),
        ));
        if ci == 0 {
            let scale = quantile(&ratios, CALIBRATION_QUANTILE);
            ensure!(scale.is_finite() && scale > 0.0, "the calibration found no frame to fit (scale {scale})");
            let (commit, _) = experiments::provenance::git_state(&root);
            let c = Calibration {
                scale,
                fit: format!(
                    "{CALIBRATION_QUANTILE} quantile of measured / predicted latent error over the in-between frames of the fixed schedules at budgets {:?} ({} frames)",
                    args.budgets,
                    ratios.len()
                ),
                weights: weights.clone(),
                profile: profile.clone(),
                clip: dense.name.clone(),
                commit,
            };
            // The bound of the --max-error rows: this clip's mean error at the stride nearest 3.
            let ref_k = budgets.iter().map(|b| b.1).min_by_key(|k| k.abs_diff(3)).unwrap_or(3);
            let bound = outcomes
                .iter()
                .find(|o| o.row.schedule == format!("stride {ref_k}"))
                .map(|o| o.row.latent_err_mean)
                .context("no stride row")?;
            calibration = Some((c, bound));
        }
        if let Some((c, bound)) = &calibration {
            if ci > 0 || args.clips.len() == 1 {
                let p = plan(&dense, ScheduleKind::ErrorBounded, Target::MaxError(*bound), Some(c.scale))?;
                let keys: Vec<usize> = p.schedule.keyframes().iter().map(|&f| f as usize).collect();
                let frac = p.evaluations as f64 / dense.active.len() as f64;
                let k = (1.0 / frac).round().max(1.0) as usize;
                let mut o = evaluate(
                    &session,
                    &dense,
                    "error-bounded max-error",
                    frac,
                    k,
                    keys,
                    p.scheduling_ms,
                    Some(*bound),
                )?;
                o.row.max_error_bound = Some(*bound);
                outcomes.push(o);
            }
        }
        rows.extend(outcomes.iter().map(|o| o.row.clone()));
        let mid = args
            .budgets
            .iter()
            .copied()
            .min_by(|a, b| (a - 1.0 / 3.0).abs().total_cmp(&(b - 1.0 / 3.0).abs()))
            .unwrap();
        if timeline.is_none() || dense.alignment.is_some() && timeline.as_ref().is_some_and(|t| t.0.alignment.is_none())
        {
            timeline = Some((dense, outcomes, mid));
        }
    }

    // Calibration file.
    if let Some((c, _)) = &calibration {
        let path = out_dir.join("adaptive_calibration.json");
        cadence::io::output::write_atomically(&path, |w| Ok(serde_json::to_writer_pretty(&mut *w, c)?))?;
        println!("wrote {}", path.display());
    }

    // Provenance and caveats.
    let caveat = match kind {
        "synthetic" => "SYNTHETIC WEIGHTS: the numbers measure the schedules on this network (seeded random UNet, TAESD and whisper, driven by real speech), not the trained MuseTalk's face motion; decoded frames are not faces. `--models DIR` runs the same measurement with real weights.".to_string(),
        "real" => format!("real weights ({profile} profile)"),
        _ => format!("MIXED WEIGHTS ({weights}): only some engines have real weights"),
    };
    prov.note("weights_caveat", caveat.clone());
    prov.note(
        "method",
        "per budget b, every schedule gets exactly the UNet evaluations of the pipeline's fixed stride k = round(1/b) (keyframes in bypassed silence are not evaluated); keyframes take the dense latents, the pipeline's infill (SLERP, Hermite easing) fills the rest; frames bypassed in silence are identical in every render and left out of the means",
    );
    prov.note(
        "metrics",
        format!(
            "latent error |v - v_dense| / |v_dense| of the eased latents; PSNR from the mean squared error over the frames not bypassed, decoded {FACE_SIDE}x{FACE_SIDE} RGB clamped to the decoder's range; SSIM on BT.601 luma; flicker = mean |frame[t+1] - frame[t]| in the mouth region x {}..{}, y {}..{} of the crop over all frames, 8-bit scale; a frame's phoneme class is the most demanding class touching it (closure > release > open vowel > other consonant > sustained vowel > silence)",
            MOUTH.x,
            MOUTH.x + MOUTH.width,
            MOUTH.y,
            MOUTH.y + MOUTH.height
        ),
    );
    prov.note("time", "scheduling_ms: making the schedule (signals included; the audio features are the render's own); render_neural_ms: audio encoder + UNet x evaluations + decoder x decoded frames, from this run's dense timings: a lower bound of a render (compositing and encoding left out), so scheduling_share_pct is an upper bound");
    for (k, v) in notes {
        prov.note(k, v);
    }
    prov.note(
        "load_average",
        format!(
            "{load_before} at start, {} at end (1/5/15 min; shared machine)",
            experiments::provenance::load_average()
        ),
    );
    let verdicts = targets(&rows);
    for (i, v) in verdicts.iter().enumerate() {
        prov.note(format!("target_{}", i + 1), v.clone());
    }
    prov.note("runtime", format!("{:.0} s", t_run.elapsed().as_secs_f64()));

    print_table(&rows);
    println!("{caveat}");
    for v in &verdicts {
        println!("target: {v}");
    }
    let csv = out_dir.join("adaptive_strides.csv");
    write_csv(&csv, &prov, &rows)?;
    println!("wrote {}", csv.display());
    let files = pareto(&out_dir, &rows, &args.clips, kind, &profile, &prov)?;
    println!("wrote {} and {}", files.png.display(), files.svg.display());
    if let Some((dense, outcomes, b)) = &timeline {
        let files = draw_timeline(&out_dir, dense, outcomes, *b, kind, &prov)?;
        println!("wrote {} and {}", files.png.display(), files.svg.display());
    }
    println!("adaptive_strides took {:.0} s", t_run.elapsed().as_secs_f64());
    Ok(())
}

fn plan(d: &Dense, kind: ScheduleKind, target: Target, scale: Option<f64>) -> Result<schedules::Planned> {
    let mut inputs = Inputs::new(25.0, &d.bypassed);
    inputs.alignment = d.alignment.as_ref();
    inputs.samples_16k = Some(&d.samples);
    inputs.features = Some((&d.features, d.window));
    inputs.error_scale = scale;
    schedules::plan(kind, target, &inputs)
}

fn dense_render(
    session: &Session,
    name: &str,
    audio: cadence_media::Audio,
    alignment: Option<Alignment>,
) -> Result<Dense> {
    let Session { inputs: SessionInputs { backend, opts, img, face, .. }, engines } = session;
    ensure!(opts.fps == cadence_media::FrameRate::whole(25), "the experiment runs at 25 fps");
    let samples = audio.samples_16k.clone();
    let prepared = cadence::musetalk::render::prepare(engines, backend, audio, img, *face, opts)?;
    let features = prepared.whole_features(engines, opts)?;
    let n = prepared.frames;
    let distance = speech_distance(&prepared.speech);
    let bypassed = bypassed_frames(&distance, opts.ramp);
    let active: Vec<usize> = (0..n).filter(|&f| !bypassed[f]).collect();
    ensure!(active.len() >= 8, "clip {name}: only {} frames are not bypassed in silence", active.len());
    let batch = opts.batch.max(1);
    let bar = progress_bar(active.len() as u64, &format!("{name}: UNet (dense)"));
    let t = Instant::now();
    let lat = unet_frames(&engines.unet, &features, &prepared.avatar[0], &active, batch, |b| bar.inc(b as u64))?;
    let unet_ms_per_eval = t.elapsed().as_secs_f64() * 1e3 / active.len() as f64;
    bar.finish_and_clear();
    let rest = prepared.avatar[0].rest.clone();
    let mut raw = Vec::with_capacity(n * LATENT_DIM);
    let mut j = 0;
    for &b in &bypassed {
        if b {
            raw.extend_from_slice(&rest);
        } else {
            raw.extend_from_slice(frame_of(&lat, j));
            j += 1;
        }
    }
    let all: Vec<usize> = (0..n).collect();
    let eased = infill(session, &raw, &all, n, &distance, &rest)?;
    let act_lat: Vec<f32> = active.iter().flat_map(|&f| frame_of(&eased, f).iter().copied()).collect();
    let bar = progress_bar(active.len() as u64, &format!("{name}: decoding (dense)"));
    let t = Instant::now();
    let mut rgb = vec![0.0f32; active.len() * CROP];
    decode_each(engines.decoder.as_ref(), &act_lat, batch, |i, c| {
        rgb[i * CROP..(i + 1) * CROP].copy_from_slice(c);
        bar.inc(1);
        Ok(())
    })?;
    let decoder_ms_per_frame = t.elapsed().as_secs_f64() * 1e3 / active.len() as f64;
    bar.finish_and_clear();
    let (lo, hi) = engines.decoder.output_range();
    let rest_rgb: Vec<f32> = prepared.avatar[0].rest_rgb.iter().map(|v| v.clamp(lo, hi)).collect();
    let shape = ImageShape::rgb(FACE_SIDE, FACE_SIDE);
    let rest_mouth = metrics::crop(&rest_rgb, shape, MOUTH)?;
    let mut mouth = Vec::with_capacity(n * rest_mouth.len());
    let mut j = 0;
    for &b in &bypassed {
        if b {
            mouth.extend_from_slice(&rest_mouth);
        } else {
            mouth.extend(metrics::crop(&rgb[j * CROP..(j + 1) * CROP], shape, MOUTH)?);
            j += 1;
        }
    }
    let classes = alignment.as_ref().map(|a| {
        let fc = a.frame_classes(n, 25.0);
        if let Some(w) = fc.warning() {
            eprintln!("adaptive_strides: {name}: {w}");
        }
        fc.classes
    });
    let window = features.shape[1..].iter().product::<usize>();
    eprintln!(
        "adaptive_strides: {name}: {n} frames, {} not bypassed; UNet {unet_ms_per_eval:.1} ms/frame, decoder {decoder_ms_per_frame:.1} ms/frame",
        active.len()
    );
    Ok(Dense {
        name: name.to_string(),
        n,
        bypassed,
        distance,
        active,
        raw,
        eased,
        rgb,
        mouth,
        rest_mouth,
        features: features.data.clone(),
        window,
        samples,
        alignment,
        classes,
        audio_encoder_ms: prepared.audio_encoder_ms,
        unet_ms_per_eval,
        decoder_ms_per_frame,
        rest,
    })
}

/// The pipeline's infill of keyframes `keys` (latents from `raw`): one expansion, easing.
fn infill(
    session: &Session,
    raw: &[f32],
    keys: &[usize],
    n: usize,
    distance: &[u32],
    rest: &[f32],
) -> Result<Vec<f32>> {
    let schedule = KeyframeSchedule::explicit(n, keys)?;
    let key_lat: Vec<f32> = keys.iter().flat_map(|&f| frame_of(raw, f).iter().copied()).collect();
    let t = Tensor::from_vec(key_lat, (keys.len(), 4, 32, 32), &Device::Cpu)?;
    let infill = Infill { schedule: &schedule, method: Method::Slerp, rest, distance, ramp: session.opts.ramp };
    let (out, _, _) = expand_eased(&session.backend, &t, &infill)?;
    Ok(out.flatten_all()?.to_vec1::<f32>()?)
}

#[allow(clippy::too_many_arguments)]
fn evaluate(
    session: &Session,
    d: &Dense,
    name: &str,
    budget: f64,
    k: usize,
    keys: Vec<usize>,
    scheduling_ms: f64,
    bound: Option<f64>,
) -> Result<Outcome> {
    let engines = &session.engines;
    let lat = infill(session, &d.raw, &keys, d.n, &d.distance, &d.rest)?;
    let mut err = vec![0.0f64; d.n];
    let mut todo = Vec::new();
    for (j, &f) in d.active.iter().enumerate() {
        let (v, r) = (frame_of(&lat, f), frame_of(&d.eased, f));
        let diff: f64 = v.iter().zip(r).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum::<f64>().sqrt();
        err[f] = diff / metrics::l2_norm(r);
        if diff > 0.0 {
            todo.push(j);
        }
    }
    let (lo, hi) = engines.decoder.output_range();
    let peak = (hi - lo) as f64;
    let shape = ImageShape::rgb(FACE_SIDE, FACE_SIDE);
    let mut mse = vec![0.0f64; d.active.len()];
    let mut ssim = vec![1.0f64; d.active.len()];
    let mut mouth = d.mouth.clone();
    let mlen = d.rest_mouth.len();
    let todo_lat: Vec<f32> = todo.iter().flat_map(|&j| frame_of(&lat, d.active[j]).iter().copied()).collect();
    let bar = progress_bar(todo.len() as u64, &format!("{}: {name} @ {budget}", d.name));
    decode_each(engines.decoder.as_ref(), &todo_lat, session.opts.batch, |i, rgb| {
        let j = todo[i];
        let reference = &d.rgb[j * CROP..(j + 1) * CROP];
        mse[j] = metrics::mse(rgb, reference)?;
        ssim[j] = metrics::ssim(rgb, reference, shape, peak)?;
        let f = d.active[j];
        mouth[f * mlen..(f + 1) * mlen].copy_from_slice(&metrics::crop(rgb, shape, MOUTH)?);
        bar.inc(1);
        Ok(())
    })?;
    bar.finish_and_clear();
    let act_err: Vec<f64> = d.active.iter().map(|&f| err[f]).collect();
    let psnr_of = |m: f64| if m > 0.0 { 10.0 * (peak * peak / m).log10() } else { f64::INFINITY };
    let class_err = |c: PhonemeClass| -> Option<f64> {
        let cl = d.classes.as_ref()?;
        let v: Vec<f64> = d.active.iter().filter(|&&f| cl[f] == c).map(|&f| err[f]).collect();
        (!v.is_empty()).then(|| mean(&v))
    };
    let closure_idx: Option<Vec<usize>> = d
        .classes
        .as_ref()
        .map(|cl| (0..d.active.len()).filter(|&j| cl[d.active[j]] == PhonemeClass::Closure).collect());
    let flicker = metrics::temporal_flicker(&mouth, mlen, peak)?.mean_abs_diff_8bit;
    let dense_flicker = metrics::temporal_flicker(&d.mouth, mlen, peak)?.mean_abs_diff_8bit;
    let evaluations = keys.iter().filter(|&&f| !d.bypassed[f]).count();
    let render_neural_ms =
        d.audio_encoder_ms + d.unet_ms_per_eval * evaluations as f64 + d.decoder_ms_per_frame * d.active.len() as f64;
    let row = Row {
        clip: d.name.clone(),
        schedule: name.to_string(),
        budget,
        stride_equivalent: k,
        unet_evaluations: evaluations,
        keyframes: keys.len(),
        frames: d.n,
        active_frames: d.active.len(),
        speech_runs: schedules::active_runs(&d.bypassed).len(),
        evaluated_fraction: evaluations as f64 / d.active.len() as f64,
        latent_err_mean: mean(&act_err),
        latent_err_p90: quantile(&act_err, 0.9),
        latent_err_max: act_err.iter().copied().fold(0.0, f64::max),
        err_closure: class_err(PhonemeClass::Closure),
        err_release: class_err(PhonemeClass::Release),
        err_open_vowel: class_err(PhonemeClass::OpenVowel),
        err_other_consonant: class_err(PhonemeClass::OtherConsonant),
        err_sustained_vowel: class_err(PhonemeClass::SustainedVowel),
        err_silence: class_err(PhonemeClass::Silence),
        closure_frames: closure_idx.as_ref().map(|v| v.len()),
        psnr_db: psnr_of(mean(&mse)),
        psnr_closure_db: closure_idx
            .as_ref()
            .filter(|v| !v.is_empty())
            .map(|v| psnr_of(v.iter().map(|&j| mse[j]).sum::<f64>() / v.len() as f64)),
        ssim_mean: mean(&ssim),
        ssim_min: ssim.iter().copied().fold(1.0, f64::min),
        flicker_mouth_8bit: flicker,
        dense_flicker_mouth_8bit: dense_flicker,
        scheduling_ms,
        render_neural_ms,
        scheduling_share_pct: 100.0 * scheduling_ms / render_neural_ms,
        max_error_bound: bound,
        frames_over_bound_pct: bound
            .map(|b| 100.0 * act_err.iter().filter(|&&e| e > b).count() as f64 / act_err.len() as f64),
        weights_kind: experiments::session::weights_kind(&engines.weights_summary()).into(),
        engine_profile: engines.profile.to_string(),
    };
    eprintln!(
        "adaptive_strides: {} {:<24} budget {:.2}: {} evaluations, latent error {:.4}, PSNR {:.2} dB, scheduling {:.2} ms",
        d.name, name, budget, evaluations, row.latent_err_mean, row.psnr_db, scheduling_ms
    );
    Ok(Outcome { row, keys, err })
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.4}"))
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<8} {:<24} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "clip",
        "schedule",
        "budget",
        "evals",
        "err mean",
        "closure",
        "vowel(s)",
        "PSNR dB",
        "SSIM",
        "flicker",
        "dense fl",
        "sched ms"
    );
    for r in rows {
        println!(
            "{:<8} {:<24} {:>6.3} {:>6} {:>9.4} {:>9} {:>9} {:>8.2} {:>8.5} {:>8.3} {:>8.3} {:>9.2}",
            r.clip,
            r.schedule,
            r.budget,
            r.unet_evaluations,
            r.latent_err_mean,
            fmt_opt(r.err_closure),
            fmt_opt(r.err_sustained_vowel),
            r.psnr_db,
            r.ssim_mean,
            r.flicker_mouth_8bit,
            r.dense_flicker_mouth_8bit,
            r.scheduling_ms
        );
    }
}

/// The targets at the budget nearest 0.33, on every clip with an alignment: one line
/// per adaptive schedule and a verdict per clip, then the scheduling cost.
fn targets(rows: &[Row]) -> Vec<String> {
    let adaptive = ["phonemes", "audio", "error-bounded"];
    let mut out = Vec::new();
    for clip in rows.iter().map(|r| r.clip.clone()).collect::<std::collections::BTreeSet<_>>() {
        let at: Vec<&Row> = rows.iter().filter(|r| r.clip == clip && r.stride_equivalent == 3).collect();
        let Some(s3) = at.iter().find(|r| r.schedule == "stride 3") else { continue };
        let Some(c3) = s3.err_closure else {
            out.push(format!("{clip} clip: no phoneme alignment, closure error undefined"));
            continue;
        };
        let mut met = false;
        for r in at.iter().filter(|r| adaptive.contains(&r.schedule.as_str())) {
            let c = r.err_closure.unwrap_or(f64::NAN);
            let ok = c <= 0.5 * c3 && r.psnr_db >= s3.psnr_db;
            met |= ok;
            out.push(format!(
                "{clip} clip, {} evaluations: {} closure error {:.4} = {:.2} x stride 3's {:.4}, PSNR {:.2} vs {:.2} dB: {}",
                s3.unet_evaluations,
                r.schedule,
                c,
                c / c3,
                c3,
                r.psnr_db,
                s3.psnr_db,
                if ok { "meets both" } else { "misses" }
            ));
        }
        out.push(format!(
            "{clip} clip: closure error <= 0.5 x stride 3's with PSNR no worse: {}",
            if met { "MET by at least one adaptive schedule" } else { "NOT MET" }
        ));
    }
    let worst =
        rows.iter().filter(|r| !r.schedule.starts_with("stride")).map(|r| r.scheduling_share_pct).fold(0.0, f64::max);
    out.push(format!(
        "scheduling: at most {worst:.3}% of the render's neural time (target < 1%: {})",
        if worst < 1.0 { "met" } else { "NOT met" }
    ));
    out
}

const SCHEDULES: [(&str, usize); 6] =
    [("stride", 7), ("fixed", 0), ("phonemes", 2), ("audio", 1), ("error-bounded", 3), ("error-bounded max-error", 4)];

fn color_of(schedule: &str) -> usize {
    if schedule.starts_with("stride") {
        7
    } else {
        SCHEDULES.iter().find(|s| s.0 == schedule).map_or(5, |s| s.1)
    }
}

fn pareto(
    out: &Path,
    rows: &[Row],
    clips: &[ClipName],
    kind: &str,
    profile: &str,
    prov: &Provenance,
) -> Result<experiments::plot::PlotFiles> {
    let mut charts = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for c in clips {
        let n = match c {
            ClipName::Bundled => "bundled",
            ClipName::Text => "text",
        };
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    }
    for clip in &names {
        let of = |sched: &str, f: &dyn Fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
            let mut v: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| {
                    r.clip == *clip && (r.schedule == sched || sched == "stride" && r.schedule.starts_with("stride"))
                })
                .filter_map(|r| f(r).map(|y| (r.unet_evaluations as f64, y)))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let has_classes = rows.iter().any(|r| r.clip == *clip && r.err_closure.is_some());
        let mut psnr =
            LineChart::new(format!("{clip} clip: PSNR vs the dense render"), "UNet evaluations", "PSNR (dB)")
                .legend(Legend::LowerRight);
        let mut second = if has_classes {
            LineChart::new(
                format!("{clip} clip: latent error on closure frames (p b m f v)"),
                "UNet evaluations",
                "mean relative latent error",
            )
        } else {
            LineChart::new(format!("{clip} clip: mean latent error"), "UNet evaluations", "mean relative latent error")
        }
        .legend(Legend::UpperRight);
        // The --max-error row is not at an equal budget: it is in the CSV, not on these curves.
        for (s, _) in SCHEDULES.into_iter().filter(|s| s.0 != "error-bounded max-error") {
            let label = if s == "stride" { "fixed stride k (pipeline)" } else { s };
            let style = LineStyle::SolidMarkers;
            let p = of(s, &|r| Some(r.psnr_db).filter(|v| v.is_finite()));
            if !p.is_empty() {
                psnr = psnr.series(Series::new(label, p).style(style).color(color_of(s)));
            }
            let e = if has_classes { of(s, &|r| r.err_closure) } else { of(s, &|r| Some(r.latent_err_mean)) };
            if !e.is_empty() {
                second = second.series(Series::new(label, e).style(style).color(color_of(s)));
            }
        }
        charts.push(psnr);
        if !second.series.is_empty() {
            charts.push(second);
        }
    }
    let title = format!("Adaptive schedules vs fixed stride at equal UNet evaluations ({kind} weights, {profile})");
    line_plot_grid(&out.join("adaptive_strides_pareto"), &title, &charts, 2, prov)
}

fn draw_timeline(
    out: &Path,
    d: &Dense,
    outcomes: &[Outcome],
    budget: f64,
    kind: &str,
    prov: &Provenance,
) -> Result<experiments::plot::PlotFiles> {
    let at: Vec<&Outcome> = outcomes.iter().filter(|o| (o.row.budget - budget).abs() < 1e-12).collect();
    let mut spans = Vec::new();
    let categories: Vec<String> = PhonemeClass::ALL.iter().map(|c| c.name().to_string()).collect();
    if let Some(cl) = &d.classes {
        let mut f0 = 0;
        for f in 1..=d.n {
            if f == d.n || cl[f] != cl[f0] {
                spans.push((f0 as f64, f as f64, cl[f0].index()));
                f0 = f;
            }
        }
    } else {
        // Without an alignment the span row shows the bypassed silence.
        let mut f0 = 0;
        for f in 1..=d.n {
            if f == d.n || d.bypassed[f] != d.bypassed[f0] {
                if d.bypassed[f0] {
                    spans.push((f0 as f64, f as f64, PhonemeClass::Silence.index()));
                }
                f0 = f;
            }
        }
    }
    let ticks: Vec<(String, Vec<f64>, usize)> = at
        .iter()
        .map(|o| {
            (
                format!("{} ({})", o.row.schedule, o.row.unet_evaluations),
                o.keys.iter().map(|&f| f as f64 + 0.5).collect(),
                color_of(&o.row.schedule),
            )
        })
        .collect();
    let mut chart =
        LineChart::new("per-frame latent error against the dense render", "frame (25 fps)", "relative latent error")
            .legend(Legend::UpperRight);
    for o in &at {
        let pts: Vec<(f64, f64)> = (0..d.n).map(|f| (f as f64 + 0.5, o.err[f])).collect();
        chart = chart.series(Series::new(o.row.schedule.clone(), pts).color(color_of(&o.row.schedule)));
    }
    let t = Timeline {
        title: format!(
            "{} clip at budget {budget}: {}, keyframes per schedule (UNet evaluations), error ({kind} weights)",
            d.name,
            if d.classes.is_some() { "phoneme classes" } else { "bypassed silence" }
        ),
        span_row: if d.classes.is_some() { "phoneme class".into() } else { "bypassed".into() },
        categories,
        spans,
        ticks,
        chart,
        x_range: (0.0, d.n as f64),
    };
    timeline_plot(&out.join("adaptive_strides_timeline"), &t, prov)
}
