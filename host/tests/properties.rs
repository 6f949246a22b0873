//! Property tests of the interpolation invariants on random inputs (CPU path; the per-backend
//! tests in kernels.rs compare the GPU with the same references).

mod common;
use cadence::{backend::cpu, KeyframeSchedule, Method};
use common::*;
use proptest::prelude::*;

fn vec_strategy(dim: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-10.0f32..10.0, dim)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn slerp_norm_is_the_interpolated_norm((v0, v1) in (1usize..300).prop_flat_map(|d| (vec_strategy(d), vec_strategy(d))),
                                           alpha in 0.0f32..=1.0, s1 in 0.01f32..100.0) {
        let v1: Vec<f32> = v1.iter().map(|x| x * s1).collect();
        let (a, b) = (to64(&v0), to64(&v1));
        prop_assume!(norm(&a) > 1e-3 && norm(&b) > 1e-3);
        let theta = angle(&a, &b);
        prop_assume!(theta.sin() > 1e-2 || theta < 1.0); // away from antipodal (documented fallback)
        let mut out = vec![0.0f32; v0.len()];
        cpu::slerp_pairs(&v0, &v1, &[alpha], v0.len(), Method::Slerp, &mut out);
        let target = (1.0 - alpha as f64) * norm(&a) + alpha as f64 * norm(&b);
        // The chords' sums lose about a factor of the norms' ratio (gpu/src/slerp.rs, accuracy):
        // 4 f32 ulps per unit of ratio beside the well-separated bound.
        let ratio = norm(&a).max(norm(&b)) / norm(&a).min(norm(&b));
        let spread = 2.4e-7 * ratio;
        let rel = (norm(&to64(&out)) / target - 1.0).abs();
        prop_assert!(rel < (2e-5 + spread) / theta.sin().max(0.05), "norm off by {rel:e} (norm ratio {ratio}, theta {theta})");
        // The output lies at angle alpha * theta from v0 on the v0 -> v1 great circle.
        if alpha > 0.0 && theta > 1e-3 {
            let got = to64(&out);
            let tol = (5e-5 + spread) / theta.sin().max(0.05);
            prop_assert!((angle(&a, &got) - alpha as f64 * theta).abs() < tol);
            prop_assert!((angle(&got, &b) - (1.0 - alpha as f64) * theta).abs() < tol);
        }
    }

    #[test]
    fn expansion_reproduces_every_keyframe_exactly(n in 1usize..60, k in 1usize..12, dim in 1usize..40, seed in 0u64..1000) {
        let s = KeyframeSchedule::fixed_stride(n, k).unwrap();
        let keys = randn(&mut rng(seed), s.count() * dim);
        let mut out = vec![f32::NAN; n * dim];
        cpu::expand(&keys, &s, dim, Method::Slerp, &mut out);
        prop_assert!(out.iter().all(|x| x.is_finite()));
        for (j, &f) in s.keyframes().iter().enumerate() {
            prop_assert_eq!(&out[f as usize * dim..(f as usize + 1) * dim], &keys[j * dim..(j + 1) * dim]);
        }
    }
}
