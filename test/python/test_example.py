"""examples/adaptive_batch.py runs on the CPU under a small budget, catches MemoryError, and
gets the numpy answer."""
import os
import re
import subprocess
import sys

from conftest import SOURCE_DIR

EXAMPLE = os.path.join(SOURCE_DIR, "examples", "adaptive_batch.py")


def run_example(*args, env=None):
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True,
                          timeout=120, env=None if env is None else {**os.environ, **env})


def test_adaptive_batch_halves_on_memory_error_and_gets_the_right_results():
    out = run_example("--budget-mb", "16", "--heap-mb", "0.5", "--rows", "100000")
    assert out.returncode == 0, out.stdout + out.stderr
    caught = int(re.search(r"(\d+) MemoryError\(s\) caught", out.stdout).group(1))
    assert caught >= 1
    assert "BudgetExceededError" in out.stdout and "DeviceHeapExhaustedError" in out.stdout
    assert "results OK" in out.stdout
    assert "kiln memory summary: cpu (limit 16.00 MiB" in out.stdout


def test_adaptive_batch_without_pressure_catches_nothing():
    out = run_example("--budget-mb", "256", "--heap-mb", "16", "--rows", "20000")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 MemoryError(s) caught" in out.stdout and "results OK" in out.stdout


def test_kiln_fault_makes_the_unmodified_example_halve_its_batch_once():
    # The README's KILN_FAULT example: the first batch's scores array (the 3rd ndarray request,
    # after the weights and the batch's rows) is refused, the loop halves once.
    out = run_example("--budget-mb", "256", "--heap-mb", "16", "--rows", "20000",
                      env={"KILN_FAULT": "nth=3,category=ndarray"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 MemoryError(s) caught: DeviceOutOfMemoryError" in out.stdout, out.stdout
    assert "bytes for ndarray)" in out.stdout and "results OK" in out.stdout
