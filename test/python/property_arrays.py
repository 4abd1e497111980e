"""The array rules of the property test: create, from_numpy, to_numpy, zero-copy views, free, and
use after free or after the executor was replaced."""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import kiln
from property_model import DTYPES, FAULTS, KILN_DTYPES, SHAPES, big_one_d, count, one_d


class ArrayRules:
    """Rules of KilnMachine (test_property.py), which holds the state and the checks they use."""


    shapes = st.one_of(
        st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple),
        st.integers(1, 4096).map(one_d),
        st.integers(1, 12).map(big_one_d),  # refusals happen
    )
    faults = st.one_of(st.none(), st.integers(1, 4))

    @rule(dtype=st.sampled_from(KILN_DTYPES), shape=SHAPES, fault=FAULTS)
    def create(self, dtype, shape, fault):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.new_array(lambda: kiln.ndarray(dtype, shape), None, nbytes, fault)

    @rule(dtype=st.sampled_from(KILN_DTYPES),
          shape=st.lists(st.integers(0, 7), min_size=1, max_size=3).map(tuple),
          seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["c", "f", "strided", "swapped"]),
          fault=FAULTS)
    def from_numpy(self, dtype, shape, seed, layout, fault):
        rng = np.random.default_rng(seed)
        model = rng.integers(-9, 10, size=shape).astype(DTYPES[dtype])
        host = model
        if layout == "f":
            host = np.asfortranarray(model)
        elif layout == "strided":
            wide = np.zeros(shape[:-1] + (shape[-1] * 2,), dtype=model.dtype)
            wide[..., ::2] = model
            host = wide[..., ::2]
        elif layout == "swapped":
            host = model.astype(model.dtype.newbyteorder(">" if model.dtype.byteorder != ">" else "<"))
        self.new_array(lambda: kiln.from_numpy(host), model.copy(), model.nbytes, fault)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def to_numpy(self, i):
        v = self.pick(i)
        got = v.array.to_numpy()
        count()
        if v.model is not None:
            np.testing.assert_array_equal(got, v.model)
        else:
            v.model = got.copy()  # unknown until read once: from now on it is the model
        assert got.dtype == DTYPES[v.array.dtype] and got.shape == v.array.shape

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), value=st.integers(-9, 9), try_free=st.booleans())
    def view(self, i, value, try_free):
        v = self.pick(i)
        if self.arch not in ("cpu", "mock") and v.array.size:  # zero-size: nothing to map
            with pytest.raises(kiln.NotSupportedError):
                np.asarray(v.array)
            count()
            return
        host = np.asarray(v.array)
        count()
        assert host.shape == v.array.shape
        if v.model is not None:
            np.testing.assert_array_equal(host, v.model)
        if try_free:
            with pytest.raises(kiln.InvalidUsageError):  # a view is alive
                v.array.free()
            count()
        if host.size:
            host.flat[0] = value
            v.model = host.copy() if v.model is None else v.model
            v.model.flat[0] = value
        del host

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def free(self, i):
        v = self.pick(i)
        v.array.free()
        count()
        self.live.remove(v)
        self.freed.append(v.array)
        if len(self.freed) > 8:
            self.freed.pop(0)

    @precondition(lambda self: self.freed or self.stale)
    @rule(i=st.integers(0, 99), op=st.sampled_from(["to_numpy", "fill", "reduce_sum", "free"]))
    def use_after_free_or_replace(self, i, op):
        """Arrays that were freed, or belong to a replaced executor: InvalidUsageError."""
        pool = [a for a in self.freed] + [s.array for s in self.stale if op != "free"]
        if not pool:
            return
        a = pool[i % len(pool)]
        calls = {"to_numpy": lambda: a.to_numpy(), "fill": lambda: kiln.fill(a, 1),
                 "reduce_sum": lambda: kiln.reduce_sum(a), "free": lambda: a.free()}
        with pytest.raises(kiln.InvalidUsageError):
            calls[op]()
        count()
