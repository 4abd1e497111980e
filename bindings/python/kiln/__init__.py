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

One executor (device + budget + kernels) is global: kiln.init() makes it, a later kiln.init()
replaces it (the default, made on first use, is arch="cpu"). Arrays of a replaced executor stay
safe to keep, free and delete (they keep their device memory alive), but operations on them raise
InvalidUsageError. Arrays are freed by del / garbage collection or explicitly by a.free().

Memory: kiln.memory_stats() (a dict of bytes and counters), kiln.memory_summary() (a table),
kiln.empty_cache() (gives the caching pool's blocks back; freed arrays are kept there as
"pool_cache" for reuse), kiln.add_oom_observer(fn) / remove_oom_observer(id).

Interoperability without copies: np.from_dlpack(a), torch.from_dlpack(a) and kiln.from_dlpack(x)
(DLPack, both ways; a.__dlpack_device__() says where the memory is), np.asarray(a) on cpu and mock,
and a.__cuda_array_interface__ (version 3) on CUDA arrays for CuPy, Numba, PyTorch and JAX.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from ._errors import (  # noqa: F401  (the exceptions come first: the native module imports them)
    Error, OutOfMemoryError, DeviceOutOfMemoryError, BudgetExceededError,
    DeviceHeapExhaustedError, HostOutOfMemoryError, InvalidUsageError, InvalidTypeError,
    KernelCompileError, NotSupportedError, DeviceLostError, RuntimeFaultError,
)
from ._kiln import (  # noqa: F401
    init, device, dtype, f32, f64, i32, i64, ndarray, from_numpy, from_dlpack,
    fill, copy, axpy, reduce_sum, matmul, compact_positive,
    memory_stats, memory_summary, empty_cache, reset_peak_memory_stats,
    add_oom_observer, remove_oom_observer,
)
from ._kernels import Kernel, ElementwiseKernel, ReductionKernel  # noqa: F401
from . import _kernels
from . import _kiln, testing  # noqa: F401
from ._typed import typed_arguments as _typed_arguments
from ._version import __version__ as __version__  # CMake's project(VERSION); exported for mypy

__all__ = [
    "Error", "OutOfMemoryError", "DeviceOutOfMemoryError", "BudgetExceededError",
    "DeviceHeapExhaustedError", "HostOutOfMemoryError", "InvalidUsageError", "InvalidTypeError",
    "KernelCompileError", "NotSupportedError", "DeviceLostError", "RuntimeFaultError",
    "Kernel", "ElementwiseKernel", "ReductionKernel",
    "init", "device", "dtype", "f32", "f64", "i32", "i64", "ndarray", "from_numpy", "from_dlpack",
    "fill", "copy", "axpy", "reduce_sum", "matmul", "compact_positive",
    "memory_stats", "memory_summary", "empty_cache", "reset_peak_memory_stats",
    "add_oom_observer", "remove_oom_observer", "testing", "empty", "zeros",
]


if _TYPE_CHECKING:
    import numpy.typing as _npt
    from ._kiln import _DtypeLike, _ShapeLike


@_typed_arguments
def empty(shape: "_ShapeLike", dtype: "_DtypeLike" = f32) -> ndarray:
    """A new uninitialized array, in numpy's argument order: kiln.ndarray(dtype, shape).

    shape: an int or a sequence of ints; dtype: kiln.f32, f64, i32, i64, their names, or numpy's
    float32, float64, int32, int64 (default f32). Errors: as kiln.ndarray (InvalidTypeError,
    InvalidUsageError, an OutOfMemoryError subclass when the memory cannot be had).
    """
    return ndarray(dtype, shape)


@_typed_arguments
def zeros(shape: "_ShapeLike", dtype: "_DtypeLike" = f32) -> ndarray:
    """A new array of zeros, in numpy's argument order (kiln.empty, then kiln.fill with 0).

    Errors: as kiln.empty; the array is freed again if the fill fails (a lost device)."""
    array = ndarray(dtype, shape)
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


def _shutdown() -> None:
    # The executor goes while the interpreter is still whole (its OOM observers hold callables),
    # and the compiled user kernels first (they hold its device context).
    _kernels._clear_cache()
    _kiln._shutdown()


import atexit as _atexit  # noqa: E402

_atexit.register(_shutdown)
