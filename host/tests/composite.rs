//! Compositing fused with NV12: outside the face box the frame is the background's NV12
//! exactly; deep inside it is the crop's colour; the feathered edge blends between them.

use cadence::composite::{Compositor, FaceBox};
use cadence::{Backend, ColorMatrix, RgbLayout, RgbRange};

#[test]
fn compose_pastes_the_crop_into_the_box_only() {
    let (w, h) = (96, 64);
    let mut bg = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            bg.extend_from_slice(&[(x * 2) as u8, (y * 3) as u8, 90]);
        }
    }
    let face = FaceBox { x: 20, y: 10, w: 40, h: 36 };
    for backend in Backend::all_available() {
        let c = Compositor::new(&backend, &bg, w, h, face, 6.0, ColorMatrix::Bt709).unwrap();
        // A constant orange crop, in [0, 1].
        let (cw, ch) = (16, 16);
        let crop: Vec<f32> = [1.0f32, 0.5, 0.0].iter().flat_map(|&v| std::iter::repeat_n(v, cw * ch)).collect();
        let mut out = vec![0u8; c.frame_bytes()];
        c.compose(&crop, cw, ch, RgbRange::Unit, &mut out);
        let bg_nv12 = c.background_nv12().to_vec();
        let solid = backend.rgb_to_nv12(&crop[..].iter().map(|&v| v).collect::<Vec<_>>()[..], RgbLayout::packed(cw, ch, 1), ColorMatrix::Bt709, RgbRange::Unit).unwrap();
        let (y_face, u_face, v_face) = (solid[0], solid[cw * ch], solid[cw * ch + 1]);
        for y in 0..h {
            for x in 0..w {
                let inside = x >= face.x && x < face.x + face.w && y >= face.y && y < face.y + face.h;
                let deep = x >= face.x + 8 && x < face.x + face.w - 8 && y >= face.y + 8 && y < face.y + face.h - 8;
                let got = out[y * w + x];
                if !inside {
                    assert_eq!(got, bg_nv12[y * w + x], "outside ({x},{y})");
                } else if deep {
                    assert!((got as i32 - y_face as i32).abs() <= 1, "inside ({x},{y}): {got} vs {y_face}");
                }
            }
        }
        let uv = w * h;
        let (bx, by) = ((face.x + face.w / 2) / 2, (face.y + face.h / 2) / 2);
        assert!((out[uv + by * w + 2 * bx] as i32 - u_face as i32).abs() <= 1);
        assert!((out[uv + by * w + 2 * bx + 1] as i32 - v_face as i32).abs() <= 1);
        // The outermost ring of the box is almost all background (feather weight near 0).
        let edge = out[(face.y + face.h / 2) * w + face.x] as i32;
        let bgv = bg_nv12[(face.y + face.h / 2) * w + face.x] as i32;
        assert!((edge - bgv).abs() <= 3, "feathered edge {edge} vs background {bgv}");
    }
}

#[test]
fn bad_geometry_is_rejected() {
    let bg = vec![0u8; 64 * 64 * 3];
    let b = Backend::Cpu;
    assert!(Compositor::new(&b, &bg, 64, 64, FaceBox { x: 40, y: 0, w: 32, h: 32 }, 4.0, ColorMatrix::Bt709).is_err());
    assert!(Compositor::new(&b, &bg, 64, 64, FaceBox { x: 1, y: 0, w: 32, h: 32 }, 4.0, ColorMatrix::Bt709).is_err());
    assert!(Compositor::new(&b, &bg[..100], 64, 64, FaceBox { x: 0, y: 0, w: 32, h: 32 }, 4.0, ColorMatrix::Bt709).is_err());
}
