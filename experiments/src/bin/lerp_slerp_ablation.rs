//! LERP vs SLERP norm ablation (issue 4, item 2).
//!
//! Synthetic part: pairs of unit vectors (D = 4096 by default) at controlled angles theta from
//! 0 to pi, interpolated at alpha in {0.1, ..., 0.9} through the project's own kernels
//! (`Backend::slerp_pairs`, LERP and SLERP, on every available backend). For each (theta, alpha)
//! it records the norm ratio |v_interp| / ((1-a)|v0| + a|v1|) of both methods and the analytic
//! LERP ratio sqrt((1-a)^2 + a^2 + 2a(1-a) cos theta) (= cos(theta/2) at a = 0.5).
//! Writes `lerp_slerp_norm.csv` and the plots `lerp_slerp_norm.{png,svg}` (alpha = 0.5) and
//! `lerp_slerp_norm_alphas.{png,svg}` (every alpha).
//!
//! Trajectory part: the MuseTalk UNet (cadence-engines; cpu-reduced profile and seeded synthetic
//! weights unless `--profile` / `--models` / $CADENCE_MODELS say otherwise) runs densely on every
//! frame of a stretch of the bundled speech clip (`--frames`, default 100) to give the dense
//! latent trajectory (raw UNet outputs: no silence bypass, no easing). For each stride (2, 3, 4)
//! the keyframes are kept and expanded back to every frame with LERP and with SLERP by the
//! project's own expansion (`Backend::expand`, the kernel the renderer uses). On the in-between
//! frames it reports the norm deficit |v| / ((1-a)|v0| + a|v1|) - 1 (mean and worst), the norm
//! against the dense latent, and after decoding (TAESD by default) PSNR, SSIM and sharpness
//! against the dense decoded frame. It also measures the angle between consecutive dense latents,
//! so a reader can judge how much the trajectory moves at all. Writes
//! `lerp_slerp_trajectory.csv` and the plot `lerp_slerp_trajectory.{png,svg}`.

use anyhow::{bail, ensure, Context, Result};
use cadence::musetalk::FACE_SIDE;
use cadence::musetalk::LATENT_DIM;
use cadence::{Backend, KeyframeSchedule, Method};
use clap::Parser;
use experiments::frames::{decode_each, frame_of, unet_frames};
use experiments::metrics::{self, ImageShape, SignedSummary};
use experiments::plot::{line_plot, line_plot_grid, Legend, LineChart, LineStyle, Series};
use experiments::session::{Inputs, Session, SessionArgs};
use experiments::{progress_bar, write_csv, OutDir, Provenance};
use std::f64::consts::PI;
use std::path::Path;
use std::time::Instant;

/// Frames of the trajectory part when `--frames` is not given (4 s of the clip).
const DEFAULT_TRAJECTORY_FRAMES: usize = 100;

#[derive(Parser, Debug)]
#[command(
    name = "lerp_slerp_ablation",
    about = "LERP vs SLERP: norm ratio against the angle between unit vectors (synthetic part), then on dense UNet latent trajectories of real speech at strides 2, 3, 4: norm deficit, PSNR/SSIM and sharpness after decoding (trajectory part)",
    long_about = None,
    mut_arg("frames", |a| a.help("Frames of the trajectory part, at 25 fps from --start [default: 100]"))
)]
struct Args {
    /// Vector length D (a 4x32x32 latent has 4096 elements).
    #[arg(long, default_value_t = 4096)]
    dim: usize,
    /// Number of angles, evenly spaced over [0, pi] including both ends.
    #[arg(long, default_value_t = 64)]
    angles: usize,
    /// Interpolation weights alpha, comma-separated, each in (0, 1).
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")]
    alphas: Vec<f64>,
    /// Seed of the random directions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Backends to run: every available one (the CSV holds the first CUDA backend's results
    /// when there is one, else the CPU's; the others are checked against it), or only one.
    #[arg(long, value_enum, default_value = "all")]
    backends: BackendSet,
    /// Skip the synthetic part (unit vectors at controlled angles).
    #[arg(long)]
    skip_synthetic: bool,
    /// Skip the trajectory part (engines on real speech).
    #[arg(long)]
    skip_trajectory: bool,
    /// Strides of the trajectory part.
    #[arg(long, value_delimiter = ',', default_value = "2,3,4")]
    strides: Vec<usize>,
    /// First frame (25 fps) of the stretch of the clip the trajectory part uses.
    #[arg(long, default_value_t = 0)]
    start: usize,
    /// Engines and inputs of the trajectory part (the --encoder option is not used here).
    #[command(flatten)]
    session: SessionArgs,
    #[command(flatten)]
    out: OutDir,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BackendSet {
    All,
    Cpu,
    Cuda,
}

/// One row of `lerp_slerp_norm.csv` (the column names are part of the contract).
#[derive(serde::Serialize, Clone, Debug)]
struct NormRow {
    theta_rad: f64,
    alpha: f64,
    lerp_norm_ratio: f64,
    slerp_norm_ratio: f64,
    analytic_lerp_ratio: f64,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("lerp_slerp_ablation: error: {e:#}");
        std::process::exit(1);
    }
}

fn backends(set: BackendSet) -> Result<Vec<Backend>> {
    let all = Backend::all_available()?;
    let chosen: Vec<Backend> = match set {
        BackendSet::All => all,
        BackendSet::Cpu => all.into_iter().filter(|b| !b.is_cuda()).collect(),
        BackendSet::Cuda => all.into_iter().filter(|b| b.is_cuda()).collect(),
    };
    ensure!(!chosen.is_empty(), "no {set:?} backend is available on this machine (CUDA needs a driver and a GPU)");
    Ok(chosen)
}

/// Deterministic unit vector (f64) from the host's test-data generator.
fn unit(dim: usize, seed: u64) -> Vec<f64> {
    let v: Vec<f64> = cadence::measure::fixtures::test_data(dim, seed).into_iter().map(f64::from).collect();
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

/// Unit vectors u0, u1 with angle theta between them: u1 = cos(theta) u0 + sin(theta) w, w a
/// unit vector orthogonal to u0 (Gram-Schmidt on a second random vector).
fn pair_at_angle(dim: usize, theta: f64, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let u0 = unit(dim, seed.wrapping_mul(2).wrapping_add(1));
    let r = unit(dim, seed.wrapping_mul(2).wrapping_add(2));
    let d: f64 = u0.iter().zip(&r).map(|(a, b)| a * b).sum();
    let w: Vec<f64> = r.iter().zip(&u0).map(|(x, u)| x - d * u).collect();
    let wn = w.iter().map(|x| x * x).sum::<f64>().sqrt();
    let u1 = u0.iter().zip(&w).map(|(u, x)| theta.cos() * u + theta.sin() * x / wn).collect();
    (u0, u1)
}

fn norm_f32(v: &[f32]) -> f64 {
    v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt()
}

/// |(1-a)u0 + a u1| for unit vectors at angle theta.
fn analytic_lerp_ratio(theta: f64, a: f64) -> f64 {
    ((1.0 - a).powi(2) + a * a + 2.0 * a * (1.0 - a) * theta.cos()).max(0.0).sqrt()
}

/// Norm ratios of one method for every row, through the backend's `slerp_pairs` kernel.
fn ratios(backend: &Backend, v0: &[f32], v1: &[f32], alphas: &[f32], dim: usize, method: Method) -> Result<Vec<f64>> {
    let out = backend
        .slerp_pairs(v0, v1, alphas, dim, method)
        .with_context(|| format!("slerp_pairs ({method:?}) on {}", backend.describe()))?;
    Ok((0..alphas.len())
        .map(|r| {
            let s = r * dim..(r + 1) * dim;
            let a = alphas[r] as f64;
            let target = (1.0 - a) * norm_f32(&v0[s.clone()]) + a * norm_f32(&v1[s.clone()]);
            norm_f32(&out[s]) / target
        })
        .collect())
}

fn run(args: Args) -> Result<()> {
    ensure!(
        !(args.skip_synthetic && args.skip_trajectory),
        "--skip-synthetic and --skip-trajectory together leave nothing to do"
    );
    ensure!(
        !args.strides.is_empty() && args.strides.iter().all(|&k| k >= 2),
        "--strides must be integers of at least 2 (stride 1 has no in-between frames)"
    );
    let out_dir = args.out.dir()?;
    if !args.skip_synthetic {
        synthetic(&args, &out_dir)?;
    }
    if !args.skip_trajectory {
        trajectory(&args, &out_dir)?;
    }
    Ok(())
}

fn synthetic(args: &Args, out_dir: &Path) -> Result<()> {
    ensure!(args.dim >= 2, "--dim must be at least 2 (two orthogonal directions are needed)");
    ensure!(args.angles >= 2, "--angles must be at least 2 (0 and pi)");
    ensure!(!args.alphas.is_empty(), "--alphas is empty");
    for &a in &args.alphas {
        ensure!(a > 0.0 && a < 1.0, "alpha {a} is outside (0, 1)");
    }
    let backends = backends(args.backends)?;
    let dim = args.dim;

    // Rows: every (theta, alpha); each theta has its own random pair of directions.
    let thetas: Vec<f64> = (0..args.angles).map(|i| PI * i as f64 / (args.angles - 1) as f64).collect();
    let n_rows = thetas.len() * args.alphas.len();
    let (mut v0, mut v1) = (Vec::with_capacity(n_rows * dim), Vec::with_capacity(n_rows * dim));
    let mut alphas = Vec::with_capacity(n_rows);
    let mut keys = Vec::with_capacity(n_rows);
    for (i, &theta) in thetas.iter().enumerate() {
        let (u0, u1) = pair_at_angle(dim, theta, args.seed.wrapping_mul(1000).wrapping_add(i as u64));
        for &a in &args.alphas {
            v0.extend(u0.iter().map(|&x| x as f32));
            v1.extend(u1.iter().map(|&x| x as f32));
            alphas.push(a as f32);
            keys.push((theta, a));
        }
    }

    // Every backend; the CSV holds the CUDA backend's results when present.
    let mut per_backend = Vec::new();
    for b in &backends {
        let lerp = ratios(b, &v0, &v1, &alphas, dim, Method::Lerp)?;
        let slerp = ratios(b, &v0, &v1, &alphas, dim, Method::Slerp)?;
        per_backend.push((b, lerp, slerp));
    }
    let primary = per_backend.iter().position(|(b, _, _)| b.is_cuda()).unwrap_or(0);
    let (pb, lerp, slerp) = &per_backend[primary];
    let rows: Vec<NormRow> = keys
        .iter()
        .enumerate()
        .map(|(r, &(theta, a))| NormRow {
            theta_rad: theta,
            alpha: a,
            lerp_norm_ratio: lerp[r],
            slerp_norm_ratio: slerp[r],
            analytic_lerp_ratio: analytic_lerp_ratio(theta, a),
        })
        .collect();

    let mut prov = Provenance::for_backends(&backends, "n/a", "n/a");
    prov.note("csv_backend", pb.describe());
    prov.note(
        "vectors",
        format!(
            "{} angles in [0, pi] x {} alphas, D = {dim}, unit vectors, f32 storage, seed {}",
            thetas.len(),
            args.alphas.len(),
            args.seed
        ),
    );
    for (b, l, s) in per_backend.iter().enumerate().filter(|(i, _)| *i != primary).map(|(_, x)| x) {
        let dl = l.iter().zip(lerp).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        let ds = s.iter().zip(slerp).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        prov.note(
            format!("agreement_{}", b.name()),
            format!("max |ratio difference| vs csv_backend: LERP {dl:.2e}, SLERP {ds:.2e}"),
        );
    }
    let at_pi: Vec<&NormRow> = rows.iter().filter(|r| r.theta_rad >= PI - 1e-9).collect();
    let same = at_pi.iter().all(|r| (r.slerp_norm_ratio - r.lerp_norm_ratio).abs() <= 1e-6);
    prov.note(
        "antipodal",
        if same {
            "at theta = pi the great circle is not unique; the SLERP kernel falls back to LERP of the raw vectors (gpu/src/slerp.rs), and its measured ratio there equals LERP's".to_string()
        } else {
            let v: Vec<String> = at_pi.iter().map(|r| format!("a={}: {:.4}", r.alpha, r.slerp_norm_ratio)).collect();
            format!("at theta = pi the great circle is not unique; measured SLERP ratios there: {}", v.join(", "))
        },
    );

    // Summary on stdout.
    let interior = |r: &&NormRow| r.theta_rad < PI - 1e-9;
    let worst_lerp_vs_analytic =
        rows.iter().map(|r| (r.lerp_norm_ratio - r.analytic_lerp_ratio).abs()).fold(0.0, f64::max);
    let worst_slerp = rows.iter().filter(interior).map(|r| (r.slerp_norm_ratio - 1.0).abs()).fold(0.0, f64::max);
    let min_lerp = rows.iter().filter(interior).map(|r| r.lerp_norm_ratio).fold(f64::INFINITY, f64::min);
    println!("backends: {}", backends.iter().map(|b| b.describe()).collect::<Vec<_>>().join("; "));
    println!("CSV from: {}", pb.describe());
    println!("{} rows ({} angles x {} alphas), D = {dim}", rows.len(), thetas.len(), args.alphas.len());
    println!("max |LERP measured - analytic|          : {worst_lerp_vs_analytic:.3e}");
    println!("max |SLERP ratio - 1| for theta < pi    : {worst_slerp:.3e}");
    println!("min LERP ratio for theta < pi           : {min_lerp:.4}");
    for (k, v) in prov.notes.iter().filter(|(k, _)| k.starts_with("agreement_")) {
        println!("{k}: {v}");
    }

    let csv = out_dir.join("lerp_slerp_norm.csv");
    write_csv(&csv, &prov, &rows)?;
    println!("wrote {}", csv.display());

    // Plot at the alpha closest to 0.5.
    let a_mid = *args
        .alphas
        .iter()
        .min_by(|a, b| (*a - 0.5).abs().total_cmp(&(*b - 0.5).abs()))
        .expect("alphas checked non-empty");
    let at = |a: f64, f: &dyn Fn(&NormRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter().filter(|r| r.alpha == a).map(|r| (r.theta_rad, f(r))).collect()
    };
    let analytic_label = if (a_mid - 0.5).abs() < 1e-12 {
        "analytic LERP: cos(theta/2)".to_string()
    } else {
        format!("analytic LERP at alpha {a_mid}")
    };
    let chart = LineChart::new(
        format!("Norm ratio at alpha = {a_mid}: LERP vs SLERP (D = {dim}, cadence slerp_pairs kernel, {})", pb.name()),
        "angle theta between the vectors (rad)",
        "|v_interp| / ((1-a)|v0| + a|v1|)",
    )
    .x_range(0.0, PI)
    .y_range(-0.02, 1.08)
    .series(Series::new(analytic_label, at(a_mid, &|r| r.analytic_lerp_ratio)).style(LineStyle::Dashed).color(7))
    .series(Series::new("LERP (measured)", at(a_mid, &|r| r.lerp_norm_ratio)).style(LineStyle::Markers).color(3))
    .series(
        Series::new(
            "SLERP (measured)",
            at(a_mid, &|r| if r.theta_rad < PI - 1e-9 { r.slerp_norm_ratio } else { f64::NAN }),
        )
        .style(LineStyle::SolidMarkers)
        .color(0),
    )
    .series(
        Series::new(
            "SLERP at theta = pi (antipodal: LERP fallback)",
            at(a_mid, &|r| if r.theta_rad < PI - 1e-9 { f64::NAN } else { r.slerp_norm_ratio }),
        )
        .style(LineStyle::Markers)
        .color(1),
    )
    .legend(Legend::LowerLeft);
    let files = line_plot(&out_dir.join("lerp_slerp_norm"), &chart, &prov)?;
    println!("wrote {} and {}", files.png.display(), files.svg.display());

    let mut chart = LineChart::new(
        format!("Norm ratio against theta for every alpha (D = {dim}, {})", pb.name()),
        "angle theta between the vectors (rad)",
        "|v_interp| / ((1-a)|v0| + a|v1|)",
    )
    .x_range(0.0, PI)
    .y_range(-0.02, 1.08);
    // The LERP ratio is symmetric in a <-> 1-a: one curve per pair, labelled with both.
    let mut groups: Vec<(f64, Vec<f64>)> = Vec::new();
    for &a in &args.alphas {
        let key = a.min(1.0 - a);
        match groups.iter_mut().find(|(k, _)| (k - key).abs() < 1e-9) {
            Some((_, v)) => v.push(a),
            None => groups.push((key, vec![a])),
        }
    }
    groups.sort_by(|x, y| x.0.total_cmp(&y.0));
    for (i, (_, members)) in groups.iter().enumerate() {
        let names: Vec<String> = members.iter().map(|a| a.to_string()).collect();
        let label = format!("LERP a = {}", names.join(" and "));
        chart = chart.series(Series::new(label, at(members[0], &|r| r.lerp_norm_ratio)).color(i));
    }
    let mut slerp_all: Vec<(f64, f64)> =
        rows.iter().filter(|r| r.theta_rad < PI - 1e-9).map(|r| (r.theta_rad, r.slerp_norm_ratio)).collect();
    slerp_all.sort_by(|a, b| a.0.total_cmp(&b.0));
    chart = chart
        .series(Series::new("SLERP, every alpha (theta < pi)", slerp_all).style(LineStyle::Markers).color(7))
        .legend(Legend::LowerLeft);
    let files = line_plot(&out_dir.join("lerp_slerp_norm_alphas"), &chart, &prov)?;
    println!("wrote {} and {}", files.png.display(), files.svg.display());

    if rows.iter().any(|r| !r.lerp_norm_ratio.is_finite() || !r.slerp_norm_ratio.is_finite()) {
        bail!("a kernel produced a non-finite norm ratio; see {}", csv.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Trajectory part: dense UNet latents of real speech, keyframes at strides 2, 3, 4, expanded back
// with LERP and SLERP, compared with the dense trajectory in latent space and after decoding.
// ---------------------------------------------------------------------------------------------

/// One row of `lerp_slerp_trajectory.csv`: one stride and method, over its in-between frames
/// (the frames that are not keyframes; keyframes are the dense latents themselves).
#[derive(serde::Serialize, Clone, Debug)]
struct TrajectoryRow {
    stride: usize,
    method: String,
    /// "synthetic", "real" or "mixed" (the exact labels are in the provenance lines).
    weights_kind: String,
    engine_profile: String,
    frames: usize,
    keyframes: usize,
    inbetween_frames: usize,
    /// Angle between the two keyframes of each interval (mean and max over the intervals).
    keyframe_angle_mean_rad: f64,
    keyframe_angle_max_rad: f64,
    /// |v| / ((1-a)|v0| + a|v1|) - 1 over the in-between frames: mean, and the value of largest
    /// magnitude (signed).
    norm_deficit_mean: f64,
    norm_deficit_worst: f64,
    /// |v| / |v_dense| - 1 over the in-between frames.
    norm_vs_dense_mean: f64,
    norm_vs_dense_worst: f64,
    /// |v - v_dense| / |v_dense|, mean over the in-between frames.
    latent_rel_error_mean: f64,
    /// The baseline every infill must beat: the same error when each in-between frame just holds
    /// its nearest keyframe (latent error, and PSNR of the held keyframe's dense decode).
    hold_latent_rel_error_mean: f64,
    hold_psnr_db_mean: f64,
    /// Decoded in-between frame against the decoded dense frame (RGB samples clamped to the
    /// decoder's nominal range, peak = that range): mean and minimum over the in-between frames.
    psnr_db_mean: f64,
    psnr_db_min: f64,
    /// Mean SSIM on BT.601 luma (Wang et al. 2004 window): mean and minimum.
    ssim_mean: f64,
    ssim_min: f64,
    /// Variance of the Laplacian of luma on the 8-bit scale, mean over the in-between frames,
    /// for the interpolated and for the dense decode of the same frames, and their ratio.
    sharpness_mean: f64,
    dense_sharpness_mean: f64,
    sharpness_ratio: f64,
}

/// How much the dense trajectory moves: angles between dense latents at several lags.
struct Motion {
    /// (lag, mean angle, max angle) in radians.
    lags: Vec<(usize, f64, f64)>,
    /// Mean angle over every pair of frames of the stretch.
    all_pairs_mean: f64,
    /// Share of the latents' energy that varies over time: sum |v_f - mean|^2 / sum |v_f|^2.
    varying_energy: f64,
    /// Coefficient of variation of |v_f|.
    norm_cv: f64,
}

fn motion(dense: &[f32], n: usize, strides: &[usize]) -> Result<Motion> {
    let mut lag_list = vec![1usize];
    for &k in strides {
        if !lag_list.contains(&k) {
            lag_list.push(k);
        }
    }
    lag_list.retain(|&l| l < n);
    lag_list.sort_unstable();
    let mut lags = Vec::new();
    for &l in &lag_list {
        let a = (0..n - l)
            .map(|f| metrics::angle_between(frame_of(dense, f), frame_of(dense, f + l)))
            .collect::<Result<Vec<f64>>>()?;
        lags.push((l, a.iter().sum::<f64>() / a.len() as f64, a.iter().copied().fold(0.0, f64::max)));
    }
    let (mut sum, mut count) = (0.0, 0usize);
    for i in 0..n {
        for j in i + 1..n {
            sum += metrics::angle_between(frame_of(dense, i), frame_of(dense, j))?;
            count += 1;
        }
    }
    let mut mean = vec![0.0f64; LATENT_DIM];
    for f in 0..n {
        for (m, &x) in mean.iter_mut().zip(frame_of(dense, f)) {
            *m += x as f64 / n as f64;
        }
    }
    let total: f64 = dense.iter().map(|&x| (x as f64).powi(2)).sum();
    let varying: f64 =
        (0..n).map(|f| frame_of(dense, f).iter().zip(&mean).map(|(&x, m)| (x as f64 - m).powi(2)).sum::<f64>()).sum();
    let norms: Vec<f64> = (0..n).map(|f| metrics::l2_norm(frame_of(dense, f))).collect();
    let nm = norms.iter().sum::<f64>() / n as f64;
    let nsd = (norms.iter().map(|x| (x - nm).powi(2)).sum::<f64>() / n as f64).sqrt();
    Ok(Motion {
        lags,
        all_pairs_mean: if count > 0 { sum / count as f64 } else { 0.0 },
        varying_energy: varying / total,
        norm_cv: nsd / nm,
    })
}

fn method_name(m: Method) -> &'static str {
    match m {
        Method::Lerp => "lerp",
        Method::Slerp => "slerp",
    }
}

fn trajectory(args: &Args, out_dir: &Path) -> Result<()> {
    let t_run = Instant::now();
    let load_before = experiments::provenance::load_average();
    let n = args.session.frames.unwrap_or(DEFAULT_TRAJECTORY_FRAMES);
    let max_k = *args.strides.iter().max().expect("strides checked non-empty");
    ensure!(
        n > max_k,
        "--frames {n} must exceed the largest stride {max_k} (some frame must lie between two keyframes)"
    );
    let mut sa = args.session.clone();
    sa.frames = Some(args.start + n);
    eprintln!("lerp_slerp_ablation: trajectory part: loading engines and inputs ...");
    let session = Session::open(&sa)?;
    let Session { inputs: Inputs { backend, opts, audio, img, face, .. }, engines } = &session;
    let prepared = cadence::musetalk::render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
    let features = prepared.whole_features(engines, opts)?;
    ensure!(
        prepared.frames >= args.start + n,
        "the audio gives {} frames, fewer than --start {} + --frames {n}",
        prepared.frames,
        args.start
    );
    let speech = &prepared.speech[args.start..args.start + n];
    let speech_frac = speech.iter().filter(|&&s| s).count() as f64 / n as f64;
    let batch = opts.batch.max(1);
    let weights = engines.weights_summary();
    let kind = experiments::session::weights_kind(&weights);
    let profile = engines.profile.to_string();

    // Dense trajectory: the UNet on every frame of the stretch (no bypass, no easing).
    let bar = progress_bar(n as u64, "UNet (every frame)");
    let t = Instant::now();
    let frames: Vec<usize> = (args.start..args.start + n).collect();
    let dense = unet_frames(&engines.unet, &features, &prepared.avatar[0], &frames, batch, |b| bar.inc(b as u64))?;
    bar.finish_and_clear();
    let unet_s = t.elapsed().as_secs_f64();
    let mot = motion(&dense, n, &args.strides)?;

    // Decoding: the dense frames once, then every method's in-between frames.
    let schedules: Vec<KeyframeSchedule> =
        args.strides.iter().map(|&k| KeyframeSchedule::fixed_stride(n, k)).collect::<Result<_>>()?;
    let decode_total = n + schedules.iter().map(|s| 2 * (n - s.count())).sum::<usize>();
    let bar = progress_bar(decode_total as u64, "decoding");
    bar.set_message("dense frames");
    let t = Instant::now();
    let crop = 3 * FACE_SIDE * FACE_SIDE;
    let (lo, hi) = engines.decoder.output_range();
    let peak = (hi - lo) as f64;
    let shape = ImageShape::rgb(FACE_SIDE, FACE_SIDE);
    let sharp_scale = (255.0 / peak).powi(2);
    let mut dense_rgb = vec![0.0f32; n * crop];
    let mut dense_sharp = vec![0.0f64; n];
    let mut outside = decode_each(engines.decoder.as_ref(), &dense, batch, |f, rgb| {
        dense_rgb[f * crop..(f + 1) * crop].copy_from_slice(rgb);
        dense_sharp[f] = metrics::sharpness(rgb, shape)? * sharp_scale;
        bar.inc(1);
        Ok(())
    })?;
    let mut decoded_samples = n * crop;

    let mut rows = Vec::new();
    let mut keyframe_check = 0.0f64;
    for (&k, schedule) in args.strides.iter().zip(&schedules) {
        let keys = schedule.keyframes();
        let key_lat: Vec<f32> = keys.iter().flat_map(|&f| frame_of(&dense, f as usize).iter().copied()).collect();
        let mut is_key = vec![false; n];
        keys.iter().for_each(|&f| is_key[f as usize] = true);
        let inbetween: Vec<usize> = (0..n).filter(|&f| !is_key[f]).collect();
        let pos = schedule.frame_positions();
        let key_angles = keys
            .windows(2)
            .map(|w| metrics::angle_between(frame_of(&dense, w[0] as usize), frame_of(&dense, w[1] as usize)))
            .collect::<Result<Vec<f64>>>()?;
        for method in [Method::Lerp, Method::Slerp] {
            bar.set_message(format!("stride {k}, {}", method_name(method)));
            let exp = backend
                .expand(&key_lat, schedule, LATENT_DIM, method)
                .with_context(|| format!("expanding stride {k} with {method:?}"))?;
            for &f in keys {
                let f = f as usize;
                keyframe_check = keyframe_check.max(metrics::max_abs_error(frame_of(&exp, f), frame_of(&dense, f))?);
            }
            let (mut deficit, mut vs_dense, mut rel_err) = (Vec::new(), Vec::new(), Vec::new());
            let (mut hold_err, mut hold_psnr) = (Vec::new(), Vec::new());
            for &f in &inbetween {
                let (j, a) = pos[f];
                let (v0, v1) = (frame_of(&dense, keys[j] as usize), frame_of(&dense, keys[j + 1] as usize));
                let v = frame_of(&exp, f);
                let d = frame_of(&dense, f);
                deficit.push(metrics::norm_deficit(v, v0, v1, a as f64)?);
                let nd = metrics::l2_norm(d);
                vs_dense.push(metrics::l2_norm(v) / nd - 1.0);
                rel_err.push(metrics::mse(v, d)?.sqrt() * (LATENT_DIM as f64).sqrt() / nd);
                let nearest = if a < 0.5 { keys[j] } else { keys[j + 1] } as usize;
                hold_err.push(metrics::mse(frame_of(&dense, nearest), d)?.sqrt() * (LATENT_DIM as f64).sqrt() / nd);
                let (held, reference) =
                    (&dense_rgb[nearest * crop..(nearest + 1) * crop], &dense_rgb[f * crop..(f + 1) * crop]);
                hold_psnr.push(metrics::psnr(held, reference, peak)?);
            }
            let lat: Vec<f32> = inbetween.iter().flat_map(|&f| frame_of(&exp, f).iter().copied()).collect();
            let (mut psnr, mut ssim, mut sharp, mut dsharp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            outside += decode_each(engines.decoder.as_ref(), &lat, batch, |i, rgb| {
                let f = inbetween[i];
                let reference = &dense_rgb[f * crop..(f + 1) * crop];
                psnr.push(metrics::psnr(rgb, reference, peak)?);
                ssim.push(metrics::ssim(rgb, reference, shape, peak)?);
                sharp.push(metrics::sharpness(rgb, shape)? * sharp_scale);
                dsharp.push(dense_sharp[f]);
                bar.inc(1);
                Ok(())
            })?;
            decoded_samples += lat.len() / LATENT_DIM * crop;
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
            let (def, vd): (SignedSummary, SignedSummary) =
                (metrics::signed_summary(&deficit)?, metrics::signed_summary(&vs_dense)?);
            rows.push(TrajectoryRow {
                stride: k,
                method: method_name(method).into(),
                weights_kind: kind.into(),
                engine_profile: profile.clone(),
                frames: n,
                keyframes: keys.len(),
                inbetween_frames: inbetween.len(),
                keyframe_angle_mean_rad: mean(&key_angles),
                keyframe_angle_max_rad: key_angles.iter().copied().fold(0.0, f64::max),
                norm_deficit_mean: def.mean,
                norm_deficit_worst: def.worst,
                norm_vs_dense_mean: vd.mean,
                norm_vs_dense_worst: vd.worst,
                latent_rel_error_mean: mean(&rel_err),
                hold_latent_rel_error_mean: mean(&hold_err),
                hold_psnr_db_mean: mean(&hold_psnr),
                psnr_db_mean: mean(&psnr),
                psnr_db_min: min(&psnr),
                ssim_mean: mean(&ssim),
                ssim_min: min(&ssim),
                sharpness_mean: mean(&sharp),
                dense_sharpness_mean: mean(&dsharp),
                sharpness_ratio: mean(&sharp) / mean(&dsharp),
            });
        }
    }
    bar.finish_and_clear();
    let decode_s = t.elapsed().as_secs_f64();
    ensure!(keyframe_check <= 1e-4, "the expansion changed a keyframe by {keyframe_check:e} (expected it unchanged)");

    // Provenance, including how much the dense trajectory moves and what the weights are.
    let mut prov = session.provenance();
    prov.note(
        "trajectory",
        format!(
            "frames {}..{} of the clip ({n} frames at {} fps; voice activity on {:.0}% of them); UNet on every frame, raw outputs (no silence bypass, no easing); strides {:?}; expansion: Backend::expand on {}",
            args.start,
            args.start + n - 1,
            opts.fps,
            100.0 * speech_frac,
            args.strides,
            backend.describe()
        ),
    );
    let lag_text: Vec<String> =
        mot.lags.iter().map(|(l, m, x)| format!("lag {l}: mean {m:.4} rad, max {x:.4} rad")).collect();
    prov.note(
        "dense_motion",
        format!(
            "angle between dense latents {}; mean over all pairs {:.4} rad; time-varying share of latent energy {:.2e}; |v| coefficient of variation {:.2e}",
            lag_text.join("; "),
            mot.all_pairs_mean,
            mot.varying_energy,
            mot.norm_cv
        ),
    );
    let caveat = match kind {
        "synthetic" => format!(
            "SYNTHETIC WEIGHTS: these latents come from a seeded random UNet ({profile} profile) driven by real speech features; they are NOT the face-motion trajectories of the trained MuseTalk UNet, and the decoded frames are not faces. Judge the figures by dense_motion: consecutive latents are {:.4} rad apart on average (lag {max_k}: {:.4} rad), so LERP's midpoint deficit cos(theta/2) - 1 is only about {:.1e} here; a real trajectory that turns further loses more (see lerp_slerp_norm.csv).",
            mot.lags[0].1,
            mot.lags.iter().find(|l| l.0 == max_k).map_or(f64::NAN, |l| l.1),
            (mot.lags.iter().find(|l| l.0 == max_k).map_or(f64::NAN, |l| l.1) / 2.0).cos() - 1.0
        ),
        "real" => format!("real weights ({profile} profile)"),
        _ => format!("MIXED WEIGHTS ({weights}): only some engines have real weights; the trajectories are not those of the trained model"),
    };
    prov.note("weights_caveat", caveat.clone());
    prov.note(
        "image_metrics",
        format!(
            "decoded {}x{} RGB clamped to the decoder's range [{lo}, {hi}] ({:.2}% of decoded samples lay outside and were clamped); PSNR on all RGB samples, peak {peak}; SSIM on BT.601 luma; sharpness = variance of the Laplacian of luma, 8-bit scale",
            FACE_SIDE,
            FACE_SIDE,
            100.0 * outside as f64 / decoded_samples as f64
        ),
    );
    prov.note(
        "load_average",
        format!(
            "{load_before} at start, {} at end (1/5/15 min; shared machine, times are noisy)",
            experiments::provenance::load_average()
        ),
    );
    prov.note(
        "runtime",
        format!(
            "UNet {unet_s:.1} s, decoding + metrics {decode_s:.1} s, trajectory part {:.1} s",
            t_run.elapsed().as_secs_f64()
        ),
    );

    println!();
    println!(
        "trajectory part: {n} frames from frame {} ({:.0}% speech), {} weights, {profile} profile, decoder {}, engines on {}",
        args.start,
        100.0 * speech_frac,
        kind,
        engines.decoder.model(),
        session.engine_device
    );
    println!(
        "dense motion: {}; all pairs {:.4} rad; time-varying energy share {:.2e}; |v| CV {:.2e}",
        lag_text.join("; "),
        mot.all_pairs_mean,
        mot.varying_energy,
        mot.norm_cv
    );
    println!("{caveat}");
    println!(
        "{:<7} {:<6} {:>7} {:>13} {:>13} {:>12} {:>10} {:>9} {:>9} {:>11}",
        "stride",
        "method",
        "frames",
        "deficit mean",
        "deficit worst",
        "vs dense",
        "PSNR dB",
        "PSNR min",
        "SSIM",
        "sharp ratio"
    );
    for r in &rows {
        println!(
            "{:<7} {:<6} {:>7} {:>13.3e} {:>13.3e} {:>12.3e} {:>10.2} {:>9.2} {:>9.5} {:>11.4}",
            r.stride,
            r.method,
            r.inbetween_frames,
            r.norm_deficit_mean,
            r.norm_deficit_worst,
            r.norm_vs_dense_mean,
            r.psnr_db_mean,
            r.psnr_db_min,
            r.ssim_mean,
            r.sharpness_ratio
        );
    }
    let csv = out_dir.join("lerp_slerp_trajectory.csv");
    write_csv(&csv, &prov, &rows)?;
    println!("wrote {}", csv.display());

    // One figure, four panels against the stride: deficit, PSNR, SSIM, sharpness ratio.
    let pts = |m: &str, f: &dyn Fn(&TrajectoryRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter().filter(|r| r.method == m).map(|r| (r.stride as f64, f(r))).collect()
    };
    let (x0, x1) = (args.strides.iter().min().copied().unwrap_or(2) as f64 - 0.25, max_k as f64 + 0.25);
    let panel = |title: &str, y: &str, f: &dyn Fn(&TrajectoryRow) -> f64| {
        LineChart::new(title, "stride k", y)
            .x_range(x0, x1)
            .series(Series::new("LERP", pts("lerp", f)).style(LineStyle::SolidMarkers).color(3))
            .series(Series::new("SLERP", pts("slerp", f)).style(LineStyle::SolidMarkers).color(0))
    };
    // Deficits and 1 - SSIM span orders of magnitude (SLERP's deficit is float rounding): log axes
    // over whole decades, so the axis always carries labelled ticks.
    let decades = |v: Vec<f64>| -> (f64, f64) {
        let pos: Vec<f64> = v.into_iter().filter(|x| x.is_finite() && *x > 0.0).collect();
        let lo = pos.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = pos.iter().copied().fold(0.0, f64::max);
        if pos.is_empty() {
            (1e-9, 1.0)
        } else {
            // At least two decades: over a single one the log axis may get no 1-2-5 tick at all.
            let (a, b) = (lo.log10().floor(), hi.log10().ceil());
            (10f64.powf(a.min(b - 2.0)), 10f64.powf(b))
        }
    };
    let (d0, d1) = decades(rows.iter().flat_map(|r| [r.norm_deficit_mean.abs(), r.norm_deficit_worst.abs()]).collect());
    let (s0, s1) = decades(rows.iter().map(|r| 1.0 - r.ssim_mean).collect());
    let deficit = panel(
        "|norm deficit| on in-between frames (log; SLERP: f32 rounding)",
        "| |v| / ((1-a)|v0| + a|v1|) - 1 |",
        &|r| r.norm_deficit_mean.abs(),
    )
    .series(Series::new("LERP worst", pts("lerp", &|r| r.norm_deficit_worst.abs())).style(LineStyle::Dashed).color(3))
    .series(Series::new("SLERP worst", pts("slerp", &|r| r.norm_deficit_worst.abs())).style(LineStyle::Dashed).color(0))
    .log_y()
    .y_range(d0, d1)
    .legend(Legend::MiddleRight);
    let psnr = panel("PSNR vs dense decode (mean)", "dB", &|r| r.psnr_db_mean);
    let ssim = panel("1 - SSIM vs dense decode (mean, luma; log)", "1 - SSIM", &|r| 1.0 - r.ssim_mean)
        .log_y()
        .y_range(s0, s1)
        .legend(Legend::LowerRight);
    let sharp = panel("sharpness change vs dense decode (mean)", "Laplacian variance ratio - 1 (%)", &|r| {
        100.0 * (r.sharpness_ratio - 1.0)
    });
    let title = format!(
        "LERP vs SLERP on dense UNet latent trajectories ({n} frames, {kind} weights, {profile} profile, {})",
        engines.decoder.model()
    );
    let files =
        line_plot_grid(&out_dir.join("lerp_slerp_trajectory"), &title, &[deficit, psnr, ssim, sharp], 2, &prov)?;
    println!("wrote {} and {}", files.png.display(), files.svg.display());
    println!(
        "trajectory part took {:.1} s (UNet {unet_s:.1} s, decoding + metrics {decode_s:.1} s)",
        t_run.elapsed().as_secs_f64()
    );
    Ok(())
}
