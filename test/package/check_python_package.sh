#!/usr/bin/env bash
# The Python package as a user installs it, on this machine's Debian Python (no package index):
#   1. `pip install --no-build-isolation .` into a fresh venv (--system-site-packages, for numpy),
#      which configures and builds kiln's CMake build from scratch (KILN_CMAKE_BUILD_DIR);
#   2. `python3 -m build --no-isolation --wheel`, and that wheel installed into a second venv;
# each imported from / (not the source tree), with kiln.__version__ equal to CMakeLists.txt's
# project(VERSION) and one operation run, and type-checked by mypy from the installed package
# (its py.typed and the stub _kiln.pyi, PEP 561). ctest "python_package" runs it; $1 is kiln's build dir
# (for the scratch space), $2 the source tree.
set -euo pipefail
build=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
python=${KILN_PYTHON:-/usr/bin/python3}
scratch="$build/python-package-test"
rm -rf "$scratch" && mkdir -p "$scratch"
export KILN_CMAKE_BUILD_DIR="$scratch/cmake" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
expected=$(sed -n 's/^project(kiln VERSION \([0-9.]*\).*/\1/p' "$source_dir/CMakeLists.txt")

check_venv() {  # $1: venv; imports kiln from / and checks the version and one operation
  (cd / && "$1/bin/python" - "$expected" "$1" <<'PY'
import sys
import numpy as np
import kiln
expected, venv = sys.argv[1], sys.argv[2]
assert kiln.__version__ == expected, (kiln.__version__, expected)
assert kiln.__file__.startswith(venv), kiln.__file__
a = kiln.from_numpy(np.arange(10, dtype=np.float32))
assert kiln.reduce_sum(a) == 45.0
try:
    kiln.init(arch="cpu", budget_bytes=64 << 20)
    kiln.ndarray(kiln.f32, (1 << 26,))
    raise SystemExit("a 256 MiB array under a 64 MiB budget was not refused")
except kiln.BudgetExceededError as e:
    assert isinstance(e, MemoryError)
from importlib.metadata import entry_points  # pytest finds kiln's plugin in the install
assert [e.value for e in entry_points(group="pytest11") if e.name == "kiln.pytest_plugin"] == ["kiln.pytest_plugin"]
import kiln.pytest_plugin  # noqa: F401
import kiln.testing  # built without tests, the package has no fake driver: a named error
try:
    with kiln.testing.fake_cuda():
        raise SystemExit("kiln.testing.fake_cuda found a fake driver in a build without tests")
except kiln.NotSupportedError as e:
    assert "KILN_FAKE_CUDA_LIBRARY" in str(e), str(e)
print("kiln", kiln.__version__, "from", kiln.__file__)
PY
  )
}

check_typed() {  # $1: venv; mypy --strict reads the installed package's types (no MYPYPATH)
  (cd / && "$python" -m mypy --strict --no-incremental --python-executable "$1/bin/python" -c '
import kiln
try:
    kiln.ndarray(kiln.f32, (1 << 26,))
except kiln.BudgetExceededError as e:
    requested: int = e.requested_bytes
total: float = kiln.reduce_sum(kiln.ndarray(kiln.f32, 3))
')
}

"$python" -m venv --system-site-packages "$scratch/venv-pip"
(cd "$source_dir" && "$scratch/venv-pip/bin/pip" install --no-build-isolation --no-index --no-deps . \
  > "$scratch/pip.log" 2>&1) || { tail -40 "$scratch/pip.log"; exit 1; }
check_venv "$scratch/venv-pip"
check_typed "$scratch/venv-pip"

(cd "$source_dir" && "$python" -m build --no-isolation --wheel --outdir "$scratch/dist" . \
  > "$scratch/wheel.log" 2>&1) || { tail -40 "$scratch/wheel.log"; exit 1; }
"$python" -m venv --system-site-packages "$scratch/venv-wheel"
"$scratch/venv-wheel/bin/pip" install --no-index --no-deps "$scratch"/dist/kiln-"$expected"-*.whl > /dev/null
check_venv "$scratch/venv-wheel"
check_typed "$scratch/venv-wheel"
echo "python package: ok"
