//! The job table: renders that run after their request has been answered (`POST /v1/jobs`), and
//! the records of streamed renders (`/generate?stream=fmp4`), whose statistics are known only
//! after their headers went out.
//!
//! Each record holds its state (queued, running, done, failed, cancelled), the frames written,
//! the final statistics and the cancel flag of its render. Its status lives in a `watch` channel:
//! the render thread updates it per frame, and the server-sent events of
//! `GET /v1/jobs/{id}/events` wait on it. A job's MP4 is `<jobs dir>/<id>.mp4`, written beside
//! it and moved into place only when complete. Finished records (and their files) expire
//! `--job-ttl-seconds` after they finished; the table holds at most `--max-jobs` records, and
//! refuses new ones beyond that (429).

use crate::error::ApiError;
use crate::stats::FinalStats;
use axum::http::StatusCode;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// Hex digits of a job id (128 random bits).
pub const ID_LEN: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 5] = [Self::Queued, Self::Running, Self::Done, Self::Failed, Self::Cancelled];

    pub fn name(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::Cancelled)
    }
}

/// What made the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// `POST /v1/jobs`: the MP4 is kept for `GET /v1/jobs/{id}/result`.
    Render,
    /// `POST /generate?stream=fmp4`: the video went to the client; the record keeps the numbers.
    Stream,
}

#[derive(Clone, Debug, Serialize)]
pub struct JobError {
    pub code: &'static str,
    pub message: String,
}

impl From<ApiError> for JobError {
    fn from(e: ApiError) -> Self {
        JobError { code: e.code, message: e.message }
    }
}

/// The changing part of a record.
#[derive(Clone, Debug)]
pub struct Status {
    pub state: JobState,
    pub frames_done: usize,
    pub started: Option<Instant>,
    pub finished: Option<Instant>,
    pub stats: Option<FinalStats>,
    pub error: Option<JobError>,
}

pub struct JobRecord {
    pub id: String,
    pub kind: JobKind,
    /// Frames of the clip.
    pub frames: usize,
    created: Instant,
    cancel: Arc<AtomicBool>,
    /// Wakes a job waiting for its slot when it is cancelled.
    cancelled: Notify,
    status: watch::Sender<Status>,
    /// The MP4 (`JobKind::Render`).
    pub result: Option<PathBuf>,
}

impl JobRecord {
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    pub fn state(&self) -> JobState {
        self.status.borrow().state
    }

    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Asks the render to stop (at its next batch) or the queued job not to start.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.cancelled.notify_one();
    }

    /// Resolves when [`Self::cancel`] is called (at once if it was).
    pub async fn cancelled(&self) {
        if !self.cancel.load(Ordering::SeqCst) {
            self.cancelled.notified().await;
        }
    }

    pub fn set_running(&self) {
        self.status.send_modify(|s| {
            s.state = JobState::Running;
            s.started = Some(Instant::now());
        });
    }

    /// One more frame written.
    pub fn frame_done(&self, n: usize) {
        self.status.send_modify(|s| s.frames_done += n);
    }

    /// The end: done with its statistics, or failed or cancelled with the error. A job's
    /// result file is removed unless it is done.
    pub fn finish(&self, outcome: Result<FinalStats, JobError>) {
        let state = match &outcome {
            Ok(_) => JobState::Done,
            Err(e) if e.code == "cancelled" => JobState::Cancelled,
            Err(_) => JobState::Failed,
        };
        if state != JobState::Done {
            self.remove_files();
        }
        self.status.send_modify(|s| {
            s.state = state;
            s.finished = Some(Instant::now());
            match outcome {
                Ok(stats) => s.stats = Some(stats),
                Err(e) => s.error = Some(e),
            }
        });
    }

    fn remove_files(&self) {
        if let Some(p) = &self.result {
            if let Err(e) = std::fs::remove_file(p) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(job = %self.id, "removing {}: {e}", p.display());
                }
            }
        }
    }

    /// The JSON of `GET /v1/jobs/{id}` (and of each server-sent event).
    pub fn view(&self, s: &Status) -> serde_json::Value {
        let running_s = s.started.map(|t| s.finished.unwrap_or_else(Instant::now).duration_since(t).as_secs_f64());
        let (progress, eta) = progress_and_eta(s.state, self.frames, s.frames_done, running_s);
        let result =
            (self.kind == JobKind::Render && s.state == JobState::Done).then(|| format!("/v1/jobs/{}/result", self.id));
        serde_json::json!({
            "id": self.id,
            "kind": self.kind,
            "state": s.state,
            "progress": progress,
            "frames": self.frames,
            "frames_done": s.frames_done,
            "eta_seconds": eta,
            "age_seconds": self.created.elapsed().as_secs_f64(),
            "running_seconds": running_s,
            "result": result,
            "stats": s.stats,
            "error": s.error,
        })
    }
}

pub struct JobTable {
    jobs: Mutex<HashMap<String, Arc<JobRecord>>>,
    dir: PathBuf,
    /// The default directory (a temporary one), removed with the table.
    _temp: Option<tempfile::TempDir>,
    ttl: Duration,
    max: usize,
}

impl JobTable {
    /// A table whose results go to `dir` (created), or to a fresh temporary directory.
    pub fn new(dir: Option<&Path>, ttl: Duration, max: usize) -> anyhow::Result<Self> {
        let (dir, temp) = match dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(|e| anyhow::anyhow!("creating the jobs directory {}: {e}", d.display()))?;
                let stale = remove_stale(d)?;
                if stale > 0 {
                    tracing::info!(stale, dir = %d.display(), "removed the results of a previous server's jobs");
                }
                (d.to_path_buf(), None)
            }
            None => {
                let t = tempfile::Builder::new().prefix("cadence-jobs-").tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        Ok(Self { jobs: Mutex::new(HashMap::new()), dir, _temp: temp, ttl, max })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Refuses a new record when the table is full (429): checked before an upload, and again
    /// when the record is made.
    pub fn check_room(&self) -> Result<(), ApiError> {
        let n = self.jobs.lock().unwrap().len();
        if n >= self.max {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_jobs",
                format!("the job table is full ({n} jobs, --max-jobs); finished jobs expire after --job-ttl-seconds"),
            )
            .with_retry_after(self.ttl.as_secs().clamp(1, 3600)));
        }
        Ok(())
    }

    /// A new queued record for a render of `frames` frames, cancelled through `cancel`.
    pub fn create(&self, kind: JobKind, frames: usize, cancel: Arc<AtomicBool>) -> Result<Arc<JobRecord>, ApiError> {
        let id = new_id();
        let result = (kind == JobKind::Render).then(|| self.dir.join(format!("{id}.mp4")));
        let status =
            Status { state: JobState::Queued, frames_done: 0, started: None, finished: None, stats: None, error: None };
        let record = Arc::new(JobRecord {
            id: id.clone(),
            kind,
            frames,
            created: Instant::now(),
            cancel,
            cancelled: Notify::new(),
            status: watch::channel(status).0,
            result,
        });
        let mut jobs = self.jobs.lock().unwrap();
        if jobs.len() >= self.max {
            drop(jobs);
            return Err(self.check_room().unwrap_err());
        }
        jobs.insert(id, record.clone());
        Ok(record)
    }

    /// The record `id`: 400 for anything that is not an id (no path reaches the disk from it),
    /// 404 for an unknown one.
    pub fn get(&self, id: &str) -> Result<Arc<JobRecord>, ApiError> {
        check_id(id)?;
        self.jobs.lock().unwrap().get(id).cloned().ok_or_else(|| not_found(id))
    }

    /// Forgets a finished record and removes its file.
    pub fn remove(&self, record: &JobRecord) {
        self.jobs.lock().unwrap().remove(&record.id);
        record.remove_files();
    }

    /// Removes the records (and files) that finished more than the TTL ago; returns how many.
    pub fn expire(&self) -> usize {
        let now = Instant::now();
        let expired: Vec<Arc<JobRecord>> = {
            let mut jobs = self.jobs.lock().unwrap();
            let old: Vec<String> = jobs
                .values()
                .filter(|r| r.status.borrow().finished.is_some_and(|t| now.duration_since(t) >= self.ttl))
                .map(|r| r.id.clone())
                .collect();
            old.iter().filter_map(|id| jobs.remove(id)).collect()
        };
        expired.iter().for_each(|r| r.remove_files());
        expired.len()
    }

    /// How often [`Self::expire`] runs: a tenth of the TTL, between 0.1 s and 60 s.
    pub fn sweep_interval(&self) -> Duration {
        (self.ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(60))
    }

    /// Records by state.
    pub fn counts(&self) -> [(JobState, usize); 5] {
        let jobs = self.jobs.lock().unwrap();
        JobState::ALL.map(|st| (st, jobs.values().filter(|r| r.state() == st).count()))
    }
}

/// Removes `<id>.mp4` files (a previous server's results: no table holds them now).
fn remove_stale(dir: &Path) -> anyhow::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let is_result = path.extension().is_some_and(|e| e == "mp4")
            && path.file_stem().and_then(|s| s.to_str()).is_some_and(valid_id);
        if is_result && path.is_file() {
            std::fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

pub fn valid_id(id: &str) -> bool {
    id.len() == ID_LEN && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// 128 bits from the operating system's generator: ids cannot be guessed from one another.
/// A job's progress (0 to 1) and its seconds left, from the frame rate so far (the frames left
/// over the frames per second); one rule for this replica's records and a fleet's.
pub fn progress_and_eta(
    state: JobState,
    frames: usize,
    frames_done: usize,
    running_s: Option<f64>,
) -> (f64, Option<f64>) {
    let progress = match state {
        JobState::Done => 1.0,
        _ if frames == 0 => 0.0,
        _ => (frames_done as f64 / frames as f64).min(1.0),
    };
    let eta = match (state, running_s) {
        (JobState::Running, Some(t)) if frames_done > 0 => {
            Some(t * frames.saturating_sub(frames_done) as f64 / frames_done as f64)
        }
        (state, _) if state.is_final() => Some(0.0),
        _ => None,
    };
    (progress, eta)
}

/// The 400 for what is not a job id.
pub fn check_id(id: &str) -> Result<(), ApiError> {
    if valid_id(id) {
        return Ok(());
    }
    Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_job_id", format!("a job id is {ID_LEN} lowercase hex digits")))
}

/// The 404 for a job id that no record has.
pub fn not_found(id: &str) -> ApiError {
    ApiError::not_found("job_not_found", format!("no job {id} (finished jobs expire after --job-ttl-seconds)"))
}

pub fn new_id() -> String {
    let mut bytes = [0u8; ID_LEN / 2];
    getrandom::fill(&mut bytes).expect("the operating system's random generator");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ttl_ms: u64, max: usize) -> JobTable {
        JobTable::new(None, Duration::from_millis(ttl_ms), max).unwrap()
    }

    #[test]
    fn ids_are_checked_before_any_lookup() {
        let t = table(1000, 4);
        let r = t.create(JobKind::Render, 10, Arc::default()).unwrap();
        assert!(valid_id(&r.id));
        assert!(r.result.as_ref().unwrap().starts_with(t.dir()));
        assert_eq!(t.get(&r.id).unwrap().id, r.id);
        for bad in ["", "../../etc/passwd", &r.id.to_uppercase(), &r.id[1..], &format!("{}0", r.id), "..%2F"] {
            assert_eq!(t.get(bad).err().unwrap().status, StatusCode::BAD_REQUEST, "{bad}");
        }
        assert_eq!(t.get(&"0".repeat(ID_LEN)).err().unwrap().status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_table_is_bounded_and_finished_records_expire() {
        let t = table(50, 2);
        let a = t.create(JobKind::Render, 10, Arc::default()).unwrap();
        let b = t.create(JobKind::Stream, 10, Arc::default()).unwrap();
        assert_eq!(t.create(JobKind::Render, 10, Arc::default()).err().unwrap().status, StatusCode::TOO_MANY_REQUESTS);
        std::fs::write(a.result.as_ref().unwrap(), b"mp4").unwrap();
        a.set_running();
        a.frame_done(10);
        a.finish(Err(JobError { code: "failed", message: "x".into() }));
        assert!(!a.result.as_ref().unwrap().exists(), "a failed job's file is removed");
        std::thread::sleep(Duration::from_millis(60));
        // b never finished: it stays.
        assert_eq!(t.expire(), 1);
        assert!(t.get(&a.id).is_err() && t.get(&b.id).is_ok());
        assert!(t.create(JobKind::Render, 10, Arc::default()).is_ok());
    }

    #[test]
    fn progress_and_eta() {
        let t = table(1000, 2);
        let r = t.create(JobKind::Render, 100, Arc::default()).unwrap();
        let v = r.view(&r.status());
        assert_eq!(
            (v["state"].as_str(), v["progress"].as_f64(), &v["eta_seconds"]),
            (Some("queued"), Some(0.0), &serde_json::Value::Null)
        );
        r.set_running();
        std::thread::sleep(Duration::from_millis(20));
        r.frame_done(25);
        let v = r.view(&r.status());
        assert_eq!(v["progress"].as_f64(), Some(0.25));
        // A quarter done after t seconds: three times t to go.
        let (eta, t_run) = (v["eta_seconds"].as_f64().unwrap(), v["running_seconds"].as_f64().unwrap());
        assert!((eta - 3.0 * t_run).abs() < 0.01 * t_run + 0.005, "{eta} {t_run}");
        r.cancel();
        assert!(r.cancel_flag().load(Ordering::SeqCst));
        r.finish(Err(JobError { code: "cancelled", message: "x".into() }));
        assert_eq!(r.state(), JobState::Cancelled);
    }
}
