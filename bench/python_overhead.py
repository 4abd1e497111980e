"""What a Python call into kiln costs beside numpy's equivalent, measured in the same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--quick] [--pairs N]

Each case times a kiln call and its numpy counterpart on the CPU backend with 1,024 float32
elements. The two are timed in pairs, one timeit loop of each, the order swapped from one pair to
the next, so both sides of a pair see the same load (this VM is shared and its speed drifts); a
case prints the median ns per call of each side and the median of the pairs' ratios kiln / numpy,
with its target: allocation + release of a small array at most 1.5x np.empty's, an
operation no slower than numpy's (1.0x). Ratios are printed, never asserted. --quick runs a few
iterations only (a smoke test).
"""

import argparse
import statistics
import timeit
from typing import Callable

import numpy as np

import kiln

ELEMENTS = 1024

Call = Callable[[], object]


def loop_ns(fn: Call, number: int) -> float:
    """One timeit loop of `number` calls of `fn`, in ns per call."""
    return timeit.timeit(fn, number=number) / number * 1e9


def paired(kiln_call: Call, numpy_call: Call, number: int, pairs: int) -> tuple[float, float, float]:
    """(median kiln ns, median numpy ns, median of the pairs' ratios), after one warm-up loop of
    each; pair i times kiln first when i is even, numpy first when it is odd."""
    loop_ns(kiln_call, number)
    loop_ns(numpy_call, number)
    kiln_ns, numpy_ns = [], []
    for i in range(pairs):
        if i % 2 == 0:
            kiln_ns.append(loop_ns(kiln_call, number))
            numpy_ns.append(loop_ns(numpy_call, number))
        else:
            numpy_ns.append(loop_ns(numpy_call, number))
            kiln_ns.append(loop_ns(kiln_call, number))
    ratios = [k / n for k, n in zip(kiln_ns, numpy_ns)]
    return statistics.median(kiln_ns), statistics.median(numpy_ns), statistics.median(ratios)


def cases() -> list[tuple[str, Call, Call, float]]:
    """(name, kiln call, numpy call, target ratio) for each case."""
    x, y = kiln.ndarray(kiln.f32, (ELEMENTS,)), kiln.ndarray(kiln.f32, (ELEMENTS,))
    kiln.fill(x, 1.0)
    kiln.fill(y, 1.0)
    xn, yn = np.ones(ELEMENTS, np.float32), np.ones(ELEMENTS, np.float32)
    scratch = np.empty(ELEMENTS, np.float32)

    device = kiln.current_device()
    entered: list[bool] = []

    def in_device_block() -> None:
        if not entered:  # from its first call on, the run is inside `with d:` (the cases before
            device.__enter__()  # it measure a process that never entered one)
            entered.append(True)
        kiln.ndarray(kiln.f32, (ELEMENTS,))

    def numpy_axpy() -> None:  # y = 2 x + y in place, without a temporary
        np.multiply(xn, np.float32(2.0), out=scratch)
        np.add(yn, scratch, out=yn)

    return [
        ("alloc+release (del)", lambda: kiln.ndarray(kiln.f32, (ELEMENTS,)),
         lambda: np.empty(ELEMENTS, np.float32), 1.5),
        ("alloc+free()", lambda: kiln.ndarray(kiln.f32, (ELEMENTS,)).free(),
         lambda: np.empty(ELEMENTS, np.float32), 1.5),
        ("alloc+del device=d", lambda: kiln.ndarray(kiln.f32, (ELEMENTS,), device=device),
         lambda: np.empty(ELEMENTS, np.float32), 1.5),
        ("alloc+del in with d", lambda: in_device_block(),
         lambda: np.empty(ELEMENTS, np.float32), 1.5),
        ("fill", lambda: kiln.fill(x, 1.0), lambda: yn.fill(1.0), 1.0),
        ("axpy", lambda: kiln.axpy(2.0, x, y), numpy_axpy, 1.0),
        ("reduce_sum", lambda: kiln.reduce_sum(x), lambda: xn.sum(dtype=np.float64), 1.0),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few iterations (smoke test)")
    parser.add_argument("--pairs", type=int, default=15, help="pairs of loops per case (15)")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    number, pairs = (50, 2) if args.quick else (5000, args.pairs)
    kiln.init("cpu")
    print(f"Python call overhead, cpu backend, {ELEMENTS} float32 elements ({pairs} alternated "
          f"pairs of {number}-call loops; medians; ratio = kiln / numpy, never asserted):")
    for name, kiln_call, numpy_call, target in cases():
        kiln_ns, numpy_ns, ratio = paired(kiln_call, numpy_call, number, pairs)
        verdict = "met" if ratio <= target else "MISSED"
        print(f"  {name:20s} kiln {kiln_ns:8.1f} ns, numpy {numpy_ns:8.1f} ns, ratio {ratio:5.2f}x "
              f"(target <= {target:.2f}x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
