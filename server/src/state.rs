//! What every request shares: the configuration, the engines (once loaded), admission, the
//! avatar cache, metrics, and the lifecycle (loading -> ready -> draining).

use crate::admission::Admission;
use crate::avatars::AvatarCache;
use crate::config::Config;
use crate::engines::EngineSet;
use crate::error::ApiError;
use crate::jobs::JobTable;
use crate::metrics::{Gauges, Metrics};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::Notify;

pub type AppState = Arc<ServerState>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Loading = 0,
    Ready = 1,
    Draining = 2,
    Failed = 3,
}

pub struct ServerState {
    pub config: Config,
    pub metrics: Metrics,
    pub admission: Admission,
    pub avatars: Mutex<AvatarCache>,
    pub jobs: JobTable,
    /// Live WebRTC sessions.
    pub sessions: crate::sessions::Sessions,
    /// The last calibration's JSON (`GET /v1/calibration`).
    pub calibration: Mutex<Option<serde_json::Value>>,
    /// The fleet's connection, once made (with `--nats`).
    pub fleet: OnceLock<Arc<crate::fleet::Fleet>>,
    /// A calibration holds every slot: renders are refused and `/readyz` is 503 meanwhile.
    calibrating: AtomicBool,
    engines: OnceLock<Arc<EngineSet>>,
    phase: AtomicU8,
    load_error: Mutex<Option<String>>,
    /// The cancel flag of every request that may run a render, to cancel them at shutdown.
    inflight: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    pub inflight_done: Notify,
    next_id: AtomicU64,
    /// Prefix of generated request ids: distinct per process and start.
    id_prefix: String,
}

impl ServerState {
    pub fn new(config: Config) -> anyhow::Result<Self> {
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let id_prefix = format!("{:x}{:06x}", std::process::id(), started.as_micros() as u64 & 0xff_ffff);
        Ok(Self {
            jobs: JobTable::new(config.jobs_dir.as_deref(), config.job_ttl, config.max_jobs)?,
            admission: Admission::new(config.slots, config.queue, config.slot_threads)?,
            calibration: Mutex::new(None),
            sessions: Default::default(),
            fleet: OnceLock::new(),
            calibrating: AtomicBool::new(false),
            avatars: Mutex::new(AvatarCache::new(config.avatar_cache)),
            config,
            metrics: Metrics::default(),
            engines: OnceLock::new(),
            phase: AtomicU8::new(Phase::Loading as u8),
            load_error: Mutex::new(None),
            inflight: Mutex::new(HashMap::new()),
            inflight_done: Notify::new(),
            next_id: AtomicU64::new(0),
            id_prefix,
        })
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::SeqCst) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            2 => Phase::Draining,
            _ => Phase::Failed,
        }
    }

    pub fn set_engines(&self, set: EngineSet) {
        if self.engines.set(Arc::new(set)).is_ok() {
            // Loading -> Ready; a drain that started meanwhile stays a drain.
            let _ = self.phase.compare_exchange(
                Phase::Loading as u8,
                Phase::Ready as u8,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    pub fn set_failed(&self, error: String) {
        *self.load_error.lock().unwrap() = Some(error);
        self.phase.store(Phase::Failed as u8, Ordering::SeqCst);
    }

    pub fn start_draining(&self) {
        self.phase.store(Phase::Draining as u8, Ordering::SeqCst);
    }

    /// Marks a calibration as running (or ended); false when `on` and one already runs.
    pub fn set_calibrating(&self, on: bool) -> bool {
        if on {
            self.calibrating.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok()
        } else {
            self.calibrating.store(false, Ordering::SeqCst);
            true
        }
    }

    pub fn engines(&self) -> Option<&Arc<EngineSet>> {
        self.engines.get()
    }

    /// The engines, when the server takes renders (503 otherwise).
    pub fn ready_engines(&self) -> Result<Arc<EngineSet>, ApiError> {
        match (self.phase(), self.engines.get()) {
            (Phase::Ready, Some(_)) if self.calibrating.load(Ordering::SeqCst) => Err(ApiError::unavailable(
                "calibrating",
                "a calibration holds every render slot (POST /calibrate); renders resume when it ends",
            )),
            (Phase::Ready, Some(e)) => Ok(e.clone()),
            (Phase::Draining, _) => Err(ApiError::unavailable("draining", "the server is shutting down")),
            (Phase::Failed, _) => Err(ApiError::unavailable(
                "engines_failed",
                format!("the engines failed to load: {}", self.load_error.lock().unwrap().clone().unwrap_or_default()),
            )),
            _ => Err(ApiError::unavailable("loading", "the engines are loading")),
        }
    }

    pub fn not_ready_reason(&self) -> Option<String> {
        self.ready_engines().err().map(|e| e.message)
    }

    pub fn request_id(&self) -> String {
        format!("{}-{:x}", self.id_prefix, self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Registers a request that may render: its flag is set when the guard drops (the client went
    /// away, or the request ended) or at shutdown's deadline.
    pub fn track(self: &Arc<Self>) -> CancelGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let flag = Arc::new(AtomicBool::new(false));
        self.inflight.lock().unwrap().insert(id, flag.clone());
        CancelGuard { state: self.clone(), id, flag }
    }

    pub fn inflight(&self) -> usize {
        self.inflight.lock().unwrap().len()
    }

    /// Sets every in-flight request's cancel flag; returns how many.
    pub fn cancel_all(&self) -> usize {
        let v = self.inflight.lock().unwrap();
        v.values().for_each(|f| f.store(true, Ordering::SeqCst));
        v.len()
    }

    pub fn gauges(&self) -> Gauges {
        Gauges {
            ready: self.phase() == Phase::Ready,
            slots: self.admission.slots(),
            running: self.admission.running(),
            queued: self.admission.queued(),
            avatars: self.avatars.lock().unwrap().len(),
            jobs: self.jobs.counts().map(|(s, n)| (s.name(), n)),
            fleet: None,
            sessions: self.sessions.len(),
        }
    }

    /// Seconds a refused client should wait: the mean render time times the renders ahead per
    /// slot (5 s before any render finished).
    pub fn retry_after(&self, ahead: usize) -> u64 {
        let mean = self.metrics.mean_render_seconds().unwrap_or(5.0);
        let s = mean * (ahead.max(1) as f64 / self.admission.slots() as f64);
        s.ceil().clamp(1.0, 3600.0) as u64
    }
}

/// Dropped with the request's future: a client that disconnects drops it mid-render, and the
/// render stops at its next engine batch.
pub struct CancelGuard {
    state: AppState,
    id: u64,
    flag: Arc<AtomicBool>,
}

impl CancelGuard {
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::SeqCst);
        let mut v = self.state.inflight.lock().unwrap_or_else(|e| e.into_inner());
        v.remove(&self.id);
        if v.is_empty() {
            self.state.inflight_done.notify_waiters();
        }
    }
}
