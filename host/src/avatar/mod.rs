//! An avatar as `cadence render --avatar` and `cadence avatar prepare` read it: a still image
//! (PNG/JPEG), a video (an H.264 MP4) or an image sequence (a directory of PNG/JPEG files,
//! sorted by name), with one face box per avatar frame. Everything that can be checked without
//! decoding every frame is checked when it is opened ([`AvatarSource::open`]), before the
//! engines load: the container or the images' headers, even sides, a constant frame rate, the
//! number of frames and the memory the render's per-frame tables will take.
//!
//! A render shows avatar frame [`crate::avatar::cycle_index`]`(k, frames)` at output frame
//! k (MuseTalk's forward-then-backward cycle), one avatar frame per output frame whatever the
//! clip's own frame rate (as MuseTalk does).

pub mod faces;
pub mod mask;
pub mod steady;

use crate::backend::composite::FaceBox;
use anyhow::{bail, ensure, Context, Result};
use cadence_engines::{FACE_SIDE, LATENT_DIM};
use cadence_media::{AvatarVideoInfo, RgbImage};
pub use faces::{DetectOptions, FaceBoxArg, FaceSpec};
use std::path::{Path, PathBuf};

/// The most frames an avatar may have (40 s at 25 fps; 80 s of output before it repeats).
pub const MAX_AVATAR_FRAMES: usize = 1000;

/// The most memory an avatar's per-frame data may take in a render ([`frame_bytes`] summed
/// over its frames): 1 GiB, e.g. 124 frames of 1080x1920 with the default 540x540 face box.
pub const MAX_AVATAR_BYTES: u64 = 1 << 30;

/// The most bytes a face-box file may have (a thousand lines of `x,y,w,h` are about 20 KB).
const MAX_BOX_FILE_BYTES: u64 = 1 << 20;

/// What a render keeps per avatar frame of `width` x `height` with face box `face`: the
/// background's NV12 (1.5 bytes a pixel), the compositor's per-box-pixel blend weight and three
/// background terms (16 bytes a box pixel), and the latents (reference, masked, rest: 3 x 16 KB)
/// with the decoded rest frame (768 KB). About 8.6 MB at 1080x1920 with a 540x540 box.
pub fn frame_bytes(width: u32, height: u32, face: &FaceBox) -> u64 {
    let nv12 = width as u64 * height as u64 * 3 / 2;
    let tables = face.w as u64 * face.h as u64 * 16;
    let latents = 4 * (3 * LATENT_DIM + 3 * FACE_SIDE * FACE_SIDE) as u64;
    nv12 + tables + latents
}

/// The face box for a `width` x `height` frame: the given one (validated) or the default
/// centred box, moved to even coordinates and sizes (NV12 chroma blocks are 2x2).
pub fn face_box_in(width: u32, height: u32, given: Option<FaceBox>) -> Result<FaceBox> {
    let b = given.unwrap_or_else(|| FaceBox::centered(width, height));
    b.validate(width, height)?;
    let even = |v: u32| v & !1;
    let f = FaceBox { x: even(b.x), y: even(b.y), w: even(b.w), h: even(b.h) };
    ensure!(f.w >= 16 && f.h >= 16, "face box {f:?} is too small (at least 16x16 pixels)");
    Ok(f)
}

enum Frames {
    Still(RgbImage),
    Video { path: PathBuf, info: AvatarVideoInfo },
    Sequence(Vec<PathBuf>),
}

/// An avatar checked and ready to decode frame by frame.
pub struct AvatarSource {
    frames: Frames,
    pub width: u32,
    pub height: u32,
    /// One face box per avatar frame, on even coordinates.
    pub faces: Vec<FaceBox>,
    /// The faces the detector found (landmarks included), when the boxes came from it.
    pub found: Option<faces::FoundFaces>,
}

impl AvatarSource {
    /// Opens `path`: a directory is an image sequence, a file whose first box is `ftyp` an MP4,
    /// anything else an image; the face boxes come as `spec` says ([`FaceSpec`]). Detection
    /// decodes every frame once here; the other sources decode nothing but a still image.
    pub fn open(path: &Path, spec: &FaceSpec) -> Result<Self> {
        let (frames, width, height, count) = if path.is_dir() {
            let files = sequence_files(path)?;
            let (w, h) = sequence_size(&files)?;
            let n = files.len();
            (Frames::Sequence(files), w, h, n)
        } else if is_mp4(path) {
            let info = cadence_media::avatar_video_info(path)?;
            (Frames::Video { path: path.to_path_buf(), info }, info.width, info.height, info.frames)
        } else {
            let img = crate::avatar::load_avatar(path)?;
            let (w, h) = img.dimensions();
            (Frames::Still(img), w, h, 1)
        };
        ensure!(
            count <= MAX_AVATAR_FRAMES,
            "{}: {count} frames; an avatar has at most {MAX_AVATAR_FRAMES} (trim the clip)",
            path.display()
        );
        Self { frames, width, height, faces: Vec::new(), found: None }.with_faces(path, spec)
    }

    /// A still image already decoded (e.g. an upload the server checked) as an avatar, its face
    /// box from `spec` as [`Self::open`] takes it; `name` names it in errors.
    pub fn from_image(img: RgbImage, name: &Path, spec: &FaceSpec) -> Result<Self> {
        let (width, height) = img.dimensions();
        check_even(name, width, height)?;
        Self { frames: Frames::Still(img), width, height, faces: Vec::new(), found: None }.with_faces(name, spec)
    }

    /// The same avatar with its face boxes set anew as `spec` says, within the memory bound
    /// (e.g. opened with [`FaceSpec::Centered`] to check its size against a server's limits
    /// before the detector decodes every frame); `path` names it in errors.
    pub fn with_faces(mut self, path: &Path, spec: &FaceSpec) -> Result<Self> {
        self.found = None;
        let (count, width, height) = (self.frames(), self.width, self.height);
        // The smallest box first: an avatar over the memory limit whatever its box fails before
        // any frame is decoded for the detector.
        let smallest = FaceBox { x: 0, y: 0, w: 16, h: 16 };
        check_bytes(path, count, width, height, &vec![smallest; count])?;
        self.faces = match spec {
            FaceSpec::File(file) => read_face_boxes(file, count, width, height)?,
            FaceSpec::Given(b) => vec![face_box_in(width, height, Some(*b))?; count],
            FaceSpec::Centered => vec![face_box_in(width, height, None)?; count],
            FaceSpec::Detect(opts) => {
                let (found, boxes) =
                    faces::find_faces(&self, opts).with_context(|| format!("{}: finding the face", path.display()))?;
                self.found = Some(found);
                boxes
            }
        };
        check_bytes(path, count, width, height, &self.faces)?;
        Ok(self)
    }

    /// A still avatar's image (`None` for a video or an image sequence).
    pub fn into_still(self) -> Option<RgbImage> {
        match self.frames {
            Frames::Still(img) => Some(img),
            _ => None,
        }
    }

    /// MTCNN's landmarks of avatar frame `i` (frame pixels) when the face was found by the
    /// detector.
    pub fn landmarks(&self, i: usize) -> Option<&[[f32; 2]; 5]> {
        self.found.as_ref().map(|f| &f.faces[i].landmarks)
    }

    /// The clip's frame rate (a video avatar's; `None` for an image or an image sequence).
    pub fn fps(&self) -> Option<f64> {
        match &self.frames {
            Frames::Video { info, .. } => Some(info.fps),
            _ => None,
        }
    }

    /// Number of avatar frames.
    pub fn frames(&self) -> usize {
        match &self.frames {
            Frames::Still(_) => 1,
            Frames::Sequence(files) => files.len(),
            Frames::Video { info, .. } => info.frames,
        }
    }

    /// Hands each frame to `f` in order, decoding one at a time (a video's frames must decode
    /// to exactly the number of samples its container declared).
    pub fn for_each_frame(&self, mut f: impl FnMut(usize, &RgbImage) -> Result<()>) -> Result<()> {
        let n = self.frames();
        match &self.frames {
            Frames::Still(img) => f(0, img),
            Frames::Sequence(files) => {
                for (i, file) in files.iter().enumerate() {
                    let img = crate::avatar::load_avatar(file)?;
                    ensure!(
                        img.dimensions() == (self.width, self.height),
                        "{}: {}x{}, the other images are {}x{} (an image sequence's frames have one size)",
                        file.display(),
                        img.width(),
                        img.height(),
                        self.width,
                        self.height
                    );
                    f(i, &img)?;
                }
                Ok(())
            }
            Frames::Video { path, info } => {
                let mut failed = None;
                let decoded = cadence_media::for_each_avatar_frame(path, info, |i, img| {
                    let r = if i < n { f(i, &img) } else { Ok(()) };
                    r.map_err(|e| {
                        let msg = format!("{e:#}");
                        failed = Some(e);
                        cadence_media::MediaError::InvalidInput(msg)
                    })
                });
                if let Some(e) = failed {
                    return Err(e);
                }
                let decoded = decoded?;
                ensure!(
                    decoded == n,
                    "{}: {decoded} frames decoded, the container declares {n} (a damaged stream?)",
                    path.display()
                );
                Ok(())
            }
        }
    }
}

/// The render's per-frame tables of `count` frames with boxes `faces` within
/// [`MAX_AVATAR_BYTES`], or an error that says how many frames would fit.
fn check_bytes(path: &Path, count: usize, width: u32, height: u32, faces: &[FaceBox]) -> Result<()> {
    let bytes: u64 = faces.iter().map(|f| frame_bytes(width, height, f)).sum();
    if bytes > MAX_AVATAR_BYTES {
        let per = bytes / count as u64;
        bail!(
            "{}: {count} frames of {width}x{height} need {} MB for the render's per-frame tables ({:.1} MB a frame), \
             over the {} MB limit: use at most {} frames, or a smaller frame or face box",
            path.display(),
            bytes >> 20,
            per as f64 / (1 << 20) as f64,
            MAX_AVATAR_BYTES >> 20,
            MAX_AVATAR_BYTES / per.max(1)
        );
    }
    Ok(())
}

/// Whether `path` starts with an MP4 `ftyp` box (a file that cannot be read is not: the image
/// reader then says why). The one test of "video avatar or image" ([`AvatarSource::open`], and
/// the server's uploads).
pub fn is_mp4(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && &head[4..8] == b"ftyp"
}

/// The PNG and JPEG files of an image-sequence directory (by extension, any case), sorted by
/// name; other files are ignored.
pub fn sequence_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let shown = dir.display();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("{shown}: cannot read the directory"))? {
        let p = entry.with_context(|| format!("{shown}: cannot read the directory"))?.path();
        let image = p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["png", "jpg", "jpeg"].contains(&e.to_ascii_lowercase().as_str()));
        if image && p.is_file() {
            files.push(p);
        }
        ensure!(
            files.len() <= MAX_AVATAR_FRAMES,
            "{shown}: more than {MAX_AVATAR_FRAMES} images; an avatar has at most {MAX_AVATAR_FRAMES} frames"
        );
    }
    ensure!(!files.is_empty(), "{shown}: no PNG or JPEG files (an image-sequence avatar is a directory of them)");
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// The common size of a sequence's images, from their headers: all the same, each side even.
fn sequence_size(files: &[PathBuf]) -> Result<(u32, u32)> {
    let (w, h) = cadence_media::image_size(&files[0])?;
    for f in &files[1..] {
        let (fw, fh) = cadence_media::image_size(f)?;
        ensure!(
            (fw, fh) == (w, h),
            "{}: {fw}x{fh}, but {} is {w}x{h}: an image sequence's frames must all have one size",
            f.display(),
            files[0].display()
        );
    }
    check_even(&files[0], w, h)?;
    Ok((w, h))
}

/// Reads a face-box file: one box per avatar frame, in frame order, one per line as
/// `x,y,w,h` (pixels, the `--face-box` syntax); blank lines and lines starting with `#` are
/// skipped. Each box must lie inside the `width` x `height` frame; the count must be `frames`.
pub fn read_face_boxes(path: &Path, frames: usize, width: u32, height: u32) -> Result<Vec<FaceBox>> {
    let shown = path.display();
    let len = std::fs::metadata(path).with_context(|| format!("{shown}: cannot read"))?.len();
    ensure!(len <= MAX_BOX_FILE_BYTES, "{shown}: {len} bytes is larger than any face-box file ({MAX_BOX_FILE_BYTES})");
    let text = std::fs::read_to_string(path).with_context(|| format!("{shown}: cannot read as text"))?;
    let boxes = parse_face_boxes(&text, width, height).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    ensure!(
        boxes.len() == frames,
        "{shown}: {} face boxes for an avatar of {frames} frame{} (one box per frame, in order)",
        boxes.len(),
        if frames == 1 { "" } else { "s" }
    );
    Ok(boxes)
}

/// [`read_face_boxes`]' parser: the boxes of `text`, each validated against the frame; an
/// error names the line.
pub fn parse_face_boxes(text: &str, width: u32, height: u32) -> Result<Vec<FaceBox>> {
    let mut boxes = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let b = crate::avatar::parse_face_box(line).map_err(|e| anyhow::anyhow!("line {}: {e}", i + 1))?;
        boxes.push(face_box_in(width, height, Some(b)).map_err(|e| anyhow::anyhow!("line {}: {e:#}", i + 1))?);
        ensure!(boxes.len() <= MAX_AVATAR_FRAMES, "more than {MAX_AVATAR_FRAMES} face boxes");
    }
    Ok(boxes)
}

/// The avatar frame output frame `k` shows, for an avatar of `frames` frames: MuseTalk's cycle
/// (`frame_list_cycle = frame_list + frame_list[::-1]` in its `inference.py` and
/// `realtime_inference.py`), the frames forward then backward, each end shown twice:
/// 0, 1, .., n-1, n-1, .., 1, 0, 0, 1, ... A still image (one frame) is frame 0 throughout.
pub fn cycle_index(k: usize, frames: usize) -> usize {
    assert!(frames > 0, "an avatar has at least one frame");
    let i = k % (2 * frames);
    if i < frames {
        i
    } else {
        2 * frames - 1 - i
    }
}

/// Reads the avatar image; it becomes the output frame, so its width and height must be even.
pub fn load_avatar(path: &Path) -> Result<RgbImage> {
    let img = cadence_media::load_image(path)?;
    check_even(path, img.width(), img.height())?;
    Ok(img)
}

/// The output frame is the avatar's: H.264 in 4:2:0 needs its sides even.
fn check_even(path: &Path, w: u32, h: u32) -> Result<()> {
    ensure!(
        w.is_multiple_of(2) && h.is_multiple_of(2),
        "{}: the avatar is {w}x{h}: H.264 in 4:2:0 needs an even width and height (crop or pad it by one pixel)",
        path.display()
    );
    Ok(())
}

/// The face box for an avatar image ([`crate::avatar::face_box_in`] its size).
pub fn face_box(img: &RgbImage, given: Option<FaceBox>) -> Result<FaceBox> {
    crate::avatar::face_box_in(img.width(), img.height(), given)
}

/// `x,y,w,h` in pixels, each a whole number that fits the frame's 32-bit coordinates.
pub fn parse_face_box(s: &str) -> std::result::Result<FaceBox, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let [x, y, w, h] = parts[..] else {
        return Err(format!("'{s}': expected four numbers x,y,w,h"));
    };
    let num = |name: &str, v: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("'{s}': {name} = '{v}' is not a whole number of pixels from 0 to {}", u32::MAX))
    };
    let b = FaceBox { x: num("x", x)?, y: num("y", y)?, w: num("w", w)?, h: num("h", h)? };
    if b.w == 0 || b.h == 0 {
        return Err(format!("'{s}': the width and height must be positive"));
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn face_boxes_parse_into_32_bits_or_fail() {
        assert_eq!(parse_face_box(" 1, 2,30,40 ").unwrap(), FaceBox { x: 1, y: 2, w: 30, h: 40 });
        let e = parse_face_box("4294967306,0,100,100").unwrap_err();
        assert!(e.contains("x = '4294967306' is not a whole number of pixels"), "{e}");
        for bad in ["1,2,3", "1,2,3,4,5", "-1,0,16,16", "0,0,0,16", "a,b,c,d", ""] {
            assert!(parse_face_box(bad).is_err(), "{bad}");
        }
    }
    use crate::avatar::cycle_index;

    #[test]
    fn the_cycle_runs_forward_then_backward_as_musetalk_does() {
        // MuseTalk: frame_list_cycle = frame_list + frame_list[::-1], indexed k % len.
        let musetalk = |k: usize, n: usize| {
            let list: Vec<usize> = (0..n).chain((0..n).rev()).collect();
            list[k % list.len()]
        };
        assert_eq!((0..8).map(|k| cycle_index(k, 3)).collect::<Vec<_>>(), [0, 1, 2, 2, 1, 0, 0, 1]);
        for n in 1..7 {
            for k in 0..40 {
                assert_eq!(cycle_index(k, n), musetalk(k, n), "k={k} n={n}");
            }
        }
    }

    #[test]
    fn face_box_files_parse_with_comments_and_name_the_bad_line() {
        let b = parse_face_boxes("# x,y,w,h\n10,20,100,120\n\n 11, 21, 101, 121 \n", 320, 240).unwrap();
        assert_eq!(b, [FaceBox { x: 10, y: 20, w: 100, h: 120 }, FaceBox { x: 10, y: 20, w: 100, h: 120 }]);
        let e = parse_face_boxes("10,20,100,120\n300,0,64,64\n", 320, 240).unwrap_err().to_string();
        assert!(e.starts_with("line 2:") && e.contains("outside the 320x240"), "{e}");
        let e = parse_face_boxes("10,20,100\n", 320, 240).unwrap_err().to_string();
        assert!(e.starts_with("line 1:"), "{e}");
    }

    #[test]
    fn frame_bytes_counts_the_background_tables_and_latents() {
        // 1080x1920 with a 540x540 box: 3,110,400 + 4,665,600 + 835,584 bytes.
        let f = FaceBox { x: 270, y: 690, w: 540, h: 540 };
        assert_eq!(frame_bytes(1080, 1920, &f), 3_110_400 + 4_665_600 + 835_584);
        assert_eq!(MAX_AVATAR_BYTES / frame_bytes(1080, 1920, &f), 124);
    }
}
