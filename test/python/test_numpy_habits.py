"""What numpy users try first: a kiln dtype compares with numpy's and converts
with numpy.dtype(); numpy dtypes are accepted where kiln takes a dtype; kiln.empty / kiln.zeros in
numpy's argument order; bool(a) as numpy's (one element, or ValueError)."""
import numpy as np
import pytest

import kiln


@pytest.fixture(autouse=True)
def cpu():
    kiln.init(arch="cpu", budget_bytes=64 << 20)


KILN_AND_NUMPY = [(kiln.f32, np.float32), (kiln.f64, np.float64), (kiln.i32, np.int32),
                  (kiln.i64, np.int64)]


@pytest.mark.parametrize("kiln_dtype,numpy_type", KILN_AND_NUMPY)
def test_a_kiln_dtype_equals_numpys_of_the_same_element_type(kiln_dtype, numpy_type):
    assert kiln_dtype == numpy_type
    assert kiln_dtype == np.dtype(numpy_type)
    assert kiln_dtype == np.dtype(numpy_type).name        # "float32"
    assert kiln_dtype == str(kiln_dtype)                  # "f32"
    assert not (kiln_dtype != numpy_type)
    assert np.dtype(kiln_dtype) == np.dtype(numpy_type)   # numpy's .dtype protocol
    assert np.zeros(2, dtype=kiln_dtype).dtype == numpy_type
    others = [t for d, t in KILN_AND_NUMPY if d != kiln_dtype]
    assert all(kiln_dtype != t for t in others)


@pytest.mark.parametrize("other", [0, 1, True, None, "bogus", np.float16, object(), 3.0])
def test_a_dtype_never_equals_what_names_no_dtype_or_an_int(other):
    assert not (kiln.f32 == other)
    assert kiln.f32 != other


@pytest.mark.parametrize("kiln_dtype,numpy_type", KILN_AND_NUMPY)
def test_kiln_dtype_of_a_numpy_dtype(kiln_dtype, numpy_type):
    assert kiln.dtype(numpy_type) == kiln_dtype
    assert kiln.dtype(np.dtype(numpy_type).name) == kiln_dtype


@pytest.mark.parametrize("hostile", ["\ud800", np.floating, np.number, np.generic, np.integer])
def test_what_names_no_concrete_dtype_is_refused_and_never_equal(hostile):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's deprecation of abstract types must not surface
        assert not (kiln.f64 == hostile)
        with pytest.raises(kiln.InvalidUsageError):  # InvalidTypeError is one too
            kiln.empty(2, hostile)


def test_an_endless_shape_sequence_is_refused_not_a_hang():
    import itertools

    class Endless(list):
        def __iter__(self):
            return itertools.repeat(1)

    with pytest.raises(kiln.InvalidUsageError, match="dimensions"):
        kiln.zeros(Endless([1]))


def test_a_dtype_leaves_comparison_with_foreign_objects_to_them():
    from unittest import mock
    assert kiln.f32 == mock.ANY and mock.ANY == kiln.f32
    assert not (kiln.f32 != mock.ANY)
    assert kiln.f32 != object() and not (kiln.f32 == 3.0)


def test_dtype_hash_is_unchanged_so_dicts_keep_working():
    assert {kiln.f32: "a", kiln.i64: "b"}[kiln.f32] == "a"
    assert hash(kiln.f64) == hash(kiln.dtype("f64"))


@pytest.mark.parametrize("numpy_dtype", [np.float32, np.dtype("float64"), "int32", np.int64])
def test_numpy_dtypes_are_accepted_where_kiln_takes_a_dtype(numpy_dtype):
    a = kiln.ndarray(numpy_dtype, (3,))
    assert a.dtype == numpy_dtype
    assert a.to_numpy().dtype == np.dtype(numpy_dtype)


@pytest.mark.parametrize("unsupported", [np.float16, np.uint8, np.bool_, np.dtype(">f4"), "complex64"])
def test_a_numpy_dtype_kiln_has_no_arrays_of_is_InvalidUsageError_naming_it(unsupported):
    before = kiln.memory_stats()["allocations"]
    with pytest.raises(kiln.InvalidUsageError, match="kiln has no"):
        kiln.empty((4,), unsupported)
    assert kiln.memory_stats()["allocations"] == before  # refused before anything was allocated


def test_empty_and_zeros_take_numpys_argument_order():
    e = kiln.empty((2, 3), np.float64)
    assert (e.shape, e.dtype) == ((2, 3), kiln.f64)
    z = kiln.zeros(5, "i32")
    assert z.dtype == kiln.i32
    np.testing.assert_array_equal(z.to_numpy(), np.zeros(5, np.int32))
    assert kiln.zeros((2, 2)).dtype == kiln.f32  # numpy's default would be float64; kiln's is f32
    with pytest.raises(kiln.InvalidUsageError):
        kiln.zeros((-1,))


def test_zeros_really_zeroes_reused_memory():
    a = kiln.empty((1000,), kiln.f32)
    kiln.fill(a, 7.0)
    a.free()  # into the pool: the next array of the size reuses the block
    z = kiln.zeros((1000,), kiln.f32)
    assert not z.to_numpy().any()


def test_zeros_frees_its_array_when_the_fill_fails(monkeypatch):
    def failing_fill(array, value):
        raise kiln.DeviceLostError("injected")

    monkeypatch.setattr(kiln, "fill", failing_fill)
    before = kiln.memory_stats()["frees"]
    with pytest.raises(kiln.DeviceLostError):
        kiln.zeros((10,))
    assert kiln.memory_stats()["frees"] == before + 1


@pytest.mark.parametrize("value,expected", [(0.0, False), (2.5, True), (-1.0, True)])
def test_bool_of_a_one_element_array_is_its_elements(value, expected):
    a = kiln.empty((1,), kiln.f64)
    kiln.fill(a, value)
    assert bool(a) is expected
    b = kiln.empty((1, 1), kiln.i32)
    kiln.fill(b, int(value))
    assert bool(b) is bool(int(value))


@pytest.mark.parametrize("shape", [(0,), (2,), (3, 4)])
def test_bool_of_another_size_is_ambiguous_as_in_numpy(shape):
    a = kiln.empty(shape, kiln.f32)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a)
    with pytest.raises(kiln.InvalidUsageError):
        if a:
            pass
