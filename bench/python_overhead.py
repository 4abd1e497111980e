"""What a Python call into kiln costs beside numpy's equivalent, measured in the same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--quick]

Each case times a kiln call and its numpy counterpart on the CPU backend with 1,024 float32
elements (the best of several repeats of a timeit loop, in ns per call) and prints the ratio
kiln / numpy with its target (issue 16): allocation + release of a small array at most 1.5x
np.empty's, an operation no slower than numpy's (1.0x). Ratios are printed, never asserted:
this machine is shared and noisy. --quick runs a few iterations only (a smoke test).
"""

import argparse
import timeit
from typing import Callable

import numpy as np

import kiln

ELEMENTS = 1024


def best_ns(fn: Callable[[], object], number: int, repeat: int) -> float:
    """The fastest of `repeat` timeit loops of `number` calls, in ns per call."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def cases() -> list[tuple[str, Callable[[], object], Callable[[], object], float]]:
    """(name, kiln call, numpy call, target ratio) for each case."""
    x, y = kiln.ndarray(kiln.f32, (ELEMENTS,)), kiln.ndarray(kiln.f32, (ELEMENTS,))
    kiln.fill(x, 1.0)
    kiln.fill(y, 1.0)
    xn, yn = np.ones(ELEMENTS, np.float32), np.ones(ELEMENTS, np.float32)
    scratch = np.empty(ELEMENTS, np.float32)

    def numpy_axpy() -> None:  # y = 2 x + y in place, without a temporary
        np.multiply(xn, np.float32(2.0), out=scratch)
        np.add(yn, scratch, out=yn)

    return [
        ("alloc+release (del)", lambda: kiln.ndarray(kiln.f32, (ELEMENTS,)),
         lambda: np.empty(ELEMENTS, np.float32), 1.5),
        ("alloc+free()", lambda: kiln.ndarray(kiln.f32, (ELEMENTS,)).free(),
         lambda: np.empty(ELEMENTS, np.float32), 1.5),
        ("fill", lambda: kiln.fill(x, 1.0), lambda: yn.fill(1.0), 1.0),
        ("axpy", lambda: kiln.axpy(2.0, x, y), numpy_axpy, 1.0),
        ("reduce_sum", lambda: kiln.reduce_sum(x), lambda: xn.sum(dtype=np.float64), 1.0),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few iterations (smoke test)")
    args = parser.parse_args()
    number, repeat = (50, 2) if args.quick else (20000, 7)
    kiln.init("cpu")
    print(f"Python call overhead, cpu backend, {ELEMENTS} float32 elements "
          f"(best of {repeat} x {number} calls; ratio = kiln / numpy, never asserted):")
    for name, kiln_call, numpy_call, target in cases():
        kiln_ns = best_ns(kiln_call, number, repeat)
        numpy_ns = best_ns(numpy_call, number, repeat)
        ratio = kiln_ns / numpy_ns
        verdict = "met" if ratio <= target else "MISSED"
        print(f"  {name:20s} kiln {kiln_ns:8.1f} ns, numpy {numpy_ns:8.1f} ns, ratio {ratio:5.2f}x "
              f"(target <= {target:.2f}x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
