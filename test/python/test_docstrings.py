"""help() on the native module shows the docstrings of its stub, kiln/_kiln.pyi (the build
generates them from it: bindings/python/stub_docstrings.py), so the two cannot drift apart."""

import ast
import inspect
import pathlib

import pytest

import kiln
from kiln import _kiln

# Members pybind11's enum_ makes for kiln.dtype itself; the stub documents them for mypy and
# IDEs, but their runtime docstrings are pybind11's.
_PYBIND11_ENUM_MEMBERS = {"dtype.name", "dtype.value", "dtype.__index__", "dtype.__int__",
                          "dtype.__hash__", "dtype.__getstate__", "dtype.__repr__"}


def _stub_docstrings() -> dict[str, str]:
    stub = pathlib.Path(kiln.__file__).with_name("_kiln.pyi")
    found: dict[str, str] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                text = ast.get_docstring(node, clean=True)
                private = not prefix and node.name.startswith("_")  # _push_fault, _MemoryStats
                if text and not private:
                    found[prefix + node.name] = text
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    visit(node.body, prefix + node.name + ".")

    visit(ast.parse(stub.read_text(encoding="utf-8")).body, "")
    return found


def _native(name: str) -> object:
    owner: object = _kiln
    for part in name.split("."):
        owner = inspect.getattr_static(owner, part) if isinstance(owner, type) else getattr(owner, part)
    return owner


_DOCUMENTED = sorted(set(_stub_docstrings()) - _PYBIND11_ENUM_MEMBERS)
# kiln.ndarray.__new__ is CPython's wrapper of the type's tp_new, with CPython's docstring: the
# class's docstring carries the stub's __new__ text, as numpy's ndarray documents its constructor.
_DOCUMENTED_ON = {"ndarray.__new__": "ndarray"}


@pytest.mark.parametrize("name", _DOCUMENTED)
def test_the_native_docstring_is_the_stubs(name):
    native_doc = inspect.cleandoc(_native(_DOCUMENTED_ON.get(name, name)).__doc__ or "")
    assert _stub_docstrings()[name] in native_doc, f"help(kiln._kiln.{name}) lacks the stub's text"


def test_every_public_native_function_and_class_is_documented():
    stub = _stub_docstrings()
    public = [n for n in dir(_kiln) if not n.startswith("_") and callable(getattr(_kiln, n))]
    # The error classes are kiln's Python ones (kiln/_errors.py), documented there.
    missing = [n for n in public if n not in stub and not n.endswith("Error")]
    assert missing == []


def test_a_method_docstring_starts_with_the_stubs_signature():
    assert kiln.fill.__doc__.startswith("fill(out: ndarray, value: _Scalar) -> None\n\n")
    assert kiln.ndarray.free.__doc__.startswith("free(self) -> None\n\n")
