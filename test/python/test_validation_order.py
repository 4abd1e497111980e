"""Validation before reservation: every op checks a call whole (types,
dtypes, shapes, aliasing, sizes) before it allocates or copies anything, so a usage mistake is
InvalidUsageError, never an out-of-memory error, under a tiny budget and with an injected fault
armed at the very first allocation."""
import numpy as np
import pytest

import kiln
from conftest import MiB


@pytest.fixture
def tiny():
    """A cpu executor with a 4 MiB budget (64 KiB device heap) and a few small operands."""
    kiln.init(arch="cpu", budget_bytes=4 * MiB, device_heap_bytes=64 << 10, num_threads=2)
    ops = {
        "tall": kiln.ndarray(kiln.f32, (100000, 1)),   # matmul of these two needs 37.25 GiB
        "wide": kiln.ndarray(kiln.f32, (2, 100000)),
        "a23": kiln.from_numpy(np.ones((2, 3), np.float32)),
        "b34": kiln.from_numpy(np.ones((3, 4), np.float32)),
        "c24": kiln.ndarray(kiln.f32, (2, 4)),
        "d24": kiln.ndarray(kiln.f64, (2, 4)),
        "v6": kiln.from_numpy(np.arange(6, dtype=np.float32)),
        "w6": kiln.from_numpy(np.arange(6, dtype=np.float64)),
        "v5": kiln.from_numpy(np.arange(5, dtype=np.float32)),
        "i6": kiln.from_numpy(np.arange(6, dtype=np.int32)),
    }
    freed = kiln.ndarray(kiln.f32, (6,))
    freed.free()
    ops["freed"] = freed
    return ops


# A 1 GiB logical x that is neither contiguous nor native-order but holds 4 bytes: any copy of
# it before the shape check would need 1 GiB of host memory.
HUGE_X = np.lib.stride_tricks.as_strided(np.ones(1, ">f4"), shape=(1 << 28,), strides=(0,))

BAD_CALLS = {
    "matmul (m,k)@(k',n) whose output would not fit": lambda o: kiln.matmul(o["tall"], o["wide"]),
    "matmul of a 1-D operand": lambda o: kiln.matmul(o["v6"], o["b34"]),
    "matmul of mixed dtypes": lambda o: kiln.matmul(o["a23"], o["d24"]),
    "matmul of a freed operand": lambda o: kiln.matmul(o["freed"], o["b34"]),
    "matmul into an out of the wrong shape": lambda o: kiln.matmul(o["a23"], o["b34"], out=o["v6"]),
    "matmul into an out of the wrong dtype": lambda o: kiln.matmul(o["a23"], o["b34"], out=o["d24"]),
    "matmul of a numpy operand": lambda o: kiln.matmul(np.ones((2, 3), np.float32), o["b34"]),
    "matmul into a numpy out": lambda o: kiln.matmul(o["a23"], o["b34"], out=np.zeros((2, 4))),
    "axpy of a huge numpy x against a small y": lambda o: kiln.axpy(1.0, HUGE_X, o["v6"]),
    "axpy of a numpy x of another dtype": lambda o: kiln.axpy(1.0, np.ones(6, np.float64), o["v6"]),
    "axpy of a numpy x of another shape": lambda o: kiln.axpy(1.0, np.ones(5, np.float32), o["v6"]),
    "axpy of a float16 numpy x": lambda o: kiln.axpy(1.0, np.ones(6, np.float16), o["v6"]),
    "axpy into a freed y with a numpy x": lambda o: kiln.axpy(1.0, np.ones(6, np.float32), o["freed"]),
    "axpy of arrays of two shapes": lambda o: kiln.axpy(1.0, o["v5"], o["v6"]),
    "axpy of arrays of two dtypes": lambda o: kiln.axpy(1.0, o["w6"], o["v6"]),
    "axpy with a complex alpha": lambda o: kiln.axpy(1j, o["v6"], o["v6"]),
    "axpy into a numpy y": lambda o: kiln.axpy(1.0, o["v6"], np.zeros(6, np.float32)),
    "fill with a numpy array": lambda o: kiln.fill(o["v6"], np.ones(6)),
    "fill an i32 array with 2**40": lambda o: kiln.fill(o["i6"], 1 << 40),
    "fill an i32 array with 1.5": lambda o: kiln.fill(o["i6"], 1.5),
    "fill a freed array": lambda o: kiln.fill(o["freed"], 1.0),
    "copy between two shapes": lambda o: kiln.copy(o["v6"], o["v5"]),
    "copy between two dtypes": lambda o: kiln.copy(o["v6"], o["w6"]),
    "copy into a numpy dst": lambda o: kiln.copy(np.zeros(6, np.float32), o["v6"]),
    "reduce_sum of a freed array": lambda o: kiln.reduce_sum(o["freed"]),
    "reduce_sum of a numpy array": lambda o: kiln.reduce_sum(np.ones(3)),
    "compact_positive of a freed array": lambda o: kiln.compact_positive(o["freed"]),
    "compact_positive of a list": lambda o: kiln.compact_positive([1.0, -1.0]),
    "to_numpy of a freed array": lambda o: o["freed"].to_numpy(),
    "copy.copy of a freed array": lambda o: __import__("copy").copy(o["freed"]),
    "ndarray of a negative dimension": lambda o: kiln.ndarray(kiln.f32, (4, -1)),
    "ndarray of 33 dimensions": lambda o: kiln.ndarray(kiln.f32, (1,) * 33),
    "ndarray (0, 2**62): numpy cannot hold it": lambda o: kiln.ndarray(kiln.f32, (0, 1 << 62)),
    "ndarray of a bytes shape": lambda o: kiln.ndarray(kiln.f32, b"\x02\x03"),
    "from_numpy of float16": lambda o: kiln.from_numpy(np.ones((512, 512), np.float16)),
    "from_numpy of a structured array": lambda o: kiln.from_numpy(np.zeros(4, "i4,f4")),
}


@pytest.mark.parametrize("call", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_a_bad_call_is_invalid_usage_before_any_allocation(tiny, call):
    before = kiln.memory_stats()
    with kiln.testing.fail_allocation(at=1):
        with pytest.raises(kiln.InvalidUsageError) as info:
            call(tiny)
        assert kiln.testing.allocation_count() == 0, "allocated before the call was known valid"
    assert not isinstance(info.value, MemoryError)
    after = kiln.memory_stats()
    assert after["allocations"] == before["allocations"]
    assert after["allocated_bytes"] == before["allocated_bytes"]


def test_the_issue_matmul_is_invalid_usage_under_a_256_mib_budget():
    kiln.init(arch="cpu", budget_bytes=256 * MiB, num_threads=2)
    a = kiln.ndarray(kiln.f32, (100000, 1))
    b = kiln.ndarray(kiln.f32, (2, 100000))
    with pytest.raises(kiln.InvalidUsageError) as info:
        kiln.matmul(a, b)
    assert "shapes do not agree" in str(info.value)
    assert "GiB" not in str(info.value)


def test_a_batch_halving_loop_stops_on_a_usage_mistake():
    """examples/adaptive_batch.py halves its batch on MemoryError: a usage mistake must end it
    at once, even when the output it would have allocated does not fit the budget."""
    kiln.init(arch="cpu", budget_bytes=64 * MiB, num_threads=2)
    w = kiln.from_numpy(np.ones((2, 1024), np.float32))
    batch, attempts = 1 << 22, 0
    with pytest.raises(kiln.InvalidUsageError):
        while batch >= 1:
            attempts += 1
            x = kiln.ndarray(kiln.f32, (batch, 1))  # k=1 does not match w's 2 rows
            try:
                kiln.matmul(x, w)                    # an output of batch x 1024 f32
            except MemoryError:
                batch //= 2
            finally:
                del x
    assert attempts == 1


def test_valid_calls_still_work_under_the_tiny_budget(tiny):
    c = kiln.matmul(tiny["a23"], tiny["b34"])
    np.testing.assert_array_equal(c.to_numpy(), np.full((2, 4), 3, np.float32))
    kiln.axpy(2.0, np.arange(6, dtype=">f4")[::-1].copy(), tiny["v6"])  # byte-swapped: staged
    np.testing.assert_array_equal(tiny["v6"].to_numpy(), np.arange(6) + 2 * np.arange(6)[::-1])


def test_a_mismatched_numpy_x_is_refused_before_it_is_copied():
    """axpy checks x's dtype and shape against y before it makes x contiguous and native."""
    import tracemalloc
    kiln.init(arch="cpu", num_threads=2)
    y = kiln.ndarray(kiln.f32, (6,))
    x = np.lib.stride_tricks.as_strided(np.ones(1, ">f4"), shape=(1 << 24,), strides=(0,))  # 64 MiB
    tracemalloc.start()
    try:
        with pytest.raises(kiln.InvalidUsageError):
            kiln.axpy(1.0, x, y)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_bytes < 4 * MiB, f"x was copied before the check ({peak_bytes} bytes traced)"


def test_from_numpy_is_refused_by_the_budget_before_a_non_contiguous_input_is_copied():
    """from_numpy allocates the device array before it makes its input contiguous: a broadcast
    view far larger than the budget is a BudgetExceededError, with no host copy made."""
    import tracemalloc
    kiln.init(arch="cpu", num_threads=2, budget_bytes=64 * MiB)
    x = np.lib.stride_tricks.as_strided(np.ones(1, ">f4"), shape=(1 << 28,), strides=(0,))  # 1 GiB
    tracemalloc.start()
    try:
        with pytest.raises(kiln.BudgetExceededError) as info:
            kiln.from_numpy(x)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.requested_bytes == 1 << 30
    assert peak_bytes < 4 * MiB, f"x was copied before the refusal ({peak_bytes} bytes traced)"
    # What fits is copied as before (byte-swapped and strided: made contiguous, native).
    small = np.arange(12, dtype=">f8").reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(kiln.from_numpy(small).to_numpy(), small)
