//! Helpers every CLI test binary shares (each `tests/*.rs` is its own crate and uses some).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the `cadence` binary this test build made.
pub fn cadence(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cadence")).args(args).output().expect("run cadence")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A committed espeak-ng sentence (fixtures/speech, made by scripts/make_speech_fixtures.sh).
pub fn speech_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech").join(format!("{name}.wav"))
}
