//! MTCNN's networks (engines/src/mtcnn.rs) against facenet-pytorch's own PNet, RNet and ONet with
//! the same weights on the same inputs (`fixtures/mtcnn/nets_reference.json`, written by
//! scripts/make_mtcnn_fixtures.py; no Python runs here).

use cadence_engines::mtcnn::{self, MtcnnNets, MODEL_FILES};
use candle_core::{Device, Tensor};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn reference() -> Value {
    let path = root().join("fixtures/mtcnn/nets_reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The network's input as facenet-pytorch's `detect_face` makes it: (pixel - 127.5) * 0.0078125.
fn input(net: &Value) -> Tensor {
    let shape: Vec<usize> = net["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let x: Vec<f32> =
        net["pixels"].as_array().unwrap().iter().map(|p| (p.as_u64().unwrap() as f32 - 127.5) * 0.0078125).collect();
    Tensor::from_vec(x, shape, &Device::Cpu).unwrap()
}

/// Largest |ours - theirs| over an output, after checking its shape.
fn max_err(ours: &Tensor, theirs: &Value) -> f32 {
    let shape: Vec<usize> = theirs["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    assert_eq!(ours.dims(), &shape[..]);
    let ours = ours.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let theirs: Vec<f32> = theirs["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}

#[test]
fn embedded_weights_are_the_committed_files() {
    for ((path, sha), bytes) in MODEL_FILES.iter().zip(mtcnn::model_bytes()) {
        assert_eq!(format!("{:x}", Sha256::digest(bytes)), *sha, "{path} (embedded)");
        let file = std::fs::read(root().join(path)).unwrap();
        assert_eq!(format!("{:x}", Sha256::digest(&file)), *sha, "{path}");
    }
}

#[test]
fn networks_match_facenet_pytorch() {
    let r = reference();
    let nets = MtcnnNets::load(&Device::Cpu).unwrap();
    let tol = 1e-4;

    let p = &r["nets"]["pnet"];
    let (reg, prob) = nets.pnet.forward(&input(p)).unwrap();
    let errs = [max_err(&reg, &p["outputs"][0]), max_err(&prob, &p["outputs"][1])];
    println!("P-Net: max |ours - facenet-pytorch| regression {:e}, probability {:e}", errs[0], errs[1]);
    assert!(errs.iter().all(|&e| e < tol), "P-Net {errs:?}");

    let q = &r["nets"]["rnet"];
    let (reg, prob) = nets.rnet.forward(&input(q)).unwrap();
    let errs = [max_err(&reg, &q["outputs"][0]), max_err(&prob, &q["outputs"][1])];
    println!("R-Net: regression {:e}, probability {:e}", errs[0], errs[1]);
    assert!(errs.iter().all(|&e| e < tol), "R-Net {errs:?}");

    let o = &r["nets"]["onet"];
    let (reg, landmarks, prob) = nets.onet.forward(&input(o)).unwrap();
    let errs =
        [max_err(&reg, &o["outputs"][0]), max_err(&landmarks, &o["outputs"][1]), max_err(&prob, &o["outputs"][2])];
    println!("O-Net: regression {:e}, landmarks {:e}, probability {:e}", errs[0], errs[1], errs[2]);
    assert!(errs.iter().all(|&e| e < tol), "O-Net {errs:?}");
}

#[test]
fn wrong_input_shapes_are_refused() {
    let nets = MtcnnNets::load(&Device::Cpu).unwrap();
    let z = |s: &[usize]| Tensor::zeros(s, candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(nets.pnet.forward(&z(&[1, 3, 11, 40])).is_err());
    assert!(nets.pnet.forward(&z(&[1, 1, 20, 20])).is_err());
    assert!(nets.rnet.forward(&z(&[1, 3, 48, 48])).is_err());
    assert!(nets.onet.forward(&z(&[2, 3, 24, 24])).is_err());
    // The smallest P-Net input gives one output cell.
    assert_eq!(nets.pnet.forward(&z(&[1, 3, 12, 12])).unwrap().1.dims(), &[1, 2, 1, 1]);
}

/// The CPU P-Net (NHWC on the engines' convolutions) against the candle P-Net, itself checked
/// against facenet-pytorch above, on seeded images of odd and even sizes.
#[test]
fn cpu_pnet_matches_the_candle_pnet() {
    let nets = MtcnnNets::load(&Device::Cpu).unwrap();
    let fast = nets.pnet_cpu.as_ref().expect("on the CPU the fast P-Net is loaded");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for (h, w) in [(12, 12), (23, 31), (64, 47), (130, 97)] {
        let chw: Vec<f32> = (0..3 * h * w)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 56) as f32 - 127.5) * 0.0078125
            })
            .collect();
        let (reg, prob) =
            nets.pnet.forward(&Tensor::from_vec(chw.clone(), (1, 3, h, w), &Device::Cpu).unwrap()).unwrap();
        let (oh, ow) = (prob.dim(2).unwrap(), prob.dim(3).unwrap());
        let prob = prob.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let reg = reg.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut hwc = vec![0f32; 3 * h * w];
        for c in 0..3 {
            for i in 0..h * w {
                hwc[i * 3 + c] = chw[c * h * w + i];
            }
        }
        let m = fast.forward(hwc, h, w);
        assert_eq!((m.h, m.w), (oh, ow), "{h}x{w}");
        let cells = oh * ow;
        let mut err = 0f32;
        for i in 0..cells {
            err = err.max((m.prob[i] - prob[cells + i]).abs());
            for k in 0..4 {
                err = err.max((m.reg[i][k] - reg[k * cells + i]).abs());
            }
        }
        println!("{h}x{w}: max |cpu - candle| {err:e}");
        assert!(err < 1e-4, "{h}x{w}: {err}");
    }
}
