//! The peer benchmarks' Python side (`peer_bench`'s torch_peer.py, `faces_bench`'s
//! mtcnn_peer.py): a worker process kept running with its threads pinned, that prints one JSON
//! line when it is ready (what it runs: versions, capability) and then answers each command
//! line with one JSON line. Timing in a persistent worker leaves Python's start-up and imports
//! out of every round.

use anyhow::{ensure, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// Environment variable naming the Python with torch (instead of `--python`).
pub const PYTHON_ENV: &str = "CADENCE_PEER_PYTHON";

/// The Python to use: `arg` (`--python`), else $CADENCE_PEER_PYTHON, else
/// experiments/peers/.venv (what `torch_peer.py --install` makes).
pub fn python(arg: Option<PathBuf>, root: &Path) -> PathBuf {
    arg.or_else(|| std::env::var_os(PYTHON_ENV).filter(|v| !v.is_empty()).map(PathBuf::from))
        .unwrap_or_else(|| root.join("experiments/peers/.venv/bin/python"))
}

/// The CPU's vector-extension flags from /proc/cpuinfo (what decides both sides' kernels).
pub fn cpu_flags() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info.lines().find(|l| l.starts_with("flags")).and_then(|l| l.split(':').nth(1)).unwrap_or("");
    let keep: Vec<&str> = flags
        .split_whitespace()
        .filter(|f| f.starts_with("avx") || ["fma", "f16c", "amx_tile", "amx_bf16", "sse4_2"].contains(f))
        .collect();
    if keep.is_empty() {
        "unknown".into()
    } else {
        keep.join(" ")
    }
}

/// A running worker.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The worker's first line.
    pub info: serde_json::Value,
}

impl Worker {
    /// Starts `cmd` with `threads` OpenMP/MKL threads and waits for its first line. A worker that
    /// exits first is the error `not_ready` makes of its exit status (the worker has printed
    /// why on standard error, which is the benchmark's).
    pub fn start(
        mut cmd: Command,
        threads: usize,
        not_ready: impl FnOnce(ExitStatus) -> anyhow::Error,
    ) -> Result<Worker> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let mut child = cmd
            .envs(["OMP_NUM_THREADS", "MKL_NUM_THREADS"].map(|k| (k, threads.to_string())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let stdin = child.stdin.take().context("peer stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("peer stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim().is_empty() {
            return Err(not_ready(child.wait()?));
        }
        let info = serde_json::from_str(&line).with_context(|| format!("peer's first line is not JSON: {line}"))?;
        Ok(Worker { child, stdin, stdout, info })
    }

    /// Sends one command line and reads the answer (an `"error"` in it is an error).
    pub fn ask(&mut self, command: &str) -> Result<serde_json::Value> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("peer answered {line:?} (did it crash?)"))?;
        ensure!(v.get("error").is_none(), "peer: {}", v["error"]);
        Ok(v)
    }

    /// Ends the worker; it must exit cleanly.
    pub fn quit(mut self) -> Result<()> {
        writeln!(self.stdin, "quit")?;
        drop(self.stdin);
        let status = self.child.wait()?;
        ensure!(status.success(), "the peer exited with {status}");
        Ok(())
    }
}
