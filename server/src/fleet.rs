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
//! - **The avatars**: a second object store (`cadence_avatars`, kept until deleted) holds each
//!   registered avatar under its content-derived id: the file as sent (`<id>/source`), the
//!   request's fields (`<id>/request.json`) and, per decoder, the prepared avatar in the
//!   `.cadence-avatar` format (`<id>/<decoder>`). A replica asked for an avatar it does not hold
//!   rebuilds it from those ([`crate::fleet_avatars`]): the file checked again (the same code
//!   finds the same faces) and the preparation read, not computed again.

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
pub const AVATARS_BUCKET: &str = "cadence_avatars";

/// How a fleet runs: `--nats`, `--replica-name`, `--fleet-ack-wait-seconds`, `--fleet-max-deliver`.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    pub url: String,
    pub replica: String,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    /// Jobs that may wait in the queue, fleet-wide (`--fleet-max-queued`).
    pub max_queued: u64,
    /// Job records and files expire this long after they were last written (`--job-ttl-seconds`).
    pub ttl: Duration,
}

/// The fleet's queue as its consumer counts it.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueState {
    /// Jobs posted and not yet taken by a replica.
    pub queued: u64,
    /// Jobs taken and not yet acked (rendering, or taken by a replica that died).
    pub running: u64,
    /// Jobs delivered more than once and not yet acked.
    pub redelivered: u64,
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
    /// Its message's sequence number in the queue (a job cancelled while queued leaves the
    /// queue at once).
    #[serde(default)]
    pub queue_seq: Option<u64>,
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
            queue_seq: None,
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
    avatars: object_store::ObjectStore,
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
        let objects = object_store(&js, OBJECTS_BUCKET, config.ttl).await?;
        // Avatars are kept until deleted (no age limit).
        let avatars = object_store(&js, AVATARS_BUCKET, Duration::ZERO).await?;
        Ok(Fleet { config, client, js, jobs, objects, avatars, queue, workers })
    }

    /// Whether the connection to NATS is up (`/readyz`).
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The queue's counts, fleet-wide.
    pub async fn queue_state(&self) -> Result<QueueState> {
        let info = self.workers.get_info().await.map_err(|e| anyhow!("reading the queue's state: {e}"))?;
        Ok(QueueState {
            queued: info.num_pending,
            running: info.num_ack_pending as u64,
            redelivered: info.num_redelivered as u64,
        })
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
        let mut job = FleetJob::queued(&msg.id, frames);
        let revision = self
            .jobs
            .create(&msg.id, serde_json::to_vec(&job)?.into())
            .await
            .map_err(|e| anyhow!("recording the job: {e}"))?;
        let queued = async {
            self.js
                .publish(SUBJECT, serde_json::to_vec(msg)?.into())
                .await
                .map_err(|e| anyhow!("queueing the job: {e}"))?
                .await
                .map_err(|e| anyhow!("queueing the job: {e}"))
        };
        match queued.await {
            Ok(ack) => {
                // Unless a worker took it meanwhile (then it has left the queue anyway).
                job.queue_seq = Some(ack.sequence);
                if let Err(e) = self.update(&job, revision).await {
                    tracing::warn!("{e:#}");
                }
            }
            Err(e) => {
                // Not queued: no record or files left behind for a job that will never run.
                let _ = self.jobs.purge(&msg.id).await;
                self.remove_inputs(msg).await;
                return Err(e);
            }
        }
        Ok(job)
    }

    /// Takes a cancelled job's message out of the queue (it would wait there until a worker
    /// skipped it, counted as queued).
    pub async fn dequeue(&self, job: &FleetJob) {
        if let Some(seq) = job.queue_seq {
            let _ = self.queue.delete_message(seq).await;
        }
        for field in crate::generate::FILE_FIELDS {
            let _ = self.objects.delete(format!("inputs/{}/{field}", job.id)).await;
        }
    }

    /// A job's record and its revision; `None` for an unknown (or expired) id.
    pub async fn job(&self, id: &str) -> Result<Option<(FleetJob, u64)>> {
        match self.jobs.entry(id).await.map_err(|e| anyhow!("reading job {id}: {e}"))? {
            Some(e) if e.operation == kv::Operation::Put => Ok(Some((serde_json::from_slice(&e.value)?, e.revision))),
            _ => Ok(None),
        }
    }

    /// A job's records as they change, starting with the current one; the stream ends when the
    /// record is forgotten.
    pub async fn watch_job(&self, id: &str) -> Result<impl futures_util::Stream<Item = FleetJob> + Send + 'static> {
        let watch = self.jobs.watch_with_history(id).await.map_err(|e| anyhow!("watching job {id}: {e}"))?;
        Ok(watch
            .take_while(|e| std::future::ready(matches!(e, Ok(e) if e.operation == kv::Operation::Put)))
            .filter_map(|e| std::future::ready(e.ok().and_then(|e| serde_json::from_slice(&e.value).ok()))))
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

    /// The next job for this replica's worker, waiting at most `wait` for one (a pull request
    /// that waits on the server; `fetch` would answer at once when the queue is empty, and an
    /// idle worker would spin).
    pub async fn next_job(&self, wait: Duration) -> Result<Option<jetstream::Message>> {
        let mut batch = self
            .workers
            .batch()
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

    /// Stores `bytes` as the avatar object `name` (`<id>/source`, `<id>/request.json`,
    /// `<id>/<decoder>`).
    pub async fn put_avatar_object(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.avatars
            .put(name, &mut std::io::Cursor::new(bytes))
            .await
            .map_err(|e| anyhow!("storing avatar object {name}: {e}"))?;
        Ok(())
    }

    /// The avatar object `name`, or `None` when the store has none.
    pub async fn avatar_object(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let mut object = match self.avatars.get(name).await {
            Ok(o) => o,
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(anyhow!("fetching avatar object {name}: {e}")),
        };
        let mut bytes = Vec::new();
        // Digest-checked as it is read.
        tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes)
            .await
            .with_context(|| format!("fetching avatar object {name}"))?;
        Ok(Some(bytes))
    }

    /// Whether the avatar object `name` exists (without reading it).
    pub async fn has_avatar_object(&self, name: &str) -> Result<bool> {
        match self.avatars.info(name).await {
            Ok(i) => Ok(!i.deleted),
            Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => Ok(false),
            Err(e) => Err(anyhow!("looking up avatar object {name}: {e}")),
        }
    }

    /// Removes the avatar objects whose names begin with `prefix` (`<id>/`).
    pub async fn delete_avatar_objects(&self, prefix: &str) -> Result<()> {
        let mut list = self.avatars.list().await.map_err(|e| anyhow!("listing avatars: {e}"))?;
        let mut names = Vec::new();
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| anyhow!("listing avatars: {e}"))?;
            if info.name.starts_with(prefix) && !info.deleted {
                names.push(info.name);
            }
        }
        for name in names {
            self.avatars.delete(name.as_str()).await.map_err(|e| anyhow!("deleting avatar object {name}: {e}"))?;
        }
        Ok(())
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

/// The object store `bucket`, created when missing with `max_age` (zero: no limit).
async fn object_store(js: &jetstream::Context, bucket: &str, max_age: Duration) -> Result<object_store::ObjectStore> {
    match js.get_object_store(bucket).await {
        Ok(os) => Ok(os),
        Err(_) => js
            .create_object_store(object_store::Config { bucket: bucket.into(), max_age, ..Default::default() })
            .await
            .map_err(|e| anyhow!("creating the object store {bucket}: {e}")),
    }
}

/// The 503 for a fleet that cannot be reached (the cause goes to the log).
pub fn unavailable(e: anyhow::Error) -> ApiError {
    tracing::error!("the fleet: {e:#}");
    ApiError::unavailable("fleet_unavailable", "the job queue (NATS) cannot be reached")
}
