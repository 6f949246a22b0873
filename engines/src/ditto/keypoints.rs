//! Ditto's per-frame keypoint arithmetic (`core/atomic_components/motion_stitch.py`, LivePortrait's
//! `transform_keypoint`), plus the rotation algebra cadence adds for easing and infill.
//!
//! **Motion** (265 values per frame, the LMDM's output and the source's condition): scale − 1 |
//! pitch, yaw, roll as 66 bin logits each | t (3) | exp (21 × 3). [`KpInfo`] holds one frame of
//! it; the motion extractor's heads give the same fields plus the canonical keypoints `kp`.
//!
//! **Pose**: degrees = softmax(logits)·(0..66)·3 − 97.5 (`bin66_to_degree`); the rotation is
//! R = (Rz(roll)·Ry(yaw)·Rx(pitch))ᵀ and keypoints are row vectors, so x' = x·R.
//!
//! **Keypoints** of a frame: x = scale·(kp·R + exp), then x, y += t.x, t.y (z is not shifted).
//!
//! **Driving** (an image source, Ditto's defaults): relative to the first generated frame d₀,
//! x_d = x_s + (d − d₀) for exp, the pose logits and t; the scale stays the source's; the
//! expression keeps the driving values only on the lip keypoints [6, 12, 14, 17, 19, 20] and
//! the eye keypoints [11, 13, 15, 16, 18] and the source's elsewhere.
//!
//! **Easing toward rest** (cadence's, the source document's section 5.2): the rest state is the
//! source image's own motion. A frame with easing weight w has the rotation
//! slerp(R_rest, R_d, w) on SO(3) (unit quaternions, the shorter arc), not a blend of Euler
//! angles, and exp, t, scale rest + w·(driving − rest). At w = 0 it is exactly the rest state.

use crate::{EngineError, Result};

/// Keypoints per face.
pub const NUM_KP: usize = 21;
/// Bins of each pose logit vector.
pub const BINS: usize = 66;
/// Values per frame of motion: 1 + 3·66 + 3 + 63.
pub const MOTION_DIM: usize = 1 + 3 * BINS + 3 + 3 * NUM_KP;
/// The lip keypoints, whose expression follows the driving motion.
pub const LIP: [usize; 6] = [6, 12, 14, 17, 19, 20];
/// The eye keypoints, driven too for an image source.
pub const EYE: [usize; 5] = [11, 13, 15, 16, 18];

/// A 3×3 rotation, row-major, in f64.
pub type Mat3 = [[f64; 3]; 3];

/// One frame of motion.
#[derive(Debug, Clone, PartialEq)]
pub struct KpInfo {
    pub scale: f32,
    pub pitch: Vec<f32>,
    pub yaw: Vec<f32>,
    pub roll: Vec<f32>,
    pub t: [f32; 3],
    /// 21 × 3.
    pub exp: Vec<f32>,
}

impl KpInfo {
    /// From a 265-value motion row (the LMDM's layout: scale − 1 first).
    pub fn from_motion(m: &[f32]) -> Result<KpInfo> {
        if m.len() != MOTION_DIM {
            return Err(EngineError::BadInput(format!("a motion row has {} values, expected {MOTION_DIM}", m.len())));
        }
        let b = |i: usize| m[1 + i * BINS..1 + (i + 1) * BINS].to_vec();
        let t0 = 1 + 3 * BINS;
        Ok(KpInfo {
            scale: m[0] + 1.0,
            pitch: b(0),
            yaw: b(1),
            roll: b(2),
            t: [m[t0], m[t0 + 1], m[t0 + 2]],
            exp: m[t0 + 3..].to_vec(),
        })
    }

    /// The 265-value row (Ditto's `_cvt_LP_motion_info(.., 'dic2arr')` without `kp`).
    pub fn to_motion(&self) -> Vec<f32> {
        let mut m = Vec::with_capacity(MOTION_DIM);
        m.push(self.scale - 1.0);
        m.extend_from_slice(&self.pitch);
        m.extend_from_slice(&self.yaw);
        m.extend_from_slice(&self.roll);
        m.extend_from_slice(&self.t);
        m.extend_from_slice(&self.exp);
        m
    }

    /// From the motion extractor's heads in their export order (pitch, yaw, roll, t, exp, scale,
    /// kp): the frame's motion and its canonical keypoints `kp` (21 × 3).
    pub fn from_heads(heads: &[Vec<f32>]) -> Result<(KpInfo, Vec<f32>)> {
        let sizes = [BINS, BINS, BINS, 3, 3 * NUM_KP, 1, 3 * NUM_KP];
        if heads.len() != 7 || heads.iter().zip(sizes).any(|(h, s)| h.len() != s) {
            let got: Vec<usize> = heads.iter().map(Vec::len).collect();
            return Err(EngineError::BadInput(format!("motion extractor heads of sizes {got:?}, expected {sizes:?}")));
        }
        let info = KpInfo {
            scale: heads[5][0],
            pitch: heads[0].clone(),
            yaw: heads[1].clone(),
            roll: heads[2].clone(),
            t: [heads[3][0], heads[3][1], heads[3][2]],
            exp: heads[4].clone(),
        };
        Ok((info, heads[6].clone()))
    }

    /// (pitch, yaw, roll) in degrees.
    pub fn degrees(&self) -> [f64; 3] {
        [bins_to_degrees(&self.pitch), bins_to_degrees(&self.yaw), bins_to_degrees(&self.roll)]
    }

    /// The frame's rotation R (x' = x·R).
    pub fn rotation(&self) -> Mat3 {
        let [p, y, r] = self.degrees();
        rotation_from_degrees(p, y, r)
    }

    /// Whether every value is finite.
    pub fn is_finite(&self) -> bool {
        self.to_motion().iter().all(|v| v.is_finite())
    }
}

/// Degrees from 66 bin logits: softmax(logits)·index·3 − 97.5, in f64.
pub fn bins_to_degrees(logits: &[f32]) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let (mut num, mut den) = (0.0, 0.0);
    for (i, &l) in logits.iter().enumerate() {
        let e = (l as f64 - max).exp();
        num += e * i as f64;
        den += e;
    }
    num / den * 3.0 - 97.5
}

fn matmul(a: &Mat3, b: &Mat3) -> Mat3 {
    let mut c = [[0.0; 3]; 3];
    for (i, row) in c.iter_mut().enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = (0..3).map(|k| a[i][k] * b[k][j]).sum();
        }
    }
    c
}

fn transpose(a: &Mat3) -> Mat3 {
    let mut t = [[0.0; 3]; 3];
    for (i, row) in a.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            t[j][i] = v;
        }
    }
    t
}

/// LivePortrait's `get_rotation_matrix(pitch, yaw, roll)` (degrees): (Rz·Ry·Rx)ᵀ.
pub fn rotation_from_degrees(pitch: f64, yaw: f64, roll: f64) -> Mat3 {
    let (x, y, z) = (pitch.to_radians(), yaw.to_radians(), roll.to_radians());
    let rx = [[1.0, 0.0, 0.0], [0.0, x.cos(), -x.sin()], [0.0, x.sin(), x.cos()]];
    let ry = [[y.cos(), 0.0, y.sin()], [0.0, 1.0, 0.0], [-y.sin(), 0.0, y.cos()]];
    let rz = [[z.cos(), -z.sin(), 0.0], [z.sin(), z.cos(), 0.0], [0.0, 0.0, 1.0]];
    transpose(&matmul(&matmul(&rz, &ry), &rx))
}

/// `transform_keypoint`: scale·(kp·R + exp), then x, y += t.x, t.y. `kp`, `exp`: 21 × 3.
pub fn transform_keypoints(kp: &[f32], r: &Mat3, exp: &[f32], scale: f32, t: [f32; 3]) -> Vec<f32> {
    assert!(kp.len() == exp.len() && kp.len().is_multiple_of(3), "keypoints and expression must be n x 3");
    let mut out = Vec::with_capacity(kp.len());
    for (p, e) in kp.chunks_exact(3).zip(exp.chunks_exact(3)) {
        for j in 0..3 {
            let rotated: f64 = (0..3).map(|k| p[k] as f64 * r[k][j]).sum();
            let mut v = (rotated + e[j] as f64) * scale as f64;
            if j < 2 {
                v += t[j] as f64;
            }
            out.push(v as f32);
        }
    }
    out
}

/// A unit quaternion (w, x, y, z).
pub type Quat = [f64; 4];

/// The unit quaternion of a rotation matrix (Shepperd's method: the largest of the four
/// candidates is divided by, so no branch loses precision near 180°).
pub fn quat_from_matrix(m: &Mat3) -> Quat {
    let tr = m[0][0] + m[1][1] + m[2][2];
    let q = if tr > m[0][0].max(m[1][1]).max(m[2][2]) {
        let s = (1.0 + tr).sqrt() * 2.0;
        [s / 4.0, (m[2][1] - m[1][2]) / s, (m[0][2] - m[2][0]) / s, (m[1][0] - m[0][1]) / s]
    } else if m[0][0] >= m[1][1] && m[0][0] >= m[2][2] {
        let s = (1.0 + m[0][0] - m[1][1] - m[2][2]).sqrt() * 2.0;
        [(m[2][1] - m[1][2]) / s, s / 4.0, (m[0][1] + m[1][0]) / s, (m[0][2] + m[2][0]) / s]
    } else if m[1][1] >= m[2][2] {
        let s = (1.0 + m[1][1] - m[0][0] - m[2][2]).sqrt() * 2.0;
        [(m[0][2] - m[2][0]) / s, (m[0][1] + m[1][0]) / s, s / 4.0, (m[1][2] + m[2][1]) / s]
    } else {
        let s = (1.0 + m[2][2] - m[0][0] - m[1][1]).sqrt() * 2.0;
        [(m[1][0] - m[0][1]) / s, (m[0][2] + m[2][0]) / s, (m[1][2] + m[2][1]) / s, s / 4.0]
    };
    let n = q.iter().map(|v| v * v).sum::<f64>().sqrt();
    q.map(|v| v / n)
}

/// The rotation matrix of a unit quaternion.
pub fn matrix_from_quat(q: &Quat) -> Mat3 {
    let [w, x, y, z] = *q;
    [
        [1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y)],
        [2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x)],
        [2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)],
    ]
}

/// Spherical interpolation of rotations: q(α) on the shorter great arc from `a` (α = 0) to `b`
/// (α = 1), q and −q being the same rotation. Near-equal rotations fall back to a normalised
/// linear blend (the arc's sine vanishes there, and the chord equals the arc to f64 precision).
pub fn slerp_rotation(a: &Mat3, b: &Mat3, alpha: f64) -> Mat3 {
    let (qa, mut qb) = (quat_from_matrix(a), quat_from_matrix(b));
    let mut dot: f64 = qa.iter().zip(&qb).map(|(x, y)| x * y).sum();
    if dot < 0.0 {
        qb = qb.map(|v| -v);
        dot = -dot;
    }
    let (ca, cb) = if dot > 1.0 - 1e-12 {
        (1.0 - alpha, alpha)
    } else {
        let theta = dot.min(1.0).acos();
        let s = theta.sin();
        (((1.0 - alpha) * theta).sin() / s, (alpha * theta).sin() / s)
    };
    let mut q = [0.0; 4];
    for i in 0..4 {
        q[i] = ca * qa[i] + cb * qb[i];
    }
    let n = q.iter().map(|v| v * v).sum::<f64>().sqrt();
    matrix_from_quat(&q.map(|v| v / n))
}

/// The angle in degrees of the rotation taking `a` to `b` (for tests and reports).
pub fn rotation_angle_deg(a: &Mat3, b: &Mat3) -> f64 {
    let rel = matmul(&transpose(a), b);
    let c = ((rel[0][0] + rel[1][1] + rel[2][2] - 1.0) / 2.0).clamp(-1.0, 1.0);
    c.acos().to_degrees()
}

/// Ditto's relative driving for an image source (module docs): x_s + (d − d₀) for exp, pose
/// logits and t, the source's scale, and the expression masked to the lip and eye keypoints.
pub fn relative_driving(source: &KpInfo, d: &KpInfo, d0: &KpInfo) -> KpInfo {
    let rel = |s: &[f32], v: &[f32], v0: &[f32]| -> Vec<f32> {
        s.iter().zip(v).zip(v0).map(|((s, v), v0)| s + (v - v0)).collect()
    };
    let mut exp = rel(&source.exp, &d.exp, &d0.exp);
    for k in 0..NUM_KP {
        if !LIP.contains(&k) && !EYE.contains(&k) {
            exp[3 * k..3 * k + 3].copy_from_slice(&source.exp[3 * k..3 * k + 3]);
        }
    }
    let t = rel(&source.t, &d.t, &d0.t);
    KpInfo {
        scale: source.scale,
        pitch: rel(&source.pitch, &d.pitch, &d0.pitch),
        yaw: rel(&source.yaw, &d.yaw, &d0.yaw),
        roll: rel(&source.roll, &d.roll, &d0.roll),
        t: [t[0], t[1], t[2]],
        exp,
    }
}

/// A frame's pose and expression in the form the keypoints are made from: the rotation itself
/// (so that easing and infill can interpolate it on SO(3)), exp, scale, t.
#[derive(Debug, Clone, PartialEq)]
pub struct Pose {
    pub r: Mat3,
    pub exp: Vec<f32>,
    pub scale: f32,
    pub t: [f32; 3],
}

impl Pose {
    pub fn of(info: &KpInfo) -> Pose {
        Pose { r: info.rotation(), exp: info.exp.clone(), scale: info.scale, t: info.t }
    }

    /// The keypoints of canonical keypoints `kp` in this pose.
    pub fn keypoints(&self, kp: &[f32]) -> Vec<f32> {
        transform_keypoints(kp, &self.r, &self.exp, self.scale, self.t)
    }

    /// Easing toward `rest` (module docs): `rest` at w = 0, `self` at w = 1, the rotation on
    /// the shorter arc between them.
    pub fn eased(&self, rest: &Pose, w: f32) -> Pose {
        if w >= 1.0 {
            return self.clone();
        }
        if w <= 0.0 {
            return rest.clone();
        }
        let mix = |a: f32, b: f32| a + w * (b - a);
        Pose {
            r: slerp_rotation(&rest.r, &self.r, w as f64),
            exp: rest.exp.iter().zip(&self.exp).map(|(&a, &b)| mix(a, b)).collect(),
            scale: mix(rest.scale, self.scale),
            t: [mix(rest.t[0], self.t[0]), mix(rest.t[1], self.t[1]), mix(rest.t[2], self.t[2])],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(seed: u32) -> KpInfo {
        // A deterministic, non-trivial frame of motion.
        let v =
            |n: usize, k: u32| (0..n).map(|i| ((i as u32 * 7919 + k * 104729) % 1000) as f32 / 500.0 - 1.0).collect();
        KpInfo {
            scale: 1.1,
            pitch: v(BINS, seed),
            yaw: v(BINS, seed + 1),
            roll: v(BINS, seed + 2),
            t: [0.05, -0.02, 0.3],
            exp: v(3 * NUM_KP, seed + 3).iter().map(|x: &f32| x * 0.02).collect(),
        }
    }

    #[test]
    fn motion_rows_round_trip_in_ditto_layout() {
        let i = info(3);
        let m = i.to_motion();
        assert_eq!(m.len(), 265);
        assert!((m[0] - 0.1).abs() < 1e-6, "scale is stored minus one");
        assert_eq!(m[1..67], i.pitch[..]);
        assert_eq!(m[199..202], i.t[..]);
        assert_eq!(KpInfo::from_motion(&m).unwrap(), i);
        assert!(KpInfo::from_motion(&m[1..]).is_err());
    }

    #[test]
    fn degrees_are_the_softmax_expectation() {
        // One dominant bin i gives 3i − 97.5; uniform logits give the middle, 0.
        let mut l = vec![-50.0f32; BINS];
        l[40] = 50.0;
        assert!((bins_to_degrees(&l) - (120.0 - 97.5)).abs() < 1e-9);
        assert!((bins_to_degrees(&[0.3; BINS]) - 0.0).abs() < 1e-9);
        // Large logits do not overflow (max subtracted).
        let mut big = vec![0.0f32; BINS];
        big[0] = 1e4;
        assert!((bins_to_degrees(&big) + 97.5).abs() < 1e-9);
    }

    /// Independent reference: rotate by Euler angles about fixed axes one at a time (pitch
    /// about x, then yaw about y, then roll about z) acting on column vectors, i.e. the
    /// column-vector rotation Rz·Ry·Rx; LivePortrait's row-vector form x·R must agree.
    #[test]
    fn rotation_matches_successive_axis_rotations() {
        let (p, y, r) = (12.0f64, -30.0f64, 7.5f64);
        let rot = rotation_from_degrees(p, y, r);
        let v = [0.3f64, -0.2, 0.9];
        let about = |v: [f64; 3], axis: usize, deg: f64| {
            let (c, s) = (deg.to_radians().cos(), deg.to_radians().sin());
            let (i, j) = match axis {
                0 => (1, 2),
                1 => (2, 0),
                _ => (0, 1),
            };
            let mut o = v;
            o[i] = c * v[i] - s * v[j];
            o[j] = s * v[i] + c * v[j];
            o
        };
        let expect = about(about(about(v, 0, p), 1, y), 2, r);
        let got: Vec<f64> = (0..3).map(|j| (0..3).map(|k| v[k] * rot[k][j]).sum()).collect();
        for j in 0..3 {
            assert!((got[j] - expect[j]).abs() < 1e-12, "{got:?} vs {expect:?}");
        }
    }

    #[test]
    fn keypoints_scale_rotate_and_shift_only_x_y() {
        let kp: Vec<f32> = (0..63).map(|i| (i as f32 * 0.37).sin()).collect();
        let exp = vec![0.01f32; 63];
        let id = rotation_from_degrees(0.0, 0.0, 0.0);
        let out = transform_keypoints(&kp, &id, &exp, 2.0, [0.5, -0.25, 9.0]);
        for k in 0..21 {
            assert!((out[3 * k] - ((kp[3 * k] + 0.01) * 2.0 + 0.5)).abs() < 1e-6);
            assert!((out[3 * k + 1] - ((kp[3 * k + 1] + 0.01) * 2.0 - 0.25)).abs() < 1e-6);
            assert!((out[3 * k + 2] - (kp[3 * k + 2] + 0.01) * 2.0).abs() < 1e-6, "z is not shifted");
        }
    }

    #[test]
    fn quaternions_round_trip_including_half_turns() {
        for (p, y, r) in
            [(0.0, 0.0, 0.0), (20.0, -40.0, 10.0), (180.0, 0.0, 0.0), (0.0, 179.9, 0.0), (90.0, 90.0, 90.0)]
        {
            let m = rotation_from_degrees(p, y, r);
            let back = matrix_from_quat(&quat_from_matrix(&m));
            assert!(rotation_angle_deg(&m, &back) < 1e-6, "({p}, {y}, {r})");
        }
    }

    /// Geodesic interpolation: the angle from a grows linearly with α (the arc, not the chord),
    /// the ends are exact, and the path takes the shorter way round.
    #[test]
    fn slerp_moves_at_constant_angular_speed_on_the_shorter_arc() {
        let a = rotation_from_degrees(10.0, -20.0, 5.0);
        let b = rotation_from_degrees(-30.0, 45.0, 20.0);
        let total = rotation_angle_deg(&a, &b);
        for alpha in [0.0, 0.25, 0.5, 0.9, 1.0] {
            let m = slerp_rotation(&a, &b, alpha);
            assert!((rotation_angle_deg(&a, &m) - alpha * total).abs() < 1e-6, "alpha {alpha}");
            assert!((rotation_angle_deg(&m, &b) - (1.0 - alpha) * total).abs() < 1e-6, "alpha {alpha}");
        }
        // 170° one way is 190° the other: the midpoint is 85° from each end.
        let c = rotation_from_degrees(0.0, 170.0, 0.0);
        let id = rotation_from_degrees(0.0, 0.0, 0.0);
        let mid = slerp_rotation(&id, &c, 0.5);
        assert!((rotation_angle_deg(&id, &mid) - 85.0).abs() < 1e-6);
        // Equal rotations: no NaN.
        let same = slerp_rotation(&a, &a, 0.3);
        assert!(rotation_angle_deg(&a, &same) < 1e-6);
    }

    /// Per-Euler-angle blending is not geodesic: for a large turn its midpoint is measurably
    /// off the arc, which is why easing uses quaternions.
    #[test]
    fn euler_blending_leaves_the_geodesic() {
        let (pa, pb) = ([60.0, 0.0, 0.0], [0.0, 60.0, 60.0]);
        let a = rotation_from_degrees(pa[0], pa[1], pa[2]);
        let b = rotation_from_degrees(pb[0], pb[1], pb[2]);
        let euler_mid = rotation_from_degrees(30.0, 30.0, 30.0);
        let geo_mid = slerp_rotation(&a, &b, 0.5);
        assert!(rotation_angle_deg(&euler_mid, &geo_mid) > 1.0);
    }

    #[test]
    fn relative_driving_keeps_source_scale_and_non_lip_eye_expression() {
        let (s, d, d0) = (info(1), info(20), info(40));
        let x = relative_driving(&s, &d, &d0);
        assert_eq!(x.scale, s.scale);
        for k in 0..NUM_KP {
            for j in 0..3 {
                let i = 3 * k + j;
                let want =
                    if LIP.contains(&k) || EYE.contains(&k) { s.exp[i] + (d.exp[i] - d0.exp[i]) } else { s.exp[i] };
                assert_eq!(x.exp[i], want, "keypoint {k}");
            }
        }
        assert_eq!(x.pitch[5], s.pitch[5] + (d.pitch[5] - d0.pitch[5]));
        assert_eq!(x.t[2], s.t[2] + (d.t[2] - d0.t[2]));
        // The first frame drives nothing: it is the source.
        assert_eq!(relative_driving(&s, &d0, &d0).to_motion(), s.to_motion());
    }

    #[test]
    fn easing_ends_are_exact_and_midway_is_geodesic() {
        let (rest, drive) = (Pose::of(&info(2)), Pose::of(&info(9)));
        assert_eq!(drive.eased(&rest, 0.0), rest);
        assert_eq!(drive.eased(&rest, 1.0), drive);
        let half = drive.eased(&rest, 0.5);
        let total = rotation_angle_deg(&rest.r, &drive.r);
        assert!((rotation_angle_deg(&rest.r, &half.r) - total / 2.0).abs() < 1e-6);
        assert!((half.exp[4] - (rest.exp[4] + drive.exp[4]) / 2.0).abs() < 1e-7);
    }
}
