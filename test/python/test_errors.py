"""The exception classes: hierarchy, mapping from every error kind, attributes, pickle."""
import os
import pickle
import subprocess
import sys

import pytest

import kiln
import kiln.testing

HIERARCHY = [
    (kiln.Error, (Exception,)),
    (kiln.OutOfMemoryError, (kiln.Error, MemoryError)),
    (kiln.DeviceOutOfMemoryError, (kiln.OutOfMemoryError,)),
    (kiln.BudgetExceededError, (kiln.OutOfMemoryError,)),
    (kiln.DeviceHeapExhaustedError, (kiln.OutOfMemoryError,)),
    (kiln.HostOutOfMemoryError, (kiln.OutOfMemoryError,)),
    (kiln.InvalidUsageError, (kiln.Error, ValueError)),
    (kiln.NotSupportedError, (kiln.Error, NotImplementedError)),
    (kiln.DeviceLostError, (kiln.Error, RuntimeError)),
    (kiln.RuntimeFaultError, (kiln.Error, RuntimeError)),
]


@pytest.mark.parametrize("cls,bases", HIERARCHY, ids=lambda v: getattr(v, "__name__", ""))
def test_hierarchy_is_exactly_as_documented(cls, bases):
    assert cls.__bases__ == bases
    assert cls.__module__ == "kiln"


def test_only_the_out_of_memory_family_is_a_memory_error():
    oom = {kiln.DeviceOutOfMemoryError, kiln.BudgetExceededError, kiln.DeviceHeapExhaustedError,
           kiln.HostOutOfMemoryError, kiln.OutOfMemoryError}
    for cls, _ in HIERARCHY:
        assert issubclass(cls, MemoryError) == (cls in oom), cls


# (RhiResult, OomSource) -> class, through the one native mapping (kiln::classify).
MAPPING = [
    ("out_of_memory", "driver", kiln.DeviceOutOfMemoryError),
    ("out_of_memory", "none", kiln.DeviceOutOfMemoryError),
    ("out_of_memory", "budget", kiln.BudgetExceededError),
    ("out_of_memory", "device_heap", kiln.DeviceHeapExhaustedError),
    ("out_of_memory", "host", kiln.HostOutOfMemoryError),
    ("invalid_usage", "none", kiln.InvalidUsageError),
    ("not_supported", "none", kiln.NotSupportedError),
    ("device_lost", "none", kiln.DeviceLostError),
    ("error", "none", kiln.RuntimeFaultError),
]


@pytest.mark.parametrize("result,source,cls", MAPPING)
def test_every_error_kind_maps_to_its_class(result, source, cls):
    e = kiln.testing.make_error(result, source, requested_bytes=123, device="mock", detail="why")
    assert type(e) is cls
    assert (e.result, e.oom_source, e.requested_bytes, e.device, e.detail) == \
        (result, source, 123, "mock", "why")
    assert "why" in str(e)


@pytest.mark.parametrize("result,source,cls", MAPPING)
def test_only_an_out_of_memory_error_names_a_category(result, source, cls):
    e = kiln.testing.make_error(result, source, requested_bytes=123, device="mock", detail="why")
    names_one = result == "out_of_memory" and source != "host"  # host memory: no device category
    assert e.category == ("ndarray" if names_one else ""), e.category


def test_a_usage_mistake_names_no_category_and_a_refusal_its_own():
    a = kiln.ndarray(kiln.f32, (2,))
    a.free()
    for mistake in (lambda: kiln.fill(a, 1.0), lambda: kiln.ndarray(kiln.f32, (-1,))):
        with pytest.raises(kiln.InvalidUsageError) as info:
            mistake()
        assert info.value.category == "" and info.value.requested_bytes == 0
    kiln.init("cpu", budget_bytes=64 << 20)
    try:
        with pytest.raises(kiln.BudgetExceededError) as info:
            kiln.ndarray(kiln.f32, (64 << 20,))
        assert info.value.category == "ndarray"
    finally:
        kiln.init("cpu")


@pytest.mark.parametrize("result,source,cls", MAPPING)
def test_pickle_keeps_class_message_and_attributes(result, source, cls):
    e = kiln.testing.make_error(result, source, requested_bytes=7, device="cuda:0", detail="d")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls
    assert str(back) == str(e)
    assert vars(back) == vars(e)


def test_a_real_budget_refusal_survives_pickle_with_its_memory_picture():
    with pytest.raises(kiln.BudgetExceededError) as info:
        kiln.ndarray(kiln.f64, (1 << 40,))
    e = info.value
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(e, protocol=protocol))
        assert type(back) is kiln.BudgetExceededError
        assert str(back) == str(e)
        assert back.requested_bytes == 8 << 40
        assert back.limit_bytes == e.limit_bytes > 0
        assert back.in_use_bytes == e.in_use_bytes and back.in_use_bytes["runtime_heap"] > 0
        assert back.site == e.site and back.context == e.context
        assert back.live_age_ms == e.live_age_ms and back.total_bytes == e.total_bytes > 0


@pytest.mark.parametrize("result,source,cls", MAPPING)
def test_every_class_rebuilds_from_the_call_dask_shortens_errors_with(result, source, cls):
    # distributed.utils.truncate_exception: type(e)("Long error message", str(e)[:n])
    e = kiln.testing.make_error(result, source, device="cuda:0", detail="d")
    short = type(e)("Long error message", str(e)[:20])
    assert type(short) is cls and str(short) == "Long error message: " + str(e)[:20]
    assert type(pickle.loads(pickle.dumps(short))) is cls


def test_a_message_longer_than_the_cap_keeps_its_head_and_tail_and_says_what_was_cut():
    cap = kiln._errors.MAX_MESSAGE_CHARS
    assert cap < 10000  # distributed.admin.max-error-length's default: kiln's errors stay whole
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.device("tpu" + "x" * 20000)          # the name is quoted in the message
    message = str(info.value)
    assert len(message) == cap and message.startswith("kiln: unknown backend 'tpux")
    assert message.endswith(str(info.value.site) + "]") and "characters cut]" in message
    for length in (cap - 1, cap, cap + 1, cap + 9, cap + 99, 10 * cap):
        text = "".join(chr(65 + i % 26) for i in range(length))
        shortened = str(kiln.Error(text))
        assert len(shortened) == min(length, cap)
        if length > cap:
            cut = int(shortened.split(" ... [")[1].split(" characters cut]")[0])
            marker = f" ... [{cut} characters cut] ... "
            head, tail = shortened.split(marker)
            assert len(head) + cut + len(tail) == length
            assert text.startswith(head) and text.endswith(tail)


def test_exceptions_can_be_made_by_hand_with_defaults():
    e = kiln.DeviceLostError("gone", device="cuda:0")
    assert str(e) == "gone" and e.device == "cuda:0" and e.requested_bytes == 0
    assert e.free_bytes is None and e.in_use_bytes is None
    with pytest.raises(TypeError):
        kiln.Error("x", no_such_field=1)


def test_unknown_result_in_make_error_is_invalid_usage():
    with pytest.raises(kiln.InvalidUsageError):
        kiln.testing.make_error("exploded")


NOT_SUPPORTED_SCRIPT = """
import kiln
for arch in ("cuda", "amdgpu"):
    try:
        kiln.init(arch=arch)
    except NotImplementedError as e:
        assert type(e) is kiln.NotSupportedError, type(e)
        assert e.result == "not_supported" and e.device.startswith(arch), (e.result, e.device)
    else:
        raise AssertionError(arch + " opened")
a = kiln.ndarray(kiln.f32, (3,))  # the previous executor is still in place
kiln.fill(a, 1.0)
print("ok")
"""


def test_not_supported_from_a_real_path():
    # No driver library at the named paths: both errors come from the C++ side. A process of its
    # own, since a fake driver loaded by an earlier test stays loaded (and a GPU machine has one).
    env = dict(os.environ, KILN_CUDA_DRIVER="/nonexistent/libcuda.so.1",
               KILN_HIP_RUNTIME="/nonexistent/libamdhip64.so")
    done = subprocess.run([sys.executable, "-c", NOT_SUPPORTED_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_invalid_usage_from_real_paths():
    with pytest.raises(ValueError) as info:
        kiln.init(arch="tpu")
    assert type(info.value) is kiln.InvalidUsageError and "tpu" in str(info.value)
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.ndarray(kiln.f32, (2, -3))
    assert info.value.site == "compute_shape_info" and "negative" in str(info.value)
