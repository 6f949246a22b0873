//! `cadence serve`'s flags, and the checked configuration the server runs with.

use anyhow::{ensure, Result};
use cadence::args::{parse_seconds, EngineArgs};
use cadence::BackendChoice;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The environment variable that holds the bearer token when `--token` is not given (a flag
/// would show in the process list).
pub const TOKEN_ENV: &str = "CADENCE_TOKEN";

#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default: put a proxy in front to expose it).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Bearer token every route but /healthz and /readyz requires (else $CADENCE_TOKEN; none:
    /// no authentication).
    #[arg(long)]
    pub token: Option<String>,
    /// Renders (and avatar preparations) that run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub slots: u32,
    /// Worker threads of each slot's render (0: one per core, as a `cadence render` process
    /// has). Every slot has threads of its own; lower this when slots x threads oversubscribes
    /// the cores more than you want.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub slot_threads: u32,
    /// Requests that may wait for a slot; beyond them, 429 with Retry-After.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub queue: u32,
    /// Largest request body, in MiB (uploads count byte by byte while they stream to disk).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_body_mb: u64,
    /// Longest audio a request may send, in seconds (checked from the WAV header).
    #[arg(long, default_value = "120", value_parser = parse_seconds)]
    pub max_seconds: f64,
    /// Largest avatar image, in pixels (width x height, checked from the image header).
    #[arg(long, default_value_t = 3840 * 2160, value_parser = clap::value_parser!(u64).range(4096..))]
    pub max_pixels: u64,
    /// Largest video avatar, in MiB decoded: its frames x width x height x 3 bytes of RGB,
    /// computed from the container before any frame is decoded (the decoding a request may ask
    /// for). The CLI's own limits apply too: 1000 frames, 1 GiB of per-frame render tables.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_avatar_mb: u64,
    /// Prepared avatars kept in memory (least recently used evicted first).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub avatar_cache: u32,
    /// Avatar used when a request sends none [default: the bundled anchor portrait].
    #[arg(long)]
    pub default_avatar: Option<PathBuf>,
    /// Parent of the per-request temporary directories [default: $TMPDIR/cadence-serve].
    #[arg(long)]
    pub temp_dir: Option<PathBuf>,
    /// Where jobs' MP4s are kept until they expire [default: a temporary directory, removed at
    /// exit]. One server per directory: files named like job ids found there at start are
    /// removed (no job table holds them).
    #[arg(long)]
    pub jobs_dir: Option<PathBuf>,
    /// Seconds a finished job (its record and its MP4) is kept.
    #[arg(long, default_value = "3600", value_parser = parse_seconds)]
    pub job_ttl_seconds: f64,
    /// Records the job table holds (jobs and streamed renders, until they expire); beyond: 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_jobs: u32,
    /// Seconds a connection has to send a whole request head (request line and headers) once it
    /// opens or its previous answer is sent; past it the connection is closed (a client sending
    /// its headers a line a second held one for as long as it liked). Also the keep-alive idle
    /// time.
    #[arg(long, default_value = "30", value_parser = parse_seconds)]
    pub header_timeout_seconds: f64,
    /// Seconds a request body has at first; each --body-min-rate bytes received give it one
    /// more (Apache mod_reqtimeout's rule), up to --body-max-seconds. A body slower than that
    /// is answered 408 and its connection closed.
    #[arg(long, default_value = "30", value_parser = parse_seconds)]
    pub body_timeout_seconds: f64,
    /// Bytes per second a request body must keep up (see --body-timeout-seconds).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_min_rate: u64,
    /// Longest a request body may take, however fast it comes.
    #[arg(long, default_value = "600", value_parser = parse_seconds)]
    pub body_max_seconds: f64,
    /// A fleet's NATS server (else $CADENCE_NATS), e.g. nats://127.0.0.1:4222: `/v1/jobs` go to
    /// its JetStream work queue, any replica's worker renders them when it has a free slot, and
    /// every replica answers for every job (server/README.md, the fleet). Needs nats-server 2.10
    /// or later with JetStream (`-js`). Without it, jobs stay in this process.
    #[arg(long)]
    pub nats: Option<String>,
    /// This replica's name in the fleet, shown in its jobs [default: host name and process id].
    #[arg(long)]
    pub replica_name: Option<String>,
    /// Seconds without a heartbeat after which a fleet job is taken for lost (its replica died)
    /// and delivered to another replica. A running render beats every third of it (and at
    /// least every second, writing its progress).
    #[arg(long, default_value = "30", value_parser = parse_seconds)]
    pub fleet_ack_wait_seconds: f64,
    /// Deliveries of a fleet job before it is given up.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i64).range(1..=100))]
    pub fleet_max_deliver: i64,
    /// Jobs that may wait in the fleet's queue (posted, not yet taken by a replica), counted for
    /// the whole fleet; beyond them, 429 with Retry-After. Replicas check the count when a job
    /// arrives: jobs posted at the same instant to different replicas may pass it by as many.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub fleet_max_queued: u32,
    /// On SIGTERM/SIGINT, how long in-flight renders may finish before they are cancelled.
    #[arg(long, default_value = "30", value_parser = parse_seconds)]
    pub drain_seconds: f64,
    /// Render in windows of this many seconds (as `cadence render --window`): a streamed
    /// response's first segment waits for the first window, and the frames in flight are bounded by it. The
    /// video is the same whatever the window; `0` renders the clip as one window.
    #[arg(long, default_value_t = cadence::frame_loop::DEFAULT_WINDOW_SECONDS, value_parser = cadence::args::parse_window_seconds)]
    pub window: f64,
    /// Where cadence's kernels run (expansion, easing, compositing + NV12).
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// `--decoder` is the decoder loaded at start; a request for the other one loads it once,
    /// on first use.
    #[command(flatten)]
    pub engines: EngineArgs,
    #[command(flatten)]
    pub vad: cadence::args::VadArgs,
    #[command(flatten)]
    pub sessions: SessionArgs,
}

/// The flags of live WebRTC sessions (`/v1/sessions`).
#[derive(clap::Args, Clone, Debug)]
pub struct SessionArgs {
    /// Live WebRTC sessions that run at once; beyond them, 429. Each renders continuously
    /// (silence cheaply: no network runs) beside the render slots.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub max_sessions: u32,
    /// A session that was silent and sent no audio for this long ends.
    #[arg(long, default_value = "300", value_parser = parse_seconds)]
    pub session_idle_seconds: f64,
    /// Seconds of speech a session may hold queued and not yet sent; beyond, 429.
    #[arg(long, default_value = "120", value_parser = parse_seconds)]
    pub session_max_queued_seconds: f64,
    /// Milliseconds the wire runs behind the render's part and lookahead, for the render's own
    /// time: raise it when sessions repeat frames on a slow machine. The default keeps audio to
    /// mouth under 1 s at the default stride (a delay of 0.94 s, docs/live.md).
    #[arg(long, default_value_t = DEFAULT_SESSION_MARGIN_MS, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub session_margin_ms: u64,
    /// Seconds without a packet from a connected peer after which its session ends (browsers
    /// send ICE consent checks every few seconds).
    #[arg(long, default_value = "15", value_parser = parse_seconds)]
    pub session_peer_timeout_seconds: f64,
    /// The video bit rate a session aims at, in kb/s.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(100..=50_000))]
    pub session_video_kbps: u32,
    /// Voice activity in sessions: `digital` (the default: the session writes silence where no
    /// speech was queued, so a frame is silence when its samples are all zero, decided with no
    /// lookahead; pauses inside the speech sent are rendered as speech), or `silero` / `energy`
    /// (they bypass those pauses too, with --vad-*'s settings, but delay every frame by their
    /// lookahead: 0.48 s / 0.25 s against whisper's 0.12 s). docs/live.md.
    #[arg(long, value_enum, default_value = "digital")]
    pub session_vad: cadence::args::VadKind,
    /// The address peers reach this host at, when it differs from the listen address (1:1 NAT,
    /// a cloud VM's public IP): announced as an ICE candidate. There is no TURN: peers behind
    /// symmetric NAT need a TURN server in front (server/README.md).
    #[arg(long)]
    pub webrtc_public_ip: Option<std::net::IpAddr>,
    /// The UDP ports sessions take theirs from, e.g. 40000-40100 [default: any free port].
    #[arg(long, value_parser = parse_port_range)]
    pub webrtc_ports: Option<(u16, u16)>,
}

/// `A-B`, two ports with A <= B.
fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s.split_once('-').ok_or_else(|| format!("{s:?}: expected FIRST-LAST, e.g. 40000-40100"))?;
    let port = |v: &str| v.trim().parse::<u16>().map_err(|_| format!("{v:?} is not a port (1-65535)"));
    let (a, b) = (port(a)?, port(b)?);
    if a == 0 || a > b {
        return Err(format!("{s:?}: the first port must be 1 or more and at most the last"));
    }
    Ok((a, b))
}

/// `--session-margin-ms`'s default: with the default stride's part (8 frames), its keyframe and
/// the lookahead of digital silence (the 4-frame ramp), a delay of (8 + 1 + 4) / 25 s + 0.42 s
/// = 0.94 s.
pub const DEFAULT_SESSION_MARGIN_MS: u64 = 420;

/// The checked session settings.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub max_sessions: usize,
    pub idle: Duration,
    pub max_queued_seconds: f64,
    pub margin: Duration,
    pub peer_timeout: Duration,
    pub video_bitrate_bps: u32,
    pub vad: cadence::args::VadKind,
    pub public_ip: Option<std::net::IpAddr>,
    pub ports: Option<(u16, u16)>,
}

impl SessionArgs {
    fn config(&self) -> SessionConfig {
        SessionConfig {
            max_sessions: self.max_sessions as usize,
            idle: Duration::from_secs_f64(self.session_idle_seconds),
            max_queued_seconds: self.session_max_queued_seconds,
            margin: Duration::from_millis(self.session_margin_ms),
            peer_timeout: Duration::from_secs_f64(self.session_peer_timeout_seconds),
            video_bitrate_bps: self.session_video_kbps * 1000,
            vad: self.session_vad,
            public_ip: self.webrtc_public_ip,
            ports: self.webrtc_ports,
        }
    }
}

/// The bundled anchor portrait (1080x1920), the avatar of a request that sends none.
pub const BUNDLED_AVATAR: &[u8] = include_bytes!("../../experiments/assets/anchor_1080x1920.png");

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub token: Option<String>,
    pub slots: usize,
    /// `--slot-threads` (0: one per core).
    pub slot_threads: usize,
    pub queue: usize,
    pub max_body_bytes: usize,
    pub max_seconds: f64,
    pub max_pixels: u64,
    /// `--max-avatar-mb` in bytes.
    pub max_avatar_bytes: u64,
    pub avatar_cache: usize,
    pub default_avatar: Vec<u8>,
    pub temp_root: PathBuf,
    pub drain: Duration,
    pub jobs_dir: Option<PathBuf>,
    pub job_ttl: Duration,
    pub max_jobs: usize,
    /// `--header-timeout-seconds`.
    pub header_timeout: Duration,
    /// `--body-timeout-seconds`, `--body-min-rate`, `--body-max-seconds`.
    pub body_timeout: BodyTimeout,
    /// `--nats` and the fleet's settings; `None`: a single replica.
    pub fleet: Option<crate::fleet::FleetConfig>,
    /// Render window in seconds (0: the whole clip).
    pub window_seconds: f64,
    pub backend: BackendChoice,
    pub engines: EngineArgs,
    /// Which detector decides a render's voice activity when its request names none (`--vad`,
    /// Silero by default), and Silero's thresholds.
    pub vad: cadence::args::VadArgs,
    /// Live sessions' settings.
    pub sessions: SessionConfig,
}

impl ServeArgs {
    /// The configuration, with the token from the environment when no flag gives one.
    pub fn config(self) -> Result<Config> {
        let token = self.token.or_else(|| std::env::var(TOKEN_ENV).ok()).filter(|t| !t.is_empty());
        if let Some(t) = &token {
            ensure!(t.chars().all(|c| c.is_ascii_graphic()), "the token must be printable ASCII without spaces");
        }
        let default_avatar = match &self.default_avatar {
            Some(p) => std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
            None => BUNDLED_AVATAR.to_vec(),
        };
        let max_body_bytes = usize::try_from(self.max_body_mb << 20)?;
        let nats = self.nats.or_else(|| std::env::var(NATS_ENV).ok()).filter(|u| !u.is_empty());
        let fleet = nats.map(|url| crate::fleet::FleetConfig {
            url,
            replica: self.replica_name.clone().unwrap_or_else(default_replica_name),
            ack_wait: Duration::from_secs_f64(self.fleet_ack_wait_seconds),
            max_deliver: self.fleet_max_deliver,
            max_queued: self.fleet_max_queued as u64,
            ttl: Duration::from_secs_f64(self.job_ttl_seconds),
        });
        Ok(Config {
            listen: self.listen,
            token,
            slots: self.slots as usize,
            slot_threads: self.slot_threads as usize,
            queue: self.queue as usize,
            max_body_bytes,
            max_seconds: self.max_seconds,
            max_pixels: self.max_pixels,
            max_avatar_bytes: self.max_avatar_mb << 20,
            avatar_cache: self.avatar_cache as usize,
            default_avatar,
            temp_root: self.temp_dir.unwrap_or_else(|| std::env::temp_dir().join("cadence-serve")),
            drain: Duration::from_secs_f64(self.drain_seconds),
            jobs_dir: self.jobs_dir,
            job_ttl: Duration::from_secs_f64(self.job_ttl_seconds),
            max_jobs: self.max_jobs as usize,
            header_timeout: Duration::from_secs_f64(self.header_timeout_seconds),
            body_timeout: BodyTimeout {
                initial: Duration::from_secs_f64(self.body_timeout_seconds),
                min_rate: self.body_min_rate,
                max: Duration::from_secs_f64(self.body_max_seconds.max(self.body_timeout_seconds)),
            },
            fleet,
            window_seconds: self.window,
            backend: self.backend,
            engines: self.engines,
            vad: self.vad,
            sessions: self.sessions.config(),
        })
    }
}

/// The environment variable that names the fleet's NATS server when `--nats` does not.
pub const NATS_ENV: &str = "CADENCE_NATS";

/// The host's name and this process's id.
fn default_replica_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "cadence".to_string() } else { host };
    format!("{host}-{}", std::process::id())
}

/// How long a request body may take to arrive: `initial`, plus a second for every `min_rate`
/// bytes received, at most `max` (Apache mod_reqtimeout's `body=initial-max,MinRate=min_rate`).
/// A body that keeps coming at `min_rate` is never cut short before `max`; one that trickles
/// (a byte a second) is, after about `initial`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BodyTimeout {
    pub initial: Duration,
    pub min_rate: u64,
    pub max: Duration,
}

impl BodyTimeout {
    /// The time a body has once `received` bytes of it came.
    pub fn allowed(&self, received: u64) -> Duration {
        (self.initial + Duration::from_secs_f64(received as f64 / self.min_rate as f64)).min(self.max)
    }
}

impl Config {
    /// The bounds on an avatar a client sends.
    pub fn avatar_limits(&self) -> crate::validate::AvatarLimits {
        crate::validate::AvatarLimits { max_pixels: self.max_pixels, max_decoded_bytes: self.max_avatar_bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::BodyTimeout;
    use std::time::Duration;

    #[test]
    fn port_ranges_parse_and_bad_ones_say_why() {
        assert_eq!(super::parse_port_range("40000-40100"), Ok((40000, 40100)));
        assert_eq!(super::parse_port_range("5-5"), Ok((5, 5)));
        for bad in ["40000", "0-10", "10-5", "a-b", "1-70000"] {
            assert!(super::parse_port_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_body_earns_a_second_per_min_rate_bytes_up_to_the_maximum() {
        let t = BodyTimeout { initial: Duration::from_secs(20), min_rate: 500, max: Duration::from_secs(60) };
        assert_eq!(t.allowed(0), Duration::from_secs(20));
        assert_eq!(t.allowed(5_000), Duration::from_secs(30));
        assert_eq!(t.allowed(10_000_000), Duration::from_secs(60));
    }
}
