//! The render server under load (issue 14's benchmark). Starts `cadence serve` as a child
//! process on 127.0.0.1:0 (its resident memory read from `/proc/<pid>/status`), then:
//! 1. warm-up: renders of each kind from as many clients as the load phase has, so that every
//!    code path (and the allocator's arenas) has allocated before memory is compared;
//! 2. load: a bounded number of requests from concurrent clients, a fixed mix of renders
//!    (register-then-generate by `avatar_id`, direct multipart, JSON, a job polled to its
//!    result, a streamed render with its time to first byte) and bad requests (413, 415, 422
//!    for a corrupt WAV and a corrupt MP4 avatar, 401, 404); every MP4 that comes back is
//!    parsed and its frame count checked;
//! 3. throughput: the same render sent by `--slots` clients at once to the server, then run as
//!    `--slots` parallel `cadence render` processes on the same inputs, in the same run.
//!
//! Writes results/server_load.csv (with provenance) and a latency plot, and prints each of the
//! issue's targets as met or NOT MET from the figures measured here.

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use clap::Parser;
use experiments::plot::{bar_plot, BarChart};
use experiments::serve::{
    cadence_binary, check_mp4, drive, file_part, ms, percentile, portrait, server_provenance, verdict, write_clip,
    ServerProcess,
};
use experiments::OutDir;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "The render server under load: latency, throughput against parallel CLI renders, memory, errors")]
struct Args {
    /// Requests in the load phase (renders and bad requests, mixed; at least 200 for the
    /// zero-5xx target to count).
    #[arg(long, default_value_t = 240)]
    requests: usize,
    /// Clients sending at once in the load phase.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    concurrency: u32,
    /// Every n-th request of the load phase is a render (the kinds in turn); the others are bad
    /// requests (cheap: refused before any engine work).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    render_every: u32,
    /// The server's render slots, and the `cadence render` processes run in parallel in the
    /// throughput comparison.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    slots: u32,
    /// Seconds of speech per render (the start of the bundled 25.6 s clip).
    #[arg(long, default_value_t = 2.0)]
    clip_seconds: f64,
    /// Keyframe stride of every render.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    stride: u32,
    /// Renders in the throughput comparison, on each side (rounded up to a multiple of --slots),
    /// in rounds of --slots renders alternating between the server and the CLI.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    compare_renders: u32,
    /// The `cadence` binary [default: `cadence` beside this binary, built by
    /// `cargo build --release -p cadence-cli`].
    #[arg(long)]
    cadence: Option<PathBuf>,
    #[command(flatten)]
    out: OutDir,
}

/// Token the child server requires (from its environment, not its command line).
const TOKEN: &str = "server-load-token";
/// Body limit of the child server, in MiB: the 413 requests send a little more.
const MAX_BODY_MB: usize = 4;

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("server_load: error: {e:#}");
        std::process::exit(1);
    }
}

/// The request kinds, renders first.
/// The portraits are synthetic, without a face for the detector: the server's centred box, as
/// the load was measured before the face was found by default (the load, not the face, is
/// what this measures).
const FACE_BOX: &str = "center";
const RENDER_KINDS: [&str; 5] = ["avatar_id", "multipart", "json", "job", "stream"];
/// Bad requests and the status each must get.
const BAD_KINDS: [(&str, u16); 6] = [
    ("bad_413_body", 413),
    ("bad_415_type", 415),
    ("bad_422_wav", 422),
    ("bad_422_mp4", 422),
    ("bad_401_token", 401),
    ("bad_404_avatar", 404),
];

/// What one request gave.
#[derive(Clone, Debug)]
struct Outcome {
    kind: &'static str,
    status: u16,
    /// From sending the request to having the whole answer (a job: to its MP4).
    latency_ms: f64,
    /// `render` of Server-Timing (a job: of its statistics).
    render_ms: Option<f64>,
    /// A streamed render: until the first byte of the body.
    ttfb_ms: Option<f64>,
    /// Frames rendered (renders that came back).
    frames: usize,
    /// A render whose MP4 did not parse or had the wrong number of frames, or a bad request
    /// that got another status than it should.
    wrong: Option<String>,
}

/// Everything a client sends, prepared once.
struct Inputs {
    base: String,
    wav: Vec<u8>,
    /// Three portraits: registrations of the same file are idempotent (cache hits).
    portraits: Vec<Vec<u8>>,
    expected_frames: usize,
    stride: u32,
    http: reqwest::blocking::Client,
}

impl Inputs {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn post(&self, path: &str) -> reqwest::blocking::RequestBuilder {
        self.http.post(self.url(path)).bearer_auth(TOKEN)
    }

    fn form(&self, portrait: usize) -> reqwest::blocking::multipart::Form {
        reqwest::blocking::multipart::Form::new()
            .part("audio", file_part(self.wav.clone(), "speech.wav", "audio/wav"))
            .part("video", file_part(self.portraits[portrait].clone(), "portrait.png", "image/png"))
            .text("stride", self.stride.to_string())
            .text("face_box", FACE_BOX)
    }
}

/// The `render` entry of a Server-Timing header, in milliseconds.
fn render_ms(timing: &str) -> Option<f64> {
    timing.split(',').find_map(|e| e.trim().strip_prefix("render;dur=")).and_then(|v| v.split(';').next()?.parse().ok())
}

fn header(r: &reqwest::blocking::Response, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Video samples of a fragmented MP4, or why it is not one with `want` frames.
fn check_fmp4(body: &[u8], want: usize, scratch: &Path) -> std::result::Result<usize, String> {
    let p = scratch.join(format!("check-{:?}.mp4", std::thread::current().id()));
    std::fs::write(&p, body).map_err(|e| e.to_string())?;
    let n = cadence_media::Mp4Reader::open(&p)
        .and_then(|r| if r.is_fragmented() { Ok(r.video_samples()?.samples.len()) } else { Ok(usize::MAX) })
        .map_err(|e| format!("the stream does not parse: {e}"));
    let _ = std::fs::remove_file(&p);
    match n? {
        usize::MAX => Err("the stream is not a fragmented MP4".into()),
        n if n != want => Err(format!("{n} frames, expected {want}")),
        n => Ok(n),
    }
}

/// A response that is the MP4 of a render: its status, Server-Timing render time and check.
fn finish_render(
    kind: &'static str,
    r: reqwest::blocking::Response,
    t: Instant,
    inp: &Inputs,
    scratch: &Path,
) -> Outcome {
    let status = r.status().as_u16();
    let timing = header(&r, "server-timing").unwrap_or_default();
    let body = r.bytes().map(|b| b.to_vec());
    let latency_ms = ms(t);
    let mut o =
        Outcome { kind, status, latency_ms, render_ms: render_ms(&timing), ttfb_ms: None, frames: 0, wrong: None };
    match body {
        Ok(b) if status == 200 => match check_mp4(&b, inp.expected_frames, scratch) {
            Ok(n) => o.frames = n,
            Err(e) => o.wrong = Some(e),
        },
        Ok(b) => o.wrong = Some(format!("status {status}: {}", String::from_utf8_lossy(&b[..b.len().min(300)]))),
        Err(e) => o.wrong = Some(format!("reading the body: {e}")),
    }
    o
}

fn failed(kind: &'static str, t: Instant, e: impl std::fmt::Display) -> Outcome {
    Outcome {
        kind,
        status: 0,
        latency_ms: ms(t),
        render_ms: None,
        ttfb_ms: None,
        frames: 0,
        wrong: Some(format!("no answer: {e}")),
    }
}

/// Request `i` of the load phase (or of the warm-up): its kind follows from `i`.
fn request(inp: &Inputs, kind: &'static str, i: usize, scratch: &Path) -> Vec<Outcome> {
    let t = Instant::now();
    let portrait = i % inp.portraits.len();
    let res: std::result::Result<Vec<Outcome>, reqwest::Error> = (|| {
        Ok(match kind {
            "multipart" => {
                vec![finish_render(kind, inp.post("/generate").multipart(inp.form(portrait)).send()?, t, inp, scratch)]
            }
            "json" => {
                let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
                let body = serde_json::json!({
                    "audio_b64": b64(&inp.wav), "avatar_b64": b64(&inp.portraits[portrait]), "stride": inp.stride, "face_box": FACE_BOX,
                });
                let r =
                    inp.post("/generate").header("content-type", "application/json").body(body.to_string()).send()?;
                vec![finish_render(kind, r, t, inp, scratch)]
            }
            "avatar_id" => {
                let f = reqwest::blocking::multipart::Form::new()
                    .part("image", file_part(inp.portraits[portrait].clone(), "portrait.png", "image/png"))
                    .text("face_box", FACE_BOX);
                let r = inp.post("/v1/avatars").multipart(f).send()?;
                let status = r.status().as_u16();
                let v: serde_json::Value = r.json().unwrap_or_default();
                let mut reg = Outcome {
                    kind: "register",
                    status,
                    latency_ms: ms(t),
                    render_ms: None,
                    ttfb_ms: None,
                    frames: 0,
                    wrong: None,
                };
                let Some(id) = v["avatar_id"].as_str().filter(|_| status == 200 || status == 201) else {
                    reg.wrong = Some(format!("registration: status {status}: {v}"));
                    return Ok(vec![reg]);
                };
                let t = Instant::now();
                let f = reqwest::blocking::multipart::Form::new()
                    .part("audio", file_part(inp.wav.clone(), "speech.wav", "audio/wav"))
                    .text("avatar_id", id.to_string())
                    .text("stride", inp.stride.to_string());
                vec![reg, finish_render(kind, inp.post("/generate").multipart(f).send()?, t, inp, scratch)]
            }
            "job" => vec![job(inp, t, portrait, scratch)?],
            "stream" => {
                let mut r = inp.post("/generate?stream=fmp4").multipart(inp.form(portrait)).send()?;
                let status = r.status().as_u16();
                let mut o =
                    Outcome { kind, status, latency_ms: 0.0, render_ms: None, ttfb_ms: None, frames: 0, wrong: None };
                let mut body = Vec::new();
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            o.ttfb_ms.get_or_insert_with(|| ms(t));
                            body.extend_from_slice(&buf[..n]);
                        }
                        Err(e) => {
                            o.wrong = Some(format!("the stream broke off after {} bytes: {e}", body.len()));
                            break;
                        }
                    }
                }
                o.latency_ms = ms(t);
                if o.wrong.is_none() {
                    if status != 200 {
                        o.wrong =
                            Some(format!("status {status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)])));
                    } else {
                        match check_fmp4(&body, inp.expected_frames, scratch) {
                            Ok(n) => o.frames = n,
                            Err(e) => o.wrong = Some(e),
                        }
                    }
                }
                vec![o]
            }
            bad => vec![bad_request(inp, bad, t)?],
        })
    })();
    res.unwrap_or_else(|e| vec![failed(kind, t, e)])
}

/// A job: POST /v1/jobs (202), its record polled until it ends, its MP4 fetched and checked,
/// then deleted.
fn job(inp: &Inputs, t: Instant, portrait: usize, scratch: &Path) -> reqwest::Result<Outcome> {
    let kind = "job";
    let r = inp.post("/v1/jobs").multipart(inp.form(portrait)).send()?;
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().unwrap_or_default();
    let mut o = Outcome { kind, status, latency_ms: 0.0, render_ms: None, ttfb_ms: None, frames: 0, wrong: None };
    let Some(id) = v["id"].as_str().filter(|_| status == 202).map(str::to_string) else {
        o.latency_ms = ms(t);
        o.wrong = Some(format!("status {status}: {v}"));
        return Ok(o);
    };
    let record = loop {
        let rec: serde_json::Value =
            inp.http.get(inp.url(&format!("/v1/jobs/{id}"))).bearer_auth(TOKEN).send()?.json()?;
        match rec["state"].as_str() {
            Some("queued" | "running") => std::thread::sleep(Duration::from_millis(100)),
            _ => break rec,
        }
    };
    if record["state"] != "done" {
        o.latency_ms = ms(t);
        o.wrong = Some(format!("the job ended {}: {}", record["state"], record["error"]));
        return Ok(o);
    }
    let r = inp.http.get(inp.url(&format!("/v1/jobs/{id}/result"))).bearer_auth(TOKEN).send()?;
    let mut done = finish_render(kind, r, t, inp, scratch);
    done.status = status;
    done.render_ms = record["stats"]["server_timing"].as_str().and_then(render_ms);
    inp.http.delete(inp.url(&format!("/v1/jobs/{id}"))).bearer_auth(TOKEN).send()?;
    Ok(done)
}

fn bad_request(inp: &Inputs, kind: &'static str, t: Instant) -> reqwest::Result<Outcome> {
    let want = BAD_KINDS.iter().find(|(k, _)| *k == kind).map(|(_, s)| *s).expect("a bad kind");
    let r = match kind {
        // Declared larger than the body limit: refused from its Content-Length.
        "bad_413_body" => {
            let big = vec![7u8; (MAX_BODY_MB << 20) + 4096];
            let f = reqwest::blocking::multipart::Form::new().part("audio", file_part(big, "big.wav", "audio/wav"));
            inp.post("/generate").multipart(f).send()?
        }
        "bad_415_type" => inp.post("/generate").header("content-type", "text/plain").body("not a render").send()?,
        "bad_422_wav" => {
            let f = reqwest::blocking::multipart::Form::new()
                .part("audio", file_part(b"RIFF\0\0\0\0WAVEjunk".to_vec(), "bad.wav", "audio/wav"));
            inp.post("/generate").multipart(f).send()?
        }
        // An MP4 avatar whose container starts well and ends in junk.
        "bad_422_mp4" => {
            let mut mp4 = b"\0\0\0\x18ftypisom\0\0\x02\0isomiso2".to_vec();
            mp4.extend_from_slice(&[0xAB; 2048]);
            let f = reqwest::blocking::multipart::Form::new()
                .part("audio", file_part(inp.wav.clone(), "speech.wav", "audio/wav"))
                .part("video", file_part(mp4, "avatar.mp4", "video/mp4"));
            inp.post("/generate").multipart(f).send()?
        }
        "bad_401_token" => inp.http.post(inp.url("/generate")).multipart(inp.form(0)).send()?,
        "bad_404_avatar" => {
            let f = reqwest::blocking::multipart::Form::new()
                .part("audio", file_part(inp.wav.clone(), "speech.wav", "audio/wav"))
                .text("avatar_id", "0".repeat(64));
            inp.post("/generate").multipart(f).send()?
        }
        other => unreachable!("bad kind {other}"),
    };
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().unwrap_or_default();
    let mut o = Outcome { kind, status, latency_ms: ms(t), render_ms: None, ttfb_ms: None, frames: 0, wrong: None };
    if status != want || body["error"]["code"].as_str().is_none() {
        o.wrong = Some(format!("expected {want} with a JSON error, got {status}: {body}"));
    }
    Ok(o)
}

/// The child server: its pid, its base URL, and a thread that keeps its log.
fn kind_of(i: usize, render_every: usize) -> &'static str {
    if i.is_multiple_of(render_every) {
        RENDER_KINDS[(i / render_every) % RENDER_KINDS.len()]
    } else {
        let j = i - i / render_every - 1;
        BAD_KINDS[j % BAD_KINDS.len()].0
    }
}

/// One line of the CSV: a figure, for a kind of request or for the whole run.
#[derive(serde::Serialize)]
struct Row {
    phase: String,
    kind: String,
    metric: String,
    value: f64,
    unit: String,
    /// The target for this figure, when it has one, and whether it was met.
    target: String,
    verdict: String,
}

fn row(phase: &str, kind: &str, metric: &str, value: f64, unit: &str) -> Row {
    Row {
        phase: phase.into(),
        kind: kind.into(),
        metric: metric.into(),
        value,
        unit: unit.into(),
        target: String::new(),
        verdict: String::new(),
    }
}

/// One `cadence render` process of the comparison.
struct CliRun {
    wall_ms: f64,
    /// Its report's end-to-end render time and engine load time.
    render_ms: f64,
    engine_load_ms: f64,
    wrong: Option<String>,
}

fn cli_render(cadence: &Path, wav: &Path, avatar: &Path, out: &Path, stride: u32, want: usize) -> CliRun {
    let t = Instant::now();
    let o = Command::new(cadence)
        .arg("render")
        .arg("--audio")
        .arg(wav)
        .arg("--avatar")
        .arg(avatar)
        .arg("-o")
        .arg(out)
        .args(["--stride", &stride.to_string(), "--device", "cpu", "--json", "--force", "--face-box", FACE_BOX])
        .env_remove("CADENCE_MODELS")
        .output();
    let wall_ms = ms(t);
    let mut run = CliRun { wall_ms, render_ms: f64::NAN, engine_load_ms: f64::NAN, wrong: None };
    match o {
        Err(e) => run.wrong = Some(format!("cadence render did not start: {e}")),
        Ok(o) if !o.status.success() => {
            run.wrong = Some(format!("cadence render failed: {}", String::from_utf8_lossy(&o.stderr)))
        }
        Ok(o) => {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            run.render_ms = v["end_to_end_ms"].as_f64().unwrap_or(f64::NAN);
            run.engine_load_ms = v["engine_load_ms"].as_f64().unwrap_or(f64::NAN);
            let checked = std::fs::read(out)
                .map_err(|e| e.to_string())
                .and_then(|b| check_mp4(&b, want, out.parent().expect("a directory")));
            if let Err(e) = checked {
                run.wrong = Some(format!("cadence render's output: {e}"));
            }
        }
    }
    let _ = std::fs::remove_file(out);
    run
}

fn run(a: Args) -> Result<()> {
    ensure!(
        a.clip_seconds > 0.0 && a.clip_seconds <= 25.0,
        "--clip-seconds must be in (0, 25] (the bundled speech clip is 25.6 s)"
    );
    ensure!(a.requests > 0, "--requests must be at least 1");
    let t_run = Instant::now();
    let load_before = experiments::provenance::load_average();
    let out_dir = a.out.dir()?;
    let cadence = cadence_binary(&a.cadence)?;
    let scratch = std::env::temp_dir().join(format!("cadence-server-load-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let result = measure(&a, &cadence, &scratch, &out_dir, t_run, &load_before);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(a: &Args, cadence: &Path, scratch: &Path, out_dir: &Path, t_run: Instant, load_before: &str) -> Result<()> {
    let root = experiments::workspace_root();
    let wav_path = scratch.join("speech.wav");
    write_clip(&root.join(experiments::session::DEFAULT_AUDIO), a.clip_seconds, &wav_path)?;
    let audio = cadence::frame_loop::audio::load_audio(&wav_path, 60.0)?;
    let expected_frames =
        cadence::musetalk::render::video_frames(&audio, &cadence::frame_loop::RenderOptions::default());
    let portraits = (0..3).map(|v| portrait(192, 256, v, scratch)).collect::<Result<Vec<_>>>()?;
    let portrait_path = scratch.join("portrait0.png");

    eprintln!("server_load: starting {} serve --slots {} ...", cadence.display(), a.slots);
    let server = ServerProcess::start(
        cadence,
        &[
            "--slots".to_string(),
            a.slots.to_string(),
            // Room for every client: the load is bounded by the clients, so a 429 means a bug.
            "--queue".into(),
            (a.concurrency.max(a.slots) * 2).to_string(),
            "--max-body-mb".into(),
            MAX_BODY_MB.to_string(),
            "--max-seconds".into(),
            (a.clip_seconds.ceil() + 1.0).to_string(),
            "--max-jobs".into(),
            (a.requests + 64).min(100_000).to_string(),
            "--temp-dir".into(),
            scratch.join("serve-tmp").display().to_string(),
        ],
        &[("CADENCE_TOKEN", TOKEN)],
        scratch.join("server.log"),
    )?;
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(600)).build()?;
    let info: serde_json::Value = http.get(format!("{}/v1/info", server.base)).bearer_auth(TOKEN).send()?.json()?;
    let engines = &info["engines"];
    let inp = Inputs {
        base: server.base.clone(),
        wav: std::fs::read(&wav_path)?,
        portraits,
        expected_frames,
        stride: a.stride,
        http,
    };
    let rss_ready = server.rss_kib()?;

    // Warm-up: each render kind from as many clients at once as the load phase has, so that
    // the allocator's per-thread arenas and every code path exist before memory is compared.
    let clients = a.concurrency as usize;
    eprintln!("server_load: warm-up ({clients} renders of each kind, {clients} at a time) ...");
    let kinds = RENDER_KINDS.len();
    let (warm, _) =
        drive(clients, (0..kinds * clients).collect(), |i| request(&inp, RENDER_KINDS[i % kinds], i, scratch));
    if let Some(o) = warm.iter().find(|o| o.wrong.is_some()) {
        bail!("warm-up {} failed: {} (server log: {})", o.kind, o.wrong.as_deref().unwrap_or(""), server.log.display());
    }
    let rss_warm = server.rss_kib()?;

    let every = a.render_every as usize;
    eprintln!("server_load: load: {} requests from {} clients ...", a.requests, a.concurrency);
    let (load, load_wall_s) =
        drive(a.concurrency as usize, (0..a.requests).collect(), |i| request(&inp, kind_of(i, every), i, scratch));
    let rss_load = server.rss_kib()?;

    // Throughput: rounds of n renders on the (otherwise idle) server, then n parallel `cadence
    // render` processes, in turn, so that a change in the machine's speed during the comparison
    // (other tenants, clock) falls on both sides alike instead of on whichever ran second.
    let n = a.slots as usize;
    let rounds = (a.compare_renders as usize).div_ceil(n);
    let k = rounds * n;
    eprintln!("server_load: throughput: {rounds} rounds of {n} renders on the server, then {n} `cadence render` processes ...");
    let (mut srv, mut srv_wall_s, mut cli, mut cli_wall_s) = (Vec::new(), 0.0, Vec::new(), 0.0);
    for r in 0..rounds {
        let (s, w) = drive(n, (0..n).collect(), |_| request(&inp, "multipart", 0, scratch));
        srv.extend(s);
        srv_wall_s += w;
        let (c, w) = drive(n, (0..n).collect(), |i| {
            vec![cli_render(
                cadence,
                &wav_path,
                &portrait_path,
                &scratch.join(format!("cli{}.mp4", r * n + i)),
                a.stride,
                expected_frames,
            )]
        });
        cli.extend(c);
        cli_wall_s += w;
    }
    let rss_end = server.rss_kib()?;
    server.stop()?;
    if let Some(e) = cli.iter().find_map(|c| c.wrong.as_deref()) {
        bail!("{e}");
    }

    // Figures.
    let mut rows = Vec::new();
    let is_render = |o: &Outcome| RENDER_KINDS.contains(&o.kind);
    let mut kinds: Vec<&str> = vec!["register"];
    kinds.extend(RENDER_KINDS);
    kinds.extend(BAD_KINDS.iter().map(|b| b.0));
    for kind in &kinds {
        let of: Vec<&Outcome> = load.iter().filter(|o| o.kind == *kind).collect();
        if of.is_empty() {
            continue;
        }
        let lat: Vec<f64> = of.iter().map(|o| o.latency_ms).collect();
        rows.push(row("load", kind, "requests", of.len() as f64, "count"));
        rows.push(row("load", kind, "wrong", of.iter().filter(|o| o.wrong.is_some()).count() as f64, "count"));
        for p in [50.0, 95.0, 99.0] {
            rows.push(row("load", kind, &format!("latency_p{p}"), percentile(&lat, p), "ms"));
        }
        let ttfb: Vec<f64> = of.iter().filter_map(|o| o.ttfb_ms).collect();
        if !ttfb.is_empty() {
            for p in [50.0, 95.0, 99.0] {
                rows.push(row("load", kind, &format!("time_to_first_byte_p{p}"), percentile(&ttfb, p), "ms"));
            }
        }
    }
    let renders: Vec<&Outcome> = load.iter().filter(|o| is_render(o)).collect();
    let render_lat: Vec<f64> = renders.iter().map(|o| o.latency_ms).collect();
    let done = renders.iter().filter(|o| o.frames > 0).count();
    let frames: usize = renders.iter().map(|o| o.frames).sum();
    let bad_lat: Vec<f64> = load.iter().filter(|o| o.kind.starts_with("bad_")).map(|o| o.latency_ms).collect();
    rows.push(row("load", "all", "requests", load.len() as f64, "count"));
    rows.push(row("load", "all", "wall_time", load_wall_s, "s"));
    rows.push(row("load", "renders", "renders_per_minute", done as f64 / load_wall_s * 60.0, "1/min"));
    rows.push(row("load", "renders", "frames_per_second", frames as f64 / load_wall_s, "1/s"));
    for p in [50.0, 95.0, 99.0] {
        rows.push(row("load", "renders", &format!("latency_p{p}"), percentile(&render_lat, p), "ms"));
        rows.push(row("load", "bad", &format!("latency_p{p}"), percentile(&bad_lat, p), "ms"));
    }
    let mut statuses: Vec<u16> = load.iter().map(|o| o.status).collect();
    statuses.sort_unstable();
    statuses.dedup();
    for s in &statuses {
        let n = load.iter().filter(|o| o.status == *s).count();
        rows.push(row("load", &format!("status_{s}"), "responses", n as f64, "count"));
    }
    let five_xx = load.iter().filter(|o| o.status >= 500).count();
    let no_answer = load.iter().filter(|o| o.status == 0).count();
    let corrupt = renders.iter().filter(|o| o.status / 100 == 2 && o.wrong.is_some()).count();
    let failed_renders = renders.iter().filter(|o| o.status / 100 != 2).count();
    let unexpected = load.iter().filter(|o| o.kind.starts_with("bad_") && o.wrong.is_some()).count();
    for (m, v) in [
        ("5xx", five_xx),
        ("no_answer", no_answer),
        ("corrupt_outputs", corrupt),
        ("renders_refused", failed_renders),
        ("bad_requests_wrong_status", unexpected),
    ] {
        rows.push(row("load", "all", m, v as f64, "count"));
    }

    // Memory.
    let mib = |k: u64| k as f64 / 1024.0;
    for (m, v) in
        [("rss_ready", rss_ready), ("rss_after_warmup", rss_warm), ("rss_after_load", rss_load), ("rss_end", rss_end)]
    {
        rows.push(row("memory", "server", m, mib(v), "MiB"));
    }
    let growth = (rss_end as f64 - rss_warm as f64) / rss_warm as f64 * 100.0;

    // Overhead: request latency minus the render's own time, in the comparison phase (as many
    // clients as slots: no request waits for a slot).
    let overhead: Vec<f64> =
        srv.iter().filter_map(|o| Some((o.latency_ms - o.render_ms?) / o.latency_ms * 100.0)).collect();
    let overhead_ms: Vec<f64> = srv.iter().filter_map(|o| Some(o.latency_ms - o.render_ms?)).collect();
    let srv_ok = srv.iter().filter(|o| o.frames > 0).count();
    let srv_per_min = srv_ok as f64 / srv_wall_s * 60.0;
    let cli_per_min = k as f64 / cli_wall_s * 60.0;
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    // The target compares against the CLI's renders alone: n processes rendering back to back,
    // each at its measured end-to-end render time (taken while the others ran). Each process
    // also starts and loads its engines, which the server does once; counting that would favour
    // the server, so it is reported (cli renders_per_minute) but not used for the verdict.
    let cli_render_ms = mean(cli.iter().map(|c| c.render_ms).collect());
    let cli_render_per_min = n as f64 * 60_000.0 / cli_render_ms;
    let ratio = srv_per_min / cli_render_per_min;
    rows.push(row("throughput", "server", "renders", k as f64, "count"));
    rows.push(row("throughput", "server", "renders_ok", srv_ok as f64, "count"));
    rows.push(row("throughput", "server", "wall_time", srv_wall_s, "s"));
    rows.push(row("throughput", "server", "renders_per_minute", srv_per_min, "1/min"));
    rows.push(row(
        "throughput",
        "server",
        "latency_p50",
        percentile(&srv.iter().map(|o| o.latency_ms).collect::<Vec<_>>(), 50.0),
        "ms",
    ));
    rows.push(row(
        "throughput",
        "server",
        "render_time_mean",
        mean(srv.iter().filter_map(|o| o.render_ms).collect()),
        "ms",
    ));
    rows.push(row("throughput", "server", "overhead_p50", percentile(&overhead_ms, 50.0), "ms"));
    rows.push(row("throughput", "cli", "renders", k as f64, "count"));
    rows.push(row("throughput", "cli", "wall_time", cli_wall_s, "s"));
    rows.push(row("throughput", "cli", "renders_per_minute", cli_per_min, "1/min"));
    rows.push(row("throughput", "cli", "process_time_mean", mean(cli.iter().map(|c| c.wall_ms).collect()), "ms"));
    rows.push(row("throughput", "cli", "render_time_mean", cli_render_ms, "ms"));
    rows.push(row("throughput", "cli", "renders_per_minute_render_only", cli_render_per_min, "1/min"));
    rows.push(row("throughput", "cli", "engine_load_mean", mean(cli.iter().map(|c| c.engine_load_ms).collect()), "ms"));

    // The targets.
    let requests = load.len();
    let bad_total = five_xx + no_answer + corrupt;
    let overhead_p50 = percentile(&overhead, 50.0);
    let targets = [
        (
            "targets",
            "5xx_no_answer_and_corrupt",
            bad_total as f64,
            "count",
            format!("0 over >= 200 requests ({requests} sent)"),
            bad_total == 0 && requests >= 200,
        ),
        ("targets", "rss_growth_after_warmup", growth, "%", "< 5".to_string(), growth < 5.0),
        ("targets", "server_overhead_p50", overhead_p50, "%", "< 2".to_string(), overhead_p50 < 2.0),
        (
            "targets",
            "throughput_server_over_cli",
            ratio,
            "ratio",
            format!(">= 0.9 ({n} slots against {n} parallel cadence render, their render time alone)"),
            ratio >= 0.9,
        ),
    ];
    println!("server_load: {} requests in {load_wall_s:.1} s ({} renders, {frames} frames)", requests, done);
    for (phase, metric, value, unit, target, met) in targets {
        println!("  {metric}: {value:.3} {unit} (target {target}): {}", verdict(met));
        rows.push(Row {
            phase: phase.into(),
            kind: "all".into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
            target,
            verdict: verdict(met).into(),
        });
    }
    println!(
        "  renders/min: load {:.1}, server {srv_per_min:.1} vs cli {cli_render_per_min:.1} rendering ({cli_per_min:.1} \
         with process start and engine load); render p50/p95/p99 {:.0}/{:.0}/{:.0} ms; \
         rss {:.0} -> {:.0} -> {:.0} MiB",
        done as f64 / load_wall_s * 60.0,
        percentile(&render_lat, 50.0),
        percentile(&render_lat, 95.0),
        percentile(&render_lat, 99.0),
        mib(rss_warm),
        mib(rss_load),
        mib(rss_end)
    );
    for o in load.iter().filter(|o| o.wrong.is_some()).take(5) {
        println!("  wrong: {} ({}): {}", o.kind, o.status, o.wrong.as_deref().unwrap_or(""));
    }

    let mut prov = server_provenance(engines);
    prov.note(
        "setup",
        format!(
            "cadence serve --slots {} on 127.0.0.1 (a child process); {} clients; every {} request a render; \
             {:.1} s of speech ({expected_frames} frames) at stride {}, 192x256 portrait; throughput: {k} renders, \
             {n} at a time, in rounds alternating server and `cadence render`",
            a.slots, a.concurrency, a.render_every, a.clip_seconds, a.stride
        ),
    );
    prov.note_load_and_runtime(load_before, t_run);
    let csv = out_dir.join("server_load.csv");
    experiments::write_csv(&csv, &prov, &rows)?;

    let mut categories: Vec<String> = RENDER_KINDS.iter().map(|k| k.to_string()).collect();
    categories.push("bad requests".into());
    let pick = |p: f64| -> Vec<f64> {
        let mut v: Vec<f64> = RENDER_KINDS
            .iter()
            .map(|k| {
                percentile(&load.iter().filter(|o| o.kind == *k).map(|o| o.latency_ms / 1e3).collect::<Vec<_>>(), p)
            })
            .collect();
        v.push(percentile(&bad_lat, p) / 1e3);
        v.into_iter().map(|x| if x.is_finite() { x } else { 0.0 }).collect()
    };
    let chart = BarChart {
        title: format!(
            "cadence serve under load: latency by request kind ({requests} requests, {} clients, {} slots)",
            a.concurrency, a.slots
        ),
        x_label: "request kind".into(),
        y_label: "latency (s)".into(),
        categories,
        series: vec![("p50".into(), pick(50.0)), ("p95".into(), pick(95.0)), ("p99".into(), pick(99.0))],
        value_labels: true,
    };
    let files = bar_plot(&out_dir.join("server_load"), &chart, &prov)?;
    println!("server_load: wrote {}, {} and {}", csv.display(), files.png.display(), files.svg.display());
    Ok(())
}
