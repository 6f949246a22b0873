//! `POST /calibrate` and `GET /v1/calibration`: the calibrate experiment's measurement
//! ([`cadence::measure::calibrate::calibrate`]) run inside the server on the engines it serves with, the
//! source's JSON shape plus the hardware, backend, device, profile, weights and
//! `recommended_render_slots`, cached until the next calibration.
//!
//! A calibration takes every render slot (it waits for the renders in flight, and renders that
//! arrive meanwhile are refused with 503 `calibrating`, as `/readyz` is), so that nothing else
//! shares the engines while they are timed.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::http::Uri;
use axum::Json;
use cadence::frame_loop::RenderOptions;
use cadence::measure::calibrate::{calibrate, CalibrateSetup};
use cadence::musetalk::MuseTalkInfill;
use cadence_media::EncoderKind;
use clap::ValueEnum;
use std::time::Instant;

/// The clip the validating renders use: the experiments' 25.6 s newscast (speech with pauses).
const CLIP: &[u8] = include_bytes!("../../experiments/assets/newscast_25s6.wav");

/// Defaults and bounds of a request's `frames` (validating render length at 25 fps) and `runs`
/// (timed runs per component benchmark). The defaults are the experiment's.
pub const FRAMES: (usize, std::ops::RangeInclusive<usize>) = (50, 5..=250);
pub const RUNS: (usize, std::ops::RangeInclusive<usize>) = (3, 1..=5);
const STRIDES: [usize; 3] = [1, 2, 3];
/// Frames of the encoder benchmark: the experiment's 25, or fewer for a shorter run.
const ENCODER_FRAMES: usize = 25;

/// A calibration's parameters from the query string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub frames: usize,
    pub runs: usize,
    /// The infill projected and rendered (`latent` by default).
    pub infill: MuseTalkInfill,
}

/// `frames` and `runs` within their bounds, and `infill` (`latent` or `image`), from the query
/// string (422 otherwise).
pub fn parse_query(query: Option<&str>) -> Result<Query, ApiError> {
    let (mut frames, mut runs, mut infill) = (None, None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "infill" {
            if infill.is_some() {
                return Err(ApiError::invalid(
                    "duplicate_parameter",
                    format!("the query parameter '{k}' is given twice"),
                ));
            }
            let shown: String = v.chars().take(20).collect();
            infill = Some(MuseTalkInfill::from_str(v, true).map_err(|_| {
                ApiError::invalid("invalid_parameter", format!("infill: '{shown}': expected latent or image"))
            })?);
            continue;
        }
        let (slot, bounds) = match k {
            "frames" => (&mut frames, &FRAMES.1),
            "runs" => (&mut runs, &RUNS.1),
            _ => {
                return Err(ApiError::invalid(
                    "unknown_parameter",
                    format!(
                        "unknown query parameter '{}' (frames, runs, infill)",
                        k.chars().take(40).collect::<String>()
                    ),
                ))
            }
        };
        if slot.is_some() {
            return Err(ApiError::invalid("duplicate_parameter", format!("the query parameter '{k}' is given twice")));
        }
        match v.parse::<usize>() {
            Ok(n) if bounds.contains(&n) => *slot = Some(n),
            _ => {
                let shown: String = v.chars().take(20).collect();
                return Err(ApiError::invalid(
                    "invalid_parameter",
                    format!("{k}: '{shown}': expected an integer in {}..={}", bounds.start(), bounds.end()),
                ));
            }
        }
    }
    Ok(Query { frames: frames.unwrap_or(FRAMES.0), runs: runs.unwrap_or(RUNS.0), infill: infill.unwrap_or_default() })
}

/// Clears the calibrating flag when the calibration ends, however it ends.
struct Calibrating(AppState);

impl Drop for Calibrating {
    fn drop(&mut self) {
        self.0.set_calibrating(false);
    }
}

pub async fn post(State(state): State<AppState>, uri: Uri) -> Result<Json<serde_json::Value>, ApiError> {
    let query = parse_query(uri.query()).inspect_err(|_| state.metrics.rejection("invalid"))?;
    let Query { frames, runs, infill } = query;
    let set = state.ready_engines()?;
    if !state.set_calibrating(true) {
        return Err(ApiError::unavailable("calibrating", "a calibration is running"));
    }
    let flag = Calibrating(state.clone());
    let t = Instant::now();
    // Every slot: the renders in flight finish first, new ones are refused meanwhile.
    let slots = state.admission.take_all().await;
    let waited_ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::info!(frames, runs, infill = infill.name(), waited_ms = format!("{waited_ms:.0}"), "calibrating");
    let st = state.clone();
    // The thread owns the slots and the flag: a client that leaves does not end the calibration
    // early (its result is still cached), and the server stays unready until it ends.
    let json = tokio::task::spawn_blocking(move || {
        let _held = (slots, flag);
        measure(&st, &set, query)
    })
    .await
    .map_err(|e| ApiError::internal("the calibration thread failed", e))?
    .map_err(|e| ApiError::internal("the calibration failed", format!("{e:#}")))?;
    *state.calibration.lock().unwrap() = Some(json.clone());
    Ok(Json(json))
}

pub async fn get(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    state
        .calibration
        .lock()
        .unwrap()
        .clone()
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no_calibration", "no calibration yet (POST /calibrate runs one)"))
}

fn measure(
    state: &AppState,
    set: &crate::engines::EngineSet,
    Query { frames, runs, infill }: Query,
) -> anyhow::Result<serde_json::Value> {
    let t = Instant::now();
    let engines = set.primary();
    let opts = RenderOptions {
        batch: state.config.engines.batch as usize,
        vad: state.config.vad.vad(),
        infill,
        ..RenderOptions::default()
    };
    // The inputs go through the CLI's loaders, from files in a directory of the calibration's own.
    let scratch = crate::tempdirs::request_dir(&state.config.temp_root)?;
    let (clip, avatar) = (scratch.path().join("clip.wav"), scratch.path().join("avatar"));
    std::fs::write(&clip, CLIP)?;
    std::fs::write(&avatar, &state.config.default_avatar)?;
    let whole = cadence::frame_loop::audio::load_audio(&clip, f64::INFINITY)?;
    let keep = (frames as f64 / opts.fps.hz() * cadence_media::TARGET_RATE as f64).round() as usize;
    let audio = cadence_media::Audio::from_samples_16k(whole.samples_16k[..keep.min(whole.samples_16k.len())].to_vec());
    let img = cadence::avatar::load_avatar(&avatar)?;
    let face = cadence::avatar::face_box(&img, None)?;
    let setup = CalibrateSetup {
        engines,
        backend: &set.backend,
        opts: &opts,
        audio: &audio,
        img: &img,
        face,
        encoder: Some(EncoderKind::OpenH264),
        strides: &STRIDES,
        runs,
        encoder_frames: frames.min(ENCODER_FRAMES),
        scratch: scratch.path(),
    };
    let cal = calibrate(&setup, &mut |_| {})?;
    let rendered = setup_json(set);
    Ok(serde_json::json!({
        "benchmarks": {"musetalk": cal.musetalk_json(engines)},
        "hardware": {"cpu": cadence::backend::hardware::cpu_model(), "logical_cpus": cadence::backend::hardware::logical_cpus()},
        "backend": rendered.backend,
        "device": rendered.engine_device,
        "engines": rendered.engines,
        "profile": rendered.profile,
        "weights": rendered.weights,
        "recommended_render_slots": 1,
        "recommended_render_slots_basis": "one per engine device: one render already keeps the device busy (on the CPU, candle's thread pool uses every core), so renders in parallel split it; parallel throughput is not measured by this calibration",
        "calibration": {
            "frames": frames,
            "runs": runs,
            "infill": infill.name(),
            "strides": STRIDES,
            "encoder": "openh264",
            "encoder_frames": frames.min(ENCODER_FRAMES),
            "input": format!("newscast_25s6.wav (first {frames} frames) + the default avatar {}x{}", img.width(), img.height()),
            "count_mismatch": cal.count_mismatch,
            "seconds": t.elapsed().as_secs_f64(),
        },
    }))
}

fn setup_json(set: &crate::engines::EngineSet) -> cadence::frame_loop::report::RenderSetup {
    set.setup(set.primary())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_runs_within_their_bounds() {
        let q = |frames, runs| Query { frames, runs, infill: MuseTalkInfill::Latent };
        assert_eq!(parse_query(None).unwrap(), q(50, 3));
        assert_eq!(parse_query(Some("frames=10&runs=1")).unwrap(), q(10, 1));
        assert_eq!(parse_query(Some("frames=250")).unwrap(), q(250, 3));
        for (q, code) in [
            ("frames=4", "invalid_parameter"),
            ("frames=251", "invalid_parameter"),
            ("runs=0", "invalid_parameter"),
            ("runs=6", "invalid_parameter"),
            ("runs=x", "invalid_parameter"),
            ("frames=10&frames=10", "duplicate_parameter"),
            ("strides=1", "unknown_parameter"),
        ] {
            let e = parse_query(Some(q)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (422, code), "{q}");
        }
    }

    #[test]
    fn infill_is_latent_or_image() {
        let q = parse_query(Some("frames=10&infill=image&runs=1")).unwrap();
        assert_eq!(q, Query { frames: 10, runs: 1, infill: MuseTalkInfill::Image });
        assert_eq!(parse_query(Some("infill=latent")).unwrap().infill, MuseTalkInfill::Latent);
        assert_eq!(parse_query(None).unwrap().infill, MuseTalkInfill::Latent, "latent by default");
        for (q, code) in [
            ("infill=pixels", "invalid_parameter"),
            ("infill=", "invalid_parameter"),
            ("infill=image&infill=image", "duplicate_parameter"),
        ] {
            let e = parse_query(Some(q)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (422, code), "{q}");
        }
        let e = parse_query(Some("infill=pixels")).unwrap_err();
        assert_eq!(e.message, "infill: 'pixels': expected latent or image");
    }
}
