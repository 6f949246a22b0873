//! Per-frame signals the audio-driven schedules read: the onset strength of the audio itself
//! (spectral flux of the log-mel spectrogram) and the step between consecutive audio-feature
//! windows (what the UNet is conditioned on).

use anyhow::{ensure, Result};

/// Seconds between log-mel frames (whisper's hop: 160 samples at 16 kHz).
const MEL_HOP_S: f64 = 160.0 / 16_000.0;
const N_MELS: usize = 80;

/// Onset strength per video frame: the spectral flux of the whisper log-mel spectrogram of
/// `samples_16k` (mean over the 80 bands of |S[m, t] - S[m, t-1]|, both directions: the mouth
/// moves when the sound starts and when it stops), averaged over the 10 ms hops whose centre
/// lies in each frame (frame f spans [f / fps, (f + 1) / fps); a frame that holds no hop centre
/// takes the hop nearest its centre). The log-mel is whisper's (`cadence_engines::whisper::log_mel`,
/// the front end of the audio encoder), in its units (log10 power / 4, floored 80 dB below the
/// clip's maximum).
pub fn onset_strength(samples_16k: &[f32], fps: f64, n_frames: usize) -> Result<Vec<f64>> {
    ensure!(fps > 0.0 && fps.is_finite(), "fps must be positive");
    ensure!(!samples_16k.is_empty(), "no audio samples");
    let (mel, t_count) = cadence_engines::whisper::log_mel(samples_16k, 0);
    ensure!(t_count >= 2 && mel.len() == N_MELS * t_count, "the log-mel spectrogram has {t_count} frames");
    let mut flux = vec![0.0f64; t_count];
    for t in 1..t_count {
        let s: f64 = (0..N_MELS).map(|m| (mel[m * t_count + t] as f64 - mel[m * t_count + t - 1] as f64).abs()).sum();
        flux[t] = s / N_MELS as f64;
    }
    let mut out = vec![0.0f64; n_frames];
    let mut count = vec![0usize; n_frames];
    for (t, &v) in flux.iter().enumerate() {
        let f = (t as f64 * MEL_HOP_S * fps + 1e-9).floor() as usize;
        if f < n_frames {
            out[f] += v;
            count[f] += 1;
        }
    }
    for f in 0..n_frames {
        if count[f] > 0 {
            out[f] /= count[f] as f64;
        } else {
            let t = (((f as f64 + 0.5) / fps) / MEL_HOP_S).round() as usize;
            out[f] = flux[t.min(t_count - 1)];
        }
    }
    Ok(out)
}

/// Squared step between consecutive audio-feature windows, relative to their mean squared norm:
/// `q[f] = |F[f] - F[f-1]|^2 / mean_g |F[g]|^2` (q[0] = 0). `features` holds `n` windows of
/// `window` values each.
pub fn feature_steps(features: &[f32], window: usize) -> Result<Vec<f64>> {
    ensure!(window > 0 && features.len().is_multiple_of(window), "features are not whole windows of {window}");
    let n = features.len() / window;
    ensure!(n > 0, "no feature windows");
    ensure!(features.iter().all(|v| v.is_finite()), "the audio features contain NaN or infinity");
    let frame = |f: usize| &features[f * window..(f + 1) * window];
    let mean_sq = (0..n).map(|f| frame(f).iter().map(|&x| (x as f64).powi(2)).sum::<f64>()).sum::<f64>() / n as f64;
    let scale = if mean_sq > 0.0 { 1.0 / mean_sq } else { 0.0 };
    let mut q = vec![0.0f64; n];
    for f in 1..n {
        q[f] = frame(f).iter().zip(frame(f - 1)).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum::<f64>() * scale;
    }
    Ok(q)
}
