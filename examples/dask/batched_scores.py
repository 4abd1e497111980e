"""A batched workload on a Dask LocalCluster: 2 worker processes, each with its own kiln device
(kiln.dask.KilnPlugin), a budget small enough that the first try of every chunk is refused, and
kiln.dask.retry halving the batch until it fits. The scores come back as kiln arrays and are
checked against numpy.

    python3 examples/dask/batched_scores.py                  # cpu on both workers
    python3 examples/dask/batched_scores.py --fake-cuda build/lib/libkiln_fake_cuda.so
                                                             # cuda:0 and cuda:1 of the fake driver

Without --fake-cuda, KILN_FAKE_CUDA_LIBRARY (if set) names the fake CUDA driver; on a machine
with GPUs, pass --arch cuda instead.
"""

import argparse
import logging
import os
from typing import Any

import numpy as np
from distributed import Client, LocalCluster

import kiln
import kiln.dask

COLUMNS = 64


def chunk_rows(start: int, rows: int) -> "np.ndarray[Any, np.dtype[np.float32]]":
    """The chunk's input, the same wherever it is made (seeded by its first row)."""
    return np.random.default_rng(start).standard_normal((rows, COLUMNS), dtype=np.float32)


def weights() -> "np.ndarray[Any, np.dtype[np.float32]]":
    return np.linspace(-1.0, 1.0, COLUMNS, dtype=np.float32).reshape(COLUMNS, 1)


def scores(start: int, rows: int, batch_rows: int) -> tuple[kiln.ndarray, int]:
    """The scores of rows [start, start + rows) on this worker's device, batch_rows at a time:
    (a kiln array of shape (rows, 1), the batch size that fitted)."""
    host = chunk_rows(start, rows)
    w = kiln.from_numpy(weights())
    out = np.empty((rows, 1), dtype=np.float32)
    for lo in range(0, rows, batch_rows):
        batch = kiln.from_numpy(host[lo:lo + batch_rows])     # refused when it does not fit
        out[lo:lo + batch_rows] = kiln.matmul(batch, w).to_numpy()
        batch.free()
    return kiln.from_numpy(out), batch_rows


def halve_batch(error: kiln.Error, attempt: int, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    start, rows, batch_rows = args
    return (start, rows, batch_rows // 2), kwargs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-cuda", default=os.environ.get("KILN_FAKE_CUDA_LIBRARY"),
                        help="the fake CUDA driver library: 2 fake devices, one per worker")
    parser.add_argument("--arch", default=None, help="cpu, cuda, amdgpu (default: cuda with "
                        "--fake-cuda, else cpu)")
    parser.add_argument("--rows", type=int, default=1 << 18)
    parser.add_argument("--chunk-rows", type=int, default=1 << 16)
    parser.add_argument("--budget-mb", type=float, default=16)
    args = parser.parse_args()

    env = {}
    arch = args.arch or ("cuda" if args.fake_cuda else "cpu")
    if args.fake_cuda:
        env = {"KILN_CUDA_DRIVER": os.path.abspath(args.fake_cuda), "KILN_FAKE_CUDA_DEVICES": "2"}
    # (distributed 2022.12 is not typed: mypy --strict wants its calls marked)
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,  # type: ignore[no-untyped-call]
                      dashboard_address=None, silence_logs=logging.ERROR, env=env) as cluster, \
            Client(cluster) as client:  # type: ignore[no-untyped-call]
        client.register_worker_plugin(kiln.dask.KilnPlugin(
            arch=arch, budget_bytes=int(args.budget_mb * (1 << 20)), device_heap_bytes=1 << 20))
        devices = sorted(client.run(kiln.dask.worker_device).values())
        print("devices:", devices)
        if args.fake_cuda and devices != ["cuda:0", "cuda:1"]:
            print("each worker should have its own fake CUDA device")
            return 1
        step = kiln.dask.retry(scores, retry_on=(kiln.BudgetExceededError,), retries=6,
                               backoff=halve_batch)
        starts = list(range(0, args.rows, args.chunk_rows))
        futures = [client.submit(step, s, min(args.chunk_rows, args.rows - s), args.chunk_rows)
                   for s in starts]
        retried = 0
        for start, future in zip(starts, futures):
            result, batch_rows = future.result()
            rows = min(args.chunk_rows, args.rows - start)
            expected = chunk_rows(start, rows) @ weights()
            if not np.allclose(result.to_numpy(), expected, rtol=1e-4, atol=1e-4):
                print(f"chunk at row {start}: wrong scores")
                return 1
            while batch_rows < args.chunk_rows:   # one refusal per halving
                batch_rows *= 2
                retried += 1
    print(f"{len(starts)} chunks on 2 workers; {retried} refused batch(es) retried smaller")
    print("results OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
