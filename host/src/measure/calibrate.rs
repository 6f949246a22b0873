//! Hardware calibration as the source's `/calibrate` does it: measure each component's
//! throughput (UNet, decoder, SLERP expansion, compositing + NV12, video encoder, and the
//! once-per-render audio encoder + avatar preparation), project frames/s per stride from them,
//! then render the same clip at each stride through the real pipeline and report measured
//! against projected, with the error, per stage as well as in total. The `calibrate` experiment
//! (which writes `results/calibrate.{json,csv}`) and the server's `POST /calibrate` both call
//! [`calibrate`].
//!
//! The projection: the neural stages and the compositing run one after another, so the frame
//! loop takes UNet ms x evaluations + decoder ms x decoded frames + compositing ms x frames +
//! expansion; the video encoder runs beside that loop on a thread of its own, so its time (encoder
//! ms x frames) is shared over the loop's threads when the loop keeps them busy, and the render
//! cannot end before the encoder has ([`projected_render_ms`]); `projected_fps` is the frame loop's
//! throughput (what the source's projections describe), `*_end_to_end` adds the once-per-render
//! audio encoder + avatar preparation. The evaluation counts come from the keyframe schedule and
//! the clip's voice activity before rendering (silence far enough from speech bypasses the UNet
//! and the decoder). With `image` infill ([`MuseTalkInfill::Image`]) the decoder runs only on the
//! keyframes the UNet evaluates, so the projection counts decoded frames = UNet evaluations, and
//! the expansion is measured on decoded face crops (3 x FACE_SIDE x FACE_SIDE values per frame, in
//! the decoder's range) instead of 4 x 32 x 32 latents. The source does not say how it projects;
//! its example numbers (UNet 472.7 fps, TAESD 2216.8 fps -> 351.6, 510.0, 620.0 fps at strides
//! 1, 2, 3) match no serial or pipelined model of those two throughputs alone (serial gives
//! 389.6, 662.8, 864.9), so its exact formula cannot be reproduced; the JSON keeps its shape.

use crate::backend::composite::FaceBox;
use crate::frame_loop::video::Output;
use crate::frame_loop::RenderOptions;
use crate::io::output::{OutputPath, Overwrite};
use crate::musetalk::{Engines, MuseTalkInfill};
use crate::schedules::keyframes::{bypassed_frames, speech_distance};
use crate::{Backend, KeyframeSchedule, RgbRange};
use anyhow::{ensure, Context, Result};
use cadence_engines::bench::{bench_decoder, bench_keyframe};
use cadence_engines::Engine;
use cadence_media::{Audio, EncoderKind, RgbImage};
use std::path::Path;
use std::time::Instant;

/// Component costs measured by [`calibrate`], in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ComponentCosts {
    /// UNet, per evaluated keyframe (1000 / its throughput in frames/s).
    pub unet_ms_per_frame: f64,
    /// Decoder, per decoded frame.
    pub decoder_ms_per_frame: f64,
    /// Compositing fused with NV12, per output frame.
    pub composite_nv12_ms_per_frame: f64,
    /// Video encoder, per output frame (0 without an encoder).
    pub encoder_ms_per_frame: f64,
    /// Once per render: audio encoder on the clip plus avatar preparation.
    pub fixed_ms_per_render: f64,
    /// Threads the frame loop's stages run on (the encoder's thread shares their cores).
    pub loop_threads: usize,
}

/// What one render at a given stride evaluates: known before rendering from the schedule, the
/// voice activity (bypassed silence runs skip the UNet and the decoder) and the infill (`image`
/// decodes the evaluated keyframes only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RenderCounts {
    pub frames: usize,
    pub unet_evaluations: usize,
    pub decoded_frames: usize,
}

impl RenderCounts {
    /// Counts from the keyframe list, the per-frame bypass flags (`bypassed[f]`: frame f is deep
    /// enough in silence that the pipeline skips every network for it) and the infill: `latent`
    /// decodes every frame not bypassed, `image` only the keyframes the UNet evaluates (the frames
    /// between are blends of their decoded crops).
    pub fn from_schedule(keys: &[u32], bypassed: &[bool], infill: MuseTalkInfill) -> Result<RenderCounts> {
        ensure!(!bypassed.is_empty(), "a render has at least one frame");
        ensure!(
            keys.iter().all(|&k| (k as usize) < bypassed.len()),
            "a keyframe lies outside the {} frames",
            bypassed.len()
        );
        let unet_evaluations = keys.iter().filter(|&&k| !bypassed[k as usize]).count();
        let decoded_frames = match infill {
            MuseTalkInfill::Latent => bypassed.iter().filter(|&&b| !b).count(),
            MuseTalkInfill::Image => unet_evaluations,
        };
        Ok(RenderCounts { frames: bypassed.len(), unet_evaluations, decoded_frames })
    }
}

/// Projected wall time of one render in ms: the frame loop's serial stages (UNet x evaluations,
/// decoder x decoded frames, compositing x frames and the keyframe expansion, added up), plus the
/// encoder's time (encoder x frames) spread over the loop's threads, at least the encoder's own
/// time (it runs beside the loop on one thread), plus the fixed per-render work. With one loop
/// thread this is the serial sum.
pub fn projected_render_ms(c: &ComponentCosts, n: &RenderCounts, expand_ms: f64) -> f64 {
    let frame_loop = c.unet_ms_per_frame * n.unet_evaluations as f64
        + c.decoder_ms_per_frame * n.decoded_frames as f64
        + c.composite_nv12_ms_per_frame * n.frames as f64
        + expand_ms;
    let encoder = c.encoder_ms_per_frame * n.frames as f64;
    (frame_loop + encoder / c.loop_threads.max(1) as f64).max(encoder) + c.fixed_ms_per_render
}

/// Frames per second of a render of `frames` frames taking `ms`.
pub fn fps(frames: usize, ms: f64) -> f64 {
    frames as f64 / (ms * 1e-3)
}

/// Signed relative error of a projection, 100 (projected - measured) / measured: positive when the
/// projection is optimistic.
pub fn projection_error_pct(projected: f64, measured: f64) -> f64 {
    100.0 * (projected - measured) / measured
}

/// The source's duty-cycle label: "100%", "50%", "33.3%" (one decimal, trailing ".0" dropped).
pub fn duty_cycle_label(fraction: f64) -> String {
    let s = format!("{:.1}", 100.0 * fraction);
    format!("{}%", s.strip_suffix(".0").unwrap_or(&s))
}

/// What a calibration measures with: the engines, the clip and portrait it renders, and how much.
pub struct CalibrateSetup<'a> {
    pub engines: &'a Engines,
    pub backend: &'a Backend,
    pub opts: &'a RenderOptions,
    /// The clip of the validating renders (its length is the renders' length).
    pub audio: &'a Audio,
    pub img: &'a RgbImage,
    pub face: FaceBox,
    /// None: time everything but the video encoder, and write no video.
    pub encoder: Option<EncoderKind>,
    pub strides: &'a [usize],
    /// Timed runs per component benchmark (median reported).
    pub runs: usize,
    /// Frames the encoder benchmark encodes.
    pub encoder_frames: usize,
    /// Where the validating renders write their MP4s (removed after each).
    pub scratch: &'a Path,
}

/// Where a calibration is, for a progress display.
pub enum Step {
    /// A component benchmark starts (six in all).
    Component(&'static str),
    /// The validating render at a stride starts.
    Render { stride: usize, keyframes: usize },
    /// Frames encoded by the validating render.
    Frames(usize),
}

/// One stride's projection and measurement. `*_ms` are per render (all frames).
#[derive(Clone, Debug, serde::Serialize)]
pub struct StrideRow {
    pub stride: usize,
    pub frames: usize,
    pub keyframes: usize,
    pub unet_evaluations: usize,
    pub decoded_frames: usize,
    pub bypassed_frames: usize,
    pub unet_duty_cycle_pct: f64,
    /// Frame loop (crate::musetalk::render::render_clip: UNet, expansion, easing, decoder, compositing, encoder),
    /// the steady-state throughput the source's projections describe.
    pub projected_fps: f64,
    pub measured_fps: f64,
    /// 100 (projected - measured) / measured: positive = the projection is optimistic.
    pub error_pct: f64,
    /// The frame-loop projection if every frame were speech (no bypass), as the source assumes.
    pub projected_fps_no_bypass: f64,
    /// End to end: the frame loop plus the once-per-render preparation (audio encoder, avatar).
    pub projected_fps_end_to_end: f64,
    pub measured_fps_end_to_end: f64,
    pub error_pct_end_to_end: f64,
    /// Frame loop time of the whole render.
    pub projected_ms: f64,
    pub measured_ms: f64,
    pub projected_unet_ms: f64,
    pub measured_unet_ms: f64,
    pub projected_decoder_ms: f64,
    pub measured_decoder_ms: f64,
    pub projected_expand_ms: f64,
    pub measured_expand_ms: f64,
    pub projected_composite_nv12_ms: f64,
    pub measured_composite_nv12_ms: f64,
    pub projected_encoder_ms: f64,
    pub measured_encoder_ms: f64,
    /// Audio encoder + avatar preparation (crate::musetalk::render::prepare).
    pub projected_prepare_ms: f64,
    pub measured_prepare_ms: f64,
    /// Easing and bookkeeping: measured, not projected (no component benchmark).
    pub measured_other_ms: f64,
    /// The infill projected and rendered: `latent` or `image` (the decoder on keyframes only).
    pub infill: MuseTalkInfill,
}

/// A calibration's measurements.
pub struct Calibration {
    pub unet_fps: f64,
    pub decoder_fps: f64,
    pub costs: ComponentCosts,
    /// Keyframe expansion per render, per stride (0 at stride 1): of latents, or (`image` infill)
    /// of decoded face crops.
    pub expand_ms: Vec<f64>,
    /// The infill projected and rendered.
    pub infill: MuseTalkInfill,
    pub prepare_ms: f64,
    pub audio_encoder_ms: f64,
    pub avatar_encoder_ms: f64,
    pub compositor_setup_ms: f64,
    pub rows: Vec<StrideRow>,
    /// Strides whose render evaluated other counts than projected (the projection's inputs are
    /// then wrong, not just its costs).
    pub count_mismatch: Vec<String>,
    /// `stride_projections` of the source's JSON, with the measurements beside each projection.
    pub projections: serde_json::Map<String, serde_json::Value>,
    pub encoder: Option<EncoderKind>,
    pub batch: usize,
}

/// Refuses what [`calibrate`] cannot run (callers check before loading anything).
pub fn check_parameters(strides: &[usize], runs: usize, encoder_frames: usize) -> Result<()> {
    ensure!(runs > 0, "--runs must be at least 1");
    ensure!(!strides.is_empty() && strides.iter().all(|&k| k > 0), "--strides must be positive integers");
    ensure!(encoder_frames > 0, "--encoder-frames must be at least 1");
    Ok(())
}

/// Measures the components, projects each stride, and renders each stride to compare.
pub fn calibrate(c: &CalibrateSetup, progress: &mut dyn FnMut(Step)) -> Result<Calibration> {
    check_parameters(c.strides, c.runs, c.encoder_frames)?;
    let (engines, backend, opts) = (c.engines, c.backend, c.opts);

    // 1. Component throughputs.
    progress(Step::Component("UNet"));
    let unet = bench_keyframe(&engines.unet, opts.batch, c.runs)?;
    progress(Step::Component("decoder"));
    let dec = bench_decoder(engines.decoder.as_ref(), opts.batch, c.runs)?;
    progress(Step::Component("audio encoder + avatar"));
    let t = Instant::now();
    let prepared = crate::musetalk::render::prepare(engines, backend, c.audio.clone(), c.img, c.face, opts)?;
    let prepare_ms = t.elapsed().as_secs_f64() * 1e3;
    let n = prepared.frames;
    progress(Step::Component("keyframe expansion"));
    let side = crate::musetalk::FACE_SIDE;
    // What the expansion blends: latents, or (image infill) decoded crops in the decoder's range.
    let (expand_dim, expand_range) = match opts.infill {
        MuseTalkInfill::Latent => (crate::musetalk::LATENT_DIM, None),
        MuseTalkInfill::Image => (3 * side * side, Some(engines.decoder_range())),
    };
    let mut expand_ms = Vec::new();
    for &k in c.strides {
        let ms = if k > 1 {
            crate::measure::bench::bench_expand_of::<f32>(backend, n, k, expand_dim, opts.method, 11, |x| {
                expand_range.map_or(x, |r| crop_value(r, x))
            })?
            .median_ms
        } else {
            0.0 // stride 1: every frame is a keyframe; the copy is part of "other"
        };
        expand_ms.push(ms);
    }
    progress(Step::Component("composite + NV12"));
    let crop = crate::measure::fixtures::test_data(3 * side * side, 5)
        .iter()
        .map(|&x| crop_value(RgbRange::Unit, x))
        .collect::<Vec<f32>>();
    let mut frame = vec![0u8; prepared.compositors[0].frame_bytes()];
    let comp_ms = crate::measure::bench::median(&crate::measure::bench::time_host(2, 9, || {
        prepared.compositors[0].compose(&crop, side, side, RgbRange::Unit, &mut frame)
    }));
    progress(Step::Component("video encoder"));
    let enc_ms = match c.encoder {
        Some(e) => bench_encoder(e, c.img.width(), c.img.height(), &frame, c.encoder_frames, c.scratch)?,
        None => 0.0,
    };

    let costs = ComponentCosts {
        unet_ms_per_frame: 1e3 / unet.frames_per_s,
        decoder_ms_per_frame: 1e3 / dec.frames_per_s,
        composite_nv12_ms_per_frame: comp_ms,
        encoder_ms_per_frame: enc_ms,
        fixed_ms_per_render: 0.0, // the frame loop; the preparation is added for end to end
        loop_threads: rayon::current_num_threads(),
    };

    // 2. Projection per stride, then 3. a real render per stride.
    let bypassed = bypassed_frames(&speech_distance(&prepared.speech), opts.ramp);
    let mut rows = Vec::new();
    let mut projections = serde_json::Map::new();
    let mut count_mismatch = Vec::new();
    for (&k, &exp_ms) in c.strides.iter().zip(&expand_ms) {
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        let counts = RenderCounts::from_schedule(schedule.keyframes(), &bypassed, opts.infill)?;
        let projected_ms = projected_render_ms(&costs, &counts, exp_ms); // frame loop
        let dense = RenderCounts::from_schedule(schedule.keyframes(), &vec![false; n], opts.infill)?;
        let projected_no_bypass = fps(n, projected_render_ms(&costs, &dense, exp_ms));

        progress(Step::Render { stride: k, keyframes: schedule.count() });
        let t = Instant::now();
        let prep = crate::musetalk::render::prepare(engines, backend, c.audio.clone(), c.img, c.face, opts)?;
        let measured_prepare_ms = t.elapsed().as_secs_f64() * 1e3;
        let out = OutputPath::check(&c.scratch.join(format!("stride_{k}.mp4")), Overwrite::Replace, &[])?;
        let output = match c.encoder {
            Some(e) => Output::Mp4 { out: &out, encoder: e },
            None => Output::Discard,
        };
        let r = crate::musetalk::render::render_clip(engines, backend, opts, &prep, &schedule, output, |d| {
            progress(Step::Frames(d))
        })
        .with_context(|| format!("render at stride {k}"))?;
        let measured_e2e_ms = t.elapsed().as_secs_f64() * 1e3;
        let measured_ms = measured_e2e_ms - measured_prepare_ms; // frame loop, encoder finish included
        let _ = std::fs::remove_file(out.path());
        let s = &r.stats;
        if s.keyframes_evaluated != counts.unet_evaluations || s.decoded_frames != counts.decoded_frames {
            count_mismatch.push(format!(
                "stride {k}: projected {} UNet evaluations / {} decoded frames, the render did {} / {}",
                counts.unet_evaluations, counts.decoded_frames, s.keyframes_evaluated, s.decoded_frames
            ));
        }
        let projected = fps(n, projected_ms);
        let measured = fps(n, measured_ms);
        let projected_e2e = fps(n, projected_ms + prepare_ms);
        let measured_e2e = fps(n, measured_e2e_ms);
        let duty = schedule.duty_cycle();
        let row = StrideRow {
            stride: k,
            frames: n,
            keyframes: schedule.count(),
            unet_evaluations: counts.unet_evaluations,
            decoded_frames: counts.decoded_frames,
            bypassed_frames: s.bypassed_frames,
            unet_duty_cycle_pct: 100.0 * duty,
            projected_fps: projected,
            measured_fps: measured,
            error_pct: projection_error_pct(projected, measured),
            projected_fps_no_bypass: projected_no_bypass,
            projected_fps_end_to_end: projected_e2e,
            measured_fps_end_to_end: measured_e2e,
            error_pct_end_to_end: projection_error_pct(projected_e2e, measured_e2e),
            projected_ms,
            measured_ms,
            projected_unet_ms: costs.unet_ms_per_frame * counts.unet_evaluations as f64,
            measured_unet_ms: s.times.unet_ms,
            projected_decoder_ms: costs.decoder_ms_per_frame * counts.decoded_frames as f64,
            measured_decoder_ms: s.times.decoder_ms,
            projected_expand_ms: exp_ms,
            measured_expand_ms: s.times.expand_ms,
            projected_composite_nv12_ms: comp_ms * n as f64,
            measured_composite_nv12_ms: s.times.composite_nv12_ms,
            projected_encoder_ms: enc_ms * n as f64,
            measured_encoder_ms: s.times.encoder_ms,
            projected_prepare_ms: prepare_ms,
            measured_prepare_ms,
            measured_other_ms: s.times.ease_ms + s.times.other_ms,
            infill: opts.infill,
        };
        projections.insert(format!("stride_{k}"), projection_json(&row, duty, opts));
        rows.push(row);
    }
    Ok(Calibration {
        unet_fps: unet.frames_per_s,
        decoder_fps: dec.frames_per_s,
        costs,
        expand_ms,
        infill: opts.infill,
        prepare_ms,
        audio_encoder_ms: prepared.audio_encoder_ms,
        avatar_encoder_ms: prepared.avatar_encoder_ms,
        compositor_setup_ms: prepared.compositor_setup_ms,
        rows,
        count_mismatch,
        projections,
        encoder: c.encoder,
        batch: opts.batch,
    })
}

/// The source's `stride_k` entry (`stride`, `projected_fps`, `unet_duty_cycle`, `description`)
/// with the measured render beside it.
fn projection_json(r: &StrideRow, duty: f64, opts: &RenderOptions) -> serde_json::Value {
    let (k, n) = (r.stride, r.frames);
    let description = if k == 1 {
        format!(
            "Dense baseline: UNet on every frame ({} evaluated, {} bypassed as silence)",
            r.unet_evaluations,
            n - r.unet_evaluations
        )
    } else {
        format!(
            "Stride {k} cadence, {} {} infill: UNet on {} of {n} frames ({}% skipped), {} evaluated after silence bypass, {} decoded",
            format!("{:?}", opts.method).to_uppercase(),
            r.infill.name(),
            r.keyframes,
            duty_cycle_label(1.0 - duty).trim_end_matches('%'),
            r.unet_evaluations,
            r.decoded_frames
        )
    };
    serde_json::json!({
        "stride": k,
        "projected_fps": r.projected_fps,
        "unet_duty_cycle": duty_cycle_label(duty),
        "description": description,
        "measured_fps": r.measured_fps,
        "error_pct": r.error_pct,
        "projected_fps_no_bypass": r.projected_fps_no_bypass,
        "projected_fps_end_to_end": r.projected_fps_end_to_end,
        "measured_fps_end_to_end": r.measured_fps_end_to_end,
        "error_pct_end_to_end": r.error_pct_end_to_end,
        "unet_evaluations": r.unet_evaluations,
        "decoded_frames": r.decoded_frames,
        "frames": n,
        "infill": r.infill.name(),
    })
}

impl Calibration {
    /// `benchmarks.musetalk` of the source's JSON: `unet` and the decoder (`taesd`, or the SD
    /// VAE's name) with `engine` and `throughput_fps`, cadence's `components`, and
    /// `stride_projections`.
    pub fn musetalk_json(&self, engines: &Engines) -> serde_json::Value {
        let decoder_key = match engines.decoder.model() {
            cadence_engines::ModelKind::TaesdDecoder => "taesd".to_string(),
            m => m.to_string().replace('-', "_"),
        };
        let encoder = self.encoder.map(|e| e.to_string()).unwrap_or_else(|| "none".into());
        let mut musetalk = serde_json::Map::new();
        musetalk.insert(
            "unet".into(),
            serde_json::json!({
                "engine": format!("{}, f32, batch {}", engines.unet.describe(), self.batch),
                "throughput_fps": self.unet_fps,
                "weights": engines.unet.weights_label(),
            }),
        );
        musetalk.insert(
            decoder_key,
            serde_json::json!({
                "engine": format!("{}, f32, batch {}", engines.decoder.describe(), self.batch),
                "throughput_fps": self.decoder_fps,
                "weights": engines.decoder.weights_label(),
            }),
        );
        let expansion: serde_json::Map<_, _> = self
            .rows
            .iter()
            .zip(&self.expand_ms)
            .map(|(r, m)| (format!("stride_{}", r.stride), serde_json::json!(m)))
            .collect();
        musetalk.insert(
            "components".into(),
            serde_json::json!({
                "infill": self.infill.name(),
                "expansion_ms_per_render": expansion,
                "composite_nv12_ms_per_frame": self.costs.composite_nv12_ms_per_frame,
                "encoder": encoder,
                "encoder_ms_per_frame": self.costs.encoder_ms_per_frame,
                "prepare_ms_per_render": self.prepare_ms,
                "audio_encoder_ms_per_render": self.audio_encoder_ms,
                "avatar_encoder_ms_per_render": self.avatar_encoder_ms,
                "compositor_setup_ms_per_render": self.compositor_setup_ms,
            }),
        );
        musetalk.insert("stride_projections".into(), serde_json::Value::Object(self.projections.clone()));
        serde_json::Value::Object(musetalk)
    }
}

/// A face crop value in `range` from test data (roughly normal around 0): the middle of the range
/// with some spread, clamped into it.
fn crop_value(range: RgbRange, x: f32) -> f32 {
    match range {
        RgbRange::Unit => (0.5 + 0.2 * x).clamp(0.0, 1.0),
        RgbRange::Signed => (0.4 * x).clamp(-1.0, 1.0),
    }
}

/// Milliseconds per frame of the video encoder on `frames` frames of the output size (each
/// frame perturbed in a moving band, so the encoder has something to do), including the
/// finish (flush and MP4 trailer) spread over the frames.
fn bench_encoder(
    kind: EncoderKind,
    width: u32,
    height: u32,
    base: &[u8],
    frames: usize,
    scratch: &Path,
) -> Result<f64> {
    let tmp = scratch.join("encoder.mp4");
    let mut frame = base.to_vec();
    let len = frame.len();
    let band = 4096.min(len / 2);
    let t = Instant::now();
    let result = (|| {
        let mut w =
            cadence_media::VideoWriter::create(&tmp, width, height, cadence_media::FrameRate::whole(25), kind, None)?;
        for i in 0..frames {
            let start = (i * 4099) % (len / 2 - band + 1);
            for b in frame[start..start + band].iter_mut() {
                *b = b.wrapping_add(37);
            }
            w.push_nv12(&frame)?;
        }
        w.finish()?;
        Ok(t.elapsed().as_secs_f64() * 1e3 / frames as f64)
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duty_cycle_labels_are_the_sources() {
        assert_eq!(duty_cycle_label(1.0), "100%");
        assert_eq!(duty_cycle_label(0.5), "50%");
        assert_eq!(duty_cycle_label(1.0 / 3.0), "33.3%");
    }

    #[test]
    fn image_infill_decodes_the_evaluated_keyframes_only() {
        // Six frames, 3 and 4 deep in silence; keyframe 4 is bypassed, so the UNet runs on 0, 2, 5.
        let (keys, bypassed) = ([0, 2, 4, 5], [false, false, false, true, true, false]);
        let latent = RenderCounts::from_schedule(&keys, &bypassed, MuseTalkInfill::Latent).unwrap();
        assert_eq!(latent, RenderCounts { frames: 6, unet_evaluations: 3, decoded_frames: 4 });
        let image = RenderCounts::from_schedule(&keys, &bypassed, MuseTalkInfill::Image).unwrap();
        assert_eq!(image, RenderCounts { frames: 6, unet_evaluations: 3, decoded_frames: 3 });
        // Dense speech at stride 3 over 10 frames (keyframes 0, 3, 6, 9): 4 decoded instead of 10.
        let dense = RenderCounts::from_schedule(&[0, 3, 6, 9], &[false; 10], MuseTalkInfill::Image).unwrap();
        assert_eq!(dense, RenderCounts { frames: 10, unet_evaluations: 4, decoded_frames: 4 });
        assert!(RenderCounts::from_schedule(&[0, 6], &[false; 6], MuseTalkInfill::Image).is_err());
        // Fewer decoder runs, so a shorter projection with the same costs and expansion.
        let c = ComponentCosts {
            unet_ms_per_frame: 10.0,
            decoder_ms_per_frame: 5.0,
            composite_nv12_ms_per_frame: 1.0,
            encoder_ms_per_frame: 0.0,
            fixed_ms_per_render: 0.0,
            loop_threads: 1,
        };
        assert_eq!(projected_render_ms(&c, &latent, 0.0) - projected_render_ms(&c, &image, 0.0), 5.0);
    }

    #[test]
    fn crop_values_lie_in_the_decoders_range() {
        let data = crate::measure::fixtures::test_data(4096, 3);
        for (range, lo, hi) in [(RgbRange::Unit, 0.0, 1.0), (RgbRange::Signed, -1.0, 1.0)] {
            let v: Vec<f32> = data.iter().map(|&x| crop_value(range, x)).collect();
            assert!(v.iter().all(|&x| (lo..=hi).contains(&x)), "{range:?}");
            assert!(v.iter().filter(|&&x| x > lo && x < hi).count() > 4000, "{range:?}: mostly inside, not clamped");
        }
    }
}
