"""kiln.testing.min_budget: the smallest memory budget under which a workload succeeds, found by
bisection over kiln.init(budget_bytes=...) (see min_budget's docstring)."""

import dataclasses
from typing import Any, Callable

from . import _kiln
from ._errors import InvalidTypeError, InvalidUsageError, OutOfMemoryError


@dataclasses.dataclass(frozen=True)
class BudgetReport:
    """What min_budget found."""

    budget_bytes: int  # the smallest budget (to `granularity_bytes`) under which fn succeeded
    peak_bytes: dict[str, int]  # per category, in the run at that budget
    refused: str  # the error of the run just below it: "BudgetExceededError: ..." ("" if none)
    refused_category: str | None  # the category of the request refused just below it
    refused_bytes: int | None  # the bytes it asked for
    runs: int  # how many times fn ran


class MinBudgetError(AssertionError):
    """min_budget could not answer: the workload fails even with the largest budget, or raises
    something other than a kiln.OutOfMemoryError under a smaller one."""


def _attempt(budget_bytes: int, fn: Callable[..., Any], args: Any, kwargs: Any,
             init_kwargs: dict[str, Any]) -> OutOfMemoryError | None:
    """Runs fn on a fresh executor with `budget_bytes`; its OutOfMemoryError, or None."""
    try:  # the executor's own set-up counts; another error is the caller's init_kwargs' own
        _kiln.init(budget_bytes=budget_bytes, **init_kwargs)
    except OutOfMemoryError as e:
        e.kiln_setup_refused = True  # type: ignore[attr-defined]  # min_budget's own mark
        return e
    try:
        fn(*args, **kwargs)
    except OutOfMemoryError as e:
        return e
    except Exception as e:
        raise MinBudgetError(f"min_budget: under a budget of {budget_bytes} bytes the workload "
                             f"raised {type(e).__name__} (not an OutOfMemoryError): {e}") from e
    return None


def min_budget(fn: Callable[..., Any], *args: Any, max_budget_bytes: int = 1 << 30,
               granularity_bytes: int = 4096, init_kwargs: dict[str, Any] | None = None,
               **kwargs: Any) -> BudgetReport:
    """The smallest kiln memory budget (bytes, to `granularity_bytes`) under which
    fn(*args, **kwargs) succeeds, by bisection between 0 and `max_budget_bytes`: each try makes a
    fresh executor, kiln.init(budget_bytes=b, **init_kwargs) (default arch "cpu"; the budget
    holds the executor's own set-up too, e.g. its device heap), then runs fn, which must make
    its arrays itself. A try succeeds when fn returns and fails when kiln.init or fn raises a
    kiln.OutOfMemoryError. Returns a BudgetReport: the budget, the peak bytes per category at it,
    and the refusal just below it. The workload must be deterministic (the bisection assumes
    that more budget never hurts). Leaves a fresh executor with the found budget current.

    Errors: MinBudgetError when fn fails even under `max_budget_bytes` (say so: raise it), or
    raises anything but an OutOfMemoryError; InvalidTypeError when fn is not callable;
    InvalidUsageError for a granularity or maximum < 1 or init_kwargs naming budget_bytes (the
    bisection sets it); kiln.init's own errors for other init_kwargs it refuses, as they are.
    Not thread-safe: it replaces the global executor."""
    if not callable(fn):
        raise InvalidTypeError(f"min_budget: fn must be callable, not {type(fn).__name__}")
    if granularity_bytes < 1 or max_budget_bytes < 1:
        raise InvalidUsageError("min_budget: granularity_bytes and max_budget_bytes must be >= 1")
    init_kwargs = dict(init_kwargs or {})
    if "budget_bytes" in init_kwargs:
        raise InvalidUsageError("min_budget: init_kwargs may not set budget_bytes: the bisection "
                                "chooses each try's budget")
    runs = 1
    refusal = _attempt(max_budget_bytes, fn, args, kwargs, init_kwargs)
    if refusal is not None:
        what = ("the executor itself does not fit" if getattr(refusal, "kiln_setup_refused", False)
                else "the workload fails even under")
        raise MinBudgetError(f"min_budget: {what} the largest budget, {max_budget_bytes} bytes: "
                             f"{type(refusal).__name__}: {refusal}")
    lo, hi = 0, max_budget_bytes  # lo fails (or is 0, untried), hi succeeds
    below: OutOfMemoryError | None = None
    while hi - lo > granularity_bytes:
        mid = lo + (hi - lo) // 2
        runs += 1
        refusal = _attempt(mid, fn, args, kwargs, init_kwargs)
        if refusal is None:
            hi = mid
        else:
            lo, below = mid, refusal
    runs += 1
    if _attempt(hi, fn, args, kwargs, init_kwargs) is not None:  # the report's run, at the answer
        raise MinBudgetError(f"min_budget: the workload succeeded once and failed once under a "
                             f"budget of {hi} bytes: it is not deterministic")
    peak = dict(_kiln.memory_stats()["peak_bytes"])
    return BudgetReport(
        budget_bytes=hi, peak_bytes=peak,
        refused="" if below is None else f"{type(below).__name__}: {str(below).splitlines()[0]}",
        refused_category=None if below is None else below.category,
        refused_bytes=None if below is None else below.requested_bytes, runs=runs)


for _public in (BudgetReport, MinBudgetError):
    _public.__module__ = "kiln.testing"  # where users import it from
