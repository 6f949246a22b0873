//! `cadence avatar prepare`: an avatar's per-render work done once and kept in a file
//! (`cadence::musetalk::avatar_file`), which `cadence render --avatar FILE.cadence-avatar` reads instead.

use anyhow::{ensure, Result};
use cadence::args::EngineArgs;
use cadence::avatar::AvatarSource;
use cadence::io::output::{OutputPath, Overwrite};
use cadence::{musetalk::avatar_file, Backend, BackendChoice};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args)]
pub struct AvatarArgs {
    #[command(subcommand)]
    command: AvatarCommand,
}

#[derive(Subcommand)]
enum AvatarCommand {
    /// Crop, encode (reference, masked and rest latents, the rest frame decoded) and build the
    /// compositor's tables for a portrait, or for every frame of a video avatar, and write them
    /// to a `.cadence-avatar` file (with a format version and a checksum). The latents belong to
    /// the engines that made them: render it with the same --profile, --decoder and --models.
    Prepare(PrepareArgs),
}

#[derive(Args)]
struct PrepareArgs {
    /// Portrait as PNG or JPEG (even sides of at least 64 pixels, at most 3840x2160 or 2160x3840), or a video
    /// avatar: an H.264 MP4 or a directory of numbered PNG/JPEG frames (as `render --avatar`).
    image: PathBuf,
    /// The prepared avatar (its name must end in .cadence-avatar). Not replaced without --force.
    #[arg(short, long)]
    output: PathBuf,
    #[command(flatten)]
    faces: cadence::args::FaceArgs,
    #[command(flatten)]
    engines: EngineArgs,
    /// Where the compositor's tables are computed (they are the same on every backend).
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendChoice,
    /// Replace an existing output file.
    #[arg(long)]
    force: bool,
    /// Print what was prepared as JSON on standard output: the file, frames, size, engines,
    /// preparation time and `"face"` (the box used, where it came from, and the detector's box,
    /// score and landmarks when it found the face).
    #[arg(long)]
    json: bool,
}

pub fn run(a: AvatarArgs) -> Result<()> {
    match a.command {
        AvatarCommand::Prepare(p) => prepare(p),
    }
}

fn prepare(a: PrepareArgs) -> Result<()> {
    ensure!(
        avatar_file::is_avatar_file(&a.output),
        "{}: a prepared avatar's name ends in .{} (render --avatar recognises it by that)",
        a.output.display(),
        avatar_file::EXTENSION
    );
    let inputs: Vec<&std::path::Path> =
        [Some(a.image.as_path()), a.faces.face_boxes.as_deref()].into_iter().flatten().collect();
    let out = OutputPath::check(&a.output, Overwrite::from_force(a.force), &inputs)?;
    let source = AvatarSource::open(&a.image, &a.faces.spec()?)?;
    eprintln!("cadence: {}", cadence::avatar::faces::summary(&source));
    let (device, profile) = a.engines.device()?;
    let backend = Backend::for_engines(a.backend, &device.device)?;
    let engines = a.engines.load(&device, profile)?;
    let prepared = cadence::musetalk::render::prepare_avatar_source(&engines, &backend, &source)?;
    avatar_file::save(&prepared, &engines, &out)?;
    let face = source.faces[0];
    eprintln!(
        "cadence: wrote {} ({} frame{} of {}x{}, face box {},{},{},{}{}; {} profile, {:?} decoder, weights {}; {:.0} ms of preparation)",
        a.output.display(),
        source.frames(),
        if source.frames() == 1 { "" } else { "s" },
        source.width,
        source.height,
        face.x,
        face.y,
        face.w,
        face.h,
        if source.frames() > 1 { " in the first" } else { "" },
        engines.profile,
        engines.decoder_kind,
        engines.weights_summary(),
        prepared.avatar_encoder_ms + prepared.compositor_setup_ms
    );
    if a.json {
        let v = serde_json::json!({
            "output": a.output,
            "frames": source.frames(),
            "width": source.width,
            "height": source.height,
            "profile": engines.profile.to_string(),
            "decoder": format!("{:?}", engines.decoder_kind),
            "weights": engines.weights_summary(),
            "preparation_ms": prepared.avatar_encoder_ms + prepared.compositor_setup_ms,
            "face": cadence::avatar::faces::report(&source),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}
