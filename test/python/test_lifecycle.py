"""Process lifecycle: a forked child can use kiln (cpu, mock; on GPU backends a named error, then a
new kiln.init works), and the interpreter exits with its own status while daemon threads are
inside kiln (launching, allocating, running OOM observers), on every backend. Each scenario runs
in a subprocess with a timeout: a hang fails the test instead of hanging it."""
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kiln
from conftest import collect_unraisable

FAKE_CUDA = os.environ.get("KILN_TEST_FAKE_CUDA")
FAKE_HIP = os.environ.get("KILN_TEST_FAKE_HIP")
TIMEOUT_S = 120

BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("mock", id="mock"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
        not FAKE_CUDA, reason="KILN_TEST_FAKE_CUDA (the fake driver's path) not set")),
    pytest.param("amdgpu", id="amdgpu", marks=pytest.mark.skipif(
        not FAKE_HIP, reason="KILN_TEST_FAKE_HIP (the fake runtime's path) not set")),
]
GPU_BACKENDS = [p for p in BACKENDS if p.values[0] in ("cuda", "amdgpu")]

# Set before the scenario: the arch's init arguments (a small device heap on the fake GPUs), and
# the fork scenarios' child: fork_child(work) forks; the child runs work() and ends with exit(0),
# or prints "child failed: <error>" and ends with status 3; the parent gets the pid, and
# child_status(pid) waits for the child's exit status.
PRELUDE = textwrap.dedent("""
    import os, sys, threading, numpy as np, kiln
    ARCH = sys.argv[1]
    INIT = dict(device_heap_bytes=1 << 20) if ARCH in ("cuda", "amdgpu") else {}

    def fork_child(work, exit=os._exit):
        pid = os.fork()
        if pid == 0:
            try:
                work()
            except BaseException as e:
                print("child failed:", repr(e), flush=True)
                os._exit(3)
            exit(0)
        return pid

    def child_status(pid):
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
""")


def run_script(arch, body, *args):
    """Runs PRELUDE + body in a fresh interpreter for `arch`; returns the CompletedProcess."""
    env = dict(os.environ)
    if FAKE_CUDA:
        env["KILN_CUDA_DRIVER"] = FAKE_CUDA
    if FAKE_HIP:
        env["KILN_HIP_RUNTIME"] = FAKE_HIP
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), arch, *args],
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def assert_clean(proc, status):
    """The process ended by itself with `status`, and said nothing about aborting or crashing."""
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == status, report
    for sign in ("terminate called", "Fatal Python error", "Segmentation fault", "Traceback",
                 "LLVM ERROR"):
        assert sign not in proc.stderr, report



def assert_prints_ok(arch, body):
    """Runs `body` for `arch` (run_script); it must end cleanly with status 0, printing "ok"."""
    proc = run_script(arch, body)
    assert_clean(proc, 0)
    assert proc.stdout.strip() == "ok", proc.stdout

# --- fork() ------------------------------------------------------------------------------------

FORK_CHILD_USES_KILN = """
    kiln.init(ARCH, **INIT)
    x = kiln.from_numpy(np.ones(1_000_000, dtype=np.float32))
    assert kiln.reduce_sum(x) == 1_000_000
    def child():
        assert kiln.reduce_sum(x) == 1_000_000          # an array it inherited
        kiln.axpy(1.0, x, x)
        assert kiln.reduce_sum(x) == 2_000_000
        y = kiln.from_numpy(np.ones(1_000_000, dtype=np.float32))  # a new array
        assert kiln.reduce_sum(y) == 1_000_000
        kiln.init(ARCH, **INIT)                            # a new executor
        z = kiln.from_numpy(np.full(1_000_000, 3, dtype=np.float32))
        assert kiln.reduce_sum(z) == 3_000_000
    pid = fork_child(child, exit=sys.exit)                 # the exit hook runs in the child
    status = child_status(pid)
    assert status == 0, status
    assert kiln.reduce_sum(x) == 1_000_000                     # the parent is untouched
    print("ok")
"""


FORK_POOL = """
    import multiprocessing as mp
    kiln.init(ARCH, **INIT)
    x = kiln.from_numpy(np.arange(1000, dtype=np.float32))

    def work(k):
        a = kiln.from_numpy(np.full(200_000, k, dtype=np.float32))
        return kiln.reduce_sum(a) + kiln.reduce_sum(x)

    if __name__ == "__main__":
        with mp.get_context("fork").Pool(2) as pool:
            results = pool.map(work, range(6))
        assert results == [k * 200_000 + 499_500 for k in range(6)], results
        print("ok")
"""


# Another thread is inside a launch on y (stopped in an OOM observer, so deterministically) when
# the main thread forks: in the child that thread does not exist, so y is not in use there.
FORK_WHILE_ANOTHER_THREAD_LAUNCHES = """
    kiln.init(ARCH, budget_bytes=20 << 20, **dict(INIT, device_heap_bytes=1 << 20))
    y = kiln.ndarray(kiln.f32, (1 << 20,))
    hog = kiln.ndarray(kiln.f32, (3 << 20,))            # 12 MiB: staging 4 MiB more is refused
    inside, release = threading.Event(), threading.Event()
    def observer(e):
        inside.set()
        release.wait(60)
    kiln.add_oom_observer(observer)
    def launch():
        try:
            kiln.axpy(1.0, np.ones(1 << 20, dtype=np.float32), y)
        except MemoryError:
            pass
    t = threading.Thread(target=launch)
    t.start()
    assert inside.wait(60)
    pid = os.fork()
    if pid == 0:
        try:
            y.free()                                    # the launching thread is not here
            print("child: freed", flush=True)
            os._exit(0)
        except BaseException as e:
            print("child:", type(e).__name__, e, flush=True)
            os._exit(3)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("arch", ["cpu", "mock"])
def test_forked_child_can_free_an_array_another_thread_was_launching_on(arch):
    assert_clean(run_script(arch, FORK_WHILE_ANOTHER_THREAD_LAUNCHES), 0)


FORK_GPU = """
    kiln.init(ARCH, **INIT)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    def child():
        try:
            kiln.reduce_sum(x)
            print("child: no error", flush=True)
            os._exit(4)
        except kiln.NotSupportedError as e:   # the driver context stayed with the parent
            assert "fork" in str(e), str(e)
        try:
            kiln.ndarray(kiln.f32, (10,))
            os._exit(5)
        except kiln.NotSupportedError:
            pass
        kiln.init(ARCH, **INIT)                # a context of the child's own
        y = kiln.from_numpy(np.ones(1000, dtype=np.float32))
        assert kiln.reduce_sum(y) == 1000
    pid = fork_child(child, exit=sys.exit)
    status = child_status(pid)
    assert status == 0, status
    assert kiln.reduce_sum(x) == 1000
    print("ok")
"""


# A refused kiln.ndarray builds its error while it still holds the executor; a garbage
# collection there runs Python (gc.callbacks) that calls kiln.ndarray (nested, ended) and forks.
# The child's kiln.init must not destroy the executor under the refused call (the child then
# finishes the call, and the executor goes with its reference).
NESTED_BORROW_FORK_SCRIPT = r"""
import gc, os, sys
import kiln
kiln.init("cpu", num_threads=1, budget_bytes=64 << 20)
armed, report = [True], []

def collecting(phase, info):
    if phase != "start" or not armed[0]:
        return
    armed[0] = False
    kiln.ndarray(kiln.f32, (8,))  # a borrow nested in the refused call's, ended before the fork
    if os.fork() == 0:
        kiln.init("cpu", num_threads=1)  # replaces the executor the refused call still holds
        report.append(kiln.reduce_sum(kiln.zeros((3,))))
    else:
        report.append("parent")

gc.callbacks.append(collecting)
gc.set_threshold(1)
try:
    kiln.ndarray(kiln.f32, (1 << 30,))  # refused; its error is built inside the borrow (a collection)
except MemoryError:
    pass
gc.set_threshold(700)
gc.callbacks.remove(collecting)
if report == ["parent"]:
    _, status = os.wait()
    print("parent", os.waitstatus_to_exitcode(status), flush=True)
    sys.exit(0)
print("child", report, kiln.memory_stats()["current_bytes"]["ndarray"] == 0, flush=True)
os._exit(0)
"""


def test_a_forked_child_keeps_the_executor_its_open_call_holds_after_a_nested_one():
    proc = subprocess.run([sys.executable, "-c", NESTED_BORROW_FORK_SCRIPT], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n")) == ["", "child [0.0] True", "parent 0"], proc.stdout


# A fork while another thread is inside a driver call (held there 300 ms by the fake's pause
# hook, so the race is the same every run): the driver's own lock must not reach the child held,
# or the child's first driver call (its kiln.init) waits forever.
FORK_DURING_DRIVER_CALL = """
    import ctypes, time
    api, entry = ("cuda", "cuLaunchKernel") if ARCH == "cuda" else ("hip", "hipModuleLaunchKernel")
    fake = ctypes.CDLL(os.environ["KILN_CUDA_DRIVER" if ARCH == "cuda" else "KILN_HIP_RUNTIME"])
    kiln.init(ARCH, **INIT)
    x = kiln.from_numpy(np.ones(1000, dtype=np.float32))
    getattr(fake, f"kiln_fake_{api}_pause_in")(entry.encode(), 300)  # ms, the lock held
    t = threading.Thread(target=kiln.reduce_sum, args=(x,))
    t.start()
    deadline = time.monotonic() + 60
    while not getattr(fake, f"kiln_fake_{api}_paused")():
        assert t.is_alive() and time.monotonic() < deadline, "the launch never reached the driver"
        time.sleep(0.001)
    def child():
        kiln.init(ARCH, **INIT)
        y = kiln.from_numpy(np.ones(10, dtype=np.float32))
        assert kiln.reduce_sum(y) == 10
    # The fork waits for the call to end (the driver's prepare handler takes its lock).
    pid = fork_child(child)
    t.join()
    status = child_status(pid)
    assert status == 0, status
    print("ok")
"""


# Forks while other threads allocate, free and launch without pause: whatever lock a thread of
# the parent holds at that moment (pool, budget, device, registry), the child must get it free.
# Not deterministic (the budget's lock and the fake drivers' lock have deterministic tests, with
# hooks that hold them: test_lifecycle.cpp and the pause hook above); it can only miss a
# regression, never fail without one.
FORK_STORM = """
    import time
    kiln.init(ARCH, budget_bytes=256 << 20, **INIT)
    stop = threading.Event()
    def churn():
        x = kiln.from_numpy(np.ones(10_000, dtype=np.float32))
        while not stop.is_set():
            a = kiln.ndarray(kiln.f32, (int(np.random.randint(1, 50_000)),))
            kiln.fill(a, 1.0)
            kiln.axpy(1.0, x, x)
            a.free()
    threads = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    def child():
        y = kiln.from_numpy(np.arange(100, dtype=np.float32))
        assert kiln.reduce_sum(y) == 4950
        y.free()
        kiln.init(ARCH, budget_bytes=64 << 20, **INIT)
        assert kiln.reduce_sum(kiln.from_numpy(np.ones(10, dtype=np.float32))) == 10
    for i in range(40):
        status = child_status(fork_child(child))
        assert status == 0, (i, status)
    stop.set()
    for t in threads:
        t.join()
    print("ok")
"""


# The fork scripts above that print "ok" when the child and the parent did what they should; the
# ids are what each one checks.
@pytest.mark.parametrize("arch", ["cpu", "mock"])
@pytest.mark.parametrize("script", [
    pytest.param(FORK_CHILD_USES_KILN, id="forked_child_uses_inherited_and_new_arrays_and_exits"),
    pytest.param(FORK_POOL, id="multiprocessing_fork_pool_workers_use_kiln"),
    pytest.param(FORK_STORM, id="forks_while_other_threads_allocate_and_launch"),
])
def test_fork_on_a_host_memory_backend(script, arch):
    assert_prints_ok(arch, script)


@pytest.mark.parametrize("arch", GPU_BACKENDS)
@pytest.mark.parametrize("script", [
    pytest.param(FORK_GPU, id="forked_child_on_a_gpu_gets_NotSupportedError_then_a_new_init_works"),
    pytest.param(FORK_DURING_DRIVER_CALL, id="fork_while_another_thread_is_inside_the_driver"),
])
def test_fork_on_a_gpu_backend(script, arch):
    assert_prints_ok(arch, script)


# --- interpreter exit with threads inside kiln -------------------------------------------------

EXIT_WITH_DAEMONS = """
    MODE = sys.argv[2]
    kiln.init(ARCH, budget_bytes=64 << 20, **INIT)

    def launcher():
        x = kiln.from_numpy(np.ones(300_000, dtype=np.float32))
        while True:
            kiln.axpy(1.0, x, x)
            kiln.reduce_sum(x)

    def allocator():
        while True:
            a = kiln.ndarray(kiln.f32, (100_000,))
            kiln.fill(a, 1.0)
            del a

    def refused():
        kiln.add_oom_observer(lambda e: None)
        while True:
            try:
                kiln.ndarray(kiln.f32, (1 << 30,))
            except MemoryError:
                pass

    started = []
    def run(fn):
        started.append(1)
        fn()

    for fn in (launcher, allocator, refused, launcher):
        threading.Thread(target=run, args=(fn,), daemon=True).start()
    while len(started) < 4:
        pass
    kiln.memory_stats()
    if MODE == "exit":
        sys.exit(7)
    # else: fall off the end (status 0)
"""


@pytest.mark.parametrize("arch", BACKENDS)
def test_exit_with_daemon_threads_inside_kiln_keeps_the_status(arch):
    runs = [("exit", 7), ("end", 0)] * 10  # 20 runs, 4 at a time
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda r: (run_script(arch, EXIT_WITH_DAEMONS, r[0]), r[1]), runs))
    for proc, status in procs:
        assert_clean(proc, status)


OBSERVER_OUTLASTS_THE_EXIT_WAIT = """
    import time
    MODE = sys.argv[2]
    kiln.init(ARCH, budget_bytes=40 << 20, reserve_bytes=0, **INIT)
    started = threading.Event()
    def observer(error):  # outlasts kiln._shutdown's 10 s wait: CPython ends its thread in here
        started.set()
        end = time.monotonic() + 14
        while time.monotonic() < end:
            time.sleep(0.003)
        print("the observer outlived the exit", flush=True)  # the test has lost its point
    kiln.add_oom_observer(observer)
    if MODE == "staging":  # inside a launch that released the GIL (a host operand's staging)
        host = np.ones(1 << 22, np.float32)
        work = lambda: kiln.axpy(1.0, host, kiln.ndarray(kiln.f32, (1 << 22,)))
    else:                  # inside kiln.ndarray, GIL held
        work = lambda: [kiln.ndarray(kiln.f32, (1 << 22,)) for _ in range(10)]
    threading.Thread(target=work, daemon=True).start()
    started.wait()
"""


@pytest.mark.parametrize("arch", [p for p in BACKENDS if p.values[0] in ("cpu", "mock")])
def test_exit_while_an_observer_outlasts_the_wait_is_clean(arch):
    # CPython ends the observer's thread once finalization starts (a forced unwind through the
    # observer's C++ caller): that unwind must not release the GIL the exiting thread holds,
    # nor drop Python references without it (was: abort or segfault at exit).
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda mode: run_script(arch, OBSERVER_OUTLASTS_THE_EXIT_WAIT, mode),
                              ["staging", "ndarray"]))
    for proc in procs:
        assert_clean(proc, 0)
        assert "outlived" not in proc.stdout  # CPython ended the observer's thread at exit


# --- host memory exhaustion during init and JIT --------------------------------------------------

HOST_OOM = """
    import resource
    STAGE, EXTRA_MIB = sys.argv[2], int(sys.argv[3])

    def address_space_bytes():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    def limit():
        cap = address_space_bytes() + (EXTRA_MIB << 20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    host = np.ones(1000, dtype=np.float32)
    try:
        if STAGE == "init":           # the executor and the JIT of the kernels under the limit
            limit()
            kiln.init(ARCH)
        else:                         # the executor (and its compile) first, then the ops
            kiln.init(ARCH)
            limit()
        x = kiln.from_numpy(host)
        kiln.axpy(1.0, x, x)
        assert kiln.reduce_sum(x) == 2000
        print("ok")
    except kiln.Error as e:
        print("refused", type(e).__name__, getattr(e, "oom_source", ""))
"""


@pytest.mark.parametrize("stage", ["init", "first_op"])
def test_host_memory_exhaustion_during_init_and_jit_is_a_named_error(stage):
    extras_mib = [1, 2, 4, 8, 12, 16, 24, 32, 64]
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda mib: run_script("cpu", HOST_OOM, stage, str(mib)), extras_mib))
    outcomes = []
    for proc in procs:
        assert_clean(proc, 0)  # never an abort (134, -6), a crash or a plain MemoryError
        outcomes.append(proc.stdout.strip())
    assert all(o == "ok" or o.startswith("refused ") for o in outcomes), outcomes
    if stage == "init":  # the compile is refused by name before LLVM runs out
        assert "refused HostOutOfMemoryError host" in outcomes, outcomes
    assert outcomes[-1] == "ok", outcomes  # with room enough, it works


@pytest.mark.parametrize("kind, error", [
    ("bad_alloc", kiln.HostOutOfMemoryError),
    ("future_error", kiln.RuntimeFaultError),
    ("system_error", kiln.RuntimeFaultError),
])
def test_a_cpp_exception_reaching_python_is_a_named_kiln_error(kind, error):
    with pytest.raises(error) as info:
        kiln._kiln._throw_cpp_exception(kind)
    if error is kiln.HostOutOfMemoryError:
        assert isinstance(info.value, MemoryError)
        assert info.value.oom_source == "host"


# --- a device the driver would not release --------------------------------------------------------

TEARDOWN_CASES = [
    pytest.param("cuda", "cuLaunchKernel@1=700,cuDevicePrimaryCtxRelease_v2@1=700",
                 r"cuda:0: cuDevicePrimaryCtxRelease_v2 failed with CUDA_ERROR_ILLEGAL_ADDRESS .* "
                 r"stays held on the device", id="cuda"),
    pytest.param("amdgpu", "hipModuleLaunchKernel@1=700,hipDeviceReset@1=700",
                 r"amdgpu:0: hipDeviceReset failed with hipErrorIllegalAddress .* the memory "
                 r"allocated on it", id="amdgpu"),
]


@pytest.mark.parametrize("arch, faults, said", TEARDOWN_CASES)
def test_a_device_release_the_driver_refuses_is_a_warning_naming_what_stays_held(arch, faults, said):
    fake = kiln.testing.fake_cuda if arch == "cuda" else kiln.testing.fake_hip
    with fake(256 << 20, faults=faults) as driver:
        kiln.init(arch=arch, device_heap_bytes=1 << 20)
        a = kiln.ndarray(kiln.f32, 1024)
        with pytest.raises(kiln.DeviceLostError):
            kiln.fill(a, 1.0)  # the sticky fault
        del a
        with pytest.warns(RuntimeWarning, match=said):
            kiln.init(arch="cpu")  # releases the lost device: the driver refuses
        assert driver.held_bytes() > 0  # what the warning says: the memory stays held


@pytest.mark.parametrize("arch", ["cuda", "amdgpu"])
def test_a_device_released_cleanly_warns_nothing(arch, recwarn):
    fake = kiln.testing.fake_cuda if arch == "cuda" else kiln.testing.fake_hip
    with fake(256 << 20) as driver:
        kiln.init(arch=arch, device_heap_bytes=1 << 20)
        kiln.fill(kiln.ndarray(kiln.f32, 1024), 1.0)
        kiln.init(arch="cpu")
        assert driver.held_bytes() == 0
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_teardown_warning_made_an_error_comes_after_the_new_executor_is_in_place():
    import warnings
    with kiln.testing.fake_cuda(256 << 20, faults=TEARDOWN_CASES[0].values[1]):
        kiln.init(arch="cuda", device_heap_bytes=1 << 20)
        a = kiln.ndarray(kiln.f32, 1024)
        with pytest.raises(kiln.DeviceLostError):
            kiln.fill(a, 1.0)
        del a
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match="cuDevicePrimaryCtxRelease_v2 failed"):
                kiln.init(arch="cpu")
        assert kiln.device() == "cpu"  # the new executor is in place


# --- C++ exceptions the bindings catch themselves go through the one mapping -----------------

@pytest.mark.parametrize("kind, error", [
    ("bad_alloc", kiln.HostOutOfMemoryError),
    ("system_error", kiln.RuntimeFaultError),
])
def test_a_cpp_exception_in_a_buffer_export_is_a_named_kiln_error(kind, error):
    a = kiln.zeros((4,))
    kiln._kiln._arm_cpp_exception("buffer", kind)
    with pytest.raises(error):
        memoryview(a)
    assert np.asarray(memoryview(a)).tolist() == [0.0] * 4  # disarmed after once; a still works


def test_a_cpp_exception_making_an_observers_error_is_reported_as_a_named_kiln_error():
    kiln.init(arch="cpu", budget_bytes=32 << 20)
    seen = []
    kiln.add_oom_observer(seen.append)
    kiln._kiln._arm_cpp_exception("observer", "bad_alloc")
    with collect_unraisable() as unraisable, pytest.raises(kiln.BudgetExceededError):
        kiln.ndarray(kiln.f32, (16 << 20,))
    assert [type(u) for u in unraisable] == [kiln.HostOutOfMemoryError] and seen == []


def test_arming_refuses_an_unknown_site_or_kind():
    with pytest.raises(kiln.InvalidUsageError, match="is not buffer"):
        kiln._kiln._arm_cpp_exception("nowhere", "bad_alloc")
    with pytest.raises(kiln.InvalidUsageError, match="is not bad_alloc"):
        kiln._kiln._arm_cpp_exception("buffer", "segfault")
