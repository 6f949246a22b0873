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
use cadence::musetalk::MuseTalkInfill;
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
    /// MuseTalk: the infills to measure at each stride above 1 (stride 1 decodes every frame and
    /// is measured once, with latent infill). image decodes keyframes only (docs/infill.md).
    #[arg(long, value_enum, default_value = "latent,image", value_delimiter = ',')]
    infill: Vec<MuseTalkInfill>,
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
    /// MuseTalk: render in windows of this many seconds, as `cadence render --window` does (its
    /// default too): the video encoder works on one window's frames while the UNet works on the
    /// next. 0 renders the clip as one window (every keyframe through the UNet before the first
    /// frame reaches the encoder).
    #[arg(long, default_value_t = cadence::frame_loop::DEFAULT_WINDOW_SECONDS, value_parser = cadence::args::parse_window_seconds)]
    window: f64,
    /// MuseTalk at the reduced profile: skip the full-profile projection (which loads the
    /// published-size engines and times them once, about 40 s on 2 cores).
    #[arg(long)]
    no_projection: bool,
}

#[derive(serde::Serialize, Default, Clone)]
struct Row {
    stride: usize,
    engine: String,
    infill: String,
    frames: usize,
    keyframes: usize,
    unet_evaluations: usize,
    bypassed_frames: usize,
    decoded_frames: usize,
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
    /// CPU time of the render's threads in the neural stages (the encoder thread's left out):
    /// the same work the same time whatever runs beside it (empty where not measured: Ditto).
    audio_encoder_cpu_ms: Option<f64>,
    avatar_encoder_cpu_ms: Option<f64>,
    unet_cpu_ms: Option<f64>,
    decoder_cpu_ms: Option<f64>,
    neural_cpu_ms: Option<f64>,
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
    /// The first row's (stride 1's) time over this row's: wall neural, CPU neural, end to end.
    neural_gain: f64,
    neural_cpu_gain: Option<f64>,
    end_to_end_gain: f64,
    /// A projection, not a measurement: the same schedule at the full profile, from the full
    /// engines' per-frame times measured on this machine in the same run and this row's counts
    /// and non-neural times (`calibrate`'s model). Empty where not projected.
    full_projected_neural_ms: Option<f64>,
    full_projected_end_to_end_ms: Option<f64>,
    full_projected_neural_gain: Option<f64>,
    full_projected_end_to_end_gain: Option<f64>,
}

/// The full profile's engines timed once on this machine, per frame (what a projection needs).
struct FullCosts {
    unet_ms_per_frame: f64,
    decoder_ms_per_frame: f64,
    audio_ms_per_frame: f64,
    /// The avatar's preparation (crop, image encoder, rest latent): once per render.
    avatar_ms: f64,
}

impl FullCosts {
    fn measure(
        decoder: cadence::musetalk::DecoderKind,
        device: &cadence_engines::Device,
        img: &cadence_media::RgbImage,
        face: cadence::backend::composite::FaceBox,
    ) -> Result<FullCosts> {
        use cadence_engines::bench::{bench_audio, bench_decoder, bench_keyframe};
        let full = cadence::musetalk::Engines::load(cadence_engines::Profile::Full, decoder, device, None)?;
        let per_frame = |r: cadence_engines::bench::BenchResult| 1e3 / r.frames_per_s;
        let decode_batch = if decoder == cadence::musetalk::DecoderKind::SdVae { 2 } else { 8 };
        let t = std::time::Instant::now();
        let crop = cadence_media::crop_to_planar(img, &face, cadence::musetalk::FACE_SIDE as u32)?;
        cadence::musetalk::prepare_avatar(&full, &crop)?;
        let avatar_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(FullCosts {
            unet_ms_per_frame: per_frame(bench_keyframe(&full.unet, 8, 1)?),
            decoder_ms_per_frame: per_frame(bench_decoder(full.decoder.as_ref(), decode_batch, 1)?),
            audio_ms_per_frame: per_frame(bench_audio(&full.audio, 25.6, 1)?),
            avatar_ms,
        })
    }

    /// Fills `r`'s projection from its counts and its measured non-neural times.
    fn project(&self, r: &mut Row, loop_threads: usize) {
        use cadence::measure::calibrate::{projected_render_ms, ComponentCosts, RenderCounts};
        let n = r.frames as f64;
        let audio = self.audio_ms_per_frame * n;
        let costs = ComponentCosts {
            unet_ms_per_frame: self.unet_ms_per_frame,
            decoder_ms_per_frame: self.decoder_ms_per_frame,
            composite_nv12_ms_per_frame: r.composite_nv12_ms / n,
            encoder_ms_per_frame: r.encoder_thread_ms / n,
            fixed_ms_per_render: audio + self.avatar_ms + r.compositor_setup_ms + r.vad_ms,
            loop_threads,
        };
        let counts =
            RenderCounts { frames: r.frames, unet_evaluations: r.unet_evaluations, decoded_frames: r.decoded_frames };
        r.full_projected_neural_ms = Some(
            audio
                + self.avatar_ms
                + self.unet_ms_per_frame * r.unet_evaluations as f64
                + self.decoder_ms_per_frame * r.decoded_frames as f64,
        );
        r.full_projected_end_to_end_ms = Some(projected_render_ms(&costs, &counts, r.slerp_infill_ms + r.easing_ms));
    }
}

/// Each row's gains over the first row (the dense render when the strides start at 1).
fn set_gains(rows: &mut [Row]) {
    let Some(first) = rows.first() else { return };
    let (neural, cpu, e2e) = (first.pure_neural_ms, first.neural_cpu_ms, first.end_to_end_ms);
    let (full_neural, full_e2e) = (first.full_projected_neural_ms, first.full_projected_end_to_end_ms);
    let over = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    for r in rows {
        r.neural_gain = neural / r.pure_neural_ms;
        r.neural_cpu_gain = over(cpu, r.neural_cpu_ms);
        r.end_to_end_gain = e2e / r.end_to_end_ms;
        r.full_projected_neural_gain = over(full_neural, r.full_projected_neural_ms);
        r.full_projected_end_to_end_gain = over(full_e2e, r.full_projected_end_to_end_ms);
    }
}

fn main() -> Result<()> {
    let started = Started { at: std::time::Instant::now(), load: experiments::provenance::load_average() };
    let a = Args::parse();
    ensure!(!a.strides.is_empty() && a.strides.iter().all(|&k| k > 0), "--strides must be positive integers");
    let out_dir = a.out.dir()?;
    if a.engine == EngineFamily::Ditto {
        return ditto_table(&a, &out_dir, started);
    }
    eprintln!("stride_table: loading engines and inputs ...");
    let t = std::time::Instant::now();
    let session = Session::open(&a.session)?;
    eprintln!("stride_table: loaded in {:.0} s", t.elapsed().as_secs_f64());
    let Session { inputs: Inputs { backend, opts, audio, img, face, encoder, .. }, engines } = &session;
    let scratch = experiments::paths::workspace_root().join("target/stride_table");
    std::fs::create_dir_all(&scratch)?;

    ensure!(!a.infill.is_empty(), "--infill: name at least one infill (latent, image)");
    let runs: Vec<(usize, MuseTalkInfill)> = a
        .strides
        .iter()
        .flat_map(|&k| {
            let infills = if k == 1 { vec![MuseTalkInfill::Latent] } else { a.infill.clone() };
            infills.into_iter().map(move |i| (k, i))
        })
        .collect();
    let mut total_bar_len = 0u64;
    let bar = experiments::progress::progress_bar(0, "stride_table");
    let rows = in_rounds(&runs, a.rounds, |&(k, infill)| {
        bar.set_message(format!("stride {k}, {} infill: audio encoder + avatar", infill.name()));
        let window = cadence::frame_loop::window_frames(a.window, opts.fps);
        let opts = &cadence::frame_loop::RenderOptions { infill, window, ..opts.clone() };
        let prepared = cadence::musetalk::render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
        let n = prepared.frames;
        total_bar_len += n as u64;
        bar.set_length(total_bar_len);
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        bar.set_message(format!("stride {k}, {} infill: {} keyframes", infill.name(), schedule.count()));
        let out =
            OutputPath::check(&scratch.join(format!("stride_{k}_{}.mp4", infill.name())), Overwrite::Replace, &[])?;
        let output = match encoder {
            Some(e) => Output::Mp4 { out: &out, encoder: *e },
            None => Output::Discard,
        };
        let r = cadence::musetalk::render::render_clip(engines, backend, opts, &prepared, &schedule, output, |d| {
            bar.inc(d as u64)
        })
        .with_context(|| format!("render at stride {k}, {} infill", infill.name()))?;
        let setup = RenderSetup::new(backend, &session.engine_device, engines);
        let rep = RenderReport::new(setup, &prepared, &r.stats, r.video.as_ref(), opts.fps, 0.0);
        let names = Names {
            engine: "musetalk",
            infill: infill.name().into(),
            keyframe_net: engines.unet.describe(),
            decoder: engines.decoder.describe(),
        };
        Ok(row(k, n, &rep, names, opts.fps.hz()))
    })?;
    bar.finish_and_clear();

    let mut prov = session.provenance();
    prov.note("rounds", a.rounds.to_string());
    prov.note("infills", a.infill.iter().map(|i| i.name()).collect::<Vec<_>>().join(","));
    prov.note("window_s", a.window.to_string());
    prov.note("method", format!("{:?}", opts.method).to_lowercase());
    let mut rows = rows;
    if engines.profile != cadence_engines::Profile::Full && !a.no_projection {
        eprintln!("stride_table: timing the full profile's engines for the projection ...");
        let t = std::time::Instant::now();
        let full = FullCosts::measure(engines.decoder_kind, &session.engine_device.device, img, *face)?;
        eprintln!("stride_table: projection timed in {:.0} s", t.elapsed().as_secs_f64());
        rows.iter_mut().for_each(|r| full.project(r, rayon::current_num_threads()));
        prov.note(
            "full_projection",
            format!(
                "projected, not measured: full-profile engines timed once in this run (ms per frame: UNet {:.1}, \
                 decoder {:.1}, audio encoder {:.3}; avatar preparation {:.0} ms), with each row's counts and \
                 non-neural times, through calibrate's model",
                full.unet_ms_per_frame, full.decoder_ms_per_frame, full.audio_ms_per_frame, full.avatar_ms
            ),
        );
    }
    let what = format!("{} profile, {}", engines.profile, backend.name());
    write_outputs(&rows, &mut prov, &out_dir, "stride_table", &what, started)
}

impl Row {
    /// The stride, with the infill where it is not the engine's default (Ditto: every stride
    /// above 1; MuseTalk: image).
    fn label(&self) -> String {
        if (self.engine == "ditto" && self.stride > 1) || self.infill == MuseTalkInfill::Image.name() {
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
        decoded_frames: rep.decoded_frames,
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
        audio_encoder_cpu_ms: rep.stages_cpu_ms.as_ref().map(|c| c.audio_encoder),
        avatar_encoder_cpu_ms: rep.stages_cpu_ms.as_ref().map(|c| c.avatar_encoder),
        unet_cpu_ms: rep.stages_cpu_ms.as_ref().map(|c| c.unet),
        decoder_cpu_ms: rep.stages_cpu_ms.as_ref().map(|c| c.decoder),
        neural_cpu_ms: rep.stages_cpu_ms.as_ref().map(|c| c.neural),
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
        ..Row::default()
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
fn ditto_table(a: &Args, out_dir: &std::path::Path, started: Started) -> Result<()> {
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
    let what = format!("Ditto, {} profile, cpu", inputs.profile);
    write_outputs(&rows, &mut prov, out_dir, "stride_table_ditto", &what, started)
}

/// When the binary started, and the machine's load then.
struct Started {
    at: std::time::Instant,
    load: String,
}

/// The CSV (`{name}.csv`), the frames/s plot (`{name}_fps`) and the printed table. The load average
/// and the run's time from the binary's start are provenance lines: the time is what README
/// command 1 costs a user after the build.
fn write_outputs(
    rows: &[Row],
    prov: &mut Provenance,
    out_dir: &std::path::Path,
    name: &str,
    what: &str,
    started: Started,
) -> Result<()> {
    prov.note_load_and_runtime(&started.load, started.at);
    let mut rows = rows.to_vec();
    set_gains(&mut rows);
    let rows = &rows[..];
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
        (
            "UNet / decoder time (CPU time)",
            Box::new(|r| match (r.unet_cpu_ms, r.decoder_cpu_ms) {
                (Some(u), Some(d)) => format!("{:.0} / {:.0} ({:.0} / {:.0}) ms", r.unet_ms, r.decoder_ms, u, d),
                _ => format!("{:.0} / {:.0} ms", r.unet_ms, r.decoder_ms),
            }),
        ),
        (
            "Neural gain (by CPU time)",
            Box::new(|r| match r.neural_cpu_gain {
                Some(c) => format!("{:.2}x ({:.2}x)", r.neural_gain, c),
                None => format!("{:.2}x", r.neural_gain),
            }),
        ),
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
        ("End-to-end gain", Box::new(|r| format!("{:.2}x", r.end_to_end_gain))),
    ];
    let mut lines = lines;
    if rows.iter().all(|r| r.full_projected_neural_ms.is_some()) {
        let s = |v: Option<f64>| v.unwrap_or(f64::NAN);
        lines.push((
            "Full profile, PROJECTED: neural",
            Box::new(move |r| {
                format!("{:.1} s ({:.2}x)", s(r.full_projected_neural_ms) / 1e3, s(r.full_projected_neural_gain))
            }),
        ));
        lines.push((
            "Full profile, PROJECTED: end to end",
            Box::new(move |r| {
                format!(
                    "{:.1} s ({:.2}x)",
                    s(r.full_projected_end_to_end_ms) / 1e3,
                    s(r.full_projected_end_to_end_gain)
                )
            }),
        ));
    }
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

    /// Gains are the first row's time over each row's, by wall and by CPU time.
    #[test]
    fn gains_are_over_the_first_row() {
        let row = |neural: f64, cpu: Option<f64>, e2e: f64| Row {
            pure_neural_ms: neural,
            neural_cpu_ms: cpu,
            end_to_end_ms: e2e,
            ..Row::default()
        };
        let mut rows = vec![row(300.0, Some(500.0), 400.0), row(100.0, Some(200.0), 250.0), row(150.0, None, 200.0)];
        set_gains(&mut rows);
        assert_eq!((rows[0].neural_gain, rows[0].neural_cpu_gain, rows[0].end_to_end_gain), (1.0, Some(1.0), 1.0));
        assert_eq!((rows[1].neural_gain, rows[1].neural_cpu_gain, rows[1].end_to_end_gain), (3.0, Some(2.5), 1.6));
        assert_eq!((rows[2].neural_gain, rows[2].neural_cpu_gain, rows[2].end_to_end_gain), (2.0, None, 2.0));
    }
}
