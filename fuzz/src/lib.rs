//! Fuzzing of cadence's parsers of untrusted bytes, on stable Rust.
//!
//! Each [`Target`] is a parser entry point that takes bytes. The harness replays the committed
//! corpus (`fuzz/corpus/<target>/`: valid seeds made by `make_corpus`) and every committed crash
//! reproducer (`fuzz/regressions/<target>/`), then mutates corpus entries for a time budget:
//! bit flips, byte edits, insertions, deletions, truncation, splices, and "interesting" integers
//! (0, 1, 0x7F.., 0x80.., 0xFF.., 2^31, 2^62+1 ...) written little- and big-endian at random
//! offsets, which is where header size fields live. A run fails on a panic or on an allocation
//! larger than [`MAX_ALLOCATION`] (a memory bomb); the failing input is written to
//! `target/fuzz-crashes/` and printed in hex, ready to be committed as a regression.
//!
//! This is random mutation, not coverage-guided fuzzing (libFuzzer/AFL): it needs no nightly
//! toolchain or sanitizer build, so it runs in the ordinary test command and in CI for a bounded
//! time; what it finds is kept as regressions that every test run replays.

use rand::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The largest single allocation a parser may make for one input: far above what the inputs
/// here need (a 3840x3840 RGB avatar is 44 MB), far below what a forged header could ask for.
pub const MAX_ALLOCATION: usize = 256 << 20;

/// A global allocator that remembers the largest request since [`reset_largest`], and refuses
/// (aborting the process, after the harness has saved the input) anything above 4 GiB.
pub struct TrackingAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > 4 << 30 {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > 4 << 30 {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        if new_size > 4 << 30 {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

pub fn reset_largest() {
    LARGEST.store(0, Ordering::Relaxed);
}
pub fn largest() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// A parser under test: its name (the corpus folder) and its entry point. The entry point
/// returns whether the input was accepted; either answer is fine, a panic is not.
pub struct Target {
    pub name: &'static str,
    pub parse: fn(&[u8]) -> bool,
}

fn scratch_file(bytes: &[u8], ext: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("cadence-fuzz-{}.{ext}", std::process::id()));
    std::fs::write(&p, bytes).expect("write the scratch file");
    p
}

/// Every parser of untrusted bytes.
pub const TARGETS: &[Target] = &[
    Target { name: "npy", parse: |b| cadence::io::npy::parse(b).is_ok() },
    Target {
        name: "wav",
        parse: |b| {
            let r = cadence_media::wav::WavReader::new(b, Some(b.len() as u64));
            r.and_then(|mut r| r.read_all()).is_ok()
        },
    },
    Target { name: "image", parse: |b| cadence_media::image::decode_image(b).is_ok() },
    Target { name: "alignment", parse: |b| cadence::schedules::Alignment::parse_bytes(b).is_ok() },
    Target {
        name: "mp4",
        parse: |b| {
            let p = scratch_file(b, "mp4");
            let ok = match cadence_media::Mp4Reader::open(&p) {
                Ok(mut r) => r.decode_video().is_ok() & r.decode_audio().is_ok(),
                Err(_) => false,
            };
            let _ = std::fs::remove_file(p);
            ok
        },
    },
];

const INTERESTING: [u64; 14] = [
    0,
    1,
    0x7F,
    0x80,
    0xFF,
    0x7FFF,
    0xFFFF,
    0x7FFF_F000,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    1 << 32,
    (1 << 62) + 1,
    u64::MAX,
];

/// One random mutation of `data` (`pool`: other inputs to splice from).
pub fn mutate(rng: &mut impl Rng, data: &mut Vec<u8>, pool: &[Vec<u8>]) {
    let n = data.len();
    match rng.random_range(0..8) {
        0 if n > 0 => {
            let i = rng.random_range(0..n);
            data[i] ^= 1 << rng.random_range(0..8);
        }
        1 if n > 0 => {
            let i = rng.random_range(0..n);
            data[i] = rng.random();
        }
        2 => {
            let i = rng.random_range(0..=n);
            let k = rng.random_range(1..=16);
            for _ in 0..k {
                data.insert(i, rng.random());
            }
        }
        3 if n > 0 => {
            let i = rng.random_range(0..n);
            let k = rng.random_range(1..=(n - i).min(64));
            data.drain(i..i + k);
        }
        4 if n > 0 => data.truncate(rng.random_range(0..n)),
        5 if !pool.is_empty() => {
            let other = &pool[rng.random_range(0..pool.len())];
            if !other.is_empty() {
                let a = rng.random_range(0..other.len());
                let b = rng.random_range(a..=other.len());
                let at = rng.random_range(0..=n);
                data.splice(at..at, other[a..b].iter().copied());
            }
        }
        // Interesting integers over 1, 2, 4 or 8 bytes, either endianness.
        _ if n > 0 => {
            let v = INTERESTING[rng.random_range(0..INTERESTING.len())];
            let width = [1usize, 2, 4, 8][rng.random_range(0..4)];
            let bytes = if rng.random() { v.to_le_bytes() } else { v.to_be_bytes() };
            let i = rng.random_range(0..n);
            for (k, b) in bytes.iter().take(width).enumerate() {
                if i + k < n {
                    data[i + k] = *b;
                }
            }
        }
        _ => data.push(rng.random()),
    }
}

/// The files in `dir` (none if it does not exist), sorted by name.
pub fn read_dir_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    v.sort();
    v.into_iter().map(|p| (p.clone(), std::fs::read(&p).expect("read a corpus file"))).collect()
}

/// What went wrong with one input.
#[derive(Debug)]
pub struct Crash {
    pub target: &'static str,
    pub what: String,
    pub input: Vec<u8>,
    pub saved: PathBuf,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex: String = self.input.iter().take(512).map(|b| format!("{b:02x}")).collect();
        write!(
            f,
            "{}: {} on a {}-byte input, saved to {} (first bytes: {hex}); commit it to fuzz/regressions/{}/",
            self.target,
            self.what,
            self.input.len(),
            self.saved.display(),
            self.target
        )
    }
}

/// Runs `target` on one input: a panic or a memory bomb is a [`Crash`].
pub fn check_one(target: &Target, input: &[u8], crash_dir: &Path) -> Result<bool, Crash> {
    // Saved before the call: an aborting allocation leaves it behind as the reproducer.
    let last = crash_dir.join(format!("{}-last-input", target.name));
    let _ = std::fs::write(&last, input);
    reset_largest();
    let result = std::panic::catch_unwind(|| (target.parse)(input));
    let peak = largest();
    let what = match &result {
        Err(p) => Some(format!(
            "panic: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
        Ok(_) if peak > MAX_ALLOCATION => Some(format!("an allocation of {peak} bytes")),
        Ok(_) => None,
    };
    match (what, result) {
        (None, Ok(accepted)) => Ok(accepted),
        (what, _) => {
            let saved = crash_dir.join(format!("{}-{:016x}", target.name, fxhash(input)));
            let _ = std::fs::write(&saved, input);
            Err(Crash { target: target.name, what: what.unwrap_or_default(), input: input.to_vec(), saved })
        }
    }
}

fn fxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
}

/// Counts of one fuzzing run.
#[derive(Debug, Default)]
pub struct Stats {
    pub seeds: usize,
    /// Seeds the parser accepted: all of them, since the corpus holds valid inputs only.
    pub seeds_accepted: usize,
    pub regressions: usize,
    pub executions: usize,
    pub accepted: usize,
}

/// Replays the corpus and the regressions of `target` from `root` (the `fuzz/` folder), then
/// mutates for `budget`. Deterministic for a given `seed` apart from the time budget.
pub fn fuzz(target: &Target, root: &Path, crash_dir: &Path, budget: Duration, seed: u64) -> Result<Stats, Crash> {
    std::fs::create_dir_all(crash_dir).expect("create the crash folder");
    let corpus: Vec<Vec<u8>> =
        read_dir_files(&root.join("corpus").join(target.name)).into_iter().map(|(_, b)| b).collect();
    let regressions = read_dir_files(&root.join("regressions").join(target.name));
    let mut stats = Stats { seeds: corpus.len(), regressions: regressions.len(), ..Default::default() };
    for input in &corpus {
        stats.executions += 1;
        let ok = check_one(target, input, crash_dir)?;
        stats.accepted += ok as usize;
        stats.seeds_accepted += ok as usize;
    }
    for (_, input) in &regressions {
        stats.executions += 1;
        stats.accepted += check_one(target, input, crash_dir)? as usize;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let pool = corpus.clone();
    while start.elapsed() < budget && !pool.is_empty() {
        let mut input = pool[rng.random_range(0..pool.len())].clone();
        for _ in 0..rng.random_range(1..=8) {
            mutate(&mut rng, &mut input, &pool);
        }
        stats.executions += 1;
        stats.accepted += check_one(target, &input, crash_dir)? as usize;
    }
    Ok(stats)
}
