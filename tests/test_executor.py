"""The executor on the CPU: every plan (ILP strategies and baselines) computes exactly what the
reference runner computes, bitwise, over several training steps (moves are copies)."""

from __future__ import annotations

import pytest
import torch

from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir.layout import to_channels_last
from autotm_py.ir.training import derive_training
from autotm_py.options import Measure, RunMode
from autotm_py.pipeline import machine_for, optimize, run_baselines, with_arena
from autotm_py.runtime.execute import execute, new_executor, run_steps
from autotm_py.runtime.executor import Executor
from autotm_py.runtime.reference import train_steps
from tests.graphs import costs_for
from tests.test_training_models import small_cnn, tiny_decoder

STEPS = 3
ARENA = RunMode(arena=True)


def _graph(name: str):
    forward = small_cnn() if name.startswith("cnn") else tiny_decoder()
    # cnn-cl: the images stored channels-last (`ir.layout`)
    if name.endswith(("-fused", "-chunked")):  # Linear, LinearGrad, ConvGrad, attention
        forward = fuse_graph(forward)
    # -chunked: the head and loss as one LinearCrossEntropy over 3 blocks (--loss-chunks 3)
    graph = derive_training(forward, optimizer="sgd",
                            loss_chunks=3 if name.endswith("-chunked") else 1)
    return to_channels_last(graph) if name.startswith("cnn-cl") else graph


def _plans(graph, reserve: int = 0):
    # Halfway between the largest working set and the peak: every baseline fits, moves needed.
    # `reserve`: the preset's runtime reserve, when the test keeps it (marked runtime_reserve).
    budget = reserve + (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    config = PlanConfig(fast_mem_bytes=budget, device="cuda")
    costs = costs_for(graph)
    model = machine_for(graph, config, costs)
    results = run_baselines(model, ("all-fast", "all-slow", "first-touch", "lru", "offload"))
    plans = {name: r.plan for name, r in results.items() if r.feasible and r.plan is not None}
    assert {"all-fast", "all-slow", "first-touch"} <= set(plans), results
    for strategy in ("sync", "async"):
        result = optimize(graph, PlanConfig(fast_mem_bytes=budget, device="cuda",
                                            strategy=strategy), costs=costs)
        assert result.plan is not None, result.message
        plans[strategy] = result.plan
    return plans


@pytest.mark.parametrize("name", ["cnn", "cnn-cl", "decoder", "decoder-chunked"])
def test_every_plan_matches_the_reference_bitwise(name):
    graph = _graph(name)
    reference = train_steps(graph, steps=STEPS, seed=3)
    for plan_name, plan in _plans(graph).items():
        moves = sum(1 for _ in plan.moves())
        steps = run_steps(graph, plan, steps=STEPS, seed=3)
        for step, (got, want) in enumerate(zip(steps, reference, strict=True)):
            for tid in graph.outputs:
                assert torch.equal(got[tid], want[tid].cpu()), (
                    f"{plan_name} ({moves} moves), step {step}: {graph.name_of(tid)} differs")


def _arena_plans(graph):
    """Every plan of `_plans` packed into an arena, and the ILP plans solved for one."""
    costs = costs_for(graph)
    plans = {name: with_arena(graph, plan, costs) for name, plan in _plans(graph).items()}
    budget = (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    for strategy in ("sync", "async"):
        config = PlanConfig(fast_mem_bytes=budget, device="cuda", strategy=strategy,
                            run=ARENA)
        machine = machine_for(graph, config, costs)
        result = optimize(graph, PlanConfig(fast_mem_bytes=budget + machine.scratch_reserve,
                                            device="cuda", strategy=strategy, run=ARENA),
                          costs=costs)
        assert result.plan is not None and result.plan.arena is not None, result.message
        plans[f"{strategy}-arena"] = result.plan
    return plans


@pytest.mark.parametrize("name", ["cnn", "decoder", "cnn-fused", "decoder-fused",
                                  "decoder-chunked", "cnn-cl", "cnn-cl-fused"])
def test_every_plan_in_an_arena_matches_the_reference_bitwise(name):
    # the CPU arena: one uint8 tensor, every fast copy a view at its planned offset
    graph = _graph(name)
    reference = train_steps(graph, steps=STEPS, seed=3)
    for plan_name, plan in _arena_plans(graph).items():
        steps = run_steps(graph, plan, steps=STEPS, seed=3, mode=ARENA)
        for step, (got, want) in enumerate(zip(steps, reference, strict=True)):
            for tid in graph.outputs:
                assert torch.equal(got[tid], want[tid].cpu()), (
                    f"{plan_name} in an arena, step {step}: {graph.name_of(tid)} differs")


def test_arena_run_reports_the_arena():
    graph = _graph("cnn")
    plan = _arena_plans(graph)["async-arena"]
    result = execute(graph, plan, device="cpu", mode=ARENA,
                     measure=Measure(iterations=2, warmup=1))
    assert result.arena_bytes == plan.arena.scratch_offset
    assert result.copied_outputs is not None and result.copied_outputs > 0  # Conv, on the CPU
    assert not result.replayed and result.reserved_peak_bytes is None
    assert result.mode == ARENA.to_dict()
    with pytest.raises(ConfigError, match="--replay"):
        execute(graph, plan, device="cpu", mode=RunMode(arena=True, replay=True))


def test_static_inputs_keep_their_addresses_and_the_results():
    """What a CUDA graph without an arena needs (`runtime.memory.StaticInputs`): every tensor
    an iteration starts with at the same address in every iteration, each carried value copied
    back into it, and results bitwise those of the reference runner."""
    from autotm_py.runtime.memory import CachingMemory
    from autotm_py.runtime.reference import init_values
    graph = _graph("cnn")
    plan = _plans(graph)["sync"]
    reference = train_steps(graph, steps=STEPS, seed=5)
    memory = CachingMemory(graph, plan, torch.device("cpu"), static_inputs=True)
    executor = Executor(graph, plan, device="cpu", masters=init_values(graph, seed=5),
                        memory=memory)
    addresses = []
    for step in range(STEPS):
        executor.prepare()
        addresses.append({t: v.data_ptr() for t, v in executor.state.fast.items()})
        executor.run()
        for tid in graph.outputs:
            assert torch.equal(executor.value(tid), reference[step][tid].cpu()), step
    assert addresses[0] and all(a == addresses[0] for a in addresses[1:])
    carried_fast = {first for first, _ in graph.carried} & set(addresses[0])
    assert carried_fast  # weights that start fast: the ones whose addresses would move


def test_a_replays_prepare_places_only_what_is_not_carried():
    """Before a replay the carried values already sit where the graph reads them
    (`Executor._steady`): `prepare_replay` places the batch and the other uncarried tensors
    again and leaves the carried ones, at the first record's slots."""
    from autotm_py.plan import INITIAL
    from autotm_py.runtime.reference import init_values
    graph = _graph("cnn")
    plan = _arena_plans(graph)["async-arena"]
    masters = init_values(graph, seed=5)
    executor = Executor(graph, plan, device="cpu", masters=masters)
    executor.prepare()
    executor.run()
    placed = []
    executor._place_initial = lambda tid, tiers: placed.append(tid)
    executor.index = 7  # where the last iteration left it
    executor.prepare_replay()
    carried = {first for first, _ in graph.carried}
    assert carried & set(plan.initial) and set(placed)
    assert set(placed) == set(plan.initial) - carried
    assert executor.index == INITIAL  # the slots the initial copies occupy


def test_a_batch_norm_in_an_arena_updates_its_running_statistics_in_place(monkeypatch):
    """In an arena a batch norm writes every output straight into its slot, its running
    statistics over the old ones where the packing gives them their slots
    (`memory.scratch.OVERWRITES`), as torch's batch norm updates its buffers: no output of it
    is copied into its slot (on a GPU each of ResNet-200's took ten device copies a step),
    and the iterations equal the reference bitwise."""
    from autotm_py.kernels import into as kernels_into
    from autotm_py.runtime.reference import init_values
    graph = _graph("cnn")
    reference = train_steps(graph, steps=STEPS, seed=5)
    plans = _arena_plans(graph)
    in_place: list[bool] = []
    into = kernels_into.batch_norm_training_into

    def watched(x, scale, bias, mean, var, momentum, eps, outs):
        in_place.append(outs[1].data_ptr() == mean.data_ptr())
        return into(x, scale, bias, mean, var, momentum, eps, outs)
    monkeypatch.setattr(kernels_into, "batch_norm_training_into", watched)
    for name in ("all-fast", "async-arena"):
        _, executor, _ = new_executor(graph, plans[name], "cpu", mode=ARENA,
                                      masters=init_values(graph, seed=5))
        copied: list[str] = []
        in_slot = executor._in_slot

        def counted(value, slot, executor=executor, copied=copied, plan=plans[name],
                    in_slot=in_slot):
            if value is not slot:
                record = plan.records[executor.index]
                copied.append(graph.kernels[record.kernel].op_type)  # type: ignore[union-attr]
            return in_slot(value, slot)
        executor._in_slot = counted
        for step in range(STEPS):
            executor.prepare()
            executor.run()
            for tid in graph.outputs:
                assert torch.equal(executor.value(tid), reference[step][tid].cpu()), (name, step)
        assert "BatchNormalization" not in copied and "Conv" in copied, (name, copied)
    assert any(in_place) and not all(in_place), in_place


def test_plans_with_moves_exist():
    # The equality above must cover plans that really move data, or it proves nothing.
    plans = _plans(_graph("cnn"))
    assert sum(1 for _ in plans["all-slow"].moves()) > 10
    assert sum(1 for _ in plans["sync"].moves()) > 0


def test_execute_reports_times_on_cpu():
    graph = _graph("cnn")
    plan = _plans(graph)["sync"]
    result = execute(graph, plan, device="cpu", measure=Measure(iterations=2, warmup=1))
    assert result.iterations == 2 and len(result.iteration_times_s) == 2
    assert all(t > 0 for t in result.iteration_times_s)
    # on the CPU the host does the work, so enqueueing is the iteration; no allocator retries
    assert result.host_median_s == pytest.approx(result.median_s)
    assert result.alloc_retries is None
    assert result.strategy == plan.header.strategy
    assert result.to_dict()["model_name"] == graph.name


def test_bad_device_is_a_config_error():
    graph = _graph("cnn")
    plan = _plans(graph)["all-fast"]
    with pytest.raises(ConfigError, match="choose cuda or cpu"):
        execute(graph, plan, device="tpu")


@pytest.mark.parametrize("offload", [False, True])
def test_autograd_baselines_run_on_cpu(offload):
    from autotm_py.runtime.eager import measure_autograd

    graph = _graph("cnn")
    result = measure_autograd(graph, device="cpu", iterations=2, warmup=0, save_on_cpu=offload)
    assert len(result.iteration_times_s) == 2
    assert result.strategy == ("torch-save-on-cpu" if offload else "torch-autograd")


def test_autograd_baseline_needs_training_graph():
    from autotm_py.runtime.eager import measure_autograd

    with pytest.raises(ConfigError, match="not a training graph"):
        measure_autograd(small_cnn(), device="cpu")


# ---- recomputation -----------------------------------------------------------------------
def _recompute_plans(graph):
    """Joint and recompute-only plans of `graph` that really regenerate tensors: kernels
    priced cheap next to copies (microseconds per MiB), budgets between the largest working
    set and the peak (recompute-only: the peak of 512-byte-aligned sizes, as the planner
    counts it; nothing moves, so weights and gradients stay and budgets must be near it)."""
    costs = costs_for(graph, scale_s=2e-6)
    aligned = machine_for(graph, PlanConfig(fast_mem_bytes=graph.peak_live_bytes,
                                            device="cuda"), costs).peak[0]
    plans = {}
    cells = [("sync+recompute", 0.3), ("sync+recompute", 0.7), ("async+recompute", 0.5),
             ("recompute-only", 0.93), ("recompute-only", 0.97)]
    for name, frac in cells:
        peak = aligned if name == "recompute-only" else graph.peak_live_bytes
        budget = int(graph.max_working_set[0] + frac * (peak - graph.max_working_set[0]))
        config = PlanConfig.for_plan_name(name, fast_mem_bytes=budget, device="cuda",
                                          solver="highs")
        result = optimize(graph, config, costs=costs)
        if result.plan is not None:
            plans[f"{name} at {frac}"] = result.plan
    return plans


@pytest.mark.parametrize("name", ["cnn", "decoder", "decoder-chunked"])
def test_plans_that_recompute_match_the_reference_bitwise(name):
    graph = _graph(name)
    reference = train_steps(graph, steps=STEPS, seed=5)
    plans = _recompute_plans(graph)
    regenerating = {k: p for k, p in plans.items() if any(True for _ in p.recomputes())}
    assert len(regenerating) >= 3, sorted(plans)
    assert any(k.startswith("recompute-only") for k in regenerating)
    for plan_name, plan in regenerating.items():
        steps = run_steps(graph, plan, steps=STEPS, seed=5)
        for step, (got, want) in enumerate(zip(steps, reference, strict=True)):
            for tid in graph.outputs:
                assert torch.equal(got[tid], want[tid].cpu()), (
                    f"{plan_name} ({sum(1 for _ in plan.recomputes())} recomputes), step "
                    f"{step}: {graph.name_of(tid)} differs")


@pytest.mark.parametrize("name", ["cnn", "decoder", "decoder-chunked"])
def test_plans_that_recompute_run_at_planned_addresses(name, monkeypatch):
    """Recomputing plans in an arena (CPU): packed after the solve, and solved with --arena
    --recompute on (the planner fits the packing itself); the regenerated tensors are written
    into the slots of their Recompute records, and every step equals the reference bit for
    bit."""
    graph = _graph(name)
    reference = train_steps(graph, steps=STEPS, seed=6)
    costs = costs_for(graph, scale_s=2e-6)
    plans = {f"{k}, packed": with_arena(graph, p, costs)
             for k, p in _recompute_plans(graph).items() if any(True for _ in p.recomputes())}
    for strategy in ("sync", "async"):
        budget = (graph.max_working_set[0] + graph.peak_live_bytes) // 2
        probe = machine_for(graph, PlanConfig(fast_mem_bytes=budget, device="cuda", run=ARENA),
                            costs)
        result = optimize(graph, PlanConfig(fast_mem_bytes=budget + probe.scratch_reserve,
                                            device="cuda", strategy=strategy, run=ARENA,
                                            recompute="on", solver="highs"), costs=costs)
        assert result.plan is not None and result.plan.arena is not None, result.message
        assert result.plan.header.strategy == f"{strategy}+recompute"
        plans[f"{strategy}+recompute --arena"] = result.plan
    assert sum(1 for p in plans.values() if any(True for _ in p.recomputes())) >= 3
    placed = []
    real = Executor.recompute

    def checked(self, record):
        real(self, record)
        for tid in record.outputs:
            slot = self.memory.arena.view(self.index, graph.tensors[tid])
            assert self.state.fast[tid].data_ptr() == slot.data_ptr(), graph.name_of(tid)
            placed.append(tid)

    monkeypatch.setattr(Executor, "recompute", checked)
    for plan_name, plan in plans.items():
        steps = run_steps(graph, plan, steps=STEPS, seed=6, mode=ARENA)
        for step, (got, want) in enumerate(zip(steps, reference, strict=True)):
            for tid in graph.outputs:
                assert torch.equal(got[tid], want[tid].cpu()), (
                    f"{plan_name} in an arena, step {step}: {graph.name_of(tid)} differs")
    assert placed  # regenerated tensors were checked at their slots


def test_steady_pairs_live_at_once_are_copied_at_the_boundary():
    """A carried pair whose two copies live at once (here a weight whose fast copy a plan frees
    a kernel after its update) cannot share a slot: W' gets its own, W's is held to the end,
    and the executor copies W' into it as the iteration ends. The plan verifies, and three
    steps at planned addresses equal the reference bit for bit."""
    from dataclasses import replace

    from autotm_py import arena
    from autotm_py.memory.tiers import FAST
    from autotm_py.pipeline import machine_for_plan, simulate, with_arena
    from autotm_py.plan import Compute, Free

    graph = _graph("cnn")
    costs = costs_for(graph)
    plan = optimize(graph, PlanConfig(fast_mem_bytes=2 * graph.peak_live_bytes, device="cuda"),
                    costs=costs).plan
    assert plan is not None
    records = list(plan.records)
    update = next(i for i, r in enumerate(records) if isinstance(r, Compute)
                  and graph.kernels[r.kernel].op_type == "SGDUpdate")
    weight = graph.kernels[records[update].kernel].inputs[0]
    free = next(i for i in range(update, len(records)) if records[i] == Free(weight, FAST))
    after = next(i for i in range(free, len(records)) if isinstance(records[i], Compute))
    records.insert(after, records.pop(free))  # W's fast copy outlives the next kernel
    plan = with_arena(graph, replace(plan, records=tuple(records), arena=None), costs)
    machine = machine_for_plan(graph, plan, costs)
    life = arena.lifetimes(replace(machine, run=replace(machine.run, arena=True)), plan)
    assert life.boundary, "the case needs a pair copied at the boundary"
    simulate(graph, plan, costs=costs)  # strict: the verifier accepts the boundary copies
    reference = train_steps(graph, steps=STEPS, seed=7)
    steps = run_steps(graph, plan, steps=STEPS, seed=7, mode=ARENA)
    for step, (got, want) in enumerate(zip(steps, reference, strict=True)):
        for tid in graph.outputs:
            assert torch.equal(got[tid], want[tid].cpu()), f"step {step}: {graph.name_of(tid)}"


def test_run_help_gives_the_capture_allowance():
    """`autotm run --help` states the executor's allowance (the CLI does not import torch to
    print it, so the number is written there too)."""
    from autotm_py.cli.run import run_cmd
    from autotm_py.runtime.drivers import CAPTURE_ALLOWANCE

    (replay,) = [p for p in run_cmd.params if p.name == "replay"]
    assert f"up to {CAPTURE_ALLOWANCE >> 20} MiB" in replay.help
    assert "--graph" in replay.opts  # the older name still works


def test_out_of_memory_names_the_request_and_the_record():
    """An out-of-memory under the cap says how much was asked for and at which record: what a
    re-plan has to leave room for (torch's own first sentence says neither)."""
    from autotm_py.plan import Compute
    from autotm_py.runtime.execute import _out_of_memory, new_executor
    graph = _graph("cnn")
    plan = _plans(graph)["sync"]
    _, executor, _ = new_executor(graph, plan, "cpu")
    executor.index = next(i for i, r in enumerate(plan.records) if isinstance(r, Compute))
    exc = RuntimeError("CUDA out of memory. Tried to allocate 76.00 MiB. GPU 0 has a total "
                       "capacity of 79.19 GiB of which 1.00 GiB is free.")
    message = _out_of_memory(executor, exc)
    assert "tried to allocate 76.00 MiB at compute" in message and "\n" not in message


def test_graph_replay_runs_in_the_arena_only_under_the_cap():
    """A replay runs in the plan's arena where the run is capped (the arena keeps the capture
    in the budget), with static inputs where it is not (no slot copies)."""
    from autotm_py.pipeline import run_mode_for, runs_capped
    graph = _graph("cnn")
    plans = _plans(graph)
    budgeted, unlimited = plans["sync"], plans["all-fast"]
    assert budgeted.header.budget_bytes is not None and unlimited.header.budget_bytes is None
    assert runs_capped(budgeted, "cuda")
    assert not runs_capped(budgeted, "cuda", capped=False)  # --no-cap
    assert not runs_capped(budgeted, "cpu")
    assert not runs_capped(unlimited, "cuda")
    laid_out = _arena_plans(graph)["sync-arena"]
    replay = RunMode(replay=True)
    assert run_mode_for(laid_out, replay, "cuda").arena
    assert not run_mode_for(laid_out, replay, "cuda", capped=False).arena
    assert not run_mode_for(laid_out, RunMode(), "cuda").arena  # eager: as asked


def test_a_slot_freed_while_copied_out_is_written_only_after_the_copy():
    """At planned addresses the free of a fast copy that an async write still reads does not
    wait; whoever writes the slot next does (`Executor.claim`): the compute stream joins the
    copy's event, a copy stream waits for it on its own; slots that do not meet are not held
    back. (On the GPU, `test_arena_gpu` runs such plans bitwise against torch's allocator.)"""
    from autotm_py.runtime.executor import Executor
    from autotm_py.runtime.reference import init_values

    graph = _graph("cnn")
    plan = _plans(graph)["all-fast"]
    ex = Executor(graph, plan, device="cpu", masters=init_values(graph, seed=0))
    arena = torch.empty(1024, dtype=torch.uint8)
    first, second = arena[0:256], arena[512:768]
    ex.state.busy = [(first, "copy of first"), (second, "copy of second")]
    joined: list[str] = []

    def join(event):
        joined.append(event)
        ex.state.joined.add(event)

    ex._join = join
    waited: list[str] = []

    class Stream:
        def wait_event(self, event):
            waited.append(event)

    ex.claim(arena[128:384], Stream())  # a prefetch lands on part of the first slot
    assert (waited, joined) == (["copy of first"], [])
    ex.claim(arena[300:400], None)  # a kernel writes between the two: nothing to wait for
    assert joined == []
    ex.claim(arena[700:900], None)  # a kernel's output over the second slot
    assert joined == ["copy of second"]
    assert ex.state.busy == [(first, "copy of first")]  # the compute stream never joined it
