//! `cadence render --audio -`: a live WAV stream on standard input (a header with no length,
//! then samples as they come), rendered as it arrives to a fragmented MP4.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cadence_media::Mp4Reader;

/// 16-bit mono samples of the four committed speech clips one after the other (10.3 s, five
/// GOPs of video, no stretch repeated, so that features taken from the wrong time show), and
/// their rate.
fn speech_samples() -> (Vec<i16>, u32) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech");
    let mut samples = Vec::new();
    let mut rate = None;
    for name in ["fox", "news", "sleep", "goodnight"] {
        let bytes = std::fs::read(dir.join(format!("{name}.wav"))).unwrap();
        // Plain 44-byte-header 16-bit mono PCM WAVs of one rate (checked: a change is noticed).
        assert_eq!((&bytes[36..40], &bytes[22..24], &bytes[34..36]), (&b"data"[..], &[1u8, 0][..], &[16u8, 0][..]));
        let r = u32::from_le_bytes(bytes[24..28].try_into().unwrap());
        assert_eq!(*rate.get_or_insert(r), r, "{name}.wav has another rate");
        samples.extend(bytes[44..].chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]])));
    }
    (samples, rate.unwrap())
}

/// A WAV header for 16-bit mono at `rate`; `data_bytes` None writes the placeholder sizes a
/// program writing to a pipe uses (0xFFFFFFFF).
fn wav_header(rate: u32, data_bytes: Option<u32>) -> Vec<u8> {
    let data = data_bytes.unwrap_or(u32::MAX);
    let riff = data_bytes.map_or(u32::MAX, |d| d + 36);
    let mut h = Vec::new();
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&riff.to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&rate.to_le_bytes());
    h.extend_from_slice(&(rate * 2).to_le_bytes());
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&16u16.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&data.to_le_bytes());
    h
}

fn pcm(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// A 320x256 avatar (small frames keep the encoder's share of the test short).
fn avatar(dir: &Path) -> PathBuf {
    let (w, h) = (320u32, 256u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 29 % 253) as u8).collect();
    let p = dir.join("avatar.png");
    cadence_media::RgbImage::from_raw(w, h, px).unwrap().save(&p).unwrap();
    p
}

/// The live rules' distance from the file render, as a bound on the face box's mean luma PSNR.
/// Measured on an AMD EPYC: 44.3 dB; with each part's whisper features taken from the wrong
/// time (the context's offset dropped), 39.6 dB.
const PSNR_BOUND_DB: f64 = 42.0;

/// The synthetic avatar has no face for the detector: the centred box (where the PSNR is taken).
const RENDER: [&str; 10] =
    ["render", "--backend", "cpu", "--stride", "3", "--window", "0.5", "--force", "--face-box", "center"];

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cadence"))
        .args(RENDER)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cadence")
}

fn ok(o: &Output) {
    assert!(o.status.success(), "cadence failed: {}", String::from_utf8_lossy(&o.stderr));
}

/// `samples` written as a WAV file in `dir` and rendered the file's way (with `RENDER` and
/// `extra`) to a fragmented MP4 there, whose path is returned.
fn render_as_file(dir: &Path, samples: &[i16], rate: u32, avatar: &Path, extra: &[&str]) -> PathBuf {
    let wav = dir.join("speech.wav");
    let data = pcm(samples);
    std::fs::write(&wav, [wav_header(rate, Some(data.len() as u32)), data].concat()).unwrap();
    let out = dir.join("file.mp4");
    let o = Command::new(env!("CARGO_BIN_EXE_cadence"))
        .args(RENDER)
        .args(["--audio", wav.to_str().unwrap(), "--avatar", avatar.to_str().unwrap(), "--fragmented", "-o"])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    ok(&o);
    out
}

/// Mean over the frames of the luma PSNR (dB) between two decoded NV12 videos `width` pixels
/// wide, inside the box `(x, y, w, h)`.
fn mean_luma_psnr(a: &[Vec<u8>], b: &[Vec<u8>], width: usize, (x0, y0, w, h): (usize, usize, usize, usize)) -> f64 {
    let per_frame: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            let mut sum = 0.0;
            for row in y0..y0 + h {
                let r = row * width + x0..row * width + x0 + w;
                sum += x[r.clone()].iter().zip(&y[r]).map(|(&p, &q)| (p as f64 - q as f64).powi(2)).sum::<f64>();
            }
            let mse = sum / (w * h) as f64;
            if mse == 0.0 {
                99.0
            } else {
                10.0 * (255.0f64 * 255.0 / mse).log10()
            }
        })
        .collect();
    per_frame.iter().sum::<f64>() / per_frame.len() as f64
}

/// The stream's first fragment leaves before the input closes (the writer holds the last
/// seconds back until it sees one), the stream ends cleanly when the input closes, and the
/// video is the file render's within a measured tolerance: the same frames, the same audio
/// track, pictures that differ only where the live rules differ (whisper sees the last 30 s
/// received, voice activity the levels so far).
#[test]
fn a_live_stream_renders_as_it_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let img = avatar(dir.path());
    let (samples, rate) = speech_samples();
    let live_out = dir.path().join("live.mp4");

    let mut child = spawn(&["--audio", "-", "--avatar", img.to_str().unwrap(), "-o", "-"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let received = Arc::new(Mutex::new(Vec::<u8>::new()));
    let reader = {
        let received = received.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1 << 14];
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => received.lock().unwrap().extend_from_slice(&buf[..n]),
                }
            }
        })
    };
    // The first 6 s (enough for the first 2 s GOP, a part and the lookahead), in 10 ms pieces.
    stdin.write_all(&wav_header(rate, None)).unwrap();
    let split = 6 * rate as usize;
    for piece in samples[..split].chunks(rate as usize / 100) {
        stdin.write_all(&pcm(piece)).unwrap();
    }
    stdin.flush().unwrap();
    let t = Instant::now();
    let has_fragment = |b: &[u8]| b.windows(4).any(|w| w == b"moof");
    while !has_fragment(&received.lock().unwrap()) {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "no fragment came out of 6 s of a live stream in 300 s (does the render wait for the input to close?)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stdin.write_all(&pcm(&samples[split..])).unwrap();
    drop(stdin);
    reader.join().unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(child.wait().unwrap().success(), "cadence failed: {stderr}");
    std::fs::write(&live_out, &*received.lock().unwrap()).unwrap();

    // The same audio as a file, rendered the file's way.
    let file_out = render_as_file(dir.path(), &samples, rate, &img, &[]);

    let live = Mp4Reader::open(&live_out).unwrap().decode_video().unwrap();
    let file = Mp4Reader::open(&file_out).unwrap().decode_video().unwrap();
    assert_eq!(live.frames.len(), file.frames.len(), "the live stream has another frame count than the file");
    let seconds = samples.len() as f64 / rate as f64;
    assert_eq!(live.frames.len(), (seconds * 25.0).ceil() as usize, "{seconds} s at 25 fps");
    let audio = |p: &Path| {
        let r = Mp4Reader::open(p).unwrap();
        let bytes = std::fs::read(p).unwrap();
        let a = r.audio_samples().unwrap().expect("an audio track");
        a.samples
            .iter()
            .map(|s| bytes[s.offset as usize..(s.offset + s.size as u64) as usize].to_vec())
            .collect::<Vec<_>>()
    };
    assert!(audio(&live_out) == audio(&file_out), "the live stream's audio track differs from the file's");
    // Inside the face box (`--face-box center`: a centred square of half the shorter side), where the
    // networks' output is; the background is the avatar's in both.
    let face = (96, 64, 128, 128);
    let psnr = mean_luma_psnr(&live.frames, &file.frames, live.width as usize, face);
    eprintln!("live vs file render: mean luma PSNR in the face box {psnr:.1} dB over {} frames", live.frames.len());
    assert!(psnr >= PSNR_BOUND_DB, "the live stream is far from the file render: face-box luma PSNR {psnr:.1} dB");
}

/// Ditto's live render: HuBERT's chunks and the LMDM's windows are local in time, so the stream's
/// motion is the file's, and where the live voice-activity rules decide as the file's (on this
/// clip, everywhere) every frame is the file render's. The first fragment leaves once the first
/// LMDM window's 80 frames of audio (and a GOP) have arrived, before the input closes.
#[test]
fn a_live_ditto_stream_is_the_file_render_as_it_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let img = avatar(dir.path());
    let (mut samples, rate) = speech_samples();
    // 7 s: three LMDM windows (at frames 0, 70 and 140, the last one padded).
    samples.truncate(7 * rate as usize);
    const DITTO: [&str; 7] = ["--engine", "ditto", "--ditto-infill", "motion", "--ditto-steps", "2", "--json"];
    let live_out = dir.path().join("live.mp4");
    let mut child = spawn(
        &[
            &["--audio", "-", "--avatar", img.to_str().unwrap(), "--fragmented", "-o"][..],
            &[live_out.to_str().unwrap()],
            &DITTO,
        ]
        .concat(),
    );
    let mut stdin = child.stdin.take().unwrap();
    // 4.5 s: the first window's 80 frames and HuBERT's lookahead, then a GOP of frames.
    stdin.write_all(&wav_header(rate, None)).unwrap();
    let split = 9 * rate as usize / 2;
    for piece in samples[..split].chunks(rate as usize / 100) {
        stdin.write_all(&pcm(piece)).unwrap();
    }
    stdin.flush().unwrap();
    let t = Instant::now();
    while !std::fs::read_dir(dir.path()).unwrap().any(|e| {
        let e = e.unwrap();
        e.path() != img && std::fs::read(e.path()).is_ok_and(|b| b.windows(4).any(|w| w == b"moof"))
    }) {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "no fragment came out of 4.5 s of a live Ditto stream in 300 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stdin.write_all(&pcm(&samples[split..])).unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["engine"].as_str(), v["audio"].as_str()), (Some("ditto"), Some("-")), "{v}");
    assert_eq!(v["live"]["part_frames"].as_u64(), Some(15), "--window 0.5 at stride 3: parts of 15 frames");

    let file_out = render_as_file(dir.path(), &samples, rate, &img, &DITTO);
    let live = Mp4Reader::open(&live_out).unwrap().decode_video().unwrap();
    let file = Mp4Reader::open(&file_out).unwrap().decode_video().unwrap();
    assert_eq!(live.frames.len(), 175, "7 s at 25 fps");
    assert_eq!(live.frames.len(), file.frames.len());
    let differing: Vec<usize> = (0..live.frames.len()).filter(|&f| live.frames[f] != file.frames[f]).collect();
    assert!(differing.is_empty(), "live frames that differ from the file render's: {differing:?}");
}

/// A stream that stops inside its header, or inside a sample frame: an error, a non-zero exit,
/// and no output file left; on standard output, the stream stops after its last whole fragment.
#[test]
fn a_broken_live_stream_is_an_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = avatar(dir.path());
    let (samples, rate) = speech_samples();
    let out = dir.path().join("out.mp4");
    let cases: [(&str, Vec<u8>); 2] = [
        ("mid-header", wav_header(rate, None)[..30].to_vec()),
        ("mid-sample", [wav_header(rate, None), pcm(&samples[..rate as usize * 3 / 2]), vec![0x12]].concat()),
    ];
    for (what, input) in cases {
        let mut child =
            spawn(&["--audio", "-", "--avatar", img.to_str().unwrap(), "--fragmented", "-o", out.to_str().unwrap()]);
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
        drop(stdin);
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what}: a broken stream was accepted");
        assert!(err.contains("standard input"), "{what}: the error does not name the input: {err}");
        assert!(!out.exists(), "{what}: a partial output file was left");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "avatar.png")
            .collect();
        assert!(leftovers.is_empty(), "{what}: files left beside the output: {leftovers:?}");
    }

    // To standard output: what was written is whole fragments (it parses), then the error. 4 s
    // of audio: one whole 2 s fragment, and a second one that is never finished.
    let mut child = spawn(&["--audio", "-", "--avatar", img.to_str().unwrap(), "-o", "-"]);
    let mut stdin = child.stdin.take().unwrap();
    let input = [wav_header(rate, None), pcm(&samples[..rate as usize * 4]), vec![0x12]].concat();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(!o.status.success(), "a stream cut inside a sample was accepted");
    assert!(String::from_utf8_lossy(&o.stderr).contains("sample frame"), "{}", String::from_utf8_lossy(&o.stderr));
    let partial = dir.path().join("partial.mp4");
    std::fs::write(&partial, &o.stdout).unwrap();
    let decoded = Mp4Reader::open(&partial).unwrap().decode_video().unwrap();
    assert!(!decoded.frames.is_empty(), "no whole fragment was written before the error");
    let gop = cadence_media::idr_period(cadence_media::FrameRate::whole(25)) as usize;
    assert_eq!(decoded.frames.len() % gop, 0, "the stream ends inside a fragment: {} frames", decoded.frames.len());
}

/// What a live stream cannot be given, refused before anything is read.
#[test]
fn live_stream_options_that_need_the_whole_clip_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = avatar(dir.path());
    let out = dir.path().join("out.mp4");
    let a = img.to_str().unwrap();
    let o = out.to_str().unwrap();
    for (args, says) in [
        (vec!["--audio", "-", "--avatar", a, "-o", o], "fragmented"),
        (vec!["--audio", "-", "--avatar", a, "--phonemes", "p.json", "-o", "-"], "fixed --stride"),
        (
            vec!["--engine", "ditto", "--audio", "-", "--avatar", a, "--audio-features", "f.npy", "-o", "-"],
            "--audio-features",
        ),
    ] {
        let mut child = spawn(&args);
        drop(child.stdin.take());
        let r = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success() && err.contains(says), "{args:?}: {err}");
        assert!(!out.exists());
    }
}
