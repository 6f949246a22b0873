//! Progress bars for long runs (indicatif). Drawn on stderr, hidden when stderr is not a
//! terminal, so logs and CI output stay clean.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` steps with a prefix, elapsed time, ETA and the current step's message
/// (`bar.set_message(..)`). Finish it with `finish_and_clear()` or `finish_with_message(..)`.
pub fn progress_bar(len: u64, prefix: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(
        "{prefix:.bold} [{elapsed_precise}] {bar:32.cyan/blue} {pos}/{len} (eta {eta}) {wide_msg}",
    )
    .expect("static progress template is valid")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(prefix.to_string());
    bar
}
