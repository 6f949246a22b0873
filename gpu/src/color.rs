//! RGB to NV12 (Y plane, then interleaved U,V at half resolution in both directions), shared by
//! the device kernel and the CPU path.
//!
//! - Input: planar float RGB, either in [0, 1] (TAESD) or [-1, 1] (SD VAE); values outside are
//!   clamped; 8-bit scale is v * 255 with no intermediate quantization.
//! - Matrices: BT.709 (default) or BT.601, limited ("video") range: Y in [16, 235], U, V in [16, 240]
//!   (coefficients in docs/design.md, the kernels' mathematics).
//! - Chroma siting: one U,V pair per 2x2 block from the average of its four RGB pixels, i.e.
//!   centred between the four luma samples (JPEG/MPEG-1 siting). Encoders that assume left
//!   siting (H.264's default chroma_loc 0) see a quarter-pixel horizontal shift, invisible
//!   at these sizes.
//! - Rounding: to nearest, halves up, then clamped to [0, 255]. A NaN sample gives 0.

pub const MATRIX_BT709: u32 = 0;
pub const MATRIX_BT601: u32 = 1;
pub const RANGE_UNIT: u32 = 0;
pub const RANGE_SIGNED: u32 = 1;

/// Coefficients of one matrix, for 8-bit RGB: y = 16 + yr R + yg G + yb B, and so on.
pub struct YuvCoeffs {
    pub yr: f32,
    pub yg: f32,
    pub yb: f32,
    pub ur: f32,
    pub ug: f32,
    pub ub: f32,
    pub vr: f32,
    pub vg: f32,
    pub vb: f32,
}

pub const BT709: YuvCoeffs = YuvCoeffs {
    yr: 0.182586,
    yg: 0.614231,
    yb: 0.062007,
    ur: -0.100644,
    ug: -0.338572,
    ub: 0.439216,
    vr: 0.439216,
    vg: -0.398942,
    vb: -0.040274,
};
pub const BT601: YuvCoeffs = YuvCoeffs {
    yr: 0.256788,
    yg: 0.504129,
    yb: 0.097906,
    ur: -0.148223,
    ug: -0.290993,
    ub: 0.439216,
    vr: 0.439216,
    vg: -0.367788,
    vb: -0.071427,
};

#[inline(always)]
pub fn coeffs(matrix: u32) -> YuvCoeffs {
    if matrix == MATRIX_BT601 {
        BT601
    } else {
        BT709
    }
}

/// A float sample to the 8-bit scale [0, 255] (unrounded).
#[inline(always)]
pub fn to_8bit(v: f32, range: u32) -> f32 {
    let unit = if range == RANGE_SIGNED { (v + 1.0) * 0.5 } else { v };
    crate::prim::clamp(unit, 0.0, 1.0) * 255.0
}

#[inline(always)]
pub fn luma(c: &YuvCoeffs, r: f32, g: f32, b: f32) -> f32 {
    16.0 + c.yr * r + c.yg * g + c.yb * b
}

#[inline(always)]
pub fn chroma(c: &YuvCoeffs, r: f32, g: f32, b: f32) -> (f32, f32) {
    (128.0 + c.ur * r + c.ug * g + c.ub * b, 128.0 + c.vr * r + c.vg * g + c.vb * b)
}

/// Round half up and clamp to a byte. NaN gives 0.
///
/// The same bytes as `clamp(x + 0.5, 0, 255) as u8`, written so that the CPU loops vectorise:
/// Rust's saturating float-to-int cast compiles to scalar code there (one lane at a time), while
/// the clamp below already leaves only finite values in [0, 255], for which truncation needs no
/// saturation.
#[inline(always)]
pub fn quantize(x: f32) -> u8 {
    let y = x + 0.5;
    // NaN fails `y > 0` and becomes 0.
    let y = if y > 0.0 {
        if y < 255.0 {
            y
        } else {
            255.0
        }
    } else {
        0.0
    };
    crate::prim::trunc_byte(y)
}

/// One 2x2 block: four pixels (row-major: top-left, top-right, bottom-left, bottom-right) of
/// 8-bit-scale RGB in, four luma bytes and one (U, V) pair out.
pub struct Block2x2 {
    pub y: (u8, u8, u8, u8),
    pub u: u8,
    pub v: u8,
}

#[inline(always)]
pub fn convert_block(
    c: &YuvCoeffs,
    r: (f32, f32, f32, f32),
    g: (f32, f32, f32, f32),
    b: (f32, f32, f32, f32),
) -> Block2x2 {
    let y = (
        quantize(luma(c, r.0, g.0, b.0)),
        quantize(luma(c, r.1, g.1, b.1)),
        quantize(luma(c, r.2, g.2, b.2)),
        quantize(luma(c, r.3, g.3, b.3)),
    );
    let ra = (r.0 + r.1 + r.2 + r.3) * 0.25;
    let ga = (g.0 + g.1 + g.2 + g.3) * 0.25;
    let ba = (b.0 + b.1 + b.2 + b.3) * 0.25;
    let (u, v) = chroma(c, ra, ga, ba);
    Block2x2 { y, u: quantize(u), v: quantize(v) }
}
