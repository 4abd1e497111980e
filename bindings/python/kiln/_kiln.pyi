"""Type stub of kiln._kiln, the native module (bindings/python/*.cpp); use the package ``kiln``.

Written by hand from the bindings and their tests; test/python/test_stubs.py checks that it names
exactly what the module defines, with the same parameters. Conventions of every function here:

- Sizes are in bytes. Integer arguments take anything with ``__index__`` (int, numpy integers)
  except bool; a bool, a float or None where an int is needed is InvalidTypeError.
- Every call is checked whole (types, dtypes, shapes, aliasing) before anything is allocated or
  copied: a usage mistake is InvalidUsageError (InvalidTypeError for a wrong type), never an
  out-of-memory error. A call whose arguments match no signature (too many, too few, an unknown
  keyword) is InvalidTypeError, not a plain TypeError.
- Errors are the classes of kiln._errors (kiln.Error and its subclasses); every out-of-memory kind
  is a kiln.OutOfMemoryError, hence a MemoryError. An operation raises one only when memory it
  asks for cannot be had: a new array, or staging for a host (numpy) operand. Launches need no
  other memory: the executor holds their argument and result buffers from kiln.init on.
- Threading: one executor per device (kiln.Device); calls may come from any thread. Launches run with the GIL
  released and the arrays they use marked busy (freeing a busy array is InvalidUsageError),
  except fill, copy, axpy and reduce_sum of at most 16,384 elements on cpu or mock, which keep
  the GIL (a few microseconds) unless another thread is inside a GIL-released kiln call.
"""

from typing import Any, Callable, ClassVar, ContextManager, Final, Literal, Self, Sequence, SupportsIndex, TypeAlias, TypedDict

import numpy
import numpy.typing as npt

from kiln._errors import Error, OutOfMemoryError

_DtypeName: TypeAlias = Literal["f32", "f64", "i32", "i64"]
# A numpy dtype, named apart from the class dtype (whose properties numpy and dtype hide both names
# in its body).
_NumpyDType: TypeAlias = numpy.dtype[Any]
# What ndarray(), empty() and zeros() take as a dtype: a kiln.dtype, its name, or numpy's
# float32/float64/int32/int64 as a dtype, a scalar type or a name ("float32").
_DtypeLike: TypeAlias = "dtype | _DtypeName | numpy.dtype[Any] | type[numpy.generic] | str"
# An integer kiln takes: int, numpy integers, any __index__ object (bool is refused at run time).
_Int: TypeAlias = SupportsIndex
# A shape: an int, a sequence of ints, or a 1-D integer numpy array.
_ShapeLike: TypeAlias = SupportsIndex | Sequence[SupportsIndex] | npt.NDArray[numpy.integer[Any]]
# A scalar operand: a real number for floating dtypes, an integer for integer dtypes.
_Scalar: TypeAlias = float | int | numpy.floating[Any] | numpy.integer[Any]
# A flag: True or False (numpy bools too); None and ints are refused.
_Flag: TypeAlias = bool | numpy.bool_
# A DLPack capsule (a PyCapsule named "dltensor"; types.CapsuleType is Python 3.13's).
_Capsule: TypeAlias = object


class dtype:
    """Element type of a kiln.ndarray: kiln.f32, f64, i32, i64 (values 0, 1, 2, 3).

    ``kiln.dtype(value)`` accepts a kiln.dtype, its name ("f32") or its value (0..3).
    Errors: InvalidTypeError (another type, wrong arity), InvalidUsageError (a name or value that
    is no dtype). ``str(kiln.f32) == "f32"``. Immutable; safe to share between threads.
    """

    f32: ClassVar[_DType]
    f64: ClassVar[_DType]
    i32: ClassVar[_DType]
    i64: ClassVar[_DType]
    __members__: ClassVar[dict[str, _DType]]

    def __init__(self, value: _DtypeLike | _Int) -> None:
        """The dtype named by ``value``: a kiln.dtype, "f32"/"f64"/"i32"/"i64", 0..3, or numpy's
        float32/float64/int32/int64 (a dtype, a scalar type or a name such as "float32").
        Errors: InvalidTypeError, InvalidUsageError (see the class)."""
    @property
    def name(self) -> str:
        """The dtype's name: "f32", "f64", "i32" or "i64"."""
    @property
    def value(self) -> int:
        """The dtype's value: 0 (f32), 1 (f64), 2 (i32), 3 (i64)."""
    @property
    def itemsize(self) -> int:
        """Bytes per element: 4 (f32, i32) or 8 (f64, i64)."""
    @property
    def numpy(self) -> _NumpyDType:
        """The numpy dtype of the same element type (numpy.float32 for kiln.f32, ...)."""
    @property
    def dtype(self) -> _NumpyDType:
        """The same as ``numpy``: numpy's protocol, so ``numpy.dtype(kiln.f32)`` is float32 and a
        kiln dtype can be passed wherever numpy takes a dtype."""
    def __index__(self) -> int:
        """The dtype's value (0..3)."""
    def __int__(self) -> int:
        """The dtype's value (0..3)."""
    def __eq__(self, other: object) -> bool:
        """Whether ``other`` names the same dtype: a kiln.dtype, its name ("f32"), or numpy's dtype
        of the same element type (numpy.float32, numpy.dtype("float32"), "float32"). An int, a
        str or type that names no dtype never compares equal (no error); any other object
        decides itself (NotImplemented: ``unittest.mock.ANY == kiln.f32`` both ways)."""
    def __ne__(self, other: object) -> bool:
        """The negation of ``==``."""
    def __hash__(self) -> int:
        """The hash of the dtype's value."""
    def __getstate__(self) -> int:
        """Pickle support: the dtype's value."""
    def __reduce__(self) -> str:
        """Pickle support, every protocol: by name, the module's own kiln.f32 ... i64 (the same
        object comes back)."""
    def __setstate__(self, value: _DtypeLike | _Int) -> None:
        """Pickle support: accepts what the constructor accepts, with the same errors."""
    def __repr__(self) -> str:
        """``<dtype.f32: 0>``."""
    def __str__(self) -> str:
        """The dtype's name, e.g. "f32"."""


f32: Final[dtype]
"""32-bit float (itemsize 4)."""
f64: Final[dtype]
"""64-bit float (itemsize 8)."""
i32: Final[dtype]
"""32-bit signed integer (itemsize 4)."""
i64: Final[dtype]
"""64-bit signed integer (itemsize 8)."""

# The class dtype under another name, for the ndarray members named dtype.
_DType: TypeAlias = dtype


class ndarray:
    """ndarray(dtype, shape): an array in device memory, row-major (C order).

    dtype: kiln.f32, f64, i32, i64 (or their names); shape: an int or a sequence of ints (at most
    32 dimensions). The contents are uninitialized. Freed by del / garbage collection or
    a.free(); a.to_numpy() copies it to a new numpy array; on cpu and mock np.asarray(a) (and
    memoryview(a)) is a zero-copy, writable view. copy.copy / copy.deepcopy make a new array with
    the same contents on the same device; pickle goes through the host copy (to_numpy) and
    restores the array with kiln.from_numpy on the receiving side's current device.

    An array lives on one device (a.device) for its life; operations run on their arrays'
    device, and arrays of different devices in one call raise InvalidUsageError naming each
    (a.to(device) copies). An array of an executor that kiln.init or Device.configure replaced
    stays safe to keep, view, free and delete; operations on it raise InvalidUsageError.

    Thread safety: any thread may use an array, but freeing one while another thread uses it is
    InvalidUsageError.

    An array is made whole by ``kiln.ndarray(...)`` (the class's ``__new__``), or not at all:
    there is no instance without its memory. A subclass's ``__init__`` runs once its array
    exists. The class's attributes cannot be set or replaced (as numpy's ndarray).
    """

    def __new__(cls, dtype: _DtypeLike, shape: _ShapeLike, *, device: Device | str | None = None) -> Self:
        """A new uninitialized array of ``dtype`` and ``shape`` on ``device`` (a kiln.Device or a
        name such as "cuda:1"; None: the current device, kiln.current_device()).

        Errors: InvalidTypeError (wrong types: a float or bool dimension, a nested sequence, a
        Python type such as float, ...), InvalidUsageError (an unknown dtype name, a numpy dtype
        kiln has no arrays of such as float16, a negative dimension, more than
        32 dimensions, a size beyond numpy's, a device= that names no device, inside an OOM
        observer), an OutOfMemoryError subclass (usually BudgetExceededError or
        DeviceOutOfMemoryError) when the memory cannot be had, NotSupportedError (device= a
        device this machine does not have)."""
    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions, in elements (``()`` for a 0-d array)."""
    @property
    def dtype(self) -> _DType:
        """The element type."""
    @property
    def nbytes(self) -> int:
        """Size of the data in bytes (size * dtype.itemsize)."""
    @property
    def size(self) -> int:
        """Number of elements (the product of shape; 1 for a 0-d array)."""
    @property
    def ndim(self) -> int:
        """Number of dimensions (len(shape))."""
    @property
    def device(self) -> Device:
        """The kiln.Device the array lives on; its str is "cpu", "mock", "cuda:0", "amdgpu:0" (and
        it compares equal to that name)."""
    @property
    def is_freed(self) -> bool:
        """Whether the array's memory was freed (by free())."""
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface (version 3) over the same zero-copy view as the buffer
        protocol: np.asarray(a) shares a's memory. Errors: NotSupportedError when the device is
        not host-addressable (cuda, amdgpu: use to_numpy()), InvalidUsageError for a freed array.
        A view counts as a use: free() refuses while one exists."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface, version 3 (CuPy, Numba, PyTorch, JAX), on arrays of a CUDA
        executor only: {"shape": tuple, "typestr": "<f4" (numpy's), "data": (device pointer,
        False), "version": 3, "strides": None (C-contiguous), "stream": None (kiln's launches
        have finished when they return: no synchronization needed)}. Zero-copy: the consumer
        keeps a reference to the array, but the interface has no release hook, so a.free()
        while a consumer uses the pointer is not detected (DLPack counts its exports).
        Errors: AttributeError on cpu, mock and amdgpu arrays (hasattr() is False; HIP arrays
        use DLPack), InvalidUsageError for a freed array."""
    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> _Capsule:
        """DLPack export: a "dltensor" capsule over this array's memory, no copy (np.from_dlpack,
        torch.from_dlpack, cupy.from_dlpack, kiln.from_dlpack take it).

        stream: None for cpu and mock arrays; for CUDA/ROCm arrays None or any int (the
        consumer's stream): kiln's launches have finished when they return, so the memory is
        ready on every stream and nothing is synchronized. max_version: accepted; the capsule
        is DLPack 0.6's unversioned one (Debian's libdlpack-dev). dl_device: None or the array's
        own __dlpack_device__(). copy: None or False share the memory; True exports a new copy.
        The capsule, and the array a consumer makes from it, hold this array (and its device
        memory) alive and count as exports: free() refuses until they are gone.
        Errors: InvalidUsageError (freed array, a stream other than None on cpu and mock),
        InvalidTypeError (argument types, positional arguments), BufferError (dl_device another
        device)."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """(device_type, device_id) in DLPack's numbering: (1, 0) kDLCPU for cpu and mock (their
        memory is host memory), (2, N) kDLCUDA for cuda:N, (10, N) kDLROCM for amdgpu:N."""
    def free(self) -> None:
        """Frees the array's memory now (into the caching pool when caching is on).

        Errors: InvalidUsageError when it is already freed, when a running operation uses it
        (another thread), or while exports of it exist (memoryview, np.asarray, a DLPack capsule
        or the array a consumer made from one: delete them first). An array made by
        kiln.from_dlpack gives the memory back to its producer (the tensor's deleter)."""
    def to_numpy(self) -> npt.NDArray[Any]:
        """A new numpy array (same shape, the numpy dtype of dtype) with a copy of the contents.

        Errors: InvalidUsageError (freed, or of a replaced executor), HostOutOfMemoryError when
        the host copy cannot be allocated."""
    def to(self, device: Device | str) -> ndarray:
        """This array on ``device`` (a kiln.Device or a name): ``self`` when it is there already
        (as torch's Tensor.to), else a new array with a copy of the contents made through host
        memory and charged to the target device's budget. The target array is allocated first:
        when the target refuses, nothing was copied and this array is untouched.

        Errors: InvalidTypeError, InvalidUsageError (a name that is no device, a freed array, an
        array of a replaced executor), the target's OutOfMemoryError subclass,
        HostOutOfMemoryError (the host staging copy), NotSupportedError (no such device),
        DeviceLostError."""
    def __copy__(self) -> ndarray:
        """copy.copy(a): a new array of the same dtype and shape on a's device, with a's
        contents. Errors: those of ndarray() and kiln.copy."""
    def __deepcopy__(self, memo: object) -> ndarray:
        """copy.deepcopy(a): the same as copy.copy(a) (an array holds no Python objects)."""
    def __reduce__(self) -> tuple[Callable[[npt.NDArray[Any]], ndarray], tuple[npt.NDArray[Any]]]:
        """Pickle support: (kiln._ndarray_from_host, (a.to_numpy(),)); unpickling makes a new
        array with kiln.from_numpy on the current executor."""
    def __len__(self) -> int:
        """shape[0]. Errors: InvalidTypeError for a 0-d array (as numpy's TypeError)."""
    def __bool__(self) -> bool:
        """As numpy: the truth of the one element of a one-element array (read from the device).
        Errors: InvalidUsageError (a ValueError, as numpy's) for any other size: ambiguous."""
    def __repr__(self) -> str:
        """``kiln.ndarray(f32[2, 3], device='cpu')``, with ``, freed`` once freed."""


def init(
    arch: Literal["cpu", "mock", "cuda", "amdgpu"] | str = "cpu",
    *,
    budget_bytes: _Int | None = None,
    reserve_bytes: _Int | None = None,
    live_check: _Flag = True,
    caching: _Flag = True,
    device_heap_bytes: _Int | None = None,
    mock_capacity_bytes: _Int | None = None,
    mock_other_process_bytes: _Int | Sequence[_Int] | npt.NDArray[numpy.integer[Any]] | None = None,
    num_threads: _Int | None = None,
    fault_at: _Int | None = None,
    fail_sizes_at_least: _Int | None = None,
) -> None:
    """Configures device ``arch`` (kiln.device(arch).configure(...)) and makes it the process's
    current device: the one used where no ``with kiln.device(...)`` block and no device=
    argument says otherwise. Without a call, the current device is "cpu", opened with the
    default options on first use. As before, kiln.init replaces the one executor it manages:
    when the device current before (an earlier kiln.init's, or the default cpu) is another
    device, that device is closed (its arrays as a replaced executor's below); devices opened
    with kiln.device stay open.

    arch: "cpu", "mock" (a host-memory device with a capacity, for tests), "cuda", "amdgpu";
      "cuda:1" / "amdgpu:1" pick the driver's device 1 ("cuda" is "cuda:0"). A device the
      driver does not have raises NotSupportedError naming its device count; "cpu" and "mock"
      have only device 0 (InvalidUsageError for "cpu:1").
    budget_bytes: kiln's memory limit (None: KILN_POOL_LIMIT_MB if set, else total - reserve).
    reserve_bytes: headroom kept free on the device (None: max(64 MiB, total / 20)); below the
      device's total memory (else InvalidUsageError).
    live_check: ask the device for its live free memory whenever kiln must grow.
    caching: keep freed blocks for reuse (charged as "pool_cache"; evicted before any refusal).
    device_heap_bytes: the device heap kernels allocate from (compact_positive); None: 16 MiB.
      It is charged to the budget: a budget_bytes below it makes init raise BudgetExceededError.
    mock_capacity_bytes: the mock device's total memory.
    mock_other_process_bytes: memory "another process" holds on the mock device; a list is a
      script of successive readings (at most 2**20 of them).
    num_threads: CPU worker threads for launches (None or 0: all cores; at most 1024).
    fault_at: the N-th allocation after set-up fails with DeviceOutOfMemoryError (0/None: never).
    fail_sizes_at_least: every allocation of at least this many bytes fails the same way.

    This device's executor is replaced (made anew even with the same options). Arrays of the
    replaced executor stay safe to keep, view, free and delete; operations on them raise
    InvalidUsageError. Its OOM observers and fail_allocation blocks are dropped. After a
    DeviceLostError, init releases the lost executor before making the new one. When a device
    released since the last init could not be (the driver refused cuDevicePrimaryCtxRelease_v2
    or hipDeviceReset, so its memory stays held until the process exits), init warns with a
    RuntimeWarning naming the device, the call and its status, after the new executor is in
    place (under -W error the warning is raised then; a device released when its last array
    goes, after the replacing init, is warned of at the next one).

    Errors: InvalidTypeError (wrong types), InvalidUsageError (an unknown arch, a malformed
    device ordinal, values out of range, called inside an OOM observer), NotSupportedError (no
    driver, or no such device, for arch on this machine or in this build), an OutOfMemoryError subclass (the device heap, the launch buffers or code do not fit;
    HostOutOfMemoryError when the host cannot compile the kernels), DeviceLostError (arrays of a
    lost executor still hold its context). The JIT runs with the GIL released.
    """


class Device:
    """One device of the process, as kiln.device(name) returns it: its executor (opened with the
    default options on first use, or by configure), its budget and ledger, caching pool, fault
    plan (kiln.testing.inject / fail_allocation inside ``with d:``, KILN_FAULT) and OOM
    observers. There is one Device object per device for the life of the process
    (kiln.device("cuda") is kiln.device("cuda:0")); no driver context is made for a device
    until it is first used.

    ``with d:`` makes it the current device of this thread or asyncio task (a context variable)
    until the block ends; blocks nest. Its str is the device's name ("cpu", "mock", "cuda:1"),
    and it compares (and hashes) equal to that name.

    Thread safety: a Device may be used from any thread; launches on different devices run
    concurrently, launches on one device one at a time."""

    def __str__(self) -> str:
        """"cpu", "mock", "cuda:0", "amdgpu:1"."""
    def __repr__(self) -> str:
        """``kiln.device('cuda:1')``."""
    def __eq__(self, other: object) -> bool:
        """True for the same Device, or its name as str() gives it ("cuda:0", "cpu"); False for
        any other str ("cuda" names cuda:0 but is not its name: equal objects hash equal)."""
    def __hash__(self) -> int:
        """hash(str(self))."""
    def __copy__(self) -> Device:
        """The device itself (one Device per device)."""
    def __deepcopy__(self, memo: object) -> Device:
        """The device itself."""
    def __reduce__(self) -> tuple[Callable[[str], Device], tuple[str]]:
        """Pickle support: (kiln._device_by_name, (str(self),)): the receiving process's Device of
        that name (kiln.device(name)), opened there on first use with that process's options."""
    @property
    def type(self) -> str:
        """The backend: "cpu", "mock", "cuda", "amdgpu" (torch.device.type)."""
    @property
    def index(self) -> int:
        """The driver's device ordinal (0 for cpu and mock; torch.device.index)."""
    @property
    def is_open(self) -> bool:
        """Whether its executor is open (a driver context exists for it)."""
    def __enter__(self) -> Device:
        """Makes this the current device of this context until __exit__."""
    def __exit__(self, *exc: object) -> None:
        """The current device goes back to what it was at __enter__. Errors: InvalidUsageError
        when this device is not the one the context's innermost block entered."""
    def configure(
        self,
        *,
        budget_bytes: _Int | None = None,
        reserve_bytes: _Int | None = None,
        live_check: _Flag = True,
        caching: _Flag = True,
        device_heap_bytes: _Int | None = None,
        mock_capacity_bytes: _Int | None = None,
        mock_other_process_bytes: _Int | Sequence[_Int] | npt.NDArray[numpy.integer[Any]] | None = None,
        num_threads: _Int | None = None,
        fault_at: _Int | None = None,
        fail_sizes_at_least: _Int | None = None,
    ) -> None:
        """Opens this device's executor anew with these options (kiln.init's, with kiln.init's
        rules and errors; the current device does not change). The replaced executor's arrays
        stay safe to keep, view, free and delete; operations on them raise InvalidUsageError."""
    def memory_stats(self) -> _MemoryStats:
        """kiln.memory_stats() of this device."""
    def memory_summary(self) -> str:
        """kiln.memory_summary() of this device."""
    def empty_cache(self) -> int:
        """kiln.empty_cache() of this device: the bytes released."""
    def reset_peak_memory_stats(self) -> None:
        """kiln.reset_peak_memory_stats() of this device."""
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, asked of the driver now (torch.cuda.mem_get_info);
        other processes' use included. Errors: DeviceLostError, a driver error."""
    def track(self) -> ContextManager[Any]:
        """``with d.track() as report:``: the bytes in use on this device per category (dicts as
        memory_stats()' current_bytes) at entry, report.start_bytes, and once the block ends
        report.end_bytes, report.peak_bytes (the peak inside the block) and
        report.peak_total_bytes. It resets the device's peak figures at entry (as
        reset_peak_memory_stats); blocks nest, each reporting its own peak. Reading end_bytes or
        the peaks before the block ends raises InvalidUsageError. A
        reset_peak_memory_stats() call inside the block starts the block's peaks over from there
        (a nested block keeps what came before it; a direct reset does not)."""
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Not callable (InvalidTypeError): kiln.device(name) returns a device's one Device."""


def device(
    name: Device | str | None = None,
    *,
    budget_bytes: _Int | None = None,
    reserve_bytes: _Int | None = None,
    live_check: _Flag = True,
    caching: _Flag = True,
    device_heap_bytes: _Int | None = None,
    mock_capacity_bytes: _Int | None = None,
    mock_other_process_bytes: _Int | Sequence[_Int] | npt.NDArray[numpy.integer[Any]] | None = None,
    num_threads: _Int | None = None,
    fault_at: _Int | None = None,
    fail_sizes_at_least: _Int | None = None,
) -> Device:
    """The kiln.Device ``name`` names ("cpu", "mock", "cuda", "cuda:1", "amdgpu:0"; "cuda" is
    "cuda:0"), or the current device without a name. With options it configures the device
    (Device.configure). Opening the device waits for its first use: a name alone makes no
    driver context. Errors: InvalidTypeError, InvalidUsageError (a name that is no device);
    with options, those of kiln.init."""


def current_device() -> Device:
    """The current device: the innermost ``with kiln.device(...)`` block of this thread or asyncio
    task, else the device kiln.init made current, else cpu."""


def mem_get_info() -> tuple[int, int]:
    """Device.mem_get_info() of the current device."""


def from_numpy(a: npt.ArrayLike, *, device: Device | str | None = None) -> ndarray:
    """A new array on ``device`` (None: the current device) with a copy of ``a`` (a numpy array or array-like of
    float32, float64, int32 or int64; same shape and dtype). Non-contiguous or byte-swapped input
    is copied to C order on the host first, after the device array was allocated.

    Errors: InvalidUsageError (another numpy dtype: float16, bool, object, structured, ...;
    inside an OOM observer), InvalidTypeError (masked arrays, values that are not numbers), an
    OutOfMemoryError subclass (device memory; HostOutOfMemoryError for the host copy)."""


def from_dlpack(x: object) -> ndarray:
    """A kiln.ndarray over the memory of ``x``, no copy: any object with ``__dlpack__`` (numpy
    arrays, torch and cupy tensors, kiln arrays) or a DLPack "dltensor" capsule.

    The tensor must be on the current executor's device (cpu and mock take host memory, kDLCPU;
    cuda:N takes kDLCUDA N; amdgpu:N takes kDLROCM N), of float32, float64, int32 or int64 with
    one lane, row-major contiguous and aligned to its element size (a byte offset is honoured).
    The memory is not charged to kiln's budget; the producer's object stays alive until the new
    array is freed or garbage-collected, and its deleter runs exactly once then. numpy 1.24
    refuses to export read-only arrays (BufferError): DLPack 0.6 cannot say read-only.
    Errors, all before the capsule is consumed (a refused tensor stays its producer's):
    InvalidTypeError (no __dlpack__, a capsule of another kind), InvalidUsageError (another
    dtype, lanes, strides, misaligned, another kiln device: kiln.init(arch=...) first, a
    capsule already consumed, inside an OOM observer), NotSupportedError (a device type kiln has
    no executor for: OpenCL, Vulkan, ...), and what the producer's __dlpack__ raises."""


def fill(out: ndarray, value: _Scalar) -> None:
    """out[...] = value, in place.

    value: a real number for floating dtypes (nan and inf too), an integer within the dtype's
    range for integer ones. Errors: InvalidTypeError (out not a kiln.ndarray; a float, complex,
    str or None value for an integer dtype), InvalidUsageError (value out of range; out freed or
    of a replaced executor)."""


def copy(dst: ndarray, src: ndarray) -> None:
    """dst[...] = src[...]; same dtype and shape.

    Errors: InvalidTypeError (not kiln.ndarrays), InvalidUsageError (dtype or shape differ, an
    array freed or of a replaced executor)."""


def axpy(alpha: _Scalar, x: ndarray | npt.ArrayLike, y: ndarray) -> None:
    """y = alpha * x + y, in place; x and y of the same dtype and shape (integers wrap).

    x may be a numpy array (or array-like), checked against y before any copy and staged on the
    device for the launch. Errors: InvalidTypeError (y not a kiln.ndarray, alpha of the wrong
    type), InvalidUsageError (dtype or shape differ, alpha out of range, an array freed), an
    OutOfMemoryError subclass when the staging buffer for a host x does not fit."""


def reduce_sum(x: ndarray) -> float | int:
    """The sum of all elements: a float for f32/f64 (accumulated in f64), an int for i32/i64
    (wrapping 64-bit). Errors: InvalidTypeError, InvalidUsageError (x freed),
    DeviceLostError; no out-of-memory error (it allocates nothing: its result slots are the
    executor's)."""


def matmul(a: ndarray, b: ndarray, out: ndarray | None = None) -> ndarray:
    """c = a @ b for 2-D arrays a (m, k) and b (k, n) of one dtype; returns c, shape (m, n).

    out: an existing (m, n) array of that dtype to write into (returned), which must be neither a
    nor b; None: a new array. The whole call is checked before out is allocated.
    Errors: InvalidTypeError, InvalidUsageError (not 2-D, inner dimensions differ, dtypes differ,
    out of the wrong shape or dtype or aliasing an input), an OutOfMemoryError subclass for a new
    out."""


def compact_positive(x: ndarray) -> ndarray:
    """A new 1-D array of the elements of x that are > 0, in order, of x's dtype.

    The kernel allocates its output from the device heap while it runs (kiln.init's
    device_heap_bytes). Errors: InvalidTypeError, InvalidUsageError, DeviceHeapExhaustedError
    when the heap is too small (nothing is held after), other OutOfMemoryError subclasses for
    the result array."""


class _MemoryStats(TypedDict):
    """kiln.memory_stats(): bytes, and counters since init."""

    device: str
    current_bytes: dict[str, int]
    peak_bytes: dict[str, int]
    current_total_bytes: int
    allocated_bytes: int
    peak_total_bytes: int
    limit_bytes: int
    reserve_bytes: int
    cached_bytes: int
    cached_blocks: int
    allocations: int
    frees: int
    cache_hits: int
    lock_free_hits: int
    evictions: int
    budget_refusals: int
    live_checks: int
    live_refusals: int
    driver_ooms: int
    retries: int


def memory_stats() -> _MemoryStats:
    """The current device's memory figures, in bytes, and counters (a new dict each call).

    current_bytes / peak_bytes: dicts of bytes per category ("ndarray", "pool_cache",
    "runtime_heap", ...); current_total_bytes: all of it; allocated_bytes: all but the caching
    pool's blocks (the baseline that comes back after a caught out-of-memory error);
    peak_total_bytes; limit_bytes and reserve_bytes of the budget; cached_bytes / cached_blocks
    of the caching pool; counters allocations, frees, cache_hits, lock_free_hits (hits served by
    the thread's own cache), evictions, budget_refusals, live_checks, live_refusals, driver_ooms,
    retries. A snapshot taken while other threads allocate may be momentarily inconsistent
    between categories."""


def memory_summary() -> str:
    """A readable table of current and peak bytes per category, the pool and the counters
    (starts with "kiln memory summary: <device> (limit ...")."""


def empty_cache() -> int:
    """Gives every cached block of the caching pool back to the device; returns the bytes
    released."""


def reset_peak_memory_stats() -> None:
    """Sets every peak figure of memory_stats() to its current value."""


def add_oom_observer(callback: Callable[[OutOfMemoryError], object]) -> int:
    """Registers ``callback``, called with the exception before an out-of-memory error is raised
    (on the thread whose allocation failed, with the GIL). If it frees arrays (or calls
    kiln.empty_cache()) the allocation is retried once. Observers may free arrays and call
    kiln.empty_cache(); kiln.init, making arrays and operations raise InvalidUsageError inside
    one (the failing allocation is still in progress). An exception it raises is
    reported through sys.unraisablehook and the out-of-memory error stands, except
    KeyboardInterrupt, SystemExit and other non-Exceptions, which the interrupted call raises.
    Returns the id for remove_oom_observer. Dropped when kiln.init replaces the executor.
    Errors: InvalidTypeError (not callable)."""


def remove_oom_observer(observer_id: _Int) -> bool:
    """Removes the observer add_oom_observer returned ``observer_id`` for; False when there is
    none (unknown or already removed). Errors: InvalidTypeError (not an int), InvalidUsageError
    (negative, beyond 2**63-1)."""


# The native part of kiln.testing and of the package's exit hook (kiln/testing.py and
# kiln/__init__.py wrap them); not API.

def _push_fault(at: _Int) -> int:
    """Enters a fail_allocation block: the ``at``-th allocation request from now fails with
    DeviceOutOfMemoryError. Returns the block's token for _pop_fault. Errors: InvalidTypeError,
    InvalidUsageError (at < 1, beyond 2**63-1)."""


def _push_inject(spec: str) -> int:
    """Enters an inject block: the fault spec ``spec`` decides every allocation request (or, for
    kind=launch|heap, every launch) until the block exits. Returns the block's token for
    _pop_fault. Errors: InvalidTypeError (not a str),
    InvalidUsageError (malformed spec, or a kernel= that names no kernel; nothing is armed)."""


def _device_key(name: str) -> str:
    """The device ``name`` means, as "backend:ordinal" ("cuda" -> "cuda:0"), by kiln.init's own
    parser. Errors: InvalidTypeError (not a str), InvalidUsageError (not a device name)."""


def _pop_fault(token: _Int | None = None) -> tuple[bool, int]:
    """Leaves the block whose push returned ``token`` (None: the innermost): first every block
    opened inside it and never left, then the block; each time the setting it replaced is armed
    again, or the plan is cleared. Returns (shadowed, unclosed): shadowed is True when the
    block's own request went by while an inner block's plan was armed instead (it failed
    nothing), unclosed counts the blocks left open inside it. A token whose block is gone does
    nothing: (False, 0). Errors: InvalidTypeError, InvalidUsageError (a token that is no int)."""


def _innermost_fault_block() -> str | None:
    """"fail_allocation" or "inject": the kind of the innermost open fault block; None when no
    block is open."""


def _fault_allocation_count() -> int:
    """Allocation requests since the innermost open block began (outside blocks, since the last
    block ended or since init)."""


def _make_error(
    result: str, oom_source: str = "none", requested_bytes: _Int = 0, device: str = "",
    detail: str = "",
) -> Error:
    """The exception kiln raises for a synthetic failure of this RhiResult and OomSource (see
    kiln.testing.make_error). Errors: InvalidTypeError, InvalidUsageError (unknown names)."""


def _throw_cpp_exception(kind: str) -> None:
    """Throws a C++ exception ("bad_alloc", "future_error", "system_error") through the module:
    raises HostOutOfMemoryError or RuntimeFaultError (the translation under test)."""


def _arm_cpp_exception(site: str, kind: str) -> None:
    """Testing: the next pass through ``site`` ("buffer": an ndarray's buffer export,
    "observer": making an OOM observer's exception) throws a C++ exception of ``kind`` once, which must reach Python as
    HostOutOfMemoryError or RuntimeFaultError; "none" disarms. Errors: InvalidUsageError for an
    unknown site or kind."""


def _live_array_bytes() -> int:
    """The bytes of every kiln.ndarray alive and not freed, over every executor (an array
    outlives the executor kiln.init replaced): the pytest plugin's leak check when the test
    replaced the executor it measured."""


def _check_operands(site: str, names: list[str], values: list[Any]) -> None:
    """The check of a user kernel call's array arguments before it allocates anything:
    InvalidUsageError for a freed array, one of a replaced or closed executor, or arrays on
    different devices (naming each argument's name, dtype, shape and device)."""


def _open_devices() -> list[str]:
    """The names of the devices whose executor is open."""


def _close_devices(backend: str) -> None:
    """Closes the executor of every device of ``backend`` ("cuda"); a current device among them
    gives way to cpu. kiln.testing's fake blocks call it as they exit."""


def _executor_generation(device: Device | str | None = None, open: bool = True) -> int:
    """Which executor ``device`` (the current device by default, opened if need be; with open
    False a closed device gives 0) has now: a number unique in the process to each executor made. kiln.testing compares it before and after
    a workload to tell that the workload replaced the executor; the kernel cache keys on it."""


def _shutdown() -> None:
    """Interpreter exit (atexit): later calls from other threads park; waits up to 10 s for the
    calls inside kiln, then drops the executor."""


# The native part of kiln.Kernel, kiln.ElementwiseKernel and kiln.ReductionKernel
# (kiln/_kernels.py wraps them); not API.

class _UserKernel:
    """A user kernel compiled for the executor current when it was made (UserKernel in C++);
    its code is charged to that device as code_object while the object lives."""

    def __init__(self) -> None:
        """Not made from Python: _compile_ir, _compile_elementwise and _compile_reduction make
        it (the call raises TypeError)."""

    @property
    def entry(self) -> str:
        """The element function's name."""

    @property
    def code_size_bytes(self) -> int:
        """Bytes of compiled code, charged as code_object."""

    @property
    def params(self) -> list[tuple[str, str, str, bool]]:
        """(name, kind, dtype name, raw) of each parameter."""

    def __repr__(self) -> str:
        """<kiln._UserKernel entry(in f32 x, ...)>."""

    def __reduce__(self) -> Any:
        """Refused: a compiled kernel is not picklable (InvalidTypeError); pickle the kernel
        object that made it."""


def _compile_ir(ir: str | bytes, entry: str, params: list[tuple[str, str, dtype, bool]]) -> _UserKernel:
    """Compiles element function ``entry`` of LLVM IR ``ir`` with parameters (name, kind: in, out,
    inout or scalar, dtype, raw) for the current executor's device. Errors: KernelCompileError
    (the IR does not parse, verify or match params; line and column), InvalidUsageError (a
    declaration), NotSupportedError (library math a GPU cannot compile without its vendor library:
    CUDA's libdevice, ROCm's ocml; an AMDGPU processor kiln has no code object for), an
    OutOfMemoryError (the code does not fit)."""


def _compile_elementwise(name: str, operation: str, params: list[tuple[str, dtype, bool, bool, list[int]]],
                         shape: list[int], type_names: list[tuple[str, dtype]]) -> _UserKernel:
    """Compiles an operation of kiln's operation language with parameters (name, dtype, array,
    output, broadcast strides) over a launch of ``shape``. Errors: KernelCompileError (the
    operation does not parse or type-check), then those of _compile_ir."""


def _compile_reduction(name: str, texts: tuple[str, str, str, str],
                       inputs: list[tuple[str, dtype, bool, bool, list[int]]],
                       outputs: list[tuple[str, dtype, bool, bool, list[int]]], reduce_dtype: dtype,
                       type_names: list[tuple[str, dtype]]
                       ) -> tuple[_UserKernel, _UserKernel | None, _UserKernel]:
    """Compiles a reduction's kernels (partial, fold, combine) from (map_expr, reduce_expr,
    post_map_expr, identity); fold is None on cpu and mock (it is the GPUs' middle level).
    Errors: those of _compile_elementwise."""


def _reduction_plan(fold: _UserKernel | None, k: int, outputs: int, inner: int
                    ) -> tuple[int, int, int, int]:
    """How a reduction of ``outputs`` values over ``k`` elements each (``inner`` the product of
    the dimensions after the reduced axis) is launched: (parts, lanes, fold_lanes,
    combine_parts), kiln::plan_reduction's plan for the device ``fold`` was compiled for (None:
    cpu and mock). Errors: InvalidUsageError for k or outputs < 0 or inner < 1."""


def _check_kernel_syntax(text: str, statements: bool, what: str) -> None:
    """Parses ``text`` (statements, or one expression) without types. Errors: KernelCompileError
    naming ``what``, with line and column."""


def _argument_signature(*args: Any) -> bytes | None:
    """The executor's generation, then per argument a kiln.ndarray's dtype and shape, or int or
    float, packed as bytes: equal for two calls whose checks depend on nothing else; None when an
    argument is anything else (a numpy scalar or array)."""


def _launch_kernel(kernel: _UserKernel, args: list[Any], count: _Int | None = None) -> None:
    """Launches ``kernel`` with ``args`` (kiln.ndarray for array parameters, numbers for scalars)
    over ``count`` indices (default: the non-raw arrays' element count). Errors: InvalidTypeError,
    InvalidUsageError naming the parameter, before anything runs; those of the launch
    (DeviceHeapExhaustedError, RuntimeFaultError for a failed kiln_assert, DeviceLostError)."""
