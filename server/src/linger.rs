//! Reads a request's body on a task of its own that hands the chunks to the handler, for two
//! reasons.
//!
//! A body that arrives too slowly is cut off ([`BodyTimeout`]): the handler reads an error, and
//! [`crate::middleware::linger`] answers 408 instead of whatever the handler made of it. Only
//! the client's time counts: while the handler does not take the chunks (it is writing the last
//! one to disk), the clock stops.
//!
//! A body that the handler refused is read to its end, so the client gets to read the answer.
//! When the server answers early (413 on a declared length, 415, a 422 found in the first
//! field) and closes the connection with unread bytes in the socket, the kernel resets it, and
//! many clients then report "connection reset" instead of the answer (nginx's "lingering close"
//! solves the same problem). Once the handler drops the body, the task discards the rest, up to
//! a byte and time bound. Past the bound the connection closes as before.

use crate::config::BodyTimeout;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use http_body::Frame;
use http_body_util::BodyExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a refused body may keep being read.
const LINGER_TIME: Duration = Duration::from_secs(10);

struct ChannelBody(mpsc::Receiver<Result<Bytes, axum::Error>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

/// The error the handler reads from a body that came too slowly.
#[derive(Debug)]
struct TooSlow;

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body arrived too slowly")
    }
}

impl std::error::Error for TooSlow {}

/// `req` with its body read by a task that cuts it off past `timeout` (then `timed_out` is
/// set) and discards up to `discard_max` bytes once the handler has dropped it.
pub fn wrap(req: Request, discard_max: usize, timeout: BodyTimeout, timed_out: Arc<AtomicBool>) -> Request {
    let (parts, body) = req.into_parts();
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(forward(body, tx, discard_max, timeout, timed_out));
    Request::from_parts(parts, Body::new(ChannelBody(rx)))
}

async fn forward(
    mut body: Body,
    tx: mpsc::Sender<Result<Bytes, axum::Error>>,
    discard_max: usize,
    timeout: BodyTimeout,
    timed_out: Arc<AtomicBool>,
) {
    // Hand chunks over while the handler reads, within the client's time.
    let start = Instant::now();
    let mut received = 0u64;
    // Time the handler did not take a chunk: the server's, not the client's.
    let mut held = Duration::ZERO;
    loop {
        let deadline = start + held + timeout.allowed(received);
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                timed_out.store(true, Ordering::SeqCst);
                let _ = tx.send(Err(axum::Error::new(TooSlow))).await;
                // Nothing more is read: the connection closes after the 408.
                return;
            }
            Ok(None) => return,
            Ok(Some(Err(e))) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else { continue };
                received += data.len() as u64;
                let t = Instant::now();
                if tx.send(Ok(data)).await.is_err() {
                    break;
                }
                held += t.elapsed();
            }
        }
    }
    // The handler is done with the body: read the rest, within bounds, so the answer arrives.
    let mut discarded = 0usize;
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while let Some(Ok(frame)) = body.frame().await {
            discarded += frame.data_ref().map_or(0, |d| d.len());
            if discarded > discard_max {
                break;
            }
        }
    })
    .await;
}
