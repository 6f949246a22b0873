//! `cadence expand`: keyframe latents (.npy) to every frame in one launch.

use anyhow::{bail, Result};
use cadence::io::memory;
use cadence::io::npy::{self, Array};
use cadence::io::output::{OutputPath, Overwrite};
use cadence::{Backend, BackendChoice, Elem, KeyframeSchedule, Method};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct ExpandArgs {
    /// Keyframes as .npy, shape (M, ...), float32 or float16, in schedule order.
    #[arg(long)]
    pub input: PathBuf,
    /// Output .npy, shape (N, ...), same dtype as the input. Not replaced without --force, never
    /// the input itself.
    #[arg(long)]
    pub output: PathBuf,
    /// Number of output frames N.
    #[arg(long)]
    pub frames: usize,
    /// Fixed stride k: keyframes 0, k, 2k, ... plus N-1 when N-1 is not a multiple of k.
    #[arg(long, conflicts_with = "keyframes", required_unless_present = "keyframes")]
    pub stride: Option<usize>,
    /// Explicit keyframe indices, strictly increasing, e.g. 0,3,6,9.
    #[arg(long)]
    pub keyframes: Option<String>,
    #[arg(long, value_enum, default_value = "slerp")]
    pub method: Method,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// Replace an existing output file.
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: ExpandArgs) -> Result<()> {
    let out = OutputPath::check(&a.output, Overwrite::from_force(a.force), &[&a.input])?;
    // The input first: its size is real, and every size below is checked against it before the
    // flags can make the program allocate anything.
    let input = npy::read(&a.input)?;
    let shape = input.shape().to_vec();
    if shape.is_empty() {
        bail!("{}: a 0-d array holds no keyframes; expected shape (M, ...)", a.input.display());
    }
    let m = shape[0];
    let dim: usize = shape[1..].iter().product();
    if dim == 0 || m == 0 {
        bail!("{}: shape {shape:?} holds no keyframe data", a.input.display());
    }
    let (expected, what) = match (&a.stride, &a.keyframes) {
        (Some(k), _) => (KeyframeSchedule::fixed_stride_count(a.frames, *k)?, format!("stride {k}")),
        (None, Some(list)) => (KeyframeSchedule::parse_list(a.frames, list)?.count(), "the keyframe list".into()),
        (None, None) => bail!("give --stride or --keyframes"),
    };
    if m != expected {
        bail!(
            "{} holds {m} keyframes, but the schedule ({what} over {} frames) has {expected}",
            a.input.display(),
            a.frames
        );
    }
    if let Some(i) = input.first_non_finite() {
        bail!(
            "{}: keyframe {}, element {} is not a finite number (NaN or infinity); interpolating it is undefined",
            a.input.display(),
            i / dim,
            i % dim
        );
    }
    let elem = input.dtype().size();
    memory::ensure_allocatable(memory::product(&[a.frames, dim, elem]), &format!("--frames {}", a.frames))?;
    let schedule = match (&a.stride, &a.keyframes) {
        (Some(k), _) => KeyframeSchedule::fixed_stride(a.frames, *k)?,
        (_, Some(list)) => KeyframeSchedule::parse_list(a.frames, list)?,
        _ => unreachable!("checked above"),
    };
    let backend = Backend::select(a.backend)?;
    let mut out_shape = shape.clone();
    out_shape[0] = a.frames;
    let t0 = Instant::now();
    match &input {
        Array::F32 { data, .. } => write_expanded(&backend, data, &schedule, dim, a.method, &out, &out_shape)?,
        Array::F16 { data, .. } => write_expanded(&backend, data, &schedule, dim, a.method, &out, &out_shape)?,
    }
    eprintln!(
        "cadence: {} keyframes -> {} frames of {:?} {} ({:?}) on {} in {:.1} ms -> {}",
        schedule.count(),
        a.frames,
        &shape[1..],
        input.dtype(),
        a.method,
        backend.describe(),
        t0.elapsed().as_secs_f64() * 1e3,
        a.output.display()
    );
    Ok(())
}

fn write_expanded<T: Elem + npyz::AutoSerialize>(
    backend: &Backend,
    keys: &[T],
    schedule: &KeyframeSchedule,
    dim: usize,
    method: Method,
    out: &OutputPath,
    shape: &[usize],
) -> Result<()> {
    let frames = backend.expand(keys, schedule, dim, method)?;
    npy::write(out, shape, &frames)
}
