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
    /// The kernel table's name for it (`cadence_kernels::KERNELS`).
    pub fn storage(self) -> cadence_kernels::Storage {
        match self {
            Dtype::F32 => cadence_kernels::Storage::F32,
            Dtype::F16 => cadence_kernels::Storage::F16,
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

/// A storage type of the kernels: on the GPU (`DeviceRepr`) and in the emulator (`Scalar`, and
/// `Entries`: its kernel entry points).
pub trait Elem:
    Copy
    + Send
    + Sync
    + Default
    + PartialEq
    + std::fmt::Debug
    + cudarc::driver::DeviceRepr
    + cadence_kernels::emu::Scalar
    + cadence_kernels::kernels::Entries
    + 'static
{
    const DTYPE: Dtype;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// Converts a run of elements to f32 (vectorized where the type allows).
    fn widen(src: &[Self], dst: &mut [f32]);
    /// Converts f32 values to a run of elements, rounding to nearest even (vectorized where the
    /// type allows).
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// dst = src bit for bit, as a vector loop rather than a call to the C library's `memcpy`.
    /// glibc 2.36 copies frames (KBs) with `rep movsb`, which on AMD Zen runs 4-16x slower (as
    /// measured here) when the destination is misaligned relative to the source: whether that
    /// happens depends on where the allocator placed the two buffers, so frame copies through
    /// `memcpy` made the CPU paths' speed erratic (issue 2). XOR with an opaque zero keeps LLVM
    /// from turning the loop back into a `memcpy` call.
    fn copy_bits(src: &[Self], dst: &mut [Self]);
    /// The slice itself when the storage already is f32.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
    /// The slice itself when the storage already is f32.
    fn as_f32_mut(src: &mut [Self]) -> Option<&mut [f32]>;
    /// The slice itself when the storage is f16.
    fn as_f16(src: &[Self]) -> Option<&[f16]>;
    /// The slice itself when the storage is f16.
    fn as_f16_mut(src: &mut [Self]) -> Option<&mut [f16]>;
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
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    #[inline(always)]
    fn copy_bits(src: &[f32], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        let zero = std::hint::black_box(0u32);
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(s.to_bits() ^ zero);
        }
    }
    #[inline(always)]
    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
    #[inline(always)]
    fn as_f32_mut(src: &mut [f32]) -> Option<&mut [f32]> {
        Some(src)
    }
    #[inline(always)]
    fn as_f16(_: &[f32]) -> Option<&[f16]> {
        None
    }
    #[inline(always)]
    fn as_f16_mut(_: &mut [f32]) -> Option<&mut [f16]> {
        None
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
        #[cfg(target_arch = "x86_64")]
        if f16c::available() {
            // SAFETY: the CPU has AVX and F16C.
            return unsafe { f16c::widen(src, dst) };
        }
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst)
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [f16]) {
        #[cfg(target_arch = "x86_64")]
        if f16c::available() {
            // SAFETY: the CPU has AVX and F16C.
            return unsafe { f16c::narrow(src, dst) };
        }
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src)
    }
    #[inline(always)]
    fn copy_bits(src: &[f16], dst: &mut [f16]) {
        use half::slice::HalfFloatSliceExt;
        assert_eq!(src.len(), dst.len());
        let zero = std::hint::black_box(0u16);
        for (d, s) in dst.reinterpret_cast_mut().iter_mut().zip(src.reinterpret_cast()) {
            *d = s ^ zero;
        }
    }
    #[inline(always)]
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn as_f32_mut(_: &mut [f16]) -> Option<&mut [f32]> {
        None
    }
    #[inline(always)]
    fn as_f16(src: &[f16]) -> Option<&[f16]> {
        Some(src)
    }
    #[inline(always)]
    fn as_f16_mut(src: &mut [f16]) -> Option<&mut [f16]> {
        Some(src)
    }
}

/// Block conversions between f16 and f32 with F16C, eight elements per instruction. `half`'s
/// slice conversions use F16C too, but call a non-inlined function per eight elements (with a
/// copy in and out of arrays around it), which made the f16 CPU paths several times slower
/// than the f32 ones. Rounding is to nearest even, as in `half::f16::from_f32`.
#[cfg(target_arch = "x86_64")]
mod f16c {
    use half::f16;
    use std::arch::x86_64::*;

    #[inline]
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c")
    }

    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        let n8 = src.len() / 8 * 8;
        let (s, d) = (src.as_ptr() as *const u8, dst.as_mut_ptr());
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= len for both slices.
            unsafe {
                let h = _mm_loadu_si128(s.add(2 * i) as *const __m128i);
                _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for (o, x) in dst[n8..].iter_mut().zip(&src[n8..]) {
            *o = x.to_f32();
        }
    }

    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        assert_eq!(src.len(), dst.len());
        let n8 = src.len() / 8 * 8;
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr() as *mut u8);
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= len for both slices.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.add(i)));
                _mm_storeu_si128(d.add(2 * i) as *mut __m128i, h);
            }
            i += 8;
        }
        for (o, &x) in dst[n8..].iter_mut().zip(&src[n8..]) {
            *o = f16::from_f32(x);
        }
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
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
            self.width.is_multiple_of(2) && self.height.is_multiple_of(2),
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
