//! Fuzzes every parser of untrusted bytes for `CADENCE_FUZZ_SECONDS` seconds each (default 2;
//! CI runs longer), after replaying the committed corpus and crash regressions. One test, so the
//! allocation tracking sees one parser at a time.

use cadence_fuzz::{fuzz, TrackingAlloc, TARGETS};
use std::path::Path;
use std::time::Duration;

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

#[test]
fn every_parser_survives_mutated_input() {
    let secs: f64 = std::env::var("CADENCE_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let seed: u64 = std::env::var("CADENCE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crashes = root.join("../target/fuzz-crashes");
    // The parsers' own panics are what is being looked for: keep the report short.
    std::panic::set_hook(Box::new(|_| {}));
    let mut failures = Vec::new();
    for t in TARGETS {
        match fuzz(t, root, &crashes, Duration::from_secs_f64(secs), seed) {
            Ok(s) => {
                println!(
                    "{}: {} seeds, {} regressions, {} executions ({} accepted) in {secs} s",
                    t.name, s.seeds, s.regressions, s.executions, s.accepted
                );
                assert!(s.seeds > 0, "{}: the corpus is empty (run make_corpus)", t.name);
                assert_eq!(
                    s.seeds_accepted, s.seeds,
                    "{}: a seed of the corpus is refused: the seeds must be valid inputs that reach the whole parser",
                    t.name
                );
            }
            Err(c) => failures.push(c.to_string()),
        }
    }
    let _ = std::panic::take_hook();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
