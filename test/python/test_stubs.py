"""The hand-written stub bindings/python/kiln/_kiln.pyi matches the native module kiln._kiln.

Checked against the module as built: every name the module defines is in the stub and every name
the stub declares is in the module (module level and the members of each class); each stub
function and method has the parameters (names, kinds, defaults) of the signature pybind11 writes
in the native docstring; stub properties are properties; everything the stub declares has a
docstring; and the build (and so the wheel) ships the stub and py.typed next to the module.
"""
import ast
import filecmp
import os
import re
import subprocess
import sys

import pytest

import kiln
import kiln._kiln as native
from conftest import SOURCE_DIR

STUB = os.path.join(SOURCE_DIR, "bindings", "python", "kiln", "_kiln.pyi")
PACKAGE_DIR = os.path.dirname(kiln.__file__)

# Class members every pybind11 class has in its own __dict__ that are not API: the docstring, the
# module name, and pybind11 enum_'s private table of members (dtype.__entries).
PLUMBING = {"__doc__", "__module__", "__entries"}


def is_dunder(name):
    return name.startswith("__") and name.endswith("__")


def is_typing_only(node):
    """Stub definitions that exist only for the type checker: `X: TypeAlias = ...` and
    TypedDict classes (the dict kiln.memory_stats() returns)."""
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.annotation, ast.Name) and node.annotation.id == "TypeAlias"
    if isinstance(node, ast.ClassDef):
        return any(isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases)
    return False


def declared_names(body):
    """name -> node for the functions, classes and annotated names a stub body declares."""
    names = {}
    for node in body:
        if is_typing_only(node):
            continue
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


@pytest.fixture(scope="module")
def stub():
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=STUB)


@pytest.fixture(scope="module")
def stub_names(stub):
    return declared_names(stub.body)


def native_names():
    """Every name kiln._kiln defines, private ones included (kiln.testing uses them)."""
    return {name for name in vars(native) if not is_dunder(name)}


def native_classes():
    return {name: obj for name, obj in vars(native).items() if isinstance(obj, type)}


def test_every_native_name_is_in_the_stub_and_every_stub_name_in_the_module(stub_names):
    missing = native_names() - set(stub_names)
    extra = set(stub_names) - native_names()
    assert not missing, f"kiln._kiln defines names the stub lacks: {sorted(missing)}"
    assert not extra, f"the stub declares names kiln._kiln does not define: {sorted(extra)}"


def test_stub_declares_classes_as_classes_and_functions_as_functions(stub_names):
    for name, node in stub_names.items():
        obj = getattr(native, name)
        if isinstance(node, ast.ClassDef):
            assert isinstance(obj, type), name
        elif isinstance(node, ast.FunctionDef):
            assert callable(obj) and not isinstance(obj, type), name
        else:  # a constant: f32, f64, i32, i64
            assert not callable(obj) or isinstance(obj, native.dtype), name


@pytest.mark.parametrize("class_name", sorted(native_classes()))
def test_class_members_match_both_ways(stub_names, class_name):
    node = stub_names.get(class_name)
    assert isinstance(node, ast.ClassDef), f"the stub lacks class {class_name}"
    members = declared_names(node.body)
    runtime = set(vars(native_classes()[class_name])) - PLUMBING
    missing = runtime - set(members)
    extra = set(members) - runtime
    assert not missing, f"kiln._kiln.{class_name} has members the stub lacks: {sorted(missing)}"
    assert not extra, f"the stub's {class_name} declares members it lacks: {sorted(extra)}"


def is_property(node):
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


@pytest.mark.parametrize("class_name", sorted(native_classes()))
def test_stub_properties_are_native_properties(stub_names, class_name):
    cls = native_classes()[class_name]
    for name, node in declared_names(stub_names[class_name].body).items():
        runtime = vars(cls)[name]
        if isinstance(node, ast.FunctionDef) and is_property(node):
            assert isinstance(runtime, property), f"{class_name}.{name} is no property"
        elif isinstance(node, ast.FunctionDef):
            assert not isinstance(runtime, property), f"{class_name}.{name} is a property"


SIGNATURE = re.compile(r"^(?:1\. )?(?:\w+)?\((?P<params>.*)\)(?: -> .*)?$")


def native_signature(obj):
    """The parameters pybind11 writes in `obj`'s docstring, as an ast.arguments: the first line,
    or the first overload's for functions with kiln's InvalidTypeError overload. None when the
    docstring has no signature."""
    lines = (getattr(obj, "__doc__", None) or "").splitlines()
    if len(lines) > 1 and lines[1] == "Overloaded function.":
        lines = [line for line in lines if line.startswith("1. ")]
    if not lines:
        return None
    match = SIGNATURE.match(lines[0])
    if match is None:
        return None
    return ast.parse(f"def f({match.group('params')}): pass").body[0].args


def default_value(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def describe(args, is_method):
    """(positional parameters, keyword-only parameters), each a list of (name, default), without
    self for methods; defaults as values (... for none)."""
    positional = args.posonlyargs + args.args
    defaults = [...] * (len(positional) - len(args.defaults)) + [default_value(d) for d in args.defaults]
    pos = list(zip((a.arg for a in positional), defaults))
    kw = [(a.arg, ... if d is None else default_value(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if is_method:
        pos = pos[1:]
    return pos, kw, args.vararg is not None, args.kwarg is not None


def stub_functions(stub_names):
    """(qualified name, stub node, native object, is_method) for every function and method."""
    for name, node in stub_names.items():
        if isinstance(node, ast.FunctionDef):
            yield name, node, getattr(native, name), False
        elif isinstance(node, ast.ClassDef):
            cls = getattr(native, name)
            for member, sub in declared_names(node.body).items():
                if isinstance(sub, ast.FunctionDef) and not is_property(sub):
                    yield f"{name}.{member}", sub, vars(cls)[member], True


def test_stub_parameters_match_the_native_signatures(stub_names):
    checked = 0
    for qualname, node, obj, is_method in stub_functions(stub_names):
        native_args = native_signature(obj)
        if native_args is None:
            continue
        want = describe(native_args, is_method)
        got = describe(node.args, is_method)
        assert got == want, f"{qualname}: stub {got} != native {want}"
        checked += 1
    assert checked >= 25  # every function of the module and most methods have a signature


def test_every_stub_declaration_has_a_docstring(stub):
    def docstring_follows(body, i):
        nxt = body[i + 1] if i + 1 < len(body) else None
        return isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)

    def check(body, where):
        for i, node in enumerate(body):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                assert ast.get_docstring(node), f"{where}{node.name} has no docstring"
                if isinstance(node, ast.ClassDef):
                    check(node.body, f"{where}{node.name}.")
            elif (isinstance(node, ast.AnnAssign) and not where and not is_typing_only(node)):
                assert docstring_follows(body, i), f"{ast.unparse(node.target)} has no docstring"

    assert ast.get_docstring(stub)
    check(stub.body, "")


def test_the_package_ships_the_stub_and_py_typed():
    """The build copies them next to the extension (and setup.py ships them in the wheel)."""
    assert os.path.isfile(os.path.join(PACKAGE_DIR, "py.typed"))
    built = os.path.join(PACKAGE_DIR, "_kiln.pyi")
    assert filecmp.cmp(built, STUB, shallow=False), f"{built} differs from {STUB}: rebuild"


def test_error_attributes_are_typed_on_error():
    """Every attribute an exception carries (FIELDS) is declared with its type on kiln.Error, so
    mypy accepts `except kiln.BudgetExceededError as e: e.requested_bytes`; none is extra."""
    from kiln import _errors

    assert set(_errors.Error.__annotations__) == set(_errors.FIELDS)


def test_typed_usage_file_runs():
    """typed_usage.py (what mypy checks in ctest's python_mypy) also runs: the types it states
    are the ones the calls return."""
    script = os.path.join(SOURCE_DIR, "test", "python", "typed_usage.py")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "typed usage OK" in out.stdout
