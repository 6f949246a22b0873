//! The instruction-set level of cadence's CPU loops: `cadence_cpu::isa` (detection, the
//! `CADENCE_MAX_ISA` cap, forcing a level), with what belongs to the engines added: the error type
//! of [`check_env`] and the kernel the `gemm` crate picks ([`gemm_kernel`], in [`describe`]).

pub use cadence_cpu::isa::*;

/// Checks `CADENCE_MAX_ISA`: binaries call it at start so that a bad value is an error, not a
/// panic inside the first vectorised loop.
pub fn check_env() -> crate::Result<()> {
    cadence_cpu::isa::check_env().map_err(crate::EngineError::BadInput)
}

/// The f32 kernel the `gemm` crate (and so candle's CPU matmul) runs on this CPU: the choice of
/// gemm-common 0.19's `init_gemm_fn` (`avx512f` with its `x86-v4` feature, which this crate's
/// `gemm-avx512` feature enables, else `fma`, else `scalar`), restated because gemm does not
/// report it.
pub fn gemm_kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if cfg!(feature = "gemm-avx512") && std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "fma";
        }
    }
    "scalar"
}

/// One line for reports: `avx2 (CPU: avx2; CADENCE_MAX_ISA unset; gemm kernel fma)`.
pub fn describe() -> String {
    describe_with(&format!("gemm kernel {}", gemm_kernel()))
}
