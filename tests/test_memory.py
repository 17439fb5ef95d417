"""Memory systems, budgets and the shared accounting/timing model (memory/)."""

import json

import pytest

from autotm_py.costs import KernelCosts
from autotm_py.errors import ConfigError
from autotm_py.ir import Role
from autotm_py.machine import MachineModel
from autotm_py.memory import PRESETS, load_memory_system, parse_ratio, preset
from autotm_py.memory.accounting import (
    ALIGN_BYTES,
    aligned,
    live_ranges,
    pinned_tensors,
    ratio_base,
    resolve_budget,
    steady_pairs,
)
from autotm_py.memory.tiers import FAST, SLOW
from tests.graphs import residual_block, small_training
from tests.synthetic import chain


def test_presets_have_sources_and_validate():
    assert set(PRESETS) >= {"optane", "cxl", "h100-pcie5"}
    for system in PRESETS.values():
        assert system.source
        system.validate()
    assert preset("optane").mode == "host"
    assert preset("h100-pcie5").mode == "gpu"
    assert "Izraelevitz" in preset("optane").source


def test_memory_file_roundtrip_and_errors(tmp_path):
    path = tmp_path / "mem.json"
    preset("cxl").save(path)
    assert load_memory_system(path) == preset("cxl")
    data = json.loads(path.read_text())
    data["link"]["read_bw"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"link\.read_bw must be a positive"):
        load_memory_system(path)
    del data["fast"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="not a valid memory-system file"):
        load_memory_system(path)
    with pytest.raises(ConfigError, match="neither a preset"):
        load_memory_system(tmp_path / "missing.json")


def test_ratio_semantics():
    g = chain(4, size=256)  # peak 2 KiB
    mem = preset("h100-pcie5")
    budget = resolve_budget(g, ratio=parse_ratio("1:4"), fast_mem_bytes=None,
                            pinned=frozenset(), memory=mem)
    assert budget == g.peak_live_bytes // 5
    assert resolve_budget(g, ratio=parse_ratio("1:0"), fast_mem_bytes=None,
                          pinned=frozenset(), memory=mem) is None
    assert resolve_budget(g, ratio=parse_ratio("0:1"), fast_mem_bytes=None,
                          pinned=frozenset(), memory=mem) == 0
    assert resolve_budget(g, ratio=None, fast_mem_bytes=1234, pinned=frozenset(),
                          memory=mem) == 1234
    with pytest.raises(ConfigError, match="--ratio"):
        resolve_budget(g, ratio=None, fast_mem_bytes=None, pinned=frozenset(), memory=mem)


def test_alignment_and_pinning():
    assert aligned(1) == ALIGN_BYTES and aligned(0) == 0 and aligned(512) == 512
    g = small_training()
    assert pinned_tensors(g, False) == frozenset()
    pinned = pinned_tensors(g, True)
    w, w_next = g.carried[0]
    assert {w, w_next, g.by_name("x").id, g.by_name("label").id} <= pinned
    assert g.by_name("h").id not in pinned
    assert ratio_base(g, pinned) < g.peak_live_bytes


def test_steady_pairs_and_live_ranges():
    g = small_training()
    w, w_next = g.carried[0]
    assert steady_pairs(g) == ((w, w_next),)
    assert live_ranges(g)[w_next] == (6, 6)
    r = residual_block()
    pairs = steady_pairs(r)  # inference weights are their own carried pair
    assert (r.by_name("w1").id, r.by_name("w1").id) in pairs
    assert r.by_name("x").role == Role.INPUT and all(a != r.by_name("x").id for a, _ in pairs)


def test_machine_model_times_and_step_rule():
    g = chain(3, size=2**18)  # 1 MiB tensors
    costs = KernelCosts.from_times("cpu", [1e-3, 2e-3, 3e-3])
    gpu = MachineModel(g, preset("h100-pcie5"), costs)
    assert gpu.kernel_time(0, (FAST, FAST)) == 1e-3
    mb = 2**20
    link = preset("h100-pcie5").link
    assert gpu.copy_time(0, FAST, "sync") == pytest.approx(link.latency_s + mb / link.read_bw)
    # GPU: two engines overlap; host: one copy thread serializes both directions
    read = preset("h100-pcie5").copy_time(mb, FAST, "async")
    write = preset("h100-pcie5").copy_time(mb, SLOW, "async")
    both = gpu.step_time(0.0, [(0, FAST), (1, SLOW)])
    assert both == pytest.approx(max(read, write, 2 * mb / link.both_directions_bw))
    host = MachineModel(g, preset("optane"), costs)
    opt = preset("optane")
    expected = opt.copy_time(mb, FAST, "async") + opt.copy_time(mb, SLOW, "async")
    assert host.step_time(0.0, [(0, FAST), (1, SLOW)]) == pytest.approx(expected)
    assert host.step_time(1.0, [(0, FAST)]) == 1.0
    # host mode: slow IO costs more, by the bandwidth model, and is separable
    slow_in = host.kernel_time(1, (SLOW, FAST))
    assert slow_in > 2e-3
    slow_out = host.kernel_time(1, (FAST, SLOW))
    assert host.slot_penalties(1) == pytest.approx([slow_in - 2e-3, slow_out - 2e-3])
    assert host.kernel_time(1, (SLOW, SLOW)) == pytest.approx(slow_in + slow_out - 2e-3)


def test_costs_must_match_graph():
    with pytest.raises(ConfigError, match="cover 2 kernels"):
        MachineModel(chain(3), preset("optane"), KernelCosts.from_times("cpu", [1.0, 1.0]))


@pytest.mark.runtime_reserve
def test_runtime_reserve_comes_out_of_the_budget():
    """The H100 preset keeps torch's cuBLAS workspaces out of every budget: tensors get the
    budget minus the reserve, plans report the user's budget, and the smallest feasible budget
    includes the reserve."""
    from autotm_py.config import PlanConfig
    from autotm_py.pipeline import machine_for, optimize

    h100 = preset("h100-pcie5")
    assert h100.runtime_reserve_bytes > 0
    g = chain(3, size=2**20)  # 4 MiB tensors
    costs = KernelCosts.from_times("cuda", [1e-3] * 3)
    budget = h100.runtime_reserve_bytes + (16 << 20)
    machine = machine_for(g, PlanConfig(fast_mem_bytes=budget, device="cuda"), costs)
    assert machine.tensor_budget == 16 << 20 and machine.user_budget == budget
    result = optimize(g, PlanConfig(fast_mem_bytes=budget, device="cuda"), costs=costs)
    assert result.plan is not None and result.plan.header.budget_bytes == budget
    tight = optimize(g, PlanConfig(fast_mem_bytes=h100.runtime_reserve_bytes, device="cuda"),
                     costs=costs)
    assert tight.status == "infeasible"
    assert tight.min_feasible_budget_bytes > h100.runtime_reserve_bytes


@pytest.mark.runtime_reserve
def test_headroom_leaves_a_share_of_the_budget_free():
    """--headroom (AutoTM's defrag margin): the plan's tensors get the budget minus the reserve
    minus headroom x budget; the smallest feasible budget is in the user's terms, so planning
    at it with the same headroom succeeds."""
    from autotm_py.config import PlanConfig
    from autotm_py.pipeline import machine_for, optimize

    h100 = preset("h100-pcie5")
    g = chain(4, size=2**20)
    costs = KernelCosts.from_times("cuda", [1e-3] * 4)
    budget = h100.runtime_reserve_bytes + (40 << 20)
    plain = machine_for(g, PlanConfig(fast_mem_bytes=budget, device="cuda"), costs)
    roomy = machine_for(g, PlanConfig(fast_mem_bytes=budget, device="cuda", headroom=0.2),
                          costs)
    assert plain.tensor_budget - roomy.tensor_budget == int(budget * 0.2)
    assert roomy.user_budget == budget
    tight = optimize(g, PlanConfig(fast_mem_bytes=h100.runtime_reserve_bytes + (8 << 20),
                                   device="cuda", headroom=0.2), costs=costs)
    assert tight.status == "infeasible"
    need = tight.min_feasible_budget_bytes
    at_need = optimize(g, PlanConfig(fast_mem_bytes=need, device="cuda", headroom=0.2),
                       costs=costs)
    assert at_need.plan is not None
    assert at_need.fast_peak_bytes <= need * 0.8 - h100.runtime_reserve_bytes
    assert at_need.plan.header.headroom == 0.2


def test_headroom_must_be_a_share_below_one_half():
    from autotm_py.config import PlanConfig

    with pytest.raises(ConfigError, match=r"--headroom 0\.6"):
        PlanConfig(headroom=0.6)
    with pytest.raises(ConfigError, match=r"--headroom -0\.1"):
        PlanConfig(headroom=-0.1)
