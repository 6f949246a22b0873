//! .npy arrays in and out (npyz), f32 or f16, C order. Outputs are written to a temporary file
//! beside the target and renamed at the end, so a failure leaves nothing at the output path.

use anyhow::{bail, ensure, Context, Result};
use half::f16;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub enum Array {
    F32 { shape: Vec<usize>, data: Vec<f32> },
    F16 { shape: Vec<usize>, data: Vec<f16> },
}

impl Array {
    pub fn shape(&self) -> &[usize] {
        match self {
            Array::F32 { shape, .. } | Array::F16 { shape, .. } => shape,
        }
    }
    pub fn dtype(&self) -> crate::Dtype {
        match self {
            Array::F32 { .. } => crate::Dtype::F32,
            Array::F16 { .. } => crate::Dtype::F16,
        }
    }
    /// Index of the first NaN element, if any.
    pub fn first_nan(&self) -> Option<usize> {
        match self {
            Array::F32 { data, .. } => data.iter().position(|v| v.is_nan()),
            Array::F16 { data, .. } => data.iter().position(|v| v.is_nan()),
        }
    }
}

pub fn read(path: &Path) -> Result<Array> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).with_context(|| format!("{} is not a valid .npy file", path.display()))?;
    ensure!(
        npy.order() == npyz::Order::C,
        "{}: Fortran-order arrays are not supported; save it in C order",
        path.display()
    );
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let descr = match npy.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => bail!("{}: structured dtype {other:?} is not supported (expected float32 or float16)", path.display()),
    };
    let expected: usize = shape.iter().product();
    let arr = match descr.as_str() {
        "<f4" => Array::F32 {
            data: npy.into_vec::<f32>().with_context(|| format!("{}: truncated or corrupt data", path.display()))?,
            shape,
        },
        "<f2" => Array::F16 {
            data: npy.into_vec::<f16>().with_context(|| format!("{}: truncated or corrupt data", path.display()))?,
            shape,
        },
        other => bail!(
            "{}: dtype {other} is not supported (expected little-endian float32 '<f4' or float16 '<f2')",
            path.display()
        ),
    };
    let n = match &arr {
        Array::F32 { data, .. } => data.len(),
        Array::F16 { data, .. } => data.len(),
    };
    ensure!(n == expected, "{}: holds {n} elements, its shape says {expected}", path.display());
    Ok(arr)
}

/// Refuses to replace an existing file unless `force`.
pub fn check_output(path: &Path, force: bool) -> Result<()> {
    if path.exists() && !force {
        bail!("{} already exists; pass --force to overwrite it", path.display());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ensure!(dir.is_dir(), "output directory {} does not exist", dir.display());
    }
    Ok(())
}

/// Writes through `f` into a temporary file next to `path`, then renames it into place.
pub fn write_atomically(path: &Path, f: impl FnOnce(&mut BufWriter<std::fs::File>) -> Result<()>) -> Result<()> {
    let tmp: PathBuf = {
        let mut name = path.file_name().context("output path has no file name")?.to_os_string();
        name.push(format!(".partial-{}", std::process::id()));
        path.with_file_name(name)
    };
    let result = (|| {
        let file = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut w = BufWriter::new(file);
        f(&mut w)?;
        w.flush()?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot move the output into {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

pub fn write<T: npyz::AutoSerialize + Copy>(path: &Path, shape: &[usize], data: &[T]) -> Result<()> {
    use npyz::WriterBuilder;
    ensure!(shape.iter().product::<usize>() == data.len(), "internal error: shape does not match data");
    write_atomically(path, |w| {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let mut npy = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(w).begin_nd()?;
        npy.extend(data.iter().copied())?;
        npy.finish()?;
        Ok(())
    })
}
