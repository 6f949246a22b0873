//! The SIMT emulator itself: grid indices, the four shuffle modes against the PTX ISA's and the
//! CUDA guide's stated results, lockstep with divergent lanes, barriers, and every fault it
//! promises (gpu/src/emu.rs). The kernels are small closures using the same device intrinsics
//! `kernels.rs` uses; the real kernels are run by host/tests/kernels.rs and `gpu-check --emulate`.

use cadence_kernels::emu::device::*;
use cadence_kernels::emu::{launch, shfl_source, Access, Buffer, Fault, FaultKind, Mode};

const FULL: u32 = 0xffff_ffff;

fn lane() -> u32 {
    unsafe { thread_idx_x() % 32 }
}

fn gid() -> usize {
    unsafe { (block_idx_x() * block_dim_x() + thread_idx_x()) as usize }
}

/// One warp: out[lane] = f(lane).
fn warp(f: impl Fn(u32) -> f32 + Sync) -> Vec<f32> {
    let out = Buffer::<f32>::uninit("out", 32, 0.0);
    let p = out.ptr();
    launch("test", 1, 32, || unsafe { store(p, gid(), f(lane())) }).unwrap();
    out.written().unwrap()
}

fn expect_fault(r: Result<(), Box<Fault>>) -> Fault {
    *r.expect_err("the launch should have failed")
}

#[test]
fn indices_cover_the_grid_with_a_partial_last_warp() {
    let (grid, block) = (3u32, 70u32);
    let out = Buffer::<u32>::uninit("out", (grid * block * 4) as usize, 0);
    let p = out.ptr();
    launch("indices", grid, block, || unsafe {
        let g = gid();
        store(p, 4 * g, block_idx_x());
        store(p, 4 * g + 1, thread_idx_x());
        store(p, 4 * g + 2, block_dim_x());
        store(p, 4 * g + 3, grid_dim_x());
    })
    .unwrap();
    let v = out.written().unwrap();
    for b in 0..grid {
        for t in 0..block {
            let g = (b * block + t) as usize;
            assert_eq!(&v[4 * g..4 * g + 4], &[b, t, block, grid]);
        }
    }
}

#[test]
fn shuffle_modes_follow_the_ptx_rules_over_a_full_warp() {
    // Width 32 (CUDA's default): bfly/down/idx pass c = 0x1f, up passes c = 0.
    let v = warp(|l| unsafe { shfl_bfly_f32(FULL, l as f32, 5, 31) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == (l ^ 5) as f32), "{v:?}");
    // up by 3: lanes 0..3 have no source below them and keep their own value.
    let v = warp(|l| unsafe { shfl_up_f32(FULL, l as f32, 3, 0) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == if l < 3 { l } else { l - 3 } as f32), "{v:?}");
    // down by 3: lanes 29..32 keep their own value.
    let v = warp(|l| unsafe { shfl_down_f32(FULL, l as f32, 3, 31) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == if l + 3 > 31 { l } else { l + 3 } as f32), "{v:?}");
    // idx: the source is a per-lane operand.
    let v = warp(|l| unsafe { shfl_idx_f32(FULL, l as f32 * 10.0, (7 * l) % 32, 31) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == ((7 * l) % 32) as f32 * 10.0), "{v:?}");
}

#[test]
fn shuffle_segments_of_eight_lanes() {
    // CUDA's `width` w sets c = ((32 - w) << 8) | clamp: segment mask 0x18 for w = 8.
    let c_up = (32 - 8) << 8;
    let c = c_up | 0x1f;
    let v = warp(|l| unsafe { shfl_up_f32(FULL, l as f32, 1, c_up) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == if l % 8 == 0 { l } else { l - 1 } as f32), "{v:?}");
    let v = warp(|l| unsafe { shfl_down_f32(FULL, l as f32, 1, c) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == if l % 8 == 7 { l } else { l + 1 } as f32), "{v:?}");
    let v = warp(|l| unsafe { shfl_idx_f32(FULL, l as f32, 2, c) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == ((l & !7) | 2) as f32), "{v:?}");
    // The CUDA guide on __shfl_xor_sync with width < 32: a group may read from earlier groups,
    // and reading from a later group returns the lane's own value.
    let v = warp(|l| unsafe { shfl_bfly_f32(FULL, l as f32, 8, c) });
    assert!(v.iter().enumerate().all(|(l, &x)| x == if l & 8 != 0 { l ^ 8 } else { l } as f32), "{v:?}");
    // The source rule on its own, with its in-range predicate.
    assert_eq!(shfl_source(Mode::Bfly, 3, 8, c), (3, false));
    assert_eq!(shfl_source(Mode::Bfly, 11, 8, c), (3, true));
    assert_eq!(shfl_source(Mode::Idx, 13, 40, c), (8, true)); // b[4:0] = 8; 8 & !0x18 = 0: the segment's lane 0
}

#[test]
fn a_warp_sum_by_butterfly_is_the_same_in_every_lane() {
    let v = warp(|l| unsafe {
        let mut x = l as f32;
        for b in [16, 8, 4, 2, 1] {
            x += shfl_bfly_f32(FULL, x, b, 31);
        }
        x
    });
    assert!(v.iter().all(|&x| x == 496.0), "{v:?}");
}

#[test]
fn divergent_halves_shuffle_separately_then_reconverge() {
    let v = warp(|l| unsafe {
        let x = if l < 16 {
            shfl_bfly_f32(0x0000_ffff, l as f32, 1, 31)
        } else {
            // A different call site and mask: the other half need not be here.
            shfl_down_f32(0xffff_0000, l as f32, 2, 31)
        };
        shfl_idx_f32(FULL, x, 31 - l, 31)
    });
    for (l, &x) in v.iter().enumerate() {
        let src = 31 - l;
        let first = if src < 16 {
            src ^ 1
        } else if src + 2 > 31 {
            src
        } else {
            src + 2
        };
        assert_eq!(x, first as f32, "lane {l}");
    }
}

#[test]
fn a_mask_naming_an_exited_lane_is_a_fault() {
    let out = Buffer::<f32>::uninit("out", 32, 0.0);
    let p = out.ptr();
    let f = expect_fault(launch("early_exit", 1, 32, || unsafe {
        if lane() >= 16 {
            return;
        }
        store(p, gid(), shfl_bfly_f32(FULL, 1.0, 1, 31));
    }));
    assert_eq!(f.kernel, "early_exit");
    assert_eq!(f.at, Some((0, 0)));
    let msg = f.to_string();
    assert!(msg.contains("names lane 16, which has exited"), "{msg}");
    assert!(msg.starts_with("kernel early_exit, block 0, thread 0 (warp 0, lane 0): shfl.sync"), "{msg}");
}

#[test]
fn shuffle_rule_violations_are_faults() {
    // The caller is not in its own mask.
    let f = expect_fault(launch("not_member", 1, 32, || unsafe {
        shfl_bfly_f32(0x2, 1.0, 1, 31);
    }));
    assert!(f.to_string().contains("does not contain the calling lane 0"), "{f}");
    // A source lane outside the mask (lanes 0 and 1 read lane 5).
    let f = expect_fault(launch("outside", 1, 32, || unsafe {
        if lane() < 2 {
            shfl_idx_f32(0x3, 1.0, 5, 31);
        }
    }));
    assert!(f.to_string().contains("reads lane 5, which is not in the member mask"), "{f}");
    // A mask over a partial warp's missing lanes (block of 40: warp 1 has lanes 0..8).
    let f = expect_fault(launch("partial", 1, 40, || unsafe {
        shfl_bfly_f32(FULL, 1.0, 1, 31);
    }));
    assert_eq!(f.at, Some((0, 32)));
    assert!(f.to_string().contains("names lane 8, which does not exist"), "{f}");
    // Both halves name the whole warp but stop at different shuffles: they can never meet.
    let f = expect_fault(launch("deadlock", 1, 32, || unsafe {
        if lane() < 16 {
            shfl_bfly_f32(FULL, 1.0, 1, 31);
        } else {
            shfl_bfly_f32(FULL, 2.0, 1, 31);
        }
    }));
    assert!(f.to_string().contains("deadlock"), "{f}");
}

#[test]
fn barriers_order_the_block_and_make_its_writes_visible() {
    let n = 96u32;
    let buf = Buffer::<u32>::uninit("buf", n as usize, 0);
    let out = Buffer::<u32>::uninit("out", n as usize, 0);
    let (b, o) = (buf.ptr(), out.ptr());
    launch("barrier", 1, n, || unsafe {
        let t = thread_idx_x();
        store(b, t as usize, 3 * t);
        sync_threads();
        // Another warp's element, written before the barrier.
        store(o, t as usize, load(b, ((t + 40) % n) as usize));
    })
    .unwrap();
    let v = out.written().unwrap();
    assert!(v.iter().enumerate().all(|(t, &x)| x == 3 * ((t as u32 + 40) % n)), "{v:?}");
    // Without the barrier, the same read is a race.
    let buf = Buffer::<u32>::uninit("buf", n as usize, 0);
    let b = buf.ptr();
    let f = expect_fault(launch("no_barrier", 1, n, || unsafe {
        let t = thread_idx_x();
        store(b, t as usize, 3 * t);
        if t > 0 {
            load(b, t as usize - 1); // written by the thread before, which ran first here
        }
    }));
    assert!(matches!(f.kind, FaultKind::Race { access: Access::Load, .. }), "{f}");
    // A barrier some threads never reach.
    let f = expect_fault(launch("divergent_barrier", 1, 64, || unsafe {
        if thread_idx_x() < 32 {
            sync_threads();
        }
    }));
    assert!(f.to_string().contains("have exited and can never reach the barrier"), "{f}");
}

#[test]
fn out_of_bounds_accesses_name_the_buffer_the_index_and_the_thread() {
    let input = Buffer::from_slice("input", &[1.0f32; 100]);
    let out = Buffer::<f32>::uninit("output", 100, 0.0);
    let (i, o) = (input.ptr(), out.ptr());
    // Reads one past the end in the last thread of block 1 (blocks of 64).
    let f = expect_fault(launch("read_past", 2, 64, || unsafe {
        let g = gid();
        if g <= 100 {
            store(o, g.min(99), load(i, g));
        }
    }));
    assert_eq!(f.at, Some((1, 36)));
    assert_eq!(
        f.kind,
        FaultKind::OutOfBounds { access: Access::Load, buffer: "input".into(), elem: "f32", index: 100, len: 100 }
    );
    assert_eq!(
        f.to_string(),
        "kernel read_past, block 1, thread 36 (warp 1, lane 4): load from `input`[100] out of bounds (100 elements of f32)"
    );
    // A store before the start through an offset pointer.
    let f = expect_fault(launch("store_before", 1, 32, || unsafe {
        store(offset(o, 3), gid(), 0.0);
        if lane() == 7 {
            store(offset(o, 3), usize::MAX - 4, 1.0); // index -5 + 3 = -2
        }
    }));
    assert!(f.to_string().contains("store to `output`[-2] out of bounds"), "{f}");
    let f = expect_fault(launch("null", 1, 1, || unsafe {
        load(Ptr::<f32>::null(), 0);
    }));
    assert_eq!(f.kind, FaultKind::NullPointer { access: Access::Load });
}

#[test]
fn unwritten_memory_is_caught_when_read_on_the_device_and_on_the_host() {
    let buf = Buffer::<f32>::uninit("scratch", 64, 0.0);
    let p = buf.ptr();
    let f = expect_fault(launch("read_uninit", 1, 32, || unsafe {
        load(p, gid() + 1);
    }));
    assert!(matches!(f.kind, FaultKind::Uninitialized { index: 1, .. }), "{f}");
    // A launch covering half the buffer: the readback refuses it and says what is missing.
    let buf = Buffer::<f32>::uninit("frames", 64, 0.0);
    let p = buf.ptr();
    launch("half", 1, 32, || unsafe { store(p, gid(), 1.0) }).unwrap();
    let e = buf.written().unwrap_err();
    assert_eq!((e.first, e.count), (32, 32));
    assert_eq!(e.to_string(), "32 of the 64 elements of `frames` were never written (the first is element 32)");
    buf.copy_from(&[2.0; 64]);
    assert_eq!(buf.written().unwrap(), vec![2.0; 64]);
}

#[test]
fn two_threads_storing_one_element_is_a_race_across_blocks_too() {
    let buf = Buffer::<u8>::uninit("bytes", 8, 0);
    let p = buf.ptr();
    let f = expect_fault(launch("overlap", 2, 32, || unsafe {
        store(p, gid() / 8, 1);
    }));
    let msg = f.to_string();
    assert!(matches!(f.kind, FaultKind::Race { access: Access::Store, .. }), "{msg}");
    assert!(msg.contains("`bytes`[0], which block 0 thread 0 also wrote"), "{msg}");
    // A later launch may read and rewrite what an earlier one wrote.
    let buf = Buffer::<u8>::uninit("bytes", 64, 0);
    let p = buf.ptr();
    launch("write", 2, 32, || unsafe { store(p, gid(), 1) }).unwrap();
    launch("rewrite", 2, 32, || unsafe { store(p, 63 - gid(), load(p, 63 - gid()) + 1) }).unwrap();
    assert_eq!(buf.written().unwrap(), vec![2u8; 64]);
}

#[test]
fn other_faults_and_refused_configurations() {
    let f = expect_fault(launch("div", 1, 32, || unsafe {
        unchecked_div(5u32, std::hint::black_box(0));
    }));
    assert_eq!((f.kind, f.at), (FaultKind::DivisionByZero, Some((0, 0))));
    let f = expect_fault(launch("trap", 1, 1, || unsafe { trap() }));
    assert_eq!(f.kind, FaultKind::Trap);
    let f = expect_fault(launch("panics", 1, 4, || {
        if lane() == 2 {
            panic!("kernel bug");
        }
    }));
    assert_eq!((f.kind, f.at), (FaultKind::Panic("kernel bug".into()), Some((0, 2))));
    for (grid, block) in [(1, 0), (1, 1025), (0, 32)] {
        let f = expect_fault(launch("config", grid, block, || {}));
        assert!(matches!(f.kind, FaultKind::Config(_)) && f.at.is_none(), "{f}");
    }
}

#[test]
fn the_fault_reported_is_the_lowest_block_s() {
    // Blocks run in parallel; blocks 3 and 7 fault and block 3's is the one reported, every time.
    let buf = Buffer::from_slice("small", &[0u32; 4]);
    let p = buf.ptr();
    for _ in 0..20 {
        let f = expect_fault(launch("two_faults", 16, 32, || unsafe {
            let b = block_idx_x();
            if (b == 3 || b == 7) && lane() == 5 {
                load(p, 4 + b as usize);
            }
        }));
        assert_eq!(f.at, Some((3, 5)), "{f}");
    }
}
