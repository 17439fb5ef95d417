"""The Python side of the Julia bridge (`autotm_py.julia`), without Julia.

Julia cannot be installed on these machines, so juliacall, juliapkg and the `julia` binary are
replaced by small fakes written to a temporary folder: they fail the way the real ones do
(checked by hand against juliacall 0.9.37: a missing Julia is a plain `Exception` or a
`URLError` from juliapkg's download, a broken one a `CalledProcessError`), or succeed and
record what the bridge asked of Julia.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autotm_py import julia as bridge
from autotm_py.errors import ConfigError, ExecutionError, PlanError
from tests.test_julia_schema import fixture_plan

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "julia" / "AutoTMBridge"
FAKES = ("juliacall", "juliapkg")
ENV = ("PYTHON_JULIACALL_EXE", "PYTHON_JULIACALL_PROJECT", "PYTHON_JULIAPKG_EXE",
       bridge.BRIDGE_ENV)

FAKE_JULIACALL = '''
import os

class JuliaError(Exception):
    """Stands for juliacall.JuliaError."""

CALLS = []
MODE = os.environ.get("FAKE_JULIACALL_MODE", "ok")
if MODE == "plain":  # what juliacall raises when PythonCall does not start
    raise Exception("PythonCall.jl did not start properly")
if MODE == "oserror":  # juliapkg trying to download Julia offline
    raise OSError("<urlopen error [Errno -2] Name or service not known>")
if MODE == "bug":
    raise ZeroDivisionError("a bug inside juliacall")


class FakeBridge:
    def parse_plan(self, text):
        CALLS.append(("parse_plan", text))
        if not text.startswith("{"):
            raise JuliaError("PlanError: plan: not valid JSON")
        return ("julia plan", text)

    def read_plan(self, path):
        CALLS.append(("read_plan", path))
        if not os.path.isfile(path):
            raise JuliaError(f"PlanError: no plan file at {path!r}\\nStacktrace: ...")
        return ("julia plan", path)

    def seval(self, expr):
        assert expr == "apply_plan!", expr

        def apply(executor, plan, **callbacks):
            CALLS.append(("apply_plan!", executor, plan, sorted(callbacks)))
            for name, callback in sorted(callbacks.items()):
                callback(executor, name)
            return executor
        return apply


class FakeModule:
    def seval(self, expr):
        CALLS.append(("seval", expr))
        if expr.startswith("dir ->"):
            return lambda folder: CALLS.append(("load_path", folder))
        if expr == "using AutoTMBridge":
            if MODE == "noload":
                raise JuliaError("ArgumentError: Package JSON not found in current path.")
            return None
        if expr == "AutoTMBridge":
            return FakeBridge()
        raise AssertionError(expr)


def newmodule(name):
    CALLS.append(("newmodule", name))
    return FakeModule()
'''

FAKE_JULIAPKG = '''
ADDED = []

def add(pkg, uuid=None, dev=False, version=None, path=None, **kw):
    ADDED.append({"pkg": pkg, "uuid": uuid, "dev": dev, "path": path})
'''


class FakeWorld:
    """A PATH and sys.path with only the fakes this test puts there."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin, self.site, self.mp = tmp / "bin", tmp / "site", monkeypatch
        self.bin.mkdir()
        self.site.mkdir()
        monkeypatch.setenv("PATH", f"{self.bin}:/usr/bin:/bin")
        for name in ENV:
            monkeypatch.delenv(name, raising=False)

    def julia(self, script: str = 'echo "julia version 1.11.2"', name: str = "julia") -> Path:
        exe = self.bin / name
        exe.write_text(f"#!/bin/sh\n{script}\n")
        exe.chmod(0o755)
        return exe

    def packages(self, mode: str = "ok") -> None:
        for name, source in (("juliacall", FAKE_JULIACALL), ("juliapkg", FAKE_JULIAPKG)):
            (self.site / name).mkdir(exist_ok=True)
            (self.site / name / "__init__.py").write_text(textwrap.dedent(source))
        self.mp.setenv("FAKE_JULIACALL_MODE", mode)
        self.mp.syspath_prepend(str(self.site))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    saved = {name: sys.modules.pop(name, None) for name in FAKES}
    bridge._BRIDGES.clear()
    yield FakeWorld(tmp_path, monkeypatch)
    bridge._BRIDGES.clear()
    for name, module in saved.items():
        sys.modules.pop(name, None)
        if module is not None:
            sys.modules[name] = module


def load_error(**kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        bridge.load_bridge(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- juliacall or Julia missing -----------------------------------------------------------------
def test_importing_the_module_does_not_start_julia(world: FakeWorld) -> None:
    world.packages("bug")  # importing this fake juliacall would raise
    code = "import sys, autotm_py.julia; assert 'juliacall' not in sys.modules"
    env = {**os.environ, "PYTHONPATH": f"{world.site}:{ROOT}"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_missing_juliacall_says_how_to_install(world: FakeWorld, monkeypatch) -> None:
    world.julia()
    monkeypatch.setitem(sys.modules, "juliacall", None)  # an import of it now fails
    message = load_error()
    assert "juliacall, which is not installed" in message
    assert "pip install 'autotm_py[julia]'" in message
    assert "Julia >= 1.10 on PATH" in message and "PYTHON_JULIACALL_EXE" in message


def test_missing_juliacall_in_a_clean_path(world: FakeWorld) -> None:
    world.julia()
    assert "pip install 'autotm_py[julia]'" in load_error()


def test_no_julia_on_path(world: FakeWorld) -> None:
    world.packages()
    message = load_error()
    assert "Julia was not found on PATH" in message and "pip install" in message
    assert "juliacall" not in sys.modules, "juliacall must not be imported (it would start Julia)"


@pytest.mark.parametrize(("script", "expected"), [
    ("exit 3", "cannot be started"),
    ('echo "julia version 1.9.4"', "Julia 1.9.4 at"),
    ('echo "hello"', "is not Julia"),
])
def test_julia_that_does_not_work(world: FakeWorld, script: str, expected: str) -> None:
    world.packages()
    world.julia(script)
    assert expected in load_error()
    assert "juliacall" not in sys.modules


def test_juliacall_exe_needs_its_project(world: FakeWorld, monkeypatch) -> None:
    world.packages()
    monkeypatch.setenv("PYTHON_JULIACALL_EXE", str(world.julia()))
    assert "PYTHON_JULIACALL_EXE is set alone" in load_error()


def test_juliacall_exe_that_does_not_exist(world: FakeWorld, monkeypatch, tmp_path) -> None:
    world.packages()
    monkeypatch.setenv("PYTHON_JULIACALL_EXE", str(tmp_path / "nowhere" / "julia"))
    monkeypatch.setenv("PYTHON_JULIACALL_PROJECT", str(tmp_path))
    message = load_error()
    assert "PYTHON_JULIACALL_EXE=" in message and "no such executable" in message


def test_find_julia_prefers_the_configured_executables(world: FakeWorld, monkeypatch) -> None:
    world.julia('echo "julia version 1.10.0"')
    other = world.julia('echo "julia version 1.12.1"', name="julia-1.12")
    assert bridge.find_julia()[1] == (1, 10, 0)
    monkeypatch.setenv("PYTHON_JULIAPKG_EXE", str(other))
    assert bridge.find_julia() == (str(other), (1, 12, 1))


@pytest.mark.parametrize(("mode", "expected"), [
    ("plain", "PythonCall.jl did not start properly"),
    ("oserror", "OSError: <urlopen error"),
])
def test_julia_that_does_not_start(world: FakeWorld, mode: str, expected: str) -> None:
    world.packages(mode)
    world.julia()
    message = load_error()
    assert "Julia did not start through juliacall" in message and expected in message
    assert "pip install 'autotm_py[julia]'" in message


def test_a_bug_in_juliacall_is_not_disguised(world: FakeWorld) -> None:
    world.packages("bug")
    world.julia()
    with pytest.raises(ZeroDivisionError):
        bridge.load_bridge()


def test_package_that_does_not_load(world: FakeWorld) -> None:
    world.packages("noload")
    world.julia()
    message = load_error()
    assert "AutoTMBridge from" in message and "Package JSON not found" in message
    assert "Pkg.develop(path=" in message


# ---- the bridge when Julia starts ---------------------------------------------------------------
def test_load_bridge_registers_and_loads_the_package(world: FakeWorld) -> None:
    world.packages()
    world.julia()
    loaded = bridge.load_bridge()
    assert loaded.path == PACKAGE
    added = sys.modules["juliapkg"].ADDED
    assert added == [{"pkg": "AutoTMBridge", "uuid": bridge.BRIDGE_UUID, "dev": True,
                      "path": str(PACKAGE)}]
    calls = sys.modules["juliacall"].CALLS
    assert ("load_path", str(PACKAGE.parent)) in calls
    assert ("seval", "using AutoTMBridge") in calls
    assert bridge.load_bridge() is loaded  # Julia starts once per process


def test_user_managed_project_is_left_alone(world: FakeWorld, monkeypatch, tmp_path) -> None:
    world.packages()
    monkeypatch.setenv("PYTHON_JULIACALL_EXE", str(world.julia()))
    monkeypatch.setenv("PYTHON_JULIACALL_PROJECT", str(tmp_path))
    bridge.load_bridge()
    assert "juliapkg" not in sys.modules  # nothing registered behind the user's back


@pytest.fixture
def running(world: FakeWorld) -> bridge.JuliaBridge:
    """A bridge over the fake juliacall, as if Julia had been started earlier."""
    world.packages()
    import juliacall  # the fake

    assert juliacall.MODE == "ok"
    return bridge.load_bridge()


def test_to_julia_hands_the_json_over_in_memory(running: bridge.JuliaBridge) -> None:
    plan = fixture_plan()
    assert running.to_julia(plan) == ("julia plan", plan.to_json())


def test_read_plan_errors_become_plan_errors(running: bridge.JuliaBridge, tmp_path) -> None:
    with pytest.raises(PlanError, match=r"AutoTMBridge cannot read it: PlanError: no plan file"):
        running.read_plan(tmp_path / "missing.json")
    path = fixture_plan().save(tmp_path / "plan.json")
    assert running.read_plan(path) == ("julia plan", str(path))


def test_apply_plan_passes_the_callbacks(running: bridge.JuliaBridge) -> None:
    seen: list[tuple[Any, Any]] = []
    state = object()
    out = running.apply_plan(fixture_plan(), {"compute": lambda e, r: seen.append((e, r)),
                                              "free": lambda e, r: seen.append((e, r))}, state)
    assert out is state
    assert seen == [(state, "compute"), (state, "free")]
    with pytest.raises(ConfigError, match=r"\['evict'\] are not handlers"):
        running.apply_plan(fixture_plan(), {"evict": print})


def test_apply_plan_failures_become_execution_errors(running: bridge.JuliaBridge) -> None:
    juliacall = sys.modules["juliacall"]

    def failing(executor: Any, record: Any) -> None:
        raise juliacall.JuliaError("RecordError: record 1 (Move(0, FAST, :sync, nothing)) failed")

    with pytest.raises(ExecutionError, match="RecordError: record 1"):
        running.apply_plan(fixture_plan(), {"move": failing})


# ---- where the Julia package is found -----------------------------------------------------------
def test_bridge_dir_finds_the_source_tree(world: FakeWorld) -> None:
    assert bridge.bridge_dir() == PACKAGE


def test_bridge_dir_env_override(world: FakeWorld, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(bridge.BRIDGE_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=r"AUTOTM_JULIA_BRIDGE=.*not the AutoTMBridge package"):
        bridge.bridge_dir()
    copy = tmp_path / "AutoTMBridge"
    (copy / "src").mkdir(parents=True)
    (copy / "Project.toml").write_text((PACKAGE / "Project.toml").read_text())
    (copy / "src" / "AutoTMBridge.jl").write_text("module AutoTMBridge end\n")
    monkeypatch.setenv(bridge.BRIDGE_ENV, str(copy))
    assert bridge.bridge_dir() == copy
    assert bridge.bridge_dir(PACKAGE) == PACKAGE  # an explicit path wins


class _FakeDist:
    def __init__(self, root: Path) -> None:
        self.root = root

    def locate_file(self, path: Any) -> Path:
        return self.root / str(path)


def test_bridge_dir_finds_a_wheel_install(world: FakeWorld, monkeypatch, tmp_path) -> None:
    """Installed from a wheel, the package sits in <prefix>/share/autotm_py/julia/."""
    site = tmp_path / "lib" / "site-packages"
    share = tmp_path / "share" / "autotm_py" / "julia" / "AutoTMBridge"
    (share / "src").mkdir(parents=True)
    (share / "Project.toml").write_text("")
    (share / "src" / "AutoTMBridge.jl").write_text("")
    files = []
    for rel in ("autotm_py/julia.py", "../../share/autotm_py/julia/AutoTMBridge/Project.toml"):
        entry = metadata.PackagePath(rel)
        entry.dist = _FakeDist(site)
        files.append(entry)
    monkeypatch.setattr(bridge, "__file__", str(site / "autotm_py" / "julia.py"))
    monkeypatch.setattr(bridge.importlib.metadata, "files", lambda name: files)
    assert bridge.bridge_dir() == share.resolve()
    monkeypatch.setattr(bridge.importlib.metadata, "files", lambda name: [])
    with pytest.raises(ConfigError, match="AutoTMBridge is not installed"):
        bridge.bridge_dir()


def test_pyproject_ships_every_file_of_the_julia_package() -> None:
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"]
    shipped = [p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in shipped:
        rel = path.relative_to(ROOT)
        dest = f"share/autotm_py/{rel.parent}"
        patterns = data_files.get(dest, [])
        assert any(fnmatch(str(rel), pat) for pat in patterns), f"{rel} is not in data-files"
    assert len(shipped) >= 9


def test_fake_module_source_is_importable() -> None:
    """The fake above is plain Python (a typo there would make the tests above meaningless)."""
    module = ModuleType("fake_juliacall")
    exec(compile(textwrap.dedent(FAKE_JULIACALL), "fake", "exec"), module.__dict__)
    assert module.newmodule("X").seval("AutoTMBridge").parse_plan("{}") == ("julia plan", "{}")
