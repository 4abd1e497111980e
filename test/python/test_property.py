"""A stateful property test of the Python package (Hypothesis RuleBasedStateMachine).

Random sequences of create, free, from_numpy, to_numpy, every op (fill, copy, axpy with an ndarray
or a numpy x, reduce_sum, matmul with and without out=, compact_positive), user kernels (an
ElementwiseKernel into a new array or in place, a ReductionKernel), zero-copy views, fault
injection (kiln.testing.fail_allocation), budget changes and re-inits (kiln.init), OOM observers and
empty_cache, on mock, cpu and (when KILN_TEST_FAKE_CUDA / KILN_TEST_FAKE_HIP are set) the fake CUDA
and HIP drivers. After every step:
- every error raised is a kiln.Error of the family its cause calls for: the out-of-memory family
  only when memory was really short (the refusal's own figures say so) or a fault was armed,
  InvalidUsageError for bad input;
- memory_stats()["allocated_bytes"] equals the executor's own bytes (read right after init, plus
  the code of the user kernels compiled since) plus
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
A long run (at least 1,000,000 operations over the four backends), e.g.:
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

from property_arrays import ArrayRules  # noqa: E402
from property_model import (BURST, EXAMPLES, KILN_DTYPES, MiB, OPERATIONS, REPORT,  # noqa: E402
                            SEED, STEPS, Live, backends, count, random_fault, random_shape)
from property_ops import OpRules  # noqa: E402
from property_user_kernels import UserKernelRules  # noqa: E402


class KilnMachine(ArrayRules, OpRules, UserKernelRules, RuleBasedStateMachine):
    """The state: the executor's configuration, its own bytes, the live arrays and their models,
    arrays of replaced executors (stale) and freed arrays. The array and operation rules are in
    property_arrays.py, property_ops.py and property_user_kernels.py; set-up, memory management, bursts and the checks
    after every step are here."""

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
            if before is not None:  # the old executor stays, unchanged but for the user kernels
                # kiln.init drops the compiled user kernels before it makes the new executor (a
                # lost GPU recovers only once nothing holds its context), so their code goes.
                after = kiln.memory_stats()
                dropped = before["current_bytes"]["code_object"] - after["current_bytes"]["code_object"]
                assert dropped >= 0, dropped
                assert after["allocated_bytes"] == before["allocated_bytes"] - dropped
                self.base_bytes -= dropped
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
            ("user_elementwise", have, lambda: self.user_elementwise(i, fault)),
            ("user_elementwise_in_place", have, lambda: self.user_elementwise_in_place(i, j, fault)),
            ("user_reduction", have, lambda: self.user_reduction(i, fault)),
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
