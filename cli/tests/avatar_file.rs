//! Prepared avatars (`cadence avatar prepare`, `render --avatar FILE.cadence-avatar`): the same
//! video as preparing the image in the render, and every damaged file refused with a clear
//! message, a non-zero exit and no output file.

mod common;
use common::cadence;

use std::path::{Path, PathBuf};
use std::process::Output;

fn speech() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech/goodnight.wav")
}

fn portrait(dir: &Path) -> PathBuf {
    let (w, h) = (288u32, 320u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 41 % 247) as u8).collect();
    let p = dir.join("face.png");
    cadence_media::RgbImage::from_raw(w, h, px).unwrap().save(&p).unwrap();
    p
}

fn render(avatar: &Path, out: &Path, extra: &[&str]) -> Output {
    let audio = speech();
    let args = ["render", "--backend", "cpu", "--stride", "3", "--audio", audio.to_str().unwrap()];
    cadence(&[&args[..], &["--avatar", avatar.to_str().unwrap(), "-o", out.to_str().unwrap()], extra].concat())
}

fn ok(o: &Output) {
    assert!(o.status.success(), "cadence failed: {}", String::from_utf8_lossy(&o.stderr));
}

fn refused(o: &Output, out: &Path, says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "accepted, expected '{says}'");
    assert!(err.contains(says), "expected '{says}' in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "{} was left behind", out.display());
}

#[test]
fn a_prepared_avatar_renders_the_same_video_as_its_image() {
    let dir = tempfile::tempdir().unwrap();
    let img = portrait(dir.path());
    let prepared = dir.path().join("anchor.cadence-avatar");
    let face = "--face-box=40,60,160,176";
    ok(&cadence(&["avatar", "prepare", img.to_str().unwrap(), "-o", prepared.to_str().unwrap(), face]));
    let (direct, from_file) = (dir.path().join("direct.mp4"), dir.path().join("from_file.mp4"));
    ok(&render(&img, &direct, &[face]));
    ok(&render(&prepared, &from_file, &[]));
    assert!(std::fs::read(&direct).unwrap() == std::fs::read(&from_file).unwrap(), "the videos differ");
    // Prepared again without --force: refused, the file kept.
    let before = std::fs::read(&prepared).unwrap();
    let o = cadence(&["avatar", "prepare", img.to_str().unwrap(), "-o", prepared.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(std::fs::read(&prepared).unwrap(), before);
}

#[test]
fn damaged_or_foreign_avatar_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = portrait(dir.path());
    let good = dir.path().join("good.cadence-avatar");
    // The synthetic portrait has no face for the detector: the centred box.
    ok(&cadence(&["avatar", "prepare", img.to_str().unwrap(), "-o", good.to_str().unwrap(), "--face-box=center"]));
    let bytes = std::fs::read(&good).unwrap();
    let out = dir.path().join("out.mp4");
    let write = |name: &str, b: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    refused(&render(&write("flipped.cadence-avatar", &flipped), &out, &[]), &out, "checksum");
    refused(&render(&write("cut.cadence-avatar", &bytes[..bytes.len() / 3]), &out, &[]), &out, "truncated");
    refused(&render(&write("tiny.cadence-avatar", &bytes[..30]), &out, &[]), &out, "truncated");
    let mut other_version = bytes.clone();
    other_version[16] = 9;
    refused(&render(&write("v9.cadence-avatar", &other_version), &out, &[]), &out, "version 9");
    refused(&render(&write("png.cadence-avatar", &std::fs::read(&img).unwrap()), &out, &[]), &out, "not a prepared");
    refused(&render(&good, &out, &["--face-box=0,0,64,64"]), &out, "--face-box");
    refused(&render(&good, &out, &["--face-box=center"]), &out, "has its face boxes already");
    refused(&render(&good, &out, &["--face-index", "1"]), &out, "--face-index");
    refused(&render(&good, &out, &["--bbox-shift=-4"]), &out, "--bbox-shift");
    // Latents of other engines: the SD VAE decoder cannot use TAESD's.
    refused(&render(&good, &out, &["--decoder", "sd-vae"]), &out, "other engines");
    let o = cadence(&["avatar", "prepare", img.to_str().unwrap(), "-o", dir.path().join("x.bin").to_str().unwrap()]);
    refused(&o, &dir.path().join("x.bin"), ".cadence-avatar");
}
