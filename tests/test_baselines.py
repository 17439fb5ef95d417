"""Baselines: same Plan format, same simulator; every feasible one passes the verifier."""

import pytest

from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import FAST, SLOW, preset
from autotm_py.pipeline import run_baselines
from autotm_py.planning.baselines import BASELINES, baseline_plan
from autotm_py.planning.feasibility import min_feasible_budget
from autotm_py.runtime.simulate import Simulator
from tests.graphs import costs_for, layered_net, small_training


def machine_at(graph, memory, frac=0.5, pin=False):
    costs = costs_for(graph, "cuda" if preset(memory).mode == "gpu" else "cpu")
    mem = preset(memory)
    peak = MachineModel(graph, mem.with_budget(None), costs, pin).peak[0]
    need, _ = min_feasible_budget(MachineModel(graph, mem.with_budget(0), costs, pin), "sync")
    return MachineModel(graph, mem.with_budget(int(need + frac * (peak - need))), costs, pin)


def verify(machine, plan):
    sim = Simulator(machine.graph, plan, machine, strict=True)
    sim.run()
    return sim.result()


@pytest.mark.parametrize("memory", ["h100-pcie5", "optane"])
@pytest.mark.parametrize("frac", [0.0, 0.5])
@pytest.mark.parametrize("pin", [False, True])
def test_every_feasible_baseline_verifies(memory, frac, pin):
    g = layered_net(2, width=3, kib=256)
    machine = machine_at(g, memory, frac, pin)
    results = run_baselines(machine)
    assert set(results) == set(BASELINES)
    for name, res in results.items():
        if name == "2lm" and machine.gpu:
            assert not res.feasible and "host mode" in res.message
            continue
        if name in ("lru", "2lm") and not machine.gpu and frac == 0.0:
            # host mode's smallest budget is the workspace; swapping needs whole working sets
            assert not res.feasible and "needs" in res.message
            continue
        if name in ("all-fast", "all-slow", "first-touch", "lru"):
            assert res.feasible, (name, res.message)
        if res.feasible:
            if name == "2lm":
                continue  # priced on its own memory system; checked below
            check = machine if name != "all-fast" else MachineModel(
                g, machine.memory.with_budget(None), machine.costs, pin)
            assert verify(check, res.plan).total_s == pytest.approx(res.time_s)


def test_all_fast_is_the_sum_of_kernel_times():
    g = small_training()
    machine = machine_at(g, "h100-pcie5")
    res = run_baselines(machine, ["all-fast"])["all-fast"]
    assert res.time_s == pytest.approx(sum(machine.costs.times_s))
    assert not list(res.plan.moves()) and res.plan.header.budget_bytes is None


def test_all_slow_host_reads_the_slow_tier_directly():
    g = small_training()
    machine = machine_at(g, "optane")
    plan = baseline_plan(machine, "all-slow")
    assert not list(plan.moves())
    assert all(p == SLOW for c in plan.computes() for p in c.placement)
    assert verify(machine, plan).fast_peak_bytes == 0


def test_all_slow_gpu_copies_around_every_kernel():
    g = small_training()
    machine = machine_at(g, "h100-pcie5", frac=0.0)
    plan = baseline_plan(machine, "all-slow")
    moves = list(plan.moves())
    assert {m.to for m in moves} == {FAST, SLOW} and all(m.mode == "sync" for m in moves)
    assert verify(machine, plan).total_s > sum(machine.costs.times_s)


def test_first_touch_keeps_early_tensors_fast():
    g = layered_net(2, width=3, kib=256)
    machine = machine_at(g, "optane", frac=0.3)
    plan = baseline_plan(machine, "first-touch")
    first = plan.records[0]
    assert all(p == FAST for p in first.placement)  # room at the start of the iteration
    assert any(p == SLOW for c in plan.computes() for p in c.placement)


def test_lru_swaps_and_returns_carried_tensors():
    g = layered_net(2, width=3, kib=256)
    machine = machine_at(g, "h100-pcie5", frac=0.1)
    plan = baseline_plan(machine, "lru")
    w = g.carried[0][0]
    assert plan.initial[w] == (SLOW,)  # cold start
    assert any(m.to == SLOW for m in plan.moves())
    verify(machine, plan)  # includes the steady-state check


def test_offload_overlaps_and_may_break_the_budget():
    g = layered_net(3, width=3, kib=256)
    machine = machine_at(g, "h100-pcie5", frac=0.2)
    plan = baseline_plan(machine, "offload")
    moves = list(plan.moves())
    assert moves and all(m.mode == "async" for m in moves)
    unlimited = MachineModel(g, machine.memory.with_budget(None), machine.costs)
    assert verify(unlimited, plan).fast_peak_bytes < unlimited.peak[0]
    res = run_baselines(machine, ["offload"])["offload"]
    assert res.feasible == (res.fast_peak_bytes <= machine.tensor_budget)


def test_two_level_memory_is_host_only_and_priced_at_raw_bandwidth():
    g = small_training()
    machine = machine_at(g, "optane", frac=0.7)
    res = run_baselines(machine, ["2lm", "lru"])
    assert res["2lm"].feasible
    assert res["2lm"].plan.header.memory_system["link"]["read_bw"] == preset("optane").slow.read_bw
    with pytest.raises(Exception, match="host memory mode"):
        baseline_plan(machine_at(g, "h100-pcie5"), "2lm")


def test_transfer_bound_is_below_every_plan():
    """No plan, ILP or baseline, is predicted faster than the transfer bound."""
    from autotm_py.config import PlanConfig
    from autotm_py.pipeline import machine_for, optimize, run_baselines
    from autotm_py.planning.bounds import transfer_bound
    from tests.graphs import costs_for, layered_net

    graph = layered_net(6, width=3, kib=512)
    costs = costs_for(graph)
    for frac in (0.4, 0.6, 0.8):
        budget = int(graph.peak_live_bytes * frac)
        config = PlanConfig(fast_mem_bytes=budget, device="cuda", strategy="async")
        machine = machine_for(graph, config, costs)
        bound = transfer_bound(machine)
        assert bound >= sum(costs.times_s) - 1e-12
        result = optimize(graph, config, costs=costs)
        times = [r.time_s for r in run_baselines(machine).values() if r.feasible and r.time_s]
        if result.plan is not None:
            times.append(result.predicted_time_s)
        assert times and all(t >= bound * (1 - 1e-9) for t in times), (frac, bound, times)
