//! Servers on real ports (127.0.0.1:0) sharing one set of cpu-reduced engines, a real HTTP
//! client, and the clips and images the tests send.
#![allow(dead_code)]

use cadence::musetalk::{DecoderKind, Engines};
use cadence_engines::{Device, Profile};
use cadence_server::{RunningServer, ServeArgs};
use clap::Parser;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Renders one at a time across the tests of a binary: two cores, and timing-based tests.
pub fn render_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn engines() -> Arc<Engines> {
    static E: OnceLock<Arc<Engines>> = OnceLock::new();
    E.get_or_init(|| Arc::new(Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None).unwrap())).clone()
}

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    serve: ServeArgs,
}

pub struct TestServer {
    pub server: RunningServer,
    /// The server's temp root: the request directories live here.
    pub temp: tempfile::TempDir,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// Entries left in the temp root.
    pub fn temp_entries(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.temp.path()).unwrap().map(|e| e.unwrap().path()).collect()
    }
}

/// `cadence serve` with `flags`, on a free loopback port, with its own temp root; the shared
/// engines unless `load` (then the server loads its own).
pub fn start_with(flags: &[&str], load: bool, temp: tempfile::TempDir) -> TestServer {
    let root = temp.path().to_str().unwrap().to_string();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--device", "cpu", "--temp-dir", &root];
    args.extend_from_slice(flags);
    let config = Flags::try_parse_from(&args).unwrap().serve.config().unwrap();
    let server = cadence_server::spawn(config, if load { None } else { Some(engines()) }).unwrap();
    let s = TestServer { server, temp };
    if !load {
        wait_for(Duration::from_secs(30), || get(&s, "/readyz").status() == 200);
    }
    s
}

pub fn start(flags: &[&str]) -> TestServer {
    start_with(flags, false, tempfile::tempdir().unwrap())
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

pub fn get(s: &TestServer, path: &str) -> reqwest::blocking::Response {
    client().get(s.url(path)).send().unwrap()
}

pub fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "condition not met within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of an unlabelled series (or of the one with `labels`) in /metrics; 0 when absent.
pub fn metric(s: &TestServer, series: &str) -> f64 {
    let text = get(s, "/metrics").text().unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// The `{"error": {"code", "message"}}` body of a refusal: its code.
pub fn error_code(r: reqwest::blocking::Response) -> String {
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().unwrap()).unwrap();
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    v["error"]["code"].as_str().unwrap().to_string()
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech").join(format!("{name}.wav"))
}

/// 25.6 s of speech with pauses: a render long enough to interrupt.
pub fn long_clip() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/assets/newscast_25s6.wav")).unwrap()
}

/// The first `seconds` of the long clip's speech, as a WAV of its own.
pub fn speech_clip(seconds: f64) -> Vec<u8> {
    let mut r = hound::WavReader::new(Cursor::new(long_clip())).unwrap();
    let spec = r.spec();
    let n = (seconds * spec.sample_rate as f64) as usize * spec.channels as usize;
    let samples: Vec<i16> = r.samples::<i16>().take(n).map(Result::unwrap).collect();
    assert_eq!(samples.len(), n, "the long clip is shorter than {seconds} s");
    let mut buf = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut buf, spec).unwrap();
    samples.into_iter().for_each(|s| w.write_sample(s).unwrap());
    w.finalize().unwrap();
    buf.into_inner()
}

/// `seconds` of a warbling tone at 16 kHz (16-bit PCM mono).
pub fn tone_wav(seconds: f64) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut buf = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut buf, spec).unwrap();
    for i in 0..(seconds * 16000.0) as usize {
        let t = i as f64 / 16000.0;
        let s = 0.5 * (2.0 * std::f64::consts::PI * (220.0 + 80.0 * (7.0 * t).sin()) * t).sin();
        w.write_sample((s * 32767.0) as i16).unwrap();
    }
    w.finalize().unwrap();
    buf.into_inner()
}

/// A float WAV whose samples are NaN from the middle on.
pub fn nan_wav() -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut buf = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut buf, spec).unwrap();
    for i in 0..8000 {
        w.write_sample(if i < 4000 { 0.1f32 } else { f32::NAN }).unwrap();
    }
    w.finalize().unwrap();
    buf.into_inner()
}

/// A smooth `w` x `h` PNG portrait.
pub fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, (((x + y) * 3) % 256) as u8])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// A real face for the detector: the top middle 256x256 of the committed public-domain portrait
/// (fixtures/mtcnn/astronaut.png, 512x512; the face at about (85,62)-(172,172) here), as a PNG.
pub fn face_png() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/mtcnn/astronaut.png");
    let img = image::open(path).unwrap().to_rgb8();
    let crop = image::imageops::crop_imm(&img, 96, 0, 256, 256).to_image();
    let mut out = Cursor::new(Vec::new());
    crop.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// [`face_png`]'s portrait as a video avatar of `frames` frames (H.264 by cadence's own writer,
/// 25 fps; BT.601 studio-range NV12), as bytes.
pub fn face_video(frames: usize) -> Vec<u8> {
    use cadence_media::{EncoderKind, FrameRate, VideoWriter};
    let img = image::load_from_memory(&face_png()).unwrap().to_rgb8();
    let (w, h) = img.dimensions();
    let px = |x: u32, y: u32| img.get_pixel(x, y).0.map(f32::from);
    let mut nv12: Vec<u8> = img
        .pixels()
        .map(|p| (16.0 + (65.481 * p[0] as f32 + 128.553 * p[1] as f32 + 24.966 * p[2] as f32) / 255.0) as u8)
        .collect();
    for y in (0..h).step_by(2) {
        for x in (0..w).step_by(2) {
            let q = [px(x, y), px(x + 1, y), px(x, y + 1), px(x + 1, y + 1)];
            let [r, g, b] = [0, 1, 2].map(|c| q.iter().map(|p| p[c]).sum::<f32>() / 4.0);
            nv12.push((128.0 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255.0).round() as u8);
            nv12.push((128.0 + (112.0 * r - 93.786 * g - 18.214 * b) / 255.0).round() as u8);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("face.mp4");
    let mut v = VideoWriter::create(&p, w, h, FrameRate::whole(25), EncoderKind::OpenH264, None).unwrap();
    for _ in 0..frames {
        v.push_nv12(&nv12).unwrap();
    }
    v.finish().unwrap();
    std::fs::read(p).unwrap()
}

pub fn part(bytes: Vec<u8>, name: &str, mime: &str) -> reqwest::blocking::multipart::Part {
    reqwest::blocking::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str(mime).unwrap()
}

/// A multipart /generate form with `audio` and the given text fields.
pub fn form(audio: Vec<u8>, fields: &[(&str, &str)]) -> reqwest::blocking::multipart::Form {
    let mut f = reqwest::blocking::multipart::Form::new().part("audio", part(audio, "speech.wav", "audio/wav"));
    for (k, v) in fields {
        f = f.text(k.to_string(), v.to_string());
    }
    f
}

/// Writes an MP4 body to a file and probes it with the repository's own reader.
pub fn probe(body: &[u8]) -> cadence_media::Mp4Info {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("out.mp4");
    std::fs::write(&p, body).unwrap();
    cadence_media::probe(&p).unwrap()
}

/// The top-level boxes of an MP4: (type, start, end) in bytes.
pub fn top_level_boxes(mp4: &[u8]) -> Vec<(String, usize, usize)> {
    let mut boxes = Vec::new();
    let mut at = 0;
    while at + 8 <= mp4.len() {
        let size = u32::from_be_bytes(mp4[at..at + 4].try_into().unwrap()) as usize;
        assert!(size >= 8 && at + size <= mp4.len(), "a box of {size} bytes at {at} of {}", mp4.len());
        boxes.push((String::from_utf8_lossy(&mp4[at + 4..at + 8]).into_owned(), at, at + size));
        at += size;
    }
    assert_eq!(at, mp4.len(), "bytes after the last box");
    boxes
}

/// For each read of a body: seconds since the start, and the bytes received so far.
pub type Arrivals = Vec<(f64, usize)>;

/// A transfer that broke off: the error, and the bytes that came before it.
pub type CutOff = (std::io::Error, Vec<u8>);

/// Reads a response body as it arrives: the bytes, and for each read the seconds since `t0`
/// and the bytes received so far. A transfer that breaks off is the error, with what came.
pub fn read_timed(r: &mut reqwest::blocking::Response, t0: Instant) -> Result<(Vec<u8>, Arrivals), CutOff> {
    use std::io::Read;
    let (mut body, mut arrivals, mut buf) = (Vec::new(), Vec::new(), vec![0u8; 1 << 16]);
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok((body, arrivals)),
            Ok(n) => {
                body.extend_from_slice(&buf[..n]);
                arrivals.push((t0.elapsed().as_secs_f64(), body.len()));
            }
            Err(e) => return Err((e, body)),
        }
    }
}

pub fn header<'a>(r: &'a reqwest::blocking::Response, name: &str) -> &'a str {
    r.headers().get(name).unwrap_or_else(|| panic!("no {name} header")).to_str().unwrap()
}

/// Records a test that could check nothing here (scripts/test.sh lists them).
pub fn skipped(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("{test}: {reason}");
    eprintln!("SKIPPED: {line}");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// The test video avatar's size and face box (x, y, w, h).
pub const VIDEO_W: u32 = 128;
pub const VIDEO_H: u32 = 160;
pub const VIDEO_FACE: (usize, usize, usize, usize) = (32, 40, 64, 80);

pub fn in_video_face(x: usize, y: usize) -> bool {
    let f = VIDEO_FACE;
    (f.0..f.0 + f.2).contains(&x) && (f.1..f.1 + f.3).contains(&y)
}

/// NV12 frame `i` of a test video avatar: a flat background at `level`, the face box textured
/// differently in each frame, chroma near grey (inside the RGB gamut, so nothing clamps).
fn video_avatar_nv12(i: usize, level: u8, w: u32, h: u32) -> Vec<u8> {
    let (w, h) = (w as usize, h as usize);
    let mut f = vec![level; w * h];
    for y in 0..h {
        for x in 0..w {
            if in_video_face(x, y) {
                let v = 128.0 + 90.0 * ((x as f32 * 0.21 + i as f32 * 1.7).sin() * (y as f32 * 0.13).cos());
                f[y * w + x] = v as u8;
            }
        }
    }
    f.extend((0..w * h / 2).map(|j| if j % 2 == 0 { 128 - 6 * i as u8 } else { 124 + 5 * i as u8 }));
    f
}

/// A video avatar MP4 (H.264 by cadence's own writer, OpenH264, 25 fps) of `w` x `h` frames
/// with the given background levels, as bytes.
pub fn video_avatar(levels: &[u8], w: u32, h: u32) -> Vec<u8> {
    use cadence_media::{EncoderKind, FrameRate, VideoWriter};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("avatar.mp4");
    let mut v = VideoWriter::create(&p, w, h, FrameRate::whole(25), EncoderKind::OpenH264, None).unwrap();
    for (i, &l) in levels.iter().enumerate() {
        v.push_nv12(&video_avatar_nv12(i % 3, l, w, h)).unwrap();
    }
    v.finish().unwrap();
    std::fs::read(p).unwrap()
}

/// A child process (a browser, a nats-server, a replica) killed with SIGKILL and reaped when
/// dropped, so that a failing test leaves none behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
