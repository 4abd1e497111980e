"""Adaptive batching: process a data set in batches with kiln ops; when a batch does not fit
(any kiln.OutOfMemoryError, a MemoryError: the budget, the driver or the device heap said no),
halve the batch and go on.

For each row block X_b of a data set X (rows x features, float64) and a weight matrix W:
    scores_b = X_b @ W                      (kiln.matmul)
    total   += sum(scores_b)                (kiln.reduce_sum)
    positive += len(compact_positive(scores_b))   (a kernel that allocates from the device heap)
The results are checked against numpy at the end, then memory_summary() is printed.

    PYTHONPATH=build/python /usr/bin/python3 examples/adaptive_batch.py --budget-mb 16 --heap-mb 0.5

Exit status 0 when the results are right, 1 when not, 2 when not even one row fits.
"""
import argparse
import sys

import numpy as np
import numpy.typing as npt

import kiln

MiB = 1 << 20


def process_batch(rows: npt.NDArray[np.float64], weights: kiln.ndarray) -> tuple[float, int]:
    """(sum of rows @ weights, count of its positive entries), on the device. Every array made
    here is freed before returning, also when an allocation or a launch fails."""
    arrays: list[kiln.ndarray] = []
    try:
        x = kiln.from_numpy(rows)
        arrays.append(x)
        scores = kiln.matmul(x, weights)
        arrays.append(scores)
        total = kiln.reduce_sum(scores)
        positive = kiln.compact_positive(scores)
        arrays.append(positive)
        return total, positive.size
    finally:
        for a in arrays:
            a.free()


def run(data: npt.NDArray[np.float64], weights_host: npt.NDArray[np.float64],
        batch_rows: int) -> tuple[float, int, int, list[tuple[str, int]]]:
    """Processes `data` in batches, halving the batch on out-of-memory errors. Returns the sum,
    the count of positive scores, the final batch size and the list of refusals (exception class
    name, batch size)."""
    weights = kiln.from_numpy(weights_host)
    total, positive, start = 0.0, 0, 0
    refusals: list[tuple[str, int]] = []
    while start < len(data):
        rows = data[start:start + batch_rows]
        try:
            batch_total, batch_positive = process_batch(rows, weights)
        except kiln.OutOfMemoryError as e:  # every kind kiln raises; each is also a MemoryError
            refusals.append((type(e).__name__, batch_rows))
            print(f"batch of {batch_rows} rows refused: {type(e).__name__} "
                  f"(asked {e.requested_bytes} bytes for {e.category})")
            if batch_rows == 1:
                raise
            batch_rows //= 2
            continue
        total += batch_total
        positive += batch_positive
        start += len(rows)
    return total, positive, batch_rows, refusals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cpu")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--outputs", type=int, default=4)
    parser.add_argument("--budget-mb", type=int, default=16, help="kiln's memory budget")
    parser.add_argument("--heap-mb", type=float, default=0.5, help="device heap for kernels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    kiln.init(arch=args.arch, budget_bytes=args.budget_mb * MiB,
              device_heap_bytes=int(args.heap_mb * MiB))
    rng = np.random.default_rng(args.seed)
    data = rng.standard_normal((args.rows, args.features))
    weights = rng.standard_normal((args.features, args.outputs))

    try:
        total, positive, final_batch, refusals = run(data, weights, batch_rows=args.rows)
    except MemoryError as e:
        print(f"not even one row fits: {e}")
        return 2

    scores = data @ weights
    ok = np.isclose(total, scores.sum(), rtol=1e-9, atol=1e-6) and positive == (scores > 0).sum()
    print(f"processed {args.rows} rows; final batch {final_batch} rows; "
          f"{len(refusals)} MemoryError(s) caught: {', '.join(n for n, _ in refusals) or 'none'}")
    print(f"sum {total:.6f} (numpy {scores.sum():.6f}); positive {positive} "
          f"(numpy {(scores > 0).sum()}): {'results OK' if ok else 'results WRONG'}")
    print(kiln.memory_summary(), end="")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
