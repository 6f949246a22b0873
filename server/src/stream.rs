//! `POST /generate?stream=fmp4`: the fragmented MP4 sent while it renders.
//!
//! The render thread writes the stream into a [`SegmentSender`]. The media crate's
//! `FragmentedWriter` hands it each segment (the init segment, then one `moof`+`mdat` per GOP)
//! as one `write_all` and one `flush`, and each flush becomes one message on a bounded channel
//! (`blocking_send`: a client that reads slowly holds the render back rather than filling the
//! server's memory). The response body, a [`StreamBody`], sends each segment on as a chunk.
//!
//! The body ends cleanly only on [`Chunk::End`], which the render thread sends after the last
//! fragment. A render that fails sends [`Chunk::Error`]; a thread that dies sends nothing and
//! the channel closes. Both end the body with an error: the connection is cut before chunked
//! encoding's last chunk, so the client sees a truncated stream, never a well-formed one that is
//! wrong. A client that goes away drops the body: the next send fails, the writer sets the
//! render's cancel flag and fails the write, and the body's [`CancelGuard`] sets the flag too.

use crate::error::ApiError;
use crate::state::CancelGuard;
use axum::body::Bytes;
use http_body::Frame;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::mpsc;

/// Segments the channel holds before the render waits for the client.
pub const CHANNEL_SEGMENTS: usize = 4;

/// The `stream` query parameter of `/generate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The whole MP4 after the render, with the statistics in the headers.
    Whole,
    /// `stream=fmp4`: fragmented MP4, segment by segment while rendering.
    Fmp4,
}

/// The mode from `/generate`'s query string: `stream=fmp4`, or nothing. Any other parameter or
/// value is refused (422), as unknown form fields are.
pub fn mode(query: Option<&str>) -> Result<Mode, ApiError> {
    let mut mode = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "stream" {
            return Err(ApiError::invalid("unknown_parameter", format!("unknown query parameter '{k}' (only stream)")));
        }
        if mode.is_some() {
            return Err(ApiError::invalid("duplicate_parameter", "the query parameter 'stream' is given twice"));
        }
        mode = Some(match v {
            "fmp4" => Mode::Fmp4,
            other => {
                let shown: String = other.chars().take(40).collect();
                return Err(ApiError::invalid("invalid_stream", format!("stream: '{shown}': expected fmp4")));
            }
        });
    }
    Ok(mode.unwrap_or(Mode::Whole))
}

/// What the render thread sends the response body.
#[derive(Debug)]
pub enum Chunk {
    /// One whole segment.
    Data(Bytes),
    /// The stream is complete.
    End,
    /// The render failed after (or before) the first segment: the body ends with this error.
    Error(String),
}

/// A [`Write`] whose every `flush` sends what was written since the last one as one segment.
pub struct SegmentSender {
    tx: mpsc::Sender<Chunk>,
    open: Vec<u8>,
    cancel: Arc<AtomicBool>,
    first_sent: Arc<OnceLock<Instant>>,
}

impl SegmentSender {
    /// A sender on `tx`; a failed send (the body is gone) sets `cancel`. `first_sent` gets the
    /// time of the first segment sent.
    pub fn new(tx: mpsc::Sender<Chunk>, cancel: Arc<AtomicBool>, first_sent: Arc<OnceLock<Instant>>) -> Self {
        Self { tx, open: Vec::new(), cancel, first_sent }
    }
}

impl Write for SegmentSender {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.open.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.open.is_empty() {
            return Ok(());
        }
        let segment = Bytes::from(std::mem::take(&mut self.open));
        if self.tx.blocking_send(Chunk::Data(segment)).is_err() {
            // The response body was dropped: the client closed the connection.
            self.cancel.store(true, Ordering::SeqCst);
            return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client closed the connection"));
        }
        let _ = self.first_sent.set(Instant::now());
        Ok(())
    }
}

/// The response body of a streamed render: the first segment, then the channel's, until
/// [`Chunk::End`]. It holds the request's cancel guard, so dropping it (the client went away)
/// cancels the render, and the drain at shutdown waits for it.
pub struct StreamBody {
    guard: Option<CancelGuard>,
    first: Option<Bytes>,
    rx: mpsc::Receiver<Chunk>,
}

impl StreamBody {
    pub fn new(guard: CancelGuard, first: Bytes, rx: mpsc::Receiver<Chunk>) -> Self {
        Self { guard: Some(guard), first: Some(first), rx }
    }

    fn end(&mut self) {
        self.guard = None;
        self.rx.close();
    }
}

impl http_body::Body for StreamBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if self.guard.is_none() {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Chunk::Data(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(Some(Chunk::End)) => {
                self.end();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Chunk::Error(msg))) => {
                self.end();
                Poll::Ready(Some(Err(axum::Error::new(std::io::Error::other(msg)))))
            }
            Poll::Ready(None) => {
                self.end();
                Poll::Ready(Some(Err(axum::Error::new(std::io::Error::other(
                    "the render thread ended without finishing the stream",
                )))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.guard.is_none()
    }
}

/// The RFC 6381 `codecs` parameter of a fragmented MP4 from its init segment (`ftyp`+`moov`):
/// `avc1.PPCCLL` from the `avcC` (profile, compatibility, level), and `mp4a.40.2` when a track
/// is AAC (the only audio cadence writes). `None` when the segment has no `avcC`.
pub fn codecs(init: &[u8]) -> Option<String> {
    let mut found = Found::default();
    walk(init, &mut found);
    let video = found.avc?;
    Some(if found.aac { format!("{video}, mp4a.40.2") } else { video })
}

#[derive(Default)]
struct Found {
    avc: Option<String>,
    aac: bool,
}

/// Boxes of `data` (ISO/IEC 14496-12 §4.2), descending into the containers on the path to the
/// sample entries.
fn walk(mut data: &[u8], found: &mut Found) {
    while data.len() >= 8 {
        let size = u32::from_be_bytes(data[..4].try_into().unwrap()) as usize;
        let kind = &data[4..8];
        // Size 0 (to the end) and 1 (a 64-bit size) do not occur in an init segment.
        if size < 8 || size > data.len() {
            return;
        }
        let body = &data[8..size];
        match kind {
            b"moov" | b"trak" | b"mdia" | b"minf" | b"stbl" => walk(body, found),
            // Full box (version, flags) then the entry count.
            b"stsd" if body.len() >= 8 => walk(&body[8..], found),
            // A visual sample entry's fields take 78 bytes before its child boxes (§12.1.3).
            b"avc1" | b"avc3" if body.len() >= 78 => walk(&body[78..], found),
            b"avcC" if body.len() >= 4 => {
                found.avc.get_or_insert_with(|| format!("avc1.{:02X}{:02X}{:02X}", body[1], body[2], body[3]));
            }
            b"mp4a" => found.aac = true,
            _ => {}
        }
        data = &data[size..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cadence_media::{AudioFormat, EncoderKind, FragmentedWriter, FrameRate, SegmentQueue};

    #[test]
    fn the_stream_parameter() {
        assert_eq!(mode(None).unwrap(), Mode::Whole);
        assert_eq!(mode(Some("")).unwrap(), Mode::Whole);
        assert_eq!(mode(Some("stream=fmp4")).unwrap(), Mode::Fmp4);
        for (q, code) in [
            ("stream=bogus", "invalid_stream"),
            ("stream=", "invalid_stream"),
            ("stream", "invalid_stream"),
            ("stream=fmp4&stream=fmp4", "duplicate_parameter"),
            ("streem=fmp4", "unknown_parameter"),
        ] {
            let e = mode(Some(q)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (422, code), "{q}");
        }
    }

    /// The codecs read back from an init segment are the ones the writer says it wrote.
    #[test]
    fn codecs_from_the_init_segment() {
        for audio in [None, Some(AudioFormat { sample_rate: 16000, channels: 1 })] {
            let mut w = FragmentedWriter::new(
                SegmentQueue::default(),
                "test",
                64,
                48,
                FrameRate::whole(25),
                EncoderKind::OpenH264,
                audio,
            )
            .unwrap();
            w.push_nv12(&vec![128u8; w.frame_len()]).unwrap();
            let init = w.get_mut().pop().expect("the init segment is out after the first frame");
            assert_eq!(codecs(&init), w.codecs(), "audio {audio:?}");
            assert!(codecs(&init).unwrap().starts_with("avc1."));
        }
        assert_eq!(codecs(b"\0\0\0\x08moov"), None);
        assert_eq!(codecs(b"\xff\xff\xff\xffmoov"), None);
    }

    #[tokio::test]
    async fn the_body_ends_cleanly_only_on_end() {
        use http_body_util::BodyExt;
        let state = std::sync::Arc::new(crate::state::ServerState::new(test_config()).unwrap());
        for (last, ok) in [(Some(Chunk::End), true), (Some(Chunk::Error("boom".into())), false), (None, false)] {
            let (tx, rx) = mpsc::channel(4);
            tx.send(Chunk::Data(Bytes::from_static(b"two"))).await.unwrap();
            if let Some(c) = last {
                tx.send(c).await.unwrap();
            }
            drop(tx);
            let body = StreamBody::new(state.track(), Bytes::from_static(b"one"), rx);
            let got = axum::body::Body::new(body).collect().await;
            assert_eq!(got.is_ok(), ok);
            if let Ok(b) = got {
                assert_eq!(&b.to_bytes()[..], b"onetwo");
            }
            assert_eq!(state.inflight(), 0, "the guard is released when the body ends");
        }
    }

    fn test_config() -> crate::Config {
        #[derive(clap::Parser)]
        struct F {
            #[command(flatten)]
            serve: crate::ServeArgs,
        }
        <F as clap::Parser>::try_parse_from(["serve"]).unwrap().serve.config().unwrap()
    }
}
