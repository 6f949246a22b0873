//! Kernel microbenchmarks (issue 4, item 3): every kernel (expand f32/f16 SLERP and LERP,
//! slerp_pairs, ease, rgb_to_nv12 f32/f16) on every available backend over a size sweep.
//! For each case: median time of several runs, GB/s of compulsory bytes, and the ratio to the
//! copy bandwidth of the same traffic measured on the same backend in the same run.
//! Writes `kernel_bench.csv` and `kernel_bench.{png,svg}` (GB/s against size per kernel, with
//! the copy bound as a dashed line).

use anyhow::{bail, ensure, Context, Result};
use cadence::backend::elem::{Method, RgbLayout};
use cadence::Backend;
use clap::Parser;
use experiments::kbench::{self, Reps, Timing};
use experiments::plot::{line_plot_grid, Legend, LineChart, LineStyle, Series};
use experiments::{progress_bar, write_csv, OutDir, Provenance};
use half::f16;
use std::collections::{BTreeMap, HashMap};

#[derive(Parser, Debug)]
#[command(
    name = "kernel_bench",
    about = "Every cadence kernel on every available backend over a size sweep: median time, GB/s of compulsory bytes, ratio to the copy bandwidth measured in the same run",
    long_about = None
)]
struct Args {
    /// Frame counts of the latent kernels (expand, slerp_pairs rows, ease).
    #[arg(long, value_delimiter = ',', default_value = "64,256,640,2560")]
    frames: Vec<usize>,
    /// Latent shapes, CxHxW (4x32x32: MuseTalk/TAESD at 256 px; 4x64x64: SD VAE at 512 px).
    #[arg(long, value_delimiter = ',', default_value = "4x32x32,4x64x64")]
    latents: Vec<String>,
    /// NV12 frame sizes, WIDTHxHEIGHT (even).
    #[arg(long, value_delimiter = ',', default_value = "256x256,512x512,1080x1920")]
    nv12: Vec<String>,
    /// Compositing cases, WIDTHxHEIGHT/BOX/CROP: a CROP-square decoded face resized into a
    /// BOX-square face box of a WIDTHxHEIGHT frame (blend + NV12 of the box).
    #[arg(long, value_delimiter = ',', default_value = "1080x1920/512/256,512x512/256/256")]
    composite: Vec<String>,
    /// Frames converted per NV12 call.
    #[arg(long, default_value_t = 4)]
    nv12_frames: usize,
    /// Keyframe stride of the expansion cases.
    #[arg(long, default_value_t = 3)]
    stride: usize,
    /// Easing ramp in frames (every benchmarked frame lies inside a transition).
    #[arg(long, default_value_t = 4)]
    ramp: u32,
    /// Fewest timed runs per case (the median is reported).
    #[arg(long, default_value_t = 5)]
    min_reps: usize,
    /// Most timed runs per case.
    #[arg(long, default_value_t = 51)]
    max_reps: usize,
    /// Timed runs are added (up to --max-reps) until a case has run about this long.
    #[arg(long, default_value_t = 40.0)]
    target_ms: f64,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Kernels to run.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "expand,slerp-pairs,ease,nv12,composite")]
    kernels: Vec<Kernel>,
    /// Backends: every available one, or only the CPU or only CUDA.
    #[arg(long, value_enum, default_value = "all")]
    backends: BackendSet,
    #[command(flatten)]
    out: OutDir,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Kernel {
    Expand,
    SlerpPairs,
    Ease,
    Nv12,
    Composite,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Expand => "expand",
            Kernel::SlerpPairs => "slerp_pairs",
            Kernel::Ease => "ease",
            Kernel::Nv12 => "rgb_to_nv12",
            Kernel::Composite => "composite_nv12",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BackendSet {
    All,
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dt {
    F32,
    F16,
}
impl Dt {
    fn name(self) -> &'static str {
        match self {
            Dt::F32 => "f32",
            Dt::F16 => "f16",
        }
    }
}

/// One benchmark case (before it runs).
#[derive(Clone, Debug)]
struct Case {
    kernel: Kernel,
    dtype: Dt,
    method: Option<Method>,
    /// Latent shape or NV12 frame size, as given.
    shape: String,
    /// Elements per latent frame, or the NV12 layout.
    dim: usize,
    layout: Option<RgbLayout>,
    /// Compositing: frame width, height, box side, crop side.
    composite: Option<[usize; 4]>,
    frames: usize,
}

#[derive(serde::Serialize, Clone, Debug)]
struct Row {
    backend: String,
    kernel: String,
    dtype: String,
    /// slerp / lerp for the interpolation kernels, empty otherwise.
    method: String,
    /// Latent CxHxW or NV12 WxH.
    shape: String,
    frames: usize,
    /// Keyframe stride (expand only).
    stride: Option<usize>,
    keyframes: Option<usize>,
    compulsory_bytes: u64,
    reps: usize,
    median_ms: f64,
    min_ms: f64,
    gbps: f64,
    /// Copy of the same traffic (compulsory_bytes/2 read + written) on the same backend, median.
    copy_gbps: f64,
    ratio_to_copy: f64,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("kernel_bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn parse_dims(s: &str, n: usize, what: &str) -> Result<Vec<usize>> {
    let v: Vec<usize> =
        s.split('x').map(|p| p.trim().parse::<usize>()).collect::<std::result::Result<_, _>>().with_context(|| {
            format!("{what} '{s}' is not of the form {}", if n == 3 { "CxHxW" } else { "WIDTHxHEIGHT" })
        })?;
    ensure!(v.len() == n && v.iter().all(|&d| d > 0), "{what} '{s}' must have {n} positive dimensions");
    Ok(v)
}

fn cases(a: &Args) -> Result<Vec<Case>> {
    let mut out = Vec::new();
    let mut kernels = a.kernels.clone();
    kernels.sort();
    kernels.dedup();
    for &k in &kernels {
        if k == Kernel::Composite {
            for s in &a.composite {
                let parts: Vec<&str> = s.split('/').collect();
                ensure!(parts.len() == 3, "compositing case '{s}' is not of the form WIDTHxHEIGHT/BOX/CROP");
                let d = parse_dims(parts[0], 2, "frame size")?;
                let side = |p: &str| p.trim().parse::<usize>().ok().filter(|&v| v >= 2 && v % 2 == 0);
                let (b, c) = (side(parts[1]), side(parts[2]));
                let (Some(b), Some(c)) = (b, c) else {
                    bail!("compositing case '{s}': BOX and CROP must be even numbers of at least 2")
                };
                ensure!(
                    d[0] % 2 == 0 && d[1] % 2 == 0 && b <= d[0] && b <= d[1],
                    "compositing case '{s}': the frame must be even-sized and hold the box"
                );
                out.push(Case {
                    kernel: k,
                    dtype: Dt::F32,
                    method: None,
                    shape: s.clone(),
                    dim: 0,
                    layout: None,
                    composite: Some([d[0], d[1], b, c]),
                    frames: 1,
                });
            }
            continue;
        }
        if k == Kernel::Nv12 {
            for s in &a.nv12 {
                let d = parse_dims(s, 2, "NV12 size")?;
                let layout = RgbLayout::packed(d[0], d[1], a.nv12_frames);
                layout.validate(layout.len()).with_context(|| format!("NV12 size {s}"))?;
                for dt in [Dt::F32, Dt::F16] {
                    out.push(Case {
                        kernel: k,
                        dtype: dt,
                        method: None,
                        shape: s.clone(),
                        dim: layout.frame_len(),
                        layout: Some(layout),
                        composite: None,
                        frames: a.nv12_frames,
                    });
                }
            }
            continue;
        }
        for s in &a.latents {
            let dim: usize = parse_dims(s, 3, "latent shape")?.iter().product();
            for &frames in &a.frames {
                ensure!(frames >= 1, "--frames values must be at least 1");
                for dt in [Dt::F32, Dt::F16] {
                    let methods: &[Option<Method>] =
                        if k == Kernel::Ease { &[None] } else { &[Some(Method::Slerp), Some(Method::Lerp)] };
                    for &m in methods {
                        out.push(Case {
                            kernel: k,
                            dtype: dt,
                            method: m,
                            shape: s.clone(),
                            dim,
                            layout: None,
                            composite: None,
                            frames,
                        });
                    }
                }
            }
        }
    }
    ensure!(!out.is_empty(), "nothing to benchmark: the kernel and size lists are empty");
    Ok(out)
}

fn time_case(b: &Backend, c: &Case, a: &Args, r: Reps) -> Result<Timing> {
    match (c.kernel, c.dtype) {
        (Kernel::Expand, Dt::F32) => kbench::time_expand::<f32>(b, c.frames, a.stride, c.dim, c.method.unwrap(), r),
        (Kernel::Expand, Dt::F16) => kbench::time_expand::<f16>(b, c.frames, a.stride, c.dim, c.method.unwrap(), r),
        (Kernel::SlerpPairs, Dt::F32) => kbench::time_slerp_pairs::<f32>(b, c.frames, c.dim, c.method.unwrap(), r),
        (Kernel::SlerpPairs, Dt::F16) => kbench::time_slerp_pairs::<f16>(b, c.frames, c.dim, c.method.unwrap(), r),
        (Kernel::Ease, Dt::F32) => kbench::time_ease::<f32>(b, c.frames, c.dim, a.ramp, r),
        (Kernel::Ease, Dt::F16) => kbench::time_ease::<f16>(b, c.frames, c.dim, a.ramp, r),
        (Kernel::Nv12, Dt::F32) => kbench::time_nv12::<f32>(b, c.layout.unwrap(), r),
        (Kernel::Nv12, Dt::F16) => kbench::time_nv12::<f16>(b, c.layout.unwrap(), r),
        (Kernel::Composite, Dt::F32) => {
            let [w, h, side, crop] = c.composite.unwrap();
            kbench::time_composite(b, w, h, side, crop, r)
        }
        (Kernel::Composite, Dt::F16) => bail!("the compositor takes f32 crops only"),
    }
}

fn run(a: Args) -> Result<()> {
    ensure!(a.min_reps >= 3, "--min-reps must be at least 3 (the median of fewer runs means little)");
    ensure!(a.max_reps >= a.min_reps, "--max-reps must be at least --min-reps");
    ensure!(a.target_ms >= 0.0 && a.target_ms.is_finite(), "--target-ms must be a non-negative number");
    ensure!(a.stride >= 1, "--stride must be at least 1");
    let cases = cases(&a)?;
    let out_dir = a.out.dir()?;
    let all = Backend::all_available()?;
    let backends: Vec<Backend> = match a.backends {
        BackendSet::All => all,
        BackendSet::Cpu => all.into_iter().filter(|b| !b.is_cuda()).collect(),
        BackendSet::Cuda => all.into_iter().filter(|b| b.is_cuda()).collect(),
    };
    if backends.is_empty() {
        bail!("no {:?} backend is available on this machine (CUDA needs a driver and a GPU)", a.backends);
    }
    let r = Reps { warmup: a.warmup, min_reps: a.min_reps, max_reps: a.max_reps, target_ms: a.target_ms };
    for b in &backends {
        eprintln!("backend: {}", b.describe());
    }

    let load_before = experiments::provenance::load_average();
    let bar = progress_bar((cases.len() * backends.len()) as u64, "kernel_bench");
    let mut rows = Vec::new();
    for b in &backends {
        // Copy bandwidth per traffic size, measured once per size and backend in this run.
        let mut copy: HashMap<u64, f64> = HashMap::new();
        for c in &cases {
            let label = format!(
                "{} {} {} {} x{} {}",
                b.name(),
                c.kernel.name(),
                c.dtype.name(),
                c.method.map(method_name).unwrap_or(""),
                c.frames,
                c.shape
            );
            bar.set_message(label.clone());
            let t = time_case(b, c, &a, r).with_context(|| format!("benchmark {label}"))?;
            let copy_gbps = match copy.get(&t.compulsory_bytes) {
                Some(&g) => g,
                None => {
                    let g = kbench::copy_gbps(b, t.compulsory_bytes, r)
                        .with_context(|| format!("copy bound for {label}"))?;
                    copy.insert(t.compulsory_bytes, g);
                    g
                }
            };
            let keyframes = (c.kernel == Kernel::Expand)
                .then(|| cadence::KeyframeSchedule::fixed_stride(c.frames, a.stride).map(|s| s.count()))
                .transpose()?;
            rows.push(Row {
                backend: b.name().to_string(),
                kernel: c.kernel.name().to_string(),
                dtype: c.dtype.name().to_string(),
                method: c.method.map(method_name).unwrap_or("").to_string(),
                shape: c.shape.clone(),
                frames: c.frames,
                stride: (c.kernel == Kernel::Expand).then_some(a.stride),
                keyframes,
                compulsory_bytes: t.compulsory_bytes,
                reps: t.times_ms.len(),
                median_ms: t.median_ms(),
                min_ms: t.min_ms(),
                gbps: t.gbps(),
                copy_gbps,
                ratio_to_copy: t.gbps() / copy_gbps,
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();

    let mut prov = Provenance::for_backends(&backends, "n/a", "n/a");
    prov.note(
        "load_average",
        format!("{load_before} at the start, {} at the end (1, 5, 15 min)", experiments::provenance::load_average()),
    );
    prov.note(
        "timing",
        format!(
            "median of {}..{} timed runs (as many as fit in about {} ms per case) after {} warm-up run(s); CPU: wall clock, CUDA: stream events, data resident on the device",
            a.min_reps, a.max_reps, a.target_ms, a.warmup
        ),
    );
    prov.note(
        "compulsory_bytes",
        "expand: (keyframes + frames) x frame; slerp_pairs: 3 x rows x frame + alphas; ease: 2 x frames x frame + rest + distances (every frame in a transition); rgb_to_nv12: RGB in + NV12 out; composite_nv12: crop in (f32) + blend weight and 3 background terms per box pixel (f32) + the box's NV12 out",
    );
    prov.note(
        "copy_bound",
        "copy of compulsory_bytes/2 (read + written = compulsory_bytes) on the same backend: parallel memcpy over the rayon threads between page-aligned buffers half a page apart (CPU), device-to-device memcpy (CUDA)",
    );

    print_table(&rows);
    let csv = out_dir.join("kernel_bench.csv");
    write_csv(&csv, &prov, &rows)?;
    println!("wrote {}", csv.display());
    let files = plot(&rows, &backends, &out_dir, &prov)?;
    println!("wrote {} and {}", files.png.display(), files.svg.display());
    Ok(())
}

fn method_name(m: Method) -> &'static str {
    match m {
        Method::Slerp => "slerp",
        Method::Lerp => "lerp",
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<5} {:<12} {:<4} {:<6} {:<10} {:>6} {:>10} {:>10} {:>9} {:>9} {:>7}",
        "back", "kernel", "type", "method", "shape", "frames", "MB", "median ms", "GB/s", "copy GB/s", "ratio"
    );
    for r in rows {
        println!(
            "{:<5} {:<12} {:<4} {:<6} {:<10} {:>6} {:>10.2} {:>10.4} {:>9.2} {:>9.2} {:>7.3}",
            r.backend,
            r.kernel,
            r.dtype,
            r.method,
            r.shape,
            r.frames,
            r.compulsory_bytes as f64 / 1e6,
            r.median_ms,
            r.gbps,
            r.copy_gbps,
            r.ratio_to_copy
        );
    }
}

/// One panel per (backend, kernel, storage type): GB/s against compulsory MB, one line per
/// method and frame shape (over the frame counts; NV12: over the resolutions), and the copy
/// bound measured at the same byte counts as a dashed line.
fn plot(
    rows: &[Row],
    backends: &[Backend],
    out_dir: &std::path::Path,
    prov: &Provenance,
) -> Result<experiments::plot::PlotFiles> {
    let mut charts = Vec::new();
    for b in backends {
        for k in [Kernel::Expand, Kernel::SlerpPairs, Kernel::Ease, Kernel::Nv12, Kernel::Composite] {
            for dt in ["f32", "f16"] {
                let mine: Vec<&Row> =
                    rows.iter().filter(|r| r.backend == b.name() && r.kernel == k.name() && r.dtype == dt).collect();
                if mine.is_empty() {
                    continue;
                }
                let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
                let mut copy: BTreeMap<u64, f64> = BTreeMap::new();
                for r in &mine {
                    let name = match k {
                        Kernel::Nv12 => format!("BT.709, {} frames per call", r.frames),
                        Kernel::Composite => "BT.709, box feathered 1/8".to_string(),
                        _ => format!("{} {}", r.method, r.shape).trim().to_string(),
                    };
                    series.entry(name).or_default().push((r.compulsory_bytes as f64 / 1e6, r.gbps));
                    copy.insert(r.compulsory_bytes, r.copy_gbps);
                }
                let title = match k {
                    Kernel::Expand => format!("expand {dt}, stride {} ({})", mine[0].stride.unwrap_or(0), b.name()),
                    Kernel::Nv12 | Kernel::Composite => {
                        let sizes: Vec<&str> = mine.iter().map(|r| r.shape.as_str()).collect();
                        format!("{} {dt}: {} ({})", k.name(), sizes.join(", "), b.name())
                    }
                    _ => format!("{} {dt} ({})", k.name(), b.name()),
                };
                let x_label = match k {
                    Kernel::Nv12 => "compulsory MB (RGB in + NV12 out)".to_string(),
                    Kernel::Composite => "compulsory MB (crop + per-box-pixel terms in, box NV12 out)".to_string(),
                    _ => format!("compulsory MB (frames {})", frames_list(&mine)),
                };
                let mut chart =
                    LineChart::new(title, x_label, "GB/s (log scale)").log_x().log_y().legend(Legend::UpperRight);
                for (i, (name, mut pts)) in series.into_iter().enumerate() {
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    chart = chart.series(Series::new(name, pts).style(LineStyle::SolidMarkers).color(i));
                }
                let copy_pts: Vec<(f64, f64)> = copy.into_iter().map(|(bytes, g)| (bytes as f64 / 1e6, g)).collect();
                chart = chart.series(Series::new("copy, same bytes", copy_pts).style(LineStyle::Dashed).color(7));
                // Headroom above for the legend; the copy line usually falls to the right.
                let ys = || chart.series.iter().flat_map(|s| &s.points).map(|p| p.1).filter(|y| *y > 0.0);
                let (ymin, ymax) = (ys().fold(f64::INFINITY, f64::min), ys().fold(0.0, f64::max));
                if ymax > 0.0 {
                    chart = chart.y_range(ymin / 2.0, ymax * 8.0);
                }
                charts.push(chart);
            }
        }
    }
    line_plot_grid(
        &out_dir.join("kernel_bench"),
        "cadence kernels: GB/s of compulsory bytes, against a copy of the same bytes",
        &charts,
        2,
        prov,
    )
}

fn frames_list(rows: &[&Row]) -> String {
    let mut f: Vec<usize> = rows.iter().map(|r| r.frames).collect();
    f.sort();
    f.dedup();
    f.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}
