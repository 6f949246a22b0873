//! Weights: expected name -> shape tables, seeded synthetic initialisation, checked loading of
//! safetensors files, saving.
//!
//! Both weight sources go through the same path: a `HashMap<String, Tensor>` that has been
//! checked against the model's expected table, then `VarBuilder::from_tensors` and the model's
//! constructor. The expected table itself is recorded by running the model's constructor once
//! against a recording `VarBuilder` backend (no memory is allocated for the weights), so the
//! table can never drift from what the constructor asks for.

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

/// Builds the synthetic tensors of a table.
pub(crate) fn synthetic_tensors(
    table: &ParamTable,
    seed: u64,
    rule: &dyn Fn(&str, &[usize]) -> Init,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut map = HashMap::with_capacity(table.len());
    for e in &table.entries {
        let numel = e.shape.iter().product();
        let v = synthetic_values(seed, &e.name, numel, rule(&e.name, &e.shape));
        map.insert(e.name.clone(), Tensor::from_vec(v, e.shape.as_slice(), device)?);
    }
    Ok(map)
}

/// Reads a safetensors file and checks it against the expected table: every expected name must be
/// present (after `normalize` maps file keys to canonical names; `None` drops a key), with the
/// expected shape and a float dtype. Returns F32 tensors keyed by canonical name. Extra tensors in
/// the file are ignored (a whole-VAE or whole-whisper file feeds an encoder-only engine).
///
/// Shape leniency, one case only: a (o, i, 1, 1) tensor is accepted for an expected (o, i) linear
/// weight (old diffusers VAE checkpoints store attention projections as 1x1 convs).
pub(crate) fn load_checked(
    path: &Path,
    table: &ParamTable,
    normalize: &dyn Fn(&str) -> Option<String>,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let file = path.to_path_buf();
    let bytes = std::fs::read(path).map_err(|error| EngineError::Io { path: file.clone(), error })?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| EngineError::BadFile { file: file.clone(), msg: format!("not a valid safetensors file: {e}") })?;
    let mut by_canonical: HashMap<String, String> = HashMap::new();
    for key in st.names() {
        if let Some(c) = normalize(key) {
            by_canonical.insert(c, key.to_string());
        }
    }
    let mut out = HashMap::with_capacity(table.len());
    for e in &table.entries {
        let key = by_canonical.get(&e.name).ok_or_else(|| EngineError::MissingTensor {
            file: file.clone(),
            name: e.name.clone(),
            expected: e.shape.clone(),
        })?;
        let view = st
            .tensor(key)
            .map_err(|err| EngineError::BadFile { file: file.clone(), msg: format!("tensor `{key}`: {err}") })?;
        let found = view.shape().to_vec();
        let shape_ok = found == e.shape
            || (e.shape.len() == 2 && found.len() == 4 && found[..2] == e.shape[..] && found[2..] == [1, 1]);
        if !shape_ok {
            return Err(EngineError::ShapeMismatch {
                file: file.clone(),
                name: key.clone(),
                expected: e.shape.clone(),
                found,
            });
        }
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F64 => DType::F64,
            other => {
                return Err(EngineError::BadDtype {
                    file: file.clone(),
                    name: key.clone(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let t = Tensor::from_raw_buffer(view.data(), dtype, &found, &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.reshape(e.shape.as_slice()))
            .and_then(|t| t.to_device(device))
            .map_err(|err| EngineError::BadFile { file: file.clone(), msg: format!("tensor `{key}`: {err}") })?;
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
