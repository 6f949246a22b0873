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
//! The trajectory part (real latents from the engines at strides 2, 3, 4) is not wired yet.

use anyhow::{bail, ensure, Context, Result};
use cadence::{Backend, Method};
use clap::Parser;
use experiments::plot::{line_plot, Legend, LineChart, LineStyle, Series};
use experiments::{write_csv, OutDir, Provenance};
use std::f64::consts::PI;

#[derive(Parser, Debug)]
#[command(
    name = "lerp_slerp_ablation",
    about = "Norm ratio of LERP and SLERP (through the cadence kernels) against the angle between unit vectors, with the analytic LERP curve",
    long_about = None
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
    let all = Backend::all_available();
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
    let v: Vec<f64> = cadence::bench::test_data(dim, seed).into_iter().map(f64::from).collect();
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
    ensure!(args.dim >= 2, "--dim must be at least 2 (two orthogonal directions are needed)");
    ensure!(args.angles >= 2, "--angles must be at least 2 (0 and pi)");
    ensure!(!args.alphas.is_empty(), "--alphas is empty");
    for &a in &args.alphas {
        ensure!(a > 0.0 && a < 1.0, "alpha {a} is outside (0, 1)");
    }
    let out_dir = args.out.dir()?;
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
    prov.note("vectors", format!("{} angles in [0, pi] x {} alphas, D = {dim}, unit vectors, f32 storage, seed {}", thetas.len(), args.alphas.len(), args.seed));
    for (b, l, s) in per_backend.iter().enumerate().filter(|(i, _)| *i != primary).map(|(_, x)| x) {
        let dl = l.iter().zip(lerp).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        let ds = s.iter().zip(slerp).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        prov.note(format!("agreement_{}", b.name()), format!("max |ratio difference| vs csv_backend: LERP {dl:.2e}, SLERP {ds:.2e}"));
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
    let worst_lerp_vs_analytic = rows.iter().map(|r| (r.lerp_norm_ratio - r.analytic_lerp_ratio).abs()).fold(0.0, f64::max);
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
    let analytic_label = if (a_mid - 0.5).abs() < 1e-12 { "analytic LERP: cos(theta/2)".to_string() } else { format!("analytic LERP at alpha {a_mid}") };
    let chart = LineChart::new(
        format!("Norm ratio at alpha = {a_mid}: LERP vs SLERP (D = {dim}, cadence slerp_pairs kernel, {})", pb.name()),
        "angle theta between the vectors (rad)",
        "|v_interp| / ((1-a)|v0| + a|v1|)",
    )
    .x_range(0.0, PI)
    .y_range(-0.02, 1.08)
    .series(Series::new(analytic_label, at(a_mid, &|r| r.analytic_lerp_ratio)).style(LineStyle::Dashed).color(7))
    .series(Series::new("LERP (measured)", at(a_mid, &|r| r.lerp_norm_ratio)).style(LineStyle::Markers).color(3))
    .series(Series::new("SLERP (measured)", at(a_mid, &|r| if r.theta_rad < PI - 1e-9 { r.slerp_norm_ratio } else { f64::NAN })).style(LineStyle::SolidMarkers).color(0))
    .series(
        Series::new("SLERP at theta = pi (antipodal: LERP fallback)", at(a_mid, &|r| if r.theta_rad < PI - 1e-9 { f64::NAN } else { r.slerp_norm_ratio }))
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
    let mut slerp_all: Vec<(f64, f64)> = rows.iter().filter(|r| r.theta_rad < PI - 1e-9).map(|r| (r.theta_rad, r.slerp_norm_ratio)).collect();
    slerp_all.sort_by(|a, b| a.0.total_cmp(&b.0));
    chart = chart.series(Series::new("SLERP, every alpha (theta < pi)", slerp_all).style(LineStyle::Markers).color(7)).legend(Legend::LowerLeft);
    let files = line_plot(&out_dir.join("lerp_slerp_norm_alphas"), &chart, &prov)?;
    println!("wrote {} and {}", files.png.display(), files.svg.display());

    println!("trajectory part: requires the engines crate (not yet wired)");
    if rows.iter().any(|r| !r.lerp_norm_ratio.is_finite() || !r.slerp_norm_ratio.is_finite()) {
        bail!("a kernel produced a non-finite norm ratio; see {}", csv.display());
    }
    Ok(())
}
