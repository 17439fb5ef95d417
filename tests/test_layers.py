"""The package's layering, read from its own imports (docs/developer.md, "Layers").

Every import of every module (top level, inside functions, under TYPE_CHECKING) is read with
`ast`. A module may import its own unit, units earlier on its own floor, and anything on a
lower floor; on the stage floor the stages are independent (profiling may run the executor:
profiling -> runtime is the one edge between them). Imports inside functions are only for
deferring torch, matplotlib or juliacall (directly or through a module that imports one of them
at its top), and the modules form no import cycle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotm_py"

# Floors, bottom first; each floor lists its units in the order they may import each other.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("errors", "fileio", "units", "config")),
    ("values", ("ir", "memory", "costs", "plan", "interpreter", "machine", "arena")),
    ("kernels", ("kernels",)),
    ("stages", ("frontend", "runtime", "profiling", "planning", "report", "julia")),
    ("composition", ("pipeline",)),
    ("api", ("api",)),
    ("faces", ("bench", "cli", "__main__")),
)
INDEPENDENT_FLOORS = {"stages"}  # units of these floors import each other only as listed
ALLOWED_BETWEEN = {("profiling", "runtime")}  # in-context profiling runs the executor
LAZY_ONLY = ("torch", "matplotlib", "juliacall")
# also deferred: PuLP, so that simulating and running plans works where it is not installed
DEFERRED = (*LAZY_ONLY, "pulp")
ROOT = "autotm_py"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _scope(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    """"top", "function" or "typing" (under `if TYPE_CHECKING:`) for an import node."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return "function"
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return "typing"
    return "top"


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    if node.module is None or prefix == ROOT:  # `from pkg import submodule`
        return [f"{prefix}.{a.name}" for a in node.names]
    return [prefix]


def read_imports() -> list[tuple[str, str, str, int]]:
    """(importing module, imported module, scope, line) for every import of the package."""
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, module, path.name == "__init__.py"):
                    rows.append((module, target, _scope(node, parents), node.lineno))
    return rows


def _known(modules: set[str], target: str) -> str | None:
    """The package module an import names (`pkg.mod.name` -> `pkg.mod`), or None."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


IMPORTS = read_imports()
MODULES = {row[0] for row in IMPORTS} | {module_name(p) for p in PACKAGE.rglob("*.py")}
RANK = {unit: (floor, i, position) for i, (floor, units) in enumerate(FLOORS)
        for position, unit in enumerate(units)}


def _edge_allowed(src: str, dst: str) -> bool:
    if src == dst or dst == ROOT:
        return src == dst
    floor_a, level_a, pos_a = RANK[src]
    _, level_b, pos_b = RANK[dst]
    if level_a != level_b:
        return level_b < level_a
    if floor_a in INDEPENDENT_FLOORS:
        return (src, dst) in ALLOWED_BETWEEN
    return pos_b < pos_a


def test_every_unit_of_the_package_is_on_a_floor():
    units = {unit_of(m) for m in MODULES} - {ROOT}
    assert units <= set(RANK), f"put {sorted(units - set(RANK))} on a floor (docs/developer.md)"


def test_no_import_points_up_the_layers():
    upward = []
    for src, target, scope, line in IMPORTS:
        dst = _known(MODULES, target)
        if dst is None or unit_of(src) == ROOT:
            continue
        if not _edge_allowed(unit_of(src), unit_of(dst)):
            upward.append(f"{src}:{line} imports {dst} ({scope})")
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def _heavy_modules() -> set[str]:
    """Package modules that import torch, matplotlib, juliacall or PuLP at their top, directly
    or through other package modules."""
    top: dict[str, set[str]] = defaultdict(set)
    heavy: set[str] = set()
    for src, target, scope, _ in IMPORTS:
        if scope != "top":
            continue
        if target.split(".")[0] in DEFERRED:
            heavy.add(src)
        dst = _known(MODULES, target)
        if dst is not None:
            top[src].add(dst)
    changed = True
    while changed:
        changed = False
        for src, dsts in top.items():
            if src not in heavy and dsts & heavy:
                heavy.add(src)
                changed = True
    return heavy


def test_imports_inside_functions_only_defer_heavy_libraries():
    heavy = _heavy_modules()
    needless = []
    for src, target, scope, line in IMPORTS:
        if scope != "function" or target.split(".")[0] in DEFERRED:
            continue
        dst = _known(MODULES, target)
        if target.split(".")[0] == ROOT and dst not in heavy:
            needless.append(f"{src}:{line} imports {target} inside a function")
    assert not needless, ("import these at the top (only torch, matplotlib, juliacall and PuLP "
                          "are deferred):\n" + "\n".join(needless))


def test_modules_form_no_import_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    for src, target, scope, _ in IMPORTS:
        dst = _known(MODULES, target)
        if scope != "typing" and dst is not None and dst != src:
            graph[src].add(dst)
    # a package's __init__ importing its own submodules is how packages are built
    graph = {s: {d for d in ds if not (s == ROOT or d.startswith(s + "."))}
             for s, ds in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [module])):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_layer_table_in_the_developer_guide_matches():
    guide = (PACKAGE.parent / "docs" / "developer.md").read_text()
    for floor, units in FLOORS:
        line = next((ln for ln in guide.splitlines() if ln.startswith(f"| {floor} |")), None)
        assert line is not None, f"docs/developer.md has no row for the {floor} floor"
        for unit in units:
            assert f"`{unit}" in line, f"docs/developer.md: {unit} is not on the {floor} row"


def test_simulating_and_running_plans_need_no_pulp():
    """The GPU machine has no PuLP: the API, the pipeline and the executor import without it
    (`planning/solve.py` imports the formulation and the solvers where it solves)."""
    import subprocess
    import sys

    code = ("import sys, autotm_py.api, autotm_py.pipeline, autotm_py.runtime.simulate, "
            "autotm_py.profiling.in_context; print('pulp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_planning_and_the_cli_load_no_heavy_library():
    """`import autotm_py`, `autotm --help` and planning stay free of torch and matplotlib."""
    import subprocess
    import sys

    code = ("import sys, autotm_py.api, autotm_py.pipeline, autotm_py.bench, autotm_py.cli;"
            "from autotm_py.cli import _register_commands; _register_commands();"
            f"print([m for m in {LAZY_ONLY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", f"loaded at import: {out}"
