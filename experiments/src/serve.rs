//! What the server experiments (`server_load`, `fleet_load`) share: `cadence serve` as a child
//! process, concurrent clients, the inputs they send (a clip of the bundled speech, synthetic
//! portraits) and the checks of what comes back.

use anyhow::{bail, ensure, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `cadence serve` running as a child process on a loopback port read from its log.
pub struct ServerProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its log (stderr, `RUST_LOG=info`), kept for when something fails.
    pub log: PathBuf,
}

impl ServerProcess {
    /// Starts `cadence serve --listen 127.0.0.1:0 --device cpu ARGS` with the environment
    /// `env` (and without `$CADENCE_MODELS`: synthetic weights), its log written to `log`;
    /// returns once `/readyz` answers 200.
    pub fn start(cadence: &Path, args: &[String], env: &[(&str, &str)], log: PathBuf) -> Result<ServerProcess> {
        let mut child = Command::new(cadence)
            .args(["serve", "--listen", "127.0.0.1:0", "--device", "cpu"])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .env_remove("CADENCE_MODELS")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} serve", cadence.display()))?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped"));
        let mut file = std::fs::File::create(&log)?;
        let mut addr = None;
        let mut line = String::new();
        while addr.is_none() && lines.read_line(&mut line)? > 0 {
            file.write_all(line.as_bytes())?;
            addr =
                line.split("listening on http://").nth(1).and_then(|a| a.split_whitespace().next()).map(str::to_string);
            line.clear();
        }
        let Some(addr) = addr else {
            let _ = child.kill();
            bail!("the server exited without listening (its log: {})", log.display());
        };
        // The rest of the log, kept (an unread pipe would block the server once full).
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut lines, &mut file);
        });
        let s = ServerProcess { child, base: format!("http://{addr}"), log };
        let t = Instant::now();
        let http = reqwest::blocking::Client::new();
        while http.get(format!("{}/readyz", s.base)).send().map(|r| r.status().as_u16()).ok() != Some(200) {
            ensure!(t.elapsed() < Duration::from_secs(300), "the server did not become ready ({})", s.log.display());
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(s)
    }

    /// Resident memory of the server process (VmRSS), in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .context("reading the server's /proc status (resident memory is read on Linux)")?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS line in /proc/<pid>/status")
    }

    /// SIGTERM (the server drains and exits), then waits.
    pub fn stop(mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let t = Instant::now();
        while self.child.try_wait()?.is_none() {
            if t.elapsed() > Duration::from_secs(60) {
                self.child.kill()?;
                bail!("the server did not stop within 60 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// SIGKILL, as a crash: nothing is drained.
    pub fn kill(mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for ServerProcess {
    /// A server left behind by an error is killed, not orphaned.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `cadence` binary beside this one (`cargo build --release -p cadence-cli` builds it).
fn default_cadence() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("this binary's directory")?;
    // target/release/<experiment>, or target/release/deps/<test> when a test runs it.
    let beside = [dir.join("cadence"), dir.join("../cadence")];
    beside.into_iter().find(|p| p.is_file()).with_context(|| {
        format!(
            "no cadence binary beside {} (build it with `cargo build --release -p cadence-cli`, or pass --cadence)",
            exe.display()
        )
    })
}

/// Provenance of a run against servers whose `/v1/info` gave `engines` (its `engines` object):
/// their backend, profile, weights and device, and the CPU loops' dispatch (the servers are this
/// build's `cadence` on this machine: the same dispatch as this process).
pub fn server_provenance(engines: &serde_json::Value) -> crate::Provenance {
    let as_str = |v: &serde_json::Value| v.as_str().unwrap_or("unknown").to_string();
    let mut prov = crate::Provenance::gather(
        as_str(&engines["backend"]),
        as_str(&engines["profile"]),
        as_str(&engines["weights"]),
    );
    prov.note(crate::provenance::ENGINE_DEVICE_KEY, as_str(&engines["device"]));
    prov.note("cpu_loops", cadence_engines::isa::describe());
    prov
}

/// The `cadence` binary: `given` (`--cadence`), else the one beside this binary.
pub fn cadence_binary(given: &Option<PathBuf>) -> Result<PathBuf> {
    let cadence = match given {
        Some(p) => p.clone(),
        None => default_cadence()?,
    };
    ensure!(cadence.is_file(), "{}: no such binary (--cadence)", cadence.display());
    Ok(cadence)
}

/// A target's verdict, as the experiments print and write it.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT MET"
    }
}

/// `jobs` (indices) run by `clients` threads, each taking the next index; the outcomes, and the
/// wall time.
pub fn drive<T: Send>(clients: usize, jobs: Vec<usize>, f: impl Fn(usize) -> Vec<T> + Sync) -> (Vec<T>, f64) {
    let next = AtomicUsize::new(0);
    let out = Mutex::new(Vec::new());
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                let Some(&i) = jobs.get(k) else { break };
                let o = f(i);
                out.lock().unwrap().extend(o);
            });
        }
    });
    (out.into_inner().unwrap(), t.elapsed().as_secs_f64())
}

/// Nearest-rank percentile of `v` (sorted here), NaN when empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

/// Video frames of a progressive MP4 (probed), or why it is not one with `want` frames.
pub fn check_mp4(body: &[u8], want: usize, scratch: &Path) -> std::result::Result<usize, String> {
    let p = scratch.join(format!("check-{:?}.mp4", std::thread::current().id()));
    std::fs::write(&p, body).map_err(|e| e.to_string())?;
    let info = cadence_media::probe(&p).map_err(|e| format!("the MP4 does not parse: {e}"));
    let _ = std::fs::remove_file(&p);
    let info = info?;
    if info.video_codec != "h264" || info.frames as usize != want {
        return Err(format!("{} frames of {}, expected {want} of h264", info.frames, info.video_codec));
    }
    Ok(want)
}

/// A `w` x `h` portrait (smooth gradients; `variant` shifts them), as PNG bytes.
pub fn portrait(w: u32, h: u32, variant: u32, dir: &Path) -> Result<Vec<u8>> {
    let mut raw = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            raw.extend([(x * 255 / w) as u8, (y * 255 / h) as u8, (((x + y + 40 * variant) * 3) % 256) as u8]);
        }
    }
    let img = cadence_media::RgbImage::from_raw(w, h, raw).expect("w x h x 3 bytes");
    let p = dir.join(format!("portrait{variant}.png"));
    img.save(&p).with_context(|| format!("writing {}", p.display()))?;
    Ok(std::fs::read(&p)?)
}

/// The first `seconds` of `src` as a WAV of its own.
pub fn write_clip(src: &Path, seconds: f64, dst: &Path) -> Result<()> {
    let mut r = hound::WavReader::open(src).with_context(|| format!("reading {}", src.display()))?;
    let spec = r.spec();
    ensure!(
        spec.sample_format == hound::SampleFormat::Int && spec.bits_per_sample == 16,
        "{}: not 16-bit PCM",
        src.display()
    );
    let n = (seconds * spec.sample_rate as f64) as usize * spec.channels as usize;
    let samples: Vec<i16> = r.samples::<i16>().take(n).collect::<std::result::Result<_, _>>()?;
    ensure!(samples.len() == n, "{} is shorter than {seconds} s", src.display());
    let mut w = hound::WavWriter::create(dst, spec)?;
    for s in samples {
        w.write_sample(s)?;
    }
    w.finalize()?;
    Ok(())
}

/// A multipart file part.
pub fn file_part(bytes: Vec<u8>, name: &str, mime: &str) -> reqwest::blocking::multipart::Part {
    reqwest::blocking::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str(mime).expect("a MIME type")
}

pub fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
