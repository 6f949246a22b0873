//! cadence's engines against PyTorch on the same machine: the same networks (full profile,
//! synthetic / random weights), batch, input sizes and thread count, timed back to back in one
//! run. The PyTorch side is `experiments/peers/torch_peer.py`, kept running as a worker per
//! engine; each round times one cadence call and one PyTorch call, alternating which goes
//! first, and the medians of the rounds are compared. Writes results/peer_cpu.{csv,png,svg}.

use anyhow::{bail, ensure, Context, Result};
use cadence::measure::bench::median;
use cadence_engines::bench::test_input;
use cadence_engines::{
    AudioEncoder, Device, Engine, KeyframeModel, LatentDecoder, MuseTalkUnet, Profile, SdVae, Taesd, WeightsSource,
    WhisperAudio, DEFAULT_SEED,
};
use clap::Parser;
use experiments::csvout::write_csv;
use experiments::peer::{cpu_flags, python, Worker, PYTHON_ENV};
use experiments::plot::{bar_plot, BarChart};
use experiments::provenance::{load_average, Provenance};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// The peer script's exit status when torch is missing.
const NO_TORCH_EXIT: i32 = 3;
/// Audio per whisper call (what `engine-bench` times): 25.6 s, 640 video frames at 25 fps.
const AUDIO_SECONDS: f32 = 25.6;

#[derive(Parser)]
#[command(about = "cadence's engines against PyTorch (diffusers / transformers) on this CPU, same networks, batch, \
                   inputs and threads, alternating; writes results/peer_cpu.csv and .png")]
struct Args {
    /// Python with torch, diffusers and transformers (else $CADENCE_PEER_PYTHON, else
    /// experiments/peers/.venv/bin/python as `torch_peer.py --install` makes it).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Threads on both sides (rayon's pool; torch.set_num_threads).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed rounds per engine (one call of each side per round, after one warm-up each).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Frames per call of the UNet and TAESD.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Frames per call of the SD VAE decoder.
    #[arg(long, default_value_t = 2)]
    vae_batch: usize,
    /// Engines to compare (comma-separated): unet, taesd, sd-vae, whisper.
    #[arg(long, value_delimiter = ',', default_value = "unet,taesd,sd-vae,whisper")]
    engines: Vec<String>,
    #[command(flatten)]
    out: experiments::OutDir,
}

/// The PyTorch worker of one engine (`torch_peer.py --worker`).
struct Peer(Worker);

impl Peer {
    fn start(python: &PathBuf, script: &PathBuf, model: &str, batch: usize, threads: usize) -> Result<Peer> {
        let mut cmd = Command::new(python);
        cmd.arg(script).args([
            "--worker",
            "--model",
            model,
            "--batch",
            &batch.to_string(),
            "--threads",
            &threads.to_string(),
        ]);
        let worker = Worker::start(cmd, threads, |status| {
            if status.code() == Some(NO_TORCH_EXIT) {
                anyhow::anyhow!(
                    "{} has no torch (its message is above); install the peer with \
                     `python3 experiments/peers/torch_peer.py --install`, then pass --python \
                     experiments/peers/.venv/bin/python (or set {PYTHON_ENV})",
                    python.display()
                )
            } else {
                anyhow::anyhow!("the PyTorch peer for {model} exited ({status}) before it was ready")
            }
        })?;
        Ok(Peer(worker))
    }

    /// One timed forward pass on the PyTorch side (seconds, as the peer measured it).
    fn run(&mut self) -> Result<f64> {
        let v = self.0.ask("run")?;
        v["seconds"].as_f64().with_context(|| format!("peer answered {v}"))
    }
}

#[derive(serde::Serialize)]
struct Row {
    engine: String,
    batch: usize,
    frames_per_call: f64,
    rounds: usize,
    threads: usize,
    cadence_runtime: String,
    cadence_median_ms: f64,
    cadence_frames_per_s: f64,
    torch_median_ms: f64,
    torch_frames_per_s: f64,
    /// cadence frames/s over PyTorch frames/s.
    ratio: f64,
    target_ratio: f64,
    verdict: String,
}

/// cadence's side of one engine.
struct Side {
    /// The engine's name and what runs it.
    model: String,
    runtime: String,
    /// One call.
    call: Box<dyn FnMut() -> Result<()>>,
    frames_per_call: f64,
    /// The ratio issue 15 asks for.
    target: f64,
}

fn side<E: Engine + 'static>(
    e: E,
    frames: f64,
    target: f64,
    mut f: impl FnMut(&E) -> cadence_engines::Result<()> + 'static,
) -> Side {
    Side {
        model: e.model().to_string(),
        runtime: e.runtime().to_string(),
        call: Box::new(move || f(&e).map_err(Into::into)),
        frames_per_call: frames,
        target,
    }
}

fn cadence_side(name: &str, batch: usize) -> Result<Side> {
    let (profile, dev) = (Profile::Full, Device::Cpu);
    let w = WeightsSource::Synthetic { seed: DEFAULT_SEED };
    let b = batch as f64;
    Ok(match name {
        "unet" => {
            let (x, a) = (
                test_input(vec![batch, 8, 32, 32], 2),
                test_input(vec![batch, 50, cadence_engines::unet::AUDIO_DIM], 3),
            );
            side(MuseTalkUnet::new(profile, &w, &dev)?, b, 1.2, move |u| u.predict(&x, &a).map(|_| ()))
        }
        "taesd" => {
            let x = test_input(vec![batch, 4, 32, 32], 1);
            side(Taesd::decoder(profile, &w, &dev)?, b, 1.3, move |d| d.decode(&x).map(|_| ()))
        }
        "sd-vae" => {
            let x = test_input(vec![batch, 4, 32, 32], 1);
            side(SdVae::decoder(profile, &w, &dev)?, b, 1.2, move |d| d.decode(&x).map(|_| ()))
        }
        "whisper" => {
            let n = (AUDIO_SECONDS * 16000.0) as usize;
            // The signal engine-bench's bench_audio (and the peer) use.
            let samples: Vec<f32> = (0..n).map(|i| 0.3 * (i as f32 * 0.05).sin()).collect();
            let frames = (AUDIO_SECONDS * 25.0).ceil() as f64;
            side(WhisperAudio::new(profile, &w, &dev)?, frames, 1.0, move |e| {
                e.encode_audio(&samples, 25.0).map(|_| ())
            })
        }
        other => bail!("unknown engine {other:?}: unet, taesd, sd-vae or whisper"),
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    cadence_engines::isa::check_env()?;
    ensure!(
        a.threads > 0 && a.rounds > 0 && a.batch > 0 && a.vae_batch > 0,
        "--threads, --rounds and the batches must be positive"
    );
    let root = experiments::paths::workspace_root();
    let python = python(a.python, &root);
    let script = root.join("experiments/peers/torch_peer.py");
    ensure!(script.is_file(), "{} is missing", script.display());
    if !python.exists() {
        bail!(
            "no Python at {}: install the PyTorch peer with `python3 experiments/peers/torch_peer.py --install` \
             (a git-ignored venv in experiments/peers/.venv), or name a Python with torch, diffusers and \
             transformers by --python or {PYTHON_ENV}",
            python.display()
        );
    }
    let out_dir = a.out.dir()?;
    rayon::ThreadPoolBuilder::new().num_threads(a.threads).build_global().context("rayon's thread pool")?;
    let load_start = load_average();
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut torch_info = serde_json::Value::Null;
    for name in &a.engines {
        let batch = if name == "sd-vae" { a.vae_batch } else { a.batch };
        let Side { model, runtime, mut call, frames_per_call: frames, target } = cadence_side(name, batch)?;
        let mut peer = Peer::start(&python, &script, name, batch, a.threads)?;
        eprintln!("{name}: batch {batch}, {} threads; peer: {}", a.threads, peer.0.info);
        call()?;
        peer.run()?;
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..a.rounds {
            let mut time_ours = || -> Result<f64> {
                let t = Instant::now();
                call()?;
                Ok(t.elapsed().as_secs_f64())
            };
            if round % 2 == 0 {
                ours.push(time_ours()?);
                theirs.push(peer.run()?);
            } else {
                theirs.push(peer.run()?);
                ours.push(time_ours()?);
            }
            eprintln!("  round {round}: cadence {:.3} s, torch {:.3} s", ours[round], theirs[round]);
        }
        torch_info = peer.0.info.clone();
        peer.0.quit()?;
        let (m_ours, m_theirs) = (median(&ours), median(&theirs));
        let ratio = m_theirs / m_ours;
        rows.push(Row {
            engine: model,
            batch,
            frames_per_call: frames,
            rounds: a.rounds,
            threads: a.threads,
            cadence_runtime: runtime,
            cadence_median_ms: m_ours * 1e3,
            cadence_frames_per_s: frames / m_ours,
            torch_median_ms: m_theirs * 1e3,
            torch_frames_per_s: frames / m_theirs,
            ratio,
            target_ratio: target,
            verdict: if ratio >= target { "met" } else { "NOT MET" }.into(),
        });
        eprintln!("{name}: cadence / PyTorch = {ratio:.2} (target >= {target})");
        drop(call);
    }

    let mut prov = Provenance::gather(
        format!("cpu ({} threads) vs PyTorch CPU eager ({} threads)", a.threads, a.threads),
        Profile::Full.to_string(),
        format!("synthetic(seed={DEFAULT_SEED}) vs torch random init"),
    );
    prov.note("cpu_flags", cpu_flags());
    prov.note("cpu_loops", cadence_engines::isa::describe());
    let field = |k: &str| torch_info[k].as_str().map(str::to_string).unwrap_or_else(|| torch_info[k].to_string());
    prov.note(
        "peer",
        format!(
            "torch {} (cpu capability {}, mkldnn {}), diffusers {}, transformers {}, python {} ({})",
            field("torch"),
            field("cpu_capability"),
            field("mkldnn"),
            field("diffusers"),
            field("transformers"),
            field("python"),
            python.display()
        ),
    );
    prov.note("method", "per engine: one warm-up call each, then --rounds rounds of one cadence call and one PyTorch call (order alternating), medians compared; PyTorch times its own forward under inference_mode in a persistent worker (experiments/peers/torch_peer.py); ratio = cadence frames/s / PyTorch frames/s; targets from issue 15");
    prov.note("load_average", format!("{load_start} at start, {} at end (1/5/15 min)", load_average()));
    prov.note("runtime", format!("{:.0} s", t0.elapsed().as_secs_f64()));
    let csv = out_dir.join("peer_cpu.csv");
    write_csv(&csv, &prov, &rows)?;
    let chart = BarChart {
        title: format!("cadence vs PyTorch on this CPU ({} threads each), full profile", a.threads),
        x_label: "engine (batch)".into(),
        y_label: "frames/s (median)".into(),
        categories: rows.iter().map(|r| format!("{} (b{})", r.engine, r.batch)).collect(),
        series: vec![
            ("cadence".into(), rows.iter().map(|r| r.cadence_frames_per_s).collect()),
            ("PyTorch".into(), rows.iter().map(|r| r.torch_frames_per_s).collect()),
        ],
        value_labels: true,
    };
    bar_plot(&out_dir.join("peer_cpu"), &chart, &prov)?;
    println!("wrote {} and peer_cpu.png", csv.display());
    Ok(())
}
