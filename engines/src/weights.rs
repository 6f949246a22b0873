//! Weights: expected name -> shape tables, seeded synthetic initialisation, checked loading of
//! weights files (safetensors or PyTorch checkpoints, see [`crate::checkpoint`]), saving.
//!
//! Both weight sources go through the same path: a `HashMap<String, Tensor>` that has been
//! checked against the model's expected table, then `VarBuilder::from_tensors` and the model's
//! constructor. The expected table itself is recorded by running the model's constructor once
//! against a recording `VarBuilder` backend (no memory is allocated for the weights), so the
//! table can never drift from what the constructor asks for.

use crate::checkpoint::{Checkpoint, WeightsFile};
use crate::error::{EngineError, Result};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One expected parameter: its state-dict name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

/// The full list of parameters a model's constructor asks for, in request order.
#[derive(Debug, Clone, Default)]
pub struct ParamTable {
    pub entries: Vec<ParamSpec>,
}

impl ParamTable {
    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.entries.iter().map(|e| e.shape.iter().product::<usize>()).sum()
    }
    pub fn get(&self, name: &str) -> Option<&ParamSpec> {
        self.entries.iter().find(|e| e.name == name)
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A `VarBuilder` backend that records every requested (name, shape) and hands back a broadcast
/// zero (no allocation). Used only to learn what a constructor needs.
struct Recorder(Arc<Mutex<Vec<ParamSpec>>>);

impl SimpleBackend for Recorder {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _h: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut seen = self.0.lock().expect("recorder lock");
        if !seen.iter().any(|e| e.name == name) {
            seen.push(ParamSpec { name: name.to_string(), shape: s.dims().to_vec() });
        }
        Tensor::zeros((), dtype, dev)?.broadcast_as(s)
    }
    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("recorder: shape of `{name}` unknown (get_unchecked is not supported)")
    }
    fn contains_tensor(&self, _name: &str) -> bool {
        true
    }
}

/// Records the expected parameter table of a model constructor.
pub(crate) fn record_table<M>(build: impl FnOnce(VarBuilder) -> candle_core::Result<M>) -> Result<ParamTable> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let vb = VarBuilder::from_backend(Box::new(Recorder(seen.clone())), DType::F32, Device::Cpu);
    let model = build(vb)?;
    drop(model);
    let entries = seen.lock().expect("recorder lock").clone();
    Ok(ParamTable { entries })
}

/// How one synthetic tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// N(0, std^2) values.
    Normal(f32),
    /// Every value equal to this constant.
    Const(f32),
}

/// Fan-in of a weight tensor (product of all dims but the first).
pub(crate) fn fan_in(shape: &[usize]) -> usize {
    shape.iter().skip(1).product::<usize>().max(1)
}

/// Default rule: norm scales 1, biases 0, conv weights He-normal (gain sqrt 2, they feed
/// ReLU/SiLU/GELU), linear weights LeCun-normal (gain 1). Models override residual-branch outputs.
pub(crate) fn default_init(name: &str, shape: &[usize]) -> Init {
    let last = name.rsplit('.').next().unwrap_or(name);
    let is_norm = name.contains("norm") || name.contains("ln_") || name.contains(".ln");
    match (last, shape.len()) {
        ("bias", _) => Init::Const(0.0),
        ("weight", 1) if is_norm => Init::Const(1.0),
        ("weight", 1) => Init::Normal(0.02),
        (_, 4) | (_, 3) => Init::Normal((2.0 / fan_in(shape) as f32).sqrt()),
        (_, 2) => Init::Normal((1.0 / fan_in(shape) as f32).sqrt()),
        _ => Init::Normal(0.02),
    }
}

/// splitmix64: tiny, well-mixed, seedable; we need bit-exact reproducibility across versions,
/// which a hand-rolled generator guarantees and library RNG streams do not promise.
struct SplitMix(u64);
impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn next_f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Deterministic values for one tensor: depend only on (seed, name, shape, init), not on the
/// order in which tensors are generated.
pub(crate) fn synthetic_values(seed: u64, name: &str, numel: usize, init: Init) -> Vec<f32> {
    match init {
        Init::Const(c) => vec![c; numel],
        Init::Normal(std) => {
            let mut rng = SplitMix(seed ^ fnv1a(name).rotate_left(17));
            let mut out = Vec::with_capacity(numel);
            while out.len() < numel {
                // Box-Muller: two normals per pair of uniforms.
                let u1 = rng.next_f64();
                let u2 = rng.next_f64();
                let r = (-2.0 * u1.ln()).sqrt();
                let t = std::f64::consts::TAU * u2;
                out.push((r * t.cos()) as f32 * std);
                if out.len() < numel {
                    out.push((r * t.sin()) as f32 * std);
                }
            }
            out
        }
    }
}

/// Builds the synthetic tensors of a table, in parallel over the tensors (each tensor's values
/// depend only on its seed, name and shape, so the order does not matter): the full UNet's 0.86 G
/// values took 20 s of Box-Muller on one thread.
pub(crate) fn synthetic_tensors(
    table: &ParamTable,
    seed: u64,
    rule: &(dyn Fn(&str, &[usize]) -> Init + Sync),
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    use rayon::prelude::*;
    let values: Vec<Vec<f32>> = table
        .entries
        .par_iter()
        .map(|e| synthetic_values(seed, &e.name, e.shape.iter().product(), rule(&e.name, &e.shape)))
        .collect();
    let mut map = HashMap::with_capacity(table.len());
    for (e, v) in table.entries.iter().zip(values) {
        map.insert(e.name.clone(), Tensor::from_vec(v, e.shape.as_slice(), device)?);
    }
    Ok(map)
}

/// How a checkpoint's tensors line up with a model's expected table. File names are mapped to
/// canonical names by the model's `normalize` (`None` drops a file tensor on purpose, e.g. a
/// whisper file's text decoder).
#[derive(Debug, Clone, Default)]
pub struct TableMatch {
    /// Per table entry, in table order.
    status: Vec<Slot>,
    /// File tensors that map to no expected name (index into the checkpoint).
    pub extra: Vec<String>,
    /// File tensors the model drops on purpose.
    pub ignored: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Found with a usable shape and a float dtype (checkpoint index).
    Found(usize),
    Missing,
    Misshaped(usize),
    NotFloat(usize),
}

/// Shape leniency, one case only: a (o, i, 1, 1) tensor is accepted for an expected (o, i)
/// linear weight (old diffusers VAE checkpoints store attention projections as 1x1 convs).
fn shape_fits(expected: &[usize], found: &[usize]) -> bool {
    found == expected || (expected.len() == 2 && found.len() == 4 && found[..2] == expected[..] && found[2..] == [1, 1])
}

impl TableMatch {
    pub fn new(ck: &Checkpoint, table: &ParamTable, normalize: &dyn Fn(&str) -> Option<String>) -> Result<TableMatch> {
        let mut by_canonical: HashMap<String, usize> = HashMap::new();
        let mut m = TableMatch::default();
        for (i, t) in ck.tensors.iter().enumerate() {
            match normalize(&t.name) {
                None => m.ignored += 1,
                Some(c) => {
                    if let Some(&j) = by_canonical.get(&c) {
                        return Err(EngineError::BadInput(format!(
                            "tensors `{}` and `{}` both stand for `{c}`",
                            ck.tensors[j].name, t.name
                        )));
                    }
                    by_canonical.insert(c, i);
                }
            }
        }
        let mut used = vec![false; ck.tensors.len()];
        for e in &table.entries {
            let slot = match by_canonical.get(&e.name) {
                None => Slot::Missing,
                Some(&i) => {
                    used[i] = true;
                    let t = &ck.tensors[i];
                    if !shape_fits(&e.shape, &t.shape) {
                        Slot::Misshaped(i)
                    } else if t.float_dtype().is_none() {
                        Slot::NotFloat(i)
                    } else {
                        Slot::Found(i)
                    }
                }
            };
            m.status.push(slot);
        }
        m.extra = by_canonical.values().filter(|&&i| !used[i]).map(|&i| ck.tensors[i].name.clone()).collect();
        m.extra.sort();
        Ok(m)
    }

    /// Whether every expected tensor was found, well shaped and floating point.
    pub fn complete(&self) -> bool {
        self.status.iter().all(|s| matches!(s, Slot::Found(_)))
    }

    /// The first problem in table order, as the error loading reports.
    pub fn first_error(&self, file: &Path, table: &ParamTable, ck: &Checkpoint) -> Option<EngineError> {
        let file = file.to_path_buf();
        self.status.iter().zip(&table.entries).find_map(|(s, e)| match *s {
            Slot::Found(_) => None,
            Slot::Missing => {
                Some(EngineError::MissingTensor { file: file.clone(), name: e.name.clone(), expected: e.shape.clone() })
            }
            Slot::Misshaped(i) => Some(EngineError::ShapeMismatch {
                file: file.clone(),
                name: ck.tensors[i].name.clone(),
                expected: e.shape.clone(),
                found: ck.tensors[i].shape.clone(),
            }),
            Slot::NotFloat(i) => Some(EngineError::BadDtype {
                file: file.clone(),
                name: ck.tensors[i].name.clone(),
                dtype: ck.tensors[i].dtype.clone(),
            }),
        })
    }

    /// Expected tensors absent from the file: `name (expected shape)`.
    pub fn missing(&self, table: &ParamTable) -> Vec<String> {
        self.status
            .iter()
            .zip(&table.entries)
            .filter(|(s, _)| **s == Slot::Missing)
            .map(|(_, e)| format!("{} {:?}", e.name, e.shape))
            .collect()
    }

    /// Tensors with the wrong shape: `name: file shape, expected shape`.
    pub fn misshaped(&self, table: &ParamTable, ck: &Checkpoint) -> Vec<String> {
        self.status
            .iter()
            .zip(&table.entries)
            .filter_map(|(s, e)| match *s {
                Slot::Misshaped(i) => Some(format!(
                    "{}: {:?} in the file, expected {:?}",
                    ck.tensors[i].name, ck.tensors[i].shape, e.shape
                )),
                _ => None,
            })
            .collect()
    }

    /// Tensors stored with a non-float dtype: `name: dtype`.
    pub fn not_float(&self, ck: &Checkpoint) -> Vec<String> {
        self.status
            .iter()
            .filter_map(|s| match *s {
                Slot::NotFloat(i) => Some(format!("{}: {}", ck.tensors[i].name, ck.tensors[i].dtype)),
                _ => None,
            })
            .collect()
    }

    /// Parameters in the expected tensors the file provides.
    pub fn matched_params(&self, ck: &Checkpoint) -> usize {
        self.status
            .iter()
            .filter_map(|s| match *s {
                Slot::Found(i) => Some(ck.tensors[i].numel()),
                _ => None,
            })
            .sum()
    }
}

/// Reads the expected tensors of `table` from an open weights file, after checking all of them
/// (a missing name, a wrong shape or a non-float dtype is an error naming the tensor, before any
/// data is read). F16/BF16/F64 are converted to F32. Returns tensors keyed by canonical name.
pub(crate) fn load_checked(
    file: &mut WeightsFile,
    table: &ParamTable,
    normalize: &dyn Fn(&str) -> Option<String>,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let m = TableMatch::new(&file.checkpoint, table, normalize).map_err(|e| match e {
        EngineError::BadInput(msg) => EngineError::BadFile { file: file.path.clone(), msg },
        e => e,
    })?;
    if let Some(e) = m.first_error(&file.path, table, &file.checkpoint) {
        return Err(e);
    }
    let mut out = HashMap::with_capacity(table.len());
    // After `first_error`, every slot is `Found`.
    for (slot, e) in m.status.iter().zip(&table.entries) {
        let Slot::Found(i) = *slot else { continue };
        let entry = file.checkpoint.tensors[i].clone();
        let t = file.read_f32(&entry)?;
        let t = t.reshape(e.shape.as_slice()).and_then(|t| t.to_device(device)).map_err(|err| {
            EngineError::BadFile { file: file.path.clone(), msg: format!("tensor `{}`: {err}", entry.name) }
        })?;
        out.insert(e.name.clone(), t);
    }
    Ok(out)
}

/// Writes tensors to a safetensors file (F32).
pub fn save_tensors(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    candle_core::safetensors::save(tensors, path)
        .map_err(|e| EngineError::BadFile { file: PathBuf::from(path), msg: format!("cannot write: {e}") })
}

/// Builds a model from checked tensors through the ordinary `VarBuilder` path. Any panic inside
/// the constructor (candle code that `unwrap`s) becomes an error instead of aborting the caller.
pub(crate) fn build_from_tensors<M>(
    tensors: HashMap<String, Tensor>,
    device: &Device,
    what: &str,
    build: impl FnOnce(VarBuilder) -> candle_core::Result<M>,
) -> Result<M> {
    let vb = VarBuilder::from_tensors(tensors, DType::F32, device);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(vb))) {
        Ok(r) => Ok(r?),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(EngineError::BadFile { file: PathBuf::from(what), msg: format!("model constructor panicked: {msg}") })
        }
    }
}
