//! Prepared avatars on disk (`.cadence-avatar`): what [`crate::musetalk::render::prepare_avatar_source`]
//! computes once per avatar frame (the image encoder's reference and masked latents, the rest
//! latent and its decoded crop, the compositor's face box and tables), so that `render --avatar
//! FILE` skips it. A still image is one frame, a video avatar one per frame.
//!
//! Layout (little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 16 | magic `cadence-avatar\n\0` |
//! | 4 | format version ([`VERSION`]) |
//! | 4 | header length H |
//! | H | header, JSON (`Header`): frame size, per avatar frame its face box and feather, the colour matrix, the engines the latents belong to, section sizes |
//! | ... | sections in header order (`frame<i>.<name>`, per avatar frame in order): f32 or u8 arrays |
//! | 32 | SHA-256 of everything before it |
//!
//! The latents are only meaningful for the engines that made them: the header names the
//! profile, the decoder and the weights, and loading with other engines is refused.

use crate::backend::composite::{Compositor, CompositorTables, FaceBox};
use crate::musetalk::render::PreparedAvatar;
use crate::musetalk::{AvatarLatents, Engines, FACE_SIDE, LATENT_DIM};
use crate::{Backend, ColorMatrix};
use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;

const MAGIC: &[u8; 16] = b"cadence-avatar\n\0";
/// The version this cadence writes and reads; a file of another version is refused (prepare
/// it again). Version 2 holds any number of avatar frames (version 1 held one).
pub const VERSION: u32 = 2;
/// The extension `render --avatar` recognises.
pub const EXTENSION: &str = "cadence-avatar";
/// Files larger than this are refused before reading: an avatar's per-frame data in a render
/// are at most [`crate::avatar::MAX_AVATAR_BYTES`], and the file holds the same arrays.
const MAX_BYTES: u64 = crate::avatar::MAX_AVATAR_BYTES + (1 << 20);
const HEADER_MAX: usize = 1 << 20;

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
struct Header {
    width: usize,
    height: usize,
    /// Per avatar frame: the face box (x, y, w, h) and the compositor's feather.
    faces: Vec<[u32; 4]>,
    feathers: Vec<f32>,
    matrix: ColorMatrix,
    profile: String,
    decoder: String,
    weights: String,
    /// (name, element type `f32` | `u8`, elements), in file order.
    sections: Vec<(String, String, usize)>,
}

/// The engines' identity a file's latents belong to: (profile, decoder, weights).
fn engines_identity(engines: &Engines) -> (String, String, String) {
    (engines.profile.to_string(), format!("{:?}", engines.decoder_kind), engines.weights_summary())
}

/// Writes `avatar` (prepared by `engines`) to `out` through the output policy.
pub fn save(avatar: &PreparedAvatar, engines: &Engines, out: &crate::io::output::OutputPath) -> Result<()> {
    let bytes = encode(avatar, engines)?;
    out.write(|w| Ok(std::io::Write::write_all(w, &bytes)?))
}

/// The names of one avatar frame's f32 sections, in file order (then its `background_nv12`).
const F32_SECTIONS: [&str; 8] =
    ["alpha", "background_r", "background_g", "background_b", "reference", "masked", "rest", "rest_rgb"];

fn section_name(frame: usize, name: &str) -> String {
    format!("frame{frame}.{name}")
}

/// The file's bytes for `avatar`.
pub fn encode(avatar: &PreparedAvatar, engines: &Engines) -> Result<Vec<u8>> {
    let first = avatar.compositors.first().context("an avatar without frames")?;
    ensure!(avatar.avatar.len() == avatar.compositors.len(), "the avatar's latents and compositors differ in number");
    let mut sections: Vec<(String, String, usize)> = Vec::new();
    let mut data = Vec::new();
    for (i, (c, a)) in avatar.compositors.iter().zip(avatar.avatar.iter()).enumerate() {
        let t = c.tables();
        let f32s: [&[f32]; 8] = [
            &t.alpha,
            &t.background_term[0],
            &t.background_term[1],
            &t.background_term[2],
            &a.reference,
            &a.masked,
            &a.rest,
            &a.rest_rgb,
        ];
        for (name, v) in F32_SECTIONS.iter().zip(f32s) {
            sections.push((section_name(i, name), "f32".into(), v.len()));
            data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        }
        sections.push((section_name(i, "background_nv12"), "u8".into(), t.background_nv12.len()));
        data.extend_from_slice(&t.background_nv12);
    }
    let (profile, decoder, weights) = engines_identity(engines);
    let header = Header {
        width: first.width,
        height: first.height,
        faces: avatar.compositors.iter().map(|c| [c.face.x, c.face.y, c.face.w, c.face.h]).collect(),
        feathers: avatar.compositors.iter().map(|c| c.feather).collect(),
        matrix: first.matrix,
        profile,
        decoder,
        weights,
        sections,
    };
    let header = serde_json::to_vec(&header)?;
    let mut out = Vec::with_capacity(24 + header.len() + data.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&data);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    Ok(out)
}

/// Whether `path` names a prepared-avatar file (by its extension).
pub fn is_avatar_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == EXTENSION)
}

/// Reads a prepared avatar for `engines`, with its compositor on `backend`.
pub fn load(path: &Path, engines: &Engines, backend: &Backend) -> Result<PreparedAvatar> {
    let bytes = read(path)?;
    decode(&bytes, engines, backend).with_context(|| format!("{}", path.display()))
}

/// Checks a prepared-avatar file without engines: its format version, its size and its
/// checksum (what can be refused before the engines load).
pub fn check(path: &Path) -> Result<()> {
    let bytes = read(path)?;
    parse(&bytes).map(|_| ()).with_context(|| format!("{}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    let shown = path.display();
    let len = std::fs::metadata(path).with_context(|| format!("{shown}: cannot read"))?.len();
    ensure!(len <= MAX_BYTES, "{shown}: {len} bytes is larger than any prepared avatar ({MAX_BYTES} at most)");
    std::fs::read(path).with_context(|| format!("{shown}: cannot read"))
}

/// The header and where the data start, once magic, version, sizes and checksum are checked.
fn parse(bytes: &[u8]) -> Result<(Header, usize)> {
    ensure!(
        bytes.len() >= 24 && &bytes[..16] == MAGIC,
        "not a prepared cadence avatar (`cadence avatar prepare` makes one)"
    );
    let version = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    ensure!(
        version == VERSION,
        "a prepared avatar of format version {version}; this cadence reads version {VERSION}: prepare it again with `cadence avatar prepare`"
    );
    ensure!(bytes.len() >= 24 + 32, "truncated: the file ends inside its header");
    let body = &bytes[..bytes.len() - 32];
    let header_len = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes")) as usize;
    ensure!(header_len <= HEADER_MAX && 24 + header_len <= body.len(), "truncated: the file ends inside its header");
    let header: Header =
        serde_json::from_slice(&body[24..24 + header_len]).context("corrupt: the header is not valid JSON")?;
    let mut want = 0usize;
    for (name, ty, n) in &header.sections {
        let size = match ty.as_str() {
            "f32" => 4,
            "u8" => 1,
            _ => bail!("corrupt: section {name} has an unknown type {ty}"),
        };
        want = n.checked_mul(size).and_then(|b| want.checked_add(b)).context("corrupt: section sizes overflow")?;
    }
    let have = body.len() - 24 - header_len;
    ensure!(have >= want, "truncated: {have} bytes of data, the header describes {want}");
    ensure!(have == want, "corrupt: {have} bytes of data, the header describes {want}");
    ensure!(
        Sha256::digest(body).as_slice() == &bytes[body.len()..],
        "corrupt: the checksum does not match the contents"
    );
    Ok((header, 24 + header_len))
}

/// [`load`] from bytes.
pub fn decode(bytes: &[u8], engines: &Engines, backend: &Backend) -> Result<PreparedAvatar> {
    let (header, data) = parse(bytes)?;
    let body = &bytes[..bytes.len() - 32];
    let (profile, decoder, weights) = engines_identity(engines);
    if (&header.profile, &header.decoder, &header.weights) != (&profile, &decoder, &weights) {
        bail!(
            "prepared for other engines ({} profile, {} decoder, weights {}); these are {profile}, {decoder}, {weights}: prepare it again with the same --profile, --decoder and --models",
            header.profile,
            header.decoder,
            header.weights
        );
    }
    let frames = header.faces.len();
    ensure!(
        (1..=crate::avatar::MAX_AVATAR_FRAMES).contains(&frames) && header.feathers.len() == frames,
        "corrupt: {frames} face boxes and {} feathers",
        header.feathers.len()
    );
    ensure!(
        (16..=cadence_media::MAX_FRAME_SIDE as usize).contains(&header.width)
            && (16..=cadence_media::MAX_FRAME_SIDE as usize).contains(&header.height),
        "corrupt: a {}x{} frame",
        header.width,
        header.height
    );
    let mut at = data;
    let mut f32s = std::collections::HashMap::new();
    let mut nv12s = std::collections::HashMap::new();
    for (name, ty, n) in &header.sections {
        match ty.as_str() {
            "f32" => {
                let v: Vec<f32> = body[at..at + 4 * n]
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect();
                at += 4 * n;
                f32s.insert(name.clone(), v);
            }
            "u8" if name.ends_with(".background_nv12") => {
                nv12s.insert(name.clone(), body[at..at + n].to_vec());
                at += n;
            }
            _ => bail!("corrupt: unknown section {name} of type {ty}"),
        }
    }
    let mut take = |name: &str, len: Option<usize>| -> Result<Vec<f32>> {
        let v = f32s.remove(name).with_context(|| format!("corrupt: no {name} section"))?;
        if let Some(len) = len {
            ensure!(v.len() == len, "corrupt: {name} has {} values, expected {len}", v.len());
        }
        ensure!(v.iter().all(|x| x.is_finite()), "corrupt: {name} holds a NaN or infinite value");
        Ok(v)
    };
    let crop = 3 * FACE_SIDE * FACE_SIDE;
    let (mut avatar, mut compositors) = (Vec::with_capacity(frames), Vec::with_capacity(frames));
    for (i, (&[x, y, w, h], &feather)) in header.faces.iter().zip(&header.feathers).enumerate() {
        let name = |s: &str| section_name(i, s);
        avatar.push(AvatarLatents {
            reference: take(&name("reference"), Some(LATENT_DIM))?,
            masked: take(&name("masked"), Some(LATENT_DIM))?,
            rest: take(&name("rest"), Some(LATENT_DIM))?,
            rest_rgb: take(&name("rest_rgb"), Some(crop))?,
        });
        let tables = CompositorTables {
            alpha: take(&name("alpha"), None)?,
            background_term: [
                take(&name("background_r"), None)?,
                take(&name("background_g"), None)?,
                take(&name("background_b"), None)?,
            ],
            background_nv12: nv12s
                .remove(&name("background_nv12"))
                .with_context(|| format!("corrupt: no {} section", name("background_nv12")))?,
        };
        ensure!(feather.is_finite() && feather >= 0.0, "corrupt: feather {feather}");
        let face = FaceBox { x, y, w, h };
        compositors.push(
            Compositor::from_tables(backend, header.width, header.height, face, feather, header.matrix, tables)
                .context("corrupt")?,
        );
    }
    Ok(PreparedAvatar {
        avatar: Arc::new(avatar),
        compositors: Arc::new(compositors),
        avatar_encoder_ms: 0.0,
        avatar_encoder_cpu_ms: 0.0,
        compositor_setup_ms: 0.0,
    })
}
