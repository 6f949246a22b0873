//! Faces found, not given: where an avatar's face box comes from ([`FaceSpec`]), and the
//! default: MTCNN (`cadence_engines::mtcnn`, facenet-pytorch's trained weights embedded) on
//! every avatar frame, one face followed through the frames, its box and landmarks steadied
//! over time ([`crate::avatar::steady`]), and MuseTalk's crop derived from them
//! ([`musetalk_crop`]).
//!
//! MuseTalk crops from 68 landmarks (DWPose) and a face detector: left and right at the
//! landmarks' extremes (the jaw), bottom at the lowest landmark (the chin), top as far above
//! landmark 29 (on the nose bridge, two thirds of the way from its top to the tip) as the chin
//! is below it, with `bbox_shift` moving landmark 29 down (+) or up (-); version 1.5 adds 10
//! pixels below the chin. MTCNN gives 5 landmarks and a box, so cadence restates that rule on
//! them: the box's sides and bottom stand for the jaw and the chin, and landmark 29 sits two
//! thirds of the way from the eyes' height to the nose tip (landmark 27 is at about the eyes'
//! height, 30 is the tip, and 27..30 are evenly spaced along the bridge). docs/faces.md shows
//! the crops this gives.

use super::steady::{steady_faces, SteadyConfig};
use super::AvatarSource;
use crate::backend::composite::FaceBox;
use anyhow::{bail, ensure, Context, Result};
use cadence_engines::mtcnn::detect::{Face, Mtcnn, MtcnnConfig, SMALLEST_FACE};
use std::path::PathBuf;
use std::time::Instant;

/// Pixels MuseTalk 1.5 adds below the chin (`extra_margin` in its inference scripts).
pub const EXTRA_MARGIN: f32 = 10.0;

/// Where a render's face boxes come from: one source for `render`, `avatar prepare` and the
/// server.
#[derive(Debug, Clone, PartialEq)]
pub enum FaceSpec {
    /// One box for every frame (`--face-box x,y,w,h`).
    Given(FaceBox),
    /// The centred square of half the shorter side (`--face-box center`): no detection.
    Centered,
    /// A file of one box per frame (`--face-boxes`).
    File(PathBuf),
    /// Found by the detector (the default).
    Detect(DetectOptions),
}

/// How the detector's face becomes the face box.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetectOptions {
    /// Which face when there are several: 0 is the largest (by box area), 1 the next, ...
    /// In a video, the face chosen in the first frame that has it is then followed.
    pub face_index: usize,
    /// MuseTalk's `bbox_shift`, in pixels: moves the crop's centre line down (+) or up (-), so
    /// the crop's top follows (see the module comment).
    pub bbox_shift: i32,
    /// The smallest face searched for, in pixels (facenet-pytorch's `min_face_size`).
    pub min_face_size: f64,
    /// Print progress on long clips to stderr.
    pub progress: bool,
}

impl Default for DetectOptions {
    fn default() -> Self {
        DetectOptions { face_index: 0, bbox_shift: 0, min_face_size: 20.0, progress: false }
    }
}

/// The `--face-box` value: `x,y,w,h` or `center`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FaceBoxArg {
    At(FaceBox),
    Center,
}

/// Parses `--face-box`: `center`, or `x,y,w,h` ([`crate::avatar::parse_face_box`]).
pub fn parse_face_box_arg(s: &str) -> std::result::Result<FaceBoxArg, String> {
    if s.trim().eq_ignore_ascii_case("center") {
        Ok(FaceBoxArg::Center)
    } else {
        crate::avatar::parse_face_box(s).map(FaceBoxArg::At)
    }
}

impl FaceSpec {
    /// The spec from the face flags: a box, a file of boxes (not both), or detection.
    pub fn from_flags(
        face_box: Option<FaceBoxArg>,
        face_boxes: Option<PathBuf>,
        detect: DetectOptions,
    ) -> Result<Self> {
        Ok(match (face_box, face_boxes) {
            (Some(_), Some(_)) => {
                bail!("--face-box and --face-boxes: give one box for every frame or a file of boxes, not both")
            }
            (Some(FaceBoxArg::At(b)), None) => FaceSpec::Given(b),
            (Some(FaceBoxArg::Center), None) => FaceSpec::Centered,
            (None, Some(file)) => FaceSpec::File(file),
            (None, None) => FaceSpec::Detect(detect),
        })
    }

    /// Whether the boxes come from the detector.
    pub fn detects(&self) -> bool {
        matches!(self, FaceSpec::Detect(_))
    }
}

/// What the detector found for an avatar: per frame, the face followed and steadied (frame
/// pixels), and how it went.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundFaces {
    /// One face per avatar frame after the filter over time (frames without a detection are
    /// filled from their neighbours).
    pub faces: Vec<Face>,
    /// The face as detected in each frame, before the filter (`None`: not found there).
    pub raw: Vec<Option<Face>>,
    /// Frames in which the followed face was detected.
    pub detected: usize,
    /// Wall time of detection (decoding excluded), milliseconds.
    pub detect_ms: f64,
}

/// The error of an avatar whose face box the detector could not give (no face, no face of that
/// index, a crop too small): the caller may say so apart from a damaged file (the server's
/// `no_face`).
#[derive(Debug)]
pub struct NoFace(pub String);

impl std::fmt::Display for NoFace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoFace {}

/// Whether `e` is, or was caused by, a [`NoFace`].
pub fn is_no_face(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<NoFace>())
}

/// Faces as the detector returns them, largest first (facenet-pytorch's `select_largest`).
fn by_area(faces: &[Face]) -> Vec<Face> {
    let area = |f: &Face| (f.bbox[2] - f.bbox[0]) * (f.bbox[3] - f.bbox[1]);
    let mut v = faces.to_vec();
    v.sort_by(|a, b| area(b).total_cmp(&area(a)));
    v
}

/// Intersection over union of two `[x1, y1, x2, y2]` boxes.
pub fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    let union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// The choice of one face per frame, frame after frame: `index` (largest first) in the first
/// frame that has that many faces, then in each frame the face overlapping the previous choice
/// most; a frame where none overlaps it (a cut, or the face left) chooses by `index` again.
#[derive(Debug, Clone)]
pub struct Follower {
    index: usize,
    /// The face chosen last.
    pub last: Option<Face>,
}

impl Follower {
    pub fn new(index: usize) -> Self {
        Follower { index, last: None }
    }

    /// The face among `faces` overlapping the last choice most (none without a last choice).
    fn tracked(&self, faces: &[Face]) -> Option<Face> {
        let l = self.last?;
        faces
            .iter()
            .map(|f| (iou(&f.bbox, &l.bbox), *f))
            .filter(|(o, _)| *o > 0.0)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, f)| f)
    }

    /// This frame's choice among its `faces` (`None`: the frame has no such face).
    pub fn choose(&mut self, faces: &[Face]) -> Option<Face> {
        let chosen = self.tracked(faces).or_else(|| by_area(faces).get(self.index).copied());
        if chosen.is_some() {
            self.last = chosen;
        }
        chosen
    }
}

/// [`Follower`] over every frame's detections at once.
pub fn follow(frames: &[Vec<Face>], index: usize) -> Vec<Option<Face>> {
    let mut f = Follower::new(index);
    frames.iter().map(|faces| f.choose(faces)).collect()
}

/// Where the next frame's face is looked for first: the last face's box widened by its own
/// width and height on every side (a head moves far less than that between frames), clipped
/// to the frame; `[x, y, w, h]` in whole pixels.
fn search_region(last: &[f32; 4], width: usize, height: usize) -> [usize; 4] {
    let (bw, bh) = (last[2] - last[0], last[3] - last[1]);
    let clip = |v: f32, hi: usize| (v.max(0.0) as usize).min(hi);
    let (x1, y1) = (clip(last[0] - bw, width), clip(last[1] - bh, height));
    let (x2, y2) = (clip(last[2] + bw + 1.0, width), clip(last[3] + bh + 1.0, height));
    [x1, y1, x2.saturating_sub(x1), y2.saturating_sub(y1)]
}

/// The RGB pixels of `region` (`[x, y, w, h]`) of a `width`-wide image.
fn crop_rgb(rgb: &[u8], width: usize, region: [usize; 4]) -> Vec<u8> {
    let [x, y, w, h] = region;
    let mut out = Vec::with_capacity(w * h * 3);
    for row in y..y + h {
        out.extend_from_slice(&rgb[(row * width + x) * 3..(row * width + x + w) * 3]);
    }
    out
}

/// `face` moved by `(dx, dy)` pixels.
fn shifted(mut face: Face, dx: f32, dy: f32) -> Face {
    for (i, v) in face.bbox.iter_mut().enumerate() {
        *v += if i % 2 == 0 { dx } else { dy };
    }
    for l in &mut face.landmarks {
        l[0] += dx;
        l[1] += dy;
    }
    face
}

/// The detector at the smallest face size a tracked face needs, rebuilt only when that size
/// changes by more than a quarter (building it reads the weights).
struct Tracker {
    min_face: f64,
    mtcnn: Mtcnn,
}

/// MuseTalk's crop for `face` in a `width` x `height` frame (the module comment gives the rule),
/// clipped to the frame and moved to even coordinates and sizes (NV12's 2x2 chroma blocks).
/// Where the rule gives no sensible crop (landmarks above the eyes' line, a crop under 16
/// pixels), the detector's box itself, as MuseTalk falls back to its detector's box.
pub fn musetalk_crop(face: &Face, bbox_shift: i32, width: u32, height: u32) -> Result<FaceBox> {
    let [bx1, by1, bx2, by2] = face.bbox;
    let l = &face.landmarks;
    let eyes_y = (l[0][1] + l[1][1]) / 2.0;
    let centre_y = eyes_y + 2.0 / 3.0 * (l[2][1] - eyes_y) + bbox_shift as f32;
    let chin_y = by2;
    let top = centre_y - (chin_y - centre_y);
    let from_rule = [bx1, top, bx2, chin_y + EXTRA_MARGIN];
    let sane = |b: &[f32; 4]| b.iter().all(|v| v.is_finite()) && b[2] - b[0] >= 16.0 && b[3] - b[1] >= 16.0;
    let b = if sane(&from_rule) && centre_y < chin_y { from_rule } else { [bx1, by1, bx2, by2] };
    ensure!(
        b.iter().all(|v| v.is_finite()),
        "the detector gave a face box with a non-finite coordinate: {:?}",
        face.bbox
    );
    let (w, h) = (width as f32, height as f32);
    // Clip to the frame, whole pixels (MuseTalk's coordinates are integers too), even.
    let x1 = (b[0].max(0.0).floor() as u32) & !1;
    let y1 = (b[1].max(0.0).floor() as u32) & !1;
    let x2 = b[2].min(w).ceil().max(0.0) as u32;
    let y2 = b[3].min(h).ceil().max(0.0) as u32;
    let fw = x2.saturating_sub(x1) & !1;
    let fh = y2.saturating_sub(y1) & !1;
    let f = FaceBox { x: x1, y: y1, w: fw, h: fh };
    if fw < 16 || fh < 16 {
        return Err(NoFace(format!(
            "the face found at ({:.0},{:.0})-({:.0},{:.0}) leaves a crop of {fw}x{fh} pixels inside the {width}x{height} frame, \
             under 16x16: give the face box with --face-box x,y,w,h",
            face.bbox[0], face.bbox[1], face.bbox[2], face.bbox[3]
        ))
        .into());
    }
    Ok(f)
}

/// The frame rate the filter over time assumes for an image sequence (it has none of its own).
pub const SEQUENCE_FPS: f64 = 25.0;

/// Runs the detector on every frame of `source` and follows one face ([`Follower`]): the first
/// frame (and any frame where the face is lost) is searched whole, the others first around the
/// last face at a pyramid that starts at half its size, which is what makes
/// a long clip's detection cheap. The face is then steadied over time ([`steady_faces`]) and
/// MuseTalk's crops derived ([`musetalk_crop`]). An avatar with no face is a [`NoFace`] error
/// that says how to give the box.
pub fn find_faces(source: &AvatarSource, opts: &DetectOptions) -> Result<(FoundFaces, Vec<FaceBox>)> {
    let fps = source.fps().unwrap_or(SEQUENCE_FPS);
    let found = track_faces(source.frames(), fps, opts, |f| source.for_each_frame(f))?;
    let n = source.frames();
    let boxes = found
        .faces
        .iter()
        .enumerate()
        .map(|(i, f)| {
            musetalk_crop(f, opts.bbox_shift, source.width, source.height).with_context(|| {
                if n > 1 {
                    format!("avatar frame {i}")
                } else {
                    "the avatar".into()
                }
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((found, boxes))
}

/// [`find_faces`]' detection, following and filter over `n` frames at `fps` that `frames` hands
/// out in order (as [`AvatarSource::for_each_frame`] does).
pub fn track_faces(
    n: usize,
    fps: f64,
    opts: &DetectOptions,
    frames: impl FnOnce(&mut dyn FnMut(usize, &cadence_media::RgbImage) -> Result<()>) -> Result<()>,
) -> Result<FoundFaces> {
    let mtcnn = Mtcnn::new(
        &cadence_engines::Device::Cpu,
        MtcnnConfig { min_face_size: opts.min_face_size, ..Default::default() },
    )
    .context("loading the face detector")?;
    let mut follower = Follower::new(opts.face_index);
    let mut tracker: Option<Tracker> = None;
    let (mut chosen, mut most) = (Vec::with_capacity(n), 0);
    let mut detect_ms = 0.0;
    frames(&mut |i, img| {
        let t = Instant::now();
        let (w, h) = (img.width() as usize, img.height() as usize);
        let rgb = img.as_raw();
        // Around the last face first, at a pyramid that starts at half its size: a few small
        // levels instead of the whole frame's (the face moves and scales little between frames).
        let mut found = None;
        let region = follower.last.map(|l| search_region(&l.bbox, w, h));
        // A region under P-Net's window (a face at the frame's edge) is searched whole below.
        if let (Some(last), Some(region)) = (follower.last, region.filter(|r| r[2].min(r[3]) as f64 >= SMALLEST_FACE)) {
            let size = ((last.bbox[2] - last.bbox[0]).min(last.bbox[3] - last.bbox[1]) * 0.5) as f64;
            let min_face = size.max(opts.min_face_size);
            if tracker.as_ref().is_none_or(|t| (t.min_face / min_face - 1.0).abs() > 0.25) {
                let config = MtcnnConfig { min_face_size: min_face, ..Default::default() };
                let mtcnn = Mtcnn::new(&cadence_engines::Device::Cpu, config)?;
                tracker = Some(Tracker { min_face, mtcnn });
            }
            let t = tracker.as_ref().expect("built above");
            let crop = crop_rgb(rgb, w, region);
            let faces: Vec<Face> = t
                .mtcnn
                .detect(&crop, region[2], region[3])?
                .into_iter()
                .map(|f| shifted(f, region[0] as f32, region[1] as f32))
                .collect();
            found = follower.tracked(&faces);
            if found.is_some() {
                follower.last = found;
            }
        }
        // Lost, or the first frame: the whole frame at the smallest face asked for.
        if found.is_none() {
            let faces = mtcnn.detect(rgb, w, h)?;
            most = most.max(faces.len());
            found = follower.choose(&faces);
        }
        detect_ms += t.elapsed().as_secs_f64() * 1e3;
        chosen.push(found);
        if opts.progress && n > 1 && ((i + 1).is_multiple_of(50) || i + 1 == n) {
            eprintln!("cadence: finding the face: {} of {n} frames", i + 1);
        }
        Ok(())
    })?;
    let detected = chosen.iter().filter(|c| c.is_some()).count();
    if detected == 0 {
        let what = if n == 1 { "the image" } else { "any of its frames" };
        let msg = if most == 0 {
            format!(
                "no face found in {what} (MTCNN, faces of at least {} pixels): give the face box with \
                 --face-box x,y,w,h (or --face-box center for the centred square); `cadence faces detect` shows what the detector sees",
                opts.min_face_size
            )
        } else {
            format!(
                "--face-index {}: {what} has at most {most} face{} (0 is the largest)",
                opts.face_index,
                if most == 1 { "" } else { "s" }
            )
        };
        return Err(NoFace(msg).into());
    }
    let faces = steady_faces(&chosen, fps, &SteadyConfig::default())?;
    Ok(FoundFaces { faces, raw: chosen, detected, detect_ms })
}

/// The face boxes an avatar uses, for `--json` and the server's responses: `"box"` `[x, y, w, h]`
/// of the first frame, `"boxes"` one per frame where they differ, `"source"` (`"detected"` or
/// `"given"`), and for a detected face the detector's view of it: `"detector"` (the model),
/// `"detected_frames"`, `"frames"`, `"detect_ms"`, and per frame `"faces"` (MTCNN's box
/// `[x1, y1, x2, y2]`, score and 5 landmarks, after the filter over time) when there are several
/// frames, `"face"` for one.
pub fn report(source: &AvatarSource) -> serde_json::Value {
    let xywh = |b: &FaceBox| [b.x, b.y, b.w, b.h];
    let mut v = serde_json::json!({ "box": xywh(&source.faces[0]) });
    if source.faces.iter().any(|b| *b != source.faces[0]) {
        v["boxes"] = source.faces.iter().map(xywh).collect::<Vec<_>>().into();
    }
    let face_json = |f: &Face| serde_json::json!({"box": f.bbox, "score": f.score, "landmarks": f.landmarks});
    match &source.found {
        Some(found) => {
            v["source"] = "detected".into();
            v["detector"] = format!("MTCNN, {}", cadence_engines::mtcnn::MODEL_SOURCE).into();
            v["frames"] = source.frames().into();
            v["detected_frames"] = found.detected.into();
            v["detect_ms"] = found.detect_ms.into();
            if found.faces.len() == 1 {
                v["face"] = face_json(&found.faces[0]);
            } else {
                v["faces"] = found.faces.iter().map(face_json).collect::<Vec<_>>().into();
            }
        }
        None => v["source"] = "given".into(),
    }
    v
}

/// One line on the face box an avatar uses, e.g. `face found (MTCNN, score 0.999): box
/// 180,120,200,236 ...`.
pub fn summary(source: &AvatarSource) -> String {
    let b = source.faces[0];
    let n = source.frames();
    let at = format!("{},{},{},{}", b.x, b.y, b.w, b.h);
    let first = if n > 1 { " in the first frame" } else { "" };
    match &source.found {
        Some(found) => {
            let f = &found.faces[0];
            let frames = if n > 1 {
                format!(", detected in {} of {n} frames and steadied over time", found.detected)
            } else {
                String::new()
            };
            format!(
                "face found (MTCNN, score {:.3}{frames}; {:.0} ms): MuseTalk's crop x,y,w,h = {at}{first} \
                 (--face-box to give it, --face-index to choose another face)",
                f.score, found.detect_ms
            )
        }
        None => format!("face box x,y,w,h = {at}{first} (given)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn face(x1: f32, y1: f32, x2: f32, y2: f32) -> Face {
        let (w, h) = (x2 - x1, y2 - y1);
        let at = |fx: f32, fy: f32| [x1 + fx * w, y1 + fy * h];
        Face {
            bbox: [x1, y1, x2, y2],
            score: 0.99,
            landmarks: [at(0.3, 0.4), at(0.7, 0.4), at(0.5, 0.6), at(0.35, 0.8), at(0.65, 0.8)],
        }
    }

    #[test]
    fn the_crop_is_symmetric_about_the_nose_bridge_and_extends_below_the_chin() {
        // Eyes at y = 140, nose at 160: landmark 29 at 140 + 2/3 * 20 = 153.33; the chin (box
        // bottom) at 200, so the top is 153.33 - 46.67 = 106.67 and the bottom 200 + 10.
        let f = face(100.0, 100.0, 200.0, 200.0);
        let b = musetalk_crop(&f, 0, 640, 480).unwrap();
        assert_eq!(b, FaceBox { x: 100, y: 106, w: 100, h: 104 });
        // bbox_shift moves the centre line down, so the top comes down twice as far.
        let s = musetalk_crop(&f, 5, 640, 480).unwrap();
        assert_eq!((s.y, s.y + s.h), (116, 210));
        // Clipped to the frame, even.
        let e = musetalk_crop(&face(-7.0, 3.0, 63.0, 73.0), 0, 64, 80).unwrap();
        assert_eq!((e.x, e.x + e.w), (0, 62));
        assert!(e.y.is_multiple_of(2) && e.h.is_multiple_of(2) && e.y + e.h <= 80, "{e:?}");
    }

    #[test]
    fn landmarks_that_make_no_crop_fall_back_to_the_detectors_box() {
        let mut f = face(100.0, 100.0, 200.0, 200.0);
        f.landmarks[2][1] = 400.0; // nose below the chin
        assert_eq!(musetalk_crop(&f, 0, 640, 480).unwrap(), FaceBox { x: 100, y: 100, w: 100, h: 100 });
        let err = musetalk_crop(&face(630.0, 10.0, 700.0, 80.0), 0, 640, 480).unwrap_err().to_string();
        assert!(err.contains("--face-box"), "{err}");
    }

    #[test]
    fn the_chosen_face_is_followed_not_re_chosen_by_size() {
        let small = face(10.0, 10.0, 60.0, 60.0);
        let big = face(300.0, 10.0, 400.0, 110.0);
        // Frame 0: big is index 0. Frame 1: the small face grows past the big one; index 0
        // still follows the face that was chosen (the one overlapping it).
        let grown = face(8.0, 8.0, 160.0, 160.0);
        let frames = vec![vec![small, big], vec![grown, big], vec![], vec![big]];
        let f = follow(&frames, 0);
        assert_eq!(f[0], Some(big));
        assert_eq!(f[1], Some(big));
        assert_eq!(f[2], None);
        let g = follow(&frames, 1);
        assert_eq!(g[0], Some(small));
        assert_eq!(g[1], Some(grown));
        // The small face is gone in frame 3: index 1 does not exist there, so none.
        assert_eq!(g[3], None);
        assert_eq!(follow(&frames, 2), vec![None; 4]);
    }

    #[test]
    fn face_box_arg_takes_center_or_a_box() {
        assert_eq!(parse_face_box_arg("center").unwrap(), FaceBoxArg::Center);
        assert_eq!(parse_face_box_arg("2,4,16,16").unwrap(), FaceBoxArg::At(FaceBox { x: 2, y: 4, w: 16, h: 16 }));
        assert!(parse_face_box_arg("middle").is_err());
        let both = FaceSpec::from_flags(Some(FaceBoxArg::Center), Some("b.txt".into()), DetectOptions::default());
        assert!(both.is_err());
        assert!(FaceSpec::from_flags(None, None, DetectOptions::default()).unwrap().detects());
    }
}
