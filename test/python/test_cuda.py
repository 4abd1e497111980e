"""The CUDA backend from Python, against the fake driver (test/fake_cuda): a driver out-of-memory
sweep ends in kiln.DeviceOutOfMemoryError (a MemoryError); no driver and the stub driver are
kiln.NotSupportedError naming the library and the driver's answer."""
import ctypes
import os

import numpy as np
import pytest

import kiln

FAKE = os.environ.get("KILN_TEST_FAKE_CUDA")
pytestmark = pytest.mark.skipif(not FAKE, reason="KILN_TEST_FAKE_CUDA (the fake driver's path) not set")
CUDA_ERROR_OUT_OF_MEMORY = 2


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("KILN_CUDA_DRIVER", FAKE)
    lib = ctypes.CDLL(FAKE)  # the same handle kiln's loader opens: one fake state
    lib.kiln_fake_cuda_inject_fault.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_int]
    lib.kiln_fake_cuda_call_count.argtypes = [ctypes.c_char_p]
    lib.kiln_fake_cuda_call_count.restype = ctypes.c_ulonglong
    lib.kiln_fake_cuda_held_bytes.restype = ctypes.c_size_t
    lib.kiln_fake_cuda_reset()
    yield lib
    kiln.init(arch="cpu", num_threads=2)
    lib.kiln_fake_cuda_reset()


def workload():
    """A few arrays and ops; returns the result to check."""
    x = kiln.from_numpy(np.arange(1, 1001, dtype=np.float32))
    y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    kiln.axpy(2.0, x, y)
    return kiln.reduce_sum(y)


def test_ops_run_on_cuda_against_the_fake(fake):
    kiln.init(arch="cuda", device_heap_bytes=1 << 20)
    assert kiln.device() == "cuda:0"
    assert workload() == pytest.approx(2 * 500500 + 1000)


def test_driver_oom_at_every_cuMemAlloc_is_a_DeviceOutOfMemoryError(fake):
    kiln.init(arch="cuda", device_heap_bytes=1 << 20, caching=False)
    base = fake.kiln_fake_cuda_call_count(b"cuMemAlloc_v2")
    workload()
    calls = fake.kiln_fake_cuda_call_count(b"cuMemAlloc_v2") - base
    assert calls >= 4
    raised = 0
    for k in range(1, calls + 1):
        kiln.init(arch="cuda", device_heap_bytes=1 << 20, caching=False)
        baseline = kiln.memory_stats()["allocated_bytes"]
        assert fake.kiln_fake_cuda_inject_fault(b"cuMemAlloc_v2", k, CUDA_ERROR_OUT_OF_MEMORY) == 0
        with pytest.raises(MemoryError) as info:
            workload()
        raised += 1
        err = info.value
        del info
        err.__traceback__ = None  # the frames hold the arrays the workload had made
        assert type(err) is kiln.DeviceOutOfMemoryError
        assert err.driver_status == "CUDA_ERROR_OUT_OF_MEMORY"
        assert err.device == "cuda:0"
        assert err.requested_bytes > 0
        assert kiln.memory_stats()["allocated_bytes"] == baseline
        assert workload() == pytest.approx(2 * 500500 + 1000)  # the next identical call works
    assert raised == calls


def test_no_driver_is_NotSupportedError_naming_the_library(monkeypatch):
    monkeypatch.setenv("KILN_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
    with pytest.raises(kiln.NotSupportedError) as info:
        kiln.init(arch="cuda")
    assert isinstance(info.value, NotImplementedError)
    assert "/nonexistent/libcuda.so.1" in str(info.value)


def test_stub_driver_is_NotSupportedError_with_the_drivers_answer(fake):
    fake.kiln_fake_cuda_set_mode(b"stub")
    with pytest.raises(kiln.NotSupportedError) as info:
        kiln.init(arch="cuda")
    assert info.value.driver_status == "CUDA_ERROR_STUB_LIBRARY"
    assert "libkiln_fake_cuda.so" in str(info.value)


def test_init_recovers_after_a_lost_device_once_its_arrays_are_gone(fake):
    kiln.init(arch="cuda", device_heap_bytes=1 << 20)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    assert fake.kiln_fake_cuda_inject_fault(b"cuLaunchKernel", 1, 700) == 0  # illegal address
    with pytest.raises(kiln.DeviceLostError):
        kiln.axpy(1.0, x, y)
    # y still holds the lost context: the new executor is lost too, and says why.
    x.free()
    with pytest.raises(kiln.DeviceLostError) as info:
        kiln.init(arch="cuda", device_heap_bytes=1 << 20)
    assert "still hold its driver context" in str(info.value)
    del info
    y.free()  # freed (still referenced) or deleted: the context goes
    kiln.init(arch="cuda", device_heap_bytes=1 << 20)
    assert workload() == pytest.approx(2 * 500500 + 1000)
    assert x.is_freed and y.is_freed


@pytest.mark.parametrize("entry", [b"cuLaunchKernel", b"cuMemcpyHtoD_v2", b"cuMemGetInfo_v2"])
def test_a_value_the_driver_refuses_is_a_RuntimeFaultError_not_a_usage_error(fake, entry):
    """kiln checks every value before the driver sees it: CUDA_ERROR_INVALID_VALUE from the
    driver is a fault of kiln or the driver (RuntimeFaultError), never the caller's mistake."""
    kiln.init(arch="cuda", device_heap_bytes=1 << 20, caching=False)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    assert fake.kiln_fake_cuda_inject_fault(entry, 1, 1) == 0  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(kiln.RuntimeFaultError) as info:
        kiln.axpy(1.0, np.ones(1000, dtype=np.float32), x)
        kiln.ndarray(kiln.f32, (1 << 20,))  # cuMemGetInfo_v2: the live check before growth
    assert not isinstance(info.value, (kiln.InvalidUsageError, MemoryError)), repr(info.value)
    assert "CUDA_ERROR_INVALID_VALUE" in str(info.value)
    assert workload() == pytest.approx(2 * 500500 + 1000)  # not sticky: the device goes on
