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
from typing import Any

import numpy as np

from . import _kiln
from ._errors import InvalidTypeError, InvalidUsageError, NotSupportedError

__all__ = ["Kernel", "ElementwiseKernel", "ReductionKernel"]

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


def _broadcast_shape(shapes: list[tuple[int, ...]], names: list[str], site: str) -> tuple[int, ...]:
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape, name in zip(shapes, names):
        for k, extent in enumerate(shape):
            at = ndim - len(shape) + k
            if extent != 1 and result[at] not in (1, extent):
                raise _usage(site, "the arguments do not broadcast together: " + ", ".join(
                    f"{n} {tuple(s)}" for n, s in zip(names, shapes)) + f" ({name})")
            if extent != 1:
                result[at] = extent
    return tuple(result)


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether an array of ``shape`` broadcasts to exactly ``target`` (numpy's rule)."""
    if len(shape) > len(target):
        return False
    return all(e in (1, t) for e, t in zip(shape, target[len(target) - len(shape):]))


def _broadcast_strides(shape: tuple[int, ...], full: tuple[int, ...]) -> list[int]:
    """Element strides of a C-contiguous array of `shape` over the dimensions of `full`
    (0 where it is broadcast)."""
    strides = [0] * len(full)
    step = 1
    for k in range(len(shape) - 1, -1, -1):
        at = len(full) - len(shape) + k
        strides[at] = step if shape[k] != 1 else 0
        step *= shape[k]
    return strides


class ElementwiseKernel:
    """CuPy's ElementwiseKernel: ``operation`` runs once per element index ``i`` of the
    broadcast shape of the arguments, in kiln's operation language (kernel_language.h: C-like
    statements, ``z = (x - y) * (x - y)``; casts, locals, sqrt exp log sin cos tan tanh abs min
    max floor ceil pow fma and more), compiled to LLVM IR by kiln itself.

    ``in_params``, ``out_params``: ``"float32 x, T y"``. ``k(x, y)`` allocates the outputs (the
    broadcast shape; a placeholder's dtype from the arguments), ``k(x, y, z)`` writes z in place.
    An input may be a kiln.ndarray or a number (a scalar; a placeholder it alone binds is int64 for
    an int, float64 for a float). Returns the output, a tuple of several (or always with
    ``return_tuple=True``), or None with ``no_return=True``.

    Errors: KernelCompileError when the operation does not parse (when the kernel is made) or
    does not type-check (at the first call with new types: unknown name or function, wrong
    arity, an input assigned), with ``line`` and ``column``; InvalidUsageError for a declaration
    that is wrong; at a call, InvalidTypeError / InvalidUsageError naming the parameter (wrong
    count, a dtype other than declared, shapes that do not broadcast, an output of the wrong
    shape or overlapping another argument) before anything is allocated; an OutOfMemoryError
    subclass when an output cannot be had. Thread-safe.
    """

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 reduce_dims: bool = True, preamble: str = "", no_return: bool = False,
                 return_tuple: bool = False, **kwargs: Any) -> None:
        site = "make ElementwiseKernel"
        self.name = _check_name(name, site)
        self.in_params = _parse_params(in_params, "in_params", site)
        self.out_params = _parse_params(out_params, "out_params", site)
        for p in self.in_params + self.out_params:
            if p.raw:
                raise NotSupportedError(f"kiln could not {site}: raw parameters ({p.name}) are not "
                                        "in kiln's operation language yet", device="kiln",
                                        site=site, result="not_supported", oom_source="none")
            if p.name == "i":
                raise _usage(site, "a parameter may not be named i (the element's index)")
        names = [p.name for p in self.in_params + self.out_params]
        if len(set(names)) != len(names):
            raise _usage(site, "a name is both an input and an output: " + ", ".join(names))
        if not self.out_params:
            raise _usage(site, "out_params declares no output")
        if preamble or kwargs:
            raise NotSupportedError(f"kiln could not {site}: preamble and CUDA options have no "
                                    "meaning for kiln's operation language", device="kiln",
                                    site=site, result="not_supported", oom_source="none")
        if not isinstance(operation, str):
            raise _type_error(site, f"operation must be a str, got {type(operation).__name__}")
        self.operation = operation
        self.no_return, self.return_tuple = no_return, return_tuple
        _kiln._check_kernel_syntax(operation, True, f"operation of kernel {self.name}")
        # Argument signature (its device's executor generation first) -> (kernel, the dtypes of
        # the outputs to allocate, shape, device, generation).
        self._fast: dict[Any, tuple[Any, list[Any], tuple[int, ...], Any, int]] = {}

    def __call__(self, *args: Any, size: int | None = None, **kwargs: Any) -> Any:
        # A call whose arguments have the types, dtypes and shapes of an earlier call's passed
        # every check that depends on them then: it goes straight to the launch (which checks
        # again what can change: freed arrays, overlaps).
        signature = None
        if size is None and not kwargs:
            signature = _kiln._argument_signature(*args)  # the executor's generation first
            if signature is not None:
                hit = self._fast.get(signature)
                if hit is not None:
                    return self._launch(hit[0], list(args), hit[1], hit[2], hit[3])
        if kwargs:
            raise _type_error("call " + self.name, f"unknown keyword arguments {sorted(kwargs)}; "
                                                   "the call takes the arguments in order, and size=")
        return self._checked_call(args, size, _call_device(args), signature)

    def _launch(self, kernel: Any, arguments: list[Any], out_dtypes: list[Any], shape: tuple[int, ...],
                device: Any) -> Any:
        """Allocates the outputs not passed (`out_dtypes`, of `shape`, on `device`) and launches."""
        made: list[Any] = []
        try:
            for dtype in out_dtypes:
                out = _kiln.ndarray(dtype, shape, device=device)
                made.append(out)
                arguments.append(out)
            _kiln._launch_kernel(kernel, arguments, math.prod(shape))
        except BaseException:
            for out in made:
                out.free()
            raise
        if self.no_return:
            return None
        outputs = arguments[len(self.in_params):]
        if len(self.out_params) == 1 and not self.return_tuple:
            return outputs[0]
        return tuple(outputs)

    def _checked_call(self, args: tuple[Any, ...], size: int | None, device: Any, signature: Any) -> Any:
        site = "call " + self.name
        n_in, n_out = len(self.in_params), len(self.out_params)
        if len(args) not in (n_in, n_in + n_out):
            raise _usage(site, f"takes {n_in} arguments (inputs) or {n_in + n_out} (inputs and "
                               f"outputs), got {len(args)}")
        inputs, outputs = list(args[:n_in]), list(args[n_in:])
        _kiln._check_operands(site, [p.name for p in self.in_params + self.out_params], inputs + outputs)
        generation = _kiln._executor_generation(device)  # opens a device that is not yet
        types = _Types(site)
        types.bind_arrays(self.in_params, inputs)
        types.bind_arrays(self.out_params, outputs, outputs=True)
        types.bind_numbers(self.in_params, inputs)
        arrays = [(p.name, tuple(a.shape)) for p, a in zip(self.in_params + self.out_params,
                                                              inputs + outputs) if _is_array(a)]
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, numbers.Integral):
                raise _type_error(site, f"size must be an int, got {type(size).__name__}")
            if not 0 <= size < 1 << 63:
                raise _usage(site, f"size {size} is not in [0, 2**63)")
        if arrays:
            in_arrays = [(p.name, tuple(a.shape)) for p, a in zip(self.in_params, inputs) if _is_array(a)]
            in_shape = _broadcast_shape([s for _, s in in_arrays], [n for n, _ in in_arrays], site)
            for p, a in zip(self.out_params, outputs):  # an output must hold the inputs' shape
                if not _broadcasts_to(in_shape, tuple(a.shape)):
                    raise _usage(site, f"output {p.name} has shape {tuple(a.shape)}, the inputs "
                                       f"broadcast to {in_shape}")
            shape = _broadcast_shape([s for _, s in arrays], [n for n, _ in arrays], site)
            if size is not None and size != math.prod(shape):
                raise _usage(site, f"size={size}, but the arguments broadcast to {shape} "
                                   f"({math.prod(shape)} elements); size is for a call without arrays")
        elif size is not None:
            shape = (int(size),)
        else:
            raise _usage(site, "no argument is an array: pass size= (the element count)")
        for p, a in zip(self.out_params, outputs):
            if tuple(a.shape) != shape:
                raise _usage(site, f"output {p.name} has shape {tuple(a.shape)}, the arguments "
                                   f"broadcast to {shape}")
        params: list[tuple[str, Any, bool, bool, list[int]]] = []
        broadcast = False
        for p, a in zip(self.in_params, inputs):
            dtype = types.of(p)
            strides: list[int] = []
            if _is_array(a) and tuple(a.shape) != shape:
                strides, broadcast = _broadcast_strides(tuple(a.shape), shape), True
            params.append((p.name, dtype, _is_array(a), False, strides))
        for p in self.out_params:
            params.append((p.name, types.of(p), True, True, []))
        type_names = sorted(types.bound.items())
        key = (generation, "elementwise", self.name, self.operation,
               tuple((n, d, arr, o, tuple(s)) for n, d, arr, o, s in params),
               shape if broadcast else None, tuple(type_names))
        kernel = _cached(key, lambda: _kiln._compile_elementwise(
            self.name, self.operation, params, list(shape), type_names), device)
        out_dtypes = [types.of(p) for p in self.out_params[len(outputs):]]
        if signature is not None:
            if len(self._fast) >= _FAST_ENTRIES:
                self._fast.clear()  # never unbounded (configure's _clear_cache empties it too)
            self._fast[signature] = (kernel, out_dtypes, shape, device, generation)
            _instances.add(self)
        return self._launch(kernel, inputs + outputs, out_dtypes, shape, device)


class ReductionKernel:
    """CuPy's ReductionKernel: ``map_expr`` maps each element (the inputs' names), ``reduce_expr``
    folds two mapped values ``a`` and ``b``, starting from ``identity``; ``post_map_expr`` writes
    the outputs from the result ``a`` (``"y = sqrt(a)"``). All in kiln's operation language.

    ``k(x, axis=None, keepdims=False, out=None)``: over the whole array (a 0-d output), or over one
    ``axis`` (the output has the other dimensions). The inputs' arrays have one shape; numbers
    are scalars. ``reduce_type`` (default: the first output's type) is the type of ``a`` and
    ``b``. The fold runs in parallel over parts of the reduced axis (on GPUs, interleaved threads
    and a tree of launches of fan-in 256), then over the parts' results, and may be reassociated
    (vectorized): the order of a floating-point sum differs from numpy's
    pairwise sum, and results agree to rounding. Errors: as ElementwiseKernel's; identity None is InvalidUsageError (kiln needs an
    identity). Thread-safe.
    """

    def __init__(self, in_params: str, out_params: str, map_expr: str, reduce_expr: str,
                 post_map_expr: str, identity: Any, name: str = "reduce_kernel",
                 reduce_type: str | None = None, reduce_dims: bool = True, preamble: str = "",
                 **kwargs: Any) -> None:
        site = "make ReductionKernel"
        self.name = _check_name(name, site)
        self.in_params = _parse_params(in_params, "in_params", site)
        self.out_params = _parse_params(out_params, "out_params", site)
        if not self.in_params or not self.out_params:
            raise _usage(site, "a reduction needs an input and an output")
        for p in self.in_params + self.out_params:
            if p.raw or p.name in ("a", "b", "i") or p.name.startswith("_"):
                raise _usage(site, f"parameter {p.name}: a, b and i are the reduction's own names, "
                                   "names starting with _ are kiln's, raw is not supported")
        if identity is None:
            raise _usage(site, "identity is None: kiln's reductions start from an identity "
                               "(\"0\" for a sum, \"1\" for a product, \"-INFINITY\" is written "
                               "-1.0/0.0)")
        if preamble or kwargs:
            raise NotSupportedError(f"kiln could not {site}: preamble and CUDA options have no "
                                    "meaning for kiln's operation language", device="kiln",
                                    site=site, result="not_supported", oom_source="none")
        texts: list[str] = []
        for what, text in (("map_expr", map_expr), ("reduce_expr", reduce_expr),
                           ("post_map_expr", post_map_expr), ("identity", identity)):
            if what == "identity":
                text = _identity_text(text, site)
            if not isinstance(text, str):
                raise _type_error(site, f"{what} must be a str, got {type(text).__name__}")
            _kiln._check_kernel_syntax(text, what == "post_map_expr", f"{what} of kernel {self.name}")
            texts.append(text)
        self.texts = (texts[0], texts[1], texts[2], texts[3])
        if reduce_type is not None and (not isinstance(reduce_type, str) or reduce_type not in _DTYPE_NAMES):
            raise _usage(site, f"reduce_type {reduce_type!r} is not a type kiln has")
        self.reduce_type = reduce_type

    def __call__(self, *args: Any, out: Any = None, axis: int | None = None,
                 keepdims: bool = False, **kwargs: Any) -> Any:
        site = "call " + self.name
        if kwargs:
            raise _type_error(site, f"unknown keyword arguments {sorted(kwargs)}; the call takes "
                                    "the inputs in order, out=, axis= and keepdims=")
        if not isinstance(keepdims, (bool, np.bool_)):
            raise _type_error(site, f"keepdims must be True or False, got {type(keepdims).__name__}")
        if len(args) != len(self.in_params):
            hint = (" (outputs go in out=, as CuPy's)"
                    if len(args) == len(self.in_params) + len(self.out_params) else "")
            raise _usage(site, f"takes {len(self.in_params)} inputs, got {len(args)}{hint}")
        inputs = list(args)
        outs_given = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
        _kiln._check_operands(site, [p.name for p in self.in_params + self.out_params], inputs + outs_given)
        types = _Types(site)
        types.bind_arrays(self.in_params, inputs)
        types.bind_numbers(self.in_params, inputs)
        shapes = {tuple(a.shape) for a in inputs if _is_array(a)}
        if len(shapes) != 1:
            raise _usage(site, "the inputs' arrays must have one shape, got " + (
                ", ".join(f"{p.name} {tuple(a.shape)}" for p, a in zip(self.in_params, inputs)
                          if _is_array(a)) or "no array"))
        shape = shapes.pop()
        if axis is None:
            k, outer, inner = math.prod(shape), 1, 1
            out_shape: tuple[int, ...] = (1,) * len(shape) if keepdims else ()
        else:
            if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
                raise _type_error(site, f"axis must be an int or None, got {type(axis).__name__}")
            if not -len(shape) <= axis < len(shape):
                raise _usage(site, f"axis {axis} is out of range for shape {shape}")
            ax = int(axis) % len(shape)
            k, outer, inner = shape[ax], math.prod(shape[:ax]), math.prod(shape[ax + 1:])
            out_shape = shape[:ax] + ((1,) if keepdims else ()) + shape[ax + 1:]
        outputs: list[Any] = []
        if out is not None:
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if len(outs) != len(self.out_params):
                raise _usage(site, f"out gives {len(outs)} arrays for {len(self.out_params)} outputs")
            types.bind_arrays(self.out_params, outs, outputs=True)
            for p, o in zip(self.out_params, outs):
                if tuple(o.shape) != out_shape:
                    raise _usage(site, f"out {p.name} has shape {tuple(o.shape)}, the reduction "
                                       f"gives {out_shape}")
            outputs = outs
        out_dtypes = [types.of(p) for p in self.out_params]
        reduce_dtype = _DTYPE_NAMES[self.reduce_type] if self.reduce_type else out_dtypes[0]
        ins: list[tuple[str, Any, bool, bool, list[int]]] = [
            (p.name, types.of(p), _is_array(a), False, []) for p, a in zip(self.in_params, inputs)]
        outs_decl: list[tuple[str, Any, bool, bool, list[int]]] = [
            (p.name, d, True, True, []) for p, d in zip(self.out_params, out_dtypes)]
        type_names = sorted(types.bound.items())
        device = _call_device(inputs)
        key = (_kiln._executor_generation(device), "reduction", self.name, tuple(self.texts),
               tuple((n, d, a) for n, d, a, _, _ in ins), tuple((n, d) for n, d, *_ in outs_decl),
               reduce_dtype, tuple(type_names))
        partial, fold, combine = _cached(key, lambda: _kiln._compile_reduction(
            self.name, self.texts, ins, outs_decl, reduce_dtype, type_names), device)
        n_outputs = outer * inner
        parts, lanes, fold_lanes, combine_parts = _kiln._reduction_plan(fold, k, n_outputs, inner)
        scalars = [a for a in inputs if not _is_array(a)]
        made: list[Any] = []
        try:
            for d in out_dtypes[len(outputs):]:
                o = _kiln.ndarray(d, out_shape, device=device)
                made.append(o)
                outputs.append(o)
            staging = [_kiln.ndarray(reduce_dtype, (max(1, n_outputs * parts * lanes),), device=device)]
            made.append(staging[0])
            if fold_lanes > 0:  # the GPUs' middle level: parts * lanes values to fold_lanes
                staging.append(_kiln.ndarray(reduce_dtype, (n_outputs * fold_lanes,), device=device))
                made.append(staging[1])
            if n_outputs > 0:
                _kiln._launch_kernel(partial, inputs + [staging[0], k, inner, parts, lanes],
                                     n_outputs * parts * lanes)
                if fold_lanes > 0:
                    _kiln._launch_kernel(fold, [staging[0], staging[1], parts * lanes, fold_lanes],
                                         n_outputs * fold_lanes)
                _kiln._launch_kernel(combine, [staging[-1]] + outputs + scalars + [combine_parts],
                                     n_outputs)
        except BaseException:
            for o in made:
                o.free()
            raise
        for o in staging:
            o.free()
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

