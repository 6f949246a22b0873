//! Shared by the experiment binaries' end-to-end tests.

use std::process::Command;

/// Runs an experiment binary (without `$CADENCE_MODELS`, so engines use synthetic weights) and
/// fails the test with its output when it does not succeed.
pub fn run(bin: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(bin).args(args).env_remove("CADENCE_MODELS").output().expect("binary starts");
    assert!(
        out.status.success(),
        "{bin} {args:?} failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Records a test that could check nothing here (scripts/test.sh lists and counts them).
#[allow(dead_code)] // each test binary compiles this module; not every one skips
pub fn skipped(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("{test}: {reason}");
    eprintln!("SKIPPED: {line}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}
