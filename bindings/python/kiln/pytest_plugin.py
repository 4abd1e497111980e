"""kiln's pytest plugin: a fresh kiln executor per test on the backends you choose, a leak check
after each test that uses it, and a marker that runs a test under kiln.testing.sweep.

Enable it with `-p kiln.pytest_plugin` (or `pytest_plugins = ["kiln.pytest_plugin"]` in a
conftest.py); an installed kiln also registers it through the `pytest11` entry point.

Options:
    --kiln-backend NAME   a device as kiln.init's arch takes it: cpu, mock, cuda, amdgpu, or
                          with an ordinal (cuda:1); repeat it to run each test on several
                          (default cpu; a device named twice, "cuda" and "cuda:0" too, runs
                          once). cuda and amdgpu need a driver (KILN_CUDA_DRIVER /
                          KILN_HIP_RUNTIME may name kiln's fake ones); where a backend is not
                          available the test is skipped, saying why.
    --kiln-budget-mb N    the memory budget of each test's executor in MiB, N >= 1 (default:
                          kiln's own).
A malformed option stops the run before any test (pytest's usage error, naming it).

Fixture `kiln_backend`: makes the executor (kiln.init) for the test, yields the backend name;
after the test, the bytes kiln holds per category (the caching pool left out) must be back at
what they were right after kiln.init, else the test fails naming what was left, by category;
when the test replaced the executor (kiln.init, kiln.testing.min_budget), the bytes of kiln
arrays alive and not freed, over every executor, must be back where they were instead.
Marker `@pytest.mark.kiln_sweep`: the test body runs under kiln.testing.sweep (once per
allocation request, that request failing); a run that raised anything but a
kiln.OutOfMemoryError or left memory held fails the test with the sweep's report.
Not thread-safe (it replaces the current device's executor): run tests that use it in one
process each."""

import gc
import inspect
from typing import Any, Iterator

import pytest

import kiln
import kiln.testing
from kiln._sweep import _held_above, _held_bytes

BACKENDS = ("cpu", "mock", "cuda", "amdgpu")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kiln")
    group.addoption("--kiln-backend", action="append", dest="kiln_backends",
                    help="device for the kiln_backend fixture (cpu, mock, cuda, amdgpu, "
                         "cuda:1, ...); repeat for several (default cpu)")
    group.addoption("--kiln-budget-mb", type=int, default=None, dest="kiln_budget_mb",
                    help="memory budget in MiB (>= 1) of each test's kiln executor")


def _backends(names: list[str]) -> list[str]:
    """`names` checked by kiln.init's own parser, each device once (first spelling kept).
    Errors: pytest.UsageError naming the option and what was wrong."""
    seen: dict[str, str] = {}
    for name in names:
        try:
            key = kiln._kiln._device_key(name)
        except kiln.InvalidUsageError as e:
            raise pytest.UsageError(f"--kiln-backend {name!r}: {e.detail or e}") from e
        seen.setdefault(key, name)
    return list(seen.values())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kiln_sweep: run the test under kiln.testing.sweep "
                                       "(a fault at each of its allocation requests in turn)")
    config.option.kiln_backends = _backends(config.getoption("kiln_backends") or ["cpu"])
    budget_mb = config.getoption("kiln_budget_mb")
    if budget_mb is not None and budget_mb < 1:
        raise pytest.UsageError(f"--kiln-budget-mb {budget_mb}: the budget must be at least 1 MiB "
                                f"(leave the option out for kiln's own budget)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kiln_backend" in metafunc.fixturenames:
        backends = metafunc.config.getoption("kiln_backends")
        metafunc.parametrize("kiln_backend", backends, indirect=True)


@pytest.fixture
def kiln_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh kiln executor on the backend of this test's parameter; the leak check after."""
    backend: Any = getattr(request, "param", "cpu")  # a device name _backends() checked
    budget_mb = request.config.getoption("kiln_budget_mb")
    options: dict[str, Any] = {} if budget_mb is None else {"budget_bytes": budget_mb << 20}
    try:
        kiln.init(arch=backend, **options)
    except kiln.NotSupportedError as e:
        pytest.skip(f"kiln backend {backend} is not available here: {e}")
    baseline = _held_bytes()
    generation = kiln._kiln._executor_generation()
    live_arrays = kiln._kiln._live_array_bytes()
    yield backend
    if kiln._kiln._executor_generation() != generation:
        # The test replaced the executor (kiln.init, kiln.testing.min_budget): its ledger is
        # gone, but arrays outlive it, so the check counts the arrays still alive, everywhere.
        gc.collect()
        left = kiln._kiln._live_array_bytes() - live_arrays
        if left > 0:
            pytest.fail(f"kiln leak: the test replaced the {backend} executor (kiln.init) and "
                        f"left {left} bytes of kiln arrays alive and not freed", pytrace=False)
        return
    leaked = _held_above(baseline)
    if leaked:
        what = ", ".join(f"{k} {v} bytes" for k, v in sorted(leaked.items()))
        pytest.fail(f"kiln leak: the test left held on {backend}: {what}", pytrace=False)


@pytest.hookimpl(tryfirst=True)  # type: ignore[misc]  # pytest 7.2's hookimpl is untyped
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker("kiln_sweep") is None:
        return None
    names = inspect.signature(pyfuncitem.obj).parameters
    arguments = {name: pyfuncitem.funcargs[name] for name in names}
    kiln.testing.sweep(pyfuncitem.obj, **arguments)
    return True
