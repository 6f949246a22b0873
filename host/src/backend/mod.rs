//! One backend per run: CUDA when asked for or available, else the CPU; or, to check the device
//! code without a GPU, the emulator. Every operation has all paths; callers do not care which
//! runs.

use crate::schedules::keyframes::KeyframeSchedule;
use anyhow::{Context, Result};
use cuda::CudaBackend;
use elem::{ColorMatrix, Elem, Method, RgbLayout, RgbRange};
use grid_sample::GridSample3d;

pub mod composite;
pub mod cpu;
pub mod cuda;
pub mod elem;
pub mod emulated;
pub mod grid_sample;
pub mod hardware;
pub mod launch;
pub mod ptx;
pub mod resident;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum BackendChoice {
    /// CUDA if a driver and GPU are usable, else the CPU (with a one-line notice).
    #[default]
    Auto,
    /// The CPU (rayon, with AVX2 paths picked at run time).
    Cpu,
    /// CUDA device 0; an error if no driver or GPU is usable.
    Cuda,
    /// The CUDA kernels themselves, run on the CPU by cadence's SIMT emulator with every memory
    /// access bounds-checked (slow: for checking, not rendering).
    Emulated,
}

pub enum Backend {
    Cpu,
    Cuda(Box<CudaBackend>),
    /// The kernels in the SIMT emulator, launched as on CUDA ([`emulated`]).
    Emulated,
}

impl Backend {
    pub fn select(choice: BackendChoice) -> Result<Backend> {
        match choice {
            BackendChoice::Cpu => Ok(Backend::Cpu),
            BackendChoice::Emulated => Ok(Backend::Emulated),
            BackendChoice::Cuda => Ok(Backend::Cuda(Box::new(
                CudaBackend::new(0).context("--backend cuda was requested but CUDA is not usable")?,
            ))),
            BackendChoice::Auto => match CudaBackend::new(0) {
                Ok(c) => Ok(Backend::Cuda(Box::new(c))),
                Err(e) => {
                    eprintln!("cadence: {e:#}; using the CPU backend");
                    Ok(Backend::Cpu)
                }
            },
        }
    }

    /// The backend of a render whose engines run on `engines`: with candle's CUDA engines and a
    /// choice other than `cpu`, the CUDA backend is made on candle's stream for that GPU, so the
    /// kernels work on the engines' tensors in place (see [`crate::backend::resident`]); otherwise
    /// [`Self::select`].
    pub fn for_engines(choice: BackendChoice, engines: &cadence_engines::Device) -> Result<Backend> {
        #[cfg(feature = "engines-cuda")]
        if let (cadence_engines::Device::Cuda(d), BackendChoice::Auto | BackendChoice::Cuda) = (engines, choice) {
            let c = CudaBackend::on_stream(d.cuda_stream()).context("CUDA kernels on the engines' GPU")?;
            return Ok(Backend::Cuda(Box::new(c)));
        }
        let _ = engines;
        Self::select(choice)
    }

    /// Every backend that runs the kernels at full speed here: the CPU always, CUDA when a driver
    /// is present (used by benches and experiments that run one body per device). Where a driver
    /// is present but the CUDA backend does not start, that is an error, not a quiet CPU-only
    /// list. The emulated backend is not among them (it checks the kernels; its speed is not
    /// theirs).
    pub fn all_available() -> Result<Vec<Backend>> {
        let mut v = vec![Backend::Cpu];
        if cuda::driver_present() {
            let c = CudaBackend::new(0).context("a CUDA driver is present but the CUDA backend does not start")?;
            v.push(Backend::Cuda(Box::new(c)));
        }
        Ok(v)
    }

    pub fn is_cuda(&self) -> bool {
        matches!(self, Backend::Cuda(_))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda(_) => "cuda",
            Backend::Emulated => "emulated",
        }
    }

    /// Human-readable: kind, device, and for the CPU its model and thread count.
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu => {
                format!("cpu ({}, {} threads)", crate::backend::hardware::cpu_model(), rayon::current_num_threads())
            }
            Backend::Cuda(c) => c.describe(),
            Backend::Emulated => format!(
                "emulated (the CUDA kernels in cadence's SIMT emulator on {} threads of {})",
                std::thread::available_parallelism().map_or(1, |n| n.get()),
                crate::backend::hardware::cpu_model()
            ),
        }
    }

    pub fn expand<T: Elem>(
        &self,
        keys: &[T],
        schedule: &KeyframeSchedule,
        dim: usize,
        method: Method,
    ) -> Result<Vec<T>> {
        anyhow::ensure!(dim > 0, "frames have no elements");
        anyhow::ensure!(
            keys.len() == schedule.count() * dim,
            "{} keyframes given, the schedule has {}",
            keys.len() / dim,
            schedule.count()
        );
        match self {
            Backend::Cpu => {
                let mut out = vec![T::default(); schedule.n_frames() * dim];
                cpu::expand(keys, schedule, dim, method, &mut out);
                Ok(out)
            }
            Backend::Cuda(c) => c.expand(keys, schedule, dim, method),
            Backend::Emulated => emulated::expand(keys, schedule, dim, method),
        }
    }

    pub fn slerp_pairs<T: Elem>(
        &self,
        v0: &[T],
        v1: &[T],
        alphas: &[f32],
        dim: usize,
        method: Method,
    ) -> Result<Vec<T>> {
        anyhow::ensure!(dim > 0 && v0.len() == alphas.len() * dim && v1.len() == v0.len(), "mismatched pair sizes");
        match self {
            Backend::Cpu => {
                let mut out = vec![T::default(); v0.len()];
                cpu::slerp_pairs(v0, v1, alphas, dim, method, &mut out);
                Ok(out)
            }
            Backend::Cuda(c) => c.slerp_pairs(v0, v1, alphas, dim, method),
            Backend::Emulated => emulated::slerp_pairs(v0, v1, alphas, dim, method),
        }
    }

    /// Silence easing in place (see [`cpu::ease`]).
    pub fn ease<T: Elem>(&self, frames: &mut [T], rest: &[T], distance: &[u32], ramp: u32) -> Result<()> {
        anyhow::ensure!(!rest.is_empty() && frames.len() == distance.len() * rest.len(), "mismatched easing sizes");
        match self {
            Backend::Cpu => {
                cpu::ease(frames, rest, distance, ramp);
                Ok(())
            }
            Backend::Cuda(c) => c.ease(frames, rest, distance, ramp),
            Backend::Emulated => emulated::ease(frames, rest, distance, ramp),
        }
    }

    pub fn rgb_to_nv12<T: Elem>(
        &self,
        rgb: &[T],
        layout: RgbLayout,
        matrix: ColorMatrix,
        range: RgbRange,
    ) -> Result<Vec<u8>> {
        layout.validate(rgb.len())?;
        match self {
            Backend::Cpu => {
                let mut out = vec![0u8; layout.frames * layout.nv12_frame_bytes()];
                cpu::rgb_to_nv12(rgb, layout, matrix, range, &mut out);
                Ok(out)
            }
            Backend::Cuda(c) => c.rgb_to_nv12(rgb, layout, matrix, range),
            Backend::Emulated => emulated::rgb_to_nv12(rgb, layout, matrix, range),
        }
    }

    /// Hermite smoothstep weights h(t) = 3t^2 - 2t^3 of `t` clamped to [0, 1] (the `hermite_f32`
    /// kernel; the CPU evaluates the same shared function).
    pub fn hermite(&self, t: &[f32]) -> Result<Vec<f32>> {
        match self {
            Backend::Cpu => Ok(t.iter().map(|&x| cadence_kernels::math::hermite(x)).collect()),
            Backend::Cuda(c) => c.hermite(t),
            Backend::Emulated => emulated::hermite(t),
        }
    }

    /// PyTorch's `F.grid_sample(input, grid, mode='bilinear', padding_mode='zeros',
    /// align_corners=False)` for 5-D input (the `grid_sample_3d_f32` kernel; the CPU runs the same
    /// shared math): `input` of shape `input_shape` (N, C, D, H, W), `grid` of shape `grid_shape`
    /// (N, Do, Ho, Wo, 3) with (x, y, z) last in [-1, 1] over (W, H, D), both contiguous; returns
    /// the (N, C, Do, Ho, Wo) output. Points outside the volume, and NaN or infinite coordinates,
    /// sample the zero padding (`cadence_kernels::grid_sample`). Shapes and buffer lengths are
    /// checked first ([`GridSample3d::new`]).
    pub fn grid_sample_3d(
        &self,
        input: &[f32],
        input_shape: [usize; 5],
        grid: &[f32],
        grid_shape: [usize; 5],
    ) -> Result<Vec<f32>> {
        let s = GridSample3d::new(input_shape, grid_shape)?;
        s.check_buffers(input.len(), grid.len())?;
        match self {
            Backend::Cpu => {
                let mut out = vec![0.0f32; s.output_elements()];
                cpu::grid_sample_3d(input, grid, &s, &mut out);
                Ok(out)
            }
            Backend::Cuda(c) => c.grid_sample_3d(input, grid, &s),
            Backend::Emulated => emulated::grid_sample_3d(input, grid, &s),
        }
    }
}
