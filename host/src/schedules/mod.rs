//! Adaptive keyframe schedules: which frames the UNet evaluates, chosen from the phonemes, the
//! audio, or a prediction of the infill error, under a stride or an exact compute budget. Each
//! produces the [`KeyframeSchedule`] the pipeline already takes (an explicit keyframe list).
//!
//! Rules every schedule here keeps (documented in `docs/adaptive_keyframes.md`):
//! - the first and the last frame of the clip are keyframes;
//! - no keyframe lies in sustained silence, the frames the pipeline bypasses
//!   ([`crate::schedules::keyframes::bypassed_frames`]): the UNet never runs there;
//! - the first and last frame of every run of frames that are not bypassed (a "speech run",
//!   silence easing ramps included) are keyframes, so no in-between frame is interpolated across
//!   a bypassed pause;
//! - a budget `b` in (0, 1] is exactly `round(b * A)` UNet evaluations, `A` the frames that are
//!   not bypassed (what a stride-1 render evaluates): fixed stride 3 is about budget 0.33.
//!
//! Sources:
//! - `fixed`: keyframes evenly spread over each speech run (`--stride k`: no two keyframes more
//!   than k frames apart; `--budget`: the evaluations spread in proportion to the runs'
//!   lengths).
//! - `phonemes`: a per-class keyframe density (1 / the class stride, [`classes`]) from a phoneme
//!   alignment, and a keyframe at every closure onset and release.
//! - `audio`: keyframe density from the audio's onset strength ([`signals::onset_strength`]).
//! - `error-bounded`: keyframes inserted one at a time where the predicted infill error is
//!   largest, until the budget is spent or the prediction is under `--max-error`
//!   ([`FeaturePredictor`]).
//!
//! The density-driven sources (fixed, phonemes, audio) share one allocator. A density `r(f)`
//! (keyframes per frame) defines a clock `T`; between two fixed keyframes the allocator puts
//! keyframes at equal steps of `T`. With an exact count it decides how many each stretch gets by
//! minimising `sum M^2 / (k + 1)` over stretches (`M` the stretch's clock mass, `k` its inner
//! keyframes): the total squared infill error of a random walk whose per-frame variance is
//! proportional to `r^2` (the optimal density of a Brownian-bridge infill is proportional to the
//! local step size). The greedy marginal allocation is exact for this convex separable problem.

pub mod alignment;
pub mod classes;
pub mod espeak;
pub mod keyframes;
pub mod signals;

pub use alignment::{Alignment, FrameClasses, Phone};
pub use classes::{ClassStrides, PhonemeClass};

use crate::KeyframeSchedule;
use anyhow::{bail, ensure, Result};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Where a schedule comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// Evenly spread over the speech runs.
    Fixed,
    /// From a phoneme alignment: per-class density, keyframes at closure onsets and releases.
    Phonemes,
    /// From the audio's onset strength (spectral flux).
    Audio,
    /// Where the predicted infill error is largest, until a budget or an error bound.
    ErrorBounded,
}

impl ScheduleKind {
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Fixed => "fixed",
            ScheduleKind::Phonemes => "phonemes",
            ScheduleKind::Audio => "audio",
            ScheduleKind::ErrorBounded => "error-bounded",
        }
    }
}

/// How many keyframes.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// `fixed`: no two keyframes of a speech run more than k frames apart. `audio` and
    /// `error-bounded`: budget 1 / k.
    Stride(usize),
    /// `phonemes` only: the class strides decide the density (no fixed count).
    ClassStrides,
    /// Fraction of the frames that are not bypassed: exactly `round(b * A)` evaluations.
    Budget(f64),
    /// Exactly this many UNet evaluations.
    Evaluations(usize),
    /// `error-bounded` only: insert keyframes until every predicted frame error is at most this
    /// (relative latent error, with the calibration's scale).
    MaxError(f64),
}

/// The inputs a schedule may need; each source checks that it has its own.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    pub fps: f64,
    /// Per frame: bypassed in sustained silence ([`crate::schedules::keyframes::bypassed_frames`]).
    pub bypassed: &'a [bool],
    pub alignment: Option<&'a Alignment>,
    pub class_strides: ClassStrides,
    /// 16 kHz mono audio (`audio`).
    pub samples_16k: Option<&'a [f32]>,
    /// Audio-feature windows, one per frame, and the length of one (`error-bounded`).
    pub features: Option<(&'a [f32], usize)>,
    /// `error-bounded` with [`Target::MaxError`]: predicted relative latent error per unit of
    /// the predictor ([`Calibration`]).
    pub error_scale: Option<f64>,
}

impl<'a> Inputs<'a> {
    pub fn new(fps: f64, bypassed: &'a [bool]) -> Self {
        Inputs {
            fps,
            bypassed,
            alignment: None,
            class_strides: ClassStrides::default(),
            samples_16k: None,
            features: None,
            error_scale: None,
        }
    }
}

/// A schedule and how it was made.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Planned {
    #[serde(skip)]
    pub schedule: KeyframeSchedule,
    pub kind: ScheduleKind,
    pub target: Target,
    /// Keyframes on frames that are not bypassed: the UNet evaluations.
    pub evaluations: usize,
    /// Frames that are not bypassed.
    pub active_frames: usize,
    /// Wall time of making the schedule (signals included), ms.
    pub scheduling_ms: f64,
    /// Warnings to show once (unknown phoneme symbols, closure keyframes that did not fit).
    pub warnings: Vec<String>,
}

/// The relation between the error-bounded predictor and the measured infill error, measured on
/// a dense render (`adaptive_strides` writes it): predicted error = `scale` x the predictor.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    pub scale: f64,
    /// What the scale was fitted to (e.g. "0.9 quantile of measured/predicted").
    pub fit: String,
    /// The engines it was measured with: weights label and profile. A calibration is only valid
    /// for the network it was measured on.
    pub weights: String,
    pub profile: String,
    pub clip: String,
    pub commit: String,
}

impl Calibration {
    pub fn read(path: &std::path::Path) -> Result<Calibration> {
        use anyhow::Context;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let c: Calibration = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a cadence schedule calibration", path.display()))?;
        ensure!(
            c.scale.is_finite() && c.scale > 0.0,
            "{}: calibration scale {} is not positive",
            path.display(),
            c.scale
        );
        Ok(c)
    }

    /// Refuses a calibration measured on other engines.
    pub fn check_engines(&self, weights: &str, profile: &str) -> Result<()> {
        ensure!(
            self.weights == weights && self.profile == profile,
            "the calibration was measured with weights {} ({} profile); these engines are {weights} ({profile} profile): measure one for them with adaptive_strides",
            self.weights,
            self.profile
        );
        Ok(())
    }
}

/// Maximal runs `(first, last)` of frames that are not bypassed.
pub fn active_runs(bypassed: &[bool]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (f, &b) in bypassed.iter().enumerate() {
        match (b, start) {
            (false, None) => start = Some(f),
            (true, Some(s)) => {
                runs.push((s, f - 1));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, bypassed.len() - 1));
    }
    runs
}

/// Evaluations a budget gives: `round(b * A)`; `b` must lie in (0, 1].
pub fn budget_evaluations(budget: f64, active_frames: usize) -> Result<usize> {
    ensure!(budget.is_finite() && budget > 0.0 && budget <= 1.0, "the budget must lie in (0, 1] (got {budget})");
    Ok((budget * active_frames as f64).round() as usize)
}

/// Makes a schedule of `kind` for `inputs.bypassed.len()` frames.
pub fn plan(kind: ScheduleKind, target: Target, inputs: &Inputs) -> Result<Planned> {
    let t0 = Instant::now();
    let n = inputs.bypassed.len();
    ensure!(n > 0, "the video has no frames");
    ensure!(inputs.fps > 0.0 && inputs.fps.is_finite(), "fps must be positive");
    let active = inputs.bypassed.iter().filter(|&&b| !b).count();
    let mut warnings = Vec::new();
    let count = |t: Target| -> Result<Option<usize>> {
        Ok(match t {
            Target::Budget(b) => Some(budget_evaluations(b, active)?),
            Target::Evaluations(e) => {
                ensure!(e <= active, "{e} evaluations asked, but only {active} frames are not bypassed");
                Some(e)
            }
            Target::Stride(k) => {
                ensure!(k > 0, "stride must be at least 1 (got 0)");
                Some((active as f64 / k as f64).round() as usize)
            }
            Target::ClassStrides | Target::MaxError(_) => None,
        })
    };
    let keys = match kind {
        ScheduleKind::Fixed => {
            let rate = vec![1.0; n];
            match target {
                Target::Stride(k) => {
                    ensure!(k > 0, "stride must be at least 1 (got 0)");
                    allocate(
                        inputs.bypassed,
                        &rate.iter().map(|r| r / k as f64).collect::<Vec<_>>(),
                        &[],
                        Count::Density,
                    )?
                }
                Target::Budget(_) | Target::Evaluations(_) => {
                    allocate(inputs.bypassed, &rate, &[], Count::Exact(count(target)?.expect("a count")))?
                }
                _ => bail!("the fixed schedule takes --stride or --budget"),
            }
        }
        ScheduleKind::Phonemes => {
            let alignment = inputs.alignment.ok_or_else(|| {
                anyhow::anyhow!("the phonemes schedule needs a phoneme alignment (--phonemes FILE, or --text)")
            })?;
            let fc = alignment.frame_classes(n, inputs.fps);
            warnings.extend(fc.warning());
            let rate: Vec<f64> = fc.classes.iter().map(|&c| 1.0 / inputs.class_strides.get(c)).collect();
            let anchors = alignment.closure_events(n, inputs.fps);
            let how = match target {
                Target::ClassStrides => Count::Density,
                Target::Budget(_) | Target::Evaluations(_) => Count::Exact(count(target)?.expect("a count")),
                _ => {
                    bail!("the phonemes schedule takes --budget, or its class strides without --budget (not --stride)")
                }
            };
            let (keys, dropped) = allocate_with_anchors(inputs.bypassed, &rate, &anchors, how)?;
            if dropped > 0 {
                warnings.push(format!(
                    "{dropped} of the {} closure onset/release keyframes did not fit the budget (the closures still get the highest density)",
                    anchors.len()
                ));
            }
            keys
        }
        ScheduleKind::Audio => {
            let samples =
                inputs.samples_16k.ok_or_else(|| anyhow::anyhow!("the audio schedule needs the audio samples"))?;
            let e = match target {
                Target::Stride(_) | Target::Budget(_) | Target::Evaluations(_) => count(target)?.expect("a count"),
                _ => bail!("the audio schedule takes --budget or --stride"),
            };
            let onset = signals::onset_strength(samples, inputs.fps, n)?;
            allocate(inputs.bypassed, &audio_rate(&onset, inputs.bypassed), &[], Count::Exact(e))?
        }
        ScheduleKind::ErrorBounded => {
            let (features, window) = inputs
                .features
                .ok_or_else(|| anyhow::anyhow!("the error-bounded schedule needs the audio features"))?;
            ensure!(
                features.len() == n * window,
                "the audio features hold {} windows for {n} frames",
                features.len() / window.max(1)
            );
            let predictor = FeaturePredictor::new(features, window)?;
            let stop = match target {
                Target::MaxError(bound) => {
                    ensure!(bound.is_finite() && bound > 0.0, "--max-error must be positive (got {bound})");
                    let scale = inputs.error_scale.ok_or_else(|| {
                        anyhow::anyhow!("--max-error needs a calibration of the error predictor (--calibration FILE, written by adaptive_strides)")
                    })?;
                    Stop::Bound(bound / scale)
                }
                Target::Stride(_) | Target::Budget(_) | Target::Evaluations(_) => {
                    Stop::Count(count(target)?.expect("a count"))
                }
                Target::ClassStrides => bail!("the error-bounded schedule takes --budget, --stride or --max-error"),
            };
            insert_worst(inputs.bypassed, &predictor, stop)?
        }
    };
    let schedule = KeyframeSchedule::explicit(n, &keys)?;
    let evaluations = keys.iter().filter(|&&k| !inputs.bypassed[k]).count();
    Ok(Planned {
        schedule,
        kind,
        target,
        evaluations,
        active_frames: active,
        scheduling_ms: t0.elapsed().as_secs_f64() * 1e3,
        warnings,
    })
}

/// Share of the mean onset strength every frame gets at least: keyframe density never drops
/// below a quarter of the mean (the same 4:1 span as the phoneme strides 1..4), so a stretch of
/// flat spectrum still gets keyframes.
pub const AUDIO_RATE_FLOOR: f64 = 0.25;

/// Keyframe density of the audio schedule: onset strength plus [`AUDIO_RATE_FLOOR`] times its
/// mean over the frames that are not bypassed.
pub fn audio_rate(onset: &[f64], bypassed: &[bool]) -> Vec<f64> {
    let active: Vec<f64> = onset.iter().zip(bypassed).filter(|(_, &b)| !b).map(|(&o, _)| o).collect();
    let mean = if active.is_empty() { 0.0 } else { active.iter().sum::<f64>() / active.len() as f64 };
    let floor = if mean > 0.0 { AUDIO_RATE_FLOOR * mean } else { 1.0 };
    onset.iter().map(|&o| o.max(0.0) + floor).collect()
}

/// The keyframes every schedule has: frames 0 and N-1, and both ends of every speech run.
fn base_keys(bypassed: &[bool]) -> Vec<usize> {
    let n = bypassed.len();
    let mut keys = vec![0, n - 1];
    for (a, b) in active_runs(bypassed) {
        keys.push(a);
        keys.push(b);
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

fn evaluated(keys: &[usize], bypassed: &[bool]) -> usize {
    keys.iter().filter(|&&k| !bypassed[k]).count()
}

fn too_small(need: usize, have: usize, runs: usize) -> anyhow::Error {
    anyhow::anyhow!(
        "the budget gives {have} UNet evaluations, fewer than the {need} every schedule needs (the first and last frame of each of the {runs} speech runs, and of the clip)"
    )
}

#[derive(Clone, Copy, Debug)]
enum Count {
    /// As many keyframes as the density asks: each stretch gets ceil(its clock mass) intervals.
    Density,
    /// Exactly this many evaluations.
    Exact(usize),
}

fn allocate(bypassed: &[bool], rate: &[f64], anchors: &[usize], how: Count) -> Result<Vec<usize>> {
    Ok(allocate_with_anchors(bypassed, rate, anchors, how)?.0)
}

/// The density allocator (module documentation). `anchors`: frames that should be keyframes
/// (kept while the count allows; evenly thinned when it does not). Returns the keyframes and the
/// number of anchors dropped.
fn allocate_with_anchors(
    bypassed: &[bool],
    rate: &[f64],
    anchors: &[usize],
    how: Count,
) -> Result<(Vec<usize>, usize)> {
    let n = bypassed.len();
    ensure!(rate.len() == n, "the density has {} values for {n} frames", rate.len());
    ensure!(rate.iter().all(|r| r.is_finite() && *r >= 0.0), "the keyframe density must be finite and non-negative");
    let mut keys = base_keys(bypassed);
    let need = evaluated(&keys, bypassed);
    let mut extra: Vec<usize> =
        anchors.iter().copied().filter(|&f| f < n && !bypassed[f] && keys.binary_search(&f).is_err()).collect();
    extra.sort_unstable();
    extra.dedup();
    let mut dropped = 0;
    if let Count::Exact(e) = how {
        if e < need {
            return Err(too_small(need, e, active_runs(bypassed).len()));
        }
        let room = e - need;
        if extra.len() > room {
            dropped = extra.len() - room;
            extra = thin(&extra, room);
        }
    }
    keys.extend(extra);
    keys.sort_unstable();

    // Clock: T[f] at the centre of frame f, T[f+1] - T[f] = (r[f] + r[f+1]) / 2.
    let mut clock = vec![0.0f64; n];
    for f in 1..n {
        clock[f] = clock[f - 1] + 0.5 * (rate[f - 1] + rate[f]);
    }
    // Stretches between consecutive keyframes inside one speech run.
    let runs = active_runs(bypassed);
    let mut stretches: Vec<(usize, usize)> = Vec::new();
    for &(a, b) in &runs {
        let lo = keys.partition_point(|&k| k < a);
        let hi = keys.partition_point(|&k| k <= b);
        for w in keys[lo..hi].windows(2) {
            if w[1] - w[0] >= 2 {
                stretches.push((w[0], w[1]));
            }
        }
    }
    let mass: Vec<f64> = stretches.iter().map(|&(a, b)| clock[b] - clock[a]).collect();
    let room = |i: usize| stretches[i].1 - stretches[i].0 - 1;
    let mut inner = vec![0usize; stretches.len()];
    match how {
        Count::Density => {
            for i in 0..stretches.len() {
                inner[i] = ((mass[i] - 1e-9).ceil().max(1.0) as usize - 1).min(room(i));
            }
        }
        Count::Exact(e) => {
            let mut left = e - evaluated(&keys, bypassed);
            // Greedy marginal allocation of sum M^2 / (k + 1): the gain of one more keyframe in a
            // stretch is M^2 / ((k + 1)(k + 2)). Ties go to the earlier stretch.
            let mut heap: BinaryHeap<Gain> = (0..stretches.len())
                .filter(|&i| room(i) > 0)
                .map(|i| Gain { gain: gain(mass[i], 0), index: i })
                .collect();
            while left > 0 {
                let Some(g) = heap.pop() else {
                    bail!("no frame is left for {left} more keyframes");
                };
                let i = g.index;
                inner[i] += 1;
                left -= 1;
                if inner[i] < room(i) {
                    heap.push(Gain { gain: gain(mass[i], inner[i]), index: i });
                }
            }
        }
    }
    for (i, &(a, b)) in stretches.iter().enumerate() {
        place(&clock, a, b, inner[i], &mut keys);
    }
    keys.sort_unstable();
    debug_assert!(keys.windows(2).all(|w| w[0] < w[1]));
    Ok((keys, dropped))
}

fn gain(mass: f64, k: usize) -> f64 {
    mass * mass / ((k + 1) as f64 * (k + 2) as f64)
}

#[derive(PartialEq)]
struct Gain {
    gain: f64,
    index: usize,
}
impl Eq for Gain {}
impl Ord for Gain {
    fn cmp(&self, o: &Self) -> Ordering {
        self.gain.total_cmp(&o.gain).then(o.index.cmp(&self.index))
    }
}
impl PartialOrd for Gain {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// `k` keyframes strictly between `a` and `b` at equal steps of the clock: the frame whose
/// clock is nearest each target, kept strictly increasing and inside the stretch.
fn place(clock: &[f64], a: usize, b: usize, k: usize, keys: &mut Vec<usize>) {
    let mut prev = a;
    for j in 1..=k {
        let target = clock[a] + (clock[b] - clock[a]) * j as f64 / (k + 1) as f64;
        // First frame of (a, b) whose clock reaches the target, or its predecessor if nearer.
        let mut f = a + 1 + clock[a + 1..b].partition_point(|&c| c < target);
        if f > a + 1 && (f == b || target - clock[f - 1] <= clock[f] - target) {
            f -= 1;
        }
        let f = f.max(prev + 1).min(b - 1 - (k - j));
        keys.push(f);
        prev = f;
    }
}

/// `keep` of `items`, evenly spread.
fn thin(items: &[usize], keep: usize) -> Vec<usize> {
    if keep == 0 {
        return Vec::new();
    }
    (0..keep).map(|i| items[(i * items.len()) / keep]).collect()
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    Count(usize),
    /// In predictor units.
    Bound(f64),
}

/// The error-bounded schedule's predictor: the infill error of a frame is predicted from the
/// audio features the UNet is conditioned on. Between keyframes a < f < b the pipeline
/// interpolates the latents at alpha = (f - a) / (b - a); were the UNet linear in its
/// conditioning, the latent infill error would be the UNet applied to the conditioning's own
/// infill residual `F[f] - ((1 - alpha) F[a] + alpha F[b])`. The predictor is that residual's
/// norm relative to the root-mean-square norm of the feature windows; a [`Calibration`] says how
/// much relative latent error one unit of it is on a given network.
pub struct FeaturePredictor<'a> {
    features: &'a [f32],
    window: usize,
    inv_rms: f64,
}

impl<'a> FeaturePredictor<'a> {
    /// `features`: one window of `window` values per frame.
    pub fn new(features: &'a [f32], window: usize) -> Result<Self> {
        ensure!(window > 0 && features.len().is_multiple_of(window), "features are not whole windows of {window}");
        let n = features.len() / window;
        ensure!(n > 0, "no feature windows");
        ensure!(features.iter().all(|v| v.is_finite()), "the audio features contain NaN or infinity");
        let mean_sq = features.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / n as f64;
        Ok(FeaturePredictor { features, window, inv_rms: if mean_sq > 0.0 { 1.0 / mean_sq.sqrt() } else { 0.0 } })
    }

    pub fn frames(&self) -> usize {
        self.features.len() / self.window
    }

    fn frame(&self, f: usize) -> &[f32] {
        &self.features[f * self.window..(f + 1) * self.window]
    }

    /// The predicted error of frame f between keyframes a < f < b.
    pub fn error(&self, a: usize, f: usize, b: usize) -> f64 {
        let alpha = (f - a) as f64 / (b - a) as f64;
        let (fa, fb, ff) = (self.frame(a), self.frame(b), self.frame(f));
        let sq: f64 = ff
            .iter()
            .zip(fa.iter().zip(fb))
            .map(|(&x, (&y, &z))| (x as f64 - ((1.0 - alpha) * y as f64 + alpha * z as f64)).powi(2))
            .sum();
        sq.sqrt() * self.inv_rms
    }

    /// The prediction for every frame under keyframes `keys` (0 on keyframes and bypassed frames).
    pub fn errors(&self, keys: &[usize], bypassed: &[bool]) -> Vec<f64> {
        let mut out = vec![0.0; self.frames()];
        for w in keys.windows(2) {
            for f in w[0] + 1..w[1] {
                if !bypassed[f] {
                    out[f] = self.error(w[0], f, w[1]);
                }
            }
        }
        out
    }
}

#[derive(PartialEq)]
struct Worst {
    err: f64,
    /// Distance from the interval's centre, negated: among equal predictions (features that do
    /// not move) the most central frame wins, so such stretches are bisected evenly.
    centrality: i64,
    frame: usize,
    a: usize,
    b: usize,
}
impl Eq for Worst {}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        self.err.total_cmp(&o.err).then(self.centrality.cmp(&o.centrality)).then(o.frame.cmp(&self.frame))
    }
}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The worst predicted frame strictly inside (a, b), if any.
fn worst_in(p: &FeaturePredictor, a: usize, b: usize) -> Option<Worst> {
    (a + 1..b)
        .map(|f| Worst { err: p.error(a, f, b), centrality: -((2 * f) as i64 - (a + b) as i64).abs(), frame: f, a, b })
        .max()
}

/// Error-bounded insertion: from the base keyframes, repeatedly make the frame with the largest
/// predicted error a keyframe, until the count is reached or no prediction exceeds the bound.
fn insert_worst(bypassed: &[bool], p: &FeaturePredictor, stop: Stop) -> Result<Vec<usize>> {
    ensure!(p.frames() == bypassed.len(), "the predictor has {} frames, the clip {}", p.frames(), bypassed.len());
    let mut keys = base_keys(bypassed);
    let runs = active_runs(bypassed);
    let mut heap: BinaryHeap<Worst> = BinaryHeap::new();
    for &(a, b) in &runs {
        let lo = keys.partition_point(|&k| k < a);
        let hi = keys.partition_point(|&k| k <= b);
        for w in keys[lo..hi].windows(2) {
            heap.extend(worst_in(p, w[0], w[1]));
        }
    }
    let mut have = evaluated(&keys, bypassed);
    if let Stop::Count(e) = stop {
        if e < have {
            return Err(too_small(have, e, runs.len()));
        }
    }
    loop {
        match stop {
            Stop::Count(e) if have >= e => break,
            _ => {}
        }
        let Some(w) = heap.pop() else {
            match stop {
                Stop::Count(e) => bail!("no frame is left for {} more keyframes", e - have),
                Stop::Bound(_) => break,
            }
        };
        if let Stop::Bound(bound) = stop {
            if w.err <= bound {
                break;
            }
        }
        keys.push(w.frame);
        have += 1;
        heap.extend(worst_in(p, w.a, w.frame));
        heap.extend(worst_in(p, w.frame, w.b));
    }
    keys.sort_unstable();
    Ok(keys)
}
