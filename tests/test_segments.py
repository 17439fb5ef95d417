"""Early regeneration points on a grid, and the checkpoint-style warm start of the joint model
with early points (`planning/segments.py`, docs/planning.md "Early points")."""

from dataclasses import replace

import pytest

from autotm_py.config import PlanConfig
from autotm_py.memory.tiers import preset
from autotm_py.planning import formulation, segments, solve, warmstart
from autotm_py.planning.control import SolveControl
from autotm_py.planning.recompute import EARLY_POINTS, early_points, is_forward, recompute_spec
from autotm_py.runtime.simulate import Simulator
from tests.graphs import layers_training, random_training
from tests.test_planning_bruteforce import recompute_machine


def test_early_points_lie_on_one_grid():
    backward = list(range(100, 200))
    assert early_points(backward, 50, 6) == list(range(144, 150))  # within EARLY_POINTS: all
    grid = early_points(backward, 50, 32)  # every 4th backward kernel, the same for everyone
    assert grid == [120, 124, 128, 132, 136, 140, 144, 148]
    assert len(grid) <= EARLY_POINTS
    assert set(early_points(backward, 47, 32)) <= set(range(100, 200, 4))  # the same grid
    assert early_points(backward, 3, 32) == [100]  # not before the first backward kernel


def machine_and_base(n=8, frac=0.35, early=8, depth=2):
    """`layers_training(n)` at a budget where the plan without early points must copy, its
    sync+recompute plan as events, and the sync model with early points."""
    graph = layers_training(n)
    machine = recompute_machine(graph, preset("h100-pcie5"), "sync", frac)
    config = PlanConfig(strategy="sync", device="cuda", recompute="on", time_limit_s=60,
                        recompute_depth=depth, recompute_early=0)
    small, spec = solve._small_and_recompute(machine, config)
    best, outcome, *_ = solve._search(machine, config, small, spec, SolveControl())
    assert best is not None and outcome.has_solution
    spec_early = solve._spec(machine, replace(config, recompute_early=early), small)
    f = formulation.build(machine, "sync", config.async_window, None, small,
                          recompute=spec_early)
    return machine, warmstart.events_of(best), outcome.objective, f


def test_a_tensor_read_only_in_the_forward_pass_gets_early_points():
    graph = layers_training(6)
    machine = recompute_machine(graph, preset("h100-pcie5"), "sync", 0.35)
    plain = recompute_spec(machine, depth=2, ratio=None)
    early = recompute_spec(machine, depth=2, ratio=None, early=4)
    backward = [k.id for k in graph.kernels if not is_forward(k)]
    m3, r3 = graph.by_name("m3").id, graph.by_name("r3").id
    first = min(u for u in graph.tensors[r3].users if u in backward)  # r3's first backward use
    # m3 (the norm's output) is read by the ReLU only: without early points it may be re-made
    # only one level down a chain that re-makes r3; with them also where r3's chain may start,
    # at r3's first backward use and on the grid before it
    assert plain.regen[m3] <= plain.regen[r3]
    grid = set(early_points(backward, backward.index(first), 4))
    assert grid and not grid & plain.regen[m3]
    assert grid | {first} <= early.regen[m3]


def test_the_segment_start_is_a_point_of_the_model_that_regenerates_whole_segments():
    machine, base, base_ms, f = machine_and_base()
    graph = machine.graph
    found = segments.segment_start(f, base, (8, 4))
    assert found is not None
    objective, span, events = found
    assert warmstart.apply(f, events)
    assert segments.violations(f) == []
    plan = segments._Segments(f, base, span)
    # a convolution's output is re-made from the layer below, itself re-made at the same
    # kernel or before: a chain of three layers or more at one point, past depth 2
    conv = {t: u for t, u in plan.at.items() if graph.tensors[t].name.startswith("c")}
    assert conv
    for t, u in plan.at.items():
        producer = graph.kernels[graph.tensors[t].producer]
        for i in producer.inputs:
            assert i not in plan.at or plan.at[i] <= u  # inputs are re-made first
    assert max(list(plan.at.values()).count(u) for u in plan.at.values()) >= 6
    assert objective == pytest.approx(float(f.prob.objective.value()))
    assert objective < base_ms  # cheaper than the plan without early points, which copies


def plans_with_and_without_early_points(frac, early=None):
    """`layers_training(8)` planned async+recompute with early points (the default W unless
    `early`) and with none, each checked by the strict simulator."""
    graph = layers_training(8)
    machine = recompute_machine(graph, preset("h100-pcie5"), "sync", frac)
    results = {}
    for w in (0, early):
        config = PlanConfig(strategy="async", device="cuda", recompute="on", time_limit_s=60)
        result = solve.plan(machine, config if w is None else replace(config, recompute_early=w))
        assert result.plan is not None
        Simulator(graph, result.plan, machine, strict=True).run()  # inputs there, in budget
        results[w] = result
    return results[early], results[0]


@pytest.mark.parametrize("early", [8, None])
def test_early_points_start_from_the_segment_plan_and_beat_the_plan_without(early):
    """Also by default: early points are on (W = 32) and kept where the start pays."""
    assert PlanConfig().recompute_early == 32
    with_early, without = plans_with_and_without_early_points(0.35, early)
    notes = with_early.plan.header.notes
    assert any("checkpoint-style plan" in note for note in notes), notes
    assert with_early.objective_s < 0.8 * without.objective_s


def test_early_points_are_dropped_where_the_start_does_not_pay():
    """With room for nearly everything the plan without early points copies little, no
    checkpoint-style start is 5% faster, and the search goes on without early points: the
    note says so and the plan is as good as the one planned without them."""
    with_early, without = plans_with_and_without_early_points(0.8)
    notes = with_early.plan.header.notes
    assert any("early points not used" in note for note in notes), notes
    assert not any("checkpoint-style plan (span" in note for note in notes), notes
    assert with_early.objective_s <= without.objective_s * 1.01


@pytest.mark.parametrize("seed", range(6))
def test_a_segment_start_on_random_graphs_is_none_or_a_point(seed):
    """Whatever the graph, the start handed to the solver satisfies every row."""
    graph = random_training(seed, n_forward=6)
    machine = recompute_machine(graph, preset("h100-pcie5"), "sync", 0.3)
    config = PlanConfig(strategy="sync", device="cuda", recompute="on", time_limit_s=30,
                        recompute_early=0)
    small, spec = solve._small_and_recompute(machine, config)
    best, *_ = solve._search(machine, config, small, spec, SolveControl())
    spec_early = solve._spec(machine, replace(config, recompute_early=4), small)
    f = formulation.build(machine, "sync", config.async_window, None, small,
                          recompute=spec_early)
    base = warmstart.events_of(best)
    for span in (4, 2, 1):
        events = segments.segment_events(f, base, span)
        if events is not None:
            assert warmstart.apply(f, events)
            assert segments.violations(f) == []


def test_at_a_looser_budget_the_start_keeps_what_fits_instead_of_regenerating_it():
    """Step 4: the room a budget leaves is filled with kept tensors, so the start regenerates
    fewer tensors at a looser budget, and never more than checkpointing's plan before it."""
    regenerated = {}
    for frac in (0.35, 0.8):
        _, base, _, f = machine_and_base(frac=frac)
        plan = segments._Segments(f, base, 4)
        before = len(plan.at)
        assert segments._repaired(f, plan) is not None
        assert plan.keep_more()
        events = plan.events()
        assert warmstart.apply(f, events) and segments.violations(f) == []
        assert len(plan.at) < before
        regenerated[frac] = len(plan.at)
    assert regenerated[0.8] < regenerated[0.35]


def test_a_chain_is_regenerated_at_grid_points_before_the_kernels_that_need_it():
    """With W > 8 the early points lie on a grid; a tensor needed at a kernel off the grid is
    regenerated at the latest of its points before it, so chains still form (depth 1: no
    chain points at the kernels where a consumer is re-made, only the grid)."""
    _, base, _, f = machine_and_base(n=24, frac=0.35, early=24, depth=1)
    graph = f.machine.graph
    plan = segments._Segments(f, base, 24)
    assert f.recompute is not None
    for t, u in plan.at.items():
        assert u in f.recompute.regen[t]
    convs = [t for t in plan.at if graph.tensors[t].name.startswith("c")]
    # all 24 convolution outputs but the one that starts the only segment boundary's chain
    # (a point on the grid only, three boundaries: what the walk made of it before)
    assert len(convs) >= 23 and len(plan.boundaries) <= 1, (len(convs), plan.boundaries)
