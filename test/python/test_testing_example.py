"""examples/testing/batching.py, the library a user copies, against two broken variants of it
(test/python/batching_variants.py): one that leaks the batch it failed on and one that turns the
out-of-memory error into another exception. kiln.testing.sweep catches both, naming what broke;
so does the pytest plugin, run as a user runs it: its leak check fails the test that leaked, its
kiln_sweep marker fails the test whose error was wrongly caught. The correct function passes
both. (The example's own tests run as the ctest test python_example_tests.)"""
import os
import sys
import textwrap

import numpy as np
import pytest

import kiln
import kiln.testing
from conftest import SOURCE_DIR
from test_pytest_plugin import outcomes, run_pytest

EXAMPLE_DIR = os.path.join(SOURCE_DIR, "examples", "testing")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, EXAMPLE_DIR)
import batching  # noqa: E402  (examples/testing)
import batching_variants as variants  # noqa: E402

rng = np.random.default_rng(1)
DATA, WEIGHTS = rng.standard_normal((64, 4)), rng.standard_normal((4, 2))


def test_the_correct_function_passes_the_sweep(monkeypatch):
    report = kiln.testing.sweep(batching.total_score, DATA, WEIGHTS, batch_rows=16)
    assert report.allocations == len(report.runs) > 4 and not report.broken


def test_the_sweep_catches_the_leaking_variant_naming_the_category(monkeypatch):
    monkeypatch.setattr(batching, "score_batch", variants.leaking_score_batch)
    with pytest.raises(kiln.testing.SweepError) as caught:
        kiln.testing.sweep(batching.total_score, DATA, WEIGHTS, batch_rows=16)
    variants.kept.clear()
    broken = caught.value.report.broken
    assert broken and all(r.raised is None and r.leaked_bytes.get("ndarray", 0) > 0
                          for r in broken)  # absorbed by halving, but the batch stayed held
    assert "left held: ndarray" in str(caught.value)


def test_the_sweep_catches_the_wrongly_catching_variant(monkeypatch):
    monkeypatch.setattr(batching, "score_batch", variants.wrapping_score_batch)
    with pytest.raises(kiln.testing.SweepError) as caught:
        kiln.testing.sweep(batching.total_score, DATA, WEIGHTS, batch_rows=16)
    broken = caught.value.report.broken
    assert broken and all(r.raised == "RuntimeError" for r in broken)
    assert "raised RuntimeError: batch of 16 rows failed" in str(caught.value)


USER_TESTS = textwrap.dedent('''
    import numpy as np
    import pytest

    import kiln
    import kiln.testing
    import batching
    import batching_variants as variants

    DATA = np.random.default_rng(1).standard_normal((64, 4))
    WEIGHTS = np.random.default_rng(2).standard_normal((4, 2))

    @pytest.fixture(params=["correct", "leaking", "wrapping"])
    def variant(request, monkeypatch):
        monkeypatch.setattr(batching, "score_batch",
                            getattr(variants, f"{request.param}_score_batch", batching.score_batch))
        return request.param

    def test_halves_on_a_refused_scores_array(kiln_backend, variant):
        with kiln.testing.inject("nth=3,category=ndarray"):  # weights, rows, then scores
            total = batching.total_score(DATA, WEIGHTS, batch_rows=16)
        assert total == pytest.approx((DATA @ WEIGHTS).sum())

    @pytest.mark.kiln_sweep
    def test_sweep(kiln_backend, variant):
        batching.total_score(DATA, WEIGHTS, batch_rows=16)
''')


def test_the_plugin_catches_the_leak_and_the_wrong_catch(tmp_path):
    done = run_pytest(tmp_path, "--kiln-backend", "cpu", "--kiln-backend", "mock",
                      tests=USER_TESTS, import_dirs=(EXAMPLE_DIR, HERE))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    for backend in ("cpu", "mock"):
        def seen(name, variant):
            return outcomes(out, f"{name}[{variant}-{backend}]")
        assert seen("test_halves_on_a_refused_scores_array", "correct") == {"PASSED"}, out
        assert seen("test_sweep", "correct") == {"PASSED"}, out
        # The leak check: the test body passed (halving absorbed the fault), its teardown failed.
        assert seen("test_halves_on_a_refused_scores_array", "leaking") == {"PASSED", "ERROR"}, out
        assert "FAILED" in seen("test_sweep", "leaking"), out
        # The wrong catch: a RuntimeError where a MemoryError was due.
        assert seen("test_halves_on_a_refused_scores_array", "wrapping") == {"FAILED"}, out
        assert seen("test_sweep", "wrapping") == {"FAILED"}, out
        assert f"kiln leak: the test left held on {backend}: ndarray" in out
    assert "raised RuntimeError: batch of 16 rows failed" in out
