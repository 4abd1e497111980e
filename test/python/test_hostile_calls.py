"""Hostile and odd input to kiln's calls and settings: kiln.init keywords of
the wrong type or range, OOM observers, the buffer protocol, kiln.testing's hooks, a numpy bool
where an integer is needed, __index__ / __float__ / array-likes that raise (interrupts and
MemoryError passed on, anything else InvalidTypeError with the error as its cause), wrong arity.
Arrays, dtypes, shapes and scalars: test_hostile_input.py."""
import hashlib

import numpy as np
import pytest

import kiln
from conftest import MiB

BAD_TYPE = kiln.InvalidTypeError


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
