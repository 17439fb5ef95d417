"""On tiny graphs the ILP's optimum equals an exhaustive search over every placement and move
schedule of the same model (tests/bruteforce.py), and both plans simulate to that time."""

from dataclasses import replace

import pytest

from autotm_py.ir import GraphBuilder, Role
from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import preset
from autotm_py.plan import SolverStats
from autotm_py.planning import formulation
from autotm_py.planning.decode import decode
from autotm_py.planning.feasibility import min_feasible_budget
from autotm_py.planning.gadgets import small_tensors
from autotm_py.planning.recompute import recompute_spec
from autotm_py.planning.solvers import run_solver
from autotm_py.runtime.simulate import Simulator
from tests.bruteforce import BruteForce
from tests.graphs import (
    chain_training,
    costs_for,
    random_training,
    residual_block,
    small_training,
)
from tests.synthetic import chain, diamond

WINDOW = 3
RECOMPUTE_GRAPHS = {
    "chain_training": lambda: chain_training(3),
    "training": small_training,
    "random0": lambda: random_training(0, n_forward=3),
}
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


def check(machine, strategy, fixed=frozenset(), recompute=None, moves=True):
    """The ILP's optimum equals the exhaustive search's; both plans simulate to it. Returns
    the ILP's plan."""
    best, best_plan = BruteForce(machine, strategy, window=WINDOW, fixed=fixed,
                                 recompute=recompute, moves=moves).solve()
    f = formulation.build(machine, strategy, WINDOW, fixed=fixed, recompute=recompute,
                          moves=moves)
    outcome = run_solver(f.prob, "highs", gap=0.0, time_limit=60)
    if best is None:  # recompute-only: nothing may move, so a budget may have no plan
        assert not moves and outcome.status == "infeasible"
        return None
    assert outcome.status == "optimal"
    ilp = outcome.objective / formulation.MS
    plan = decode(f, config={"device": machine.costs.device}, solver=SolverStats())
    assert ilp == pytest.approx(best, rel=1e-9)
    assert simulated(machine, plan) == pytest.approx(ilp, rel=1e-9)
    assert simulated(machine, best_plan) == pytest.approx(best, rel=1e-12)
    return plan


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
    assert live <= 0.2 * machine.tensor_budget
    assert small_tensors(machine, 0.0) == frozenset()


# ---- recomputation -----------------------------------------------------------------------
# Kernels cheap next to copies (microseconds against a PCIe or Optane copy of the same bytes),
# so that regenerating pays and the optimum uses it.
CHEAP_S = 2e-6


def recompute_machine(graph, memory, strategy, frac, *, pin=False):
    costs = costs_for(graph, "cuda" if memory.mode == "gpu" else "cpu", scale_s=CHEAP_S)
    return machine_at(graph, memory, strategy, frac, pin=pin, costs=costs)


@pytest.mark.parametrize("graph", ["chain_training", "training"])
@pytest.mark.parametrize("memory", ["h100-pcie5", "optane"])
@pytest.mark.parametrize("strategy", ["sync", "async"])
@pytest.mark.parametrize("frac", [0.0, 0.3, 0.7])
def test_ilp_with_recompute_equals_exhaustive_search(graph, memory, strategy, frac):
    g = RECOMPUTE_GRAPHS[graph]()
    machine = recompute_machine(g, preset(memory), strategy, frac)
    spec = recompute_spec(machine, depth=2, ratio=None)
    assert spec.active
    check(machine, strategy, recompute=spec)


@pytest.mark.parametrize("graph", ["chain_training", "training"])
@pytest.mark.parametrize("strategy", ["sync", "async"])
@pytest.mark.parametrize("frac", [0.3, 0.7])
def test_ilp_with_early_regeneration_equals_exhaustive_search(graph, strategy, frac):
    """Regeneration points before a tensor's first backward use (`--recompute-early`): gadgets
    with no move, where the tensor may be re-made and then kept; the ILP's optimum is the
    exhaustive search's over the same points."""
    g = RECOMPUTE_GRAPHS[graph]()
    machine = recompute_machine(g, preset("h100-pcie5"), strategy, frac)
    spec = recompute_spec(machine, depth=2, ratio=None, early=2)
    plain = recompute_spec(machine, depth=2, ratio=None)
    if graph == "chain_training":  # ("training" has no backward kernel before its first)
        assert sum(map(len, spec.regen.values())) > sum(map(len, plain.regen.values()))
    check(machine, strategy, recompute=spec)


def test_early_points_are_the_backward_kernels_before_the_first_backward_use():
    from autotm_py.config import PlanConfig
    from autotm_py.errors import ConfigError
    from autotm_py.planning.recompute import is_forward

    g = RECOMPUTE_GRAPHS["chain_training"]()
    machine = recompute_machine(g, preset("h100-pcie5"), "sync", 0.3)
    plain = recompute_spec(machine, depth=1, ratio=None)
    early = recompute_spec(machine, depth=1, ratio=None, early=2)
    backward = [k.id for k in g.kernels if not is_forward(k)]
    assert plain.regen and set(early.regen) == set(plain.regen)
    for t, points in plain.regen.items():  # depth 1: the points are t's backward uses
        first = backward.index(min(points))
        assert early.regen[t] == points | set(backward[max(first - 2, 0):first]), t
    with pytest.raises(ConfigError, match="--recompute-early"):
        PlanConfig(recompute_early=-1)


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("memory", ["h100-pcie5", "optane"])
def test_random_training_graphs_with_recompute(seed, memory):
    g = random_training(seed, n_forward=3)
    machine = recompute_machine(g, preset(memory), "sync", 0.3)
    check(machine, "sync", recompute=recompute_spec(machine, depth=2, ratio=None))


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "strategy"), [(1, "sync"), (3, "sync"), (0, "async")])
def test_random_training_graphs_with_recompute_slow(seed, strategy):
    """10-20 s each: the exhaustive search over four states of up to nine live tensors (the
    async search of the larger random graphs takes many minutes)."""
    g = random_training(seed, n_forward=3)
    machine = recompute_machine(g, preset("h100-pcie5"), strategy, 0.3)
    check(machine, strategy, recompute=recompute_spec(machine, depth=2, ratio=None))


@pytest.mark.parametrize("graph", ["chain_training", "training", "random0"])
@pytest.mark.parametrize("frac", [0.3, 0.7, 1.0])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_recompute_only_equals_exhaustive_search(graph, frac, depth):
    g = RECOMPUTE_GRAPHS[graph]()
    machine = recompute_machine(g, preset("h100-pcie5"), "sync", frac)
    check(machine, "sync", recompute=recompute_spec(machine, depth=depth, ratio=None),
          moves=False)


def test_recompute_is_used():
    g = chain_training(4)
    machine = recompute_machine(g, preset("h100-pcie5"), "sync", 0.5)
    plan = check(machine, "sync", recompute=recompute_spec(machine, depth=2, ratio=None))
    assert [(r.kernel, r.outputs) for r in plan.recomputes()] == [(1, (g.by_name("a1").id,))]


def chain_of_two():
    """x -> f0(w) -> a0 (small) -> f1 -> a1 -> f2 -> a2 (large) -> loss; the backward reads a1
    and x only. With the budget below, a1 cannot stay through the loss and a0 cannot either:
    the optimum regenerates a0 from x, then a1 from a0, before the backward reads a1."""
    b = GraphBuilder("chain_of_two")
    t = {n: b.add_tensor(n, (kib * 256,), "float32", role) for n, kib, role in (
        ("x", 16, Role.INPUT), ("w", 4, Role.WEIGHT), ("a0", 16, Role.ACTIVATION),
        ("a1", 64, Role.ACTIVATION), ("a2", 256, Role.ACTIVATION), ("g", 256, Role.GRADIENT),
        ("g1", 16, Role.GRADIENT), ("dw", 4, Role.WEIGHT_GRADIENT), ("w::next", 4, Role.WEIGHT))}
    b.inputs.append(t["x"])
    b.add_kernel("Relu", [t["x"], t["w"]], [t["a0"]], name="f0")
    b.add_kernel("Relu", [t["a0"]], [t["a1"]], name="f1")
    b.add_kernel("Relu", [t["a1"]], [t["a2"]], name="f2")
    b.add_kernel("Loss", [t["a2"]], [t["g"]], name="loss", domain="autotm")
    b.add_kernel("Bwd", [t["g"], t["a1"]], [t["g1"]], name="b1", domain="autotm")
    b.add_kernel("Bwd", [t["g1"], t["x"]], [t["dw"]], name="b0", domain="autotm")
    b.add_kernel("SGDUpdate", [t["w"], t["dw"]], [t["w::next"]], name="sgd", domain="autotm")
    b.carried.append((t["w"], t["w::next"]))
    b.outputs.append(t["w::next"])
    return b.build()


def test_recompute_chains():
    g = chain_of_two()
    costs = costs_for(g, "cuda", scale_s=CHEAP_S)
    machine = MachineModel(g, preset("h100-pcie5").with_budget(540 * 1024), costs)
    for depth, chained in ((1, False), (2, True)):
        plan = check(machine, "sync", recompute=recompute_spec(machine, depth=depth, ratio=None))
        got = [(r.kernel, r.before) for r in plan.recomputes()]
        assert (got == [(0, 4), (1, 4)]) == chained, got
