"""The composition layer: the stages wired into what a user asks for.

Stages never call each other's wiring; this module does it, once:

- `machine_for`: a graph and a `PlanConfig` -> the `MachineModel` (memory system with its
  budget, pinning, headroom, arena and graph pricing, kernel costs: the caller's, else loaded
  from the profiles);
- `optimize`: plan (`planning.solve.plan`, unverified), pack its arena and fit it in the
  budget (`fit_arena`: re-solving with a tighter budget while the packing exceeds it), verify
  the plan by strict simulation, which also gives its predicted time and fast-tier peak, then
  (optionally) the baselines;
- `with_arena`: a saved plan (or a baseline's) packed into an arena for the executor;
- `run_baselines`: each baseline's plan (`planning.baselines`) simulated on its machine;
- `machine_for_plan` and `simulate`: the machine a saved plan was made for, and its timeline;
- `profile_in_context`: the all-fast plan run through the executor, timed per kernel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from autotm_py import arena
from autotm_py.costs import KernelCosts
from autotm_py.errors import AutoTMError, PlanError, SolverError
from autotm_py.machine import MachineModel
from autotm_py.memory import accounting
from autotm_py.memory.accounting import ALIGN_BYTES
from autotm_py.memory.tiers import MemorySystem, load_memory_system, preset
from autotm_py.planning import baselines as baseline_plans
from autotm_py.planning import solve
from autotm_py.planning.baselines import BASELINES, BaselineResult
from autotm_py.planning.control import SolveControl
from autotm_py.planning.solve import PlanResult
from autotm_py.profiling.in_context import profile_in_context as _profile
from autotm_py.profiling.profile import load_costs
from autotm_py.runtime.simulate import SimulationResult, Simulator
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.config import PlanConfig
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.plan import Plan

PathLike = str | os.PathLike[str]


def machine_for(graph: TensorGraph, config: PlanConfig, costs: KernelCosts | None = None, *,
                profiles_dir: PathLike | None = None) -> MachineModel:
    """The memory system (with its budget), costs and pinning that `config` describes."""
    memory = load_memory_system(config.memory_name)
    if config.reserve_bytes is not None:
        memory = replace(memory, runtime_reserve_bytes=int(config.reserve_bytes))
    pinned = accounting.pinned_tensors(graph, config.pin_weights)
    budget = accounting.resolve_budget(graph, ratio=config.ratio,
                                       fast_mem_bytes=config.fast_mem_bytes, pinned=pinned,
                                       memory=memory)
    if costs is None:
        costs = load_costs(graph, device=config.device, profiles_dir=profiles_dir,
                           gpu=config.gpu)
    return MachineModel(graph, memory.with_budget(budget), costs, config.pin_weights,
                        config.headroom, graph_replay=config.graph, arena=config.arena,
                        placed=config.arena and config.placed,
                        scratch_windows=config.scratch_mode == "windows")


# The fit loop: solves at most this many times; each retry holds back the last packing's excess
# plus this share of the arena's limit.
ARENA_SOLVES = 4
ARENA_SLACK = 0.002


def optimize(graph: TensorGraph, config: PlanConfig, *, costs: KernelCosts | None = None,
             profiles_dir: PathLike | None = None,
             baselines: bool | Sequence[str] = False,
             control: SolveControl | None = None) -> PlanResult:
    """Plan `graph` under `config` and verify the plan (in GPU mode with `config.arena`, packed
    into an arena that fits the budget). `baselines`: also plan and simulate these baselines
    (True: all of them) for comparison. `control`: progress reports and stop requests (a stop
    ends the search with the best plan so far and skips the baselines)."""
    control = control or SolveControl(time_limit_s=config.time_limit_s)
    machine = machine_for(graph, config, costs, profiles_dir=profiles_dir)
    if machine.arena_mode:
        result, machine = fit_arena(machine, config, control)
        if machine.windowed and result.plan is not None and result.plan.arena is None and \
                not control.stop_requested:
            result, machine = _with_region_instead(graph, config, costs, profiles_dir,
                                                   control, result, machine)
    else:
        result = solve.plan(machine, config, control)
    if result.plan is not None and result.predicted_time_s is None:
        control.report(stage="verifying the plan")
        result = _verified(machine, result)
    if baselines and result.feasible and not control.stop_requested:
        names = BASELINES if baselines is True else tuple(baselines)
        control.report(stage="planning the baselines")
        result = replace(result, baselines=run_baselines(machine, names, control))
    return result


def _with_region_instead(graph: TensorGraph, config: PlanConfig, costs: KernelCosts | None,
                         profiles_dir: PathLike | None, control: SolveControl,
                         windowed: PlanResult, machine: MachineModel
                         ) -> tuple[PlanResult, MachineModel]:
    """A plan with scratch windows whose packing never fitted: planned again with the scratch
    region (windows of huge workspaces among long-lived tensors leave holes the fit loop cannot
    always hold back: VGG19 b64 at 80%). Kept if that one gets an arena, else the first."""
    region_config = replace(config, scratch="region")
    region_machine = machine_for(graph, region_config, costs, profiles_dir=profiles_dir)
    result, region_machine = fit_arena(region_machine, region_config, control)
    if result.plan is None or result.plan.arena is None:
        return windowed, machine
    return _noted(result, region_machine, [
        "scratch windows: their packing never fitted the budget; planned with the scratch "
        "region instead"])


def fit_arena(machine: MachineModel, config: PlanConfig, control: SolveControl | None = None
              ) -> tuple[PlanResult, MachineModel]:
    """Solve, pack the plan's buffers (`arena.pack`) and, while the arena exceeds the budget
    (tensors beyond their live sum: the packing's holes), solve again with the excess held
    back (`MachineModel.arena_margin`); at most `ARENA_SOLVES` solves, none after a stop
    request (`control`). The result's plan has its arena, unverified; a plan that never fits
    keeps none and runs on torch's allocator (a note says why). Returns the result and the
    machine of its last solve."""
    limit = machine.arena_limit
    notes: list[str] = []
    last: tuple[PlanResult, MachineModel] | None = None
    for attempt in range(1, ARENA_SOLVES + 1):
        if last is not None and control is not None and control.stop_requested:
            notes.append("no arena: stopped before the packing fitted; the plan runs on "
                         "torch's caching allocator")
            return _noted(*last, notes)
        result = solve.plan(machine, config, control)
        if result.plan is None:
            if last is None:
                return result, machine
            notes.append("no arena: with the packing's holes held back the budget is "
                         "infeasible; the plan runs on torch's caching allocator")
            return _noted(*last, notes)
        try:
            layout = arena.pack(machine, result.plan)
        except arena.ArenaError as exc:
            return _noted(result, machine, [*notes, f"no arena: {exc}"])
        excess = 0 if limit is None else layout.nbytes - limit
        if excess <= 0:
            notes.append(_arena_note(layout, machine, attempt))
            plan = result.plan.with_arena(layout).with_header(counts={
                **result.plan.header.counts, "arena_bytes": layout.nbytes,
                "arena_scratch_bytes": layout.scratch_bytes})
            return _noted(replace(result, plan=plan), machine, notes)
        assert limit is not None and machine.budget is not None
        notes.append(f"arena: packed {format_bytes(layout.nbytes)} over the "
                     f"{format_bytes(limit)} it may use; solved again")
        last = (result, machine)
        # the next plan's live bytes must fall by the excess (the packing's holes) below this
        # plan's, which may lie under the budget already
        live = arena.lifetimes(machine, result.plan).live_peak()
        target = live - excess - max(int(limit * ARENA_SLACK), ALIGN_BYTES)
        machine = replace(machine, arena_margin=machine.arena_margin + max(
            machine.budget - target, excess))
    notes.append(f"no arena: the packing did not fit in {ARENA_SOLVES} solves; the plan runs "
                 "on torch's caching allocator")
    assert last is not None
    return _noted(*last, notes)


def _arena_note(layout: arena.ArenaLayout, machine: MachineModel, solves: int) -> str:
    windows = len(layout.windows())
    among = f" and {windows} scratch windows" if windows else ""
    return (f"arena: {format_bytes(layout.nbytes)} (tensors{among} "
            f"{format_bytes(layout.scratch_offset)}, scratch {format_bytes(layout.scratch_bytes)})"
            f" of {format_bytes(machine.arena_limit or 0)}"
            + (f", after {solves} solves holding back {format_bytes(machine.arena_margin)}"
               if solves > 1 else ""))


def _noted(result: PlanResult, machine: MachineModel, notes: list[str]
           ) -> tuple[PlanResult, MachineModel]:
    if result.plan is None or not notes:
        return result, machine
    return replace(result, plan=result.plan.with_header(
        notes=(*result.plan.header.notes, *notes))), machine


def with_arena(graph: TensorGraph, plan: Plan, costs: KernelCosts | None = None, *,
               profiles_dir: PathLike | None = None) -> Plan:
    """`plan` with its buffers packed into an arena (unchanged if it has one): for running a
    plan made without one (a baseline, `--no-arena`, an older plan) at planned addresses. The
    arena may exceed the budget; the verifier says so."""
    if plan.arena is not None:
        return plan
    machine = replace(machine_for_plan(graph, plan, costs, profiles_dir=profiles_dir),
                      arena=True)
    return plan.with_arena(arena.pack(machine, plan))


def arena_for_run(graph: TensorGraph, plan: Plan, costs: KernelCosts | None = None, *,
                  capped: bool = True, profiles_dir: PathLike | None = None
                  ) -> tuple[Plan | None, str | None]:
    """The plan to run at planned addresses: `plan` if it has an arena, else packed now
    (`with_arena`); or None with the reason where no arena can serve it, the run then using
    torch's caching allocator: its buffers cannot keep steady slots, or (`capped`: the run is
    held to the budget) the packed arena exceeds what the budget leaves."""
    if plan.arena is not None:
        return plan, None
    machine = replace(machine_for_plan(graph, plan, costs, profiles_dir=profiles_dir),
                      arena=True)
    try:
        layout = arena.pack(machine, plan)
    except arena.ArenaError as exc:
        return None, f"no arena: {exc}; ran on torch's caching allocator"
    limit = machine.arena_limit
    if capped and limit is not None and layout.nbytes > limit:
        return None, (f"no arena: the plan has none, and packed now it needs "
                      f"{format_bytes(layout.nbytes)} of the {format_bytes(limit)} its budget "
                      "leaves; ran on torch's caching allocator (plan with `autotm optimize "
                      "--arena`)")
    return plan.with_arena(layout), None


def _verified(machine: MachineModel, result: PlanResult) -> PlanResult:
    """Simulate the decoded plan strictly (a violation here is a planner bug); the result
    gains the plan's predicted time and fast-tier peak."""
    assert result.plan is not None
    sim = Simulator(machine.graph, result.plan, machine, strict=True)
    try:
        sim.run()
    except PlanError as exc:
        raise SolverError(f"the decoded plan fails verification ({exc}); please report this "
                          "with the model and options") from exc
    res = sim.result()
    predicted, peak = res.total_s, res.fast_peak_bytes
    plan = result.plan.with_header(predicted_time_s=predicted,
                                   counts={**result.plan.header.counts,
                                           "fast_peak_bytes": peak})
    message = f"{result.status}: predicted {predicted * 1e3:.3f} ms per iteration"
    return replace(result, plan=plan, message=message, predicted_time_s=predicted,
                   fast_peak_bytes=peak)


def run_baselines(machine: MachineModel, names: Sequence[str] = BASELINES,
                  control: SolveControl | None = None) -> dict[str, BaselineResult]:
    """Plan and simulate each baseline (non-strict: a budget breach makes it infeasible);
    a stop request through `control` ends the list early."""
    out = {}
    for name in names:
        if control is not None and control.stop_requested:
            break
        if name == "2lm" and machine.gpu:
            out[name] = BaselineResult(name, None, None, False, None, "host mode only")
            continue
        try:
            plan = baseline_plans.baseline_plan(machine, name)
        except AutoTMError as exc:
            out[name] = BaselineResult(name, None, None, False, None, str(exc))
            continue
        sim = Simulator(machine.graph, plan, baseline_plans.simulation_machine(machine, name),
                        strict=False)
        sim.run()
        res = sim.result()
        plan = plan.with_header(predicted_time_s=res.total_s)
        message = res.violations[0] if res.violations else ""
        out[name] = BaselineResult(name, plan, res.total_s, res.ok, res.fast_peak_bytes,
                                   message)
    return out


def machine_for_plan(graph: TensorGraph, plan: Plan, costs: KernelCosts | None = None, *,
                     profiles_dir: PathLike | None = None) -> MachineModel:
    """The `MachineModel` a plan was made for: its memory system, budget and pinning."""
    memory = MemorySystem.from_dict(dict(plan.header.memory_system), origin="plan header")
    memory = memory.with_budget(plan.header.budget_bytes)
    header = plan.header
    if costs is None:
        costs = load_costs(graph, device=header.device, profiles_dir=profiles_dir,
                           gpu=header.gpu)
    return MachineModel(graph, memory, costs, header.pin_weights, header.headroom,
                        graph_replay=header.graph, arena=plan.arena is not None,
                        placed=plan.arena is not None and plans_placed(plan),
                        scratch_windows=plans_windows(plan))


def plans_placed(plan: Plan) -> bool:
    """Whether `plan` was planned for kernels allocating their outputs at their slots (the
    placed allocator; `PlanConfig.placed`, recorded in the header's config; plans written
    before it existed: no)."""
    return bool(plan.header.config.get("placed", False))


def plans_windows(plan: Plan) -> bool:
    """Whether `plan` gives each kernel's scratch a window inside the arena (`PlanConfig.scratch`
    "windows", recorded in the header's config)."""
    return plan.header.config.get("scratch") == "windows"


def simulate(graph: TensorGraph, plan: Plan, *, costs: KernelCosts | None = None,
             strict: bool = True, profiles_dir: PathLike | None = None,
             join_at_use: bool = True) -> SimulationResult:
    """Predict a plan's timeline; with `strict`, raise `PlanError` at the first violation
    (`join_at_use`: `Simulator`'s)."""
    plan.validate(graph)
    machine = machine_for_plan(graph, plan, costs, profiles_dir=profiles_dir)
    sim = Simulator(graph, plan, machine, strict=strict, join_at_use=join_at_use)
    sim.run()
    return sim.result()


def all_fast_plan(graph: TensorGraph) -> Plan:
    """Every tensor in fast memory, freed after its last use: the unlimited reference (its
    records do not depend on costs, so none are loaded)."""
    costs = KernelCosts.from_times("cuda", [0.0] * len(graph.kernels))
    return baseline_plans.all_fast(MachineModel(graph, preset("h100-pcie5"), costs))


def profile_in_context(graph: TensorGraph, *, device: str = "cuda",
                       profiles_dir: PathLike | None = None, iterations: int = 5,
                       warmup: int = 2) -> KernelCosts:
    """Time every kernel inside real all-fast iterations (`profiling.in_context`)."""

    return _profile(graph, all_fast_plan(graph), device=device, profiles_dir=profiles_dir,
                    iterations=iterations, warmup=warmup)
