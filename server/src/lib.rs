//! cadence's render server, `cadence serve`: the source's `POST /generate` (multipart, and a JSON
//! variant) on axum, with the engines loaded once and shared, avatars prepared once, render slots
//! and a bounded queue, fragmented MP4 streamed while it renders (`?stream=fmp4`), limits checked
//! before any engine work, jobs for long clips (`/v1/jobs`: progress, server-sent events, the
//! result with HTTP ranges), bearer-token auth, Prometheus metrics and an OpenAPI document.
//! Stateless apart from the avatar cache (README.md).

pub mod admission;
pub mod avatar_routes;
pub mod avatars;
pub mod calibration;
pub mod config;
pub mod engines;
pub mod error;
pub mod fleet;
pub mod fleet_avatars;
pub mod fleet_jobs;
pub mod generate;
pub mod job_routes;
pub mod jobs;
pub mod linger;
pub mod listen;
pub mod livetalking;
pub mod metrics;
pub mod middleware;
pub mod openapi;
pub mod options;
pub mod render_job;
pub mod routes;
pub mod serve;
pub mod sessions;
pub mod state;
pub mod stats;
pub mod stream;
pub mod tempdirs;
pub mod upload;
pub mod validate;

pub use config::{Config, ServeArgs};
pub use serve::{run, serve, spawn, RunningServer};
