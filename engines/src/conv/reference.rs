//! Test support for the 3x3 convolution paths (im2col, Winograd, direct): seeded data and a
//! direct convolution in f64, the reference each path is tested against.

use crate::conv::Nhwc;

/// Seeded values in [-0.5, 0.5).
pub(crate) fn lcg(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// Direct convolution in f64 on NHWC data (upsampling by index), padding 1, stride 1.
pub(crate) fn reference(
    x: &Nhwc,
    w: &[f32],
    bias: &[f32],
    upsample: bool,
    residual: Option<&Nhwc>,
    relu: bool,
) -> Vec<f64> {
    let (oh, ow) = if upsample { (2 * x.h, 2 * x.w) } else { (x.h, x.w) };
    let (cin, cout) = (x.c, bias.len());
    let mut out = vec![0f64; x.n * oh * ow * cout];
    for b in 0..x.n {
        for oy in 0..oh {
            for ox in 0..ow {
                for o in 0..cout {
                    let mut acc = bias[o] as f64;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (oy as isize + ky as isize - 1, ox as isize + kx as isize - 1);
                            if iy < 0 || ix < 0 || iy >= oh as isize || ix >= ow as isize {
                                continue;
                            }
                            let (sy, sx) =
                                if upsample { (iy as usize / 2, ix as usize / 2) } else { (iy as usize, ix as usize) };
                            for i in 0..cin {
                                acc += x.data[((b * x.h + sy) * x.w + sx) * cin + i] as f64
                                    * w[((o * cin + i) * 3 + ky) * 3 + kx] as f64;
                            }
                        }
                    }
                    let q = ((b * oh + oy) * ow + ox) * cout + o;
                    if let Some(r) = residual {
                        acc += r.data[q] as f64;
                    }
                    out[q] = if relu { acc.max(0.0) } else { acc };
                }
            }
        }
    }
    out
}
