#!/usr/bin/env bash
# The test command (README and .ci/run run exactly this): every test of the workspace, then the
# tests that could check nothing on this machine and why (CUDA without a GPU, AVX without the
# CPU feature), counted, so a skip never passes unseen. Extra arguments go to `cargo test`.
# Needs nothing installed by hand: speech comes from committed fixtures, MP4s are decoded
# in-process; the groups that need system tools are separate (docs/tests.md).
set -euo pipefail
cd "$(dirname "$0")/.."
skips="${CARGO_TARGET_DIR:-target}/tmp/skipped-tests.txt"
rm -f "$skips"
cargo test --workspace --release "$@"
if [ -s "$skips" ]; then
    echo "== $(wc -l < "$skips") test(s) skipped here (they passed without checking anything on this machine):"
    sort "$skips" | sed 's/^/   /'
else
    echo "== no test skipped"
fi
