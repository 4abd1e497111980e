"""Tests of batching.py, written as a user of kiln writes them, run with kiln's pytest plugin:

    pytest -p kiln.pytest_plugin --kiln-backend cpu --kiln-backend mock --kiln-budget-mb 64 \
        examples/testing            # an installed kiln needs no -p: its entry point loads it

Each test that takes `kiln_backend` runs once per --kiln-backend on a fresh executor, and fails
if it leaves kiln memory held. No GPU needed: every fault here is injected."""
import numpy as np
import pytest

import kiln
import kiln.testing
from batching import total_score

rng = np.random.default_rng(0)
DATA = rng.standard_normal((4096, 8))   # 256 KiB of float64
WEIGHTS = rng.standard_normal((8, 2))
EXPECTED = (DATA @ WEIGHTS).sum()


def test_the_total_is_numpys(kiln_backend: str) -> None:
    assert total_score(DATA, WEIGHTS) == pytest.approx(EXPECTED)


@pytest.mark.kiln_sweep
def test_any_allocation_may_fail(kiln_backend: str) -> None:
    # Run once per allocation request, that request failing: total_score must return (it halved
    # the batch) or raise kiln.OutOfMemoryError, and hold nothing afterwards.
    total_score(DATA[:64], WEIGHTS, batch_rows=16)


def test_the_sweep_report(kiln_backend: str) -> None:
    report = kiln.testing.sweep(total_score, DATA[:64], WEIGHTS, batch_rows=16)
    assert report.allocations == len(report.runs) > 4
    # Only a fault it cannot work around (the weights, a batch of one row) reaches the caller.
    assert [r.at for r in report.runs if r.raised] == [1]


def test_a_refused_scores_array_is_absorbed_by_halving_the_batch(kiln_backend: str) -> None:
    # The 3rd ndarray request: the weights, the first batch's rows, then its scores.
    with kiln.testing.inject("nth=3,category=ndarray"):
        assert total_score(DATA, WEIGHTS) == pytest.approx(EXPECTED)


def test_when_nothing_fits_it_raises_a_memory_error(kiln_backend: str) -> None:
    with kiln.testing.inject("category=ndarray"):  # every array refused, the weights first
        with pytest.raises(MemoryError):
            total_score(DATA, WEIGHTS)
    # ... and the plugin's leak check after the test shows it held nothing.


def test_it_needs_less_memory_than_its_data(kiln_backend: str) -> None:
    # The smallest budget (bisection, a fresh executor each try) holds kiln's own set-up (its
    # kernels' code, the launch's argument and result buffers) and arrays far smaller than the
    # data: halving works. A regression that held on to batches would raise it.
    report = kiln.testing.min_budget(total_score, DATA, WEIGHTS,
                                     max_budget_bytes=64 << 20,
                                     init_kwargs={"arch": kiln_backend, "device_heap_bytes": 0})
    assert report.peak_bytes["ndarray"] < DATA.nbytes // 16
    own = sum(report.peak_bytes[k] for k in ("code_object", "argument_buffer", "result_buffer"))
    assert report.budget_bytes < own + DATA.nbytes // 16
    assert report.refused_category is not None  # what was refused just below it
