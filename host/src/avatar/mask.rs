//! The lower-face blend mask: how much of the generated face each face-box pixel shows.
//!
//! MuseTalk regenerates the whole 256x256 crop but pastes back only its lower face
//! (`get_image` and `get_image_prepare_material` in `musetalk/utils/blending.py`): a
//! face-parsing network (BiSeNet) labels the face (skin, brows, eyes, ears, nose, lips; not the
//! hair, neck or background) in the crop enlarged about the box's centre (`expand`, 1.5 in
//! version 1.5), the labels are kept inside the face box only, everything above the middle row
//! of the enlarged crop (`upper_boundary_ratio = 0.5`, i.e. the box's centre row) is cleared,
//! and the result is blurred by a Gaussian of kernel 0.1 x the enlarged crop's side. The mouth,
//! chin and jaw come from the generator; the eyes and above stay the original frame's, which
//! the generator only reconstructs (and blurs).
//!
//! cadence has no face-parsing network, but it has MTCNN's five landmarks per frame and the box
//! (MuseTalk's crop, [`crate::avatar::faces::musetalk_crop`]). [`LowerFaceMask`] approximates
//! the parsed, cut and blurred mask by the intersection of
//! - the half-plane below a cut line parallel to the eyes' line (so it follows the head's roll,
//!   where MuseTalk cuts along an image row), [`LowerFaceMask::cut`] of the way down from the
//!   eyes to the nose tip: 2/3 puts it where MuseTalk's cut is with `bbox_shift` 0 (the box's
//!   centre is landmark 29, which cadence's crop rule places 2/3 of the way from the eyes'
//!   height to the nose tip);
//! - an ellipse for the jaw and chin: centred on the face's midline on the eyes' line, one axis
//!   along the eyes spanning the box's width (the box runs from jaw to jaw), the other reaching
//!   the box's bottom (the chin, plus MuseTalk 1.5's margin below it);
//! - the box itself, so that its outermost ring of pixels is exactly the background.
//!
//! The weight is the Hermite smoothstep h(t) = 3t² − 2t³ ([`cadence_kernels::math::hermite`],
//! as the feathered rectangle uses) of the pixel centre's depth inside the region (the least of
//! its distances to the three boundaries) over a feather of [`LowerFaceMask::feather`] x the
//! box's longer side S: 0 outside the region and at its edge, 1 from one feather inside. The
//! depth is 1-Lipschitz (a minimum of distances), so neighbouring weights differ by at most
//! 1.5 / feather, the smoothstep's steepest slope; where two boundaries meet the ramp has a
//! crease, not a step. The feather matches MuseTalk's blur: its kernel is k = 0.1 x 1.5 S, so
//! OpenCV's σ = 0.3((k − 1)/2 − 1) + 0.8 ≈ 0.0225 S + 0.5; a smoothstep as steep at its middle
//! (1.5 / f) as that blurred edge (1 / (σ√(2π))) is f ≈ 3.76 σ ≈ 0.085 S + 1.9 pixels, 23
//! pixels for a 256-pixel box. It is tied to the box, as MuseTalk's blur is, not to the
//! landmarks, so that their jitter does not make the seam breathe. The cut's ramp is centred on
//! the cut line unless that would reach above the eyes' line; then it starts on that line.
//!
//! Limits. The ellipse is a face's outline only roughly: a long or square jaw, a beard, a turned
//! head (the ellipse keeps the box's width and the box's border clips the far side), or a hand
//! or hair in front of the mouth get the generated face, where the parsing network would keep
//! the original. The neck in the box's bottom margin is blended too (within the feather of the
//! bottom edge). The cut needs a sensible roll (under 90°) and pitch (the nose below the eyes).
//!
//! Degenerate landmarks are an error ([`LowerFaceMask::alpha`] says which), not a silent
//! fallback: the caller decides, and the feathered rectangle
//! ([`crate::backend::composite::Compositor::new`]), what cadence blended with before, is the
//! fallback at hand.

use crate::backend::composite::FaceBox;
use anyhow::{ensure, Result};
use cadence_kernels::math::hermite;

/// MTCNN's five landmarks of one face, (x, y) in frame pixels (f32, as the detector gives them):
/// left eye, right eye, nose tip, left mouth corner, right mouth corner, left being the
/// image's left.
pub type Landmarks = [[f32; 2]; 5];

const NAMES: [&str; 5] = ["left eye", "right eye", "nose tip", "left mouth corner", "right mouth corner"];

/// The parameters of the lower-face mask (the module comment gives the shape and the reasons
/// for the defaults, [`LowerFaceMask::MUSETALK`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LowerFaceMask {
    /// Where the cut line lies: this fraction of the way from the eyes' line down to the nose
    /// tip (measured across the eyes' line). At least 0.
    pub cut: f32,
    /// The feather (the width of the smoothstep ramp) as a fraction of the box's longer side;
    /// at least 1 pixel in all ([`LowerFaceMask::feather_px`]). Positive.
    pub feather: f32,
}

impl LowerFaceMask {
    /// MuseTalk's mask as closely as five landmarks give it: the cut 2/3 of the way from the
    /// eyes to the nose tip, a feather of 0.09 x the box's longer side.
    pub const MUSETALK: Self = Self { cut: 2.0 / 3.0, feather: 0.09 };

    /// The feather in pixels for `face`: [`Self::feather`] x its longer side, at least 1.
    pub fn feather_px(&self, face: &FaceBox) -> f32 {
        (self.feather * face.w.max(face.h) as f32).max(1.0)
    }

    /// The blend weight of each pixel of `face` (row-major, w x h, in [0, 1]) for a face with
    /// `landmarks`, each pixel taken at its centre (x + 0.5, y + 0.5) in frame coordinates.
    ///
    /// An error for degenerate input: parameters out of range, an empty box, a landmark not
    /// finite or outside the box, eyes under 2 pixels apart, the right eye not to the right of
    /// the left one (swapped, or a roll past 90°), the nose tip or the mouth not below the eyes'
    /// line, or a region that leaves the mouth's centre out.
    pub fn alpha(&self, face: &FaceBox, landmarks: &Landmarks) -> Result<Vec<f32>> {
        let region = Region::new(self, face, landmarks)?;
        let (x0, y0) = (face.x as f64 + 0.5, face.y as f64 + 0.5);
        let mut alpha = Vec::with_capacity(face.w as usize * face.h as usize);
        for py in 0..face.h {
            for px in 0..face.w {
                alpha.push(region.weight([x0 + px as f64, y0 + py as f64]));
            }
        }
        Ok(alpha)
    }
}

impl Default for LowerFaceMask {
    /// [`LowerFaceMask::MUSETALK`].
    fn default() -> Self {
        Self::MUSETALK
    }
}

/// The blend weights of `face`'s pixels with the default mask ([`LowerFaceMask::MUSETALK`],
/// [`LowerFaceMask::alpha`]): 1 over the mouth, chin and jaw, 0 on and above the eyes' line and
/// on the box's outermost pixels, feathered between. The table
/// [`crate::backend::composite::Compositor::with_alpha`] takes.
pub fn lower_face_alpha(face: &FaceBox, landmarks: &Landmarks) -> Result<Vec<f32>> {
    LowerFaceMask::MUSETALK.alpha(face, landmarks)
}

type P = [f64; 2];

fn sub(a: P, b: P) -> P {
    [a[0] - b[0], a[1] - b[1]]
}

fn dot(a: P, b: P) -> f64 {
    a[0] * b[0] + a[1] * b[1]
}

fn mid(a: P, b: P) -> P {
    [(a[0] + b[0]) / 2.0, (a[1] + b[1]) / 2.0]
}

/// The mask's region in frame coordinates (f64, so that symmetric input gives symmetric weights).
struct Region {
    /// The outermost pixel centres of the box: left, top, right, bottom.
    inner: [f64; 4],
    /// The eyes' midpoint, the unit vector along the eyes (left to right) and the one across,
    /// pointing down the face.
    eyes: P,
    u: P,
    v: P,
    /// How far below the eyes' line (along `v`) the weight starts to rise.
    cut: f64,
    /// The ellipse's centre and semi-axes along `u` and `v`.
    centre: P,
    a: f64,
    b: f64,
    feather: f64,
}

impl Region {
    fn new(params: &LowerFaceMask, face: &FaceBox, landmarks: &Landmarks) -> Result<Self> {
        ensure!(
            params.cut.is_finite() && params.cut >= 0.0 && params.feather.is_finite() && params.feather > 0.0,
            "lower-face mask {params:?}: the cut must be at least 0 and the feather positive"
        );
        ensure!(face.w > 0 && face.h > 0, "face box {face:?} is empty");
        let p: [P; 5] = landmarks.map(|q| q.map(f64::from));
        let (left, top) = (face.x as f64, face.y as f64);
        let (right, bottom) = (left + face.w as f64, top + face.h as f64);
        for (name, q) in NAMES.iter().zip(&p) {
            ensure!(q.iter().all(|c| c.is_finite()), "landmarks {landmarks:?}: the {name} is not finite");
            ensure!(
                (left..=right).contains(&q[0]) && (top..=bottom).contains(&q[1]),
                "the {name} at ({:.1}, {:.1}) is outside the face box {face:?}",
                q[0],
                q[1]
            );
        }
        let across = sub(p[1], p[0]);
        let apart = across[0].hypot(across[1]);
        ensure!(apart >= 2.0, "the eyes are {apart:.2} pixels apart (at least 2): landmarks {landmarks:?}");
        let u = [across[0] / apart, across[1] / apart];
        ensure!(
            u[0] > 0.0,
            "the right eye ({:.1}, {:.1}) is not right of the left eye ({:.1}, {:.1}): swapped, or the head rolled past 90°",
            p[1][0],
            p[1][1],
            p[0][0],
            p[0][1]
        );
        // Across the eyes, turned a quarter clockwise in image coordinates (y down): down the face.
        let v = [-u[1], u[0]];
        let eyes = mid(p[0], p[1]);
        let mouth = mid(p[3], p[4]);
        let nose = dot(sub(p[2], eyes), v);
        ensure!(nose > 0.0, "the nose tip is not below the eyes' line: landmarks {landmarks:?}");
        ensure!(dot(sub(mouth, eyes), v) > 0.0, "the mouth is not below the eyes' line: landmarks {landmarks:?}");
        let feather = params.feather_px(face) as f64;
        let cut = (params.cut as f64 * nose - feather / 2.0).max(0.0);
        // On the midline: halfway between the eyes' and the mouth's midpoints, along the eyes.
        let shift = dot(sub(mouth, eyes), u) / 2.0;
        let centre = [eyes[0] + shift * u[0], eyes[1] + shift * u[1]];
        // From the centre down the face (v, whose y is u's x > 0) to the box's bottom edge.
        let (a, b) = (face.w as f64 / 2.0, (bottom - centre[1]) / v[1]);
        ensure!(b > 0.0, "the eyes' midpoint lies on the face box's bottom edge: landmarks {landmarks:?}");
        let inner = [left + 0.5, top + 0.5, right - 0.5, bottom - 0.5];
        let region = Self { inner, eyes, u, v, cut, centre, a, b, feather };
        ensure!(
            region.depth(mouth) > 0.0,
            "the lower-face region leaves the mouth's centre out (face box {face:?}, landmarks {landmarks:?})"
        );
        Ok(region)
    }

    /// How deep frame point `q` lies inside the region, in pixels, capped at the feather (0 or
    /// less outside).
    fn depth(&self, q: P) -> f64 {
        let [l, t, r, b] = self.inner;
        let border = (q[0] - l).min(r - q[0]).min(q[1] - t).min(b - q[1]);
        let below = dot(sub(q, self.eyes), self.v) - self.cut;
        let limit = border.min(below).min(self.feather);
        if limit <= 0.0 {
            return limit;
        }
        let c = sub(q, self.centre);
        let (x, y) = (dot(c, self.u).abs(), dot(c, self.v).abs());
        let r = ((x / self.a).powi(2) + (y / self.b).powi(2)).sqrt();
        if r >= 1.0 {
            return 0.0;
        }
        // (1 - r) x the shorter semi-axis never exceeds the distance to the ellipse: where even
        // that reaches the limit, the ellipse does not bind and the exact distance is not needed.
        if (1.0 - r) * self.a.min(self.b) >= limit {
            return limit;
        }
        limit.min(ellipse_depth(self.a, self.b, x, y))
    }

    fn weight(&self, q: P) -> f32 {
        hermite((self.depth(q) / self.feather) as f32)
    }
}

/// The distance from (x, y), x, y >= 0, inside or on the ellipse of semi-axes `a` (along x) and
/// `b` (along y), to the ellipse: D. Eberly's "Distance from a Point to an Ellipse" (the nearest
/// point's parameter by bisection on a monotone function).
fn ellipse_depth(a: f64, b: f64, x: f64, y: f64) -> f64 {
    // The first axis the longer.
    let (e0, e1, y0, y1) = if a >= b { (a, b, x, y) } else { (b, a, y, x) };
    if y1 > 0.0 {
        if y0 > 0.0 {
            let (z0, z1) = (y0 / e0, y1 / e1);
            let g = z0 * z0 + z1 * z1 - 1.0;
            if g == 0.0 {
                return 0.0;
            }
            let r0 = (e0 / e1).powi(2);
            let s = ellipse_root(r0, z0, z1, g);
            let (x0, x1) = (r0 * y0 / (s + r0), y1 / (s + 1.0));
            (x0 - y0).hypot(x1 - y1)
        } else {
            // On the shorter axis: the nearest point is its end.
            (e1 - y1).abs()
        }
    } else {
        // On the longer axis: off the centre of curvature's reach the nearest point is its end.
        let (numer, denom) = (e0 * y0, e0 * e0 - e1 * e1);
        if numer < denom {
            let xd = numer / denom;
            (e0 * xd - y0).hypot(e1 * (1.0 - xd * xd).sqrt())
        } else {
            (e0 - y0).abs()
        }
    }
}

/// The root s of (r0 z0 / (s + r0))² + (z1 / (s + 1))² = 1 that gives the nearest point, by
/// bisection ([`ellipse_depth`]; `g` is the left side minus 1 at s = 0).
fn ellipse_root(r0: f64, z0: f64, z1: f64, g: f64) -> f64 {
    let n0 = r0 * z0;
    let (mut s0, mut s1) = (z1 - 1.0, if g < 0.0 { 0.0 } else { n0.hypot(z1) - 1.0 });
    let mut s = 0.5 * (s0 + s1);
    // Each step halves the bracket, at most 2 long: 64 steps are below f64's resolution.
    for _ in 0..64 {
        s = 0.5 * (s0 + s1);
        if s == s0 || s == s1 {
            break;
        }
        let (q0, q1) = (n0 / (s + r0), z1 / (s + 1.0));
        let g = q0 * q0 + q1 * q1 - 1.0;
        if g > 0.0 {
            s0 = s;
        } else if g < 0.0 {
            s1 = s;
        } else {
            break;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frontal face in a 160x200 box at (100, 40): eyes 70 apart at y = 110, the nose tip 35
    /// below them, the mouth 62 below, symmetric about x = 180 (the box's centre).
    fn frontal() -> (FaceBox, Landmarks) {
        let face = FaceBox { x: 100, y: 40, w: 160, h: 200 };
        (face, [[145.0, 110.0], [215.0, 110.0], [180.0, 145.0], [155.0, 172.0], [205.0, 172.0]])
    }

    /// The same proportions in any box (fractions of w and h, dyadic, so symmetric exactly).
    fn face_in(face: FaceBox) -> Landmarks {
        let (w, h) = (face.w as f32, face.h as f32);
        let (cx, y) = (face.x as f32 + w / 2.0, face.y as f32);
        let at = |dx: f32, fy: f32| [cx + dx * w, y + fy * h];
        [
            at(-7.0 / 32.0, 11.0 / 32.0),
            at(7.0 / 32.0, 11.0 / 32.0),
            at(0.0, 17.0 / 32.0),
            at(-5.0 / 32.0, 21.0 / 32.0),
            at(5.0 / 32.0, 21.0 / 32.0),
        ]
    }

    fn at(alpha: &[f32], face: &FaceBox, x: f64, y: f64) -> f32 {
        let (px, py) = ((x - face.x as f64).floor() as usize, (y - face.y as f64).floor() as usize);
        alpha[py * face.w as usize + px]
    }

    /// Checks every weight is in [0, 1], the outermost ring 0, and neighbours differ by at most
    /// the smoothstep's steepest slope over the feather.
    fn check_bounds(alpha: &[f32], face: &FaceBox) {
        let (w, h) = (face.w as usize, face.h as usize);
        assert_eq!(alpha.len(), w * h);
        assert!(alpha.iter().all(|a| (0.0..=1.0).contains(a)), "a weight outside [0, 1]");
        for py in 0..h {
            for px in 0..w {
                if px == 0 || py == 0 || px == w - 1 || py == h - 1 {
                    assert_eq!(alpha[py * w + px], 0.0, "border pixel ({px}, {py})");
                }
            }
        }
        let bound = 1.5 / LowerFaceMask::MUSETALK.feather_px(face) + 1e-5;
        let mut worst = 0f32;
        for py in 0..h {
            for px in 0..w {
                let a = alpha[py * w + px];
                if px + 1 < w {
                    worst = worst.max((alpha[py * w + px + 1] - a).abs());
                }
                if py + 1 < h {
                    worst = worst.max((alpha[(py + 1) * w + px] - a).abs());
                }
            }
        }
        assert!(worst <= bound, "neighbouring weights differ by {worst}, more than {bound}");
    }

    #[test]
    fn a_frontal_face_shows_the_generated_mouth_chin_and_jaw_only() {
        let (face, lm) = frontal();
        let alpha = lower_face_alpha(&face, &lm).unwrap();
        check_bounds(&alpha, &face);
        let (w, h) = (face.w as usize, face.h as usize);
        // Feather 0.09 x 200 = 18 px; the cut's ramp is centred 2/3 x 35 below the eyes: it
        // rises from y = 110 + 23.33 - 9 = 124.33 to 142.33.
        assert_eq!(LowerFaceMask::MUSETALK.feather_px(&face), 18.0);
        for py in 0..h {
            let y = face.y as f64 + py as f64 + 0.5;
            for px in 0..w {
                if y <= 124.3 {
                    assert_eq!(alpha[py * w + px], 0.0, "({px}, {py}) is above the cut");
                }
            }
        }
        // The mouth, its corners, the chin's centre area and the cheeks beside the mouth: 1.
        for (x, y) in [(180.0, 172.0), (155.0, 172.0), (205.0, 172.0), (180.0, 143.0), (140.0, 175.0), (220.0, 175.0)] {
            assert_eq!(at(&alpha, &face, x, y), 1.0, "({x}, {y})");
        }
        for x in 172..=188 {
            for y in 190..=210 {
                assert_eq!(at(&alpha, &face, x as f64, y as f64), 1.0, "chin ({x}, {y})");
            }
        }
        // Rising in between, and easing to 0 toward the bottom and the sides.
        let ramp = at(&alpha, &face, 180.0, 133.0);
        assert!(ramp > 0.2 && ramp < 0.8, "halfway up the cut: {ramp}");
        assert!(at(&alpha, &face, 180.0, 236.0) < 0.2);
        assert!(at(&alpha, &face, 104.0, 150.0) < 0.3);
        // Left-right symmetric.
        for py in 0..h {
            for px in 0..w {
                let (a, b) = (alpha[py * w + px], alpha[py * w + w - 1 - px]);
                assert!((a - b).abs() <= 1e-6, "({px}, {py}): {a} vs mirrored {b}");
            }
        }
    }

    #[test]
    fn the_cut_follows_the_heads_roll() {
        let (face, lm) = frontal();
        let (c, angle) = ([180.0f64, 140.0], 15f64.to_radians());
        let (s, co) = angle.sin_cos();
        // Rotated 15° about (180, 140) (y down: the right eye goes down, the left one up).
        let rolled: Landmarks = lm.map(|[x, y]| {
            let (dx, dy) = (x as f64 - c[0], y as f64 - c[1]);
            [(c[0] + co * dx - s * dy) as f32, (c[1] + s * dx + co * dy) as f32]
        });
        let alpha = lower_face_alpha(&face, &rolled).unwrap();
        check_bounds(&alpha, &face);
        let frontal = lower_face_alpha(&face, &lm).unwrap();
        // On and above the rolled eyes' line: 0, wherever it is.
        let eyes = [(rolled[0][0] + rolled[1][0]) as f64 / 2.0, (rolled[0][1] + rolled[1][1]) as f64 / 2.0];
        let v = [-s, co];
        let (w, h) = (face.w as usize, face.h as usize);
        for py in 0..h {
            for px in 0..w {
                let q = [face.x as f64 + px as f64 + 0.5, face.y as f64 + py as f64 + 0.5];
                if (q[0] - eyes[0]) * v[0] + (q[1] - eyes[1]) * v[1] <= 0.0 {
                    assert_eq!(alpha[py * w + px], 0.0, "({px}, {py}) above the rolled eyes");
                }
            }
        }
        // The cut rose on the left and sank on the right.
        let (left, right) = ((135.5, 123.5), (225.5, 143.5));
        assert_eq!(at(&frontal, &face, left.0, left.1), 0.0);
        assert!(at(&alpha, &face, left.0, left.1) > 0.5, "left {}", at(&alpha, &face, left.0, left.1));
        assert_eq!(at(&frontal, &face, right.0, right.1), 1.0);
        assert!(at(&alpha, &face, right.0, right.1) < 0.5, "right {}", at(&alpha, &face, right.0, right.1));
        // The rolled mouth is still all generated.
        let mouth = [(rolled[3][0] + rolled[4][0]) / 2.0, (rolled[3][1] + rolled[4][1]) / 2.0];
        assert_eq!(at(&alpha, &face, mouth[0] as f64, mouth[1] as f64), 1.0);
    }

    #[test]
    fn odd_and_tiny_boxes() {
        for face in [
            FaceBox { x: 0, y: 0, w: 16, h: 16 },
            FaceBox { x: 3, y: 7, w: 33, h: 41 },
            FaceBox { x: 10, y: 2, w: 17, h: 16 },
            FaceBox { x: 500, y: 300, w: 540, h: 540 },
        ] {
            let lm = face_in(face);
            let alpha = lower_face_alpha(&face, &lm).unwrap();
            check_bounds(&alpha, &face);
            let mouth = (face.x as f64 + face.w as f64 / 2.0, face.y as f64 + face.h as f64 * 21.0 / 32.0);
            assert_eq!(at(&alpha, &face, mouth.0, mouth.1), 1.0, "{face:?}: mouth");
            let (w, h) = (face.w as usize, face.h as usize);
            let eyes_row = ((face.h as f64 * 11.0 / 32.0) - 0.5).floor() as usize;
            assert!(alpha[..(eyes_row + 1) * w].iter().all(|&a| a == 0.0), "{face:?}: above the eyes");
            for py in 0..h {
                for px in 0..w {
                    let (a, b) = (alpha[py * w + px], alpha[py * w + w - 1 - px]);
                    assert!((a - b).abs() <= 1e-6, "{face:?} ({px}, {py}): {a} vs mirrored {b}");
                }
            }
        }
    }

    #[test]
    fn degenerate_landmarks_are_errors() {
        let (face, lm) = frontal();
        let err = |lm: Landmarks| lower_face_alpha(&face, &lm).unwrap_err().to_string();
        let mut nan = lm;
        nan[2][0] = f32::NAN;
        assert!(err(nan).contains("nose tip is not finite"), "{}", err(nan));
        let mut out = lm;
        out[4] = [205.0, 250.0];
        assert!(err(out).contains("right mouth corner at (205.0, 250.0) is outside"), "{}", err(out));
        let swapped = [lm[1], lm[0], lm[2], lm[4], lm[3]];
        assert!(err(swapped).contains("not right of the left eye"), "{}", err(swapped));
        let same = [lm[0], lm[0], lm[2], lm[3], lm[4]];
        assert!(err(same).contains("apart"), "{}", err(same));
        // Eyes below the mouth (and the nose): upside down.
        let upside = [[145.0, 172.0], [215.0, 172.0], [180.0, 145.0], [155.0, 110.0], [205.0, 110.0]];
        assert!(err(upside).contains("not below the eyes' line"), "{}", err(upside));
        let mut low_nose = lm;
        low_nose[2][1] = 100.0;
        assert!(err(low_nose).contains("nose tip is not below"), "{}", err(low_nose));
        // The mouth on the box's bottom edge: the region would leave it out.
        let mut chinless = lm;
        chinless[3][1] = 240.0;
        chinless[4][1] = 240.0;
        assert!(err(chinless).contains("leaves the mouth's centre out"), "{}", err(chinless));
        let bad = LowerFaceMask { cut: 0.5, feather: 0.0 };
        assert!(bad.alpha(&face, &lm).is_err());
        assert!(LowerFaceMask { cut: -1.0, feather: 0.1 }.alpha(&face, &lm).is_err());
    }

    #[test]
    fn ellipse_depth_is_the_distance_to_the_ellipse() {
        let mut state = 7u64;
        let mut rnd = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for (a, b) in [(80.0, 130.0), (130.0, 80.0), (50.0, 50.0), (8.0, 11.0)] {
            let boundary: Vec<P> = (0..20000)
                .map(|i| {
                    let t = i as f64 / 20000.0 * std::f64::consts::FRAC_PI_2;
                    [a * t.cos(), b * t.sin()]
                })
                .collect();
            let mut points: Vec<P> = (0..300).map(|_| [rnd() * a, rnd() * b]).collect();
            points.extend([[0.0, 0.0], [0.0, b * 0.5], [a * 0.5, 0.0], [a * 0.99, 0.0], [0.0, b * 0.99]]);
            for [x, y] in points {
                if (x / a).powi(2) + (y / b).powi(2) > 1.0 {
                    continue;
                }
                let brute = boundary.iter().map(|q| (q[0] - x).hypot(q[1] - y)).fold(f64::INFINITY, f64::min);
                let got = ellipse_depth(a, b, x, y);
                assert!((got - brute).abs() <= 1e-2 + 1e-4 * a.max(b), "{a}x{b} at ({x}, {y}): {got} vs {brute}");
            }
        }
    }
}
