#!/usr/bin/env bash
# The main job (`stride_table`, cpu-reduced, embedded defaults) at this checkout against an older
# commit on the same machine, in one run: the old commit is built into a target directory of its
# own (a git worktree), then the two binaries run in turns, ROUNDS times each, and the medians of
# their end-to-end times per stride go to results/stride_table_vs_<old>.csv with provenance.
#
# Usage: scripts/stride_table_vs.sh [OLD_COMMIT (default 4cde38d)] [ROUNDS (default 2)]
# Environment: OLD_WORKTREE, OLD_TARGET (defaults under $TMPDIR) to reuse an earlier build.
# CAP_ISA=avx2 runs what an AVX2-only machine runs, on this one: this checkout is built in a
# worktree of its own with the `gemm` crate's AVX-512 kernels left out (cadence-engines'
# default `gemm-avx512` feature removed; `gemm` picks its kernel itself, so no variable can cap it),
# both sides run with CADENCE_MAX_ISA=avx2 (cadence's own loops), and the table goes to
# results/stride_table_vs_<old>_avx2.csv. The old commit must predate cadence's AVX-512 arms.
set -euo pipefail
old=${1:-4cde38d}
rounds=${2:-2}
root=$(git rev-parse --show-toplevel)
old_full=$(git -C "$root" rev-parse --verify "$old^{commit}")
old_short=$(git -C "$root" rev-parse --short "$old_full")
wt=${OLD_WORKTREE:-${TMPDIR:-/tmp}/cadence-$old_short}
tgt=${OLD_TARGET:-$wt-target}
if [ ! -d "$wt" ]; then
  git -C "$root" worktree add --detach "$wt" "$old_full"
fi
[ "$(git -C "$wt" rev-parse HEAD)" = "$old_full" ] || { echo "$wt is not at $old_short" >&2; exit 1; }
echo "building $old_short in $tgt ..." >&2
CARGO_TARGET_DIR=$tgt cargo build --release --manifest-path "$wt/Cargo.toml" -p experiments --bin stride_table
cap=${CAP_ISA:-}
new_bin=$root/target/release/stride_table
suffix=
if [ -n "$cap" ]; then
  [ "$cap" = avx2 ] || { echo "CAP_ISA: only avx2 is supported (got $cap)" >&2; exit 1; }
  ! git -C "$wt" grep -q x86-v4 -- engines/Cargo.toml || { echo "$old_short has gemm's AVX-512 kernels: not an AVX2 baseline" >&2; exit 1; }
  head=$(git -C "$root" rev-parse HEAD)
  new_wt=${TMPDIR:-/tmp}/cadence-$(git -C "$root" rev-parse --short HEAD)-avx2
  [ -d "$new_wt" ] || git -C "$root" worktree add --detach "$new_wt" "$head"
  [ "$(git -C "$new_wt" rev-parse HEAD)" = "$head" ] || { echo "$new_wt is not at HEAD" >&2; exit 1; }
  sed -i 's/^default = \["gemm-avx512"\]$/default = []/' "$new_wt/engines/Cargo.toml"
  grep -q '^default = \[\]$' "$new_wt/engines/Cargo.toml" || { echo "could not remove the gemm-avx512 feature" >&2; exit 1; }
  echo "building this commit without gemm's AVX-512 kernels in $new_wt-target ..." >&2
  CARGO_TARGET_DIR=$new_wt-target cargo build --release --manifest-path "$new_wt/Cargo.toml" -p experiments --bin stride_table
  new_bin=$new_wt-target/release/stride_table
  suffix=_$cap
  export CADENCE_MAX_ISA=$cap
else
  echo "building this checkout ..." >&2
  cargo build --release --manifest-path "$root/Cargo.toml" --workspace --bins
fi
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  # Alternate which side goes first, so that neither always runs on a warmer machine.
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for side in $order; do
    bin=$new_bin
    [ "$side" = old ] && bin=$tgt/release/stride_table
    mkdir -p "$runs/$side-$r"
    echo "round $r/$rounds: $side ..." >&2
    "$bin" --out "$runs/$side-$r" >"$runs/$side-$r.log" 2>&1 || { cat "$runs/$side-$r.log" >&2; exit 1; }
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
out=$root/results/stride_table_vs_$old_short$suffix.csv
python3 - "$runs" "$rounds" "$out" "$old_short" "$load_start" "$load_end" "$cap" <<'EOF'
import csv, datetime, os, platform, statistics, subprocess, sys
runs, rounds, out, old, load_start, load_end, cap = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
def table(path):
    rows = [l for l in open(path) if not l.startswith('#')]
    return {int(r['stride']): float(r['end_to_end_ms']) for r in csv.DictReader(rows)}
def header(path):
    return [l.rstrip('\n') for l in open(path) if l.startswith('# ')]
sides = {s: [table(f'{runs}/{s}-{r}/stride_table.csv') for r in range(1, rounds + 1)] for s in ('old', 'new')}
new_head = header(f'{runs}/new-1/stride_table.csv')
model = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.machine())
commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], capture_output=True, text=True).stdout.strip()
with open(out + '.partial', 'w') as f:
    f.write(f'# commit: {commit}\n# dirty: {"yes" if dirty else "no"}\n')
    f.write(f'# date_utc: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n')
    f.write(f'# hardware: {model} ({os.cpu_count()} logical CPUs)\n')
    f.write(f'# command_line: {"CAP_ISA=" + cap + " " if cap else ""}scripts/stride_table_vs.sh {old} {rounds}\n')
    if cap:
        f.write(f'# isa_cap: {cap}: this commit built without cadence-engines\' gemm-avx512 feature (gemm without its x86-v4 AVX-512 kernels) and both sides run with CADENCE_MAX_ISA={cap}: what an AVX2-only machine runs; the target is no slowdown (speedup >= 1.0)\n')
    f.write(f'# method: stride_table (embedded defaults) built at {old} into its own target directory and at this commit; run in turns, {rounds} rounds each (order alternating); median end_to_end_ms per stride\n')
    f.write(f'# load_average: {load_start} at start, {load_end} at end (1/5/15 min)\n')
    for l in new_head:
        if l.split(':')[0] in ('# engine_profile', '# weights', '# backend', '# engines', '# output_frame'):
            f.write(l + ' (this commit)\n')
    w = csv.writer(f)
    w.writerow(['stride', 'old_commit', 'old_end_to_end_ms', 'new_end_to_end_ms', 'speedup', 'target', 'verdict', 'old_runs_ms', 'new_runs_ms'])
    target = 1.0 if cap else 1.3
    for s in sorted(sides['new'][0]):
        o = statistics.median(t[s] for t in sides['old'])
        n = statistics.median(t[s] for t in sides['new'])
        w.writerow([s, old, f'{o:.1f}', f'{n:.1f}', f'{o / n:.3f}', f'>= {target}', 'met' if o / n >= target else 'NOT MET',
                    ' '.join(f'{t[s]:.0f}' for t in sides['old']), ' '.join(f'{t[s]:.0f}' for t in sides['new'])])
os.replace(out + '.partial', out)
print(open(out).read())
EOF
