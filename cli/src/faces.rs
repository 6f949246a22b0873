//! `cadence faces detect INPUT`: the faces MTCNN finds (cadence-engines' `mtcnn::detect`, the
//! trained weights of facenet-pytorch embedded) in an image, an image-sequence directory or an
//! MP4, frame by frame. Text by default; `--json` prints facenet-pytorch's convention: boxes
//! `[x1, y1, x2, y2]` and landmarks `[x, y]` in pixels (floats, top-left origin; left eye, right
//! eye, nose, left and right mouth corners), largest face first.

use anyhow::{Context, Result};
use cadence_engines::mtcnn::detect::{Face, Mtcnn, MtcnnConfig};
use cadence_engines::mtcnn::MODEL_SOURCE;
use cadence_engines::Device;
use cadence_media::image::RgbImage;
use clap::{Args, Subcommand};
use std::io::Write as _;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct FacesArgs {
    #[command(subcommand)]
    command: FacesCommand,
}

#[derive(Subcommand)]
enum FacesCommand {
    /// Every face in an image, a directory of PNG/JPEG frames (sorted by name) or an MP4.
    Detect(DetectArgs),
}

#[derive(Args)]
struct DetectArgs {
    /// An image (PNG, JPEG), a directory of them, or an MP4 video.
    input: PathBuf,
    /// Print JSON: `{"model": ..., "faces": [{"box": [x1, y1, x2, y2], "score": p, "landmarks":
    /// [[x, y] x 5]}]}` for an image; for a directory or a video, `"frames": [{"faces": [...]}, ...]`
    /// in place of `"faces"`.
    #[arg(long)]
    json: bool,
    /// The smallest face searched for, in pixels (facenet-pytorch's min_face_size). Smaller is
    /// slower.
    #[arg(long, default_value_t = 20.0, value_parser = cadence::args::parse_min_face_size)]
    min_face_size: f64,
}

pub fn run(a: FacesArgs) -> Result<()> {
    match a.command {
        FacesCommand::Detect(d) => detect(d),
    }
}

fn face_json(f: &Face) -> serde_json::Value {
    serde_json::json!({"box": f.bbox, "score": f.score, "landmarks": f.landmarks})
}

fn detect(a: DetectArgs) -> Result<()> {
    let mtcnn = Mtcnn::new(&Device::Cpu, MtcnnConfig { min_face_size: a.min_face_size, ..Default::default() })?;
    let input = &a.input;
    let find = |img: &RgbImage| -> Result<Vec<Face>> {
        mtcnn.detect(img.as_raw(), img.width() as usize, img.height() as usize).map_err(anyhow::Error::from)
    };
    let single = !input.is_dir() && !cadence::avatar::is_mp4(input);
    let mut frames: Vec<Vec<Face>> = Vec::new();
    let progress = |i: usize, n: usize| {
        if n > 1 && ((i + 1).is_multiple_of(25) || i + 1 == n) {
            eprintln!("faces: {} of {n} frames", i + 1);
        }
    };
    if single {
        frames.push(find(&cadence_media::load_image(input)?)?);
    } else if input.is_dir() {
        let files = cadence::avatar::sequence_files(input)?;
        for (i, file) in files.iter().enumerate() {
            frames.push(find(&cadence_media::load_image(file)?)?);
            progress(i, files.len());
        }
    } else {
        let info = cadence_media::avatar_video_info(input)?;
        let mut failed = None;
        cadence_media::for_each_avatar_frame(input, &info, |i, img| {
            match find(&img) {
                Ok(f) => frames.push(f),
                Err(e) => {
                    let msg = format!("{e:#}");
                    failed = Some(e);
                    return Err(cadence_media::MediaError::InvalidInput(msg));
                }
            }
            progress(i, info.frames);
            Ok(())
        })
        .map_err(|e| failed.take().unwrap_or_else(|| e.into()))?;
    }
    let out = if a.json {
        let mut v = serde_json::json!({ "model": format!("MTCNN, {MODEL_SOURCE}") });
        if single {
            v["faces"] = frames[0].iter().map(face_json).collect();
        } else {
            v["frames"] = frames
                .iter()
                .map(|f| serde_json::json!({"faces": f.iter().map(face_json).collect::<Vec<_>>()}))
                .collect();
        }
        serde_json::to_string_pretty(&v)? + "\n"
    } else {
        text(input, &frames, single)
    };
    // A closed pipe (`| head`) ends the output quietly.
    match std::io::stdout().write_all(out.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.with_context(|| "writing to standard output".to_string()),
    }
}

fn text(input: &Path, frames: &[Vec<Face>], single: bool) -> String {
    let mut s = String::new();
    for (i, faces) in frames.iter().enumerate() {
        let which = if single { input.display().to_string() } else { format!("frame {i}") };
        s += &format!("{which}: {} face{}\n", faces.len(), if faces.len() == 1 { "" } else { "s" });
        for f in faces {
            let [x1, y1, x2, y2] = f.bbox;
            s += &format!(
                "  box {x1:.1},{y1:.1} to {x2:.1},{y2:.1} ({:.0}x{:.0} px), score {:.4}, eyes ({:.1}, {:.1}) ({:.1}, {:.1})\n",
                x2 - x1,
                y2 - y1,
                f.score,
                f.landmarks[0][0],
                f.landmarks[0][1],
                f.landmarks[1][0],
                f.landmarks[1][1]
            );
        }
    }
    s
}
