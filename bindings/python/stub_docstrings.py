"""Build step: the docstrings of kiln/_kiln.pyi as a C++ header, so that help(kiln.fill) in the
running module shows the text that mypy and IDEs read from the stub (one source for both).

Usage: stub_docstrings.py STUB.pyi OUT.h

The header defines `kiln::python::doc(name)`, a consteval lookup by the stub's name of a function
("fill"), a class ("ndarray") or a member ("ndarray.shape", "dtype.__eq__"): naming a docstring
the stub does not have is a compile error, so a binding cannot drift from its stub.
"""

import ast
import sys

_DELIMITER = "kilndoc"


def signature(node: ast.FunctionDef | ast.ClassDef) -> str:
    """A function's or method's signature as the stub writes it, and a blank line; "" for a
    class or a property (pybind11's own signature lines are turned off: they name every
    argument `handle`)."""
    if isinstance(node, ast.ClassDef):
        return ""
    if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
        return ""
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{node.name}({ast.unparse(node.args)}){returns}\n\n"


def docstrings(tree: ast.Module) -> list[tuple[str, str]]:
    """(qualified name, signature and cleaned docstring) of every documented function, class
    and member."""
    found: list[tuple[str, str]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            text = ast.get_docstring(node, clean=True)
            if text:
                found.append((prefix + node.name, signature(node) + text))
            if isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")

    visit(tree.body, "")
    return found


def header(entries: list[tuple[str, str]], stub_name: str) -> str:
    lines = [
        f"// Generated from {stub_name} by bindings/python/stub_docstrings.py: do not edit.",
        "#pragma once",
        "",
        "#include <string_view>",
        "",
        "namespace kiln::python {",
        "",
        "struct StubDocstring {",
        "  std::string_view name;",
        "  const char *text;",
        "};",
        "",
        "inline constexpr StubDocstring kStubDocstrings[] = {",
    ]
    for name, text in entries:
        if f"){_DELIMITER}\"" in text:
            raise SystemExit(f"{stub_name}: the docstring of {name} contains ){_DELIMITER}\"")
        lines.append(f'    {{"{name}", R"{_DELIMITER}({text}){_DELIMITER}"}},')
    lines += [
        "};",
        "",
        "/// The stub's docstring of `name` (\"fill\", \"ndarray\", \"ndarray.shape\"); a name the",
        "/// stub does not document does not compile.",
        "consteval const char *doc(std::string_view name) {",
        "  for (const StubDocstring &entry : kStubDocstrings)",
        "    if (entry.name == name) return entry.text;",
        "  throw \"no docstring of this name in _kiln.pyi\";",
        "}",
        "",
        "}  // namespace kiln::python",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    stub_path, out_path = argv[1], argv[2]
    with open(stub_path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=stub_path)
    text = header(docstrings(tree), stub_path.rsplit("/", 1)[-1])
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
