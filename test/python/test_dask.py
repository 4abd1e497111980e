"""kiln.dask through a real distributed LocalCluster (2 worker processes, each with a nanny): one
kiln device per worker, kiln errors crossing with their class and attributes, refusals that cost
no worker, retry by error type, a lost device restarting its worker, arrays on the wire. Each
test runs on cpu and, where the fake CUDA driver is built, on 2 fake CUDA devices (one per
worker). Clusters are shared per module and backend; nothing waits on a clock except for a
worker process to come back (a bounded wait, not a measured time)."""
import gc
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import kiln

distributed = pytest.importorskip("distributed")
import dask  # noqa: E402  (distributed brings it)
import kiln.dask  # noqa: E402

from conftest import SOURCE_DIR  # noqa: E402

MiB = 1 << 20
BUDGET = 64 * MiB  # the device heap (16 MiB) is charged to it: 48 MiB left for arrays
FAKE_CUDA = os.environ.get("KILN_TEST_FAKE_CUDA")
BACKENDS = ["cpu"] + (["cuda"] if FAKE_CUDA else [])
ALLOWED_FAILURES = 1


class Setup:
    def __init__(self, arch, cluster, client):
        self.arch, self.cluster, self.client = arch, cluster, client

    def names(self):
        """{worker address: worker name} of the workers now."""
        return {a: w["name"] for a, w in self.client.scheduler_info()["workers"].items()}

    def by_name(self, results):
        names = self.names()
        return {names[a]: v for a, v in results.items()}

    def address_of(self, name):
        return next(a for a, n in self.names().items() if n == name)

    def pids(self):
        return self.by_name(self.client.run(os.getpid))

    def wait_for_new_processes(self, old_pids, timeout_s=60):
        """Waits until both workers are up and at least one pid is not among `old_pids`; returns
        the pids. A bound on the wait for the nanny, not a measurement."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.client.scheduler_info()["workers"]) == 2:
                pids = self.pids()
                if len(pids) == 2 and set(pids.values()) != set(old_pids.values()) and \
                        all(self.by_name(self.client.run(kiln.dask.worker_device)).values()):
                    return pids
            time.sleep(0.1)
        raise AssertionError(f"the workers did not come back: {self.client.scheduler_info()}")


@pytest.fixture(scope="module", params=BACKENDS)
def setup(request):
    """A LocalCluster of 2 worker processes with KilnPlugin(arch, budget_bytes=64 MiB): on cpu,
    or on the fake CUDA driver with 2 devices (the workers' KILN_CUDA_DRIVER points at it)."""
    arch = request.param
    env = {}
    if arch == "cuda":
        env = {"KILN_CUDA_DRIVER": FAKE_CUDA, "KILN_FAKE_CUDA_DEVICES": "2"}
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES,
                          "distributed.worker.daemon": True}):
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
            silence_logs=logging.CRITICAL, env=env)
        client = distributed.Client(cluster)
        try:
            client.register_worker_plugin(kiln.dask.KilnPlugin(arch=arch, budget_bytes=BUDGET))
            yield Setup(arch, cluster, client)
        finally:
            client.close()
            cluster.close()


def expected_devices(arch):
    return {0: "cpu", 1: "cpu"} if arch == "cpu" else {0: "cuda:0", 1: "cuda:1"}


# ------------------------------------------------------------------------------------------------
# 1. One device per worker


def where_arrays_go():
    # get_worker() reads the thread state distributed sets around a task: the plugin's executor
    # keeps it
    return str(kiln.zeros((4,)).device), kiln.dask.worker_device(), distributed.get_worker().name


def test_each_worker_opens_its_device_and_tasks_use_it(setup):
    devices = setup.by_name(setup.client.run(kiln.dask.worker_device))
    assert devices == expected_devices(setup.arch)
    for name, device in devices.items():
        made, reported, worker = setup.client.submit(where_arrays_go, pure=False,
                                                     workers=[setup.address_of(name)]).result()
        assert made == reported == device and worker == name


def test_choose_device_follows_visible_devices_else_worker_k_mod_count():
    two = lambda backend: 2  # noqa: E731  (a driver with 2 devices)
    assert kiln.dask.choose_device("cuda", 0, {}, two) == "cuda:0"
    assert kiln.dask.choose_device("cuda", 3, {}, two) == "cuda:1"
    assert kiln.dask.choose_device("amdgpu", "5", {}, two) == "amdgpu:1"
    # dask-cuda's way: the worker's own GPU listed first, which the driver numbers 0
    assert kiln.dask.choose_device("cuda", 1, {"CUDA_VISIBLE_DEVICES": "1,0"}, two) == "cuda:0"
    assert kiln.dask.choose_device("amdgpu", 1, {"HIP_VISIBLE_DEVICES": "1"}, two) == "amdgpu:0"
    assert kiln.dask.choose_device("cuda", 1, {"CUDA_VISIBLE_DEVICES": ""}, two) == "cuda:1"
    assert kiln.dask.choose_device("cuda:1", 0, {}, two) == "cuda:1"     # an ordinal is kept
    assert kiln.dask.choose_device("cpu", 7, {}, two) == "cpu"
    name = "tcp://127.0.0.1:4000"
    assert kiln.dask.choose_device("cuda", name, {}, two) == \
        kiln.dask.choose_device("cuda", name, {}, two)                   # a hash, stable
    with pytest.raises(kiln.NotSupportedError):
        kiln.dask.choose_device("cuda", 0, {}, lambda backend: 0)
    with pytest.raises(kiln.InvalidUsageError):
        kiln.dask.choose_device("tpu", 0, {}, two)
    with pytest.raises(kiln.InvalidTypeError):
        kiln.dask.KilnPlugin(arch=0)


# ------------------------------------------------------------------------------------------------
# 2. Errors keep their class and figures on the client


def raise_case(case):
    """Raises a real kiln error of kind `case` on the worker's device."""
    if case == "budget":
        kiln.ndarray(kiln.f32, (32 * MiB,))                  # 128 MiB: over the 64 MiB budget
    elif case == "driver":
        with kiln.testing.fail_allocation(at=1):
            kiln.zeros((1024,))
    elif case == "compile":
        kiln.ElementwiseKernel("float32 x", "float32 y", "y = x +* 2", "bad")
    elif case == "long":
        kiln.device("tpu" + "x" * 20000)                     # a message past 10,000 characters
    elif case == "lost_elsewhere":                            # not the worker's device: no restart
        raise kiln.testing.make_error("device_lost", device="", detail="made by hand")
    elif case == "type":
        kiln.fill(np.zeros(4), 1)                          # numpy where a kiln array goes
    elif case.startswith("made:"):                            # kinds cpu cannot produce itself
        _, result, source = case.split(":")
        raise kiln.testing.make_error(result, source, requested_bytes=7, device="",
                                      detail="made by kiln's mapping")
    raise AssertionError(f"{case} raised nothing")


RECORDED = {}  # on a worker: case -> what its error was there, before it left


def raise_and_record(case):
    """raise_case, recording the error's class, message and attributes as plain values (they
    cross without the error class's own pickling) before it leaves the task."""
    try:
        raise_case(case)
    except kiln.Error as e:
        fields = {name: getattr(e, name) for name in kiln._errors.FIELDS}
        fields.update(line=getattr(e, "line", None), column=getattr(e, "column", None))
        RECORDED[case] = type(e).__name__, str(e), fields
        raise


def recorded():
    return dict(RECORDED)


CASES = {"budget": kiln.BudgetExceededError, "driver": kiln.DeviceOutOfMemoryError,
         "compile": kiln.KernelCompileError, "long": kiln.InvalidUsageError,
         "lost_elsewhere": kiln.DeviceLostError, "type": kiln.InvalidTypeError,
         "made:out_of_memory:device_heap": kiln.DeviceHeapExhaustedError,
         "made:out_of_memory:host": kiln.HostOutOfMemoryError,
         "made:not_supported:none": kiln.NotSupportedError,
         "made:error:none": kiln.RuntimeFaultError}


def test_kiln_errors_arrive_as_their_class_with_every_attribute(setup):
    client = setup.client
    cases = list(CASES)
    raised = client.map(raise_and_record, cases, pure=False)
    distributed.wait(raised)
    described = {}
    for on_worker in client.run(recorded).values():
        described.update(on_worker)
    for case, future in zip(cases, raised):
        name, message, fields = described[case]
        error = future.exception()
        assert type(error) is CASES[case] and name == CASES[case].__name__
        assert str(error) == message
        for field, value in fields.items():
            assert getattr(error, field, None) == value, (case, field)
        assert fields["result"], case                               # real figures, not defaults
        with pytest.raises(CASES[case]):
            future.result()
    budget = raised[0].exception()
    assert budget.requested_bytes == 128 * MiB and budget.limit_bytes == BUDGET
    assert budget.device in expected_devices(setup.arch).values()
    assert len(str(raised[3].exception())) <= kiln._errors.MAX_MESSAGE_CHARS < 10000
    assert raised[2].exception().line == 1 and raised[2].exception().column > 0


def set_max_error_length(n):
    dask.config.set({"distributed.admin.max-error-length": n})


def test_a_kiln_error_dask_shortens_keeps_its_class(setup):
    # distributed's truncate_exception: type(e)("Long error message", text) past the limit.
    client = setup.client
    client.run(set_max_error_length, 100)
    try:
        error = client.submit(raise_case, "budget", pure=False).exception()
    finally:
        client.run(set_max_error_length, 10000)
    assert type(error) is kiln.BudgetExceededError
    assert str(error).startswith("Long error message: ")


# ------------------------------------------------------------------------------------------------
# 3. A refusal never costs the worker


def refused_task(i):
    """Holds 8 MiB, then asks for more than the budget (even i) or is refused by the driver
    (odd i, an injected fault): the 8 MiB must not outlive the task."""
    held = kiln.zeros((2 * MiB,))
    if i % 2 == 0:
        kiln.ndarray(kiln.f32, (16 * MiB,))
    with kiln.testing.fail_allocation(at=1):
        kiln.zeros((held.size,))


def kiln_allocated_bytes():
    return kiln.memory_stats()["allocated_bytes"]


def host_memory(dask_worker):
    return dask_worker.monitor.get_process_memory(), dask_worker.memory_manager.memory_limit


def test_a_hundred_refusals_leave_the_workers_and_their_memory_as_they_were(setup):
    client = setup.client
    before = setup.pids()
    baseline = setup.by_name(client.run(kiln_allocated_bytes))
    # A worker whose automatic collector has not run yet (it runs when it likes): what is freed
    # must be freed by the plugin, deterministically.
    client.run(gc.disable)
    try:
        futures = client.map(refused_task, range(100), pure=False)
        distributed.wait(futures)
        kinds = [type(f.exception()) for f in futures]
        assert kinds == [kiln.BudgetExceededError, kiln.DeviceOutOfMemoryError] * 50
        assert setup.pids() == before
        assert setup.by_name(client.run(kiln_allocated_bytes)) == baseline
    finally:
        client.run(gc.enable)
    target = dask.config.get("distributed.worker.memory.target")
    for used, limit in client.run(host_memory).values():
        assert used < target * limit
    del futures


# ------------------------------------------------------------------------------------------------
# 4. Retry by error type


def two_arrays(n):
    """Holds n f32 elements, then asks for n more; their sum's elements are 1."""
    first = kiln.zeros((n,))
    second = kiln.from_numpy(np.ones(n, dtype=np.float32))
    kiln.axpy(1.0, first, second)
    return n, kiln.reduce_sum(second)


def halve(error, attempt, args, kwargs):
    assert isinstance(error, kiln.BudgetExceededError)
    return (args[0] // 2,), kwargs


def test_retry_halves_the_batch_on_a_refusal_until_it_fits(setup):
    step = kiln.dask.retry(two_arrays, retry_on=(kiln.OutOfMemoryError,), retries=3,
                           backoff=halve)
    n, total = setup.client.submit(step, 8 * MiB, pure=False).result()  # 2 x 32 MiB: refused
    assert n == 4 * MiB and total == 4 * MiB


def count_attempts(raised_kind, retry_on, retries):
    """Runs a function that raises `raised_kind` through kiln.dask.retry on the worker; returns
    (the class that came out, how many times the function ran)."""
    calls = []

    def work():
        calls.append(1)
        if raised_kind == "budget":
            kiln.ndarray(kiln.f32, (32 * MiB,))
        if raised_kind == "driver":
            with kiln.testing.fail_allocation(at=1):
                kiln.zeros((4,))
        raise ValueError("not kiln's")

    try:
        kiln.dask.retry(work, retry_on=tuple(retry_on), retries=retries)()
    except Exception as e:
        return type(e).__name__, len(calls)


def test_retry_retries_only_the_listed_kiln_errors(setup):
    client = setup.client
    # (lists: dask would run a tuple that starts with a callable as a task)
    cases = [("budget", [kiln.BudgetExceededError], ("BudgetExceededError", 4)),
             ("driver", [kiln.BudgetExceededError], ("DeviceOutOfMemoryError", 1)),
             ("driver", [kiln.OutOfMemoryError], ("DeviceOutOfMemoryError", 4)),
             ("python", [kiln.OutOfMemoryError], ("ValueError", 1))]
    futures = [client.submit(count_attempts, kind, on, 3, pure=False) for kind, on, _ in cases]
    assert client.gather(futures) == [want for _, _, want in cases]
    # and what is let through reaches the client at once, as itself
    step = kiln.dask.retry(raise_case, retry_on=(kiln.BudgetExceededError,), retries=3)
    error = client.submit(step, "driver", pure=False).exception()
    assert type(error) is kiln.DeviceOutOfMemoryError and error.injected


def test_retry_refuses_what_it_cannot_use():
    with pytest.raises(kiln.InvalidTypeError):
        kiln.dask.retry(two_arrays, retry_on=(MemoryError,))
    with pytest.raises(kiln.InvalidTypeError):
        kiln.dask.retry(two_arrays, retries=1.5)
    with pytest.raises(kiln.InvalidUsageError):
        kiln.dask.retry(two_arrays, retries=-1)
    with pytest.raises(kiln.InvalidTypeError):
        kiln.dask.retry(3)
    assert kiln.dask.retry(two_arrays).__name__ == "two_arrays"


# ------------------------------------------------------------------------------------------------
# 6. Arrays cross the wire


def make_array(n):
    return kiln.from_numpy(np.arange(n, dtype=np.float32))


def look_at(array):
    return type(array).__name__, str(array.device), array.to_numpy().tolist()


def result_nbytes(key, dask_worker):
    return dask_worker.state.tasks[key].nbytes


def test_arrays_cross_between_client_and_workers_onto_the_receivers_device(setup):
    client = setup.client
    devices = expected_devices(setup.arch)
    header, frames = distributed.protocol.serialize(make_array(3))
    assert header["serializer"] == "dask"                       # the family, not pickle
    # client -> worker, on the worker's device
    sent = kiln.from_numpy(np.array([1, 2, 3], dtype=np.float32))
    name, device, values = client.submit(look_at, sent, pure=False,
                                         workers=[setup.address_of(1)]).result()
    assert (name, device, values) == ("ndarray", devices[1], [1, 2, 3])
    # worker 0 -> worker 1 (get_data between the workers), onto worker 1's device
    made = client.submit(make_array, 5, pure=False, workers=[setup.address_of(0)])
    seen = client.submit(look_at, made, pure=False, workers=[setup.address_of(1)]).result()
    assert seen == ("ndarray", devices[1], [0, 1, 2, 3, 4])
    # worker -> client, onto the client's current device; dask counts its bytes
    back = made.result()
    assert isinstance(back, kiln.ndarray) and back.device == "cpu"
    assert back.to_numpy().tolist() == [0, 1, 2, 3, 4]
    nbytes = client.run(result_nbytes, made.key, workers=[setup.address_of(0)])
    assert list(nbytes.values()) == [5 * 4]


# ------------------------------------------------------------------------------------------------
# 5. A lost device restarts the worker (last: it replaces worker processes)


def lose_device_once(marker):
    """The first run loses the worker's device (an injected kind=lost); a rerun computes."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        with kiln.testing.inject("kind=lost"):
            kiln.zeros((4,))
    return kiln.dask.worker_device(), kiln.reduce_sum(kiln.from_numpy(np.ones(4, np.float32)))


def lose_device_always():
    with kiln.testing.inject("kind=lost"):
        kiln.zeros((4,))


def test_a_lost_device_restarts_its_worker_and_the_task_is_rescheduled(setup, tmp_path):
    client = setup.client
    before = setup.pids()
    device, total = client.submit(lose_device_once, str(tmp_path / "lost"),
                                  pure=False).result()
    assert device in expected_devices(setup.arch).values() and total == 4.0
    after = setup.wait_for_new_processes(before)
    assert len(set(after.values()) - set(before.values())) == 1   # one worker was replaced
    assert setup.by_name(client.run(kiln.dask.worker_device)) == expected_devices(setup.arch)
    # a task that loses the device every time is rescheduled allowed-failures times, then failed
    before = after
    error = client.submit(lose_device_always, pure=False).exception()
    assert isinstance(error, distributed.KilledWorker)
    setup.wait_for_new_processes(before)


# ------------------------------------------------------------------------------------------------
# 1. (teardown) The plugin's teardown frees the worker's kiln state


def kiln_state(dask_worker):
    return (kiln.dask.worker_device(), sorted(kiln._kiln._open_devices()),
            type(dask_worker.executors["default"]).__module__)


def test_unregistering_the_plugin_closes_the_workers_device(setup):
    client = setup.client
    # a plugin whose kiln.init fails: its registration raises kiln's error, typed
    with pytest.raises(kiln.BudgetExceededError):
        client.register_worker_plugin(kiln.dask.KilnPlugin(arch=setup.arch, budget_bytes=MiB))
    client.register_worker_plugin(kiln.dask.KilnPlugin(arch=setup.arch, budget_bytes=BUDGET))
    assert all(device for device, _, _ in client.run(kiln_state).values())
    client.unregister_worker_plugin("kiln")
    try:   # no device, and the worker's own executor back
        assert list(client.run(kiln_state).values()) == \
            [(None, [], "distributed.threadpoolexecutor")] * 2
    finally:
        client.register_worker_plugin(kiln.dask.KilnPlugin(arch=setup.arch, budget_bytes=BUDGET))


# ------------------------------------------------------------------------------------------------
# 7. The example


def test_the_dask_example_retries_refused_batches_and_matches_numpy():
    # on cpu here (no fake driver given); ctest python_dask_example runs it on 2 fake CUDA devices
    env = {k: v for k, v in os.environ.items() if k != "KILN_FAKE_CUDA_LIBRARY"}
    out = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "examples", "dask",
                                                       "batched_scores.py")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "devices: ['cpu', 'cpu']" in out.stdout and "results OK" in out.stdout
    assert int(out.stdout.split(" refused batch(es) retried")[0].split()[-1]) >= 1
