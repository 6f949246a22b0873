//! Render slots and a bounded wait queue. A request takes a free slot at once, or waits in the
//! queue (FIFO: tokio's semaphore is fair) when it has room, or is refused: tower's concurrency
//! limit would queue without bound instead of refusing.
//!
//! Each slot renders on worker threads of its own (a rayon pool per slot, as many threads as
//! the global pool has): renders sharing one pool ran slower together than separate `cadence
//! render` processes do (`server_load`, two slots: 0.84 of the processes' throughput). In one
//! pool a worker that waits for its part of one render's parallel loop steals work of the other
//! render, so each render's loops end only when the other's stolen pieces do; separate pools
//! leave the interleaving to the operating system, as separate processes do.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The worker pools of the slots not in use.
type FreePools = Arc<Mutex<Vec<Arc<rayon::ThreadPool>>>>;

pub struct Admission {
    slots: Arc<Semaphore>,
    total: usize,
    queue_cap: usize,
    waiting: Arc<AtomicUsize>,
    pools: FreePools,
}

/// A held render slot; dropping it frees the slot (the render thread holds it until the engines
/// are done, cancelled or not) and gives the render's freed memory back to the system.
pub struct Slot {
    pool: Option<(Arc<rayon::ThreadPool>, FreePools)>,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// Runs `f` (a render) on this slot's worker threads: its parallel loops use them and no
    /// other slot's. A slot of [`Admission::take_all`] has none and runs `f` on the global pool.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some((pool, _)) => pool.install(f),
            None => f(),
        }
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("own_threads", &self.pool.is_some()).finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        release_freed_memory();
        if let Some((pool, free)) = self.pool.take() {
            free.lock().unwrap_or_else(|e| e.into_inner()).push(pool);
        }
    }
}

/// Returns the heap pages no allocation uses any more to the operating system.
///
/// Renders run on tokio's blocking threads, and glibc gives threads their own malloc arenas
/// (up to 8 per core); an arena keeps the pages of freed blocks mapped for its next
/// allocations. So a server that has rendered on many threads holds, resident, the peak of
/// each arena: `server_load` measured that as memory growing under load and shrinking after
/// it, which a leak would not do. `malloc_trim(0)` releases the free pages of every arena;
/// it runs on the render thread once the render is done, outside any request's latency.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let t = std::time::Instant::now();
        // SAFETY: malloc_trim only reads and releases the allocator's own free lists.
        unsafe { libc::malloc_trim(0) };
        tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "freed heap pages released");
    }
}

/// Caps glibc's malloc arenas at one per slot plus one, unless `MALLOC_ARENA_MAX` sets them.
///
/// glibc gives threads arenas of their own up to 8 per core, and each keeps the fragments its
/// threads' freed blocks leave. With a worker pool per slot, `server_load` measured resident
/// memory rising for dozens of renders after warm-up before it levelled off (+9%, a plateau
/// at 96 renders as at 48); with the environment variable at 2 it ended below its level after
/// warm-up. Renders allocate a few large buffers per layer, so sharing arenas costs little lock
/// time. Call once, at start, before the threads.
pub fn cap_malloc_arenas(slots: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let n = libc::c_int::try_from(slots + 1).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt sets an allocator parameter; M_ARENA_MAX takes effect for arenas made later.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, n) };
    }
}

/// Why a request was not admitted: slots and queue are full.
#[derive(Debug)]
pub struct QueueFull {
    /// Requests ahead of this one: the ones running and the ones waiting.
    pub ahead: usize,
}

struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    /// `slots` render slots with `threads` worker threads each (0: as many as rayon's global
    /// pool, which honours `RAYON_NUM_THREADS`).
    pub fn new(slots: usize, queue_cap: usize, threads: usize) -> std::io::Result<Self> {
        let threads = if threads == 0 { rayon::current_num_threads() } else { threads };
        let pools = (0..slots)
            .map(|i| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |j| format!("cadence-slot{i}-{j}"))
                    .build()
                    .map(Arc::new)
                    .map_err(std::io::Error::other)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            slots: Arc::new(Semaphore::new(slots)),
            total: slots,
            queue_cap,
            waiting: Arc::new(AtomicUsize::new(0)),
            pools: Arc::new(Mutex::new(pools)),
        })
    }

    /// A slot with one of the free pools: there is one for every permit not held.
    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        let pool = self.pools.lock().unwrap_or_else(|e| e.into_inner()).pop().expect("a free pool for every free slot");
        Slot { pool: Some((pool, self.pools.clone())), _permit: permit }
    }

    /// A slot, after waiting in the queue if needed. Dropping the future (a client that goes away
    /// while queued) leaves the queue.
    pub async fn admit(&self) -> Result<Slot, QueueFull> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(self.slot(p));
        }
        let before = self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(self.waiting.clone());
        if before >= self.queue_cap {
            drop(waiting);
            return Err(QueueFull { ahead: self.total + before });
        }
        let permit = self.slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        drop(waiting);
        Ok(self.slot(permit))
    }

    /// A slot, however long it takes: for jobs, which wait in the job table (bounded by
    /// `--max-jobs`) rather than in the queue of requests. The semaphore is fair, so jobs and
    /// `/generate` requests take the slots in the order they asked.
    pub async fn wait(&self) -> Slot {
        self.slot(self.slots.clone().acquire_owned().await.expect("the semaphore is never closed"))
    }

    /// Every slot, once the renders holding them have finished (a calibration). Fair: renders
    /// that ask later wait behind it.
    pub async fn take_all(&self) -> Slot {
        let n = u32::try_from(self.total).expect("slots fit in u32");
        Slot {
            pool: None,
            _permit: self.slots.clone().acquire_many_owned(n).await.expect("the semaphore is never closed"),
        }
    }

    pub fn slots(&self) -> usize {
        self.total
    }

    /// Slots in use now.
    pub fn running(&self) -> usize {
        self.total - self.slots.available_permits()
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_then_queue_then_refusal() {
        let a = Arc::new(Admission::new(1, 1, 1).unwrap());
        let first = a.admit().await.unwrap();
        assert_eq!((a.running(), a.queued()), (1, 0));
        let a2 = a.clone();
        let second = tokio::spawn(async move { a2.admit().await.map(|_| ()) });
        while a.queued() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(a.admit().await.unwrap_err().ahead, 2);
        assert_eq!(a.queued(), 1, "a refused request does not stay in the queue");
        drop(first);
        second.await.unwrap().unwrap();
        assert_eq!((a.running(), a.queued()), (0, 0));
    }

    /// A slot's render runs on the slot's own pool, never on another slot's or the global one,
    /// and a freed slot's pool serves the next request.
    #[tokio::test]
    async fn each_slot_renders_on_threads_of_its_own() {
        let a = Admission::new(2, 0, 3).unwrap();
        let where_run = |s: &Slot| {
            s.run(|| {
                let name = |_: rayon::BroadcastContext<'_>| std::thread::current().name().unwrap_or("").to_string();
                let names: Vec<String> = rayon::broadcast(name);
                (rayon::current_num_threads(), names)
            })
        };
        let (first, second) = (a.admit().await.unwrap(), a.admit().await.unwrap());
        let ((n1, names1), (n2, names2)) = (where_run(&first), where_run(&second));
        assert_eq!((n1, n2), (3, 3));
        let pool = |names: &[String]| {
            let p = names[0].rsplit_once('-').unwrap().0.to_string();
            assert!(p.starts_with("cadence-slot"), "{names:?}");
            assert!(names.iter().all(|n| n.starts_with(&format!("{p}-"))), "{names:?}");
            p
        };
        let (p1, p2) = (pool(&names1), pool(&names2));
        assert_ne!(p1, p2, "two slots share a pool");
        drop(first);
        let third = a.admit().await.unwrap();
        assert_eq!(pool(&where_run(&third).1), p1, "the freed slot's pool is used again");
        let all = Admission::new(1, 0, 1).unwrap().take_all().await;
        assert!(all.run(rayon::current_thread_index).is_none(), "a calibration runs on the caller's thread");
    }
}
