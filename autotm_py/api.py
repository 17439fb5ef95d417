"""The Python API: thin functions over the pipeline and the stages.

Everything the CLI does goes through here, so notebooks and benchmarks get the same behaviour.
Only what needs torch (profiling, calibrating, executing) imports it, when called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotm_py import pipeline
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.frontend.onnx import import_onnx as _import_onnx
from autotm_py.frontend.zoo import ZOO, build_graph
from autotm_py.ir.layout import to_channels_last
from autotm_py.ir.training import derive_training as _derive_training
from autotm_py.planning.baselines import BASELINES, BaselineResult
from autotm_py.profiling import profile as _profiling
from autotm_py.profiling.calibrate import calibrate as _calibrate

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.memory.tiers import MemorySystem
    from autotm_py.plan import Plan
    from autotm_py.planning.control import SolveControl
    from autotm_py.planning.solve import PlanResult
    from autotm_py.runtime.executor import RunResult
    from autotm_py.runtime.simulate import SimulationResult

PathLike = str | os.PathLike[str]


def import_onnx(path: PathLike, *, batch: int | None = None,
                dims: Mapping[str, int] | None = None, fuse: bool = True) -> TensorGraph:
    """Read an ONNX file (weights as shapes only) into a forward `TensorGraph`; attention and
    GELU patterns are fused unless `fuse` is False (docs/fusion.md)."""
    return _import_onnx(path, batch=batch, dims=dims, fuse=fuse)


def derive_training(graph: TensorGraph, *, optimizer: str = "sgd",
                    learning_rate: float = 0.01, loss: str = "auto",
                    loss_chunks: int = 1) -> TensorGraph:
    """Forward + loss + backward + optimizer update: one training iteration. `loss`: auto,
    ce-axis1, ce-last or mse; `loss_chunks` > 1: a language model's head and loss as one
    kernel over that many blocks of rows (docs/training.md)."""
    return _derive_training(graph, optimizer=optimizer, learning_rate=learning_rate, loss=loss,
                            loss_chunks=loss_chunks)


def load_model(model: PathLike, *, batch: int | None = None,
               dims: Mapping[str, int] | None = None, training: bool = False,
               optimizer: str = "sgd", fuse: bool = True, loss: str = "auto",
               loss_chunks: int = 1, channels_last: bool = False) -> TensorGraph:
    """An ONNX file path, or the name of a zoo model (built in memory), as a `TensorGraph`.
    `fuse=False` keeps the graph unfused (`--no-fuse`: no attention, GELU, Linear or
    convolution + ReLU fused); `loss` picks the derived
    training loss (`--loss`), `loss_chunks` chunks it (`--loss-chunks`); `channels_last`
    stores the convolutions' images N, H, W, C (`--channels-last`, docs/layout.md)."""
    path = Path(model)
    if path.exists() or path.suffix == ".onnx" or os.sep in str(model):
        graph = import_onnx(path, batch=batch, dims=dims, fuse=fuse)
    else:
        if str(model) not in ZOO:
            raise ConfigError(f"model {str(model)!r} is neither an existing file nor a zoo model "
                              f"({', '.join(sorted(ZOO))}); see `autotm zoo list`")
        graph = build_graph(str(model), batch=batch, dims=dims, fuse=fuse)
    if training:
        graph = derive_training(graph, optimizer=optimizer, loss=loss, loss_chunks=loss_chunks)
    return to_channels_last(graph) if channels_last else graph


def profile(graph: TensorGraph, *, device: str = "cpu", profiles_dir: PathLike | None = None,
            **options: Any) -> KernelCosts:
    """Measure every unique kernel on `device` (cached), return the graph's costs."""
    return _profiling.profile(graph, device=device, profiles_dir=profiles_dir, **options)


def load_costs(graph: TensorGraph, *, device: str = "cuda",
               profiles_dir: PathLike | None = None,
               shipped_dir: PathLike | None = None, gpu: str | None = None) -> KernelCosts:
    """Costs from shipped/cached profiles; kernels without one get flagged estimates.
    `shipped_dir` stands in for the shipped profiles (a bench worker's copy of them). `gpu`
    (cuda): price for that GPU's profiles ("h200"), not this machine's."""
    return _profiling.load_costs(graph, device=device, profiles_dir=profiles_dir,
                                 shipped_dir=shipped_dir, gpu=gpu)


def calibrate(*, device: str = "cuda", **options: Any) -> MemorySystem:
    """Measure the host<->GPU link of this machine into a GPU-mode memory system."""

    return _calibrate(device, **options)


def optimize(graph: TensorGraph, config: PlanConfig | None = None, *,
             costs: KernelCosts | None = None, profiles_dir: PathLike | None = None,
             baselines: bool | Sequence[str] = False,
             control: SolveControl | None = None) -> PlanResult:
    """Solve the placement ILP; infeasible budgets come back as a result, not an exception.
    Costs: `costs`, else the profiles (`profiles_dir`, else the cache and shipped profiles).
    `baselines`: also plan and simulate the baselines (True: all) for comparison.
    `control` (`planning.control.SolveControl`): progress callbacks and stop requests; with
    `planning.control.handle_signals(control)` around the call, Ctrl-C stops the search and
    keeps the best plan found so far."""
    return pipeline.optimize(graph, config or PlanConfig(), costs=costs,
                             profiles_dir=profiles_dir, baselines=baselines, control=control)


def baselines(graph: TensorGraph, config: PlanConfig | None = None, *,
              costs: KernelCosts | None = None, profiles_dir: PathLike | None = None,
              names: tuple[str, ...] | None = None) -> dict[str, BaselineResult]:
    """Plan and simulate the baselines (all-fast, all-slow, first-touch, lru, offload, 2lm) at
    the budget of `config`: name -> `planning.baselines.BaselineResult`."""
    machine = pipeline.machine_for(graph, config or PlanConfig(), costs,
                                   profiles_dir=profiles_dir)
    return pipeline.run_baselines(machine, names or BASELINES)


def simulate(graph: TensorGraph, plan: Plan, *, costs: KernelCosts | None = None,
             strict: bool = True, profiles_dir: PathLike | None = None,
             join_at_use: bool = True) -> SimulationResult:
    """Predicted timeline and memory curve of a plan; strict mode raises at a violation.
    `join_at_use=False`: async copies joined at the end of the kernel they overlap (AutoTM's
    runtime, and the ILP's objective) instead of where their tensors are used (ours)."""
    return pipeline.simulate(graph, plan, costs=costs, strict=strict,
                             profiles_dir=profiles_dir, join_at_use=join_at_use)


def profile_in_context(graph: TensorGraph, *, device: str = "cuda",
                       profiles_dir: PathLike | None = None, iterations: int = 5,
                       warmup: int = 2) -> KernelCosts:
    """Time every kernel inside real all-fast iterations on the GPU; cache; return costs."""
    return pipeline.profile_in_context(graph, device=device, profiles_dir=profiles_dir,
                                       iterations=iterations, warmup=warmup)


def execute(graph: TensorGraph, plan: Plan, *, device: str = "cuda", iterations: int = 5,
            warmup: int = 2, arena: bool = False, graph_replay: bool = False,
            costs: KernelCosts | None = None, **options: Any) -> RunResult:
    """Run a plan for real with torch and measure it. `arena`: every fast copy at its planned
    offset (a plan without an arena is packed first, `with_arena`); `graph_replay` (CUDA): the
    timed iterations replay one CUDA graph: in the arena where `arena` is given or a capped
    run's plan has one (`optimize --arena`), else with static inputs only
    (`runtime.arena.StaticInputs`), so no kernel output is copied into a slot and the graph's
    private pool on torch's caching allocator holds the iteration, under the cap when the run
    is capped (a plan for that leaves headroom for the allocator, more than an eager plan:
    docs/gpu.md, "Capped replay with static inputs"). Where no arena can serve the plan
    (`pipeline.arena_for_run`: packed now, it would exceed the capped budget), the run falls
    back to torch's caching allocator, eagerly, and its notes say why."""
    from dataclasses import replace

    from autotm_py.runtime.executor import execute as _execute

    capped = runs_capped(plan, device, options.get("enforce_budget", True))
    arena = runs_in_arena(plan, arena, graph_replay, capped)
    fallback = None
    if arena:
        packed, fallback = pipeline.arena_for_run(graph, plan, costs, capped=capped)
        if packed is None:
            arena = graph_replay = False
        else:
            plan = packed
    result = _execute(graph, plan, device=device, iterations=iterations, warmup=warmup,
                      arena=arena, graph_replay=graph_replay, **options)
    if arena and device.startswith("cuda") and result.placed_outputs is None and \
            pipeline.plans_placed(plan):
        fallback = "; ".join(filter(None, (fallback, (
            "the plan was made for kernels allocating their outputs at their slots (optimize "
            "--placed); copied there instead, they may not fit its scratch region: re-plan "
            "with --no-placed"))))
    return replace(result, notes=(*result.notes, fallback)) if fallback else result


def use_placed_allocator(plan: Plan, device: str, *, arena: bool = False,
                         graph_replay: bool = False, enforce_budget: bool = True) -> str | None:
    """Before anything else touches CUDA in this process: where `execute` will run `plan` in
    an arena on CUDA, make the placed allocator torch's (kernels allocate their outputs at
    their slots instead of having them copied there: `runtime.placed`). Returns a note where
    it could not (no C compiler, CUDA already used); `execute(placed=True)` says so too."""
    from autotm_py.runtime.executor import install_placed

    capped = runs_capped(plan, device, enforce_budget)
    if not runs_in_arena(plan, arena, graph_replay, capped):
        return None
    return install_placed(plan, device, enforce_budget)


def use_replay_work_queues(device: str, graph_replay: bool) -> str | None:
    """Before anything else touches CUDA in this process: where `execute` will replay plans as
    CUDA graphs on CUDA, run the process with one hardware work queue, at which a replay's
    copies run as fast as eager ones (`runtime.device.use_replay_work_queues`; it stays so for
    the process, whose eager runs with copy streams it slows). Returns a note where CUDA was
    already in use."""
    if not (graph_replay and device.startswith("cuda")):
        return None
    from autotm_py.runtime.device import use_replay_work_queues as use_one_queue

    return use_one_queue()


def prepare_cuda_process(plan: Plan, device: str, *, arena: bool = False,
                         graph_replay: bool = False, enforce_budget: bool = True,
                         placed: bool = True) -> list[str]:
    """What a process that runs `plan` (`execute` with the same options) sets up before it
    first uses CUDA, as `autotm run` and each `autotm bench --arena` run do: one work queue for
    a replay (`use_replay_work_queues`) and the placed allocator for an arena run
    (`use_placed_allocator`, where `placed`). Returns the notes of what could not be set."""
    notes = [use_replay_work_queues(device, graph_replay)]
    if placed:
        notes.append(use_placed_allocator(plan, device, arena=arena, graph_replay=graph_replay,
                                          enforce_budget=enforce_budget))
    return [note for note in notes if note]


def runs_in_arena(plan: Plan, arena: bool, graph_replay: bool, capped: bool) -> bool:
    """Whether `execute` runs `plan` at planned addresses: asked (`arena`), or a capped replay
    of a plan that has an arena (`optimize --arena`)."""
    return arena or (graph_replay and capped and plan.arena is not None)


def runs_capped(plan: Plan, device: str, enforce_budget: bool = True) -> bool:
    """Whether `execute` holds this run to the plan's budget (a cap on the GPU's allocator),
    a CUDA-graph replay and its capture included."""
    return device.startswith("cuda") and enforce_budget and plan.header.budget_bytes is not None


def with_arena(graph: TensorGraph, plan: Plan, costs: KernelCosts | None = None, *,
               profiles_dir: PathLike | None = None) -> Plan:
    """`plan` with every fast buffer at a packed offset (unchanged if it has an arena). A plan
    planned without `--arena` may need more than its budget this way; `simulate` says so."""
    return pipeline.with_arena(graph, plan, costs, profiles_dir=profiles_dir)
