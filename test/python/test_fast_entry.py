"""The fast entries (bindings/python/fast_entry.h, ndarray_type.h) of kiln.ndarray(dtype,
shape), kiln.fill, copy, axpy and reduce_sum: called with every argument positional they skip
pybind11's dispatcher; called any other way (keywords, a wrong count, a subclass) pybind11's
function runs.
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
], ids=["fill1", "fill3", "fill-kw", "copy1", "axpy2", "axpy4", "sum0", "sum2", "nd1", "nd3",
        "nd-kw"])
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
    ((1 << 63,), kiln.InvalidUsageError, "does not fit in 64 bits"),
    ([-(1 << 70)], kiln.InvalidUsageError, "does not fit in 64 bits"),
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


def test_a_subclass_is_constructed_by_pybind11s_init():
    class Sub(kiln.ndarray):
        pass
    assert type(Sub) is type(kiln.ndarray)  # the metaclass, whose vectorcall only the class has
    s = Sub(kiln.f64, (2, 2))
    assert type(s) is Sub and s.shape == (2, 2) and s.dtype == kiln.f64
    kiln.fill(s, 3.0)
    assert kiln.reduce_sum(s) == 12.0


def test_a_refused_array_leaves_no_instance_behind():
    """kiln.ndarray(dtype, shape) makes the instance, then the array (the class's vectorcall):
    when the array is refused, the instance goes (an instance holds a reference to its class)."""
    import sys

    def refused(shape):
        try:
            kiln.ndarray(kiln.f32, shape)
        except (kiln.InvalidUsageError, kiln.BudgetExceededError) as e:
            return type(e)
    before = sys.getrefcount(kiln.ndarray)
    errors = [refused(shape) for _ in range(50) for shape in [(-1,), (1 << 40,)]]
    after = sys.getrefcount(kiln.ndarray)  # not in the assert: pytest's rewriting holds one
    assert errors == [kiln.InvalidUsageError, kiln.BudgetExceededError] * 50
    assert after == before


def test_every_kind_of_instance_goes_whole():
    """kiln.ndarray's own tp_dealloc handles what kiln.ndarray(dtype, shape) makes and hands the
    rest to pybind11's: an array with weak references (cleared, callbacks run), one pybind11's
    __init__ registered (deregistered); a subclass's instance (pybind11's throughout) still goes
    whole, its __dict__ with it."""
    import gc
    import weakref
    called = []
    a = kiln.ndarray(kiln.f32, (4,))
    ref = weakref.ref(a, called.append)
    del a
    assert ref() is None and len(called) == 1

    registered = kiln._kiln._registered_instances()
    b = kiln.ndarray(dtype=kiln.f32, shape=(4,))  # pybind11's __init__: registered
    assert kiln._kiln._registered_instances() == registered + 1
    del b
    assert kiln._kiln._registered_instances() == registered

    class Sub(kiln.ndarray):
        pass

    class Payload:
        pass
    s = Sub(kiln.f32, (4,))
    s.payload = Payload()
    payload = weakref.ref(s.payload)
    del s
    gc.collect()
    assert payload() is None


REPLACED_SCRIPT = r"""
import sys
import kiln
calls = []
slot = sys.argv[1]
original = getattr(kiln.ndarray, slot)
if slot == "__init__":
    def replacement(self, *args, **kwargs):
        calls.append(args)
        original(self, *args, **kwargs)
else:
    def replacement(cls, *args, **kwargs):
        calls.append(args)
        return original(cls)
setattr(kiln.ndarray, slot, replacement)
a = kiln.ndarray(kiln.f32, (2,))
kiln.fill(a, 1.5)
print(calls, a.shape, kiln.reduce_sum(a))
"""


def test_calling_the_class_takes_its_vectorcall():
    assert type(kiln.ndarray).__flags__ & (1 << 11)  # Py_TPFLAGS_HAVE_VECTORCALL
    assert type(kiln.ndarray).__name__ == "ndarray_type"


@pytest.mark.parametrize("slot", ["__init__", "__new__"])
def test_a_replaced_init_or_new_is_called(slot):
    """Calling the class skips tp_new and tp_init only while kiln.ndarray's own are in place: one
    the user put there instead runs (a subprocess: the class stays changed)."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", REPLACED_SCRIPT, slot], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[(<dtype.f32: 0>, (2,))] (2,) 3.0", proc.stdout


def test_a_second_init_while_the_first_waits_in_an_observer_is_refused():
    """a = kiln.ndarray.__new__(kiln.ndarray), then a.__init__ on two threads: the first waits in
    the OOM observer of its allocation (GIL released) and the second comes in meanwhile. The
    second is InvalidUsageError; the first finishes; the array goes whole (it was registered by
    pybind11's __init__ and leaves its table)."""
    import threading
    kiln.init("cpu", num_threads=1, fault_at=2)
    pad = [kiln.ndarray(kiln.f32, (4096,))]  # allocation 1
    entered, go = threading.Event(), threading.Event()

    def observer(error):
        entered.set()
        go.wait(30)
        if pad:
            pad.pop().free()  # the refused allocation is retried, and succeeds
    kiln.add_oom_observer(observer)
    registered = kiln._kiln._registered_instances()
    a = kiln.ndarray.__new__(kiln.ndarray)
    thread = threading.Thread(target=lambda: a.__init__(kiln.f32, (1024,)))  # allocation 2: refused
    thread.start()
    assert entered.wait(30)
    with pytest.raises(kiln.InvalidUsageError, match="another __init__ of this kiln.ndarray"):
        a.__init__(kiln.f32, (8,))
    go.set()
    thread.join(30)
    assert not thread.is_alive()
    assert a.shape == (1024,)
    kiln.fill(a, 2.0)
    assert kiln.reduce_sum(a) == 2048.0
    del a
    assert kiln._kiln._registered_instances() == registered


@pytest.mark.parametrize("way", ["attribute", "tp_init"])
def test_an_init_from_its_own_arguments_conversion_is_refused(way):
    """The shape's __index__ calls __init__ on the instance being initialized (directly, or
    through the class's tp_init with a __new__ that hands that instance out): InvalidUsageError
    (inside the outer call's InvalidTypeError for the raising __index__), never a value made over
    another; the instance stays empty and goes whole."""
    registered = kiln._kiln._registered_instances()
    a = kiln.ndarray.__new__(kiln.ndarray)

    class Reentering:
        def __index__(self):
            a.__init__(kiln.f32, (8,))
            return 3
    with pytest.raises(kiln.InvalidTypeError) as info:
        if way == "attribute":
            a.__init__(kiln.f32, (2, Reentering()))
        else:
            kiln.ndarray.__new__ = staticmethod(lambda cls, *args: a)
            try:
                kiln.ndarray(kiln.f32, (2, Reentering()))
            finally:
                del kiln.ndarray.__new__  # pybind11's, inherited, again
    assert isinstance(info.value.__cause__, kiln.InvalidUsageError)
    assert "another __init__ of this kiln.ndarray" in str(info.value.__cause__)
    with pytest.raises(kiln.InvalidUsageError):
        a.shape
    del a
    assert kiln._kiln._registered_instances() == registered
    b = kiln.ndarray(kiln.f32, (2, 3))
    assert b.shape == (2, 3)
    assert kiln._kiln._registered_instances() == registered  # the fast path is back


@pytest.mark.parametrize("made_by", ["positional", "keyword"])
@pytest.mark.parametrize("again", [
    lambda a: a.__init__(kiln.f64, (5,)),
    lambda a: kiln.ndarray.__init__(a, kiln.f64, (5,)),
    lambda a: a.__init__(dtype=kiln.f64, shape=(5,)),
    lambda a: a.__init__(),
    lambda a: a.__init__("not a dtype", None),
], ids=["positional", "through_class", "keyword", "no_args", "bad_args"])
def test_calling_init_again_leaves_the_array_as_it_was(made_by, again):
    # A second __init__ is ignored (pybind11's rule), also on an array the fast tp_init made,
    # which pybind11 does not register: no new value, no leaked first one.
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


def test_pybind11s_own_init_is_out_of_the_garbage_collectors_sight():
    # pybind11's __init__, kept as the fast tp_init's fallback, would construct a second value
    # over an array the fast path made (it skips only instances it registered). The only
    # __init__ of kiln.ndarray that Python code can reach is kiln.ndarray.__init__.
    import gc
    doc = kiln.ndarray.__init__.__doc__
    assert doc
    def inits(objects):
        return [o for o in objects if callable(o) and getattr(o, "__name__", None) == "__init__"
                and getattr(o, "__doc__", None) == doc]
    ours = (kiln.ndarray.__init__, kiln.ndarray.__dict__["__init__"])  # function, its descriptor
    a = kiln.ndarray(kiln.f32, (2,))
    tracked = gc.get_objects()
    assert kiln.ndarray.__init__ in inits(tracked)  # the filter finds an __init__ of ndarray
    others = [o for o in inits(tracked + gc.get_referents(*tracked)) if all(o is not x for x in ours)]
    assert others == []
    del a, tracked


@pytest.mark.parametrize("call", [
    lambda: kiln.ndarray.__init__(),
    lambda: kiln.ndarray.__init__(np.zeros(3), kiln.f32, (4,)),
    lambda: kiln.ndarray.__init__(5, kiln.f32, (4,)),
], ids=["no-self", "numpy-self", "int-self"])
def test_init_without_an_array_is_invalid_type(call):
    with pytest.raises(BAD_TYPE, match="__init__: self must be a kiln.ndarray"):
        call()


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
