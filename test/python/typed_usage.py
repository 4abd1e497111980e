"""Typed use of kiln's documented Python API, for the type checker and at run time.

ctest's python_mypy runs `mypy --strict` over this file (with the stubs and examples/*.py):
every assert_type below states the type the stubs promise, and the error handlers read the
documented attributes (e.requested_bytes, e.limit_bytes, ...) as a user would.
test_stubs.py runs it too, so the types it states are also the ones the calls return:

    PYTHONPATH=build/python /usr/bin/python3 test/python/typed_usage.py
"""
import copy
import pickle
from typing import Any, assert_type

import numpy as np
import numpy.typing as npt

import kiln

MiB = 1 << 20


def arrays_and_ops() -> None:
    """Arrays, their attributes, every op, copies and pickling."""
    kiln.init("cpu", budget_bytes=64 * MiB, num_threads=2)
    assert_type(kiln.device(), kiln.Device)
    assert kiln.device() == "cpu" and str(kiln.current_device()) == "cpu"
    mock = kiln.device("mock")
    with mock:
        m = kiln.zeros((2,), device=mock)
        with mock.track() as report:
            kiln.ndarray(kiln.f32, (4,), device="mock").free()
    assert_type(m.device, kiln.Device)
    assert_type(m.to("cpu"), kiln.ndarray)
    assert_type(mock.mem_get_info(), tuple[int, int])
    assert report.peak_bytes["ndarray"] >= 16
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = kiln.from_numpy(host)
    assert_type(a, kiln.ndarray)
    assert_type(a.shape, tuple[int, ...])
    assert_type(a.dtype, kiln.dtype)
    assert (a.shape, a.dtype, a.nbytes, a.size, a.ndim, str(a.device)) == ((2, 3), kiln.f32, 24, 6, 2, "cpu")
    assert not a.is_freed and len(a) == 2

    b = kiln.ndarray(kiln.f32, (2, 3))
    kiln.fill(b, 1.0)
    kiln.axpy(2.0, a, b)                  # b = 2*a + b
    kiln.axpy(np.float32(1), host, b)     # x from host memory, staged
    total = kiln.reduce_sum(b)
    assert_type(total, float | int)
    assert total == float((3 * host + 1).sum())

    w = kiln.ndarray("f32", [3, 4])
    kiln.fill(w, 1)
    c = kiln.matmul(a, w)
    assert_type(kiln.matmul(a, w, out=c), kiln.ndarray)
    assert c.shape == (2, 4)
    positive = kiln.compact_positive(a)
    assert positive.shape == (5,)

    out: npt.NDArray[Any] = a.to_numpy()
    assert np.array_equal(out, host) and np.array_equal(np.asarray(a), host)  # zero-copy on cpu
    for twin in (copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert np.array_equal(twin.to_numpy(), host)
    kiln.copy(b, a)

    counts = kiln.ndarray(kiln.i64, 3)
    kiln.fill(counts, 7)
    assert kiln.reduce_sum(counts) == 21
    assert kiln.dtype("f64") == kiln.f64 and kiln.dtype(2) == kiln.i32
    assert kiln.f64.itemsize == 8 and kiln.f32.numpy == np.dtype(np.float32) and str(kiln.i64) == "i64"
    a.free()
    assert a.is_freed


def budget_refusal() -> None:
    """A BudgetExceededError and its documented attributes, with their types."""
    kiln.init("cpu", budget_bytes=64 * MiB, num_threads=2)
    try:
        kiln.ndarray(kiln.f32, (1 << 40,))
    except kiln.BudgetExceededError as e:
        requested: int = e.requested_bytes
        limit: int | None = e.limit_bytes
        in_use: dict[str, int] | None = e.in_use_bytes
        check: str = e.budget_check
        advice: str = e.advice
        assert requested == 4 << 40 and limit == 64 * MiB and check == "limit"
        assert in_use is not None and in_use["runtime_heap"] > 0
        assert "kiln.device(\"cpu\").configure(budget_bytes=...)" in advice
        assert_type(e.free_bytes, int | None)
        assert_type(e.context, tuple[str, ...])
        assert isinstance(e, MemoryError) and e.oom_source == "budget" and e.site != ""
    else:
        raise AssertionError("a 4 TiB array fit a 64 MiB budget")


def oom_observer() -> None:
    """An OOM observer sees the exception before it is raised."""
    kiln.init("cpu", budget_bytes=64 * MiB, num_threads=2)
    seen: list[kiln.OutOfMemoryError] = []

    def on_oom(error: kiln.OutOfMemoryError) -> None:
        seen.append(error)

    observer_id = kiln.add_oom_observer(on_oom)
    try:
        kiln.ndarray(kiln.f64, (1 << 30,))
    except kiln.OutOfMemoryError as e:
        assert seen and seen[0].requested_bytes == e.requested_bytes == 8 << 30
    assert kiln.remove_oom_observer(observer_id) and not kiln.remove_oom_observer(observer_id)


def usage_errors_and_faults() -> None:
    """InvalidUsageError / InvalidTypeError, injected faults and synthetic errors."""
    kiln.init("cpu", num_threads=2)
    x = kiln.ndarray(kiln.f32, 4)
    y = kiln.ndarray(kiln.f32, 5)
    try:
        kiln.copy(x, y)
    except kiln.InvalidUsageError as e:
        detail: str = e.detail
        assert isinstance(e, ValueError) and detail != "" and e.result == "invalid_usage"
    try:
        kiln.fill(x, "one")  # type: ignore[arg-type]  # the mistake this handler is for
    except kiln.InvalidTypeError as e:
        assert isinstance(e, TypeError)
    with kiln.testing.fail_allocation(at=1):
        try:
            kiln.ndarray(kiln.i32, 8)
        except kiln.DeviceOutOfMemoryError as e:
            status: str = e.driver_status
            assert status == "injected fault (FaultPlan)"
        assert_type(kiln.testing.allocation_count(), int)
    lost = kiln.testing.make_error("device_lost", device="cuda:0")
    assert isinstance(lost, kiln.DeviceLostError) and lost.device == "cuda:0"


def memory_figures() -> None:
    """memory_stats() as a typed dict, the summary and the cache."""
    kiln.init("cpu", num_threads=2)
    a = kiln.ndarray(kiln.f64, (128, 128))
    stats = kiln.memory_stats()
    assert_type(stats["allocated_bytes"], int)
    assert_type(stats["current_bytes"], dict[str, int])
    assert stats["current_bytes"]["ndarray"] >= a.nbytes and stats["device"] == "cpu"
    del a
    assert kiln.empty_cache() >= 128 * 128 * 8
    kiln.reset_peak_memory_stats()
    assert kiln.memory_summary().startswith("kiln memory summary: cpu")
    assert_type(kiln.__version__, str)


def dlpack_interop() -> None:
    """DLPack both ways with numpy, zero-copy, and the DLPack device."""
    kiln.init("cpu", num_threads=2)
    host = np.arange(4, dtype=np.float64)
    k = kiln.from_dlpack(host)             # numpy -> kiln: same memory
    assert_type(k, kiln.ndarray)
    kiln.fill(k, 2.0)
    assert (host == 2.0).all()
    view = np.from_dlpack(k)               # kiln -> numpy: same memory (read-only in numpy 1.24)
    assert view.shape == (4,)
    assert_type(k.__dlpack_device__(), tuple[int, int])
    del view
    k.free()


def fake_gpu_driver() -> None:
    """kiln.testing.fake_cuda: the cuda backend on kiln's fake driver, where it is built."""
    try:
        with kiln.testing.fake_cuda(capacity_bytes=256 << 20) as fake:
            assert_type(fake, kiln.testing.FakeDriver)
            kiln.init("cuda", budget_bytes=1 << 30, live_check=False)
            try:
                kiln.ndarray(kiln.f32, (300 << 20) // 4)
            except kiln.DeviceOutOfMemoryError as e:
                assert e.total_bytes == 256 << 20
            assert_type(fake.oom_count(), int)
    except kiln.NotSupportedError as e:  # no fake driver beside this kiln
        assert "KILN_FAKE_CUDA_LIBRARY" in str(e)


def main() -> None:
    arrays_and_ops()
    dlpack_interop()
    budget_refusal()
    oom_observer()
    usage_errors_and_faults()
    memory_figures()
    fake_gpu_driver()
    print("typed usage OK")


if __name__ == "__main__":
    main()
