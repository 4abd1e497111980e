"""Devices as objects: kiln.device, the current device, arrays that carry their device, mixed-device
errors, per-device memory, and the independence of devices (two fake CUDA / HIP devices)."""
import threading
import time

import numpy as np
import pytest

import kiln

MiB = 1 << 20


@pytest.fixture(autouse=True)
def close_mock():
    """The mock device goes back to closed: tests here configure it with small budgets. A
    collection first: arrays a raised error's traceback still holds go while the fake driver they
    came from is as they left it (the next block resets it)."""
    yield
    import gc
    gc.collect()
    kiln._kiln._close_devices("mock")


def fake_blocks():
    """(title, the fake's block) of each fake GPU driver this run has."""
    import os
    found = []
    if os.environ.get("KILN_TEST_FAKE_CUDA"):
        found.append(("cuda", lambda **kw: kiln.testing.fake_cuda(
            library=os.environ["KILN_TEST_FAKE_CUDA"], **kw)))
    if os.environ.get("KILN_TEST_FAKE_HIP"):
        found.append(("amdgpu", lambda **kw: kiln.testing.fake_hip(
            library=os.environ["KILN_TEST_FAKE_HIP"], **kw)))
    return found


FAKES = fake_blocks()
gpu = pytest.mark.parametrize("backend,block", FAKES, ids=[name for name, _ in FAKES])


# ------------------------------------------------------------------------------------------------
# Names and identity


def test_one_device_object_per_device_and_its_names():
    cpu = kiln.device("cpu")
    assert kiln.device() is cpu and kiln.current_device() is cpu
    assert str(cpu) == "cpu" and repr(cpu) == "kiln.device('cpu')"
    assert cpu == "cpu" and kiln.device() == "cpu" and cpu != "mock" and cpu != "no such thing"
    assert cpu.type == "cpu" and cpu.index == 0
    assert kiln.device("mock") is kiln.device(kiln.device("mock"))
    assert kiln.device("cuda") is kiln.device("cuda:0")  # a name alone opens nothing
    assert kiln.device("cuda:1") == "cuda:1" and kiln.device("cuda") == "cuda:0"
    assert kiln.device("cuda:1").type == "cuda" and kiln.device("cuda:1").index == 1
    assert hash(kiln.device("cuda:1")) == hash("cuda:1")
    assert not kiln.device("amdgpu:3").is_open


def test_a_name_that_is_no_device_is_a_usage_error_and_a_non_name_a_type_error():
    with pytest.raises(kiln.InvalidUsageError, match="tpu"):
        kiln.device("tpu")
    with pytest.raises(kiln.InvalidUsageError):
        kiln.device("cuda:x")
    with pytest.raises(kiln.InvalidTypeError):
        kiln.device(3)
    with pytest.raises(kiln.InvalidTypeError):
        kiln.ndarray(kiln.f32, (2,), device=1.5)


def test_with_block_makes_a_device_current_per_thread_and_nests():
    mock = kiln.device("mock")
    seen = []
    with mock:
        assert kiln.current_device() is mock
        a = kiln.zeros((3,))
        thread = threading.Thread(target=lambda: seen.append(kiln.current_device()))
        thread.start()
        thread.join()
        with kiln.device("cpu"):
            assert kiln.current_device() == "cpu"
            assert kiln.empty((2,)).device == "cpu"
        assert kiln.current_device() is mock
    assert kiln.current_device() == "cpu"
    assert a.device is mock and str(a.device) == "mock"
    assert seen == ["cpu"]  # another thread's current device is its own


def test_exit_of_a_device_that_is_not_the_innermost_is_a_usage_error():
    with kiln.device("mock"):
        with pytest.raises(kiln.InvalidUsageError, match="innermost"):
            kiln.device("cpu").__exit__(None, None, None)
        assert kiln.current_device() == "mock"


def test_asyncio_tasks_each_have_their_own_current_device():
    import asyncio

    async def on(name, ready, other_ready):
        with kiln.device(name):
            ready.set()
            await other_ready.wait()  # both blocks are open now, interleaved on one thread
            return str(kiln.current_device()), str(kiln.empty((1,)).device)

    async def main():
        a, b = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(on("mock", a, b), on("cpu", b, a))

    assert asyncio.run(main()) == [("mock", "mock"), ("cpu", "cpu")]


# ------------------------------------------------------------------------------------------------
# Arrays carry their device; operations run there; mixing is refused


def test_every_maker_takes_device_and_operations_follow_their_arrays():
    mock = kiln.device("mock")
    x = kiln.from_numpy(np.arange(4, dtype=np.float32), device=mock)
    y = kiln.ndarray(kiln.f32, (4,), device="mock")
    z = kiln.zeros((4,), device=mock)
    assert {str(a.device) for a in (x, y, z)} == {"mock"}
    kiln.fill(y, 1)               # current device is cpu: the op runs on the arrays' device
    kiln.axpy(2.0, x, y)
    assert y.to_numpy().tolist() == [1, 3, 5, 7]
    assert kiln.reduce_sum(y) == 16
    assert kiln.matmul(kiln.zeros((2, 2), device=mock), kiln.zeros((2, 2), device=mock)).device is mock
    k = kiln.ElementwiseKernel("T x", "T y", "y = x * 2", "double_it")
    assert k(x).device is mock and k(x).to_numpy().tolist() == [0, 2, 4, 6]
    r = kiln.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "total")
    assert float(r(x).to_numpy()) == 6.0 and r(x).device is mock
    assert __import__("copy").copy(x).device is mock


def test_mixed_device_calls_are_refused_jax_grade_for_every_op():
    mock = kiln.device("mock")
    a_cpu, a_mock = kiln.zeros((4,)), kiln.zeros((4,), device=mock)
    m_cpu, m_mock = kiln.zeros((2, 2)), kiln.zeros((2, 2), device=mock)
    k = kiln.ElementwiseKernel("T x, T w", "T y", "y = x + w", "add_them")
    raw = kiln.Kernel("""
declare i64 @kiln_index(ptr)
define void @pair(ptr %ctx, ptr %x, ptr %y) {
  ret void
}
""", "pair", "in float32 x, out float32 y")
    calls = [
        ("copy", lambda: kiln.copy(a_cpu, a_mock), ["dst f32[4] on cpu", "src f32[4] on mock"]),
        ("axpy", lambda: kiln.axpy(1.0, a_cpu, a_mock), ["x f32[4] on cpu", "y f32[4] on mock"]),
        ("matmul", lambda: kiln.matmul(m_cpu, m_mock), ["a f32[2, 2] on cpu", "b f32[2, 2] on mock"]),
        ("matmul", lambda: kiln.matmul(m_cpu, m_cpu, out=m_mock), ["out f32[2, 2] on mock"]),
        ("add_them", lambda: k(a_cpu, a_mock), ["x f32[4] on cpu", "w f32[4] on mock"]),
        ("add_them", lambda: k(a_cpu, a_cpu, a_mock), ["y f32[4] on mock"]),
        ("pair", lambda: raw(a_mock, a_cpu), ["x f32[4] on mock", "y f32[4] on cpu"]),
    ]
    before = (kiln.device("cpu").memory_stats()["allocations"], mock.memory_stats()["allocations"])
    for op, call, names in calls:
        with pytest.raises(kiln.InvalidUsageError) as info:
            call()
        text = str(info.value)
        assert op in text and "different devices" in text, text
        for name in names:
            assert name in text, (name, text)
        assert not isinstance(info.value, MemoryError)
    assert (kiln.device("cpu").memory_stats()["allocations"],
            mock.memory_stats()["allocations"]) == before


def test_to_copies_to_another_device_and_a_refusal_there_leaves_the_source_untouched():
    mock = kiln.device("mock", mock_capacity_bytes=512 * MiB, budget_bytes=24 * MiB)
    src = kiln.from_numpy(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert src.to("cpu") is src and src.to(kiln.device()) is src  # torch's Tensor.to
    moved = src.to(mock)
    assert moved.device is mock and moved.to_numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert mock.memory_stats()["current_bytes"]["ndarray"] >= moved.nbytes
    big = kiln.zeros((4 * MiB,), kiln.i64)  # 32 MiB: over mock's budget
    with pytest.raises(kiln.BudgetExceededError) as info:
        big.to(mock)
    assert info.value.device == "mock"
    assert not big.is_freed and kiln.reduce_sum(big) == 0
    with pytest.raises(kiln.InvalidUsageError):
        big.to("tpu")


# ------------------------------------------------------------------------------------------------
# Per-device memory


def test_memory_functions_of_a_device_and_of_the_current_one():
    mock = kiln.device("mock", mock_capacity_bytes=256 * MiB)
    a = kiln.ndarray(kiln.f64, (1000,), device=mock)
    assert mock.memory_stats()["device"] == "mock"
    assert mock.memory_stats()["current_bytes"]["ndarray"] >= 8000
    assert kiln.memory_stats()["device"] == "cpu"
    with mock:
        assert kiln.memory_stats()["device"] == "mock"
        assert kiln.mem_get_info() == mock.mem_get_info()
    free, total = mock.mem_get_info()
    assert total == 256 * MiB and 0 < free < total
    assert "mock" in mock.memory_summary()
    a.free()
    assert mock.empty_cache() > 0
    cpu_free, cpu_total = kiln.mem_get_info()
    assert 0 < cpu_free <= cpu_total


def test_track_reports_entry_exit_and_the_peak_inside_nested_blocks():
    mock = kiln.device("mock", mock_capacity_bytes=256 * MiB, caching=False)
    keep = kiln.ndarray(kiln.i64, (1 << 10,), device=mock)  # 8 KiB before the blocks
    with mock.track() as outer:
        big = kiln.ndarray(kiln.i64, (1 << 17,), device=mock)  # 1 MiB
        big.free()
        with mock.track() as inner:
            small = kiln.ndarray(kiln.i64, (1 << 14,), device=mock)  # 128 KiB
        with pytest.raises(kiln.InvalidUsageError):
            outer.peak_bytes
    start = outer.start_bytes["ndarray"]
    assert start >= 8 * 1024
    assert outer.peak_bytes["ndarray"] >= start + MiB  # the inner block's reset did not lose it
    assert inner.peak_bytes["ndarray"] < start + MiB  # its own peak only
    assert inner.peak_bytes["ndarray"] >= inner.start_bytes["ndarray"] + 128 * 1024
    assert outer.end_bytes["ndarray"] == inner.end_bytes["ndarray"] >= start + 128 * 1024
    assert outer.peak_total_bytes >= start + MiB
    small.free()
    keep.free()


# ------------------------------------------------------------------------------------------------
# Independence of devices


def test_a_fault_armed_on_one_device_fails_nothing_on_another():
    mock = kiln.device("mock")
    with mock, kiln.testing.fail_allocation(at=1):
        on_cpu = kiln.ndarray(kiln.f32, (8,), device="cpu")  # cpu's plan is not armed
        with pytest.raises(kiln.DeviceOutOfMemoryError) as info:
            kiln.ndarray(kiln.f32, (8,))
        assert info.value.device == "mock"
    assert not on_cpu.is_freed


WAIT_IR = """
declare i64 @kiln_index(ptr)
define void @wait_go(ptr %ctx, ptr %flags) {
entry:
  %i = call i64 @kiln_index(ptr %ctx)
  %first = icmp eq i64 %i, 0
  br i1 %first, label %start, label %done
start:
  store volatile i64 1, ptr %flags
  %go = getelementptr i64, ptr %flags, i64 1
  br label %loop
loop:
  %n = phi i64 [ 0, %start ], [ %n1, %loop ]
  %v = load volatile i64, ptr %go
  %n1 = add i64 %n, 1
  %set = icmp ne i64 %v, 0
  %limit = icmp uge i64 %n1, 3000000000
  %stop = or i1 %set, %limit
  br i1 %stop, label %seen, label %loop
seen:
  %out = getelementptr i64, ptr %flags, i64 2
  store volatile i64 %v, ptr %out
  br label %done
done:
  ret void
}
"""

GO_IR = """
declare i64 @kiln_index(ptr)
define void @set_go(ptr %ctx, ptr %flags) {
  %i = call i64 @kiln_index(ptr %ctx)
  %first = icmp eq i64 %i, 0
  br i1 %first, label %set, label %done
set:
  %go = getelementptr i64, ptr %flags, i64 1
  store volatile i64 1, ptr %go
  br label %done
done:
  ret void
}
"""


def test_launches_on_two_devices_run_at_once_from_two_threads():
    """A kernel on cpu spins until a kernel on mock sets its flag: with one launch lock for the
    process the second launch could only start once the first gave up (flags[2] stays 0)."""
    flags = np.zeros(3, dtype=np.int64)  # started, go, what the waiting kernel saw
    wait = kiln.Kernel(WAIT_IR, "wait_go", "inout int64 flags")
    on_cpu = kiln.from_dlpack(flags)
    with kiln.device("mock"):
        go = kiln.Kernel(GO_IR, "set_go", "inout int64 flags")
        on_mock = kiln.from_dlpack(flags)
    waiter = threading.Thread(target=lambda: wait(on_cpu))
    waiter.start()
    deadline = time.monotonic() + 60
    while flags[0] == 0 and time.monotonic() < deadline:  # the waiting kernel is running
        time.sleep(0.001)
    assert flags[0] == 1
    go(on_mock)
    waiter.join()
    assert flags[2] == 1
    on_cpu.free()
    on_mock.free()


@gpu
def test_two_gpus_hold_arrays_and_budgets_of_their_own(backend, block):
    with block(devices=2, capacity_bytes=512 * MiB) as fake:
        d0 = kiln.device(f"{backend}:0", budget_bytes=100 * MiB)
        d1 = kiln.device(f"{backend}:1", budget_bytes=60 * MiB)
        a0 = kiln.from_numpy(np.arange(4, dtype=np.float32), device=d0)
        a1 = kiln.from_numpy(np.arange(4, dtype=np.float32) * 10, device=d1)
        kiln.axpy(1.0, a0, a0)
        kiln.axpy(1.0, a1, a1)
        assert a0.to_numpy().tolist() == [0, 2, 4, 6] and a1.to_numpy().tolist() == [0, 20, 40, 60]
        assert fake.held_bytes(0) > 0 and fake.held_bytes(1) > 0
        with pytest.raises(kiln.BudgetExceededError) as info:
            kiln.ndarray(kiln.f32, (16 * MiB,), device=d1)  # 64 MiB: over cuda:1's 60
        assert info.value.device == str(d1) and info.value.limit_bytes == 60 * MiB
        # The advice names the configure of the device that refused, not kiln.init's (the current
        # device's).
        assert f'kiln.device("{d1}").configure(budget_bytes=...)' in info.value.advice
        assert "kiln.init" not in info.value.advice
        held = kiln.ndarray(kiln.f32, (16 * MiB,), device=d0)  # fits cuda:0's 100
        assert held.device is d0
        with pytest.raises(kiln.InvalidUsageError, match="different devices"):
            kiln.copy(a0, a1)
        with d1, kiln.testing.fail_allocation(at=1):  # cuda:1's plan only
            kiln.zeros((4,), device=d0).free()
            with pytest.raises(kiln.DeviceOutOfMemoryError) as info:
                kiln.zeros((4,))
            assert info.value.device == str(d1)
        assert a0.to(d1).to_numpy().tolist() == [0, 2, 4, 6]
    assert not d0.is_open and not d1.is_open  # the block closed both


@gpu
def test_a_lost_gpu_leaves_the_other_working(backend, block):
    illegal = 700  # CUDA_ERROR_ILLEGAL_ADDRESS, hipErrorIllegalAddress: sticky
    launch = "cuLaunchKernel" if backend == "cuda" else "hipModuleLaunchKernel"
    with block(devices=2) as fake:
        d0, d1 = kiln.device(f"{backend}:0"), kiln.device(f"{backend}:1")
        a0 = kiln.zeros((8,), device=d0)
        a1 = kiln.zeros((8,), device=d1)
        fake.inject_fault(launch, 1, illegal)
        with pytest.raises(kiln.DeviceLostError) as info:
            kiln.fill(a1, 1)
        assert info.value.device == str(d1)
        kiln.fill(a0, 3)
        assert a0.to_numpy().tolist() == [3] * 8
        assert kiln.reduce_sum(kiln.from_numpy(np.ones(5, np.float32), device=d0)) == 5
        with pytest.raises(kiln.DeviceLostError):
            kiln.fill(a1, 1)


@gpu
def test_no_context_on_a_device_nobody_named(backend, block):
    with block(devices=2) as fake:
        d1 = kiln.device(f"{backend}:1")
        kiln.zeros((4,), device=d1)
        assert fake.contexts(1) >= 1
        assert fake.contexts(0) == 0


# ------------------------------------------------------------------------------------------------
# What a hostile pass found (each once a crash, a race or a lie)


def test_devices_come_from_kiln_device_only():
    with pytest.raises(TypeError):  # pybind11's own refusal, no instance
        kiln.Device.__new__(kiln.Device)
    with pytest.raises(TypeError):
        type("Sub", (kiln.Device,), {})
    with pytest.raises(kiln.InvalidTypeError):
        kiln.Device("cpu")


def test_a_context_variable_set_by_hand_is_a_usage_error_not_a_crash():
    import contextvars
    with kiln.device("mock"):
        var = next(v for v in contextvars.copy_context() if v.name == "kiln.current_device")

    def poke():
        var.set((5, None, None))
        with pytest.raises(kiln.InvalidUsageError, match="kiln did not put there"):
            kiln.current_device()
        var.set("junk")
        with pytest.raises(kiln.InvalidUsageError):
            kiln.zeros((2,))
    contextvars.copy_context().run(poke)  # the change stays in that copy
    assert kiln.current_device() == "cpu"


def test_equality_with_a_str_is_with_its_name_and_hashes_agree():
    cuda0 = kiln.device("cuda")
    assert cuda0 == "cuda:0" and cuda0 != "cuda" and hash(cuda0) == hash("cuda:0")
    assert {"cuda:0": 1}.get(cuda0) == 1
    assert kiln.device("cpu") != "\ud800" and kiln.device("cpu") != "cpu:0"


def test_threads_opening_one_device_at_once_open_it_once_and_keep_configure(monkeypatch):
    """Thread A opens mock and, holding the device's open lock, waits (inside the kernel-cache
    clearing every open runs) until B has called in to open it too; B must then find it open."""
    kiln._kiln._close_devices("mock")
    a_inside, b_calling, made, errors = threading.Event(), threading.Event(), {}, []
    clear = kiln._kernels._clear_cache

    def clear_slowly():
        clear()
        if threading.current_thread().name == "A":
            a_inside.set()
            b_calling.wait(10)
            time.sleep(0.05)  # B goes on into its open and waits for A's lock

    def use(name):
        try:
            if name == "B":
                a_inside.wait(10)
                b_calling.set()
            made[name] = kiln.zeros((4,), device="mock")
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    monkeypatch.setattr(kiln._kernels, "_clear_cache", clear_slowly)
    threads = [threading.Thread(target=use, args=(n,), name=n) for n in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.undo()
    assert errors == [] and a_inside.is_set() and len(made) == 2
    for a in made.values():
        kiln.fill(a, 1.0)  # neither array belongs to a replaced executor
    mock = kiln.device("mock")
    kiln._kiln._close_devices("mock")
    opener = threading.Thread(target=lambda: kiln.zeros((4,), device=mock))
    opener.start()
    mock.configure(budget_bytes=64 * MiB)  # after or instead of the thread's open: never undone
    opener.join()
    assert mock.memory_stats()["limit_bytes"] == 64 * MiB


def test_an_array_of_a_closed_device_is_refused_without_reopening_it():
    kiln.init("mock")
    a = kiln.zeros((4,))
    kiln.init("cpu", num_threads=2)  # closes mock, the device current before
    mock = kiln.device("mock")
    assert not mock.is_open
    k = kiln.ElementwiseKernel("T x", "T y", "y = x", "same")
    for call in (lambda: kiln.fill(a, 1), lambda: a.to_numpy(), lambda: a.to("cpu"),
                 lambda: a.to(mock), lambda: __import__("copy").copy(a), lambda: k(a),
                 lambda: kiln.reduce_sum(a)):
        with pytest.raises(kiln.InvalidUsageError, match="belongs to another executor"):
            call()
        assert not mock.is_open
    a.free()


def test_user_kernels_refuse_freed_and_stale_inputs_before_allocating_outputs():
    mock = kiln.device("mock", budget_bytes=40 * MiB, mock_capacity_bytes=512 * MiB)
    b = kiln.ndarray(kiln.f32, (2, 2 << 20), device=mock)  # 16 MiB
    b.free()
    hog = kiln.ndarray(kiln.f32, (3 << 20,), device=mock)  # 12 MiB: a 16 MiB output would not fit
    add = kiln.ElementwiseKernel("T x, T y", "T z", "z = x + y", "add")
    total = kiln.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "rsum")
    before = mock.memory_stats()["allocations"]
    for call in (lambda: add(b, 1.0), lambda: total(b, axis=0)):
        with pytest.raises(kiln.InvalidUsageError, match="freed"):
            call()
    old = kiln.ndarray(kiln.f32, (4,), device=mock)
    mock.configure(budget_bytes=40 * MiB, mock_capacity_bytes=512 * MiB)
    with pytest.raises(kiln.InvalidUsageError, match="belongs to another executor"):
        add(old, 1.0)
    assert mock.memory_stats()["allocations"] == 0 or mock.memory_stats()["allocations"] <= before
    hog.free()


def test_a_fault_block_left_outside_its_with_block_is_no_escape():
    mock = kiln.device("mock")
    mock.__enter__()
    block = kiln.testing.fail_allocation(at=2)
    block.__enter__()
    mock.__exit__(None, None, None)
    block.__exit__(None, None, None)  # no KitEscapeError: nothing replaced mock's executor
    kiln.zeros((4,), device=mock)


def test_a_track_block_is_entered_once_and_reopens_nothing():
    mock = kiln.device("mock")
    block = mock.track()
    with block:
        pass
    with pytest.raises(kiln.InvalidUsageError, match="entered already"):
        with block:
            pass
    kiln.init("mock")
    with kiln.device("mock").track() as report:
        kiln.init("cpu", num_threads=2)  # closes mock inside the block
    assert not kiln.device("mock").is_open and report.end_bytes == {}


def test_a_device_copies_as_itself_and_pickles_by_name():
    import copy
    import pickle
    cuda1 = kiln.device("cuda:1")
    assert copy.copy(cuda1) is cuda1 and copy.deepcopy(cuda1) is cuda1
    assert pickle.loads(pickle.dumps(cuda1)) is cuda1 and not cuda1.is_open
    assert pickle.loads(pickle.dumps(kiln.device("mock"))) is kiln.device("mock")


def test_configure_names_itself_and_host_devices_have_one_ordinal():
    with pytest.raises(kiln.InvalidTypeError, match="configure: caching must be True or False"):
        kiln.device("mock").configure(caching="yes")
    with pytest.raises(kiln.InvalidUsageError, match="configure"):
        kiln.device("mock").configure(budget_bytes=-1)
    for name in ("cpu:1", "mock:3"):
        with pytest.raises(kiln.InvalidUsageError, match="has one device"):
            kiln.device(name)


@gpu
def test_a_driver_that_refuses_the_memory_query_is_a_named_error(backend, block):
    query = "cuMemGetInfo_v2" if backend == "cuda" else "hipMemGetInfo"
    with block(devices=2) as fake:
        d1 = kiln.device(f"{backend}:1")
        kiln.zeros((4,), device=d1)
        fake.inject_fault(query, 1, 999)
        with pytest.raises(kiln.Error) as info:
            d1.mem_get_info()
        assert not isinstance(info.value, MemoryError) and info.value.device == str(d1)
        free, total = d1.mem_get_info()  # the next query works
        assert 0 < free <= total


def test_a_configure_that_fails_keeps_the_old_executor_and_its_arrays():
    mock = kiln.device("mock", mock_capacity_bytes=256 * MiB)
    a = kiln.zeros((4,), device=mock)
    with pytest.raises(kiln.BudgetExceededError):
        mock.configure(budget_bytes=1 * MiB)  # below the 16 MiB device heap
    kiln.fill(a, 2.0)
    assert a.to_numpy().tolist() == [2, 2, 2, 2] and mock.is_open
