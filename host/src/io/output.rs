//! The one policy for every file cadence writes (MP4, .npy, JSON, CSV, SVG/PNG):
//!
//! - The target is checked before any work starts: it must not be a directory or another kind of
//!   non-regular file, its directory must exist, and an existing file is replaced only with
//!   `--force` ([`Overwrite::Ask`] refuses, [`Overwrite::Replace`] replaces).
//! - A file that is one of the run's inputs is never replaced, whatever the flags: the same path,
//!   a link to it, or a hard link (same device and inode) all count as the input.
//! - Output goes to a hidden temporary file beside the target, `.NAME.partial-PID[.EXT]` (the
//!   extension kept, for writers that choose a format by it), renamed into place at the end. A
//!   failure, a panic or a SIGINT/SIGTERM/SIGHUP ([`install_interrupt_cleanup`]) removes it, so
//!   nothing is left at or beside the output path; a temporary left by a process that was killed
//!   outright (SIGKILL, power loss) is recognised by its name and swept by the next write to the
//!   same target once its process is gone.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Whether an existing target may be replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overwrite {
    /// Refuse to replace an existing file (the CLI without `--force`).
    Ask,
    /// Replace an existing file (the CLI with `--force`; experiments regenerating `results/`).
    Replace,
}

impl Overwrite {
    pub fn from_force(force: bool) -> Self {
        if force {
            Overwrite::Replace
        } else {
            Overwrite::Ask
        }
    }
}

/// A checked output target (see the module documentation).
#[derive(Clone, Debug)]
pub struct OutputPath {
    path: PathBuf,
}

/// Temporary files being written now, removed by the interrupt handler.
static PARTIALS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Whether `a` and `b` name the same existing file (through links too).
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    }
}

impl OutputPath {
    /// Checks `path` as an output of a run that reads `inputs`.
    pub fn check(path: &Path, overwrite: Overwrite, inputs: &[&Path]) -> Result<Self> {
        let shown = path.display();
        let Some(name) = path.file_name() else { bail!("{shown} is not a file name") };
        if let Some(input) = inputs.iter().find(|i| same_file(path, i)) {
            bail!("{shown} is an input of this run ({}); choose another output path", input.display());
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !dir.is_dir() {
            bail!("output directory {} does not exist", dir.display());
        }
        // symlink_metadata: a link at the target is replaced by the rename, not written through.
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => bail!("{shown} is a directory; give a file name"),
            Ok(m) if !m.is_file() && !m.file_type().is_symlink() => {
                bail!("{shown} exists and is not a regular file (a device, pipe or socket); refusing to replace it")
            }
            Ok(_) if overwrite == Overwrite::Ask => bail!("{shown} already exists; pass --force to replace it"),
            _ => {}
        }
        let out = OutputPath { path: path.to_path_buf() };
        out.sweep(name);
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file's name for process `pid`.
    fn partial_name(&self, pid: u32) -> PathBuf {
        let name = self.path.file_name().expect("checked").to_string_lossy();
        let ext = self.path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
        self.path.with_file_name(format!(".{name}.partial-{pid}{ext}"))
    }

    /// Removes temporaries of this target left by processes that no longer run.
    fn sweep(&self, name: &std::ffi::OsStr) {
        let prefix = format!(".{}.partial-", name.to_string_lossy());
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = file.strip_prefix(&prefix) else { continue };
            let pid = rest.split('.').next().and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid.filter(|&p| p != std::process::id() && !process_alive(p)) {
                if std::fs::remove_file(e.path()).is_ok() {
                    eprintln!("cadence: removed {} (left by an interrupted run, process {pid})", e.path().display());
                }
            }
        }
    }

    /// Starts writing: the temporary file beside the target, removed unless committed.
    pub fn begin(&self) -> Result<Partial> {
        let tmp = self.partial_name(std::process::id());
        PARTIALS.lock().unwrap_or_else(|e| e.into_inner()).push(tmp.clone());
        Ok(Partial { tmp, target: self.path.clone(), done: false })
    }

    /// Writes the whole file through `f` (buffered), then moves it into place.
    pub fn write(&self, f: impl FnOnce(&mut BufWriter<File>) -> Result<()>) -> Result<()> {
        let partial = self.begin()?;
        let file = File::create(partial.path()).with_context(|| format!("cannot create {}", self.path.display()))?;
        let mut w = BufWriter::new(file);
        f(&mut w).with_context(|| format!("writing {}", self.path.display()))?;
        w.flush().with_context(|| format!("writing {}", self.path.display()))?;
        let file =
            w.into_inner().map_err(|e| e.into_error()).with_context(|| format!("writing {}", self.path.display()))?;
        file.sync_all().with_context(|| format!("writing {}", self.path.display()))?;
        partial.commit()
    }
}

fn process_alive(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        Path::new(&format!("/proc/{pid}")).exists()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        true // unknown: keep the file
    }
}

/// A temporary output file being written; removed on drop unless [`Partial::commit`] moved it
/// into place.
pub struct Partial {
    tmp: PathBuf,
    target: PathBuf,
    done: bool,
}

impl Partial {
    /// Where the writer writes (for writers that take a path, such as the MP4 muxer).
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// `e` with the temporary file's name replaced by the target's: errors of writers that only
    /// know the temporary path (the MP4 muxer's I/O errors) name the file the user asked for.
    pub fn user_error(&self, e: anyhow::Error) -> anyhow::Error {
        let (tmp, target) = (self.tmp.display().to_string(), self.target.display().to_string());
        let text = format!("{e:#}");
        if text.contains(&tmp) {
            anyhow::anyhow!(text.replace(&tmp, &target))
        } else {
            e
        }
    }

    /// Moves the finished file to the target.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.tmp, &self.target)
            .with_context(|| format!("cannot move the output into {}", self.target.display()))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
        PARTIALS.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| p != &self.tmp);
    }
}

/// Writes `path` atomically, replacing what is there (for outputs the program owns, such as the
/// experiments' `results/`); the same temporary-file handling as [`OutputPath::write`].
pub fn write_atomically(path: &Path, f: impl FnOnce(&mut BufWriter<File>) -> Result<()>) -> Result<()> {
    OutputPath::check(path, Overwrite::Replace, &[])?.write(f)
}

/// On SIGINT, SIGTERM or SIGHUP: removes every temporary output being written, says so, and exits
/// with 128 + the signal number (the shell's convention). For binaries; call once at start.
pub fn install_interrupt_cleanup() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot install the interrupt handler")?;
    std::thread::Builder::new()
        .name("interrupt-cleanup".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let partials = PARTIALS.lock().unwrap_or_else(|e| e.into_inner());
                for p in partials.iter() {
                    let _ = std::fs::remove_file(p);
                }
                let what = if partials.is_empty() { "" } else { "; the unfinished output was removed" };
                eprintln!("cadence: interrupted (signal {sig}){what}");
                std::process::exit(128 + sig);
            }
        })
        .context("cannot start the interrupt handler")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_links_and_existing_files() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("a.wav");
        std::fs::write(&input, b"audio").unwrap();
        let link = d.path().join("link.mp4");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let hard = d.path().join("hard.mp4");
        std::fs::hard_link(&input, &hard).unwrap();
        for p in [&input, &link, &hard] {
            let e = OutputPath::check(p, Overwrite::Replace, &[&input]).unwrap_err().to_string();
            assert!(e.contains("is an input of this run"), "{e}");
        }
        let other = d.path().join("b.mp4");
        std::fs::write(&other, b"old").unwrap();
        assert!(OutputPath::check(&other, Overwrite::Ask, &[&input]).unwrap_err().to_string().contains("--force"));
        assert!(OutputPath::check(&other, Overwrite::Replace, &[&input]).is_ok());
        assert!(OutputPath::check(d.path(), Overwrite::Replace, &[]).unwrap_err().to_string().contains("directory"));
        let e = OutputPath::check(&d.path().join("no/such.mp4"), Overwrite::Ask, &[]).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = OutputPath::check(Path::new("/dev/null"), Overwrite::Replace, &[]).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn failure_and_drop_leave_nothing_commit_replaces() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("out.npy");
        let out = OutputPath::check(&target, Overwrite::Ask, &[]).unwrap();
        let e = out.write(|w| {
            w.write_all(b"half")?;
            bail!("the encoder failed at frame 3")
        });
        assert!(e.unwrap_err().to_string().contains("writing"));
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "a file was left behind");
        {
            let p = out.begin().unwrap();
            std::fs::write(p.path(), b"x").unwrap();
            assert!(p.path().file_name().unwrap().to_string_lossy().starts_with(".out.npy.partial-"));
            assert!(p.path().extension().unwrap() == "npy");
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "dropping did not remove the partial file");
        out.write(|w| Ok(w.write_all(b"done")?)).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"done");
        // Other tests in this binary write outputs concurrently: only this test's entries must be gone.
        assert!(
            !PARTIALS.lock().unwrap().iter().any(|p| p.starts_with(d.path())),
            "a partial file is still registered"
        );
    }

    #[test]
    fn stale_partials_of_dead_processes_are_swept() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("clip.mp4");
        // A pid far above Linux's pid_max: no such process.
        let dead = d.path().join(".clip.mp4.partial-4999999.mp4");
        let mine = d.path().join(format!(".clip.mp4.partial-{}.mp4", std::process::id()));
        let unrelated = d.path().join(".other.mp4.partial-4999999.mp4");
        for p in [&dead, &mine, &unrelated] {
            std::fs::write(p, b"x").unwrap();
        }
        OutputPath::check(&target, Overwrite::Ask, &[]).unwrap();
        assert!(!dead.exists());
        assert!(mine.exists() && unrelated.exists());
    }
}
