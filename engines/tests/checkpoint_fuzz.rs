//! Random corruptions of weights files: inspecting them (and reading every tensor they then
//! claim to hold) returns an error or a result, never panics, and stays bounded in time.
//! `cadence_engines::checkpoint::inspect_bytes` is the header/pickle parser's fuzzing entry point.

use cadence_engines::checkpoint::{inspect_bytes, read_bytes_f32};
use cadence_engines::torch_write::{
    legacy_checkpoint, state_dict_pickle, zip_archive, zip_checkpoint, Entry, StateDict, Storage,
};
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The zip seed's parts: its state dict (for its pickle and storages).
fn seed_state_dict() -> StateDict {
    let f32s: Vec<u8> = (0..12).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect();
    StateDict {
        storages: vec![
            Storage { dtype: "F32", bytes: f32s },
            Storage { dtype: "F16", bytes: vec![0x00, 0x3c, 0x00, 0xc0] },
        ],
        entries: vec![
            Entry { name: "a.weight".into(), storage: 0, offset: 0, shape: vec![3, 4], strides: vec![4, 1] },
            Entry { name: "a.t".into(), storage: 0, offset: 1, shape: vec![3, 2], strides: vec![1, 4] },
            Entry { name: "h".into(), storage: 1, offset: 0, shape: vec![2], strides: vec![1] },
        ],
        whisper_dims: Some(vec![("n_mels".into(), 80), ("n_audio_state".into(), 384)]),
    }
}

/// Small valid files in all three formats: two tensors sharing a storage (one strided), an F16
/// tensor, nested whisper-style `dims`.
fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let sd = seed_state_dict();
        let mut tensors = std::collections::HashMap::new();
        let t = candle_core::Tensor::from_vec(
            (0..12).map(|i| i as f32).collect::<Vec<_>>(),
            (3, 4),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        tensors.insert("w".to_string(), t);
        let st = std::env::temp_dir().join(format!("cadence-fuzz-seed-{}.safetensors", std::process::id()));
        candle_core::safetensors::save(&tensors, &st).unwrap();
        let safetensors = std::fs::read(&st).unwrap();
        std::fs::remove_file(&st).unwrap();
        vec![zip_checkpoint(&sd).unwrap(), legacy_checkpoint(&sd).unwrap(), safetensors]
    })
}

#[derive(Debug, Clone)]
enum Edit {
    /// Overwrite the byte at (position fraction) with a value.
    Set(f64, u8),
    /// Cut the file at (position fraction).
    Truncate(f64),
    /// Insert bytes at (position fraction).
    Insert(f64, Vec<u8>),
    /// Remove a run of bytes at (position fraction).
    Remove(f64, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        6 => (0.0..1.0f64, any::<u8>()).prop_map(|(p, b)| Edit::Set(p, b)),
        1 => (0.0..1.0f64).prop_map(Edit::Truncate),
        1 => (0.0..1.0f64, proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(p, v)| Edit::Insert(p, v)),
        1 => (0.0..1.0f64, 1..32usize).prop_map(|(p, n)| Edit::Remove(p, n)),
    ]
}

fn apply(mut b: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let at = |p: f64, len: usize| ((p * len as f64) as usize).min(len);
        match e {
            Edit::Set(p, v) => {
                if !b.is_empty() {
                    let i = at(*p, b.len() - 1);
                    b[i] = *v;
                }
            }
            Edit::Truncate(p) => b.truncate(at(*p, b.len())),
            Edit::Insert(p, v) => {
                let i = at(*p, b.len());
                b.splice(i..i, v.iter().copied());
            }
            Edit::Remove(p, n) => {
                let i = at(*p, b.len());
                let j = (i + n).min(b.len());
                b.drain(i..j);
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn corrupted_files_never_panic(which in 0..3usize, edits in proptest::collection::vec(edit(), 1..6)) {
        let bytes = apply(seeds()[which].clone(), &edits);
        let t0 = Instant::now();
        if let Ok(ck) = inspect_bytes(&bytes) {
            for e in &ck.tensors {
                if e.float_dtype().is_some() {
                    let _ = read_bytes_f32(&bytes, e);
                }
            }
        }
        prop_assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    }

    /// Corruptions of the pickle inside a zip checkpoint, with the zip rebuilt around it (a
    /// corrupted entry in a whole archive fails zip's CRC check before the pickle is parsed).
    #[test]
    fn corrupted_zip_pickles_never_panic(edits in proptest::collection::vec(edit(), 1..6)) {
        let sd = seed_state_dict();
        let pkl = apply(state_dict_pickle(&sd, false).unwrap(), &edits);
        let mut entries = vec![("archive/data.pkl".to_string(), pkl)];
        for (i, st) in sd.storages.iter().enumerate() {
            entries.push((format!("archive/data/{i}"), st.bytes.clone()));
        }
        let bytes = zip_archive(&entries);
        if let Ok(ck) = inspect_bytes(&bytes) {
            for e in &ck.tensors {
                if e.float_dtype().is_some() {
                    let _ = read_bytes_f32(&bytes, e);
                }
            }
        }
    }

    /// Arbitrary bytes behind a pickle header, the zip magic or a safetensors length.
    #[test]
    fn arbitrary_bytes_never_panic(prefix in 0..3usize, tail in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes: Vec<u8> = match prefix {
            0 => seeds()[1][..15].to_vec(),
            1 => b"PK\x03\x04".to_vec(),
            _ => {
                let mut v = (tail.len() as u64).to_le_bytes().to_vec();
                v.push(b'{');
                v
            }
        };
        bytes.extend(tail);
        let _ = inspect_bytes(&bytes);
    }
}

#[test]
fn the_seeds_are_valid() {
    for s in seeds() {
        let ck = inspect_bytes(s).unwrap();
        for e in &ck.tensors {
            read_bytes_f32(s, e).unwrap();
        }
    }
    // The strided view reads what its strides say: a.t[i][j] = s[1 + i + 4 j].
    let ck = inspect_bytes(&seeds()[0]).unwrap();
    let t = read_bytes_f32(&seeds()[0], ck.tensor("a.t").unwrap()).unwrap();
    let want: Vec<f32> = (0..3).flat_map(|i| (0..2).map(move |j| (1 + i + 4 * j) as f32 * 0.25)).collect();
    assert_eq!(t.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
}
