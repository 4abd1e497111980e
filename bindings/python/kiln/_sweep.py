"""kiln.testing.sweep: run a workload once per allocation request it makes, with that one
failing, and check kiln's contract after each run (see sweep's docstring)."""

import dataclasses
import gc
from typing import Any, Callable

from . import _kernels, _kiln
from ._errors import InvalidTypeError, OutOfMemoryError
from ._typed import typed_arguments
from ._kit import KitEscapeError, check_all_closed, kit_call, threads_left, threads_now

# Armed for the counting run: a request number no workload reaches.
_NEVER = 1 << 62


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: allocation request `at` (1-based) failed."""

    at: int
    raised: str | None  # the exception's class name, or None when the workload succeeded anyway
    category: str | None  # the refused request's category, as the kiln error names it
    detail: str  # the exception's message ("" when none was raised)
    leaked_bytes: dict[str, int]  # category -> bytes held above the baseline after the run
    raised_oom: bool = False  # what was raised is a kiln.OutOfMemoryError

    @property
    def ok(self) -> bool:
        """Succeeded or raised a kiln out-of-memory error, and held nothing more than before."""
        raised_ok = self.raised is None or self.raised_oom
        return raised_ok and not self.leaked_bytes


@dataclasses.dataclass(frozen=True)
class SweepReport:
    """What sweep() saw: the allocation requests of the clean run and one SweepRun each."""

    allocations: int
    runs: tuple[SweepRun, ...]

    @property
    def broken(self) -> tuple[SweepRun, ...]:
        """The runs that broke the contract."""
        return tuple(r for r in self.runs if not r.ok)

    def __str__(self) -> str:
        lines = [f"sweep: {self.allocations} allocation request(s), {len(self.runs)} run(s), "
                 f"{len(self.broken)} broke the contract"]
        for r in self.broken:
            what = "succeeded" if r.raised is None else f"raised {r.raised}: {r.detail}"
            leak = ", ".join(f"{k} {v} B" for k, v in sorted(r.leaked_bytes.items()))
            lines.append(f"  request {r.at} failed ({r.category or 'category unknown'}): {what}"
                         + (f"; left held: {leak}" if leak else ""))
        return "\n".join(lines)


class SweepError(AssertionError):
    """A sweep found a run that broke the contract; `report` says which and how."""

    def __init__(self, message: str, report: SweepReport | None = None):
        super().__init__(message)
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:  # pickles with its report
        return (type(self), (str(self), self.report))


class ShadowedFaultError(SweepError):
    """The request a run aimed at went by inside the workload's own kiln.testing.fail_allocation
    or inject block, whose plan replaced the sweep's while it was open: the sweep failed nothing
    in that run, so it tested nothing there. `at` is the request."""

    def __init__(self, message: str, report: SweepReport | None = None, at: int = 0):
        super().__init__(message, report)
        self.at = at

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.report, self.at))


class NondeterministicWorkloadError(SweepError):
    """The workload made fewer allocation requests in a run than the sweep armed a fault for:
    it does not allocate the same way each time (so a sweep cannot aim at each request)."""


def _held_bytes() -> dict[str, int]:
    """Bytes kiln holds per category, the caching pool's own blocks and the code of the user
    kernels kiln's compile cache keeps (a kernel compiled in a test is cached, not leaked) left
    out."""
    gc.collect()  # arrays in reference cycles (e.g. a traceback's frames) are freed first
    current = dict(_kiln.memory_stats()["current_bytes"])
    current["code_object"] = current.get("code_object", 0) - _kernels._cached_code_bytes()
    return {k: v for k, v in current.items() if k != "pool_cache"}


def _held_above(baseline: dict[str, int]) -> dict[str, int]:
    """Bytes held now above `baseline` (a _held_bytes() reading), per category that grew."""
    held = _held_bytes()
    return {k: v - baseline.get(k, 0) for k, v in held.items() if v > baseline.get(k, 0)}


@dataclasses.dataclass
class _Ended:
    """How a run under a sweep's block ended, read before anything else happens."""

    count: int = 0  # the requests it made
    shadowed: bool = False  # its request went by inside the workload's own fault block
    unclosed: int = 0  # fault blocks the workload entered and never left
    threads_left: list[str] = dataclasses.field(default_factory=list)


def _end_block(token: int, threads: set[Any]) -> _Ended:
    """Pops the sweep's block `token`. The threads still running are read first: one that ends
    meanwhile would have made requests no run was aimed at."""
    ended = _Ended(threads_left=threads_left(threads))
    ended.count = _kiln._fault_allocation_count()
    ended.shadowed, ended.unclosed = _kiln._pop_fault(token)
    return ended


def _check_ended(ended: _Ended, run: str, report: SweepReport) -> None:
    """Raises the kit error for a run that left threads running or a fault block open."""
    if ended.threads_left:
        raise SweepError(
            f"sweep: {run} of the workload left thread(s) running after it returned "
            f"({', '.join(ended.threads_left)}): their allocation requests would fall into later "
            f"runs, so no run could aim at one request; join every thread the workload starts", report)
    check_all_closed("sweep", ended.unclosed)


def _run_with_fault(at: int, fn: Callable[..., Any], args: Any, kwargs: Any,
                    baseline: dict[str, int], threads: set[Any]) -> tuple[SweepRun, _Ended]:
    """Runs fn with request `at` failing: its SweepRun and how its block ended."""
    token = _kiln._push_fault(at)
    error: BaseException | None = None
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: B902 - every exception is the sweep's to judge
        error = e
    finally:
        ended = _end_block(token, threads)
    raised = None if error is None else type(error).__name__
    detail = "" if error is None else str(error).splitlines()[0] if str(error) else ""
    category = getattr(error, "category", None) if isinstance(error, OutOfMemoryError) else None
    oom = isinstance(error, OutOfMemoryError)
    if error is not None and not isinstance(error, Exception):
        raise error  # KeyboardInterrupt, SystemExit: not the workload's answer
    del error
    return SweepRun(at, raised, category, detail, _held_above(baseline), oom), ended


def _check_same_executor(generation: int, run: str, report: SweepReport) -> None:
    """Raises SweepError when kiln.init replaced the executor since `generation` was read."""
    if _kiln._executor_generation() != generation:
        raise SweepError(
            f"sweep: {run} of the workload called kiln.init: the sweep's fault was armed on the "
            f"executor it replaced, so the run tested nothing; make the executor before the sweep "
            f"(the kiln_backend fixture does)", report)


def _check_not_shadowed(at: int, shadowed: bool, report: SweepReport) -> None:
    if shadowed:
        raise ShadowedFaultError(
            f"sweep: run {at}: allocation request {at} went by inside the workload's own "
            f"kiln.testing.fail_allocation or inject block, whose plan replaced the sweep's: the "
            f"sweep failed nothing in that run, so it tested nothing there; sweep a workload "
            f"without fault blocks of its own", report, at)


@typed_arguments
def sweep(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> SweepReport:
    """Runs fn(*args, **kwargs) once to count its allocation requests (N), then N more times,
    the i-th time with request i failing (kiln.DeviceOutOfMemoryError, as
    kiln.testing.fail_allocation(at=i) gives). After each run it checks kiln's contract for the
    workload: fn either returned or raised a kiln.OutOfMemoryError (not another exception), and
    the bytes kiln holds per category (the caching pool left out) are back at what they were
    before the sweep. Returns a SweepReport (N, and per run the request that failed, its category,
    what was raised, what was left held).

    Errors: InvalidTypeError when fn is not callable; SweepError (with .report) when a run broke
    the contract, raised after every run, when the clean run itself raises (from that
    exception), or when it made no allocation request (nothing would be tested);
    NondeterministicWorkloadError when a run made fewer than i requests (the workload does not allocate the same way each time).
    Nothing stays armed after sweep returns or raises. fn runs on the executor current at the
    call; it must not call kiln.init: a run that replaced the executor raises SweepError (the
    fault was armed on the executor it replaced, so nothing was tested). Neither may a run leave
    threads running after it returns (SweepError naming them: their requests would land in later
    runs); threads it joins are fine, their requests count. A run whose request went by inside
    the workload's own fail_allocation or inject block raises ShadowedFaultError (that block's
    plan replaced the sweep's, so nothing failed). sweep or min_budget called inside fn raises
    KitEscapeError. Not thread-safe: no other thread may allocate meanwhile."""
    if not callable(fn):
        raise InvalidTypeError(f"sweep: fn must be callable, not {type(fn).__name__}")
    with kit_call("sweep"):
        return _sweep(fn, args, kwargs)


def _sweep(fn: Callable[..., Any], args: Any, kwargs: Any) -> SweepReport:
    baseline = _held_bytes()
    threads = threads_now()
    generation = _kiln._executor_generation()
    token = _kiln._push_fault(_NEVER)
    try:
        fn(*args, **kwargs)
    except KitEscapeError:
        raise  # the workload ran a kit call of its own: that error says so
    except Exception as e:
        raise SweepError(f"sweep: the workload fails without any fault: {type(e).__name__}: {e}") from e
    finally:
        ended = _end_block(token, threads)
    allocations = ended.count
    _check_same_executor(generation, "the clean run", SweepReport(allocations, ()))
    _check_ended(ended, "the clean run", SweepReport(allocations, ()))
    if allocations == 0:  # a sweep that fails nothing tests nothing: never a pass
        raise SweepError(
            "sweep: the workload made no allocation request, so there is nothing to fail and "
            "nothing was tested (a launch requests only staging for host (numpy) operands; the "
            "executor's own buffers are made by kiln.init)", SweepReport(0, ()))
    runs: list[SweepRun] = []
    for at in range(1, allocations + 1):
        run, ended = _run_with_fault(at, fn, args, kwargs, baseline, threads)
        count = ended.count
        _check_same_executor(generation, f"run {at}", SweepReport(allocations, tuple(runs)))
        _check_ended(ended, f"run {at}", SweepReport(allocations, tuple(runs)))
        _check_not_shadowed(at, ended.shadowed, SweepReport(allocations, tuple(runs)))
        if count < at:
            report = SweepReport(allocations, tuple(runs))
            raise NondeterministicWorkloadError(
                f"sweep: run {at} made {count} allocation request(s), the clean run {allocations}: "
                f"the workload does not allocate the same way each time", report)
        runs.append(run)
    report = SweepReport(allocations, tuple(runs))
    if report.broken:
        raise SweepError(str(report), report)
    return report


for _public in (SweepRun, SweepReport, SweepError, ShadowedFaultError,
                NondeterministicWorkloadError):
    _public.__module__ = "kiln.testing"  # where users import it from
