"""Every out-of-memory kind, each from a real path, caught as MemoryError; nothing stays held."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
import kiln.testing
from conftest import MiB, allocated_bytes, collect_unraisable


def test_the_issue_example_four_tib_on_cpu_is_refused_then_a_small_array_works():
    before = allocated_bytes()
    with pytest.raises(kiln.OutOfMemoryError) as info:
        kiln.ndarray(kiln.f32, (1 << 40,))
    e = info.value
    assert isinstance(e, MemoryError) and type(e) is kiln.BudgetExceededError
    assert e.requested_bytes == 4 << 40
    assert e.limit_bytes == kiln.memory_stats()["limit_bytes"] > 0
    assert e.category == "ndarray" and e.device == "cpu" and e.oom_source == "budget"
    assert "4.00 TiB" in str(e) and "budget" in str(e)
    assert allocated_bytes() == before
    a = kiln.ndarray(kiln.f32, (16,))
    kiln.fill(a, 3.0)
    assert a.to_numpy().tolist() == [3.0] * 16


def test_budget_refusal_names_the_budget_and_what_kiln_holds():
    kiln.init(arch="cpu", budget_bytes=64 * MiB, device_heap_bytes=1 * MiB)
    keep = kiln.ndarray(kiln.f32, (10 * MiB,))  # 40 MiB
    before = allocated_bytes()
    with pytest.raises(MemoryError) as info:
        kiln.ndarray(kiln.f32, (8 * MiB,))  # 32 MiB more does not fit in 64
    e = info.value
    assert type(e) is kiln.BudgetExceededError
    assert e.requested_bytes == 32 * MiB and e.limit_bytes == 64 * MiB
    assert e.in_use_bytes["ndarray"] >= 40 * MiB and e.site == "BudgetAdaptor::refused_outright"
    # The device's figures: a reading of this kernel tick (1 to 10 ms), its age in whole ms.
    assert e.total_bytes > 0 and 0 <= e.live_age_ms <= 10
    assert "64.00 MiB" in str(e) and "32.00 MiB" in str(e)
    assert allocated_bytes() == before
    assert kiln.memory_stats()["budget_refusals"] >= 1
    keep.free()
    b = kiln.ndarray(kiln.f32, (8 * MiB,))  # the identical call now fits
    assert b.nbytes == 32 * MiB


def test_live_free_memory_refusal_when_other_processes_hold_the_mock_device():
    kiln.init(arch="mock", mock_capacity_bytes=256 * MiB, reserve_bytes=0,
              budget_bytes=1 << 30, mock_other_process_bytes=200 * MiB)
    before = allocated_bytes()
    with pytest.raises(MemoryError) as info:
        kiln.ndarray(kiln.f64, (8 * MiB,))  # 64 MiB; about 40 MiB are free
    e = info.value
    assert type(e) is kiln.BudgetExceededError
    assert e.site == "BudgetAdaptor::check_live_free" and e.device == "mock"
    assert e.total_bytes == 256 * MiB and e.free_bytes < 64 * MiB
    assert allocated_bytes() == before
    assert kiln.memory_stats()["live_refusals"] == 1


def test_driver_refusal_on_the_mock_device():
    # The budget (1 GiB) is larger than the device (64 MiB) and the live check is off, so the
    # request reaches the mock driver, which refuses it.
    kiln.init(arch="mock", mock_capacity_bytes=64 * MiB, budget_bytes=1 << 30, live_check=False)
    before = allocated_bytes()
    with pytest.raises(MemoryError) as info:
        kiln.ndarray(kiln.f32, (24 * MiB,))  # 96 MiB
    e = info.value
    assert type(e) is kiln.DeviceOutOfMemoryError
    assert e.driver_status == "MOCK_ERROR_OUT_OF_MEMORY" and e.oom_source == "driver"
    assert e.requested_bytes == 96 * MiB and e.total_bytes == 64 * MiB and e.device == "mock"
    assert "MOCK_ERROR_OUT_OF_MEMORY" in str(e)
    assert allocated_bytes() == before
    assert kiln.memory_stats()["driver_ooms"] >= 1
    assert kiln.ndarray(kiln.f32, (4 * MiB,)).nbytes == 16 * MiB


def test_injected_fault_counts_only_allocations_inside_the_block():
    for _ in range(3):
        kiln.ndarray(kiln.f32, (4,))  # before the block: not counted
    before = allocated_bytes()
    with kiln.testing.fail_allocation(at=2):
        first = kiln.ndarray(kiln.f32, (4,))
        with pytest.raises(MemoryError) as info:
            kiln.ndarray(kiln.i64, (5,))
        third = kiln.ndarray(kiln.f32, (4,))
    e = info.value
    assert type(e) is kiln.DeviceOutOfMemoryError
    assert e.driver_status == "injected fault (FaultPlan)" and e.requested_bytes == 40
    del first, third
    assert allocated_bytes() == before
    kiln.ndarray(kiln.i64, (5,))  # the plan is cleared on exit


def test_injected_fault_is_cleared_when_the_block_raises():
    with pytest.raises(kiln.DeviceOutOfMemoryError):
        with kiln.testing.fail_allocation(at=1):
            kiln.ndarray(kiln.f32, (4,))
    for _ in range(5):
        kiln.ndarray(kiln.f32, (4,))


def test_an_unreached_fault_does_not_outlive_its_block():
    with kiln.testing.fail_allocation(at=3):
        kiln.ndarray(kiln.f32, (4,))  # only the 1st allocation happens inside
        assert kiln.testing.allocation_count() == 1
    for _ in range(5):  # the 3rd would fail if the plan were still armed
        kiln.ndarray(kiln.f32, (4,))


def test_fail_allocation_needs_a_positive_int():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(kiln.InvalidUsageError):
            with kiln.testing.fail_allocation(at=bad):
                pass


def test_a_launch_that_cannot_get_its_staging_launches_nothing_and_holds_nothing():
    y = kiln.from_numpy(np.zeros(1000, dtype=np.float64))
    x = np.arange(1000, dtype=np.float64)
    before = allocated_bytes()
    with kiln.testing.fail_allocation(at=1):
        with pytest.raises(kiln.DeviceOutOfMemoryError) as info:
            kiln.axpy(2.0, x, y)  # host x: its staging is the launch's only request
    assert info.value.category == "staging"
    assert allocated_bytes() == before
    assert y.to_numpy().sum() == 0.0  # nothing was launched
    kiln.axpy(2.0, x, y)
    np.testing.assert_array_equal(y.to_numpy(), 2.0 * x)


@pytest.mark.parametrize("arch", ["cpu", "mock"])
def test_launches_run_under_a_full_budget(arch):
    # The argument and result buffers belong to the executor (made with it), so a launch of
    # device arrays requests nothing: it runs when arrays fill the budget to the last byte.
    kiln.init(arch=arch, budget_bytes=8 * MiB, device_heap_bytes=0, caching=False)
    x = kiln.from_numpy(np.full(1000, 2.0))
    y = kiln.from_numpy(np.ones(1000))
    filler = []
    for nbytes in (MiB, 64 << 10, 4 << 10, 256, 8):
        while True:
            try:
                filler.append(kiln.ndarray(kiln.f64, (nbytes // 8,)))
            except MemoryError:
                break
    with pytest.raises(MemoryError):
        kiln.ndarray(kiln.f64, (1,))  # the budget is full
    kiln.fill(y, 3.0)
    kiln.axpy(2.0, x, y)
    assert kiln.reduce_sum(y) == 7000.0
    np.testing.assert_array_equal(y.to_numpy(), np.full(1000, 7.0))
    for a in filler:
        a.free()


def test_device_heap_exhaustion_in_compact_positive():
    kiln.init(arch="cpu", device_heap_bytes=64 * 1024)
    x = kiln.from_numpy(np.arange(1, 100_001, dtype=np.float32))
    before = allocated_bytes()
    with pytest.raises(MemoryError) as info:
        kiln.compact_positive(x)
    e = info.value
    assert type(e) is kiln.DeviceHeapExhaustedError
    assert e.oom_source == "device_heap" and e.category == "runtime_heap"
    assert e.requested_bytes > 0 and e.context == ("compacting f32[100000]",)
    assert allocated_bytes() == before
    small = kiln.from_numpy(np.array([3, -1, 0, 7], dtype=np.float32))
    np.testing.assert_array_equal(kiln.compact_positive(small).to_numpy(), [3, 7])


HOST_OOM_SCRIPT = textwrap.dedent("""
    import resource, kiln
    kiln.init(arch="cpu", num_threads=1)
    a = kiln.ndarray(kiln.f64, (16 << 20,))  # 128 MiB on the (host-memory) cpu device
    kiln.fill(a, 1.0)
    vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (32 << 20), resource.RLIM_INFINITY))
    try:
        a.to_numpy()  # needs 128 MiB of host memory for the copy
    except MemoryError as e:
        print(type(e).__name__, e.oom_source, e.requested_bytes, e.site)
""")


def test_host_out_of_memory_when_the_host_copy_cannot_be_had():
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", HOST_OOM_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["HostOutOfMemoryError", "host", str(128 << 20), "to_numpy"]


@pytest.mark.parametrize("kind", ["budget", "driver", "fault", "device_heap"])
def test_memory_error_catches_every_kind_and_the_baseline_comes_back(kind):
    if kind == "budget":
        kiln.init(arch="cpu", budget_bytes=32 * MiB)
        expected, action = kiln.BudgetExceededError, lambda: kiln.ndarray(kiln.f32, (16 * MiB,))
    elif kind == "driver":
        kiln.init(arch="mock", mock_capacity_bytes=32 * MiB, budget_bytes=1 << 30,
                  live_check=False)
        expected, action = kiln.DeviceOutOfMemoryError, lambda: kiln.ndarray(kiln.f32, (16 * MiB,))
    elif kind == "fault":
        expected = kiln.DeviceOutOfMemoryError

        def action():
            with kiln.testing.fail_allocation(at=1):
                kiln.ndarray(kiln.f32, (16,))
    else:
        kiln.init(arch="cpu", device_heap_bytes=4096)
        x = kiln.from_numpy(np.ones(10_000, dtype=np.float64))
        expected, action = kiln.DeviceHeapExhaustedError, lambda: kiln.compact_positive(x)
    before = allocated_bytes()
    for _ in range(3):  # the same refusal each time: nothing was kept by the previous one
        with pytest.raises(MemoryError) as info:
            action()
        assert type(info.value) is expected
        assert allocated_bytes() == before


def test_empty_cache_gives_the_pool_back():
    a = kiln.ndarray(kiln.f32, (1 << 20,))
    del a
    assert kiln.memory_stats()["cached_bytes"] >= 4 * MiB
    assert kiln.empty_cache() >= 4 * MiB
    assert kiln.memory_stats()["cached_bytes"] == 0


def test_a_freed_array_is_reused_lock_free_by_the_same_thread():
    for _ in range(2):  # the first is grown, the second reuses it
        a = kiln.ndarray(kiln.f32, (1024,))
        del a
    before = kiln.memory_stats()
    for _ in range(10):
        a = kiln.ndarray(kiln.f32, (1024,))
        del a
    after = kiln.memory_stats()
    assert after["cache_hits"] - before["cache_hits"] == 10
    assert after["lock_free_hits"] - before["lock_free_hits"] == 10
    assert after["allocated_bytes"] == before["allocated_bytes"]


def test_oom_observer_gets_the_exception_and_may_free_memory_for_a_retry():
    kiln.init(arch="cpu", budget_bytes=64 * MiB, device_heap_bytes=1 * MiB, caching=False)
    victims = [kiln.ndarray(kiln.f32, (10 * MiB,))]  # 40 MiB
    seen = []

    def observer(e):
        seen.append(e)
        while victims:
            victims.pop().free()

    oid = kiln.add_oom_observer(observer)
    b = kiln.ndarray(kiln.f32, (8 * MiB,))  # refused once, then retried after the observer
    assert b.nbytes == 32 * MiB
    assert len(seen) == 1 and type(seen[0]) is kiln.BudgetExceededError
    assert seen[0].requested_bytes == 32 * MiB and seen[0].limit_bytes == 64 * MiB
    assert kiln.memory_stats()["retries"] >= 1
    assert kiln.remove_oom_observer(oid) is True
    assert kiln.remove_oom_observer(oid) is False
    with pytest.raises(kiln.BudgetExceededError):
        kiln.ndarray(kiln.f32, (16 * MiB,))
    assert len(seen) == 1


def test_a_raising_observer_is_reported_and_the_original_error_still_raised():
    kiln.init(arch="cpu", budget_bytes=32 * MiB)

    def observer(e):
        raise KeyError("observer bug")

    kiln.add_oom_observer(observer)
    with collect_unraisable() as unraisable, pytest.raises(kiln.BudgetExceededError):
        kiln.ndarray(kiln.f32, (16 * MiB,))
    assert [type(u) for u in unraisable] == [KeyError]


def test_observer_runs_during_a_launch_without_the_gil_and_may_not_allocate():
    # The staging buffer of axpy (host x) is refused inside the launch, which runs without the
    # GIL: the observer re-acquires it, gets the exception, and may not allocate or launch.
    kiln.init(arch="cpu", budget_bytes=40 * MiB, device_heap_bytes=1 * MiB)
    y = kiln.ndarray(kiln.f64, (3 * MiB,))  # 24 MiB
    kiln.fill(y, 0.0)
    seen = []

    def observer(e):
        seen.append(e)
        kiln.ndarray(kiln.f32, (4,))

    kiln.add_oom_observer(observer)
    with collect_unraisable() as unraisable, pytest.raises(kiln.BudgetExceededError) as info:
        kiln.axpy(1.0, np.ones(3 * MiB), y)  # + 24 MiB of staging
    assert info.value.category == "staging"
    assert [type(e) for e in seen] == [kiln.BudgetExceededError] and seen[0].category == "staging"
    assert [type(u) for u in unraisable] == [kiln.InvalidUsageError]
    assert "OOM observer" in str(unraisable[0])


def test_an_array_in_use_by_a_running_launch_cannot_be_freed():
    kiln.init(arch="cpu", budget_bytes=40 * MiB, device_heap_bytes=1 * MiB)
    y = kiln.ndarray(kiln.f64, (3 * MiB,))
    kiln.fill(y, 0.0)
    kiln.add_oom_observer(lambda e: y.free())
    with collect_unraisable() as unraisable, pytest.raises(kiln.BudgetExceededError):
        kiln.axpy(1.0, np.ones(3 * MiB), y)
    assert [type(u) for u in unraisable] == [kiln.InvalidUsageError]
    assert "in use" in str(unraisable[0])
    assert not y.is_freed
    assert kiln.reduce_sum(y) == 0.0


def test_init_drops_the_observers_of_the_executor_it_replaces():
    kiln.init(arch="cpu", budget_bytes=32 * MiB)
    seen = []
    kiln.add_oom_observer(seen.append)
    kiln.init(arch="cpu", budget_bytes=32 * MiB)
    with pytest.raises(kiln.BudgetExceededError):
        kiln.ndarray(kiln.f32, (16 * MiB,))
    assert seen == []
    oid = kiln.add_oom_observer(seen.append)
    with pytest.raises(kiln.BudgetExceededError):
        kiln.ndarray(kiln.f32, (16 * MiB,))
    assert len(seen) == 1 and kiln.remove_oom_observer(oid)


class _ObserverGate:
    """Thread `name` calls kiln.ndarray(f32, (elements,)) and stops in the OOM observer of its
    refused allocation (GIL released) until open() (the observer then frees `victim`, so that
    the retry succeeds); the array, or the error, is in .outcome once joined."""

    def __init__(self, victim, elements):
        import threading
        self.entered, self.go, self.outcome = threading.Event(), threading.Event(), []

        def observer(error):
            if not self.entered.is_set():
                self.entered.set()
                self.go.wait(30)
                victim.free()
        kiln.add_oom_observer(observer)

        def allocate():
            try:
                self.outcome.append(kiln.ndarray(kiln.f32, (elements,)))
            except MemoryError as e:
                self.outcome.append(e)
        self.thread = threading.Thread(target=allocate)
        self.thread.start()
        assert self.entered.wait(30)

    def open(self):
        self.go.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        [result] = self.outcome
        return result


def test_an_executor_replaced_while_kiln_ndarray_is_in_an_observer_lives_until_it_returns():
    """kiln.ndarray holds a reference to the executor: when its allocation's OOM observer lets
    another thread run kiln.init, the replaced executor lives until that call has returned (its
    retry allocates on it), and the array it made is whole."""
    kiln.init("cpu", num_threads=2, budget_bytes=32 * MiB, device_heap_bytes=1 * MiB)
    first = _ObserverGate(kiln.ndarray(kiln.f32, (7_000_000,)), 2_000_000)  # 28 of 32 MiB held
    kiln.init("cpu", num_threads=2, budget_bytes=32 * MiB, device_heap_bytes=1 * MiB)
    second = _ObserverGate(kiln.ndarray(kiln.f32, (7_000_000,)), 2_000_000)
    kiln.init("cpu", num_threads=2)
    a = first.open()
    b = second.open()
    for made in (a, b):  # made on a retired executor: whole, and free() drops its handle
        assert made.shape == (2_000_000,) and made.device == "cpu"
        with pytest.raises(kiln.InvalidUsageError, match="belongs to another executor"):
            kiln.fill(made, 1.0)  # as for any array of a replaced executor
        made.free()
        assert made.is_freed
    c = kiln.ndarray(kiln.f32, (4,))
    kiln.fill(c, 1.0)
    assert kiln.reduce_sum(c) == 4.0


def test_an_observer_that_refers_to_an_array_does_not_leak_after_init():
    import gc
    import weakref
    y = kiln.ndarray(kiln.f32, (4,))
    observer = lambda e, a=y: a.free()  # noqa: E731  (y -> device -> observer -> y)
    ref = weakref.ref(observer)
    kiln.add_oom_observer(observer)
    del observer
    kiln.init(arch="cpu")
    del y
    gc.collect()
    assert ref() is None


def test_matmul_operands_stay_pinned_while_its_output_is_refused():
    # An OOM observer that frees the operands cannot turn the refusal of matmul's output into a
    # use-after-free usage error: the caller gets the out-of-memory error, the operands live on.
    kiln.init("cpu", budget_bytes=24 << 20, device_heap_bytes=1 << 20)
    a = kiln.from_numpy(np.ones((2048, 1), dtype=np.float32))
    b = kiln.from_numpy(np.ones((1, 2048), dtype=np.float32))  # a @ b is 16 MiB
    hog = kiln.ndarray(kiln.f32, (2 << 20,))                     # 8 MiB: the output cannot fit
    tried = []

    def observer(e):
        for operand in (a, b):
            try:
                operand.free()
            except kiln.InvalidUsageError as refused:
                tried.append(str(refused))

    oid = kiln.add_oom_observer(observer)
    try:
        with pytest.raises(kiln.BudgetExceededError):
            kiln.matmul(a, b)
    finally:
        kiln.remove_oom_observer(oid)
    assert len(tried) >= 2 and all("in use" in t for t in tried), tried
    assert not a.is_freed and not b.is_freed
    assert kiln.reduce_sum(a) == 2048.0
    del hog
