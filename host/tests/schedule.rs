use cadence::schedules::keyframes::speech_distance;
use cadence::KeyframeSchedule;
use proptest::prelude::*;

#[test]
fn true_keyframe_counts_at_640_frames() {
    let counts: Vec<usize> = (1..=4).map(|k| KeyframeSchedule::fixed_stride(640, k).unwrap().count()).collect();
    // 321 at k = 2: frame 639 is appended because 639 is odd (the source's table says 320).
    assert_eq!(counts, vec![640, 321, 214, 161]);
    let s = KeyframeSchedule::fixed_stride(640, 3).unwrap();
    assert_eq!(*s.keyframes().last().unwrap(), 639);
    assert!((s.duty_cycle() - 214.0 / 640.0).abs() < 1e-12);
}

#[test]
fn edge_cases() {
    assert_eq!(KeyframeSchedule::fixed_stride(1, 3).unwrap().keyframes(), &[0]);
    assert_eq!(KeyframeSchedule::fixed_stride(5, 9).unwrap().keyframes(), &[0, 4]);
    assert_eq!(KeyframeSchedule::fixed_stride(7, 3).unwrap().keyframes(), &[0, 3, 6]);
    assert_eq!(KeyframeSchedule::fixed_stride(8, 3).unwrap().keyframes(), &[0, 3, 6, 7]);
    assert!(KeyframeSchedule::fixed_stride(10, 0).unwrap_err().to_string().contains("stride"));
    assert!(KeyframeSchedule::fixed_stride(0, 2).is_err());
    assert!(KeyframeSchedule::explicit(10, &[]).is_err());
    assert!(KeyframeSchedule::explicit(10, &[0, 5, 5]).is_err());
    assert!(KeyframeSchedule::explicit(10, &[0, 6, 3]).is_err());
    assert!(KeyframeSchedule::explicit(10, &[0, 10]).is_err());
    assert_eq!(KeyframeSchedule::parse_list(10, "0, 3,9").unwrap().keyframes(), &[0, 3, 9]);
    assert!(KeyframeSchedule::parse_list(10, "0,x").is_err());
}

#[test]
fn speech_distance_without_speech_is_infinite() {
    assert_eq!(speech_distance(&[false, false]), vec![u32::MAX, u32::MAX]);
    assert_eq!(speech_distance(&[]), Vec::<u32>::new());
}

proptest! {
    #[test]
    fn frame_positions_are_consistent(n in 1usize..300, k in 1usize..40) {
        let s = KeyframeSchedule::fixed_stride(n, k).unwrap();
        let keys = s.keyframes();
        prop_assert_eq!(keys[0], 0);
        prop_assert_eq!(*keys.last().unwrap() as usize, n - 1);
        prop_assert!(keys.windows(2).all(|w| w[1] > w[0] && (w[1] - w[0]) as usize <= k));
        prop_assert_eq!(s.count(), (n - 1).div_ceil(k) + 1);
        let pos = s.frame_positions();
        prop_assert_eq!(pos.len(), n);
        for (f, &(j, a)) in pos.iter().enumerate() {
            prop_assert!((0.0..=1.0).contains(&a));
            if keys.len() > 1 {
                prop_assert!(keys[j] as usize <= f && f <= keys[j + 1] as usize);
            }
        }
    }
}
