"""Every GPU backend from Python, against its fake driver (test/fake_cuda, test/fake_hip): one
matrix, run once per backend registered in conftest.GPU_BACKENDS through the `backend` fixture
(skipped, saying why, where a fake is not built or does not load). A driver out-of-memory sweep ends
in kiln.DeviceOutOfMemoryError (a MemoryError); no driver and a stub driver are
kiln.NotSupportedError naming the library and the driver's answer; a lost device recovers once its
arrays are gone; a value the driver refuses is a RuntimeFaultError. Backend-specific cases (the
machine's own HIP runtime) follow the matrix."""
import ctypes.util

import numpy as np
import pytest

import kiln

MiB = 1 << 20
EXPECTED = 2 * 500500 + 1000  # what workload() returns


def workload():
    """A few arrays and ops; returns the result to check (EXPECTED)."""
    x = kiln.from_numpy(np.arange(1, 1001, dtype=np.float32))
    y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    kiln.axpy(2.0, x, y)
    return kiln.reduce_sum(y)


def test_ops_run_against_the_fake(backend):
    kiln.init(arch=backend.name, device_heap_bytes=MiB)
    assert kiln.device() == f"{backend.name}:0"
    assert workload() == pytest.approx(EXPECTED)
    assert backend.call_count("launch") >= 2


def test_gpu_shaped_kernels_one_reduce_partial_per_block_and_tiled_matmul(backend):
    """reduce_sum grid-strides over at most 4,224 blocks (GpuKernelLauncher::kMaxGridBlocks) and
    reads back one 32-byte partial per block from the executor's result buffer (16,384 slots,
    512 KiB, held for the executor's life: a launch allocates none); the sums stay
    exact (wrapping int64 for ints, f64 for floats). The tiled matmul matches numpy on shapes that
    are not multiples of its 16x16 tile."""
    kiln.init(arch=backend.name, device_heap_bytes=MiB)
    n = 4224 * 256 * 2 + 7  # two grid strides and a tail
    host = (np.arange(n) % 1000).astype(np.int32)
    x = kiln.from_numpy(host)
    held = kiln.memory_stats()["current_bytes"]["result_buffer"]
    assert 16384 * 32 <= held < 16384 * 32 * 2  # the pool may round the size up a little
    kiln.reset_peak_memory_stats()
    assert kiln.reduce_sum(x) == int(host.sum(dtype=np.int64))
    assert kiln.memory_stats()["peak_bytes"]["result_buffer"] == held
    floats = np.linspace(-1.0, 3.0, 100003).astype(np.float32)
    assert kiln.reduce_sum(kiln.from_numpy(floats)) == pytest.approx(
        float(floats.astype(np.float64).sum()), rel=1e-9)
    rng = np.random.default_rng(16)
    for m, k, cols in ((1, 1, 1), (37, 19, 45), (16, 33, 17)):
        a = rng.standard_normal((m, k))
        b = rng.standard_normal((k, cols))
        c = kiln.matmul(kiln.from_numpy(a), kiln.from_numpy(b)).to_numpy()
        np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


def test_driver_oom_at_every_allocation_is_a_DeviceOutOfMemoryError(backend):
    kiln.init(arch=backend.name, device_heap_bytes=MiB, caching=False)
    base = backend.call_count("alloc")
    workload()
    calls = backend.call_count("alloc") - base
    assert calls == 2  # x and y: axpy and reduce_sum use the executor's launch buffers
    raised = 0
    for k in range(1, calls + 1):
        kiln.init(arch=backend.name, device_heap_bytes=MiB, caching=False)
        baseline = kiln.memory_stats()["allocated_bytes"]
        assert backend.inject_fault("alloc", k, "out_of_memory") == 0
        with pytest.raises(MemoryError) as info:
            workload()
        raised += 1
        err = info.value
        del info
        err.__traceback__ = None  # the frames hold the arrays the workload had made
        assert type(err) is kiln.DeviceOutOfMemoryError
        assert err.driver_status == backend.status_name("out_of_memory")
        assert err.device == f"{backend.name}:0"
        assert err.requested_bytes > 0
        assert kiln.memory_stats()["allocated_bytes"] == baseline
        assert workload() == pytest.approx(EXPECTED)  # the next identical call works
    assert raised == calls


def test_no_driver_is_NotSupportedError_naming_the_library(backend, monkeypatch):
    missing = f"/nonexistent/lib{backend.name}-missing.so.1"
    monkeypatch.setenv(backend.driver_env, missing)
    with pytest.raises(kiln.NotSupportedError) as info:
        kiln.init(arch=backend.name)
    assert isinstance(info.value, NotImplementedError)
    assert missing in str(info.value)


def test_stub_driver_is_NotSupportedError_with_the_drivers_answer(backend):
    backend.set_mode("stub")
    with pytest.raises(kiln.NotSupportedError) as info:
        kiln.init(arch=backend.name)
    assert info.value.driver_status == backend.status_name("stub")
    assert backend.path.rsplit("/", 1)[-1] in str(info.value)


def lose_the_device_holding_two_arrays(backend):
    """Inits `backend`, makes two arrays and loses the device at a launch; returns the arrays."""
    kiln.init(arch=backend.name, device_heap_bytes=MiB)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    assert backend.inject_fault("launch", 1, "illegal_address") == 0
    with pytest.raises(kiln.DeviceLostError):
        kiln.axpy(1.0, x, y)
    return x, y


def test_init_recovers_after_a_lost_device_once_its_arrays_are_freed(backend):
    x, y = lose_the_device_holding_two_arrays(backend)
    # y still holds the lost context: the new executor is lost too, and says why.
    x.free()
    with pytest.raises(kiln.DeviceLostError) as info:
        kiln.init(arch=backend.name, device_heap_bytes=MiB)
    assert "still hold its driver context" in str(info.value)
    del info
    y.free()  # freed (still referenced): the context goes
    kiln.init(arch=backend.name, device_heap_bytes=MiB)
    assert workload() == pytest.approx(EXPECTED)
    assert x.is_freed and y.is_freed


def test_init_recovers_after_a_lost_device_once_its_arrays_are_deleted(backend):
    x, y = lose_the_device_holding_two_arrays(backend)
    del x
    with pytest.raises(kiln.DeviceLostError) as info:  # y holds the device: no reset yet
        kiln.init(arch=backend.name, device_heap_bytes=MiB)
    assert "still hold its driver context" in str(info.value)
    del info
    del y  # the last user: the context goes (HIP: the device is reset)
    if "device_reset" in backend.entries:
        assert backend.call_count("device_reset") == 1
    kiln.init(arch=backend.name, device_heap_bytes=MiB)
    assert workload() == pytest.approx(EXPECTED)


@pytest.mark.parametrize("use", ["launch", "copy_to_device", "mem_info"])
def test_a_value_the_driver_refuses_is_a_RuntimeFaultError_not_a_usage_error(backend, use):
    """kiln checks every value before the driver sees it: an invalid-value answer from the driver
    is a fault of kiln or the driver (RuntimeFaultError), never the caller's mistake."""
    kiln.init(arch=backend.name, device_heap_bytes=MiB, caching=False)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    assert backend.inject_fault(use, 1, "invalid_value") == 0
    with pytest.raises(kiln.RuntimeFaultError) as info:
        kiln.axpy(1.0, np.ones(1000, dtype=np.float32), x)
        kiln.ndarray(kiln.f32, (1 << 20,))  # mem_info: the live check before growth
    assert not isinstance(info.value, (kiln.InvalidUsageError, MemoryError)), repr(info.value)
    assert backend.status_name("invalid_value") in str(info.value)
    assert workload() == pytest.approx(EXPECTED)  # not sticky: the device goes on


# --- backend-specific ---------------------------------------------------------------------------

@pytest.mark.skipif(ctypes.util.find_library("amdhip64") is None,
                    reason="no HIP runtime installed (scripts/install-deps.sh installs Debian's)")
def test_amdgpu_on_the_real_runtime_without_a_gpu_is_NotSupportedError_with_its_answer(monkeypatch):
    monkeypatch.delenv("KILN_HIP_RUNTIME", raising=False)
    try:
        kiln.init(arch="amdgpu")
    except kiln.NotSupportedError as e:
        assert e.driver_status.startswith("hipError")  # e.g. hipErrorNoDevice
        assert e.driver_status in str(e)
        assert "libamdhip64" in str(e)
    else:
        pytest.skip("this machine has an AMD GPU")
