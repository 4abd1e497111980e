"""kiln.pytest_plugin, run as a user would (`pytest -p kiln.pytest_plugin`, in a subprocess on a
scratch test file): the kiln_backend fixture runs a test once per --kiln-backend; its leak check
fails a test that leaves memory held, naming the category; the kiln_sweep marker passes a test
that keeps the contract and fails one that turns an out-of-memory error into another."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

import kiln
from conftest import SOURCE_DIR

USER_TESTS = textwrap.dedent('''
    import pytest
    import kiln

    kept = []

    def test_clean(kiln_backend):
        a = kiln.ndarray(kiln.f32, 1024)
        a.free()

    def test_leaks(kiln_backend):
        kept.append(kiln.ndarray(kiln.f32, 1024))  # never freed

    @pytest.mark.kiln_sweep
    def test_sweep_keeps_the_contract(kiln_backend):
        a = kiln.ndarray(kiln.f32, 16)
        try:
            kiln.fill(a, 1)
        finally:
            a.free()

    def test_reinit_clean(kiln_backend):
        a = kiln.ndarray(kiln.f32, 1024)
        kiln.init(arch=kiln_backend)
        a.free()  # freed after its executor was replaced: nothing left

    def test_reinit_keeps_an_array(kiln_backend):
        kept.append(kiln.ndarray(kiln.f32, 1024))  # held by the executor replaced below
        kiln.init(arch=kiln_backend)

    def test_user_kernel_compiled_here(kiln_backend):
        k = kiln.ElementwiseKernel("T x", "T z", "z = x * 2", "double_it")
        k(kiln.zeros((4,))).free()  # its code stays in kiln's compile cache: not a leak

    @pytest.mark.kiln_sweep
    def test_sweep_wrong_catch(kiln_backend):
        try:
            kiln.ndarray(kiln.f32, 16).free()
        except MemoryError:
            raise RuntimeError("hidden out-of-memory")
''')


def run_pytest(tmp_path, *args, tests=USER_TESTS, import_dirs=()):
    """Runs pytest with kiln's plugin on `tests` (written to tmp_path/test_user.py), in a
    subprocess; `import_dirs` are put on its PYTHONPATH (after the kiln under test)."""
    (tmp_path / "test_user.py").write_text(tests)
    env = dict(os.environ)
    # The scratch run starts in tmp_path: the kiln under test first, by absolute path (a relative
    # PYTHONPATH such as build/python would not be found from there).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    paths = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([package_root, *import_dirs] + paths)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "kiln.pytest_plugin", "-p", "no:cacheprovider",
         "-rA", "-q", str(tmp_path / "test_user.py"), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def outcomes(stdout, name):
    """The -rA summary words of test `name`: {"PASSED", "ERROR"} for a call that passed and a
    teardown that failed."""
    return {line.split()[0] for line in stdout.splitlines()
            if line.split()[:1] and line.split()[0] in ("PASSED", "FAILED", "ERROR")
            and line.split()[1].endswith("::" + name)}


def test_the_plugin_runs_each_backend_checks_leaks_and_sweeps(tmp_path):
    done = run_pytest(tmp_path, "--kiln-backend", "cpu", "--kiln-backend", "mock")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    for backend in ("cpu", "mock"):
        assert outcomes(out, f"test_clean[{backend}]") == {"PASSED"}, out
        assert outcomes(out, f"test_sweep_keeps_the_contract[{backend}]") == {"PASSED"}, out
        assert "ERROR" in outcomes(out, f"test_leaks[{backend}]"), out  # its teardown failed
        assert outcomes(out, f"test_sweep_wrong_catch[{backend}]") == {"FAILED"}, out
        # Its leak is on the executor it replaced: the arrays still alive are counted instead.
        assert "ERROR" in outcomes(out, f"test_reinit_keeps_an_array[{backend}]"), out
        assert (f"kiln leak: the test replaced the {backend} executor (kiln.init) and left 4096 "
                f"bytes of kiln arrays alive and not freed" in out), out
        assert outcomes(out, f"test_reinit_clean[{backend}]") == {"PASSED"}, out
        assert outcomes(out, f"test_user_kernel_compiled_here[{backend}]") == {"PASSED"}, out
    assert "kiln leak: the test left held on mock: ndarray 4096 bytes" in out
    assert "kiln.testing.SweepError" in out and "raised RuntimeError: hidden out-of-memory" in out


def test_an_unavailable_backend_is_skipped_saying_why(tmp_path):
    env_driver = os.environ.pop("KILN_CUDA_DRIVER", None)
    try:
        os.environ["KILN_CUDA_DRIVER"] = str(tmp_path / "no-such-libcuda.so")
        done = run_pytest(tmp_path, "--kiln-backend", "cuda", "-k", "test_clean")
    finally:
        os.environ.pop("KILN_CUDA_DRIVER")
        if env_driver is not None:
            os.environ["KILN_CUDA_DRIVER"] = env_driver
    out = done.stdout + done.stderr
    assert done.returncode == 0, out  # all skipped
    assert "1 skipped" in out and "kiln backend cuda is not available here" in out, out


def test_an_installed_entry_point_and_dash_p_load_the_plugin_once(tmp_path):
    # An installed kiln registers the plugin through setup.py's pytest11 entry point; the
    # documented `-p kiln.pytest_plugin` (and `pytest_plugins = ["kiln.pytest_plugin"]`) must
    # still work beside it: pytest skips an entry point whose name is a plugin already loaded,
    # so the entry point is named after the module. Here the entry point is "installed" as a
    # dist-info folder on the scratch run's path.
    with open(os.path.join(SOURCE_DIR, "setup.py")) as f:
        entry_point = re.search(r'"pytest11": \["([^"]+)"\]', f.read()).group(1)
    dist_info = tmp_path / "site" / "kiln_plugin_entry-0.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-plugin-entry\nVersion: 0.0\n")
    (dist_info / "entry_points.txt").write_text(f"[pytest11]\n{entry_point}\n")
    done = run_pytest(tmp_path, "-k", "test_clean", import_dirs=(str(tmp_path / "site"),))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert outcomes(out, "test_clean[cpu]") == {"PASSED"}, out


def test_a_device_ordinal_is_taken_and_a_device_named_twice_runs_once(tmp_path):
    # "cuda:1" as kiln.init takes it (skipped here: no such device on the missing driver);
    # "cpu" given twice, and "cuda" beside "cuda:0", each run once.
    env_driver = os.environ.pop("KILN_CUDA_DRIVER", None)
    try:
        os.environ["KILN_CUDA_DRIVER"] = str(tmp_path / "no-such-libcuda.so")
        done = run_pytest(tmp_path, "--kiln-backend", "cpu", "--kiln-backend", "cpu",
                          "--kiln-backend", "cuda", "--kiln-backend", "cuda:0",
                          "--kiln-backend", "cuda:1", "-k", "test_clean")
    finally:
        os.environ.pop("KILN_CUDA_DRIVER")
        if env_driver is not None:
            os.environ["KILN_CUDA_DRIVER"] = env_driver
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "1 passed, 2 skipped" in out, out  # cpu once; cuda (= cuda:0) once, cuda:1 once
    assert "kiln backend cuda:1 is not available" in out, out
    assert "kiln backend cuda is not available" in out, out  # the first spelling of cuda:0
    assert "kiln backend cuda:0" not in out, out


@pytest.mark.parametrize("args, named", [
    (("--kiln-budget-mb", "0"), "--kiln-budget-mb 0: the budget must be at least 1 MiB"),
    (("--kiln-budget-mb", "-1"), "--kiln-budget-mb -1: the budget must be at least 1 MiB"),
    (("--kiln-backend", "gpu"), "--kiln-backend 'gpu': unknown backend 'gpu'"),
    (("--kiln-backend", "cuda:x"), "--kiln-backend 'cuda:x': 'cuda:x' is not a device name"),
])
def test_a_malformed_option_stops_the_run_before_any_test(tmp_path, args, named):
    done = run_pytest(tmp_path, *args)
    out = done.stdout + done.stderr
    assert done.returncode == 4, out  # pytest's usage error: no test ran, none errored
    assert named in out, out
    assert "passed" not in out and "test_clean" not in out, out
