//! The source's cross-architecture table (section 4.2): render frames/s per stride for every
//! engine family the project has. MuseTalk comes from results/stride_table.csv (run
//! `stride_table` first); Ditto has no engine in this project yet, and the table says so
//! instead of inventing a number.

use anyhow::{Context, Result};
use clap::Parser;
use experiments::csvout::{read_provenance, read_rows, write_csv};
use experiments::provenance::Provenance;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    about = "Cross-architecture stride scaling table (MuseTalk measured; Ditto marked missing until its engine exists)"
)]
struct Args {
    /// The stride table to read (default: results/stride_table.csv).
    #[arg(long)]
    stride_table: Option<PathBuf>,
    #[command(flatten)]
    out: experiments::OutDir,
}

#[derive(serde::Deserialize)]
struct StrideRow {
    stride: usize,
    neural_fps: f64,
    neural_rtf: f64,
    end_to_end_fps: f64,
    end_to_end_rtf: f64,
}

#[derive(serde::Serialize)]
struct Row {
    stride: usize,
    musetalk_neural_fps: f64,
    musetalk_neural_rtf: f64,
    musetalk_end_to_end_fps: f64,
    musetalk_end_to_end_rtf: f64,
    ditto: String,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let results = experiments::paths::results_dir()?;
    let src = a.stride_table.unwrap_or_else(|| results.join("stride_table.csv"));
    let rows: Vec<StrideRow> = read_rows(&src).with_context(|| {
        format!("{} is needed: run `cargo run --release -p experiments --bin stride_table` first", src.display())
    })?;
    let src_prov = read_provenance(&src)?;
    let get =
        |k: &str| src_prov.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap_or_else(|| "unknown".into());
    let mut prov = Provenance::gather(get("backend"), get("engine_profile"), get("weights"));
    prov.note("source", format!("{} (commit {}, {})", src.display(), get("commit"), get("date_utc")));
    prov.note("source_hardware", get("hardware"));
    // Where the source's engines ran ("unknown" for a stride table written before --device).
    prov.note(experiments::provenance::ENGINE_DEVICE_KEY, get(experiments::provenance::ENGINE_DEVICE_KEY));
    let out: Vec<Row> = rows
        .iter()
        .map(|r| Row {
            stride: r.stride,
            musetalk_neural_fps: r.neural_fps,
            musetalk_neural_rtf: r.neural_rtf,
            musetalk_end_to_end_fps: r.end_to_end_fps,
            musetalk_end_to_end_rtf: r.end_to_end_rtf,
            ditto: "missing: no Ditto engine in cadence yet".into(),
        })
        .collect();
    println!(
        "CROSS-ARCHITECTURE STRIDE SCALING (render FPS), measured on: {} (engines on {})",
        get("hardware"),
        get(experiments::provenance::ENGINE_DEVICE_KEY)
    );
    println!("{:<10} {:>34} {:>34}", "stride", "MuseTalk (neural / end to end)", "Ditto");
    for r in &out {
        println!(
            "{:<10} {:>34} {:>34}",
            r.stride,
            format!(
                "{:.1} FPS ({:.2}x RT) / {:.1} FPS",
                r.musetalk_neural_fps, r.musetalk_neural_rtf, r.musetalk_end_to_end_fps
            ),
            "missing (no engine)"
        );
    }
    let dir = a.out.dir()?;
    let path = dir.join("cross_arch.csv");
    write_csv(&path, &prov, &out)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
