//! Live WebRTC sessions under load (issue 37's benchmark). Starts `cadence serve` as a child
//! process (`--max-sessions N`), connects N WebRTC receivers in this process
//! (`cadence_live::receiver`: str0m over loopback UDP, decoding H.264 and Opus), and for
//! `--seconds` pushes speech to every session at real time: the bundled newscast clip, looped,
//! in chunks of `--chunk-ms` posted as raw 16 kHz PCM, with a pause every 15 s (the avatar
//! idles at rest) and an interrupt every `--interrupt-every` seconds. One more session is then
//! asked for: it must be refused while the N run. For each session:
//! - audio to mouth: from a chunk's POST (sent) to the arrival of the video frame at that
//!   audio's time (the frame whose RTP time is the chunk's start on the session's timeline),
//!   p50 and p95; arrivals are the kernel's receive stamps (`cadence_live::arrival`), not
//!   when the receiver's thread got to them;
//! - the largest gap between two frames' arrivals, the frames received, and the server's
//!   repeated frames (a frame the render had not made in time, sent again); the video bit
//!   rate received, over the run and the most in a second;
//! - audio/video skew at the end: the median (arrival - RTP time) of the frames minus that of
//!   the speech packets over the last 5 s (both RTP clocks count from the session's clock);
//! - interrupt: from the request to the first eased frame written to the wire (the server's
//!   figure), and to the first frame arriving after it (the receiver's).
//!
//! Writes results/live_sessions.csv and live_sessions.{png,svg} with provenance, and prints
//! each target as met or NOT MET.

use anyhow::{ensure, Context, Result};
use cadence_live::receiver::Receiver;
use clap::Parser;
use experiments::plot::{bar_plot, BarChart};
use experiments::serve::{cadence_binary, percentile, server_provenance, verdict, ServerProcess};
use experiments::{write_csv, OutDir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    about = "Live WebRTC sessions: audio to mouth, frame gaps, repeats, A/V skew, interrupt latency, refusal beyond --max-sessions"
)]
struct Args {
    /// Seconds each session is fed speech.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// The session counts to run (one server each, with --max-sessions set to the count).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    sessions: Vec<usize>,
    /// Milliseconds of speech per POST.
    #[arg(long, default_value_t = 200)]
    chunk_ms: u64,
    /// Seconds between interrupts (each one only while speech is being pushed, at least 1 s
    /// after a pause).
    #[arg(long, default_value_t = 10.0)]
    interrupt_every: f64,
    /// The server's --session-margin-ms [default: the server's].
    #[arg(long)]
    margin_ms: Option<u64>,
    /// The sessions' stride: 1 to 12, or `auto` (each session chooses its own from the rates
    /// its parts measure) [default: the server's default for a session].
    #[arg(long, value_parser = parse_stride)]
    stride: Option<Value>,
    /// The `cadence` binary [default: `cadence` beside this binary, built by
    /// `cargo build --release -p cadence-cli`].
    #[arg(long)]
    cadence: Option<PathBuf>,
    #[command(flatten)]
    out: OutDir,
}

/// One row of `live_sessions.csv`: one session of a run with `sessions` sessions.
#[derive(serde::Serialize, Clone, Debug)]
struct Row {
    sessions: usize,
    session: usize,
    /// The stride the session started at, `fixed` or `auto`, and (auto) where it ended and how
    /// many times it changed.
    stride: u64,
    stride_mode: String,
    final_stride: u64,
    stride_changes: u64,
    delay_ms: f64,
    seconds: f64,
    chunks: usize,
    frames_received: usize,
    frames_sent: u64,
    repeated_frames: u64,
    repeated_pct: f64,
    late_frames: u64,
    undecodable_frames: usize,
    /// The largest gap between two frame arrivals at the receiver.
    max_frame_gap_ms: f64,
    /// The largest gap between two frames' packets leaving the server's socket (the server's
    /// figure); the receiver's is the kernel's stamps of the same packets on loopback.
    wire_max_frame_gap_ms: f64,
    /// The longest one frame took in the wire's H.264 encoder (the server's figure).
    wire_max_encode_ms: f64,
    audio_to_mouth_p50_ms: f64,
    audio_to_mouth_p95_ms: f64,
    /// What of audio to mouth is the chunk's wait behind the speech queued before it (the
    /// client's pushes jitter; speech is never overlapped or dropped), p50 and p95.
    speech_wait_p50_ms: f64,
    speech_wait_p95_ms: f64,
    av_skew_ms: f64,
    /// The video's bit rate as received, kb/s: over the whole run, and the most in any second
    /// (by RTP time). The server aims at `--session-video-kbps` (1500 by default).
    video_kbps: f64,
    video_kbps_max_1s: f64,
    interrupts: usize,
    /// From the request to the first eased frame written to the wire (the server's figure).
    interrupt_wire_p95_ms: f64,
    /// From the request to the first frame arriving after it (the receiver's).
    interrupt_first_frame_p95_ms: f64,
    /// The interrupt request's round trip.
    interrupt_answer_p95_ms: f64,
    extra_session_status: u16,
}

/// What one session's client measured.
struct Measured {
    /// (sent, timeline seconds, seconds it waited behind earlier speech) of each chunk.
    chunks: Vec<(Instant, f64, f64)>,
    /// Each interrupt: when it was asked, the server's latency to its first eased frame and
    /// the request's round trip (ms).
    interrupts: Vec<(Instant, f64, f64)>,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("live_sessions: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<()> {
    ensure!(a.seconds >= 5.0, "--seconds: at least 5");
    ensure!(a.sessions.iter().all(|&n| n >= 1), "--sessions: counts of at least 1");
    let cadence = cadence_binary(&a.cadence)?;
    let out = a.out.dir()?;
    let clip = speech(&experiments::workspace_root().join("experiments/assets/newscast_25s6.wav"))?;
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let mut rows = Vec::new();
    let mut prov = None;
    for &n in &a.sessions {
        let log = std::env::temp_dir().join(format!("live_sessions_{n}.log"));
        let mut args: Vec<String> =
            ["--max-sessions", &n.to_string(), "--session-idle-seconds", "600"].iter().map(|s| s.to_string()).collect();
        if let Some(ms) = a.margin_ms {
            args.extend(["--session-margin-ms".to_string(), ms.to_string()]);
        }
        let server = ServerProcess::start(&cadence, &args, &[], log)?;
        if prov.is_none() {
            let info: Value = http.get(format!("{}/v1/info", server.base)).send()?.json()?;
            prov = Some(server_provenance(&info["engines"]));
        }
        println!("live_sessions: {n} session(s), {:.0} s of speech each", a.seconds);
        rows.extend(run_sessions(&a, &server.base, n, &clip, &http)?);
        server.stop()?;
    }
    let mut prov = prov.context("no run")?;
    prov.note("chunk_ms", a.chunk_ms.to_string());
    prov.note("stride", a.stride.as_ref().map_or("the server's default".to_string(), |k| k.to_string()));
    prov.note("margin_ms", a.margin_ms.map_or("the server's default".to_string(), |ms| ms.to_string()));
    prov.note("audio", "experiments/assets/newscast_25s6.wav looped, a 3 s pause every 15 s");
    prov.note("receiver", "cadence_live::receiver (str0m over loopback UDP, OpenH264 and opus-rs decoding)");
    let csv = out.join("live_sessions.csv");
    write_csv(&csv, &prov, &rows)?;
    let counts: Vec<String> = a.sessions.iter().map(|n| format!("{n} session(s)")).collect();
    let worst = |f: &dyn Fn(&Row) -> f64| -> Vec<f64> {
        a.sessions.iter().map(|&n| rows.iter().filter(|r| r.sessions == n).map(f).fold(0.0, f64::max)).collect()
    };
    let chart = BarChart {
        title: "Live sessions: the worst session of each run".into(),
        x_label: "sessions at once".into(),
        y_label: "milliseconds".into(),
        categories: counts,
        series: vec![
            ("audio to mouth p95".into(), worst(&|r| r.audio_to_mouth_p95_ms)),
            ("largest frame gap".into(), worst(&|r| r.max_frame_gap_ms)),
            ("interrupt, first eased frame p95".into(), worst(&|r| r.interrupt_wire_p95_ms)),
            ("|A/V skew|".into(), worst(&|r| r.av_skew_ms.abs())),
        ],
        value_labels: true,
    };
    let files = bar_plot(&out.join("live_sessions"), &chart, &prov)?;
    println!("live_sessions: wrote {}, {} and {}", csv.display(), files.png.display(), files.svg.display());
    for r in &rows {
        println!(
            "  {} session(s), #{}: stride {} ({} -> {}, {} changes), audio to mouth p50 {:.0} / p95 {:.0} ms ({}; of it waiting behind earlier speech p50 {:.0} / p95 {:.0} ms, the delay {:.0} ms), largest gap {:.1} ms ({}; on the wire {:.1} ms, longest encode {:.1} ms), repeated {:.2}% ({}), skew {:.1} ms ({}), video {:.0} kb/s (most in a second {:.0}), interrupt p95 {:.1} ms ({}), one more session: {} ({})",
            r.sessions,
            r.session,
            r.stride_mode,
            r.stride,
            r.final_stride,
            r.stride_changes,
            r.audio_to_mouth_p50_ms,
            r.audio_to_mouth_p95_ms,
            verdict(r.audio_to_mouth_p95_ms <= 1000.0),
            r.speech_wait_p50_ms,
            r.speech_wait_p95_ms,
            r.delay_ms,
            r.max_frame_gap_ms,
            verdict(r.max_frame_gap_ms <= 80.0),
            r.wire_max_frame_gap_ms,
            r.wire_max_encode_ms,
            r.repeated_pct,
            verdict(r.repeated_pct <= 2.0),
            r.av_skew_ms,
            verdict(r.av_skew_ms.abs() <= 40.0),
            r.video_kbps,
            r.video_kbps_max_1s,
            r.interrupt_wire_p95_ms,
            verdict(r.interrupt_wire_p95_ms <= 80.0),
            r.extra_session_status,
            verdict(r.extra_session_status == 429),
        );
    }
    Ok(())
}

/// The clip's 16 kHz mono samples as 16-bit PCM.
fn speech(path: &Path) -> Result<Vec<i16>> {
    let audio = cadence_media::load_wav(path)?;
    Ok(audio.samples_16k.iter().map(|&v| (v.clamp(-1.0, 1.0) * 32767.0).round() as i16).collect())
}

/// `--stride`: a whole number from 1 to 12 or `auto`, as the session's JSON takes it.
fn parse_stride(s: &str) -> Result<Value, String> {
    match s {
        "auto" => Ok(json!("auto")),
        _ => match s.parse::<u32>() {
            Ok(k @ 1..=12) => Ok(json!(k)),
            _ => Err(format!("{s:?}: a whole number from 1 to 12, or auto")),
        },
    }
}

/// Runs `n` sessions at once against the server at `base`.
fn run_sessions(a: &Args, base: &str, n: usize, clip: &[i16], http: &reqwest::blocking::Client) -> Result<Vec<Row>> {
    // Connect every session first.
    let mut peers = Vec::new();
    for _ in 0..n {
        let (mut peer, offer) = Receiver::offer([127, 0, 0, 1].into())?;
        let r = http
            .post(format!("{base}/v1/sessions"))
            .json(&match &a.stride {
                Some(k) => json!({"sdp": offer, "type": "offer", "stride": k}),
                None => json!({"sdp": offer, "type": "offer"}),
            })
            .send()?;
        ensure!(r.status() == 201, "POST /v1/sessions: {} {}", r.status(), r.text()?);
        let v: Value = r.json()?;
        peer.accept(v["sdp"].as_str().context("no sdp")?)?;
        peers.push((peer, v));
    }
    // One more: refused while these run.
    let (_extra, offer) = Receiver::offer([127, 0, 0, 1].into())?;
    let extra_status = http.post(format!("{base}/v1/sessions")).json(&json!({"sdp": offer})).send()?.status().as_u16();

    let stop = Arc::new(AtomicBool::new(false));
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for (i, (peer, created)) in peers.into_iter().enumerate() {
            let id = created["session_id"].as_str().context("no session id")?.to_string();
            // The receiver runs on its own thread for the whole run.
            let stop_r = stop.clone();
            let receiver = s.spawn(move || -> Result<Receiver> {
                let mut peer = peer;
                while !stop_r.load(Ordering::Relaxed) {
                    peer.run_for(Duration::from_millis(50))?;
                }
                Ok(peer)
            });
            let pusher = s.spawn({
                let id = id.clone();
                move || push(a, base, &id, clip, http)
            });
            handles.push((i, id, created, receiver, pusher));
        }
        let mut done = Vec::new();
        for (i, id, created, receiver, pusher) in handles {
            match pusher.join().map_err(|_| anyhow::anyhow!("a pusher panicked")).and_then(|r| r) {
                Ok(measured) => done.push((i, id, created, receiver, measured)),
                Err(e) => {
                    // Stop the receivers, or the scope would wait for them for ever.
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        // Let the last speech reach the receivers, then stop them.
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        for (i, id, created, receiver, measured) in done {
            let peer = receiver.join().map_err(|_| anyhow::anyhow!("a receiver panicked"))??;
            let stats: Value = http.get(format!("{base}/v1/sessions/{id}")).send()?.json()?;
            let _ = http.delete(format!("{base}/v1/sessions/{id}")).send()?;
            results.lock().unwrap().push(row(a, n, i, &created, &stats, &peer, &measured, extra_status));
        }
        Ok(())
    })?;
    let mut rows = results.into_inner().unwrap();
    rows.sort_by_key(|r| r.session);
    Ok(rows)
}

/// Pushes the clip to session `id` at real time for `a.seconds`, pausing 3 s every 15 s and
/// interrupting every `a.interrupt_every` s.
fn push(a: &Args, base: &str, id: &str, clip: &[i16], http: &reqwest::blocking::Client) -> Result<Measured> {
    let chunk = (16 * a.chunk_ms) as usize;
    let start = Instant::now();
    let mut m = Measured { chunks: Vec::new(), interrupts: Vec::new() };
    let mut pos = 0usize;
    let mut pushed = Duration::ZERO;
    let mut next_interrupt = a.interrupt_every;
    let mut interrupts = Vec::new();
    while pushed.as_secs_f64() < a.seconds {
        let t = pushed.as_secs_f64();
        // A pause of 3 s every 15 s: the session idles.
        if t % 15.0 >= 12.0 {
            pushed += Duration::from_millis(a.chunk_ms);
            sleep_until(start + pushed);
            continue;
        }
        if t >= next_interrupt && t % 15.0 >= 1.0 {
            next_interrupt += a.interrupt_every;
            interrupts.push(interrupt(base, id, http)?);
        }
        let samples: Vec<u8> = (0..chunk).flat_map(|k| clip[(pos + k) % clip.len()].to_le_bytes()).collect();
        pos += chunk;
        let sent = Instant::now();
        let r = http
            .post(format!("{base}/v1/sessions/{id}/audio"))
            .header("content-type", "audio/L16")
            .body(samples)
            .send()?;
        ensure!(r.status() == 200, "POST audio: {} {}", r.status(), r.text()?);
        let v: Value = r.json()?;
        m.chunks.push((
            sent,
            v["start_s"].as_f64().context("no start_s")?,
            v["waits_s"].as_f64().context("no waits_s")?,
        ));
        pushed += Duration::from_millis(a.chunk_ms);
        sleep_until(start + pushed);
    }
    for figures in interrupts {
        m.interrupts.push(figures.join().map_err(|_| anyhow::anyhow!("an interrupt's reader panicked"))??);
    }
    Ok(m)
}

/// The figures of one interrupt: when it was asked, the server's latency to the first eased
/// frame, and the time from the request to its answer (ms).
type InterruptFigures = std::thread::JoinHandle<Result<(Instant, f64, f64)>>;

/// Interrupts session `id`. The server's latency is read 300 ms later, once the eased frame is
/// out, on a thread of its own: the pushes go on at real time meanwhile (a pusher that waited
/// would fall behind, and the speech it then sends at once would wait behind its own).
fn interrupt(base: &str, id: &str, http: &reqwest::blocking::Client) -> Result<InterruptFigures> {
    let asked = Instant::now();
    let r = http.post(format!("{base}/v1/sessions/{id}/interrupt")).send()?;
    ensure!(r.status() == 200, "POST interrupt: {}", r.status());
    let answered = asked.elapsed().as_secs_f64() * 1e3;
    let (url, http) = (format!("{base}/v1/sessions/{id}"), http.clone());
    Ok(std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let v: Value = http.get(url).send()?.json()?;
        Ok((asked, v["interrupt_latency_ms"].as_f64().unwrap_or(f64::NAN), answered))
    }))
}

/// The video's bit rate over all the frames received, and the most in any one second of RTP
/// time (frames with RTP times in [t, t + 1) for each frame's t), kb/s.
fn bit_rates(frames: &[cadence_live::receiver::FrameArrival]) -> (f64, f64) {
    let (Some(first), Some(last)) = (frames.first(), frames.last()) else { return (f64::NAN, f64::NAN) };
    let span = last.rtp_s - first.rtp_s;
    let total: usize = frames.iter().map(|f| f.bytes).sum();
    let mean = if span > 0.0 { total as f64 * 8.0 / span / 1e3 } else { f64::NAN };
    let mut most = 0usize;
    let (mut end, mut in_window) = (0, 0usize);
    for (i, f) in frames.iter().enumerate() {
        while end < frames.len() && frames[end].rtp_s < f.rtp_s + 1.0 {
            in_window += frames[end].bytes;
            end += 1;
        }
        most = most.max(in_window);
        in_window -= frames[i].bytes;
    }
    (mean, most as f64 * 8.0 / 1e3)
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

#[allow(clippy::too_many_arguments)]
fn row(
    a: &Args,
    n: usize,
    i: usize,
    created: &Value,
    stats: &Value,
    peer: &Receiver,
    m: &Measured,
    extra_status: u16,
) -> Row {
    let fps = created["fps"].as_f64().unwrap_or(25.0);
    // Audio to mouth: the frame at the chunk's start on the timeline, found by its RTP time.
    let mut a2m = Vec::new();
    for &(sent, start_s, _) in &m.chunks {
        let f = (start_s * fps).ceil() as i64;
        if let Some(fr) = peer.frames.iter().find(|fr| (fr.rtp_s * fps).round() as i64 == f) {
            a2m.push(fr.at.saturating_duration_since(sent).as_secs_f64() * 1e3);
        }
    }
    let waits: Vec<f64> = m.chunks.iter().map(|c| c.2 * 1e3).collect();
    let (video_kbps, video_kbps_max_1s) = bit_rates(&peer.frames);
    // Skew: median (arrival - RTP time) of frames minus that of speech, over the last 5 s.
    let offsets = |v: Vec<(Instant, f64)>| -> f64 {
        let Some(&(last, _)) = v.last() else { return f64::NAN };
        let origin = peer.frames.first().map_or(last, |f| f.at);
        let tail: Vec<f64> = v
            .iter()
            .filter(|(at, _)| last.saturating_duration_since(*at) <= Duration::from_secs(5))
            .map(|(at, rtp)| at.saturating_duration_since(origin).as_secs_f64() - rtp)
            .collect();
        percentile(&tail, 50.0)
    };
    let video = offsets(peer.frames.iter().map(|f| (f.at, f.rtp_s)).collect());
    let audio = offsets(peer.speech.iter().map(|p| (p.at, p.rtp_s)).collect());
    let wire: Vec<f64> = m.interrupts.iter().map(|x| x.1).filter(|v| v.is_finite()).collect();
    let answered: Vec<f64> = m.interrupts.iter().map(|x| x.2).collect();
    // The first frame to arrive after each request (the eased one, when the wire had taken the
    // interrupt before its next frame).
    let arrival: Vec<f64> = m
        .interrupts
        .iter()
        .filter_map(|(asked, _, _)| {
            peer.frames.iter().find(|f| f.at > *asked).map(|f| (f.at - *asked).as_secs_f64() * 1e3)
        })
        .collect();
    let sent = stats["frames_sent"].as_u64().unwrap_or(0);
    let repeated = stats["repeated_frames"].as_u64().unwrap_or(0);
    Row {
        sessions: n,
        session: i,
        stride: created["stride"].as_u64().unwrap_or(0),
        stride_mode: stats["stride_mode"].as_str().unwrap_or("fixed").to_string(),
        final_stride: stats["stride"].as_u64().unwrap_or(0),
        stride_changes: stats["stride_changes"].as_u64().unwrap_or(0),
        delay_ms: created["delay_ms"].as_f64().unwrap_or(f64::NAN),
        seconds: a.seconds,
        chunks: m.chunks.len(),
        frames_received: peer.frames.len(),
        frames_sent: sent,
        repeated_frames: repeated,
        repeated_pct: if sent == 0 { 0.0 } else { 100.0 * repeated as f64 / sent as f64 },
        late_frames: stats["late_frames"].as_u64().unwrap_or(0),
        undecodable_frames: peer.undecodable,
        max_frame_gap_ms: peer.max_frame_gap_ms(),
        wire_max_frame_gap_ms: stats["max_frame_gap_ms"].as_f64().unwrap_or(f64::NAN),
        wire_max_encode_ms: stats["max_video_encode_ms"].as_f64().unwrap_or(f64::NAN),
        audio_to_mouth_p50_ms: percentile(&a2m, 50.0),
        audio_to_mouth_p95_ms: percentile(&a2m, 95.0),
        speech_wait_p50_ms: percentile(&waits, 50.0),
        speech_wait_p95_ms: percentile(&waits, 95.0),
        av_skew_ms: (video - audio) * 1e3,
        video_kbps,
        video_kbps_max_1s,
        interrupts: m.interrupts.len(),
        interrupt_wire_p95_ms: percentile(&wire, 95.0),
        interrupt_first_frame_p95_ms: percentile(&arrival, 95.0),
        interrupt_answer_p95_ms: percentile(&answered, 95.0),
        extra_session_status: extra_status,
    }
}
