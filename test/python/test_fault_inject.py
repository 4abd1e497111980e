"""kiln.testing.inject(spec) and the KILN_FAULT variable: one fault spec (nth, category,
min_bytes, kernel, p/seed) fails the right allocation with kiln's OOM (a MemoryError), or gives
the other kinds (kind=lost: DeviceLostError, sticky until kiln.init makes a new executor;
kind=launch: RuntimeFaultError; kind=heap: DeviceHeapExhaustedError), nests by restoring the
setting it replaced, refuses a malformed spec before arming anything, and KILN_FAULT makes an
unmodified program fail (or, malformed, fails kiln's first executor naming the variable)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln


def refused(count, make=lambda: kiln.ndarray(kiln.f32, (4,))):
    """Runs `make` `count` times; the 1-based indices that raised kiln's OOM."""
    out = []
    for i in range(1, count + 1):
        try:
            make()
        except kiln.DeviceOutOfMemoryError as e:
            assert isinstance(e, MemoryError)
            assert e.driver_status == "injected fault (FaultPlan)"
            out.append(i)
    return out


def test_inject_nth_fails_that_allocation_with_kilns_memory_error():
    with kiln.testing.inject("nth=3"):
        kiln.ndarray(kiln.f32, (4,))
        kiln.ndarray(kiln.f32, (4,))
        with pytest.raises(MemoryError) as info:
            kiln.ndarray(kiln.i64, (5,))
        kiln.ndarray(kiln.f32, (4,))
    assert type(info.value) is kiln.DeviceOutOfMemoryError
    assert info.value.requested_bytes == 40
    assert refused(5) == []  # disarmed on exit


def test_inject_by_category_and_size():
    y = kiln.from_numpy(np.zeros(1000, dtype=np.float64))
    x = np.arange(1000, dtype=np.float64)
    with kiln.testing.inject("nth=1,category=staging"):
        kiln.ndarray(kiln.f32, (4,))  # an ndarray: not counted
        with pytest.raises(kiln.DeviceOutOfMemoryError) as info:
            kiln.axpy(2.0, x, y)  # host x needs staging
    assert info.value.category == "staging"
    assert y.to_numpy().sum() == 0.0  # nothing launched
    with kiln.testing.inject("min_bytes=1KiB"):
        assert refused(3, lambda: kiln.ndarray(kiln.f32, (255,))) == []
        assert refused(2, lambda: kiln.ndarray(kiln.f32, (256,))) == [1, 2]


def test_inject_with_a_seed_is_reproducible():
    with kiln.testing.inject("p=0.5,seed=3"):
        first = refused(40)
    with kiln.testing.inject("p=0.5,seed=3"):
        assert refused(40) == first
    assert 0 < len(first) < 40


def test_nested_inject_restores_the_outer_spec():
    with kiln.testing.inject("nth=2"):
        assert refused(1) == []  # the outer spec has seen 1
        with kiln.testing.inject("min_bytes=0"):
            assert refused(2) == [1, 2]  # the inner spec fails everything
        assert refused(2) == [1]  # the outer spec again: its 2nd request
    assert refused(3) == []


def test_inject_inside_fail_allocation_restores_the_outer_block():
    with kiln.testing.fail_allocation(at=4):
        kiln.ndarray(kiln.f32, (4,))
        with kiln.testing.inject("nth=1"):
            assert refused(1) == [1]
        # the inner block's request counted for the outer one: its 4th request is the 2nd here
        assert refused(2) == [2]
    assert refused(3) == []


def test_inject_lost_raises_device_lost_and_later_calls_fail_fast_until_init():
    a = kiln.from_numpy(np.ones(4, dtype=np.float32))
    with kiln.testing.inject("kind=lost,nth=1"):
        with pytest.raises(kiln.DeviceLostError) as info:
            kiln.ndarray(kiln.f32, (4,))
    assert not isinstance(info.value, MemoryError)
    assert "injected device loss" in str(info.value)
    # Sticky, as a real device fault: later calls fail fast, outside the block too.
    with pytest.raises(kiln.DeviceLostError, match="lost earlier"):
        kiln.ndarray(kiln.f32, (4,))
    with pytest.raises(kiln.DeviceLostError):
        a.to_numpy()
    # A test recovers by dropping the lost executor's arrays and making a new executor.
    del a
    kiln.init(arch="cpu", num_threads=2)
    assert kiln.from_numpy(np.ones(3, dtype=np.float32)).to_numpy().sum() == 3.0


def test_inject_launch_fails_the_named_kernel_only_and_holds_nothing():
    y = kiln.from_numpy(np.zeros(8, dtype=np.float64))
    x = kiln.from_numpy(np.ones(8, dtype=np.float64))
    before = kiln.memory_stats()["allocated_bytes"]
    with kiln.testing.inject("kind=launch,kernel=axpy"):
        kiln.fill(y, 2.0)  # another kernel
        with pytest.raises(kiln.RuntimeFaultError, match="injected launch fault") as info:
            kiln.axpy(1.0, x, y)
        with pytest.raises(kiln.RuntimeFaultError):
            kiln.axpy(1.0, np.ones(8), y)  # with staging: released too
    assert "kiln_axpy_f64" in str(info.value)
    assert kiln.memory_stats()["allocated_bytes"] == before
    assert y.to_numpy().tolist() == [2.0] * 8  # no axpy ran
    kiln.axpy(1.0, x, y)  # disarmed on exit
    assert y.to_numpy().tolist() == [3.0] * 8


def test_inject_heap_raises_the_heap_error_a_memory_error():
    x = kiln.from_numpy(np.array([-1.0, 2.0, 3.0]))
    with kiln.testing.inject("kind=heap,kernel=compact_positive"):
        assert kiln.reduce_sum(x) == 4.0  # another kernel
        with pytest.raises(MemoryError) as info:
            kiln.compact_positive(x)
    assert type(info.value) is kiln.DeviceHeapExhaustedError
    assert info.value.oom_source == "device_heap"
    assert "injected device-heap exhaustion" in str(info.value)
    assert kiln.compact_positive(x).to_numpy().tolist() == [2.0, 3.0]


def test_a_malformed_spec_raises_invalid_usage_and_arms_nothing():
    for bad in ("", "nth=0", "nth=1,nth=2", "p=2", "seed=1", "when=3", "kind=gone",
                "kind=launch,category=staging", "kind=heap,min_bytes=1", "kernel=1x"):
        with pytest.raises(kiln.InvalidUsageError) as info:
            with kiln.testing.inject(bad):
                pass
        assert "grammar" in str(info.value)
        assert refused(1) == []  # the next allocation succeeds
    with pytest.raises(kiln.InvalidUsageError, match="kernel=nosuch names no kernel; the ops are"):
        with kiln.testing.inject("kind=launch,kernel=nosuch"):
            pass
    assert refused(1) == []
    with pytest.raises(kiln.InvalidTypeError):
        with kiln.testing.inject(3):
            pass
    assert refused(1) == []


SCRIPT = """
import kiln
kiln.init(arch="cpu", num_threads=1)
out = []
for i in range(1, 6):
    try:
        kiln.ndarray(kiln.f32, (4,))
    except kiln.DeviceOutOfMemoryError:
        out.append(i)
print("refused", out)
"""


def run_with_fault(value, script=SCRIPT):
    env = dict(os.environ, KILN_FAULT=value)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)


def test_kiln_fault_makes_an_unmodified_program_fail_the_right_allocation():
    proc = run_with_fault("nth=3,category=ndarray")
    assert proc.returncode == 0, proc.stderr
    assert "refused [3]" in proc.stdout


def test_kiln_fault_gives_the_other_kinds_to_an_unmodified_program():
    proc = run_with_fault("kind=lost,nth=2", SCRIPT.replace(
        "kiln.DeviceOutOfMemoryError", "kiln.DeviceLostError"))
    assert proc.returncode == 0, proc.stderr
    assert "refused [2, 3, 4, 5]" in proc.stdout  # the 2nd lost the device: the rest fail fast
    proc = run_with_fault("kind=launch,kernel=nosuch")
    assert proc.returncode != 0
    assert "InvalidUsageError" in proc.stderr and "KILN_FAULT" in proc.stderr
    assert "names no kernel" in proc.stderr


def test_a_malformed_kiln_fault_fails_init_and_first_use_naming_the_variable():
    proc = run_with_fault("nth=zero")
    assert proc.returncode != 0
    assert "InvalidUsageError" in proc.stderr and "KILN_FAULT" in proc.stderr
    assert "nth=zero" in proc.stderr
    first_use = "import kiln\nkiln.ndarray(kiln.f32, (4,))\n"
    proc = run_with_fault("category=gpu", first_use)
    assert proc.returncode != 0
    assert "InvalidUsageError" in proc.stderr and "KILN_FAULT" in proc.stderr
