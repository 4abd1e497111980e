"""What user objects hand back through Python's protocols (__dlpack_device__, __dlpack__,
__index__, str and list subclasses, numpy's dtype parser) and calls of the wrong shape reach the
user as kiln.InvalidTypeError or kiln.InvalidUsageError naming what was wrong, never pybind11's
RuntimeError, an IndexError, a SyntaxError, a hang or a crash; a user's own exception from its
own method goes on as it is."""
import numpy as np
import pytest

import kiln
import kiln.testing
from kiln import InvalidTypeError, InvalidUsageError


class Producer:
    """A DLPack producer over a numpy array whose __dlpack_device__ returns `device`."""

    def __init__(self, device):
        self.array = np.zeros(4, dtype=np.float32)
        self.device = device

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.device


class PickyTuple(tuple):
    def __getitem__(self, i):  # from_dlpack reads the tuple itself, not this
        raise ZeroDivisionError("read through __getitem__")


@pytest.mark.parametrize("device", ["cpu", [1, 0], (1,), (1, 0, 0), (True, 0), (1, False),
                                    (1.0, 0), (b"1", 0), None])
def test_a_dlpack_device_of_the_wrong_shape_or_type_is_invalid_type(device):
    with pytest.raises(InvalidTypeError, match=r"Producer.__dlpack_device__\(\) returned "
                                               r"is .*, not a \(device_type, device_id\) tuple"):
        kiln.from_dlpack(Producer(device))


@pytest.mark.parametrize("device", [(1, 1 << 31), (1 << 40, 0), (-(1 << 31) - 1, 0)])
def test_a_dlpack_device_beyond_int32_is_invalid_usage(device):
    with pytest.raises(InvalidUsageError, match="must fit in 32 bits") as caught:
        kiln.from_dlpack(Producer(device))
    assert not isinstance(caught.value, TypeError)


def test_a_dlpack_device_read_from_the_tuple_not_its_getitem():
    k = kiln.from_dlpack(Producer(PickyTuple((1, 0))))
    assert k.shape == (4,)
    k2 = kiln.from_dlpack(Producer((np.int32(1), np.int64(0))))  # numpy integers are ints
    assert k2.shape == (4,)


def test_a_non_callable_protocol_attribute_is_invalid_type():
    p = Producer((1, 0))
    p.__dlpack_device__ = 7
    with pytest.raises(InvalidTypeError, match=r"__dlpack_device__ is int 7, not a method"):
        kiln.from_dlpack(p)
    p = Producer((1, 0))
    p.__dlpack__ = "capsule"
    with pytest.raises(InvalidTypeError, match=r"__dlpack__ is str 'capsule', not a method"):
        kiln.from_dlpack(p)


def test_a_producers_own_exception_goes_on_as_it_is():
    class Raising(Producer):
        def __dlpack_device__(self):
            raise ZeroDivisionError("the producer's own")

    with pytest.raises(ZeroDivisionError, match="the producer's own"):
        kiln.from_dlpack(Raising((1, 0)))


@pytest.mark.parametrize("dl_device, error", [
    ((1, 1 << 40), InvalidUsageError), (("cpu", 0), InvalidTypeError), ([1, 0], InvalidTypeError),
    ((1, 0, 0), InvalidTypeError), ((True, 0), InvalidTypeError)])
def test_a_requested_dl_device_is_checked_as_a_pair_of_int32(dl_device, error):
    a = kiln.ndarray(kiln.f32, 4)
    with pytest.raises(error, match="dl_device"):
        a.__dlpack__(dl_device=dl_device)
    assert a.__dlpack__(dl_device=(1, 0)) is not None  # its own device: still exported


def test_text_with_a_lone_surrogate_is_invalid_usage_not_a_unicode_error():
    with pytest.raises(InvalidUsageError, match="lone surrogate") as caught:
        kiln.init(arch="cpu\ud800")
    assert not isinstance(caught.value, TypeError)
    with pytest.raises(InvalidUsageError, match="names no dtype"):
        kiln.ndarray("f\ud800", 4)
    with pytest.raises(InvalidUsageError, match="lone surrogate"):
        kiln.testing.make_error("invalid_usage", detail="\udc80")
    assert kiln.device() == "cpu"  # nothing was replaced


@pytest.mark.parametrize("name", ["f4,,", "(", "i4,(2", "f4 f4", "[('a', 'f4')"])
def test_a_name_numpys_parser_chokes_on_is_no_dtype_and_compares_unequal(name):
    with pytest.raises(InvalidUsageError):
        kiln.ndarray(name, 4)
    assert (kiln.f32 == name) is False
    assert (kiln.f32 != name) is True


def test_an_endless_mock_script_is_refused_not_a_hang():
    class Endless(list):
        def __iter__(self):
            while True:
                yield 0

    with pytest.raises(InvalidUsageError, match="more than 1048576 entries"):
        kiln.init(arch="mock", mock_other_process_bytes=Endless())
    assert kiln.device() == "cpu"


@pytest.mark.parametrize("call", [
    lambda a: kiln.ndarray.__len__(), lambda a: a.__len__(1), lambda a: a.__repr__(1),
    lambda a: a.__bool__(None), lambda a: a.__copy__(1), lambda a: a.__deepcopy__(),
    lambda a: a.__reduce__(1), lambda a: kiln.ndarray.__copy__(),
    lambda a: kiln.f32.__eq__(), lambda a: kiln.f32.__ne__(1, 2), lambda a: kiln.dtype.__int__(),
    lambda a: kiln.f32.__hash__(1), lambda a: kiln.f32.__index__(1), lambda a: kiln.f32.__str__(1),
    lambda a: kiln._kiln._push_fault(), lambda a: kiln._kiln._pop_fault(1, 2),
    lambda a: kiln._kiln._device_key(), lambda a: kiln._kiln._executor_generation(1),
    lambda a: kiln._kiln._make_error(), lambda a: kiln._kiln._throw_cpp_exception(kind=1, x=2),
])
def test_a_native_method_called_with_the_wrong_arguments_is_invalid_type(call):
    a = kiln.ndarray(kiln.f32, 4)
    with pytest.raises(InvalidTypeError):
        call(a)
    assert len(a) == 4 and kiln.f32 == "f32" and int(kiln.f64) == 1  # still work


@pytest.mark.parametrize("call", [
    lambda: kiln.empty(), lambda: kiln.zeros(4, kiln.f32, 1), lambda: kiln.empty(4, nosuch=1),
    lambda: kiln.testing.sweep(), lambda: kiln.testing.min_budget(),
    lambda: kiln.testing.fail_allocation(1, 2), lambda: kiln.testing.inject(),
    lambda: kiln.testing.allocation_count(1), lambda: kiln.testing.make_error(),
    lambda: kiln.testing.fake_cuda(1, 2), lambda: kiln.testing.fake_hip(nosuch=1),
])
def test_a_python_entry_point_called_with_the_wrong_arguments_is_invalid_type(call):
    with pytest.raises(InvalidTypeError, match="does not take these arguments"):
        call()


def test_a_type_error_inside_a_python_entry_point_is_not_renamed():
    # The arguments bind; kiln.ndarray inside raises its own InvalidTypeError (a TypeError),
    # which goes on as it is: not renamed "does not take these arguments".
    with pytest.raises(InvalidTypeError, match="shape must be an int") as caught:
        kiln.empty(object())
    assert "does not take these arguments" not in str(caught.value)


@pytest.mark.parametrize("kwargs, error", [
    ({"max_budget_bytes": "1GiB"}, InvalidTypeError), ({"granularity_bytes": True}, InvalidTypeError),
    ({"granularity_bytes": 1.5}, InvalidTypeError), ({"init_kwargs": [("arch", "cpu")]}, InvalidTypeError),
    ({"max_budget_bytes": np.int64(0)}, InvalidUsageError)])
def test_min_budgets_own_arguments_are_checked_before_any_try(kwargs, error):
    tries = []
    with pytest.raises(error):
        kiln.testing.min_budget(lambda: tries.append(1), **kwargs)
    assert tries == []


def test_min_budget_takes_index_objects_for_its_sizes():
    report = kiln.testing.min_budget(lambda: kiln.ndarray(kiln.f32, 1024).free(),
                                     max_budget_bytes=np.int64(1 << 24),
                                     granularity_bytes=np.int32(1 << 16),
                                     init_kwargs={"arch": "mock", "device_heap_bytes": 4096,
                                                  "caching": False})
    assert 4096 <= report.budget_bytes <= (1 << 24)
