//! Is the reduced profile a scale model of the full one? Each engine's share of a frame's neural
//! time (the audio encoder's cost per frame, one UNet evaluation, one decode) at the full and at
//! the cpu-reduced profile, measured on this machine in the same run, in alternating rounds so
//! that a VM's drift falls on both profiles alike. A share passes when it is within
//! `--tolerance` (15%) of the full profile's share. Each scale arm (`cadence_engines::ScaleArm`)
//! has its own reduced widths and its own file: results/profile_shares.csv (AVX-512),
//! results/profile_shares_fma.csv (FMA).

use anyhow::{ensure, Result};
use cadence_engines::bench::{bench_audio, bench_decoder, bench_keyframe};
use cadence_engines::{
    select_device, DeviceRequest, MuseTalkUnet, Profile, ScaleArm, SdVae, Taesd, WeightsSource, WhisperAudio,
    DEFAULT_SEED,
};
use clap::Parser;
use experiments::csvout::write_csv;
use experiments::provenance::{load_average, Provenance};

#[derive(Parser)]
#[command(about = "Each engine's share of a frame's neural time (whisper, one UNet evaluation, one TAESD or SD VAE \
             decode) at the full and the cpu-reduced profile, measured in alternating rounds on this machine, \
             and whether the reduced profile keeps every share within the tolerance; writes \
             results/profile_shares.csv on machines where gemm runs its AVX-512 kernel, \
             results/profile_shares_fma.csv where it runs its FMA kernel (each has its own reduced widths). The full profile takes about a minute a round on 2 cores.")]
struct Args {
    /// Rounds; each round times every engine of both profiles once, and each engine's median
    /// round is kept.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Timed calls per engine in a round (after one warm-up call), their median kept.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// Relative tolerance of a share: |reduced / full - 1| at most this.
    #[arg(long, default_value_t = 0.15)]
    tolerance: f64,
    #[command(flatten)]
    out: experiments::OutDir,
}

/// A frame's neural cost by engine, in ms.
#[derive(Clone, Copy, Debug, Default)]
struct FrameCost {
    audio: f64,
    unet: f64,
    taesd: f64,
    sd_vae: f64,
}

#[derive(serde::Serialize, Debug)]
struct Row {
    decoder: String,
    engine: String,
    full_ms_per_frame: f64,
    reduced_ms_per_frame: f64,
    full_share_pct: f64,
    reduced_share_pct: f64,
    /// reduced share / full share.
    share_ratio: f64,
    within_tolerance: bool,
}

/// The rows of one decoder's frame: (engine, full ms, reduced ms) of the audio encoder, the UNet
/// and the decoder, each share of their sum, and the check.
fn rows(decoder: &str, parts: [(&str, f64, f64); 3], tolerance: f64) -> Vec<Row> {
    let full: f64 = parts.iter().map(|p| p.1).sum();
    let reduced: f64 = parts.iter().map(|p| p.2).sum();
    parts
        .iter()
        .map(|&(engine, f, r)| {
            let (fs, rs) = (100.0 * f / full, 100.0 * r / reduced);
            Row {
                decoder: decoder.to_string(),
                engine: engine.to_string(),
                full_ms_per_frame: f,
                reduced_ms_per_frame: r,
                full_share_pct: fs,
                reduced_share_pct: rs,
                share_ratio: rs / fs,
                within_tolerance: (rs / fs - 1.0).abs() <= tolerance,
            }
        })
        .collect()
}

fn table(full: FrameCost, reduced: FrameCost, tolerance: f64) -> Vec<Row> {
    let mut out = Vec::new();
    for (decoder, f, r) in [("taesd", full.taesd, reduced.taesd), ("sd-vae", full.sd_vae, reduced.sd_vae)] {
        let parts = [
            ("whisper-tiny", full.audio, reduced.audio),
            ("musetalk-unet", full.unet, reduced.unet),
            (if decoder == "taesd" { "taesd-decoder" } else { "sd-vae-decoder" }, f, r),
        ];
        out.extend(rows(decoder, parts, tolerance));
    }
    out
}

/// One profile's engines, loaded once.
struct Engines {
    whisper: WhisperAudio,
    unet: MuseTalkUnet,
    taesd: Taesd,
    sd_vae: SdVae,
}

impl Engines {
    fn load(profile: Profile) -> Result<Engines> {
        let dev = select_device(DeviceRequest::Cpu)?.device;
        let w = WeightsSource::Synthetic { seed: DEFAULT_SEED };
        Ok(Engines {
            whisper: WhisperAudio::new(profile, &w, &dev)?,
            unet: MuseTalkUnet::new(profile, &w, &dev)?,
            taesd: Taesd::decoder(profile, &w, &dev)?,
            sd_vae: SdVae::decoder(profile, &w, &dev)?,
        })
    }

    /// One round: ms per frame of each engine (UNet and TAESD at batch 8, as the render calls
    /// them; SD VAE at 2; whisper over 25.6 s of audio at 25 fps).
    fn round(&self, runs: usize) -> Result<FrameCost> {
        let per_frame = |r: cadence_engines::bench::BenchResult| 1e3 / r.frames_per_s;
        Ok(FrameCost {
            audio: per_frame(bench_audio(&self.whisper, 25.6, runs)?),
            unet: per_frame(bench_keyframe(&self.unet, 8, runs)?),
            taesd: per_frame(bench_decoder(&self.taesd, 8, runs)?),
            sd_vae: per_frame(bench_decoder(&self.sd_vae, 2, runs)?),
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each engine's median over the rounds.
fn medians(rounds: &[FrameCost]) -> FrameCost {
    let m = |f: fn(&FrameCost) -> f64| median(rounds.iter().map(f).collect());
    FrameCost { audio: m(|c| c.audio), unet: m(|c| c.unet), taesd: m(|c| c.taesd), sd_vae: m(|c| c.sd_vae) }
}

fn main() -> Result<()> {
    let a = Args::parse();
    cadence_engines::isa::check_env()?;
    ensure!(a.runs > 0, "--runs must be positive");
    ensure!(a.tolerance > 0.0, "--tolerance must be positive");
    let out_dir = a.out.dir()?;
    let load_start = load_average();
    let t0 = std::time::Instant::now();
    eprintln!("loading both profiles' engines (synthetic weights)");
    let profiles = [Profile::Full, Profile::Cpu];
    let engines = profiles.map(Engines::load);
    let [full_engines, reduced_engines] = engines;
    let (full_engines, reduced_engines) = (full_engines?, reduced_engines?);
    let (mut full, mut reduced) = (Vec::new(), Vec::new());
    for round in 0..a.rounds {
        // Alternate which profile goes first, so neither always follows the other.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (e, into) = if i == 0 { (&full_engines, &mut full) } else { (&reduced_engines, &mut reduced) };
            let c = e.round(a.runs)?;
            eprintln!(
                "round {} {:<11} whisper {:.4} ms, unet {:.2} ms, taesd {:.2} ms, sd-vae {:.2} ms per frame",
                round + 1,
                profiles[i].to_string(),
                c.audio,
                c.unet,
                c.taesd,
                c.sd_vae
            );
            into.push(c);
        }
    }
    let rows = table(medians(&full), medians(&reduced), a.tolerance);
    println!("decoder  engine            full share  reduced share  ratio  within ±{:.0}%", 100.0 * a.tolerance);
    for r in &rows {
        println!(
            "{:<8} {:<16} {:>10.3}% {:>13.3}% {:>6.2}  {}",
            r.decoder,
            r.engine,
            r.full_share_pct,
            r.reduced_share_pct,
            r.share_ratio,
            if r.within_tolerance { "yes" } else { "NO" }
        );
    }

    let mut prov = Provenance::gather(
        format!("cpu ({} threads)", rayon::current_num_threads()),
        "full and cpu-reduced",
        format!("synthetic(seed={DEFAULT_SEED})"),
    );
    prov.note("cpu_loops", cadence_engines::isa::describe());
    prov.note("widths_full", Profile::Full.widths());
    prov.note("scale_arm", ScaleArm::current().name());
    prov.note("widths_cpu_reduced", Profile::Cpu.widths());
    prov.note(
        "method",
        format!(
            "{} rounds, the profiles in alternating order; per round and engine the median of {} timed calls after \
             a warm-up; per engine the median round. ms per frame: UNet and TAESD at batch 8, SD VAE at 2, whisper \
             over 25.6 s of audio (640 frames at 25 fps). A share is of the frame's audio + UNet + decoder time \
             (one UNet evaluation per frame: the dense render); tolerance ±{:.0}% of the full profile's share",
            a.rounds,
            a.runs,
            100.0 * a.tolerance
        ),
    );
    prov.note("load_average", format!("{load_start} at start, {} at end (1/5/15 min)", load_average()));
    prov.note("runtime", format!("{:.0} s", t0.elapsed().as_secs_f64()));
    let path = out_dir.join(experiments::paths::profile_shares_file(ScaleArm::current()));
    write_csv(&path, &prov, &rows)?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_of_the_frames_sum_and_checked_relative_to_full() {
        let full = FrameCost { audio: 1.0, unet: 80.0, taesd: 19.0, sd_vae: 99.0 };
        let reduced = FrameCost { audio: 0.1, unet: 8.0, taesd: 1.9, sd_vae: 14.0 };
        let t = table(full, reduced, 0.15);
        assert_eq!(t.len(), 6);
        // taesd: identical proportions -> ratio 1 everywhere.
        for r in &t[..3] {
            assert!((r.share_ratio - 1.0).abs() < 1e-12, "{r:?}");
            assert!(r.within_tolerance);
        }
        assert!((t[1].full_share_pct - 80.0).abs() < 1e-12);
        // sd-vae: full 1/180, 80/180, 99/180; reduced 0.1/22.1, 8/22.1, 14/22.1.
        let vae = &t[5];
        assert!((vae.full_share_pct - 55.0).abs() < 1e-12);
        assert!((vae.reduced_share_pct - 100.0 * 14.0 / 22.1).abs() < 1e-9);
        assert!((vae.share_ratio - (14.0 / 22.1) / 0.55).abs() < 1e-9);
        assert!(!vae.within_tolerance, "1.15x the full share is outside ±15%");
        assert!(!t[4].within_tolerance, "the UNet's 0.81x is outside too: {:?}", t[4]);
        // Within the tolerance at its edge (1.1x), not only at 1.
        let t = table(full, FrameCost { audio: 1.0, unet: 80.0, taesd: 21.0, sd_vae: 99.0 }, 0.15);
        assert!((t[2].share_ratio - (21.0 / 102.0) / 0.19).abs() < 1e-9);
        assert!(t.iter().all(|r| r.within_tolerance), "{t:?}");
    }
}
