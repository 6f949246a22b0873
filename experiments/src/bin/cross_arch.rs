//! The source's cross-architecture table (section 4.2): render frames/s per stride for both
//! engine families. MuseTalk comes from results/stride_table.csv (`stride_table`), Ditto from
//! results/stride_table_ditto.csv (`stride_table --engine ditto`, one row per stride and infill);
//! a missing file leaves its column saying how to make it, never an invented number.

use anyhow::{Context, Result};
use clap::Parser;
use experiments::csvout::{read_provenance, read_rows, write_csv};
use experiments::provenance::Provenance;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(about = "Cross-architecture stride scaling table (MuseTalk and Ditto, from their stride tables)")]
struct Args {
    /// MuseTalk's stride table (default: results/stride_table.csv).
    #[arg(long)]
    stride_table: Option<PathBuf>,
    /// Ditto's stride table (default: results/stride_table_ditto.csv).
    #[arg(long)]
    ditto_table: Option<PathBuf>,
    #[command(flatten)]
    out: experiments::OutDir,
}

#[derive(serde::Deserialize)]
struct StrideRow {
    stride: usize,
    #[serde(default)]
    infill: String,
    neural_fps: f64,
    neural_rtf: f64,
    end_to_end_fps: f64,
    end_to_end_rtf: f64,
}

/// Ditto's infills, in the order of the columns.
const INFILLS: [&str; 3] = ["feature", "image", "motion"];

#[derive(serde::Serialize)]
struct Row {
    stride: usize,
    musetalk_neural_fps: f64,
    musetalk_neural_rtf: f64,
    musetalk_end_to_end_fps: f64,
    musetalk_end_to_end_rtf: f64,
    /// MuseTalk with `--infill image` (the decoder on keyframes only), where the stride table
    /// measured it; empty at stride 1 (no frames between keyframes).
    musetalk_image_end_to_end_fps: String,
    ditto_feature_end_to_end_fps: String,
    ditto_image_end_to_end_fps: String,
    ditto_motion_end_to_end_fps: String,
    ditto_feature_speedup: String,
    ditto_image_speedup: String,
    ditto_motion_speedup: String,
}

/// A provenance value of `path`'s header ("unknown" when absent).
fn getter(prov: &[(String, String)]) -> impl Fn(&str) -> String + '_ {
    |k: &str| prov.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap_or_else(|| "unknown".into())
}

fn main() -> Result<()> {
    let a = Args::parse();
    let results = experiments::paths::results_dir()?;
    let src = a.stride_table.unwrap_or_else(|| results.join("stride_table.csv"));
    let rows: Vec<StrideRow> = read_rows(&src).with_context(|| {
        format!("{} is needed: run `cargo run --release -p experiments --bin stride_table` first", src.display())
    })?;
    let src_prov = read_provenance(&src)?;
    let get = getter(&src_prov);
    let mut prov = Provenance::gather(get("backend"), get("engine_profile"), get("weights"));
    prov.note("source", format!("{} (commit {}, {})", src.display(), get("commit"), get("date_utc")));
    prov.note("source_hardware", get("hardware"));
    // Where the source's engines ran ("unknown" for a stride table written before --device).
    prov.note(experiments::provenance::ENGINE_DEVICE_KEY, get(experiments::provenance::ENGINE_DEVICE_KEY));

    let ditto_src = a.ditto_table.unwrap_or_else(|| results.join("stride_table_ditto.csv"));
    let ditto = read_ditto(&ditto_src, &mut prov)?;
    // Ditto's end-to-end frames/s at stride k with an infill (stride 1: the dense render).
    let ditto_fps = |k: usize, infill: &str| -> Option<f64> {
        let rows = ditto.as_ref()?;
        rows.iter().find(|r| r.stride == k && (k == 1 || r.infill == infill)).map(|r| r.end_to_end_fps)
    };
    let missing =
        || "missing: run `cargo run --release -p experiments --bin stride_table -- --engine ditto`".to_string();
    let cell = |k: usize, i: usize| ditto_fps(k, INFILLS[i]).map_or_else(missing, |v| format!("{v:.2}"));
    let speedup = |k: usize, i: usize| match (ditto_fps(k, INFILLS[i]), ditto_fps(1, "")) {
        (Some(v), Some(dense)) => format!("{:.2}", v / dense),
        _ => missing(),
    };
    // MuseTalk's image-infill rows go in a column of their own, beside the latent row of their stride.
    let musetalk_image = |k: usize| -> String {
        let image = rows.iter().find(|r| r.stride == k && k > 1 && r.infill == "image");
        image.map_or_else(String::new, |r| format!("{:.2}", r.end_to_end_fps))
    };
    let out: Vec<Row> = rows
        .iter()
        .filter(|r| r.infill != "image")
        .map(|r| Row {
            stride: r.stride,
            musetalk_neural_fps: r.neural_fps,
            musetalk_neural_rtf: r.neural_rtf,
            musetalk_end_to_end_fps: r.end_to_end_fps,
            musetalk_end_to_end_rtf: r.end_to_end_rtf,
            musetalk_image_end_to_end_fps: musetalk_image(r.stride),
            ditto_feature_end_to_end_fps: cell(r.stride, 0),
            ditto_image_end_to_end_fps: cell(r.stride, 1),
            ditto_motion_end_to_end_fps: cell(r.stride, 2),
            ditto_feature_speedup: speedup(r.stride, 0),
            ditto_image_speedup: speedup(r.stride, 1),
            ditto_motion_speedup: speedup(r.stride, 2),
        })
        .collect();
    println!(
        "CROSS-ARCHITECTURE STRIDE SCALING (end-to-end render FPS), measured on: {} (engines on {})",
        get("hardware"),
        get(experiments::provenance::ENGINE_DEVICE_KEY)
    );
    println!(
        "{:<8} {:>18} {:>18} {:>22} {:>22} {:>22}",
        "stride", "MuseTalk", "MuseTalk image", "Ditto feature", "Ditto image", "Ditto motion"
    );
    for r in &out {
        let d = |fps: &str, x: &str| {
            if fps.starts_with("missing") {
                "missing".to_string()
            } else {
                format!("{fps} FPS ({x}x)")
            }
        };
        println!(
            "{:<8} {:>18} {:>18} {:>22} {:>22} {:>22}",
            r.stride,
            format!("{:.1} FPS", r.musetalk_end_to_end_fps),
            if r.musetalk_image_end_to_end_fps.is_empty() {
                "-".to_string()
            } else {
                format!("{} FPS", r.musetalk_image_end_to_end_fps)
            },
            d(&r.ditto_feature_end_to_end_fps, &r.ditto_feature_speedup),
            d(&r.ditto_image_end_to_end_fps, &r.ditto_image_speedup),
            d(&r.ditto_motion_end_to_end_fps, &r.ditto_motion_speedup),
        );
    }
    let dir = a.out.dir()?;
    let path = dir.join("cross_arch.csv");
    write_csv(&path, &prov, &out)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Ditto's stride table, when it exists (its provenance is noted in `prov`).
fn read_ditto(path: &Path, prov: &mut Provenance) -> Result<Option<Vec<StrideRow>>> {
    if !path.exists() {
        prov.note("ditto_source", "missing (stride_table --engine ditto not run)");
        return Ok(None);
    }
    let rows: Vec<StrideRow> = read_rows(path)?;
    let p = read_provenance(path)?;
    let get = getter(&p);
    prov.note("ditto_source", format!("{} (commit {}, {})", path.display(), get("commit"), get("date_utc")));
    prov.note("ditto_hardware", get("hardware"));
    prov.note("ditto_profile", get("engine_profile"));
    prov.note("ditto_weights", get("weights"));
    Ok(Some(rows))
}
