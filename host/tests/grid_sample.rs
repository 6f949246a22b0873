//! The 3-D grid sample (`grid_sample_3d_f32`, PyTorch's 5-D `F.grid_sample` with
//! mode='bilinear', padding_mode='zeros', align_corners=False) against an f64 reference written
//! from PyTorch's documented formula, not from the shared math, plus hand-checkable cases; one
//! named test per device (`test_device!`: the CPU path, the kernel in the SIMT emulator, CUDA).

mod common;
use cadence::Backend;
use common::*;

/// PyTorch's definition in f64: for each output point the grid's (x, y, z) index (W, H, D) with
/// align_corners=False, i.e. ix = ((x + 1) * W - 1) / 2, and the sample is the sum over the eight
/// integer neighbours (cz, cy, cx) of floor(i..) + {0, 1} of the product of (1 - |ic - c|) over
/// the three axes times the value there, or times 0 where the neighbour is outside the volume
/// (zero padding). A NaN or infinite coordinate samples 0 (PyTorch's CUDA and CPU kernels move it
/// to -100 before flooring, outside every volume).
fn reference(input: &[f32], shape: [usize; 5], grid: &[f32], out: [usize; 3]) -> Vec<f64> {
    let [n, c, d, h, w] = shape;
    let voxels = out[0] * out[1] * out[2];
    let mut result = vec![0.0f64; n * c * voxels];
    for b in 0..n {
        for v in 0..voxels {
            let g = &grid[(b * voxels + v) * 3..(b * voxels + v) * 3 + 3];
            let (x, y, z) = (g[0] as f64, g[1] as f64, g[2] as f64);
            if !(x.is_finite() && y.is_finite() && z.is_finite()) {
                continue;
            }
            let unnorm = |coord: f64, size: usize| ((coord + 1.0) * size as f64 - 1.0) / 2.0;
            let (ix, iy, iz) = (unnorm(x, w), unnorm(y, h), unnorm(z, d));
            for ch in 0..c {
                let vol = &input[(b * c + ch) * d * h * w..(b * c + ch + 1) * d * h * w];
                let mut s = 0.0f64;
                for cz in [iz.floor(), iz.floor() + 1.0] {
                    for cy in [iy.floor(), iy.floor() + 1.0] {
                        for cx in [ix.floor(), ix.floor() + 1.0] {
                            let inside = |p: f64, size: usize| p >= 0.0 && p < size as f64;
                            if !(inside(cz, d) && inside(cy, h) && inside(cx, w)) {
                                continue;
                            }
                            let weight = (1.0 - (ix - cx).abs()) * (1.0 - (iy - cy).abs()) * (1.0 - (iz - cz).abs());
                            let value = vol[(cz as usize * h + cy as usize) * w + cx as usize] as f64;
                            s += weight * value;
                        }
                    }
                }
                result[(b * c + ch) * voxels + v] = s;
            }
        }
    }
    result
}

/// The normalised coordinate of voxel `i`'s centre along an axis of `size` voxels
/// (align_corners=False: the edges of the volume are at -1 and 1).
fn centre(i: f32, size: usize) -> f32 {
    (2.0 * i + 1.0) / size as f32 - 1.0
}

/// A grid of `out` = (Do, Ho, Wo) points per batch item from `point(b, z, y, x) -> [x, y, z]`.
fn grid_from(n: usize, out: [usize; 3], point: impl Fn(usize, usize, usize, usize) -> [f32; 3]) -> Vec<f32> {
    let mut g = Vec::with_capacity(n * out.iter().product::<usize>() * 3);
    for b in 0..n {
        for z in 0..out[0] {
            for y in 0..out[1] {
                for x in 0..out[2] {
                    g.extend(point(b, z, y, x));
                }
            }
        }
    }
    g
}

fn sample(b: &Backend, input: &[f32], shape: [usize; 5], grid: &[f32], out: [usize; 3]) -> Vec<f32> {
    b.grid_sample_3d(input, shape, grid, [shape[0], out[0], out[1], out[2], 3]).unwrap()
}

/// Odd sizes, two batch items, grid points spread over [-1.5, 1.5] on every axis, and in chosen
/// places points exactly on voxel centres, on the ±1 edges, well outside (±3, 1e6), NaN and ±inf.
fn matches_f64_reference_on_odd_sizes(b: &Backend) {
    let mut r = rng(31);
    let shape = [2usize, 3, 5, 7, 9];
    let out = [4usize, 6, 5];
    let input = randn(&mut r, shape.iter().product());
    let mut grid = uniform(&mut r, 2 * out.iter().product::<usize>() * 3, -1.5, 1.5);
    let special: [[f32; 3]; 12] = [
        [centre(4.0, 9), centre(3.0, 7), centre(2.0, 5)],
        [centre(0.0, 9), centre(6.0, 7), centre(4.0, 5)],
        [-1.0, -1.0, -1.0],
        [1.0, 1.0, 1.0],
        [-1.0, centre(2.0, 7), 1.0],
        [3.0, 0.0, 0.0],
        [0.1, -3.0, 0.2],
        [0.0, 0.0, 1e6],
        [f32::NAN, 0.0, 0.0],
        [0.0, f32::INFINITY, 0.0],
        [0.0, 0.0, f32::NEG_INFINITY],
        [centre(8.0, 9), centre(6.0, 7), centre(4.0, 5)],
    ];
    // Spread over both batch items (120 points each).
    let special_at = |k: usize| k * 9 + (k % 2) * 120;
    for (k, p) in special.iter().enumerate() {
        grid[special_at(k) * 3..special_at(k) * 3 + 3].copy_from_slice(p);
    }
    let got = sample(b, &input, shape, &grid, out);
    let want = reference(&input, shape, &grid, out);
    assert_eq!(got.len(), want.len());
    let scale = input.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64));
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let e = (g as f64 - w).abs();
        worst = worst.max(e);
        // The f32 coordinate ((x + 1) * W - 1) / 2 is off by a few units in the last place of W
        // (about 1e-6 here); the sample moves by that times the largest difference of two values
        // per axis, and the eight products and sums round at the scale of the values. Measured:
        // 1.9e-6 here, 1.3e-5 on Ditto's 64-voxel axes (below), of values up to 3.2 and 5.7.
        assert!(e <= 1e-5 * scale, "output {i}: {g} against f64 {w} (error {e:e})");
    }
    eprintln!("{}: worst error {worst:e} of values up to {scale}", b.name());
    // NaN and infinite coordinates sample +0 in every channel, as PyTorch (k = 8, 9, 10).
    let voxels: usize = out.iter().product();
    for k in 8..11 {
        let point = special_at(k);
        let (bi, v) = (point / voxels, point % voxels);
        for ch in 0..3 {
            assert_eq!(got[(bi * 3 + ch) * voxels + v].to_bits(), 0.0f32.to_bits(), "special point {k} channel {ch}");
        }
    }
}
test_device!(matches_f64_reference_on_odd_sizes);

/// Grid points at the voxel centres give the input back: exactly where the centres are dyadic
/// (power-of-two sizes), to a rounding of the coordinate elsewhere.
fn identity_grid_reproduces_the_input(b: &Backend) {
    let mut r = rng(32);
    for (shape, exact) in [([1usize, 2, 4, 8, 16], true), ([2, 3, 5, 7, 9], false)] {
        let [n, _, d, h, w] = shape;
        let input = randn(&mut r, shape.iter().product());
        let grid =
            grid_from(n, [d, h, w], |_, z, y, x| [centre(x as f32, w), centre(y as f32, h), centre(z as f32, d)]);
        let got = sample(b, &input, shape, &grid, [d, h, w]);
        if exact {
            assert_eq!(got, input, "{shape:?}");
        } else {
            let worst = got.iter().zip(&input).map(|(a, c)| (a - c).abs()).fold(0.0f32, f32::max);
            assert!(worst < 1e-5, "{shape:?}: off by {worst:e}");
        }
    }
}
test_device!(identity_grid_reproduces_the_input);

/// Moving every point half a voxel (1/W in normalised units) along x averages each voxel with its
/// neighbour; the last one averages with the zero padding. The same along z. Exact: the weights
/// are 1/2 and 1, so each output is one rounding of a + b, halved.
fn half_voxel_shift_averages_neighbours(b: &Backend) {
    let mut r = rng(33);
    let shape = [1usize, 2, 4, 8, 16];
    let [n, c, d, h, w] = shape;
    let input = randn(&mut r, shape.iter().product());
    let at = |ch: usize, z: usize, y: usize, x: usize| input[((ch * d + z) * h + y) * w + x];
    let along_x =
        grid_from(n, [d, h, w], |_, z, y, x| [centre(x as f32 + 0.5, w), centre(y as f32, h), centre(z as f32, d)]);
    let got = sample(b, &input, shape, &along_x, [d, h, w]);
    let along_z =
        grid_from(n, [d, h, w], |_, z, y, x| [centre(x as f32, w), centre(y as f32, h), centre(z as f32 + 0.5, d)]);
    let got_z = sample(b, &input, shape, &along_z, [d, h, w]);
    for ch in 0..c {
        for z in 0..d {
            for y in 0..h {
                for x in 0..w {
                    let i = ((ch * d + z) * h + y) * w + x;
                    let next_x = if x + 1 < w { at(ch, z, y, x + 1) } else { 0.0 };
                    assert_eq!(got[i], (at(ch, z, y, x) + next_x) / 2.0, "x shift at {ch} {z} {y} {x}");
                    let next_z = if z + 1 < d { at(ch, z + 1, y, x) } else { 0.0 };
                    assert_eq!(got_z[i], (at(ch, z, y, x) + next_z) / 2.0, "z shift at {ch} {z} {y} {x}");
                }
            }
        }
    }
}
test_device!(half_voxel_shift_averages_neighbours);

/// The ±1 edges are half a voxel outside the outer centres: there the sample is half the edge
/// voxel (the other half is the zero padding). Points a voxel or more outside, and NaN or
/// infinite coordinates, sample exactly +0.
fn edges_are_half_and_outside_is_zero(b: &Backend) {
    let shape = [1usize, 1, 2, 4, 8];
    let [_, _, d, h, w] = shape;
    let input: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| 1.0 + i as f32).collect();
    let (cy, cz) = (centre(1.0, h), centre(1.0, d));
    let points: Vec<([f32; 3], f32)> = vec![
        ([-1.0, cy, cz], input[(h + 1) * w] / 2.0),
        ([1.0, cy, cz], input[(h + 1) * w + w - 1] / 2.0),
        ([centre(3.0, w), -1.0, cz], input[h * w + 3] / 2.0),
        ([centre(3.0, w), cy, 1.0], input[(h + 1) * w + 3] / 2.0),
        // Both x corners outside, or the only inside corner at weight 0 (u = -1 exactly).
        ([1.0 + 2.0 / w as f32, cy, cz], 0.0),
        ([-1.0 - 1.0 / w as f32, cy, cz], 0.0),
        ([1.5, cy, cz], 0.0),
        ([0.0, -7.0, 0.0], 0.0),
        ([0.0, 0.0, 1e30], 0.0),
        ([f32::NAN, cy, cz], 0.0),
        ([0.0, f32::NAN, 0.0], 0.0),
        ([0.0, 0.0, f32::NAN], 0.0),
        ([f32::INFINITY, 0.0, 0.0], 0.0),
        ([0.0, f32::NEG_INFINITY, 0.0], 0.0),
    ];
    let grid: Vec<f32> = points.iter().flat_map(|(p, _)| *p).collect();
    let got = b.grid_sample_3d(&input, shape, &grid, [1, 1, 1, points.len(), 3]).unwrap();
    for (k, ((p, want), g)) in points.iter().zip(&got).enumerate() {
        assert_eq!(g.to_bits(), want.to_bits(), "point {k} {p:?}: {g}, expected {want}");
    }
}
test_device!(edges_are_half_and_outside_is_zero);

/// Ditto's shape (1x32x16x64x64 sampled at 16x64x64 points) against the reference, on a
/// displaced identity grid.
fn dittos_shape_matches_f64_reference(b: &Backend) {
    let mut r = rng(34);
    let shape = [1usize, 32, 16, 64, 64];
    let out = [16usize, 64, 64];
    let input = randn(&mut r, shape.iter().product());
    let jitter = uniform(&mut r, out.iter().product::<usize>() * 3, -0.1, 0.1);
    let grid = grid_from(1, out, |_, z, y, x| {
        let k = ((z * 64 + y) * 64 + x) * 3;
        [centre(x as f32, 64) + jitter[k], centre(y as f32, 64) + jitter[k + 1], centre(z as f32, 16) + jitter[k + 2]]
    });
    let got = sample(b, &input, shape, &grid, out);
    let want = reference(&input, shape, &grid, out);
    let scale = input.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64));
    let worst = got.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0f64, f64::max);
    eprintln!("{}: worst error {worst:e} of values up to {scale}", b.name());
    assert!(worst <= 1e-5 * scale, "worst error {worst:e} (values up to {scale})");
}
test_device!(dittos_shape_matches_f64_reference);

fn shapes_are_checked(b: &Backend) {
    let input = vec![0.5f32; 2 * 3 * 4 * 5 * 6];
    let grid = vec![0.0f32; 2 * 2 * 2 * 2 * 3];
    let err = |input: &[f32], shape: [usize; 5], grid: &[f32], gshape: [usize; 5]| {
        format!("{:#}", b.grid_sample_3d(input, shape, grid, gshape).unwrap_err())
    };
    assert!(err(&input, [2, 3, 4, 5, 6], &grid, [1, 2, 2, 2, 3]).contains("batch size 1 and the input 2"));
    assert!(err(&input, [2, 3, 4, 5, 6], &grid[..32], [2, 2, 2, 2, 2]).contains("last dimension is 2"));
    assert!(err(&[], [2, 3, 0, 5, 6], &grid, [2, 2, 2, 2, 3]).contains("empty dimension"));
    assert!(err(&input, [2, 3, 4, 5, 6], &[], [2, 0, 2, 2, 3]).contains("empty dimension"));
    assert!(err(&input[1..], [2, 3, 4, 5, 6], &grid, [2, 2, 2, 2, 3]).contains("the input has 719 elements"));
    assert!(err(&input, [2, 3, 4, 5, 6], &grid[1..], [2, 2, 2, 2, 3]).contains("the grid has 47 elements"));
    assert!(err(&input, [2, 3, 4, 5, 1 << 25], &grid, [2, 2, 2, 2, 3]).contains("2^24"));
    assert_eq!(b.grid_sample_3d(&input, [2, 3, 4, 5, 6], &grid, [2, 2, 2, 2, 3]).unwrap().len(), 2 * 3 * 8);
}
test_device!(shapes_are_checked);
