"""The operation rules of the property test: fill, copy, axpy (an ndarray or a numpy x), reduce_sum,
matmul with and without out=, compact_positive, each under an optional allocation fault."""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import kiln
from property_model import DTYPES, FAULTS, LIMIT, Live, count, exact_sum, integral


class OpRules:
    """Rules of KilnMachine (test_property.py), which holds the state and the checks they use."""


    def launch(self, fn, fault, touched, needs_bytes=0):
        """Runs op `fn` under an optional fault. On an error: it is truthful and nothing changed
        (the arrays in `touched` still equal their models). Returns (ok, value)."""
        room = self.room()
        try:
            with self.maybe_fault(fault):
                value = fn()
            count()
            self.sweep_observer_victims()
            return True, value
        except kiln.Error as e:
            count()
            self.check_oom(e, needs_bytes, room, fault is not None, touched)
            self.sweep_observer_victims()
            for v in touched:
                if v.model is not None and not v.array.is_freed:
                    np.testing.assert_array_equal(v.array.to_numpy(), v.model)
            return False, None

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), value=st.integers(-9, 9), fault=FAULTS)
    def fill(self, i, value, fault):
        v = self.pick(i)
        ok, _ = self.launch(lambda: kiln.fill(v.array, value), fault, [v])
        if ok:
            v.model = np.full(v.array.shape, value, dtype=DTYPES[v.array.dtype])

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), fault=FAULTS)
    def copy(self, i, j, fault):
        dst, src = self.pick(i), self.pick(j)
        valid = dst.array.dtype == src.array.dtype and dst.array.shape == src.array.shape
        if not valid:
            with pytest.raises(kiln.InvalidUsageError):
                with self.maybe_fault(fault):
                    kiln.copy(dst.array, src.array)
            count()
            return
        ok, _ = self.launch(lambda: kiln.copy(dst.array, src.array), fault, [dst, src])
        if ok:
            dst.model = None if src.model is None else src.model.copy()

    def small(self, v):
        return v.model is not None and integral(v.model) and (
            v.model.size == 0 or np.abs(v.model).max() <= LIMIT)

    @precondition(lambda self: self.live)
    @rule(alpha=st.integers(-3, 3), i=st.integers(0, 99), j=st.integers(0, 99),
          host=st.booleans(), fault=FAULTS)
    def axpy(self, alpha, i, j, host, fault):
        x, y = self.pick(i), self.pick(j)
        same = x.array.dtype == y.array.dtype and x.array.shape == y.array.shape
        if not (self.small(x) and self.small(y)):
            return  # values could outgrow exactness; fill/from_numpy bring them back
        if host:
            xs = x.model.copy()
            if not same:
                with pytest.raises(kiln.InvalidUsageError):
                    kiln.axpy(alpha, xs, y.array)
                count()
                return
            ok, _ = self.launch(lambda: kiln.axpy(alpha, xs, y.array), fault, [y])
        else:
            if not same:
                with pytest.raises(kiln.InvalidUsageError):
                    with self.maybe_fault(fault):
                        kiln.axpy(alpha, x.array, y.array)
                count()
                return
            ok, _ = self.launch(lambda: kiln.axpy(alpha, x.array, y.array), fault, [x, y])
        if ok:
            y.model = (alpha * x.model.astype(np.int64) + y.model.astype(np.int64)).astype(y.model.dtype)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), fault=FAULTS)
    def reduce_sum(self, i, fault):
        v = self.pick(i)
        ok, total = self.launch(lambda: kiln.reduce_sum(v.array), fault, [v])
        if ok and v.model is not None:
            expected = exact_sum(v.model)
            if expected is not None:
                assert total == expected, (total, expected)
            is_int = v.model.dtype.kind == "i"
            assert isinstance(total, int) if is_int else isinstance(total, float)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), k=st.integers(0, 99),
          use_out=st.booleans(), fault=FAULTS)
    def matmul(self, i, j, k, use_out, fault):
        a, b = self.pick(i), self.pick(j)
        if not (self.small(a) and self.small(b)):
            return
        two_d = a.array.ndim == 2 and b.array.ndim == 2
        valid = two_d and a.array.dtype == b.array.dtype and a.array.shape[1] == b.array.shape[0]
        out = None
        if use_out:
            out = self.pick(k)
            if out is a or out is b:
                valid = False  # aliasing is refused
            if not (two_d and out.array.shape == (a.array.shape[0], b.array.shape[1])
                    and out.array.dtype == a.array.dtype):
                valid = False
        if not valid:
            with pytest.raises(kiln.InvalidUsageError):  # checked before anything is allocated
                with self.maybe_fault(fault):
                    kiln.matmul(a.array, b.array, out=None if out is None else out.array)
            count()
            return
        expected = (a.model.astype(np.int64) @ b.model.astype(np.int64)).astype(a.model.dtype)
        if np.abs(expected).max(initial=0) > (1 << 24):
            return
        if use_out:
            ok, _ = self.launch(lambda: kiln.matmul(a.array, b.array, out=out.array), fault,
                                [a, b, out])
            if ok:
                out.model = expected
            return
        nbytes = expected.nbytes
        self.new_array(lambda: kiln.matmul(a.array, b.array), expected, nbytes, fault, [a, b])

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), fault=FAULTS)
    def compact_positive(self, i, fault):
        v = self.pick(i)
        if v.model is None:
            return
        expected = v.model[v.model > 0].ravel()
        room = self.room()
        before = kiln.memory_stats()["allocated_bytes"]
        try:
            with self.maybe_fault(fault):
                out = kiln.compact_positive(v.array)
            count()
        except kiln.DeviceHeapExhaustedError as e:
            count()
            # The heap's use per element depends on the backend (a block per thread on GPUs),
            # so only this much is sure: there was something to allocate.
            assert expected.size > 0, str(e)
            assert e.category == "runtime_heap" and e.requested_bytes > 0, str(e)
            return
        except kiln.Error as e:
            count()
            # The refusal may be of the launch's own buffers as well as of the output: its
            # figures are checked against the room, not against the output's size.
            self.check_oom(e, 0, room, fault is not None, [v])
            return
        freed = self.sweep_observer_victims()
        accounted = kiln.memory_stats()["allocated_bytes"] - before + freed
        self.check_accounted(accounted, out.nbytes)
        got = out.to_numpy()
        np.testing.assert_array_equal(got, expected)  # compaction keeps the order
        self.live.append(Live(out, got, accounted))
