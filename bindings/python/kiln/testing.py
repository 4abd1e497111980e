"""Deterministic fault injection for tests: make allocations fail without a GPU or a full disk."""

import contextlib

from . import _kiln

__all__ = ["fail_allocation", "allocation_count", "make_error"]


@contextlib.contextmanager
def fail_allocation(at=1):
    """Inside the block, the `at`-th allocation request (1-based, counted from the start of the
    block) fails with kiln.DeviceOutOfMemoryError (driver_status "injected fault (FaultPlan)"),
    as if the driver had refused it. Every request counts: ndarrays, and each buffer a launch
    needs (argument buffer, result buffer, staging), cache hits included. The plan is cleared on
    exit, also when the block raises. Applies to the executor current at entry (kiln.init)."""
    _kiln._set_fault_at(at)  # InvalidUsageError unless at is an int >= 1
    try:
        yield
    finally:
        _kiln._clear_fault()  # FaultPlan::kNever


def allocation_count():
    """Allocation requests counted since the last fail_allocation() began (or since init)."""
    return _kiln._fault_allocation_count()


def make_error(result, oom_source="none", requested_bytes=0, device="", detail=""):
    """The exception kiln raises for a failure with this RhiResult ("error", "invalid_usage",
    "not_supported", "out_of_memory", "device_lost") and OomSource ("none", "driver", "budget",
    "device_heap", "host"), built by the same mapping as real failures. For testing handlers of
    errors the cpu and mock backends cannot produce (DeviceLostError, RuntimeFaultError)."""
    return _kiln._make_error(result, oom_source, requested_bytes, device, detail)
