"""The AMDGPU backend from Python: against the fake HIP runtime (test/fake_hip) a workload runs and
a hipErrorOutOfMemory sweep ends in kiln.DeviceOutOfMemoryError (a MemoryError); without a HIP
runtime, and on this machine's real one (Debian's libamdhip64, no GPU), kiln.init(arch="amdgpu")
raises kiln.NotSupportedError carrying the runtime's own answer."""
import ctypes
import ctypes.util
import os

import numpy as np
import pytest

import kiln

FAKE = os.environ.get("KILN_TEST_FAKE_HIP")
needs_fake = pytest.mark.skipif(not FAKE, reason="KILN_TEST_FAKE_HIP (the fake runtime's path) not set")
HIP_ERROR_OUT_OF_MEMORY = 2


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("KILN_HIP_RUNTIME", FAKE)
    lib = ctypes.CDLL(FAKE)  # the same handle kiln's loader opens: one fake state
    lib.kiln_fake_hip_inject_fault.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_int]
    lib.kiln_fake_hip_call_count.argtypes = [ctypes.c_char_p]
    lib.kiln_fake_hip_call_count.restype = ctypes.c_ulonglong
    lib.kiln_fake_hip_held_bytes.restype = ctypes.c_size_t
    lib.kiln_fake_hip_reset()
    yield lib
    kiln.init(arch="cpu", num_threads=2)
    lib.kiln_fake_hip_reset()


def workload():
    x = kiln.from_numpy(np.arange(1, 1001, dtype=np.float32))
    y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    kiln.axpy(2.0, x, y)
    return kiln.reduce_sum(y)


@needs_fake
def test_ops_run_on_amdgpu_against_the_fake(fake):
    kiln.init(arch="amdgpu", device_heap_bytes=1 << 20)
    assert kiln.device() == "amdgpu:0"
    assert workload() == pytest.approx(2 * 500500 + 1000)
    assert fake.kiln_fake_hip_call_count(b"hipModuleLaunchKernel") >= 2


@needs_fake
def test_runtime_oom_at_every_hipMalloc_is_a_DeviceOutOfMemoryError(fake):
    kiln.init(arch="amdgpu", device_heap_bytes=1 << 20, caching=False)
    base = fake.kiln_fake_hip_call_count(b"hipMalloc")
    workload()
    calls = fake.kiln_fake_hip_call_count(b"hipMalloc") - base
    assert calls >= 4
    for k in range(1, calls + 1):
        kiln.init(arch="amdgpu", device_heap_bytes=1 << 20, caching=False)
        baseline = kiln.memory_stats()["allocated_bytes"]
        assert fake.kiln_fake_hip_inject_fault(b"hipMalloc", k, HIP_ERROR_OUT_OF_MEMORY) == 0
        with pytest.raises(MemoryError) as info:
            workload()
        err = info.value
        del info
        err.__traceback__ = None  # the frames hold the arrays the workload had made
        assert type(err) is kiln.DeviceOutOfMemoryError
        assert err.driver_status == "hipErrorOutOfMemory"
        assert err.device == "amdgpu:0"
        assert kiln.memory_stats()["allocated_bytes"] == baseline
        assert workload() == pytest.approx(2 * 500500 + 1000)  # the next identical call works


def test_no_runtime_is_NotSupportedError_naming_the_library(monkeypatch):
    monkeypatch.setenv("KILN_HIP_RUNTIME", "/nonexistent/libamdhip64.so")
    with pytest.raises(kiln.NotSupportedError) as info:
        kiln.init(arch="amdgpu")
    assert isinstance(info.value, NotImplementedError)
    assert "/nonexistent/libamdhip64.so" in str(info.value)


@pytest.mark.skipif(ctypes.util.find_library("amdhip64") is None,
                    reason="no HIP runtime installed (scripts/install-deps.sh installs Debian's)")
def test_real_runtime_without_a_gpu_is_NotSupportedError_with_its_answer(monkeypatch):
    monkeypatch.delenv("KILN_HIP_RUNTIME", raising=False)
    try:
        kiln.init(arch="amdgpu")
    except kiln.NotSupportedError as e:
        assert e.driver_status.startswith("hipError")  # e.g. hipErrorNoDevice
        assert e.driver_status in str(e)
        assert "libamdhip64" in str(e)
    else:
        pytest.skip("this machine has an AMD GPU")


@needs_fake
def test_init_recovers_after_a_lost_device_once_its_arrays_are_gone(fake):
    kiln.init(arch="amdgpu", device_heap_bytes=1 << 20)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    assert fake.kiln_fake_hip_inject_fault(b"hipModuleLaunchKernel", 1, 700) == 0  # illegal address
    with pytest.raises(kiln.DeviceLostError):
        kiln.axpy(1.0, x, y)
    del x
    with pytest.raises(kiln.DeviceLostError) as info:  # y holds the device: no reset yet
        kiln.init(arch="amdgpu", device_heap_bytes=1 << 20)
    assert "still hold its driver context" in str(info.value)
    del info
    del y  # the last user: the device is reset (hipDeviceReset)
    assert fake.kiln_fake_hip_call_count(b"hipDeviceReset") == 1
    kiln.init(arch="amdgpu", device_heap_bytes=1 << 20)
    assert workload() == pytest.approx(2 * 500500 + 1000)


@needs_fake
@pytest.mark.parametrize("entry", [b"hipModuleLaunchKernel", b"hipMemcpyHtoD", b"hipMemGetInfo"])
def test_a_value_the_runtime_refuses_is_a_RuntimeFaultError_not_a_usage_error(fake, entry):
    """hipErrorInvalidValue from the runtime is a fault of kiln or HIP (kiln checked every
    value first): RuntimeFaultError, never InvalidUsageError."""
    kiln.init(arch="amdgpu", device_heap_bytes=1 << 20, caching=False)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    assert fake.kiln_fake_hip_inject_fault(entry, 1, 1) == 0  # hipErrorInvalidValue
    with pytest.raises(kiln.RuntimeFaultError) as info:
        kiln.axpy(1.0, np.ones(1000, dtype=np.float32), x)
        kiln.ndarray(kiln.f32, (1 << 20,))  # hipMemGetInfo: the live check before growth
    assert not isinstance(info.value, (kiln.InvalidUsageError, MemoryError)), repr(info.value)
    assert "hipErrorInvalidValue" in str(info.value)
    assert workload() == pytest.approx(2 * 500500 + 1000)
