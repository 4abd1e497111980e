"""Refusals that tell the truth: the caching pool never refuses what
fits unrounded and charges what it holds; which budget check refused is an attribute
(``budget_check``) and each is worded with its own figures; ``site`` names the function that
refused; advice names ``kiln.init``'s arguments; an out-of-memory answer to a copy, a launch or a
module load on the fake CUDA and HIP drivers names the call, not "0 B for ndarray"."""
import ctypes
import os
import pickle

import numpy as np
import pytest

import kiln

MiB = 1 << 20
GiB = 1 << 30
FAKE_CUDA = os.environ.get("KILN_TEST_FAKE_CUDA")
FAKE_HIP = os.environ.get("KILN_TEST_FAKE_HIP")
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY and hipErrorOutOfMemory alike


@pytest.fixture(autouse=True)
def back_to_cpu():
    yield
    kiln.init(arch="cpu", num_threads=2)


def test_a_request_that_fits_unrounded_is_not_refused_because_of_rounding():
    # The example: 64 MiB budget, the 16 MiB heap held, 47.97 MiB left. 47 MiB + 4 KiB
    # fits; its size class (48 MiB) does not.
    kiln.init(arch="cpu", budget_bytes=64 * MiB)
    a = kiln.ndarray(kiln.f32, ((47 * MiB + 4096) // 4,))
    assert kiln.memory_stats()["current_bytes"]["ndarray"] == 47 * MiB + 4096
    del a
    b = kiln.ndarray(kiln.f32, ((45 * MiB) // 4,))  # the 45 MiB
    assert b.nbytes == 45 * MiB


def test_an_8_GiB_array_on_a_9_6_GiB_mock_device_is_held_and_charged_without_a_10_GiB_class():
    kiln.init(arch="mock", mock_capacity_bytes=int(9.6 * GiB))
    a = kiln.ndarray(kiln.f32, ((8 * GiB + 4096) // 4,))
    held = kiln.memory_stats()["current_bytes"]["ndarray"]
    assert 8 * GiB + 4096 <= held <= 8 * GiB + 4096 + max(2 * MiB, held // 64)
    del a


def test_every_budget_refusal_reports_more_requested_than_room():
    kiln.init(arch="cpu", budget_bytes=64 * MiB)
    for size in range(40 * MiB + 4, 56 * MiB, 256 * 1024 + 4):
        try:
            a = kiln.ndarray(kiln.f32, (size // 4,))
        except kiln.BudgetExceededError as e:
            assert e.budget_check == "limit"
            room = e.limit_bytes - sum(e.in_use_bytes.values())
            assert e.requested_bytes > room
            assert e.class_bytes == 0 or e.class_bytes > room
        else:
            del a
            kiln.empty_cache()


def test_a_live_refusal_is_worded_as_one_with_no_reserve():
    kiln.init(arch="mock", mock_capacity_bytes=1 * GiB, reserve_bytes=0, budget_bytes=1 * GiB,
              mock_other_process_bytes=1000 * MiB)
    with pytest.raises(kiln.BudgetExceededError) as info:
        kiln.ndarray(kiln.f64, (8 * MiB,))  # 64 MiB
    e = info.value
    assert e.budget_check == "live_free"
    assert e.site == "BudgetAdaptor::check_live_free"
    assert "live free device memory" in str(e) and "left" not in str(e)
    back = pickle.loads(pickle.dumps(e))
    assert back.budget_check == "live_free" and str(back) == str(e)


def test_a_limit_refusal_names_its_site_check_and_the_python_knob():
    kiln.init(arch="cpu", budget_bytes=64 * MiB)
    with pytest.raises(kiln.BudgetExceededError) as info:
        kiln.ndarray(kiln.f32, (1 << 40,))  # the README's 4 TiB
    e = info.value
    assert e.budget_check == "limit"
    assert e.site == "BudgetAdaptor::refused_outright"
    assert "kiln.device(\"cpu\").configure(budget_bytes=...)" in str(e) and "KILN_POOL_LIMIT_MB" in str(e)
    assert "--budget-mb" not in str(e) and "BudgetConfig" not in str(e)
    assert e.advice in str(e)
    back = pickle.loads(pickle.dumps(e))
    assert (back.budget_check, back.site, back.advice) == ("limit", e.site, e.advice)


def test_an_injected_fault_says_so_and_advises_no_budget():
    kiln.init(arch="cpu")
    with kiln.testing.fail_allocation(at=1):
        with pytest.raises(kiln.DeviceOutOfMemoryError) as info:
            kiln.ndarray(kiln.f32, (16,))
    e = info.value
    assert e.budget_check == "none"
    assert "injected" in str(e) and "budget" not in str(e) and "KILN_POOL_LIMIT_MB" not in str(e)


def _driver_oom_in(arch, lib, inject, entry):
    """The error a driver out-of-memory answer at the first `entry` call gives (init, a copy
    and a launch are tried in turn; the fault fires at the first one that calls `entry`)."""
    inject(entry.encode(), 1, OUT_OF_MEMORY)
    with pytest.raises(MemoryError) as info:
        kiln.init(arch=arch, device_heap_bytes=1 << 20, caching=False)
        x = kiln.from_numpy(np.arange(1, 1001, dtype=np.float32))
        y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
        kiln.axpy(2.0, x, y)
    e = info.value
    e.__traceback__ = None
    return e


def _check_operation_oom(e, entry):
    assert type(e) is kiln.DeviceOutOfMemoryError
    assert e.site == entry
    assert f"ran out of memory in {entry}" in str(e)
    assert "0 B" not in str(e) and "for ndarray" not in str(e)


_NEEDS_FAKE_CUDA = pytest.mark.skipif(
    not FAKE_CUDA, reason="KILN_TEST_FAKE_CUDA (the fake driver's path) not set")
_NEEDS_FAKE_HIP = pytest.mark.skipif(
    not FAKE_HIP, reason="KILN_TEST_FAKE_HIP (the fake runtime's path) not set")


@pytest.mark.parametrize("arch,driver_variable,fake,prefix,entry", [
    *(pytest.param("cuda", "KILN_CUDA_DRIVER", FAKE_CUDA, "kiln_fake_cuda", entry,
                   marks=_NEEDS_FAKE_CUDA, id=f"cuda-{entry}")
      for entry in ["cuMemcpyHtoD_v2", "cuLaunchKernel", "cuModuleLoadData"]),
    *(pytest.param("amdgpu", "KILN_HIP_RUNTIME", FAKE_HIP, "kiln_fake_hip", entry,
                   marks=_NEEDS_FAKE_HIP, id=f"hip-{entry}")
      for entry in ["hipMemcpyHtoD", "hipModuleLaunchKernel", "hipModuleLoadData"]),
])
def test_a_driver_out_of_memory_outside_an_allocation_names_the_call(
        monkeypatch, arch, driver_variable, fake, prefix, entry):
    monkeypatch.setenv(driver_variable, fake)
    lib = ctypes.CDLL(fake)
    inject = getattr(lib, f"{prefix}_inject_fault")
    inject.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_int]
    reset = getattr(lib, f"{prefix}_reset")
    reset()
    try:
        _check_operation_oom(_driver_oom_in(arch, lib, inject, entry), entry)
    finally:
        kiln.init(arch="cpu", num_threads=2)
        reset()


def test_a_reserve_not_below_the_devices_total_is_refused_at_init_naming_the_reserve():
    # It used to be a BudgetExceededError at the first allocation, showing reserve_bytes=0 and
    # advising a larger budget: the reserve was the problem.
    with pytest.raises(kiln.InvalidUsageError, match=r"the reserve, 128.00 MiB, is not below "
                                                     r"the device's total memory, 64.00 MiB") as caught:
        kiln.init(arch="mock", mock_capacity_bytes=64 * MiB, reserve_bytes=128 * MiB)
    assert not isinstance(caught.value, MemoryError)
    assert "reserve_bytes" in str(caught.value)
    with pytest.raises(kiln.InvalidUsageError):
        kiln.init(arch="mock", mock_capacity_bytes=64 * MiB, reserve_bytes=64 * MiB)
    kiln.init(arch="mock", mock_capacity_bytes=64 * MiB, reserve_bytes=32 * MiB,
              device_heap_bytes=4096)  # below the total: fine
    assert kiln.memory_stats()["limit_bytes"] == 32 * MiB
