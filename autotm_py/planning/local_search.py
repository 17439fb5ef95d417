"""The local search that ends a search on a deep network (docs/planning.md, "Neighbourhood
search").

The whole async model with recomputation of ResNet-200 (286k variables) is too large for HiGHS
to improve on in minutes: started from the plan with its regenerations fixed, its whole-model
search ran 208 s on this project's 2-core machine without one better plan. So after the chain
(`solve._chain`), where the whole search did not prove its plan within the gap, the model is
solved again and again with every integer variable fixed at the best plan's value but those of
one neighbourhood (`neighbourhoods`), each solve warm-started from that plan, whose place a
better solution takes. Every point kept is a plan of the whole model; a local search proves
nothing, so its result is marked ``time_limit``.

`solve.plan` runs it at the end of its search; the arena's fit loop (`fitting.fit_arena`) runs
it once a plan packs (`solve.plan(..., local=False)`, then `improve_packed`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autotm_py import arena
from autotm_py.plan import SolverStats
from autotm_py.planning.control import SolveControl
from autotm_py.planning.decode import decode

if TYPE_CHECKING:
    import pulp

    from autotm_py.config import PlanConfig
    from autotm_py.machine import MachineModel
    from autotm_py.planning.formulation import Formulation
    from autotm_py.planning.solve import PlanResult, _Search
    from autotm_py.planning.solvers import BulkHiGHS, SolveOutcome

log = logging.getLogger(__name__)

# Where a local search follows, the whole async model's search gets at most this share of the
# time limit (the neighbourhoods get what is left); each neighbourhood's solve at most
# NEIGHBOURHOOD_SHARE of it; the local search does not start with less than NEIGHBOURHOOD_MIN_S
# left
WHOLE_MODEL_SHARE = 0.15
NEIGHBOURHOOD_SHARE = 0.05
NEIGHBOURHOOD_MIN_S = 5.0
# Each neighbourhood's solve stops this close to its bound (relative to the whole iteration): one
# neighbourhood gains 0.1-0.3% of ResNet-200's step, less than the default gap of 1%
NEIGHBOURHOOD_GAP = 5e-4
# A neighbourhood's solution replaces the incumbent when it is at least this much better
# (relative): HiGHS stops within its gap, so smaller "gains" are noise of its tolerances.
NEIGHBOURHOOD_MIN_GAIN = 1e-6
# Another round follows a round that gained at least this much (relative, all its
# neighbourhoods together): each solve is only proven within NEIGHBOURHOOD_GAP, and the
# quick start's ResNet-50 at 1:4 spent 51 solves, 51 s, on rounds of 0.035% (2026-12-07)
ROUND_MIN_GAIN = NEIGHBOURHOOD_GAP

LIMIT_NOTES = {
    "time_limit": "time limit reached: best plan found, not proven within the gap",
    "interrupted": "interrupted: best plan found when the search was stopped, not proven "
                   "within the gap"}


@dataclass(frozen=True)
class LocalSearch:
    """A finished search's last model, holding its best plan, with what `improve` needs to
    search its neighbourhoods and decode what it finds."""

    f: Formulation
    areas: list[list[Any]]
    outcome: SolveOutcome
    stats: SolverStats
    notes: tuple[str, ...]
    bound: float | None  # the whole model's (ms), from its search
    started: float  # perf_counter when the search started
    limit: float | None  # the search's time limit
    header: dict[str, Any]  # the plan header's config (`solve._config`)

    def time_left(self) -> float:
        if self.limit is None:
            return 0.0
        return self.limit - (time.perf_counter() - self.started)


def start(search: _Search, outcome: SolveOutcome, stats: SolverStats, header: dict[str, Any]
          ) -> LocalSearch | None:
    """What `improve` needs after `search` (`solve._search`): its last model, holding the best
    plan (put there from the stage that found it), where that model has neighbourhoods, the
    search found a plan, was not stopped and did not prove it within the gap."""
    import autotm_py.planning.warmstart as warmstart

    f, best = search.f, search.best
    if not search.areas or best is None or f is None or f.name != best[0].name or \
            search.control.stop_requested or outcome.status == "optimal" or \
            not outcome.has_solution:
        return None
    if best[0] is not f and not warmstart.apply(f, warmstart.events_of(best[0])):
        return None
    return LocalSearch(f, search.areas, outcome, stats, tuple(search.notes),
                       search.outcome.bound, search.started, search.limit, header)


def applies(config: PlanConfig, strategy: str, mode: str, fixed: bool, limit: float | None
            ) -> bool:
    """Whether a local search may follow a stage: the whole async model with recomputation,
    solved by HiGHS (which takes one model and many bounds), under a time limit."""
    return (strategy == "async" and mode == "on" and not fixed and config.solver == "highs"
            and limit is not None)


def improve(result: PlanResult, config: PlanConfig, control: SolveControl | None = None,
            time_limit: float | None = None,
            accept: Callable[[np.ndarray], bool] | None = None) -> PlanResult:
    """`result` with a faster plan where the search of its neighbourhoods finds one, for
    `time_limit` seconds (by default what is left of the search's limit); `result` as it is
    where the search left no neighbourhoods (a small model, a proof within the gap, a stop,
    CBC) or no time. `accept`: whether a better point may replace the incumbent (a plan that
    packs; `improve_packed`). The result keeps no model (`local` None)."""
    from autotm_py.planning.formulation import MS

    local = result.local
    if local is None:
        return result
    left = local.time_left() if time_limit is None else time_limit
    control = control or SolveControl()
    if left < NEIGHBOURHOOD_MIN_S or control.stop_requested:
        return replace(result, local=None)
    control.report(stage="solving", strategy=f"{local.f.name} (neighbourhoods)")
    found = improve_in_neighbourhoods(
        local.f.prob, local.areas, gap=min(config.gap, NEIGHBOURHOOD_GAP), time_limit=left,
        each_s=max(NEIGHBOURHOOD_MIN_S, NEIGHBOURHOOD_SHARE * (local.limit or left)),
        threads=config.threads, control=control, accept=accept)
    before = local.outcome.objective
    if found.objective >= before - 1e-6:
        return replace(result, local=None)
    gap = None if local.bound is None else max(found.objective - local.bound, 0.0) / \
        found.objective
    status = "interrupted" if control.stop_requested else "time_limit"
    stats = replace(local.stats, status=status, objective_s=found.objective / MS, gap=gap,
                    solve_s=local.stats.solve_s + found.seconds, hit_time_limit=True)
    notes = [n for n in local.notes if "without improving on the" not in n and
             n not in LIMIT_NOTES.values()]
    notes += [f"{local.f.name}: a search of {len(local.areas)} neighbourhoods improved it "
              f"from {before:.3f} to {found.objective:.3f} ms in {found.seconds:.0f} s",
              LIMIT_NOTES[status]]
    decoded = decode(local.f, config=local.header, solver=stats, notes=tuple(notes))
    return replace(result, status=status, plan=decoded, message=f"{status}: not verified yet",
                   stats=stats, objective_s=stats.objective_s, local=None)


def improve_packed(machine: MachineModel, config: PlanConfig, result: PlanResult,
                   layout: arena.ArenaLayout, control: SolveControl | None, notes: list[str]
                   ) -> tuple[PlanResult, arena.ArenaLayout]:
    """`improve` of a plan the arena's fit loop has packed (`layout`), whose incumbents are
    only plans that pack within the arena's limit (`Packs`): its plan and packing, else
    `result` and `layout` (a note says so). Run before the packing, a plan that did not pack
    would leave the re-solve no time; packed only at its end, the search's last plan did not
    pack in most searches that ended at a full arena (ResNet-50 fp32 at 25%: the search went
    from 92.3 to 59.4 ms, not packing, while its second incumbent, 74.8 ms, packed)."""
    accept = None if result.local is None or machine.arena_limit is None else \
        Packs(machine, result.local, machine.arena_limit)
    better = improve(result, config, control, accept=accept)
    if better.plan is result.plan or better.plan is None:
        return better, layout
    if accept is not None and accept.layout is not None:
        return better, accept.layout  # the last point it accepted: the search's best
    try:
        packed = arena.pack(machine, better.plan, limit=machine.arena_limit)
    except arena.ArenaError:
        packed = None
    if packed is not None and (machine.arena_limit is None or
                               packed.nbytes <= machine.arena_limit):
        return better, packed
    notes.append(f"arena: the local search's plan ({better.stats.objective_s * 1e3:.3f} ms) "
                 "did not pack; the plan before it is kept")
    return result, layout


@dataclass
class Packs:
    """Called with a point of `local`'s model: whether its plan packs into `limit` bytes
    (`arena.pack`; the model's variables are left holding the point). `layout` is the packing
    of the last point it accepted, which the search's incumbent then is, so that its plan is
    not packed again."""

    machine: MachineModel
    local: LocalSearch
    limit: int
    layout: arena.ArenaLayout | None = None

    def __call__(self, point: np.ndarray) -> bool:
        for v in self.local.f.prob.variables():
            v.varValue = float(point[v.index])
        plan = decode(self.local.f, config=self.local.header, solver=self.local.stats,
                      notes=())
        try:
            layout = arena.pack(self.machine, plan, limit=self.limit)
        except arena.ArenaError:
            return False
        if layout.nbytes > self.limit:
            return False
        self.layout = layout
        return True


@dataclass
class _Incumbent:
    """The search's best point over all of `prob`'s variables, and its objective (ms)."""

    point: np.ndarray
    value: float


def improve_in_neighbourhoods(prob: pulp.LpProblem, neighbourhoods: Sequence[Sequence[Any]], *,
                              gap: float, time_limit: float, each_s: float,
                              threads: int | None = None,
                              control: SolveControl | None = None,
                              accept: Callable[[np.ndarray], bool] | None = None
                              ) -> SolveOutcome:
    """Improve the plan the variables of `prob` hold (a feasible point) by solving it with every
    integer variable fixed at the incumbent but those of one neighbourhood (a list of `prob`'s
    variables), each solve at most `each_s` seconds and warm-started from the incumbent, which a
    better solution replaces. The neighbourhoods are taken in turn, round after round, until a
    round improves the plan by less than ROUND_MIN_GAIN, `time_limit` is spent or `control`
    asks to stop. `accept`: whether a better point may replace the incumbent (one it refuses
    is passed over, and the search goes on from the incumbent). HiGHS gets the model once;
    only its column bounds change between solves.
    Ends ``time_limit`` (or ``interrupted``) with the best point on the variables and no
    bound."""
    from autotm_py.planning.solvers import HIGHS_INTEGRALITY_TOL, BulkHiGHS, SolveOutcome

    control = control or SolveControl()
    started = time.perf_counter()
    solver = BulkHiGHS(msg=False, gapRel=gap, timeLimit=each_s, threads=threads,
                       control=control, mip_feasibility_tolerance=HIGHS_INTEGRALITY_TOL)
    h = solver.load(prob)
    variables, cost, constant, ints, bounds = _columns(prob)
    point = np.array([v.varValue or 0.0 for v in variables], dtype=float)
    best = _Incumbent(point, float(cost @ point) + constant)
    solves, refused, improved = 0, 0, True
    while improved and not control.stop_requested:
        round_start = best.value
        for free in neighbourhoods:
            left = time_limit - (time.perf_counter() - started)
            if left < 1.0 or control.stop_requested:
                break
            freed = np.isin(ints, np.array([v.index for v in free], dtype=np.int32))
            found = _solve_one(solver, h, best.point, ints[~freed],
                               (bounds[0][~freed], bounds[1][~freed]), min(each_s, left))
            if found is _ABANDONED:
                break
            solves += 1
            value = float(cost @ found) + constant if found is not None else best.value
            if value >= best.value * (1 - NEIGHBOURHOOD_MIN_GAIN):
                continue
            if accept is not None and not accept(found):
                refused += 1
                log.info("neighbourhood %d: %.3f ms refused (does not pack)", solves, value)
                continue
            log.info("neighbourhood %d: %.3f -> %.3f ms", solves, best.value, value)
            best = _Incumbent(found, value)
        improved = best.value < round_start * (1 - ROUND_MIN_GAIN)
    for v in variables:
        v.varValue = float(best.point[v.index])
    seconds = time.perf_counter() - started
    log.info("neighbourhood search: %d solves in %.1f s, objective %.3f ms (%d better points "
             "refused)", solves, seconds, best.value, refused)
    status = "interrupted" if control.stop_requested else "time_limit"
    return SolveOutcome(status, best.value, None, None, seconds)


def _columns(prob: pulp.LpProblem) -> tuple[list[Any], np.ndarray, float, np.ndarray,
                                             tuple[np.ndarray, np.ndarray]]:
    """`prob`'s variables, objective coefficients and constant, and its integer columns with
    their bounds."""
    import pulp

    from autotm_py.planning.solvers import objective_constant

    variables = prob.variables()
    cost = np.array([(prob.objective or {}).get(v, 0.0) for v in variables], dtype=float)
    ints = np.array([v.index for v in variables if v.cat == pulp.LpInteger], dtype=np.int32)
    bounds = (np.array([v.lowBound or 0.0 for v in variables])[ints],
              np.array([1.0 if v.upBound is None else v.upBound for v in variables])[ints])
    return variables, cost, objective_constant(prob), ints, bounds


_ABANDONED = np.zeros(0)  # `_solve_one`'s answer to an immediate stop


def _solve_one(solver: BulkHiGHS, h: Any, point: np.ndarray, fixed: np.ndarray,
               bounds: tuple[np.ndarray, np.ndarray], seconds: float) -> np.ndarray | None:
    """One neighbourhood's solve: the `fixed` columns at their values in `point`, started from
    `point`; its feasible solution, None, or `_ABANDONED`. The bounds are put back after the
    solution is read (changing a bound clears HiGHS's solution)."""
    import highspy

    from autotm_py.planning.solvers import Abandoned

    values = np.round(point[fixed])
    h.changeColsBounds(len(fixed), fixed, values, values)
    h.setOptionValue("time_limit", float(seconds))
    start = highspy.HighsSolution()
    start.col_value = point.tolist()
    start.value_valid = True
    h.setSolution(start)
    try:
        solver.run_watched(h)
        if h.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
            return None
        return np.array(h.getSolution().col_value, dtype=float)
    except Abandoned:
        return _ABANDONED
    finally:
        h.changeColsBounds(len(fixed), fixed, *bounds)
