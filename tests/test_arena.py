"""Planned addresses (`autotm_py.arena`): packed offsets never overlap on random plans, the
verifier (strict simulator) checks them, arena plans fit their budget, the plan format keeps
them, and CUDA-graph pricing uses device times."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotm_py import arena
from autotm_py.config import PlanConfig
from autotm_py.costs import (
    REPLAY_GAP_S,
    SLOT_COPY_BYTES_PER_S,
    KernelCosts,
)
from autotm_py.errors import ConfigError, PlanError
from autotm_py.ir import GraphBuilder, Role
from autotm_py.machine import WINDOW_MIN_BYTES, MachineModel
from autotm_py.memory.scratch import allocated_outputs, copied_outputs
from autotm_py.memory.tiers import FAST, SLOW, preset
from autotm_py.options import RunMode
from autotm_py.pipeline import (
    machine_for,
    machine_for_plan,
    optimize,
    run_baselines,
    simulate,
    with_arena,
)
from autotm_py.plan import INITIAL, SCRATCH, ArenaBuffer, Compute, Move, Plan
from autotm_py.planning.feasibility import kernel_needs, min_feasible_budget
from autotm_py.runtime.simulate import Simulator
from tests.graphs import (
    _act,
    costs_for,
    first_packing_leaves_holes,
    random_training,
    small_training,
)
from tests.synthetic import random_dag

ARENA_RULES = ("offset", "overlaps", "scratch", "slot", "arena of")
BASELINES = ("all-fast", "all-slow", "first-touch", "lru", "offload")


def _arena_violations(graph, plan, machine) -> list[str]:
    arena_run = replace(machine, run=replace(machine.run, arena=True))
    sim = Simulator(graph, plan, arena_run, strict=False)
    sim.run()
    return [v for v in sim.violations if any(word in v for word in ARENA_RULES[:4])]


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 10_000))
    if draw(st.booleans()):
        graph = random_dag(seed, n_kernels=draw(st.integers(3, 9)))
    else:
        graph = random_training(seed, n_forward=draw(st.integers(2, 5)))
    return graph, draw(st.floats(0.0, 1.0)), draw(st.booleans())


def _budget(graph, costs, frac: float, pin: bool, **flags) -> int:
    memory = preset("h100-pcie5")
    probe = MachineModel(graph, memory.with_budget(None), costs, pin, **flags)
    need, _ = min_feasible_budget(MachineModel(graph, memory.with_budget(0), costs, pin,
                                               **flags), "sync")
    return int(need + frac * max(probe.peak[0] - need, 0)) + probe.scratch_reserve


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_packed_offsets_never_overlap(data):
    graph, frac, pin = data.draw(problems())
    windows = data.draw(st.booleans())  # each kernel's scratch in a window of its own
    costs = costs_for(graph, seed=len(graph.kernels))
    if windows:  # some kernels with MiB of workspace get windows; the KiB of the rest, a region
        mib = data.draw(st.lists(st.sampled_from([0, 0, 1.5, 2.5]), min_size=len(graph.kernels),
                                 max_size=len(graph.kernels)))
        costs = replace(costs, workspace_bytes=tuple(int(m * 2**20) for m in mib))
    budget = _budget(graph, costs, frac, pin,
                     run=RunMode(True, True, "windows" if windows else "region"))
    config = PlanConfig(strategy="async", device="cuda", fast_mem_bytes=budget,
                        solver="highs", gap=0.0, async_window=4, pin_weights=pin,
                        run=RunMode(True, scratch="windows" if windows else "region"))
    machine = machine_for(graph, config, costs)
    plans = [r.plan for r in run_baselines(machine, BASELINES).values() if r.plan is not None]
    result = optimize(graph, config, costs=costs)
    assert result.plan is not None, result.message
    plans.append(result.plan)
    for plan in plans:
        # a plan with its arena is checked as it was made (windows that never packed give way
        # to the region: `pipeline._with_region_instead`)
        made_for = machine if plan.arena is None else machine_for_plan(graph, plan, costs)
        life = arena.lifetimes(made_for, plan)
        layout = plan.arena or arena.pack(made_for, plan)
        assert arena.overlapping(layout, life) is None, plan.header.strategy
        assert not _arena_violations(graph, plan.with_arena(layout), made_for)
    if result.plan.arena is not None:  # the fit loop found one: it verifies, within budget
        sim = simulate(graph, result.plan, costs=costs)
        assert result.plan.arena.nbytes <= machine.arena_limit
        assert sim.fast_peak_bytes <= budget
    else:
        assert any(note.startswith("no arena") for note in result.plan.header.notes)


def _training_plan(kib: int = 64, arena_mode: bool = True, strategy: str = "sync"):
    graph = small_training(kib=kib)
    costs = costs_for(graph)
    budget = _budget(graph, costs, 0.5, False, run=RunMode(arena_mode, False))
    config = PlanConfig(strategy=strategy, device="cuda", fast_mem_bytes=budget, solver="highs",
                        run=RunMode(arena=arena_mode))
    result = optimize(graph, config, costs=costs)
    assert result.plan is not None and (result.plan.arena is not None) == arena_mode, \
        result.message
    return graph, costs, result.plan


def test_arena_plans_fit_their_budget_and_say_so():
    graph, costs, plan = _training_plan()
    sim = simulate(graph, plan, costs=costs)  # strict: offsets checked
    assert sim.ok
    assert plan.arena.nbytes == plan.header.counts["arena_bytes"]
    assert any(note.startswith("arena: ") for note in plan.header.notes)
    machine = machine_for(graph, PlanConfig(device="cuda", fast_mem_bytes=plan.header.budget_bytes,
                                            run=RunMode(arena=True)), costs)
    assert plan.arena.nbytes <= machine.arena_limit
    assert machine.scratch_reserve == plan.arena.scratch_bytes > 0


def test_the_optimizer_update_takes_the_weights_slot_in_place():
    graph, costs, plan = _training_plan()
    w, w_next = graph.carried[0]
    if w_next not in {b.tensor for b in plan.arena.buffers if b.record >= 0}:
        pytest.skip("the weight left fast memory in this plan")
    machine = machine_for(graph, PlanConfig(device="cuda", fast_mem_bytes=plan.header.budget_bytes,
                                            run=RunMode(arena=True)), costs)
    life = arena.lifetimes(machine, plan)
    offsets = plan.arena.offsets()
    final = next(s for s in life.spans if s.tensor == w_next)
    assert offsets[(final.record, w_next)] == offsets[(INITIAL, w)]


def _moved(plan: Plan, buffer: ArenaBuffer, offset: int) -> Plan:
    buffers = tuple(replace(b, offset=offset) if b == buffer else b
                    for b in plan.arena.buffers)
    return plan.with_arena(replace(plan.arena, buffers=buffers))


def test_the_verifier_rejects_overlapping_offsets():
    graph, costs, plan = _training_plan()
    tensors = [b for b in plan.arena.buffers if b.tensor != SCRATCH and b.nbytes]
    machine = machine_for(graph, PlanConfig(device="cuda", fast_mem_bytes=plan.header.budget_bytes,
                                            run=RunMode(arena=True)), costs)
    life = arena.lifetimes(machine, plan)
    spans = {(s.record, s.tensor): s for s in life.spans}
    a, b = next((a, b) for a in tensors for b in tensors
                if a != b and spans[(a.record, a.tensor)].overlaps(spans[(b.record, b.tensor)])
                and a.offset != b.offset and a.offset + b.nbytes <= plan.arena.scratch_offset)
    bad = _moved(plan, b, a.offset)
    with pytest.raises(PlanError, match="overlaps the live copy"):
        simulate(graph, bad, costs=costs)
    assert arena.overlapping(bad.arena, life) is not None


def test_the_verifier_rejects_a_weight_that_ends_elsewhere_and_small_scratch():
    graph, costs, plan = _training_plan()
    top = plan.arena.scratch_offset
    # a fresh slot above every buffer (the arena grows, so its budget check may fail too)
    finals = [b for b in plan.arena.buffers if b.tensor == graph.carried[0][1]]
    grown = plan.with_arena(replace(plan.arena, nbytes=plan.arena.nbytes + top,
                                    scratch_offset=2 * top, buffers=tuple(
                                        replace(b, offset=2 * top) if b.tensor == SCRATCH else b
                                        for b in plan.arena.buffers)))
    moved = _moved(grown, finals[-1], top)
    sim = simulate(graph, moved, costs=costs, strict=False)
    assert any("ends the iteration at offset" in v for v in sim.violations), sim.violations
    scratch = next(b for b in plan.arena.buffers if b.tensor == SCRATCH and b.nbytes)
    small = plan.with_arena(replace(plan.arena, buffers=tuple(
        replace(b, nbytes=b.nbytes - 512) if b == scratch else b for b in plan.arena.buffers)))
    with pytest.raises(PlanError, match="bytes of scratch"):
        simulate(graph, small, costs=costs)


def test_arena_survives_json_and_validation_catches_bad_buffers():
    graph, _, plan = _training_plan()
    again = Plan.from_json(plan.to_json())
    assert again.arena == plan.arena and again.validate(graph)
    data = json.loads(plan.to_json())
    data["arena"]["buffers"][0][2] = 100  # not a multiple of the alignment
    with pytest.raises(PlanError, match="alignment"):
        Plan.from_dict(data).validate(graph)
    data = json.loads(plan.to_json())
    data["arena"]["buffers"][0][2] = data["arena"]["bytes"]
    with pytest.raises(PlanError, match=r"outside the arena|scratch region"):
        Plan.from_dict(data).validate(graph)
    assert Plan.from_json(_training_plan(arena_mode=False)[2].to_json()).arena is None


def test_a_plan_without_an_arena_is_packed_for_the_executor():
    graph, costs, plan = _training_plan(arena_mode=False)
    assert plan.arena is None
    packed = with_arena(graph, plan, costs)
    assert packed.arena is not None and with_arena(graph, packed, costs) is packed
    machine = MachineModel(graph, preset("h100-pcie5").with_budget(None), costs,
                           run=RunMode(True, False))
    assert not _arena_violations(graph, packed, machine)


def test_scratch_counts_workspace_and_outputs_torch_allocates():
    graph = small_training(kib=64, workspace_kib=32)
    costs = costs_for(graph)
    machine = MachineModel(graph, preset("h100-pcie5").with_budget(1 << 30), costs,
                           run=RunMode(True, False))
    gemm, relu = graph.kernels[0], graph.kernels[1]
    assert gemm.op_type == "Gemm" and relu.op_type == "Relu"
    # Gemm has no direct path: its output is allocated, beside its workspace; Relu writes in
    # place; the SGD update writes W' over W (elementwise), also without scratch
    assert machine.scratch[gemm.id] == 32 * 1024 + int(machine.sizes[gemm.outputs[0]])
    assert machine.scratch[relu.id] == 0
    assert machine.scratch[graph.kernels[-1].id] == 0
    assert machine.scratch_reserve == int(machine.scratch.max())
    assert not machine.workspace.any()  # the rows count tensors only
    plain = replace(machine, run=RunMode(placed=False))
    assert plain.tensor_budget - machine.tensor_budget == machine.scratch_reserve


def test_the_parts_of_an_input_are_copied_into_their_slots_not_allocated():
    """Split, ConcatGrad, Expand and a forward Slice return views of (parts of) their input:
    nothing is allocated, so their outputs are no scratch and set no smallest budget (a
    U-Net's bf16 ConcatGrad, whose parts were counted, raised it from 71% to 89% of the peak),
    but each view is still copied into its slot (priced as a slot copy)."""
    b = GraphBuilder("parts")
    x = _act(b, "x", 64, Role.INPUT)
    b.inputs.append(x)
    left, right, cat, y = _act(b, "left", 32), _act(b, "right", 32), _act(b, "cat", 64), \
        _act(b, "y", 64)
    b.add_kernel("Split", [x], [left, right])
    b.add_kernel("Concat", [left, right], [cat])
    b.add_kernel("Relu", [cat], [y])
    dy, dcat = _act(b, "dy", 64, Role.GRADIENT), _act(b, "dcat", 64, Role.GRADIENT)
    dl, dr = _act(b, "dleft", 32, Role.GRADIENT), _act(b, "dright", 32, Role.GRADIENT)
    b.add_kernel("ReluGrad", [dy, cat], [dcat], domain="autotm")
    b.add_kernel("ConcatGrad", [dcat], [dl, dr], domain="autotm")
    wide, ahead, back = _act(b, "wide", 128), _act(b, "ahead", 32), _act(b, "back", 32)
    b.add_kernel("Expand", [y], [wide], attrs={"shape": (2, 16384)})
    b.add_kernel("Slice", [x], [ahead], attrs={"starts": (0,), "ends": (8192,), "steps": (1,)})
    b.add_kernel("Slice", [x], [back], attrs={"starts": (-1,), "ends": (-16385,),
                                              "steps": (-2,)})
    b.outputs += [y, dl, dr, wide, ahead, back]
    graph = b.build()
    machine = MachineModel(graph, preset("h100-pcie5").with_budget(1 << 30), costs_for(graph),
                           run=RunMode(True, True))
    split, concat_grad = graph.kernels[0], graph.kernels[4]
    for kernel in (split, concat_grad, *graph.kernels[5:7]):
        assert allocated_outputs(graph, kernel, placed=True) == []
        assert copied_outputs(graph, kernel, placed=True) == list(kernel.outputs)
        assert machine.scratch[kernel.id] == 0
    flipped = graph.kernels[7]  # a negative step: a new tensor, allocated
    assert allocated_outputs(graph, flipped, placed=True) == list(flipped.outputs)
    # ConcatGrad needs its input and its parts, no window beside them
    assert kernel_needs(machine)[concat_grad.id] == 2 * 64 * 1024
    parts = 64 * 1024
    assert machine._slot_copy_bytes()[concat_grad.id] == parts  # copied: time, not memory


def test_a_replayed_kernel_without_a_device_time_costs_its_bytes_not_its_launch():
    """A kernel that launched nothing of its own in the profiled iteration (a view, an SGD update
    folded into its run's foreach launch) has no device time; replayed, it costs the bytes it
    reads and writes at the HBM copy rate, without a node gap."""
    graph = small_training()
    n = len(graph.kernels)
    eager_s = 30e-6
    costs = replace(KernelCosts.from_times("cuda", [eager_s] * n), device_s=(0.0,) * n)
    replayed = MachineModel(graph, preset("h100-pcie5").with_budget(None), costs,
                            run=RunMode(replay=True))
    sizes = [t.nbytes for t in graph.tensors]
    for k in graph.kernels:
        io = sum(sizes[t] for t in {*k.inputs, *k.outputs})
        want = io / SLOT_COPY_BYTES_PER_S
        assert replayed.costs.times_s[k.id] == pytest.approx(want)
        assert replayed.costs.times_s[k.id] < eager_s
    # a roofline estimate has no launch gap to take off: kept as it is
    estimated = replace(costs, estimated=(True,) * n)
    assert estimated.replayed(io_bytes=[1] * n).times_s == estimated.times_s
    assert costs.replayed().times_s == costs.times_s  # no bytes given: the profile's time


def test_graph_replay_prices_device_times():
    graph = small_training()
    n = len(graph.kernels)
    costs = replace(KernelCosts.from_times("cuda", [2e-3] * n), device_s=(1e-3,) * n)
    memory = preset("h100-pcie5").with_budget(None)
    eager = MachineModel(graph, memory, costs)
    replayed = MachineModel(graph, memory, costs, run=RunMode(replay=True))
    assert eager.all_fast_time == pytest.approx(2e-3 * n)
    step = 1e-3 + REPLAY_GAP_S  # device time and the graph's gap between kernel nodes
    assert replayed.all_fast_time == pytest.approx(step * n)
    # a replay in an arena copies each output that torch allocates into its slot, at
    # SLOT_COPY_BYTES_PER_S (read and written once); one with static inputs, capped under a
    # budget or not, copies nothing
    copied = [sum(graph.tensors[t].nbytes for t in allocated_outputs(graph, k))
              for k in graph.kernels]
    assert sum(copied) > 0
    # and in an arena each SGD update costs its bytes, not its profile: the executor runs them
    # as one multi-tensor update
    sizes = [t.nbytes for t in graph.tensors]
    updates = [k for k in graph.kernels if k.op_type == "SGDUpdate"]
    assert updates
    folded = sum(sum(sizes[t] for t in set(k.io)) for k in updates) / SLOT_COPY_BYTES_PER_S
    arena_step = step * (n - len(updates)) + folded
    in_arena = arena_step + 2 * sum(copied) / SLOT_COPY_BYTES_PER_S
    budgeted = memory.with_budget(1 << 30)
    in_arena_run = MachineModel(graph, budgeted, costs, run=RunMode(True, False, replay=True))
    assert in_arena_run.all_fast_time == pytest.approx(in_arena)
    assert MachineModel(graph, budgeted, costs, run=RunMode(replay=True)).all_fast_time == \
        pytest.approx(step * n)
    # planned for the placed allocator (the default), the outputs it places are not copied
    placed_copied = [sum(graph.tensors[t].nbytes for t in allocated_outputs(graph, k, True))
                     for k in graph.kernels]
    assert sum(placed_copied) < sum(copied)
    in_placed_arena = arena_step + 2 * sum(placed_copied) / SLOT_COPY_BYTES_PER_S
    for packed, placed, want in ((False, True, step * n), (True, False, in_arena),
                                 (True, True, in_placed_arena)):
        config = PlanConfig(device="cuda", ratio=None, run=RunMode(packed, placed, replay=True),
                            fast_mem_bytes=1 << 30)
        result = optimize(graph, config, costs=costs)
        assert result.plan.header.run.replay is True
        assert (result.plan.arena is not None) == packed
        assert result.plan.header.costs.digest == costs.digest  # as loaded, not replayed
        assert Plan.from_json(result.plan.to_json()).header.run.replay is True
        assert simulate(graph, result.plan, costs=costs).total_s == pytest.approx(want)
        assert simulate(graph, result.plan.with_header(run=RunMode()), costs=costs).total_s \
            == pytest.approx(2e-3 * n)


def test_a_replaced_machine_prices_from_its_given_costs_not_their_replay_form():
    """`dataclasses.replace` of a replayed machine (the arena's fit loop adds a margin so; the
    baselines lift the budget) keeps the costs it was given: its replay form is not replayed
    again (an estimated kernel's slot copies counted twice) and a plan's header records the
    profiles as loaded (else `simulate` warned of changed profiles on every such plan)."""
    graph = small_training()
    n = len(graph.kernels)
    costs = replace(KernelCosts.from_times("cuda", [2e-3] * n), device_s=(1e-3,) * n,
                    estimated=(True,) + (False,) * (n - 1))
    machine = MachineModel(graph, preset("h100-pcie5").with_budget(1 << 30), costs,
                           run=RunMode(True, False, replay=True))
    assert machine.costs != costs  # its replay form: slot copies on the estimated kernel too
    again = replace(machine, arena_margin=4096)
    assert again.profile_costs is costs
    assert again.costs == machine.costs
    assert replace(machine, run=RunMode()).costs is costs  # eager: the profile's times


def test_graph_replay_prices_copies_by_their_replay_factors_and_records_the_measured_link(
        monkeypatch):
    """A plan priced for replay charges each copy its direction's replay factor times its eager
    time (in the ILP's objective and the simulator alike), while its header keeps the link as
    measured, so a re-simulation applies the factor once. The factors were 1.04 / 1.13 while
    replays ran on CUDA's 8 work queues; with one queue (what replays now run with) they are
    1.0 and a replay's copies cost their eager time."""
    from autotm_py.costs import REPLAY_TO_FAST_SLOWDOWN, REPLAY_TO_SLOW_SLOWDOWN
    graph = small_training()
    n = len(graph.kernels)
    costs = replace(KernelCosts.from_times("cuda", [1e-6] * n), device_s=(1e-6,) * n)
    budget = (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    memory = preset("h100-pcie5").with_budget(budget)
    eager = MachineModel(graph, memory, costs)
    tid = max(range(len(graph.tensors)), key=lambda t: graph.tensors[t].nbytes)
    assert (REPLAY_TO_FAST_SLOWDOWN, REPLAY_TO_SLOW_SLOWDOWN) == (1.0, 1.0)
    at_eager_speed = MachineModel(graph, memory, costs, run=RunMode(replay=True))
    assert at_eager_speed.copy_time(tid, SLOW, "async") == eager.copy_time(tid, SLOW, "async")
    monkeypatch.setattr("autotm_py.machine.REPLAY_TO_FAST_SLOWDOWN", 1.04)
    monkeypatch.setattr("autotm_py.machine.REPLAY_TO_SLOW_SLOWDOWN", 1.13)
    replayed = MachineModel(graph, memory, costs, run=RunMode(replay=True))
    for mode in ("sync", "async"):
        for tier, factor in ((FAST, 1.04), (SLOW, 1.13)):
            moved = replayed.copy_time(tid, tier, mode) - memory.link.latency_s
            assert moved == pytest.approx(
                factor * (eager.copy_time(tid, tier, mode) - memory.link.latency_s))
    assert replayed.step_time(0.0, [(tid, SLOW)]) > eager.step_time(0.0, [(tid, SLOW)])
    config = PlanConfig(device="cuda", run=RunMode(replay=True), fast_mem_bytes=budget,
                        reserve_bytes=0, strategy="sync")
    result = optimize(graph, config, costs=costs)
    plan = result.plan
    assert plan.header.memory_system["link"] == memory.to_dict()["link"]
    assert plan.records and any(isinstance(r, Move) for r in plan.records), "no copies to price"
    replay = simulate(graph, plan, costs=costs).total_s
    monkeypatch.setattr("autotm_py.machine.REPLAY_TO_FAST_SLOWDOWN", 1.0)
    monkeypatch.setattr("autotm_py.machine.REPLAY_TO_SLOW_SLOWDOWN", 1.0)
    assert simulate(graph, plan, costs=costs).total_s < replay  # copy-bound: 1 us kernels


def _windowed_plan():
    # the Gemm's 2 MiB of workspace gets a window; the other kernels' KiB share the region
    graph = small_training(kib=64, workspace_kib=2048)
    costs = costs_for(graph)
    budget = _budget(graph, costs, 0.5, False, run=RunMode(True, True, "windows"))
    config = PlanConfig(strategy="sync", device="cuda", fast_mem_bytes=budget, solver="highs",
                        run=RunMode(arena=True, scratch="windows"))
    result = optimize(graph, config, costs=costs)
    assert result.plan is not None and result.plan.arena is not None, result.message
    return graph, costs, config, result.plan


def test_scratch_windows_lie_among_the_tensors_live_only_while_their_kernel_runs():
    graph, costs, config, plan = _windowed_plan()
    machine = machine_for(graph, config, costs)
    assert machine.windowed and machine.windows.any() and not machine.windows.all()
    # each row counts its kernel's window; smaller scratch shares a region under 1 MiB
    assert (machine.workspace == np.where(machine.windows, machine.scratch, 0)).all()
    assert 0 < machine.scratch_reserve < WINDOW_MIN_BYTES
    layout = plan.arena
    assert layout.nbytes - layout.scratch_offset == machine.scratch_reserve
    windows = {b.record: b for b in layout.buffers
               if b.tensor == SCRATCH and b.offset < layout.scratch_offset}
    assert layout.windows() == windows
    assert any(f"and {len(windows)} scratch windows" in n for n in plan.header.notes)
    computes = [i for i, r in enumerate(plan.records) if isinstance(r, Compute)
                and machine.windows[r.kernel]]
    assert computes and set(computes) == set(windows)
    assert all(windows[i].nbytes >= machine.scratch[plan.records[i].kernel] for i in computes)
    assert arena.overlapping(layout, arena.lifetimes(machine, plan)) is None
    sim = simulate(graph, plan, costs=costs)  # strict: windows checked against live tensors
    assert sim.fast_peak_bytes <= plan.header.budget_bytes
    assert plan.header.run.scratch == "windows"
    # a window moved onto a tensor live during its kernel is rejected
    life = arena.lifetimes(machine, plan)
    spans = {(s.record, s.tensor): s for s in life.spans}
    window, tensor = next((w, b) for w in windows.values() for b in layout.buffers
                          if b.tensor != SCRATCH and b.nbytes and
                          spans[(b.record, b.tensor)].overlaps(spans[(w.record, SCRATCH)]))
    # the window where it meets that tensor (within the arena)
    at = min(tensor.offset, layout.nbytes - window.nbytes) // layout.alignment * layout.alignment
    assert at < tensor.offset + tensor.nbytes and tensor.offset < at + window.nbytes
    with pytest.raises(PlanError, match=r"scratch window .* overlaps the live copy"):
        simulate(graph, _moved(plan, window, at), costs=costs)
    # a plan that was not made for windows may not have one
    region = plan.with_header(run=replace(plan.header.run, scratch="region"))
    with pytest.raises(PlanError, match="not made for scratch windows"):
        simulate(graph, region, costs=costs)


def test_a_window_over_a_freed_copy_still_copied_out_waits_for_that_copy():
    """A copy to the slow tier joined at a later use may outlast the step the packer holds its
    source for, so a window may be packed over a freed tensor still being read: the kernel
    waits for the copy, as a slot's next tenant does (Inception-v4's move-only plans)."""
    graph, costs, config, plan = _windowed_plan()
    machine = machine_for(graph, config, costs)
    layout = plan.arena
    windows = layout.windows()
    record = max(windows)  # a late kernel: the plain run has its clock well past 0
    late = 10.0  # seconds: a copy out that ends long after everything else

    class StillCopyingOut(Simulator):
        def compute(self, rec):
            if self.index == record:  # a freed tenant of the window's bytes, still read
                w = windows[record]
                self.busy.append((w.offset, w.offset + w.nbytes, late))
            super().compute(rec)

    plain = Simulator(graph, plan, machine)
    plain.run()
    sim = StillCopyingOut(graph, plan, machine)  # strict: no violation, a wait
    sim.run()
    kid = plan.records[record].kernel
    start = {k.kernel: k.start_s for k in sim.kernels}[kid]
    assert {k.kernel: k.start_s for k in plain.kernels}[kid] < late <= start
    assert not sim.busy  # the wait ended that copy's hold


def test_windows_that_never_pack_in_the_budget_give_way_to_the_region(monkeypatch):
    from autotm_py import pipeline

    graph = small_training(kib=64)
    costs = costs_for(graph)
    packed = arena.pack

    def windows_never_fit(machine, plan, limit=None):
        layout = packed(machine, plan, limit=limit)
        return replace(layout, nbytes=10 * layout.nbytes) if machine.windowed else layout

    monkeypatch.setattr(pipeline.arena, "pack", windows_never_fit)
    budget = max(_budget(graph, costs, 0.5, False, run=RunMode(True, False)),
                 _budget(graph, costs, 0.5, False, run=RunMode(True, True, "windows")))
    config = PlanConfig(strategy="sync", device="cuda", fast_mem_bytes=budget, solver="highs",
                        run=RunMode(arena=True, scratch="windows"))
    result = optimize(graph, config, costs=costs)
    assert result.plan is not None and result.plan.arena is not None, result.message
    assert result.plan.header.run.scratch == "region"
    assert "planned with the scratch region instead" in result.plan.header.notes[-1]
    assert result.plan.arena.scratch_bytes > 0
    monkeypatch.setattr(pipeline.arena, "pack", packed)
    assert simulate(graph, result.plan, costs=costs).ok


def test_scratch_windows_need_the_arena_and_the_placed_allocator():
    with pytest.raises(ConfigError, match="--scratch windows needs --arena and --placed"):
        RunMode(scratch="windows")
    with pytest.raises(ConfigError, match="--scratch windows needs"):
        RunMode(arena=True, placed=False, scratch="windows")
    with pytest.raises(ConfigError, match="--scratch 'window'"):
        RunMode(arena=True, scratch="window")


def test_scratch_buffers_belong_to_computes():
    _, _, plan = _training_plan()
    for b in plan.arena.buffers:
        if b.tensor == SCRATCH:
            assert isinstance(plan.records[b.record], Compute)
            assert b.offset == plan.arena.scratch_offset


def test_the_planner_solves_again_until_the_packing_fits(monkeypatch):
    from autotm_py.ir.training import derive_training
    from tests.test_training_models import tiny_decoder

    first_packing_leaves_holes(monkeypatch)
    graph = derive_training(tiny_decoder(), optimizer="adam")
    costs = costs_for(graph)
    base = (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    probe = machine_for(graph, PlanConfig(fast_mem_bytes=base, device="cuda",
                                          run=RunMode(arena=True)), costs)
    config = PlanConfig(fast_mem_bytes=base + probe.scratch_reserve, device="cuda",
                        strategy="sync", solver="highs", run=RunMode(arena=True))
    result = optimize(graph, config, costs=costs)
    notes = result.plan.header.notes
    assert any("solved again" in n for n in notes), notes  # the first packing did not fit
    assert result.plan.arena is not None, notes
    assert result.plan.arena.nbytes <= machine_for(graph, config, costs).arena_limit
    assert simulate(graph, result.plan, costs=costs).ok


def test_a_run_falls_back_to_the_caching_allocator_where_no_arena_fits():
    from autotm_py.pipeline import arena_for_run, machine_for_plan

    graph, costs, plan = _training_plan(arena_mode=False)
    packed = with_arena(graph, plan, costs)
    limit = machine_for_plan(graph, plan, costs).arena_limit
    assert packed.arena.nbytes > limit  # the scratch region does not fit beside the tensors
    placed, why = arena_for_run(graph, plan, costs)
    assert placed is None and why.startswith("no arena") and "caching allocator" in why
    assert arena_for_run(graph, plan, costs, capped=False) == (packed, None)  # no cap: packed
    _, _, fitted = _training_plan()
    assert arena_for_run(graph, fitted, costs) == (fitted, None)


def test_the_budget_line_names_the_arena_scratch():
    from autotm_py.cli.common import budget_parts

    graph, costs, plan = _training_plan()
    config = PlanConfig(strategy="sync", device="cuda", fast_mem_bytes=plan.header.budget_bytes,
                        solver="highs", run=RunMode(arena=True))
    result = optimize(graph, config, costs=costs, baselines=False)
    machine = machine_for(graph, config, costs)
    assert result.scratch_bytes >= machine.scratch_reserve > 0
    assert result.reserve_bytes + result.scratch_bytes + result.plannable_bytes == \
        result.budget_bytes  # no headroom asked for
    line = budget_parts(result.budget_bytes, result.reserve_bytes, result.plannable_bytes,
                        result.scratch_bytes)
    assert "0 B headroom" in line and "arena scratch" in line


def _assert_disjoint_where_live_together(spans, offsets):
    for i, a in enumerate(spans):
        for j, b in enumerate(spans[:i]):
            if a.overlaps(b):
                assert offsets[i] + a.nbytes <= offsets[j] or offsets[j] + b.nbytes <= offsets[i]


def test_the_tighter_of_two_packings_is_kept():
    """Lowest gap first leaves this set of buffers (found by a random search) 34 units high,
    the tightest gap 31, its live peak; `pack` keeps the smaller, and no two buffers live at
    once meet."""
    from autotm_py.arena import Lifetimes, Span
    from autotm_py.arena.packing import _place, extent, largest_first, tightest_packing

    unit = 512
    spans = tuple(Span(i, i, start, end, size * unit) for i, (start, end, size) in enumerate(
        [(5, 11, 1), (7, 9, 7), (7, 12, 7), (1, 10, 6), (7, 12, 5), (11, 12, 5), (4, 5, 2),
         (10, 11, 3), (9, 12, 3), (8, 12, 1), (8, 13, 4)]))
    life = Lifetimes(spans, {}, (), frozenset(), 28)
    assert extent(life, _place(life, largest_first(life))) == 34 * unit
    assert extent(life, _place(life, largest_first(life), tightest=True)) == 31 * unit
    offsets = tightest_packing(life)
    assert extent(life, offsets) == 31 * unit == life.live_peak()
    _assert_disjoint_where_live_together(spans, offsets)


def test_random_orders_pack_where_greedy_by_size_leaves_holes():
    """Greedy by size packs these buffers (found by a random search) 12 units high, either
    gap rule, over a live peak of 10, and the skyline too; a try drawn at random packs them
    at the peak."""
    from autotm_py.arena import Lifetimes, Span
    from autotm_py.arena.packing import (
        _place,
        extent,
        largest_first,
        random_orders,
        skyline,
        tightest_packing,
    )

    unit = 512
    spans = tuple(Span(i, i, start, end, size * unit) for i, (start, end, size) in enumerate(
        [(4, 8, 4), (2, 5, 2), (5, 9, 4), (2, 3, 8), (3, 7, 2)]))
    life = Lifetimes(spans, {}, (), frozenset(), 20)
    for tightest in (False, True):
        assert extent(life, _place(life, largest_first(life), tightest)) == 12 * unit
    assert extent(life, skyline(life)) == 12 * unit
    offsets = tightest_packing(life)
    assert extent(life, offsets) == 10 * unit == life.live_peak()
    assert tightest_packing(life) == offsets  # the seed is fixed
    _assert_disjoint_where_live_together(spans, offsets)
    assert random_orders(250) == 1024 and random_orders(5000) == 2


def test_the_skyline_packs_where_greedy_by_size_leaves_holes():
    """Greedy by size packs these buffers (found by a random search) 16 units high, over a live
    peak of 13; best fit on the skyline packs them at the peak, and `tightest_packing` keeps
    that one (a 3.3B decoder's Adam plan: greedy 1.2% over its peak, the skyline at it)."""
    from autotm_py.arena import Lifetimes, Span
    from autotm_py.arena.packing import extent, greedy_by_size, skyline, tightest_packing

    unit = 512
    spans = tuple(Span(i, i, start, end, size * unit) for i, (start, end, size) in enumerate(
        [(2, 10, 4), (8, 9, 5), (3, 8, 4), (7, 9, 3), (5, 7, 5)]))
    life = Lifetimes(spans, {}, (), frozenset(), 20)
    assert extent(life, greedy_by_size(life)) == 16 * unit
    offsets = skyline(life)
    assert extent(life, offsets) == 13 * unit == life.live_peak()
    _assert_disjoint_where_live_together(spans, offsets)
    assert extent(life, tightest_packing(life)) == 13 * unit


def test_the_skyline_packs_a_pair_that_wraps_the_iteration_as_one_arc():
    """A steady pair whose pieces lie at the start and the end of the iteration shares one
    offset and leaves its slot to what lives between them: at the peak of 7 (its hull, the
    whole iteration, would stack it under the middle buffer: 9)."""
    from autotm_py.arena import Lifetimes, Span
    from autotm_py.arena.packing import extent, skyline

    unit = 512
    spans = (Span(INITIAL, 0, -2, 3, 2 * unit), Span(7, 1, 15, 20, 2 * unit),
             Span(2, 2, 4, 14, 6 * unit), Span(INITIAL, 3, -2, 20, unit))
    life = Lifetimes(spans, {}, ((0, 1),), frozenset(), 20)
    offsets = skyline(life)
    assert offsets[0] == offsets[1]
    assert extent(life, offsets) == 7 * unit == life.live_peak()
    _assert_disjoint_where_live_together(spans, offsets)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.integers(0, 18), st.integers(1, 8), st.integers(1, 6)),
                     max_size=12),
       pairs=st.lists(st.tuples(st.integers(0, 9), st.integers(10, 19), st.integers(1, 6)),
                      max_size=3))
def test_skyline_offsets_never_overlap(rows, pairs):
    """Random buffers and steady pairs wrapping the boundary: the skyline's offsets keep every
    two buffers live at once apart, and each pair at one offset."""
    from autotm_py.arena import Lifetimes, Span
    from autotm_py.arena.packing import skyline

    unit, end = 512, 20
    spans = [Span(i, i, start, min(start + length, end), size * unit)
             for i, (start, length, size) in enumerate(rows)]
    groups = []
    for head_end, tail_start, size in pairs:
        groups.append((len(spans), len(spans) + 1))
        spans += [Span(INITIAL, len(spans), -2, head_end, size * unit),
                  Span(tail_start // 2, len(spans) + 1, tail_start, end, size * unit)]
    life = Lifetimes(tuple(spans), {}, tuple(groups), frozenset(), end)
    offsets = skyline(life)
    assert all(offsets[a] == offsets[z] for a, z in groups)
    paired = {frozenset(g) for g in groups}
    for i, a in enumerate(spans):
        for j, b in enumerate(spans[:i]):
            if a.overlaps(b) and frozenset((i, j)) not in paired:
                assert offsets[i] + a.nbytes <= offsets[j] or offsets[j] + b.nbytes <= offsets[i]


def test_longest_first_among_equal_sizes_packs_where_earliest_first_leaves_holes():
    """Equal sizes placed earliest first leave these buffers (found by a random search) 11
    units high, either gap rule, over a live peak of 9; the longer-lived first packs them at
    the peak, so `greedy_by_size` needs no random order (ResNet-50 b32's fp32 plan at 1:3:
    earliest first 18.9 MB over its peak, beyond what the budget left, so the fit loop solved
    again; longest first at its peak)."""
    from autotm_py.arena import Lifetimes, Span
    from autotm_py.arena.packing import _place, extent, greedy_by_size, largest_first

    unit = 512
    spans = tuple(Span(i, i, start, end, size * unit) for i, (start, end, size) in enumerate(
        [(0, 3, 2), (1, 8, 2), (1, 6, 2), (4, 10, 2), (2, 8, 2), (7, 8, 3)]))
    life = Lifetimes(spans, {}, (), frozenset(), 20)
    for tightest in (False, True):
        assert extent(life, _place(life, largest_first(life), tightest)) == 11 * unit
    offsets = greedy_by_size(life)
    assert extent(life, offsets) == 9 * unit == life.live_peak()
    _assert_disjoint_where_live_together(spans, offsets)


def test_the_packing_search_stops_within_the_callers_limit():
    """With a limit (the fit loop's), the first packing within it is kept: greedy's 12 units
    here, where the random orders would go on to the peak of 10 (each try costs ~0.1 s on a
    thousand buffers, and a tighter arena gains the fit loop nothing)."""
    from autotm_py.arena import Lifetimes, Span
    from autotm_py.arena.packing import extent, tightest_packing

    unit = 512
    spans = tuple(Span(i, i, start, end, size * unit) for i, (start, end, size) in enumerate(
        [(4, 8, 4), (2, 5, 2), (5, 9, 4), (2, 3, 8), (3, 7, 2)]))
    life = Lifetimes(spans, {}, (), frozenset(), 20)
    assert extent(life, tightest_packing(life, limit=12 * unit)) == 12 * unit
    assert extent(life, tightest_packing(life, limit=11 * unit)) == 10 * unit
    assert extent(life, tightest_packing(life, limit=4 * unit)) == 10 * unit  # below the peak
    _assert_disjoint_where_live_together(spans, tightest_packing(life, limit=12 * unit))
