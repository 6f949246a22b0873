//! The interval rule (`slerp::interval_frames`) that the expansion kernel, the CPU path and the
//! schedule's per-frame positions share, against its definition written independently: frame f
//! belongs to the last keyframe interval that starts at or before it (frames before keyframe 0 to
//! the first interval), so every frame has exactly one writer.

use cadence_kernels::slerp::interval_frames;
use proptest::prelude::*;

/// The owner of frame `f` by the definition, from the sorted keyframe list.
fn owner(keys: &[u32], f: u32) -> usize {
    let m = keys.len();
    (0..m - 1).rev().find(|&j| keys[j] <= f).unwrap_or(0)
}

proptest! {
    #[test]
    fn every_frame_has_exactly_its_defined_writer(
        n in 2u32..400,
        picks in proptest::collection::btree_set(0u32..400, 2..40),
    ) {
        let keys: Vec<u32> = picks.into_iter().filter(|&k| k < n).collect();
        prop_assume!(keys.len() >= 2);
        let m = keys.len() as u32;
        let mut writers = vec![Vec::new(); n as usize];
        for j in 0..m - 1 {
            let (first, end) = interval_frames(j, m, keys[j as usize], keys[j as usize + 1], n);
            prop_assert!(first <= end && end <= n, "interval {j}: [{first}, {end}) of {n}");
            for f in first..end {
                writers[f as usize].push(j as usize);
            }
        }
        for f in 0..n {
            prop_assert_eq!(&writers[f as usize], &vec![owner(&keys, f)], "frame {}", f);
        }
    }
}

#[test]
fn the_ends_hold_the_outer_keyframes() {
    // Keyframes 3, 5, 9 of 12 frames: interval 0 writes 0..5 (0..3 hold keyframe 3), interval 1
    // writes 5..12 (9..12 hold keyframe 9).
    assert_eq!(interval_frames(0, 3, 3, 5, 12), (0, 5));
    assert_eq!(interval_frames(1, 3, 5, 9, 12), (5, 12));
}
