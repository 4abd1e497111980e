"""A small library to copy: sums a data set's scores on a kiln device in batches, halving the
batch whenever it does not fit. `test_batching.py` beside it is its test file: the pytest
plugin's fixture and leak check, a sweep that fails each allocation in turn, the smallest
budget the function needs, and one targeted fault.

    total_score(data, weights)  ==  (data @ weights).sum()      (up to rounding)
"""
import numpy as np
import numpy.typing as npt

import kiln


def score_batch(rows: npt.NDArray[np.float64], weights: kiln.ndarray) -> float:
    """sum(rows @ weights) on the device; rows (n, k) float64, weights (k, m) on the device.
    Frees what it made before returning, also when an allocation or a launch fails.
    Errors: kiln.OutOfMemoryError (a MemoryError) when the batch does not fit."""
    x = kiln.from_numpy(rows)
    try:
        scores = kiln.matmul(x, weights)
        try:
            return kiln.reduce_sum(scores)
        finally:
            scores.free()
    finally:
        x.free()


def total_score(data: npt.NDArray[np.float64], weights: npt.NDArray[np.float64],
                batch_rows: int = 4096) -> float:
    """sum(data @ weights) for data (n, k) and weights (k, m), float64, computed in batches of
    at most `batch_rows` rows; a batch refused with kiln.OutOfMemoryError is retried at half
    the size. Holds nothing on the device when it returns or raises.
    Errors: kiln.OutOfMemoryError when even one row (or the weights) does not fit; other kiln
    errors (InvalidUsageError for mismatched shapes) as raised, never retried."""
    device_weights = kiln.from_numpy(weights)
    try:
        total, start = 0.0, 0
        while start < len(data):
            rows = data[start:start + batch_rows]
            try:
                total += score_batch(rows, device_weights)
            except kiln.OutOfMemoryError:
                if batch_rows == 1:
                    raise
                batch_rows //= 2
                continue
            start += len(rows)
        return total
    finally:
        device_weights.free()
