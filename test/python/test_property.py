"""A stateful property test of the Python package (Hypothesis RuleBasedStateMachine).

Random sequences of create, free, from_numpy, to_numpy, every op (fill, copy, axpy with an ndarray
or a numpy x, reduce_sum, matmul with and without out=, compact_positive), zero-copy views, fault
injection (kiln.testing.fail_allocation), budget changes and re-inits (kiln.init), OOM observers and
empty_cache, on mock, cpu and (when KILN_TEST_FAKE_CUDA / KILN_TEST_FAKE_HIP are set) the fake CUDA
and HIP drivers. After every step:
- every error raised is a kiln.Error of the family its cause calls for: the out-of-memory family
  only when memory was really short (the refusal's own figures say so) or a fault was armed,
  InvalidUsageError for bad input;
- memory_stats()["allocated_bytes"] equals the executor's own bytes (read right after init) plus
  the nbytes of the live arrays;
- every array's contents equal a numpy model's, and a failed operation changed nothing.

Configuration (environment):
  KILN_PROPERTY_EXAMPLES  sequences per backend (default 40: CI, about 30 s for four backends)
  KILN_PROPERTY_STEPS     steps per sequence (default 40)
  KILN_PROPERTY_SEED      a seed for a random run; unset: derandomized (the same run every time)
  KILN_PROPERTY_BURST     random steps per "burst" rule (default 4): the same rules with arguments
                          from a numpy generator, invariants checked after each; long runs use
                          more (Hypothesis's own step costs several times a kiln call)
  KILN_PROPERTY_SHRINK    0: no shrinking, the first failure as found (scripts/mutation-check)
  KILN_PROPERTY_REPORT    a file to which the operation count is appended (every 10,000 and at
                          the end of each backend's run)
A long run (issue 11: at least 1,000,000 operations over the four backends), e.g.:
  KILN_PROPERTY_EXAMPLES=2500 KILN_PROPERTY_STEPS=200 KILN_PROPERTY_SEED=20261201 \
  KILN_PROPERTY_REPORT=/tmp/property.txt KILN_TEST_FAKE_CUDA=... KILN_TEST_FAKE_HIP=... \
  PYTHONPATH=build/python python3 -m pytest -q -s test/python/test_property.py
The kiln calls made are counted (OPERATIONS) and printed at the end of each backend's run.
"""
import contextlib
import ctypes
import os

import numpy as np
import pytest

import kiln
import kiln.testing

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, settings, strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant,  # noqa: E402
                                 precondition, rule, run_state_machine_as_test)

MiB = 1 << 20
EXAMPLES = int(os.environ.get("KILN_PROPERTY_EXAMPLES", "40"))
STEPS = int(os.environ.get("KILN_PROPERTY_STEPS", "40"))
SEED = os.environ.get("KILN_PROPERTY_SEED")
REPORT = os.environ.get("KILN_PROPERTY_REPORT")
BURST = int(os.environ.get("KILN_PROPERTY_BURST", "4"))

DTYPES = {kiln.f32: np.float32, kiln.f64: np.float64, kiln.i32: np.int32, kiln.i64: np.int64}
KILN_DTYPES = list(DTYPES)
# Values stay small so that every result is exact in every dtype (|value| <= LIMIT, sums of at
# most a few thousand of them fit the 24-bit mantissa of f32 only when small: see exact_sum).
LIMIT = 1 << 12

OPERATIONS = {"count": 0}


def count():
    """Counts one kiln call; every 10,000 a progress line goes to KILN_PROPERTY_REPORT."""
    OPERATIONS["count"] += 1
    if REPORT and OPERATIONS["count"] % 10_000 == 0:
        with open(REPORT, "a") as f:
            f.write(f"progress: {OPERATIONS['count']} operations\n")


def backends():
    """(name, arch, environment, fake library, its reset entry point) of each backend to run."""
    out = [("cpu", "cpu", {}, None, None), ("mock", "mock", {}, None, None)]
    if os.environ.get("KILN_TEST_FAKE_CUDA"):
        path = os.environ["KILN_TEST_FAKE_CUDA"]
        out.append(("cuda", "cuda", {"KILN_CUDA_DRIVER": path}, path, "kiln_fake_cuda_reset"))
    if os.environ.get("KILN_TEST_FAKE_HIP"):
        path = os.environ["KILN_TEST_FAKE_HIP"]
        out.append(("amdgpu", "amdgpu", {"KILN_HIP_RUNTIME": path}, path, "kiln_fake_hip_reset"))
    return out


class Live:
    """One live kiln.ndarray, its numpy model (None while its contents are unknown) and the bytes
    the ledger charged for it (nbytes, rounded up to the caching pool's size class)."""

    def __init__(self, array, model, accounted_bytes):
        self.array = array
        self.model = model
        self.accounted_bytes = accounted_bytes  # what its allocation added to allocated_bytes


def integral(model):
    """Whether every value of `model` is a whole number (what an array read before it was ever
    written may hold is arbitrary: its sums and products are not exact)."""
    if model.dtype.kind == "i":
        return True
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.isfinite(model)) and np.all(model == np.round(model)))


def exact_sum(model):
    """numpy's sum of `model` when every dtype sums it exactly (whole numbers, small enough),
    else None."""
    if not integral(model):
        return None
    total = np.abs(model.astype(np.float64)).sum()
    limit = (1 << 24) if model.dtype == np.float32 else (1 << 31) if model.dtype == np.int32 else (1 << 52)
    return model.astype(np.float64).sum() if total < limit else None


def one_d(n):
    return (n,)


def big_one_d(mib):
    """A 1-D shape of `mib` MiB in f64 (half that in the 4-byte dtypes)."""
    return ((mib * MiB) // 8,)


def random_shape(rng):
    """The numpy-RNG twin of KilnMachine.shapes (for bursts)."""
    kind = rng.integers(0, 3)
    if kind == 0:
        return tuple(int(d) for d in rng.integers(0, 10, size=rng.integers(1, 4)))
    if kind == 1:
        return one_d(int(rng.integers(1, 4097)))
    return big_one_d(int(rng.integers(1, 13)))


def random_fault(rng):
    return None if rng.integers(0, 2) == 0 else int(rng.integers(1, 5))


class KilnMachine(RuleBasedStateMachine):
    """The state: the executor's configuration, its own bytes, the live arrays and their models,
    arrays of replaced executors (stale) and freed arrays."""

    arch = "cpu"

    def __init__(self):
        super().__init__()
        self.live = []
        self.stale = []
        self.freed = []
        self.base_bytes = 0
        self.config = {}
        self.observer_id = None
        self.observer_victims = []
        self.observer_calls = 0
        self.observer_errors = []

    # -- helpers ---------------------------------------------------------------------------------

    def pick(self, i):
        return self.live[i % len(self.live)]

    def limit(self):
        return kiln.memory_stats()["limit_bytes"]

    def room(self):
        """Bytes the budget has left for new arrays (the pool's cache is evicted under pressure)."""
        s = kiln.memory_stats()
        return s["limit_bytes"] - s["allocated_bytes"]

    def check_oom(self, e, requested, room_before, fault, operands=()):
        """An out-of-memory error is truthful: a fault was armed, or memory was really short.
        The one other error an operation may end in here: an OOM observer freed one of its
        operands to make room (then kiln says the operand was used after it was freed)."""
        if isinstance(e, kiln.InvalidUsageError) and any(v.array.is_freed for v in operands):
            assert "freed" in str(e), str(e)
            return
        assert isinstance(e, kiln.OutOfMemoryError) and isinstance(e, MemoryError), repr(e)
        if fault and type(e) is kiln.DeviceOutOfMemoryError:
            assert e.driver_status == "injected fault (FaultPlan)", str(e)
            return
        if type(e) is kiln.BudgetExceededError:
            if e.budget_check == "live_free":  # refused by live free device memory
                assert e.requested_bytes + e.reserve_bytes > e.free_bytes, str(e)
            else:  # the limit refused: never because of the pool's rounding (exact fallback)
                assert e.budget_check == "limit", str(e)
                assert e.requested_bytes >= requested, (requested, str(e))
                assert e.requested_bytes > room_before, (room_before, str(e))
            return
        if type(e) is kiln.DeviceHeapExhaustedError:
            return  # checked by the caller (only compact_positive may see it)
        raise AssertionError(f"unexpected {type(e).__name__} (fault={fault}): {e}")

    @contextlib.contextmanager
    def maybe_fault(self, at):
        """fail_allocation(at=at) around the block when at is not None."""
        if at is None:
            yield
            return
        with kiln.testing.fail_allocation(at=at):
            yield

    def sweep_observer_victims(self):
        """Arrays an OOM observer freed leave the model; returns the bytes they were charged."""
        gone = [v for v in self.live if v.array.is_freed]
        for v in gone:
            assert any(v is w for w in self.observer_victims)
            self.live.remove(v)
            self.freed.append(v.array)
        self.observer_victims = [v for v in self.observer_victims if not v.array.is_freed]
        return sum(v.accounted_bytes for v in gone)

    def check_accounted(self, accounted, nbytes):
        """The ledger charges an array its size, rounded up by the caching pool (when on) to a
        size class: at least 512 B, at most 25 % more above (caching_pool.h)."""
        if nbytes == 0:
            assert accounted == 0
        elif not self.config["caching"]:
            assert accounted == nbytes, (accounted, nbytes)
        else:
            assert nbytes <= accounted <= max(512, nbytes + nbytes // 4 + 1), (accounted, nbytes)

    def new_array(self, make, model, nbytes, fault, operands=()):
        """Runs `make` (which allocates `nbytes`, reading `operands`); on success the array
        joins the model."""
        room = self.room()
        before = kiln.memory_stats()["allocated_bytes"]
        try:
            with self.maybe_fault(fault):
                a = make()
            count()
        except kiln.Error as e:
            count()
            self.check_oom(e, nbytes, room, fault is not None, operands)
            self.sweep_observer_victims()
            return None
        freed = self.sweep_observer_victims()
        assert a.nbytes == nbytes
        accounted = kiln.memory_stats()["allocated_bytes"] - before + freed
        self.check_accounted(accounted, nbytes)
        self.live.append(Live(a, model, accounted))
        return a

    # -- set-up and re-init ----------------------------------------------------------------------

    def reinit(self, budget, heap, caching):
        config = dict(num_threads=2, caching=caching)
        if budget is not None:
            config["budget_bytes"] = budget
        if heap is not None:
            config["device_heap_bytes"] = heap
        if self.arch == "mock":
            config["mock_capacity_bytes"] = 512 * MiB
        before = kiln.memory_stats() if self.config else None
        try:
            kiln.init(arch=self.arch, **config)
            count()
        except kiln.BudgetExceededError as e:
            count()
            # Only a budget smaller than the executor's own memory (code, device heap) is refused.
            assert budget is not None, str(e)
            assert e.requested_bytes + sum(e.in_use_bytes.values()) > budget, str(e)
            if before is not None:  # the old executor stays, unchanged
                assert kiln.memory_stats()["allocated_bytes"] == before["allocated_bytes"]
            return False
        self.stale.extend(self.live)
        self.live = []
        self.observer_id = None
        self.observer_victims = []
        self.config = config
        self.base_bytes = kiln.memory_stats()["allocated_bytes"]
        return True

    @initialize(budget=st.sampled_from([None, 24 * MiB, 64 * MiB]),
                heap=st.sampled_from([None, 1 * MiB, 64 * 1024]), caching=st.booleans())
    def start(self, budget, heap, caching):
        assert self.reinit(budget, heap, caching) or self.reinit(None, None, True)

    @rule(budget=st.sampled_from([None, 512 * 1024, 20 * MiB, 40 * MiB, 256 * MiB]),
          heap=st.sampled_from([None, 1 * MiB, 64 * 1024]), caching=st.booleans())
    def init_again(self, budget, heap, caching):
        self.reinit(budget, heap, caching)
        while len(self.stale) > 6:  # arrays of old executors: freeing them works
            old = self.stale.pop(0)
            old.array.free()
            count()
            self.freed.append(old.array)

    # -- arrays ----------------------------------------------------------------------------------

    shapes = st.one_of(
        st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple),
        st.integers(1, 4096).map(one_d),
        st.integers(1, 12).map(big_one_d),  # refusals happen
    )
    faults = st.one_of(st.none(), st.integers(1, 4))

    @rule(dtype=st.sampled_from(KILN_DTYPES), shape=shapes, fault=faults)
    def create(self, dtype, shape, fault):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.new_array(lambda: kiln.ndarray(dtype, shape), None, nbytes, fault)

    @rule(dtype=st.sampled_from(KILN_DTYPES),
          shape=st.lists(st.integers(0, 7), min_size=1, max_size=3).map(tuple),
          seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["c", "f", "strided", "swapped"]),
          fault=faults)
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

    # -- operations ------------------------------------------------------------------------------

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
    @rule(i=st.integers(0, 99), value=st.integers(-9, 9), fault=faults)
    def fill(self, i, value, fault):
        v = self.pick(i)
        ok, _ = self.launch(lambda: kiln.fill(v.array, value), fault, [v])
        if ok:
            v.model = np.full(v.array.shape, value, dtype=DTYPES[v.array.dtype])

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), fault=faults)
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
          host=st.booleans(), fault=faults)
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
    @rule(i=st.integers(0, 99), fault=faults)
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
          use_out=st.booleans(), fault=faults)
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
    @rule(i=st.integers(0, 99), fault=faults)
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

    # -- memory management -----------------------------------------------------------------------

    @rule()
    def empty_cache(self):
        kiln.empty_cache()
        count()
        assert kiln.memory_stats()["cached_bytes"] == 0

    @precondition(lambda self: self.live and self.observer_id is None)
    @rule(i=st.integers(0, 99))
    def add_observer(self, i):
        """An OOM observer that frees one chosen array (the allocation is then retried)."""
        victim = self.pick(i)
        self.observer_victims = [victim]

        def observer(error):
            try:
                assert isinstance(error, kiln.OutOfMemoryError), repr(error)
                self.observer_calls += 1
                for v in self.observer_victims:
                    if not v.array.is_freed:
                        try:
                            v.array.free()
                        except kiln.InvalidUsageError:
                            pass  # in use by the failing operation, or viewed: it stays
            except BaseException as e:  # kiln reports an observer's error as unraisable only
                self.observer_errors.append(e)
                raise

        self.observer_id = kiln.add_oom_observer(observer)
        count()

    @precondition(lambda self: self.observer_id is not None)
    @rule()
    def remove_observer(self):
        kiln.remove_oom_observer(self.observer_id)
        count()
        self.observer_id = None
        self.observer_victims = []

    # -- bursts: many random operations per Hypothesis step (long runs) -------------------------

    def burst_steps(self, rng):
        """(name, call) of one random step with numpy-drawn arguments, or None when its
        precondition does not hold. The same rules, the same checks as Hypothesis's steps."""
        i, j, k = (int(x) for x in rng.integers(0, 100, size=3))
        dtype = KILN_DTYPES[int(rng.integers(0, 4))]
        value = int(rng.integers(-9, 10))
        fault = random_fault(rng)
        have = bool(self.live)
        table = [
            ("create", True, lambda: self.create(dtype, random_shape(rng), fault)),
            ("from_numpy", True, lambda: self.from_numpy(
                dtype, tuple(int(d) for d in rng.integers(0, 8, size=rng.integers(1, 4))),
                int(rng.integers(0, 2**32)), ["c", "f", "strided", "swapped"][int(rng.integers(0, 4))],
                fault)),
            ("to_numpy", have, lambda: self.to_numpy(i)),
            ("view", have, lambda: self.view(i, value, bool(rng.integers(0, 2)))),
            ("free", have, lambda: self.free(i)),
            ("use_after_free_or_replace", bool(self.freed or self.stale),
             lambda: self.use_after_free_or_replace(
                 i, ["to_numpy", "fill", "reduce_sum", "free"][int(rng.integers(0, 4))])),
            ("fill", have, lambda: self.fill(i, value, fault)),
            ("copy", have, lambda: self.copy(i, j, fault)),
            ("axpy", have, lambda: self.axpy(int(rng.integers(-3, 4)), i, j,
                                              bool(rng.integers(0, 2)), fault)),
            ("reduce_sum", have, lambda: self.reduce_sum(i, fault)),
            ("matmul", have, lambda: self.matmul(i, j, k, bool(rng.integers(0, 2)), fault)),
            ("compact_positive", have, lambda: self.compact_positive(i, fault)),
            ("empty_cache", True, self.empty_cache),
            ("add_observer", have and self.observer_id is None, lambda: self.add_observer(i)),
            ("remove_observer", self.observer_id is not None, self.remove_observer),
            ("init_again", rng.integers(0, 4) == 0, lambda: self.init_again(
                [None, 512 * 1024, 20 * MiB, 40 * MiB, 256 * MiB][int(rng.integers(0, 5))],
                [None, 1 * MiB, 64 * 1024][int(rng.integers(0, 3))], bool(rng.integers(0, 2)))),
        ]
        name, allowed, call = table[int(rng.integers(0, len(table)))]
        return (name, call) if allowed else None

    @precondition(lambda self: BURST > 0)
    @rule(seed=st.integers(0, 2**32 - 1))
    def burst(self, seed):
        """BURST random steps from a numpy generator seeded by `seed`, every invariant checked
        after each; a failure names the seed and the steps taken."""
        rng = np.random.default_rng(seed)
        done = []
        try:
            for _ in range(BURST):
                step = self.burst_steps(rng)
                if step is None:
                    continue
                done.append(step[0])
                step[1]()
                self.observers_did_not_fail()
                self.memory_is_accounted()
        except BaseException as e:
            raise AssertionError(f"burst seed {seed}, steps {done}: {e!r}") from e

    # -- after every step ------------------------------------------------------------------------

    @invariant()
    def observers_did_not_fail(self):
        assert not self.observer_errors, self.observer_errors

    @invariant()
    def memory_is_accounted(self):
        if not self.config:
            return
        self.sweep_observer_victims()  # whatever path the observer ran on
        s = kiln.memory_stats()
        held = sum(v.accounted_bytes for v in self.live)
        assert s["allocated_bytes"] == self.base_bytes + held, (s, self.base_bytes, held)
        assert s["current_total_bytes"] == s["allocated_bytes"] + s["current_bytes"]["pool_cache"]
        assert s["current_total_bytes"] <= s["limit_bytes"], s  # the budget is never passed

    def teardown(self):
        for v in self.live + self.stale:
            if not v.array.is_freed:
                v.array.free()
        if self.config:
            assert kiln.memory_stats()["allocated_bytes"] == self.base_bytes


def hypothesis_settings():
    kwargs = dict(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), print_blob=True)
    if SEED is None:
        kwargs["derandomize"] = True
    if os.environ.get("KILN_PROPERTY_SHRINK") == "0":  # report the first failure as found
        kwargs["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    return settings(**kwargs)


@pytest.mark.parametrize("name,arch,env,library,reset", backends(), ids=[b[0] for b in backends()])
def test_random_sequences_keep_errors_memory_and_results_truthful(monkeypatch, name, arch, env,
                                                                    library, reset):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # The fake driver is reset only while no executor uses it (the global one is cpu here).
    reset_fn = getattr(ctypes.CDLL(library), reset) if library else None
    if reset_fn is not None:
        reset_fn()
    machine = type(f"KilnMachine_{name}", (KilnMachine,), {"arch": arch})
    start = OPERATIONS["count"]
    if SEED is not None:
        machine = hypothesis.seed(int(SEED))(machine)
    try:
        run_state_machine_as_test(machine, settings=hypothesis_settings())
    finally:
        done = OPERATIONS["count"] - start
        line = f"kiln property test on {name}: {done} operations, seed {SEED or 'derandomized'}"
        print(line)
        if REPORT:
            with open(REPORT, "a") as f:
                f.write(line + "\n")
        kiln.init(arch="cpu", num_threads=2)
        if reset_fn is not None:
            reset_fn()
