"""Hostile and odd input (issue 11, section 5): every public entry point refuses what it cannot
use with a named kiln error before it touches memory; a wrong *type* is kiln.InvalidTypeError,
which is both a kiln.InvalidUsageError (a ValueError) and a TypeError."""
import copy
import gc
import hashlib
import pickle

import numpy as np
import pytest

import kiln
from conftest import MiB

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


# --- kiln.ndarray objects that were never initialized, copy and pickle -------------------------

UNINITIALIZED_USES = {
    "shape": lambda u: u.shape, "dtype": lambda u: u.dtype, "nbytes": lambda u: u.nbytes,
    "size": lambda u: u.size, "ndim": lambda u: u.ndim, "device": lambda u: u.device,
    "is_freed": lambda u: u.is_freed, "len": len, "to_numpy": lambda u: u.to_numpy(),
    "free": lambda u: u.free(), "memoryview": memoryview, "np.asarray": np.asarray,
    "__array_interface__": lambda u: u.__array_interface__, "copy.copy": copy.copy,
    "pickle": pickle.dumps, "fill": lambda u: kiln.fill(u, 1.0),
    "copy dst": lambda u: kiln.copy(u, kiln.ndarray(kiln.f32, (2,))),
    "reduce_sum": kiln.reduce_sum, "matmul": lambda u: kiln.matmul(u, u),
    "axpy y": lambda u: kiln.axpy(1.0, np.ones(2, np.float32), u),
    "compact_positive": kiln.compact_positive,
}


@pytest.mark.parametrize("use", list(UNINITIALIZED_USES.values()), ids=list(UNINITIALIZED_USES))
def test_an_uninitialized_ndarray_is_refused_by_every_use(use):
    u = kiln.ndarray.__new__(kiln.ndarray)
    with pytest.raises(kiln.InvalidUsageError) as info:
        use(u)
    assert "uninitialized" in str(info.value) or isinstance(info.value, BAD_TYPE)
    assert repr(u) == "kiln.ndarray(uninitialized)"
    del u
    gc.collect()


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


# --- kiln.init keywords -----------------------------------------------------------------------

NUMERIC_KEYWORDS = ["budget_bytes", "reserve_bytes", "device_heap_bytes", "mock_capacity_bytes",
                    "mock_other_process_bytes", "num_threads", "fault_at", "fail_sizes_at_least"]


@pytest.mark.parametrize("keyword", NUMERIC_KEYWORDS)
@pytest.mark.parametrize("value", [1.5, "1", True, b"1", np.float64(1), 1j, np.array([1, 2])],
                         ids=lambda v: type(v).__name__)
def test_an_init_size_of_the_wrong_type_is_a_type_error(keyword, value):
    if keyword == "mock_other_process_bytes" and isinstance(value, np.ndarray):
        value = np.array([1.5, 2.5])  # a list or 1-D array of ints is allowed there
    with pytest.raises(BAD_TYPE):
        kiln.init(arch="mock", **{keyword: value})
    assert kiln.device() == "cpu"  # the executor before the refused init is still current


@pytest.mark.parametrize("keyword", NUMERIC_KEYWORDS)
@pytest.mark.parametrize("value", [-1, 1 << 63, 1 << 64, 1 << 200], ids=str)
def test_an_init_size_out_of_range_is_invalid_usage(keyword, value):
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.init(arch="mock", **{keyword: value})
    assert not isinstance(info.value, TypeError)


@pytest.mark.parametrize("arch", [None, 5, b"cpu", kiln.f32, ["cpu"]], ids=repr)
def test_init_arch_of_the_wrong_type_is_a_type_error(arch):
    with pytest.raises(BAD_TYPE):
        kiln.init(arch=arch)


@pytest.mark.parametrize("keyword", ["live_check", "caching"])
@pytest.mark.parametrize("value", [None, 0, 1, "yes", 1.0], ids=repr)
def test_init_flags_take_only_bools(keyword, value):
    with pytest.raises(BAD_TYPE):
        kiln.init(arch="cpu", **{keyword: value})


def test_init_takes_numpy_integers_and_bools():
    kiln.init(arch="mock", budget_bytes=np.int64(64 * MiB), caching=np.bool_(False),
              live_check=True, num_threads=np.uint8(2), mock_other_process_bytes=[np.int32(0), 1])
    assert kiln.memory_stats()["limit_bytes"] == 64 * MiB
    kiln.init(arch="mock", mock_other_process_bytes=np.array([0, MiB], np.int64))
    with pytest.raises(BAD_TYPE):
        kiln.init(arch="mock", mock_other_process_bytes=(x for x in (0, 1)))


# --- OOM observers ----------------------------------------------------------------------------

@pytest.mark.parametrize("callback", [5, None, "print", [print]], ids=repr)
def test_an_observer_that_is_not_callable_is_a_type_error(callback):
    with pytest.raises(BAD_TYPE):
        kiln.add_oom_observer(callback)


def test_remove_oom_observer_refuses_bad_ids_and_reports_unknown_ones():
    for bad in ("1", 1.0, None, True):
        with pytest.raises(BAD_TYPE):
            kiln.remove_oom_observer(bad)
    for bad in (-1, 1 << 64, 1 << 70):
        with pytest.raises(kiln.InvalidUsageError):
            kiln.remove_oom_observer(bad)
    assert kiln.remove_oom_observer(123456) is False
    oid = kiln.add_oom_observer(lambda e: None)
    assert kiln.remove_oom_observer(np.uint64(oid)) is True


# --- the buffer protocol ----------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (), (0, 5)], ids=str)
def test_plain_byte_consumers_of_an_ndarray_get_its_bytes(shape):
    host = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    a = kiln.from_numpy(host)
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(host).hexdigest()
    assert bytes(a) == host.tobytes()
    view = memoryview(a)
    assert view.shape == shape and view.format == "i" and view.c_contiguous
    del view
    a.free()


# --- kiln.testing -----------------------------------------------------------------------------

def test_nested_fail_allocation_blocks_restore_the_outer_plan():
    with kiln.testing.fail_allocation(at=3):
        kiln.ndarray(kiln.f32, (4,))                           # outer request 1
        with kiln.testing.fail_allocation(at=1):
            with pytest.raises(kiln.DeviceOutOfMemoryError):
                kiln.ndarray(kiln.f32, (4,))                   # inner 1, outer 2: fails
            assert kiln.testing.allocation_count() == 1
        assert kiln.testing.allocation_count() == 2
        with pytest.raises(kiln.DeviceOutOfMemoryError):      # outer 3: the outer plan is back
            kiln.ndarray(kiln.f32, (4,))
        kiln.ndarray(kiln.f32, (4,))                           # outer 4: nothing armed for it
    kiln.ndarray(kiln.f32, (4,))                               # outside every block


def test_an_inner_block_exited_by_an_exception_still_restores_the_outer_plan():
    with kiln.testing.fail_allocation(at=2):
        with pytest.raises(RuntimeError):
            with kiln.testing.fail_allocation(at=5):
                raise RuntimeError("inside the inner block")
        kiln.ndarray(kiln.f32, (4,))                           # outer 1
        with pytest.raises(kiln.DeviceOutOfMemoryError):
            kiln.ndarray(kiln.f32, (4,))                       # outer 2


@pytest.mark.parametrize("at", [np.int64(2), np.uint8(2), 2])
def test_fail_allocation_takes_numpy_integers(at):
    with kiln.testing.fail_allocation(at=at):
        kiln.ndarray(kiln.f32, (4,))
        with pytest.raises(kiln.DeviceOutOfMemoryError):
            kiln.ndarray(kiln.f32, (4,))


@pytest.mark.parametrize("at,error", [(True, BAD_TYPE), (1.0, BAD_TYPE), ("1", BAD_TYPE),
                                      (None, BAD_TYPE), (0, kiln.InvalidUsageError),
                                      (-1, kiln.InvalidUsageError), (1 << 70, kiln.InvalidUsageError)],
                         ids=repr)
def test_fail_allocation_refuses_what_is_not_a_positive_int_and_arms_nothing(at, error):
    with pytest.raises(error):
        with kiln.testing.fail_allocation(at=at):
            pass
    kiln.ndarray(kiln.f32, (4,))  # nothing armed


@pytest.mark.parametrize("result,source", [("nope", "none"), ("out_of_memory", "nope")])
def test_make_error_refuses_unknown_names(result, source):
    with pytest.raises(kiln.InvalidUsageError):
        kiln.testing.make_error(result, source)


@pytest.mark.parametrize("kwargs,error", [({"result": 5}, BAD_TYPE),
                                          ({"oom_source": None}, BAD_TYPE),
                                          ({"requested_bytes": "1"}, BAD_TYPE),
                                          ({"requested_bytes": -1}, kiln.InvalidUsageError),
                                          ({"device": b"cpu"}, BAD_TYPE),
                                          ({"detail": 1.0}, BAD_TYPE)], ids=repr)
def test_make_error_refuses_arguments_of_the_wrong_type_or_range(kwargs, error):
    args = {"result": "out_of_memory", "oom_source": "driver", **kwargs}
    with pytest.raises(error):
        kiln.testing.make_error(**args)
    e = kiln.testing.make_error("out_of_memory", "driver", requested_bytes=np.int64(64))
    assert type(e) is kiln.DeviceOutOfMemoryError and e.requested_bytes == 64


@pytest.mark.parametrize("use", [lambda v: kiln.ndarray(kiln.f32, (v,)),
                                 lambda v: kiln.init(budget_bytes=v),
                                 lambda v: kiln.testing.fail_allocation(at=v).__enter__(),
                                 lambda v: kiln.fill(kiln.ndarray(kiln.i32, (2,)), v)],
                         ids=["shape", "budget_bytes", "fail_allocation", "fill"])
def test_a_numpy_bool_is_not_an_integer(use):
    with pytest.raises(BAD_TYPE):
        use(np.True_)


class _RaisingIndex:
    def __index__(self):
        raise ValueError("no index today")


@pytest.mark.parametrize("call", [
    lambda: kiln.ndarray(kiln.f32, (_RaisingIndex(),)),
    lambda: kiln.ndarray(kiln.f32, _RaisingIndex()),
    lambda: kiln.init("cpu", budget_bytes=_RaisingIndex()),
    lambda: kiln.fill(kiln.ndarray(kiln.i32, 2), _RaisingIndex()),
], ids=["shape-dim", "shape", "budget", "fill-i32"])
def test_an_index_that_raises_is_InvalidTypeError_with_the_error_as_cause(call):
    with pytest.raises(kiln.InvalidTypeError) as info:
        call()
    assert "__index__() raised ValueError" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


class _RaisingFloat:
    def __float__(self):
        raise ValueError("no float today")


@pytest.mark.parametrize("call", [
    lambda: kiln.fill(kiln.ndarray(kiln.f32, 2), _RaisingFloat()),
    lambda: kiln.fill(kiln.ndarray(kiln.f64, 2), _RaisingFloat()),
    lambda: kiln.fill(kiln.ndarray(kiln.f32, 2), _RaisingIndex()),
    lambda: kiln.axpy(_RaisingFloat(), kiln.ndarray(kiln.f32, 2), kiln.ndarray(kiln.f32, 2)),
], ids=["fill-f32", "fill-f64", "fill-f32-index", "axpy-alpha"])
def test_a_float_that_raises_is_InvalidTypeError_with_the_error_as_cause(call):
    """A scalar for a floating dtype whose __float__ (or __index__) raises: InvalidTypeError, the
    original error kept as __cause__ (as for __index__ in integer arguments)."""
    kiln.init("cpu", num_threads=2)
    with pytest.raises(kiln.InvalidTypeError) as info:
        call()
    assert "needs a real number" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, MemoryError])
@pytest.mark.parametrize("method", ["__float__", "__index__"])
def test_a_float_that_raises_an_interrupt_or_MemoryError_passes_it_on(method, error):
    """fill of a floating array reads its value with __float__ (or __index__): Ctrl-C, exit and
    host out-of-memory raised there are not usage mistakes and reach the caller unchanged."""
    def raise_error(self):
        raise error()
    raising = type("Raising", (), {method: raise_error})()
    kiln.init("cpu", num_threads=2)
    a = kiln.ndarray(kiln.f32, 2)
    with pytest.raises(error) as info:
        kiln.fill(a, raising)
    assert not isinstance(info.value, kiln.Error)


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("call", [
    lambda x: kiln.from_numpy(x),
    lambda x: kiln.axpy(1.0, x, kiln.ndarray(kiln.f32, 2)),
], ids=["from_numpy", "axpy"])
def test_an_array_like_that_raises_an_interrupt_passes_it_on(call, error):
    """np.asarray of a host input runs user code (__array__): Ctrl-C and exit raised there reach
    the caller, not as InvalidUsageError."""
    class Raising:
        def __array__(self, dtype=None, copy=None):
            raise error()
    kiln.init("cpu", num_threads=2)
    with pytest.raises(error) as info:
        call(Raising())
    assert not isinstance(info.value, kiln.Error)


@pytest.mark.parametrize("call", [
    lambda a: kiln.ndarray(kiln.f32),
    lambda a: kiln.ndarray(kiln.f32, 3, 4),
    lambda a: kiln.ndarray(dtype=kiln.f32, shape=3, order="C"),
    lambda a: kiln.reduce_sum(),
    lambda a: kiln.reduce_sum(a, a),
    lambda a: kiln.fill(a, 1.0, bogus=3),
    lambda a: kiln.axpy(1.0, a),
    lambda a: kiln.matmul(a),
    lambda a: kiln.copy(a),
    lambda a: kiln.init("cpu", 5),
    lambda a: kiln.memory_stats(1),
    lambda a: kiln.add_oom_observer(),
    lambda a: a.free(1),
    lambda a: a.to_numpy(copy=True),
    lambda a: kiln.dtype(),
    lambda a: kiln.dtype(1, 2),
    lambda a: kiln.dtype(value=1, bogus=2),
], ids=lambda f: None)
def test_wrong_arity_or_an_unknown_keyword_is_InvalidTypeError(call):
    """pybind11's "incompatible function arguments" TypeError becomes kiln.InvalidTypeError."""
    kiln.init("cpu", num_threads=2)
    a = kiln.ndarray(kiln.f32, (4,))
    with pytest.raises(kiln.InvalidTypeError) as info:
        call(a)
    assert "does not take the arguments" in str(info.value)
    kiln.fill(a, 2.0)  # nothing was lost
    assert kiln.reduce_sum(a) == 8.0


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_observer_that_raises_KeyboardInterrupt_or_SystemExit_reaches_the_caller(interrupt):
    """Ctrl-C (or sys.exit) inside an OOM observer is not swallowed as an unraisable error: the
    call that ran the observer raises it, and kiln stays usable."""
    kiln.init("cpu", num_threads=2, budget_bytes=64 << 20)
    seen = []

    def observer(e):
        seen.append(e)
        raise interrupt()

    kiln.add_oom_observer(observer)
    with pytest.raises(interrupt):
        kiln.ndarray(kiln.f32, (1 << 30,))
    assert len(seen) == 1 and isinstance(seen[0], kiln.BudgetExceededError)
    a = kiln.ndarray(kiln.f32, (4,))  # nothing is left pending on this thread
    kiln.fill(a, 1.0)
    assert kiln.reduce_sum(a) == 4.0
    kiln.init("cpu", num_threads=2)  # the observer goes with its executor



@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, MemoryError])
def test_an_index_that_raises_an_interrupt_or_MemoryError_passes_it_on(error):
    """Only ordinary errors become InvalidTypeError: Ctrl-C, exit and host out-of-memory are not
    usage mistakes."""
    class Raising:
        def __index__(self):
            raise error()
    kiln.init("cpu", num_threads=2)
    with pytest.raises(error) as info:
        kiln.ndarray(kiln.f32, (Raising(),))
    assert not isinstance(info.value, kiln.Error)
