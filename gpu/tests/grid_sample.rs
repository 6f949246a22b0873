//! The 3-D grid sample's shared geometry (`grid_sample.rs`) against the formulas it states, in f64.
//! The whole operation, on every device, is tested against an independent f64 reference in
//! host/tests/grid_sample.rs.

use cadence_kernels::grid_sample::{axis_taps, unnormalize, Trilinear, MAX_AXIS};

#[test]
fn align_corners_false_maps_the_edges_half_a_voxel_outside_the_centres() {
    for size in [1u32, 2, 5, 9, 64] {
        assert_eq!(unnormalize(-1.0, size), -0.5);
        assert_eq!(unnormalize(1.0, size), size as f32 - 0.5);
        if size.is_power_of_two() {
            // Voxel centres (2i + 1)/W - 1 are exact dyadic numbers: u = i exactly.
            for i in 0..size {
                let x = (2 * i + 1) as f32 / size as f32 - 1.0;
                assert_eq!(unnormalize(x, size), i as f32, "size {size} voxel {i}");
            }
        }
    }
}

#[test]
fn taps_are_floor_and_its_neighbour_with_linear_weights() {
    let size = 7u32;
    let mut x = -1.6f32;
    while x < 1.6 {
        let u = unnormalize(x, size) as f64;
        let t = axis_taps(x, size);
        if u < -1.0 || u >= size as f64 {
            assert!(!t.in0 && !t.in1, "x {x}: u {u} has no corner inside");
            x += 0.001;
            continue;
        }
        assert_eq!(t.i0 as f64, u.floor(), "x {x}");
        assert_eq!(t.in0, t.i0 >= 0 && t.i0 < size as i32);
        assert_eq!(t.in1, t.i0 + 1 >= 0 && t.i0 + 1 < size as i32);
        assert!((t.w1 as f64 - (u - u.floor())).abs() < 1e-6 && (t.w0 as f64 - (u.floor() + 1.0 - u)).abs() < 1e-6);
        x += 0.001;
    }
    // Exactly at -1 voxel (u = -1): corner 0 is inside with weight 0, as in PyTorch.
    let t = axis_taps(-1.0 - 1.0 / 4.0, 4);
    assert_eq!((t.i0, t.in0, t.in1, t.w1), (-1, false, true, 0.0));
}

#[test]
fn nan_infinite_and_far_coordinates_have_no_corner_inside() {
    for x in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 3.0, -3.0, f32::MAX] {
        for size in [1u32, 16, 64, MAX_AXIS] {
            let t = axis_taps(x, size);
            assert!(!t.in0 && !t.in1, "x {x} size {size}");
        }
    }
    let t = Trilinear::new(0.0, f32::NAN, 0.0, 4, 4, 4);
    let corners = [&t.c000, &t.c001, &t.c010, &t.c011, &t.c100, &t.c101, &t.c110, &t.c111];
    assert!(corners.iter().all(|c| !c.inside && c.index == 0));
    // The values are never looked at: even infinite ones give +0.
    let s = t.blend(f32::INFINITY, f32::NAN, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0);
    assert_eq!(s.to_bits(), 0.0f32.to_bits());
}

#[test]
fn corners_index_the_volume_in_pytorch_order() {
    // (d, h, w) = (3, 4, 5); the point at voxel (z, y, x) = (1, 2, 3) + (0.25, 0.5, 0.75).
    let (d, h, w) = (3u32, 4u32, 5u32);
    let at = |i: f32, size: u32| (2.0 * i + 1.0) / size as f32 - 1.0;
    let t = Trilinear::new(at(3.75, w), at(2.5, h), at(1.25, d), d, h, w);
    let idx = |z: u32, y: u32, x: u32| (z * h + y) * w + x;
    let cs = [&t.c000, &t.c001, &t.c010, &t.c011, &t.c100, &t.c101, &t.c110, &t.c111];
    for (k, c) in cs.iter().enumerate() {
        let (zi, yi, xi) = ((k >> 2) as u32 & 1, (k >> 1) as u32 & 1, k as u32 & 1);
        assert!(c.inside);
        assert_eq!(c.index, idx(1 + zi, 2 + yi, 3 + xi), "corner {k}");
        let wx = if xi == 1 { 0.75 } else { 0.25 };
        let wy = 0.5;
        let wz = if zi == 1 { 0.25 } else { 0.75 };
        assert!((c.weight as f64 - wx * wy * wz).abs() < 1e-6, "corner {k}: {}", c.weight);
    }
}
