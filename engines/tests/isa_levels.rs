//! Every instruction-set level of the engines' own loops (`cadence_engines::isa`) that this
//! machine can run gives the baseline's bits, through whole networks on the CPU fast path (the
//! TAESD decoder and encoder, the MuseTalk UNet, a Winograd convolution): the gather, the
//! epilogues, GroupNorm+SiLU, LayerNorm, softmax, GEGLU, exp and the Winograd transforms all run at each level. A level the CPU lacks (AVX-512 on an AVX2-only
//! machine) is recorded as skipped, as `scripts/test.sh` counts them.

use cadence_engines::bench::test_input;
use cadence_engines::isa::{self, Isa};
use cadence_engines::*;

/// The audio feature width at the reduced profile (this machine's scale arm).
fn aud() -> usize {
    unet::audio_dim(Profile::Cpu)
}

fn skipped(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("{test}: {reason}");
    eprintln!("SKIPPED: {line}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The outputs of every CPU fast path, at the level in force.
fn run_all() -> Vec<Vec<u32>> {
    let w = WeightsSource::Synthetic { seed: 21 };
    let dec = Taesd::decoder(Profile::Cpu, &w, &Device::Cpu).unwrap();
    let enc = Taesd::encoder(Profile::Cpu, &w, &Device::Cpu).unwrap();
    let unet = MuseTalkUnet::new(Profile::Cpu, &w, &Device::Cpu).unwrap();
    assert_eq!(unet.runtime(), Runtime::CpuKernels);
    vec![
        bits(&dec.decode(&test_input(vec![2, 4, 12, 10], 1)).unwrap().data),
        bits(&enc.encode(&test_input(vec![1, 3, 40, 24], 2)).unwrap().data),
        bits(&unet.predict(&test_input(vec![2, 8, 32, 32], 3), &test_input(vec![2, 50, aud()], 4)).unwrap().data),
        winograd_conv(),
    ]
}

/// A convolution wide enough for Winograd on this machine (with `gemm`'s AVX-512 kernel the
/// cpu-reduced networks above do not reach it): its input and output transforms at each level.
fn winograd_conv() -> Vec<u32> {
    use cadence_engines::conv::{conv3x3, winograd_min_channels, Nhwc, PackedConv};
    let c = winograd_min_channels();
    let p = PackedConv::new(c, c, &test_input(vec![c, c, 3, 3], 5).data, Some(test_input(vec![c], 6).data), 1);
    assert!(p.winograd.is_some());
    let x = Nhwc { n: 1, h: 5, w: 7, c, data: test_input(vec![1, 5, 7, c], 7).data };
    bits(&conv3x3(&x, &p, true, None, true).data)
}

#[test]
fn every_runnable_level_gives_the_baseline_bits() {
    isa::check_env().unwrap();
    isa::force(Some(Isa::Baseline)).unwrap();
    assert_eq!(isa::active(), Isa::Baseline);
    let want = run_all();
    for level in isa::runnable().into_iter().filter(|&l| l > Isa::Baseline) {
        isa::force(Some(level)).unwrap();
        assert_eq!(isa::active(), level);
        let got = run_all();
        isa::force(None).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let differ = g.iter().zip(w).filter(|(a, b)| a != b).count();
            assert!(differ == 0, "output {i}: {differ} of {} values differ between {level} and baseline", w.len());
        }
    }
    isa::force(None).unwrap();
    for level in Isa::ALL.into_iter().filter(|l| !isa::runnable().contains(l)) {
        skipped(
            &format!("every_runnable_level_gives_the_baseline_bits ({level})"),
            &format!("this machine's cap is {} ({})", isa::cap(), isa::describe()),
        );
    }
}
