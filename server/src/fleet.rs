//! The fleet (`cadence serve --nats URL`): replicas that share one job queue, one job table and
//! one store of files through NATS JetStream, so a job posted to any replica is rendered by
//! whichever has a free render slot and is answered by every replica.
//!
//! - **The queue**: a work-queue stream (`CADENCE_JOBS`, subject `cadence.jobs`) holds one
//!   message per job; every replica's worker pulls from one durable consumer with explicit
//!   acks, and only while it holds a free render slot. A worker that stops acking (it died)
//!   has its job redelivered after the ack wait; a running render acks "in progress" every
//!   third of the ack wait so that a long render is not taken for a dead one. After
//!   `max_deliver` deliveries the job ends `failed` ([`Fleet::fail_exhausted_jobs`]).
//! - **The job table**: a key-value bucket (`cadence_jobs`) holds each job's state as JSON.
//!   Every change is a compare-and-set on the revision the writer read: a worker claims a job
//!   by moving it from the revision it saw, and a worker that lost its claim (the job was
//!   redelivered to another) fails its next write and stops, so a job never gets two results.
//! - **The files**: an object store (`cadence_objects`) holds each job's inputs
//!   (`inputs/<id>/<field>`, the request's files as sent) and its MP4 (`results/<id>`).
//!   Chunked and digest-checked by the store.
//!
//! The job's request is checked on the replica that took it (every 4xx comes from there, at
//! once), and checked again by the worker from the same files before it renders.
//!
//! Not yet fleet-wide (answered 501 with `--nats`): registered avatars (`avatar_id`) and a job's
//! events stream.

use crate::error::ApiError;
use crate::jobs::JobState;
use anyhow::{anyhow, Context, Result};
use async_nats::jetstream::{self, consumer, kv, object_store, stream, AckKind};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const STREAM: &str = "CADENCE_JOBS";
pub const SUBJECT: &str = "cadence.jobs";
pub const CONSUMER: &str = "cadence_workers";
pub const JOBS_BUCKET: &str = "cadence_jobs";
pub const OBJECTS_BUCKET: &str = "cadence_objects";

/// How a fleet runs: `--nats`, `--replica-name`, `--fleet-ack-wait-seconds`, `--fleet-max-deliver`.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    pub url: String,
    pub replica: String,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    /// Job records and files expire this long after they were last written (`--job-ttl-seconds`).
    pub ttl: Duration,
}

/// A job as the queue carries it: what the worker needs to fetch its files and rebuild its
/// request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobMessage {
    pub id: String,
    /// The request's text fields, as sent.
    pub options: Vec<(String, String)>,
    /// The request's file fields, stored as `inputs/<id>/<field>`.
    pub files: Vec<String>,
}

/// A job's error as the job table keeps it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FleetError {
    pub code: String,
    pub message: String,
}

/// A job's record in the key-value bucket.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetJob {
    pub id: String,
    pub state: JobState,
    pub frames: usize,
    pub frames_done: usize,
    /// Milliseconds since the Unix epoch (replicas' clocks differ a little; the ages shown are
    /// approximate across replicas).
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    /// Deliveries so far (a redelivered job starts over, and counts here).
    pub attempts: i64,
    /// The replica rendering it, or that rendered it.
    pub replica: Option<String>,
    pub stats: Option<serde_json::Value>,
    pub error: Option<FleetError>,
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

impl FleetJob {
    pub fn queued(id: &str, frames: usize) -> Self {
        FleetJob {
            id: id.to_string(),
            state: JobState::Queued,
            frames,
            frames_done: 0,
            created_ms: now_ms(),
            started_ms: None,
            finished_ms: None,
            attempts: 0,
            replica: None,
            stats: None,
            error: None,
        }
    }

    /// The job's JSON, in the shape of a single replica's (`JobRecord::view`), with the replica
    /// and the attempts.
    pub fn view(&self) -> serde_json::Value {
        let now = now_ms();
        let secs = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e3;
        let running_s = self.started_ms.map(|t| secs(t, self.finished_ms.unwrap_or(now)));
        let (progress, eta) = crate::jobs::progress_and_eta(self.state, self.frames, self.frames_done, running_s);
        let result = (self.state == JobState::Done).then(|| format!("/v1/jobs/{}/result", self.id));
        serde_json::json!({
            "id": self.id,
            "kind": "render",
            "state": self.state,
            "progress": progress,
            "frames": self.frames,
            "frames_done": self.frames_done,
            "eta_seconds": eta,
            "age_seconds": secs(self.created_ms, now),
            "running_seconds": running_s,
            "result": result,
            "stats": self.stats,
            "error": self.error,
            "replica": self.replica,
            "attempts": self.attempts,
        })
    }
}

/// One replica's connection to the fleet.
pub struct Fleet {
    pub config: FleetConfig,
    client: async_nats::Client,
    js: jetstream::Context,
    jobs: kv::Store,
    objects: object_store::ObjectStore,
    queue: stream::Stream,
    workers: consumer::PullConsumer,
}

impl Fleet {
    /// Connects and creates what is missing: the stream, its consumer, the bucket, the store.
    pub async fn connect(config: FleetConfig) -> Result<Fleet> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("cadence {}", config.replica))
            .connect(&config.url)
            .await
            .with_context(|| format!("cannot connect to NATS at {}", config.url))?;
        let js = jetstream::new(client.clone());
        let queue = js
            .get_or_create_stream(stream::Config {
                name: STREAM.into(),
                subjects: vec![SUBJECT.into()],
                retention: stream::RetentionPolicy::WorkQueue,
                max_age: config.ttl,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!("creating the job stream {STREAM}: {e}"))?;
        let workers = queue
            .get_or_create_consumer(
                CONSUMER,
                consumer::pull::Config {
                    durable_name: Some(CONSUMER.into()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    max_deliver: config.max_deliver,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| anyhow!("creating the workers' consumer: {e}"))?;
        let jobs = match js.get_key_value(JOBS_BUCKET).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: JOBS_BUCKET.into(),
                    history: 1,
                    max_age: config.ttl,
                    ..Default::default()
                })
                .await
                .map_err(|e| anyhow!("creating the job table {JOBS_BUCKET}: {e}"))?,
        };
        let objects = match js.get_object_store(OBJECTS_BUCKET).await {
            Ok(os) => os,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: OBJECTS_BUCKET.into(),
                    max_age: config.ttl,
                    ..Default::default()
                })
                .await
                .map_err(|e| anyhow!("creating the object store {OBJECTS_BUCKET}: {e}"))?,
        };
        Ok(Fleet { config, client, js, jobs, objects, queue, workers })
    }

    /// Whether the connection to NATS is up (`/readyz`).
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Queues a job: its files into the store, its record into the table, its message into the
    /// queue (in that order, so a worker that takes it finds both).
    pub async fn submit(&self, msg: &JobMessage, frames: usize, dir: &Path) -> Result<FleetJob> {
        for field in &msg.files {
            let mut f = tokio::fs::File::open(dir.join(field)).await?;
            self.objects
                .put(format!("inputs/{}/{field}", msg.id).as_str(), &mut f)
                .await
                .map_err(|e| anyhow!("storing {field}: {e}"))?;
        }
        let job = FleetJob::queued(&msg.id, frames);
        self.jobs
            .create(&msg.id, serde_json::to_vec(&job)?.into())
            .await
            .map_err(|e| anyhow!("recording the job: {e}"))?;
        self.js
            .publish(SUBJECT, serde_json::to_vec(msg)?.into())
            .await
            .map_err(|e| anyhow!("queueing the job: {e}"))?
            .await
            .map_err(|e| anyhow!("queueing the job: {e}"))?;
        Ok(job)
    }

    /// A job's record and its revision; `None` for an unknown (or expired) id.
    pub async fn job(&self, id: &str) -> Result<Option<(FleetJob, u64)>> {
        match self.jobs.entry(id).await.map_err(|e| anyhow!("reading job {id}: {e}"))? {
            Some(e) if e.operation == kv::Operation::Put => Ok(Some((serde_json::from_slice(&e.value)?, e.revision))),
            _ => Ok(None),
        }
    }

    /// Writes a job's record if it is still at `revision`; the new revision, or `None` when
    /// another writer changed it meanwhile.
    pub async fn update(&self, job: &FleetJob, revision: u64) -> Result<Option<u64>> {
        match self.jobs.update(&job.id, serde_json::to_vec(job)?.into(), revision).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(anyhow!("writing job {}: {e}", job.id)),
        }
    }

    /// The next job for this replica's worker, waiting at most `wait` for one.
    pub async fn next_job(&self, wait: Duration) -> Result<Option<jetstream::Message>> {
        let mut batch = self
            .workers
            .fetch()
            .max_messages(1)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| anyhow!("pulling a job: {e}"))?;
        match batch.next().await {
            Some(Ok(m)) => Ok(Some(m)),
            Some(Err(e)) => Err(anyhow!("pulling a job: {e}")),
            None => Ok(None),
        }
    }

    /// Ends as `failed` the jobs that ran out of deliveries: the queue announces each one
    /// (JetStream's max-deliveries advisory) to every replica, and the first to write the
    /// record wins; then the message leaves the queue. Runs until the connection closes.
    pub async fn fail_exhausted_jobs(&self) {
        #[derive(Deserialize)]
        struct Advisory {
            stream_seq: u64,
            deliveries: i64,
        }
        let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.{CONSUMER}");
        let mut notices = match self.client.subscribe(subject).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("the fleet's max-deliveries notices: {e}");
                return;
            }
        };
        while let Some(notice) = notices.next().await {
            let Ok(a) = serde_json::from_slice::<Advisory>(&notice.payload) else { continue };
            let Ok(raw) = self.queue.get_raw_message(a.stream_seq).await else { continue };
            let Ok(msg) = serde_json::from_slice::<JobMessage>(&raw.payload) else { continue };
            if let Ok(Some((mut job, revision))) = self.job(&msg.id).await {
                if !job.state.is_final() {
                    job.state = JobState::Failed;
                    job.finished_ms = Some(now_ms());
                    job.attempts = a.deliveries;
                    job.error = Some(FleetError {
                        code: "lost".into(),
                        message: format!(
                            "the job was delivered {} times and each time its replica stopped before it ended \
                             (killed, or out of memory?); --fleet-max-deliver bounds the deliveries",
                            a.deliveries
                        ),
                    });
                    if let Ok(Some(_)) = self.update(&job, revision).await {
                        tracing::warn!(job = %job.id, deliveries = a.deliveries, "job lost: out of deliveries");
                        self.remove_inputs(&msg).await;
                    }
                }
            }
            let _ = self.queue.delete_message(a.stream_seq).await;
        }
    }

    /// Tells the queue a job is still being worked on (its ack wait starts over).
    pub async fn in_progress(&self, m: &jetstream::Message) {
        if let Err(e) = m.ack_with(AckKind::Progress).await {
            tracing::warn!("heartbeat of a job: {e}");
        }
    }

    /// Downloads a job's input files into `dir`.
    pub async fn fetch_inputs(&self, msg: &JobMessage, dir: &Path) -> Result<()> {
        for field in &msg.files {
            self.download(&format!("inputs/{}/{field}", msg.id), &dir.join(field)).await?;
        }
        Ok(())
    }

    /// Stores a job's MP4.
    pub async fn put_result(&self, id: &str, path: &Path) -> Result<()> {
        let mut f = tokio::fs::File::open(path).await?;
        self.objects
            .put(format!("results/{id}").as_str(), &mut f)
            .await
            .map_err(|e| anyhow!("storing the result: {e}"))?;
        Ok(())
    }

    /// Downloads a job's MP4 to `path` (written beside it, then moved into place).
    pub async fn get_result(&self, id: &str, path: &Path) -> Result<()> {
        self.download(&format!("results/{id}"), path).await
    }

    /// Forgets an ended job: its record and its MP4.
    pub async fn forget(&self, id: &str) -> Result<()> {
        let _ = self.objects.delete(format!("results/{id}")).await;
        self.jobs.purge(id).await.map_err(|e| anyhow!("forgetting job {id}: {e}"))?;
        Ok(())
    }

    /// Removes a job's input files (once it has ended).
    pub async fn remove_inputs(&self, msg: &JobMessage) {
        for field in &msg.files {
            let _ = self.objects.delete(format!("inputs/{}/{field}", msg.id)).await;
        }
    }

    async fn download(&self, name: &str, path: &Path) -> Result<()> {
        let mut object = self.objects.get(name).await.map_err(|e| anyhow!("fetching {name}: {e}"))?;
        let part = path.with_extension("part");
        let mut f = tokio::fs::File::create(&part).await?;
        // The store checks the object's digest as it reads: a corrupt object is an error here.
        tokio::io::copy(&mut object, &mut f).await.with_context(|| format!("fetching {name}"))?;
        tokio::fs::rename(&part, path).await?;
        Ok(())
    }
}

/// The 501 for what is not yet fleet-wide.
pub fn not_in_fleet(what: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_IMPLEMENTED,
        "not_in_fleet",
        format!("{what} is not available with --nats yet (server/README.md, the fleet)"),
    )
}
