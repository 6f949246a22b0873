//! Benchmark helpers: median frames/s and GFLOP/s of an engine, and a CPU matmul-rate probe.

use crate::{AudioEncoder, Batch, Device, KeyframeModel, LatentDecoder, Result};
use candle_core::Tensor;
use std::time::Instant;

/// Result of one benchmark.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub name: String,
    pub batch: usize,
    pub runs: usize,
    /// Median seconds per call.
    pub median_s: f64,
    /// Frames (batch elements) per second at the median.
    pub frames_per_s: f64,
    /// Achieved GFLOP/s at the median (engine's analytic FLOP count).
    pub gflops: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Times `f` (one warm-up call, then `runs` timed calls); `frames` = frames per call.
pub fn time_it(
    name: &str,
    batch: usize,
    frames: usize,
    flops_per_call: f64,
    runs: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<BenchResult> {
    f()?;
    let mut times = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let m = median(times);
    Ok(BenchResult {
        name: name.to_string(),
        batch,
        runs: runs.max(1),
        median_s: m,
        frames_per_s: frames as f64 / m,
        gflops: flops_per_call / m / 1e9,
    })
}

/// Deterministic pseudo-random input in [-1, 1].
pub fn test_input(shape: Vec<usize>, seed: u64) -> Batch {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Batch { shape, data }
}

/// Decoder throughput on (batch, 4, 32, 32) latents.
pub fn bench_decoder(dec: &dyn LatentDecoder, batch: usize, runs: usize) -> Result<BenchResult> {
    let x = test_input(vec![batch, 4, 32, 32], 1);
    let name = format!("{} [{}]", dec.model(), dec.profile());
    time_it(&name, batch, batch, dec.flops_per_frame() * batch as f64, runs, || dec.decode(&x).map(|_| ()))
}

/// Keyframe-model throughput on (batch, 8, 32, 32) latents and (batch, 50, d) audio.
pub fn bench_keyframe(m: &dyn KeyframeModel, batch: usize, runs: usize) -> Result<BenchResult> {
    let x = test_input(vec![batch, 8, 32, 32], 2);
    let a = test_input(vec![batch, 50, m.audio_dim()], 3);
    let name = format!("{} [{}]", m.model(), m.profile());
    time_it(&name, batch, batch, m.flops_per_frame() * batch as f64, runs, || m.predict(&x, &a).map(|_| ()))
}

/// Audio-encoder throughput on `seconds` of audio; frames = video frames at 25 fps.
pub fn bench_audio(m: &dyn AudioEncoder, seconds: f32, runs: usize) -> Result<BenchResult> {
    let n = (seconds * 16000.0) as usize;
    let samples: Vec<f32> = (0..n).map(|i| 0.3 * (i as f32 * 0.05).sin()).collect();
    let frames = (seconds * 25.0).ceil() as usize;
    let name = format!("{} [{}]", m.model(), m.profile());
    time_it(&name, 1, frames, m.flops_per_frame() * 750.0 * (n as f64 / 480000.0).ceil(), runs, || {
        m.encode_audio(&samples, 25.0).map(|_| ())
    })
}

/// Large f32 matmul rate (GFLOP/s, median of `runs`) of candle on `device`: (n x n) @ (n x n).
pub fn matmul_probe(device: &Device, n: usize, runs: usize) -> Result<f64> {
    let a = Tensor::from_vec(test_input(vec![n, n], 4).data, (n, n), device)?;
    let b = Tensor::from_vec(test_input(vec![n, n], 5).data, (n, n), device)?;
    let flops = 2.0 * (n as f64).powi(3);
    let r = time_it("matmul", 1, 1, flops, runs, || {
        let c = a.matmul(&b)?;
        device.synchronize()?;
        drop(c);
        Ok(())
    })?;
    Ok(r.gflops)
}
