#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA driver and no Rust. Build here first:
#   cargo build --release -p cadence-cli && mkdir -p .device && cp target/release/cadence .device/
# then on the GPU machine (with .device carried):  scripts/gpu_check.sh [.device/cadence]
# It prints the GPU, compares every kernel's CUDA output with the CPU path on fresh random
# data and a short render with the kernels on the GPU with the same render on the CPU, and prints
# the timing table; with $OUT set (the device tool) the log and JSON land there. The exit status
# is gpu-check's (non-zero on any failed check; the JSON report is written either way), or
# non-zero if only the benchmark failed.
set -uo pipefail
bin=${1:-.device/cadence}
out=${OUT:-results/gpu}
mkdir -p "$out"
{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
    "$bin" info
    "$bin" gpu-check --reps 101 --json "$out/gpu_check.json" --force
    check=$?
    echo "gpu-check exit: $check"
    "$bin" bench --frames 640 --strides 1,2,3,4 --reps 101 --json "$out/expand_bench.json" --force
    bench=$?
    echo "bench exit: $bench"
    # The group is a pipeline element (a subshell): its exit status is the pipeline's (pipefail).
    if [ "$check" -ne 0 ]; then exit "$check"; fi
    exit "$bench"
} 2>&1 | tee "$out/gpu_check.log"
