"""On tiny graphs the ILP's optimum equals an exhaustive search over every placement and move
schedule of the same model (tests/bruteforce.py), and both plans simulate to that time."""

from dataclasses import replace

import pytest

from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import preset
from autotm_py.plan import SolverStats
from autotm_py.planning import formulation
from autotm_py.planning.decode import decode
from autotm_py.planning.gadgets import small_tensors
from autotm_py.planning.solve import min_feasible_budget
from autotm_py.planning.solvers import run_solver
from autotm_py.runtime.simulate import Simulator
from tests.bruteforce import BruteForce
from tests.graphs import costs_for, random_training, residual_block, small_training
from tests.synthetic import chain, diamond

WINDOW = 3
GRAPHS = {
    "chain": lambda: chain(4, size=1024 * 64),
    "diamond": lambda: diamond(1024 * 64),
    "residual": residual_block,
    "training": small_training,
}


def machine_at(graph, memory, strategy, frac, *, pin=False, costs=None):
    """The model with a budget `frac` of the way from the smallest feasible one to the peak."""
    costs = costs or costs_for(graph, "cuda" if memory.mode == "gpu" else "cpu")
    peak = MachineModel(graph, memory.with_budget(None), costs, pin).peak[0]
    need, _ = min_feasible_budget(MachineModel(graph, memory.with_budget(peak), costs, pin),
                                  strategy)
    budget = int(need + frac * (peak - need))
    return MachineModel(graph, memory.with_budget(budget), costs, pin)


def simulated(machine, plan):
    sim = Simulator(machine.graph, plan, machine, strict=True)
    sim.run()
    return sim.result().total_s


def check(machine, strategy, fixed=frozenset()):
    best, best_plan = BruteForce(machine, strategy, window=WINDOW, fixed=fixed).solve()
    f = formulation.build(machine, strategy, WINDOW, fixed=fixed)
    outcome = run_solver(f.prob, "highs", gap=0.0, time_limit=60)
    assert outcome.status == "optimal"
    ilp = outcome.objective / formulation.MS
    plan = decode(f, config={"device": machine.costs.device}, solver=SolverStats())
    assert best is not None
    assert ilp == pytest.approx(best, rel=1e-9)
    assert simulated(machine, plan) == pytest.approx(ilp, rel=1e-9)
    assert simulated(machine, best_plan) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("memory", ["h100-pcie5", "optane"])
@pytest.mark.parametrize("strategy", ["static", "sync", "async"])
@pytest.mark.parametrize("frac", [0.0, 0.4])
def test_ilp_equals_exhaustive_search(graph, memory, strategy, frac):
    g = GRAPHS[graph]()
    check(machine_at(g, preset(memory), strategy, frac), strategy)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("memory", ["h100-pcie5", "cxl"])
def test_random_training_graphs(seed, memory):
    g = random_training(seed, n_forward=3)
    check(machine_at(g, preset(memory), "sync", 0.3), "sync")
    check(machine_at(g, preset(memory), "sync", 0.3, pin=True), "sync")


def test_measured_placements_use_one_hot_configurations():
    """A kernel with a measured, non-separable placement table (reading both operands from
    the slow tier is cheaper than the bandwidth model says) goes through the one-hot
    configuration family, and the optimum still matches."""
    g = residual_block()
    base = costs_for(g, "cpu")
    t = base.times_s[3]  # Add(h2, x) -> s
    table = {"FFF": t, "SFF": 3 * t, "FSF": 3 * t, "SSF": 3.5 * t,
             "FFS": 2 * t, "SFS": 4 * t, "FSS": 4 * t, "SSS": 4.2 * t}
    costs = replace(base, measured_placements={3: table})
    machine = machine_at(g, preset("optane"), "sync", 0.2, costs=costs)
    assert machine.slot_penalties(3) is None
    f = formulation.build(machine, "sync", WINDOW)
    assert any(v.name.startswith("c3_") for v in f.prob.variables())
    check(machine, "sync")


@pytest.mark.parametrize("memory", ["h100-pcie5", "optane"])
def test_small_tensors_fixed_in_fast_memory(memory):
    """Tensors kept in fast memory for life enter the ILP as constants; the optimum over the
    remaining choices still matches, and they are never moved."""
    g = small_training()
    machine = machine_at(g, preset(memory), "sync", 0.5)
    fixed = frozenset({g.by_name("label").id, g.by_name("loss").id, g.by_name("dw").id})
    check(machine, "sync", fixed)
    f = formulation.build(machine, "sync", WINDOW, fixed=fixed)
    run_solver(f.prob, "highs", gap=0.0, time_limit=60)
    plan = decode(f, config={"device": machine.costs.device}, solver=SolverStats())
    assert not any(m.tensor in fixed for m in plan.moves())


def test_small_tensors_share_of_the_budget():
    g = small_training()
    machine = machine_at(g, preset("h100-pcie5"), "sync", 0.5)
    small = small_tensors(machine, 0.2)
    assert g.by_name("loss").id in small  # 1 KiB
    assert g.by_name("h").id not in small  # 64 KiB of a ~200 KiB budget
    live = sum(int(machine.sizes[t]) for t in small)
    assert live <= 0.2 * machine.budget
    assert small_tensors(machine, 0.0) == frozenset()
