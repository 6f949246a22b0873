//! Element storage types: f32 arithmetic everywhere, f32 or f16 in memory.

use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Dtype {
    F32,
    F16,
}

impl Dtype {
    pub fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
        }
    }
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 => 2,
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

pub trait Elem: Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + cudarc::driver::DeviceRepr + 'static {
    const DTYPE: Dtype;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// Converts a run of elements to f32 (vectorized where the type allows).
    fn widen(src: &[Self], dst: &mut [f32]);
    /// The slice itself when the storage already is f32.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
}

impl Elem for f32 {
    const DTYPE: Dtype = Dtype::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> f32 {
        v
    }
    #[inline(always)]
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
}

impl Elem for f16 {
    const DTYPE: Dtype = Dtype::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn widen(src: &[f16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst)
    }
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
}

/// Interpolation method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Method {
    /// Geodesic SLERP with norm re-projection.
    Slerp,
    /// Plain linear interpolation (the ablation baseline).
    Lerp,
}

impl Method {
    pub fn code(self) -> u32 {
        match self {
            Method::Slerp => cadence_kernels::slerp::METHOD_SLERP,
            Method::Lerp => cadence_kernels::slerp::METHOD_LERP,
        }
    }
}

/// NV12 conversion options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum ColorMatrix {
    Bt709,
    Bt601,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum RgbRange {
    /// Samples in [0, 1] (TAESD).
    Unit,
    /// Samples in [-1, 1] (SD VAE).
    Signed,
}

impl ColorMatrix {
    pub fn code(self) -> u32 {
        match self {
            ColorMatrix::Bt709 => cadence_kernels::color::MATRIX_BT709,
            ColorMatrix::Bt601 => cadence_kernels::color::MATRIX_BT601,
        }
    }
}
impl RgbRange {
    pub fn code(self) -> u32 {
        match self {
            RgbRange::Unit => cadence_kernels::color::RANGE_UNIT,
            RgbRange::Signed => cadence_kernels::color::RANGE_SIGNED,
        }
    }
}

/// Planar RGB frames: `frames` x 3 planes x `height` rows of `pitch` elements (pitch >= width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RgbLayout {
    pub width: usize,
    pub height: usize,
    pub pitch: usize,
    pub frames: usize,
}

impl RgbLayout {
    pub fn packed(width: usize, height: usize, frames: usize) -> Self {
        Self { width, height, pitch: width, frames }
    }
    pub fn plane_len(&self) -> usize {
        self.pitch * self.height
    }
    pub fn frame_len(&self) -> usize {
        3 * self.plane_len()
    }
    pub fn len(&self) -> usize {
        self.frames * self.frame_len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of one tightly packed NV12 frame.
    pub fn nv12_frame_bytes(&self) -> usize {
        self.width * self.height * 3 / 2
    }
    pub fn validate(&self, rgb_len: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.width > 0 && self.height > 0, "empty frame size {}x{}", self.width, self.height);
        anyhow::ensure!(
            self.width % 2 == 0 && self.height % 2 == 0,
            "NV12 needs an even width and height (got {}x{}): crop or pad the frame by one pixel",
            self.width,
            self.height
        );
        anyhow::ensure!(self.pitch >= self.width, "row pitch {} is smaller than the width {}", self.pitch, self.width);
        anyhow::ensure!(rgb_len == self.len(), "RGB buffer has {} elements, the layout needs {}", rgb_len, self.len());
        anyhow::ensure!(self.len() <= u32::MAX as usize, "RGB batch too large for one launch; split it");
        Ok(())
    }
}
