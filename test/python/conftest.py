"""pytest set-up for the kiln Python package.

Run with the package built by CMake on the path, as ctest does:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q test/python
"""
import contextlib
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
