"""The fast entries of kiln.fill, copy, axpy and reduce_sum (bindings/python/fast_entry.h) and
kiln.ndarray's own type (ndarray_type.h): the operations called with every argument positional
skip pybind11's dispatcher, called any other way (keywords, a wrong count) pybind11's function
runs; kiln.ndarray(...) is made by its type's vectorcall or tp_new.
Both ways must agree: the same results, the same named errors, the same metadata.
"""
import pickle

import numpy as np
import pytest

import kiln

BAD_TYPE = kiln.InvalidTypeError


def test_the_fast_functions_keep_their_name_module_docstring_and_pickle():
    for name, parameters in [("fill", "(out"), ("copy", "(dst"), ("axpy", "(alpha"),
                             ("reduce_sum", "(x")]:
        fn = getattr(kiln, fn_name := name)
        assert fn is getattr(kiln._kiln, name)
        assert fn.__name__ == fn_name and fn.__qualname__ == fn_name
        assert fn.__module__ == "kiln._kiln"
        assert fn.__doc__.startswith(name + parameters), fn.__doc__
        assert pickle.loads(pickle.dumps(fn)) is fn


def arrays(values, dtype=np.float32):
    return kiln.from_numpy(np.asarray(values, dtype=dtype))


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
def test_each_operation_gives_the_same_result_both_ways(by_keyword):
    x, y = arrays([1.0, 2.0, 3.0]), arrays([10.0, 20.0, 30.0])
    out = kiln.ndarray(dtype=kiln.f32, shape=(3,)) if by_keyword else kiln.ndarray(kiln.f32, (3,))
    if by_keyword:
        kiln.fill(out=out, value=0.5)
        kiln.axpy(alpha=2.0, x=x, y=y)
        kiln.copy(dst=x, src=y)
        total = kiln.reduce_sum(x=x)
    else:
        kiln.fill(out, 0.5)
        kiln.axpy(2.0, x, y)
        kiln.copy(x, y)
        total = kiln.reduce_sum(x)
    np.testing.assert_array_equal(out.to_numpy(), [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(x.to_numpy(), [12.0, 24.0, 36.0])
    assert total == 72.0 and type(total) is float


@pytest.mark.parametrize("call", [
    lambda x: kiln.fill(x),
    lambda x: kiln.fill(x, 1.0, 2.0),
    lambda x: kiln.fill(x, 1.0, nosuch=1),
    lambda x: kiln.copy(x),
    lambda x: kiln.axpy(1.0, x),
    lambda x: kiln.axpy(1.0, x, x, x),
    lambda x: kiln.reduce_sum(),
    lambda x: kiln.reduce_sum(x, x),
    lambda x: kiln.ndarray(kiln.f32),
    lambda x: kiln.ndarray(kiln.f32, 3, 4),
    lambda x: kiln.ndarray(kiln.f32, 3, nosuch=1),
    lambda x: kiln.ndarray(kiln.f32, 3, dtype=kiln.f64),
    lambda x: kiln.ndarray(shape=3, device="cpu"),
], ids=["fill1", "fill3", "fill-kw", "copy1", "axpy2", "axpy4", "sum0", "sum2", "nd1", "nd3",
        "nd-kw", "nd-twice", "nd-no-dtype"])
def test_a_wrong_argument_count_still_gets_pybind11s_InvalidTypeError(call):
    x = arrays([1.0])
    with pytest.raises(BAD_TYPE, match="does not take the arguments"):
        call(x)
    np.testing.assert_array_equal(x.to_numpy(), [1.0])


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
@pytest.mark.parametrize("args, error", [
    ((3, 1.0), BAD_TYPE),                      # not an array
    ((np.ones(3, np.float32), 1.0), BAD_TYPE),  # a numpy array
    (("i32", 1.5), BAD_TYPE),                  # a float for an integer array
    (("f32", True), BAD_TYPE),                 # a bool
    (("f32", 1j), BAD_TYPE),                   # complex
    (("i32", 1 << 40), kiln.InvalidUsageError),  # out of int32's range
])
def test_fill_refuses_the_same_arguments_both_ways(by_keyword, args, error):
    out, value = args
    if isinstance(out, str):
        out = kiln.ndarray(out, (2,))
    with pytest.raises(error):
        kiln.fill(out=out, value=value) if by_keyword else kiln.fill(out, value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.0, 1e300])
def test_fill_takes_every_python_float_for_a_floating_array(value):
    out = kiln.ndarray(kiln.f64, (2,))
    kiln.fill(out, value)
    np.testing.assert_array_equal(out.to_numpy(), [value, value])


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
@pytest.mark.parametrize("shape, error, message", [
    ((2, True), BAD_TYPE, "shape must be an int or a sequence of ints"),  # a bool
    ([2.0], BAD_TYPE, "shape must be an int or a sequence of ints"),
    ((1 << 63,), kiln.InvalidUsageError, "is outside int64's range"),
    ([-(1 << 70)], kiln.InvalidUsageError, "is outside int64's range"),
    ((-1,), kiln.InvalidUsageError, "negative"),
    ((1,) * 33, kiln.InvalidUsageError, "33 dimensions"),
    ((1 << 40,) * 2, kiln.InvalidUsageError, ""),  # more elements than numpy allows
])
def test_a_bad_shape_is_refused_the_same_way_both_ways(by_keyword, shape, error, message):
    before = kiln.memory_stats()
    with pytest.raises(error, match=message):
        kiln.ndarray(dtype=kiln.f32, shape=shape) if by_keyword else kiln.ndarray(kiln.f32, shape)
    after = kiln.memory_stats()  # refused before anything was asked for
    assert (after["allocations"], after["budget_refusals"]) == (before["allocations"],
                                                               before["budget_refusals"])


@pytest.mark.parametrize("shape, expected", [
    (5, (5,)), ((), ()), ([], ()), ((2, 3), (2, 3)), ([4, 1], (4, 1)),
    ((np.int64(2), 3), (2, 3)), (np.array([2, 3]), (2, 3)), ((1,) * 32, (1,) * 32),
    ((2, np.int64(3)), (2, 3)),  # the fast conversion takes 2, gives up at np.int64: restarted
])
def test_every_shape_form_makes_the_same_array(shape, expected):
    a = kiln.ndarray(kiln.f32, shape)
    assert a.shape == expected and a.size == int(np.prod(expected))


def test_a_budget_refusal_is_the_same_named_error_both_ways():
    kiln.init("cpu", budget_bytes=64 << 20)
    try:
        for make in (lambda: kiln.ndarray(kiln.f32, (64 << 20,)),
                     lambda: kiln.ndarray(dtype=kiln.f32, shape=(64 << 20,))):
            with pytest.raises(kiln.BudgetExceededError) as info:
                make()
            assert isinstance(info.value, MemoryError)
            assert info.value.requested_bytes == 256 << 20
    finally:
        kiln.init("cpu")


def test_a_subclass_instance_is_an_array_made_before_its_init_runs():
    class Sub(kiln.ndarray):
        def __init__(self, dtype, shape, *, device=None):
            self.seen = (self.shape, self.dtype)  # the array exists already
    assert type(Sub) is type  # no metaclass of kiln's
    s = Sub(kiln.f64, (2, 2))
    assert type(s) is Sub and s.seen == ((2, 2), kiln.f64)
    kiln.fill(s, 3.0)
    assert kiln.reduce_sum(s) == 12.0
    t = Sub(dtype=kiln.f32, shape=(3,), device="mock")
    assert str(t.device) == "mock" and t.seen == ((3,), kiln.f32)
    with pytest.raises(BAD_TYPE, match="does not take the arguments"):
        Sub(kiln.f32)


def test_a_subclass_call_that_matches_no_signature_or_is_refused_leaves_nothing():
    """The subclass path (tp_new, with an argument tuple and a keyword dict): too many
    arguments, a keyword given twice, a refused shape, a budget refusal and an injected driver
    failure are each kiln's named error, and no array or instance is left behind."""
    import sys

    class Sub(kiln.ndarray):
        pass
    live = kiln._kiln._live_array_bytes()
    before = sys.getrefcount(Sub)
    with pytest.raises(BAD_TYPE, match="does not take the arguments"):
        Sub(kiln.f32, (2,), 1, 2)
    with pytest.raises(BAD_TYPE, match="does not take the arguments"):
        kiln.ndarray.__new__(Sub, dtype=kiln.f32, shape=(2,), device=None, extra=1)
    with pytest.raises(BAD_TYPE, match="does not take the arguments"):
        Sub(kiln.f32, shape=(2,), dtype=kiln.f32)
    with pytest.raises(kiln.InvalidUsageError):
        Sub(kiln.f32, (-1,))
    with pytest.raises(kiln.BudgetExceededError):
        Sub(kiln.f32, (1 << 40,))
    with kiln.testing.fail_allocation(at=1), pytest.raises(kiln.DeviceOutOfMemoryError):
        Sub(kiln.f32, (8,))
    after = sys.getrefcount(Sub)  # not in the assert: pytest's rewriting holds one
    assert after == before
    assert kiln._kiln._live_array_bytes() == live
    assert Sub(kiln.f32, (2,)).shape == (2,)


def test_a_refused_array_leaves_no_instance_behind():
    """kiln.ndarray(dtype, shape) makes the array, then the instance: when the array is refused
    no instance exists (an instance would hold a reference to its class)."""
    import gc
    import sys

    def refused(shape):
        try:
            kiln.ndarray(kiln.f32, shape)
        except (kiln.InvalidUsageError, kiln.BudgetExceededError) as e:
            return type(e)
    # Earlier tests' garbage (arrays in reference cycles) would drop the count when collected.
    gc.collect()
    gc.disable()
    try:
        before = sys.getrefcount(kiln.ndarray)
        errors = [refused(shape) for _ in range(50) for shape in [(-1,), (1 << 40,)]]
        after = sys.getrefcount(kiln.ndarray)  # not in the assert: pytest's rewriting holds one
    finally:
        gc.enable()
    assert errors == [kiln.InvalidUsageError, kiln.BudgetExceededError] * 50
    assert after == before


def test_every_kind_of_instance_goes_whole():
    """An array with weak references (cleared, callbacks run), and a subclass's instance with
    a __dict__ (garbage-collected): each goes with its memory."""
    import gc
    import weakref
    called = []
    live = kiln._kiln._live_array_bytes()
    a = kiln.ndarray(kiln.f32, (4,))
    ref = weakref.ref(a, called.append)
    del a
    assert ref() is None and len(called) == 1

    class Sub(kiln.ndarray):
        pass

    class Payload:
        pass
    s = Sub(kiln.f32, (4,))
    s.payload = Payload()
    s.payload.cycle = s
    payload = weakref.ref(s.payload)
    del s
    gc.collect()
    assert payload() is None
    assert kiln._kiln._live_array_bytes() == live


def test_the_class_makes_whole_arrays_and_its_attributes_stay():
    """kiln.ndarray.__new__ with arguments makes a whole array; nothing can replace the class's
    attributes (its __new__, a method, a property)."""
    a = kiln.ndarray.__new__(kiln.ndarray, kiln.f32, (2,))
    assert type(a) is kiln.ndarray and a.shape == (2,)
    for name in ("__new__", "__init__", "free", "shape"):
        with pytest.raises(TypeError, match="immutable"):
            setattr(kiln.ndarray, name, None)
    assert kiln.ndarray(kiln.f32, (2,)).shape == (2,)


@pytest.mark.parametrize("made_by", ["positional", "keyword"])
@pytest.mark.parametrize("again", [
    lambda a: a.__init__(kiln.f64, (5,)),
    lambda a: kiln.ndarray.__init__(a, kiln.f64, (5,)),
    lambda a: a.__init__(dtype=kiln.f64, shape=(5,)),
    lambda a: a.__init__(),
    lambda a: a.__init__("not a dtype", None),
], ids=["positional", "through_class", "keyword", "no_args", "bad_args"])
def test_calling_init_again_leaves_the_array_as_it_was(made_by, again):
    # The array is made by __new__; __init__ (object's) changes nothing: no new value, no leak.
    live = kiln._kiln._live_array_bytes()
    allocated = kiln.memory_stats()["allocated_bytes"]
    a = kiln.ndarray(kiln.f32, (2,)) if made_by == "positional" else kiln.ndarray(dtype=kiln.f32, shape=(2,))
    kiln.fill(a, 7.0)
    assert again(a) is None
    assert a.shape == (2,) and a.dtype == kiln.f32
    np.testing.assert_array_equal(a.to_numpy(), [7.0, 7.0])
    assert kiln._kiln._live_array_bytes() == live + 8
    del a
    assert kiln._kiln._live_array_bytes() == live
    assert kiln.memory_stats()["allocated_bytes"] == allocated


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
@pytest.mark.parametrize("kind, error", [
    ("bad_alloc", kiln.HostOutOfMemoryError),
    ("future_error", kiln.RuntimeFaultError),
    ("system_error", kiln.RuntimeFaultError),
])
def test_a_cpp_exception_is_the_same_named_error_both_ways(by_keyword, kind, error):
    throw = kiln._kiln._throw_cpp_exception
    with pytest.raises(error) as info:
        throw(kind=kind) if by_keyword else throw(kind)
    assert info.value.category == ""  # a host failure names no device category


def test_free_through_the_instance_and_the_class_frees_once():
    before = kiln.memory_stats()["allocated_bytes"]
    a, b = kiln.ndarray(kiln.f32, (4,)), kiln.ndarray(kiln.f32, (4,))
    assert kiln.memory_stats()["allocated_bytes"] > before
    a.free()
    kiln.ndarray.free(b)
    assert a.is_freed and b.is_freed
    assert kiln.memory_stats()["allocated_bytes"] == before
    with pytest.raises(kiln.InvalidUsageError, match="used after it was freed"):
        a.free()


@pytest.mark.parametrize("call, message", [
    (lambda a: kiln.ndarray.free(3), "self must be a kiln.ndarray"),
    (lambda a: a.free(1), "does not take the arguments"),
    (lambda a: a.free(nosuch=1), "does not take the arguments"),
    (lambda a: kiln.ndarray.free(), "is a method of kiln.ndarray: call it on an instance"),
    (lambda a: kiln.ndarray.free(nosuch=a), "is a method of kiln.ndarray: call it on an instance"),
    (lambda a: kiln.ndarray.to_numpy(), "is a method of kiln.ndarray: call it on an instance"),
], ids=["not-an-array", "extra-argument", "keyword", "no-self", "no-self-keyword", "to_numpy-no-self"])
def test_free_refuses_what_pybind11s_free_refuses(call, message):
    a = kiln.ndarray(kiln.f32, (4,))
    with pytest.raises(BAD_TYPE, match=message):
        call(a)
    assert not a.is_freed
