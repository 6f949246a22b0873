//! .npy arrays in (a checked reader, [`parse`]) and out (npyz), f32 or f16, C order. Outputs go
//! through [`crate::io::output`]: a temporary file beside the target, renamed at the end, so a
//! failure leaves nothing there.

use crate::io::output::{OutputPath, Overwrite};
use anyhow::{bail, ensure, Context, Result};
use half::f16;
use std::path::Path;

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
    pub fn len(&self) -> usize {
        match self {
            Array::F32 { data, .. } => data.len(),
            Array::F16 { data, .. } => data.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Index of the first NaN or infinite element, if any.
    pub fn first_non_finite(&self) -> Option<usize> {
        match self {
            Array::F32 { data, .. } => data.iter().position(|v| !v.is_finite()),
            Array::F16 { data, .. } => data.iter().position(|v| !v.is_finite()),
        }
    }
}

/// Reads a .npy file (see [`parse`]); the file's size bounds everything allocated.
pub fn read(path: &Path) -> Result<Array> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&bytes).with_context(|| format!("{} is not a usable .npy file", path.display()))
}

/// A parsed .npy header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    /// Offset of the data in the file.
    pub data_offset: usize,
}

/// Parses the header of a .npy file (format versions 1 to 3).
///
/// Written here rather than taken from `npyz` (which writes cadence's .npy files) because every
/// size in the header is untrusted: npyz multiplies the shape without overflow checks (a panic
/// under overflow checks, a wrapped element count otherwise) and allocates the announced header
/// length before it knows the file holds it. Here the header length is checked against the bytes
/// present and the element count is computed with checked arithmetic ([`parse`]).
pub fn parse_header(bytes: &[u8]) -> Result<Header> {
    ensure!(bytes.len() >= 10 && bytes.starts_with(b"\x93NUMPY"), "no .npy magic (\\x93NUMPY)");
    let len_size = match bytes[6] {
        1 => 2,
        2 | 3 => 4,
        v => bail!("unsupported .npy format version {v}"),
    };
    ensure!(bytes.len() >= 8 + len_size, "the file ends inside the header");
    let header_len = if len_size == 2 {
        u16::from_le_bytes([bytes[8], bytes[9]]) as usize
    } else {
        u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
    };
    let start = 8 + len_size;
    let end = start.checked_add(header_len).filter(|&e| e <= bytes.len()).ok_or_else(|| {
        anyhow::anyhow!("the header claims {header_len} bytes, the file holds {}", bytes.len() - start)
    })?;
    let text = std::str::from_utf8(&bytes[start..end]).context("the header is not text")?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut rest = text.trim().strip_prefix('{').context("the header is not a dictionary")?;
    loop {
        rest = rest.trim_start().trim_start_matches(',').trim_start();
        if let Some(r) = rest.strip_prefix('}') {
            ensure!(r.trim().is_empty(), "text after the header dictionary");
            break;
        }
        let (key, r) = quoted(rest).context("a header key is not a quoted string")?;
        rest = r.trim_start().strip_prefix(':').context("a header key has no value")?.trim_start();
        match key {
            "descr" => {
                let (v, r) = quoted(rest).context("descr is not a string (structured dtypes are not supported)")?;
                descr = Some(v.to_string());
                rest = r;
            }
            "fortran_order" => {
                let (v, r) = if let Some(r) = rest.strip_prefix("False") {
                    (false, r)
                } else if let Some(r) = rest.strip_prefix("True") {
                    (true, r)
                } else {
                    bail!("fortran_order is neither True nor False")
                };
                fortran = Some(v);
                rest = r;
            }
            "shape" => {
                let r = rest.strip_prefix('(').context("shape is not a tuple")?;
                let close = r.find(')').context("shape tuple is not closed")?;
                let dims = r[..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(|d| d.parse::<u64>().map_err(|_| anyhow::anyhow!("shape entry '{d}' is not a size")))
                    .collect::<Result<Vec<_>>>()?;
                ensure!(dims.len() <= 32, "shape has {} dimensions", dims.len());
                shape = Some(dims);
                rest = &r[close + 1..];
            }
            other => bail!("unknown header key '{other}'"),
        }
    }
    Ok(Header {
        descr: descr.context("the header has no descr")?,
        fortran_order: fortran.context("the header has no fortran_order")?,
        shape: shape.context("the header has no shape")?,
        data_offset: end,
    })
}

/// A single- or double-quoted string at the start of `s`, and what follows it.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let q = s.chars().next().filter(|&c| c == '\'' || c == '"')?;
    let body = &s[1..];
    let close = body.find(q)?;
    Some((&body[..close], &body[close + 1..]))
}

/// Parses a whole .npy file: little-endian float32 or float16, C order.
pub fn parse(bytes: &[u8]) -> Result<Array> {
    let h = parse_header(bytes)?;
    ensure!(!h.fortran_order, "Fortran-order arrays are not supported; save it in C order");
    let elem = match h.descr.as_str() {
        "<f4" => 4,
        "<f2" => 2,
        other => bail!("dtype {other} is not supported (expected little-endian float32 '<f4' or float16 '<f2')"),
    };
    let shape = h
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| anyhow::anyhow!("shape {:?} does not fit this machine", h.shape))?;
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let Some(need) = count.and_then(|c| c.checked_mul(elem)) else {
        bail!("shape {shape:?} has more elements than any file can hold");
    };
    let have = bytes.len() - h.data_offset;
    ensure!(have >= need, "truncated: shape {shape:?} needs {need} bytes of data, the file holds {have}");
    ensure!(have == need, "shape {shape:?} needs {need} bytes of data, the file holds {have} (trailing bytes)");
    let data = &bytes[h.data_offset..];
    Ok(match elem {
        4 => Array::F32 {
            data: data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            shape,
        },
        _ => Array::F16 { data: data.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect(), shape },
    })
}

/// Writes an array to `path`, replacing what is there (for programs that own the path: tests,
/// experiments); the CLI checks its outputs with [`OutputPath::check`] and calls [`write()`].
pub fn save<T: npyz::AutoSerialize + Copy>(path: &Path, shape: &[usize], data: &[T]) -> Result<()> {
    write(&OutputPath::check(path, Overwrite::Replace, &[])?, shape, data)
}

/// Writes an array to a checked output (see [`crate::io::output`]).
pub fn write<T: npyz::AutoSerialize + Copy>(out: &OutputPath, shape: &[usize], data: &[T]) -> Result<()> {
    use npyz::WriterBuilder;
    ensure!(shape.iter().product::<usize>() == data.len(), "internal error: shape does not match data");
    out.write(|w| {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let mut npy = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(w).begin_nd()?;
        npy.extend(data.iter().copied())?;
        npy.finish()?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader (cadence's) reads what the writer (npyz's) writes.
    #[test]
    fn reads_what_npyz_writes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.npy");
        let v: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        save(&p, &[2, 3, 4], &v).unwrap();
        let Array::F32 { shape, data } = read(&p).unwrap() else { panic!("dtype") };
        assert_eq!((shape, data), (vec![2, 3, 4], v));
        let h: Vec<f16> = (0..6).map(|i| f16::from_f32(i as f32)).collect();
        save(&p, &[6], &h).unwrap();
        let Array::F16 { shape, data } = read(&p).unwrap() else { panic!("dtype") };
        assert_eq!((shape, data), (vec![6], h));
    }
}
