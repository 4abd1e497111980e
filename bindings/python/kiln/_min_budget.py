"""kiln.testing.min_budget: the smallest memory budget under which a workload succeeds, found by
bisection over kiln.init(budget_bytes=...) (see min_budget's docstring)."""

import dataclasses
import operator
from typing import Any, Callable, Mapping

from . import _kiln
from ._errors import InvalidTypeError, InvalidUsageError, OutOfMemoryError
from ._typed import typed_arguments
from ._kit import KitEscapeError, kit_call, threads_left, threads_now


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
    """Runs fn on a fresh executor with `budget_bytes`; its OutOfMemoryError, or None.
    Errors: MinBudgetError when the try did not test that budget (fn replaced the executor, left
    threads running, or raised an injected fault or another error); KitEscapeError as fn
    raised it."""
    try:  # the executor's own set-up counts; another error is the caller's init_kwargs' own
        _kiln.init(budget_bytes=budget_bytes, **init_kwargs)
    except OutOfMemoryError as e:
        e.kiln_setup_refused = True  # type: ignore[attr-defined]  # min_budget's own mark
        return e
    generation = _kiln._executor_generation()
    threads = threads_now()
    refusal: OutOfMemoryError | None = None
    try:
        fn(*args, **kwargs)
    except KitEscapeError:
        raise
    except OutOfMemoryError as e:
        refusal = e
    except Exception as e:
        raise MinBudgetError(f"min_budget: under a budget of {budget_bytes} bytes the workload "
                             f"raised {type(e).__name__} (not an OutOfMemoryError): {e}") from e
    _check_tested(budget_bytes, generation, threads, refusal)
    return refusal


def _check_tested(budget_bytes: int, generation: int, threads: set[Any],
                  refusal: OutOfMemoryError | None) -> None:
    """Raises MinBudgetError when the try under `budget_bytes` did not test that budget."""
    if _kiln._executor_generation() != generation:
        raise MinBudgetError(
            f"min_budget: the workload called kiln.init (or made another executor) while it ran "
            f"under a budget of {budget_bytes} bytes: it ran on an executor whose budget "
            f"min_budget did not set, so that budget was not tested; let min_budget make the "
            f"executor (pass kiln.init's other options as init_kwargs)")
    left = threads_left(threads)
    if left:
        raise MinBudgetError(
            f"min_budget: the workload left thread(s) running after it returned ({', '.join(left)})"
            f": what they allocate would count against later tries' budgets; join every thread "
            f"the workload starts")
    if refusal is not None and refusal.injected:
        raise MinBudgetError(
            f"min_budget: under a budget of {budget_bytes} bytes the workload raised an injected "
            f"fault ({type(refusal).__name__}: {str(refusal).splitlines()[0]}): a fault plan "
            f"(kiln.testing.inject, fail_allocation, KILN_FAULT) made it, not the budget, so it "
            f"says nothing about the budget the workload needs") from refusal


@typed_arguments
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
    A try tests its budget only when fn runs on the executor min_budget made: fn calling kiln.init,
    leaving threads running after it returns, or raising an injected fault (kiln.testing.inject,
    fail_allocation, KILN_FAULT: e.injected) raises MinBudgetError; sweep or min_budget called
    inside fn raises KitEscapeError. Not thread-safe: it replaces the current device's executor."""
    if not callable(fn):
        raise InvalidTypeError(f"min_budget: fn must be callable, not {type(fn).__name__}")
    with kit_call("min_budget"):
        return _min_budget(fn, args, kwargs, max_budget_bytes, granularity_bytes, init_kwargs)


def _byte_count(value: Any, name: str) -> int:
    """`value` as an int (anything with __index__; not a bool). Errors: InvalidTypeError."""
    if isinstance(value, bool):
        raise InvalidTypeError(f"min_budget: {name} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError as e:
        raise InvalidTypeError(f"min_budget: {name} must be an int, not "
                               f"{type(value).__name__}") from e


def _min_budget(fn: Callable[..., Any], args: Any, kwargs: Any, max_budget_bytes: int,
                granularity_bytes: int, init_kwargs: dict[str, Any] | None) -> BudgetReport:
    max_budget_bytes = _byte_count(max_budget_bytes, "max_budget_bytes")
    granularity_bytes = _byte_count(granularity_bytes, "granularity_bytes")
    if init_kwargs is not None and not isinstance(init_kwargs, Mapping):
        raise InvalidTypeError(f"min_budget: init_kwargs must be a dict of kiln.init's arguments "
                               f"or None, not {type(init_kwargs).__name__}")
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
