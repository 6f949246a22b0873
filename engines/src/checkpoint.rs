//! Weight files as users have them, read without Python: safetensors, and PyTorch checkpoints
//! written by `torch.save` in both of its formats.
//!
//! - **PyTorch zip** (`torch.save` since torch 1.6): a zip archive (entries stored, never
//!   compressed) holding `<name>/data.pkl`, the pickled object, and `<name>/data/<key>`, the raw
//!   little-endian bytes of each storage; `<name>/byteorder` says `little` (absent before 1.10).
//! - **PyTorch legacy** (`torch.save(..., _use_new_zipfile_serialization=False)` and every torch
//!   before 1.6): five pickles back to back (the magic number 0x1950a86a20f9469cfc6c, the
//!   protocol version 1001, a `sys_info` dict, the object, the sorted list of storage keys),
//!   then each storage in that order as an 8-byte little-endian element count followed by its
//!   bytes.
//!
//! In both, a tensor is pickled as `torch._utils._rebuild_tensor_v2(storage, offset, size,
//! stride, requires_grad, hooks)`, where `storage` is a persistent id
//! `('storage', torch.FloatStorage, key, location, numel[, view])`. The pickles are run by
//! candle's pickle machine (`candle_core::pickle`); nothing is executed. Before candle sees a
//! pickle, `guard` walks it once with a shadow stack of sizes: it rejects what candle would
//! mis-read or could be made to panic or exhaust memory on (unknown or unsupported opcodes with
//! their byte offset, truncation, 9+ byte LONG1 integers, objects nested deeper than
//! [`MAX_DEPTH`], memo references that would copy more than [`MAX_CLONED_NODES`] objects).
//!
//! Inspection ([`inspect_bytes`], [`WeightsFile::open`]) reads headers only: the safetensors
//! header, the zip directory and `data.pkl`, the legacy pickles and the 8-byte storage headers.
//! It checks that every tensor lies inside its storage and every storage inside the file, so a
//! later [`WeightsFile::read_f32`] cannot run past the data.

use crate::error::{EngineError, Result};
use candle_core::pickle::{Object, Stack};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The container a weights file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Format {
    Safetensors,
    TorchZip,
    TorchLegacy,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Safetensors => "safetensors",
            Format::TorchZip => "PyTorch zip",
            Format::TorchLegacy => "PyTorch legacy",
        })
    }
}

/// Why bytes are not a weights file cadence can read (no file name: callers add it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FormatError(pub String);

fn bad(msg: impl Into<String>) -> FormatError {
    FormatError(msg.into())
}

type FResult<T> = std::result::Result<T, FormatError>;

/// A non-tensor value stored beside the tensors (e.g. whisper's `dims.n_audio_state`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

/// Where a tensor's values are in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    /// Bits per element.
    bits: usize,
    /// Strides in elements (PyTorch's), one per dimension.
    strides: Vec<usize>,
    /// Offset of element 0 from the start of the storage, in elements.
    offset: usize,
    /// The storage's bytes in the file.
    storage_start: u64,
    storage_len: u64,
}

/// One tensor of a checkpoint: its name as stored, element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    /// safetensors' names: `F32`, `F16`, `BF16`, `F64`, `I64`, `U8`, `BOOL`, ...
    pub dtype: String,
    pub shape: Vec<usize>,
    layout: Layout,
}

impl TensorEntry {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The candle type of a floating-point entry (`None` for integers, booleans, ...).
    pub fn float_dtype(&self) -> Option<DType> {
        match self.dtype.as_str() {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::BF16),
            "F64" => Some(DType::F64),
            _ => None,
        }
    }
}

/// What a weights file holds, read from its headers.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub format: Format,
    /// Safetensors: in file order; PyTorch: by name.
    pub tensors: Vec<TensorEntry>,
    /// Scalars beside the tensors by dotted path (`dims.n_mels`; safetensors: `__metadata__`
    /// strings).
    pub scalars: Vec<(String, Scalar)>,
}

impl Checkpoint {
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }
    pub fn scalar(&self, path: &str) -> Option<&Scalar> {
        self.scalars.iter().find(|(p, _)| p == path).map(|(_, v)| v)
    }
    /// Scalar values of all tensors together.
    pub fn num_values(&self) -> usize {
        self.tensors.iter().map(TensorEntry::numel).sum()
    }
}

/// Inspects a weights file given as bytes (safetensors, PyTorch zip or legacy): the same code
/// [`WeightsFile::open`] runs on a file. Never panics on malformed input; every error says what
/// is wrong. This is the entry point for fuzzing the header and pickle parsers.
pub fn inspect_bytes(bytes: &[u8]) -> FResult<Checkpoint> {
    inspect(&mut std::io::Cursor::new(bytes), bytes.len() as u64)
}

/// Reads one entry of [`inspect_bytes`]'s result from the same bytes, as F32 on the CPU (what
/// [`WeightsFile::read_f32`] does on a file; with [`inspect_bytes`], the fuzzing entry point).
pub fn read_bytes_f32(bytes: &[u8], entry: &TensorEntry) -> FResult<Tensor> {
    read_f32(&mut std::io::Cursor::new(bytes), entry)
}

/// A weights file opened for reading: its [`Checkpoint`] (headers) and the open file.
pub struct WeightsFile {
    pub path: PathBuf,
    pub checkpoint: Checkpoint,
    file: std::io::BufReader<std::fs::File>,
}

impl WeightsFile {
    /// Opens `path` and reads its headers (no tensor data).
    pub fn open(path: &Path) -> Result<WeightsFile> {
        let io = |error| EngineError::Io { path: path.to_path_buf(), error };
        let f = std::fs::File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let mut file = std::io::BufReader::new(f);
        let checkpoint =
            inspect(&mut file, len).map_err(|e| EngineError::BadFile { file: path.to_path_buf(), msg: e.0 })?;
        Ok(WeightsFile { path: path.to_path_buf(), checkpoint, file })
    }

    /// The values of `entry` (one of `self.checkpoint.tensors`) as an F32 tensor on the CPU.
    pub fn read_f32(&mut self, entry: &TensorEntry) -> Result<Tensor> {
        read_f32(&mut self.file, entry)
            .map_err(|e| EngineError::BadFile { file: self.path.clone(), msg: format!("tensor `{}`: {e}", entry.name) })
    }
}

/// Reads the values of one entry, converting F16/BF16/F64 to F32; strided tensors are gathered.
fn read_f32<R: Read + Seek>(r: &mut R, e: &TensorEntry) -> FResult<Tensor> {
    let dtype = e.float_dtype().ok_or_else(|| bad(format!("dtype {} is not a float type", e.dtype)))?;
    let esize = e.layout.bits / 8;
    let numel = e.numel();
    let row_major = is_row_major(&e.shape, &e.layout.strides);
    let elems =
        if row_major { numel } else { span(&e.shape, &e.layout.strides).ok_or_else(|| bad("size overflow"))? };
    if (e.layout.offset + elems) * esize > e.layout.storage_len as usize {
        return Err(bad("runs past its storage"));
    }
    let io = |err: std::io::Error| bad(format!("reading its data: {err}"));
    let start = e.layout.storage_start + (e.layout.offset * esize) as u64;
    r.seek(SeekFrom::Start(start)).map_err(io)?;
    let mut raw = vec![0u8; elems * esize];
    r.read_exact(&mut raw).map_err(io)?;
    let bytes = if row_major { raw } else { gather(&raw, &e.shape, &e.layout.strides, esize) };
    let t = Tensor::from_raw_buffer(&bytes, dtype, &e.shape, &Device::Cpu).map_err(|err| bad(err.to_string()))?;
    t.to_dtype(DType::F32).map_err(|err| bad(err.to_string()))
}

/// Elements from a tensor's first to its last element, inclusive (0 when it is empty).
fn span(shape: &[usize], strides: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().zip(strides).try_fold(0usize, |acc, (&n, &s)| acc.checked_add((n - 1).checked_mul(s)?))?.checked_add(1)
}

/// Whether a layout is row-major contiguous (size-1 dimensions may carry any stride, as torch
/// leaves them), i.e. whether its elements can be read as they lie.
fn is_row_major(shape: &[usize], strides: &[usize]) -> bool {
    let mut expect = 1usize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(n);
    }
    true
}

/// Copies a strided tensor out of `src` (which starts at its element 0) in row-major order.
fn gather(src: &[u8], shape: &[usize], strides: &[usize], esize: usize) -> Vec<u8> {
    let numel: usize = shape.iter().product();
    let mut out = Vec::with_capacity(numel * esize);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..numel {
        let off: usize = idx.iter().zip(strides).map(|(i, s)| i * s).sum();
        out.extend_from_slice(&src[off * esize..(off + 1) * esize]);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// The legacy format's first pickle: protocol 2, LONG1 of 10 bytes holding torch's magic number
/// 0x1950a86a20f9469cfc6c (little-endian), STOP.
const LEGACY_MAGIC: [u8; 15] =
    [0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e];
/// torch's legacy `PROTOCOL_VERSION`.
const LEGACY_PROTOCOL: i64 = 1001;
/// Largest pickle cadence reads (the 686-tensor MuseTalk UNet state dict pickles to 113,223
/// bytes as `torch_write` writes it, test `state_dicts_are_far_inside_the_guard_limits`).
const MAX_PICKLE_BYTES: usize = 64 << 20;
/// safetensors' own header limit.
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

fn inspect<R: Read + Seek>(r: &mut R, len: u64) -> FResult<Checkpoint> {
    let mut head = [0u8; 512];
    let n = read_up_to(r, &mut head).map_err(|e| bad(format!("cannot read: {e}")))?;
    let head = &head[..n];
    if head.starts_with(b"PK\x03\x04") {
        return torch_zip(r, len);
    }
    if head.len() >= LEGACY_MAGIC.len() && head[0] == 0x80 && head[2..LEGACY_MAGIC.len()] == LEGACY_MAGIC[2..] {
        return torch_legacy(r, len);
    }
    if head.len() > 8 && head[8] == b'{' {
        return safetensors(r, len);
    }
    if head.len() >= 262 && &head[257..262] == b"ustar" {
        return Err(bad("a tar checkpoint (torch.save before torch 0.4): not supported"));
    }
    let shown: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Err(bad(format!(
        "not a weights file cadence reads (safetensors, PyTorch zip or legacy PyTorch checkpoint); first bytes: {}",
        if shown.is_empty() { "none (empty file)".into() } else { shown.join(" ") }
    )))
}

fn read_up_to<R: Read + Seek>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    r.seek(SeekFrom::Start(0))?;
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

// ---------------------------------------------------------------------------------------------
// safetensors

fn safetensors<R: Read + Seek>(r: &mut R, len: u64) -> FResult<Checkpoint> {
    let io = |e: std::io::Error| bad(format!("safetensors header: {e}"));
    r.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut n8 = [0u8; 8];
    r.read_exact(&mut n8).map_err(io)?;
    let n = u64::from_le_bytes(n8);
    if n > MAX_SAFETENSORS_HEADER {
        return Err(bad(format!("safetensors header of {n} bytes (more than safetensors' limit)")));
    }
    if 8 + n > len {
        return Err(bad(format!("safetensors header of {n} bytes but the file has {len} (truncated?)")));
    }
    let mut header = vec![0u8; n as usize];
    r.read_exact(&mut header).map_err(io)?;
    let text = std::str::from_utf8(&header).map_err(|e| bad(format!("safetensors header is not UTF-8: {e}")))?;
    // safetensors' own parser and validation (offsets contiguous, sizes matching shapes).
    let meta: safetensors::tensor::Metadata =
        serde_json::from_str(text).map_err(|e| bad(format!("invalid safetensors header: {e}")))?;
    let data_start = 8 + n;
    let data_len = meta.data_len() as u64;
    if data_start + data_len != len {
        return Err(bad(format!(
            "the safetensors header describes {data_len} bytes of tensor data, the file holds {} (truncated or padded)",
            len - data_start
        )));
    }
    let infos = meta.tensors();
    let mut tensors = Vec::with_capacity(infos.len());
    for name in meta.offset_keys() {
        let info = infos[&name];
        let (s, e) = info.data_offsets;
        tensors.push(TensorEntry {
            name,
            dtype: format!("{:?}", info.dtype),
            shape: info.shape.clone(),
            layout: Layout {
                bits: info.dtype.bitsize(),
                strides: row_major(&info.shape),
                offset: 0,
                storage_start: data_start + s as u64,
                storage_len: (e - s) as u64,
            },
        });
    }
    let mut scalars: Vec<(String, Scalar)> =
        meta.metadata().iter().flatten().map(|(k, v)| (format!("__metadata__.{k}"), Scalar::Str(v.clone()))).collect();
    scalars.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Checkpoint { format: Format::Safetensors, tensors, scalars })
}

fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

// ---------------------------------------------------------------------------------------------
// PyTorch zip

fn torch_zip<R: Read + Seek>(r: &mut R, len: u64) -> FResult<Checkpoint> {
    r.seek(SeekFrom::Start(0)).map_err(|e| bad(e.to_string()))?;
    let mut zip = zip::ZipArchive::new(&mut *r).map_err(|e| bad(format!("not a readable zip archive: {e}")))?;
    let names: Vec<String> = zip
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| bad(format!("zip directory: {e}")))?;
    let pkls: Vec<&String> = names
        .iter()
        .filter(|n| n.as_str() == "data.pkl" || (n.ends_with("/data.pkl") && n.matches('/').count() == 1))
        .collect();
    let pkl_name = match pkls.as_slice() {
        [one] => (*one).clone(),
        [] => return Err(bad("a zip archive without `data.pkl`: not a PyTorch checkpoint")),
        _ => return Err(bad(format!("a zip archive with {} `data.pkl` entries", pkls.len()))),
    };
    let prefix = pkl_name.strip_suffix("data.pkl").unwrap_or("").to_string();
    let read_entry = |zip: &mut zip::ZipArchive<&mut R>, name: &str, limit: usize| -> FResult<Vec<u8>> {
        let mut f = zip.by_name(name).map_err(|e| bad(format!("zip entry `{name}`: {e}")))?;
        if f.size() > limit as u64 {
            return Err(bad(format!("zip entry `{name}` is {} bytes (more than {limit})", f.size())));
        }
        // The declared size is not trusted for the allocation: a stored entry cannot be larger
        // than the file.
        let mut v = Vec::with_capacity(f.size().min(len) as usize);
        (&mut f).take(limit as u64).read_to_end(&mut v).map_err(|e| bad(format!("zip entry `{name}`: {e}")))?;
        Ok(v)
    };
    let byteorder = format!("{prefix}byteorder");
    if names.contains(&byteorder) {
        let b = read_entry(&mut zip, &byteorder, 16)?;
        if b != b"little" {
            return Err(bad(format!(
                "byte order `{}`: only little-endian checkpoints are read",
                String::from_utf8_lossy(&b)
            )));
        }
    }
    let pkl = read_entry(&mut zip, &pkl_name, MAX_PICKLE_BYTES)?;
    let (obj, _) = unpickle(&pkl, 0).map_err(|e| e.in_entry(&pkl_name))?;
    let found = Found::collect(&obj)?;
    // Each storage is the raw, uncompressed entry `<prefix>data/<key>`.
    let mut spans = HashMap::new();
    for key in found.used_storages() {
        let name = format!("{prefix}data/{key}");
        let idx =
            zip.index_for_name(&name).ok_or_else(|| bad(format!("storage `{key}`: entry `{name}` is missing")))?;
        let f = zip.by_index_raw(idx).map_err(|e| bad(format!("zip entry `{name}`: {e}")))?;
        if f.compression() != zip::CompressionMethod::Stored {
            return Err(bad(format!(
                "zip entry `{name}` is compressed ({:?}); torch.save stores entries",
                f.compression()
            )));
        }
        let start = f.data_start().ok_or_else(|| bad(format!("zip entry `{name}`: no data offset")))?;
        let size = f.compressed_size();
        if start.checked_add(size).is_none_or(|end| end > len) {
            return Err(bad(format!("zip entry `{name}` runs past the end of the file (truncated?)")));
        }
        spans.insert(key.to_string(), (start, size));
    }
    found.finish(Format::TorchZip, &spans)
}

// ---------------------------------------------------------------------------------------------
// PyTorch legacy

fn torch_legacy<R: Read + Seek>(r: &mut R, len: u64) -> FResult<Checkpoint> {
    let mut buf = Buffer::new(r, len)?;
    let mut pos = LEGACY_MAGIC.len();
    let (version, end) = buf.unpickle(pos)?;
    pos = end;
    match version {
        Object::Int(v) if v as i64 == LEGACY_PROTOCOL => {}
        Object::Long(v) if v == LEGACY_PROTOCOL => {}
        other => return Err(bad(format!("legacy checkpoint protocol version {other:?} (expected {LEGACY_PROTOCOL})"))),
    }
    let (sys_info, end) = buf.unpickle(pos)?;
    pos = end;
    if let Object::Dict(items) = &sys_info {
        for (k, v) in items {
            if k == &Object::Unicode("little_endian".into()) && v != &Object::Bool(true) {
                return Err(bad("a big-endian legacy checkpoint: only little-endian checkpoints are read"));
            }
        }
    }
    let (obj, end) = buf.unpickle(pos)?;
    pos = end;
    let found = Found::collect(&obj)?;
    let (keys, end) = buf.unpickle(pos)?;
    let keys: Vec<String> = match keys {
        Object::List(k) => k
            .into_iter()
            .map(|k| k.unicode().map_err(|o| bad(format!("storage key list holds {o:?}"))))
            .collect::<FResult<_>>()?,
        other => return Err(bad(format!("expected the list of storage keys, found {}", kind_of(&other)))),
    };
    // Storages follow the last pickle, in the order of the key list.
    let mut at = end as u64;
    let mut spans = HashMap::new();
    for key in keys {
        let st =
            found.storages.get(&key).ok_or_else(|| bad(format!("storage `{key}` is listed but never referenced")))?;
        let mut n8 = [0u8; 8];
        buf.read_at(at, &mut n8)
            .map_err(|_| bad(format!("storage `{key}`: the file ends before its header (truncated?)")))?;
        let numel = u64::from_le_bytes(n8);
        if numel != st.numel as u64 {
            return Err(bad(format!("storage `{key}`: the file says {numel} elements, the pickle {}", st.numel)));
        }
        let bytes =
            numel.checked_mul(st.bits as u64 / 8).ok_or_else(|| bad(format!("storage `{key}`: size overflow")))?;
        let start = at + 8;
        let available = len.saturating_sub(start).min(bytes);
        spans.insert(key.clone(), (start, available));
        at = start.saturating_add(bytes);
    }
    found.finish(Format::TorchLegacy, &spans)
}

/// The start of a legacy file, read as far as its pickles need (they sit before the storages,
/// whose end is only known once the pickles are parsed).
struct Buffer<'a, R> {
    r: &'a mut R,
    len: u64,
    data: Vec<u8>,
}

impl<'a, R: Read + Seek> Buffer<'a, R> {
    fn new(r: &'a mut R, len: u64) -> FResult<Self> {
        let mut b = Buffer { r, len, data: Vec::new() };
        b.fill(1 << 20)?;
        Ok(b)
    }
    fn fill(&mut self, want: usize) -> FResult<()> {
        let want = (want as u64).min(self.len) as usize;
        let have = self.data.len();
        if want <= have {
            return Ok(());
        }
        self.data.resize(want, 0);
        self.r.seek(SeekFrom::Start(have as u64)).map_err(|e| bad(e.to_string()))?;
        self.r.read_exact(&mut self.data[have..]).map_err(|e| bad(format!("cannot read: {e}")))
    }
    /// One pickle starting at `pos`, growing the buffer while the pickle runs past it.
    fn unpickle(&mut self, pos: usize) -> FResult<(Object, usize)> {
        loop {
            match unpickle(&self.data, pos) {
                Err(PickleError::Truncated)
                    if (self.data.len() as u64) < self.len && self.data.len() < MAX_PICKLE_BYTES =>
                {
                    self.fill((self.data.len() * 4).min(MAX_PICKLE_BYTES))?
                }
                Err(e) => return Err(e.at_file()),
                Ok(v) => return Ok(v),
            }
        }
    }
    fn read_at(&mut self, at: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.r.seek(SeekFrom::Start(at))?;
        self.r.read_exact(out)
    }
}

// ---------------------------------------------------------------------------------------------
// From the unpickled object to tensors

/// A storage named by a persistent id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StorageRef {
    dtype: &'static str,
    bits: usize,
    numel: usize,
}

/// A tensor found in the pickle, before its storage is located.
#[derive(Debug)]
struct RawTensor {
    name: String,
    storage: String,
    offset: usize,
    shape: Vec<usize>,
    strides: Vec<usize>,
}

/// torch storage classes: (class, safetensors dtype name, bits per element).
const TORCH_STORAGES: &[(&str, &str, usize)] = &[
    ("FloatStorage", "F32", 32),
    ("HalfStorage", "F16", 16),
    ("BFloat16Storage", "BF16", 16),
    ("DoubleStorage", "F64", 64),
    ("LongStorage", "I64", 64),
    ("IntStorage", "I32", 32),
    ("ShortStorage", "I16", 16),
    ("CharStorage", "I8", 8),
    ("ByteStorage", "U8", 8),
    ("BoolStorage", "BOOL", 8),
    ("ComplexFloatStorage", "C64", 64),
    ("ComplexDoubleStorage", "C128", 128),
    ("Float8_e4m3fnStorage", "F8_E4M3", 8),
    ("Float8_e5m2Storage", "F8_E5M2", 8),
    ("UntypedStorage", "U8", 8),
];

/// Everything a pickle holds that cadence uses.
#[derive(Default)]
struct Found {
    storages: HashMap<String, StorageRef>,
    tensors: Vec<RawTensor>,
    scalars: Vec<(String, Scalar)>,
}

fn kind_of(o: &Object) -> &'static str {
    match o {
        Object::Class { .. } => "a class",
        Object::Int(_) | Object::Long(_) => "an integer",
        Object::Float(_) => "a float",
        Object::Unicode(_) => "a string",
        Object::Bool(_) => "a bool",
        Object::None => "None",
        Object::Tuple(_) => "a tuple",
        Object::List(_) => "a list",
        Object::Mark => "a mark",
        Object::Dict(_) => "a dict",
        Object::Reduce { .. } => "an object",
        Object::Build { .. } => "an object with state",
        Object::PersistentLoad(_) => "a persistent reference",
    }
}

fn as_usize(o: &Object) -> Option<usize> {
    match o {
        Object::Int(i) => usize::try_from(*i).ok(),
        Object::Long(i) => usize::try_from(*i).ok(),
        _ => None,
    }
}

fn as_dims(o: &Object) -> Option<Vec<usize>> {
    match o {
        Object::Tuple(v) | Object::List(v) => v.iter().map(as_usize).collect(),
        _ => None,
    }
}

fn class_of(o: &Object) -> Option<(&str, &str)> {
    match o {
        Object::Class { module_name, class_name } => Some((module_name, class_name)),
        _ => None,
    }
}

/// `('storage', torch.<X>Storage, key, location, numel[, view_metadata])`.
fn storage_id(pid: &Object) -> FResult<(String, StorageRef)> {
    let items = match pid {
        Object::Tuple(v) if v.len() >= 5 => v,
        other => return Err(bad(format!("persistent id {other:?} is not a storage"))),
    };
    if items[0] != Object::Unicode("storage".into()) {
        return Err(bad(format!("persistent id of kind {:?}: only storages are read", items[0])));
    }
    let class = class_of(&items[1]).map(|(_, c)| c).ok_or_else(|| bad(format!("storage type {:?}", items[1])))?;
    let &(_, dtype, bits) = TORCH_STORAGES
        .iter()
        .find(|(c, _, _)| *c == class)
        .ok_or_else(|| bad(format!("storage type `{class}` is not one cadence reads")))?;
    let key = match &items[2] {
        Object::Unicode(k) => k.clone(),
        other => return Err(bad(format!("storage key {other:?}"))),
    };
    let numel = as_usize(&items[4]).ok_or_else(|| bad(format!("storage `{key}`: element count {:?}", items[4])))?;
    if items.get(5).is_some_and(|v| v != &Object::None) {
        return Err(bad(format!("storage `{key}` is a view of another storage (pre-0.4 checkpoints): not supported")));
    }
    Ok((key, StorageRef { dtype, bits, numel }))
}

impl Found {
    fn collect(top: &Object) -> FResult<Found> {
        let mut f = Found::default();
        f.find_storages(top)?;
        match top {
            Object::Dict(_) => f.walk(top, "", 0)?,
            other => {
                return Err(bad(format!(
                    "the checkpoint holds {} at the top, not a dict of tensors (a TorchScript module or a whole pickled model?)",
                    kind_of(other)
                )))
            }
        }
        let mut seen = std::collections::HashSet::new();
        for t in &f.tensors {
            if !seen.insert(t.name.as_str()) {
                return Err(bad(format!("tensor `{}` appears twice", t.name)));
            }
        }
        Ok(f)
    }

    /// Every storage the pickle references, wherever it is (a legacy file stores each one the
    /// pickle names, and its element size is only known from the reference).
    fn find_storages(&mut self, o: &Object) -> FResult<()> {
        match o {
            Object::PersistentLoad(pid) => {
                let (key, st) = storage_id(pid)?;
                if let Some(prev) = self.storages.get(&key) {
                    if prev.dtype != st.dtype {
                        return Err(bad(format!(
                            "storage `{key}` is referenced as {} and as {}",
                            prev.dtype, st.dtype
                        )));
                    }
                    if prev.numel != st.numel {
                        return Err(bad(format!(
                            "storage `{key}` is referenced with {} and {} elements",
                            prev.numel, st.numel
                        )));
                    }
                }
                self.storages.insert(key, st);
            }
            Object::Tuple(v) | Object::List(v) => v.iter().try_for_each(|x| self.find_storages(x))?,
            Object::Dict(kv) => kv.iter().try_for_each(|(k, v)| {
                self.find_storages(k)?;
                self.find_storages(v)
            })?,
            Object::Reduce { callable, args } | Object::Build { callable, args } => {
                self.find_storages(callable)?;
                self.find_storages(args)?
            }
            _ => {}
        }
        Ok(())
    }

    fn walk(&mut self, dict: &Object, prefix: &str, depth: usize) -> FResult<()> {
        let Object::Dict(items) = dict else { return Ok(()) };
        for (k, v) in items {
            let key = match k {
                Object::Unicode(s) => s.clone(),
                Object::Int(i) => i.to_string(),
                Object::Long(i) => i.to_string(),
                _ => continue,
            };
            // torch's per-module `_metadata` (version numbers), not weights.
            if key == "_metadata" {
                continue;
            }
            let name = format!("{prefix}{key}");
            if let Some(t) = tensor_of(v, &name)? {
                self.tensors.push(t);
                continue;
            }
            match v {
                Object::Dict(_) if depth < 4 => {
                    // `{"state_dict": ...}` (Lightning), `{"dims": ..., "model_state_dict": ...}` (whisper).
                    let inner = if prefix.is_empty() && (key == "state_dict" || key == "model_state_dict") {
                        String::new()
                    } else {
                        format!("{name}.")
                    };
                    self.walk(v, &inner, depth + 1)?
                }
                Object::Int(i) => self.scalars.push((name, Scalar::Int(*i as i64))),
                Object::Long(i) => self.scalars.push((name, Scalar::Int(*i))),
                Object::Float(x) => self.scalars.push((name, Scalar::Float(*x))),
                Object::Bool(b) => self.scalars.push((name, Scalar::Bool(*b))),
                Object::Unicode(s) => self.scalars.push((name, Scalar::Str(s.clone()))),
                _ => {}
            }
        }
        Ok(())
    }

    fn used_storages(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.tensors.iter().map(|t| t.storage.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Places every tensor in its storage's bytes (`spans`: key -> (start, bytes available in
    /// the file)), checking that each storage is whole and each tensor inside its storage.
    fn finish(self, format: Format, spans: &HashMap<String, (u64, u64)>) -> FResult<Checkpoint> {
        let mut keys: Vec<&String> = spans.keys().collect();
        keys.sort();
        for key in keys {
            let st = &self.storages[key];
            let need = (st.numel as u64).saturating_mul(st.bits as u64 / 8);
            if spans[key].1 < need {
                return Err(bad(format!(
                    "storage `{key}` holds {} bytes in the file; its {} {} elements need {need} (truncated?)",
                    spans[key].1, st.numel, st.dtype
                )));
            }
        }
        let mut tensors = Vec::with_capacity(self.tensors.len());
        for t in self.tensors {
            let st = &self.storages[&t.storage];
            let &(start, available) = spans
                .get(&t.storage)
                .ok_or_else(|| bad(format!("tensor `{}`: storage `{}` is not in the file", t.name, t.storage)))?;
            let need_elems = match span(&t.shape, &t.strides) {
                Some(0) => 0,
                s => s
                    .and_then(|s| s.checked_add(t.offset))
                    .ok_or_else(|| bad(format!("tensor `{}`: size overflow", t.name)))?,
            };
            if need_elems > st.numel {
                return Err(bad(format!(
                    "tensor `{}` {:?} (offset {}, strides {:?}) needs {need_elems} elements of storage `{}`, which has {}",
                    t.name, t.shape, t.offset, t.strides, t.storage, st.numel
                )));
            }
            tensors.push(TensorEntry {
                name: t.name,
                dtype: st.dtype.to_string(),
                shape: t.shape,
                layout: Layout {
                    bits: st.bits,
                    strides: t.strides,
                    offset: t.offset,
                    storage_start: start,
                    storage_len: available,
                },
            });
        }
        // candle's pickle machine reverses each SETITEMS batch, so pickle order is lost: list by name.
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Checkpoint { format, tensors, scalars: self.scalars })
    }
}

/// The tensor an object rebuilds, `None` if it is not a tensor.
fn tensor_of(o: &Object, name: &str) -> FResult<Option<RawTensor>> {
    let Object::Reduce { callable, args } = o else { return Ok(None) };
    let Some((module, func)) = class_of(callable) else { return Ok(None) };
    let args = match args.as_ref() {
        Object::Tuple(a) => a,
        _ => return Ok(None),
    };
    let err = |what: &str| bad(format!("tensor `{name}`: {what}"));
    match (module, func) {
        ("torch._utils", "_rebuild_tensor_v2") | ("torch._utils", "_rebuild_tensor") => {
            if args.len() < 4 {
                return Err(err(&format!("{func} with {} arguments", args.len())));
            }
            let pid = match &args[0] {
                Object::PersistentLoad(p) => p,
                other => return Err(err(&format!("storage argument is {}", kind_of(other)))),
            };
            let (storage, _) = storage_id(pid).map_err(|e| err(&e.0))?;
            let offset = as_usize(&args[1]).ok_or_else(|| err("storage offset is not a non-negative integer"))?;
            let shape = as_dims(&args[2]).ok_or_else(|| err("size is not a tuple of non-negative integers"))?;
            let strides = as_dims(&args[3]).ok_or_else(|| err("stride is not a tuple of non-negative integers"))?;
            if shape.len() != strides.len() {
                return Err(err(&format!("size {shape:?} and stride {strides:?} differ in rank")));
            }
            Ok(Some(RawTensor { name: name.to_string(), storage, offset, shape, strides }))
        }
        // nn.Parameter(data, requires_grad, hooks[, state]): the data is the first argument.
        ("torch._utils", "_rebuild_parameter") | ("torch._utils", "_rebuild_parameter_with_state") => {
            match args.first() {
                Some(inner) => tensor_of(inner, name)?.map(Some).ok_or_else(|| err("parameter without tensor data")),
                None => Err(err("parameter without arguments")),
            }
        }
        // Tensor subclasses and tensors with attributes: (func, type, args, state).
        ("torch._tensor", "_rebuild_from_type_v2") => match (args.first(), args.get(2)) {
            (Some(f), Some(inner_args)) => {
                let inner = Object::Reduce { callable: Box::new(f.clone()), args: Box::new(inner_args.clone()) };
                tensor_of(&inner, name)?.map(Some).ok_or_else(|| err("_rebuild_from_type_v2 of something else"))
            }
            _ => Err(err("_rebuild_from_type_v2 with too few arguments")),
        },
        ("torch._utils", f) if f.starts_with("_rebuild_") => Err(err(&format!(
            "stored with torch._utils.{f} (quantized, sparse or device-specific), which cadence does not read"
        ))),
        _ => Ok(None),
    }
}

// ---------------------------------------------------------------------------------------------
// Pickles: a guard pass, then candle's pickle machine

/// Deepest object nesting accepted (measured by test `state_dicts_are_far_inside_the_guard_limits`:
/// MuseTalk's UNet state dict nests 6 deep, the CPython fixture with an `nn.Parameter` and
/// `_metadata` 9).
pub const MAX_DEPTH: u32 = 64;
/// Most objects candle may copy for memo references (the UNet state dict as `torch_write` writes it
/// copies 46,090: same test).
pub const MAX_CLONED_NODES: u64 = 4_000_000;

#[derive(Debug)]
enum PickleError {
    /// The data ends inside the pickle.
    Truncated,
    Bad(String),
}

impl PickleError {
    fn at_file(self) -> FormatError {
        match self {
            PickleError::Truncated => bad("the file ends inside a pickle (truncated?)"),
            PickleError::Bad(m) => bad(m),
        }
    }
    fn in_entry(self, entry: &str) -> FormatError {
        match self {
            PickleError::Truncated => bad(format!("`{entry}` ends inside its pickle (no STOP opcode)")),
            PickleError::Bad(m) => bad(format!("`{entry}`: {m}")),
        }
    }
}

/// Runs one pickle starting at `start` through [`guard`] and then candle's pickle machine.
/// Returns the object and the offset just past its STOP.
fn unpickle(data: &[u8], start: usize) -> std::result::Result<(Object, usize), PickleError> {
    let end = guard(data, start)?.end;
    let mut cur = std::io::Cursor::new(&data[start..end]);
    let mut stack = Stack::empty();
    stack.read_loop(&mut cur).map_err(|e| PickleError::Bad(format!("pickle at byte {start}: {e}")))?;
    let obj = stack.finalize().map_err(|e| PickleError::Bad(format!("pickle at byte {start}: {e}")))?;
    Ok((obj, end))
}

/// A stack entry of the guard's shadow machine: depth and object count of what candle would
/// hold there.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Mark,
    Val { depth: u32, nodes: u64 },
}

const ATOM: Slot = Slot::Val { depth: 1, nodes: 1 };

/// What [`guard`] found: where the pickle ends, its deepest nesting, the objects candle will copy.
// The loader reads `end` only; the depth and the copies are the tests' measurements.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
struct GuardStats {
    end: usize,
    max_depth: u32,
    cloned: u64,
}

/// Names of standard pickle opcodes candle's machine does not run (for the error message).
fn unsupported_opcode(op: u8) -> Option<&'static str> {
    Some(match op {
        b'd' => "DICT (protocol 0/1)",
        b'I' => "INT (protocol 0)",
        b'L' => "LONG (protocol 0)",
        b'F' => "FLOAT (protocol 0)",
        b'S' => "STRING (protocol 0)",
        b'V' => "UNICODE (protocol 0)",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'p' => "PUT (protocol 0)",
        b'g' => "GET (protocol 0)",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'l' => "LIST (protocol 0)",
        b'o' => "OBJ",
        b'i' => "INST",
        b'P' => "PERSID (protocol 0)",
        0x82..=0x84 => "EXT1/2/4",
        0x8b => "LONG4",
        b'B' => "BINBYTES (protocol 3)",
        b'C' => "SHORT_BINBYTES (protocol 3)",
        0x8c => "SHORT_BINUNICODE (protocol 4)",
        0x8d => "BINUNICODE8 (protocol 4)",
        0x8e => "BINBYTES8 (protocol 4)",
        0x8f => "EMPTY_SET (protocol 4)",
        0x90 => "ADDITEMS (protocol 4)",
        0x91 => "FROZENSET (protocol 4)",
        0x92 => "NEWOBJ_EX (protocol 4)",
        0x93 => "STACK_GLOBAL (protocol 4)",
        0x94 => "MEMOIZE (protocol 4)",
        0x95 => "FRAME (protocol 4)",
        0x96 => "BYTEARRAY8 (protocol 5)",
        0x97 => "NEXT_BUFFER (protocol 5)",
        0x98 => "READONLY_BUFFER (protocol 5)",
        _ => return None,
    })
}

/// Walks one pickle from `start` without building objects and returns the offset just past its
/// STOP. It parses every opcode's argument the way candle's machine does and mirrors its stack
/// with (depth, object count) pairs, so it can refuse, before candle runs: opcodes candle does
/// not implement (or implements differently: DICT), arguments past the end of the data, LONG1
/// integers wider than 8 bytes (candle would shift past 64 bits), nesting deeper than
/// [`MAX_DEPTH`] (candle's objects are recursive), and memo copies (BINPUT/BINGET clone the
/// object in candle) adding up to more than [`MAX_CLONED_NODES`] objects.
fn guard(data: &[u8], start: usize) -> std::result::Result<GuardStats, PickleError> {
    use PickleError::{Bad, Truncated};
    let mut stack: Vec<Slot> = Vec::new();
    let mut memo: HashMap<u32, Slot> = HashMap::new();
    let mut cloned: u64 = 0;
    let mut max_depth: u32 = 0;
    let mut p = start;
    let take = |p: &mut usize, n: usize| -> std::result::Result<&[u8], PickleError> {
        let end = p.checked_add(n).ok_or(Truncated)?;
        let s = data.get(*p..end).ok_or(Truncated)?;
        *p = end;
        Ok(s)
    };
    let u32_at = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    loop {
        let at = p;
        let op = *data.get(p).ok_or(Truncated)?;
        p += 1;
        let underflow =
            || Bad(format!("malformed pickle: opcode 0x{op:02x} at byte {at} finds too few values on the stack"));
        let pop = |stack: &mut Vec<Slot>| -> std::result::Result<(u32, u64), PickleError> {
            match stack.pop().ok_or_else(underflow)? {
                Slot::Mark => Ok((1, 1)),
                Slot::Val { depth, nodes } => Ok((depth, nodes)),
            }
        };
        let pop_to_mark = |stack: &mut Vec<Slot>| -> std::result::Result<(u32, u64), PickleError> {
            let mark = stack
                .iter()
                .rposition(|s| matches!(s, Slot::Mark))
                .ok_or_else(|| Bad(format!("malformed pickle: opcode 0x{op:02x} at byte {at} without a MARK")))?;
            let (mut depth, mut nodes) = (0u32, 0u64);
            for s in stack.drain(mark..).skip(1) {
                if let Slot::Val { depth: d, nodes: n } = s {
                    depth = depth.max(d);
                    nodes = nodes.saturating_add(n);
                }
            }
            Ok((depth, nodes))
        };
        // Adds (depth, nodes) of items into the container on top of the stack.
        let add_to_top = |stack: &mut Vec<Slot>, (d, n): (u32, u64)| -> std::result::Result<(), PickleError> {
            match stack.last_mut() {
                Some(Slot::Val { depth, nodes }) => {
                    *depth = (*depth).max(d.saturating_add(1));
                    *nodes = nodes.saturating_add(n);
                    Ok(())
                }
                _ => Err(Bad(format!("malformed pickle: opcode 0x{op:02x} at byte {at} has no container to add to"))),
            }
        };
        let wrap = |(d, n): (u32, u64)| Slot::Val { depth: d.saturating_add(1), nodes: n.saturating_add(1) };
        match op {
            0x80 => {
                take(&mut p, 1)?;
            }
            b'c' => {
                for _ in 0..2 {
                    let nl = data.get(p..).and_then(|s| s.iter().position(|&b| b == b'\n')).ok_or(Truncated)?;
                    p += nl + 1;
                }
                stack.push(ATOM);
            }
            b'q' | b'r' => {
                let id = if op == b'q' { take(&mut p, 1)?[0] as u32 } else { u32_at(take(&mut p, 4)?) };
                let top = *stack.last().ok_or_else(underflow)?;
                if let Slot::Val { nodes, .. } = top {
                    cloned = cloned.saturating_add(nodes);
                }
                memo.insert(id, top);
            }
            b'h' | b'j' => {
                let id = if op == b'h' { take(&mut p, 1)?[0] as u32 } else { u32_at(take(&mut p, 4)?) };
                let v = *memo.get(&id).ok_or_else(|| {
                    Bad(format!("malformed pickle: memo entry {id} read at byte {at} was never written"))
                })?;
                if let Slot::Val { nodes, .. } = v {
                    cloned = cloned.saturating_add(nodes);
                }
                stack.push(v);
            }
            b')' | b']' | b'}' | b'N' | 0x88 | 0x89 => stack.push(ATOM),
            b'(' => stack.push(Slot::Mark),
            b'X' => {
                let n = u32_at(take(&mut p, 4)?) as usize;
                take(&mut p, n)?;
                stack.push(ATOM);
            }
            b'J' | b'K' | b'M' | b'G' => {
                take(&mut p, [4, 1, 2, 8][[b'J', b'K', b'M', b'G'].iter().position(|&o| o == op).unwrap_or(0)])?;
                stack.push(ATOM);
            }
            0x8a => {
                let n = take(&mut p, 1)?[0] as usize;
                if n > 8 {
                    return Err(Bad(format!(
                        "pickle integer of {n} bytes at byte {at} (more than 64 bits): not supported"
                    )));
                }
                take(&mut p, n)?;
                stack.push(ATOM);
            }
            b't' => {
                let items = pop_to_mark(&mut stack)?;
                stack.push(wrap(items));
            }
            b'Q' | 0x85 => {
                let a = pop(&mut stack)?;
                stack.push(wrap(a));
            }
            0x86 | b'R' | 0x81 | b'b' => {
                let (d2, n2) = pop(&mut stack)?;
                let (d1, n1) = pop(&mut stack)?;
                stack.push(wrap((d1.max(d2), n1.saturating_add(n2))));
            }
            0x87 => {
                let (d3, n3) = pop(&mut stack)?;
                let (d2, n2) = pop(&mut stack)?;
                let (d1, n1) = pop(&mut stack)?;
                stack.push(wrap((d1.max(d2).max(d3), n1.saturating_add(n2).saturating_add(n3))));
            }
            b's' => {
                let (dv, nv) = pop(&mut stack)?;
                let (dk, nk) = pop(&mut stack)?;
                add_to_top(&mut stack, (dk.max(dv), nk.saturating_add(nv)))?;
            }
            b'a' => {
                let v = pop(&mut stack)?;
                add_to_top(&mut stack, v)?;
            }
            b'u' | b'e' => {
                let items = pop_to_mark(&mut stack)?;
                add_to_top(&mut stack, items)?;
            }
            b'.' => return Ok(GuardStats { end: p, max_depth, cloned }),
            other => {
                let what = unsupported_opcode(other).map(|n| format!(" ({n})")).unwrap_or_default();
                return Err(Bad(format!("unknown or unsupported pickle opcode 0x{other:02x}{what} at byte {at}")));
            }
        }
        if let Some(Slot::Val { depth, .. }) = stack.last() {
            max_depth = max_depth.max(*depth);
            if *depth > MAX_DEPTH {
                return Err(Bad(format!("pickle objects nested more than {MAX_DEPTH} deep (at byte {at})")));
            }
        }
        if cloned > MAX_CLONED_NODES {
            return Err(Bad(format!(
                "pickle memo references would copy more than {MAX_CLONED_NODES} objects (at byte {at})"
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_magic_is_torchs_magic_number() {
        // torch/serialization.py: MAGIC_NUMBER = 0x1950a86a20f9469cfc6c, pickled as LONG1.
        let le = 0x1950a86a20f9469cfc6c_u128.to_le_bytes();
        assert_eq!(&LEGACY_MAGIC[4..14], &le[..10]);
        assert_eq!(LEGACY_MAGIC[3] as usize, 10);
    }

    #[test]
    fn state_dicts_are_far_inside_the_guard_limits() {
        // The real MuseTalk UNet's tensor names and shapes (the full profile's table), and the
        // CPython-written fixture (which memoises like torch.save).
        let table = crate::param_table(crate::ModelKind::MuseTalkUnet, crate::Profile::Full).unwrap();
        let sd = crate::torch_write::StateDict {
            storages: table
                .entries
                .iter()
                .map(|_| crate::torch_write::Storage { dtype: "F32", bytes: vec![0; 4] })
                .collect(),
            entries: table
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| crate::torch_write::Entry {
                    name: e.name.clone(),
                    storage: i,
                    offset: 0,
                    shape: e.shape.clone(),
                    strides: row_major(&e.shape),
                })
                .collect(),
            whisper_dims: None,
        };
        let pkl = crate::torch_write::state_dict_pickle(&sd, false).unwrap();
        let st = guard(&pkl, 0).unwrap();
        assert_eq!(st.end, pkl.len());
        eprintln!("UNet state dict: {} tensors, depth {}, {} objects copied", table.len(), st.max_depth, st.cloned);
        assert!(st.max_depth <= MAX_DEPTH / 8 && st.cloned <= MAX_CLONED_NODES / 50, "{st:?}");
        let fixture = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny_legacy.pth")).unwrap();
        let main = {
            let after_two = LEGACY_MAGIC.len() + 6;
            after_two + guard(&fixture, after_two).unwrap().end - after_two
        };
        let st = guard(&fixture, main).unwrap();
        eprintln!("CPython fixture: depth {}, {} objects copied", st.max_depth, st.cloned);
        assert!(st.max_depth <= MAX_DEPTH / 4, "{st:?}");
    }

    #[test]
    fn span_layout_and_gather_follow_strides() {
        assert_eq!(span(&[2, 3], &[3, 1]), Some(6));
        assert!(is_row_major(&[2, 3], &[3, 1]));
        // A transpose spans as many elements as it has but is not row-major: it is gathered.
        assert_eq!(span(&[3, 2], &[1, 3]), Some(6));
        assert!(!is_row_major(&[3, 2], &[1, 3]));
        let src: Vec<u8> = (0u8..6).collect();
        assert_eq!(gather(&src, &[3, 2], &[1, 3], 1), vec![0, 3, 1, 4, 2, 5]);
        // Size-1 dimensions may carry any stride.
        assert!(is_row_major(&[2, 1, 3], &[3, 99, 1]));
        assert_eq!(span(&[2, 1, 3], &[3, 99, 1]), Some(6));
        assert_eq!(span(&[0, 5], &[5, 1]), Some(0));
        // Every other element: 3 elements spanning 5.
        assert_eq!(span(&[3], &[2]), Some(5));
        assert_eq!(span(&[usize::MAX, 2], &[2, 1]), None);
    }
}
