"""The package's layering, read from its own imports (docs/developer.md, "Layers").

Every import of every module (top level, inside functions, under TYPE_CHECKING) is read with
`ast`. A module may import its own unit, units earlier on its own floor, and anything on a
lower floor; on the stage floor the stages are independent (profiling may run the executor:
profiling -> runtime is the one edge between them). Imports inside functions are only for
deferring torch, matplotlib or juliacall (directly or through a module that imports one of them
at its top), and the modules form no import cycle.

Each stage package declares its public names (`__all__`, imported lazily by a module
`__getattr__`, so that importing a stage loads no torch or PuLP). The faces (cli/, bench/,
__main__) import `api`, `pipeline`, their own modules, the single-file ground and values modules,
and from a package below them (a stage, `ir`, `memory`, `kernels`; `julia` counts as one) or
another face only the names that the package lists in `__all__`, from the package itself.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotm_py"

# Floors, bottom first; each floor lists its units in the order they may import each other.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("errors", "fileio", "units", "exports", "options", "config")),
    ("values", ("ir", "memory", "costs", "plan", "interpreter", "machine", "arena")),
    ("kernels", ("kernels",)),
    ("stages", ("frontend", "runtime", "profiling", "planning", "report", "julia")),
    ("composition", ("workload", "fitting", "pipeline")),
    ("api", ("api", "trainer")),
    ("faces", ("bench", "cli", "__main__")),
)
INDEPENDENT_FLOORS = {"stages"}  # units of these floors import each other only as listed
ALLOWED_BETWEEN = {("profiling", "runtime")}  # in-context profiling runs the executor
LAZY_ONLY = ("torch", "matplotlib", "juliacall")
# also deferred: PuLP, so that simulating and running plans works where it is not installed
DEFERRED = (*LAZY_ONLY, "pulp")
ROOT = "autotm_py"
FACES = dict(FLOORS)["faces"]
# a face imports these units' modules whole, and any of their public names
OPEN_FLOORS = ("ground", "values", "composition", "api")


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


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p) for p in FILES}


def _init_file(module: str) -> Path:
    return PACKAGE.parent.joinpath(*module.split("."), "__init__.py")


@functools.cache
def lazy_exports(package: str) -> dict[str, str]:
    """A package's lazy exports (`_EXPORTS` in its `__init__`: public name -> module that
    defines it), read with `ast`; {} for a module that is not a package or has none."""
    path = _init_file(package)
    if not path.exists():
        return {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "_EXPORTS"):
            return dict(ast.literal_eval(node.value))
    return {}


def _prefix(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of the module a `from ... import` reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _aliases(node: ast.Import | ast.ImportFrom, module: str,
             is_package: bool) -> list[tuple[str, str | None]]:
    """(module, name) per imported name: `import a.b` -> ("a.b", None), `from a.b import c`
    -> ("a.b", "c")."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    prefix = _prefix(node, module, is_package)
    return [(prefix, a.name) for a in node.names]


def _defining_module(package: str, name: str) -> str:
    """`from package import name`: the submodule `name`, else the module that a lazy export of
    the package comes from, else the package itself (an attribute of its `__init__`)."""
    if f"{package}.{name}" in MODULES:
        return f"{package}.{name}"
    return lazy_exports(package).get(name, package)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    prefix = _prefix(node, module, is_package)
    if node.module is None or prefix == ROOT:  # `from pkg import submodule`
        return [f"{prefix}.{a.name}" for a in node.names]
    if prefix.split(".")[0] != ROOT:
        return [prefix]
    # `from autotm_py.planning import SolveControl` reads planning/control.py (a lazy export),
    # `from autotm_py.planning import solve` the submodule, `from autotm_py.ir import Kernel`
    # the package's __init__
    return list(dict.fromkeys(_defining_module(prefix, a.name) for a in node.names))


def _import_nodes(paths: list[Path]):
    """(module, import node, scope, is_package) for every import of the files."""
    for path in paths:
        module = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield module, node, _scope(node, parents), path.name == "__init__.py"


def read_imports() -> list[tuple[str, str, str, int]]:
    """(importing module, imported module, scope, line) for every import of the package."""
    return [(module, target, scope, node.lineno)
            for module, node, scope, is_package in _import_nodes(FILES)
            for target in _targets(node, module, is_package)]


def _known(modules: set[str], target: str) -> str | None:
    """The package module an import names (`pkg.mod.name` -> `pkg.mod`), or None."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


IMPORTS = read_imports()
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
    code = ("import sys, autotm_py.api, autotm_py.pipeline, autotm_py.runtime.simulate, "
            "autotm_py.profiling.in_context; print('pulp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_planning_and_the_cli_load_no_heavy_library():
    """`import autotm_py`, `autotm --help` and planning stay free of torch and matplotlib."""
    code = ("import sys, autotm_py.api, autotm_py.pipeline, autotm_py.bench, autotm_py.cli;"
            "from autotm_py.cli import _register_commands; _register_commands();"
            f"print([m for m in {LAZY_ONLY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", f"loaded at import: {out}"


# --- the faces import api, pipeline and the public names of the packages below them ---------

def _is_package(module: str) -> bool:
    return _init_file(module).exists()


def _floor_of(unit: str) -> str:
    return RANK[unit][0]


@functools.cache
def public_names(module: str) -> frozenset[str]:
    """A package's (or `julia`'s) public names: its `__all__`, or its names without an
    underscore where it has none."""
    loaded = importlib.import_module(module)
    names = getattr(loaded, "__all__", None)
    if names is None:
        names = [n for n in vars(loaded) if not n.startswith("_")]
    return frozenset(names)


def face_violation(src: str, module: str, name: str | None) -> str | None:
    """Why the face module `src` may not import `name` from `module` (`import module` when name
    is None), or None where it may."""
    if module.split(".")[0] != ROOT:
        return None
    if name is not None and f"{module}.{name}" in MODULES:  # `from pkg import submodule`
        module, name = f"{module}.{name}", None
    unit = unit_of(module)
    if unit == unit_of(src):
        return None
    if unit == ROOT:
        return (f"imports {name or 'the package'} from {ROOT}: import it from the module that "
                "defines it (api, ...)")
    top = f"{ROOT}.{unit}"
    if _floor_of(unit) in OPEN_FLOORS and not _is_package(top):
        if name is not None and name.startswith("_"):
            return f"imports the private name {name} of {module}"
        return None
    if name is None:
        return (f"imports the module {module}: import the names it needs from {top} "
                "(listed in its __all__)")
    if module != top:
        listed = "" if name in public_names(top) else " (add it to its __all__)"
        return f"imports {name} from the submodule {module}: import it from {top}{listed}"
    if name not in public_names(top):
        return f"imports {name} from {top}, which does not list it in __all__"
    return None


def read_face_violations() -> list[str]:
    faces = [p for p in FILES if unit_of(module_name(p)) in FACES]
    found = []
    for src, node, scope, is_package in _import_nodes(faces):
        for module, name in _aliases(node, src, is_package):
            if (why := face_violation(src, module, name)) is not None:
                found.append(f"{src}:{node.lineno} ({scope}) `{ast.unparse(node)}`: {why}")
    return found


def test_faces_import_only_the_public_names_of_the_layers_below():
    found = read_face_violations()
    assert not found, ("faces (cli/, bench/) import api, pipeline, ground and values modules, "
                       "and the names in a package's __all__:\n" + "\n".join(found))


@pytest.mark.parametrize(("src", "statement", "allowed"), [
    ("autotm_py.cli.optimize", "from autotm_py import api", True),
    ("autotm_py.cli.optimize", "from autotm_py import pipeline", True),
    ("autotm_py.cli.optimize", "import autotm_py.api", True),
    ("autotm_py.cli.optimize", "from autotm_py.config import PlanConfig", True),
    ("autotm_py.cli.optimize", "from autotm_py.plan import _private", False),
    ("autotm_py.cli.optimize", "from autotm_py.planning import SolveControl", True),
    ("autotm_py.cli.optimize", "from autotm_py.planning.control import SolveControl", False),
    ("autotm_py.cli.optimize", "from autotm_py.planning import control", False),
    ("autotm_py.cli.optimize", "import autotm_py.planning.control", False),
    ("autotm_py.cli.optimize", "from autotm_py.planning import STOP_NOW", False),
    ("autotm_py.cli.optimize", "from autotm_py import planning", False),
    ("autotm_py.cli.optimize", "from autotm_py.ir import TensorGraph", True),
    ("autotm_py.cli.optimize", "from autotm_py.ir.graph import TensorGraph", False),
    ("autotm_py.cli.optimize", "from autotm_py.ir import layout", False),
    ("autotm_py.cli.optimize", "from autotm_py import optimize", False),
    ("autotm_py.cli.optimize", "from autotm_py.cli.common import warn", True),
    ("autotm_py.cli.report", "from autotm_py.bench import run_bench", True),
    ("autotm_py.cli.report", "from autotm_py.bench.rows import key_of", False),
    ("autotm_py.bench.cells", "from autotm_py.bench.ship import PlanBox", True),
    ("autotm_py.__main__", "from autotm_py.cli import main", True),
])
def test_the_face_rule(src: str, statement: str, allowed: bool):
    node = ast.parse(statement).body[0]
    assert isinstance(node, ast.Import | ast.ImportFrom)
    why = [w for m, n in _aliases(node, src, False) if (w := face_violation(src, m, n))]
    assert not why if allowed else why, why


@pytest.mark.parametrize(("statement", "target"), [
    ("from autotm_py.planning import SolveControl", "autotm_py.planning.control"),
    ("from autotm_py.planning import solve", "autotm_py.planning.solve"),
    ("from autotm_py.ir import TensorGraph", "autotm_py.ir"),
    ("from autotm_py.ir import LOSSES", "autotm_py.ir.loss"),
    ("from autotm_py.ir.graph import TensorGraph", "autotm_py.ir.graph"),
])
def test_from_package_imports_name_the_module_that_defines_the_name(statement, target):
    node = ast.parse(statement).body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _targets(node, "autotm_py.pipeline", False) == [target]


STAGE_PACKAGES = tuple(u for u in dict(FLOORS)["stages"] if _is_package(f"{ROOT}.{u}"))
VALUE_PACKAGES = tuple(u for floor in ("values", "kernels") for u in dict(FLOORS)[floor]
                       if _is_package(f"{ROOT}.{u}"))


@pytest.mark.parametrize("unit", STAGE_PACKAGES)
def test_every_stage_package_declares_its_public_names(unit: str):
    tree = ast.parse(_init_file(f"{ROOT}.{unit}").read_text())
    assigned = {t.id for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    assert "__all__" in assigned, f"{ROOT}/{unit}/__init__.py declares no __all__"


@pytest.mark.parametrize("unit", STAGE_PACKAGES + VALUE_PACKAGES)
def test_the_public_names_of_a_package_resolve(unit: str):
    package = f"{ROOT}.{unit}"
    try:
        loaded = importlib.import_module(package)
    except ModuleNotFoundError as exc:  # kernels: torch at its top
        pytest.skip(f"{package} needs {exc.name}")
    names = getattr(loaded, "__all__", [])
    assert len(set(names)) == len(names), f"{package}.__all__ lists a name twice"
    assert set(lazy_exports(package)) <= set(names), f"{package}: export missing from __all__"
    # a name that is also a submodule's would be the module once that is imported
    clashes = [n for n in names if f"{package}.{n}" in MODULES]
    assert not clashes, f"{package}.__all__ names submodules: {clashes}"
    broken = []
    for name in names:
        try:
            getattr(loaded, name)
        except ModuleNotFoundError as exc:  # an optional dependency (torch, PuLP) not installed
            if (exc.name or "").split(".")[0] not in DEFERRED:
                broken.append(f"{name}: {exc}")
        except AttributeError as exc:
            broken.append(f"{name}: {exc}")
    assert not broken, f"{package}.__all__ names that do not resolve:\n" + "\n".join(broken)


def test_importing_a_stage_package_loads_neither_torch_nor_pulp():
    """The stage packages import their public names lazily: importing one (as importing any of
    its submodules does) loads no torch and no PuLP."""
    packages = [f"{ROOT}.{u}" for u in (*STAGE_PACKAGES, "ir", "memory")]
    code = ("import importlib, json, sys\n"
            f"for package in {packages!r}:\n"
            "    importlib.import_module(package)\n"
            "    loaded = [m for m in ('torch', 'pulp') if m in sys.modules]\n"
            "    if loaded:\n"
            "        print(json.dumps([package, loaded]))\n"
            "        break\n"
            "else:\n"
            "    print(json.dumps(None))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert json.loads(out) is None, f"importing {json.loads(out)[0]} loaded {json.loads(out)[1]}"
