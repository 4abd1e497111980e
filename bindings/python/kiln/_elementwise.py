"""kiln.ElementwiseKernel (CuPy's signature and meaning): an operation in kiln's operation
language run once per element of the broadcast shape of its arguments. The parameter syntax, the
cache of compiled specializations and kiln.Kernel are in _kernels.py."""

from __future__ import annotations

import math
import numbers
from typing import Any

from . import _kiln
from ._errors import NotSupportedError
from ._kernels import (_FAST_ENTRIES, _Types, _cached, _call_device, _check_name, _instances,
                       _is_array, _parse_params, _type_error, _usage)


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
