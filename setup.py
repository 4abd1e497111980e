"""Builds the extension kiln._kiln with kiln's CMake build and packages it with the pure-Python
files of bindings/python/kiln (see pyproject.toml for the two commands).

The CMake build directory is KILN_CMAKE_BUILD_DIR, default build/pip in the source tree: it is
configured once (Release, no tests or benchmarks, for the Python running this build) and then
built incrementally, so a second `pip install .` rebuilds only what changed. A directory that is
already configured (for example `build`, made by `make build`) is built as it is configured.
The version is the one in CMakeLists.txt's project(), which CMake also writes to kiln/_version.py.
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE_DIR = Path(__file__).resolve().parent


def cmake_project_version() -> str:
    text = (SOURCE_DIR / "CMakeLists.txt").read_text()
    match = re.search(r"project\(kiln VERSION ([0-9.]+)", text)
    if match is None:
        raise RuntimeError("CMakeLists.txt has no project(kiln VERSION x.y.z)")
    return match.group(1)


class CMakeBuild(build_ext):
    """Builds the CMake target kiln_python and copies its outputs into the package."""

    def build_extension(self, ext: Extension) -> None:
        # Unset or empty: build/pip (an empty value must not mean the source tree itself).
        build_dir = Path(os.environ.get("KILN_CMAKE_BUILD_DIR") or SOURCE_DIR / "build" / "pip").resolve()
        if not (build_dir / "CMakeCache.txt").exists():
            subprocess.check_call([
                "cmake", "-S", str(SOURCE_DIR), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                "-DKILN_BUILD_TESTS=OFF", "-DKILN_BUILD_BENCH=OFF",
                "-DKILN_BUILD_TOOLS=OFF", f"-DKILN_PYTHON={sys.executable}",
            ])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "kiln_python", "-j", jobs])
        built = build_dir / "python" / "kiln"
        # The extension for the Python running this build: a build directory configured for a
        # Python of another ABI has built none of that name.
        extension = built / ("_kiln" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not extension.exists():
            raise RuntimeError(f"{build_dir} has no {extension.name}: it is configured for another "
                               f"Python (its KILN_PYTHON); set KILN_CMAKE_BUILD_DIR to a new directory")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(extension, target)
        shutil.copy2(built / "_version.py", target.parent / "_version.py")
        # The fake GPU drivers, where this build made them (a build with kiln's tests, e.g.
        # KILN_CMAKE_BUILD_DIR=build): beside the package, for kiln.testing.fake_cuda / fake_hip.
        for fake in sorted((built / "_fake").glob("libkiln_fake_*.so")):
            (target.parent / "_fake").mkdir(exist_ok=True)
            shutil.copy2(fake, target.parent / "_fake" / fake.name)  # the library, not the link


# setuptools' own scratch files (build/, *.egg-info) go under build/setuptools, not the source tree.
SETUPTOOLS_DIR = SOURCE_DIR / "build" / "setuptools"
SETUPTOOLS_DIR.mkdir(parents=True, exist_ok=True)

setup(
    version=cmake_project_version(),
    packages=["kiln"],
    package_dir={"kiln": "bindings/python/kiln"},
    # The extension's type stub and the PEP 561 marker: type checkers read the installed package.
    package_data={"kiln": ["py.typed", "_kiln.pyi"]},
    ext_modules=[Extension("kiln._kiln", sources=[])],
    # pytest finds kiln's plugin in an installed kiln (-p kiln.pytest_plugin works without it).
    # Named after the module, so pytest skips it when -p or a conftest has loaded that module.
    entry_points={"pytest11": ["kiln.pytest_plugin = kiln.pytest_plugin"]},
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": str(SETUPTOOLS_DIR)}, "egg_info": {"egg_base": str(SETUPTOOLS_DIR)}},
)
