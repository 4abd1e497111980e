"""kiln.ndarray: shapes and dtypes, numpy round trips, zero-copy views, free and del."""
import gc

import numpy as np
import pytest

import kiln
from conftest import MiB, allocated_bytes

DTYPES = [(kiln.f32, np.float32), (kiln.f64, np.float64), (kiln.i32, np.int32),
          (kiln.i64, np.int64)]
SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 4), (4, 0, 2)]


@pytest.mark.parametrize("kdt,ndt", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numpy_round_trip_for_every_dtype(kdt, ndt, shape):
    host = (np.arange(int(np.prod(shape)), dtype=np.float64) * 3 - 7).astype(ndt).reshape(shape)
    a = kiln.from_numpy(host)
    assert a.dtype == kdt and a.shape == shape and a.nbytes == host.nbytes and a.size == host.size
    back = a.to_numpy()
    assert back.dtype == ndt and back.shape == shape
    np.testing.assert_array_equal(back, host)


@pytest.mark.parametrize("kdt,ndt", DTYPES, ids=str)
def test_ndarray_reports_shape_dtype_and_nbytes(kdt, ndt):
    a = kiln.ndarray(kdt, (2, 3))
    assert (a.shape, a.dtype, a.nbytes, a.ndim, len(a)) == ((2, 3), kdt, 6 * kdt.itemsize, 2, 2)
    assert kdt.numpy == np.dtype(ndt) and str(kdt) in repr(a)
    assert kiln.ndarray(str(kdt), 4).shape == (4,)


def test_non_contiguous_and_non_native_inputs_are_copied_to_contiguous():
    base = np.arange(48, dtype=np.float64).reshape(6, 8)
    for view in (base[:, ::2], base.T, base[::-1], base[1:5, 2:7]):
        assert not view.flags.c_contiguous
        np.testing.assert_array_equal(kiln.from_numpy(view).to_numpy(), view)
    swapped = np.arange(5, dtype=">i4")
    np.testing.assert_array_equal(kiln.from_numpy(swapped).to_numpy(), np.arange(5))
    assert kiln.from_numpy([1.5, 2.5]).dtype == kiln.f64  # array-likes go through np.asarray


@pytest.mark.parametrize("bad", [np.zeros(3, np.float16), np.zeros(3, np.uint8),
                                 np.zeros(3, bool), np.zeros(3, np.complex64),
                                 np.array([object(), 1]), np.array(["a"])],
                         ids=lambda b: str(b.dtype))
def test_unsupported_numpy_dtypes_are_invalid_usage(bad):
    with pytest.raises(ValueError) as info:
        kiln.from_numpy(bad)
    assert type(info.value) is kiln.InvalidUsageError
    assert "f32, f64, i32, i64" in str(info.value)


@pytest.mark.parametrize("bad", ["text", b"bytes", None, {"a": 1}, [None, 1], object()],
                         ids=lambda b: type(b).__name__)
def test_inputs_that_are_not_numbers_are_invalid_type(bad):
    """What numpy can only read as objects or strings is a wrong type (a TypeError too)."""
    for call in (lambda: kiln.from_numpy(bad), lambda: kiln.axpy(1.0, bad, kiln.ndarray(kiln.f32, 2))):
        with pytest.raises(TypeError) as info:
            call()
        assert type(info.value) is kiln.InvalidTypeError
        assert "a sequence of numbers" in str(info.value)


@pytest.mark.parametrize("shape", [(-1,), (3, -2), -5])
def test_negative_dimensions_are_invalid_usage(shape):
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.ndarray(kiln.f32, shape)
    assert "negative dimension" in str(info.value)


@pytest.mark.parametrize("shape", [(1 << 62, 8), (1 << 64,), (2.5,), ("3",), None])
def test_overflowing_or_non_integer_shapes_are_invalid_usage(shape):
    with pytest.raises(kiln.InvalidUsageError):
        kiln.ndarray(kiln.f64, shape)


@pytest.mark.parametrize("dtype", ["f16", 5, np.float16, None])
def test_unknown_dtypes_are_invalid_usage(dtype):
    with pytest.raises(kiln.InvalidUsageError):
        kiln.ndarray(dtype, (3,))


def test_explicit_free_then_use_is_invalid_usage():
    a = kiln.ndarray(kiln.f32, (1 << 20,))
    before = allocated_bytes()
    a.free()
    assert a.is_freed and allocated_bytes() == before - 4 * MiB
    assert a.shape == (1 << 20,)  # metadata stays readable
    for use in (a.to_numpy, a.free, lambda: kiln.fill(a, 1.0), lambda: kiln.reduce_sum(a),
                lambda: memoryview(a), lambda: np.asarray(a)):
        with pytest.raises(kiln.InvalidUsageError) as info:
            use()
        assert "freed" in str(info.value)


def test_del_frees_the_memory():
    before = allocated_bytes()
    a = kiln.ndarray(kiln.f64, (1 << 20,))
    assert allocated_bytes() == before + 8 * MiB
    del a
    gc.collect()
    assert allocated_bytes() == before


def test_zero_copy_view_shares_memory_and_keeps_the_array_alive():
    a = kiln.from_numpy(np.arange(12, dtype=np.int32).reshape(3, 4))
    v = np.asarray(a)
    assert v.shape == (3, 4) and v.dtype == np.int32 and not v.flags.owndata
    v[1, 2] = 100  # writes go to device memory
    assert a.to_numpy()[1, 2] == 100
    kiln.fill(a, 5)  # kernel writes are seen through the view
    assert (v == 5).all()
    m = memoryview(a)
    assert (m.format, m.shape, m.strides, m.readonly) == ("i", (3, 4), (16, 4), False)
    with pytest.raises(kiln.InvalidUsageError, match="view"):
        a.free()  # a view exists
    del m
    before = allocated_bytes()
    del a
    assert allocated_bytes() == before  # v still holds it
    assert v.sum() == 60
    del v
    gc.collect()
    assert allocated_bytes() < before


def test_zero_size_view():
    assert np.asarray(kiln.ndarray(kiln.f64, (0, 3))).shape == (0, 3)


def test_arrays_of_a_replaced_executor_stay_safe():
    old = kiln.from_numpy(np.arange(4, dtype=np.float32))
    kept = kiln.from_numpy(np.arange(4, dtype=np.float32))
    view = np.asarray(kept)
    kiln.init(arch="mock", mock_capacity_bytes=128 * MiB)
    assert kiln.device() == "mock" and old.device == "cpu"
    with pytest.raises(kiln.InvalidUsageError, match="another executor"):
        kiln.reduce_sum(old)
    np.testing.assert_array_equal(view, np.arange(4))  # its memory is still there
    old.free()
    with pytest.raises(kiln.InvalidUsageError, match="freed"):
        old.free()
    del kept, view
    new = kiln.from_numpy(np.arange(4, dtype=np.float32))
    assert kiln.reduce_sum(new) == 6.0


def test_lazy_default_init_is_cpu():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import kiln; a = kiln.ndarray(kiln.f32, 3); "
                          "print(kiln.device(), a.device)"], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["cpu", "cpu"], out.stderr


def test_an_array_freed_after_its_executor_was_replaced_keeps_its_shape():
    a = kiln.ndarray(kiln.f32, (2, 3))
    kiln.init("cpu")  # a's executor is replaced: free() drops its handle
    a.free()
    assert a.is_freed and a.shape == (2, 3) and a.ndim == 2 and a.dtype == kiln.f32
    assert repr(a) == "kiln.ndarray(f32[2, 3], device='cpu', freed)"
    with pytest.raises(kiln.InvalidUsageError, match=r"f32\[2, 3\] used after it was freed"):
        a.free()
