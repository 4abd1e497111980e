"""kiln: ndarrays on a device, built-in kernels, and typed errors for every way a device says no.

    import kiln
    kiln.init(arch="cpu", budget_bytes=256 << 20)
    a = kiln.from_numpy(numpy.arange(6, dtype=numpy.float32).reshape(2, 3))
    b = kiln.from_numpy(numpy.ones((2, 3), dtype=numpy.float32))
    kiln.axpy(2.0, a, b)               # b = 2*a + b
    try:
        big = kiln.ndarray(kiln.f32, (1 << 40,))
    except MemoryError as e:           # every out-of-memory kind is a MemoryError
        print(type(e).__name__, e.requested_bytes, e.limit_bytes)

Devices are objects: kiln.device("cuda:1") is the one kiln.Device of that device, with its own
executor (budget, caching pool, kernels, fault plan), opened on first use. Arrays live on one
device (a.device) and operations run there; `with kiln.device("cuda:1"):` makes a device
current for this thread or asyncio task, and device= picks one for a new array. kiln.init(arch,
...) configures a device and makes it the process's current one (the default is "cpu"); it
replaces that device's executor: arrays of a replaced executor stay safe to keep, free and
delete, but operations on them raise InvalidUsageError. Arrays are freed by del / garbage
collection or explicitly by a.free().

Memory: kiln.memory_stats() (a dict of bytes and counters), kiln.memory_summary() (a table),
kiln.empty_cache() (gives the caching pool's blocks back; freed arrays are kept there as
"pool_cache" for reuse), kiln.add_oom_observer(fn) / remove_oom_observer(id).

Interoperability without copies: np.from_dlpack(a), torch.from_dlpack(a) and kiln.from_dlpack(x)
(DLPack, both ways; a.__dlpack_device__() says where the memory is), np.asarray(a) on cpu and mock,
and a.__cuda_array_interface__ (version 3) on CUDA arrays for CuPy, Numba, PyTorch and JAX.
"""

import threading as _threading
from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from ._errors import (  # noqa: F401  (the exceptions come first: the native module imports them)
    Error, OutOfMemoryError, DeviceOutOfMemoryError, BudgetExceededError,
    DeviceHeapExhaustedError, HostOutOfMemoryError, InvalidUsageError, InvalidTypeError,
    KernelCompileError, NotSupportedError, DeviceLostError, RuntimeFaultError,
)
from ._kiln import (  # noqa: F401
    init, device, current_device, Device, dtype, f32, f64, i32, i64, ndarray, from_numpy, from_dlpack,
    fill, copy, axpy, reduce_sum, matmul, compact_positive,
    memory_stats, memory_summary, empty_cache, reset_peak_memory_stats, mem_get_info,
    add_oom_observer, remove_oom_observer,
)
from ._kernels import Kernel  # noqa: F401
from ._elementwise import ElementwiseKernel  # noqa: F401
from ._reduction import ReductionKernel  # noqa: F401
from . import _kernels
from . import _kiln, testing  # noqa: F401
from ._typed import typed_arguments as _typed_arguments
from ._version import __version__ as __version__  # CMake's project(VERSION); exported for mypy

__all__ = [
    "Error", "OutOfMemoryError", "DeviceOutOfMemoryError", "BudgetExceededError",
    "DeviceHeapExhaustedError", "HostOutOfMemoryError", "InvalidUsageError", "InvalidTypeError",
    "KernelCompileError", "NotSupportedError", "DeviceLostError", "RuntimeFaultError",
    "Kernel", "ElementwiseKernel", "ReductionKernel",
    "init", "device", "current_device", "Device", "dtype", "f32", "f64", "i32", "i64", "ndarray", "from_numpy", "from_dlpack",
    "fill", "copy", "axpy", "reduce_sum", "matmul", "compact_positive",
    "memory_stats", "memory_summary", "empty_cache", "reset_peak_memory_stats", "mem_get_info",
    "add_oom_observer", "remove_oom_observer", "testing", "empty", "zeros",
]


if _TYPE_CHECKING:
    import numpy.typing as _npt
    from ._kiln import _DtypeLike, _ShapeLike


@_typed_arguments
def empty(shape: "_ShapeLike", dtype: "_DtypeLike" = f32, *,
          device: "Device | str | None" = None) -> ndarray:
    """A new uninitialized array, in numpy's argument order: kiln.ndarray(dtype, shape,
    device=device).

    shape: an int or a sequence of ints; dtype: kiln.f32, f64, i32, i64, their names, or numpy's
    float32, float64, int32, int64 (default f32); device: a kiln.Device or a name (None: the
    current device). Errors: as kiln.ndarray (InvalidTypeError, InvalidUsageError, an
    OutOfMemoryError subclass when the memory cannot be had).
    """
    return ndarray(dtype, shape, device=device)


@_typed_arguments
def zeros(shape: "_ShapeLike", dtype: "_DtypeLike" = f32, *,
          device: "Device | str | None" = None) -> ndarray:
    """A new array of zeros, in numpy's argument order (kiln.empty, then kiln.fill with 0).

    Errors: as kiln.empty; the array is freed again if the fill fails (a lost device)."""
    array = ndarray(dtype, shape, device=device)
    try:
        fill(array, 0)
    except BaseException:
        array.free()
        raise
    return array


def _ndarray_from_host(host: "_npt.NDArray[_Any]") -> ndarray:
    """Unpickles a kiln.ndarray: a new array like kiln.from_numpy(host) on the current executor
    (ndarray.__reduce__ pickles the host copy, as to_numpy() gives it)."""
    return from_numpy(host)


class _MemoryTrack:
    """What ``with d.track() as report`` reports: bytes per category (memory_stats()'
    current_bytes keys) at entry, at exit, and the peak inside the block."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._done = False
        self._peak: dict[str, int] = {}
        self._peak_total = 0
        self.start_bytes: dict[str, int] = {}
        self._end: dict[str, int] = {}

    def _fold(self, stats: "_Any") -> None:
        """Keeps the device's peaks so far (before an inner block resets them)."""
        for name, value in stats["peak_bytes"].items():
            self._peak[name] = max(self._peak.get(name, 0), int(value))
        self._peak_total = max(self._peak_total, int(stats["peak_total_bytes"]))

    def _figure(self, value: "_Any") -> "_Any":
        if not self._done:
            raise InvalidUsageError("Device.track: the report's figures are known once the block ends",
                                    result="invalid_usage", site="Device.track",
                                    device=str(self._device))
        return value

    @property
    def end_bytes(self) -> dict[str, int]:
        return self._figure(self._end)  # type: ignore[no-any-return]

    @property
    def peak_bytes(self) -> dict[str, int]:
        return self._figure(self._peak)  # type: ignore[no-any-return]

    @property
    def peak_total_bytes(self) -> int:
        return self._figure(self._peak_total)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        if not self._done:
            return f"<kiln memory track of {self._device}, open>"
        return (f"<kiln memory track of {self._device}: peak {self._peak_total} bytes, "
                f"start {sum(self.start_bytes.values())}, end {sum(self._end.values())}>")


_open_tracks: "dict[str, list[_MemoryTrack]]" = {}  # device name -> its open tracks, outermost first
_tracks_lock = _threading.Lock()


class _TrackBlock:
    """The context manager Device.track() returns: one block, entered once."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._report: "_MemoryTrack | None" = None

    def __enter__(self) -> _MemoryTrack:
        if self._report is not None:
            raise InvalidUsageError("Device.track: this block was entered already; call d.track() "
                                    "for each block", result="invalid_usage", site="Device.track",
                                    device=str(self._device))
        device = self._device
        report = self._report = _MemoryTrack(device)
        with _tracks_lock:
            stats = device.memory_stats()
            for outer in _open_tracks.get(str(device), []):
                outer._fold(stats)  # the reset below must not lose what they saw
            report.start_bytes = {k: int(v) for k, v in stats["current_bytes"].items()}
            device.reset_peak_memory_stats()
            _open_tracks.setdefault(str(device), []).append(report)
        return report

    def __exit__(self, *exc: object) -> None:
        report, device = self._report, self._device
        assert report is not None
        with _tracks_lock:
            try:
                if device.is_open:  # a device closed inside the block (kiln.init) is not reopened
                    stats = device.memory_stats()
                    report._fold(stats)
                    report._end = {k: int(v) for k, v in stats["current_bytes"].items()}
            finally:
                report._done = True
                _open_tracks[str(device)].remove(report)


def _track(self: Device) -> _TrackBlock:
    """``with d.track() as report:``: the bytes in use on this device per category (dicts as
    memory_stats()' current_bytes) at entry, report.start_bytes, and once the block ends
    report.end_bytes, report.peak_bytes (the peak inside the block) and
    report.peak_total_bytes. It resets the device's peak figures at entry (as
    reset_peak_memory_stats); blocks nest, each reporting its own peak. Reading end_bytes or
    the peaks before the block ends raises InvalidUsageError. A
    reset_peak_memory_stats() call inside the block starts the block's peaks over from there
    (a nested block keeps what came before it; a direct reset does not)."""
    return _TrackBlock(self)


setattr(Device, "track", _track)  # the stub declares it; written here in Python


def _device_by_name(name: str) -> Device:
    """Unpickles a kiln.Device: kiln.device(name) in this process (Device.__reduce__)."""
    return device(name)


def _shutdown() -> None:
    # The executor goes while the interpreter is still whole (its OOM observers hold callables),
    # and the compiled user kernels first (they hold its device context).
    _kernels._clear_cache()
    _kiln._shutdown()


import atexit as _atexit  # noqa: E402

_atexit.register(_shutdown)
