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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotm_py import arena
from autotm_py.costs import KernelCosts
from autotm_py.errors import AutoTMError, PlanError, SolverError
from autotm_py.fitting import fit_arena, noted
from autotm_py.ir.conv_split import describe_split, splittable_kernels
from autotm_py.machine import MachineModel, over_device_note
from autotm_py.memory.tiers import (
    MemorySystem,
    cpu_run_note,
    preset,
    simulated_tier_note,
)
from autotm_py.options import Measure, RunMode
from autotm_py.plan import Plan
from autotm_py.planning import baselines as baseline_plans
from autotm_py.planning import solve
from autotm_py.planning.baselines import BASELINES, BaselineResult
from autotm_py.planning.bounds import transfer_bound
from autotm_py.planning.control import SolveControl
from autotm_py.planning.feasibility import refit_chunks, smallest_budget, splits_for_budget
from autotm_py.planning.solve import PlanResult
from autotm_py.profiling.cache import user_profiles_dir
from autotm_py.profiling.in_context import profile_in_context as _profile
from autotm_py.profiling.profile import load_costs
from autotm_py.runtime.simulate import Simulator
from autotm_py.runtime.simulate_result import SimulationResult
from autotm_py.units import format_bytes

# the models as workloads (`workload`), part of what the pipeline offers its callers
from autotm_py.workload import (  # noqa: F401
    Workload,
    _memory_system,
    device_costs,
    for_this_gpu,
    initial_values,
    load_graph,
    load_workload,
    ordered_updates,
    planned_graph,
    split_workload,
    user_budget,
)

if TYPE_CHECKING:
    from autotm_py.config import PlanConfig
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.runtime.execute import RunResult

PathLike = str | os.PathLike[str]


def machine_for(graph: TensorGraph, config: PlanConfig, costs: KernelCosts | None = None, *,
                profiles_dir: PathLike | None = None) -> MachineModel:
    """The memory system (with its budget), costs and pinning that `config` describes. In GPU
    mode without `--memory` the link is that of the GPU whose profiles price the plan
    (`--gpu`, else this machine's GPU, else the reference H100)."""
    config = for_this_gpu(config)
    memory = _memory_system(config)
    budget = user_budget(graph, config, memory)
    if costs is None:
        costs = load_costs(graph, device=config.device, profiles_dir=profiles_dir, gpu=config.gpu)
    return MachineModel(graph, memory.with_budget(budget), costs, config.pin_weights,
                        config.headroom, run=config.run)


def optimize(graph: TensorGraph, config: PlanConfig, *, costs: KernelCosts | None = None,
             profiles_dir: PathLike | None = None,
             baselines: bool | Sequence[str] = False,
             control: SolveControl | None = None) -> PlanResult:
    """Plan `graph` under `config` and verify the plan (in GPU mode with `config.run.arena`, packed
    into an arena that fits the budget). `baselines`: also plan and simulate these baselines
    (True: all of them) for comparison. `control`: progress reports and stop requests (a stop
    ends the search with the best plan so far and skips the baselines).

    `config.split_conv_grads`: "on" plans the graph with its fused convolution backward
    kernels split into their parts (`ir.conv_split`); "auto" does so where the budget is
    infeasible because of them and the split makes it feasible (the plan's notes say so). The
    result's `graph` is then the split graph, the one the plan is for. Likewise
    `config.update_order` (`ordered_updates`): a plan with the updates early is for the
    reordered graph."""
    control = control or SolveControl(time_limit_s=config.time_limit_s)
    given = graph
    graph, costs = ordered_updates(graph, config, costs)
    if graph is given:
        return _optimize_split(graph, config, costs, profiles_dir, baselines, control)
    # a ratio is of the graph as given (the reordered one's peak may differ), as for a split
    result = _optimize_split(graph, config.in_bytes(user_budget(given, config)), costs,
                             profiles_dir, baselines, control)
    plan = None if result.plan is None else _as_asked(result.plan, config)
    return replace(result, graph=result.graph or graph, plan=plan)


def _as_asked(plan: Plan, config: PlanConfig, note: str | None = None) -> Plan:
    """`plan` of a rewritten graph, planned at its budget in bytes, with the config the user
    asked for in its header (a ratio stays a ratio) and `note` (why it was rewritten)."""
    notes = plan.header.notes if note is None else (*plan.header.notes, note)
    return plan.with_header(config=config.to_dict(), notes=notes)


def _optimize_split(graph: TensorGraph, config: PlanConfig, costs: KernelCosts | None,
                    profiles_dir: PathLike | None, baselines: bool | Sequence[str],
                    control: SolveControl) -> PlanResult:
    """`optimize` of `graph` as given, split where `config.split_conv_grads` says so."""
    machine = machine_for(graph, config, costs, profiles_dir=profiles_dir)
    mode, fused = config.split_conv_grads, splittable_kernels(graph)
    if mode == "on" and fused:
        return _split_and_plan(machine, config, costs, profiles_dir, baselines, control,
                               [graph.kernels[k].name for k in fused])
    result = _optimize(machine, config, costs, profiles_dir, baselines, control)
    if mode != "auto" or result.status != "infeasible" or result.smallest is None or \
            machine.tensor_budget is None or control.stop_requested:
        return result
    names = splits_for_budget(machine)  # the one decision point of `--split-conv-grads auto`
    if not names:
        return result  # another kernel needs more: splitting cannot make it fit
    return _split_and_plan(machine, config, costs, profiles_dir, baselines, control, names,
                           infeasible=result)


def _split_and_plan(machine: MachineModel, config: PlanConfig, costs: KernelCosts | None,
                    profiles_dir: PathLike | None, baselines: bool | Sequence[str],
                    control: SolveControl, names: Sequence[str],
                    infeasible: PlanResult | None = None) -> PlanResult:
    """Plan the graph of `machine` with the kernels `names` split (`ir.conv_split`; chunks
    doubled where measured ones need more: `refit_chunks`) at the same budget in bytes. With
    `infeasible` (the unsplit graph's result, `--split-conv-grads auto`): that result, its
    message saying so, unless the split graph's smallest budget fits and it gets a plan."""
    graph = machine.graph
    split_config = replace(config.in_bytes(machine.user_budget), split_conv_grads="off")
    whole = Workload(graph, costs or load_costs(graph, device=config.device,
                                                profiles_dir=profiles_dir, gpu=config.gpu))

    def machine_of(entries: Sequence[str]) -> MachineModel:
        work = split_workload(whole, entries, device=config.device, gpu=config.gpu,
                              profiles_dir=profiles_dir)
        return machine_for(work.graph, split_config, work.costs, profiles_dir=profiles_dir)

    names, split_machine, least = refit_chunks(graph, names, machine_of, config.strategy)
    split, costs = split_machine.graph, split_machine.given_costs
    before = smallest_budget(machine, config.strategy).budget_bytes
    after = least.budget_bytes
    what = describe_split(graph, names)
    if infeasible is not None and split_machine.tensor_budget is not None and \
            least.plan_bytes > split_machine.tensor_budget:
        return replace(infeasible, message=f"{infeasible.message} (splitting {what} would "
                       f"lower it to {format_bytes(after)} only)")
    result = _optimize(split_machine, split_config, costs, profiles_dir, baselines, control)
    if result.plan is None:
        return infeasible or replace(result, graph=split)
    why = "so that the budget fits" if infeasible is not None else "(--split-conv-grads on)"
    note = (f"split {what} {why}: smallest feasible budget {format_bytes(before)} -> "
            f"{format_bytes(after)} (docs/planning.md)")
    return replace(result, plan=_as_asked(result.plan, config, note), graph=split)


def _optimize(machine: MachineModel, config: PlanConfig, costs: KernelCosts | None,
              profiles_dir: PathLike | None, baselines: bool | Sequence[str],
              control: SolveControl) -> PlanResult:
    """`optimize` of `machine`'s graph as it is."""
    graph = machine.graph
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
    notes = [n for n in (*machine.costs.notes(), over_device_note(machine),
                         simulated_tier_note(machine.memory)) if n]
    return noted(result, machine, notes)[0]


def run_tier_note(plan: Plan, device: str) -> str | None:
    """What a run of `plan` on `device` does not measure (`memory.tiers.cpu_run_note`)."""
    if device.startswith("cuda"):
        return None
    return cpu_run_note(MemorySystem.from_dict(dict(plan.header.memory_system),
                                               origin="plan header"))


def _with_region_instead(graph: TensorGraph, config: PlanConfig, costs: KernelCosts | None,
                         profiles_dir: PathLike | None, control: SolveControl,
                         windowed: PlanResult, machine: MachineModel
                         ) -> tuple[PlanResult, MachineModel]:
    """A plan with scratch windows whose packing never fitted: planned again with the scratch
    region (windows of huge workspaces among long-lived tensors leave holes the fit loop cannot
    always hold back: VGG19 b64 at 80%). Kept if that one gets an arena, else the first."""
    region_config = replace(config, run=replace(config.run, scratch="region"))
    region_machine = machine_for(graph, region_config, costs, profiles_dir=profiles_dir)
    result, region_machine = fit_arena(region_machine, region_config, control)
    if result.plan is None or result.plan.arena is None:
        return windowed, machine
    return noted(result, region_machine, [
        "scratch windows: their packing never fitted the budget; planned with the scratch "
        "region instead"])


def with_arena(graph: TensorGraph, plan: Plan, costs: KernelCosts | None = None, *,
               profiles_dir: PathLike | None = None) -> Plan:
    """`plan` with its buffers packed into an arena (unchanged if it has one): for running a
    plan made without one (a baseline, `--no-arena`, an older plan) at planned addresses. The
    arena may exceed the budget; the verifier says so."""
    if plan.arena is not None:
        return plan
    return plan.with_arena(arena.pack(_arena_machine(graph, plan, costs, profiles_dir), plan))


def arena_for_run(graph: TensorGraph, plan: Plan, costs: KernelCosts | None = None, *,
                  capped: bool = True, profiles_dir: PathLike | None = None
                  ) -> tuple[Plan | None, str | None]:
    """The plan to run at planned addresses: `plan` if it has an arena, else packed now
    (`with_arena`); or None with the reason where no arena can serve it, the run then using
    torch's caching allocator: its buffers cannot keep steady slots, or (`capped`: the run is
    held to the budget) the packed arena exceeds what the budget leaves."""
    if plan.arena is not None:
        return plan, None
    machine = _arena_machine(graph, plan, costs, profiles_dir)
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
    if res.host_update_s > 0:
        note = res.host_note()
        plan = plan.with_header(notes=(*plan.header.notes, note))
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
    """The `MachineModel` a plan was made for: its memory system, budget, pinning and run
    mode (an arena run where the plan has an arena layout)."""
    memory = MemorySystem.from_dict(dict(plan.header.memory_system), origin="plan header")
    memory = memory.with_budget(plan.header.budget_bytes)
    header = plan.header
    if costs is None:
        costs = load_costs(graph, device=header.device, profiles_dir=profiles_dir,
                           gpu=header.gpu)
    laid_out = plan.arena is not None
    run = RunMode(arena=laid_out, placed=laid_out and header.run.placed,
                  scratch=header.run.scratch_mode if laid_out else "region",
                  replay=header.run.replay)
    return MachineModel(graph, memory, costs, header.pin_weights, header.headroom, run=run)


def _arena_machine(graph: TensorGraph, plan: Plan, costs: KernelCosts | None,
                   profiles_dir: PathLike | None) -> MachineModel:
    """The machine of a plan, in an arena run: what packs a plan made without one."""
    machine = machine_for_plan(graph, plan, costs, profiles_dir=profiles_dir)
    return replace(machine, run=replace(machine.run, arena=True))


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


@dataclass(frozen=True)
class BudgetFacts:
    """What a budget of `config` means for a graph: the user's budget in bytes, the all-fast
    iteration and the transfer bound no plan at that budget can beat (seconds)."""

    user_budget: int | None
    all_fast_s: float
    transfer_bound_s: float


def budget_facts(graph: TensorGraph, config: PlanConfig, costs: KernelCosts) -> BudgetFacts:
    machine = machine_for(graph, config, costs)
    return BudgetFacts(machine.user_budget, machine.all_fast_time, transfer_bound(machine))


def saved_result(graph: TensorGraph, plan: Plan, config: PlanConfig, costs: KernelCosts,
                 origin: str) -> PlanResult:
    """A plan solved before (read from `origin`) as the result `optimize` gave for it."""
    h = plan.header
    return PlanResult(status=h.solver.status, plan=plan, message=f"plan from {origin}",
                      budget_bytes=h.budget_bytes, predicted_time_s=h.predicted_time_s,
                      stats=h.solver, objective_s=h.solver.objective_s,
                      all_fast_time_s=budget_facts(graph, config, costs).all_fast_s)


# Options that change how long a search may run, not which plan it finds: left out of the key
# under which `cached_optimize` keeps a plan.
NOT_IN_PLAN_KEY = ("time_limit_s", "threads")


def plan_key(graph: TensorGraph, config: PlanConfig, costs: KernelCosts) -> str:
    """The key of a plan in a plan cache: the graph, the planning options and the costs."""
    import hashlib
    import json

    options = {k: v for k, v in config.to_dict().items() if k not in NOT_IN_PLAN_KEY}
    text = json.dumps({"graph": graph.model_hash, "config": options, "costs": costs.digest},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_optimize(graph: TensorGraph, config: PlanConfig, costs: KernelCosts,
                    cache_dir: PathLike, control: SolveControl | None = None, *,
                    fresh: bool = False) -> PlanResult:
    """`optimize`, or the plan kept in `cache_dir` for the same key (`plan_key`) by a previous
    call (a verified plan that hit its time limit is kept too; an infeasible result is solved
    again, in case the costs or the solver changed what fits); `fresh`: solve and replace it."""
    stem = f"{graph.name.replace('/', '-')}-{plan_key(graph, config, costs)}"
    path = Path(cache_dir) / f"{stem}.json.gz"
    if path.is_file() and not fresh:
        try:
            plan = Plan.load(path)
            planned = planned_graph(graph, plan)
            plan.validate(planned)
        except (PlanError, AutoTMError):
            plan = None  # a damaged or foreign file: solve again and replace it
        if plan is not None:
            return replace(saved_result(planned, plan, config, costs, str(path)),
                           graph=None if planned is graph else planned)
    result = optimize(graph, config, costs=costs, control=control)
    if result.plan is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        result.plan.save(path)
    return result


# ---- running plans ------------------------------------------------------------------------
def runs_capped(plan: Plan, device: str, capped: bool = True) -> bool:
    """Whether a run holds `plan` to its budget (a cap on the GPU's allocator), a CUDA-graph
    replay and its capture included."""
    return device.startswith("cuda") and capped and plan.header.budget_bytes is not None


def run_mode_for(plan: Plan, mode: RunMode, device: str, capped: bool = True) -> RunMode:
    """The mode a run of `plan` asked for in `mode` runs in: at planned addresses where asked,
    or where a capped replay has a plan with an arena (`optimize --arena`) to replay in."""
    arena = mode.arena or (mode.replay and runs_capped(plan, device, capped) and
                           plan.arena is not None)
    return mode if arena == mode.arena else replace(mode, arena=arena)


def prepare_cuda_process(plan: Plan, device: str, mode: RunMode, capped: bool = True
                         ) -> list[str]:
    """What a process that runs `plan` in `mode` sets up before it first uses CUDA, as
    `autotm run` and each `autotm bench --arena` run do: one hardware work queue for a replay
    (at which a replay's copies run as fast as eager ones; it stays so for the process) and
    the placed allocator for an arena run (kernels allocate their outputs at their slots).
    Returns the notes of what could not be set."""
    mode = run_mode_for(plan, mode, device, capped)
    return prepare_cuda(device, mode, plan.header.budget_bytes if capped else None)


def prepare_cuda(device: str, mode: RunMode, budget_bytes: int | None) -> list[str]:
    """`prepare_cuda_process` for a run in `mode` under a cap of `budget_bytes` (None: no
    cap), before any plan exists (the Trainer sets the process up before it profiles)."""
    if not device.startswith("cuda"):
        return []
    from autotm_py.runtime.device import check_device, use_replay_work_queues
    from autotm_py.runtime.execute import install_placed

    notes = [use_replay_work_queues() if mode.replay else None]
    if mode.places_outputs:  # no GPU here: say so, before the allocator fails to compile
        notes.append(install_placed(budget_bytes, check_device(device), budget_bytes is not None))
    return [note for note in notes if note]


def default_plans_dir() -> Path:
    """Where plans are kept between runs unless told otherwise (beside the profile cache)."""
    return user_profiles_dir().parent / "plans"


def execute(graph: TensorGraph, plan: Plan, *, device: str = "cuda",
            mode: RunMode | None = None, measure: Measure | None = None,
            costs: KernelCosts | None = None, masters: Mapping[int, Any] | None = None
            ) -> RunResult:
    """Run a plan for real in `mode` and measure it (`runtime.execute.execute`). A plan
    without an arena run at planned addresses is packed first (`arena_for_run`); where no
    arena can serve it (packed now, it would exceed the capped budget) the run falls back to
    torch's caching allocator, eagerly, and its notes say why. `masters`: the initial values
    of the tensors without a producer (else seeded random values)."""
    from autotm_py.runtime.execute import execute as run_plan

    mode, measure = mode or RunMode(), measure or Measure()
    capped = runs_capped(plan, device, measure.capped)
    mode = run_mode_for(plan, mode, device, measure.capped)
    fallback = None
    if mode.arena:
        packed, fallback = arena_for_run(graph, plan, costs, capped=capped)
        if packed is None:
            mode = RunMode(placed=mode.placed)
        else:
            plan = packed
    result = run_plan(graph, plan, device=device, mode=mode, measure=measure, masters=masters)
    if mode.arena and device.startswith("cuda") and result.placed_outputs is None and \
            plan.header.run.placed:
        fallback = "; ".join(filter(None, (fallback, (
            "the plan was made for kernels allocating their outputs at their slots (optimize "
            "--placed); copied there instead, they may not fit its scratch region: re-plan "
            "with --no-placed"))))
    return replace(result, notes=(*result.notes, fallback)) if fallback else result

