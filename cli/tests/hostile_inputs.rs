//! Hostile but realistic use of the CLI: every case exits non-zero with a clear one-line message
//! and no panic text, leaves no file at or beside the output path, never changes an input, and
//! where the case is about memory, the child's peak resident memory is measured and bounded.
//! (docs/cli.md: "Output files, and what cadence refuses".)

mod common;
use common::s;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Exit status, stderr and peak resident memory (bytes) of one `cadence` run.
struct Run {
    code: Option<i32>,
    signal: Option<i32>,
    stderr: String,
    peak_rss: u64,
    wall: Duration,
}

fn spawn(args: &[&str], setup: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static) -> std::process::Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cadence"));
    c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: `setup` only calls async-signal-safe functions (setrlimit, signal).
    unsafe { c.pre_exec(setup) };
    c.spawn().unwrap()
}

/// Waits with `wait4`, which reports the child's peak resident set size.
fn finish(mut child: std::process::Child, started: Instant) -> Run {
    use std::io::Read;
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: plain syscall on our own child, which std has not reaped.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else {
        (None, Some(libc::WTERMSIG(status)))
    };
    std::mem::forget(child); // reaped above
    Run { code, signal, stderr, peak_rss: usage.ru_maxrss as u64 * 1024, wall: started.elapsed() }
}

fn cadence(args: &[&str]) -> Run {
    let t = Instant::now();
    finish(spawn(args, || Ok(())), t)
}

/// The run failed cleanly: exit 1 or 2 (clap), the needle in a one-line message, no panic.
fn refused(r: &Run, needle: &str, what: &str) {
    assert!(matches!(r.code, Some(1 | 2)), "{what}: exit {:?} signal {:?}: {}", r.code, r.signal, r.stderr);
    assert!(!r.stderr.contains("panicked"), "{what}: panic: {}", r.stderr);
    assert!(!r.stderr.contains("RUST_BACKTRACE"), "{what}: {}", r.stderr);
    assert!(r.stderr.contains(needle), "{what}: expected '{needle}' in: {}", r.stderr);
    let msg: Vec<&str> =
        r.stderr.lines().filter(|l| l.starts_with("cadence: error") || l.starts_with("error:")).collect();
    assert_eq!(msg.len(), 1, "{what}: not one error line: {}", r.stderr);
}

/// Nothing but `keep` in `dir`.
fn only(dir: &Path, keep: &[&Path]) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        assert!(keep.iter().any(|k| *k == p), "left behind: {}", p.display());
    }
}

fn speech(dir: &Path) -> PathBuf {
    // A committed espeak-ng sentence, copied so the test may do what it likes with it.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech/news.wav");
    let p = dir.join("speech.wav");
    std::fs::copy(src, &p).unwrap();
    p
}

fn avatar(dir: &Path, name: &str, w: u32, h: u32) -> PathBuf {
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
    let p = dir.join(name);
    cadence_media::RgbImage::from_raw(w, h, px).unwrap().save(&p).unwrap();
    p
}

/// A .npy file with the given header shape and `data_bytes` of float32 data.
fn raw_npy(path: &Path, shape: &str, data_bytes: usize) {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data_bytes));
    std::fs::write(path, b).unwrap();
}

#[test]
fn an_input_is_never_the_output() {
    let d = tempfile::tempdir().unwrap();
    let wav = speech(d.path());
    let img = avatar(d.path(), "face.png", 256, 256);
    let keys = d.path().join("k.npy");
    cadence::io::npy::save(&keys, &[4, 8], &[0.5f32; 32]).unwrap();
    let link = d.path().join("link.mp4");
    std::os::unix::fs::symlink(&wav, &link).unwrap();
    let before: Vec<Vec<u8>> = [&wav, &img, &keys].iter().map(|p| std::fs::read(p).unwrap()).collect();
    for (args, what) in [
        (vec!["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&wav), "--force"], "render -o audio"),
        (vec!["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&img), "--force"], "render -o avatar"),
        (vec!["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&link), "--force"], "render -o link"),
        (
            vec!["expand", "--input", s(&keys), "--output", s(&keys), "--frames", "10", "--stride", "3", "--force"],
            "expand in place",
        ),
    ] {
        refused(&cadence(&args), "is an input of this run", what);
    }
    let after: Vec<Vec<u8>> = [&wav, &img, &keys].iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(before == after, "an input changed");
    only(d.path(), &[&wav, &img, &keys, &link]);
}

#[test]
fn crafted_npy_headers_are_errors_not_panics() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out.npy");
    let cases = [
        ("(4, 4611686018427387905)", 64, "more elements than any file can hold"),
        ("(4294967296, 4294967296)", 64, "more elements than any file can hold"),
        ("(18446744073709551615,)", 16, "more elements than any file can hold"),
        ("(4, 0)", 0, "holds no keyframe data"),
        ("(4, 2)", 31, "truncated"),
        ("(4, 2", 32, "not closed"),
    ];
    for (shape, bytes, needle) in cases {
        let p = d.path().join("crafted.npy");
        raw_npy(&p, shape, bytes);
        let r = cadence(&["expand", "--input", s(&p), "--output", s(&out), "--frames", "10", "--stride", "3"]);
        refused(&r, needle, shape);
        let r = cadence(&[
            "engine-run",
            "--model",
            "taesd",
            "--input",
            s(&p),
            "--output",
            s(&out),
            "--profile",
            "cpu-reduced",
        ]);
        assert!(matches!(r.code, Some(1)) && !r.stderr.contains("panicked"), "engine-run {shape}: {}", r.stderr);
    }
    only(d.path(), &[&d.path().join("crafted.npy")]);
}

#[test]
fn flags_cannot_make_it_allocate_before_validation() {
    let d = tempfile::tempdir().unwrap();
    let keys = d.path().join("k.npy");
    cadence::io::npy::save(&keys, &[4, 8], &[0.5f32; 32]).unwrap();
    let out = d.path().join("out.npy");
    // 4 keyframes match this schedule; the output would be 4e9 frames x 8 floats = 128 GB.
    let r = cadence(&[
        "expand",
        "--input",
        s(&keys),
        "--output",
        s(&out),
        "--frames",
        "4000000000",
        "--stride",
        "1333333334",
    ]);
    refused(&r, "would need 128.0 GB of memory", "4e9 frames");
    // 5e8 frames at stride 1 would need 5e8 keyframes: refused from the input, before any schedule.
    let r = cadence(&["expand", "--input", s(&keys), "--output", s(&out), "--frames", "500000000", "--stride", "1"]);
    refused(&r, "holds 4 keyframes, but the schedule", "5e8 frames");
    assert!(r.peak_rss < 100 << 20, "refusing took {} MB", r.peak_rss >> 20);
    let r = cadence(&["expand", "--input", s(&keys), "--output", s(&out), "--frames", "4294967297", "--stride", "2"]);
    refused(&r, "too many frames", "2^32+1 frames");
    assert!(r.peak_rss < 100 << 20, "refusing took {} MB", r.peak_rss >> 20);
    only(d.path(), &[&keys]);
}

#[test]
fn what_can_be_checked_early_is_checked_before_the_engines_load() {
    let d = tempfile::tempdir().unwrap();
    let wav = speech(d.path());
    let img = avatar(d.path(), "face.png", 256, 256);
    let odd = avatar(d.path(), "odd.png", 255, 256);
    let big = avatar(d.path(), "big.png", 3842, 64);
    let lat = d.path().join("lat.npy");
    cadence::io::npy::save(&lat, &[1, 3, 8, 8], &[0.1f32; 192]).unwrap();
    let out = d.path().join("out.mp4");
    let o_npy = d.path().join("o.npy");
    let render = |extra: &[&str]| -> Vec<String> {
        ["render", "--audio", s(&wav), "-o", s(&out), "--profile", "full"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect()
    };
    let dir_out = d.path().join("sub");
    std::fs::create_dir(&dir_out).unwrap();
    let own = |v: &[&str]| -> Vec<String> { v.iter().map(|a| a.to_string()).collect() };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (render(&["--avatar", s(&odd)]), "needs an even width and height"),
        (render(&["--avatar", s(&big)]), "larger than the maximum 3840x3840"),
        (render(&["--avatar", s(&img), "--keyframes", "0,3,1000"]), "keyframe 1000 is outside the video"),
        (render(&["--avatar", s(&img), "--keyframes", "0,x"]), "'x' is not a frame index"),
        (render(&["--avatar", s(&img), "--fps", "abc"]), "is not a frame rate"),
        (render(&["--avatar", s(&img), "--encoder", "x264"]), "not in this build"),
        (render(&["--avatar", s(&img), "--face-box", "4294967306,0,100,100"]), "is not a whole number of pixels"),
        (render(&["--avatar", s(&img), "--max-seconds=-5"]), "not a positive number of seconds"),
        (render(&["--avatar", s(&img), "--max-seconds", "NaN"]), "not a positive number of seconds"),
        (render(&["--avatar", s(&img), "--face-box", "200,200,128,128"]), "outside the 256x256 image"),
        (render(&["--avatar", s(&img), "--face-index", "1", "--face-box", "center"]), "--face-index"),
        // The synthetic avatar has no face: the detector says so (with how to give the box),
        // before the engines load.
        (render(&["--avatar", s(&img)]), "no face found in the image"),
        (
            own(&["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&dir_out), "--profile", "full"]),
            "is a directory",
        ),
        (
            own(&["engine-run", "--model", "taesd", "--input", s(&lat), "--output", s(&o_npy)]),
            "decodes latents of shape (B,4,h,w)",
        ),
        (
            own(&["engine-run", "--model", "musetalk-unet", "--input", s(&lat), "--output", s(&o_npy)]),
            "takes (B,8,32,32)",
        ),
    ];
    for (args, needle) in cases {
        let r = cadence(&args.iter().map(String::as_str).collect::<Vec<_>>());
        refused(&r, needle, &format!("{args:?}"));
        // The full profile takes seconds and gigabytes to load: refused well before that.
        assert!(r.wall < Duration::from_secs(5), "{args:?} took {:?}", r.wall);
        assert!(r.peak_rss < 400 << 20, "{args:?} took {} MB", r.peak_rss >> 20);
    }
    only(d.path(), &[&wav, &img, &odd, &big, &lat, &dir_out]);
}

#[test]
fn non_finite_inputs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let img = avatar(d.path(), "face.png", 256, 256);
    let wav = d.path().join("nan.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(&wav, spec).unwrap();
    for i in 0..16_000 {
        w.write_sample(if i == 8_000 { f32::NAN } else { 0.1 * (i as f32 * 0.05).sin() }).unwrap();
    }
    w.finalize().unwrap();
    let out = d.path().join("out.mp4");
    let r = cadence(&["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&out)]);
    refused(&r, "sample frame 8000 (0.500 s) is not a finite number", "NaN WAV");
    let keys = d.path().join("inf.npy");
    let mut v = vec![0.5f32; 32];
    v[9] = f32::NEG_INFINITY;
    cadence::io::npy::save(&keys, &[4, 8], &v).unwrap();
    let npy_out = d.path().join("out.npy");
    let r = cadence(&["expand", "--input", s(&keys), "--output", s(&npy_out), "--frames", "10", "--stride", "3"]);
    refused(&r, "keyframe 1, element 1 is not a finite number", "inf keyframe");
    only(d.path(), &[&img, &wav, &keys]);
}

#[test]
fn messages_name_the_file_once_and_no_internal_names() {
    let d = tempfile::tempdir().unwrap();
    let img = avatar(d.path(), "face.png", 256, 256);
    let out = d.path().join("out.mp4");
    let r = cadence(&["render", "--audio", "/nonexistent/speech.wav", "--avatar", s(&img), "-o", s(&out)]);
    refused(&r, "/nonexistent/speech.wav", "missing audio");
    assert_eq!(r.stderr.matches("/nonexistent/speech.wav").count(), 1, "{}", r.stderr);
    assert_eq!(r.stderr.matches("No such file").count(), 1, "{}", r.stderr);
    let wav = speech(d.path());
    let r = cadence(&["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&out), "--face-box", "0,0,8,8"]);
    refused(&r, "at least 16x16", "tiny box");
    assert!(!r.stderr.contains("face box: face box"), "{}", r.stderr);
}

/// Interrupted (SIGINT, SIGTERM) during the frame loop: the temporary file is removed and the
/// exit status is the shell's 128 + signal; a temporary left by a killed process (SIGKILL) is
/// swept by the next run that writes the same output.
#[test]
fn interrupted_renders_leave_nothing() {
    let d = tempfile::tempdir().unwrap();
    let wav = speech(d.path());
    let img = avatar(d.path(), "face.png", 256, 256);
    let out = d.path().join("out.mp4");
    // The synthetic avatar has no face for the detector: the centred box.
    let args = [
        "render",
        "--audio",
        s(&wav),
        "--avatar",
        s(&img),
        "--face-box",
        "center",
        "-o",
        s(&out),
        "--stride",
        "1",
        "--batch",
        "1",
    ];
    let partial = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".out.mp4.partial-"))
    };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        let t = Instant::now();
        let child = spawn(&args, || Ok(()));
        // Wait until the MP4 is being written (the frame loop has started).
        while !partial(d.path()) {
            assert!(t.elapsed() < Duration::from_secs(120), "the render never started writing");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let r = finish(child, t);
        if sig == libc::SIGKILL {
            assert_eq!(r.signal, Some(libc::SIGKILL));
            assert!(partial(d.path()), "SIGKILL cannot clean up; the next run must");
            // The next run sweeps it, even one that fails at once for another reason.
            let r = cadence(&["render", "--audio", s(&wav), "--avatar", s(&img), "-o", s(&out), "--encoder", "nvenc"]);
            refused(&r, "not in this build", "sweep run");
            assert!(r.stderr.contains("left by an interrupted run"), "{}", r.stderr);
        } else {
            assert_eq!(r.code, Some(128 + sig), "signal {sig}: {}", r.stderr);
            assert!(r.stderr.contains("interrupted"), "{}", r.stderr);
            assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        }
        only(d.path(), &[&wav, &img]);
    }
}

/// A failure while the output is being written (the file system refuses to grow the file:
/// RLIMIT_FSIZE in the child, SIGXFSZ ignored so the write fails with EFBIG) removes the
/// temporary file: nothing at or beside the output, and the message names the output, not the
/// temporary file.
#[test]
fn a_failure_while_writing_leaves_nothing() {
    let d = tempfile::tempdir().unwrap();
    let wav = speech(d.path());
    let img = avatar(d.path(), "face.png", 256, 256);
    let keys = d.path().join("k.npy");
    cadence::io::npy::save(&keys, &[2, 4096], &vec![0.25f32; 8192]).unwrap();
    let limit = |bytes: u64| {
        move || {
            // SAFETY: async-signal-safe calls between fork and exec.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        }
    };
    let out = d.path().join("out.mp4");
    let t = Instant::now();
    // The synthetic avatar has no face for the detector: the centred box.
    let args = ["render", "--audio", s(&wav), "--avatar", s(&img), "--face-box", "center", "-o", s(&out)];
    let r = finish(spawn(&args, limit(64 << 10)), t);
    refused(&r, "out.mp4", "render with a full disk");
    assert!(!r.stderr.contains(".partial-"), "{}", r.stderr);
    let npy_out = d.path().join("frames.npy");
    let t = Instant::now();
    let args = ["expand", "--input", s(&keys), "--output", s(&npy_out), "--frames", "100", "--keyframes", "0,99"];
    let r = finish(spawn(&args, limit(256 << 10)), t);
    refused(&r, "frames.npy", "expand with a full disk");
    only(d.path(), &[&wav, &img, &keys]);
}
