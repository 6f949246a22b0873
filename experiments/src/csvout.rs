//! CSV with provenance: `# key: value` comment lines, then an ordinary header and rows
//! (csv + serde), written atomically (temporary file beside the target, then renamed).

use crate::provenance::Provenance;
use anyhow::{ensure, Context, Result};
use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// Writes `rows` to `path` with the provenance block first. The header comes from the row
/// type's field names. Refuses an empty `rows` (a CSV without a header says nothing).
/// Readers: pandas `read_csv(path, comment="#")`, csv's `ReaderBuilder::comment(Some(b'#'))`.
pub fn write_csv<R: Serialize>(path: &Path, provenance: &Provenance, rows: &[R]) -> Result<()> {
    ensure!(!rows.is_empty(), "no rows to write to {}", path.display());
    cadence::io::output::write_atomically(path, |w| {
        w.write_all(provenance.comment_block().as_bytes())?;
        let mut cw = csv::Writer::from_writer(&mut *w);
        for (i, r) in rows.iter().enumerate() {
            cw.serialize(r).with_context(|| format!("cannot serialize row {i} for {}", path.display()))?;
        }
        cw.flush()?;
        Ok(())
    })
    .with_context(|| format!("writing {}", path.display()))
}

/// The `# key: value` lines at the top of a CSV written by [`write_csv`], in order.
pub fn read_provenance(path: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|l| {
            let l = l.trim_start_matches('#').trim_start();
            l.split_once(": ").map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect())
}

/// The rows of a CSV written by [`write_csv`] (comment lines skipped).
pub fn read_rows<R: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<R>> {
    let mut rd = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .from_path(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    rd.deserialize()
        .enumerate()
        .map(|(i, r)| r.with_context(|| format!("{}: row {} is malformed", path.display(), i + 1)))
        .collect()
}
