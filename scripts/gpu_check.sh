#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA driver and no Rust. Build here first:
#   cargo build --release -p cadence && mkdir -p .device && cp target/release/cadence .device/
# then on the GPU machine (with .device carried):  scripts/gpu_check.sh [.device/cadence]
# It prints the GPU, compares every kernel's CUDA output with the CPU path on fresh random
# data and a short render with the kernels on the GPU with the same render on the CPU (non-zero
# exit on any mismatch) and prints the timing table; with $OUT set (the device
# tool) the log and JSON land there.
set -uo pipefail
bin=${1:-.device/cadence}
out=${OUT:-results/gpu}
mkdir -p "$out"
{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
    "$bin" info
    "$bin" gpu-check --reps 101 --json "$out/gpu_check.json" --force
    echo "gpu-check exit: $?"
    "$bin" bench --frames 640 --strides 1,2,3,4 --reps 101 --json "$out/expand_bench.json" --force
} 2>&1 | tee "$out/gpu_check.log"
