//! Phoneme alignments: timed phoneme intervals, read from Praat TextGrids (long and short text
//! formats, as Praat and forced aligners such as the Montreal Forced Aligner write them) or from
//! a JSON list `[{"start": s, "end": s, "phoneme": "p"}, ...]`, or made by libespeak-ng
//! ([`super::espeak`]).
//!
//! An alignment is checked when it is made: every interval has finite times with
//! 0 <= start < end, and the intervals are sorted and do not overlap (gaps are allowed and are
//! silence). [`Alignment::check_duration`] refuses intervals past the end of the audio.

use super::classes::{self, PhonemeClass, DEFAULT_CLASS};
use anyhow::{bail, ensure, Context, Result};
use std::path::Path;

/// How far (seconds) an interval may end past the audio before it is an error: aligners write
/// times rounded to the millisecond, and a TextGrid's end is the audio's duration as its writer
/// measured it (rounded, or from a resampled copy). Half a 25 fps frame.
pub const END_TOLERANCE_S: f64 = 0.02;

/// One phoneme with its time span in seconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Phone {
    pub start: f64,
    pub end: f64,
    pub phoneme: String,
}

/// Sorted, non-overlapping phoneme intervals.
#[derive(Clone, Debug, PartialEq)]
pub struct Alignment {
    phones: Vec<Phone>,
}

/// Per-frame phoneme classes of an alignment, and the symbols the class table did not know.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameClasses {
    pub classes: Vec<PhonemeClass>,
    /// Unknown symbols (sorted, each once) with how many intervals carry them.
    pub unknown: Vec<(String, usize)>,
}

impl FrameClasses {
    /// The one warning for unknown symbols, or None when every symbol was known.
    pub fn warning(&self) -> Option<String> {
        if self.unknown.is_empty() {
            return None;
        }
        let list: Vec<String> = self.unknown.iter().map(|(s, n)| format!("'{s}' (x{n})")).collect();
        Some(format!(
            "{} phoneme symbol(s) not in the class table, given the default class {}: {}",
            self.unknown.len(),
            DEFAULT_CLASS,
            list.join(", ")
        ))
    }
}

impl Alignment {
    /// Checks and wraps intervals (see the module documentation).
    pub fn new(phones: Vec<Phone>) -> Result<Alignment> {
        for (i, p) in phones.iter().enumerate() {
            let n = i + 1;
            ensure!(
                p.start.is_finite() && p.end.is_finite(),
                "interval {n} ('{}'): the times {} .. {} are not finite numbers",
                p.phoneme,
                p.start,
                p.end
            );
            ensure!(p.start >= 0.0, "interval {n} ('{}') starts before 0 s ({} s)", p.phoneme, p.start);
            ensure!(
                p.end > p.start,
                "interval {n} ('{}') ends at {} s, not after its start {} s",
                p.phoneme,
                p.end,
                p.start
            );
        }
        for (i, w) in phones.windows(2).enumerate() {
            let (a, b) = (&w[0], &w[1]);
            if b.start < a.start {
                bail!(
                    "the intervals are not sorted: interval {} ('{}', {} s) starts before interval {} ('{}', {} s)",
                    i + 2,
                    b.phoneme,
                    b.start,
                    i + 1,
                    a.phoneme,
                    a.start
                );
            }
            // Exact comparison: adjacent intervals share their boundary time exactly as written.
            if b.start < a.end {
                bail!(
                    "intervals {} ('{}', {} .. {} s) and {} ('{}', {} .. {} s) overlap",
                    i + 1,
                    a.phoneme,
                    a.start,
                    a.end,
                    i + 2,
                    b.phoneme,
                    b.start,
                    b.end
                );
            }
        }
        Ok(Alignment { phones })
    }

    pub fn phones(&self) -> &[Phone] {
        &self.phones
    }

    /// End of the last interval (0 when empty).
    pub fn end(&self) -> f64 {
        self.phones.last().map_or(0.0, |p| p.end)
    }

    /// Refuses intervals that end more than [`END_TOLERANCE_S`] after `audio_s`.
    pub fn check_duration(&self, audio_s: f64) -> Result<()> {
        if let Some((i, p)) = self.phones.iter().enumerate().find(|(_, p)| p.end > audio_s + END_TOLERANCE_S) {
            bail!(
                "interval {} ('{}', {:.3} .. {:.3} s) lies past the end of the audio ({audio_s:.3} s)",
                i + 1,
                p.phoneme,
                p.start,
                p.end
            );
        }
        Ok(())
    }

    /// Reads a TextGrid or a JSON list (told apart by content: JSON starts with `[`).
    pub fn read(path: &Path) -> Result<Alignment> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse_bytes(&bytes).with_context(|| format!("{}", path.display()))
    }

    /// The bytes of a TextGrid (UTF-8 or UTF-16 as Praat writes it) or a JSON list: what
    /// [`read`](Self::read) parses, and the fuzzing entry point.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Alignment> {
        let text = decode_text(bytes)?;
        if text.trim_start().starts_with('[') {
            Self::from_json(&text)
        } else {
            Self::from_textgrid(&text)
        }
    }

    /// `[{"start": s, "end": s, "phoneme": "p"}, ...]` (other fields are ignored).
    pub fn from_json(text: &str) -> Result<Alignment> {
        let phones: Vec<Phone> =
            serde_json::from_str(text).context("not a JSON list of {\"start\", \"end\", \"phoneme\"} objects")?;
        Self::new(phones)
    }

    /// The JSON list form of this alignment.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.phones).expect("phones serialise")
    }

    /// The phone tier of a Praat TextGrid: the interval tier named `phones` (or `phone`,
    /// `phonemes`, `phoneme`; any case), else the only interval tier.
    pub fn from_textgrid(text: &str) -> Result<Alignment> {
        let tiers = parse_textgrid(text)?;
        let interval_tiers: Vec<&Tier> = tiers.iter().filter(|t| t.intervals).collect();
        const NAMES: [&str; 4] = ["phones", "phone", "phonemes", "phoneme"];
        let tier = match interval_tiers.iter().find(|t| NAMES.iter().any(|n| t.name.eq_ignore_ascii_case(n))) {
            Some(t) => *t,
            None if interval_tiers.len() == 1 => interval_tiers[0],
            None => {
                let names: Vec<String> = tiers.iter().map(|t| format!("'{}'", t.name)).collect();
                bail!(
                    "TextGrid has {} interval tiers ({}) and none is named 'phones': give a TextGrid with a 'phones' tier or a single interval tier",
                    interval_tiers.len(),
                    if names.is_empty() { "no tiers at all".to_string() } else { names.join(", ") }
                );
            }
        };
        Self::new(tier.items.clone()).with_context(|| format!("tier '{}'", tier.name))
    }

    /// The class of every interval, and the unknown symbols.
    pub fn interval_classes(&self) -> (Vec<PhonemeClass>, Vec<(String, usize)>) {
        let mut unknown: std::collections::BTreeMap<String, usize> = Default::default();
        let classes = self
            .phones
            .iter()
            .map(|p| {
                classes::classify(&p.phoneme).unwrap_or_else(|| {
                    *unknown.entry(p.phoneme.trim().to_string()).or_default() += 1;
                    DEFAULT_CLASS
                })
            })
            .collect();
        (classes, unknown.into_iter().collect())
    }

    /// The class of every video frame (frame f spans [f / fps, (f + 1) / fps)): the
    /// highest-priority class ([`PhonemeClass::ALL`] order) among the intervals that overlap the
    /// frame, so a frame that a closure touches is a closure frame. Frames no interval overlaps
    /// are silence.
    pub fn frame_classes(&self, n_frames: usize, fps: f64) -> FrameClasses {
        let (interval_class, unknown) = self.interval_classes();
        let mut classes = vec![PhonemeClass::Silence; n_frames];
        for (p, &c) in self.phones.iter().zip(&interval_class) {
            for f in frames_overlapping(p.start, p.end, fps, n_frames) {
                classes[f] = classes[f].min(c);
            }
        }
        FrameClasses { classes, unknown }
    }

    /// Frames where a closure starts (its onset) and the frame its release falls in (the
    /// interval's end), for the closure intervals; sorted, each once, below `n_frames`.
    pub fn closure_events(&self, n_frames: usize, fps: f64) -> Vec<usize> {
        let (classes, _) = self.interval_classes();
        let mut out: Vec<usize> = self
            .phones
            .iter()
            .zip(&classes)
            .filter(|(_, &c)| c == PhonemeClass::Closure)
            .flat_map(|(p, _)| [frame_at(p.start, fps), frame_at(p.end, fps)])
            .filter(|&f| f < n_frames)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The frame that contains time `t` (frame f spans [f / fps, (f + 1) / fps)).
pub fn frame_at(t: f64, fps: f64) -> usize {
    // The tolerance keeps a boundary written as 0.12 at 25 fps in frame 3, not 2 (0.12 * 25 is
    // 2.9999999999999996 in f64).
    (t * fps + 1e-9).floor().max(0.0) as usize
}

/// Frames whose span overlaps [start, end) by more than rounding.
fn frames_overlapping(start: f64, end: f64, fps: f64, n_frames: usize) -> std::ops::Range<usize> {
    let first = frame_at(start, fps);
    let last = ((end * fps - 1e-9).ceil().max(0.0) as usize).min(n_frames);
    first.min(n_frames)..last.max(first.min(n_frames))
}

/// Text of an alignment file: UTF-8 (with or without a byte-order mark), or UTF-16 with a
/// byte-order mark (older Praat versions write TextGrids with non-ASCII labels so).
fn decode_text(bytes: &[u8]) -> Result<String> {
    let utf16 = |be: bool| -> Result<String> {
        let body = &bytes[2..];
        ensure!(body.len().is_multiple_of(2), "UTF-16 text with an odd number of bytes");
        let units: Vec<u16> = body
            .chunks_exact(2)
            .map(|c| if be { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_le_bytes([c[0], c[1]]) })
            .collect();
        String::from_utf16(&units).map_err(|_| anyhow::anyhow!("invalid UTF-16 text"))
    };
    match bytes {
        [0xfe, 0xff, ..] => utf16(true),
        [0xff, 0xfe, ..] => utf16(false),
        [0xef, 0xbb, 0xbf, rest @ ..] => std::str::from_utf8(rest).map(str::to_string).context("invalid UTF-8 text"),
        _ => std::str::from_utf8(bytes).map(str::to_string).context("not UTF-8 or UTF-16 text"),
    }
}

// -------------------------------------------------------------------------------------------
// Praat TextGrid (text formats). Praat reads both the long ("xmin = 0") and the short format
// with one tokenizer: it looks for the next number, string or <flag> and skips anything else,
// including `[...]` groups (the "item [1]:" labels) and `!` comments to the end of the line.
// This reader does the same, so the two formats are one grammar:
//   "ooTextFile" "TextGrid" xmin xmax <exists> n_tiers
//   n_tiers x ( "IntervalTier" name xmin xmax n ( xmin xmax text )^n
//             | "TextTier"     name xmin xmax n ( time mark )^n )
// -------------------------------------------------------------------------------------------

struct Tier {
    name: String,
    intervals: bool,
    items: Vec<Phone>,
}

#[derive(Debug, PartialEq)]
enum Token {
    Number(f64),
    Str(String),
    Flag(String),
}

struct Tokens<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Self {
        Tokens { chars: text.chars().peekable(), line: 1 }
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next();
        if c == Some('\n') {
            self.line += 1;
        }
        c
    }

    fn next(&mut self) -> Result<Option<Token>> {
        loop {
            let Some(&c) = self.chars.peek() else { return Ok(None) };
            match c {
                '!' => {
                    while let Some(c) = self.bump() {
                        if c == '\n' {
                            break;
                        }
                    }
                }
                '[' => {
                    let line = self.line;
                    loop {
                        match self.bump() {
                            Some(']') => break,
                            Some(_) => {}
                            None => bail!("line {line}: '[' without a closing ']'"),
                        }
                    }
                }
                '"' => {
                    let line = self.line;
                    self.bump();
                    let mut s = String::new();
                    loop {
                        match self.bump() {
                            // A doubled quote is a quote inside the string.
                            Some('"') if self.chars.peek() == Some(&'"') => {
                                self.bump();
                                s.push('"');
                            }
                            Some('"') => break,
                            Some(c) => s.push(c),
                            None => bail!("line {line}: a string is not closed (missing '\"')"),
                        }
                    }
                    return Ok(Some(Token::Str(s)));
                }
                '<' => {
                    let line = self.line;
                    self.bump();
                    let mut s = String::new();
                    loop {
                        match self.bump() {
                            Some('>') => break,
                            Some(c) if !c.is_whitespace() => s.push(c),
                            _ => bail!("line {line}: a <flag> is not closed (missing '>')"),
                        }
                    }
                    return Ok(Some(Token::Flag(s)));
                }
                c if c.is_ascii_digit() || c == '-' || c == '+' || c == '.' => {
                    let line = self.line;
                    let mut s = String::new();
                    while let Some(&c) = self.chars.peek() {
                        if c.is_whitespace() {
                            break;
                        }
                        s.push(c);
                        self.bump();
                    }
                    let v: f64 = s.parse().map_err(|_| anyhow::anyhow!("line {line}: '{s}' is not a number"))?;
                    return Ok(Some(Token::Number(v)));
                }
                _ => {
                    self.bump();
                }
            }
        }
    }

    fn number(&mut self, what: &str) -> Result<f64> {
        let line = self.line;
        match self.next()? {
            Some(Token::Number(v)) => Ok(v),
            Some(t) => bail!("line {line}: expected a number ({what}), found {}", describe(&t)),
            None => bail!("the file ends early, while looking for {what}"),
        }
    }

    fn count(&mut self, what: &str) -> Result<usize> {
        let v = self.number(what)?;
        ensure!(v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64, "{what} must be a whole number (got {v})");
        Ok(v as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let line = self.line;
        match self.next()? {
            Some(Token::Str(s)) => Ok(s),
            Some(t) => bail!("line {line}: expected a quoted string ({what}), found {}", describe(&t)),
            None => bail!("the file ends early, while looking for {what}"),
        }
    }
}

fn describe(t: &Token) -> String {
    match t {
        Token::Number(v) => format!("the number {v}"),
        Token::Str(s) => format!("the string \"{s}\""),
        Token::Flag(s) => format!("<{s}>"),
    }
}

fn parse_textgrid(text: &str) -> Result<Vec<Tier>> {
    let mut t = Tokens::new(text);
    let file_type = t.string("the file type").context("not a Praat TextGrid")?;
    ensure!(
        file_type == "ooTextFile" || file_type == "ooTextFile short",
        "not a Praat text file (file type \"{file_type}\", expected \"ooTextFile\")"
    );
    let class = t.string("the object class")?;
    ensure!(class == "TextGrid", "a Praat {class}, not a TextGrid");
    let xmin = t.number("the TextGrid's xmin")?;
    let xmax = t.number("the TextGrid's xmax")?;
    ensure!(xmin.is_finite() && xmax.is_finite() && xmax >= xmin, "the TextGrid spans {xmin} .. {xmax} s");
    let line = t.line;
    let n_tiers = match t.next()? {
        Some(Token::Flag(f)) if f == "exists" => t.count("the number of tiers")?,
        Some(Token::Flag(f)) if f == "absent" => 0,
        Some(other) => bail!("line {line}: expected <exists> or <absent>, found {}", describe(&other)),
        None => bail!("the file ends before its tiers"),
    };
    let mut tiers = Vec::new();
    for k in 1..=n_tiers {
        let kind = t.string(&format!("the class of tier {k}"))?;
        let intervals = match kind.as_str() {
            "IntervalTier" => true,
            "TextTier" => false,
            other => bail!("tier {k} is a \"{other}\" (expected \"IntervalTier\" or \"TextTier\")"),
        };
        let name = t.string(&format!("the name of tier {k}"))?;
        let _ = t.number(&format!("tier {k}'s xmin"))?;
        let _ = t.number(&format!("tier {k}'s xmax"))?;
        let n = t.count(&format!("the size of tier {k}"))?;
        // Grown as items are read, never pre-sized from the file's own count.
        let mut items = Vec::new();
        for i in 1..=n {
            let ctx = || format!("tier '{name}', item {i}");
            if intervals {
                let start = t.number("an interval's xmin").with_context(ctx)?;
                let end = t.number("an interval's xmax").with_context(ctx)?;
                let phoneme = t.string("an interval's text").with_context(ctx)?;
                items.push(Phone { start, end, phoneme });
            } else {
                let time = t.number("a point's time").with_context(ctx)?;
                let phoneme = t.string("a point's mark").with_context(ctx)?;
                items.push(Phone { start: time, end: time, phoneme });
            }
        }
        tiers.push(Tier { name, intervals, items });
    }
    if let Some(extra) = t.next()? {
        bail!("line {}: unexpected {} after the last tier", t.line, describe(&extra));
    }
    Ok(tiers)
}
