"""The local search around a plan: neighbourhoods of the ILP (`planning.neighbourhoods`), their
solves on one HiGHS model (`local_search.improve_in_neighbourhoods`) and the search's last step
(`local_search.improve`), in `optimize` and after the arena's fit loop."""

from dataclasses import replace

import pulp
import pytest

from autotm_py.config import PlanConfig
from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import preset
from autotm_py.options import RunMode
from autotm_py.pipeline import optimize, simulate
from autotm_py.planning import local_search, neighbourhoods, solve, warmstart
from autotm_py.planning.local_search import improve_in_neighbourhoods
from autotm_py.planning.solvers import run_solver
from tests.graphs import costs_for, layered_net, sync_and_async_at_a_third


def _async_model_started_from_sync(blocks: int = 4):
    """The async model of a DenseNet-like training graph at a third of its peak, holding the
    sync plan (a feasible point, slower than the async optimum: its copies block)."""
    sync, f = sync_and_async_at_a_third(blocks)
    assert warmstart.apply(f, warmstart.events_of(sync))
    return f


def test_neighbourhoods_cover_every_decision_in_overlapping_windows():
    f = _async_model_started_from_sync()
    target = 300
    areas = neighbourhoods.neighbourhoods(f, target)
    edges = {v.name for xs in f.x for v in xs}
    assert len(edges) >= 2 * target and len(areas) >= 4
    covered = set()
    for area in areas:
        names = {v.name for v in area}
        assert names <= edges | {z.name for z, _ in f.regen.values() if z is not None}
        assert all(v.cat == pulp.LpInteger for v in area)
        covered |= names
    assert covered == edges  # each tensor's decisions are free in some neighbourhood
    # a model smaller than two windows has none: it is searched whole
    assert neighbourhoods.neighbourhoods(f, len(edges)) == []


def test_a_search_of_neighbourhoods_improves_a_plan_and_keeps_every_row():
    f = _async_model_started_from_sync()
    start = warmstart.objective_value(f)
    areas = neighbourhoods.neighbourhoods(f, 300)
    found = improve_in_neighbourhoods(f.prob, areas, gap=0.0, time_limit=120, each_s=20)
    assert found.status == "time_limit" and found.bound is None  # a local search proves nothing
    assert found.objective < start * (1 - 1e-3)
    assert warmstart.objective_value(f) == pytest.approx(found.objective, rel=1e-9)
    assert warmstart.holds(f)  # the point left on the variables is a plan of the whole model
    whole = run_solver(f.prob, "highs", gap=0.0, time_limit=120)
    assert whole.status == "optimal" and whole.objective <= found.objective * (1 + 1e-9)


def test_a_round_that_gains_less_than_its_solves_gap_is_the_last(monkeypatch, caplog):
    """Rounds go on while a round gains at least `ROUND_MIN_GAIN` (relative): asked for a gain
    no round can make, the search stops after its first round, one solve per neighbourhood."""
    f = _async_model_started_from_sync()
    start = warmstart.objective_value(f)
    areas = neighbourhoods.neighbourhoods(f, 300)
    monkeypatch.setattr(local_search, "ROUND_MIN_GAIN", 0.99)
    with caplog.at_level("INFO", logger="autotm_py.planning.local_search"):
        found = improve_in_neighbourhoods(f.prob, areas, gap=0.0, time_limit=120, each_s=20)
    (line,) = [r.getMessage() for r in caplog.records if "neighbourhood search:" in r.message]
    assert line.startswith(f"neighbourhood search: {len(areas)} solves")
    assert found.objective < start * (1 - 1e-3)  # the first round improved it


def test_one_neighbourhood_of_every_variable_is_the_whole_search():
    f = _async_model_started_from_sync(3)
    everything = [v for v in f.prob.variables() if v.cat == pulp.LpInteger]
    found = improve_in_neighbourhoods(f.prob, [everything], gap=0.0, time_limit=120, each_s=60)
    whole = run_solver(f.prob, "highs", gap=0.0, time_limit=120)
    assert found.objective == pytest.approx(whole.objective, rel=1e-6)


def _whole_search_finds_nothing(monkeypatch):
    """The async model's searches return their start, as the whole model's does on ResNet-200
    in minutes (the sync stages before them run as they do)."""
    real = solve._solve

    def sync_only(f, config, time_limit, *, warm, control):
        if f.strategy == "async" and warm:
            from autotm_py.planning.solvers import SolveOutcome
            return SolveOutcome("time_limit", warmstart.objective_value(f), None, None, 0.0)
        return real(f, config, time_limit, warm=warm, control=control)

    monkeypatch.setattr(solve, "_solve", sync_only)
    monkeypatch.setattr(neighbourhoods, "NEIGHBOURHOOD_VARIABLES", 300)


def _config(**kw):
    base = {"strategy": "async", "recompute": "on", "device": "cuda", "solver": "highs",
            "gap": 0.0, "time_limit_s": 120.0, "run": RunMode(), "reserve_bytes": 0}
    return PlanConfig(**{**base, **kw})


@pytest.mark.parametrize("arena", [False, True])
def test_optimize_ends_with_a_local_search_where_the_whole_search_stops_short(monkeypatch, arena):
    g = layered_net(4, width=3, kib=256)
    costs = costs_for(g, "cuda")
    peak = MachineModel(g, preset("h100-pcie5"), costs).peak[0]
    run = RunMode(arena=True, replay=True) if arena else RunMode()
    config = _config(fast_mem_bytes=peak // 3, run=run)
    _whole_search_finds_nothing(monkeypatch)
    monkeypatch.setattr(local_search, "NEIGHBOURHOOD_MIN_S", 1e9)  # no time for the neighbourhoods
    without = optimize(g, config, costs=costs)
    assert not any("neighbourhoods" in n for n in without.plan.header.notes)
    monkeypatch.setattr(local_search, "NEIGHBOURHOOD_MIN_S", 1.0)
    res = optimize(g, config, costs=costs)
    assert res.status == "time_limit" and res.plan is not None
    assert any("neighbourhoods improved it" in n for n in res.plan.header.notes)
    assert res.objective_s < without.objective_s * (1 - 1e-3)
    sim = simulate(g, res.plan, costs=costs)  # strict: raises on any violation
    assert res.predicted_time_s == pytest.approx(sim.total_s)
    assert sim.fast_peak_bytes <= res.budget_bytes
    assert (res.plan.arena is not None) == arena
    assert res.local is None  # the search's model is not kept with the result


def test_a_better_point_the_search_refuses_is_passed_over():
    """`accept` (the arena's packing check, `local_search.Packs`): a point it refuses never
    becomes the incumbent; the search goes on from the incumbent and takes the next better
    point it accepts. Refusing all, the search ends at its start."""
    f = _async_model_started_from_sync()
    start = warmstart.objective_value(f)
    areas = neighbourhoods.neighbourhoods(f, 300)
    asked: list[float] = []

    def refuse_all(point):
        asked.append(float(point.sum()))
        return False

    found = improve_in_neighbourhoods(f.prob, areas, gap=0.0, time_limit=120, each_s=20,
                                      accept=refuse_all)
    assert asked and found.objective == pytest.approx(start, rel=1e-9)
    assert warmstart.objective_value(f) == pytest.approx(start, rel=1e-9)
    assert warmstart.holds(f)
    f = _async_model_started_from_sync()
    refused: list[int] = []

    def refuse_first(point):
        refused.append(1)
        return len(refused) > 1

    found = improve_in_neighbourhoods(f.prob, areas, gap=0.0, time_limit=120, each_s=20,
                                      accept=refuse_first)
    assert len(refused) >= 2 and found.objective < start * (1 - 1e-3)
    assert warmstart.holds(f)


def _arena_case(monkeypatch):
    """A layered net at a third of its peak in an arena, whose whole searches find nothing
    (the neighbourhoods do)."""
    g = layered_net(4, width=3, kib=256)
    costs = costs_for(g, "cuda")
    peak = MachineModel(g, preset("h100-pcie5"), costs).peak[0]
    _whole_search_finds_nothing(monkeypatch)
    return g, costs, _config(fast_mem_bytes=peak // 3, run=RunMode(arena=True, replay=True))


def test_a_local_search_plan_that_does_not_pack_keeps_the_fitted_one(monkeypatch):
    import autotm_py.arena as arena_module

    g, costs, config = _arena_case(monkeypatch)
    monkeypatch.setattr(local_search, "NEIGHBOURHOOD_MIN_S", 1.0)
    real_pack, packs = arena_module.pack, []

    def first_packs_only(machine, plan, limit=None):
        layout = real_pack(machine, plan, limit=limit)
        packs.append(plan)
        return layout if len(packs) == 1 else replace(layout, nbytes=(limit or 0) + 1)

    monkeypatch.setattr(arena_module, "pack", first_packs_only)
    res = optimize(g, config, costs=costs)
    # the fitted plan, then each better point of the local search, refused (`Packs`)
    assert len(packs) >= 2
    assert not any("neighbourhoods improved it" in n for n in res.plan.header.notes)
    assert res.plan.arena is not None
    assert res.plan.records == packs[0].records  # the fitted plan


def test_a_local_search_plan_the_simulator_predicts_slower_keeps_the_packed_one(monkeypatch):
    """The ILP's objective only models the time: the local search's packed plan replaces the
    plan it started from only where the simulator predicts it faster (`fitting.
    _predicted_faster`), else a note says which was kept."""
    import autotm_py.fitting as fitting

    g, costs, config = _arena_case(monkeypatch)
    monkeypatch.setattr(local_search, "NEIGHBOURHOOD_MIN_S", 1e9)
    without = optimize(g, config, costs=costs)
    monkeypatch.setattr(local_search, "NEIGHBOURHOOD_MIN_S", 1.0)
    asked: list[int] = []

    def the_second_slower(machine, plan):
        asked.append(1)
        return float(len(asked))  # the packed plan first, then the local search's

    monkeypatch.setattr(fitting, "_predicted_s", the_second_slower)
    res = optimize(g, config, costs=costs)
    assert len(asked) == 2
    assert any("predicted at 2000.000 ms, the plan before it 1000.000 ms; that one is kept" in n
               for n in res.plan.header.notes)
    assert res.plan.records == without.plan.records


def test_the_local_search_plan_kept_is_packed_once(monkeypatch):
    """`Packs` keeps the packing of the point it accepted last, the search's incumbent: the fit
    loop does not pack that plan again."""
    import autotm_py.arena as arena_module

    g, costs, config = _arena_case(monkeypatch)
    monkeypatch.setattr(local_search, "NEIGHBOURHOOD_MIN_S", 1.0)
    real_pack, packed = arena_module.pack, []

    def counted(machine, plan, limit=None):
        packed.append(plan.records)
        return real_pack(machine, plan, limit=limit)

    monkeypatch.setattr(arena_module, "pack", counted)
    res = optimize(g, config, costs=costs)
    assert any("neighbourhoods improved it" in n for n in res.plan.header.notes)
    assert packed.count(res.plan.records) == 1
