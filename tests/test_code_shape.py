"""The package's shape: no module of `autotm_py/` over `MAX_FILE_LINES` lines and no function or
method over `MAX_FUNCTION_LINES` (from its ``def`` line to its last: end_lineno - lineno + 1),
read with `ast` from every ``autotm_py/**/*.py``. Complexity is ruff's check (``C90``,
pyproject.toml, at most 12).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autotm_py"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method, nested ones included
    (``outer.inner``, ``Class.method``)."""
    out: list[tuple[str, ast.AST]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                out.append((name, node))
            out += _functions(node, f"{name}.")
        else:
            out += _functions(node, prefix)
    return out


def offenders_in(source: str, where: str) -> dict[str, str]:
    """key -> why, for one module's source (`where`: its path, as keys name it)."""
    found: dict[str, str] = {}
    lines = len(source.splitlines())
    if lines > MAX_FILE_LINES:
        found[where] = f"{where}: {lines} lines (at most {MAX_FILE_LINES})"
    for name, node in _functions(ast.parse(source, filename=where)):
        span = node.end_lineno - node.lineno + 1
        if span > MAX_FUNCTION_LINES:
            found[f"{where}::{name}"] = (f"{where}:{node.lineno}: {name} spans {span} lines "
                                         f"(at most {MAX_FUNCTION_LINES})")
    return found


def offenders() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent).as_posix()
        found.update(offenders_in(path.read_text(encoding="utf-8"), where))
    return found


def test_no_module_or_function_is_too_long():
    found = offenders()
    assert not found, ("too long (split it; docs/developer.md):\n  "
                       + "\n  ".join(sorted(found.values())))


def test_the_reader_names_long_modules_functions_and_methods():
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))  # + the def: one over
    source = (f"def long():\n{body}\n\n"
              f"class C:\n    def short(self):\n        pass\n\n"
              f"    def method(self):\n        def inner():\n"
              + "\n".join(f"        {line}" for line in body.splitlines()) + "\n")
    found = offenders_in(source, "m.py")
    assert set(found) == {"m.py::long", "m.py::C.method", "m.py::C.method.inner"}
    assert f"spans {MAX_FUNCTION_LINES + 1} lines" in found["m.py::long"]
    padded = "\n" * MAX_FILE_LINES + "x = 1\n"
    assert set(offenders_in(padded, "big.py")) == {"big.py"}
    assert offenders_in("\n" * (MAX_FILE_LINES - 1) + "x = 1\n", "ok.py") == {}
