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
    let rest = cadence::bench::test_data(dim, 1);
    let orig = cadence::bench::test_data(frames * dim, 2);
    let mut f = orig.clone();
    cadence::cpu::ease(&mut f, &rest, &d, ramp);
    for (i, (new, old)) in f.chunks(dim).zip(orig.chunks(dim)).enumerate() {
        assert!(new != old, "frame {i} was not eased");
        assert!(new != &rest[..], "frame {i} became the rest frame");
    }
}

#[test]
fn cpu_timings_have_the_requested_runs() {
    let b = cadence::Backend::Cpu;
    let r = Reps { warmup: 0, reps: 3 };
    let t = time_expand::<f32>(&b, 7, 3, 16, cadence::Method::Slerp, r).unwrap();
    assert_eq!(t.times_ms.len(), 3);
    // N = 7 at stride 3: keyframes 0, 3, 6.
    assert_eq!(t.compulsory_bytes, expand_bytes(3, 7, 16, 4));
    assert!(t.median_ms() >= t.min_ms());
    assert_eq!(copy_times(&b, 1000, r).unwrap().len(), 3);
    assert!(time_nv12::<f32>(&b, cadence::RgbLayout::packed(3, 4, 1), r).is_err(), "odd width is refused");
}
