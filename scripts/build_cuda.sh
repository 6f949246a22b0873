#!/usr/bin/env bash
# Builds cadence with candle's CUDA backend (engines' `cuda` feature) on a machine WITHOUT a CUDA
# toolkit and without a GPU: nvcc, the CUDA headers and the CUDA libraries come from NVIDIA's PyPI
# wheels, installed into a venv (.venv-cuda). Idempotent; every step says what it does and the
# script stops at the first failure.
#
# usage: scripts/build_cuda.sh [--check] [--engines-only | --experiments | --test-resident]
#   --check         `cargo check` instead of `cargo build` (still runs candle-kernels' build
#                   script, i.e. all of the nvcc work; skips codegen and the final link)
#   --engines-only  build `-p cadence-engines --features cuda` (a library) instead of the
#                   `cadence` binary (`-p cadence-cli`) with `--features engines-cuda`
#   --experiments   build the experiments' binaries (stride_table, ...) with `--features
#                   engines-cuda` instead of the `cadence` binary (the same target dir reuses candle's kernels)
#   --test-resident build and RUN host/tests/resident.rs with `engines-cuda` (needs a GPU machine
#                   with its driver and Rust): the render loop with the engines on CUDA and the
#                   frames kept on the GPU, against the frame-by-frame reference
# environment:
#   CUDA_COMPUTE_CAP  target GPU (default 90 = H100/H200; candle's build turns 90 into sm_90a)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
#   CUDA_VENV         where the wheels go (default: .venv-cuda in the repository root)
#   CUDAFORGE_THREADS parallel nvcc jobs in candle-kernels' build (default: all cores)
#   NVCC_CCBIN        host compiler for nvcc, if the default g++ is one nvcc rejects (candle's
#                     build then also passes -allow-unsupported-compiler)
#
# The result needs, at run time, the real NVIDIA driver (libcuda.so.1) and the CUDA libraries of
# the wheels (cuBLAS, cuBLASLt, cuRAND, cudart): candle 0.11.1 links them dynamically. The
# script prints the LD_LIBRARY_PATH to use. The libcuda.so it builds under $CUDA_VENV/cuda/lib/stubs
# is a link-time stub only (like the toolkit's lib64/stubs/libcuda.so); never put it on a run-time path.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

mode=build
pkg_args=(-p cadence-cli --features engines-cuda)
for arg in "$@"; do
    case "$arg" in
        --check) check=1 ;;
        --engines-only) pkg_args=(-p cadence-engines --features cuda) ;;
        --experiments) pkg_args=(-p experiments --features engines-cuda) ;;
        --test-resident) mode=test; pkg_args=(-p cadence --features engines-cuda --test resident) ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "build_cuda.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
# --check wins whatever the order of the arguments.
[ "${check:-0}" = 1 ] && mode=check

die() { echo "build_cuda.sh: ERROR: $*" >&2; exit 1; }
step() { echo "== build_cuda: $*"; }

# CUDA 13.0 everywhere: the lent H200's driver is 580 (CUDA 13.0). A driver JIT-compiles PTX only
# up to its own PTX ISA (13.0 -> PTX 9.0), and candle loads most of its kernels as PTX, so nvcc
# must not be newer than the driver. cudarc 0.19.10 also knows CUDA versions up to 13.4 only.
WHEELS=(
    "nvidia-cuda-nvcc==13.0.88"     # bin/nvcc, ptxas, cudafe++, fatbinary, nvlink
    "nvidia-nvvm==13.0.88"          # nvvm/bin/cicc, libdevice
    "nvidia-cuda-crt==13.0.88"      # include/crt/* (host_config.h, ...)
    "nvidia-cuda-runtime==13.0.88"  # cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, libcudart.so.13
    "nvidia-cuda-cccl==13.0.85"     # include/cccl (nv/target, cuda/std, cub) used by cuda_fp16.hpp
    "nvidia-cuda-nvrtc==13.0.88"    # libnvrtc.so.13 (cudarc's nvrtc module, linked)
    "nvidia-cublas==13.0.2.14"      # libcublas.so.13, libcublasLt.so.13 (candle's matmul, linked)
    "nvidia-curand==10.4.0.35"      # libcurand.so.10 (candle's random tensors, linked)
)
venv=${CUDA_VENV:-$root/.venv-cuda}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# candle-kernels' build (cudaforge) runs nvcc on half the cores by default: 1 of 2 here.
export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$(nproc)}

step "host tools"
command -v cargo > /dev/null || die "cargo not found"
command -v python3 > /dev/null || die "python3 not found (needed for the venv that holds the wheels)"
command -v g++ > /dev/null || die "g++ not found (nvcc's host compiler): apt-get install g++"
command -v gcc > /dev/null || die "gcc not found: apt-get install gcc"
echo "g++: $(g++ -dumpfullversion) ($(command -v g++))"

step "CUDA wheels into $venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${WHEELS[@]}" \
    || die "pip install of the CUDA wheels failed"
cu=$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)
[ -x "$cu/bin/nvcc" ] || die "nvcc not found at $cu/bin/nvcc after pip install"

# A toolkit-shaped folder: nvcc finds cicc, ptxas and include/ relative to itself (nvcc.profile),
# candle's build finds nvcc on PATH and include/ next to its bin/, and cudarc's build script adds
# $CUDA_HOME/lib and $CUDA_HOME/lib/stubs to the link search path. The wheels ship only versioned
# libraries (libcublas.so.13): the linker's -lcublas needs an unversioned name.
step "toolkit layout in $venv/cuda"
tk=$venv/cuda
mkdir -p "$tk/lib/stubs"
for d in bin include nvvm; do
    ln -sfn "../${cu#"$venv"/}/$d" "$tk/$d"
done
for f in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
    [ -f "$cu/lib/$f" ] || die "$f missing from the wheels ($cu/lib)"
    ln -sfn "../../${cu#"$venv"/}/lib/$f" "$tk/lib/${f%%.so*}.so"
done

# libcuda.so.1 belongs to the driver and no wheel ships it. candle makes cudarc link it
# (`dynamic-linking`), so the linker needs a libcuda.so that defines the driver API's names: a
# stub with empty functions for every name cudarc declares, soname libcuda.so.1. At run time the
# driver's real libcuda.so.1 is loaded instead.
step "link-time libcuda stub"
cargo fetch --quiet || die "cargo fetch failed"
cudarc_src=$(cargo metadata --format-version 1 --quiet | python3 -c '
import json, sys
pk = [p for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"]
if len(pk) != 1: sys.exit("expected exactly one cudarc in Cargo.lock, found %d" % len(pk))
print(pk[0]["manifest_path"].rsplit("/", 1)[0])') || die "cannot locate cudarc's sources"
sys_rs=$cudarc_src/src/driver/sys/mod.rs
[ -f "$sys_rs" ] || die "$sys_rs not found"
stub_c=$tk/lib/stubs/cuda_stub.c
{
    echo "/* Generated by scripts/build_cuda.sh from $sys_rs: link-time stub, never loaded. */"
    grep -oP '^pub unsafe fn \Kcu\w+' "$sys_rs" | sort -u | sed 's/.*/void &(void) {}/'
} > "$stub_c.new"
[ "$(grep -c '^void cu' "$stub_c.new")" -gt 100 ] || die "found too few driver functions in $sys_rs"
if ! cmp -s "$stub_c.new" "$stub_c" || [ ! -f "$tk/lib/stubs/libcuda.so" ]; then
    mv "$stub_c.new" "$stub_c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tk/lib/stubs/libcuda.so" "$stub_c" \
        || die "building the libcuda stub failed"
else
    rm "$stub_c.new"
fi
echo "libcuda stub: $(grep -c '^void cu' "$stub_c") driver functions from cudarc $(basename "$cudarc_src")"

export CUDA_HOME=$tk
export PATH=$tk/bin:$PATH

step "nvcc probe (sm_${CUDA_COMPUTE_CAP%a}, fp16/bf16 headers)"
nvcc --version | tail -n 2
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat > "$probe/probe.cu" << 'EOF'
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
extern "C" __global__ void probe(const __half *a, const __nv_bfloat16 *b, float *c) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    c[i] = __half2float(a[i]) + __bfloat162float(b[i]);
}
EOF
ccbin=()
[ -n "${NVCC_CCBIN:-}" ] && ccbin=(-allow-unsupported-compiler -ccbin "$NVCC_CCBIN")
if ! nvcc "${ccbin[@]}" -std=c++17 -arch="sm_${CUDA_COMPUTE_CAP}" -ptx "$probe/probe.cu" -o "$probe/probe.ptx" \
    || ! nvcc "${ccbin[@]}" -std=c++17 -arch="sm_${CUDA_COMPUTE_CAP}" -Xcompiler -fPIC -c "$probe/probe.cu" -o "$probe/probe.o"; then
    die "nvcc cannot compile a probe kernel (if it rejects the host compiler, set NVCC_CCBIN to a supported g++)"
fi
echo "probe: $(grep -m1 '^\.version' "$probe/probe.ptx"), $(grep -m1 '^\.target' "$probe/probe.ptx")"

step "cargo $mode --release ${pkg_args[*]} (CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP, target dir $CARGO_TARGET_DIR)"
start=$(date +%s)
# A test run loads the wheels' CUDA libraries (candle links them) next to the driver's libcuda.
[ "$mode" = test ] && export LD_LIBRARY_PATH="$cu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo "$mode" --release "${pkg_args[@]}" || die "cargo $mode failed"
echo "cargo $mode: $(( $(date +%s) - start )) s"

libpath="$cu/lib"
if [ "$mode" = build ]; then
    if [ "${pkg_args[1]}" = cadence-cli ]; then
        bin=$CARGO_TARGET_DIR/release/cadence
        [ -x "$bin" ] || die "$bin was not produced"
        # candle's kernels: PTX modules for sm_<cap>a (driver-JIT at run time) and the cubins of
        # its static libmoe.a in the .nv_fatbin section.
        n=$(strings -n 8 "$bin" | grep -c "^\.target sm_${CUDA_COMPUTE_CAP}a" || true)
        [ "$n" -gt 0 ] || die "no candle PTX (.target sm_${CUDA_COMPUTE_CAP}a) found in $bin"
        fatbin=$(readelf -S -W "$bin" | awk '{ for (i = 1; i < NF; i++) if ($i == ".nv_fatbin") print $(i + 4) }')
        [ -n "$fatbin" ] || die "no .nv_fatbin section in $bin"
        echo "candle CUDA kernels in the binary: $n PTX strings with .target sm_${CUDA_COMPUTE_CAP}a, .nv_fatbin of $(( 0x$fatbin / 1048576 )) MiB"
        echo "linked CUDA libraries:"
        readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(lib\(cuda\|cublas\|curand\|nvrtc\)[^]]*\)\]/  \1/p'
        echo
        echo "binary: $bin"
    elif [ "${pkg_args[1]}" = experiments ]; then
        echo "built: the experiments' binaries (stride_table, ...) with candle's CUDA backend under $CARGO_TARGET_DIR/release"
    else
        echo "built: cadence-engines (library) with candle's CUDA backend under $CARGO_TARGET_DIR/release"
    fi
    echo "to run it on a GPU machine (driver >= 580, i.e. CUDA 13.0), with the driver's libcuda.so.1 and"
    echo "the wheels' libcudart.so.13, libcublas.so.13, libcublasLt.so.13, libcurand.so.10 (about 0.73 GB):"
    echo "  LD_LIBRARY_PATH=$libpath"
elif [ "$mode" = check ]; then
    echo "cargo check with --features cuda passed"
fi
