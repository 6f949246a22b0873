//! Runtime choice between baseline x86-64 and AVX2 builds of the CPU paths' hot loops.

/// Defines `fn $name` that runs its body compiled for AVX2 when the CPU has it (checked once and
/// cached by std), else for the baseline x86-64. Same code and operation order (reductions use
/// explicit 8-lane partial sums, multiplies and adds are never fused), so both give identical bits.
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
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2 (checked just above).
                    return unsafe { avx2($($a),*) };
                }
            }
            imp($($a),*)
        }
    };
}

pub(crate) use simd_fn;
