//! `cadence models check DIR`: what cadence would load from a models folder, checked without
//! loading (headers, configurations and tensor shapes only).

use anyhow::{bail, Result};
use cadence::musetalk::{render_models, DecoderKind};
use cadence_engines::models_dir::ALL_MODELS;
use cadence_engines::{EngineCheck, ModelKind, ModelsDir, Profile};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Every engine cadence would load from DIR (MuseTalk's models/ folder as downloaded, plus
    /// TAESD's files): the file, its format, the configuration read, the architecture,
    /// parameter counts, and every tensor that is missing, misshaped or extra. Reads headers
    /// only. Exits non-zero when a requested engine cannot load.
    Check(CheckArgs),
}

#[derive(Args)]
struct CheckArgs {
    /// The models folder.
    dir: PathBuf,
    /// The engines `render --decoder` would load are the requested ones (whisper-tiny,
    /// musetalk-unet and the decoder with its image encoder).
    #[arg(long, value_enum, default_value = "taesd")]
    decoder: DecoderKind,
    /// Request these engines instead (repeatable): whisper-tiny, musetalk-unet, taesd-decoder,
    /// taesd-encoder, sd-vae-decoder, sd-vae-encoder.
    #[arg(long = "engine", value_parser = parse_model)]
    engines: Vec<ModelKind>,
    /// The architecture to check against: full (the published one, what real weights are) or
    /// cpu-reduced.
    #[arg(long, default_value = "full")]
    profile: String,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_model(s: &str) -> std::result::Result<ModelKind, String> {
    ALL_MODELS.iter().copied().find(|k| k.name() == s).ok_or_else(|| {
        let names: Vec<&str> = ALL_MODELS.iter().map(|k| k.name()).collect();
        format!("unknown engine '{s}' (one of {})", names.join(", "))
    })
}

pub fn run(a: ModelsArgs) -> Result<()> {
    match a.command {
        ModelsCommand::Check(c) => check(c),
    }
}

fn check(a: CheckArgs) -> Result<()> {
    let profile = Profile::parse(&a.profile)?;
    let dir = ModelsDir::open(&a.dir)?;
    let requested: Vec<ModelKind> = if a.engines.is_empty() { render_models(a.decoder).to_vec() } else { a.engines };
    let checks: Vec<(bool, EngineCheck)> =
        ALL_MODELS.iter().map(|&k| (requested.contains(&k), dir.check(k, profile))).collect();
    if a.json {
        let engines: Vec<serde_json::Value> = checks
            .iter()
            .map(|(req, c)| {
                let mut v = serde_json::to_value(c).unwrap_or_default();
                v["requested"] = serde_json::json!(req);
                v["loads"] = serde_json::json!(c.loads());
                v
            })
            .collect();
        let report = serde_json::json!({ "dir": a.dir, "profile": profile.to_string(), "engines": engines });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("models folder {} (checked against the {profile} architecture)", a.dir.display());
        for (req, c) in &checks {
            print_check(&a.dir, *req, c);
        }
    }
    let failed: Vec<&str> =
        checks.iter().filter(|(req, c)| *req && !c.loads()).map(|(_, c)| c.model.as_str()).collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} requested engines cannot load from {}: {}",
            failed.len(),
            requested.len(),
            a.dir.display(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// Groups of three digits, as the README writes parameter counts.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn list(what: &str, items: &[String]) {
    const SHOWN: usize = 8;
    if items.is_empty() {
        return;
    }
    let shown: Vec<&str> = items.iter().take(SHOWN).map(String::as_str).collect();
    let more = items.len().saturating_sub(SHOWN);
    let tail = if more > 0 { format!(" ... and {more} more (--json lists all)") } else { String::new() };
    println!("    {what} ({}): {}{tail}", items.len(), shown.join("; "));
}

fn rel(dir: &Path, p: &Path) -> String {
    p.strip_prefix(dir).unwrap_or(p).display().to_string()
}

fn print_check(dir: &Path, requested: bool, c: &EngineCheck) {
    let status = if c.loads() {
        "loads"
    } else if requested {
        "CANNOT LOAD"
    } else {
        "cannot load"
    };
    let file = c.file.as_deref().map(|p| rel(dir, p)).unwrap_or_else(|| "-".into());
    let req = if requested { "  [requested]" } else { "" };
    println!("{:<15} {status:<12} {file}{req}", c.model);
    for e in c.error.iter().chain(&c.config_error) {
        println!("    {e}");
    }
    if c.file.is_some() && c.format.is_some() {
        let config = match (&c.config, &c.config_error) {
            (Some(cfg), _) => {
                format!("config {} ({} fields checked)", rel(dir, Path::new(&cfg.source)), cfg.fields_checked)
            }
            (None, Some(_)) => "config refused (above)".into(),
            (None, None) => "no config (the tensor shapes decide)".into(),
        };
        println!("    {}; {config}", c.format.as_deref().unwrap_or("?"));
        println!(
            "    {}: {} parameters, {} of them in the file ({} tensors{})",
            c.architecture,
            thousands(c.params_expected),
            thousands(c.params_matched),
            c.tensors_in_file,
            if c.ignored > 0 { format!(", {} ignored on purpose", c.ignored) } else { String::new() }
        );
        list("missing", &c.missing);
        list("misshaped", &c.misshaped);
        list("not floating point", &c.not_float);
        list("extra, not used", &c.extra);
    }
}
