"""The named errors of kiln as Python exceptions.

One class per C++ ``kiln::ErrorKind`` (executor/errors.h); the extension module maps each failure
to exactly one of them (bindings/python/error_mapping.cpp, the only place that does). Hierarchy::

    Error(Exception)
    +-- OutOfMemoryError(Error, MemoryError)
    |   +-- DeviceOutOfMemoryError     the driver refused (or an injected fault)
    |   +-- BudgetExceededError        kiln's budget or the live free-memory check refused
    |   +-- DeviceHeapExhaustedError   the device-side heap ran out while a kernel ran
    |   +-- HostOutOfMemoryError       host memory could not be had
    +-- InvalidUsageError(Error, ValueError)
    |   +-- InvalidTypeError(InvalidUsageError, TypeError)   an argument of the wrong type
    |   +-- KernelCompileError         a user kernel's code does not compile (line, column)
    +-- NotSupportedError(Error, NotImplementedError)
    +-- DeviceLostError(Error, RuntimeError)
    +-- RuntimeFaultError(Error, RuntimeError)

Every instance carries the failure detail as attributes (``FIELDS``); sizes are in bytes and are
``None`` where the failure had no memory picture. ``str(e)`` is the message, at most
``MAX_MESSAGE_CHARS`` characters (a longer one keeps its head and tail; the attributes keep
everything). Instances survive ``pickle`` with their class and attributes, and rebuild from
``type(e)("Long error message", text)``, the call Dask's distributed makes to shorten an error
(``distributed.utils.truncate_exception``). The attributes are typed on ``Error`` (for
mypy: ``except kiln.BudgetExceededError as e: e.requested_bytes`` is an ``int``).
"""

from typing import Any, Callable, TypeVar

__all__ = [
    "Error", "OutOfMemoryError", "DeviceOutOfMemoryError", "BudgetExceededError",
    "DeviceHeapExhaustedError", "HostOutOfMemoryError", "InvalidUsageError", "InvalidTypeError",
    "KernelCompileError", "NotSupportedError", "DeviceLostError", "RuntimeFaultError",
]

# name -> default. The defaults are what an instance made by hand (not by kiln) reports. Each one
# is declared with its type on Error below.
FIELDS: dict[str, Any] = {
    "requested_bytes": 0,   # bytes the failed request asked for
    "class_bytes": 0,       # the pool's size class when it was larger and did not fit either
    "budget_check": "none", # which budget check refused: "limit", "live_free" (else "none")
    "device": "",           # "cpu", "mock", "cuda:0"
    "category": "",         # an OOM's request: "ndarray", "staging", "runtime_heap", ...; else ""
    "free_bytes": None,     # live free device memory at the failure (None: not read)
    "total_bytes": None,    # total device memory (None: not read)
    "limit_bytes": None,    # kiln's budget for the device
    "reserve_bytes": None,  # headroom kept free (set when the live check refused)
    "live_age_ms": None,    # ms from reading free/total to the failure (0: read for it; None: not read)
    "in_use_bytes": None,   # dict: category -> bytes kiln held at the failure
    "site": "",             # the function that refused, e.g. "MemoryBudget::reserve"
    "driver_status": "",    # the driver's own status name, e.g. "MOCK_ERROR_OUT_OF_MEMORY"
    "result": "",           # the RhiResult: "out_of_memory", "invalid_usage", ...
    "oom_source": "",       # "driver", "budget", "device_heap", "host" or "none"
    "detail": "",           # what was wrong (invalid usage, runtime faults)
    "context": (),          # lines added on the way up, innermost first
    "advice": "",           # what to do, naming kiln.init's arguments (also in str(e))
    "injected": False,      # a fault plan made it (kiln.testing, KILN_FAULT), not the device
}


_E = TypeVar("_E", bound="Error")

# The longest str(e): under distributed's default distributed.admin.max-error-length (10,000
# characters), so Dask never shortens a kiln error and its attributes cross with it. A longer
# message (a user kernel's line quoted in a compile error, a device name given by a caller)
# keeps its first and last characters, the advice being at the end.
MAX_MESSAGE_CHARS = 8000
_TAIL_CHARS = 2000


def _capped(message: str) -> str:
    """`message`, or its head and tail with the number of characters cut between them, when it
    is longer than MAX_MESSAGE_CHARS (the result is then exactly that long)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    cut, marker = 0, ""
    while cut != len(message) - MAX_MESSAGE_CHARS + len(marker):  # the marker is cut's too
        cut = len(message) - MAX_MESSAGE_CHARS + len(marker)
        marker = f" ... [{cut} characters cut] ... "
    head = MAX_MESSAGE_CHARS - _TAIL_CHARS - len(marker)
    return message[:head] + marker + message[len(message) - _TAIL_CHARS:]


def _rebuild(cls: type[_E], message: str, fields: dict[str, Any]) -> _E:
    """Unpickles an Error: the same class, message and attributes."""
    return cls(message, **fields)


class Error(Exception):
    """Base of every kiln exception. ``str(e)`` is the message (at most MAX_MESSAGE_CHARS
    characters; the positional arguments joined by ": " when there are several).

    The attributes (set on every instance; sizes in bytes, None where the failure had no memory
    picture) are those of ``FIELDS``, typed here."""

    requested_bytes: int                 # bytes the failed request asked for
    class_bytes: int                     # the pool's size class when larger and refused too
    budget_check: str                    # which budget check refused: "limit", "live_free", "none"
    device: str                          # "cpu", "mock", "cuda:0"
    category: str                        # an OOM's request: "ndarray", "staging", ...; else ""
    free_bytes: int | None               # live free device memory at the failure
    total_bytes: int | None              # total device memory
    limit_bytes: int | None              # kiln's budget for the device
    reserve_bytes: int | None            # headroom kept free (set when the live check refused)
    live_age_ms: int | None              # ms between reading free/total and the failure
    in_use_bytes: dict[str, int] | None  # category -> bytes kiln held at the failure
    site: str                            # the function that refused
    driver_status: str                   # the driver's own status name
    result: str                          # the RhiResult: "out_of_memory", "invalid_usage", ...
    oom_source: str                      # "driver", "budget", "device_heap", "host" or "none"
    detail: str                          # what was wrong (invalid usage, runtime faults)
    context: tuple[str, ...]             # lines added on the way up, innermost first
    advice: str                          # what to do, naming kiln.init's arguments
    injected: bool                       # a fault plan made it, not the device

    def __init__(self, message: str = "", *more: object, **fields: Any) -> None:
        # More than one positional argument is how Exception subclasses are often rebuilt
        # (distributed: type(e)("Long error message", text)): the parts joined by ": ".
        message = _capped(": ".join(str(part) for part in (message, *more)))
        super().__init__(message)
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown fields {sorted(unknown)}")
        for name, default in FIELDS.items():
            value = fields.get(name, default)
            if name == "in_use_bytes" and value is not None:
                value = dict(value)
            elif name == "context":
                value = tuple(value)
            setattr(self, name, value)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Callable[..., "Error"], tuple[type["Error"], str, dict[str, Any]]]:
        return (_rebuild, (type(self), str(self), {name: getattr(self, name) for name in FIELDS}))


class OutOfMemoryError(Error, MemoryError):
    """Memory could not be had. Freeing arrays (or kiln.empty_cache()) may help."""


class DeviceOutOfMemoryError(OutOfMemoryError):
    """The driver refused the allocation (also: an injected fault, kiln.testing.fail_allocation)."""


class BudgetExceededError(OutOfMemoryError):
    """kiln's budget refused before asking the driver (limit, or live free memory minus reserve)."""


class DeviceHeapExhaustedError(OutOfMemoryError):
    """A kernel exhausted the device-side heap (the device's configure(device_heap_bytes=...))."""


class HostOutOfMemoryError(OutOfMemoryError):
    """Host memory could not be had (e.g. the numpy array of to_numpy())."""


class InvalidUsageError(Error, ValueError):
    """The call can never work as given (negative dimension, wrong dtype, use after free, ...)."""


class InvalidTypeError(InvalidUsageError, TypeError):
    """An argument has a type the call cannot use (a numpy array where a kiln.ndarray is needed,
    None for a flag, a float for a size, ...). Also a TypeError, as numpy's errors double as
    builtins; ``result`` is "invalid_usage" like every InvalidUsageError."""


def _recast(cls: type[_E], error: Error) -> _E:
    """The same error (message and attributes) as an instance of ``cls``; used by the native
    module for InvalidTypeError, a Python-only refinement of ErrorKind::invalid_usage."""
    return cls(str(error), **{name: getattr(error, name) for name in FIELDS})


class KernelCompileError(InvalidUsageError):
    """A user kernel's code does not compile: an operation, map_expr, reduce_expr, post_map_expr
    or identity of kiln.ElementwiseKernel / kiln.ReductionKernel with a syntax or type error, or
    kiln.Kernel's LLVM IR that does not parse, verify or match its declared parameters. Raised
    when the kernel is made or first specialized for its argument types, never at a launch.

    ``line`` and ``column`` (1-based; 0 when the failure has no position, e.g. a module that does
    not verify) say where in that code; the message quotes the line with a caret under the
    column. Also a ValueError, as every InvalidUsageError; survives pickle."""

    line: int
    column: int

    def __init__(self, message: str = "", *more: object, line: int = 0, column: int = 0,
                 **fields: Any) -> None:
        super().__init__(message, *more, **fields)
        self.line = int(line)
        self.column = int(column)

    def __reduce__(self) -> Any:
        return (_rebuild_compile, (type(self), str(self), self.line, self.column,
                                   {name: getattr(self, name) for name in FIELDS}))


def _rebuild_compile(cls: type["KernelCompileError"], message: str, line: int, column: int,
                     fields: dict[str, Any]) -> "KernelCompileError":
    """Unpickles a KernelCompileError: the same class, message, position and attributes."""
    return cls(message, line=line, column=column, **fields)


class NotSupportedError(Error, NotImplementedError):
    """The backend, driver or feature is absent on this machine or in this build."""


class DeviceLostError(Error, RuntimeError):
    """A sticky device fault: the device is unusable; re-init."""


class RuntimeFaultError(Error, RuntimeError):
    """Any other device or driver failure (RhiResult::error)."""


for _cls in (Error, OutOfMemoryError, DeviceOutOfMemoryError, BudgetExceededError,
             DeviceHeapExhaustedError, HostOutOfMemoryError, InvalidUsageError, InvalidTypeError,
             KernelCompileError, NotSupportedError, DeviceLostError, RuntimeFaultError):
    _cls.__module__ = "kiln"  # tracebacks and pickle name them kiln.<Name>
del _cls
