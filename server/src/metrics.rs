//! Prometheus metrics in the text exposition format (version 0.0.4), written by hand: a dozen
//! series whose values the server already holds, so a metrics library with a process-global
//! recorder would add dependencies and hidden state for nothing, and servers started side by
//! side in one process (the tests) keep separate counts.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    rejections: Mutex<BTreeMap<&'static str, u64>>,
    renders: Mutex<BTreeMap<&'static str, u64>>,
    frames: AtomicU64,
    render: Mutex<RenderSeries>,
    avatar_preparations: AtomicU64,
    avatar_cache_hits: AtomicU64,
    fleet_redeliveries: AtomicU64,
    sessions_started: AtomicU64,
    streamed: Mutex<BTreeMap<&'static str, u64>>,
    first_byte: Mutex<Histogram>,
}

/// Upper bounds (seconds) of the time-to-first-byte histogram's buckets: a streamed response's
/// first segment waits for the upload, the queue, the avatar and the first render window.
pub const FIRST_BYTE_BUCKETS: [f64; 12] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0];

/// A Prometheus histogram over [`FIRST_BYTE_BUCKETS`]: counts per bucket (not cumulative; the
/// text adds them up), their sum and count.
#[derive(Default)]
struct Histogram {
    counts: [u64; FIRST_BYTE_BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct RenderSeries {
    seconds_total: f64,
    last_fps: f64,
    /// Frames per second of each engine in the last render that ran it.
    engine_fps: BTreeMap<&'static str, f64>,
    /// Exponentially weighted mean render time, for Retry-After.
    mean_seconds: Option<f64>,
}

/// Values the server holds elsewhere, read when the metrics are scraped.
pub struct Gauges {
    pub ready: bool,
    pub slots: usize,
    pub running: usize,
    pub queued: usize,
    pub avatars: usize,
    /// Records in the job table by state.
    pub jobs: [(&'static str, usize); 5],
    /// The fleet's queue, with `--nats` (when NATS answered).
    pub fleet: Option<crate::fleet::QueueState>,
    /// Live WebRTC sessions running.
    pub sessions: usize,
}

impl Metrics {
    pub fn request(&self, route: &str, status: u16) {
        *self.requests.lock().unwrap().entry((route.to_string(), status)).or_default() += 1;
    }

    pub fn rejection(&self, reason: &'static str) {
        *self.rejections.lock().unwrap().entry(reason).or_default() += 1;
    }

    /// A finished render: `outcome` is ok, failed or cancelled.
    pub fn render_outcome(&self, outcome: &'static str) {
        *self.renders.lock().unwrap().entry(outcome).or_default() += 1;
    }

    pub fn rendered(&self, frames: usize, seconds: f64, engine_fps: &[(&'static str, f64)]) {
        self.frames.fetch_add(frames as u64, Ordering::Relaxed);
        let mut r = self.render.lock().unwrap();
        r.seconds_total += seconds;
        r.last_fps = frames as f64 / seconds.max(1e-9);
        for &(engine, fps) in engine_fps.iter().filter(|(_, f)| f.is_finite()) {
            r.engine_fps.insert(engine, fps);
        }
        r.mean_seconds = Some(r.mean_seconds.map_or(seconds, |m| 0.8 * m + 0.2 * seconds));
    }

    /// A streamed render (`stream=fmp4`) that ended: `outcome` is ok, failed or cancelled.
    pub fn streamed(&self, outcome: &'static str) {
        *self.streamed.lock().unwrap().entry(outcome).or_default() += 1;
    }

    /// A streamed response's time to first byte: from the request's arrival to its first
    /// segment handed to the connection.
    pub fn first_byte(&self, seconds: f64) {
        let mut h = self.first_byte.lock().unwrap();
        if let Some(i) = FIRST_BYTE_BUCKETS.iter().position(|&b| seconds <= b) {
            h.counts[i] += 1;
        }
        h.sum += seconds;
        h.count += 1;
    }

    /// A live session started.
    pub fn session_started(&self) {
        self.sessions_started.fetch_add(1, Ordering::Relaxed);
    }

    pub fn avatar_prepared(&self) {
        self.avatar_preparations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn avatar_cache_hit(&self) {
        self.avatar_cache_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Mean render time so far (seconds), if any render finished.
    pub fn fleet_redelivery(&self) {
        self.fleet_redeliveries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn mean_render_seconds(&self) -> Option<f64> {
        self.render.lock().unwrap().mean_seconds
    }

    pub fn render_text(&self, g: &Gauges) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, String)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let plain = |v: String| vec![(String::new(), v)];
        let requests = self.requests.lock().unwrap().clone();
        family(
            "cadence_http_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
            requests
                .iter()
                .map(|((route, status), n)| {
                    (labels(&[("route", route), ("status", &status.to_string())]), n.to_string())
                })
                .collect(),
        );
        let rejections = self.rejections.lock().unwrap().clone();
        family(
            "cadence_rejections_total",
            "counter",
            "Requests refused before any engine work, by reason.",
            rejections.iter().map(|(r, n)| (labels(&[("reason", r)]), n.to_string())).collect(),
        );
        let renders = self.renders.lock().unwrap().clone();
        family(
            "cadence_renders_total",
            "counter",
            "Renders that ended, by outcome (ok, failed, cancelled).",
            renders.iter().map(|(o, n)| (labels(&[("outcome", o)]), n.to_string())).collect(),
        );
        family(
            "cadence_rendered_frames_total",
            "counter",
            "Video frames rendered.",
            plain(self.frames.load(Ordering::Relaxed).to_string()),
        );
        let (seconds, last_fps, engine_fps) = {
            let r = self.render.lock().unwrap();
            (r.seconds_total, r.last_fps, r.engine_fps.clone())
        };
        family("cadence_render_seconds_total", "counter", "Seconds spent rendering.", plain(num(seconds)));
        family(
            "cadence_render_fps",
            "gauge",
            "Frames per second of the last render, end to end.",
            plain(num(last_fps)),
        );
        family(
            "cadence_engine_fps",
            "gauge",
            "Frames per second of each engine in the last render that ran it.",
            engine_fps.iter().map(|(e, f)| (labels(&[("engine", e)]), num(*f))).collect(),
        );
        let streamed = self.streamed.lock().unwrap().clone();
        family(
            "cadence_streamed_renders_total",
            "counter",
            "Streamed renders (stream=fmp4) that ended, by outcome (ok, failed, cancelled).",
            streamed.iter().map(|(o, n)| (labels(&[("outcome", o)]), n.to_string())).collect(),
        );
        let (mut samples, name) = (Vec::new(), "cadence_time_to_first_byte_seconds");
        {
            let h = self.first_byte.lock().unwrap();
            let mut cumulative = 0;
            for (bound, n) in FIRST_BYTE_BUCKETS.iter().zip(h.counts) {
                cumulative += n;
                samples.push((format!("_bucket{}", labels(&[("le", &num(*bound))])), cumulative.to_string()));
            }
            samples.push((format!("_bucket{}", labels(&[("le", "+Inf")])), h.count.to_string()));
            samples.push(("_sum".into(), num(h.sum)));
            samples.push(("_count".into(), h.count.to_string()));
        }
        family(
            name,
            "histogram",
            "Streamed responses: seconds from the request's arrival to its first segment sent.",
            samples,
        );
        family("cadence_render_slots", "gauge", "Render slots.", plain(g.slots.to_string()));
        family("cadence_renders_running", "gauge", "Render slots in use.", plain(g.running.to_string()));
        family("cadence_queue_depth", "gauge", "Requests waiting for a render slot.", plain(g.queued.to_string()));
        family(
            "cadence_avatar_preparations_total",
            "counter",
            "Avatar preparations (crop, image encoder, rest latent, compositor).",
            plain(self.avatar_preparations.load(Ordering::Relaxed).to_string()),
        );
        family(
            "cadence_avatar_cache_hits_total",
            "counter",
            "Renders that reused a prepared avatar.",
            plain(self.avatar_cache_hits.load(Ordering::Relaxed).to_string()),
        );
        family("cadence_avatars", "gauge", "Prepared avatars in the cache.", plain(g.avatars.to_string()));
        family("cadence_sessions", "gauge", "Live WebRTC sessions running.", plain(g.sessions.to_string()));
        family(
            "cadence_sessions_started_total",
            "counter",
            "Live WebRTC sessions started.",
            plain(self.sessions_started.load(Ordering::Relaxed).to_string()),
        );
        family(
            "cadence_jobs",
            "gauge",
            "Records in the job table (jobs and streamed renders), by state.",
            g.jobs.iter().map(|(s, n)| (labels(&[("state", s)]), n.to_string())).collect(),
        );
        if let Some(q) = g.fleet {
            family(
                "cadence_fleet_jobs_queued",
                "gauge",
                "Jobs in the fleet's queue not yet taken by a replica (the whole fleet).",
                plain(q.queued.to_string()),
            );
            family(
                "cadence_fleet_jobs_running",
                "gauge",
                "Jobs taken by a replica and not yet ended (the whole fleet).",
                plain(q.running.to_string()),
            );
            family(
                "cadence_fleet_jobs_redelivered",
                "gauge",
                "Jobs delivered more than once (their replica stopped) and not yet ended (the whole fleet).",
                plain(q.redelivered.to_string()),
            );
        }
        family(
            "cadence_fleet_redeliveries_total",
            "counter",
            "Fleet jobs this replica took after another replica stopped with them.",
            plain(self.fleet_redeliveries.load(Ordering::Relaxed).to_string()),
        );
        family("cadence_ready", "gauge", "1 when the server accepts renders.", plain(u8::from(g.ready).to_string()));
        out
    }
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "NaN".into()
    }
}

/// `{a="x",b="y"}` with the values escaped as the format requires.
fn labels(pairs: &[(&str, &str)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")))
        .collect();
    format!("{{{}}}", body.join(","))
}
