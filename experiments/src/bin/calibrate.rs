//! Hardware calibration as the source's `/calibrate` does it ([`cadence::measure::calibrate`], which the
//! server's `POST /calibrate` runs too): component throughputs, a projection per stride, and a
//! render per stride measured against it.
//!
//! Writes `calibrate.json` (the source's shape: `benchmarks.musetalk.{unet, taesd,
//! stride_projections.stride_k}`, extended with the measurements and a `provenance` block) and
//! `calibrate.csv` (one row per stride, with provenance lines).

use anyhow::{Context, Result};
use cadence::measure::calibrate::{calibrate, check_parameters, CalibrateSetup, Step};
use cadence::musetalk::MuseTalkInfill;
use clap::Parser;
use experiments::session::{Inputs, Session, SessionArgs};
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
    /// MuseTalk's infill to project and render: latent (the decoder on every frame not bypassed)
    /// or image (the decoder on the evaluated keyframes only).
    #[arg(long, value_enum, default_value = "latent")]
    infill: MuseTalkInfill,
    #[command(flatten)]
    session: SessionArgs,
    #[command(flatten)]
    out: OutDir,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("calibrate: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(mut a: Args) -> Result<()> {
    check_parameters(&a.strides, a.runs, a.encoder_frames)?;
    let t_run = Instant::now();
    let load_before = experiments::provenance::load_average();
    a.session.frames = Some(a.session.frames.unwrap_or(DEFAULT_FRAMES));
    let out_dir = a.out.dir()?;
    eprintln!("calibrate: loading engines and inputs ...");
    let session = Session::open(&a.session)?;
    let Session { inputs: Inputs { backend, opts, audio, img, face, encoder, .. }, engines } = &session;
    let opts = &cadence::frame_loop::RenderOptions { infill: a.infill, ..opts.clone() };
    let scratch = std::env::temp_dir().join(format!("cadence-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    let setup = CalibrateSetup {
        engines,
        backend,
        opts,
        audio,
        img,
        face: *face,
        encoder: *encoder,
        strides: &a.strides,
        runs: a.runs,
        encoder_frames: a.encoder_frames,
        scratch: &scratch,
    };
    let components = experiments::progress::progress_bar(6, "calibrate: components");
    let frames = a.session.frames.unwrap_or(DEFAULT_FRAMES);
    let renders = experiments::progress::progress_bar((frames * a.strides.len()) as u64, "calibrate: renders");
    let result = calibrate(&setup, &mut |step| match step {
        Step::Component(name) => {
            components.inc(1);
            components.set_message(name);
        }
        Step::Render { stride, keyframes } => {
            components.finish_and_clear();
            renders.set_message(format!("stride {stride}: {keyframes} keyframes"));
        }
        Step::Frames(n) => renders.inc(n as u64),
    });
    renders.finish_and_clear();
    let _ = std::fs::remove_dir_all(&scratch);
    let cal = result?;
    let (comp_ms, enc_ms, prepare_ms) =
        (cal.costs.composite_nv12_ms_per_frame, cal.costs.encoder_ms_per_frame, cal.prepare_ms);

    let mut prov = session.provenance();
    prov.note(
        "projection",
        "frame loop = UNet ms x evaluations + decoder ms x decoded frames + composite/NV12 ms x frames + expansion, plus encoder ms x frames shared over the loop's threads (the encoder runs beside the loop on a thread of its own), at least the encoder's own time; end to end adds prepare (audio encoder + avatar, once per render); evaluation counts from the schedule and voice activity (silence bypass) before rendering; measured = wall time of render::render_clip (MP4 to a temporary file, finish included) and of render::prepare; easing and bookkeeping are not projected",
    );
    prov.note(
        "components",
        format!(
            "UNet {:.3} frames/s (batch {}, median of {}), {} {:.3} frames/s (batch {}), composite+NV12 {comp_ms:.3} ms/frame, encoder {} {enc_ms:.3} ms/frame ({} frames), prepare {prepare_ms:.1} ms/render, expansion {:?} ms/render",
            cal.unet_fps,
            opts.batch,
            a.runs,
            engines.decoder.model(),
            cal.decoder_fps,
            opts.batch,
            encoder.map(|e| e.to_string()).unwrap_or_else(|| "none".into()),
            a.encoder_frames,
            cal.expand_ms
        ),
    );
    prov.note("infill", a.infill.name());
    if !cal.count_mismatch.is_empty() {
        prov.note("count_mismatch", cal.count_mismatch.join("; "));
    }
    prov.note(
        "load_average",
        format!(
            "{load_before} at start, {} at end (1/5/15 min; the machine is shared with other builds, so timings are noisy)",
            experiments::provenance::load_average()
        ),
    );
    prov.note("runtime", format!("{:.1} s", t_run.elapsed().as_secs_f64()));

    let json = serde_json::json!({
        "benchmarks": { "musetalk": cal.musetalk_json(engines) },
        "provenance": prov.pairs().into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect::<serde_json::Map<_, _>>(),
    });
    let json_path = out_dir.join("calibrate.json");
    cadence::io::output::write_atomically(&json_path, |w| {
        use std::io::Write;
        serde_json::to_writer_pretty(&mut *w, &json)?;
        w.write_all(b"\n")?;
        Ok(())
    })?;
    let csv_path = out_dir.join("calibrate.csv");
    experiments::write_csv(&csv_path, &prov, &cal.rows)?;

    println!(
        "components: UNet {:.2} frames/s, {} {:.2} frames/s, composite+NV12 {comp_ms:.2} ms/frame, encoder {enc_ms:.2} ms/frame, prepare {prepare_ms:.0} ms/render",
        cal.unet_fps,
        engines.decoder.model(),
        cal.decoder_fps
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
    for r in &cal.rows {
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
    for m in &cal.count_mismatch {
        println!("warning: {m}");
    }
    println!(
        "backend {} | engines on {} | profile {} | weights {} | load average {}",
        prov.backend, session.engine_device, prov.engine_profile, prov.weights, load_before
    );
    println!("wrote {} and {} ({:.0} s)", json_path.display(), csv_path.display(), t_run.elapsed().as_secs_f64());
    Ok(())
}
