//! Where a result came from: code version, time, machine, backend, engines and weights. Every
//! CSV carries it as leading `# key: value` lines and every plot as a footer.

use cadence::Backend;
use std::path::Path;
use std::process::Command;

/// Key of the note naming where the neural engines ran (`cpu`, `cuda:0 (NVIDIA H200)`, or `cpu
/// (auto: <why not CUDA>)`); pipeline experiments add it right after the fixed fields
/// (`Session::provenance`), kernel-only ones have no engines and no such line.
pub const ENGINE_DEVICE_KEY: &str = "engine_device";
/// Provenance note: where a render kept its frames between the stages (host memory or the GPU).
pub const FRAMES_KEPT_IN_KEY: &str = "frames_kept_in";

/// Provenance of one experiment run. `gather*` fills the fields the run can find out itself
/// (commit, dirty, date, hardware, command line); the caller names the backend, the engine
/// profile and the weights (`"n/a"` for kernel-only experiments).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Provenance {
    /// `git rev-parse --short HEAD` of the workspace, or "unknown".
    pub commit: String,
    /// Uncommitted changes outside `results/` (`git status --porcelain`); None when unknown.
    pub dirty: Option<bool>,
    /// Start of the run, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date_utc: String,
    /// CPU model and logical CPUs; the GPU when a CUDA backend was used.
    pub hardware: String,
    pub backend: String,
    pub engine_profile: String,
    /// `"synthetic"`, `"real (<file>)"`, or `"n/a"`.
    pub weights: String,
    pub command_line: String,
    /// Further `key: value` lines particular to one experiment (kept in order).
    pub notes: Vec<(String, String)>,
}

impl Provenance {
    /// Provenance for a run on the CPU only (no GPU named in `hardware`).
    pub fn gather(
        backend: impl Into<String>,
        engine_profile: impl Into<String>,
        weights: impl Into<String>,
    ) -> Provenance {
        let root = crate::paths::workspace_root();
        let (commit, dirty) = git_state(&root);
        Provenance {
            commit,
            dirty,
            date_utc: utc_timestamp(std::time::SystemTime::now()),
            hardware: cpu_hardware(),
            backend: backend.into(),
            engine_profile: engine_profile.into(),
            weights: weights.into(),
            command_line: command_line(),
            notes: Vec::new(),
        }
    }

    /// Provenance for a run that used every backend in `backends`: `backend` lists their
    /// descriptions (`Backend::describe`), `hardware` adds each GPU used.
    pub fn for_backends(
        backends: &[Backend],
        engine_profile: impl Into<String>,
        weights: impl Into<String>,
    ) -> Provenance {
        let described: Vec<String> = backends.iter().map(|b| b.describe()).collect();
        let mut p = Provenance::gather(described.join("; "), engine_profile, weights);
        for b in backends {
            if let Backend::Cuda(c) = b {
                let (ma, mi) = c.compute_capability;
                p = p.with_gpu(format!("{} (sm_{ma}{mi})", c.device_name));
            }
        }
        p
    }

    /// Provenance for a run on one backend.
    pub fn for_backend(backend: &Backend, engine_profile: impl Into<String>, weights: impl Into<String>) -> Provenance {
        Provenance::for_backends(std::slice::from_ref(backend), engine_profile, weights)
    }

    /// Names a GPU the run used in `hardware`.
    pub fn with_gpu(mut self, gpu: impl Into<String>) -> Self {
        self.hardware = format!("{}; GPU: {}", self.hardware, gpu.into());
        self
    }

    /// Adds a `key: value` line (key made of letters, digits and `_`).
    pub fn note(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.notes.push((key.into(), value.into()));
        self
    }

    /// Notes the load average at the start (`at_start`, from [`load_average`]) and now, and the
    /// run's time since `started`.
    pub fn note_load_and_runtime(&mut self, at_start: &str, started: std::time::Instant) -> &mut Self {
        self.note(
            "load_average",
            format!(
                "{at_start} at start, {} at end (1/5/15 min; above the core count, other work shared the machine)",
                load_average()
            ),
        );
        self.note("runtime", format!("{:.1} s", started.elapsed().as_secs_f64()))
    }

    /// The value of the first note with this key.
    pub fn note_value(&self, key: &str) -> Option<&str> {
        self.notes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn dirty_str(&self) -> &'static str {
        match self.dirty {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        }
    }

    /// All fields as (key, value) pairs in a fixed order, values on one line each.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("commit".to_string(), self.commit.clone()),
            ("dirty".to_string(), self.dirty_str().to_string()),
            ("date_utc".to_string(), self.date_utc.clone()),
            ("hardware".to_string(), self.hardware.clone()),
            ("backend".to_string(), self.backend.clone()),
            ("engine_profile".to_string(), self.engine_profile.clone()),
            ("weights".to_string(), self.weights.clone()),
            ("command_line".to_string(), self.command_line.clone()),
        ];
        v.extend(self.notes.iter().cloned());
        v.into_iter().map(|(k, val)| (one_line(&k), one_line(&val))).collect()
    }

    /// The leading comment block of a CSV: one `# key: value` line per field.
    pub fn comment_block(&self) -> String {
        self.pairs().iter().map(|(k, v)| format!("# {k}: {v}\n")).collect()
    }

    /// Two short lines for the foot of a plot.
    pub fn footer_lines(&self) -> [String; 2] {
        let dirty = match self.dirty {
            Some(true) => " (uncommitted changes)",
            Some(false) => "",
            None => " (dirty: unknown)",
        };
        [
            format!(
                "commit {}{} | {} | profile: {} | weights: {}",
                self.commit, dirty, self.date_utc, self.engine_profile, self.weights
            ),
            match self.note_value(ENGINE_DEVICE_KEY) {
                Some(d) => format!("backend: {} | engines on: {d} | hardware: {}", self.backend, self.hardware),
                None => format!("backend: {} | hardware: {}", self.backend, self.hardware),
            },
        ]
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

/// The 1, 5 and 15 minute load averages from /proc/loadavg ("unknown" elsewhere): timings on
/// a shared machine mean little without them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// "MODEL (N logical CPUs)".
pub fn cpu_hardware() -> String {
    format!("{} ({} logical CPUs)", cadence::backend::hardware::cpu_model(), cadence::backend::hardware::logical_cpus())
}

/// The program's arguments, quoted where a shell would need it.
pub fn command_line() -> String {
    std::env::args().map(|a| shell_quote(&a)).collect::<Vec<_>>().join(" ")
}

fn shell_quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// Short commit hash and whether the tree has uncommitted changes outside `results/` (the
/// experiments' own outputs must not mark the next run dirty). ("unknown", None) without git.
pub fn git_state(root: &Path) -> (String, Option<bool>) {
    let run = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(root).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
    };
    let commit = run(&["rev-parse", "--short", "HEAD"]).map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let Some(commit) = commit else {
        return ("unknown".to_string(), None);
    };
    let dirty = run(&["status", "--porcelain", "--", ".", ":(exclude)results"]).map(|s| !s.trim().is_empty());
    (commit, dirty)
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a system time (UTC; times before 1970 clamp to the epoch).
pub fn utc_timestamp(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}
