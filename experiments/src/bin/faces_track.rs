//! The face box on video avatars (issue 40): steadiness, lag and what detection costs in an
//! avatar's preparation.
//!
//! A public-domain portrait (fixtures/mtcnn/astronaut.png, 512x512) is placed in a 1080x1920
//! grey frame and moved:
//! - `still`: a still head moved by sub-pixel shifts (seeded, uniform in [-0.5, 0.5) px on each
//!   axis): frame-to-frame jitter of the box centre, as detected and after the filter over time
//!   (`cadence::avatar::steady::centre_jitter_px`; target <= 0.5 px);
//! - `pan`: a head panned at 4 px/frame: the lag of the box centre behind the true motion
//!   (`lag_frames`; the true centre is the detector's centre on the unmoved portrait, estimated
//!   from every detection less the known motion, plus the motion; target <= 1 frame);
//! - `still_mp4`: the still scene written as an H.264 MP4 (cadence's writer) and prepared as a
//!   video avatar: `AvatarSource::open` (decoding and finding the face) then
//!   `prepare_avatar_source` (decoding, the image encoder's latents, the compositor's tables,
//!   CPU, reduced profile, TAESD, synthetic weights): the share of detection in the preparation
//!   (target <= 20%). A 1000-frame 1080x1920 avatar is over the render's 1 GiB bound on per-frame
//!   tables, so the share is measured on `--prep-frames` frames; every part is a per-frame cost.
//!
//! Detection times per frame: the whole frame (the first frame, or a lost face) and tracked (the
//! region around the last face, at a pyramid from half its size), medians. Writes
//! `faces_track.csv` with provenance (commit, date, CPU, the instruction-set level).

use anyhow::{ensure, Context, Result};
use cadence::avatar::faces::{track_faces, DetectOptions, FaceSpec, FoundFaces};
use cadence::avatar::steady::{centre_jitter_px, lag_frames};
use cadence::avatar::AvatarSource;
use cadence::measure::bench::median;
use cadence::measure::fixtures::{place_image, sub_pixel_shifts};
use cadence::musetalk::{DecoderKind, Engines};
use cadence::{Backend, ColorMatrix, RgbLayout, RgbRange};
use cadence_engines::mtcnn::detect::{Mtcnn, MtcnnConfig};
use cadence_engines::{Device, Profile};
use cadence_media::{EncoderKind, FrameRate, RgbImage, VideoWriter};
use clap::Parser;
use experiments::{workspace_root, write_csv, OutDir, Provenance};
use std::time::Instant;

const W: u32 = 1080;
const H: u32 = 1920;
const BG: u8 = 110;
/// Where the portrait's top-left corner sits when still.
const AT: (f64, f64) = (284.0, 700.0);
const PAN_PX_PER_FRAME: f64 = 4.0;

#[derive(Parser, Debug)]
#[command(
    name = "faces_track",
    about = "The face box on video avatars: jitter of a still head moved by sub-pixel shifts, lag of a panned one, and detection's share of a 1080x1920 video avatar's preparation"
)]
struct Args {
    /// Frames of the still and panned scenes.
    #[arg(long, default_value_t = 100)]
    frames: usize,
    /// Frames of the MP4 prepared as a video avatar (at most what the render's memory bound
    /// allows at 1080x1920).
    #[arg(long, default_value_t = 100)]
    prep_frames: usize,
    /// Timed whole-frame detections (median).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[command(flatten)]
    out: OutDir,
}

#[derive(serde::Serialize)]
struct Row {
    scene: String,
    frames: usize,
    metric: String,
    value: f64,
    target: String,
    met: String,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("faces_track: error: {e:#}");
        std::process::exit(1);
    }
}

fn centre_x(b: &[f32; 4]) -> f64 {
    (b[0] as f64 + b[2] as f64) / 2.0
}

/// The detector over frames with the portrait's corner at `offsets`; also each frame's detection
/// time.
fn track(portrait: &RgbImage, offsets: &[(f64, f64)]) -> Result<FoundFaces> {
    track_faces(offsets.len(), 25.0, &DetectOptions::default(), |f| {
        for (i, (x, y)) in offsets.iter().enumerate() {
            f(i, &place_image(portrait, W, H, *x, *y, BG))?;
        }
        Ok(())
    })
}

fn still_offsets(n: usize) -> Vec<(f64, f64)> {
    let (dx, dy) = (sub_pixel_shifts(n, 7), sub_pixel_shifts(n, 11));
    (0..n).map(|i| (AT.0 + dx[i], AT.1 + dy[i])).collect()
}

fn run(a: Args) -> Result<()> {
    ensure!(a.frames >= 8 && a.prep_frames >= 2 && a.runs >= 1, "--frames >= 8, --prep-frames >= 2, --runs >= 1");
    let out_dir = a.out.dir()?;
    let root = workspace_root();
    let portrait = cadence_media::load_image(root.join("fixtures/mtcnn/astronaut.png"))?;
    let mut rows = Vec::new();
    let mut row = |scene: &str, frames: usize, metric: &str, value: f64, target: Option<(f64, bool)>| {
        let (target, met) = match target {
            Some((t, lower)) => {
                let ok = if lower { value <= t } else { value >= t };
                (format!("{} {t}", if lower { "<=" } else { ">=" }), if ok { "yes" } else { "no" }.to_string())
            }
            None => (String::new(), String::new()),
        };
        eprintln!("{scene:>10} {metric:<34} {value:>10.3} {target} {met}");
        rows.push(Row { scene: scene.into(), frames, metric: metric.into(), value, target, met });
    };

    // Whole-frame detection, for scale.
    let frame = place_image(&portrait, W, H, AT.0, AT.1, BG);
    let mtcnn = Mtcnn::new(&Device::Cpu, MtcnnConfig::default())?;
    let mut times = Vec::new();
    for _ in 0..a.runs {
        let t = Instant::now();
        let faces = mtcnn.detect(frame.as_raw(), W as usize, H as usize)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        ensure!(faces.len() == 1, "the portrait in the frame: {} faces found", faces.len());
    }
    row("frame", 1, "whole_frame_detect_ms", median(&times), None);

    // A still head moved by sub-pixel shifts.
    let n = a.frames;
    let found = track(&portrait, &still_offsets(n))?;
    ensure!(found.detected == n, "still: the face found in {} of {n} frames", found.detected);
    let raw: Vec<[f32; 4]> = found.raw.iter().map(|f| f.expect("detected").bbox).collect();
    let steady: Vec<[f32; 4]> = found.faces.iter().map(|f| f.bbox).collect();
    row("still", n, "centre_jitter_px_detected", centre_jitter_px(&raw), None);
    row("still", n, "centre_jitter_px_steadied", centre_jitter_px(&steady), Some((0.5, true)));
    row("still", n, "detect_ms_per_frame_tracked", found.detect_ms / n as f64, None);

    // A head panned at 4 px/frame.
    let offsets: Vec<(f64, f64)> = (0..n).map(|i| (100.0 + PAN_PX_PER_FRAME * i as f64, AT.1)).collect();
    ensure!(offsets[n - 1].0 + portrait.width() as f64 <= W as f64, "--frames: the pan leaves the frame");
    let found = track(&portrait, &offsets)?;
    ensure!(found.detected == n, "pan: the face found in {} of {n} frames", found.detected);
    let raw: Vec<f64> = found.raw.iter().map(|f| centre_x(&f.expect("detected").bbox)).collect();
    let c0 = raw.iter().enumerate().map(|(i, c)| c - PAN_PX_PER_FRAME * i as f64).sum::<f64>() / n as f64;
    let truth: Vec<f64> = (0..n).map(|i| c0 + PAN_PX_PER_FRAME * i as f64).collect();
    let steady: Vec<f64> = found.faces.iter().map(|f| centre_x(&f.bbox)).collect();
    row("pan", n, "lag_frames_detected", lag_frames(&raw, &truth), None);
    row("pan", n, "lag_frames_steadied", lag_frames(&steady, &truth).abs(), Some((1.0, true)));
    let worst = steady.iter().zip(&truth).map(|(s, t)| (s - t).abs()).fold(0.0, f64::max);
    row("pan", n, "max_centre_error_px_steadied", worst, None);
    row("pan", n, "detect_ms_per_frame_tracked", found.detect_ms / n as f64, None);

    // The still scene as an H.264 video avatar, prepared.
    let mp4 = std::env::temp_dir().join(format!("cadence-faces-track-{}.mp4", std::process::id()));
    let m = a.prep_frames;
    let mut writer = VideoWriter::create(&mp4, W, H, FrameRate::whole(25), EncoderKind::OpenH264, None)?;
    for (x, y) in still_offsets(m) {
        let img = place_image(&portrait, W, H, x, y, BG);
        let plane = (W * H) as usize;
        let mut planar = vec![0f32; 3 * plane];
        for (i, px) in img.as_raw().chunks_exact(3).enumerate() {
            for c in 0..3 {
                planar[c * plane + i] = px[c] as f32 / 255.0;
            }
        }
        let layout = RgbLayout::packed(W as usize, H as usize, 1);
        writer.push_nv12(&Backend::Cpu.rgb_to_nv12(&planar, layout, ColorMatrix::Bt709, RgbRange::Unit)?)?;
    }
    writer.finish()?;
    let t = Instant::now();
    let source = AvatarSource::open(&mp4, &FaceSpec::Detect(DetectOptions::default())).context("opening the MP4")?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let found = source.found.clone().context("the face was found")?;
    ensure!(found.detected == m, "still_mp4: the face found in {} of {m} frames", found.detected);
    let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None)?;
    let t = Instant::now();
    let prepared = cadence::musetalk::render::prepare_avatar_source(&engines, &Backend::Cpu, &source)?;
    let prepare_ms = t.elapsed().as_secs_f64() * 1e3;
    std::fs::remove_file(&mp4).ok();
    let total = open_ms + prepare_ms;
    let raw: Vec<[f32; 4]> = found.raw.iter().map(|f| f.expect("detected").bbox).collect();
    let steady: Vec<[f32; 4]> = found.faces.iter().map(|f| f.bbox).collect();
    row("still_mp4", m, "centre_jitter_px_detected", centre_jitter_px(&raw), None);
    row("still_mp4", m, "centre_jitter_px_steadied", centre_jitter_px(&steady), Some((0.5, true)));
    row("still_mp4", m, "open_ms_per_frame (decode + detect)", open_ms / m as f64, None);
    row("still_mp4", m, "detect_ms_per_frame", found.detect_ms / m as f64, None);
    row("still_mp4", m, "prepare_ms_per_frame (decode + encode + tables)", prepare_ms / m as f64, None);
    row("still_mp4", m, "encoder_ms_per_frame", prepared.avatar_encoder_ms / m as f64, None);
    row("still_mp4", m, "detect_share_of_preparation_pct", 100.0 * found.detect_ms / total, Some((20.0, true)));

    let mut prov = Provenance::gather(
        "cpu",
        "cpu-reduced (preparation), TAESD",
        "MTCNN: facenet-pytorch 2.6.0's trained weights; engines: synthetic",
    );
    prov.note("cpu_loops", cadence_engines::isa::describe());
    prov.note("threads", rayon::current_num_threads().to_string());
    prov.note("frame", format!("{W}x{H}, fixtures/mtcnn/astronaut.png (512x512) placed at {AT:?}"));
    let csv = out_dir.join("faces_track.csv");
    write_csv(&csv, &prov, &rows)?;
    eprintln!("wrote {}", csv.display());
    Ok(())
}
