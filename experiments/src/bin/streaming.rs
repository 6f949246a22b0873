//! Streaming render, measured: for clips of several lengths (synthetic speech-like audio with
//! pauses, generated in the run and written to a WAV), the windowed pipeline writing a
//! fragmented MP4 as it renders, reading the WAV as it goes.
//! Reports time to first frame, time to first fragment, steady-state throughput and real-time
//! factor, and peak resident memory; and, for comparison in the same run, the whole-clip render
//! (one window) of the same clips, and the live render (`cadence render --audio -`, the WAV read
//! as a stream whose length is unknown, fed as fast as it is read). Each render runs in its own
//! child process (this binary with `--child`), so that its peak memory is its own.
//! Writes results/streaming.csv (with provenance) and a plot.

use anyhow::{bail, ensure, Context, Result};
use cadence::frame_loop::audio::{ClipAudio, StreamedAudio};
use cadence::frame_loop::video::{Output, Sink};
use cadence::KeyframeSchedule;
use clap::Parser;
use experiments::plot::{line_plot_grid, LineChart, Series};
use experiments::session::{Inputs, Session, SessionArgs};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

#[derive(Parser, Clone)]
#[command(about = "Streaming render: time to first frame and fragment, throughput and peak memory against clip length")]
struct Args {
    /// Clip lengths in seconds.
    #[arg(long, default_value = "10,60,600", value_delimiter = ',')]
    lengths: Vec<f64>,
    /// Keyframe stride.
    #[arg(long, default_value_t = 3)]
    stride: usize,
    /// Render window in seconds.
    #[arg(long, default_value_t = cadence::frame_loop::DEFAULT_WINDOW_SECONDS)]
    window: f64,
    /// Whole-clip (one window) renders, for comparison, of the clips up to this many seconds
    /// (they hold the whole clip's audio features: 77 KB per frame, 1.2 GB for 600 s).
    #[arg(long, default_value_t = 60.0)]
    whole_max_seconds: f64,
    #[command(flatten)]
    out: experiments::OutDir,
    /// Runs of each mode for the clips compared with their whole-clip render (median kept).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    repeats: u32,
    /// Internal: render one clip of this many seconds in this process and print its row as JSON.
    #[arg(long, hide = true)]
    child: Option<f64>,
    /// Internal, with --child: render the clip as one window.
    #[arg(long, hide = true)]
    whole: bool,
    /// Internal, with --child: render the clip as a live stream ([`cadence::musetalk::live`]).
    #[arg(long, hide = true, conflicts_with = "whole")]
    live: bool,
    /// Skip the live renders.
    #[arg(long)]
    no_live: bool,
    /// Internal, with --child: the clip's WAV.
    #[arg(long, hide = true)]
    clip_wav: Option<PathBuf>,
    #[command(flatten)]
    session: SessionArgs,
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct Row {
    mode: String,
    clip_s: f64,
    frames: usize,
    stride: usize,
    window_s: f64,
    unet_evaluations: usize,
    /// From the start of preparation (engines loaded; the WAV opened or decoded from here on)
    /// to the first frame handed to the encoder.
    first_frame_ms: f64,
    /// ... to the first complete fragment written.
    first_fragment_ms: f64,
    /// One window's share of the steady-state render time: window frames / steady fps.
    window_render_ms: f64,
    /// Frames per second after the first fragment.
    steady_fps: f64,
    steady_rtf: f64,
    /// Frames per second over the whole render (preparation included): the median run's.
    end_to_end_fps: f64,
    /// Runs of this mode and clip, and the slowest and fastest of them.
    runs: usize,
    end_to_end_fps_min: f64,
    end_to_end_fps_max: f64,
    fragments: u64,
    bytes: u64,
    /// Peak resident memory of the render's process (VmHWM), engines included.
    peak_rss_mb: f64,
}

/// Speech-like audio at 16 kHz: a voiced harmonic source (120-180 Hz, with vibrato) shaped by
/// 4-5 Hz syllables, words of 0.3-0.9 s, a 0.6 s pause after every few words and a 2 s pause
/// every 20 s. Deterministic.
fn speech_like(seconds: f64) -> Vec<f32> {
    let sr = 16000.0;
    let n = (seconds * sr) as usize;
    let mut out = vec![0.0f32; n];
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut t = 0.3;
    let mut words = 0;
    while t < seconds {
        let len = 0.3 + 0.6 * rnd();
        let f0 = 120.0 + 60.0 * rnd();
        let syll = 4.0 + rnd();
        let (a, b) = ((t * sr) as usize, (((t + len) * sr) as usize).min(n));
        for (i, o) in out[a..b].iter_mut().enumerate() {
            let u = i as f64 / sr;
            let env =
                (std::f64::consts::PI * u / len).sin() * (0.55 + 0.45 * (2.0 * std::f64::consts::PI * syll * u).sin());
            let f = f0 * (1.0 + 0.02 * (2.0 * std::f64::consts::PI * 5.0 * u).sin());
            let v: f64 = (1..8).map(|h| (2.0 * std::f64::consts::PI * f * h as f64 * u).sin() / h as f64).sum();
            *o = (0.25 * env * v) as f32;
        }
        words += 1;
        t += len + 0.05;
        if words % 4 == 0 {
            t += 0.6;
        }
        if (t / 20.0).floor() != ((t - len - 0.65) / 20.0).floor() {
            t += 2.0;
        }
    }
    out
}

/// Writes 16 kHz mono 16-bit PCM.
fn write_wav_16k(path: &std::path::Path, samples: &[f32]) -> Result<()> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).with_context(|| format!("creating {}", path.display()))?;
    for &s in samples {
        w.write_sample((s.clamp(-1.0, 1.0) * 32767.0).round() as i16)?;
    }
    w.finalize().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// A sink that counts bytes (the stream goes nowhere: this measures the render).
struct Count(u64);
impl Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn child(a: &Args, seconds: f64) -> Result<Row> {
    if a.live {
        return live_child(a, seconds);
    }
    let mut session = Session::open(&a.session)?;
    let window = if a.whole { None } else { cadence::frame_loop::window_frames(a.window, session.opts.fps) };
    session.opts.window = window;
    let Session { inputs: Inputs { backend, opts, img, face, encoder, .. }, engines } = &session;
    let encoder = encoder.context("the streaming experiment needs the video encoder")?;
    let wav = a.clip_wav.as_deref().context("--child needs --clip-wav")?;
    let t0 = Instant::now();
    // The windowed render reads the WAV as it goes; the whole-clip render decodes it first.
    let audio: ClipAudio = if a.whole {
        cadence::frame_loop::audio::load_audio(wav, 3600.0)?.into()
    } else {
        StreamedAudio::open(wav, 3600.0, &opts.vad)?.into()
    };
    let prepared = cadence::musetalk::render::prepare(engines, backend, audio, img, *face, opts)?;
    let prepare_ms = t0.elapsed().as_secs_f64() * 1e3;
    let schedule = KeyframeSchedule::fixed_stride(prepared.frames, a.stride)?;
    let mut sink = Count(0);
    let mut frame_times = Vec::with_capacity(prepared.frames);
    let r = cadence::musetalk::render::render_clip(
        engines,
        backend,
        opts,
        &prepared,
        &schedule,
        Output::Fragmented { sink: Sink::Writer { out: &mut sink, name: "counter" }, encoder, pace: false },
        |d| {
            if d == 1 {
                frame_times.push(t0.elapsed().as_secs_f64());
            }
        },
    )?;
    let total_s = t0.elapsed().as_secs_f64();
    let video = r.video.context("no video statistics")?;
    let first_fragment_ms = prepare_ms + r.first_fragment_ms.unwrap_or(f64::NAN);
    // Steady state: the frames after the first fragment.
    let steady_fps = steady(&frame_times, first_fragment_ms);
    let window_s = if a.whole { seconds } else { a.window };
    Ok(Row {
        mode: if a.whole { "whole clip" } else { "windowed" }.into(),
        clip_s: seconds,
        frames: prepared.frames,
        stride: a.stride,
        window_s,
        unet_evaluations: r.stats.keyframes_evaluated,
        first_frame_ms: prepare_ms + r.first_frame_ms.unwrap_or(f64::NAN),
        first_fragment_ms,
        window_render_ms: 1e3 * window_s * opts.fps.hz() / steady_fps,
        steady_fps,
        steady_rtf: steady_fps / opts.fps.hz(),
        end_to_end_fps: prepared.frames as f64 / total_s,
        runs: 1,
        end_to_end_fps_min: prepared.frames as f64 / total_s,
        end_to_end_fps_max: prepared.frames as f64 / total_s,
        fragments: video.fragments,
        bytes: sink.0,
        peak_rss_mb: peak_rss_mb(),
    })
}

/// A live render of the clip: the WAV read as a stream of unknown length (as from a pipe),
/// rendered part by part as it is read.
fn live_child(a: &Args, seconds: f64) -> Result<Row> {
    let session = Session::open(&a.session)?;
    let Session { inputs: Inputs { backend, opts, img, face, encoder, .. }, engines } = &session;
    let encoder = encoder.context("the streaming experiment needs the video encoder")?;
    let wav = a.clip_wav.as_deref().context("--child needs --clip-wav")?;
    let live = cadence::frame_loop::live::LiveOptions::new(
        a.stride,
        cadence::frame_loop::window_frames(a.window, opts.fps),
        opts,
    )?;
    let t0 = Instant::now();
    let avatar = cadence::musetalk::render::prepare_avatar_image(engines, backend, img, *face, None)?;
    let file = std::fs::File::open(wav).with_context(|| format!("opening {}", wav.display()))?;
    // No length given: the reader cannot know where the stream ends, as with a pipe.
    let reader = cadence_media::wav::WavReader::new(std::io::BufReader::new(file), None)
        .map_err(|e| cadence_media::audio::wav_err("the clip", e))?;
    let input = cadence_media::AudioStream::new(reader, "the clip")?;
    let prepare_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut sink = Count(0);
    let mut frame_times = Vec::new();
    let r = cadence::musetalk::live::render_live(
        engines,
        backend,
        opts,
        live,
        &avatar,
        input,
        &mut sink,
        "counter",
        encoder,
        false,
        |_| frame_times.push(t0.elapsed().as_secs_f64()),
    )?;
    let total_s = t0.elapsed().as_secs_f64();
    let video = r.video.context("no video statistics")?;
    let first_fragment_ms = prepare_ms + r.first_fragment_ms.unwrap_or(f64::NAN);
    let steady_fps = steady(&frame_times, first_fragment_ms);
    let window_s = live.part_frames as f64 / opts.fps.hz();
    let frames = r.stats.frames;
    Ok(Row {
        mode: "live".into(),
        clip_s: seconds,
        frames,
        stride: a.stride,
        window_s,
        unet_evaluations: r.stats.keyframes_evaluated,
        first_frame_ms: prepare_ms + r.first_frame_ms.unwrap_or(f64::NAN),
        first_fragment_ms,
        window_render_ms: 1e3 * window_s * opts.fps.hz() / steady_fps,
        steady_fps,
        steady_rtf: steady_fps / opts.fps.hz(),
        end_to_end_fps: frames as f64 / total_s,
        runs: 1,
        end_to_end_fps_min: frames as f64 / total_s,
        end_to_end_fps_max: frames as f64 / total_s,
        fragments: video.fragments,
        bytes: sink.0,
        peak_rss_mb: peak_rss_mb(),
    })
}

/// The target on `rows` (one mode's, by clip length): the longest clip's peak memory within 10%
/// of the 60 s clip's (or of the shortest clip's when no 60 s clip ran).
fn memory_verdict(label: &str, rows: &[&Row]) -> Option<String> {
    let base = rows.iter().find(|r| r.clip_s == 60.0).or(rows.first())?;
    let last = rows.last()?;
    let growth = 100.0 * (last.peak_rss_mb / base.peak_rss_mb - 1.0);
    Some(format!(
        "{label}peak memory {:.0} MB at {} s vs {:.0} MB at {} s ({growth:+.1}%; target within 10%: {})",
        last.peak_rss_mb,
        last.clip_s,
        base.peak_rss_mb,
        base.clip_s,
        if growth.abs() <= 10.0 { "met" } else { "NOT MET" }
    ))
}

/// Frames per second after the first fragment (`frame_times`: seconds at which each frame left).
fn steady(frame_times: &[f64], first_fragment_ms: f64) -> f64 {
    let after = frame_times.iter().position(|&t| t * 1e3 >= first_fragment_ms).unwrap_or(0);
    if frame_times.len() > after + 1 {
        (frame_times.len() - 1 - after) as f64 / (frame_times[frame_times.len() - 1] - frame_times[after])
    } else {
        f64::NAN
    }
}

fn main() -> Result<()> {
    let mut a = Args::parse();
    // The clips are speech-like tones, which Silero rightly calls silence (every frame would be
    // bypassed): this experiment measures the render's streaming, so the energy detector, which
    // calls them speech, decides.
    a.session.vad.vad = cadence::args::VadKind::Energy;
    ensure!(a.stride > 0, "--stride must be at least 1");
    ensure!(a.window > 0.0 && a.window.is_finite(), "--window must be a positive number of seconds");
    ensure!(a.lengths.iter().all(|&l| l > 0.0 && l <= 3600.0), "--lengths must be seconds in (0, 3600]");
    if let Some(seconds) = a.child {
        let row = child(&a, seconds)?;
        println!("{}", serde_json::to_string(&row)?);
        return Ok(());
    }
    let out_dir = a.out.dir()?;
    // Provenance (commit and tree state at the start of the run) of the engines and inputs the
    // children use; loading them is cheap next to the renders.
    let session = Session::open(&a.session)?;
    let mut prov = session.provenance();
    drop(session);
    prov.note(
        "audio",
        "synthetic speech-like audio with pauses, generated in the run (speech_like), written as a 16 kHz 16-bit WAV; \
         windowed renders read it as they go, whole-clip renders decode it first (both timed from the WAV)",
    );
    prov.note("sink", "fragmented MP4 into a byte counter; each render in its own process");
    // The children get this run's arguments (engines, encoder, avatar ...) and one clip each.
    let passthrough: Vec<String> = std::env::args().skip(1).collect();
    let wav_dir = std::env::temp_dir().join(format!("cadence-streaming-{}", std::process::id()));
    std::fs::create_dir_all(&wav_dir).with_context(|| format!("creating {}", wav_dir.display()))?;
    let mut rows = Vec::new();
    for &seconds in &a.lengths {
        let wav = wav_dir.join(format!("clip-{seconds}s.wav"));
        write_wav_16k(&wav, &speech_like(seconds))?;
        // Clips compared with their whole-clip render run `repeats` times, alternating the two
        // modes (this VM's speed drifts), and each mode's median row (by end-to-end fps) is kept.
        let compared = seconds <= a.whole_max_seconds;
        let repeats = if compared { a.repeats as usize } else { 1 };
        let mut runs: [Vec<Row>; 3] = Default::default();
        for rep in 0..repeats {
            for (m, mode) in ["windowed", "whole clip", "live"].into_iter().enumerate() {
                let whole = mode == "whole clip";
                if (whole && !compared) || (mode == "live" && a.no_live) {
                    continue;
                }
                eprintln!("streaming: {seconds} s clip, {mode}, run {} of {repeats} ...", rep + 1);
                let mut cmd = Command::new(std::env::current_exe()?);
                cmd.args(&passthrough).args(["--child", &seconds.to_string()]).arg("--clip-wav").arg(&wav);
                if whole {
                    cmd.arg("--whole");
                }
                if mode == "live" {
                    cmd.arg("--live");
                }
                let o = cmd.stderr(std::process::Stdio::inherit()).output().context("running a render child")?;
                if !o.status.success() {
                    bail!("the {seconds} s {mode} render failed ({})", o.status);
                }
                let row: Row = serde_json::from_slice(o.stdout.trim_ascii()).context("the child's row")?;
                eprintln!(
                    "  {} frames: first frame {:.0} ms, first fragment {:.0} ms, {:.1} fps end to end, peak {:.0} MB",
                    row.frames, row.first_frame_ms, row.first_fragment_ms, row.end_to_end_fps, row.peak_rss_mb
                );
                runs[m].push(row);
            }
        }
        for mut r in runs {
            if r.is_empty() {
                continue;
            }
            r.sort_by(|a, b| a.end_to_end_fps.total_cmp(&b.end_to_end_fps));
            let n = r.len();
            let mut median = r[n / 2].clone();
            median.runs = n;
            median.end_to_end_fps_min = r[0].end_to_end_fps;
            median.end_to_end_fps_max = r[n - 1].end_to_end_fps;
            rows.push(median);
        }
        std::fs::remove_file(&wav).with_context(|| format!("removing {}", wav.display()))?;
    }
    let _ = std::fs::remove_dir(&wav_dir);
    let windowed: Vec<&Row> = rows.iter().filter(|r| r.mode == "windowed").collect();
    let whole: Vec<&Row> = rows.iter().filter(|r| r.mode == "whole clip").collect();
    let live: Vec<&Row> = rows.iter().filter(|r| r.mode == "live").collect();
    let mut verdicts = Vec::new();
    verdicts.extend(memory_verdict("", &windowed));
    for r in &windowed {
        let bound = 1.1 * r.window_render_ms;
        verdicts.push(format!(
            "{} s: first fragment {:.0} ms vs one window's render {:.0} ms + 10% ({})",
            r.clip_s,
            r.first_fragment_ms,
            r.window_render_ms,
            if r.first_fragment_ms <= bound { "met" } else { "NOT MET" }
        ));
        if let Some(w) = whole.iter().find(|w| w.clip_s == r.clip_s) {
            let ratio = r.end_to_end_fps / w.end_to_end_fps;
            verdicts.push(format!(
                "{} s: windowed {:.2} fps vs whole clip {:.2} fps end to end, medians of {} runs ({:.3}x; target within 5%: {})",
                r.clip_s,
                r.end_to_end_fps,
                w.end_to_end_fps,
                r.runs.min(w.runs),
                ratio,
                if ratio >= 0.95 { "met" } else { "NOT MET" }
            ));
        }
    }
    // The live render: memory flat in the stream's length too, and its throughput next to the
    // windowed render of the same clip (it encodes 30 s of whisper context per part, and renders
    // each part's last keyframe twice).
    verdicts.extend(memory_verdict("live: ", &live));
    for r in &live {
        if let Some(w) = windowed.iter().find(|w| w.clip_s == r.clip_s) {
            verdicts.push(format!(
                "{} s: live {:.2} fps vs windowed {:.2} fps end to end ({:.3}x), first fragment {:.0} ms",
                r.clip_s,
                r.end_to_end_fps,
                w.end_to_end_fps,
                r.end_to_end_fps / w.end_to_end_fps,
                r.first_fragment_ms
            ));
        }
    }
    for v in &verdicts {
        println!("{v}");
    }
    prov.note("verdicts", verdicts.join("; "));
    let csv = out_dir.join("streaming.csv");
    experiments::csvout::write_csv(&csv, &prov, &rows)?;
    let chart = |title: &str, y: &str, value: fn(&Row) -> f64| {
        let mut c = LineChart::new(title, "clip length (s)", y).log_x();
        for (name, sel) in [("windowed", &windowed), ("whole clip", &whole), ("live", &live)] {
            if !sel.is_empty() {
                c = c.series(Series::new(name, sel.iter().map(|r| (r.clip_s, value(r))).collect()));
            }
        }
        c
    };
    let charts = [
        chart("Peak resident memory", "MB", |r| r.peak_rss_mb),
        chart("Time to first fragment", "seconds", |r| r.first_fragment_ms / 1e3),
    ];
    let title = format!("Streaming render (stride {}, window {} s)", a.stride, a.window);
    let plots = line_plot_grid(&out_dir.join("streaming"), &title, &charts, 2, &prov)?;
    eprintln!("wrote {}, {}, {}", csv.display(), plots.png.display(), plots.svg.display());
    Ok(())
}
