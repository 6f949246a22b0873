//! Live WebRTC sessions: an avatar's frames as H.264 and its speech as Opus, sent over
//! [str0m](https://docs.rs/str0m) to a browser or any WebRTC peer, each at its time.
//!
//! A session is three parts (docs/live.md):
//! - [`timeline`]: the session's speech, one 16 kHz track from the session's start, speech
//!   where it was queued and silence elsewhere; the render reads it as a WAV stream, the wire
//!   sends it;
//! - the render (outside this crate: `cadence::musetalk::live` or `cadence::ditto::live`),
//!   which reads the timeline as a live stream and hands its frames to the wire;
//! - [`wire`]: the thread that owns the peer connection and sends a frame every 1/fps and 20 ms
//!   of speech every 20 ms, with [`encode`]'s encoders.
//!
//! [`session::Session`] puts them together.

pub mod arrival;
pub mod encode;
pub mod receiver;
pub mod session;
pub mod timeline;
pub mod wire;

pub use session::{Session, SessionStats};
pub use timeline::{QueueError, Timeline, TimelineReader};
pub use wire::{parse_offer, FrameSender, NetConfig, StartError, WireConfig, WireStats};
