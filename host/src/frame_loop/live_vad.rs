//! Voice activity of a live stream, decided part by part as the audio arrives, with either
//! detector (`--vad`, docs/vad.md):
//!
//! - **Silero**: every 512-sample chunk goes through the front end and the network as soon as
//!   it can (their states carried from chunk to chunk, as in a file's pass, so the probabilities
//!   are the file's; the front end, on by default, gives chunk `k` out once chunk `k + 2` has
//!   arrived, and the rest at the stream's end); a part's decisions are Silero's
//!   post-processing over the probabilities made so far. A segment still open at the stream's
//!   received end is treated as Python's `get_speech_timestamps` treats one open at a file's
//!   end; the lookahead ([`lookahead_seconds`]) lets a part's frames see past the open tail.
//!   Only the last [`SILERO_HISTORY_SECONDS`] of probabilities before a part are kept: the
//!   post-processing restarts there (a segment older than that has long been decided for the
//!   frames shown).
//! - **Energy**: 10 ms hop levels against the percentile of the levels received so far
//!   ([`cadence_media::LevelReference`]).
//! - **Digital silence**: a frame whose samples have all arrived is decided by them alone
//!   ([`cadence_media::vad::digital`]): the same decisions as the whole clip's, at once.
//!
//! Either way a frame's decision is final once the frame is shown (the easing reads the shown
//! decisions back, `ShownSpeech`).

use crate::frame_loop::audio::Vad;
use anyhow::Result;
use cadence_media::vad::silero::{self, ChunkProbabilities, SileroConfig, SpeechSegment, CHUNK_SAMPLES};
use cadence_media::vad::{denoise, digital};
use cadence_media::{
    frames_from_hops, hop_activity_above, hop_context, FrameRate, HopLevels, LevelReference, VadConfig, TARGET_RATE,
};

/// Seconds of Silero's probabilities kept before a part's first frame.
pub const SILERO_HISTORY_SECONDS: usize = 30;

/// Seconds of audio past a frame its decision can depend on: Silero keeps a segment only once
/// it has lasted `min_speech_duration_ms` and ends it only after `min_silence_duration_ms` of
/// silence, padded by `speech_pad_ms`, in 32 ms chunks, and its front end (when on) gives a
/// chunk's samples to the network 64 ms after the chunk has arrived; the energy detector's
/// shortest run is 30 ms, and with its hop context 0.25 s covers it; digital silence decides a
/// frame from its own samples.
pub fn lookahead_seconds(vad: &Vad) -> f64 {
    match vad {
        Vad::Silero(c) => {
            let front_end = if c.denoise { denoise::LATENCY_SAMPLES } else { 0 };
            (c.min_speech_duration_ms + c.min_silence_duration_ms + c.speech_pad_ms) / 1e3
                + (CHUNK_SAMPLES + front_end) as f64 / TARGET_RATE as f64
        }
        Vad::Energy => 0.25,
        Vad::Digital => 0.0,
    }
}

/// What a live render keeps to decide voice activity.
pub(crate) enum LiveVad {
    Energy(EnergyLive),
    /// Boxed: the network's state makes it twice the energy detector's size.
    Silero(Box<SileroLive>),
    Digital(digital::ZeroRuns),
}

pub(crate) struct EnergyLive {
    cfg: VadConfig,
    /// Whole 10 ms hop levels from `levels_from` on; `hops` is `None` once the stream ended.
    hops: Option<HopLevels>,
    levels: Vec<f64>,
    levels_from: usize,
    reference: LevelReference,
}

pub(crate) struct SileroLive {
    cfg: SileroConfig,
    chunks: ChunkProbabilities,
    /// Chunk probabilities from chunk `probs_from` on.
    probs: Vec<f32>,
    probs_from: usize,
    /// 16 kHz samples received.
    samples: usize,
    ended: bool,
}

impl LiveVad {
    pub(crate) fn new(vad: &Vad) -> Result<Self> {
        Ok(match vad {
            Vad::Energy => {
                let cfg = VadConfig::default();
                LiveVad::Energy(EnergyLive {
                    hops: Some(HopLevels::new(&cfg)),
                    cfg,
                    levels: Vec::new(),
                    levels_from: 0,
                    reference: LevelReference::new(),
                })
            }
            Vad::Digital => LiveVad::Digital(digital::ZeroRuns::new()),
            Vad::Silero(cfg) => {
                cfg.validate()?;
                LiveVad::Silero(Box::new(SileroLive {
                    cfg: *cfg,
                    chunks: ChunkProbabilities::new(cfg)?,
                    probs: Vec::new(),
                    probs_from: 0,
                    samples: 0,
                    ended: false,
                }))
            }
        })
    }

    /// Takes the 16 kHz samples that have just arrived; `ended` once the stream has ended.
    pub(crate) fn push(&mut self, fresh: &[f32], ended: bool) -> Result<()> {
        match self {
            LiveVad::Energy(e) => {
                let hops = e.hops.as_mut().expect("no samples after the stream's end");
                hops.push(fresh);
                let mut new_levels = hops.take_levels();
                if ended {
                    // The last, shorter hop counts, as in a file's levels.
                    new_levels.extend(e.hops.take().expect("checked above").finish());
                }
                new_levels.iter().for_each(|&l| e.reference.push(l));
                e.levels.extend(new_levels);
            }
            LiveVad::Silero(s) => {
                s.samples += fresh.len();
                s.chunks.push(fresh)?;
                if ended {
                    s.chunks.finish()?;
                }
                s.probs.extend(s.chunks.take());
                s.ended = ended;
            }
            LiveVad::Digital(z) => z.push(fresh),
        }
        Ok(())
    }

    /// Decisions of frames a..end (`end` at most the frames received), from what has arrived.
    pub(crate) fn speech(&self, a: usize, end: usize, fps: FrameRate) -> Vec<bool> {
        let mut decided = vec![false; end.saturating_sub(a)];
        match self {
            LiveVad::Energy(e) => {
                let vad = &e.cfg;
                let first_hop =
                    hop_of(frame_sample(a, fps), vad).saturating_sub(hop_context(vad) + 1).max(e.levels_from);
                if let Some(threshold) = e.reference.threshold(vad) {
                    let levels = &e.levels[first_hop - e.levels_from..];
                    let hops = hop_activity_above(levels, threshold, vad);
                    frames_from_hops(&hops, first_hop, fps.hz(), a, &mut decided, vad);
                }
            }
            LiveVad::Silero(s) => {
                let offset = s.probs_from * CHUNK_SAMPLES;
                // Decided so far: the chunks with a probability (with the front end, two fewer
                // than have arrived), or every sample once the stream has ended (the file's
                // audio length).
                let len = if s.ended { s.samples - offset } else { s.probs.len() * CHUNK_SAMPLES };
                let segments: Vec<SpeechSegment> = silero::speech_segments(&s.probs, len, &s.cfg)
                    .into_iter()
                    .map(|g| SpeechSegment { start: g.start + offset, end: g.end + offset })
                    .collect();
                let all = silero::frames_from_segments(&segments, fps.hz(), end);
                decided.copy_from_slice(&all[a.min(end)..]);
            }
            LiveVad::Digital(z) => decided = z.speech(a, end.max(a), fps.hz()),
        }
        decided
    }

    /// Forgets what frame `a`'s decisions, and those after it, no longer read.
    pub(crate) fn forget_before(&mut self, a: usize, fps: FrameRate) {
        match self {
            LiveVad::Energy(e) => {
                let hop = hop_of(frame_sample(a, fps), &e.cfg).saturating_sub(hop_context(&e.cfg) + 2);
                if hop > e.levels_from {
                    let n = (hop - e.levels_from).min(e.levels.len());
                    e.levels.drain(..n);
                    e.levels_from += n;
                }
            }
            LiveVad::Silero(s) => {
                let keep = frame_sample(a, fps).saturating_sub(SILERO_HISTORY_SECONDS * TARGET_RATE as usize);
                let chunk = keep / CHUNK_SAMPLES;
                if chunk > s.probs_from {
                    let n = (chunk - s.probs_from).min(s.probs.len());
                    s.probs.drain(..n);
                    s.probs_from += n;
                }
            }
            LiveVad::Digital(z) => z.forget_before(frame_sample(a, fps)),
        }
    }
}

/// The 16 kHz sample holding the start of frame `f`: floor(f x 16000 / fps).
pub(crate) fn frame_sample(f: usize, fps: FrameRate) -> usize {
    (f as u128 * TARGET_RATE as u128 * fps.den as u128 / fps.num as u128) as usize
}

/// The hop holding 16 kHz sample `s`.
fn hop_of(s: usize, vad: &VadConfig) -> usize {
    let hop = ((vad.hop_ms * TARGET_RATE as f64 / 1000.0).round() as usize).max(1);
    s / hop
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream fed in uneven pieces gets, once ended, the decisions of the clip decided whole
    /// by Silero, frame for frame; before the end, every frame at least the lookahead before the
    /// received end is already decided as the whole clip decides it. With and without the front
    /// end (whose latency the lookahead must cover).
    #[test]
    fn silero_live_decisions_are_the_files() {
        let wav = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/vad/mix_16k.wav");
        let x = cadence_media::load_wav(&wav).unwrap().samples_16k;
        let fps = FrameRate::whole(25);
        let n = cadence_media::frame_count(x.len() as f64 / 16_000.0, 25.0);
        for cfg in [SileroConfig::default(), SileroConfig { denoise: false, ..SileroConfig::default() }] {
            let file = silero::try_voice_activity_with(&x, 25.0, n, &cfg).unwrap();
            let mut live = LiveVad::new(&Vad::Silero(cfg)).unwrap();
            let lookahead = (lookahead_seconds(&Vad::Silero(cfg)) * 25.0).ceil() as usize;
            let (mut at, mut checked) = (0, 0);
            for piece in x.chunks(777 + 3 * 13) {
                at += piece.len();
                let ended = at == x.len();
                live.push(piece, ended).unwrap();
                let known = if ended { n } else { at * 25 / 16_000 };
                let settled = if ended { n } else { known.saturating_sub(lookahead) };
                let d = live.speech(0, known, fps);
                assert_eq!(d[..settled], file[..settled], "after {at} samples, front end {}", cfg.denoise);
                checked += settled;
            }
            assert!(checked > n && file.iter().any(|&s| s) && file.iter().any(|&s| !s));
        }
    }

    /// The history kept is bounded, and forgetting it does not change the decisions of the
    /// frames after the forgotten part.
    #[test]
    fn silero_live_forgets_old_probabilities() {
        let wav = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/vad/mix_16k.wav");
        let x = cadence_media::load_wav(&wav).unwrap().samples_16k;
        // Three copies: 44 s, past the history.
        let x: Vec<f32> = x.iter().chain(&x).chain(&x).copied().collect();
        let fps = FrameRate::whole(25);
        let n = cadence_media::frame_count(x.len() as f64 / 16_000.0, 25.0);
        let mut live = LiveVad::new(&Vad::default()).unwrap();
        live.push(&x, true).unwrap();
        let whole = live.speech(0, n, fps);
        let a = n - 100;
        live.forget_before(a, fps);
        let LiveVad::Silero(s) = &live else { unreachable!() };
        let kept = s.probs.len() * CHUNK_SAMPLES;
        assert!(s.probs_from > 0 && kept <= SILERO_HISTORY_SECONDS * 16_000 + (n - a) * 640 + 2 * CHUNK_SAMPLES);
        assert_eq!(live.speech(a, n, fps), whole[a..]);
    }
}
