"""The user-kernel rules of the property test: an ElementwiseKernel writing a new array or one in
place, and a ReductionKernel over the whole array, each under an optional allocation fault. Their
compiled code is charged as code_object while kiln caches it (until the next kiln.init), so each
call's change of that category joins the executor's own bytes."""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import kiln
from property_model import FAULTS, Live, count, exact_sum

# z = 2x - 1 and the sum of x, in each argument's own dtype (T): exact for the small whole
# numbers the models hold.
TWICE_MINUS_ONE = kiln.ElementwiseKernel("T x", "T z", "z = x * 2 - 1", "prop_twice_minus_one")
SUM = kiln.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "prop_sum")


class UserKernelRules:
    """Rules of KilnMachine (test_property.py), which holds the state and the checks they use."""

    def user_call(self, fn, fault, touched):
        """Runs a user-kernel call under an optional fault. The code it compiled joins the base
        bytes. On an error: it is out-of-memory and truthful (the code, an output or a launch
        buffer may have been refused, so its size is not checked against one array), and the
        arrays in `touched` are unchanged. Returns (ok, value, bytes it left allocated)."""
        room = self.room()
        code_before = kiln.memory_stats()["current_bytes"]["code_object"]
        before = kiln.memory_stats()["allocated_bytes"]
        try:
            with self.maybe_fault(fault):
                value = fn()
            ok = True
        except kiln.Error as e:
            ok, value = False, None
            self.check_oom(e, 0, room, fault is not None, touched)
        count()
        freed = self.sweep_observer_victims()
        code = kiln.memory_stats()["current_bytes"]["code_object"] - code_before
        assert code >= 0, code  # cached code stays charged until kiln.init
        self.base_bytes += code
        left = kiln.memory_stats()["allocated_bytes"] - before + freed - code
        if not ok:
            assert left == 0, left  # a failed call keeps nothing
            for v in touched:
                if v.model is not None and not v.array.is_freed:
                    np.testing.assert_array_equal(v.array.to_numpy(), v.model)
        return ok, value, left

    def twice_minus_one(self, model):
        return (model.astype(np.int64) * 2 - 1).astype(model.dtype)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), fault=FAULTS)
    def user_elementwise(self, i, fault):
        x = self.pick(i)
        if not self.small(x):
            return
        ok, z, left = self.user_call(lambda: TWICE_MINUS_ONE(x.array), fault, [x])
        if ok:
            assert z.dtype == x.array.dtype and z.shape == x.array.shape
            self.check_accounted(left, z.nbytes)
            self.live.append(Live(z, self.twice_minus_one(x.model), left))
            np.testing.assert_array_equal(z.to_numpy(), self.live[-1].model)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), fault=FAULTS)
    def user_elementwise_in_place(self, i, j, fault):
        x, z = self.pick(i), self.pick(j)
        if not self.small(x):
            return
        try:  # numpy's rule, as CuPy's: the input broadcasts to the output's shape
            fits = np.broadcast_shapes(x.array.shape, z.array.shape) == z.array.shape
        except ValueError:
            fits = False
        aliased = z is x and x.array.size > 0  # an empty array writes nothing, overlaps nothing
        if aliased or z.array.dtype != x.array.dtype or not fits:
            # Aliasing, another dtype, a shape x does not broadcast to: refused before anything
            # is allocated.
            room = self.room()
            code_before = kiln.memory_stats()["current_bytes"]["code_object"]
            with pytest.raises(kiln.InvalidUsageError):
                with self.maybe_fault(fault):
                    TWICE_MINUS_ONE(x.array, z.array)
            count()
            self.base_bytes += kiln.memory_stats()["current_bytes"]["code_object"] - code_before
            assert self.room() <= room  # only code was charged
            return
        ok, out, left = self.user_call(lambda: TWICE_MINUS_ONE(x.array, z.array), fault, [x, z])
        if ok:
            assert out is z.array and left == 0
            z.model = np.broadcast_to(self.twice_minus_one(x.model), z.array.shape).copy()

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), fault=FAULTS)
    def user_reduction(self, i, fault):
        x = self.pick(i)
        if x.model is None or x.array.size == 0:
            return
        ok, y, left = self.user_call(lambda: SUM(x.array), fault, [x])
        if not ok:
            return
        assert y.shape == () and y.dtype == x.array.dtype
        self.check_accounted(left, y.nbytes)
        total = y.to_numpy()[()]
        expected = exact_sum(x.model)
        if expected is not None:
            assert total == expected, (total, expected)
        y.free()
        count()
