//! The shapes of a 3-D grid sample (`grid_sample_3d_f32`, PyTorch's 5-D
//! `F.grid_sample(input, grid, mode='bilinear', padding_mode='zeros', align_corners=False)`, the
//! warp of Ditto's WarpingNetwork; the math is `cadence_kernels::grid_sample`), checked once for
//! every backend: input (N, C, D, H, W) and grid (N, Do, Ho, Wo, 3), both contiguous as PyTorch
//! lays them out, give output (N, C, Do, Ho, Wo).
//!
//! Limits, each an error before any launch (the kernel's index arithmetic relies on them):
//! every axis of the input at most 2^24 (`cadence_kernels::grid_sample::MAX_AXIS`: voxel indices
//! exact in f32), D*H*W at most u32::MAX (a corner's index in one channel is a u32), N*Do*Ho*Wo at
//! most u32::MAX (one thread per output voxel of one batch item, counted in u32 launch arguments),
//! C at most u32::MAX, and every buffer's element count representable. Ditto's sizes are far
//! inside them: input 1x32x16x64x64 (65536 voxels per channel), 65536 output voxels.

use anyhow::{ensure, Context, Result};
use cadence_kernels::grid_sample::MAX_AXIS;

/// The validated sizes of one 3-D grid sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridSample3d {
    pub batch: usize,
    pub channels: usize,
    /// Input depth, height, width (D, H, W).
    pub in_d: usize,
    pub in_h: usize,
    pub in_w: usize,
    /// Output depth, height, width (Do, Ho, Wo): the grid's middle three dimensions.
    pub out_d: usize,
    pub out_h: usize,
    pub out_w: usize,
}

impl GridSample3d {
    /// The sample of an input of shape `input` (N, C, D, H, W) at a grid of shape `grid`
    /// (N, Do, Ho, Wo, 3); an error names what is wrong.
    pub fn new(input: [usize; 5], grid: [usize; 5]) -> Result<GridSample3d> {
        let [batch, channels, in_d, in_h, in_w] = input;
        let [grid_batch, out_d, out_h, out_w, coords] = grid;
        ensure!(coords == 3, "the grid's last dimension is {coords}; a 5-D grid sample needs 3 (x, y, z)");
        ensure!(grid_batch == batch, "the grid has batch size {grid_batch} and the input {batch}: they must be equal");
        ensure!(input.iter().all(|&n| n > 0), "the input shape {input:?} has an empty dimension");
        ensure!(grid.iter().all(|&n| n > 0), "the grid shape {grid:?} has an empty dimension");
        for (axis, n) in [("D", in_d), ("H", in_h), ("W", in_w)] {
            ensure!(n <= MAX_AXIS as usize, "input axis {axis} has {n} voxels, more than the 2^24 the kernel allows");
        }
        let s = GridSample3d { batch, channels, in_d, in_h, in_w, out_d, out_h, out_w };
        let volume = s.in_volume_checked().filter(|&v| v <= u32::MAX as usize);
        ensure!(volume.is_some(), "the input volume {in_d}x{in_h}x{in_w} has more than u32::MAX voxels");
        let threads = s.out_voxels_checked().and_then(|v| v.checked_mul(batch)).filter(|&t| t <= u32::MAX as usize);
        ensure!(
            threads.is_some(),
            "{batch} x {out_d}x{out_h}x{out_w} output voxels are more than one launch takes (u32::MAX); split the batch"
        );
        ensure!(channels <= u32::MAX as usize, "{channels} channels are more than u32::MAX");
        s.input_len().context("the input's element count overflows")?;
        s.output_len().context("the output's element count overflows")?;
        s.grid_len().context("the grid's element count overflows")?;
        Ok(s)
    }

    fn in_volume_checked(&self) -> Option<usize> {
        self.in_d.checked_mul(self.in_h)?.checked_mul(self.in_w)
    }

    fn out_voxels_checked(&self) -> Option<usize> {
        self.out_d.checked_mul(self.out_h)?.checked_mul(self.out_w)
    }

    fn input_len(&self) -> Option<usize> {
        self.batch.checked_mul(self.channels)?.checked_mul(self.in_volume_checked()?)
    }

    fn output_len(&self) -> Option<usize> {
        self.batch.checked_mul(self.channels)?.checked_mul(self.out_voxels_checked()?)
    }

    fn grid_len(&self) -> Option<usize> {
        self.batch.checked_mul(self.out_voxels_checked()?)?.checked_mul(3)
    }

    /// D*H*W: the elements of one channel of the input.
    pub fn in_volume(&self) -> usize {
        self.in_d * self.in_h * self.in_w
    }

    /// Do*Ho*Wo: the elements of one channel of the output, and the grid points of one batch item.
    pub fn out_voxels(&self) -> usize {
        self.out_d * self.out_h * self.out_w
    }

    /// N*C*D*H*W.
    pub fn input_elements(&self) -> usize {
        self.batch * self.channels * self.in_volume()
    }

    /// N*Do*Ho*Wo*3.
    pub fn grid_elements(&self) -> usize {
        self.batch * self.out_voxels() * 3
    }

    /// N*C*Do*Ho*Wo.
    pub fn output_elements(&self) -> usize {
        self.batch * self.channels * self.out_voxels()
    }

    /// (N, C, Do, Ho, Wo).
    pub fn output_shape(&self) -> [usize; 5] {
        [self.batch, self.channels, self.out_d, self.out_h, self.out_w]
    }

    /// The buffers' lengths against the shapes.
    pub fn check_buffers(&self, input: usize, grid: usize) -> Result<()> {
        ensure!(
            input == self.input_elements(),
            "the input has {input} elements, its shape {:?} needs {}",
            [self.batch, self.channels, self.in_d, self.in_h, self.in_w],
            self.input_elements()
        );
        ensure!(
            grid == self.grid_elements(),
            "the grid has {grid} elements, its shape {:?} needs {}",
            [self.batch, self.out_d, self.out_h, self.out_w, 3],
            self.grid_elements()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(input: [usize; 5], grid: [usize; 5]) -> String {
        format!("{:#}", GridSample3d::new(input, grid).unwrap_err())
    }

    #[test]
    fn dittos_shapes_are_accepted() {
        let s = GridSample3d::new([1, 32, 16, 64, 64], [1, 16, 64, 64, 3]).unwrap();
        assert_eq!((s.in_volume(), s.out_voxels(), s.output_shape()), (65536, 65536, [1, 32, 16, 64, 64]));
        assert_eq!((s.input_elements(), s.grid_elements(), s.output_elements()), (2_097_152, 196_608, 2_097_152));
    }

    #[test]
    fn bad_shapes_are_refused_with_the_reason() {
        assert!(err([1, 2, 3, 4, 5], [1, 2, 2, 2, 2]).contains("last dimension is 2"));
        assert!(err([2, 2, 3, 4, 5], [1, 2, 2, 2, 3]).contains("batch size 1 and the input 2"));
        assert!(err([1, 0, 3, 4, 5], [1, 2, 2, 2, 3]).contains("empty dimension"));
        assert!(err([1, 2, 3, 4, 5], [1, 2, 0, 2, 3]).contains("empty dimension"));
        assert!(err([1, 1, 1, 1, (1 << 24) + 1], [1, 1, 1, 1, 3]).contains("more than the 2^24"));
        assert!(err([1, 1, 1 << 12, 1 << 12, 1 << 12], [1, 1, 1, 1, 3]).contains("more than u32::MAX voxels"));
        assert!(err([2, 1, 1, 1, 1], [2, 1 << 16, 1 << 16, 1, 3]).contains("more than one launch takes"));
        assert!(err([1 << 20, 1 << 40, 1, 1, 1], [1 << 20, 1, 1, 1, 3]).contains("channels are more than u32::MAX"));
        let most = u32::MAX as usize;
        assert!(err([2, most, 65535, 65537, 1], [2, 1, 1, 1, 3]).contains("the input's element count overflows"));
        let s = GridSample3d::new([1, 2, 3, 4, 5], [1, 2, 2, 2, 3]).unwrap();
        assert!(format!("{}", s.check_buffers(119, 24).unwrap_err()).contains("input has 119 elements"));
        assert!(format!("{}", s.check_buffers(120, 23).unwrap_err()).contains("grid has 23 elements"));
        assert!(s.check_buffers(120, 24).is_ok());
    }
}
