//! Bounds on what a request can make cadence allocate: sizes that come from flags or file
//! headers are checked against the memory this machine has before anything is allocated, so a
//! typo (`--frames 4000000000`) is a clear error instead of an abort or a swapping machine.

use anyhow::{ensure, Result};

/// Bytes of memory available to new allocations (Linux: `MemAvailable`); `None` where unknown.
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses `what` if it needs more than the memory available now (or overflows the address
/// space). `bytes` is computed by the caller with checked arithmetic; `None` means it overflowed.
pub fn ensure_allocatable(bytes: Option<u128>, what: &str) -> Result<()> {
    let gb = |b: u128| b as f64 / 1e9;
    let Some(bytes) = bytes.filter(|&b| b <= isize::MAX as u128) else {
        anyhow::bail!("{what} would need more memory than this machine can address");
    };
    if let Some(avail) = available_bytes() {
        ensure!(
            bytes <= avail as u128,
            "{what} would need {:.1} GB of memory; {:.1} GB is available",
            gb(bytes),
            gb(avail as u128)
        );
    }
    Ok(())
}

/// `a * b * c` bytes, `None` on overflow.
pub fn product(factors: &[usize]) -> Option<u128> {
    factors.iter().try_fold(1u128, |acc, &f| acc.checked_mul(f as u128))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_more_than_available_and_overflow() {
        assert!(ensure_allocatable(Some(1024), "a small buffer").is_ok());
        let e = ensure_allocatable(product(&[4_000_000_000, 4096, 4]), "the output").unwrap_err().to_string();
        assert!(e.contains("the output would need 65536.0 GB"), "{e}");
        assert!(ensure_allocatable(product(&[usize::MAX, usize::MAX, 4]), "x")
            .unwrap_err()
            .to_string()
            .contains("address"));
    }
}
