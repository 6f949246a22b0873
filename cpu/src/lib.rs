//! Run-time choice between the baseline x86-64, AVX2 and AVX-512 builds of cadence's CPU loops:
//! [`isa`] says which level runs (the CPU's best, capped by `CADENCE_MAX_ISA`), [`simd_fn!`]
//! compiles one body at every level and calls the active one.
//!
//! A crate of its own so that every crate with hand-vectorised loops (the engines' convolutions
//! and norms, the media crate's Silero VAD network) follows the same cap and reports the same
//! level; it has no dependencies.

pub mod isa;

/// Defines `fn $name` that runs its body compiled for the active [`isa::Isa`] level. Same
/// code and operation order at every level (reductions use explicit 8-lane partial sums,
/// multiplies and adds are never fused), so all give identical bits.
#[macro_export]
macro_rules! simd_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),*) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn imp($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($a: $t),*) $(-> $r)? {
                    imp($($a),*)
                }
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($a: $t),*) $(-> $r)? {
                    imp($($a),*)
                }
                match $crate::isa::active() {
                    // SAFETY: active() never exceeds what the CPU supports (isa::detected).
                    $crate::isa::Isa::Avx512 => return unsafe { avx512($($a),*) },
                    // SAFETY: as above.
                    $crate::isa::Isa::Avx2 => return unsafe { avx2($($a),*) },
                    $crate::isa::Isa::Baseline => {}
                }
            }
            imp($($a),*)
        }
    };
}
