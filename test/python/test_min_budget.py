"""kiln.testing.min_budget: the smallest budget a deterministic workload succeeds under agrees
with a bisection done here by hand; the report names the peak per category and the refusal just
below; a workload that fails even under the largest budget, or raises something else, is a
named error."""
import pytest

import kiln
import kiln.testing

MiB = 1 << 20
INIT = {"arch": "mock", "device_heap_bytes": 64 << 10, "caching": False}


def workload():
    a = kiln.ndarray(kiln.f32, MiB // 4)      # 1 MiB
    b = kiln.ndarray(kiln.f32, 3 * MiB // 4)  # 3 MiB, while a is held
    b.free()
    a.free()


def succeeds(budget):
    try:
        kiln.init(budget_bytes=budget, **INIT)
        workload()
        return True
    except MemoryError:
        return False


def test_min_budget_agrees_with_a_bisection_by_hand():
    report = kiln.testing.min_budget(workload, max_budget_bytes=64 * MiB,
                                     granularity_bytes=4096, init_kwargs=INIT)
    lo, hi = 0, 64 * MiB  # by hand: the same invariant, lo fails and hi succeeds
    while hi - lo > 4096:
        mid = lo + (hi - lo) // 2
        if succeeds(mid):
            hi = mid
        else:
            lo = mid
    assert report.budget_bytes == hi
    assert succeeds(report.budget_bytes) and not succeeds(report.budget_bytes - 4096)
    assert report.peak_bytes["ndarray"] == 4 * MiB
    assert report.refused.startswith("BudgetExceededError")
    assert report.refused_category == "ndarray" and report.refused_bytes == 3 * MiB
    assert report.runs >= 10


def test_a_workload_that_fails_under_the_largest_budget_is_a_named_error():
    def too_big():
        kiln.ndarray(kiln.f32, 16 * MiB).free()  # 64 MiB

    with pytest.raises(kiln.testing.MinBudgetError, match="even under the largest budget"):
        kiln.testing.min_budget(too_big, max_budget_bytes=8 * MiB, init_kwargs=INIT)


def test_an_executor_that_does_not_fit_the_largest_budget_is_named_as_such():
    # kiln's own set-up (its device heap), not the workload, is what does not fit.
    with pytest.raises(kiln.testing.MinBudgetError,
                       match="the executor itself does not fit the largest budget, 65536 bytes"):
        kiln.testing.min_budget(workload, max_budget_bytes=64 << 10,
                                init_kwargs={"arch": "cpu", "device_heap_bytes": 1 << 20})


def test_a_workload_raising_something_else_is_a_named_error():
    def wrong():
        workload()
        raise KeyError("not memory")

    with pytest.raises(kiln.testing.MinBudgetError, match="KeyError"):
        kiln.testing.min_budget(wrong, max_budget_bytes=8 * MiB, init_kwargs=INIT)


def test_bad_arguments_are_invalid_usage():
    with pytest.raises(kiln.InvalidUsageError):
        kiln.testing.min_budget(workload, granularity_bytes=0)
    # The caller's own mistakes are named as such, up front, not blamed on the workload.
    with pytest.raises(kiln.InvalidTypeError, match="fn must be callable, not int"):
        kiln.testing.min_budget(3)
    with pytest.raises(kiln.InvalidUsageError, match="may not set budget_bytes"):
        kiln.testing.min_budget(workload, init_kwargs={"budget_bytes": 1})
    with pytest.raises(kiln.InvalidTypeError) as unknown:
        kiln.testing.min_budget(workload, init_kwargs={"nosuch": 1})
    assert not isinstance(unknown.value, kiln.testing.MinBudgetError)
