"""kiln.testing.fake_cuda / fake_hip: kiln's cuda and amdgpu backends on kiln's fake GPU drivers
(test/fake_cuda, test/fake_hip: 1 to 8 devices over host memory, each with a capacity, other
processes' use; a fault plan per driver entry point; kernels really run), configured from Python."""

import contextlib
import ctypes
import dataclasses
import os
from typing import Any, Iterator, Literal, Sequence

from . import _kiln
from ._errors import InvalidUsageError, NotSupportedError
from ._typed import typed_arguments

_MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class _Api:
    """One fake driver: kiln's arch for it and the names it goes by."""

    arch: str            # kiln.init's arch and the device prefix: "cuda", "amdgpu"
    title: str           # "fake_cuda", for messages
    library_name: str    # "libkiln_fake_cuda.so"
    library_env: str     # the variable naming the library when it is not beside the package
    driver_env: str      # the variable kiln's loader reads: KILN_CUDA_DRIVER, KILN_HIP_RUNTIME
    env_prefix: str      # the fake's own configuration variables: KILN_FAKE_CUDA_
    prefix: str          # its control functions: kiln_fake_cuda_
    target: str          # the build target that makes it


_CUDA = _Api("cuda", "fake_cuda", "libkiln_fake_cuda.so", "KILN_FAKE_CUDA_LIBRARY",
             "KILN_CUDA_DRIVER", "KILN_FAKE_CUDA_", "kiln_fake_cuda_", "kiln_fake_cuda")
_HIP = _Api("amdgpu", "fake_hip", "libkiln_fake_hip.so", "KILN_FAKE_HIP_LIBRARY",
            "KILN_HIP_RUNTIME", "KILN_FAKE_HIP_", "kiln_fake_hip_", "kiln_fake_hip")

_open_blocks: dict[str, str] = {}  # arch -> the library of its open block


def find_library(api: _Api, library: str | None) -> str:
    """The fake's path: `library`, else $<library_env>, else kiln/_fake/ beside this package (a
    build with kiln's tests puts it there). Errors: NotSupportedError naming where it looked."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fake", api.library_name)
    looked = [library] if library else [p for p in (os.environ.get(api.library_env), here) if p]
    for path in looked:
        if os.path.isfile(path):
            return os.path.realpath(path)
    raise NotSupportedError(
        f"kiln.testing.{api.title}: the fake driver {api.library_name} is not here (looked at "
        f"{', '.join(looked)}): it is built with kiln's tests (cmake --build build --target "
        f"{api.target}); pass library= or set {api.library_env} to its path",
        result="not_supported", site=f"kiln.testing.{api.title}")


class FakeDriver:
    """The control API of a loaded fake driver (test/fake_cuda/fake_cuda_control.h; the HIP one
    has the same functions), on the same library kiln's loader opens: one fake state. Sizes in
    bytes, counts since the block began. Thread-safe (the fake locks every call)."""

    def __init__(self, api: _Api, library: str):
        self.library = library  # the fake's path, as kiln's loader opens it
        self.arch = api.arch
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as e:
            raise NotSupportedError(f"kiln.testing.{api.title}: {library} does not load: {e}",
                                    result="not_supported", site=f"kiln.testing.{api.title}") from e
        self._prefix = api.prefix
        for name, restype, argtypes in (
                ("set_capacity_bytes", None, [ctypes.c_size_t]),
                ("set_other_process_bytes", None, [ctypes.c_size_t]),
                ("inject_fault", ctypes.c_int, [ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_int]),
                ("call_count", ctypes.c_ulonglong, [ctypes.c_char_p]),
                ("held_bytes", ctypes.c_size_t, []), ("high_water_bytes", ctypes.c_size_t, []),
                ("oom_count", ctypes.c_ulonglong, []), ("sticky_error", ctypes.c_int, []),
                ("launch_count", ctypes.c_ulonglong, []), ("reset", None, []),
                ("device_count", ctypes.c_int, []),
                ("device_held_bytes", ctypes.c_size_t, [ctypes.c_int]),
                ("device_high_water_bytes", ctypes.c_size_t, [ctypes.c_int]),
                ("device_capacity_bytes", ctypes.c_size_t, [ctypes.c_int]),
                ("device_oom_count", ctypes.c_ulonglong, [ctypes.c_int]),
                ("device_launch_count", ctypes.c_ulonglong, [ctypes.c_int]),
                ("device_sticky_error", ctypes.c_int, [ctypes.c_int]),
                ("device_contexts", ctypes.c_ulonglong, [ctypes.c_int]),
                ("config_error", ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t])):
            fn = self._fn(name)
            fn.restype, fn.argtypes = restype, argtypes

    def _fn(self, name: str) -> Any:  # a ctypes function of the library
        return getattr(self._lib, self._prefix + name)

    def _counter(self, name: str, device: int | None) -> int:
        """Counter `name` summed over the devices (device None), or device `device`'s own."""
        if device is None:
            return int(self._fn(name)())
        if isinstance(device, bool) or not isinstance(device, int) or not (
                0 <= device < self.device_count()):
            raise InvalidUsageError(f"{name}: device must be an int from 0 to "
                                    f"{self.device_count() - 1}, not {device!r}")
        return int(self._fn("device_" + name)(device))

    @typed_arguments
    def device_count(self) -> int:
        """The number of devices the fake offers (the block's devices=)."""
        return int(self._fn("device_count")())

    @typed_arguments
    def capacity_bytes(self, device: int = 0) -> int:
        """Device `device`'s total memory."""
        return self._counter("capacity_bytes", device)

    @typed_arguments
    def set_capacity_bytes(self, capacity_bytes: int) -> None:
        """Every device's total memory from now on (memory already held stays held)."""
        self._fn("set_capacity_bytes")(_non_negative(capacity_bytes, "capacity_bytes"))

    @typed_arguments
    def set_other_process_bytes(self, other_bytes: int) -> None:
        """Memory other processes hold from now on: lowers the free memory the device reports
        and what an allocation can get."""
        self._fn("set_other_process_bytes")(_non_negative(other_bytes, "other_process_bytes"))

    @typed_arguments
    def inject_fault(self, entry: str, nth_call: int, result: int) -> None:
        """The `nth_call`-th call of driver entry point `entry` from now (1: the next; 0: every
        call) returns the driver status `result` (e.g. 2, CUDA_ERROR_OUT_OF_MEMORY; 700,
        CUDA_ERROR_ILLEGAL_ADDRESS, sticky: the device is lost). Errors: InvalidUsageError for an
        entry point kiln does not load, or a count or status that is not an int in range (a
        status is a C int from 0 to 2**31 - 1)."""
        nth = _non_negative(nth_call, "nth_call", (1 << 64) - 1)
        status = _non_negative(result, "result", (1 << 31) - 1)  # a driver status: a C int
        if self._fn("inject_fault")(entry.encode(), nth, status):
            raise InvalidUsageError(f"inject_fault: {entry!r} is not an entry point of the fake")

    @typed_arguments
    def call_count(self, entry: str) -> int:
        """Calls of driver entry point `entry`, failed ones included."""
        return int(self._fn("call_count")(entry.encode()))

    @typed_arguments
    def held_bytes(self, device: int | None = None) -> int:
        """Device memory allocated and not freed (loaded code not included): on all devices
        (device None), or on device `device` (InvalidUsageError for one the fake lacks)."""
        return self._counter("held_bytes", device)

    @typed_arguments
    def high_water_bytes(self, device: int | None = None) -> int:
        """The most device memory held at once, on all devices together or on `device`."""
        return self._counter("high_water_bytes", device)

    @typed_arguments
    def oom_count(self, device: int | None = None) -> int:
        """Allocations the capacity refused (injected faults not counted), on all devices or on
        `device`."""
        return self._counter("oom_count", device)

    @typed_arguments
    def sticky_error(self, device: int | None = None) -> int:
        """The sticky driver status (a lost device) every call on `device` now returns, or 0;
        without a device, the lowest-numbered device's that has one. Sticky errors are per
        device, as a real driver's are per context: the other devices keep working."""
        if device is None:
            return int(self._fn("sticky_error")())
        return self._counter("sticky_error", device)

    @typed_arguments
    def contexts(self, device: int) -> int:
        """How many driver contexts were made on `device` since the block began (a primary
        context retained from none, or HIP's implicit one): 0 for a device nobody used."""
        return self._counter("contexts", device)

    @typed_arguments
    def launch_count(self, device: int | None = None) -> int:
        """Kernel launches that ran, on all devices or on `device`."""
        return self._counter("launch_count", device)

    def _reset(self, settings: dict[str, str]) -> str:
        """Resets the fake with its KILN_FAKE_* variables set to `settings` (the others unset)
        for the reset only; returns the fake's complaint about them ("" when none)."""
        saved = {k: v for k, v in os.environ.items() if k.startswith(self._prefix.upper())}
        for key in saved:
            del os.environ[key]
        os.environ.update(settings)
        try:
            self._fn("reset")()
        finally:
            for key in settings:
                os.environ.pop(key, None)
            os.environ.update(saved)
        text = ctypes.create_string_buffer(1024)
        self._fn("config_error")(text, len(text))
        return text.value.decode(errors="replace")


_MAX_BYTES = 1 << 60  # the fake's own bound: its *_MB variables stop at 2**40 MiB


def _non_negative(value: int, name: str, limit: int = _MAX_BYTES) -> int:
    """`value` checked as an int from 0 to `limit` (ctypes would cut a larger one silently)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidUsageError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= limit:
        raise InvalidUsageError(f"{name} must be from 0 to {limit}, not {value}")
    return value


def _settings(api: _Api, devices: int, other_process_bytes: int | Sequence[int], faults: str,
              arch: str | None, mode: str) -> dict[str, str]:
    """The fake's environment variables for what can only be set through them (the device
    count, a script of other processes' use, the fault plan by names, the processor, the mode)."""
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= 8:
        raise InvalidUsageError(f"devices must be an int from 1 to 8, not {devices!r}")
    settings = {api.env_prefix + "MODE": mode, api.env_prefix + "FAULTS": faults}
    if devices != 1:
        settings[api.env_prefix + "DEVICES"] = str(devices)
    if arch is not None:
        settings[api.env_prefix + "ARCH"] = arch
    if not isinstance(other_process_bytes, int):
        script = [_non_negative(b, "other_process_bytes") for b in other_process_bytes]
        if not script or any(b % _MiB for b in script):
            raise InvalidUsageError("other_process_bytes: a script is a non-empty sequence of "
                                    "whole MiB (the fake reads it in MiB)")
        settings[api.env_prefix + "OTHER_MB"] = ",".join(str(b // _MiB) for b in script)
    return {k: v for k, v in settings.items() if v}


@contextlib.contextmanager
def _fake_block(api: _Api, capacity_bytes: int, devices: int,
                other_process_bytes: int | Sequence[int], faults: str, arch: str | None, mode: str,
                library: str | None) -> Iterator[FakeDriver]:
    capacity_bytes = _non_negative(capacity_bytes, "capacity_bytes")
    settings = _settings(api, devices, other_process_bytes, faults, arch, mode)
    if api.arch in _open_blocks:
        raise InvalidUsageError(f"kiln.testing.{api.title}: a block is already open (on "
                                f"{_open_blocks[api.arch]}); the fake has one state (all its "
                                f"devices) per process: close that block first")
    held = [name for name in _kiln._open_devices() if name.startswith(api.arch)]
    if held:
        raise InvalidUsageError(f"kiln.testing.{api.title}: kiln has {', '.join(held)} open; "
                                f"entering resets the fake under it: call "
                                f"kiln.init(arch='cpu') first")
    other_bytes = (_non_negative(other_process_bytes, "other_process_bytes")
                   if isinstance(other_process_bytes, int) else None)  # checked before any reset
    fake = FakeDriver(api, find_library(api, library))
    complaint = fake._reset(settings)
    if complaint:
        fake._reset({})  # nothing of the refused configuration stays
        raise InvalidUsageError(f"kiln.testing.{api.title}: {complaint}")
    fake.set_capacity_bytes(capacity_bytes)
    if other_bytes is not None:
        fake.set_other_process_bytes(other_bytes)
    saved_driver = os.environ.get(api.driver_env)
    os.environ[api.driver_env] = fake.library
    _open_blocks[api.arch] = fake.library
    try:
        yield fake
    finally:
        del _open_blocks[api.arch]
        if saved_driver is None:
            os.environ.pop(api.driver_env, None)
        else:
            os.environ[api.driver_env] = saved_driver
        _kiln._close_devices(api.arch)  # no executor outlives the block on the fake


@typed_arguments
def fake_cuda(capacity_bytes: int = 1 << 30, *, devices: int = 1,
              other_process_bytes: int | Sequence[int] = 0,
              faults: str = "", arch: str | None = None,
              mode: Literal["normal", "stub", "nodevice"] = "normal",
              library: str | None = None) -> contextlib.AbstractContextManager[FakeDriver]:
    """A context manager: inside it, kiln.init(arch="cuda") makes its executor on kiln's fake
    CUDA driver (test/fake_cuda/README.md), reset on entry to these settings. It yields the
    FakeDriver (counters, and set_capacity_bytes / inject_fault ... for later changes).

    capacity_bytes: each device's total memory (default 1 GiB); kiln's budget is derived from it
      as from a real device's (total - reserve, the reserve at least 64 MiB).
    devices: how many devices the fake offers, 1 to 8 (cuda:0 ... cuda:7, each with its own
      memory, primary context and counters): kiln.init(arch="cuda:1") picks one.
    other_process_bytes: memory other processes hold (an int), or a script (a sequence of whole
      MiB: one value per free-memory reading, the last one stays).
    faults: the fake's fault plan, "entry@N=result,...": the N-th call of driver entry point
      `entry` (from the block's start; N "*": every call) returns `result`, a number or a name,
      e.g. "cuMemAlloc_v2@3=CUDA_ERROR_OUT_OF_MEMORY,cuLaunchKernel@1=700" (700: the device is
      lost). kiln's own set-up makes driver calls too (cuMemAlloc_v2 for its device heap).
    arch: the processor the device reports, "sm_80" (the default), "sm_90", ...
    mode: "normal"; "stub" (the CUDA toolkit's stub driver) or "nodevice" (no GPU): kiln.init
      raises NotSupportedError, as on a machine without a GPU.
    library: the fake's path; default $KILN_FAKE_CUDA_LIBRARY, else kiln/_fake/ beside the
      package (a build with kiln's tests puts it there).

    The library is loaded once per process and stays loaded; its state (all its devices) is
    reset on each entry, so blocks cannot nest (InvalidUsageError) and none may
    be entered while kiln's executor is on cuda (InvalidUsageError: kiln.init(arch="cpu")
    first). On exit KILN_CUDA_DRIVER is restored and an executor left on cuda is replaced by a
    CPU one; arrays made on the fake stay safe to free, but a later block resets the fake under
    them. The block's settings (capacity, fault plan) stay in the loaded library after it, until
    the next block resets it: code that later points KILN_CUDA_DRIVER at the same file sees
    them. Errors on entry: NotSupportedError when the library is not found or does not load;
    InvalidUsageError for a bad value (the fake's own words for a malformed fault plan), with
    nothing set. Not thread-safe (it sets environment variables and closes kiln's devices of its backend)."""
    return _fake_block(_CUDA, capacity_bytes, devices, other_process_bytes, faults, arch, mode,
                       library)


@typed_arguments
def fake_hip(capacity_bytes: int = 1 << 30, *, devices: int = 1,
             other_process_bytes: int | Sequence[int] = 0,
             faults: str = "", arch: str | None = None,
             mode: Literal["normal", "stub", "nodevice"] = "normal",
             library: str | None = None) -> contextlib.AbstractContextManager[FakeDriver]:
    """fake_cuda's twin for kiln.init(arch="amdgpu") on kiln's fake HIP runtime
    (test/fake_hip/README.md): the same settings and rules, with HIP's names (faults
    "hipMalloc@3=hipErrorOutOfMemory", arch a gcnArchName such as "gfx942:sramecc+:xnack-",
    library $KILN_FAKE_HIP_LIBRARY), restoring KILN_HIP_RUNTIME on exit; devices=2 offers
    amdgpu:0 and amdgpu:1 (kiln.init(arch="amdgpu:1"))."""
    return _fake_block(_HIP, capacity_bytes, devices, other_process_bytes, faults, arch, mode,
                       library)


FakeDriver.__module__ = "kiln.testing"  # where users import it from
