"""DLPack both ways and the CUDA Array Interface.

numpy 1.24 is the real consumer and producer: np.from_dlpack(a) and kiln.from_dlpack(numpy_array)
share memory (same address, a write on one side is seen on the other) for every dtype and for 0-d,
1-d, n-d and empty shapes, on cpu and mock. Lifetimes: an exported capsule keeps the kiln array
alive and free() refuses while it (or the array a consumer made from it) lives; an imported
tensor's deleter runs exactly once (a ctypes tensor whose deleter counts), when the kiln array is
gone. Every refusal (dtype, lanes, strides, alignment, device) comes before the capsule is
consumed and leaks nothing. Deletion in any order after a round trip runs in a subprocess with a
timeout. The DLPack device of GPU arrays and a GPU round trip are checked on the fake drivers
(test_cuda_array_interface.py has the CUDA Array Interface)."""
import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln

HOST_ARCHS = ["cpu", "mock"]
DTYPES = [np.float32, np.float64, np.int32, np.int64]
SHAPES = [(), (7,), (2, 3, 4), (0,), (3, 0, 2)]
KDLCPU, KDLCUDA, KDLOPENCL, KDLROCM = 1, 2, 4, 10
KDLINT, KDLFLOAT = 0, 2
TIMEOUT_S = 120


def address_of(a):
    """The data address numpy sees for a numpy array."""
    return a.__array_interface__["data"][0]


def kiln_address(k):
    """The data address of a kiln array on a host device (its zero-copy numpy view)."""
    return address_of(np.asarray(k))


def sample(shape, dtype):
    return (np.arange(int(np.prod(shape)), dtype=dtype) + 1).reshape(shape)


@pytest.fixture(params=HOST_ARCHS)
def host_arch(request):
    kiln.init(arch=request.param)
    return request.param


# --- kiln -> numpy ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_numpy_from_dlpack_shares_kilns_memory(host_arch, dtype, shape):
    a = kiln.from_numpy(sample(shape, dtype))
    n = np.from_dlpack(a)
    assert n.dtype == dtype and n.shape == shape
    np.testing.assert_array_equal(n, sample(shape, dtype))
    if a.size:
        assert address_of(n) == kiln_address(a)
        kiln.fill(a, 9)  # numpy 1.24's from_dlpack arrays are read-only: write on kiln's side
        assert (n == 9).all()


def test_dlpack_device_is_cpu_on_cpu_and_mock(host_arch):
    a = kiln.ndarray(kiln.f32, 3)
    assert a.__dlpack_device__() == (KDLCPU, 0)


def test_export_counts_as_a_use_free_refuses_until_the_consumer_lets_go(host_arch):
    a = kiln.from_numpy(np.ones(4, dtype=np.float32))
    n = np.from_dlpack(a)
    with pytest.raises(kiln.InvalidUsageError, match="export"):
        a.free()
    assert not a.is_freed
    del n
    gc.collect()
    a.free()
    assert a.is_freed


def test_an_unconsumed_capsule_ends_its_export_when_it_dies():
    a = kiln.from_numpy(np.ones(4, dtype=np.float32))
    capsule = a.__dlpack__()
    with pytest.raises(kiln.InvalidUsageError):
        a.free()
    del capsule
    a.free()


def test_the_capsule_keeps_the_array_alive_after_its_last_python_reference():
    a = kiln.from_numpy(np.arange(5, dtype=np.float64))
    capsule = a.__dlpack__()
    del a
    gc.collect()
    b = kiln.from_dlpack(capsule)  # kiln consumes its own capsule: the memory is still there
    np.testing.assert_array_equal(b.to_numpy(), np.arange(5, dtype=np.float64))


def test_exported_memory_stays_valid_after_kiln_init_replaces_the_executor():
    a = kiln.from_numpy(np.arange(6, dtype=np.int32))
    n = np.from_dlpack(a)
    del a
    kiln.init(arch="cpu")
    gc.collect()
    np.testing.assert_array_equal(n, np.arange(6, dtype=np.int32))


def test_dlpack_keyword_arguments_of_the_array_api():
    a = kiln.from_numpy(np.arange(3, dtype=np.float32))
    assert type(a.__dlpack__(stream=None, max_version=(1, 0), dl_device=(KDLCPU, 0),
                             copy=False)).__name__ == "PyCapsule"
    copied = kiln.from_dlpack(a.__dlpack__(copy=True))
    kiln.fill(copied, 5)
    np.testing.assert_array_equal(a.to_numpy(), [0, 1, 2])  # copy=True shares nothing
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(KDLCUDA, 0))
    with pytest.raises(kiln.InvalidUsageError, match="stream"):
        a.__dlpack__(stream=1)  # host memory: the DLPack specification allows only None
    with pytest.raises(kiln.InvalidTypeError):
        a.__dlpack__(stream="default")
    with pytest.raises(kiln.InvalidTypeError):
        a.__dlpack__(None)  # keyword-only
    with pytest.raises(kiln.InvalidTypeError):
        a.__dlpack__(max_version=1)
    del copied
    a.free()  # none of the refused calls left an export behind


def test_a_freed_array_is_not_exported():
    a = kiln.ndarray(kiln.f32, 3)
    a.free()
    with pytest.raises(kiln.InvalidUsageError, match="freed"):
        a.__dlpack__()


# --- numpy -> kiln ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kiln_from_dlpack_shares_numpys_memory(host_arch, dtype, shape):
    src = sample(shape, dtype)
    k = kiln.from_dlpack(src)
    assert k.dtype == dtype and k.shape == shape and k.device == host_arch
    np.testing.assert_array_equal(k.to_numpy(), src)
    if src.size:
        assert kiln_address(k) == address_of(src)
        src[...] = 3  # numpy's side written, seen by kiln
        assert (k.to_numpy() == 3).all()
        kiln.fill(k, 7)  # kiln's side written, seen by numpy
        assert (src == 7).all()


def test_imported_memory_is_not_charged_to_kilns_budget():
    before = kiln.memory_stats()["allocated_bytes"]
    k = kiln.from_dlpack(np.ones(1 << 16, dtype=np.float64))
    assert kiln.memory_stats()["allocated_bytes"] == before
    assert kiln.reduce_sum(k) == 1 << 16


def test_imported_array_keeps_the_numpy_array_alive_until_it_is_gone():
    src = np.arange(8, dtype=np.int64)
    base = sys.getrefcount(src)
    k = kiln.from_dlpack(src)
    assert sys.getrefcount(src) == base + 1  # numpy's deleter holds one reference
    del src
    gc.collect()
    np.testing.assert_array_equal(k.to_numpy(), np.arange(8))
    del k


def test_free_whose_producer_release_replaces_the_executor_is_safe():
    # free() of an imported array runs the producer's deleter, which may run Python that calls
    # kiln.init and so destroys the executor free() was called on: free runs it last.
    replaced = []
    class Buffer(bytearray):
        def __del__(self):
            kiln.init("cpu")
            replaced.append(True)
    kiln.init("cpu")
    src = np.frombuffer(Buffer(32), dtype=np.float32)
    live = kiln._kiln._live_array_bytes()
    k = kiln.from_dlpack(src)
    del src
    gc.collect()
    k.free()
    assert replaced == [True] and k.is_freed
    assert kiln._kiln._live_array_bytes() == live
    x = kiln.ndarray(kiln.f32, (4,))  # the new executor works
    kiln.fill(x, 2.0)
    assert kiln.reduce_sum(x) == 8.0


def test_free_of_an_imported_array_gives_the_memory_back_once():
    src = np.arange(4, dtype=np.float32)
    base = sys.getrefcount(src)
    k = kiln.from_dlpack(src)
    k.free()
    assert sys.getrefcount(src) == base
    with pytest.raises(kiln.InvalidUsageError):
        k.free()
    del k
    assert sys.getrefcount(src) == base


def test_kiln_to_kiln_round_trip_is_zero_copy_and_counts_the_export():
    a = kiln.from_numpy(np.arange(4, dtype=np.int32))
    b = kiln.from_dlpack(a)
    assert kiln_address(b) == kiln_address(a)
    with pytest.raises(kiln.InvalidUsageError):
        a.free()
    del b
    gc.collect()
    a.free()


def test_a_consumed_capsule_is_renamed_and_refused_the_second_time():
    capsule = np.ones(3).__dlpack__()
    k = kiln.from_dlpack(capsule)
    assert 'used_dltensor' in repr(capsule)
    with pytest.raises(kiln.InvalidUsageError, match="already consumed"):
        kiln.from_dlpack(capsule)
    np.testing.assert_array_equal(k.to_numpy(), np.ones(3))


def test_read_only_numpy_arrays_are_refused_by_numpy_itself():
    # DLPack 0.6 has no read-only flag; numpy 1.24 refuses to export such arrays. kiln would make
    # a writable array of them, so it does not work around that refusal.
    src = np.zeros(3, dtype=np.float32)
    src.flags.writeable = False
    with pytest.raises(BufferError):
        kiln.from_dlpack(src)


@pytest.mark.parametrize("value", [[1.0, 2.0], 3.0, "x", None, memoryview(b"abcd")])
def test_objects_without_dlpack_are_InvalidTypeError(value):
    with pytest.raises(kiln.InvalidTypeError, match="__dlpack__"):
        kiln.from_dlpack(value)


# Refusals: each before the capsule is consumed (the producer's reference comes back) and
# before anything is allocated.
@pytest.mark.parametrize("make, words", [
    (lambda: np.zeros(3, dtype=np.float16), "no float16"),
    (lambda: np.zeros(3, dtype=np.uint8), "no uint8"),
    (lambda: np.zeros(3, dtype=np.complex64), "no complex64"),
    (lambda: np.zeros((4, 4), dtype=np.float32)[:, ::2], "not row-major"),
    (lambda: np.zeros((4, 4), dtype=np.float32).T, "not row-major"),
    (lambda: np.zeros(13, dtype=np.uint8)[1:].view(np.float32), "not aligned"),
])
def test_tensors_kiln_cannot_represent_are_refused_leaking_nothing(make, words):
    src = make()
    base = sys.getrefcount(src)
    before = kiln.memory_stats()["allocated_bytes"]
    with pytest.raises(kiln.InvalidUsageError, match=words):
        kiln.from_dlpack(src)
    gc.collect()
    assert sys.getrefcount(src) == base
    assert kiln.memory_stats()["allocated_bytes"] == before


def test_size_one_dimensions_may_have_any_stride():
    src = np.zeros((4, 4), dtype=np.float32)[:, 1:2]  # shape (4, 1), strides (4, 1) in elements
    k = kiln.from_dlpack(np.ascontiguousarray(src))
    assert k.shape == (4, 1)
    row = np.arange(8, dtype=np.float32).reshape(2, 4)[1:2]  # shape (1, 4), a sliced row
    k2 = kiln.from_dlpack(row)
    assert kiln_address(k2) == address_of(row)


# --- a ctypes tensor whose deleter counts -------------------------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


CAPSULE_NAME = ctypes.c_char_p(b"dltensor")  # the capsule keeps this pointer: kept alive here
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class CountingTensor:
    """A DLPack tensor over a numpy buffer, in a capsule without a destructor, whose deleter
    counts its calls."""

    def __init__(self, buffer, shape, code=KDLFLOAT, bits=32, lanes=1, device=(KDLCPU, 0),
                 strides=None, byte_offset=0):
        self.buffer = buffer
        self.calls = 0
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)

        def deleter(_):
            self.calls += 1
        self.deleter = DELETER(deleter)
        t = DLManagedTensor()
        t.dl_tensor.data = address_of(buffer)
        t.dl_tensor.device = DLDevice(*device)
        t.dl_tensor.ndim = len(shape)
        t.dl_tensor.dtype = DLDataType(code, bits, lanes)
        t.dl_tensor.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            t.dl_tensor.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        t.dl_tensor.byte_offset = byte_offset
        t.deleter = self.deleter
        self.managed = t
        self.capsule = _capsule_new(ctypes.addressof(t), CAPSULE_NAME, None)


def test_an_imported_tensors_deleter_runs_exactly_once_when_the_array_is_gone():
    buffer = np.arange(6, dtype=np.float32)
    t = CountingTensor(buffer, (2, 3))
    k = kiln.from_dlpack(t.capsule)
    assert t.calls == 0
    kiln.fill(k, 2)
    assert (buffer == 2).all()
    view = np.asarray(k)
    del k
    assert t.calls == 0  # the buffer view holds the array
    del view
    gc.collect()
    assert t.calls == 1
    del t.capsule  # consumed: the capsule does not call it again
    gc.collect()
    assert t.calls == 1


def test_an_imported_tensors_deleter_runs_once_on_free_and_not_again_at_deletion():
    t = CountingTensor(np.zeros(4, dtype=np.int64), (4,), code=KDLINT, bits=64)
    k = kiln.from_dlpack(t.capsule)
    k.free()
    assert t.calls == 1
    del k
    gc.collect()
    assert t.calls == 1


def test_an_empty_imported_tensor_still_calls_its_deleter_once():
    t = CountingTensor(np.zeros(1, dtype=np.float32), (0, 5))
    k = kiln.from_dlpack(t.capsule)
    assert k.shape == (0, 5) and k.size == 0
    del k
    assert t.calls == 1


def test_byte_offset_is_honoured_when_aligned():
    buffer = np.arange(8, dtype=np.float32)
    t = CountingTensor(buffer, (4,), byte_offset=16)
    k = kiln.from_dlpack(t.capsule)
    np.testing.assert_array_equal(k.to_numpy(), [4, 5, 6, 7])
    assert kiln_address(k) == address_of(buffer) + 16


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(lanes=4), kiln.InvalidUsageError, "4 lanes"),
    (dict(code=4, bits=16), kiln.InvalidUsageError, "no bfloat16"),
    (dict(byte_offset=2), kiln.InvalidUsageError, "not aligned"),
    (dict(strides=(1, 2)), kiln.InvalidUsageError, "not row-major"),
    (dict(device=(KDLOPENCL, 0)), kiln.NotSupportedError, "type 4"),
    (dict(device=(KDLCUDA, 0)), kiln.InvalidUsageError, "cuda:0 but kiln's current device is cpu"),
    (dict(device=(KDLROCM, 1)), kiln.InvalidUsageError, "rocm:1"),
])
def test_refused_tensors_are_left_to_their_producer(kwargs, error, words):
    t = CountingTensor(np.zeros(8, dtype=np.float32), (2, 2), **kwargs)
    with pytest.raises(error, match=words):
        kiln.from_dlpack(t.capsule)
    assert t.calls == 0
    assert "used_dltensor" not in repr(t.capsule)  # not consumed: still the producer's
    t.managed.dl_tensor.dtype = DLDataType(KDLFLOAT, 32, 1)  # made valid, it imports
    t.managed.dl_tensor.device = DLDevice(KDLCPU, 0)
    t.managed.dl_tensor.byte_offset = 0
    t.managed.dl_tensor.strides = None
    kiln.from_dlpack(t.capsule)
    assert t.calls == 1


def test_a_foreign_capsule_is_InvalidTypeError():
    other = _capsule_new(ctypes.addressof(ctypes.c_int(1)), ctypes.c_char_p(b"not_dltensor"), None)
    with pytest.raises(kiln.InvalidTypeError, match="dltensor"):
        kiln.from_dlpack(other)


# --- deletion in any order (a crash would kill pytest: a subprocess) ----------------------------

ORDERS = textwrap.dedent("""
    import gc, itertools, sys, numpy as np, kiln
    kiln.init(arch=sys.argv[1])
    names = ["src", "k", "n", "a", "b"]
    for order in itertools.permutations(names):
        objs = {}
        objs["src"] = np.arange(12, dtype=np.float64).reshape(3, 4)
        objs["k"] = kiln.from_dlpack(objs["src"])      # numpy -> kiln
        objs["n"] = np.from_dlpack(objs["k"])          # kiln -> numpy (of the imported array)
        objs["a"] = kiln.from_numpy(np.ones(5, dtype=np.int32))
        objs["b"] = np.from_dlpack(objs["a"])          # kiln -> numpy
        cap = objs["a"].__dlpack__()                  # never consumed
        for name in order:
            del objs[name]
            if name == "k":
                del cap
            gc.collect()
    kiln.init(arch=sys.argv[1])
    k = kiln.from_dlpack(np.ones(3))                  # still alive at exit
    n = np.from_dlpack(kiln.from_numpy(np.ones(3)))   # still alive at exit
    print("ok")
""")


@pytest.mark.parametrize("arch", HOST_ARCHS)
def test_deleting_round_trip_objects_in_any_order_does_not_crash(arch):
    proc = subprocess.run([sys.executable, "-c", ORDERS, arch], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=dict(os.environ))
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert proc.stdout.strip() == "ok", report
    assert "Fatal Python error" not in proc.stderr and "Exception ignored" not in proc.stderr, report


# --- GPU arrays on the fake drivers -------------------------------------------------------------

def test_gpu_arrays_name_their_dlpack_device(backend):
    kiln.init(arch=backend.name, device_heap_bytes=1 << 20)
    a = kiln.from_numpy(np.ones(3, dtype=np.float32))
    expected = KDLCUDA if backend.name == "cuda" else KDLROCM
    assert a.__dlpack_device__() == (expected, 0)
    # numpy takes host memory only: a GPU array is refused by numpy, not misread
    with pytest.raises((BufferError, RuntimeError, TypeError)):
        np.from_dlpack(a)


def test_gpu_round_trip_through_dlpack_shares_device_memory(backend):
    kiln.init(arch=backend.name, device_heap_bytes=1 << 20)
    a = kiln.from_numpy(np.arange(4, dtype=np.float32))
    b = kiln.from_dlpack(a)  # kiln asks for the stream of its launches (CUDA 1, ROCm 0)
    assert b.device == a.device
    if backend.name == "cuda":
        assert b.__cuda_array_interface__["data"] == a.__cuda_array_interface__["data"]
    kiln.fill(b, 6)
    np.testing.assert_array_equal(a.to_numpy(), [6, 6, 6, 6])
    with pytest.raises(kiln.InvalidUsageError):
        a.free()
    del b
    if backend.name != "cuda":  # a CUDA array whose interface was read: garbage collection frees it
        a.free()


def test_gpu_exports_accept_any_stream_as_kilns_memory_is_ready_on_every_stream(backend):
    kiln.init(arch=backend.name, device_heap_bytes=1 << 20)
    a = kiln.from_numpy(np.arange(4, dtype=np.float32))
    for stream in (None, -1, 0, 1, 2, 0x7F00DEAD):
        kiln.from_dlpack(a.__dlpack__(stream=stream))
    with pytest.raises(kiln.InvalidTypeError):
        a.__dlpack__(stream=1.5)
    gc.collect()
    a.free()


def test_a_gpu_tensor_is_refused_by_a_cpu_executor(backend):
    kiln.init(arch=backend.name, device_heap_bytes=1 << 20)
    a = kiln.from_numpy(np.arange(4, dtype=np.float32))
    kiln.init(arch="cpu")
    with pytest.raises(kiln.InvalidUsageError, match=r"with kiln.device\(...\)"):
        kiln.from_dlpack(a)
    a.free()  # refused before anything was exported


@pytest.mark.parametrize("shape, strides, words", [
    ((1 << 40, 1 << 40, 1 << 20), (1 << 60, 1 << 20, 1), "overflow|too large|elements"),
    ((-2, 3), (3, 1), "negative"),
])
def test_hostile_shapes_with_strides_are_named_by_the_shape_check(shape, strides, words):
    # With strides given, the stride check multiplies the dimensions: a count that overflows or a
    # negative dimension is left to the shape check, which names it (no overflow, no "strides").
    t = CountingTensor(np.zeros(8, dtype=np.float32), shape, strides=strides)
    with pytest.raises(kiln.InvalidUsageError, match=words):
        kiln.from_dlpack(t.capsule)
    assert t.calls == 0


def test_a_tensor_whose_byte_offset_wraps_the_address_space_is_refused_untouched():
    buffer = np.zeros(4, dtype=np.float32)
    t = CountingTensor(buffer, (4,), byte_offset=(1 << 64) - 8)  # data + offset wraps past 2**64
    with pytest.raises(kiln.InvalidUsageError, match="byte_offset .* beyond the address space"):
        kiln.from_dlpack(t.capsule)
    assert t.calls == 0  # left to its producer


def test_a_tensor_whose_bytes_run_past_the_end_of_the_address_space_is_refused():
    buffer = np.zeros(4, dtype=np.float32)
    # The first element at 2**64 - 16 (aligned), 1000 of them: the last ones would wrap to 0.
    t = CountingTensor(buffer, (1000,), byte_offset=(1 << 64) - 16 - address_of(buffer))
    with pytest.raises(kiln.InvalidUsageError, match="4000 bytes at 0xfffffffffffffff0 run past"):
        kiln.from_dlpack(t.capsule)
    assert t.calls == 0


def test_an_unknown_dlpack_type_code_is_named_apart_from_its_bits():
    t = CountingTensor(np.zeros(4, dtype=np.float32), (4,), code=99, bits=32)
    with pytest.raises(kiln.InvalidUsageError, match="no type code 99 of 32 bits arrays"):
        kiln.from_dlpack(t.capsule)


def test_a_tensor_on_another_cpu_device_names_its_id():
    t = CountingTensor(np.zeros(4, dtype=np.float32), (4,), device=(KDLCPU, 1))
    with pytest.raises(kiln.InvalidUsageError, match="the tensor is on cpu:1 but"):
        kiln.from_dlpack(t.capsule)
