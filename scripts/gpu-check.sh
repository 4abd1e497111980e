#!/usr/bin/env bash
# The GPU checks of the CUDA backend, for a machine with an NVIDIA GPU and driver but without
# LLVM or a package registry. Two steps:
#
#   scripts/gpu-check.sh build            # here: builds gpu-bundle/ (static LLVM, stripped)
#   scripts/gpu-check.sh run [OUT_DIR]    # there: runs the bundle, writes OUT_DIR/gpu-check.txt
#   scripts/gpu-check.sh interop [OUT_DIR]  # there: CuPy/PyTorch interop, OUT_DIR/gpu-interop.txt
#   scripts/gpu-check.sh timing [OUT_DIR]   # there: kernel timings vs baselines, OUT_DIR/gpu-timing.txt
#
# `build` makes gpu-bundle/kiln-gpu-check with LLVM 19 linked statically (x86 + NVPTX; its zstd
# too), fmt, RE2 and libstdc++ compiled in, and checks it is under 64 MiB and needs only libc,
# libm and libz. Carry gpu-bundle/ to the GPU machine (e.g. the device tool's carry list) with this
# script. `run` executes, within about 8 minutes: the kiln-ops cases on cuda (every verdict), the
# seed
# scenario: a larger-than-device ndarray is DeviceOutOfMemoryError and a small one works after;
# 1 GiB ndarrays until refused give a typed error and the ledger returns to its set-up after
# freeing; a pool-hit alloc+free timed against cuMemAlloc_v2; axpy bandwidth). Everything goes
# to one results file. KILN_CUDA_DRIVER can point `run` at another driver (e.g. the fake one).
# The bundle is built on Debian 12 and needs glibc 2.36 or newer on the GPU machine.
# `interop` runs scripts/gpu_interop.py with the python3 that has CuPy/PyTorch and the kiln package
# on KILN_PYTHONPATH (default build/python): zero-copy exchange both ways (DLPack, the CUDA Array
# Interface) and a kiln OOM naming the free/total CuPy/PyTorch see. Each check says PASS, FAIL or
# SKIP with its reason (no kiln for this Python, no CUDA, no CuPy/PyTorch).
# `timing` runs scripts/gpu_timing.py the same way: kiln's axpy and reduce_sum in GB/s against the
# device's peak (memory clock * bus width * 2, via CuPy) and a measured device-to-device copy, and
# kiln's f32 matmul in TFLOP/s against cuBLAS (torch.matmul or cupy.matmul), all in the same run,
# printed as ratios with their targets ("target >= 0.8x: met/MISSED"); results checked first.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle="$root/gpu-bundle"
limit_bytes=$((64 * 1024 * 1024))

build() {
  bash "$root/scripts/install-deps.sh"
  cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release -DKILN_LLVM_STATIC=ON -DKILN_PORTABLE=ON \
    -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_PYTHON=OFF || return 1
  cmake --build "$root/build-gpu" -j "$(nproc)" --target kiln-gpu-check || return 1
  rm -rf "$bundle" && mkdir -p "$bundle"
  strip -o "$bundle/kiln-gpu-check" "$root/build-gpu/bin/kiln-gpu-check" || return 1
  local size
  size=$(du -cb "$bundle"/* | tail -1 | cut -f1)
  echo "gpu-bundle: $size bytes"
  if [ "$size" -gt "$limit_bytes" ]; then echo "gpu-bundle is over 64 MiB"; return 1; fi
  local needs
  needs=$(ldd "$bundle/kiln-gpu-check" | grep -vE 'linux-vdso|ld-linux|libc\.so|libm\.so|libz\.so')
  if [ -n "$needs" ]; then echo "gpu-bundle needs more than libc/libm/libz:"; echo "$needs"; return 1; fi
  ldd "$bundle/kiln-gpu-check"
}

run() {
  local out="${1:-${OUT:-$root/gpu-results}}"
  mkdir -p "$out"
  local results="$out/gpu-check.txt"
  : > "$results"
  { echo "# kiln gpu-check $(date -u +%FT%TZ) on $(hostname)"; nvidia-smi -L 2>&1 | head -4; } >> "$results"
  timeout 450 "$bundle/kiln-gpu-check" "$results" > /dev/null 2>> "$results"
  local status=$?
  echo "kiln-gpu-check exit status: $status" >> "$results"
  cat "$results"
  return "$status"
}

# Runs scripts/<script> with the kiln package on PYTHONPATH, its result lines into OUT/<file>,
# then its exit status into the same file; returns that status.
python_check() {
  local script="$1" file="$2" out="${3:-${OUT:-$root/gpu-results}}"
  mkdir -p "$out"
  local results="$out/$file"
  : > "$results"
  PYTHONPATH="${KILN_PYTHONPATH:-$root/build/python}${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 300 "${PYTHON:-python3}" "$root/scripts/$script" "$results"
  local status=$?
  echo "$script exit status: $status" >> "$results"
  return "$status"
}

interop() { python_check gpu_interop.py gpu-interop.txt "$@"; }
timing() { python_check gpu_timing.py gpu-timing.txt "$@"; }

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  interop) shift; interop "$@" ;;
  timing) shift; timing "$@" ;;
  *) sed -n '2,27p' "$0"; exit 2 ;;
esac
