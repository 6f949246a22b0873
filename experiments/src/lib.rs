//! Shared infrastructure of the experiment binaries (issue 4): provenance, CSV output,
//! plots, progress bars, output directories, quality metrics and kernel timing helpers.
//!
//! Conventions every binary follows:
//! - `--help` (clap) and `--out DIR` ([`OutDir`], default `<workspace>/results`);
//! - one [`Provenance`] per run, written as `# key: value` lines at the top of every CSV
//!   ([`write_csv`]) and as a footer on every plot ([`plot`]);
//! - times are medians of several runs; no figure is hard-coded.

pub mod csvout;
pub mod frames;
pub mod kbench;
pub mod metrics;
pub mod paths;
pub mod peer;
pub mod plot;
pub mod progress;
pub mod provenance;
pub mod serve;
pub mod session;

pub use csvout::{read_provenance, read_rows, write_csv};
pub use paths::{results_dir, workspace_root, OutDir};
pub use progress::progress_bar;
pub use provenance::Provenance;
