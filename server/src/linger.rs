//! Reads the rest of a request body that the handler refused, so the client gets to read the
//! answer. When the server answers early (413 on a declared length, 415, a 422 found in the first
//! field) and closes the connection with unread bytes in the socket, the kernel resets it, and
//! many clients then report "connection reset" instead of the answer (nginx's "lingering close"
//! solves the same problem). The body is read on a task of its own that hands the chunks to the
//! handler. Once the handler drops the body, the task discards the rest, up to a byte and time
//! bound. Past the bound the connection closes as before.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use http_body::Frame;
use http_body_util::BodyExt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

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

/// `req` with its body read by a task that discards up to `discard_max` bytes once the handler
/// has dropped it.
pub fn wrap(req: Request, discard_max: usize) -> Request {
    let (parts, body) = req.into_parts();
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(forward(body, tx, discard_max));
    Request::from_parts(parts, Body::new(ChannelBody(rx)))
}

async fn forward(mut body: Body, tx: mpsc::Sender<Result<Bytes, axum::Error>>, discard_max: usize) {
    // Hand chunks over while the handler reads.
    loop {
        match body.frame().await {
            None => return,
            Some(Err(e)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else { continue };
                if tx.send(Ok(data)).await.is_err() {
                    break;
                }
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
