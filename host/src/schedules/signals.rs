//! The audio schedule's signal: the onset strength of the audio itself (spectral flux of the
//! log-mel spectrogram).

use anyhow::{ensure, Result};

/// Analysis of the onset strength: 25 ms Hann windows every 10 ms at 16 kHz, 80 mel bands (the
/// audio encoder's front-end geometry and its Slaney mel filter bank,
/// `cadence_engines::whisper::mel_filters`).
const SAMPLE_RATE: usize = 16_000;
const N_FFT: usize = 400;
const HOP: usize = 160;
const N_MELS: usize = 80;
/// Log-power floor below the clip's loudest band value (80 dB, as whisper and librosa's
/// `power_to_db(top_db=80)`): the flux of silence is not the flux of the noise floor.
const TOP_DB: f64 = 80.0;

/// Log-mel power spectrogram (dB), frames centred on samples 0, HOP, 2 HOP, ... with reflect
/// padding (librosa's `center=True`); `(frames, N_MELS)` row-major.
fn log_mel_db(samples: &[f32]) -> Result<(Vec<f64>, usize)> {
    let pad = N_FFT / 2;
    let n = samples.len();
    ensure!(n > pad, "the audio is shorter than one analysis window ({n} samples)");
    // Reflect padding (edge sample excluded) on both sides.
    let at = |i: isize| -> f32 {
        let i = if i < 0 {
            -i
        } else if i >= n as isize {
            2 * (n as isize - 1) - i
        } else {
            i
        };
        samples[i as usize]
    };
    let frames = n / HOP + 1;
    let window: Vec<f32> =
        (0..N_FFT).map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos()) as f32).collect();
    let filters = cadence_engines::whisper::mel_filters(SAMPLE_RATE, N_FFT, N_MELS);
    let n_freq = N_FFT / 2 + 1;
    let fft = realfft::RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut power = vec![0.0f64; n_freq];
    let mut out = vec![0.0f64; frames * N_MELS];
    for t in 0..frames {
        let start = (t * HOP) as isize - pad as isize;
        for (i, x) in input.iter_mut().enumerate() {
            *x = at(start + i as isize) * window[i];
        }
        fft.process(&mut input, &mut spectrum).map_err(|e| anyhow::anyhow!("FFT: {e}"))?;
        for (p, c) in power.iter_mut().zip(&spectrum) {
            *p = (c.re as f64).powi(2) + (c.im as f64).powi(2);
        }
        for m in 0..N_MELS {
            let row = &filters[m * n_freq..(m + 1) * n_freq];
            let e: f64 = row.iter().zip(&power).map(|(&w, &p)| w as f64 * p).sum();
            out[t * N_MELS + m] = 10.0 * e.max(1e-10).log10();
        }
    }
    let top = out.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    out.iter_mut().for_each(|v| *v = v.max(top - TOP_DB));
    Ok((out, frames))
}

/// Onset strength per video frame: the spectral flux of the log-mel power spectrogram (dB; 80
/// bands, 25 ms Hann windows every 10 ms), the mean over bands of |S[t, m] - S[t-1, m]| in both
/// directions (the mouth moves when the sound starts and when it stops; librosa's
/// `onset_strength` keeps rises only), averaged over the 10 ms hops whose centre lies in each
/// frame (frame f spans [f / fps, (f + 1) / fps); a frame that holds no hop centre takes the hop
/// nearest its centre).
pub fn onset_strength(samples_16k: &[f32], fps: f64, n_frames: usize) -> Result<Vec<f64>> {
    ensure!(fps > 0.0 && fps.is_finite(), "fps must be positive");
    ensure!(samples_16k.iter().all(|v| v.is_finite()), "the audio contains NaN or infinity");
    let (mel, t_count) = log_mel_db(samples_16k)?;
    let mut flux = vec![0.0f64; t_count];
    for t in 1..t_count {
        let s: f64 = (0..N_MELS).map(|m| (mel[t * N_MELS + m] - mel[(t - 1) * N_MELS + m]).abs()).sum();
        flux[t] = s / N_MELS as f64;
    }
    let hop_s = HOP as f64 / SAMPLE_RATE as f64;
    let mut out = vec![0.0f64; n_frames];
    let mut count = vec![0usize; n_frames];
    for (t, &v) in flux.iter().enumerate() {
        let f = (t as f64 * hop_s * fps + 1e-9).floor() as usize;
        if f < n_frames {
            out[f] += v;
            count[f] += 1;
        }
    }
    for f in 0..n_frames {
        if count[f] > 0 {
            out[f] /= count[f] as f64;
        } else {
            let t = (((f as f64 + 0.5) / fps) / hop_s).round() as usize;
            out[f] = flux[t.min(t_count - 1)];
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log-mel frames against a direct f64 DFT of the same windowed frames (an independent
    /// computation of the spectrum; the mel filters and the dB floor are applied the same way).
    #[test]
    fn log_mel_matches_a_direct_dft() {
        let samples: Vec<f32> = (0..4000)
            .map(|i| {
                let t = i as f64 / SAMPLE_RATE as f64;
                (0.3 * (2.0 * std::f64::consts::PI * 440.0 * t).sin()
                    + 0.1 * (2.0 * std::f64::consts::PI * 3100.0 * t).cos()) as f32
            })
            .collect();
        let (mel, frames) = log_mel_db(&samples).unwrap();
        assert_eq!(frames, 4000 / HOP + 1);
        let filters = cadence_engines::whisper::mel_filters(SAMPLE_RATE, N_FFT, N_MELS);
        let n_freq = N_FFT / 2 + 1;
        let top = mel.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for t in [0usize, 1, 7, frames - 1] {
            // Reflect-padded frame centred on sample t * HOP, periodic Hann window.
            let x: Vec<f64> = (0..N_FFT)
                .map(|i| {
                    let mut j = (t * HOP + i) as isize - (N_FFT / 2) as isize;
                    if j < 0 {
                        j = -j;
                    }
                    let n = samples.len() as isize;
                    if j >= n {
                        j = 2 * (n - 1) - j;
                    }
                    let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos();
                    samples[j as usize] as f64 * w
                })
                .collect();
            for m in 0..N_MELS {
                let mut e = 0.0;
                for k in 0..n_freq {
                    let (mut re, mut im) = (0.0, 0.0);
                    for (i, &v) in x.iter().enumerate() {
                        let a = -2.0 * std::f64::consts::PI * (k * i) as f64 / N_FFT as f64;
                        re += v * a.cos();
                        im += v * a.sin();
                    }
                    e += filters[m * n_freq + k] as f64 * (re * re + im * im);
                }
                let want = (10.0 * e.max(1e-10).log10()).max(top - TOP_DB);
                let got = mel[t * N_MELS + m];
                assert!((got - want).abs() < 0.02, "frame {t} band {m}: {got} dB vs {want} dB");
            }
        }
    }

    #[test]
    fn onset_strength_rises_where_the_sound_changes() {
        // 1 s of silence, then a tone: the flux peaks in the frame where the tone starts.
        let samples: Vec<f32> =
            (0..32_000).map(|i| if i < 16_000 { 0.0 } else { (0.3 * (i as f64 * 0.2).sin()) as f32 }).collect();
        let o = onset_strength(&samples, 25.0, 50).unwrap();
        let peak = (0..50).max_by(|&a, &b| o[a].total_cmp(&o[b])).unwrap();
        assert!((24..=25).contains(&peak), "peak at frame {peak}: {o:?}");
        assert!(o[5] < 1e-6 && o[40] < 0.05 * o[peak], "{o:?}");
    }
}
