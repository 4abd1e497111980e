"""pytest set-up for the kiln Python package.

Run with the package built by CMake on the path, as ctest does:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q test/python
"""
import contextlib
import ctypes
import os
import sys

import pytest

try:
    import kiln  # noqa: F401
except ImportError as e:  # pragma: no cover - a set-up error, said plainly
    raise ImportError(
        f"cannot import kiln ({e}); build it (make) and set PYTHONPATH=<build>/python") from e

MiB = 1 << 20

SOURCE_DIR = os.environ.get(
    "KILN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


@pytest.fixture(autouse=True)
def cpu_executor():
    """Every test starts on a fresh CPU executor with kiln's defaults (2 worker threads)."""
    kiln.init(arch="cpu", num_threads=2)
    yield
    kiln.init(arch="cpu", num_threads=2)  # drop observers, faults and budgets of the test


@contextlib.contextmanager
def collect_unraisable():
    """Collects what kiln reports through sys.unraisablehook (e.g. a raising OOM observer).
    A context manager, not a fixture: pytest installs its own hook around the test body."""
    seen = []
    saved = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        yield seen
    finally:
        sys.unraisablehook = saved


def allocated_bytes():
    """Bytes kiln holds outside its caching pool (the baseline that must come back)."""
    return kiln.memory_stats()["allocated_bytes"]


class FakeGpu:
    """One fake GPU driver (test/fake_cuda, test/fake_hip) as a backend of the GPU matrix: the
    names of its entry points and codes, and its control API, resolved on the same handle kiln's
    loader opens (one fake state). Both fakes export the same functions, prefixed by `prefix`."""

    def __init__(self, name, fake_env, driver_env, prefix, entries, codes):
        self.name = name                # kiln's arch and device prefix: "cuda", "amdgpu"
        self.fake_env = fake_env        # the variable naming the fake library for the tests
        self.driver_env = driver_env    # the variable kiln's loader reads (KILN_CUDA_DRIVER...)
        self.prefix = prefix            # "kiln_fake_cuda_"
        self.entries = entries          # kiln's use of the driver -> the entry point's name
        self.codes = codes              # a kind of answer -> (the driver's number, its name)
        self.path = os.environ.get(fake_env)
        self.lib = None

    def skip_reason(self):
        """Why this backend cannot run here (None when it can)."""
        if not self.path:
            return f"{self.fake_env} (the fake {self.name} driver's path) not set"
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as e:
            return f"the fake {self.name} driver {self.path} does not load: {e}"
        return None

    def _fn(self, name):
        return getattr(self.lib, self.prefix + name)

    def open(self):
        """Declares the control API's signatures; call once skip_reason() said None."""
        self._fn("inject_fault").argtypes = [ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_int]
        self._fn("call_count").argtypes = [ctypes.c_char_p]
        self._fn("call_count").restype = ctypes.c_ulonglong
        self._fn("held_bytes").restype = ctypes.c_size_t
        self._fn("set_mode").argtypes = [ctypes.c_char_p]

    def reset(self):
        self._fn("reset")()

    def inject_fault(self, use, nth_call, kind):
        """Makes the `nth_call`-th call of the entry used for `use` ("alloc", "launch"...) answer
        the code of `kind` ("out_of_memory", "illegal_address", "invalid_value"); 0 on success."""
        return self._fn("inject_fault")(self.entries[use].encode(), nth_call, self.codes[kind][0])

    def call_count(self, use):
        return self._fn("call_count")(self.entries[use].encode())

    def set_mode(self, mode):
        return self._fn("set_mode")(mode.encode())

    def status_name(self, kind):
        return self.codes[kind][1]


# The GPU backends of the matrix (test_gpu_backends.py), each registered with its fake driver.
GPU_BACKENDS = [
    FakeGpu("cuda", "KILN_TEST_FAKE_CUDA", "KILN_CUDA_DRIVER", "kiln_fake_cuda_",
            entries={"alloc": "cuMemAlloc_v2", "launch": "cuLaunchKernel",
                     "copy_to_device": "cuMemcpyHtoD_v2", "mem_info": "cuMemGetInfo_v2"},
            codes={"out_of_memory": (2, "CUDA_ERROR_OUT_OF_MEMORY"),
                   "illegal_address": (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
                   "invalid_value": (1, "CUDA_ERROR_INVALID_VALUE"),
                   "stub": (0, "CUDA_ERROR_STUB_LIBRARY")}),
    FakeGpu("amdgpu", "KILN_TEST_FAKE_HIP", "KILN_HIP_RUNTIME", "kiln_fake_hip_",
            entries={"alloc": "hipMalloc", "launch": "hipModuleLaunchKernel",
                     "copy_to_device": "hipMemcpyHtoD", "mem_info": "hipMemGetInfo",
                     "device_reset": "hipDeviceReset"},
            codes={"out_of_memory": (2, "hipErrorOutOfMemory"),
                   "illegal_address": (700, "hipErrorIllegalAddress"),
                   "invalid_value": (1, "hipErrorInvalidValue"),
                   "stub": (0, "hipErrorInsufficientDriver")}),
]


@pytest.fixture(params=GPU_BACKENDS, ids=lambda b: b.name)
def backend(request, monkeypatch):
    """Each registered GPU backend on its fake driver, reset, kiln's loader pointed at it; skipped
    saying why where the fake is not built or does not load. Afterwards kiln is back on the CPU
    and the fake is reset."""
    gpu = request.param
    reason = gpu.skip_reason()
    if reason:
        pytest.skip(reason)
    gpu.open()
    monkeypatch.setenv(gpu.driver_env, gpu.path)
    gpu.reset()
    yield gpu
    kiln.init(arch="cpu", num_threads=2)
    gpu.reset()
