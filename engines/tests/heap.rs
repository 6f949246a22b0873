//! The CPU engines' heap policy (`cadence_engines::heap`), in a process of its own: before a CPU
//! device is selected glibc maps a large block on its own and unmaps it on free; once one is
//! selected the block comes from the heap and stays there when freed, so the next engine call
//! reuses its pages instead of faulting them in again.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn selecting_the_cpu_keeps_freed_blocks_in_the_heap() {
    use cadence_engines::{heap, select_device, DeviceRequest};
    use std::hint::black_box;
    // Above glibc's largest dynamic mmap threshold (32 MiB), so its default is an mmap each time;
    // below the 64 MiB of a thread arena's heap, which glibc maps on its own in any case.
    const BLOCK: usize = 48 << 20;
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let stats = || unsafe { libc::mallinfo2() };

    let before = stats().hblkhd;
    let block = black_box(vec![1u8; BLOCK]);
    assert!(stats().hblkhd >= before + BLOCK, "by default glibc maps a 48 MiB block on its own");
    drop(block);

    select_device(DeviceRequest::Cpu).unwrap();
    assert!(heap::retain_freed_blocks(), "the policy is in force (no malloc tunables in this test's environment)");
    let before = stats().hblkhd;
    let block = black_box(vec![1u8; BLOCK]);
    assert!(stats().hblkhd < before + BLOCK, "with the policy the block comes from the heap, not an mmap of its own");
    drop(block);
    let free = stats().fordblks;
    assert!(free >= BLOCK, "the freed block stays in the heap ({free} bytes free), not trimmed");
}
