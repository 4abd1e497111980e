"""Hostile and odd input: every public entry point refuses what it cannot
use with a named kiln error before it touches memory; a wrong *type* is kiln.InvalidTypeError,
which is both a kiln.InvalidUsageError (a ValueError) and a TypeError. Here: ndarrays never
initialized, copy and pickle, dtypes, shapes, scalars, arrays where an ndarray is needed, odd numpy
inputs; kiln.init, observers, kiln.testing and raising objects: test_hostile_calls.py."""
import copy
import copyreg
import gc
import pickle

import numpy as np
import pytest

import kiln

BAD_TYPE = kiln.InvalidTypeError


def test_invalid_type_error_is_invalid_usage_and_type_error():
    assert issubclass(kiln.InvalidTypeError, kiln.InvalidUsageError)
    assert issubclass(kiln.InvalidTypeError, TypeError)
    assert issubclass(kiln.InvalidUsageError, ValueError)
    with pytest.raises(BAD_TYPE) as info:
        kiln.ndarray(kiln.f32, None)
    e = pickle.loads(pickle.dumps(info.value))
    assert type(e) is kiln.InvalidTypeError and e.result == "invalid_usage" and e.site == "ndarray"
    assert str(e) == str(info.value)


# --- no kiln.ndarray without its memory; copy and pickle ---------------------------------------

class _NewWithoutArguments(kiln.ndarray):
    def __new__(cls):
        return super().__new__(cls)


class _NewThroughObject(kiln.ndarray):
    def __new__(cls):
        return object.__new__(cls)


WAYS_TO_AN_EMPTY_INSTANCE = {
    "ndarray.__new__": (lambda: kiln.ndarray.__new__(kiln.ndarray), BAD_TYPE),
    "copyreg.__newobj__": (lambda: copyreg.__newobj__(kiln.ndarray), BAD_TYPE),
    "subclass __new__": (_NewWithoutArguments, BAD_TYPE),
    "object.__new__": (lambda: object.__new__(kiln.ndarray), TypeError),
    "subclass object.__new__": (_NewThroughObject, TypeError),
    # Protocol 2's NEWOBJ of kiln._kiln.ndarray with no arguments, written by hand.
    "a forged pickle": (lambda: pickle.loads(b"\x80\x02ckiln._kiln\nndarray\n)\x81."), BAD_TYPE),
}


@pytest.mark.parametrize("make, error", list(WAYS_TO_AN_EMPTY_INSTANCE.values()),
                         ids=list(WAYS_TO_AN_EMPTY_INSTANCE))
def test_no_way_makes_a_kiln_ndarray_without_its_memory(make, error):
    """kiln.ndarray's __new__ makes the whole array or refuses (the wrong arguments: kiln's
    InvalidTypeError); object.__new__ refuses the class (CPython's TypeError). Nothing is left
    behind, and arrays are made as before."""
    gc.collect()  # earlier tests' garbage is not this test's to count
    live = kiln._kiln._live_array_bytes()
    with pytest.raises(error):
        make()
    gc.collect()
    assert kiln._kiln._live_array_bytes() == live
    assert kiln.ndarray(kiln.f32, (2,)).shape == (2,)


def test_copy_copy_and_deepcopy_make_an_independent_array_with_the_same_contents():
    a = kiln.from_numpy(np.arange(6, dtype=np.int64).reshape(2, 3))
    for b in (copy.copy(a), copy.deepcopy(a), copy.deepcopy([a])[0]):
        assert type(b) is kiln.ndarray and b.shape == (2, 3) and b.dtype == kiln.i64
        np.testing.assert_array_equal(b.to_numpy(), a.to_numpy())
        kiln.fill(b, 7)
        np.testing.assert_array_equal(a.to_numpy(), np.arange(6).reshape(2, 3))
    repr(a)  # the issue: repr after a copy attempt ended in a segfault


def test_pickle_round_trips_an_ndarray_through_numpy():
    a = kiln.from_numpy(np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4))
    b = pickle.loads(pickle.dumps(a))
    assert type(b) is kiln.ndarray and b.dtype == kiln.f32
    np.testing.assert_array_equal(b.to_numpy(), a.to_numpy())
    a.free()
    with pytest.raises(kiln.InvalidUsageError):
        pickle.dumps(a)


# --- dtypes and shapes ------------------------------------------------------------------------

@pytest.mark.parametrize("value", [4, 255, -1, 1 << 70])
def test_a_dtype_from_an_int_that_names_no_dtype_is_refused(value):
    with pytest.raises(kiln.InvalidUsageError):
        kiln.dtype(value)


@pytest.mark.parametrize("value", [1.5, None, float, np.floating, b"f32", True])
def test_a_dtype_from_another_type_is_a_type_error(value):
    with pytest.raises(BAD_TYPE):
        kiln.dtype(value)


def test_dtype_accepts_its_members_names_and_values_and_pickles():
    assert kiln.dtype(0) == kiln.f32 and kiln.dtype(np.int8(3)) == kiln.i64
    assert kiln.dtype("f64") == kiln.f64 and kiln.dtype(kiln.i32) == kiln.i32
    assert pickle.loads(pickle.dumps(kiln.i32)) == kiln.i32
    with pytest.raises(kiln.InvalidUsageError):
        kiln.dtype("f16")


@pytest.mark.parametrize("shape", [b"\x02\x03", bytearray(b"\x02"), "23", None, 2.0, (2.0, 3),
                                   (True, 2), True, [[2, 3]], {2: 3}, kiln.f64,
                                   np.array([2.0, 3.0]), np.array([[2, 3]]), np.float64(3),
                                   (np.array([2]),), (x for x in (2, 3))],
                         ids=lambda s: type(s).__name__ + ":" + repr(s)[:20])
def test_a_shape_of_the_wrong_type_is_a_type_error(shape):
    with pytest.raises(BAD_TYPE) as info:
        kiln.ndarray(kiln.f32, shape)
    assert "shape must be an int or a sequence of ints" in str(info.value)


@pytest.mark.parametrize("shape,expected", [(np.array([2, 3]), (2, 3)), (np.int64(4), (4,)),
                                            (np.array(5), (5,)), ([np.uint8(2)], (2,)),
                                            (range(1, 3), None), ((), ())])
def test_numpy_integers_and_integer_arrays_are_shapes(shape, expected):
    if expected is None:  # a range is not a list or tuple: numpy takes it, kiln says so
        with pytest.raises(BAD_TYPE):
            kiln.ndarray(kiln.f32, shape)
        return
    assert kiln.ndarray(kiln.f32, shape).shape == expected


def test_32_dimensions_work_and_33_are_refused():
    a = kiln.ndarray(kiln.i32, (1,) * 32)
    assert a.to_numpy().shape == (1,) * 32 and np.asarray(a).ndim == 32
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.ndarray(kiln.i32, (1,) * 33)
    assert "at most 32" in str(info.value)


@pytest.mark.parametrize("shape", [(0, 1 << 62), (1 << 62, 0), (0, 1 << 40, 1 << 40),
                                   (1 << 61, 0, 4)])
def test_a_zero_size_shape_numpy_cannot_hold_is_refused(shape):
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.ndarray(kiln.f32, shape)
    assert "non-zero dimensions" in str(info.value)


def test_the_largest_zero_size_shapes_round_trip_to_numpy():
    a = kiln.ndarray(kiln.f32, (0, 1 << 60))  # 2**62 bytes of non-zero dimensions: numpy's too
    assert a.to_numpy().shape == (0, 1 << 60) and np.asarray(a).shape == (0, 1 << 60)
    assert a.nbytes == 0 and kiln.reduce_sum(a) == 0.0


# --- scalars ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [np.ones(3), np.array([1.0]), 1 + 2j, np.complex64(1), "1",
                                   None, True, np.bool_(True), [1.0], object()],
                         ids=lambda v: type(v).__name__)
def test_a_fill_value_of_the_wrong_type_is_a_type_error(value):
    a = kiln.ndarray(kiln.f32, (3,))
    with pytest.raises(BAD_TYPE):
        kiln.fill(a, value)
    with pytest.raises(BAD_TYPE):
        kiln.axpy(value, a, a)


@pytest.mark.parametrize("value", [1.5, np.float64(2.0), "3", np.array(2.0), 1j],
                         ids=lambda v: type(v).__name__)
def test_an_integer_array_needs_an_integer_scalar(value):
    with pytest.raises(BAD_TYPE):
        kiln.fill(kiln.ndarray(kiln.i32, (3,)), value)


@pytest.mark.parametrize("dtype,value", [(kiln.i32, 1 << 31), (kiln.i32, -(1 << 31) - 1),
                                         (kiln.i64, 1 << 63), (kiln.f64, 1 << 2000),
                                         (kiln.f32, -(1 << 2000))])
def test_a_scalar_out_of_range_is_invalid_usage(dtype, value):
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.fill(kiln.ndarray(dtype, (3,)), value)
    assert not isinstance(info.value, TypeError)


def test_numpy_scalars_0d_arrays_and_nan_are_good_scalars():
    f = kiln.ndarray(kiln.f64, (3,))
    for value, expected in ((np.float32(2.5), 2.5), (np.array(1.5), 1.5), (np.int16(-3), -3.0)):
        kiln.fill(f, value)
        np.testing.assert_array_equal(f.to_numpy(), np.full(3, expected))
    kiln.fill(f, float("nan"))
    assert np.isnan(f.to_numpy()).all()
    i = kiln.ndarray(kiln.i64, (3,))
    kiln.fill(i, np.array(7, np.int32))
    kiln.axpy(np.uint8(2), kiln.from_numpy(np.ones(3, np.int64)), i)
    assert i.to_numpy().tolist() == [9, 9, 9]


# --- arrays where a kiln.ndarray is needed ----------------------------------------------------

ARRAY_ARGUMENTS = {
    "fill out": lambda a, n: kiln.fill(n, 1.0),
    "copy dst": lambda a, n: kiln.copy(n, a),
    "copy src": lambda a, n: kiln.copy(a, n),
    "axpy y": lambda a, n: kiln.axpy(1.0, a, n),
    "reduce_sum x": lambda a, n: kiln.reduce_sum(n),
    "matmul a": lambda a, n: kiln.matmul(n, a),
    "matmul b": lambda a, n: kiln.matmul(a, n),
    "matmul out": lambda a, n: kiln.matmul(a, a, out=n),
    "compact_positive x": lambda a, n: kiln.compact_positive(n),
    "ndarray.free": lambda a, n: kiln.ndarray.free(n),
    "ndarray.to_numpy": lambda a, n: kiln.ndarray.to_numpy(n),
}


@pytest.mark.parametrize("use", list(ARRAY_ARGUMENTS.values()), ids=list(ARRAY_ARGUMENTS))
@pytest.mark.parametrize("not_an_array", [np.ones((2, 2), np.float32), [[1.0, 2.0]], None, 3.0],
                         ids=lambda v: type(v).__name__)
def test_a_numpy_array_or_other_object_where_an_ndarray_is_needed_is_a_type_error(use, not_an_array):
    a = kiln.from_numpy(np.ones((2, 2), np.float32))
    if not_an_array is None and use is ARRAY_ARGUMENTS["matmul out"]:
        not_an_array = "out"  # out=None asks for a new array
    with pytest.raises(BAD_TYPE) as info:
        use(a, not_an_array)
    assert "must be a kiln.ndarray" in str(info.value)
    np.testing.assert_array_equal(a.to_numpy(), np.ones((2, 2)))


def test_matmul_into_an_out_of_the_wrong_shape_dtype_or_aliasing_an_input_is_refused():
    a = kiln.from_numpy(np.ones((2, 2), np.float32))
    b = kiln.from_numpy(np.ones((2, 2), np.float32))
    for out in (kiln.ndarray(kiln.f32, (2, 3)), kiln.ndarray(kiln.f64, (2, 2)),
                kiln.ndarray(kiln.f32, (4,)), a, b):
        with pytest.raises(kiln.InvalidUsageError):
            kiln.matmul(a, b, out=out)
    np.testing.assert_array_equal(a.to_numpy(), np.ones((2, 2)))


# --- from_numpy with odd numpy objects --------------------------------------------------------

@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.asmatrix
def test_odd_but_usable_numpy_inputs_are_taken(tmp_path):
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    read_only = base.copy()
    read_only.flags.writeable = False
    memmap = np.memmap(tmp_path / "m.bin", dtype=np.int32, mode="w+", shape=(5,))
    memmap[:] = np.arange(5)

    class Sub(np.ndarray):
        pass

    for host in (np.array(3.5), base[:, ::2], base.T, read_only, base.astype(">f8"), memmap,
                 base.view(Sub), np.asmatrix(base), np.float32(2.0)):
        np.testing.assert_array_equal(kiln.from_numpy(host).to_numpy(), np.asarray(host))


@pytest.mark.parametrize("host", [np.zeros(3, "i4,f4"), np.zeros(3, np.float16), np.zeros(3, bool),
                                  np.array([None, 1]), np.zeros(3, np.uint64), np.zeros(3, "M8[s]"),
                                  None, "text", {1: 2}],
                         ids=lambda h: type(h).__name__ + str(getattr(h, "dtype", "")))
def test_numpy_inputs_of_no_kiln_dtype_are_invalid_usage(host):
    with pytest.raises(kiln.InvalidUsageError):
        kiln.from_numpy(host)


def test_a_masked_array_is_refused_rather_than_its_mask_ignored():
    masked = np.ma.masked_array(np.arange(4.0), mask=[0, 1, 0, 0])
    with pytest.raises(BAD_TYPE) as info:
        kiln.from_numpy(masked)
    assert "mask" in str(info.value)


PICKLE_EVERY_PROTOCOL = r"""
import pickle, kiln
for proto in range(pickle.HIGHEST_PROTOCOL + 1):
    for d in (kiln.f32, kiln.f64, kiln.i32, kiln.i64):
        assert pickle.loads(pickle.dumps(d, proto)) is d, (proto, d)
kernel = kiln.ElementwiseKernel("T x", "T y", "y = x", "ident")
kernel(kiln.zeros((2,)))
compiled = next(iter(kiln._kernels._cache.values()))
for proto in range(pickle.HIGHEST_PROTOCOL + 1):
    try:
        pickle.dumps(compiled, proto)
    except kiln.InvalidTypeError:
        continue
    raise AssertionError(f"a compiled kernel pickled at protocol {proto}")
print("ok")
"""


def test_dtypes_pickle_at_every_protocol_and_compiled_kernels_refuse_to():
    """Protocols 0 and 1 used to end the process (copyreg's reconstructor made a pybind11 base
    object): a dtype comes back as itself, a compiled kernel is InvalidTypeError. In a
    subprocess, so that a regression fails this test rather than the run."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", PICKLE_EVERY_PROTOCOL], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_compiled_kernel_is_made_by_the_kernel_classes_only():
    with pytest.raises(kiln.InvalidTypeError, match="cannot be made"):
        kiln._kiln._UserKernel()
    with pytest.raises(TypeError):  # pybind11's own refusal of its base's __new__: no instance
        kiln._kiln._UserKernel.__new__(kiln._kiln._UserKernel)
