//! Kernel-benchmark helpers: compulsory byte counts and the easing case that touches every frame.

use experiments::kbench::*;

#[test]
fn compulsory_bytes_by_hand() {
    // N = 640 at stride 3: 214 keyframes of 4x32x32 f32 read, 640 frames written.
    assert_eq!(expand_bytes(214, 640, 4096, 4), (214 + 640) * 4096 * 4);
    assert_eq!(slerp_pairs_bytes(10, 100, 2), 3 * 10 * 100 * 2 + 40);
    assert_eq!(ease_bytes(10, 100, 4), (21 * 100 * 4 + 40) as u64);
    let l = cadence::RgbLayout::packed(1080, 1920, 2);
    assert_eq!(nv12_bytes(l, 4), (2 * 3 * 1080 * 1920 * 4 + 2 * 1080 * 1920 * 3 / 2) as u64);
    assert_eq!(gbps(2_000_000_000, 1000.0), 2.0);
}

#[test]
fn easing_benchmark_changes_every_frame() {
    // The benchmark's distances put every frame strictly inside a transition, so the kernel
    // must read and write each one (neither kept as is nor replaced by the rest frame).
    let (frames, dim, ramp) = (9usize, 64usize, 4u32);
    let d = transition_distances(frames, ramp);
    assert!(d.iter().all(|&x| x >= 1 && x < ramp), "{d:?}");
    let rest = cadence::measure::fixtures::test_data(dim, 1);
    let orig = cadence::measure::fixtures::test_data(frames * dim, 2);
    let mut f = orig.clone();
    cadence::backend::cpu::ease(&mut f, &rest, &d, ramp);
    for (i, (new, old)) in f.chunks(dim).zip(orig.chunks(dim)).enumerate() {
        assert!(new != old, "frame {i} was not eased");
        assert!(new != &rest[..], "frame {i} became the rest frame");
    }
}

#[test]
fn adaptive_run_counts() {
    let r = Reps { warmup: 1, min_reps: 5, max_reps: 51, target_ms: 40.0 };
    assert_eq!(r.count(100.0), 5, "long cases get the minimum");
    assert_eq!(r.count(2.0), 20);
    assert_eq!(r.count(0.01), 51, "short cases are capped");
    assert_eq!(r.count(0.0), 51);
    assert_eq!(Reps::fixed(0, 7).count(0.001), 7);
    assert_eq!(host_times(Reps { warmup: 0, min_reps: 3, max_reps: 9, target_ms: 1e9 }, || ()).len(), 9);
}

#[test]
fn cpu_timings_have_the_requested_runs() {
    let b = cadence::Backend::Cpu;
    let r = Reps::fixed(0, 3);
    let t = time_expand::<f32>(&b, 7, 3, 16, cadence::Method::Slerp, r).unwrap();
    assert_eq!(t.times_ms.len(), 3);
    // N = 7 at stride 3: keyframes 0, 3, 6.
    assert_eq!(t.compulsory_bytes, expand_bytes(3, 7, 16, 4));
    assert!(t.median_ms() >= t.min_ms());
    assert_eq!(copy_times(&b, 1000, r).unwrap().len(), 3);
    assert!(time_nv12::<f32>(&b, cadence::RgbLayout::packed(3, 4, 1), r).is_err(), "odd width is refused");
}

#[test]
fn copy_buffers_are_aligned_apart_and_disjoint() {
    for n in [1usize, 4095, 4096, 10_000, 1 << 20] {
        let mut buf = vec![7u8; 2 * n + 4 * 4096];
        let lo = buf.as_ptr() as usize;
        let hi = lo + buf.len();
        let (src, dst) = copy_buffers(&mut buf, n);
        assert_eq!((src.len(), dst.len()), (n, n));
        let (s, d) = (src.as_ptr() as usize, dst.as_ptr() as usize);
        assert_eq!(s % 4096, 0, "source page-aligned");
        assert_eq!((d - s) % 4096, 2048, "destination half a page off (no 4K aliasing)");
        assert!(s + n <= d, "disjoint");
        assert!(s >= lo && d + n <= hi);
    }
}

#[test]
fn benchmark_data_is_deterministic_nonzero_and_typed() {
    let a: Vec<f32> = data(1000, 3);
    let b: Vec<f32> = data(1000, 3);
    let c: Vec<f32> = data(1000, 4);
    assert_eq!(a, b, "same seed, same data");
    assert_ne!(a, c, "another seed, another window");
    assert!(a.iter().all(|v| v.is_finite()) && a.iter().filter(|v| **v == 0.0).count() < 5);
    let h: Vec<half::f16> = data(1000, 3);
    assert!(h.iter().zip(&a).all(|(x, y)| (x.to_f32() - y).abs() <= 2e-3 * y.abs().max(1e-3)));
    // Growing the pool regenerates it from the same sequence: earlier windows are unchanged.
    let big: Vec<f32> = data(3_000_000, 5);
    assert_eq!(big.len(), 3_000_000);
    assert_eq!(data::<f32>(1000, 3), a);
}
