//! Compositing fused with NV12: outside the face box the frame is the background's NV12
//! exactly; deep inside it is the crop's colour; the feathered edge blends between them. The
//! tests that take a backend run once per device (`test_device!`: the CPU path, the
//! `composite_nv12` kernels in the SIMT emulator, CUDA).

mod common;
use cadence::backend::composite::{Compositor, FaceBox};
use cadence::{Backend, ColorMatrix, RgbLayout, RgbRange};

fn compose_pastes_the_crop_into_the_box_only(backend: &Backend) {
    let (w, h) = (96, 64);
    let mut bg = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            bg.extend_from_slice(&[(x * 2) as u8, (y * 3) as u8, 90]);
        }
    }
    let face = FaceBox { x: 20, y: 10, w: 40, h: 36 };
    let (fx, fy, fw, fh) = face.as_usize();
    {
        let c = Compositor::new(backend, &bg, w, h, face, 6.0, ColorMatrix::Bt709).unwrap();
        // A constant orange crop, in [0, 1].
        let (cw, ch) = (16, 16);
        let crop: Vec<f32> = [1.0f32, 0.5, 0.0].iter().flat_map(|&v| std::iter::repeat_n(v, cw * ch)).collect();
        let mut out = vec![0u8; c.frame_bytes()];
        c.compose_frame(&crop, cw, ch, RgbRange::Unit, &mut out).unwrap();
        let bg_nv12 = c.background_nv12().to_vec();
        let solid =
            backend.rgb_to_nv12(&crop, RgbLayout::packed(cw, ch, 1), ColorMatrix::Bt709, RgbRange::Unit).unwrap();
        let (y_face, u_face, v_face) = (solid[0], solid[cw * ch], solid[cw * ch + 1]);
        for y in 0..h {
            for x in 0..w {
                let inside = x >= fx && x < fx + fw && y >= fy && y < fy + fh;
                let deep = x >= fx + 8 && x < fx + fw - 8 && y >= fy + 8 && y < fy + fh - 8;
                let got = out[y * w + x];
                if !inside {
                    assert_eq!(got, bg_nv12[y * w + x], "outside ({x},{y})");
                } else if deep {
                    assert!((got as i32 - y_face as i32).abs() <= 1, "inside ({x},{y}): {got} vs {y_face}");
                }
            }
        }
        let uv = w * h;
        let (bx, by) = ((fx + fw / 2) / 2, (fy + fh / 2) / 2);
        assert!((out[uv + by * w + 2 * bx] as i32 - u_face as i32).abs() <= 1);
        assert!((out[uv + by * w + 2 * bx + 1] as i32 - v_face as i32).abs() <= 1);
        // The outermost ring of the box is almost all background (feather weight near 0).
        let edge = out[(fy + fh / 2) * w + fx] as i32;
        let bgv = bg_nv12[(fy + fh / 2) * w + fx] as i32;
        assert!((edge - bgv).abs() <= 3, "feathered edge {edge} vs background {bgv}");
    }
}
test_device!(compose_pastes_the_crop_into_the_box_only);

#[test]
fn bad_geometry_is_rejected() {
    let bg = vec![0u8; 64 * 64 * 3];
    let b = Backend::Cpu;
    assert!(Compositor::new(&b, &bg, 64, 64, FaceBox { x: 40, y: 0, w: 32, h: 32 }, 4.0, ColorMatrix::Bt709).is_err());
    assert!(Compositor::new(&b, &bg, 64, 64, FaceBox { x: 1, y: 0, w: 32, h: 32 }, 4.0, ColorMatrix::Bt709).is_err());
    assert!(
        Compositor::new(&b, &bg[..100], 64, 64, FaceBox { x: 0, y: 0, w: 32, h: 32 }, 4.0, ColorMatrix::Bt709).is_err()
    );
}

/// f64 reference of the whole compositor, written from the definitions (pixel-centre bilinear
/// resize clamped at the crop border, Hermite feather toward every box edge, BT.709 limited
/// range from Kr = 0.2126, Kb = 0.0722, chroma from the 2x2 average): within 1 LSB everywhere,
/// for a crop stored as f32 and as f16 (the reference reads the stored values).
fn compose_matches_an_f64_reference(b: &Backend) {
    compose_matches_an_f64_reference_in::<f32>(b);
    compose_matches_an_f64_reference_in::<half::f16>(b);
}
test_device!(compose_matches_an_f64_reference);

fn compose_matches_an_f64_reference_in<T: cadence::Elem>(b: &Backend) {
    let (w, h) = (70usize, 52usize);
    let face = FaceBox { x: 8, y: 6, w: 46, h: 40 };
    let (fx, fy, fw, fh) = face.as_usize();
    let (cw, ch, feather) = (19usize, 23usize, 5.0f64);
    let mut state = 12345u64;
    let mut rnd = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 40) as f64 / (1u64 << 24) as f64
    };
    let bg: Vec<u8> = (0..w * h * 3).map(|_| (rnd() * 255.0) as u8).collect();
    let crop: Vec<T> = (0..3 * cw * ch).map(|_| T::from_f32(rnd() as f32)).collect();
    let (kr, kb) = (0.2126f64, 0.0722f64);
    let kg = 1.0 - kr - kb;
    let hermite = |t: f64| {
        let t = t.clamp(0.0, 1.0);
        t * t * (3.0 - 2.0 * t)
    };
    let rgb_at = |x: usize, y: usize| -> [f64; 3] {
        let bgpx = |c: usize| bg[(y * w + x) * 3 + c] as f64;
        if x < fx || x >= fx + fw || y < fy || y >= fy + fh {
            return [bgpx(0), bgpx(1), bgpx(2)];
        }
        let (px, py) = (x - fx, y - fy);
        let coord = |p: usize, bl: usize, cl: usize| {
            let c = ((p as f64 + 0.5) * cl as f64 / bl as f64 - 0.5).clamp(0.0, (cl - 1) as f64);
            let i0 = c.floor() as usize;
            (i0, (i0 + 1).min(cl - 1), c - i0 as f64)
        };
        let (x0, x1, fx) = coord(px, fw, cw);
        let (y0, y1, fy) = coord(py, fh, ch);
        let d =
            (px as f64 + 0.5).min(fw as f64 - px as f64 - 0.5).min(py as f64 + 0.5).min(fh as f64 - py as f64 - 0.5);
        let a = hermite(d / feather);
        let mut out = [0.0; 3];
        for (c, o) in out.iter_mut().enumerate() {
            let s = |xx: usize, yy: usize| crop[c * cw * ch + yy * cw + xx].to_f32() as f64 * 255.0;
            let top = s(x0, y0) * (1.0 - fx) + s(x1, y0) * fx;
            let bot = s(x0, y1) * (1.0 - fx) + s(x1, y1) * fx;
            *o = a * (top * (1.0 - fy) + bot * fy) + (1.0 - a) * bgpx(c);
        }
        out
    };
    let q = |v: f64| (v + 0.5).floor().clamp(0.0, 255.0) as i32;
    let luma = |p: [f64; 3]| kr * p[0] + kg * p[1] + kb * p[2];
    let c = Compositor::new(b, &bg, w, h, face, feather as f32, ColorMatrix::Bt709).unwrap();
    let mut out = vec![0u8; c.frame_bytes()];
    c.compose_frame(&crop, cw, ch, RgbRange::Unit, &mut out).unwrap();
    let mut worst = 0;
    for by in 0..h / 2 {
        for bx in 0..w / 2 {
            let px: Vec<[f64; 3]> =
                [(0, 0), (1, 0), (0, 1), (1, 1)].iter().map(|&(dx, dy)| rgb_at(2 * bx + dx, 2 * by + dy)).collect();
            for (k, &(dx, dy)) in [(0, 0), (1, 0), (0, 1), (1, 1)].iter().enumerate() {
                let y_ref = q(16.0 + 219.0 / 255.0 * luma(px[k]));
                worst = worst.max((out[(2 * by + dy) * w + 2 * bx + dx] as i32 - y_ref).abs());
            }
            let avg: [f64; 3] = std::array::from_fn(|c| px.iter().map(|p| p[c]).sum::<f64>() / 4.0);
            let yl = luma(avg);
            let u_ref = q(128.0 + 224.0 / 255.0 * (avg[2] - yl) / (2.0 * (1.0 - kb)));
            let v_ref = q(128.0 + 224.0 / 255.0 * (avg[0] - yl) / (2.0 * (1.0 - kr)));
            let uv = w * h + by * w + 2 * bx;
            worst = worst.max((out[uv] as i32 - u_ref).abs()).max((out[uv + 1] as i32 - v_ref).abs());
        }
    }
    assert!(worst <= 1, "compositor ({}) differs from the f64 reference by {worst} LSB", T::DTYPE);
}

#[test]
fn compose_frame_rejects_wrong_sizes() {
    let bg = vec![0u8; 64 * 64 * 3];
    let c = Compositor::new(&Backend::Cpu, &bg, 64, 64, FaceBox { x: 0, y: 0, w: 32, h: 32 }, 4.0, ColorMatrix::Bt709)
        .unwrap();
    let mut out = vec![0u8; c.frame_bytes()];
    assert!(c.compose_frame(&[0.5f32; 10], 4, 4, RgbRange::Unit, &mut out).is_err());
    assert!(c.compose_frame(&[0.5f32; 48], 4, 4, RgbRange::Unit, &mut out[..10]).is_err());
}

#[test]
fn compose_box_writes_the_face_box_only_and_equals_compose_frame_on_a_background_buffer() {
    let (w, h) = (64, 48);
    let bg: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
    let face = FaceBox { x: 10, y: 8, w: 30, h: 24 };
    let (fx, fy, fw, fh) = face.as_usize();
    let c = Compositor::new(&Backend::Cpu, &bg, w, h, face, 5.0, ColorMatrix::Bt709).unwrap();
    let crop: Vec<f32> = (0..3 * 20 * 20).map(|i| (i % 97) as f32 / 96.0).collect();
    let mut full = vec![0u8; c.frame_bytes()];
    c.compose_frame(&crop, 20, 20, RgbRange::Unit, &mut full).unwrap();
    // On a buffer that already holds the background (the render loop's reused frame): identical.
    let mut reused = c.background_nv12().to_vec();
    c.compose_box(&crop, 20, 20, RgbRange::Unit, &mut reused).unwrap();
    assert_eq!(reused, full);
    // Outside the box nothing is touched: a marker survives.
    let mut marked = vec![0xAAu8; c.frame_bytes()];
    c.compose_box(&crop, 20, 20, RgbRange::Unit, &mut marked).unwrap();
    for y in 0..h {
        for x in 0..w {
            let inside = x >= fx && x < fx + fw && y >= fy && y < fy + fh;
            if !inside {
                assert_eq!(marked[y * w + x], 0xAA, "({x},{y}) outside the box was written");
            } else {
                assert_eq!(marked[y * w + x], full[y * w + x], "({x},{y}) inside the box");
            }
        }
    }
    assert!(c.compose_box(&crop, 20, 20, RgbRange::Unit, &mut marked[..5]).is_err());
}

/// The separable CPU compositor gives exactly the bytes of the per-pixel formula the GPU kernel
/// evaluates (`blend_bilinear` per pixel, then `convert_block` per 2x2 block), for upscaling,
/// downscaling, odd crop sizes, a hard edge and both matrices and ranges.
#[test]
fn cpu_compositor_is_bit_identical_to_the_per_pixel_kernel_formula() {
    use cadence_kernels::color;
    use cadence_kernels::composite::{blend_bilinear, feather_alpha, tap};
    let cases = [
        (
            96usize,
            64usize,
            FaceBox { x: 20, y: 10, w: 40, h: 36 },
            16usize,
            16usize,
            6.0f32,
            ColorMatrix::Bt709,
            RgbRange::Unit,
        ),
        (640, 480, FaceBox { x: 100, y: 50, w: 300, h: 260 }, 256, 256, 30.0, ColorMatrix::Bt601, RgbRange::Signed),
        (128, 128, FaceBox { x: 0, y: 0, w: 128, h: 128 }, 37, 53, 0.0, ColorMatrix::Bt709, RgbRange::Unit),
        (200, 100, FaceBox { x: 10, y: 20, w: 30, h: 40 }, 256, 256, 5.0, ColorMatrix::Bt709, RgbRange::Unit),
    ];
    for (w, h, f, cw, ch, feather, m, rng) in cases {
        let (fx, fy, fw, fh) = f.as_usize();
        let bg: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        let c = Compositor::new(&Backend::Cpu, &bg, w, h, f, feather, m).unwrap();
        let crop: Vec<f32> = (0..3 * cw * ch).map(|i| ((i * 7919) % 1000) as f32 / 700.0 - 0.3).collect();
        let mut got = vec![0u8; c.frame_bytes()];
        c.compose_frame(&crop, cw, ch, rng, &mut got).unwrap();

        let mut want = c.background_nv12().to_vec();
        let coeffs = color::coeffs(m.code());
        let px8 =
            |ch_: usize, x: u32, y: u32| color::to_8bit(crop[ch_ * cw * ch + y as usize * cw + x as usize], rng.code());
        for by in 0..fh / 2 {
            for bx in 0..fw / 2 {
                let mut rgb = [[0f32; 4]; 3];
                for (k, (dx, dy)) in [(0, 0), (1, 0), (0, 1), (1, 1)].into_iter().enumerate() {
                    let (x, y) = (2 * bx + dx, 2 * by + dy);
                    let a = feather_alpha(x as u32, y as u32, f.w, f.h, feather);
                    let (tx, ty) = (tap(x as u32, f.w, cw as u32), tap(y as u32, f.h, ch as u32));
                    for (cc, v) in rgb.iter_mut().enumerate() {
                        let bgv = bg[((fy + y) * w + fx + x) * 3 + cc] as f32 / 255.0;
                        let term = (1.0 - a) * 255.0 * bgv;
                        v[k] = blend_bilinear(
                            px8(cc, tx.i0, ty.i0),
                            px8(cc, tx.i1, ty.i0),
                            px8(cc, tx.i0, ty.i1),
                            px8(cc, tx.i1, ty.i1),
                            &tx,
                            &ty,
                            a,
                            term,
                        );
                    }
                }
                let t = |cc: usize| (rgb[cc][0], rgb[cc][1], rgb[cc][2], rgb[cc][3]);
                let blk = color::convert_block(&coeffs, t(0), t(1), t(2));
                let (x, y) = (fx + 2 * bx, fy + 2 * by);
                want[y * w + x] = blk.y.0;
                want[y * w + x + 1] = blk.y.1;
                want[(y + 1) * w + x] = blk.y.2;
                want[(y + 1) * w + x + 1] = blk.y.3;
                let uv = w * h + (y / 2) * w + x;
                want[uv] = blk.u;
                want[uv + 1] = blk.v;
            }
        }
        let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(diff, 0, "{w}x{h} box {f:?} crop {cw}x{ch}: {diff} bytes differ from the per-pixel formula");
    }
}

/// `with_alpha` given the feathered rectangle builds what `new` builds; it checks the table; and
/// with the lower-face mask the frame keeps the background above the eyes and shows the crop
/// over the mouth.
#[test]
fn with_alpha_takes_any_weight_table_and_new_is_it_with_the_feathered_rectangle() {
    use cadence::avatar::mask::lower_face_alpha;
    use cadence::backend::composite::feathered_rect_alpha;
    let (w, h) = (96usize, 80usize);
    let bg: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
    let face = FaceBox { x: 16, y: 8, w: 64, h: 64 };
    let (fx, fy, fw, fh) = face.as_usize();
    let (b, m) = (Backend::Cpu, ColorMatrix::Bt709);
    let new = Compositor::new(&b, &bg, w, h, face, 6.0, m).unwrap();
    let given = Compositor::with_alpha(&b, &bg, w, h, face, feathered_rect_alpha(&face, 6.0), m).unwrap();
    assert_eq!(given.tables(), new.tables());
    assert_eq!((new.feather, given.feather), (6.0, 0.0));
    let with = |alpha: Vec<f32>| Compositor::with_alpha(&b, &bg, w, h, face, alpha, m);
    assert!(with(vec![1.0; fw * fh - 1]).is_err());
    for bad in [f32::NAN, 1.5, -0.01] {
        let mut alpha = vec![1.0; fw * fh];
        alpha[fw * 3 + 5] = bad;
        let e = with(alpha).err().unwrap().to_string();
        assert!(e.contains("at box pixel (5, 3) is not in [0, 1]"), "{e}");
    }
    assert!(Compositor::with_alpha(&b, &bg, w, h, FaceBox { x: 1, ..face }, vec![1.0; fw * fh], m).is_err());

    // Eyes at y = 30, nose tip at 44, mouth at 54, in the box's frame coordinates.
    let lm = [[34.0, 30.0], [62.0, 30.0], [48.0, 44.0], [38.0, 54.0], [58.0, 54.0]];
    let c = with(lower_face_alpha(&face, &lm).unwrap()).unwrap();
    let (cw, ch) = (16, 16);
    let crop: Vec<f32> = [1.0f32, 0.5, 0.0].iter().flat_map(|&v| std::iter::repeat_n(v, cw * ch)).collect();
    let mut out = vec![0u8; c.frame_bytes()];
    c.compose_frame(&crop, cw, ch, RgbRange::Unit, &mut out).unwrap();
    let bg_nv12 = c.background_nv12();
    let solid = b.rgb_to_nv12(&crop, RgbLayout::packed(cw, ch, 1), m, RgbRange::Unit).unwrap();
    for y in 0..h {
        for x in 0..w {
            let (got, want) = (out[y * w + x] as i32, bg_nv12[y * w + x] as i32);
            if y < 30 || x < fx || x >= fx + fw || y >= fy + fh {
                assert!((got - want).abs() <= 1, "({x},{y}): {got}, background {want}");
            }
        }
    }
    assert!((out[54 * w + 48] as i32 - solid[0] as i32).abs() <= 1, "mouth");
    let uv = w * h + 27 * w + 48;
    assert!(
        (out[uv] as i32 - solid[cw * ch] as i32).abs() <= 1
            && (out[uv + 1] as i32 - solid[cw * ch + 1] as i32).abs() <= 1
    );
}
