//! Where outputs go: `<workspace>/results` by default, `--out DIR` to choose.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The workspace root: the parent of this crate's manifest directory when it exists at run
/// time (binaries run through cargo), else the current directory.
pub fn workspace_root() -> PathBuf {
    let compiled = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf);
    match compiled {
        Some(p) if p.join("Cargo.toml").is_file() => p,
        _ => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    }
}

/// `<workspace>/results`, created when missing.
pub fn results_dir() -> Result<PathBuf> {
    ensure_dir(&workspace_root().join("results"))
}

/// Creates `dir` (and parents) when missing; errors when it exists as something else.
pub fn ensure_dir(dir: &Path) -> Result<PathBuf> {
    if !dir.is_dir() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
    }
    Ok(dir.to_path_buf())
}

/// The `--out DIR` convention of every experiment binary: flatten it into the clap struct
/// (`#[command(flatten)] out: OutDir`) and call [`OutDir::dir`].
#[derive(clap::Args, Clone, Debug, Default)]
pub struct OutDir {
    /// Directory for the CSV and plots (created if missing) [default: the workspace's results/]
    #[arg(long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
}

impl OutDir {
    /// The chosen directory, created when missing.
    pub fn dir(&self) -> Result<PathBuf> {
        match &self.out {
            Some(d) => ensure_dir(d),
            None => results_dir(),
        }
    }
}

/// The file `profile_shares` writes for a scale arm: each arm has its own reduced widths
/// (`cadence_engines::ScaleArm`), so each has its own measurement.
pub fn profile_shares_file(arm: cadence_engines::ScaleArm) -> String {
    match arm {
        cadence_engines::ScaleArm::Avx512 => "profile_shares.csv".into(),
        arm => format!("profile_shares_{}.csv", arm.name()),
    }
}
