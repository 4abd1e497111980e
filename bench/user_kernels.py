"""User kernels beside kiln's built-in operations and numpy, measured in the same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/user_kernels.py [--quick] [--pairs N]

Cases (CPU backend; each pair timed in alternating order so both sides see the same load; the
median of the pairs' ratios is printed with its target, never asserted):
- ElementwiseKernel `y = a * x + y` (float32, 64 MiB per array; y an output the operation reads,
  in place as kiln.axpy) against the built-in axpy: kiln's throughput / the baseline's, target
  >= 0.9; `z = a * x + y` (a third array) against axpy and numpy (two passes, out= arrays);
- a cached ElementwiseKernel call on 1,024 elements against numpy's `a * x + y`: ns per call,
  kiln / numpy, target <= 1.5;
- ReductionKernel sum (float32, 64 MiB) against a read of the same bytes (kiln.reduce_sum's
  roofline stand-in, numpy's sum of the array): throughput ratio, target >= 0.9;
- the first call's compile time and a cached call's cost, as numbers.
--quick runs few iterations (a smoke test).
"""

import argparse
import statistics
import sys
import time
from typing import Callable

import numpy as np

import kiln
from kiln import _kernels

Call = Callable[[], object]


def seconds(fn: Call, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def paired(a: Call, b: Call, number: int, pairs: int) -> tuple[float, float, float]:
    """(median seconds of a, of b, median of b/a per pair): the ratio is a's speed over b's."""
    seconds(a, 1)
    seconds(b, 1)
    ta, tb = [], []
    for i in range(pairs):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        t1, t2 = seconds(first, number), seconds(second, number)
        if i % 2 == 0:
            ta.append(t1)
            tb.append(t2)
        else:
            tb.append(t1)
            ta.append(t2)
    return statistics.median(ta), statistics.median(tb), statistics.median(b_ / a_ for a_, b_ in zip(ta, tb))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=int, default=7)
    options = parser.parse_args()
    pairs = 2 if options.quick else options.pairs
    big = (1 << 20) if options.quick else (16 << 20)  # float32 elements: 4 or 64 MiB
    kiln.init(arch="cpu")
    _kernels._clear_cache()
    print(f"user kernels, CPU backend, {kiln.memory_stats()['device']}, {big * 4 >> 20} MiB arrays")

    saxpy = kiln.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 z", "z = a * x + y", "saxpy")
    started = time.perf_counter()
    x, y = kiln.zeros((big,)), kiln.zeros((big,))
    z = kiln.zeros((big,))
    saxpy(2.0, x, y, z)
    first_ms = (time.perf_counter() - started) * 1e3
    cached_us = seconds(lambda: saxpy(2.0, x, y, z), 3 if options.quick else 10) * 1e6
    print(f"  first call (compile + launch, 64 MiB): {first_ms:.1f} ms; later calls {cached_us:.0f} us")

    # The same memory traffic as kiln.axpy: y is an output the operation also reads (y += a x in
    # place: x and y read, y written back), where z = a x + y also reads z's lines in to write them.
    inplace = kiln.ElementwiseKernel("float32 a, float32 x", "float32 y", "y = a * x + y", "saxpy_inplace")
    inplace(2.0, x, y)
    kt, at, ratio = paired(lambda: inplace(2.0, x, y), lambda: kiln.axpy(2.0, x, y), 1, pairs)
    print(f"  elementwise y = a*x+y vs kiln.axpy: {kt * 1e3:7.2f} ms vs {at * 1e3:7.2f} ms  ratio {ratio:.2f}x "
          "(target >= 0.9)")
    kt, at, ratio = paired(lambda: saxpy(2.0, x, y, z), lambda: kiln.axpy(2.0, x, y), 1, pairs)
    print(f"  elementwise z = a*x+y vs kiln.axpy: {kt * 1e3:7.2f} ms vs {at * 1e3:7.2f} ms  ratio {ratio:.2f}x "
          "(z is a third array: one more stream than axpy's)")
    xn, yn, zn = np.zeros(big, np.float32), np.zeros(big, np.float32), np.zeros(big, np.float32)

    def numpy_saxpy() -> None:
        np.multiply(xn, np.float32(2.0), out=zn)
        np.add(zn, yn, out=zn)

    kt, nt, ratio = paired(lambda: saxpy(2.0, x, y, z), numpy_saxpy, 1, pairs)
    print(f"  elementwise a*x+y vs numpy:       {kt * 1e3:7.2f} ms vs {nt * 1e3:7.2f} ms  ratio {ratio:.2f}x")

    small = 1024
    xs, ys, zs = kiln.zeros((small,)), kiln.zeros((small,)), kiln.zeros((small,))
    xsn, ysn = np.zeros(small, np.float32), np.zeros(small, np.float32)
    number = 200 if options.quick else 5000
    kt, nt, ratio = paired(lambda: saxpy(2.0, xs, ys, zs), lambda: np.float32(2.0) * xsn + ysn, number, pairs)
    print(f"  cached call, 1,024 elements:      {kt * 1e9:7.0f} ns vs numpy {nt * 1e9:5.0f} ns  kiln/numpy "
          f"{1 / ratio:.2f}x (target <= 1.5)")

    total = kiln.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "total")
    started = time.perf_counter()
    total(x)
    print(f"  reduction first call (compile two kernels + launch): {(time.perf_counter() - started) * 1e3:.1f} ms")
    rt, bt, ratio = paired(lambda: total(x), lambda: kiln.reduce_sum(x), 1, pairs)
    print(f"  ReductionKernel sum vs reduce_sum: {rt * 1e3:7.2f} ms vs {bt * 1e3:7.2f} ms  ratio {ratio:.2f}x "
          "(target >= 0.9 of the read roofline; reduce_sum stands in for it here)")
    rt, nt, ratio = paired(lambda: total(x), lambda: xn.sum(), 1, pairs)
    print(f"  ReductionKernel sum vs numpy sum: {rt * 1e3:7.2f} ms vs {nt * 1e3:7.2f} ms  ratio {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
