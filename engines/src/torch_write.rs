//! Writes state dicts the way `torch.save` does, in both of its formats, for tests (cadence
//! reads PyTorch checkpoints; no test can download one, and none needs Python).
//!
//! The pickle is protocol 2 with the opcodes CPython's pickler emits for a state dict: an
//! `OrderedDict` (GLOBAL + EMPTY_TUPLE + REDUCE, items by SETITEMS), each tensor as
//! `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`, the
//! storage as a BINPERSID persistent id `('storage', torch.<X>Storage, key, 'cpu', numel)` (the
//! legacy format adds a sixth element, `None`), small tuples as TUPLE1/2/3, integers as
//! BININT1/BININT2/BININT, every new object memoised with BINPUT and repeated globals fetched
//! with BINGET. `tests/fixtures/make_torch_fixtures.py` writes the same structures with CPython's
//! own pickler; the tests read both.
//!
//! Containers: [`zip_checkpoint`] (entries `archive/data.pkl`, `archive/byteorder`,
//! `archive/data/<key>`, `archive/version`, stored uncompressed) and [`legacy_checkpoint`] (five
//! pickles, then each storage as an 8-byte little-endian element count and its bytes).

use crate::error::{EngineError, Result};
use crate::{sd_vae, synthetic_weights, unet, ModelKind, Profile};
use candle_core::{DType, Tensor};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// One storage: its dtype (`F32`, `F16`, `BF16`, `F64`, `I64`) and raw little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Storage {
    pub dtype: &'static str,
    pub bytes: Vec<u8>,
}

/// One tensor: a view into `storages[storage]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    pub storage: usize,
    /// In elements.
    pub offset: usize,
    pub shape: Vec<usize>,
    /// In elements.
    pub strides: Vec<usize>,
}

/// What to pickle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateDict {
    pub storages: Vec<Storage>,
    pub entries: Vec<Entry>,
    /// When set, the object is `{"dims": {name: int}, "model_state_dict": <state dict>}` (an
    /// openai-whisper checkpoint); else the state dict itself.
    pub whisper_dims: Option<Vec<(String, i64)>>,
}

fn storage_class(dtype: &str) -> Result<(&'static str, usize)> {
    Ok(match dtype {
        "F32" => ("FloatStorage", 4),
        "F16" => ("HalfStorage", 2),
        "BF16" => ("BFloat16Storage", 2),
        "F64" => ("DoubleStorage", 8),
        "I64" => ("LongStorage", 8),
        other => return Err(EngineError::BadInput(format!("torch_write: dtype {other}"))),
    })
}

impl StateDict {
    /// One storage per tensor, row-major, in name order, converted to `dtype` (F32, F16, BF16 or
    /// F64).
    pub fn from_tensors(tensors: &HashMap<String, Tensor>, dtype: DType) -> Result<StateDict> {
        let name = match dtype {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F64 => "F64",
            other => return Err(EngineError::BadInput(format!("torch_write: dtype {other:?}"))),
        };
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        let mut sd = StateDict::default();
        for n in names {
            let t = tensors[n].to_dtype(dtype)?.flatten_all()?;
            let bytes = match dtype {
                DType::F32 => t.to_vec1::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::F16 => t.to_vec1::<half::f16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::BF16 => t.to_vec1::<half::bf16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
                _ => t.to_vec1::<f64>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            let shape = tensors[n].dims().to_vec();
            sd.entries.push(Entry {
                name: n.clone(),
                storage: sd.storages.len(),
                offset: 0,
                strides: row_major(&shape),
                shape,
            });
            sd.storages.push(Storage { dtype: name, bytes });
        }
        Ok(sd)
    }

    /// Storage keys as torch names them: `0`, `1`, ... in the zip format, the storage's C
    /// address in the legacy format (any distinct strings; here large decimal numbers).
    fn key(&self, i: usize, legacy: bool) -> String {
        if legacy {
            (94_000_000_000_000u64 + 64 * i as u64).to_string()
        } else {
            i.to_string()
        }
    }
}

fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// A protocol-2 pickle writer with CPython's memo discipline.
struct Pickler {
    out: Vec<u8>,
    memo: u32,
    globals: HashMap<String, u32>,
}

impl Pickler {
    fn new() -> Pickler {
        Pickler { out: vec![0x80, 2], memo: 0, globals: HashMap::new() }
    }
    fn put(&mut self) {
        if self.memo < 256 {
            self.out.extend([b'q', self.memo as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend(self.memo.to_le_bytes());
        }
        self.memo += 1;
    }
    fn get(&mut self, id: u32) {
        if id < 256 {
            self.out.extend([b'h', id as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend(id.to_le_bytes());
        }
    }
    fn global(&mut self, module: &str, name: &str) {
        let key = format!("{module}\n{name}\n");
        if let Some(&id) = self.globals.get(&key) {
            self.get(id);
            return;
        }
        self.out.push(b'c');
        self.out.extend(key.as_bytes());
        self.globals.insert(key, self.memo);
        self.put();
    }
    fn string(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend((s.len() as u32).to_le_bytes());
        self.out.extend(s.as_bytes());
        self.put();
    }
    fn int(&mut self, v: i64) {
        if (0..256).contains(&v) {
            self.out.extend([b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend((v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(b'J');
            self.out.extend((v as i32).to_le_bytes());
        } else {
            let b = v.to_le_bytes();
            self.out.extend([0x8a, 8]);
            self.out.extend(b);
        }
    }
    fn tuple_of_ints(&mut self, v: &[usize]) {
        match v.len() {
            0 => self.out.push(b')'),
            n @ 1..=3 => {
                v.iter().for_each(|&x| self.int(x as i64));
                self.out.push([0x85, 0x86, 0x87][n - 1]);
                self.put();
            }
            _ => {
                self.out.push(b'(');
                v.iter().for_each(|&x| self.int(x as i64));
                self.out.push(b't');
                self.put();
            }
        }
    }
    fn empty_ordered_dict(&mut self) {
        self.global("collections", "OrderedDict");
        self.out.push(b')');
        self.out.push(b'R');
        self.put();
    }
    fn finish(mut self) -> Vec<u8> {
        self.out.push(b'.');
        self.out
    }
}

/// The pickle of `sd` (`data.pkl` of the zip format; the fourth pickle of the legacy format,
/// whose persistent ids have a sixth element).
pub fn state_dict_pickle(sd: &StateDict, legacy: bool) -> Result<Vec<u8>> {
    let mut p = Pickler::new();
    if let Some(dims) = &sd.whisper_dims {
        p.out.push(b'}');
        p.put();
        p.out.push(b'(');
        p.string("dims");
        p.out.push(b'}');
        p.put();
        p.out.push(b'(');
        for (k, v) in dims {
            p.string(k);
            p.int(*v);
        }
        p.out.push(b'u');
        p.string("model_state_dict");
    }
    p.empty_ordered_dict();
    p.out.push(b'(');
    let mut seen_storage: HashMap<usize, u32> = HashMap::new();
    for e in &sd.entries {
        let st =
            sd.storages.get(e.storage).ok_or_else(|| EngineError::BadInput("torch_write: storage index".into()))?;
        let (class, size) = storage_class(st.dtype)?;
        p.string(&e.name);
        p.global("torch._utils", "_rebuild_tensor_v2");
        p.out.push(b'(');
        // The persistent id tuple; a storage pickled twice is memoised like any object.
        match seen_storage.get(&e.storage) {
            Some(&id) => p.get(id),
            None => {
                p.out.push(b'(');
                p.string("storage");
                p.global("torch", class);
                p.string(&sd.key(e.storage, legacy));
                p.string("cpu");
                p.int((st.bytes.len() / size) as i64);
                if legacy {
                    p.out.push(b'N');
                }
                p.out.push(b't');
                p.put();
                p.out.push(b'Q');
                seen_storage.insert(e.storage, p.memo);
                p.put();
            }
        }
        p.int(e.offset as i64);
        p.tuple_of_ints(&e.shape);
        p.tuple_of_ints(&e.strides);
        p.out.push(0x89);
        p.empty_ordered_dict();
        p.out.push(b't');
        p.put();
        p.out.push(b'R');
        p.put();
    }
    p.out.push(b'u');
    if sd.whisper_dims.is_some() {
        p.out.push(b'u');
    }
    Ok(p.finish())
}

/// `torch.save(obj, f)` (zip format, torch >= 1.6) as bytes.
pub fn zip_checkpoint(sd: &StateDict) -> Result<Vec<u8>> {
    let mut entries = vec![
        ("archive/data.pkl".to_string(), state_dict_pickle(sd, false)?),
        ("archive/byteorder".to_string(), b"little".to_vec()),
    ];
    for (i, st) in sd.storages.iter().enumerate() {
        entries.push((format!("archive/data/{}", sd.key(i, false)), st.bytes.clone()));
    }
    entries.push(("archive/version".to_string(), b"3\n".to_vec()));
    Ok(zip_archive(&entries))
}

/// A zip archive of stored (uncompressed) entries, as torch writes them.
pub fn zip_archive(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut w = ZipWriter::default();
    for (name, data) in entries {
        w.add(name, data);
    }
    w.finish()
}

/// `torch.save(obj, f, _use_new_zipfile_serialization=False)` (legacy format) as bytes.
pub fn legacy_checkpoint(sd: &StateDict) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    // Magic number 0x1950a86a20f9469cfc6c as LONG1, then protocol version 1001.
    out.extend([0x80, 2, 0x8a, 10]);
    out.extend(&0x1950a86a20f9469cfc6c_u128.to_le_bytes()[..10]);
    out.push(b'.');
    out.extend([0x80, 2, b'M', 0xe9, 0x03, b'.']);
    // sys_info = {'protocol_version': 1001, 'little_endian': True, 'type_sizes': {...}}
    let mut p = Pickler::new();
    p.out.push(b'}');
    p.put();
    p.out.push(b'(');
    p.string("protocol_version");
    p.int(1001);
    p.string("little_endian");
    p.out.push(0x88);
    p.string("type_sizes");
    p.out.push(b'}');
    p.put();
    p.out.push(b'(');
    for (k, v) in [("short", 2), ("int", 4), ("long", 8)] {
        p.string(k);
        p.int(v);
    }
    p.out.push(b'u');
    p.out.push(b'u');
    out.extend(p.finish());
    out.extend(state_dict_pickle(sd, true)?);
    // The storage keys, sorted as strings (torch sorts them), then the storages in that order.
    let mut keys: Vec<(String, usize)> = (0..sd.storages.len()).map(|i| (sd.key(i, true), i)).collect();
    keys.sort();
    let mut p = Pickler::new();
    p.out.push(b']');
    p.put();
    p.out.push(b'(');
    for (k, _) in &keys {
        p.string(k);
    }
    p.out.push(b'e');
    out.extend(p.finish());
    for (_, i) in keys {
        let st = &sd.storages[i];
        let (_, size) = storage_class(st.dtype)?;
        out.extend(((st.bytes.len() / size) as u64).to_le_bytes());
        out.extend(&st.bytes);
    }
    Ok(out)
}

/// Writes a MuseTalk `models/` folder as `download_weights.sh` lays it out, plus TAESD's two
/// files, holding the synthetic weights of `profile` (`seed(kind)` per engine; the MuseTalk 1.0
/// UNet gets `seed + 1`) with configurations describing that profile. The containers vary (zip
/// or legacy, F32) so a folder exercises both:
///
/// `musetalkV15/{unet.pth (zip), musetalk.json}`, `musetalk/{pytorch_model.bin (legacy),
/// musetalk.json}`, `sd-vae/{diffusion_pytorch_model.bin (legacy), config.json}`,
/// `whisper/{pytorch_model.bin (zip, Hugging Face names with one text-decoder tensor and the
/// positional table), config.json, preprocessor_config.json}`, `taesd/taesd_decoder.pth`
/// (zip), `taesd/taesd_encoder.pth` (legacy).
pub fn write_musetalk_folder(root: &Path, profile: Profile, seed: &dyn Fn(ModelKind) -> u64) -> Result<()> {
    let put = |rel: &str, bytes: &[u8]| -> Result<()> {
        let p = root.join(rel);
        let io = |error| EngineError::Io { path: p.clone(), error };
        std::fs::create_dir_all(p.parent().unwrap_or(root)).map_err(io)?;
        std::fs::write(&p, bytes).map_err(io)
    };
    let sd = |kind, seed| StateDict::from_tensors(&synthetic_weights(kind, profile, seed)?, DType::F32);
    let unet_seed = seed(ModelKind::MuseTalkUnet);
    put("musetalkV15/unet.pth", &zip_checkpoint(&sd(ModelKind::MuseTalkUnet, unet_seed)?)?)?;
    put("musetalkV15/musetalk.json", musetalk_config(profile).as_bytes())?;
    put("musetalk/pytorch_model.bin", &legacy_checkpoint(&sd(ModelKind::MuseTalkUnet, unet_seed + 1)?)?)?;
    put("musetalk/musetalk.json", musetalk_config(profile).as_bytes())?;
    put(
        "sd-vae/diffusion_pytorch_model.bin",
        &legacy_checkpoint(&sd(ModelKind::SdVaeDecoder, seed(ModelKind::SdVaeDecoder))?)?,
    )?;
    put("sd-vae/config.json", vae_config(profile).as_bytes())?;
    let mut w: HashMap<String, Tensor> =
        synthetic_weights(ModelKind::WhisperTiny, profile, seed(ModelKind::WhisperTiny))?
            .into_iter()
            .map(|(k, v)| (format!("model.encoder.{k}"), v))
            .collect();
    let zeros = |shape: (usize, usize)| Tensor::zeros(shape, DType::F32, &candle_core::Device::Cpu);
    let d = crate::whisper::d_model(profile);
    w.insert("model.decoder.embed_tokens.weight".into(), zeros((4, d))?);
    w.insert("model.encoder.embed_positions.weight".into(), zeros((crate::whisper::WINDOW_FRAMES / 2, d))?);
    put("whisper/pytorch_model.bin", &zip_checkpoint(&StateDict::from_tensors(&w, DType::F32)?)?)?;
    put("whisper/config.json", whisper_config(profile).as_bytes())?;
    put("whisper/preprocessor_config.json", b"{}")?;
    put("taesd/taesd_decoder.pth", &zip_checkpoint(&sd(ModelKind::TaesdDecoder, seed(ModelKind::TaesdDecoder))?)?)?;
    put("taesd/taesd_encoder.pth", &legacy_checkpoint(&sd(ModelKind::TaesdEncoder, seed(ModelKind::TaesdEncoder))?)?)?;
    Ok(())
}

/// MuseTalk's `musetalk.json` (diffusers 0.6 field set) for the UNet cadence builds at `profile`.
fn musetalk_config(profile: Profile) -> String {
    format!(
        r#"{{"_class_name": "UNet2DConditionModel", "act_fn": "silu", "attention_head_dim": {},
 "block_out_channels": {:?}, "center_input_sample": false, "cross_attention_dim": {},
 "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
 "downsample_padding": 1, "flip_sin_to_cos": true, "freq_shift": 0, "in_channels": {}, "layers_per_block": 2,
 "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": {}, "sample_size": 64,
 "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]}}"#,
        unet::attention_heads(profile),
        unet::block_channels(profile),
        unet::audio_dim(profile),
        unet::IN_CHANNELS,
        unet::OUT_CHANNELS
    )
}

/// sd-vae-ft-mse's `config.json` for the VAE cadence builds at `profile`.
fn vae_config(profile: Profile) -> String {
    format!(
        r#"{{"_class_name": "AutoencoderKL", "act_fn": "silu", "block_out_channels": {:?},
 "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
 "in_channels": 3, "latent_channels": 4, "layers_per_block": 2, "norm_num_groups": {}, "out_channels": 3,
 "sample_size": 256, "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]}}"#,
        sd_vae::config(profile).block_out_channels,
        sd_vae::config(profile).norm_num_groups
    )
}

/// The encoder fields of openai/whisper-tiny's `config.json`, at the widths of `profile`.
fn whisper_config(profile: Profile) -> String {
    let d = crate::whisper::d_model(profile);
    format!(
        r#"{{"model_type": "whisper", "d_model": {d}, "encoder_layers": {}, "encoder_attention_heads": {},
 "encoder_ffn_dim": {}, "num_mel_bins": 80, "max_source_positions": 1500, "activation_function": "gelu",
 "scale_embedding": false}}"#,
        crate::whisper::N_LAYERS,
        crate::whisper::n_heads(profile),
        4 * d
    )
}

/// A minimal zip writer (stored entries, no data descriptors), enough for PyTorch's layout.
#[derive(Default)]
struct ZipWriter {
    out: Vec<u8>,
    central: Vec<u8>,
    count: u16,
}

impl ZipWriter {
    fn add(&mut self, name: &str, data: &[u8]) {
        let crc = crc32(data);
        let offset = self.out.len() as u32;
        let n = name.len() as u16;
        let size = data.len() as u32;
        let mut local = Vec::new();
        local.extend(0x04034b50u32.to_le_bytes());
        local.extend([20, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // version, flags, method 0 (stored), time, date
        local.extend(crc.to_le_bytes());
        local.extend(size.to_le_bytes());
        local.extend(size.to_le_bytes());
        local.extend(n.to_le_bytes());
        local.extend(0u16.to_le_bytes());
        self.out.write_all(&local).expect("vec write");
        self.out.extend(name.as_bytes());
        self.out.extend(data);
        self.central.extend(0x02014b50u32.to_le_bytes());
        self.central.extend([20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // made by, needed, flags, method, time, date
        self.central.extend(crc.to_le_bytes());
        self.central.extend(size.to_le_bytes());
        self.central.extend(size.to_le_bytes());
        self.central.extend(n.to_le_bytes());
        self.central.extend([0u8; 8]); // extra len, comment len, disk, internal attrs
        self.central.extend(0u32.to_le_bytes()); // external attrs
        self.central.extend(offset.to_le_bytes());
        self.central.extend(name.as_bytes());
        self.count += 1;
    }
    fn finish(mut self) -> Vec<u8> {
        let cd_offset = self.out.len() as u32;
        let cd_size = self.central.len() as u32;
        self.out.extend(&self.central);
        self.out.extend(0x06054b50u32.to_le_bytes());
        self.out.extend([0u8; 4]); // disk numbers
        self.out.extend(self.count.to_le_bytes());
        self.out.extend(self.count.to_le_bytes());
        self.out.extend(cd_size.to_le_bytes());
        self.out.extend(cd_offset.to_le_bytes());
        self.out.extend(0u16.to_le_bytes());
        self.out
    }
}

/// CRC-32 (IEEE, reflected), as zip requires.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32_known_answer() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(super::crc32(b"123456789"), 0xCBF4_3926);
    }
}
