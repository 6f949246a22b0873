//! `cadence expand`: keyframe latents (.npy) to every frame in one launch.

use anyhow::{bail, Context, Result};
use cadence::npy::{self, Array};
use cadence::{Backend, BackendChoice, Elem, KeyframeSchedule, Method};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct ExpandArgs {
    /// Keyframes as .npy, shape (M, ...), float32 or float16, in schedule order.
    #[arg(long)]
    pub input: PathBuf,
    /// Output .npy, shape (N, ...), same dtype as the input. Not overwritten without --force.
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
    npy::check_output(&a.output, a.force)?;
    let schedule = match (&a.stride, &a.keyframes) {
        (Some(k), _) => KeyframeSchedule::fixed_stride(a.frames, *k)?,
        (None, Some(list)) => KeyframeSchedule::parse_list(a.frames, list)?,
        (None, None) => bail!("give --stride or --keyframes"),
    };
    let input = npy::read(&a.input)?;
    let shape = input.shape().to_vec();
    if shape.is_empty() {
        bail!("{}: a 0-d array holds no keyframes; expected shape (M, ...)", a.input.display());
    }
    let m = shape[0];
    if m != schedule.count() {
        bail!(
            "{} holds {m} keyframes, but the schedule ({} over {} frames) has {}",
            a.input.display(),
            a.stride.map(|k| format!("stride {k}")).unwrap_or_else(|| "the keyframe list".into()),
            a.frames,
            schedule.count()
        );
    }
    let dim: usize = shape[1..].iter().product();
    if dim == 0 {
        bail!("{}: frames have no elements (shape {shape:?})", a.input.display());
    }
    if let Some(i) = input.first_nan() {
        bail!(
            "{}: NaN at keyframe {}, element {}; interpolation of NaN is undefined",
            a.input.display(),
            i / dim,
            i % dim
        );
    }
    let backend = Backend::select(a.backend)?;
    let mut out_shape = shape.clone();
    out_shape[0] = a.frames;
    let t0 = Instant::now();
    match &input {
        Array::F32 { data, .. } => write_expanded(&backend, data, &schedule, dim, a.method, &a.output, &out_shape)?,
        Array::F16 { data, .. } => write_expanded(&backend, data, &schedule, dim, a.method, &a.output, &out_shape)?,
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
    output: &std::path::Path,
    shape: &[usize],
) -> Result<()> {
    let frames = backend.expand(keys, schedule, dim, method)?;
    npy::write(output, shape, &frames).with_context(|| format!("writing {}", output.display()))
}
