"""The Julia bridge: hand autotm plans to Julia code through juliacall.

`load_bridge()` starts Julia inside this Python process with juliacall (the optional extra
``pip install 'autotm_py[julia]'``), loads the Julia package ``AutoTMBridge`` that ships with
autotm_py, and returns a `JuliaBridge`:

    bridge = load_bridge()
    jplan = bridge.to_julia(plan)          # an AutoTMBridge.Plan, handed over in memory
    bridge.apply_plan(plan, {"compute": run, "move": copy, "free": drop}, executor=state)

Where the Julia package is found (first match wins): the folder named by the environment
variable ``AUTOTM_JULIA_BRIDGE``; ``julia/AutoTMBridge`` beside the ``autotm_py`` folder (a
source checkout or an editable install); the copy that a wheel installs as data files under
``<prefix>/share/autotm_py/julia/AutoTMBridge``.

Without juliacall, or without a Julia >= 1.10 that starts, every entry point raises a
`ConfigError` that says how to install them. Julia can be started once per process, so the
bridge is loaded once and cached.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotm_py.errors import ConfigError, ExecutionError, PlanError
from autotm_py.plan import Plan

log = logging.getLogger(__name__)

BRIDGE_NAME = "AutoTMBridge"
BRIDGE_UUID = "71057029-ae78-4143-9de2-fa4ae15f9cdc"  # julia/AutoTMBridge/Project.toml
BRIDGE_ENV = "AUTOTM_JULIA_BRIDGE"
JULIA_MIN_VERSION = (1, 10)
HANDLERS = ("compute", "move", "free")
INSTALL_HINT = ("pip install 'autotm_py[julia]' and put Julia >= 1.10 on PATH (or set "
                "PYTHON_JULIAPKG_EXE to it, or PYTHON_JULIACALL_EXE together with "
                "PYTHON_JULIACALL_PROJECT)")
# What juliacall/juliapkg raise when Julia cannot be found, fetched or started. They also
# raise plain `Exception("...")` for some of these cases; `_start_julia` handles those apart.
_STARTUP_ERRORS = (OSError, ValueError, AssertionError, subprocess.SubprocessError)

_BRIDGES: dict[Path, JuliaBridge] = {}


@dataclass(frozen=True)
class JuliaBridge:
    """The loaded Julia package. `module` is AutoTMBridge as a juliacall value, so every
    Julia function of it is callable from Python (``bridge.module.bytes_moved(jplan)``)."""

    module: Any
    path: Path
    juliacall: Any

    def read_plan(self, path: str | os.PathLike[str]) -> Any:
        """Read a plan file in Julia; returns an ``AutoTMBridge.Plan``."""
        return self._julia_plan(self.module.read_plan, str(Path(path)), origin=str(path))

    def to_julia(self, plan: Plan) -> Any:
        """The plan as an ``AutoTMBridge.Plan``, handed over as JSON text in memory (no file)."""
        return self._julia_plan(self.module.parse_plan, plan.to_json(),
                                origin=f"plan of {plan.header.model_name!r}")

    def apply_plan(self, plan: Plan | Any,
                   callbacks: Mapping[str, Callable[[Any, Any], Any]] | None = None,
                   executor: Any = None) -> Any:
        """Walk the plan in Julia with ``AutoTMBridge.apply_plan!``, calling
        ``callbacks[op](executor, record)`` for each record (op: compute, move, free; Python
        callables or Julia functions). Missing handlers fall back to Julia methods of
        ``on_compute!``/``on_move!``/``on_free!`` for the executor's type. Returns `executor`."""
        given = dict(callbacks or {})
        unknown = sorted(set(given) - set(HANDLERS))
        if unknown:
            raise ConfigError(f"apply_plan callbacks {unknown} are not handlers; use "
                              f"{', '.join(HANDLERS)}")
        jplan = self.to_julia(plan) if isinstance(plan, Plan) else plan
        apply = self.module.seval("apply_plan!")
        try:
            return apply(executor, jplan, **given)
        except self.juliacall.JuliaError as exc:
            raise ExecutionError(f"applying the plan in Julia failed: {_first_line(exc)}") from exc

    def _julia_plan(self, reader: Callable[[str], Any], arg: str, *, origin: str) -> Any:
        try:
            return reader(arg)
        except self.juliacall.JuliaError as exc:
            raise PlanError(f"{origin}: AutoTMBridge cannot read it: {_first_line(exc)}") from None


def load_bridge(path: str | os.PathLike[str] | None = None) -> JuliaBridge:
    """Start Julia (once per process) and load AutoTMBridge from `path` or the shipped copy.

    Raises `ConfigError` with install instructions when juliacall is missing, when no Julia
    >= 1.10 is found or it does not start, or when the package cannot be loaded."""
    pkg = bridge_dir(path)
    if pkg in _BRIDGES:
        return _BRIDGES[pkg]
    if sys.modules.get("juliacall") is None:  # Julia is not running in this process yet
        _require_juliacall()
        exe, version = find_julia()
        log.info("starting Julia %s (%s) through juliacall", ".".join(map(str, version)), exe)
        _register_with_juliapkg(pkg)
    juliacall = _start_julia()
    bridge = JuliaBridge(_load_package(juliacall, pkg), pkg, juliacall)
    _BRIDGES[pkg] = bridge
    return bridge


# ---- locating the Julia package ---------------------------------------------------------------
def _is_bridge(folder: Path) -> bool:
    return (folder / "Project.toml").is_file() and (folder / "src" / f"{BRIDGE_NAME}.jl").is_file()


def bridge_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The folder of the AutoTMBridge Julia package (see the module docstring for the order)."""
    explicit = path if path is not None else os.environ.get(BRIDGE_ENV)
    if explicit:
        folder = Path(explicit).expanduser().resolve()
        if not _is_bridge(folder):
            source = "path" if path is not None else BRIDGE_ENV
            raise ConfigError(f"{source}={explicit}: not the AutoTMBridge package (no Project.toml "
                              f"and src/{BRIDGE_NAME}.jl there); point it at julia/AutoTMBridge")
        return folder
    candidates = [Path(__file__).resolve().parent.parent / "julia" / BRIDGE_NAME]
    installed = _installed_bridge_dir()
    if installed is not None:
        candidates.append(installed)
    for folder in candidates:
        if _is_bridge(folder):
            return folder
    raise ConfigError(f"the Julia package AutoTMBridge is not installed (looked in "
                      f"{', '.join(map(str, candidates))}); reinstall autotm_py or set "
                      f"{BRIDGE_ENV} to a checkout's julia/AutoTMBridge")


def _installed_bridge_dir() -> Path | None:
    """Where a wheel put the package: data files recorded in the distribution's RECORD."""
    try:
        files = importlib.metadata.files("autotm_py") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "Project.toml" and f.parent.name == BRIDGE_NAME:
            return Path(str(f.locate())).resolve().parent
    return None


# ---- finding and starting Julia ---------------------------------------------------------------
def _require_juliacall() -> None:
    if importlib.util.find_spec("juliacall") is None:
        raise ConfigError("the Julia bridge needs juliacall, which is not installed: "
                          + INSTALL_HINT)


def find_julia() -> tuple[str, tuple[int, int, int]]:
    """The Julia executable juliacall will use and its version; `ConfigError` if none works.

    Looks where juliacall and juliapkg look: ``PYTHON_JULIACALL_EXE``, ``PYTHON_JULIAPKG_EXE``,
    then ``julia`` on PATH. (juliapkg would otherwise try to download Julia, which fails
    offline with an obscure error, so we stop first with instructions.)"""
    exe = os.environ.get("PYTHON_JULIACALL_EXE")
    project = os.environ.get("PYTHON_JULIACALL_PROJECT")
    if bool(exe) != bool(project):
        given = "PYTHON_JULIACALL_EXE" if exe else "PYTHON_JULIACALL_PROJECT"
        raise ConfigError(f"{given} is set alone; juliacall needs PYTHON_JULIACALL_EXE and "
                          "PYTHON_JULIACALL_PROJECT together (or set PYTHON_JULIAPKG_EXE instead)")
    sources = (("PYTHON_JULIACALL_EXE", exe), ("PYTHON_JULIAPKG_EXE",
                                               os.environ.get("PYTHON_JULIAPKG_EXE")))
    for source, value in sources:
        if value:
            found = shutil.which(value)
            if found is None:
                raise ConfigError(f"{source}={value}: no such executable; point it at a "
                                  "Julia >= 1.10 binary")
            return found, _julia_version(found, source)
    found = shutil.which("julia")
    if found is None:
        raise ConfigError(f"Julia was not found on PATH; the Julia bridge needs Julia >= 1.10 "
                          f"(https://julialang.org/downloads or juliaup): {INSTALL_HINT}")
    return found, _julia_version(found, "PATH")


def _julia_version(exe: str, source: str) -> tuple[int, int, int]:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"Julia at {exe} (from {source}) cannot be started "
                          f"({_first_line(exc)}); reinstall it or {INSTALL_HINT}") from None
    match = re.search(r"julia version (\d+)\.(\d+)\.(\d+)", out, re.IGNORECASE)
    if match is None:
        raise ConfigError(f"{exe} (from {source}) is not Julia: `--version` printed "
                          f"{out.strip()[:60]!r}; {INSTALL_HINT}")
    major, minor, patch = (int(g) for g in match.groups())
    if (major, minor) < JULIA_MIN_VERSION:
        raise ConfigError(f"Julia {major}.{minor}.{patch} at {exe} (from {source}) is too old; "
                          "the bridge needs Julia >= 1.10 (e.g. `juliaup add release`)")
    return major, minor, patch


def _register_with_juliapkg(pkg: Path) -> None:
    """Ask juliapkg to `Pkg.develop` AutoTMBridge (and so install JSON.jl) into juliacall's
    environment when it resolves at start-up. Skipped when the user manages the project."""
    if os.environ.get("PYTHON_JULIACALL_PROJECT"):
        return
    try:
        import juliapkg
    except ImportError as exc:
        raise ConfigError(f"juliapkg (a juliacall dependency) cannot be imported ({exc}): "
                          f"{INSTALL_HINT}") from None
    try:
        juliapkg.add(BRIDGE_NAME, BRIDGE_UUID, dev=True, path=str(pkg))
    except OSError as exc:
        raise ConfigError(f"juliapkg cannot record AutoTMBridge in its environment "
                          f"({_first_line(exc)}); check that the venv is writable") from None


def _start_julia() -> Any:
    try:
        import juliacall
    except ImportError as exc:
        raise ConfigError(f"juliacall cannot be imported ({exc}): {INSTALL_HINT}") from None
    except _STARTUP_ERRORS as exc:
        raise ConfigError(f"Julia did not start through juliacall ({type(exc).__name__}: "
                          f"{_first_line(exc)}); {INSTALL_HINT}") from exc
    except Exception as exc:
        # juliacall and juliapkg signal start-up failures ("could not find Julia", "PythonCall
        # did not start properly") with plain Exception instances; anything more specific is
        # a bug and propagates unchanged.
        if type(exc) is not Exception:
            raise
        raise ConfigError(f"Julia did not start through juliacall ({_first_line(exc)}); "
                          f"{INSTALL_HINT}") from exc
    return juliacall


def _load_package(juliacall: Any, pkg: Path) -> Any:
    """`using AutoTMBridge` in a fresh module; if the active Julia environment does not know
    the package (a user-managed PYTHON_JULIACALL_PROJECT), load it from its folder."""
    jl = juliacall.newmodule("AutoTMPy")
    try:
        add_to_load_path = jl.seval(
            f'dir -> (Base.find_package("{BRIDGE_NAME}") === nothing && '
            "push!(LOAD_PATH, dir); nothing)")
        add_to_load_path(str(pkg.parent))
        jl.seval(f"using {BRIDGE_NAME}")
        return jl.seval(BRIDGE_NAME)
    except juliacall.JuliaError as exc:
        raise ConfigError(f"Julia started but {BRIDGE_NAME} from {pkg} did not load "
                          f"({_first_line(exc)}); install its dependencies with Julia: "
                          f"`import Pkg; Pkg.develop(path=\"{pkg}\")`") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
