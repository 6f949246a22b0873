//! The source document's stride table (section 4.1), measured: renders the same clip through
//! the real pipeline (audio encoder, UNet on keyframes, one-launch SLERP expansion, Hermite
//! easing, decoder, compositing + NV12, H.264) at each stride and reports every row of the table.
//! Writes results/stride_table.csv (with provenance) and a frames/s plot.

use anyhow::{ensure, Context, Result};
use cadence::args::EngineFamily;
use cadence::ditto::{self, DittoEngines, DittoInfill};
use cadence::frame_loop::report::{RenderReport, RenderSetup};
use cadence::frame_loop::video::Output;
use cadence::io::output::{OutputPath, Overwrite};
use cadence::{Backend, KeyframeSchedule};
use cadence_engines::Engine;
use clap::Parser;
use experiments::plot::{bar_plot, BarChart};
use experiments::provenance::Provenance;
use experiments::session::{Inputs, Session, SessionArgs};

#[derive(Parser)]
#[command(
    about = "Reproduce the stride table: render one clip at each stride through the real pipeline and measure every row"
)]
struct Args {
    /// Strides to measure.
    #[arg(long, default_value = "1,2,3", value_delimiter = ',')]
    strides: Vec<usize>,
    #[command(flatten)]
    session: SessionArgs,
    #[command(flatten)]
    out: experiments::OutDir,
    /// The engine family: musetalk writes results/stride_table.csv, ditto
    /// results/stride_table_ditto.csv (docs/ditto.md).
    #[arg(long, value_enum, default_value = "musetalk")]
    engine: EngineFamily,
    /// Ditto: the infills to measure at each stride above 1 (stride 1 has no frames between
    /// keyframes and is measured once).
    #[arg(long, value_enum, default_value = "feature,image,motion", value_delimiter = ',')]
    ditto_infill: Vec<DittoInfill>,
    /// Ditto: DDIM steps of the motion diffusion.
    #[arg(long, default_value_t = ditto::DEFAULT_STEPS)]
    ditto_steps: usize,
    /// Renders of every row, in turns (all rows once, then again): each row reports its median
    /// round by end-to-end time, and every round's time in `end_to_end_rounds_ms`. On a shared
    /// machine whose speed drifts, a single pass in row order biases the ratios between rows.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
}

#[derive(serde::Serialize, Default)]
struct Row {
    stride: usize,
    engine: String,
    infill: String,
    frames: usize,
    keyframes: usize,
    unet_evaluations: usize,
    bypassed_frames: usize,
    unet_duty_cycle_pct: f64,
    unet_engine: String,
    decoder_engine: String,
    precision: String,
    slerp_infill_ms: f64,
    easing_ms: f64,
    audio_encoder_ms: f64,
    avatar_encoder_ms: f64,
    unet_ms: f64,
    decoder_ms: f64,
    compositor_setup_ms: f64,
    pure_neural_ms: f64,
    neural_fps: f64,
    neural_rtf: f64,
    composite_nv12_ms: f64,
    /// Voice activity of the whole clip (`--vad`, Silero by default).
    vad_ms: f64,
    other_ms: f64,
    outside_neural_pct: f64,
    encoder: String,
    encoder_ms: f64,
    encoder_thread_ms: f64,
    end_to_end_ms: f64,
    end_to_end_fps: f64,
    end_to_end_rtf: f64,
    /// Every round's end-to-end time (`--rounds`), in the order they ran.
    end_to_end_rounds_ms: String,
}

fn main() -> Result<()> {
    let a = Args::parse();
    ensure!(!a.strides.is_empty() && a.strides.iter().all(|&k| k > 0), "--strides must be positive integers");
    let out_dir = a.out.dir()?;
    if a.engine == EngineFamily::Ditto {
        return ditto_table(&a, &out_dir);
    }
    eprintln!("stride_table: loading engines and inputs ...");
    let session = Session::open(&a.session)?;
    let Session { inputs: Inputs { backend, opts, audio, img, face, encoder, .. }, engines } = &session;
    let scratch = experiments::paths::workspace_root().join("target/stride_table");
    std::fs::create_dir_all(&scratch)?;

    let mut total_bar_len = 0u64;
    let bar = experiments::progress::progress_bar(0, "stride_table");
    let rows = in_rounds(&a.strides, a.rounds, |&k| {
        bar.set_message(format!("stride {k}: audio encoder + avatar"));
        let prepared = cadence::musetalk::render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
        let n = prepared.frames;
        total_bar_len += n as u64;
        bar.set_length(total_bar_len);
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        bar.set_message(format!("stride {k}: {} keyframes", schedule.count()));
        let out = OutputPath::check(&scratch.join(format!("stride_{k}.mp4")), Overwrite::Replace, &[])?;
        let output = match encoder {
            Some(e) => Output::Mp4 { out: &out, encoder: *e },
            None => Output::Discard,
        };
        let r = cadence::musetalk::render::render_clip(engines, backend, opts, &prepared, &schedule, output, |d| {
            bar.inc(d as u64)
        })
        .with_context(|| format!("render at stride {k}"))?;
        let setup = RenderSetup::new(backend, &session.engine_device, engines);
        let rep = RenderReport::new(setup, &prepared, &r.stats, r.video.as_ref(), opts.fps, 0.0);
        let names = Names {
            engine: "musetalk",
            infill: "latent slerp".into(),
            keyframe_net: engines.unet.describe(),
            decoder: engines.decoder.describe(),
        };
        Ok(row(k, n, &rep, names, opts.fps.hz()))
    })?;
    bar.finish_and_clear();

    let mut prov = session.provenance();
    prov.note("rounds", a.rounds.to_string());
    write_outputs(&rows, &prov, &out_dir, "stride_table", &format!("{} profile, {}", engines.profile, backend.name()))
}

impl Row {
    /// The stride, with the infill where the engine has more than one (Ditto).
    fn label(&self) -> String {
        if self.engine == "ditto" && self.stride > 1 {
            format!("{} {}", self.stride, self.infill)
        } else {
            self.stride.to_string()
        }
    }
}

/// The names a row carries.
struct Names {
    engine: &'static str,
    infill: String,
    keyframe_net: String,
    decoder: String,
}

fn row(k: usize, n: usize, rep: &RenderReport, names: Names, fps: f64) -> Row {
    let st = &rep.stages_ms;
    Row {
        stride: k,
        engine: names.engine.into(),
        infill: names.infill,
        frames: n,
        keyframes: rep.keyframes_scheduled,
        unet_evaluations: rep.unet_evaluations,
        bypassed_frames: rep.bypassed_frames,
        unet_duty_cycle_pct: 100.0 * rep.keyframes_scheduled as f64 / n as f64,
        unet_engine: names.keyframe_net,
        decoder_engine: names.decoder,
        precision: "f32".into(),
        slerp_infill_ms: st.expand,
        easing_ms: st.ease,
        audio_encoder_ms: st.audio_encoder,
        avatar_encoder_ms: st.avatar_encoder,
        unet_ms: st.unet,
        decoder_ms: st.decoder,
        compositor_setup_ms: st.compositor_setup,
        pure_neural_ms: rep.neural_ms,
        neural_fps: rep.neural_fps,
        neural_rtf: rep.neural_fps / fps,
        composite_nv12_ms: st.composite_nv12,
        vad_ms: st.vad,
        other_ms: st.other,
        outside_neural_pct: rep.outside_neural_pct,
        encoder: rep.encoder.clone().unwrap_or_else(|| "none".into()),
        encoder_ms: st.encoder,
        encoder_thread_ms: st.encoder_busy,
        end_to_end_ms: rep.end_to_end_ms,
        end_to_end_fps: rep.render_fps,
        end_to_end_rtf: rep.realtime_factor,
        end_to_end_rounds_ms: format!("{:.0}", rep.end_to_end_ms),
    }
}

/// `rounds` renders of every run, in turns; per run the row of its median round by end-to-end
/// time (the lower middle one for an even count), with every round's time.
fn in_rounds<R>(runs: &[R], rounds: u32, mut render: impl FnMut(&R) -> Result<Row>) -> Result<Vec<Row>> {
    let mut all: Vec<Vec<Row>> = runs.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (run, rows) in runs.iter().zip(&mut all) {
            rows.push(render(run)?);
        }
    }
    Ok(all
        .into_iter()
        .map(|rows| {
            let times: Vec<String> = rows.iter().map(|r| format!("{:.0}", r.end_to_end_ms)).collect();
            let mut rows = rows;
            rows.sort_by(|a, b| a.end_to_end_ms.total_cmp(&b.end_to_end_ms));
            let mut median = rows.swap_remove((rows.len() - 1) / 2);
            median.end_to_end_rounds_ms = times.join(";");
            median
        })
        .collect())
}

/// `stride_table --engine ditto`: the same clip through Ditto's path (docs/ditto.md) at each
/// stride, into results/stride_table_ditto.csv.
fn ditto_table(a: &Args, out_dir: &std::path::Path) -> Result<()> {
    eprintln!("stride_table: loading Ditto's networks and the inputs ...");
    let inputs = Inputs::open(&a.session)?;
    ensure!(inputs.opts.fps.hz() == ditto::DITTO_FPS as f64, "Ditto renders at 25 frames per second");
    let engines = DittoEngines::load(inputs.profile, a.session.engines.models.as_deref())?;
    let avatar = ditto::prepare_avatar(&engines, &Backend::Cpu, &inputs.img, inputs.face)?;
    let scratch = experiments::paths::workspace_root().join("target/stride_table");
    std::fs::create_dir_all(&scratch)?;
    let ramp = inputs.opts.ramp;
    let bar = experiments::progress::progress_bar(0, "stride_table ditto");
    bar.set_message("HuBERT + motion diffusion");
    // The clip's motion does not depend on the schedule: made once, its time counted in every row
    // (each row is what one render of the clip costs).
    let clip_opts = ditto::ClipOptions { steps: a.ditto_steps, ramp, vad: inputs.opts.vad };
    let clip = ditto::prepare_clip(&engines, &avatar, inputs.audio.clone(), None, &clip_opts, &|_| {})?;
    let n = clip.frames;
    let runs: Vec<(usize, Option<DittoInfill>)> = a
        .strides
        .iter()
        .flat_map(|&k| {
            let infills: Vec<Option<DittoInfill>> =
                if k == 1 { vec![None] } else { a.ditto_infill.iter().map(|&i| Some(i)).collect() };
            infills.into_iter().map(move |i| (k, i))
        })
        .collect();
    bar.set_length((runs.len() * n) as u64 * a.rounds as u64);
    let rows = in_rounds(&runs, a.rounds, |&(k, infill)| {
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        let label = infill.map_or("none (dense)", |i| i.name());
        bar.set_message(format!("stride {k}, {label}: {} keyframes", schedule.count()));
        let out = OutputPath::check(
            &scratch.join(format!("ditto_stride_{k}_{}.mp4", infill.map_or("dense", |i| i.name()))),
            Overwrite::Replace,
            &[],
        )?;
        let output = match inputs.encoder {
            Some(e) => Output::Mp4 { out: &out, encoder: e },
            None => Output::Discard,
        };
        let r = ditto::render_clip(
            &engines,
            &avatar,
            &clip,
            &schedule,
            infill.unwrap_or(DittoInfill::Feature),
            inputs.opts.method,
            ramp,
            output,
            |d| bar.inc(d as u64),
        )
        .with_context(|| format!("Ditto render at stride {k}, infill {label}"))?;
        let rep = ditto::render_report(&engines, &avatar, (clip.audio_ms, clip.vad_ms), &inputs.engine_device, &r, 0.0);
        let names = Names {
            engine: "ditto",
            infill: label.into(),
            keyframe_net: "ditto warping network (cadence CPU kernels)".into(),
            decoder: "ditto SPADE decoder (cadence CPU kernels)".into(),
        };
        Ok(row(k, n, &rep, names, inputs.opts.fps.hz()))
    })?;
    bar.finish_and_clear();
    let mut prov = inputs.provenance(&engines.describe(), &engines.weights);
    prov.note("rounds", a.rounds.to_string());
    prov.note("ditto_infills", a.ditto_infill.iter().map(|i| i.name()).collect::<Vec<_>>().join(","));
    prov.note("ditto_ddim_steps", a.ditto_steps.to_string());
    prov.note(
        "ditto_weights_caveat",
        "synthetic weights measure the method's cost on this network, not a trained face",
    );
    write_outputs(&rows, &prov, out_dir, "stride_table_ditto", &format!("Ditto, {} profile, cpu", inputs.profile))
}

/// The CSV (`{name}.csv`), the frames/s plot (`{name}_fps`) and the printed table.
fn write_outputs(rows: &[Row], prov: &Provenance, out_dir: &std::path::Path, name: &str, what: &str) -> Result<()> {
    print_table(rows, prov);
    let csv = out_dir.join(format!("{name}.csv"));
    experiments::csvout::write_csv(&csv, prov, rows)?;
    let chart = BarChart {
        title: format!("Render frames/s per cadence stride ({what})"),
        x_label: "stride".into(),
        y_label: "frames per second".into(),
        categories: rows.iter().map(|r| format!("k={}", r.label())).collect(),
        series: vec![
            ("pure neural".into(), rows.iter().map(|r| r.neural_fps).collect()),
            ("end to end (incl. encoder)".into(), rows.iter().map(|r| r.end_to_end_fps).collect()),
        ],
        value_labels: true,
    };
    let plots = bar_plot(&out_dir.join(format!("{name}_fps")), &chart, prov)?;
    eprintln!("wrote {}, {}, {}", csv.display(), plots.png.display(), plots.svg.display());
    Ok(())
}

fn print_table(rows: &[Row], prov: &Provenance) {
    type Cell = dyn Fn(&Row) -> String;
    let lines: Vec<(&str, Box<Cell>)> = vec![
        ("Metric", Box::new(|r| format!("Stride {}", r.label()))),
        ("UNet keyframes scheduled", Box::new(|r| format!("{} / {}", r.keyframes, r.frames))),
        (
            "UNet evaluations (silence bypassed)",
            Box::new(|r| format!("{} ({} bypassed)", r.unet_evaluations, r.bypassed_frames)),
        ),
        ("UNet duty cycle", Box::new(|r| format!("{:.1}%", r.unet_duty_cycle_pct))),
        ("SLERP infill (total)", Box::new(|r| format!("{:.2} ms", r.slerp_infill_ms))),
        ("Pure neural time", Box::new(|r| format!("{:.1} ms", r.pure_neural_ms))),
        ("Pure neural throughput", Box::new(|r| format!("{:.1} FPS", r.neural_fps))),
        ("Neural real-time factor", Box::new(|r| format!("{:.2}x", r.neural_rtf))),
        ("Video encoder", Box::new(|r| r.encoder.clone())),
        (
            "Encoder time added (own time beside)",
            Box::new(|r| format!("{:.0} ({:.0}) ms", r.encoder_ms, r.encoder_thread_ms)),
        ),
        ("Outside neural engines (excl. enc.)", Box::new(|r| format!("{:.2}%", r.outside_neural_pct))),
        ("End-to-end render time", Box::new(|r| format!("{:.1} ms", r.end_to_end_ms))),
        ("End-to-end FPS", Box::new(|r| format!("{:.1} FPS", r.end_to_end_fps))),
        ("End-to-end real-time factor", Box::new(|r| format!("{:.2}x", r.end_to_end_rtf))),
    ];
    let cells: Vec<(&str, Vec<String>)> =
        lines.iter().map(|(name, f)| (*name, rows.iter().map(f.as_ref()).collect())).collect();
    let label_w = cells.iter().map(|(n, _)| n.len()).max().unwrap_or(0) + 2;
    let col_w = cells.iter().flat_map(|(_, v)| v.iter().map(|c| c.len())).max().unwrap_or(0) + 3;
    println!("\nCADENCE STRIDE TABLE ({} frames), {}", rows[0].frames, prov.hardware);
    for (name, values) in &cells {
        print!("{name:<label_w$}");
        values.iter().for_each(|v| print!("{v:>col_w$}"));
        println!();
    }
    println!(
        "UNet engine: {} | decoder: {} | precision {}",
        rows[0].unet_engine, rows[0].decoder_engine, rows[0].precision
    );
    println!(
        "backend {} | engines on {} | frames: {} | profile {} | weights {} | commit {}",
        prov.backend,
        prov.note_value(experiments::provenance::ENGINE_DEVICE_KEY).unwrap_or("unknown"),
        prov.note_value(experiments::provenance::FRAMES_KEPT_IN_KEY).unwrap_or("unknown"),
        prov.engine_profile,
        prov.weights,
        prov.commit
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds run in turns, and each run keeps its median round's row with every round's time.
    #[test]
    fn rounds_alternate_and_keep_the_median_row() {
        let mut order = Vec::new();
        let mut times = vec![50.0, 9.0, 70.0, 8.0, 60.0, 10.0].into_iter();
        let rows = in_rounds(&[1usize, 3], 3, |&k| {
            order.push(k);
            let e2e = times.next().unwrap();
            Ok(Row { stride: k, end_to_end_ms: e2e, encoder_ms: e2e / 10.0, ..Row::default() })
        })
        .unwrap();
        assert_eq!(order, [1, 3, 1, 3, 1, 3]);
        assert_eq!((rows[0].stride, rows[0].end_to_end_ms, rows[0].encoder_ms), (1, 60.0, 6.0));
        assert_eq!(rows[0].end_to_end_rounds_ms, "50;70;60");
        assert_eq!((rows[1].end_to_end_ms, rows[1].end_to_end_rounds_ms.as_str()), (9.0, "9;8;10"));
        // An even count keeps the lower middle round.
        let mut t = vec![4.0, 1.0, 3.0, 2.0].into_iter();
        let rows = in_rounds(&[1usize], 4, |_| Ok(Row { end_to_end_ms: t.next().unwrap(), ..Row::default() })).unwrap();
        assert_eq!(rows[0].end_to_end_ms, 2.0);
    }
}
