//! A session: a [`Timeline`] of speech, a render that reads it and makes frames, and the
//! [`wire`](crate::wire) that sends both to the peer.

use crate::timeline::{QueueError, Timeline, RATE};
use crate::wire::{FrameSender, NetConfig, StartError, Wire, WireConfig, WireShared, WireStats};
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What makes the session's frames: given the timeline (to read as a live stream), where to
/// send frames, and a flag that asks it to stop. It returns when the timeline closes or the
/// flag is set; its error, if any, ends the session.
pub type Render = Box<dyn FnOnce(Arc<Timeline>, FrameSender, Arc<AtomicBool>) -> Result<()> + Send>;

/// A running session.
pub struct Session {
    timeline: Arc<Timeline>,
    shared: Arc<WireShared>,
    render_stop: Arc<AtomicBool>,
    wire: Option<JoinHandle<()>>,
    render: Option<JoinHandle<()>>,
    /// The render's error, once it has failed.
    render_failed: Arc<Mutex<Option<String>>>,
    fps: f64,
    ramp: usize,
}

/// A session's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SessionStats {
    /// Speech is going out on the wire now.
    pub speaking: bool,
    /// Seconds of speech queued and not yet sent.
    pub queued_audio_s: f64,
    #[serde(flatten)]
    pub wire: WireStats,
    /// The render's error, if it failed (the session's stream has ended then).
    pub render_error: Option<String>,
}

impl Session {
    /// Answers `offer` (SDP) and starts the wire and `render`. Returns the session and the
    /// SDP answer. `queue` frames at most wait between the render and the wire;
    /// `max_queued_s` seconds of speech at most wait to be sent.
    pub fn start(
        offer: &str,
        net: &NetConfig,
        wire: WireConfig,
        queue: usize,
        max_queued_s: f64,
        render: Render,
    ) -> Result<(Self, String), StartError> {
        let (w, answer) = Wire::accept(offer, net)?;
        let timeline = Timeline::new(max_queued_s);
        let (fps, ramp) = (wire.fps, wire.ramp);
        let (frames, shared, wire_thread) =
            w.spawn(wire, timeline.clone(), queue).map_err(|e| StartError::Internal(format!("{e:#}")))?;
        let render_stop = Arc::new(AtomicBool::new(false));
        let render_failed = Arc::new(Mutex::new(None));
        let (t, s, failed) = (timeline.clone(), render_stop.clone(), render_failed.clone());
        let render_thread = std::thread::Builder::new()
            .name("cadence-session-render".into())
            .spawn(move || {
                if let Err(e) = render(t.clone(), frames, s) {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{e:#}"));
                }
                // The render has stopped: so has the session's stream.
                t.close();
            })
            .map_err(|e| StartError::Internal(format!("starting the render's thread: {e}")))?;
        let session = Self {
            timeline,
            shared,
            render_stop,
            wire: Some(wire_thread),
            render: Some(render_thread),
            render_failed,
            fps,
            ramp,
        };
        Ok((session, answer))
    }

    /// Queues speech (16 kHz mono); returns the seconds from the session's start where it begins.
    /// Queues `pcm` (16 kHz mono): returns where it starts on the timeline and how long it
    /// waits there behind the speech queued before it (0 when it starts at once), in seconds.
    pub fn speak(&self, pcm: &[i16]) -> Result<(f64, f64), QueueError> {
        let (r, clock) = self.timeline.queue(pcm)?;
        Ok((r.start as f64 / RATE as f64, r.start.saturating_sub(clock) as f64 / RATE as f64))
    }

    /// Drops the speech not yet sent and eases the picture to rest from the next frame on;
    /// returns the seconds of speech dropped.
    ///
    /// The render has read audio up to the clock, so its frames up to there (and the ramp
    /// after, which eases out of that speech) were made with speech that is now cut: the wire
    /// shows the easing to rest and then the rest frame in their place, and takes the render's
    /// frames again from the first one made from audio read after the cut.
    pub fn interrupt(&self) -> f64 {
        let asked = std::time::Instant::now();
        let at = self.timeline.wire_at();
        let dropped = self.timeline.interrupt(at);
        if dropped > 0.0 {
            let spf = RATE as f64 / self.fps;
            let read = (self.timeline.render_at() as f64 / spf).ceil() as usize;
            // The render's voice activity pads and holds speech: a few frames beyond its ramp.
            let resume = read + self.ramp + 5;
            *self.shared.interrupt.lock().unwrap_or_else(|e| e.into_inner()) = Some((asked, resume));
        }
        dropped
    }

    /// The session's timeline.
    pub fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    /// The frame rate on the wire.
    pub fn fps(&self) -> f64 {
        self.fps
    }

    /// Whether the wire has stopped (the peer left, or it failed).
    pub fn ended(&self) -> bool {
        self.wire.as_ref().is_none_or(|h| h.is_finished())
    }

    /// The session's figures now.
    pub fn stats(&self) -> SessionStats {
        let wire = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let render_error = self.render_failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        SessionStats {
            speaking: self.timeline.speaking(),
            queued_audio_s: self.timeline.queued_seconds(),
            wire,
            render_error,
        }
    }

    /// Stops the render and the wire and waits for both; the render's error, if it failed.
    pub fn close(mut self) -> Result<SessionStats> {
        self.stop_threads()
    }

    fn stop_threads(&mut self) -> Result<SessionStats> {
        self.render_stop.store(true, Ordering::Relaxed);
        self.shared.stop.store(true, Ordering::Relaxed);
        self.timeline.close();
        if let Some(h) = self.wire.take() {
            let _ = h.join();
        }
        if let Some(Err(_)) = self.render.take().map(|h| h.join()) {
            return Err(anyhow::anyhow!("the session's render panicked"));
        }
        let stats = self.stats();
        match &stats.render_error {
            Some(e) => Err(anyhow::anyhow!("the session's render failed: {e}")),
            None => Ok(stats),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.stop_threads();
    }
}
