"""ndarray.__cuda_array_interface__ (version 3, Numba's specification): on CUDA arrays the
dictionary's contents are checked against the fake CUDA driver; cpu, mock and HIP arrays have no
such attribute (AttributeError, so hasattr() is False)."""
import numpy as np
import pytest

import kiln


@pytest.fixture(params=["cpu", "mock"])
def host_arch(request):
    kiln.init(arch=request.param)
    return request.param


def test_cuda_array_interface_is_absent_on_cpu_and_mock(host_arch):
    a = kiln.ndarray(kiln.f32, 3)
    assert not hasattr(a, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="CUDA executor"):
        a.__cuda_array_interface__


@pytest.mark.parametrize("shape, dtype, typestr", [
    ((2, 3), np.float32, "<f4"), ((5,), np.int64, "<i8"), ((), np.float64, "<f8"),
    ((0, 4), np.int32, "<i4"),
])
def test_cuda_array_interface_on_the_fake_cuda_driver(backend, shape, dtype, typestr):
    if backend.name != "cuda":
        pytest.skip("__cuda_array_interface__ is for CUDA arrays only")
    kiln.init(arch="cuda", device_heap_bytes=1 << 20)
    a = kiln.from_numpy(np.zeros(shape, dtype=dtype))
    cai = a.__cuda_array_interface__
    assert cai["shape"] == shape
    assert cai["typestr"] == typestr
    assert cai["version"] == 3
    assert cai["strides"] is None
    assert cai["stream"] is None
    ptr, read_only = cai["data"]
    assert read_only is False and isinstance(ptr, int)
    assert (ptr != 0) == (a.size != 0)
    assert set(cai) == {"shape", "typestr", "data", "version", "strides", "stream"}


def test_cuda_array_interface_is_absent_on_hip_arrays(backend):
    if backend.name != "amdgpu":
        pytest.skip("HIP arrays only")
    kiln.init(arch="amdgpu", device_heap_bytes=1 << 20)
    assert not hasattr(kiln.ndarray(kiln.f32, 3), "__cuda_array_interface__")


def test_a_freed_cuda_array_gives_no_pointer(backend):
    if backend.name != "cuda":
        pytest.skip("__cuda_array_interface__ is for CUDA arrays only")
    kiln.init(arch="cuda", device_heap_bytes=1 << 20)
    a = kiln.ndarray(kiln.f32, 4)
    a.free()
    with pytest.raises(kiln.InvalidUsageError, match="freed"):
        a.__cuda_array_interface__


def test_free_is_refused_once_the_pointer_went_out(backend):
    # The interface has no release: once its pointer is out, free() would let the memory be
    # reused under a consumer. It is refused; garbage collection gives the memory back.
    if backend.name != "cuda":
        pytest.skip("__cuda_array_interface__ is for CUDA arrays only")
    import gc
    kiln.init(arch="cuda", device_heap_bytes=1 << 20)
    before = kiln.memory_stats()["current_bytes"]["ndarray"]
    a = kiln.ndarray(kiln.f32, 1024)
    b = kiln.ndarray(kiln.f32, 1024)
    assert a.__cuda_array_interface__["data"][0] != 0
    with pytest.raises(kiln.InvalidUsageError, match="__cuda_array_interface__"):
        a.free()
    b.free()  # an array whose pointer never went out frees as before
    assert kiln.memory_stats()["current_bytes"]["ndarray"] == before + 4096
    del a
    gc.collect()
    assert kiln.memory_stats()["current_bytes"]["ndarray"] == before
