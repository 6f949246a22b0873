//! cadence's MTCNN face detector (`cadence_engines::mtcnn::detect::Mtcnn::detect`) against
//! facenet-pytorch 2.6.0's `MTCNN().detect(img, landmarks=True)` on this CPU, same frames, same
//! thread count, timed back to back in one run (issue 40's speed target: cadence at least 2x as
//! fast). The peer is `experiments/peers/mtcnn_peer.py`, a persistent Python worker; each round
//! times one detection on each side, alternating which goes first, after one warm-up each; medians
//! are compared. Both sides time the detection alone on an already decoded image (cadence: RGB
//! bytes; facenet-pytorch: a numpy uint8 HxWx3 array), and the faces both found are compared
//! (box IoU). Writes results/faces_bench.csv.
//!
//! Frames (built as engines/tests/mtcnn_detect.rs builds them, from fixtures/mtcnn/astronaut.png):
//! `1080x1920`, the 512x512 portrait at (283, 1101) in a grey (128) portrait-video frame, and
//! `512x512`, the portrait alone.
//!
//! `--ours-only` times cadence alone (no Python, no CSV) and prints its stages: for profiling.

use anyhow::{bail, ensure, Context, Result};
use cadence::measure::bench::median;
use cadence_engines::mtcnn::detect::{Face, Mtcnn, MtcnnConfig, StageTimes};
use cadence_engines::Device;
use clap::Parser;
use experiments::csvout::write_csv;
use experiments::peer::{cpu_flags, python, Worker, PYTHON_ENV};
use experiments::provenance::{load_average, Provenance};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Environment variable naming the directory of the unpacked facenet-pytorch wheel.
const FACENET_ENV: &str = "CADENCE_FACENET_PATH";
/// The peer script's exit status when torch or facenet-pytorch is missing.
const NO_PEER_EXIT: i32 = 3;
/// The ratio issue 40 asks for (cadence frames/s over facenet-pytorch frames/s).
const TARGET_RATIO: f64 = 2.0;
/// Faces count as the same when their boxes overlap this much (the detector test's bar).
const SAME_FACE_IOU: f64 = 0.95;

#[derive(Parser)]
#[command(about = "cadence's MTCNN against facenet-pytorch's on this CPU, same frames and threads, alternating; \
                   writes results/faces_bench.csv")]
struct Args {
    /// Python with torch, torchvision and numpy (else $CADENCE_PEER_PYTHON, else
    /// experiments/peers/.venv/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Directory of the unpacked facenet-pytorch 2.6.0 wheel (else $CADENCE_FACENET_PATH, else
    /// the package installed for the Python).
    #[arg(long)]
    facenet_path: Option<PathBuf>,
    /// Threads on both sides (rayon's pool; torch.set_num_threads).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed rounds per frame (one detection of each side per round, after one warm-up each).
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Frames to time (comma-separated): 1080x1920, 512x512.
    #[arg(long, value_delimiter = ',', default_value = "1080x1920,512x512")]
    frames: Vec<String>,
    /// Time cadence alone and print its stages (no Python, no CSV).
    #[arg(long)]
    ours_only: bool,
    #[command(flatten)]
    out: experiments::OutDir,
}

/// An RGB frame: width, height, bytes (rows top to bottom).
struct Rgb {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

fn frame(name: &str) -> Result<Rgb> {
    let path = experiments::paths::workspace_root().join("fixtures/mtcnn/astronaut.png");
    let face = image::open(&path).with_context(|| format!("reading {}", path.display()))?.to_rgb8();
    let (fw, fh) = (face.width() as usize, face.height() as usize);
    let face = Rgb { w: fw, h: fh, px: face.into_raw() };
    Ok(match name {
        "512x512" => face,
        "1080x1920" => {
            let (w, h, (ox, oy)) = (1080, 1920, (283, 1101));
            let mut px = vec![128u8; w * h * 3];
            for y in 0..fh {
                px[((oy + y) * w + ox) * 3..((oy + y) * w + ox + fw) * 3]
                    .copy_from_slice(&face.px[y * fw * 3..(y + 1) * fw * 3]);
            }
            Rgb { w, h, px }
        }
        other => bail!("unknown frame {other:?}: 1080x1920 or 512x512"),
    })
}

/// The facenet-pytorch worker (`mtcnn_peer.py --worker`).
struct Peer(Worker);

impl Peer {
    fn start(python: &Path, script: &Path, facenet: Option<&Path>, threads: usize) -> Result<Peer> {
        let mut cmd = Command::new(python);
        cmd.arg(script).args(["--worker", "--threads", &threads.to_string()]);
        if let Some(dir) = facenet {
            cmd.arg("--facenet-path").arg(dir);
        }
        let worker = Worker::start(cmd, threads, |status| {
            if status.code() == Some(NO_PEER_EXIT) {
                anyhow::anyhow!(
                    "{} cannot run facenet-pytorch (its message is above): name a Python with torch, torchvision \
                     and numpy by --python or {PYTHON_ENV}, and the unpacked facenet-pytorch 2.6.0 wheel by \
                     --facenet-path or {FACENET_ENV}",
                    python.display()
                )
            } else {
                anyhow::anyhow!("the facenet-pytorch peer exited ({status}) before it was ready")
            }
        })?;
        Ok(Peer(worker))
    }

    fn ask(&mut self, command: &str) -> Result<serde_json::Value> {
        self.0.ask(command)
    }

    /// Hands the peer a frame (raw RGB through a temporary file).
    fn set_frame(&mut self, img: &Rgb, dir: &Path) -> Result<()> {
        let path = dir.join(format!("faces_bench_{}_{}x{}.rgb", std::process::id(), img.w, img.h));
        std::fs::write(&path, &img.px)?;
        let answer = self.ask(&format!("frame {} {} {}", img.w, img.h, path.display()));
        std::fs::remove_file(&path).ok();
        answer.map(|_| ())
    }

    /// One timed detection on the peer's side: (seconds as the peer measured them, boxes).
    fn run(&mut self) -> Result<(f64, Vec<[f64; 4]>)> {
        let v = self.ask("run")?;
        let seconds = v["seconds"].as_f64().with_context(|| format!("peer answered {v}"))?;
        let boxes = v["faces"]
            .as_array()
            .context("peer's faces")?
            .iter()
            .map(|f| {
                let b: Vec<f64> = f["box"].as_array().into_iter().flatten().filter_map(|x| x.as_f64()).collect();
                ensure!(b.len() == 4, "peer's box {f}");
                Ok([b[0], b[1], b[2], b[3]])
            })
            .collect::<Result<_>>()?;
        Ok((seconds, boxes))
    }
}

#[derive(serde::Serialize)]
struct Row {
    frame: String,
    rounds: usize,
    threads: usize,
    cadence_median_ms: f64,
    facenet_median_ms: f64,
    /// facenet-pytorch's median over cadence's: how many times faster cadence is.
    ratio: f64,
    target_ratio: f64,
    verdict: String,
    faces_cadence: usize,
    faces_facenet: usize,
    /// Smallest IoU between a cadence face and facenet-pytorch's face of the same rank.
    min_iou: f64,
    /// cadence's stages (medians of the timed rounds): the pyramid's resampling with P-Net and
    /// its NMS, R-Net (crops, network, NMS), O-Net (crops, network, landmarks, NMS).
    cadence_pnet_ms: f64,
    cadence_rnet_ms: f64,
    cadence_onet_ms: f64,
}

fn iou(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let area = |r: &[f64; 4]| (r[2] - r[0]) * (r[3] - r[1]);
    iw * ih / (area(a) + area(b) - iw * ih)
}

/// Smallest IoU of same-rank faces; 0 when the counts differ (1 when both found none).
fn min_iou(ours: &[Face], theirs: &[[f64; 4]]) -> f64 {
    if ours.len() != theirs.len() {
        return 0.0;
    }
    ours.iter().zip(theirs).map(|(o, t)| iou(&o.bbox.map(f64::from), t)).fold(1.0, f64::min)
}

/// One timed detection on cadence's side: (seconds, stages, faces).
fn ours(mtcnn: &Mtcnn, img: &Rgb) -> Result<(f64, StageTimes, Vec<Face>)> {
    let t = Instant::now();
    let (faces, stages) = mtcnn.detect_timed(&img.px, img.w, img.h)?;
    Ok((t.elapsed().as_secs_f64(), stages, faces))
}

/// Medians of each stage over the rounds, in ms.
fn stage_medians(s: &[StageTimes]) -> [f64; 3] {
    let m = |f: fn(&StageTimes) -> f64| median(&s.iter().map(f).collect::<Vec<_>>()) * 1e3;
    [m(|t| t.pnet), m(|t| t.rnet), m(|t| t.onet)]
}

fn main() -> Result<()> {
    let a = Args::parse();
    cadence_engines::isa::check_env()?;
    ensure!(a.threads > 0 && a.rounds > 0, "--threads and --rounds must be positive");
    rayon::ThreadPoolBuilder::new().num_threads(a.threads).build_global().context("rayon's thread pool")?;
    let frames: Vec<(String, Rgb)> = a.frames.iter().map(|n| Ok((n.clone(), frame(n)?))).collect::<Result<_>>()?;
    let mtcnn = Mtcnn::new(&Device::Cpu, MtcnnConfig::default())?;
    eprintln!("cadence: {} threads, CPU loops {}", a.threads, cadence_engines::isa::describe());

    if a.ours_only {
        for (name, img) in &frames {
            ours(&mtcnn, img)?;
            let (mut times, mut stages) = (Vec::new(), Vec::new());
            for _ in 0..a.rounds {
                let (t, s, _) = ours(&mtcnn, img)?;
                times.push(t);
                stages.push(s);
            }
            let [p, r, o] = stage_medians(&stages);
            println!(
                "{name}: median {:.1} ms (pyramid and P-Net {p:.1}, R-Net {r:.1}, O-Net {o:.1} ms)",
                median(&times) * 1e3
            );
        }
        return Ok(());
    }

    let root = experiments::paths::workspace_root();
    let python = python(a.python, &root);
    let script = root.join("experiments/peers/mtcnn_peer.py");
    ensure!(script.is_file(), "{} is missing", script.display());
    if !python.exists() {
        bail!(
            "no Python at {}: name a Python with torch, torchvision and numpy by --python or {PYTHON_ENV} (and the \
             unpacked facenet-pytorch 2.6.0 wheel by --facenet-path or {FACENET_ENV}); this benchmark is not part \
             of CI",
            python.display()
        );
    }
    let facenet = a.facenet_path.or_else(|| std::env::var_os(FACENET_ENV).filter(|v| !v.is_empty()).map(PathBuf::from));
    let out_dir = a.out.dir()?;
    let load_start = load_average();
    let t0 = Instant::now();
    let mut peer = Peer::start(&python, &script, facenet.as_deref(), a.threads)?;
    eprintln!("peer: {}", peer.0.info);
    let mut rows = Vec::new();
    for (name, img) in &frames {
        peer.set_frame(img, &std::env::temp_dir())?;
        ours(&mtcnn, img)?;
        peer.run()?;
        let (mut t_ours, mut t_theirs, mut stages) = (Vec::new(), Vec::new(), Vec::new());
        let mut worst_iou = 1f64;
        let (mut n_ours, mut n_theirs) = (0, 0);
        for round in 0..a.rounds {
            let ((to, s, faces), (tt, boxes)) = if round % 2 == 0 {
                let o = ours(&mtcnn, img)?;
                (o, peer.run()?)
            } else {
                let t = peer.run()?;
                (ours(&mtcnn, img)?, t)
            };
            worst_iou = worst_iou.min(min_iou(&faces, &boxes));
            (n_ours, n_theirs) = (faces.len(), boxes.len());
            eprintln!("  {name} round {round}: cadence {:.1} ms, facenet-pytorch {:.1} ms", to * 1e3, tt * 1e3);
            t_ours.push(to);
            t_theirs.push(tt);
            stages.push(s);
        }
        let (m_ours, m_theirs) = (median(&t_ours), median(&t_theirs));
        let ratio = m_theirs / m_ours;
        let same = worst_iou >= SAME_FACE_IOU;
        let [p, r, o] = stage_medians(&stages);
        rows.push(Row {
            frame: name.clone(),
            rounds: a.rounds,
            threads: a.threads,
            cadence_median_ms: m_ours * 1e3,
            facenet_median_ms: m_theirs * 1e3,
            ratio,
            target_ratio: TARGET_RATIO,
            verdict: match (ratio >= TARGET_RATIO, same) {
                (_, false) => "DIFFERENT FACES",
                (true, true) => "met",
                (false, true) => "NOT MET",
            }
            .into(),
            faces_cadence: n_ours,
            faces_facenet: n_theirs,
            min_iou: worst_iou,
            cadence_pnet_ms: p,
            cadence_rnet_ms: r,
            cadence_onet_ms: o,
        });
        eprintln!(
            "{name}: cadence {:.1} ms, facenet-pytorch {:.1} ms: {ratio:.2}x (target >= {TARGET_RATIO}); faces {n_ours} \
             vs {n_theirs}, min IoU {worst_iou:.5}",
            m_ours * 1e3,
            m_theirs * 1e3
        );
    }
    let info = peer.0.info.clone();
    peer.0.quit()?;

    let mut prov = Provenance::gather(
        format!("cpu ({} threads) vs facenet-pytorch on torch CPU ({} threads)", a.threads, a.threads),
        "n/a",
        "MTCNN, facenet-pytorch 2.6.0's trained weights on both sides (cadence: embedded copies)",
    );
    prov.note("cpu_flags", cpu_flags());
    prov.note("cpu_loops", cadence_engines::isa::describe());
    let field = |k: &str| info[k].as_str().map(str::to_string).unwrap_or_else(|| info[k].to_string());
    prov.note(
        "peer",
        format!(
            "facenet-pytorch {} ({}), torch {} (cpu capability {}), numpy {}, python {} ({})",
            field("facenet_pytorch"),
            field("facenet_path"),
            field("torch"),
            field("cpu_capability"),
            field("numpy"),
            field("python"),
            python.display()
        ),
    );
    prov.note(
        "method",
        "per frame: one warm-up detection each, then --rounds rounds of one cadence and one facenet-pytorch \
         detection (order alternating), medians compared; cadence times Mtcnn::detect on RGB bytes, \
         facenet-pytorch times MTCNN().detect(img, landmarks=True) on a numpy uint8 HxWx3 array in a persistent \
         worker (experiments/peers/mtcnn_peer.py); ratio = facenet-pytorch median / cadence median; min_iou: \
         same-rank boxes of both sides over all rounds",
    );
    prov.note("load_average", format!("{load_start} at start, {} at end (1/5/15 min)", load_average()));
    prov.note("runtime", format!("{:.0} s", t0.elapsed().as_secs_f64()));
    let csv = out_dir.join("faces_bench.csv");
    write_csv(&csv, &prov, &rows)?;
    println!("wrote {}", csv.display());
    Ok(())
}
