"""Small element-wise launches on the CPU run with the GIL held (launch_small, ndarray.h): they
must still give the right results, never deadlock with a thread whose launch waits for the GIL
inside kiln (an OOM observer of its staging), and leave every array usable by other threads.
"""
import subprocess
import sys
import threading

import numpy as np
import pytest

import kiln

# Thread B's axpy from a host array needs staging; its injected refusal calls an OOM observer
# while B holds the launcher's lock, and the observer waits (GIL released) for `go`. Thread A
# then fills a small array: it must release the GIL and wait for the lock, or B's observer can
# never take the GIL back and the process hangs. The 0.3 s sleep only gives A time to reach the
# launcher's lock, so that dropping the without_gil count makes this hang; the passing run does
# not depend on it.
DEADLOCK_SCRIPT = r"""
import threading, time
import numpy as np
import kiln, kiln.testing

kiln.init("cpu")
y = kiln.ndarray(kiln.f32, (4,))
kiln.fill(y, 0.0)
small = kiln.ndarray(kiln.f32, (8,))
entered, go = threading.Event(), threading.Event()
observed = []

def observer(error):
    observed.append(type(error).__name__)
    entered.set()
    go.wait()

kiln.add_oom_observer(observer)

def staging_launch():
    with kiln.testing.inject("category=staging"):
        try:
            kiln.axpy(1.0, np.ones(4, np.float32), y)
        except MemoryError:
            observed.append("refused")

b = threading.Thread(target=staging_launch)
b.start()
assert entered.wait(30)
a = threading.Thread(target=lambda: kiln.fill(small, 2.0))
a.start()
time.sleep(0.3)
go.set()
a.join(30)
b.join(30)
assert not a.is_alive() and not b.is_alive()
print(observed, kiln.reduce_sum(small), kiln.reduce_sum(y))
"""


def test_a_small_launch_never_deadlocks_with_an_observer_waiting_for_the_gil():
    proc = subprocess.run([sys.executable, "-c", DEADLOCK_SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['DeviceOutOfMemoryError', 'refused'] 16.0 0.0", proc.stdout


@pytest.mark.parametrize("elements", [1, 1000, 1 << 14, (1 << 14) + 1, 100_000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_every_size_around_the_gil_threshold_gives_numpys_results(elements, dtype):
    values = (np.arange(elements) % 7).astype(dtype)
    kiln_dtype = {np.float32: kiln.f32, np.float64: kiln.f64, np.int32: kiln.i32, np.int64: kiln.i64}[dtype]
    x, y = kiln.from_numpy(values), kiln.ndarray(kiln_dtype, (elements,))
    kiln.fill(y, 3)
    kiln.axpy(2, x, y)
    np.testing.assert_array_equal(y.to_numpy(), 2 * values + 3)
    z = kiln.ndarray(kiln_dtype, (elements,))
    kiln.copy(z, y)
    np.testing.assert_array_equal(z.to_numpy(), 2 * values + 3)
    assert kiln.reduce_sum(z) == pytest.approx(float(np.sum(2 * values.astype(np.float64) + 3)))


def test_small_launches_from_many_threads_give_every_thread_its_own_result():
    barrier = threading.Barrier(8)
    errors = []

    def work(i):
        try:
            a = kiln.ndarray(kiln.f64, (64,))
            barrier.wait()
            for _ in range(200):
                kiln.fill(a, float(i))
                assert kiln.reduce_sum(a) == 64.0 * i
        except Exception as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
