//! Hardware calibration as the source's `/calibrate` does it: measure each component's
//! throughput, project frames/s per stride from them, then render at each stride and report
//! measured against projected. Writes results/calibrate.json (the source's shape, extended with
//! the measurements) and results/calibrate.csv.

use anyhow::{ensure, Result};
use cadence::render::{self, Output};
use cadence::{KeyframeSchedule, RgbRange};
use cadence_engines::bench::{bench_decoder, bench_keyframe};
use clap::Parser;
use experiments::session::{Session, SessionArgs};
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Measure component throughputs, project frames/s per stride, then render and compare measured with projected")]
struct Args {
    #[arg(long, default_value = "1,2,3", value_delimiter = ',')]
    strides: Vec<usize>,
    /// Timed runs per component benchmark (median reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[command(flatten)]
    session: SessionArgs,
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(serde::Serialize)]
struct Row {
    stride: usize,
    unet_duty_cycle_pct: f64,
    projected_fps: f64,
    measured_fps: f64,
    error_pct: f64,
    bypassed_frames: usize,
}

fn main() -> Result<()> {
    let mut a = Args::parse();
    ensure!(a.runs > 0 && !a.strides.is_empty() && a.strides.iter().all(|&k| k > 0), "--runs and --strides must be positive");
    if a.session.frames.is_none() {
        a.session.frames = Some(200); // 8 s: enough to measure, short enough for a CPU
    }
    let session = Session::open(&a.session)?;
    let Session { backend, engines, opts, audio, img, face, encoder, .. } = &session;
    let out_dir = match &a.out {
        Some(d) => experiments::paths::ensure_dir(d)?,
        None => experiments::paths::results_dir()?,
    };
    let bar = experiments::progress::progress_bar(6, "calibrate");

    // Component throughputs.
    bar.set_message("UNet");
    let unet = bench_keyframe(&engines.unet, opts.batch, a.runs)?;
    bar.inc(1);
    bar.set_message("decoder");
    let dec = bench_decoder(engines.decoder.as_ref(), opts.batch, a.runs)?;
    bar.inc(1);
    bar.set_message("audio encoder + avatar");
    let prepared = render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
    let n = prepared.frames;
    let audio_per_frame_ms = prepared.audio_encoder_ms / n as f64;
    let fixed_ms = prepared.avatar_ms;
    bar.inc(1);
    bar.set_message("SLERP expansion");
    let slerp_ms_per_frame = a.strides.iter().filter(|&&k| k > 1).map(|&k| {
        cadence::bench::bench_expand::<f32>(backend, n, k, cadence::pipeline::LATENT_DIM, cadence::Method::Slerp, 11).map(|b| b.median_ms / n as f64)
    }).collect::<Result<Vec<_>>>()?.into_iter().fold(0.0, f64::max);
    bar.inc(1);
    bar.set_message("composite + NV12");
    let crop = cadence::bench::test_data(3 * 256 * 256, 5).iter().map(|x| 0.5 + 0.2 * x).collect::<Vec<f32>>();
    let mut frame = vec![0u8; prepared.compositor.frame_bytes()];
    let comp = cadence::bench::median(&cadence::bench::time_host(2, 9, || prepared.compositor.compose(&crop, 256, 256, RgbRange::Unit, &mut frame)));
    bar.inc(1);
    bar.set_message("encoder");
    let enc_ms = match encoder {
        Some(e) => {
            let tmp = tempfile_path("calibrate_encoder.mp4");
            let mut w = cadence_media::VideoWriter::create(&tmp, img.width(), img.height(), 25, *e, None)?;
            let frames = 25;
            let t = Instant::now();
            let len = frame.len();
            for i in 0..frames {
                // Frames must differ or the encoder has nothing to do: perturb a band of luma.
                for b in frame[(i * 4099) % (len / 2)..][..4096].iter_mut() {
                    *b = b.wrapping_add(37);
                }
                w.push_nv12(&frame)?;
            }
            w.finish()?;
            let _ = std::fs::remove_file(&tmp);
            t.elapsed().as_secs_f64() * 1e3 / frames as f64
        }
        None => 0.0,
    };
    bar.inc(1);
    bar.finish_and_clear();

    let unet_ms = 1e3 / unet.frames_per_s;
    let dec_ms = 1e3 / dec.frames_per_s;
    let mut rows = Vec::new();
    let mut projections = serde_json::Map::new();
    for &k in &a.strides {
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        let duty = schedule.duty_cycle();
        // Per frame: duty x UNet + decoder + audio + (SLERP if k > 1) + compositing + encoder,
        // plus the once-per-render avatar work spread over the frames. No silence bypass.
        let per_frame = duty * unet_ms + dec_ms + audio_per_frame_ms + if k > 1 { slerp_ms_per_frame } else { 0.0 } + comp + enc_ms + fixed_ms / n as f64;
        let projected = 1e3 / per_frame;
        eprintln!("calibrate: rendering {n} frames at stride {k} ...");
        let t = Instant::now();
        let prepared = render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
        let tmp = tempfile_path(&format!("calibrate_stride_{k}.mp4"));
        let _ = std::fs::remove_file(&tmp);
        let output = match encoder {
            Some(e) => Output::Mp4 { path: &tmp, encoder: *e },
            None => Output::Discard,
        };
        let r = render::run(engines, backend, opts, &prepared, &schedule, output, |_| {})?;
        let _ = std::fs::remove_file(&tmp);
        let measured = n as f64 / t.elapsed().as_secs_f64();
        let err = 100.0 * (projected - measured) / measured;
        rows.push(Row { stride: k, unet_duty_cycle_pct: 100.0 * duty, projected_fps: projected, measured_fps: measured, error_pct: err, bypassed_frames: r.stats.bypassed_frames });
        projections.insert(
            format!("stride_{k}"),
            serde_json::json!({
                "stride": k,
                "projected_fps": projected,
                "measured_fps": measured,
                "error_pct": err,
                "unet_duty_cycle": format!("{:.1}%", 100.0 * duty),
                "description": format!("stride {k}: UNet on {} of {n} frames, SLERP infill between", schedule.count()),
            }),
        );
    }
    let prov = session.provenance();
    let json = serde_json::json!({
        "benchmarks": { "musetalk": {
            "unet": { "engine": format!("candle MuseTalk UNet ({}, batch {})", engines.profile, opts.batch), "throughput_fps": unet.frames_per_s },
            "decoder": { "model": engines.decoder.model().to_string(), "engine": format!("candle {} ({}, batch {})", engines.decoder.model(), engines.profile, opts.batch), "throughput_fps": dec.frames_per_s },
            "audio_encoder_ms_per_frame": audio_per_frame_ms,
            "slerp_ms_per_frame": slerp_ms_per_frame,
            "composite_nv12_ms_per_frame": comp,
            "encoder_ms_per_frame": enc_ms,
            "stride_projections": projections,
        }},
        "provenance": { "commit": prov.commit, "date_utc": prov.date_utc, "hardware": prov.hardware, "backend": prov.backend, "engine_profile": prov.engine_profile, "weights": prov.weights, "frames": n },
    });
    println!("{}", serde_json::to_string_pretty(&json)?);
    cadence::npy::write_atomically(&out_dir.join("calibrate.json"), |w| Ok(serde_json::to_writer_pretty(w, &json)?))?;
    experiments::csvout::write_csv(&out_dir.join("calibrate.csv"), &prov, &rows)?;
    println!("{:<8} {:>10} {:>14} {:>14} {:>10}", "stride", "duty", "projected fps", "measured fps", "error");
    for r in &rows {
        println!("{:<8} {:>9.1}% {:>14.2} {:>14.2} {:>9.1}%", r.stride, r.unet_duty_cycle_pct, r.projected_fps, r.measured_fps, r.error_pct);
    }
    Ok(())
}

fn tempfile_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("cadence-{}-{name}", std::process::id()))
}
