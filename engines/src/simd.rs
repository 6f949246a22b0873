//! Run-time choice between the baseline x86-64, AVX2 and AVX-512 builds of the CPU paths' hot
//! loops: `cadence_cpu::simd_fn!`, at the level [`crate::isa::active`] returns.

pub(crate) use cadence_cpu::simd_fn;
