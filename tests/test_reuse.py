"""Outputs written over inputs that die at their kernel (`runtime.reuse`), as autograd's
in-place accumulation does: only where no later record uses the input and no view shares its
storage, and bit for bit what the reference runner computes."""

from __future__ import annotations

import pytest
import torch

from autotm_py.config import PlanConfig
from autotm_py.ir import Role
from autotm_py.ir.training import derive_training
from autotm_py.memory.scratch import OVERWRITES
from autotm_py.options import RunMode
from autotm_py.pipeline import machine_for, run_baselines
from autotm_py.plan import Compute, Free, Move, Recompute
from autotm_py.runtime.execute import new_executor, run_steps
from autotm_py.runtime.reference import train_steps
from autotm_py.runtime.reuse import overwritable_inputs, update_runs
from tests.graphs import costs_for
from tests.test_executor import STEPS, _graph, _plans
from tests.test_training_models import Net


def _uses_after(graph, plan, index: int) -> set[int]:
    used: set[int] = set()
    for record in plan.records[index + 1:]:
        if isinstance(record, Compute | Recompute):
            used.update(graph.kernels[record.kernel].inputs)
        elif isinstance(record, Move):
            used.add(record.tensor)
    return used


@pytest.mark.parametrize("name", ["cnn", "decoder-fused"])
def test_only_inputs_that_die_at_their_kernel_are_chosen(name):
    graph = _graph(name)
    for plan_name, plan in _plans(graph).items():
        chosen = overwritable_inputs(graph, plan)
        if plan_name == "all-fast":
            assert chosen, "an all-fast plan of a training graph has inputs that die"
        for index, position in chosen.items():
            record = plan.records[index]
            kernel = graph.kernels[record.kernel]
            tid = kernel.inputs[position]
            assert position in OVERWRITES[kernel.op_type]
            assert tid not in _uses_after(graph, plan, index), (plan_name, kernel.name)
            assert not graph.survives_iteration(tid)
            assert graph.tensors[tid].shape == graph.tensors[kernel.outputs[0]].shape


@pytest.mark.parametrize("name", ["cnn", "decoder-fused"])
def test_outputs_written_over_dying_inputs_match_the_reference(name):
    graph = _graph(name)
    reference = train_steps(graph, steps=STEPS, seed=7)
    for plan_name, plan in _plans(graph).items():
        _, executor, _ = new_executor(graph, plan, "cpu", seed=7, deterministic=True)
        for step in range(STEPS):
            executor.prepare()
            executor.run()
            for tid in graph.outputs:
                assert torch.equal(executor.value(tid), reference[step][tid].cpu()), (
                    plan_name, step, graph.name_of(tid))
        if plan_name == "all-fast":
            assert executor.state.overwritten > 0
            # the optimizer step ran as foreach updates (a weight some view still shares,
            # e.g. transposed for a MatMul, is updated out of place at its own record)
            runs = update_runs(graph, plan, overwritable_inputs(graph, plan))
            members = {i for run in runs.values() for i in run}
            assert executor.state.updated and executor.state.updated <= members


@pytest.mark.parametrize("name", ["cnn", "decoder-fused"])
def test_update_runs_are_sgd_updates_with_only_frees_between(name):
    graph = _graph(name)
    for plan_name, plan in _plans(graph).items():
        overwritable = overwritable_inputs(graph, plan)
        runs = update_runs(graph, plan, overwritable)
        if plan_name == "all-fast":
            assert runs, "the all-fast plan ends with the optimizer step"
        for first, members in runs.items():
            assert first == members[0] and len(members) > 1
            kernels = [graph.kernels[plan.records[i].kernel] for i in members]
            assert {k.op_type for k in kernels} == {"SGDUpdate"}
            assert len({k.attr("lr") for k in kernels}) == 1
            assert all(overwritable[i] == 0 for i in members)
            assert all(set(plan.records[i].placement) == {"fast"} for i in members)
            between = set(range(first, members[-1] + 1)) - set(members)
            assert all(isinstance(plan.records[i], Free) for i in between), plan_name


def _elementwise_chain():
    """Two Relus and their gradients, with no view anywhere: in backward, the second ReluGrad
    may write over the first one's output, which itself was written over a dying input."""
    net = Net("elementwise_chain")
    x = net.tensor((2, 8), Role.INPUT, name="x")
    t = net.op("Mul", [x, net.weight(2, 8)], (2, 8))
    u = net.op("Relu", [t], (2, 8))
    v = net.op("Relu", [u], (2, 8))
    return derive_training(net.build(net.op("Add", [v, net.weight(2, 8)], (2, 8))),
                           optimizer="sgd")


def test_an_output_written_over_its_input_may_itself_be_written_over():
    graph = _elementwise_chain()
    plan = _all_fast(graph)
    chosen = overwritable_inputs(graph, plan)
    kernel_of = {i: graph.kernels[plan.records[i].kernel] for i in chosen}
    written = {kernel_of[i].outputs[0] for i in chosen}
    chained = [i for i in chosen if kernel_of[i].inputs[chosen[i]] in written]
    assert chained, "the plan has an input to write over that was itself written over"
    reference = train_steps(graph, steps=STEPS, seed=3)
    _, executor, _ = new_executor(graph, plan, "cpu", seed=3, deterministic=True)
    for step in range(STEPS):
        executor.prepare()
        executor.run()
        # every chosen input was written over: the second Relu's input is the first's output
        assert executor.state.overwritten == len(chosen)
        for tid in graph.outputs:
            assert torch.equal(executor.value(tid), reference[step][tid].cpu()), step


def _view_then_last_read():
    """t is read by Flatten (a view of it) and last by Relu, which may overwrite its input;
    the view is read after the Relu. Written over, t would change what the view reads."""
    net = Net("view_then_last_read")
    x = net.tensor((2, 2, 2, 2), Role.INPUT, name="x")
    t = net.op("Mul", [x, net.weight(2, 2, 2, 2)], (2, 2, 2, 2))
    f = net.op("Flatten", [t], (2, 8), axis=1)
    u = net.op("Relu", [t], (2, 2, 2, 2))
    s = net.op("Add", [f, net.op("Flatten", [u], (2, 8), axis=1)], (2, 8))
    return derive_training(net.build(s), optimizer="sgd")


def _all_fast(graph):
    config = PlanConfig(fast_mem_bytes=graph.peak_live_bytes, device="cuda")
    return run_baselines(machine_for(graph, config, costs_for(graph)), ("all-fast",))[
        "all-fast"].plan


def test_a_tensor_seen_through_a_view_is_never_written_over():
    graph = _view_then_last_read()
    plan = _all_fast(graph)
    relu = next(i for i, r in enumerate(plan.records)
                if isinstance(r, Compute) and graph.kernels[r.kernel].op_type == "Relu")
    assert relu in overwritable_inputs(graph, plan)  # by the plan alone it could be
    reference = train_steps(graph, steps=STEPS, seed=2)
    for step, got in enumerate(run_steps(graph, plan, steps=STEPS, seed=2)):
        for tid in graph.outputs:
            assert torch.equal(got[tid], reference[step][tid].cpu()), (step, graph.name_of(tid))


@pytest.mark.gpu
@pytest.mark.parametrize("graph_replay", [False, True])
def test_writing_over_dying_inputs_on_cuda_changes_no_bit(monkeypatch, graph_replay):
    """On the GPU (deterministic algorithms), eager and replayed with static inputs: the
    all-fast plan with outputs written over dying inputs equals the same plan without."""
    from autotm_py.runtime import memory as memory_module

    graph = _graph("cnn")
    plan = _all_fast(graph)
    mode = RunMode(replay=graph_replay)
    written_over = run_steps(graph, plan, steps=STEPS, device="cuda", seed=4, mode=mode)
    monkeypatch.setattr(memory_module, "overwritable_inputs", lambda g, p: {})
    out_of_place = run_steps(graph, plan, steps=STEPS, device="cuda", seed=4, mode=mode)
    for step, (a, b) in enumerate(zip(written_over, out_of_place, strict=True)):
        for tid in graph.outputs:
            assert torch.equal(a[tid], b[tid]), (step, graph.name_of(tid))
