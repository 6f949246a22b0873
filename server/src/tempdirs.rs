//! One temporary directory per request under the server's temp root, named
//! `req-<pid>-<random>`: removed when the request's [`TempDir`] drops (success, error,
//! cancellation and panic alike). A directory whose process is gone (a server killed outright)
//! is swept at the next start; those of live processes, other replicas sharing the root among
//! them, are left alone.

use anyhow::{Context, Result};
use std::path::Path;
use tempfile::TempDir;

const PREFIX: &str = "req-";

pub fn create_root(root: &Path) -> Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating the temp root {}", root.display()))
}

/// A fresh directory for one request.
pub fn request_dir(root: &Path) -> std::io::Result<TempDir> {
    tempfile::Builder::new().prefix(&format!("{PREFIX}{}-", std::process::id())).tempdir_in(root)
}

/// Removes the request directories of processes that no longer run; returns how many.
pub fn sweep_stale(root: &Path) -> Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(root).with_context(|| format!("reading {}", root.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner_pid) else { continue };
        if !process_alive(pid) && entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path()).with_context(|| format!("removing {}", entry.path().display()))?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Whether process `pid` exists. Without /proc (not Linux) every process counts as alive, so
/// nothing is swept.
fn process_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_of_dead_processes_are_swept() {
        let root = tempfile::tempdir().unwrap();
        let mine = request_dir(root.path()).unwrap();
        // Above the kernel's largest pid (2^22): never a live process.
        let stale = root.path().join("req-99999999-abc");
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("audio.wav"), b"x").unwrap();
        let other = root.path().join("unrelated");
        std::fs::create_dir(&other).unwrap();
        assert_eq!(sweep_stale(root.path()).unwrap(), 1);
        assert!(!stale.exists() && mine.path().exists() && other.exists());
    }
}
