"""kiln.testing.sweep over the adaptive-batching example (examples/adaptive_batch.py): the
example keeps kiln's contract under a fault at every allocation; a variant that leaks and one
that turns an out-of-memory error into another exception are caught, each named in the report;
a non-deterministic workload and one that fails with no fault are named errors, nothing armed."""
import importlib.util
import os

import numpy as np
import pytest

import kiln
import kiln.testing

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "adaptive_batch.py")


def load_example():
    spec = importlib.util.spec_from_file_location("adaptive_batch", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def example():
    kiln.init(arch="cpu", budget_bytes=64 << 20, device_heap_bytes=1 << 20)
    module = load_example()
    rng = np.random.default_rng(0)
    return module, rng.standard_normal((16, 4)), rng.standard_normal((4, 2))


def test_the_examples_batching_loop_keeps_the_contract_at_every_allocation(example, capsys):
    module, data, weights = example
    report = kiln.testing.sweep(module.run, data, weights, batch_rows=16)
    # the weights, then the batch's rows, scores and positives: launches request nothing
    assert report.allocations == 4
    assert len(report.runs) == report.allocations
    assert [r.at for r in report.runs] == list(range(1, report.allocations + 1))
    assert not report.broken
    # A fault the batching loop cannot absorb (the weights, a batch of one row) is raised as an
    # OutOfMemoryError; the others are absorbed by halving the batch.
    assert all(r.raised in (None, "DeviceOutOfMemoryError") for r in report.runs)
    assert any(r.raised is None for r in report.runs)
    assert kiln.testing.allocation_count() >= 0  # nothing armed: the next allocation works
    kiln.ndarray(kiln.f32, 4).free()


def test_a_leaking_variant_is_caught_with_what_it_left(example, capsys):
    module, data, weights = example
    kept = []

    def leaky_batch(rows, w):
        x = kiln.from_numpy(rows)
        kept.append(x)  # never freed: a leak once the batch fails
        scores = kiln.matmul(x, w)
        total = kiln.reduce_sum(scores)
        scores.free()
        kept.remove(x)
        x.free()
        return total, 0

    def leaky_run():
        w = kiln.from_numpy(weights)
        try:
            leaky_batch(data, w)
        except MemoryError:
            pass
        finally:
            w.free()

    with pytest.raises(kiln.testing.SweepError) as caught:
        kiln.testing.sweep(leaky_run)
    report = caught.value.report
    assert report is not None and report.broken
    assert any(r.leaked_bytes.get("ndarray", 0) > 0 for r in report.broken)
    assert "left held: ndarray" in str(caught.value)


def test_a_variant_that_turns_oom_into_another_error_is_caught(example, capsys):
    module, data, weights = example

    def wrongly_catching():
        try:
            module.run(data, weights, batch_rows=1)
        except MemoryError as e:
            raise RuntimeError("batch failed") from e

    with pytest.raises(kiln.testing.SweepError) as caught:
        kiln.testing.sweep(wrongly_catching)
    broken = caught.value.report.broken
    assert broken and all(r.raised == "RuntimeError" for r in broken)
    assert "raised RuntimeError: batch failed" in str(caught.value)


def test_a_nondeterministic_workload_is_a_named_error_leaving_nothing_armed():
    kiln.init(arch="cpu")
    calls = []

    def shrinking():
        calls.append(1)
        arrays = [kiln.ndarray(kiln.f32, 4) for _ in range(max(1, 4 - len(calls)))]
        for a in arrays:
            a.free()

    with pytest.raises(kiln.testing.NondeterministicWorkloadError, match="does not allocate"):
        kiln.testing.sweep(shrinking)
    for _ in range(8):  # nothing armed
        kiln.ndarray(kiln.f32, 4).free()


def test_a_workload_that_fails_with_no_fault_is_a_named_error():
    kiln.init(arch="cpu")

    def broken():
        raise ValueError("not a kiln problem")

    with pytest.raises(kiln.testing.SweepError, match="fails without any fault") as caught:
        kiln.testing.sweep(broken)
    assert isinstance(caught.value.__cause__, ValueError)
    kiln.ndarray(kiln.f32, 4).free()


def test_a_workload_that_calls_init_is_refused_not_passed():
    # Its faults were armed on the executor it replaces: no run would test anything.
    kiln.init(arch="cpu")

    def reinit_then_allocate():
        kiln.init(arch="cpu")
        kiln.ndarray(kiln.f32, 16).free()

    with pytest.raises(kiln.testing.SweepError, match="the clean run of the workload called "
                                                      "kiln.init"):
        kiln.testing.sweep(reinit_then_allocate)
    kiln.ndarray(kiln.f32, 4).free()  # nothing left armed


def test_a_workload_that_calls_init_only_in_a_faulted_run_is_refused():
    kiln.init(arch="cpu")

    def reinit_when_refused():
        try:
            kiln.ndarray(kiln.f32, 16).free()
        except MemoryError:
            kiln.init(arch="cpu")  # "recovers" onto a fresh, unarmed executor

    with pytest.raises(kiln.testing.SweepError, match="run 1 of the workload called kiln.init"):
        kiln.testing.sweep(reinit_when_refused)


def test_a_callable_is_checked_before_anything_runs():
    kiln.init(arch="cpu")
    with pytest.raises(kiln.InvalidTypeError, match="fn must be callable, not int"):
        kiln.testing.sweep(3)


def test_a_workload_that_allocates_nothing_is_refused_not_passed():
    # Nothing to fail, so nothing tested: a launch on device arrays requests no memory.
    kiln.init(arch="cpu")
    x = kiln.ndarray(kiln.f32, 16)
    with pytest.raises(kiln.testing.SweepError, match="made no allocation request") as caught:
        kiln.testing.sweep(lambda: kiln.fill(x, 1.0))
    assert caught.value.report.allocations == 0 and caught.value.report.runs == ()
    x.free()
