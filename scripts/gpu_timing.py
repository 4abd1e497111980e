#!/usr/bin/env python3
"""The timing section of the GPU check, for a real NVIDIA machine.

    PYTHONPATH=<dir holding the kiln package> python3 scripts/gpu_timing.py [RESULTS_FILE]
    scripts/gpu-check.sh timing [OUT_DIR]     # the same, writing OUT_DIR/gpu-timing.txt

Times kiln's GPU kernels on the cuda backend against baselines measured in the same run and
prints each as a ratio with its target beside it ("target >= 0.8x: met" / "MISSED"):

- Bandwidth baselines: the device's theoretical peak, memory clock (kHz) * bus width (bits) / 8
  * 2 (DDR) from cudaDeviceGetAttribute (through CuPy), and a measured device-to-device copy
  (CuPy `dst[...] = src`, else PyTorch `dst.copy_(src)`, timed with CUDA events): 2 * bytes
  moved per copy. The copy is the practical limit, so the targets are against it.
- kiln.axpy (f32, 64 Mi elements: reads x and y, writes y = 3 * 256 MiB per call) and
  kiln.reduce_sum (f32, 64 Mi elements: reads 256 MiB) in GB/s, against both baselines.
- kiln.matmul (f32, n = 4096: 2 n^3 flop) in TFLOP/s against cuBLAS through torch.matmul (TF32
  off) or cupy.matmul, same shapes, same run.

kiln's calls are synchronous (a launch reads the device error area back), so they are timed on
the host with perf_counter: median of REPS calls after one warm-up; the launch overhead is part
of kiln's figure. Every kiln result is checked once (axpy, reduce and matmul of known inputs), so
a fast wrong kernel is a FAIL, not a figure. Lines: PASS/FAIL/SKIP for checks, TIME for figures.
Skips cleanly, saying why, where kiln does not import, has no CUDA executor, or where CuPy and
PyTorch are both absent (the baselines that need them are then SKIP; kiln's own figures print).
Exit status: 0 when nothing failed, 1 when a check failed. Written without a GPU at hand; smoke-run
on the fake driver with small sizes:
    KILN_CUDA_DRIVER=build/lib/libkiln_fake_cuda.so KILN_TIMING_ELEMENTS=1048576 \
    KILN_TIMING_MATMUL_N=128 PYTHONPATH=build/python python3 scripts/gpu_timing.py
"""
import os
import statistics
import sys
import time
import traceback

import gpu_script_common as common
from gpu_script_common import report

MiB = 1 << 20
# Sizes; the environment can shrink them for a smoke run on the fake driver (KILN_CUDA_DRIVER).
N_ELEMENTS = int(os.environ.get("KILN_TIMING_ELEMENTS", 64 * MiB))  # f32, 256 MiB per array
MATMUL_N = int(os.environ.get("KILN_TIMING_MATMUL_N", 4096))
REPS = int(os.environ.get("KILN_TIMING_REPS", 7))
BANDWIDTH_TARGET = 0.8  # of the measured device-to-device copy
MATMUL_TARGET = 0.25    # of cuBLAS: a 16x16 shared-memory tile without register blocking

def median_seconds(fn, sync=None):
    """Median wall time of REPS calls of fn after one warm-up; sync() ends each call."""
    fn()
    if sync:
        sync()
    times = []
    for _ in range(REPS):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def verdict(ratio, target):
    return f"{ratio:.2f}x (target >= {target}x: {'met' if ratio >= target else 'MISSED'})"


def peak_bandwidth_gbs(cupy):
    """Theoretical DRAM bandwidth in GB/s from the device attributes, or None."""
    if cupy is None:
        return None
    rt = cupy.cuda.runtime
    clock_khz = rt.deviceGetAttribute(rt.cudaDevAttrMemoryClockRate, 0)
    bus_bits = rt.deviceGetAttribute(rt.cudaDevAttrGlobalMemoryBusWidth, 0)
    return clock_khz * 1e3 * (bus_bits / 8) * 2 / 1e9


def copy_bandwidth_gbs(cupy, torch):
    """Measured device-to-device copy rate (read + write) in GB/s, or None."""
    nbytes = N_ELEMENTS * 4
    if cupy is not None:
        src = cupy.ones(N_ELEMENTS, dtype=cupy.float32)
        dst = cupy.empty_like(src)

        def run():
            dst[...] = src

        seconds = median_seconds(run, cupy.cuda.runtime.deviceSynchronize)
        del src, dst
        return 2 * nbytes / seconds / 1e9
    if torch is not None:
        src = torch.ones(N_ELEMENTS, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        seconds = median_seconds(lambda: dst.copy_(src), torch.cuda.synchronize)
        del src, dst
        return 2 * nbytes / seconds / 1e9
    return None


def cublas_tflops(cupy, torch):
    """(TFLOP/s of an f32 MATMUL_N^3 product through cuBLAS, the library's name), or None."""
    n = MATMUL_N
    flop = 2 * n**3
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False  # plain FP32, as kiln computes
        a = torch.ones((n, n), dtype=torch.float32, device="cuda")
        b = torch.ones((n, n), dtype=torch.float32, device="cuda")
        c = torch.empty((n, n), dtype=torch.float32, device="cuda")
        seconds = median_seconds(lambda: torch.matmul(a, b, out=c), torch.cuda.synchronize)
        return flop / seconds / 1e12, "torch.matmul (cuBLAS, TF32 off)"
    if cupy is not None:
        a = cupy.ones((n, n), dtype=cupy.float32)
        b = cupy.ones((n, n), dtype=cupy.float32)
        c = cupy.empty((n, n), dtype=cupy.float32)
        seconds = median_seconds(lambda: cupy.matmul(a, b, out=c),
                                 cupy.cuda.runtime.deviceSynchronize)
        return flop / seconds / 1e12, "cupy.matmul (cuBLAS)"
    return None


def kiln_bandwidth(kiln):
    """(axpy GB/s, reduce GB/s) of kiln's kernels; checks one result of each first."""
    x = kiln.ndarray(kiln.f32, (N_ELEMENTS,))
    y = kiln.ndarray(kiln.f32, (N_ELEMENTS,))
    kiln.fill(x, 1.0)
    kiln.fill(y, 2.0)
    kiln.axpy(3.0, x, y)  # y = 5 everywhere
    total = kiln.reduce_sum(y)
    if total != 5.0 * N_ELEMENTS:
        report("FAIL", "kiln axpy + reduce_sum result", f"sum {total}, expected {5.0 * N_ELEMENTS}")
    else:
        report("PASS", "kiln axpy + reduce_sum result")
    nbytes = N_ELEMENTS * 4
    axpy_s = median_seconds(lambda: kiln.axpy(1.0, x, y))
    reduce_s = median_seconds(lambda: kiln.reduce_sum(x))
    x.free()
    y.free()
    return 3 * nbytes / axpy_s / 1e9, nbytes / reduce_s / 1e9


def kiln_matmul_tflops(kiln):
    """TFLOP/s of kiln.matmul f32 at MATMUL_N; checks the result of ones @ ones first."""
    n = MATMUL_N
    a = kiln.ndarray(kiln.f32, (n, n))
    b = kiln.ndarray(kiln.f32, (n, n))
    c = kiln.ndarray(kiln.f32, (n, n))
    kiln.fill(a, 1.0)
    kiln.fill(b, 1.0)
    kiln.matmul(a, b, out=c)  # every element is n
    total = kiln.reduce_sum(c)
    if total != float(n) ** 3:
        report("FAIL", "kiln matmul result", f"sum {total}, expected {float(n) ** 3}")
    else:
        report("PASS", "kiln matmul result")
    seconds = median_seconds(lambda: kiln.matmul(a, b, out=c))
    for array in (a, b, c):
        array.free()
    return 2 * n**3 / seconds / 1e12


def main():
    kiln = common.kiln_on_cuda("timing")
    if kiln is None:
        return 0
    cupy, cupy_missing, torch, torch_missing = common.gpu_libraries()

    axpy_gbs, reduce_gbs = kiln_bandwidth(kiln)
    report("TIME", "kiln axpy f32", f"{axpy_gbs:.2f} GB/s ({N_ELEMENTS} elements, 12 B each)")
    report("TIME", "kiln reduce_sum f32", f"{reduce_gbs:.2f} GB/s ({N_ELEMENTS} elements, 4 B each)")
    peak = peak_bandwidth_gbs(cupy)
    if peak is None:
        report("SKIP", "peak bandwidth (device attributes)", cupy_missing)
    else:
        report("TIME", "peak bandwidth (memory clock * bus width * 2)", f"{peak:.1f} GB/s")
        report("TIME", "axpy / peak", f"{axpy_gbs / peak:.2f}x")
        report("TIME", "reduce_sum / peak", f"{reduce_gbs / peak:.2f}x")
    copy = copy_bandwidth_gbs(cupy, torch)
    if copy is None:
        report("SKIP", "device-to-device copy baseline", f"{cupy_missing}; {torch_missing}")
    else:
        report("TIME", "device-to-device copy (measured)", f"{copy:.1f} GB/s")
        report("TIME", "axpy / copy", verdict(axpy_gbs / copy, BANDWIDTH_TARGET))
        report("TIME", "reduce_sum / copy", verdict(reduce_gbs / copy, BANDWIDTH_TARGET))

    kiln_tflops = kiln_matmul_tflops(kiln)
    report("TIME", f"kiln matmul f32 n={MATMUL_N}", f"{kiln_tflops:.4f} TFLOP/s")
    cublas = cublas_tflops(cupy, torch)
    if cublas is None:
        report("SKIP", "cuBLAS baseline", f"{cupy_missing}; {torch_missing}")
    else:
        tflops, name = cublas
        report("TIME", f"{name} f32 n={MATMUL_N}", f"{tflops:.2f} TFLOP/s")
        report("TIME", "kiln matmul / cuBLAS", verdict(kiln_tflops / tflops, MATMUL_TARGET))
    return 1 if common.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - reported, never a bare traceback only
        report("FAIL", "timing", f"{type(e).__name__}: {e}\n" + traceback.format_exc(limit=5))
        sys.exit(1)
