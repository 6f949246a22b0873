//! Silero's front end: noise suppression and level normalisation before the network.
//!
//! ## Why
//! Silero VAD v5 was trained on speech at ordinary levels. In stationary background noise it
//! misses quiet speech: on the `vad` experiment's mixes (`experiments/src/bin/vad.rs`) at 5 and
//! 0 dB SNR the sentences at -12 dB sit 7 and 12 dB under the noise, and Silero on the raw signal
//! bypassed 55 and 209 speech frames where the energy detector, tuned with the truth, bypassed
//! 166 and 168. Its output also depends on the absolute level (the same sentence 20 dB quieter
//! gets lower probabilities). So, before the network: a classic single-channel noise suppressor
//! takes the stationary noise down, then an automatic gain control brings what is left to a
//! steady level. The network and its post-processing are unchanged.
//!
//! ## The numerics (16 kHz mono; f64 inside, f32 out)
//! 1. **Noise suppression**: an STFT Wiener filter with a minimum-statistics noise estimate
//!    (Martin 2001, in its simplest form) and the decision-directed a priori SNR
//!    (Ephraim and Malah 1984).
//!    - Frames of `N` = 1024 samples every `H` = 256 (75 % overlap); frame `i` covers samples
//!      `[i H, i H + N)` of the signal, zero past its end (so the first frames see the start of
//!      the signal and the last ones its zero-padded end). Window `w = sqrt(hann)`, the periodic
//!      Hann `0.5 - 0.5 cos(2 pi n / N)`, at analysis and at synthesis; the overlap-added
//!      output is scaled by 1/2 (four Hann windows at 75 % overlap sum to 2), so a gain of 1
//!      gives the input back exactly wherever four frames overlap, i.e. from sample `N - H` on
//!      (the first 768 samples, which fewer frames cover, come out tapered by the window).
//!    - Per frame: `X = rfft(frame w)`, `P = |X|^2`; the smoothed periodogram
//!      `Ps = 0.8 Ps + 0.2 P` (`Ps = P` on the first frame); the noise power per bin is
//!      `1.5 x` the minimum of `Ps` over the last `D` = floor(1.5 s x 16000 / 256) = 93 frames
//!      (the current one included), at least 1e-12. The minimum is exact over exactly those
//!      frames: the van Herk / Gil-Werman scheme (blocks of `D` frames; the window's minimum is
//!      that of the previous block's suffix and the current block's prefix), O(1) per bin and
//!      frame, rather than Martin's approximation by sub-windows.
//!    - `gamma = P / noise`; `xi = 0.98 |S_prev|^2 / noise + 0.02 max(gamma - 1, 0)`
//!      (first frame: `max(gamma - 1, 0)`), at least 10^-2.5; the gain
//!      `G = clamp(xi / (1 + xi), 0.2, 1)` (at most 14 dB of attenuation); `S = G X`, kept as
//!      `|S_prev|^2` for the next frame; the frame out is `irfft(S) w`, overlap-added.
//! 2. **AGC**, per 512-sample chunk `k` (samples `[512 k, 512 k + 512)`, the last one possibly
//!    shorter) of the denoised signal: `level` starts at 1e-4;
//!    `level = max(level x 0.5^(512 / 16000 / 5), rms(chunk))` (a peak follower with a 5 s
//!    half-life; `rms = sqrt(mean(x^2) + 1e-12)`); `gain = min(10^(-14/20) / level, 10^(18/20))`;
//!    the chunk is multiplied by the gain and clamped to [-1, 1]. Speech is brought to about
//!    -14 dBFS RMS at its peaks, with at most +18 dB of gain.
//!
//! ## Streaming, latency, and the whole signal
//! [`Denoiser`] takes samples in pieces of any length and gives out whole 512-sample chunks
//! with a fixed latency of [`LATENCY_CHUNKS`] chunks ([`LATENCY_SAMPLES`] = 1024 samples): after
//! `n` samples in, exactly `max(floor(n / 512) - 2, 0)` chunks are out. (A sample's output is
//! final once the last frame covering it has been added: chunk `k`'s last sample needs input up
//! to `512 k + 1280`, which the next two chunks bring.) [`Denoiser::finish`] ends the stream:
//! the frames still to come are run on the zero-padded end and the rest of the output comes out,
//! so in all exactly as many samples come out as went in. [`denoise`] runs a whole signal
//! through one [`Denoiser`]: the streaming and whole results are the same, bit for bit, whatever
//! the pieces (tested).
//!
//! Samples must be finite: a NaN or infinity would enter the smoothed periodogram and the
//! decision-directed estimate and poison every later frame, so [`Denoiser::push`] refuses the
//! whole piece with an error (nothing of it is taken; the stream can go on with good samples).
//! cadence's WAV reader already refuses non-finite samples; Silero's network itself does not
//! check (a NaN there poisons its recurrent state until a reset), and
//! [`super::silero::ChunkProbabilities`], the entry every Silero path goes through, refuses them
//! too, front end or not.
//!
//! The numbers of the prototype this follows (Python, numpy's f64 FFT, ONNX Runtime) are
//! reproduced by the `vad` experiment with this f64 code (docs/vad.md).

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};

use crate::error::{MediaError, Result};

/// STFT frame length (samples at 16 kHz, 64 ms).
pub const FRAME: usize = 1024;
/// STFT hop (75 % overlap).
pub const HOP: usize = 256;
/// Frequency bins of a frame's real FFT.
const BINS: usize = FRAME / 2 + 1;
/// Frames of the minimum-statistics window: floor(1.5 s x 16000 / 256).
pub const NOISE_WINDOW_FRAMES: usize = 93;
/// The noise estimate is this times the windowed minimum of the smoothed periodogram.
const NOISE_OVERESTIMATE: f64 = 1.5;
/// Smoothing of the periodogram: `Ps = SMOOTH Ps + (1 - SMOOTH) P`.
const SMOOTH: f64 = 0.8;
/// Decision-directed weight of the previous frame's clean estimate.
const DD_ALPHA: f64 = 0.98;
/// Lowest a priori SNR: -25 dB.
const XI_MIN: f64 = 0.003_162_277_660_168_379_4; // 10^(-2.5)
/// Lowest gain: 0.2 (-14 dB).
const GAIN_FLOOR: f64 = 0.2;
/// Smallest noise power (keeps the divisions finite on digital silence).
const NOISE_FLOOR: f64 = 1e-12;

/// Samples per AGC step: one Silero chunk.
pub const AGC_CHUNK: usize = 512;
/// The AGC's level follower starts here (linear RMS).
const AGC_LEVEL_START: f64 = 1e-4;
/// Half-life of the AGC's peak follower, seconds.
const AGC_HALF_LIFE_S: f64 = 5.0;
/// Target RMS, dBFS.
const AGC_TARGET_DB: f64 = -14.0;
/// Largest gain, dB.
const AGC_MAX_GAIN_DB: f64 = 18.0;

/// Output latency in whole 512-sample chunks.
pub const LATENCY_CHUNKS: usize = 2;
/// Output latency in samples ([`LATENCY_CHUNKS`] x 512 = [`FRAME`]).
pub const LATENCY_SAMPLES: usize = LATENCY_CHUNKS * AGC_CHUNK;
const _: () = assert!(LATENCY_SAMPLES >= FRAME + HOP - AGC_CHUNK && AGC_CHUNK.is_multiple_of(HOP));

/// The largest gain the AGC applies (linear): 10^(18/20).
pub fn agc_max_gain() -> f64 {
    10f64.powf(AGC_MAX_GAIN_DB / 20.0)
}

/// The AGC's target RMS (linear): 10^(-14/20).
pub fn agc_target() -> f64 {
    10f64.powf(AGC_TARGET_DB / 20.0)
}

/// Which stages run: both in cadence; the tests switch them off one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stages {
    /// The Wiener gain (off: G = 1, the STFT analysis and synthesis alone).
    wiener: bool,
    /// The AGC (off: the denoised samples as they are).
    agc: bool,
}

/// The exact minimum over the last `len` rows (of `bins` values each) pushed, per column:
/// van Herk / Gil-Werman over blocks of `len` rows.
struct WindowMin {
    len: usize,
    bins: usize,
    /// Rows pushed.
    pushed: usize,
    /// The current block's rows, `len x bins`.
    block: Vec<f64>,
    /// The previous block's suffix minima: row `j` is the minimum of its rows `j..len`
    /// (`len + 1` rows, the last +inf); all +inf during the first block.
    suffix: Vec<f64>,
    /// The minimum of the current block's rows so far.
    prefix: Vec<f64>,
}

cadence_cpu::simd_fn! {
    /// `out[i] = min(a[i], b[i])` (exact; no NaN reaches here).
    fn min_into(a: &[f64], b: &[f64], out: &mut [f64]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = if x < y { x } else { y };
        }
    }
}

cadence_cpu::simd_fn! {
    /// `acc[i] = min(acc[i], a[i])`.
    fn min_in_place(acc: &mut [f64], a: &[f64]) {
        for (o, &x) in acc.iter_mut().zip(a) {
            *o = if x < *o { x } else { *o };
        }
    }
}

impl WindowMin {
    fn new(len: usize, bins: usize) -> Self {
        Self {
            len,
            bins,
            pushed: 0,
            block: vec![0.0; len * bins],
            suffix: vec![f64::INFINITY; (len + 1) * bins],
            prefix: vec![f64::INFINITY; bins],
        }
    }

    fn reset(&mut self) {
        self.pushed = 0;
        self.suffix.fill(f64::INFINITY);
        self.prefix.fill(f64::INFINITY);
    }

    /// Pushes `row` and writes the minimum of the last `len` rows (at most) into `min`.
    fn push(&mut self, row: &[f64], min: &mut [f64]) {
        let (b, r) = (self.bins, self.pushed % self.len);
        self.block[r * b..(r + 1) * b].copy_from_slice(row);
        if r == 0 {
            self.prefix.copy_from_slice(row);
        } else {
            min_in_place(&mut self.prefix, row);
        }
        min_into(&self.prefix, &self.suffix[(r + 1) * b..(r + 2) * b], min);
        if r + 1 == self.len {
            // The block is complete: its suffix minima serve the next block (row `len` stays
            // +inf).
            for j in (0..self.len).rev() {
                let (here, after) = self.suffix.split_at_mut((j + 1) * b);
                min_into(&self.block[j * b..(j + 1) * b], &after[..b], &mut here[j * b..]);
            }
        }
        self.pushed += 1;
    }
}

cadence_cpu::simd_fn! {
    /// `p = |x|^2` per bin.
    fn power(spec: &[Complex<f64>], p: &mut [f64]) {
        for (o, x) in p.iter_mut().zip(spec) {
            *o = x.re * x.re + x.im * x.im;
        }
    }
}

cadence_cpu::simd_fn! {
    /// `ps = SMOOTH ps + (1 - SMOOTH) p`.
    fn smooth(ps: &mut [f64], p: &[f64]) {
        for (s, &v) in ps.iter_mut().zip(p) {
            *s = SMOOTH * *s + (1.0 - SMOOTH) * v;
        }
    }
}

cadence_cpu::simd_fn! {
    /// The Wiener gain per bin (the module's step 1), applied to the spectrum; `s2` holds
    /// `|S_prev|^2` in and `|S|^2` out. `first`: no previous frame (then `xi = max(gamma - 1, 0)`).
    fn gains(spec: &mut [Complex<f64>], p: &[f64], min: &[f64], s2: &mut [f64], first: bool) {
        let dd = if first { 0.0 } else { DD_ALPHA };
        let ml_weight = if first { 1.0 } else { 1.0 - DD_ALPHA };
        for (((x, &p), &m), s2) in spec.iter_mut().zip(p).zip(min).zip(s2.iter_mut()) {
            let noise = m * NOISE_OVERESTIMATE;
            let noise = if noise > NOISE_FLOOR { noise } else { NOISE_FLOOR };
            let gamma_1 = p / noise - 1.0;
            let ml = if gamma_1 > 0.0 { gamma_1 } else { 0.0 };
            let xi = dd * *s2 / noise + ml_weight * ml;
            let xi = if xi > XI_MIN { xi } else { XI_MIN };
            let g = xi / (1.0 + xi);
            let g = g.clamp(GAIN_FLOOR, 1.0);
            let (re, im) = (x.re * g, x.im * g);
            *x = Complex::new(re, im);
            *s2 = re * re + im * im;
        }
    }
}

/// The Wiener gain's state across frames.
struct Wiener {
    first: bool,
    /// Periodogram of the frame (scratch).
    p: Vec<f64>,
    /// Smoothed periodogram.
    ps: Vec<f64>,
    /// |S|^2 of the previous frame.
    s2_prev: Vec<f64>,
    /// Windowed minimum of `ps` (scratch).
    min: Vec<f64>,
    window_min: WindowMin,
}

impl Wiener {
    fn new() -> Self {
        Self {
            first: true,
            p: vec![0.0; BINS],
            ps: vec![0.0; BINS],
            s2_prev: vec![0.0; BINS],
            min: vec![0.0; BINS],
            window_min: WindowMin::new(NOISE_WINDOW_FRAMES, BINS),
        }
    }

    fn reset(&mut self) {
        self.first = true;
        self.window_min.reset();
    }

    /// Applies the gain to one frame's spectrum in place.
    fn apply(&mut self, spec: &mut [Complex<f64>]) {
        power(spec, &mut self.p);
        if self.first {
            self.ps.copy_from_slice(&self.p);
        } else {
            smooth(&mut self.ps, &self.p);
        }
        self.window_min.push(&self.ps, &mut self.min);
        gains(spec, &self.p, &self.min, &mut self.s2_prev, self.first);
        self.first = false;
    }
}

/// The AGC's state: the level follower.
#[derive(Debug, Clone, Copy)]
struct Agc {
    level: f64,
}

impl Agc {
    fn new() -> Self {
        Self { level: AGC_LEVEL_START }
    }

    /// One chunk (512 samples, or fewer at the end), in place; returns the gain applied.
    fn apply(&mut self, chunk: &mut [f64]) -> f64 {
        let decay = 0.5f64.powf(AGC_CHUNK as f64 / 16_000.0 / AGC_HALF_LIFE_S);
        let mean_sq = chunk.iter().map(|v| v * v).sum::<f64>() / chunk.len().max(1) as f64;
        let rms = (mean_sq + 1e-12).sqrt();
        self.level = (self.level * decay).max(rms);
        let gain = (agc_target() / self.level).min(agc_max_gain());
        chunk.iter_mut().for_each(|v| *v = (*v * gain).clamp(-1.0, 1.0));
        gain
    }
}

/// The front end on a stream (see the module's documentation): samples in, denoised and
/// level-normalised samples out, whole 512-sample chunks, [`LATENCY_CHUNKS`] behind.
pub struct Denoiser {
    stages: Stages,
    window: Vec<f64>,
    r2c: Arc<dyn RealToComplex<f64>>,
    c2r: Arc<dyn ComplexToReal<f64>>,
    /// Input; the next frame starts at `input[next]` (what is before it is dropped at the end
    /// of each push).
    input: Vec<f64>,
    next: usize,
    /// Samples pushed since the start (or the last reset).
    received: usize,
    /// Overlap-add accumulator: the next frame's `FRAME` samples.
    ola: Vec<f64>,
    /// Final samples (overlap-add done, scaled), not yet given out.
    done: Vec<f64>,
    /// Samples given out.
    emitted: usize,
    frame: Vec<f64>,
    spec: Vec<Complex<f64>>,
    scratch_fwd: Vec<Complex<f64>>,
    scratch_inv: Vec<Complex<f64>>,
    wiener: Wiener,
    agc: Agc,
    /// Gains of the chunks given out, kept only by the tests.
    #[cfg(test)]
    gains: Vec<f64>,
}

impl std::fmt::Debug for Denoiser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Denoiser")
            .field("received", &self.received)
            .field("emitted", &self.emitted)
            .field("agc_level", &self.agc.level)
            .finish_non_exhaustive()
    }
}

impl Default for Denoiser {
    fn default() -> Self {
        Self::new()
    }
}

impl Denoiser {
    /// A front end at the start of a stream.
    pub fn new() -> Self {
        Self::with_stages(Stages { wiener: true, agc: true })
    }

    fn with_stages(stages: Stages) -> Self {
        let mut planner = RealFftPlanner::<f64>::new();
        let r2c = planner.plan_fft_forward(FRAME);
        let c2r = planner.plan_fft_inverse(FRAME);
        let window = (0..FRAME)
            .map(|n| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / FRAME as f64).cos()).sqrt())
            .collect();
        Self {
            stages,
            window,
            scratch_fwd: r2c.make_scratch_vec(),
            scratch_inv: c2r.make_scratch_vec(),
            spec: r2c.make_output_vec(),
            frame: vec![0.0; FRAME],
            r2c,
            c2r,
            input: Vec::with_capacity(2 * FRAME),
            next: 0,
            received: 0,
            ola: vec![0.0; FRAME],
            done: Vec::with_capacity(2 * AGC_CHUNK),
            emitted: 0,
            wiener: Wiener::new(),
            agc: Agc::new(),
            #[cfg(test)]
            gains: Vec::new(),
        }
    }

    /// Back to the start of a stream (the FFT plans are kept).
    pub fn reset(&mut self) {
        self.input.clear();
        self.next = 0;
        self.received = 0;
        self.ola.fill(0.0);
        self.done.clear();
        self.emitted = 0;
        self.wiener.reset();
        self.agc = Agc::new();
    }

    /// Samples taken since the start of the stream.
    pub fn received(&self) -> usize {
        self.received
    }

    /// Takes the next samples (mono 16 kHz, any number) and appends to `out` the output chunks
    /// they complete: after this call, `512 x max(floor(received / 512) - 2, 0)` samples have
    /// come out in all. A non-finite sample is an error, and then none of `samples` is taken.
    pub fn push(&mut self, samples: &[f32], out: &mut Vec<f32>) -> Result<()> {
        if let Some(i) = samples.iter().position(|v| !v.is_finite()) {
            return Err(MediaError::InvalidInput(format!(
                "Silero front end: sample {} of the stream is not a finite number ({})",
                self.received + i,
                samples[i]
            )));
        }
        self.input.extend(samples.iter().map(|&v| v as f64));
        self.received += samples.len();
        while self.input.len() - self.next >= FRAME {
            self.frame_step();
        }
        self.input.drain(..self.next);
        self.next = 0;
        let due = (self.received / AGC_CHUNK).saturating_sub(LATENCY_CHUNKS) * AGC_CHUNK;
        self.emit_until(due, out);
        Ok(())
    }

    /// The end of the stream: the frames over its zero-padded end are run and every sample not
    /// yet given out is appended to `out` (the last chunk may be shorter than 512). The
    /// denoiser is then back at the start of a stream.
    pub fn finish(&mut self, out: &mut Vec<f32>) {
        // Frames start at every hop before the end; those starting at or past it add nothing to
        // the signal's samples.
        while self.emitted + self.done.len() < self.received {
            self.frame_step();
        }
        self.emit_until(self.received, out);
        self.reset();
    }

    /// Runs the frame starting at the first sample of `input` (zero-padded past its end), and
    /// moves the hop that is then final to `done`.
    fn frame_step(&mut self) {
        let input = &self.input[self.next..];
        let n = input.len().min(FRAME);
        for ((f, &x), &w) in self.frame.iter_mut().zip(&input[..n]).zip(&self.window) {
            *f = x * w;
        }
        self.frame[n..].fill(0.0);
        self.r2c
            .process_with_scratch(&mut self.frame, &mut self.spec, &mut self.scratch_fwd)
            .expect("FFT buffers are sized by the plan");
        if self.stages.wiener {
            self.wiener.apply(&mut self.spec);
        }
        // A real signal's spectrum: DC and Nyquist are real (they are from the forward FFT; the
        // gain is real).
        self.spec[0].im = 0.0;
        self.spec[BINS - 1].im = 0.0;
        self.c2r
            .process_with_scratch(&mut self.spec, &mut self.frame, &mut self.scratch_inv)
            .expect("FFT buffers are sized by the plan");
        // irfft normalised (1 / N), the synthesis window, and the overlap-add's 1/2.
        let scale = 0.5 / FRAME as f64;
        for ((o, &y), &w) in self.ola.iter_mut().zip(&self.frame).zip(&self.window) {
            *o += y * w * scale;
        }
        self.done.extend_from_slice(&self.ola[..HOP]);
        self.ola.copy_within(HOP.., 0);
        self.ola[FRAME - HOP..].fill(0.0);
        self.next = (self.next + HOP).min(self.input.len());
    }

    /// Gives out the final samples up to sample `end` (whole chunks, but for the stream's last),
    /// through the AGC.
    fn emit_until(&mut self, end: usize, out: &mut Vec<f32>) {
        let mut at = 0;
        while self.emitted < end {
            let n = AGC_CHUNK.min(end - self.emitted);
            debug_assert!(at + n <= self.done.len(), "sample {} is not final yet", self.emitted + n);
            let chunk = &mut self.done[at..at + n];
            if self.stages.agc {
                let _gain = self.agc.apply(chunk);
                #[cfg(test)]
                self.gains.push(_gain);
            }
            out.extend(chunk.iter().map(|&v| v as f32));
            self.emitted += n;
            at += n;
        }
        self.done.drain(..at);
    }
}

/// The front end on a whole signal (mono 16 kHz): as many samples out as in, the same as a
/// [`Denoiser`] given the signal in any pieces and finished. A non-finite sample is an error.
pub fn denoise(samples_16k: &[f32]) -> Result<Vec<f32>> {
    if let Some(i) = samples_16k.iter().position(|v| !v.is_finite()) {
        return Err(MediaError::InvalidInput(format!(
            "Silero front end: sample {i} is not a finite number ({})",
            samples_16k[i]
        )));
    }
    let mut d = Denoiser::new();
    let mut out = Vec::with_capacity(samples_16k.len());
    // In pieces of 2 s, so the buffers stay small (the output is the same for any pieces).
    for piece in samples_16k.chunks(64 * AGC_CHUNK) {
        d.push(piece, &mut out)?;
    }
    d.finish(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift white noise in [-1, 1) (no rand dependency).
    fn white(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Pink-ish noise: white through a one-pole low-pass at 1 kHz plus a fifth of white.
    fn pink(n: usize, seed: u64) -> Vec<f32> {
        let a = (-2.0 * std::f32::consts::PI * 1000.0 / 16_000.0).exp();
        let mut lp = 0.0;
        white(n, seed)
            .into_iter()
            .map(|w| {
                lp = a * lp + (1.0 - a) * w;
                lp + 0.2 * w
            })
            .collect()
    }

    fn scaled(x: &[f32], rms_target: f64) -> Vec<f32> {
        let g = rms_target / rms(x);
        x.iter().map(|&v| (v as f64 * g) as f32).collect()
    }

    fn rms(x: &[f32]) -> f64 {
        (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len().max(1) as f64).sqrt()
    }

    fn db(a: f64, b: f64) -> f64 {
        20.0 * (a / b).log10()
    }

    fn run(stages: Stages, x: &[f32]) -> Vec<f32> {
        let mut d = Denoiser::with_stages(stages);
        let mut out = Vec::new();
        d.push(x, &mut out).unwrap();
        d.finish(&mut out);
        out
    }

    const WOLA_ONLY: Stages = Stages { wiener: false, agc: false };
    const WIENER_ONLY: Stages = Stages { wiener: true, agc: false };

    /// With the gain forced to 1 and no AGC, the analysis and synthesis windows, the FFT pair
    /// and the overlap-add give the input back (to rounding) wherever four frames overlap: from
    /// sample N - H to the end, the zero-padded end included; the first N - H samples are
    /// tapered by the window sums of fewer frames.
    #[test]
    fn unity_gain_reconstructs_the_input() {
        for len in [FRAME - HOP + 1, 5000, 16_000 + 77] {
            let x = white(len, 3);
            let y = run(WOLA_ONLY, &x);
            assert_eq!(y.len(), x.len());
            let worst = x[FRAME - HOP..].iter().zip(&y[FRAME - HOP..]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-6, "len {len}: max error {worst}");
            // Before: sample n is scaled by the sum of the Hann windows of the frames covering it, / 2.
            for n in [0, 100, 300, 600] {
                let hann = |m: usize| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * m as f64 / FRAME as f64).cos();
                let sum: f64 = (0..=n / HOP).map(|i| hann(n - i * HOP)).sum::<f64>() / 2.0;
                assert!((y[n] as f64 - x[n] as f64 * sum).abs() < 1e-6, "sample {n}");
            }
        }
    }

    /// Stationary noise alone is taken down by at least 10 dB once the noise estimate has
    /// settled (after the 1.5 s window), before the AGC.
    #[test]
    fn stationary_noise_is_attenuated() {
        for (name, x) in [("white", scaled(&white(16_000 * 6, 5), 0.05)), ("pink", scaled(&pink(16_000 * 6, 9), 0.05))]
        {
            let y = run(WIENER_ONLY, &x);
            let from = 16_000 * 2;
            let att = db(rms(&y[from..]), rms(&x[from..]));
            println!("{name} noise: {att:.1} dB after 2 s");
            assert!(att < -10.0, "{name} noise attenuated by only {att:.1} dB");
        }
    }

    /// Tone bursts (speech-like: 200 ms on, 300 ms off, so the minimum statistics see the
    /// noise between them) over white noise at 0 dB SNR overall: in the bursts the output keeps
    /// the tone's energy within 2 dB, while the noise between them drops by 10 dB or more.
    #[test]
    fn bursts_in_noise_keep_their_energy() {
        let n = 16_000 * 6;
        let noise = scaled(&white(n, 11), 0.05);
        let on = |i: usize| i % 8000 < 3200;
        let tone: Vec<f32> = (0..n)
            .map(|i| if on(i) { (2.0 * std::f32::consts::PI * 1000.0 * i as f32 / 16_000.0).sin() * 0.1 } else { 0.0 })
            .collect();
        let x: Vec<f32> = tone.iter().zip(&noise).map(|(a, b)| a + b).collect();
        let y = run(WIENER_ONLY, &x);
        // Inside the bursts (away from their edges by a frame), after 2 s.
        let inside = |i: usize| i >= 32_000 && i % 8000 >= 1024 && i % 8000 < 3200 - 1024;
        let outside = |i: usize| i >= 32_000 && i % 8000 >= 3200 + 1024 && i % 8000 < 8000 - 1024;
        let pick = |v: &[f32], f: &dyn Fn(usize) -> bool| -> Vec<f32> {
            v.iter().enumerate().filter(|(i, _)| f(*i)).map(|(_, &s)| s).collect()
        };
        let kept = db(rms(&pick(&y, &inside)), rms(&pick(&tone, &inside)));
        let gap = db(rms(&pick(&y, &outside)), rms(&pick(&noise, &outside)));
        println!("bursts: {kept:.2} dB against the clean tone; noise between them {gap:.1} dB");
        assert!(kept.abs() < 2.0, "tone energy changed by {kept:.2} dB");
        assert!(gap < -10.0, "noise between the bursts only {gap:.1} dB");
    }

    /// Pieces of any length (1 sample, odd lengths, several chunks at once) give the whole
    /// signal's output bit for bit, with exactly the fixed latency after every piece; and
    /// after `finish` the same denoiser starts a new stream afresh.
    #[test]
    fn streaming_is_the_whole_signal() {
        let x: Vec<f32> =
            pink(40_000, 21).iter().enumerate().map(|(i, v)| v * (1.0 + (i as f32 / 3000.0).sin())).collect();
        let x = scaled(&x, 0.05);
        let whole = denoise(&x).unwrap();
        assert_eq!(whole.len(), x.len());
        let mut d = Denoiser::new();
        for round in 0..2 {
            let mut out = Vec::new();
            let (mut at, mut len) = (0, 1);
            while at < x.len() {
                let end = (at + len).min(x.len());
                d.push(&x[at..end], &mut out).unwrap();
                assert_eq!(out.len(), (end / 512).saturating_sub(LATENCY_CHUNKS) * 512, "after {end} samples");
                at = end;
                len = len * 7 % 2999 + 1;
            }
            d.finish(&mut out);
            assert!(out == whole, "round {round}: the streamed output differs from the whole signal's");
        }
        // It does something: the output is not the input.
        assert!(whole.iter().zip(&x).any(|(a, b)| (a - b).abs() > 1e-3));
    }

    /// The AGC brings a quiet signal up by at most 18 dB and a loud one down to about
    /// -14 dBFS; every gain lies within its bounds and the output within [-1, 1].
    #[test]
    fn agc_gain_bounds() {
        let agc_only = Stages { wiener: false, agc: true };
        let target = agc_target();
        for (level, want_db) in [(0.001, 18.0), (0.05, db(target, 0.05)), (0.5, db(target, 0.5))] {
            let x = scaled(&white(16_000 * 3, 2), level);
            let mut d = Denoiser::with_stages(agc_only);
            let mut y = Vec::new();
            d.push(&x, &mut y).unwrap();
            d.finish(&mut y);
            assert!(d.gains.iter().all(|&g| g > 0.0 && g <= agc_max_gain() * (1.0 + 1e-12)), "{level}");
            assert!(y.iter().all(|v| (-1.0..=1.0).contains(v)));
            let got = db(rms(&y[16_000..]), rms(&x[16_000..]));
            println!("level {level}: {got:.2} dB of gain, expected about {want_db:.2}");
            assert!((got - want_db).abs() < 1.5, "level {level}: {got:.2} dB of gain, expected {want_db:.2}");
        }
        // Silence: the gain is the largest, and zeros stay zeros.
        let mut d = Denoiser::with_stages(agc_only);
        let mut y = Vec::new();
        d.push(&[0.0; 4096], &mut y).unwrap();
        d.finish(&mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        assert!(d.gains.iter().all(|&g| (g - agc_max_gain()).abs() < 1e-9), "{:?}", d.gains);
        // A full-scale square wave is clamped to [-1, 1], never beyond.
        let sq: Vec<f32> = (0..8192).map(|i| if i % 64 < 32 { 1.0 } else { -1.0 }).collect();
        assert!(run(Stages { wiener: true, agc: true }, &sq).iter().all(|v| (-1.0..=1.0).contains(v)));
    }

    /// Empty and short input (shorter than a frame, shorter than a chunk), digital silence,
    /// and non-finite samples.
    #[test]
    fn empty_short_silent_and_non_finite_input() {
        assert!(denoise(&[]).unwrap().is_empty());
        for len in [1, 100, 511, 512, 513, FRAME - 1, FRAME, FRAME + 1, 1500] {
            let x = scaled(&white(len, 7), 0.1);
            let y = denoise(&x).unwrap();
            assert_eq!(y.len(), len);
            assert!(y.iter().all(|v| v.is_finite() && (-1.0..=1.0).contains(v)), "len {len}");
        }
        let zeros = denoise(&vec![0.0; 20_000]).unwrap();
        assert!(zeros.iter().all(|&v| v == 0.0), "silence in, silence out");

        // NaN or infinity: refused, nothing taken; the stream goes on as if the piece had not
        // come, so the output is the clean signal's.
        let x = scaled(&white(10_000, 8), 0.1);
        let whole = denoise(&x).unwrap();
        let mut d = Denoiser::new();
        let mut out = Vec::new();
        d.push(&x[..3000], &mut out).unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut piece = x[3000..4000].to_vec();
            piece[500] = bad;
            let err = d.push(&piece, &mut out).unwrap_err().to_string();
            assert!(err.contains("sample 3500") && err.contains("not a finite number"), "{err}");
            assert_eq!(d.received(), 3000);
        }
        assert!(denoise(&[0.0, f32::NAN]).is_err());
        d.push(&x[3000..], &mut out).unwrap();
        d.finish(&mut out);
        assert!(out == whole);
    }

    /// The windowed minimum is the minimum of exactly the last `len` rows, across block
    /// boundaries, checked against the naive one.
    #[test]
    fn window_min_is_exact() {
        let (len, bins) = (5, 3);
        let mut m = WindowMin::new(len, bins);
        let rows: Vec<Vec<f64>> = (0..23).map(|t| (0..bins).map(|b| ((t * 7 + b * 3) % 11) as f64).collect()).collect();
        let mut got = vec![0.0; bins];
        for t in 0..rows.len() {
            m.push(&rows[t], &mut got);
            for b in 0..bins {
                let want = rows[t.saturating_sub(len - 1)..=t].iter().map(|r| r[b]).fold(f64::INFINITY, f64::min);
                assert_eq!(got[b], want, "row {t} bin {b}");
            }
        }
    }
}
