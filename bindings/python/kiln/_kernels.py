"""Your own kernels: kiln.Kernel (LLVM IR), kiln.ElementwiseKernel and kiln.ReductionKernel
(CuPy's signatures and meaning), launched through the same launcher as kiln's own operations.

Parameter declarations are CuPy's: ``"float32 x, float32 y"``; a type is float32 (float, f32),
float64 (double, f64), int32 (int, i32) or int64 (long, i64), or a placeholder (``T``) that the
call resolves from its arguments. kiln.Kernel's declarations also say how the kernel uses each
array: ``"in float32 x, out float32 z, float32 scale"`` (a parameter with no kind is a scalar;
``raw`` before the kind: the kernel gets the whole array and indexes it itself).

Compiled kernels are cached per device, keyed by the code, the argument types and the target:
making the same kernel twice, or calling it again with the same types, compiles once. The cache
holds at most ``_CACHE_ENTRIES`` specializations (least recently used go first); while cached, a
kernel's code is charged to its device as ``code_object`` (kiln.memory_stats()).
"""

from __future__ import annotations

import collections
import keyword
import math
import numbers
import re
import threading
import weakref
from typing import TYPE_CHECKING, Any

from . import _kiln
from ._errors import InvalidTypeError, InvalidUsageError

if TYPE_CHECKING:
    from ._elementwise import ElementwiseKernel

__all__ = ["Kernel"]  # ElementwiseKernel: _elementwise.py; ReductionKernel: _reduction.py

_DTYPE_NAMES: dict[str, Any] = {
    "float32": _kiln.f32, "float": _kiln.f32, "f32": _kiln.f32,
    "float64": _kiln.f64, "double": _kiln.f64, "f64": _kiln.f64,
    "int32": _kiln.i32, "int": _kiln.i32, "i32": _kiln.i32,
    "int64": _kiln.i64, "long": _kiln.i64, "i64": _kiln.i64,
}
# numpy's other type names: not placeholders, types kiln does not have.
_OTHER_TYPES = {"bool", "float16", "half", "float128", "longdouble", "int8", "int16", "uint8", "uint16",
                "uint32", "uint64", "complex64", "complex128", "complex", "raw"}
# Words of the operation language that a parameter may not be named.
_RESERVED = {"true", "false", "const", "float", "double", "float32", "float64", "int", "long", "int32",
             "int64", "bool"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CACHE_ENTRIES = 256
_FAST_ENTRIES = 64  # argument signatures an ElementwiseKernel remembers
# The ElementwiseKernels whose argument signatures hold compiled kernels (_clear_cache empties them).
_instances: "weakref.WeakSet[ElementwiseKernel]" = weakref.WeakSet()
_cache: "collections.OrderedDict[tuple[Any, ...], Any]" = collections.OrderedDict()
_cache_lock = threading.Lock()


def _usage(site: str, detail: str) -> InvalidUsageError:
    return InvalidUsageError(f"kiln could not {site}: {detail}", device="kiln", site=site,
                             result="invalid_usage", oom_source="none", detail=detail)


def _type_error(site: str, detail: str) -> InvalidTypeError:
    return InvalidTypeError(f"kiln could not {site}: {detail}", device="kiln", site=site,
                            result="invalid_usage", oom_source="none", detail=detail)


class _Param:
    """One declared parameter: name, dtype (None for a placeholder), placeholder, kind, raw."""

    __slots__ = ("name", "dtype", "placeholder", "kind", "raw")

    def __init__(self, name: str, dtype: Any, placeholder: str | None, kind: str, raw: bool) -> None:
        self.name, self.dtype, self.placeholder, self.kind, self.raw = name, dtype, placeholder, kind, raw


def _parse_params(text: Any, what: str, site: str, kinds: bool = False) -> list[_Param]:
    """CuPy's declarations ("float32 x, T y"); with ``kinds``, kiln.Kernel's ("in float32 x")."""
    if not isinstance(text, str):
        raise _type_error(site, f"{what} must be a str such as \"float32 x, float32 y\", got "
                                f"{type(text).__name__}")
    params: list[_Param] = []
    if not text.strip():
        return params
    for part in text.split(","):
        words = part.split()
        raw = bool(words) and words[0] == "raw"
        if raw:
            words = words[1:]
        kind = "in"
        if kinds:
            kind = "scalar"
            if words and words[0] in ("in", "out", "inout"):
                kind, words = words[0], words[1:]
            elif raw:
                raise _usage(site, f"{what}: {part.strip()!r}: a raw parameter is an array: write "
                                   "raw in/out/inout")
        if len(words) != 2:
            raise _usage(site, f"{what}: {part.strip()!r} is not a declaration (a type and a name, "
                               "as \"float32 x\")")
        type_name, name = words
        if not _IDENTIFIER.match(name) or keyword.iskeyword(name) or name in _RESERVED:
            raise _usage(site, f"{what}: {name!r} is not a parameter name (true, false and the type "
                               "names are the language's own)")
        if any(p.name == name for p in params):
            raise _usage(site, f"{what}: {name} is declared twice")
        dtype = _DTYPE_NAMES.get(type_name)
        placeholder = None
        if dtype is None:
            if kinds or not _IDENTIFIER.match(type_name) or type_name in _OTHER_TYPES:
                raise _usage(site, f"{what}: {type_name!r} is not a type kiln has (float32, "
                                   "float64, int32, int64)" + ("" if kinds else " nor a type "
                                                               "placeholder such as T"))
            placeholder = type_name
        params.append(_Param(name, dtype, placeholder, kind, raw))
    return params


def _scalar_dtype(value: Any) -> Any:
    """The dtype a Python or numpy scalar brings to a placeholder (numpy's default types)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(value, "ndim", 0) == 0:
        return _DTYPE_NAMES.get(str(dtype))
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, numbers.Real)):
        return None
    return _kiln.i64 if isinstance(value, numbers.Integral) else _kiln.f64


def _is_array(value: Any) -> bool:
    return isinstance(value, _kiln.ndarray)


def _call_device(args: Any) -> Any:
    """The device a kernel call runs on: its first kiln.ndarray argument's, else the current
    device (arrays on other devices are refused at the launch, naming each)."""
    for a in args:
        if isinstance(a, _kiln.ndarray):
            return a.device
    return _kiln.current_device()


def _cached(key: tuple[Any, ...], make: Any, device: Any) -> Any:
    """The compiled kernel(s) of `key`, made by make() once, on `device` (per executor: key[0] is
    its generation; configure and kiln.init empty the cache before they replace an executor, so
    no kernel keeps an old device context alive). Compiles run outside the lock; a racing
    twin's result is dropped."""
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    with device:
        made = make()
    with _cache_lock:
        _cache.setdefault(key, made)
        _cache.move_to_end(key)
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
        return _cache[key]


def _clear_cache() -> None:
    """Drops every cached kernel (their code is uncharged once nothing else holds them), and
    every ElementwiseKernel's argument signatures: called by kiln.init before it replaces the
    executor and at exit, so that no kernel keeps a replaced (perhaps lost) device's context."""
    with _cache_lock:
        _cache.clear()
        for kernel in list(_instances):
            kernel._fast.clear()


def _cached_code_bytes() -> int:
    """Bytes of code_object the kernel cache holds for the current device's executor (each cached
    kernel once): kiln's own cache, which the leak checks (kiln.testing.sweep, the pytest plugin)
    do not count as held by the workload."""
    generation = _kiln._executor_generation()
    kernels: dict[int, Any] = {}
    with _cache_lock:
        for key, value in _cache.items():
            if key[0] == generation:
                for k in value if isinstance(value, tuple) else (value,):
                    if k is not None:
                        kernels[id(k)] = k
        for instance in list(_instances):
            for entry in instance._fast.values():
                if entry[4] == generation:
                    kernels[id(entry[0])] = entry[0]
    return sum(int(k.code_size_bytes) for k in kernels.values())


def _check_name(name: Any, site: str) -> str:
    if not isinstance(name, str):
        raise _type_error(site, f"name must be a str, got {type(name).__name__}")
    if not _IDENTIFIER.match(name):
        raise _usage(site, f"name {name!r} is not a function name (letters, digits, '_')")
    return name


def _identity_text(value: Any, site: str) -> Any:
    """CuPy's identity: a str of the operation language, or a number (written so that the
    language reads it back exactly; infinities and NaN as divisions)."""
    if isinstance(value, (str, bool)) or not isinstance(value, (numbers.Integral, numbers.Real)):
        return value  # a str, or refused by the caller as not one
    if isinstance(value, numbers.Integral):
        return str(int(value))
    f = float(value)
    if math.isnan(f):
        return "(0.0 / 0.0)"
    if math.isinf(f):
        return "(1.0 / 0.0)" if f > 0 else "(-1.0 / 0.0)"
    return repr(f)


class _Types:
    """Placeholder -> dtype, resolved from a call's arguments: an array's dtype binds its
    placeholder for good, a number's only while no array has bound it."""

    def __init__(self, site: str) -> None:
        self.site = site
        self.bound: dict[str, Any] = {}
        self.from_arrays: set[str] = set()

    def bind(self, param: _Param, dtype: Any, from_array: bool) -> None:
        if param.placeholder is None or dtype is None:
            return
        known = self.bound.get(param.placeholder)
        if known is None or (from_array and param.placeholder not in self.from_arrays):
            self.bound[param.placeholder] = dtype
            if from_array:
                self.from_arrays.add(param.placeholder)
        elif from_array and known != dtype:
            raise _type_error(self.site, f"{param.name} is declared {param.placeholder}, which "
                                         f"is {known.name} here, got an array of {dtype.name}")

    def bind_arrays(self, params: list[_Param], values: list[Any], outputs: bool = False) -> None:
        """Checks each value (an array of the declared dtype; an input may be a number) and binds
        the arrays' dtypes. Errors: InvalidTypeError naming the parameter."""
        for p, a in zip(params, values):
            if _is_array(a):
                if p.dtype is not None and a.dtype != p.dtype:
                    raise _type_error(self.site, f"{p.name} is declared {p.dtype.name}, got an array "
                                                 f"of {a.dtype.name} {tuple(a.shape)}")
                self.bind(p, a.dtype, True)
            elif outputs:
                raise _type_error(self.site, f"output {p.name} must be a kiln.ndarray, got "
                                             f"{type(a).__name__}")
            elif _scalar_dtype(a) is None:
                raise _type_error(self.site, f"{p.name} must be a kiln.ndarray or a number, got "
                                             f"{type(a).__name__}")

    def bind_numbers(self, params: list[_Param], values: list[Any]) -> None:
        """Binds the placeholders that only numbers give (after bind_arrays)."""
        for p, a in zip(params, values):
            if not _is_array(a):
                self.bind(p, _scalar_dtype(a), False)

    def of(self, param: _Param) -> Any:
        if param.dtype is not None:
            return param.dtype
        dtype = self.bound.get(param.placeholder or "")
        if dtype is None:
            raise _usage(self.site, f"the type {param.placeholder} of {param.name} is not known: "
                                    "pass an argument of that type")
        return dtype


class Kernel:
    """A kernel from LLVM IR (text or bitcode) in kiln's user-kernel ABI
    (runtime/include/kiln/runtime/kernel_abi.h): ``entry`` is the element function
    ``define void @entry(ptr %context, <one LLVM parameter per declared parameter>)``, run once per
    element index; an array is a ``ptr`` to its first element, a scalar ``float``, ``double``,
    ``i32`` or ``i64``; it may call kiln_index, kiln_count, kiln_heap_allocate and kiln_assert.

    ``params``: ``"in float32 x, in float32 y, out float32 z, float32 scale"``: in/out/inout
    arrays (one element per index, unless ``raw``) and scalars. Compiled for the current device
    when made; the IR is checked whole first (it parses, verifies, its signature matches params,
    it calls only what kiln provides): otherwise KernelCompileError with the line and column.

    ``k(*args, size=None)`` launches it: arrays for array parameters (every non-raw array has
    the launch's element count; ``size`` gives it when all arrays are raw), numbers for scalars.
    Errors: InvalidTypeError / InvalidUsageError naming the parameter (count, kind, dtype, shape,
    an output overlapping another argument), before anything runs; DeviceHeapExhaustedError when
    kiln_heap_allocate ran dry, RuntimeFaultError for a failed kiln_assert (its message and
    index). Thread-safe.
    """

    def __init__(self, ir: str | bytes, entry: str, params: str = "") -> None:
        site = "make kernel"
        self.entry = _check_name(entry, site)
        self._params = _parse_params(params, "params", site, kinds=True)
        if not isinstance(ir, (str, bytes)):
            raise _type_error(site, f"ir must be LLVM IR text (str) or bitcode (bytes), got "
                                    f"{type(ir).__name__}")
        self._ir = ir
        self._declared = [(p.name, p.kind, p.dtype, p.raw) for p in self._params]
        self._compiled()  # compile errors now, not at the first call

    def _compiled(self, device: Any = None) -> Any:
        device = _kiln.current_device() if device is None else device
        key = (_kiln._executor_generation(device), "ir", self._ir, self.entry, tuple(self._declared))
        return _cached(key, lambda: _kiln._compile_ir(self._ir, self.entry, self._declared), device)

    @property
    def code_size_bytes(self) -> int:
        """Bytes of compiled code for the current device, charged to it as code_object while
        cached."""
        return int(self._compiled().code_size_bytes)

    def __call__(self, *args: Any, size: int | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise _type_error("call " + self.entry, f"unknown keyword arguments {sorted(kwargs)}; "
                                                    "the call takes the arguments in order, and size=")
        _kiln._check_operands("call " + self.entry, [d[0] for d in self._declared], list(args))
        _kiln._launch_kernel(self._compiled(_call_device(args)), list(args), size)

    def __repr__(self) -> str:
        params = ", ".join(f"{'raw ' if raw else ''}{k} {d.name} {n}" for n, k, d, raw in self._declared)
        return f"kiln.Kernel({self.entry!r}, params={params!r})"
