"""kiln.testing.fake_cuda / fake_hip: kiln's GPU backends on the fake drivers, configured from
Python. An out-of-memory error on the fake device names the capacity asked for; other processes'
use, a fault plan and later control calls take effect; the block restores the driver variable
and leaves kiln on the CPU; a missing or unloadable library is NotSupportedError, a bad setting
InvalidUsageError with nothing left configured; blocks do not nest."""
import os
import time

import numpy as np
import pytest

import kiln
import kiln.testing

MiB = 1 << 20

# (the context manager, kiln's arch, the loader's variable, an allocation entry, a launch entry)
APIS = [
    pytest.param((kiln.testing.fake_cuda, "cuda", "KILN_CUDA_DRIVER", "cuMemAlloc_v2",
                  "cuLaunchKernel"), id="cuda"),
    pytest.param((kiln.testing.fake_hip, "amdgpu", "KILN_HIP_RUNTIME", "hipMalloc",
                  "hipModuleLaunchKernel"), id="amdgpu"),
]


@pytest.fixture(params=APIS)
def api(request):
    return request.param


def test_a_driver_oom_names_the_capacity_asked_for(api):
    fake_gpu, arch, _, _, _ = api
    with fake_gpu(capacity_bytes=256 * MiB) as fake:
        kiln.init(arch=arch, budget_bytes=1 << 30, live_check=False)  # only the driver refuses
        with pytest.raises(kiln.DeviceOutOfMemoryError) as caught:
            kiln.ndarray(kiln.f32, 300 * MiB // 4)
        assert caught.value.total_bytes == 256 * MiB
        assert "free of 256.00 MiB" in str(caught.value)
        assert fake.oom_count() == 1


def test_kilns_budget_comes_from_the_capacity(api):
    fake_gpu, arch, _, _, _ = api
    with fake_gpu(capacity_bytes=256 * MiB):
        kiln.init(arch=arch)
        assert kiln.memory_stats()["limit_bytes"] == 192 * MiB  # total - the 64 MiB reserve
        with pytest.raises(kiln.BudgetExceededError) as caught:
            kiln.ndarray(kiln.f32, 200 * MiB // 4)
        assert caught.value.total_bytes == 256 * MiB and caught.value.limit_bytes == 192 * MiB


def test_a_refusal_when_the_driver_cannot_say_its_free_memory(api):
    fake_gpu, arch, _, _, _ = api
    query = "cuMemGetInfo_v2" if arch == "cuda" else "hipMemGetInfo"
    with fake_gpu(capacity_bytes=256 * MiB) as fake:
        kiln.init(arch=arch)
        time.sleep(0.03)  # no reading of this kernel tick left to reuse
        fake.inject_fault(query, 1, 999)  # the refusal's own query fails
        with pytest.raises(kiln.BudgetExceededError) as caught:
            kiln.ndarray(kiln.f32, 200 * MiB // 4)
        e = caught.value
        assert e.free_bytes is None and e.total_bytes is None  # not read: no figure made up
        assert e.live_age_ms is None  # nor the age of a reading
        assert e.limit_bytes == 192 * MiB
        assert "free memory could not be read" in str(e) and "0 B free" not in str(e)


@pytest.mark.parametrize("other", [400 * MiB, [400 * MiB]], ids=["bytes", "script"])
def test_other_processes_use_lowers_the_free_memory(api, other):
    fake_gpu, arch, _, _, _ = api
    with fake_gpu(capacity_bytes=512 * MiB, other_process_bytes=other) as fake:
        kiln.init(arch=arch, budget_bytes=1 << 30)
        with pytest.raises(kiln.OutOfMemoryError) as caught:
            kiln.ndarray(kiln.f32, 128 * MiB // 4)
        assert caught.value.budget_check == "live_free"  # the live free memory refused
        assert 112 * MiB - 20 * MiB < caught.value.free_bytes < 112 * MiB - fake.held_bytes()
        fake.set_other_process_bytes(0)  # the other process is gone
        kiln.ndarray(kiln.f32, 128 * MiB // 4).free()


def test_a_fault_plan_and_a_later_injected_fault(api):
    fake_gpu, arch, _, alloc, launch = api
    with fake_gpu(faults=f"{launch}@2=700") as fake:
        kiln.init(arch=arch)
        a = kiln.ndarray(kiln.f32, 16)
        fake.inject_fault(alloc, 1, 2)  # the next allocation: out of memory
        with pytest.raises(kiln.DeviceOutOfMemoryError):
            kiln.ndarray(kiln.f32, 1 << 20)
        kiln.fill(a, 1.0)  # the first launch runs
        with pytest.raises(kiln.DeviceLostError):
            kiln.fill(a, 2.0)  # the second: 700, an illegal address, the device is lost
        assert fake.sticky_error() == 700 and fake.launch_count() == 1
        assert fake.call_count(launch) == 2 and fake.oom_count() == 0  # injected, not capacity
        assert fake.high_water_bytes() >= fake.held_bytes() > 16 * MiB  # the device heap
        with pytest.raises(kiln.InvalidUsageError, match="not an entry point"):
            fake.inject_fault("noSuchEntry", 1, 2)


def test_the_block_restores_the_driver_variable_and_leaves_kiln_on_the_cpu(api, monkeypatch):
    fake_gpu, arch, driver_env, _, _ = api
    monkeypatch.setenv(driver_env, "/the/users/driver.so")
    with fake_gpu() as fake:
        assert os.environ[driver_env] == fake.library
        kiln.init(arch=arch)
        assert kiln.device() == f"{arch}:0"
    assert os.environ[driver_env] == "/the/users/driver.so"
    assert kiln.device() == "cpu"


def test_the_library_is_found_beside_the_package(api, monkeypatch):
    fake_gpu, arch, _, _, _ = api
    monkeypatch.delenv(f"KILN_FAKE_{'CUDA' if arch == 'cuda' else 'HIP'}_LIBRARY", raising=False)
    name = "libkiln_fake_cuda.so" if arch == "cuda" else "libkiln_fake_hip.so"
    beside = os.path.join(os.path.dirname(kiln.__file__), "_fake", name)  # CMake links it there
    with fake_gpu() as fake:
        assert fake.library == os.path.realpath(beside)


def test_a_missing_or_unloadable_library_is_not_supported(api, tmp_path):
    fake_gpu, _, _, _, _ = api
    missing = str(tmp_path / "libnothing.so")
    with pytest.raises(kiln.NotSupportedError, match="is not here") as caught:
        with fake_gpu(library=missing):
            pass
    assert missing in str(caught.value)
    junk = tmp_path / "libjunk.so"
    junk.write_text("not a library")
    with pytest.raises(kiln.NotSupportedError, match="does not load"):
        with fake_gpu(library=str(junk)):
            pass


def test_a_bad_setting_is_invalid_usage_and_nothing_stays_configured(api):
    fake_gpu, arch, _, alloc, _ = api
    with pytest.raises(kiln.InvalidUsageError, match=f"item '{alloc}@x=2' is not"):
        with fake_gpu(faults=f"{alloc}@x=2"):
            pass
    with pytest.raises(kiln.InvalidUsageError, match="whole MiB"):
        with fake_gpu(other_process_bytes=[1000]):
            pass
    with pytest.raises(kiln.InvalidUsageError, match="ARCH='nonsense' is not a processor"):
        with fake_gpu(arch="nonsense"):
            pass
    with pytest.raises(kiln.InvalidUsageError, match="capacity_bytes must be from 0 to"):
        with fake_gpu(capacity_bytes=-1):
            pass
    # Beyond what the fake (and ctypes' size_t) holds: refused, not cut to its low bits.
    for huge in (2**64 + (512 << 20), 2**70):
        with pytest.raises(kiln.InvalidUsageError, match=f"capacity_bytes must be from 0 to {2**60}, not {huge}"):
            with fake_gpu(capacity_bytes=huge):
                pass
    with fake_gpu() as fake:
        with pytest.raises(kiln.InvalidUsageError, match="result must be from 0 to"):
            fake.inject_fault(alloc, 1, 2**40)  # would have been cut to 0: success, no fault
        with pytest.raises(kiln.InvalidUsageError, match="nth_call must be from 0 to"):
            fake.inject_fault(alloc, 2**64, 2)
    with fake_gpu():  # the refused plan is gone: kiln's set-up allocates and launches freely
        kiln.init(arch=arch)
        kiln.fill(kiln.ndarray(kiln.f32, 16), 1.0)


@pytest.mark.parametrize("mode", ["nodevice", "stub"])
def test_no_device_and_stub_modes_are_not_supported_at_init(api, mode):
    fake_gpu, arch, _, _, _ = api
    with fake_gpu(mode=mode):
        with pytest.raises(kiln.NotSupportedError):
            kiln.init(arch=arch)


def test_blocks_do_not_nest_nor_start_under_an_executor_on_that_backend(api):
    fake_gpu, arch, _, _, _ = api
    with fake_gpu():
        with pytest.raises(kiln.InvalidUsageError, match="already open"):
            with fake_gpu():
                pass
        kiln.init(arch=arch)
        with pytest.raises(kiln.InvalidUsageError, match="already open"):
            with fake_gpu():
                pass
    with fake_gpu():
        kiln.init(arch=arch)
        saved = os.environ.copy()
    # An executor on the backend made outside a block (here: the driver variable pointing at
    # the fake by hand) must go first: the fake would be reset under it.
    os.environ.update(saved)
    try:
        kiln.init(arch=arch)
        with pytest.raises(kiln.InvalidUsageError, match="kiln.init\\(arch='cpu'\\) first"):
            with fake_gpu():
                pass
    finally:
        kiln.init(arch="cpu")


def test_the_processor_the_device_reports(api):
    fake_gpu, arch, _, _, _ = api
    with fake_gpu(arch="sm_90" if arch == "cuda" else "gfx942:sramecc+:xnack-"):
        kiln.init(arch=arch)  # kiln loads code for that processor
        a = kiln.from_numpy(np.arange(4, dtype=np.float32))
        assert kiln.reduce_sum(a) == 6.0


def test_several_devices_each_with_its_own_memory(api):
    fake_gpu, arch, _, _, _ = api
    dlpack_type = 2 if arch == "cuda" else 10  # kDLCUDA, kDLROCM
    with fake_gpu(capacity_bytes=256 * MiB, devices=2) as fake:
        assert fake.device_count() == 2
        assert fake.capacity_bytes(1) == 256 * MiB
        kiln.init(arch=f"{arch}:0", budget_bytes=1 << 30, live_check=False)
        kept = kiln.ndarray(kiln.f32, 200 * MiB // 4)  # stays on device 0 after the next init
        assert kept.device == f"{arch}:0"
        assert kept.__dlpack_device__() == (dlpack_type, 0)
        kiln.init(arch=f"{arch}:1", budget_bytes=1 << 30, live_check=False)
        assert kiln.device() == f"{arch}:1"
        a = kiln.from_numpy(np.arange(4, dtype=np.float32))
        assert a.device == f"{arch}:1"
        assert a.__dlpack_device__() == (dlpack_type, 1)
        assert kiln.reduce_sum(a) == 6.0
        assert fake.held_bytes(device=0) >= 200 * MiB
        assert 0 < fake.held_bytes(device=1) < 200 * MiB
        assert fake.held_bytes() == fake.held_bytes(device=0) + fake.held_bytes(device=1)
        assert fake.launch_count(device=1) > 0
        # Device 1's own memory refuses: the error names it and its figures, not device 0's.
        with pytest.raises(kiln.DeviceOutOfMemoryError) as caught:
            kiln.ndarray(kiln.f32, 250 * MiB // 4)
        assert caught.value.device == f"{arch}:1"
        assert f"{arch}:1" in str(caught.value)
        assert caught.value.total_bytes == 256 * MiB
        assert caught.value.free_bytes > 200 * MiB  # device 0's 200 MiB are not device 1's
        assert fake.oom_count(device=1) >= 1 and fake.oom_count(device=0) == 0  # kiln may retry
        del kept
        with pytest.raises(kiln.InvalidUsageError, match="device must be an int from 0 to 1"):
            fake.held_bytes(device=2)


def test_a_device_the_fake_does_not_have_is_not_supported(api):
    fake_gpu, arch, _, _, _ = api
    with fake_gpu(devices=2):
        with pytest.raises(kiln.NotSupportedError, match=r"reports 2 device\(s\)"):
            kiln.init(arch=f"{arch}:2")
    with fake_gpu():
        with pytest.raises(kiln.NotSupportedError, match=r"reports 1 device\(s\)"):
            kiln.init(arch=f"{arch}:1")
    for bad in (0, 9, True, "2"):
        with pytest.raises(kiln.InvalidUsageError, match="devices must be an int from 1 to 8"):
            with fake_gpu(devices=bad):
                pass


@pytest.mark.parametrize("name", ["cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda:1:2", "tpu:0",
                                  "cuda:99999"])
def test_a_malformed_device_name_is_invalid_usage(name):
    kiln.init(arch="cpu")
    with pytest.raises(kiln.InvalidUsageError):
        kiln.init(arch=name)
    assert kiln.device() == "cpu"


@pytest.mark.parametrize("name", ["cpu:1", "mock:1"])
def test_cpu_and_mock_have_only_device_0(name):
    with pytest.raises(kiln.InvalidUsageError, match="has one device"):
        kiln.init(arch=name)
    kiln.init(arch=name.replace(":1", ":0"))
    assert kiln.device() == name.split(":")[0]
    kiln.init(arch="cpu")


def test_the_fake_refuses_an_ordinal_it_lacks_as_the_real_driver():
    import ctypes
    with kiln.testing.fake_hip(devices=2) as fake:
        hip = ctypes.CDLL(fake.library)
        assert hip.hipInit(0) == 0
        assert hip.hipSetDevice(1) == 0
        assert hip.hipSetDevice(2) == 101  # hipErrorInvalidDevice
        assert hip.hipSetDevice(0) == 0
    with kiln.testing.fake_cuda(devices=2) as fake:
        cuda = ctypes.CDLL(fake.library)
        assert cuda.cuInit(0) == 0
        count, device = ctypes.c_int(0), ctypes.c_int(-1)
        assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value == 2
        assert cuda.cuDeviceGet(ctypes.byref(device), 1) == 0 and device.value == 1
        assert cuda.cuDeviceGet(ctypes.byref(device), 2) == 101  # CUDA_ERROR_INVALID_DEVICE
