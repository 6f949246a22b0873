//! Energy-based voice activity, one decision per video frame.
//!
//! Method (all numbers are [`VadConfig::default`]):
//! 1. RMS level of 10 ms hops of the 16 kHz signal, in dBFS.
//! 2. The clip's loudness reference is the 95th percentile of the hop levels (hops of digital
//!    silence, below -100 dBFS, are left out): robust to a few clicks, and relative, so a quiet
//!    recording is judged like a loud one.
//! 3. A hop is voiced when its level is above `reference - 35 dB` and above the absolute floor
//!    of -60 dBFS (so a clip of pure background noise is not "speech").
//! 4. Voiced runs shorter than 30 ms are dropped (clicks, pops).
//! 5. Hangover: 200 ms after each voiced hop still counts as speech, so the closures of
//!    plosives and short gaps inside and between words are not silence, while a real pause
//!    (longer than the hangover) is.
//! 6. A video frame is speech when any hop whose centre lies in the frame's time span is
//!    speech; frames past the end of the audio are silence.
//!
//! (webrtc-vad needs C; an energy detector with these guards is what the render needed first:
//! it only has to find pauses of a fraction of a second or longer. The trained detector is
//! [`super::silero`].)

/// Thresholds of [`voice_activity_with`]. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadConfig {
    /// Analysis hop in milliseconds.
    pub hop_ms: f64,
    /// Percentile (0..=100) of hop levels taken as the clip's loudness reference.
    pub reference_percentile: f64,
    /// A hop is voiced above `reference + relative_threshold_db` (negative number).
    pub relative_threshold_db: f64,
    /// ... and above this absolute level in dBFS.
    pub absolute_floor_db: f64,
    /// Voiced runs shorter than this are ignored.
    pub min_speech_ms: f64,
    /// Speech extends this long past each voiced hop.
    pub hangover_ms: f64,
}

impl Default for VadConfig {
    fn default() -> Self {
        VadConfig {
            hop_ms: 10.0,
            reference_percentile: 95.0,
            relative_threshold_db: -35.0,
            absolute_floor_db: -60.0,
            min_speech_ms: 30.0,
            hangover_ms: 200.0,
        }
    }
}

/// Number of video frames for a clip: `ceil(duration_s * fps)` (with a 1e-9 tolerance so
/// that, e.g., 2.0 s at 25 fps is 50 frames and not 51 through rounding).
pub fn frame_count(duration_s: f64, fps: f64) -> usize {
    if duration_s.is_nan() || fps.is_nan() || duration_s <= 0.0 || fps <= 0.0 {
        return 0;
    }
    (duration_s * fps - 1e-9).ceil().max(0.0) as usize
}

/// Voice activity per video frame with the default thresholds ([`VadConfig::default`]).
/// `samples_16k`: mono 16 kHz; returns `n_frames` decisions, `true` = speech.
pub fn voice_activity(samples_16k: &[f32], fps: f64, n_frames: usize) -> Vec<bool> {
    voice_activity_with(samples_16k, fps, n_frames, &VadConfig::default())
}

/// Per-hop levels in dBFS (10 ms hops by default); exposed for diagnostics and plots.
pub fn hop_levels_db(samples_16k: &[f32], cfg: &VadConfig) -> Vec<f64> {
    let mut levels = HopLevels::new(cfg);
    levels.push(samples_16k);
    levels.finish()
}

/// [`hop_levels_db`] of a signal that arrives in pieces: the same levels however it is cut.
/// What voice activity needs from a clip is only these (8 bytes per 10 ms), so a render that
/// reads its audio in pieces keeps them and not the signal.
pub struct HopLevels {
    hop: usize,
    partial: Vec<f32>,
    levels: Vec<f64>,
}

impl HopLevels {
    pub fn new(cfg: &VadConfig) -> Self {
        Self { hop: hop_len(cfg), partial: Vec::new(), levels: Vec::new() }
    }

    pub fn push(&mut self, mut samples_16k: &[f32]) {
        if !self.partial.is_empty() {
            let take = (self.hop - self.partial.len()).min(samples_16k.len());
            self.partial.extend_from_slice(&samples_16k[..take]);
            samples_16k = &samples_16k[take..];
            if self.partial.len() < self.hop {
                return;
            }
            self.levels.push(level_db(&self.partial));
            self.partial.clear();
        }
        let whole = samples_16k.len() / self.hop * self.hop;
        self.levels.extend(samples_16k[..whole].chunks(self.hop).map(level_db));
        self.partial.extend_from_slice(&samples_16k[whole..]);
    }

    /// The whole hops' levels since the last call (a live stream's levels as they come).
    pub fn take_levels(&mut self) -> Vec<f64> {
        std::mem::take(&mut self.levels)
    }

    /// The levels, the last (shorter) hop included.
    pub fn finish(mut self) -> Vec<f64> {
        if !self.partial.is_empty() {
            self.levels.push(level_db(&self.partial));
        }
        self.levels
    }
}

fn level_db(c: &[f32]) -> f64 {
    let ms = c.iter().map(|&s| (s as f64) * (s as f64)).sum::<f64>() / c.len() as f64;
    10.0 * (ms + 1e-20).log10()
}

fn hop_len(cfg: &VadConfig) -> usize {
    ((cfg.hop_ms * crate::audio::TARGET_RATE as f64 / 1000.0).round() as usize).max(1)
}

/// Per-hop speech decisions after threshold, minimum run and hangover.
pub fn hop_activity(samples_16k: &[f32], cfg: &VadConfig) -> Vec<bool> {
    hop_activity_from_levels(&hop_levels_db(samples_16k, cfg), cfg)
}

/// [`hop_activity`] from the clip's hop levels ([`HopLevels`]).
pub fn hop_activity_from_levels(levels: &[f64], cfg: &VadConfig) -> Vec<bool> {
    let mut audible: Vec<f64> = levels.iter().copied().filter(|&l| l > AUDIBLE_DB).collect();
    if audible.is_empty() {
        return vec![false; levels.len()];
    }
    audible.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let reference = audible[reference_rank(audible.len(), cfg)];
    hop_activity_above(levels, threshold_for(reference, cfg), cfg)
}

/// Hops at or below this level (digital silence) are left out of the loudness reference.
const AUDIBLE_DB: f64 = -100.0;

/// The rank of the loudness reference among `audible` sorted levels: round((n - 1) p).
fn reference_rank(audible: usize, cfg: &VadConfig) -> usize {
    let p = cfg.reference_percentile.clamp(0.0, 100.0) / 100.0;
    ((audible - 1) as f64 * p).round() as usize
}

/// The level a hop must exceed to be voiced (step 3).
fn threshold_for(reference: f64, cfg: &VadConfig) -> f64 {
    (reference + cfg.relative_threshold_db).max(cfg.absolute_floor_db)
}

/// The loudness reference of the hop levels seen so far (step 2 of the module documentation),
/// for a live stream, whose whole-clip reference is never known: the `reference_percentile` of
/// the audible levels so far, held as a histogram of 0.001 dB bins so that it costs the same
/// memory (440 KB) after a day as after a second. The bins cover -100 dBFS (the audible bound)
/// to +10 dBFS (a full-scale float signal's hops stay below +3); the percentile is the lower
/// edge of the bin holding its rank, at most 0.001 dB below the sorted levels' value that a
/// file's render takes ([`hop_activity_from_levels`]).
pub struct LevelReference {
    bins: Vec<u32>,
    audible: usize,
}

const REF_BIN_DB: f64 = 0.001;
const REF_BINS: usize = 110_000 + 1;

impl Default for LevelReference {
    fn default() -> Self {
        Self::new()
    }
}

impl LevelReference {
    pub fn new() -> Self {
        Self { bins: vec![0; REF_BINS], audible: 0 }
    }

    /// Adds one hop level (dBFS); digital silence (at or below -100 dBFS) is left out.
    pub fn push(&mut self, level_db: f64) {
        if level_db > AUDIBLE_DB {
            let bin = (((level_db - AUDIBLE_DB) / REF_BIN_DB) as usize).min(REF_BINS - 1);
            self.bins[bin] += 1;
            self.audible += 1;
        }
    }

    /// The reference level, `None` before any audible hop.
    pub fn reference(&self, cfg: &VadConfig) -> Option<f64> {
        if self.audible == 0 {
            return None;
        }
        let rank = reference_rank(self.audible, cfg);
        let mut seen = 0;
        for (bin, &count) in self.bins.iter().enumerate() {
            seen += count as usize;
            if seen > rank {
                return Some(AUDIBLE_DB + bin as f64 * REF_BIN_DB);
            }
        }
        unreachable!("the bins hold every audible level")
    }

    /// The level a hop must exceed to be voiced (step 3), `None` before any audible hop.
    pub fn threshold(&self, cfg: &VadConfig) -> Option<f64> {
        self.reference(cfg).map(|r| threshold_for(r, cfg))
    }
}

/// Per-hop speech decisions for hops whose level is above `threshold` (steps 3 to 5). A run or
/// a hangover that starts before `levels` is not seen: a caller deciding a stretch of a longer
/// signal gives it the hops before as context (a voiced run and a hangover reach 23 hops back
/// with the default thresholds).
pub fn hop_activity_above(levels: &[f64], threshold: f64, cfg: &VadConfig) -> Vec<bool> {
    let mut voiced: Vec<bool> = levels.iter().map(|&l| l > threshold).collect();

    // Drop voiced runs shorter than min_speech_ms.
    let min_run = (cfg.min_speech_ms / cfg.hop_ms).ceil() as usize;
    let mut i = 0;
    while i < voiced.len() {
        if voiced[i] {
            let start = i;
            while i < voiced.len() && voiced[i] {
                i += 1;
            }
            if i - start < min_run {
                voiced[start..i].iter_mut().for_each(|v| *v = false);
            }
        } else {
            i += 1;
        }
    }

    // Hangover.
    let hang = (cfg.hangover_ms / cfg.hop_ms).round() as usize;
    let mut out = voiced.clone();
    let mut left = 0usize;
    for (o, &v) in out.iter_mut().zip(&voiced) {
        if v {
            left = hang;
        } else if left > 0 {
            *o = true;
            left -= 1;
        }
    }
    out
}

/// Hops of context [`hop_activity_above`] needs before a stretch to decide it as the whole
/// signal would: the longest voiced run that can still be dropped plus the hangover.
pub fn hop_context(cfg: &VadConfig) -> usize {
    (cfg.min_speech_ms / cfg.hop_ms).ceil() as usize + (cfg.hangover_ms / cfg.hop_ms).round() as usize
}

/// Voice activity per video frame with explicit thresholds.
pub fn voice_activity_with(samples_16k: &[f32], fps: f64, n_frames: usize, cfg: &VadConfig) -> Vec<bool> {
    voice_activity_from_levels(&hop_levels_db(samples_16k, cfg), fps, n_frames, cfg)
}

/// [`voice_activity_with`] from the clip's hop levels ([`HopLevels`]), for audio read in pieces.
pub fn voice_activity_from_levels(levels: &[f64], fps: f64, n_frames: usize, cfg: &VadConfig) -> Vec<bool> {
    let mut frames = vec![false; n_frames];
    frames_from_hops(&hop_activity_from_levels(levels, cfg), 0, fps, 0, &mut frames, cfg);
    frames
}

/// Step 6: marks as speech every frame of `frames` (video frames `first_frame..`) that holds
/// the centre of a speech hop of `hops` (hops `first_hop..`). Frames are only set, never
/// cleared.
pub fn frames_from_hops(
    hops: &[bool],
    first_hop: usize,
    fps: f64,
    first_frame: usize,
    frames: &mut [bool],
    cfg: &VadConfig,
) {
    if fps.is_nan() || fps <= 0.0 {
        return;
    }
    let hop = hop_len(cfg) as f64;
    let rate = crate::audio::TARGET_RATE as f64;
    for (h, &speech) in hops.iter().enumerate() {
        if !speech {
            continue;
        }
        let centre_s = ((first_hop + h) as f64 + 0.5) * hop / rate;
        let f = (centre_s * fps).floor() as usize;
        if let Some(slot) = f.checked_sub(first_frame).and_then(|i| frames.get_mut(i)) {
            *slot = true;
        }
    }
}
