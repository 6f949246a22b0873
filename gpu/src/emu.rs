//! A SIMT emulator for the kernels: `kernels.rs` compiled for the host, with the device
//! intrinsics of `shim.rs` backed by an emulated grid (`device`). What it models and checks
//! (gpu/README.md has the user's view):
//!
//! - **Grid**: 1-D blocks and threads (`%ctaid.x`, `%tid.x`, `%ntid.x`, `%nctaid.x`); lane =
//!   thread index mod 32. Blocks are independent (no shared memory), so they run in any order,
//!   on as many host threads as there are cores; a block's threads run one at a time.
//! - **Warps in lockstep at every shuffle**: each GPU thread is a stackful coroutine. A thread
//!   that reaches `shfl.sync` stops there; once every lane its member mask names is stopped at
//!   the same shuffle (same call site, same mask, same mode), all of them get their values and go
//!   on. Divergent code and early exits behave as on the hardware, and the PTX rules become
//!   errors: a mask that does not contain the calling lane, names a lane that has exited or does
//!   not exist, a source lane outside the mask, or lanes that can never meet (deadlock).
//!   `up`/`down`/`bfly`/`idx` follow the PTX ISA's pseudo-code, clamp and segment mask included.
//! - **Barriers** (`bar.sync 0`, `__syncthreads`): all threads of the block meet; a barrier
//!   reached while some threads of the block have exited is an error.
//! - **Memory**: device buffers (`Buffer`) are allocations with a name; a device pointer
//!   (`DevPtr`) is an allocation and an element offset. Every load and store is checked: out of
//!   the allocation's bounds, a read of an element nothing has written (host upload or kernel
//!   store), a read of an element another thread wrote in the same launch, and a store to an
//!   element another thread stored in the same launch (data races: the kernels have no barriers
//!   or atomics, so threads may not communicate through memory within a launch). A store after
//!   another thread's read is not detected (that would need every reader recorded). Memory is
//!   accessed through relaxed atomics, so even a racy kernel is defined behaviour here.
//! - **Faults**: the first violation stops the launch, which returns a `Fault` naming the
//!   kernel, the block, the thread and what went wrong (for memory: the buffer and the index). A
//!   panic in the kernel code, `trap` and integer division by zero are faults too.
//!
//! Not modelled: timing, the memory model beyond "no thread sees another's writes within a
//! launch", float contraction (the PTX uses `add.rn`/`mul.rn`, which ptxas does not fuse, so
//! f32 results agree with the host's to the bit; `sqrt.rn` and `fma.rn` are IEEE on both), and
//! resource limits (registers, occupancy).

use core::cell::Cell;
use core::marker::PhantomData;
use core::panic::Location;
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::format;
use std::prelude::rust_2021::*;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

// ---------------------------------------------------------------------------------------------
// Memory

/// Element types a device buffer can hold.
pub trait Scalar: Copy + Send + Sync + 'static {
    #[doc(hidden)]
    type Atom: Send + Sync;
    /// For messages: `f32`, `u8`, ...
    const NAME: &'static str;
    #[doc(hidden)]
    fn atom(v: Self) -> Self::Atom;
    #[doc(hidden)]
    fn get(a: &Self::Atom) -> Self;
    #[doc(hidden)]
    fn set(a: &Self::Atom, v: Self);
}

macro_rules! scalar {
    ($t:ty, $atom:ty, $name:literal, $to:expr, $from:expr) => {
        impl Scalar for $t {
            type Atom = $atom;
            const NAME: &'static str = $name;
            #[inline(always)]
            fn atom(v: $t) -> $atom {
                <$atom>::new($to(v))
            }
            #[inline(always)]
            fn get(a: &$atom) -> $t {
                $from(a.load(Relaxed))
            }
            #[inline(always)]
            fn set(a: &$atom, v: $t) {
                a.store($to(v), Relaxed)
            }
        }
    };
}
scalar!(f32, AtomicU32, "f32", f32::to_bits, f32::from_bits);
scalar!(u32, AtomicU32, "u32", |v: u32| v, |v: u32| v);
scalar!(u8, AtomicU8, "u8", |v: u8| v, |v: u8| v);
scalar!(half::f16, AtomicU16, "f16", half::f16::to_bits, half::f16::from_bits);

/// Shadow state of one element: who wrote it last. `NEVER`: nothing (a read is a fault); `HOST`:
/// the host (upload); otherwise [`stamp`] of the launch, the block's barrier phase and the
/// thread that stored it. Launch epochs are unique (mod 2^24), so older launches' writes read as
/// plain initialised data.
const NEVER: u64 = 0;
const HOST: u64 = 1;
const EPOCH_SHIFT: u32 = 40;
const PHASE_SHIFT: u32 = 32;

/// `epoch (24 bits) | phase (8 bits) | global thread index + 1 (32 bits)`.
fn stamp(epoch: u32, phase: u32, id: u32) -> u64 {
    (epoch as u64) << EPOCH_SHIFT | ((phase & 0xff) as u64) << PHASE_SHIFT | id as u64
}

struct Header {
    data: *const u8,
    len: usize,
    shadow: *const AtomicU64,
    name: String,
    elem: &'static str,
}

/// A device allocation in the emulator: `len` elements of `T`, with a name for fault reports.
pub struct Buffer<T: Scalar> {
    data: Box<[T::Atom]>,
    shadow: Box<[AtomicU64]>,
    header: Box<Header>,
}

// SAFETY: the header's pointers point into `data` and `shadow`, which the buffer owns and never
// reallocates; all access to them goes through atomics.
unsafe impl<T: Scalar> Send for Buffer<T> {}
unsafe impl<T: Scalar> Sync for Buffer<T> {}

impl<T: Scalar> Buffer<T> {
    fn make(name: &str, data: Box<[T::Atom]>, state: u64) -> Self {
        let shadow: Box<[AtomicU64]> = (0..data.len()).map(|_| AtomicU64::new(state)).collect();
        let header = Box::new(Header {
            data: data.as_ptr() as *const u8,
            len: data.len(),
            shadow: shadow.as_ptr(),
            name: name.into(),
            elem: T::NAME,
        });
        Self { data, shadow, header }
    }

    /// A buffer holding a copy of `v` (a host-to-device copy).
    pub fn from_slice(name: &str, v: &[T]) -> Self {
        Self::make(name, v.iter().map(|&x| T::atom(x)).collect(), HOST)
    }

    /// `len` elements that nothing has written yet (`cuMemAlloc`): a kernel that reads one
    /// before writing it faults, and [`Self::written`] refuses to read it back.
    pub fn uninit(name: &str, len: usize, fill: T) -> Self {
        Self::make(name, (0..len).map(|_| T::atom(fill)).collect(), NEVER)
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn name(&self) -> &str {
        &self.header.name
    }

    /// The device pointer to element 0. Valid while the buffer lives (as a CUDA device pointer
    /// is valid until its allocation is freed).
    pub fn ptr(&self) -> DevPtr<T> {
        DevPtr { header: &*self.header, off: 0, _t: PhantomData }
    }

    /// The contents as they are (a device-to-host copy), written or not.
    pub fn to_vec(&self) -> Vec<T> {
        self.data.iter().map(T::get).collect()
    }

    /// Overwrites the contents from the host (a host-to-device copy); lengths must match.
    pub fn copy_from(&self, v: &[T]) {
        assert_eq!(v.len(), self.len(), "copy of {} elements into `{}` of {}", v.len(), self.name(), self.len());
        for ((d, s), &x) in self.data.iter().zip(self.shadow.iter()).zip(v) {
            T::set(d, x);
            s.store(HOST, Relaxed);
        }
    }

    /// Marks `range` as never written (the host does not know its contents): for an output a
    /// launch must write in full inside a buffer whose rest is input, so that
    /// [`Self::written`] catches a launch that missed part of it.
    pub fn discard(&self, range: core::ops::Range<usize>) {
        for s in &self.shadow[range] {
            s.store(NEVER, Relaxed);
        }
    }

    /// The elements nothing has written, as (first index, count); `None` when every element
    /// was uploaded or stored.
    pub fn unwritten(&self) -> Option<(usize, usize)> {
        let first = self.shadow.iter().position(|s| s.load(Relaxed) == NEVER)?;
        Some((first, self.shadow[first..].iter().filter(|s| s.load(Relaxed) == NEVER).count()))
    }

    /// The contents, if every element has been written (by an upload or a kernel): reading back
    /// memory a launch should have filled and did not is the symptom of a launch that covered
    /// too little of its output (too few blocks, a wrong bound).
    pub fn written(&self) -> Result<Vec<T>, Unwritten> {
        match self.unwritten() {
            None => Ok(self.to_vec()),
            Some((first, count)) => Err(Unwritten { buffer: self.name().into(), len: self.len(), first, count }),
        }
    }
}

/// Elements of a buffer that no upload and no kernel wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwritten {
    pub buffer: String,
    pub len: usize,
    pub first: usize,
    pub count: usize,
}

impl core::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} of the {} elements of `{}` were never written (the first is element {})",
            self.count, self.len, self.buffer, self.first
        )
    }
}

impl std::error::Error for Unwritten {}

/// A device pointer: an allocation and an element offset into it, which may point anywhere
/// (as on the GPU, computing an address is never an error; accessing it out of bounds is).
pub struct DevPtr<T> {
    header: *const Header,
    off: isize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}
// SAFETY: a device pointer is an address; the memory behind it is accessed through atomics.
unsafe impl<T> Send for DevPtr<T> {}
unsafe impl<T> Sync for DevPtr<T> {}

impl<T> DevPtr<T> {
    /// The pointer `n` elements further.
    pub fn offset(self, n: usize) -> Self {
        Self { off: self.off.wrapping_add(n as isize), ..self }
    }

    /// A pointer to nothing: every access through it faults.
    pub fn null() -> Self {
        Self { header: core::ptr::null(), off: 0, _t: PhantomData }
    }
}

// ---------------------------------------------------------------------------------------------
// Faults

/// Whether an access read or wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Load,
    Store,
}

/// What went wrong in a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The launch configuration itself (as `cuLaunchKernel` would refuse it).
    Config(String),
    OutOfBounds {
        access: Access,
        buffer: String,
        elem: &'static str,
        index: i128,
        len: usize,
    },
    NullPointer {
        access: Access,
    },
    /// A read of an element that neither the host nor a kernel has written.
    Uninitialized {
        buffer: String,
        index: usize,
    },
    /// Two threads of the launch touched one element and at least one of them wrote it.
    Race {
        access: Access,
        buffer: String,
        index: usize,
        other_block: u32,
        other_thread: u32,
    },
    /// A `shfl.sync` that breaks the PTX rules (member mask, source lane, deadlock).
    Shuffle(String),
    /// A `bar.sync` that not every thread of the block reaches.
    Barrier(String),
    DivisionByZero,
    Trap,
    /// A panic in the kernel code (e.g. an arithmetic overflow in a debug build).
    Panic(String),
}

/// A failed launch: the kernel, the block and thread where it failed (none for a refused
/// configuration), and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kernel: String,
    /// (block, thread)
    pub at: Option<(u32, u32)>,
    pub kind: FaultKind,
}

impl core::fmt::Display for Fault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "kernel {}", self.kernel)?;
        if let Some((b, t)) = self.at {
            write!(f, ", block {b}, thread {t} (warp {}, lane {})", t / 32, t % 32)?;
        }
        let access = |a: &Access| if *a == Access::Load { "load from" } else { "store to" };
        match &self.kind {
            FaultKind::Config(m) => write!(f, ": invalid launch: {m}"),
            FaultKind::OutOfBounds { access: a, buffer, elem, index, len } => {
                write!(f, ": {} `{buffer}`[{index}] out of bounds ({len} elements of {elem})", access(a))
            }
            FaultKind::NullPointer { access: a } => write!(f, ": {} a null device pointer", access(a)),
            FaultKind::Uninitialized { buffer, index } => {
                write!(f, ": load from `{buffer}`[{index}], which nothing has written")
            }
            FaultKind::Race { access: a, buffer, index, other_block, other_thread } => write!(
                f,
                ": data race: {} `{buffer}`[{index}], which block {other_block} thread {other_thread} {} in the same launch",
                access(a),
                if *a == Access::Load { "wrote" } else { "also wrote" }
            ),
            FaultKind::Shuffle(m) => write!(f, ": shfl.sync: {m}"),
            FaultKind::Barrier(m) => write!(f, ": bar.sync: {m}"),
            FaultKind::DivisionByZero => write!(f, ": integer division by zero"),
            FaultKind::Trap => write!(f, ": trap"),
            FaultKind::Panic(m) => write!(f, ": panicked: {m}"),
        }
    }
}

impl std::error::Error for Fault {}

// ---------------------------------------------------------------------------------------------
// Launches

/// Threads per block and blocks per grid the hardware allows (1-D).
pub const MAX_BLOCK: u32 = 1024;
pub const MAX_GRID: u32 = (1 << 31) - 1;
/// Each emulated thread's stack (virtual memory; pages are committed as used). Kernels are
/// shallow; the margin is for unwinding out of a fault.
const STACK_BYTES: usize = 256 * 1024;

static EPOCH: AtomicU32 = AtomicU32::new(1);

struct LaunchInfo<'a> {
    kernel: &'a str,
    grid: u32,
    block: u32,
    epoch: u32,
}

/// The emulated thread whose code is running on this host thread.
struct Lane {
    launch: *const LaunchInfo<'static>,
    block: u32,
    thread: u32,
    /// Global thread index + 1 (0 is never a thread: see the shadow encoding).
    id: u32,
    /// Barriers this thread's block has passed: writes of an earlier phase by another thread of
    /// the block are ordered before this thread's accesses.
    phase: Cell<u32>,
    yielder: Cell<*const Yielder<u32, Wait>>,
}

std::thread_local! {
    static CURRENT: Cell<*const Lane> = const { Cell::new(core::ptr::null()) };
}

fn current() -> &'static Lane {
    let p = CURRENT.with(|c| c.get());
    assert!(!p.is_null(), "a device intrinsic was called outside an emulated launch");
    // SAFETY: set by the scheduler to a lane that outlives the coroutine running this code.
    unsafe { &*p }
}

fn launch_info(lane: &Lane) -> &LaunchInfo<'static> {
    // SAFETY: the launch outlives all its lanes.
    unsafe { &*lane.launch }
}

/// Stops the current emulated thread with a fault. `resume_unwind` does not run the panic hook,
/// so a fault prints nothing; the launch returns it as its error.
#[cold]
fn fault(kind: FaultKind) -> ! {
    let lane = current();
    let f = Fault { kernel: launch_info(lane).kernel.into(), at: Some((lane.block, lane.thread)), kind };
    std::panic::resume_unwind(Box::new(f))
}

/// Where a thread waits for others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    Shuffle(Shfl),
    Barrier(&'static Location<'static>),
}

/// The four `shfl.sync` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shfl {
    mode: Mode,
    mask: u32,
    value: u32,
    b: u32,
    c: u32,
    site: &'static Location<'static>,
}

/// The lane a `shfl.sync` reads and whether it is in range (`p`), as the PTX ISA defines it:
/// `c[4:0]` is the clamp value, `c[12:8]` the segment mask; out of range, a lane reads itself.
pub fn shfl_source(mode: Mode, lane: u32, b: u32, c: u32) -> (u32, bool) {
    let (lane, bval, cval, segmask) = (lane as i32, (b & 31) as i32, (c & 31) as i32, ((c >> 8) & 31) as i32);
    let max_lane = (lane & segmask) | (cval & !segmask);
    let min_lane = lane & segmask;
    let (j, pval) = match mode {
        Mode::Up => (lane - bval, lane - bval >= max_lane),
        Mode::Down => (lane + bval, lane + bval <= max_lane),
        Mode::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
        Mode::Idx => (min_lane | (bval & !segmask), (min_lane | (bval & !segmask)) <= max_lane),
    };
    if pval {
        (j as u32, true)
    } else {
        (lane as u32, false)
    }
}

fn suspend(s: Wait) -> u32 {
    let lane = current();
    let y = lane.yielder.get();
    // SAFETY: set when the lane's coroutine started; the coroutine is running (we are on it).
    unsafe { &*y }.suspend(s)
}

type Co = Coroutine<u32, Wait, (), DefaultStack>;

enum State {
    Waiting(Wait),
    Exited,
}

/// Runs `kernel_fn` once per thread of a `grid` x `block` launch and returns the first fault (the
/// one in the lowest block; blocks run in parallel, so later blocks may or may not have run).
/// `kernel` names the kernel in fault reports.
pub fn launch<F: Fn() + Sync>(kernel: &str, grid: u32, block: u32, kernel_fn: F) -> Result<(), Box<Fault>> {
    let config = |m: String| Err(Box::new(Fault { kernel: kernel.into(), at: None, kind: FaultKind::Config(m) }));
    if block == 0 || block > MAX_BLOCK {
        return config(format!("{block} threads per block (1 to {MAX_BLOCK} allowed)"));
    }
    if grid == 0 || grid > MAX_GRID {
        return config(format!("{grid} blocks (1 to {MAX_GRID} allowed)"));
    }
    if (grid as u64) * (block as u64) >= u32::MAX as u64 {
        return config(format!("{grid} x {block} threads: more than the emulator numbers"));
    }
    let mut epoch = EPOCH.fetch_add(1, Relaxed) & 0xff_ffff;
    while epoch == 0 {
        epoch = EPOCH.fetch_add(1, Relaxed) & 0xff_ffff;
    }
    // SAFETY (of the 'static): lanes point at `info` only while this function runs.
    let info = LaunchInfo { kernel, grid, block, epoch };
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(grid as usize);
    let next = AtomicU32::new(0);
    let lowest_fault = AtomicU32::new(u32::MAX);
    let first: Mutex<Option<Box<Fault>>> = Mutex::new(None);
    let work = || {
        let mut w = Worker { stacks: Vec::new(), info: (&info as *const LaunchInfo<'_>).cast() };
        loop {
            let b = next.fetch_add(1, Relaxed);
            if b >= grid || b > lowest_fault.load(Relaxed) {
                break;
            }
            if let Err(f) = w.run_block(b, &kernel_fn) {
                lowest_fault.fetch_min(b, Relaxed);
                let mut slot = first.lock().unwrap_or_else(|e| e.into_inner());
                if slot.as_ref().is_none_or(|g| g.at > f.at) {
                    *slot = Some(f);
                }
            }
        }
    };
    if workers <= 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(work);
            }
        });
    }
    match first.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

struct Worker {
    /// Stacks of finished coroutines, reused: a kernel without shuffles needs one at a time.
    stacks: Vec<DefaultStack>,
    info: *const LaunchInfo<'static>,
}

struct Block<'f, F> {
    lanes: Vec<Lane>,
    cos: Vec<Option<Co>>,
    state: Vec<State>,
    exited: usize,
    kernel_fn: &'f F,
}

impl Worker {
    fn info(&self) -> &LaunchInfo<'static> {
        // SAFETY: the launch outlives its workers.
        unsafe { &*self.info }
    }

    fn fault_at(&self, block: u32, thread: u32, kind: FaultKind) -> Box<Fault> {
        Box::new(Fault { kernel: self.info().kernel.into(), at: Some((block, thread)), kind })
    }

    fn run_block<F: Fn() + Sync>(&mut self, b: u32, kernel_fn: &F) -> Result<(), Box<Fault>> {
        let n = self.info().block;
        let lanes: Vec<Lane> = (0..n)
            .map(|t| Lane {
                launch: self.info,
                block: b,
                thread: t,
                id: b * n + t + 1,
                phase: Cell::new(0),
                yielder: Cell::new(core::ptr::null()),
            })
            .collect();
        let mut blk = Block {
            lanes,
            cos: (0..n).map(|_| None).collect(),
            state: (0..n).map(|_| State::Exited).collect(),
            exited: 0,
            kernel_fn,
        };
        // Each thread runs until it exits or stops at a shuffle or barrier.
        for t in 0..n as usize {
            self.start(&mut blk, t)?;
        }
        while blk.exited < n as usize {
            let mut progress = false;
            for w in 0..n.div_ceil(32) as usize {
                progress |= self.resolve_shuffles(&mut blk, b, w)?;
            }
            progress |= self.resolve_barrier(&mut blk, b)?;
            if !progress {
                return Err(self.deadlock(&blk, b));
            }
        }
        Ok(())
    }

    fn start<F: Fn() + Sync>(&mut self, blk: &mut Block<'_, F>, t: usize) -> Result<(), Box<Fault>> {
        let stack = match self.stacks.pop() {
            Some(s) => s,
            None => DefaultStack::new(STACK_BYTES).expect("cannot map a stack for an emulated GPU thread"),
        };
        let lane: *const Lane = &blk.lanes[t];
        let f = blk.kernel_fn;
        let body = move |y: &Yielder<u32, Wait>, _: u32| {
            // SAFETY: the lane outlives its coroutine (both belong to the block being run).
            unsafe { &*lane }.yielder.set(y);
            f();
        };
        // SAFETY: the coroutine borrows `f` and the lane, which outlive it: the block's
        // coroutines finish or are dropped before `run_block` returns.
        blk.cos[t] = Some(unsafe { Co::with_stack_unchecked(stack, body) });
        self.step(blk, t, 0)
    }

    /// Runs thread `t` until it exits or waits; `input` is what its pending shuffle returns.
    fn step<F>(&mut self, blk: &mut Block<'_, F>, t: usize, input: u32) -> Result<(), Box<Fault>> {
        let co = blk.cos[t].as_mut().expect("a live thread");
        CURRENT.with(|c| c.set(&blk.lanes[t]));
        let r = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| co.resume(input)));
        CURRENT.with(|c| c.set(core::ptr::null()));
        match r {
            Ok(CoroutineResult::Yield(s)) => {
                blk.state[t] = State::Waiting(s);
                Ok(())
            }
            Ok(CoroutineResult::Return(())) => {
                blk.state[t] = State::Exited;
                blk.exited += 1;
                self.stacks.push(blk.cos[t].take().expect("a live thread").into_stack());
                Ok(())
            }
            Err(payload) => {
                // A panicked coroutine has finished: its stack can be reused.
                self.stacks.push(blk.cos[t].take().expect("a live thread").into_stack());
                Err(match payload.downcast::<Fault>() {
                    Ok(f) => f,
                    Err(p) => {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a non-string panic".into());
                        self.fault_at(blk.lanes[t].block, t as u32, FaultKind::Panic(msg))
                    }
                })
            }
        }
    }

    /// Completes every shuffle of warp `w` whose member lanes have all arrived at it.
    fn resolve_shuffles<F>(&mut self, blk: &mut Block<'_, F>, b: u32, w: usize) -> Result<bool, Box<Fault>> {
        let n = blk.lanes.len();
        let base = w * 32;
        let width = (n - base).min(32);
        let mut progress = false;
        for l in 0..width {
            let State::Waiting(Wait::Shuffle(s)) = blk.state[base + l] else { continue };
            let here = |kind| self.fault_at(b, (base + l) as u32, kind);
            if s.mask & (1 << l) == 0 {
                return Err(here(FaultKind::Shuffle(format!(
                    "member mask {:#010x} at {} does not contain the calling lane {l}",
                    s.mask, s.site
                ))));
            }
            let mut ready = true;
            for m in lanes_of(s.mask) {
                if m as usize >= width {
                    return Err(here(FaultKind::Shuffle(format!(
                        "member mask {:#010x} at {} names lane {m}, which does not exist (the block has {n} threads)",
                        s.mask, s.site
                    ))));
                }
                match blk.state[base + m as usize] {
                    State::Exited => {
                        return Err(here(FaultKind::Shuffle(format!(
                            "member mask {:#010x} at {} names lane {m}, which has exited",
                            s.mask, s.site
                        ))))
                    }
                    State::Waiting(Wait::Shuffle(o)) if o.site == s.site && o.mask == s.mask && o.mode == s.mode => {}
                    State::Waiting(_) => ready = false,
                }
            }
            if !ready {
                continue;
            }
            let mut results = [0u32; 32];
            for m in lanes_of(s.mask) {
                let State::Waiting(Wait::Shuffle(o)) = blk.state[base + m as usize] else { unreachable!() };
                let (j, _) = shfl_source(o.mode, m, o.b, o.c);
                if s.mask & (1 << j) == 0 {
                    return Err(self.fault_at(
                        b,
                        (base + m as usize) as u32,
                        FaultKind::Shuffle(format!(
                            "lane {m} reads lane {j}, which is not in the member mask {:#010x} ({:?} at {})",
                            s.mask, o.mode, s.site
                        )),
                    ));
                }
                let State::Waiting(Wait::Shuffle(src)) = blk.state[base + j as usize] else { unreachable!() };
                results[m as usize] = src.value;
            }
            for m in lanes_of(s.mask) {
                self.step(blk, base + m as usize, results[m as usize])?;
            }
            progress = true;
        }
        Ok(progress)
    }

    /// Releases a barrier once every thread of the block waits at it.
    fn resolve_barrier<F>(&mut self, blk: &mut Block<'_, F>, b: u32) -> Result<bool, Box<Fault>> {
        let mut first: Option<(usize, &'static Location<'static>)> = None;
        for (t, s) in blk.state.iter().enumerate() {
            match s {
                State::Waiting(Wait::Barrier(site)) => {
                    if let Some((t0, site0)) = first {
                        if *site != site0 {
                            return Err(self.fault_at(
                                b,
                                t as u32,
                                FaultKind::Barrier(format!(
                                    "waits at {site} while thread {t0} waits at another barrier, {site0}"
                                )),
                            ));
                        }
                    } else {
                        first = Some((t, site));
                    }
                }
                State::Waiting(Wait::Shuffle(_)) => return Ok(false),
                State::Exited => {}
            }
        }
        let Some((t0, site)) = first else { return Ok(false) };
        if blk.exited > 0 {
            return Err(self.fault_at(
                b,
                t0 as u32,
                FaultKind::Barrier(format!(
                    "{} of the block's {} threads have exited and can never reach the barrier at {site}",
                    blk.exited,
                    blk.lanes.len()
                )),
            ));
        }
        for lane in &blk.lanes {
            lane.phase.set(lane.phase.get() + 1);
        }
        for t in 0..blk.lanes.len() {
            self.step(blk, t, 0)?;
        }
        Ok(true)
    }

    /// No wait can complete: describes the first waiting thread's.
    fn deadlock<F>(&self, blk: &Block<'_, F>, b: u32) -> Box<Fault> {
        let t = blk.state.iter().position(|s| matches!(s, State::Waiting(_))).expect("a waiting thread");
        let msg = match blk.state[t] {
            State::Waiting(Wait::Shuffle(s)) => {
                let base = t / 32 * 32;
                let other = lanes_of(s.mask).find_map(|m| match blk.state[base + m as usize] {
                    State::Waiting(Wait::Shuffle(o)) if o != Shfl { value: o.value, b: o.b, c: o.c, ..s } => {
                        Some(format!(
                            "lane {m} waits at a different shuffle ({:?}, mask {:#010x}, {})",
                            o.mode, o.mask, o.site
                        ))
                    }
                    State::Waiting(Wait::Barrier(site)) => Some(format!("lane {m} waits at a barrier ({site})")),
                    _ => None,
                });
                FaultKind::Shuffle(format!(
                    "deadlock: {:?} with mask {:#010x} at {} can never complete: {}",
                    s.mode,
                    s.mask,
                    s.site,
                    other.unwrap_or_else(|| "its lanes wait elsewhere".into())
                ))
            }
            State::Waiting(Wait::Barrier(site)) => {
                FaultKind::Barrier(format!("deadlock: the barrier at {site} waits for threads stopped at a shuffle"))
            }
            State::Exited => unreachable!(),
        };
        self.fault_at(b, t as u32, msg)
    }
}

fn lanes_of(mask: u32) -> impl Iterator<Item = u32> {
    (0..32).filter(move |l| mask & (1 << l) != 0)
}

// ---------------------------------------------------------------------------------------------
// The device side: what `kernels.rs` sees instead of `shim.rs`

/// The intrinsics and memory access of `shim.rs`, emulated. `kernels.rs` imports this module on
/// the host, so the same source runs here.
// The intrinsics keep the device's `unsafe fn` signatures (kernels.rs calls them the same way on
// both targets); here their only precondition is to run inside `launch`, which they check.
#[allow(clippy::missing_safety_doc)]
pub mod device {
    use super::*;

    pub use half::f16;

    pub type Ptr<T> = DevPtr<T>;
    pub type PtrMut<T> = DevPtr<T>;

    pub unsafe fn thread_idx_x() -> u32 {
        current().thread
    }
    pub unsafe fn block_idx_x() -> u32 {
        current().block
    }
    pub unsafe fn block_dim_x() -> u32 {
        launch_info(current()).block
    }
    pub unsafe fn grid_dim_x() -> u32 {
        launch_info(current()).grid
    }

    /// `p + i` (no access, so never a fault).
    #[inline(always)]
    pub unsafe fn offset<T>(p: DevPtr<T>, i: usize) -> DevPtr<T> {
        p.offset(i)
    }

    /// The element `p[i]` refers to, after the bounds check.
    #[inline(always)]
    fn element<T: Scalar>(p: DevPtr<T>, i: usize, access: Access) -> (&'static Header, usize) {
        if p.header.is_null() {
            fault(FaultKind::NullPointer { access });
        }
        // SAFETY: a non-null header belongs to a live buffer (the launcher keeps its buffers
        // alive for the launch).
        let h: &'static Header = unsafe { &*p.header };
        // Address arithmetic wraps as on the device (a usize index past 2^63 is a negative one).
        let index = p.off.wrapping_add(i as isize) as i128;
        if index < 0 || index >= h.len as i128 {
            fault(FaultKind::OutOfBounds { access, buffer: h.name.clone(), elem: h.elem, index, len: h.len });
        }
        (h, index as usize)
    }

    /// Whether `shadow` records an access by another thread of this launch that nothing orders
    /// before the current thread's (a thread of another block, or of this block in the same
    /// barrier phase).
    #[inline(always)]
    fn conflicts(shadow: u64, lane: &Lane) -> bool {
        let info = launch_info(lane);
        if (shadow >> EPOCH_SHIFT) as u32 != info.epoch || shadow as u32 == lane.id {
            return false;
        }
        let same_block = (shadow as u32 - 1) / info.block == lane.block;
        !same_block || ((shadow >> PHASE_SHIFT) & 0xff) as u32 == lane.phase.get() & 0xff
    }

    fn race(access: Access, h: &Header, index: usize, shadow: u64) -> ! {
        let block = launch_info(current()).block;
        let other = shadow as u32 - 1;
        fault(FaultKind::Race {
            access,
            buffer: h.name.clone(),
            index,
            other_block: other / block,
            other_thread: other % block,
        })
    }

    /// `p[i]`, checked.
    #[inline(always)]
    pub unsafe fn load<T: Scalar>(p: DevPtr<T>, i: usize) -> T {
        let (h, index) = element(p, i, Access::Load);
        let lane = current();
        // SAFETY: index < len of both arrays.
        let s = unsafe { (*h.shadow.add(index)).load(Relaxed) };
        if s == NEVER {
            fault(FaultKind::Uninitialized { buffer: h.name.clone(), index });
        }
        if conflicts(s, lane) {
            race(Access::Load, h, index, s);
        }
        T::get(unsafe { &*(h.data as *const T::Atom).add(index) })
    }

    /// `p[i] = v`, checked.
    #[inline(always)]
    pub unsafe fn store<T: Scalar>(p: DevPtr<T>, i: usize, v: T) {
        let (h, index) = element(p, i, Access::Store);
        let lane = current();
        let now = stamp(launch_info(lane).epoch, lane.phase.get(), lane.id);
        // SAFETY: index < len of both arrays.
        let prev = unsafe { (*h.shadow.add(index)).swap(now, Relaxed) };
        if conflicts(prev, lane) {
            race(Access::Store, h, index, prev);
        }
        T::set(unsafe { &*(h.data as *const T::Atom).add(index) }, v)
    }

    #[inline(always)]
    pub fn f16_to_f32(x: f16) -> f32 {
        x.to_f32()
    }

    /// Rounded to nearest even, as `cvt.rn.f16.f32`.
    #[inline(always)]
    pub fn f32_to_f16(x: f32) -> f16 {
        f16::from_f32(x)
    }

    /// Integer types the kernels divide.
    pub trait Divisible: Copy + PartialEq + core::ops::Div<Output = Self> {
        const ZERO: Self;
    }
    impl Divisible for u32 {
        const ZERO: u32 = 0;
    }
    impl Divisible for usize {
        const ZERO: usize = 0;
    }
    impl Divisible for u64 {
        const ZERO: u64 = 0;
    }

    /// On the device a division by zero is undefined; here it is a fault.
    pub unsafe fn unchecked_div<T: Divisible>(x: T, y: T) -> T {
        if y == T::ZERO {
            fault(FaultKind::DivisionByZero);
        }
        x / y
    }

    pub unsafe fn trap() -> ! {
        fault(FaultKind::Trap)
    }

    #[track_caller]
    fn shfl(mode: Mode, mask: u32, value: f32, b: u32, c: u32) -> f32 {
        let site = Location::caller();
        f32::from_bits(suspend(Wait::Shuffle(Shfl { mode, mask, value: value.to_bits(), b, c, site })))
    }

    #[track_caller]
    pub unsafe fn shfl_bfly_f32(mask: u32, value: f32, lane_mask: u32, clamp: u32) -> f32 {
        shfl(Mode::Bfly, mask, value, lane_mask, clamp)
    }
    #[track_caller]
    pub unsafe fn shfl_up_f32(mask: u32, value: f32, delta: u32, clamp: u32) -> f32 {
        shfl(Mode::Up, mask, value, delta, clamp)
    }
    #[track_caller]
    pub unsafe fn shfl_down_f32(mask: u32, value: f32, delta: u32, clamp: u32) -> f32 {
        shfl(Mode::Down, mask, value, delta, clamp)
    }
    #[track_caller]
    pub unsafe fn shfl_idx_f32(mask: u32, value: f32, lane: u32, clamp: u32) -> f32 {
        shfl(Mode::Idx, mask, value, lane, clamp)
    }

    /// `bar.sync 0`.
    #[track_caller]
    pub unsafe fn sync_threads() {
        suspend(Wait::Barrier(Location::caller()));
    }
}
