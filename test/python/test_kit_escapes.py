"""A kiln.testing call never passes a test that tested nothing. For each kit call a workload
that escapes it is a named kit error, never a report that claims a pass: sweep and min_budget
refuse a nested kit call, kiln.init and threads left running; fail_allocation and inject refuse
kiln.init and a kit call inside them; every one refuses a fault block entered and never left.
A workload whose thread is joined is counted as it should be."""
import pickle
import threading

import pytest

import kiln
import kiln.testing
from kiln.testing import (KitEscapeError, MinBudgetError, ShadowedFaultError, SweepError,
                          fail_allocation, inject, min_budget, sweep)

MiB = 1 << 20
INIT = {"arch": "mock", "device_heap_bytes": 64 << 10, "caching": False}


def two_arrays():
    a = kiln.ndarray(kiln.f32, 1024)
    b = kiln.ndarray(kiln.f32, 1024)
    b.free()
    a.free()


def budgeted_workload():
    two_arrays()


def assert_nothing_armed():
    for _ in range(8):
        kiln.ndarray(kiln.f32, 4).free()


# --- sweep ---------------------------------------------------------------------------------------

def test_a_sweep_inside_a_sweeps_workload_is_a_kit_error_not_a_pass():
    kiln.init(arch="cpu")
    with pytest.raises(KitEscapeError, match="sweep was called inside the workload of "
                                             "kiln.testing.sweep") as caught:
        sweep(lambda: sweep(two_arrays))
    assert (caught.value.call, caught.value.escape) == ("sweep", "sweep")
    assert_nothing_armed()
    assert sweep(two_arrays).allocations == 2  # the kit is usable after


def test_min_budget_inside_a_sweeps_workload_is_a_kit_error():
    kiln.init(arch="cpu")
    with pytest.raises(KitEscapeError) as caught:
        sweep(lambda: (two_arrays(), min_budget(budgeted_workload, init_kwargs=INIT)))
    assert (caught.value.call, caught.value.escape) == ("sweep", "min_budget")
    assert_nothing_armed()


def test_a_fail_allocation_block_in_a_sweeps_workload_that_shadows_its_fault_is_named():
    kiln.init(arch="cpu")

    def own_block():
        kiln.ndarray(kiln.f32, 4).free()  # request 1: the sweep's fault reaches it
        with fail_allocation(at=5):  # requests 2 and 3 happen under the workload's own plan
            two_arrays()

    with pytest.raises(ShadowedFaultError, match="run 2: allocation request 2 went by inside "
                                                 "the workload's own") as caught:
        sweep(own_block)
    assert caught.value.at == 2
    assert [r.at for r in caught.value.report.runs] == [1]  # run 1 was tested and kept
    assert_nothing_armed()


def test_an_inject_block_in_a_sweeps_workload_that_shadows_its_fault_is_named():
    kiln.init(arch="cpu")

    def own_spec():
        with inject("min_bytes=1GiB"):  # never fails here, but replaces the sweep's plan
            two_arrays()

    with pytest.raises(ShadowedFaultError) as caught:
        sweep(own_spec)
    assert caught.value.at == 1
    assert_nothing_armed()


def test_a_block_that_ends_before_the_sweeps_request_shadows_nothing():
    kiln.init(arch="cpu")

    def block_first():
        with inject("min_bytes=1GiB"):
            pass
        two_arrays()

    report = sweep(block_first)
    assert report.allocations == 2 and not report.broken


def test_a_workload_that_leaves_a_thread_running_is_refused():
    kiln.init(arch="cpu")
    release = threading.Event()
    started: list[threading.Thread] = []

    def leaves_a_thread():
        two_arrays()
        t = threading.Thread(target=release.wait, name="kiln-test-straggler")
        t.start()
        started.append(t)

    try:
        with pytest.raises(SweepError, match=r"left thread\(s\) running .*kiln-test-straggler"):
            sweep(leaves_a_thread)
    finally:
        release.set()
        for t in started:
            t.join()
    assert_nothing_armed()


def test_a_workload_whose_thread_allocates_and_is_joined_is_swept_over_every_request():
    kiln.init(arch="cpu")

    def joined_thread():
        errors = []

        def work():
            try:
                two_arrays()
            except MemoryError as e:
                errors.append(e)

        t = threading.Thread(target=work)
        t.start()
        t.join()
        if errors:
            raise errors[0]

    report = sweep(joined_thread)
    assert report.allocations == 2 and [r.raised for r in report.runs] == [
        "DeviceOutOfMemoryError", "DeviceOutOfMemoryError"]


# --- min_budget ----------------------------------------------------------------------------------

def test_min_budget_over_a_workload_that_calls_init_is_refused_not_a_budget():
    # The case: a 400 MiB workload "needed" 16 MiB, on an executor min_budget never made.
    def reinit_then_allocate():
        kiln.init(arch="mock")
        kiln.ndarray(kiln.f32, 100 * MiB).free()  # 400 MiB

    with pytest.raises(MinBudgetError, match="the workload called kiln.init"):
        min_budget(reinit_then_allocate, max_budget_bytes=512 * MiB, init_kwargs=INIT)


def test_min_budget_over_a_workload_that_makes_a_fake_device_is_refused():
    def fake_device():
        with kiln.testing.fake_cuda(256 * MiB):
            kiln.init(arch="cuda", device_heap_bytes=4096)  # a device min_budget never budgeted
            kiln.ndarray(kiln.f32, 1024).free()

    with pytest.raises(MinBudgetError, match="the workload called kiln.init"):
        min_budget(fake_device, max_budget_bytes=64 * MiB, init_kwargs=INIT)


def test_min_budget_inside_min_budget_and_sweep_inside_min_budget_are_kit_errors():
    inner_min = lambda: min_budget(budgeted_workload, init_kwargs=INIT)  # noqa: E731
    with pytest.raises(KitEscapeError) as caught:
        min_budget(inner_min, max_budget_bytes=8 * MiB, init_kwargs=INIT)
    assert (caught.value.call, caught.value.escape) == ("min_budget", "min_budget")
    with pytest.raises(KitEscapeError) as caught:
        min_budget(lambda: sweep(two_arrays), max_budget_bytes=8 * MiB, init_kwargs=INIT)
    assert (caught.value.call, caught.value.escape) == ("min_budget", "sweep")
    assert min_budget(budgeted_workload, max_budget_bytes=8 * MiB,
                      init_kwargs=INIT).budget_bytes > 0  # usable after


def test_an_injected_fault_in_a_min_budget_workload_is_not_taken_for_the_budget():
    def own_fault():
        with fail_allocation(at=1):
            two_arrays()

    with pytest.raises(MinBudgetError, match="raised an injected fault"):
        min_budget(own_fault, max_budget_bytes=8 * MiB, init_kwargs=INIT)


def test_min_budget_over_a_workload_that_leaves_a_thread_running_is_refused():
    release = threading.Event()
    started: list[threading.Thread] = []

    def leaves_a_thread():
        t = threading.Thread(target=release.wait, name="kiln-test-budget-straggler")
        t.start()
        started.append(t)

    try:
        with pytest.raises(MinBudgetError, match="kiln-test-budget-straggler"):
            min_budget(leaves_a_thread, max_budget_bytes=8 * MiB, init_kwargs=INIT)
    finally:
        release.set()
        for t in started:
            t.join()


# --- fail_allocation and inject ------------------------------------------------------------------

@pytest.mark.parametrize("block", [lambda: fail_allocation(at=2), lambda: inject("nth=2")],
                         ids=["fail_allocation", "inject"])
def test_init_inside_a_fault_block_is_a_kit_error_at_its_exit(block):
    kiln.init(arch="cpu")
    with pytest.raises(KitEscapeError, match="kiln.init was called inside a kiln.testing") as caught:
        with block():
            kiln.init(arch="cpu")
            two_arrays()  # would have failed at the 2nd request: nothing failed
    assert caught.value.escape == "kiln.init"
    assert caught.value.call in ("fail_allocation", "inject")
    assert_nothing_armed()


def test_an_exception_leaving_a_block_that_init_escaped_keeps_its_type_with_a_note():
    kiln.init(arch="cpu")
    with pytest.raises(KeyError) as caught:
        with fail_allocation(at=1):
            kiln.init(arch="cpu")
            raise KeyError("the workload's own")
    assert any("kiln.init was called inside" in n for n in caught.value.__notes__)


# --- the injected attribute ----------------------------------------------------------------------

def test_an_injected_fault_says_so_and_a_budget_refusal_does_not():
    kiln.init(arch="cpu", budget_bytes=1 * MiB, device_heap_bytes=4096)
    with fail_allocation(at=1):
        with pytest.raises(kiln.DeviceOutOfMemoryError) as injected:
            kiln.ndarray(kiln.f32, 4)
    with pytest.raises(kiln.BudgetExceededError) as refused:
        kiln.ndarray(kiln.f32, MiB)
    assert injected.value.injected is True and refused.value.injected is False
    assert pickle.loads(pickle.dumps(injected.value)).injected is True


# --- fault blocks entered and never left ---------------------------------------------------------

def test_a_fault_block_the_workload_never_leaves_is_a_kit_error_not_a_pass():
    # The review's case: fail_allocation(at=1000).__enter__() replaced the sweep's plan and was
    # popped in its place: every run "succeeded", nothing failed, and a block stayed armed.
    kiln.init(arch="cpu")
    left_open = []

    def enters_without_exit():
        block = fail_allocation(at=1000)
        block.__enter__()
        left_open.append(block)
        two_arrays()

    with pytest.raises(KitEscapeError, match="never left") as caught:
        sweep(enters_without_exit)
    assert (caught.value.call, caught.value.escape) == ("sweep", "unclosed block")
    assert kiln._kiln._innermost_fault_block() is None  # nothing stays armed
    assert_nothing_armed()
    del left_open[:]  # the abandoned block's exit, when collected, pops nothing of anyone's
    import gc
    gc.collect()
    assert sweep(two_arrays).allocations == 2


def test_a_block_left_open_inside_a_fault_block_is_named_at_its_exit():
    kiln.init(arch="cpu")
    with pytest.raises(KitEscapeError, match="never left") as caught:
        with fail_allocation(at=3):
            left = inject("nth=100")  # kept: a collected block's generator would close itself
            left.__enter__()
            two_arrays()
    assert (caught.value.call, caught.value.escape) == ("fail_allocation", "unclosed block")
    assert kiln._kiln._innermost_fault_block() is None


def test_a_stale_blocks_exit_pops_nothing_of_a_later_block():
    kiln.init(arch="cpu")
    stale = fail_allocation(at=5)
    stale.__enter__()
    assert kiln._kiln._pop_fault() == (False, 0)  # as an enclosing block's exit closes it
    with fail_allocation(at=2):
        stale.__exit__(None, None, None)  # its own block is gone: its exit pops nothing
        assert kiln._kiln._innermost_fault_block() == "fail_allocation"  # the later block is kept
        with pytest.raises(kiln.DeviceOutOfMemoryError):
            two_arrays()  # and still armed: its 2nd request fails


def test_a_kit_call_inside_a_fault_block_is_a_kit_error():
    kiln.init(arch="cpu")
    with pytest.raises(KitEscapeError, match="called inside a kiln.testing.inject block") as caught:
        with inject("min_bytes=1GiB"):
            sweep(two_arrays)
    assert (caught.value.call, caught.value.escape) == ("inject", "sweep")
    with pytest.raises(KitEscapeError) as caught:
        with fail_allocation(at=4):
            min_budget(budgeted_workload, init_kwargs=INIT)
    assert (caught.value.call, caught.value.escape) == ("fail_allocation", "min_budget")
    assert_nothing_armed()


def test_a_kit_call_while_another_thread_runs_one_is_a_kit_error():
    kiln.init(arch="cpu")
    inside, release = threading.Event(), threading.Event()
    seen: list[BaseException] = []

    def slow_workload():
        two_arrays()
        inside.set()
        release.wait()

    def other_thread():
        inside.wait()
        try:
            sweep(two_arrays)
        except BaseException as e:  # noqa: B902 - the test reads it
            seen.append(e)
        finally:
            release.set()

    t = threading.Thread(target=other_thread)
    t.start()  # before the sweep: not a thread its workload left running
    try:
        report = sweep(slow_workload)  # the clean run waits until the other thread was refused
    finally:
        release.set()
        t.join()
    assert report.allocations == 2 and not report.broken
    assert len(seen) == 1 and isinstance(seen[0], KitEscapeError)
    assert "while another thread runs kiln.testing.sweep" in str(seen[0])


def test_kit_errors_pickle_with_their_attributes():
    e = KitEscapeError("m", "sweep", "kiln.init")
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.call, back.escape) == ("m", "sweep", "kiln.init")
    shadow = pickle.loads(pickle.dumps(ShadowedFaultError("s", None, at=3)))
    assert (str(shadow), shadow.at, shadow.report) == ("s", 3, None)
    report = kiln.testing.SweepReport(2, ())
    assert pickle.loads(pickle.dumps(SweepError("r", report))).report == report
