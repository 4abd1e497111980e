"""kiln.testing.inject(spec) and the KILN_FAULT variable: one fault spec (nth, category,
min_bytes, p/seed) fails the right allocation with kiln's OOM (a MemoryError), nests by restoring
the setting it replaced, refuses a malformed spec before arming anything, and KILN_FAULT makes an
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


def test_a_malformed_spec_raises_invalid_usage_and_arms_nothing():
    for bad in ("", "nth=0", "nth=1,nth=2", "p=2", "seed=1", "when=3", "kind=lost",
                "nth=1,kernel=matmul"):
        with pytest.raises(kiln.InvalidUsageError) as info:
            with kiln.testing.inject(bad):
                pass
        assert "grammar" in str(info.value)
        assert refused(1) == []  # the next allocation succeeds
    with pytest.raises(kiln.InvalidUsageError, match="not supported yet"):
        with kiln.testing.inject("kind=launch"):
            pass
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


def test_a_malformed_kiln_fault_fails_init_and_first_use_naming_the_variable():
    proc = run_with_fault("nth=zero")
    assert proc.returncode != 0
    assert "InvalidUsageError" in proc.stderr and "KILN_FAULT" in proc.stderr
    assert "nth=zero" in proc.stderr
    first_use = "import kiln\nkiln.ndarray(kiln.f32, (4,))\n"
    proc = run_with_fault("category=gpu", first_use)
    assert proc.returncode != 0
    assert "InvalidUsageError" in proc.stderr and "KILN_FAULT" in proc.stderr
