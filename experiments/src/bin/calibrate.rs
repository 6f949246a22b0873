//! Hardware calibration as the source's `/calibrate` does it: measure each component's
//! throughput (UNet, decoder, SLERP expansion, compositing + NV12, video encoder, and the
//! once-per-render audio encoder + avatar preparation), project frames/s per stride from them,
//! then render the same clip at each stride through the real pipeline and report measured
//! against projected, with the error, per stage as well as in total.
//!
//! The projection: the stages run one after another on the CPU path, so the frame loop of a
//! render takes UNet ms x evaluations + decoder ms x decoded frames + (compositing + encoder) ms
//! x frames + expansion ([`experiments::metrics::projected_render_ms`]); `projected_fps` is the
//! frame loop's throughput (what the source's projections describe), `*_end_to_end` adds the
//! once-per-render audio encoder + avatar preparation.
//! The evaluation counts come from the keyframe schedule and the clip's voice activity before
//! rendering (silence far enough from speech bypasses the UNet and the decoder). The source does
//! not say how it projects; its example numbers (UNet 472.7 fps, TAESD 2216.8 fps -> 351.6,
//! 510.0, 620.0 fps at strides 1, 2, 3) match no serial or pipelined model of those two
//! throughputs alone (serial gives 389.6, 662.8, 864.9), so its exact formula cannot be
//! reproduced; the JSON keeps its shape.
//!
//! Writes `calibrate.json` (the source's shape: `benchmarks.musetalk.{unet, taesd,
//! stride_projections.stride_k}`, extended with the measurements and a `provenance` block) and
//! `calibrate.csv` (one row per stride, with provenance lines).

use anyhow::{ensure, Context, Result};
use cadence::output::{OutputPath, Overwrite};
use cadence::render::{self, Output};
use cadence::schedule::speech_distance;
use cadence::{KeyframeSchedule, RgbRange};
use cadence_engines::bench::{bench_decoder, bench_keyframe};
use cadence_engines::Engine;
use clap::Parser;
use experiments::metrics::{self, ComponentCosts, RenderCounts};
use experiments::session::{Session, SessionArgs};
use experiments::OutDir;
use std::time::Instant;

/// Frames rendered when `--frames` is not given: 2 s of the clip, so the default run (component
/// benchmarks plus one render per stride) takes a few minutes on two CPU cores.
const DEFAULT_FRAMES: usize = 50;

#[derive(Parser)]
#[command(
    about = "Measure component throughputs, project frames/s per stride, then render and compare measured with projected",
    mut_arg("frames", |a| a.help("Frames of the validating renders, at 25 fps [default: 50]"))
)]
struct Args {
    #[arg(long, default_value = "1,2,3", value_delimiter = ',')]
    strides: Vec<usize>,
    /// Timed runs per component benchmark (median reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Frames the encoder benchmark encodes.
    #[arg(long, default_value_t = 25)]
    encoder_frames: usize,
    #[command(flatten)]
    session: SessionArgs,
    #[command(flatten)]
    out: OutDir,
}

/// One row of calibrate.csv. `*_ms` are per render (all frames), projected and measured.
#[derive(serde::Serialize)]
struct Row {
    stride: usize,
    frames: usize,
    keyframes: usize,
    unet_evaluations: usize,
    decoded_frames: usize,
    bypassed_frames: usize,
    unet_duty_cycle_pct: f64,
    /// Frame loop (render::render_clip: UNet, expansion, easing, decoder, compositing, encoder), the
    /// steady-state throughput the source's projections describe.
    projected_fps: f64,
    measured_fps: f64,
    /// 100 (projected - measured) / measured: positive = the projection is optimistic.
    error_pct: f64,
    /// The frame-loop projection if every frame were speech (no bypass), as the source assumes.
    projected_fps_no_bypass: f64,
    /// End to end: the frame loop plus the once-per-render preparation (audio encoder, avatar).
    projected_fps_end_to_end: f64,
    measured_fps_end_to_end: f64,
    error_pct_end_to_end: f64,
    /// Frame loop time of the whole render.
    projected_ms: f64,
    measured_ms: f64,
    projected_unet_ms: f64,
    measured_unet_ms: f64,
    projected_decoder_ms: f64,
    measured_decoder_ms: f64,
    projected_expand_ms: f64,
    measured_expand_ms: f64,
    projected_composite_nv12_ms: f64,
    measured_composite_nv12_ms: f64,
    projected_encoder_ms: f64,
    measured_encoder_ms: f64,
    /// Audio encoder + avatar preparation (render::prepare).
    projected_prepare_ms: f64,
    measured_prepare_ms: f64,
    /// Easing and bookkeeping: measured, not projected (no component benchmark).
    measured_other_ms: f64,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("calibrate: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(mut a: Args) -> Result<()> {
    ensure!(a.runs > 0, "--runs must be at least 1");
    ensure!(!a.strides.is_empty() && a.strides.iter().all(|&k| k > 0), "--strides must be positive integers");
    ensure!(a.encoder_frames > 0, "--encoder-frames must be at least 1");
    let t_run = Instant::now();
    let load_before = experiments::provenance::load_average();
    a.session.frames = Some(a.session.frames.unwrap_or(DEFAULT_FRAMES));
    let out_dir = a.out.dir()?;
    eprintln!("calibrate: loading engines and inputs ...");
    let session = Session::open(&a.session)?;
    let Session { backend, engines, opts, audio, img, face, encoder, .. } = &session;

    // 1. Component throughputs.
    let bar = experiments::progress::progress_bar(6, "calibrate: components");
    bar.set_message("UNet");
    let unet = bench_keyframe(&engines.unet, opts.batch, a.runs)?;
    bar.inc(1);
    bar.set_message("decoder");
    let dec = bench_decoder(engines.decoder.as_ref(), opts.batch, a.runs)?;
    bar.inc(1);
    bar.set_message("audio encoder + avatar");
    let t = Instant::now();
    let prepared = render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
    let prepare_ms = t.elapsed().as_secs_f64() * 1e3;
    let n = prepared.frames;
    bar.inc(1);
    bar.set_message("keyframe expansion");
    let mut expand_ms = Vec::new();
    for &k in &a.strides {
        let ms = if k > 1 {
            cadence::bench::bench_expand::<f32>(backend, n, k, cadence::pipeline::LATENT_DIM, opts.method, 11)?
                .median_ms
        } else {
            0.0 // stride 1: every frame is a keyframe; the copy is part of "other"
        };
        expand_ms.push(ms);
    }
    bar.inc(1);
    bar.set_message("composite + NV12");
    let crop = cadence::fixtures::test_data(3 * cadence::pipeline::FACE_SIDE * cadence::pipeline::FACE_SIDE, 5)
        .iter()
        .map(|x| (0.5 + 0.2 * x).clamp(0.0, 1.0))
        .collect::<Vec<f32>>();
    let mut frame = vec![0u8; prepared.compositors[0].frame_bytes()];
    let comp_ms = cadence::bench::median(&cadence::bench::time_host(2, 9, || {
        prepared.compositors[0].compose(
            &crop,
            cadence::pipeline::FACE_SIDE,
            cadence::pipeline::FACE_SIDE,
            RgbRange::Unit,
            &mut frame,
        )
    }));
    bar.inc(1);
    bar.set_message("video encoder");
    let enc_ms = match encoder {
        Some(e) => bench_encoder(*e, img.width(), img.height(), &frame, a.encoder_frames)?,
        None => 0.0,
    };
    bar.inc(1);
    bar.finish_and_clear();

    let costs = ComponentCosts {
        unet_ms_per_frame: 1e3 / unet.frames_per_s,
        decoder_ms_per_frame: 1e3 / dec.frames_per_s,
        composite_nv12_ms_per_frame: comp_ms,
        encoder_ms_per_frame: enc_ms,
        fixed_ms_per_render: 0.0, // the frame loop; the preparation is added for end to end
    };

    // 2. Projection per stride, then 3. a real render per stride.
    let bypassed = metrics::bypassed_frames(&speech_distance(&prepared.speech), opts.ramp);
    let scratch = std::env::temp_dir().join(format!("cadence-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    let bar = experiments::progress::progress_bar((n * a.strides.len()) as u64, "calibrate: renders");
    let mut rows = Vec::new();
    let mut projections = serde_json::Map::new();
    let mut count_mismatch = Vec::new();
    for (&k, &exp_ms) in a.strides.iter().zip(&expand_ms) {
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        let counts = RenderCounts::from_schedule(schedule.keyframes(), &bypassed)?;
        let projected_ms = metrics::projected_render_ms(&costs, &counts, exp_ms); // frame loop
        let dense = RenderCounts::without_bypass(n, schedule.count());
        let projected_no_bypass = metrics::fps(n, metrics::projected_render_ms(&costs, &dense, exp_ms));

        bar.set_message(format!("stride {k}: audio encoder + avatar"));
        let t = Instant::now();
        let prep = render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
        let measured_prepare_ms = t.elapsed().as_secs_f64() * 1e3;
        bar.set_message(format!("stride {k}: {} keyframes", schedule.count()));
        let out = OutputPath::check(&scratch.join(format!("stride_{k}.mp4")), Overwrite::Replace, &[])?;
        let output = match encoder {
            Some(e) => Output::Mp4 { out: &out, encoder: *e },
            None => Output::Discard,
        };
        let r = render::render_clip(engines, backend, opts, &prep, &schedule, output, |d| bar.inc(d as u64))
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
        let projected = metrics::fps(n, projected_ms);
        let measured = metrics::fps(n, measured_ms);
        let err = metrics::projection_error_pct(projected, measured);
        let projected_e2e = metrics::fps(n, projected_ms + prepare_ms);
        let measured_e2e = metrics::fps(n, measured_e2e_ms);
        let err_e2e = metrics::projection_error_pct(projected_e2e, measured_e2e);
        let duty = schedule.duty_cycle();
        rows.push(Row {
            stride: k,
            frames: n,
            keyframes: schedule.count(),
            unet_evaluations: counts.unet_evaluations,
            decoded_frames: counts.decoded_frames,
            bypassed_frames: s.bypassed_frames,
            unet_duty_cycle_pct: 100.0 * duty,
            projected_fps: projected,
            measured_fps: measured,
            error_pct: err,
            projected_fps_no_bypass: projected_no_bypass,
            projected_fps_end_to_end: projected_e2e,
            measured_fps_end_to_end: measured_e2e,
            error_pct_end_to_end: err_e2e,
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
        });
        let skipped = 100.0 * (1.0 - duty);
        let description = if k == 1 {
            format!(
                "Dense baseline: UNet on every frame ({} evaluated, {} bypassed as silence)",
                counts.unet_evaluations,
                n - counts.unet_evaluations
            )
        } else {
            format!(
                "Stride {k} cadence, {} infill: UNet on {} of {n} frames ({}% skipped), {} evaluated after silence bypass",
                format!("{:?}", opts.method).to_uppercase(),
                schedule.count(),
                metrics::duty_cycle_label(skipped / 100.0).trim_end_matches('%'),
                counts.unet_evaluations
            )
        };
        projections.insert(
            format!("stride_{k}"),
            serde_json::json!({
                "stride": k,
                "projected_fps": projected,
                "unet_duty_cycle": metrics::duty_cycle_label(duty),
                "description": description,
                "measured_fps": measured,
                "error_pct": err,
                "projected_fps_no_bypass": projected_no_bypass,
                "projected_fps_end_to_end": projected_e2e,
                "measured_fps_end_to_end": measured_e2e,
                "error_pct_end_to_end": err_e2e,
                "unet_evaluations": counts.unet_evaluations,
                "decoded_frames": counts.decoded_frames,
                "frames": n,
            }),
        );
    }
    bar.finish_and_clear();
    let _ = std::fs::remove_dir(&scratch);

    let mut prov = session.provenance();
    prov.note(
        "projection",
        "serial stages: frame loop = UNet ms x evaluations + decoder ms x decoded frames + (composite/NV12 + encoder) ms x frames + expansion; end to end adds prepare (audio encoder + avatar, once per render); evaluation counts from the schedule and voice activity (silence bypass) before rendering; measured = wall time of render::render_clip (MP4 to a temporary file, finish included) and of render::prepare; easing and bookkeeping are not projected",
    );
    prov.note(
        "components",
        format!(
            "UNet {:.3} frames/s (batch {}, median of {}), {} {:.3} frames/s (batch {}), composite+NV12 {comp_ms:.3} ms/frame, encoder {} {enc_ms:.3} ms/frame ({} frames), prepare {prepare_ms:.1} ms/render, expansion {:?} ms/render",
            unet.frames_per_s,
            opts.batch,
            a.runs,
            engines.decoder.model(),
            dec.frames_per_s,
            opts.batch,
            encoder.map(|e| e.to_string()).unwrap_or_else(|| "none".into()),
            a.encoder_frames,
            expand_ms
        ),
    );
    if !count_mismatch.is_empty() {
        prov.note("count_mismatch", count_mismatch.join("; "));
    }
    prov.note(
        "load_average",
        format!(
            "{load_before} at start, {} at end (1/5/15 min; the machine is shared with other builds, so timings are noisy)",
            experiments::provenance::load_average()
        ),
    );
    prov.note("runtime", format!("{:.1} s", t_run.elapsed().as_secs_f64()));

    let decoder_key = match engines.decoder.model() {
        cadence_engines::ModelKind::TaesdDecoder => "taesd".to_string(),
        m => m.to_string().replace('-', "_"),
    };
    let mut musetalk = serde_json::Map::new();
    musetalk.insert(
        "unet".into(),
        serde_json::json!({
            "engine": format!("{}, f32, batch {}", engines.unet.describe(), opts.batch),
            "throughput_fps": unet.frames_per_s,
            "weights": engines.unet.weights_label(),
        }),
    );
    musetalk.insert(
        decoder_key,
        serde_json::json!({
            "engine": format!("{}, f32, batch {}", engines.decoder.describe(), opts.batch),
            "throughput_fps": dec.frames_per_s,
            "weights": engines.decoder.weights_label(),
        }),
    );
    musetalk.insert(
        "components".into(),
        serde_json::json!({
            "expansion_ms_per_render": a.strides.iter().zip(&expand_ms).map(|(k, m)| (format!("stride_{k}"), serde_json::json!(m))).collect::<serde_json::Map<_, _>>(),
            "composite_nv12_ms_per_frame": comp_ms,
            "encoder": encoder.map(|e| e.to_string()).unwrap_or_else(|| "none".into()),
            "encoder_ms_per_frame": enc_ms,
            "prepare_ms_per_render": prepare_ms,
            "audio_encoder_ms_per_render": prepared.audio_encoder_ms,
            "avatar_encoder_ms_per_render": prepared.avatar_encoder_ms,
            "compositor_setup_ms_per_render": prepared.compositor_setup_ms,
        }),
    );
    musetalk.insert("stride_projections".into(), serde_json::Value::Object(projections));
    let json = serde_json::json!({
        "benchmarks": { "musetalk": musetalk },
        "provenance": prov.pairs().into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect::<serde_json::Map<_, _>>(),
    });
    let json_path = out_dir.join("calibrate.json");
    cadence::output::write_atomically(&json_path, |w| {
        use std::io::Write;
        serde_json::to_writer_pretty(&mut *w, &json)?;
        w.write_all(b"\n")?;
        Ok(())
    })?;
    let csv_path = out_dir.join("calibrate.csv");
    experiments::write_csv(&csv_path, &prov, &rows)?;

    println!(
        "components: UNet {:.2} frames/s, {} {:.2} frames/s, composite+NV12 {comp_ms:.2} ms/frame, encoder {enc_ms:.2} ms/frame, prepare {prepare_ms:.0} ms/render",
        unet.frames_per_s,
        engines.decoder.model(),
        dec.frames_per_s
    );
    println!(
        "{:<7} {:>7} {:>11} {:>14} {:>13} {:>8} {:>15} {:>14} {:>9}",
        "stride",
        "duty",
        "UNet evals",
        "projected fps",
        "measured fps",
        "error",
        "proj. fps e2e",
        "meas. fps e2e",
        "err e2e"
    );
    for r in &rows {
        println!(
            "{:<7} {:>6.1}% {:>11} {:>14.3} {:>13.3} {:>7.1}% {:>15.3} {:>14.3} {:>8.1}%",
            r.stride,
            r.unet_duty_cycle_pct,
            r.unet_evaluations,
            r.projected_fps,
            r.measured_fps,
            r.error_pct,
            r.projected_fps_end_to_end,
            r.measured_fps_end_to_end,
            r.error_pct_end_to_end
        );
    }
    for m in &count_mismatch {
        println!("warning: {m}");
    }
    println!(
        "backend {} | engines on {} | profile {} | weights {} | load average {}",
        prov.backend, session.engine_device, prov.engine_profile, prov.weights, load_before
    );
    println!("wrote {} and {} ({:.0} s)", json_path.display(), csv_path.display(), t_run.elapsed().as_secs_f64());
    Ok(())
}

/// Milliseconds per frame of the video encoder on `frames` frames of the output size (each
/// frame perturbed in a moving band, so the encoder has something to do), including the
/// finish (flush and MP4 trailer) spread over the frames.
fn bench_encoder(kind: cadence_media::EncoderKind, width: u32, height: u32, base: &[u8], frames: usize) -> Result<f64> {
    let tmp = std::env::temp_dir().join(format!("cadence-calibrate-encoder-{}.mp4", std::process::id()));
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
