//! The instruction-set level of cadence's own vectorised CPU loops (the engines' im2col gather,
//! epilogues, GroupNorm+SiLU, softmax, GELU; the host's expansion, easing and compositing; the
//! media crate's Silero VAD network), chosen at run time, capped by `CADENCE_MAX_ISA`.
//!
//! Every level's loops are the same source compiled with more target features; multiplies and
//! adds are never fused and reductions keep their written order, so every level gives the same
//! bits (tests compare each level the machine can run with the baseline). The cap exists to
//! measure and test the lower levels on a machine that has the higher ones. The `gemm` crate
//! (built with its `x86-v4` AVX-512 kernels under cadence-engines' `gemm-avx512` feature) picks
//! its kernel from the CPU on its own; its kernel modules are private, so the cap does not reach
//! it (`cadence_engines::isa::describe` reports its choice).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The environment variable that caps the level: `baseline`, `avx2` or `avx512`.
pub const MAX_ISA_ENV: &str = "CADENCE_MAX_ISA";

/// A level of the x86-64 instruction set, lowest first (elsewhere every level is `Baseline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// What the build targets (x86-64: SSE2).
    Baseline,
    /// AVX2 with FMA and F16C (x86-64-v3's vector part).
    Avx2,
    /// AVX-512 F, BW, DQ and VL (x86-64-v4's vector part).
    Avx512,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Baseline, Isa::Avx2, Isa::Avx512];

    /// The name `CADENCE_MAX_ISA` takes and reports print.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Baseline => "baseline",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a [`Isa::name`].
    pub fn parse(s: &str) -> Result<Isa, String> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| format!("{MAX_ISA_ENV}={s:?}: expected one of baseline, avx2, avx512"))
    }

    /// Whether this CPU can run the level.
    pub fn supported(self) -> bool {
        match self {
            Isa::Baseline => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The highest level this CPU supports.
pub fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(|| Isa::ALL.into_iter().rev().find(|i| i.supported()).unwrap_or(Isa::Baseline))
}

/// `CADENCE_MAX_ISA` as set (read once): `Ok(None)` when unset or empty.
pub fn env_cap() -> Result<Option<Isa>, String> {
    static CAP: OnceLock<Result<Option<Isa>, String>> = OnceLock::new();
    CAP.get_or_init(|| match std::env::var(MAX_ISA_ENV) {
        Ok(v) if !v.trim().is_empty() => Isa::parse(&v).map(Some),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("{MAX_ISA_ENV}={v:?}: not UTF-8")),
    })
    .clone()
}

/// The highest level allowed: [`detected`], lowered by `CADENCE_MAX_ISA`.
///
/// # Panics
/// On an invalid `CADENCE_MAX_ISA` ([`check_env`] reports it as an error instead).
pub fn cap() -> Isa {
    match env_cap() {
        Ok(Some(c)) => c.min(detected()),
        Ok(None) => detected(),
        Err(e) => panic!("{e}"),
    }
}

const AUTO: u8 = u8::MAX;
static FORCED: AtomicU8 = AtomicU8::new(AUTO);

/// The level the loops run at now: [`cap`], unless [`force`] chose a lower one.
#[inline]
pub fn active() -> Isa {
    match FORCED.load(Ordering::Relaxed) {
        AUTO => cap(),
        i => Isa::ALL[i as usize],
    }
}

/// Runs the loops at `level` from now on (`None`: back to [`cap`]). Fails above [`cap`]. For
/// tests and benchmarks: every level gives the same results, only the speed differs.
pub fn force(level: Option<Isa>) -> Result<(), String> {
    let v = match level {
        None => AUTO,
        Some(l) if l <= cap() => l as u8,
        Some(l) => return Err(format!("instruction-set level {l} is above this machine's cap {}", cap())),
    };
    FORCED.store(v, Ordering::Relaxed);
    Ok(())
}

/// The levels this machine can run under the cap, lowest first (what the tests compare).
pub fn runnable() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|&i| i <= cap()).collect()
}

/// Checks `CADENCE_MAX_ISA`: binaries call it at start so that a bad value is an error, not a
/// panic inside the first vectorised loop.
pub fn check_env() -> Result<(), String> {
    env_cap().map(|_| ())
}

/// One line for reports: `avx2 (CPU: avx2; CADENCE_MAX_ISA unset)`, with `extra` (say, the gemm
/// kernel) added inside the brackets when not empty.
pub fn describe_with(extra: &str) -> String {
    let env = match env_cap() {
        Ok(Some(c)) => format!("{MAX_ISA_ENV}={c}"),
        Ok(None) => format!("{MAX_ISA_ENV} unset"),
        Err(e) => e,
    };
    let act = match env_cap() {
        Ok(_) => active().name(),
        Err(_) => "invalid",
    };
    let extra = if extra.is_empty() { String::new() } else { format!("; {extra}") };
    format!("{act} (CPU: {}; {env}{extra})", detected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for i in Isa::ALL {
            assert_eq!(Isa::parse(i.name()), Ok(i));
        }
        assert_eq!(Isa::parse(" AVX2 "), Ok(Isa::Avx2));
        let e = Isa::parse("avx1024").unwrap_err();
        assert!(e.contains("CADENCE_MAX_ISA") && e.contains("baseline, avx2, avx512"), "{e}");
        assert!(Isa::Baseline < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
    }

    #[test]
    fn levels_above_the_cap_cannot_be_forced() {
        assert!(detected().supported() && Isa::Baseline.supported());
        assert_eq!(runnable().last().copied(), Some(cap()));
        if cap() < Isa::Avx512 {
            assert!(force(Some(Isa::Avx512)).is_err());
        }
        assert_eq!(force(None), Ok(()));
    }
}
