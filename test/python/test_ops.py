"""The built-in operations against numpy, for every dtype, and their invalid uses."""
import threading

import numpy as np
import pytest

import kiln

DTYPES = [np.float32, np.float64, np.int32, np.int64]


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(-50, 50, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_fill_copy_axpy_reduce(dtype):
    x_host, y_host = sample(dtype, (1000,), 1), sample(dtype, (1000,), 2)
    x, y = kiln.from_numpy(x_host), kiln.from_numpy(y_host)
    kiln.axpy(3, x, y)
    expected = y_host + 3 * x_host
    np.testing.assert_array_equal(y.to_numpy(), expected)
    kiln.axpy(-2, x_host, y)  # x from host memory (staged)
    expected = expected - 2 * x_host
    np.testing.assert_array_equal(y.to_numpy(), expected)
    assert kiln.reduce_sum(y) == expected.astype(np.float64).sum()
    assert isinstance(kiln.reduce_sum(y), float if dtype in (np.float32, np.float64) else int)
    z = kiln.ndarray(x.dtype, x.shape)
    kiln.copy(z, y)
    np.testing.assert_array_equal(z.to_numpy(), expected)
    kiln.fill(z, 7)
    np.testing.assert_array_equal(z.to_numpy(), np.full(1000, 7, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_matmul(dtype):
    a_host, b_host = sample(dtype, (17, 9), 3), sample(dtype, (9, 5), 4)
    a, b = kiln.from_numpy(a_host), kiln.from_numpy(b_host)
    c = kiln.matmul(a, b)
    np.testing.assert_allclose(c.to_numpy(), a_host @ b_host)
    out = kiln.ndarray(a.dtype, (17, 5))
    assert kiln.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out.to_numpy(), a_host @ b_host)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_compact_positive(dtype):
    host = sample(dtype, (5000,), 5)
    np.testing.assert_array_equal(kiln.compact_positive(kiln.from_numpy(host)).to_numpy(),
                                  host[host > 0])


def test_invalid_operands_are_invalid_usage():
    f = kiln.ndarray(kiln.f32, (4,))
    i = kiln.ndarray(kiln.i32, (4,))
    cases = [
        lambda: kiln.copy(f, i),                                    # dtypes differ
        lambda: kiln.axpy(1.0, kiln.ndarray(kiln.f32, (5,)), f),    # shapes differ
        lambda: kiln.axpy(1.0, np.ones(4, np.float64), f),          # host dtype differs
        lambda: kiln.axpy(1.0, np.ones((2, 2), np.float32), f),     # host shape differs
        lambda: kiln.fill(i, 2.5),                                  # not an int
        lambda: kiln.fill(i, 1 << 40),                              # does not fit in i32
        lambda: kiln.fill(f, "x"),
        lambda: kiln.matmul(f, f),                                  # not 2-D
        lambda: kiln.matmul(kiln.ndarray(kiln.f32, (2, 3)), kiln.ndarray(kiln.f32, (2, 3))),
    ]
    for case in cases:
        with pytest.raises(kiln.InvalidUsageError):
            case()


def test_launches_from_several_threads_agree():
    host = np.arange(1 << 20, dtype=np.int64)
    arrays = [kiln.from_numpy(host) for _ in range(4)]
    results = [None] * 4

    def work(k):
        for _ in range(5):
            results[k] = kiln.reduce_sum(arrays[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [int(host.sum())] * 4


def test_matmul_out_must_be_a_kiln_ndarray_and_not_an_operand():
    a = kiln.from_numpy(np.ones((2, 2), dtype=np.float32))
    b = kiln.from_numpy(np.ones((2, 2), dtype=np.float32))
    with pytest.raises(kiln.InvalidUsageError):
        kiln.matmul(a, b, out=np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(kiln.InvalidUsageError):
        kiln.matmul(a, b, out=a)
