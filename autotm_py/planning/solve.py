"""`optimize`: from a graph and a `PlanConfig` to a verified Plan (or an infeasible result).

Steps: resolve the memory system and the budget; price kernels (`load_costs` unless costs are
given); check the budget against the smallest feasible one; build the ILP
(`formulation.build`); solve it (`solvers.run_solver`); decode the solution into a Plan; and
simulate the plan in strict mode, which verifies it and gives its predicted time. A budget
below the smallest feasible one is a result with status ``infeasible`` that names that budget
and the kernel forcing it, never an exception.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autotm_py.errors import PlanError, SolverError
from autotm_py.machine import MachineModel
from autotm_py.memory import accounting
from autotm_py.memory.tiers import load_memory_system
from autotm_py.plan import Plan, SolverStats
from autotm_py.planning import formulation, warmstart
from autotm_py.planning.baselines import BASELINES, BaselineResult, all_fast, run_baselines
from autotm_py.planning.decode import decode
from autotm_py.planning.gadgets import small_tensors
from autotm_py.planning.solvers import SolveOutcome, run_solver
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.config import PlanConfig
    from autotm_py.costs import KernelCosts
    from autotm_py.ir.graph import TensorGraph

log = logging.getLogger(__name__)

# Small tensors whose live sum never exceeds this share of the budget stay in fast memory
# (`gadgets.small_tensors`): they would add most of the variables and move almost nothing.
SMALL_SHARE = 0.01


@dataclass(frozen=True)
class PlanResult:
    """What `optimize` found. `plan` is None when infeasible or when no plan was found in time.

    status: ``optimal`` (within the gap), ``time_limit`` (best plan found when the limit hit),
    ``infeasible`` (budget below `min_feasible_budget_bytes`, forced by `forcing_kernel`), or
    ``no_solution`` (the limit hit before any plan was found)."""

    status: str
    plan: Plan | None
    message: str
    budget_bytes: int | None
    predicted_time_s: float | None
    stats: SolverStats
    min_feasible_budget_bytes: int | None = None
    forcing_kernel: int | None = None
    forcing_kernel_name: str | None = None
    all_fast_time_s: float | None = None
    objective_s: float | None = None
    fast_peak_bytes: int | None = None
    baselines: Mapping[str, BaselineResult] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.plan is not None

    @property
    def slowdown(self) -> float | None:
        if self.predicted_time_s is None or not self.all_fast_time_s:
            return None
        return self.predicted_time_s / self.all_fast_time_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "message": self.message, "budget_bytes": self.budget_bytes,
            "predicted_time_s": self.predicted_time_s, "all_fast_time_s": self.all_fast_time_s,
            "slowdown": self.slowdown, "objective_s": self.objective_s,
            "fast_peak_bytes": self.fast_peak_bytes,
            "min_feasible_budget_bytes": self.min_feasible_budget_bytes,
            "forcing_kernel": self.forcing_kernel,
            "forcing_kernel_name": self.forcing_kernel_name,
            "solver": asdict(self.stats),
            "counts": dict(self.plan.header.counts) if self.plan else {},
            "baselines": {k: v.to_dict() for k, v in self.baselines.items()},
        }


def machine_model(graph: TensorGraph, config: PlanConfig,
                  costs: KernelCosts | None = None) -> MachineModel:
    """The memory system (with its budget), costs and pinning that `config` describes."""
    memory = load_memory_system(config.memory_name)
    pinned = accounting.pinned_tensors(graph, config.pin_weights)
    budget = accounting.resolve_budget(graph, ratio=config.ratio,
                                       fast_mem_bytes=config.fast_mem_bytes, pinned=pinned,
                                       memory=memory)
    if costs is None:
        from autotm_py.profiling.profile import load_costs

        costs = load_costs(graph, device=config.device)
    return MachineModel(graph, memory.with_budget(budget), costs, config.pin_weights,
                        config.headroom)


def min_feasible_budget(model: MachineModel, strategy: str,
                        fixed: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(bytes, kernel): the smallest budget at which a plan exists, and the kernel forcing it.

    GPU mode: a kernel's placeable inputs, outputs and workspace must all be in fast memory
    (and with the static strategy nothing moves, so the whole all-fast peak must fit). Host
    mode: only workspace must be fast; kernels can read and write the slow tier. Tensors in
    `fixed` (kept fast for life) count wherever they are alive."""
    graph = model.graph
    n = len(graph.kernels)
    if not n:
        return 0, -1
    if model.gpu and strategy == "static":
        return model.peak
    resident = model.live_bytes(fixed)
    need = []
    for k, kernel in enumerate(graph.kernels):
        io = set(kernel.io)
        own = model.io_bytes(k) - sum(int(model.sizes[t]) for t in io & fixed) if model.gpu \
            else 0
        need.append(int(model.workspace[k]) + own + int(resident[k]))
    kid = max(range(n), key=need.__getitem__)
    return need[kid], kid


def optimize(graph: TensorGraph, config: PlanConfig, *, costs: KernelCosts | None = None,
             baselines: bool | Sequence[str] = False) -> PlanResult:
    """Plan `graph` under `config` (see the module docstring). `baselines`: also plan and
    simulate these baselines (True: all of them) for comparison."""
    model = machine_model(graph, config, costs)
    result = _plan(model, config)
    if baselines and result.feasible:
        names = BASELINES if baselines is True else tuple(baselines)
        result = replace(result, baselines=run_baselines(model, names))
    return result


def _plan(model: MachineModel, config: PlanConfig) -> PlanResult:
    graph = model.graph
    common = {"budget_bytes": model.user_budget, "all_fast_time_s": model.all_fast_time}
    if model.budget is None:
        plan = all_fast(model)
        plan = plan.with_header(strategy=config.strategy, config=_config(config),
                                predicted_time_s=model.all_fast_time,
                                notes=("no budget: every tensor stays in fast memory",))
        return PlanResult("optimal", plan, "no budget: all-fast is optimal",
                          predicted_time_s=model.all_fast_time, stats=SolverStats(),
                          fast_peak_bytes=model.peak[0], **common)
    small = small_tensors(model, SMALL_SHARE)
    need, kid = min_feasible_budget(model, config.strategy, small)
    if model.budget < need and small:  # too tight to keep small tensors fast: let them move
        small = frozenset()
        need, kid = min_feasible_budget(model, config.strategy)
    if model.budget < need:
        return _infeasible(model, need, kid, config.strategy, common)
    f, outcome, stats, notes = _search(model, config, small)
    if not outcome.has_solution:
        return _unsolved(outcome.status, stats, need, kid, graph, common, config)
    if outcome.status == "time_limit":
        notes.append("time limit reached: best plan found, not proven within the gap")
    plan = decode(f, config=_config(config), solver=stats, notes=tuple(notes))
    predicted, peak = _verify(model, plan)
    plan = plan.with_header(predicted_time_s=predicted,
                            counts={**plan.header.counts, "fast_peak_bytes": peak})
    message = f"{outcome.status}: predicted {predicted * 1e3:.3f} ms per iteration"
    return PlanResult(outcome.status, plan, message, predicted_time_s=predicted, stats=stats,
                      objective_s=stats.objective_s, fast_peak_bytes=peak, **common)


def _search(model: MachineModel, config: PlanConfig, small: frozenset[int]
            ) -> tuple[formulation.Formulation, SolveOutcome, SolverStats, list[str]]:
    """Build and solve the ILP, warm-started from the smaller strategies' solutions: every
    static plan is a sync plan and every sync plan an async one (`warmstart`), so each search
    starts from a good plan and can only improve on it. If the last search finds nothing in
    time, the best earlier plan is returned."""
    started = time.perf_counter()
    chain = [s for s in ("static", "sync", "async") if not (model.gpu and s == "static")]
    chain = chain[:chain.index(config.strategy) + 1] if config.strategy in chain else \
        [config.strategy]
    notes: list[str] = []
    spent = [0.0, 0.0]  # build and solve seconds of every model in the chain
    best: tuple[formulation.Formulation, SolveOutcome] | None = None
    for strategy in chain:
        candidates = config.async_candidates if strategy == "async" else None
        f = formulation.build(model, strategy, config.async_window, candidates, small)
        log.info("built the %s ILP: %d variables, %d constraints in %.2f s", strategy,
                 f.n_vars, f.n_rows, f.build_s)
        warm = best is not None and warmstart.apply(f, warmstart.events_of(best[0]))
        left = None if config.time_limit_s is None else \
            max(config.time_limit_s - (time.perf_counter() - started), 1.0)
        outcome = _solve(f, config, left, warm=warm)
        spent = [spent[0] + f.build_s, spent[1] + outcome.seconds]
        if warm and strategy == config.strategy:
            notes.append(f"{strategy} search started from the {best[0].strategy} plan "
                         f"({best[1].objective:.3f} ms)")
        if outcome.has_solution:
            best = (f, outcome)
    f, outcome = best if best is not None else (f, outcome)
    if f.strategy != config.strategy:
        notes.append(f"the {config.strategy} search found no plan in time: this is the "
                     f"{f.strategy} plan")
        outcome = replace(outcome, status="time_limit")
    return f, outcome, _stats(config, f, outcome, spent), notes


def _stats(config: PlanConfig, f: formulation.Formulation, outcome: SolveOutcome,
           spent: list[float]) -> SolverStats:
    return SolverStats(
        solver=config.solver, status=outcome.status,
        objective_s=None if outcome.objective is None else outcome.objective / formulation.MS,
        gap=outcome.gap, variables=f.n_vars, constraints=f.n_rows, build_s=spent[0],
        solve_s=spent[1], time_limit_s=config.time_limit_s,
        hit_time_limit=outcome.status in ("time_limit", "no_solution"))


def _solve(f: formulation.Formulation, config: PlanConfig, time_limit: float | None, *,
           warm: bool) -> SolveOutcome:
    return run_solver(f.prob, config.solver, gap=config.gap, time_limit=time_limit,
                      threads=config.threads, warm_start=warm)


def _verify(model: MachineModel, plan: Plan) -> tuple[float, int]:
    """Simulate the decoded plan strictly (a violation here is a planner bug); return its
    predicted time and fast-tier peak."""
    from autotm_py.runtime.simulate import Simulator

    sim = Simulator(model.graph, plan, model, strict=True)
    try:
        sim.run()
    except PlanError as exc:
        raise SolverError(f"the decoded plan fails verification ({exc}); please report this "
                          "with the model and options") from exc
    res = sim.result()
    return res.total_s, res.fast_peak_bytes


def _infeasible(model: MachineModel, need: int, kid: int, strategy: str,
                common: dict[str, Any]) -> PlanResult:
    kernel = model.graph.kernels[kid]
    need = model.user_terms(need)  # the whole budget: with the reserve and the headroom
    why = ("the static strategy moves nothing, so the whole footprint must fit"
           if model.gpu and strategy == "static" else
           "its inputs, outputs and workspace must be in fast memory together" if model.gpu
           else "its workspace must be in fast memory")
    message = (f"infeasible: the budget of {format_bytes(model.user_budget or 0)} is below the "
               f"smallest feasible budget of {format_bytes(need)} ({need} bytes), forced by "
               f"kernel #{kid} {kernel.name!r} ({kernel.op_type}): {why}")
    return PlanResult("infeasible", None, message, predicted_time_s=None, stats=SolverStats(),
                      min_feasible_budget_bytes=need, forcing_kernel=kid,
                      forcing_kernel_name=kernel.name, **common)


def _unsolved(status: str, stats: SolverStats, need: int, kid: int, graph: TensorGraph,
              common: dict[str, Any], config: PlanConfig) -> PlanResult:
    if status == "infeasible":  # the pre-check should make this impossible
        raise SolverError(f"the solver reports the ILP infeasible although the budget is above "
                          f"the smallest feasible one ({need} bytes, kernel #{kid}); please "
                          "report this with the model and options")
    other = "cbc" if config.solver == "highs" else "highs"
    message = (f"no plan found within the time limit of {config.time_limit_s} s; raise "
               f"--time-limit or --gap, or try --solver {other}")
    return PlanResult(status, None, message, predicted_time_s=None, stats=stats,
                      min_feasible_budget_bytes=need, forcing_kernel=kid,
                      forcing_kernel_name=graph.kernels[kid].name, **common)


def _config(config: PlanConfig) -> dict[str, Any]:
    return config.to_dict()
