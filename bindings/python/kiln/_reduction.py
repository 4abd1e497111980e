"""kiln.ReductionKernel (CuPy's signature and meaning): map, fold and post-map expressions in
kiln's operation language, over a whole array or one axis. The parameter syntax, the cache of
compiled specializations and kiln.Kernel are in _kernels.py."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from . import _kiln
from ._errors import NotSupportedError
from ._kernels import (_DTYPE_NAMES, _Types, _cached, _call_device, _check_name, _identity_text,
                       _is_array, _parse_params, _type_error, _usage)


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
