"""`plan`: from a machine model and a `PlanConfig` to an unverified Plan (or an infeasible
result) with the solver's statistics.

Steps: check the budget against the smallest feasible one; build the ILP
(`formulation.build`); solve it (`solvers.run_solver`); decode the solution into a Plan. A
budget below the smallest feasible one is a result with status ``infeasible`` that names that
budget and the kernel forcing it, never an exception. Resolving the machine (memory system,
budget, costs), verifying the plan by strict simulation (which gives its predicted time) and the
baselines are the pipeline's (`autotm_py.pipeline.optimize`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autotm_py.errors import SolverError
from autotm_py.ir.conv_split import split_names
from autotm_py.plan import Plan, SolverStats
from autotm_py.planning import local_search, neighbourhoods
from autotm_py.planning.baselines import BaselineResult, all_fast
from autotm_py.planning.control import SolveControl
from autotm_py.planning.decode import decode
from autotm_py.planning.feasibility import (
    Smallest,
    size_at_least,
    smallest_budget,
)
from autotm_py.planning.gadgets import small_tensors
from autotm_py.planning.recompute import (
    RecomputeSpec,
    early_window,
    fill_candidates,
    recompute_spec,
)
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.config import PlanConfig
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.machine import MachineModel
    from autotm_py.planning import formulation
    from autotm_py.planning.solvers import SolveOutcome
    from autotm_py.planning.warmstart import Events

log = logging.getLogger(__name__)

# The time limit of a search with recomputation when none is given: its deeper models are
# hard for the solvers, and each stage of the chain gets a share of it (`_chain`).
RECOMPUTE_TIME_LIMIT_S = 180.0
# The checkpoint-style start must beat the plan without early points by this share (in the sync
# model) for the search to go on with early points: where it barely does, the larger model costs
# the async stages more search than it gives (Inception-v4 b64 at 25%: 2% better in the sync
# model, 6.6% worse at the end; ResNet-200 and DenseNet-264: 10-49% better, kept to the end).
EARLY_MIN_GAIN = 0.05
# async models at least this large start from the sync plan with its copies overlapped
# (`_overlap_start`): HiGHS may not improve on the sync plan in its time there; on smaller
# models it does, and a start within the gap of the optimum would end the search at a plan
# that may pack worse into an arena (a 868-variable MLP plan did)
OVERLAP_START_MIN_VARIABLES = 50_000
# The segment spans the start tries, in eighths of W: long segments suit deep models (ResNet-200:
# 16-32 of W = 32), short ones small graphs, whose whole backward pass is shorter than W.
SEGMENT_SPANS = (8, 6, 4, 2, 1)
# Small tensors whose live sum never exceeds this share of the budget stay in fast memory
# (`gadgets.small_tensors`): they would add most of the variables and move almost nothing.
SMALL_SHARE = 0.01


@dataclass(frozen=True)
class PlanResult:
    """What `optimize` found. `plan` is None when infeasible or when no plan was found in time.

    status: ``optimal`` (within the gap), ``time_limit`` (best plan found when the limit hit),
    ``infeasible`` (budget below `min_feasible_budget_bytes`, forced by `forcing_kernel`;
    `smallest` has its parts, `message` says what does not fit), or ``no_solution`` (the limit
    hit before any plan was found)."""

    status: str
    plan: Plan | None
    message: str
    budget_bytes: int | None
    predicted_time_s: float | None
    stats: SolverStats
    min_feasible_budget_bytes: int | None = None
    forcing_kernel: int | None = None
    forcing_kernel_name: str | None = None
    smallest: Smallest | None = None  # the smallest feasible budget and its parts
    all_fast_time_s: float | None = None
    objective_s: float | None = None
    fast_peak_bytes: int | None = None
    baselines: Mapping[str, BaselineResult] = field(default_factory=dict)
    # budget_bytes = reserve_bytes + headroom + scratch_bytes + plannable_bytes (what the
    # tensors may use); scratch_bytes: arena mode's scratch region and the bytes its fit loop
    # held back
    reserve_bytes: int = 0
    plannable_bytes: int | None = None
    scratch_bytes: int = 0
    # the graph the plan is for where the pipeline rewrote the one it was given (its
    # convolution backward kernels split: `pipeline.optimize`); None: the given one
    graph: TensorGraph | None = None
    # the search's last model, for `local_search.improve` (not part of the result)
    local: local_search.LocalSearch | None = field(default=None, repr=False, compare=False)

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
            "reserve_bytes": self.reserve_bytes, "plannable_bytes": self.plannable_bytes,
            "scratch_bytes": self.scratch_bytes,
            "min_feasible_budget_bytes": self.min_feasible_budget_bytes,
            "forcing_kernel": self.forcing_kernel,
            "forcing_kernel_name": self.forcing_kernel_name,
            "smallest": None if self.smallest is None else self.smallest.to_dict(),
            "solver": asdict(self.stats),
            "counts": dict(self.plan.header.counts) if self.plan else {},
            "baselines": {k: v.to_dict() for k, v in self.baselines.items()},
            "split_conv_grads": list(split_names(self.graph)) if self.graph else [],
        }


def plan(machine: MachineModel, config: PlanConfig,
         control: SolveControl | None = None, *, local: bool = True) -> PlanResult:
    """Plan `model.graph` under `config` (see the module docstring). A solved plan comes back
    unverified: no predicted time yet, and `fast_peak_bytes` unset. `control` receives
    progress and may ask the search to stop (the best plan so far is kept). The search ends
    with a local search (`local_search.improve`) where it applies; `local=False` leaves it to
    the caller (the result's `local`; the arena's fit loop runs it once a plan packs), and the
    search still leaves it time."""
    common = {"budget_bytes": machine.user_budget, "all_fast_time_s": machine.all_fast_time,
              "reserve_bytes": machine.reserve_bytes, "plannable_bytes": machine.tensor_budget,
              "scratch_bytes": machine.scratch_reserve + machine.arena_margin}
    if machine.tensor_budget is None:
        unbounded = all_fast(machine).with_header(
            strategy=config.plan_name, config=_config(config),
            predicted_time_s=machine.all_fast_time,
            notes=("no budget: every tensor stays in fast memory",))
        return PlanResult("optimal", unbounded, "no budget: all-fast is optimal",
                          predicted_time_s=machine.all_fast_time, stats=SolverStats(),
                          fast_peak_bytes=machine.peak[0], **common)
    small, spec = _small_and_recompute(machine, config)
    ranges = spec.ranges(machine) if spec is not None else None
    least = smallest_budget(machine, config.strategy, small, ranges)
    # too tight to keep the small ones fast: they move, and the figure is without them
    if machine.tensor_budget < least.plan_bytes and small:
        small, spec = frozenset(), _spec(machine, config, frozenset())
        least = smallest_budget(machine, config.strategy)
    if machine.tensor_budget < least.plan_bytes:
        return _infeasible(least, common)
    f, outcome, stats, notes, found = _search(machine, config, small, spec,
                                              control or SolveControl())
    if not outcome.has_solution:
        if outcome.status == "infeasible" and config.recompute_mode == "only":
            return _no_recompute_only_plan(machine, stats, least, common)
        return _unsolved(outcome.status, stats, least, common, config)
    if outcome.status in local_search.LIMIT_NOTES:
        notes.append(local_search.LIMIT_NOTES[outcome.status])
    decoded = decode(f, config=_config(config), solver=stats, notes=tuple(notes))
    result = PlanResult(outcome.status, decoded, f"{outcome.status}: not verified yet",
                        predicted_time_s=None, stats=stats, objective_s=stats.objective_s,
                        local=found, **common)
    return local_search.improve(result, config, control) if local else result


def _spec(machine: MachineModel, config: PlanConfig,
          exclude: frozenset[int]) -> RecomputeSpec | None:
    """Where tensors may be regenerated (None: move-only plans)."""
    mode = config.recompute_mode
    if mode == "off":
        return None
    ratio = None if mode == "only" else config.recompute_ratio  # recompute-only: every op
    return recompute_spec(machine, depth=config.recompute_depth, ratio=ratio, exclude=exclude,
                          early=config.recompute_early)


def _small_and_recompute(machine: MachineModel, config: PlanConfig
                         ) -> tuple[frozenset[int], RecomputeSpec | None]:
    """The small tensors kept fast (counted over the live ranges that regenerations may
    extend), and the regeneration points of the others."""
    first = _spec(machine, config, frozenset())
    if first is None:
        return small_tensors(machine, SMALL_SHARE), None
    small = small_tensors(machine, SMALL_SHARE, first.ranges(machine))
    # Tensors whose range a regeneration may extend get decision points: kept fast for life
    # they would hold memory past their last use in every plan, and some move-only plans would
    # not be points of the joint model. Without the small tensors as candidates, the chains
    # (and the extensions) only shrink.
    extended = {t for t, (_, end) in enumerate(machine.live_ranges) if first.ends[t] > end}
    extended |= {z for a, z in machine.graph.carried if a in extended}  # pairs stay together
    extended |= {a for a, z in machine.graph.carried if z in extended}
    small = small - extended
    return small, _spec(machine, config, small)


@dataclass(frozen=True)
class Stage:
    """One model of the search: its strategy, recompute mode (off, on, only) and chain depth;
    `fixed`: its regenerations are fixed to the previous solution's (only the copies around
    them are searched); `share`: the most of the time limit it may use (the last stage takes
    what is left)."""

    strategy: str
    mode: str = "off"
    depth: int = 0
    fixed: bool = False
    share: float = 1.0
    early: int = 0  # regeneration points before first backward uses (`recompute_early`)


def _chain(machine: MachineModel, config: PlanConfig) -> list[Stage]:
    """The models to solve, each warm-starting the next: every static plan is a sync plan,
    every sync plan an async one, every move-only plan a joint one and every joint plan of
    depth 2 one of a larger depth (regenerations and chains only add choices). With
    recomputation: move-only sync, joint sync at depth 2, then at the configured depth, then
    with early points (`recompute_early`; started from a checkpoint-style plan), then (async)
    the async model with those regenerations fixed (a smaller search: where to copy around
    them), then the whole async model from there while time is left."""
    depth = config.recompute_depth
    deeper = [depth] if depth > 2 else []
    if config.recompute_mode == "only":
        return [Stage("sync", "only", d, share=0.4) for d in [min(depth, 2), *deeper]]
    moves = [s for s in ("static", "sync", "async") if not (machine.gpu and s == "static")]
    if config.strategy not in moves:  # GPU static: all-fast or nothing
        return [Stage(config.strategy)]
    if config.recompute_mode == "off":
        return [Stage(s) for s in moves[:moves.index(config.strategy) + 1]]
    out = [Stage(s, share=0.1) for s in moves[:moves.index("sync") + 1]]
    # the joint sync stage decides the regenerations (the async stages mostly place copies
    # around them), so it gets the largest share: DenseNet-264 b32 at 1:2 (H100 profile) needs
    # 60 s for it here, and stopped at 20% of 180 s it kept the move-only start (2.7x vs 1.25x)
    out += [Stage("sync", "on", d, share=s) for d, s in zip([min(depth, 2), *deeper],
                                                            (0.45, 0.3), strict=False)]
    early = config.recompute_early
    if early:  # the larger model with early points, started from a segment plan (`segments`):
        # HiGHS hardly improves on that start, the async stages place its copies
        out.append(Stage("sync", "on", depth, share=0.1, early=early))
    if config.strategy == "async":
        out += [Stage("async", "on", depth, fixed=True, share=0.8, early=early),
                Stage("async", "on", depth, early=early)]
    return out


def _search(machine: MachineModel, config: PlanConfig, small: frozenset[int],
            spec: RecomputeSpec | None, control: SolveControl
            ) -> tuple[formulation.Formulation | None, SolveOutcome, SolverStats, list[str],
                       local_search.LocalSearch | None]:
    """Build and solve the ILP, warm-started from the smaller models' solutions (`_chain`,
    `warmstart`), so each search starts from a good plan and can only improve on it. If the
    last search finds nothing in time, or a stop request ends the chain early, the best
    earlier plan is returned."""
    # PuLP comes in here (and in `_Search._build`), not with this module: simulating and
    # running plans import the pipeline but never solve (the GPU machine has no PuLP)
    from autotm_py.planning.solvers import SolveOutcome

    specs = {(spec.depth, config.recompute_early): spec} if spec is not None else {}
    search = _Search(machine, config, small, control, limit=_search_limit(config), specs=specs,
                     outcome=SolveOutcome("interrupted", None, None, None, 0.0,
                                          has_values=False))
    stages = _chain(machine, config)
    for i, stage in enumerate(stages):
        if control.stop_requested:
            break
        if search.early_dropped:
            stage = replace(stage, early=0)
        last = i == len(stages) - 1
        if last and search.no_time_for_last(stage, stages[i - 1] if i else None):
            break  # too little time left to search the whole async model
        search.run(stage, last)
    f, outcome, stats, notes = search.ended()
    return f, outcome, stats, notes, local_search.start(search, outcome, stats,
                                                       _config(config))


def _search_limit(config: PlanConfig) -> float | None:
    """The time limit of the whole search: the configured one, else with recomputation
    `RECOMPUTE_TIME_LIMIT_S`."""
    if config.time_limit_s is None and config.recompute_mode != "off":
        return RECOMPUTE_TIME_LIMIT_S
    return config.time_limit_s


@dataclass
class _Search:
    """The search over the stages of `_chain`: what it carries from one stage to the next."""

    machine: MachineModel
    config: PlanConfig
    small: frozenset[int]
    control: SolveControl
    limit: float | None
    # the regeneration points of each (depth, early) the stages use
    specs: dict[tuple[int, int], RecomputeSpec | None]
    outcome: SolveOutcome  # the last stage's
    f: formulation.Formulation | None = None  # the last model built
    started: float = field(default_factory=lambda: time.perf_counter())
    notes: list[str] = field(default_factory=list)
    # build and solve seconds of every model in the chain
    spent: list[float] = field(default_factory=lambda: [0.0, 0.0])
    best: tuple[formulation.Formulation, SolveOutcome] | None = None
    fixed: bool = False  # the best plan's search had its regenerations fixed
    # the checkpoint-style start did not pay: no early points from here
    early_dropped: bool = False
    # the plan the final model's search started from: (its model's name, objective in ms)
    start: tuple[str, float] | None = None
    areas: list[list[Any]] | None = None  # the last model's neighbourhoods, where it has some

    def no_time_for_last(self, stage: Stage, previous: Stage | None) -> bool:
        """The last stage searches the whole async model after the one with regenerations
        fixed: not worth starting with less than 15% of the time limit left and a plan in
        hand."""
        if stage.fixed or previous is None or not previous.fixed:
            return False
        if self.limit is None or self.best is None:
            return False
        return self.limit - (time.perf_counter() - self.started) < 0.15 * self.limit

    def run(self, stage: Stage, last: bool) -> None:
        """Build the stage's model, start it from the best plan so far and solve it (a stage
        that `_start` drops is built, not solved, and drops early points from the rest)."""
        f = self.f = self._build(stage)
        warm = _start(f, stage, self.best, self.notes)
        if warm is None:
            self.early_dropped = True
            return
        self._solve_stage(f, stage, warm, last)

    def _build(self, stage: Stage) -> formulation.Formulation:
        import autotm_py.planning.formulation as formulation  # PuLP: only where it solves

        config = self.config
        candidates = config.async_candidates if stage.strategy == "async" else None
        recompute = self._recompute(stage)
        self.control.report(stage="building", strategy=_stage_name(stage), solver=config.solver)
        f = formulation.build(self.machine, stage.strategy, config.async_window, candidates,
                              self.small, recompute=recompute, moves=stage.mode != "only",
                              spread_reads=config.read_pricing == "spread",
                              spread_writes=config.write_pricing == "spread",
                              fills=fill_candidates(self.machine, config.fills))
        log.info("built the %s ILP (depth %d%s): %d variables, %d constraints in %.2f s",
                 f.name, stage.depth, ", regenerations fixed" if stage.fixed else "",
                 f.n_vars, f.n_rows, f.build_s)
        return f

    def _recompute(self, stage: Stage) -> RecomputeSpec | None:
        """The stage's regeneration points (None for a move-only stage), made once per depth
        and early window."""
        if stage.mode == "off":
            return None
        key = (stage.depth, stage.early)
        if key not in self.specs:
            self.specs[key] = _spec(self.machine, replace(self.config, recompute_depth=stage.depth,
                                                          recompute_early=stage.early),
                                    self.small)
        return self.specs[key]

    def _time_left(self, stage: Stage, last: bool) -> float | None:
        """The stage's time limit: what is left of the search's, at most the stage's share of
        it unless it is the last."""
        if self.limit is None:
            return None
        left = max(self.limit - (time.perf_counter() - self.started), 1.0)
        if not last:
            left = min(left, max(stage.share * self.limit, 1.0))
        return left

    def _solve_stage(self, f: formulation.Formulation, stage: Stage, warm: bool,
                     last: bool) -> None:
        left = self._time_left(stage, last)
        if last and local_search.applies(self.config, stage.strategy, stage.mode, stage.fixed,
                                         self.limit):
            self.areas = neighbourhoods.neighbourhoods(f)
            if self.areas and left is not None:  # the neighbourhoods get the rest (`improve`)
                left = min(left, max(local_search.WHOLE_MODEL_SHARE * self.limit, 1.0))
        best, control = self.best, self.control
        control.report(stage="stopping" if control.stop_requested else "solving",
                       incumbent=best[1].objective if warm and best else None)
        outcome = self.outcome = _solve(f, self.config, left, warm=warm, control=control)
        self.spent = [self.spent[0] + f.build_s, self.spent[1] + outcome.seconds]
        if warm and f.name == self.config.plan_name and best[0].name != f.name:
            self.notes.append(f"{f.name} search started from the {best[0].name} plan "
                              f"({best[1].objective:.3f} ms)")
            self.start = (best[0].name, best[1].objective)
        self._keep(f, outcome, stage.fixed and warm)

    def _keep(self, f: formulation.Formulation, outcome: SolveOutcome, fixed: bool) -> None:
        """Keep the stage's plan if it is the first, of a new model, or no worse than the best
        of its model."""
        best = self.best
        if outcome.has_solution and (best is None or best[0].name != f.name or
                                     outcome.objective <= best[1].objective + 1e-9):
            self.best = (f, outcome)
            self.fixed = fixed

    def ended(self) -> tuple[formulation.Formulation | None, SolveOutcome, SolverStats,
                             list[str]]:
        """`_search`'s result: the best plan's model and outcome, or the last ones when no
        stage found a plan."""
        if self.best is None:
            return self.f, self.outcome, _stats(self.config, self.f, self.outcome, self.spent,
                                                self.limit), self.notes
        f, outcome = self.best
        self._note_unimproved(f, outcome)
        outcome = _settled(f, outcome, self.config, self.notes, fixed=self.fixed,
                           stopped=self.control.stop_requested)
        return f, outcome, _stats(self.config, f, outcome, self.spent, self.limit), self.notes

    def _note_unimproved(self, f: formulation.Formulation, outcome: SolveOutcome) -> None:
        """A search stopped (time limit, Ctrl-C) no better than the plan it started from
        returns that plan under the final model's name: say which plan it is."""
        start = self.start
        if start is None or f.name != self.config.plan_name or outcome.status == "optimal" \
                or outcome.objective is None or outcome.objective < start[1] - 1e-6:
            return
        why = "its time limit" if outcome.status == "time_limit" else "the stop"
        self.notes.append(f"{f.name} search reached {why} without improving on the {start[0]} "
                          f"plan it started from: this plan is that one, under the {f.name} "
                          "name; a longer --time-limit may find a faster one")


def _start(f: formulation.Formulation, stage: Stage,
           best: tuple[formulation.Formulation, SolveOutcome] | None,
           notes: list[str]) -> bool | None:
    """Warm-start `f` from the best plan so far (`warmstart`): whether it started warm, or
    None where the stage is dropped, with every early point after it: the first stage with
    early points, where its checkpoint-style start does not pay (`_segment_start`; HiGHS
    hardly improves the larger model on its own)."""
    import autotm_py.planning.warmstart as warmstart

    base = warmstart.events_of(best[0]) if best is not None else None
    warm = base is not None and warmstart.apply(f, base)
    segmented = False
    if stage.early and not stage.fixed:
        segmented = warm and _segment_start(f, base, best[1].objective, stage.early, notes)
        if stage.strategy == "sync" and not segmented:
            if not warm:
                notes.append(f"{f.name}: no plan to start the early points from; not used")
            return None
    if warm and stage.fixed:
        warmstart.fix_regenerations(f)
    if warm and f.strategy == "async" and not segmented and \
            f.n_vars >= OVERLAP_START_MIN_VARIABLES:
        warmstart.overlap_start(f, base)  # type: ignore[arg-type]
    return warm


def _segment_start(f: formulation.Formulation, base: Events, base_ms: float,
                   early: int, notes: list[str]) -> bool:
    """Start the model with early points from a checkpoint-style plan (`segments`) when one
    fits and is `EARLY_MIN_GAIN` faster than `base`, the previous stage's plan (`base_ms`),
    which `f` holds on entry and gets back otherwise. Whether it did: where it did not, the
    search goes on without early points (on its own HiGHS hardly improves on the smaller
    model's plan in the larger model, and the async stages of the larger model get less far
    in the same time: Inception-v4 b64 at 25%, docs/planning.md "Early points")."""
    import autotm_py.planning.segments as segments
    import autotm_py.planning.warmstart as warmstart

    early = early_window(f.machine.graph, early)
    spans = tuple(sorted({max(early * k // 8, 1) for k in SEGMENT_SPANS}, reverse=True))
    found = segments.segment_start(f, base, spans)
    if found is not None and found[0] < base_ms * (1 - EARLY_MIN_GAIN):
        warmstart.apply(f, found[2])
        notes.append(f"{f.name} with early points started from a checkpoint-style plan "
                     f"(span {found[1]}: {found[0]:.3f} ms; {base_ms:.3f} ms without)")
        return True
    warmstart.apply(f, base)
    if f.strategy == "sync":  # the async stages keep their early points, started from `base`
        start = "none fits" if found is None else f"{found[0]:.3f} ms"
        notes.append(f"{f.name}: early points not used (checkpoint-style start: {start}; "
                     f"{base_ms:.3f} ms without; it must be {EARLY_MIN_GAIN:.0%} faster)")
    return False


def _settled(f: formulation.Formulation, outcome: SolveOutcome, config: PlanConfig,
             notes: list[str], *, fixed: bool, stopped: bool) -> SolveOutcome:
    """The best plan's outcome as the search ended: a plan of an earlier stage than the one
    asked for, or any plan when a stop ended the search, is not proven within the gap."""
    if fixed:
        notes.append(f"{f.name}: the copies were searched around the regenerations of the "
                     f"sync+recompute plan (fixed); the gap is that search's")
    if f.name != config.plan_name:
        notes.append(f"the {config.plan_name} search was "
                     f"{'stopped' if stopped else 'out of time'} before it found a plan: this "
                     f"is the {f.name} plan")
        return replace(outcome, status="interrupted" if stopped else "time_limit")
    if stopped and outcome.status not in ("interrupted", "time_limit"):
        return replace(outcome, status="interrupted")
    return outcome


def _stage_name(stage: Stage) -> str:
    """The status line's name of a stage: the plan name it searches."""
    if stage.mode == "only":
        return "recompute-only"
    return stage.strategy if stage.mode == "off" else f"{stage.strategy}+recompute"


def _stats(config: PlanConfig, f: formulation.Formulation | None, outcome: SolveOutcome,
           spent: list[float], limit: float | None) -> SolverStats:
    """`f` is None when a stop came before the first model was built."""
    from autotm_py.planning.formulation import MS

    return SolverStats(
        solver=config.solver, status=outcome.status,
        objective_s=None if outcome.objective is None else outcome.objective / MS,
        gap=outcome.gap, variables=f.n_vars if f else 0, constraints=f.n_rows if f else 0,
        build_s=spent[0],
        solve_s=spent[1], time_limit_s=limit,
        hit_time_limit=outcome.status in ("time_limit", "no_solution"))


def _solve(f: formulation.Formulation, config: PlanConfig, time_limit: float | None, *,
           warm: bool, control: SolveControl) -> SolveOutcome:
    from autotm_py.planning.solvers import run_solver

    return run_solver(f.prob, config.solver, gap=config.gap, time_limit=time_limit,
                      threads=config.threads, warm_start=warm, control=control)


def _infeasible(least: Smallest, common: dict[str, Any]) -> PlanResult:
    """A budget below the smallest feasible one: its message says why (`Smallest.message`)."""
    return PlanResult("infeasible", None, least.message(common["budget_bytes"] or 0),
                      predicted_time_s=None, stats=SolverStats(), **_forced(least), **common)


def _forced(least: Smallest, figure: bool = True) -> dict[str, Any]:
    """The result's fields of the smallest feasible budget (`figure`: with it)."""
    return {"min_feasible_budget_bytes": least.budget_bytes if figure else None,
            "forcing_kernel": least.kernel, "forcing_kernel_name": least.kernel_name,
            "smallest": least}


def packing_note(result: PlanResult) -> str:
    """The note of a plan left without an arena because, with the packing's holes held back,
    the budget became infeasible: by how much, and the budget that would hold them."""
    least = result.smallest
    if least is None:
        return ("no arena: with the packing's holes held back the budget is infeasible; the "
                "plan runs on torch's caching allocator")
    return (f"no arena: with the packing's holes held back ({format_bytes(least.margin_bytes)}"
            f") the budget of {format_bytes(result.budget_bytes or 0)} is below the smallest "
            f"feasible one, {format_bytes(least.budget_bytes)} (kernel #{least.kernel} "
            f"{least.kernel_name!r}, {least.op_type}); the plan runs on torch's caching "
            f"allocator (--fast-mem {size_at_least(least.budget_bytes)} or more may give it "
            "one)")


def _no_recompute_only_plan(machine: MachineModel, stats: SolverStats, least: Smallest,
                            common: dict[str, Any]) -> PlanResult:
    """Recompute-only plans cannot move anything: a budget above the smallest feasible one
    (where a plan that moves exists) may still have none."""
    message = (f"infeasible: no recompute-only plan fits the budget of "
               f"{format_bytes(machine.user_budget or 0)} (nothing may move; a plan that moves "
               f"exists from {format_bytes(least.budget_bytes)}: use --recompute on)")
    return PlanResult("infeasible", None, message, predicted_time_s=None, stats=stats,
                      **_forced(least, figure=False), **common)


def _unsolved(status: str, stats: SolverStats, least: Smallest, common: dict[str, Any],
              config: PlanConfig) -> PlanResult:
    if status == "infeasible":  # the pre-check should make this impossible
        raise SolverError(f"the solver reports the ILP infeasible although the budget is above "
                          f"the smallest feasible one ({least.budget_bytes} bytes, kernel "
                          f"#{least.kernel}); please report this with the model and options")
    other = "cbc" if config.solver == "highs" else "highs"
    limit = "no time limit" if stats.time_limit_s is None else \
        f"the time limit of {stats.time_limit_s:g} s"
    message = "interrupted before any plan was found" if status == "interrupted" else \
        (f"no plan found within {limit}; raise --time-limit or --gap, or try --solver {other}")
    return PlanResult(status, None, message, predicted_time_s=None, stats=stats,
                      **_forced(least), **common)


def _config(config: PlanConfig) -> dict[str, Any]:
    return config.to_dict()
