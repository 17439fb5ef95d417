"""The Python API: thin functions over the subsystems, imported lazily.

Everything the CLI does goes through here, so notebooks and benchmarks get the same behaviour.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.memory.tiers import MemorySystem
    from autotm_py.plan import Plan
    from autotm_py.planning.solve import PlanResult
    from autotm_py.profiling.costs import KernelCosts
    from autotm_py.runtime.executor import RunResult
    from autotm_py.runtime.simulate import SimulationResult

PathLike = str | os.PathLike[str]


def import_onnx(path: PathLike, *, batch: int | None = None,
                dims: Mapping[str, int] | None = None) -> TensorGraph:
    """Read an ONNX file (weights as shapes only) into a forward `TensorGraph`."""
    from autotm_py.frontend.onnx import import_onnx as _import

    return _import(path, batch=batch, dims=dims)


def derive_training(graph: TensorGraph, *, optimizer: str = "sgd",
                    learning_rate: float = 0.01, loss: str = "auto") -> TensorGraph:
    """Forward + loss + backward + optimizer update: one training iteration. `loss`: auto,
    ce-axis1, ce-last or mse (docs/training.md)."""
    from autotm_py.ir.training import derive_training as _derive

    return _derive(graph, optimizer=optimizer, learning_rate=learning_rate, loss=loss)


def load_model(model: PathLike, *, batch: int | None = None,
               dims: Mapping[str, int] | None = None, training: bool = False,
               optimizer: str = "sgd", loss: str = "auto") -> TensorGraph:
    """An ONNX file path, or the name of a zoo model (built in memory), as a `TensorGraph`."""
    path = Path(model)
    if path.exists() or path.suffix == ".onnx" or os.sep in str(model):
        graph = import_onnx(path, batch=batch, dims=dims)
    else:
        from autotm_py.frontend.zoo import ZOO, build_graph

        if str(model) not in ZOO:
            raise ConfigError(f"model {str(model)!r} is neither an existing file nor a zoo model "
                              f"({', '.join(sorted(ZOO))}); see `autotm zoo list`")
        graph = build_graph(str(model), batch=batch, dims=dims)
    return derive_training(graph, optimizer=optimizer, loss=loss) if training else graph


def profile(graph: TensorGraph, *, device: str = "cpu", profiles_dir: PathLike | None = None,
            **options: Any) -> KernelCosts:
    """Measure every unique kernel on `device` (cached), return the graph's costs."""
    from autotm_py.profiling.profile import profile as _profile

    return _profile(graph, device=device, profiles_dir=profiles_dir, **options)


def load_costs(graph: TensorGraph, *, device: str = "cuda",
               profiles_dir: PathLike | None = None) -> KernelCosts:
    """Costs from shipped/cached profiles; kernels without one get flagged estimates."""
    from autotm_py.profiling.profile import load_costs as _load

    return _load(graph, device=device, profiles_dir=profiles_dir)


def calibrate(*, device: str = "cuda", **options: Any) -> MemorySystem:
    """Measure the host<->GPU link of this machine into a GPU-mode memory system."""
    from autotm_py.profiling.calibrate import calibrate as _calibrate

    return _calibrate(device, **options)


def optimize(graph: TensorGraph, config: PlanConfig | None = None, *,
             costs: KernelCosts | None = None,
             baselines: bool | Sequence[str] = False) -> PlanResult:
    """Solve the placement ILP; infeasible budgets come back as a result, not an exception.
    `baselines`: also plan and simulate the baselines (True: all) for comparison."""
    from autotm_py.planning.solve import optimize as _optimize

    return _optimize(graph, config or PlanConfig(), costs=costs, baselines=baselines)


def baselines(graph: TensorGraph, config: PlanConfig | None = None, *,
              costs: KernelCosts | None = None,
              names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Plan and simulate the baselines (all-fast, all-slow, first-touch, lru, offload, 2lm) at
    the budget of `config`: name -> `planning.baselines.BaselineResult`."""
    from autotm_py.planning.baselines import BASELINES, run_baselines
    from autotm_py.planning.solve import machine_model

    model = machine_model(graph, config or PlanConfig(), costs)
    return run_baselines(model, names or BASELINES)


def simulate(graph: TensorGraph, plan: Plan, *, costs: KernelCosts | None = None,
             strict: bool = True) -> SimulationResult:
    """Predicted timeline and memory curve of a plan; strict mode raises at a violation."""
    from autotm_py.runtime.simulate import simulate as _simulate

    return _simulate(graph, plan, costs=costs, strict=strict)


def execute(graph: TensorGraph, plan: Plan, *, device: str = "cuda", iterations: int = 5,
            warmup: int = 2, **options: Any) -> RunResult:
    """Run a plan for real with torch and measure it."""
    from autotm_py.runtime.executor import execute as _execute

    return _execute(graph, plan, device=device, iterations=iterations, warmup=warmup, **options)
