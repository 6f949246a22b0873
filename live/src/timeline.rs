//! A session's speech timeline: one 16 kHz mono track counted from the session's start, which
//! holds the speech sent to the session where it was queued, and silence everywhere else.
//!
//! Two readers walk it in order: the render (through [`TimelineReader`], a WAV stream without
//! end, so the live render reads it as it reads a pipe) and the wire (which sends each 20 ms of
//! it as an Opus packet at its time). The render may read silence only as far as the clock has
//! gone: silence is fixed in the timeline as time passes, so that speech queued now starts
//! now, not after silence the render has read ahead. Speech is queued after the last speech
//! (utterances follow each other) or at the clock, whichever is later. An interrupt cuts the
//! timeline at a sample: what was queued after it is dropped.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The timeline's sample rate.
pub const RATE: usize = 16_000;

/// Why speech could not be queued.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QueueError {
    /// More speech would be waiting than the session allows.
    #[error("{queued:.1} s of speech would be waiting, more than the session's limit of {limit:.1} s")]
    Full { queued: f64, limit: f64 },
    /// The session has ended.
    #[error("the session has ended")]
    Closed,
}

/// See the module documentation.
pub struct Timeline {
    state: Mutex<State>,
    changed: Condvar,
    t0: Instant,
    /// Seconds of queued speech (not yet sent) allowed.
    max_queued_s: f64,
}

struct State {
    /// Samples `from..from + samples.len()`: fixed (speech or silence), not yet forgotten.
    samples: VecDeque<i16>,
    from: usize,
    /// The end of the last speech queued.
    speech_end: usize,
    /// The spans of speech not yet forgotten (in order, disjoint).
    speech: Vec<std::ops::Range<usize>>,
    /// Where each reader is (the next sample it reads).
    render_at: usize,
    wire_at: usize,
    closed: bool,
}

impl State {
    fn written(&self) -> usize {
        self.from + self.samples.len()
    }

    fn fill_silence_to(&mut self, to: usize) {
        let n = to.saturating_sub(self.written());
        self.samples.extend(std::iter::repeat_n(0, n));
    }

    fn forget(&mut self) {
        let keep = self.render_at.min(self.wire_at);
        let n = keep.saturating_sub(self.from).min(self.samples.len());
        self.samples.drain(..n);
        self.from += n;
        // Spans are kept a while longer than samples: the wire asks about the recent past.
        let horizon = self.from.saturating_sub(10 * RATE);
        self.speech.retain(|r| r.end > horizon);
    }
}

impl Timeline {
    /// A timeline whose clock starts now, allowing `max_queued_s` seconds of speech waiting.
    pub fn new(max_queued_s: f64) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                samples: VecDeque::new(),
                from: 0,
                speech_end: 0,
                speech: Vec::new(),
                render_at: 0,
                wire_at: 0,
                closed: false,
            }),
            changed: Condvar::new(),
            t0: Instant::now(),
            max_queued_s,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A reader that panicked leaves consistent sample counts behind.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the timeline's sample 0 was due.
    pub fn start(&self) -> Instant {
        self.t0
    }

    /// The sample the clock is at now.
    pub fn clock_sample(&self) -> usize {
        (self.t0.elapsed().as_secs_f64() * RATE as f64) as usize
    }

    /// Queues `pcm` (16 kHz mono): after the last speech, or now when that is later. Returns
    /// the samples it occupies and the clock's sample when it was queued.
    pub fn queue(&self, pcm: &[i16]) -> Result<(std::ops::Range<usize>, usize), QueueError> {
        let mut st = self.lock();
        if st.closed {
            return Err(QueueError::Closed);
        }
        let clock = self.clock_sample();
        let start = st.written().max(clock).max(st.wire_at);
        let end = start + pcm.len();
        let queued = (end - st.wire_at) as f64 / RATE as f64;
        if queued > self.max_queued_s {
            return Err(QueueError::Full { queued, limit: self.max_queued_s });
        }
        st.fill_silence_to(start);
        st.samples.extend(pcm.iter().copied());
        st.speech_end = end;
        st.speech.push(start..end);
        drop(st);
        self.changed.notify_all();
        Ok((start..end, clock))
    }

    /// Drops the speech queued from sample `at` on (silence takes its place) and returns the
    /// seconds dropped. Samples before `at` that the readers have not read yet stay.
    pub fn interrupt(&self, at: usize) -> f64 {
        let mut st = self.lock();
        let at = at.max(st.from);
        let dropped = st.speech_end.saturating_sub(at);
        if st.written() > at {
            let keep = at - st.from;
            st.samples.truncate(keep);
        }
        st.speech_end = st.speech_end.min(at);
        st.speech.retain(|r| r.start < at);
        if let Some(last) = st.speech.last_mut() {
            last.end = last.end.min(at);
        }
        // A reader already past `at` reads on from where it is: fill what it skipped.
        let furthest = st.render_at.max(st.wire_at);
        st.fill_silence_to(furthest);
        drop(st);
        self.changed.notify_all();
        dropped as f64 / RATE as f64
    }

    /// Seconds of speech queued and not yet sent.
    pub fn queued_seconds(&self) -> f64 {
        let st = self.lock();
        st.speech_end.saturating_sub(st.wire_at) as f64 / RATE as f64
    }

    /// Whether the wire is sending speech now.
    pub fn speaking(&self) -> bool {
        let st = self.lock();
        st.wire_at < st.speech_end
    }

    /// The wire's next sample.
    pub fn wire_at(&self) -> usize {
        self.lock().wire_at
    }

    /// The render's next sample (what it has read so far).
    pub fn render_at(&self) -> usize {
        self.lock().render_at
    }

    /// Whether no speech was queued in samples `range`.
    pub fn silent(&self, range: std::ops::Range<usize>) -> bool {
        let st = self.lock();
        !st.speech.iter().any(|r| r.start < range.end && range.start < r.end)
    }

    /// The wire's `n` samples from `at` on (the wire does not wait: what is not fixed yet
    /// becomes silence). Samples before `at` are skipped.
    pub fn take_for_wire(&self, at: usize, n: usize) -> Vec<i16> {
        let mut st = self.lock();
        st.fill_silence_to(at + n);
        let a = at.max(st.from) - st.from;
        let out: Vec<i16> = st.samples.range(a..a + n.min(st.samples.len() - a)).copied().collect();
        st.wire_at = at + n;
        st.forget();
        out
    }

    /// The render's samples from `at` on: at most `max`, at least one, waiting for speech or
    /// for the clock when there is nothing to read yet. `None` once closed.
    fn read_for_render(&self, at: usize, max: usize) -> Option<Vec<i16>> {
        let mut st = self.lock();
        loop {
            if st.closed {
                return None;
            }
            let clock = self.clock_sample();
            if st.written() < clock {
                st.fill_silence_to(clock);
            }
            if st.written() > at {
                let a = at.max(st.from) - st.from;
                let n = (st.samples.len() - a).min(max);
                let out: Vec<i16> = st.samples.range(a..a + n).copied().collect();
                st.render_at = at + n;
                st.forget();
                return Some(out);
            }
            // Nothing yet: wait for the clock's next 10 ms, or for speech.
            let due = (at + RATE / 100) as f64 / RATE as f64;
            let wait = Duration::from_secs_f64((due - self.t0.elapsed().as_secs_f64()).max(0.001));
            st = self.changed.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Ends the timeline: the render's stream ends, nothing more can be queued.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }
}

/// The timeline as a WAV stream (16 kHz mono 16-bit, its length unknown) for the live render.
pub struct TimelineReader {
    timeline: Arc<Timeline>,
    header: Vec<u8>,
    header_at: usize,
    at: usize,
    /// Bytes of a sample split across reads.
    pending: Vec<u8>,
}

impl TimelineReader {
    /// Reads `timeline` from its sample 0.
    pub fn new(timeline: Arc<Timeline>) -> Self {
        Self { timeline, header: wav_stream_header(), header_at: 0, at: 0, pending: Vec::new() }
    }
}

/// A canonical 44-byte WAV header whose sizes are the streaming placeholder 0xFFFFFFFF, as
/// streaming writers emit (cadence's WAV reader takes it as "until the stream ends").
/// Hand-written: the `hound` writer seeks back to fill in sizes, which a stream cannot.
fn wav_stream_header() -> Vec<u8> {
    let mut h = Vec::with_capacity(44);
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&u32::MAX.to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&1u16.to_le_bytes()); // PCM
    h.extend_from_slice(&1u16.to_le_bytes()); // mono
    h.extend_from_slice(&(RATE as u32).to_le_bytes());
    h.extend_from_slice(&(RATE as u32 * 2).to_le_bytes());
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&16u16.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&u32::MAX.to_le_bytes());
    h
}

impl Read for TimelineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.header_at < self.header.len() {
            let n = (self.header.len() - self.header_at).min(buf.len());
            buf[..n].copy_from_slice(&self.header[self.header_at..self.header_at + n]);
            self.header_at += n;
            return Ok(n);
        }
        if self.pending.is_empty() {
            let Some(samples) = self.timeline.read_for_render(self.at, buf.len().div_ceil(2).max(1)) else {
                return Ok(0);
            };
            self.at += samples.len();
            self.pending = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        }
        let n = self.pending.len().min(buf.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speech_is_placed_at_the_clock_and_after_earlier_speech() {
        let t = Timeline::new(60.0);
        std::thread::sleep(Duration::from_millis(50));
        let (first, clock) = t.queue(&[1; 1600]).unwrap();
        // Queued 50 ms or more after the start: at the clock, not at sample 0.
        assert!(first.start >= 800, "{first:?}");
        assert_eq!(first.start, clock, "nothing before it: it starts at the clock");
        let (second, clock) = t.queue(&[2; 1600]).unwrap();
        assert_eq!(second.start, first.end, "utterances follow each other");
        assert!(clock < second.start, "it waits behind the first");
        assert!((t.queued_seconds() - (second.end as f64 / RATE as f64)).abs() < 1e-9);
        // The wire reads silence, then the first utterance, then the second.
        let head = t.take_for_wire(0, first.start);
        assert!(head.iter().all(|&s| s == 0));
        assert!(t.take_for_wire(first.start, 1600).iter().all(|&s| s == 1));
        assert!(t.speaking());
        assert!(t.take_for_wire(second.start, 1600).iter().all(|&s| s == 2));
        assert!(!t.speaking());
        assert_eq!(t.queued_seconds(), 0.0);
    }

    #[test]
    fn an_interrupt_drops_what_follows_and_keeps_what_precedes() {
        let t = Timeline::new(60.0);
        let (r, _) = t.queue(&[5; 16_000]).unwrap();
        let cut = r.start + 4000;
        let dropped = t.interrupt(cut);
        assert!((dropped - 0.75).abs() < 1e-9, "{dropped}");
        let before = t.take_for_wire(r.start, 4000);
        assert!(before.iter().all(|&s| s == 5));
        let after = t.take_for_wire(cut, 8000);
        assert!(after.iter().all(|&s| s == 0), "silence after the cut");
        assert!(!t.speaking());
        // Speech queued after the interrupt starts at the clock, not where the old speech ended.
        let (next, _) = t.queue(&[7; 160]).unwrap();
        assert!(next.start < r.end, "{next:?} after {r:?}");
    }

    #[test]
    fn silence_is_known_around_speech_and_after_a_cut() {
        let t = Timeline::new(60.0);
        let (r, _) = t.queue(&[3; 8000]).unwrap();
        assert!(t.silent(0..r.start));
        assert!(!t.silent(r.start..r.start + 1));
        assert!(!t.silent(r.end - 1..r.end + 10));
        assert!(t.silent(r.end..r.end + 16_000));
        t.interrupt(r.start + 100);
        assert!(t.silent(r.start + 100..r.end), "the cut speech is silence");
        assert!(!t.silent(r.start..r.start + 100));
    }

    #[test]
    fn queued_speech_is_bounded() {
        let t = Timeline::new(1.0);
        t.queue(&[1; 12_000]).unwrap();
        let e = t.queue(&[1; 8_000]).unwrap_err();
        assert!(matches!(e, QueueError::Full { .. }), "{e}");
        t.close();
        assert_eq!(t.queue(&[1; 10]).unwrap_err(), QueueError::Closed);
    }

    #[test]
    fn the_render_reads_a_wav_stream_of_speech_and_silence_at_the_clock() {
        let t = Timeline::new(60.0);
        t.queue(&[1000; 3200]).unwrap();
        let wav = cadence_media::wav::WavReader::new(TimelineReader::new(t.clone()), None).unwrap();
        let mut stream = cadence_media::AudioStream::new(wav, "timeline").unwrap();
        let (mut mono, mut track) = (Vec::new(), Vec::new());
        let started = Instant::now();
        while mono.len() < 3200 + 1600 {
            assert!(stream.read(160, &mut mono, &mut track).unwrap());
        }
        // The speech, then silence that could only be read once the clock had passed it.
        assert!(mono[..3200].iter().all(|&v| (v - 1000.0 / 32768.0).abs() < 1e-6));
        assert!(mono[3200..4800].iter().all(|&v| v == 0.0));
        assert!(started.elapsed() >= Duration::from_millis(250), "silence was read ahead of the clock");
        t.close();
        while stream.read(160, &mut mono, &mut track).unwrap() {}
    }
}
