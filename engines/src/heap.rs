//! The heap policy of the CPU engines: freed activation buffers stay in the process for the next
//! call instead of going back to the operating system.
//!
//! A CPU engine call allocates its activations afresh, a few large buffers per layer (one TAESD
//! decode of 8 crops at the reduced profile writes 21 MB per layer output). glibc serves a block
//! above its mmap threshold (128 KiB at start, raised as such blocks are freed, to at most 32 MiB)
//! with a fresh `mmap` and unmaps it on `free`, and it trims the heap's free top once that exceeds
//! twice the threshold. Either way the next call faults the same buffers in again, page by page,
//! each zeroed by the kernel: work that scales with the activations' size, not their FLOPs, so it
//! weighs most on the reduced profile and skews its scale model of the full one.
//!
//! Measured with `perf stat` on `cadence engine-bench` (cpu-reduced, 10 runs, a 2-vCPU AMD EPYC
//! with AVX-512, two runs each; docs/profiles.md): TAESD 230k page faults and 65-67 frames/s with
//! glibc's defaults, 22k and 73-83 frames/s with this policy; the SD VAE decoder 3.5M and 4.2-4.4
//! frames/s, 87k and 5.5 frames/s. Raising only the trim threshold made TAESD slower (49 frames/s):
//! glibc then freezes the mmap threshold at 128 KiB, so every large block is mapped afresh. In a
//! render (`stride_table --rounds 1 --strides 1,3`, same machine) the faults fell from 21.7M to
//! 0.27M and the kernel's share of the CPU time from 55 s to 4 s; stride 1's neural time from 54.8
//! to 37.4 s, the UNet's part too.
//!
//! The policy: no `mmap` for single blocks (`M_MMAP_MAX` 0), and the heap's free top kept up to
//! 2 GiB (`M_TRIM_THRESHOLD`). Freed memory stays mapped until a later allocation reuses it, so a
//! process holds about its peak; the render server gives it back after each render
//! (`malloc_trim`). It is set once, when a CPU device is first selected
//! ([`crate::select_device`], which Ditto's renders go through) or a MuseTalk engine is first
//! built on the CPU (for callers that name `Device::Cpu` themselves), and not at all when the
//! user has set glibc's malloc tunables (`GLIBC_TUNABLES` naming `mmap_max`, `mmap_threshold` or
//! `trim_threshold`, or their `MALLOC_..._` variables): theirs win.

use std::sync::OnceLock;

/// The largest free heap top glibc keeps before trimming it: 2 GiB, the largest value `mallopt`
/// takes (a C `int`).
pub const TRIM_THRESHOLD: i32 = i32::MAX;

/// Whether the user's environment sets the parameters this policy sets (glibc's tunables or
/// their older variable names).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn user_tunes_malloc() -> bool {
    const TUNABLES: [&str; 3] = ["glibc.malloc.mmap_max", "glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold"];
    const VARIABLES: [&str; 3] = ["MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"];
    let tunables = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| TUNABLES.iter().any(|n| t.contains(n)));
    tunables || VARIABLES.iter().any(|v| std::env::var_os(v).is_some())
}

/// Sets the policy (module docs) once per process; later calls only report it. Returns whether it
/// is in force: false off glibc and where the user's environment tunes malloc.
pub fn retain_freed_blocks() -> bool {
    static IN_FORCE: OnceLock<bool> = OnceLock::new();
    *IN_FORCE.get_or_init(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if !user_tunes_malloc() {
            // SAFETY: mallopt sets allocator parameters under the allocator's own lock; blocks
            // allocated before keep how they were made (an mmap'ed one is still unmapped on free).
            return unsafe {
                libc::mallopt(libc::M_MMAP_MAX, 0) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            };
        }
        false
    })
}
