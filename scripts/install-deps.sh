#!/usr/bin/env bash
# Installs the Debian packages kiln's build and tests need, only those that are missing.
# Idempotent and non-interactive; run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake make pkg-config
  # LLVM 19, the one toolchain (host JIT, NVPTX, AMDGPU): llvm-19-dev (find_package(LLVM 19),
  # libLLVM, llc, llvm-readobj), clang-19 (the device-runtime bitcode), lld-19 (ld.lld links HSACO);
  # the libraries LLVM 19's CMake package and static libraries name (zlib, zstd, libxml2, z3,
  # ffi, edit)
  # liblld-19-dev: lld as a library, linking AMDGPU user kernels into HSACO at run time
  llvm-19-dev clang-19 lld-19 liblld-19-dev zlib1g-dev libzstd-dev libxml2-dev libz3-dev libffi-dev libedit-dev
  libfmt-dev catch2 libbenchmark-dev
  libopenblas-pthread-dev  # kiln-matmul-bench's baseline: OpenBLAS sgemm/dgemm (that program only)
  libre2-dev  # kiln-ops --filter: linear-time regex matching (std::regex recursed and crashed)
  libcli11-dev nlohmann-json3-dev  # kiln-ops: its command line (CLI11), its JSON report
  rocm-device-libs  # ROCm's ocml: the math AMDGPU user kernels link at run time (tanh, float64 exp, ...)
  libamdhip64-dev  # the real HIP runtime (no GPU here): tests show --backend amdgpu is NotSupported
  pybind11-dev python3-dev python3-pytest python3-numpy python3-hypothesis
  libdlpack-dev  # <dlpack/dlpack.h>: ndarray.__dlpack__ and kiln.from_dlpack
  # the Python package built and installed as a user would (pyproject.toml, setup.py)
  python3-setuptools python3-wheel python3-pip python3-venv python3-build
  python3-mypy  # ctest python_mypy: mypy --strict over the stubs, examples and typed usage
  python3-sphinx python3-myst-parser  # make docs and ctest docs_html: the docs/ site
  python3-distributed  # kiln.dask: Dask's distributed (2022.12 on Debian 12), its tests and example
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
