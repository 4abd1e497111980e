"""Deterministic fault injection for tests: make allocations fail without a GPU or a full disk."""

import contextlib
from typing import Iterator, Literal, SupportsIndex

from . import _kiln
from ._errors import Error
from ._fake_drivers import FakeDriver, fake_cuda, fake_hip
from ._kit import KitEscapeError, check_all_closed, check_same_executor, escaped_by_init, left_open
from ._min_budget import BudgetReport, MinBudgetError, min_budget
from ._typed import typed_arguments
from ._sweep import (NondeterministicWorkloadError, ShadowedFaultError, SweepError, SweepReport,
                     SweepRun, sweep)

__all__ = ["fail_allocation", "inject", "allocation_count", "make_error", "sweep", "SweepReport",
           "SweepRun", "SweepError", "ShadowedFaultError", "NondeterministicWorkloadError",
           "min_budget", "BudgetReport", "MinBudgetError", "KitEscapeError", "fake_cuda",
           "fake_hip", "FakeDriver"]


@contextlib.contextmanager
@typed_arguments
def fail_allocation(at: SupportsIndex = 1) -> Iterator[None]:
    """Inside the block, the `at`-th allocation request (1-based, counted from the start of the
    block) fails with kiln.DeviceOutOfMemoryError (driver_status "injected fault (FaultPlan)"),
    as if the driver had refused it. Every request counts: ndarrays and the staging of a
    launch's host (numpy) operands, cache hits included (a launch needs no other memory: the
    executor holds its argument and result buffers from kiln.init on). `at` is an int >= 1
    (anything with __index__, e.g. numpy.int64; not a bool): otherwise kiln.InvalidTypeError
    or kiln.InvalidUsageError, before anything is armed.

    Blocks nest: while an inner block is open its plan applies; the requests made inside it
    still count for the outer block, whose plan is armed again when the inner block exits (if
    the outer block's `at`-th request went by inside the inner block, it does not fail later).
    Leaving the outermost block clears the plan, also when the block raises. Applies to the
    executor current at entry; kiln.init() inside a block ends every open block's plan, and the
    block then raises kiln.testing.KitEscapeError on exit (nothing after the call was failed; a
    block left by an exception gets a note saying so instead)."""
    token = _kiln._push_fault(at)
    yield from _open_block("fail_allocation", token)


@contextlib.contextmanager
@typed_arguments
def inject(spec: str) -> Iterator[None]:
    """Inside the block, allocation requests fail per the fault spec `spec`, the same text as
    kiln-ops --fault and the KILN_FAULT variable: comma-separated key=value terms, e.g.
    "nth=3" (the 3rd request from the start of the block fails), "nth=2,category=staging" (the
    2nd staging request), "min_bytes=64MiB" (every request of at least 64 MiB; units B, KiB,
    MiB, GiB), "p=0.25,seed=7" (each request with probability 0.25, drawn from splitmix64
    seeded with 7), "kernel=axpy" (only the requests of axpy's launches: an op, or one kernel
    such as "kiln_axpy_f32"). A faulted request raises kiln.DeviceOutOfMemoryError (a
    MemoryError), as if the driver had refused it; with "kind=lost" it raises
    kiln.DeviceLostError and the device stays lost (every later call raises it, after the block
    too) until the lost executor's arrays are dropped and kiln.init() makes a new executor.
    "kind=launch" and "kind=heap" count launches ("kind=launch,kernel=axpy,nth=2": the 2nd
    axpy launch): the launch raises kiln.RuntimeFaultError, or kiln.DeviceHeapExhaustedError (a
    MemoryError), and holds nothing. A malformed spec, a launch kind with category= or
    min_bytes=, or a kernel= that names no kernel raises kiln.InvalidUsageError before anything
    is armed.

    On exit (also when the block raises) the setting the block replaced is restored: blocks nest
    (inject and fail_allocation alike), and an outer spec goes on from what it had seen before
    the inner block (requests inside the inner block do not count for it). Applies to the
    executor current at entry; kiln.init() inside a block ends every open block's plan, and the
    block then raises kiln.testing.KitEscapeError on exit (as fail_allocation's does)."""
    token = _kiln._push_inject(spec)
    yield from _open_block("inject", token)


def _open_block(call: str, token: int) -> Iterator[None]:
    """The body of the fault block `token` just pushed: pops it on exit (and the blocks opened
    inside it that were never left), and raises KitEscapeError when kiln.init replaced the
    executor meanwhile or a block inside was never left (notes on an exception leaving the
    block instead)."""
    device = _kiln.current_device()  # the block's device, whatever is current at its exit
    generation = _kiln._executor_generation(device)  # after the push: it opened the device
    try:
        yield
    except BaseException as e:
        unclosed = _kiln._pop_fault(token)[1]
        if _kiln._executor_generation(device, open=False) != generation:
            e.add_note(escaped_by_init(call))
        if unclosed:
            e.add_note(left_open(call, unclosed))
        raise
    unclosed = _kiln._pop_fault(token)[1]
    check_same_executor(call, generation, device)
    check_all_closed(call, unclosed)


@typed_arguments
def allocation_count() -> int:
    """Allocation requests counted since the innermost open fail_allocation() block began;
    outside blocks, since the last block ended (or since init)."""
    return _kiln._fault_allocation_count()


@typed_arguments
def make_error(
    result: Literal["error", "invalid_usage", "not_supported", "out_of_memory", "device_lost"],
    oom_source: Literal["none", "driver", "budget", "device_heap", "host"] = "none",
    requested_bytes: SupportsIndex = 0, device: str = "", detail: str = "",
) -> Error:
    """The exception kiln raises for a failure with this RhiResult ("error", "invalid_usage",
    "not_supported", "out_of_memory", "device_lost") and OomSource ("none", "driver", "budget",
    "device_heap", "host"), built by the same mapping as real failures. For testing handlers of
    errors the cpu and mock backends cannot produce (DeviceLostError, RuntimeFaultError)."""
    return _kiln._make_error(result, oom_source, requested_bytes, device, detail)
