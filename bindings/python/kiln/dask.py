"""kiln inside the workers of Dask's distributed (Debian 12: python3-distributed 2022.12).

    from distributed import Client, LocalCluster
    import kiln, kiln.dask

    client = Client(LocalCluster(n_workers=2, processes=True))
    client.register_worker_plugin(kiln.dask.KilnPlugin(arch="cuda", budget_bytes=8 << 30))
    client.run(kiln.dask.worker_device)     # {address: "cuda:0", address: "cuda:1"}
    step = kiln.dask.retry(work, retry_on=(kiln.OutOfMemoryError,), retries=3,
                           backoff=lambda error, attempt, args, kwargs: ((args[0] // 2,), kwargs))
    client.submit(step, 1 << 20).result()   # a kiln error arrives as its own class, figures and all

- KilnPlugin opens one kiln device per worker process and makes it the process's current device
  (kiln.init); arrays a task makes, and arrays that arrive from elsewhere, live there.
- Errors: a kiln error a task raises reaches the client as the same class with every attribute
  (kiln's messages stay under distributed.admin.max-error-length, and the classes rebuild from
  the call distributed makes to shorten an error). When a task fails with a kiln error the plugin
  clears the local variables of its finished frames, in the task's thread, before the failure
  is reported: distributed keeps the exception in a reference cycle with those frames, which
  would hold the task's arrays until Python's collector ran, so a refusal never holds the
  worker's memory.
- A DeviceLostError of the worker's device ends the worker process before the error is
  reported: its nanny starts a clean process and the scheduler reschedules the task (counted
  against distributed.scheduler.allowed-failures), instead of a worker that serves errors.
- retry(fn, ...) runs fn again on the listed kiln errors only.
- kiln.ndarray crosses the wire through the "dask" serialization family (a header and the host
  bytes) and arrives on the receiving process's current device; dask's sizeof is its nbytes.

See docs/dask.md.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import os
import pickle
import zlib
from typing import Any, Callable, Generic, Mapping, ParamSpec, Sequence, TypeVar

import numpy as np
from dask.sizeof import sizeof
from distributed import WorkerPlugin
from distributed.protocol.serialize import dask_deserialize, dask_serialize

from . import _kiln
from ._errors import DeviceLostError, Error, InvalidTypeError, InvalidUsageError, \
    NotSupportedError, OutOfMemoryError

__all__ = ["KilnPlugin", "worker_device", "retry", "Retry", "choose_device"]

logger = logging.getLogger("kiln.dask")

_P = ParamSpec("_P")
_R = TypeVar("_R")

# The variable a GPU worker started by dask-cuda's way (one process per GPU) has: the driver
# then numbers the listed devices from 0, so the worker's device is ordinal 0.
_VISIBLE_DEVICES = {"cuda": "CUDA_VISIBLE_DEVICES", "amdgpu": "HIP_VISIBLE_DEVICES"}

# The exit status of a worker process ended for a lost device (EX_SOFTWARE would say "a bug";
# this is the device's fault): the nanny restarts a process that exits, whatever the status.
LOST_DEVICE_EXIT_STATUS = 75  # EX_TEMPFAIL, sysexits.h: try again


class _WorkerState:
    """What the plugin set up in this process (one plugin per worker process)."""

    device: str | None = None  # the kiln device's name, "cuda:1"


_state = _WorkerState()


def worker_device() -> str | None:
    """The name of the kiln device KilnPlugin opened in this process ("cpu", "cuda:1"), or None
    where no plugin is set up (or after its teardown). Made for client.run:
    ``client.run(kiln.dask.worker_device)`` gives {worker address: device name}."""
    return _state.device


def _worker_index(name: object) -> int:
    """Worker k's k: its name when that is an int or a decimal str (LocalCluster names its
    workers 0, 1, ...), else a CRC-32 of the name (deterministic, spread over the devices)."""
    if isinstance(name, int) and not isinstance(name, bool) and name >= 0:
        return name
    text = str(name)
    if text.isdecimal():
        return int(text)
    return zlib.crc32(text.encode())


def _gpu_device_count(backend: str) -> int:
    """How many devices the driver kiln would load reports (cuDeviceGetCount after cuInit;
    hipGetDeviceCount after hipInit), asked with ctypes of the library kiln's loader opens
    (KILN_CUDA_DRIVER / KILN_HIP_RUNTIME, else the driver's usual name): no context is made.
    Errors: NotSupportedError (no driver, or it refused)."""
    if backend == "cuda":
        names, init, count_fn = [os.environ.get("KILN_CUDA_DRIVER") or "libcuda.so.1"], \
            "cuInit", "cuDeviceGetCount"
    else:
        override = os.environ.get("KILN_HIP_RUNTIME")
        names = [override] if override else ["libamdhip64.so", "libamdhip64.so.6",
                                             "libamdhip64.so.5"]
        init, count_fn = "hipInit", "hipGetDeviceCount"
    for library in names:
        try:
            driver = ctypes.CDLL(library)
        except OSError:
            continue
        count = ctypes.c_int(0)
        status = getattr(driver, init)(ctypes.c_uint(0))
        if status == 0:
            status = getattr(driver, count_fn)(ctypes.byref(count))
        if status != 0:
            raise NotSupportedError(
                f"kiln.dask: {library} answered status {status} to {init}/{count_fn}; pass "
                f"arch='{backend}:N' to pick a device without asking", result="not_supported",
                site="kiln.dask.choose_device", device=backend)
        return count.value
    raise NotSupportedError(f"kiln.dask: no {backend} driver loads here (tried "
                            f"{', '.join(names)})", result="not_supported",
                            site="kiln.dask.choose_device", device=backend)


def choose_device(arch: str, worker_name: object, environ: Mapping[str, str] | None = None,
                  device_count: Callable[[str], int] = _gpu_device_count) -> str:
    """The kiln device a worker named `worker_name` gets for `arch`:

    - "cpu", "mock", or a GPU device with its ordinal ("cuda:1"): that device, on every worker;
    - "cuda" / "amdgpu" in a process started with CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES
      set and not empty (dask-cuda's way: each worker lists its own GPU first): ordinal 0,
      which the driver maps to the first listed device;
    - else worker k of n gets ordinal k mod the driver's device count (k: the worker's name,
      0, 1, ... in a LocalCluster; a name that is no number is hashed, CRC-32).

    environ: the environment to read (default os.environ). device_count: asked for the number of
    devices of "cuda" / "amdgpu" (default: the driver, through ctypes; no context is made).
    Errors: InvalidTypeError (arch not a str), InvalidUsageError (an unknown arch),
    NotSupportedError (no driver, or it reports no device)."""
    if not isinstance(arch, str):
        raise InvalidTypeError(f"kiln.dask: arch must be a str such as 'cuda', not "
                               f"{type(arch).__name__}", result="invalid_usage",
                               site="kiln.dask.choose_device")
    device = _kiln.device(arch)  # validates the name; opens nothing
    if device.type not in _VISIBLE_DEVICES or ":" in arch:
        return str(device)
    environ = os.environ if environ is None else environ
    if environ.get(_VISIBLE_DEVICES[device.type], "").strip():
        return f"{device.type}:0"
    count = device_count(device.type)
    if count < 1:
        raise NotSupportedError(f"kiln.dask: the {device.type} driver reports no device",
                                result="not_supported", site="kiln.dask.choose_device",
                                device=device.type)
    return f"{device.type}:{_worker_index(worker_name) % count}"


class KilnPlugin(WorkerPlugin):
    """A distributed WorkerPlugin (``client.register_worker_plugin(KilnPlugin(...))``) that opens
    one kiln device per worker process: ``kiln.init(choose_device(arch, worker.name),
    **device_options)``, so it is the process's current device (tasks, and arrays arriving
    from elsewhere, use it). device_options are kiln.init's (budget_bytes, reserve_bytes,
    live_check, caching, device_heap_bytes, num_threads, ...); kiln.init checks them on the
    workers, and its error (typed) is what client.register_worker_plugin raises.

    While set up, the tasks of the worker's default executor run through it: when one fails
    with a kiln error (a refusal above all), the local variables of its finished frames are
    cleared in the task's thread before the failure is reported (distributed holds the
    exception in a reference cycle with those frames, so their arrays would stay allocated
    until Python's collector next ran, and a retry could be refused for memory nobody uses).
    After a DeviceLostError of the worker's device it ends the worker process at once (os._exit,
    status LOST_DEVICE_EXIT_STATUS), before the error is reported: the nanny starts a clean
    process, the plugin sets it up again, and the scheduler reschedules the task, counting it
    against distributed.scheduler.allowed-failures (KilledWorker when they are spent). A
    worker without a nanny is closed instead (the error is then reported as the task's).

    Teardown (unregistering the plugin, the worker closing) gives the worker its executor back,
    closes the device's executor and drops the compiled user kernels: the worker's kiln state
    is freed. Its hooks run on the worker's event-loop thread; one plugin per worker (name
    "kiln": registering another replaces it)."""

    name = "kiln"

    def __init__(self, arch: str = "cpu", **device_options: Any) -> None:
        if not isinstance(arch, str):
            raise InvalidTypeError(f"KilnPlugin: arch must be a str such as 'cuda', not "
                                   f"{type(arch).__name__}", result="invalid_usage",
                                   site="KilnPlugin")
        self.arch = arch
        self.device_options = device_options
        self._worker: Any = None

    def setup(self, worker: Any) -> None:
        """Opens the worker's device (Errors: those of choose_device and kiln.init)."""
        name = choose_device(self.arch, worker.name)
        _kiln.init(name, **self.device_options)
        self._worker = worker
        _state.device = name
        executor = worker.executors.get("default")
        if executor is not None and not isinstance(executor, _KilnThreadPoolExecutor):
            worker.executors["default"] = _KilnThreadPoolExecutor(executor)
        logger.info("kiln: worker %s uses %s", worker.name, name)

    def teardown(self, worker: Any) -> None:
        """Closes the device's executor and forgets it (worker_device() is None again)."""
        name, _state.device, self._worker = _state.device, None, None
        executor = worker.executors.get("default")
        if isinstance(executor, _KilnThreadPoolExecutor):
            worker.executors["default"] = executor.executor
        if name is None:
            return
        gc.collect()  # arrays in reference cycles (a user's own) go before their device
        # Closing drops the compiled user kernels first (they hold the device's context).
        _kiln._close_devices(_kiln.device(name).type)

    def transition(self, key: str, start: str, finish: str, **kwargs: Any) -> None:
        """After a task erred with a DeviceLostError of the worker's device: ends the process."""
        if finish != "error" or start not in ("executing", "long-running", "resumed"):
            return
        worker = self._worker
        if worker is None or _state.device is None:
            return
        task = worker.state.tasks.get(key)
        error = _task_exception(task)
        if not isinstance(error, Error):
            return
        if isinstance(error, DeviceLostError) and error.device == _state.device:
            self._restart_for_lost_device(worker, key, error)

    def _restart_for_lost_device(self, worker: Any, key: str, error: DeviceLostError) -> None:
        if worker.nanny:
            logger.error("kiln: %s is lost (task %s: %s); ending this worker process so its "
                         "nanny starts a clean one and the task is rescheduled",
                         error.device, key, error)
            logging.shutdown()
            os._exit(LOST_DEVICE_EXIT_STATUS)
        logger.error("kiln: %s is lost (task %s); closing the worker (it has no nanny to "
                     "restart it)", error.device, key)
        worker.loop.add_callback(worker.close)


class _KilnThreadPoolExecutor:
    """The worker's default executor, its submissions run through _release_failed_task. The name
    ends in ThreadPoolExecutor because distributed's Worker.execute looks for that in the
    executor's type to call apply_function (the worker's thread state, which get_worker() and
    secede() use) rather than apply_function_simple. Everything else goes to the executor."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self.executor.submit(_release_failed_task, fn, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executor, name)


def _release_failed_task(run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs distributed's apply_function; when the task failed with a kiln error, clears the
    local variables of the finished frames of its traceback (the task's arrays are freed now,
    and the reference cycle distributed's message makes with them is gone)."""
    message = run(*args, **kwargs)
    error = message.get("actual-exception") if isinstance(message, dict) else None
    if isinstance(error, Error):
        _clear_frames(error)
    return message


def _task_exception(task: Any) -> BaseException | None:
    """The exception of an erred task, as the worker keeps it (pickled, for the scheduler)."""
    serialized = getattr(task, "exception", None)
    data = getattr(serialized, "data", None)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    try:
        error = pickle.loads(data)
    except Exception:  # an exception that does not unpickle is no kiln error
        return None
    return error if isinstance(error, BaseException) else None


class Retry(Generic[_P, _R]):
    """The callable retry() returns (picklable when fn and backoff are)."""

    def __init__(self, fn: Callable[_P, _R], retry_on: tuple[type[Error], ...], retries: int,
                 backoff: Callable[[Error, int, tuple[Any, ...], dict[str, Any]],
                                   tuple[Sequence[Any], Mapping[str, Any]] | None] | None):
        self.fn = fn
        self.retry_on = retry_on
        self.retries = retries
        self.backoff = backoff
        functools.update_wrapper(self, fn)  # dask names the task's key after fn

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        call_args: tuple[Any, ...] = args
        call_kwargs: dict[str, Any] = kwargs
        for attempt in range(1, self.retries + 2):
            try:
                return self.fn(*call_args, **call_kwargs)
            except self.retry_on as error:
                if attempt > self.retries:
                    raise
                # The failed attempt's frames hold its arrays; free them before the next one.
                _clear_frames(error)
                if self.backoff is not None:
                    changed = self.backoff(error, attempt, call_args, call_kwargs)
                    if changed is not None:
                        call_args, call_kwargs = tuple(changed[0]), dict(changed[1])
                logger.info("kiln.dask.retry: %s raised %s (attempt %d of %d); retrying",
                            getattr(self.fn, "__name__", self.fn), type(error).__name__,
                            attempt, self.retries + 1)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def __repr__(self) -> str:
        names = ", ".join(cls.__name__ for cls in self.retry_on)
        return f"kiln.dask.retry({self.fn!r}, retry_on=({names},), retries={self.retries})"


def _clear_frames(error: BaseException) -> None:
    """Clears the local variables of the finished frames of `error`'s traceback (and of its
    causes'), so the arrays they hold are freed now rather than with the exception."""
    import traceback
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def retry(fn: Callable[_P, _R], *,
          retry_on: tuple[type[Error], ...] = (OutOfMemoryError,), retries: int = 3,
          backoff: Callable[[Error, int, tuple[Any, ...], dict[str, Any]],
                            tuple[Sequence[Any], Mapping[str, Any]] | None] | None = None,
          ) -> Retry[_P, _R]:
    """`fn` wrapped to run again, up to `retries` more times, when it raises one of the kiln
    error classes `retry_on` (subclasses included; default: every out-of-memory kind). Every
    other exception, and the last attempt's error, goes through at once, unchanged (a kiln
    error with its class and attributes). Use it as the function of client.submit / client.map:
    ``client.map(kiln.dask.retry(work, retries=3), batches)``.

    Before an attempt is retried the local variables of its finished frames are cleared (the
    arrays it held are freed), then ``backoff(error, attempt, args, kwargs)`` is called, if
    given: attempt is the 1-based number of the attempt that failed, args and kwargs those it
    was called with; it may sleep, free memory, or return (args, kwargs) for the next attempt
    (e.g. half the batch), or None to call fn as before.

    Lists no DeviceLostError in retry_on on a worker of KilnPlugin: the plugin restarts the
    worker instead (a lost device does not come back in the same process).
    Errors: InvalidTypeError (fn not callable, retry_on not a tuple of kiln error classes,
    retries not an int), InvalidUsageError (retries < 0). Thread-safe when fn is."""
    site = "kiln.dask.retry"
    if not callable(fn):
        raise InvalidTypeError(f"{site}: fn must be callable, not {type(fn).__name__}",
                               result="invalid_usage", site=site)
    if not isinstance(retry_on, tuple) or not retry_on or not all(
            isinstance(cls, type) and issubclass(cls, Error) for cls in retry_on):
        raise InvalidTypeError(f"{site}: retry_on must be a non-empty tuple of kiln error "
                               f"classes (kiln.OutOfMemoryError, kiln.BudgetExceededError, ...), "
                               f"not {retry_on!r}", result="invalid_usage", site=site)
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise InvalidTypeError(f"{site}: retries must be an int, not {type(retries).__name__}",
                               result="invalid_usage", site=site)
    if retries < 0:
        raise InvalidUsageError(f"{site}: retries must be >= 0, not {retries}",
                                result="invalid_usage", site=site)
    if backoff is not None and not callable(backoff):
        raise InvalidTypeError(f"{site}: backoff must be callable or None, not "
                               f"{type(backoff).__name__}", result="invalid_usage", site=site)
    return Retry(fn, retry_on, retries, backoff)


# ------------------------------------------------------------------------------------------------
# kiln.ndarray on the wire: dask's "dask" serialization family, and its size for memory accounting.


@dask_serialize.register(_kiln.ndarray)  # type: ignore[misc,no-untyped-call]
def _serialize_ndarray(array: _kiln.ndarray) -> tuple[dict[str, Any], list[memoryview]]:
    """A header (dtype, shape) and one frame, the array's bytes in C order, copied to the host
    (a.to_numpy()). Errors: those of to_numpy (a freed array, a lost device)."""
    host = np.ascontiguousarray(array.to_numpy())
    header = {"dtype": host.dtype.str, "shape": list(host.shape)}
    return header, [host.data.cast("B")]


@dask_deserialize.register(_kiln.ndarray)  # type: ignore[misc,no-untyped-call]
def _deserialize_ndarray(header: dict[str, Any], frames: list[Any]) -> _kiln.ndarray:
    """A new kiln.ndarray on this process's current device (a worker's: KilnPlugin's) with the
    frame's bytes. Errors: an OutOfMemoryError subclass when it does not fit there."""
    host = np.frombuffer(frames[0] if frames else b"", dtype=np.dtype(header["dtype"]))
    return _kiln.from_numpy(host.reshape(tuple(header["shape"])))


@sizeof.register(_kiln.ndarray)  # type: ignore[misc,no-untyped-call]
def _sizeof_ndarray(array: _kiln.ndarray) -> int:
    """The array's bytes (as dask counts numpy's and CuPy's), 0 once it is freed."""
    return 0 if array.is_freed else int(array.nbytes)
