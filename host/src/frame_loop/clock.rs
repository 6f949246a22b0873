//! Stage clocks: a stage's wall time and the CPU time the render's own threads spend in it.
//!
//! On a few shared cores a stage's wall time holds whatever else ran meanwhile: the video
//! encoder's thread beside the frame loop ([`crate::frame_loop::video`]), another process. Which
//! stage is running when the encoder wakes is an accident, so wall times charge the same work
//! differently from render to render. The CPU time of a stage counts its work: the process's CPU
//! time (every thread: the frame loop and the worker pools the kernels run on) minus the CPU time
//! of the threads that are not the render's, which register themselves with
//! [`ForeignThread::register`] (the encoder does). What contention still costs the work itself
//! (caches, workers spinning while they wait for a core) stays in it.
//!
//! Meaningful while one render runs in the process (the CLI, the experiments); the server's
//! concurrent renders would share one process clock, and its reports use the wall times.
//! On other systems than Linux the CPU clock reads the wall clock.

use std::sync::Mutex;
use std::time::Instant;

/// The start of a timed stage.
#[derive(Clone, Copy, Debug)]
pub struct Tick {
    wall: Instant,
    cpu_ns: u64,
}

impl Tick {
    pub fn now() -> Tick {
        Tick { wall: Instant::now(), cpu_ns: render_cpu_ns() }
    }

    /// (wall ms, CPU ms of the render's threads) since the tick.
    pub fn elapsed_ms(&self) -> (f64, f64) {
        let cpu = render_cpu_ns().saturating_sub(self.cpu_ns) as f64 * 1e-6;
        (self.wall.elapsed().as_secs_f64() * 1e3, cpu)
    }

    /// Adds the time since the tick to a stage's wall and CPU totals.
    pub fn add_to(&self, wall_ms: &mut f64, cpu_ms: &mut f64) {
        let (w, c) = self.elapsed_ms();
        *wall_ms += w;
        *cpu_ms += c;
    }
}

/// The threads that are not the render's: live ones by their CPU clocks, finished ones by the
/// CPU time they had spent.
struct Foreign {
    #[cfg(target_os = "linux")]
    live: Vec<(u64, libc::clockid_t)>,
    retired_ns: u64,
    next_id: u64,
}

static FOREIGN: Mutex<Foreign> = Mutex::new(Foreign {
    #[cfg(target_os = "linux")]
    live: Vec::new(),
    retired_ns: 0,
    next_id: 0,
});

/// Registration of the current thread as not the render's (its CPU time is left out of every
/// stage's), until dropped. Create and drop it on the thread itself.
pub struct ForeignThread {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    id: u64,
}

impl ForeignThread {
    pub fn register() -> ForeignThread {
        let mut f = FOREIGN.lock().unwrap_or_else(|p| p.into_inner());
        let id = f.next_id;
        f.next_id += 1;
        #[cfg(target_os = "linux")]
        {
            let mut clock: libc::clockid_t = 0;
            // SAFETY: pthread_self() is this live thread; `clock` is a valid out pointer.
            if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0 {
                f.live.push((id, clock));
            }
        }
        ForeignThread { id }
    }
}

impl Drop for ForeignThread {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            let mut f = FOREIGN.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = f.live.iter().position(|(id, _)| *id == self.id) {
                let (_, clock) = f.live.swap_remove(i);
                // Read on the thread itself, before it ends and its clock with it.
                f.retired_ns += read_ns(clock);
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn read_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out pointer; a clock id that fails leaves it zero.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The calling thread's CPU time in ms; `None` where the system gives none (not Linux).
pub fn this_thread_cpu_ms() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        Some(read_ns(libc::CLOCK_THREAD_CPUTIME_ID) as f64 * 1e-6)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The process's CPU time minus that of its foreign threads, in ns.
#[cfg(target_os = "linux")]
fn render_cpu_ns() -> u64 {
    let f = FOREIGN.lock().unwrap_or_else(|p| p.into_inner());
    let process = read_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let foreign: u64 = f.retired_ns + f.live.iter().map(|&(_, c)| read_ns(c)).sum::<u64>();
    process.saturating_sub(foreign)
}

#[cfg(not(target_os = "linux"))]
fn render_cpu_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}
