//! Strides against the dense render (the source's sections 5.2-5.3), for both engines: for each
//! engine, stride and infill (Ditto: feature, image, motion; MuseTalk: latent, image), PSNR and
//! SSIM of the face box's luma against the same engine's dense render, and the flicker index
//! (mean absolute difference between consecutive frames in the mouth region) beside the dense
//! render's own; plus a picture grid of the face box at the source's frames 17, 22, 25, 50, 62:
//! Ditto dense, stride 2 and stride 3 (image infill), stride 3 (motion infill), MuseTalk dense,
//! MuseTalk stride 3 (image infill). Writes results/ditto_parity.csv and
//! results/ditto_parity_grid.png.
//!
//! With synthetic weights these numbers measure the method on this network, not a trained face:
//! the files say so.

use anyhow::{ensure, Result};
use cadence::backend::composite::FaceBox;
use cadence::ditto::{self, DittoEngines, DittoInfill};
use cadence::musetalk::MuseTalkInfill;
use cadence::{Backend, KeyframeSchedule, Method};
use clap::Parser;
use experiments::metrics::{psnr, ssim_gray};
use experiments::session::{Inputs, Session, SessionArgs};

#[derive(Parser)]
#[command(about = "Ditto strides and infills against the dense render: PSNR, SSIM, mouth flicker, picture grid")]
struct Args {
    /// Strides to compare with the dense render.
    #[arg(long, default_value = "2,3", value_delimiter = ',')]
    strides: Vec<usize>,
    /// DDIM steps of the motion diffusion.
    #[arg(long, default_value_t = ditto::DEFAULT_STEPS)]
    ditto_steps: usize,
    #[command(flatten)]
    session: SessionArgs,
    #[command(flatten)]
    out: experiments::OutDir,
}

/// The source's picture frames (its sections 5.2-5.3).
const GRID_FRAMES: [usize; 5] = [17, 22, 25, 50, 62];
/// Frames rendered when --frames is not given: enough for the grid's frames.
const DEFAULT_FRAMES: usize = 125;

#[derive(serde::Serialize)]
struct Row {
    engine: &'static str,
    stride: usize,
    infill: String,
    frames: usize,
    keyframes: usize,
    infilled_frames: usize,
    /// PSNR of the face box's luma over every frame (one MSE over the sequence).
    psnr_db: f64,
    /// PSNR over the infilled frames only (not keyframes, not bypassed).
    psnr_infilled_db: f64,
    /// Mean SSIM of the infilled frames' face-box luma.
    ssim_infilled: f64,
    /// Mean |frame t+1 − frame t| in the mouth region, 8-bit luma.
    flicker_mouth: f64,
    flicker_mouth_dense: f64,
}

/// The face box's luma of an NV12 frame, as f32 in 0..255.
fn face_luma(nv12: &[u8], width: usize, face: FaceBox) -> Vec<f32> {
    let (x, y, w, h) = face.as_usize();
    (y..y + h).flat_map(|r| nv12[r * width + x..r * width + x + w].iter().map(|&v| v as f32)).collect()
}

/// Rows 60-85% and columns 30-70% of the face box: where the mouth of a centred face is.
fn mouth(luma: &[f32], w: usize, h: usize) -> Vec<f32> {
    let (r0, r1, c0, c1) = (h * 60 / 100, h * 85 / 100, w * 30 / 100, w * 70 / 100);
    (r0..r1).flat_map(|r| luma[r * w + c0..r * w + c1].iter().copied()).collect()
}

fn flicker(frames: &[Vec<f32>], w: usize, h: usize) -> f64 {
    let m: Vec<Vec<f32>> = frames.iter().map(|f| mouth(f, w, h)).collect();
    let total: f64 = m.windows(2).map(|p| p[0].iter().zip(&p[1]).map(|(a, b)| (a - b).abs() as f64).sum::<f64>()).sum();
    total / ((m.len() - 1) * m[0].len()) as f64
}

/// Every frame of a render: face-box luma, and the full NV12 of the grid's frames.
struct Captured {
    luma: Vec<Vec<f32>>,
    grid: Vec<Vec<u8>>,
}

impl Captured {
    fn new(frames: usize) -> Captured {
        Captured { luma: Vec::with_capacity(frames), grid: Vec::new() }
    }

    /// A sink for a render's frames.
    fn add(&mut self, i: usize, nv12: &[u8], width: usize, face: FaceBox, grid_frames: &[usize]) {
        self.luma.push(face_luma(nv12, width, face));
        if grid_frames.contains(&i) {
            self.grid.push(nv12.to_vec());
        }
    }
}

/// One render at stride `k` against its engine's dense render: `bypassed[f]`, frame f skipped every
/// network (it is the rest frame in both).
struct Compared<'a> {
    engine: &'static str,
    dense: &'a Captured,
    dense_flicker: f64,
    bypassed: &'a [bool],
    /// The face box's size.
    fw: usize,
    fh: usize,
}

impl Compared<'_> {
    fn row(&self, k: usize, infill: &str, r: &Captured) -> Result<Row> {
        let n = self.dense.luma.len();
        ensure!(r.luma.len() == n, "{} frames against a dense render of {n}", r.luma.len());
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        let keys: Vec<usize> = schedule.keyframes().iter().map(|&f| f as usize).collect();
        let infilled: Vec<usize> = (0..n).filter(|f| !keys.contains(f) && !self.bypassed[*f]).collect();
        let all_a: Vec<f32> = r.luma.concat();
        let all_b: Vec<f32> = self.dense.luma.concat();
        let inf_a: Vec<f32> = infilled.iter().flat_map(|&f| r.luma[f].iter().copied()).collect();
        let inf_b: Vec<f32> = infilled.iter().flat_map(|&f| self.dense.luma[f].iter().copied()).collect();
        let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let ssim_sum: f64 = infilled
            .iter()
            .map(|&f| ssim_gray(&to64(&r.luma[f]), &to64(&self.dense.luma[f]), self.fw, self.fh, 255.0))
            .sum::<Result<f64>>()?;
        Ok(Row {
            engine: self.engine,
            stride: k,
            infill: infill.into(),
            frames: n,
            keyframes: keys.len(),
            infilled_frames: infilled.len(),
            psnr_db: psnr(&all_a, &all_b, 255.0)?,
            psnr_infilled_db: if infilled.is_empty() { f64::INFINITY } else { psnr(&inf_a, &inf_b, 255.0)? },
            ssim_infilled: if infilled.is_empty() { 1.0 } else { ssim_sum / infilled.len() as f64 },
            flicker_mouth: flicker(&r.luma, self.fw, self.fh),
            flicker_mouth_dense: self.dense_flicker,
        })
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    ensure!(a.strides.iter().all(|&k| k > 1), "--strides: the dense render is stride 1; give strides above 1");
    let out_dir = a.out.dir()?;
    let mut session_args = a.session.clone();
    session_args.frames = Some(session_args.frames.unwrap_or(DEFAULT_FRAMES));
    eprintln!("ditto_parity: loading both engines and the inputs ...");
    let session = Session::open(&session_args)?;
    let Session { inputs: Inputs { backend, opts, audio, img, face, .. }, engines } = &session;
    let (width, (_, _, fw, fh)) = (img.width() as usize, face.as_usize());
    let dengines = DittoEngines::load(engines.profile, None)?;
    let avatar = ditto::prepare_avatar(&dengines, &Backend::Cpu, img, *face)?;
    let clip_opts = ditto::ClipOptions { steps: a.ditto_steps, ramp: opts.ramp, vad: opts.vad };
    let clip = ditto::prepare_clip(&dengines, &avatar, audio.clone(), None, &clip_opts, &|_| {})?;
    let n = clip.frames;
    let grid_frames: Vec<usize> = GRID_FRAMES.iter().copied().filter(|&f| f < n).collect();

    let render = |schedule: &KeyframeSchedule, infill: DittoInfill| -> Result<Captured> {
        let mut c = Captured::new(n);
        ditto::frames::render(
            &dengines,
            &avatar,
            &clip.kp_driving,
            &clip.distance,
            opts.ramp,
            schedule,
            infill,
            Method::Slerp,
            |i, f| {
                c.add(i, f, width, *face, &grid_frames);
                Ok(())
            },
            |_| {},
        )?;
        Ok(c)
    };
    eprintln!("ditto_parity: dense render ({n} frames)");
    let dense = render(&KeyframeSchedule::fixed_stride(n, 1)?, DittoInfill::Feature)?;
    let bypassed = cadence::schedules::keyframes::bypassed_frames(&clip.distance, opts.ramp);
    let ditto_vs = Compared {
        engine: "ditto",
        dense: &dense,
        dense_flicker: flicker(&dense.luma, fw, fh),
        bypassed: &bypassed,
        fw,
        fh,
    };

    let mut rows = Vec::new();
    let mut grid_rows: Vec<(String, Vec<Vec<u8>>)> = vec![("ditto dense".into(), dense.grid.clone())];
    for &k in &a.strides {
        let schedule = KeyframeSchedule::fixed_stride(n, k)?;
        for infill in [DittoInfill::Feature, DittoInfill::Image, DittoInfill::Motion] {
            eprintln!("ditto_parity: Ditto stride {k}, {} infill", infill.name());
            let r = render(&schedule, infill)?;
            rows.push(ditto_vs.row(k, infill.name(), &r)?);
            if infill == DittoInfill::Image || (infill == DittoInfill::Motion && k == 3) {
                grid_rows.push((format!("ditto stride {k} {}", infill.name()), r.grid));
            }
        }
    }

    // MuseTalk on the same clip: its latent infill (the source's) and its image infill (the
    // decoder on keyframes only) against its own dense render.
    let prepared = cadence::musetalk::render::prepare(engines, backend, audio.clone(), img, *face, opts)?;
    let mn = prepared.frames;
    let musetalk = |k: usize, infill: MuseTalkInfill| -> Result<Captured> {
        let mut c = Captured::new(mn);
        let o = cadence::frame_loop::RenderOptions { infill, ..opts.clone() };
        prepared.render_frames(
            engines,
            backend,
            &o,
            &KeyframeSchedule::fixed_stride(mn, k)?,
            |i, f| {
                c.add(i, f, width, *face, &grid_frames);
                Ok(())
            },
            |_| {},
        )?;
        Ok(c)
    };
    eprintln!("ditto_parity: MuseTalk dense render ({mn} frames)");
    let mdense = musetalk(1, MuseTalkInfill::Latent)?;
    let mdistance = cadence::schedules::keyframes::speech_distance(&prepared.speech);
    let mbypassed = cadence::schedules::keyframes::bypassed_frames(&mdistance, opts.ramp);
    let musetalk_vs = Compared {
        engine: "musetalk",
        dense: &mdense,
        dense_flicker: flicker(&mdense.luma, fw, fh),
        bypassed: &mbypassed,
        fw,
        fh,
    };
    grid_rows.push(("musetalk dense".into(), mdense.grid.clone()));
    for &k in &a.strides {
        for infill in [MuseTalkInfill::Latent, MuseTalkInfill::Image] {
            eprintln!("ditto_parity: MuseTalk stride {k}, {} infill", infill.name());
            let r = musetalk(k, infill)?;
            rows.push(musetalk_vs.row(k, infill.name(), &r)?);
            if infill == MuseTalkInfill::Image && k == 3 {
                grid_rows.push((format!("musetalk stride {k} {}", infill.name()), r.grid));
            }
        }
    }

    let mut prov = session.provenance();
    prov.note("ditto_engines", dengines.describe());
    prov.note("ditto_weights", dengines.weights.clone());
    prov.note("ditto_ddim_steps", a.ditto_steps.to_string());
    prov.note(
        "reference",
        "each stride is compared with its engine's dense render (stride 1) of the same clip (Ditto: and motion)",
    );
    prov.note("caveat", "synthetic weights: these numbers measure the method on this network, not a trained face");
    prov.note("metrics", "luma (NV12 Y) of the face box; flicker over rows 60-85% and columns 30-70% of the box");
    let grid_desc: Vec<String> = grid_rows.iter().map(|(name, _)| name.clone()).collect();
    prov.note("grid", format!("rows: {}; columns: frames {:?}", grid_desc.join(" | "), grid_frames));
    print_rows(&rows);
    let csv = out_dir.join("ditto_parity.csv");
    experiments::csvout::write_csv(&csv, &prov, &rows)?;
    let png = out_dir.join("ditto_parity_grid.png");
    write_grid(&png, &grid_rows, img.width() as usize, img.height() as usize, *face)?;
    eprintln!("wrote {}, {}", csv.display(), png.display());
    Ok(())
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:<10} {:<8} {:<8} {:>10} {:>14} {:>10} {:>10} {:>10}",
        "engine", "stride", "infill", "PSNR dB", "PSNR infill", "SSIM", "flicker", "dense"
    );
    for r in rows {
        println!(
            "{:<10} {:<8} {:<8} {:>10.2} {:>14.2} {:>10.4} {:>10.3} {:>10.3}",
            r.engine,
            r.stride,
            r.infill,
            r.psnr_db,
            r.psnr_infilled_db,
            r.ssim_infilled,
            r.flicker_mouth,
            r.flicker_mouth_dense
        );
    }
}

/// The face boxes of every row's frames side by side, halved (written through a temporary file
/// and renamed, like every output).
fn write_grid(
    path: &std::path::Path,
    rows: &[(String, Vec<Vec<u8>>)],
    w: usize,
    h: usize,
    face: FaceBox,
) -> Result<()> {
    let (fx, fy, fw, fh) = face.as_usize();
    let (cw, ch) = (fw / 2, fh / 2);
    let cols = rows.iter().map(|(_, f)| f.len()).max().unwrap_or(0);
    ensure!(cols > 0, "no frames for the grid");
    let mut grid = cadence_media::RgbImage::new((cols * cw) as u32, (rows.len() * ch) as u32);
    let mut rgb = Vec::new();
    for (ri, (_, frames)) in rows.iter().enumerate() {
        for (ci, nv12) in frames.iter().enumerate() {
            cadence_media::avatar_video::nv12_to_rgb(nv12, w, h, &mut rgb);
            for y in 0..ch {
                for x in 0..cw {
                    let mut acc = [0u32; 3];
                    for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                        let p = ((fy + 2 * y + dy) * w + fx + 2 * x + dx) * 3;
                        (0..3).for_each(|c| acc[c] += rgb[p + c] as u32);
                    }
                    let px = image::Rgb(acc.map(|v| (v / 4) as u8));
                    grid.put_pixel((ci * cw + x) as u32, (ri * ch + y) as u32, px);
                }
            }
        }
    }
    cadence::io::output::write_atomically(path, |f| {
        grid.write_to(f, image::ImageFormat::Png)?;
        Ok(())
    })
}
